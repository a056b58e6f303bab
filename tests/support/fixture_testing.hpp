// Fixtures as dissect tensors: the glue between the standard-library-only reader (fixture.hpp)
// and the tests that compare dissect's results with PyTorch's, for blocks whose cases come in
// float32 and float64 files named "f32_…" and "f64_…".
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "dissect/tensor/tensor.hpp"
#include "support/fixture.hpp"

namespace dissect::testing {

/// A fixture tensor as a Tensor of `Scalar` (exact: float32 fixtures hold float values).
/// @throws std::runtime_error if its rank is not Rank.
template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> tensor_from(const FixtureTensor& source) {
  if (source.rank() != static_cast<std::int64_t>(Rank)) {
    throw std::runtime_error("fixture tensor has rank " + std::to_string(source.rank()) +
                             ", expected " + std::to_string(Rank));
  }
  Shape<Rank> shape{};
  std::copy(source.shape.begin(), source.shape.end(), shape.begin());
  return Tensor<Scalar, Rank>(shape,
                              std::vector<Scalar>(source.values.begin(), source.values.end()));
}

/// Calls check(fixture) for every fixture of `block` in Scalar's dtype, each under a trace of
/// its file name, and returns how many there were (a test asserts the count it expects).
#ifdef DISSECT_FIXTURE_DIR
template <class Scalar, class Check>
int for_each_fixture(const std::string& block, Check&& check) {
  const std::string prefix = std::is_same_v<Scalar, float> ? "f32_" : "f64_";
  int cases = 0;
  for (const auto& path : list_fixtures(fixture_dir(block))) {
    if (path.filename().string().rfind(prefix, 0) != 0) continue;
    SCOPED_TRACE(path.filename().string());
    check(read_fixture(path));
    ++cases;
  }
  return cases;
}
#endif

}  // namespace dissect::testing
