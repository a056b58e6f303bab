// The sampler's hot path allocates nothing once its scratch has grown
// (dissect/decoding/sampling.hpp): sample_token with a history and every processor and warper on,
// sampling_distribution into the caller's buffer, and the history-free overload with its vector of
// ids. A binary of the `allocations` group, whose operator new counts calls
// (support/counting_new.cpp); the sampler's values are tested in test_sampling.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "dissect/decoding/sampling.hpp"
#include "support/allocation_counter.hpp"

namespace dissect {
namespace test_sampling_allocations {

TEST(SamplingAllocations, NoneOnceTheScratchHasGrown) {
  std::mt19937_64 engine(1);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(5000);
  for (float& l : logits) l = normal(engine);
  std::vector<index_t> tokens(300);
  for (index_t& id : tokens) id = static_cast<index_t>(engine() % logits.size());
  const TokenHistory history{tokens, 120};
  const SamplingOptions all{.temperature = 0.9,
                            .top_k = 400,
                            .top_p = 0.9,
                            .min_p = 0.001,
                            .repetition_penalty = 1.3,
                            .frequency_penalty = 0.2,
                            .presence_penalty = 0.1};
  const SamplingOptions nucleus{.top_p = 0.95};  // no top-k: top-p partitions all 5000
  Generator generator(2);
  SamplingScratch scratch;
  std::vector<double> probabilities(logits.size());
  std::vector<index_t> ids;
  const auto run = [&] {
    index_t sum = 0;
    for (const SamplingOptions& options : {all, nucleus, SamplingOptions{.temperature = 0}}) {
      sum += sample_token<float>(logits, options, history, generator, scratch);
      sampling_distribution<float>(logits, options, history, probabilities, scratch);
      sum += sample_token<float>(logits, options, generator, ids);
    }
    return sum;
  };
  (void)run();  // grows the buffers to V
  const long before = testing::allocation_count();
  index_t sum = 0;
  for (int i = 0; i < 20; ++i) sum += run();
  EXPECT_EQ(testing::allocation_count(), before);
  EXPECT_GE(sum, 0);
}

}  // namespace test_sampling_allocations
}  // namespace dissect
