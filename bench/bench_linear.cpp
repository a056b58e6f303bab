// bench_linear — Linear forward and backward at GPT-2 and 7B shapes, against baselines doing
// the same arithmetic in the same binary: the bare Eigen expression, a naive loop (small
// shapes only) and, when a BLAS is linked, cblas_sgemm / cblas_sgemv called directly.
//
//   bench_linear --benchmark_filter='forward/.*/4096x11008' --benchmark_repetitions=5
#include <cstring>

#include "bench_support.hpp"

namespace dissect::bench {
namespace {

struct Case {
  LinearShape shape;
  index_t tokens;
  int threads;
  std::string suffix() const {
    return std::to_string(shape.in) + "x" + std::to_string(shape.out) +
           "/M=" + std::to_string(tokens) + "/threads=" + std::to_string(threads);
  }
  double forward_flops() const {
    return 2.0 * double(tokens) * double(shape.in) * double(shape.out);
  }
};

/// Inputs and parameters of one case; the layer owns its copy of W and b.
struct Problem {
  explicit Problem(const Case& c)
      : layer(c.shape.in, c.shape.out, {.seed = 1}),
        x(random_tensor<2>({c.tokens, c.shape.in}, 2)),
        dy(random_tensor<2>({c.tokens, c.shape.out}, 3)),
        y({c.tokens, c.shape.out}),
        dx({c.tokens, c.shape.in}) {}
  Linear<float> layer;
  Tensor<float, 2> x, dy, y, dx;
};

void report(benchmark::State& state, const Case& c, double flops) {
  set_flops(state, flops);
  if (c.tokens <= 8)
    set_weight_bytes(state, double(c.shape.in) * double(c.shape.out) * sizeof(float));
  state.SetLabel(context_label(c.threads));
}

// ---- forward --------------------------------------------------------------------------------

void forward_dissect(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Problem p(c);
  p.layer.forward_into(p.x, p.y);
  verify_rows("forward/dissect", p.x, p.layer.weight(), p.layer.bias(), p.y);
  for (auto _ : state) {
    p.layer.forward_into(p.x, p.y);
    benchmark::DoNotOptimize(p.y.data());
    benchmark::ClobberMemory();
  }
  report(state, c, c.forward_flops());
}

void forward_eigen_expr(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Problem p(c);
  const auto x = std::as_const(p.x).matrix();
  const auto w = std::as_const(p.layer).weight().matrix();
  const auto b = std::as_const(p.layer).bias().vector();
  auto y = p.y.matrix();
  auto run = [&] {
    y.noalias() = x * w.transpose();
    y.rowwise() += b.transpose();
  };
  run();
  verify_rows("forward/baseline_eigen_expr", p.x, p.layer.weight(), p.layer.bias(), p.y);
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(p.y.data());
    benchmark::ClobberMemory();
  }
  report(state, c, c.forward_flops());
}

void forward_naive(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Problem p(c);
  std::optional<ConstVectorMap<float>> bias(std::in_place, p.layer.bias().data(), c.shape.out);
  for (auto _ : state) {
    linear_forward_naive<float>(p.x.matrix(), std::as_const(p.layer).weight().matrix(), bias,
                                p.y.matrix());
    benchmark::DoNotOptimize(p.y.data());
  }
  report(state, c, c.forward_flops());
}

#if DISSECT_BENCH_CBLAS
void forward_cblas(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Problem p(c);
  const int m = int(c.tokens), n = int(c.shape.out), k = int(c.shape.in);
  const float* w = p.layer.weight().data();
  const float* b = p.layer.bias().data();
  auto run = [&] {
    for (int row = 0; row < m; ++row)
      std::memcpy(p.y.data() + std::size_t(row) * n, b, n * sizeof(float));
    if (m == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, w, k, p.x.data(), 1, 1.0f, p.y.data(),
                  1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, p.x.data(), k, w, k, 1.0f,
                  p.y.data(), n);
    }
  };
  run();
  verify_rows("forward/baseline_cblas", p.x, p.layer.weight(), p.layer.bias(), p.y);
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(p.y.data());
    benchmark::ClobberMemory();
  }
  report(state, c, c.forward_flops());
}
#endif

// ---- backward -------------------------------------------------------------------------------

/// dx against the naive sum for a few rows, and a corner of dW; aborts on a mismatch.
void verify_backward(const char* what, const Problem& p, ConstTensorView<float, 2> dw) {
  const index_t rows = p.x.dim(0), in = p.x.dim(1), out = p.dy.dim(1);
  auto check = [&](double got, double exact, double scale, index_t length) {
    if (!(std::abs(got - exact) <= 2.0 * double(length + 1) * 0x1.0p-24 * scale + 1e-30)) {
      std::fprintf(stderr, "%s: wrong gradient %g vs %g\n", what, got, exact);
      std::exit(1);
    }
  };
  for (index_t row : {index_t{0}, rows - 1}) {
    for (index_t k = 0; k < in; k += 97) {
      double exact = 0, scale = 0;
      for (index_t n = 0; n < out; ++n) {
        exact += double(p.dy(row, n)) * p.layer.weight()(n, k);
        scale += std::abs(double(p.dy(row, n)) * p.layer.weight()(n, k));
      }
      check(p.dx(row, k), exact, scale, out);
    }
  }
  for (index_t n : {index_t{0}, out - 1}) {
    for (index_t k = 0; k < in; k += 101) {
      double exact = 0, scale = 0;
      for (index_t m = 0; m < rows; ++m) {
        exact += double(p.dy(m, n)) * p.x(m, k);
        scale += std::abs(double(p.dy(m, n)) * p.x(m, k));
      }
      check(dw(n, k), exact, scale, rows);
    }
  }
}

void backward_dissect(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Problem p(c);
  p.layer.backward_into(p.x, p.dy, p.dx);
  verify_backward("backward/dissect", p, p.layer.weight_grad());
  for (auto _ : state) {
    p.layer.backward_into(p.x, p.dy, p.dx);
    benchmark::DoNotOptimize(p.dx.data());
    benchmark::ClobberMemory();
  }
  report(state, c, 2 * c.forward_flops());
}

void backward_eigen_expr(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Problem p(c);
  Tensor<float, 2> dw_tensor({c.shape.out, c.shape.in});
  Tensor<float, 1> db_tensor({c.shape.out});
  const auto x = std::as_const(p.x).matrix();
  const auto dy = std::as_const(p.dy).matrix();
  const auto w = std::as_const(p.layer).weight().matrix();
  auto dx = p.dx.matrix();
  auto dw = dw_tensor.matrix();
  auto db = db_tensor.vector();
  auto run = [&] {
    dx.noalias() = dy * w;
    dw.noalias() += dy.transpose() * x;
    db += dy.colwise().sum().transpose();
  };
  run();
  verify_backward("backward/baseline_eigen_expr", p, dw_tensor);
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(p.dx.data());
    benchmark::ClobberMemory();
  }
  report(state, c, 2 * c.forward_flops());
}

#if DISSECT_BENCH_CBLAS
void backward_cblas(benchmark::State& state, Case c) {
  use_threads(c.threads);
  Problem p(c);
  Tensor<float, 2> dw({c.shape.out, c.shape.in});
  Tensor<float, 1> db({c.shape.out});
  const int m = int(c.tokens), n = int(c.shape.out), k = int(c.shape.in);
  const float* w = p.layer.weight().data();
  auto run = [&] {
    // dx[m,k] = dy[m,n]·W[n,k];  dW[n,k] += dyᵀ[n,m]·x[m,k];  db += Σ_m dy (as a GEMV with ones)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, k, n, 1.0f, p.dy.data(), n, w, k,
                0.0f, p.dx.data(), k);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, n, k, m, 1.0f, p.dy.data(), n, p.x.data(),
                k, 1.0f, dw.data(), k);
    for (int row = 0; row < m; ++row)
      cblas_saxpy(n, 1.0f, p.dy.data() + std::size_t(row) * n, 1, db.data(), 1);
  };
  run();
  verify_backward("backward/baseline_cblas", p, dw);
  for (auto _ : state) {
    run();
    benchmark::DoNotOptimize(p.dx.data());
    benchmark::ClobberMemory();
  }
  report(state, c, 2 * c.forward_flops());
}
#endif

void register_all() {
  std::vector<int> thread_counts = {1};
#ifdef _OPENMP
  if (omp_get_max_threads() > 1) thread_counts.push_back(omp_get_max_threads());
#endif
  std::vector<Case> cases;
  for (int threads : thread_counts) {
    for (const auto& shape : gpt2_shapes)
      for (index_t tokens : {1, 8, 128, 512}) cases.push_back({shape, tokens, threads});
    for (const auto& shape : llama7b_shapes)
      for (index_t tokens : {1, 8, 128}) cases.push_back({shape, tokens, threads});
  }
  for (const Case& c : cases) {
    const std::string s = c.suffix();
    auto add = [&](const std::string& name, auto function) {
      benchmark::RegisterBenchmark(name.c_str(), function, c)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
    };
    add("forward/dissect/" + s, forward_dissect);
    add("forward/baseline_eigen_expr/" + s, forward_eigen_expr);
#if DISSECT_BENCH_CBLAS
    add(std::string(c.tokens == 1 ? "forward/baseline_cblas_sgemv/"
                                  : "forward/baseline_cblas_sgemm/") +
            s,
        forward_cblas);
#endif
    // The naive loop runs at ~1 GFLOP/s: only where one call stays in the milliseconds.
    if (c.forward_flops() <= 2e7 && c.threads == 1)
      add("forward/baseline_naive/" + s, forward_naive);
    add("backward/dissect/" + s, backward_dissect);
    add("backward/baseline_eigen_expr/" + s, backward_eigen_expr);
#if DISSECT_BENCH_CBLAS
    add("backward/baseline_cblas_sgemm/" + s, backward_cblas);
#endif
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  return dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
}
