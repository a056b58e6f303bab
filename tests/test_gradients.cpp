// Tests for dissect/training/gradients.hpp: clip_grad_norm against hand-computed norms and against
// torch.nn.utils.clip_grad_norm_ fixtures (three parameters; norms 2, ∞ and 1; max_norm above and
// below the norm), torch's handling of non-finite gradients with and without
// error_if_nonfinite, the module and optimizer-list forms, bad arguments; and gradient
// accumulation: k micro-batches scaled by 1/k give the gradient of their union, on a Linear
// (against the exact sum, within Higham's bound) and on a whole GPT-2 (against the full batch,
// within the model bound test_models uses against torch).
#include "dissect/training/gradients.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "dissect/layers/linear.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/training/optim.hpp"
#include "support/fixture_testing.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_gradients {

using testing::random_tensor;

constexpr double inf = std::numeric_limits<double>::infinity();

TEST(ClipGradNorm, HandComputedTwoNormClipsEveryParameterByOneFactor) {
  // Gradients (3, 4) and (12): ‖g‖₂ = √(9 + 16 + 144) = 13. max_norm 6.5: factor 6.5/(13 + 1e-6),
  // rounded as torch's Tensor.__rtruediv__ rounds it: reciprocal, then times 6.5.
  Tensor<double, 1> w({2}), dw({2}, {3, 4}), b({1}), db({1}, {12});
  const std::vector refs{parameter(w, dw, "w"), parameter(b, db, "b")};
  EXPECT_EQ(clip_grad_norm(refs, 6.5), 13.0);
  const double factor = 1 / (13 + 1e-6) * 6.5;
  EXPECT_EQ(dw(0), 3 * factor);
  EXPECT_EQ(dw(1), 4 * factor);
  EXPECT_EQ(db(0), 12 * factor);
  // Now below max_norm: torch multiplies by the clamped factor 1, which changes nothing.
  const double norm = clip_grad_norm(refs, 100.0);
  EXPECT_NEAR(norm, 6.5, 1e-6);
  EXPECT_EQ(dw(0), 3 * factor);
  // ∞-norm: the largest |g|, here 12·factor; 1-norm: Σ|g|.
  EXPECT_EQ(clip_grad_norm(refs, 100.0, {.norm_type = inf}), 12 * factor);
  EXPECT_NEAR(clip_grad_norm(refs, 100.0, {.norm_type = 1}), 19 * factor, 1e-12);
  // A fractional p: (Σ|g|^½)².
  const double half =
      std::pow(std::sqrt(3 * factor) + 2 * std::sqrt(factor) + std::sqrt(12 * factor), 2);
  EXPECT_NEAR(clip_grad_norm(refs, 100.0, {.norm_type = 0.5}), half, 1e-12);
  // max_norm = ∞ only measures.
  EXPECT_EQ(clip_grad_norm(refs, inf), 13 * factor);
  EXPECT_EQ(dw(1), 4 * factor);
}

TEST(ClipGradNorm, EmptyListHasNormZeroAndModulesAndOptimizersListTheSame) {
  EXPECT_EQ(clip_grad_norm(std::vector<ParameterRef<float>>{}, 1.0), 0.0f);
  Linear<double> a(3, 2, {.seed = 1}), b(3, 2, {.seed = 1});
  std::mt19937_64 engine(4);
  const auto x = random_tensor<double, 2>({5, 3}, engine);
  const auto dy = random_tensor<double, 2>({5, 2}, engine);
  (void)a.backward(x, dy);
  (void)b.backward(x, dy);
  // The module form, and the list an optimizer holds: the same norm, the same clipped gradients.
  Sgd<double> sgd(b, {.lr = 0.1});
  const double na = clip_grad_norm(a, 0.1);
  const double nb = clip_grad_norm(sgd.parameters(), 0.1);
  EXPECT_EQ(na, nb);
  EXPECT_TENSOR_EQ(a.weight_grad(), b.weight_grad());
  EXPECT_TENSOR_EQ(a.bias_grad(), b.bias_grad());
  EXPECT_NEAR(clip_grad_norm(a, inf), 0.1, 1e-6);
  // A frozen layer has no gradient: its parameters are not part of the norm.
  a.set_frozen(true);
  EXPECT_EQ(clip_grad_norm(a, 1.0), 0.0);
}

TEST(ClipGradNorm, NonFiniteGradientsAreScaledAsTorchScalesThemOrRefused) {
  // error_if_nonfinite false (torch's default): an ∞ gradient makes the norm ∞ and the factor
  // max_norm/∞ = 0, so finite gradients become 0 and the ∞ one NaN (∞·0); a NaN makes every
  // gradient NaN (the factor is NaN, and clamp keeps it).
  Tensor<float, 1> w({3}), dw({3}, {1, -INFINITY, 2});
  const std::vector refs{parameter(w, dw, "w")};
  EXPECT_EQ(clip_grad_norm(refs, 1.0), INFINITY);
  EXPECT_EQ(dw(0), 0.0f);
  EXPECT_TRUE(std::isnan(dw(1)));
  EXPECT_EQ(dw(2), 0.0f);
  Tensor<float, 1> dv({3}, {1, NAN, 2});
  const std::vector nan_refs{parameter(w, dv, "w")};
  for (const double p : {2.0, 1.0, inf}) {
    dv(0) = 1;  // refilled in place: the reference holds this buffer
    dv(1) = NAN;
    dv(2) = 2;
    EXPECT_TRUE(std::isnan(clip_grad_norm(nan_refs, 1.0, {.norm_type = p}))) << p;
    for (float g : dv) EXPECT_TRUE(std::isnan(g));
  }
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

template <class Scalar>
class ClipGradNormTyped : public ::testing::Test {};
TYPED_TEST_SUITE(ClipGradNormTyped, testing::FloatAndDouble);

// Bounds. dissect sums |g|ᵖ in double and rounds the norm once (≤ u of it); torch reduces each
// tensor, then the three norms, in Scalar: ≤ γ_{N+3} relative for p = 1 and 2 (a sum of N + 3
// non-negative terms, a square root halving the relative error). The ∞-norm is a maximum,
// exact in both, and the factor max_norm/(norm + 1e-6) then the same operations in Scalar: bit for
// bit. Otherwise the factor carries the norm's relative error plus 2u (the addition, the
// division) and each clipped gradient one more u.
template <class Scalar>
void check_fixture(const testing::Fixture& fixture) {
  const double norm_type = std::stod(fixture.meta_str("norm_type"));
  const double max_norm = std::stod(fixture.meta_str("max_norm"));
  std::vector<Tensor<Scalar, 1>> values, grads;
  index_t count = 0;
  for (int i = 0; i < 3; ++i) {
    const auto& g = fixture.tensor("grad" + std::to_string(i));
    grads.push_back(Tensor<Scalar, 1>({static_cast<index_t>(g.values.size())},
                                      std::vector<Scalar>(g.values.begin(), g.values.end())));
    values.emplace_back(grads.back().shape());
    count += grads.back().size();
  }
  std::vector<ParameterRef<Scalar>> refs;
  for (int i = 0; i < 3; ++i) refs.push_back(parameter(values[i], grads[i]));
  const double torch_norm = fixture.tensor("total_norm").values.at(0);
  const double norm = clip_grad_norm(refs, max_norm, {.norm_type = norm_type});
  const bool exact = std::isinf(norm_type);
  const double u = testing::unit_roundoff<Scalar>();
  const double norm_bound = exact ? 0 : testing::gamma<Scalar>(count + 3) + u;
  EXPECT_LE(std::abs(norm - torch_norm), norm_bound * torch_norm);
  const bool clipped = max_norm < torch_norm;
  for (int i = 0; i < 3; ++i) {
    const auto& flat = fixture.tensor("clipped" + std::to_string(i));
    const Tensor<Scalar, 1> torch_clipped(
        {static_cast<index_t>(flat.values.size())},
        std::vector<Scalar>(flat.values.begin(), flat.values.end()));
    SCOPED_TRACE(i);
    if (exact || !clipped) {
      EXPECT_TENSOR_EQ(grads[i], torch_clipped);
      continue;
    }
    Tensor<double, 1> bound({static_cast<index_t>(flat.values.size())});
    for (index_t k = 0; k < bound.size(); ++k) {
      bound(k) = std::abs(flat.values[k]) * (norm_bound + 4 * u);
    }
    EXPECT_TENSOR_WITHIN(testing::to_double(grads[i]), testing::to_double(torch_clipped), bound);
  }
}

TYPED_TEST(ClipGradNormTyped, AgreesWithTorchsClipGradNormOverThreeParameters) {
  EXPECT_EQ(testing::for_each_fixture<TypeParam>("clip_grad", check_fixture<TypeParam>), 6);
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(ClipGradNormErrors, BadArgumentsAndNonFiniteNormsNameTheOperation) {
  Tensor<double, 1> w({2}), dw({2}, {3, 4});
  Tensor<double, 2> v({2, 3}), dv({2, 3});
  dv(1, 1) = NAN;
  const std::vector refs{parameter(w, dw, "w"), parameter(v, dv, "1.weight")};
  EXPECT_THROW_WITH(clip_grad_norm(refs, 0.0), ConfigError,
                    "clip_grad_norm: max_norm must be > 0 (got 0)");
  EXPECT_THROW_WITH(clip_grad_norm(refs, -1.0), ConfigError, "max_norm must be > 0 (got -1)");
  EXPECT_THROW_WITH(clip_grad_norm(refs, NAN), ConfigError, "max_norm must be > 0 (got nan)");
  EXPECT_THROW_WITH(clip_grad_norm(refs, 1.0, {.norm_type = 0}), ConfigError,
                    "clip_grad_norm: norm_type must be > 0 or inf (got 0)");
  EXPECT_THROW_WITH(clip_grad_norm(refs, 1.0, {.norm_type = -inf}), ConfigError, "(got -inf)");
  EXPECT_THROW_WITH(clip_grad_norm(refs, 1.0, {.norm_type = NAN}), ConfigError, "(got nan)");
  EXPECT_THROW_WITH(
      clip_grad_norm(refs, 1.0, {.error_if_nonfinite = true}), Error,
      "clip_grad_norm: the total norm of order 2 of 2 parameters' gradients is nan; first at "
      "parameter 1 (\"1.weight\") [6 values], element 4 = nan (error_if_nonfinite: the gradients "
      "are left unscaled)");
  dv(1, 1) = inf;
  EXPECT_THROW_WITH(clip_grad_norm(refs, 1.0, {.norm_type = inf, .error_if_nonfinite = true}),
                    Error, "of order inf of 2 parameters' gradients is inf; first at parameter 1");
  // Every throw above left the gradients alone.
  EXPECT_EQ(dw(0), 3.0);
  EXPECT_EQ(dw(1), 4.0);
  EXPECT_EQ(dv(1, 1), inf);
  // Finite gradients whose squares overflow double: the message says so.
  dv(1, 1) = 1e200;
  EXPECT_THROW_WITH(clip_grad_norm(refs, 1.0, {.error_if_nonfinite = true}), Error,
                    "is inf; every gradient is finite, their norm overflows");
  EXPECT_THROW_WITH(scale_grad(refs, NAN), ConfigError, "scale_grad: factor must be finite");
}

// ---- accumulation -------------------------------------------------------------------------------

TEST(GradientAccumulation, MicroBatchesOfALinearSumToTheGradientOfTheirUnion) {
  // dW = Σ_m dyₘᵀ·xₘ over the M rows, in any grouping: one backward on all rows, or k backwards
  // on M/k rows each adding into the same buffer, are both sums of the same M products, each
  // within γ_M·Σ|dyₘ||xₘ| of the exact sum (Higham §3.1, any order), computed here in double.
  std::mt19937_64 engine(8);
  const index_t rows = 48, in = 37, out = 29;
  const auto x = random_tensor<float, 2>({rows, in}, engine);
  const auto dy = random_tensor<float, 2>({rows, out}, engine);
  for (const index_t k : {2, 3, 4, 8}) {
    SCOPED_TRACE(k);
    Linear<float> full(in, out, {.seed = 1}), micro(in, out, {.seed = 1});
    (void)full.backward(x, dy);
    for (index_t part = 0; part < k; ++part) {
      const index_t begin = part * rows / k, end = (part + 1) * rows / k;
      Tensor<float, 2> xs({end - begin, in}), dys({end - begin, out});
      std::copy(x.data() + begin * in, x.data() + end * in, xs.data());
      std::copy(dy.data() + begin * out, dy.data() + end * out, dys.data());
      (void)micro.backward(xs, dys);
    }
    const auto xd = testing::to_double(x), dyd = testing::to_double(dy);
    const Eigen::MatrixXd exact = dyd.matrix().transpose() * xd.matrix();
    const Eigen::MatrixXd scale =
        dyd.matrix().cwiseAbs().transpose() * xd.matrix().cwiseAbs() * testing::gamma<float>(rows);
    Tensor<double, 2> exact_t({out, in}), bound({out, in});
    Eigen::Map<Eigen::Matrix<double, -1, -1, Eigen::RowMajor>>(exact_t.data(), out, in) = exact;
    Eigen::Map<Eigen::Matrix<double, -1, -1, Eigen::RowMajor>>(bound.data(), out, in) = scale;
    EXPECT_TENSOR_WITHIN(testing::to_double(micro.weight_grad()), exact_t, bound);
    EXPECT_TENSOR_WITHIN(testing::to_double(full.weight_grad()), exact_t, bound);
  }
}

/// |a − e| ≤ tolerance · max |e| over the tensor (test_models' normwise comparison).
template <class A, class E>
::testing::AssertionResult normwise_close(const A& actual, const E& expected, double tolerance) {
  double scale = 0, worst = 0;
  for (index_t i = 0; i < expected.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(expected.data()[i])));
    worst = std::max(worst, std::abs(static_cast<double>(actual.data()[i]) -
                                     static_cast<double>(expected.data()[i])));
  }
  if (worst <= tolerance * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |diff| " << worst << " exceeds " << tolerance << " · " << scale;
}

template <class Scalar>
class GradientAccumulationTyped : public ::testing::Test {};
TYPED_TEST_SUITE(GradientAccumulationTyped, testing::FloatAndDouble);

TYPED_TEST(GradientAccumulationTyped, MicroBatchesOfAGpt2GiveTheFullBatchsGradient) {
  // B = 4 sequences as one batch, or as k micro-batches of B/k each whose mean losses' gradients
  // accumulate, then scale_grad(1/k) (exact: k is a power of 2). Both are the gradient of the mean
  // loss over the same 4·T tokens, computed in different orders: test_models' bound for two
  // implementations of a whole model's gradient (2·4·S·γ_K, S the stages of forward and
  // backward, K the longest reduction), plus γ_k for the k accumulating additions.
  using Scalar = TypeParam;
  const TransformerConfig config = testing::small_gpt2();
  const index_t batch = 4, seq = 8;
  const auto ids = testing::random_ids(static_cast<std::size_t>(batch * seq), config.vocab, 1);
  const auto targets = testing::random_ids(ids.size(), config.vocab, 2);
  GPT2Model<Scalar> full(config, {.seed = 3});
  typename GPT2Model<Scalar>::Cache cache;
  const Scalar loss = full.loss_and_backward({ids, batch, seq}, targets, cache);
  const index_t depth = (9 * config.n_layers + 2) * 2;
  const index_t longest = std::max({config.d_model, config.d_ff, seq, config.vocab});
  for (const index_t k : {2, 4}) {
    SCOPED_TRACE(k);
    GPT2Model<Scalar> micro(config, {.seed = 3});
    Scalar losses = 0;
    const index_t rows = batch / k;
    for (index_t part = 0; part < k; ++part) {
      const std::span<const index_t> part_ids(ids.data() + part * rows * seq,
                                              static_cast<std::size_t>(rows * seq));
      const std::span<const index_t> part_targets(targets.data() + part * rows * seq,
                                                  static_cast<std::size_t>(rows * seq));
      losses += micro.loss_and_backward({part_ids, rows, seq}, part_targets, cache);
    }
    scale_grad(micro, 1.0 / static_cast<double>(k));
    const double tolerance =
        2.0 * 4.0 * static_cast<double>(depth) * testing::gamma<Scalar>(longest) +
        testing::gamma<Scalar>(k);
    EXPECT_NEAR(losses / static_cast<Scalar>(k), loss, tolerance * std::abs(loss));
    std::vector<Tensor<Scalar, 1>> expected;
    full.for_each_parameter([&](const ParameterName&, auto, auto grad) {
      expected.emplace_back(Shape<1>{grad.size()});
      std::copy(grad.begin(), grad.end(), expected.back().data());
    });
    std::size_t i = 0;
    micro.for_each_parameter([&](const ParameterName& name, auto, auto grad) {
      SCOPED_TRACE(name.str());
      EXPECT_TRUE(normwise_close(grad, expected[i++], tolerance));
    });
    EXPECT_EQ(i, expected.size());
  }
}

}  // namespace test_gradients
}  // namespace dissect
