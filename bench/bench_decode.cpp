// bench_decode — the memory-bound regime: M = 1 (one token decoded) and M = 8 (a small batch)
// at 7B shapes, with the weights streamed from DRAM: each iteration uses the next of several
// copies of the layer, together far larger than the caches, so no weight is ever reused from
// cache. Reports weight bytes read per second for 1 and 2 threads.
//
//   bench_decode --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <cstring>

#include "bench_support.hpp"

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

void register_all() {
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
