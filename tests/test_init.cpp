// Tests for dissect/tensor/init.hpp: the generator's published test vectors, portable sampling, the
// bounds and moments of every init scheme at GPT-2's FFN shape (768 → 3072), and the
// ConstructionScope through which loaders build layers without random draws or gradients.
#include "dissect/tensor/init.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <thread>

#include "dissect/layers/embedding.hpp"
#include "dissect/layers/linear.hpp"

#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_init {

TEST(Generator, ReproducesSplitMix64ReferenceVectors) {
  // The reference implementation's outputs (Vigna's splitmix64.c) for seed 1234567 and seed 0.
  Generator g(1234567);
  EXPECT_EQ(g.next_u64(), 6457827717110365317ull);
  EXPECT_EQ(g.next_u64(), 3203168211198807973ull);
  EXPECT_EQ(g.next_u64(), 9817491932198370423ull);
  EXPECT_EQ(Generator(0).next_u64(), 0xE220A8397B1DCDAFull);
}

TEST(Generator, NormalSamplesArePinnedBitForBit) {
  // Pinned on x86-64; they use only correctly rounded operations, so every platform must agree.
  Generator g(42);
  EXPECT_EQ(g.normal(), 0x1.f8c80e851c08cp-2);
  EXPECT_EQ(g.normal(), -0x1.6354b5f7dce79p-1);
  EXPECT_EQ(g.normal(), -0x1.47f4af60c7f94p+0);
}

TEST(Generator, PortableLogIsWithinAFewUlp) {
  std::mt19937_64 engine(3);
  for (int i = 0; i < 100000; ++i) {
    const double x = std::ldexp(static_cast<double>(engine() >> 11) * 0x1.0p-53 + 0x1.0p-60,
                                static_cast<int>(engine() % 400) - 200);
    const double expected = std::log(x);
    const double ulp = std::max(std::abs(expected) * 0x1.0p-52, 0x1.0p-1074);
    ASSERT_LE(std::abs(detail::portable_log(x) - expected), 4 * ulp) << "x = " << x;
  }
  EXPECT_EQ(detail::portable_log(1.0), 0.0);
}

TEST(Generator, UniformStaysInItsInterval) {
  Generator g(1);
  for (int i = 0; i < 100000; ++i) {
    const double u = g.uniform(-0.25, 0.5);
    ASSERT_GE(u, -0.25);
    ASSERT_LT(u, 0.5);
  }
}

struct Moments {
  double min = INFINITY, max = -INFINITY, mean = 0, stddev = 0, within_one_sigma = 0;
};

template <std::size_t Rank>
Moments moments_of(const Tensor<float, Rank>& t) {
  Moments m;
  double sum = 0, sum_sq = 0;
  for (float v : t) {
    m.min = std::min<double>(m.min, v);
    m.max = std::max<double>(m.max, v);
    sum += v;
    sum_sq += double(v) * v;
  }
  const double n = static_cast<double>(t.size());
  m.mean = sum / n;
  m.stddev = std::sqrt(sum_sq / n - m.mean * m.mean);
  double inside = 0;
  for (float v : t) inside += std::abs(v - m.mean) <= m.stddev;
  m.within_one_sigma = inside / n;
  return m;
}

class InitScheme768To3072 : public ::testing::TestWithParam<std::uint64_t> {
 protected:
  Tensor<float, 2> weight{{3072, 768}};
  Tensor<float, 1> bias{{3072}};
  // Standard error of a mean over 2.36M samples is σ/1536: 6 standard errors is a safe margin.
  double mean_tolerance(double sigma) const { return 6 * sigma / std::sqrt(double(weight.size())); }
};

TEST_P(InitScheme768To3072, PyTorchDefaultIsUniformOneOverSqrtIn) {
  Generator g(GetParam());
  init_linear(weight, &bias, InitScheme::pytorch_default, g);
  const double bound = 1 / std::sqrt(768.0);  // 0.0360844
  const Moments w = moments_of(weight);
  EXPECT_GE(w.min, -bound);
  EXPECT_LT(w.max, bound);
  EXPECT_GT(w.max, 0.999 * bound);  // the whole interval is used
  EXPECT_NEAR(w.mean, 0, mean_tolerance(bound / std::sqrt(3.0)));
  EXPECT_NEAR(w.stddev, bound / std::sqrt(3.0), 0.002 * bound);  // U(−a, a) has σ = a/√3
  const Moments b = moments_of(bias);
  EXPECT_GE(b.min, -bound);
  EXPECT_LT(b.max, bound);
  EXPECT_NEAR(b.stddev, bound / std::sqrt(3.0), 0.05 * bound);
}

TEST_P(InitScheme768To3072, KaimingNormalIsTheSeedArticlesScheme) {
  Generator g(GetParam());
  bias.fill(5);
  init_linear(weight, &bias, InitScheme::kaiming_normal, g);
  const double sigma = std::sqrt(2.0 / 768);  // randn · √(2/in) = 0.0510310
  const Moments w = moments_of(weight);
  EXPECT_NEAR(w.mean, 0, mean_tolerance(sigma));
  EXPECT_NEAR(w.stddev, sigma, 0.003 * sigma);
  EXPECT_NEAR(w.within_one_sigma, 0.6827, 0.002);  // a normal, not just any distribution
  EXPECT_GT(w.max, 4 * sigma);                     // with tails
  for (float v : bias) ASSERT_EQ(v, 0.0f);
}

TEST_P(InitScheme768To3072, KaimingAndXavierBounds) {
  Generator g(GetParam());
  init_linear(weight, &bias, InitScheme::kaiming_uniform, g);
  Moments w = moments_of(weight);
  const double kaiming = std::sqrt(6.0 / 768);
  EXPECT_GE(w.min, -kaiming);
  EXPECT_LT(w.max, kaiming);
  EXPECT_NEAR(w.stddev, std::sqrt(2.0 / 768), 0.003 * kaiming);

  init_linear(weight, &bias, InitScheme::xavier_uniform, g);
  w = moments_of(weight);
  const double xavier = std::sqrt(6.0 / (768 + 3072));
  EXPECT_GE(w.min, -xavier);
  EXPECT_LT(w.max, xavier);
  EXPECT_GT(w.max, 0.999 * xavier);

  init_linear(weight, &bias, InitScheme::xavier_normal, g);
  w = moments_of(weight);
  EXPECT_NEAR(w.stddev, std::sqrt(2.0 / (768 + 3072)), 0.003 * std::sqrt(2.0 / (768 + 3072)));

  init_linear(weight, &bias, InitScheme::zeros, g);
  w = moments_of(weight);
  EXPECT_EQ(w.min, 0);
  EXPECT_EQ(w.max, 0);
}

INSTANTIATE_TEST_SUITE_P(Seeds, InitScheme768To3072, ::testing::Values(0u, 1u, 42u, 2024u));

TEST(Init, SameSeedGivesBitwiseIdenticalWeights) {
  for (InitScheme scheme :
       {InitScheme::pytorch_default, InitScheme::kaiming_normal, InitScheme::xavier_normal}) {
    Tensor<float, 2> a({64, 48}), b({64, 48});
    Generator ga(99), gb(99);
    init_linear(a, nullptr, scheme, ga);
    init_linear(b, nullptr, scheme, gb);
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << to_string(scheme);
    Generator gc(100);
    init_linear(b, nullptr, scheme, gc);
    EXPECT_NE(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << to_string(scheme);
  }
}

TEST(Init, ZeroFanGivesZerosNotNaN) {  // reliability.md row 5: no division by zero
  for (InitScheme scheme :
       {InitScheme::pytorch_default, InitScheme::kaiming_normal, InitScheme::kaiming_uniform,
        InitScheme::xavier_uniform, InitScheme::xavier_normal}) {
    Tensor<double, 2> weight({3, 0});
    Tensor<double, 1> bias({3});
    Generator g(1);
    init_linear(weight, &bias, scheme, g);
    for (double v : bias) EXPECT_EQ(v, 0.0) << to_string(scheme);
    Tensor<double, 2> empty({0, 0});
    init_linear(empty, nullptr, scheme, g);  // fan_in + fan_out = 0 as well
  }
}

TEST(Init, ManualSeedRestartsTheDefaultSeedSequence) {
  manual_seed(7);
  const auto first = next_default_seed();
  const auto second = next_default_seed();
  manual_seed(7);
  EXPECT_EQ(next_default_seed(), first);
  EXPECT_EQ(next_default_seed(), second);
  EXPECT_NE(first, second);
}

TEST(ConstructionScope, NestsAndRestoresAndIsPerThread) {
  EXPECT_TRUE(ConstructionScope::current().initialise);
  EXPECT_TRUE(ConstructionScope::current().gradients);
  {
    const ConstructionScope outer({.gradients = false});
    EXPECT_TRUE(ConstructionScope::current().initialise);
    EXPECT_FALSE(ConstructionScope::current().gradients);
    {
      const ConstructionScope inner({.initialise = false, .gradients = true});
      EXPECT_FALSE(ConstructionScope::current().initialise);
      EXPECT_TRUE(ConstructionScope::current().gradients);
    }
    EXPECT_TRUE(ConstructionScope::current().initialise);
    EXPECT_FALSE(ConstructionScope::current().gradients);
    // Another thread builds its layers as usual.
    bool other_gradients = false;
    std::thread([&] { other_gradients = ConstructionScope::current().gradients; }).join();
    EXPECT_TRUE(other_gradients);
  }
  EXPECT_TRUE(ConstructionScope::current().gradients);
}

TEST(ConstructionScope, LayersSkipTheDrawsButTakeTheirSeedsAndCanDoWithoutGradients) {
  // Without the draws: zeros, and the default seed sequence moves as if they had been drawn, so
  // the layer built next is the one built without the scope.
  manual_seed(11);
  const Linear<float> drawn(6, 4);
  const Linear<float> next_drawn(6, 4);
  manual_seed(11);
  std::optional<Linear<float>> skipped;
  std::optional<Embedding<float>> table;
  {
    const ConstructionScope loading({.initialise = false});
    skipped.emplace(6, 4);
  }
  const Linear<float> next_after(6, 4);
  for (float v : skipped->weight()) EXPECT_EQ(v, 0.0f);
  for (float v : skipped->bias()) EXPECT_EQ(v, 0.0f);
  EXPECT_FALSE(skipped->frozen());
  EXPECT_EQ(skipped->weight_grad().size(), 24);
  EXPECT_EQ(std::memcmp(next_after.weight().data(), next_drawn.weight().data(), 24 * sizeof(float)),
            0);
  EXPECT_NE(std::memcmp(drawn.weight().data(), skipped->weight().data(), 24 * sizeof(float)), 0);

  // Without gradients: frozen from the start, no gradient memory; unfreezing allocates it.
  {
    const ConstructionScope inference({.gradients = false});
    skipped.emplace(6, 4, LinearOptions{.seed = 3});
    table.emplace(5, 3, EmbeddingOptions{.seed = 3});
  }
  const Linear<float> same_seed(6, 4, LinearOptions{.seed = 3});
  EXPECT_TRUE(skipped->frozen());
  EXPECT_THROW_WITH((void)skipped->weight_grad(), Error, "frozen and keeps no gradient");
  EXPECT_EQ(std::memcmp(skipped->weight().data(), same_seed.weight().data(), 24 * sizeof(float)),
            0);
  index_t gradient_values = 0;
  skipped->for_each_parameter(
      [&](const ParameterName&, auto, auto grad) { gradient_values += grad.size(); });
  EXPECT_EQ(gradient_values, 0);
  EXPECT_TRUE(table->frozen());
  EXPECT_THROW_WITH((void)table->weight_grad(), Error, "frozen and keeps no gradient");
  skipped->set_frozen(false);
  EXPECT_EQ(skipped->weight_grad().size(), 24);
}

}  // namespace test_init
}  // namespace dissect
