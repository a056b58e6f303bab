// bench_attention_kinds — linear attention (prefix sums, O(T·d²)) against causal softmax
// attention (O(T²·d)), one head of d_k = d_v = 64, forward + backward as training runs them, at
// T from 256 to 8192: where the two curves cross, and that linear attention's time per token
// stays flat. Cross-attention (a decoder's T = 128 queries over an encoder's S) rides along.
// Each kind's last output row is checked once against a naive evaluation in double before
// timing.
//
//   bench_attention_kinds --benchmark_filter='linear|softmax'
#include "bench_support.hpp"
#include "dissect/attention/attention.hpp"
#include "dissect/attention/cross_attention.hpp"
#include "dissect/attention/linear_attention.hpp"

namespace dissect::bench {
namespace {

constexpr index_t head_dim = 64;

/// Row T − 1 of causal linear attention in double: the quadratic form at one position.
void verify_linear(const Tensor<float, 4>& q, const Tensor<float, 4>& k, const Tensor<float, 4>& v,
                   const Tensor<float, 4>& o) {
  const auto phi = [](double x) { return x > 0 ? x + 1 : std::exp(x); };
  const index_t t = q.dim(2) - 1;
  double den = 0;
  std::vector<double> num(static_cast<std::size_t>(head_dim), 0.0);
  for (index_t j = 0; j <= t; ++j) {
    double a = 0;
    for (index_t i = 0; i < head_dim; ++i) a += phi(q(0, 0, t, i)) * phi(k(0, 0, j, i));
    den += a;
    for (index_t i = 0; i < head_dim; ++i) num[i] += a * v(0, 0, j, i);
  }
  for (index_t i = 0; i < head_dim; ++i) {
    if (!(std::abs(o(0, 0, t, i) - num[i] / den) <= 1e-3)) {
      std::fprintf(stderr, "linear_attention: wrong result at %td: %g vs %g\n", i,
                   double(o(0, 0, t, i)), num[i] / den);
      std::exit(1);
    }
  }
}

/// Row T − 1 of softmax attention over the first `visible` keys, in double.
void verify_softmax(const char* what, const Tensor<float, 4>& q, const Tensor<float, 4>& k,
                    const Tensor<float, 4>& v, const Tensor<float, 4>& o, index_t visible) {
  const index_t t = q.dim(2) - 1;
  std::vector<double> score(static_cast<std::size_t>(visible));
  double top = -INFINITY, sum = 0;
  for (index_t j = 0; j < visible; ++j) {
    double s = 0;
    for (index_t i = 0; i < head_dim; ++i) s += double(q(0, 0, t, i)) * k(0, 0, j, i);
    score[j] = s / std::sqrt(double(head_dim));
    top = std::max(top, score[j]);
  }
  for (double& s : score) sum += (s = std::exp(s - top));
  for (index_t i = 0; i < head_dim; ++i) {
    double exact = 0;
    for (index_t j = 0; j < visible; ++j) exact += score[j] / sum * v(0, 0, j, i);
    if (!(std::abs(o(0, 0, t, i) - exact) <= 1e-4)) {
      std::fprintf(stderr, "%s: wrong result at %td: %g vs %g\n", what, i, double(o(0, 0, t, i)),
                   exact);
      std::exit(1);
    }
  }
}

void linear_fwd_bwd(benchmark::State& state, index_t tokens) {
  use_threads(1);
  const auto q = random_tensor<4>({1, 1, tokens, head_dim}, 1);
  const auto k = random_tensor<4>({1, 1, tokens, head_dim}, 2);
  const auto v = random_tensor<4>({1, 1, tokens, head_dim}, 3);
  const auto dout = random_tensor<4>({1, 1, tokens, head_dim}, 4);
  verify_linear(q, k, v, linear_attention(q, k, v));
  for (auto _ : state) {
    const auto o = linear_attention(q, k, v);
    const auto grads = linear_attention_backward(q, k, v, dout);
    benchmark::DoNotOptimize(o.data());
    benchmark::DoNotOptimize(grads.k.data());
  }
  state.counters["s/token"] = benchmark::Counter(
      static_cast<double>(tokens),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(context_label(1));
}

void softmax_fwd_bwd(benchmark::State& state, index_t tokens) {
  use_threads(1);
  const auto q = random_tensor<4>({1, 1, tokens, head_dim}, 1);
  const auto k = random_tensor<4>({1, 1, tokens, head_dim}, 2);
  const auto v = random_tensor<4>({1, 1, tokens, head_dim}, 3);
  const auto dout = random_tensor<4>({1, 1, tokens, head_dim}, 4);
  AttentionCache<float> cache;
  verify_softmax("causal_attention", q, k, v, causal_attention(q, k, v, cache), tokens);
  for (auto _ : state) {
    const auto o = causal_attention(q, k, v, cache);
    const auto grads = causal_attention_backward(q, k, v, cache, dout);
    benchmark::DoNotOptimize(o.data());
    benchmark::DoNotOptimize(grads.k.data());
  }
  state.counters["s/token"] = benchmark::Counter(
      static_cast<double>(tokens),
      benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(context_label(1));
}

void cross_fwd_bwd(benchmark::State& state, index_t keys) {
  use_threads(1);
  constexpr index_t tokens = 128;
  const auto q = random_tensor<4>({1, 1, tokens, head_dim}, 1);
  const auto k = random_tensor<4>({1, 1, keys, head_dim}, 2);
  const auto v = random_tensor<4>({1, 1, keys, head_dim}, 3);
  const auto dout = random_tensor<4>({1, 1, tokens, head_dim}, 4);
  std::vector<index_t> lengths{keys - keys / 4};  // the last quarter padding
  const auto mask = KeyPaddingMask::from_lengths(lengths, keys);
  CrossAttentionCache<float> cache;
  verify_softmax("cross_attention", q, k, v, cross_attention(q, k, v, cache, mask), lengths[0]);
  for (auto _ : state) {
    const auto o = cross_attention(q, k, v, cache, mask);
    const auto grads = cross_attention_backward(q, k, v, cache, dout);
    benchmark::DoNotOptimize(o.data());
    benchmark::DoNotOptimize(grads.k.data());
  }
  set_flops(state, 8.0 * tokens * keys * head_dim);  // q·kᵀ, P·v; dv, dP, dq, dk: 2·T·S·d each
  state.SetLabel(context_label(1));
}

void register_all() {
  for (const index_t tokens : {256, 1024, 4096, 8192}) {
    const auto suffix = "/T=" + std::to_string(tokens);
    benchmark::RegisterBenchmark(("linear_fwd_bwd" + suffix).c_str(), linear_fwd_bwd, tokens)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    benchmark::RegisterBenchmark(("softmax_fwd_bwd" + suffix).c_str(), softmax_fwd_bwd, tokens)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (const index_t keys : {64, 1500}) {  // 1500: Whisper's encoder length
    benchmark::RegisterBenchmark(("cross_fwd_bwd/T=128/S=" + std::to_string(keys)).c_str(),
                                 cross_fwd_bwd, keys)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  return dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
}
