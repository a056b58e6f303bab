// bench_moe — the mixture-of-experts block's inference forward (MixtureOfExperts<float> with
// SwiGLU experts, packed, no cache) at Mixtral-like proportions, against two baselines in the
// same run, and the machine's DRAM read bandwidth to judge decode against:
//
//   moe/grouped/<shape>/M=<m>/threads=<t>            the block: one expert call per expert over
//                                                    all its gathered tokens, then the scatter
//   moe/loop_over_experts/<shape>/M=<m>/threads=<t>  the naive dispatch: the same block's router
//                                                    and packed experts, each token through its
//                                                    k experts one at a time
//   moe/dense_equal_active/<shape>/M=<m>/threads=<t> one packed GatedFeedForward D → k·F → D:
//                                                    the same active parameters per token
//                                                    (also at M = 32: see register_all)
//   moe/experts_only/<shape>/M=<m>/threads=<t>       grouped's expert calls alone, on rows
//                                                    gathered beforehand: the dispatch's cost
//                                                    is grouped minus this
//   membw/stream_sum/<MB>MB/threads=<t>              Σ of a float buffer 16× the L3: read GB/s
//
// Shapes: D = 2048, F = 5632, E = 8, k = 2 ("2048x5632_E8k2"; Mixtral's D = 4096, F = 14336
// would need 5.6 GB of experts, twice that once packed, on a 23 GB machine shared with others)
// and a tiny one (D = 128, F = 352) for the smoke run. Tokens/s is items_per_second (M per
// iteration); "weights B/s" at M = 1 counts the k experts' weights (dense: its k·F-wide FFN,
// the same bytes), which come from DRAM every token (one expert is 138 MB, the L3 32 MB).
//
//   bench_moe --benchmark_min_time=0.2 --benchmark_repetitions=3   (bench/README.md: the run)
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "bench_support.hpp"
#include "dissect/blocks.hpp"
#include "dissect/blocks/mixture_of_experts.hpp"

namespace dissect::bench {
namespace {

struct MoeShape {
  const char* name;
  index_t d_model, d_ff, n_experts, top_k;
};

const MoeShape mixtral_like{"2048x5632_E8k2", 2048, 5632, 8, 2};
const MoeShape tiny{"tiny", 128, 352, 8, 2};

struct Case {
  MoeShape shape;
  index_t tokens;
  int threads;
};

/// One expert's weights in bytes (gate, up, down; no biases).
double expert_bytes(const MoeShape& s) {
  return 3.0 * double(s.d_model) * double(s.d_ff) * sizeof(float);
}

/// The packed MoE block and the dense FFN of equal active width, built once per shape and kept
/// across cases (building and packing the 2048x5632 experts takes seconds); one shape is alive
/// at a time.
struct Models {
  explicit Models(const MoeShape& s)
      : moe(s.d_model, s.d_ff,
            {.n_experts = s.n_experts, .routing = {.top_k = s.top_k}, .seed = 11}),
        dense(s.d_model, s.top_k * s.d_ff, {.seed = 99}) {
    for (index_t e = 0; e < moe.n_experts(); ++e) moe.expert(e).pack();
    dense.pack();
  }
  MixtureOfExperts<float> moe;
  GatedFeedForward<float> dense;
};

Models& models_for(const MoeShape& s) {
  static std::unique_ptr<Models> models;
  static std::string name;
  if (!models || name != s.name) {
    models.reset();  // free the previous shape's weights before building the next
    models = std::make_unique<Models>(s);
    name = s.name;
  }
  return *models;
}

/// A wrong result must not produce a number: aborts unless |got − expected| ≤ 1e-4·scale + 1e-6,
/// scale the sum of the magnitudes of the terms (float rounding is far below it; a wrong expert,
/// gate or row is far above it).
void expect_close(const std::string& what, double got, double expected, double scale) {
  if (!(std::abs(got - expected) <= 1e-4 * scale + 1e-6)) {
    std::fprintf(stderr, "%s: %.9g vs naive %.9g (scale %g)\n", what.c_str(), got, expected, scale);
    std::exit(1);
  }
}

/// SwiGLU expert `ffn` on one row in double: hidden = silu(gate·x) ⊙ up·x, then features
/// n = 0, 97, … of down·hidden, each with its magnitude sum, added into out / scale (gate-scaled).
template <class Ffn>
void naive_swiglu_row(const Ffn& ffn, const float* x, double gate, std::vector<double>& out,
                      std::vector<double>& scale) {
  const index_t d = ffn.d_model(), f = ffn.d_ff();
  auto dot = [](const float* a, const Linear<float>& layer, index_t row) {
    double sum = 0;
    for (index_t k = 0; k < layer.in_features(); ++k) sum += double(a[k]) * layer.weight()(row, k);
    return sum;
  };
  std::vector<float> hidden(static_cast<std::size_t>(f));
  for (index_t j = 0; j < f; ++j) {
    const double g = dot(x, ffn.gate(), j), u = dot(x, ffn.up(), j);
    hidden[static_cast<std::size_t>(j)] = static_cast<float>(g / (1 + std::exp(-g)) * u);
  }
  for (index_t n = 0, i = 0; n < d; n += 97, ++i) {
    double sum = 0, magnitude = 0;
    for (index_t j = 0; j < f; ++j) {
      const double term = double(hidden[static_cast<std::size_t>(j)]) * ffn.down().weight()(n, j);
      sum += term;
      magnitude += std::abs(term);
    }
    out[static_cast<std::size_t>(i)] += gate * sum;
    scale[static_cast<std::size_t>(i)] += std::abs(gate) * magnitude;
  }
}

/// Rows 0 and M − 1 of the block's output against the routing and the experts in double.
void verify_moe(const std::string& what, const MixtureOfExperts<float>& moe,
                const Tensor<float, 3>& x, const Tensor<float, 3>& y) {
  const auto route = moe.route(x);
  const index_t d = moe.d_model(), m = x.dim(1), k = moe.top_k();
  for (index_t t : {index_t{0}, m - 1}) {
    const std::size_t features = static_cast<std::size_t>((d + 96) / 97);
    std::vector<double> expected(features, 0.0), scale(features, 0.0);
    for (index_t j = 0; j < k; ++j) {
      const index_t e = route.experts[static_cast<std::size_t>(t * k + j)];
      naive_swiglu_row(moe.expert(e), x.data() + t * d, route.gates(t, j), expected, scale);
    }
    for (index_t n = 0, i = 0; n < d; n += 97, ++i) {
      expect_close(what, y(0, t, n), expected[static_cast<std::size_t>(i)],
                   scale[static_cast<std::size_t>(i)]);
    }
  }
}

/// Row 0 of the dense FFN's output against the same evaluation in double.
void verify_dense(const std::string& what, const GatedFeedForward<float>& dense,
                  const Tensor<float, 3>& x, const Tensor<float, 3>& y) {
  const std::size_t features = static_cast<std::size_t>((dense.d_model() + 96) / 97);
  std::vector<double> expected(features, 0.0), scale(features, 0.0);
  naive_swiglu_row(dense, x.data(), 1.0, expected, scale);
  for (index_t n = 0, i = 0; n < dense.d_model(); n += 97, ++i) {
    expect_close(what, y(0, 0, n), expected[static_cast<std::size_t>(i)],
                 scale[static_cast<std::size_t>(i)]);
  }
}

/// Tokens/s, GFLOP/s of the active parameters (router included), the weight bytes of one token
/// at M = 1, and what ran.
void report(benchmark::State& state, const Case& c, const std::string& what) {
  const MoeShape& s = c.shape;
  state.SetItemsProcessed(state.iterations() * c.tokens);
  const double active = double(s.top_k) * 3.0 * double(s.d_model) * double(s.d_ff);
  set_flops(state, 2.0 * double(c.tokens) * (active + double(s.d_model) * double(s.n_experts)));
  if (c.tokens == 1) set_weight_bytes(state, double(s.top_k) * expert_bytes(s));
  state.SetLabel(context_label(c.threads) + ", " + what + ", packed_matmul " +
                 std::string(kernel_path_name(gemm_kernel_path())) + " path");
}

/// Expert rows of this input: how many experts ran and the largest group.
void report_groups(benchmark::State& state, const MixtureOfExperts<float>& moe,
                   const Tensor<float, 3>& x) {
  const auto route = moe.route(x);
  index_t active = 0, largest = 0;
  for (index_t e = 0; e < moe.n_experts(); ++e) {
    active += route.kept(e) > 0;
    largest = std::max(largest, route.kept(e));
  }
  state.counters["experts"] = double(active);
  state.counters["max rows"] = double(largest);
}

void moe_grouped(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const auto& models = models_for(c.shape);
  const auto x = random_tensor<3>({1, c.tokens, c.shape.d_model}, 7);
  verify_moe("moe/grouped", models.moe, x, models.moe.forward(x));
  for (auto _ : state) {
    auto y = models.moe.forward(x);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  report(state, c, "MixtureOfExperts::forward");
  report_groups(state, models.moe, x);
}

/// The grouped forward's expert calls alone, on rows gathered beforehand: grouped minus this is
/// what the dispatch costs (routing, gather, gate-weighted scatter, their allocations).
void moe_experts_only(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const auto& models = models_for(c.shape);
  const auto x = random_tensor<3>({1, c.tokens, c.shape.d_model}, 7);
  const auto route = models.moe.route(x);
  const index_t d = c.shape.d_model, k = c.shape.top_k;
  std::vector<Tensor<float, 3>> rows;
  for (index_t e = 0; e < c.shape.n_experts; ++e) {
    const auto first = static_cast<std::size_t>(route.group_offsets[static_cast<std::size_t>(e)]);
    Tensor<float, 3> gathered({1, route.kept(e), d});
    for (index_t row = 0; row < route.kept(e); ++row) {
      const index_t t = route.group[first + static_cast<std::size_t>(row)] / k;
      std::copy_n(x.data() + t * d, d, gathered.data() + row * d);
    }
    rows.push_back(std::move(gathered));
  }
  for (auto _ : state) {
    for (index_t e = 0; e < c.shape.n_experts; ++e) {
      if (route.kept(e) == 0) continue;
      auto y = models.moe.expert(e).forward(rows[static_cast<std::size_t>(e)]);
      benchmark::DoNotOptimize(y.data());
      benchmark::ClobberMemory();
    }
  }
  report(state, c, "the expert calls of MixtureOfExperts::forward alone");
}

/// What a naive implementation does: route, then each token through each of its k experts on
/// its own (a GEMV per expert per token), y_t += g·expert(x_t).
Tensor<float, 3> loop_over_experts(const MixtureOfExperts<float>& moe, const Tensor<float, 3>& x) {
  const auto route = moe.route(x);
  const index_t d = moe.d_model(), k = moe.top_k();
  Tensor<float, 3> y(x.shape());
  for (index_t t = 0; t < route.tokens; ++t) {
    const ConstTensorView<float, 3> x_t(x.data() + t * d, {1, 1, d});
    float* y_t = y.data() + t * d;
    for (index_t j = 0; j < k; ++j) {
      const index_t a = t * k + j;
      const auto out = moe.expert(route.experts[static_cast<std::size_t>(a)]).forward(x_t);
      const float gate = route.gates.data()[a];
      for (index_t i = 0; i < d; ++i) y_t[i] += gate * out.data()[i];
    }
  }
  return y;
}

void moe_loop_over_experts(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const auto& models = models_for(c.shape);
  const auto x = random_tensor<3>({1, c.tokens, c.shape.d_model}, 7);
  verify_moe("moe/loop_over_experts", models.moe, x, loop_over_experts(models.moe, x));
  for (auto _ : state) {
    auto y = loop_over_experts(models.moe, x);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  report(state, c, "each token through its k experts alone");
}

void moe_dense_equal_active(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const auto& models = models_for(c.shape);
  const auto x = random_tensor<3>({1, c.tokens, c.shape.d_model}, 7);
  verify_dense("moe/dense_equal_active", models.dense, x, models.dense.forward(x));
  for (auto _ : state) {
    auto y = models.dense.forward(x);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  report(state, c,
         "GatedFeedForward " + std::to_string(c.shape.d_model) + "x" +
             std::to_string(c.shape.top_k * c.shape.d_ff));
}

// ---- the machine's read bandwidth: a streaming sum over a buffer far larger than the L3 -------

constexpr std::size_t stream_bytes = std::size_t{512} << 20;  // 16× the 32 MiB L3

void stream_sum(benchmark::State& state, int threads) {
  use_threads(threads);
  const std::size_t n = stream_bytes / sizeof(float);
  std::vector<float> buffer(n, 1.0f);
  const index_t chunks = 64;  // each thread sums whole chunks, with Eigen's vectorised redux
  const index_t chunk = index_t(n) / chunks;
  for (auto _ : state) {
    float sum = 0;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) reduction(+ : sum)
#endif
    for (index_t i = 0; i < chunks; ++i) {
      sum += Eigen::Map<const Eigen::ArrayXf>(buffer.data() + i * chunk, chunk).sum();
    }
    benchmark::DoNotOptimize(sum);
  }
  state.counters["read B/s"] = benchmark::Counter(double(chunks * chunk) * sizeof(float),
                                                  benchmark::Counter::kIsIterationInvariantRate,
                                                  benchmark::Counter::kIs1000);
  state.SetLabel(context_label(threads));
}

void register_all() {
  std::vector<int> thread_counts = {1};
#ifdef _OPENMP
  if (omp_get_max_threads() > 1) thread_counts.push_back(omp_get_max_threads());
#endif
  for (int threads : thread_counts) {
    benchmark::RegisterBenchmark(("membw/stream_sum/" + std::to_string(stream_bytes >> 20) +
                                  "MB/threads=" + std::to_string(threads))
                                     .c_str(),
                                 stream_sum, threads)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
  for (const MoeShape& shape : {mixtral_like, tiny}) {
    // M = 32, dense only: 4 × its time is the FLOPs and weight bytes of grouped at M = 128 (each
    // of the 8 experts on ~32 rows) in one product per projection, the cost of the smaller GEMMs.
    for (index_t tokens : {1, 8, 32, 128}) {
      for (int threads : thread_counts) {
        const Case c{shape, tokens, threads};
        const std::string s = std::string(shape.name) + "/M=" + std::to_string(tokens) +
                              "/threads=" + std::to_string(threads);
        auto add = [&](const std::string& name, auto function) {
          benchmark::RegisterBenchmark((name + s).c_str(), function, c)
              ->Unit(benchmark::kMillisecond)
              ->UseRealTime();
        };
        if (tokens != 32) {
          add("moe/grouped/", moe_grouped);
          add("moe/experts_only/", moe_experts_only);
          add("moe/loop_over_experts/", moe_loop_over_experts);
        }
        add("moe/dense_equal_active/", moe_dense_equal_active);
      }
    }
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  return dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
}
