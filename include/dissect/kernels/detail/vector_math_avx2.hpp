// dissect/kernels/detail/vector_math_avx2.hpp — private: e^x, σ and the activations on 8 floats,
// for the epilogue of the AVX2 GEMM (gemm_avx2.hpp).
//
// The same formulas, coefficients and operation order as vector_math_avx512.hpp — the results
// are identical bit for bit — and so the same bounds (vector_math_bounds.hpp) and special values.
// AVX2 has no scalef: e^x builds 2^n in two halves (scale_by_power_of_2), which rounds the same.
// Subnormal results are produced (gradual underflow), unless MXCSR's flush-to-zero is set, which
// dissect never does.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/vector_math_avx2.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/activation.hpp"
#include "dissect/kernels/detail/simd_targets.hpp"
#include "dissect/kernels/detail/vector_math_bounds.hpp"

#if DISSECT_X86

namespace dissect::kernels::detail::avx2 {

DISSECT_TARGET_AVX2 inline __m256 negate(__m256 x) {
  return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f));
}

DISSECT_TARGET_AVX2 inline __m256 absolute(__m256 x) {
  return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
}

/// p·2^n for integral n ∈ [−150, 128], rounded once. 2^n alone may not be a float, but 2^⌊n/2⌋
/// and 2^(n − ⌊n/2⌋) are normal, and p·2^⌊n/2⌋ (p ∈ [0.7, 1.5]) is exact.
DISSECT_TARGET_AVX2 inline __m256 scale_by_power_of_2(__m256 p, __m256 n) {
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

/// e^x. |v − f| ≤ 3·2⁻²⁴·|f| + 2⁻¹⁴⁹ (exp_bound); measured over all 2³² inputs: 1.28·2⁻²⁴
/// relative (at x = 5.837), 0.5·2⁻¹⁴⁹ absolute for subnormal results. +∞ from x = 88.7228394
/// on, the first float with e^x > FLT_MAX (as expf); 2⁻¹⁴⁹ down to −103.972076 and 0 below.
DISSECT_TARGET_AVX2 inline __m256 exp(__m256 x) {
  namespace c = vector_math;
  // max and min return their second operand when either is NaN: NaN passes the clamp (and then
  // p is NaN, whatever garbage the conversion of n makes of the scale).
  x = _mm256_min_ps(_mm256_set1_ps(c::exp_max_input),
                    _mm256_max_ps(_mm256_set1_ps(c::exp_min_input), x));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(c::log2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::ln2_hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(c::ln2_lo), r);
  __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(c::exp_c6), r, _mm256_set1_ps(c::exp_c5));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c::exp_c4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c::exp_c3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c::exp_c2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  return scale_by_power_of_2(p, n);
}

/// σ(x) = 1/(1 + e^(−x)). |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻¹²⁶·|x| + 2⁻¹⁴⁹ (sigmoid_bound);
/// measured: 2.63·2⁻²⁴ relative (x = −16.92). Exactly 0 where e^(−x) overflows (x ≤ −88.7228394),
/// as the scalar, though σ is 3e−39 there: what the abs term is for. σ(+∞) = 1, σ(−∞) = 0.
DISSECT_TARGET_AVX2 inline __m256 sigmoid(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp(negate(x))));
}

/// max(x, 0) as the scalar x < 0 ? 0 : x: exact, NaN and −0 pass through. maxps returns its
/// second operand for NaN and for two zeros, so x goes second.
DISSECT_TARGET_AVX2 inline __m256 relu(__m256 x) {
  return _mm256_max_ps(_mm256_setzero_ps(), x);
}

/// x·σ(x), as x / (1 + e^(−x)): one rounding fewer than x·σ(x), and no σ underflowing to a
/// subnormal first. |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻¹²⁶·|x| + 2⁻¹⁴⁹ (activation_bound(silu)); measured:
/// 2.93·2⁻²⁴ relative (x = −16.65). The abs term covers x ≤ −88.72, where the scalar's σ is
/// exactly 0 and so is this (−0, as the scalar's x·0). silu(+∞) = +∞, silu(−∞) = NaN.
DISSECT_TARGET_AVX2 inline __m256 silu(__m256 x) {
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), exp(negate(x))));
}

/// x·σ(2u), u = √(2/π)(x + 0.044715x³), as x / (1 + e^(−2u)) with −2u = x·(a + b·x²).
/// |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻²⁵·|x| + 2⁻¹⁴⁹ (activation_bound(gelu_tanh)); measured: worst
/// error / bound 0.55 (x = −1.219). −2u carries about 2·2⁻²⁴ of relative rounding, which σ
/// amplifies by |2u|(1 − σ(2u)) relative to f — 218·2⁻²⁴ at x = −10 — but absolutely to no more
/// than 0.224·|x|·2·2⁻²⁴: hence the abs term. For |x| ≳ 1.8e19, x² = ∞ and −2u = ∓∞, giving x, or
/// −0 as the scalar does (its x³ overflows first). gelu_tanh(+∞) = +∞, gelu_tanh(−∞) = NaN.
DISSECT_TARGET_AVX2 inline __m256 gelu_tanh(__m256 x) {
  namespace c = vector_math;
  const __m256 w = _mm256_fmadd_ps(_mm256_set1_ps(c::gelu_tanh_b), _mm256_mul_ps(x, x),
                                   _mm256_set1_ps(c::gelu_tanh_a));
  const __m256 e = exp(_mm256_mul_ps(x, w));
  return _mm256_div_ps(x, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

/// x·Φ(x), the exact (erf) GELU. |v − f| ≤ 12·2⁻²⁴·|f| + 2⁻¹⁴⁹ (activation_bound(gelu));
/// measured: 7.68·2⁻²⁴ relative (x = −5.450), 0.70·2⁻¹⁴⁹ absolute for subnormal results.
/// Φ(−|x|) = e^(−x²/2)·N(|x|)/D(|x|) (vector_math_bounds.hpp), Φ(|x|) = 1 − Φ(−|x|). Working from
/// x itself rather than from x/√2 leaves no rounded argument for the steep left tail to amplify:
/// x²/2 is carried exactly as hi + lo, so the error is relative all the way down to underflow.
/// gelu(+∞) = +∞, gelu(−∞) = NaN, gelu(x ≤ −14.5) = −0.
DISSECT_TARGET_AVX2 inline __m256 gelu(__m256 x) {
  namespace c = vector_math;
  const __m256 one = _mm256_set1_ps(1.0f);
  // min returns its second operand for NaN, so NaN lanes stay NaN throughout.
  const __m256 y = _mm256_min_ps(_mm256_set1_ps(c::gelu_max_abs), absolute(x));
  __m256 num = _mm256_set1_ps(c::gelu_num[4]);
#pragma GCC unroll 4
  for (int k = 3; k >= 0; --k) num = _mm256_fmadd_ps(num, y, _mm256_set1_ps(c::gelu_num[k]));
  __m256 den = _mm256_set1_ps(c::gelu_den[5]);
#pragma GCC unroll 5
  for (int k = 4; k >= 0; --k) den = _mm256_fmadd_ps(den, y, _mm256_set1_ps(c::gelu_den[k]));
  const __m256 half = _mm256_set1_ps(0.5f);
  const __m256 sq = _mm256_mul_ps(y, y);
  const __m256 sq_lo = _mm256_fmsub_ps(y, y, sq);  // y² − sq, exact
  const __m256 g = exp(negate(_mm256_mul_ps(half, sq)));
  // R(y)·e^(−lo), e^(−lo) ≈ 1 − lo with |lo| ≤ 2⁻²⁵·y²: the correction goes on R, not on g,
  // so that g, which may be subnormal, is rounded once only.
  const __m256 ratio = _mm256_div_ps(num, den);
  const __m256 r = _mm256_fnmadd_ps(ratio, _mm256_mul_ps(half, sq_lo), ratio);
  // x < 0: x·Φ(x) = (x·r)·g, one rounding into the subnormals if it gets there.
  // x ≥ 0 (and NaN): x·(1 − g·r).
  const __m256 lower = _mm256_mul_ps(_mm256_mul_ps(x, r), g);
  const __m256 upper = _mm256_mul_ps(x, _mm256_fnmadd_ps(g, r, one));
  const __m256 negative = _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ);
  return _mm256_blendv_ps(upper, lower, negative);
}

/// f(x) for activation a, as the GEMM epilogue calls it (callers have checked a with
/// check_activation; any other value gives x unchanged).
DISSECT_TARGET_AVX2 inline __m256 activate(Activation a, __m256 x) {
  switch (a) {
    case Activation::relu:
      return relu(x);
    case Activation::gelu:
      return gelu(x);
    case Activation::gelu_tanh:
      return gelu_tanh(x);
    case Activation::silu:
      return silu(x);
  }
  return x;
}

}  // namespace dissect::kernels::detail::avx2

#endif  // DISSECT_X86
