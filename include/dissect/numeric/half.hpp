// dissect/numeric/half.hpp — the 16-bit float formats that weights and checkpoints store: IEEE
// binary16 (fp16) and bfloat16 (bf16), as raw bit patterns, to and from float.
//
// Widening is exact: every fp16 and bf16 value is a float. Narrowing rounds to nearest, ties to
// even, as PyTorch's .half() and .bfloat16() do; a float too large for fp16 becomes ±Inf; a
// double is rounded once, directly (through float it would be rounded twice). NaN
// stays NaN in both directions and comes out quiet, with its sign and as much of its payload as
// fits. Plain integer arithmetic, so the result never depends on the FPU's rounding mode.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>

namespace dissect {

/// fp16 bits → float, exact.
constexpr float fp16_to_float(std::uint16_t bits);
/// bf16 bits → float, exact (the bf16 bits are the float's top 16).
constexpr float bf16_to_float(std::uint16_t bits);
/// float → fp16 bits, round to nearest even; |x| ≥ 65520 → ±Inf.
constexpr std::uint16_t float_to_fp16(float value);
/// float → bf16 bits, round to nearest even.
constexpr std::uint16_t float_to_bf16(float value);
/// double → fp16 / bf16 bits, rounded once to nearest even.
constexpr std::uint16_t double_to_fp16(double value);
constexpr std::uint16_t double_to_bf16(double value);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// value >> shift, rounded to nearest with ties to even (1 <= shift <= 31).
constexpr std::uint32_t shift_right_to_nearest_even(std::uint32_t value, int shift) {
  const std::uint32_t kept = value >> shift;
  const std::uint32_t dropped = value & ((std::uint32_t{1} << shift) - 1);
  const std::uint32_t half = std::uint32_t{1} << (shift - 1);
  return kept + ((dropped > half || (dropped == half && (kept & 1))) ? 1 : 0);
}

inline constexpr std::uint32_t float_sign = 0x8000'0000;
inline constexpr std::uint32_t float_infinity = 0x7f80'0000;
inline constexpr std::uint32_t float_quiet = 0x0040'0000;  // the top mantissa bit

/// `value` as a float rounded to odd: truncated toward zero, and the last bit set if anything
/// was dropped. A format of p bits holds no tie of a format of p − 2 bits or fewer, so rounding
/// this float to nearest-even fp16 or bf16 gives what rounding `value` directly would
/// (Boldo & Melquiond, "Emulation of FMA and correctly rounded sums: proved algorithms using
/// rounding to odd", 2008): float keeps ≥ 13 more bits than fp16 and bf16, subnormals included.
constexpr float narrow_to_odd(double value) {
  constexpr double float_max = 3.40282346638528859811704183484516925e+38;
  if (value != value) return static_cast<float>(value);  // NaN
  if (value > float_max || value < -float_max) {         // beyond float (a cast would be UB)
    constexpr double infinity = std::numeric_limits<double>::infinity();
    const bool infinite = value == infinity || value == -infinity;
    const std::uint32_t magnitude = infinite ? float_infinity : 0x7f7f'ffff;  // finite: max, odd
    return std::bit_cast<float>((value < 0 ? float_sign : 0) | magnitude);
  }
  const float nearest = static_cast<float>(value);
  if (static_cast<double>(nearest) == value) return nearest;
  std::uint32_t bits = std::bit_cast<std::uint32_t>(nearest);
  const bool away_from_zero = value > 0 ? nearest > value : nearest < value;
  if (away_from_zero) --bits;  // one step back toward zero on the magnitude; the sign stays
  return std::bit_cast<float>(bits | 1);
}

}  // namespace detail

constexpr float fp16_to_float(std::uint16_t bits) {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000) << 16;
  const std::uint32_t exponent = (bits >> 10) & 0x1f;
  std::uint32_t mantissa = bits & 0x3ff;
  if (exponent == 0x1f) {  // Inf, or NaN made quiet
    const std::uint32_t quiet = mantissa ? detail::float_quiet : 0;
    return std::bit_cast<float>(sign | detail::float_infinity | quiet | (mantissa << 13));
  }
  if (exponent == 0) {
    if (mantissa == 0) return std::bit_cast<float>(sign);
    // A subnormal m·2⁻²⁴ is a normal float: shift m up to the implicit bit, lowering the exponent.
    std::uint32_t float_exponent = 127 - 14;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    return std::bit_cast<float>(sign | (float_exponent << 23) | ((mantissa & 0x3ff) << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 127 - 15) << 23) | (mantissa << 13));
}

constexpr float bf16_to_float(std::uint16_t bits) {
  const std::uint32_t wide = static_cast<std::uint32_t>(bits) << 16;
  const bool nan = (wide & ~detail::float_sign) > detail::float_infinity;
  return std::bit_cast<float>(nan ? wide | detail::float_quiet : wide);
}

constexpr std::uint16_t float_to_fp16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000);
  const std::uint32_t magnitude = bits & ~detail::float_sign;
  if (magnitude > detail::float_infinity) {  // NaN: quiet, keeping the payload's top 9 bits
    return static_cast<std::uint16_t>(sign | 0x7e00 | ((magnitude >> 13) & 0x1ff));
  }
  // 65520 = 65504 + half an ulp: from there on (ties to even go up, 65504 being odd) it is Inf.
  if (magnitude >= 0x477f'f000) return static_cast<std::uint16_t>(sign | 0x7c00);
  if (magnitude >= 0x3880'0000) {  // ≥ 2⁻¹⁴: normal. Rebias the exponent, round off 13 bits;
    // a carry out of the mantissa correctly bumps the exponent.
    const std::uint32_t rebiased = magnitude - ((127 - 15) << 23);
    return static_cast<std::uint16_t>(sign | detail::shift_right_to_nearest_even(rebiased, 13));
  }
  // Below 2⁻¹⁴: a subnormal fp16 q·2⁻²⁴. With the implicit bit, |value| = m·2^(e − 150), so
  // q = m·2^(e − 126), a right shift by 126 − e ≥ 14. From 25 on, m < 2²⁴ gives q < ½: zero.
  const std::uint32_t exponent = magnitude >> 23;
  const int shift = 126 - static_cast<int>(exponent);
  if (exponent == 0 || shift > 24) return sign;
  const std::uint32_t mantissa = (magnitude & 0x7f'ffff) | 0x80'0000;
  return static_cast<std::uint16_t>(sign | detail::shift_right_to_nearest_even(mantissa, shift));
}

constexpr std::uint16_t float_to_bf16(float value) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t magnitude = bits & ~detail::float_sign;
  if (magnitude > detail::float_infinity) {  // NaN: quiet, keeping the payload's top 6 bits
    return static_cast<std::uint16_t>((bits >> 16) | 0x0040);
  }
  // Same exponent range as float: rounding off 16 bits is all; it carries into Inf at the top.
  return static_cast<std::uint16_t>(((bits >> 16) & 0x8000) |
                                    detail::shift_right_to_nearest_even(magnitude, 16));
}

constexpr std::uint16_t double_to_fp16(double value) {
  return float_to_fp16(detail::narrow_to_odd(value));
}

constexpr std::uint16_t double_to_bf16(double value) {
  return float_to_bf16(detail::narrow_to_odd(value));
}

}  // namespace dissect
