// Tests for dissect/accounting/budget.hpp: every number of lesson 0.1 §5.3 (the 24 GB card), its
// failure modes, GQA's smaller KV cache, prefill FLOPs from a count and from a config, and bad
// inputs (reliability.md rows 16, 17 and 23) as ConfigErrors naming the field. The value parsers
// the `budget` tool relies on are tested in tools/test_parse.cpp.
#include "dissect/accounting/budget.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_budget {

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

// ---- dtypes reaching the budget --------------------------------------------------------------
// The dtype vocabulary itself (names, sizes, out-of-range values) is tested in test_dtype.cpp.

TEST(BudgetDtype, OutOfRangeValueIsAConfigErrorNamingTheField) {
  // reliability.md row 23, at the budget's entries.
  const Dtype bad = static_cast<Dtype>(17);
  EXPECT_THROW_WITH(weight_bytes(10, bad), ConfigError, "Dtype(17) is out of range");
  EXPECT_THROW_WITH(kv_cache_bytes(32, 2048, 32, 128, bad), ConfigError, "Dtype(17)");
  BudgetInputs inputs = lesson_inputs();
  inputs.weight_dtype = bad;
  EXPECT_THROW_WITH(compute_budget(lesson_model(), inputs), ConfigError,
                    "budget: weight_dtype: Dtype(17) is out of range");
  inputs = lesson_inputs();
  inputs.kv_dtype = static_cast<Dtype>(13);  // one past tq2_0
  EXPECT_THROW_WITH(compute_budget(find_preset("gpt2-small").config, inputs), ConfigError,
                    "budget: kv_dtype: Dtype(13) is out of range");
}

TEST(BudgetDtype, Q4_0WeightsAre18BytesPer32) {
  // 7e9 / 32 = 218,750,000 blocks of 18 bytes: 3.9375e9 B, 4.5 bits per weight.
  EXPECT_EQ(weight_bytes(7'000'000'000, Dtype::q4_0), 3'937'500'000);
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

TEST(Lesson, ASlidingWindowCapsTheKvCacheAtWPositions) {
  // Mistral-7B's shape (L 32, H_kv 8, d_k 128, W 4096) at T = 32768 in fp16: a rolling cache
  // holds 4096 positions, 2 · 32 · 4096 · 8 · 128 · 2 B = 536,870,912 B, not T's 4,294,967,296.
  TransformerConfig config = find_preset("llama-7b").config;
  config.n_kv_heads = 8;
  config.context = 32768;
  BudgetInputs inputs{.weight_dtype = Dtype::fp16, .kv_dtype = Dtype::fp16, .context = 32768};
  const Budget full = compute_budget(config, inputs);
  EXPECT_EQ(full.kv_bytes_per_sequence, 4'294'967'296);
  config.sliding_window = 4096;
  const Budget windowed = compute_budget(config, inputs);
  EXPECT_EQ(windowed.kv_bytes_per_sequence, 536'870'912);
  EXPECT_EQ(windowed.kv_bytes_per_token, full.kv_bytes_per_token);
  EXPECT_EQ(windowed.weights_bytes, full.weights_bytes);  // the window changes no count
  // A context shorter than the window: every position is held.
  inputs.context = 1024;
  EXPECT_EQ(compute_budget(config, inputs).kv_bytes_per_sequence, 2 * 32 * 1024 * 8 * 128 * 2);
  ModelSize bad = model_size(config);
  bad.sliding_window = -1;
  EXPECT_THROW_WITH(bad.validate(), ConfigError, "ModelSize: sliding_window must be >= 0");
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
  // A bare parameter count: W = parameters, so the linear products are the lesson's
  // 2 · 7e9 · 2048 = 28,672,000,000,000 ≈ 2.9e13 FLOP.
  EXPECT_EQ(b.prefill_linear_flops, 28'672'000'000'000);
  EXPECT_EQ(b.linear_weights, 7'000'000'000);
  EXPECT_FALSE(b.linear_weights_exact);
  // attention, reported apart: 4 · 32 · 2048² · 32 · 128 = 2,199,023,255,552 ≈ 2.2e12
  EXPECT_EQ(b.prefill_attention_flops, 2'199'023'255'552);
  // The prefill FLOPs are the sum: 28,672,000,000,000 + 2,199,023,255,552.
  EXPECT_EQ(b.prefill_flops, 30'871'023'255'552);
  ASSERT_TRUE(b.prefill);
  // 2.8672e13 / 3e14 = 95.57 ms ("about 96 ms"); with attention 3.0871e13 / 3e14 = 102.90 ms.
  EXPECT_NEAR(b.prefill->ms_linear, 95.5733, 1e-4);
  EXPECT_NEAR(b.prefill->ms, 102.9034, 1e-4);
}

TEST(Budget, PrefillFromAConfigCountsTheMatrixWeightsExactly) {
  // LLaMA-7B at T = 2048: W = 6,607,077,376 matrix weights (its 6,738,415,616 parameters less
  // the 131,072,000 token embedding and 266,240 norm weights), so the linear products are
  // 2 · 6,607,077,376 · 2048 = 27,062,588,932,096, not 2 · parameters · T.
  const Budget b = compute_budget(find_preset("llama-7b").config, lesson_inputs());
  EXPECT_TRUE(b.linear_weights_exact);
  EXPECT_EQ(b.linear_weights, 6'607'077'376);
  EXPECT_EQ(b.prefill_linear_flops, 27'062'588'932'096);
  EXPECT_EQ(b.prefill_attention_flops, 2'199'023'255'552);
  EXPECT_EQ(b.prefill_flops, 29'261'612'187'648);
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
  expect_rejected([](BudgetInputs& i) { i.batch = -1; }, "budget: batch must be > 0 (got -1)");
  expect_rejected([](BudgetInputs& i) { i.batch = 0; }, "budget: batch must be > 0");
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
  // Attention FLOPs: one product, 2 · 32 · T² · 128 with T = 2²⁶, is 2¹³ · 2⁵² = 2⁶⁵.
  BudgetInputs long_context = lesson_inputs();
  long_context.context = index_t{1} << 26;
  EXPECT_THROW_WITH(compute_budget(lesson_model(), long_context), OverflowError,
                    "attention_product_flops: overflows int64");
  // A KV cache of nearly 2⁶³ bytes on a 1-byte card: free − KV would pass −2⁶³ and must not
  // wrap. 4 parameters → 8 B of weights, free = 1 − 8 = −7; KV = 2 · (2⁶¹ − 1) · 2 B = 2⁶³ − 4.
  // Weights + KV = 2⁶³ + 4 leaves int64 first (and, once it fits, free − KV cannot overflow).
  BudgetInputs tiny = lesson_inputs();
  tiny.memory_bytes = 1;
  tiny.context = 1;
  EXPECT_THROW_WITH(compute_budget(ModelSize{4, 1, 1, 1, (index_t{1} << 61) - 1}, tiny),
                    OverflowError, "budget: weights + one sequence's KV cache: overflows int64");
}

TEST(Budget, ABatchWhoseKvCachesLeaveInt64IsAnErrorNamingTheBatch) {
  // Row 135: at batch 10¹⁸ the lesson's 1,073,741,824-byte caches make 1.07·10²⁷ bytes a step
  // reads; that was turned into a time (1.07·10¹⁸ ms) from bytes no device holds. The bytes are
  // exact now, and beyond int64 an OverflowError names the batch.
  BudgetInputs inputs = lesson_inputs();
  inputs.batch = 8;
  const Budget eight = compute_budget(lesson_model(), inputs);
  ASSERT_TRUE(eight.decode);
  EXPECT_EQ(eight.decode->kv_bytes_read, 8 * index_t{1'073'741'824});
  // The largest batch whose caches fit int64 is still a budget: ⌊(2⁶³ − 1) / 2³⁰⌋ = 2³³ − 1.
  inputs.batch = (index_t{1} << 33) - 1;
  EXPECT_EQ(compute_budget(lesson_model(), inputs).decode->kv_bytes_read,
            ((index_t{1} << 33) - 1) * (index_t{1} << 30));
  for (const index_t batch : {index_t{1} << 33, index_t{1'000'000'000'000'000'000}}) {
    inputs.batch = batch;
    EXPECT_THROW_WITH(compute_budget(lesson_model(), inputs), OverflowError,
                      detail::concat("budget: batch ", batch,
                                     ": the KV caches one decode step reads (batch · "
                                     "kv_bytes_per_sequence): overflows int64"));
  }
}

TEST(Budget, WeightsPlusOneSequenceIsCheckedNotWrapped) {
  // The tool prints "weights + 1 sequence"; it used to add the two unchecked and print a
  // negative size. 2⁶² parameters in fp8 are 2⁶² B; with L = H_kv = T = 1 and d_k = 2⁶¹ the KV
  // cache is 2 · 2⁶¹ · 1 B = 2⁶² B: each fits int64, their sum 2⁶³ does not.
  BudgetInputs inputs;
  inputs.context = 1;
  inputs.weight_dtype = Dtype::fp8;
  inputs.kv_dtype = Dtype::fp8;
  const ModelSize huge{index_t{1} << 62, 1, 1, 1, index_t{1} << 61};
  EXPECT_THROW_WITH(compute_budget(huge, inputs), OverflowError,
                    "budget: weights + one sequence's KV cache: overflows int64");
  // A sum that fits is exact: 2⁵⁸ B of weights + 2 · 3 B of KV (2⁵⁸ parameters also keep Adam's
  // 16 B each within int64).
  const Budget b = compute_budget(ModelSize{index_t{1} << 58, 1, 1, 1, 3}, inputs);
  EXPECT_EQ(b.single_sequence_bytes, (index_t{1} << 58) + 6);
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

}  // namespace test_budget
}  // namespace dissect

namespace dissect {
namespace test_budget {

TEST(TensorParallelBudget, OneDeviceHoldsEverythingAndPDevicesAShare) {
  BudgetInputs inputs;
  inputs.context = 2048;
  const Budget b = compute_budget(find_preset("llama-7b").config, inputs);
  const TensorParallelBudget one = tensor_parallel_budget(b, 4096, 1);
  EXPECT_EQ(one.weights_bytes_per_device, b.weights_bytes);
  EXPECT_EQ(one.kv_bytes_per_sequence_per_device, b.kv_bytes_per_sequence);
  const TensorParallelBudget eight = tensor_parallel_budget(b, 4096, 8);
  EXPECT_EQ(eight.weights_bytes_per_device, b.weights_bytes / 8);  // 13,476,831,232 = 8·…
  EXPECT_EQ(eight.kv_bytes_per_token_per_device, 524288 / 8);      // 2·32·32·128·2 B / 8
  // Two all-reduces of B·T·D per layer in forward: 2·4096 fp16 values per token.
  EXPECT_EQ(eight.all_reduce_values_per_token_per_layer, 8192);
  EXPECT_EQ(eight.all_reduce_bytes_per_token_per_layer, 16384);
}

TEST(TensorParallelBudget, RanksThatDoNotDivideTheHeadsAreAConfigError) {
  BudgetInputs inputs;
  inputs.context = 4096;
  const Budget b = compute_budget(find_preset("llama-2-70b").config, inputs);
  EXPECT_THROW_WITH(tensor_parallel_budget(b, 8192, 16), ConfigError,
                    "16 tensor-parallel ranks do not divide n_kv_heads = 8");
  EXPECT_THROW_WITH(tensor_parallel_budget(b, 8192, 0), ConfigError, "must be > 0");
  EXPECT_NO_THROW(tensor_parallel_budget(b, 8192, 8));
}

// A mixture of experts keeps every expert in memory, but one decode step reads only the experts
// its tokens went to: k of E for one sequence, E·(1 − (1 − k/E)^B) expected for B under a
// uniform router, which tends to all of them.
TEST(MixtureOfExpertsBudget, ADecodeStepReadsTheDenseWeightsAndTheExpertsItsBatchUses) {
  const TransformerConfig& mixtral = find_preset("mixtral-8x7b").config;
  const ModelSize size = model_size(mixtral);
  const ParameterCount count = count_parameters(mixtral);
  EXPECT_EQ(size.parameters, count.total);
  EXPECT_EQ(size.expert_parameters, count.experts);
  const double dense = static_cast<double>(count.total - count.experts);
  EXPECT_DOUBLE_EQ(size.parameters_read(1), static_cast<double>(count.active));
  EXPECT_DOUBLE_EQ(size.parameters_read(2),
                   dense + (1.0 - 0.75 * 0.75) * static_cast<double>(count.experts));
  EXPECT_NEAR(size.parameters_read(256), static_cast<double>(count.total), 1.0);  // 0.75^256 ≈ 0
  const ModelSize dense_size = model_size(find_preset("llama-7b").config);
  EXPECT_DOUBLE_EQ(dense_size.parameters_read(1), static_cast<double>(dense_size.parameters));

  BudgetInputs inputs;
  inputs.context = 4096;
  inputs.bandwidth = 2e12;
  inputs.batch = 1;
  const Budget budget = compute_budget(mixtral, inputs);
  EXPECT_EQ(budget.weights_bytes, 2 * count.total);  // fp16: every expert is held
  EXPECT_NEAR(budget.decode->ms_per_step, 2.0 * static_cast<double>(count.active) / 2e12 * 1e3,
              1e-9);

  ModelSize broken = size;
  broken.experts_per_token = 9;
  EXPECT_THROW_WITH(broken.validate(), ConfigError,
                    "experts_per_token 9 must be in [1, n_experts = 8]");
  broken = size;
  broken.expert_parameters = size.parameters + 1;
  EXPECT_THROW_WITH(broken.validate(), ConfigError, "expert_parameters");
}

}  // namespace test_budget
}  // namespace dissect
