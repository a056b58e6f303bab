// Tests for dissect/batch_norm.hpp: hand-computed statistics and running averages (the unbiased
// running variance), the training/evaluation mode, PyTorch fixtures (nn.BatchNorm1d: two training
// steps then evaluation, [N, C] and [N, C, L]), finite differences in double in both modes, the
// module protocol, and every bad input with its type and message — each leaving the state alone.
#include "dissect/batch_norm.hpp"

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

template <class Scalar, std::size_t Rank>
void check_fixture(const testing::Fixture& fixture) {
  const auto tensor = [&](const char* name) {
    return testing::tensor_from<Scalar, Rank>(fixture.tensor(name));
  };
  const auto vector = [&](const char* name) {
    return testing::tensor_from<Scalar, 1>(fixture.tensor(name));
  };
  const auto x1 = tensor("x1"), x2 = tensor("x2"), dy = tensor("dy");
  BatchNorm1d<Scalar> norm(x1.dim(1), {.eps = std::stod(fixture.meta_str("eps")),
                                       .momentum = std::stod(fixture.meta_str("momentum"))});
  norm.set_weight(vector("weight").view());
  norm.set_bias(vector("bias").view());
  // Statistics and outputs run in double here; torch rounds each step to the dtype. A channel's
  // n values give y within a few ulps of the output's scale for float: |x̂·γ| + |β| ≤ (√n + 1)·
  // max|γ, β| bounds it, and the tolerance is c·u·that scale with c = 16 + n (n-long sums in
  // torch). In double both are within a few ulps of exact.
  const index_t count = x1.size() / x1.dim(1);
  const double u = testing::unit_roundoff<Scalar>();
  const double tolerance = (16.0 + static_cast<double>(count)) * u;
  const auto near = [&](const auto& actual, const auto& expected, double scale) {
    EXPECT_TENSOR_NEAR(actual, expected, tolerance, tolerance * scale);
  };
  double param_scale = 0;
  for (index_t c = 0; c < x1.dim(1); ++c) {
    param_scale = std::max({param_scale, std::abs(static_cast<double>(norm.weight()(c))),
                            std::abs(static_cast<double>(norm.bias()(c)))});
  }
  const double y_scale = (std::sqrt(static_cast<double>(count)) + 1) * param_scale;

  typename BatchNorm1d<Scalar>::Cache cache;
  near(norm.forward(x1, cache), tensor("y1"), y_scale);
  near(norm.running_mean(), vector("running_mean1"), 4);
  near(norm.running_var(), vector("running_var1"), 8);
  const auto y2 = norm.forward(x2, cache);
  near(y2, tensor("y2"), y_scale);
  const double dy_scale = count * param_scale * 4;  // Σ|dy| over a channel, |dy| < 4 (randn)
  near(norm.backward(x2, cache, dy), tensor("dx2"), dy_scale);
  near(norm.weight_grad(), vector("dweight2"), dy_scale);
  near(norm.bias_grad(), vector("dbias2"), dy_scale);
  near(norm.running_mean(), vector("running_mean2"), 4);
  near(norm.running_var(), vector("running_var2"), 8);
  EXPECT_EQ(norm.num_batches_tracked(), 2);

  norm.set_training(false);
  norm.zero_grad();
  const double eval_scale = 16 * param_scale;  // x2 ≈ −3 ± 2 over running σ ≈ 1
  near(norm.forward(x2), tensor("y_eval"), eval_scale);
  typename BatchNorm1d<Scalar>::Cache eval_cache;
  near(norm.forward(x2, eval_cache), tensor("y_eval"), eval_scale);
  near(norm.backward(x2, eval_cache, dy), tensor("dx_eval"), dy_scale);
  near(norm.weight_grad(), vector("dweight_eval"), dy_scale * 8);
  near(norm.bias_grad(), vector("dbias_eval"), dy_scale);
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
