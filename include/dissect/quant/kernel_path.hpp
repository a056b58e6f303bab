// dissect/quant/kernel_path.hpp — which SIMD code path the low-precision matmul kernels run for a
// weight format.
//
// The paths and the CPU detection are the kernels' (kernels/cpu_dispatch.hpp); this header adds
// what depends on the format: which paths have a kernel for it, and the fastest one at a given
// number of activation rows. Everything that runs a quantised product asks active_kernel_path.
#pragma once

#include "dissect/core/shape.hpp"
#include "dissect/kernels/cpu_dispatch.hpp"
#include "dissect/quant/format.hpp"

namespace dissect::quant {

/// The weight formats (quant/format.hpp) and the code paths (kernels/cpu_dispatch.hpp) are the
/// library's; the quantised kernels name them unqualified. The path names were quant::'s before
/// the dispatch moved to kernels/, and stay reachable as such.
using dissect::cpu_supports;
using dissect::force_kernel_path;
using dissect::forced_kernel_path;
using dissect::kernel_path_name;
using dissect::KernelPath;
using dissect::supported_kernel_paths;
using dissect::weight_format_name;
using dissect::WeightFormat;

// ---- declarations -------------------------------------------------------------------------------

/// Whether `path` has a kernel for `format`: vnni is for int8 and q4_0, bf16 for bf16 only;
/// ggml's block formats (q8_0, q4_K, q5_K, q6_K, tq2_0) have scalar, avx2 and avx512_vnni
/// kernels.
constexpr bool path_applies(KernelPath path, WeightFormat format);

/// The fastest supported path for `format` at `m` activation rows, ignoring any pin. For int8
/// and q4_0 that is avx512_vnni at every m (activations quantised per block of 32: GEMV tiles
/// for a few rows, a packed GEMM from quant::detail::vnni_gemm_min_rows_int8 (8) or _q4 (32) on);
/// pinning avx512 instead keeps the activations fp32 (exact-to-fp32 mode; the bounds in
/// quant/detail/quant_kernels.hpp).
KernelPath best_kernel_path(WeightFormat format, index_t m);

/// What a pin of `pinned` runs for `format`: the pinned path if it applies to `format`;
/// a pinned avx512_vnni or avx512_bf16 that does not apply falls back to avx512 (both imply it),
/// and a pinned avx512 or avx512_bf16 falls back to avx2 for ggml's formats (every AVX-512 CPU
/// has AVX2), so a test can pin one path and run every format. A function of its arguments
/// alone (not of this CPU), so the rule is checked on every machine.
constexpr KernelPath pinned_kernel_path(KernelPath pinned, WeightFormat format);

/// What a dispatch for `format` at `m` rows runs: pinned_kernel_path of the pin
/// (force_kernel_path) if there is one, otherwise best_kernel_path.
KernelPath active_kernel_path(WeightFormat format, index_t m = 1);

/// Below this many activation rows bf16 weights take the avx512 path (fp32 activations, exact)
/// and from it on avx512_bf16 (activations rounded to bf16; its packed GEMM,
/// quant/detail/quant_gemm_bf16.hpp). Decode (m ≤ 32) streams each
/// weight from DRAM once and is bound by bandwidth, where both reach the same speed
/// (bench_quant), so the exact path wins; prefill is bound by arithmetic, where one dpbf16
/// does the work of two FMAs and needs no widening.
inline constexpr index_t bf16_dot_min_rows = 33;

// ---- implementation -----------------------------------------------------------------------------

constexpr bool path_applies(KernelPath path, WeightFormat format) {
  if (is_ggml_format(format)) {
    return path == KernelPath::scalar || path == KernelPath::avx2 ||
           path == KernelPath::avx512_vnni;
  }
  switch (path) {
    case KernelPath::avx512_vnni:
      return format != WeightFormat::bf16;
    case KernelPath::avx512_bf16:
      return format == WeightFormat::bf16;
    default:
      return true;
  }
}

inline KernelPath best_kernel_path(WeightFormat format, index_t m) {
  if (is_ggml_format(format)) {
    if (cpu_supports(KernelPath::avx512_vnni)) return KernelPath::avx512_vnni;
    return cpu_supports(KernelPath::avx2) ? KernelPath::avx2 : KernelPath::scalar;
  }
  if (format == WeightFormat::bf16 && m >= bf16_dot_min_rows &&
      cpu_supports(KernelPath::avx512_bf16)) {
    return KernelPath::avx512_bf16;
  }
  if (format != WeightFormat::bf16 && cpu_supports(KernelPath::avx512_vnni)) {
    return KernelPath::avx512_vnni;
  }
  if (cpu_supports(KernelPath::avx512)) return KernelPath::avx512;
  if (cpu_supports(KernelPath::avx2)) return KernelPath::avx2;
  return KernelPath::scalar;
}

constexpr KernelPath pinned_kernel_path(KernelPath pinned, WeightFormat format) {
  if (path_applies(pinned, format)) return pinned;
  return is_ggml_format(format) ? KernelPath::avx2 : KernelPath::avx512;
}

inline KernelPath active_kernel_path(WeightFormat format, index_t m) {
  if (const auto forced = forced_kernel_path()) return pinned_kernel_path(*forced, format);
  return best_kernel_path(format, m);
}

}  // namespace dissect::quant
