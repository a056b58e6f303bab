// dissect/quant/detail/quant_gemm_vnni.hpp — PRIVATE: do not include directly (quant_kernels.hpp
// does).
//
// The avx512_vnni path's prefill GEMM for int8 and q4_0 weights (and, through
// ggml_gemm_vnni.hpp, ggml's q8_0, q4_K, q5_K and q6_K blocks): y = x·Ŵᵀ for many activation
// rows, at the integer rate. The GEMV tiles of quant_kernels_avx512.hpp read W in place and
// finish every output with a horizontal sum, one cvt + FMA per vpdpbusd: right for decode (W
// streams from DRAM once), far from VNNI's rate once m is large. Here:
//
//   - W is packed, per panel of 32 output columns and K chunk, into the layout vpdpbusd wants as
//     its vector operand: per 4 consecutive k, 32 columns × 4 signed bytes (q4_0 unpacked to
//     q − 8). One vpdpbusd then does 16 columns × 4 k of one activation row, the row's 4 bytes
//     broadcast. Packed per call into each thread's own buffer, BLIS-style, not cached with the
//     weights: no second copy of a model in memory, and the packing (a 16 × 16 dword transpose
//     per 1024 weights) is amortised over every activation row of the call (bench_quant).
//   - x is quantised once per call, per block of 32 (sx = max|x|/127, as the GEMV path; ggml's
//     formats use llama.cpp's activation rule instead, ggml_gemm_vnni.hpp), by all threads,
//     stored +128 (unsigned operand).
//   - the micro-kernel holds MR ≤ 6 rows × 32 columns of int32 block sums and fp32 totals in
//     registers; per block of 32 k, 8 vpdpbusd per row and column vector, then one cvt + FMA
//     with the block's scale (sx for int8, whose per-channel scale is applied once at the end;
//     sx·d for q4_0): 8 dot products per conversion instead of 1, and no horizontal sums. The
//     scaling is the weights' (VnniScale): per column, per block, per block with a min
//     subtracted (q4_K, q5_K: − (sx·Σx̃)·(dmin·m)), or per half block (q6_K's groups of 16).
//   - threads take (row block, panel) jobs: over panels while there are enough, over row blocks
//     too when N is narrow; every element's arithmetic is the same for any thread count.
//
// The bound is the GEMV path's (quant_kernels.hpp): the same quantised activations, integer dot
// products exact per block (|Σ| ≤ 32·255·127 < 2²⁰ in int32, and exact in fp32), and fewer fp32
// roundings per element than K + 8: per block one for cvt·scale (two for q4_0: sx·d first) and
// one addition, plus one per K chunk, the scale and the bias.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/quant_gemm_vnni.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <algorithm>
#include <cstring>

#include "dissect/core/thread_policy.hpp"
#include "dissect/numeric/half.hpp"
#include "dissect/quant/detail/quant_kernels_avx512.hpp"
#include "dissect/quant/detail/quant_tiles.hpp"

#if DISSECT_X86

DISSECT_AVX512_WARNINGS_BEGIN

namespace dissect::quant::detail {

/// From this many activation rows the avx512_vnni path runs the packed GEMM; below it the GEMV
/// tiles, which stream W once with no packing (decode). bench_quant's threshold/ rows (4096²,
/// W from DRAM, 1 thread): int8's GEMM wins from 8 rows on (1.45× there), q4_0's only from
/// about 24–32 — unpacking nibbles into the panel costs ~0.4 cycles a weight, which the
/// 4.5-bit GEMV never pays (at 8 rows the GEMM took 1.5× the GEMV's time, at 32 0.96×).
inline constexpr index_t vnni_gemm_min_rows_int8 = 8;
inline constexpr index_t vnni_gemm_min_rows_q4 = 32;

/// K per packed chunk: a 32-column panel of it is 16 KB, in L1 with the rows' activations.
inline constexpr index_t vnni_gemm_kc = 512;

/// Columns per panel, rows per micro-tile.
inline constexpr index_t vnni_gemm_nr = 32;
inline constexpr int vnni_gemm_mr = 6;

/// How a weight's exact int32 dot products become floats:
///   column      per output column, once at the end (int8's per-channel scale)
///   block       per block of 32 k and column: d (q4_0, q8_0)
///   block_min   per block of 32: d, and the block's min subtracted as (sx·Σx̃)·mins (q4_K, q5_K)
///   half_block  per group of 16 k: d (q6_K, whose scales are per 16)
enum class VnniScale { column, block, block_min, half_block };

/// A view's scaling: View::vnni_scale, except for dissect's own int8 and q4_0 views.
template <class View>
inline constexpr VnniScale vnni_scale_of = View::vnni_scale;
template <>
inline constexpr VnniScale vnni_scale_of<Int8WeightsView> = VnniScale::column;
template <>
inline constexpr VnniScale vnni_scale_of<Q4WeightsView> = VnniScale::block;

/// k per scaling group.
template <VnniScale S>
inline constexpr index_t vnni_group = S == VnniScale::half_block ? 16 : 32;

/// One packed chunk of a panel: kc/4 steps of 2 × 64 bytes (columns 0–15, 16–31), and per group
/// of k (vnni_group), 32 int32 −128·Σw (cancelling the activations' +128), 32 scales d (all but
/// column scaling) and 32 mins (block_min).
struct VnniPanel {
  const std::int8_t* w;
  const std::int32_t* corr;
  const float* d;
  const float* mins;
};

/// Bytes of one thread's packed chunk: the weights, then corr, d and mins for up to kc/16 groups.
inline constexpr std::size_t vnni_panel_bytes =
    static_cast<std::size_t>(vnni_gemm_kc * vnni_gemm_nr) +
    3 * static_cast<std::size_t>(vnni_gemm_kc / 16 * vnni_gemm_nr) * 4;

/// A second per-thread buffer: the panel, packed by each OpenMP worker while the calling
/// thread's scratch() holds the quantised activations all workers read.
inline unsigned char* panel_scratch(std::size_t bytes) {
  thread_local std::vector<unsigned char> buffer;
  if (buffer.size() < bytes + 64) buffer.resize(bytes + 64);
  const auto address = reinterpret_cast<std::uintptr_t>(buffer.data());
  return buffer.data() + (64 - address % 64) % 64;
}

/// Rows r[0..15] of 16 dwords → t[j] = dword j of every row, in row order. Plain AVX-512, so
/// that the bf16 GEMM's packing (quant_gemm_bf16.hpp) inlines it too.
DISSECT_TARGET_AVX512 inline void transpose16x16(__m512i (&r)[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {
    b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
    b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
    b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
  }
  // b[4g + c], 128-bit lane L: rows 4g … 4g+3, dword 4L + c. A 4 × 4 transpose of lanes.
  for (int c = 0; c < 4; ++c) {
    const __m512i e0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44);
    const __m512i e1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xee);
    const __m512i e2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
    const __m512i e3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xee);
    r[c] = _mm512_shuffle_i32x4(e0, e2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(e0, e2, 0xdd);
    r[8 + c] = _mm512_shuffle_i32x4(e1, e3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(e1, e3, 0xdd);
  }
}

/// 64 signed weights of row n from k (zero past K and for n ≥ N).
DISSECT_TARGET_VNNI inline __m512i load64(const Int8WeightsView& w, index_t n, index_t k) {
  if (n >= w.rows) return _mm512_setzero_si512();
  return _mm512_maskz_loadu_epi8(lanes64(w.cols - k), w.values + n * w.cols + k);
}

/// 64 weights q − 8 of row n from k (k a multiple of 64: two blocks; the second zero past K).
DISSECT_TARGET_VNNI inline __m512i load64(const Q4WeightsView& w, index_t n, index_t k) {
  if (n >= w.rows) return _mm512_setzero_si512();
  const index_t left = w.cols - k;
  const __m256i v =
      _mm256_maskz_loadu_epi8(lanes32(left / 2), w.nibbles + n * (w.cols / 2) + k / 2);
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i lo = _mm256_and_si256(v, low4);
  const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  // (lo of block 0, lo of block 1, hi of 0, hi of 1) → each block's 16 low then 16 high.
  const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
  const __m512i ordered = _mm512_shuffle_i64x2(z, z, 0xd8);
  return _mm512_maskz_sub_epi8(lanes64(left), ordered, _mm512_set1_epi8(8));
}

/// The scales of columns n0 … n0+31 over [k0, k0 + kcp): int8's are per column (none here);
/// q4_0's d per block of 32 (0 past K and for n ≥ N).
inline void pack_scales(const Int8WeightsView&, index_t, index_t, index_t, float*, float*) {}
inline void pack_scales(const Q4WeightsView& w, index_t n0, index_t k0, index_t kcp, float* d,
                        float*) {
  for (index_t b = k0 / 32; b < (k0 + kcp) / 32; ++b) {
    for (index_t c = 0; c < 32; ++c) {
      const index_t n = n0 + c;
      d[(b - k0 / 32) * 32 + c] =
          n < w.rows && b * 32 < w.cols ? fp16_to_float(w.scales[n * (w.cols / 32) + b]) : 0.0f;
    }
  }
}

/// Packs columns n0 … n0+31, k in [k0, k0 + kcp) (kcp a multiple of 64) into a VnniPanel's
/// arrays: pw (the weights), corr per group, and the scales (pack_scales).
template <class View>
DISSECT_TARGET_VNNI void pack_panel(const View& w, index_t n0, index_t k0, index_t kcp,
                                    std::int8_t* pw, std::int32_t* corr, float* d, float* mins) {
  constexpr index_t group = vnni_group<vnni_scale_of<View>>;
  constexpr int groups = static_cast<int>(64 / group), steps = static_cast<int>(group / 4);
  const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
  for (index_t k = k0; k < k0 + kcp; k += 64) {
    const index_t step0 = (k - k0) / 4;  // packed k-steps before this slab
    for (int half = 0; half < 2; ++half) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) r[i] = load64(w, n0 + 16 * half + i, k);
      transpose16x16(r);
      __m512i sum[groups];
      for (int s = 0; s < groups; ++s) sum[s] = _mm512_setzero_si512();
      for (int j = 0; j < 16; ++j) {
        _mm512_store_si512(pw + (step0 + j) * 128 + 64 * half, r[j]);
        sum[j / steps] = _mm512_dpbusd_epi32(sum[j / steps], c128, r[j]);
      }
      const index_t group0 = (k - k0) / group;
      for (int s = 0; s < groups; ++s) {
        _mm512_store_si512(corr + (group0 + s) * 32 + 16 * half,
                           _mm512_sub_epi32(_mm512_setzero_si512(), sum[s]));
      }
    }
  }
  pack_scales(w, n0, k0, kcp, d, mins);
}

/// What the micro-kernel reads besides the panel.
struct VnniRows {
  const unsigned char* q;  // x + 128 per block, rows of ldq
  index_t ldq;
  const float* sx;  // per row, per block of 32
  index_t ldsx;
  const float* xsum;  // block_min: sx·Σx̃ per row, per block of 32 (ldsx apart)
};

/// MR rows from i0 × the panel's 32 columns over `blocks` blocks from block b0 of x; the totals
/// go to acc (fp32, before any per-column scale).
template <int MR, VnniScale S>
DISSECT_TARGET_VNNI __attribute__((always_inline)) inline void vnni_micro(const VnniPanel& p,
                                                                          const VnniRows& x,
                                                                          index_t i0, index_t b0,
                                                                          index_t blocks,
                                                                          __m512 (&acc)[MR][2]) {
  constexpr int halves = S == VnniScale::half_block ? 2 : 1, steps = 8 / halves;
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const unsigned char* xq = x.q + i0 * x.ldq + b0 * 32;
  const float* xs = x.sx + i0 * x.ldsx + b0;
  for (index_t b = 0; b < blocks; ++b) {
#pragma GCC unroll 2
    for (int h = 0; h < halves; ++h) {
      const index_t g = b * halves + h;  // the scaling group in this chunk
      const __m512i c0 = _mm512_load_si512(p.corr + g * 32);
      const __m512i c1 = _mm512_load_si512(p.corr + g * 32 + 16);
      __m512i dot[MR][2];
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        dot[i][0] = c0;
        dot[i][1] = c1;
      }
      const std::int8_t* wp = p.w + (b * 8 + h * steps) * 128;
      const unsigned char* xb0 = xq + b * 32 + h * 4 * steps;
#pragma GCC unroll 8
      for (int s = 0; s < steps; ++s) {
        const __m512i w0 = _mm512_load_si512(wp + s * 128);
        const __m512i w1 = _mm512_load_si512(wp + s * 128 + 64);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          std::int32_t four;
          std::memcpy(&four, xb0 + i * x.ldq + 4 * s, 4);
          const __m512i xb = _mm512_set1_epi32(four);
          dot[i][0] = _mm512_dpbusd_epi32(dot[i][0], xb, w0);
          dot[i][1] = _mm512_dpbusd_epi32(dot[i][1], xb, w1);
        }
      }
      __m512 d0 = _mm512_setzero_ps(), d1 = d0, m0 = d0, m1 = d0;
      if constexpr (S != VnniScale::column) {
        d0 = _mm512_load_ps(p.d + g * 32);
        d1 = _mm512_load_ps(p.d + g * 32 + 16);
      }
      if constexpr (S == VnniScale::block_min) {
        m0 = _mm512_load_ps(p.mins + g * 32);
        m1 = _mm512_load_ps(p.mins + g * 32 + 16);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512 s = _mm512_set1_ps(xs[i * x.ldsx + b]);
        if constexpr (S == VnniScale::column) {
          acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][0]), s, acc[i][0]);
          acc[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][1]), s, acc[i][1]);
        } else {
          acc[i][0] =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][0]), _mm512_mul_ps(s, d0), acc[i][0]);
          acc[i][1] =
              _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][1]), _mm512_mul_ps(s, d1), acc[i][1]);
        }
        if constexpr (S == VnniScale::block_min) {
          const __m512 sum = _mm512_set1_ps(x.xsum[(i0 + i) * x.ldsx + b0 + b]);
          acc[i][0] = _mm512_fnmadd_ps(sum, m0, acc[i][0]);
          acc[i][1] = _mm512_fnmadd_ps(sum, m1, acc[i][1]);
        }
      }
    }
  }
}

/// Rows i0 … i0+MR−1, columns n0 … n0+31 (masked to N) of one K chunk: the first chunk writes y,
/// later ones add to it; the last applies the column scale (int8) and the bias.
template <int MR, VnniScale S>
DISSECT_TARGET_VNNI void vnni_tile(const VnniPanel& p, const VnniRows& x, const Output& out,
                                   const float* col_scale, index_t i0, index_t n0, index_t N,
                                   index_t b0, index_t blocks, bool first, bool last) {
  __m512 acc[MR][2];
  vnni_micro<MR, S>(p, x, i0, b0, blocks, acc);
  for (int h = 0; h < 2; ++h) {
    const index_t n = n0 + 16 * h;
    const __mmask16 mask = lanes16(N - n);
    if (!mask) continue;
    const __m512 scale = col_scale ? _mm512_maskz_loadu_ps(mask, col_scale + n) : __m512{};
    const __m512 bias = out.bias ? _mm512_maskz_loadu_ps(mask, out.bias + n) : __m512{};
    for (int i = 0; i < MR; ++i) {
      float* yp = out.y + (i0 + i) * out.ldy + n;
      __m512 v = acc[i][h];
      if (!first) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, yp));
      if (last) {
        if (col_scale) v = _mm512_mul_ps(v, scale);
        if (out.bias) v = _mm512_add_ps(v, bias);
      }
      _mm512_mask_storeu_ps(yp, mask, v);
    }
  }
}

template <VnniScale S, int MR = 1>
void run_vnni_tile(int mr, const VnniPanel& p, const VnniRows& x, const Output& out,
                   const float* col_scale, index_t i0, index_t n0, index_t N, index_t b0,
                   index_t blocks, bool first, bool last) {
  if constexpr (MR < vnni_gemm_mr) {
    if (mr != MR) {
      run_vnni_tile<S, MR + 1>(mr, p, x, out, col_scale, i0, n0, N, b0, blocks, first, last);
      return;
    }
  }
  vnni_tile<MR, S>(p, x, out, col_scale, i0, n0, N, b0, blocks, first, last);
}

/// Quantises rows [i0, i1) of x per block of 32, zero padded to ldq (a multiple of 64): x + 128
/// as bytes, sx per block.
DISSECT_TARGET_VNNI inline void quantize_rows_blocked(const float* x, index_t ldx, index_t i0,
                                                      index_t i1, index_t K, unsigned char* q,
                                                      index_t ldq, float* sx, index_t ldsx) {
  const __m128i bias128 = _mm_set1_epi8(static_cast<char>(0x80));
  for (index_t i = i0; i < i1; ++i) {
    for (index_t b = 0; b < ldq / 32; ++b) {
      __m128i lo, hi;
      sx[i * ldsx + b] = quantize_block(x + i * ldx + b * 32, K - b * 32, lo, hi);
      unsigned char* dst = q + i * ldq + b * 32;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_xor_si128(lo, bias128));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm_xor_si128(hi, bias128));
    }
  }
}

/// dissect's own activation rule for its int8 and q4_0 weights (ggml's formats bring theirs,
/// ggml_gemm_vnni.hpp): per block of 32, no block sums needed.
inline void quantize_rows(const Int8WeightsView&, const float* x, index_t ldx, index_t i0,
                          index_t i1, index_t K, unsigned char* q, index_t ldq, float* sx,
                          index_t ldsx, float*) {
  quantize_rows_blocked(x, ldx, i0, i1, K, q, ldq, sx, ldsx);
}
inline void quantize_rows(const Q4WeightsView&, const float* x, index_t ldx, index_t i0, index_t i1,
                          index_t K, unsigned char* q, index_t ldq, float* sx, index_t ldsx,
                          float*) {
  quantize_rows_blocked(x, ldx, i0, i1, K, q, ldq, sx, ldsx);
}

/// The GEMM for int8, q4_0 or a ggml view (the avx512_vnni path from vnni_gemm_min_rows_* rows
/// on; callable at any m ≥ 1, which the tests do).
template <class View>
void vnni_gemm(const View& w, const float* x, index_t ldx, index_t m, const Output& out,
               int threads) {
  constexpr VnniScale S = vnni_scale_of<View>;
  const index_t N = w.rows, K = w.cols;
  if (m == 0 || N == 0) return;
  const index_t ldq = round_up(K, 64), ldsx = ldq / 32;
  const index_t sums = S == VnniScale::block_min ? m * ldsx : 0;
  unsigned char* q = scratch(static_cast<std::size_t>(m * ldq + (m * ldsx + sums) * 4));
  auto* sx = reinterpret_cast<float*>(q + m * ldq);
  float* xsum = S == VnniScale::block_min ? sx + m * ldsx : nullptr;
  const index_t panels = (N + vnni_gemm_nr - 1) / vnni_gemm_nr;
  // Fork only when each thread gets ~2M multiply-adds (a fork costs a few µs).
  threads = thread_policy::threads_for(m * N * K, thread_policy::min_multiply_adds, threads);
  // Row blocks: whole m when there are panels enough to share; otherwise cut m so that every
  // thread gets work (each row block repacks its panels, so no finer than that).
  index_t row_blocks = 1;
  if (panels < 2 * threads) {
    row_blocks = std::min<index_t>((2 * threads + panels - 1) / panels, (m + 5) / 6);
  }
  const index_t mb = round_up((m + row_blocks - 1) / row_blocks, vnni_gemm_mr);
  row_blocks = (m + mb - 1) / mb;
  const index_t jobs = panels * row_blocks;
  const VnniRows rows{q, ldq, sx, ldsx, xsum};
  const float* col_scale = nullptr;
  if constexpr (S == VnniScale::column) col_scale = w.scales;
#ifdef _OPENMP
#pragma omp parallel num_threads(threads) if (threads > 1)
#endif
  {
#ifdef _OPENMP
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
#else
    const int t = 0, team = 1;
#endif
    const index_t per = (m + team - 1) / team;
    quantize_rows(w, x, ldx, std::min(m, t * per), std::min(m, (t + 1) * per), K, q, ldq, sx, ldsx,
                  xsum);
#ifdef _OPENMP
#pragma omp barrier
#endif
    unsigned char* buffer = panel_scratch(vnni_panel_bytes);
    constexpr index_t per_group = vnni_gemm_kc / 16 * vnni_gemm_nr;  // entries of corr, d, mins
    auto* pw = reinterpret_cast<std::int8_t*>(buffer);
    auto* corr = reinterpret_cast<std::int32_t*>(buffer + vnni_gemm_kc * vnni_gemm_nr);
    auto* d = reinterpret_cast<float*>(corr + per_group);
    float* mins = d + per_group;
    const VnniPanel panel{pw, corr, d, mins};
    // Contiguous runs of jobs, panel-major: a thread's row blocks of one panel are neighbours.
    const index_t from = jobs * t / team, to = jobs * (t + 1) / team;
    for (index_t job = from; job < to; ++job) {
      const index_t n0 = (job / row_blocks) * vnni_gemm_nr;
      const index_t r0 = (job % row_blocks) * mb, r1 = std::min(m, r0 + mb);
      for (index_t k0 = 0; k0 < ldq; k0 += vnni_gemm_kc) {
        const index_t kcp = std::min(vnni_gemm_kc, ldq - k0);
        pack_panel(w, n0, k0, kcp, pw, corr, d, mins);
        const bool first = k0 == 0, last = k0 + kcp == ldq;
        for (index_t i0 = r0; i0 < r1; i0 += vnni_gemm_mr) {
          const int mr = static_cast<int>(std::min<index_t>(vnni_gemm_mr, r1 - i0));
          run_vnni_tile<S>(mr, panel, rows, out, col_scale, i0, n0, N, k0 / 32, kcp / 32, first,
                           last);
        }
      }
    }
  }
}

/// The avx512_vnni path's kernels: the GEMV tiles for a few rows, the GEMM from
/// vnni_gemm_min_rows_int8 / _q4 on.
inline void int8_vnni_path(const Int8WeightsView& w, const float* x, index_t ldx, index_t m,
                           const Output& out, int threads) {
  if (m >= vnni_gemm_min_rows_int8) {
    vnni_gemm(w, x, ldx, m, out, threads);
  } else {
    int8_vnni(w, x, ldx, m, out, threads);
  }
}

inline void q4_vnni_path(const Q4WeightsView& w, const float* x, index_t ldx, index_t m,
                         const Output& out, int threads) {
  if (m >= vnni_gemm_min_rows_q4) {
    vnni_gemm(w, x, ldx, m, out, threads);
  } else {
    q4_vnni(w, x, ldx, m, out, threads);
  }
}

}  // namespace dissect::quant::detail

DISSECT_AVX512_WARNINGS_END

#endif  // DISSECT_X86
