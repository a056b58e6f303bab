// Tests of dissect/sampling.hpp: greedy and top-1 are the argmax (lowest id on ties), draws
// follow softmax(logits / T) within sampling noise, top-k never leaves the k largest, a seed
// reproduces the draws, and bad options or NaN logits are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "dissect/sampling.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_sampling {

TEST(Sampling, GreedyAndTopOneTakeTheFirstLargest) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  Generator generator(1);
  std::vector<index_t> scratch;
  EXPECT_EQ(sample_token<float>(logits, {.temperature = 0}, generator, scratch), 1);
  EXPECT_EQ(sample_token<float>(logits, {.temperature = 5, .top_k = 1}, generator, scratch), 1);
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
  const std::vector<float> all_minus{-INFINITY, -INFINITY};
  EXPECT_EQ(sample_token<float>(all_minus, {}, generator, scratch), 0);
}

TEST(SamplingErrors, BadOptionsAndNanLogitsAreRefused) {
  Generator generator(3);
  std::vector<index_t> scratch;
  const std::vector<float> logits{0, 1, NAN};
  EXPECT_THROW_WITH(sample_token<float>(logits, {}, generator, scratch), Error,
                    "sample_token: logit of token 2 is NaN");
  EXPECT_THROW_WITH(sample_token<float>({}, {}, generator, scratch), Error, "no logits");
  const std::vector<float> fine{0, 1};
  EXPECT_THROW_WITH(sample_token<float>(fine, {.temperature = -1}, generator, scratch), ConfigError,
                    "temperature must be finite and >= 0 (got -1)");
  EXPECT_THROW_WITH(sample_token<float>(fine, {.temperature = NAN}, generator, scratch),
                    ConfigError, "temperature");
  EXPECT_THROW_WITH(sample_token<float>(fine, {.top_k = -2}, generator, scratch), ConfigError,
                    "top_k must be >= 0 (got -2)");
}

}  // namespace test_sampling
}  // namespace dissect
