// bench_prefill — a whole LLaMA's fp32 prefill against the packed GEMM on the same products, in
// one run (issue 30 item 2: prefill at ≥ 80 % of the GEMM's GFLOP/s). TinyLlama-1.1B's shape (D
// 2048, H 32, H_kv 4, F 5632, V 32000) with L = 2 layers, so that the model fits beside other
// work: every layer is the same products, and the head runs on one row either way.
//
//   prefill/tinyllama-L2/<packed|unpacked>/T=128/threads=<t>
//       LlamaModel::forward_last of a 128-token prompt into a fresh KV cache (what `dissect
//       generate` times as prefill): embedding, norms, RoPE, attention, SwiGLU and all
//   gemm/tinyllama-L2/T=128/threads=<t>
//       only the products of that prefill, as packed_matmul calls on packed weights of the same
//       shapes: per layer qkv 2048→2560, o 2048→2048, gate and up 2048→5632, down 5632→2048 at
//       M = 128, then the head 2048→32000 at M = 1
//
// Both count the same flops: 2·M·N·K over those products (attention's 2·T²·D per layer, 1 % of
// them at T = 128, is not counted), so prefill's GFLOP/s over the gemm case's is the share of a
// prefill that runs at the GEMM's rate.
//
//   OMP_NUM_THREADS=2 bench_prefill --benchmark_repetitions=3
//   --benchmark_enable_random_interleaving=true
#include <array>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "dissect/kernels/gemm.hpp"
#include "dissect/models/decoder_model.hpp"

namespace dissect::bench {
namespace {

constexpr index_t prompt = 128;

TransformerConfig tinyllama_layers(index_t layers) {
  TransformerConfig config;
  config.d_model = 2048;
  config.n_layers = layers;
  config.n_heads = 32;
  config.n_kv_heads = 4;
  config.d_ff = 5632;
  config.vocab = 32000;
  config.context = 2048;
  config.tied_embeddings = false;
  config.positions = Positions::rotary;
  config.norm = Norm::rms_norm;
  config.ffn = Ffn::gated;
  config.bias = false;
  return config;
}

/// The products of one prefill: {M, N, K} in the order the model runs them.
std::vector<std::array<index_t, 3>> products(const TransformerConfig& c) {
  const index_t kv = c.kv_heads() * c.head_size();
  std::vector<std::array<index_t, 3>> out;
  for (index_t l = 0; l < c.n_layers; ++l) {
    out.push_back({prompt, c.d_model + 2 * kv, c.d_model});  // qkv
    out.push_back({prompt, c.d_model, c.d_model});           // o
    out.push_back({prompt, c.d_ff, c.d_model});              // gate
    out.push_back({prompt, c.d_ff, c.d_model});              // up
    out.push_back({prompt, c.d_model, c.d_ff});              // down
  }
  out.push_back({1, c.vocab, c.d_model});  // the head, on the last position only
  return out;
}

double flops_of(const std::vector<std::array<index_t, 3>>& list) {
  double flops = 0;
  for (const auto& [m, n, k] : list) flops += 2.0 * double(m) * double(n) * double(k);
  return flops;
}

void bench_prefill(benchmark::State& state, bool packed, int threads) {
  use_threads(threads);
  const TransformerConfig config = tinyllama_layers(2);
  LlamaModel<float> model(config, {.seed = 1});
  if (packed) model.pack();
  std::vector<index_t> ids(prompt);
  for (index_t t = 0; t < prompt; ++t) ids[t] = (t * 7919) % config.vocab;
  auto kv = model.make_kv_cache(1, prompt);
  for (auto _ : state) {
    kv.clear();
    auto logits = model.forward_last(TokenBatch{ids, 1, prompt}, kv);
    benchmark::DoNotOptimize(logits.data());
  }
  set_flops(state, flops_of(products(config)));
  state.SetLabel(context_label(threads) + (packed ? ", packed at load" : ", unpacked"));
}

void bench_products(benchmark::State& state, int threads) {
  use_threads(threads);
  const auto list = products(tinyllama_layers(2));
  std::vector<PackedWeight> weights;
  std::vector<Tensor<float, 2>> xs, ys;
  for (const auto& [m, n, k] : list) {
    const auto w = random_tensor<2>({n, k}, 3);
    weights.emplace_back(w.data(), n, k, k);
    xs.push_back(random_tensor<2>({m, k}, 4));
    ys.emplace_back(Shape<2>{m, n});
  }
  for (auto _ : state) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      packed_matmul(xs[i].data(), list[i][2], list[i][0], weights[i], ys[i].data(), list[i][1],
                    Epilogue{});
    }
    benchmark::DoNotOptimize(ys.back().data());
  }
  set_flops(state, flops_of(list));
  state.SetLabel(context_label(threads) + ", packed_matmul on the prefill's products");
}

void register_all() {
  for (int threads : {1, 2}) {
    const std::string s = "/T=128/threads=" + std::to_string(threads);
    benchmark::RegisterBenchmark(("prefill/tinyllama-L2/packed" + s).c_str(), bench_prefill, true,
                                 threads)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("prefill/tinyllama-L2/unpacked" + s).c_str(), bench_prefill,
                                 false, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("gemm/tinyllama-L2" + s).c_str(), bench_products, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  return dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
}
