// bench_blocks — the transformer's linear blocks, forward + backward, at GPT-2 small and 7B
// sizes: QKVProjection (fused c_attn plus the head split), FeedForward (GELU-tanh MLP) and
// GatedFeedForward (SwiGLU). Each is set against a baseline doing only its GEMMs as bare Eigen
// expressions in the same run, so the difference is what the block adds: head split/merge
// copies, activations, shape checks.
//
//   bench_blocks --benchmark_filter='ffn' --benchmark_repetitions=5
#include "bench_support.hpp"
#include "dissect/blocks.hpp"

namespace dissect::bench {
namespace {

struct Model {
  const char* name;
  index_t d_model, n_heads, n_kv_heads, d_ff;
};

// GPT-2 small (D = 768, H = 12, F = 4D) and LLaMA-7B (D = 4096, H = 32, F = 11008).
const Model gpt2{"gpt2", 768, 12, 12, 3072};
const Model llama7b{"7b", 4096, 32, 32, 11008};

struct Case {
  Model model;
  index_t tokens;
  int threads;
  std::string suffix() const {
    return std::string(model.name) + "/M=" + std::to_string(tokens) +
           "/threads=" + std::to_string(threads);
  }
};

/// Σ_k row[k]·W[n, k] + b[n] in double: the naive reference for one output feature.
double naive_dot(const float* row, const Linear<float>& layer, index_t n) {
  double sum = layer.has_bias() ? layer.bias()(n) : 0.0;
  for (index_t k = 0; k < layer.in_features(); ++k) sum += double(row[k]) * layer.weight()(n, k);
  return sum;
}

/// A wrong kernel must not produce a number: aborts unless |got − expected| is within a loose
/// float bound (the tests hold the blocks to tight ones).
void expect_close(const char* what, double got, double expected, double scale) {
  if (!(std::abs(got - expected) <= 1e-3 * scale + 1e-5)) {
    std::fprintf(stderr, "%s: %g vs naive %g\n", what, got, expected);
    std::exit(1);
  }
}

/// Row 0 of an FFN block's output against a naive evaluation in double.
template <class Block>
void verify_ffn_row(const char* what, const Block& block, const Tensor<float, 3>& x) {
  const auto y = block.forward(x);
  const index_t f = block.d_ff();
  std::vector<float> hidden(static_cast<std::size_t>(f));
  for (index_t j = 0; j < f; ++j) {
    const double up = naive_dot(x.data(), block.up(), j);
    double a = 0;
    if constexpr (requires { block.gate(); }) {
      const double g = naive_dot(x.data(), block.gate(), j);
      a = g / (1 + std::exp(-g)) * up;  // silu(gate·x) ⊙ up·x
    } else {
      const double u = std::sqrt(2 / 3.14159265358979323846) * (up + 0.044715 * up * up * up);
      a = 0.5 * up * (1 + std::tanh(u));  // GELU, tanh form
    }
    hidden[static_cast<std::size_t>(j)] = static_cast<float>(a);
  }
  for (index_t n = 0; n < block.d_model(); n += 97) {
    expect_close(what, y(0, 0, n), naive_dot(hidden.data(), block.down(), n), 1.0);
  }
}

void finish(benchmark::State& state, const Case& c, double flops) {
  set_flops(state, flops);
  state.SetLabel(context_label(c.threads));
}

// ---- QKV projection: y = x·W_attnᵀ + b, then q/k/v split into heads --------------------------

double qkv_flops(const Case& c) {
  const double fused =
      double(c.model.n_heads + 2 * c.model.n_kv_heads) * double(c.model.d_model / c.model.n_heads);
  return 3 * 2.0 * double(c.tokens) * double(c.model.d_model) *
         fused;  // forward 2·M·N·K, backward twice that
}

void qkv_dissect(benchmark::State& state, Case c) {
  use_threads(c.threads);
  QKVProjection<float> block(c.model.d_model, c.model.n_heads,
                             {.n_kv_heads = c.model.n_kv_heads, .seed = 1});
  const auto x = random_tensor<3>({1, c.tokens, c.model.d_model}, 2);
  const QKV<float> grads =
      block.forward(x);  // same shapes as q, k, v: reused as upstream gradients
  const index_t d_k = block.head_dim();
  for (index_t h :
       {index_t{0}, c.model.n_heads - 1}) {  // q of token 0 against the naive dot product
    for (index_t d = 0; d < d_k; d += 7) {
      expect_close("qkv/dissect", grads.q(0, h, 0, d),
                   naive_dot(x.data(), block.qkv(), h * d_k + d), 1.0);
    }
  }
  for (auto _ : state) {
    QKV<float> qkv = block.forward(x);
    benchmark::DoNotOptimize(qkv.q.data());
    auto dx = block.backward(x, grads);
    benchmark::DoNotOptimize(dx.data());
  }
  finish(state, c, qkv_flops(c));
}

void qkv_gemms_only(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const index_t fused =
      (c.model.n_heads + 2 * c.model.n_kv_heads) * (c.model.d_model / c.model.n_heads);
  const auto x = random_tensor<2>({c.tokens, c.model.d_model}, 2);
  const auto w = random_tensor<2>({fused, c.model.d_model}, 3);
  const auto dy = random_tensor<2>({c.tokens, fused}, 4);
  Tensor<float, 2> y({c.tokens, fused}), dx({c.tokens, c.model.d_model}),
      dw({fused, c.model.d_model});
  for (auto _ : state) {
    y.matrix().noalias() = x.matrix() * w.matrix().transpose();
    dx.matrix().noalias() = dy.matrix() * w.matrix();
    dw.matrix().noalias() += dy.matrix().transpose() * x.matrix();
    benchmark::DoNotOptimize(dx.data());
  }
  finish(state, c, qkv_flops(c));
}

// ---- FFN: down(f(up(x))) and SwiGLU: down(silu(gate·x) ⊙ up·x) ----------------------------------

double ffn_flops(const Case& c, int matrices) {  // forward 2·M·D·F per matrix, backward twice that
  return 3 * 2.0 * double(c.tokens) * double(c.model.d_model) * double(c.model.d_ff) * matrices;
}

template <class Block>
void ffn_dissect(benchmark::State& state, Case c, Block block, int matrices) {
  const auto x = random_tensor<3>({1, c.tokens, c.model.d_model}, 2);
  const auto dy = random_tensor<3>({1, c.tokens, c.model.d_model}, 3);
  typename Block::Cache cache;
  verify_ffn_row("ffn/dissect", block, x);
  for (auto _ : state) {
    auto y = block.forward(x, cache);
    benchmark::DoNotOptimize(y.data());
    auto dx = block.backward(x, cache, dy);
    benchmark::DoNotOptimize(dx.data());
  }
  finish(state, c, ffn_flops(c, matrices));
}

void mlp_dissect(benchmark::State& state, Case c) {
  use_threads(c.threads);
  ffn_dissect(state, c,
              FeedForward<float>(c.model.d_model, c.model.d_ff, Activation::gelu_tanh, {.seed = 1}),
              2);
}

void swiglu_dissect(benchmark::State& state, Case c) {
  use_threads(c.threads);
  ffn_dissect(state, c, GatedFeedForward<float>(c.model.d_model, c.model.d_ff, {.seed = 1}), 2 + 1);
}

/// The GEMMs of `matrices` D×F layers, forward and backward, with nothing in between.
void ffn_gemms_only(benchmark::State& state, Case c, int matrices) {
  use_threads(c.threads);
  const index_t m = c.tokens, d = c.model.d_model, f = c.model.d_ff;
  const auto x = random_tensor<2>({m, d}, 2);
  const auto h = random_tensor<2>({m, f}, 3);
  const auto w_in = random_tensor<2>({f, d}, 4);
  const auto w_out = random_tensor<2>({d, f}, 5);
  Tensor<float, 2> hidden({m, f}), y({m, d}), dh({m, f}), dx({m, d});
  Tensor<float, 2> dw_in({f, d}), dw_out({d, f});
  for (auto _ : state) {
    for (int i = 0; i + 1 < matrices; ++i)
      hidden.matrix().noalias() = x.matrix() * w_in.matrix().transpose();
    y.matrix().noalias() = h.matrix() * w_out.matrix().transpose();
    dh.matrix().noalias() =
        y.matrix() * w_out.matrix();  // dy = y stands in for the upstream gradient
    dw_out.matrix().noalias() += y.matrix().transpose() * h.matrix();
    for (int i = 0; i + 1 < matrices; ++i) {
      dx.matrix().noalias() = dh.matrix() * w_in.matrix();
      dw_in.matrix().noalias() += dh.matrix().transpose() * x.matrix();
    }
    benchmark::DoNotOptimize(dx.data());
  }
  finish(state, c, ffn_flops(c, matrices));
}

void register_all() {
  std::vector<int> thread_counts = {1};
#ifdef _OPENMP
  if (omp_get_max_threads() > 1) thread_counts.push_back(omp_get_max_threads());
#endif
  for (int threads : thread_counts) {
    for (const Case& c :
         {Case{gpt2, 128, threads}, Case{gpt2, 512, threads}, Case{llama7b, 128, threads}}) {
      auto add = [&](const std::string& name, auto function) {
        benchmark::RegisterBenchmark((name + "/" + c.suffix()).c_str(), function, c)
            ->Unit(benchmark::kMillisecond)
            ->UseRealTime();
      };
      add("qkv_fwd_bwd/dissect", qkv_dissect);
      add("qkv_fwd_bwd/baseline_gemms_only", qkv_gemms_only);
      add("ffn_fwd_bwd/dissect", mlp_dissect);
      add("ffn_fwd_bwd/baseline_gemms_only",
          [](benchmark::State& s, Case k) { ffn_gemms_only(s, k, 2); });
      add("swiglu_fwd_bwd/dissect", swiglu_dissect);
      add("swiglu_fwd_bwd/baseline_gemms_only",
          [](benchmark::State& s, Case k) { ffn_gemms_only(s, k, 3); });
    }
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  return dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
}
