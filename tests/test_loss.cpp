// Tests for dissect/training/loss.hpp: softmax cross-entropy against PyTorch fixtures (with
// tolerances from a running error analysis of the log-sum-exp), hand-derived values, huge logits,
// finite-difference gradients, argmax/accuracy, and the bad-input rules (type, message, and
// nothing written on a throw).
#include "dissect/training/loss.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "support/fixture.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_loss {

using testing::gamma;
using testing::random_tensor;
using testing::unit_roundoff;

template <class Scalar>
class LossTyped : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LossTyped, Scalars);

// ---- an exact reference, and what rounding may cost ---------------------------------------------

/// Per-row quantities of the log-sum-exp, in double from the given logits: the exact answer (to
/// double precision) and the magnitudes a rounding-error bound needs.
struct RowAnalysis {
  double max = 0, log_sum = 0;
  std::vector<double> p, shifted;  // softmax, x − max
  double spread = 0;               // Σ p·|x − max|: how much exp's argument errors weigh in s
};

template <class Scalar>
RowAnalysis analyse_row(const Tensor<Scalar, 2>& logits, index_t n) {
  RowAnalysis row;
  const index_t classes = logits.dim(1);
  row.max = -INFINITY;
  for (index_t c = 0; c < classes; ++c) row.max = std::max(row.max, double(logits(n, c)));
  double sum = 0;
  for (index_t c = 0; c < classes; ++c) {
    row.shifted.push_back(double(logits(n, c)) - row.max);
    sum += std::exp(row.shifted.back());
  }
  row.log_sum = std::log(sum);
  for (index_t c = 0; c < classes; ++c) {
    row.p.push_back(std::exp(row.shifted[c]) / sum);
    row.spread += row.p.back() * std::abs(row.shifted[c]);
  }
  return row;
}

/// Bound on |computed − exact| for one implementation in Scalar. The shift x − max is rounded
/// (relative u), so exp's argument is off by u·|x − max|; s = Σ e collects those weighted by p
/// plus γ_C of summation; log s and the final subtractions add u times their magnitudes. Every
/// step is charged a few roundings more than it needs, folded into γ_{C+4}.
template <class Scalar>
double log_sum_error(const RowAnalysis& row, index_t classes) {
  return gamma<Scalar>(classes + 4) * (1 + row.spread + std::abs(row.log_sum));
}

template <class Scalar>
struct ExpectedLoss {
  double loss = 0, loss_bound = 0;
  Tensor<double, 2> dlogits, dlogits_bound, log_softmax, log_softmax_bound;
};

/// Exact values and per-element bounds for the *difference of two* implementations (twice the
/// single-implementation bound): what a fixture comparison may allow.
template <class Scalar>
ExpectedLoss<Scalar> expected_loss(const Tensor<Scalar, 2>& logits,
                                   const std::vector<index_t>& targets) {
  const index_t rows = logits.dim(0), classes = logits.dim(1);
  const double u = unit_roundoff<Scalar>();
  ExpectedLoss<Scalar> e{0,
                         0,
                         Tensor<double, 2>(logits.shape()),
                         Tensor<double, 2>(logits.shape()),
                         Tensor<double, 2>(logits.shape()),
                         Tensor<double, 2>(logits.shape())};
  double abs_sum = 0;
  for (index_t n = 0; n < rows; ++n) {
    const RowAnalysis row = analyse_row(logits, n);
    const index_t t = targets[static_cast<std::size_t>(n)];
    const double row_loss = row.log_sum - row.shifted[t];
    const double lse_error = log_sum_error<Scalar>(row, classes);
    e.loss += row_loss;
    abs_sum += std::abs(row_loss);
    e.loss_bound += lse_error + gamma<Scalar>(2) * (std::abs(row.shifted[t]) + std::abs(row_loss));
    for (index_t c = 0; c < classes; ++c) {
      const double y = c == t ? 1.0 : 0.0;
      const double p = row.p[c];
      e.dlogits(n, c) = (p - y) / double(rows);
      // p's relative error: its exp argument (u·|x − max|, or for torch's exp(log_softmax) also
      // u·|log s|) plus that of s; then the subtraction of the one-hot and the 1/N scale.
      const double p_error = p * (lse_error + gamma<Scalar>(3) * std::abs(row.shifted[c]));
      e.dlogits_bound(n, c) =
          2 * (p_error + gamma<Scalar>(3) * std::abs(p - y)) / double(rows) + 1e-300;
      e.log_softmax(n, c) = row.shifted[c] - row.log_sum;
      e.log_softmax_bound(n, c) =
          2 * (lse_error +
               gamma<Scalar>(2) * (std::abs(row.shifted[c]) + std::abs(e.log_softmax(n, c)))) +
          1e-300;
    }
  }
  e.loss /= double(rows);
  // Mean: the sum of N terms (γ_N of Σ|L|) and the final division and cast.
  e.loss_bound = 2 * (e.loss_bound + (gamma<Scalar>(rows + 2) + u) * abs_sum) / double(rows);
  return e;
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

using testing::tensor_from;

template <class Scalar>
void check_loss_fixture(const testing::Fixture& f) {
  SCOPED_TRACE(f.path.string());
  const auto logits = tensor_from<Scalar, 2>(f.tensor("logits"));
  std::vector<index_t> targets;
  for (double t : f.tensor("target").values) targets.push_back(static_cast<index_t>(t));
  const auto torch_dlogits = tensor_from<Scalar, 2>(f.tensor("dlogits"));
  const auto torch_log_softmax = tensor_from<Scalar, 2>(f.tensor("log_softmax"));
  const double torch_loss = f.tensor("loss").values.at(0);

  const auto expected = expected_loss(logits, targets);
  // The fixture itself must lie within one implementation's bound of the exact value, or the
  // comparison below would be vacuous or the analysis wrong.
  EXPECT_NEAR(torch_loss, expected.loss, expected.loss_bound / 2);

  EXPECT_NEAR(double(cross_entropy(logits, targets)), torch_loss, expected.loss_bound);
  Tensor<double, 2> bound = expected.dlogits_bound;
  EXPECT_TENSOR_WITHIN(cross_entropy_backward(logits, targets), torch_dlogits, bound);
  Tensor<Scalar, 2> fused(logits.shape());
  EXPECT_NEAR(double(cross_entropy_forward_backward(logits, targets, fused)), torch_loss,
              expected.loss_bound);
  EXPECT_TENSOR_WITHIN(fused, torch_dlogits, bound);
  EXPECT_TENSOR_WITHIN(log_softmax(logits), torch_log_softmax, expected.log_softmax_bound);
  // softmax against the exact probabilities (one implementation: half the pair bound).
  Tensor<double, 2> p(logits.shape()), p_bound(logits.shape());
  for (index_t n = 0; n < logits.dim(0); ++n) {
    const RowAnalysis row = analyse_row(logits, n);
    for (index_t c = 0; c < logits.dim(1); ++c) {
      p(n, c) = row.p[c];
      p_bound(n, c) = row.p[c] * (log_sum_error<Scalar>(row, logits.dim(1)) +
                                  gamma<Scalar>(3) * std::abs(row.shifted[c])) +
                      1e-300;
    }
  }
  EXPECT_TENSOR_WITHIN(softmax(logits), p, p_bound);
}

TEST(LossFixtures, MatchPyTorchCrossEntropy) {
  int checked = 0;
  for (const auto& path : testing::list_fixtures(testing::fixture_dir("loss"))) {
    const auto f = testing::read_fixture(path);
    if (f.dtype == "float32") {
      check_loss_fixture<float>(f);
    } else {
      check_loss_fixture<double>(f);
    }
    ++checked;
  }
  EXPECT_GE(checked, 12);  // 6 cases × 2 dtypes
}

TEST(LossFixtures, ToleranceCatchesAWrongGradient) {
  // The bounds above are not so loose that a real mistake passes: forgetting the 1/N (N = 4)
  // or the one-hot on the scale-1e4 case must fail them.
  const auto f = testing::read_fixture(testing::fixture_dir("loss") / "f32_n4_c3.txt");
  const auto logits = tensor_from<float, 2>(f.tensor("logits"));
  std::vector<index_t> targets;
  for (double t : f.tensor("target").values) targets.push_back(static_cast<index_t>(t));
  const auto expected = expected_loss(logits, targets);
  const auto unscaled = cross_entropy_backward(logits, targets, 4.0f);
  bool any_outside = false;
  for (index_t i = 0; i < unscaled.size(); ++i) {
    any_outside |= std::abs(unscaled.data()[i] - f.tensor("dlogits").values[i]) >
                   expected.dlogits_bound.data()[i];
  }
  EXPECT_TRUE(any_outside);
}

// ---- hand-derived values ------------------------------------------------------------------------

TYPED_TEST(LossTyped, UniformLogitsGiveLogC) {
  using S = TypeParam;
  // Equal logits: p = 1/C for every class, loss = log C; dlogits = (1/C − onehot)/N.
  Tensor<S, 2> logits({2, 4});
  logits.fill(S(3));
  const std::vector<index_t> targets{1, 3};
  EXPECT_NEAR(double(cross_entropy(logits, targets)), std::log(4.0), 4 * unit_roundoff<S>());
  const auto d = cross_entropy_backward(logits, targets);
  EXPECT_NEAR(double(d(0, 0)), 0.25 / 2, 4 * unit_roundoff<S>());
  EXPECT_NEAR(double(d(0, 1)), (0.25 - 1) / 2, 4 * unit_roundoff<S>());
  EXPECT_NEAR(double(d(1, 3)), (0.25 - 1) / 2, 4 * unit_roundoff<S>());
  // Each row of dlogits sums to 0 (Σp = 1 and one 1 subtracted).
  EXPECT_NEAR(double(d(1, 0) + d(1, 1) + d(1, 2) + d(1, 3)), 0.0, 8 * unit_roundoff<S>());
}

TYPED_TEST(LossTyped, TwoClassesIsSoftplus) {
  using S = TypeParam;
  // loss([a, b], target 0) = log(1 + e^(b − a)) = softplus(b − a); with a = 1, b = −1: log(1+e⁻²).
  Tensor<S, 2> logits({1, 2}, {S(1), S(-1)});
  const std::vector<index_t> target{0};
  EXPECT_NEAR(double(cross_entropy(logits, target)), std::log1p(std::exp(-2.0)),
              8 * unit_roundoff<S>());
  // d/da = p0 − 1 = −1/(1 + e²); d/db = p1 = 1/(1 + e²) = 0.11920292…
  const auto d = cross_entropy_backward(logits, target);
  EXPECT_NEAR(double(d(0, 1)), 1 / (1 + std::exp(2.0)), 8 * unit_roundoff<S>());
  EXPECT_NEAR(double(d(0, 0)), -1 / (1 + std::exp(2.0)), 8 * unit_roundoff<S>());
}

TYPED_TEST(LossTyped, HugeLogitsDoNotOverflow) {
  using S = TypeParam;
  // exp(1e4) overflows both types; shifted by the max, exp(0) = 1 and exp(−1e4) = 0, so the
  // loss is 0 for the right class and exactly 1e4 for the wrong one.
  Tensor<S, 2> logits({2, 2}, {S(1e4), S(0), S(1e4), S(0)});
  const std::vector<index_t> targets{0, 1};
  Tensor<S, 2> d(logits.shape());
  const S loss = cross_entropy_forward_backward(logits, targets, d);
  EXPECT_EQ(loss, S(5000));  // (0 + 1e4) / 2
  EXPECT_TRUE(std::isfinite(d(0, 0)) && std::isfinite(d(1, 1)));
  EXPECT_EQ(d(1, 1), S(-0.5));  // (p1 − 1)/N with p1 = 0
  EXPECT_EQ(d(1, 0), S(0.5));
  // Near the type's limit: −big − big overflows to −inf, and exp(−inf) is still exactly 0.
  const S big = std::numeric_limits<S>::max() * S(0.75);
  Tensor<S, 2> extreme({1, 3}, {big, -big, S(0)});
  EXPECT_EQ(cross_entropy(extreme, std::vector<index_t>{0}), S(0));
  EXPECT_EQ(cross_entropy(extreme, std::vector<index_t>{2}), big);
  for (S v : softmax(extreme)) EXPECT_TRUE(std::isfinite(v));
}

TYPED_TEST(LossTyped, ShiftInvariance) {
  using S = TypeParam;
  // softmax(x + k) = softmax(x) for a per-row constant k; so are loss and gradient.
  std::mt19937_64 engine(11);
  for (int trial = 0; trial < 100; ++trial) {
    const index_t n = 1 + trial % 5, c = 2 + trial % 7;
    auto logits = random_tensor<S>(Shape<2>{n, c}, engine, -3, 3);
    auto shifted = logits;
    for (index_t i = 0; i < n; ++i)
      for (index_t j = 0; j < c; ++j) shifted(i, j) += S(8 * (i + 1));
    std::vector<index_t> targets;
    for (index_t i = 0; i < n; ++i) targets.push_back((i * 3 + trial) % c);
    // Adding k rounds x + k (|x + k| ≤ 8N + 3), which moves each shifted logit by u·that.
    const double tol = gamma<S>(c + 6) * (8.0 * double(n) + 3 + 2);
    EXPECT_NEAR(double(cross_entropy(logits, targets)), double(cross_entropy(shifted, targets)),
                tol);
    EXPECT_TENSOR_NEAR(cross_entropy_backward(logits, targets),
                       cross_entropy_backward(shifted, targets), 0.0, tol);
  }
}

// ---- finite differences -------------------------------------------------------------------------

TEST(LossGradient, CentralDifferencesInDouble) {
  // 200 random shapes, every element. With h = 1e-5 the truncation error is ≤ h²/6·|f'''| and
  // |f'''| ≤ 1/N for the mean log-sum-exp; rounding adds ≈ 2u·|L|/h.
  std::mt19937_64 engine(7);
  const double h = 1e-5;
  for (int trial = 0; trial < 200; ++trial) {
    const index_t n = 1 + static_cast<index_t>(engine() % 6);
    const index_t c = 1 + static_cast<index_t>(engine() % 9);
    auto logits = random_tensor<double>(Shape<2>{n, c}, engine, -4, 4);
    std::vector<index_t> targets;
    for (index_t i = 0; i < n; ++i) targets.push_back(static_cast<index_t>(engine() % c));
    SCOPED_TRACE(testing::concat_for_trace("N", n, "C", c, "trial", trial));
    const auto analytic = cross_entropy_backward(logits, targets);
    const double loss = cross_entropy(logits, targets);
    const double tol = h * h / 6 + 4 * unit_roundoff<double>() * (1 + std::abs(loss)) / h;
    // tol holds the rounding already, so no loss_rounding on top.
    const testing::GradcheckOptions options{
        .step = h, .relative_step = false, .rtol = 0, .atol = tol, .loss_rounding = 0.0};
    EXPECT_GRADIENT_OK(testing::gradcheck([&] { return cross_entropy(logits, targets); }, logits,
                                          analytic, options));
  }
}

TYPED_TEST(LossTyped, GradOutputScalesTheGradient) {
  using S = TypeParam;
  std::mt19937_64 engine(5);
  const auto logits = random_tensor<S>(Shape<2>{3, 5}, engine);
  const std::vector<index_t> targets{4, 0, 2};
  const auto once = cross_entropy_backward(logits, targets);
  const auto scaled = cross_entropy_backward(logits, targets, S(-2.5));
  for (index_t i = 0; i < once.size(); ++i) {
    EXPECT_NEAR(double(scaled.data()[i]), -2.5 * double(once.data()[i]),
                gamma<S>(4) * 2.5 * std::abs(double(once.data()[i])) + 1e-300);
  }
}

// ---- the forms agree; in place; rank > 2
// ---------------------------------------------------------

TYPED_TEST(LossTyped, FusedAndInPlaceFormsAgreeBitwise) {
  using S = TypeParam;
  std::mt19937_64 engine(3);
  const auto logits = random_tensor<S>(Shape<2>{7, 10}, engine, -5, 5);
  const std::vector<index_t> targets{0, 9, 3, 3, 5, 1, 8};
  const auto d = cross_entropy_backward(logits, targets);
  Tensor<S, 2> fused(logits.shape());
  fused.fill(std::numeric_limits<S>::quiet_NaN());  // outputs are written before being read
  const S loss = cross_entropy_forward_backward(logits, targets, fused);
  EXPECT_EQ(loss, cross_entropy(logits, targets));
  EXPECT_TENSOR_EQ(fused, d);
  auto in_place = logits;
  EXPECT_EQ(cross_entropy_forward_backward(in_place, targets, in_place), loss);
  EXPECT_TENSOR_EQ(in_place, d);
  auto in_place2 = logits;
  cross_entropy_backward_into(in_place2, targets, in_place2);
  EXPECT_TENSOR_EQ(in_place2, d);
  auto sm = logits;
  softmax_into(sm, sm);
  EXPECT_TENSOR_EQ(sm, softmax(logits));
  auto lsm = logits;
  log_softmax_into(lsm, lsm);
  EXPECT_TENSOR_EQ(lsm, log_softmax(logits));
}

TYPED_TEST(LossTyped, SoftmaxFoldsLeadingAxes) {
  using S = TypeParam;
  std::mt19937_64 engine(4);
  const auto x = random_tensor<S>(Shape<3>{2, 3, 5}, engine, -2, 2);
  const auto p3 = softmax(x);
  const auto p2 = softmax(x.reshape(Shape<2>{6, 5}));
  EXPECT_TENSOR_EQ(p3.reshape(Shape<2>{6, 5}), p2);
  for (index_t r = 0; r < 6; ++r) {
    double sum = 0;
    for (index_t c = 0; c < 5; ++c) sum += p2(r, c);
    EXPECT_NEAR(sum, 1.0, gamma<S>(8));
  }
  const auto l3 = log_softmax(x);
  for (index_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(std::exp(double(l3.data()[i])), double(p3.data()[i]), gamma<S>(12));
  }
}

// ---- special values -------------------------------------------------------------------------

TYPED_TEST(LossTyped, EmptyBatchIsNaNLikeTorchMean) {
  using S = TypeParam;
  Tensor<S, 2> logits({0, 4});
  const std::vector<index_t> none;
  EXPECT_TRUE(std::isnan(cross_entropy(logits, none)));
  Tensor<S, 2> d({0, 4});
  EXPECT_TRUE(std::isnan(cross_entropy_forward_backward(logits, none, d)));
  EXPECT_EQ(cross_entropy_backward(logits, none).shape(), (Shape<2>{0, 4}));
  EXPECT_EQ(count_correct(logits, none), 0);
  EXPECT_TRUE(argmax(logits).empty());
}

TYPED_TEST(LossTyped, NaNStaysInItsRow) {
  using S = TypeParam;
  const S nan = std::numeric_limits<S>::quiet_NaN();
  Tensor<S, 2> logits({2, 3}, {S(1), nan, S(0), S(1), S(2), S(3)});
  const std::vector<index_t> targets{0, 2};
  EXPECT_TRUE(std::isnan(cross_entropy(logits, targets)));
  const auto d = cross_entropy_backward(logits, targets);
  for (index_t c = 0; c < 3; ++c) {
    EXPECT_TRUE(std::isnan(d(0, c)));
    EXPECT_TRUE(std::isfinite(d(1, c)));
  }
  // A row of −inf has no finite maximum: NaN, as torch's log_softmax gives.
  const S inf = std::numeric_limits<S>::infinity();
  Tensor<S, 2> minus_inf({1, 2}, {-inf, -inf});
  EXPECT_TRUE(std::isnan(cross_entropy(minus_inf, std::vector<index_t>{0})));
  // One −inf among finite logits is simply probability 0.
  Tensor<S, 2> one_minus_inf({1, 2}, {-inf, S(0)});
  EXPECT_EQ(cross_entropy(one_minus_inf, std::vector<index_t>{1}), S(0));
  EXPECT_EQ(cross_entropy(one_minus_inf, std::vector<index_t>{0}), inf);
}

// ---- argmax and accuracy --------------------------------------------------------------------

TYPED_TEST(LossTyped, ArgmaxTakesTheFirstMaximumAndNaN) {
  using S = TypeParam;
  const S nan = std::numeric_limits<S>::quiet_NaN();
  Tensor<S, 2> logits({4, 3}, {S(1), S(5), S(5),  //
                               S(-1), S(-2), S(-0.5), S(0), nan, S(9), S(2), S(2), S(2)});
  EXPECT_EQ(argmax(logits), (std::vector<index_t>{1, 2, 1, 0}));
  EXPECT_EQ(count_correct(logits, std::vector<index_t>{1, 2, 1, 0}), 4);
  EXPECT_EQ(count_correct(logits, std::vector<index_t>{2, 2, 2, 0}), 2);
}

// ---- bad input ------------------------------------------------------------------------------

TEST(LossErrors, TargetOutOfRangeNamesTheIndex) {
  Tensor<float, 2> logits({4, 10});
  EXPECT_THROW_WITH(
      cross_entropy(logits, std::vector<index_t>({1, 2, 10, 3})), Error,
      "cross_entropy: target 10 at index 2 is out of range [0, 10) (logits: [4, 10])");
  EXPECT_THROW_WITH(cross_entropy(logits, std::vector<index_t>({1, -1, 0, 3})), Error,
                    "target -1 at index 1");
  EXPECT_THROW_WITH(cross_entropy_backward(logits, std::vector<index_t>({1, 2, 3, 99})), Error,
                    "cross_entropy_backward: target 99 at index 3");
  // No classes at all: every target is out of range.
  EXPECT_THROW_WITH(cross_entropy(Tensor<float, 2>({1, 0}), std::vector<index_t>({0})), Error,
                    "out of range [0, 0)");
}

TEST(LossErrors, WrongTargetCountIsAShapeError) {
  Tensor<double, 2> logits({3, 5});
  EXPECT_THROW_WITH(cross_entropy(logits, std::vector<index_t>({1, 2})), ShapeError,
                    "cross_entropy: 2 targets for logits [3, 5] (one per row expected)");
  EXPECT_THROW_WITH(count_correct(logits, std::vector<index_t>({1, 2, 3, 4})), ShapeError,
                    "count_correct: 4 targets for logits [3, 5]");
  EXPECT_THROW_WITH(argmax(Tensor<double, 2>({2, 0})), ShapeError, "no classes");
}

TEST(LossErrors, BadOutputBufferThrowsAndNothingIsWritten) {
  std::mt19937_64 engine(1);
  const auto logits = random_tensor<float>(Shape<2>{3, 4}, engine);
  const std::vector<index_t> targets{0, 1, 2};
  Tensor<float, 2> wrong({3, 5});
  EXPECT_THROW_WITH(cross_entropy_backward_into(logits, targets, wrong), ShapeError,
                    "cross_entropy_backward: dlogits has shape [3, 5] but logits has shape [3, 4]");
  EXPECT_THROW_WITH(softmax_into(logits, wrong), ShapeError, "softmax: out has shape [3, 5]");
  EXPECT_THROW_WITH(log_softmax_into(logits, wrong), ShapeError, "log_softmax: out has shape");
  // Strong guarantee: a bad target is found before any row is written.
  Tensor<float, 2> d(logits.shape());
  d.fill(7.0f);
  const auto before = d;
  EXPECT_THROW_WITH(cross_entropy_forward_backward(logits, std::vector<index_t>({0, 1, 4}), d),
                    Error, "target 4 at index 2");
  EXPECT_TENSOR_EQ(d, before);
}

}  // namespace test_loss
}  // namespace dissect
