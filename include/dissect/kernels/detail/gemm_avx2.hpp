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
#include "dissect/kernels/detail/simd_targets.hpp"
#include "dissect/kernels/detail/vector_math_avx2.hpp"

#if DISSECT_X86

namespace dissect::kernels::detail {

namespace avx2 {

/// The first n of 8 lanes, as the mask operand of maskload/maskstore.
DISSECT_TARGET_AVX2 inline __m256i first_lanes(int n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
}

// ---- lane operations, for gemm_tile_body.hpp ----------------------------------------------------

inline constexpr int lanes = 8;
using Mask = __m256i;

DISSECT_TARGET_AVX2 inline Vec load_or_zero(Mask m, const float* p) {
  return _mm256_maskload_ps(p, m);
}
DISSECT_TARGET_AVX2 inline void store_lanes(float* p, Mask m, Vec v) {
  _mm256_maskstore_ps(p, m, v);
}
DISSECT_TARGET_AVX2 inline Vec load(const float* p) {
  return _mm256_loadu_ps(p);
}
DISSECT_TARGET_AVX2 inline Vec broadcast(const float* p) {
  return _mm256_broadcast_ss(p);
}

/// The prefetch policy (gemm_tile_body.hpp's prefetch_step): every height fetches the next
/// tile's panels into L1 as it goes; the AVX2 tiles are at most 6 rows, and their own panels are
/// left to the hardware prefetchers.
inline constexpr int self_prefetch_rows = 0;
inline constexpr index_t prefetch_steps = 0;  // unused: no height streams its own panels
inline constexpr int next_tile_hint_l2 = 0;
inline constexpr bool prefetch_packed_a = false;

}  // namespace avx2

}  // namespace dissect::kernels::detail

// tile<MR, NP> and finish_tile on __m256: a panel of 16 is two registers.
#define DISSECT_GEMM_ISA avx2
#define DISSECT_GEMM_TARGET DISSECT_TARGET_AVX2
#include "dissect/kernels/detail/gemm_tile_body.hpp"

namespace dissect::kernels::detail {

/// The AVX2 path as the driver sees it.
struct Avx2Gemm {
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

  /// As Avx512Gemm::finish, 8 columns at a time.
  DISSECT_TARGET_AVX2 static void finish(const float* tile, int rows, int n_out,
                                         const TileEpilogue& e, float* c, index_t ldc) {
    avx2::finish_tile(tile, rows, n_out, e, c, ldc);
  }
};

}  // namespace dissect::kernels::detail

#endif  // DISSECT_X86
