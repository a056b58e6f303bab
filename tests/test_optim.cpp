// Tests for dissect/training/optim.hpp: SGD (momentum, dampening, Nesterov, weight decay), Adam and
// AdamW against PyTorch trajectories (tolerances from a running error bound of each update),
// hand-derived steps, parameter collection from Linear layers, no allocation in step(), and the
// bad-input rules.
#include "dissect/layers/linear.hpp"
#include "dissect/training/optim.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/allocation_counter.hpp"
#include "support/fixture.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_optim {

using testing::unit_roundoff;

template <class Scalar>
class OptimTyped : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(OptimTyped, Scalars);

// ---- a running error bound ----------------------------------------------------------------------

struct Hyper {
  std::string optimizer;
  double lr = 0, momentum = 0, dampening = 0, weight_decay = 0, beta1 = 0, beta2 = 0, eps = 0;
  bool nesterov = false;
};

/// Bound on |computed − exact| of every parameter after every step, for one implementation in a
/// type of unit roundoff u: the update is replayed in double on magnitudes, and each rounding
/// is charged u·|its result| while earlier errors are carried through (a momentum buffer passes
/// its error on with factor `momentum`, a parameter with factor 1 + lr·wd). The parameter values
/// the weight-decay terms see are PyTorch's own (`params`), which differ from the exact ones
/// by less than the bound itself.
std::vector<std::vector<double>> trajectory_bound(const Hyper& h, double u,
                                                  const std::vector<double>& p0,
                                                  const std::vector<std::vector<double>>& grads,
                                                  const std::vector<std::vector<double>>& params) {
  const std::size_t n = p0.size();
  std::vector<double> e_p(n, 0), buf_abs(n, 0), e_buf(n, 0), m_abs(n, 0), e_m(n, 0), v(n, 0),
      e_v(n, 0);
  std::vector<std::vector<double>> bounds;
  for (std::size_t step = 0; step < grads.size(); ++step) {
    const std::vector<double>& before = step == 0 ? p0 : params[step - 1];
    std::vector<double> bound(n);
    for (std::size_t i = 0; i < n; ++i) {
      const double p = std::abs(before[i]), g = grads[step][i];
      if (h.optimizer == "sgd") {
        const double d_abs = std::abs(g) + h.weight_decay * p;
        const double e_d = h.weight_decay * e_p[i] + 2 * u * d_abs;
        double dir_abs = d_abs, e_dir = e_d;
        if (h.momentum != 0) {
          if (step == 0) {
            buf_abs[i] = d_abs;
            e_buf[i] = e_d;
          } else {
            buf_abs[i] = h.momentum * buf_abs[i] + std::abs(1 - h.dampening) * d_abs;
            e_buf[i] = h.momentum * e_buf[i] + std::abs(1 - h.dampening) * e_d + 3 * u * buf_abs[i];
          }
          dir_abs = h.nesterov ? d_abs + h.momentum * buf_abs[i] : buf_abs[i];
          e_dir = h.nesterov ? e_d + h.momentum * e_buf[i] + 3 * u * dir_abs : e_buf[i];
        }
        e_p[i] += h.lr * e_dir + 3 * u * (p + h.lr * dir_abs);
      } else {
        const bool decoupled = h.optimizer == "adamw";
        const double t = double(step + 1);
        if (decoupled) e_p[i] = e_p[i] + 2 * u * p;  // p·(1 − lr·wd), the factor itself rounded
        const double g_abs = std::abs(g) + (decoupled ? 0 : h.weight_decay * p);
        const double e_g = decoupled ? 0 : h.weight_decay * e_p[i] + 2 * u * g_abs;
        m_abs[i] = h.beta1 * m_abs[i] + (1 - h.beta1) * g_abs;
        e_m[i] = h.beta1 * e_m[i] + (1 - h.beta1) * e_g + 3 * u * m_abs[i];
        v[i] = h.beta2 * v[i] + (1 - h.beta2) * g_abs * g_abs;
        e_v[i] = h.beta2 * e_v[i] + (1 - h.beta2) * 2 * g_abs * e_g + 4 * u * v[i];
        const double c2 = std::sqrt(1 - std::pow(h.beta2, t));
        const double step_size = h.lr / (1 - std::pow(h.beta1, t));
        const double root = std::sqrt(v[i]) / c2;
        const double denom = root + h.eps;
        const double e_root = v[i] > 0 ? root * (e_v[i] / (2 * v[i]) + 3 * u) : 0;
        const double e_denom = e_root + u * denom;
        const double update = step_size * m_abs[i] / denom;
        const double e_update =
            step_size * (e_m[i] / denom + m_abs[i] * e_denom / (denom * denom)) + 4 * u * update;
        e_p[i] += e_update + u * (p + update);
      }
      bound[i] = e_p[i];
    }
    bounds.push_back(bound);
  }
  return bounds;
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

double meta_double(const testing::Fixture& f, const std::string& key) {
  return f.has_meta(key) ? std::strtod(f.meta_str(key).c_str(), nullptr) : 0.0;
}

std::vector<std::vector<double>> rows_of(const testing::FixtureTensor& t) {
  std::vector<std::vector<double>> rows;
  const auto width = static_cast<std::size_t>(t.shape.at(1));
  for (std::size_t r = 0; r < static_cast<std::size_t>(t.shape.at(0)); ++r) {
    rows.emplace_back(t.values.begin() + static_cast<std::ptrdiff_t>(r * width),
                      t.values.begin() + static_cast<std::ptrdiff_t>((r + 1) * width));
  }
  return rows;
}

template <class Scalar>
std::unique_ptr<Optimizer<Scalar>> make_optimizer(const Hyper& h,
                                                  std::vector<ParameterRef<Scalar>> refs) {
  if (h.optimizer == "sgd") {
    return std::make_unique<Sgd<Scalar>>(refs, SgdOptions{.lr = h.lr,
                                                          .momentum = h.momentum,
                                                          .dampening = h.dampening,
                                                          .weight_decay = h.weight_decay,
                                                          .nesterov = h.nesterov});
  }
  if (h.optimizer == "adamw") {
    return std::make_unique<AdamW<Scalar>>(refs, AdamWOptions{.lr = h.lr,
                                                              .beta1 = h.beta1,
                                                              .beta2 = h.beta2,
                                                              .eps = h.eps,
                                                              .weight_decay = h.weight_decay});
  }
  return std::make_unique<Adam<Scalar>>(refs, AdamOptions{.lr = h.lr,
                                                          .beta1 = h.beta1,
                                                          .beta2 = h.beta2,
                                                          .eps = h.eps,
                                                          .weight_decay = h.weight_decay});
}

/// Replays the fixture's steps and returns the worst |error| / bound seen (≤ 1 passes).
/// `bound_scale` shrinks the allowed bound, for the test that proves the bound can fail.
template <class Scalar>
double check_optim_fixture(const testing::Fixture& f, double bound_scale = 1.0) {
  SCOPED_TRACE(f.path.string());
  const Hyper h{.optimizer = f.meta_str("optimizer"),
                .lr = meta_double(f, "lr"),
                .momentum = meta_double(f, "momentum"),
                .dampening = meta_double(f, "dampening"),
                .weight_decay = meta_double(f, "weight_decay"),
                .beta1 = meta_double(f, "beta1"),
                .beta2 = meta_double(f, "beta2"),
                .eps = meta_double(f, "eps"),
                .nesterov = f.has_meta("nesterov") && f.meta_bool("nesterov")};
  const auto& p0 = f.tensor("p0").values;
  const auto grads = rows_of(f.tensor("grads"));
  const auto params = rows_of(f.tensor("params"));
  const auto n = static_cast<index_t>(p0.size());

  // The one parameter of the fixture is handed over as two (3 values + the rest), so the test
  // also covers an optimizer walking a list; elementwise updates cannot tell the difference.
  Tensor<Scalar, 1> value({n}, std::vector<Scalar>(p0.begin(), p0.end())), grad({n});
  using View = TensorView<Scalar, 1>;
  std::vector<ParameterRef<Scalar>> refs{
      {"first", View(value.data(), {3}), View(grad.data(), {3})},
      {"rest", View(value.data() + 3, {n - 3}), View(grad.data() + 3, {n - 3})}};
  auto optimizer = make_optimizer<Scalar>(h, refs);

  // Two implementations, each within the bound of the exact trajectory: they differ by ≤ 2×.
  const auto bounds = trajectory_bound(h, unit_roundoff<Scalar>(), p0, grads, params);
  double worst = 0;
  for (std::size_t step = 0; step < grads.size(); ++step) {
    std::copy(grads[step].begin(), grads[step].end(), grad.begin());
    optimizer->step();
    for (index_t i = 0; i < n; ++i) {
      const double diff = std::abs(double(value(i)) - params[step][static_cast<std::size_t>(i)]);
      const double allowed = 2 * bounds[step][static_cast<std::size_t>(i)] * bound_scale;
      worst = std::max(worst, allowed > 0 ? diff / allowed : (diff > 0 ? INFINITY : 0));
      if (bound_scale == 1.0) {
        EXPECT_LE(diff, allowed) << "step " << step + 1 << " element " << i << ": " << value(i)
                                 << " vs torch " << params[step][static_cast<std::size_t>(i)];
      }
    }
  }
  EXPECT_EQ(optimizer->step_count(), static_cast<index_t>(grads.size()));
  return worst;
}

TEST(OptimFixtures, MatchTorchOptimTrajectories) {
  int checked = 0;
  for (const auto& path : testing::list_fixtures(testing::fixture_dir("optim"))) {
    const auto f = testing::read_fixture(path);
    if (f.dtype == "float32") {
      check_optim_fixture<float>(f);
    } else {
      check_optim_fixture<double>(f);
    }
    ++checked;
  }
  EXPECT_GE(checked, 24);  // 12 cases × 2 dtypes
}

TEST(OptimFixtures, BoundIsTightEnoughToFail) {
  // The float trajectories use a visible part of their bound, so the bound is no blanket: at a
  // hundredth of it, some case must fail; a wrong formula (e.g. eps inside the square root)
  // would be off by far more than the full bound.
  double worst = 0;
  for (const auto& path : testing::list_fixtures(testing::fixture_dir("optim"))) {
    const auto f = testing::read_fixture(path);
    if (f.dtype == "float32") worst = std::max(worst, check_optim_fixture<float>(f, 0.01));
  }
  EXPECT_GT(worst, 1.0);
}

// ---- hand-derived steps -------------------------------------------------------------------------

TYPED_TEST(OptimTyped, SgdMomentumByHand) {
  using S = TypeParam;
  // p = 1, g = 1 every step, lr 0.1, momentum 0.9: buf = 1, 1.9, 2.71; p = 0.9, 0.71, 0.439.
  Tensor<S, 1> p({1}, {S(1)}), g({1}, {S(1)});
  Sgd<S> sgd({parameter(p, g, "p")}, {.lr = 0.1, .momentum = 0.9});
  const double expected[] = {0.9, 0.71, 0.439};
  for (double e : expected) {
    sgd.step();
    EXPECT_NEAR(double(p(0)), e, 16 * unit_roundoff<S>());
  }
  EXPECT_EQ(g(0), S(1));  // step() leaves gradients alone
}

TYPED_TEST(OptimTyped, SgdNesterovAndWeightDecayByHand) {
  using S = TypeParam;
  // wd 0.5 on p = 2, g = 0: d = 1; step 1: buf = 1, nesterov d + 0.9·buf = 1.9, p = 2 − 0.19 =
  // 1.81. Step 2: d = 0.905, buf = 0.9 + 0.905 = 1.805, d + 0.9·1.805 = 2.5295, p = 1.55705.
  Tensor<S, 1> p({1}, {S(2)}), g({1});
  Sgd<S> sgd({parameter(p, g)},
             {.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5, .nesterov = true});
  sgd.step();
  EXPECT_NEAR(double(p(0)), 1.81, 16 * unit_roundoff<S>());
  sgd.step();
  EXPECT_NEAR(double(p(0)), 1.55705, 32 * unit_roundoff<S>());
}

TYPED_TEST(OptimTyped, AdamFirstStepIsLrTimesSign) {
  using S = TypeParam;
  // Step 1: m̂ = g, v̂ = g², so p −= lr·g/(|g| + eps): ≈ lr·sign(g) whatever |g| is — the
  // defining property of Adam. A zero gradient does not move the parameter.
  Tensor<S, 1> p({4}, {S(1), S(1), S(1), S(1)}), g({4}, {S(1e3), S(-1e-3), S(0), S(2)});
  Adam<S> adam({parameter(p, g)}, {.lr = 0.01});
  adam.step();
  const double eps = 1e-8;
  EXPECT_NEAR(double(p(0)), 1 - 0.01 * 1e3 / (1e3 + eps), 8 * unit_roundoff<S>());
  EXPECT_NEAR(double(p(1)), 1 + 0.01 * 1e-3 / (1e-3 + eps), 8 * unit_roundoff<S>());
  EXPECT_EQ(p(2), S(1));
  EXPECT_NEAR(double(p(3)), 1 - 0.01 * 2 / (2 + eps), 8 * unit_roundoff<S>());
}

TYPED_TEST(OptimTyped, EpsIsAddedAfterTheBiasCorrection) {
  using S = TypeParam;
  // g = 1e-6 with eps = 1e-6: step 1 has √v̂ = 1e-6, so the step is lr·1e-6/(1e-6 + 1e-6) =
  // lr/2 = 0.05. The other common form, eps added to the uncorrected √v = √0.001·1e-6 with the
  // correction moved into the step size, would step lr·√0.001/0.1·1e-7/(3.16e-8 + 1e-6) ≈ 0.0031.
  Tensor<S, 1> p({1}), g({1}, {S(1e-6)});
  Adam<S> adam({parameter(p, g)}, {.lr = 0.1, .eps = 1e-6});
  adam.step();
  EXPECT_NEAR(double(p(0)), -0.05, 1e-4);
}

TYPED_TEST(OptimTyped, AdamWDecaysWithoutTouchingTheMoments) {
  using S = TypeParam;
  // With g = 0, AdamW multiplies p by (1 − lr·wd) each step and the Adam part adds nothing;
  // Adam's L2 form instead feeds wd·p into the moments, so its first step moves p by ≈ lr.
  Tensor<S, 1> p({1}, {S(2)}), g({1});
  AdamW<S> adamw({parameter(p, g)}, {.lr = 0.1, .weight_decay = 0.5});
  adamw.step();
  adamw.step();
  EXPECT_NEAR(double(p(0)), 2 * 0.95 * 0.95, 8 * unit_roundoff<S>());
  Tensor<S, 1> q({1}, {S(2)}), h({1});
  Adam<S> adam({parameter(q, h)}, {.lr = 0.1, .weight_decay = 0.5});
  adam.step();
  EXPECT_NEAR(double(q(0)), 2 - 0.1 * 1 / (1 + 1e-8), 8 * unit_roundoff<S>());
}

// ---- parameters of layers ---------------------------------------------------------------------

TEST(Optim, ParametersOfLinearLayersAreNamedLikeNnSequential) {
  Linear<float> a(4, 3, {.seed = 1}), b(3, 2, {.bias = false, .seed = 2});
  const auto refs = parameters(a, b);
  ASSERT_EQ(refs.size(), 3u);
  EXPECT_EQ(refs[0].name, "0.weight");
  EXPECT_EQ(refs[0].size(), 12);
  EXPECT_EQ(refs[0].value.data(), a.weight().data());
  EXPECT_EQ(refs[0].grad.data(), a.weight_grad().data());
  EXPECT_EQ(refs[1].name, "0.bias");
  EXPECT_EQ(refs[1].size(), 3);
  EXPECT_EQ(refs[2].name, "1.weight");
  EXPECT_EQ(refs[2].value.data(), b.weight().data());
}

TEST(Optim, ParametersOfAVectorOfLayersCountFromZero) {
  std::vector<Linear<double>> layers;
  layers.emplace_back(5, 4, LinearOptions{.seed = 1});
  layers.emplace_back(4, 3, LinearOptions{.bias = false, .seed = 2});
  layers.emplace_back(3, 2, LinearOptions{.seed = 3});
  const auto refs = parameters(layers);
  ASSERT_EQ(refs.size(), 5u);
  EXPECT_EQ(refs[2].name, "1.weight");
  EXPECT_EQ(refs[3].name, "2.weight");
  EXPECT_EQ(refs[4].name, "2.bias");
  EXPECT_EQ(refs[4].value.data(), layers[2].bias().data());
  EXPECT_EQ(refs[4].size(), 2);
}

TEST(Optim, StepsALinearLayerFromItsBackward) {
  // One SGD step on a layer equals W − lr·dW computed by hand, and zero_grad clears every grad.
  Linear<double> layer(3, 2, {.seed = 4});
  const auto w0 = testing::snapshot(layer.weight());
  const auto b0 = testing::snapshot(layer.bias());
  Sgd<double> sgd(parameters(layer), {.lr = 0.5});
  Tensor<double, 2> x({2, 3}, {1, 2, 3, -1, 0, 1}), dy({2, 2}, {1, -1, 2, 0.5});
  layer.backward(x, dy);
  sgd.step();
  for (index_t o = 0; o < 2; ++o) {
    for (index_t i = 0; i < 3; ++i) {
      const double dw = dy(0, o) * x(0, i) + dy(1, o) * x(1, i);
      EXPECT_NEAR(layer.weight()(o, i), w0(o, i) - 0.5 * dw, 1e-15);
    }
    EXPECT_NEAR(layer.bias()(o), b0(o) - 0.5 * (dy(0, o) + dy(1, o)), 1e-15);
  }
  sgd.zero_grad();
  for (double v : layer.weight_grad()) EXPECT_EQ(v, 0.0);
  for (double v : layer.bias_grad()) EXPECT_EQ(v, 0.0);
  EXPECT_EQ(sgd.parameter_count(), 8);
}

TEST(Optim, ReferencesSurviveMovingTheLayer) {
  Linear<float> layer(2, 2, {.seed = 3});
  auto refs = parameters(layer);
  std::vector<Linear<float>> layers;
  layers.push_back(std::move(layer));  // the buffers move with their owners
  EXPECT_EQ(refs[0].value.data(), layers[0].weight().data());
  EXPECT_EQ(refs[1].grad.data(), layers[0].bias_grad().data());
}

TYPED_TEST(OptimTyped, StepAllocatesNothing) {
  using S = TypeParam;
  Linear<S> a(64, 32, {.seed = 1}), b(32, 10, {.seed = 2});
  Sgd<S> sgd(parameters(a, b), {.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4});
  AdamW<S> adamw(parameters(a, b), {});
  const long before = testing::allocation_count();
  for (int i = 0; i < 3; ++i) {
    sgd.step();
    adamw.step();
    sgd.zero_grad();
  }
  EXPECT_EQ(testing::allocation_count(), before);
}

TYPED_TEST(OptimTyped, EmptyListsAndEmptyParametersAreFine) {
  using S = TypeParam;
  Adam<S> none({}, {});
  none.step();
  none.zero_grad();
  EXPECT_EQ(none.step_count(), 1);
  Tensor<S, 1> empty({0});
  Sgd<S> sgd({parameter(empty, empty, "empty")}, {.lr = 0.1, .momentum = 0.5});
  sgd.step();
  EXPECT_EQ(sgd.parameter_count(), 0);
}

TYPED_TEST(OptimTyped, NaNGradientsPropagateWithoutThrowing) {
  using S = TypeParam;
  Tensor<S, 1> p({2}), g({2}, {std::numeric_limits<S>::quiet_NaN(), S(1)});
  Adam<S> adam({parameter(p, g)}, {});
  adam.step();
  EXPECT_TRUE(std::isnan(p(0)));
  EXPECT_TRUE(std::isfinite(p(1)));
}

TEST(Optim, SetLrChangesTheNextStep) {
  Tensor<double, 1> p({1}), g({1}, {1.0});
  Sgd<double> sgd({parameter(p, g)}, {.lr = 0.1});
  sgd.set_lr(0.25);
  EXPECT_EQ(sgd.lr(), 0.25);
  sgd.step();
  EXPECT_EQ(p(0), -0.25);
}

// ---- bad input ------------------------------------------------------------------------------

TEST(OptimErrors, HyperparametersOutsideTheirRangeAreConfigErrors) {
  Tensor<float, 1> p({2}), g({2});
  auto refs = [&] { return std::vector<ParameterRef<float>>{parameter(p, g, "p")}; };
  EXPECT_THROW_WITH(Sgd<float>(refs(), {.lr = -0.1}), ConfigError,
                    "Sgd: lr must be in [0, inf), got -0.1");
  EXPECT_THROW_WITH(Sgd<float>(refs(), {.momentum = -1}), ConfigError, "Sgd: momentum");
  EXPECT_THROW_WITH(Sgd<float>(refs(), {.weight_decay = -1}), ConfigError, "Sgd: weight_decay");
  EXPECT_THROW_WITH(Sgd<float>(refs(), {.nesterov = true}), ConfigError,
                    "nesterov needs momentum > 0 and dampening 0");
  EXPECT_THROW_WITH(Sgd<float>(refs(), {.momentum = 0.9, .dampening = 0.1, .nesterov = true}),
                    ConfigError, "nesterov needs momentum > 0 and dampening 0");
  EXPECT_THROW_WITH(Adam<float>(refs(), {.beta1 = 1.0}), ConfigError,
                    "Adam: beta1 must be in [0, 1), got 1");
  EXPECT_THROW_WITH(Adam<float>(refs(), {.beta2 = -0.5}), ConfigError, "Adam: beta2");
  EXPECT_THROW_WITH(Adam<float>(refs(), {.eps = -1e-8}), ConfigError, "Adam: eps");
  EXPECT_THROW_WITH(AdamW<float>(refs(), {.weight_decay = -0.01}), ConfigError,
                    "AdamW: weight_decay");
  EXPECT_THROW_WITH(Adam<float>(refs(), {.lr = std::nan("")}), ConfigError, "Adam: lr");
  Adam<float> adam(refs(), {});
  EXPECT_THROW_WITH(adam.set_lr(-1), ConfigError, "Adam: lr must be in [0, inf)");
  EXPECT_EQ(adam.lr(), 1e-3);
}

TEST(OptimErrors, OverlappingBuffersAreRefusedWithNames) {
  Linear<float> layer(3, 2, {.seed = 1});
  auto twice = parameters(layer);
  twice.push_back(twice[0]);
  EXPECT_THROW_WITH(Sgd<float>(twice, {}), Error, "(\"0.weight\")");
  EXPECT_THROW_WITH(Sgd<float>(twice, {}), Error, "every buffer must appear once");
  Tensor<float, 1> p({4}), g({4});
  // A gradient that is (part of) its own value.
  using View = TensorView<float, 1>;
  EXPECT_THROW_WITH(Adam<float>({{"self", View(p.data(), {2}), View(p.data() + 1, {2})}}, {}),
                    Error, "the value of parameter 0 (\"self\") overlaps the grad of parameter 0");
}

TEST(OptimErrors, MalformedReferences) {
  Tensor<double, 1> p({3}), g({3});
  using View = TensorView<double, 1>;
  // Views refuse a negative size and a null buffer before any optimizer sees them.
  EXPECT_THROW_WITH(View(p.data(), {-1}), ShapeError, "negative dimension -1");
  EXPECT_THROW_WITH(View(nullptr, {3}), Error, "TensorView: null data for shape [3]");
  EXPECT_THROW_WITH(Sgd<double>({{"short", View(p.data(), {3}), View(g.data(), {2})}}, {}),
                    ShapeError, "Sgd: parameter 0 (\"short\") has 3 values but 2 gradients");
  Tensor<double, 2> wrong({3, 1});
  Tensor<double, 2> right({1, 3});
  EXPECT_THROW_WITH(parameter(right, wrong, "w"), ShapeError,
                    "parameter: \"w\" has shape [1, 3] but its gradient has shape [3, 1]");
}

}  // namespace test_optim
}  // namespace dissect
