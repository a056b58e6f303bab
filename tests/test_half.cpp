// Tests for dissect/numeric/half.hpp: fp16 and bf16 to and from float, exhaustively over all 65,536
// bit patterns of each, against references computed a different way (ldexp on the fields for
// decoding; for encoding, the nearest candidate by exact distance in double, ties to the even
// pattern). Every class of pattern is covered: ±0, subnormals, normals, the largest and smallest,
// ±Inf and NaN (which must stay NaN, come out quiet and keep its sign).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "dissect/numeric/half.hpp"

namespace dissect {
namespace test_half {

constexpr std::uint32_t bits_of(float x) {
  return std::bit_cast<std::uint32_t>(x);
}

// The checks are constexpr: a few known values at compile time.
static_assert(fp16_to_float(0x3c00) == 1.0f);
static_assert(fp16_to_float(0x7bff) == 65504.0f);
static_assert(bf16_to_float(0x3f80) == 1.0f);
static_assert(float_to_fp16(1.0f) == 0x3c00);
static_assert(float_to_bf16(-2.0f) == 0xc000);
static_assert(double_to_fp16(0.1) == 0x2e66);

// ---- independent references ---------------------------------------------------------------------

/// fp16 value from its fields: (−1)^s · m · 2⁻²⁴ for subnormals, (−1)^s · (1024 + m) · 2^(e − 25)
/// for normals. NaN patterns are not asked for.
double fp16_reference(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0x1f) return sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

/// bf16 value from its fields: (−1)^s · m · 2⁻¹³³ or (−1)^s · (128 + m) · 2^(e − 134).
double bf16_reference(std::uint16_t h) {
  const int exponent = (h >> 7) & 0xff;
  const int mantissa = h & 0x7f;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (exponent == 0xff) return sign * std::numeric_limits<double>::infinity();
  if (exponent == 0) return sign * std::ldexp(mantissa, -133);
  return sign * std::ldexp(128 + mantissa, exponent - 134);
}

bool is_fp16_nan(std::uint16_t h) {
  return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
}
bool is_bf16_nan(std::uint16_t h) {
  return (h & 0x7f80) == 0x7f80 && (h & 0x7f) != 0;
}

/// Whether `chosen` is a correctly rounded pattern for x among the finite, non-negative patterns
/// 0 … `largest` (and +Inf, `largest` + 1): no pattern is nearer, and a tie went to the even one.
/// Works on |x| (the sign is checked apart). Distances are exact: both sides are floats, and a
/// difference of two floats is a double.
template <class Decode>
::testing::AssertionResult rounds_to_nearest_even(double magnitude, std::uint16_t chosen,
                                                  std::uint16_t largest, Decode decode) {
  const double overflow = decode(largest) + (decode(largest) - decode(largest - 1)) / 2;
  if (magnitude >= overflow) {
    return chosen == largest + 1 ? ::testing::AssertionSuccess()
                                 : ::testing::AssertionFailure() << "should overflow to Inf";
  }
  const double distance = std::abs(magnitude - decode(chosen));
  for (int neighbour : {chosen - 1, chosen + 1}) {
    if (neighbour < 0 || neighbour > largest) continue;
    const double other = std::abs(magnitude - decode(static_cast<std::uint16_t>(neighbour)));
    if (other < distance || (other == distance && (chosen & 1))) {
      return ::testing::AssertionFailure()
             << magnitude << " went to pattern " << chosen << " but " << neighbour << " is "
             << (other < distance ? "nearer" : "as near and even");
    }
  }
  return ::testing::AssertionSuccess();
}

/// 200,000 random floats (their bits drawn, then `reshape`d with the draw's number) through
/// `encode` keep their sign and round to nearest even among `decode`'s patterns 0 … `largest`.
template <class Encode, class Decode, class Reshape>
void expect_random_floats_round_to_nearest(std::uint32_t seed, Encode encode, Decode decode,
                                           std::uint16_t largest, Reshape reshape) {
  std::mt19937 engine(seed);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  for (int i = 0; i < 200'000; ++i) {
    const std::uint32_t bits = reshape(any_bits(engine), i);
    const float x = std::bit_cast<float>(bits);
    if (std::isnan(x)) continue;
    const std::uint16_t pattern = encode(x);
    ASSERT_EQ(pattern >> 15, bits >> 31) << x;
    ASSERT_TRUE(rounds_to_nearest_even(std::abs(static_cast<double>(x)),
                                       static_cast<std::uint16_t>(pattern & 0x7fff), largest,
                                       decode))
        << x;
  }
}

// ---- fp16 ---------------------------------------------------------------------------------------

TEST(Fp16, EveryPatternWidensExactly) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto half = static_cast<std::uint16_t>(h);
    const float widened = fp16_to_float(half);
    SCOPED_TRACE(h);
    if (is_fp16_nan(half)) {
      const std::uint32_t bits = bits_of(widened);
      ASSERT_TRUE(std::isnan(widened));
      EXPECT_NE(bits & 0x0040'0000, 0u) << "NaN comes out quiet";
      EXPECT_EQ(bits >> 31, h >> 15u) << "NaN keeps its sign";
      EXPECT_EQ((bits >> 13) & 0x1ff, h & 0x1ff) << "NaN keeps its payload";
    } else {
      // Bit equality, so that −0 stays −0.
      ASSERT_EQ(bits_of(widened), bits_of(static_cast<float>(fp16_reference(half))));
    }
  }
}

TEST(Fp16, EveryPatternSurvivesTheRoundTrip) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto half = static_cast<std::uint16_t>(h);
    const std::uint16_t back = float_to_fp16(fp16_to_float(half));
    if (is_fp16_nan(half)) {
      EXPECT_TRUE(is_fp16_nan(back)) << h;
      EXPECT_EQ(back, half | 0x0200) << h << ": quiet, same sign and payload";
    } else {
      ASSERT_EQ(back, half) << h;
      ASSERT_EQ(double_to_fp16(fp16_reference(half)), half) << h;
    }
  }
}

TEST(Fp16, MidpointsTieToEvenAndTheirNeighboursRoundToTheNearerSide) {
  // Between every two adjacent non-negative patterns (0 and the smallest subnormal, through
  // 65504 and Inf): the midpoint is a float (12 significant bits), so is each float beside it.
  for (std::uint16_t low = 0; low <= 0x7bff; ++low) {
    const auto high = static_cast<std::uint16_t>(low + 1);
    const double upper = high == 0x7c00 ? 65536.0 : fp16_reference(high);
    const double middle = (fp16_reference(low) + upper) / 2;
    const auto midpoint = static_cast<float>(middle);
    ASSERT_EQ(static_cast<double>(midpoint), middle);
    const std::uint16_t even = (low & 1) ? high : low;
    SCOPED_TRACE(low);
    for (const float sign : {1.0f, -1.0f}) {
      const std::uint16_t negative = sign < 0 ? 0x8000 : 0;
      EXPECT_EQ(float_to_fp16(sign * midpoint), even | negative);
      EXPECT_EQ(float_to_fp16(sign * std::nextafter(midpoint, 0.0f)), low | negative);
      EXPECT_EQ(float_to_fp16(sign * std::nextafter(midpoint, INFINITY)), high | negative);
      // From double, a hair off the midpoint: a float in between would round it onto the
      // midpoint and then to even — the double rounding double_to_fp16 must not do.
      const double hair = middle * 0x1p-40;
      EXPECT_EQ(double_to_fp16(sign * (middle - hair)), low | negative);
      EXPECT_EQ(double_to_fp16(sign * (middle + hair)), high | negative);
      EXPECT_EQ(double_to_fp16(sign * middle), even | negative);
    }
  }
}

TEST(Fp16, RandomFloatsRoundToTheNearestPattern) {
  // Exponents spread over fp16's range and beyond (plus any float at all, one in four).
  expect_random_floats_round_to_nearest(12, float_to_fp16, fp16_reference, 0x7bff,
                                        [](std::uint32_t bits, int i) {
                                          if (i % 4 == 0) return bits;
                                          return (bits & 0x807f'ffff) | ((100 + bits % 50) << 23);
                                        });
}

TEST(Fp16, SpecialValues) {
  EXPECT_EQ(float_to_fp16(0.0f), 0x0000);
  EXPECT_EQ(float_to_fp16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_fp16(INFINITY), 0x7c00);
  EXPECT_EQ(float_to_fp16(-INFINITY), 0xfc00);
  EXPECT_EQ(float_to_fp16(65504.0f), 0x7bff);    // the largest
  EXPECT_EQ(float_to_fp16(65519.996f), 0x7bff);  // just under the overflow tie
  EXPECT_EQ(float_to_fp16(65520.0f), 0x7c00);    // the tie goes to Inf
  EXPECT_EQ(float_to_fp16(0x1p-24f), 0x0001);    // the smallest subnormal
  EXPECT_EQ(float_to_fp16(0x1p-25f), 0x0000);    // its half: tie to even (0)
  EXPECT_EQ(float_to_fp16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(float_to_fp16(0x1p-14f), 0x0400);  // the smallest normal
  EXPECT_EQ(float_to_fp16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(double_to_fp16(1e300), 0x7c00);
  EXPECT_EQ(double_to_fp16(-1e-300), 0x8000);
  EXPECT_EQ(fp16_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(fp16_to_float(0x03ff), 1023 * 0x1p-24f);  // the largest subnormal
  // A signalling float NaN comes out a quiet fp16 NaN with its sign.
  const float signalling = std::numeric_limits<float>::signaling_NaN();
  EXPECT_EQ(float_to_fp16(signalling) & 0x7e00, 0x7e00);
  EXPECT_EQ(float_to_fp16(-std::numeric_limits<float>::quiet_NaN()) & 0xfe00, 0xfe00);
  EXPECT_TRUE(is_fp16_nan(double_to_fp16(std::numeric_limits<double>::quiet_NaN())));
}

// ---- bf16 ---------------------------------------------------------------------------------------

TEST(Bf16, EveryPatternWidensToTheFloatWithTheseTopBits) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto brain = static_cast<std::uint16_t>(h);
    const std::uint32_t bits = bits_of(bf16_to_float(brain));
    if (is_bf16_nan(brain)) {
      EXPECT_EQ(bits, (h << 16) | 0x0040'0000) << h << ": quiet, same sign and payload";
    } else {
      ASSERT_EQ(bits, h << 16) << h;
      ASSERT_EQ(bits, bits_of(static_cast<float>(bf16_reference(brain)))) << h;
    }
  }
}

TEST(Bf16, EveryPatternSurvivesTheRoundTripAndMidpointsTieToEven) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto brain = static_cast<std::uint16_t>(h);
    const std::uint16_t back = float_to_bf16(bf16_to_float(brain));
    if (is_bf16_nan(brain)) {
      EXPECT_EQ(back, brain | 0x0040) << h;
      continue;
    }
    ASSERT_EQ(back, brain) << h;
    ASSERT_EQ(double_to_bf16(bf16_reference(brain)), brain) << h;
    if ((h & 0x7fff) >= 0x7f80) continue;  // Inf: nothing above it
    // The float halfway to the next pattern, and the floats beside it.
    const float middle = std::bit_cast<float>((h << 16) | 0x8000);
    const std::uint16_t even = (h & 1) ? static_cast<std::uint16_t>(h + 1) : brain;
    EXPECT_EQ(float_to_bf16(middle), even) << h;
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>((h << 16) | 0x7fff)), brain) << h;
    EXPECT_EQ(float_to_bf16(std::bit_cast<float>((h << 16) | 0x8001)), h + 1) << h;
    const double exact = static_cast<double>(middle);
    const double hair = std::abs(exact) * 0x1p-40;
    EXPECT_EQ(double_to_bf16(exact + (h & 0x8000 ? -hair : hair)), h + 1) << h;
    EXPECT_EQ(double_to_bf16(exact - (h & 0x8000 ? -hair : hair)), brain) << h;
  }
}

TEST(Bf16, RandomFloatsRoundToTheNearestPattern) {
  expect_random_floats_round_to_nearest(16, float_to_bf16, bf16_reference, 0x7f7f,
                                        [](std::uint32_t bits, int) { return bits; });
}

TEST(Bf16, SpecialValues) {
  EXPECT_EQ(float_to_bf16(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(INFINITY), 0x7f80);
  EXPECT_EQ(float_to_bf16(-INFINITY), 0xff80);
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);   // past the overflow tie
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x7f7f'0000u)), 0x7f7f);  // the largest
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bf16(std::bit_cast<float>(0x0000'8001u)), 0x0001);  // rounds up to a subnormal
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::signaling_NaN()) & 0x7fc0, 0x7fc0);
  EXPECT_EQ(double_to_bf16(1e300), 0x7f80);
  EXPECT_EQ(double_to_bf16(-std::numeric_limits<double>::infinity()), 0xff80);
  EXPECT_EQ(double_to_bf16(std::numeric_limits<double>::denorm_min()), 0x0000);
}

}  // namespace test_half
}  // namespace dissect
