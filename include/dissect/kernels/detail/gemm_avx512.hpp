// dissect/kernels/detail/gemm_avx512.hpp — private: do not include directly (kernels/gemm.hpp
// does).
//
// The AVX-512 path of the packed GEMM. A tile is up to 12 rows × 2 panels (32 columns): 24
// accumulators, two panel loads and one broadcast per depth step, which leaves 5 of the 32
// registers free and keeps both FMA ports busy (a 4-cycle FMA latency needs ≥ 8 independent
// chains). Tile heights come in 1, 2, 4, 6, 8 and 12 rows so that decode (1 row) and small
// batches (8) run without padding; other heights round up to the next.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/gemm_avx512.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/kernels/detail/gemm_driver.hpp"
#include "dissect/kernels/detail/simd_targets.hpp"
#include "dissect/kernels/detail/vector_math_avx512.hpp"

#include <algorithm>
#include <cstdint>

#if DISSECT_X86

// GCC PR 105593's warnings silenced for these kernels (simd_targets.hpp).
DISSECT_AVX512_WARNINGS_BEGIN

namespace dissect::kernels::detail {

namespace avx512 {

/// How far ahead (in depth steps of 64 bytes per panel) a streaming tile prefetches: 2 KB, past
/// the next page boundary for part of each step, which the hardware prefetchers do not cross.
inline constexpr index_t prefetch_steps = 32;

DISSECT_TARGET_AVX512 inline __mmask16 first_lanes(int n) {
  return n <= 0 ? __mmask16(0) : n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}

// ---- lane operations, for gemm_tile_body.hpp ----------------------------------------------------

inline constexpr int lanes = 16;
using Mask = __mmask16;

DISSECT_TARGET_AVX512 inline Vec load_or_zero(Mask m, const float* p) {
  return _mm512_maskz_loadu_ps(m, p);
}
DISSECT_TARGET_AVX512 inline void store_lanes(float* p, Mask m, Vec v) {
  _mm512_mask_storeu_ps(p, m, v);
}
DISSECT_TARGET_AVX512 inline Vec load(const float* p) {
  return _mm512_loadu_ps(p);
}
DISSECT_TARGET_AVX512 inline Vec broadcast(const float* p) {
  return _mm512_set1_ps(*p);
}

/// The prefetch policy (gemm_tile_body.hpp's prefetch_step): streaming heights (≤
/// streaming_rows, whose panels come from DRAM once) prefetch their own panels prefetch_steps
/// ahead; taller tiles, whose panels come from L1 after the first row tile, fetch the next
/// tile's panels into L2 instead; the packed A tile is prefetched 16 steps ahead.
inline constexpr int self_prefetch_rows = static_cast<int>(streaming_rows);
inline constexpr int next_tile_hint_l2 = 1;
inline constexpr bool prefetch_packed_a = true;

}  // namespace avx512

}  // namespace dissect::kernels::detail

// tile<MR, NP> and finish_tile on __m512.
#define DISSECT_GEMM_ISA avx512
#define DISSECT_GEMM_TARGET DISSECT_TARGET_AVX512
#include "dissect/kernels/detail/gemm_tile_body.hpp"

namespace dissect::kernels::detail {

/// B rows of panels [p0, p0 + count) × depth [k0, k0 + kc) into panels of 16, as pack_b, for a
/// B whose rows are contiguous (W in the forward product): 16 rows × 16 depth steps are
/// transposed in registers (8 + 8 + 8 + 8 shuffles), so repacking W per call costs a fraction
/// of the product even at few rows.
DISSECT_TARGET_AVX512 inline void pack_rows_avx512(const StridedMatrix& b, index_t n, index_t p0,
                                                   index_t count, index_t k0, index_t kc,
                                                   float* out) {
  constexpr index_t w = packed_panel_width;
  for (index_t p = 0; p < count; ++p, out += kc * w) {
    const index_t j0 = (p0 + p) * w;
    const int rows = static_cast<int>(std::clamp<index_t>(n - j0, 0, w));
    for (index_t k = 0; k < kc; k += 16) {
      const __mmask16 depth = avx512::first_lanes(static_cast<int>(kc - k));
      __m512 a[16], t[16];
#pragma GCC unroll 16
      for (int r = 0; r < 16; ++r) {
        a[r] = r < rows ? _mm512_maskz_loadu_ps(depth, b.data + (j0 + r) * b.row_stride + k0 + k)
                        : _mm512_setzero_ps();
      }
      // Pairs of rows interleaved by 32 bits, then by 64: t[4g + e] holds, in each 128-bit
      // lane L, rows 4g … 4g + 3 at depth 4L + e.
#pragma GCC unroll 8
      for (int r = 0; r < 16; r += 2) {
        t[r] = _mm512_unpacklo_ps(a[r], a[r + 1]);
        t[r + 1] = _mm512_unpackhi_ps(a[r], a[r + 1]);
      }
#pragma GCC unroll 4
      for (int g = 0; g < 16; g += 4) {
        const __m512d lo0 = _mm512_castps_pd(t[g]), hi0 = _mm512_castps_pd(t[g + 1]);
        const __m512d lo1 = _mm512_castps_pd(t[g + 2]), hi1 = _mm512_castps_pd(t[g + 3]);
        a[g] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo0, lo1));
        a[g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo0, lo1));
        a[g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi0, hi1));
        a[g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi0, hi1));
      }
      // A 4 × 4 transpose of 128-bit lanes across the four groups gives depth 4L + e.
#pragma GCC unroll 4
      for (int e = 0; e < 4; ++e) {
        const __m512 d0 = _mm512_shuffle_f32x4(a[e], a[4 + e], 0x44);
        const __m512 d1 = _mm512_shuffle_f32x4(a[e], a[4 + e], 0xEE);
        const __m512 d2 = _mm512_shuffle_f32x4(a[8 + e], a[12 + e], 0x44);
        const __m512 d3 = _mm512_shuffle_f32x4(a[8 + e], a[12 + e], 0xEE);
        const __m512 column[4] = {
            _mm512_shuffle_f32x4(d0, d2, 0x88), _mm512_shuffle_f32x4(d0, d2, 0xDD),
            _mm512_shuffle_f32x4(d1, d3, 0x88), _mm512_shuffle_f32x4(d1, d3, 0xDD)};
#pragma GCC unroll 4
        for (int lane = 0; lane < 4; ++lane) {
          const index_t step = k + 4 * lane + e;
          if (step < kc) _mm512_storeu_ps(out + step * w, column[lane]);
        }
      }
    }
  }
}

/// The AVX-512 path as the driver sees it.
struct Avx512Gemm {
  /// Panels per plain tile: 2, or 4 for a single row (decode), whose tile is 1 × 64: four
  /// independent streams through DRAM and four accumulator chains instead of two.
  static constexpr int plain_panels(index_t m) { return m == 1 ? 4 : 2; }
  static constexpr int heights[] = {1, 2, 4, 6, 8, 12};
  static constexpr int max_rows(int /*np*/) { return 12; }
  static constexpr int kernel_rows(int /*np*/, index_t rows) { return tile_height(heights, rows); }

  DISSECT_TARGET_AVX512 static void tile(int height, int np, index_t kc, const float* a,
                                         const float* b, index_t b_stride, const float* src,
                                         index_t lds, float* dst, index_t ldd, int rows, int cols,
                                         const float* next) {
#define DISSECT_AVX512_TILE(MR)                                                                \
  case MR:                                                                                     \
    return np == 2                                                                             \
               ? avx512::tile<MR, 2>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next) \
               : avx512::tile<MR, 1>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next);
    if (height == 1 && np > 2) {  // decode's wide tile: four panels, four DRAM streams
      return np == 4 ? avx512::tile<1, 4>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next)
                     : avx512::tile<1, 3>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols, next);
    }
    switch (height) {
      DISSECT_AVX512_TILE(1)
      DISSECT_AVX512_TILE(2)
      DISSECT_AVX512_TILE(4)
      DISSECT_AVX512_TILE(6)
      DISSECT_AVX512_TILE(8)
      default:
        DISSECT_AVX512_TILE(12)
    }
#undef DISSECT_AVX512_TILE
  }

  /// As pack_b, transposing in registers when B's rows are contiguous.
  static void pack_b(const StridedMatrix& b, index_t n, index_t p0, index_t count, index_t k0,
                     index_t kc, float* out) {
    if (b.col_stride == 1) return pack_rows_avx512(b, n, p0, count, k0, kc, out);
    detail::pack_b(b, n, p0, count, k0, kc, out);
  }

  /// c[0 … rows) × [0 … n_out) = epilogue(tile), the tile [rows][32] as the kernel left it.
  DISSECT_TARGET_AVX512 static void finish(const float* tile, int rows, int n_out,
                                           const TileEpilogue& e, float* c, index_t ldc) {
    avx512::finish_tile(tile, rows, n_out, e, c, ldc);
  }
};

}  // namespace dissect::kernels::detail

DISSECT_AVX512_WARNINGS_END

#endif  // DISSECT_X86
