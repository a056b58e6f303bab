// dissect/kernels/detail/simd_avx512.hpp — private: the lane operations of the AVX-512 kernels on
// 16 floats (__m512), under the names that the kernel bodies written once for both instruction
// sets call (vector_math_body.hpp, gemm_tile_body.hpp, quant/detail/quant_tile_body.hpp).
//
// The twin of simd_avx2.hpp, operation for operation; see there. Each operation is the one
// intrinsic it stands for and carries the target attribute its intrinsic needs. The GCC 12
// (maybe-)uninitialized pragmas are not needed here: the operations are always inlined, and the
// headers whose functions inline them carry the pragmas.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/simd_avx512.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/kernels/detail/simd_targets.hpp"

#if DISSECT_X86

namespace dissect::kernels::detail::avx512 {

using vec = __m512;
using mask = __mmask16;
inline constexpr int lanes = 16;

// ---- arithmetic, one rounding each --------------------------------------------------------------

DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 set1(float v) {
  return _mm512_set1_ps(v);
}
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 setzero() {
  return _mm512_setzero_ps();
}
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 add(__m512 a, __m512 b) {
  return _mm512_add_ps(a, b);
}
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 mul(__m512 a, __m512 b) {
  return _mm512_mul_ps(a, b);
}
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 div(__m512 a, __m512 b) {
  return _mm512_div_ps(a, b);
}
/// a·b + c, rounded once.
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 fmadd(__m512 a, __m512 b, __m512 c) {
  return _mm512_fmadd_ps(a, b, c);
}
/// c − a·b, rounded once.
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 fnmadd(__m512 a, __m512 b, __m512 c) {
  return _mm512_fnmadd_ps(a, b, c);
}
/// a·b − c, rounded once.
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 fmsub(__m512 a, __m512 b, __m512 c) {
  return _mm512_fmsub_ps(a, b, c);
}
/// minps: b where either is NaN (and for two zeros).
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 min(__m512 a, __m512 b) {
  return _mm512_min_ps(a, b);
}
/// maxps: b where either is NaN (and for two zeros).
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 max(__m512 a, __m512 b) {
  return _mm512_max_ps(a, b);
}
/// To the nearest integer, ties to even, without raising inexact.
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 round_to_nearest(__m512 x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// ---- signs and scales ---------------------------------------------------------------------------

DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 negate(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u))));
}

DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 absolute(__m512 x) {
  return _mm512_abs_ps(x);
}

/// p·2^n for integral n ∈ [−150, 128] (scalef). One rounding, into the subnormals if need be:
/// n = 128 or −150 needs no 2^n of its own. Subnormal results are produced (gradual underflow),
/// unless MXCSR's flush-to-zero is set, which dissect never does.
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 scale_by_power_of_2(__m512 p, __m512 n) {
  return _mm512_scalef_ps(p, n);
}

/// x < 0 ? negative : otherwise, lane by lane (an ordered compare: NaN lanes take otherwise).
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 select_negative(__m512 x, __m512 negative,
                                                                          __m512 otherwise) {
  return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), otherwise,
                              negative);
}

// ---- memory -------------------------------------------------------------------------------------

DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 load(const float* p) {
  return _mm512_loadu_ps(p);
}
/// *p in every lane.
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 broadcast(const float* p) {
  return _mm512_set1_ps(*p);
}
/// The first n of 16 lanes (none for n ≤ 0).
/// (Inlined as the compiler sees fit, as when the GEMM headers defined it: so the tiles compile
/// as they did.)
DISSECT_TARGET_AVX512 inline __mmask16 first_lanes(int n) {
  return n <= 0 ? __mmask16(0) : n >= 16 ? __mmask16(0xffff) : __mmask16((1u << n) - 1);
}
/// The lanes of m from p, 0 in the others, which are not read.
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline __m512 masked_load(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
/// The lanes of m to p; the others are not written.
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline void masked_store(float* p, __mmask16 m,
                                                                     __m512 v) {
  _mm512_mask_storeu_ps(p, m, v);
}

// ---- across lanes -------------------------------------------------------------------------------

/// The sum of the 16 lanes, by halves (4 roundings).
DISSECT_TARGET_AVX512 DISSECT_ALWAYS_INLINE inline float sum_lanes(__m512 v) {
  return _mm512_reduce_add_ps(v);
}

}  // namespace dissect::kernels::detail::avx512

#endif  // DISSECT_X86
