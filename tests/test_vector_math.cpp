// Tests for kernels/detail/vector_math_avx512.hpp and vector_math_avx2.hpp: e^x, σ and the four
// activations on every instruction set this CPU has, against the scalar functions of
// activation.hpp evaluated in double, under the bounds of vector_math_bounds.hpp. Inputs: every
// 2039th float bit pattern in [−30, 30], 100k random floats of every magnitude, and
// the edges (zeros, subnormals, FLT_MAX, infinities, NaN, e^x's overflow and underflow
// thresholds). Where the scalar float function gives ±∞ or NaN the vector one must give the
// same; both-zero results must agree in sign. Each bound must also be tight enough to mean
// something: the worst error seen must use more than 1/16 of it, and a result off by 2⁻¹⁸
// relative must break it.
//
// Worst error / bound over all 2³² float inputs (measured once, exhaustively, on both ISAs, whose
// results agree bit for bit): exp 0.50, sigmoid 0.44, silu 0.49, gelu 0.70, gelu_tanh 0.55; for
// exp and gelu the worst is a subnormal result, against the floor term (normal results: 0.43 and
// 0.64). relu is exact. This test's sweep sees 0.41, 0.39, 0.48, 0.44 and 0.53.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "dissect/tensor/activation.hpp"
// A white-box test of private kernels: it may include their detail headers.
#define DISSECT_PUBLIC_HEADER
#include "dissect/kernels/detail/vector_math_avx2.hpp"
#include "dissect/kernels/detail/vector_math_avx512.hpp"
#include "dissect/kernels/detail/vector_math_bounds.hpp"
#include "dissect/quant/kernel_path.hpp"

#if DISSECT_X86

namespace test_vector_math {

using dissect::Activation;
using dissect::quant::KernelPath;
namespace kd = dissect::kernels::detail;

// ---- the functions under test and their references ----------------------------------------------

enum class Fn { exp, sigmoid, relu, gelu, gelu_tanh, silu };
constexpr Fn all_functions[] = {Fn::exp, Fn::sigmoid, Fn::relu, Fn::gelu, Fn::gelu_tanh, Fn::silu};

const char* name(Fn fn) {
  switch (fn) {
    case Fn::exp:
      return "exp";
    case Fn::sigmoid:
      return "sigmoid";
    case Fn::relu:
      return "relu";
    case Fn::gelu:
      return "gelu";
    case Fn::gelu_tanh:
      return "gelu_tanh";
    case Fn::silu:
      return "silu";
  }
  return "?";
}

Activation activation_of(Fn fn) {
  switch (fn) {
    case Fn::relu:
      return Activation::relu;
    case Fn::gelu:
      return Activation::gelu;
    case Fn::gelu_tanh:
      return Activation::gelu_tanh;
    default:
      return Activation::silu;
  }
}

kd::ActivationBound bound_of(Fn fn) {
  if (fn == Fn::exp) return kd::exp_bound;
  if (fn == Fn::sigmoid) return kd::sigmoid_bound;
  return kd::activation_bound(activation_of(fn));
}

/// The scalar code of activation.hpp in Scalar: float for the special values it must agree on,
/// double for the reference value.
template <class Scalar>
Scalar scalar_value(Fn fn, Scalar x) {
  namespace d = dissect::detail;
  switch (fn) {
    case Fn::exp:
      return std::exp(x);
    case Fn::sigmoid:
      return d::activation_sigmoid(x);
    case Fn::relu:
      return d::activation_value<Activation::relu>(x);
    case Fn::gelu:
      return d::activation_value<Activation::gelu>(x);
    case Fn::gelu_tanh:
      return d::activation_value<Activation::gelu_tanh>(x);
    case Fn::silu:
      return d::activation_value<Activation::silu>(x);
  }
  return x;
}

enum class Isa { avx2, avx512 };

const char* name(Isa isa) {
  return isa == Isa::avx2 ? "avx2" : "avx512";
}

bool supported(Isa isa) {
  return dissect::quant::cpu_supports(isa == Isa::avx2 ? KernelPath::avx2 : KernelPath::avx512);
}

// The activations go through activate(), the switch the GEMM epilogue calls. The AVX-512 pair is
// bracketed as the library's kernels are: GCC 12's intrinsics warn wherever they are inlined.
DISSECT_AVX512_WARNINGS_BEGIN
DISSECT_TARGET_AVX512 __m512 apply_one(Fn fn, __m512 x) {
  if (fn == Fn::exp) return kd::avx512::exp(x);
  if (fn == Fn::sigmoid) return kd::avx512::sigmoid(x);
  return kd::avx512::activate(activation_of(fn), x);
}

DISSECT_TARGET_AVX2 __m256 apply_one(Fn fn, __m256 x) {
  if (fn == Fn::exp) return kd::avx2::exp(x);
  if (fn == Fn::sigmoid) return kd::avx2::sigmoid(x);
  return kd::avx2::activate(activation_of(fn), x);
}

/// y[i] = fn(x[i]) for i < n, n a multiple of the vector width.
DISSECT_TARGET_AVX512 void apply_avx512(Fn fn, const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 16) {
    _mm512_storeu_ps(y + i, apply_one(fn, _mm512_loadu_ps(x + i)));
  }
}
DISSECT_AVX512_WARNINGS_END

DISSECT_TARGET_AVX2 void apply_avx2(Fn fn, const float* x, float* y, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 8) {
    _mm256_storeu_ps(y + i, apply_one(fn, _mm256_loadu_ps(x + i)));
  }
}

void apply(Isa isa, Fn fn, const float* x, float* y, std::size_t n) {
  if (isa == Isa::avx512) {
    apply_avx512(fn, x, y, n);
  } else {
    apply_avx2(fn, x, y, n);
  }
}

std::vector<float> apply(Isa isa, Fn fn, const std::vector<float>& x) {
  constexpr std::size_t width = 16;
  const std::size_t body = x.size() / width * width;
  std::vector<float> y(x.size());
  apply(isa, fn, x.data(), y.data(), body);
  float tail_x[width] = {}, tail_y[width];
  std::copy(x.begin() + body, x.end(), tail_x);
  apply(isa, fn, tail_x, tail_y, width);
  std::copy(tail_y, tail_y + (x.size() - body), y.begin() + body);
  return y;
}

// ---- inputs -------------------------------------------------------------------------------------

float from_bits(std::uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

std::uint32_t to_bits(float x) {
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
}

/// Every stride-th float bit pattern in [0, 30], and its negation. A prime stride walks through
/// every low-bit pattern of the mantissa rather than a fixed few.
std::vector<float> sweep_inputs() {
  constexpr std::uint32_t stride = 2039;
  const std::uint32_t last = to_bits(30.0f);
  std::vector<float> x;
  x.reserve(2 * (last / stride + 1));
  for (std::uint32_t bits = 0; bits <= last; bits += stride) {
    x.push_back(from_bits(bits));
    x.push_back(-from_bits(bits));
  }
  return x;
}

/// Mostly |x| = 2^U(−30, 7) with either sign, the rest uniform bit patterns: every exponent,
/// subnormals, infinities and NaNs included. Seeded: a failure reproduces.
std::vector<float> random_inputs() {
  std::mt19937 rng(20240611);
  std::uniform_real_distribution<float> exponent(-30.0f, 7.0f);
  std::uniform_int_distribution<std::uint32_t> bits;
  std::vector<float> x(100000);
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (i % 4 == 3) {
      x[i] = from_bits(bits(rng));
    } else {
      const float magnitude = std::exp2(exponent(rng));
      x[i] = bits(rng) & 1 ? -magnitude : magnitude;
    }
  }
  return x;
}

/// e^x overflows from 88.7228394 (ln FLT_MAX = 88.72283905) and rounds to 0 below
/// −103.972077 (= ln 2⁻¹⁵⁰); subnormal results start below −87.336544 (ln FLT_MIN). σ and silu
/// flush to 0 at −88.7228394, gelu's result underflows near −13.2 and reaches 0 near −14.4.
constexpr float exp_overflow = 88.72283935546875f;     // the first float with e^x > FLT_MAX
constexpr float exp_underflow = -103.97207641601562f;  // the last float with e^x ≥ 2⁻¹⁵⁰

std::vector<float> edge_inputs() {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const float thresholds[] = {exp_overflow, exp_underflow, -87.336544f, -88.72283935546875f,
                              13.2f,        14.42f,        16.0f,       1e30f,
                              FLT_MAX,      FLT_MIN,       1.0f,        0.5f};
  std::vector<float> x = {0.0f,
                          -0.0f,
                          std::numeric_limits<float>::denorm_min(),
                          -std::numeric_limits<float>::denorm_min(),
                          FLT_MIN / 3,
                          -FLT_MIN / 3,
                          inf,
                          -inf,
                          std::numeric_limits<float>::quiet_NaN(),
                          -std::numeric_limits<float>::quiet_NaN()};
  for (float t : thresholds) {
    for (float v : {t, -t}) {
      x.push_back(v);
      x.push_back(std::nextafter(v, inf));
      x.push_back(std::nextafter(v, -inf));
    }
  }
  return x;
}

// ---- the check ----------------------------------------------------------------------------------

struct Outcome {
  int failures = 0;
  /// Largest error / bound where the result is a normal float (the floor term negligible).
  double worst_ratio = 0;
  float worst_x = 0;
};

/// Compares fn on isa with the scalar reference over xs and reports the first few failures as
/// test failures. When `planted` is nonzero, every result is first scaled by 1 + planted — an
/// error the check must catch — and the check stops quietly at the first failure.
Outcome check(Isa isa, Fn fn, const std::vector<float>& xs, double planted = 0) {
  const kd::ActivationBound bound = bound_of(fn);
  const std::vector<float> ys = apply(isa, fn, xs);
  Outcome out;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    const float x = xs[i];
    const float v = planted == 0 ? ys[i] : float(double(ys[i]) * (1 + planted));
    const float s = scalar_value(fn, x);
    const double f = scalar_value(fn, double(x));
    const double err = std::isfinite(v) ? std::fabs(double(v) - f) : HUGE_VAL;
    const double allowed = bound.allowed(x, f);
    bool ok;
    if (!std::isfinite(x) || !std::isfinite(s)) {
      ok = std::isnan(s) ? std::isnan(v) : v == s;
    } else if (v == 0 && s == 0) {
      ok = std::signbit(v) == std::signbit(s);
    } else {
      ok = err <= allowed;
      if (std::fabs(f) >= FLT_MIN && allowed > 0 && err / allowed > out.worst_ratio) {
        out.worst_ratio = err / allowed;
        out.worst_x = x;
      }
    }
    if (ok) continue;
    ++out.failures;
    if (planted != 0) return out;
    if (out.failures <= 8) {
      ADD_FAILURE() << name(fn) << " on " << name(isa) << " at x = " << x << " (" << std::hexfloat
                    << x << std::defaultfloat << "): got " << v << ", the scalar float gives " << s
                    << ", the reference (double) " << f << ": error " << err << ", bound "
                    << allowed;
    }
  }
  return out;
}

const std::vector<float>& sweep() {
  static const std::vector<float> x = sweep_inputs();
  return x;
}

const std::vector<float>& randoms() {
  static const std::vector<float> x = random_inputs();
  return x;
}

// ---- the tests ----------------------------------------------------------------------------------

struct Case {
  Isa isa;
  Fn fn;
};

void PrintTo(const Case& c, std::ostream* out) {
  *out << name(c.isa) << " " << name(c.fn);
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    for (Fn fn : all_functions) cases.push_back({isa, fn});
  }
  return cases;
}

class VectorMath : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    if (!supported(GetParam().isa)) {
      GTEST_SKIP() << "this CPU cannot run the " << name(GetParam().isa) << " path";
    }
  }
};

TEST_P(VectorMath, SweepWithinBoundAndBoundIsTight) {
  const auto [isa, fn] = GetParam();
  const Outcome out = check(isa, fn, sweep());
  EXPECT_EQ(out.failures, 0) << name(fn) << " on " << name(isa);
  // In the XML report (--gtest_output=xml), not on the console: how much of the bound is used.
  RecordProperty("worst_ratio", std::to_string(out.worst_ratio));
  // relu's bound is 0: exactness is all there is to check.
  if (fn != Fn::relu) {
    // A bound the function never comes near would pass anything: it must be within 16×.
    EXPECT_GT(out.worst_ratio, 1.0 / 16)
        << name(fn) << " on " << name(isa) << ": worst error is only " << out.worst_ratio
        << " of the bound (at x = " << out.worst_x << ")";
    EXPECT_LE(out.worst_ratio, 1.0);
  }
}

TEST_P(VectorMath, RandomFloatsWithinBound) {
  const auto [isa, fn] = GetParam();
  EXPECT_EQ(check(isa, fn, randoms()).failures, 0) << name(fn) << " on " << name(isa);
}

TEST_P(VectorMath, EdgesMatchTheScalar) {
  const auto [isa, fn] = GetParam();
  EXPECT_EQ(check(isa, fn, edge_inputs()).failures, 0) << name(fn) << " on " << name(isa);
}

TEST_P(VectorMath, PlantedErrorIsCaught) {
  const auto [isa, fn] = GetParam();
  EXPECT_GT(check(isa, fn, randoms(), 0x1.0p-18).failures, 0)
      << name(fn) << " on " << name(isa) << ": a result off by 2^-18 passed the check";
}

INSTANTIATE_TEST_SUITE_P(AllPaths, VectorMath, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return std::string(name(info.param.isa)) + "_" + name(info.param.fn);
                         });

// e^x's thresholds exactly as expf's: the last finite result and the first ∞, the last 2⁻¹⁴⁹
// and the first 0 (which the bound alone would not pin down: 0 and 2⁻¹⁴⁹ are both within it).
TEST(VectorMathExp, ThresholdsAreTheScalars) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {exp_overflow, std::nextafter(exp_overflow, 0.0f), exp_underflow,
                                std::nextafter(exp_underflow, -inf)};
  for (Isa isa : {Isa::avx2, Isa::avx512}) {
    if (!supported(isa)) continue;
    const std::vector<float> y = apply(isa, Fn::exp, x);
    for (std::size_t i = 0; i < x.size(); ++i) {
      EXPECT_EQ(to_bits(y[i]), to_bits(std::exp(x[i])))
          << "exp on " << name(isa) << " at x = " << std::hexfloat << x[i] << ": got " << y[i]
          << ", expf gives " << std::exp(x[i]);
    }
  }
}

// Both paths run the same operations in the same order, which is why they share one bound:
// they must agree bit for bit (NaN with NaN).
TEST(VectorMathPaths, Avx2AndAvx512AgreeBitForBit) {
  if (!supported(Isa::avx512) || !supported(Isa::avx2)) {
    GTEST_SKIP() << "this CPU lacks AVX2 or AVX-512";
  }
  for (Fn fn : all_functions) {
    for (const std::vector<float>* xs : {&sweep(), &randoms()}) {
      const std::vector<float> a = apply(Isa::avx2, fn, *xs);
      const std::vector<float> b = apply(Isa::avx512, fn, *xs);
      int differences = 0;
      for (std::size_t i = 0; i < xs->size(); ++i) {
        if (to_bits(a[i]) != to_bits(b[i]) && !(std::isnan(a[i]) && std::isnan(b[i])) &&
            ++differences <= 4) {
          ADD_FAILURE() << name(fn) << " at x = " << std::hexfloat << (*xs)[i] << ": avx2 gives "
                        << a[i] << ", avx512 " << b[i];
        }
      }
      EXPECT_EQ(differences, 0) << name(fn);
    }
  }
}

}  // namespace test_vector_math

#else

TEST(VectorMath, NotX86) {
  GTEST_SKIP() << "the vectorised activations exist on x86 only";
}

#endif  // DISSECT_X86
