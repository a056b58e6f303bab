// Tests of dissect/decoding/sampling.hpp: greedy is the argmax (lowest id on ties), draws follow
// softmax(logits / T) within sampling noise, top-k never leaves the k largest (ties with the k-th
// kept, as Hugging Face), a seed reproduces the draws; the filtered, renormalised distributions
// equal a hand-written torch version of Hugging Face's processors and warpers on fixtures
// (tests/reference/fixtures/sampling), the seeded draw is the inverse CDF of that distribution at
// the generator's uniform; the penalties by hand; top-p, min-p and top-k's defining properties on
// random rows; and bad options or inputs are refused (reliability rows 100 and 101).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "dissect/decoding/sampling.hpp"
#include "support/fixture_testing.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_sampling {

constexpr double inf = std::numeric_limits<double>::infinity();

TEST(Sampling, GreedyTakesTheFirstLargestAndTopOneKeepsItsTies) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  Generator generator(1);
  std::vector<index_t> scratch;
  EXPECT_EQ(sample_token<float>(logits, {.temperature = 0}, generator, scratch), 1);
  // Without a tie, top-1 is the argmax and draws nothing: the generator is where it was.
  const std::vector<float> untied{0.5f, 2.0f, -1.0f, 1.5f};
  Generator before = generator;
  EXPECT_EQ(sample_token<float>(untied, {.temperature = 5, .top_k = 1}, generator, scratch), 1);
  EXPECT_EQ(generator.uniform(), before.uniform());
  // Hugging Face removes scores < the k-th largest: both 2.0s stay, each with half the mass.
  const auto p = sampling_distribution<float>(logits, {.temperature = 5, .top_k = 1});
  EXPECT_EQ(p, (std::vector<double>{0, 0.5, 0, 0.5, 0}));
}

TEST(Sampling, DrawsFollowTheTemperedSoftmax) {
  const std::vector<double> logits{1.0, 0.0, -1.0, 0.5};
  for (double temperature : {1.0, 0.5, 2.0}) {
    SCOPED_TRACE(temperature);
    std::vector<double> p(logits.size());
    double total = 0;
    for (std::size_t i = 0; i < p.size(); ++i) total += p[i] = std::exp(logits[i] / temperature);
    Generator generator(7);
    std::vector<index_t> scratch;
    std::vector<int> counts(logits.size());
    constexpr int draws = 40000;
    for (int i = 0; i < draws; ++i) {
      ++counts[sample_token<double>(logits, {.temperature = temperature}, generator, scratch)];
    }
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double expected = p[i] / total;
      // 5 standard deviations of a binomial proportion: a wrong distribution fails by far more.
      EXPECT_NEAR(double(counts[i]) / draws, expected, 5 * std::sqrt(expected / draws)) << i;
    }
  }
}

TEST(Sampling, TopKDrawsOnlyTheKLargestAndASeedRepeatsItself) {
  const std::vector<float> logits{3, -2, 2.5f, 0, 2.9f, -5, 1};
  std::vector<index_t> first, again, scratch;
  Generator a(11), b(11);
  for (int i = 0; i < 2000; ++i) {
    first.push_back(sample_token<float>(logits, {.temperature = 3, .top_k = 3}, a, scratch));
    again.push_back(sample_token<float>(logits, {.temperature = 3, .top_k = 3}, b, scratch));
  }
  EXPECT_EQ(first, again);
  for (index_t id : first) EXPECT_TRUE(id == 0 || id == 2 || id == 4) << id;
  for (index_t id : {0, 2, 4}) EXPECT_GT(std::count(first.begin(), first.end(), id), 300);
}

TEST(Sampling, InfiniteLogitsHaveALimit) {
  Generator generator(3);
  std::vector<index_t> scratch;
  const std::vector<float> one_infinite{0, INFINITY, 1};
  EXPECT_EQ(sample_token<float>(one_infinite, {}, generator, scratch), 1);
  EXPECT_EQ(sampling_distribution<float>(one_infinite, {}), (std::vector<double>{0, 1, 0}));
  const std::vector<float> all_minus{-INFINITY, -INFINITY};
  EXPECT_EQ(sample_token<float>(all_minus, {}, generator, scratch), 0);
  EXPECT_EQ(sampling_distribution<float>(all_minus, {.top_p = 0.5}), (std::vector<double>{1, 0}));
  // −∞ logits weigh nothing, whatever the filters; the others share the mass.
  const std::vector<double> some_minus{-inf, 0.0, -inf, 0.0};
  EXPECT_EQ(sampling_distribution<double>(some_minus, {.top_p = 1, .min_p = 0.5}),
            (std::vector<double>{0, 0.5, 0, 0.5}));
}

// ---- the penalties, by hand
// -----------------------------------------------------------------------

TEST(Sampling, PenaltiesFollowHuggingFaceAndOpenAIRules) {
  // History: the prompt {0, 1, 0, 3}, then the generated {4, 4, 1}.
  const std::vector<double> logits{2, -1, 0.5, 0, 3};
  const std::vector<index_t> tokens{0, 1, 0, 3, 4, 4, 1};
  const TokenHistory history{tokens, 4};
  // Repetition penalty 2 over all of it, once per token (0 appears twice, still 2 / 2):
  //   0: 2 / 2 = 1;  1: −1 · 2 = −2;  3: 0 / 2 = 0;  4: 3 / 2 = 1.5;  2 (absent): 0.5.
  // Then OpenAI's over the generated only (4 twice, 1 once; 0 and 3 were only in the prompt):
  //   4: 1.5 − 2 · 0.5 − 0.25 = 0.25;  1: −2 − 1 · 0.5 − 0.25 = −2.75.
  const std::vector<double> penalised{1, -2.75, 0.5, 0, 0.25};
  const SamplingOptions options{
      .repetition_penalty = 2, .frequency_penalty = 0.5, .presence_penalty = 0.25};
  std::vector<double> expected(penalised.size());
  double total = 0;
  for (std::size_t i = 0; i < expected.size(); ++i) total += expected[i] = std::exp(penalised[i]);
  for (double& p : expected) p /= total;
  const auto p = sampling_distribution<double>(logits, options, history);
  for (std::size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], expected[i], 1e-15) << i;
  // Greedy sees the penalised logits: 4 (3) would win, the penalties hand it to 0 (1).
  EXPECT_EQ(sampling_distribution<double>(logits, {.temperature = 0}, history),
            (std::vector<double>{0, 0, 0, 0, 1}));
  SamplingOptions greedy = options;
  greedy.temperature = 0;
  EXPECT_EQ(sampling_distribution<double>(logits, greedy, history),
            (std::vector<double>{1, 0, 0, 0, 0}));
  // No penalty, or an empty history: the logits as they are.
  const auto plain = sampling_distribution<double>(logits, {});
  EXPECT_EQ(sampling_distribution<double>(logits, options, {}), plain);
  EXPECT_EQ(sampling_distribution<double>(logits, {}, history), plain);
  // A penalty below 1 rewards: the positive logit grows, the negative one shrinks in size.
  const auto rewarded =
      sampling_distribution<double>(logits, {.repetition_penalty = 0.5}, TokenHistory{tokens, 7});
  EXPECT_GT(rewarded[4], plain[4]);
  EXPECT_GT(rewarded[1] / rewarded[2], plain[1] / plain[2]);  // −1 → −0.5 against 0.5
}

// ---- PyTorch fixtures
// ----------------------------------------------------------------------------

struct FixtureCase {
  std::vector<double> logits, probs;
  std::vector<index_t> history;
  SamplingOptions options;
  index_t prompt_length = 0;
  index_t kept = 0;
};

FixtureCase read_case(const testing::Fixture& fixture) {
  FixtureCase c;
  c.logits = fixture.tensor("logits").values;
  c.probs = fixture.tensor("probs").values;
  for (const double id : fixture.tensor("history").values) c.history.push_back(index_t(id));
  const auto real = [&](const char* key) { return std::stod(fixture.meta_str(key)); };
  c.options = {.temperature = real("temperature"),
               .top_k = fixture.meta_int("top_k"),
               .top_p = real("top_p"),
               .min_p = real("min_p"),
               .repetition_penalty = real("repetition_penalty"),
               .frequency_penalty = real("frequency_penalty"),
               .presence_penalty = real("presence_penalty")};
  c.prompt_length = fixture.meta_int("prompt_length");
  c.kept = fixture.meta_int("kept");
  return c;
}

template <class Scalar>
class SamplingFixtures : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(SamplingFixtures, Scalars);

TYPED_TEST(SamplingFixtures, DistributionsEqualHuggingFacesProcessorsInTorch) {
  using Scalar = TypeParam;
  // torch computes in the fixture's dtype, dissect in double from the same logits: float32's
  // softmax, cumsum and penalties are within a few ulps of 1.2e-7 relative to each probability.
  const double rtol = std::is_same_v<Scalar, float> ? 2e-6 : 1e-13;
  const double atol = std::is_same_v<Scalar, float> ? 1e-8 : 1e-16;
  const int cases = testing::for_each_fixture<Scalar>("sampling", [&](const auto& fixture) {
    const FixtureCase c = read_case(fixture);
    const std::vector<Scalar> logits(c.logits.begin(), c.logits.end());
    const TokenHistory history{c.history, c.prompt_length};
    std::vector<double> p(logits.size());
    SamplingScratch scratch;
    sampling_distribution<Scalar>(logits, c.options, history, p, scratch);
    index_t kept = 0;
    for (std::size_t i = 0; i < p.size(); ++i) {
      // The filters keep exactly torch's tokens (zero is exact on both sides) ...
      EXPECT_EQ(p[i] == 0, c.probs[i] == 0) << "token " << i;
      // ... and renormalise to the same values.
      EXPECT_NEAR(p[i], c.probs[i], atol + rtol * c.probs[i]) << "token " << i;
      kept += p[i] > 0;
    }
    EXPECT_EQ(kept, c.kept);
    EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-14);
  });
  EXPECT_EQ(cases, 19);
}

TYPED_TEST(SamplingFixtures, TheSeededDrawIsTheInverseCdfOfTheDistribution) {
  using Scalar = TypeParam;
  const int cases = testing::for_each_fixture<Scalar>("sampling", [&](const auto& fixture) {
    const FixtureCase c = read_case(fixture);
    const std::vector<Scalar> logits(c.logits.begin(), c.logits.end());
    const TokenHistory history{c.history, c.prompt_length};
    SamplingScratch scratch;
    int checked = 0;
    for (std::uint64_t seed = 0; seed < 300; ++seed) {
      Generator generator(seed), twin(seed);
      const index_t id = sample_token<Scalar>(logits, c.options, history, generator, scratch);
      if (c.kept == 1) {
        EXPECT_EQ(c.probs[static_cast<std::size_t>(id)], 1.0);
        EXPECT_EQ(generator.uniform(), twin.uniform()) << "one token left: no draw";
        continue;
      }
      // The first token (in id order) whose cumulative probability passes the uniform. A
      // uniform within float32's rounding of a boundary could go either way: skipped.
      const double u = twin.uniform();
      double cumulative = 0;
      index_t expected = -1;
      bool near_boundary = false;
      for (std::size_t i = 0; i < c.probs.size(); ++i) {
        cumulative += c.probs[i];
        if (c.probs[i] > 0 && std::abs(cumulative - u) < 1e-5) near_boundary = true;
        if (expected < 0 && u < cumulative) expected = static_cast<index_t>(i);
      }
      if (near_boundary) continue;
      EXPECT_EQ(id, expected) << "seed " << seed << ", u = " << u;
      EXPECT_GT(c.probs[static_cast<std::size_t>(id)], 0.0);
      ++checked;
      // The same seed, the same draw.
      Generator replay(seed);
      EXPECT_EQ(sample_token<Scalar>(logits, c.options, history, replay, scratch), id);
    }
    if (c.kept > 1) EXPECT_GT(checked, 250);
  });
  EXPECT_EQ(cases, 19);
}

// ---- what the filters promise, on random rows
// ----------------------------------------------------

TEST(Sampling, FiltersKeepWhatTheyPromiseOnRandomRows) {
  std::mt19937_64 engine(29);
  std::normal_distribution<double> normal(0.0, 2.0);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  SamplingScratch scratch;
  for (int trial = 0; trial < 400; ++trial) {
    SCOPED_TRACE(trial);
    const index_t vocab = 1 + static_cast<index_t>(engine() % 60);
    std::vector<double> logits(static_cast<std::size_t>(vocab));
    for (double& l : logits) l = normal(engine);
    const double temperature = 0.3 + 2 * unit(engine);
    // softmax(l / T) over every token: the reference each filter is stated against.
    std::vector<double> full(logits.size());
    const double top = *std::max_element(logits.begin(), logits.end());
    double total = 0;
    for (std::size_t i = 0; i < full.size(); ++i) {
      total += full[i] = std::exp((logits[i] - top) / temperature);
    }
    for (double& p : full) p /= total;
    const double p_max = *std::max_element(full.begin(), full.end());

    std::vector<double> p(logits.size());
    const auto run = [&](const SamplingOptions& options) {
      sampling_distribution<double>(logits, options, {}, p, scratch);
      EXPECT_NEAR(std::accumulate(p.begin(), p.end(), 0.0), 1.0, 1e-12);
      // Renormalised: every kept token keeps its share relative to the others.
      double kept_mass = 0;
      for (std::size_t i = 0; i < p.size(); ++i) kept_mass += p[i] > 0 ? full[i] : 0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        if (p[i] > 0) EXPECT_NEAR(p[i], full[i] / kept_mass, 1e-12);
      }
      // Nothing kept is less probable than something removed.
      double least_kept = 1, most_removed = 0;
      for (std::size_t i = 0; i < p.size(); ++i) {
        if (p[i] > 0) {
          least_kept = std::min(least_kept, full[i]);
        } else {
          most_removed = std::max(most_removed, full[i]);
        }
      }
      EXPECT_GE(least_kept, most_removed);
      return std::pair{kept_mass, least_kept};
    };

    // top-p: the smallest set of the most probable tokens whose mass reaches top_p.
    const double top_p = 0.05 + 0.9 * unit(engine);
    const auto [mass, smallest] = run({.temperature = temperature, .top_p = top_p});
    EXPECT_GE(mass, top_p - 1e-12);
    EXPECT_LT(mass - smallest, top_p + 1e-12) << "one token fewer would still reach top_p";

    // min-p: exactly the tokens with p >= min_p · p_max.
    const double min_p = unit(engine);
    run({.temperature = temperature, .min_p = min_p});
    for (std::size_t i = 0; i < p.size(); ++i) {
      const double ratio = full[i] / p_max;
      if (std::abs(ratio - min_p) < 1e-12) continue;  // the threshold itself: rounding decides
      EXPECT_EQ(p[i] > 0, ratio >= min_p) << "token " << i << ", ratio " << ratio;
    }

    // top-k (random normals do not tie): exactly min(k, V) tokens.
    const index_t top_k = 1 + static_cast<index_t>(engine() % 70);
    run({.temperature = temperature, .top_k = top_k});
    EXPECT_EQ(std::count_if(p.begin(), p.end(), [](double v) { return v > 0; }),
              std::min(top_k, vocab));

    // top_p = 1, min_p = 0 and top_k >= V keep every token: plain softmax(l / T).
    run({.temperature = temperature, .top_k = vocab + 3, .top_p = 1, .min_p = 0});
    for (std::size_t i = 0; i < p.size(); ++i) EXPECT_NEAR(p[i], full[i], 1e-12);

    // A tiny top_p keeps one token: the most probable (min_tokens_to_keep = 1).
    run({.temperature = temperature, .top_p = 1e-9});
    const auto first_largest = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(p[static_cast<std::size_t>(first_largest)], 1.0);
  }
}

TEST(Sampling, ScratchIsReusedAcrossCalls) {
  // After the first call the buffers have their size: later calls write into the same memory.
  std::mt19937_64 engine(3);
  std::normal_distribution<float> normal;
  std::vector<float> logits(500);
  for (float& l : logits) l = normal(engine);
  const std::vector<index_t> tokens{4, 9, 4, 100, 7};
  const SamplingOptions options{.temperature = 0.9,
                                .top_k = 50,
                                .top_p = 0.9,
                                .min_p = 0.01,
                                .repetition_penalty = 1.3,
                                .frequency_penalty = 0.2,
                                .presence_penalty = 0.1};
  Generator generator(5);
  SamplingScratch scratch;
  (void)sample_token<float>(logits, options, {tokens, 2}, generator, scratch);
  const auto* order = scratch.order.data();
  const auto* values = scratch.values.data();
  const auto* counts = scratch.counts.data();
  for (int i = 0; i < 100; ++i) {
    (void)sample_token<float>(logits, options, {tokens, 2}, generator, scratch);
  }
  EXPECT_EQ(scratch.order.data(), order);
  EXPECT_EQ(scratch.values.data(), values);
  EXPECT_EQ(scratch.counts.data(), counts);
  // The occurrence counts are left at zero for the next call.
  EXPECT_TRUE(
      std::all_of(scratch.counts.begin(), scratch.counts.end(), [](index_t n) { return n == 0; }));
}

// ---- errors (reliability rows 100, 101) ---------------------------------------------------------

TEST(SamplingErrors, BadOptionsAreConfigErrorsNamingTheField) {
  Generator generator(3);
  std::vector<index_t> scratch;
  const std::vector<float> fine{0, 1};
  const auto refuses = [&](const SamplingOptions& options, const char* message) {
    EXPECT_THROW_WITH(sample_token<float>(fine, options, generator, scratch), ConfigError, message);
    EXPECT_THROW_WITH(sampling_distribution<float>(fine, options), ConfigError, message);
  };
  refuses({.temperature = -1}, "temperature must be finite and >= 0 (got -1)");
  EXPECT_THROW_WITH(sample_token<float>(fine, {.top_p = 2}, generator, scratch), ConfigError,
                    "sample_token: top_p");
  EXPECT_THROW_WITH(sampling_distribution<float>(fine, {.min_p = 2}), ConfigError,
                    "sampling_distribution: min_p");
  refuses({.temperature = NAN}, "temperature");
  refuses({.temperature = INFINITY}, "temperature");
  refuses({.top_k = -2}, "top_k must be >= 0 (got -2)");
  refuses({.top_p = 0}, "top_p must be in (0, 1] (got 0)");
  refuses({.top_p = 1.5}, "top_p must be in (0, 1] (got 1.5)");
  refuses({.top_p = -0.1}, "top_p must be in (0, 1]");
  refuses({.top_p = NAN}, "top_p must be in (0, 1] (got nan)");
  refuses({.min_p = -0.1}, "min_p must be in [0, 1] (got -0.1)");
  refuses({.min_p = 1.01}, "min_p must be in [0, 1] (got 1.01)");
  refuses({.min_p = NAN}, "min_p must be in [0, 1] (got nan)");
  refuses({.repetition_penalty = 0}, "repetition_penalty must be finite and > 0 (got 0)");
  refuses({.repetition_penalty = -1.2}, "repetition_penalty must be finite and > 0 (got -1.2)");
  refuses({.repetition_penalty = NAN}, "repetition_penalty must be finite and > 0 (got nan)");
  refuses({.repetition_penalty = INFINITY}, "repetition_penalty must be finite and > 0 (got inf)");
  refuses({.frequency_penalty = NAN}, "frequency_penalty must be finite (got nan)");
  refuses({.frequency_penalty = -INFINITY}, "frequency_penalty must be finite (got -inf)");
  refuses({.presence_penalty = NAN}, "presence_penalty must be finite (got nan)");
  refuses({.presence_penalty = INFINITY}, "presence_penalty must be finite (got inf)");
  // The edges of each range are valid.
  for (const SamplingOptions& valid :
       {SamplingOptions{.top_p = 1}, SamplingOptions{.top_p = 1e-300}, SamplingOptions{.min_p = 0},
        SamplingOptions{.min_p = 1}, SamplingOptions{.repetition_penalty = 1e-9},
        SamplingOptions{.frequency_penalty = -2}, SamplingOptions{.presence_penalty = 2}}) {
    EXPECT_NO_THROW(check_sampling("test", valid));
  }
}

TEST(SamplingErrors, BadLogitsAndHistoriesAreRefusedNamingThePlace) {
  Generator generator(3);
  std::vector<index_t> ids;
  SamplingScratch scratch;
  const std::vector<float> logits{0, 1, NAN};
  EXPECT_THROW_WITH(sample_token<float>(logits, {}, generator, ids), Error,
                    "sample_token: logit of token 2 is NaN");
  EXPECT_THROW_WITH(sampling_distribution<float>(logits, {}), Error,
                    "sampling_distribution: logit of token 2 is NaN");
  EXPECT_THROW_WITH(sample_token<float>({}, {}, generator, ids), Error, "no logits");
  const std::vector<float> fine{0, 1, 2};
  const std::vector<index_t> outside{0, 2, 3, 1};
  EXPECT_THROW_WITH(sample_token<float>(fine, {}, {outside, 1}, generator, scratch), Error,
                    "sample_token: history token 2 has id 3, outside the vocabulary [0, 3)");
  const std::vector<index_t> negative{-1};
  EXPECT_THROW_WITH(sampling_distribution<float>(fine, {}, {negative, 0}), Error,
                    "history token 0 has id -1, outside the vocabulary [0, 3)");
  const std::vector<index_t> two{0, 1};
  EXPECT_THROW_WITH(sampling_distribution<float>(fine, {}, {two, 3}), Error,
                    "the history's prompt_length 3 is outside [0, 2], its number of tokens");
  EXPECT_THROW_WITH(sampling_distribution<float>(fine, {}, {two, -1}), Error,
                    "prompt_length -1 is outside [0, 2]");
  std::vector<double> short_output(2, -7.0);
  EXPECT_THROW_WITH(sampling_distribution<float>(fine, {}, {}, short_output, scratch), ShapeError,
                    "sampling_distribution: probabilities has 2 entries for 3 logits");
  EXPECT_EQ(short_output, (std::vector<double>{-7.0, -7.0}));  // nothing written
  // The generator moves only when a token is drawn: a refused call leaves it alone.
  Generator untouched(3);
  EXPECT_EQ(generator.uniform(), untouched.uniform());
}

}  // namespace test_sampling
}  // namespace dissect
