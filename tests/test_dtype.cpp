// Tests for dissect/core/dtype.hpp: the one table of element types — names, safetensors names, bits
// and block sizes, bytes_for's rounding and overflow, and out-of-range values as ConfigErrors
// naming the type and value (reliability.md row 23).
#include "dissect/core/dtype.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_dtype {

constexpr index_t kMax = std::numeric_limits<index_t>::max();

// ---- dtypes and bytes ---------------------------------------------------------------------------

TEST(Dtype, BitsAndNames) {
  EXPECT_EQ(dtype_bits(Dtype::fp32), 32);
  EXPECT_EQ(dtype_bits(Dtype::fp16), 16);
  EXPECT_EQ(dtype_bits(Dtype::bf16), 16);
  EXPECT_EQ(dtype_bits(Dtype::fp8), 8);
  EXPECT_EQ(dtype_bits(Dtype::int8), 8);
  EXPECT_EQ(dtype_bits(Dtype::int4), 4);
  EXPECT_EQ(dtype_bits(Dtype::fp64), 64);
  const std::string names[] = {"fp32", "fp16", "bf16", "fp8",  "int8", "int4", "fp64",
                               "q4_0", "q8_0", "q4_K", "q5_K", "q6_K", "tq2_0"};
  for (int i = 0; i < 13; ++i) {
    EXPECT_EQ(dtype_name(static_cast<Dtype>(i)), names[i]);
    EXPECT_EQ(dtype_from_name(names[i]), static_cast<Dtype>(i));
  }
  // Reading names back from a command line: tools/test_parse.cpp.
  static_assert(dtype_bits(Dtype::int4) == 4, "dtype_bits stays usable in constant expressions");
}

TEST(Dtype, OutOfRangeValueIsAConfigErrorNamingTheTypeAndValue) {
  // reliability.md row 23. Dtype(17) used to give dtype_bits 0 and a division by zero in
  // bytes_for; every entry now checks the value first.
  const Dtype bad = static_cast<Dtype>(17);
  EXPECT_THROW_WITH(dtype_bits(bad), ConfigError,
                    "dtype_bits: Dtype(17) is out of range (known: fp32, fp16, bf16, fp8, int8, "
                    "int4, fp64, q4_0, q8_0, q4_K, q5_K, q6_K, tq2_0)");
  EXPECT_THROW_WITH(dtype_name(bad), ConfigError, "dtype_name: Dtype(17) is out of range");
  EXPECT_THROW_WITH(check_dtype("op", static_cast<Dtype>(-1)), ConfigError,
                    "op: Dtype(-1) is out of range");
  EXPECT_THROW_WITH(bytes_for(10, bad, "weights"), ConfigError, "weights: Dtype(17)");
  EXPECT_THROW_WITH(dtype_info(static_cast<Dtype>(13)), ConfigError,
                    "dtype_info: Dtype(13) is out of range");  // one past tq2_0
}

TEST(BytesFor, Int4PacksTwoPerByteAndRoundsUp) {
  EXPECT_EQ(bytes_for(8, Dtype::int4), 4);
  EXPECT_EQ(bytes_for(7, Dtype::int4), 4);  // 3.5 bytes → 4
  EXPECT_EQ(bytes_for(1, Dtype::int4), 1);
  EXPECT_EQ(bytes_for(0, Dtype::int4), 0);
  // ⌈(2⁶³ − 1) / 2⌉ = 2⁶² without ever forming (2⁶³ − 1) · 4 bits.
  EXPECT_EQ(bytes_for(kMax, Dtype::int4), index_t{1} << 62);
}

TEST(BytesFor, OverflowAndNegativeCountsAreConfigErrors) {
  EXPECT_THROW_WITH(bytes_for(kMax / 2, Dtype::fp32, "weights"), OverflowError,
                    "weights: overflows int64");
  EXPECT_THROW_WITH(bytes_for(-1, Dtype::fp16, "weights"), ConfigError,
                    "weights: negative element count -1");
}

TEST(Dtype, BlockFormatsHaveNoWholeBitWidth) {
  // Q4_0: an fp16 scale + 32 nibbles = 2 + 16 = 18 bytes per 32 weights, 4.5 bits each.
  EXPECT_EQ(dtype_info(Dtype::q4_0).block_elements, 32);
  EXPECT_EQ(dtype_info(Dtype::q4_0).block_bytes, 18);
  EXPECT_THROW_WITH(dtype_bits(Dtype::q4_0), ConfigError,
                    "dtype_bits: q4_0 is a block format (18 bytes per 32 values)");
}

TEST(Dtype, FileNamesAreSafetensors) {
  EXPECT_EQ(dtype_info(Dtype::fp32).file_name, "F32");
  EXPECT_EQ(dtype_info(Dtype::fp64).file_name, "F64");
  EXPECT_EQ(dtype_info(Dtype::fp16).file_name, "F16");
  EXPECT_EQ(dtype_info(Dtype::bf16).file_name, "BF16");
  EXPECT_EQ(dtype_info(Dtype::int8).file_name, "I8");
  EXPECT_EQ(dtype_info(Dtype::q4_0).file_name, "");  // no safetensors dtype: stored as U8 bytes
  // And back: a file's name finds its row; a name with no row (or the empty one) finds none.
  static_assert(dtype_from_file_name("BF16") == Dtype::bf16);
  EXPECT_EQ(dtype_from_file_name("F32"), Dtype::fp32);
  EXPECT_EQ(dtype_from_file_name("F16"), Dtype::fp16);
  EXPECT_EQ(dtype_from_file_name("F64"), Dtype::fp64);
  EXPECT_EQ(dtype_from_file_name("I8"), Dtype::int8);
  EXPECT_EQ(dtype_from_file_name("F8_E4M3"), Dtype::fp8);
  EXPECT_EQ(dtype_from_file_name("U8"), std::nullopt);
  EXPECT_EQ(dtype_from_file_name("bf16"), std::nullopt);  // file names are upper case
  EXPECT_EQ(dtype_from_file_name(""), std::nullopt);      // not q4_0's missing name
}

TEST(Dtype, UnknownNameListsTheKnownOnes) {
  EXPECT_THROW_WITH(
      dtype_from_name("fp12"), ConfigError,
      "dtype \"fp12\" is not one of fp32, fp16, bf16, fp8, int8, int4, fp64, q4_0, q8_0, "
      "q4_K, q5_K, q6_K, tq2_0");
}

TEST(BytesFor, Q4_0RoundsUpToWholeBlocks) {
  EXPECT_EQ(bytes_for(32, Dtype::q4_0), 18);
  EXPECT_EQ(bytes_for(33, Dtype::q4_0), 36);  // a second, partly empty block
  EXPECT_EQ(bytes_for(0, Dtype::q4_0), 0);
  EXPECT_EQ(bytes_for(4096 * 4096, Dtype::q4_0), 4096 * 4096 / 32 * 18);
  // ⌈(2⁶³ − 1) / 32⌉ = 2⁵⁸ blocks of 18 bytes fit (2⁵⁸ · 18 < 2⁶³): blocks are counted before
  // bytes, so the product is never formed in bits. A wider type's total does overflow.
  EXPECT_EQ(bytes_for(kMax, Dtype::q4_0), (index_t{1} << 58) * 18);
  EXPECT_THROW_WITH(bytes_for(kMax / 4, Dtype::fp64, "weights"), OverflowError,
                    "weights: overflows int64");
}

}  // namespace test_dtype
}  // namespace dissect
