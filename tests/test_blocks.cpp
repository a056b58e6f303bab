// Tests for dissect/blocks.hpp: the fused-QKV and head layouts by hand, every block against
// PyTorch modules assembled the same way (fixtures), finite-difference gradients of every
// parameter and input, caches, accumulation, and the bad-input rows that apply to blocks.
#include "dissect/blocks.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <map>
#include <sstream>
#include <string>

#include "support/fixture.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_blocks {

using testing::gradcheck;
using testing::random_tensor;
using Matrix = Tensor<double, 2>;

// ---- the test's own view of the head layout -----------------------------------------------------
// Written out index by index, independent of detail/heads.hpp: feature j of head h of a part that
// starts at column `offset` of the fused rows [B·T, width] is column offset + h·d_k + j.

template <class Scalar>
Tensor<double, 4> heads_of(const Tensor<Scalar, 2>& rows, index_t batch, index_t tokens,
                           index_t offset, index_t n_heads, index_t head_dim) {
  Tensor<double, 4> heads({batch, n_heads, tokens, head_dim});
  for (index_t b = 0; b < batch; ++b)
    for (index_t h = 0; h < n_heads; ++h)
      for (index_t t = 0; t < tokens; ++t)
        for (index_t j = 0; j < head_dim; ++j)
          heads(b, h, t, j) = rows(b * tokens + t, offset + h * head_dim + j);
  return heads;
}

template <class Scalar>
void put_heads(const Tensor<Scalar, 4>& heads, index_t offset, Matrix& rows) {
  const index_t tokens = heads.dim(2), head_dim = heads.dim(3);
  for (index_t b = 0; b < heads.dim(0); ++b)
    for (index_t h = 0; h < heads.dim(1); ++h)
      for (index_t t = 0; t < tokens; ++t)
        for (index_t j = 0; j < head_dim; ++j)
          rows(b * tokens + t, offset + h * head_dim + j) = heads(b, h, t, j);
}

// ---- magnitudes and rounding bounds -------------------------------------------------------------
//
// As in test_linear.cpp, each computed value is within γ_L·scale of the exact one, where the scale
// is the same computation done on magnitudes and L the number of roundings along its longest
// path; two implementations are within twice that of each other. Products of magnitudes in
// double stand in for Σ|terms|. Through an activation f: |f(h)| ≤ |h|, |f'| ≤ 1.2 (GELU's slope
// peaks at 1.13, SiLU's at 1.10), |f''| ≤ 1 (GELU's curvature peaks at 2φ(0) = 0.80), and the
// formulas themselves round within γ_32 of their scales (see test_activation.cpp).

constexpr index_t activation_units = 32;
constexpr double slope_max = 1.2;
constexpr double curvature_max = 1.0;

/// Rounding scale of f'(h)·dy per unit |dy|, increasing in |h|, for every activation: GELU
/// ½(1 + |erf|) + |h|φ ≤ 1 + 0.4|h|; tanh-GELU ≤ 1 + 0.8|h| + 0.11|h|³; SiLU ≤ 1 + 2|h|.
double slope_formula_scale(double h) {
  return 1 + 2 * h + 0.11 * h * h * h;
}

Matrix abs_nt(ConstTensorView<double, 2> a,
              ConstTensorView<double, 2> b) {  // |a|·|b|ᵀ: [M, K], [N, K] → [M, N]
  Matrix result({a.dim(0), b.dim(0)});
  result.matrix() = testing::absolute(a).matrix() * testing::absolute(b).matrix().transpose();
  return result;
}
Matrix abs_nn(ConstTensorView<double, 2> a,
              ConstTensorView<double, 2> b) {  // |a|·|b|: [M, K], [K, N] → [M, N]
  Matrix result({a.dim(0), b.dim(1)});
  result.matrix() = testing::absolute(a).matrix() * testing::absolute(b).matrix();
  return result;
}
Matrix abs_tn(ConstTensorView<double, 2> a,
              ConstTensorView<double, 2> b) {  // |a|ᵀ·|b|: [M, N], [M, K] → [N, K]
  Matrix result({a.dim(1), b.dim(1)});
  result.matrix() = testing::absolute(a).matrix().transpose() * testing::absolute(b).matrix();
  return result;
}
Matrix abs_column_sums(ConstTensorView<double, 2> a) {  // Σ_m |a[m, :]| as [1, N]
  Matrix result({1, a.dim(1)});
  result.matrix() = testing::absolute(a).matrix().colwise().sum();
  return result;
}
Matrix plus_abs_bias(Matrix scale, const Linear<double>& layer) {
  if (layer.has_bias())
    scale.matrix().rowwise() += testing::absolute(layer.bias()).vector().transpose();
  return scale;
}
template <class F>
Matrix elementwise(Matrix a, F&& f) {
  for (double& v : a) v = f(v);
  return a;
}
Matrix product(Matrix a, ConstTensorView<double, 2> b) {  // a ⊙ b
  a.vector().array() *= b.vector().array();
  return a;
}

/// [B, T, K] (or any rank) as double rows [B·T, K].
template <class Scalar, std::size_t Rank>
Matrix rows_of(const Tensor<Scalar, Rank>& tensor) {
  const index_t width = tensor.dim(Rank - 1);
  return testing::to_double(tensor).reshape(Shape<2>{leading_count(tensor.shape()), width});
}

/// A scale and the rounding length that goes with it.
struct Scaled {
  Matrix scale;
  index_t length;
};

template <class Scalar>
Matrix bound_of(const Scaled& scaled) {
  const double factor = 2 * testing::gamma<Scalar>(std::max<index_t>(scaled.length, 1));
  return elementwise(scaled.scale, [&](double v) {
    return v * factor + std::numeric_limits<double>::denorm_min();
  });
}

/// The double-precision copy of a block's Linear, for computing magnitudes.
template <class Scalar>
Linear<double> as_double(const Linear<Scalar>& layer) {
  std::optional<Tensor<double, 1>> bias;
  if (layer.has_bias()) bias = testing::to_double(layer.bias());
  return Linear<double>(testing::to_double(layer.weight()), bias);
}

/// Scales of a QKV projection's fused output and gradients. d_fused: [B·T, (H + 2·H_kv)·d_k].
template <class Scalar>
std::map<std::string, Scaled> qkv_scales(const QKVProjection<Scalar>& block,
                                         const Tensor<Scalar, 3>& x,
                                         ConstTensorView<double, 2> d_fused) {
  const auto c_attn = as_double(block.qkv());
  const auto x2 = rows_of(x);
  const index_t rows = x2.dim(0), d_model = block.d_model(), width = c_attn.out_features();
  return {{"fused", {plus_abs_bias(abs_nt(x2, c_attn.weight()), c_attn), d_model + 1}},
          {"dx", {abs_nn(d_fused, c_attn.weight()), width}},
          {"dW", {abs_tn(d_fused, x2), rows}},
          {"db", {abs_column_sums(d_fused), rows}}};
}

/// Scales of FeedForward, derived in the banner above: h = up(x), a = f(h), y = down(a),
/// g = dy·W_down, dh = f'(h)·g.
template <class Scalar>
std::map<std::string, Scaled> mlp_scales(const FeedForward<Scalar>& block,
                                         const Tensor<Scalar, 3>& x, const Tensor<Scalar, 3>& dy) {
  const auto up = as_double(block.up()), down = as_double(block.down());
  const auto x2 = rows_of(x), dy2 = rows_of(dy);
  const index_t rows = x2.dim(0), d_model = block.d_model(), d_ff = block.d_ff();
  const Matrix h = plus_abs_bias(abs_nt(x2, up.weight()), up);
  const Matrix a = elementwise(h, [](double v) { return slope_max * v; });
  const Matrix g = abs_nn(dy2, down.weight());
  const Matrix dh = product(
      elementwise(h,
                  [](double v) { return slope_max + curvature_max * v + slope_formula_scale(v); }),
      g);
  const index_t h_length = d_model + 1, a_length = h_length + activation_units,
                dh_length = h_length + d_model + activation_units;
  return {{"y", {plus_abs_bias(abs_nt(a, down.weight()), down), a_length + d_ff + 1}},
          {"dx", {abs_nn(dh, up.weight()), dh_length + d_ff}},
          {"dW_up", {abs_tn(dh, x2), dh_length + rows}},
          {"db_up", {abs_column_sums(dh), dh_length + rows}},
          {"dW_down", {abs_tn(dy2, a), a_length + rows}},
          {"db_down", {abs_column_sums(dy2), rows}},
          {"h", {h, h_length}}};
}

/// Scales of GatedFeedForward: gate = x·W_gate, up = x·W_up, z = silu(gate)·up, y = down(z),
/// m = dy·W_down; d_up = m·silu(gate) and d_gate = silu'(gate)·(m·up), each error term bounded
/// as for FeedForward (SiLU: slope ≤ 1.1, curvature ≤ 0.5, formula scale ≤ 1 + 2|g|).
template <class Scalar>
std::map<std::string, Scaled> swiglu_scales(const GatedFeedForward<Scalar>& block,
                                            const Tensor<Scalar, 3>& x,
                                            const Tensor<Scalar, 3>& dy) {
  const auto gate = as_double(block.gate()), up = as_double(block.up()),
             down = as_double(block.down());
  const auto x2 = rows_of(x), dy2 = rows_of(dy);
  const index_t rows = x2.dim(0), d_model = block.d_model(), d_ff = block.d_ff();
  const Matrix g = plus_abs_bias(abs_nt(x2, gate.weight()), gate);
  const Matrix u = plus_abs_bias(abs_nt(x2, up.weight()), up);
  const Matrix z = elementwise(product(g, u), [](double v) { return 4 * v; });
  const Matrix m = abs_nn(dy2, down.weight());
  const Matrix d_up = elementwise(product(m, g), [](double v) { return 4 * v; });
  const Matrix d_gate = product(product(m, u), elementwise(g, [](double v) { return 4 + 3 * v; }));
  const index_t in_length = d_model + 1, z_length = in_length + activation_units + 1,
                d_length = d_model + in_length + activation_units + 2;
  Matrix dx = abs_nn(d_gate, gate.weight());
  dx.vector() += abs_nn(d_up, up.weight()).vector();
  return {{"y", {plus_abs_bias(abs_nt(z, down.weight()), down), z_length + d_ff + 1}},
          {"dx", {dx, d_length + 2 * d_ff + 1}},
          {"dW_gate", {abs_tn(d_gate, x2), d_length + rows}},
          {"db_gate", {abs_column_sums(d_gate), d_length + rows}},
          {"dW_up", {abs_tn(d_up, x2), d_length + rows}},
          {"db_up", {abs_column_sums(d_up), d_length + rows}},
          {"dW_down", {abs_tn(dy2, z), z_length + rows}},
          {"db_down", {abs_column_sums(dy2), rows}}};
}

// ---- construction, parameters, printing ---------------------------------------------------------

TEST(Blocks, Gpt2SmallShapesAndParameterCounts) {
  QKVProjection<float> qkv(768, 12);
  EXPECT_EQ(qkv.head_dim(), 64);
  EXPECT_EQ(qkv.n_kv_heads(), 12);
  EXPECT_EQ(qkv.qkv().weight().shape(), (Shape<2>{2304, 768}));  // c_attn: [3D, D]
  EXPECT_EQ(qkv.parameter_count(), 1'771'776);                   // 3·768² + 3·768
  AttentionOutput<float> out(768, 12);
  EXPECT_EQ(out.proj().weight().shape(), (Shape<2>{768, 768}));
  EXPECT_EQ(out.parameter_count(), 590'592);  // 768² + 768
  FeedForward<float> mlp(768);
  EXPECT_EQ(mlp.d_ff(), 3072);  // 4·D by default
  EXPECT_EQ(mlp.activation(), Activation::gelu_tanh);
  EXPECT_EQ(mlp.up().weight().shape(), (Shape<2>{3072, 768}));
  EXPECT_EQ(mlp.down().weight().shape(), (Shape<2>{768, 3072}));
  EXPECT_EQ(mlp.parameter_count(), 4'722'432);  // 2·768·3072 + 3072 + 768
  // GPT-2 small's attention and MLP weights per layer: 7,084,800 (+ 2 LayerNorms = 7,087,872).
  EXPECT_EQ(qkv.parameter_count() + out.parameter_count() + mlp.parameter_count(), 7'084'800);
}

TEST(Blocks, GroupedQueryShapesAndSwiGluWithoutBiases) {
  QKVProjection<float> gqa(512, 8, {.n_kv_heads = 2});
  EXPECT_EQ(gqa.head_dim(), 64);
  EXPECT_EQ(gqa.qkv().weight().shape(), (Shape<2>{(8 + 2 * 2) * 64, 512}));  // [768, 512]
  EXPECT_EQ(gqa.parameter_count(), 768 * 512 + 768);
  QKVProjection<float> mqa(512, 8, {.n_kv_heads = 1, .bias = false});
  EXPECT_EQ(mqa.parameter_count(), (8 + 2) * 64 * 512);
  GatedFeedForward<float> swiglu(64, 172);
  EXPECT_FALSE(swiglu.gate().has_bias() || swiglu.up().has_bias() || swiglu.down().has_bias());
  EXPECT_EQ(swiglu.parameter_count(), 3 * 64 * 172);  // 33,024
  EXPECT_EQ(swiglu.down().weight().shape(), (Shape<2>{64, 172}));
  GatedFeedForward<float> with_bias(4, 6, {.bias = true});
  EXPECT_EQ(with_bias.parameter_count(), 3 * 4 * 6 + 6 + 6 + 4);
}

TEST(Blocks, PrintLikeModules) {
  std::ostringstream out;
  out << QKVProjection<float>(8, 4, {.n_kv_heads = 2}) << '\n'
      << AttentionOutput<float>(8, 4, {.bias = false}) << '\n'
      << FeedForward<float>(8, 16, Activation::relu) << '\n'
      << GatedFeedForward<float>(8, 12);
  EXPECT_EQ(out.str(),
            "QKVProjection(d_model=8, n_heads=4, n_kv_heads=2, bias=true)\n"
            "AttentionOutput(d_model=8, n_heads=4, bias=false)\n"
            "FeedForward(d_model=8, d_ff=16, activation=relu, bias=true)\n"
            "GatedFeedForward(d_model=8, d_ff=12, bias=false)");
}

TEST(Blocks, SeedsMakeBlocksReproducibleAndMembersDistinct) {
  GatedFeedForward<float> a(8, 8, {.seed = 5}), b(8, 8, {.seed = 5});
  EXPECT_TENSOR_EQ(a.gate().weight(), b.gate().weight());
  EXPECT_TENSOR_EQ(a.down().weight(), b.down().weight());
  // gate and up have the same shape; they must not start equal (seed, seed + 1).
  EXPECT_FALSE(allclose(a.gate().weight(), a.up().weight()));
  // Without a seed, two blocks draw different seeds.
  FeedForward<float> c(8, 8), d(8, 8);
  EXPECT_FALSE(allclose(c.up().weight(), d.up().weight()));
  // Options reach every member.
  FeedForward<double> zeros(4, 6, Activation::silu, {.bias = false, .init = InitScheme::zeros});
  EXPECT_FALSE(zeros.up().has_bias() || zeros.down().has_bias());
  for (double v : zeros.up().weight()) EXPECT_EQ(v, 0.0);
  for (double v : zeros.down().weight()) EXPECT_EQ(v, 0.0);
}

// ---- layouts by hand ----------------------------------------------------------------------------

TEST(Blocks, FusedRowsSplitQueriesThenKeysThenValuesHeadByHead) {
  // W = 0 and b[r] = r: the fused output of every token is 0, 1, …, (H + 2·H_kv)·d_k − 1, so each
  // q/k/v element names the fused row it came from.
  const index_t d_model = 8, n_heads = 4, n_kv = 2, d_k = 2;
  QKVProjection<double> block(d_model, n_heads, {.n_kv_heads = n_kv, .init = InitScheme::zeros});
  Tensor<double, 1> bias({(n_heads + 2 * n_kv) * d_k});
  for (index_t r = 0; r < bias.size(); ++r) bias(r) = double(r);
  block.qkv().set_bias(bias);
  std::mt19937_64 engine(1);
  const auto x = random_tensor<double, 3>({2, 3, d_model}, engine);
  const auto [q, k, v] = block.forward(x);
  ASSERT_EQ(q.shape(), (Shape<4>{2, n_heads, 3, d_k}));
  ASSERT_EQ(k.shape(), (Shape<4>{2, n_kv, 3, d_k}));
  ASSERT_EQ(v.shape(), (Shape<4>{2, n_kv, 3, d_k}));
  for (index_t b = 0; b < 2; ++b)
    for (index_t t = 0; t < 3; ++t)
      for (index_t j = 0; j < d_k; ++j) {
        for (index_t h = 0; h < n_heads; ++h) EXPECT_EQ(q(b, h, t, j), double(h * d_k + j));
        for (index_t h = 0; h < n_kv; ++h) {
          EXPECT_EQ(k(b, h, t, j), double(n_heads * d_k + h * d_k + j));
          EXPECT_EQ(v(b, h, t, j), double((n_heads + n_kv) * d_k + h * d_k + j));
        }
      }
}

TEST(Blocks, AttentionOutputMergesHeadsIntoFeatures) {
  // With W = I and no bias the output is the merged input: y[b, t, h·d_k + j] = a[b, h, t, j].
  const index_t d_model = 6, n_heads = 3;
  AttentionOutput<double> block(d_model, n_heads, {.bias = false});
  Tensor<double, 2> identity({d_model, d_model});
  for (index_t i = 0; i < d_model; ++i) identity(i, i) = 1.0;
  block.proj().set_weight(identity);
  std::mt19937_64 engine(2);
  const auto a = random_tensor<double, 4>({2, n_heads, 4, 2}, engine);
  const auto y = block.forward(a);
  ASSERT_EQ(y.shape(), (Shape<3>{2, 4, d_model}));
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < n_heads; ++h)
      for (index_t t = 0; t < 4; ++t)
        for (index_t j = 0; j < 2; ++j) EXPECT_EQ(y(b, t, h * 2 + j), a(b, h, t, j));
  // And backward splits dy the same way: da = merge⁻¹(dy·I).
  const auto dy = random_tensor<double, 3>({2, 4, d_model}, engine);
  const auto da = block.backward(a, dy);
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < n_heads; ++h)
      for (index_t t = 0; t < 4; ++t)
        for (index_t j = 0; j < 2; ++j) EXPECT_EQ(da(b, h, t, j), dy(b, t, h * 2 + j));
}

TEST(Blocks, FeedForwardsAreTheCompositionOfTheirParts) {
  // Bitwise: the blocks add no arithmetic of their own beyond their members and activations.
  std::mt19937_64 engine(3);
  const auto x = random_tensor<float, 3>({2, 3, 8}, engine);
  for (Activation activation :
       {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu}) {
    FeedForward<float> mlp(8, 20, activation, {.seed = 4});
    const auto expected = mlp.down().forward(activate(mlp.up().forward(x), activation));
    EXPECT_TENSOR_EQ(mlp.forward(x), expected);
  }
  GatedFeedForward<float> swiglu(8, 12, {.seed = 5});
  auto hidden = silu(swiglu.gate().forward(x));
  hidden.vector().array() *= swiglu.up().forward(x).vector().array();
  EXPECT_TENSOR_EQ(swiglu.forward(x), swiglu.down().forward(hidden));
}

// ---- caches, accumulation, empty batches --------------------------------------------------------

TEST(Blocks, CachedForwardEqualsPlainForwardAndReusesItsBuffers) {
  std::mt19937_64 engine(6);
  const auto x = random_tensor<double, 3>({2, 3, 8}, engine);
  const auto x2 = random_tensor<double, 3>({2, 3, 8}, engine);
  FeedForward<double> mlp(8, 16, Activation::gelu, {.seed = 7});
  FeedForward<double>::Cache cache;
  EXPECT_TENSOR_EQ(mlp.forward(x, cache), mlp.forward(x));
  EXPECT_TENSOR_EQ(cache.hidden, mlp.up().forward(x));
  EXPECT_TENSOR_EQ(cache.activated, activate(cache.hidden, Activation::gelu));
  const double* hidden_buffer = cache.hidden.data();
  const double* activated_buffer = cache.activated.data();
  EXPECT_TENSOR_EQ(mlp.forward(x2, cache), mlp.forward(x2));
  EXPECT_EQ(cache.hidden.data(), hidden_buffer);  // same shape: no new allocation
  EXPECT_EQ(cache.activated.data(), activated_buffer);

  GatedFeedForward<double> swiglu(8, 12, {.seed = 8});
  GatedFeedForward<double>::Cache gated;
  EXPECT_TENSOR_EQ(swiglu.forward(x, gated), swiglu.forward(x));
  const double* gate_buffer = gated.gate.data();
  EXPECT_TENSOR_EQ(swiglu.forward(x2, gated), swiglu.forward(x2));
  EXPECT_EQ(gated.gate.data(), gate_buffer);
  // A cache of another shape is replaced, not misused.
  const auto longer = random_tensor<double, 3>({1, 5, 8}, engine);
  EXPECT_TENSOR_EQ(swiglu.forward(longer, gated), swiglu.forward(longer));
  EXPECT_EQ(gated.hidden.shape(), (Shape<3>{1, 5, 12}));
}

TEST(Blocks, GradientsAccumulateUntilZeroGrad) {
  std::mt19937_64 engine(9);
  const auto x = random_tensor<double, 3>({2, 3, 8}, engine);
  const auto dy = random_tensor<double, 3>({2, 3, 8}, engine);
  GatedFeedForward<double> block(8, 12, {.bias = true, .seed = 10});
  GatedFeedForward<double>::Cache cache;
  block.forward(x, cache);
  block.backward(x, cache, dy);
  const auto once = testing::snapshot(block.up().weight_grad());
  const auto once_bias = testing::snapshot(block.down().bias_grad());
  block.backward(x, cache, dy);
  for (index_t i = 0; i < once.size(); ++i)
    EXPECT_DOUBLE_EQ(block.up().weight_grad().data()[i], 2 * once.data()[i]);
  for (index_t i = 0; i < once_bias.size(); ++i)
    EXPECT_DOUBLE_EQ(block.down().bias_grad().data()[i], 2 * once_bias.data()[i]);
  block.zero_grad();
  for (const Linear<double>* layer : {&block.gate(), &block.up(), &block.down()}) {
    for (double v : layer->weight_grad()) EXPECT_EQ(v, 0.0);
    for (double v : layer->bias_grad()) EXPECT_EQ(v, 0.0);
  }
  QKVProjection<double> qkv(8, 4, {.n_kv_heads = 2, .seed = 11});
  auto grads = qkv.forward(x);
  qkv.backward(x, grads);
  qkv.zero_grad();
  for (double v : qkv.qkv().weight_grad()) EXPECT_EQ(v, 0.0);
}

TEST(Blocks, EmptyBatchesAndSequencesAreValid) {
  for (Shape<3> shape : {Shape<3>{0, 3, 8}, Shape<3>{2, 0, 8}}) {
    SCOPED_TRACE(format_shape(shape));
    const Tensor<float, 3> x(shape);
    QKVProjection<float> qkv(8, 4, {.n_kv_heads = 2, .seed = 1});
    const auto out = qkv.forward(x);
    EXPECT_EQ(out.q.shape(), (Shape<4>{shape[0], 4, shape[1], 2}));
    EXPECT_EQ(qkv.backward(x, out).shape(), shape);
    for (float v : qkv.qkv().weight_grad()) EXPECT_EQ(v, 0.0f);
    AttentionOutput<float> proj(8, 4, {.seed = 2});
    const auto a = Tensor<float, 4>({shape[0], 4, shape[1], 2});
    EXPECT_EQ(proj.forward(a).shape(), shape);
    EXPECT_EQ(proj.backward(a, x).shape(), a.shape());
    FeedForward<float> mlp(8, 16, Activation::gelu_tanh, {.seed = 3});
    FeedForward<float>::Cache cache;
    EXPECT_EQ(mlp.forward(x, cache).shape(), shape);
    EXPECT_EQ(mlp.backward(x, cache, x).shape(), shape);
    for (float v : mlp.up().bias_grad()) EXPECT_EQ(v, 0.0f);
    GatedFeedForward<float> swiglu(8, 12, {.seed = 4});
    GatedFeedForward<float>::Cache gated;
    EXPECT_EQ(swiglu.forward(x, gated).shape(), shape);
    EXPECT_EQ(swiglu.backward(x, gated, x).shape(), shape);
  }
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

using testing::tensor_from;

template <class Scalar>
void load(Linear<Scalar>& layer, const testing::Fixture& fixture, const std::string& suffix) {
  layer.set_weight(tensor_from<Scalar, 2>(fixture.tensor("W" + suffix)));
  if (layer.has_bias()) layer.set_bias(tensor_from<Scalar, 1>(fixture.tensor("b" + suffix)));
}

/// Compares a block's gradient with the fixture's, laid out as [rows, cols] (a bias as [1, N]).
template <TensorLike Ours>
void expect_near_torch(const char* name, const Ours& ours_tensor, const testing::Fixture& fixture,
                       const Scaled& scaled) {
  using Scalar = scalar_of<Ours>;
  constexpr std::size_t Rank = rank_of<Ours>;
  const auto ours = const_view(ours_tensor);
  SCOPED_TRACE(name);
  const auto torch = tensor_from<Scalar, Rank>(fixture.tensor(name));
  const auto bound = bound_of<Scalar>(scaled);
  const index_t rows = Rank == 1 ? 1 : leading_count(ours.shape());
  const Shape<2> as_rows{rows, ours.dim(Rank - 1)};
  // Two declarations: ours is a const view and torch a tensor, so the reshapes' types differ
  // (clang refuses one `auto` for both).
  const auto ours_rows = ours.reshape(as_rows);
  const auto torch_rows = torch.reshape(as_rows);
  EXPECT_TENSOR_WITHIN(ours_rows, torch_rows, bound);
}

template <class Scalar>
void check_qkv_fixture(const testing::Fixture& fixture) {
  const index_t batch = fixture.meta_int("B"), tokens = fixture.meta_int("T"),
                n_heads = fixture.meta_int("H"), n_kv = fixture.meta_int("H_kv");
  QKVProjection<Scalar> block(fixture.meta_int("D"), n_heads,
                              {.n_kv_heads = n_kv, .bias = fixture.meta_bool("bias")});
  load(block.qkv(), fixture, "");
  const auto x = tensor_from<Scalar, 3>(fixture.tensor("x"));
  const QKV<Scalar> grads{tensor_from<Scalar, 4>(fixture.tensor("dq")),
                          tensor_from<Scalar, 4>(fixture.tensor("dk")),
                          tensor_from<Scalar, 4>(fixture.tensor("dv"))};
  const index_t d_k = block.head_dim();
  Matrix d_fused({batch * tokens, (n_heads + 2 * n_kv) * d_k});
  put_heads(grads.q, 0, d_fused);
  put_heads(grads.k, n_heads * d_k, d_fused);
  put_heads(grads.v, (n_heads + n_kv) * d_k, d_fused);
  const auto scales = qkv_scales(block, x, d_fused);
  const auto fused_bound = bound_of<Scalar>(scales.at("fused"));

  const auto [q, k, v] = block.forward(x);
  const auto dx = block.backward(x, grads);
  const auto q_torch = tensor_from<Scalar, 4>(fixture.tensor("q"));
  const auto k_torch = tensor_from<Scalar, 4>(fixture.tensor("k"));
  const auto v_torch = tensor_from<Scalar, 4>(fixture.tensor("v"));
  const auto q_bound = heads_of(fused_bound, batch, tokens, 0, n_heads, d_k);
  const auto k_bound = heads_of(fused_bound, batch, tokens, n_heads * d_k, n_kv, d_k);
  const auto v_bound = heads_of(fused_bound, batch, tokens, (n_heads + n_kv) * d_k, n_kv, d_k);
  EXPECT_TENSOR_WITHIN(q, q_torch, q_bound);
  EXPECT_TENSOR_WITHIN(k, k_torch, k_bound);
  EXPECT_TENSOR_WITHIN(v, v_torch, v_bound);
  expect_near_torch("dx", dx, fixture, scales.at("dx"));
  expect_near_torch("dW", block.qkv().weight_grad(), fixture, scales.at("dW"));
  if (block.qkv().has_bias())
    expect_near_torch("db", block.qkv().bias_grad(), fixture, scales.at("db"));
}

template <class Scalar>
void check_attention_output_fixture(const testing::Fixture& fixture) {
  const index_t batch = fixture.meta_int("B"), tokens = fixture.meta_int("T"),
                d_model = fixture.meta_int("D"), n_heads = fixture.meta_int("H");
  AttentionOutput<Scalar> block(d_model, n_heads, {.bias = fixture.meta_bool("bias")});
  load(block.proj(), fixture, "");
  const auto a = tensor_from<Scalar, 4>(fixture.tensor("a"));
  const auto dy = tensor_from<Scalar, 3>(fixture.tensor("dy"));
  Matrix merged({batch * tokens, d_model});
  put_heads(a, 0, merged);
  const auto proj = as_double(block.proj());
  const auto dy2 = rows_of(dy);
  const Scaled y_scale{plus_abs_bias(abs_nt(merged, proj.weight()), proj), d_model + 1};
  const auto d_merged_bound = bound_of<Scalar>({abs_nn(dy2, proj.weight()), d_model});

  const auto y = block.forward(a);
  const auto da = block.backward(a, dy);
  expect_near_torch("y", y, fixture, y_scale);
  const auto da_torch = tensor_from<Scalar, 4>(fixture.tensor("da"));
  const auto da_bound = heads_of(d_merged_bound, batch, tokens, 0, n_heads, d_model / n_heads);
  EXPECT_TENSOR_WITHIN(da, da_torch, da_bound);
  expect_near_torch("dW", block.proj().weight_grad(), fixture,
                    {abs_tn(dy2, merged), batch * tokens});
  if (block.proj().has_bias())
    expect_near_torch("db", block.proj().bias_grad(), fixture,
                      {abs_column_sums(dy2), batch * tokens});
}

Activation activation_named(const std::string& name) {
  for (Activation a : {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu})
    if (name == to_string(a)) return a;
  throw std::runtime_error("unknown activation " + name);
}

template <class Scalar>
void check_mlp_fixture(const testing::Fixture& fixture) {
  const auto activation = activation_named(fixture.meta_str("activation"));
  FeedForward<Scalar> block(fixture.meta_int("D"), fixture.meta_int("F"), activation,
                            {.bias = fixture.meta_bool("bias")});
  load(block.up(), fixture, "_up");
  load(block.down(), fixture, "_down");
  const auto x = tensor_from<Scalar, 3>(fixture.tensor("x"));
  const auto dy = tensor_from<Scalar, 3>(fixture.tensor("dy"));
  const auto scales = mlp_scales(block, x, dy);
  if (activation == Activation::relu) {
    // A pre-activation within rounding of ReLU's kink could take the other branch in PyTorch;
    // the fixture must keep clear of it for the bound to apply.
    const auto h = as_double(block.up()).forward(rows_of(x));
    const auto h_bound = bound_of<Scalar>(scales.at("h"));
    for (index_t i = 0; i < h.size(); ++i) ASSERT_GT(std::abs(h.data()[i]), h_bound.data()[i]);
  }

  typename FeedForward<Scalar>::Cache cache;
  const auto y = block.forward(x, cache);
  const auto dx = block.backward(x, cache, dy);
  expect_near_torch("y", y, fixture, scales.at("y"));
  expect_near_torch("dx", dx, fixture, scales.at("dx"));
  expect_near_torch("dW_up", block.up().weight_grad(), fixture, scales.at("dW_up"));
  expect_near_torch("dW_down", block.down().weight_grad(), fixture, scales.at("dW_down"));
  if (block.up().has_bias()) {
    expect_near_torch("db_up", block.up().bias_grad(), fixture, scales.at("db_up"));
    expect_near_torch("db_down", block.down().bias_grad(), fixture, scales.at("db_down"));
  }
}

template <class Scalar>
void check_swiglu_fixture(const testing::Fixture& fixture) {
  GatedFeedForward<Scalar> block(fixture.meta_int("D"), fixture.meta_int("F"),
                                 {.bias = fixture.meta_bool("bias")});
  load(block.gate(), fixture, "_gate");
  load(block.up(), fixture, "_up");
  load(block.down(), fixture, "_down");
  const auto x = tensor_from<Scalar, 3>(fixture.tensor("x"));
  const auto dy = tensor_from<Scalar, 3>(fixture.tensor("dy"));
  const auto scales = swiglu_scales(block, x, dy);

  typename GatedFeedForward<Scalar>::Cache cache;
  const auto y = block.forward(x, cache);
  const auto dx = block.backward(x, cache, dy);
  expect_near_torch("y", y, fixture, scales.at("y"));
  expect_near_torch("dx", dx, fixture, scales.at("dx"));
  expect_near_torch("dW_gate", block.gate().weight_grad(), fixture, scales.at("dW_gate"));
  expect_near_torch("dW_up", block.up().weight_grad(), fixture, scales.at("dW_up"));
  expect_near_torch("dW_down", block.down().weight_grad(), fixture, scales.at("dW_down"));
  if (block.gate().has_bias()) {
    expect_near_torch("db_gate", block.gate().bias_grad(), fixture, scales.at("db_gate"));
    expect_near_torch("db_up", block.up().bias_grad(), fixture, scales.at("db_up"));
    expect_near_torch("db_down", block.down().bias_grad(), fixture, scales.at("db_down"));
  }
}

template <class Scalar>
class BlockFixtures : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(BlockFixtures, Scalars);

TYPED_TEST(BlockFixtures, AgreeWithTorchModulesForwardAndAutograd) {
  const std::string dtype = std::is_same_v<TypeParam, float> ? "float32" : "float64";
  std::map<std::string, int> cases;
  for (const auto& path : testing::list_fixtures(testing::fixture_dir("blocks"))) {
    const auto fixture = testing::read_fixture(path);
    if (fixture.dtype != dtype) continue;
    SCOPED_TRACE(fixture.case_name);
    const std::string kind = fixture.meta_str("kind");
    ++cases[kind];
    if (kind == "qkv") {
      check_qkv_fixture<TypeParam>(fixture);
    } else if (kind == "attention_output") {
      check_attention_output_fixture<TypeParam>(fixture);
    } else if (kind == "mlp") {
      check_mlp_fixture<TypeParam>(fixture);
    } else if (kind == "swiglu") {
      check_swiglu_fixture<TypeParam>(fixture);
    } else if (kind != "activations") {  // test_activation.cpp reads those
      ADD_FAILURE() << "unknown fixture kind " << kind;
    }
  }
  // Regenerate with tests/reference/generate_fixtures.py if these are missing.
  EXPECT_GE(cases["qkv"], 3);
  EXPECT_GE(cases["attention_output"], 2);
  EXPECT_GE(cases["mlp"], 5);
  EXPECT_GE(cases["swiglu"], 2);
}

// ---- gradients by finite differences ------------------------------------------------------------
//
// Every element of every parameter and of the input, in double. The loss is Σ outputs ⊙ g, so
// its exact gradients are backward(…, g). Error budget per element: each evaluation of the loss
// is within γ_n·S of exact (S its scale, n its rounding length), so the central difference over
// the step actually taken is within γ_n·S/h; its truncation, h²/6·L''', is estimated by
// Richardson as |D(h) − D(2h)|/3 (zero where the loss is linear in the value). Twice their sum is
// allowed.

/// That budget, at h = 1e-5.
testing::GradcheckOptions budget(double loss_rounding) {
  return testing::GradcheckOptions::error_budget(1e-5, loss_rounding);
}

template <std::size_t Rank>
double dot(const Tensor<double, Rank>& a, const Tensor<double, Rank>& b) {
  double sum = 0;
  for (index_t i = 0; i < a.size(); ++i) sum += a.data()[i] * b.data()[i];
  return sum;
}

/// γ_n·S for the loss Σ y ⊙ g, given y's scale (in y's row layout) and rounding length.
double loss_rounding(const Scaled& y, ConstTensorView<double, 2> g_rows) {
  const double scale = dot(testing::absolute(g_rows), y.scale);
  return testing::gamma<double>(y.length + g_rows.size()) * scale;
}

/// Checks dW and db of `layer` (already filled by one backward) against the loss.
template <class Loss>
void expect_layer_gradients(const std::string& name, Linear<double>& layer, double rounding,
                            Loss&& loss) {
  ASSERT_GRADIENT_OK(gradcheck(loss, layer.weight(), layer.weight_grad(), budget(rounding)))
      << name << ".dW";
  if (layer.has_bias()) {
    ASSERT_GRADIENT_OK(gradcheck(loss, layer.bias(), layer.bias_grad(), budget(rounding)))
        << name << ".db";
  }
}

TEST(BlockGradients, QKVProjectionMatchesFiniteDifferences) {
  struct Case {
    Shape<3> x;
    index_t n_heads, n_kv;
    bool bias;
  };
  std::mt19937_64 engine(41);
  for (const Case& c : {Case{{2, 3, 8}, 2, 2, true}, Case{{2, 3, 8}, 4, 2, false},
                        Case{{2, 3, 8}, 4, 2, true}, Case{{1, 4, 6}, 3, 1, true}}) {
    SCOPED_TRACE(testing::concat_for_trace("x", format_shape(c.x), "H", c.n_heads, "H_kv", c.n_kv));
    QKVProjection<double> block(c.x[2], c.n_heads, {.n_kv_heads = c.n_kv, .bias = c.bias});
    auto x = random_tensor<double, 3>(c.x, engine);
    auto g = block.forward(x);  // only for the shapes
    for (auto* part : {&g.q, &g.k, &g.v}) *part = random_tensor<double, 4>(part->shape(), engine);
    auto loss = [&] {
      const auto out = block.forward(x);
      return dot(out.q, g.q) + dot(out.k, g.k) + dot(out.v, g.v);
    };
    const auto dx = block.backward(x, g);
    const index_t d_k = block.head_dim();
    Matrix g_fused({c.x[0] * c.x[1], (c.n_heads + 2 * c.n_kv) * d_k});
    put_heads(g.q, 0, g_fused);
    put_heads(g.k, c.n_heads * d_k, g_fused);
    put_heads(g.v, (c.n_heads + c.n_kv) * d_k, g_fused);
    const double rounding = loss_rounding(qkv_scales(block, x, g_fused).at("fused"), g_fused);
    ASSERT_GRADIENT_OK(gradcheck(loss, x, dx, budget(rounding)));
    expect_layer_gradients("qkv", block.qkv(), rounding, loss);
    if (HasFatalFailure()) return;
  }
}

TEST(BlockGradients, AttentionOutputMatchesFiniteDifferences) {
  std::mt19937_64 engine(42);
  for (auto [shape, bias] :
       {std::pair{Shape<4>{2, 2, 3, 4}, true}, std::pair{Shape<4>{1, 3, 4, 2}, false}}) {
    SCOPED_TRACE(format_shape(shape));
    const index_t d_model = shape[1] * shape[3];
    AttentionOutput<double> block(d_model, shape[1], {.bias = bias});
    auto a = random_tensor<double, 4>(shape, engine);
    const auto g = random_tensor<double, 3>({shape[0], shape[2], d_model}, engine);
    auto loss = [&] { return dot(block.forward(a), g); };
    const auto da = block.backward(a, g);
    Matrix merged({shape[0] * shape[2], d_model});
    put_heads(a, 0, merged);
    const auto proj = as_double(block.proj());
    const double rounding = loss_rounding(
        {plus_abs_bias(abs_nt(merged, proj.weight()), proj), d_model + 1}, rows_of(g));
    ASSERT_GRADIENT_OK(gradcheck(loss, a, da, budget(rounding)));
    expect_layer_gradients("proj", block.proj(), rounding, loss);
    if (HasFatalFailure()) return;
  }
}

TEST(BlockGradients, FeedForwardMatchesFiniteDifferencesForEveryActivation) {
  std::mt19937_64 engine(43);
  struct Case {
    Shape<3> x;
    std::optional<index_t> d_ff;
    Activation activation;
    bool bias;
  };
  for (const Case& c :
       {Case{{2, 3, 4}, 6, Activation::relu, true}, Case{{2, 3, 4}, 6, Activation::gelu, true},
        Case{{2, 3, 4}, 6, Activation::silu, false},
        Case{{2, 3, 8}, std::nullopt, Activation::gelu_tanh, true},
        Case{{1, 4, 6}, 10, Activation::gelu_tanh, false}}) {
    SCOPED_TRACE(testing::concat_for_trace("x", format_shape(c.x), c.activation));
    FeedForward<double> block(c.x[2], c.d_ff, c.activation, {.bias = c.bias});
    auto x = random_tensor<double, 3>(c.x, engine);
    const auto g = random_tensor<double, 3>(c.x, engine);
    auto loss = [&] { return dot(block.forward(x), g); };
    FeedForward<double>::Cache cache;
    block.forward(x, cache);
    const auto dx = block.backward(x, cache, g);
    const double rounding = loss_rounding(mlp_scales(block, x, g).at("y"), rows_of(g));
    ASSERT_GRADIENT_OK(gradcheck(loss, x, dx, budget(rounding)));
    expect_layer_gradients("up", block.up(), rounding, loss);
    expect_layer_gradients("down", block.down(), rounding, loss);
    if (HasFatalFailure()) return;
  }
}

TEST(BlockGradients, GatedFeedForwardMatchesFiniteDifferences) {
  std::mt19937_64 engine(44);
  for (auto [shape, d_ff, bias] : {std::tuple{Shape<3>{2, 3, 8}, index_t{12}, false},
                                   std::tuple{Shape<3>{1, 4, 6}, index_t{10}, true}}) {
    SCOPED_TRACE(format_shape(shape));
    GatedFeedForward<double> block(shape[2], d_ff, {.bias = bias});
    auto x = random_tensor<double, 3>(shape, engine);
    const auto g = random_tensor<double, 3>(shape, engine);
    auto loss = [&] { return dot(block.forward(x), g); };
    GatedFeedForward<double>::Cache cache;
    block.forward(x, cache);
    const auto dx = block.backward(x, cache, g);
    const double rounding = loss_rounding(swiglu_scales(block, x, g).at("y"), rows_of(g));
    ASSERT_GRADIENT_OK(gradcheck(loss, x, dx, budget(rounding)));
    expect_layer_gradients("gate", block.gate(), rounding, loss);
    expect_layer_gradients("up", block.up(), rounding, loss);
    expect_layer_gradients("down", block.down(), rounding, loss);
    if (HasFatalFailure()) return;
  }
}

// ---- the bad-input rows that apply --------------------------------------------------------------

TEST(BlockErrors, ImpossibleConfigurationsNameTheField) {  // reliability.md row 15
  EXPECT_THROW_WITH(QKVProjection<float>(10, 3), ConfigError,
                    "QKVProjection: d_model 10 is not divisible by n_heads 3");
  EXPECT_THROW_WITH(QKVProjection<float>(8, 4, {.n_kv_heads = 3}), ConfigError,
                    "QKVProjection: n_kv_heads 3 does not divide n_heads 4");
  EXPECT_THROW_WITH(QKVProjection<float>(0, 4), ConfigError,
                    "QKVProjection: d_model must be > 0 (got 0)");
  EXPECT_THROW_WITH(QKVProjection<float>(8, -2), ConfigError,
                    "QKVProjection: n_heads must be > 0 (got -2)");
  EXPECT_THROW_WITH(QKVProjection<float>(8, 4, {.n_kv_heads = 0}), ConfigError,
                    "QKVProjection: n_kv_heads must be > 0 (got 0)");
  EXPECT_THROW_WITH(AttentionOutput<float>(12, 5), ConfigError,
                    "AttentionOutput: d_model 12 is not divisible by n_heads 5");
  EXPECT_THROW_WITH(AttentionOutput<float>(8, 0), ConfigError,
                    "AttentionOutput: n_heads must be > 0 (got 0)");
  EXPECT_THROW_WITH(FeedForward<float>(0), ConfigError, "FeedForward: d_model must be > 0 (got 0)");
  EXPECT_THROW_WITH(FeedForward<float>(8, 0), ConfigError, "FeedForward: d_ff must be > 0 (got 0)");
  EXPECT_THROW_WITH(
      FeedForward<float>(8, 16, static_cast<Activation>(9)), ConfigError,
      "FeedForward: Activation(9) is out of range (known: relu, gelu, gelu_tanh, silu)");
  EXPECT_THROW_WITH(GatedFeedForward<float>(8, -1), ConfigError,
                    "GatedFeedForward: d_ff must be > 0 (got -1)");
  EXPECT_THROW_WITH(GatedFeedForward<float>(-8, 4), ConfigError,
                    "GatedFeedForward: d_model must be > 0 (got -8)");
}

TEST(BlockErrors, QKVProjectionShapesNameTheStage) {
  QKVProjection<float> gpt2(768, 12, {.seed = 1});
  EXPECT_THROW_WITH(gpt2.forward(Tensor<float, 3>({2, 5, 512})), ShapeError,
                    "QKVProjection::forward: x must be [B, T, D=768], got [2, 5, 512]");
  QKVProjection<float> block(8, 4, {.n_kv_heads = 2, .seed = 1});
  const Tensor<float, 3> x({2, 3, 8});
  const Tensor<float, 4> dq({2, 4, 3, 2}), dkv({2, 2, 3, 2});
  EXPECT_THROW_WITH(block.backward(Tensor<float, 3>({2, 3, 6}), dq, dkv, dkv), ShapeError,
                    "QKVProjection::backward: x must be [B, T, D=8], got [2, 3, 6]");
  EXPECT_THROW_WITH(block.backward(x, Tensor<float, 4>({2, 4, 2, 2}), dkv, dkv), ShapeError,
                    "QKVProjection::backward: dq must be [B, H=4, T, d_k=2] = [2, 4, 3, 2] for x "
                    "[2, 3, 8], got [2, 4, 2, 2]");
  // GQA: k and v have H_kv heads, not H.
  EXPECT_THROW_WITH(block.backward(x, dq, dq, dkv), ShapeError,
                    "QKVProjection::backward: dk must be [B, H_kv=2, T, d_k=2] = [2, 2, 3, 2] for "
                    "x [2, 3, 8], got [2, 4, 3, 2]");
  EXPECT_THROW_WITH(block.backward(x, dq, dkv, Tensor<float, 4>({1, 2, 3, 2})), ShapeError,
                    "QKVProjection::backward: dv must be");
}

TEST(BlockErrors, AttentionOutputShapesNameTheStage) {
  AttentionOutput<float> block(8, 4, {.seed = 1});
  EXPECT_THROW_WITH(block.forward(Tensor<float, 4>({2, 2, 3, 4})), ShapeError,
                    "AttentionOutput::forward: a must be [B, H=4, T, d_k=2], got [2, 2, 3, 4]");
  const Tensor<float, 4> a({2, 4, 3, 2});
  EXPECT_THROW_WITH(block.backward(Tensor<float, 4>({2, 4, 3, 3}), Tensor<float, 3>({2, 3, 8})),
                    ShapeError, "AttentionOutput::backward: a must be [B, H=4, T, d_k=2]");
  EXPECT_THROW_WITH(block.backward(a, Tensor<float, 3>({2, 4, 8})), ShapeError,
                    "AttentionOutput::backward: dy must be [B, T, D=8] = [2, 3, 8] for a "
                    "[2, 4, 3, 2], got [2, 4, 8]");
}

TEST(BlockErrors, FeedForwardShapesAndCachesNameTheStage) {
  FeedForward<float> mlp(8, 32, Activation::gelu_tanh, {.seed = 1});
  const Tensor<float, 3> x({2, 3, 8});
  EXPECT_THROW_WITH(mlp.forward(Tensor<float, 3>({2, 3, 7})), ShapeError,
                    "FeedForward::forward: x must be [B, T, D=8], got [2, 3, 7]");
  FeedForward<float>::Cache cache;
  mlp.forward(x, cache);
  EXPECT_THROW_WITH(mlp.backward(x, cache, Tensor<float, 3>({2, 4, 8})), ShapeError,
                    "FeedForward::backward: dy must be [B, T, D=8] = [2, 3, 8] for x [2, 3, 8], "
                    "got [2, 4, 8]");
  EXPECT_THROW_WITH(mlp.backward(x, FeedForward<float>::Cache{}, x), ShapeError,
                    "FeedForward::backward: cache.hidden must be [B, T, F=32] = [2, 3, 32] for x "
                    "[2, 3, 8], got [0, 0, 0] (fill the cache with forward(x, cache))");
  EXPECT_THROW_WITH(mlp.backward(Tensor<float, 3>({1, 3, 8}), cache, Tensor<float, 3>({1, 3, 8})),
                    ShapeError, "FeedForward::backward: cache.hidden must be");
  // A whole member of the wrong width cannot be assigned in (row 20): layers are not assignable.
  static_assert(!std::is_assignable_v<decltype(mlp.down()), Linear<float>>);
  GatedFeedForward<float> swiglu(8, 12, {.seed = 2});
  EXPECT_THROW_WITH(swiglu.forward(Tensor<float, 3>({2, 3, 12})), ShapeError,
                    "GatedFeedForward::forward: x must be [B, T, D=8], got [2, 3, 12]");
  GatedFeedForward<float>::Cache gated;
  swiglu.forward(x, gated);
  gated.up = Tensor<float, 3>({2, 3, 11});
  EXPECT_THROW_WITH(swiglu.backward(x, gated, x), ShapeError,
                    "GatedFeedForward::backward: cache.up must be [B, T, F=12] = [2, 3, 12]");
  EXPECT_THROW_WITH(swiglu.backward(x, gated, Tensor<float, 3>({2, 3, 9})), ShapeError,
                    "GatedFeedForward::backward: dy must be");
}

TEST(BlockErrors, FailedBackwardLeavesEveryGradientAlone) {  // strong guarantee
  std::mt19937_64 engine(7);
  const auto x = random_tensor<double, 3>({2, 3, 8}, engine);
  const auto dy = random_tensor<double, 3>({2, 3, 8}, engine);
  GatedFeedForward<double> block(8, 12, {.seed = 3});
  GatedFeedForward<double>::Cache cache;
  block.forward(x, cache);
  block.backward(x, cache, dy);
  const Tensor<double, 2> gate_grad(block.gate().weight_grad());  // copies: views alias
  const Tensor<double, 2> down_grad(block.down().weight_grad());
  // Parameters are fixed-shape views and layers cannot be assigned over (row 20): a misfit can
  // only be refused, and a refused call leaves every gradient alone.
  static_assert(!std::is_assignable_v<decltype(block.up().weight()), Tensor<double, 2>>);
  static_assert(!std::is_assignable_v<Linear<double>&, Linear<double>>);
  static_assert(!std::is_assignable_v<decltype(block.up()), const Linear<double>&>);
  EXPECT_THROW_WITH(block.up().weight().copy_from(Tensor<double, 2>({12, 7})), ShapeError,
                    "source has shape [12, 7] but the view has shape [12, 8]");
  EXPECT_THROW_WITH(block.backward(x, cache, Tensor<double, 3>({2, 3, 9})), ShapeError,
                    "GatedFeedForward::backward: dy must be");
  GatedFeedForward<double>::Cache stale;
  stale.gate = Tensor<double, 3>({2, 3, 12});
  EXPECT_THROW_WITH(block.backward(x, stale, dy), ShapeError, "cache.up must be");
  EXPECT_TENSOR_EQ(block.down().weight_grad(), down_grad);
  EXPECT_TENSOR_EQ(block.gate().weight_grad(), gate_grad);
  EXPECT_NO_THROW(block.forward(x));
}

// Rank and scalar type are part of each method's signature: a [T, D] input, a rank-3 dq or a
// Tensor<double> into a float block does not compile (no runtime check can be reached).
template <class Block, class... Args>
concept forward_accepts = requires(const Block& block, const Args&... args) {
  block.forward(args...);
};
static_assert(forward_accepts<QKVProjection<float>, Tensor<float, 3>>);
static_assert(!forward_accepts<QKVProjection<float>, Tensor<float, 2>>);
static_assert(!forward_accepts<QKVProjection<float>, Tensor<double, 3>>);
static_assert(!forward_accepts<AttentionOutput<float>, Tensor<float, 3>>);
static_assert(!forward_accepts<FeedForward<double>, Tensor<double, 2>>);
static_assert(!forward_accepts<GatedFeedForward<double>, Tensor<float, 3>>);
template <class Block, class... Args>
concept backward_accepts = requires(Block& block, const Args&... args) {
  block.backward(args...);
};
static_assert(backward_accepts<QKVProjection<float>, Tensor<float, 3>, Tensor<float, 4>,
                               Tensor<float, 4>, Tensor<float, 4>>);
static_assert(!backward_accepts<QKVProjection<float>, Tensor<float, 3>, Tensor<float, 3>,
                                Tensor<float, 3>, Tensor<float, 3>>);
static_assert(!backward_accepts<AttentionOutput<float>, Tensor<float, 4>, Tensor<float, 4>>);

}  // namespace test_blocks
}  // namespace dissect
