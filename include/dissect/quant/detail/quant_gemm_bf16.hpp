// dissect/quant/detail/quant_gemm_bf16.hpp — PRIVATE: do not include directly (quant_kernels.hpp
// does).
//
// The avx512_bf16 path's prefill GEMM: y = x·Ŵᵀ for bf16 weights and many activation rows at
// vdpbf16ps's rate. The GEMV tiles (Bf16Dot) finish every output with a horizontal sum and keep
// only MR × NR ≤ 16 dot products in flight; here, as in quant_gemm_vnni.hpp:
//
//   - W is packed per panel of 32 output columns into vdpbf16ps's vector operand: per pair of k,
//     32 columns × 2 bf16 (a 16 × 16 dword transpose of 16 rows × 32 k). Per call, per thread,
//     amortised over the call's rows. A panel holds all of K (≤ 32·K·2 bytes, from L2) so that
//     every output is one chain of vdpbf16ps: no partial sums through y, no extra roundings.
//   - x is rounded to bf16 once per call (round_rows_bf16), by all threads.
//   - MR ≤ 6 rows × 32 columns of fp32 accumulators; each step broadcasts one row's pair of
//     activations against two packed vectors.
//
// The bound is the avx512_bf16 GEMV's (quant_kernels.hpp): the same activations rounded to
// bf16, exact bf16 products, and per element K/2 vdpbf16ps steps (at most two roundings each)
// and the bias: fewer than K + 8 roundings.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/quant_gemm_bf16.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <algorithm>
#include <cstring>

#include "dissect/core/thread_policy.hpp"
#include "dissect/quant/detail/quant_gemm_vnni.hpp"
#include "dissect/quant/detail/quant_kernels_avx512.hpp"
#include "dissect/quant/detail/quant_tiles.hpp"

#if DISSECT_X86

DISSECT_AVX512_WARNINGS_BEGIN

namespace dissect::quant::detail {

/// From this many rows the avx512_bf16 path runs the packed GEMM, below it the GEMV tiles.
inline constexpr index_t bf16_gemm_min_rows = 8;

/// Packs columns n0 … n0+31 over all of K (padded with zeros to kp, a multiple of 32): per pair
/// of k, 2 × 64 bytes (columns 0–15, 16–31).
DISSECT_TARGET_BF16 inline void pack_panel_bf16(const Bf16WeightsView& w, index_t n0, index_t kp,
                                                std::uint16_t* pw) {
  for (index_t k = 0; k < kp; k += 32) {
    for (int half = 0; half < 2; ++half) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const index_t n = n0 + 16 * half + i;
        r[i] = n < w.rows ? _mm512_maskz_loadu_epi16(lanes32(w.cols - k), w.bits + n * w.cols + k)
                          : _mm512_setzero_si512();
      }
      transpose16x16(r);
      for (int j = 0; j < 16; ++j) {
        _mm512_store_si512(pw + (k / 2 + j) * 64 + 32 * half, r[j]);
      }
    }
  }
}

/// MR rows from i0 × the panel's 32 columns over `pairs` pairs of k; writes y (+ bias).
template <int MR>
DISSECT_TARGET_BF16 void bf16_gemm_tile(const std::uint16_t* pw, const std::uint16_t* xb,
                                        index_t ldxb, const Output& out, index_t i0, index_t n0,
                                        index_t N, index_t pairs) {
  __m512 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  const std::uint16_t* xr = xb + i0 * ldxb;
  for (index_t s = 0; s < pairs; ++s) {
    const __m512i w0 = _mm512_load_si512(pw + s * 64);
    const __m512i w1 = _mm512_load_si512(pw + s * 64 + 32);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      std::int32_t pair;
      std::memcpy(&pair, xr + i * ldxb + 2 * s, 4);
      const __m512bh xv = reinterpret_cast<__m512bh>(_mm512_set1_epi32(pair));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], xv, reinterpret_cast<__m512bh>(w0));
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], xv, reinterpret_cast<__m512bh>(w1));
    }
  }
  for (int h = 0; h < 2; ++h) {
    const index_t n = n0 + 16 * h;
    const __mmask16 mask = lanes16(N - n);
    if (!mask) continue;
    const __m512 bias = out.bias ? _mm512_maskz_loadu_ps(mask, out.bias + n) : __m512{};
    for (int i = 0; i < MR; ++i) {
      __m512 v = acc[i][h];
      if (out.bias) v = _mm512_add_ps(v, bias);
      _mm512_mask_storeu_ps(out.y + (i0 + i) * out.ldy + n, mask, v);
    }
  }
}

template <int MR = 1>
void run_bf16_gemm_tile(int mr, const std::uint16_t* pw, const std::uint16_t* xb, index_t ldxb,
                        const Output& out, index_t i0, index_t n0, index_t N, index_t pairs) {
  if constexpr (MR < vnni_gemm_mr) {
    if (mr != MR) {
      run_bf16_gemm_tile<MR + 1>(mr, pw, xb, ldxb, out, i0, n0, N, pairs);
      return;
    }
  }
  bf16_gemm_tile<MR>(pw, xb, ldxb, out, i0, n0, N, pairs);
}

/// The GEMM (the avx512_bf16 path from bf16_gemm_min_rows rows on; callable at any m ≥ 1).
inline void bf16_gemm(const Bf16WeightsView& w, const float* x, index_t ldx, index_t m,
                      const Output& out, int threads) {
  const index_t N = w.rows, K = w.cols;
  if (m == 0 || N == 0) return;
  const index_t kp = round_up(K, 32);
  auto* xb = reinterpret_cast<std::uint16_t*>(
      scratch(static_cast<std::size_t>(m * kp) * sizeof(std::uint16_t)));
  const index_t panels = (N + vnni_gemm_nr - 1) / vnni_gemm_nr;
  threads = thread_policy::threads_for(m * N * K, thread_policy::min_multiply_adds, threads);
  index_t row_blocks = 1;
  if (panels < 2 * threads) {
    row_blocks = std::min<index_t>((2 * threads + panels - 1) / panels, (m + 5) / 6);
  }
  const index_t mb = round_up((m + row_blocks - 1) / row_blocks, vnni_gemm_mr);
  row_blocks = (m + mb - 1) / mb;
  const index_t jobs = panels * row_blocks;
  const std::size_t panel_bytes = static_cast<std::size_t>(vnni_gemm_nr * kp) * 2;
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
    const index_t r0 = std::min(m, t * per), r1 = std::min(m, (t + 1) * per);
    if (r1 > r0) round_rows_bf16(x + r0 * ldx, ldx, r1 - r0, K, xb + r0 * kp, kp);
#ifdef _OPENMP
#pragma omp barrier
#endif
    auto* pw = reinterpret_cast<std::uint16_t*>(panel_scratch(panel_bytes));
    const index_t from = jobs * t / team, to = jobs * (t + 1) / team;
    index_t packed = -1;  // the panel in pw: consecutive jobs of one panel pack it once
    for (index_t job = from; job < to; ++job) {
      const index_t panel = job / row_blocks;
      const index_t n0 = panel * vnni_gemm_nr;
      if (panel != packed) pack_panel_bf16(w, n0, kp, pw);
      packed = panel;
      const index_t i_begin = (job % row_blocks) * mb, i_end = std::min(m, i_begin + mb);
      for (index_t i0 = i_begin; i0 < i_end; i0 += vnni_gemm_mr) {
        const int mr = static_cast<int>(std::min<index_t>(vnni_gemm_mr, i_end - i0));
        run_bf16_gemm_tile(mr, pw, xb, kp, out, i0, n0, N, kp / 2);
      }
    }
  }
}

/// The avx512_bf16 path's kernels: the GEMV tiles for a few rows, the GEMM from
/// bf16_gemm_min_rows on.
inline void bf16_dot_path(const Bf16WeightsView& w, const float* x, index_t ldx, index_t m,
                          const Output& out, int threads) {
  if (m >= bf16_gemm_min_rows) {
    bf16_gemm(w, x, ldx, m, out, threads);
  } else {
    bf16_dot(w, x, ldx, m, out, threads);
  }
}

}  // namespace dissect::quant::detail

DISSECT_AVX512_WARNINGS_END

#endif  // DISSECT_X86
