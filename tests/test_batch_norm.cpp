// Tests for dissect/layers/batch_norm.hpp: hand-computed statistics and running averages (the
// unbiased running variance), the training/evaluation mode, PyTorch fixtures (nn.BatchNorm1d: two
// training steps then evaluation, [N, C] and [N, C, L]), finite differences in double in both
// modes, the module protocol, and every bad input with its type and message — each leaving the
// state alone.
#include "dissect/layers/batch_norm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_batch_norm {

using testing::random_tensor;
using testing::snapshot;

TEST(BatchNorm1d, StartsInTrainingWithTorchsInitialState) {
  BatchNorm1d<float> norm(4);
  static_assert(Module<BatchNorm1d<float>>);
  static_assert(ModalLayer<BatchNorm1d<float>>);
  EXPECT_TRUE(norm.training());
  EXPECT_EQ(parameter_names(norm), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(norm.parameter_count(), 8);
  for (float v : norm.weight()) EXPECT_EQ(v, 1.0f);
  for (float v : norm.bias()) EXPECT_EQ(v, 0.0f);
  for (float v : norm.running_mean()) EXPECT_EQ(v, 0.0f);
  for (float v : norm.running_var()) EXPECT_EQ(v, 1.0f);
  EXPECT_EQ(norm.num_batches_tracked(), 0);
  std::ostringstream printed;
  printed << norm;
  EXPECT_EQ(printed.str(), "BatchNorm1d(4, eps=1e-05, momentum=0.1)");
  norm.set_training(false);
  EXPECT_FALSE(norm.training());
}

TEST(BatchNorm1d, HandComputedTrainingStepAndRunningAverages) {
  // One channel, x = [1, 2, 3, 6]: μ = 3, σ² = (4 + 1 + 0 + 9)/4 = 3.5 (biased), unbiased
  // 14/3. eps = 0 is refused, so take eps tiny against σ²: y ≈ (x − 3)/√3.5.
  BatchNorm1d<double> norm(1, {.eps = 1e-300, .momentum = 0.25});
  const Tensor<double, 2> x({4, 1}, {1, 2, 3, 6});
  BatchNorm1d<double>::Cache cache;
  const auto y = norm.forward(x, cache);
  const double s = std::sqrt(3.5);
  EXPECT_TENSOR_NEAR(y, (Tensor<double, 2>({4, 1}, {-2 / s, -1 / s, 0, 3 / s})), 1e-15, 0);
  // running_mean = 0.75·0 + 0.25·3; running_var = 0.75·1 + 0.25·14/3 (torch's unbiased variance).
  EXPECT_DOUBLE_EQ(norm.running_mean()(0), 0.75);
  EXPECT_DOUBLE_EQ(norm.running_var()(0), 0.75 + 0.25 * 14.0 / 3.0);
  EXPECT_EQ(norm.num_batches_tracked(), 1);
  // The const forward uses the batch's statistics too but updates nothing.
  EXPECT_TENSOR_EQ(norm.forward(x), y);
  EXPECT_EQ(norm.num_batches_tracked(), 1);
  EXPECT_DOUBLE_EQ(norm.running_mean()(0), 0.75);
  // Evaluation: (x − 0.75)/√(running_var + eps)·γ + β, whatever the batch, even one row.
  norm.set_training(false);
  norm.weight()(0) = 2;
  norm.bias()(0) = 1;
  const Tensor<double, 2> one({1, 1}, {5});
  const double rv = 0.75 + 0.25 * 14.0 / 3.0;
  EXPECT_NEAR(norm.forward(one)(0, 0), (5 - 0.75) / std::sqrt(rv) * 2 + 1, 1e-15);
  BatchNorm1d<double>::Cache eval_cache;
  EXPECT_NEAR(norm.forward(one, eval_cache)(0, 0), (5 - 0.75) / std::sqrt(rv) * 2 + 1, 1e-15);
  EXPECT_EQ(norm.num_batches_tracked(), 1);  // evaluation never updates
  // Its backward is the affine map's: dx = γ/√rv·dy, dγ = dy·x̂, dβ = dy.
  norm.zero_grad();
  const auto dx = norm.backward(one, eval_cache, Tensor<double, 2>({1, 1}, {3}));
  EXPECT_NEAR(dx(0, 0), 3 * 2 / std::sqrt(rv), 1e-15);
  EXPECT_NEAR(norm.weight_grad()(0), 3 * (5 - 0.75) / std::sqrt(rv), 1e-14);
  EXPECT_EQ(norm.bias_grad()(0), 3.0);
}

TEST(BatchNorm1d, ChannelsAreIndependentAndLIsPartOfTheBatch) {
  // [N, C, L] = [2, 2, 2]: channel 0 holds 1, 3 (n = 0) and 5, 7 (n = 1): μ = 4; channel 1 is
  // constant 9: σ² = 0, so y = β exactly.
  const Tensor<float, 3> x({2, 2, 2}, {1, 3, 9, 9, 5, 7, 9, 9});
  BatchNorm1d<float> norm(2, {.momentum = 1});
  norm.bias().fill(0.5f);
  BatchNorm1d<float>::Cache cache;
  const auto y = norm.forward(x, cache);
  EXPECT_EQ(y(0, 1, 0), 0.5f);
  EXPECT_EQ(y(1, 1, 1), 0.5f);
  EXPECT_FLOAT_EQ(y(0, 0, 0) + y(1, 0, 1), 1.0f);  // symmetric about μ, shifted by β twice
  // momentum 1: the running statistics are the batch's, variance unbiased: Σ(x − 4)²/3 = 20/3.
  EXPECT_EQ(norm.running_mean()(0), 4.0f);
  EXPECT_EQ(norm.running_mean()(1), 9.0f);
  EXPECT_FLOAT_EQ(norm.running_var()(0), 20.0f / 3.0f);
  EXPECT_EQ(norm.running_var()(1), 0.0f);
}

TEST(BatchNorm1d, NaNPoisonsItsChannelAndNoOther) {
  // IEEE propagation, as torch: in training a NaN makes its channel's statistics NaN, so every y
  // of that channel and its running statistics; the other channels are untouched. In
  // evaluation the statistics are fixed, so only the NaN's own output is NaN.
  Tensor<double, 2> x({3, 2}, {1, 2, 3, NAN, 5, 6});
  BatchNorm1d<double> norm(2);
  BatchNorm1d<double>::Cache cache;
  const auto y = norm.forward(x, cache);
  for (index_t n = 0; n < 3; ++n) {
    EXPECT_FALSE(std::isnan(y(n, 0)));
    EXPECT_TRUE(std::isnan(y(n, 1)));
  }
  EXPECT_FALSE(std::isnan(norm.running_mean()(0)));
  EXPECT_TRUE(std::isnan(norm.running_mean()(1)));
  EXPECT_TRUE(std::isnan(norm.running_var()(1)));
  BatchNorm1d<double> evaluation(2);
  evaluation.set_training(false);
  const auto z = evaluation.forward(x);
  for (index_t i = 0; i < z.size(); ++i) EXPECT_EQ(std::isnan(z.data()[i]), i == 3);
}

// ---- finite differences -------------------------------------------------------------------------

TEST(BatchNorm1dGradients, MatchFiniteDifferencesInBothModes) {
  // In training the loss depends on x through the batch's statistics too: the full Jacobian.
  // Each loss evaluation uses forward(x), which never updates the running statistics, so the
  // perturbations see one fixed module.
  std::mt19937_64 engine(29);
  for (int trial = 0; trial < testing::sweep_trials(20); ++trial) {
    const index_t batch = 2 + static_cast<index_t>(engine() % 4);
    const index_t channels = 1 + static_cast<index_t>(engine() % 4);
    const index_t length = 1 + static_cast<index_t>(engine() % 3);
    const bool training = trial % 2 == 0;
    SCOPED_TRACE(
        testing::concat_for_trace("N", batch, "C", channels, "L", length, "training", training));
    BatchNorm1d<double> norm(channels, {.eps = 1e-3});
    auto tensors = [&]<std::size_t Rank>(Shape<Rank> shape) {
      norm.set_training(true);
      BatchNorm1d<double>::Cache warmup;
      (void)norm.forward(random_tensor<double, Rank>(shape, engine, -2, 3), warmup);
      norm.set_training(training);
      norm.weight().copy_from(random_tensor<double, 1>({channels}, engine).view());
      norm.bias().copy_from(random_tensor<double, 1>({channels}, engine).view());
      norm.zero_grad();
      auto x = random_tensor<double, Rank>(shape, engine, -2, 2);
      const auto dy = random_tensor<double, Rank>(shape, engine);
      BatchNorm1d<double>::Cache cache;
      (void)norm.forward(x, cache);
      const auto dx = norm.backward(x, cache, dy);
      const auto loss = [&] {
        const auto y = norm.forward(x);
        double total = 0;
        for (index_t i = 0; i < y.size(); ++i) total += dy.data()[i] * y.data()[i];
        return total;
      };
      ASSERT_GRADIENT_OK(testing::gradcheck(loss, x, dx));
      ASSERT_GRADIENT_OK(testing::gradcheck(loss, norm.weight(), norm.weight_grad()));
      ASSERT_GRADIENT_OK(testing::gradcheck(loss, norm.bias(), norm.bias_grad()));
    };
    tensors(Shape<2>{batch, channels});
    tensors(Shape<3>{batch, channels, length});
  }
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

template <class Scalar>
class BatchNorm1dTyped : public ::testing::Test {};
TYPED_TEST_SUITE(BatchNorm1dTyped, testing::FloatAndDouble);

// Bounds, derived as test_norm.cpp derives LayerNorm's (a channel here is a row there, its n =
// N·L values the row's D): each computed value is within γ_L·scale of the exact one, the scale
// being the computation redone on magnitudes, and two implementations within twice that. Per
// channel, with a_j = (|x_j − μ| + |x_j| + |μ|)·rstd and G_j = |dy_j·γ|:
//   y:  |γ|·a_j + |β|,                            L = 2n + 8
//   dx: rstd·(G_j + mean(G) + 2·a_j·mean(G ⊙ a)),  L = 4n + 16
//   dγ: Σ|dy_j|·a_j (L = 3n + 8),  dβ: Σ|dy_j| (L = n)
// The running statistics carry their previous bound forward, times 1 − m, and add the update's:
//   mean: (1 − m)·|rm| + m·Σ|x_j|/n (L = n + 4);  var: (1 − m)·|rv| + m·n/(n − 1)·Σ(|x_j − μ| +
//   |x_j| + |μ|)²/n (L = 2n + 12).
// In evaluation μ and σ² are the running statistics, on which the two implementations already
// differ by up to (b_m, b_v): that difference moves y by |γ|·(rstd·b_m + |x − μ|·rstd³/2·b_v),
// and dx, dγ alike, on top of their own rounding (L = 8, 4 and n + 8).
struct ChannelBounds {
  std::vector<double> y, dx, dweight, dbias;
};

template <class Scalar>
double two_gamma(index_t length) {
  return 2 * testing::gamma<Scalar>(length);
}

/// The bounds of one forward and backward on x (flat [outer, C, inner]) with the statistics
/// (mean, var) of each channel, batch or running, and their discrepancy (b_mean, b_var).
template <class Scalar>
ChannelBounds channel_bounds(const std::vector<double>& x, const std::vector<double>& dy,
                             index_t outer, index_t channels, index_t inner, bool batch_statistics,
                             const std::vector<double>& mean, const std::vector<double>& var,
                             const std::vector<double>& b_mean, const std::vector<double>& b_var,
                             const std::vector<double>& weight, const std::vector<double>& bias,
                             double eps) {
  const index_t n = outer * inner;
  constexpr double tiny = std::numeric_limits<double>::denorm_min();
  ChannelBounds b{std::vector<double>(x.size(), tiny), std::vector<double>(x.size(), tiny),
                  std::vector<double>(channels, tiny), std::vector<double>(channels, tiny)};
  const auto at = [&](index_t i, index_t c, index_t l) { return (i * channels + c) * inner + l; };
  for (index_t c = 0; c < channels; ++c) {
    const double mu = mean[c], rstd = 1 / std::sqrt(var[c] + eps);
    const double gamma = std::abs(weight[c]), beta = std::abs(bias[c]);
    double mean_g = 0, mean_ga = 0;
    for (index_t i = 0; i < outer; ++i)
      for (index_t l = 0; l < inner; ++l) {
        const double v = x[at(i, c, l)];
        const double a = (std::abs(v - mu) + std::abs(v) + std::abs(mu)) * rstd;
        const double g = std::abs(dy[at(i, c, l)]) * gamma;
        mean_g += g / static_cast<double>(n);
        mean_ga += g * a / static_cast<double>(n);
      }
    for (index_t i = 0; i < outer; ++i)
      for (index_t l = 0; l < inner; ++l) {
        const index_t k = at(i, c, l);
        const double v = x[k], d = std::abs(dy[k]);
        const double a = (std::abs(v - mu) + std::abs(v) + std::abs(mu)) * rstd;
        // How far the other implementation's statistics move x̂ (0 with batch statistics).
        const double shift =
            rstd * b_mean[c] + std::abs(v - mu) * rstd * rstd * rstd / 2 * b_var[c];
        if (batch_statistics) {
          b.y[k] += two_gamma<Scalar>(2 * n + 8) * (gamma * a + beta);
          b.dx[k] += two_gamma<Scalar>(4 * n + 16) * rstd * (d * gamma + mean_g + 2 * a * mean_ga);
          b.dweight[c] += two_gamma<Scalar>(3 * n + 8) * d * a;
        } else {
          b.y[k] += two_gamma<Scalar>(8) * (gamma * a + beta) + gamma * shift;
          b.dx[k] += two_gamma<Scalar>(4) * d * gamma * rstd +
                     d * gamma * rstd * rstd * rstd / 2 * b_var[c];
          b.dweight[c] += two_gamma<Scalar>(n + 8) * d * a + d * shift;
        }
        b.dbias[c] += two_gamma<Scalar>(n) * d;
      }
  }
  return b;
}

/// The bounds of a training step's running statistics, from the previous ones and their bounds.
template <class Scalar>
void running_bounds(const std::vector<double>& x, index_t outer, index_t channels, index_t inner,
                    double momentum, const std::vector<double>& previous_mean,
                    const std::vector<double>& previous_var, std::vector<double>& b_mean,
                    std::vector<double>& b_var) {
  const index_t n = outer * inner;
  const double count = static_cast<double>(n), keep = 1 - momentum;
  for (index_t c = 0; c < channels; ++c) {
    double mu = 0, sum_abs = 0;
    for (index_t i = 0; i < outer; ++i)
      for (index_t l = 0; l < inner; ++l) mu += x[(i * channels + c) * inner + l] / count;
    double var_scale = 0;
    for (index_t i = 0; i < outer; ++i)
      for (index_t l = 0; l < inner; ++l) {
        const double v = x[(i * channels + c) * inner + l];
        sum_abs += std::abs(v);
        const double s = std::abs(v - mu) + std::abs(v) + std::abs(mu);
        var_scale += s * s / count;
      }
    b_mean[c] = keep * b_mean[c] + two_gamma<Scalar>(n + 4) * (keep * std::abs(previous_mean[c]) +
                                                               momentum * sum_abs / count);
    b_var[c] = keep * b_var[c] +
               two_gamma<Scalar>(2 * n + 12) *
                   (keep * std::abs(previous_var[c]) + momentum * count / (count - 1) * var_scale);
  }
}

/// Per-channel mean and biased variance of x, in double.
std::pair<std::vector<double>, std::vector<double>> batch_statistics(const std::vector<double>& x,
                                                                     index_t outer,
                                                                     index_t channels,
                                                                     index_t inner) {
  std::vector<double> mean(channels, 0.0), var(channels, 0.0);
  const double count = static_cast<double>(outer * inner);
  for (index_t c = 0; c < channels; ++c) {
    for (index_t i = 0; i < outer; ++i)
      for (index_t l = 0; l < inner; ++l) mean[c] += x[(i * channels + c) * inner + l] / count;
    for (index_t i = 0; i < outer; ++i)
      for (index_t l = 0; l < inner; ++l) {
        const double d = x[(i * channels + c) * inner + l] - mean[c];
        var[c] += d * d / count;
      }
  }
  return {mean, var};
}

template <class T>
std::vector<double> values_of(const T& tensor) {
  return {tensor.begin(), tensor.end()};
}

template <std::size_t Rank>
Tensor<double, Rank> bound_tensor(const Shape<Rank>& shape, const std::vector<double>& values) {
  return Tensor<double, Rank>(shape, values);
}

template <class Scalar, std::size_t Rank>
void check_fixture(const testing::Fixture& fixture) {
  const auto tensor = [&](const char* name) {
    return testing::tensor_from<Scalar, Rank>(fixture.tensor(name));
  };
  const auto vector = [&](const char* name) {
    return testing::tensor_from<Scalar, 1>(fixture.tensor(name));
  };
  const auto x1 = tensor("x1"), x2 = tensor("x2"), dy = tensor("dy");
  const double eps = std::stod(fixture.meta_str("eps"));
  const double momentum = std::stod(fixture.meta_str("momentum"));
  BatchNorm1d<Scalar> norm(x1.dim(1), {.eps = eps, .momentum = momentum});
  norm.set_weight(vector("weight").view());
  norm.set_bias(vector("bias").view());
  const index_t outer = x1.dim(0), channels = x1.dim(1), inner = Rank == 3 ? x1.dim(2) : 1;
  const auto weight = values_of(norm.weight()), bias = values_of(norm.bias());
  const auto v1 = values_of(x1), v2 = values_of(x2), vdy = values_of(dy);
  const std::vector<double> none(channels, 0.0);
  const auto within = [&](const auto& actual, const auto& expected,
                          const std::vector<double>& bound) {
    EXPECT_TENSOR_WITHIN(testing::to_double(actual), testing::to_double(expected),
                         bound_tensor(testing::to_double(actual).shape(), bound));
  };

  // Step 1: batch statistics of x1; the running statistics move from (0, 1).
  std::vector<double> b_mean(channels, 0.0), b_var(channels, 0.0);
  typename BatchNorm1d<Scalar>::Cache cache;
  const auto [mean1, var1] = batch_statistics(v1, outer, channels, inner);
  const auto step1 = channel_bounds<Scalar>(v1, vdy, outer, channels, inner, true, mean1, var1,
                                            none, none, weight, bias, eps);
  within(norm.forward(x1, cache), tensor("y1"), step1.y);
  running_bounds<Scalar>(v1, outer, channels, inner, momentum, none,
                         std::vector<double>(channels, 1.0), b_mean, b_var);
  within(norm.running_mean(), vector("running_mean1"), b_mean);
  within(norm.running_var(), vector("running_var1"), b_var);

  // Step 2 with its backward.
  const auto previous_mean = values_of(norm.running_mean());
  const auto previous_var = values_of(norm.running_var());
  const auto [mean2, var2] = batch_statistics(v2, outer, channels, inner);
  const auto step2 = channel_bounds<Scalar>(v2, vdy, outer, channels, inner, true, mean2, var2,
                                            none, none, weight, bias, eps);
  within(norm.forward(x2, cache), tensor("y2"), step2.y);
  within(norm.backward(x2, cache, dy), tensor("dx2"), step2.dx);
  within(norm.weight_grad(), vector("dweight2"), step2.dweight);
  within(norm.bias_grad(), vector("dbias2"), step2.dbias);
  running_bounds<Scalar>(v2, outer, channels, inner, momentum, previous_mean, previous_var, b_mean,
                         b_var);
  within(norm.running_mean(), vector("running_mean2"), b_mean);
  within(norm.running_var(), vector("running_var2"), b_var);
  EXPECT_EQ(norm.num_batches_tracked(), 2);

  // Evaluation on x2 with the running statistics, which may differ from torch's by (b_m, b_v).
  norm.set_training(false);
  norm.zero_grad();
  const auto eval =
      channel_bounds<Scalar>(v2, vdy, outer, channels, inner, false, values_of(norm.running_mean()),
                             values_of(norm.running_var()), b_mean, b_var, weight, bias, eps);
  within(norm.forward(x2), tensor("y_eval"), eval.y);
  typename BatchNorm1d<Scalar>::Cache eval_cache;
  within(norm.forward(x2, eval_cache), tensor("y_eval"), eval.y);
  within(norm.backward(x2, eval_cache, dy), tensor("dx_eval"), eval.dx);
  within(norm.weight_grad(), vector("dweight_eval"), eval.dweight);
  within(norm.bias_grad(), vector("dbias_eval"), eval.dbias);
}

TYPED_TEST(BatchNorm1dTyped, AgreeWithTorchNnBatchNorm1dTrainingThenEvaluation) {
  using Scalar = TypeParam;
  const auto check = [](const testing::Fixture& fixture) {
    if (fixture.tensor("x1").rank() == 2) {
      check_fixture<Scalar, 2>(fixture);
    } else {
      check_fixture<Scalar, 3>(fixture);
    }
  };
  EXPECT_EQ(testing::for_each_fixture<Scalar>("batch_norm", check), 3);
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(BatchNorm1dErrors, ImpossibleConstructionsNameTheField) {
  EXPECT_THROW_WITH(BatchNorm1d<float>(0), ConfigError, "BatchNorm1d: num_features must be > 0");
  EXPECT_THROW_WITH(BatchNorm1d<float>(3, {.eps = 0}), ConfigError,
                    "BatchNorm1d: eps must be finite and > 0");
  EXPECT_THROW_WITH(BatchNorm1d<float>(3, {.eps = NAN}), ConfigError, "eps");
  EXPECT_THROW_WITH(BatchNorm1d<float>(3, {.momentum = NAN}), ConfigError,
                    "BatchNorm1d: momentum must be in [0, 1] (got nan)");
  EXPECT_THROW_WITH(BatchNorm1d<float>(3, {.momentum = 1.5}), ConfigError,
                    "momentum must be in [0, 1] (got 1.5)");
  EXPECT_THROW_WITH(BatchNorm1d<float>(3, {.momentum = -0.1}), ConfigError, "momentum");
}

TEST(BatchNorm1dErrors, BadInputsAreShapeErrorsAndChangeNothing) {
  BatchNorm1d<double> norm(3);
  BatchNorm1d<double>::Cache cache;
  const auto before_mean = snapshot(norm.running_mean());
  // A batch of one in training: torch refuses it too (one value per channel has no variance).
  EXPECT_THROW_WITH(norm.forward(Tensor<double, 2>({1, 3}), cache), ShapeError,
                    "BatchNorm1d::forward: expected more than 1 value per channel when training, "
                    "got 1 (x: [1, 3])");
  EXPECT_THROW_WITH(norm.forward(Tensor<double, 3>({1, 3, 1})), ShapeError,
                    "more than 1 value per channel");
  EXPECT_THROW_WITH(norm.forward(Tensor<double, 2>({0, 3}), cache), ShapeError, "got 0");
  EXPECT_THROW_WITH(
      norm.forward(Tensor<double, 2>({4, 2}), cache), ShapeError,
      "BatchNorm1d::forward: input channels (axis 1) 2 != num_features 3 (x: [4, 2])");
  EXPECT_EQ(norm.num_batches_tracked(), 0);
  EXPECT_TENSOR_EQ(norm.running_mean(), before_mean);
  // In evaluation a single row is fine: the statistics are the running ones.
  norm.set_training(false);
  EXPECT_NO_THROW((void)norm.forward(Tensor<double, 2>({1, 3})));

  norm.set_training(true);
  const Tensor<double, 2> x({4, 3});
  (void)norm.forward(x, cache);
  EXPECT_THROW_WITH(norm.backward(x, cache, Tensor<double, 2>({4, 2})), ShapeError,
                    "BatchNorm1d::backward: dy has shape [4, 2] but x has shape [4, 3]");
  const Tensor<double, 2> other({5, 3});
  EXPECT_THROW_WITH(norm.backward(other, cache, other), ShapeError,
                    "BatchNorm1d::backward: the cache does not hold the statistics of x [5, 3]");
  for (double g : norm.weight_grad()) EXPECT_EQ(g, 0.0);
  EXPECT_THROW_WITH(norm.set_weight(Tensor<double, 1>({4}).view()), ShapeError, "weight");
}

}  // namespace test_batch_norm
}  // namespace dissect
