// dissect/quant/detail/quant_kernels_avx2.hpp — PRIVATE: do not include directly
// (quant_kernels.hpp does).
//
// The AVX2 micro-kernels, for x86-64 CPUs without AVX-512: weights widened to fp32 in ymm
// registers, fp32 activations, FMA; a K tail that does not fill a vector is summed in scalar.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/quant_kernels_avx2.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <bit>

#include "dissect/quant/detail/quant_tiles.hpp"

#if DISSECT_X86

namespace dissect::quant::detail {

DISSECT_TARGET_AVX2 inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

template <int MR, int NR>
DISSECT_TARGET_AVX2 inline void zero(__m256 (&acc)[MR][NR]) {
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
#pragma GCC unroll 4
    for (int r = 0; r < NR; ++r) acc[i][r] = _mm256_setzero_ps();
  }
}

/// bf16 and int8 share one tile: 8 weights widened per step, a scalar tail. Widen(p) gives the
/// 8 weights at p as fp32; Scalar(p) one; Scale(n) what row n's sum is multiplied by at the end.
template <class View, class Weights>
struct WidenAvx2 {
  using Args = TileArgs<View>;

  template <int MR, int NR>
  DISSECT_TARGET_AVX2 static void tile(const Args& a, index_t i0, index_t n0, index_t k0,
                                       index_t k1, bool first, bool last) {
    const index_t K = a.w.cols;
    __m256 acc[MR][NR];
    zero(acc);
    index_t k = k0;
    for (; k + 8 <= k1; k += 8) {
      __m256 w[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) w[r] = Weights::widen(Weights::row(a.w, n0 + r) + k);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) {
        const __m256 xv = _mm256_loadu_ps(a.x + (i0 + i) * a.ldx + k);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) acc[i][r] = _mm256_fmadd_ps(xv, w[r], acc[i][r]);
      }
    }
    for (int i = 0; i < MR; ++i) {
      const float* xp = a.x + (i0 + i) * a.ldx;
      for (int r = 0; r < NR; ++r) {
        float sum = sum_lanes(acc[i][r]);
        const auto* wp = Weights::row(a.w, n0 + r);
        for (index_t t = k; t < k1; ++t) sum += xp[t] * Weights::one(wp + t);
        put(a.out, i0 + i, n0 + r, sum * Weights::scale(a.w, n0 + r), first, last);
      }
    }
    (void)K;
  }
};

struct Bf16WidenAvx2 {
  static const std::uint16_t* row(const Bf16WeightsView& w, index_t n) {
    return w.bits + n * w.cols;
  }
  DISSECT_TARGET_AVX2 static __m256 widen(const std::uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static float one(const std::uint16_t* p) { return std::bit_cast<float>(std::uint32_t{*p} << 16); }
  static float scale(const Bf16WeightsView&, index_t) { return 1.0f; }
};

struct Int8WidenAvx2 {
  static const std::int8_t* row(const Int8WeightsView& w, index_t n) {
    return w.values + n * w.cols;
  }
  DISSECT_TARGET_AVX2 static __m256 widen(const std::int8_t* p) {
    return _mm256_cvtepi32_ps(
        _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static float one(const std::int8_t* p) { return static_cast<float>(*p); }
  static float scale(const Int8WeightsView& w, index_t n) { return w.scales[n]; }
};

using Bf16Avx2 = WidenAvx2<Bf16WeightsView, Bf16WidenAvx2>;
using Int8Avx2 = WidenAvx2<Int8WeightsView, Int8WidenAvx2>;

struct Q4Avx2 {
  using Args = TileArgs<Q4WeightsView>;

  template <int MR, int NR>
  DISSECT_TARGET_AVX2 static void tile(const Args& a, index_t i0, index_t n0, index_t k0,
                                       index_t k1, bool first, bool last) {
    const index_t K = a.w.cols, blocks_per_row = K / 32;
    __m256 acc[MR][NR];
    zero(acc);
    const __m256i low4 = _mm256_set1_epi32(0x0f);
    for (index_t kb = k0; kb < k1; kb += 32) {
      // One weight row at a time: its 4 widened vectors stay in registers, 16 ymm are few.
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) {
        const std::uint8_t* p = a.w.nibbles + (n0 + r) * (K / 2) + kb / 2;
        const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        const __m256i q0 = _mm256_cvtepu8_epi32(bytes);                     // bytes 0–7
        const __m256i q1 = _mm256_cvtepu8_epi32(_mm_srli_si128(bytes, 8));  // bytes 8–15
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(a.w.scales[(n0 + r) * blocks_per_row + kb / 32]));
        const __m256 offset = _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
        // (q − 8)·d is exact in fp32, so q·d − 8d in one fma is too.
        const __m256 w0 =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q0, low4)), d, offset);
        const __m256 w1 =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_and_si256(q1, low4)), d, offset);
        const __m256 w2 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q0, 4)), d, offset);
        const __m256 w3 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(q1, 4)), d, offset);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          const float* xp = a.x + (i0 + i) * a.ldx + kb;
          __m256 s = _mm256_fmadd_ps(_mm256_loadu_ps(xp), w0, acc[i][r]);
          s = _mm256_fmadd_ps(_mm256_loadu_ps(xp + 8), w1, s);
          s = _mm256_fmadd_ps(_mm256_loadu_ps(xp + 16), w2, s);
          acc[i][r] = _mm256_fmadd_ps(_mm256_loadu_ps(xp + 24), w3, s);
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      for (int r = 0; r < NR; ++r) put(a.out, i0 + i, n0 + r, sum_lanes(acc[i][r]), first, last);
    }
  }
};

}  // namespace dissect::quant::detail

#endif  // DISSECT_X86
