// Gradient checking by central finite differences, for any layer, block or loss: perturb each
// element of a tensor (or a seeded sample of them), difference a scalar loss, compare with the
// analytic gradient, and report the worst element. Tests use L = Σ dy ⊙ f(x) with a fixed random
// dy, so backward(x, dy) is the analytic gradient of L.
//
// Why central differences: D(h) = (L(x + h) − L(x − h)) / 2h cancels the even Taylor terms, so
// its truncation error is h²/6·L''' instead of the one-sided difference's h/2·L''. Why double:
// the difference also divides the loss's own rounding error δ by h, so the error of D(h) is about
// h²/6·|L'''| + δ/h. In float (u = 6e-8) the best h leaves ~1e-5 of relative error, too coarse to
// tell a subtle bug from noise; in double (u = 1.1e-16) it is ~1e-10 at h ≈ 1e-6.
//
// How the tolerance is chosen: an element passes when
//   |analytic − numeric| ≤ atol + rtol·|numeric| + safety·(truncation + loss_rounding / h),
// where truncation is Richardson's estimate |D(h) − D(2h)| / 3 (exact to leading order, zero
// where L is linear in the value; only with `richardson`), and loss_rounding bounds the error δ
// of one evaluation of L (e.g. γ_n·Σ|dy ⊙ y| for a sum of n rounded terms). The defaults:
// h = 1e-6 relative to the value; loss_rounding, when not given, 4u·|L|, the last rounding of
// any loss, which dominates when L is large (1e5, say) and one element's gradient small;
// atol = rtol = 1e-6, which covers a loss of scale ~1 summed from up to ~10³ terms (worst-case
// δ/h ≈ 1e-7) and still catches a gradient wrong by more than 1e-6 of itself. Tests that can
// bound their rounding use GradcheckOptions::error_budget(h, loss_rounding) instead.
//
// Works on raw double* + count, or on any tensor-like type with data() and size() (and shape(),
// when it has one, for multi-indices in the report): Tensor of any rank and views alike.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <iomanip>
#include <iterator>
#include <limits>
#include <numeric>
#include <optional>
#include <ostream>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

namespace dissect::testing {

// ---- options and result ------------------------------------------------------------------------

struct GradcheckOptions {
  /// Step h; with relative_step, h = step·max(1, |value|), so large values still move.
  double step = 1e-6;
  bool relative_step = true;
  /// Fixed part of the tolerance: atol + rtol·|numeric|.
  double rtol = 1e-6;
  double atol = 1e-6;
  /// Bound on |computed − exact| of one evaluation of the loss; allows safety·loss_rounding/h.
  /// Unset: 4u·max(|L(x + h)|, |L(x − h)|), the loss's own last rounding.
  std::optional<double> loss_rounding = std::nullopt;
  /// Also evaluate D(2h) and allow safety·|D(h) − D(2h)|/3 for truncation (twice the calls).
  bool richardson = false;
  /// Factor on the estimated error budget (truncation + rounding), not on atol and rtol.
  double safety = 2;
  /// 0: every element. Otherwise at most this many distinct elements, drawn with `seed`.
  std::int64_t sample = 0;
  std::uint64_t seed = 0;

  /// For a test that bounds its loss's rounding: a fixed step and no fixed atol or rtol, so each
  /// element is allowed safety·(|D(h) − D(2h)|/3 + loss_rounding/h) and nothing more.
  static GradcheckOptions error_budget(double step, double loss_rounding) {
    return {.step = step,
            .relative_step = false,
            .rtol = 0,
            .atol = 0,
            .loss_rounding = loss_rounding,
            .richardson = true};
  }
};

struct GradcheckResult {
  struct Element {
    std::int64_t flat = -1;  // -1: no element checked
    double analytic = 0, numeric = 0;
    double abs_error = 0, rel_error = 0;  // rel_error: abs_error / max(|analytic|, |numeric|)
    double allowed = 0;                   // the tolerance this element had to meet
    double step = 0;                      // h as asked for (D divides by x₊ − x₋ as rounded)
    double truncation = 0;                // Richardson's estimate; 0 without it
  };

  std::int64_t size = 0;            // elements in the tensor
  std::int64_t checked = 0;         // elements perturbed
  std::int64_t failures = 0;        // checked elements over their tolerance (or NaN)
  double max_abs_error = 0;         // over the checked elements
  std::vector<std::int64_t> shape;  // empty when the tensor type has no shape()
  /// The element with the largest abs_error / allowed: it passes iff every element passes.
  Element worst;

  bool passed() const { return failures == 0; }
  /// Row-major multi-index of `worst`; empty without a shape.
  std::vector<std::int64_t> worst_index() const;
};

/// "12 of 12 elements checked, 1 outside tolerance; worst at [2, 1] (flat 7): analytic …"
inline std::ostream& operator<<(std::ostream& out, const GradcheckResult& result);

namespace gradcheck_detail {
// Anything with a contiguous data() and a size(): Tensor of any rank, and views.
template <class T>
concept TensorLike = requires(T& t) {
  t.data();
  t.size();
};
}  // namespace gradcheck_detail

// ---- the checks --------------------------------------------------------------------------------

/// Checks d loss / d values[i] against analytic[i] for every i < count (or a sample), perturbing
/// values[i] in place and restoring it bit for bit, also if `loss` throws. `loss` is called with
/// no arguments and must return double; it reads the perturbed values through its captures.
/// `analytic` may be a view of a layer's live gradient: a forward pass leaves it alone.
template <class Loss>
[[nodiscard]] GradcheckResult gradcheck(Loss&& loss, double* values, const double* analytic,
                                        std::int64_t count, const GradcheckOptions& options = {});

/// The same on tensors: `values` and `analytic` need data() and size() (and equal shapes when
/// both have shape()). `values` may be a temporary view. @throws std::invalid_argument on a size
/// or shape mismatch.
template <class Loss, class Values, class Analytic>
requires gradcheck_detail::TensorLike<Values> && gradcheck_detail::TensorLike<Analytic>
[[nodiscard]] GradcheckResult gradcheck(Loss&& loss, Values&& values, const Analytic& analytic,
                                        const GradcheckOptions& options = {});

/// Pass/fail with the result printed, for EXPECT_PRED_FORMAT1.
inline ::testing::AssertionResult gradient_ok(const char* result_expr,
                                              const GradcheckResult& result);

#define EXPECT_GRADIENT_OK(result) EXPECT_PRED_FORMAT1(::dissect::testing::gradient_ok, result)
#define ASSERT_GRADIENT_OK(result) ASSERT_PRED_FORMAT1(::dissect::testing::gradient_ok, result)

// ---- implementation ----------------------------------------------------------------------------

namespace gradcheck_detail {

// Puts the saved value back on every path out, so a throwing loss cannot leave a parameter
// perturbed for the next test.
class Restore {
 public:
  explicit Restore(double& value) : value_(value), saved_(value) {}
  ~Restore() { value_ = saved_; }
  Restore(const Restore&) = delete;
  Restore& operator=(const Restore&) = delete;

 private:
  double& value_;
  double saved_;
};

struct Difference {
  double derivative;
  double loss_magnitude;  // max(|L(x + h)|, |L(x − h)|)
};

// Central difference over the step actually taken: x ± h rounds, and dividing by the rounded
// distance keeps that rounding out of the derivative.
template <class Loss>
Difference central_difference(Loss& loss, double& value, double h) {
  const Restore restore(value);
  const double saved = value;
  value = saved + h;
  const double up = value - saved, plus = loss();
  value = saved - h;
  const double down = saved - value, minus = loss();
  return {(plus - minus) / (up + down), std::max(std::abs(plus), std::abs(minus))};
}

inline std::vector<std::int64_t> indices_to_check(std::int64_t count,
                                                  const GradcheckOptions& options) {
  std::vector<std::int64_t> all(static_cast<std::size_t>(std::max<std::int64_t>(count, 0)));
  std::iota(all.begin(), all.end(), std::int64_t{0});
  if (options.sample <= 0 || options.sample >= count) return all;
  // Selection sampling: distinct indices, in increasing order, the same for the same seed.
  std::vector<std::int64_t> sample;
  std::mt19937_64 engine(options.seed);
  std::sample(all.begin(), all.end(), std::back_inserter(sample), options.sample, engine);
  return sample;
}

// abs_error / allowed, ordered so that NaN sorts worst and 0 ≤ 0 counts as a pass.
inline double excess(double abs_error, double allowed) {
  if (std::isnan(abs_error)) return INFINITY;
  if (abs_error == 0) return 0;
  return allowed > 0 ? abs_error / allowed : INFINITY;
}

template <class T>
concept HasShape = requires(const T& t) {
  { *std::begin(t.shape()) } -> std::convertible_to<std::int64_t>;
};

template <class T>
std::vector<std::int64_t> shape_of(const T& tensor) {
  if constexpr (HasShape<T>) {
    std::vector<std::int64_t> shape;
    for (const auto extent : tensor.shape()) shape.push_back(static_cast<std::int64_t>(extent));
    return shape;
  } else {
    return {};
  }
}

inline void print_index(std::ostream& out, const std::vector<std::int64_t>& index) {
  out << '[';
  for (std::size_t axis = 0; axis < index.size(); ++axis) out << (axis ? ", " : "") << index[axis];
  out << ']';
}

}  // namespace gradcheck_detail

template <class Loss>
GradcheckResult gradcheck(Loss&& loss, double* values, const double* analytic, std::int64_t count,
                          const GradcheckOptions& options) {
  static_assert(std::is_same_v<std::remove_cvref_t<std::invoke_result_t<Loss&>>, double>,
                "gradcheck: the loss must return double; a float loss rounds the difference away");
  GradcheckResult result;
  result.size = count;
  double worst_excess = -1;
  for (const std::int64_t i : gradcheck_detail::indices_to_check(count, options)) {
    GradcheckResult::Element element;
    element.flat = i;
    element.analytic = analytic[i];
    const double h =
        options.relative_step ? options.step * std::max(1.0, std::abs(values[i])) : options.step;
    element.step = h;
    const auto fine = gradcheck_detail::central_difference(loss, values[i], h);
    element.numeric = fine.derivative;
    if (options.richardson) {
      const auto coarse = gradcheck_detail::central_difference(loss, values[i], 2 * h);
      element.truncation = std::abs(element.numeric - coarse.derivative) / 3;
    }
    constexpr double u = std::numeric_limits<double>::epsilon() / 2;
    const double loss_rounding = options.loss_rounding.value_or(4 * u * fine.loss_magnitude);
    element.abs_error = std::abs(element.analytic - element.numeric);
    const double magnitude = std::max(std::abs(element.analytic), std::abs(element.numeric));
    element.rel_error = element.abs_error == 0 ? 0.0 : element.abs_error / magnitude;
    element.allowed = options.atol + options.rtol * std::abs(element.numeric) +
                      options.safety * (element.truncation + loss_rounding / h);
    const double ratio = gradcheck_detail::excess(element.abs_error, element.allowed);
    if (!(element.abs_error <= element.allowed)) ++result.failures;
    result.max_abs_error = std::isnan(element.abs_error)
                               ? INFINITY
                               : std::max(result.max_abs_error, element.abs_error);
    if (ratio > worst_excess) {
      worst_excess = ratio;
      result.worst = element;
    }
    ++result.checked;
  }
  return result;
}

template <class Loss, class Values, class Analytic>
requires gradcheck_detail::TensorLike<Values> && gradcheck_detail::TensorLike<Analytic>
    GradcheckResult gradcheck(Loss&& loss, Values&& values, const Analytic& analytic,
                              const GradcheckOptions& options) {
  static_assert(
      std::is_same_v<decltype(values.data()), double*>,
      "gradcheck: values must be a writable tensor of double (check gradients in double)");
  static_assert(std::is_convertible_v<decltype(analytic.data()), const double*>,
                "gradcheck: the analytic gradient must be a tensor of double");
  const auto shape = gradcheck_detail::shape_of(values);
  const auto analytic_shape = gradcheck_detail::shape_of(analytic);
  const auto count = static_cast<std::int64_t>(values.size());
  const bool shapes_differ = !shape.empty() && !analytic_shape.empty() && shape != analytic_shape;
  if (shapes_differ || static_cast<std::int64_t>(analytic.size()) != count) {
    std::ostringstream message;
    message << "gradcheck: analytic gradient has " << analytic.size() << " elements";
    if (!analytic_shape.empty())
      gradcheck_detail::print_index(message << ", shape ", analytic_shape);
    message << " but values have " << count;
    if (!shape.empty()) gradcheck_detail::print_index(message << ", shape ", shape);
    throw std::invalid_argument(message.str());
  }
  GradcheckResult result = gradcheck(loss, values.data(), analytic.data(), count, options);
  result.shape = shape;
  return result;
}

inline std::vector<std::int64_t> GradcheckResult::worst_index() const {
  if (shape.empty() || worst.flat < 0) return {};
  std::vector<std::int64_t> index(shape.size());
  std::int64_t offset = worst.flat;
  for (std::size_t axis = shape.size(); axis-- > 0;) {
    const std::int64_t extent = std::max<std::int64_t>(shape[axis], 1);
    index[axis] = offset % extent;
    offset /= extent;
  }
  return index;
}

inline std::ostream& operator<<(std::ostream& out, const GradcheckResult& result) {
  std::ostringstream text;  // its own stream, so the caller's precision and flags stay as they were
  text << result.checked << " of " << result.size << " elements checked, " << result.failures
       << " outside tolerance";
  if (result.worst.flat < 0) return out << text.str();
  const auto& w = result.worst;
  text << "; worst at ";
  if (result.shape.empty()) {
    text << "flat " << w.flat;
  } else {
    gradcheck_detail::print_index(text, result.worst_index());
    text << " (flat " << w.flat << ")";
  }
  text << std::setprecision(17) << ": analytic " << w.analytic << ", numeric " << w.numeric
       << std::scientific << std::setprecision(2) << ", abs error " << w.abs_error << ", rel error "
       << w.rel_error << ", allowed " << w.allowed << " (h " << w.step;
  if (w.truncation != 0) text << ", truncation estimate " << w.truncation;
  text << "); max abs error " << result.max_abs_error;
  return out << text.str();
}

inline ::testing::AssertionResult gradient_ok(const char* result_expr,
                                              const GradcheckResult& result) {
  if (result.passed()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "gradient check " << result_expr << ": " << result;
}

}  // namespace dissect::testing
