// Tensor-parallel LLaMA layer forward (dissect::parallel over MPI): tokens/s, the share of the
// time spent inside all-reduce, and the all-reduce payload per token per layer measured next to
// tensor_parallel_budget's prediction. Run under mpiexec; only rank 0 prints.
//
//   mpiexec -n 1 ./bench_parallel          # the single-process baseline (still calls MPI)
//   mpiexec -n 2 ./bench_parallel          # the layer split over 2 ranks
//
// Every rank builds only its own slices (random weights: the speed does not depend on the
// values), so a 7B-shaped layer takes 1/P of its ~0.8 GB of fp32 weights on each rank.
//
// Counters (per benchmark row):
//   tok/s          B·T tokens per second through one layer (wall clock, rank 0; ranks wait for
//                  each other inside the all-reduces, so their times agree)
//   comm_share     seconds inside MPI_Allreduce / wall seconds
//   AR_B/tok       measured all-reduce payload bytes per token (per rank, the buffer given to
//                  MPI_Allreduce; a ring all-reduce sends 2(P−1)/P of it over the wire)
//   pred_B/tok     tensor_parallel_budget's all_reduce_bytes_per_token_per_layer (fp32)
//   weights_MB     this rank's share of the layer's weights
//
// The iteration count is fixed per case: Google Benchmark's adaptive count could differ between
// ranks, and a rank that stops early would leave the others waiting in a collective.
#include <benchmark/benchmark.h>
#include <mpi.h>

#include <array>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "dissect/accounting/budget.hpp"
#include "dissect/parallel/parallel_decoder_layer.hpp"

namespace dissect::bench {
namespace {

using parallel::ColumnParallelLinear;
using parallel::Communicator;
using parallel::ParallelLlamaDecoderLayer;
using parallel::RowParallelLinear;

struct LayerShape {
  const char* name;
  index_t d_model, n_heads, n_kv_heads, d_ff;
};

// 7B: LLaMA-7B's layer. small: the same structure at 1/8 of the width, for the smoke run.
constexpr std::array<LayerShape, 2> shapes{
    {{"llama7b", 4096, 32, 32, 11008}, {"small", 512, 8, 8, 1376}}};

const Communicator& world() {
  static Communicator communicator(MPI_COMM_WORLD);
  return communicator;
}

TransformerConfig config_of(const LayerShape& shape) {
  return {.d_model = shape.d_model,
          .n_layers = 1,
          .n_heads = shape.n_heads,
          .n_kv_heads = shape.n_kv_heads,
          .d_ff = shape.d_ff,
          .vocab = 32000,
          .context = 2048,
          .tied_embeddings = false,
          .positions = Positions::rotary,
          .norm = Norm::rms_norm,
          .bias = false,
          .ffn = Ffn::gated};
}

/// This rank's slices, built directly: the full layer never exists anywhere.
ParallelLlamaDecoderLayer<float> make_layer(const LayerShape& s, const Communicator& comm) {
  const index_t P = comm.size(), d_k = s.d_model / s.n_heads;
  const auto seed = static_cast<std::uint64_t>(100 + comm.rank());
  const auto linear = [&](index_t in, index_t out, std::uint64_t offset) {
    return Linear<float>(in, out, {.bias = false, .seed = seed + 10 * offset});
  };
  const std::array<index_t, 3> parts{s.n_heads * d_k, s.n_kv_heads * d_k, s.n_kv_heads * d_k};
  ColumnParallelLinear<float> qkv(linear(s.d_model, (parts[0] + parts[1] + parts[2]) / P, 1),
                                  parts[0] + parts[1] + parts[2], comm, parts);
  RowParallelLinear<float> proj(linear(s.d_model / P, s.d_model, 2), std::nullopt, s.d_model, comm);
  parallel::ParallelAttention<float> attention(std::move(qkv), std::move(proj), s.n_heads,
                                               s.n_kv_heads, comm);
  parallel::ParallelGatedFeedForward<float> ffn(
      ColumnParallelLinear<float>(linear(s.d_model, s.d_ff / P, 3), s.d_ff, comm),
      ColumnParallelLinear<float>(linear(s.d_model, s.d_ff / P, 4), s.d_ff, comm),
      RowParallelLinear<float>(linear(s.d_ff / P, s.d_model, 5), std::nullopt, s.d_ff, comm), comm);
  using Norm = RMSNorm<float>;
  return ParallelLlamaDecoderLayer<float>(Norm(s.d_model), std::move(attention), Norm(s.d_model),
                                          std::move(ffn), comm);
}

void layer_forward(benchmark::State& state, const LayerShape& shape, index_t tokens) {
  const auto& comm = world();
  const auto config = config_of(shape);
  const auto layer = make_layer(shape, comm);
  const RotaryTable<float> rope(config.head_size(), config.context, config.rope_theta);
  std::mt19937_64 engine(7);  // the same x on every rank, as the layer requires
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Tensor<float, 3> x({1, tokens, shape.d_model});
  for (auto& v : x) v = uniform(engine);
  typename ParallelLlamaDecoderLayer<float>::Cache cache;
  benchmark::DoNotOptimize(layer.forward(x, cache, &rope));  // warm the cache's buffers

  MPI_Barrier(comm.native());
  comm.reset_stats();
  const double start = MPI_Wtime();
  for (auto _ : state) {
    auto y = layer.forward(x, cache, &rope);
    benchmark::DoNotOptimize(y.data());
  }
  const double seconds = MPI_Wtime() - start;
  const auto stats = comm.stats();

  BudgetInputs inputs{.weight_dtype = Dtype::fp32, .kv_dtype = Dtype::fp32, .context = tokens};
  const auto tp =
      tensor_parallel_budget(compute_budget(config, inputs), config.d_model, comm.size());
  const double tokens_run = static_cast<double>(tokens) * static_cast<double>(state.iterations());
  state.counters["tok/s"] = benchmark::Counter(static_cast<double>(tokens),
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.counters["comm_share"] = stats.seconds / seconds;
  state.counters["AR_B/tok"] = static_cast<double>(stats.bytes) / tokens_run;
  state.counters["pred_B/tok"] = static_cast<double>(tp.all_reduce_bytes_per_token_per_layer);
  state.counters["AR_calls/it"] =
      static_cast<double>(stats.all_reduces) / static_cast<double>(state.iterations());
  state.counters["weights_MB"] = static_cast<double>(layer.parameter_count()) * 4.0 / 1e6;
  state.SetLabel(std::to_string(comm.size()) + (comm.size() == 1 ? " rank, " : " ranks, ") +
                 context_label(Eigen::nbThreads()) + " each");
}

void register_all() {
  for (const auto& shape : shapes) {
    const bool big = std::string(shape.name) == "llama7b";
    for (index_t tokens : {index_t{1}, index_t{128}}) {
      // Fixed iterations (see the top): about a second of work on this machine at 1 rank.
      const int iterations = big ? (tokens == 1 ? 20 : 3) : (tokens == 1 ? 200 : 20);
      const std::string name =
          std::string("tp_layer_forward/") + shape.name + "/B=1/T=" + std::to_string(tokens) + "/";
      benchmark::RegisterBenchmark(
          name.c_str(),
          [shape, tokens](benchmark::State& state) { layer_forward(state, shape, tokens); })
          ->Iterations(iterations)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
}

/// Discards everything: the reporter of ranks other than 0.
class NullReporter : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  int code = 0;
  {
    if (rank == 0) dissect::bench::print_context();
    dissect::bench::register_all();
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
      code = 1;
    } else if (rank == 0) {
      benchmark::RunSpecifiedBenchmarks();
    } else {
      dissect::bench::NullReporter null;
      benchmark::RunSpecifiedBenchmarks(&null);
    }
    benchmark::Shutdown();
  }
  // The world communicator (a static) is freed by its destructor only while MPI lives.
  MPI_Finalize();
  return code;
}
