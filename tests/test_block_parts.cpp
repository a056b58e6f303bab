// Tests of dissect/blocks/block_parts.hpp: the boundary checks name the op, the tensor, the shape
// it had to have and what it got; forward_into_cache is Linear::forward into a reused buffer;
// SwiGLU's gating and its gradient against the formula and central differences in double.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "dissect/blocks/block_parts.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_block_parts {

double silu(double x) {
  return x / (1.0 + std::exp(-x));
}

TEST(BlockParts, TokenCheckNamesOpTensorAndBothShapes) {
  const Tensor<float, 3> x({2, 16, 512});
  EXPECT_NO_THROW(check_block_tokens<float>("Op", "x", x, "D", 512));
  EXPECT_THROW_WITH(check_block_tokens<float>("Op::forward", "x", x, "D", 768), ShapeError,
                    "Op::forward: x must be [B, T, D=768], got [2, 16, 512]");
}

TEST(BlockParts, ShapeCheckNamesTheSourceAndAddsTheHint) {
  const Tensor<float, 3> dy({2, 3, 4});
  EXPECT_NO_THROW(
      check_block_shape("Op", "dy", dy, "[B, T, D=4]", Shape<3>{2, 3, 4}, "x", "[2, 3, 4]"));
  EXPECT_THROW_WITH(check_block_shape("Op::backward", "cache.hidden", dy, "[B, T, F=8]",
                                      Shape<3>{2, 3, 8}, "x", "[2, 3, 4]", block_cache_hint),
                    ShapeError,
                    "Op::backward: cache.hidden must be [B, T, F=8] = [2, 3, 8] for x [2, 3, 4], "
                    "got [2, 3, 4] (fill the cache with forward(x, cache))");
}

TEST(BlockParts, FfnBackwardChecksXThenDyThenEveryCachedTensor) {
  const Tensor<float, 3> x({2, 3, 4}), dy({2, 3, 4}), hidden({2, 3, 8}), stale({2, 5, 8});
  EXPECT_NO_THROW(check_ffn_backward<float>("FFN", 4, 8, x, dy, {{"cache.hidden", hidden}}));
  EXPECT_THROW_WITH(check_ffn_backward<float>("FFN", 5, 8, x, dy, {}), ShapeError,
                    "FFN: x must be [B, T, D=5], got [2, 3, 4]");
  EXPECT_THROW_WITH(check_ffn_backward<float>("FFN", 4, 8, x, Tensor<float, 3>({2, 2, 4}), {}),
                    ShapeError, "FFN: dy must be [B, T, D=4] = [2, 3, 4] for x [2, 3, 4]");
  EXPECT_THROW_WITH(
      check_ffn_backward<float>("FFN", 4, 8, x, dy,
                                {{"cache.hidden", hidden}, {"cache.activated", stale}}),
      ShapeError,
      "FFN: cache.activated must be [B, T, F=8] = [2, 3, 8] for x [2, 3, 4], got [2, 5, 8]");
}

TEST(BlockParts, ForwardIntoCacheIsForwardAndReusesAFittingBuffer) {
  std::mt19937_64 engine(7);
  const Linear<float> layer(4, 6, {.seed = 3});
  const auto x = testing::random_tensor<float, 3>({2, 3, 4}, engine);
  Tensor<float, 3> buffer;
  forward_into_cache<float>(layer, x, buffer);
  EXPECT_TRUE(allclose(buffer, layer.forward(x), 0.0, 0.0));
  const float* storage = buffer.data();
  forward_into_cache<float>(layer, x, buffer);
  EXPECT_EQ(buffer.data(), storage);  // same shape: no new allocation
  EXPECT_THROW_WITH(forward_into_cache<float>(layer, Tensor<float, 3>({2, 3, 5}), buffer),
                    ShapeError, "in_features 4");
}

TEST(BlockParts, SwigluIsSiluOfGateTimesUpAndMayOverwriteTheGate) {
  std::mt19937_64 engine(11);
  const auto gate = testing::random_tensor<double, 3>({2, 3, 5}, engine, -6.0, 6.0);
  const auto up = testing::random_tensor<double, 3>({2, 3, 5}, engine);
  Tensor<double, 3> hidden(gate.shape());
  swiglu_into<double>(gate, up, hidden);
  for (index_t i = 0; i < gate.size(); ++i) {
    EXPECT_NEAR(hidden.data()[i], silu(gate.data()[i]) * up.data()[i], 1e-15);
  }
  Tensor<double, 3> in_place = gate;
  swiglu_into<double>(in_place, up, in_place);
  EXPECT_TRUE(allclose(in_place, hidden, 0.0, 0.0));
}

TEST(BlockParts, SwigluGradientMatchesCentralDifferences) {
  std::mt19937_64 engine(13);
  const Shape<3> shape{1, 2, 7};
  const auto gate = testing::random_tensor<double, 3>(shape, engine, -4.0, 4.0);
  const auto up = testing::random_tensor<double, 3>(shape, engine);
  const auto d_hidden = testing::random_tensor<double, 3>(shape, engine);
  Tensor<double, 3> d_gate = d_hidden, d_up(shape);
  swiglu_backward_into<double>(gate, up, d_gate, d_up);
  // L = Σ d_hidden ⊙ swiglu(gate, up): ∂L/∂gate and ∂L/∂up, one element at a time.
  const auto loss = [&](const Tensor<double, 3>& g, const Tensor<double, 3>& u) {
    Tensor<double, 3> h(shape);
    swiglu_into<double>(g, u, h);
    double sum = 0.0;
    for (index_t i = 0; i < h.size(); ++i) sum += d_hidden.data()[i] * h.data()[i];
    return sum;
  };
  const double step = 1e-6;
  for (index_t i = 0; i < gate.size(); ++i) {
    Tensor<double, 3> plus = gate, minus = gate;
    plus.data()[i] += step;
    minus.data()[i] -= step;
    EXPECT_NEAR(d_gate.data()[i], (loss(plus, up) - loss(minus, up)) / (2 * step), 1e-8);
    Tensor<double, 3> up_plus = up, up_minus = up;
    up_plus.data()[i] += step;
    up_minus.data()[i] -= step;
    EXPECT_NEAR(d_up.data()[i], (loss(gate, up_plus) - loss(gate, up_minus)) / (2 * step), 1e-8);
  }
}

}  // namespace test_block_parts
}  // namespace dissect
