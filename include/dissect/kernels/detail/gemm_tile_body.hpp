// dissect/kernels/detail/gemm_tile_body.hpp — private: the micro-kernel tile and the epilogue of
// the packed GEMM, written once for every instruction set, included once per set (gemm_avx2.hpp,
// gemm_avx512.hpp). No #pragma once, on purpose.
//
// The includer defines DISSECT_SIMD_NAMESPACE and DISSECT_SIMD_TARGET as for
// vector_math_body.hpp (and this file undefines them too), after including that set's vector math,
// and declares in the namespace, besides the lane operations (simd_avx2.hpp / simd_avx512.hpp), the
// set's prefetch policy, where the two paths differ:
//   prefetch_step<MR, NP>(panel, next, b_stride, a, k): at the top of depth step k, given the NP
//   panel starts and the next tile's first panel.
// A panel of 16 columns is 16 / lanes registers: one zmm, or two ymm. The structs the driver sees
// (Avx2Gemm, Avx512Gemm: heights, packing, the dispatch to tile<MR, NP>) stay with each set; they
// inherit the epilogue from TileEpilogues here.

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/gemm_tile_body.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif
#if !defined(DISSECT_SIMD_NAMESPACE) || !defined(DISSECT_SIMD_TARGET)
#error "gemm_tile_body.hpp: define DISSECT_SIMD_NAMESPACE and DISSECT_SIMD_TARGET first"
#endif

namespace dissect::kernels::detail::DISSECT_SIMD_NAMESPACE {

/// dst[0 … rows) × [0 … cols) = (src or 0) + A·Bᵀ over kc steps, for a tile of MR rows (the
/// packed A tile is [kc][MR]) and NP panels (b, b + b_stride, …). `next` is the next tile's
/// first panel, for the prefetch policy.
template <int MR, int NP>
DISSECT_SIMD_TARGET void tile(index_t kc, const float* a, const float* b, index_t b_stride,
                              const float* src, index_t lds, float* dst, index_t ldd, int rows,
                              int cols, const float* next) {
  constexpr int per_panel = 16 / lanes;
  constexpr int V = NP * per_panel;  // registers per row
  vec acc[MR][V];
  mask lanes_of[V];
  const float* panel[NP];
  // Masks and panel starts in one loop: written as two, GCC 12 schedules the AVX-512 tiles
  // differently (and no better).
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    lanes_of[v] = first_lanes(cols - lanes * v);
    if (v % per_panel == 0) panel[v / per_panel] = b + (v / per_panel) * b_stride;
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      acc[i][v] = src && i < rows ? masked_load(src + i * lds + lanes * v, lanes_of[v]) : setzero();
    }
  }
  for (index_t k = 0; k < kc; ++k) {
    prefetch_step<MR, NP>(panel, next, b_stride, a, k);
    vec w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      w[v] = load(panel[v / per_panel] + k * 16 + lanes * (v % per_panel));
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const vec x = broadcast(a + k * MR + i);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = fmadd(x, w[v], acc[i][v]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    if (i >= rows) break;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) masked_store(dst + i * ldd + lanes * v, lanes_of[v], acc[i][v]);
  }
}

/// The part of the path's struct for the driver (Avx2Gemm, Avx512Gemm) that is written once: the
/// epilogue, a register at a time.
struct TileEpilogues {
  /// c[0 … rows) × [0 … n_out) = epilogue(tile), the tile [rows][tile_columns] as the kernel
  /// left it (for a gated weight the gate half first and the up half 16 columns on).
  DISSECT_SIMD_TARGET static void finish(const float* tile, int rows, int n_out,
                                         const TileEpilogue& e, float* c, index_t ldc) {
    for (int i = 0; i < rows; ++i) {
      const float* t = tile + i * tile_columns;
      const float* r = e.residual ? e.residual + i * e.residual_stride : nullptr;
      for (int j = 0; j < n_out; j += lanes) {
        const mask m = first_lanes(n_out - j);
        vec v = masked_load(t + j, m);
        if (e.bias) v = add(v, masked_load(e.bias + j, m));
        if (e.activation) v = activate(*e.activation, v);
        if (e.gated) {
          vec up = masked_load(t + 16 + j, m);
          if (e.up_bias) up = add(up, masked_load(e.up_bias + j, m));
          v = mul(v, up);
        }
        if (r) v = add(v, masked_load(r + j, m));
        masked_store(c + i * ldc + j, m, v);
      }
    }
  }
};

}  // namespace dissect::kernels::detail::DISSECT_SIMD_NAMESPACE

#undef DISSECT_SIMD_TARGET
#undef DISSECT_SIMD_NAMESPACE
