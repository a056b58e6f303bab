// dissect/kernels/detail/vector_math_avx512.hpp — private: e^x, σ and the activations on 16
// floats, for the epilogue of the AVX-512 GEMM (gemm_avx512.hpp).
//
// The lane operations of 16 floats in a zmm register; the functions themselves, their bounds and
// special values are vector_math_body.hpp's, shared with vector_math_avx2.hpp, whose results
// they match bit for bit.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/vector_math_avx512.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/kernels/detail/simd_targets.hpp"
#include "dissect/kernels/detail/vector_math_bounds.hpp"
#include "dissect/tensor/activation.hpp"

#if DISSECT_X86

// GCC PR 105593's warnings silenced for these kernels (simd_targets.hpp).
DISSECT_AVX512_WARNINGS_BEGIN

namespace dissect::kernels::detail::avx512 {

// ---- lane operations, for vector_math_body.hpp --------------------------------------------------

using Vec = __m512;

// set1, zero, add, mul, div, fmadd, fmsub, fnmadd, min and max are the zmm instructions of
// the same names (vector_math_body.hpp writes them from DISSECT_VECTOR_MATH_PS); the rest:

DISSECT_TARGET_AVX512 inline Vec negate(Vec x) {
  return _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u))));
}

DISSECT_TARGET_AVX512 inline Vec absolute(Vec x) {
  return _mm512_abs_ps(x);
}

/// x rounded to the nearest integer, ties to even.
DISSECT_TARGET_AVX512 inline Vec round_nearest(Vec x) {
  return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

/// p·2^n, rounded once: n = 128 or −150 needs no 2^n of its own.
DISSECT_TARGET_AVX512 inline Vec scale_by_power_of_2(Vec p, Vec n) {
  return _mm512_scalef_ps(p, n);
}

/// if_negative where x < 0, otherwise (and for NaN) otherwise.
DISSECT_TARGET_AVX512 inline Vec select_negative(Vec x, Vec if_negative, Vec otherwise) {
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(negative, otherwise, if_negative);
}

}  // namespace dissect::kernels::detail::avx512

// exp, sigmoid, relu, silu, gelu_tanh, gelu and activate on __m512.
#define DISSECT_VECTOR_MATH_ISA avx512
#define DISSECT_VECTOR_MATH_PS(op) _mm512_##op##_ps
#define DISSECT_VECTOR_MATH_TARGET DISSECT_TARGET_AVX512
#include "dissect/kernels/detail/vector_math_body.hpp"

DISSECT_AVX512_WARNINGS_END

#endif  // DISSECT_X86
