// Tests for tools/common/parse.hpp: the command-line values the tools read — sizes, rates,
// counts, fractions, dtypes, norms and positions — and their errors, each naming the flag
// (reliability.md row 17).
#include "tools/common/parse.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "support/tensor_testing.hpp"

namespace dissect::tools {
namespace test_parse {

TEST(ParseDtype, CanonicalNamesRoundTrip) {
  for (Dtype d : {Dtype::fp32, Dtype::fp16, Dtype::bf16, Dtype::fp8, Dtype::int8, Dtype::int4,
                  Dtype::fp64, Dtype::q4_0}) {
    EXPECT_EQ(parse_dtype(dtype_name(d), "dtype"), d);  // names round-trip
  }
}

TEST(ParseDtype, ParsesAliasesInAnyCase) {
  EXPECT_EQ(parse_dtype("FP16", "--dtype"), Dtype::fp16);
  EXPECT_EQ(parse_dtype("half", "--dtype"), Dtype::fp16);
  EXPECT_EQ(parse_dtype("float32", "--dtype"), Dtype::fp32);
  EXPECT_EQ(parse_dtype("bfloat16", "--dtype"), Dtype::bf16);
  EXPECT_EQ(parse_dtype("i4", "--dtype"), Dtype::int4);
}

TEST(ParseDtype, UnknownNameIsAConfigErrorNamingTheField) {
  EXPECT_THROW_WITH(
      parse_dtype("fp12", "--kv-dtype"), ConfigError,
      "--kv-dtype: unknown dtype \"fp12\" (known: fp32, fp16, bf16, fp8, int8, int4)");
  EXPECT_THROW_WITH(parse_dtype("", "--dtype"), ConfigError, "--dtype: unknown dtype");
}

TEST(ParseStyle, NormsAndPositions) {
  EXPECT_EQ(parse_norm("layernorm", "--norm"), Norm::layer_norm);
  EXPECT_EQ(parse_norm("RMSNorm", "--norm"), Norm::rms_norm);
  EXPECT_EQ(parse_positions("learned", "--positions"), Positions::learned);
  EXPECT_EQ(parse_positions(" Rotary ", "--positions"), Positions::rotary);
  EXPECT_THROW_WITH(parse_norm("batchnorm", "--norm"), ConfigError,
                    "--norm: unknown norm \"batchnorm\" (known: layernorm, rmsnorm)");
  EXPECT_THROW_WITH(parse_positions("alibi", "--positions"), ConfigError,
                    "--positions: unknown positions \"alibi\" (known: learned, rotary)");
}

TEST(ParseBytes, DecimalAndBinaryUnits) {
  EXPECT_EQ(parse_bytes("24GB", "m"), 24'000'000'000);
  EXPECT_EQ(parse_bytes("80GiB", "m"), 85'899'345'920);  // 80 · 2³⁰
  EXPECT_EQ(parse_bytes("24000000000", "m"), 24'000'000'000);
  EXPECT_EQ(parse_bytes("2.4e10", "m"), 24'000'000'000);
  EXPECT_EQ(parse_bytes("24G", "m"), 24'000'000'000);
  EXPECT_EQ(parse_bytes("24 gb", "m"), 24'000'000'000);
  EXPECT_EQ(parse_bytes("1.5TB", "m"), 1'500'000'000'000);
  EXPECT_EQ(parse_bytes("512KiB", "m"), 524'288);
  EXPECT_EQ(parse_bytes("16MB", "m"), 16'000'000);
  EXPECT_EQ(parse_bytes("7B", "m"), 7);
}

TEST(ParseBytes, BadSizesNameTheField) {
  EXPECT_THROW_WITH(parse_bytes("24XB", "--gpu-memory"), ConfigError,
                    "--gpu-memory: cannot read \"24XB\" as a size");
  EXPECT_THROW_WITH(parse_bytes("GB", "--gpu-memory"), ConfigError, "--gpu-memory: cannot read");
  EXPECT_THROW_WITH(parse_bytes("", "--gpu-memory"), ConfigError, "--gpu-memory: cannot read");
  EXPECT_THROW_WITH(parse_bytes("-24GB", "--gpu-memory"), ConfigError, "--gpu-memory: must be > 0");
  EXPECT_THROW_WITH(parse_bytes("0", "--gpu-memory"), ConfigError, "--gpu-memory: must be > 0");
  EXPECT_THROW_WITH(parse_bytes("10EB", "--gpu-memory"), ConfigError, "cannot read");
  EXPECT_THROW_WITH(parse_bytes("10000PB", "--gpu-memory"), ConfigError,
                    "--gpu-memory: \"10000PB\" overflows int64");
  EXPECT_THROW_WITH(parse_bytes("inf", "--gpu-memory"), ConfigError, "cannot read");
}

TEST(ParseRates, BandwidthAndFlops) {
  EXPECT_EQ(parse_bandwidth("1.5TB/s", "b"), 1.5e12);
  EXPECT_EQ(parse_bandwidth("900GB/s", "b"), 900e9);
  EXPECT_EQ(parse_bandwidth("2TiB/s", "b"), 2.0 * 1099511627776.0);
  EXPECT_EQ(parse_bandwidth("1.5e12", "b"), 1.5e12);
  EXPECT_EQ(parse_bandwidth("1.5T", "b"), 1.5e12);
  EXPECT_EQ(parse_flops("300TFLOPS", "p"), 300e12);
  EXPECT_EQ(parse_flops("312 TFLOP/s", "p"), 312e12);
  EXPECT_EQ(parse_flops("1PFLOPS", "p"), 1e15);
  EXPECT_EQ(parse_flops("3e14", "p"), 3e14);
}

TEST(ParseRates, BadRatesNameTheField) {
  EXPECT_THROW_WITH(parse_bandwidth("fast", "--bandwidth"), ConfigError,
                    "--bandwidth: cannot read \"fast\"");
  EXPECT_THROW_WITH(parse_bandwidth("1.5TB", "--bandwidth"), ConfigError,
                    "--bandwidth: cannot read");  // a size, not a rate
  EXPECT_THROW_WITH(parse_bandwidth("0TB/s", "--bandwidth"), ConfigError,
                    "--bandwidth: must be > 0");
  EXPECT_THROW_WITH(parse_flops("300TB/s", "--peak"), ConfigError, "--peak: cannot read");
  EXPECT_THROW_WITH(parse_flops("-1TFLOPS", "--peak"), ConfigError, "--peak: must be > 0");
}

TEST(ParseCount, ScientificAndSuffixedCounts) {
  EXPECT_EQ(parse_count("7e9", "n"), 7'000'000'000);
  EXPECT_EQ(parse_count("7000000000", "n"), 7'000'000'000);
  EXPECT_EQ(parse_count("6.7e9", "n"), 6'700'000'000);
  EXPECT_EQ(parse_count("7B", "n"), 7'000'000'000);
  EXPECT_EQ(parse_count("124M", "n"), 124'000'000);
  EXPECT_EQ(parse_count("32", "n"), 32);
  // Digits alone stay exact past 2⁵³, where a double would round.
  EXPECT_EQ(parse_count("9007199254740993", "n"), 9'007'199'254'740'993);
}

TEST(ParseCount, BadCountsNameTheField) {
  EXPECT_THROW_WITH(parse_count("7.5", "--layers"), ConfigError,
                    "--layers: \"7.5\" is not a whole number");
  EXPECT_THROW_WITH(parse_count("0", "--batch"), ConfigError, "--batch: must be > 0 (got 0)");
  EXPECT_THROW_WITH(parse_count("-1", "--batch"), ConfigError, "--batch: must be > 0 (got -1)");
  EXPECT_THROW_WITH(parse_count("abc", "--params"), ConfigError,
                    "--params: cannot read \"abc\" as a count");
  EXPECT_THROW_WITH(parse_count("7Q", "--params"), ConfigError, "--params: cannot read");
  EXPECT_THROW_WITH(parse_count("1e19", "--params"), ConfigError, "--params: \"1e19\" overflows");
  EXPECT_THROW_WITH(parse_count("99999999999999999999", "--params"), ConfigError,
                    "--params: \"99999999999999999999\" overflows int64");
}

// Identifiers (token ids, seeds, small counts like --top-k) are plain decimal integers: what
// parse_count reads as a size ("6e1", "1k") is refused, 0 is valid, nothing wraps.
TEST(ParseInteger, PlainDigitsOnly) {
  EXPECT_EQ(parse_integer("0", "--top-k"), 0);
  EXPECT_EQ(parse_integer("64", "--max-new-tokens"), 64);
  EXPECT_EQ(parse_integer(" 007 ", "n"), 7);
  EXPECT_EQ(parse_integer("9223372036854775807", "n"), 9'223'372'036'854'775'807);
  EXPECT_EQ(parse_integer("5", "n", 1), 5);
  for (const char* bad : {"6e1", "1k", "-1", "+5", "5.0", "", " ", "0x10", "5 5", "inf"}) {
    EXPECT_THROW_WITH(parse_integer(bad, "--top-k"), ConfigError,
                      concat("--top-k: \"", bad, "\" is not a plain decimal integer"));
  }
  EXPECT_THROW_WITH(parse_integer("9223372036854775808", "--top-k"), ConfigError,
                    "--top-k: \"9223372036854775808\" overflows int64");
  EXPECT_THROW_WITH(parse_integer("0", "--context", 1), ConfigError,
                    "--context: must be >= 1 (got 0)");
}

TEST(ParseUint64, TheWholeRangeOfASeed) {
  EXPECT_EQ(parse_uint64("0", "--seed"), 0u);
  EXPECT_EQ(parse_uint64("18446744073709551615", "--seed"), 18'446'744'073'709'551'615u);
  EXPECT_THROW_WITH(parse_uint64("18446744073709551616", "--seed"), ConfigError,
                    "--seed: \"18446744073709551616\" is beyond 18446744073709551615");
  for (const char* bad : {"-1", "+1", "1e3", "1k", "", "1.0", "-0"}) {
    EXPECT_THROW_WITH(parse_uint64(bad, "--seed"), ConfigError,
                      concat("--seed: \"", bad,
                             "\" is not a plain decimal integer in [0, 18446744073709551615]"));
  }
}

TEST(ParseTokenIds, ZeroIsAnIdAndEveryBadItemIsNamed) {
  EXPECT_EQ(parse_token_ids("0", "--tokens"), std::vector<index_t>{0});
  EXPECT_EQ(parse_token_ids("464,2068,0", "--tokens"), (std::vector<index_t>{464, 2068, 0}));
  EXPECT_EQ(parse_token_ids(" 5, 17 ,3", "--tokens"), (std::vector<index_t>{5, 17, 3}));
  EXPECT_EQ(parse_token_ids("96", "--tokens", 97), std::vector<index_t>{96});
  EXPECT_THROW_WITH(parse_token_ids("5,6e1", "--tokens"), ConfigError,
                    "--tokens: item 2 \"6e1\" is not a token id (a plain decimal integer >= 0)");
  EXPECT_THROW_WITH(parse_token_ids("1k", "--tokens"), ConfigError,
                    "--tokens: item 1 \"1k\" is not a token id");
  EXPECT_THROW_WITH(parse_token_ids("1,2,-3", "--tokens"), ConfigError,
                    "--tokens: item 3 \"-3\" is not a token id");
  EXPECT_THROW_WITH(parse_token_ids("+3", "--tokens"), ConfigError,
                    "--tokens: item 1 \"+3\" is not a token id");
  EXPECT_THROW_WITH(parse_token_ids("", "--tokens"), ConfigError, "--tokens: item 1 is empty");
  EXPECT_THROW_WITH(parse_token_ids("5,,3", "--tokens"), ConfigError, "--tokens: item 2 is empty");
  EXPECT_THROW_WITH(parse_token_ids("5,", "--tokens"), ConfigError, "--tokens: item 2 is empty");
  EXPECT_THROW_WITH(parse_token_ids("1,99999999999999999999", "--tokens"), ConfigError,
                    "--tokens: item 2 \"99999999999999999999\" overflows int64");
  EXPECT_THROW_WITH(parse_token_ids("1,97", "--tokens", 97), ConfigError,
                    "--tokens: item 2 \"97\" is outside the model's vocabulary [0, 97)");
}

TEST(ParseNonNegativeReal, FiniteAndNotNegative) {
  EXPECT_EQ(parse_non_negative_real("0", "--temperature"), 0.0);
  EXPECT_EQ(parse_non_negative_real("0.8", "--temperature"), 0.8);
  EXPECT_EQ(parse_non_negative_real("1e-3", "--temperature"), 1e-3);
  EXPECT_FALSE(std::signbit(parse_non_negative_real("-0", "--temperature")));
  EXPECT_THROW_WITH(parse_non_negative_real("-1", "--temperature"), ConfigError,
                    "--temperature: must be finite and >= 0 (got \"-1\")");
  for (const char* bad : {"nan", "inf", "1e400", "0.8x", "", "hot"}) {
    EXPECT_THROW_WITH(parse_non_negative_real(bad, "--temperature"), ConfigError,
                      concat("--temperature: cannot read \"", bad, "\" as a finite number"));
  }
}

TEST(ParseReal, FiniteOfEitherSign) {
  EXPECT_EQ(parse_real("-0.5", "--frequency-penalty"), -0.5);
  EXPECT_EQ(parse_real(" 2 ", "--frequency-penalty"), 2.0);
  EXPECT_EQ(parse_real("1e-3", "--presence-penalty"), 1e-3);
  EXPECT_FALSE(std::signbit(parse_real("-0", "--presence-penalty")));
  for (const char* bad : {"nan", "-inf", "1e400", "0.5x", "", "some"}) {
    EXPECT_THROW_WITH(parse_real(bad, "--presence-penalty"), ConfigError,
                      concat("--presence-penalty: cannot read \"", bad, "\" as a finite number"));
  }
}

TEST(ParseFraction, PlainOrPercent) {
  EXPECT_EQ(parse_fraction("0.2", "r"), 0.2);
  EXPECT_EQ(parse_fraction("20%", "r"), 0.2);
  EXPECT_EQ(parse_fraction("0", "r"), 0.0);
  EXPECT_THROW_WITH(parse_fraction("1", "--reserve"), ConfigError, "--reserve: must be in [0, 1)");
  EXPECT_THROW_WITH(parse_fraction("100%", "--reserve"), ConfigError, "--reserve: must be in");
  EXPECT_THROW_WITH(parse_fraction("-0.1", "--reserve"), ConfigError, "--reserve: must be in");
  EXPECT_THROW_WITH(parse_fraction("some", "--reserve"), ConfigError, "--reserve: cannot read");
}

}  // namespace test_parse
}  // namespace dissect::tools
