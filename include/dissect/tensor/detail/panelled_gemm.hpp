// dissect/tensor/detail/panelled_gemm.hpp — private: do not include directly (kernels.hpp does).
//
// Every product in the library goes through panelled_product, which cuts the destination's
// columns into panels before handing each to Eigen. The panels serve two ends: they keep Eigen's
// single-threaded GEMM off a slow path at wide shapes, and they are the unit of work when a
// skinny product (few tokens) is split across OpenMP threads. bench/README.md has the numbers.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/tensor/detail/panelled_gemm.hpp is private to dissect: include any public dissect header (they share it) instead"
#endif

#include <algorithm>

#include "dissect/core/shape.hpp"
#include "dissect/core/thread_policy.hpp"

namespace dissect::detail {

/// Widest panel handed to one Eigen GEMM call. Eigen 3.4's sequential GEMM never blocks the
/// rows of its packed left operand once the depth is blocked (K > ~800 in float with AVX-512),
/// so for Y = X·Wᵀ it packs out_features × kc values per call: 36 MB at 11008 × 824. Above
/// glibc's 32 MiB mmap threshold cap that buffer is mapped fresh on every call, and its ~9,000
/// page faults per call are the "cliff" at N ≥ 10240. 4096 columns keep it at 13.5 MB.
inline constexpr index_t gemm_column_panel = 4096;

/// Products with at most this many rows (tokens) are split across threads by dissect itself:
/// Eigen does not thread GEMV at all and loses time threading very short GEMMs.
inline constexpr index_t skinny_rows = 32;

/// The threads for a kernel that splits the weight rows itself at any number of activation rows
/// (the quantised kernels): OpenMP's count, 1 inside a parallel region or for too little work
/// (thread_policy::min_streamed_values of W per thread).
inline int threads_for_weights(index_t streamed_values);

/// How many threads to split a skinny product over: 1 without OpenMP, inside a parallel region,
/// for products with many rows (Eigen threads those itself), or when the work is too small.
inline int threads_for_product(index_t rows, index_t streamed_values) {
  return rows > skinny_rows ? 1 : threads_for_weights(streamed_values);
}

inline int threads_for_weights(index_t streamed_values) {
  return thread_policy::threads_for(streamed_values, thread_policy::min_streamed_values,
                                    thread_policy::available_threads());
}

/// dst = lhs·rhs (or dst += lhs·rhs when `accumulate`), column panel by column panel, the panels
/// spread over `threads` threads. An empty reduction yields exact zeros.
template <class Dst, class Lhs, class Rhs>
void panelled_product(Dst&& dst, const Lhs& lhs, const Rhs& rhs, bool accumulate, int threads) {
  const index_t columns = dst.cols();
  if (lhs.cols() == 0) {
    if (!accumulate) dst.setZero();
    return;
  }
  if (columns == 0 || dst.rows() == 0) return;
  if (threads == 1 && columns <= gemm_column_panel) {  // one panel: exactly the plain expression
    if (accumulate) {
      dst.noalias() += lhs * rhs;
    } else {
      dst.noalias() = lhs * rhs;
    }
    return;
  }
  // As many panels as needed to stay under the width cap, rounded up to a multiple of the
  // thread count so that every thread gets the same share.
  index_t panels = (columns + gemm_column_panel - 1) / gemm_column_panel;
  panels = (panels + threads - 1) / threads * threads;
  panels = std::min(panels, columns);
  const index_t width = (columns + panels - 1) / panels;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#endif
  for (index_t panel = 0; panel < panels; ++panel) {
    const index_t first = panel * width;
    if (first >= columns) continue;
    const index_t count = std::min(width, columns - first);
    auto dst_panel = dst.middleCols(first, count);
    if (accumulate) {
      dst_panel.noalias() += lhs * rhs.middleCols(first, count);
    } else {
      dst_panel.noalias() = lhs * rhs.middleCols(first, count);
    }
  }
}

}  // namespace dissect::detail
