// Tests of dissect/attention/attention.hpp: causal attention against a plain-loop reference in
// double (plain, grouped-query, with earlier positions in front, across the 64-wide key and query
// tiles), the online and the training forward against each other, backward against finite
// differences in double, a given score scale (GPT-2's unscaled and per-layer scores) in every
// entry point and in backward, the FLOP count, and every refused shape or scale.
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <vector>

#include "dissect/attention/attention.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_attention {

using testing::FloatAndDouble;

struct Case {
  index_t batch, heads, kv_heads, tokens, keys, head_dim;
};

// Tiny; grouped-query; one KV head for three query heads across the 64-row query tile and the
// 64-key tile; 3 new positions after 127 earlier ones; one decoding step after 199.
const std::vector<Case> cases = {
    {2, 4, 4, 5, 5, 8},   {2, 4, 2, 6, 6, 4},   {1, 3, 1, 70, 70, 4},
    {1, 2, 2, 3, 130, 6}, {2, 2, 1, 1, 200, 8},
};

/// o[b, h, t] = Σ_j softmax_j(s·q·k_j over j ≤ S − T + t)·v_j, in double, by plain loops;
/// s = 1/√d_k unless given.
template <class Scalar>
Tensor<double, 4> reference_attention(const Tensor<Scalar, 4>& q, const Tensor<Scalar, 4>& k,
                                      const Tensor<Scalar, 4>& v,
                                      std::optional<double> score_scale = std::nullopt) {
  const index_t B = q.dim(0), H = q.dim(1), T = q.dim(2), d = q.dim(3), S = k.dim(2);
  const index_t group = H / k.dim(1);
  const double scale = score_scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  Tensor<double, 4> o(q.shape());
  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h) {
      for (index_t t = 0; t < T; ++t) {
        const index_t visible = S - T + t + 1;
        std::vector<double> score(static_cast<std::size_t>(visible));
        double top = -INFINITY, sum = 0;
        for (index_t j = 0; j < visible; ++j) {
          double s = 0;
          for (index_t i = 0; i < d; ++i) s += double(q(b, h, t, i)) * k(b, h / group, j, i);
          score[j] = s * scale;
          top = std::max(top, score[j]);
        }
        for (auto& s : score) sum += (s = std::exp(s - top));
        for (index_t j = 0; j < visible; ++j) {
          for (index_t i = 0; i < d; ++i) o(b, h, t, i) += score[j] / sum * v(b, h / group, j, i);
        }
      }
    }
  }
  return o;
}

/// A bound on |computed − exact| for attention in Scalar. A score s·q·k is off by at most
/// γ_d·s·Σ|q||k| =: δ (Higham §3.1; s = 1/√d_k by default, its own rounding within γ_d), so each
/// exp(score − max) is off by a factor e^{±2δ} plus the exp's own rounding, and the normalised
/// weights sum to within 2·(2δ + 4u) of the exact ones; the weighted sum of S values adds γ_S.
/// Times max|v|, doubled for safety.
template <class Scalar>
double attention_bound(const Tensor<Scalar, 4>& q, const Tensor<Scalar, 4>& k,
                       const Tensor<Scalar, 4>& v,
                       std::optional<double> score_scale = std::nullopt) {
  double q_max = 0, k_max = 0, v_max = 0;
  for (Scalar x : q) q_max = std::max(q_max, std::abs(double(x)));
  for (Scalar x : k) k_max = std::max(k_max, std::abs(double(x)));
  for (Scalar x : v) v_max = std::max(v_max, std::abs(double(x)));
  const index_t d = q.dim(3), S = k.dim(2);
  const double u = testing::unit_roundoff<Scalar>();
  const double scale = score_scale.value_or(1.0 / std::sqrt(double(d)));
  const double delta = testing::gamma<Scalar>(d) * d * q_max * k_max * scale;
  return 2.0 * (2.0 * (2.0 * delta + 4.0 * u) + testing::gamma<Scalar>(S + 1)) * v_max;
}

template <class Scalar>
struct Inputs {
  Tensor<Scalar, 4> q, k, v;
};

template <class Scalar>
Inputs<Scalar> inputs_for(const Case& c, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  return {
      testing::random_tensor<Scalar, 4>({c.batch, c.heads, c.tokens, c.head_dim}, engine, -2, 2),
      testing::random_tensor<Scalar, 4>({c.batch, c.kv_heads, c.keys, c.head_dim}, engine, -2, 2),
      testing::random_tensor<Scalar, 4>({c.batch, c.kv_heads, c.keys, c.head_dim}, engine, -1, 1)};
}

template <class Scalar>
class Attention : public ::testing::Test {};
TYPED_TEST_SUITE(Attention, FloatAndDouble);

TYPED_TEST(Attention, BothForwardsMatchThePlainLoopReference) {
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::concat_for_trace("B=", c.batch, " H=", c.heads, " H_kv=", c.kv_heads,
                                           " T=", c.tokens, " S=", c.keys, " d_k=", c.head_dim));
    const auto [q, k, v] = inputs_for<TypeParam>(c, 1);
    const auto expected = reference_attention(q, k, v);
    Tensor<double, 4> bound(expected.shape());
    bound.fill(attention_bound(q, k, v));
    EXPECT_TENSOR_WITHIN(causal_attention(q, k, v), expected, bound) << "online softmax";
    AttentionCache<TypeParam> cache;
    EXPECT_TENSOR_WITHIN(causal_attention(q, k, v, cache), expected, bound) << "training";
    // The cached probabilities: rows sum to 1, masked entries are exactly 0.
    const auto& p = cache.probs;
    for (index_t t = 0; t < c.tokens; ++t) {
      double sum = 0;
      for (index_t j = 0; j < c.keys; ++j) {
        if (j > c.keys - c.tokens + t) {
          EXPECT_EQ(p(0, 0, t, j), TypeParam(0));
        }
        sum += p(0, 0, t, j);
      }
      EXPECT_NEAR(sum, 1.0, testing::gamma<TypeParam>(c.keys + 4));
    }
  }
}

TYPED_TEST(Attention, LargeScoresDoNotOverflowTheSoftmax) {
  // Scores of ±10⁴: exp would overflow without subtracting the running maximum.
  const Case c{1, 2, 2, 70, 70, 4};
  auto [q, k, v] = inputs_for<TypeParam>(c, 2);
  for (auto& x : q) x *= 100;
  for (auto& x : k) x *= 100;
  const auto expected = reference_attention(q, k, v);
  Tensor<double, 4> bound(expected.shape());
  bound.fill(attention_bound(q, k, v));
  EXPECT_TENSOR_WITHIN(causal_attention(q, k, v), expected, bound);
}

TYPED_TEST(Attention, MaskedKeysWeighExactlyNothing) {
  // A future key's huge value must not reach an earlier query: the masked weight is exactly 0
  // (Eigen's vectorised exp of −inf is a denormal, 2.9e-39 in float on SSE2 and 5.6e-309 in
  // double: times 1e38 or 1e300 that would show). The first query sees key 0 alone, so its
  // output is v's row 0 exactly.
  const TypeParam huge = std::is_same_v<TypeParam, float> ? TypeParam(1e38) : TypeParam(1e300);
  for (const index_t tokens : {3, 70}) {
    for (const std::optional<index_t> window :
         {std::optional<index_t>{}, std::optional<index_t>{2}}) {
      const Case c{1, 1, 1, tokens, tokens, 4};
      auto [q, k, v] = inputs_for<TypeParam>(c, 3);
      for (index_t d = 0; d < 4; ++d) v(0, 0, tokens - 1, d) = huge;
      const auto online = causal_attention(q, k, v, std::nullopt, window);
      AttentionCache<TypeParam> cache;
      const auto training = causal_attention(q, k, v, cache, std::nullopt, window);
      for (index_t d = 0; d < 4; ++d) {
        EXPECT_EQ(online(0, 0, 0, d), v(0, 0, 0, d)) << "T=" << tokens << " d=" << d;
        EXPECT_EQ(training(0, 0, 0, d), v(0, 0, 0, d)) << "T=" << tokens << " d=" << d;
      }
    }
  }
}

TEST(Attention, BackwardMatchesFiniteDifferences) {
  for (const Case& c : {Case{2, 4, 2, 5, 5, 4}, Case{1, 2, 1, 3, 7, 6}, Case{1, 3, 1, 66, 66, 2}}) {
    SCOPED_TRACE(testing::concat_for_trace("H=", c.heads, " H_kv=", c.kv_heads, " T=", c.tokens,
                                           " S=", c.keys));
    // Named references, not a structured binding: the loss lambda below captures them, which
    // clang before 16 refuses for bindings.
    auto inputs = inputs_for<double>(c, 3);
    auto& q = inputs.q;
    auto& k = inputs.k;
    auto& v = inputs.v;
    std::mt19937_64 engine(4);
    const auto dout = testing::random_tensor<double, 4>(q.shape(), engine);
    AttentionCache<double> cache;
    causal_attention(q, k, v, cache);
    const auto grads = causal_attention_backward(q, k, v, cache, dout);
    const auto loss = [&] {
      const auto o = causal_attention(q, k, v);
      double total = 0;
      for (index_t i = 0; i < o.size(); ++i) total += o.data()[i] * dout.data()[i];
      return total;
    };
    const testing::GradcheckOptions options{.richardson = true, .sample = 40, .seed = 1};
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, q, grads.q, options));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, k, grads.k, options));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, v, grads.v, options));
  }
}

// GPT-2's scale_attn_weights: false (s = 1) and scale_attn_by_inverse_layer_idx (s = 1/(√d_k·3)
// in layer 2), and a small s: every entry point scales alike.
TYPED_TEST(Attention, AGivenScoreScaleMatchesTheReferenceInEveryEntryPoint) {
  for (const Case& c : cases) {
    for (const double scale : {1.0, 1.0 / (std::sqrt(double(c.head_dim)) * 3.0), 0.05}) {
      SCOPED_TRACE(testing::concat_for_trace("T=", c.tokens, " S=", c.keys, " d_k=", c.head_dim,
                                             " scale=", scale));
      const auto [q, k, v] = inputs_for<TypeParam>(c, 5);
      const auto expected = reference_attention(q, k, v, scale);
      Tensor<double, 4> bound(expected.shape());
      bound.fill(attention_bound(q, k, v, scale));
      EXPECT_TENSOR_WITHIN(causal_attention(q, k, v, scale), expected, bound) << "online";
      AttentionCache<TypeParam> cache;
      EXPECT_TENSOR_WITHIN(causal_attention(q, k, v, cache, scale), expected, bound) << "training";
      EXPECT_EQ(cache.scale, scale);
      Tensor<TypeParam, 4> o(q.shape());
      causal_attention_heads_into<TypeParam>(heads_of(q.cview()), heads_of(k.cview()),
                                             heads_of(v.cview()), heads_of(o.view()), c.batch,
                                             scale);
      EXPECT_TENSOR_WITHIN(o, expected, bound) << "heads (the KV-cache step)";
    }
  }
}

TYPED_TEST(Attention, TheDefaultScaleIsOneOverRootHeadDimBitForBit) {
  const Case c{2, 4, 2, 6, 6, 4};
  const auto [q, k, v] = inputs_for<TypeParam>(c, 6);
  const double root = 1.0 / std::sqrt(4.0);
  EXPECT_TENSOR_EQ(causal_attention(q, k, v, root), causal_attention(q, k, v));
  AttentionCache<TypeParam> given, unset;
  EXPECT_TENSOR_EQ(causal_attention(q, k, v, given, root), causal_attention(q, k, v, unset));
  EXPECT_FALSE(unset.scale.has_value());
  EXPECT_TENSOR_EQ(given.probs, unset.probs);
}

TEST(Attention, BackwardUsesTheForwardsScaleAndMatchesFiniteDifferences) {
  for (const double scale : {1.0, 1.0 / (2.0 * 3.0), 0.3}) {
    const Case c{2, 4, 2, 5, 5, 4};
    SCOPED_TRACE(testing::concat_for_trace("scale=", scale));
    auto inputs = inputs_for<double>(c, 7);
    auto& q = inputs.q;
    auto& k = inputs.k;
    auto& v = inputs.v;
    std::mt19937_64 engine(8);
    const auto dout = testing::random_tensor<double, 4>(q.shape(), engine);
    AttentionCache<double> cache;
    causal_attention(q, k, v, cache, scale);
    const auto grads = causal_attention_backward(q, k, v, cache, dout);
    const auto loss = [&] {
      const auto o = causal_attention(q, k, v, scale);
      double total = 0;
      for (index_t i = 0; i < o.size(); ++i) total += o.data()[i] * dout.data()[i];
      return total;
    };
    const testing::GradcheckOptions options{.richardson = true, .sample = 40, .seed = 2};
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, q, grads.q, options));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, k, grads.k, options));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, v, grads.v, options));
  }
}

TEST(AttentionErrors, AScoreScaleThatIsNotFiniteAndPositiveIsRefused) {
  const Tensor<float, 4> q({1, 2, 3, 4}), kv({1, 2, 3, 4});
  Tensor<float, 4> o(q.shape());
  for (const double bad : {0.0, -0.5, std::nan(""), HUGE_VAL}) {
    EXPECT_THROW_WITH(causal_attention(q, kv, kv, bad), ConfigError,
                      "causal_attention: scale must be finite and > 0");
    AttentionCache<float> cache;
    EXPECT_THROW_WITH(causal_attention(q, kv, kv, cache, bad), ConfigError,
                      "causal_attention: scale must be finite and > 0");
    EXPECT_FALSE(cache.scale.has_value());  // a refused forward leaves the cache alone
    EXPECT_THROW_WITH(
        causal_attention_heads_into<float>(heads_of(q.cview()), heads_of(kv.cview()),
                                           heads_of(kv.cview()), heads_of(o.view()), 1, bad),
        ConfigError, "causal_attention_heads_into: scale must be finite and > 0");
  }
  AttentionCache<float> cache;
  causal_attention(q, kv, kv, cache);
  cache.scale = -1.0;  // filled by hand
  EXPECT_THROW_WITH(causal_attention_backward(q, kv, kv, cache, q), ConfigError,
                    "causal_attention_backward: scale must be finite and > 0 (got -1)");
}

TEST(Attention, FlopsCountTheCausalTriangleOnly) {
  // T = S = 4: 1 + 2 + 3 + 4 = 10 (query, key) pairs, each 2·d_k for q·k and 2·d_k for P·v.
  EXPECT_EQ(causal_attention_flops(2, 3, 4, 4, 8), 4 * 2 * 3 * 8 * 10);
  // One decoding step after 99 positions sees 100 keys.
  EXPECT_EQ(causal_attention_flops(1, 1, 1, 100, 64), 4 * 64 * 100);
  EXPECT_THROW(causal_attention_flops(1, 1, 5, 4, 8), ShapeError);
  EXPECT_THROW(causal_attention_flops(1 << 30, 1 << 20, 1 << 20, 1 << 20, 128), OverflowError);
}

TEST(AttentionErrors, EveryShapeThatDoesNotFitIsNamed) {
  const Tensor<float, 4> q({2, 4, 5, 8});
  EXPECT_THROW_WITH(
      causal_attention(q, Tensor<float, 4>({1, 2, 5, 8}), Tensor<float, 4>({1, 2, 5, 8})),
      ShapeError,
      "causal_attention: k must be [B=2, H_kv, S, d_k=8] for q [2, 4, 5, 8], got [1, 2, 5, 8]");
  EXPECT_THROW_WITH(
      causal_attention(q, Tensor<float, 4>({2, 2, 5, 8}), Tensor<float, 4>({2, 2, 6, 8})),
      ShapeError, "v must have k's shape [2, 2, 5, 8], got [2, 2, 6, 8]");
  EXPECT_THROW_WITH(
      causal_attention(q, Tensor<float, 4>({2, 3, 5, 8}), Tensor<float, 4>({2, 3, 5, 8})),
      ShapeError, "k's heads (axis 1) = 3 must divide q's heads H = 4");
  EXPECT_THROW_WITH(
      causal_attention(q, Tensor<float, 4>({2, 2, 4, 8}), Tensor<float, 4>({2, 2, 4, 8})),
      ShapeError, "k holds S = 4 positions (axis 2), fewer than q's T = 5");
  const Tensor<float, 4> kv({2, 2, 5, 8});
  Tensor<float, 4> wrong_out({2, 4, 5, 4});
  EXPECT_THROW_WITH(causal_attention_into(q, kv, kv, wrong_out), ShapeError,
                    "o must have q's shape [2, 4, 5, 8], got [2, 4, 5, 4]");
  Tensor<float, 4> q_copy = q;
  EXPECT_THROW_WITH(causal_attention_into(q_copy, kv, kv, q_copy), ShapeError,
                    "o must not share memory with q, k or v");
  AttentionCache<float> cache;
  EXPECT_THROW_WITH(causal_attention_backward(q, kv, kv, cache, q), ShapeError,
                    "cache.probs must be [B, H, T, S] = [2, 4, 5, 5], got [0, 0, 0, 0]");
  causal_attention(q, kv, kv, cache);
  EXPECT_THROW_WITH(causal_attention_backward(q, kv, kv, cache, Tensor<float, 4>({2, 4, 5, 7})),
                    ShapeError, "dout must have q's shape");
}

}  // namespace test_attention
}  // namespace dissect
