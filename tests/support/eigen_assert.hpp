// Test prelude, force-included before anything else: Eigen's internal assertions throw a
// distinct type, so a bad shape that slipped past dissect's own checks fails the test loudly
// instead of aborting the process (or, in release builds, being undefined behaviour).
#pragma once
#include <stdexcept>

namespace dissect::testing {
struct EigenAssertionFired : std::logic_error {
  using std::logic_error::logic_error;
};
}  // namespace dissect::testing

#define eigen_assert(condition)                                                                   \
  do {                                                                                            \
    if (!(condition)) throw ::dissect::testing::EigenAssertionFired("eigen_assert: " #condition); \
  } while (false)
