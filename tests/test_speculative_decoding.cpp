// Tests of dissect/models/speculative_decoding.hpp: greedy speculative decoding returns the
// target's own greedy generate(), token for token, for every γ, with a draft of another size or
// family and with the target as its own draft (every proposal accepted); both KV caches hold
// exactly the kept positions after each round; sampled, the tokens follow the target's
// distribution (a chi-square test over seeded runs against the exact joint distribution of two
// tokens, computed from full forwards, with negative controls that the same test rejects); bad
// drafts and options are refused (reliability rows 106, 107).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "dissect/models/generate.hpp"
#include "dissect/models/speculative_decoding.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_speculative_decoding {

constexpr index_t kVocab = 23;

TransformerConfig gpt2(index_t d_model, index_t layers, index_t context = 32,
                       index_t vocab = kVocab) {
  return {.d_model = d_model,
          .n_layers = layers,
          .n_heads = 2,
          .d_ff = 2 * d_model,
          .vocab = vocab,
          .context = context};
}

TransformerConfig llama(index_t context = 32) {
  auto config = testing::small_llama(kVocab);
  config.context = context;
  return config;
}

/// Target-alone greedy generate(), up to and including the first `eos`.
template <class Model>
std::vector<index_t> greedy(const Model& model, const std::vector<index_t>& prompt,
                            index_t max_new_tokens, SamplingOptions sampling = {.temperature = 0},
                            std::optional<index_t> eos = std::nullopt) {
  std::vector<index_t> tokens;
  generate(model, prompt, {.max_new_tokens = max_new_tokens, .sampling = sampling},
           [&](index_t id) { tokens.push_back(id); });
  if (eos) {
    const auto at = std::find(tokens.begin(), tokens.end(), *eos);
    if (at != tokens.end()) tokens.erase(at + 1, tokens.end());
  }
  return tokens;
}

/// Runs the decoder round by round, checking after each that the target's cache holds the
/// sequence but its last token and the draft's at most that (what it fed of the kept tokens);
/// returns the new tokens.
template <class Target, class Draft>
SpeculativeResult run_watching_caches(const Target& target, const Draft& draft,
                                      const std::vector<index_t>& prompt,
                                      const SpeculativeOptions& options) {
  SpeculativeDecoder decoder(target, draft, prompt, options);
  SpeculativeResult result;
  index_t rounds = 0;
  while (!decoder.done()) {
    const index_t before = static_cast<index_t>(decoder.sequence().size());
    const index_t accepted_before = decoder.stats().accepted;
    const index_t proposed_before = decoder.stats().proposed;
    const index_t draft_before = decoder.draft_cache().length();
    const auto tokens = decoder.round();
    ++rounds;
    result.tokens.insert(result.tokens.end(), tokens.begin(), tokens.end());
    const auto length = static_cast<index_t>(decoder.sequence().size());
    const index_t accepted = decoder.stats().accepted - accepted_before;
    EXPECT_EQ(length, before + static_cast<index_t>(tokens.size()));
    EXPECT_LE(static_cast<index_t>(tokens.size()), options.gamma + 1);
    // A round without an EOS returns its accepted proposals and one more token.
    if (!decoder.stats().stopped_at_eos) {
      EXPECT_EQ(static_cast<index_t>(tokens.size()), accepted + 1) << "round " << rounds;
      // The target verified the old sequence and the accepted proposals: prompt + accepted.
      EXPECT_EQ(decoder.target_cache().length(), before + accepted) << "round " << rounds;
    }
    EXPECT_EQ(decoder.target_cache().length(), length - 1) << "round " << rounds;
    EXPECT_LE(decoder.draft_cache().length(), length - 1) << "round " << rounds;
    // The draft caught up with the sequence, then fed its proposals but the last: it keeps the
    // accepted ones among those. Without proposals it ran no forward.
    const index_t proposed = decoder.stats().proposed - proposed_before;
    if (proposed > 0 && !decoder.stats().stopped_at_eos) {
      EXPECT_EQ(decoder.draft_cache().length(), before + std::min(accepted, proposed - 1))
          << "round " << rounds;
    } else if (proposed == 0) {
      EXPECT_EQ(decoder.draft_cache().length(), draft_before) << "round " << rounds;
    }
  }
  EXPECT_EQ(decoder.round().size(), 0u);  // done: nothing more
  EXPECT_EQ(decoder.stats().target_forwards, rounds);
  result.stats = decoder.stats();
  return result;
}

template <class Target, class Draft>
void expect_greedy_equal(const Target& target, const Draft& draft,
                         const std::vector<index_t>& prompt, index_t max_new_tokens,
                         SamplingOptions sampling = {.temperature = 0}) {
  const auto expected = greedy(target, prompt, max_new_tokens, sampling);
  for (const index_t gamma : {1, 2, 4, 50}) {
    SCOPED_TRACE(::testing::Message() << "gamma " << gamma);
    const SpeculativeOptions options{
        .gamma = gamma, .max_new_tokens = max_new_tokens, .sampling = sampling};
    const auto watched = run_watching_caches(target, draft, prompt, options);
    EXPECT_EQ(watched.tokens, expected);
    std::vector<index_t> streamed;
    const auto result = speculative_generate(target, draft, prompt, options,
                                             [&](index_t id) { streamed.push_back(id); });
    EXPECT_EQ(result.tokens, expected);
    EXPECT_EQ(streamed, expected);
    EXPECT_EQ(result.stats.new_tokens, static_cast<index_t>(expected.size()));
    EXPECT_LE(result.stats.accepted, result.stats.proposed);
    EXPECT_LE(result.stats.proposed, gamma * result.stats.target_forwards);
    EXPECT_EQ(result.stats.draft_forwards, result.stats.proposed);
  }
}

TEST(SpeculativeDecoding, GreedyIsTheTargetsGreedyTokenForToken) {
  const std::vector<index_t> prompt{4, 17, 2, 9};
  // GPT-2 target, a smaller GPT-2 draft; LLaMA target, GPT-2 draft (another family: only the
  // vocabulary must agree); and the other way round, in float.
  const GPT2Model<double> gpt2_target(gpt2(16, 2), {.init_std = 0.5, .seed = 3});
  const GPT2Model<double> gpt2_draft(gpt2(8, 1), {.init_std = 0.5, .seed = 11});
  const LlamaModel<double> llama_target(llama(), {.init_std = 0.5, .seed = 5});
  const GPT2Model<float> float_target(gpt2(16, 2), {.init_std = 0.5, .seed = 7});
  const LlamaModel<float> float_draft(llama(), {.init_std = 0.5, .seed = 13});
  {
    SCOPED_TRACE("gpt2 target, gpt2 draft");
    expect_greedy_equal(gpt2_target, gpt2_draft, prompt, 12);
  }
  {
    SCOPED_TRACE("llama target, gpt2 draft");
    expect_greedy_equal(llama_target, gpt2_draft, prompt, 12);
  }
  {
    SCOPED_TRACE("float gpt2 target, float llama draft");
    expect_greedy_equal(float_target, float_draft, prompt, 12);
  }
  {
    // The penalties read the history each position has, proposals included.
    SCOPED_TRACE("penalties");
    expect_greedy_equal(llama_target, gpt2_draft, prompt, 12,
                        {.temperature = 0,
                         .repetition_penalty = 1.8,
                         .frequency_penalty = 0.5,
                         .presence_penalty = 0.3});
  }
  // Not a vacuous comparison: the draft alone would have said something else, so some proposals
  // were rejected and the target's corrections returned.
  EXPECT_NE(greedy(gpt2_draft, prompt, 12), greedy(gpt2_target, prompt, 12));
  const auto mixed =
      speculative_generate(gpt2_target, gpt2_draft, prompt,
                           {.gamma = 4, .max_new_tokens = 12, .sampling = {.temperature = 0}});
  EXPECT_LT(mixed.stats.accepted, mixed.stats.proposed);
}

TEST(SpeculativeDecoding, TheTargetAsItsOwnDraftHasEveryProposalAccepted) {
  const LlamaModel<double> target(llama(), {.init_std = 0.5, .seed = 5});
  const std::vector<index_t> prompt{1, 2, 3};
  expect_greedy_equal(target, target, prompt, 21);
  for (const index_t gamma : {1, 2, 4, 6}) {
    const auto result = speculative_generate(
        target, target, prompt,
        {.gamma = gamma, .max_new_tokens = 21, .sampling = {.temperature = 0}});
    EXPECT_EQ(result.stats.accepted, result.stats.proposed);
    EXPECT_DOUBLE_EQ(result.stats.acceptance_rate(), 1.0);
    // Every round returns γ + 1 tokens but the last: ⌈21 / (γ + 1)⌉ target forwards.
    EXPECT_EQ(result.stats.target_forwards, (21 + gamma) / (gamma + 1)) << "gamma " << gamma;
  }
  // Sampled, too: p = q, so min(1, p/q) = 1 whatever is drawn.
  const auto sampled =
      speculative_generate(target, target, prompt, {.gamma = 3, .max_new_tokens = 21, .seed = 9});
  EXPECT_EQ(sampled.stats.accepted, sampled.stats.proposed);
}

TEST(SpeculativeDecoding, TheContextEOSAndAShortDraftContextAreHandled) {
  const GPT2Model<double> target(gpt2(16, 2, 12), {.init_std = 0.5, .seed = 3});
  const GPT2Model<double> draft(gpt2(8, 1, 12), {.init_std = 0.5, .seed = 11});
  const std::vector<index_t> prompt{4, 17, 2, 9, 1};
  // 5 prompt positions + 7 fed = the context of 12; the 8th token is only returned.
  expect_greedy_equal(target, draft, prompt, 50);
  const auto full = speculative_generate(
      target, draft, prompt, {.gamma = 3, .max_new_tokens = 50, .sampling = {.temperature = 0}});
  EXPECT_EQ(full.tokens.size(), 8u);
  EXPECT_TRUE(full.stats.stopped_at_context);

  // A draft of context 7: it proposes while the sequence fits it, then the target goes alone.
  const GPT2Model<double> short_draft(gpt2(8, 1, 7), {.init_std = 0.5, .seed = 11});
  expect_greedy_equal(target, short_draft, prompt, 50);
  // A prompt longer than the draft's context: the draft never proposes.
  const std::vector<index_t> long_prompt{4, 17, 2, 9, 1, 5, 6, 8};
  const auto alone =
      speculative_generate(target, short_draft, long_prompt,
                           {.gamma = 3, .max_new_tokens = 4, .sampling = {.temperature = 0}});
  EXPECT_EQ(alone.tokens, greedy(target, long_prompt, 4));
  EXPECT_EQ(alone.stats.proposed, 0);
  EXPECT_EQ(alone.stats.target_forwards, 4);

  // EOS inside an accepted run: the target as its own draft accepts all γ = 4, and the third
  // greedy token is made the EOS; the run returns it and stops there.
  const auto expected = greedy(target, prompt, 7);
  const index_t eos = expected[2];
  const auto first =
      static_cast<std::size_t>(std::find(expected.begin(), expected.end(), eos) - expected.begin());
  const SpeculativeOptions options{
      .gamma = 4, .max_new_tokens = 7, .sampling = {.temperature = 0}, .eos_token_id = eos};
  const auto stopped = run_watching_caches(target, target, prompt, options);
  EXPECT_EQ(stopped.tokens, std::vector<index_t>(expected.begin(), expected.begin() + first + 1));
  EXPECT_TRUE(stopped.stats.stopped_at_eos);
  EXPECT_FALSE(stopped.stats.stopped_at_context);
  EXPECT_EQ(stopped.stats.target_forwards, 1);
  // max_new_tokens = 0: nothing, no forward.
  const auto none = speculative_generate(target, draft, prompt, {.max_new_tokens = 0});
  EXPECT_TRUE(none.tokens.empty());
  EXPECT_EQ(none.stats.target_forwards, 0);
}

// ---- the distribution of sampled tokens ---------------------------------------------------------

constexpr index_t kSmallVocab = 6;

/// The exact joint distribution of the first two tokens generate() would draw from `model`
/// after `prompt`: p1(a) · p2(b | prompt, a), each row from a full forward (no KV cache) and
/// sampling_distribution with the history of its position. [V · V], index a·V + b.
template <class Model>
std::vector<double> exact_joint(const Model& model, const std::vector<index_t>& prompt,
                                const SamplingOptions& sampling, bool with_history = true) {
  const auto last_row = [&](const std::vector<index_t>& ids) {
    const auto logits = model.forward(TokenBatch{ids, 1, static_cast<index_t>(ids.size())});
    const auto* row = logits.data() + (logits.dim(1) - 1) * kSmallVocab;
    const TokenHistory history{
        with_history ? std::span<const index_t>(ids) : std::span<const index_t>(),
        with_history ? static_cast<index_t>(prompt.size()) : 0};
    return sampling_distribution(std::span<const double>(row, kSmallVocab), sampling, history);
  };
  const auto first = last_row(prompt);
  std::vector<double> joint(kSmallVocab * kSmallVocab);
  for (index_t a = 0; a < kSmallVocab; ++a) {
    auto ids = prompt;
    ids.push_back(a);
    const auto second = last_row(ids);
    for (index_t b = 0; b < kSmallVocab; ++b) {
      joint[static_cast<std::size_t>(a * kSmallVocab + b)] =
          first[static_cast<std::size_t>(a)] * second[static_cast<std::size_t>(b)];
    }
  }
  return joint;
}

/// Pearson's chi-square of `counts` against `probabilities` over n draws, cells expected fewer
/// than 5 times pooled into one (the rule of thumb for the chi-square approximation). A cell of
/// probability 0 that was drawn makes the statistic infinite. Returns {statistic, df}.
std::pair<double, index_t> chi_square(const std::vector<index_t>& counts,
                                      const std::vector<double>& probabilities, index_t n) {
  double statistic = 0, pooled_expected = 0, pooled_observed = 0;
  index_t cells = 0;
  for (std::size_t i = 0; i < counts.size(); ++i) {
    const double expected = probabilities[i] * static_cast<double>(n);
    const auto observed = static_cast<double>(counts[i]);
    if (probabilities[i] == 0) {
      if (observed > 0) return {INFINITY, 1};
      continue;
    }
    if (expected < 5) {
      pooled_expected += expected;
      pooled_observed += observed;
      continue;
    }
    statistic += (observed - expected) * (observed - expected) / expected;
    ++cells;
  }
  if (pooled_expected > 0) {
    statistic +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++cells;
  }
  return {statistic, cells - 1};
}

/// The chi-square distribution's upper α = 10⁻³ quantile for df degrees of freedom, by Wilson and
/// Hilferty's cube-root normal approximation (z = 3.0902 for 10⁻³); within 1 % of the exact
/// quantile for df ≥ 10 (df 30: 59.70 against the table's 59.70; df 10: 29.64 against 29.59).
double critical_value(index_t df) {
  const double z = 3.0902, k = static_cast<double>(df);
  const double c = 1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k));
  return k * c * c * c;
}

/// Counts of the first two tokens over `runs` seeded runs of `draw(seed)`.
template <class Draw>
std::vector<index_t> joint_counts(index_t runs, Draw&& draw) {
  std::vector<index_t> counts(kSmallVocab * kSmallVocab);
  for (index_t run = 0; run < runs; ++run) {
    const auto tokens = draw(static_cast<std::uint64_t>(run) * 7919 + 1);
    ++counts[static_cast<std::size_t>(tokens.at(0) * kSmallVocab + tokens.at(1))];
  }
  return counts;
}

TEST(SpeculativeDecodingDistribution, SampledTokensFollowTheTargetsDistribution) {
  // V = 6, two random models whose distributions differ substantially (checked below), with
  // the repetition penalty and a temperature, so that each position's history matters.
  const GPT2Model<double> target(gpt2(8, 1, 16, kSmallVocab), {.init_std = 1.0, .seed = 21});
  const GPT2Model<double> draft(gpt2(8, 1, 16, kSmallVocab), {.init_std = 1.0, .seed = 34});
  const std::vector<index_t> prompt{1, 4, 1};
  const SamplingOptions sampling{.temperature = 0.9, .repetition_penalty = 2.0};
  const auto expected = exact_joint(target, prompt, sampling);
  const auto draft_joint = exact_joint(draft, prompt, sampling);
  double distance = 0;  // total variation between the draft's and the target's joints
  for (std::size_t i = 0; i < expected.size(); ++i) {
    distance += std::abs(expected[i] - draft_joint[i]) / 2;
  }
  EXPECT_GT(distance, 0.3);

  constexpr index_t runs = 1500;
  // γ = 1, 2 tokens: the first is the accepted proposal or a correction, the second a draw from
  // p_2 (all accepted) or the next round's target alone. γ = 2, 3 tokens (the first round
  // proposes 2): each of the two may be an accepted proposal or a correction from the residual.
  for (const index_t gamma : {1, 2}) {
    SCOPED_TRACE(::testing::Message() << "gamma " << gamma);
    index_t proposed = 0, accepted = 0;
    const auto counts = joint_counts(runs, [&](std::uint64_t seed) {
      const auto result = speculative_generate(
          target, draft, prompt,
          {.gamma = gamma, .max_new_tokens = gamma + 1, .sampling = sampling, .seed = seed});
      proposed += result.stats.proposed;
      accepted += result.stats.accepted;
      return result.tokens;
    });
    // Both branches of the rule ran many times: acceptance and rejection.
    EXPECT_GT(accepted, proposed / 10);
    EXPECT_LT(accepted, proposed * 9 / 10);
    const auto [statistic, df] = chi_square(counts, expected, runs);
    std::printf("gamma %d: chi-square %.1f on %d degrees of freedom (critical %.1f at 1e-3)\n",
                static_cast<int>(gamma), statistic, static_cast<int>(df), critical_value(df));
    EXPECT_GE(df, 10);
    EXPECT_LT(statistic, critical_value(df)) << "df " << df;

    // Negative control: the same tokens against the distribution with the penalties' history
    // left out, which the test must tell apart.
    const auto no_history = exact_joint(target, prompt, sampling, false);
    const auto [wrong, wrong_df] = chi_square(counts, no_history, runs);
    std::printf("  against the distribution without the history: %.1f on %d (critical %.1f)\n",
                wrong, static_cast<int>(wrong_df), critical_value(wrong_df));
    EXPECT_GT(wrong, critical_value(wrong_df)) << "df " << wrong_df;
  }

  // Negative control: the draft alone (generate() of the draft model), which a rule that
  // accepted every proposal would return, is rejected by the same test.
  const auto draft_counts = joint_counts(runs, [&](std::uint64_t seed) {
    std::vector<index_t> tokens;
    generate(draft, prompt, {.max_new_tokens = 2, .sampling = sampling, .seed = seed},
             [&](index_t id) { tokens.push_back(id); });
    return tokens;
  });
  const auto [statistic, df] = chi_square(draft_counts, expected, runs);
  std::printf("the draft alone: chi-square %.1f on %d (critical %.1f)\n", statistic,
              static_cast<int>(df), critical_value(df));
  EXPECT_GT(statistic, critical_value(df)) << "df " << df;
}

TEST(SpeculativeDecodingDistribution, TopKZerosStayZero) {
  // With top-k = 2 most tokens have probability 0 under the target; a draft allowed other
  // tokens proposes them, and none may come out (the residual never puts mass there).
  const GPT2Model<double> target(gpt2(8, 1, 16, kSmallVocab), {.init_std = 1.0, .seed = 21});
  const GPT2Model<double> draft(gpt2(8, 1, 16, kSmallVocab), {.init_std = 1.0, .seed = 34});
  const std::vector<index_t> prompt{1, 4, 1};
  const SamplingOptions sampling{.temperature = 1.0, .top_k = 2};
  const auto expected = exact_joint(target, prompt, sampling);
  constexpr index_t runs = 300;
  const auto counts = joint_counts(runs, [&](std::uint64_t seed) {
    return speculative_generate(
               target, draft, prompt,
               {.gamma = 2, .max_new_tokens = 2, .sampling = sampling, .seed = seed})
        .tokens;
  });
  for (std::size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0) {
      EXPECT_EQ(counts[i], 0) << "cell " << i;
    }
  }
  const auto [statistic, df] = chi_square(counts, expected, runs);
  EXPECT_LT(statistic, critical_value(std::max<index_t>(df, 1))) << "df " << df;
}

// ---- errors -------------------------------------------------------------------------------------

TEST(SpeculativeDecodingErrors, ADraftOfAnotherVocabularyIsRefused) {
  const GPT2Model<float> target(gpt2(16, 1));
  const GPT2Model<float> draft(gpt2(8, 1, 32, kVocab + 1));
  const std::vector<index_t> prompt{1, 2};
  EXPECT_THROW_WITH(speculative_generate(target, draft, prompt, {}), ConfigError,
                    "speculative_generate: the draft's vocabulary has 24 tokens, the target's 23");
  EXPECT_THROW_WITH(SpeculativeDecoder(target, draft, prompt, {}), ConfigError,
                    "the draft must propose the target's token ids");
}

TEST(SpeculativeDecodingErrors, OptionsAndPromptsThatCannotWorkAreRefused) {
  const GPT2Model<float> target(gpt2(16, 1, 12));
  const GPT2Model<float> draft(gpt2(8, 1, 12));
  const std::vector<index_t> prompt{1, 2};
  EXPECT_THROW_WITH(speculative_generate(target, draft, prompt, {.gamma = 0}), ConfigError,
                    "speculative_generate: gamma must be >= 1 (got 0)");
  EXPECT_THROW_WITH(speculative_generate(target, draft, prompt, {.gamma = -3}), ConfigError,
                    "gamma must be >= 1 (got -3)");
  EXPECT_THROW_WITH(speculative_generate(target, draft, prompt, {.max_new_tokens = -1}),
                    ConfigError, "speculative_generate: max_new_tokens must be >= 0 (got -1)");
  EXPECT_THROW_WITH(speculative_generate(target, draft, prompt, {.eos_token_id = kVocab}),
                    ConfigError,
                    "speculative_generate: eos_token_id 23 is outside the vocabulary [0, 23)");
  EXPECT_THROW_WITH(speculative_generate(target, draft, prompt, {.sampling = {.top_p = 0}}),
                    ConfigError, "speculative_generate: top_p must be in (0, 1] (got 0)");
  EXPECT_THROW_WITH(speculative_generate(target, draft, std::vector<index_t>{}, {}), ShapeError,
                    "speculative_generate: the prompt has 0 tokens; it needs 1 to the target's "
                    "context, 12");
  EXPECT_THROW_WITH(speculative_generate(target, draft, std::vector<index_t>(13, 1), {}),
                    ShapeError, "the prompt has 13 tokens");
  EXPECT_THROW_WITH(speculative_generate(target, draft, std::vector<index_t>{1, kVocab}, {}), Error,
                    "token 23 at [0, 1] is outside [0, 23)");
}

}  // namespace test_speculative_decoding
}  // namespace dissect
