// bench_gemm — dissect's packed inference GEMM (kernels/gemm.hpp) against the strongest baselines
// measured in the same run: the bare Eigen expression, OpenBLAS's cblas_sgemm / sgemv and oneDNN's
// matmul primitive with its weights reordered once into oneDNN's own blocked layout (the
// "packed" oneDNN of shared/design/performance.md). Every GFLOP/s is also given as a share of the
// FMA peak of the same number of cores, measured at start-up.
//
//   gemm/<impl>/<in>x<out>/M=<m>/threads=<t>   y = x·Wᵀ + b; impl: dissect, eigen, openblas, onednn
//   ffn/<variant>/768x3072/M=<m>/threads=1     GPT-2's MLP plus the residual: fused epilogues
//                                              against separate passes and the library's block
//   swiglu/<variant>/768x2048/M=<m>/threads=1  SwiGLU (gate and up packed side by side) likewise
//   train/<quiet|churn>/<in>x<out>/M=128/...   Linear forward + backward, with and without other
//                                              large allocations between the calls
//
//   env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE OMP_NUM_THREADS=2 bench_gemm
//       --benchmark_filter='gemm/.*/M=128/' --benchmark_repetitions=5
#include <immintrin.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "bench_support.hpp"
#include "dissect/blocks.hpp"
#include "dissect/kernels/gemm.hpp"

#if DISSECT_BENCH_DNNL
#include <oneapi/dnnl/dnnl.hpp>
// Debian's oneDNN runs on OpenMP (libgomp, the same runtime as g++'s -fopenmp): its threads
// follow omp_set_num_threads. CMake links libgomp (DISSECT_BENCH_DNNL_OMP) so that even a build
// without DISSECT_USE_OPENMP can hold oneDNN to one thread.
#if DNNL_CPU_THREADING_RUNTIME == DNNL_RUNTIME_OMP && (defined(_OPENMP) || DISSECT_BENCH_DNNL_OMP)
#include <omp.h>
#define DISSECT_BENCH_DNNL_THREADS 1
#endif
#endif

namespace dissect::bench {
namespace {

// ---- the FMA peak
// ---------------------------------------------------------------------------------

/// One core's fp32 FMA throughput, and two cores' at once: the ceiling %peak is measured against.
struct FmaPeak {
  double flops[3] = {0, 0, 0};  ///< flop/s for 0 (unused), 1 and 2 threads; 0 when not measured
  const char* isa = "none";
  int chains = 0;
  double at(int threads) const { return threads >= 1 && threads <= 2 ? flops[threads] : 0.0; }
};
FmaPeak fma_peak;

#if defined(__x86_64__) || defined(__i386__)
// Independent FMA chains: enough to cover the FMA latency (4 cycles) times the FMA pipes (2), with
// margin. Each chain is c = c·a + b with a fixed point at 1, so no value ever becomes denormal.
#define DISSECT_CHAINS_12(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define DISSECT_CHAINS_16(X) DISSECT_CHAINS_12(X) X(12) X(13) X(14) X(15)

__attribute__((target("avx512f"))) float fma_rounds_avx512(long rounds) {
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
#define DISSECT_DECLARE(i) __m512 c##i = _mm512_set1_ps(1.0f + 0.01f * (i));
#define DISSECT_STEP(i) c##i = _mm512_fmadd_ps(c##i, a, b);
#define DISSECT_SUM(i) sum = _mm512_add_ps(sum, c##i);
  DISSECT_CHAINS_16(DISSECT_DECLARE)
  for (long r = 0; r < rounds; ++r) {
    DISSECT_CHAINS_16(DISSECT_STEP)
  }
  __m512 sum = _mm512_setzero_ps();
  DISSECT_CHAINS_16(DISSECT_SUM)
  alignas(64) float lanes[16];  // not _mm512_reduce_add_ps: GCC 12 warns inside it (PR 105593)
  _mm512_store_ps(lanes, sum);
  float total = 0;
  for (float lane : lanes) total += lane;
  return total;
#undef DISSECT_DECLARE
#undef DISSECT_STEP
#undef DISSECT_SUM
}

__attribute__((target("avx2,fma"))) float fma_rounds_avx2(long rounds) {
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
#define DISSECT_DECLARE(i) __m256 c##i = _mm256_set1_ps(1.0f + 0.01f * (i));
#define DISSECT_STEP(i) c##i = _mm256_fmadd_ps(c##i, a, b);
#define DISSECT_SUM(i) sum = _mm256_add_ps(sum, c##i);
  DISSECT_CHAINS_12(DISSECT_DECLARE)
  for (long r = 0; r < rounds; ++r) {
    DISSECT_CHAINS_12(DISSECT_STEP)
  }
  __m256 sum = _mm256_setzero_ps();
  DISSECT_CHAINS_12(DISSECT_SUM)
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0;
  for (float lane : lanes) total += lane;
  return total;
#undef DISSECT_DECLARE
#undef DISSECT_STEP
#undef DISSECT_SUM
}
#undef DISSECT_CHAINS_16
#undef DISSECT_CHAINS_12

/// Seconds for `threads` threads to run `rounds` rounds each, all at once.
double time_fma(float (*kernel)(long), long rounds, int threads) {
  std::vector<float> sinks(std::size_t(threads), 0.0f);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> others;
  for (int t = 1; t < threads; ++t) others.emplace_back([&, t] { sinks[t] = kernel(rounds); });
  sinks[0] = kernel(rounds);
  for (auto& thread : others) thread.join();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  benchmark::DoNotOptimize(sinks.data());
  return elapsed.count();
}

/// The best of 3 runs of ~0.1 s each (≈ 0.3 s per thread count).
void measure_fma_peak() {
  float (*kernel)(long) = nullptr;
  double flops_per_round = 0;
  if (__builtin_cpu_supports("avx512f")) {
    kernel = fma_rounds_avx512;
    fma_peak.isa = "AVX-512 (_mm512_fmadd_ps)";
    fma_peak.chains = 16;
    flops_per_round = 16 * 16 * 2;
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    kernel = fma_rounds_avx2;
    fma_peak.isa = "AVX2 (_mm256_fmadd_ps)";
    fma_peak.chains = 12;
    flops_per_round = 12 * 8 * 2;
  } else {
    return;
  }
  const long probe = 1L << 18;
  const double probe_seconds = std::max(time_fma(kernel, probe, 1), 1e-6);
  const long rounds = std::max(probe, long(double(probe) * 0.1 / probe_seconds));
  const int max_threads = std::thread::hardware_concurrency() >= 2 ? 2 : 1;
  for (int threads = 1; threads <= max_threads; ++threads) {
    double best = 1e300;
    for (int run = 0; run < 3; ++run) best = std::min(best, time_fma(kernel, rounds, threads));
    fma_peak.flops[threads] = double(threads) * double(rounds) * flops_per_round / best;
  }
}
#else
void measure_fma_peak() {}
#endif

// ---- shared helpers
// -------------------------------------------------------------------------------

constexpr double unit_roundoff = 0x1.0p-24;

/// Bytes of weight copies an M = 1 case cycles through, so that every weight comes from DRAM:
/// at least 512 MB and twice the L3 the OS reports (a VM may report a whole socket's L3), at most
/// 2 GB.
double streamed_bytes() {
  double l3 = 0;
#ifdef _SC_LEVEL3_CACHE_SIZE
  l3 = double(std::max(0L, sysconf(_SC_LEVEL3_CACHE_SIZE)));
#endif
  return std::min(2e9, std::max(512e6, 2 * l3));
}

/// The fixture of the case being timed, kept across Google Benchmark's calls of the same case
/// (it calls a case's function once per iteration-count estimate): a case is set up, packed and
/// checked once. Only one is alive at a time, so the copies of an M = 1 case are freed before the
/// next case allocates its own.
struct Fixture {
  virtual ~Fixture() = default;
  std::string error;  ///< non-empty: the one-time check failed (or setting up threw)
  std::string label;
};
std::unique_ptr<Fixture> current_fixture;
std::string current_key;

template <class F, class... Args>
F& fixture(const std::string& key, const Args&... args) {
  if (!current_fixture || current_key != key) {
    current_fixture.reset();  // first free the last case's memory
    current_key.clear();
    try {
      current_fixture = std::make_unique<F>(args...);
    } catch (const std::exception& e) {
      auto failed = std::make_unique<F>(typename F::Failed{});
      failed->error = key + ": " + e.what();
      current_fixture = std::move(failed);
    }
    current_key = key;
  }
  return static_cast<F&>(*current_fixture);
}

/// Returns false (after SkipWithError) when the fixture's check failed: the case must not time.
bool usable(benchmark::State& state, const Fixture& f) {
  if (f.error.empty()) return true;
  state.SkipWithError(f.error.c_str());
  return false;
}

/// GFLOP/s as a percentage of the FMA peak of `threads` cores. A rate counter, so the console
/// shows it as "%peak=87.1/s"; the number is the percentage.
void set_peak(benchmark::State& state, double flops_per_iteration, int threads) {
  const double peak = fma_peak.at(threads);
  if (peak > 0) {
    state.counters["%peak"] = benchmark::Counter(100.0 * flops_per_iteration / peak,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  }
}

void set_tokens(benchmark::State& state, index_t tokens) {
  state.counters["tokens/s"] =
      benchmark::Counter(double(tokens), benchmark::Counter::kIsIterationInvariantRate);
}

/// Σ a[k]·w[k] in double, and Σ |a[k]·w[k]|: the scale of the rounding error of the float sum.
std::pair<double, double> dot(const float* a, const float* w, index_t k) {
  double sum = 0, scale = 0;
  for (index_t i = 0; i < k; ++i) {
    const double term = double(a[i]) * double(w[i]);
    sum += term;
    scale += std::abs(term);
  }
  return {sum, scale};
}

/// The worst-case error of a float sum of n terms whose magnitudes add up to `scale`
/// (2·n·u·scale, twice Higham's γₙ), the bound bench_support's verify_rows uses.
double sum_bound(index_t n, double scale) {
  return 2.0 * double(n) * unit_roundoff * scale;
}

std::vector<index_t> rows_to_check(index_t m) {
  // Built without erase(): GCC 12 warns (-Warray-bounds, falsely) on erase of a 3-element vector.
  std::vector<index_t> rows;
  for (const index_t row : {index_t{0}, m / 2, m - 1})
    if (rows.empty() || rows.back() != row) rows.push_back(row);
  return rows;
}

std::string mismatch(const char* what, index_t row, index_t col, double got, double exact,
                     double bound) {
  return std::string(what) + ": wrong result at [" + std::to_string(row) + ", " +
         std::to_string(col) + "]: " + std::to_string(got) + " vs " + std::to_string(exact) +
         " (bound " + std::to_string(bound) + ")";
}

/// Rows {0, m/2, m − 1} of y [m, n] = x [m, k]·Wᵀ + b (W [n, k], b may be null) against a
/// double-precision sum: an empty string when they agree.
std::string check_linear(const char* what, const float* x, index_t m, index_t k, const float* w,
                         index_t n, const float* b, const float* y) {
  for (index_t row : rows_to_check(m)) {
    for (index_t col = 0; col < n; ++col) {
      auto [exact, scale] = dot(x + row * k, w + col * k, k);
      if (b) {
        exact += b[col];
        scale += std::abs(b[col]);
      }
      const double got = y[row * n + col], bound = sum_bound(k + 1, scale) + 1e-30;
      if (!(std::abs(got - exact) <= bound)) return mismatch(what, row, col, got, exact, bound);
    }
  }
  return {};
}

double sigmoid(double z) {
  return 1.0 / (1.0 + std::exp(-z));
}
double gelu_tanh(double a) {
  return a * sigmoid(2.0 * 0.79788456080286535588 * (a + 0.044715 * a * a * a));
}
double silu(double a) {
  return a * sigmoid(a);
}
/// Bounds |f'| for gelu_tanh (≤ 1.13) and silu (≤ 1.10): how an error in the input propagates.
constexpr double activation_slope = 1.2;
/// The error of a float activation beyond its input's: a vectorised exp may be off by a few ulps.
double activation_error(double input, double output) {
  return 16 * unit_roundoff * (std::abs(input) + std::abs(output));
}

/// The second layer of an FFN: rows of y = h·W_downᵀ + b + residual from the double hidden
/// values h (with per-value error bounds h_error), against the float y.
std::string check_down(const char* what, index_t row, const std::vector<double>& h,
                       const std::vector<double>& h_error, const float* w_down, index_t d,
                       const float* b, const float* residual, const float* y) {
  const index_t f = index_t(h.size());
  for (index_t i = 0; i < d; ++i) {
    const float* w = w_down + i * f;
    double exact = 0, scale = 0, propagated = 0;
    for (index_t j = 0; j < f; ++j) {
      exact += h[j] * w[j];
      scale += std::abs(h[j] * w[j]);
      propagated += std::abs(double(w[j])) * h_error[j];
    }
    if (b) {
      exact += b[i];
      scale += std::abs(b[i]);
    }
    if (residual) {
      exact += residual[i];
      scale += std::abs(residual[i]);
    }
    const double got = y[i], bound = 2 * (propagated + sum_bound(f + 2, scale)) + 1e-30;
    if (!(std::abs(got - exact) <= bound)) return mismatch(what, row, i, got, exact, bound);
  }
  return {};
}

/// Epilogue{.bias = bias, …} spelled out: Epilogue::activation has no default member
/// initializer, so a designated initializer that omits it warns under -Wextra
/// (-Wmissing-field-initializers).
Epilogue with_bias(const float* bias, const float* residual = nullptr, index_t stride = 0) {
  Epilogue epilogue;
  epilogue.bias = bias;
  epilogue.residual = residual;
  epilogue.residual_stride = stride;
  return epilogue;
}

std::string shape_name(index_t in, index_t out) {
  return std::to_string(in) + "x" + std::to_string(out);
}

// ---- GEMM: y = x·Wᵀ + b
// ---------------------------------------------------------------------------

struct GemmCase {
  LinearShape shape;
  index_t m;
  int threads;
  std::string name;
  index_t k() const { return shape.in; }
  index_t n() const { return shape.out; }
  double flops() const { return 2.0 * double(m) * double(n()) * double(k()); }
  double weight_bytes() const { return double(n()) * double(k()) * sizeof(float); }
  /// M = 1 is a GEMV bound by the weights' bandwidth from DRAM: it cycles through enough copies
  /// of W that none is still in a cache when its turn comes again (bench_decode's method; a real
  /// decoder streams every layer's weights once per token too, GPT-2's as much as 7B's). Larger M
  /// reuses one W: each weight is read once per M rows, and the product is compute-bound.
  std::size_t copies() const {
    if (m != 1) return 1;
    return std::size_t(std::max(2.0, std::ceil(streamed_bytes() / weight_bytes())));
  }
};

/// x [M, K], W [N, K], b [N] (uniform in [−1, 1]) and y [M, N].
struct GemmFixture : Fixture {
  struct Failed {};
  explicit GemmFixture(Failed) {}
  explicit GemmFixture(const GemmCase& c)
      : m(c.m),
        k(c.k()),
        n(c.n()),
        copies(c.copies()),
        x(random_tensor<2>({c.m, c.k()}, 2)),
        w(random_tensor<2>({c.n(), c.k()}, 1)),
        b(random_tensor<1>({c.n()}, 3)),
        y({c.m, c.n()}) {}
  /// Checks y (after one run on copy 0) against the double reference.
  void check(const char* what) {
    error = check_linear(what, x.data(), m, k, w.data(), n, b.data(), y.data());
    if (copies > 1) {
      label += ", " + std::to_string(copies) + " copies of W (" +
               std::to_string(int(double(copies) * double(n) * double(k) * 4 / 1e6)) + " MB)";
    }
  }
  /// `copies` plain copies of W (the first is W itself), for the baselines that read W as it is.
  void copy_weights() {
    for (std::size_t i = 1; i < copies; ++i) {
      plain.emplace_back(w.shape());
      std::memcpy(plain.back().data(), w.data(), std::size_t(w.size()) * sizeof(float));
    }
  }
  const float* weight(std::size_t i) const { return i == 0 ? w.data() : plain[i - 1].data(); }

  index_t m = 0, k = 0, n = 0;
  std::size_t copies = 1;
  Tensor<float, 2> x, w;
  Tensor<float, 1> b;
  Tensor<float, 2> y;
  std::vector<Tensor<float, 2>> plain;
};

struct DissectGemm : GemmFixture {
  using GemmFixture::GemmFixture;
  explicit DissectGemm(const GemmCase& c) : GemmFixture(c), threads(c.threads) {
    for (std::size_t i = 0; i < copies; ++i) packed.emplace_back(w.data(), n, k, k);
    run(0);
    label = "packed_matmul, " + std::string(kernel_path_name(gemm_kernel_path())) + " path";
    check("gemm/dissect");
  }
  void run(std::size_t i) {
    packed_matmul(x.data(), k, m, packed[i], y.data(), n, with_bias(b.data()), threads);
  }
  int threads = 1;
  std::vector<PackedWeight> packed;
};

struct EigenGemm : GemmFixture {
  using GemmFixture::GemmFixture;
  explicit EigenGemm(const GemmCase& c) : GemmFixture(c) {
    copy_weights();
    run(0);
    label = "y.noalias() = x * W.transpose(); y.rowwise() += b";
    check("gemm/eigen");
  }
  void run(std::size_t i) {
    auto out = y.matrix();
    out.noalias() = std::as_const(x).matrix() * ConstMatrixMap<float>(weight(i), n, k).transpose();
    out.rowwise() += std::as_const(b).vector().transpose();
  }
};

#if DISSECT_BENCH_CBLAS
struct OpenblasGemm : GemmFixture {
  using GemmFixture::GemmFixture;
  explicit OpenblasGemm(const GemmCase& c) : GemmFixture(c) {
    copy_weights();
    run(0);
    label = m == 1 ? "cblas_sgemv" : "cblas_sgemm(RowMajor, NoTrans, Trans)";
    check("gemm/openblas");
  }
  void run(std::size_t i) {
    // The bias is copied into y and the product added to it (beta = 1). At M = 1 sgemv is
    // OpenBLAS's faster entry (0.3.21's sgemm does not forward a one-row product to it).
    for (index_t row = 0; row < m; ++row)
      std::memcpy(y.data() + row * n, b.data(), std::size_t(n) * sizeof(float));
    if (m == 1) {
      cblas_sgemv(CblasRowMajor, CblasNoTrans, int(n), int(k), 1.0f, weight(i), int(k), x.data(), 1,
                  1.0f, y.data(), 1);
    } else {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, x.data(),
                  int(k), weight(i), int(k), 1.0f, y.data(), int(n));
    }
  }
};
#endif

#if DISSECT_BENCH_DNNL
/// Holds oneDNN to `threads` threads where its runtime allows; what the label should say.
std::string dnnl_threads(int threads) {
#if DISSECT_BENCH_DNNL_THREADS
  omp_set_num_threads(threads);
  return "";
#else
  (void)threads;
  return " (threads: oneDNN's default, not controlled)";
#endif
}

/// The matmul primitive with its weights in oneDNN's own layout: W [N, K] row-major is the
/// [K, N] matrix with tag ba (no copy), reordered once per copy into the layout the primitive
/// asked for with format_tag::any; the bias [1, N] is fused. The primitive is created once per
/// case, after the thread count is set (oneDNN partitions the work when it is created).
struct OnednnGemm : GemmFixture {
  using GemmFixture::GemmFixture;
  explicit OnednnGemm(const GemmCase& c)
      : GemmFixture(c), engine(dnnl::engine::kind::cpu, 0), stream(engine) {
    const std::string threads_note = dnnl_threads(c.threads);
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::dim dm = m, dk = k, dn = n;
    const dnnl::memory::desc src_md({dm, dk}, dt::f32, tag::ab),
        any_md({dk, dn}, dt::f32, tag::any), plain_md({dk, dn}, dt::f32, tag::ba),
        bias_md({1, dn}, dt::f32, tag::ab), dst_md({dm, dn}, dt::f32, tag::ab);
#if DNNL_VERSION_MAJOR >= 3
    const dnnl::matmul::primitive_desc pd(engine, src_md, any_md, bias_md, dst_md);
#else
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, any_md, bias_md, dst_md),
                                          engine);
#endif
    dnnl::memory src(src_md, engine, x.data()), bias(bias_md, engine, b.data()),
        dst(dst_md, engine, y.data()), plain_w(plain_md, engine, w.data());
    for (std::size_t i = 0; i < copies; ++i) {
      dnnl::memory packed(pd.weights_desc(), engine);
      dnnl::reorder(plain_w, packed).execute(stream, plain_w, packed);
      args.push_back({{DNNL_ARG_SRC, src},
                      {DNNL_ARG_WEIGHTS, packed},
                      {DNNL_ARG_BIAS, bias},
                      {DNNL_ARG_DST, dst}});
    }
    stream.wait();
    primitive = dnnl::matmul(pd);
    run(0);
    label = std::string("matmul ") + pd.impl_info_str() + ", weights reordered once" + threads_note;
    check("gemm/onednn");
  }
  void run(std::size_t i) {
    primitive.execute(stream, args[i]);
    stream.wait();
  }
  dnnl::engine engine;
  dnnl::stream stream;
  dnnl::matmul primitive;
  std::vector<std::unordered_map<int, dnnl::memory>> args;  // one set per copy of W
};
#endif

template <class Impl>
void bench_gemm(benchmark::State& state, GemmCase c) {
  use_threads(c.threads);
  Impl& f = fixture<Impl>(c.name, c);
  if (!usable(state, f)) return;
  std::size_t i = 0;
  for (auto _ : state) {
    f.run(i);
    if (++i == f.copies) i = 0;
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, c.flops());
  state.counters["GB/s"] = benchmark::Counter(
      c.weight_bytes(), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  set_peak(state, c.flops(), c.threads);
  state.SetLabel(context_label(c.threads) + ", " + f.label);
}

// ---- fused epilogues: GPT-2's MLP and SwiGLU
// ------------------------------------------------------

constexpr index_t gpt2_d = 768, gpt2_ff = 3072, swiglu_ff = 2048;

struct FusedCase {
  index_t m;
  std::string name;
};

/// GPT-2's MLP with the residual: y = down(gelu_tanh(up(x))) + x, D = 768, F = 3072, biases.
///   fused:        up with bias + gelu_tanh in its epilogue, down with bias + residual in its own;
///   unfused:      the same packed products with the bias only, then an activation pass over the
///                 hidden values (activate_into), then down, then the residual add;
///   block:        FeedForward<float>::forward(x) as the library runs it unpacked, + residual;
///   block_packed: the block after pack(), forward(x, residual): its own fused path.
struct FfnFixture : Fixture {
  struct Failed {};
  explicit FfnFixture(Failed) : block(gpt2_d, gpt2_ff) {}
  FfnFixture(const FusedCase& c, const std::string& variant)
      : variant(variant),
        m(c.m),
        block(gpt2_d, gpt2_ff, Activation::gelu_tanh, {.seed = 1}),
        x(random_tensor<3>({1, c.m, gpt2_d}, 4)),
        h({c.m, gpt2_ff}),
        y({1, c.m, gpt2_d}) {
    const Linear<float>& up_layer = std::as_const(block).up();
    const Linear<float>& down_layer = std::as_const(block).down();
    up = PackedWeight(up_layer.weight().data(), gpt2_ff, gpt2_d, gpt2_d);
    down = PackedWeight(down_layer.weight().data(), gpt2_d, gpt2_ff, gpt2_ff);
    if (variant == "block_packed") block.pack();
    run();
    label = variant == "fused"     ? "packed_matmul ×2, bias+gelu_tanh / bias+residual fused"
            : variant == "unfused" ? "packed_matmul ×2 (bias), activate_into, residual add"
            : variant == "block"   ? "FeedForward<float>::forward(x) + residual (unpacked)"
                                   : "FeedForward<float>::pack(); forward(x, residual)";
    check();
  }
  void run() {
    const Linear<float>& up_layer = std::as_const(block).up();
    const Linear<float>& down_layer = std::as_const(block).down();
    const float* bu = up_layer.bias().data();
    const float* bd = down_layer.bias().data();
    if (variant == "fused") {
      packed_matmul(x.data(), gpt2_d, m, up, h.data(), gpt2_ff,
                    Epilogue{.bias = bu, .activation = Activation::gelu_tanh}, 1);
      packed_matmul(h.data(), gpt2_ff, m, down, y.data(), gpt2_d, with_bias(bd, x.data(), gpt2_d),
                    1);
    } else if (variant == "unfused") {
      packed_matmul(x.data(), gpt2_d, m, up, h.data(), gpt2_ff, with_bias(bu), 1);
      activate_into(h, h, Activation::gelu_tanh);
      packed_matmul(h.data(), gpt2_ff, m, down, y.data(), gpt2_d, with_bias(bd), 1);
      MatrixMap<float>(y.data(), m, gpt2_d) += ConstMatrixMap<float>(x.data(), m, gpt2_d);
    } else if (variant == "block") {
      y = block.forward(x);
      MatrixMap<float>(y.data(), m, gpt2_d) += ConstMatrixMap<float>(x.data(), m, gpt2_d);
    } else {
      y = block.forward(x, x);
    }
  }
  void check() {
    const Linear<float>& up_layer = std::as_const(block).up();
    const Linear<float>& down_layer = std::as_const(block).down();
    const float* wu = up_layer.weight().data();
    const float* bu = up_layer.bias().data();
    std::vector<double> hidden(gpt2_ff), hidden_error(gpt2_ff);
    const std::string what = "ffn/" + variant;
    for (index_t row : rows_to_check(m)) {
      const float* xr = x.data() + row * gpt2_d;
      for (index_t j = 0; j < gpt2_ff; ++j) {
        auto [a, scale] = dot(xr, wu + j * gpt2_d, gpt2_d);
        a += bu[j];
        scale += std::abs(bu[j]);
        hidden[j] = gelu_tanh(a);
        hidden_error[j] =
            activation_slope * sum_bound(gpt2_d + 1, scale) + activation_error(a, hidden[j]);
      }
      error = check_down(what.c_str(), row, hidden, hidden_error, down_layer.weight().data(),
                         gpt2_d, down_layer.bias().data(), xr, y.data() + row * gpt2_d);
      if (!error.empty()) return;
    }
  }

  std::string variant;
  index_t m = 0;
  FeedForward<float> block;
  PackedWeight up, down;
  Tensor<float, 3> x;
  Tensor<float, 2> h;
  Tensor<float, 3> y;
};

/// LLaMA's SwiGLU, y = down(silu(gate(x))·up(x)), D = 768, F = 2048, no biases:
///   fused:        gate and up packed side by side (PackedWeight::gated), silu·up in the epilogue;
///   unfused:      gate and up as two packed products, then silu(gate)·up as passes, then down;
///   block:        GatedFeedForward<float>::forward(x) unpacked;
///   block_packed: the block after pack().
struct SwigluFixture : Fixture {
  struct Failed {};
  explicit SwigluFixture(Failed) : block(gpt2_d, swiglu_ff) {}
  SwigluFixture(const FusedCase& c, const std::string& variant)
      : variant(variant),
        m(c.m),
        block(gpt2_d, swiglu_ff, {.seed = 1}),
        x(random_tensor<3>({1, c.m, gpt2_d}, 5)),
        g({c.m, swiglu_ff}),
        u({c.m, swiglu_ff}),
        y({1, c.m, gpt2_d}) {
    const float* wg = std::as_const(block).gate().weight().data();
    const float* wu = std::as_const(block).up().weight().data();
    gated = PackedWeight::gated(wg, wu, swiglu_ff, gpt2_d, gpt2_d, gpt2_d);
    gate = PackedWeight(wg, swiglu_ff, gpt2_d, gpt2_d);
    up = PackedWeight(wu, swiglu_ff, gpt2_d, gpt2_d);
    down = PackedWeight(std::as_const(block).down().weight().data(), gpt2_d, swiglu_ff, swiglu_ff);
    if (variant == "block_packed") block.pack();
    run();
    label = variant == "fused"     ? "packed_matmul(gated, silu epilogue), packed_matmul(down)"
            : variant == "unfused" ? "packed_matmul ×3, activate_into(silu), ·up pass"
            : variant == "block"   ? "GatedFeedForward<float>::forward(x) (unpacked)"
                                   : "GatedFeedForward<float>::pack(); forward(x)";
    check();
  }
  void run() {
    if (variant == "fused") {
      packed_matmul(x.data(), gpt2_d, m, gated, g.data(), swiglu_ff,
                    Epilogue{.activation = Activation::silu}, 1);
      packed_matmul(g.data(), swiglu_ff, m, down, y.data(), gpt2_d, {}, 1);
    } else if (variant == "unfused") {
      packed_matmul(x.data(), gpt2_d, m, gate, g.data(), swiglu_ff, {}, 1);
      packed_matmul(x.data(), gpt2_d, m, up, u.data(), swiglu_ff, {}, 1);
      activate_into(g, g, Activation::silu);
      g.matrix().array() *= std::as_const(u).matrix().array();
      packed_matmul(g.data(), swiglu_ff, m, down, y.data(), gpt2_d, {}, 1);
    } else {
      y = block.forward(x);
    }
  }
  void check() {
    const float* wg = std::as_const(block).gate().weight().data();
    const float* wu = std::as_const(block).up().weight().data();
    std::vector<double> hidden(swiglu_ff), hidden_error(swiglu_ff);
    const std::string what = "swiglu/" + variant;
    for (index_t row : rows_to_check(m)) {
      const float* xr = x.data() + row * gpt2_d;
      for (index_t j = 0; j < swiglu_ff; ++j) {
        const auto [a, a_scale] = dot(xr, wg + j * gpt2_d, gpt2_d);
        const auto [v, v_scale] = dot(xr, wu + j * gpt2_d, gpt2_d);
        const double a_error = sum_bound(gpt2_d, a_scale), v_error = sum_bound(gpt2_d, v_scale);
        const double s = silu(a);
        hidden[j] = s * v;
        hidden_error[j] = activation_slope * a_error * std::abs(v) +
                          (std::abs(s) + activation_slope * a_error) * v_error +
                          activation_error(a * v, hidden[j]);
      }
      error = check_down(what.c_str(), row, hidden, hidden_error,
                         std::as_const(block).down().weight().data(), gpt2_d, nullptr, nullptr,
                         y.data() + row * gpt2_d);
      if (!error.empty()) return;
    }
  }

  std::string variant;
  index_t m = 0;
  GatedFeedForward<float> block;
  PackedWeight gated, gate, up, down;
  Tensor<float, 3> x;
  Tensor<float, 2> g, u;
  Tensor<float, 3> y;
};

template <class F>
void bench_fused(benchmark::State& state, FusedCase c, std::string variant, double flops) {
  use_threads(1);
  F& f = fixture<F>(c.name, c, variant);
  if (!usable(state, f)) return;
  for (auto _ : state) {
    f.run();
    benchmark::DoNotOptimize(f.y.data());
    benchmark::ClobberMemory();
  }
  set_flops(state, flops);
  set_tokens(state, c.m);
  set_peak(state, flops, 1);
  state.SetLabel(context_label(1) + ", " + f.label);
}

// ---- training products under allocator churn
// ------------------------------------------------------

/// Linear<float>::forward_into then backward_into (y = x·Wᵀ + b, dx = dy·W, dW += dyᵀ·x,
/// db += Σ dy): the training path, whose products must not allocate per call.
struct TrainFixture : Fixture {
  struct Failed {};
  explicit TrainFixture(Failed) : layer(1, 1) {}
  explicit TrainFixture(const GemmCase& c)
      : layer(c.k(), c.n(), {.seed = 1}),
        x(random_tensor<2>({c.m, c.k()}, 2)),
        dy(random_tensor<2>({c.m, c.n()}, 3)),
        y({c.m, c.n()}),
        dx({c.m, c.k()}) {
    run();  // dW = dyᵀ·x exactly once: the gradients start at zero
    label = "Linear<float>::forward_into + backward_into, " +
            std::string(kernel_path_name(gemm_kernel_path())) + " path";
    check(c);
  }
  void run() {
    layer.forward_into(x, y);
    layer.backward_into(x, dy, dx);
  }
  void check(const GemmCase& c) {
    const index_t m = c.m, k = c.k(), n = c.n();
    const float* w = std::as_const(layer).weight().data();
    error = check_linear("train/forward", x.data(), m, k, w, n, layer.bias().data(), y.data());
    if (!error.empty()) return;
    for (index_t row : rows_to_check(m)) {  // dx [m, k] = dy [m, n]·W [n, k]
      for (index_t col = 0; col < k; ++col) {
        double exact = 0, scale = 0;
        for (index_t j = 0; j < n; ++j) {
          const double term = double(dy(row, j)) * double(w[j * k + col]);
          exact += term;
          scale += std::abs(term);
        }
        const double bound = sum_bound(n, scale) + 1e-30;
        if (!(std::abs(dx(row, col) - exact) <= bound)) {
          error = mismatch("train/backward dx", row, col, dx(row, col), exact, bound);
          return;
        }
      }
    }
    const auto dw = std::as_const(layer).weight_grad();
    for (index_t j : rows_to_check(n)) {  // dW [n, k] = dyᵀ·x, every 97th column
      for (index_t col = 0; col < k; col += 97) {
        double exact = 0, scale = 0;
        for (index_t row = 0; row < m; ++row) {
          const double term = double(dy(row, j)) * double(x(row, col));
          exact += term;
          scale += std::abs(term);
        }
        const double bound = sum_bound(m, scale) + 1e-30;
        if (!(std::abs(dw(j, col) - exact) <= bound)) {
          error = mismatch("train/backward dW", j, col, dw(j, col), exact, bound);
          return;
        }
      }
    }
  }

  Linear<float> layer;
  Tensor<float, 2> x, dy, y, dx;
};

/// What "the rest of the process" does between two training steps in the churn variant: large
/// buffers allocated, written and freed. 40 and 70 MB are above glibc's largest mmap threshold
/// (32 MB), so each is a fresh mmap whose pages fault in and are unmapped again; 24 MB is below
/// it, and freeing it raises glibc's dynamic mmap threshold to 24 MB, so that every later
/// allocation up to that size (a GEMM's packing buffers) moves from mmap to the heap — the
/// allocator-state change that once cost the Eigen-based Linear half its speed (performance.md).
void churn() {
  for (std::size_t megabytes : {24, 40, 70}) {
    const std::size_t bytes = megabytes << 20;
    void* buffer = std::malloc(bytes);
    if (!buffer) continue;
    std::memset(buffer, int(megabytes), bytes);
    benchmark::DoNotOptimize(buffer);
    std::free(buffer);
  }
}

void bench_train(benchmark::State& state, GemmCase c, bool with_churn) {
  use_threads(c.threads);
  TrainFixture& f = fixture<TrainFixture>(c.name, c);
  if (!usable(state, f)) return;
  for (auto _ : state) {
    f.run();
    benchmark::DoNotOptimize(f.dx.data());
    benchmark::ClobberMemory();
    // The quiet variant pauses too, so the two differ by the churn alone.
    state.PauseTiming();
    if (with_churn) churn();
    state.ResumeTiming();
  }
  set_flops(state, 3 * c.flops());  // forward 2·M·N·K, backward 4·M·N·K
  set_peak(state, 3 * c.flops(), c.threads);
  state.SetLabel(context_label(c.threads) + ", " + f.label +
                 (with_churn ? ", 24+40+70 MB malloc/memset/free between steps" : ""));
}

// ---- registration
// ---------------------------------------------------------------------------------

void print_gemm_context() {
  std::printf("bench_gemm\n");
  std::printf("  dissect GEMM path  %s (gemm_kernel_path())\n",
              std::string(kernel_path_name(gemm_kernel_path())).c_str());
  if (fma_peak.at(1) > 0) {
    std::printf("  fp32 FMA peak      %.1f GFLOP/s on 1 thread", fma_peak.at(1) / 1e9);
    if (fma_peak.at(2) > 0) std::printf(", %.1f on 2", fma_peak.at(2) / 1e9);
    std::printf(" (%s, %d chains, best of 3 × 0.1 s; %%peak divides by these)\n", fma_peak.isa,
                fma_peak.chains);
  } else {
    std::printf("  fp32 FMA peak      not measured (no AVX2/AVX-512 FMA): no %%peak counters\n");
  }
#if DISSECT_BENCH_CBLAS
#if defined(OPENBLAS_VERSION)
  std::printf("  OpenBLAS           %s, %s\n", openblas_get_config(),
              "threads via openblas_set_num_threads");
#else
  std::printf("  CBLAS              linked (not OpenBLAS: no 2-thread openblas cases)\n");
#endif
  std::printf("  OPENBLAS_CORETYPE  must be unset for OpenBLAS to pick its own kernels (%s)\n",
              std::getenv("OPENBLAS_CORETYPE") ? "it is SET: openblas numbers are not its best"
                                               : "it is unset");
#else
  std::printf("  OpenBLAS           not linked: no openblas cases\n");
#endif
#if DISSECT_BENCH_DNNL
  const dnnl_version_t* version = dnnl_version();
  std::printf("  oneDNN             %d.%d.%d, CPU runtime %s%s\n", version->major, version->minor,
              version->patch,
              version->cpu_runtime == DNNL_RUNTIME_OMP   ? "OpenMP"
              : version->cpu_runtime == DNNL_RUNTIME_SEQ ? "sequential"
                                                         : "other",
#if DISSECT_BENCH_DNNL_THREADS
              " (threads via omp_set_num_threads)"
#else
              " (threads not controlled by this bench)"
#endif
  );
#else
  std::printf("  oneDNN             not found (apt-get install libdnnl-dev): no onednn cases\n");
#endif
  std::printf("  M = 1 weights      from DRAM: each case cycles through %.0f MB of copies of W\n\n",
              streamed_bytes() / 1e6);
  std::fflush(stdout);
}

void register_all() {
  measure_fma_peak();
  print_gemm_context();
  auto add = [](const std::string& name, auto function, auto... args) {
    benchmark::RegisterBenchmark(name.c_str(), function, args...)
        ->Unit(benchmark::kMicrosecond)
        ->UseRealTime();
  };
  bool two_threads = false;
#ifdef _OPENMP
  two_threads = std::thread::hardware_concurrency() >= 2;  // dissect and Eigen thread via OpenMP
#endif
  std::vector<LinearShape> shapes;
  for (const auto& shape : gpt2_shapes) {
    if (shape.in != shape.out) shapes.push_back(shape);  // 768→768 is bench_linear's
  }
  shapes.insert(shapes.end(), llama7b_shapes.begin(), llama7b_shapes.end());
  shapes.insert(shapes.end(), tinyllama_shapes.begin(), tinyllama_shapes.end());
  for (const auto& shape : shapes) {
    for (index_t m : {1, 8, 128}) {
      for (int threads : {1, 2}) {
        if (threads == 2 && (m != 128 || !two_threads)) continue;
        const std::string s = shape_name(shape.in, shape.out) + "/M=" + std::to_string(m) +
                              "/threads=" + std::to_string(threads);
        auto gemm = [&](const char* impl, auto function) {
          const std::string name = std::string("gemm/") + impl + "/" + s;
          add(name, function, GemmCase{shape, m, threads, name});
        };
        gemm("dissect", bench_gemm<DissectGemm>);
        gemm("eigen", bench_gemm<EigenGemm>);
#if DISSECT_BENCH_DNNL
        gemm("onednn", bench_gemm<OnednnGemm>);
#endif
        // OpenBLAS last: after a 2-thread call its worker spins for up to 2^28 cycles
        // (OPENBLAS_THREAD_TIMEOUT) before it sleeps, which would take a core from the next
        // 2-thread case; next comes a 1-thread case whose setup outlasts the spin.
#if DISSECT_BENCH_CBLAS
#if !defined(OPENBLAS_VERSION)
        if (threads == 1)  // only OpenBLAS's thread count can be set
#endif
          gemm("openblas", bench_gemm<OpenblasGemm>);
#endif
      }
    }
  }
  for (index_t m : {8, 128}) {
    const std::string s = "/M=" + std::to_string(m) + "/threads=1";
    const double ffn_flops = 2 * 2.0 * double(m) * gpt2_d * gpt2_ff;
    const double swiglu_flops = 3 * 2.0 * double(m) * gpt2_d * swiglu_ff;
    for (const char* variant : {"fused", "unfused", "block", "block_packed"}) {
      const std::string ffn = std::string("ffn/") + variant + "/" + shape_name(gpt2_d, gpt2_ff) + s;
      add(ffn, bench_fused<FfnFixture>, FusedCase{m, ffn}, std::string(variant), ffn_flops);
      const std::string swiglu =
          std::string("swiglu/") + variant + "/" + shape_name(gpt2_d, swiglu_ff) + s;
      add(swiglu, bench_fused<SwigluFixture>, FusedCase{m, swiglu}, std::string(variant),
          swiglu_flops);
    }
  }
  for (const auto& shape : llama7b_shapes) {
    if (shape.in == shape.out) continue;  // the FFN's two: 4096→11008 and 11008→4096
    const std::string s = shape_name(shape.in, shape.out) + "/M=128/threads=1";
    for (bool with_churn : {false, true}) {
      const std::string name = std::string("train/") + (with_churn ? "churn/" : "quiet/") + s;
      add(name, bench_train, GemmCase{shape, 128, 1, name}, with_churn);
    }
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  const int status = dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
  dissect::bench::current_fixture.reset();  // before the libraries' own statics go (oneDNN's)
  return status;
}
