// dissect/core/thread_policy.hpp — how many OpenMP threads a product forks for how much work: one
// rule, and the work each kind of kernel must give every thread, named once.
//
// A fork and join costs a few µs (far more when another process holds the other cores), so a
// kernel splits its work only where each thread gets enough to pay for it: one thread per
// threshold's worth of work, at least one, at most the threads it may use. Each threshold is in
// the unit its kernels count work in.
//
// The values and the rule are exactly those the kernels held before they shared this header
// (issue 50): the same sizes give the same thread counts. test_thread_policy checks each
// threshold's counts on both sides of it, and the GEMM's count at its limits.
//
// In the core layer, below tensor/: the panelled Eigen products (tensor/detail/panelled_gemm.hpp)
// use it as well as the kernels.
#pragma once

#include <algorithm>

#include "dissect/core/shape.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dissect::thread_policy {

// ---- declarations -------------------------------------------------------------------------------

/// Eigen's column panels at few rows (tensor/detail/panelled_gemm.hpp), and the thread budget a
/// layer hands the quantised kernels: values of the streamed operand W per thread.
inline constexpr index_t min_streamed_values = index_t{1} << 16;

/// dissect's packed fp32 GEMM (kernels/gemm.hpp): flops per thread, ~10 µs of work. For few rows
/// the GEMM counts each weight streamed from memory as ~32 flops of time (kernels/gemm.hpp:
/// this machine streams ~15 GB/s per core against ~200 GFLOP/s).
inline constexpr index_t min_gemm_flops = index_t{1} << 21;

/// The int8, q4_0 and ggml-block prefill GEMM on VNNI and the bf16 one on AVX512_BF16
/// (quant/detail/quant_gemm_vnni.hpp, quant_gemm_bf16.hpp): ~2M multiply-adds (m·N·K) per thread.
inline constexpr index_t min_multiply_adds = index_t{1} << 21;

/// The quantised kernels that split W's rows over threads (quant/detail/quant_tiles.hpp, and
/// ggml's blocks in quant/detail/ggml_dot.hpp): weights per thread, whatever the activation rows;
/// streaming them (~100 KB) takes about as long as the fork and join.
inline constexpr index_t min_quantized_weights = index_t{1} << 15;

/// The threads to fork for `work`: one per `min_per_thread` of it, at least 1, at most `limit`
/// (which must be ≥ 1): std::clamp(work / min_per_thread, 1, limit).
constexpr int threads_for(index_t work, index_t min_per_thread, index_t limit);

/// The threads a product may fork here: OpenMP's count (OMP_NUM_THREADS, else one per core), but
/// 1 inside a parallel region (nesting would oversubscribe the cores) and without OpenMP.
int available_threads();

// ---- implementation -----------------------------------------------------------------------------

constexpr int threads_for(index_t work, index_t min_per_thread, index_t limit) {
  return static_cast<int>(std::clamp<index_t>(work / min_per_thread, 1, limit));
}

inline int available_threads() {
#ifdef _OPENMP
  return omp_in_parallel() ? 1 : omp_get_max_threads();
#else
  return 1;
#endif
}

}  // namespace dissect::thread_policy
