// Tests for dissect/layers/linear.hpp: finite-difference gradients, the algebra of the seeds
// (linearity, composition = product, row independence, reshape invariance, the article's own
// "difference 0" check), the bad-input catalog, and threads sharing one layer.
#include "dissect/layers/linear.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <sstream>
#include <thread>

#include "support/fixture.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_linear {

using testing::gradcheck;
using testing::random_tensor;

template <class Scalar>
Linear<Scalar> random_layer(index_t in, index_t out, bool bias, std::uint64_t seed) {
  return Linear<Scalar>(in, out, {.bias = bias, .init = InitScheme::pytorch_default, .seed = seed});
}

// ---- construction, parameters, printing ---------------------------------------------------------

TEST(Linear, WeightIsOutByInLikeNnLinear) {
  Linear<float> layer(768, 3072);
  EXPECT_EQ(layer.weight().shape(), (Shape<2>{3072, 768}));
  EXPECT_EQ(layer.bias().shape(), (Shape<1>{3072}));
  EXPECT_EQ(layer.parameter_count(), 768 * 3072 + 3072);  // 2,362,368
  std::ostringstream out;
  out << layer;
  EXPECT_EQ(out.str(), "Linear(in_features=768, out_features=3072, bias=true)");
  Linear<double> no_bias(4, 5, {.bias = false});
  EXPECT_EQ(no_bias.parameter_count(), 20);
}

TEST(Linear, SeedMakesLayersReproducible) {
  auto a = random_layer<float>(32, 16, true, 3), b = random_layer<float>(32, 16, true, 3);
  EXPECT_TENSOR_EQ(a.weight(), b.weight());
  EXPECT_TENSOR_EQ(a.bias(), b.bias());
  // Without a seed, consecutive layers draw different seeds (Q, K and V must not start equal).
  Linear<float> q(8, 8), k(8, 8);
  EXPECT_FALSE(allclose(q.weight(), k.weight()));
}

// ---- shapes that are valid --------------------------------------------------------------------

TEST(Linear, RankOneInputIsOneRow) {  // reliability.md row 3
  auto layer = random_layer<double>(3, 2, true, 1);
  Tensor<double, 1> x({3}, {1, -2, 0.5});
  auto y = layer.forward(x);
  ASSERT_EQ(y.shape(), (Shape<1>{2}));
  for (index_t n = 0; n < 2; ++n) {
    double expected = layer.bias()(n);
    for (index_t k = 0; k < 3; ++k) expected += x(k) * layer.weight()(n, k);
    EXPECT_DOUBLE_EQ(y(n), expected);
  }
  Tensor<double, 1> dy({2}, {1, 3});
  auto dx = layer.backward(x, dy);
  ASSERT_EQ(dx.shape(), (Shape<1>{3}));
  for (index_t n = 0; n < 2; ++n)
    for (index_t k = 0; k < 3; ++k)
      EXPECT_DOUBLE_EQ(layer.weight_grad()(n, k), dy(n) * x(k));  // outer
}

TEST(Linear, EmptyLeadingDimsGiveExactZeroGradients) {  // row 4
  auto layer = random_layer<float>(4, 3, true, 2);
  Tensor<float, 2> x({0, 4});
  EXPECT_EQ(layer.forward(x).shape(), (Shape<2>{0, 3}));
  Tensor<float, 3> x3({2, 0, 4});
  EXPECT_EQ(layer.forward(x3).shape(), (Shape<3>{2, 0, 3}));
  auto dx = layer.backward(x3, Tensor<float, 3>({2, 0, 3}));
  EXPECT_EQ(dx.shape(), x3.shape());
  for (float v : layer.weight_grad()) EXPECT_EQ(v, 0.0f);
  for (float v : layer.bias_grad()) EXPECT_EQ(v, 0.0f);
}

TEST(Linear, ZeroFeaturesAreValid) {  // row 5
  Linear<float> no_inputs(0, 3, {.seed = 1});
  for (float v : no_inputs.weight()) EXPECT_FALSE(std::isnan(v));
  auto y = no_inputs.forward(Tensor<float, 2>({2, 0}));
  for (index_t m = 0; m < 2; ++m)
    for (index_t n = 0; n < 3; ++n) EXPECT_EQ(y(m, n), no_inputs.bias()(n));  // broadcast bias
  Linear<float> no_outputs(4, 0, {.seed = 1});
  EXPECT_EQ(no_outputs.forward(Tensor<float, 2>({2, 4})).shape(), (Shape<2>{2, 0}));
  auto dx = no_outputs.backward(Tensor<float, 2>({2, 4}), Tensor<float, 2>({2, 0}));
  for (float v : dx) EXPECT_EQ(v, 0.0f);
}

// ---- the bad-input catalog --------------------------------------------------------------------

TEST(LinearErrors, WrongInputWidthNamesOpAndBothShapes) {  // row 1
  Linear<float> layer(4, 5);
  EXPECT_THROW_WITH(
      layer.forward(Tensor<float, 2>({2, 3})), ShapeError,
      "Linear::forward: input last dim 3 != in_features 4 (x: [2, 3], weight: [5, 4])");
  EXPECT_THROW_WITH(layer.forward(Tensor<float, 3>({2, 16, 768})), ShapeError,
                    "(x: [2, 16, 768], weight: [5, 4])");
}

TEST(LinearErrors, BackwardChecksDyAndXAndLeavesGradientsAlone) {  // row 2, strong guarantee
  auto layer = random_layer<float>(4, 5, true, 1);
  layer.backward(Tensor<float, 2>({2, 4}, std::vector<float>(8, 1)),
                 Tensor<float, 2>({2, 5}, std::vector<float>(10, 1)));
  const auto grads_before = testing::snapshot(layer.weight_grad());
  EXPECT_THROW_WITH(layer.backward(Tensor<float, 2>({2, 4}), Tensor<float, 2>({3, 5})), ShapeError,
                    "Linear::backward: dy has shape [3, 5] but forward(x) has shape [2, 5]");
  EXPECT_THROW_WITH(layer.backward(Tensor<float, 2>({2, 3}), Tensor<float, 2>({2, 5})), ShapeError,
                    "input last dim 3 != in_features 4");
  EXPECT_TENSOR_EQ(layer.weight_grad(), grads_before);
}

TEST(LinearErrors, NegativeFeatureCount) {  // row 6
  EXPECT_THROW_WITH(Linear<float>(-1, 3), ShapeError, "in_features must be >= 0, got -1");
  EXPECT_THROW_WITH(Linear<float>(3, -7), ShapeError, "out_features must be >= 0, got -7");
}

TEST(LinearErrors, OverflowingParameterCountThrowsBeforeAllocating) {  // row 7
  EXPECT_THROW_WITH(Linear<float>(1LL << 40, 1LL << 40), ShapeError, "overflows int64");
}

TEST(LinearErrors, BiasFreeLayerHasNoBias) {  // row 11
  Linear<float> layer(4, 5, {.bias = false});
  EXPECT_THROW_WITH(layer.bias(), Error, "built with bias=false");
  EXPECT_THROW_WITH(layer.bias_grad(), Error, "built with bias=false");
  EXPECT_THROW_WITH(layer.set_bias(Tensor<float, 1>({5})), Error, "built with bias=false");
}

TEST(LinearErrors, WrongWeightShapeNamesTheParameter) {  // row 12
  Linear<float> layer(4, 5);
  EXPECT_THROW_WITH(layer.set_weight(Tensor<float, 2>({4, 5})), ShapeError,
                    "set_weight: weight must be [out_features, in_features] = [5, 4], got [4, 5]");
  EXPECT_THROW_WITH(layer.set_bias(Tensor<float, 1>({4})), ShapeError,
                    "bias must be [out_features] = [5]");
  // weight() is a view: values can change through it, the shape cannot (row 20).
  static_assert(!std::is_assignable_v<decltype(layer.weight()), Tensor<float, 2>>);
  EXPECT_THROW_WITH(layer.weight().copy_from(Tensor<float, 2>({3, 3})), ShapeError,
                    "source has shape [3, 3] but the view has shape [5, 4]");
  EXPECT_EQ(layer.weight().shape(), (Shape<2>{5, 4}));
  EXPECT_THROW_WITH(Linear<float>(Tensor<float, 2>({5, 4}), Tensor<float, 1>({3})), ShapeError,
                    "bias has shape [3] but weight [5, 4] needs [5]");
}

TEST(LinearErrors, OutputBufferMustFitAndNotAlias) {  // row 14
  auto layer = random_layer<float>(4, 4, true, 1);
  Tensor<float, 2> x({2, 4}), wrong({2, 3});
  EXPECT_THROW_WITH(layer.forward_into(x, wrong), ShapeError,
                    "output has shape [2, 3] but x [2, 4] gives [2, 4]");
  EXPECT_THROW_WITH(layer.forward_into(x, x), ShapeError, "output aliases input");
  Tensor<float, 2> dy({2, 4});
  EXPECT_THROW_WITH(layer.backward_into(x, dy, dy), ShapeError, "dx aliases an input");
}

TEST(Linear, ForwardIntoIgnoresTheBuffersOldValues) {
  auto layer = random_layer<double>(6, 5, true, 4);
  std::mt19937_64 engine(1);
  auto x = random_tensor<double, 3>({2, 3, 6}, engine);
  Tensor<double, 3> y({2, 3, 5});
  y.fill(std::numeric_limits<double>::quiet_NaN());
  layer.forward_into(x, y);
  EXPECT_TENSOR_EQ(y, layer.forward(x));
}

TEST(Linear, NaNInTheInputPoisonsOnlyItsRow) {  // row 18
  auto layer = random_layer<float>(3, 2, true, 1);
  Tensor<float, 2> x({2, 3}, {1, std::nanf(""), 1, 1, 1, 1});
  auto y = layer.forward(x);
  EXPECT_TRUE(std::isnan(y(0, 0)) && std::isnan(y(0, 1)));
  EXPECT_FALSE(std::isnan(y(1, 0)) || std::isnan(y(1, 1)));
}

// ---- gradients --------------------------------------------------------------------------------

TEST(Linear, GradientsAccumulateUntilZeroGrad) {
  auto layer = random_layer<double>(3, 2, true, 5);
  std::mt19937_64 engine(2);
  auto x = random_tensor<double, 2>({4, 3}, engine);
  auto dy = random_tensor<double, 2>({4, 2}, engine);
  layer.backward(x, dy);
  const Tensor<double, 2> once(layer.weight_grad());  // a copy: views alias
  const Tensor<double, 1> once_bias(layer.bias_grad());
  layer.backward(x, dy);
  for (index_t i = 0; i < once.size(); ++i)
    EXPECT_DOUBLE_EQ(layer.weight_grad().data()[i], 2 * once.data()[i]);
  for (index_t i = 0; i < once_bias.size(); ++i)
    EXPECT_DOUBLE_EQ(layer.bias_grad().data()[i], 2 * once_bias.data()[i]);
  layer.zero_grad();
  for (double v : layer.weight_grad()) EXPECT_EQ(v, 0.0);
  for (double v : layer.bias_grad()) EXPECT_EQ(v, 0.0);
}

TEST(Linear, BackwardParametersMatchesBackwardWithoutDx) {
  // A first layer's input needs no gradient: the parameter half alone must add exactly what
  // backward adds.
  auto full = random_layer<float>(37, 29, true, 8);
  auto partial = full;
  std::mt19937_64 engine(4);
  const auto x = random_tensor<float, 3>({2, 9, 37}, engine);
  const auto dy = random_tensor<float, 3>({2, 9, 29}, engine);
  full.backward(x, dy);
  partial.backward_parameters(x, dy);
  EXPECT_TENSOR_EQ(partial.weight_grad(), full.weight_grad());
  EXPECT_TENSOR_EQ(partial.bias_grad(), full.bias_grad());
  const auto before = testing::snapshot(partial.weight_grad());
  EXPECT_THROW_WITH(
      partial.backward_parameters(x, Tensor<float, 3>({2, 9, 28})), ShapeError,
      "Linear::backward_parameters: dy has shape [2, 9, 28] but forward(x) has shape [2, 9, 29]");
  EXPECT_TENSOR_EQ(partial.weight_grad(), before);
}

/// L(x, W, b) = Σ forward(x) ⊙ g. Its exact gradients are backward(x, g); central differences
/// of L must agree.
double loss(const Linear<double>& layer, const Tensor<double, 3>& x, const Tensor<double, 3>& g) {
  auto y = layer.forward(x);
  double sum = 0;
  for (index_t i = 0; i < y.size(); ++i) sum += y.data()[i] * g.data()[i];
  return sum;
}

TEST(LinearGradients, MatchFiniteDifferencesOnTwoHundredShapes) {
  std::mt19937_64 engine(11);
  std::uniform_int_distribution<index_t> small(0, 6), width(1, 24);
  for (int trial = 0; trial < 200; ++trial) {
    const index_t b = small(engine), t = width(engine) % 7, in = width(engine), out = width(engine);
    const bool with_bias = trial % 3 != 0;
    Linear<double> layer(in, out, {.bias = with_bias, .seed = std::uint64_t(trial)});
    const auto x = random_tensor<double, 3>({b, t, in}, engine);
    const auto g = random_tensor<double, 3>({b, t, out}, engine);
    auto dx = layer.backward(x, g);
    SCOPED_TRACE(
        testing::concat_for_trace("trial", trial, "x", format_shape(x.shape()), "out", out));

    // L is linear in each value, so central differences are exact up to rounding of L itself:
    // a fixed 1e-7·(1 + |numeric|) with no further budget. Every element of a tensor of up to
    // 64, a seeded sample of 64 distinct ones beyond.
    const testing::GradcheckOptions options{.step = 1e-4,
                                            .relative_step = false,
                                            .rtol = 1e-7,
                                            .atol = 1e-7,
                                            .loss_rounding = 0.0,
                                            .sample = 64,
                                            .seed = std::uint64_t(trial)};
    auto x_probe = x;
    ASSERT_GRADIENT_OK(gradcheck([&] { return loss(layer, x_probe, g); }, x_probe, dx, options));
    auto loss_of_parameters = [&] { return loss(layer, x, g); };
    ASSERT_GRADIENT_OK(gradcheck(loss_of_parameters, layer.weight(), layer.weight_grad(), options));
    if (with_bias) {
      ASSERT_GRADIENT_OK(gradcheck(loss_of_parameters, layer.bias(), layer.bias_grad(), options));
    }
  }
}

// ---- the algebra of the seeds ------------------------------------------------------------------

template <class Scalar>
class LinearAlgebra : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LinearAlgebra, Scalars);

TYPED_TEST(LinearAlgebra, IsLinearWithoutBias) {
  // T(a·x + b·y) = a·T(x) + b·T(y), up to rounding of the one extra sum.
  std::mt19937_64 engine(21);
  std::uniform_int_distribution<index_t> dim(1, 40);
  std::uniform_real_distribution<double> coefficient(-3, 3);
  for (int trial = 0; trial < 100; ++trial) {
    const index_t m = dim(engine), in = dim(engine), out = dim(engine);
    auto layer = random_layer<TypeParam>(in, out, false, trial);
    const auto x = random_tensor<TypeParam, 2>({m, in}, engine);
    const auto y = random_tensor<TypeParam, 2>({m, in}, engine);
    const auto a = static_cast<TypeParam>(coefficient(engine)),
               b = static_cast<TypeParam>(coefficient(engine));
    Tensor<TypeParam, 2> combined({m, in});
    combined.matrix() = a * x.matrix() + b * y.matrix();
    Tensor<TypeParam, 2> expected({m, out});
    expected.matrix() = a * layer.forward(x).matrix() + b * layer.forward(y).matrix();
    // |a|,|b| <= 3, |x|,|y| <= 1, |W| <= 1/√in: each side is within ~γ_{in+2}·(6·in/√in).
    const double tolerance =
        4 * testing::gamma<TypeParam>(in + 3) * 6 * std::sqrt(double(in)) + 1e-30;
    EXPECT_TENSOR_NEAR(layer.forward(combined), expected, 0.0, tolerance);
  }
}

TYPED_TEST(LinearAlgebra, TwoLayersCollapseIntoTheirProduct) {
  // The lesson's "100 linear layers collapse into one": L2(L1(x)) = x·(W2·W1)ᵀ without bias.
  std::mt19937_64 engine(22);
  std::uniform_int_distribution<index_t> dim(1, 32);
  for (int trial = 0; trial < 100; ++trial) {
    const index_t m = dim(engine), in = dim(engine), hidden = dim(engine), out = dim(engine);
    auto first = random_layer<TypeParam>(in, hidden, false, 2 * trial);
    auto second = random_layer<TypeParam>(hidden, out, false, 2 * trial + 1);
    Tensor<TypeParam, 2> product({out, in});
    product.matrix() = second.weight().matrix() * first.weight().matrix();
    Linear<TypeParam> collapsed(product);
    const auto x = random_tensor<TypeParam, 2>({m, in}, engine);
    const double tolerance =
        4 * testing::gamma<TypeParam>(in + hidden) * std::sqrt(double(in)) + 1e-30;
    EXPECT_TENSOR_NEAR(second.forward(first.forward(x)), collapsed.forward(x), 0.0, tolerance);
  }
}

TYPED_TEST(LinearAlgebra, RowsAreIndependent) {
  // Row m of the output depends on row m of the input only: a batch is many independent calls.
  std::mt19937_64 engine(23);
  std::uniform_int_distribution<index_t> dim(1, 24);
  for (int trial = 0; trial < 100; ++trial) {
    const index_t m = dim(engine), in = dim(engine), out = dim(engine);
    auto layer = random_layer<TypeParam>(in, out, true, trial);
    const auto x = random_tensor<TypeParam, 2>({m, in}, engine);
    const auto batch = layer.forward(x);
    const index_t row = static_cast<index_t>(engine() % m);
    Tensor<TypeParam, 1> single({in});
    single.vector() = x.matrix().row(row).transpose();
    const auto alone = layer.forward(single);
    for (index_t n = 0; n < out; ++n) {
      ASSERT_NEAR(batch(row, n), alone(n), 2 * testing::gamma<TypeParam>(in + 1) * (in + 1));
    }
  }
}

TYPED_TEST(LinearAlgebra, FoldingLeadingAxesChangesNothing) {
  // [2, 3, 4, K] and [24, K] are the same GEMM: bitwise equal results and gradients.
  std::mt19937_64 engine(24);
  for (int trial = 0; trial < 100; ++trial) {
    const index_t in = 1 + trial % 17, out = 1 + (trial * 7) % 13;
    auto layer = random_layer<TypeParam>(in, out, true, trial);
    auto twin = layer;
    const auto x = random_tensor<TypeParam, 4>({2, 3, 4, in}, engine);
    const auto dy = random_tensor<TypeParam, 4>({2, 3, 4, out}, engine);
    const auto x_flat = x.reshape(Shape<2>{24, in});
    EXPECT_TENSOR_EQ(layer.forward(x).reshape(Shape<2>{24, out}), twin.forward(x_flat));
    auto dx = layer.backward(x, dy);
    auto dx_flat = twin.backward(x_flat, dy.reshape(Shape<2>{24, out}));
    EXPECT_TENSOR_EQ(dx.reshape(Shape<2>{24, in}), dx_flat);
    EXPECT_TENSOR_EQ(layer.weight_grad(), twin.weight_grad());
    EXPECT_TENSOR_EQ(layer.bias_grad(), twin.bias_grad());
  }
}

TYPED_TEST(LinearAlgebra, HandWrittenFormulaAgreesExactly) {
  // The seed article's check: a hand-written x @ W.T + b with the layer's own weights gives the
  // same output, difference 0 — first on its 1 → 1 demo over linspace(−5, 5, 100), then at
  // GPT-2's FFN width. Exactness needs the same kernel on both sides: one thread (a threaded
  // Eigen GEMM blocks the reduction differently) and, in float, the Eigen path pinned (the
  // default runs dissect's own GEMM, which sums in another order; it must agree within the
  // reduction bound 2·K·u·(|x|·|W|ᵀ + |b|)).
  [[maybe_unused]] const testing::SingleThreadedScope single_threaded;
  for (auto [m, in, out] : {std::tuple<index_t, index_t, index_t>{100, 1, 1}, {16, 768, 3072}}) {
    Linear<TypeParam> layer(in, out, {.init = InitScheme::kaiming_normal, .seed = 7});
    layer.bias().fill(TypeParam(0.25));
    Tensor<TypeParam, 2> x({m, in});
    for (index_t i = 0; i < x.size(); ++i)
      x.data()[i] = TypeParam(-5 + 10.0 * double(i) / double(x.size() - 1));
    Tensor<TypeParam, 2> by_hand({m, out});
    by_hand.matrix() = x.matrix() * layer.weight().matrix().transpose();
    by_hand.matrix().rowwise() += layer.bias().vector().transpose();
    {
      const testing::ScopedKernelPath eigen(quant::KernelPath::scalar);
      EXPECT_TENSOR_EQ(layer.forward(x), by_hand);
    }
    Tensor<double, 2> bound({m, out});
    bound.matrix() = x.matrix().template cast<double>().cwiseAbs() *
                     layer.weight().matrix().template cast<double>().cwiseAbs().transpose();
    bound.matrix().rowwise() +=
        layer.bias().vector().template cast<double>().cwiseAbs().transpose();
    bound.matrix() *= 2.0 * double(in + 1) * testing::unit_roundoff<TypeParam>();
    EXPECT_TENSOR_WITHIN(layer.forward(x), by_hand, bound);
  }
}

// ---- PyTorch fixtures
// ----------------------------------------------------------------------------

using testing::tensor_from;

/// Σ over a reduction of |a|·|b|, as a matrix product of absolute values in double: the scale
/// against which γ_L bounds the rounding error of each output element.
Tensor<double, 2> absolute_product(const Tensor<double, 2>& a,
                                   const Tensor<double, 2>& b_transposed) {
  Tensor<double, 2> result({a.dim(0), b_transposed.dim(0)});
  result.matrix() =
      testing::absolute(a).matrix() * testing::absolute(b_transposed).matrix().transpose();
  return result;
}

Tensor<double, 2> scaled(Tensor<double, 2> tensor, double factor) {
  for (double& value : tensor) value *= factor;
  return tensor;
}

template <class Scalar, std::size_t Rank>
void check_linear_fixture(const testing::Fixture& fixture) {
  const bool with_bias = fixture.meta_bool("bias");
  const index_t in = fixture.meta_int("in_features"), out = fixture.meta_int("out_features");
  auto weight = tensor_from<Scalar, 2>(fixture.tensor("W"));
  std::optional<Tensor<Scalar, 1>> bias;
  if (with_bias) bias = tensor_from<Scalar, 1>(fixture.tensor("b"));
  Linear<Scalar> layer(weight, bias);
  const auto x = tensor_from<Scalar, Rank>(fixture.tensor("x"));
  const auto dy = tensor_from<Scalar, Rank>(fixture.tensor("dy"));

  const auto y = layer.forward(x);
  const auto dx = layer.backward(x, dy);

  // Both we and PyTorch are within γ_L·Σ|terms| of the exact value, so we are within twice that
  // of each other; L is each output's reduction length (Higham §3.1).
  const index_t rows = leading_count(x.shape());
  const auto x2 = testing::to_double(x).reshape(Shape<2>{rows, in});
  const auto dy2 = testing::to_double(dy).reshape(Shape<2>{rows, out});
  const auto w2 = testing::to_double(weight);
  auto y_scale = absolute_product(x2, w2);
  if (with_bias)
    y_scale.matrix().rowwise() += testing::to_double(testing::absolute(*bias)).vector().transpose();
  Tensor<double, 2> w_transposed = w2.permute({1, 0});
  const auto dx_scale = absolute_product(dy2, w_transposed);
  const auto dw_scale = absolute_product(dy2.permute({1, 0}), x2.permute({1, 0}));
  const double tiny = std::numeric_limits<double>::denorm_min();
  auto bound = [&](const Tensor<double, 2>& scale, index_t length) {
    return scaled(scale, 2 * testing::gamma<Scalar>(std::max<index_t>(length, 1)));
  };
  auto near = [&](const Tensor<double, 2>& b) {
    auto result = b;
    for (double& v : result) v += tiny;
    return result;
  };
  const auto y_torch = tensor_from<Scalar, Rank>(fixture.tensor("y")).reshape(Shape<2>{rows, out});
  const auto dx_torch = tensor_from<Scalar, Rank>(fixture.tensor("dx")).reshape(Shape<2>{rows, in});
  const auto dw_torch = tensor_from<Scalar, 2>(fixture.tensor("dW"));
  EXPECT_TENSOR_WITHIN(y.reshape(Shape<2>{rows, out}), y_torch, near(bound(y_scale, in + 1)));
  EXPECT_TENSOR_WITHIN(dx.reshape(Shape<2>{rows, in}), dx_torch, near(bound(dx_scale, out)));
  EXPECT_TENSOR_WITHIN(layer.weight_grad(), dw_torch, near(bound(dw_scale, rows)));
  if (with_bias) {
    Tensor<double, 2> db_scale({1, out});  // zeros: the sum over no rows
    // Not colwise() over zero rows: Eigen forms each column's block at an offset from the empty
    // map's null pointer, which clang's UBSan reports as undefined.
    if (rows > 0) db_scale.matrix() = testing::absolute(dy2).matrix().colwise().sum();
    const auto db_torch = tensor_from<Scalar, 1>(fixture.tensor("db")).reshape(Shape<2>{1, out});
    EXPECT_TENSOR_WITHIN(layer.bias_grad().reshape(Shape<2>{1, out}), db_torch,
                         near(bound(db_scale, rows)));
  }
}

template <class Scalar>
void check_linear_fixture_any_rank(const testing::Fixture& fixture) {
  switch (fixture.tensor("x").rank()) {
    case 1:
      return check_linear_fixture<Scalar, 1>(fixture);
    case 2:
      return check_linear_fixture<Scalar, 2>(fixture);
    case 3:
      return check_linear_fixture<Scalar, 3>(fixture);
    case 4:
      return check_linear_fixture<Scalar, 4>(fixture);
    default:
      FAIL() << "unexpected rank of x in " << fixture.case_name;
  }
}

TEST(LinearFixtures, AgreeWithTorchNnLinearForwardAndAutograd) {
  const auto paths = testing::list_fixtures(testing::fixture_dir("linear"));
  ASSERT_GE(paths.size(), 36u)
      << "fixtures missing: regenerate with tests/reference/generate_fixtures.py";
  int float_cases = 0, double_cases = 0;
  for (const auto& path : paths) {
    const auto fixture = testing::read_fixture(path);
    SCOPED_TRACE(fixture.case_name);
    if (fixture.dtype == "float32") {
      check_linear_fixture_any_rank<float>(fixture);
      ++float_cases;
    } else if (fixture.dtype == "float64") {
      check_linear_fixture_any_rank<double>(fixture);
      ++double_cases;
    } else {
      ADD_FAILURE() << "unknown dtype " << fixture.dtype;
    }
  }
  EXPECT_EQ(float_cases, double_cases);
}

// ---- threads --------------------------------------------------------------------------------

TEST(Linear, EightThreadsShareOneConstLayerBitwise) {  // row 19
  const auto layer = random_layer<float>(64, 48, true, 9);
  std::mt19937_64 engine(3);
  const auto x = random_tensor<float, 2>({16, 64}, engine);
  const auto reference = layer.forward(x);
  std::vector<int> mismatches(8, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        auto y = layer.forward(x);
        mismatches[t] += std::memcmp(y.data(), reference.data(), y.size() * sizeof(float)) != 0;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

}  // namespace test_linear
}  // namespace dissect
