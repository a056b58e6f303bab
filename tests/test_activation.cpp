// Tests for dissect/tensor/activation.hpp: hand-derived values, PyTorch fixtures at the values that
// matter (0, both signs, the saturated tails at ±10 and ±30), finite-difference derivatives, the
// free functions against the enum, in-place use, NaN and the tails, and the bad inputs.
#include "dissect/tensor/activation.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <sstream>
#include <string>

#include "support/fixture.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_activation {

using testing::random_tensor;

constexpr Activation all_activations[] = {Activation::relu, Activation::gelu, Activation::gelu_tanh,
                                          Activation::silu};

// ---- the rounding-error bound -------------------------------------------------------------------
//
// Like a dot product's Σ|aᵢ·bᵢ|, each formula has a scale: the sum of the magnitudes of the terms
// it adds, as PyTorch writes it (dissect's forms are bounded by the same scale). Relative to it,
// the longest formula, tanh-GELU's backward, accumulates about 23 units of roundoff: 13 rounded
// operations, 2 ulp for the library tanh (or exp), and about 5 from its rounded argument, damped
// by sech² (|z|·sech²(z) ≤ 0.45) and doubled in 1 − t². The other formulas need fewer units.
// PyTorch and dissect are each within γ_32·scale of the exact value, so they are within twice
// that of each other.
constexpr index_t rounding_units = 32;

/// Scale of f(x).
double value_scale(Activation activation, double x) {
  const double ax = std::abs(x);
  switch (activation) {
    case Activation::relu:
      return 0.0;  // a select: exact
    case Activation::gelu:
      return 0.5 * ax * (1 + std::abs(std::erf(x / std::sqrt(2.0))));
    case Activation::gelu_tanh:
      return 0.5 * ax * (1 + std::abs(std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))));
    case Activation::silu:
      return ax / (1 + std::exp(-x));
  }
  return INFINITY;
}

/// Scale of f'(x)·dy.
double gradient_scale(Activation activation, double x, double dy) {
  const double ax = std::abs(x), ady = std::abs(dy);
  switch (activation) {
    case Activation::relu:
      return 0.0;
    case Activation::gelu:  // Φ + x·φ, Φ = ½(1 + erf)
      return ady * (0.5 * (1 + std::abs(std::erf(x / std::sqrt(2.0)))) +
                    ax * std::exp(-0.5 * x * x) / std::sqrt(2 * std::numbers::pi));
    case Activation::gelu_tanh: {  // ½(1 + t) + ½x(1 − t²)·β(1 + 3κx²)
      const double beta = 0.7978845608028654, kappa = 0.044715;
      const double t = std::tanh(beta * (x + kappa * x * x * x));
      return ady *
             (0.5 * (1 + std::abs(t)) + 0.5 * ax * (1 + t * t) * beta * (1 + 3 * kappa * x * x));
    }
    case Activation::silu: {  // σ(1 + x(1 − σ)), with 1 − σ formed by a subtraction
      const double s = 1 / (1 + std::exp(-x));
      return ady * s * (1 + ax * (1 + s));
    }
  }
  return INFINITY;
}

template <class Scalar>
double bound_for(double scale) {
  return 2 * testing::gamma<Scalar>(rounding_units) * scale +
         std::numeric_limits<double>::denorm_min();
}

// ---- hand-derived values ------------------------------------------------------------------------

TEST(Activation, HandDerivedValuesAtOneAndMinusOne) {
  const Tensor<double, 1> x({3}, {-1.0, 0.0, 1.0});
  const Tensor<double, 1> ones({3}, {1.0, 1.0, 1.0});
  struct Expected {
    Activation activation;
    double y[3];
    double slope[3];
  };
  // Φ(1) = ½·erfc(−1/√2) = 0.8413447460685429, φ(1) = e^(−½)/√(2π) = 0.24197072451914337:
  //   gelu(±1) = ±Φ(±1); gelu'(1) = Φ(1) + φ(1) = 1.0833154705876864; every slope at 0 is ½.
  // tanh form: u = √(2/π)·(1 + 0.044715) = 0.8335619689391656, t = tanh(u):
  //   gelu_tanh(1) = ½(1 + t) = 0.8411919906082768;
  //   gelu_tanh'(1) = ½(1 + t) + ½(1 − t²)·√(2/π)·(1 + 3·0.044715) = 1.0829640838457826.
  // σ(1) = 1/(1 + e^(−1)) = 0.7310585786300049: silu(1) = σ(1);
  //   silu'(1) = σ(1)·(1 + 1·(1 − σ(1))) = 0.9276705118714869; silu(−1) = −σ(−1) = −(1 − σ(1)).
  const Expected table[] = {
      {Activation::relu, {0.0, 0.0, 1.0}, {0.0, 0.0, 1.0}},
      {Activation::gelu,
       {-0.15865525393145707, 0.0, 0.8413447460685429},
       {1 - 0.8413447460685429 - 0.24197072451914337, 0.5, 1.0833154705876864}},
      {Activation::gelu_tanh,
       {-(1 - 0.8411919906082768), 0.0, 0.8411919906082768},
       {1 - 1.0829640838457826, 0.5, 1.0829640838457826}},
      {Activation::silu,
       {-(1 - 0.7310585786300049), 0.0, 0.7310585786300049},
       {1 - 0.9276705118714869, 0.5, 0.9276705118714869}},
  };
  // gelu'(−1) = Φ(−1) − φ(1) = 1 − Φ(1) − φ(1); by the symmetry f(x) − f(−x) = x of all three
  // smooth activations, f'(−x) = 1 − f'(x) and f(−1) = f(1) − 1.
  for (const auto& row : table) {
    SCOPED_TRACE(to_string(row.activation));
    const auto y = activate(x, row.activation);
    const auto slope = activate_backward(x, ones, row.activation);
    for (index_t i = 0; i < 3; ++i) {
      // The constants carry their own double rounding (≤ 2 ulp of values ≤ 1.1).
      const double allowed = bound_for<double>(2.0) + 4 * std::numeric_limits<double>::epsilon();
      EXPECT_NEAR(y(i), row.y[i], allowed) << "f(" << x(i) << ")";
      EXPECT_NEAR(slope(i), row.slope[i], allowed) << "f'(" << x(i) << ")";
    }
  }
}

TEST(Activation, ReluGradientAtZeroIsZeroAsInPyTorch) {
  const Tensor<float, 1> x({4}, {0.0f, -0.0f, 1e-30f, -1e-30f});
  const Tensor<float, 1> dy({4}, {5.0f, 5.0f, 5.0f, 5.0f});
  const auto dx = relu_backward(x, dy);
  EXPECT_EQ(dx(0), 0.0f);
  EXPECT_EQ(dx(1), 0.0f);
  EXPECT_EQ(dx(2), 5.0f);
  EXPECT_EQ(dx(3), 0.0f);
}

TEST(Activation, ExactGeluKeepsItsLeftTail) {
  // ½·x·erfc(−x/√2) at x = −10: −5·erfc(7.0710678…) = −5·1.5239706048321186e−23. The textbook
  // ½·x·(1 + erf(x/√2)) rounds 1 + erf to 0 there.
  const Tensor<double, 1> x({1}, {-10.0});
  const double y = gelu(x)(0);
  EXPECT_NEAR(y, -7.619853024160593e-23, 1e-12 * 7.62e-23);
}

TEST(Activation, SaturatedTailsHaveSlopeZeroOrOneNotNaN) {
  // x³ overflows float beyond ~7e12, but the slope there is exactly 0 or 1 (torch 1.13's tanh
  // form returns NaN at ±1e20 in float).
  const Tensor<float, 1> x({4}, {-1e20f, -30.0f, 30.0f, 1e20f});
  const Tensor<float, 1> ones({4}, {1, 1, 1, 1});
  for (Activation activation : all_activations) {
    SCOPED_TRACE(to_string(activation));
    const auto y = activate(x, activation);
    const auto slope = activate_backward(x, ones, activation);
    for (index_t i = 0; i < 4; ++i) {
      // SiLU at −30 is −30·σ(−30) ≈ −2.8e−12 and its slope ≈ −2.7e−12; everything else here is
      // exactly x or 0, and the slope exactly 1 or 0.
      EXPECT_NEAR(y(i), x(i) > 0 ? x(i) : 0.0f, 1e-11f) << "at " << x(i);
      EXPECT_NEAR(slope(i), x(i) > 0 ? 1.0f : 0.0f, 1e-11f) << "at " << x(i);
    }
  }
}

TEST(Activation, NaNPropagatesAsInPyTorch) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const Tensor<float, 1> x({2}, {nan, 1.0f});
  const Tensor<float, 1> dy({2}, {2.0f, 3.0f});
  for (Activation activation : all_activations) {
    SCOPED_TRACE(to_string(activation));
    const auto y = activate(x, activation);
    EXPECT_TRUE(std::isnan(y(0)));
    EXPECT_FALSE(std::isnan(y(1)));
    const auto dx = activate_backward(x, dy, activation);
    // ReLU's backward is PyTorch's threshold_backward: (x <= 0 ? 0 : dy), and NaN <= 0 is false.
    if (activation == Activation::relu) {
      EXPECT_EQ(dx(0), 2.0f);
    } else {
      EXPECT_TRUE(std::isnan(dx(0)));
    }
  }
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

template <class Scalar>
class ActivationTyped : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(ActivationTyped, Scalars);

template <class Scalar>
Tensor<Scalar, 1> vector_from(const testing::FixtureTensor& source) {
  if (source.rank() != 1) throw std::runtime_error("fixture tensor is not a vector");
  return Tensor<Scalar, 1>({source.numel()},
                           std::vector<Scalar>(source.values.begin(), source.values.end()));
}

TYPED_TEST(ActivationTyped, AgreeWithTorchForwardAndAutograd) {
  using Scalar = TypeParam;
  const std::string prefix = std::is_same_v<Scalar, float> ? "f32" : "f64";
  const auto fixture =
      testing::read_fixture(testing::fixture_dir("blocks") / (prefix + "_activations.txt"));
  const auto x = vector_from<Scalar>(fixture.tensor("x"));
  const auto dy = vector_from<Scalar>(fixture.tensor("dy"));
  ASSERT_GE(x.size(), 21);
  for (Activation activation : all_activations) {
    const std::string name = to_string(activation);
    SCOPED_TRACE(name);
    const auto y_torch = vector_from<Scalar>(fixture.tensor("y_" + name));
    const auto dx_torch = vector_from<Scalar>(fixture.tensor("dx_" + name));
    Tensor<double, 1> y_bound({x.size()}), dx_bound({x.size()});
    for (index_t i = 0; i < x.size(); ++i) {
      y_bound(i) = bound_for<Scalar>(value_scale(activation, x(i)));
      dx_bound(i) = bound_for<Scalar>(gradient_scale(activation, x(i), dy(i)));
    }
    const auto y = activate(x, activation);
    const auto dx = activate_backward(x, dy, activation);
    EXPECT_TENSOR_WITHIN(y, y_torch, y_bound);
    EXPECT_TENSOR_WITHIN(dx, dx_torch, dx_bound);
  }
}

// ---- derivatives by finite differences ----------------------------------------------------------

TEST(ActivationGradients, MatchFiniteDifferencesElementwise) {
  // Elementwise, so each element is a function of one variable and is checked on its own: the
  // loss is f(xᵢ) alone, whose rounding is this element's, not that of a sum over the tensor.
  // Error budget per element: rounding of f, γ_32·scale each side, over the step 2h: γ_32·scale/h;
  // truncation h²/6·f''', estimated by Richardson as |D(h) − D(2h)|/3 (exact to leading order).
  // Twice their sum is allowed.
  std::mt19937_64 engine(31);
  auto x = random_tensor<double, 1>({200}, engine, -4.0, 4.0);
  const double tails[] = {-30, -10, -5, 5, 10, 30};
  for (std::size_t i = 0; i < std::size(tails); ++i) x(static_cast<index_t>(i)) = tails[i];
  const double h = 1e-5;
  Tensor<double, 1> ones({x.size()});
  ones.fill(1.0);
  for (Activation activation : all_activations) {
    SCOPED_TRACE(to_string(activation));
    const auto analytic = activate_backward(x, ones, activation);
    for (index_t i = 0; i < x.size(); ++i) {
      if (activation == Activation::relu && std::abs(x(i)) < 4 * h) continue;  // the kink
      Tensor<double, 1> x_i({1});
      x_i(0) = x(i);
      const double rounding =
          testing::gamma<double>(rounding_units) * value_scale(activation, x(i));
      const auto result =
          testing::gradcheck([&] { return activate(x_i, activation)(0); }, x_i.data(), &analytic(i),
                             1, testing::GradcheckOptions::error_budget(h, rounding));
      ASSERT_GRADIENT_OK(result) << "f'(" << x(i) << "), element " << i;
    }
  }
}

// ---- the API around the formulas ----------------------------------------------------------------

TYPED_TEST(ActivationTyped, FreeFunctionsAreTheEnumsFormulas) {
  std::mt19937_64 engine(32);
  const auto x = random_tensor<TypeParam, 2>({5, 7}, engine, -6.0, 6.0);
  const auto dy = random_tensor<TypeParam, 2>({5, 7}, engine);
  EXPECT_TENSOR_EQ(relu(x), activate(x, Activation::relu));
  EXPECT_TENSOR_EQ(gelu(x), activate(x, Activation::gelu));
  EXPECT_TENSOR_EQ(gelu(x, GeluApproximation::tanh), activate(x, Activation::gelu_tanh));
  EXPECT_TENSOR_EQ(silu(x), activate(x, Activation::silu));
  EXPECT_TENSOR_EQ(relu_backward(x, dy), activate_backward(x, dy, Activation::relu));
  EXPECT_TENSOR_EQ(gelu_backward(x, dy), activate_backward(x, dy, Activation::gelu));
  const auto tanh_form = gelu_backward(x, dy, GeluApproximation::tanh);
  EXPECT_TENSOR_EQ(tanh_form, activate_backward(x, dy, Activation::gelu_tanh));
  EXPECT_TENSOR_EQ(silu_backward(x, dy), activate_backward(x, dy, Activation::silu));
  // The two GELU forms are different functions (they differ by up to ~5e−4 near |x| ≈ 2).
  EXPECT_FALSE(allclose(gelu(x), activate(x, Activation::gelu_tanh), 0.0, 1e-6));
}

TYPED_TEST(ActivationTyped, InPlaceAndIntoFormsGiveTheSameBits) {
  std::mt19937_64 engine(33);
  const auto x = random_tensor<TypeParam, 3>({2, 3, 4}, engine, -5.0, 5.0);
  const auto dy = random_tensor<TypeParam, 3>({2, 3, 4}, engine);
  for (Activation activation : all_activations) {
    SCOPED_TRACE(to_string(activation));
    const auto y = activate(x, activation);
    const auto dx = activate_backward(x, dy, activation);
    auto in_place = x;
    activate_into(in_place, in_place, activation);
    EXPECT_TENSOR_EQ(in_place, y);
    auto dx_in_place = dy;
    activate_backward_into(x, dx_in_place, dx_in_place, activation);
    EXPECT_TENSOR_EQ(dx_in_place, dx);
    // A buffer full of NaN: its old values are never read.
    Tensor<TypeParam, 3> buffer(x.shape());
    buffer.fill(std::numeric_limits<TypeParam>::quiet_NaN());
    activate_into(x, buffer, activation);
    EXPECT_TENSOR_EQ(buffer, y);
    buffer.fill(std::numeric_limits<TypeParam>::quiet_NaN());
    activate_backward_into(x, dy, buffer, activation);
    EXPECT_TENSOR_EQ(buffer, dx);
  }
}

TEST(Activation, AnyRankAndEmptyTensors) {
  std::mt19937_64 engine(34);
  const auto x4 = random_tensor<float, 4>({2, 1, 3, 2}, engine);
  const auto y4 = activate(x4, Activation::silu);
  EXPECT_EQ(y4.shape(), x4.shape());
  const auto flat = activate(x4.reshape(Shape<1>{x4.size()}), Activation::silu);
  EXPECT_TENSOR_EQ(y4.reshape(Shape<1>{y4.size()}), flat);  // elementwise: the shape is a view
  const Tensor<double, 2> empty({0, 3});
  EXPECT_EQ(activate(empty, Activation::gelu).shape(), (Shape<2>{0, 3}));
  EXPECT_EQ(activate_backward(empty, empty, Activation::gelu).shape(), (Shape<2>{0, 3}));
}

TEST(Activation, NamesPrintAsTheyAreSpelled) {
  std::ostringstream out;
  for (Activation activation : all_activations) out << activation << ' ';
  EXPECT_EQ(out.str(), "relu gelu gelu_tanh silu ");
}

// ---- bad inputs ---------------------------------------------------------------------------------

TEST(ActivationErrors, ShapesMustMatchAndOutputsStayUntouched) {
  const Tensor<float, 2> x({2, 3}), dy({3, 2});
  EXPECT_THROW_WITH(activate_backward(x, dy, Activation::gelu), ShapeError,
                    "activate_backward(gelu): dy has shape [3, 2] but x has shape [2, 3]");
  EXPECT_THROW_WITH(relu_backward(x, dy), ShapeError, "activate_backward(relu): dy has shape");
  Tensor<float, 2> y({2, 4});
  y.fill(7.0f);
  EXPECT_THROW_WITH(activate_into(x, y, Activation::silu), ShapeError,
                    "activate_into(silu): y has shape [2, 4] but x has shape [2, 3]");
  for (float v : y) EXPECT_EQ(v, 7.0f);
  Tensor<float, 2> dx({2, 2});
  EXPECT_THROW_WITH(activate_backward_into(x, x, dx, Activation::relu), ShapeError,
                    "dx has shape [2, 2] but x has shape [2, 3]");
}

TEST(ActivationErrors, UnknownActivationIsAnError) {
  const auto bogus = static_cast<Activation>(7);
  const Tensor<float, 1> x({2});
  EXPECT_THROW_WITH(activate(x, bogus), Error, "activate_into: unknown activation 7");
  EXPECT_THROW_WITH(activate_backward(x, x, bogus), Error,
                    "activate_backward: unknown activation 7");
  EXPECT_STREQ(to_string(bogus), "unknown");
}

}  // namespace test_activation
}  // namespace dissect
