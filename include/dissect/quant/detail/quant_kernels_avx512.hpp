// dissect/quant/detail/quant_kernels_avx512.hpp — PRIVATE: do not include directly
// (quant_kernels.hpp does).
//
// The AVX-512 micro-kernels: avx512 (weights widened to fp32 in registers, fp32 activations,
// FMA), avx512_vnni (int8 and q4_0 weights against activations quantised to int8 per block of
// 32, vpdpbusd) and avx512_bf16 (bf16 weights against activations rounded to bf16, vdpbf16ps).
// Each tile<MR, NR> computes MR activation rows × NR weight rows over a K range; see
// quant_tiles.hpp for how tiles are laid out and quant_kernels.hpp for the error bounds.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/quant_kernels_avx512.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include "dissect/quant/detail/quant_tiles.hpp"

#if DISSECT_X86

// GCC PR 105593's warnings silenced for these kernels (simd_targets.hpp).
DISSECT_AVX512_WARNINGS_BEGIN

namespace dissect::quant::detail {

// ---- helpers
// -------------------------------------------------------------------------------------

/// The first n lanes (none for n ≤ 0): masked loads of K tails never touch memory past the row.
DISSECT_TARGET_AVX512 inline __mmask16 lanes16(index_t n) {
  return n <= 0 ? __mmask16(0) : n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}
DISSECT_TARGET_AVX512 inline __mmask32 lanes32(index_t n) {
  return n <= 0 ? __mmask32(0) : n >= 32 ? ~__mmask32(0) : __mmask32((1u << n) - 1);
}
DISSECT_TARGET_AVX512 inline __mmask64 lanes64(index_t n) {
  return n <= 0 ? __mmask64(0) : n >= 64 ? ~__mmask64(0) : __mmask64((1ull << n) - 1);
}

/// Asks for the cache line `ahead` bytes past p. A q4_0 row is only K/2 bytes (2 KB at K =
/// 4096), too short for the hardware prefetcher to ramp up on each of a tile's NR streams: asking
/// for the next tile's bytes (NR rows on, contiguous in W) keeps DRAM busy. Integer arithmetic,
/// because the address may lie past the end of W (a prefetch never faults).
DISSECT_TARGET_AVX512 inline void prefetch_ahead(const void* p, index_t ahead) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<std::uintptr_t>(p) +
                                             static_cast<std::uintptr_t>(ahead)),
               _MM_HINT_T0);
}

/// How far ahead a tile of one weight row asks for its bytes: drive runs decode (m = 1) one row
/// at a time for a kernel with one_row_decode, a single sequential stream of W, which the
/// hardware prefetcher follows; 4 KB ahead keeps DRAM busy besides (bench_quant: q4_0 at m = 1
/// from 10 to 17 GB/s with both).
inline constexpr index_t single_stream_prefetch = 4096;

/// Zeroes MR × NR accumulators; GCC keeps the arrays in registers once the loops unroll.
template <int MR, int NR>
DISSECT_TARGET_AVX512 inline void zero(__m512 (&acc)[MR][NR]) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_setzero_ps();
  }
}

// ---- avx512, bf16: shift into fp32, FMA
// ----------------------------------------------------------

/// Rows of x with each block of 32 reordered to its 16 even then 16 odd elements, zero padded to
/// a multiple of 32. A zmm of 32 bf16 weights then widens to fp32 in one instruction per half:
/// the even weights are the 32-bit lanes shifted left by 16, the odd ones the lanes with the low
/// half cleared. Exact: the activations are only moved.
DISSECT_TARGET_AVX512 inline void split_even_odd(const float* x, index_t ldx, index_t m, index_t K,
                                                 float* out, index_t ldo) {
  const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (index_t i = 0; i < m; ++i) {
    const float* row = x + i * ldx;
    float* dst = out + i * ldo;
    for (index_t k = 0; k < ldo; k += 32) {
      const __m512 lo = _mm512_maskz_loadu_ps(lanes16(K - k), row + k);
      const __m512 hi = _mm512_maskz_loadu_ps(lanes16(K - k - 16), row + k + 16);
      _mm512_storeu_ps(dst + k, _mm512_permutex2var_ps(lo, even, hi));
      _mm512_storeu_ps(dst + k + 16, _mm512_permutex2var_ps(lo, odd, hi));
    }
  }
}

struct Bf16Avx512 {
  using Args = TileArgs<Bf16WeightsView>;  // x: split_even_odd rows

  template <int MR, int NR>
  DISSECT_TARGET_AVX512 static void tile(const Args& a, index_t i0, index_t n0, index_t k0,
                                         index_t k1, bool first, bool last) {
    const index_t K = a.w.cols;
    // Small tiles have too few independent FMA chains to cover the latency: give even and odd
    // halves their own accumulators there.
    constexpr bool split = MR * NR <= 8;
    __m512 acc[MR][NR], acc_odd[MR][NR];
    zero(acc);
    zero(acc_odd);
    const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
    for (index_t k = k0; k < k1; k += 32) {
      __m512 even[NR], odd[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const std::uint16_t* p = a.w.bits + (n0 + r) * K + k;
        const __m512i v =
            k + 32 <= K ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(lanes32(K - k), p);
        even[r] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        odd[r] = _mm512_castsi512_ps(_mm512_and_si512(v, high_half));
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const float* xp = a.x + (i0 + i) * a.ldx + k;
        const __m512 xe = _mm512_loadu_ps(xp), xo = _mm512_loadu_ps(xp + 16);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          acc[i][r] = _mm512_fmadd_ps(xe, even[r], acc[i][r]);
          if constexpr (split) {
            acc_odd[i][r] = _mm512_fmadd_ps(xo, odd[r], acc_odd[i][r]);
          } else {
            acc[i][r] = _mm512_fmadd_ps(xo, odd[r], acc[i][r]);
          }
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int r = 0; r < NR; ++r) {
        const __m512 sum = split ? _mm512_add_ps(acc[i][r], acc_odd[i][r]) : acc[i][r];
        put(a.out, i0 + i, n0 + r, _mm512_reduce_add_ps(sum), first, last);
      }
    }
  }
};

// ---- avx512, int8: sign-extend, convert, FMA; the row scale once at the end -----------------

struct Int8Avx512 {
  using Args = TileArgs<Int8WeightsView>;

  template <int MR, int NR>
  DISSECT_TARGET_AVX512 static void tile(const Args& a, index_t i0, index_t n0, index_t k0,
                                         index_t k1, bool first, bool last) {
    const index_t K = a.w.cols;
    __m512 acc[MR][NR];
    zero(acc);
    for (index_t k = k0; k < k1; k += 16) {
      const bool full = k + 16 <= K;
      const __mmask16 mask = lanes16(K - k);
      __m512 w[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const std::int8_t* p = a.w.values + (n0 + r) * K + k;
        const __m128i v = full ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))
                               : _mm_maskz_loadu_epi8(mask, p);
        w[r] = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const float* xp = a.x + (i0 + i) * a.ldx + k;
        const __m512 xv = full ? _mm512_loadu_ps(xp) : _mm512_maskz_loadu_ps(mask, xp);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) acc[i][r] = _mm512_fmadd_ps(xv, w[r], acc[i][r]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int r = 0; r < NR; ++r) {
        const float sum = _mm512_reduce_add_ps(acc[i][r]) * a.w.scales[n0 + r];
        put(a.out, i0 + i, n0 + r, sum, first, last);
      }
    }
  }
};

// ---- avx512, q4_0: unpack nibbles, (q − 8)·d exactly in fp32, FMA -----------------------------

struct Q4Avx512 {
  using Args = TileArgs<Q4WeightsView>;

  template <int MR, int NR>
  DISSECT_TARGET_AVX512 static void tile(const Args& a, index_t i0, index_t n0, index_t k0,
                                         index_t k1, bool first, bool last) {
    const index_t K = a.w.cols, blocks_per_row = K / 32;
    constexpr bool split = MR * NR <= 8;
    __m512 acc[MR][NR], acc_hi[MR][NR];
    zero(acc);
    zero(acc_hi);
    const __m512i low4 = _mm512_set1_epi32(0x0f);
    const __m512 minus8 = _mm512_set1_ps(-8.0f);
    // 16 block scales per conversion; k_chunk (1024) is a multiple of 512, so a K chunk never
    // splits a group.
    for (index_t k = k0; k < k1; k += 512) {
      const int blocks = static_cast<int>(std::min<index_t>(16, (k1 - k) / 32));
      __m512 d16[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const std::uint16_t* s = a.w.scales + (n0 + r) * blocks_per_row + k / 32;
        d16[r] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes16(blocks), s));
      }
      for (int j = 0; j < blocks; ++j) {
        const index_t kb = k + 32 * j;
        const __m512i lane = _mm512_set1_epi32(j);
        __m512 w_lo[NR], w_hi[NR];
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          const std::uint8_t* p = a.w.nibbles + (n0 + r) * (K / 2) + kb / 2;
          const __m512i q =
              _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
          const __m512 d = _mm512_permutexvar_ps(lane, d16[r]);
          const __m512 offset = _mm512_mul_ps(d, minus8);
          // q·d − 8·d with one rounding of an exactly representable (q − 8)·d: exact.
          w_lo[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, low4)), d, offset);
          w_hi[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d, offset);
        }
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const float* xp = a.x + (i0 + i) * a.ldx + kb;
          const __m512 x_lo = _mm512_loadu_ps(xp), x_hi = _mm512_loadu_ps(xp + 16);
#pragma GCC unroll 4
          for (int r = 0; r < NR; ++r) {
            acc[i][r] = _mm512_fmadd_ps(x_lo, w_lo[r], acc[i][r]);
            if constexpr (split) {
              acc_hi[i][r] = _mm512_fmadd_ps(x_hi, w_hi[r], acc_hi[i][r]);
            } else {
              acc[i][r] = _mm512_fmadd_ps(x_hi, w_hi[r], acc[i][r]);
            }
          }
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int r = 0; r < NR; ++r) {
        const __m512 sum = split ? _mm512_add_ps(acc[i][r], acc_hi[i][r]) : acc[i][r];
        put(a.out, i0 + i, n0 + r, _mm512_reduce_add_ps(sum), first, last);
      }
    }
  }
};

// ---- avx512_vnni: activations quantised per block of 32 ----------------------------------------

/// Quantises x[0:n] (n ≤ 32; nothing for n ≤ 0) to int8 with sx = max|x|/127, rounding to
/// nearest (MXCSR's default), into its first and second 16 values; returns sx. |x − sx·q| ≤
/// (sx/2)(1 + 2⁻¹⁴): half a step, plus three fp32 roundings in 127/max, x·that and max/127 on
/// values up to 127 steps.
DISSECT_TARGET_VNNI inline float quantize_block(const float* x, index_t n, __m128i& first16,
                                                __m128i& second16) {
  const __m512 v0 = _mm512_maskz_loadu_ps(lanes16(n), x);
  const __m512 v1 = _mm512_maskz_loadu_ps(lanes16(n - 16), x + 16);
  const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
  const __m512 inverse = _mm512_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
  first16 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v0, inverse)));
  second16 = _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(v1, inverse)));
  return amax / 127.0f;
}

/// int8 layout, per row: Kp = K rounded up to 64 bytes of q + 128 (the unsigned operand of
/// vpdpbusd, block b at b·32), and per 64 of K a vector of 16 scales: sx of the first block in
/// lanes 0–7, of the second in 8–15, matching the int32 lanes vpdpbusd sums 4 bytes into.
DISSECT_TARGET_VNNI inline void quantize_rows_int8(const float* x, index_t ldx, index_t m,
                                                   index_t K, unsigned char* q, index_t ldq,
                                                   float* sx, index_t ldsx) {
  const __m128i bias128 = _mm_set1_epi8(static_cast<char>(0x80));
  for (index_t i = 0; i < m; ++i) {
    for (index_t b = 0; b < ldq / 32; ++b) {
      __m128i lo, hi;
      const float scale = quantize_block(x + i * ldx + b * 32, K - b * 32, lo, hi);
      unsigned char* dst = q + i * ldq + b * 32;
      // q + 128 as unsigned is q with its top bit flipped (q ∈ [−127, 127] gives 1 … 255).
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst), _mm_xor_si128(lo, bias128));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16), _mm_xor_si128(hi, bias128));
      float* lanes = sx + i * ldsx + (b / 2) * 16 + (b % 2) * 8;
      for (int l = 0; l < 8; ++l) lanes[l] = scale;
    }
  }
}

/// q4_0 layout, per group of 128 (blocks 4g … 4g+3), matched to how one 64-byte load of
/// nibbles unpacks: bytes 0–63 hold the first 16 values of each block (block j at 16j, against
/// the low nibbles), bytes 64–127 the last 16 (against the high nibbles). Per group, 16 lanes of
/// sx (block j in lanes 4j … 4j+3) and of −8·Σq over the 8 bytes each lane sums: vpdpbusd
/// started from that gives Σ (w − 8)·q with the nibbles w as the unsigned operand.
DISSECT_TARGET_VNNI inline void quantize_rows_q4(const float* x, index_t ldx, index_t m, index_t K,
                                                 unsigned char* q, index_t ldq, float* sx,
                                                 std::int32_t* corr, index_t ldv) {
  const __m512i eight = _mm512_set1_epi8(8);
  for (index_t i = 0; i < m; ++i) {
    for (index_t g = 0; g < ldq / 128; ++g) {
      unsigned char* dst = q + i * ldq + g * 128;
      for (int j = 0; j < 4; ++j) {
        const index_t b = 4 * g + j;
        __m128i lo, hi;
        const float scale = quantize_block(x + i * ldx + b * 32, K - b * 32, lo, hi);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * j), lo);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 64 + 16 * j), hi);
        for (int l = 0; l < 4; ++l) sx[i * ldv + g * 16 + 4 * j + l] = scale;
      }
      __m512i sum = _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight, _mm512_loadu_si512(dst));
      sum = _mm512_dpbusd_epi32(sum, eight, _mm512_loadu_si512(dst + 64));
      _mm512_storeu_si512(corr + i * ldv + g * 16, _mm512_sub_epi32(_mm512_setzero_si512(), sum));
    }
  }
}

struct Int8Vnni {
  struct Args {
    Int8WeightsView w;
    const unsigned char* q;  // quantize_rows_int8
    index_t ldq;
    const float* sx;
    index_t ldsx;
    Output out;
  };

  template <int MR, int NR>
  DISSECT_TARGET_VNNI static void tile(const Args& a, index_t i0, index_t n0, index_t k0,
                                       index_t k1, bool first, bool last) {
    const index_t K = a.w.cols;
    __m512 acc[MR][NR];
    zero(acc);
    const __m512i c128 = _mm512_set1_epi8(static_cast<char>(0x80));
    const __m512i zero_i = _mm512_setzero_si512();
    for (index_t k = k0; k < k1; k += 64) {
      __m512i w[NR], start[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const std::int8_t* p = a.w.values + (n0 + r) * K + k;
        w[r] = k + 64 <= K ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(lanes64(K - k), p);
        // The activations carry +128: start each lane at −128·Σ of its 4 weights (the padding
        // past K is zero on both sides, so it adds nothing either way).
        start[r] = _mm512_sub_epi32(zero_i, _mm512_dpbusd_epi32(zero_i, c128, w[r]));
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512i xq = _mm512_loadu_si512(a.q + (i0 + i) * a.ldq + k);
        const __m512 scale = _mm512_loadu_ps(a.sx + (i0 + i) * a.ldsx + k / 4);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          const __m512i dot = _mm512_dpbusd_epi32(start[r], xq, w[r]);  // exact: |dot| < 2^17
          acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), scale, acc[i][r]);
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int r = 0; r < NR; ++r) {
        const float sum = _mm512_reduce_add_ps(acc[i][r]) * a.w.scales[n0 + r];
        put(a.out, i0 + i, n0 + r, sum, first, last);
      }
    }
  }
};

struct Q4Vnni {
  static constexpr bool one_row_decode = true;  // quant_tiles.hpp
  struct Args {
    Q4WeightsView w;
    const unsigned char* q;  // quantize_rows_q4
    index_t ldq;
    const float* sx;
    const std::int32_t* corr;
    index_t ldv;
    Output out;
  };

  template <int MR, int NR>
  DISSECT_TARGET_VNNI static void tile(const Args& a, index_t i0, index_t n0, index_t k0,
                                       index_t k1, bool first, bool last) {
    const index_t K = a.w.cols, blocks_per_row = K / 32;
    __m512 acc[MR][NR];
    zero(acc);
    const __m512i low4 = _mm512_set1_epi8(0x0f);
    const __m512i repeat4 = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    // Nibble bytes ahead (the scales: an eighth of that): the next tile, or for one weight row
    // (decode, a single stream) single_stream_prefetch.
    const index_t ahead = NR == 1 ? single_stream_prefetch : NR * (K / 2);
    for (index_t k = k0; k < k1; k += 128) {
      const index_t blocks = std::min<index_t>(4, (K - k) / 32);
      __m512i lo[NR], hi[NR];
      __m512 d[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        // 4 blocks in one load: low nibbles are each block's first 16 weights, high its last 16.
        const std::uint8_t* p = a.w.nibbles + (n0 + r) * (K / 2) + k / 2;
        prefetch_ahead(p, ahead);
        const __m512i v =
            blocks == 4 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(lanes64(16 * blocks), p);
        lo[r] = _mm512_and_si512(v, low4);
        hi[r] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        const std::uint16_t* s = a.w.scales + (n0 + r) * blocks_per_row + k / 32;
        if ((k / 128) % 8 == 0) prefetch_ahead(s, ahead / 8);  // a line per 8 steps
        const __m128i s4 = blocks == 4 ? _mm_loadl_epi64(reinterpret_cast<const __m128i*>(s))
                                       : _mm_maskz_loadu_epi16(__mmask8((1u << blocks) - 1), s);
        d[r] = _mm512_permutexvar_ps(repeat4, _mm512_zextps128_ps512(_mm_cvtph_ps(s4)));
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const unsigned char* xp = a.q + (i0 + i) * a.ldq + k;
        const __m512i x_first = _mm512_loadu_si512(xp), x_second = _mm512_loadu_si512(xp + 64);
        const index_t v = (i0 + i) * a.ldv + (k / 128) * 16;
        const __m512 sx = _mm512_loadu_ps(a.sx + v);
        const __m512i start = _mm512_loadu_si512(a.corr + v);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          __m512i dot = _mm512_dpbusd_epi32(start, lo[r], x_first);
          dot = _mm512_dpbusd_epi32(dot, hi[r], x_second);  // exact: |dot| < 2^13
          acc[i][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(sx, d[r]), acc[i][r]);
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int r = 0; r < NR; ++r) {
        put(a.out, i0 + i, n0 + r, _mm512_reduce_add_ps(acc[i][r]), first, last);
      }
    }
  }
};

// ---- avx512_bf16: activations rounded to bf16, vdpbf16ps ---------------------------------------

/// Rows of x rounded to bf16 (nearest even; the instruction flushes fp32 subnormals to zero),
/// zero padded to a multiple of 32.
DISSECT_TARGET_BF16 inline void round_rows_bf16(const float* x, index_t ldx, index_t m, index_t K,
                                                std::uint16_t* out, index_t ldo) {
  for (index_t i = 0; i < m; ++i) {
    for (index_t k = 0; k < ldo; k += 16) {
      const __m512 v = _mm512_maskz_loadu_ps(lanes16(K - k), x + i * ldx + k);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i * ldo + k),
                          reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(v)));
    }
  }
}

struct Bf16Dot {
  static constexpr bool one_row_decode = true;            // quant_tiles.hpp
  using Args = TileArgs<Bf16WeightsView, std::uint16_t>;  // x: round_rows_bf16 rows

  template <int MR, int NR>
  DISSECT_TARGET_BF16 static void tile(const Args& a, index_t i0, index_t n0, index_t k0,
                                       index_t k1, bool first, bool last) {
    const index_t K = a.w.cols;
    __m512 acc[MR][NR];
    zero(acc);
    for (index_t k = k0; k < k1; k += 32) {
      __m512i w[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const std::uint16_t* p = a.w.bits + (n0 + r) * K + k;
        w[r] = k + 32 <= K ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(lanes32(K - k), p);
      }
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m512i xv = _mm512_loadu_si512(a.x + (i0 + i) * a.ldx + k);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          acc[i][r] = _mm512_dpbf16_ps(acc[i][r], reinterpret_cast<__m512bh>(xv),
                                       reinterpret_cast<__m512bh>(w[r]));
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int r = 0; r < NR; ++r) {
        put(a.out, i0 + i, n0 + r, _mm512_reduce_add_ps(acc[i][r]), first, last);
      }
    }
  }
};

// ---- entry points: prepare the activations once, then tile
// ---------------------------------------

inline void bf16_avx512(const Bf16WeightsView& w, const float* x, index_t ldx, index_t m,
                        const Output& out, int threads) {
  const index_t ld = round_up(w.cols, 32);
  auto* xs = reinterpret_cast<float*>(scratch(static_cast<std::size_t>(m * ld) * sizeof(float)));
  split_even_odd(x, ldx, m, w.cols, xs, ld);
  drive<Bf16Avx512>({w, xs, ld, out}, m, w.rows, w.cols, threads);
}

inline void bf16_dot(const Bf16WeightsView& w, const float* x, index_t ldx, index_t m,
                     const Output& out, int threads) {
  const index_t ld = round_up(w.cols, 32);
  auto* xb = reinterpret_cast<std::uint16_t*>(
      scratch(static_cast<std::size_t>(m * ld) * sizeof(std::uint16_t)));
  round_rows_bf16(x, ldx, m, w.cols, xb, ld);
  drive<Bf16Dot>({w, xb, ld, out}, m, w.rows, w.cols, threads);
}

inline void int8_vnni(const Int8WeightsView& w, const float* x, index_t ldx, index_t m,
                      const Output& out, int threads) {
  const index_t ldq = round_up(w.cols, 64), ldsx = ldq / 4;
  unsigned char* q = scratch(static_cast<std::size_t>(m * (ldq + ldsx * 4)));
  auto* sx = reinterpret_cast<float*>(q + m * ldq);
  quantize_rows_int8(x, ldx, m, w.cols, q, ldq, sx, ldsx);
  drive<Int8Vnni>({w, q, ldq, sx, ldsx, out}, m, w.rows, w.cols, threads);
}

inline void q4_vnni(const Q4WeightsView& w, const float* x, index_t ldx, index_t m,
                    const Output& out, int threads) {
  const index_t ldq = round_up(w.cols, 128), ldv = ldq / 8;
  unsigned char* q = scratch(static_cast<std::size_t>(m * (ldq + 2 * ldv * 4)));
  auto* sx = reinterpret_cast<float*>(q + m * ldq);
  auto* corr = reinterpret_cast<std::int32_t*>(q + m * ldq + m * ldv * 4);
  quantize_rows_q4(x, ldx, m, w.cols, q, ldq, sx, corr, ldv);
  drive<Q4Vnni>({w, q, ldq, sx, corr, ldv, out}, m, w.rows, w.cols, threads);
}

}  // namespace dissect::quant::detail

DISSECT_AVX512_WARNINGS_END

#endif  // DISSECT_X86
