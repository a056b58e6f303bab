// Tests of BitNet b1.58's BitLinear (dissect/layers/bit_linear.hpp), its quantisers
// (quant/bitnet.hpp), Linear's bitlinear mode and use_bitlinear (transforms/bitlinear.hpp): forward
// and every gradient against PyTorch fixtures written from the reference's formulas
// (tests/reference, block "bitlinear"), in float and double; the straight-through estimator as an
// algebraic identity (the gradient is exactly that of the product with the quantised values held
// fixed) and by finite differences of that surrogate in double; the quantisers' properties (levels,
// ties to even, idempotence, scale invariance); the degenerate and non-finite inputs
// (docs/reliability.md row 82); the errors (rows 81 and 83); and a tiny LLaMA trained with ternary
// weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dissect/blocks/gated_feed_forward.hpp"
#include "dissect/layers/bit_linear.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/quant/bitnet.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/training/loss.hpp"
#include "dissect/training/optim.hpp"
#include "dissect/transforms/bitlinear.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_bit_linear {

using testing::random_ids;
using testing::random_tensor;

template <class Scalar>
class BitLinearTyped : public ::testing::Test {};
TYPED_TEST_SUITE(BitLinearTyped, testing::FloatAndDouble);

/// A fixture tensor as a [numel / cols, cols] matrix (leading axes folded, as the layer folds).
template <class Scalar>
Tensor<Scalar, 2> rows_of(const testing::FixtureTensor& t, index_t cols) {
  const index_t count = static_cast<index_t>(t.values.size());
  return Tensor<Scalar, 2>({count / cols, cols},
                           std::vector<Scalar>(t.values.begin(), t.values.end()));
}

/// Q(x) of every row (a fresh matrix).
template <class Scalar>
Tensor<Scalar, 2> fake_quantized_rows(const Tensor<Scalar, 2>& x) {
  Tensor<Scalar, 2> out(x.shape());
  int8_fake_quantize_rows<Scalar>(x.matrix(), out.matrix());
  return out;
}
template <class Scalar>
Tensor<Scalar, 2> fake_quantized_weight(ConstTensorView<Scalar, 2> w) {
  Tensor<Scalar, 2> out(w.shape());
  ternary_fake_quantize<Scalar>(w.matrix(), out.matrix());
  return out;
}

// ---- against PyTorch ----------------------------------------------------------------------------

// The fixtures are drawn so that no value of either dtype lies within 1e-3 of a level of a
// rounding tie (generate_fixtures.py, bitlinear_draw): every level here must equal torch's
// exactly. What is left is rounding: in double, of the norm, γ, β and a K ≤ 40 reduction, far
// below 1e-12 of the largest value; in float, torch rounds the norm's steps to float32 where
// dissect rounds once (a few ulps of x̂, hence of β and Q(x̂)), sums mean|W| in another order (an
// ulp of γ) and reduces K ≤ 40 products in another order: each ≤ (K + 8)·u ≈ 3e-6 of the largest
// magnitude, which 2e-5 bounds with room.
template <class Scalar>
void expect_matches_torch(const testing::Fixture& f) {
  const index_t in = f.meta_int("in_features"), out = f.meta_int("out_features");
  const bool norm = f.meta_bool("norm"), bias = f.meta_bool("bias");
  const double eps = std::stod(f.meta_str("eps"));
  const double tol = std::is_same_v<Scalar, float> ? 2e-5 : 1e-12;

  auto weight = rows_of<Scalar>(f.tensor("W"), in);
  std::optional<Tensor<Scalar, 1>> b;
  if (bias) b = testing::tensor_from<Scalar, 1>(f.tensor("b"));
  BitLinear<Scalar> layer(weight, b, {.norm = norm, .norm_eps = eps, .bias = bias});
  if (norm) layer.norm().set_weight(testing::tensor_from<Scalar, 1>(f.tensor("norm_weight")));
  const auto x = rows_of<Scalar>(f.tensor("x"), in);
  const auto dy = rows_of<Scalar>(f.tensor("dy"), out);

  // The deployment view: W̃ and γ.
  const auto levels = layer.ternary_weight();
  const auto& w_levels = f.tensor("W_levels").values;
  for (index_t i = 0; i < levels.size(); ++i) {
    ASSERT_EQ(levels.data()[i], static_cast<std::int8_t>(w_levels[static_cast<std::size_t>(i)]))
        << "W level " << i;
  }
  const double gamma = f.tensor("gamma").values[0];
  EXPECT_NEAR(layer.weight_scale(), gamma, (std::is_same_v<Scalar, float> ? 2e-7 : 1e-15) * gamma);

  typename BitLinear<Scalar>::Cache cache;
  const auto y = layer.forward(x, cache);
  EXPECT_TENSOR_EQ(layer.forward(x), y);  // the inference forward is the training one
  // x̃ of x̂, the norm's output the Linear received.
  LevelMatrix x_levels(x.dim(0), in);
  int8_levels_rows<Scalar>(cache.normed.matrix(), x_levels);
  const auto& expected_x_levels = f.tensor("x_levels").values;
  for (index_t i = 0; i < x_levels.size(); ++i) {
    ASSERT_EQ(x_levels.data()[i],
              static_cast<std::int8_t>(expected_x_levels[static_cast<std::size_t>(i)]))
        << "x level " << i;
  }

  const auto close = [&](const auto& actual, const testing::FixtureTensor& expected, index_t cols) {
    const auto reference = rows_of<double>(expected, cols);
    const double scale = std::max(1.0, reference.matrix().cwiseAbs().maxCoeff());
    EXPECT_TENSOR_NEAR(testing::to_double(actual), reference, 0.0, tol * scale);
  };
  close(y, f.tensor("y"), out);
  layer.zero_grad();
  const auto dx = layer.backward(x, cache, dy);
  close(dx, f.tensor("dx"), in);
  close(layer.weight_grad(), f.tensor("dW"), in);
  if (bias) close(layer.bias_grad().reshape(Shape<2>{1, out}), f.tensor("db"), out);
  if (norm) {
    close(layer.norm().weight_grad().reshape(Shape<2>{1, in}), f.tensor("dnorm_weight"), in);
  }
}

TYPED_TEST(BitLinearTyped, MatchesTorchForwardAndGradients) {
  EXPECT_EQ(testing::for_each_fixture<TypeParam>("bitlinear", expect_matches_torch<TypeParam>), 7);
}

// ---- the straight-through estimator -------------------------------------------------------------

// The surrogate x̂ + (Q(x̂) − x̂).detach() times (W + (Q(W) − W).detach())ᵀ has the value Q(x̂)·Q(W)ᵀ
// and the Jacobian of the bilinear product with Q(x̂) and Q(W) as fixed operands: the bitlinear
// layer's backward is exactly a float Linear's backward on those operands, bit for bit (the same
// kernels on the same numbers).
TYPED_TEST(BitLinearTyped, GradientIsThatOfTheProductWithQuantisedValuesFixed) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(5);
  Linear<Scalar> layer(random_tensor<Scalar, 2>({9, 13}, engine),
                       random_tensor<Scalar, 1>({9}, engine));
  layer.set_bitlinear(true);
  const auto x = random_tensor<Scalar, 2>({6, 13}, engine);
  const auto dy = random_tensor<Scalar, 2>({6, 9}, engine);

  const auto qx = fake_quantized_rows(x);
  Linear<Scalar> fixed(fake_quantized_weight<Scalar>(layer.weight()),
                       Tensor<Scalar, 1>(layer.bias()));
  EXPECT_TENSOR_EQ(layer.forward(x), fixed.forward(qx));
  const auto dx = layer.backward(x, dy);
  const auto dx_fixed = fixed.backward(qx, dy);
  EXPECT_TENSOR_EQ(dx, dx_fixed);
  EXPECT_TENSOR_EQ(layer.weight_grad(), fixed.weight_grad());
  EXPECT_TENSOR_EQ(layer.bias_grad(), fixed.bias_grad());

  // backward_parameters: the same dW and db, no dx.
  layer.zero_grad();
  layer.backward_parameters(x, dy);
  EXPECT_TENSOR_EQ(layer.weight_grad(), fixed.weight_grad());
  // Frozen: dx only, still through Q(W).
  layer.set_frozen(true);
  EXPECT_TENSOR_EQ(layer.backward(x, dy), dx_fixed);
}

// Finite differences of the surrogate, written by hand in double with its corrections
// c_x = Q(x̂₀) − x̂₀ and c_W = Q(W₀) − W₀ frozen at the point of evaluation, against the layer's
// backward through its RMSNorm: dx, dW, db and the norm's weight.
TEST(BitLinear, GradientsMatchFiniteDifferencesOfTheSurrogate) {
  std::mt19937_64 engine(7);
  const index_t in = 11, out = 5, tokens = 4;
  const double eps = 1e-6;
  BitLinear<double> layer(random_tensor<double, 2>({out, in}, engine),
                          random_tensor<double, 1>({out}, engine),
                          {.norm = true, .norm_eps = eps, .bias = true});
  auto g = random_tensor<double, 1>({in}, engine);
  for (index_t i = 0; i < in; ++i) g.data()[i] += 1.5;
  layer.norm().set_weight(g);
  auto x = random_tensor<double, 3>({2, tokens / 2, in}, engine);
  const auto dy = random_tensor<double, 3>({2, tokens / 2, out}, engine);

  const auto rms = [&](const Tensor<double, 3>& input, ConstTensorView<double, 1> gain) {
    RowMatrix<double> normed = input.cview().reshape(Shape<2>{-1, in}).matrix();
    for (index_t r = 0; r < normed.rows(); ++r) {
      const double inv = 1.0 / std::sqrt(normed.row(r).squaredNorm() / in + eps);
      normed.row(r) = (normed.row(r) * inv).cwiseProduct(gain.vector().transpose());
    }
    return normed;
  };
  const RowMatrix<double> normed0 = rms(x, layer.norm().weight());
  Tensor<double, 2> normed0_tensor({tokens, in});
  normed0_tensor.matrix() = normed0;
  const RowMatrix<double> c_x = fake_quantized_rows(normed0_tensor).matrix() - normed0;
  const RowMatrix<double> c_w =
      fake_quantized_weight<double>(layer.weight()).matrix() - layer.weight().matrix();
  const auto surrogate = [&] {
    const RowMatrix<double> xq = rms(x, layer.norm().weight()) + c_x;
    const RowMatrix<double> wq = layer.weight().matrix() + c_w;
    RowMatrix<double> y = xq * wq.transpose();
    y.rowwise() += layer.bias().vector().transpose();
    return y;
  };
  const auto loss = [&] {
    return (surrogate().array() * dy.cview().reshape(Shape<2>{-1, out}).matrix().array()).sum();
  };

  // At the point itself the surrogate is the forward.
  BitLinear<double>::Cache cache;
  const auto y = layer.forward(x, cache);
  Tensor<double, 2> y_surrogate({tokens, out});
  y_surrogate.matrix() = surrogate();
  EXPECT_TENSOR_NEAR(y.cview().reshape(Shape<2>{-1, out}), y_surrogate, 0.0, 1e-13);

  layer.zero_grad();
  const auto dx = layer.backward(x, cache, dy);
  EXPECT_GRADIENT_OK(testing::gradcheck(loss, x, dx));
  EXPECT_GRADIENT_OK(
      testing::gradcheck(loss, layer.weight(), testing::snapshot(layer.weight_grad())));
  EXPECT_GRADIENT_OK(testing::gradcheck(loss, layer.bias(), testing::snapshot(layer.bias_grad())));
  EXPECT_GRADIENT_OK(testing::gradcheck(loss, layer.norm().weight(),
                                        testing::snapshot(layer.norm().weight_grad())));
}

// ---- the quantisers -----------------------------------------------------------------------------

TYPED_TEST(BitLinearTyped, QuantiserLevelsAreTernaryAndInt8AndIdempotent) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(11);
  auto w = random_tensor<Scalar, 2>({7, 19}, engine);
  auto x = random_tensor<Scalar, 2>({5, 19}, engine);
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] *= Scalar(30);

  const Scalar gamma = ternary_scale<Scalar>(w.matrix());
  LevelMatrix w_levels(7, 19), x_levels(5, 19);
  ternary_levels<Scalar>(w.matrix(), gamma, w_levels);
  int8_levels_rows<Scalar>(x.matrix(), x_levels);
  bool all_levels_used = true;
  for (int level : {-1, 0, 1}) {
    all_levels_used = all_levels_used && (w_levels.array() == std::int8_t(level)).any();
  }
  EXPECT_TRUE(all_levels_used);
  EXPECT_TRUE((w_levels.array() >= -1 && w_levels.array() <= 1).all());
  EXPECT_TRUE((x_levels.array() >= -127).all());  // |x·127/β| ≤ 127: −128 is never reached
  for (index_t r = 0; r < 5; ++r) {               // each token's largest magnitude maps to ±127
    EXPECT_EQ(x_levels.row(r).cast<int>().cwiseAbs().maxCoeff(), 127);
  }

  // Q(W) = W̃·γ and Q(x) = x̃·β/127, each up to the rounding of one division (the reference
  // divides by its s = 1/γ, 127/β; the levels are exact small integers).
  const auto qw = fake_quantized_weight<Scalar>(w.view());
  const auto qx = fake_quantized_rows(x);
  const double u = std::numeric_limits<Scalar>::epsilon();
  for (index_t i = 0; i < w.size(); ++i) {
    EXPECT_NEAR(qw.data()[i], w_levels.data()[i] * double(gamma), 2 * u * gamma);
  }
  for (index_t r = 0; r < 5; ++r) {
    const double beta = x.matrix().row(r).cwiseAbs().maxCoeff();
    for (index_t j = 0; j < 19; ++j) {
      EXPECT_NEAR(qx.matrix()(r, j), x_levels(r, j) * beta / 127, 4 * u * beta);
    }
  }

  // Idempotent levels: quantising Q(W) or Q(x) again gives the same levels (and Q(x) itself).
  LevelMatrix again_w(7, 19), again_x(5, 19);
  ternary_levels<Scalar>(qw.matrix(), ternary_scale<Scalar>(qw.matrix()), again_w);
  int8_levels_rows<Scalar>(qx.matrix(), again_x);
  EXPECT_EQ(again_w, w_levels);
  EXPECT_EQ(again_x, x_levels);
  EXPECT_TENSOR_NEAR(fake_quantized_rows(qx), qx, 4 * u, 0.0);

  // Scale invariance: 2·W has the levels of W and twice its γ, exactly.
  auto w2 = w;
  w2.matrix() *= Scalar(2);
  LevelMatrix levels2(7, 19);
  ternary_levels<Scalar>(w2.matrix(), ternary_scale<Scalar>(w2.matrix()), levels2);
  EXPECT_EQ(levels2, w_levels);
  EXPECT_EQ(ternary_scale<Scalar>(w2.matrix()), 2 * gamma);
}

TYPED_TEST(BitLinearTyped, RoundsHalfToEven) {
  using Scalar = TypeParam;
  // mean|W| = 2, so W/γ = 0.5 and 1.5: torch.round gives 0 and 2 (then clamped to 1), where
  // rounding half away from zero would give 1 and 1.
  Tensor<Scalar, 2> w({1, 4}, {Scalar(1), Scalar(3), Scalar(-1), Scalar(-3)});
  LevelMatrix levels(1, 4);
  ternary_levels<Scalar>(w.matrix(), ternary_scale<Scalar>(w.matrix()), levels);
  EXPECT_EQ(levels.cast<int>(), (Eigen::RowVector4i() << 0, 1, 0, -1).finished());
  // β = 127, so x·127/β = x: 2.5 → 2, 3.5 → 4, −2.5 → −2, 0.5 → 0.
  Tensor<Scalar, 2> x({1, 5}, {Scalar(127), Scalar(2.5), Scalar(3.5), Scalar(-2.5), Scalar(0.5)});
  LevelMatrix x_levels(1, 5);
  int8_levels_rows<Scalar>(x.matrix(), x_levels);
  EXPECT_EQ(x_levels.cast<int>(), (Eigen::Matrix<int, 1, 5>() << 127, 2, 4, -2, 0).finished());
}

// ---- degenerate and non-finite inputs (docs/reliability.md row 82) ------------------------------

TYPED_TEST(BitLinearTyped, AllZeroWeightGivesTheBiasNotNaN) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(13);
  const auto bias = random_tensor<Scalar, 1>({4}, engine);
  for (const bool norm : {false, true}) {
    SCOPED_TRACE(norm);
    BitLinear<Scalar> layer(Tensor<Scalar, 2>({4, 6}), bias, {.norm = norm, .bias = true});
    EXPECT_EQ(layer.weight_scale(), static_cast<Scalar>(1e-5));  // γ = 0 clamps to the floor
    EXPECT_TRUE((layer.ternary_weight().array() == 0).all());
    const auto x = random_tensor<Scalar, 2>({3, 6}, engine);
    const auto dy = random_tensor<Scalar, 2>({3, 4}, engine);
    typename BitLinear<Scalar>::Cache cache;
    const auto y = layer.forward(x, cache);
    for (index_t r = 0; r < 3; ++r) {
      for (index_t j = 0; j < 4; ++j) EXPECT_EQ(y.matrix()(r, j), bias.data()[j]);
    }
    layer.zero_grad();
    const auto dx = layer.backward(x, cache, dy);
    EXPECT_TRUE((dx.matrix().array() == 0).all());  // dx̂ = dy·Q(W) = 0
    // ... but W can leave zero: dW = dyᵀ·Q(x̂) is not zero.
    EXPECT_GT(layer.weight_grad().matrix().cwiseAbs().maxCoeff(), 0);
    EXPECT_TRUE(layer.weight_grad().matrix().allFinite());
  }
}

TYPED_TEST(BitLinearTyped, ZeroTokenGivesTheBias) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(17);
  for (const bool norm : {false, true}) {
    BitLinear<Scalar> layer(random_tensor<Scalar, 2>({3, 5}, engine),
                            random_tensor<Scalar, 1>({3}, engine), {.norm = norm, .bias = true});
    const Tensor<Scalar, 2> x({1, 5});
    const auto y = layer.forward(x);
    for (index_t j = 0; j < 3; ++j) EXPECT_EQ(y.data()[j], layer.bias().data()[j]);
  }
}

TYPED_TEST(BitLinearTyped, NonFiniteTokenPoisonsOnlyItsOwnRow) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(19);
  BitLinear<Scalar> layer(7, 4, {.norm = false, .seed = 2});
  auto x = random_tensor<Scalar, 2>({3, 7}, engine);
  const auto clean = layer.forward(x);
  for (const Scalar bad :
       {std::numeric_limits<Scalar>::quiet_NaN(), std::numeric_limits<Scalar>::infinity()}) {
    SCOPED_TRACE(bad);
    auto poisoned = x;
    poisoned.matrix()(1, 3) = bad;
    const auto y = layer.forward(poisoned);
    EXPECT_TRUE(y.matrix().row(1).array().isNaN().all());
    EXPECT_EQ(y.matrix().row(0), clean.matrix().row(0));
    EXPECT_EQ(y.matrix().row(2), clean.matrix().row(2));
  }
}

// ---- errors (docs/reliability.md rows 81 and 83) ------------------------------------------------

TEST(BitLinear, ShapeErrorsNameTheOpAndShapes) {
  BitLinear<float> layer(8, 4, {.seed = 1});
  const Tensor<float, 2> x({2, 5});
  EXPECT_THROW_WITH(layer.forward(x), ShapeError,
                    "BitLinear::forward: input last dim 5 != in_features 8 (x: [2, 5], weight: "
                    "[4, 8])");
  BitLinear<float>::Cache cache;
  const Tensor<float, 2> good({2, 8});
  layer.forward(good, cache);
  EXPECT_THROW_WITH(layer.backward(good, cache, Tensor<float, 2>({2, 3})), ShapeError,
                    "BitLinear::backward: dy has shape [2, 3] but forward(x) has shape [2, 4]");
  EXPECT_THROW_WITH(layer.backward(Tensor<float, 2>({3, 8}), cache, Tensor<float, 2>({3, 4})),
                    ShapeError, "BitLinear::backward: the cache holds");
  EXPECT_TRUE((layer.weight_grad().matrix().array() == 0).all());  // nothing touched
  EXPECT_THROW_WITH(BitLinear<float>(Tensor<float, 2>({4, 8}), Tensor<float, 1>({3})), ShapeError,
                    "bias has shape [3]");
  EXPECT_THROW_WITH(BitLinear<float>(8, 4, {.norm_eps = 0}), ConfigError, "eps");
  BitLinear<float> bare(8, 4, {.norm = false});
  EXPECT_THROW_WITH(bare.norm(), Error, "norm = false");
  EXPECT_THROW_WITH((void)bare.bias(), Error, "bias=false");
}

TEST(BitLinear, LinearModeRefusesWhatWouldBypassIt) {
  Linear<float> layer(32, 8, {.seed = 3});
  layer.set_bitlinear(true);
  EXPECT_THROW_WITH(layer.pack(), Error, "runs as BitLinear");
  EXPECT_THROW_WITH(layer.quantize(WeightFormat::int8), Error, "runs as BitLinear");
  EXPECT_THROW_WITH(layer.attach_adapter({.rank = 2}), Error, "runs as BitLinear");
  std::ostringstream printed;
  printed << layer;
  EXPECT_EQ(printed.str(), "Linear(in_features=32, out_features=8, bias=true, bitlinear)");
  layer.set_bitlinear(false);
  layer.quantize(WeightFormat::int8);
  EXPECT_THROW_WITH(layer.set_bitlinear(true), Error, "dequantize()");
  Linear<float> packed(32, 8, {.seed = 4});
  packed.pack();
  EXPECT_THROW_WITH(packed.set_bitlinear(true), Error, "unpack()");
  Linear<float> adapted(32, 8, {.seed = 5});
  adapted.attach_adapter({.rank = 2});
  EXPECT_THROW_WITH(adapted.set_bitlinear(true), Error, "LoRA adapter");
  GatedFeedForward<float> ffn(8, 16, {.seed = 6});
  ffn.up().set_bitlinear(true);
  EXPECT_THROW_WITH(ffn.pack(), Error, "runs as BitLinear");

  // Off again: the float product, exactly.
  std::mt19937_64 engine(23);
  Linear<float> plain(32, 8, {.seed = 7});
  const auto x = random_tensor<float, 2>({3, 32}, engine);
  const auto y = plain.forward(x);
  plain.set_bitlinear(true);
  EXPECT_FALSE(plain.forward(x).matrix().isApprox(y.matrix()));
  plain.set_bitlinear(false);
  EXPECT_TENSOR_EQ(plain.forward(x), y);
}

// ---- the module protocol ------------------------------------------------------------------------

TEST(BitLinear, IsAModuleAnOptimizerTrains) {
  std::mt19937_64 engine(29);
  BitLinear<double> layer(12, 6, {.bias = true, .seed = 8});
  EXPECT_EQ(parameter_names(layer), (std::vector<std::string>{"norm.weight", "weight", "bias"}));
  EXPECT_EQ(layer.parameter_count(), 12 + 6 * 12 + 6);
  std::ostringstream printed;
  printed << layer;
  EXPECT_EQ(printed.str(),
            "BitLinear(in_features=12, out_features=6, bias=true, norm=RMSNorm(12, eps=1e-06))");

  // Regression onto a target: Adam over the module lowers the loss.
  const auto x = random_tensor<double, 2>({16, 12}, engine);
  const auto target = random_tensor<double, 2>({16, 6}, engine);
  const auto loss_of = [&](const Tensor<double, 2>& y) {
    return (y.matrix() - target.matrix()).squaredNorm() / 16;
  };
  Adam<double> adam(layer, {.lr = 2e-2});
  EXPECT_EQ(adam.parameter_count(), layer.parameter_count());
  BitLinear<double>::Cache cache;
  const double first = loss_of(layer.forward(x));
  for (int step = 0; step < 30; ++step) {
    adam.zero_grad();
    auto y = layer.forward(x, cache);
    Tensor<double, 2> dy(y.shape());
    dy.matrix() = 2 * (y.matrix() - target.matrix()) / 16;
    layer.backward(x, cache, dy);
    adam.step();
  }
  EXPECT_LT(loss_of(layer.forward(x)), 0.8 * first);

  layer.zero_grad();
  EXPECT_TRUE((layer.weight_grad().matrix().array() == 0).all());
  layer.set_frozen(true);
  EXPECT_TRUE(layer.frozen());
  EXPECT_THROW_WITH((void)layer.weight_grad(), Error, "frozen");
  EXPECT_THROW_WITH((void)layer.norm().weight_grad(), Error, "frozen");
  const auto dx = layer.backward(x, cache, Tensor<double, 2>({16, 6}));  // dx only
  EXPECT_EQ(dx.shape(), x.shape());
}

// ---- whole models -------------------------------------------------------------------------------

// A block's forward under use_bitlinear is the hand-composition of BitLinear layers (without the
// norm) built from its weights: down(silu(gate(x)) ⊙ up(x)).
TEST(UseBitLinear, BlockForwardIsTheHandComposedBitLinearForward) {
  std::mt19937_64 engine(31);
  GatedFeedForward<double> ffn(10, 14, {.bias = true, .seed = 9});
  const auto as_bitlinear = [](const Linear<double>& layer) {
    return BitLinear<double>(Tensor<double, 2>(layer.weight()), Tensor<double, 1>(layer.bias()),
                             {.norm = false, .bias = true});
  };
  const auto gate = as_bitlinear(ffn.gate()), up = as_bitlinear(ffn.up()),
             down = as_bitlinear(ffn.down());
  EXPECT_EQ(use_bitlinear(ffn), (std::vector<std::string>{"gate", "up", "down"}));
  const auto x = random_tensor<double, 3>({2, 3, 10}, engine);
  auto hidden = silu(gate.forward(x));
  hidden.matrix().array() *= up.forward(x).matrix().array();
  EXPECT_TENSOR_EQ(ffn.forward(x), down.forward(hidden));
  GatedFeedForward<double>::Cache cache;
  EXPECT_TENSOR_EQ(ffn.forward(x, cache), down.forward(hidden));
}

/// The mean cross-entropy of `model` on fixed tokens.
template <class Model>
float loss_of(const Model& model, const TokenBatch& tokens, const std::vector<index_t>& targets) {
  const auto logits = model.forward(tokens);
  return cross_entropy(logits.cview().reshape(Shape<2>{-1, model.config().vocab}), targets);
}

TEST(UseBitLinear, TinyLlamaTrainsWithTernaryWeights) {
  const auto config = testing::small_llama();
  LlamaModel<float> model(config, {.seed = 11});
  const auto ids = random_ids(2 * 8, config.vocab, 1);
  const auto targets = random_ids(ids.size(), config.vocab, 2);
  const TokenBatch tokens{ids, 2, 8};
  const auto float_logits = model.forward(tokens);
  const auto names = parameter_names(model);

  const auto paths = use_bitlinear(model);
  std::vector<std::string> expected;
  for (const char* layer : {"0", "1"}) {
    for (const char* part : {"self_attn.qkv", "self_attn.proj", "mlp.gate", "mlp.up", "mlp.down"}) {
      expected.push_back(std::string("layers.") + layer + "." + part);
    }
  }
  EXPECT_EQ(paths, expected);  // the head (lm_head) stays float
  for_each_layer(model, [](const std::string& path, const Linear<float>& layer) {
    EXPECT_EQ(layer.bitlinear(), path != "lm_head") << path;
  });
  EXPECT_EQ(parameter_names(model), names);  // no new parameters, same names
  EXPECT_FALSE(model.forward(tokens).matrix().isApprox(float_logits.matrix()));

  Adam<float> adam(model, {.lr = 1e-2});
  typename LlamaModel<float>::Cache cache;
  const float first = loss_of(model, tokens, targets);
  for (int step = 0; step < 20; ++step) {
    adam.zero_grad();
    model.loss_and_backward(tokens, targets, cache);
    adam.step();
  }
  const float last = loss_of(model, tokens, targets);
  EXPECT_TRUE(std::isfinite(last));
  EXPECT_LT(last, first - 0.05f);

  EXPECT_EQ(remove_bitlinear(model), 10);
  EXPECT_EQ(remove_bitlinear(model), 0);
}

TEST(UseBitLinear, SelectsByNameAndRefusesWithoutChanging) {
  GPT2Model<float> model(testing::small_gpt2(), {.seed = 3});
  // GPT-2's head is tied to the embedding: not a Linear, never selected.
  EXPECT_EQ(use_bitlinear(model, {.target_modules = {"mlp.up"}}),
            (std::vector<std::string>{"h.0.mlp.up", "h.1.mlp.up"}));
  EXPECT_THROW_WITH(use_bitlinear(model, {.target_modules = {"q_proj"}}), ConfigError,
                    "no Linear layer is selected; the model's Linear layers are: h.0.attn.qkv");
  EXPECT_THROW_WITH(use_bitlinear(model, {.target_pattern = "h.(0"}), ConfigError,
                    "not a regular expression");
  LlamaModel<float> llama(testing::small_llama(), {.seed = 4});
  EXPECT_EQ(use_bitlinear(llama, {.target_pattern = "lm_head", .exclude_modules = {}}),
            (std::vector<std::string>{"lm_head"}));
  // One quantised layer: the whole call refuses and nothing changed.
  LlamaModel<float> mixed(testing::small_llama(), {.seed = 5});
  for_each_layer(mixed, [](const std::string& path, Linear<float>& layer) {
    if (path == "layers.1.mlp.down") layer.quantize(WeightFormat::bf16);
  });
  EXPECT_THROW_WITH(use_bitlinear(mixed), Error,
                    "use_bitlinear: layer layers.1.mlp.down is quantised");
  for_each_layer(mixed, [](const std::string& path, const Linear<float>& layer) {
    EXPECT_FALSE(layer.bitlinear()) << path;
  });
}

}  // namespace test_bit_linear
}  // namespace dissect
