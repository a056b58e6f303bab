// dissect/kernels/detail/vector_math_body.hpp — private: e^x, σ and the activations, written once
// for every instruction set, included once per set (vector_math_avx2.hpp on 8 floats,
// vector_math_avx512.hpp on 16). No #pragma once, on purpose.
//
// The includer defines DISSECT_SIMD_NAMESPACE (the namespace under dissect::kernels::detail that
// holds the set's lane operations: vec, set1, add, fmadd, …, simd_avx2.hpp / simd_avx512.hpp) and
// DISSECT_SIMD_TARGET (its target attribute, which every function here must carry for GCC to
// inline the intrinsics into it); this file undefines both at its end. So both sets evaluate the
// same formulas with the same float coefficients in the same order, one rounding per operation:
// their results are identical bit for bit, and one set of bounds (vector_math_bounds.hpp) covers
// both.
//
// Each function computes what dissect::detail::activation_value<A, float> computes (σ: its
// activation_sigmoid; exp: std::exp), to within the bound stated beside it and exported by
// vector_math_bounds.hpp — f evaluated in double, checked over every float input on both sets —
// and gives the scalar's result where that is ±∞ or NaN: NaN in → NaN out, and the infinities as
// stated beside each function.
//
// Subnormal results are produced (gradual underflow, rounded once, as the scalar code). Under
// MXCSR flush-to-zero or denormals-are-zero, which dissect never sets, they become 0 instead,
// an error of up to 2⁻¹²⁶ that the bounds' floor (2⁻¹⁴⁹) does not cover.

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/vector_math_body.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif
#if !defined(DISSECT_SIMD_NAMESPACE) || !defined(DISSECT_SIMD_TARGET)
#error "vector_math_body.hpp: define DISSECT_SIMD_NAMESPACE and DISSECT_SIMD_TARGET first"
#endif

namespace dissect::kernels::detail::DISSECT_SIMD_NAMESPACE {

/// e^x. |v − f| ≤ 3·2⁻²⁴·|f| + 2⁻¹⁴⁹ (exp_bound); measured over all 2³² inputs: 1.28·2⁻²⁴
/// relative (at x = 5.837), 0.5·2⁻¹⁴⁹ absolute for subnormal results. +∞ from x = 88.7228394
/// on, the first float with e^x > FLT_MAX (as expf); 2⁻¹⁴⁹ down to −103.972076 and 0 below.
DISSECT_SIMD_TARGET inline vec exp(vec x) {
  namespace c = vector_math;
  // max and min return their second operand when either is NaN: NaN passes the clamp (and then
  // p is NaN, whatever scale_by_power_of_2 makes of n).
  x = min(set1(c::exp_max_input), max(set1(c::exp_min_input), x));
  const vec n = round_to_nearest(mul(x, set1(c::log2e)));
  vec r = fnmadd(n, set1(c::ln2_hi), x);
  r = fnmadd(n, set1(c::ln2_lo), r);
  vec p = fmadd(set1(c::exp_c6), r, set1(c::exp_c5));
  p = fmadd(p, r, set1(c::exp_c4));
  p = fmadd(p, r, set1(c::exp_c3));
  p = fmadd(p, r, set1(c::exp_c2));
  p = fmadd(p, r, set1(1.0f));
  p = fmadd(p, r, set1(1.0f));
  return scale_by_power_of_2(p, n);
}

/// σ(x) = 1/(1 + e^(−x)). |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻¹²⁶·|x| + 2⁻¹⁴⁹ (sigmoid_bound);
/// measured: 2.63·2⁻²⁴ relative (x = −16.92). Exactly 0 where e^(−x) overflows (x ≤ −88.7228394),
/// as the scalar, though σ is 3e−39 there: what the abs term is for. σ(+∞) = 1, σ(−∞) = 0.
DISSECT_SIMD_TARGET inline vec sigmoid(vec x) {
  const vec one = set1(1.0f);
  return div(one, add(one, exp(negate(x))));
}

/// max(x, 0) as the scalar x < 0 ? 0 : x: exact, NaN and −0 pass through. maxps returns its
/// second operand for NaN and for two zeros, so x goes second.
DISSECT_SIMD_TARGET inline vec relu(vec x) {
  return max(setzero(), x);
}

/// x·σ(x), as x / (1 + e^(−x)): one rounding fewer than x·σ(x), and no σ underflowing to a
/// subnormal first. |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻¹²⁶·|x| + 2⁻¹⁴⁹ (activation_bound(silu)); measured:
/// 2.93·2⁻²⁴ relative (x = −16.65). The abs term covers x ≤ −88.72, where the scalar's σ is
/// exactly 0 and so is this (−0, as the scalar's x·0). silu(+∞) = +∞, silu(−∞) = NaN.
DISSECT_SIMD_TARGET inline vec silu(vec x) {
  return div(x, add(set1(1.0f), exp(negate(x))));
}

/// x·σ(2u), u = √(2/π)(x + 0.044715x³), as x / (1 + e^(−2u)) with −2u = x·(a + b·x²).
/// |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻²⁵·|x| + 2⁻¹⁴⁹ (activation_bound(gelu_tanh)); measured: worst
/// error / bound 0.55 (x = −1.219). −2u carries about 2·2⁻²⁴ of relative rounding, which σ
/// amplifies by |2u|(1 − σ(2u)) relative to f — 218·2⁻²⁴ at x = −10 — but absolutely to no more
/// than 0.224·|x|·2·2⁻²⁴: hence the abs term. For |x| ≳ 1.8e19, x² = ∞ and −2u = ∓∞, giving x, or
/// −0 as the scalar does (its x³ overflows first). gelu_tanh(+∞) = +∞, gelu_tanh(−∞) = NaN.
DISSECT_SIMD_TARGET inline vec gelu_tanh(vec x) {
  namespace c = vector_math;
  const vec w = fmadd(set1(c::gelu_tanh_b), mul(x, x), set1(c::gelu_tanh_a));
  const vec e = exp(mul(x, w));
  return div(x, add(set1(1.0f), e));
}

/// x·Φ(x), the exact (erf) GELU. |v − f| ≤ 12·2⁻²⁴·|f| + 2⁻¹⁴⁹ (activation_bound(gelu));
/// measured: 7.68·2⁻²⁴ relative (x = −5.450), 0.70·2⁻¹⁴⁹ absolute for subnormal results.
/// Φ(−|x|) = e^(−x²/2)·N(|x|)/D(|x|) (vector_math_bounds.hpp), Φ(|x|) = 1 − Φ(−|x|). Working from
/// x itself rather than from x/√2 leaves no rounded argument for the steep left tail to amplify:
/// x²/2 is carried exactly as hi + lo, so the error is relative all the way down to underflow.
/// gelu(+∞) = +∞, gelu(−∞) = NaN, gelu(x ≤ −14.5) = −0.
DISSECT_SIMD_TARGET inline vec gelu(vec x) {
  namespace c = vector_math;
  const vec one = set1(1.0f);
  // min returns its second operand for NaN, so NaN lanes stay NaN throughout.
  const vec y = min(set1(c::gelu_max_abs), absolute(x));
  vec num = set1(c::gelu_num[4]);
#pragma GCC unroll 4
  for (int k = 3; k >= 0; --k) num = fmadd(num, y, set1(c::gelu_num[k]));
  vec den = set1(c::gelu_den[5]);
#pragma GCC unroll 5
  for (int k = 4; k >= 0; --k) den = fmadd(den, y, set1(c::gelu_den[k]));
  const vec half = set1(0.5f);
  const vec sq = mul(y, y);
  const vec sq_lo = fmsub(y, y, sq);  // y² − sq, exact
  const vec g = exp(negate(mul(half, sq)));
  // R(y)·e^(−lo), e^(−lo) ≈ 1 − lo with |lo| ≤ 2⁻²⁵·y²: the correction goes on R, not on g,
  // so that g, which may be subnormal, is rounded once only.
  const vec ratio = div(num, den);
  const vec r = fnmadd(ratio, mul(half, sq_lo), ratio);
  // x < 0: x·Φ(x) = (x·r)·g, one rounding into the subnormals if it gets there.
  // x ≥ 0 (and NaN): x·(1 − g·r).
  const vec lower = mul(mul(x, r), g);
  const vec upper = mul(x, fnmadd(g, r, one));
  return select_negative(x, lower, upper);
}

/// f(x) for activation a, as the GEMM epilogue calls it (callers have checked a with
/// check_activation; any other value gives x unchanged).
DISSECT_SIMD_TARGET inline vec activate(Activation a, vec x) {
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

}  // namespace dissect::kernels::detail::DISSECT_SIMD_NAMESPACE

#undef DISSECT_SIMD_TARGET
#undef DISSECT_SIMD_NAMESPACE
