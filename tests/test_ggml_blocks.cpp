// Tests for dissect/quant/ggml_blocks.hpp against llama.cpp itself: blocks.gguf (written by
// tests/reference/gguf/make_block_fixture.cpp with llama.cpp's libggml-base) holds 16 awkward
// rows, llama.cpp's quantisation of them in every block type and llama.cpp's dequantisation of
// those bytes. dissect must produce the same bytes from the same floats and the same floats
// from the same bytes, bit for bit. tq2_0 (ternary, BitNet b1.58) too, and its dot product with
// q8_K activations on every kernel path against llama.cpp's dequantised weights and activations.
// Then the refusals: sizes, types, non-finite values, scales that overflow.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/io/gguf.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/quant/ggml_blocks.hpp"
#include "support/io_testing.hpp"

namespace dissect {
namespace test_ggml_blocks {

using testing::contains;

const GgufFile& fixture() {
  static const GgufFile file(std::filesystem::path(DISSECT_GGUF_FIXTURE_DIR) / "blocks.gguf");
  return file;
}

// tq2_0 came last, after the others' bytes were fixed: its quantiser is ggml_quantize_chunk's
// (quantize_tq2_0 → quantize_row_tq2_0_ref: d = max|x| of the block, code = lroundf(x/d) + 1, so
// x = ±d/2 rounds away from zero, as row 7's halves test; a zero block has d = 0 and codes 1).
constexpr GgmlType fixture_types[] = {GgmlType::f16,  GgmlType::bf16, GgmlType::q4_0,
                                      GgmlType::q4_1, GgmlType::q5_0, GgmlType::q5_1,
                                      GgmlType::q8_0, GgmlType::q4_K, GgmlType::q5_K,
                                      GgmlType::q6_K, GgmlType::q8_K, GgmlType::tq2_0};

class GgmlBlocksAgainstLlamaCpp : public ::testing::TestWithParam<GgmlType> {};

TEST_P(GgmlBlocksAgainstLlamaCpp, QuantisesToLlamaCppsBytes) {
  const GgmlType type = GetParam();
  const std::string name = ggml_type_name(type);
  const std::vector<float> source = fixture().dequantize("source");
  const std::span<const std::byte> expected = fixture().bytes(name);
  const std::vector<std::byte> actual = quantize_ggml(type, source);
  ASSERT_EQ(actual.size(), expected.size());
  const GgmlTypeInfo info = ggml_type_info(type);
  const auto block_bytes = static_cast<std::size_t>(info.block_bytes);
  int wrong_blocks = 0;
  for (std::size_t b = 0; b * block_bytes < actual.size(); ++b) {
    if (std::memcmp(actual.data() + b * block_bytes, expected.data() + b * block_bytes,
                    block_bytes) != 0 &&
        ++wrong_blocks <= 3) {
      const auto first = static_cast<index_t>(b) * info.block_elements;
      ADD_FAILURE() << name << ": block " << b << " (row " << first / 512 << ", values "
                    << first % 512 << "..) differs from llama.cpp's";
    }
  }
  EXPECT_EQ(wrong_blocks, 0) << name;
}

TEST_P(GgmlBlocksAgainstLlamaCpp, DequantisesToLlamaCppsFloats) {
  const GgmlType type = GetParam();
  const std::string name = ggml_type_name(type);
  const std::vector<float> expected = fixture().dequantize(name + ".dequantized");
  std::vector<float> actual(expected.size());
  dequantize_ggml(type, fixture().bytes(name), actual);
  int wrong = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    if (std::bit_cast<std::uint32_t>(actual[i]) != std::bit_cast<std::uint32_t>(expected[i]) &&
        ++wrong <= 3) {
      ADD_FAILURE() << name << ": value " << i << " is " << actual[i] << ", llama.cpp's "
                    << expected[i];
    }
  }
  EXPECT_EQ(wrong, 0) << name;
  // And through the reader, which must take the same path.
  const std::vector<float> loaded = fixture().dequantize(name);
  EXPECT_EQ(std::memcmp(loaded.data(), expected.data(), loaded.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(EveryType, GgmlBlocksAgainstLlamaCpp, ::testing::ValuesIn(fixture_types),
                         [](const auto& info) { return ggml_type_name(info.param); });

TEST(GgmlBlocks, TheFixtureCoversEveryTypeDissectDecodes) {
  int decoded = 0;
  for (const GgmlTypeInfo& info : detail::ggml_type_table) {
    if (!info.decoded_by_dissect || info.type == GgmlType::f32) continue;
    ++decoded;
    EXPECT_TRUE(fixture().contains(std::string(info.name))) << info.name;
  }
  EXPECT_EQ(decoded, static_cast<int>(std::size(fixture_types)));
}

TEST(GgmlBlocks, TheFixtureHasNoTq1_0BecauseDissectDoesNotDecodeIt) {
  // If dissect learns tq1_0, make_block_fixture.cpp must write it too (ggml type 34).
  EXPECT_FALSE(ggml_type_info(GgmlType::tq1_0).decoded_by_dissect);
  EXPECT_FALSE(fixture().contains("tq1_0"));
}

TEST(GgmlBlocks, Tq2_0DotWithQ8KActivationsMatchesLlamaCppsDequantisedProduct) {
  // W: llama.cpp's tq2_0 bytes of `source` [16, 512]; x: the same 16 rows as activations. The
  // integer paths round x to q8_K themselves: those bytes must be llama.cpp's q8_K of `source`
  // (quantize_row_q8_K_ref), and y[i, n] must be Σ_k ŵ[n, k]·x̂[i, k] over llama.cpp's own
  // dequantised weights and activations (`tq2_0.dequantized`, `q8_K.dequantized`), in double,
  // within the kernel's float steps (llama.cpp's own): per block, eight int32 lanes, each scaled
  // by d_w·d_x into a float lane by a fused multiply-add, the lanes summed at the end. A lane is
  // not a sum of ŵ·x̃ alone: it holds Σ code·x̃ over its values less two of q8_K's sums of 16
  // (the +1 bias), which belong to other values. Only the total is Σ (code − 1)·x̃, so the float
  // steps round lanes as large as d_w·Σ (code + 1)·|x̂| ≤ Σ (|ŵ| + 2·d_w)·|x̂|, not Σ |ŵ·x̂|:
  // `source`'s heavy-tailed rows, whose codes are mostly 1 (ŵ = 0), show it, e.g. y[15, 13],
  // exactly 0, comes out as 2⁻⁷ (lanes of ~10⁵ that cancel). Bound: (K/256 + 9)·u times that
  // magnitude, the 9th u for x̂ itself, d·q rounded to float in `q8_K.dequantized`. It is about
  // 2e-6·d_w·Σ|x̂|: one wrong code moves y by d_w·|x̂_k|, hundreds of times more for a typical k.
  // The scalar path is dissect's oracle: Σ x·ŵ over the float activations in double, rounded
  // once.
  namespace qd = quant::detail;
  constexpr index_t rows = 16, K = 512;
  constexpr double u = 0x1.0p-24;
  const std::vector<float> source = fixture().dequantize("source");
  const std::vector<float> w_hat = fixture().dequantize("tq2_0.dequantized");
  const std::vector<float> x_hat = fixture().dequantize("q8_K.dequantized");
  const std::span<const std::byte> blocks = fixture().bytes("tq2_0");
  const qd::GgmlWeightsView w{WeightFormat::tq2_0,
                              reinterpret_cast<const std::uint8_t*>(blocks.data()), rows, K};

  std::vector<std::uint8_t> activations(
      static_cast<std::size_t>(rows * ggml_row_bytes(GgmlType::q8_K, K)));
  qd::quantize_ggml_activations(WeightFormat::tq2_0, source.data(), K, rows, K, activations.data());
  const std::span<const std::byte> q8_k = fixture().bytes("q8_K");
  ASSERT_EQ(activations.size(), q8_k.size());
  EXPECT_EQ(std::memcmp(activations.data(), q8_k.data(), q8_k.size()), 0);

  std::vector<float> oracle(static_cast<std::size_t>(rows * rows));
  qd::ggml_matmul(quant::KernelPath::scalar, w, source.data(), K, rows, oracle.data(), rows,
                  nullptr, 1);
  for (const quant::KernelPath path : {quant::KernelPath::avx2, quant::KernelPath::avx512_vnni}) {
    if (!quant::cpu_supports(path)) continue;
    SCOPED_TRACE(std::string(quant::kernel_path_name(path)));
    std::vector<float> y(static_cast<std::size_t>(rows * rows));
    qd::ggml_matmul(path, w, source.data(), K, rows, y.data(), rows, nullptr, 1);
    int checked = 0;
    for (index_t i = 0; i < rows; ++i) {
      for (index_t n = 0; n < rows; ++n) {
        double exact = 0, magnitude = 0;
        for (index_t block = 0; block < K / 256; ++block) {
          const float* wb = w_hat.data() + n * K + block * 256;
          const float* xb = x_hat.data() + i * K + block * 256;
          double d_w = 0;  // the block's scale: max|x| of its source, so max|ŵ| (some code ≠ 1)
          for (index_t k = 0; k < 256; ++k) d_w = std::max(d_w, std::fabs(double(wb[k])));
          for (index_t k = 0; k < 256; ++k) {
            exact += double(wb[k]) * xb[k];
            magnitude += (std::fabs(double(wb[k])) + 2 * d_w) * std::fabs(double(xb[k]));
          }
        }
        const double bound = (double(K / 256) + 9) * u * magnitude;
        EXPECT_LE(std::fabs(y[std::size_t(i * rows + n)] - exact), bound)
            << "y[" << i << ", " << n << "]";
        ++checked;
      }
    }
    EXPECT_EQ(checked, rows * rows);
  }
  for (index_t i = 0; i < rows; ++i) {
    for (index_t n = 0; n < rows; ++n) {
      double exact = 0;
      for (index_t k = 0; k < K; ++k) {
        exact += double(w_hat[std::size_t(n * K + k)]) * source[std::size_t(i * K + k)];
      }
      EXPECT_EQ(oracle[std::size_t(i * rows + n)], float(exact)) << "y[" << i << ", " << n << "]";
    }
  }
}

TEST(GgmlBlocks, QuantisedErrorIsWithinEachFormatsStep) {
  // An independent property: every reconstructed value lies within the format's step of the
  // original (half a step for the symmetric formats' nearest rounding, with the K-quants'
  // 6-bit scales allowing a whole one).
  const std::vector<float> source = fixture().dequantize("source");
  for (const GgmlType type : {GgmlType::q8_0, GgmlType::q4_0, GgmlType::q6_K, GgmlType::q4_K}) {
    const std::vector<std::byte> bytes = quantize_ggml(type, source);
    std::vector<float> back(source.size());
    dequantize_ggml(type, bytes, back);
    const index_t block = ggml_type_info(type).block_elements;
    const float levels = type == GgmlType::q8_0 ? 127 : type == GgmlType::q6_K ? 31 : 7.5f;
    for (std::size_t first = 0; first < source.size(); first += static_cast<std::size_t>(block)) {
      float amax = 0;
      for (index_t i = 0; i < block; ++i) amax = std::max(amax, std::fabs(source[first + i]));
      // Row 4's values (~1e-5) put q6_K's super-block scale d = max_scale/128 deep in fp16's
      // subnormals, where its rounding is no longer relative: llama.cpp loses those rows too
      // (the bytes above are its own), so the property is for scales fp16 holds as normals.
      if (amax < 1e-3f) continue;
      const float step = amax / levels;
      for (index_t i = 0; i < block; ++i) {
        // Plus the fp16 rounding of a subnormal scale (at most 2⁻²⁵) times the largest level.
        ASSERT_LE(std::fabs(back[first + i] - source[first + i]), 1.01f * step + 128 * 0x1p-25f)
            << ggml_type_name(type) << " value " << first + i;
      }
    }
  }
}

TEST(GgmlBlocks, TypeTableNamesAndSizes) {
  EXPECT_EQ(ggml_type_name(GgmlType::q4_K), "q4_K");
  EXPECT_EQ(ggml_type_from_name("Q4_K"), GgmlType::q4_K);
  EXPECT_EQ(ggml_type_from_name("bf16"), GgmlType::bf16);
  EXPECT_EQ(ggml_row_bytes(GgmlType::q6_K, 512), 420);
  EXPECT_EQ(ggml_row_bytes(GgmlType::f16, 3), 6);
  EXPECT_FALSE(ggml_type_info(4u).has_value());  // retired Q4_2
  EXPECT_FALSE(ggml_type_info(43u).has_value());
  EXPECT_EQ(ggml_type_name(static_cast<GgmlType>(31)), "type 31");
  try {
    ggml_type_from_name("q3_XL");
    FAIL() << "no throw";
  } catch (const ConfigError& error) {
    EXPECT_TRUE(contains(error.what(), "q3_XL"));
    EXPECT_TRUE(contains(error.what(), "q4_K"));
  }
  try {
    ggml_row_bytes(GgmlType::q4_K, 300, "row");
    FAIL() << "no throw";
  } catch (const ShapeError& error) {
    EXPECT_TRUE(contains(error.what(), "300"));
    EXPECT_TRUE(contains(error.what(), "256"));
  }
  EXPECT_THROW(ggml_row_bytes(GgmlType::q8_0, std::numeric_limits<index_t>::max() / 32 * 32),
               OverflowError);
}

// Issue 50: a format dtype.hpp holds too is sized once, in its table, and ggml's reads it (only
// the element types' names differ: "fp32" is ggml's "f32"). Every such pair agrees, and there are
// eleven: all of dtype.hpp's rows but fp8 and int4, which GGUF has no type for.
TEST(GgmlBlocks, AFormatTheDtypeTableHoldsHasItsBlock) {
  const std::pair<std::string_view, std::string_view> renamed[] = {
      {"fp32", "f32"}, {"fp16", "f16"}, {"int8", "i8"}, {"fp64", "f64"}};
  int shared = 0;
  for (const DtypeInfo& dtype : detail::dtype_table) {
    std::string_view ggml_name = dtype.name;
    for (const auto& [ours, theirs] : renamed) {
      if (ours == dtype.name) ggml_name = theirs;
    }
    for (const GgmlTypeInfo& type : detail::ggml_type_table) {
      if (type.name != ggml_name) continue;
      ++shared;
      EXPECT_EQ(type.block_elements, dtype.block_elements) << dtype.name;
      EXPECT_EQ(type.block_bytes, dtype.block_bytes) << dtype.name;
    }
  }
  EXPECT_EQ(shared, 11);
  EXPECT_EQ(ggml_type_info(GgmlType::q4_K).block_bytes, 144);  // GGUF's, as read from dtype.hpp
  EXPECT_EQ(ggml_type_info(GgmlType::tq2_0).block_bytes, 66);
  EXPECT_EQ(ggml_type_info(GgmlType::f32).block_bytes, 4);
}

TEST(GgmlBlocks, RefusesWhatHasNoCode) {
  std::vector<float> values(256, 1.0f);
  std::vector<std::byte> bytes(144);
  EXPECT_THROW(quantize_ggml(GgmlType::q4_K, std::span<const float>(values).first(200), bytes),
               ShapeError);
  EXPECT_THROW(quantize_ggml(GgmlType::q4_K, values, std::span<std::byte>(bytes).first(100)),
               ShapeError);
  EXPECT_THROW(
      dequantize_ggml(GgmlType::q4_K, std::span<const std::byte>(bytes).first(100), values),
      ShapeError);
  try {
    quantize_ggml(GgmlType::iq2_xs, values);
    FAIL() << "no throw";
  } catch (const ConfigError& error) {
    EXPECT_TRUE(contains(error.what(), "iq2_xs"));
  }
  values[77] = std::numeric_limits<float>::quiet_NaN();
  try {
    quantize_ggml(GgmlType::q8_0, values);
    FAIL() << "no throw";
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "value 77"));
  }
  values[77] = 1;
  values[40] = 3e7f;  // q8_0's scale 3e7 / 127 is beyond fp16's 65504
  try {
    quantize_ggml(GgmlType::q8_0, values);
    FAIL() << "no throw";
  } catch (const Error& error) {
    EXPECT_TRUE(contains(error.what(), "values 32..63"));
  }
  EXPECT_THROW(quantize_ggml(GgmlType::f16, values), Error);
  values[40] = 1;
  EXPECT_NO_THROW(quantize_ggml(GgmlType::f16, values));
}

TEST(GgmlBlocks, ZeroAndConstantBlocksDecodeExactly) {
  for (const GgmlType type : fixture_types) {
    std::vector<float> zeros(256, 0.0f), back(256, 1.0f);  // whole blocks of every type
    dequantize_ggml(type, quantize_ggml(type, zeros), back);
    for (float v : back) ASSERT_EQ(v, 0.0f) << ggml_type_name(type);
  }
}

}  // namespace test_ggml_blocks
}  // namespace dissect
