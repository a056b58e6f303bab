// dissect/quant/detail/ggml_gemm_vnni.hpp — PRIVATE: include dissect/quant/weight_format.hpp.
//
// ggml's q8_0, q4_K, q5_K and q6_K blocks on the packed VNNI GEMM of quant_gemm_vnni.hpp, the
// avx512_vnni path's prefill from ggml_vnni_gemm_min_rows activation rows on. ggml_dot_avx512.hpp
// decodes each weight block once per 8 activation rows and finishes every output with a
// horizontal sum; here a block is decoded once per row block into a 32-column panel in the
// layout vpdpbusd wants, and a 6 × 32 micro-tile keeps its sums in registers, as the int8 and
// q4_0 GEMM does. What a view adds to that GEMM:
//
//   load64        64 weights of one row as signed bytes: q8_0's values; q4_K's levels 0–15 and
//                 q5_K's 0–31 (the min is subtracted apart, below); q6_K's levels − 32.
//   pack_scales   per group of k and column, in float: q8_0 d; q4_K/q5_K d·sc_j and dmin·m_j per
//                 32; q6_K d·sc_g per 16 (fp16 × a 6- or 8-bit integer: exact in fp32).
//   quantize_rows llama.cpp's activations, so the integers are llama.cpp's: q8_0 blocks for q8_0
//                 (fp16 scale) and q8_K super-blocks for the K-quants (one fp32 scale per 256,
//                 and, for the mins, sx·Σx̃ per 32 from q8_K's sums of 16).
//
// Every group's Σ x̃·q is exact in int32, as on the other paths; what differs is the float work:
// per group one rounding of sx·scale, one of the fused multiply-add into the total and, for
// q4_K/q5_K, two more for the min (sx·Σx̃ and its fused subtraction), plus one per K chunk and
// the bias. So against the exact Σ x̂·ŵ + b the error is within
// γ_(2·K/G + 2·K/32 + 8)·(Σ|ŵ·x̂| + |b|), G = 32 (16 for q6_K): the ggml_dot.hpp bound with the
// per-block float terms counted per group (tests/test_ggml_dot.cpp).
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/ggml_gemm_vnni.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <cstdint>
#include <cstring>

#include "dissect/numeric/half.hpp"
#include "dissect/quant/detail/ggml_block_codecs.hpp"
#include "dissect/quant/detail/ggml_kquant_codecs.hpp"
#include "dissect/quant/detail/quant_gemm_vnni.hpp"
#include "dissect/quant/format.hpp"

#if DISSECT_X86

DISSECT_AVX512_WARNINGS_BEGIN

namespace dissect::quant::detail {

/// From this many activation rows ggml's blocks run the packed GEMM (as q4_0's: packing a
/// block's levels costs about what the 8-row tiles save below it).
inline constexpr index_t ggml_vnni_gemm_min_rows = 32;

/// W in ggml format F, rows of row_bytes (whole blocks), for the packed GEMM.
template <WeightFormat F>
struct GgmlPanelView {
  static constexpr VnniScale vnni_scale = F == WeightFormat::q8_0   ? VnniScale::block
                                          : F == WeightFormat::q6_K ? VnniScale::half_block
                                                                    : VnniScale::block_min;
  static constexpr index_t block_bytes = F == WeightFormat::q8_0   ? 34
                                         : F == WeightFormat::q4_K ? 144
                                         : F == WeightFormat::q5_K ? 176
                                                                   : 210;
  const std::uint8_t* blocks;
  index_t rows, cols, row_bytes;
};

DISSECT_TARGET_VNNI inline __m256i load32(const std::uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

/// (bytes >> shift) & mask, per byte.
DISSECT_TARGET_VNNI inline __m256i bits(__m256i v, int shift, int mask) {
  return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(shift)),
                          _mm256_set1_epi8(static_cast<char>(mask)));
}

/// 64 weights of row n from k (k a multiple of 64; zero for n ≥ N and, for q8_0, past K).
template <WeightFormat F>
DISSECT_TARGET_VNNI inline __m512i load64(const GgmlPanelView<F>& w, index_t n, index_t k) {
  if (n >= w.rows) return _mm512_setzero_si512();
  const std::uint8_t* row = w.blocks + n * w.row_bytes;
  __m256i lo, hi;
  if constexpr (F == WeightFormat::q8_0) {
    const std::uint8_t* block = row + (k / 32) * 34;
    lo = load32(block + 2);
    hi = k + 32 < w.cols ? load32(block + 36) : _mm256_setzero_si256();
  } else {
    const std::uint8_t* block = row + (k / 256) * GgmlPanelView<F>::block_bytes;
    const int c = static_cast<int>(k % 256 / 64);  // which 64 of the super-block
    if constexpr (F == WeightFormat::q6_K) {
      // Half c/2: ql[0..63] at 64·(c/2), qh[0..31] at 128 + 32·(c/2); the even 64 take the low
      // nibbles and qh bits 0–3, the odd 64 the high nibbles and bits 4–7.
      const std::uint8_t* ql = block + 64 * (c / 2);
      const __m256i qh = load32(block + 128 + 32 * (c / 2));
      const int shift = 4 * (c % 2);
      lo = _mm256_or_si256(bits(load32(ql), shift, 0x0f), _mm256_slli_epi16(bits(qh, shift, 3), 4));
      hi = _mm256_or_si256(bits(load32(ql + 32), shift, 0x0f),
                           _mm256_slli_epi16(bits(qh, shift + 2, 3), 4));
      const __m256i bias = _mm256_set1_epi8(32);
      lo = _mm256_sub_epi8(lo, bias);
      hi = _mm256_sub_epi8(hi, bias);
    } else {
      // 32 bytes of nibbles: the low ones are group 2c, the high ones group 2c + 1; q5_K's fifth
      // bits are bit 2c and 2c + 1 of qh[0..31].
      const __m256i q = load32(block + (F == WeightFormat::q5_K ? 48 : 16) + 32 * c);
      lo = bits(q, 0, 0x0f);
      hi = bits(q, 4, 0x0f);
      if constexpr (F == WeightFormat::q5_K) {
        const __m256i qh = load32(block + 16);
        lo = _mm256_or_si256(lo, _mm256_slli_epi16(bits(qh, 2 * c, 1), 4));
        hi = _mm256_or_si256(hi, _mm256_slli_epi16(bits(qh, 2 * c + 1, 1), 4));
      }
    }
  }
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/// The scales of columns n0 … n0+31 over [k0, k0 + kcp) (see the header comment), per group
/// of the chunk; 0 for n ≥ N and past K.
template <WeightFormat F>
inline void pack_scales(const GgmlPanelView<F>& w, index_t n0, index_t k0, index_t kcp, float* d,
                        float* mins) {
  for (index_t c = 0; c < 32; ++c) {
    const index_t n = n0 + c;
    const std::uint8_t* row = n < w.rows ? w.blocks + n * w.row_bytes : nullptr;
    if constexpr (F == WeightFormat::q8_0) {
      for (index_t b = k0 / 32; b < (k0 + kcp) / 32; ++b) {
        d[(b - k0 / 32) * 32 + c] =
            row && b * 32 < w.cols
                ? fp16_to_float(static_cast<std::uint16_t>(row[b * 34] | (row[b * 34 + 1] << 8)))
                : 0.0f;
      }
    } else {
      for (index_t s = k0 / 256; s < (k0 + kcp) / 256; ++s) {
        constexpr int groups = F == WeightFormat::q6_K ? 16 : 8;
        float* ds = d + (s - k0 / 256) * groups * 32 + c;
        float* ms = mins + (s - k0 / 256) * groups * 32 + c;
        if (!row) {
          for (int g = 0; g < groups; ++g) ds[g * 32] = ms[g * 32] = 0.0f;
          continue;
        }
        const std::uint8_t* block = row + s * GgmlPanelView<F>::block_bytes;
        if constexpr (F == WeightFormat::q6_K) {
          const float scale = f16_at(block + 208);
          for (int g = 0; g < 16; ++g) {
            ds[g * 32] = scale * static_cast<float>(static_cast<std::int8_t>(block[192 + g]));
          }
        } else {
          alignas(8) std::uint8_t sc[8], mn[8];
          unpack_scales_and_mins(block + 4, sc, mn);
          const float scale = f16_at(block), min = f16_at(block + 2);
          for (int g = 0; g < 8; ++g) {
            ds[g * 32] = scale * static_cast<float>(sc[g]);
            ms[g * 32] = min * static_cast<float>(mn[g]);
          }
        }
      }
    }
  }
}

/// Rows [i0, i1) of x as llama.cpp quantises them for F (q8_0 blocks, or q8_K super-blocks),
/// moved into the GEMM's layout: x̃ + 128 per byte (zero padded to ldq), sx per block of 32,
/// and for the mins sx·Σx̃ per block of 32.
template <WeightFormat F>
inline void quantize_rows(const GgmlPanelView<F>&, const float* x, index_t ldx, index_t i0,
                          index_t i1, index_t K, unsigned char* q, index_t ldq, float* sx,
                          index_t ldsx, float* xsum) {
  for (index_t i = i0; i < i1; ++i) {
    unsigned char* qi = q + i * ldq;
    float* si = sx + i * ldsx;
    if constexpr (F == WeightFormat::q8_0) {
      std::uint8_t block[34];
      for (index_t b = 0; b < K / 32; ++b) {
        dissect::detail::ggml::quantize_q8_0(x + i * ldx + b * 32, block);
        si[b] = fp16_to_float(static_cast<std::uint16_t>(block[0] | (block[1] << 8)));
        for (int j = 0; j < 32; ++j) qi[b * 32 + j] = block[2 + j] ^ 0x80;
      }
    } else {
      std::uint8_t block[292];
      for (index_t s = 0; s < K / 256; ++s) {
        dissect::detail::ggml::quantize_q8_K(x + i * ldx + s * 256, block);
        float scale;
        std::memcpy(&scale, block, 4);
        for (int j = 0; j < 256; ++j) qi[s * 256 + j] = block[4 + j] ^ 0x80;
        for (int g = 0; g < 8; ++g) {
          si[s * 8 + g] = scale;
          if constexpr (F != WeightFormat::q6_K) {
            std::int16_t pair[2];
            std::memcpy(pair, block + 260 + 4 * g, 4);
            xsum[i * ldsx + s * 8 + g] = scale * static_cast<float>(pair[0] + pair[1]);
          }
        }
      }
    }
    for (index_t k = K; k < ldq; ++k) qi[k] = 0x80;  // x̃ = 0
    for (index_t b = K / 32; b < ldq / 32; ++b) si[b] = 0.0f;
  }
}

/// y = x·Ŵᵀ (+ bias) for ggml blocks on the packed GEMM (any m ≥ 1; ggml_avx512_matmul sends
/// it ggml_vnni_gemm_min_rows rows and more). w.format must be q8_0, q4_K, q5_K or q6_K.
inline void ggml_vnni_gemm(const GgmlWeightsView& w, const float* x, index_t ldx, index_t m,
                           float* y, index_t ldy, const float* bias, int threads) {
  const index_t row_bytes = ggml_row_bytes(ggml_type_of(w.format), w.cols);
  const Output out{y, ldy, bias};
  const auto run = [&]<WeightFormat F>() {
    vnni_gemm(GgmlPanelView<F>{w.blocks, w.rows, w.cols, row_bytes}, x, ldx, m, out, threads);
  };
  switch (w.format) {
    case WeightFormat::q8_0:
      return run.template operator()<WeightFormat::q8_0>();
    case WeightFormat::q4_K:
      return run.template operator()<WeightFormat::q4_K>();
    case WeightFormat::q5_K:
      return run.template operator()<WeightFormat::q5_K>();
    case WeightFormat::q6_K:
      return run.template operator()<WeightFormat::q6_K>();
    default:
      throw ConfigError(dissect::detail::concat("ggml_vnni_gemm: ", weight_format_name(w.format),
                                                " has no packed GEMM"));
  }
}

}  // namespace dissect::quant::detail

DISSECT_AVX512_WARNINGS_END

#endif  // DISSECT_X86
