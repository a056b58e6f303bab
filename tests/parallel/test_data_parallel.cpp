// Tests of dissect/parallel/data_parallel.hpp on the ranks of MPI_COMM_WORLD (ctest runs them on
// 2 ranks and on 1). Every rank builds the same small GPT-2 or LLaMA and takes its rows of one
// global batch; the references are computed on each rank alone, without MPI:
//   - one process on the whole batch (the thing data parallelism stands in for): equal within
//     the rounding bound of a different summation order over the batch;
//   - one process that accumulates the n slices' gradients in rank order and scales by 1/n
//     (gradients.hpp): bitwise equal, since that is the reduction's fixed order.
// ZeRO stage 1 must give bitwise the values of the unsharded run. Bad input (rows 98, 99) makes
// every rank throw the same error; a rank that throws brings the others down within seconds.
#include <gtest/gtest.h>
#include <unistd.h>  // alarm

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "dissect/models/decoder_model.hpp"
#include "dissect/parallel/data_parallel.hpp"
#include "dissect/training/gradients.hpp"
#include "dissect/training/optim.hpp"
#include "parallel/parallel_testing.hpp"
#include "support/small_models.hpp"

namespace dissect::testing {
namespace test_data_parallel {

using parallel::batch_rows;
using parallel::DataParallel;
using parallel::DataParallelOptions;

/// Every test runs under alarm(30): a rank stuck in a collective is killed (SIGALRM), and
/// mpiexec ends the other, long before ctest's TIMEOUT. Each test takes well under a second.
class DataParallelTest : public ::testing::Test {
 protected:
  void SetUp() override { alarm(30); }
  void TearDown() override { alarm(0); }
};

/// A global batch of B sequences of T ids and its targets, the same on every rank (fixed seed).
struct GlobalBatch {
  index_t B, T;
  std::vector<index_t> inputs, targets;
  GlobalBatch(index_t batch, index_t seq, index_t vocab, std::uint64_t seed)
      : B(batch),
        T(seq),
        inputs(random_ids(static_cast<std::size_t>(batch * seq), vocab, seed)),
        targets(random_ids(static_cast<std::size_t>(batch * seq), vocab, seed + 1)) {}
  TokenBatch rows(index_t begin, index_t end) const {
    return {std::span<const index_t>(inputs).subspan(static_cast<std::size_t>(begin * T),
                                                     static_cast<std::size_t>((end - begin) * T)),
            end - begin, T};
  }
  std::span<const index_t> targets_of(index_t begin, index_t end) const {
    return std::span<const index_t>(targets).subspan(static_cast<std::size_t>(begin * T),
                                                     static_cast<std::size_t>((end - begin) * T));
  }
};

template <class Model>
using ScalarOf = typename Model::scalar_type;

/// Every gradient of `model`, flattened in parameters_of order.
template <class Model>
std::vector<ScalarOf<Model>> gradients_of(Model& model) {
  std::vector<ScalarOf<Model>> out;
  for (const auto& p : parameters_of(model)) out.insert(out.end(), p.grad.begin(), p.grad.end());
  return out;
}

/// Every value of `model`, flattened in parameters_of order.
template <class Model>
std::vector<ScalarOf<Model>> values_of(Model& model) {
  std::vector<ScalarOf<Model>> out;
  for (const auto& p : parameters_of(model)) out.insert(out.end(), p.value.begin(), p.value.end());
  return out;
}

template <class Scalar>
bool bitwise_equal(const std::vector<Scalar>& a, const std::vector<Scalar>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(Scalar)) == 0;
}

/// One process: the gradients of `batch`'s n slices, each computed from zero, summed in slice
/// order and multiplied by 1/n (in Scalar, as the reduction and scale_grad do).
template <class Model>
std::vector<ScalarOf<Model>> sum_of_slices(Model& model, const GlobalBatch& batch, int n,
                                           typename Model::Cache& cache) {
  using Scalar = ScalarOf<Model>;
  std::vector<Scalar> sum;
  for (int r = 0; r < n; ++r) {
    const auto slice = batch_rows(batch.B, r, n);
    model.zero_grad();
    model.loss_and_backward(batch.rows(slice.begin, slice.end),
                            batch.targets_of(slice.begin, slice.end), cache);
    const auto g = gradients_of(model);
    if (r == 0) {
      sum = g;
    } else {
      for (std::size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
  }
  const auto scale = static_cast<Scalar>(1.0 / n);
  for (auto& value : sum) value *= scale;
  return sum;
}

/// The n-rank gradient against both references, for one model kind and scalar type.
template <class Model>
void expect_gradients_of_the_global_batch(const TransformerConfig& config) {
  using Scalar = ScalarOf<Model>;
  const auto& comm = world();
  const int n = comm.size();
  const GlobalBatch batch(4, config.context, config.vocab, 17);
  typename Model::Cache cache;

  Model model(config, {.init_std = 0.5, .seed = 3});  // 0.5: gradients well away from zero
  DataParallel<Scalar> dp(comm, parameters_of(model));
  const auto rows = dp.local_rows(batch.B);
  model.zero_grad();
  const double loss = dp.compute_gradients([&] {
    return model.loss_and_backward(batch.rows(rows.begin, rows.end),
                                   batch.targets_of(rows.begin, rows.end), cache);
  });
  const auto got = gradients_of(model);

  // Reference 1: one process, the whole batch.
  Model whole(config, {.init_std = 0.5, .seed = 3});
  whole.zero_grad();
  const double whole_loss = whole.loss_and_backward(batch.rows(0, batch.B), batch.targets, cache);
  const auto expected = gradients_of(whole);

  // Reference 2: one process, each slice's gradient on its own (from zero), summed in rank order
  // and scaled by 1/n — written out here, apart from the library's bucket, shards and MPI.
  Model sliced(config, {.init_std = 0.5, .seed = 3});
  EXPECT_TRUE(bitwise_equal(got, sum_of_slices(sliced, batch, n, cache)))
      << "the reduction's order is rank 0, + rank 1, …, × 1/n";

  // The two orders of the batch sum differ by rounding only. A gradient entry is a chain of
  // sums (over the B·T rows of the batch, over D, F, T and V inside the layers); block_bound's
  // argument (parallel_testing.hpp) with `length` the sum of those lengths bounds the gap,
  // relative to max(1, max|g|) (a wrong scale, a missing or doubled rank is off by ~|g|).
  const index_t length = batch.B * config.context +
                         config.n_layers * (config.d_model + config.d_ff + config.context) +
                         config.vocab;
  Tensor<Scalar, 1> expected_tensor(Shape<1>{static_cast<index_t>(expected.size())},
                                    std::vector<Scalar>(expected));
  const double bound = block_bound<Scalar>(length, n, expected_tensor);
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(got[i]) - expected[i]));
  }
  EXPECT_LE(worst, bound) << "max |data-parallel − one process| over " << got.size()
                          << " gradients";
  EXPECT_NEAR(loss, whole_loss, bound);
  EXPECT_GT(max_abs_of(expected_tensor), 0.0);

  // Bitwise the same gradients and loss on every rank (the replicas stay replicas).
  parallel::Checksum sum;
  sum.add(std::span<const Scalar>(got));
  sum.add(loss);
  EXPECT_NO_THROW(
      comm.agree("test", {.replicated = {{"the gradients and loss", sum.value()}}}, [] {}));
}

TEST_F(DataParallelTest, GPT2GradientsAreThoseOfTheGlobalBatch) {
  expect_gradients_of_the_global_batch<GPT2Model<double>>(small_gpt2());
  expect_gradients_of_the_global_batch<GPT2Model<float>>(small_gpt2());
}

TEST_F(DataParallelTest, LlamaGradientsAreThoseOfTheGlobalBatch) {
  expect_gradients_of_the_global_batch<LlamaModel<double>>(small_llama());
  expect_gradients_of_the_global_batch<LlamaModel<float>>(small_llama());
}

// ---- AdamW steps, with and without ZeRO-1 -------------------------------------------------------

/// The model's parameters in train_gpt's two groups: matrices (weight decay) and the rest.
template <class Model>
std::pair<std::vector<ParameterRef<float>>, std::vector<ParameterRef<float>>> groups_of(
    Model& model) {
  std::vector<ParameterRef<float>> matrices, others;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto grad) {
    auto& group = rank_of<decltype(value)> == 2 ? matrices : others;
    group.push_back(parameter(value, grad, name.str()));
  });
  return {std::move(matrices), std::move(others)};
}

constexpr AdamWOptions kDecay{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0.1};
constexpr AdamWOptions kNoDecay{.lr = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .weight_decay = 0};
constexpr int kSteps = 3;

/// kSteps AdamW steps (two groups) on rank-sliced batches; returns the values after them.
std::vector<float> train_data_parallel(bool zero, const GlobalBatch& batch) {
  GPT2Model<float> model(small_gpt2(), {.init_std = 0.5, .seed = 3});
  auto [matrices, others] = groups_of(model);
  std::vector<ParameterRef<float>> all = matrices;
  all.insert(all.end(), others.begin(), others.end());
  DataParallel<float> dp(world(), all, {.shard_optimizer = zero});
  AdamW<float> decay(dp.optimizer_parameters(matrices), kDecay);
  AdamW<float> no_decay(dp.optimizer_parameters(others), kNoDecay);
  if (zero && world().size() > 1) {
    // The state is the shard's only: ⌈N/n⌉ or fewer values, not N.
    EXPECT_LE(decay.parameter_count() + no_decay.parameter_count(),
              (dp.parameter_count() + world().size() - 1) / world().size());
  }
  typename GPT2Model<float>::Cache cache;
  const auto rows = dp.local_rows(batch.B);
  for (int step = 0; step < kSteps; ++step) {
    model.zero_grad();
    dp.compute_gradients([&] {
      return model.loss_and_backward(batch.rows(rows.begin, rows.end),
                                     batch.targets_of(rows.begin, rows.end), cache);
    });
    decay.step();
    no_decay.step();
    dp.synchronize_parameters();
  }
  return values_of(model);
}

/// The same steps in one process: the whole batch at once, or its n slices accumulated.
std::vector<float> train_one_process(const GlobalBatch& batch, int slices) {
  GPT2Model<float> model(small_gpt2(), {.init_std = 0.5, .seed = 3});
  auto [matrices, others] = groups_of(model);
  AdamW<float> decay(matrices, kDecay);
  AdamW<float> no_decay(others, kNoDecay);
  typename GPT2Model<float>::Cache cache;
  for (int step = 0; step < kSteps; ++step) {
    if (slices == 1) {
      model.zero_grad();
      model.loss_and_backward(batch.rows(0, batch.B), batch.targets, cache);
    } else {
      // Each slice from zero, summed in order (sum_of_slices), written back as the gradients.
      const auto sum = sum_of_slices(model, batch, slices, cache);
      std::size_t at = 0;
      for (const auto& p : parameters_of(model)) {
        std::copy_n(sum.begin() + static_cast<std::ptrdiff_t>(at), p.size(), p.grad.begin());
        at += static_cast<std::size_t>(p.size());
      }
    }
    decay.step();
    no_decay.step();
  }
  return values_of(model);
}

TEST_F(DataParallelTest, AdamWStepsWithAndWithoutZeroEqualOneProcess) {
  const GlobalBatch batch(4, small_gpt2().context, small_gpt2().vocab, 29);
  const auto plain = train_data_parallel(false, batch);
  const auto sharded = train_data_parallel(true, batch);
  EXPECT_TRUE(bitwise_equal(plain, sharded)) << "ZeRO-1 makes the same updates, element by element";
  EXPECT_TRUE(bitwise_equal(plain, train_one_process(batch, world().size())))
      << "bitwise one process accumulating the ranks' slices in order";
  // Against one process on the whole batch: the gradients differ by rounding (the tests above).
  // Adam divides each gradient by its own running magnitude, so an entry that is zero but for
  // rounding — a key bias's gradient (softmax ignores a shift of every key), a LayerNorm's mean
  // direction — moves by ±lr on either side whatever its noise; no bound below Adam's step
  // holds for those. Every other entry moves by lr·m/√v with sensitivity ~ δ/|g| to a gradient
  // gap δ, far below lr. So: 99 % of the values within 10⁻³·lr per step (measured: the 99th
  // percentile 1.2e-7, the median 0), and all within Adam's largest step, lr/(1 − β1)… ≤ 3·lr.
  const auto whole = train_one_process(batch, 1);
  std::vector<double> gaps(plain.size());
  for (std::size_t i = 0; i < plain.size(); ++i) {
    gaps[i] = std::abs(static_cast<double>(plain[i]) - whole[i]);
  }
  std::sort(gaps.begin(), gaps.end());
  EXPECT_LE(gaps[gaps.size() * 99 / 100], 1e-3 * kDecay.lr * kSteps);
  EXPECT_LE(gaps.back(), 3 * kDecay.lr * kSteps);
  // And the steps did move the values (a test whose runs never train could not fail).
  const auto start = values_of(
      *std::make_unique<GPT2Model<float>>(small_gpt2(), ModelOptions{.init_std = 0.5, .seed = 3}));
  EXPECT_FALSE(bitwise_equal(plain, start));
}

TEST_F(DataParallelTest, ShardsCoverEveryValueOnceAndStayPut) {
  GPT2Model<float> model(small_gpt2(), {.seed = 5});
  const auto all = parameters_of(model);
  DataParallel<float> dp(world(), all, {.shard_optimizer = true});
  const auto own = dp.shard();
  const auto mine = dp.optimizer_parameters(all);
  index_t count = 0;
  for (const auto& p : mine) count += p.size();
  EXPECT_EQ(count, own.size());
  std::int64_t total = count;
  world().all_reduce_sum(std::span<std::int64_t>(&total, 1));
  EXPECT_EQ(total, dp.parameter_count());
  // Unsharded, the optimizer sees the group as given.
  DataParallel<float> plain(world(), all);
  EXPECT_EQ(plain.optimizer_parameters(all).size(), all.size());
  // A parameter of another model is refused by name.
  GPT2Model<float> other(small_gpt2(), {.seed = 5});
  EXPECT_THROW_WITH(dp.optimizer_parameters(parameters_of(other)), Error,
                    "DataParallel::optimizer_parameters: parameter \"wte.weight\" is not one of");
}

TEST_F(DataParallelTest, CommunicatorAllToAllAndAllGatherInto) {
  const auto& comm = world();
  const int n = comm.size(), r = comm.rank();
  // send block p = 100·r + p (two values each): block p of receive comes from rank p.
  std::vector<double> send(static_cast<std::size_t>(2 * n)), receive(send.size());
  for (int p = 0; p < n; ++p) send[2 * p] = send[2 * p + 1] = 100.0 * r + p;
  comm.all_to_all(std::span<const double>(send), std::span<double>(receive));
  for (int p = 0; p < n; ++p) EXPECT_EQ(receive[static_cast<std::size_t>(2 * p)], 100.0 * p + r);
  std::vector<float> out(static_cast<std::size_t>(n));
  out[static_cast<std::size_t>(r)] = static_cast<float>(r + 1);  // in place
  comm.all_gather_into(std::span<const float>(out.data() + r, 1), std::span<float>(out));
  for (int p = 0; p < n; ++p) EXPECT_EQ(out[static_cast<std::size_t>(p)], p + 1.0f);
  EXPECT_THROW_WITH(comm.all_gather_into(std::span<const float>(out.data(), 1),
                                         std::span<float>(out.data(), out.size() + 1)),
                    ShapeError, "Communicator::all_gather_into: out holds");
}

// ---- bad input and failures (rows 98, 99) -------------------------------------------------------

TEST_F(DataParallelTest, ABatchThatRanksCannotSplitEvenlyIsAConfigError) {
  EXPECT_THROW_WITH(batch_rows(5, 0, 2), ConfigError,
                    "batch_rows: the global batch of 5 rows is not divisible by 2 ranks");
  EXPECT_THROW_WITH(batch_rows(4, 2, 2), ConfigError, "batch_rows: rank 2 of 2 ranks");
  EXPECT_EQ(batch_rows(6, 1, 3).begin, 2);
  EXPECT_EQ(batch_rows(6, 1, 3).end, 4);
  GPT2Model<float> model(small_gpt2(), {.seed = 5});
  DataParallel<float> dp(world(), parameters_of(model));
  if (world().size() == 2) {
    EXPECT_THROW_WITH(dp.local_rows(7), ConfigError, "global batch of 7 rows is not divisible");
  }
}

TEST_F(DataParallelTest, RanksWithOtherParametersAreRefusedOnEveryRank) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const bool odd = world().rank() == 1;
  // Another size on rank 1: the entry-by-entry message.
  auto small = small_gpt2();
  if (odd) small.d_ff = 48;
  GPT2Model<float> model(small, {.seed = 5});
  EXPECT_THROW_WITH(DataParallel<float>(world(), parameters_of(model)), ShapeError,
                    "DataParallel: ranks disagree about the options and the parameters");
  // The same shapes, other values (another seed) on rank 1.
  GPT2Model<float> seeded(small_gpt2(), {.seed = odd ? 6u : 5u});
  EXPECT_THROW_WITH(DataParallel<float>(world(), parameters_of(seeded)), ShapeError,
                    "DataParallel: rank 1: the values of the parameters differ from rank 0's");
  // ZeRO on one rank only.
  GPT2Model<float> same(small_gpt2(), {.seed = 5});
  EXPECT_THROW_WITH(DataParallel<float>(world(), parameters_of(same), {.shard_optimizer = odd}),
                    ShapeError, "entry 0 is 0 on some ranks and 1 on others");
}

TEST_F(DataParallelTest, ARankThatThrowsBringsTheOthersDownWithItsMessage) {
  const auto& comm = world();
  GPT2Model<float> model(small_gpt2(), {.seed = 5});
  DataParallel<float> dp(comm, parameters_of(model));
  const auto before = values_of(model);
  const auto start = std::chrono::steady_clock::now();
  const int last = comm.size() - 1;
  // The last rank fails (on 1 rank, rank 0 itself): a bad batch, as a model would refuse it.
  const std::string expected =
      comm.size() > 1 ? "DataParallel::compute_gradients: rank 1: Embedding::forward: id 99"
                      : "Embedding::forward: id 99 at [0, 1] >= V = 23";
  EXPECT_THROW_WITH(dp.compute_gradients([&]() -> float {
    if (comm.rank() == last) throw ShapeError("Embedding::forward: id 99 at [0, 1] >= V = 23");
    return 1.0f;
  }),
                    ShapeError, expected);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  // A NaN loss on one rank is NaN on every rank: each one's divergence check fires alike.
  const double loss = dp.compute_gradients(
      [&] { return comm.rank() == last ? std::numeric_limits<float>::quiet_NaN() : 2.0f; });
  EXPECT_TRUE(std::isnan(loss));
  // The failed step was not counted: the ranks are still in step, the values untouched.
  model.zero_grad();
  EXPECT_EQ(dp.compute_gradients([] { return 3.0f; }), 3.0);
  EXPECT_TRUE(bitwise_equal(before, values_of(model)));
  EXPECT_EQ(dp.stats().reductions, 2);
}

TEST_F(DataParallelTest, ARankAStepAheadIsCaughtNotAHang) {
  if (world().size() < 2) GTEST_SKIP() << "needs 2 ranks";
  GPT2Model<float> model(small_gpt2(), {.seed = 5});
  DataParallel<float> dp(world(), parameters_of(model));
  DataParallel<float> other(world(), parameters_of(model));
  EXPECT_NO_THROW(dp.compute_gradients([] { return 1.0f; }));
  // Rank 0 now steps `other` (its first step), rank 1 `dp` (its second): a mistake that would
  // pair the wrong collectives is the same ShapeError on both ranks instead.
  auto& mine = world().rank() == 0 ? other : dp;
  EXPECT_THROW_WITH(mine.compute_gradients([] { return 1.0f; }), ShapeError,
                    "DataParallel::compute_gradients: ranks disagree about the number of steps "
                    "taken: entry 0 is 0 on some ranks and 1 on others");
}

}  // namespace test_data_parallel
}  // namespace dissect::testing
