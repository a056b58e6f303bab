// Tests of dissect/models/beam_search.hpp: the n-best tokens, scores and the steps run equal a
// torch reference written from Hugging Face's `_beam_search` (tests/reference, block
// beam_search) on the model fixtures' GPT-2 and LLaMA; each returned score equals the one a full
// forward over that hypothesis alone gives (so the cache rows were reordered to the right
// parents); one beam is greedy generation; bad options are refused (reliability rows 104, 105).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "dissect/models/beam_search.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/training/loss.hpp"
#include "support/fixture_testing.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_beam_search {

template <class Scalar>
class BeamSearchTyped : public ::testing::Test {};
TYPED_TEST_SUITE(BeamSearchTyped, testing::FloatAndDouble);

/// The model of the "model" block's weights_<arch>.txt, whose meta is its config.
template <class Model>
Model fixture_model(const std::string& arch) {
  const auto weights =
      testing::read_fixture(testing::fixture_dir("model") / ("weights_" + arch + ".txt"));
  TransformerConfig config{.d_model = weights.meta_int("d_model"),
                           .n_layers = weights.meta_int("n_layers"),
                           .n_heads = weights.meta_int("n_heads"),
                           .n_kv_heads = weights.meta_int("n_kv_heads"),
                           .d_ff = weights.meta_int("d_ff"),
                           .vocab = weights.meta_int("vocab"),
                           .context = weights.meta_int("context")};
  config.head_dim = weights.meta_int("head_dim");
  config.tied_embeddings = weights.meta_bool("tied");
  config.bias = weights.meta_bool("bias");
  config.norm_eps = std::stod(weights.meta_str("norm_eps"));
  if (arch == "llama") {
    config.positions = Positions::rotary;
    config.norm = Norm::rms_norm;
    config.ffn = Ffn::gated;
    config.rope_theta = std::stod(weights.meta_str("rope_theta"));
  }
  Model model(config, {.seed = 1});
  std::size_t loaded = 0;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    using View = decltype(value);
    value.copy_from(
        testing::tensor_from<scalar_of<View>, rank_of<View>>(weights.tensor(name.str())).cview());
    ++loaded;
  });
  EXPECT_EQ(loaded, weights.tensors.size());
  return model;
}

EarlyStopping early_stopping_of(const std::string& name) {
  if (name == "when_full") return EarlyStopping::when_full;
  if (name == "never") return EarlyStopping::never;
  EXPECT_EQ(name, "heuristic");
  return EarlyStopping::heuristic;
}

/// A score sums T ≤ max_new_tokens log-probabilities. Those of these tiny models are ≈ −log 97
/// ≈ −4.6 (their logits are nearly flat and small, so their own error is far below a rounding of
/// a log-probability): each log-probability and each partial sum (≤ 4.6·T) is rounded in both
/// implementations, ≤ 2·T·u·4.6·(T + 1) in all; dividing by T^length_penalty ≥ 1 only shrinks it.
/// Float32 scores in fact come out identical to torch's.
template <class Scalar>
double score_tolerance(index_t tokens) {
  const auto t = static_cast<double>(tokens);
  return 2.0 * t * testing::unit_roundoff<Scalar>() * 4.6 * (t + 1);
}

template <class Scalar, class Model>
void expect_matches_reference(const testing::Fixture& run) {
  const Model model = fixture_model<Model>(run.meta_str("arch"));
  const auto& prompt_values = run.tensor("prompt").values;
  const std::vector<index_t> prompt(prompt_values.begin(), prompt_values.end());
  BeamSearchOptions options{.num_beams = run.meta_int("num_beams"),
                            .length_penalty = std::stod(run.meta_str("length_penalty")),
                            .early_stopping = early_stopping_of(run.meta_str("early_stopping")),
                            .max_new_tokens = run.meta_int("max_new_tokens"),
                            .num_return_sequences = run.meta_int("num_return_sequences")};
  if (run.meta_int("eos_token_id") >= 0) options.eos_token_id = run.meta_int("eos_token_id");
  const auto result = beam_search(model, prompt, options);
  EXPECT_EQ(result.steps, run.meta_int("steps"));
  EXPECT_FALSE(result.stopped_at_context);
  const auto& tokens = run.tensor("tokens");
  const auto& lengths = run.tensor("lengths").values;
  const auto& scores = run.tensor("scores").values;
  ASSERT_EQ(result.sequences.size(), lengths.size());
  const index_t width = tokens.shape[1];
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    const auto begin = tokens.values.begin() + static_cast<std::ptrdiff_t>(i) * width;
    const std::vector<index_t> expected(begin, begin + static_cast<std::ptrdiff_t>(lengths[i]));
    EXPECT_EQ(result.sequences[i].tokens, expected) << "hypothesis " << i;
    EXPECT_NEAR(result.sequences[i].score, scores[i],
                score_tolerance<Scalar>(options.max_new_tokens))
        << "hypothesis " << i;
  }
}

TYPED_TEST(BeamSearchTyped, MatchesHuggingFacesAlgorithmOnTheModelFixtures) {
  const int cases = testing::for_each_fixture<TypeParam>("beam_search", [](const auto& run) {
    if (run.meta_str("arch") == "gpt2") {
      expect_matches_reference<TypeParam, GPT2Model<TypeParam>>(run);
    } else {
      expect_matches_reference<TypeParam, LlamaModel<TypeParam>>(run);
    }
  });
  EXPECT_EQ(cases, 7);
}

/// Σ log softmax(full forward over prompt + tokens)[the next token] / len^length_penalty: the
/// hypothesis scored from scratch, without any cache.
template <class Model>
double score_from_scratch(const Model& model, const std::vector<index_t>& prompt,
                          const std::vector<index_t>& tokens, double length_penalty) {
  std::vector<index_t> sequence = prompt;
  sequence.insert(sequence.end(), tokens.begin(), tokens.end());
  const index_t length = static_cast<index_t>(sequence.size()), vocab = model.config().vocab;
  const auto logits = model.forward(TokenBatch{sequence, 1, length});
  const auto logp = log_softmax(logits.cview().reshape(Shape<2>{length, vocab}));
  double sum = 0;
  for (std::size_t i = 0; i < tokens.size(); ++i) {
    const auto row = static_cast<index_t>(prompt.size() + i) - 1;
    sum += static_cast<double>(logp(row, tokens[i]));
  }
  return sum / std::pow(static_cast<double>(tokens.size()), length_penalty);
}

template <class Model>
void expect_scores_from_scratch(const Model& model) {
  const std::vector<index_t> prompt{3, 14, 1};
  for (const double length_penalty : {1.0, 0.0, 2.0}) {
    SCOPED_TRACE(testing::concat_for_trace("length_penalty", length_penalty));
    const BeamSearchOptions options{.num_beams = 5,
                                    .length_penalty = length_penalty,
                                    .max_new_tokens = 7,
                                    .eos_token_id = 2,
                                    .num_return_sequences = 5};
    const auto result = beam_search(model, prompt, options);
    ASSERT_EQ(result.sequences.size(), 5u);
    std::set<std::vector<index_t>> distinct;
    for (std::size_t i = 0; i < result.sequences.size(); ++i) {
      const auto& h = result.sequences[i];
      EXPECT_NEAR(h.score, score_from_scratch(model, prompt, h.tokens, length_penalty), 1e-12);
      if (i > 0) EXPECT_GE(result.sequences[i - 1].score, h.score);
      distinct.insert(h.tokens);
      // EOS ends a hypothesis; only one of max_new_tokens may end without it.
      for (std::size_t t = 0; t + 1 < h.tokens.size(); ++t) EXPECT_NE(h.tokens[t], 2);
      if (h.tokens.back() != 2) EXPECT_EQ(h.tokens.size(), 7u);
    }
    EXPECT_EQ(distinct.size(), 5u);
  }
}

TEST(BeamSearch, EachScoreIsItsHypothesisRecomputedFromScratch) {
  // Peaked logits (init_std 0.5) and many beams: the beams diverge and trade places, so a cache
  // row left with the wrong parent would score a hypothesis on another's history.
  expect_scores_from_scratch(
      LlamaModel<double>(testing::small_llama(29), {.init_std = 0.5, .seed = 7}));
  expect_scores_from_scratch(
      GPT2Model<double>(testing::small_gpt2(), {.init_std = 0.5, .seed = 8}));
}

TYPED_TEST(BeamSearchTyped, OneBeamIsGreedyGeneration) {
  const GPT2Model<TypeParam> model = fixture_model<GPT2Model<TypeParam>>("gpt2");
  const LlamaModel<TypeParam> llama(testing::small_llama(29), {.init_std = 0.5, .seed = 3});
  const std::vector<index_t> prompt{4, 17, 2};
  const auto check = [&](const auto& m) {
    std::vector<index_t> greedy;
    generate(m, prompt, {.max_new_tokens = 6, .sampling = {.temperature = 0}},
             [&](index_t id) { greedy.push_back(id); });
    const auto result = beam_search(m, prompt, {.num_beams = 1, .max_new_tokens = 6});
    ASSERT_EQ(result.sequences.size(), 1u);
    EXPECT_EQ(result.sequences[0].tokens, greedy);
    EXPECT_EQ(result.steps, 6);
  };
  check(model);
  check(llama);
}

TEST(BeamSearch, TheContextBoundsTheLengthAndZeroNewTokensReturnsNothing) {
  const LlamaModel<float> model(testing::small_llama(29), {.init_std = 0.5, .seed = 3});
  const std::vector<index_t> prompt{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  // 10 prompt positions + 2 fed back = the context of 12; the third token is only scored.
  const auto result =
      beam_search(model, prompt, {.num_beams = 3, .max_new_tokens = 8, .num_return_sequences = 3});
  EXPECT_TRUE(result.stopped_at_context);
  ASSERT_EQ(result.sequences.size(), 3u);
  for (const auto& h : result.sequences) EXPECT_EQ(h.tokens.size(), 3u);
  const auto none = beam_search(model, prompt, {.num_beams = 2, .max_new_tokens = 0});
  EXPECT_TRUE(none.sequences.empty());
  EXPECT_EQ(none.steps, 0);
}

TEST(BeamSearchErrors, BadOptionsAreConfigErrorsNamingTheField) {
  // Reliability row 104.
  const LlamaModel<float> model(testing::small_llama(29));
  const std::vector<index_t> prompt{1, 2};
  EXPECT_THROW_WITH(beam_search(model, prompt, {.num_beams = 0}), ConfigError,
                    "beam_search: num_beams must be >= 1 (got 0)");
  EXPECT_THROW_WITH(beam_search(model, prompt, {.num_beams = 2, .num_return_sequences = 3}),
                    ConfigError,
                    "beam_search: num_return_sequences must be in [1, num_beams = 2] "
                    "(got 3)");
  EXPECT_THROW_WITH(beam_search(model, prompt, {.num_return_sequences = 0}), ConfigError,
                    "num_return_sequences must be in [1, num_beams = 1] (got 0)");
  EXPECT_THROW_WITH(beam_search(model, prompt, {.max_new_tokens = -1}), ConfigError,
                    "beam_search: max_new_tokens must be >= 0 (got -1)");
  EXPECT_THROW_WITH(beam_search(model, prompt, {.eos_token_id = 29}), ConfigError,
                    "beam_search: eos_token_id 29 is outside the vocabulary [0, 29)");
  EXPECT_THROW_WITH(beam_search(model, prompt, {.eos_token_id = -1}), ConfigError,
                    "eos_token_id -1 is outside");
  EXPECT_THROW_WITH(beam_search(model, prompt, {.length_penalty = std::nan("")}), ConfigError,
                    "beam_search: length_penalty must be finite (got nan)");
  EXPECT_THROW_WITH(
      beam_search(model, prompt, {.early_stopping = static_cast<EarlyStopping>(3)}), ConfigError,
      "beam_search: EarlyStopping(3) is out of range (known: heuristic, when_full, never)");
  const GPT2Model<float> one_token(
      {.d_model = 8, .n_layers = 1, .n_heads = 2, .d_ff = 16, .vocab = 1, .context = 4});
  EXPECT_THROW_WITH(beam_search(one_token, std::vector<index_t>{0}, {}), ConfigError,
                    "beam_search: a vocabulary of 1 token has no 2 candidates");
}

TEST(BeamSearchErrors, BadPromptsAreRefused) {
  // Reliability row 105.
  const LlamaModel<float> model(testing::small_llama(29));
  EXPECT_THROW_WITH(beam_search(model, std::vector<index_t>{}, {}), ShapeError,
                    "beam_search: the prompt has 0 tokens; it needs 1 to the context, 12");
  EXPECT_THROW_WITH(beam_search(model, std::vector<index_t>(13, 1), {}), ShapeError,
                    "the prompt has 13 tokens");
  EXPECT_THROW_WITH(beam_search(model, std::vector<index_t>{1, 29}, {.num_beams = 2}), Error,
                    "token 29 at [0, 1] is outside [0, 29)");
}

}  // namespace test_beam_search
}  // namespace dissect
