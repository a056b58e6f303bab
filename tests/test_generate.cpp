// Tests of dissect/models/generate.hpp: greedy generation with the KV cache picks exactly the
// argmax of a full forward over the growing sequence (with the penalties too, reading the prompt
// and the tokens generated before), a seed repeats a sampled generation, the context bounds the
// length, bad prompts and options are refused, and a huge context costs only what a request
// needs (generate, beam search and speculative decoding alike).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "dissect/models/beam_search.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/models/speculative_decoding.hpp"
#include "dissect/training/loss.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_generate {

TransformerConfig small_llama() {
  return testing::small_llama(29);
}

TEST(Generate, GreedyWithTheCacheEqualsTheArgmaxOfFullForwards) {
  const LlamaModel<double> model(small_llama(), {.init_std = 0.5, .seed = 3});
  std::vector<index_t> sequence{4, 17, 2};
  std::vector<index_t> streamed;
  const auto stats =
      generate(model, sequence, {.max_new_tokens = 6, .sampling = {.temperature = 0}},
               [&](index_t id) { streamed.push_back(id); });
  ASSERT_EQ(streamed.size(), 6u);
  EXPECT_EQ(stats.prompt_tokens, 3);
  EXPECT_EQ(stats.new_tokens, 6);
  EXPECT_FALSE(stats.stopped_at_context);
  for (index_t expected : streamed) {
    const auto logits = model.forward(TokenBatch{sequence, 1, index_t(sequence.size())});
    const auto rows = argmax(logits.cview().reshape(Shape<2>{-1, 29}));
    EXPECT_EQ(rows.back(), expected);
    sequence.push_back(expected);
  }
}

TEST(Generate, ForwardLastIsTheLastRowOfTheCachedForwardAndFillsTheSameCache) {
  const LlamaModel<float> llama(small_llama(), {.init_std = 0.5, .seed = 7});
  const GPT2Model<float> gpt2(testing::small_gpt2(), {.init_std = 0.5, .seed = 8});
  const auto check = [](const auto& model) {
    const index_t vocab = model.config().vocab;
    const auto ids = testing::random_ids(2 * 5, vocab, 4);
    auto full_kv = model.make_kv_cache(2);
    auto last_kv = model.make_kv_cache(2);
    const auto full = model.forward(TokenBatch{ids, 2, 5}, full_kv);
    const auto last = model.forward_last(TokenBatch{ids, 2, 5}, last_kv);
    ASSERT_EQ(last.shape(), (Shape<3>{2, 1, vocab}));
    EXPECT_EQ(last_kv.length(), 5);
    // The head's product on 2 rows instead of 10 may round otherwise: within a few ulp.
    auto expected = Tensor<float, 3>::uninitialized({2, 1, vocab});
    for (index_t b = 0; b < 2; ++b) {
      for (index_t v = 0; v < vocab; ++v) expected(b, 0, v) = full(b, 4, v);
    }
    EXPECT_TENSOR_NEAR(last, expected, 1e-5, 1e-5);
    // The next step reads the same cache: one token through both.
    const std::vector<index_t> next{3, 5};
    EXPECT_TENSOR_NEAR(model.forward_last(TokenBatch{next, 2, 1}, last_kv),
                       model.forward(TokenBatch{next, 2, 1}, full_kv), 1e-5, 1e-5);
  };
  check(llama);
  check(gpt2);
}

TEST(Generate, ASeedRepeatsASampledGenerationAndTheContextBoundsIt) {
  const GPT2Model<float> model(
      {.d_model = 16, .n_layers = 1, .n_heads = 2, .d_ff = 32, .vocab = 29, .context = 12},
      {.init_std = 0.5, .seed = 5});
  const std::vector<index_t> prompt{1, 2, 3, 4, 5};
  const GenerationOptions options{
      .max_new_tokens = 50, .sampling = {.temperature = 1.5, .top_k = 8}, .seed = 42};
  std::vector<index_t> first, second;
  const auto stats = generate(model, prompt, options, [&](index_t id) { first.push_back(id); });
  generate(model, prompt, options, [&](index_t id) { second.push_back(id); });
  EXPECT_EQ(first, second);
  // 5 prompt positions + 7 fed back = the context of 12; the 8th token is only shown.
  EXPECT_EQ(first.size(), 8u);
  EXPECT_TRUE(stats.stopped_at_context);
  EXPECT_GT(stats.prefill_tokens_per_second(), 0);
}

TEST(Generate, PenaltiesReadThePromptAndEveryTokenGeneratedBefore) {
  const LlamaModel<double> model(small_llama(), {.init_std = 0.5, .seed = 3});
  constexpr double frequency = 0.7, presence = 0.9;
  double repetition = 1;
  // The reference: a full forward over the growing sequence, the penalties written out here,
  // then the first largest. Hugging Face's repetition penalty reads the whole sequence (or, to
  // show that this matters, only the generated part); OpenAI's penalties count the generated
  // tokens (or, likewise, the prompt too).
  const auto reference = [&](const std::vector<index_t>& sequence, std::size_t prompt_length,
                             bool repetition_reads_prompt, bool openai_counts_prompt) {
    const auto logits = model.forward(TokenBatch{sequence, 1, index_t(sequence.size())});
    std::vector<double> row(logits.data() + (logits.dim(1) - 1) * 29,
                            logits.data() + logits.dim(1) * 29);
    std::vector<bool> seen(29);
    std::vector<int> counts(29);
    for (std::size_t i = 0; i < sequence.size(); ++i) {
      const auto id = static_cast<std::size_t>(sequence[i]);
      const bool in_prompt = i < prompt_length;
      if (!seen[id] && (repetition_reads_prompt || !in_prompt)) {
        row[id] = row[id] < 0 ? row[id] * repetition : row[id] / repetition;
        seen[id] = true;
      }
      if (openai_counts_prompt || !in_prompt) ++counts[id];
    }
    for (std::size_t id = 0; id < row.size(); ++id) {
      if (counts[id] > 0) row[id] = row[id] - counts[id] * frequency - presence;
    }
    return index_t(std::max_element(row.begin(), row.end()) - row.begin());
  };
  int steps = 0, differ_without_prompt = 0, differ_counting_prompt = 0;
  // Greedy from {4, 17, 2, 4} without penalties gives 25, 25, 25, 23, …
  const std::vector<std::pair<std::vector<index_t>, double>> cases{
      {{4, 17, 2, 4}, 1.8}, {{4, 17, 2, 4, 25}, 1.8}, {{25, 25, 25, 25, 25}, 1.0}};
  for (const auto& [prompt, penalty] : cases) {
    repetition = penalty;
    GenerationOptions options{.max_new_tokens = 7,
                              .sampling = {.temperature = 0,
                                           .repetition_penalty = repetition,
                                           .frequency_penalty = frequency,
                                           .presence_penalty = presence}};
    std::vector<index_t> streamed, plain;
    generate(model, prompt, options, [&](index_t id) { streamed.push_back(id); });
    options.sampling = {.temperature = 0};
    generate(model, prompt, options, [&](index_t id) { plain.push_back(id); });
    EXPECT_NE(streamed, plain) << "the penalties change this greedy generation";
    std::vector<index_t> sequence = prompt;
    for (const index_t got : streamed) {
      EXPECT_EQ(got, reference(sequence, prompt.size(), true, false))
          << "after " << sequence.size() << " tokens";
      differ_without_prompt += got != reference(sequence, prompt.size(), false, false);
      differ_counting_prompt += got != reference(sequence, prompt.size(), true, true);
      ++steps;
      sequence.push_back(got);
    }
  }
  // The prompts were chosen so that both readings of the history matter: a generate that left
  // the prompt out of the repetition penalty, or counted it for OpenAI's, would fail above.
  EXPECT_EQ(steps, 21);
  EXPECT_GT(differ_without_prompt, 0);
  EXPECT_GT(differ_counting_prompt, 0);
}

TEST(Generate, ASeedRepeatsAGenerationWithEveryFilterAndPenalty) {
  const GPT2Model<float> model(
      {.d_model = 16, .n_layers = 1, .n_heads = 2, .d_ff = 32, .vocab = 29, .context = 40},
      {.init_std = 0.5, .seed = 5});
  const std::vector<index_t> prompt{1, 2, 3, 1};
  const GenerationOptions options{.max_new_tokens = 30,
                                  .sampling = {.temperature = 1.2,
                                               .top_k = 20,
                                               .top_p = 0.9,
                                               .min_p = 0.05,
                                               .repetition_penalty = 1.3,
                                               .frequency_penalty = 0.2,
                                               .presence_penalty = 0.1},
                                  .seed = 7};
  std::vector<index_t> first, second;
  generate(model, prompt, options, [&](index_t id) { first.push_back(id); });
  generate(model, prompt, options, [&](index_t id) { second.push_back(id); });
  EXPECT_EQ(first.size(), 30u);
  EXPECT_EQ(first, second);
}

// ---- a context that is merely large (docs/reliability.md row 131) ------------------------------

/// small_llama(29) with another context; the weights of a rotary model do not depend on it, so
/// models built from one seed differ only in their context.
TransformerConfig llama_with_context(index_t context) {
  auto config = small_llama();
  config.context = context;
  return config;
}

/// The contexts a model config may claim (GGUF's llama.context_length, config.json's
/// max_position_embeddings): 10⁸ took 6.1 GB and over 60 s for 8 tokens when the RoPE table and
/// the KV cache were sized by it, and 2³¹ − 1 threw std::bad_alloc.
constexpr index_t huge_contexts[] = {100'000'000, std::numeric_limits<std::int32_t>::max()};

TEST(GenerateMemory, AHugeContextCostsWhatTheRequestNeedsAndGivesTheSameLogits) {
  const LlamaModel<double> small(llama_with_context(12), {.init_std = 0.5, .seed = 3});
  const std::vector<index_t> prompt{4, 17, 2};
  const GenerationOptions options{.max_new_tokens = 6, .sampling = {.temperature = 0}};
  std::vector<index_t> expected;
  const auto small_stats =
      generate(small, prompt, options, [&](index_t id) { expected.push_back(id); });
  EXPECT_EQ(small_stats.kv_cache_positions, 3 + 6 - 1);
  for (const index_t context : huge_contexts) {
    SCOPED_TRACE(context);
    const LlamaModel<double> model(llama_with_context(context), {.init_std = 0.5, .seed = 3});
    EXPECT_EQ(model.rope_positions(), 0);  // nothing built for the context
    std::vector<index_t> tokens;
    const auto stats = generate(model, prompt, options, [&](index_t id) { tokens.push_back(id); });
    EXPECT_EQ(tokens, expected);
    EXPECT_FALSE(stats.stopped_at_context);
    // The cache holds the prompt and every new token but the last; the RoPE table the positions
    // fed (grown by doubling: 3, then 6, then 12 >= 8).
    EXPECT_EQ(stats.kv_cache_positions, 3 + 6 - 1);
    EXPECT_GE(model.rope_positions(), 8);
    EXPECT_LE(model.rope_positions(), 2 * 8);
    // The same logits, bit for bit: the table's entries do not depend on its length.
    const auto ids = testing::random_ids(10, 29, 5);
    const auto a = model.forward(TokenBatch{ids, 2, 5});
    const auto b = small.forward(TokenBatch{ids, 2, 5});
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin()));
    // max_new_tokens beyond the context is still cut by it, not allocated.
    const auto cut = generate(small, prompt, {.max_new_tokens = 1'000'000'000'000}, [](index_t) {});
    EXPECT_TRUE(cut.stopped_at_context);
    EXPECT_EQ(cut.kv_cache_positions, 12);
  }
}

TEST(GenerateMemory, BeamSearchAndSpeculativeDecodingSizeTheirCachesByTheRequest) {
  const LlamaModel<double> small(llama_with_context(12), {.init_std = 0.5, .seed = 3});
  const LlamaModel<double> small_draft(llama_with_context(12), {.init_std = 0.5, .seed = 4});
  const std::vector<index_t> prompt{4, 17, 2, 9};
  const BeamSearchOptions beams{.num_beams = 3, .max_new_tokens = 5, .num_return_sequences = 2};
  const SpeculativeOptions speculative{
      .gamma = 3, .max_new_tokens = 7, .sampling = {.temperature = 0}};
  const auto expected_beams = beam_search(small, prompt, beams);
  const auto expected_tokens = speculative_generate(small, small_draft, prompt, speculative).tokens;
  for (const index_t context : huge_contexts) {
    SCOPED_TRACE(context);
    const LlamaModel<double> model(llama_with_context(context), {.init_std = 0.5, .seed = 3});
    const LlamaModel<double> draft(llama_with_context(context), {.init_std = 0.5, .seed = 4});
    const auto found = beam_search(model, prompt, beams);
    ASSERT_EQ(found.sequences.size(), expected_beams.sequences.size());
    for (std::size_t i = 0; i < found.sequences.size(); ++i) {
      EXPECT_EQ(found.sequences[i].tokens, expected_beams.sequences[i].tokens);
      EXPECT_EQ(found.sequences[i].score, expected_beams.sequences[i].score);
    }
    EXPECT_LE(model.rope_positions(), 2 * (4 + 5 - 1));
    // Both caches: the prompt and every new token but the last.
    SpeculativeDecoder decoder(model, draft, prompt, speculative);
    EXPECT_EQ(decoder.target_cache().capacity(), 4 + 7 - 1);
    EXPECT_EQ(decoder.draft_cache().capacity(), 4 + 7 - 1);
    std::vector<index_t> tokens;
    while (!decoder.done()) {
      for (const index_t token : decoder.round()) tokens.push_back(token);
    }
    EXPECT_EQ(tokens, expected_tokens);
  }
}

TEST(GenerateErrors, BadPromptsAndOptionsAreRefused) {
  const LlamaModel<float> model(small_llama());
  const auto ignore = [](index_t) {};
  EXPECT_THROW_WITH(generate(model, std::vector<index_t>{}, {}, ignore), ShapeError,
                    "generate: the prompt has 0 tokens; it needs 1 to the context, 12");
  EXPECT_THROW_WITH(generate(model, std::vector<index_t>(13, 1), {}, ignore), ShapeError,
                    "the prompt has 13 tokens");
  EXPECT_THROW_WITH(generate(model, std::vector<index_t>{1, 29}, {}, ignore), Error,
                    "token 29 at [0, 1] is outside [0, 29)");
  EXPECT_THROW_WITH(generate(model, std::vector<index_t>{1}, {.max_new_tokens = -1}, ignore),
                    ConfigError, "max_new_tokens must be >= 0");
  EXPECT_THROW_WITH(generate(model, std::vector<index_t>{1}, {.sampling = {.top_k = -1}}, ignore),
                    ConfigError, "generate: top_k must be >= 0");
  EXPECT_THROW_WITH(generate(model, std::vector<index_t>{1}, {.sampling = {.top_p = 0}}, ignore),
                    ConfigError, "generate: top_p must be in (0, 1] (got 0)");
  EXPECT_THROW_WITH(
      generate(model, std::vector<index_t>{1}, {.sampling = {.repetition_penalty = 0}}, ignore),
      ConfigError, "generate: repetition_penalty must be finite and > 0 (got 0)");
}

}  // namespace test_generate
}  // namespace dissect
