// Tests for tq2_0, ggml's ternary blocks (BitNet b1.58): the codec against llama.cpp's reference
// rule written out here (quantize_row_tq2_0_ref, dequantize_row_tq2_0), a hand-built block, and
// the kernels (quant/detail/ggml_dot.hpp, ggml_dot_avx512.hpp): the avx2 and avx512_vnni paths
// against an exact double sum over the same q8_K activations, with ŵ rebuilt here from the
// published layout (not from the library's decoder), over a thousand random shapes; the two
// integer paths against each other, bit for bit; both against the scalar oracle within the
// activation rounding, a bound shown not to be vacuous; and a check that the tolerances would
// catch a kernel that mishandled the codes' +1 offset or their order. Then QuantizedWeight,
// Linear and the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <random>
#include <set>
#include <span>
#include <vector>

#include "dissect/layers/linear.hpp"
#include "dissect/numeric/half.hpp"
#include "dissect/quant/weight_format.hpp"
#include "support/tensor_testing.hpp"

namespace test_tq2_0 {

using namespace dissect;
using quant::KernelPath;
namespace qd = quant::detail;

constexpr double u32 = 0x1.0p-24;
constexpr index_t block_values = 256, block_bytes = 66;

struct PinGuard {
  ~PinGuard() { quant::force_kernel_path(std::nullopt); }
};

/// Code of value k (0 ≤ k < 256) of a block, from llama.cpp's layout: byte 32·(k / 128) + k % 32,
/// bits 2·((k % 128) / 32) and the next.
int code_of(const std::uint8_t* block, int k) {
  return (block[32 * (k / 128) + k % 32] >> (2 * ((k % 128) / 32))) & 3;
}
void set_code(std::uint8_t* block, int k, int code) {
  const int shift = 2 * ((k % 128) / 32);
  std::uint8_t& byte = block[32 * (k / 128) + k % 32];
  byte = static_cast<std::uint8_t>((byte & ~(3 << shift)) | (code << shift));
}
double scale_of(const std::uint8_t* block) {
  return fp16_to_float(static_cast<std::uint16_t>(block[64] | (block[65] << 8)));
}
void set_scale(std::uint8_t* block, float d) {
  const std::uint16_t h = float_to_fp16(d);
  block[64] = h & 0xff;
  block[65] = h >> 8;
}

/// llama.cpp's quantize_row_tq2_0_ref, transcribed for the test from its published rule: the
/// block's largest magnitude is d, code = lroundf(x·(1/d)) + 1.
std::vector<std::uint8_t> reference_quantize(const std::vector<float>& x) {
  std::vector<std::uint8_t> out(x.size() / block_values * block_bytes, 0);
  for (std::size_t b = 0; b < x.size() / block_values; ++b) {
    const float* v = x.data() + b * block_values;
    std::uint8_t* block = out.data() + b * block_bytes;
    float amax = 0;
    for (int k = 0; k < 256; ++k) amax = std::max(amax, std::fabs(v[k]));
    const float id = amax != 0 ? 1.0f / amax : 0.0f;
    for (int k = 0; k < 256; ++k) set_code(block, k, int(std::lround(v[k] * id)) + 1);
    set_scale(block, amax);
  }
  return out;
}

/// Random blocks: codes 0, 1, 2 uniformly (every level, and runs of each), scales of both signs
/// (fp16 d need not be positive in a file) and of a few magnitudes.
std::vector<std::uint8_t> random_blocks(index_t rows, index_t cols, std::mt19937_64& rng) {
  // The 81 bytes whose four codes are all 0, 1 or 2; a byte drawn from them draws its four codes
  // independently and uniformly (one draw per byte: the test runs at -O0 under sanitizers).
  static const std::vector<std::uint8_t> ternary_bytes = [] {
    std::vector<std::uint8_t> bytes;
    for (int v = 0; v < 256; ++v) {
      if ((v & (v >> 1) & 0x55) == 0) bytes.push_back(static_cast<std::uint8_t>(v));
    }
    return bytes;
  }();
  const index_t count = rows * cols / block_values;
  std::vector<std::uint8_t> out(std::size_t(count * block_bytes), 0);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  for (index_t i = 0; i < count; ++i) {
    std::uint8_t* b = out.data() + i * block_bytes;
    for (int j = 0; j < 64; j += 4) {
      std::uint64_t r = rng();
      for (int t = 0; t < 4; ++t, r >>= 16) b[j + t] = ternary_bytes[(r & 0xffff) % 81];
    }
    set_scale(b, (i % 5 == 4 ? -1.0f : 1.0f) * scale(rng));
  }
  return out;
}

/// ŵ [rows, cols] in double, from the layout above; with `code_offset` 0 instead of 1, or
/// `flat` (four consecutive values per byte), the weights of two wrong kernels.
std::vector<double> reference_weights(const std::vector<std::uint8_t>& bytes, index_t rows,
                                      index_t cols, int code_offset = 1, bool flat = false) {
  std::vector<double> w(std::size_t(rows * cols));
  double* out = w.data();
  for (std::size_t b = 0; b < w.size() / block_values; ++b) {
    const std::uint8_t* block = bytes.data() + b * block_bytes;
    const double d = scale_of(block);
    for (int k = 0; k < 256; ++k) {
      const int code = flat ? (block[k / 4] >> (2 * (k % 4))) & 3 : code_of(block, k);
      *out++ = (code - code_offset) * d;
    }
  }
  return w;
}

std::vector<float> random_floats(std::size_t n, std::mt19937_64& rng, float spread = 1.0f) {
  std::normal_distribution<float> value(0.0f, spread);
  std::vector<float> out(n);
  for (auto& v : out) v = value(rng);
  return out;
}

/// x̂: x rounded to q8_K as the kernels round it (ggml's rule), decoded back, in double.
std::vector<double> quantised_activations(const std::vector<float>& x, index_t m, index_t K) {
  std::vector<std::uint8_t> q(std::size_t(m * ggml_row_bytes(GgmlType::q8_K, K)));
  qd::quantize_ggml_activations(WeightFormat::tq2_0, x.data(), K, m, K, q.data());
  std::vector<float> decoded(std::size_t(m * K));
  dequantize_ggml(GgmlType::q8_K, std::as_bytes(std::span(q)), decoded);
  return {decoded.begin(), decoded.end()};
}

/// The integer paths this CPU runs.
std::vector<KernelPath> integer_paths() {
  std::vector<KernelPath> out;
  for (const KernelPath p : {KernelPath::avx2, KernelPath::avx512_vnni}) {
    if (quant::cpu_supports(p)) out.push_back(p);
  }
  return out;
}

// ---- the codec ------------------------------------------------------------------------------

TEST(Tq2_0Codec, AHandBuiltBlockDecodesByTheLayout) {
  // d = 0.5; value k has code k % 3, so ŵ_k = (k % 3 − 1)·0.5. Byte m of half h holds values
  // 128h + 32l + m in bits 2l, 2l + 1: written out bit by bit here.
  std::vector<std::uint8_t> block(66, 0);
  for (int h = 0; h < 2; ++h) {
    for (int m = 0; m < 32; ++m) {
      for (int l = 0; l < 4; ++l) {
        const int k = 128 * h + 32 * l + m;
        block[std::size_t(32 * h + m)] |= static_cast<std::uint8_t>((k % 3) << (2 * l));
      }
    }
  }
  block[64] = 0x00, block[65] = 0x38;  // fp16 0.5
  std::vector<float> values(256);
  dequantize_ggml(GgmlType::tq2_0, std::as_bytes(std::span(block)), values);
  for (int k = 0; k < 256; ++k) EXPECT_EQ(values[std::size_t(k)], (k % 3 - 1) * 0.5f) << k;
  // Quantising those values gives the block back: d = max|ŵ| = 0.5, every code exact.
  const auto again = quantize_ggml(GgmlType::tq2_0, values);
  EXPECT_EQ(std::memcmp(again.data(), block.data(), 66), 0);
  // Code 3 decodes as llama.cpp's dequantize_row_tq2_0 does: (3 − 1)·d.
  block[0] = 0x03;
  dequantize_ggml(GgmlType::tq2_0, std::as_bytes(std::span(block)), values);
  EXPECT_EQ(values[0], 1.0f);
}

TEST(Tq2_0Codec, QuantisesToLlamaCppsReferenceBytes) {
  std::mt19937_64 rng(35);
  for (int trial = 0; trial < 40; ++trial) {
    const float spread = trial % 2 ? 1.0f : 0x1p-10f;
    auto x = random_floats(4 * 256, rng, spread);
    // Ties: the block's largest |x| is 16·spread, and ±8·spread (exactly d/2) rounds away from
    // zero. A block of zeros has d = 0 and codes 1.
    x[7] = 16 * spread;
    x[3] = 8 * spread;
    x[4] = -8 * spread;
    std::fill(x.begin() + 512, x.begin() + 768, 0.0f);
    const auto actual = quantize_ggml(GgmlType::tq2_0, x);
    const auto expected = reference_quantize(x);
    ASSERT_EQ(actual.size(), expected.size());
    EXPECT_EQ(std::memcmp(actual.data(), expected.data(), expected.size()), 0) << "trial " << trial;
  }
  // The tie: x = d/2 is code 2 (lroundf rounds half away from zero), −d/2 code 0.
  std::vector<float> tie(256, 0.0f);
  tie[0] = 2, tie[1] = 1, tie[2] = -1;
  const auto bytes = quantize_ggml(GgmlType::tq2_0, tie);
  const auto* b = reinterpret_cast<const std::uint8_t*>(bytes.data());
  EXPECT_EQ(code_of(b, 0), 2);
  EXPECT_EQ(code_of(b, 1), 2);
  EXPECT_EQ(code_of(b, 2), 0);
  EXPECT_EQ(code_of(b, 3), 1);
  EXPECT_EQ(scale_of(b), 2.0);
}

TEST(Tq2_0Codec, RoundTripKeepsTernaryWeightsAndErrsByAtMostHalfTheScale) {
  std::mt19937_64 rng(36);
  // Random valid blocks decode and re-encode to the same bytes when each block's scale is
  // reached (a block with codes 1 only has no scale to find: d comes back 0).
  auto bytes = random_blocks(3, 512, rng);
  for (std::size_t b = 0; b < 6; ++b) {
    set_scale(bytes.data() + b * 66, std::fabs(float(scale_of(bytes.data() + b * 66))));
    set_code(bytes.data() + b * 66, 0, 2);
  }
  std::vector<float> values(3 * 512);
  dequantize_ggml(GgmlType::tq2_0, std::as_bytes(std::span(bytes)), values);
  const auto again = quantize_ggml(GgmlType::tq2_0, values);
  EXPECT_EQ(std::memcmp(again.data(), bytes.data(), bytes.size()), 0);
  // Any float row: |ŵ − w| ≤ d/2 plus the fp16 rounding of d.
  const auto x = random_floats(8 * 256, rng);
  const auto q = quantize_ggml(GgmlType::tq2_0, x);
  std::vector<float> back(x.size());
  dequantize_ggml(GgmlType::tq2_0, q, back);
  for (std::size_t first = 0; first < x.size(); first += 256) {
    float d = 0;
    for (std::size_t i = 0; i < 256; ++i) d = std::max(d, std::fabs(x[first + i]));
    for (std::size_t i = 0; i < 256; ++i) {
      ASSERT_LE(std::fabs(back[first + i] - x[first + i]), 0.5f * d + d * 0x1p-11f) << first + i;
    }
  }
}

TEST(Tq2_0Codec, RefusesWhatFp16CannotScaleAndNonFiniteValues) {
  std::vector<float> x(256, 1.0f);
  x[5] = 70000.0f;  // d = 70000 is beyond fp16
  EXPECT_THROW_WITH((void)quantize_ggml(GgmlType::tq2_0, x), Error,
                    "quantize_ggml(tq2_0): the block of values 0..255 (largest magnitude 70000) "
                    "needs a scale beyond what tq2_0 stores");
  x[5] = NAN;
  EXPECT_THROW_WITH((void)quantize_ggml(GgmlType::tq2_0, x), Error,
                    "quantize_ggml(tq2_0): value 5 is nan");
  EXPECT_THROW_WITH((void)quantize_ggml(GgmlType::tq2_0, std::vector<float>(100)), ShapeError,
                    "not a whole number of tq2_0 blocks (256 values each)");
  // A block whose largest value is so small that 1/d overflows still quantises: fp16(d) = 0.
  std::vector<float> tiny(256, 0.0f);
  tiny[9] = 1e-39f;
  const auto bytes = quantize_ggml(GgmlType::tq2_0, tiny);
  std::vector<float> back(256);
  dequantize_ggml(GgmlType::tq2_0, bytes, back);
  for (const float v : back) EXPECT_EQ(v, 0.0f);
}

// ---- the kernels ----------------------------------------------------------------------------

struct Products {
  std::vector<double> exact;      ///< x̂·ŵᵀ + b, exactly
  std::vector<double> magnitude;  ///< Σ|ŵ|·|x̂| + |b|, for the float rounding bound
  std::vector<double> no_offset;  ///< a mutant: the codes taken as the weights (offset forgotten)
  std::vector<double> flat;       ///< a mutant: codes read as 4 consecutive values per byte
};

/// The products of x̂ [m, K] and the weights (raw pointers: the test runs at -O0 under the
/// sanitizers, where every operator[] is a call).
Products products(const std::vector<std::uint8_t>& bytes, index_t N, index_t K,
                  const std::vector<double>& xq, index_t m, const std::vector<float>& bias,
                  bool mutants) {
  const auto w = reference_weights(bytes, N, K);
  const auto w0 = mutants ? reference_weights(bytes, N, K, 0) : std::vector<double>{};
  const auto wf = mutants ? reference_weights(bytes, N, K, 1, true) : std::vector<double>{};
  Products p;
  for (auto* v : {&p.exact, &p.magnitude, &p.no_offset, &p.flat}) v->assign(std::size_t(m * N), 0);
  for (index_t i = 0; i < m; ++i) {
    const double* x = xq.data() + i * K;
    for (index_t n = 0; n < N; ++n) {
      const double b = bias.empty() ? 0 : bias[std::size_t(n)];
      double e = b, mag = std::abs(b), no_offset = b, flat = b;
      const double* wn = w.data() + n * K;
      for (index_t k = 0; k < K; ++k) {
        const double t = wn[k] * x[k];
        e += t;
        mag += t < 0 ? -t : t;
      }
      if (mutants) {
        const double* w0n = w0.data() + n * K;
        const double* wfn = wf.data() + n * K;
        for (index_t k = 0; k < K; ++k) {
          no_offset += w0n[k] * x[k];
          flat += wfn[k] * x[k];
        }
      }
      const auto at = std::size_t(i * N + n);
      p.exact[at] = e;
      p.magnitude[at] = mag;
      p.no_offset[at] = no_offset;
      p.flat[at] = flat;
    }
  }
  return p;
}

/// The float steps' bound: the scale d·dx rounded, one fused multiply-add per block per lane,
/// the horizontal sum of 8 lanes, the bias: (K/256 + 6)·u·Σ|terms| with room to spare.
double float_bound(index_t K, double magnitude) {
  return (double(K / 256) + 8) * u32 * magnitude;
}

TEST(Tq2_0Kernels, OverAThousandShapesTheIntegerPathsAreExactUpToFloatSumsAndAgreeBitForBit) {
  const auto paths = integer_paths();
  if (paths.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  const bool both = paths.size() == 2;
  if (!both) {
    std::printf("[ note ] no AVX-512 VNNI (avx512f/bw/vl/vnni): the avx2 path alone is checked\n");
  }
  std::mt19937_64 rng(1000);
  // Each extent uniform on a log scale over its range (M 1..9, N 1..40, K 256..2048), so that
  // small shapes (a single row, one block, a tile's remainder) are as common as large ones and
  // the test stays within its time at -O0 under the sanitizers.
  const auto pick = [&rng](int largest) {
    std::uniform_real_distribution<double> log_value(0.0, std::log(largest + 1.0));
    return std::clamp(int(std::exp(log_value(rng))), 1, largest);
  };
  const auto pick_m = [&] { return pick(9); };
  const auto pick_n = [&] { return pick(40); };
  const auto pick_blocks = [&] { return pick(8); };
  int shapes = 0, mutants_caught = 0, mutant_results = 0;
  std::set<index_t> seen_m, seen_n, seen_k;
  double worst = 0;
  for (; shapes < 1000; ++shapes) {
    const index_t m = pick_m(), N = pick_n(), K = 256 * index_t(pick_blocks());
    seen_m.insert(m), seen_n.insert(N), seen_k.insert(K);
    const auto bytes = random_blocks(N, K, rng);
    const auto x = random_floats(std::size_t(m * K), rng, shapes % 3 ? 1.0f : 40.0f);
    const auto bias = shapes % 2 ? random_floats(std::size_t(N), rng) : std::vector<float>{};
    const bool mutants = shapes % 4 == 0;
    const Products p = products(bytes, N, K, quantised_activations(x, m, K), m, bias, mutants);
    std::vector<std::vector<float>> ys;
    for (const KernelPath path : paths) {
      std::vector<float> y(std::size_t(m * N), NAN);
      qd::ggml_matmul(path, {WeightFormat::tq2_0, bytes.data(), N, K}, x.data(), K, m, y.data(), N,
                      bias.empty() ? nullptr : bias.data(), 1 + shapes % 2);
      for (std::size_t e = 0; e < y.size(); ++e) {
        const double bound = float_bound(K, p.magnitude[e]);
        ASSERT_LE(std::abs(y[e] - p.exact[e]), bound)
            << quant::kernel_path_name(path) << " m " << m << " N " << N << " K " << K
            << " element " << e;
        worst = std::max(worst, std::abs(y[e] - p.exact[e]) / p.magnitude[e]);
        // The same tolerance would reject a kernel that forgot the +1 offset or read the codes
        // in the wrong order, wherever such a kernel's result is not by chance close.
        if (!mutants) continue;
        for (const double mutant : {p.no_offset[e], p.flat[e]}) {
          ++mutant_results;
          mutants_caught += std::abs(mutant - p.exact[e]) > bound;
        }
      }
      ys.push_back(std::move(y));
    }
    if (both) {
      ASSERT_EQ(std::memcmp(ys[0].data(), ys[1].data(), ys[0].size() * 4), 0)
          << "avx2 and avx512_vnni differ: m " << m << " N " << N << " K " << K;
    }
  }
  EXPECT_EQ(shapes, 1000);
  EXPECT_EQ(seen_m.size(), 9u);  // every M, every K and most N occurred
  EXPECT_EQ(seen_k.size(), 8u);
  EXPECT_GT(seen_n.size(), 35u);
  EXPECT_GT(worst, 0.0);  // the float steps leave a trace: the bound is not met by accident
  EXPECT_GT(mutant_results, 1000);
  EXPECT_GT(mutants_caught, mutant_results * 99 / 100)
      << mutants_caught << " of " << mutant_results;
}

TEST(Tq2_0Kernels, ThreadsAndTilesDoNotChangeBits) {
  // m = 17 crosses the avx512_vnni path's tiles of 8 rows; N = 37 the tasks of 4 weight rows.
  const auto paths = integer_paths();
  if (paths.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937_64 rng(17);
  const index_t m = 17, N = 37, K = 768;
  const auto bytes = random_blocks(N, K, rng);
  const auto x = random_floats(std::size_t(m * K), rng);
  for (const KernelPath path : paths) {
    std::vector<float> one(std::size_t(m * N)), two(one), rows(one);
    const qd::GgmlWeightsView w{WeightFormat::tq2_0, bytes.data(), N, K};
    qd::ggml_matmul(path, w, x.data(), K, m, one.data(), N, nullptr, 1);
    qd::ggml_matmul(path, w, x.data(), K, m, two.data(), N, nullptr, 2);
    for (index_t i = 0; i < m; ++i) {
      qd::ggml_matmul(path, w, x.data() + i * K, K, 1, rows.data() + i * N, N, nullptr, 1);
    }
    EXPECT_EQ(std::memcmp(one.data(), two.data(), one.size() * 4), 0);
    EXPECT_EQ(std::memcmp(one.data(), rows.data(), one.size() * 4), 0);
  }
}

TEST(Tq2_0Kernels, IntegerPathsDifferFromTheOracleByTheActivationRoundingAlone) {
  const auto paths = integer_paths();
  if (paths.empty()) GTEST_SKIP() << "this CPU has no AVX2";
  std::mt19937_64 rng(7);
  const index_t K = 1024, N = 24, m = 3;
  const auto W = random_floats(std::size_t(N * K), rng, 0.05f);
  const auto q =
      QuantizedWeight::quantize(ConstTensorView<float, 2>(W.data(), {N, K}), WeightFormat::tq2_0);
  const Tensor<float, 2> wh = q.dequantize();
  const auto x = random_floats(std::size_t(m * K), rng);
  const auto xq = quantised_activations(x, m, K);
  const qd::GgmlWeightsView w{WeightFormat::tq2_0, q.ggml_rows()[0].blocks.data(), N, K};
  std::vector<float> oracle(std::size_t(m * N));
  qd::ggml_matmul(KernelPath::scalar, w, x.data(), K, m, oracle.data(), N, nullptr, 1);
  // The oracle is Σ x·ŵ in double, rounded once.
  for (index_t i = 0; i < m; ++i) {
    for (index_t n = 0; n < N; ++n) {
      double exact = 0;
      for (index_t k = 0; k < K; ++k) exact += double(x[std::size_t(i * K + k)]) * wh(n, k);
      EXPECT_EQ(oracle[std::size_t(i * N + n)], float(exact));
    }
  }
  for (const KernelPath path : paths) {
    SCOPED_TRACE(std::string(quant::kernel_path_name(path)));
    std::vector<float> fast(std::size_t(m * N));
    qd::ggml_matmul(path, w, x.data(), K, m, fast.data(), N, nullptr, 1);
    double worst_gap = 0, worst_float = 0, worst_ratio = 0;
    for (index_t n = 0; n < N; ++n) {
      for (index_t i = 0; i < m; ++i) {
        double rounding = 0, magnitude = 0, y = 0;
        for (index_t k = 0; k < K; ++k) {
          const double xv = x[std::size_t(i * K + k)];
          rounding += std::abs(wh(n, k)) * std::abs(xv - xq[std::size_t(i * K + k)]);
          magnitude += std::abs(wh(n, k) * xv);
          y += wh(n, k) * xv;
        }
        // Σ|ŵ|·|x − x̂|, then the float steps of the kernel and of the oracle's one rounding.
        const double bound = rounding + float_bound(K, 1.01 * magnitude) + u32 * std::abs(y);
        const double gap = std::abs(fast[std::size_t(i * N + n)] - oracle[std::size_t(i * N + n)]);
        EXPECT_LE(gap, bound) << "n " << n << " i " << i;
        worst_gap = std::max(worst_gap, gap);
        worst_float = std::max(worst_float, float_bound(K, 1.01 * magnitude));
        // Not vacuous: a q8_K step is 1/127 of the block's largest |x|, so the bound stays a
        // small part of Σ|ŵ·x| (it is about 1 % here), far below what a wrong kernel makes.
        worst_ratio = std::max(worst_ratio, bound / magnitude);
      }
    }
    EXPECT_GT(worst_gap, worst_float) << "the activation rounding is real";
    EXPECT_LT(worst_ratio, 0.02);
  }
}

TEST(Tq2_0Kernels, PathsAndDispatch) {
  PinGuard guard;
  EXPECT_TRUE(quant::path_applies(KernelPath::avx512_vnni, WeightFormat::tq2_0));
  EXPECT_TRUE(quant::path_applies(KernelPath::avx2, WeightFormat::tq2_0));
  EXPECT_FALSE(quant::path_applies(KernelPath::avx512_bf16, WeightFormat::tq2_0));
  EXPECT_EQ(quant::pinned_kernel_path(KernelPath::avx512, WeightFormat::tq2_0), KernelPath::avx2);
  if (quant::cpu_supports(KernelPath::avx512)) {
    quant::force_kernel_path(KernelPath::avx512);
    EXPECT_EQ(quant::active_kernel_path(WeightFormat::tq2_0, 1), KernelPath::avx2);
  } else {
    std::cout << "[ SKIPPED  ] pinning avx512: this CPU cannot run it\n";
  }
  quant::force_kernel_path(KernelPath::scalar);
  EXPECT_EQ(quant::active_kernel_path(WeightFormat::tq2_0, 1), KernelPath::scalar);
  quant::force_kernel_path(std::nullopt);
  if (quant::cpu_supports(KernelPath::avx512_vnni)) {
    EXPECT_EQ(quant::active_kernel_path(WeightFormat::tq2_0, 1), KernelPath::avx512_vnni);
  }
  std::vector<std::uint8_t> blocks(66, 0x55);
  std::vector<float> x(300, 1.0f), y(1);
  const qd::GgmlWeightsView ragged{WeightFormat::tq2_0, blocks.data(), 1, 300};
  EXPECT_THROW_WITH(
      qd::ggml_matmul(KernelPath::scalar, ragged, x.data(), 300, 1, y.data(), 1, nullptr, 1),
      ShapeError,
      "quantized_matmul(tq2_0, scalar): K = 300 is not a multiple of tq2_0's block of 256");
  EXPECT_THROW_WITH(
      qd::ggml_matmul(KernelPath::avx512_bf16, {WeightFormat::tq2_0, blocks.data(), 1, 256},
                      x.data(), 256, 1, y.data(), 1, nullptr, 1),
      ConfigError, "the avx512_bf16 path has no kernel for tq2_0 weights");
}

// ---- names, QuantizedWeight, Linear ---------------------------------------------------------

TEST(Tq2_0Weight, NamesAndSizesAreOneFact) {
  EXPECT_EQ(weight_format_name(WeightFormat::tq2_0), "tq2_0");
  EXPECT_EQ(weight_format_from_name("TQ2_0"), WeightFormat::tq2_0);
  EXPECT_TRUE(is_ggml_format(WeightFormat::tq2_0));
  EXPECT_EQ(ggml_type_of(WeightFormat::tq2_0), GgmlType::tq2_0);
  EXPECT_EQ(weight_format_of(GgmlType::tq2_0), WeightFormat::tq2_0);
  EXPECT_EQ(static_cast<std::uint32_t>(GgmlType::tq2_0), 35u);
  EXPECT_EQ(dtype_of(WeightFormat::tq2_0), Dtype::tq2_0);
  EXPECT_EQ(dtype_name(Dtype::tq2_0), "tq2_0");
  EXPECT_EQ(dtype_info(Dtype::tq2_0).block_elements, 256);
  EXPECT_EQ(dtype_info(Dtype::tq2_0).block_bytes, 66);
  EXPECT_EQ(ggml_type_info(GgmlType::tq2_0).block_bytes, 66);
  EXPECT_TRUE(ggml_type_info(GgmlType::tq2_0).decoded_by_dissect);
  // 2.0625 bits per weight: 64 bytes of codes and an fp16 scale per 256.
  EXPECT_EQ(double(bytes_for(4096, Dtype::tq2_0)) * 8 / 4096, 2.0625);
  EXPECT_THROW_WITH((void)dtype_bits(Dtype::tq2_0), ConfigError,
                    "dtype_bits: tq2_0 is a block format (66 bytes per 256 values)");
  EXPECT_TRUE(QuantizedWeight::keeps_ggml_type(GgmlType::tq2_0));
}

TEST(Tq2_0Weight, LinearHoldsTernaryWeightsAndRunsThemOnEveryPath) {
  PinGuard guard;
  std::mt19937_64 rng(8);
  const index_t in = 512, out = 9, m = 4;
  Linear<float> layer(in, out, LinearOptions{.seed = 3});
  layer.quantize(WeightFormat::tq2_0);
  ASSERT_TRUE(layer.quantized());
  const QuantizedWeight& q = layer.quantized_weight();
  EXPECT_EQ(q.format(), WeightFormat::tq2_0);
  EXPECT_EQ(q.bytes(), out * (in / 256) * 66);
  // The float weight Linear keeps is Ŵ: ternary per block.
  for (index_t n = 0; n < out; ++n) {
    for (index_t b = 0; b < in / 256; ++b) {
      float d = 0;
      for (index_t k = 0; k < 256; ++k) d = std::max(d, std::fabs(layer.weight()(n, 256 * b + k)));
      for (index_t k = 0; k < 256; ++k) {
        const float v = layer.weight()(n, 256 * b + k);
        EXPECT_TRUE(v == 0 || v == d || v == -d) << n << ", " << 256 * b + k;
      }
    }
  }
  const auto xs = random_floats(std::size_t(m * in), rng);
  const Tensor<float, 2> x(ConstTensorView<float, 2>(xs.data(), {m, in}));
  std::vector<Tensor<float, 2>> ys;
  for (const KernelPath path : {KernelPath::scalar, KernelPath::avx2, KernelPath::avx512_vnni}) {
    if (!quant::cpu_supports(path)) continue;
    quant::force_kernel_path(path);
    ys.push_back(layer.forward(x));
  }
  const Tensor<float, 2> reference = layer.forward(x);  // still the last path: compared below
  const Tensor<float, 2> wh = q.dequantize();
  for (const auto& y : ys) {
    for (index_t i = 0; i < m; ++i) {
      for (index_t n = 0; n < out; ++n) {
        double exact = layer.bias()(n), magnitude = std::abs(layer.bias()(n));
        for (index_t k = 0; k < in; ++k) {
          exact += double(x(i, k)) * wh(n, k);
          magnitude += std::abs(double(x(i, k)) * wh(n, k));
        }
        // The activations' q8_K rounding: at most half a step, 1/254 of the largest |x|.
        EXPECT_NEAR(y(i, n), exact, magnitude / 100) << i << ", " << n;
      }
    }
  }
  EXPECT_EQ(reference(0, 0), ys.back()(0, 0));
  Linear<float> ragged(300, 2);
  EXPECT_THROW_WITH(ragged.quantize(WeightFormat::tq2_0), ShapeError,
                    "quantize(tq2_0): in_features 300 of weight [2, 300] is not a multiple of the "
                    "block size 256");
}

TEST(Tq2_0Weight, StacksWithOtherGgmlFormats) {
  std::mt19937_64 rng(5);
  const index_t K = 256;
  const auto a = random_floats(std::size_t(3 * K), rng), b = random_floats(std::size_t(2 * K), rng);
  const auto qa =
      QuantizedWeight::quantize(ConstTensorView<float, 2>(a.data(), {3, K}), WeightFormat::tq2_0);
  const auto qb =
      QuantizedWeight::quantize(ConstTensorView<float, 2>(b.data(), {2, K}), WeightFormat::q4_K);
  const auto stacked = QuantizedWeight::stack_rows({qa, qb});
  EXPECT_EQ(stacked.describe(), "tq2_0 rows 0-2, q4_K rows 3-4");
  const auto x = random_floats(std::size_t(K), rng);
  std::vector<float> y(5), ya(3), yb(2);
  stacked.matmul(x.data(), K, 1, y.data(), 5, nullptr, 1);
  qa.matmul(x.data(), K, 1, ya.data(), 3, nullptr, 1);
  qb.matmul(x.data(), K, 1, yb.data(), 2, nullptr, 1);
  for (int r = 0; r < 3; ++r) EXPECT_EQ(y[std::size_t(r)], ya[std::size_t(r)]);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(y[std::size_t(3 + r)], yb[std::size_t(r)]);
}

TEST(Tq2_0Weight, BadBytesAreAClearError) {
  std::mt19937_64 rng(9);
  auto blocks = random_blocks(2, 512, rng);
  const auto q = QuantizedWeight::from_ggml(GgmlType::tq2_0, 2, 512, blocks);
  EXPECT_EQ(q.format(), WeightFormat::tq2_0);
  std::vector<float> decoded(2 * 512);
  dequantize_ggml(GgmlType::tq2_0, std::as_bytes(std::span(blocks)), decoded);
  const Tensor<float, 2> wh = q.dequantize();
  EXPECT_EQ(std::memcmp(wh.data(), decoded.data(), decoded.size() * 4), 0);

  auto three = blocks;
  three[2 * 66 + 40] |= 0x30;  // row 1, block 0, byte 40: bits 4-5 → code 3
  EXPECT_THROW_WITH((void)QuantizedWeight::from_ggml(GgmlType::tq2_0, 2, 512, three), Error,
                    "QuantizedWeight::from_ggml(tq2_0): row 1, block 0 holds code 3 in byte 40");
  auto infinite = blocks;
  infinite[3 * 66 + 64] = 0x00, infinite[3 * 66 + 65] = 0x7c;  // row 1, block 1: d = +Inf
  EXPECT_THROW_WITH((void)QuantizedWeight::from_ggml(GgmlType::tq2_0, 2, 512, infinite), Error,
                    "from_ggml(tq2_0): row 1, block 1 has a scale that is not finite");
  EXPECT_THROW_WITH((void)QuantizedWeight::from_ggml(GgmlType::tq2_0, 2, 500, blocks), ShapeError,
                    "needs cols a multiple of 256");
}

}  // namespace test_tq2_0
