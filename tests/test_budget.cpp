// Tests for dissect/budget.hpp: every number of lesson 0.1 §5.3 (the 24 GB card), its failure
// modes, GQA's smaller KV cache, the value parsers the `budget` tool relies on, and bad inputs
// (reliability.md rows 16 and 17) as ConfigErrors naming the field.
#include "dissect/budget.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "support/tensor_testing.hpp"

namespace dissect {
namespace {

constexpr index_t kMax = std::numeric_limits<index_t>::max();

// The lesson's machine: a 7e9-parameter model with D = 4096, L = 32, H = 32, d_k = 128, fp16,
// T = 2048, on a 24 GB card with 1.5 TB/s and 300 TFLOP/s.
ModelSize lesson_model() {
  return {7'000'000'000, 32, 32, 32, 128};
}

BudgetInputs lesson_inputs() {
  BudgetInputs inputs;
  inputs.weight_dtype = Dtype::fp16;
  inputs.kv_dtype = Dtype::fp16;
  inputs.context = 2048;
  inputs.memory_bytes = 24'000'000'000;
  inputs.bandwidth = 1.5e12;
  inputs.peak_flops = 300e12;
  return inputs;
}

// ---- dtypes and bytes ---------------------------------------------------------------------------

TEST(Dtype, BitsAndNames) {
  EXPECT_EQ(dtype_bits(Dtype::fp32), 32);
  EXPECT_EQ(dtype_bits(Dtype::fp16), 16);
  EXPECT_EQ(dtype_bits(Dtype::bf16), 16);
  EXPECT_EQ(dtype_bits(Dtype::fp8), 8);
  EXPECT_EQ(dtype_bits(Dtype::int8), 8);
  EXPECT_EQ(dtype_bits(Dtype::int4), 4);
  for (Dtype d : {Dtype::fp32, Dtype::fp16, Dtype::bf16, Dtype::fp8, Dtype::int8, Dtype::int4}) {
    EXPECT_EQ(parse_dtype(dtype_name(d), "dtype"), d);  // names round-trip
  }
}

TEST(Dtype, ParsesAliasesInAnyCase) {
  EXPECT_EQ(parse_dtype("FP16", "--dtype"), Dtype::fp16);
  EXPECT_EQ(parse_dtype("half", "--dtype"), Dtype::fp16);
  EXPECT_EQ(parse_dtype("float32", "--dtype"), Dtype::fp32);
  EXPECT_EQ(parse_dtype("bfloat16", "--dtype"), Dtype::bf16);
  EXPECT_EQ(parse_dtype("i4", "--dtype"), Dtype::int4);
}

TEST(Dtype, UnknownNameIsAConfigErrorNamingTheField) {
  EXPECT_THROW_WITH(
      parse_dtype("fp12", "--kv-dtype"), ConfigError,
      "--kv-dtype: unknown dtype \"fp12\" (known: fp32, fp16, bf16, fp8, int8, int4)");
  EXPECT_THROW_WITH(parse_dtype("", "--dtype"), ConfigError, "--dtype: unknown dtype");
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

// ---- the lesson: weights and KV cache -----------------------------------------------------------

TEST(Lesson, WeightsOf7e9ParametersInFp16Are14GB) {
  EXPECT_EQ(weight_bytes(7'000'000'000, Dtype::fp16), 14'000'000'000);  // 7e9 · 2 B
  EXPECT_EQ(weight_bytes(7'000'000'000, Dtype::bf16), 14'000'000'000);
  EXPECT_EQ(weight_bytes(7'000'000'000, Dtype::fp32), 28'000'000'000);
  EXPECT_EQ(weight_bytes(7'000'000'000, Dtype::int4), 3'500'000'000);  // half a byte each
  EXPECT_EQ(format_decimal_bytes(14'000'000'000), "14.0 GB");
}

TEST(Lesson, FailureModeInt8WeightsAre7GB) {
  // "dtype 混用": int8 is 1 B per parameter — half the fp16 bill.
  EXPECT_EQ(weight_bytes(7'000'000'000, Dtype::int8), 7'000'000'000);
  EXPECT_EQ(weight_bytes(7'000'000'000, Dtype::fp8), 7'000'000'000);
}

TEST(Lesson, KvCacheOfOneSequenceIs1_07GB) {
  // 2 · 32 · 2048 · 32 · 128 · 2 B = 1,073,741,824 B = 2³⁰ B: 1.07 GB, exactly 1 GiB.
  EXPECT_EQ(kv_cache_bytes(32, 2048, 32, 128, Dtype::fp16), 1'073'741'824);
  EXPECT_EQ(format_decimal_bytes(1'073'741'824), "1.07 GB");
  EXPECT_EQ(format_binary_bytes(1'073'741'824), "1.00 GiB");
  // Per token: 2 · 32 · 32 · 128 · 2 B = 524,288 B.
  EXPECT_EQ(kv_cache_bytes(32, 1, 32, 128, Dtype::fp16), 524'288);
}

TEST(Lesson, FailureModeForgettingTheFactorTwoGives0_54GB) {
  // K and V each: half of the correct 1,073,741,824 is 536,870,912 B = 0.54 GB.
  const index_t correct = kv_cache_bytes(32, 2048, 32, 128, Dtype::fp16);
  const index_t forgot_v = correct / 2;
  EXPECT_EQ(forgot_v, 536'870'912);
  EXPECT_EQ(format_decimal_bytes(forgot_v), "537 MB");
  // The lesson's "16 slots": ⌊8,926,258,176 / 536,870,912⌋ = ⌊16.6⌋ — twice as many as fit.
  EXPECT_EQ((24'000'000'000 - 14'000'000'000 - correct) / forgot_v, 16);
}

TEST(Lesson, FailureModeT8192Gives4_3GBAndTwoSequences) {
  // 2 · 32 · 8192 · 32 · 128 · 2 B = 4,294,967,296 B = 4.3 GB
  EXPECT_EQ(kv_cache_bytes(32, 8192, 32, 128, Dtype::fp16), 4'294'967'296);
  EXPECT_EQ(format_decimal_bytes(4'294'967'296), "4.29 GB");
  BudgetInputs inputs = lesson_inputs();
  inputs.context = 8192;
  const Budget b = compute_budget(lesson_model(), inputs);
  ASSERT_TRUE(b.memory);
  // ⌊10,000,000,000 / 4,294,967,296⌋ = ⌊2.33⌋ = 2, the lesson's "2".
  EXPECT_EQ(b.memory->max_sequences, 2);
  EXPECT_NEAR(b.memory->sequences, 2.328, 1e-3);
}

TEST(Lesson, KvCacheAt4096TokensIsInt32MaxPlusOne) {
  // reliability.md: 2 · 32 · 4096 · 32 · 128 · 2 B = 2³¹ = INT32_MAX + 1, so 32-bit would wrap.
  EXPECT_EQ(kv_cache_bytes(32, 4096, 32, 128, Dtype::fp16),
            index_t{std::numeric_limits<std::int32_t>::max()} + 1);
}

// ---- the lesson: the 24 GB card -----------------------------------------------------------------

TEST(Lesson, TheCardHoldsNineSequencesAndTheLessonsEightCountsTheFirstTwice) {
  const Budget b = compute_budget(lesson_model(), lesson_inputs());
  EXPECT_EQ(b.weights_bytes, 14'000'000'000);
  EXPECT_EQ(b.kv_bytes_per_token, 524'288);
  EXPECT_EQ(b.kv_bytes_per_sequence, 1'073'741'824);
  ASSERT_TRUE(b.memory);
  const MemoryFit& m = *b.memory;
  EXPECT_EQ(m.reserve_bytes, 0);
  // "single request 14 + 1.07 ≈ 15.1 GB": 14,000,000,000 + 1,073,741,824 = 15,073,741,824
  EXPECT_EQ(b.weights_bytes + b.kv_bytes_per_sequence, 15'073'741'824);
  EXPECT_EQ(format_decimal_bytes(b.weights_bytes + b.kv_bytes_per_sequence), "15.1 GB");
  // Left after the weights: 24e9 − 14e9 = 10,000,000,000 = 10.0 GB.
  EXPECT_EQ(m.free_bytes, 10'000'000'000);
  EXPECT_EQ(format_decimal_bytes(m.free_bytes), "10.0 GB");
  // "the 24 GB card has 8.9 GB left": 10,000,000,000 − 1,073,741,824 = 8,926,258,176.
  EXPECT_EQ(m.free_after_first_bytes, 8'926'258'176);
  EXPECT_EQ(format_decimal_bytes(m.free_after_first_bytes), "8.93 GB");
  // The card holds ⌊10,000,000,000 / 1,073,741,824⌋ = ⌊9.31⌋ = 9 sequences.
  EXPECT_EQ(m.max_sequences, 9);
  EXPECT_NEAR(m.sequences, 9.3132, 1e-4);
  // The lesson's ⌊8.9 / 1.07⌋ = 8 divides what is left *after* the first sequence, then forgets
  // to add that first one back: 8 + 1 = 9.
  EXPECT_EQ(m.free_after_first_bytes / b.kv_bytes_per_sequence, 8);
  EXPECT_EQ(m.free_after_first_bytes / b.kv_bytes_per_sequence + 1, m.max_sequences);
}

TEST(Lesson, DecodeReadsTheWeightsEveryStep) {
  BudgetInputs inputs = lesson_inputs();
  inputs.batch = 8;
  const Budget b = compute_budget(lesson_model(), inputs);
  ASSERT_TRUE(b.decode);
  // 14e9 B / 1.5e12 B/s = 9.333 ms ("9.3 ms")
  EXPECT_NEAR(b.decode->ms_per_step, 9.3333, 1e-4);
  // shared by a batch of 8: 1.1667 ms per token ("1.2 ms/token")
  EXPECT_EQ(b.decode->batch, 8);
  EXPECT_NEAR(b.decode->ms_per_token, 1.1667, 1e-4);
  // Reading the 8 full KV caches too: (14e9 + 8 · 1,073,741,824) / 1.5e12 = 15.060 ms.
  EXPECT_NEAR(b.decode->ms_per_step_with_kv, 15.0600, 1e-4);
}

TEST(Lesson, DecodeBatchDefaultsToEverySequenceThatFits) {
  const Budget b = compute_budget(lesson_model(), lesson_inputs());
  ASSERT_TRUE(b.decode);
  EXPECT_EQ(b.decode->batch, 9);
  EXPECT_NEAR(b.decode->ms_per_token, 9.3333 / 9, 1e-4);  // 1.037 ms
}

TEST(Lesson, PrefillOf2048TokensTakes96ms) {
  const Budget b = compute_budget(lesson_model(), lesson_inputs());
  // 2 · 7e9 · 2048 = 28,672,000,000,000 ≈ 2.9e13 FLOP
  EXPECT_EQ(b.prefill_flops, 28'672'000'000'000);
  // attention, reported apart: 4 · 32 · 2048² · 32 · 128 = 2,199,023,255,552 ≈ 2.2e12
  EXPECT_EQ(b.prefill_attention_flops, 2'199'023'255'552);
  ASSERT_TRUE(b.prefill);
  // 2.8672e13 / 3e14 = 95.57 ms ("about 96 ms"); with attention 3.0871e13 / 3e14 = 102.90 ms.
  EXPECT_NEAR(b.prefill->ms, 95.5733, 1e-4);
  EXPECT_NEAR(b.prefill->ms_with_attention, 102.9034, 1e-4);
}

TEST(Lesson, AdamTrainingNeeds16BytesPerParameter) {
  const Budget b = compute_budget(lesson_model(), lesson_inputs());
  // fp16 weights 14e9 + fp16 grads 14e9 + fp32 master 28e9 + two fp32 moments 56e9 = 112e9
  EXPECT_EQ(b.training.weights, 14'000'000'000);
  EXPECT_EQ(b.training.gradients, 14'000'000'000);
  EXPECT_EQ(b.training.master_weights, 28'000'000'000);
  EXPECT_EQ(b.training.adam_moments, 56'000'000'000);
  EXPECT_EQ(b.training.total, 112'000'000'000);
  BudgetInputs fp32 = lesson_inputs();
  fp32.weight_dtype = Dtype::fp32;
  // fp32 weights are their own master copy: 4 + 4 + 0 + 8 = 16 B as well.
  EXPECT_EQ(compute_budget(lesson_model(), fp32).training.master_weights, 0);
  EXPECT_EQ(compute_budget(lesson_model(), fp32).training.total, 112'000'000'000);
}

// ---- beyond the lesson --------------------------------------------------------------------------

TEST(Budget, GroupedQueryAttentionShrinksTheKvCache) {
  // Llama-2-70B: 2 · 80 layers · 8 KV heads · 128 · 2 B = 327,680 B per token (not the 2,621,440
  // B its 64 query heads would need).
  const ModelSize m = model_size(find_preset("llama-2-70b").config);
  EXPECT_EQ(m.parameters, 68'976'648'192);
  EXPECT_EQ(m.n_kv_heads, 8);
  BudgetInputs inputs;
  inputs.context = 4096;
  const Budget b = compute_budget(m, inputs);
  EXPECT_EQ(b.kv_bytes_per_token, 327'680);
  EXPECT_EQ(b.kv_bytes_per_sequence, 327'680 * 4096);
  EXPECT_EQ(b.weights_bytes, 137'953'296'384);  // 2 · 68,976,648,192
}

TEST(Budget, FromAConfigUsesTheExactCount) {
  BudgetInputs inputs = lesson_inputs();
  const Budget b = compute_budget(find_preset("llama-7b").config, inputs);
  EXPECT_EQ(b.model.parameters, 6'738'415'616);
  EXPECT_EQ(b.weights_bytes, 13'476'831'232);  // 2 · 6,738,415,616
  EXPECT_EQ(b.kv_bytes_per_sequence, 1'073'741'824);
  ASSERT_TRUE(b.memory);
  EXPECT_EQ(b.memory->free_bytes, 10'523'168'768);  // 24e9 − 13,476,831,232
  EXPECT_EQ(b.memory->max_sequences, 9);            // ⌊9.80⌋
}

TEST(Budget, ReserveIsHeldBack) {
  BudgetInputs inputs = lesson_inputs();
  inputs.reserve = 0.2;  // the lesson's "keep 20% spare"
  const Budget b = compute_budget(lesson_model(), inputs);
  ASSERT_TRUE(b.memory);
  EXPECT_EQ(b.memory->reserve_bytes, 4'800'000'000);  // 0.2 · 24e9
  EXPECT_EQ(b.memory->free_bytes, 5'200'000'000);     // 24e9 − 4.8e9 − 14e9
  EXPECT_EQ(b.memory->max_sequences, 4);              // ⌊5.2e9 / 1,073,741,824⌋ = ⌊4.84⌋
}

TEST(Budget, WeightsThatDoNotFitLeaveNoSlots) {
  BudgetInputs inputs = lesson_inputs();
  inputs.memory_bytes = 12'000'000'000;  // a 12 GB card for 14 GB of weights
  const Budget b = compute_budget(lesson_model(), inputs);
  ASSERT_TRUE(b.memory);
  EXPECT_EQ(b.memory->free_bytes, -2'000'000'000);
  EXPECT_EQ(b.memory->max_sequences, 0);
  EXPECT_EQ(b.memory->sequences, 0.0);
  ASSERT_TRUE(b.decode);
  EXPECT_EQ(b.decode->batch, 1);  // nothing fits, but the per-token time stays defined
}

TEST(Budget, MissingDeviceFieldsLeaveTheirPartsUnset) {
  BudgetInputs inputs;
  inputs.context = 2048;
  const Budget b = compute_budget(lesson_model(), inputs);
  EXPECT_EQ(b.kv_bytes_per_sequence, 1'073'741'824);
  EXPECT_FALSE(b.memory);
  EXPECT_FALSE(b.decode);
  EXPECT_FALSE(b.prefill);
}

TEST(Budget, Int4KvCacheStaysExact) {
  BudgetInputs inputs = lesson_inputs();
  inputs.kv_dtype = Dtype::int4;
  inputs.weight_dtype = Dtype::int4;
  const Budget b = compute_budget(ModelSize{7'000'000'001, 32, 32, 32, 128}, inputs);
  EXPECT_EQ(b.weights_bytes, 3'500'000'001);        // ⌈7,000,000,001 / 2⌉
  EXPECT_EQ(b.kv_bytes_per_sequence, 268'435'456);  // 2 · 32 · 2048 · 32 · 128 / 2
}

// ---- bad input (reliability.md row 17) and overflow (row 16) ------------------------------------

TEST(Budget, BadInputsAreConfigErrorsNamingTheField) {
  const auto expect_rejected = [](void (*change)(BudgetInputs&), const char* message) {
    BudgetInputs inputs = lesson_inputs();
    change(inputs);
    EXPECT_THROW_WITH(compute_budget(lesson_model(), inputs), ConfigError, message);
  };
  expect_rejected([](BudgetInputs& i) { i.batch = -1; }, "budget: batch must be >= 1 (got -1)");
  expect_rejected([](BudgetInputs& i) { i.batch = 0; }, "budget: batch must be >= 1");
  expect_rejected([](BudgetInputs& i) { i.context = -2048; }, "budget: context must be > 0");
  expect_rejected([](BudgetInputs& i) { i.context = 0; }, "budget: context must be > 0");
  expect_rejected([](BudgetInputs& i) { i.memory_bytes = 0; }, "budget: memory_bytes must be > 0");
  expect_rejected([](BudgetInputs& i) { i.memory_bytes = -1; }, "budget: memory_bytes must be > 0");
  expect_rejected([](BudgetInputs& i) { i.bandwidth = 0.0; }, "budget: bandwidth must be > 0");
  expect_rejected([](BudgetInputs& i) { i.bandwidth = -1.5e12; }, "budget: bandwidth must be > 0");
  expect_rejected([](BudgetInputs& i) { i.bandwidth = std::nan(""); },
                  "budget: bandwidth must be > 0");
  expect_rejected([](BudgetInputs& i) { i.peak_flops = 0.0; }, "budget: peak_flops must be > 0");
  expect_rejected([](BudgetInputs& i) { i.peak_flops = HUGE_VAL; },
                  "budget: peak_flops must be > 0 and finite");
  expect_rejected([](BudgetInputs& i) { i.reserve = 1.0; }, "budget: reserve must be in [0, 1)");
  expect_rejected([](BudgetInputs& i) { i.reserve = -0.1; }, "budget: reserve must be in [0, 1)");
  expect_rejected([](BudgetInputs& i) { i.reserve = std::nan(""); },
                  "budget: reserve must be in [0, 1)");
}

TEST(Budget, BadModelSizesAreConfigErrorsNamingTheField) {
  ModelSize m = lesson_model();
  m.parameters = 0;
  EXPECT_THROW_WITH(compute_budget(m, lesson_inputs()), ConfigError,
                    "ModelSize: parameters must be > 0");
  m = lesson_model();
  m.n_kv_heads = 5;
  EXPECT_THROW_WITH(compute_budget(m, lesson_inputs()), ConfigError,
                    "ModelSize: n_kv_heads 5 does not divide n_heads 32");
  m = lesson_model();
  m.head_dim = -128;
  EXPECT_THROW_WITH(compute_budget(m, lesson_inputs()), ConfigError,
                    "ModelSize: head_dim must be > 0");
}

TEST(Budget, TotalsThatOverflowAreConfigErrors) {
  // Weights: (2⁶² + 1) parameters · 2 B > 2⁶³.
  EXPECT_THROW_WITH(
      compute_budget(ModelSize{(index_t{1} << 62) + 1, 32, 32, 32, 128}, lesson_inputs()),
      OverflowError, "weight_bytes: overflows int64");
  // KV: 2 · 2²⁰ layers · 2³⁰ tokens · 32 · 128 · 2 B = 2⁶⁵.
  EXPECT_THROW_WITH(kv_cache_bytes(index_t{1} << 20, index_t{1} << 30, 32, 128, Dtype::fp16),
                    OverflowError, "kv_cache_bytes: overflows int64");
  // Attention FLOPs: 4 · 32 · T² · 32 · 128 with T = 2²⁶ is 2¹⁹ · 2⁵² = 2⁷¹.
  BudgetInputs long_context = lesson_inputs();
  long_context.context = index_t{1} << 26;
  EXPECT_THROW_WITH(compute_budget(lesson_model(), long_context), OverflowError,
                    "prefill_attention_flops: overflows int64");
  // A KV cache of nearly 2⁶³ bytes on a 1-byte card: free − KV would pass −2⁶³ and must not
  // wrap. 4 parameters → 8 B of weights, free = 1 − 8 = −7; KV = 2 · (2⁶¹ − 1) · 2 B = 2⁶³ − 4.
  BudgetInputs tiny = lesson_inputs();
  tiny.memory_bytes = 1;
  tiny.context = 1;
  EXPECT_THROW_WITH(compute_budget(ModelSize{4, 1, 1, 1, (index_t{1} << 61) - 1}, tiny),
                    OverflowError, "free_after_first: overflows int64");
}

// ---- parsing ------------------------------------------------------------------------------------

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

TEST(ParseFraction, PlainOrPercent) {
  EXPECT_EQ(parse_fraction("0.2", "r"), 0.2);
  EXPECT_EQ(parse_fraction("20%", "r"), 0.2);
  EXPECT_EQ(parse_fraction("0", "r"), 0.0);
  EXPECT_THROW_WITH(parse_fraction("1", "--reserve"), ConfigError, "--reserve: must be in [0, 1)");
  EXPECT_THROW_WITH(parse_fraction("100%", "--reserve"), ConfigError, "--reserve: must be in");
  EXPECT_THROW_WITH(parse_fraction("-0.1", "--reserve"), ConfigError, "--reserve: must be in");
  EXPECT_THROW_WITH(parse_fraction("some", "--reserve"), ConfigError, "--reserve: cannot read");
}

// ---- printing -----------------------------------------------------------------------------------

TEST(Format, CountsGroupThousands) {
  EXPECT_EQ(format_count(1'073'741'824), "1,073,741,824");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(1000), "1,000");
  EXPECT_EQ(format_count(0), "0");
  EXPECT_EQ(format_count(-1'234), "-1,234");
  EXPECT_EQ(format_count(kMax), "9,223,372,036,854,775,807");
}

TEST(Format, BytesInDecimalAndBinaryUnits) {
  EXPECT_EQ(format_decimal_bytes(0), "0 B");
  EXPECT_EQ(format_decimal_bytes(512), "512 B");
  EXPECT_EQ(format_decimal_bytes(524'288), "524 kB");
  EXPECT_EQ(format_binary_bytes(524'288), "512 KiB");
  EXPECT_EQ(format_decimal_bytes(999'999), "1.00 MB");    // not "1000 kB"
  EXPECT_EQ(format_binary_bytes(1'048'575), "1.00 MiB");  // not "1024 KiB"
  EXPECT_EQ(format_decimal_bytes(-2'000'000'000), "-2.00 GB");
  EXPECT_EQ(format_binary_bytes(14'000'000'000), "13.0 GiB");  // 14e9 / 2³⁰ = 13.04
  EXPECT_EQ(format_decimal_bytes(112'000'000'000), "112 GB");
}

}  // namespace
}  // namespace dissect
