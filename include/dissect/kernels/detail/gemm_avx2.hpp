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

/// As avx512::tile: MR rows × NP panels (2·NP registers per row).
template <int MR, int NP>
DISSECT_TARGET_AVX2 void tile(index_t kc, const float* a, const float* b, index_t b_stride,
                              const float* src, index_t lds, float* dst, index_t ldd, int rows,
                              int cols, const float* next) {
  constexpr int V = 2 * NP;  // 8-wide registers per row
  __m256 acc[MR][V];
  __m256i mask[V];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) mask[v] = first_lanes(cols - 8 * v);
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      acc[i][v] = src && i < rows ? _mm256_maskload_ps(src + i * lds + 8 * v, mask[v])
                                  : _mm256_setzero_ps();
    }
  }
  for (index_t k = 0; k < kc; ++k) {
    if (next) {
#pragma GCC unroll 2
      for (int p = 0; p < NP; ++p) {
        _mm_prefetch(reinterpret_cast<const char*>(next + p * b_stride + k * 16), _MM_HINT_T0);
      }
    }
    __m256 w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      w[v] = _mm256_loadu_ps(b + (v / 2) * b_stride + k * 16 + 8 * (v % 2));
#pragma GCC unroll 6
    for (int i = 0; i < MR; ++i) {
      const __m256 x = _mm256_broadcast_ss(a + k * MR + i);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = _mm256_fmadd_ps(x, w[v], acc[i][v]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < MR; ++i) {
    if (i >= rows) break;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) _mm256_maskstore_ps(dst + i * ldd + 8 * v, mask[v], acc[i][v]);
  }
}

}  // namespace avx2

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
    for (int i = 0; i < rows; ++i) {
      const float* t = tile + i * tile_columns;
      const float* r = e.residual ? e.residual + i * e.residual_stride : nullptr;
      for (int j = 0; j < n_out; j += 8) {
        const __m256i m = avx2::first_lanes(n_out - j);
        __m256 v = _mm256_maskload_ps(t + j, m);
        if (e.bias) v = _mm256_add_ps(v, _mm256_maskload_ps(e.bias + j, m));
        if (e.activation) v = avx2::activate(*e.activation, v);
        if (e.gated) {
          __m256 up = _mm256_maskload_ps(t + 16 + j, m);
          if (e.up_bias) up = _mm256_add_ps(up, _mm256_maskload_ps(e.up_bias + j, m));
          v = _mm256_mul_ps(v, up);
        }
        if (r) v = _mm256_add_ps(v, _mm256_maskload_ps(r + j, m));
        _mm256_maskstore_ps(c + i * ldc + j, m, v);
      }
    }
  }
};

}  // namespace dissect::kernels::detail

#endif  // DISSECT_X86
