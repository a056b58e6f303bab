// Tests for dissect/training/alignment_loss.hpp: DPO, PPO and GRPO against plain-torch references
// with autograd (fixtures in float32 and float64, ragged masks with padded targets), finite
// differences in double of each loss's gradient with respect to the logits (and PPO's values),
// the algebra each paper implies (a policy equal to its reference, a ratio of 1, advantages that
// sum to 0 per group), and every bad input with its type and message (reliability rows 102, 103).
#include "dissect/training/alignment_loss.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_alignment_loss {

using testing::random_tensor;

/// Random responses as the fixtures draw them: logits [N, T, V], a mask whose rows select a
/// prompt of 0-2 masked tokens, then 1.. response tokens, then padding; padded targets −100.
struct Responses {
  Tensor<double, 3> logits;
  std::vector<index_t> targets;
  Tensor<double, 2> mask;
};

Responses random_responses(index_t n, index_t t, index_t v, std::mt19937_64& engine) {
  Responses r{
      random_tensor<double>(Shape<3>{n, t, v}, engine, -3, 3), {}, Tensor<double, 2>({n, t})};
  for (index_t row = 0; row < n; ++row) {
    const index_t prompt = static_cast<index_t>(engine() % 3);
    const index_t length =
        1 + static_cast<index_t>(engine() % static_cast<std::uint64_t>(t - prompt));
    for (index_t col = 0; col < t; ++col) {
      const bool selected = col >= prompt && col < prompt + length;
      r.mask(row, col) = selected ? 1.0 : 0.0;
      r.targets.push_back(selected ? static_cast<index_t>(engine() % static_cast<std::uint64_t>(v))
                                   : -100);
    }
  }
  return r;
}

// ---- sequence log-probabilities ----------------------------------------------------------------

TEST(SequenceLogProbs, SelectedTokensAreLogSoftmaxAndTheRestIsNeverRead) {
  std::mt19937_64 engine(1);
  auto r = random_responses(3, 6, 5, engine);
  const auto expected_log_softmax = log_softmax(r.logits);
  // NaN logits and the padding id −100 where the mask is 0 must not reach any result.
  for (index_t n = 0; n < 3; ++n) {
    for (index_t t = 0; t < 6; ++t) {
      if (r.mask(n, t) == 0.0) {
        for (index_t c = 0; c < 5; ++c)
          r.logits(n, t, c) = std::numeric_limits<double>::quiet_NaN();
      }
    }
  }
  const auto lp = sequence_log_probs(r.logits, r.targets, r.mask);
  for (index_t n = 0; n < 3; ++n) {
    double sum = 0;
    for (index_t t = 0; t < 6; ++t) {
      const index_t i = n * 6 + t;
      const double expected =
          r.mask(n, t) == 1.0 ? expected_log_softmax(n, t, r.targets[static_cast<std::size_t>(i)])
                              : 0.0;
      EXPECT_EQ(lp.token(n, t), expected) << n << ", " << t;
      sum += expected;
    }
    EXPECT_NEAR(lp.sequence(n), sum, 1e-14);
  }
  Tensor<double, 1> dsequence({3}, {1.0, -2.0, 0.5});
  const auto dlogits = sequence_log_probs_backward(r.logits, r.targets, r.mask, dsequence);
  for (index_t i = 0; i < dlogits.size(); ++i) ASSERT_FALSE(std::isnan(dlogits.data()[i])) << i;
}

TEST(SequenceLogProbs, BackwardMatchesFiniteDifferences) {
  std::mt19937_64 engine(2);
  auto r = random_responses(4, 5, 7, engine);
  const auto dsequence = random_tensor<double>(Shape<1>{4}, engine);
  const auto dtoken = random_tensor<double>(Shape<2>{4, 5}, engine);
  const auto dlogits = sequence_log_probs_backward(r.logits, r.targets, r.mask, dsequence);
  EXPECT_GRADIENT_OK(testing::gradcheck(
      [&] {
        const auto lp = sequence_log_probs(r.logits, r.targets, r.mask);
        double total = 0;
        for (index_t n = 0; n < 4; ++n) total += dsequence(n) * lp.sequence(n);
        return total;
      },
      r.logits, dlogits));
  const auto dlogits_token = token_log_probs_backward(r.logits, r.targets, r.mask, dtoken);
  EXPECT_GRADIENT_OK(testing::gradcheck(
      [&] {
        const auto lp = sequence_log_probs(r.logits, r.targets, r.mask);
        double total = 0;
        for (index_t i = 0; i < lp.token.size(); ++i)
          total += dtoken.data()[i] * lp.token.data()[i];
        return total;
      },
      r.logits, dlogits_token));
}

TEST(SequenceLogProbs, HugeLogitsNeitherOverflowNorLoseTheAnswer) {
  // Row 0 of each token: logits {1e4, 0, -1e4}: p = (1, e^-1e4, 0), so log p[target 1] = −1e4
  // exactly in float, and the entropy is 0; exp(1e4) would overflow without the shift by the max.
  Tensor<float, 3> logits({1, 2, 3}, {1e4f, 0.0f, -1e4f, 1e4f, 0.0f, -1e4f});
  const Tensor<float, 2> mask({1, 2}, {1.0f, 1.0f});
  const std::vector<index_t> targets{1, 0};
  const auto lp = sequence_log_probs(logits, targets, mask);
  EXPECT_EQ(lp.token(0, 0), -1e4f);
  EXPECT_EQ(lp.token(0, 1), 0.0f);
  EXPECT_EQ(lp.sequence(0), -1e4f);
  const Tensor<float, 2> zeros({1, 2});
  const auto ppo = ppo_loss(logits, targets, mask, {lp.token, zeros, zeros, zeros, {}}, {});
  EXPECT_EQ(ppo.entropy, 0.0f);
  for (const float d : ppo.dlogits) EXPECT_TRUE(std::isfinite(d));
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

template <class Scalar>
class AlignmentTyped : public ::testing::Test {};
TYPED_TEST_SUITE(AlignmentTyped, testing::FloatAndDouble);

/// Tolerances against torch, relative with an equal absolute floor: the values are O(0.01-10)
/// and each side rounds a log-softmax and sums of at most 30 terms (torch in the fixture's
/// dtype, dissect partly in double), a few dozen ulps at most. Measured on this machine: within
/// 1e-6 in float32 (≈ 16 ulps) and 2e-15 in float64; the bounds leave a factor 4-50 for another
/// libm, and none for a wrong term (a missing 1/N or a flipped sign moves entries by ~10%).
template <class Scalar>
constexpr double fixture_tol() {
  return std::is_same_v<Scalar, float> ? 4e-6 : 1e-13;
}

template <class Scalar>
struct FixtureReader {
  const testing::Fixture& fixture;
  template <std::size_t Rank>
  Tensor<Scalar, Rank> tensor(const char* name) const {
    return testing::tensor_from<Scalar, Rank>(fixture.tensor(name));
  }
  Scalar scalar(const char* name) const { return tensor<1>(name)(0); }
  std::vector<index_t> targets(const char* name) const {
    std::vector<index_t> ids;
    for (const double v : fixture.tensor(name).values) ids.push_back(static_cast<index_t>(v));
    return ids;
  }
  double meta(const char* key) const { return std::stod(fixture.meta_str(key)); }
};

template <class Scalar>
void expect_near(Scalar actual, Scalar expected, const char* what) {
  const double tol = fixture_tol<Scalar>();
  EXPECT_NEAR(double(actual), double(expected), tol * (1 + std::abs(double(expected)))) << what;
}

#define EXPECT_FIXTURE_TENSOR(actual, expected) \
  EXPECT_TENSOR_NEAR(actual, expected, fixture_tol<Scalar>(), fixture_tol<Scalar>())

template <class Scalar>
void check_dpo(const testing::Fixture& fixture) {
  const FixtureReader<Scalar> f{fixture};
  const auto tw = f.targets("targets_chosen"), tl = f.targets("targets_rejected");
  const auto mw = f.template tensor<2>("mask_chosen"), ml = f.template tensor<2>("mask_rejected");
  const auto logits_w = f.template tensor<3>("logits_chosen");
  const auto logits_l = f.template tensor<3>("logits_rejected");
  const auto policy_w = sequence_log_probs(logits_w, tw, mw);
  const auto policy_l = sequence_log_probs(logits_l, tl, ml);
  const auto ref_w = sequence_log_probs(f.template tensor<3>("ref_logits_chosen"), tw, mw);
  const auto ref_l = sequence_log_probs(f.template tensor<3>("ref_logits_rejected"), tl, ml);
  EXPECT_FIXTURE_TENSOR(policy_w.sequence, f.template tensor<1>("seq_chosen"));
  EXPECT_FIXTURE_TENSOR(policy_l.sequence, f.template tensor<1>("seq_rejected"));
  const auto dpo = dpo_loss(policy_w.sequence, policy_l.sequence, ref_w.sequence, ref_l.sequence,
                            {.beta = f.meta("beta")});
  expect_near(dpo.loss, f.scalar("loss"), "loss");
  expect_near(dpo.reward_margin, f.scalar("reward_margin"), "reward_margin");
  EXPECT_EQ(dpo.reward_accuracy, f.scalar("reward_accuracy"));
  EXPECT_FIXTURE_TENSOR(dpo.chosen_rewards, f.template tensor<1>("chosen_rewards"));
  EXPECT_FIXTURE_TENSOR(dpo.rejected_rewards, f.template tensor<1>("rejected_rewards"));
  EXPECT_FIXTURE_TENSOR(dpo.dpolicy_chosen, f.template tensor<1>("dseq_chosen"));
  EXPECT_FIXTURE_TENSOR(dpo.dpolicy_rejected, f.template tensor<1>("dseq_rejected"));
  EXPECT_FIXTURE_TENSOR(sequence_log_probs_backward(logits_w, tw, mw, dpo.dpolicy_chosen),
                        f.template tensor<3>("dlogits_chosen"));
  EXPECT_FIXTURE_TENSOR(sequence_log_probs_backward(logits_l, tl, ml, dpo.dpolicy_rejected),
                        f.template tensor<3>("dlogits_rejected"));
}

template <class Scalar>
void check_ppo(const testing::Fixture& fixture) {
  const FixtureReader<Scalar> f{fixture};
  const auto old_log_probs = f.template tensor<2>("old_log_probs");
  const auto advantages = f.template tensor<2>("advantages");
  const auto values = f.template tensor<2>("values");
  const auto returns = f.template tensor<2>("returns");
  const auto old_values = f.template tensor<2>("old_values");
  const PpoOptions options{.clip_eps = f.meta("clip_eps"),
                           .value_clip = f.meta("value_clip"),
                           .value_coef = f.meta("value_coef"),
                           .entropy_coef = f.meta("entropy_coef")};
  const auto ppo =
      ppo_loss(f.template tensor<3>("logits"), f.targets("targets"), f.template tensor<2>("mask"),
               {old_log_probs, advantages, values, returns, old_values}, options);
  expect_near(ppo.loss, f.scalar("loss"), "loss");
  expect_near(ppo.policy_loss, f.scalar("policy_loss"), "policy_loss");
  expect_near(ppo.value_loss, f.scalar("value_loss"), "value_loss");
  expect_near(ppo.entropy, f.scalar("entropy"), "entropy");
  expect_near(ppo.clip_fraction, f.scalar("clip_fraction"), "clip_fraction");
  EXPECT_FIXTURE_TENSOR(ppo.log_probs, f.template tensor<2>("log_probs"));
  EXPECT_FIXTURE_TENSOR(ppo.dlog_probs, f.template tensor<2>("dlog_probs"));
  EXPECT_FIXTURE_TENSOR(ppo.dvalues, f.template tensor<2>("dvalues"));
  EXPECT_FIXTURE_TENSOR(ppo.dlogits, f.template tensor<3>("dlogits"));
}

template <class Scalar>
void check_grpo(const testing::Fixture& fixture) {
  const FixtureReader<Scalar> f{fixture};
  const GrpoOptions options{.group_size = static_cast<index_t>(f.meta("group_size")),
                            .clip_eps = f.meta("clip_eps"),
                            .beta = f.meta("beta")};
  const auto grpo =
      grpo_loss(f.template tensor<3>("logits"), f.targets("targets"), f.template tensor<2>("mask"),
                f.template tensor<2>("old_log_probs"), f.template tensor<2>("ref_log_probs"),
                f.template tensor<1>("rewards"), options);
  expect_near(grpo.loss, f.scalar("loss"), "loss");
  expect_near(grpo.policy_loss, f.scalar("policy_loss"), "policy_loss");
  expect_near(grpo.kl, f.scalar("kl"), "kl");
  expect_near(grpo.clip_fraction, f.scalar("clip_fraction"), "clip_fraction");
  EXPECT_FIXTURE_TENSOR(grpo.advantages, f.template tensor<1>("advantages"));
  EXPECT_FIXTURE_TENSOR(grpo.log_probs, f.template tensor<2>("log_probs"));
  EXPECT_FIXTURE_TENSOR(grpo.dlog_probs, f.template tensor<2>("dlog_probs"));
  EXPECT_FIXTURE_TENSOR(grpo.dlogits, f.template tensor<3>("dlogits"));
}

TYPED_TEST(AlignmentTyped, AgreesWithTorchReferencesAndTheirAutograd) {
  using Scalar = TypeParam;
  int dpo = 0, ppo = 0, grpo = 0;
  const auto check = [&](const testing::Fixture& fixture) {
    const std::string& name = fixture.case_name;
    if (name.find("_dpo_") != std::string::npos) {
      check_dpo<Scalar>(fixture);
      ++dpo;
    } else if (name.find("_ppo_") != std::string::npos) {
      check_ppo<Scalar>(fixture);
      ++ppo;
    } else {
      ASSERT_NE(name.find("_grpo_"), std::string::npos) << name;
      check_grpo<Scalar>(fixture);
      ++grpo;
    }
  };
  EXPECT_EQ(testing::for_each_fixture<Scalar>("alignment", check), 6);
  EXPECT_EQ(dpo, 2);
  EXPECT_EQ(ppo, 2);
  EXPECT_EQ(grpo, 2);
}

// ---- finite differences in double ---------------------------------------------------------------

TEST(AlignmentGradients, DpoThroughTheLogitsMatchesFiniteDifferences) {
  std::mt19937_64 engine(3);
  auto w = random_responses(3, 5, 6, engine);
  auto l = random_responses(3, 5, 6, engine);
  const auto ref_w = random_tensor<double>(Shape<1>{3}, engine, -8, -2);
  const auto ref_l = random_tensor<double>(Shape<1>{3}, engine, -8, -2);
  const DpoOptions options{.beta = 0.7};
  const auto loss = [&] {
    return dpo_loss(sequence_log_probs(w.logits, w.targets, w.mask).sequence,
                    sequence_log_probs(l.logits, l.targets, l.mask).sequence, ref_w, ref_l, options)
        .loss;
  };
  const auto dpo =
      dpo_loss(sequence_log_probs(w.logits, w.targets, w.mask).sequence,
               sequence_log_probs(l.logits, l.targets, l.mask).sequence, ref_w, ref_l, options);
  EXPECT_GRADIENT_OK(testing::gradcheck(
      loss, w.logits,
      sequence_log_probs_backward(w.logits, w.targets, w.mask, dpo.dpolicy_chosen)));
  EXPECT_GRADIENT_OK(testing::gradcheck(
      loss, l.logits,
      sequence_log_probs_backward(l.logits, l.targets, l.mask, dpo.dpolicy_rejected)));
}

TEST(AlignmentGradients, PpoWithAndWithoutValueClippingMatchesFiniteDifferences) {
  for (const double value_clip : {0.0, 0.15}) {
    SCOPED_TRACE(value_clip);
    std::mt19937_64 engine(4);
    auto r = random_responses(3, 6, 5, engine);
    const auto lp = sequence_log_probs(r.logits, r.targets, r.mask).token;
    Tensor<double, 2> old_log_probs = lp;
    for (double& v : old_log_probs) v += std::uniform_real_distribution<double>(-0.4, 0.4)(engine);
    const auto advantages = random_tensor<double>(Shape<2>{3, 6}, engine);
    auto values = random_tensor<double>(Shape<2>{3, 6}, engine);
    const auto returns = random_tensor<double>(Shape<2>{3, 6}, engine);
    Tensor<double, 2> old_values = values;
    for (double& v : old_values) v += std::uniform_real_distribution<double>(-0.4, 0.4)(engine);
    const PpoOptions options{
        .clip_eps = 0.2, .value_clip = value_clip, .value_coef = 0.7, .entropy_coef = 0.3};
    const PpoBatch<double> batch{old_log_probs, advantages, values, returns, old_values};
    const auto ppo = ppo_loss(r.logits, r.targets, r.mask, batch, options);
    ASSERT_GT(ppo.clip_fraction, 0.0);  // both branches of the surrogate are exercised
    ASSERT_LT(ppo.clip_fraction, 1.0);
    const auto loss = [&] { return ppo_loss(r.logits, r.targets, r.mask, batch, options).loss; };
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, r.logits, ppo.dlogits));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, values, ppo.dvalues));
    // dlog_probs is the policy term's part: check it through token_log_probs_backward.
    PpoOptions policy_only = options;
    policy_only.entropy_coef = 0;
    const auto policy = ppo_loss(r.logits, r.targets, r.mask, batch, policy_only);
    EXPECT_TENSOR_NEAR(token_log_probs_backward(r.logits, r.targets, r.mask, policy.dlog_probs),
                       policy.dlogits, 1e-14, 1e-15);
  }
}

TEST(AlignmentGradients, GrpoMatchesFiniteDifferences) {
  std::mt19937_64 engine(5);
  auto r = random_responses(6, 5, 4, engine);
  const auto lp = sequence_log_probs(r.logits, r.targets, r.mask).token;
  Tensor<double, 2> old_log_probs = lp, ref_log_probs = lp;
  for (double& v : old_log_probs) v += std::uniform_real_distribution<double>(-0.4, 0.4)(engine);
  for (double& v : ref_log_probs) v += std::uniform_real_distribution<double>(-0.6, 0.6)(engine);
  const auto rewards = random_tensor<double>(Shape<1>{6}, engine, 0, 1);
  const GrpoOptions options{.group_size = 3, .clip_eps = 0.2, .beta = 0.3};
  const auto grpo =
      grpo_loss(r.logits, r.targets, r.mask, old_log_probs, ref_log_probs, rewards, options);
  ASSERT_GT(grpo.clip_fraction, 0.0);
  ASSERT_LT(grpo.clip_fraction, 1.0);
  EXPECT_GRADIENT_OK(testing::gradcheck(
      [&] {
        return grpo_loss(r.logits, r.targets, r.mask, old_log_probs, ref_log_probs, rewards,
                         options)
            .loss;
      },
      r.logits, grpo.dlogits));
}

// ---- the algebra of each loss -------------------------------------------------------------------

TEST(AlignmentAlgebra, DpoOfAPolicyEqualToItsReferenceIsLog2WithNoMargin) {
  const Tensor<double, 1> chosen({3}, {-4.0, -7.5, -1.25}), rejected({3}, {-2.0, -9.0, -3.0});
  const auto dpo = dpo_loss(chosen, rejected, chosen, rejected, {.beta = 0.25});
  // Every z = 0: −log σ(0) = log 2, and dloss/dlog πθ(y_w) = −β·σ(0)/P = −0.25·0.5/3.
  EXPECT_NEAR(dpo.loss, std::log(2.0), 1e-16);
  EXPECT_EQ(dpo.reward_margin, 0.0);
  EXPECT_EQ(dpo.reward_accuracy, 0.0);  // a tie is not a win
  for (index_t i = 0; i < 3; ++i) {
    EXPECT_EQ(dpo.chosen_rewards(i), 0.0);
    EXPECT_EQ(dpo.rejected_rewards(i), 0.0);
    EXPECT_NEAR(dpo.dpolicy_chosen(i), -0.25 * 0.5 / 3, 1e-17);
    EXPECT_NEAR(dpo.dpolicy_rejected(i), 0.25 * 0.5 / 3, 1e-17);
  }
  // A margin of ±800 in z: e^800 overflows, the loss must not (softplus of ±800 is 0 or 800).
  const Tensor<double, 1> zero({1}, {0.0}), far({1}, {8000.0});
  EXPECT_NEAR(dpo_loss(far, zero, zero, zero, {.beta = 0.1}).loss, 0.0, 1e-300);
  EXPECT_DOUBLE_EQ(dpo_loss(zero, far, zero, zero, {.beta = 0.1}).loss, 800.0);
  EXPECT_DOUBLE_EQ(dpo_loss(zero, far, zero, zero, {.beta = 0.1}).dpolicy_rejected(0), 0.1);
}

TEST(AlignmentAlgebra, GrpoAdvantagesSumToZeroWithUnitUnbiasedStdPerGroup) {
  std::mt19937_64 engine(6);
  const auto rewards = random_tensor<double>(Shape<1>{12}, engine, -5, 5);
  const auto advantages = grpo_advantages(rewards, 4, 0.0);
  for (index_t g = 0; g < 12; g += 4) {
    double sum = 0, squares = 0;
    for (index_t i = g; i < g + 4; ++i) sum += advantages(i);
    for (index_t i = g; i < g + 4; ++i) squares += advantages(i) * advantages(i);
    EXPECT_NEAR(sum, 0.0, 1e-14);
    EXPECT_NEAR(squares / 3, 1.0, 1e-14);  // unbiased: divided by G − 1
  }
  // Hand-derived: {1, 0}: mean ½, unbiased std √½, so ±½/(√½ + 1e-4).
  const auto pair = grpo_advantages(Tensor<double, 1>({2}, {1.0, 0.0}), 2);
  EXPECT_NEAR(pair(0), 0.5 / (std::sqrt(0.5) + 1e-4), 1e-15);
  EXPECT_NEAR(pair(1), -0.5 / (std::sqrt(0.5) + 1e-4), 1e-15);
  // A group of equal rewards teaches nothing: advantage 0, not NaN (std 0, divided by eps).
  const auto same = grpo_advantages(Tensor<double, 1>({3}, {0.75, 0.75, 0.75}), 3);
  for (index_t i = 0; i < 3; ++i) EXPECT_EQ(same(i), 0.0);
  // Where the mean itself rounds (2.1 / 3 ≠ 0.7), the 1e-16 left over is divided by eps = 1e-4,
  // as in torch: small, but not 0.
  const auto rounded = grpo_advantages(Tensor<double, 1>({3}, {0.7, 0.7, 0.7}), 3);
  for (index_t i = 0; i < 3; ++i) EXPECT_LE(std::abs(rounded(i)), 1e-11);
}

TEST(AlignmentAlgebra, PpoAtRatioOneIsMinusTheMeanAdvantage) {
  std::mt19937_64 engine(7);
  auto r = random_responses(3, 6, 5, engine);
  const auto lp = sequence_log_probs(r.logits, r.targets, r.mask).token;
  const auto advantages = random_tensor<double>(Shape<2>{3, 6}, engine);
  const auto values = random_tensor<double>(Shape<2>{3, 6}, engine);
  // The first epoch of a PPO step: the policy that sampled is the policy being trained.
  const auto ppo = ppo_loss(r.logits, r.targets, r.mask, {lp, advantages, values, values, {}},
                            {.clip_eps = 0.2, .value_coef = 1, .entropy_coef = 0});
  double sum = 0, tokens = 0;
  for (index_t i = 0; i < r.mask.size(); ++i) {
    sum += r.mask.data()[i] * advantages.data()[i];
    tokens += r.mask.data()[i];
  }
  EXPECT_NEAR(ppo.loss, -sum / tokens, 1e-15);
  EXPECT_EQ(ppo.value_loss, 0.0);  // V = R
  EXPECT_EQ(ppo.clip_fraction, 0.0);
  for (index_t i = 0; i < r.mask.size(); ++i) {
    // d/dlog π of −r·A at r = 1 is −A, over the M tokens.
    EXPECT_NEAR(ppo.dlog_probs.data()[i], -r.mask.data()[i] * advantages.data()[i] / tokens, 1e-17);
    EXPECT_EQ(ppo.dvalues.data()[i], 0.0);
  }
}

TEST(AlignmentAlgebra, GrpoAtTheReferenceAndOldPolicyHasNoKlAndNoMeanPolicyLoss) {
  std::mt19937_64 engine(8);
  auto r = random_responses(8, 5, 6, engine);
  const auto lp = sequence_log_probs(r.logits, r.targets, r.mask).token;
  const auto rewards = random_tensor<double>(Shape<1>{8}, engine);
  const auto grpo =
      grpo_loss(r.logits, r.targets, r.mask, lp, lp, rewards, {.group_size = 4, .beta = 0.5});
  // KL k3 is 0 at π_ref = πθ (and so is its gradient); at r = 1 each sequence's loss is −Â_i,
  // whose mean over a group is 0.
  EXPECT_EQ(grpo.kl, 0.0);
  EXPECT_NEAR(grpo.loss, 0.0, 1e-15);
  for (index_t n = 0; n < 8; ++n) {
    double length = 0;
    for (index_t t = 0; t < 5; ++t) length += r.mask(n, t);
    for (index_t t = 0; t < 5; ++t) {
      EXPECT_NEAR(grpo.dlog_probs(n, t), -r.mask(n, t) * grpo.advantages(n) / (length * 8), 1e-16);
    }
  }
}

TEST(AlignmentAlgebra, NaNPropagatesAsInTorch) {
  std::mt19937_64 engine(11);
  auto r = random_responses(2, 4, 3, engine);
  index_t selected = 0;
  while (r.mask.data()[selected] == 0.0) ++selected;
  const auto lp = sequence_log_probs(r.logits, r.targets, r.mask).token;
  const auto advantages = random_tensor<double>(Shape<2>{2, 4}, engine);
  Tensor<double, 2> old_log_probs = lp;
  old_log_probs.data()[selected] = std::numeric_limits<double>::quiet_NaN();
  const auto ppo =
      ppo_loss(r.logits, r.targets, r.mask, {old_log_probs, advantages, lp, lp, {}}, {});
  EXPECT_TRUE(std::isnan(ppo.loss));
  EXPECT_TRUE(std::isnan(ppo.dlog_probs.data()[selected]));
  EXPECT_TRUE(std::isnan(ppo.dlogits.data()[selected * 3]));
  r.logits.data()[selected * 3] = std::numeric_limits<double>::quiet_NaN();
  const auto seq = sequence_log_probs(r.logits, r.targets, r.mask).sequence;
  EXPECT_TRUE(std::isnan(seq(selected / 4)));
  const Tensor<double, 1> zeros({2});
  const auto dpo = dpo_loss(seq, zeros, zeros, zeros, {});
  EXPECT_TRUE(std::isnan(dpo.loss));
  EXPECT_TRUE(std::isnan(dpo.dpolicy_chosen(selected / 4)));
}

// ---- bad input (reliability rows 102 and 103) --------------------------------------------------

TEST(AlignmentErrors, InputsThatDoNotFitAreShapeErrorsOrErrorsNamingTheOp) {
  std::mt19937_64 engine(9);
  auto r = random_responses(2, 4, 3, engine);
  const std::vector<index_t> short_targets(7, 0);
  EXPECT_THROW_WITH(sequence_log_probs(r.logits, short_targets, r.mask), ShapeError,
                    "sequence_log_probs: 7 targets for logits [2, 4, 3] (N·T = 8 expected)");
  EXPECT_THROW_WITH(sequence_log_probs(r.logits, r.targets, Tensor<double, 2>({2, 3})), ShapeError,
                    "sequence_log_probs: mask has shape [2, 3] but logits [2, 4, 3] need [N, T] = "
                    "[2, 4]");
  // An empty response: DPO would compare nothing, GRPO divide by 0.
  auto empty = r.mask;
  for (index_t t = 0; t < 4; ++t) empty(1, t) = 0;
  EXPECT_THROW_WITH(sequence_log_probs(r.logits, r.targets, empty), ShapeError,
                    "sequence_log_probs: row 1 of the mask [2, 4] selects no token (an empty "
                    "response)");
  auto half = r.mask;
  half(0, 3) = 0.5;
  EXPECT_THROW_WITH(sequence_log_probs(r.logits, r.targets, half), Error,
                    "sequence_log_probs: mask[0, 3] = 0.5 is neither 0 nor 1");
  std::vector<index_t> outside(8, 0);
  Tensor<double, 2> all({2, 4});
  all.fill(1.0);
  outside[5] = 3;
  EXPECT_THROW_WITH(sequence_log_probs(r.logits, outside, all), Error,
                    "sequence_log_probs: target 3 at [1, 1] is outside [0, 3)");
  EXPECT_THROW_WITH(
      token_log_probs_backward(r.logits, r.targets, r.mask, Tensor<double, 2>({4, 2})), ShapeError,
      "token_log_probs_backward: dtoken has shape [4, 2] but [N, T] of "
      "the logits is [2, 4]");
  EXPECT_THROW_WITH(
      sequence_log_probs_backward(r.logits, r.targets, r.mask, Tensor<double, 1>({3})), ShapeError,
      "sequence_log_probs_backward: dsequence has shape [3] but [N] of the logits is [2]");
  EXPECT_THROW_WITH(sequence_log_probs_backward(r.logits, r.targets, empty, Tensor<double, 1>({2})),
                    ShapeError, "sequence_log_probs_backward: row 1 of the mask");

  const Tensor<double, 1> two({2}), three({3}), none({0});
  EXPECT_THROW_WITH(dpo_loss(two, two, three, two), ShapeError,
                    "dpo_loss: reference_chosen has shape [3] but policy_chosen is [2]");
  EXPECT_THROW_WITH(dpo_loss(none, none, none, none), ShapeError, "dpo_loss: no pairs");

  const Tensor<double, 2> fits({2, 4}), wrong({2, 5});
  EXPECT_THROW_WITH(ppo_loss(r.logits, r.targets, r.mask, {fits, fits, wrong, fits, fits}),
                    ShapeError,
                    "ppo_loss: values has shape [2, 5] but [N, T] of the logits is [2, 4]");
  EXPECT_THROW_WITH(
      ppo_loss(r.logits, r.targets, r.mask, {fits, fits, fits, fits, {}}, {.value_clip = 0.2}),
      ShapeError, "ppo_loss: old_values has shape [0, 0]");
  EXPECT_THROW_WITH(ppo_loss(r.logits, r.targets, empty, {fits, fits, fits, fits, fits}),
                    ShapeError, "ppo_loss: row 1 of the mask [2, 4] selects no token");
  EXPECT_THROW_WITH(ppo_loss(Tensor<double, 3>({0, 4, 3}), {}, Tensor<double, 2>({0, 4}), {}),
                    ShapeError, "ppo_loss: no sequences (logits: [0, 4, 3])");
  const GrpoOptions grpo{.group_size = 2};
  EXPECT_THROW_WITH(grpo_loss(r.logits, r.targets, r.mask, fits, wrong, two, grpo), ShapeError,
                    "grpo_loss: ref_log_probs has shape [2, 5] but [N, T] of the logits is [2, 4]");
  EXPECT_THROW_WITH(grpo_loss(r.logits, r.targets, r.mask, fits, fits, three, grpo), ShapeError,
                    "grpo_loss: rewards has shape [3] but [N] of the logits is [2]");
  EXPECT_THROW_WITH(grpo_loss(r.logits, r.targets, empty, fits, fits, two, grpo), ShapeError,
                    "grpo_loss: row 1 of the mask [2, 4] selects no token (an empty response)");
}

TEST(AlignmentErrors, ImpossibleOptionsAreConfigErrorsNamingTheField) {
  std::mt19937_64 engine(10);
  auto r = random_responses(4, 3, 3, engine);
  const Tensor<double, 1> one({1}, {-1.0}), four({4});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_THROW_WITH(dpo_loss(one, one, one, one, {.beta = 0}), ConfigError,
                    "dpo_loss: beta must be finite and > 0 (got 0)");
  EXPECT_THROW_WITH(dpo_loss(one, one, one, one, {.beta = -0.1}), ConfigError, "(got -0.1)");
  EXPECT_THROW_WITH(dpo_loss(one, one, one, one, {.beta = nan}), ConfigError, "(got nan)");
  EXPECT_THROW_WITH(dpo_loss(one, one, one, one, {.beta = inf}), ConfigError, "(got inf)");

  const Tensor<double, 2> fits({4, 3});
  const PpoBatch<double> batch{fits, fits, fits, fits, fits};
  for (const double eps : {0.0, 1.0, -0.2, 1.5, nan}) {
    EXPECT_THROW_WITH(ppo_loss(r.logits, r.targets, r.mask, batch, {.clip_eps = eps}), ConfigError,
                      "ppo_loss: clip_eps must be in (0, 1)");
    EXPECT_THROW_WITH(grpo_loss(r.logits, r.targets, r.mask, fits, fits, four,
                                {.group_size = 2, .clip_eps = eps}),
                      ConfigError, "grpo_loss: clip_eps must be in (0, 1)");
  }
  EXPECT_THROW_WITH(ppo_loss(r.logits, r.targets, r.mask, batch, {.value_clip = -1}), ConfigError,
                    "ppo_loss: value_clip must be finite and >= 0 (got -1)");
  EXPECT_THROW_WITH(ppo_loss(r.logits, r.targets, r.mask, batch, {.value_coef = nan}), ConfigError,
                    "ppo_loss: value_coef must be finite and >= 0 (got nan)");
  EXPECT_THROW_WITH(ppo_loss(r.logits, r.targets, r.mask, batch, {.entropy_coef = -0.01}),
                    ConfigError, "ppo_loss: entropy_coef must be finite and >= 0 (got -0.01)");

  EXPECT_THROW_WITH(grpo_loss(r.logits, r.targets, r.mask, fits, fits, four, {.group_size = 3}),
                    ConfigError,
                    "grpo_advantages: group_size 3 does not divide the batch of 4 "
                    "rewards");
  EXPECT_THROW_WITH(grpo_loss(r.logits, r.targets, r.mask, fits, fits, four, {.group_size = 1}),
                    ConfigError, "grpo_advantages: group_size must be >= 2 (got 1)");
  EXPECT_THROW_WITH(grpo_loss(r.logits, r.targets, r.mask, fits, fits, four, {}), ConfigError,
                    "grpo_advantages: group_size must be >= 2 (got 0)");
  EXPECT_THROW_WITH(
      grpo_loss(r.logits, r.targets, r.mask, fits, fits, four, {.group_size = 2, .beta = -1}),
      ConfigError, "grpo_loss: beta must be finite and >= 0 (got -1)");
  EXPECT_THROW_WITH(grpo_advantages(four, 2, -1e-4), ConfigError,
                    "grpo_advantages: std_eps must be finite and >= 0 (got -0.0001)");
}

}  // namespace test_alignment_loss
}  // namespace dissect
