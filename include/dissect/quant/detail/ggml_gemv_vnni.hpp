// dissect/quant/detail/ggml_gemv_vnni.hpp — PRIVATE: include dissect/quant/weight_format.hpp.
//
// ggml's K-quants (q4_K, q5_K, q6_K) against one to ggml_gemv_max_rows activation rows on VNNI:
// decode, where every weight is read once from DRAM and used by a row or two, so the work per
// weight byte must stay below what memory delivers. ggml_dot_avx512.hpp's tiles decode a
// super-block into int16 lanes with its scales spread beside the levels (vpmaddubsw, vpmaddwd),
// which pays off over 8 activation rows and costs a third of DRAM's rate at one. Here a
// super-block is four 64-level vectors of unsigned bytes (k_quant_gemv_row), each against its
// 64 q8_K activations in one vpdpbusd; the int32 lanes, four levels each and all of one group,
// are multiplied by their group's integer scale and summed over the super-block in one
// vpdpwssd; then, as llama.cpp does, d·dx times that sum, and dmin·dx times Σ m·Σx̃ (q4_K,
// q5_K) or d·dx times the stored +32's Σ sc·Σx̃ (q6_K) taken off.
//
// The integers are the avx2 path's (ggml_dot.hpp): per super-block exact in int32 (a lane is at
// most 4·63·127·128·4 < 2²⁴ after the scales, q6_K's bias term aside, which is converted on its
// own), so the bound is that path's, γ_(K/256 + 8)·Σ|terms|: per lane one fused multiply-add per
// super-block, the sixteen lanes' sum, the mins and the bias.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/ggml_gemv_vnni.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <cstdint>
#include <cstring>

#include "dissect/quant/detail/ggml_gemm_vnni.hpp"

#if DISSECT_X86

DISSECT_AVX512_WARNINGS_BEGIN

namespace dissect::quant::detail {

/// Up to this many activation rows the K-quants run these GEMV rows (more rows share the
/// 8-row tiles' decoded super-blocks better).
inline constexpr index_t ggml_gemv_max_rows = 3;

/// How far ahead k_quant_gemv_row asks for weight bytes.
inline constexpr index_t prefetch_bytes = 6144;

/// Per 128 levels (a 64-byte load), which group each int32 lane (4 levels) belongs to, and the
/// per-16-bit shifts that bring each byte's high bits down. q4_K and q5_K: a load of 64 nibble
/// bytes holds groups 4p and 4p + 2 in its low nibbles, 4p + 1 and 4p + 3 in its high ones (p the
/// pair of 64-level chunks), and q5_K's fifth bit of group j is bit j of its 32 qh bytes. q6_K:
/// half h's 64 ql bytes hold levels 0–63 of the half in their low nibbles and 64–127 in their
/// high ones, in order, with bits 0–1 / 2–3 (low) and 4–5 / 6–7 (high) of its 32 qh bytes.
struct GemvTables {
  alignas(64) std::int32_t affine_group[2][2][16];  // [pair][low/high nibbles][lane]
  alignas(64) std::int32_t q6_group[2][2][16];      // [half][low/high nibbles][lane]
  alignas(64) std::int16_t q5_shift[2][2][32];      // [pair][low/high][word]: bit of qh
  alignas(64) std::int16_t q6_shift[2][32];         // [low/high][word]: bits of qh
  constexpr GemvTables() : affine_group{}, q6_group{}, q5_shift{}, q6_shift{} {
    for (int p = 0; p < 2; ++p) {
      for (int high = 0; high < 2; ++high) {
        for (int lane = 0; lane < 16; ++lane) {
          affine_group[p][high][lane] = 4 * p + high + 2 * (lane / 8);
          q6_group[p][high][lane] = 8 * p + 4 * high + lane / 4;
        }
        for (int word = 0; word < 32; ++word) {
          q5_shift[p][high][word] = static_cast<std::int16_t>(4 * p + high + 2 * (word / 16));
        }
      }
    }
    for (int high = 0; high < 2; ++high) {
      for (int word = 0; word < 32; ++word) {
        q6_shift[high][word] = static_cast<std::int16_t>(4 * high + 2 * (word / 16));
      }
    }
  }
};
inline constexpr GemvTables gemv_tables{};

DISSECT_TARGET_VNNI inline __m512i load_table(const void* p) {
  return _mm512_load_si512(p);
}

/// q4_K and q5_K: each row's q8_K activations (m rows, `stride` bytes apart) reordered in place,
/// per 128, to [0–31, 64–95, 32–63, 96–127]: the order of a 64-byte load of nibbles, whose low
/// nibbles hold groups 4p and 4p + 2 and high nibbles 4p + 1 and 4p + 3. The sums of 16 stay.
DISSECT_TARGET_VNNI inline void pair_activations(std::uint8_t* a, index_t stride, index_t m,
                                                 index_t blocks) {
  for (index_t i = 0; i < m; ++i) {
    for (index_t s = 0; s < blocks; ++s) {
      std::uint8_t* qs = a + i * stride + s * 292 + 4;
      for (int p = 0; p < 2; ++p) {
        const __m512i x0 = _mm512_loadu_si512(qs + 128 * p);
        const __m512i x1 = _mm512_loadu_si512(qs + 128 * p + 64);
        _mm512_storeu_si512(qs + 128 * p, _mm512_shuffle_i64x2(x0, x1, 0x44));
        _mm512_storeu_si512(qs + 128 * p + 64, _mm512_shuffle_i64x2(x0, x1, 0xee));
      }
    }
  }
}

/// For each of R activation rows (`stride` bytes apart from xq): sumi[r] += Σ over 128 levels,
/// lo against the row's first 64 activations and hi against the next 64, each int32 lane times
/// its group's scale (`groups`: lo's lane groups, then hi's).
template <int R>
DISSECT_TARGET_VNNI inline void scaled_dots(__m512i (&sumi)[R], __m512i lo, __m512i hi,
                                            const std::int32_t (&groups)[2][16], __m512i scales,
                                            const std::uint8_t* xq, index_t stride) {
  const __m512i scale_lo = _mm512_permutexvar_epi32(load_table(groups[0]), scales);
  const __m512i scale_hi = _mm512_permutexvar_epi32(load_table(groups[1]), scales);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const std::uint8_t* row = xq + r * stride;
    const __m512i dot_lo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, _mm512_loadu_si512(row));
    const __m512i dot_hi =
        _mm512_dpbusd_epi32(_mm512_setzero_si512(), hi, _mm512_loadu_si512(row + 64));
    sumi[r] = _mm512_dpwssd_epi32(sumi[r], dot_lo, scale_lo);
    sumi[r] = _mm512_dpwssd_epi32(sumi[r], dot_hi, scale_hi);
  }
}

/// One weight row of F (`blocks` super-blocks from `row`) against R rows of q8_K activations
/// (a, rows `stride` bytes apart): sums[r]. Per 128 levels: one 64-byte load split into two
/// vectors of unsigned levels, one vpdpbusd each against the matching activations (for q4_K and
/// q5_K gathered from two 64-byte loads, as the nibbles pair their groups), and one vpdpwssd each
/// that multiplies every int32 lane (|lane| ≤ 4·63·127 < 2¹⁵, so its low 16 bits are the value)
/// by its group's scale and adds it to the super-block's sum.
template <WeightFormat F, int R>
DISSECT_TARGET_VNNI inline void k_quant_gemv_row(const std::uint8_t* row, index_t blocks,
                                                 const std::uint8_t* a, index_t stride,
                                                 float* sums) {
  constexpr index_t weight_bytes = F == WeightFormat::q4_K   ? 144
                                   : F == WeightFormat::q5_K ? 176
                                                             : 210;
  constexpr index_t activation_bytes = 292;  // q8_K: d (f32), 256 × i8, 16 × i16 sums of 16
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i low16 = _mm512_set1_epi32(0xffff);
  __m512 acc[R];
  __m256 mins_acc[R];  // what comes off: the mins (q4_K, q5_K) or the stored +32 (q6_K)
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    acc[r] = _mm512_setzero_ps();
    mins_acc[r] = _mm256_setzero_ps();
  }
  for (index_t s = 0; s < blocks; ++s) {
    const std::uint8_t* block = row + s * weight_bytes;
    const std::uint8_t* x = a + s * activation_bytes;
    // prefetch_bytes on (rows are contiguous): a K-quant row is 1–4 KB, too short a stream for
    // the hardware prefetcher to reach DRAM's rate on its own.
    for (index_t line = 0; line < weight_bytes; line += 64) {
      prefetch_ahead(block + line, prefetch_bytes);
    }
    __m512i sumi[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) sumi[r] = _mm512_setzero_si512();
    float d, dmin = 0;
    __m256i mins16 = _mm256_setzero_si256();
    if constexpr (F == WeightFormat::q6_K) {
      // int8 scales, each in the low 16 bits of its lane (vpdpwssd reads the high 16 as 0).
      const __m512i scales = _mm512_and_si512(
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192))),
          low16);
      d = f16_at(block + 208);
      const __m512i three = _mm512_set1_epi8(3);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
        const __m512i ql = _mm512_loadu_si512(block + 64 * h);
        const __m512i qh = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 128 + 32 * h)));
        const __m512i lo = _mm512_or_si512(
            _mm512_and_si512(ql, low4),
            _mm512_slli_epi16(
                _mm512_and_si512(_mm512_srlv_epi16(qh, load_table(gemv_tables.q6_shift[0])), three),
                4));
        const __m512i hi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4),
            _mm512_slli_epi16(
                _mm512_and_si512(_mm512_srlv_epi16(qh, load_table(gemv_tables.q6_shift[1])), three),
                4));
        scaled_dots<R>(sumi, lo, hi, gemv_tables.q6_group[h], scales, x + 4 + 128 * h, stride);
      }
    } else {
      // The eight 6-bit scales and mins (unpack_scales_and_mins's rule) in general registers,
      // straight into vectors: no store and reload of bytes written as words.
      std::uint32_t u[3];
      std::memcpy(u, block + 4, 12);
      constexpr std::uint32_t six = 0x3f3f3f3f, four = 0x0f0f0f0f, two = 0x03030303;
      const std::uint64_t sc =
          (u[0] & six) | std::uint64_t((u[2] & four) | (((u[0] >> 6) & two) << 4)) << 32;
      const std::uint64_t mn =
          (u[1] & six) | std::uint64_t(((u[2] >> 4) & four) | (((u[1] >> 6) & two) << 4)) << 32;
      const __m512i scales =
          _mm512_zextsi256_si512(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(std::int64_t(sc))));
      // Each min twice, as 16 int16: one per q8_K sum of 16.
      const __m128i mn8 = _mm_cvtsi64_si128(std::int64_t(mn));
      mins16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn8, mn8));
      d = f16_at(block);
      dmin = f16_at(block + 2);
      const std::uint8_t* qs = block + (F == WeightFormat::q5_K ? 48 : 16);
      __m512i qh = _mm512_setzero_si512();
      if constexpr (F == WeightFormat::q5_K) {
        qh = _mm512_broadcast_i64x4(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 16)));
      }
      const __m512i one = _mm512_set1_epi8(1);
#pragma GCC unroll 2
      for (int p = 0; p < 2; ++p) {
        const __m512i v = _mm512_loadu_si512(qs + 64 * p);
        __m512i lo = _mm512_and_si512(v, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        if constexpr (F == WeightFormat::q5_K) {
          lo = _mm512_or_si512(
              lo, _mm512_slli_epi16(
                      _mm512_and_si512(
                          _mm512_srlv_epi16(qh, load_table(gemv_tables.q5_shift[p][0])), one),
                      4));
          hi = _mm512_or_si512(
              hi, _mm512_slli_epi16(
                      _mm512_and_si512(
                          _mm512_srlv_epi16(qh, load_table(gemv_tables.q5_shift[p][1])), one),
                      4));
        }
        // The activations are in the nibbles' order (pair_activations).
        scaled_dots<R>(sumi, lo, hi, gemv_tables.affine_group[p], scales, x + 4 + 128 * p, stride);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* xr = x + r * stride;
      float dx;
      std::memcpy(&dx, xr, 4);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sumi[r]), _mm512_set1_ps(d * dx), acc[r]);
      // Per pair of q8_K's sums of 16, exact in int32: sc_g·Σx̃ for q6_K (its stored +32, so
      // scaled by 32·d·dx), m_j·Σx̃ for q4_K and q5_K (scaled by dmin·dx).
      const __m256i sums16 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + 260));
      if constexpr (F == WeightFormat::q6_K) {
        const __m256i bias = _mm256_madd_epi16(
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(block + 192))),
            sums16);
        mins_acc[r] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(bias), _mm256_set1_ps(32 * d * dx), mins_acc[r]);
      } else {
        mins_acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(mins16, sums16)),
                                      _mm256_set1_ps(dmin * dx), mins_acc[r]);
      }
    }
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    sums[r] =
        _mm512_reduce_add_ps(acc[r]) - _mm512_reduce_add_ps(_mm512_zextps256_ps512(mins_acc[r]));
  }
}

/// y = x̂·Ŵᵀ (+ bias) for m ≤ ggml_gemv_max_rows rows of q8_K activations `a` (rows `stride`
/// bytes apart; reordered in place for q4_K and q5_K), W in q4_K, q5_K or q6_K; weight rows
/// split over threads as the tiles' are.
template <WeightFormat F>
inline void k_quant_gemv(const GgmlWeightsView& w, std::uint8_t* a, index_t stride, index_t m,
                         float* y, index_t ldy, const float* bias, int threads) {
  const index_t row_bytes = ggml_row_bytes(ggml_type_of(F), w.cols), blocks = w.cols / 256;
  if constexpr (F != WeightFormat::q6_K) pair_activations(a, stride, m, blocks);
  for_each_weight_task(w, threads, [&](index_t n0, index_t n1) {
    float sums[ggml_gemv_max_rows];
    for (index_t n = n0; n < n1; ++n) {
      const std::uint8_t* row = w.blocks + n * row_bytes;
      if (m == 1) {
        k_quant_gemv_row<F, 1>(row, blocks, a, stride, sums);
      } else if (m == 2) {
        k_quant_gemv_row<F, 2>(row, blocks, a, stride, sums);
      } else {
        k_quant_gemv_row<F, 3>(row, blocks, a, stride, sums);
      }
      for (index_t i = 0; i < m; ++i) y[i * ldy + n] = bias ? sums[i] + bias[n] : sums[i];
    }
  });
}

}  // namespace dissect::quant::detail

DISSECT_AVX512_WARNINGS_END

#endif  // DISSECT_X86
