// dissect/kernels/detail/vector_math_avx2.hpp — private: e^x, σ and the activations on 8 floats,
// for the epilogue of the AVX2 GEMM (gemm_avx2.hpp).
//
// The lane operations of 8 floats in a ymm register; the functions themselves, their bounds and
// special values are vector_math_body.hpp's, shared with vector_math_avx512.hpp, whose results
// they match bit for bit. AVX2 has no scalef: e^x builds 2^n in two halves
// (scale_by_power_of_2), which rounds the same.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/vector_math_avx2.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/kernels/detail/simd_targets.hpp"
#include "dissect/kernels/detail/vector_math_bounds.hpp"
#include "dissect/tensor/activation.hpp"

#if DISSECT_X86

namespace dissect::kernels::detail::avx2 {

// ---- lane operations, for vector_math_body.hpp --------------------------------------------------

using Vec = __m256;

// set1, zero, add, mul, div, fmadd, fmsub, fnmadd, min and max are the ymm instructions of
// the same names (vector_math_body.hpp writes them from DISSECT_VECTOR_MATH_PS); the rest:

DISSECT_TARGET_AVX2 inline Vec negate(Vec x) {
  return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
}

DISSECT_TARGET_AVX2 inline Vec absolute(Vec x) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}

/// x rounded to the nearest integer, ties to even.
DISSECT_TARGET_AVX2 inline Vec round_nearest(Vec x) {
  return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/// p·2^n for integral n ∈ [−150, 128], rounded once. 2^n alone may not be a float, but 2^⌊n/2⌋
/// and 2^(n − ⌊n/2⌋) are normal, and p·2^⌊n/2⌋ (p ∈ [0.7, 1.5]) is exact.
DISSECT_TARGET_AVX2 inline Vec scale_by_power_of_2(Vec p, Vec n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/// if_negative where x < 0, otherwise (and for NaN) otherwise.
DISSECT_TARGET_AVX2 inline Vec select_negative(Vec x, Vec if_negative, Vec otherwise) {
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(otherwise, if_negative, negative);
}

}  // namespace dissect::kernels::detail::avx2

// exp, sigmoid, relu, silu, gelu_tanh, gelu and activate on __m256.
#define DISSECT_VECTOR_MATH_ISA avx2
#define DISSECT_VECTOR_MATH_PS(op) _mm256_##op##_ps
#define DISSECT_VECTOR_MATH_TARGET DISSECT_TARGET_AVX2
#include "dissect/kernels/detail/vector_math_body.hpp"

#endif  // DISSECT_X86
