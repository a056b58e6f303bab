// Test helpers shared by every test file: tensor comparison that explains itself, error-message
// assertions, random tensors and shapes, and the rounding-error bound the fixture and oracle
// comparisons use instead of hand-tuned tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "dissect/kernels/linear_products.hpp"
#include "dissect/quant/kernel_path.hpp"
#include "dissect/tensor/tensor.hpp"
#include "support/sanitizers.hpp"

namespace dissect::testing {

/// Runs a scope on one thread in OpenMP builds, where Eigen and dissect would otherwise pick
/// thread counts (and with them, summation orders) of their own.
class SingleThreadedScope {
 public:
#ifdef _OPENMP
  SingleThreadedScope() : saved_(omp_get_max_threads()) {
    omp_set_num_threads(1);
  }
  ~SingleThreadedScope() {
    omp_set_num_threads(saved_);
  }

 private:
  int saved_;
#endif
};

/// Pins the kernels' code path (quant::force_kernel_path) for a scope, then restores the pin
/// that was there before.
class ScopedKernelPath {
 public:
  explicit ScopedKernelPath(std::optional<quant::KernelPath> path)
      : saved_(quant::forced_kernel_path()) {
    quant::force_kernel_path(path);
  }
  ~ScopedKernelPath() { quant::force_kernel_path(saved_); }
  ScopedKernelPath(const ScopedKernelPath&) = delete;
  ScopedKernelPath& operator=(const ScopedKernelPath&) = delete;

 private:
  std::optional<quant::KernelPath> saved_;
};

/// The trials of a random sweep: all of them in an optimised build, a tenth under
/// AddressSanitizer. The asan preset builds at -O0, where a naive reference runs ~30× slower; what
/// the sanitizer finds, an access out of bounds, depends on the variety of shapes, which a tenth
/// of the trials still covers, while the release pass runs every trial.
constexpr int sweep_trials(int trials) {
#if defined(DISSECT_TEST_SANITIZED)
  return trials / 10 > 0 ? trials / 10 : 1;
#else
  return trials;
#endif
}

/// The scalar types of typed tests: TYPED_TEST_SUITE(Suite, testing::FloatAndDouble).
using FloatAndDouble = ::testing::Types<float, double>;

/// Unit roundoff u of a scalar type: 2⁻²⁴ for float, 2⁻⁵³ for double.
template <class Scalar>
constexpr double unit_roundoff() {
  return std::numeric_limits<Scalar>::epsilon() / 2;
}

/// γ_L = L·u / (1 − L·u) (Higham, Accuracy and Stability, §3.1): a dot product of length L
/// computed in any order is within γ_L·Σ|aᵢ·bᵢ| of the exact value.
template <class Scalar>
double gamma(index_t length) {
  const double lu = static_cast<double>(length) * unit_roundoff<Scalar>();
  return lu / (1.0 - lu);
}

/// "rows=2 in=3 out=4 bias=1"-style trace text from any streamable values.
template <class... Values>
std::string concat_for_trace(const Values&... values) {
  std::ostringstream out;
  ((out << values << ' '), ...);
  return out.str();
}

/// Multi-index of a flat row-major offset, for messages.
template <std::size_t Rank>
std::string index_of(const Shape<Rank>& shape, index_t offset) {
  Shape<Rank> index{};
  for (std::size_t axis = Rank; axis-- > 0;) {
    const index_t extent = std::max<index_t>(shape[axis], 1);
    index[axis] = offset % extent;
    offset /= extent;
  }
  return format_shape(index);
}

/// Compares elementwise against a per-element bound: |actual − expected| <= bound (+ tiny).
/// On failure prints the shape, the first mismatches with their indices, and maxdiff.
template <TensorLike A, TensorLike B, TensorLike C>
requires(rank_of<A> == rank_of<B> && rank_of<B> == rank_of<C>)::testing::AssertionResult
    tensors_within(const char* actual_expr, const char* expected_expr, const char*,
                   const A& actual_tensor, const B& expected_tensor, const C& bound_tensor) {
  const auto actual = const_view(actual_tensor);
  const auto expected = const_view(expected_tensor);
  const auto bound = const_view(bound_tensor);
  if (actual.shape() != expected.shape()) {
    return ::testing::AssertionFailure()
           << actual_expr << " has shape " << format_shape(actual.shape()) << " but "
           << expected_expr << " has shape " << format_shape(expected.shape());
  }
  std::ostringstream mismatches;
  index_t bad = 0;
  double max_diff = 0;
  for (index_t i = 0; i < actual.size(); ++i) {
    const double a = actual.data()[i], e = expected.data()[i];
    const bool both_nan = std::isnan(a) && std::isnan(e);
    const double diff = both_nan ? 0.0 : (a == e ? 0.0 : std::abs(a - e));
    if (!both_nan) max_diff = std::max(max_diff, std::isnan(diff) ? INFINITY : diff);
    if (!both_nan && !(diff <= static_cast<double>(bound.data()[i]))) {
      if (bad < 5) {
        mismatches << "\n  at " << index_of(actual.shape(), i) << ": " << a << " vs " << e
                   << " (diff " << diff << ", allowed " << bound.data()[i] << ")";
      }
      ++bad;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << actual_expr << " vs " << expected_expr << ", shape " << format_shape(actual.shape())
         << ": " << bad << " of " << actual.size() << " elements differ, maxdiff " << max_diff
         << mismatches.str();
}

/// |actual − expected| <= atol + rtol·|expected|, with the same report as above.
template <TensorLike A, TensorLike B>
requires(rank_of<A> == rank_of<B>)::testing::AssertionResult
    tensors_near(const char* actual_expr, const char* expected_expr, const char*, const char*,
                 const A& actual, const B& expected_tensor, double rtol, double atol) {
  const auto expected = const_view(expected_tensor);
  Tensor<double, rank_of<B>> bound(expected.shape());
  for (index_t i = 0; i < bound.size(); ++i) {
    bound.data()[i] = atol + rtol * std::abs(static_cast<double>(expected.data()[i]));
  }
  return tensors_within(actual_expr, expected_expr, "", actual, expected, bound);
}

#define EXPECT_TENSOR_NEAR(actual, expected, rtol, atol) \
  EXPECT_PRED_FORMAT4(::dissect::testing::tensors_near, actual, expected, rtol, atol)
#define EXPECT_TENSOR_WITHIN(actual, expected, bound) \
  EXPECT_PRED_FORMAT3(::dissect::testing::tensors_within, actual, expected, bound)
#define EXPECT_TENSOR_EQ(actual, expected) EXPECT_TENSOR_NEAR(actual, expected, 0.0, 0.0)

/// Asserts that `statement` throws `type` and that what() contains `substring`.
#define EXPECT_THROW_WITH(statement, type, substring)                                 \
  do {                                                                                \
    try {                                                                             \
      statement;                                                                      \
      ADD_FAILURE() << #statement " did not throw " #type;                            \
    } catch (const type& error) {                                                     \
      EXPECT_NE(std::string(error.what()).find(substring), std::string::npos)         \
          << #statement " threw " #type " with message:\n  " << error.what()          \
          << "\nwhich lacks: " << substring;                                          \
    } catch (const std::exception& error) {                                           \
      ADD_FAILURE() << #statement " threw the wrong type; message: " << error.what(); \
    }                                                                                 \
  } while (false)

/// A tensor of uniform values in [low, high) from a seeded std engine (tests only: the library's
/// own generator is tested separately and should not be its own oracle's source).
template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> random_tensor(const Shape<Rank>& shape, std::mt19937_64& engine,
                                   double low = -1.0, double high = 1.0) {
  Tensor<Scalar, Rank> tensor(shape);
  std::uniform_real_distribution<double> distribution(low, high);
  for (Scalar& value : tensor) value = static_cast<Scalar>(distribution(engine));
  return tensor;
}

/// An owning copy of a tensor's or a view's values now (a view would see later changes).
template <TensorLike X>
Tensor<scalar_of<X>, rank_of<X>> snapshot(const X& x) {
  return Tensor<scalar_of<X>, rank_of<X>>(const_view(x));
}

template <TensorLike X>
Tensor<double, rank_of<X>> to_double(const X& x) {
  const auto tensor = const_view(x);
  Tensor<double, rank_of<X>> result(tensor.shape());
  std::copy(tensor.begin(), tensor.end(), result.begin());
  return result;
}

template <TensorLike X>
Tensor<scalar_of<X>, rank_of<X>> absolute(const X& x) {
  using Scalar = scalar_of<X>;
  const auto tensor = const_view(x);
  Tensor<Scalar, rank_of<X>> result(tensor.shape());
  std::transform(tensor.begin(), tensor.end(), result.begin(),
                 [](Scalar value) { return std::abs(value); });
  return result;
}

/// Per-element bound on |computed − exact| for y = x·Wᵀ + b computed in Scalar, for each of two
/// independent implementations: 2·γ_{K+1}·(|x|·|W|ᵀ + |b|), evaluated in double.
template <class Scalar>
Tensor<double, 2> linear_forward_bound(const Tensor<Scalar, 2>& x, const Tensor<Scalar, 2>& weight,
                                       const Tensor<Scalar, 1>* bias) {
  const auto abs_x = to_double(absolute(x));
  const auto abs_w = to_double(absolute(weight));
  Tensor<double, 2> bound({x.dim(0), weight.dim(0)});
  std::optional<ConstVectorMap<double>> abs_b;
  Tensor<double, 1> abs_bias;
  if (bias) {
    abs_bias = to_double(absolute(*bias));
    abs_b.emplace(abs_bias.data(), abs_bias.size());
  }
  linear_forward_naive<double>(abs_x.matrix(), abs_w.matrix(), abs_b, bound.matrix());
  const double factor = 2.0 * gamma<Scalar>(x.dim(1) + 1);
  for (double& value : bound) value = value * factor + std::numeric_limits<double>::denorm_min();
  return bound;
}

}  // namespace dissect::testing
