// dissect/kernels/detail/vector_math_bounds.hpp — private: the constants the vectorised
// activations (vector_math_avx512.hpp, vector_math_avx2.hpp) share, and the accuracy they are
// held to.
//
// Both instruction sets evaluate the same formulas with the same float coefficients, in the same
// order, with one rounding per operation (FMA contracted explicitly), so one bound covers both:
// a fused GEMM's test can use activation_bound(a) whichever path ran.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/vector_math_bounds.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/tensor/activation.hpp"

namespace dissect::kernels::detail {

/// |v(x) − f(x)| ≤ rel·|f(x)| + abs·|x| + floor for every float x where the scalar float function
/// (detail::activation_value) is finite, with f evaluated in double. Where the scalar gives ±∞
/// or NaN the vector code gives the same. rel is the relative error of the arithmetic. abs covers
/// what a relative bound cannot: the scalar's σ is exactly 0 once e^(−x) overflows (x ≲ −88.72),
/// where the true value is not; and gelu_tanh's inner polynomial 2u carries about 2·2⁻²⁴ of
/// relative rounding, which σ amplifies by |2u|·(1 − σ(2u)) relative to f, an absolute error of at
/// most 0.224·|x| times that rounding (max over z of σ(z)(1 − σ(z))|z|). floor is one unit in the
/// last place of the subnormals: no float function can do better once its result underflows (gelu
/// of a subnormal x is x/2, rounded).
struct ActivationBound {
  double rel;
  double abs;
  double floor;
  /// The largest |v − f| allowed at x.
  constexpr double allowed(double x, double f) const {
    return rel * (f < 0 ? -f : f) + abs * (x < 0 ? -x : x) + floor;
  }
};

// Units: the float unit roundoff 2⁻²⁴, the smallest normal float 2⁻¹²⁶ and the smallest
// subnormal 2⁻¹⁴⁹. Each rel is 1.5 to 2.3 times the largest relative error measured over all 2³²
// float inputs on both instruction sets (recorded beside each function in the ISA headers): the
// margin is for a compiler that orders the arithmetic differently, as every input was tested.
inline constexpr double vector_math_unit = 0x1.0p-24;
inline constexpr double vector_math_underflow = 0x1.0p-126;
inline constexpr double vector_math_subnormal = 0x1.0p-149;

inline constexpr ActivationBound exp_bound{3 * vector_math_unit, 0.0, vector_math_subnormal};
inline constexpr ActivationBound sigmoid_bound{6 * vector_math_unit, vector_math_underflow,
                                               vector_math_subnormal};

/// The bound of activation `a` (relu is exact: all zero).
constexpr ActivationBound activation_bound(Activation a) {
  switch (a) {
    case Activation::relu:
      return {0.0, 0.0, 0.0};
    case Activation::gelu:
      return {12 * vector_math_unit, 0.0, vector_math_subnormal};
    case Activation::gelu_tanh:
      return {6 * vector_math_unit, 0.5 * vector_math_unit, vector_math_subnormal};
    case Activation::silu:
      return {6 * vector_math_unit, vector_math_underflow, vector_math_subnormal};
  }
  return {0.0, 0.0, 0.0};
}

namespace vector_math {

// ---- e^x = 2^n·e^r, n = round(x/ln 2), r = x − n·ln 2 ∈ [−ln2/2, ln2/2]
// ln 2 in two parts (Cody & Waite): ln2_hi has 9 significant bits, so n·ln2_hi is exact for
// every n the clamped input reaches (|n| ≤ 150) and x − n·ln2_hi is exact as well.
inline constexpr float log2e = 1.44269504088896341f;
inline constexpr float ln2_hi = 0.693359375f;
inline constexpr float ln2_lo = -2.12194440e-4f;  // ln 2 − ln2_hi, rounded to float
/// Past these the result is certain: e^89 > FLT_MAX and e^−104 < 2⁻¹⁵⁰ (half the smallest
/// subnormal). Clamping keeps the reduction exact for huge |x| and lets ±∞ reach 0 and ∞.
inline constexpr float exp_max_input = 89.0f;
inline constexpr float exp_min_input = -104.0f;
/// e^r ≈ 1 + r + r²·(c2 + c3·r + c4·r² + c5·r³ + c6·r⁴): the minimax polynomial for relative
/// error on |r| ≤ 0.3467 with c0 = c1 = 1 fixed, fitted by iteratively reweighted least squares
/// (Lawson's algorithm) in 64-bit long double, each coefficient rounded to float in turn and the
/// rest refitted. Relative error of the polynomial itself: 3.1e−9 (0.05·2⁻²⁴).
inline constexpr float exp_c2 = 4.999999404e-01f;
inline constexpr float exp_c3 = 1.666652113e-01f;
inline constexpr float exp_c4 = 4.166826233e-02f;
inline constexpr float exp_c5 = 8.368674666e-03f;
inline constexpr float exp_c6 = 1.382105518e-03f;

// ---- gelu_tanh: x·σ(2u) = x / (1 + e^(−2u)), −2u = x·(a + b·x²)
inline constexpr float gelu_tanh_a = float(-2 * 0.79788456080286535588);
inline constexpr float gelu_tanh_b = float(-2 * 0.79788456080286535588 * 0.044715);

// ---- gelu: x·Φ(x). With y = |x|, Φ(−y) = e^(−y²/2)·R(y), where R(y) = Φ(−y)·e^(y²/2) is the
// Mills ratio over √(2π): smooth, R(0) = ½, R(y) ~ 1/(y√(2π)). R ≈ N(y)/D(y), degrees 4 and 5
// (D's constant term 1): the rational minimax approximation for relative error on y ∈ [0, 16],
// fitted by Loeb's linearisation with Lawson's reweighting in 64-bit long double against glibc's
// erfcl and expl, each coefficient rounded to float in turn and the rest refitted. Relative error
// with these float coefficients, evaluated exactly: 2.3e−8 (0.39·2⁻²⁴). All coefficients are
// positive, so Horner's rule in y ≥ 0 adds only its own roundings.
inline constexpr float gelu_num[5] = {5.000000000e-01f, 4.403969646e-01f, 1.847704202e-01f,
                                      4.114415124e-02f, 4.190059844e-03f};
inline constexpr float gelu_den[6] = {
    1.0f, 1.678678870e+00f, 1.208928108e+00f, 4.735172391e-01f, 1.031387448e-01f, 1.050282270e-02f};
/// Beyond |x| = 16, Φ(x) is 1 or (as a float) 0, and e^(−x²/2) must not see x² = ∞.
inline constexpr float gelu_max_abs = 16.0f;

}  // namespace vector_math

}  // namespace dissect::kernels::detail
