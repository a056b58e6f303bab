// dissect/kernels/detail/gemm_driver.hpp — private: do not include directly (kernels/gemm.hpp
// does).
//
// The loops around the micro-kernels, shared by every code path: C = A·Bᵀ cut into column
// blocks (each thread owns a range of them), row blocks and depth blocks, with A packed into
// the micro-kernel's order per block and B either pre-packed (a PackedWeight: inference) or
// packed per block into a workspace (the training products). A path supplies only its tile
// kernel and its epilogue (the Isa template parameter below).
//
// Loop order jc → ic → pc → jr → ir: the A block (MC × KC) stays in L2 while every B
// micro-panel (KC × 16·NP) of the column block streams through L1 once per row block. With few
// rows (decode, M ≤ MC) each weight is therefore read exactly once per call, and depth partial
// sums live in C (or, for a gated weight whose output is half as wide as its panels, in an
// MC × NC scratch).
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/gemm_driver.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "dissect/core/shape.hpp"
#include "dissect/kernels/epilogue.hpp"
#include "dissect/kernels/packed_weight.hpp"

#if defined(__linux__)
#include <unistd.h>
#endif

namespace dissect::kernels::detail {

/// Columns of the tile buffer a micro-kernel hands to its epilogue: up to four panels.
inline constexpr int tile_columns = 4 * static_cast<int>(packed_panel_width);

/// Element (i, k) at data[i·row_stride + k·col_stride]: A [M, K] and, unpacked, B [N, K].
struct StridedMatrix {
  const float* data = nullptr;
  index_t row_stride = 0, col_stride = 0;
  float at(index_t i, index_t k) const { return data[i * row_stride + k * col_stride]; }
};

/// One product C [m, n] (=, or += when accumulate) A·Bᵀ, then the epilogue. B is `packed`
/// when set, otherwise `b`; n counts output columns (F for a gated weight).
struct GemmCall {
  index_t m = 0, n = 0, k = 0;
  StridedMatrix a;
  const PackedWeight* packed = nullptr;
  StridedMatrix b;
  float* c = nullptr;
  index_t ldc = 0;
  bool accumulate = false;
  Epilogue epilogue;
  bool gated() const { return packed && packed->is_gated(); }
  /// Panels of B: ⌈n/16⌉, doubled when gated.
  index_t panels() const {
    return packed ? packed->panels() : (n + packed_panel_width - 1) / packed_panel_width;
  }
  bool has_epilogue() const {
    return gated() || epilogue.bias || epilogue.activation || epilogue.residual;
  }
};

/// The epilogue of one finished tile: pointers at the tile's first row and output column.
struct TileEpilogue {
  const float* bias = nullptr;
  const float* up_bias = nullptr;
  const float* residual = nullptr;
  index_t residual_stride = 0;
  std::optional<Activation> activation;
  bool gated = false;
};

/// Block sizes in elements. KC: a B micro-panel (KC × 32 floats) fills two thirds of L1;
/// MC: the packed A block (MC × KC) a quarter of L2; NC: the column block, in panels.
struct Blocking {
  index_t kc = 256, mc = 384, nc_panels = 64;
};

/// Cache sizes as the C library reports them (0 when it does not), read once.
inline const Blocking& blocking() {
  static const Blocking sizes = [] {
    Blocking b;
#if defined(__linux__) && defined(_SC_LEVEL1_DCACHE_SIZE)
    const long l1 = sysconf(_SC_LEVEL1_DCACHE_SIZE), l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l1 >= 16 * 1024 && l1 <= 1024 * 1024) {
      // 2/3 of L1 for the B micro-panel (32 floats per k), a multiple of 32, within 128…512.
      b.kc = std::clamp<index_t>(l1 * 2 / 3 / (2 * packed_panel_width * 4) / 32 * 32, 128, 512);
    }
    if (l2 >= 128 * 1024 && l2 <= 64 * 1024 * 1024) {
      // A quarter of L2 for the A block, a multiple of 24 rows (both paths' tile heights).
      b.mc = std::clamp<index_t>(l2 / 4 / (b.kc * 4) / 24 * 24, 48, 960);
    }
#endif
    return b;
  }();
  return sizes;
}

/// Products with at most this many rows stream the weights without depth blocking; the tile
/// kernels prefetch within their panels at these heights.
inline constexpr index_t streaming_rows = 8;

/// The growable buffers of one thread: allocated on its first products, then reused, so a
/// steady stream of products allocates nothing (and does not depend on the allocator's state).
struct Workspace {
  std::vector<float> a, b, scratch;
  static float* ensure(std::vector<float>& buffer, index_t size) {
    if (static_cast<index_t>(buffer.size()) < size) buffer.resize(static_cast<std::size_t>(size));
    return buffer.data();
  }
};

inline Workspace& thread_workspace() {
  thread_local Workspace workspace;
  return workspace;
}

/// The smallest tile height in `heights` (ascending) that holds `rows`.
template <std::size_t N>
constexpr int tile_height(const int (&heights)[N], index_t rows) {
  for (int h : heights) {
    if (h >= rows) return h;
  }
  return heights[N - 1];
}

/// A rows [i0, i0 + rows) × depth [k0, k0 + kc) into `out` as tiles of `mr` rows, each k-major
/// ([kc][height]); a short last tile is padded with zero rows to its kernel's height.
template <class Isa>
void pack_a(const StridedMatrix& a, index_t i0, index_t rows, index_t k0, index_t kc, int np,
            float* out) {
  const int mr = Isa::max_rows(np);
  for (index_t t = 0; t < rows; t += mr) {
    const index_t valid = std::min<index_t>(mr, rows - t);
    const int height = Isa::kernel_rows(np, valid);
    if (a.col_stride == 1) {  // rows contiguous (x, dy): read row by row
      for (index_t i = 0; i < height; ++i) {
        const float* src = a.data + (i0 + t + i) * a.row_stride + k0;
        for (index_t k = 0; k < kc; ++k) out[k * height + i] = i < valid ? src[k] : 0.0f;
      }
    } else {  // columns contiguous (dyᵀ): one column segment per depth step
      for (index_t k = 0; k < kc; ++k) {
        float* dst = out + k * height;
        const float* src = a.data + (i0 + t) * a.row_stride + (k0 + k) * a.col_stride;
        index_t i = 0;
        for (; i < valid; ++i) dst[i] = src[i * a.row_stride];
        for (; i < height; ++i) dst[i] = 0.0f;
      }
    }
    out += kc * height;
  }
}

/// B rows (output features) of panels [p0, p0 + count) × depth [k0, k0 + kc) into `out` as
/// panels of 16 ([kc][16] each), zero beyond n.
inline void pack_b(const StridedMatrix& b, index_t n, index_t p0, index_t count, index_t k0,
                   index_t kc, float* out) {
  constexpr index_t w = packed_panel_width;
  for (index_t p = 0; p < count; ++p, out += kc * w) {
    const index_t j0 = (p0 + p) * w;
    const index_t valid = std::clamp<index_t>(n - j0, 0, w);
    if (valid < w) std::fill(out, out + kc * w, 0.0f);
    if (b.col_stride == 1) {  // rows of B contiguous (W in the forward product): row by row
      for (index_t j = 0; j < valid; ++j) {
        const float* src = b.data + (j0 + j) * b.row_stride + k0;
        for (index_t k = 0; k < kc; ++k) out[k * w + j] = src[k];
      }
    } else if (b.row_stride == 1 && valid == w) {  // Wᵀ, xᵀ (backward): 16 contiguous at a time
      for (index_t k = 0; k < kc; ++k) {
        std::memcpy(out + k * w, b.data + j0 + (k0 + k) * b.col_stride, sizeof(float) * w);
      }
    } else {
      for (index_t k = 0; k < kc; ++k) {
        const float* src = b.data + j0 * b.row_stride + (k0 + k) * b.col_stride;
        for (index_t j = 0; j < valid; ++j) out[k * w + j] = src[j * b.row_stride];
      }
    }
  }
}

/// Runs `call` over B panels [panel_begin, panel_end) (multiples of the tile's panel count) on
/// the calling thread.
template <class Isa>
void run_gemm(const GemmCall& call, index_t panel_begin, index_t panel_end) {
  const Blocking& blocks = blocking();
  Workspace& ws = thread_workspace();
  const bool gated = call.gated();
  const int np_tile = gated ? 2 : Isa::plain_panels(call.m);
  const index_t nc = std::max<index_t>(blocks.nc_panels / np_tile * np_tile, np_tile);
  // K = 0 still runs one (empty) depth block, so the epilogue writes bias + residual.
  // Decode (a few rows): the depth is not blocked, so each tile streams its panels front to
  // back, prefetching ahead within them, instead of hopping K·64 bytes between panels every
  // KC steps; that reaches the DRAM rate (bench_gemm, M = 1).
  const index_t depth_block = call.m <= streaming_rows ? call.k : blocks.kc;
  const index_t kc_max = std::max<index_t>(1, std::min(depth_block, call.k));
  const index_t mc_max = std::min(blocks.mc / Isa::max_rows(np_tile) * Isa::max_rows(np_tile),
                                  call.m + Isa::max_rows(np_tile));
  float* a_pack = Workspace::ensure(ws.a, (mc_max + Isa::max_rows(np_tile)) * kc_max);
  float* b_pack = call.packed ? nullptr : Workspace::ensure(ws.b, nc * packed_panel_width * kc_max);
  const bool split_depth = call.k > kc_max;
  const index_t scratch_ld = nc * packed_panel_width;
  float* scratch =
      gated && split_depth ? Workspace::ensure(ws.scratch, mc_max * scratch_ld) : nullptr;
  alignas(64) float tile[12 * tile_columns];

  for (index_t jc = panel_begin; jc < panel_end; jc += nc) {
    const index_t jn = std::min(nc, panel_end - jc);
    for (index_t ic = 0; ic < call.m; ic += mc_max) {
      const index_t mc = std::min(mc_max, call.m - ic);
      for (index_t pc = 0; pc < std::max<index_t>(call.k, 1); pc += kc_max) {
        const index_t kc = std::min(kc_max, call.k - pc);
        const bool first = pc == 0, last = pc + kc == call.k;
        const float* b_block;
        index_t b_stride;
        if (call.packed) {
          b_block = call.packed->panel(jc) + pc * packed_panel_width;
          b_stride = call.packed->panel_stride();
        } else {
          Isa::pack_b(call.b, call.n, jc, jn, pc, kc, b_pack);
          b_block = b_pack;
          b_stride = kc * packed_panel_width;
        }
        pack_a<Isa>(call.a, ic, mc, pc, kc, np_tile, a_pack);

        for (index_t jr = 0; jr < jn; jr += np_tile) {
          const int np = static_cast<int>(std::min<index_t>(np_tile, jn - jr));
          const index_t col =
              gated ? (jc + jr) / 2 * packed_panel_width : (jc + jr) * packed_panel_width;
          const int n_out = static_cast<int>(std::min<index_t>(
              gated ? packed_panel_width : np * packed_panel_width, call.n - col));
          const float* b_tile = b_block + jr * b_stride;
          // The next micro-panel, fetched during this one's last row tile so that its first
          // row tile does not wait on memory (with one row tile, decode, on every tile).
          const float* b_next = jr + np_tile < jn ? b_tile + np_tile * b_stride : nullptr;
          const float* a_tile = a_pack;
          const int mr = Isa::max_rows(np_tile);
          for (index_t t = 0; t < mc; t += mr) {
            const index_t row = ic + t;
            const int valid = static_cast<int>(std::min<index_t>(mr, mc - t));
            const int height = Isa::kernel_rows(np_tile, valid);
            float* c_tile = call.c + row * call.ldc + col;
            // Where the depth partial sums live between blocks: C itself, or for a gated tile
            // (32 sums for 16 outputs) the scratch.
            float* partial = !gated    ? c_tile
                             : scratch ? scratch + t * scratch_ld + jr * packed_panel_width
                                       : nullptr;  // one depth block: no partial sums
            const index_t partial_ld = gated ? scratch_ld : call.ldc;
            const int partial_cols = gated ? 2 * static_cast<int>(packed_panel_width) : n_out;
            const bool load = !first || call.accumulate;
            const float* next = t == 0 ? b_next : nullptr;
            if (!last) {
              Isa::tile(height, np, kc, a_tile, b_tile, b_stride, load ? partial : nullptr,
                        partial_ld, partial, partial_ld, valid, partial_cols, next);
            } else if (!call.has_epilogue()) {
              Isa::tile(height, np, kc, a_tile, b_tile, b_stride, load ? c_tile : nullptr, call.ldc,
                        c_tile, call.ldc, valid, n_out, next);
            } else {
              Isa::tile(height, np, kc, a_tile, b_tile, b_stride, load ? partial : nullptr,
                        partial_ld, tile, tile_columns, valid, partial_cols, next);
              const Epilogue& e = call.epilogue;
              const TileEpilogue te{
                  e.bias ? e.bias + col : nullptr,
                  e.up_bias ? e.up_bias + col : nullptr,
                  e.residual ? e.residual + row * e.residual_stride + col : nullptr,
                  e.residual_stride,
                  e.activation,
                  gated};
              Isa::finish(tile, valid, n_out, te, c_tile, call.ldc);
            }
            a_tile += kc * height;
          }
        }
      }
    }
  }
}

}  // namespace dissect::kernels::detail
