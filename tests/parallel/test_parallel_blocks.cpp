// Tests of parallel/parallel_blocks.hpp on 2 ranks and on 1: FFN, SwiGLU and grouped-query
// attention split over the ranks give the single-process block's output, input gradient and
// every parameter gradient (gathered), within a rounding bound; configurations that do not divide
// and inputs that differ across ranks throw the same error on every rank.
#include "dissect/parallel/parallel_blocks.hpp"

#include <gtest/gtest.h>

#include <random>

#include "parallel/parallel_testing.hpp"

namespace dissect::testing {
namespace test_parallel_blocks {

using parallel::ColumnParallelLinear;
using parallel::ParallelAttention;
using parallel::ParallelFeedForward;
using parallel::ParallelGatedFeedForward;

template <class Scalar>
class ParallelBlocksTest : public ::testing::Test {};
TYPED_TEST_SUITE(ParallelBlocksTest, FloatAndDouble);

/// A full Linear's gradients, gathered from a row-parallel or column-parallel split, must match.
template <class Scalar>
void expect_column_grads(const ColumnParallelLinear<Scalar>& part, const Linear<Scalar>& full,
                         double bound) {
  const auto& comm = world();
  EXPECT_TENSOR_NEAR(gather_first(comm, part.local().weight_grad()), full.weight_grad(), 0.0,
                     bound);
  if (full.has_bias()) {
    EXPECT_TENSOR_NEAR(gather_first(comm, part.local().bias_grad()), full.bias_grad(), 0.0, bound);
  }
}

template <class Scalar>
void expect_row_grads(const parallel::RowParallelLinear<Scalar>& part, const Linear<Scalar>& full,
                      double bound) {
  const auto& comm = world();
  EXPECT_TENSOR_NEAR(gather_last(comm, part.local().weight_grad()), full.weight_grad(), 0.0, bound);
  part.for_each_parameter([&](const ParameterName& name, auto, auto grad) {
    if constexpr (rank_of<decltype(grad)> == 1) {
      EXPECT_TRUE(name == "bias");
      EXPECT_TENSOR_NEAR(grad, full.bias_grad(), 0.0, bound);
    }
  });
}

TYPED_TEST(ParallelBlocksTest, FeedForwardMatchesTheFullBlock) {
  using Scalar = TypeParam;
  const auto& comm = world();
  constexpr index_t D = 8, F = 16;
  std::mt19937_64 engine(21);
  const auto x = random_tensor<Scalar, 3>({2, 3, D}, engine);
  const auto dy = random_tensor<Scalar, 3>({2, 3, D}, engine);
  FeedForward<Scalar> full(D, F, Activation::gelu_tanh, {.seed = 5});
  typename FeedForward<Scalar>::Cache cache;
  const auto y_ref = full.forward(x, cache);
  const auto dx_ref = full.backward(x, cache, dy);

  ParallelFeedForward<Scalar> split(full, comm);
  typename ParallelFeedForward<Scalar>::Cache split_cache;
  const auto y = split.forward(x, split_cache);
  EXPECT_TENSOR_NEAR(y, y_ref, 0.0, block_bound<Scalar>(D + F, comm.size(), y_ref));
  EXPECT_TENSOR_NEAR(split.forward(x), y, 0.0, 0.0);  // with or without a cache: the same
  const auto dx = split.backward(x, split_cache, dy);
  EXPECT_TENSOR_NEAR(dx, dx_ref, 0.0, block_bound<Scalar>(D + F, comm.size(), dx_ref));
  const double bound = block_bound<Scalar>(D + F + 6, comm.size(), full.up().weight_grad());
  expect_column_grads(split.up(), full.up(), bound);
  expect_row_grads(split.down(), full.down(), bound);
  EXPECT_EQ(parameter_names(split), parameter_names(full));
}

TYPED_TEST(ParallelBlocksTest, GatedFeedForwardMatchesTheFullBlock) {
  using Scalar = TypeParam;
  const auto& comm = world();
  constexpr index_t D = 8, F = 12;
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    std::mt19937_64 engine(22);
    const auto x = random_tensor<Scalar, 3>({2, 3, D}, engine);
    const auto dy = random_tensor<Scalar, 3>({2, 3, D}, engine);
    GatedFeedForward<Scalar> full(D, F, {.bias = bias, .seed = 6});
    typename GatedFeedForward<Scalar>::Cache cache;
    const auto y_ref = full.forward(x, cache);
    const auto dx_ref = full.backward(x, cache, dy);

    ParallelGatedFeedForward<Scalar> split(full, comm);
    typename ParallelGatedFeedForward<Scalar>::Cache split_cache;
    const auto y = split.forward(x, split_cache);
    EXPECT_TENSOR_NEAR(y, y_ref, 0.0, block_bound<Scalar>(D + F, comm.size(), y_ref));
    const auto dx = split.backward(x, split_cache, dy);
    EXPECT_TENSOR_NEAR(dx, dx_ref, 0.0, block_bound<Scalar>(2 * (D + F), comm.size(), dx_ref));
    const double bound = block_bound<Scalar>(D + F + 6, comm.size(), full.up().weight_grad());
    expect_column_grads(split.gate(), full.gate(), bound);
    expect_column_grads(split.up(), full.up(), bound);
    expect_row_grads(split.down(), full.down(), bound);
    EXPECT_EQ(parameter_names(split), parameter_names(full));
  }
}

TYPED_TEST(ParallelBlocksTest, GroupedQueryAttentionMatchesTheFullBlocks) {
  using Scalar = TypeParam;
  const auto& comm = world();
  constexpr index_t D = 16, H = 4, H_kv = 2, T = 5;
  std::mt19937_64 engine(23);
  const auto x = random_tensor<Scalar, 3>({2, T, D}, engine);
  const auto dy = random_tensor<Scalar, 3>({2, T, D}, engine);
  QKVProjection<Scalar> qkv(D, H, {.n_kv_heads = H_kv, .seed = 7});
  AttentionOutput<Scalar> out(D, H, {.seed = 8});
  // The single-process chain: qkv → causal attention → output projection.
  const auto heads = qkv.forward(x);
  AttentionCache<Scalar> attention;
  const auto o = causal_attention(heads.q, heads.k, heads.v, attention);
  const auto y_ref = out.forward(o);
  const auto d_o = out.backward(o, dy);
  const auto grads = causal_attention_backward(heads.q, heads.k, heads.v, attention, d_o);
  const auto dx_ref = qkv.backward(x, grads);

  ParallelAttention<Scalar> split(qkv, out, comm);
  EXPECT_EQ(split.local_heads(), H / comm.size());
  typename ParallelAttention<Scalar>::Cache cache;
  const auto y = split.forward(x, cache);
  const index_t length = D + T + D;  // q·kᵀ over d_k ≤ D, P·v over T, the projections over D
  EXPECT_TENSOR_NEAR(y, y_ref, 0.0, block_bound<Scalar>(length, comm.size(), y_ref));
  const auto dx = split.backward(x, cache, dy);
  EXPECT_TENSOR_NEAR(dx, dx_ref, 0.0, block_bound<Scalar>(2 * length, comm.size(), dx_ref));

  // qkv's slice is this rank's heads of q, k and v: the same split of the full gradient.
  const double bound = block_bound<Scalar>(2 * length + 10, comm.size(), qkv.qkv().weight_grad());
  Linear<Scalar> full_grads(Tensor<Scalar, 2>(qkv.qkv().weight_grad()),
                            Tensor<Scalar, 1>(qkv.qkv().bias_grad()));
  const std::array<index_t, 3> parts{H * D / H, H_kv * D / H, H_kv * D / H};
  ColumnParallelLinear<Scalar> expected(full_grads, comm, parts);
  EXPECT_TENSOR_NEAR(split.qkv().local().weight_grad(), expected.local().weight(), 0.0, bound);
  EXPECT_TENSOR_NEAR(split.qkv().local().bias_grad(), expected.local().bias(), 0.0, bound);
  // …and gathered: rank p holds [q_p | k_p | v_p]; putting each part's shares back in rank
  // order gives the full fused gradient.
  const auto gathered = gather_first(comm, split.qkv().local().weight_grad());
  Tensor<Scalar, 2> fused(qkv.qkv().weight().shape());
  const index_t P = comm.size(), local_rows = split.qkv().local_out_features();
  index_t part_start = 0, local_start = 0;
  for (index_t width : parts) {
    const index_t share = width / P;
    for (index_t p = 0; p < P; ++p) {
      fused.matrix().middleRows(part_start + p * share, share) =
          gathered.matrix().middleRows(p * local_rows + local_start, share);
    }
    part_start += width;
    local_start += share;
  }
  EXPECT_TENSOR_NEAR(fused, qkv.qkv().weight_grad(), 0.0, bound);
  expect_row_grads(split.proj(), out.proj(), bound);

  std::vector<std::string> names = parameter_names(split), expected_names;
  for (const auto& name : parameter_names(qkv)) expected_names.push_back(name);
  for (const auto& name : parameter_names(out)) expected_names.push_back(name);
  EXPECT_EQ(names, expected_names);
}

TEST(ParallelBlocks, ConfigurationsThatDoNotDivideAreTheSameConfigErrorOnEveryRank) {
  const auto& comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "everything divides by 1";
  QKVProjection<float> mqa(8, 2, {.n_kv_heads = 1, .seed = 1});  // H_kv = 1 on 2 ranks
  AttentionOutput<float> out(8, 2, {.seed = 2});
  EXPECT_THROW_WITH(ParallelAttention<float>(mqa, out, comm), ConfigError,
                    "ParallelAttention: n_kv_heads = 1 does not divide evenly over 2 ranks");
  QKVProjection<float> three_heads(6, 3, {.seed = 1});  // 3·2 = 6 features would split a head
  AttentionOutput<float> out3(6, 3, {.seed = 2});
  EXPECT_THROW_WITH(ParallelAttention<float>(three_heads, out3, comm), ConfigError,
                    "ParallelAttention: n_heads = 3 does not divide evenly over 2 ranks");
  FeedForward<float> ffn(4, 7, Activation::gelu_tanh, {.seed = 3});
  EXPECT_THROW_WITH(ParallelFeedForward<float>(ffn, comm), ConfigError,
                    "out_features = 7 does not divide evenly over 2 ranks");
  GatedFeedForward<float> swiglu(4, 5, {.seed = 3});
  EXPECT_THROW_WITH(ParallelGatedFeedForward<float>(swiglu, comm), ConfigError,
                    "out_features = 5 does not divide evenly over 2 ranks");
}

TEST(ParallelBlocks, InputsOfDifferentShapesAreAShapeErrorNotAHang) {
  const auto& comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  FeedForward<float> full(4, 8, Activation::gelu_tanh, {.seed = 4});
  ParallelFeedForward<float> split(full, comm);
  const Tensor<float, 3> x({1 + comm.rank(), 2, 4});  // B differs across ranks
  EXPECT_THROW_WITH(split.forward(x), ShapeError,
                    "ParallelFeedForward::forward: ranks disagree about the shapes of their "
                    "inputs: entry 1 is 1 on some ranks and 2 on others");
  QKVProjection<float> qkv(8, 2, {.seed = 1});
  AttentionOutput<float> out(8, 2, {.seed = 2});
  ParallelAttention<float> attention(qkv, out, comm);
  const Tensor<float, 3> xa({1, 2 + comm.rank(), 8});
  EXPECT_THROW_WITH(attention.forward(xa), ShapeError,
                    "ParallelAttention::forward: ranks disagree");
  // A cache from another input: the same ShapeError everywhere, gradients untouched.
  const Tensor<float, 3> x1({1, 3, 8}), x2({1, 4, 8});
  typename ParallelAttention<float>::Cache cache;
  attention.forward(x1, cache);
  EXPECT_THROW_WITH(attention.backward(x2, cache, x2), ShapeError, "cache.qkv.q");
  EXPECT_EQ(max_abs_of(attention.qkv().local().weight_grad()), 0.0);
}

}  // namespace test_parallel_blocks
}  // namespace dissect::testing
