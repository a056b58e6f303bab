// dissect/quant/detail/quant_tiles.hpp — PRIVATE: do not include directly (quant_kernels.hpp
// does).
//
// What every SIMD path shares: the weight views, the output, the scratch buffer activations are
// prepared into, and the loop that cuts y = x·Ŵᵀ into tiles of MR activation rows × NR weight
// rows and hands them to a path's micro-kernel.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/quant_tiles.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <algorithm>
#include <cstdint>
#include <vector>

#include "dissect/core/shape.hpp"
#include "dissect/core/thread_policy.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

#include "dissect/kernels/detail/simd_targets.hpp"

namespace dissect::quant::detail {

// ---- the weight layouts: W is [N = rows = out_features, K = cols = in_features] -------------

/// bf16: N·K bit patterns, row n at bits + n·K; each is the top half of a float. Any K ≥ 1.
struct Bf16WeightsView {
  const std::uint16_t* bits = nullptr;
  index_t rows = 0, cols = 0;
};

/// int8 per output channel: ŵ[n,k] = scales[n]·values[n,k], values in [−127, 127], row n at
/// values + n·K; row_sums[n] = Σ_k values[n,k] (the quantiser's, kept for offset tricks that
/// use one activation scale per row; the kernels here scale per block of 32 and do not read it).
struct Int8WeightsView {
  const std::int8_t* values = nullptr;
  const float* scales = nullptr;
  const std::int32_t* row_sums = nullptr;
  index_t rows = 0, cols = 0;
};

/// GGUF Q4_0, K % 32 == 0: row n's K/2 bytes at nibbles + n·K/2, block b its 16 bytes at b·16;
/// weight j < 16 of a block is the low nibble of byte j, weight j + 16 its high nibble.
/// ŵ = (q − 8)·d with d = scales[n·K/32 + b], an fp16 bit pattern.
struct Q4WeightsView {
  const std::uint8_t* nibbles = nullptr;
  const std::uint16_t* scales = nullptr;
  index_t rows = 0, cols = 0;
};

// ---- output
// --------------------------------------------------------------------------------------

struct Output {
  float* y;
  index_t ldy;
  const float* bias;  // nullable
};

/// What most tiles read: the weights, the rows of x (as the caller gave them, or as a path
/// prepared them: X is then their element type) and where y goes.
template <class View, class X = float>
struct TileArgs {
  View w;
  const X* x;
  index_t ldx;
  Output out;
};

/// Writes one finished (partial) sum: the first K chunk writes, later ones add, the last adds
/// the bias, so y is never read before this call has written it.
inline void put(const Output& out, index_t i, index_t n, float value, bool first, bool last) {
  float* target = out.y + i * out.ldy + n;
  if (!first) value += *target;
  if (last && out.bias) value += out.bias[n];
  *target = value;
}

/// A 64-byte-aligned scratch area of at least `bytes`, owned by the calling thread and reused
/// across calls, so preparing the activations allocates only when a call needs more than any
/// before it. Only the calling thread writes it; OpenMP workers of the same call read it.
inline unsigned char* scratch(std::size_t bytes) {
  thread_local std::vector<unsigned char> buffer;
  if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (64 - address % 64) % 64;
}

inline constexpr index_t round_up(index_t value, index_t step) {
  return (value + step - 1) / step * step;
}

// ---- the tiling loop
// -----------------------------------------------------------------------------

/// With more than 8 activation rows the weights are reused across row groups from L1, so K is
/// cut into chunks that keep an NR-row weight tile (≤ 16 KB even as fp32) and an MR-row
/// activation tile there. With 8 or fewer all rows ride on one pass over each weight and K is
/// not cut: every weight byte is read once per call, straight from DRAM. A multiple of every
/// path's K step (128 for q4_0 VNNI).
inline constexpr index_t k_chunk = 1024;

/// Weight rows per tile. m ≤ 4: 4 rows keep 4 independent DRAM streams and ≤ 16 accumulators;
/// 5 ≤ m ≤ 8: 2 rows × 8 activation rows = 16 accumulators, leaving 16 zmm for operands;
/// m > 8: 4 × 4 tiles, the squarest (loads per multiply-add lowest) that fits. A kernel whose
/// single-row tile has chains enough (Kernel::one_row_decode) takes one row at a time for m = 1
/// instead: W then streams from DRAM as one sequential run, which the hardware prefetcher
/// follows, where four rows are four short streams a row apart (bench_quant, m = 1: q4_0 on
/// VNNI 1.28×, bf16 on AVX512_BF16 1.23×; the int8 and bf16 avx512 tiles, one FMA chain per
/// row, ran at half their speed and keep four rows).
inline int weight_rows_per_tile(index_t m) {
  return m >= 5 && m <= 8 ? 2 : 4;
}

template <class Kernel>
constexpr bool one_row_decode() {
  if constexpr (requires { Kernel::one_row_decode; }) {
    return Kernel::one_row_decode;
  } else {
    return false;
  }
}

template <class Kernel, int NR, int MR = 1>
void run_tile(const typename Kernel::Args& args, int mr, index_t i0, index_t n0, index_t k0,
              index_t k1, bool first, bool last) {
  constexpr int max_mr = NR == 4 ? 4 : 8;
  if constexpr (MR < max_mr) {
    if (mr != MR) {
      run_tile<Kernel, NR, MR + 1>(args, mr, i0, n0, k0, k1, first, last);
      return;
    }
  }
  Kernel::template tile<MR, NR>(args, i0, n0, k0, k1, first, last);
}

/// y[0:m, 0:N] from Kernel::tile<MR, NR>(args, i0, n0, k0, k1, first, last), which must write
/// rows i0 … i0+MR−1, columns n0 … n0+NR−1 of y for the K range [k0, k1) through put().
/// Threads take contiguous runs of weight-row tiles (OpenMP static schedule), so each streams
/// its own part of W and no two write the same element of y; a thread for each
/// thread_policy::min_quantized_weights of W, at most `threads`.
template <class Kernel>
void drive(const typename Kernel::Args& args, index_t m, index_t N, index_t K, int threads) {
  if (m == 0 || N == 0) return;
  threads = thread_policy::threads_for(N * K, thread_policy::min_quantized_weights, threads);
  const int nr = m == 1 && one_row_decode<Kernel>() ? 1 : weight_rows_per_tile(m);
  const int mr_max = nr == 2 ? 8 : 4;
  const index_t kc = m <= 8 ? K : k_chunk;
  const index_t tiles = (N + nr - 1) / nr;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#else
  (void)threads;
#endif
  for (index_t t = 0; t < tiles; ++t) {
    const index_t n0 = t * nr;
    const index_t rows = std::min<index_t>(nr, N - n0);
    for (index_t k0 = 0; k0 < K; k0 += kc) {
      const index_t k1 = std::min(K, k0 + kc);
      const bool first = k0 == 0, last = k1 == K;
      for (index_t i0 = 0; i0 < m; i0 += mr_max) {
        const int mr = static_cast<int>(std::min<index_t>(mr_max, m - i0));
        if (rows == 4) {
          run_tile<Kernel, 4>(args, mr, i0, n0, k0, k1, first, last);
        } else if (rows == 2 && nr == 2) {
          run_tile<Kernel, 2>(args, mr, i0, n0, k0, k1, first, last);
        } else {
          for (index_t n = n0; n < n0 + rows; ++n) {
            run_tile<Kernel, 1>(args, mr, i0, n, k0, k1, first, last);
          }
        }
      }
    }
  }
}

/// The entry point of a path whose tiles read x as given: no preparation, straight to drive.
template <class Kernel, class View>
void drive_rows(const View& w, const float* x, index_t ldx, index_t m, const Output& out,
                int threads) {
  drive<Kernel>({w, x, ldx, out}, m, w.rows, w.cols, threads);
}

}  // namespace dissect::quant::detail
