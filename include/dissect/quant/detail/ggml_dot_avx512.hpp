// dissect/quant/detail/ggml_dot_avx512.hpp — PRIVATE: include dissect/quant/weight_format.hpp.
//
// ggml's blocks (q8_0, q4_K, q5_K, q6_K, tq2_0) on AVX-512 with VNNI: the same integer sums as the
// avx2 path of ggml_dot.hpp, arranged for prefill. The avx2 path decodes a weight block (nibbles,
// fifth/sixth bits, the packed 6-bit scales, the fp16 scales) again for every activation row;
// here each weight block is decoded once into registers and multiplied against
// ggml_tile_rows activation rows, so at m = 128 the decoding is paid 32 times per weight
// instead of 128.
//
// A decoded K-quant super-block is
//   q[c]      levels 64c … 64c+63, unsigned (q4_K 0–15, q5_K 0–31, q6_K 0–63 with its +32 bias)
//   scale[c]  one int16 per pair of levels: its group's scale (groups of 32 for q4_K/q5_K,
//             16 for q6_K), so vpmaddubsw then vpmaddwd give Σ_g sc_g·Σ q·x̃ in int32 lanes
//   offset    one int16 per group of 16, the coefficient of q8_K's sum of those 16 x̃:
//             the min m_j for q4_K/q5_K (scaled by dmin), 32·sc_g for q6_K (scaled by d, so it
//             is subtracted in the integer sum, exactly as the avx2 path does)
// Exact in int32: a vpmaddubsw pair is at most 2·63·128 < 2¹⁵, a lane after vpmaddwd and the
// four chunks at most 4·2·2¹⁴·128 < 2²⁴, so the conversion to float is exact too.
//
// q8_0 runs on vpdpbusd, which wants one unsigned operand: the activations are stored as
// x̃ + 128 (u8) and each weight pair of blocks carries −128·Σq per lane as the accumulator's
// starting value, so every lane ends at Σ q·x̃ exactly. A pair of blocks is interleaved by
// 4 bytes (dword j of the first block in lane 2j, of the second in lane 2j + 1), so the two
// blocks' scales form one 64-bit broadcast. An activation row is, per pair, 64 bytes of x̃ + 128
// in that order, then per pair the two fp32 scales; an odd last block is padded with x̃ = 0 and
// scale 0. 1.125 bytes per value: eight rows of K = 5632 stay in L1.
//
// tq2_0 runs on vpdpbusd directly: its codes are unsigned (0, 1, 2) and q8_K's x̃ signed, which
// is the operand order vpdpbusd wants. A block's 64 code bytes become four vectors, one per
// 64 values of x̃ (values 64c … 64c+63: the 32 bytes of half c/2, shifted by 4·(c%2) in the low
// 256 bits and by 4·(c%2) + 2 in the high), decoded once for ggml_tile_rows activation rows.
// Four vpdpbusd leave, in dword t, the products of code bytes 4(t%8) … 4(t%8)+3; folding the two
// 256-bit halves and taking off q8_K's sums 2k and 2k+1 gives exactly the avx2 path's int32
// lane k, which is then scaled and accumulated in the same float lanes, by the same fused
// multiply-add, and summed by the same horizontal sum: tq2_0's two integer paths agree bit for
// bit (tests/test_tq2_0.cpp), not merely within a bound.
//
// The error bound of the other formats is the avx2 path's (ggml_dot.hpp): only the order of the
// float additions per block differs.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/ggml_dot_avx512.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <cstdint>
#include <cstring>

#include "dissect/quant/detail/ggml_gemm_vnni.hpp"
#include "dissect/quant/detail/ggml_gemv_vnni.hpp"
#include "dissect/quant/detail/quant_tiles.hpp"
#include "dissect/quant/format.hpp"

#if DISSECT_X86

// GCC PR 105593's warnings silenced for these kernels (simd_targets.hpp).
DISSECT_AVX512_WARNINGS_BEGIN

namespace dissect::quant::detail {

/// Activation rows that share one decoded weight block. Four rows of q8_K activations at
/// K = 5632 (26 KB) stay in L1 while a task's weight rows pass them.
inline constexpr int ggml_tile_rows = 8;

/// Bytes of one activation row of the q8_0 VNNI layout (see the header comment).
inline constexpr index_t q8_0_vnni_row_bytes(index_t K) {
  return (K / 32 + 1) / 2 * 72;
}

struct DecodedSuperBlock {
  __m512i q[4];
  __m512i scale[4];
  __m256i offset;
  float d = 0, dmin = 0;
};

/// vpermw indices: lane i of chunk c takes the scale of its group.
struct ScaleIndices {
  alignas(64) std::int16_t affine[4][32];  // q4_K, q5_K: groups of 32 → 2c + (i ≥ 16)
  alignas(64) std::int16_t q6[4][32];      // q6_K: groups of 16 → 4c + i/8
  alignas(64) std::int16_t mins[32];       // group of 16 g → sub-block g/2
  constexpr ScaleIndices() : affine{}, q6{}, mins{} {
    for (int c = 0; c < 4; ++c) {
      for (int i = 0; i < 32; ++i) {
        affine[c][i] = static_cast<std::int16_t>(2 * c + (i >= 16));
        q6[c][i] = static_cast<std::int16_t>(4 * c + i / 8);
      }
    }
    for (int i = 0; i < 32; ++i) mins[i] = static_cast<std::int16_t>(i / 2);
  }
};
inline constexpr ScaleIndices scale_indices{};

DISSECT_TARGET_VNNI inline __m512i load_index(const std::int16_t* p) {
  return _mm512_load_si512(p);
}

DISSECT_TARGET_VNNI inline float f16_value(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

/// One q4_K or q5_K super-block (ggml_block_codecs.hpp's layouts) into registers.
template <bool five_bit>
DISSECT_TARGET_VNNI inline void decode_affine_K(const std::uint8_t* w, DecodedSuperBlock& out) {
  out.d = f16_value(w);
  out.dmin = f16_value(w + 2);
  alignas(8) std::uint8_t sc[8], mins[8];
  unpack_scales_and_mins(w + 4, sc, mins);
  const __m512i sc16 = _mm512_castsi128_si512(
      _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc))));
  const __m512i min16 = _mm512_castsi128_si512(
      _mm_cvtepu8_epi16(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mins))));
  out.offset =
      _mm512_castsi512_si256(_mm512_permutexvar_epi16(load_index(scale_indices.mins), min16));
  const std::uint8_t* qs = w + (five_bit ? 48 : 16);
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  // The 32 bytes of chunk c in both halves; the upper half shifted to its high nibbles.
  constexpr __mmask32 upper_half = 0xffff0000u;
  [[maybe_unused]] __m512i high;
  if constexpr (five_bit) {
    high = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16)));
  }
  for (int c = 0; c < 4; ++c) {
    const __m512i v =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * c)));
    __m512i q = _mm512_and_si512(_mm512_mask_srli_epi16(v, upper_half, v, 4), low4);
    if constexpr (five_bit) {
      // Bit 2c of qh byte l is the fifth bit of value 64c + l, bit 2c + 1 that of 64c + 32 + l.
      const __m512i shift =
          _mm512_mask_blend_epi16(upper_half, _mm512_set1_epi16(static_cast<short>(2 * c)),
                                  _mm512_set1_epi16(static_cast<short>(2 * c + 1)));
      const __m512i bit = _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(high, shift), 4),
                                           _mm512_set1_epi8(0x10));
      q = _mm512_or_si512(q, bit);
    }
    out.q[c] = q;
    out.scale[c] = _mm512_permutexvar_epi16(load_index(scale_indices.affine[c]), sc16);
  }
}

/// One q6_K super-block into registers.
DISSECT_TARGET_VNNI inline void decode_q6_K(const std::uint8_t* w, DecodedSuperBlock& out) {
  out.d = f16_value(w + 208);
  const __m256i sc16 =
      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 192)));
  out.offset = _mm256_slli_epi16(sc16, 5);  // 32·sc, |·| ≤ 4096
  const __m512i sc512 = _mm512_castsi256_si512(sc16);
  const __m512i low4 = _mm512_set1_epi8(0x0f), top2 = _mm512_set1_epi8(0x30);
  constexpr __mmask32 upper_half = 0xffff0000u;
  for (int h = 0; h < 2; ++h) {
    // Values 128h + 32p + l: p = 0, 1 low nibbles of ql[64h + 32(p%2) + l], p = 2, 3 the high
    // ones; the two top bits are bits 2p, 2p+1 of qh[32h + l].
    const __m512i ql = _mm512_loadu_si512(w + 64 * h);
    const __m512i qh = _mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 128 + 32 * h)));
    for (int half = 0; half < 2; ++half) {
      const __m512i nibbles =
          half == 0 ? _mm512_and_si512(ql, low4) : _mm512_and_si512(_mm512_srli_epi16(ql, 4), low4);
      const __m512i shift =
          _mm512_mask_blend_epi16(upper_half, _mm512_set1_epi16(static_cast<short>(4 * half)),
                                  _mm512_set1_epi16(static_cast<short>(4 * half + 2)));
      const __m512i bits =
          _mm512_and_si512(_mm512_slli_epi16(_mm512_srlv_epi16(qh, shift), 4), top2);
      const int c = 2 * h + half;
      out.q[c] = _mm512_or_si512(nibbles, bits);
      out.scale[c] = _mm512_permutexvar_epi16(load_index(scale_indices.q6[c]), sc512);
    }
  }
}

/// Σ over one super-block of ŵ·x̃ for R activation rows (q8_K blocks at a + r·stride), each
/// added to acc[r] scaled by d·dx (and the mins by dmin·dx).
template <WeightFormat F, int R>
DISSECT_TARGET_VNNI inline void super_block_dots(const DecodedSuperBlock& w, const std::uint8_t* a,
                                                 index_t stride, __m512 (&acc)[R]) {
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const std::uint8_t* x = a + r * stride;
    float dx;
    std::memcpy(&dx, x, 4);
    __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int c = 0; c < 4; ++c) {
      const __m512i xc = _mm512_loadu_si512(x + 4 + 64 * c);
      sum = _mm512_add_epi32(sum, _mm512_madd_epi16(_mm512_maddubs_epi16(w.q[c], xc), w.scale[c]));
    }
    const __m512i offset = _mm512_zextsi256_si512(_mm256_madd_epi16(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 4 + 256)), w.offset));
    if constexpr (F == WeightFormat::q6_K) {
      sum = _mm512_sub_epi32(sum, offset);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(w.d * dx), acc[r]);
    } else {
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(w.d * dx), acc[r]);
      acc[r] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(offset), _mm512_set1_ps(w.dmin * dx), acc[r]);
    }
  }
}

/// One weight row of K-quant blocks against R activation rows of q8_K blocks: sums[r].
template <WeightFormat F, int R>
DISSECT_TARGET_VNNI inline void k_quant_tile(const std::uint8_t* w, index_t blocks,
                                             const std::uint8_t* a, index_t stride, float* sums) {
  constexpr index_t weight_bytes = F == WeightFormat::q4_K   ? 144
                                   : F == WeightFormat::q5_K ? 176
                                                             : 210;
  constexpr index_t activation_bytes = 292;
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  DecodedSuperBlock block;
  for (index_t b = 0; b < blocks; ++b) {
    if constexpr (F == WeightFormat::q6_K) {
      decode_q6_K(w + b * weight_bytes, block);
    } else {
      decode_affine_K<F == WeightFormat::q5_K>(w + b * weight_bytes, block);
    }
    super_block_dots<F, R>(block, a + b * activation_bytes, stride, acc);
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) sums[r] = _mm512_reduce_add_ps(acc[r]);
}

/// Two fp32 values in every pair of lanes: [a, b, a, b, …], from one 64-bit broadcast.
DISSECT_TARGET_VNNI inline __m512 alternate(float a, float b) {
  const float pair[2] = {a, b};
  double both;
  std::memcpy(&both, pair, 8);
  return _mm512_castpd_ps(_mm512_set1_pd(both));
}

/// One weight row of q8_0 blocks against R activation rows in the VNNI layout: sums[r].
template <int R>
DISSECT_TARGET_VNNI inline void q8_0_tile(const std::uint8_t* w, index_t blocks,
                                          const std::uint8_t* a, index_t stride, float* sums) {
  const index_t pairs = (blocks + 1) / 2;
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i ones = _mm512_set1_epi8(1);
  // Dword j of the first block to lane 2j, of the second to lane 2j + 1.
  const __m512i interleave =
      _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
  for (index_t p = 0; p < pairs; ++p) {
    const std::uint8_t* wb = w + 2 * p * 34;
    prefetch_ahead(wb, single_stream_prefetch);  // rows follow rows: one stream (prefetch_ahead)
    const bool second = 2 * p + 1 < blocks;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 2));
    const __m256i hi = second ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 36))
                              : _mm256_setzero_si256();
    const __m512i q = _mm512_permutex2var_epi32(_mm512_castsi256_si512(lo), interleave,
                                                _mm512_castsi256_si512(hi));
    // −128·Σq over each lane's four weights: what the +128 of the activations adds.
    const __m512i start = _mm512_sub_epi32(
        _mm512_setzero_si512(),
        _mm512_slli_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q), 7));
    const __m512 scale = alternate(f16_value(wb), second ? f16_value(wb + 34) : 0.0f);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* x = a + r * stride;
      const __m512i sum = _mm512_dpbusd_epi32(start, _mm512_loadu_si512(x + 64 * p), q);
      double dx;
      std::memcpy(&dx, x + pairs * 64 + 8 * p, 8);
      const __m512 dx2 = _mm512_castpd_ps(_mm512_set1_pd(dx));
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(scale, dx2), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) sums[r] = _mm512_reduce_add_ps(acc[r]);
}

/// q8_0 activations (ggml's rule, via quantize_q8_0) moved into the VNNI layout.
DISSECT_TARGET_VNNI inline void quantize_q8_0_vnni(const float* x, index_t ldx, index_t m,
                                                   index_t K, std::uint8_t* out) {
  const index_t blocks = K / 32, pairs = (blocks + 1) / 2, row_bytes = q8_0_vnni_row_bytes(K);
  std::uint8_t block[34];
  for (index_t i = 0; i < m; ++i) {
    std::uint8_t* row = out + i * row_bytes;
    auto* scales = reinterpret_cast<float*>(row + pairs * 64);
    std::memset(row, 0x80, std::size_t(row_bytes));
    std::memset(scales, 0, std::size_t(pairs * 8));
    for (index_t b = 0; b < blocks; ++b) {
      dissect::detail::ggml::quantize_q8_0(x + i * ldx + b * 32, block);
      std::uint8_t* pair = row + (b / 2) * 64;
      for (int k = 0; k < 32; ++k) {
        pair[(2 * (k / 4) + b % 2) * 4 + k % 4] = static_cast<std::uint8_t>(block[2 + k] ^ 0x80);
      }
      scales[b] = f16_value(block);
    }
  }
}

/// One weight row of tq2_0 blocks against R activation rows of q8_K blocks: sums[r], bit for bit
/// what dot_tq2_0_row (ggml_dot.hpp) returns for each row (see the header comment).
template <int R>
DISSECT_TARGET_VNNI inline void tq2_0_tile(const std::uint8_t* w, index_t blocks,
                                           const std::uint8_t* a, index_t stride, float* sums) {
  constexpr index_t weight_bytes = 66, activation_bytes = 292;
  constexpr __mmask32 upper_half = 0xffff0000u;
  const __m512i three = _mm512_set1_epi8(3);
  // Per 16-bit lane: shift the low 256 bits by 4·(c%2), the high by 4·(c%2) + 2.
  const __m512i shift[2] = {
      _mm512_mask_blend_epi16(upper_half, _mm512_set1_epi16(0), _mm512_set1_epi16(2)),
      _mm512_mask_blend_epi16(upper_half, _mm512_set1_epi16(4), _mm512_set1_epi16(6))};
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  for (index_t b = 0; b < blocks; ++b) {
    const std::uint8_t* wb = w + b * weight_bytes;
    __m512i q[4];
    for (int h = 0; h < 2; ++h) {
      const __m512i codes =
          _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wb + 32 * h)));
      q[2 * h] = _mm512_and_si512(_mm512_srlv_epi16(codes, shift[0]), three);
      q[2 * h + 1] = _mm512_and_si512(_mm512_srlv_epi16(codes, shift[1]), three);
    }
    const float d = f16_value(wb + 64);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const std::uint8_t* x = a + r * stride + b * activation_bytes;
      float dx;
      std::memcpy(&dx, x, 4);
      __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c)
        sum = _mm512_dpbusd_epi32(sum, q[c], _mm512_loadu_si512(x + 4 + 64 * c));
      // Dwords t and t + 8 are avx2 lane t's two halves; its +1 bias is q8_K's sums 2t, 2t + 1.
      __m256i lanes =
          _mm256_add_epi32(_mm512_castsi512_si256(sum), _mm512_extracti64x4_epi64(sum, 1));
      lanes = _mm256_sub_epi32(
          lanes, _mm256_madd_epi16(
                     _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 4 + 256)), ones));
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(d * dx), acc[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) sums[r] = hsum_f32(acc[r]);
}

/// Sums of one weight row against r ≤ ggml_tile_rows activation rows, r chosen at run time.
template <WeightFormat F, int R = 1>
inline void ggml_tile(int r, const std::uint8_t* w, index_t blocks, const std::uint8_t* a,
                      index_t stride, float* sums) {
  if constexpr (R < ggml_tile_rows) {
    if (r != R) {
      ggml_tile<F, R + 1>(r, w, blocks, a, stride, sums);
      return;
    }
  }
  if constexpr (F == WeightFormat::q8_0) {
    q8_0_tile<R>(w, blocks, a, stride, sums);
  } else if constexpr (F == WeightFormat::tq2_0) {
    tq2_0_tile<R>(w, blocks, a, stride, sums);
  } else {
    k_quant_tile<F, R>(w, blocks, a, stride, sums);
  }
}

/// y = x̂·Ŵᵀ (+ b) for W in format F, the m activation rows already quantised (stride bytes
/// apart): each task's weight rows meet the activations ggml_tile_rows rows at a time, so a
/// tile of activations (≤ 50 KB at K = 5632) is reused from L1/L2 by four weight rows.
template <WeightFormat F>
inline void ggml_avx512_rows(const GgmlWeightsView& w, const std::uint8_t* a, index_t stride,
                             index_t m, float* y, index_t ldy, const float* bias, int threads) {
  const index_t blocks = w.cols / (F == WeightFormat::q8_0 ? 32 : 256);
  const index_t row_bytes = ggml_row_bytes(ggml_type_of(F), w.cols);
  for_each_weight_task(w, threads, [&](index_t n0, index_t n1) {
    float sums[ggml_tile_rows];
    for (index_t i0 = 0; i0 < m; i0 += ggml_tile_rows) {
      const int r = static_cast<int>(std::min<index_t>(ggml_tile_rows, m - i0));
      for (index_t n = n0; n < n1; ++n) {
        ggml_tile<F>(r, w.blocks + n * row_bytes, blocks, a + i0 * stride, stride, sums);
        for (int j = 0; j < r; ++j) y[(i0 + j) * ldy + n] = bias ? sums[j] + bias[n] : sums[j];
      }
    }
  });
}

/// The avx512_vnni path of ggml_matmul (shapes already checked there): the K-quants' GEMV rows up
/// to ggml_gemv_max_rows rows (ggml_gemv_vnni.hpp), the 8-row tiles below
/// ggml_vnni_gemm_min_rows and the packed GEMM from there on (ggml_gemm_vnni.hpp), except tq2_0,
/// whose tiles reproduce the avx2 path bit for bit at every m.
inline void ggml_avx512_matmul(const GgmlWeightsView& w, const float* x, index_t ldx, index_t m,
                               float* y, index_t ldy, const float* bias, int threads) {
  const index_t K = w.cols;
  if (m >= ggml_vnni_gemm_min_rows && w.format != WeightFormat::tq2_0) {
    ggml_vnni_gemm(w, x, ldx, m, y, ldy, bias, threads);
    return;
  }
  if (w.format == WeightFormat::q8_0) {
    const index_t stride = q8_0_vnni_row_bytes(K);
    auto* a = reinterpret_cast<std::uint8_t*>(scratch(std::size_t(m * stride)));
    quantize_q8_0_vnni(x, ldx, m, K, a);
    ggml_avx512_rows<WeightFormat::q8_0>(w, a, stride, m, y, ldy, bias, threads);
    return;
  }
  const index_t stride = ggml_row_bytes(GgmlType::q8_K, K);
  auto* a = reinterpret_cast<std::uint8_t*>(scratch(std::size_t(m * stride)));
  quantize_ggml_activations(w.format, x, ldx, m, K, a);
  if (m <= ggml_gemv_max_rows) {
    switch (w.format) {
      case WeightFormat::q4_K:
        return k_quant_gemv<WeightFormat::q4_K>(w, a, stride, m, y, ldy, bias, threads);
      case WeightFormat::q5_K:
        return k_quant_gemv<WeightFormat::q5_K>(w, a, stride, m, y, ldy, bias, threads);
      case WeightFormat::q6_K:
        return k_quant_gemv<WeightFormat::q6_K>(w, a, stride, m, y, ldy, bias, threads);
      default:
        break;  // tq2_0: its tiles, bit for bit the avx2 path's
    }
  }
  switch (w.format) {
    case WeightFormat::q4_K:
      ggml_avx512_rows<WeightFormat::q4_K>(w, a, stride, m, y, ldy, bias, threads);
      return;
    case WeightFormat::q5_K:
      ggml_avx512_rows<WeightFormat::q5_K>(w, a, stride, m, y, ldy, bias, threads);
      return;
    case WeightFormat::tq2_0:
      ggml_avx512_rows<WeightFormat::tq2_0>(w, a, stride, m, y, ldy, bias, threads);
      return;
    default:
      ggml_avx512_rows<WeightFormat::q6_K>(w, a, stride, m, y, ldy, bias, threads);
      return;
  }
}

}  // namespace dissect::quant::detail

DISSECT_AVX512_WARNINGS_END

#endif  // DISSECT_X86
