// dissect/kernels/detail/gemm_avx2.hpp — private: do not include directly (kernels/gemm.hpp
// does).
//
// The AVX2/FMA path of the packed GEMM. A panel of 16 is two 8-wide registers, so a tile is up
// to 6 rows × 1 panel (12 accumulators of 16), or 3 rows × 2 panels for a gated weight (whose
// tile must hold the gate and up halves of the same outputs); two FMA ports at 4-5 cycles of
// latency need ≥ 8-10 independent chains, which 12 give.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/gemm_avx2.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/kernels/detail/gemm_driver.hpp"
#include "dissect/kernels/detail/simd_avx2.hpp"
#include "dissect/kernels/detail/simd_targets.hpp"
#include "dissect/kernels/detail/vector_math_avx2.hpp"

#if DISSECT_X86

namespace dissect::kernels::detail::avx2 {

/// The prefetch of tile<MR, NP> (gemm_tile_body.hpp) at depth step k: the next tile's panels
/// (`next`), a cache line per panel and step, into L1.
template <int MR, int NP>
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline void prefetch_step(
    const float* const (&/*panel*/)[NP], const float* next, index_t b_stride, const float* /*a*/,
    index_t k) {
  if (next) {
#pragma GCC unroll 2
    for (int p = 0; p < NP; ++p) {
      _mm_prefetch(reinterpret_cast<const char*>(next + p * b_stride + k * 16), _MM_HINT_T0);
    }
  }
}

}  // namespace dissect::kernels::detail::avx2

// avx2::tile<MR, NP> (MR rows × NP panels, 2·NP registers per row) and avx2::TileEpilogues.
#define DISSECT_SIMD_NAMESPACE avx2
#define DISSECT_SIMD_TARGET DISSECT_TARGET_AVX2
#include "dissect/kernels/detail/gemm_tile_body.hpp"

namespace dissect::kernels::detail {

/// The AVX2 path as the driver sees it.
struct Avx2Gemm : avx2::TileEpilogues {
  static void pack_b(const StridedMatrix& b, index_t n, index_t p0, index_t count, index_t k0,
                     index_t kc, float* out) {
    detail::pack_b(b, n, p0, count, k0, kc, out);
  }
  static constexpr int plain_panels(index_t /*m*/) { return 1; }
  static constexpr int plain_heights[] = {1, 2, 4, 6};
  static constexpr int gated_heights[] = {1, 2, 3};
  static constexpr int max_rows(int np) { return np == 2 ? 3 : 6; }
  static constexpr int kernel_rows(int np, index_t rows) {
    return np == 2 ? tile_height(gated_heights, rows) : tile_height(plain_heights, rows);
  }

  DISSECT_TARGET_AVX2 static void tile(int height, int np, index_t kc, const float* a,
                                       const float* b, index_t b_stride, const float* src,
                                       index_t lds, float* dst, index_t ldd, int rows, int cols,
                                       const float* next) {
    if (np == 2) {
      switch (height) {
        case 1:
          return avx2::tile<1, 2>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next);
        case 2:
          return avx2::tile<2, 2>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next);
        default:
          return avx2::tile<3, 2>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next);
      }
    }
    switch (height) {
      case 1:
        return avx2::tile<1, 1>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next);
      case 2:
        return avx2::tile<2, 1>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next);
      case 4:
        return avx2::tile<4, 1>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next);
      default:
        return avx2::tile<6, 1>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next);
    }
  }
};

}  // namespace dissect::kernels::detail

#endif  // DISSECT_X86
