// dissect/quant/detail/quant_kernels.hpp — PRIVATE: the quantised layers include it; tests and
// benchmarks include it to reach every path.
//
// y = x·Ŵᵀ (+ b) with the weights stored as bf16, int8 per output channel or GGUF q4_0, on any of
// the code paths of quant/kernel_path.hpp: the scalar oracle, and SIMD paths compiled for their
// own instruction sets and chosen at run time. x and y are fp32 row-major with leading
// dimensions; the weights are read in place, never unpacked to a copy of the layer (the prefill
// GEMMs, quant_gemm_vnni.hpp and quant_gemm_bf16.hpp, repack one panel at a time into a
// per-thread buffer).
//
// Error bounds, per element, against the exact Σ_k x_k·ŵ_k + b (u = 2⁻²⁴, γ_n = n·u/(1 − n·u),
// S = Σ_k |x_k·ŵ_k| + |b|):
//   scalar        |Δ| ≤ u·|y| + γ_K(double)·S: one rounding of a double sum.
//   avx2, avx512  |Δ| ≤ γ_{K+8}·S. Every product is exact or rounded once (bf16 and q4 weights are
//                 exact in fp32, int8 ones are scaled once at the end) and reaches y through at
//                 most K/16 lane additions, 4 (3 for ymm) horizontal ones, one per K chunk, the
//                 bias and the scale: fewer than K + 8 roundings.
//   avx512_vnni   each block of 32 activations is quantised with sx = max|x|/127 (fp32), and
//                 |x_k − sx·q_k| ≤ (sx/2)(1 + 2⁻¹⁴) (half a step, plus three fp32 roundings on
//                 values up to 127 steps). Integer dot products are exact; what follows rounds as
//                 above. So |Δ| ≤ Σ_k (sx_b(k)/2)(1 + 2⁻¹⁴)·|ŵ_k| + γ_{K+8}·S', where S' is S
//                 with |x_k| replaced by |x_k| + sx_b(k)/2.
//                 The same bound holds for the path's prefill GEMM (quant_gemm_vnni.hpp, from
//                 vnni_gemm_min_rows_* rows): the same activation blocks and sx, integer sums exact
//                 per block of 32 (< 2²⁰), then per block one rounding for cvt·sx (two for q4_0,
//                 sx·d first) and one for the addition, plus one per K chunk of 512, the int8
//                 channel scale and the bias: fewer than K + 8 roundings for any K ≥ 1.
//                 Exact-to-fp32 mode: a caller for whom this activation error matters pins the
//                 avx512 path (force_kernel_path(KernelPath::avx512), or this header's
//                 quantized_matmul(KernelPath::avx512, …)): fp32 activations against weights
//                 widened exactly in registers, the γ_{K+8}·S bound above, at the fp32 rate.
//   avx512_bf16   each activation is rounded to bf16 (8 significant bits, nearest even):
//                 |x_k − x̃_k| ≤ 2⁻⁸·|x_k| — 2⁻⁸, not 2⁻⁹: x = 1 + 2⁻⁸ is a tie that rounds to
//                 1, an error of 2⁻⁸/(1 + 2⁻⁸)·|x|. bf16 × bf16 products are exact in fp32 and
//                 vdpbf16ps adds them one rounding at a time, so |Δ| ≤ Σ_k 2⁻⁸·|x_k·ŵ_k| +
//                 γ_{K+8}·S'' (S'' with x̃), plus the instruction's flush of subnormals: at most
//                 2⁻¹²⁶ per activation, weight and partial sum, negligible for any real layer.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/quant_kernels.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <cstdint>
#include <string_view>
#include <type_traits>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/kernels/compile_once.hpp"
#include "dissect/numeric/half.hpp"
#include "dissect/quant/detail/quant_gemm_bf16.hpp"
#include "dissect/quant/detail/quant_gemm_vnni.hpp"
#include "dissect/quant/detail/quant_kernels_avx2.hpp"
#include "dissect/quant/detail/quant_kernels_avx512.hpp"
#include "dissect/quant/detail/quant_tiles.hpp"
#include "dissect/quant/kernel_path.hpp"

namespace dissect::quant::detail {

// ---- declarations -------------------------------------------------------------------------------

/// x: [m, K] (row i at x + i·ldx)  W: [N, K]  bias: [N] or null  →  y: [m, N] (row i at
/// y + i·ldy), written, never read. `threads` > 1 splits N over up to that many OpenMP threads
/// when built with OpenMP (fewer when W is too small to pay for the fork: 32k weights each); the
/// scalar path ignores it. m = 0 or N = 0 does nothing.
/// @throws ConfigError for a path outside the enum, one that has no kernel for the format, or
///         threads < 1; Error when the CPU lacks the path or a pointer is null; ShapeError for
///         K < 1, q4_0 K not a multiple of 32, m or N < 0, ldx < K or ldy < N.
void quantized_matmul(KernelPath path, const Bf16WeightsView& w, const float* x, index_t ldx,
                      index_t m, float* y, index_t ldy, const float* bias, int threads);
void quantized_matmul(KernelPath path, const Int8WeightsView& w, const float* x, index_t ldx,
                      index_t m, float* y, index_t ldy, const float* bias, int threads);
void quantized_matmul(KernelPath path, const Q4WeightsView& w, const float* x, index_t ldx,
                      index_t m, float* y, index_t ldy, const float* bias, int threads);

/// The same on active_kernel_path(format, m): the pinned path or the fastest for this CPU.
void quantized_matmul(const Bf16WeightsView& w, const float* x, index_t ldx, index_t m, float* y,
                      index_t ldy, const float* bias, int threads);
void quantized_matmul(const Int8WeightsView& w, const float* x, index_t ldx, index_t m, float* y,
                      index_t ldy, const float* bias, int threads);
void quantized_matmul(const Q4WeightsView& w, const float* x, index_t ldx, index_t m, float* y,
                      index_t ldy, const float* bias, int threads);

/// ŵ[n, k], exactly, as a double: what the scalar oracle and the tests' bounds use.
double weight_value(const Bf16WeightsView& w, index_t n, index_t k);
double weight_value(const Int8WeightsView& w, index_t n, index_t k);
double weight_value(const Q4WeightsView& w, index_t n, index_t k);

// ---- implementation -----------------------------------------------------------------------------

inline double weight_value(const Bf16WeightsView& w, index_t n, index_t k) {
  return bf16_to_float(w.bits[n * w.cols + k]);
}

inline double weight_value(const Int8WeightsView& w, index_t n, index_t k) {
  return double(w.scales[n]) * w.values[n * w.cols + k];  // exact in double
}

inline double weight_value(const Q4WeightsView& w, index_t n, index_t k) {
  const std::uint8_t byte = w.nibbles[n * (w.cols / 2) + (k / 32) * 16 + k % 16];
  const int q = k % 32 < 16 ? byte & 0x0f : byte >> 4;
  return (q - 8) * double(fp16_to_float(w.scales[n * (w.cols / 32) + k / 32]));
}

/// The oracle: a double sum per element, rounded once. Slow on purpose, shares nothing with the
/// SIMD paths but the layout reading in weight_value.
template <class View>
void scalar_matmul(const View& w, const float* x, index_t ldx, index_t m, float* y, index_t ldy,
                   const float* bias) {
  for (index_t i = 0; i < m; ++i) {
    for (index_t n = 0; n < w.rows; ++n) {
      double sum = 0.0;
      for (index_t k = 0; k < w.cols; ++k) sum += double(x[i * ldx + k]) * weight_value(w, n, k);
      if (bias) sum += bias[n];
      y[i * ldy + n] = static_cast<float>(sum);
    }
  }
}

inline void check_call(WeightFormat format, KernelPath path, const void* weights,
                       const void* scales, index_t N, index_t K, const float* x, index_t ldx,
                       index_t m, const float* y, index_t ldy, int threads) {
  const std::string op = dissect::detail::concat("quantized_matmul(", weight_format_name(format),
                                                 ", ", kernel_path_name(path), ")");
  dissect::detail::check_enum("quantized_matmul", "KernelPath", path,
                              dissect::detail::kernel_path_names);
  const std::string shapes =
      dissect::detail::concat(" (x: [m, K] = [", m, ", ", K, "], ldx ", ldx, "; W: [N, K] = [", N,
                              ", ", K, "]; y ldy ", ldy, ")");
  if (!path_applies(path, format)) {
    throw ConfigError(dissect::detail::concat(op, ": the ", kernel_path_name(path),
                                              " path has no kernel for ",
                                              weight_format_name(format), " weights"));
  }
  if (!cpu_supports(path)) {
    throw Error(
        dissect::detail::concat(op, ": this CPU cannot run the ", kernel_path_name(path), " path"));
  }
  if (threads < 1) {
    throw ConfigError(dissect::detail::concat(op, ": threads = ", threads, " (must be >= 1)"));
  }
  if (K < 1 || N < 0 || m < 0) {
    throw ShapeError(dissect::detail::concat(op, ": negative extent or K < 1", shapes));
  }
  if (format == WeightFormat::q4_0 && K % 32 != 0) {
    throw ShapeError(dissect::detail::concat(op, ": K = ", K, " is not a multiple of 32", shapes));
  }
  if (m > 0 && N > 0) {
    if (ldx < K) throw ShapeError(dissect::detail::concat(op, ": ldx < K", shapes));
    if (ldy < N) throw ShapeError(dissect::detail::concat(op, ": ldy < N", shapes));
    if (!weights || !scales || !x || !y) {
      throw Error(dissect::detail::concat(op, ": null weights, scales, x or y", shapes));
    }
  }
}

/// Per weight format: its WeightFormat, the arrays check_call tests for null, and its kernel on
/// each SIMD path (no_kernel: the path has none for the format, which check_call rejects).
template <class View>
struct FormatKernels;

/// The table's entry for a path without a kernel. A type, not a null function pointer: GCC 12
/// under -fsanitize=undefined does not accept `kernel == nullptr` as a constant expression.
struct NoKernel {};
inline constexpr NoKernel no_kernel{};

template <class View>
using KernelFn = void (*)(const View&, const float* x, index_t ldx, index_t m, const Output&,
                          int threads);

template <>
struct FormatKernels<Bf16WeightsView> {
  static constexpr WeightFormat format = WeightFormat::bf16;
  static const void* weights(const Bf16WeightsView& w) { return w.bits; }
  static const void* scales(const Bf16WeightsView& w) { return w.bits; }  // it has none
#if DISSECT_X86
  static constexpr KernelFn<Bf16WeightsView> avx2 = drive_rows<Bf16Avx2>;
  static constexpr KernelFn<Bf16WeightsView> avx512 = bf16_avx512;
  static constexpr NoKernel avx512_vnni = no_kernel;
  static constexpr KernelFn<Bf16WeightsView> avx512_bf16 = bf16_dot_path;
#endif
};

template <>
struct FormatKernels<Int8WeightsView> {
  static constexpr WeightFormat format = WeightFormat::int8;
  static const void* weights(const Int8WeightsView& w) { return w.values; }
  static const void* scales(const Int8WeightsView& w) { return w.scales; }
#if DISSECT_X86
  static constexpr KernelFn<Int8WeightsView> avx2 = drive_rows<Int8Avx2>;
  static constexpr KernelFn<Int8WeightsView> avx512 = drive_rows<Int8Avx512>;
  static constexpr KernelFn<Int8WeightsView> avx512_vnni = int8_vnni_path;
  static constexpr NoKernel avx512_bf16 = no_kernel;
#endif
};

template <>
struct FormatKernels<Q4WeightsView> {
  static constexpr WeightFormat format = WeightFormat::q4_0;
  static const void* weights(const Q4WeightsView& w) { return w.nibbles; }
  static const void* scales(const Q4WeightsView& w) { return w.scales; }
#if DISSECT_X86
  static constexpr KernelFn<Q4WeightsView> avx2 = drive_rows<Q4Avx2>;
  static constexpr KernelFn<Q4WeightsView> avx512 = drive_rows<Q4Avx512>;
  static constexpr KernelFn<Q4WeightsView> avx512_vnni = q4_vnni_path;
  static constexpr NoKernel avx512_bf16 = no_kernel;
#endif
};

/// Runs `kernel` and says so; false for a path the table has none for (check_call has rejected
/// it before this is reached), which then falls to the scalar oracle.
template <auto kernel, class View>
bool run_kernel(const View& w, const float* x, index_t ldx, index_t m, const Output& out,
                int threads) {
  if constexpr (std::is_same_v<std::remove_cvref_t<decltype(kernel)>, NoKernel>) {
    return false;
  } else {
    kernel(w, x, ldx, m, out, threads);
    return true;
  }
}

/// quantized_matmul for every format: checks the call, then runs the format's kernel for `path`.
template <class View>
void quantized_matmul_on(KernelPath path, const View& w, const float* x, index_t ldx, index_t m,
                         float* y, index_t ldy, const float* bias, int threads) {
  using Table = FormatKernels<View>;
  check_call(Table::format, path, Table::weights(w), Table::scales(w), w.rows, w.cols, x, ldx, m, y,
             ldy, threads);
  if (m == 0 || w.rows == 0) return;
  const Output out{y, ldy, bias};
  switch (path) {
#if DISSECT_X86
    case KernelPath::avx2:
      if (run_kernel<Table::avx2>(w, x, ldx, m, out, threads)) return;
      break;
    case KernelPath::avx512:
      if (run_kernel<Table::avx512>(w, x, ldx, m, out, threads)) return;
      break;
    case KernelPath::avx512_vnni:
      if (run_kernel<Table::avx512_vnni>(w, x, ldx, m, out, threads)) return;
      break;
    case KernelPath::avx512_bf16:
      if (run_kernel<Table::avx512_bf16>(w, x, ldx, m, out, threads)) return;
      break;
#endif
    default:
      break;
  }
  scalar_matmul(w, x, ldx, m, y, ldy, bias);
}

#if DISSECT_KERNEL_BODIES
DISSECT_KERNEL_ENTRY void quantized_matmul(KernelPath path, const Bf16WeightsView& w,
                                           const float* x, index_t ldx, index_t m, float* y,
                                           index_t ldy, const float* bias, int threads) {
  quantized_matmul_on(path, w, x, ldx, m, y, ldy, bias, threads);
}

DISSECT_KERNEL_ENTRY void quantized_matmul(KernelPath path, const Int8WeightsView& w,
                                           const float* x, index_t ldx, index_t m, float* y,
                                           index_t ldy, const float* bias, int threads) {
  quantized_matmul_on(path, w, x, ldx, m, y, ldy, bias, threads);
}

DISSECT_KERNEL_ENTRY void quantized_matmul(KernelPath path, const Q4WeightsView& w, const float* x,
                                           index_t ldx, index_t m, float* y, index_t ldy,
                                           const float* bias, int threads) {
  quantized_matmul_on(path, w, x, ldx, m, y, ldy, bias, threads);
}
#endif

inline void quantized_matmul(const Bf16WeightsView& w, const float* x, index_t ldx, index_t m,
                             float* y, index_t ldy, const float* bias, int threads) {
  quantized_matmul(active_kernel_path(WeightFormat::bf16, m), w, x, ldx, m, y, ldy, bias, threads);
}

inline void quantized_matmul(const Int8WeightsView& w, const float* x, index_t ldx, index_t m,
                             float* y, index_t ldy, const float* bias, int threads) {
  quantized_matmul(active_kernel_path(WeightFormat::int8, m), w, x, ldx, m, y, ldy, bias, threads);
}

inline void quantized_matmul(const Q4WeightsView& w, const float* x, index_t ldx, index_t m,
                             float* y, index_t ldy, const float* bias, int threads) {
  quantized_matmul(active_kernel_path(WeightFormat::q4_0, m), w, x, ldx, m, y, ldy, bias, threads);
}

}  // namespace dissect::quant::detail
