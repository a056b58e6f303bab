// bench_quant — the low-precision weight formats against fp32 in the decode regime: M = 1 (one
// token) and M = 8 (a small batch) at 7B shapes, weights streamed from DRAM (each iteration
// uses the next of enough copies of the layer that none is ever in cache), 1 and 2 threads.
// There bytes per weight are the speed: bf16 halves them, int8 quarters them, q4_0 reads 4.5
// bits, tq2_0 (BitNet b1.58's ternary blocks, llama.cpp's layout) 2.0625. Each format runs on its
// best path for this CPU and, where the choice is interesting, on the alternative too (avx512 for
// int8 / q4_0, avx2 for tq2_0; avx512_bf16 for bf16 at small M, avx512 at large).
// M = 128 (prefill) runs fp32 and bf16 only: compute-bound, the dot-product path's case.
// GGUF's q8_0, q4_K and q6_K run on their best path (avx512_vnni: the K-quants' GEMV rows at
// M = 1, the packed VNNI GEMM for the prefill cases) and on avx2, llama.cpp's own arithmetic
// (its register tiles from 2 rows, ggml_gemm_avx2.hpp). read/plain is the memory rate the M = 1
// rows are measured against.
//
//   bench_quant --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
#include <cstring>
#include <optional>

#include "bench_support.hpp"
#include "dissect/numeric/half.hpp"
#include "dissect/quant/detail/quant_kernels.hpp"
#include "dissect/quant/kernel_path.hpp"
#include "dissect/quant/weight_format.hpp"

namespace dissect::bench {
namespace {

namespace qd = quant::detail;
using quant::KernelPath;
using quant::WeightFormat;

// > 2× the 480 MiB of L3 this VM reports (the host's; bench_decode's 512 MB assumed 32 MiB).
constexpr double streamed_bytes = 1.1e9;

enum class Format { fp32, bf16, int8, q4_0, tq2_0, q8_0, q4_K, q6_K };

/// ggml's block formats of Format, and their weight formats.
bool is_ggml(Format format) {
  return format == Format::tq2_0 || format == Format::q8_0 || format == Format::q4_K ||
         format == Format::q6_K;
}
WeightFormat weight_format(Format format) {
  switch (format) {
    case Format::q8_0:
      return WeightFormat::q8_0;
    case Format::q4_K:
      return WeightFormat::q4_K;
    case Format::q6_K:
      return WeightFormat::q6_K;
    default:
      return WeightFormat::tq2_0;
  }
}

struct Case {
  LinearShape shape;
  index_t tokens;
  int threads;
  Format format;
  KernelPath path;       // unused for fp32
  bool prefill = false;  // weights from cache (2 copies): compute-bound, the GEMM's regime
  bool gemv = false;     // the GEMV tiles of avx512_vnni / avx512_bf16: before their GEMMs
};

int copies_for(double layer_bytes) {
  return std::max(2, int(std::ceil(streamed_bytes / layer_bytes)));
}

/// A cheap generator for a gigabyte of bytes (std::mt19937 would dominate set-up).
struct SplitMix {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform() { return float(next() >> 40) * 0x1.0p-24f * 2.0f - 1.0f; }  // [−1, 1)
};

/// `copies` copies of one random layer in each format's layout, laid end to end; copy c's view.
/// Copies of one layer, not distinct layers: what is timed is where the bytes come from.
struct QuantLayers {
  QuantLayers(Format format, index_t N, index_t K, int copies) : format(format), N(N), K(K) {
    SplitMix rng{42};
    const auto n = static_cast<std::size_t>(N), k = static_cast<std::size_t>(K);
    const auto c = static_cast<std::size_t>(copies);
    switch (format) {
      case Format::bf16:
        u16.resize(c * n * k);
        for (std::size_t i = 0; i < n * k; ++i) u16[i] = float_to_bf16(0.05f * rng.uniform());
        break;
      case Format::int8:
        i8.resize(c * n * k);
        f32.resize(c * n);
        i32.resize(c * n);
        for (std::size_t i = 0; i < n * k; ++i) {
          i8[i] = static_cast<std::int8_t>(int(rng.next() % 255) - 127);
          i32[i / k] += i8[i];
        }
        for (std::size_t i = 0; i < n; ++i) f32[i] = 1e-3f * (1.5f + rng.uniform());
        break;
      case Format::q4_0:
        u8.resize(c * n * k / 2);
        u16.resize(c * n * k / 32);
        for (std::size_t i = 0; i < n * k / 2; ++i) u8[i] = static_cast<std::uint8_t>(rng.next());
        for (std::size_t i = 0; i < n * k / 32; ++i) {
          u16[i] = float_to_fp16(5e-3f * (1.5f + rng.uniform()));
        }
        break;
      case Format::tq2_0: {
        // Codes 0, 1, 2 only (a byte's four codes each uniform: one of the 81 such bytes), and
        // BitNet-like block scales.
        std::vector<std::uint8_t> ternary;
        for (int v = 0; v < 256; ++v) {
          if ((v & (v >> 1) & 0x55) == 0) ternary.push_back(static_cast<std::uint8_t>(v));
        }
        const std::size_t blocks = n * k / 256;
        u8.resize(c * blocks * 66);
        for (std::size_t b = 0; b < blocks; ++b) {
          std::uint8_t* block = u8.data() + b * 66;
          for (int i = 0; i < 64; ++i) block[i] = ternary[rng.next() % ternary.size()];
          const std::uint16_t d = float_to_fp16(0.02f * (1.5f + rng.uniform()));
          block[64] = static_cast<std::uint8_t>(d);
          block[65] = static_cast<std::uint8_t>(d >> 8);
        }
        break;
      }
      case Format::q8_0:
      case Format::q4_K:
      case Format::q6_K: {
        // Random levels and scales, every block's fp16 scales in a sane range (d, and dmin for
        // q4_K, at the block's start; q6_K's d at its end).
        const GgmlTypeInfo info = ggml_type_info(ggml_type_of(weight_format(format)));
        const std::size_t blocks = n * k / std::size_t(info.block_elements);
        u8.resize(c * blocks * std::size_t(info.block_bytes));
        for (std::size_t i = 0; i < blocks * std::size_t(info.block_bytes); ++i) {
          u8[i] = static_cast<std::uint8_t>(rng.next());
        }
        for (std::size_t b = 0; b < blocks; ++b) {
          std::uint8_t* block = u8.data() + b * std::size_t(info.block_bytes);
          for (const int at : format == Format::q6_K   ? std::vector<int>{208}
                              : format == Format::q4_K ? std::vector<int>{0, 2}
                                                       : std::vector<int>{0}) {
            const std::uint16_t d = float_to_fp16(1e-3f * (1.5f + rng.uniform()));
            block[at] = static_cast<std::uint8_t>(d);
            block[at + 1] = static_cast<std::uint8_t>(d >> 8);
          }
        }
        break;
      }
      case Format::fp32:
        break;
    }
    for (std::size_t copy = 1; copy < c; ++copy) {
      replicate(u8, copy, c);
      replicate(u16, copy, c);
      replicate(i8, copy, c);
      replicate(f32, copy, c);
      replicate(i32, copy, c);
    }
  }
  template <class T>
  static void replicate(std::vector<T>& v, std::size_t copy, std::size_t copies) {
    const std::size_t one = v.size() / copies;
    if (one) std::memcpy(v.data() + copy * one, v.data(), one * sizeof(T));
  }

  qd::Bf16WeightsView bf16(std::size_t copy) const {
    return {u16.data() + copy * std::size_t(N * K), N, K};
  }
  qd::Int8WeightsView int8(std::size_t copy) const {
    return {i8.data() + copy * std::size_t(N * K), f32.data() + copy * std::size_t(N),
            i32.data() + copy * std::size_t(N), N, K};
  }
  qd::Q4WeightsView q4(std::size_t copy) const {
    return {u8.data() + copy * std::size_t(N * K / 2), u16.data() + copy * std::size_t(N * K / 32),
            N, K};
  }
  qd::GgmlWeightsView tq2(std::size_t copy) const {
    return {WeightFormat::tq2_0, u8.data() + copy * std::size_t(N * K / 256 * 66), N, K};
  }
  qd::GgmlWeightsView ggml(std::size_t copy) const {
    const std::size_t bytes =
        std::size_t(N * ggml_row_bytes(ggml_type_of(weight_format(format)), K));
    return {weight_format(format), u8.data() + copy * bytes, N, K};
  }

  /// y = x·Ŵᵀ with copy `copy`'s weights on `path` (with `gemv`, the avx512_vnni or avx512_bf16
  /// GEMV tiles at any m: no checks, the bench's own calls are valid).
  void run(KernelPath path, std::size_t copy, const float* x, index_t m, float* y, int threads,
           const float* bias, bool gemv = false) const {
    if (gemv && format == Format::int8)
      return qd::int8_vnni(int8(copy), x, K, m, {y, N, bias}, threads);
    if (gemv && format == Format::q4_0)
      return qd::q4_vnni(q4(copy), x, K, m, {y, N, bias}, threads);
    if (gemv && format == Format::bf16)
      return qd::bf16_dot(bf16(copy), x, K, m, {y, N, bias}, threads);
    switch (format) {
      case Format::bf16:
        qd::quantized_matmul(path, bf16(copy), x, K, m, y, N, bias, threads);
        break;
      case Format::int8:
        qd::quantized_matmul(path, int8(copy), x, K, m, y, N, bias, threads);
        break;
      case Format::q4_0:
        qd::quantized_matmul(path, q4(copy), x, K, m, y, N, bias, threads);
        break;
      case Format::tq2_0:
        qd::ggml_matmul(path, tq2(copy), x, K, m, y, N, bias, threads);
        break;
      case Format::q8_0:
      case Format::q4_K:
      case Format::q6_K:
        qd::ggml_matmul(path, ggml(copy), x, K, m, y, N, bias, threads);
        break;
      case Format::fp32:
        break;
    }
  }

  double weight_value(index_t n, index_t k) const {
    switch (format) {
      case Format::bf16:
        return qd::weight_value(bf16(0), n, k);
      case Format::int8:
        return qd::weight_value(int8(0), n, k);
      case Format::q4_0:
        return qd::weight_value(q4(0), n, k);
      case Format::tq2_0: {
        const std::uint8_t* block = u8.data() + std::size_t((n * K + k) / 256 * 66);
        const index_t i = k % 256;
        const int code = (block[32 * (i / 128) + i % 32] >> (2 * ((i % 128) / 32))) & 3;
        return (code - 1) * double(fp16_to_float(std::uint16_t(block[64] | (block[65] << 8))));
      }
      case Format::q8_0:
      case Format::q4_K:
      case Format::q6_K: {
        // The block holding (n, k), decoded once while verify walks its row.
        const GgmlType type = ggml_type_of(weight_format(format));
        const index_t per = ggml_type_info(type).block_elements;
        const index_t block = (n * K + k) / per;
        if (block != cached_block) {
          const index_t bytes = ggml_type_info(type).block_bytes;
          decoded.resize(std::size_t(per));
          dequantize_ggml(type,
                          std::as_bytes(std::span(u8.data() + block * bytes, std::size_t(bytes))),
                          decoded);
          cached_block = block;
        }
        return decoded[std::size_t((n * K + k) % per)];
      }
      case Format::fp32:
        break;
    }
    return 0.0;
  }
  mutable std::vector<float> decoded;
  mutable index_t cached_block = -1;

  Format format;
  index_t N, K;
  std::vector<std::uint8_t> u8;
  std::vector<std::uint16_t> u16;
  std::vector<std::int8_t> i8;
  std::vector<float> f32;
  std::vector<std::int32_t> i32;
};

/// Bytes one pass over the layer's weights reads (int8's row sums are not read).
double layer_bytes(Format format, double N, double K) {
  switch (format) {
    case Format::fp32:
      return 4 * N * K;
    case Format::bf16:
      return 2 * N * K;
    case Format::int8:
      return N * K + 4 * N;
    case Format::q4_0:
      return N * K / 2 + 2 * N * K / 32;
    case Format::tq2_0:
      return N * K / 256 * 66;
    case Format::q8_0:
      return N * K / 32 * 34;
    case Format::q4_K:
      return N * K / 256 * 144;
    case Format::q6_K:
      return N * K / 256 * 210;
  }
  return 0;
}

const char* format_name(Format format) {
  switch (format) {
    case Format::fp32:
      return "fp32";
    case Format::bf16:
      return "bf16";
    case Format::int8:
      return "int8";
    case Format::q4_0:
      return "q4_0";
    case Format::tq2_0:
      return "tq2_0";
    case Format::q8_0:
      return "q8_0";
    case Format::q4_K:
      return "q4_K";
    case Format::q6_K:
      return "q6_K";
  }
  return "?";
}

void report(benchmark::State& state, const Case& c, const char* path) {
  const double N = double(c.shape.out), K = double(c.shape.in);
  set_weight_bytes(state, layer_bytes(c.format, N, K));
  set_flops(state, 2.0 * double(c.tokens) * N * K);
  state.counters["tokens/s"] = benchmark::Counter(
      double(c.tokens), benchmark::Counter::kIsIterationInvariantRate, benchmark::Counter::kIs1000);
  state.SetLabel(context_label(c.threads) + ", " + path);
}

/// The first and last rows of y against the scalar oracle, with a bound loose enough for every
/// path (the quantising ones err by ≤ ~0.4 % of Σ|x·ŵ|) and far below what a wrong kernel makes.
void verify(const char* what, const QuantLayers& layers, const Tensor<float, 2>& x,
            const std::vector<float>& bias, const std::vector<float>& y) {
  const index_t m = x.dim(0), K = layers.K, N = layers.N;
  std::vector<float> want(static_cast<std::size_t>(N));
  for (index_t row : {index_t{0}, m - 1}) {
    layers.run(KernelPath::scalar, 0, x.data() + row * K, 1, want.data(), 1, bias.data());
    for (index_t n = 0; n < N; ++n) {
      double scale = std::abs(bias[std::size_t(n)]);
      for (index_t k = 0; k < K; ++k) scale += std::abs(x(row, k) * layers.weight_value(n, k));
      const double got = y[std::size_t(row * N + n)];
      if (!(std::abs(got - want[std::size_t(n)]) <= 1e-2 * scale)) {
        std::fprintf(stderr, "%s: wrong result at [%td, %td]: %g vs %g\n", what, row, n, got,
                     double(want[std::size_t(n)]));
        std::exit(1);
      }
    }
  }
}

void bench_quantized(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const index_t N = c.shape.out, K = c.shape.in;
  const int copies = c.prefill ? 2 : copies_for(layer_bytes(c.format, double(N), double(K)));
  const QuantLayers layers(c.format, N, K, copies);
  const auto x = random_tensor<2>({c.tokens, K}, 7);
  std::vector<float> bias(static_cast<std::size_t>(N), 0.25f);
  std::vector<float> y(static_cast<std::size_t>(c.tokens * N));
  layers.run(c.path, 0, x.data(), c.tokens, y.data(), c.threads, bias.data(), c.gemv);
  verify(format_name(c.format), layers, x, bias, y);
  std::size_t copy = 0;
  for (auto _ : state) {
    copy = (copy + 1) % std::size_t(copies);
    layers.run(c.path, copy, x.data(), c.tokens, y.data(), c.threads, bias.data(), c.gemv);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  report(state, c,
         (std::string(quant::kernel_path_name(c.path)) + (c.gemv ? " gemv" : "")).c_str());
}

/// The baseline: dissect's fp32 Linear on the same shapes, in the same run.
void bench_fp32(benchmark::State& state, Case c) {
  use_threads(c.threads);
  const int copies =
      c.prefill ? 2
                : copies_for(layer_bytes(Format::fp32, double(c.shape.out), double(c.shape.in)));
  std::vector<Linear<float>> layers;
  for (int i = 0; i < copies; ++i) {
    layers.emplace_back(c.shape.in, c.shape.out, LinearOptions{.seed = std::uint64_t(i)});
  }
  const auto x = random_tensor<2>({c.tokens, c.shape.in}, 7);
  Tensor<float, 2> y({c.tokens, c.shape.out});
  layers[0].forward_into(x, y);
  verify_rows("quant/fp32", x, layers[0].weight(), layers[0].bias(), y);
  std::size_t index = 0;
  for (auto _ : state) {
    layers[++index % layers.size()].forward_into(x, y);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  report(state, c, "Linear<float>::forward_into");
}

/// The bar for the M = 1 rows: this core's plain read rate over the same 1.1 GB of copies the
/// GEMVs stream (one layer's bytes per iteration, the next copy each time, 64-bit words OR-ed:
/// the compiler's own vector loop at -march=native, nothing else done with the bytes).
void bench_read(benchmark::State& state, double layer_bytes_per_copy) {
  use_threads(1);
  const auto words = static_cast<std::size_t>(layer_bytes_per_copy / 8);
  const int copies = copies_for(layer_bytes_per_copy);
  std::vector<std::uint64_t> buffer(words * std::size_t(copies));
  for (std::size_t i = 0; i < buffer.size(); ++i) buffer[i] = i * 0x9e3779b97f4a7c15ull;
  std::size_t copy = 0;
  for (auto _ : state) {
    copy = (copy + 1) % std::size_t(copies);
    const std::uint64_t* p = buffer.data() + copy * words;
    std::uint64_t folded = 0;
    for (std::size_t i = 0; i < words; ++i) folded |= p[i];
    benchmark::DoNotOptimize(folded);
  }
  set_weight_bytes(state, double(words) * 8);
}

void register_all() {
  std::vector<int> thread_counts = {1};
#ifdef _OPENMP
  if (omp_get_max_threads() > 1) thread_counts.push_back(omp_get_max_threads());
#endif
  std::printf("kernel paths this CPU supports:");
  for (KernelPath p : quant::supported_kernel_paths()) {
    std::printf(" %s", std::string(quant::kernel_path_name(p)).c_str());
  }
  std::printf("\n\n");
  // The plain read rate, streamed as q4_K's 4096 × 4096 layer is (9.4 MB a copy).
  benchmark::RegisterBenchmark("read/plain/4096x4096/q4_K_bytes/threads=1", bench_read,
                               layer_bytes(Format::q4_K, 4096, 4096))
      ->Unit(benchmark::kMicrosecond)
      ->UseRealTime();
  for (const auto& shape : llama7b_shapes) {
    for (index_t tokens : {1, 8, 128}) {
      for (int threads : thread_counts) {
        const std::string s = std::to_string(shape.in) + "x" + std::to_string(shape.out) +
                              "/M=" + std::to_string(tokens) +
                              "/threads=" + std::to_string(threads);
        auto add = [&](Format format, std::optional<KernelPath> path) {
          const Case c{shape, tokens, threads, format, path.value_or(KernelPath::scalar)};
          const std::string name = std::string("quant/") + format_name(format) + "/" +
                                   (path ? std::string(quant::kernel_path_name(*path)) : "eigen") +
                                   "/" + s;
          benchmark::RegisterBenchmark(name.c_str(), path ? bench_quantized : bench_fp32, c)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        };
        auto best = [&](WeightFormat format) { return quant::best_kernel_path(format, tokens); };
        auto alternative = [&](KernelPath best_path, KernelPath other) {
          return other != best_path && quant::cpu_supports(other);
        };
        add(Format::fp32, std::nullopt);
        const KernelPath bf16 = best(WeightFormat::bf16);
        add(Format::bf16, bf16);
        for (KernelPath other : {KernelPath::avx512, KernelPath::avx512_bf16}) {
          if (alternative(bf16, other)) add(Format::bf16, other);
        }
        if (tokens > 8) continue;  // prefill: fp32 against bf16 only
        const KernelPath int8 = best(WeightFormat::int8), q4 = best(WeightFormat::q4_0);
        add(Format::int8, int8);
        if (alternative(int8, KernelPath::avx512)) add(Format::int8, KernelPath::avx512);
        if (tokens > 1 && quant::cpu_supports(KernelPath::avx512_vnni)) {
          // From vnni_gemm_min_rows_* rows the path runs its GEMM: its GEMV tiles too, to compare.
          for (Format format : {Format::int8, Format::q4_0}) {
            const Case c{shape, tokens, threads, format, KernelPath::avx512_vnni, false, true};
            const std::string name =
                std::string("quant/") + format_name(format) + "/avx512_vnni_gemv/" + s;
            benchmark::RegisterBenchmark(name.c_str(), bench_quantized, c)
                ->Unit(benchmark::kMicrosecond)
                ->UseRealTime();
          }
        }
        add(Format::q4_0, q4);
        if (alternative(q4, KernelPath::avx512)) add(Format::q4_0, KernelPath::avx512);
        const KernelPath tq2 = best(WeightFormat::tq2_0);
        add(Format::tq2_0, tq2);
        if (alternative(tq2, KernelPath::avx2)) add(Format::tq2_0, KernelPath::avx2);
        // GGUF's q8_0 and K-quants: the avx512_vnni path (decode: the K-quants' GEMV rows)
        // against avx2, llama.cpp's own arithmetic.
        for (Format format : {Format::q8_0, Format::q4_K, Format::q6_K}) {
          const KernelPath path = best(weight_format(format));
          add(format, path);
          if (alternative(path, KernelPath::avx2)) add(format, KernelPath::avx2);
        }
      }
    }
  }
  // Where the avx512_vnni path's GEMM starts to pay (vnni_gemm_min_rows_*): GEMV tiles against
  // the GEMM at a few rows, weights streamed from DRAM as in a real model's small prefill.
  if (quant::cpu_supports(KernelPath::avx512_vnni)) {
    for (index_t tokens : {8, 16, 24, 32, 48, 64}) {
      for (Format format : {Format::int8, Format::q4_0}) {
        for (bool gemv : {true, false}) {
          const LinearShape shape{4096, 4096, "q"};
          const Case c{shape, tokens, 1, format, KernelPath::avx512_vnni, false, gemv};
          const std::string name = std::string("threshold/") + format_name(format) +
                                   (gemv ? "/gemv" : "/gemm") +
                                   "/4096x4096/M=" + std::to_string(tokens);
          benchmark::RegisterBenchmark(name.c_str(), bench_quantized, c)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        }
      }
    }
  }
  // Prefill at TinyLlama-1.1B's shapes (D 2048, F 5632, K/V 256 wide): compute-bound, weights
  // from cache. The avx512_vnni path (its GEMM from vnni_gemm_min_rows_* rows) against its GEMV
  // tiles (what it ran before), the exact avx512 path, bf16, and the fp32 packed GEMM.
  const LinearShape tiny[] = {
      {2048, 2048, "q, o"}, {2048, 256, "k, v"}, {2048, 5632, "gate, up"}, {5632, 2048, "down"}};
  for (const auto& shape : tiny) {
    for (index_t tokens : {128, 512}) {
      for (int threads : thread_counts) {
        const std::string s = std::to_string(shape.in) + "x" + std::to_string(shape.out) +
                              "/M=" + std::to_string(tokens) +
                              "/threads=" + std::to_string(threads);
        auto add = [&](Format format, std::optional<KernelPath> path, bool gemv) {
          const Case c{shape, tokens, threads, format, path.value_or(KernelPath::scalar),
                       true,  gemv};
          const std::string variant =
              path ? std::string(quant::kernel_path_name(*path)) + (gemv ? "_gemv" : "") : "fp32";
          const std::string name =
              std::string("prefill/") + format_name(format) + "/" + variant + "/" + s;
          benchmark::RegisterBenchmark(name.c_str(), path ? bench_quantized : bench_fp32, c)
              ->Unit(benchmark::kMicrosecond)
              ->UseRealTime();
        };
        add(Format::fp32, std::nullopt, false);
        if (quant::cpu_supports(KernelPath::avx512_bf16)) {
          add(Format::bf16, KernelPath::avx512_bf16, false);
          add(Format::bf16, KernelPath::avx512_bf16, true);
        }
        for (Format format : {Format::int8, Format::q4_0}) {
          if (quant::cpu_supports(KernelPath::avx512_vnni)) {
            add(format, KernelPath::avx512_vnni, false);
            add(format, KernelPath::avx512_vnni, true);
          }
          if (quant::cpu_supports(KernelPath::avx512)) add(format, KernelPath::avx512, false);
        }
        // GGUF's blocks: the packed VNNI GEMM (ggml_gemm_vnni.hpp) against avx2.
        for (Format format : {Format::q8_0, Format::q4_K, Format::q6_K}) {
          if (quant::cpu_supports(KernelPath::avx512_vnni)) {
            add(format, KernelPath::avx512_vnni, false);
          }
          if (quant::cpu_supports(KernelPath::avx2)) add(format, KernelPath::avx2, false);
        }
      }
    }
  }
}

}  // namespace
}  // namespace dissect::bench

int main(int argc, char** argv) {
  return dissect::bench::run_benchmarks(argc, argv, dissect::bench::register_all);
}
