// dissect/quant/detail/ggml_gemm_avx2.hpp — PRIVATE: include dissect/quant/weight_format.hpp.
//
// The avx2 path's kernels for ggml's q8_0, q4_K, q5_K and q6_K weights (ggml_dot.hpp), on
// llama.cpp's integers:
//
//   activation rounding  q8_K and q8_0 in 8-float vectors, the bytes of ggml's reference rule
//           (quantize_q8_K / quantize_q8_0 in ggml_block_codecs) bit for bit: the same float
//           operations in the same order, the same first element of largest magnitude, the
//           same truncation of nearest_int's int to a byte.
//   tiles   R activation rows × C weight rows at once. Each weight block is decoded once for the
//           R rows (nibbles, high bits, scales), each activation block loaded once for the C
//           rows; every output keeps its 8 int32 lanes for the block and then one 8-float
//           accumulator across blocks (one horizontal sum per output, not per block, as
//           llama.cpp's ggml_vec_dot_*_q8_K keep theirs).
//
// An output's arithmetic does not depend on the tile: its int32 lanes are the same sums (the
// integers of llama.cpp's AVX2 kernels: vpmaddubsw pairs, vpmaddwd by the sub-block scales), its
// float steps the same per block — for q4_K/q5_K  acc += d·dx·S_lanes − dmin·dx·M_lanes
// (M_lanes: the mins against q8_K's sums of 16, one lane per sub-block), for q6_K
// acc += d·dx·(S_lanes − 32·B_lanes), for q8_0  acc += d·dx·S_lanes — so a 1 × 1 tile (dot_row,
// decode) and any edge tile give the bits a full tile gives, on any thread count. Per lane that
// is one accumulation per block and two roundings of its term: the float error stays within
// ggml_dot.hpp's γ_(K/B + 8) bound.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/ggml_gemm_avx2.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>

#include "dissect/quant/detail/ggml_block_codecs.hpp"

namespace dissect::quant::detail {

#if DISSECT_X86

// ---- activation rounding ------------------------------------------------------------------------

DISSECT_TARGET_AVX2 inline float hmax_f32(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// The low bytes of 32 int32 lanes (a: values 0–7, b: 8–15, c: 16–23, d: 24–31), in order: C++'s
/// int → int8 conversion (modular), as the scalar codecs store their levels.
DISSECT_TARGET_AVX2 inline __m256i low_bytes(__m256i a, __m256i b, __m256i c, __m256i d) {
  const __m256i byte = _mm256_set1_epi32(0xff);
  const __m256i ab = _mm256_packus_epi32(_mm256_and_si256(a, byte), _mm256_and_si256(b, byte));
  const __m256i cd = _mm256_packus_epi32(_mm256_and_si256(c, byte), _mm256_and_si256(d, byte));
  // Groups of 4 bytes: a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7.
  return _mm256_permutevar8x32_epi32(_mm256_packus_epi16(ab, cd),
                                     _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/// quantize_q8_K in vectors: the same bytes. Max over |x| skips NaN as the scalar `ax > amax`
/// does (vmaxps returns its second operand, the running max, when the first is NaN); the scale's
/// sign comes from the first element of that magnitude; iscale·x and the 1.5·2²³ shift are two
/// roundings (no FMA: DISSECT_EXACT_FLOAT).
DISSECT_EXACT_FLOAT DISSECT_TARGET_AVX2 inline void quantize_q8_K_avx2(const float* x,
                                                                       std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 running = _mm256_setzero_ps();
  for (int j = 0; j < 256; j += 8) {
    running = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), magnitude), running);
  }
  const float amax = hmax_f32(running);
  if (amax == 0) {
    std::memset(block, 0, 292);
    return;
  }
  const __m256 target = _mm256_set1_ps(amax);
  int first = 0;
  for (int j = 0; j < 256; j += 8) {
    const int hits = _mm256_movemask_ps(
        _mm256_cmp_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), magnitude), target, _CMP_EQ_OQ));
    if (hits != 0) {
      first = j + std::countr_zero(static_cast<unsigned>(hits));
      break;
    }
  }
  const float iscale = -127.f / x[first];
  const __m256 scale = _mm256_set1_ps(iscale), shift = _mm256_set1_ps(12582912.f);
  const __m256i mantissa = _mm256_set1_epi32(0x007fffff), half = _mm256_set1_epi32(0x00400000);
  const __m256i top = _mm256_set1_epi32(127);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  __m256i fours[8];  // lane k of chunk p: the sum of its bytes 4k … 4k+3
  for (int p = 0; p < 8; ++p) {
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      const __m256 shifted =
          _mm256_add_ps(_mm256_mul_ps(scale, _mm256_loadu_ps(x + 32 * p + 8 * k)), shift);
      q[k] = _mm256_min_epi32(
          _mm256_sub_epi32(_mm256_and_si256(_mm256_castps_si256(shifted), mantissa), half), top);
    }
    const __m256i bytes = low_bytes(q[0], q[1], q[2], q[3]);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(block + 4 + 32 * p), bytes);
    fours[p] = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, bytes), ones16);
  }
  // Sums of 16: chunk p's lanes 0–3 are sum 2p, lanes 4–7 sum 2p + 1.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i s0 =
      _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(_mm256_hadd_epi32(fours[0], fours[1]),
                                                    _mm256_hadd_epi32(fours[2], fours[3])),
                                  order);
  const __m256i s1 =
      _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(_mm256_hadd_epi32(fours[4], fours[5]),
                                                    _mm256_hadd_epi32(fours[6], fours[7])),
                                  order);
  // |sum| ≤ 16·128: packs does not saturate.
  const __m256i sums = _mm256_permute4x64_epi64(_mm256_packs_epi32(s0, s1), 0xd8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(block + 4 + 256), sums);
  dissect::detail::ggml::store_u32(block, std::bit_cast<std::uint32_t>(1 / iscale));
}

/// quantize_q8_0 in vectors: the same bytes. std::round (half away from zero) as the truncation
/// plus one step away where the dropped fraction is ≥ ½ (exact: v − trunc(v) is); the float →
/// int8 conversion as x86 makes it, the low byte of cvttps2dq (0x80000000 for NaN and ±∞).
DISSECT_EXACT_FLOAT DISSECT_TARGET_AVX2 inline void quantize_q8_0_avx2(const float* x,
                                                                       std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  const __m256 magnitude = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 v[4];
  __m256 running = _mm256_setzero_ps();
  for (int k = 0; k < 4; ++k) {
    v[k] = _mm256_loadu_ps(x + 8 * k);
    running = _mm256_max_ps(_mm256_and_ps(v[k], magnitude), running);
  }
  const float amax = hmax_f32(running);
  const float d = amax / 127;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  dissect::detail::ggml::store_f16(block, d);
  const __m256 scale = _mm256_set1_ps(id), half = _mm256_set1_ps(0.5f);
  const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) {
    const __m256 p = _mm256_mul_ps(v[k], scale);
    const __m256 t = _mm256_round_ps(p, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 away = _mm256_and_ps(
        _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(p, t), magnitude), half, _CMP_GE_OQ),
        _mm256_or_ps(_mm256_and_ps(p, sign), one));
    q[k] = _mm256_cvttps_epi32(_mm256_add_ps(t, away));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(block + 2), low_bytes(q[0], q[1], q[2], q[3]));
}

/// Rows of x quantised to `format`'s activation blocks (ggml_activation_type) in vectors.
DISSECT_TARGET_AVX2 inline void quantize_ggml_activations_avx2(bool q8_0, const float* x,
                                                               index_t ldx, index_t m, index_t K,
                                                               std::uint8_t* out) {
  const index_t per = q8_0 ? 32 : 256, bytes = q8_0 ? 34 : 292;
  const index_t blocks = K / per;
  for (index_t i = 0; i < m; ++i) {
    for (index_t b = 0; b < blocks; ++b) {
      std::uint8_t* block = out + (i * blocks + b) * bytes;
      if (q8_0) {
        quantize_q8_0_avx2(x + i * ldx + b * per, block);
      } else {
        quantize_q8_K_avx2(x + i * ldx + b * per, block);
      }
    }
  }
}

// ---- tiles ------------------------------------------------------------------------------------

/// How far ahead the one-row tile (decode: W streamed from DRAM once) prefetches its weights.
inline constexpr index_t ggml_avx2_prefetch_bytes = 4096;

/// At m = 1 the 1 × 1 tile streams W row after row: one sequential stream, fetched ahead.
template <int R, int C>
DISSECT_TARGET_AVX2 inline void prefetch_weights(const std::uint8_t* w, index_t bytes) {
  if constexpr (R == 1 && C == 1) {
    for (index_t k = 0; k < bytes; k += 64) {
      _mm_prefetch(reinterpret_cast<const char*>(w + ggml_avx2_prefetch_bytes + k), _MM_HINT_T0);
    }
  }
}

/// One tile's operands: C weight rows from w (stride w_stride), R activation rows from a (stride
/// a_stride), `blocks` blocks each; outputs y[r·ldy + c] (+ bias[c]).
struct GgmlTile {
  const std::uint8_t* w = nullptr;
  index_t w_stride = 0;
  const std::uint8_t* a = nullptr;
  index_t a_stride = 0;
  index_t blocks = 0;
  float* y = nullptr;
  index_t ldy = 0;
  const float* bias = nullptr;
};

/// Output (r, c) of a tile from its 8 float lanes.
DISSECT_TARGET_AVX2 inline void store_output(const GgmlTile& t, int r, int c, __m256 acc) {
  const float sum = hsum_f32(acc);
  t.y[r * t.ldy + c] = t.bias ? sum + t.bias[c] : sum;
}

/// sum + term, behind an empty asm that claims to change the result: GCC's reassociation would
/// otherwise regroup a block's integer sums into a tree that holds every vpmaddubsw product at
/// once, and spill them.
DISSECT_TARGET_AVX2 inline __m256i add_in_order(__m256i sum, __m256i term) {
  __m256i out = _mm256_add_epi32(sum, term);
  asm("" : "+x"(out));
  return out;
}

/// p, which the compiler may no longer assume constant: loads through it stay in the loop
/// (memory operands of vpshufb) instead of being hoisted into eight of the 16 registers.
template <class T>
inline const T* opaque(const T* p) {
  asm("" : "+r"(p));
  return p;
}

/// vpshufb masks broadcasting int16 scale j of a 128-bit lane to all 8 of its int16s.
struct ScaleShuffles {
  alignas(32) std::uint8_t bytes[8][32];
  constexpr ScaleShuffles() : bytes{} {
    for (int j = 0; j < 8; ++j) {
      for (int k = 0; k < 32; k += 2) {
        bytes[j][k] = static_cast<std::uint8_t>(2 * j);
        bytes[j][k + 1] = static_cast<std::uint8_t>(2 * j + 1);
      }
    }
  }
};
inline constexpr ScaleShuffles scale_shuffles{};

/// vpshufb masks for q6_K: int8 scales g and g + 1 each repeated 8 times (g = 0, 2, …, 14).
struct PairShuffles {
  alignas(16) std::uint8_t bytes[8][16];
  constexpr PairShuffles() : bytes{} {
    for (int p = 0; p < 8; ++p) {
      for (int k = 0; k < 8; ++k) {
        bytes[p][k] = static_cast<std::uint8_t>(2 * p);
        bytes[p][k + 8] = static_cast<std::uint8_t>(2 * p + 1);
      }
    }
  }
};
inline constexpr PairShuffles pair_shuffles{};

/// q4_K / q5_K's 12 bytes of scales and mins as 16 int16 (scales 0–7, then mins 0–7).
DISSECT_TARGET_AVX2 inline __m256i scales_and_mins(const std::uint8_t* packed) {
  std::uint32_t u[3];
  std::memcpy(u, packed, 12);
  constexpr std::uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
  const std::uint32_t sc_lo = u[0] & low6, sc_hi = (u[2] & low4) | (((u[0] >> 6) & low2) << 4);
  const std::uint32_t m_lo = u[1] & low6, m_hi = ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4);
  return _mm256_cvtepu8_epi16(_mm_setr_epi32(static_cast<int>(sc_lo), static_cast<int>(sc_hi),
                                             static_cast<int>(m_lo), static_cast<int>(m_hi)));
}

/// q4_K (five_bit false) or q5_K against q8_K.
template <bool five_bit>
struct AffineKTile {
  static constexpr index_t block = 256;
  static constexpr index_t weight_bytes = five_bit ? 176 : 144;

  template <int R, int C>
  DISSECT_TARGET_AVX2 static void run(const GgmlTile& t) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0f);
    for (index_t b = 0; b < t.blocks; ++b) {
      const std::uint8_t* w[C];
      const std::uint8_t* a[R];
      for (int c = 0; c < C; ++c) w[c] = t.w + c * t.w_stride + b * weight_bytes;
      for (int r = 0; r < R; ++r) a[r] = t.a + r * t.a_stride + b * 292 + 4;
      prefetch_weights<R, C>(w[0], weight_bytes);
      __m256i scales[C];
      __m256i high[C];
      for (int c = 0; c < C; ++c) {
        const __m256i sm = scales_and_mins(w[c] + 4);
        scales[c] = _mm256_permute2x128_si256(sm, sm, 0x00);
        if constexpr (five_bit) high[c] = load256(w[c] + 16);
      }
      __m256i sum[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) sum[r][c] = _mm256_setzero_si256();
      const auto* shuffles = opaque(reinterpret_cast<const __m256i*>(scale_shuffles.bytes));
      for (int j = 0; j < 4; ++j) {
        const __m256i shuffle_lo = _mm256_load_si256(shuffles + 2 * j);
        const __m256i shuffle_hi = _mm256_load_si256(shuffles + 2 * j + 1);
        for (int c = 0; c < C; ++c) {
          const __m256i v = load256(w[c] + (five_bit ? 48 : 16) + 32 * j);
          __m256i lo = _mm256_and_si256(v, low4);
          __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          if constexpr (five_bit) {
            // Bits 2j and 2j+1 of qh byte l: the fifth bits of values 64j + l and 64j + 32 + l.
            const __m256i sixteen = _mm256_set1_epi8(16);
            lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(high[c], 4), sixteen));
            hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(high[c], 3), sixteen));
            high[c] = _mm256_srli_epi16(high[c], 2);
          }
          const __m256i scale_lo = _mm256_shuffle_epi8(scales[c], shuffle_lo);
          const __m256i scale_hi = _mm256_shuffle_epi8(scales[c], shuffle_hi);
          for (int r = 0; r < R; ++r) {
            sum[r][c] = add_in_order(sum[r][c], scaled_dot32(lo, load256(a[r] + 64 * j), scale_lo));
            sum[r][c] =
                add_in_order(sum[r][c], scaled_dot32(hi, load256(a[r] + 64 * j + 32), scale_hi));
          }
        }
      }
      // The mins, one lane per sub-block: m_j·(sum 2j + sum 2j + 1) of q8_K's sums of 16.
      for (int c = 0; c < C; ++c) {
        const __m256i sm = scales_and_mins(w[c] + 4);
        const __m128i mins = _mm256_extracti128_si256(sm, 1);
        const __m256i mins_twice =
            _mm256_set_m128i(_mm_unpackhi_epi16(mins, mins), _mm_unpacklo_epi16(mins, mins));
        const __m256 d = _mm256_set1_ps(f16_at(w[c])), dmin = _mm256_set1_ps(f16_at(w[c] + 2));
        for (int r = 0; r < R; ++r) {
          const __m256 dx = _mm256_broadcast_ss(reinterpret_cast<const float*>(a[r] - 4));
          const __m256i m_lanes = _mm256_madd_epi16(load256(a[r] + 256), mins_twice);
          const __m256 block_sum =
              _mm256_fmsub_ps(_mm256_cvtepi32_ps(sum[r][c]), _mm256_mul_ps(d, dx),
                              _mm256_mul_ps(_mm256_cvtepi32_ps(m_lanes), _mm256_mul_ps(dmin, dx)));
          acc[r][c] = _mm256_add_ps(acc[r][c], block_sum);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_output(t, r, c, acc[r][c]);
  }
};

/// q6_K against q8_K.
struct Q6KTile {
  static constexpr index_t block = 256;
  static constexpr index_t weight_bytes = 210;

  template <int R, int C>
  DISSECT_TARGET_AVX2 static void run(const GgmlTile& t) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(0x03);
    for (index_t b = 0; b < t.blocks; ++b) {
      const std::uint8_t* w[C];
      const std::uint8_t* a[R];
      for (int c = 0; c < C; ++c) w[c] = t.w + c * t.w_stride + b * weight_bytes;
      for (int r = 0; r < R; ++r) a[r] = t.a + r * t.a_stride + b * 292 + 4;
      prefetch_weights<R, C>(w[0], weight_bytes);
      __m256i sum[R][C];
      for (int r = 0; r < R; ++r)
        for (int c = 0; c < C; ++c) sum[r][c] = _mm256_setzero_si256();
      const auto* shuffles = opaque(reinterpret_cast<const __m128i*>(pair_shuffles.bytes));
      for (int h = 0; h < 2; ++h) {
        for (int c = 0; c < C; ++c) {
          const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[c] + 192));
          const __m256i ql0 = load256(w[c] + 64 * h), ql1 = load256(w[c] + 64 * h + 32);
          const __m256i qh = load256(w[c] + 128 + 32 * h);
          for (int p = 0; p < 4; ++p) {
            // Values 128h + 32p … +31: nibble | 2 high bits << 4, scales 8h + 2p, 8h + 2p + 1.
            const __m256i ql = p % 2 == 0 ? ql0 : ql1;
            const __m256i nibble = p < 2 ? _mm256_and_si256(ql, low4)
                                         : _mm256_and_si256(_mm256_srli_epi16(ql, 4), low4);
            const __m256i bits = p == 0 ? _mm256_and_si256(qh, low2)
                                        : _mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), low2);
            const __m256i q = _mm256_or_si256(nibble, _mm256_slli_epi16(bits, 4));
            const __m256i scale =
                _mm256_cvtepi8_epi16(_mm_shuffle_epi8(sc, _mm_load_si128(shuffles + 4 * h + p)));
            for (int r = 0; r < R; ++r) {
              sum[r][c] =
                  add_in_order(sum[r][c], scaled_dot32(q, load256(a[r] + 128 * h + 32 * p), scale));
            }
          }
        }
      }
      // The +32 bias of every stored value, against q8_K's sums of 16.
      for (int c = 0; c < C; ++c) {
        const __m256i scales16 =
            _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[c] + 192)));
        const __m256 d = _mm256_set1_ps(f16_at(w[c] + 208));
        for (int r = 0; r < R; ++r) {
          const __m256 dx = _mm256_broadcast_ss(reinterpret_cast<const float*>(a[r] - 4));
          const __m256i bias = _mm256_madd_epi16(load256(a[r] + 256), scales16);
          const __m256i lanes = _mm256_sub_epi32(sum[r][c], _mm256_slli_epi32(bias, 5));
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_mul_ps(d, dx), acc[r][c]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_output(t, r, c, acc[r][c]);
  }
};

/// q8_0 against q8_0: per block, |q| as vpmaddubsw's unsigned operand and x with q's sign.
struct Q8_0Tile {
  static constexpr index_t block = 32;
  static constexpr index_t weight_bytes = 34;

  template <int R, int C>
  DISSECT_TARGET_AVX2 static void run(const GgmlTile& t) {
    __m256 acc[R][C];
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1);
    for (index_t b = 0; b < t.blocks; ++b) {
      if (b % 2 == 0) prefetch_weights<R, C>(t.w + b * 34, 64);
      for (int c = 0; c < C; ++c) {
        const std::uint8_t* w = t.w + c * t.w_stride + b * 34;
        const __m256i q = load256(w + 2);
        const __m256i magnitude = _mm256_sign_epi8(q, q);
        const __m256 d = _mm256_set1_ps(f16_at(w));
        for (int r = 0; r < R; ++r) {
          const std::uint8_t* a = t.a + r * t.a_stride + b * 34;
          // |q| ≤ 128, |x| ≤ 127: a pair of products is below 2¹⁵.
          const __m256i dot = _mm256_madd_epi16(
              _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(load256(a + 2), q)), ones);
          const __m256 scale = _mm256_mul_ps(d, _mm256_set1_ps(f16_at(a)));
          acc[r][c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), scale, acc[r][c]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) store_output(t, r, c, acc[r][c]);
  }
};

/// Tile::run<r, c> for an edge tile of r ≤ R rows and c ≤ C columns.
template <class Tile, int R, int C>
DISSECT_TARGET_AVX2 inline void run_tile(int r, int c, const GgmlTile& t) {
  if constexpr (R > 1) {
    if (r < R) return run_tile<Tile, R - 1, C>(r, c, t);
  }
  if constexpr (C > 1) {
    if (c < C) return run_tile<Tile, R, C - 1>(r, c, t);
  }
  Tile::template run<R, C>(t);
}

#endif  // DISSECT_X86

}  // namespace dissect::quant::detail
