// dissect/kernels/gemm.hpp — dissect's own fp32 GEMM: packed weights, AVX-512 / AVX2 micro-kernels
// chosen at run time, fused epilogues, and no allocation per call.
//
// packed_matmul is the inference product, y = epilogue(x·Wᵀ) on a PackedWeight. The training
// products of kernels.hpp (y = x·Wᵀ + b, dx = dy·W, dW += dyᵀ·x) run through the same driver with
// W, Wᵀ or xᵀ packed block by block into a per-thread workspace that is allocated once, so their
// speed does not depend on what else the process allocates (Eigen allocates its packing buffer
// on every call). The path follows kernels/cpu_dispatch.hpp: the same CPU detection and the same
// pin (force_kernel_path) for tests and benchmarks.
#pragma once

#include <algorithm>
#include <cstdint>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/core/thread_policy.hpp"
#include "dissect/kernels/compile_once.hpp"
#include "dissect/kernels/cpu_dispatch.hpp"
#include "dissect/kernels/detail/gemm_avx2.hpp"
#include "dissect/kernels/detail/gemm_avx512.hpp"
#include "dissect/kernels/detail/gemm_driver.hpp"
#include "dissect/kernels/detail/gemm_portable.hpp"
#include "dissect/kernels/epilogue.hpp"
#include "dissect/kernels/packed_weight.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// The path packed_matmul and the float training products run: a pinned scalar, avx2 or avx512
/// path (a pinned avx512_vnni or avx512_bf16 runs avx512, which both imply); otherwise avx512,
/// avx2 or scalar, the best this CPU supports. "scalar" means the portable C++ kernels for
/// packed_matmul and Eigen for the training products.
KernelPath gemm_kernel_path();

/// y [m, N] (row n of y at y + i·ldy) = epilogue(x·Wᵀ), x [m, K] at row stride ldx, W packed.
/// threads = 0 picks the count (OpenMP's, capped so each thread has work; 1 without OpenMP or
/// inside a parallel region); threads > 0 uses at most that many. The result does not depend on
/// the thread count: each output sums over K in the same order.
/// @throws ShapeError for m < 0, ldx < K, ldy < N, residual_stride < N, or a bias or residual
///         overlapping y (the message names both shapes); ConfigError for threads < 0 or an
///         up_bias on a plain weight; Error for a null x or y with m·N > 0.
void packed_matmul(const float* x, index_t ldx, index_t m, const PackedWeight& w, float* y,
                   index_t ldy, const Epilogue& epilogue = {}, int threads = 0);

namespace kernels::detail {

/// How many threads a call uses (see packed_matmul).
int gemm_threads(const GemmCall& call, int requested);

/// Runs `call` (checked by its caller) on `path` with `threads` threads.
void run_gemm_on(const GemmCall& call, KernelPath path, int threads);

}  // namespace kernels::detail

// ---- implementation -----------------------------------------------------------------------------

inline KernelPath gemm_kernel_path() {
  if (const auto forced = forced_kernel_path()) {
    return *forced == KernelPath::avx512_vnni || *forced == KernelPath::avx512_bf16
               ? KernelPath::avx512
               : *forced;
  }
  if (cpu_supports(KernelPath::avx512)) return KernelPath::avx512;
  if (cpu_supports(KernelPath::avx2)) return KernelPath::avx2;
  return KernelPath::scalar;
}

namespace kernels::detail {

/// For few rows the work is the weights streamed from memory, each worth ~32 flops of time (this
/// machine streams ~15 GB/s per core against ~200 GFLOP/s); thread_policy::min_gemm_flops of it
/// per thread.
inline constexpr index_t flops_per_streamed_weight = 32;

inline int gemm_threads(const GemmCall& call, int requested) {
#ifdef _OPENMP
  const int threads = requested == 0 ? thread_policy::available_threads() : requested;
  const index_t pairs = (call.panels() + 1) / 2;
  const index_t k = std::max<index_t>(call.k, 1);
  const index_t flops = std::max(2 * call.m, flops_per_streamed_weight) * call.n * k;
  // No more threads than panel pairs, the unit run_threads hands out.
  return thread_policy::threads_for(flops, thread_policy::min_gemm_flops,
                                    std::min<index_t>(threads, std::max<index_t>(pairs, 1)));
#else
  (void)call;
  (void)requested;
  return 1;
#endif
}

/// Splits the panels into `threads` contiguous ranges of whole panel pairs (a pair is the
/// widest tile of any path) and runs one per thread.
template <class Isa>
void run_threads(const GemmCall& call, int threads) {
  const index_t panels = call.panels();
  if (threads <= 1) {
    run_gemm<Isa>(call, 0, panels);
    return;
  }
  const index_t pairs = (panels + 1) / 2;
  const index_t share = (pairs + threads - 1) / threads * 2;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
  for (int t = 0; t < threads; ++t) {
    const index_t begin = std::min(panels, t * share), end = std::min(panels, begin + share);
    if (begin < end) run_gemm<Isa>(call, begin, end);
  }
}

#if DISSECT_KERNEL_BODIES
DISSECT_KERNEL_ENTRY void run_gemm_on(const GemmCall& call, KernelPath path, int threads) {
  if (call.m == 0 || call.n == 0) return;
  switch (path) {
#if DISSECT_X86
    case KernelPath::avx512:
    case KernelPath::avx512_vnni:
    case KernelPath::avx512_bf16:
      return run_threads<Avx512Gemm>(call, threads);
    case KernelPath::avx2:
      return run_threads<Avx2Gemm>(call, threads);
#endif
    default:
      return run_threads<PortableGemm>(call, threads);
  }
}
#endif

/// [first, first + extent) as addresses, for overlap checks of row-strided ranges.
inline bool ranges_overlap(const float* a, index_t a_extent, const float* b, index_t b_extent) {
  const auto a0 = reinterpret_cast<std::uintptr_t>(a), b0 = reinterpret_cast<std::uintptr_t>(b);
  const auto a1 = a0 + static_cast<std::uintptr_t>(a_extent) * sizeof(float);
  const auto b1 = b0 + static_cast<std::uintptr_t>(b_extent) * sizeof(float);
  return a0 < b1 && b0 < a1;
}

inline void check_packed_call(const float* x, index_t ldx, index_t m, const PackedWeight& w,
                              const float* y, index_t ldy, const Epilogue& e, int threads) {
  const index_t n = w.out_features(), k = w.in_features();
  const auto shapes = dissect::detail::concat("x [", m, ", ", k, "] (row stride ", ldx, "), W [", n,
                                              ", ", k, "]", w.is_gated() ? " gated" : "", ", y [",
                                              m, ", ", n, "] (row stride ", ldy, ")");
  const auto fail = [&](const char* what) {
    return ShapeError(dissect::detail::concat("packed_matmul: ", what, ": ", shapes));
  };
  if (threads < 0) {
    throw ConfigError(dissect::detail::concat("packed_matmul: threads = ", threads,
                                              " (0 picks the count, > 0 caps it)"));
  }
  if (e.up_bias && !w.is_gated()) {
    throw ConfigError("packed_matmul: an up_bias needs a gated weight (PackedWeight::gated)");
  }
  if (m < 0) throw fail("negative row count m");
  if (m == 0 || n == 0) return;
  if (ldx < k) throw fail("x's row stride is smaller than K");
  if (ldy < n) throw fail("y's row stride is smaller than N");
  if (!y || (!x && k > 0))
    throw Error(dissect::detail::concat("packed_matmul: null x or y: ", shapes));
  const index_t y_extent = (m - 1) * ldy + n;
  if (e.residual) {
    if (e.residual_stride < n) throw fail("the residual's row stride is smaller than N");
    if (ranges_overlap(e.residual, (m - 1) * e.residual_stride + n, y, y_extent)) {
      throw fail("the residual overlaps y");
    }
  }
  if ((e.bias && ranges_overlap(e.bias, n, y, y_extent)) ||
      (e.up_bias && ranges_overlap(e.up_bias, n, y, y_extent))) {
    throw fail("a bias overlaps y");
  }
  if (x && k > 0 && ranges_overlap(x, (m - 1) * ldx + k, y, y_extent)) {
    throw fail("x overlaps y");
  }
}

}  // namespace kernels::detail

inline void packed_matmul(const float* x, index_t ldx, index_t m, const PackedWeight& w, float* y,
                          index_t ldy, const Epilogue& epilogue, int threads) {
  kernels::detail::check_packed_call(x, ldx, m, w, y, ldy, epilogue, threads);
  kernels::detail::GemmCall call;
  call.m = m;
  call.n = w.out_features();
  call.k = w.in_features();
  call.a = {x, ldx, 1};
  call.packed = &w;
  call.c = y;
  call.ldc = ldy;
  call.epilogue = epilogue;
  kernels::detail::run_gemm_on(call, gemm_kernel_path(),
                               kernels::detail::gemm_threads(call, threads));
}

}  // namespace dissect
