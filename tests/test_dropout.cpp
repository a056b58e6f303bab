// Tests for dissect/layers/dropout.hpp: the mode (evaluation and p = 0 are the identity), seeded
// masks (the same seed, the same masks; the kept fraction near 1 − p), backward with the forward's
// mask, p = 1 and NaN as torch, PyTorch fixtures (F.dropout's own mask replayed through
// forward_masked, y and dx bit for bit), finite differences with a fixed mask, a place in
// Sequential, and every bad input with its type and message, leaving the cache alone.
#include "dissect/layers/dropout.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/sequential.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_dropout {

using testing::random_tensor;

TEST(Dropout, IsAModalModuleWithoutParametersTrainingByDefault) {
  Dropout<float> dropout(0.25, {.seed = 3});
  static_assert(Module<Dropout<float>>);
  static_assert(ModalLayer<Dropout<float>>);
  EXPECT_TRUE(dropout.training());
  EXPECT_EQ(dropout.parameter_count(), 0);
  EXPECT_TRUE(parameter_names(dropout).empty());
  EXPECT_EQ(dropout.p(), 0.25);
  EXPECT_EQ(dropout.seed(), 3u);
  EXPECT_EQ(dropout.scale(), 1.0f / 0.75f);
  EXPECT_EQ(Dropout<double>().p(), 0.5);  // nn.Dropout's default
  std::ostringstream printed;
  printed << dropout;
  EXPECT_EQ(printed.str(), "Dropout(p=0.25)");
  dropout.set_training(false);
  EXPECT_FALSE(dropout.training());
}

TEST(Dropout, EvaluationAndPZeroAreTheIdentity) {
  std::mt19937_64 engine(1);
  const auto x = random_tensor<double, 3>({2, 3, 4}, engine);
  const auto dy = random_tensor<double, 3>({2, 3, 4}, engine);
  Dropout<double> dropout(0.5, {.seed = 1});
  dropout.set_training(false);
  Dropout<double>::Cache cache;
  EXPECT_TENSOR_EQ(dropout.forward(x), x);
  EXPECT_TENSOR_EQ(dropout.forward(x, cache), x);
  EXPECT_FALSE(cache.masked);
  EXPECT_EQ(cache.draws, 0u);  // evaluation draws nothing
  EXPECT_TENSOR_EQ(dropout.backward(x, cache, dy), dy);
  Dropout<double> none(0.0, {.seed = 1});  // training, but nothing to drop
  EXPECT_TENSOR_EQ(none.forward(x), x);
  EXPECT_TENSOR_EQ(none.forward(x, cache), x);
  EXPECT_TENSOR_EQ(none.backward(x, cache, dy), dy);
}

TEST(Dropout, MasksAreInvertedAndBackwardUsesTheForwardsMask) {
  std::mt19937_64 engine(2);
  const auto x = random_tensor<float, 2>({16, 32}, engine);
  const auto dy = random_tensor<float, 2>({16, 32}, engine);
  for (const double p : {0.1, 0.3, 0.5, 0.9}) {
    SCOPED_TRACE(p);
    Dropout<float> dropout(p, {.seed = 11});
    Dropout<float>::Cache cache;
    const auto y = dropout.forward(x, cache);
    ASSERT_TRUE(cache.masked);
    const float scale = 1.0f / static_cast<float>(1.0 - p);  // torch's noise.div_(1 − p)
    // A second forward draws a new mask into the same cache: backward must use the latest.
    const auto y2 = dropout.forward(x, cache);
    const auto dx = dropout.backward(x, cache, dy);
    int differ = 0;
    for (index_t i = 0; i < x.size(); ++i) {
      const float m = cache.mask.data()[i];
      ASSERT_TRUE(m == 0.0f || m == scale) << m;
      EXPECT_EQ(y2.data()[i], x.data()[i] * m);
      EXPECT_EQ(dx.data()[i], dy.data()[i] * m);
      differ += (y.data()[i] == 0.0f) != (y2.data()[i] == 0.0f);
    }
    EXPECT_GT(differ, 0);  // two draws, two masks
  }
}

TEST(Dropout, TheSameSeedGivesTheSameMasksAndTheDrawCountSelectsThem) {
  const Tensor<double, 2> x = [] {
    Tensor<double, 2> ones({8, 64});
    ones.fill(1.0);
    return ones;
  }();
  Dropout<double> a(0.4, {.seed = 42}), b(0.4, {.seed = 42}), c(0.4, {.seed = 43});
  Dropout<double>::Cache ca, cb, cc;
  for (int draw = 0; draw < 3; ++draw) {
    const auto ya = a.forward(x, ca);
    EXPECT_TENSOR_EQ(b.forward(x, cb), ya);
    const auto yc = c.forward(x, cc);
    bool same = true;
    for (index_t i = 0; i < x.size(); ++i) same = same && ya.data()[i] == yc.data()[i];
    EXPECT_FALSE(same) << "another seed, another mask";
  }
  EXPECT_EQ(ca.draws, 3u);
  // Mask k depends on the seed and k alone: a fresh cache set to draw 2 replays the third mask.
  Dropout<double>::Cache replay;
  replay.draws = 2;
  (void)a.forward(x, replay);
  EXPECT_TENSOR_EQ(replay.mask, ca.mask);
  // manual_seed fixes the default seeds, as torch.manual_seed.
  manual_seed(7);
  Dropout<double> d(0.4);
  manual_seed(7);
  Dropout<double> e(0.4);
  EXPECT_EQ(d.seed(), e.seed());
}

TEST(Dropout, KeptFractionIsNearOneMinusP) {
  // n Bernoulli(1 − p) draws: the kept count is within 5 standard deviations of n(1 − p).
  Tensor<float, 1> x({40000});
  x.fill(1.0f);
  for (const double p : {0.05, 0.2, 0.5, 0.8, 0.99}) {
    Dropout<float> dropout(p, {.seed = 5});
    Dropout<float>::Cache cache;
    const auto y = dropout.forward(x, cache);
    double kept = 0;
    for (float v : y) kept += v != 0.0f;
    const double n = static_cast<double>(x.size());
    EXPECT_NEAR(kept, n * (1 - p), 5 * std::sqrt(n * p * (1 - p))) << "p = " << p;
  }
}

TEST(Dropout, POneDropsEverythingAndNaNPropagatesAsTorch) {
  // torch: p = 1 is x·0 (so ∞·0 = NaN), and a dropped NaN or ∞ is NaN: dropping multiplies.
  constexpr double inf = std::numeric_limits<double>::infinity();
  const Tensor<double, 1> x({4}, {1.0, -2.0, inf, NAN});
  Dropout<double> all(1.0, {.seed = 1});
  Dropout<double>::Cache cache;
  const auto y = all.forward(x, cache);
  EXPECT_EQ(y(0), 0.0);
  EXPECT_EQ(y(1), 0.0);
  EXPECT_TRUE(std::isnan(y(2)));
  EXPECT_TRUE(std::isnan(y(3)));
  const auto dx = all.backward(x, cache, Tensor<double, 1>({4}, {1, 2, 3, 4}));
  for (double g : dx) EXPECT_EQ(g, 0.0);
  const auto masked = all.forward_masked(x, Tensor<double, 1>({4}, {1, 1, 0, 1}), cache);
  EXPECT_EQ(masked(0), 0.0);  // kept, but p = 1 keeps nothing (never 1·∞)
  EXPECT_TRUE(std::isnan(masked(2)));
  // p = 0.5 with a fixed mask: kept values ×2, a dropped ∞ is NaN, a kept NaN is NaN.
  Dropout<double> half(0.5, {.seed = 1});
  const auto z = half.forward_masked(x, Tensor<double, 1>({4}, {1, 0, 0, 1}), cache);
  EXPECT_EQ(z(0), 2.0);
  EXPECT_EQ(z(1), -0.0);
  EXPECT_TRUE(std::isnan(z(2)));
  EXPECT_TRUE(std::isnan(z(3)));
  const auto dz = half.backward(x, cache, Tensor<double, 1>({4}, {1, inf, 1, 1}));
  EXPECT_EQ(dz(0), 2.0);
  EXPECT_TRUE(std::isnan(dz(1)));  // ∞·0
  EXPECT_EQ(dz(3), 2.0);
}

TEST(Dropout, TrainsInsideSequential) {
  // Linear → ReLU → Dropout: the container keeps Dropout's Cache, so backward sees the mask.
  Sequential<Linear<double>, ReLU, Dropout<double>> net(Linear<double>(4, 6, {.seed = 1}), ReLU{},
                                                        Dropout<double>(0.5, {.seed = 2}));
  std::mt19937_64 engine(3);
  const auto x = random_tensor<double, 2>({5, 4}, engine);
  decltype(net)::Cache<2> cache;
  const auto y = net.forward(x, cache);
  int zeros = 0;
  for (double v : y) zeros += v == 0.0;
  EXPECT_GT(zeros, 0);
  const auto dx = net.backward(x, cache, y);
  EXPECT_EQ(dx.shape(), x.shape());
}

// ---- finite differences -------------------------------------------------------------------------

TEST(DropoutGradients, MatchFiniteDifferencesWithAFixedMask) {
  // With the mask fixed, y = x ⊙ m is linear in x: dx = dy ⊙ m exactly.
  std::mt19937_64 engine(17);
  for (int trial = 0; trial < testing::sweep_trials(20); ++trial) {
    const Shape<2> shape{1 + static_cast<index_t>(engine() % 5),
                         1 + static_cast<index_t>(engine() % 7)};
    const double p = 0.1 + 0.8 * static_cast<double>(engine() % 100) / 100;
    Dropout<double> dropout(p, {.seed = engine()});
    auto x = random_tensor<double, 2>(shape, engine);
    const auto dy = random_tensor<double, 2>(shape, engine);
    Tensor<double, 2> keep(shape);
    for (double& k : keep) k = static_cast<double>(engine() % 2);
    Dropout<double>::Cache cache;
    (void)dropout.forward_masked(x, keep, cache);
    const auto dx = dropout.backward(x, cache, dy);
    const auto loss = [&] {
      Dropout<double>::Cache scratch;
      const auto y = dropout.forward_masked(x, keep, scratch);
      double total = 0;
      for (index_t i = 0; i < y.size(); ++i) total += dy.data()[i] * y.data()[i];
      return total;
    };
    ASSERT_GRADIENT_OK(testing::gradcheck(loss, x, dx));
  }
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

template <class Scalar>
class DropoutTyped : public ::testing::Test {};
TYPED_TEST_SUITE(DropoutTyped, testing::FloatAndDouble);

template <class Scalar, std::size_t Rank>
void check_fixture(const testing::Fixture& fixture) {
  const auto tensor = [&](const char* name) {
    return testing::tensor_from<Scalar, Rank>(fixture.tensor(name));
  };
  const Dropout<Scalar> dropout(std::stod(fixture.meta_str("p")), {.seed = 0});
  typename Dropout<Scalar>::Cache cache;
  const auto x = tensor("x");
  // One multiplication each, by the same rounded scale: bit for bit, in float32 too.
  EXPECT_TENSOR_EQ(dropout.forward_masked(x, tensor("keep"), cache), tensor("y"));
  EXPECT_TENSOR_EQ(dropout.backward(x, cache, tensor("dy")), tensor("dx"));
}

TYPED_TEST(DropoutTyped, AgreesBitForBitWithTorchsFDropoutUnderItsOwnMask) {
  using Scalar = TypeParam;
  const auto check = [](const testing::Fixture& fixture) {
    switch (fixture.tensor("x").rank()) {
      case 1:
        return check_fixture<Scalar, 1>(fixture);
      case 2:
        return check_fixture<Scalar, 2>(fixture);
      default:
        return check_fixture<Scalar, 3>(fixture);
    }
  };
  EXPECT_EQ(testing::for_each_fixture<Scalar>("dropout", check), 4);
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(DropoutErrors, ProbabilitiesOutsideZeroToOneAreRefused) {
  EXPECT_THROW_WITH(Dropout<float>(-0.1), ConfigError, "Dropout: p must be in [0, 1] (got -0.1)");
  EXPECT_THROW_WITH(Dropout<float>(1.5), ConfigError, "Dropout: p must be in [0, 1] (got 1.5)");
  EXPECT_THROW_WITH(Dropout<float>(NAN), ConfigError, "Dropout: p must be in [0, 1] (got nan)");
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THROW_WITH((void)Dropout<float>(inf), ConfigError, "(got inf)");
  EXPECT_NO_THROW(Dropout<float>(1.0));  // torch accepts p = 1: everything dropped
  EXPECT_NO_THROW(Dropout<float>(0.0));
}

TEST(DropoutErrors, BadCallsNameTheOpAndShapesAndChangeNothing) {
  Dropout<double> dropout(0.5, {.seed = 9});
  const Tensor<double, 2> x({3, 4});
  EXPECT_THROW_WITH(dropout.forward(x), Error,
                    "Dropout::forward: in training mode (p = 0.5) the mask must be kept for "
                    "backward: call forward(x, cache), or set_training(false) for inference "
                    "(x: [3, 4])");
  Dropout<double>::Cache cache;
  (void)dropout.forward(x, cache);
  const auto mask = testing::snapshot(cache.mask);
  EXPECT_THROW_WITH(dropout.forward_masked(x, Tensor<double, 2>({4, 3}), cache), ShapeError,
                    "Dropout::forward_masked: keep has shape [4, 3] but x has shape [3, 4]");
  Tensor<double, 2> keep({3, 4});
  keep(1, 2) = 0.5;
  EXPECT_THROW_WITH(dropout.forward_masked(x, keep, cache), Error,
                    "Dropout::forward_masked: keep[6] = 0.5 is neither 0 nor 1 (keep: [3, 4])");
  EXPECT_TENSOR_EQ(cache.mask, mask);
  EXPECT_EQ(cache.draws, 1u);
  EXPECT_THROW_WITH(dropout.backward(x, cache, Tensor<double, 2>({3, 5})), ShapeError,
                    "Dropout::backward: dy has shape [3, 5] but x has shape [3, 4]");
  const Tensor<double, 2> other({2, 4});
  EXPECT_THROW_WITH(dropout.backward(other, cache, other), ShapeError,
                    "Dropout::backward: the cache does not hold the mask of x [2, 4] (fill it "
                    "with forward(x, cache))");
  const Tensor<double, 3> reshaped({3, 2, 2});  // as many elements, another shape
  EXPECT_THROW_WITH(dropout.backward(reshaped, cache, reshaped), ShapeError, "x [3, 2, 2]");
}

}  // namespace test_dropout
}  // namespace dissect
