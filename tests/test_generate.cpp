// Tests of dissect/models/generate.hpp: greedy generation with the KV cache picks exactly the
// argmax of a full forward over the growing sequence, a seed repeats a sampled generation, the
// context bounds the length, and bad prompts are refused.
#include <gtest/gtest.h>

#include <vector>

#include "dissect/loss.hpp"
#include "dissect/models/generate.hpp"
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
}

}  // namespace test_generate
}  // namespace dissect
