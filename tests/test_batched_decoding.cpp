// Tests of the paged forward (DecoderModel::forward over a PagedKVCache) and of
// dissect/models/batched_decoding.hpp: every sequence of a batch gets the logits of decoding it
// alone with a KVCache, row for row, and batched_generate returns generate()'s tokens for every
// request — mixed prompt lengths, B = 1 … 5 slots, more requests than slots, shared prompt
// prefixes (fewer blocks, the same tokens), sampling with a seed, EOS — on GPT-2's, LLaMA's
// (grouped-query attention, RoPE at each sequence's own positions) and Mixtral's parts, with the
// pool empty at the end; and what it refuses.
#include <gtest/gtest.h>

#include <vector>

#include "dissect/models/batched_decoding.hpp"
#include "dissect/models/generate.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_batched_decoding {

TransformerConfig gpt2_config() {
  return {.d_model = 16, .n_layers = 2, .n_heads = 4, .d_ff = 32, .vocab = 31, .context = 48};
}

TransformerConfig llama_config() {
  return {.d_model = 16,
          .n_layers = 2,
          .n_heads = 4,
          .n_kv_heads = 2,
          .d_ff = 24,
          .vocab = 31,
          .context = 48,
          .tied_embeddings = false,
          .positions = Positions::rotary,
          .norm = Norm::rms_norm,
          .bias = false,
          .ffn = Ffn::gated};
}

/// Prompts of 1 to 23 tokens (inside one block of 4, on a boundary, across several).
std::vector<std::vector<index_t>> prompts() {
  return {{3},
          {5, 1, 4, 1, 5, 9, 2, 6},
          {2, 7, 1, 8, 2},
          {1, 6, 1, 8, 0, 3, 3, 9, 8, 8, 7, 4, 9, 8, 9, 4, 8, 4, 8, 2, 0, 4, 5},
          {4, 4},
          {9, 9, 9, 9, 9, 9, 9, 9, 9, 9, 9},
          {7, 3, 0, 5}};
}

template <class Model>
std::vector<index_t> generated(const Model& model, const BatchRequest& request) {
  std::vector<index_t> out;
  generate(model, request.prompt, request.options, [&](index_t id) { out.push_back(id); });
  if (request.eos_token_id) {
    const auto eos = std::find(out.begin(), out.end(), *request.eos_token_id);
    if (eos != out.end()) out.erase(eos + 1, out.end());
  }
  return out;
}

template <class Model>
class BatchedDecoding : public ::testing::Test {};
using Models = ::testing::Types<GPT2Model<double>, LlamaModel<double>, MixtralModel<double>>;
TYPED_TEST_SUITE(BatchedDecoding, Models);

/// LLaMA's parts with a mixture of 4 SwiGLU experts, 2 per token (Mixtral): each token is routed
/// on its own, so a batch of sequences must not change any sequence's experts.
TransformerConfig mixtral_config() {
  auto config = llama_config();
  config.n_experts = 4;
  config.experts_per_token = 2;
  return config;
}

template <class Model>
Model make_model() {
  if constexpr (std::is_same_v<Model, GPT2Model<double>>) {
    return Model(gpt2_config(), {.init_std = 0.5, .seed = 11});
  } else if constexpr (std::is_same_v<Model, LlamaModel<double>>) {
    return Model(llama_config(), {.init_std = 0.5, .seed = 11});
  } else {
    return Model(mixtral_config(), {.init_std = 0.5, .seed = 11});
  }
}

TYPED_TEST(BatchedDecoding, EachRowOfABatchedStepHasTheLogitsOfItsSequenceDecodedAlone) {
  const auto model = make_model<TypeParam>();
  auto paged = model.make_paged_kv_cache(64, 4);
  const auto all = prompts();
  std::vector<index_t> ids;
  std::vector<KVCache<double>> alone;
  std::vector<index_t> last;
  // Prefill four sequences of 1, 8, 5 and 23 positions one by one, and each alone.
  for (std::size_t i = 0; i < 4; ++i) {
    const auto& p = all[i];
    ids.push_back(paged.add_sequence());
    alone.push_back(model.make_kv_cache(1));
    const index_t T = static_cast<index_t>(p.size());
    const index_t one[] = {ids.back()};
    const auto got = model.forward(TokenBatch{p, 1, T}, paged, one);
    const auto want = model.forward(TokenBatch{p, 1, T}, alone.back());
    EXPECT_TENSOR_NEAR(got, want, 1e-12, 1e-12);
    last.push_back(p.back());
  }
  // Decode steps of all four at their own positions (1, 8, 5, 23 …), then of a subset in
  // another order: the same rows as alone.
  for (int step = 0; step < 9; ++step) {
    std::vector<index_t> rows = {0, 1, 2, 3};
    if (step >= 6) rows = {3, 0};
    std::vector<index_t> tokens, sequences;
    for (index_t r : rows) {
      tokens.push_back((last[r] + 7 * step + 3) % 31);
      sequences.push_back(ids[r]);
    }
    const index_t B = static_cast<index_t>(rows.size());
    const auto got = model.forward(TokenBatch{tokens, B, 1}, paged, sequences);
    ASSERT_EQ(got.shape(), (Shape<3>{B, 1, 31}));
    for (index_t b = 0; b < B; ++b) {
      const index_t r = rows[b];
      const auto want = model.forward(TokenBatch{std::span(&tokens[b], 1), 1, 1}, alone[r]);
      Tensor<double, 3> row({1, 1, 31});
      std::copy_n(got.data() + b * 31, 31, row.data());
      // Double precision: the batched and the single products differ only in rounding.
      EXPECT_TENSOR_NEAR(row, want, 1e-12, 1e-12) << "step " << step << ", sequence " << r;
      last[r] = tokens[b];
    }
  }
  for (index_t id : ids) paged.release(id);
  EXPECT_EQ(paged.free_blocks(), 64);
}

TYPED_TEST(BatchedDecoding, EveryRequestGetsGeneratesTokensForAnyNumberOfSlots) {
  const auto model = make_model<TypeParam>();
  std::vector<BatchRequest> requests;
  for (const auto& p : prompts()) {
    requests.push_back({.prompt = p,
                        .options = {.max_new_tokens = static_cast<index_t>(3 + p.size() % 7),
                                    .sampling = {.temperature = 0}}});
  }
  // A sampled request (its own seed), one stopped by EOS, one cut by the context, one of zero.
  requests[2].options.sampling = {.temperature = 1.3, .top_k = 9};
  requests[2].options.seed = 77;
  requests[1].options.max_new_tokens = 12;
  requests[1].eos_token_id = generated(model, requests[1])[4];
  requests[3].options.max_new_tokens = 40;  // 23 + 40 > 48: cut to 26 as generate does
  requests.push_back({.prompt = {1, 2}, .options = {.max_new_tokens = 0}});
  std::vector<std::vector<index_t>> expected;
  for (const auto& r : requests) expected.push_back(generated(model, r));
  ASSERT_LT(expected[1].size(), 12u);  // the EOS cut it
  EXPECT_EQ(expected[3].size(), 26u);
  for (index_t slots = 1; slots <= 5; ++slots) {
    auto cache = model.make_paged_kv_cache(80, 4);
    const auto result =
        batched_generate(model, cache, std::span<const BatchRequest>(requests), {.slots = slots});
    for (std::size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(result.tokens[i], expected[i]) << "request " << i << ", " << slots << " slots";
    }
    EXPECT_TRUE(result.stopped_at_context[3]);
    EXPECT_FALSE(result.stopped_at_context[0]);
    EXPECT_EQ(result.stats.peak_batch, slots);  // refilled: every slot was busy at some step
    EXPECT_GT(result.stats.decode_tokens, 0);
    EXPECT_EQ(cache.free_blocks(), 80) << "blocks left held after " << slots << " slots";
    EXPECT_EQ(cache.active_sequences(), 0);
  }
}

TYPED_TEST(BatchedDecoding, SharedPromptPrefixesHoldFewerBlocksAndChangeNoToken) {
  const auto model = make_model<TypeParam>();
  // Five requests on one 13-token system prompt (three full blocks of 4) and their own tails.
  const std::vector<index_t> system{3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9};
  std::vector<BatchRequest> requests;
  for (index_t i = 0; i < 5; ++i) {
    auto prompt = system;
    for (index_t j = 0; j <= i; ++j) prompt.push_back((i * 5 + j) % 31);
    requests.push_back(
        {.prompt = prompt, .options = {.max_new_tokens = 6, .sampling = {.temperature = 0}}});
  }
  BatchedDecodingResult runs[2];
  for (bool share : {false, true}) {
    auto cache = model.make_paged_kv_cache(60, 4);
    runs[share] = batched_generate(model, cache, std::span<const BatchRequest>(requests),
                                   {.slots = 5, .share_prefixes = share});
    EXPECT_EQ(cache.free_blocks(), 60);
  }
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(runs[1].tokens[i], runs[0].tokens[i]);
    EXPECT_EQ(runs[1].tokens[i], generated(model, requests[i]));
  }
  // The four later requests each took the three full blocks of the first: 12 positions apiece
  // computed once, and 4 · 3 = 12 blocks fewer at the peak, when all five are in flight.
  EXPECT_EQ(runs[0].stats.reused_tokens, 0);
  EXPECT_EQ(runs[1].stats.reused_tokens, 4 * 12);
  EXPECT_EQ(runs[0].stats.prefill_tokens - runs[1].stats.prefill_tokens, 4 * 12);
  EXPECT_EQ(runs[0].stats.peak_blocks - runs[1].stats.peak_blocks, 4 * 3);
}

TEST(BatchedDecodingPool, ASmallPoolMakesRequestsWaitForBlocksNotFail) {
  const LlamaModel<double> model(llama_config(), {.init_std = 0.5, .seed = 5});
  std::vector<BatchRequest> requests;
  for (const auto& p : prompts()) {
    requests.push_back(
        {.prompt = p, .options = {.max_new_tokens = 5, .sampling = {.temperature = 0}}});
  }
  // The 23-token prompt needs ⌈(23 + 4)/4⌉ = 7 blocks: a pool of 9 holds it and little more,
  // so four slots are rarely all busy; every request still ends with generate()'s tokens.
  auto cache = model.make_paged_kv_cache(9, 4);
  const auto result =
      batched_generate(model, cache, std::span<const BatchRequest>(requests), {.slots = 4});
  for (std::size_t i = 0; i < requests.size(); ++i) {
    EXPECT_EQ(result.tokens[i], generated(model, requests[i])) << "request " << i;
  }
  EXPECT_LE(result.stats.peak_blocks, 9);
  EXPECT_EQ(cache.free_blocks(), 9);
}

TEST(BatchedDecodingPool, SlotsAreBoundedByTheRequestsAndAHugeContextCostsNothing) {
  // Row 132: slots = 2⁴⁰ for one request allocated 2⁴⁰ slot states up front (an abort under
  // ASan, std::bad_alloc in release); a slot without a request holds nothing, so it is one slot.
  const LlamaModel<double> model(llama_config(), {.init_std = 0.5, .seed = 5});
  const std::vector<BatchRequest> one{
      {.prompt = {5, 1, 4, 1}, .options = {.max_new_tokens = 6, .sampling = {.temperature = 0}}}};
  auto cache = model.make_paged_kv_cache(8, 4);
  const auto result = batched_generate(model, cache, std::span<const BatchRequest>(one),
                                       {.slots = index_t{1} << 40});
  EXPECT_EQ(result.tokens[0], generated(model, one[0]));
  EXPECT_EQ(result.stats.peak_batch, 1);
  EXPECT_EQ(cache.free_blocks(), 8);
  // No request at all: no slot, no work.
  EXPECT_TRUE(batched_generate(model, cache, std::span<const BatchRequest>(), {.slots = 1 << 30})
                  .tokens.empty());
  // Row 131: the same model with a context of 2³¹ − 1 decodes the same tokens, its RoPE table
  // grown only to the positions its sequences reach (the paged pool is sized by the caller).
  auto huge_config = llama_config();
  huge_config.context = 2147483647;
  const LlamaModel<double> huge(huge_config, {.init_std = 0.5, .seed = 5});
  auto huge_cache = huge.make_paged_kv_cache(8, 4);
  const auto huge_result = batched_generate(huge, huge_cache, std::span<const BatchRequest>(one),
                                            {.slots = index_t{1} << 40});
  EXPECT_EQ(huge_result.tokens[0], result.tokens[0]);
  EXPECT_LE(huge.rope_positions(), 2 * (4 + 6 - 1));
}

TEST(BatchedDecodingErrors, RequestsThatCannotRunAreRefusedBeforeAnyForward) {
  const GPT2Model<double> model(gpt2_config(), {.init_std = 0.5, .seed = 5});
  auto cache = model.make_paged_kv_cache(4, 4);
  const auto run = [&](BatchRequest request, BatchedDecodingOptions options = {}) {
    const BatchRequest requests[] = {{.prompt = {1, 2}, .options = {.max_new_tokens = 2}},
                                     std::move(request)};
    batched_generate(model, cache, std::span<const BatchRequest>(requests), options);
  };
  // Row 108: 14 prompt + 5 fed positions need 5 blocks of 4; the pool has 4.
  EXPECT_THROW_WITH(
      run({.prompt = std::vector<index_t>(14, 1), .options = {.max_new_tokens = 6}}), Error,
      "batched_generate: request 1 needs 5 blocks of 4 positions (14 prompt + 5 fed tokens); the "
      "paged KV cache has 4");
  // Row 108: blocks held outside this call leave too few for the head of the queue.
  const index_t other = cache.add_sequence();
  const index_t held[] = {other};
  cache.reserve(held, 12);
  EXPECT_THROW_WITH(
      run({.prompt = std::vector<index_t>(6, 1), .options = {.max_new_tokens = 4}}), Error,
      "batched_generate: request 1 needs 3 free blocks, the paged KV cache has 1 free "
      "of 4 with no request of this call in flight");
  cache.release(other);
  // Row 110.
  EXPECT_THROW_WITH(run({.prompt = {1}}, {.slots = 0}), ConfigError,
                    "batched_generate: slots must be >= 1 (got 0)");
  EXPECT_THROW_WITH(run({.prompt = {}}), ShapeError,
                    "batched_generate: request 1: the prompt has 0 tokens; it needs 1 to the "
                    "context, 48");
  EXPECT_THROW_WITH(run({.prompt = {1}, .eos_token_id = 31}), ConfigError,
                    "request 1: eos_token_id 31 is outside the vocabulary [0, 31)");
  EXPECT_THROW_WITH(run({.prompt = {1}, .options = {.max_new_tokens = -1}}), ConfigError,
                    "request 1: max_new_tokens must be >= 0 (got -1)");
  EXPECT_THROW_WITH(run({.prompt = {1}, .options = {.sampling = {.top_p = 0}}}), ConfigError,
                    "top_p must be in (0, 1]");
  // An id outside the vocabulary is the forward's error; the blocks taken so far come back.
  EXPECT_THROW_WITH(run({.prompt = {1, 31}, .options = {.max_new_tokens = 2}}), Error,
                    "token 31 at [0, 1] is outside [0, 31)");
  EXPECT_EQ(cache.free_blocks(), 4);
  EXPECT_EQ(cache.active_sequences(), 0);
}

TEST(BatchedDecodingErrors, APagedForwardRefusesWhatDoesNotFitAndChangesNothing) {  // row 109
  const LlamaModel<double> model(llama_config(), {.init_std = 0.5, .seed = 5});
  auto cache = model.make_paged_kv_cache(16, 4);
  const index_t a = cache.add_sequence(), b = cache.add_sequence();
  const std::vector<index_t> two{1, 2};
  const index_t one[] = {a}, both[] = {a, b}, twice[] = {a, a};
  EXPECT_THROW_WITH(
      model.forward(TokenBatch{two, 1, 2}, cache, both), ShapeError,
      "LlamaModel::forward (paged KV cache): 2 sequence ids for B = 1 rows of tokens");
  EXPECT_THROW_WITH(model.forward(TokenBatch{two, 2, 1}, cache, twice), Error,
                    "sequence 0 appears twice in one step");
  EXPECT_THROW_WITH(model.forward(TokenBatch{two, 2, 1}, cache, std::vector<index_t>{a, 7}), Error,
                    "sequence 7 is not active");
  const std::vector<index_t> long_prompt(47, 3);
  model.forward(TokenBatch{long_prompt, 1, 47}, cache, one);
  EXPECT_THROW_WITH(model.forward(TokenBatch{two, 1, 2}, cache, one), ShapeError,
                    "positions 47 … 48 (T = 2 after 47) exceed the model's context of 48");
  // 12 blocks held by a; b's 23 positions need 6 of the 4 left.
  const std::vector<index_t> prompt(23, 2);
  const index_t second[] = {b};
  EXPECT_THROW_WITH(model.forward(TokenBatch{prompt, 1, 23}, cache, second), Error,
                    "the paged KV cache is exhausted: 1 sequences need 6 more blocks of 4 "
                    "positions for 23 new positions each, 4 of 16 blocks are free");
  EXPECT_THROW_WITH(model.forward(TokenBatch{std::vector<index_t>{1, 99}, 1, 2}, cache, second),
                    Error, "99");
  EXPECT_EQ(cache.length(a), 47);
  EXPECT_EQ(cache.length(b), 0);
  EXPECT_EQ(cache.free_blocks(), 4);
}

}  // namespace test_batched_decoding
}  // namespace dissect
