// bench_decode — the memory-bound regime: M = 1 (one token decoded) and M = 8 (a small batch)
// at 7B shapes, with the weights streamed from DRAM: each iteration uses the next of several
// copies of the layer, together far larger than the caches, so no weight is ever reused from
// cache. Reports weight bytes read per second for 1 and 2 threads.
//
// batched/: whole models decoding B = 1 … 16 sequences at once over a paged KV cache (one forward
// per step, the linear layers over [B, D]): tokens per second summed over the sequences, on a
// 7B-shaped layer stack and on GPT-2 small (random weights, packed as for inference).
//
//   bench_decode --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
//   OMP_NUM_THREADS=2 bench_decode --benchmark_filter=batched/ --benchmark_repetitions=3
#include <cstring>
#include <memory>

#include "bench_support.hpp"
#include "dissect/models/decoder_model.hpp"

namespace dissect::bench {
namespace {

constexpr double streamed_bytes = 512e6;  // > 15× the 32 MiB L3

struct Case {
  LinearShape shape;
  index_t tokens;
  int threads;
};

/// Enough copies of the weights that cycling through them always misses the caches.
struct Rotation {
  explicit Rotation(const Case& c) {
    const double layer_bytes = double(c.shape.in) * double(c.shape.out) * sizeof(float);
    const int copies = std::max(2, int(std::ceil(streamed_bytes / layer_bytes)));
    for (int i = 0; i < copies; ++i)
      layers.emplace_back(c.shape.in, c.shape.out, LinearOptions{.seed = std::uint64_t(i)});
  }
  const Linear<float>& next() { return layers[index++ % layers.size()]; }
  std::vector<Linear<float>> layers;
  std::size_t index = 0;
};

void report(benchmark::State& state, const Case& c) {
  const double weights = double(c.shape.in) * double(c.shape.out);
  set_weight_bytes(state, weights * sizeof(float));
  set_flops(state, 2.0 * double(c.tokens) * weights);
  state.SetLabel(context_label(c.threads));
}

void decode_dissect(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Rotation rotation(c);
  auto x = random_tensor<2>({c.tokens, c.shape.in}, 7);
  Tensor<float, 2> y({c.tokens, c.shape.out});
  rotation.layers[0].forward_into(x, y);
  verify_rows("decode/dissect", x, rotation.layers[0].weight(), rotation.layers[0].bias(), y);
  for (auto _ : state) {
    rotation.next().forward_into(x, y);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  report(state, c);
}

void decode_eigen_expr(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Rotation rotation(c);
  auto x = random_tensor<2>({c.tokens, c.shape.in}, 7);
  Tensor<float, 2> y({c.tokens, c.shape.out});
  auto run = [&](const Linear<float>& layer) {
    auto out = y.matrix();
    out.noalias() = std::as_const(x).matrix() * layer.weight().matrix().transpose();
    out.rowwise() += layer.bias().vector().transpose();
  };
  run(rotation.layers[0]);
  verify_rows("decode/baseline_eigen_expr", x, rotation.layers[0].weight(),
              rotation.layers[0].bias(), y);
  for (auto _ : state) {
    run(rotation.next());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  report(state, c);
}

#if DISSECT_BENCH_CBLAS
void decode_cblas(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Rotation rotation(c);
  auto x = random_tensor<2>({c.tokens, c.shape.in}, 7);
  Tensor<float, 2> y({c.tokens, c.shape.out});
  const int m = int(c.tokens), n = int(c.shape.out), k = int(c.shape.in);
  auto run = [&](const Linear<float>& layer) {
    for (int row = 0; row < m; ++row)
      std::memcpy(y.data() + std::size_t(row) * n, layer.bias().data(), n * sizeof(float));
    if (m == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, layer.weight().data(), k, x.data(), 1,
                  1.0f, y.data(), 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, x.data(), k,
                  layer.weight().data(), k, 1.0f, y.data(), n);
    }
  };
  run(rotation.layers[0]);
  verify_rows("decode/baseline_cblas", x, rotation.layers[0].weight(), rotation.layers[0].bias(),
              y);
  for (auto _ : state) {
    run(rotation.next());
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  report(state, c);
}
#endif

// ---- batched decoding over a paged KV cache ----------------------------------------------------

// LLaMA-7B's layer (D 4096, H 32, F 11008, SwiGLU, RMSNorm, RoPE) twice, with a 256-token
// vocabulary so that the layers, not the head, are what a step reads (2 × 202M parameters,
// 1.6 GB in fp32); GPT-2 small whole (124M parameters with its tied 50257-token head).
TransformerConfig llama7b_stack() {
  return {.d_model = 4096,
          .n_layers = 2,
          .n_heads = 32,
          .d_ff = 11008,
          .vocab = 256,
          .context = 256,
          .tied_embeddings = false,
          .positions = Positions::rotary,
          .norm = Norm::rms_norm,
          .bias = false,
          .ffn = Ffn::gated};
}
TransformerConfig gpt2_small() {
  return {
      .d_model = 768, .n_layers = 12, .n_heads = 12, .d_ff = 3072, .vocab = 50257, .context = 1024};
}

/// One model per kind for the whole run: building and packing the 7B stack takes seconds.
template <class Model>
const Model& shared_model(const TransformerConfig& config) {
  static std::unique_ptr<Model> model;
  if (!model) {
    model = std::make_unique<Model>(config, ModelOptions{.seed = 1});
    model->pack();
  }
  return *model;
}

constexpr index_t batched_prompt = 32;  // each sequence's prefill before the timed steps
constexpr index_t batched_steps = 96;   // steps before the sequences start again

/// A decode step's logits for two sequences against each decoded alone with a KVCache: a wrong
/// batched forward must not produce a number.
template <class Model>
void verify_batched(const Model& model) {
  auto paged = model.make_paged_kv_cache(64);
  std::vector<index_t> ids, prompt(batched_prompt);
  for (index_t b = 0; b < 2; ++b) {
    for (index_t t = 0; t < batched_prompt; ++t) prompt[t] = (7 * t + 13 * b) % 251;
    ids.push_back(paged.add_sequence());
    const index_t one[] = {ids.back()};
    model.forward(TokenBatch{prompt, 1, batched_prompt}, paged, one);
  }
  const std::vector<index_t> step{5, 9};
  const auto batched = model.forward(TokenBatch{step, 2, 1}, paged, ids);
  const index_t V = model.config().vocab;
  for (index_t b = 0; b < 2; ++b) {
    for (index_t t = 0; t < batched_prompt; ++t) prompt[t] = (7 * t + 13 * b) % 251;
    auto cache = model.make_kv_cache(1);
    model.forward(TokenBatch{prompt, 1, batched_prompt}, cache);
    const auto alone = model.forward(TokenBatch{std::span(&step[b], 1), 1, 1}, cache);
    double worst = 0, scale = 0;
    for (index_t v = 0; v < V; ++v) {
      worst = std::max(worst, double(std::abs(batched.data()[b * V + v] - alone.data()[v])));
      scale = std::max(scale, double(std::abs(alone.data()[v])));
    }
    if (!(worst <= 1e-3 * scale + 1e-5)) {
      std::fprintf(stderr, "batched decode: row %td differs from decoding alone by %g (max %g)\n",
                   b, worst, scale);
      std::exit(1);
    }
  }
}

template <class Model>
void decode_batched(benchmark::State& state, const TransformerConfig& config, index_t batch,
                    int threads) {
  use_threads(threads);
  const auto& model = shared_model<Model>(config);
  static bool verified = false;
  if (!verified) {
    verify_batched(model);
    verified = true;
  }
  auto paged = model.make_paged_kv_cache(batch * ((batched_prompt + batched_steps) / 16 + 2));
  std::vector<index_t> ids(static_cast<std::size_t>(batch)), prompt(batched_prompt),
      tokens(static_cast<std::size_t>(batch));
  index_t steps = 0;
  // Every sequence restarts from its prompt after batched_steps steps (outside the timing), so
  // each timed step attends to 32 … 127 positions.
  const auto restart = [&] {
    for (index_t b = 0; b < batch; ++b) {
      if (steps > 0) paged.release(ids[b]);
      ids[b] = paged.add_sequence();
      for (index_t t = 0; t < batched_prompt; ++t) prompt[t] = (7 * t + 13 * b + 1) % 251;
      const index_t one[] = {ids[b]};
      model.forward(TokenBatch{prompt, 1, batched_prompt}, paged, one);
      tokens[b] = b % 251;
    }
    steps = 0;
  };
  restart();
  for (auto _ : state) {
    if (steps == batched_steps) {
      state.PauseTiming();
      restart();
      state.ResumeTiming();
    }
    const auto logits = model.forward(TokenBatch{tokens, batch, 1}, paged, ids);
    benchmark::DoNotOptimize(logits.data());
    ++steps;
  }
  state.counters["tokens/s"] = benchmark::Counter(
      double(batch), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  set_flops(state, 2.0 * double(batch) * double(model.parameter_count()));
  state.SetLabel(context_label(threads));
}

void register_all() {
  {
    std::vector<int> thread_counts = {1};
#ifdef _OPENMP
    if (omp_get_max_threads() > 1) thread_counts.push_back(omp_get_max_threads());
#endif
    for (const char* kind : {"gpt2-small", "llama7b-2layers"}) {
      for (int threads : thread_counts) {
        for (index_t batch : {1, 2, 4, 8, 16}) {
          const std::string name = std::string("batched/") + kind + "/B=" + std::to_string(batch) +
                                   "/threads=" + std::to_string(threads);
          auto* bench =
              kind[0] == 'g'
                  ? benchmark::RegisterBenchmark(name.c_str(), decode_batched<GPT2Model<float>>,
                                                 gpt2_small(), batch, threads)
                  : benchmark::RegisterBenchmark(name.c_str(), decode_batched<LlamaModel<float>>,
                                                 llama7b_stack(), batch, threads);
          bench->Unit(benchmark::kMillisecond)->UseRealTime();
        }
      }
    }
  }
  std::vector<int> thread_counts = {1};
#ifdef _OPENMP
  if (omp_get_max_threads() > 1) thread_counts.push_back(omp_get_max_threads());
#endif
  for (const auto& shape : llama7b_shapes) {
    for (index_t tokens : {1, 8}) {
      for (int threads : thread_counts) {
        const Case c{shape, tokens, threads};
        const std::string s = std::to_string(shape.in) + "x" + std::to_string(shape.out) +
                              "/M=" + std::to_string(tokens) +
                              "/threads=" + std::to_string(threads);
        auto add = [&](const std::string& name, auto function) {
          benchmark::RegisterBenchmark(name.c_str(), function, c)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        };
        add("decode/dissect/" + s, decode_dissect);
        add("decode/baseline_eigen_expr/" + s, decode_eigen_expr);
#if DISSECT_BENCH_CBLAS
        add(std::string(tokens == 1 ? "decode/baseline_cblas_sgemv/"
                                    : "decode/baseline_cblas_sgemm/") +
                s,
            decode_cblas);
#endif
      }
    }
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  return dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
}
