// bench_attention — causal attention's paths at long contexts and at the mini-GPT's training
// shapes, GFLOP/s of the useful products (the causal triangle; backward counted as 2.5× forward,
// as FlashAttention-2 counts its five products against the forward's two):
//
//   attention/flash_fwd/T=<t>/threads=<n>         flash_attention(q, k, v, cache): keeps L only
//   attention/flash_bwd/T=<t>/threads=<n>         flash_attention_backward (P recomputed)
//   attention/online_fwd/T=<t>/threads=<n>        causal_attention_into: inference, no cache
//   attention/materialised_fwd/T=<t>/threads=<n>  causal_attention(q, k, v, cache): keeps P
//   attention/materialised_bwd/T=<t>/threads=<n>  causal_attention_backward from P
//   train/flash/<shape>/T=<t>/threads=<n>         flash forward + backward (one training step's
//   train/materialised/<shape>/T=<t>/threads=<n>  attention), against the materialised pair
//
// attention/: B = 1, H = 8, d_k = 64, T = 512 … 8,192 (materialised to 4,096: at 8,192 its P is
// 2 GiB). train/: the mini-GPT of examples/train_gpt (D = 128, 4 heads: d_k = 32, batch 8) and
// d_k = 64 (B = 4, H = 4), T = 32 … 1,024: where decoder_layer.hpp's threshold comes from.
//
//   bench_attention --benchmark_min_time=0.2 --benchmark_repetitions=3   (bench/README.md)
#include <algorithm>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "dissect/attention/attention.hpp"
#include "dissect/attention/flash_attention.hpp"

namespace dissect::bench {
namespace {

struct Case {
  index_t batch, heads, tokens, head_dim;
  int threads;
};

struct Inputs {
  Tensor<float, 4> q, k, v, dout;
  explicit Inputs(const Case& c)
      : q(random_tensor<4>({c.batch, c.heads, c.tokens, c.head_dim}, 1)),
        k(random_tensor<4>({c.batch, c.heads, c.tokens, c.head_dim}, 2)),
        v(random_tensor<4>({c.batch, c.heads, c.tokens, c.head_dim}, 3)),
        dout(random_tensor<4>({c.batch, c.heads, c.tokens, c.head_dim}, 4)) {}
};

double forward_flops(const Case& c) {
  return double(causal_attention_flops(c.batch, c.heads, c.tokens, c.tokens, c.head_dim));
}

/// Flash and the materialised path must agree before either is timed (a wrong kernel must not
/// produce a number): o and dq within a loose float bound, checked once per case.
void verify(const Case& c, const Inputs& in) {
  if (c.tokens > 2048) return;  // the materialised reference would take seconds and gigabytes
  FlashAttentionCache<float> flash_cache;
  const auto o = flash_attention(in.q, in.k, in.v, flash_cache);
  const auto grads = flash_attention_backward(in.q, in.k, in.v, o, flash_cache, in.dout);
  AttentionCache<float> cache;
  const auto o_ref = causal_attention(in.q, in.k, in.v, cache);
  const auto ref = causal_attention_backward(in.q, in.k, in.v, cache, in.dout);
  double worst = 0;
  for (index_t i = 0; i < o.size(); ++i) {
    worst = std::max(worst, double(std::abs(o.data()[i] - o_ref.data()[i])));
    worst = std::max(worst, double(std::abs(grads.q.data()[i] - ref.q.data()[i])));
  }
  if (!(worst < 1e-3)) {
    std::fprintf(stderr, "flash and materialised attention differ by %g at T=%td\n", worst,
                 c.tokens);
    std::exit(1);
  }
}

void flash_fwd(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const Inputs in(c);
  verify(c, in);
  FlashAttentionCache<float> cache;
  for (auto _ : state) benchmark::DoNotOptimize(flash_attention(in.q, in.k, in.v, cache).data());
  set_flops(state, forward_flops(c));
  state.SetLabel(context_label(c.threads));
}

void flash_bwd(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const Inputs in(c);
  FlashAttentionCache<float> cache;
  const auto o = flash_attention(in.q, in.k, in.v, cache);
  for (auto _ : state) {
    benchmark::DoNotOptimize(
        flash_attention_backward(in.q, in.k, in.v, o, cache, in.dout).q.data());
  }
  set_flops(state, 2.5 * forward_flops(c));
  state.SetLabel(context_label(c.threads));
}

void online_fwd(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const Inputs in(c);
  Tensor<float, 4> o(in.q.shape());
  for (auto _ : state) {
    causal_attention_into(in.q, in.k, in.v, o);
    benchmark::DoNotOptimize(o.data());
  }
  set_flops(state, forward_flops(c));
  state.SetLabel(context_label(c.threads));
}

void materialised_fwd(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const Inputs in(c);
  AttentionCache<float> cache;
  for (auto _ : state) benchmark::DoNotOptimize(causal_attention(in.q, in.k, in.v, cache).data());
  set_flops(state, forward_flops(c));
  state.SetLabel(context_label(c.threads));
}

void materialised_bwd(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const Inputs in(c);
  AttentionCache<float> cache;
  causal_attention(in.q, in.k, in.v, cache);
  for (auto _ : state) {
    benchmark::DoNotOptimize(causal_attention_backward(in.q, in.k, in.v, cache, in.dout).q.data());
  }
  set_flops(state, 2.5 * forward_flops(c));
  state.SetLabel(context_label(c.threads));
}

void train_flash(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const Inputs in(c);
  verify(c, in);
  FlashAttentionCache<float> cache;
  for (auto _ : state) {
    const auto o = flash_attention(in.q, in.k, in.v, cache);
    benchmark::DoNotOptimize(
        flash_attention_backward(in.q, in.k, in.v, o, cache, in.dout).q.data());
  }
  set_flops(state, 3.5 * forward_flops(c));
  state.SetLabel(context_label(c.threads));
}

void train_materialised(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const Inputs in(c);
  AttentionCache<float> cache;
  for (auto _ : state) {
    causal_attention(in.q, in.k, in.v, cache);
    benchmark::DoNotOptimize(causal_attention_backward(in.q, in.k, in.v, cache, in.dout).q.data());
  }
  set_flops(state, 3.5 * forward_flops(c));
  state.SetLabel(context_label(c.threads));
}

void register_all() {
  std::vector<int> thread_counts = {1};
#ifdef _OPENMP
  if (omp_get_max_threads() > 1) thread_counts.push_back(omp_get_max_threads());
#endif
  const auto add = [](const std::string& name, auto function, const Case& c) {
    benchmark::RegisterBenchmark(name.c_str(), function, c)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  for (const index_t tokens : {512, 1024, 2048, 4096, 8192}) {
    for (const int threads : thread_counts) {
      const Case c{1, 8, tokens, 64, threads};
      const std::string s = "/T=" + std::to_string(tokens) + "/threads=" + std::to_string(threads);
      add("attention/flash_fwd" + s, flash_fwd, c);
      add("attention/flash_bwd" + s, flash_bwd, c);
      add("attention/online_fwd" + s, online_fwd, c);
      if (tokens <= 4096) {
        add("attention/materialised_fwd" + s, materialised_fwd, c);
        add("attention/materialised_bwd" + s, materialised_bwd, c);
      }
    }
  }
  struct TrainShape {
    const char* name;
    index_t batch, heads, head_dim;
  };
  for (const TrainShape& shape :
       {TrainShape{"b8h4d32", 8, 4, 32}, TrainShape{"b4h4d64", 4, 4, 64}}) {
    for (const index_t tokens : {32, 64, 128, 256, 512, 1024}) {
      for (const int threads : thread_counts) {
        const Case c{shape.batch, shape.heads, tokens, shape.head_dim, threads};
        const std::string s = std::string("/") + shape.name + "/T=" + std::to_string(tokens) +
                              "/threads=" + std::to_string(threads);
        add("train/flash" + s, train_flash, c);
        add("train/materialised" + s, train_materialised, c);
      }
    }
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  return dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
}
