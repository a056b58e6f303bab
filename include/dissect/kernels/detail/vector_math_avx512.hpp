// dissect/kernels/detail/vector_math_avx512.hpp — private: e^x, σ and the activations on 16
// floats, for the epilogue of the AVX-512 GEMM (gemm_avx512.hpp).
//
// Each function computes what dissect::detail::activation_value<A, float> computes (σ: its
// activation_sigmoid; exp: std::exp), to within the bound stated beside it and exported by
// vector_math_bounds.hpp — f evaluated in double, checked over every float input on this path
// and the AVX2 one, whose results are identical bit for bit — and gives the scalar's result where
// that is ±∞ or NaN: NaN in → NaN out, and the infinities as stated beside each function.
//
// Subnormal results are produced (gradual underflow, rounded once, as the scalar code). Under
// MXCSR flush-to-zero or denormals-are-zero, which dissect never sets, they become 0 instead,
// an error of up to 2⁻¹²⁶ that the bounds' floor (2⁻¹⁴⁹) does not cover.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/vector_math_avx512.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/activation.hpp"
#include "dissect/kernels/detail/simd_targets.hpp"
#include "dissect/kernels/detail/vector_math_bounds.hpp"

#if DISSECT_X86

// GCC 12's own AVX-512 intrinsics (_mm512_undefined_* passthroughs) trip its (maybe-)uninitialized
// warnings wherever they are inlined (GCC PR 105593): silenced for these functions only.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

namespace dissect::kernels::detail::avx512 {

DISSECT_TARGET_AVX512 inline __m512 negate(__m512 x) {
  return _mm512_castsi512_ps(
      _mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(int(0x80000000u))));
}

/// e^x. |v − f| ≤ 3·2⁻²⁴·|f| + 2⁻¹⁴⁹ (exp_bound); measured over all 2³² inputs: 1.28·2⁻²⁴
/// relative (at x = 5.837), 0.5·2⁻¹⁴⁹ absolute for subnormal results. +∞ from x = 88.7228394
/// on, the first float with e^x > FLT_MAX (as expf); 2⁻¹⁴⁹ down to −103.972076 and 0 below.
DISSECT_TARGET_AVX512 inline __m512 exp(__m512 x) {
  namespace c = vector_math;
  // max and min return their second operand when either is NaN: NaN passes the clamp.
  x = _mm512_min_ps(_mm512_set1_ps(c::exp_max_input),
                    _mm512_max_ps(_mm512_set1_ps(c::exp_min_input), x));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(c::log2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(c::ln2_hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(c::ln2_lo), r);
  __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(c::exp_c6), r, _mm512_set1_ps(c::exp_c5));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c::exp_c4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c::exp_c3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c::exp_c2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
  // One rounding, into the subnormals if need be: n = 128 or −150 needs no 2^n of its own.
  return _mm512_scalef_ps(p, n);
}

/// σ(x) = 1/(1 + e^(−x)). |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻¹²⁶·|x| + 2⁻¹⁴⁹ (sigmoid_bound);
/// measured: 2.63·2⁻²⁴ relative (x = −16.92). Exactly 0 where e^(−x) overflows (x ≤ −88.7228394),
/// as the scalar, though σ is 3e−39 there: what the abs term is for. σ(+∞) = 1, σ(−∞) = 0.
DISSECT_TARGET_AVX512 inline __m512 sigmoid(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  return _mm512_div_ps(one, _mm512_add_ps(one, exp(negate(x))));
}

/// max(x, 0) as the scalar x < 0 ? 0 : x: exact, NaN and −0 pass through. maxps returns its
/// second operand for NaN and for two zeros, so x goes second.
DISSECT_TARGET_AVX512 inline __m512 relu(__m512 x) {
  return _mm512_max_ps(_mm512_setzero_ps(), x);
}

/// x·σ(x), as x / (1 + e^(−x)): one rounding fewer than x·σ(x), and no σ underflowing to a
/// subnormal first. |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻¹²⁶·|x| + 2⁻¹⁴⁹ (activation_bound(silu)); measured:
/// 2.93·2⁻²⁴ relative (x = −16.65). The abs term covers x ≤ −88.72, where the scalar's σ is
/// exactly 0 and so is this (−0, as the scalar's x·0). silu(+∞) = +∞, silu(−∞) = NaN.
DISSECT_TARGET_AVX512 inline __m512 silu(__m512 x) {
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), exp(negate(x))));
}

/// x·σ(2u), u = √(2/π)(x + 0.044715x³), as x / (1 + e^(−2u)) with −2u = x·(a + b·x²).
/// |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻²⁵·|x| + 2⁻¹⁴⁹ (activation_bound(gelu_tanh)); measured: worst
/// error / bound 0.55 (x = −1.219). −2u carries about 2·2⁻²⁴ of relative rounding, which σ
/// amplifies by |2u|(1 − σ(2u)) relative to f — 218·2⁻²⁴ at x = −10 — but absolutely to no more
/// than 0.224·|x|·2·2⁻²⁴: hence the abs term. For |x| ≳ 1.8e19, x² = ∞ and −2u = ∓∞, giving x, or
/// −0 as the scalar does (its x³ overflows first). gelu_tanh(+∞) = +∞, gelu_tanh(−∞) = NaN.
DISSECT_TARGET_AVX512 inline __m512 gelu_tanh(__m512 x) {
  namespace c = vector_math;
  const __m512 w = _mm512_fmadd_ps(_mm512_set1_ps(c::gelu_tanh_b), _mm512_mul_ps(x, x),
                                   _mm512_set1_ps(c::gelu_tanh_a));
  const __m512 e = exp(_mm512_mul_ps(x, w));
  return _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

/// x·Φ(x), the exact (erf) GELU. |v − f| ≤ 12·2⁻²⁴·|f| + 2⁻¹⁴⁹ (activation_bound(gelu));
/// measured: 7.68·2⁻²⁴ relative (x = −5.450), 0.70·2⁻¹⁴⁹ absolute for subnormal results.
/// Φ(−|x|) = e^(−x²/2)·N(|x|)/D(|x|) (vector_math_bounds.hpp), Φ(|x|) = 1 − Φ(−|x|). Working from
/// x itself rather than from x/√2 leaves no rounded argument for the steep left tail to amplify:
/// x²/2 is carried exactly as hi + lo, so the error is relative all the way down to underflow.
/// gelu(+∞) = +∞, gelu(−∞) = NaN, gelu(x ≤ −14.5) = −0.
DISSECT_TARGET_AVX512 inline __m512 gelu(__m512 x) {
  namespace c = vector_math;
  const __m512 one = _mm512_set1_ps(1.0f);
  // min returns its second operand for NaN, so NaN lanes stay NaN throughout.
  const __m512 y = _mm512_min_ps(_mm512_set1_ps(c::gelu_max_abs), _mm512_abs_ps(x));
  __m512 num = _mm512_set1_ps(c::gelu_num[4]);
#pragma GCC unroll 4
  for (int k = 3; k >= 0; --k) num = _mm512_fmadd_ps(num, y, _mm512_set1_ps(c::gelu_num[k]));
  __m512 den = _mm512_set1_ps(c::gelu_den[5]);
#pragma GCC unroll 5
  for (int k = 4; k >= 0; --k) den = _mm512_fmadd_ps(den, y, _mm512_set1_ps(c::gelu_den[k]));
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512 sq = _mm512_mul_ps(y, y);
  const __m512 sq_lo = _mm512_fmsub_ps(y, y, sq);  // y² − sq, exact
  const __m512 g = exp(negate(_mm512_mul_ps(half, sq)));
  // R(y)·e^(−lo), e^(−lo) ≈ 1 − lo with |lo| ≤ 2⁻²⁵·y²: the correction goes on R, not on g,
  // so that g, which may be subnormal, is rounded once only.
  const __m512 ratio = _mm512_div_ps(num, den);
  const __m512 r = _mm512_fnmadd_ps(ratio, _mm512_mul_ps(half, sq_lo), ratio);
  // x < 0: x·Φ(x) = (x·r)·g, one rounding into the subnormals if it gets there.
  // x ≥ 0 (and NaN): x·(1 − g·r).
  const __m512 lower = _mm512_mul_ps(_mm512_mul_ps(x, r), g);
  const __m512 upper = _mm512_mul_ps(x, _mm512_fnmadd_ps(g, r, one));
  const __mmask16 negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ);
  return _mm512_mask_blend_ps(negative, upper, lower);
}

/// f(x) for activation a, as the GEMM epilogue calls it (callers have checked a with
/// check_activation; any other value gives x unchanged).
DISSECT_TARGET_AVX512 inline __m512 activate(Activation a, __m512 x) {
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

}  // namespace dissect::kernels::detail::avx512

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

#endif  // DISSECT_X86
