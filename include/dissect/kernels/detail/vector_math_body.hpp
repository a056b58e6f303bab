// dissect/kernels/detail/vector_math_body.hpp — private: e^x, σ and the activations, written
// once for every instruction set. NO INCLUDE GUARD, BY DESIGN: vector_math_avx2.hpp and
// vector_math_avx512.hpp each include it once, and each inclusion stamps the functions out in
// that header's namespace. Before including it, the header defines there the vector type `Vec`
// and the lane operations that differ between ISAs (absolute, negate, round_nearest,
// scale_by_power_of_2, select_negative), and three macros: DISSECT_VECTOR_MATH_ISA (the
// namespace), DISSECT_VECTOR_MATH_TARGET (its target attribute) and DISSECT_VECTOR_MATH_PS(op)
// (its _mm…_op_ps, from which set1, zero, add, mul, div, the fmas, min and max are written here).
// Every function keeps the target attribute: GCC 12 does not inline intrinsics into a function
// without it, so a template over the ISA would not do.
//
// Each function computes what dissect::detail::activation_value<A, float> computes (σ: its
// activation_sigmoid; exp: std::exp), to within the bound stated beside it and exported by
// vector_math_bounds.hpp — f evaluated in double, checked over every float input on each path,
// whose results are identical bit for bit (the same formulas, coefficients and operation order)
// — and gives the scalar's result where that is ±∞ or NaN: NaN in → NaN out, and the infinities
// as stated beside each function.
//
// Subnormal results are produced (gradual underflow, rounded once, as the scalar code). Under
// MXCSR flush-to-zero or denormals-are-zero, which dissect never sets, they become 0 instead,
// an error of up to 2⁻¹²⁶ that the bounds' floor (2⁻¹⁴⁹) does not cover.

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/vector_math_body.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif
#if !defined(DISSECT_VECTOR_MATH_ISA) || !defined(DISSECT_VECTOR_MATH_TARGET) || \
    !defined(DISSECT_VECTOR_MATH_PS)
#error \
    "dissect/kernels/detail/vector_math_body.hpp is included only by vector_math_avx2.hpp and vector_math_avx512.hpp, which define DISSECT_VECTOR_MATH_ISA, DISSECT_VECTOR_MATH_TARGET and DISSECT_VECTOR_MATH_PS first"
#endif

namespace dissect::kernels::detail::DISSECT_VECTOR_MATH_ISA {

// ---- the lane operations that are one instruction of the same name on every ISA -----------------

DISSECT_VECTOR_MATH_TARGET inline Vec set1(float v) {
  return DISSECT_VECTOR_MATH_PS(set1)(v);
}
DISSECT_VECTOR_MATH_TARGET inline Vec zero() {
  return DISSECT_VECTOR_MATH_PS(setzero)();
}
DISSECT_VECTOR_MATH_TARGET inline Vec add(Vec a, Vec b) {
  return DISSECT_VECTOR_MATH_PS(add)(a, b);
}
DISSECT_VECTOR_MATH_TARGET inline Vec mul(Vec a, Vec b) {
  return DISSECT_VECTOR_MATH_PS(mul)(a, b);
}
DISSECT_VECTOR_MATH_TARGET inline Vec div(Vec a, Vec b) {
  return DISSECT_VECTOR_MATH_PS(div)(a, b);
}
/// a·b + c, a·b − c and c − a·b, each rounded once.
DISSECT_VECTOR_MATH_TARGET inline Vec fmadd(Vec a, Vec b, Vec c) {
  return DISSECT_VECTOR_MATH_PS(fmadd)(a, b, c);
}
DISSECT_VECTOR_MATH_TARGET inline Vec fmsub(Vec a, Vec b, Vec c) {
  return DISSECT_VECTOR_MATH_PS(fmsub)(a, b, c);
}
DISSECT_VECTOR_MATH_TARGET inline Vec fnmadd(Vec a, Vec b, Vec c) {
  return DISSECT_VECTOR_MATH_PS(fnmadd)(a, b, c);
}
/// (v)minps/(v)maxps: the second operand where either is NaN (and for two zeros).
DISSECT_VECTOR_MATH_TARGET inline Vec min(Vec a, Vec b) {
  return DISSECT_VECTOR_MATH_PS(min)(a, b);
}
DISSECT_VECTOR_MATH_TARGET inline Vec max(Vec a, Vec b) {
  return DISSECT_VECTOR_MATH_PS(max)(a, b);
}

// ---- the functions ------------------------------------------------------------------------------

/// e^x. |v − f| ≤ 3·2⁻²⁴·|f| + 2⁻¹⁴⁹ (exp_bound); measured over all 2³² inputs: 1.28·2⁻²⁴
/// relative (at x = 5.837), 0.5·2⁻¹⁴⁹ absolute for subnormal results. +∞ from x = 88.7228394
/// on, the first float with e^x > FLT_MAX (as expf); 2⁻¹⁴⁹ down to −103.972076 and 0 below.
DISSECT_VECTOR_MATH_TARGET inline Vec exp(Vec x) {
  namespace c = vector_math;
  // max and min return their second operand when either is NaN: NaN passes the clamp (and then
  // p is NaN, whatever the scaling makes of n).
  x = min(set1(c::exp_max_input), max(set1(c::exp_min_input), x));
  const Vec n = round_nearest(mul(x, set1(c::log2e)));
  Vec r = fnmadd(n, set1(c::ln2_hi), x);
  r = fnmadd(n, set1(c::ln2_lo), r);
  Vec p = fmadd(set1(c::exp_c6), r, set1(c::exp_c5));
  p = fmadd(p, r, set1(c::exp_c4));
  p = fmadd(p, r, set1(c::exp_c3));
  p = fmadd(p, r, set1(c::exp_c2));
  p = fmadd(p, r, set1(1.0f));
  p = fmadd(p, r, set1(1.0f));
  // p·2^n rounded once, into the subnormals if need be (n ∈ [−150, 128]).
  return scale_by_power_of_2(p, n);
}

/// σ(x) = 1/(1 + e^(−x)). |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻¹²⁶·|x| + 2⁻¹⁴⁹ (sigmoid_bound);
/// measured: 2.63·2⁻²⁴ relative (x = −16.92). Exactly 0 where e^(−x) overflows (x ≤ −88.7228394),
/// as the scalar, though σ is 3e−39 there: what the abs term is for. σ(+∞) = 1, σ(−∞) = 0.
DISSECT_VECTOR_MATH_TARGET inline Vec sigmoid(Vec x) {
  const Vec one = set1(1.0f);
  return div(one, add(one, exp(negate(x))));
}

/// max(x, 0) as the scalar x < 0 ? 0 : x: exact, NaN and −0 pass through. maxps returns its
/// second operand for NaN and for two zeros, so x goes second.
DISSECT_VECTOR_MATH_TARGET inline Vec relu(Vec x) {
  return max(zero(), x);
}

/// x·σ(x), as x / (1 + e^(−x)): one rounding fewer than x·σ(x), and no σ underflowing to a
/// subnormal first. |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻¹²⁶·|x| + 2⁻¹⁴⁹ (activation_bound(silu)); measured:
/// 2.93·2⁻²⁴ relative (x = −16.65). The abs term covers x ≤ −88.72, where the scalar's σ is
/// exactly 0 and so is this (−0, as the scalar's x·0). silu(+∞) = +∞, silu(−∞) = NaN.
DISSECT_VECTOR_MATH_TARGET inline Vec silu(Vec x) {
  return div(x, add(set1(1.0f), exp(negate(x))));
}

/// x·σ(2u), u = √(2/π)(x + 0.044715x³), as x / (1 + e^(−2u)) with −2u = x·(a + b·x²).
/// |v − f| ≤ 6·2⁻²⁴·|f| + 2⁻²⁵·|x| + 2⁻¹⁴⁹ (activation_bound(gelu_tanh)); measured: worst
/// error / bound 0.55 (x = −1.219). −2u carries about 2·2⁻²⁴ of relative rounding, which σ
/// amplifies by |2u|(1 − σ(2u)) relative to f — 218·2⁻²⁴ at x = −10 — but absolutely to no more
/// than 0.224·|x|·2·2⁻²⁴: hence the abs term. For |x| ≳ 1.8e19, x² = ∞ and −2u = ∓∞, giving x, or
/// −0 as the scalar does (its x³ overflows first). gelu_tanh(+∞) = +∞, gelu_tanh(−∞) = NaN.
DISSECT_VECTOR_MATH_TARGET inline Vec gelu_tanh(Vec x) {
  namespace c = vector_math;
  const Vec w = fmadd(set1(c::gelu_tanh_b), mul(x, x), set1(c::gelu_tanh_a));
  const Vec e = exp(mul(x, w));
  return div(x, add(set1(1.0f), e));
}

/// x·Φ(x), the exact (erf) GELU. |v − f| ≤ 12·2⁻²⁴·|f| + 2⁻¹⁴⁹ (activation_bound(gelu));
/// measured: 7.68·2⁻²⁴ relative (x = −5.450), 0.70·2⁻¹⁴⁹ absolute for subnormal results.
/// Φ(−|x|) = e^(−x²/2)·N(|x|)/D(|x|) (vector_math_bounds.hpp), Φ(|x|) = 1 − Φ(−|x|). Working from
/// x itself rather than from x/√2 leaves no rounded argument for the steep left tail to amplify:
/// x²/2 is carried exactly as hi + lo, so the error is relative all the way down to underflow.
/// gelu(+∞) = +∞, gelu(−∞) = NaN, gelu(x ≤ −14.5) = −0.
DISSECT_VECTOR_MATH_TARGET inline Vec gelu(Vec x) {
  namespace c = vector_math;
  const Vec one = set1(1.0f);
  // min returns its second operand for NaN, so NaN lanes stay NaN throughout.
  const Vec y = min(set1(c::gelu_max_abs), absolute(x));
  Vec num = set1(c::gelu_num[4]);
#pragma GCC unroll 4
  for (int k = 3; k >= 0; --k) num = fmadd(num, y, set1(c::gelu_num[k]));
  Vec den = set1(c::gelu_den[5]);
#pragma GCC unroll 5
  for (int k = 4; k >= 0; --k) den = fmadd(den, y, set1(c::gelu_den[k]));
  const Vec half = set1(0.5f);
  const Vec sq = mul(y, y);
  const Vec sq_lo = fmsub(y, y, sq);  // y² − sq, exact
  const Vec g = exp(negate(mul(half, sq)));
  // R(y)·e^(−lo), e^(−lo) ≈ 1 − lo with |lo| ≤ 2⁻²⁵·y²: the correction goes on R, not on g,
  // so that g, which may be subnormal, is rounded once only.
  const Vec ratio = div(num, den);
  const Vec r = fnmadd(ratio, mul(half, sq_lo), ratio);
  // x < 0: x·Φ(x) = (x·r)·g, one rounding into the subnormals if it gets there.
  // x ≥ 0 (and NaN): x·(1 − g·r).
  const Vec lower = mul(mul(x, r), g);
  const Vec upper = mul(x, fnmadd(g, r, one));
  return select_negative(x, lower, upper);
}

/// f(x) for activation a, as the GEMM epilogue calls it (callers have checked a with
/// check_activation; any other value gives x unchanged).
DISSECT_VECTOR_MATH_TARGET inline Vec activate(Activation a, Vec x) {
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

}  // namespace dissect::kernels::detail::DISSECT_VECTOR_MATH_ISA

#undef DISSECT_VECTOR_MATH_ISA
#undef DISSECT_VECTOR_MATH_TARGET
#undef DISSECT_VECTOR_MATH_PS
