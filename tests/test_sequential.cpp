// Tests of dissect/tensor/sequential.hpp: Sequential equals the hand composition of its modules
// forward and backward, reuses its cache, holds blocks with caches of their own; Stack's runtime
// depth equals the same layers in a Sequential.
#include <gtest/gtest.h>

#include <random>

#include "dissect/blocks.hpp"
#include "dissect/tensor/sequential.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_sequential {

using Mlp = testing::SmallMlp;
using testing::random_tensor;
using testing::small_mlp;
using testing::snapshot;

TEST(Sequential, EqualsTheHandComposition) {
  std::mt19937_64 engine(4);
  for (int trial = 0; trial < 100; ++trial) {
    auto mlp = small_mlp(10 + trial);
    auto first = Linear<double>(5, 7, {.seed = std::uint64_t(10 + trial)});
    auto second = Linear<double>(7, 3, {.bias = false, .seed = std::uint64_t(11 + trial)});
    const auto x = random_tensor<double, 3>({2, 3, 5}, engine);
    const auto dy = random_tensor<double, 3>({2, 3, 3}, engine);
    // Forward, bit for bit: the same kernels in the same order.
    const auto hidden = first.forward(x);
    const auto activated = activate(hidden, Activation::relu);
    EXPECT_TENSOR_EQ(mlp.forward(x), second.forward(activated));
    Mlp::Cache<3> cache;
    EXPECT_TENSOR_EQ(mlp.forward(x, cache), second.forward(activated));
    // Backward: dx and every gradient.
    const auto d_activated = second.backward(activated, dy);
    const auto dx = first.backward(x, activate_backward(hidden, d_activated, Activation::relu));
    EXPECT_TENSOR_EQ(mlp.backward(x, cache, dy), dx);
    EXPECT_TENSOR_EQ(mlp.get<0>().weight_grad(), first.weight_grad());
    EXPECT_TENSOR_EQ(mlp.get<0>().bias_grad(), first.bias_grad());
    EXPECT_TENSOR_EQ(mlp.get<2>().weight_grad(), second.weight_grad());
    // backward_parameters skips dx and gives the same parameter gradients.
    mlp.zero_grad();
    mlp.backward_parameters(x, cache, dy);
    EXPECT_TENSOR_EQ(mlp.get<0>().weight_grad(), first.weight_grad());
    if (HasFailure()) return;
  }
}

TEST(Sequential, CacheIsReusedWithoutReallocation) {
  auto mlp = small_mlp(5);
  std::mt19937_64 engine(5);
  const auto x = random_tensor<double, 2>({6, 5}, engine);
  Mlp::Cache<2> cache;
  const auto y = mlp.forward(x, cache);
  mlp.backward(x, cache, y);
  const double* hidden = cache.outputs[0].data();
  const double* grad = cache.grads[1].data();
  mlp.forward(x, cache);
  mlp.backward(x, cache, y);
  EXPECT_EQ(cache.outputs[0].data(), hidden);
  EXPECT_EQ(cache.grads[1].data(), grad);
}

TEST(Sequential, HoldsBlocksWithTheirOwnCaches) {
  using Stack = Sequential<FeedForward<double>, GatedFeedForward<double>>;
  Stack stack(FeedForward<double>(4, 8, Activation::gelu, {.seed = 1}),
              GatedFeedForward<double>(4, 6, {.seed = 2}));
  FeedForward<double> ffn(4, 8, Activation::gelu, {.seed = 1});
  GatedFeedForward<double> swiglu(4, 6, {.seed = 2});
  std::mt19937_64 engine(6);
  const auto x = random_tensor<double, 3>({2, 3, 4}, engine);
  const auto dy = random_tensor<double, 3>({2, 3, 4}, engine);
  Stack::Cache<3> cache;
  FeedForward<double>::Cache ffn_cache;
  GatedFeedForward<double>::Cache swiglu_cache;
  const auto h = ffn.forward(x, ffn_cache);
  EXPECT_TENSOR_EQ(stack.forward(x, cache), swiglu.forward(h, swiglu_cache));
  const auto dh = swiglu.backward(h, swiglu_cache, dy);
  EXPECT_TENSOR_EQ(stack.backward(x, cache, dy), ffn.backward(x, ffn_cache, dh));
  EXPECT_TENSOR_EQ(stack.get<1>().down().weight_grad(), swiglu.down().weight_grad());
}

TEST(Stack, RuntimeDepthEqualsTheSameLayersInSequence) {
  using Hidden = Sequential<Linear<double>, ReLU>;
  Stack<Hidden> stack;
  for (std::uint64_t i = 0; i < 3; ++i)
    stack.push_back(Hidden(Linear<double>(4, 4, {.seed = i}), {}));
  Sequential<Hidden, Hidden, Hidden> fixed(Hidden(Linear<double>(4, 4, {.seed = 0}), {}),
                                           Hidden(Linear<double>(4, 4, {.seed = 1}), {}),
                                           Hidden(Linear<double>(4, 4, {.seed = 2}), {}));
  EXPECT_EQ(parameter_names(stack), parameter_names(fixed));
  EXPECT_EQ(parameter_names(stack).front(), "0.0.weight");
  std::mt19937_64 engine(8);
  const auto x = random_tensor<double, 3>({2, 3, 4}, engine);
  const auto dy = random_tensor<double, 3>({2, 3, 4}, engine);
  Stack<Hidden>::Cache<3> stack_cache;
  decltype(fixed)::Cache<3> fixed_cache;
  EXPECT_TENSOR_EQ(stack.forward(x), fixed.forward(x));
  EXPECT_TENSOR_EQ(stack.forward(x, stack_cache), fixed.forward(x, fixed_cache));
  EXPECT_TENSOR_EQ(stack.backward(x, stack_cache, dy), fixed.backward(x, fixed_cache, dy));
  EXPECT_TENSOR_EQ(stack.at(0).get<0>().weight_grad(), fixed.get<0>().get<0>().weight_grad());
  EXPECT_THROW_WITH(stack.at(3), Error, "Stack::at: index 3 is out of range (3 layers)");
  Stack<Hidden>::Cache<3> empty_cache;
  EXPECT_THROW_WITH(stack.backward(x, empty_cache, dy), ShapeError,
                    "fill the cache with forward(x, cache)");
  // An empty stack passes x through, and dy back.
  Stack<Hidden> none;
  EXPECT_TENSOR_EQ(none.forward(x), x);
  Stack<Hidden>::Cache<3> none_cache;
  none.forward(x, none_cache);
  EXPECT_TENSOR_EQ(none.backward(x, none_cache, dy), dy);
}

}  // namespace test_sequential
}  // namespace dissect
