// Tests for dissect/layers/norm.hpp: LayerNorm and RMSNorm against hand-derived values and PyTorch
// fixtures (nn.LayerNorm and HF's LlamaRMSNorm written out), finite-difference gradients of the
// input and every parameter, the module protocol, an optimizer, and every bad input.
#include "dissect/layers/norm.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dissect/layers/linear.hpp"
#include "dissect/tensor/sequential.hpp"
#include "dissect/training/optim.hpp"
#include "support/fixture.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_norm {

using testing::gradcheck;
using testing::random_tensor;

// ---- hand-derived values ------------------------------------------------------------------------

TEST(LayerNorm, HandDerivedRowWithWeightAndBias) {
  // x = [1, 2, 3, 4]: mean 2.5, biased var (2.25 + 0.25 + 0.25 + 2.25)/4 = 1.25, so
  // x̂ = [−1.5, −0.5, 0.5, 1.5]/√(1.25 + 1e-5); y = x̂·γ + β with γ = [1, 2, 1, 0.5], β = 0.1.
  LayerNorm<double> norm(4);
  norm.set_weight(Tensor<double, 1>({4}, {1, 2, 1, 0.5}));
  norm.set_bias(Tensor<double, 1>({4}, {0.1, 0.1, 0.1, 0.1}));
  const auto y = norm.forward(Tensor<double, 1>({4}, {1, 2, 3, 4}));
  const double r = 1 / std::sqrt(1.25 + 1e-5);
  const Tensor<double, 1> expected({4}, {-1.5 * r + 0.1, -r + 0.1, 0.5 * r + 0.1, 0.75 * r + 0.1});
  EXPECT_TENSOR_NEAR(y, expected, 1e-15, 1e-15);
}

TEST(RMSNorm, HandDerivedRow) {
  // x = [3, 4]: mean(x²) = 12.5, y = x/√(12.5 + 1e-6)·w with w = [2, −1].
  RMSNorm<double> norm(2);
  EXPECT_EQ(norm.eps(), 1e-6);
  norm.set_weight(Tensor<double, 1>({2}, {2, -1}));
  const auto y = norm.forward(Tensor<double, 1>({2}, {3, 4}));
  const double r = 1 / std::sqrt(12.5 + 1e-6);
  const Tensor<double, 1> expected({2}, {6 * r, -4 * r});
  EXPECT_TENSOR_NEAR(y, expected, 1e-15, 1e-15);
}

TEST(LayerNorm, ConstantRowGivesBiasExactly) {
  // Zero variance: x − mean is exactly 0 (a constant float row has an exact mean in double), so
  // y = β exactly, also at 1e3 where E[x²] − mean² would have cancelled to noise.
  LayerNorm<float> norm(5);
  norm.set_bias(Tensor<float, 1>({5}, {0.5f, -1, 2, 0, 3}));
  for (float value : {0.75f, 1234.5f, -3e-4f}) {
    Tensor<float, 2> x({2, 5});
    x.view().fill(value);
    const auto y = norm.forward(x);
    for (index_t i = 0; i < 5; ++i) {
      EXPECT_EQ(y(0, i), norm.bias()(i));
      EXPECT_EQ(y(1, i), norm.bias()(i));
    }
  }
}

TEST(Normalization, InitialValuesAndPrinting) {
  LayerNorm<float> layer(3);
  RMSNorm<double> rms(4, 1e-5);
  for (index_t i = 0; i < 3; ++i) {
    EXPECT_EQ(layer.weight()(i), 1.0f);
    EXPECT_EQ(layer.bias()(i), 0.0f);
    EXPECT_EQ(layer.weight_grad()(i), 0.0f);
  }
  EXPECT_EQ(layer.eps(), 1e-5);
  EXPECT_EQ(rms.eps(), 1e-5);
  std::ostringstream out;
  out << layer << " " << rms;
  EXPECT_EQ(out.str(), "LayerNorm(3, eps=1e-05) RMSNorm(4, eps=1e-05)");
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------
//
// Bounds, derived as test_blocks.cpp derives its own: each computed value is within γ_L·scale of
// the exact one, where the scale is the computation redone on magnitudes and L the number of
// roundings on its longest path; two implementations are within twice that. Per row, with
// a_j = (|x_j − mean| + |x_j| + |mean|)·rstd (x̂_j and the rounding of x_j − mean, which is
// relative to |x_j| + |mean|, not to |x_j − mean|) and G_j = |dy_j·γ_j|:
//   y:  |γ_j|·a_j + |β_j|,                                L = 2D + 8 (mean, var, rstd, product)
//   dx: rstd·(G_j + mean(G) + 2·a_j·mean(G ⊙ a)),         L = 4D + 16 (x̂, two row sums, product)
//   dγ: Σ_rows |dy_j|·a_j,  dβ: Σ_rows |dy_j|,            L = rows + 2D + 8 / rows
// RMSNorm is the same with mean = 0.

struct NormBounds {
  Tensor<double, 2> y, dx;
  Tensor<double, 1> dweight, dbias;
};

template <class Scalar>
NormBounds norm_bounds(bool centered, double eps, const Tensor<double, 2>& x,
                       const Tensor<double, 1>& weight, const Tensor<double, 1>& bias,
                       const Tensor<double, 2>& dy) {
  const index_t rows = x.dim(0), d = x.dim(1);
  NormBounds b{Tensor<double, 2>({rows, d}), Tensor<double, 2>({rows, d}), Tensor<double, 1>({d}),
               Tensor<double, 1>({d})};
  const double gamma_y = 2 * testing::gamma<Scalar>(2 * d + 8);
  const double gamma_dx = 2 * testing::gamma<Scalar>(4 * d + 16);
  const double gamma_dw = 2 * testing::gamma<Scalar>(rows + 2 * d + 8);
  const double gamma_db = 2 * testing::gamma<Scalar>(std::max<index_t>(rows, 1));
  constexpr double tiny = std::numeric_limits<double>::denorm_min();
  std::vector<double> a(d), g(d);
  for (index_t r = 0; r < rows; ++r) {
    double mean = 0, var = 0;
    if (centered) {
      for (index_t j = 0; j < d; ++j) mean += x(r, j) / d;
    }
    for (index_t j = 0; j < d; ++j) var += (x(r, j) - mean) * (x(r, j) - mean) / d;
    const double rstd = 1 / std::sqrt(var + eps);
    double mean_g = 0, mean_ga = 0;
    for (index_t j = 0; j < d; ++j) {
      a[j] = (std::abs(x(r, j) - mean) + std::abs(x(r, j)) + std::abs(mean)) * rstd;
      g[j] = std::abs(dy(r, j) * weight(j));
      mean_g += g[j] / d;
      mean_ga += g[j] * a[j] / d;
    }
    for (index_t j = 0; j < d; ++j) {
      b.y(r, j) = gamma_y * (std::abs(weight(j)) * a[j] + std::abs(bias(j))) + tiny;
      b.dx(r, j) = gamma_dx * rstd * (g[j] + mean_g + 2 * a[j] * mean_ga) + tiny;
      b.dweight(j) += gamma_dw * std::abs(dy(r, j)) * a[j];
      b.dbias(j) += gamma_db * std::abs(dy(r, j));
    }
  }
  for (double& v : b.dweight) v += tiny;
  for (double& v : b.dbias) v += tiny;
  return b;
}

using testing::tensor_from;

/// [..., D] as double rows [rows, D].
template <class Scalar, std::size_t Rank>
Tensor<double, 2> rows_of(const Tensor<Scalar, Rank>& t) {
  return testing::to_double(t).reshape(Shape<2>{leading_count(t.shape()), t.dim(Rank - 1)});
}

template <class Scalar, Norm kind, std::size_t Rank>
void check_fixture(const testing::Fixture& f) {
  using NormT = Normalization<Scalar, kind>;
  const index_t d = f.meta_int("d_model");
  const double eps = std::stod(f.meta_str("eps"));
  NormT norm(d, eps);
  norm.set_weight(tensor_from<Scalar, 1>(f.tensor("weight")));
  Tensor<double, 1> bias({d});
  if constexpr (NormT::centered) {
    norm.set_bias(tensor_from<Scalar, 1>(f.tensor("bias")));
    bias = testing::to_double(norm.bias());
  }
  const auto x = tensor_from<Scalar, Rank>(f.tensor("x"));
  const auto dy = tensor_from<Scalar, Rank>(f.tensor("dy"));
  typename NormT::Cache cache;
  const auto y = norm.forward(x, cache);
  const auto dx = norm.backward(x, cache, dy);

  const auto bounds = norm_bounds<Scalar>(NormT::centered, eps, rows_of(x),
                                          testing::to_double(norm.weight()), bias, rows_of(dy));
  EXPECT_TENSOR_WITHIN(rows_of(y), rows_of(tensor_from<Scalar, Rank>(f.tensor("y"))), bounds.y);
  EXPECT_TENSOR_WITHIN(rows_of(dx), rows_of(tensor_from<Scalar, Rank>(f.tensor("dx"))), bounds.dx);
  EXPECT_TENSOR_WITHIN(testing::to_double(norm.weight_grad()),
                       testing::to_double(tensor_from<Scalar, 1>(f.tensor("dweight"))),
                       bounds.dweight);
  if constexpr (NormT::centered) {
    EXPECT_TENSOR_WITHIN(testing::to_double(norm.bias_grad()),
                         testing::to_double(tensor_from<Scalar, 1>(f.tensor("dbias"))),
                         bounds.dbias);
  }
  // forward without a cache and forward_into agree with forward(x, cache) bit for bit.
  EXPECT_TENSOR_EQ(norm.forward(x), y);
  Tensor<Scalar, Rank> into(x.shape());
  into.view().fill(std::numeric_limits<Scalar>::quiet_NaN());
  norm.forward_into(x, into);
  EXPECT_TENSOR_EQ(into, y);
}

template <class Scalar, Norm kind>
void check_fixture_rank(const testing::Fixture& f) {
  switch (f.meta_int("rank")) {
    case 1:
      return check_fixture<Scalar, kind, 1>(f);
    case 2:
      return check_fixture<Scalar, kind, 2>(f);
    case 3:
      return check_fixture<Scalar, kind, 3>(f);
  }
  ADD_FAILURE() << "unexpected rank " << f.meta_int("rank");
}

TEST(NormFixtures, EveryCaseMatchesPyTorch) {
  const auto paths = testing::list_fixtures(testing::fixture_dir("norm"));
  EXPECT_EQ(paths.size(), 36u);
  for (const auto& path : paths) {
    const auto f = testing::read_fixture(path);
    SCOPED_TRACE(f.case_name);
    const bool layer = f.meta_str("kind") == "layer_norm";
    if (f.dtype == "float32") {
      layer ? check_fixture_rank<float, Norm::layer_norm>(f)
            : check_fixture_rank<float, Norm::rms_norm>(f);
    } else {
      layer ? check_fixture_rank<double, Norm::layer_norm>(f)
            : check_fixture_rank<double, Norm::rms_norm>(f);
    }
  }
}

// ---- finite differences -------------------------------------------------------------------------

/// L = Σ dy ⊙ norm(x): backward(x, cache, dy) is its exact gradient.
template <Norm kind, std::size_t Rank>
void check_gradients(const Shape<Rank>& shape, std::uint64_t seed, double scale) {
  using NormT = Normalization<double, kind>;
  SCOPED_TRACE(
      testing::concat_for_trace(NormT::name, format_shape(shape), "seed", seed, "scale", scale));
  std::mt19937_64 engine(seed);
  const index_t d = shape[Rank - 1];
  NormT norm(d);
  norm.set_weight(random_tensor<double>(Shape<1>{d}, engine, 0.5, 1.5));
  if constexpr (NormT::centered) norm.set_bias(random_tensor<double>(Shape<1>{d}, engine));
  auto x = random_tensor<double>(shape, engine, -scale, scale);
  const auto dy = random_tensor<double>(shape, engine);
  typename NormT::Cache cache;
  norm.forward(x, cache);
  const auto dx = norm.backward(x, cache, dy);
  const auto loss = [&] {
    const auto y = norm.forward(x);
    double sum = 0;
    for (index_t i = 0; i < y.size(); ++i) sum += y.data()[i] * dy.data()[i];
    return sum;
  };
  EXPECT_GRADIENT_OK(gradcheck(loss, x, dx));
  EXPECT_GRADIENT_OK(gradcheck(loss, norm.weight(), norm.weight_grad()));
  if constexpr (NormT::centered) {
    EXPECT_GRADIENT_OK(gradcheck(loss, norm.bias(), norm.bias_grad()));
  }
}

template <Norm kind>
void check_gradients_for_shapes() {
  std::uint64_t seed = 1;
  for (index_t d : {1, 2, 3, 7}) {
    for (double scale : {1.0, 10.0, 0.1}) {
      check_gradients<kind>(Shape<1>{d}, seed++, scale);
      check_gradients<kind>(Shape<2>{3, d}, seed++, scale);
      check_gradients<kind>(Shape<3>{2, 3, d}, seed++, scale);
    }
  }
}

TEST(LayerNorm, FiniteDifferencesOnEveryElement) {
  check_gradients_for_shapes<Norm::layer_norm>();
}
TEST(RMSNorm, FiniteDifferencesOnEveryElement) {
  check_gradients_for_shapes<Norm::rms_norm>();
}

// ---- training behaviour -------------------------------------------------------------------------

/// A LayerNorm after one forward(x, cache) and one backward(x, cache, dy).
class LayerNormAfterBackward : public ::testing::Test {
 protected:
  void SetUp() override {
    norm.forward(x, cache);
    norm.backward(x, cache, dy);
  }
  std::mt19937_64 engine{7};
  LayerNorm<double> norm{4};
  Tensor<double, 2> x = random_tensor<double>(Shape<2>{3, 4}, engine);
  Tensor<double, 2> dy = random_tensor<double>(Shape<2>{3, 4}, engine);
  LayerNorm<double>::Cache cache;
};

TEST_F(LayerNormAfterBackward, GradientsAccumulateUntilZeroGrad) {
  const auto once_w = testing::snapshot(norm.weight_grad());
  const auto once_b = testing::snapshot(norm.bias_grad());
  norm.backward(x, cache, dy);
  for (index_t j = 0; j < 4; ++j) {
    EXPECT_EQ(norm.weight_grad()(j), 2 * once_w(j));
    EXPECT_EQ(norm.bias_grad()(j), 2 * once_b(j));
  }
  norm.zero_grad();
  for (index_t j = 0; j < 4; ++j) {
    EXPECT_EQ(norm.weight_grad()(j), 0.0);
    EXPECT_EQ(norm.bias_grad()(j), 0.0);
  }
}

TEST(Normalization, RowsAreIndependentAndReshapeDoesNotMatter) {
  std::mt19937_64 engine(11);
  RMSNorm<float> norm(5);
  norm.set_weight(random_tensor<float>(Shape<1>{5}, engine));
  const auto x = random_tensor<float>(Shape<3>{2, 3, 5}, engine);
  const auto y = norm.forward(x);
  const auto flat = norm.forward(x.view().reshape(Shape<2>{6, 5}));
  EXPECT_TENSOR_EQ(y.cview().reshape(Shape<2>{6, 5}), flat);
  for (index_t r = 0; r < 6; ++r) {
    const auto row = norm.forward(ConstTensorView<float, 1>(x.data() + 5 * r, {5}));
    const ConstTensorView<float, 1> expected(flat.data() + 5 * r, {5});
    EXPECT_TENSOR_EQ(row, expected);
  }
}

TEST(Normalization, EmptyLeadingAxesAreValidAndLeaveGradientsAtZero) {
  LayerNorm<double> norm(3);
  const Tensor<double, 3> x({2, 0, 3});
  LayerNorm<double>::Cache cache;
  const auto y = norm.forward(x, cache);
  EXPECT_EQ(y.shape(), (Shape<3>{2, 0, 3}));
  const auto dx = norm.backward(x, cache, x);
  EXPECT_EQ(dx.shape(), (Shape<3>{2, 0, 3}));
  for (index_t j = 0; j < 3; ++j) EXPECT_EQ(norm.weight_grad()(j), 0.0);
}

TEST(Normalization, NaNInARowPoisonsOnlyThatRow) {
  std::mt19937_64 engine(3);
  LayerNorm<float> layer(4);
  RMSNorm<float> rms(4);
  auto x = random_tensor<float>(Shape<2>{3, 4}, engine);
  const auto clean_layer = layer.forward(x), clean_rms = rms.forward(x);
  x(1, 2) = std::numeric_limits<float>::quiet_NaN();
  for (const auto& [y, clean] :
       {std::pair{layer.forward(x), clean_layer}, std::pair{rms.forward(x), clean_rms}}) {
    for (index_t j = 0; j < 4; ++j) {
      EXPECT_TRUE(std::isnan(y(1, j))) << j;
      EXPECT_EQ(y(0, j), clean(0, j));
      EXPECT_EQ(y(2, j), clean(2, j));
    }
  }
  // Backward: dx is NaN in that row only; dγ and dβ sum over rows and become NaN, as in torch.
  LayerNorm<float>::Cache cache;
  layer.forward(x, cache);
  const auto dx = layer.backward(x, cache, random_tensor<float>(Shape<2>{3, 4}, engine));
  for (index_t j = 0; j < 4; ++j) {
    EXPECT_TRUE(std::isnan(dx(1, j)));
    EXPECT_FALSE(std::isnan(dx(0, j)));
    EXPECT_FALSE(std::isnan(dx(2, j)));
  }
}

// ---- the module protocol ------------------------------------------------------------------------

TEST(Normalization, ModuleNamesAndCounts) {
  static_assert(Module<LayerNorm<float>> && Module<RMSNorm<double>>);
  LayerNorm<float> layer(6);
  RMSNorm<float> rms(6);
  EXPECT_EQ(parameter_names(layer), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(parameter_names(rms), (std::vector<std::string>{"weight"}));
  EXPECT_EQ(layer.parameter_count(), 12);
  EXPECT_EQ(rms.parameter_count(), 6);
  Sequential model(Linear<float>(3, 6), LayerNorm<float>(6));
  EXPECT_EQ(parameter_names(model),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias"}));
}

TEST(Normalization, TrainsInsideSequentialWithAdam) {
  std::mt19937_64 engine(5);
  Sequential model(Linear<double>(3, 4), LayerNorm<double>(4));
  Adam adam(model, {.lr = 0.1});
  const auto x = random_tensor<double>(Shape<2>{5, 3}, engine);
  const auto dy = random_tensor<double>(Shape<2>{5, 4}, engine);
  decltype(model)::Cache<2> cache;
  model.forward(x, cache);
  model.backward(x, cache, dy);
  auto& norm = model.get<1>();
  const auto weight = testing::snapshot(norm.weight());
  const auto bias = testing::snapshot(norm.bias());
  adam.step();
  // Adam's first step moves each parameter by lr against the sign of its gradient.
  for (index_t j = 0; j < 4; ++j) {
    const double w_sign = norm.weight_grad()(j) > 0 ? 1.0 : -1.0;
    const double b_sign = norm.bias_grad()(j) > 0 ? 1.0 : -1.0;
    EXPECT_NEAR(norm.weight()(j), weight(j) - 0.1 * w_sign, 1e-6);
    EXPECT_NEAR(norm.bias()(j), bias(j) - 0.1 * b_sign, 1e-6);
  }
}

TEST(Normalization, SetWeightKeepsTheBufferAndMoveLeavesAnEmptyNorm) {
  LayerNorm<float> norm(3);
  const float* address = norm.weight().data();
  norm.set_weight(Tensor<float, 1>({3}, {1, 2, 3}));
  EXPECT_EQ(norm.weight().data(), address);
  EXPECT_EQ(norm.weight()(2), 3.0f);
  const LayerNorm<float> copy(norm);
  EXPECT_NE(copy.weight().data(), address);
  EXPECT_EQ(copy.weight()(1), 2.0f);
  LayerNorm<float> moved(std::move(norm));
  EXPECT_EQ(moved.weight().data(), address);
  EXPECT_EQ(norm.d_model(), 0);  // NOLINT(bugprone-use-after-move): the documented state
  EXPECT_EQ(norm.parameter_count(), 0);
  static_assert(!std::is_copy_assignable_v<LayerNorm<float>>);
  static_assert(!std::is_move_assignable_v<RMSNorm<float>>);
}

// ---- bad inputs ---------------------------------------------------------------------------------

TEST(NormErrors, ImpossibleConfigurationsNameTheField) {
  EXPECT_THROW_WITH(LayerNorm<float>(0), ConfigError, "LayerNorm: d_model must be > 0 (got 0)");
  EXPECT_THROW_WITH(RMSNorm<float>(-3), ConfigError, "RMSNorm: d_model must be > 0 (got -3)");
  for (double eps : {0.0, -1e-5, std::numeric_limits<double>::quiet_NaN(),
                     std::numeric_limits<double>::infinity()}) {
    EXPECT_THROW_WITH(LayerNorm<double>(4, eps), ConfigError, "LayerNorm: eps must be finite");
    EXPECT_THROW_WITH(RMSNorm<double>(4, eps), ConfigError, "RMSNorm: eps must be finite");
  }
}

TEST(NormErrors, WrongInputWidthNamesOpAndBothShapes) {
  LayerNorm<float> layer(4);
  RMSNorm<float> rms(4);
  const Tensor<float, 2> x({2, 3});
  EXPECT_THROW_WITH(layer.forward(x), ShapeError,
                    "LayerNorm::forward: input last dim 3 != d_model 4 (x: [2, 3], weight: [4])");
  EXPECT_THROW_WITH(rms.forward(x), ShapeError,
                    "RMSNorm::forward: input last dim 3 != d_model 4 (x: [2, 3], weight: [4])");
  RMSNorm<float>::Cache cache;
  EXPECT_THROW_WITH(rms.backward(x, cache, x), ShapeError, "RMSNorm::backward: input last dim 3");
}

TEST_F(LayerNormAfterBackward, FailedBackwardChecksDyAndCacheAndLeavesGradientsAlone) {
  const auto weight_grad = testing::snapshot(norm.weight_grad());
  const auto bias_grad = testing::snapshot(norm.bias_grad());
  const Tensor<double, 2> wide_dy({3, 5}), short_dy({2, 4});
  EXPECT_THROW_WITH(norm.backward(x, cache, short_dy), ShapeError,
                    "LayerNorm::backward: dy has shape [2, 4] but x has shape [3, 4]");
  EXPECT_THROW_WITH(norm.backward(x, cache, wide_dy), ShapeError, "dy has shape [3, 5]");
  // A cache of another shape, of the same rows in another layout, and one never filled.
  const auto other = random_tensor<double>(Shape<2>{2, 4}, engine);
  EXPECT_THROW_WITH(norm.backward(other, cache, other), ShapeError,
                    "LayerNorm::backward: the cache holds statistics of x [3, 4], not of x [2, 4]");
  const auto same_rows = x.cview().reshape(Shape<3>{3, 1, 4});
  EXPECT_THROW_WITH(norm.backward(same_rows, cache, same_rows), ShapeError, "not of x [3, 1, 4]");
  EXPECT_THROW_WITH(norm.backward(x, LayerNorm<double>::Cache{}, x), ShapeError,
                    "the cache holds statistics of x [], not of x [3, 4]");
  EXPECT_TENSOR_EQ(norm.weight_grad(), weight_grad);
  EXPECT_TENSOR_EQ(norm.bias_grad(), bias_grad);
}

TEST(NormErrors, WrongParameterShapeNamesTheParameter) {
  LayerNorm<float> norm(3);
  EXPECT_THROW_WITH(norm.set_weight(Tensor<float, 1>({4})), ShapeError,
                    "LayerNorm::set_weight: weight must be [d_model] = [3], got [4]");
  EXPECT_THROW_WITH(norm.set_bias(Tensor<float, 1>({2})), ShapeError,
                    "LayerNorm::set_bias: bias must be [d_model] = [3], got [2]");
  EXPECT_EQ(norm.weight()(0), 1.0f);
}

TEST(NormErrors, OutputBufferMustFitAndNotAlias) {
  LayerNorm<double> norm(3);
  Tensor<double, 2> x({2, 3}), y({2, 3}), wrong({3, 2});
  EXPECT_THROW_WITH(norm.forward_into(x, wrong), ShapeError,
                    "LayerNorm::forward_into: output has shape [3, 2] but x has shape [2, 3]");
  EXPECT_THROW_WITH(norm.forward_into(x, x), ShapeError, "output y [2, 3] aliases input x");
  // y overlapping one row of x: the other row would be read after being overwritten.
  Tensor<double, 1> long_buffer({9});
  const ConstTensorView<double, 2> input(long_buffer.data(), {2, 3});
  EXPECT_THROW_WITH(norm.forward_into(input, TensorView<double, 2>(long_buffer.data() + 3, {2, 3})),
                    ShapeError, "aliases input x");
  Tensor<double, 1> row({3});
  EXPECT_THROW_WITH(norm.forward_into(row, norm.weight_grad()), ShapeError,
                    "output y [3] aliases the module's weight_grad [3]");
  EXPECT_THROW_WITH(norm.forward_into(row, norm.bias()), ShapeError,
                    "output y [3] aliases the module's bias [3]");
  EXPECT_THROW_WITH(norm.forward_into(row, norm.weight()), ShapeError,
                    "output y [3] aliases the module's weight [3]");
  norm.forward_into(x, y);  // and a fitting buffer works
}

}  // namespace test_norm
}  // namespace dissect
