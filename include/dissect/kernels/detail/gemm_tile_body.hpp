// dissect/kernels/detail/gemm_tile_body.hpp — private: the packed GEMM's micro-tile and its
// epilogue, written once for every instruction set. NO INCLUDE GUARD, BY DESIGN, like
// vector_math_body.hpp: gemm_avx2.hpp and gemm_avx512.hpp each include it once, and each
// inclusion stamps `tile<MR, NP>` and `finish_tile` out in that header's namespace.
//
// Before including it, the header defines there, beside vector_math_body.hpp's `Vec`, `zero`,
// `add`, `mul`, `fmadd` and `activate`:
//   lanes                        floats per register (8 or 16)
//   Mask, first_lanes(n)         the mask of the first n lanes (all for n ≥ lanes, none for ≤ 0)
//   load_or_zero(mask, p)        the masked lanes of p, 0 elsewhere (never reads past the mask)
//   store_lanes(p, mask, v)      the masked lanes of v into p
//   load(p), broadcast(p)        lanes floats from p; *p in every lane
//   self_prefetch_rows, prefetch_steps, next_tile_hint_l2, prefetch_packed_a   its prefetch policy
// and two macros: DISSECT_GEMM_ISA (the namespace) and DISSECT_GEMM_TARGET (its target
// attribute). Every function keeps the target attribute: GCC 12 does not inline intrinsics into
// a function without it, so a template over the ISA would not do (vector_math_body.hpp).
//
// What stays per ISA, in its own header, is what is tuned per ISA: the tile heights and panel
// counts (the register file: 16 ymm against 32 zmm), the prefetch policy, and the AVX-512 path's
// in-register transposing pack of B.

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/gemm_tile_body.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif
#if !defined(DISSECT_GEMM_ISA) || !defined(DISSECT_GEMM_TARGET)
#error \
    "dissect/kernels/detail/gemm_tile_body.hpp is included only by gemm_avx2.hpp and gemm_avx512.hpp, which define DISSECT_GEMM_ISA and DISSECT_GEMM_TARGET first"
#endif

namespace dissect::kernels::detail::DISSECT_GEMM_ISA {

/// Asks for the cache line at byte offset `ahead` from p (into L2 if hint_l2, else L1).
/// Integer arithmetic: the address may lie past the end of the panel (a prefetch never faults,
/// but such a pointer would be UB).
DISSECT_GEMM_TARGET inline void prefetch(const float* p, index_t ahead, int hint_l2) {
  const auto address = reinterpret_cast<std::uintptr_t>(p) + static_cast<std::uintptr_t>(ahead);
  if (hint_l2) {
    _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T1);
  } else {
    _mm_prefetch(reinterpret_cast<const char*>(address), _MM_HINT_T0);
  }
}

/// The prefetches of depth step k: tiles of at most self_prefetch_rows rows stream their own
/// panels (prefetch_steps ahead); taller ones fetch the next tile's panels (`next`, if any);
/// prefetch_packed_a adds the packed A tile 16 steps ahead. Written in the tile, not as a call:
/// GCC drops an out-of-line call it deems free of side effects, and a prefetch is one.
/// dst[0 … rows) × [0 … cols) = (src or 0) + A·Bᵀ over kc steps, for a tile of MR rows (the
/// packed A tile is [kc][MR]) and NP panels of 16 (b, b + b_stride, …): MR × NP·16/lanes
/// accumulator registers, one broadcast of A and NP·16/lanes loads of B per depth step. `next`
/// is the next tile's first panel, for prefetch_step (nullptr: none).
template <int MR, int NP>
DISSECT_GEMM_TARGET void tile(index_t kc, const float* a, const float* b, index_t b_stride,
                              const float* src, index_t lds, float* dst, index_t ldd, int rows,
                              int cols, const float* next) {
  constexpr int per_panel = static_cast<int>(packed_panel_width) / lanes;
  constexpr int V = NP * per_panel;  // registers per row
  Vec acc[MR][V];
  Mask mask[V];
  const float* panel[NP];
#pragma GCC unroll 4
  for (int v = 0; v < V; ++v) {
    mask[v] = first_lanes(cols - lanes * v);
    if (v % per_panel == 0) panel[v / per_panel] = b + (v / per_panel) * b_stride;
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      acc[i][v] = src && i < rows ? load_or_zero(mask[v], src + i * lds + lanes * v) : zero();
    }
  }
  for (index_t k = 0; k < kc; ++k) {
#pragma GCC unroll 4
    for (int j = 0; j < NP; ++j) {
      if constexpr (MR <= self_prefetch_rows) {
        prefetch(panel[j], (k + prefetch_steps) * 64, 0);
      } else if (next) {
        prefetch(next + j * b_stride, k * 64, next_tile_hint_l2);
      }
    }
    if constexpr (prefetch_packed_a) prefetch(a, (k + 16) * MR * 4, 0);
    Vec w[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) {
      w[v] = load(panel[v / per_panel] + k * packed_panel_width + lanes * (v % per_panel));
    }
#pragma GCC unroll 12
    for (int i = 0; i < MR; ++i) {
      const Vec x = broadcast(a + k * MR + i);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[i][v] = fmadd(x, w[v], acc[i][v]);
    }
  }
#pragma GCC unroll 12
  for (int i = 0; i < MR; ++i) {
    if (i >= rows) break;
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) store_lanes(dst + i * ldd + lanes * v, mask[v], acc[i][v]);
  }
}

/// c[0 … rows) × [0 … n_out) = epilogue(tile), the tile [rows][tile_columns] as `tile` left it
/// (a gated weight's up half 16 columns to the right of its gate half), lanes columns at a time.
DISSECT_GEMM_TARGET inline void finish_tile(const float* tile, int rows, int n_out,
                                            const TileEpilogue& e, float* c, index_t ldc) {
  for (int i = 0; i < rows; ++i) {
    const float* t = tile + i * tile_columns;
    const float* r = e.residual ? e.residual + i * e.residual_stride : nullptr;
    for (int j = 0; j < n_out; j += lanes) {
      const Mask m = first_lanes(n_out - j);
      Vec v = load_or_zero(m, t + j);
      if (e.bias) v = add(v, load_or_zero(m, e.bias + j));
      if (e.activation) v = activate(*e.activation, v);
      if (e.gated) {
        Vec up = load_or_zero(m, t + packed_panel_width + j);
        if (e.up_bias) up = add(up, load_or_zero(m, e.up_bias + j));
        v = mul(v, up);
      }
      if (r) v = add(v, load_or_zero(m, r + j));
      store_lanes(c + i * ldc + j, m, v);
    }
  }
}

}  // namespace dissect::kernels::detail::DISSECT_GEMM_ISA

#undef DISSECT_GEMM_ISA
#undef DISSECT_GEMM_TARGET
