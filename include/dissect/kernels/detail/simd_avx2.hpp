// dissect/kernels/detail/simd_avx2.hpp — private: the lane operations of the AVX2 kernels on 8
// floats (__m256), under the names that the kernel bodies written once for both instruction sets
// call (vector_math_body.hpp, gemm_tile_body.hpp, quant/detail/quant_tile_body.hpp).
//
// simd_avx512.hpp is its twin over __m512, operation for operation. Each operation is the one
// intrinsic it stands for, or the few that stand in for an instruction AVX2 lacks (scalef,
// masked lane selection, a horizontal sum): a body inlines them into exactly the instructions it
// would have spelled out itself. Each carries the target attribute, because GCC compiles a
// function's intrinsics for the targets of that function, not of its caller.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/simd_avx2.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/kernels/detail/simd_targets.hpp"

#if DISSECT_X86

namespace dissect::kernels::detail::avx2 {

using vec = __m256;
/// Lanes selected by their sign bit, as maskload and maskstore read them.
using mask = __m256i;
inline constexpr int lanes = 8;

// ---- arithmetic, one rounding each --------------------------------------------------------------

DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 set1(float v) {
  return _mm256_set1_ps(v);
}
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 setzero() {
  return _mm256_setzero_ps();
}
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 add(__m256 a, __m256 b) {
  return _mm256_add_ps(a, b);
}
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 mul(__m256 a, __m256 b) {
  return _mm256_mul_ps(a, b);
}
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 div(__m256 a, __m256 b) {
  return _mm256_div_ps(a, b);
}
/// a·b + c, rounded once.
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 fmadd(__m256 a, __m256 b, __m256 c) {
  return _mm256_fmadd_ps(a, b, c);
}
/// c − a·b, rounded once.
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 fnmadd(__m256 a, __m256 b, __m256 c) {
  return _mm256_fnmadd_ps(a, b, c);
}
/// a·b − c, rounded once.
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 fmsub(__m256 a, __m256 b, __m256 c) {
  return _mm256_fmsub_ps(a, b, c);
}
/// minps: b where either is NaN (and for two zeros).
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 min(__m256 a, __m256 b) {
  return _mm256_min_ps(a, b);
}
/// maxps: b where either is NaN (and for two zeros).
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 max(__m256 a, __m256 b) {
  return _mm256_max_ps(a, b);
}
/// To the nearest integer, ties to even, without raising inexact.
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 round_to_nearest(__m256 x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

// ---- signs and scales ---------------------------------------------------------------------------

DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 negate(__m256 x) {
  return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
}

DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 absolute(__m256 x) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}

/// p·2^n for integral n ∈ [−150, 128], rounded once. AVX2 has no scalef, and 2^n alone may not
/// be a float, but 2^⌊n/2⌋ and 2^(n − ⌊n/2⌋) are normal, and p·2^⌊n/2⌋ (p ∈ [0.7, 1.5]) is
/// exact: the same result as avx512::scale_by_power_of_2. Subnormal results are produced
/// (gradual underflow), unless MXCSR's flush-to-zero is set, which dissect never does.
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 scale_by_power_of_2(__m256 p, __m256 n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/// x < 0 ? negative : otherwise, lane by lane (an ordered compare: NaN lanes take otherwise).
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 select_negative(__m256 x, __m256 negative,
                                                                        __m256 otherwise) {
  return _mm256_blendv_ps(otherwise, negative, _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
}

// ---- memory -------------------------------------------------------------------------------------

DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 load(const float* p) {
  return _mm256_loadu_ps(p);
}
/// *p in every lane.
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 broadcast(const float* p) {
  return _mm256_broadcast_ss(p);
}
/// The first n of 8 lanes, as the mask operand of maskload/maskstore.
/// (Inlined as the compiler sees fit, as when the GEMM headers defined it: so the tiles compile
/// as they did.)
DISSECT_TARGET_AVX2 inline __m256i first_lanes(int n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), lane);
}
/// The lanes of m from p, 0 in the others, which are not read.
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline __m256 masked_load(const float* p, __m256i m) {
  return _mm256_maskload_ps(p, m);
}
/// The lanes of m to p; the others are not written.
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline void masked_store(float* p, __m256i m, __m256 v) {
  _mm256_maskstore_ps(p, m, v);
}

// ---- across lanes -------------------------------------------------------------------------------

/// The sum of the 8 lanes: halves, then pairs, then the last two (3 roundings).
DISSECT_TARGET_AVX2 DISSECT_ALWAYS_INLINE inline float sum_lanes(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace dissect::kernels::detail::avx2

#endif  // DISSECT_X86
