// Tests of dissect/attention/cross_attention.hpp and dissect/blocks/cross_attention.hpp: the
// functional core against a plain-loop masked softmax in double (T ≠ S, grouped-query, a different
// padding per batch element, a fully padded memory), against causal_attention's own arithmetic (one
// query over all S keys is a decoding step), padding against truncation, backward against finite
// differences in double, PyTorch fixtures (core and block, float32 and float64, forward and every
// gradient), the block's parameters and names, and every refused input (reliability row 94).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <optional>
#include <random>
#include <sstream>
#include <vector>

#include "dissect/attention/attention.hpp"
#include "dissect/attention/cross_attention.hpp"
#include "dissect/blocks/cross_attention.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_cross_attention {

using testing::FloatAndDouble;
using testing::random_tensor;

struct Case {
  index_t batch, heads, kv_heads, tokens, keys, head_dim;
};

// T < S, T > S across the 64-row query tile, grouped-query, multi-query.
const std::vector<Case> cases = {
    {2, 4, 4, 3, 5, 8}, {2, 4, 2, 6, 3, 4}, {1, 3, 1, 70, 9, 4}, {3, 2, 1, 2, 11, 6}};

/// A mask with a different pattern per batch element: element 0 unpadded, element 1 its last
/// third padded, element 2 every other key padded and (if `all_padded`) element 2 padded whole.
KeyPaddingMask mixed_mask(index_t batch, index_t keys, bool all_padded = false) {
  std::vector<std::uint8_t> padding(static_cast<std::size_t>(batch * keys), 0);
  for (index_t b = 0; b < batch; ++b) {
    for (index_t j = 0; j < keys; ++j) {
      auto& flag = padding[static_cast<std::size_t>(b * keys + j)];
      if (b == 1) flag = j >= keys - keys / 3;
      if (b == 2) flag = all_padded || j % 2 == 1;
    }
  }
  return KeyPaddingMask(batch, keys, padding);
}

/// o[b, h, t] = Σ_j softmax_j(s·q·k_j over the unpadded j)·v_j in double by plain loops; 0 when
/// every key is padded.
template <class Scalar>
Tensor<double, 4> reference(const Tensor<Scalar, 4>& q, const Tensor<Scalar, 4>& k,
                            const Tensor<Scalar, 4>& v, const KeyPaddingMask& mask) {
  const index_t B = q.dim(0), H = q.dim(1), T = q.dim(2), d = q.dim(3), S = k.dim(2);
  const index_t group = H / k.dim(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Tensor<double, 4> o(q.shape());
  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h) {
      for (index_t t = 0; t < T; ++t) {
        std::vector<double> score(static_cast<std::size_t>(S), -INFINITY);
        double top = -INFINITY, sum = 0;
        for (index_t j = 0; j < S; ++j) {
          if (mask.has_value() && mask.padded(b, j)) continue;
          double s = 0;
          for (index_t i = 0; i < d; ++i) s += double(q(b, h, t, i)) * k(b, h / group, j, i);
          score[j] = s * scale;
          top = std::max(top, score[j]);
        }
        if (top == -INFINITY) continue;  // all padded: o = 0
        for (auto& s : score) sum += (s = std::exp(s - top));
        for (index_t j = 0; j < S; ++j) {
          for (index_t i = 0; i < d; ++i) o(b, h, t, i) += score[j] / sum * v(b, h / group, j, i);
        }
      }
    }
  }
  return o;
}

template <class Scalar>
struct Inputs {
  Tensor<Scalar, 4> q, k, v;
};

template <class Scalar>
Inputs<Scalar> inputs_for(const Case& c, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  return {random_tensor<Scalar, 4>({c.batch, c.heads, c.tokens, c.head_dim}, engine, -2, 2),
          random_tensor<Scalar, 4>({c.batch, c.kv_heads, c.keys, c.head_dim}, engine, -2, 2),
          random_tensor<Scalar, 4>({c.batch, c.kv_heads, c.keys, c.head_dim}, engine, -1, 1)};
}

/// |o − exact| per element, as attention's bound (test_attention.cpp): scores off by
/// δ = γ_d·s·d·max|q|·max|k|, weights by 2(2δ + 4u), the weighted sum by γ_{S+1}; times max|v|,
/// doubled.
template <class Scalar>
double bound_for(const Inputs<Scalar>& x) {
  double q_max = 0, k_max = 0, v_max = 0;
  for (Scalar a : x.q) q_max = std::max(q_max, std::abs(double(a)));
  for (Scalar a : x.k) k_max = std::max(k_max, std::abs(double(a)));
  for (Scalar a : x.v) v_max = std::max(v_max, std::abs(double(a)));
  const index_t d = x.q.dim(3), S = x.k.dim(2);
  const double u = testing::unit_roundoff<Scalar>();
  const double delta = testing::gamma<Scalar>(d) * d * q_max * k_max / std::sqrt(double(d));
  return 2.0 * (2.0 * (2.0 * delta + 4.0 * u) + testing::gamma<Scalar>(S + 1)) * v_max;
}

template <class Scalar>
class CrossAttentionTyped : public ::testing::Test {};
TYPED_TEST_SUITE(CrossAttentionTyped, FloatAndDouble);

TYPED_TEST(CrossAttentionTyped, BothForwardsMatchThePlainLoopReferenceWithAndWithoutPadding) {
  for (const Case& c : cases) {
    SCOPED_TRACE(testing::concat_for_trace("B=", c.batch, " H=", c.heads, " H_kv=", c.kv_heads,
                                           " T=", c.tokens, " S=", c.keys, " d_k=", c.head_dim));
    const auto x = inputs_for<TypeParam>(c, 1);
    for (const bool all_padded : {false, true}) {
      for (const KeyPaddingMask& mask :
           {KeyPaddingMask{}, mixed_mask(c.batch, c.keys, all_padded)}) {
        const auto expected = reference(x.q, x.k, x.v, mask);
        Tensor<double, 4> bound(expected.shape());
        bound.fill(bound_for(x));
        EXPECT_TENSOR_WITHIN(cross_attention(x.q, x.k, x.v, mask), expected, bound) << "tiles";
        CrossAttentionCache<TypeParam> cache;
        EXPECT_TENSOR_WITHIN(cross_attention(x.q, x.k, x.v, cache, mask), expected, bound)
            << "training";
        // Padded keys get probability exactly 0; the others sum to 1 (or 0 if all are padded).
        for (index_t b = 0; b < c.batch; ++b) {
          for (index_t t = 0; t < c.tokens; ++t) {
            double sum = 0;
            bool any = false;
            for (index_t j = 0; j < c.keys; ++j) {
              const bool padded = mask.has_value() && mask.padded(b, j);
              any = any || !padded;
              if (padded) {
                EXPECT_EQ(cache.probs(b, 0, t, j), TypeParam(0));
              }
              sum += cache.probs(b, 0, t, j);
            }
            EXPECT_NEAR(sum, any ? 1.0 : 0.0, testing::gamma<TypeParam>(c.keys + 4));
          }
        }
      }
    }
  }
}

TYPED_TEST(CrossAttentionTyped, OneQueryIsCausalAttentionsDecodingStepOverEveryKey) {
  // Without padding, query t of cross-attention is causal_attention with T = 1 over all S keys
  // (a decoding step sees every key): the existing attention's non-causal arithmetic.
  for (const Case& c : cases) {
    const auto x = inputs_for<TypeParam>(c, 2);
    std::mt19937_64 engine(3);
    const auto dout = random_tensor<TypeParam, 4>(x.q.shape(), engine);
    CrossAttentionCache<TypeParam> cache;
    const auto o = cross_attention(x.q, x.k, x.v, cache);
    const auto grads = cross_attention_backward(x.q, x.k, x.v, cache, dout);
    Tensor<TypeParam, 4> dk_sum(x.k.shape()), dv_sum(x.k.shape());
    const double tol = std::is_same_v<TypeParam, float> ? 1e-5 : 1e-13;
    for (index_t t = 0; t < c.tokens; ++t) {
      Tensor<TypeParam, 4> q_t({c.batch, c.heads, 1, c.head_dim}),
          dout_t({c.batch, c.heads, 1, c.head_dim});
      for (index_t b = 0; b < c.batch; ++b) {
        for (index_t h = 0; h < c.heads; ++h) {
          for (index_t i = 0; i < c.head_dim; ++i) {
            q_t(b, h, 0, i) = x.q(b, h, t, i);
            dout_t(b, h, 0, i) = dout(b, h, t, i);
          }
        }
      }
      AttentionCache<TypeParam> step_cache;
      const auto o_t = causal_attention(q_t, x.k, x.v, step_cache);
      const auto step = causal_attention_backward(q_t, x.k, x.v, step_cache, dout_t);
      for (index_t b = 0; b < c.batch; ++b) {
        for (index_t h = 0; h < c.heads; ++h) {
          for (index_t i = 0; i < c.head_dim; ++i) {
            EXPECT_NEAR(o(b, h, t, i), o_t(b, h, 0, i), tol);
            EXPECT_NEAR(grads.q(b, h, t, i), step.q(b, h, 0, i), tol);
          }
        }
      }
      for (index_t i = 0; i < dk_sum.size(); ++i) {
        dk_sum.data()[i] += step.k.data()[i];
        dv_sum.data()[i] += step.v.data()[i];
      }
    }
    EXPECT_TENSOR_NEAR(grads.k, dk_sum, tol, tol);  // dk, dv sum over the queries
    EXPECT_TENSOR_NEAR(grads.v, dv_sum, tol, tol);
  }
}

TEST(CrossAttention, PaddingIsTruncationAndPaddedKeysGetNoGradient) {
  // Memory b of length n_b padded to S gives what the memory of n_b positions alone gives; the
  // values at padded positions change nothing, and their dk and dv are exactly 0.
  const Case c{3, 4, 2, 5, 7, 4};
  auto x = inputs_for<double>(c, 5);
  const std::vector<index_t> lengths{7, 4, 1};
  const auto mask = KeyPaddingMask::from_lengths(lengths, c.keys);
  std::mt19937_64 engine(6);
  const auto dout = random_tensor<double, 4>(x.q.shape(), engine);
  CrossAttentionCache<double> cache;
  const auto o = cross_attention(x.q, x.k, x.v, cache, mask);
  const auto grads = cross_attention_backward(x.q, x.k, x.v, cache, dout);
  for (index_t b = 0; b < c.batch; ++b) {
    const index_t n = lengths[static_cast<std::size_t>(b)];
    Tensor<double, 4> q_b({1, c.heads, c.tokens, c.head_dim}), k_b({1, c.kv_heads, n, c.head_dim}),
        v_b({1, c.kv_heads, n, c.head_dim}), dout_b(q_b.shape());
    for (index_t h = 0; h < c.heads; ++h) {
      for (index_t t = 0; t < c.tokens; ++t) {
        for (index_t i = 0; i < c.head_dim; ++i) {
          q_b(0, h, t, i) = x.q(b, h, t, i);
          dout_b(0, h, t, i) = dout(b, h, t, i);
        }
      }
    }
    for (index_t g = 0; g < c.kv_heads; ++g) {
      for (index_t j = 0; j < n; ++j) {
        for (index_t i = 0; i < c.head_dim; ++i) {
          k_b(0, g, j, i) = x.k(b, g, j, i);
          v_b(0, g, j, i) = x.v(b, g, j, i);
        }
      }
    }
    CrossAttentionCache<double> cache_b;
    const auto o_b = cross_attention(q_b, k_b, v_b, cache_b);
    const auto g_b = cross_attention_backward(q_b, k_b, v_b, cache_b, dout_b);
    for (index_t h = 0; h < c.heads; ++h) {
      for (index_t t = 0; t < c.tokens; ++t) {
        for (index_t i = 0; i < c.head_dim; ++i) {
          EXPECT_NEAR(o(b, h, t, i), o_b(0, h, t, i), 1e-14);
          EXPECT_NEAR(grads.q(b, h, t, i), g_b.q(0, h, t, i), 1e-14);
        }
      }
    }
    for (index_t g = 0; g < c.kv_heads; ++g) {
      for (index_t j = 0; j < c.keys; ++j) {
        for (index_t i = 0; i < c.head_dim; ++i) {
          if (j < n) {
            EXPECT_NEAR(grads.k(b, g, j, i), g_b.k(0, g, j, i), 1e-14);
            EXPECT_NEAR(grads.v(b, g, j, i), g_b.v(0, g, j, i), 1e-14);
          } else {
            EXPECT_EQ(grads.k(b, g, j, i), 0.0);
            EXPECT_EQ(grads.v(b, g, j, i), 0.0);
            // Finite garbage in the padding changes nothing (NaN would not stay out: 0·NaN is
            // NaN in P·v and in dq = dS·k, as in torch).
            x.k(b, g, j, i) = 1e3;
            x.v(b, g, j, i) = -1e3;
          }
        }
      }
    }
  }
  CrossAttentionCache<double> garbage_cache;
  EXPECT_TENSOR_EQ(cross_attention(x.q, x.k, x.v, garbage_cache, mask), o);
  EXPECT_TENSOR_EQ(cross_attention_backward(x.q, x.k, x.v, garbage_cache, dout).q, grads.q);
}

TEST(CrossAttention, AFullyPaddedMemoryGivesZeroOutputAndZeroGradients) {
  // The defined choice (reliability row 94): no key to attend to → o = 0, dq = 0, and nothing
  // flows into k or v — not the NaN of a softmax over −inf.
  const Case c{2, 2, 1, 3, 4, 4};
  const auto x = inputs_for<double>(c, 7);
  const auto mask = KeyPaddingMask::from_lengths(std::vector<index_t>{4, 0}, c.keys);
  std::mt19937_64 engine(8);
  const auto dout = random_tensor<double, 4>(x.q.shape(), engine);
  CrossAttentionCache<double> cache;
  const auto o = cross_attention(x.q, x.k, x.v, cache, mask);
  const auto inference = cross_attention(x.q, x.k, x.v, mask);
  const auto grads = cross_attention_backward(x.q, x.k, x.v, cache, dout);
  for (index_t h = 0; h < c.heads; ++h) {
    for (index_t t = 0; t < c.tokens; ++t) {
      for (index_t i = 0; i < c.head_dim; ++i) {
        EXPECT_EQ(o(1, h, t, i), 0.0);
        EXPECT_EQ(inference(1, h, t, i), 0.0);
        EXPECT_EQ(grads.q(1, h, t, i), 0.0);
        EXPECT_NE(o(0, h, t, i), 0.0);  // the unpadded element is untouched by its neighbour
      }
    }
  }
  for (index_t j = 0; j < c.keys; ++j) {
    for (index_t i = 0; i < c.head_dim; ++i) {
      EXPECT_EQ(grads.k(1, 0, j, i), 0.0);
      EXPECT_EQ(grads.v(1, 0, j, i), 0.0);
    }
  }
}

TEST(CrossAttention, BackwardMatchesFiniteDifferencesWithPadding) {
  for (const Case& c : {Case{2, 4, 2, 3, 5, 4}, Case{3, 2, 1, 4, 6, 3}, Case{1, 3, 3, 70, 4, 2}}) {
    SCOPED_TRACE(testing::concat_for_trace("H=", c.heads, " H_kv=", c.kv_heads, " T=", c.tokens,
                                           " S=", c.keys));
    auto inputs = inputs_for<double>(c, 9);
    auto& q = inputs.q;
    auto& k = inputs.k;
    auto& v = inputs.v;
    const auto mask = mixed_mask(c.batch, c.keys);
    std::mt19937_64 engine(10);
    const auto dout = random_tensor<double, 4>(q.shape(), engine);
    CrossAttentionCache<double> cache;
    (void)cross_attention(q, k, v, cache, mask);
    const auto grads = cross_attention_backward(q, k, v, cache, dout);
    const auto loss = [&] {
      const auto o = cross_attention(q, k, v, mask);
      double total = 0;
      for (index_t i = 0; i < o.size(); ++i) total += o.data()[i] * dout.data()[i];
      return total;
    };
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, q, grads.q));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, k, grads.k));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, v, grads.v));
  }
}

// ---- the block ----------------------------------------------------------------------------------

TEST(CrossAttentionBlock, ParametersHaveTorchNamesAndShapes) {
  CrossAttention<float> block(8, 4, {.d_memory = 6, .n_kv_heads = 2, .seed = 1});
  static_assert(Module<CrossAttention<float>>);
  EXPECT_EQ(parameter_names(block),
            (std::vector<std::string>{"q_proj.weight", "q_proj.bias", "k_proj.weight",
                                      "k_proj.bias", "v_proj.weight", "v_proj.bias",
                                      "out_proj.weight", "out_proj.bias"}));
  EXPECT_EQ(block.q_proj().weight().shape(), (Shape<2>{8, 8}));
  EXPECT_EQ(block.k_proj().weight().shape(), (Shape<2>{4, 6}));  // H_kv·d_k = 2·2, D_mem = 6
  EXPECT_EQ(block.v_proj().weight().shape(), (Shape<2>{4, 6}));
  EXPECT_EQ(block.out_proj().weight().shape(), (Shape<2>{8, 8}));
  EXPECT_EQ(block.parameter_count(), 8 * 8 + 8 + 2 * (4 * 6 + 4) + 8 * 8 + 8);
  std::ostringstream printed;
  printed << block;
  EXPECT_EQ(printed.str(),
            "CrossAttention(d_model=8, d_memory=6, n_heads=4, n_kv_heads=2, bias=true)");
  // One seed, four consecutive layer seeds: the same block twice.
  CrossAttention<float> again(8, 4, {.d_memory = 6, .n_kv_heads = 2, .seed = 1});
  EXPECT_TENSOR_EQ(again.v_proj().weight(), block.v_proj().weight());
  EXPECT_EQ(CrossAttention<double>(6, 2).d_memory(), 6);  // D_mem defaults to D
}

TEST(CrossAttentionBlock, BackwardMatchesFiniteDifferencesForInputsAndParameters) {
  CrossAttention<double> block(6, 3, {.d_memory = 5, .n_kv_heads = 1, .seed = 11});
  std::mt19937_64 engine(12);
  auto x = random_tensor<double, 3>({2, 3, 6}, engine);
  auto memory = random_tensor<double, 3>({2, 4, 5}, engine);
  const auto dy = random_tensor<double, 3>({2, 3, 6}, engine);
  const auto mask = KeyPaddingMask::from_lengths(std::vector<index_t>{4, 2}, 4);
  CrossAttention<double>::Cache cache;
  (void)block.forward(x, memory, cache, mask);
  block.zero_grad();
  const auto grads = block.backward(x, memory, cache, dy);
  const auto loss = [&] {
    const auto y = block.forward(x, memory, mask);
    double total = 0;
    for (index_t i = 0; i < y.size(); ++i) total += y.data()[i] * dy.data()[i];
    return total;
  };
  EXPECT_GRADIENT_OK(testing::gradcheck(loss, x, grads.dx));
  EXPECT_GRADIENT_OK(testing::gradcheck(loss, memory, grads.dmemory));
  block.for_each_parameter([&](const ParameterName& name, auto value, auto grad) {
    SCOPED_TRACE(name.str());
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, value, grad));
  });
  // The inference forward is the training forward.
  EXPECT_TENSOR_NEAR(block.forward(x, memory, mask), block.forward(x, memory, cache, mask), 1e-15,
                     1e-15);
}

TEST(CrossAttentionBlock, AProjectedMemoryServesDecodingStepByStep) {
  // A decoder projects its encoder's memory once; each step's token then gives what the whole
  // sequence's forward gives at that position (cross-attention has no causal mask).
  CrossAttention<double> block(8, 4, {.d_memory = 5, .n_kv_heads = 2, .seed = 21});
  std::mt19937_64 engine(22);
  const auto x = random_tensor<double, 3>({2, 4, 8}, engine);
  const auto memory = random_tensor<double, 3>({2, 6, 5}, engine);
  const auto mask = KeyPaddingMask::from_lengths(std::vector<index_t>{6, 3}, 6);
  const auto full = block.forward(x, memory, mask);
  const auto kv = block.project_memory(memory);
  EXPECT_TENSOR_NEAR(block.forward(x, kv, mask), full, 1e-14, 1e-14);
  for (index_t t = 0; t < 4; ++t) {
    Tensor<double, 3> token({2, 1, 8});
    for (index_t b = 0; b < 2; ++b) {
      for (index_t i = 0; i < 8; ++i) token(b, 0, i) = x(b, t, i);
    }
    const auto y = block.forward(token, kv, mask);
    for (index_t b = 0; b < 2; ++b) {
      for (index_t i = 0; i < 8; ++i) EXPECT_NEAR(y(b, 0, i), full(b, t, i), 1e-14);
    }
  }
  EXPECT_THROW_WITH(block.forward(random_tensor<double, 3>({3, 1, 8}, engine), kv), ShapeError,
                    "CrossAttention::forward: the projected memory's k and v must be [B=3, "
                    "H_kv=2, S, d_k=2] (x [3, 1, 8], k [2, 2, 6, 2], v [2, 2, 6, 2])");
  EXPECT_THROW_WITH((void)block.project_memory(Tensor<double, 3>({2, 0, 5})), ShapeError,
                    "CrossAttention::project_memory: the memory holds S = 0 positions");
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

template <class Scalar>
double fixture_tol() {
  return std::is_same_v<Scalar, float> ? 2e-5 : 1e-12;
}

template <class Scalar>
KeyPaddingMask mask_from(const testing::Fixture& fixture) {
  const auto& padding = fixture.tensor("padding");
  if (!fixture.meta_bool("mask")) return {};
  std::vector<std::uint8_t> flags(padding.values.begin(), padding.values.end());
  return KeyPaddingMask(padding.shape[0], padding.shape[1], flags);
}

template <class Scalar>
void check_core(const testing::Fixture& fixture) {
  const auto t = [&](const char* name) {
    return testing::tensor_from<Scalar, 4>(fixture.tensor(name));
  };
  const auto q = t("q"), k = t("k"), v = t("v");
  const auto mask = mask_from<Scalar>(fixture);
  const double tol = fixture_tol<Scalar>();
  CrossAttentionCache<Scalar> cache;
  EXPECT_TENSOR_NEAR(cross_attention(q, k, v, mask), t("o"), tol, tol);
  EXPECT_TENSOR_NEAR(cross_attention(q, k, v, cache, mask), t("o"), tol, tol);
  const auto grads = cross_attention_backward(q, k, v, cache, t("dout"));
  EXPECT_TENSOR_NEAR(grads.q, t("dq"), tol, tol);
  EXPECT_TENSOR_NEAR(grads.k, t("dk"), tol, tol);
  EXPECT_TENSOR_NEAR(grads.v, t("dv"), tol, tol);
}

template <class Scalar>
void check_block(const testing::Fixture& fixture) {
  const auto t3 = [&](const char* name) {
    return testing::tensor_from<Scalar, 3>(fixture.tensor(name));
  };
  const auto x = t3("x"), memory = t3("memory");
  const bool bias = fixture.meta_bool("bias");
  CrossAttention<Scalar> block(
      x.dim(2), fixture.meta_int("n_heads"),
      {.d_memory = memory.dim(2), .n_kv_heads = fixture.meta_int("n_kv_heads"), .bias = bias});
  const std::pair<Linear<Scalar>*, std::string> layers[] = {{&block.q_proj(), "_q"},
                                                            {&block.k_proj(), "_k"},
                                                            {&block.v_proj(), "_v"},
                                                            {&block.out_proj(), "_out"}};
  for (const auto& [layer, suffix] : layers) {
    layer->set_weight(testing::tensor_from<Scalar, 2>(fixture.tensor("W" + suffix)));
    if (bias) layer->set_bias(testing::tensor_from<Scalar, 1>(fixture.tensor("b" + suffix)));
  }
  const auto mask = mask_from<Scalar>(fixture);
  const double tol = fixture_tol<Scalar>();
  typename CrossAttention<Scalar>::Cache cache;
  EXPECT_TENSOR_NEAR(block.forward(x, memory, mask), t3("y"), tol, tol);
  EXPECT_TENSOR_NEAR(block.forward(x, memory, cache, mask), t3("y"), tol, tol);
  const auto grads = block.backward(x, memory, cache, t3("dy"));
  EXPECT_TENSOR_NEAR(grads.dx, t3("dx"), tol, tol);
  EXPECT_TENSOR_NEAR(grads.dmemory, t3("dmemory"), tol, tol);
  for (const auto& [layer, suffix] : layers) {
    SCOPED_TRACE(suffix);
    const auto dW = testing::tensor_from<Scalar, 2>(fixture.tensor("dW" + suffix));
    EXPECT_TENSOR_NEAR(layer->weight_grad(), dW, tol, tol);
    if (bias) {
      const auto db = testing::tensor_from<Scalar, 1>(fixture.tensor("db" + suffix));
      EXPECT_TENSOR_NEAR(layer->bias_grad(), db, tol, tol);
    }
  }
}

TYPED_TEST(CrossAttentionTyped, MatchesTorchsMaskedSoftmaxAttentionAndItsGradients) {
  const auto check = [](const testing::Fixture& fixture) {
    if (fixture.meta_str("kind") == "core") return check_core<TypeParam>(fixture);
    check_block<TypeParam>(fixture);
  };
  EXPECT_EQ(testing::for_each_fixture<TypeParam>("cross_attention", check), 6);
}

// ---- bad input (reliability row 94)
// --------------------------------------------------------------

TEST(CrossAttentionErrors, ShapesMasksAndScalesNameTheOpAndTheShapes) {
  const Tensor<float, 4> q({2, 4, 3, 8}), k({2, 2, 5, 8});
  EXPECT_THROW_WITH(
      cross_attention(q, Tensor<float, 4>({2, 2, 5, 4}), Tensor<float, 4>({2, 2, 5, 4})),
      ShapeError,
      "cross_attention: k must be [B=2, H_kv, S, d_k=8] (q [2, 4, 3, 8], k [2, 2, 5, 4]");
  EXPECT_THROW_WITH(
      cross_attention(q, Tensor<float, 4>({1, 2, 5, 8}), Tensor<float, 4>({1, 2, 5, 8})),
      ShapeError, "k must be [B=2");
  EXPECT_THROW_WITH(
      cross_attention(q, k, Tensor<float, 4>({2, 2, 6, 8})), ShapeError,
      "cross_attention: v must have k's shape (q [2, 4, 3, 8], k [2, 2, 5, 8], v [2, 2, 6, 8])");
  EXPECT_THROW_WITH(
      cross_attention(q, Tensor<float, 4>({2, 3, 5, 8}), Tensor<float, 4>({2, 3, 5, 8})),
      ShapeError, "cross_attention: k's heads (axis 1) = 3 must divide q's heads H = 4");
  EXPECT_THROW_WITH(
      cross_attention(q, Tensor<float, 4>({2, 2, 0, 8}), Tensor<float, 4>({2, 2, 0, 8})),
      ShapeError, "cross_attention: the memory holds S = 0 positions");
  const auto wrong_mask = KeyPaddingMask::from_lengths(std::vector<index_t>{5, 5, 5}, 5);
  EXPECT_THROW_WITH(cross_attention(q, k, k, wrong_mask), ShapeError,
                    "cross_attention: the key padding mask must be [B=2, S=5], got [3, 5]");
  EXPECT_THROW_WITH(
      cross_attention(q, k, k, KeyPaddingMask::from_lengths(std::vector<index_t>{5, 5}, 6)),
      ShapeError, "got [2, 6]");
  EXPECT_THROW_WITH(cross_attention(q, k, k, {}, 0.0), ConfigError,
                    "cross_attention: scale must be finite and > 0 (got 0)");
  // The mask itself.
  EXPECT_THROW_WITH(KeyPaddingMask(2, 3, {0, 1}), ShapeError,
                    "KeyPaddingMask: 2 flags for [B, S] = [2, 3] (6 positions)");
  EXPECT_THROW_WITH(KeyPaddingMask(1, 2, {0, 2}), Error,
                    "KeyPaddingMask: padding[1] = 2 is neither 0");
  EXPECT_THROW_WITH(KeyPaddingMask::from_lengths(std::vector<index_t>{3, 6}, 5), ShapeError,
                    "KeyPaddingMask::from_lengths: length 6 of memory 1 is outside [0, S = 5]");
  // Backward: dout and the cache; a refused training forward leaves the cache as it was.
  CrossAttentionCache<float> cache;
  (void)cross_attention(q, k, k, cache);
  const auto probs = testing::snapshot(cache.probs);
  EXPECT_THROW_WITH(cross_attention(q, k, k, cache, wrong_mask), ShapeError, "key padding mask");
  EXPECT_TENSOR_EQ(cache.probs, probs);
  EXPECT_THROW_WITH(
      cross_attention_backward(q, k, k, cache, Tensor<float, 4>({2, 4, 3, 7})), ShapeError,
      "cross_attention_backward: dout must have q's shape [2, 4, 3, 8], got [2, 4, 3, 7]");
  const Tensor<float, 4> k6({2, 2, 6, 8});
  EXPECT_THROW_WITH(
      cross_attention_backward(q, k6, k6, cache, q), ShapeError,
      "cross_attention_backward: cache.probs must be [B, H, T, S] = [2, 4, 3, 6], got "
      "[2, 4, 3, 5] (fill the cache with cross_attention(q, k, v, cache))");
}

TEST(CrossAttentionErrors, TheBlockRefusesWithoutTouchingItsGradients) {
  EXPECT_THROW_WITH(CrossAttention<float>(8, 3), ConfigError, "CrossAttention");
  EXPECT_THROW_WITH(CrossAttention<float>(8, 4, {.d_memory = 0}), ConfigError, "d_memory");
  EXPECT_THROW_WITH(CrossAttention<float>(8, 4, {.n_kv_heads = 3}), ConfigError, "n_kv_heads");
  EXPECT_THROW_WITH(CrossAttention<float>(8, 4, {.scale = -1.0}), ConfigError,
                    "CrossAttention: scale must be finite and > 0");
  CrossAttention<double> block(8, 4, {.d_memory = 6, .seed = 2});
  std::mt19937_64 engine(13);
  const auto x = random_tensor<double, 3>({2, 3, 8}, engine);
  const auto memory = random_tensor<double, 3>({2, 5, 6}, engine);
  EXPECT_THROW_WITH(block.forward(x, random_tensor<double, 3>({2, 5, 8}, engine)), ShapeError,
                    "CrossAttention::forward: memory must be [B, T, D_mem=6], got [2, 5, 8]");
  EXPECT_THROW_WITH(
      block.forward(x, random_tensor<double, 3>({1, 5, 6}, engine)), ShapeError,
      "CrossAttention::forward: memory must have x's batch B = 2 (x [2, 3, 8], memory [1, 5, 6])");
  EXPECT_THROW_WITH(block.forward(x, Tensor<double, 3>({2, 0, 6})), ShapeError,
                    "CrossAttention::forward: the memory holds S = 0 positions");
  EXPECT_THROW_WITH(
      block.forward(x, memory, KeyPaddingMask::from_lengths(std::vector<index_t>{5}, 5)),
      ShapeError, "the key padding mask must be [B=2, S=5], got [1, 5]");
  CrossAttention<double>::Cache cache;
  (void)block.forward(x, memory, cache);
  block.zero_grad();
  const auto dy = random_tensor<double, 3>({2, 3, 8}, engine);
  EXPECT_THROW_WITH(block.backward(x, memory, cache, random_tensor<double, 3>({2, 4, 8}, engine)),
                    ShapeError, "CrossAttention::backward: dy must be [B, T, D=8] = [2, 3, 8]");
  const auto other_memory = random_tensor<double, 3>({2, 4, 6}, engine);
  EXPECT_THROW_WITH(
      block.backward(x, other_memory, cache, dy), ShapeError,
      "CrossAttention::backward: cache.k must be [B, H_kv=4, S, d_k=2] = [2, 4, 4, 2] "
      "for memory [2, 4, 6], got [2, 4, 5, 2] (fill the cache with forward(x, cache))");
  auto bad_scale = cache;
  bad_scale.attention.scale = -2.0;
  EXPECT_THROW_WITH(block.backward(x, memory, bad_scale, dy), ConfigError, "scale");
  block.for_each_parameter([](const ParameterName& name, auto, auto grad) {
    for (index_t i = 0; i < grad.size(); ++i) ASSERT_EQ(grad.data()[i], 0.0) << name;
  });
}

}  // namespace test_cross_attention
}  // namespace dissect
