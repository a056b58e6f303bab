// Tests of Communicator::agree and of every public parallel call that uses it (bad-input rows 52
// to 56): an error on one rank only — a wrong shape, a RoPE table missing or too short, a cache
// of another input — and inputs that must be replicated but differ in value on one rank — x, dy,
// the full layer being split, the norms — make BOTH ranks throw the documented error, naming the
// failing rank, with every gradient untouched. Before the agreement these hung: the healthy rank
// waited in a collective for ever. Each test runs under a watchdog that ends the process if it
// does not finish in time (and ctest's TIMEOUT is the second net), so a hang fails, never blocks.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <new>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "dissect/parallel/parallel_decoder_layer.hpp"
#include "parallel/parallel_testing.hpp"
#include "support/small_models.hpp"

namespace dissect::testing {
namespace test_parallel_agreement {

using parallel::ColumnParallelLinear;
using parallel::ParallelAttention;
using parallel::ParallelFeedForward;
using parallel::RowParallelLinear;

/// Ends the process (exit 124, as timeout(1) does) if not destroyed within `limit`: a rank stuck
/// in a collective fails the run at once instead of waiting for ctest's TIMEOUT.
class Watchdog {
 public:
  explicit Watchdog(std::chrono::seconds limit) : thread_([this, limit] { watch(limit); }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    wake_.notify_one();
    thread_.join();
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

 private:
  void watch(std::chrono::seconds limit) {
    std::unique_lock lock(mutex_);
    if (wake_.wait_for(lock, limit, [this] { return done_; })) return;
    const auto* test = ::testing::UnitTest::GetInstance()->current_test_info();
    std::fprintf(stderr,
                 "[rank %d] %s.%s did not finish in %lld s: a rank is stuck in a collective\n",
                 world().rank(), test ? test->test_suite_name() : "?", test ? test->name() : "?",
                 static_cast<long long>(limit.count()));
    std::fflush(stderr);
    std::_Exit(124);  // mpiexec then ends the other ranks
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

/// Every test: 2 ranks (on 1 there is no other rank to disagree with), under a 30 s watchdog
/// (each finishes in well under a second; ctest's TIMEOUT of 60 s covers the whole binary).
class Agreement : public ::testing::Test {
 protected:
  void SetUp() override {
    if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  }
  /// After a refusal every rank is out of the call, so the ranks still meet: a sum of ranks.
  static void expect_in_step() {
    std::int64_t value = world().rank();
    world().all_reduce_sum(std::span<std::int64_t>(&value, 1));
    const std::int64_t P = world().size();
    EXPECT_EQ(value, P * (P - 1) / 2);
  }
  /// Rank 1 is the odd one out.
  static bool odd_one() { return world().rank() == 1; }

 private:
  Watchdog watchdog_{std::chrono::seconds(30)};
};

// ---- Communicator::agree ------------------------------------------------------------------------

TEST_F(Agreement, AnErrorOnOneRankIsItsKindOnEveryRankNamingIt) {
  const auto& comm = world();
  const auto fail_on_one = [&](auto error) {
    return [&comm, error] {
      if (comm.rank() == 1) throw error;
    };
  };
  EXPECT_THROW_WITH(comm.agree("test::op", fail_on_one(ShapeError("test::op: x is [2, 5]"))),
                    ShapeError, "test::op: rank 1: x is [2, 5]");
  EXPECT_THROW_WITH(comm.agree("test::op", fail_on_one(ConfigError("bad d_ff"))), ConfigError,
                    "test::op: rank 1: bad d_ff");
  EXPECT_THROW_WITH(comm.agree("test::op", fail_on_one(FormatError("bad file"))), FormatError,
                    "test::op: rank 1: bad file");
  EXPECT_THROW_WITH(comm.agree("test::op", fail_on_one(OverflowError("too big"))), OverflowError,
                    "test::op: rank 1: too big");
  EXPECT_THROW_WITH(comm.agree("test::op", fail_on_one(std::runtime_error("other"))), Error,
                    "test::op: rank 1: other");
  EXPECT_THROW(comm.agree("test::op", fail_on_one(std::bad_alloc())), std::bad_alloc);
  expect_in_step();
}

TEST_F(Agreement, AnErrorOnEveryRankKeepsItsTextAndTheLowestRankWins) {
  const auto& comm = world();
  EXPECT_THROW_WITH(
      comm.agree("test::op", [] { throw ConfigError("test::op: 7 does not divide"); }), ConfigError,
      "test::op: 7 does not divide");
  EXPECT_THROW_WITH(
      comm.agree("test::op",
                 [&] { throw ShapeError(dissect::detail::concat("wrong on rank ", comm.rank())); }),
      ShapeError, "test::op: rank 0: wrong on rank 0");
  expect_in_step();
}

TEST_F(Agreement, SuccessReturnsTheLocalResultInOneSmallAllReduce) {
  const auto& comm = world();
  comm.reset_stats();
  const std::int64_t shape[2] = {2, 3};
  const int got = comm.agree("test::op", {.shapes = {shape, shape + 2}, .replicated = {{"x", 42}}},
                             [&] { return 10 + comm.rank(); });
  EXPECT_EQ(got, 10 + comm.rank());
  EXPECT_EQ(comm.stats().agreements, 1);
  EXPECT_EQ(comm.stats().all_reduces, 0);  // the big all-reduces are counted apart
}

TEST_F(Agreement, ReplicatedValuesThatDifferNameTheRank) {
  const auto& comm = world();
  const float mine[3] = {1.0f, 2.0f, odd_one() ? 3.5f : 3.0f};
  EXPECT_THROW_WITH(
      comm.agree(
          "test::op",
          {.replicated = {{"x", parallel::Checksum().add(std::span<const float>(mine)).value()}}},
          [] {}),
      ShapeError, "test::op: rank 1: the values of x differ from rank 0's");
  // −0.0 and +0.0 are other bits: replicated means bitwise the same.
  const float zero = odd_one() ? -0.0f : 0.0f;
  EXPECT_THROW_WITH(
      comm.agree("test::op", {.replicated = {{"x", parallel::Checksum().add(zero).value()}}},
                 [] {}),
      ShapeError, "rank 1: the values of x differ");
  expect_in_step();
}

TEST_F(Agreement, RanksInDifferentCallsAreAnErrorNotAHang) {
  const auto& comm = world();
  EXPECT_THROW_WITH(
      comm.agree(odd_one() ? "RowParallelLinear::forward" : "ColumnParallelLinear::forward", [] {}),
      Error, "rank 1 is in another parallel call than rank 0");
  expect_in_step();
}

// ---- ParallelLinear
// ------------------------------------------------------------------------------

TEST_F(Agreement, ColumnParallelInputsWrongOrDifferentOnOneRank) {
  const auto& comm = world();
  const Linear<float> full(4, 4, {.seed = 3});
  ColumnParallelLinear<float> column(full, comm);
  std::mt19937_64 engine(1);  // the same on every rank
  auto x = random_tensor<float, 2>({3, 4}, engine);
  const auto dy_p = random_tensor<float, 2>({3, 2}, engine);
  const Tensor<float, 2> x_wrong({3, odd_one() ? 5 : 4});
  EXPECT_THROW_WITH(column.forward(x_wrong), ShapeError,
                    "ColumnParallelLinear::forward: rank 1: Linear::forward: input last dim 5 != "
                    "in_features 4");
  const Tensor<float, 2> dy_wrong({3, odd_one() ? 3 : 2});
  EXPECT_THROW_WITH(column.backward(x, dy_wrong), ShapeError,
                    "ColumnParallelLinear::backward: rank 1: dy has shape [3, 3]");
  if (odd_one()) x(2, 1) += 1.0f;  // same shape, other values: rank 1 would compute another y
  EXPECT_THROW_WITH(column.forward(x), ShapeError,
                    "ColumnParallelLinear::forward: rank 1: the values of x differ from rank 0's");
  EXPECT_THROW_WITH(column.backward(x, dy_p), ShapeError,
                    "ColumnParallelLinear::backward: rank 1: the values of x differ");
  EXPECT_EQ(max_abs_of(column.local().weight_grad()), 0.0);  // untouched on every rank
  expect_in_step();
}

TEST_F(Agreement, RowParallelInputsWrongOrDifferentOnOneRank) {
  const auto& comm = world();
  const Linear<float> full(4, 4, {.seed = 3});
  RowParallelLinear<float> row(full, comm);
  std::mt19937_64 engine(2);
  const auto x_p = random_tensor<float, 2>({3, 2}, engine);
  auto dy = random_tensor<float, 2>({3, 4}, engine);
  const Tensor<float, 2> x_wrong({3, odd_one() ? 3 : 2});
  EXPECT_THROW_WITH(row.forward(x_wrong), ShapeError,
                    "RowParallelLinear::forward: rank 1: Linear::forward: input last dim 3");
  if (odd_one()) dy(0, 0) = -dy(0, 0);
  EXPECT_THROW_WITH(row.backward(x_p, dy), ShapeError,
                    "RowParallelLinear::backward: rank 1: the values of dy differ from rank 0's");
  EXPECT_EQ(max_abs_of(row.local().weight_grad()), 0.0);
  expect_in_step();
}

TEST_F(Agreement, DifferentFullLayersOnEachRankAreRefusedNotMixed) {
  const auto& comm = world();
  // Same shapes, other values: each rank would keep its slice of another layer.
  const Linear<float> full(4, 4, {.seed = 1 + static_cast<std::uint64_t>(comm.rank())});
  EXPECT_THROW_WITH(ColumnParallelLinear<float>(full, comm), ShapeError,
                    "ColumnParallelLinear: rank 1: the values of the full layer's weight and bias "
                    "differ from rank 0's");
  EXPECT_THROW_WITH(RowParallelLinear<float>(full, comm), ShapeError,
                    "RowParallelLinear: rank 1: the values of the full layer's weight and bias");
  // A row-parallel slice cut elsewhere: the bias is replicated, so it is compared.
  Tensor<float, 1> bias({4});
  bias(0) = odd_one() ? 1.0f : 0.0f;
  EXPECT_THROW_WITH(
      RowParallelLinear<float>(Linear<float>(Tensor<float, 2>({4, 2})), bias, 4, comm), ShapeError,
      "RowParallelLinear: rank 1: the values of the bias differ");
  // Blocks split their full layers the same way.
  const FeedForward<float> ffn(4, 8, Activation::gelu_tanh,
                               {.seed = 5 + static_cast<std::uint64_t>(comm.rank())});
  EXPECT_THROW_WITH(ParallelFeedForward<float>(ffn, comm), ShapeError,
                    "ColumnParallelLinear: rank 1: the values of the full layer's");
  const QKVProjection<float> qkv(8, 2, {.seed = 1 + static_cast<std::uint64_t>(comm.rank())});
  const AttentionOutput<float> out(8, 2, {.seed = 2});
  EXPECT_THROW_WITH(ParallelAttention<float>(qkv, out, comm), ShapeError,
                    "ColumnParallelLinear: rank 1: the values of the full layer's");
  expect_in_step();
}

// ---- blocks
// --------------------------------------------------------------------------------------

TEST_F(Agreement, FeedForwardInputsAndCachesWrongOrDifferentOnOneRank) {
  const auto& comm = world();
  const FeedForward<float> full(4, 8, Activation::gelu_tanh, {.seed = 4});
  ParallelFeedForward<float> split(full, comm);
  std::mt19937_64 engine(3);
  auto x = random_tensor<float, 3>({1, 2, 4}, engine);
  auto dy = random_tensor<float, 3>({1, 2, 4}, engine);
  const Tensor<float, 3> x_wrong({1, 2, odd_one() ? 6 : 4});
  EXPECT_THROW_WITH(split.forward(x_wrong), ShapeError,
                    "ParallelFeedForward::forward: rank 1: x must be [B, T, D=4], got [1, 2, 6]");
  typename ParallelFeedForward<float>::Cache cache;
  split.forward(x, cache);
  if (odd_one()) cache.hidden = Tensor<float, 3>({1, 3, 4});  // a cache of another input
  EXPECT_THROW_WITH(split.backward(x, cache, dy), ShapeError,
                    "ParallelFeedForward::backward: rank 1: cache.hidden must be");
  split.forward(x, cache);
  if (odd_one()) dy(0, 1, 3) += 1.0f;
  EXPECT_THROW_WITH(split.backward(x, cache, dy), ShapeError,
                    "ParallelFeedForward::backward: rank 1: the values of dy differ");
  if (odd_one()) x(0, 0, 0) += 1.0f;
  EXPECT_THROW_WITH(split.forward(x), ShapeError,
                    "ParallelFeedForward::forward: rank 1: the values of x differ");
  EXPECT_EQ(max_abs_of(split.up().local().weight_grad()), 0.0);
  EXPECT_EQ(max_abs_of(split.down().local().weight_grad()), 0.0);
  expect_in_step();
}

TEST_F(Agreement, AttentionRopeTableMissingOrTooShortOnOneRank) {
  const auto& comm = world();
  const QKVProjection<float> qkv(8, 2, {.seed = 1});
  const AttentionOutput<float> out(8, 2, {.seed = 2});
  ParallelAttention<float> attention(qkv, out, comm);
  std::mt19937_64 engine(4);
  const auto x = random_tensor<float, 3>({1, 4, 8}, engine);
  const RotaryTable<float> long_table(4, 16), short_table(4, 2);
  // Missing on rank 1: it would attend without rotating.
  typename ParallelAttention<float>::Cache cache;
  EXPECT_THROW_WITH(attention.forward(x, cache, odd_one() ? nullptr : &long_table), ShapeError,
                    "ParallelAttention::forward: rank 1: the values of the RoPE table (whether "
                    "there is one, its d_k, θ) differ from rank 0's");
  // Too short on rank 1: T = 4 > 2 positions throws there, and so everywhere.
  EXPECT_THROW_WITH(attention.forward(x, cache, odd_one() ? &short_table : &long_table), Error,
                    "ParallelAttention::forward: rank 1: ");
  attention.forward(x, cache, &long_table);
  EXPECT_THROW_WITH(attention.backward(x, cache, x, odd_one() ? &short_table : &long_table), Error,
                    "ParallelAttention::backward: rank 1: positions 0 … 3 are beyond the RoPE "
                    "table's 2 positions");
  EXPECT_EQ(max_abs_of(attention.qkv().local().weight_grad()), 0.0);
  EXPECT_EQ(max_abs_of(attention.proj().local().weight_grad()), 0.0);
  expect_in_step();
}

// ---- decoder layers
// ------------------------------------------------------------------------------

TEST_F(Agreement, LlamaLayerWithoutATableOrWithOneTooShortOnOneRank) {
  const auto& comm = world();
  using Layer = parallel::ParallelLlamaDecoderLayer<float>;
  const auto config = small_llama();
  const DecoderLayer<float, llama_style> full(config, 11);
  Layer split(full, comm);
  std::mt19937_64 engine(5);
  auto x = random_tensor<float, 3>({1, 4, config.d_model}, engine);
  const auto dy = random_tensor<float, 3>({1, 4, config.d_model}, engine);
  const RotaryTable<float> table(config.head_size(), config.context, config.rope_theta);
  const RotaryTable<float> short_table(config.head_size(), 2, config.rope_theta);
  typename Layer::Cache cache;
  EXPECT_THROW_WITH(split.forward(x, cache, odd_one() ? nullptr : &table), Error,
                    "ParallelLlamaDecoderLayer::forward: rank 1: a rotary layer needs a RoPE "
                    "table");
  EXPECT_THROW_WITH(split.forward(x, cache, odd_one() ? &short_table : &table), Error,
                    "ParallelLlamaDecoderLayer::forward: rank 1: positions 0 … 3 are beyond the "
                    "RoPE table's 2 positions");
  const Tensor<float, 3> x_wrong({1, 4, odd_one() ? 8 : config.d_model});
  EXPECT_THROW_WITH(split.forward(x_wrong, cache, &table), ShapeError,
                    "ParallelLlamaDecoderLayer::forward: rank 1: x must be [B, T, D=16]");
  split.forward(x, cache, &table);
  EXPECT_THROW_WITH(split.backward(x, cache, dy, odd_one() ? nullptr : &table), Error,
                    "ParallelLlamaDecoderLayer::backward: rank 1: a rotary layer needs a RoPE "
                    "table");
  if (odd_one()) cache.norm2.rstd = Tensor<double, 1>({3});
  EXPECT_THROW_WITH(split.backward(x, cache, dy, &table), ShapeError,
                    "ParallelLlamaDecoderLayer::backward: rank 1: cache.norm2 holds the statistics "
                    "of another x");
  double grads = 0;
  split.for_each_parameter(
      [&](const ParameterName&, auto, auto grad) { grads = std::max(grads, max_abs_of(grad)); });
  EXPECT_EQ(grads, 0.0);  // every refusal came before any gradient changed, on every rank
  if (odd_one()) x(0, 3, 15) += 1.0f;
  EXPECT_THROW_WITH(split.forward(x, &table), ShapeError,
                    "ParallelLlamaDecoderLayer::forward: rank 1: the values of x differ");
  expect_in_step();
}

TEST_F(Agreement, ADecoderLayersAttentionCacheWrongOnOneRankIsRefusedBeforeAnyGradient) {
  // The attention block's backward runs after the FFN's has added to its gradients: its cache
  // is checked in the layer's own agreement, so the refusal leaves every gradient at zero.
  const auto& comm = world();
  using Layer = parallel::ParallelLlamaDecoderLayer<float>;
  const auto config = small_llama();
  const DecoderLayer<float, llama_style> full(config, 12);
  Layer split(full, comm);
  std::mt19937_64 engine(6);
  const auto x = random_tensor<float, 3>({1, 4, config.d_model}, engine);
  const auto dy = random_tensor<float, 3>({1, 4, config.d_model}, engine);
  const RotaryTable<float> table(config.head_size(), config.context, config.rope_theta);
  typename Layer::Cache cache;
  split.forward(x, cache, &table);
  if (odd_one()) cache.attention.qkv.q = Tensor<float, 4>({1, 1, 3, config.head_size()});
  EXPECT_THROW_WITH(split.backward(x, cache, dy, &table), ShapeError,
                    "ParallelLlamaDecoderLayer::backward: rank 1: ParallelAttention::backward: "
                    "cache.qkv.q");
  double grads = 0;
  split.for_each_parameter(
      [&](const ParameterName&, auto, auto grad) { grads = std::max(grads, max_abs_of(grad)); });
  EXPECT_EQ(grads, 0.0);
  expect_in_step();
}

TEST_F(Agreement, DifferentFullDecoderLayersOrNormsOnEachRankAreRefused) {
  const auto& comm = world();
  const auto config = small_gpt2();
  const DecoderLayer<float, gpt2_style> other(config, 11 + static_cast<std::uint64_t>(comm.rank()));
  EXPECT_THROW_WITH(parallel::ParallelGPT2Block<float>(other, comm), ShapeError,
                    "ColumnParallelLinear: rank 1: the values of the full layer's weight and bias");
  // The same linear layers, but rank 1's first norm has another γ.
  DecoderLayer<float, gpt2_style> same(config, 11);
  if (odd_one()) same.attention_norm().weight()(0) = 2.0f;
  EXPECT_THROW_WITH(parallel::ParallelGPT2Block<float>(same, comm), ShapeError,
                    "ParallelGPT2Block: rank 1: the values of the norms' parameters differ");
  expect_in_step();
}

}  // namespace test_parallel_agreement
}  // namespace dissect::testing
