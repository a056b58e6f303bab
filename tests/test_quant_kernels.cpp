// Tests for dissect/quant/kernel_path.hpp and quant/detail/quant_kernels.hpp: every SIMD path
// this CPU supports, pinned one at a time, against the scalar oracle on random shapes with a
// per-element bound derived from the path's arithmetic (the bounds are stated and derived in
// quant_kernels.hpp); the oracle against hand-computed values; the bounds against a result that
// is wrong by one term; dispatch, pinning and errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "dissect/numeric/half.hpp"
// A white-box test of private kernels: it may include their detail headers.
#define DISSECT_PUBLIC_HEADER
#include "dissect/quant/detail/quant_kernels.hpp"
#include "dissect/quant/kernel_path.hpp"

namespace test_quant_kernels {

using dissect::index_t;
using dissect::quant::KernelPath;
using dissect::quant::WeightFormat;
namespace dq = dissect::quant;
namespace qd = dissect::quant::detail;

constexpr double u32 = 0x1.0p-24;  // fp32 unit roundoff

double gamma(index_t n) {
  return double(n) * u32 / (1.0 - double(n) * u32);
}

/// Undoes any pin when a test ends, passing or failing.
struct PinGuard {
  ~PinGuard() { dq::force_kernel_path(std::nullopt); }
};

// ---- owning weights of each format
// ---------------------------------------------------------------

struct Bf16Weights {
  static constexpr WeightFormat format = WeightFormat::bf16;
  std::vector<std::uint16_t> bits;
  index_t rows = 0, cols = 0;
  qd::Bf16WeightsView view() const { return {bits.data(), rows, cols}; }
  static Bf16Weights random(index_t n, index_t k, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    Bf16Weights w{std::vector<std::uint16_t>(std::size_t(n * k)), n, k};
    for (auto& b : w.bits) b = dissect::float_to_bf16(value(rng));
    return w;
  }
};

struct Int8Weights {
  static constexpr WeightFormat format = WeightFormat::int8;
  std::vector<std::int8_t> values;
  std::vector<float> scales;
  std::vector<std::int32_t> row_sums;
  index_t rows = 0, cols = 0;
  qd::Int8WeightsView view() const {
    return {values.data(), scales.data(), row_sums.data(), rows, cols};
  }
  static Int8Weights random(index_t n, index_t k, std::mt19937_64& rng) {
    std::uniform_int_distribution<int> value(-127, 127);
    std::uniform_real_distribution<float> scale(1e-3f, 1e-1f);
    Int8Weights w{std::vector<std::int8_t>(std::size_t(n * k)), std::vector<float>(std::size_t(n)),
                  std::vector<std::int32_t>(std::size_t(n)), n, k};
    for (auto& v : w.values) v = static_cast<std::int8_t>(value(rng));
    for (index_t r = 0; r < n; ++r) {
      w.scales[r] = scale(rng);
      for (index_t c = 0; c < k; ++c) w.row_sums[r] += w.values[r * k + c];
    }
    return w;
  }
};

struct Q4Weights {
  static constexpr WeightFormat format = WeightFormat::q4_0;
  std::vector<std::uint8_t> nibbles;
  std::vector<std::uint16_t> scales;
  index_t rows = 0, cols = 0;
  qd::Q4WeightsView view() const { return {nibbles.data(), scales.data(), rows, cols}; }
  static Q4Weights random(index_t n, index_t k, std::mt19937_64& rng) {
    std::uniform_int_distribution<int> byte(0, 255);
    std::uniform_real_distribution<float> scale(1e-3f, 1e-1f);
    Q4Weights w{std::vector<std::uint8_t>(std::size_t(n * k / 2)),
                std::vector<std::uint16_t>(std::size_t(n * k / 32)), n, k};
    for (auto& b : w.nibbles) b = static_cast<std::uint8_t>(byte(rng));
    for (auto& s : w.scales) s = dissect::float_to_fp16(scale(rng));
    return w;
  }
};

// ---- the bound
// -----------------------------------------------------------------------------------

/// The per-element bound of `path` on y[i, n] against the scalar oracle (see quant_kernels.hpp).
/// Against the oracle rather than the exact sum: the oracle adds its own rounding, u·|y| ≤ u·S,
/// and its double sum's K·2⁻⁵³·S; γ_{K+10} ≥ γ_{K+8} + 2u covers both for any K < 2²⁹.
template <class View>
double element_bound(KernelPath path, const View& w, const float* x, index_t n, const float* bias) {
  const index_t K = w.cols;
  const double g = gamma(K + 10);
  double bound = 0.0, scale_sum = bias ? std::abs(double(bias[n])) : 0.0;
  for (index_t b = 0; b * 32 < K; ++b) {
    const index_t end = std::min(K, b * 32 + 32);
    float amax = 0.0f;
    for (index_t k = b * 32; k < end; ++k) amax = std::max(amax, std::abs(x[k]));
    const double sx = double(amax / 127.0f);  // exactly as the kernel computes it
    for (index_t k = b * 32; k < end; ++k) {
      const double xw = std::abs(double(x[k])), ww = std::abs(qd::weight_value(w, n, k));
      if (path == KernelPath::avx512_vnni) {
        const double dx = sx / 2 * (1 + 0x1.0p-14);
        bound += dx * ww;
        scale_sum += (xw + dx) * ww;
      } else if (path == KernelPath::avx512_bf16) {
        bound += 0x1.0p-8 * xw * ww;
        scale_sum += xw * (1 + 0x1.0p-8) * ww;
      } else {
        scale_sum += xw * ww;
      }
    }
  }
  // vdpbf16ps flushes subnormals: ≤ 2⁻¹²⁶ per operand and partial sum, far below the rest here.
  const double flush = path == KernelPath::avx512_bf16 ? double(K + 1) * 0x1.0p-100 : 0.0;
  return bound + g * scale_sum + flush;
}

struct Violations {
  index_t count = 0;
  std::string first;
  double max_bound_over_scale = 0.0;
};

/// Compares y with the oracle element by element; also the largest bound / Σ|x·ŵ| seen, so a
/// test can show the bound is tight enough to catch a wrong result.
template <class View>
Violations compare(KernelPath path, const View& w, const float* x, index_t ldx, index_t m,
                   const float* y, const float* oracle, index_t ldy, const float* bias) {
  Violations v;
  for (index_t i = 0; i < m; ++i) {
    for (index_t n = 0; n < w.rows; ++n) {
      const double bound = element_bound(path, w, x + i * ldx, n, bias);
      double scale = 0.0;
      for (index_t k = 0; k < w.cols; ++k) {
        scale += std::abs(double(x[i * ldx + k]) * qd::weight_value(w, n, k));
      }
      if (scale > 0) v.max_bound_over_scale = std::max(v.max_bound_over_scale, bound / scale);
      const double got = y[i * ldy + n], want = oracle[i * ldy + n];
      if (!(std::abs(got - want) <= bound)) {
        if (v.count++ == 0) {
          v.first =
              dissect::detail::concat("y[", i, ", ", n, "] = ", got, " vs oracle ", want,
                                      " (|diff| ", std::abs(got - want), " > bound ", bound, ")");
        }
      }
    }
  }
  return v;
}

// ---- random cases
// ----------------------------------------------------------------------------------

struct Case {
  index_t m, N, K, ldx, ldy;
  bool x_offset, bias;
  int threads;
  int x_kind;  // 0 uniform, 1 with zero blocks, 2 large, 3 tiny
};

index_t pick(std::mt19937_64& rng, const std::vector<index_t>& edges, index_t lo, index_t hi) {
  if (std::uniform_int_distribution<int>(0, 2)(rng) < 2) {
    return edges[std::uniform_int_distribution<std::size_t>(0, edges.size() - 1)(rng)];
  }
  return std::uniform_int_distribution<index_t>(lo, hi)(rng);
}

std::vector<Case> random_cases(WeightFormat format, int count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<index_t> ms = {1, 2, 3, 7, 8, 9, 31, 32, 33, 64, 65};
  const std::vector<index_t> ks = {1, 2, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 255};
  const std::vector<index_t> q4_ks = {32, 64, 96, 128, 160, 256, 288, 384};
  const std::vector<index_t> ns = {1, 2, 3, 4, 5, 15, 16, 17, 33};
  std::vector<Case> cases;
  // K beyond one chunk (1024) with m > 8, where partial sums go through y: both K tails.
  for (index_t m : {9, 33}) {
    for (index_t K : {index_t{2080}, index_t{2113}}) {
      if (format == WeightFormat::q4_0 && K % 32) continue;
      cases.push_back({m, 5, K, K + 3, 9, true, true, 2, 0});
    }
  }
  // W big enough (70k weights) that threads = 2 really forks.
  for (index_t m : {1, 8, 33}) cases.push_back({m, 67, 1056, 1057, 67, m == 8, m != 1, 2, 0});
  std::uniform_int_distribution<int> coin(0, 1), quarter(0, 3);
  while (int(cases.size()) < count) {
    Case c{};
    c.m = pick(rng, ms, 1, 70);
    c.K = format == WeightFormat::q4_0 ? pick(rng, q4_ks, 1, 12) : pick(rng, ks, 1, 300);
    if (format == WeightFormat::q4_0 && c.K < 32) c.K *= 32;
    c.N = pick(rng, ns, 1, 40);
    // Keep each case under ~60k multiply-adds so the whole suite stays fast under ASan.
    while (c.m * c.N * c.K > 60'000 && c.N > 1) c.N /= 2;
    while (c.m * c.N * c.K > 60'000 && c.m > 1) c.m /= 2;
    c.ldx = c.K + (quarter(rng) == 0 ? std::uniform_int_distribution<index_t>(1, 7)(rng) : 0);
    c.ldy = c.N + (quarter(rng) == 0 ? std::uniform_int_distribution<index_t>(1, 7)(rng) : 0);
    c.x_offset = coin(rng);
    c.bias = coin(rng);
    c.threads = 1 + coin(rng);
    c.x_kind = quarter(rng);
    cases.push_back(c);
  }
  return cases;
}

/// x with `offset` leading floats, so row 0 can start off any alignment.
std::vector<float> random_x(const Case& c, std::mt19937_64& rng) {
  std::vector<float> x(std::size_t(c.m * c.ldx + 1), std::nanf(""));  // padding must not be read
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  const float scale = c.x_kind == 2 ? 1e3f : c.x_kind == 3 ? 1e-3f : 1.0f;
  for (index_t i = 0; i < c.m; ++i) {
    for (index_t k = 0; k < c.K; ++k) {
      // Kind 1: whole zero blocks of 32 (a quantisation scale of 0) and single zeros.
      const bool zero = c.x_kind == 1 && ((k / 32 + i) % 3 == 0 || k % 7 == 0);
      x[std::size_t(c.x_offset + i * c.ldx + k)] = zero ? 0.0f : scale * value(rng);
    }
  }
  return x;
}

template <class Weights>
void run_random(int count, std::uint64_t seed) {
  PinGuard guard;
  const auto cases = random_cases(Weights::format, count, seed);
  std::mt19937_64 rng(seed + 1);
  int runs = 0;
  for (const Case& c : cases) {
    const Weights weights = Weights::random(c.N, c.K, rng);
    const auto w = weights.view();
    const std::vector<float> xs = random_x(c, rng);
    const float* x = xs.data() + (c.x_offset ? 1 : 0);
    std::vector<float> bias(std::size_t(c.N));
    for (auto& b : bias) b = std::uniform_real_distribution<float>(-1, 1)(rng);
    const float* b = c.bias ? bias.data() : nullptr;
    const std::size_t y_size = std::size_t(c.m * c.ldy);
    std::vector<float> oracle(y_size, -7.0f);
    qd::quantized_matmul(KernelPath::scalar, w, x, c.ldx, c.m, oracle.data(), c.ldy, b, 1);
    for (KernelPath path : dq::supported_kernel_paths()) {
      if (path == KernelPath::scalar || !dq::path_applies(path, Weights::format)) continue;
      dq::force_kernel_path(path);
      ASSERT_EQ(dq::active_kernel_path(Weights::format, c.m), path);
      std::vector<float> y(y_size, -7.0f);  // the gaps past N must survive
      qd::quantized_matmul(w, x, c.ldx, c.m, y.data(), c.ldy, b, c.threads);
      ++runs;
      const Violations v = compare(path, w, x, c.ldx, c.m, y.data(), oracle.data(), c.ldy, b);
      bool gaps_intact = true;
      for (index_t i = 0; i < c.m; ++i) {
        for (index_t n = c.N; n < c.ldy; ++n) gaps_intact &= y[std::size_t(i * c.ldy + n)] == -7.0f;
      }
      const std::string where =
          dissect::detail::concat(dq::kernel_path_name(path), " m=", c.m, " N=", c.N, " K=", c.K,
                                  " ldx=", c.ldx, " ldy=", c.ldy, " offset=", c.x_offset,
                                  " bias=", c.bias, " threads=", c.threads, " x_kind=", c.x_kind);
      ASSERT_EQ(v.count, 0) << where << ": " << v.count << " elements out of bound, first "
                            << v.first;
      ASSERT_TRUE(gaps_intact) << where << ": wrote past N";
      // Splitting N over threads changes no element's arithmetic: bit for bit the same.
      if (c.threads == 2) {
        std::vector<float> y1(y_size, -7.0f);
        qd::quantized_matmul(w, x, c.ldx, c.m, y1.data(), c.ldy, b, 1);
        ASSERT_EQ(0, std::memcmp(y.data(), y1.data(), y_size * sizeof(float))) << where;
      }
    }
  }
  std::printf("[          ] %zu shapes, %d path runs against the oracle\n", cases.size(), runs);
}

TEST(QuantKernels, Bf16EveryPathWithinItsBound) {
  run_random<Bf16Weights>(1000, 101);
}
TEST(QuantKernels, Int8EveryPathWithinItsBound) {
  run_random<Int8Weights>(1000, 202);
}
TEST(QuantKernels, Q4EveryPathWithinItsBound) {
  run_random<Q4Weights>(1000, 303);
}

// ---- the prefill GEMMs (quant_gemm_vnni.hpp, quant_gemm_bf16.hpp), called directly at every m --
#if DISSECT_X86

/// A packed GEMM at any m (dispatch runs it from vnni_gemm_min_rows_* / bf16_gemm_min_rows on),
/// against the oracle with its path's bound: K across packed chunks (512) and pads (64), N across
/// panels (32) and 16-column halves, m across micro-tiles (6) and row blocks, leading dimensions,
/// bias, threads; a forked run must equal the single-threaded one bit for bit.
template <class Weights>
void run_gemm(int count, std::uint64_t seed) {
  // The GEMM under test and the path whose bound it must meet.
  constexpr bool bf16 = Weights::format == WeightFormat::bf16;
  const KernelPath path = bf16 ? KernelPath::avx512_bf16 : KernelPath::avx512_vnni;
  const auto gemm = [](const auto& w, const float* x, index_t ldx, index_t m, const qd::Output& out,
                       int threads) {
    if constexpr (std::is_same_v<std::decay_t<decltype(w)>, qd::Bf16WeightsView>) {
      qd::bf16_gemm(w, x, ldx, m, out, threads);
    } else {
      qd::vnni_gemm(w, x, ldx, m, out, threads);
    }
  };
  std::mt19937_64 rng(seed);
  const bool q4 = Weights::format == WeightFormat::q4_0;
  const std::vector<index_t> ms = {1, 2, 5, 6, 7, 8, 12, 13, 31, 64, 127, 128, 129};
  const std::vector<index_t> ks = {1, 3, 31, 32, 33, 63, 64, 65, 511, 512, 513, 575, 1088};
  const std::vector<index_t> q4_ks = {32, 64, 96, 480, 512, 544, 1056};
  const std::vector<index_t> ns = {1, 15, 16, 17, 31, 32, 33, 48, 64, 65};
  std::vector<Case> cases;
  // Big enough to fork (≥ 4M multiply-adds): N narrow (row blocks shared) and wide (panels).
  cases.push_back({130, 40, q4 ? 1024 : 1030, q4 ? 1027 : 1030, 41, true, true, 2, 0});
  cases.push_back({64, 161, 512, 512, 161, false, false, 2, 1});
  std::uniform_int_distribution<int> coin(0, 1), quarter(0, 3);
  while (int(cases.size()) < count) {
    Case c{};
    c.m = pick(rng, ms, 1, 140);
    c.K = q4 ? pick(rng, q4_ks, 1, 40) : pick(rng, ks, 1, 1100);
    if (q4 && c.K % 32) c.K *= 32;  // a random block count
    c.N = pick(rng, ns, 1, 70);
    while (c.m * c.N * c.K > 100'000 && c.N > 1) c.N /= 2;
    while (c.m * c.N * c.K > 100'000 && c.m > 1) c.m /= 2;
    c.ldx = c.K + (quarter(rng) == 0 ? std::uniform_int_distribution<index_t>(1, 7)(rng) : 0);
    c.ldy = c.N + (quarter(rng) == 0 ? std::uniform_int_distribution<index_t>(1, 7)(rng) : 0);
    c.x_offset = coin(rng);
    c.bias = coin(rng);
    c.threads = 1 + coin(rng);
    c.x_kind = quarter(rng);
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    const Weights weights = Weights::random(c.N, c.K, rng);
    const auto w = weights.view();
    const std::vector<float> xs = random_x(c, rng);
    const float* x = xs.data() + (c.x_offset ? 1 : 0);
    std::vector<float> bias(std::size_t(c.N));
    for (auto& b : bias) b = std::uniform_real_distribution<float>(-1, 1)(rng);
    const float* b = c.bias ? bias.data() : nullptr;
    const std::size_t y_size = std::size_t(c.m * c.ldy);
    std::vector<float> oracle(y_size, -7.0f), y(y_size, -7.0f);
    qd::quantized_matmul(KernelPath::scalar, w, x, c.ldx, c.m, oracle.data(), c.ldy, b, 1);
    gemm(w, x, c.ldx, c.m, qd::Output{y.data(), c.ldy, b}, c.threads);
    const std::string where = dissect::detail::concat(
        dq::kernel_path_name(path), " GEMM m=", c.m, " N=", c.N, " K=", c.K, " ldx=", c.ldx,
        " ldy=", c.ldy, " bias=", c.bias, " threads=", c.threads, " x_kind=", c.x_kind);
    const Violations v = compare(path, w, x, c.ldx, c.m, y.data(), oracle.data(), c.ldy, b);
    ASSERT_EQ(v.count, 0) << where << ": " << v.count << " elements out of bound, first "
                          << v.first;
    for (index_t i = 0; i < c.m; ++i) {
      for (index_t n = c.N; n < c.ldy; ++n) {
        ASSERT_EQ(y[std::size_t(i * c.ldy + n)], -7.0f) << where << ": wrote past N";
      }
    }
    if (c.threads == 2) {
      std::vector<float> y1(y_size, -7.0f);
      gemm(w, x, c.ldx, c.m, qd::Output{y1.data(), c.ldy, b}, 1);
      ASSERT_EQ(0, std::memcmp(y.data(), y1.data(), y_size * sizeof(float))) << where;
    }
  }
  std::printf("[          ] %zu shapes against the oracle\n", cases.size());
}

/// The GEMM's result with a vector of 16 terms counted twice must fail the bound it passes.
template <class Weights>
void check_gemm_bound_catches_a_doubled_vector() {
  constexpr bool bf16 = Weights::format == WeightFormat::bf16;
  const KernelPath path = bf16 ? KernelPath::avx512_bf16 : KernelPath::avx512_vnni;
  std::mt19937_64 rng(11);
  const Case c{13, 33, 576, 576, 33, false, true, 1, 0};
  const Weights weights = Weights::random(c.N, c.K, rng);
  const auto w = weights.view();
  const std::vector<float> xs = random_x(c, rng);
  std::vector<float> bias(33, 0.25f), oracle(13 * 33), y(13 * 33);
  qd::quantized_matmul(KernelPath::scalar, w, xs.data(), c.K, c.m, oracle.data(), 33, bias.data(),
                       1);
  if constexpr (bf16) {
    qd::bf16_gemm(w, xs.data(), c.K, c.m, qd::Output{y.data(), 33, bias.data()}, 1);
  } else {
    qd::vnni_gemm(w, xs.data(), c.K, c.m, qd::Output{y.data(), 33, bias.data()}, 1);
  }
  const auto check = [&] {
    return compare(path, w, xs.data(), c.K, c.m, y.data(), oracle.data(), 33, bias.data());
  };
  EXPECT_EQ(check().count, 0) << check().first;
  for (index_t i = 0; i < c.m; ++i) {
    for (index_t n = 0; n < c.N; ++n) {
      double extra = 0.0;
      for (index_t k = 512; k < 528; ++k) extra += xs[i * c.K + k] * qd::weight_value(w, n, k);
      y[std::size_t(i * 33 + n)] += float(extra);
    }
  }
  EXPECT_GE(check().count, 100) << "the bound let a wrong GEMM result by";
}

TEST(QuantKernels, VnniGemmInt8WithinItsBound) {
  if (!dq::cpu_supports(KernelPath::avx512_vnni)) GTEST_SKIP() << "no AVX512_VNNI";
  run_gemm<Int8Weights>(1000, 404);
  check_gemm_bound_catches_a_doubled_vector<Int8Weights>();
}
TEST(QuantKernels, VnniGemmQ4WithinItsBound) {
  if (!dq::cpu_supports(KernelPath::avx512_vnni)) GTEST_SKIP() << "no AVX512_VNNI";
  run_gemm<Q4Weights>(1000, 505);
  check_gemm_bound_catches_a_doubled_vector<Q4Weights>();
}
TEST(QuantKernels, Bf16GemmWithinItsBound) {
  if (!dq::cpu_supports(KernelPath::avx512_bf16)) GTEST_SKIP() << "no AVX512_BF16";
  run_gemm<Bf16Weights>(1000, 606);
  check_gemm_bound_catches_a_doubled_vector<Bf16Weights>();
}
#endif

// ---- the oracle against hand-computed values ----------------------------------------------------

TEST(QuantKernels, ScalarOracleMatchesHandComputedBf16) {
  // W = [[1, −2, 0.5], [0.25, 3, −1]] (all exact in bf16), x = [1, 2, 3], b = [0.5, −1]:
  // y0 = 1 − 4 + 1.5 + 0.5 = −1;  y1 = 0.25 + 6 − 3 − 1 = 2.25.
  std::vector<std::uint16_t> bits;
  for (float v : {1.0f, -2.0f, 0.5f, 0.25f, 3.0f, -1.0f}) bits.push_back(dissect::float_to_bf16(v));
  const float x[] = {1, 2, 3}, bias[] = {0.5f, -1.0f};
  float y[2] = {};
  qd::quantized_matmul(KernelPath::scalar, qd::Bf16WeightsView{bits.data(), 2, 3}, x, 3, 1, y, 2,
                       bias, 1);
  EXPECT_EQ(y[0], -1.0f);
  EXPECT_EQ(y[1], 2.25f);
}

TEST(QuantKernels, ScalarOracleMatchesHandComputedInt8) {
  // values [[1, −2, 3], [127, −127, 0]], scales [0.5, 0.25], x = [1, 2, 3], no bias:
  // y0 = 0.5·(1 − 4 + 9) = 3;  y1 = 0.25·(127 − 254 + 0) = −31.75.
  const std::int8_t values[] = {1, -2, 3, 127, -127, 0};
  const float scales[] = {0.5f, 0.25f}, x[] = {1, 2, 3};
  const std::int32_t sums[] = {2, 0};
  float y[2] = {};
  qd::quantized_matmul(KernelPath::scalar, qd::Int8WeightsView{values, scales, sums, 2, 3}, x, 3, 1,
                       y, 2, nullptr, 1);
  EXPECT_EQ(y[0], 3.0f);
  EXPECT_EQ(y[1], -31.75f);
}

TEST(QuantKernels, ScalarOracleMatchesHandComputedQ4) {
  // K = 32, x_k = k. Row 0: every nibble 9 (ŵ = (9 − 8)·0.5 = 0.5): y0 = 0.5·Σk = 0.5·496 = 248.
  // Row 1: byte 0 = 0x0A: weight 0 (low nibble) = 10 → +2·0.25, weight 16 (high nibble) = 0 →
  // −8·0.25; every other nibble 8 → 0. y1 = 0.5·x0 − 2·x16 = 0 − 32 = −32 (checks the order).
  std::vector<std::uint8_t> nibbles(32, 0x99);
  std::fill(nibbles.begin() + 16, nibbles.end(), 0x88);
  nibbles[16] = 0x0a;
  const std::uint16_t scales[] = {dissect::float_to_fp16(0.5f), dissect::float_to_fp16(0.25f)};
  float x[32];
  for (int k = 0; k < 32; ++k) x[k] = float(k);
  float y[2] = {};
  qd::quantized_matmul(KernelPath::scalar, qd::Q4WeightsView{nibbles.data(), scales, 2, 32}, x, 32,
                       1, y, 2, nullptr, 1);
  EXPECT_EQ(y[0], 248.0f);
  EXPECT_EQ(y[1], -32.0f);
}

// ---- the bounds are not vacuous
// ------------------------------------------------------------------

/// On a small shape, every path's result passes, the bound is a small fraction of Σ|x·ŵ|, and
/// the same result with the last K terms counted twice (the classic tail bug) fails.
template <class Weights>
void check_bound_catches_tail_bug(index_t K) {
  PinGuard guard;
  std::mt19937_64 rng(7);
  const Case c{3, 5, K, K, 5, false, true, 1, 0};
  const Weights weights = Weights::random(c.N, c.K, rng);
  const auto w = weights.view();
  const std::vector<float> xs = random_x(c, rng);
  const float bias[] = {0.1f, -0.2f, 0.3f, -0.4f, 0.5f};
  std::vector<float> oracle(15);
  qd::quantized_matmul(KernelPath::scalar, w, xs.data(), K, 3, oracle.data(), 5, bias, 1);
  for (KernelPath path : dq::supported_kernel_paths()) {
    if (path == KernelPath::scalar || !dq::path_applies(path, Weights::format)) continue;
    std::vector<float> y(15);
    qd::quantized_matmul(path, w, xs.data(), K, 3, y.data(), 5, bias, 1);
    const Violations good = compare(path, w, xs.data(), K, 3, y.data(), oracle.data(), 5, bias);
    EXPECT_EQ(good.count, 0) << dq::kernel_path_name(path) << ": " << good.first;
    const bool coarse = path == KernelPath::avx512_vnni || path == KernelPath::avx512_bf16;
    EXPECT_LT(good.max_bound_over_scale, coarse ? 1e-2 : 1e-5) << dq::kernel_path_name(path);
    // The fp32 paths must catch one term counted twice; the quantising ones a missed or doubled
    // vector of 16 (their bound, ~0.4 % of Σ|x·ŵ|, may hide a single small term).
    const index_t tail = coarse ? 16 : 1;
    for (index_t i = 0; i < 3; ++i) {
      for (index_t n = 0; n < 5; ++n) {
        double extra = 0.0;
        for (index_t k = K - tail; k < K; ++k) extra += xs[i * K + k] * qd::weight_value(w, n, k);
        y[i * 5 + n] += float(extra);
      }
    }
    const Violations bad = compare(path, w, xs.data(), K, 3, y.data(), oracle.data(), 5, bias);
    EXPECT_GE(bad.count, 10) << dq::kernel_path_name(path) << ": the bound let a wrong result by";
  }
}

TEST(QuantKernels, BoundCatchesATailBugBf16) {
  check_bound_catches_tail_bug<Bf16Weights>(33);
}
TEST(QuantKernels, BoundCatchesATailBugInt8) {
  check_bound_catches_tail_bug<Int8Weights>(33);
}
TEST(QuantKernels, BoundCatchesATailBugQ4) {
  check_bound_catches_tail_bug<Q4Weights>(64);
}

TEST(QuantKernels, Bf16ActivationRoundingNeedsTwoToTheMinusEight) {
  // x = 1 + 2⁻⁸ is halfway between the bf16 neighbours 1 and 1 + 2⁻⁷: a tie, to even, so 1. The
  // error 2⁻⁸ = 2⁻⁸/(1 + 2⁻⁸)·|x| is more than 2⁻⁹·|x|: the bound needs 2⁻⁸.
  if (!dq::cpu_supports(KernelPath::avx512_bf16)) GTEST_SKIP() << "no AVX512_BF16";
  const std::uint16_t one = dissect::float_to_bf16(1.0f);
  const float x[] = {1.0f + 0x1.0p-8f};
  float y = 0;
  qd::quantized_matmul(KernelPath::avx512_bf16, qd::Bf16WeightsView{&one, 1, 1}, x, 1, 1, &y, 1,
                       nullptr, 1);
  EXPECT_EQ(y, 1.0f);
  const double error = std::abs(double(y) - double(x[0]));
  EXPECT_GT(error, 0x1.0p-9 * x[0]);
  EXPECT_LE(error, 0x1.0p-8 * x[0]);
}

// ---- dispatch, pinning, errors
// -----------------------------------------------------------------------

TEST(QuantKernels, DefaultBuildDispatchesToAvx512) {
  // This test is compiled for plain x86-64 (tests never get -march=native), so reaching an
  // AVX-512 path here can only be the run-time dispatch.
#if defined(__AVX2__) || defined(__AVX512F__)
  std::printf("[          ] note: this build enables AVX2/AVX-512 at compile time\n");
#endif
  ASSERT_FALSE(dq::forced_kernel_path().has_value());
  if (!dq::cpu_supports(KernelPath::avx512)) GTEST_SKIP() << "no AVX-512 on this CPU";
  const KernelPath int8 = dq::active_kernel_path(WeightFormat::int8, 1);
  const KernelPath q4 = dq::active_kernel_path(WeightFormat::q4_0, 8);
  const bool vnni = dq::cpu_supports(KernelPath::avx512_vnni);
  EXPECT_EQ(int8, vnni ? KernelPath::avx512_vnni : KernelPath::avx512);
  EXPECT_EQ(q4, vnni ? KernelPath::avx512_vnni : KernelPath::avx512);
  EXPECT_EQ(dq::active_kernel_path(WeightFormat::bf16, 1), KernelPath::avx512);
  EXPECT_EQ(
      dq::active_kernel_path(WeightFormat::bf16, 128),
      dq::cpu_supports(KernelPath::avx512_bf16) ? KernelPath::avx512_bf16 : KernelPath::avx512);
  std::printf(
      "[          ] paths: int8 %s, q4_0 %s, bf16 (m = 1) %s\n",
      std::string(dq::kernel_path_name(int8)).c_str(),
      std::string(dq::kernel_path_name(q4)).c_str(),
      std::string(dq::kernel_path_name(dq::active_kernel_path(WeightFormat::bf16, 1))).c_str());
}

TEST(QuantKernels, SupportedPathsAreConsistent) {
  const auto paths = dq::supported_kernel_paths();
  ASSERT_FALSE(paths.empty());
  EXPECT_EQ(paths.front(), KernelPath::scalar);
  for (KernelPath path : paths) {
    EXPECT_TRUE(dq::cpu_supports(path));
  }
  // The AVX-512 extensions imply the base path.
  if (dq::cpu_supports(KernelPath::avx512_vnni) || dq::cpu_supports(KernelPath::avx512_bf16)) {
    EXPECT_TRUE(dq::cpu_supports(KernelPath::avx512));
  }
  if (dq::cpu_supports(KernelPath::avx512)) {
    EXPECT_TRUE(dq::cpu_supports(KernelPath::avx2));
  }
  EXPECT_EQ(dq::kernel_path_name(KernelPath::avx512_vnni), "avx512_vnni");
  EXPECT_EQ(dq::kernel_path_name(static_cast<KernelPath>(9)), "unknown");
}

TEST(QuantKernels, PinningAPathOutsideTheEnumThrowsAndChangesNothing) {
  // Every path is supported on the machine this was written on, so the "CPU lacks it" error
  // cannot be provoked with a real path there; a value outside the enum goes through the same
  // validation first and must leave the pin alone the same way.
  PinGuard guard;
  dq::force_kernel_path(KernelPath::scalar);
  try {
    dq::force_kernel_path(static_cast<KernelPath>(17));
    FAIL() << "no exception";
  } catch (const dissect::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("force_kernel_path: KernelPath(17) is out of range"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(dq::forced_kernel_path(), KernelPath::scalar);
  EXPECT_THROW((void)dq::cpu_supports(static_cast<KernelPath>(-1)), dissect::ConfigError);
}

TEST(QuantKernels, PinningAnUnsupportedPathThrowsError) {
  PinGuard guard;
  for (int raw = 0; raw < 5; ++raw) {
    const auto path = static_cast<KernelPath>(raw);
    if (dq::cpu_supports(path)) continue;
    try {
      dq::force_kernel_path(path);
      FAIL() << "no exception for " << dq::kernel_path_name(path);
    } catch (const dissect::Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(dq::kernel_path_name(path))),
                std::string::npos);
    }
    EXPECT_FALSE(dq::forced_kernel_path().has_value());
  }
}

TEST(QuantKernels, PinnedPathThatDoesNotApplyFallsBackToAvx512) {
  PinGuard guard;
  if (dq::cpu_supports(KernelPath::avx512_vnni)) {
    dq::force_kernel_path(KernelPath::avx512_vnni);
    EXPECT_EQ(dq::active_kernel_path(WeightFormat::bf16, 1), KernelPath::avx512);
    EXPECT_EQ(dq::active_kernel_path(WeightFormat::int8, 1), KernelPath::avx512_vnni);
  }
  dq::force_kernel_path(std::nullopt);
  EXPECT_FALSE(dq::forced_kernel_path().has_value());
}

TEST(QuantKernels, BadCallsThrowNamingTheOperation) {
  std::mt19937_64 rng(3);
  const auto bf16 = Bf16Weights::random(4, 8, rng);
  const auto q4 = Q4Weights::random(4, 32, rng);
  std::vector<float> x(64, 1.0f), y(64);
  auto message = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const dissect::Error& e) {
      return e.what();
    }
    return "no exception";
  };
  EXPECT_THROW(qd::quantized_matmul(KernelPath::avx512_vnni, bf16.view(), x.data(), 8, 1, y.data(),
                                    4, nullptr, 1),
               dissect::ConfigError);
  EXPECT_EQ(message([&] {
              qd::quantized_matmul(KernelPath::avx512_bf16, q4.view(), x.data(), 32, 1, y.data(), 4,
                                   nullptr, 1);
            }),
            "quantized_matmul(q4_0, avx512_bf16): the avx512_bf16 path has no kernel for q4_0 "
            "weights");
  qd::Q4WeightsView odd = q4.view();
  odd.cols = 48;
  EXPECT_EQ(message([&] {
              qd::quantized_matmul(KernelPath::scalar, odd, x.data(), 48, 1, y.data(), 4, nullptr,
                                   1);
            }),
            "quantized_matmul(q4_0, scalar): K = 48 is not a multiple of 32 (x: [m, K] = [1, 48], "
            "ldx 48; W: [N, K] = [4, 48]; y ldy 4)");
  EXPECT_THROW(qd::quantized_matmul(KernelPath::scalar, bf16.view(), x.data(), 7, 2, y.data(), 4,
                                    nullptr, 1),
               dissect::ShapeError);  // ldx < K
  EXPECT_THROW(qd::quantized_matmul(KernelPath::scalar, bf16.view(), x.data(), 8, 2, y.data(), 3,
                                    nullptr, 1),
               dissect::ShapeError);  // ldy < N
  EXPECT_THROW(qd::quantized_matmul(KernelPath::scalar, bf16.view(), x.data(), 8, 1, y.data(), 4,
                                    nullptr, 0),
               dissect::ConfigError);  // threads
  EXPECT_THROW(
      qd::quantized_matmul(KernelPath::scalar, bf16.view(), nullptr, 8, 1, y.data(), 4, nullptr, 1),
      dissect::Error);
  EXPECT_THROW(qd::quantized_matmul(static_cast<KernelPath>(5), bf16.view(), x.data(), 8, 1,
                                    y.data(), 4, nullptr, 1),
               dissect::ConfigError);
}

TEST(QuantKernels, EmptyProductsDoNothing) {
  PinGuard guard;
  std::mt19937_64 rng(5);
  const auto int8 = Int8Weights::random(3, 40, rng);
  qd::Int8WeightsView no_rows = int8.view();
  no_rows.rows = 0;
  std::vector<float> x(80, 1.0f), y(8, -7.0f);
  for (KernelPath path : dq::supported_kernel_paths()) {
    if (!dq::path_applies(path, WeightFormat::int8)) continue;
    qd::quantized_matmul(path, int8.view(), x.data(), 40, 0, y.data(), 3, nullptr, 2);  // m = 0
    qd::quantized_matmul(path, no_rows, x.data(), 40, 2, y.data(), 0, nullptr, 2);      // N = 0
    // Nothing to read or write: null pointers are fine too.
    qd::quantized_matmul(path, int8.view(), nullptr, 40, 0, nullptr, 3, nullptr, 1);
  }
  for (float v : y) EXPECT_EQ(v, -7.0f);
}

}  // namespace test_quant_kernels
