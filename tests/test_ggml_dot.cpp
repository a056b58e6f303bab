// Tests for the ggml block kernels (quant/detail/ggml_dot.hpp, ggml_dot_avx512.hpp, the packed
// GEMM of ggml_gemm_vnni.hpp) and
// QuantizedWeight in ggml's formats (q8_0, q4_K, q5_K, q6_K): the AVX2 and AVX-512 VNNI integer
// paths against an exact double sum of the same quantised activations, with ŵ rebuilt here from
// the formats' published formulas (not from the library's decoder), over a thousand shapes; the
// paths against the scalar oracle within the activation rounding;
// the oracle on a hand-built block; stacking, permuting and keeping GGUF blocks; and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <span>
#include <vector>

#include "dissect/numeric/half.hpp"
#include "dissect/quant/weight_format.hpp"
#include "support/tensor_testing.hpp"

namespace test_ggml_dot {

using namespace dissect;
using quant::KernelPath;
namespace qd = quant::detail;

constexpr double u32 = 0x1.0p-24;

struct PinGuard {
  ~PinGuard() { quant::force_kernel_path(std::nullopt); }
};

std::uint16_t u16_at(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
double f16_at(const std::uint8_t* p) {
  return fp16_to_float(u16_at(p));
}

/// ŵ of one block split as a − c (a = d·sc·q ≥ its own sign, c the offset), in double, from the
/// layout in ggml_block_codecs.hpp's table, written independently of the kernels.
void reference_terms(WeightFormat format, const std::uint8_t* b, double* a, double* c) {
  switch (format) {
    case WeightFormat::q8_0:
      for (int k = 0; k < 32; ++k) {
        a[k] = f16_at(b) * static_cast<std::int8_t>(b[2 + k]);
        c[k] = 0;
      }
      return;
    case WeightFormat::q4_K:
    case WeightFormat::q5_K: {
      const bool five = format == WeightFormat::q5_K;
      const double d = f16_at(b), dmin = f16_at(b + 2);
      const std::uint8_t* s = b + 4;
      const std::uint8_t* qs = b + (five ? 48 : 16);
      for (int k = 0; k < 256; ++k) {
        const int j = k / 32;  // sub-block
        int sc, m;
        if (j < 4) {
          sc = s[j] & 63;
          m = s[j + 4] & 63;
        } else {
          sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
          m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
        const int chunk = k / 64, l = k % 32, high_half = (k % 64) >= 32;
        int q = high_half ? qs[32 * chunk + l] >> 4 : qs[32 * chunk + l] & 15;
        if (five && (b[16 + l] >> (2 * chunk + high_half) & 1)) q += 16;
        a[k] = d * sc * q;
        c[k] = dmin * m;
      }
      return;
    }
    default: {  // q6_K
      const double d = f16_at(b + 208);
      const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
      for (int k = 0; k < 256; ++k) {
        const int half = k / 128, p = (k % 128) / 32, l = k % 32;
        const std::uint8_t ql = b[64 * half + 32 * (p % 2) + l];
        const int low = p < 2 ? ql & 15 : ql >> 4;
        const int high = (b[128 + 32 * half + l] >> (2 * p)) & 3;
        const double scale = d * sc[k / 16];
        a[k] = scale * (low | (high << 4));
        c[k] = scale * 32;
      }
      return;
    }
  }
}

index_t block_of(WeightFormat f) {
  return ggml_type_info(ggml_type_of(f)).block_elements;
}
index_t block_bytes_of(WeightFormat f) {
  return ggml_type_info(ggml_type_of(f)).block_bytes;
}

/// Blocks of random bytes with sane scales: every stored level, every sign and (q8_0) −128 occur.
std::vector<std::uint8_t> random_blocks(WeightFormat f, index_t rows, index_t cols,
                                        std::mt19937_64& rng) {
  const index_t count = rows * cols / block_of(f), bytes = block_bytes_of(f);
  std::vector<std::uint8_t> out(std::size_t(count * bytes));
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (auto& v : out) v = static_cast<std::uint8_t>(byte(rng));
  const auto put = [](std::uint8_t* p, float v) {
    const std::uint16_t h = float_to_fp16(v);
    p[0] = h & 0xff;
    p[1] = h >> 8;
  };
  for (index_t i = 0; i < count; ++i) {
    std::uint8_t* b = out.data() + i * bytes;
    if (f == WeightFormat::q6_K) {
      put(b + 208, scale(rng));
    } else {
      put(b, scale(rng));
      if (f != WeightFormat::q8_0) put(b + 2, scale(rng));
    }
  }
  return out;
}

std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng, float spread = 1.0f) {
  std::normal_distribution<float> value(0.0f, spread);
  std::vector<float> out(n);
  for (auto& v : out) v = value(rng);
  return out;
}

/// x̂: x quantised to the activation blocks llama.cpp pairs with f, decoded back, in double.
std::vector<double> quantised_activations(WeightFormat f, const std::vector<float>& x, index_t m,
                                          index_t K) {
  const GgmlType type = qd::ggml_activation_type(f);
  const index_t row_bytes = ggml_row_bytes(type, K);
  std::vector<std::uint8_t> q(std::size_t(m * row_bytes));
  qd::quantize_ggml_activations(f, x.data(), K, m, K, q.data());
  std::vector<float> decoded(std::size_t(m * K));
  dequantize_ggml(type, std::as_bytes(std::span(q)), decoded);
  return {decoded.begin(), decoded.end()};
}

constexpr WeightFormat ggml_formats[] = {WeightFormat::q8_0, WeightFormat::q4_K, WeightFormat::q5_K,
                                         WeightFormat::q6_K};

/// The integer paths this CPU runs.
std::vector<KernelPath> integer_paths() {
  std::vector<KernelPath> out;
  for (const KernelPath p : {KernelPath::avx2, KernelPath::avx512_vnni}) {
    if (quant::cpu_supports(p)) out.push_back(p);
  }
  return out;
}

/// y = x̂·ŵᵀ + b exactly (double), and Σ|terms| for the float rounding bound.
void exact_products(WeightFormat f, const std::vector<std::uint8_t>& bytes, index_t N, index_t K,
                    const std::vector<double>& xq, index_t m, const std::vector<float>& bias,
                    std::vector<double>& exact, std::vector<double>& magnitude) {
  const index_t per_block = block_of(f), bb = block_bytes_of(f);
  std::vector<double> a(static_cast<std::size_t>(per_block)), c(a);
  exact.assign(std::size_t(m * N), 0);
  magnitude.assign(std::size_t(m * N), 0);
  for (index_t n = 0; n < N; ++n) {
    for (index_t i = 0; i < m; ++i) {
      double e = bias.empty() ? 0 : bias[std::size_t(n)];
      double mag = std::abs(e);
      for (index_t b = 0; b < K / per_block; ++b) {
        reference_terms(f, bytes.data() + (n * (K / per_block) + b) * bb, a.data(), c.data());
        for (index_t k = 0; k < per_block; ++k) {
          const double xv = xq[std::size_t(i * K + b * per_block + k)];
          e += (a[std::size_t(k)] - c[std::size_t(k)]) * xv;
          mag += (std::abs(a[std::size_t(k)]) + std::abs(c[std::size_t(k)])) * std::abs(xv);
        }
      }
      exact[std::size_t(i * N + n)] = e;
      magnitude[std::size_t(i * N + n)] = mag;
    }
  }
}

TEST(GgmlDot, IntegerPathsAreTheExactSumOfTheQuantisedActivations) {
  const auto paths = integer_paths();
  if (paths.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937_64 rng(26);
  for (const KernelPath path : paths) {
    for (const WeightFormat f : ggml_formats) {
      // m up to 17 crosses the AVX-512 path's tiles of 8 rows; 1 and 3 q8_0 blocks leave a pair
      // of blocks half empty.
      for (const index_t K : {f == WeightFormat::q8_0 ? index_t{32} : index_t{256},
                              f == WeightFormat::q8_0 ? index_t{96} : index_t{768}}) {
        for (const index_t m : {1, 2, 7, 9, 17}) {
          const index_t N = 9;
          SCOPED_TRACE(::testing::Message() << quant::kernel_path_name(path) << " "
                                            << weight_format_name(f) << " K " << K << " m " << m);
          const auto bytes = random_blocks(f, N, K, rng);
          const auto x = random_floats(std::size_t(m * K), rng);
          const auto bias = random_floats(std::size_t(N), rng);
          const qd::GgmlWeightsView w{f, bytes.data(), N, K};
          std::vector<float> y(std::size_t(m * N), NAN), y2(y);
          qd::ggml_matmul(path, w, x.data(), K, m, y.data(), N, bias.data(), 1);
          qd::ggml_matmul(path, w, x.data(), K, m, y2.data(), N, bias.data(), 2);
          EXPECT_EQ(std::memcmp(y.data(), y2.data(), y.size() * 4), 0) << "threads change bits";
          std::vector<double> exact, magnitude;
          exact_products(f, bytes, N, K, quantised_activations(f, x, m, K), m, bias, exact,
                         magnitude);
          for (std::size_t e = 0; e < y.size(); ++e) {
            // A few roundings per block of its terms, and the sum over the K/B blocks.
            const double bound = (8 + double(K / block_of(f) + 8)) * u32 * magnitude[e];
            EXPECT_LE(std::abs(y[e] - exact[e]), bound) << "element " << e;
          }
        }
      }
    }
  }
}

TEST(GgmlDot, OverAThousandShapesEveryPathStaysWithinTheFloatSumsOfTheExactProduct) {
  const auto paths = integer_paths();
  if (paths.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937_64 rng(1000);
  std::uniform_int_distribution<int> pick_format(0, 3), pick_m(1, 20), pick_n(1, 9),
      pick_blocks(1, 3);
  int shapes = 0;
  double worst = 0;
  for (; shapes < 1200; ++shapes) {
    const WeightFormat f = ggml_formats[pick_format(rng)];
    const index_t m = pick_m(rng), N = pick_n(rng), K = pick_blocks(rng) * block_of(f);
    const auto bytes = random_blocks(f, N, K, rng);
    const auto x = random_floats(std::size_t(m * K), rng, 3.0f);
    std::vector<double> exact, magnitude;
    exact_products(f, bytes, N, K, quantised_activations(f, x, m, K), m, {}, exact, magnitude);
    for (const KernelPath path : paths) {
      std::vector<float> y(std::size_t(m * N), NAN);
      qd::ggml_matmul(path, {f, bytes.data(), N, K}, x.data(), K, m, y.data(), N, nullptr,
                      1 + shapes % 2);
      for (std::size_t e = 0; e < y.size(); ++e) {
        const double bound = (8 + double(K / block_of(f) + 8)) * u32 * magnitude[e];
        ASSERT_LE(std::abs(y[e] - exact[e]), bound)
            << quant::kernel_path_name(path) << " " << weight_format_name(f) << " m " << m << " N "
            << N << " K " << K << " element " << e;
        worst = std::max(worst, std::abs(y[e] - exact[e]) / magnitude[e]);
      }
    }
  }
  EXPECT_EQ(shapes, 1200);
  // The bound is not loose by orders of magnitude: float sums leave a visible trace.
  EXPECT_GT(worst, 0.0);
}

TEST(GgmlDot, IntegerPathsDifferFromTheOracleByTheActivationRoundingAlone) {
  const auto paths = integer_paths();
  if (paths.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937_64 rng(7);
  for (const KernelPath path : paths) {
    for (const WeightFormat f : ggml_formats) {
      SCOPED_TRACE(std::string(weight_format_name(f)) + " on " +
                   std::string(quant::kernel_path_name(path)));
      const index_t K = 512, N = 12, m = 3;
      const auto W = random_floats(std::size_t(N * K), rng, 0.1f);
      const auto q = QuantizedWeight::quantize(ConstTensorView<float, 2>(W.data(), {N, K}), f);
      const auto x = random_floats(std::size_t(m * K), rng);
      std::vector<float> fast(std::size_t(m * N)), oracle(fast);
      const qd::GgmlWeightsView w{f, q.ggml_rows()[0].blocks.data(), N, K};
      qd::ggml_matmul(path, w, x.data(), K, m, fast.data(), N, nullptr, 1);
      qd::ggml_matmul(KernelPath::scalar, w, x.data(), K, m, oracle.data(), N, nullptr, 1);
      const auto xq = quantised_activations(f, x, m, K);
      const Tensor<float, 2> wh = q.dequantize();
      double worst_gap = 0, worst_bound = 0;
      for (index_t n = 0; n < N; ++n) {
        for (index_t i = 0; i < m; ++i) {
          double rounding = 0, magnitude = 0;
          for (index_t k = 0; k < K; ++k) {
            rounding += std::abs(wh(n, k)) *
                        std::abs(x[std::size_t(i * K + k)] - xq[std::size_t(i * K + k)]);
            magnitude += std::abs(wh(n, k) * x[std::size_t(i * K + k)]);
          }
          const double bound = rounding * (1 + 1e-3) + 64 * u32 * magnitude;
          const double gap =
              std::abs(fast[std::size_t(i * N + n)] - oracle[std::size_t(i * N + n)]);
          EXPECT_LE(gap, bound) << "n " << n << " i " << i;
          worst_gap = std::max(worst_gap, gap);
          worst_bound = std::max(worst_bound, 64 * u32 * magnitude);
        }
      }
      // The activation rounding is real: without it the paths would agree to float rounding.
      EXPECT_GT(worst_gap, worst_bound);
    }
  }
}

#if DISSECT_X86
/// The packed GEMM's float terms per element (ggml_gemm_vnni.hpp): two per group of k (16 for
/// q6_K, 32 otherwise), two more per block of 32 for q4_K/q5_K's mins, the K chunks, the bias.
double packed_bound_terms(WeightFormat f, index_t K) {
  const double group = f == WeightFormat::q6_K ? 16 : 32;
  const bool mins = f == WeightFormat::q4_K || f == WeightFormat::q5_K;
  return 8 + 2 * double(K) / group + (mins ? 2 * double(K) / 32 : 0) + 8;
}

TEST(GgmlDot, PackedGemmOverAThousandShapesIsTheExactSumOfLlamaCppsActivationsWithinItsBound) {
  if (!quant::cpu_supports(KernelPath::avx512_vnni)) GTEST_SKIP() << "this CPU has no VNNI";
  std::mt19937_64 rng(31);
  // m crosses the 6-row micro-tiles, N the 32-column panels (and their masked tails), K the
  // 512-wide packed chunks (q8_0: up to 20 blocks, odd counts leave half a 64-k slab empty).
  std::uniform_int_distribution<int> pick_format(0, 3), pick_m(1, 20), pick_n(1, 40),
      pick_q8_blocks(1, 20), pick_super_blocks(1, 3);
  double worst = 0;
  int shapes = 0;
  for (; shapes < 1100; ++shapes) {
    const WeightFormat f = ggml_formats[pick_format(rng)];
    const index_t m = pick_m(rng), N = pick_n(rng);
    const index_t K =
        f == WeightFormat::q8_0 ? 32 * pick_q8_blocks(rng) : 256 * pick_super_blocks(rng);
    const auto bytes = random_blocks(f, N, K, rng);
    const auto x = random_floats(std::size_t(m * K), rng, 3.0f);
    const auto bias = shapes % 3 == 0 ? std::vector<float>{} : random_floats(std::size_t(N), rng);
    std::vector<double> exact, magnitude;
    exact_products(f, bytes, N, K, quantised_activations(f, x, m, K), m, bias, exact, magnitude);
    std::vector<float> y(std::size_t(m * N), NAN);
    qd::ggml_vnni_gemm({f, bytes.data(), N, K}, x.data(), K, m, y.data(), N,
                       bias.empty() ? nullptr : bias.data(), 1 + shapes % 2);
    const double terms = packed_bound_terms(f, K);
    for (std::size_t e = 0; e < y.size(); ++e) {
      ASSERT_LE(std::abs(y[e] - exact[e]), terms * u32 * magnitude[e])
          << weight_format_name(f) << " m " << m << " N " << N << " K " << K << " element " << e;
      worst = std::max(worst, std::abs(y[e] - exact[e]) / magnitude[e]);
    }
  }
  EXPECT_EQ(shapes, 1100);
  EXPECT_GT(worst, 0.0);
}

TEST(GgmlDot, PackedGemmRunsFromItsRowThresholdWithTheSameBitsOnAnyThreadCount) {
  if (!quant::cpu_supports(KernelPath::avx512_vnni)) GTEST_SKIP() << "this CPU has no VNNI";
  std::mt19937_64 rng(32);
  for (const WeightFormat f : ggml_formats) {
    SCOPED_TRACE(weight_format_name(f));
    const index_t m = qd::ggml_vnni_gemm_min_rows + 5, N = 70, K = 2 * block_of(f) * 2;
    const auto bytes = random_blocks(f, N, K, rng);
    const auto x = random_floats(std::size_t(m * K), rng);
    const qd::GgmlWeightsView w{f, bytes.data(), N, K};
    std::vector<float> via_path(std::size_t(m * N)), packed1(via_path), packed2(via_path),
        tiles(via_path);
    qd::ggml_matmul(KernelPath::avx512_vnni, w, x.data(), K, m, via_path.data(), N, nullptr, 2);
    qd::ggml_vnni_gemm(w, x.data(), K, m, packed1.data(), N, nullptr, 1);
    qd::ggml_vnni_gemm(w, x.data(), K, m, packed2.data(), N, nullptr, 2);
    EXPECT_EQ(std::memcmp(via_path.data(), packed1.data(), packed1.size() * 4), 0);
    EXPECT_EQ(std::memcmp(packed2.data(), packed1.data(), packed1.size() * 4), 0);
    // One row fewer than the threshold runs the 8-row tiles: the same integers, other float
    // sums, so some bits differ (the dispatch above is not vacuous).
    const index_t below = qd::ggml_vnni_gemm_min_rows - 1;
    qd::ggml_matmul(KernelPath::avx512_vnni, w, x.data(), K, below, tiles.data(), N, nullptr, 1);
    EXPECT_NE(std::memcmp(tiles.data(), packed1.data(), std::size_t(below * N) * 4), 0);
  }
}

TEST(GgmlDot, KQuantDecodeRowsRunTheGemvUpToItsRowCount) {
  // Up to ggml_gemv_max_rows rows the avx512_vnni path is k_quant_gemv (one super-block four
  // vpdpbusd and four vpdpwssd), bit for bit; the bounds above hold it to the exact sums.
  if (!quant::cpu_supports(KernelPath::avx512_vnni)) GTEST_SKIP() << "this CPU has no VNNI";
  std::mt19937_64 rng(33);
  for (const WeightFormat f : {WeightFormat::q4_K, WeightFormat::q5_K, WeightFormat::q6_K}) {
    SCOPED_TRACE(weight_format_name(f));
    const index_t N = 13, K = 768;
    const auto bytes = random_blocks(f, N, K, rng);
    const qd::GgmlWeightsView w{f, bytes.data(), N, K};
    for (index_t m = 1; m <= qd::ggml_gemv_max_rows; ++m) {
      const auto x = random_floats(std::size_t(m * K), rng);
      const auto bias = random_floats(std::size_t(N), rng);
      std::vector<float> via_path(std::size_t(m * N)), direct(via_path);
      qd::ggml_matmul(KernelPath::avx512_vnni, w, x.data(), K, m, via_path.data(), N, bias.data(),
                      1);
      const index_t stride = ggml_row_bytes(GgmlType::q8_K, K);
      std::vector<std::uint8_t> a(std::size_t(m * stride));
      qd::quantize_ggml_activations(f, x.data(), K, m, K, a.data());
      const auto gemv = f == WeightFormat::q4_K   ? qd::k_quant_gemv<WeightFormat::q4_K>
                        : f == WeightFormat::q5_K ? qd::k_quant_gemv<WeightFormat::q5_K>
                                                  : qd::k_quant_gemv<WeightFormat::q6_K>;
      gemv(w, a.data(), stride, m, direct.data(), N, bias.data(), 2);
      EXPECT_EQ(std::memcmp(via_path.data(), direct.data(), direct.size() * 4), 0) << "m " << m;
    }
  }
}
#endif

#if DISSECT_X86
/// Blocks of activations that reach every branch of ggml's activation rounding: normal rows at
/// several spreads, exact ties (x·(1/d) = n + ½ for q8_0, iscale·x = n + ½ for q8_K), the
/// largest magnitude at both signs (the first one sets q8_K's sign), zeros, and for q8_K (whose
/// rule is bit arithmetic) subnormals, NaN and ±∞.
std::vector<float> rounding_cases(index_t block, int blocks, bool special, std::mt19937_64& rng) {
  std::vector<float> x(std::size_t(block * blocks));
  std::uniform_int_distribution<int> level(-127, 127), kind(0, 9), at(0, int(block) - 1);
  for (int b = 0; b < blocks; ++b) {
    float* v = x.data() + b * block;
    const int k = kind(rng);
    const float spread = std::ldexp(1.0f, int(rng() % 40) - 20);
    std::normal_distribution<float> normal(0.0f, spread);
    for (index_t j = 0; j < block; ++j) v[j] = normal(rng);
    if (k == 1) {  // ties: the scale is 1, the levels halfway between integers
      for (index_t j = 0; j < block; ++j) v[j] = float(level(rng)) + (j % 2 ? 0.5f : 0.0f);
      v[at(rng)] = block == 32 ? 127.0f : -127.0f;
      for (index_t j = 0; j < block; ++j) v[j] = std::clamp(v[j], -127.0f, 127.0f);
    } else if (k == 2) {  // the largest magnitude at both signs
      const float top = std::abs(normal(rng)) * 4 + 1e-3f;
      v[at(rng)] = top;
      v[at(rng)] = -top;
    } else if (k == 3) {
      std::fill(v, v + block, 0.0f);
      if (rng() % 2) v[at(rng)] = -0.0f;
    } else if (k == 4 && special) {  // q8_0's 1/d of a subnormal max is ∞
      for (index_t j = 0; j < block; ++j) v[j] = std::ldexp(normal(rng) / spread, -140);
    } else if (k == 5 && special) {
      v[at(rng)] = NAN;
      if (rng() % 2) v[at(rng)] = rng() % 2 ? INFINITY : -INFINITY;
    }
  }
  return x;
}

TEST(GgmlDot, VectorActivationRoundingWritesTheScalarBytes) {
  if (!quant::cpu_supports(KernelPath::avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937_64 rng(41);
  for (const WeightFormat f : {WeightFormat::q8_0, WeightFormat::q4_K}) {
    SCOPED_TRACE(weight_format_name(f));
    const bool q8_0 = f == WeightFormat::q8_0;
    const index_t block = q8_0 ? 32 : 256, blocks = 3000;
    // q8_0's float → int8 conversion of ±∞ or NaN is undefined in C++: finite values only.
    const auto x = rounding_cases(block, int(blocks), !q8_0, rng);
    const index_t bytes = ggml_row_bytes(qd::ggml_activation_type(f), block * blocks);
    std::vector<std::uint8_t> vectors(static_cast<std::size_t>(bytes)), scalar(vectors),
        dispatched(vectors);
    qd::quantize_ggml_activations_avx2(q8_0, x.data(), block * blocks, 1, block * blocks,
                                       vectors.data());
    qd::quantize_ggml_activations_scalar(f, x.data(), block * blocks, 1, block * blocks,
                                         scalar.data());
    qd::quantize_ggml_activations(f, x.data(), block * blocks, 1, block * blocks,
                                  dispatched.data());
    const index_t block_bytes = bytes / blocks;
    for (index_t b = 0; b < blocks; ++b) {
      ASSERT_EQ(std::memcmp(vectors.data() + b * block_bytes, scalar.data() + b * block_bytes,
                            std::size_t(block_bytes)),
                0)
          << "block " << b << " first value " << x[std::size_t(b * block)];
    }
    EXPECT_EQ(dispatched, scalar);
  }
}

TEST(GgmlDot, Avx2TilesOverAThousandShapesAreTheRowDotsBitForBitWithinTheBound) {
  // The avx2 path's R × C register tiles (ggml_gemm_avx2.hpp) and their edge tiles: m crosses
  // the tile's rows, N its columns and the 4-row weight tasks, K one to a few blocks. Each output
  // is the 1 × 1 tile's (dot_row's) bits, on 1 and 2 threads, within the float-sum bound of the
  // exact product of llama.cpp's activations.
  if (!quant::cpu_supports(KernelPath::avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937_64 rng(42);
  std::uniform_int_distribution<int> pick_format(0, 3), pick_m(1, 13), pick_n(1, 11),
      pick_q8_blocks(1, 9), pick_super_blocks(1, 3);
  double worst = 0;
  int shapes = 0;
  for (; shapes < 1100; ++shapes) {
    const WeightFormat f = ggml_formats[pick_format(rng)];
    const index_t m = pick_m(rng), N = pick_n(rng);
    const index_t K =
        f == WeightFormat::q8_0 ? 32 * pick_q8_blocks(rng) : 256 * pick_super_blocks(rng);
    const auto bytes = random_blocks(f, N, K, rng);
    const auto x = random_floats(std::size_t(m * K), rng, 3.0f);
    const auto bias = shapes % 3 == 0 ? std::vector<float>{} : random_floats(std::size_t(N), rng);
    const float* b = bias.empty() ? nullptr : bias.data();
    const qd::GgmlWeightsView w{f, bytes.data(), N, K};
    const index_t stride = ggml_row_bytes(qd::ggml_activation_type(f), K);
    std::vector<std::uint8_t> a(std::size_t(m * stride));
    qd::quantize_ggml_activations(f, x.data(), K, m, K, a.data());
    std::vector<float> tiles1(std::size_t(m * N), NAN), tiles2(tiles1), rows(tiles1), path(tiles1);
    qd::ggml_avx2_gemm(w, a.data(), stride, m, tiles1.data(), N, b, 1);
    qd::ggml_avx2_gemm(w, a.data(), stride, m, tiles2.data(), N, b, 2);
    qd::ggml_matmul(KernelPath::avx2, w, x.data(), K, m, path.data(), N, b, 1 + shapes % 2);
    const index_t row_bytes = ggml_row_bytes(ggml_type_of(f), K);
    for (index_t i = 0; i < m; ++i) {
      for (index_t n = 0; n < N; ++n) {
        const float sum = qd::dot_row(f, bytes.data() + n * row_bytes, a.data() + i * stride, K);
        rows[std::size_t(i * N + n)] = b ? sum + b[n] : sum;
      }
    }
    const auto trace = ::testing::Message()
                       << weight_format_name(f) << " m " << m << " N " << N << " K " << K;
    ASSERT_EQ(std::memcmp(tiles1.data(), rows.data(), rows.size() * 4), 0) << trace;
    ASSERT_EQ(std::memcmp(tiles2.data(), rows.data(), rows.size() * 4), 0) << trace;
    ASSERT_EQ(std::memcmp(path.data(), rows.data(), rows.size() * 4), 0) << trace;
    std::vector<double> exact, magnitude;
    exact_products(f, bytes, N, K, quantised_activations(f, x, m, K), m, bias, exact, magnitude);
    for (std::size_t e = 0; e < rows.size(); ++e) {
      const double bound = (8 + double(K / block_of(f) + 8)) * u32 * magnitude[e];
      ASSERT_LE(std::abs(tiles1[e] - exact[e]), bound) << trace << " element " << e;
      worst = std::max(worst, std::abs(tiles1[e] - exact[e]) / magnitude[e]);
    }
  }
  EXPECT_EQ(shapes, 1100);
  EXPECT_GT(worst, 0.0);
}

TEST(GgmlDot, Avx2PathRunsItsTilesFromItsRowThreshold) {
  // The dispatch: from ggml_avx2_tile_min_rows activation rows q8_0 and the K-quants run the
  // tiles (ggml_avx2_gemm, called directly here: the same bits through ggml_matmul on any
  // thread count); tq2_0 keeps its row kernel. Below the threshold the path runs dot_row, whose
  // bits are the tiles' (the test above), so only the rule can show which one ran.
  if (!quant::cpu_supports(KernelPath::avx2)) GTEST_SKIP() << "this CPU has no AVX2";
  static_assert(!qd::ggml_avx2_runs_tiles(WeightFormat::q4_K, qd::ggml_avx2_tile_min_rows - 1));
  static_assert(!qd::ggml_avx2_runs_tiles(WeightFormat::tq2_0, 512));
  std::mt19937_64 rng(43);
  for (const WeightFormat f : ggml_formats) {
    SCOPED_TRACE(weight_format_name(f));
    EXPECT_TRUE(qd::ggml_avx2_runs_tiles(f, qd::ggml_avx2_tile_min_rows));
    EXPECT_TRUE(qd::ggml_avx2_runs_tiles(f, 512));
    const index_t m = qd::ggml_avx2_tile_min_rows + 9, N = 70, K = 2 * block_of(f) * 2;
    const auto bytes = random_blocks(f, N, K, rng);
    const auto x = random_floats(std::size_t(m * K), rng);
    const auto bias = random_floats(std::size_t(N), rng);
    const qd::GgmlWeightsView w{f, bytes.data(), N, K};
    const index_t stride = ggml_row_bytes(qd::ggml_activation_type(f), K);
    std::vector<std::uint8_t> a(std::size_t(m * stride));
    qd::quantize_ggml_activations(f, x.data(), K, m, K, a.data());
    std::vector<float> via_path1(std::size_t(m * N)), via_path2(via_path1), direct(via_path1);
    qd::ggml_matmul(KernelPath::avx2, w, x.data(), K, m, via_path1.data(), N, bias.data(), 1);
    qd::ggml_matmul(KernelPath::avx2, w, x.data(), K, m, via_path2.data(), N, bias.data(), 2);
    qd::ggml_avx2_gemm(w, a.data(), stride, m, direct.data(), N, bias.data(), 2);
    EXPECT_EQ(std::memcmp(via_path1.data(), direct.data(), direct.size() * 4), 0);
    EXPECT_EQ(std::memcmp(via_path2.data(), direct.data(), direct.size() * 4), 0);
  }
}
#endif

TEST(GgmlDot, OracleOnAHandBuiltQ4KBlock) {
  // d = 1, dmin = 0.5, sub-block j: scale j + 1, min j; value k has level k mod 16:
  // ŵ_k = (j + 1)·(k mod 16) − 0.5·j. The 12 scale bytes pack scale/min 0–3 in 6 bits, 4–7
  // split (low 4 bits in bytes 8–11, top 2 in the top bits of bytes 0–7).
  std::vector<std::uint8_t> block(144, 0);
  const std::uint16_t one = float_to_fp16(1.0f), half_ = float_to_fp16(0.5f);
  block[0] = one & 0xff, block[1] = one >> 8, block[2] = half_ & 0xff, block[3] = half_ >> 8;
  for (int j = 0; j < 8; ++j) {
    const int sc = j + 1, mn = j;
    if (j < 4) {
      block[4 + j] |= static_cast<std::uint8_t>(sc);
      block[4 + j + 4] |= static_cast<std::uint8_t>(mn);
    } else {
      block[4 + j + 4] = static_cast<std::uint8_t>((sc & 15) | ((mn & 15) << 4));
      block[4 + j - 4] |= static_cast<std::uint8_t>((sc >> 4) << 6);
      block[4 + j] |= static_cast<std::uint8_t>((mn >> 4) << 6);
    }
  }
  for (int k = 0; k < 256; ++k) {
    const int chunk = k / 64, l = k % 32, level = k % 16;
    block[16 + 32 * chunk + l] |= static_cast<std::uint8_t>((k % 64) >= 32 ? level << 4 : level);
  }
  const auto q = QuantizedWeight::from_ggml(GgmlType::q4_K, 1, 256, block);
  const Tensor<float, 2> w = q.dequantize();
  std::vector<float> x(256);
  double expected = 0;
  for (int k = 0; k < 256; ++k) {
    const int j = k / 32;
    EXPECT_EQ(w(0, k), float((j + 1) * (k % 16) - 0.5 * j)) << k;
    x[std::size_t(k)] = float(k % 7) - 3;
    expected += ((j + 1) * (k % 16) - 0.5 * j) * x[std::size_t(k)];
  }
  float y = 0;
  const qd::GgmlWeightsView view{WeightFormat::q4_K, q.ggml_rows()[0].blocks.data(), 1, 256};
  qd::ggml_matmul(KernelPath::scalar, view, x.data(), 256, 1, &y, 1, nullptr, 1);
  EXPECT_EQ(y, float(expected));
}

TEST(GgmlWeight, QuantiseKeepsGgmlsBytesAndDecodesThemBitForBit) {
  std::mt19937_64 rng(3);
  for (const WeightFormat f : ggml_formats) {
    SCOPED_TRACE(std::string(weight_format_name(f)));
    const index_t N = 5, K = 512;
    const auto W = random_floats(std::size_t(N * K), rng);
    const auto q = QuantizedWeight::quantize(ConstTensorView<float, 2>(W.data(), {N, K}), f);
    const auto expected = quantize_ggml(ggml_type_of(f), W);
    ASSERT_EQ(q.ggml_rows().size(), 1u);
    ASSERT_EQ(q.ggml_rows()[0].blocks.size(), expected.size());
    EXPECT_EQ(std::memcmp(q.ggml_rows()[0].blocks.data(), expected.data(), expected.size()), 0);
    EXPECT_EQ(q.bytes(), index_t(expected.size()));
    std::vector<float> decoded(W.size());
    dequantize_ggml(ggml_type_of(f), expected, decoded);
    const Tensor<float, 2> wh = q.dequantize();
    EXPECT_EQ(std::memcmp(wh.data(), decoded.data(), decoded.size() * 4), 0);
  }
}

TEST(GgmlWeight, GgufQ4_0BlocksMoveIntoDissectsLayoutWithTheSameValues) {
  std::mt19937_64 rng(4);
  const auto W = random_floats(4 * 64, rng);
  const auto bytes = quantize_ggml(GgmlType::q4_0, W);
  const auto q = QuantizedWeight::from_ggml(
      GgmlType::q4_0, 4, 64,
      std::span(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size()));
  EXPECT_EQ(q.format(), WeightFormat::q4_0);
  std::vector<float> decoded(W.size());
  dequantize_ggml(GgmlType::q4_0, bytes, decoded);
  const Tensor<float, 2> wh = q.dequantize();
  EXPECT_EQ(std::memcmp(wh.data(), decoded.data(), decoded.size() * 4), 0);
}

TEST(GgmlWeight, StackedFormatsRunEachRowOnItsOwnBlocks) {
  PinGuard guard;
  std::mt19937_64 rng(5);
  const index_t K = 256;
  const auto a = random_floats(std::size_t(3 * K), rng), b = random_floats(std::size_t(2 * K), rng);
  const auto qa =
      QuantizedWeight::quantize(ConstTensorView<float, 2>(a.data(), {3, K}), WeightFormat::q4_K);
  const auto qb =
      QuantizedWeight::quantize(ConstTensorView<float, 2>(b.data(), {2, K}), WeightFormat::q6_K);
  const auto stacked = QuantizedWeight::stack_rows({qa, qb, qa});
  EXPECT_EQ(stacked.rows(), 8);
  EXPECT_EQ(stacked.describe(), "q4_K rows 0-2, q6_K rows 3-4, q4_K rows 5-7");
  EXPECT_EQ(stacked.bytes(), 2 * qa.bytes() + qb.bytes());
  const auto x = random_floats(std::size_t(2 * K), rng);
  for (const KernelPath path : {KernelPath::scalar, KernelPath::avx2, KernelPath::avx512_vnni}) {
    if (!quant::cpu_supports(path)) continue;
    quant::force_kernel_path(path);
    std::vector<float> y(16), ya(6), yb(4);
    stacked.matmul(x.data(), K, 2, y.data(), 8, nullptr, 1);
    qa.matmul(x.data(), K, 2, ya.data(), 3, nullptr, 1);
    qb.matmul(x.data(), K, 2, yb.data(), 2, nullptr, 1);
    for (int i = 0; i < 2; ++i) {
      for (int r = 0; r < 3; ++r) {
        EXPECT_EQ(y[std::size_t(i * 8 + r)], ya[std::size_t(i * 3 + r)]);
        EXPECT_EQ(y[std::size_t(i * 8 + 5 + r)], ya[std::size_t(i * 3 + r)]);
      }
      for (int r = 0; r < 2; ++r)
        EXPECT_EQ(y[std::size_t(i * 8 + 3 + r)], yb[std::size_t(i * 2 + r)]);
    }
  }
}

TEST(GgmlWeight, BadInputIsAClearError) {
  std::vector<std::uint8_t> block(144, 0);
  EXPECT_THROW_WITH((void)QuantizedWeight::from_ggml(GgmlType::q4_K, 2, 256, block), ShapeError,
                    "QuantizedWeight::from_ggml(q4_K): 144 bytes for a [2, 256] weight");
  EXPECT_THROW_WITH((void)QuantizedWeight::from_ggml(GgmlType::q4_K, 1, 255, block), ShapeError,
                    "needs cols a multiple of 256");
  block[2] = 0x00, block[3] = 0x7c;  // dmin = +Inf
  EXPECT_THROW_WITH((void)QuantizedWeight::from_ggml(GgmlType::q4_K, 1, 256, block), Error,
                    "row 0, block 0 has a scale that is not finite");
  EXPECT_THROW_WITH((void)QuantizedWeight::from_ggml(GgmlType::q3_K, 1, 256, block), ConfigError,
                    "q3_K blocks are not kept");
  const std::vector<float> w(100, 1.0f);
  EXPECT_THROW_WITH((void)QuantizedWeight::quantize(ConstTensorView<float, 2>(w.data(), {1, 100}),
                                                    WeightFormat::q8_0),
                    ShapeError,
                    "quantize(q8_0): in_features 100 of weight [1, 100] is not a multiple of the "
                    "block size 32");
  const auto int8 =
      QuantizedWeight::quantize(ConstTensorView<float, 2>(w.data(), {1, 100}), WeightFormat::int8);
  EXPECT_THROW_WITH((void)QuantizedWeight::stack_rows({int8}), ConfigError,
                    "int8 is not one of ggml's block formats");

  std::vector<std::uint8_t> q8(34, 0);
  std::vector<float> x(64, 1.0f), y(1);
  const qd::GgmlWeightsView view{WeightFormat::q8_0, q8.data(), 1, 32};
  EXPECT_THROW_WITH(
      qd::ggml_matmul(KernelPath::avx512_bf16, view, x.data(), 32, 1, y.data(), 1, nullptr, 1),
      ConfigError, "the avx512_bf16 path has no kernel for q8_0 weights");
  EXPECT_THROW_WITH(
      qd::ggml_matmul(KernelPath::scalar, view, x.data(), 32, 1, y.data(), 1, nullptr, 0),
      ConfigError, "threads = 0");
  const qd::GgmlWeightsView ragged{WeightFormat::q8_0, q8.data(), 1, 48};
  EXPECT_THROW_WITH(
      qd::ggml_matmul(KernelPath::scalar, ragged, x.data(), 48, 1, y.data(), 1, nullptr, 1),
      ShapeError, "K = 48 is not a multiple of q8_0's block of 32");
}

TEST(GgmlWeight, PinnedPathsWithoutAGgmlKernelRunTheAvx2One) {
  // The rule itself, on every CPU: a pin is a function of the pinned path and the format.
  static_assert(quant::pinned_kernel_path(KernelPath::avx512_vnni, WeightFormat::q6_K) ==
                KernelPath::avx512_vnni);
  static_assert(quant::pinned_kernel_path(KernelPath::avx512_vnni, WeightFormat::q4_0) ==
                KernelPath::avx512_vnni);
  EXPECT_EQ(quant::pinned_kernel_path(KernelPath::avx512, WeightFormat::q8_0), KernelPath::avx2);
  EXPECT_EQ(quant::pinned_kernel_path(KernelPath::avx512_bf16, WeightFormat::q4_K),
            KernelPath::avx2);
  EXPECT_EQ(quant::pinned_kernel_path(KernelPath::avx512_vnni, WeightFormat::bf16),
            KernelPath::avx512);
  EXPECT_EQ(quant::pinned_kernel_path(KernelPath::scalar, WeightFormat::q4_K), KernelPath::scalar);
  EXPECT_EQ(weight_format_from_name("Q4_k"), WeightFormat::q4_K);
  EXPECT_EQ(ggml_type_of(WeightFormat::q5_K), GgmlType::q5_K);
  EXPECT_EQ(weight_format_of(GgmlType::q6_K), WeightFormat::q6_K);
  EXPECT_FALSE(weight_format_of(GgmlType::q4_1).has_value());
  for (const WeightFormat f : ggml_formats) {
    // One fact, two tables: the dtype's block is ggml's.
    EXPECT_EQ(dtype_info(dtype_of(f)).block_elements,
              ggml_type_info(ggml_type_of(f)).block_elements);
    EXPECT_EQ(dtype_info(dtype_of(f)).block_bytes, ggml_type_info(ggml_type_of(f)).block_bytes);
  }
  // And through force_kernel_path, for each pinned path this CPU can run (the others cannot be
  // pinned here: force_kernel_path refuses them).
  PinGuard guard;
  quant::force_kernel_path(KernelPath::scalar);
  EXPECT_EQ(quant::active_kernel_path(WeightFormat::q4_K, 1), KernelPath::scalar);
  for (const KernelPath pinned :
       {KernelPath::avx2, KernelPath::avx512, KernelPath::avx512_vnni, KernelPath::avx512_bf16}) {
    SCOPED_TRACE(std::string(quant::kernel_path_name(pinned)));
    if (!quant::cpu_supports(pinned)) {
      std::cout << "[ SKIPPED  ] pinning " << quant::kernel_path_name(pinned)
                << ": this CPU cannot run it\n";
      continue;
    }
    quant::force_kernel_path(pinned);
    for (const WeightFormat f : {WeightFormat::q8_0, WeightFormat::q4_K, WeightFormat::q6_K,
                                 WeightFormat::q4_0, WeightFormat::bf16}) {
      EXPECT_EQ(quant::active_kernel_path(f, 128), quant::pinned_kernel_path(pinned, f));
    }
  }
}

}  // namespace test_ggml_dot
