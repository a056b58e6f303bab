// Tests of sliding-window attention (attention.hpp's `window`) and RollingKVCache
// (rolling_kv_cache.hpp): every entry point against a plain-loop reference in double with the
// band mask (shapes across the 64-wide tiles, W = 1, GQA, earlier positions in front), W ≥ S
// bit for bit the unwindowed path, backward by finite differences in double and against PyTorch
// (explicit band mask + softmax, float32 and float64), the banded FLOP count, the rolling cache
// decoding far past its window with constant memory, and every refused window, config and shape.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>
#include <random>
#include <vector>

#include "dissect/attention/attention.hpp"
#include "dissect/attention/rolling_kv_cache.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_sliding_window {

using testing::FloatAndDouble;

struct Case {
  index_t batch, heads, kv_heads, tokens, keys, head_dim, window;
};

// W = 1 (a query sees itself only); GQA; T not a multiple of the 64-row query block with a window
// inside one key tile and one wider than a tile (65), so bands start mid-tile and span two; 70
// new positions after 10 (the early rows of the second query block see none of the last key
// tile); a decoding step after 199 with W = 50; W = T with S > T, which still excludes keys.
const std::vector<Case> cases = {
    {2, 4, 2, 7, 7, 4, 3},      {1, 2, 2, 6, 6, 3, 1},      {1, 3, 1, 70, 70, 4, 17},
    {1, 2, 1, 130, 130, 4, 65}, {1, 2, 2, 70, 80, 6, 20},   {2, 2, 1, 1, 200, 8, 50},
    {1, 2, 1, 5, 9, 4, 5},      {1, 2, 1, 100, 100, 2, 64},
};

/// o[b, h, t] = Σ_j softmax_j(s·q·k_j)·v_j over the band p − W < j ≤ p, p = S − T + t, in double
/// by plain loops (W = 0: no window); s = 1/√d_k.
template <class Scalar>
Tensor<double, 4> reference(const Tensor<Scalar, 4>& q, const Tensor<Scalar, 4>& k,
                            const Tensor<Scalar, 4>& v, index_t window) {
  const index_t B = q.dim(0), H = q.dim(1), T = q.dim(2), d = q.dim(3), S = k.dim(2);
  const index_t group = H / k.dim(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  Tensor<double, 4> o(q.shape());
  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h) {
      for (index_t t = 0; t < T; ++t) {
        const index_t p = S - T + t, first = window > 0 ? std::max<index_t>(0, p - window + 1) : 0;
        std::vector<double> score;
        double top = -INFINITY, sum = 0;
        for (index_t j = first; j <= p; ++j) {
          double s = 0;
          for (index_t i = 0; i < d; ++i) s += double(q(b, h, t, i)) * k(b, h / group, j, i);
          score.push_back(s * scale);
          top = std::max(top, score.back());
        }
        for (auto& s : score) sum += (s = std::exp(s - top));
        for (index_t j = first; j <= p; ++j) {
          for (index_t i = 0; i < d; ++i) {
            o(b, h, t, i) += score[j - first] / sum * v(b, h / group, j, i);
          }
        }
      }
    }
  }
  return o;
}

/// test_attention's bound (Higham §3.1: the scores off by δ = γ_d·s·d·max|q|·max|k|, the
/// weights by 2·(2δ + 4u), the weighted sum adds γ_S; times max|v|, doubled). The window only
/// shortens the sums, so the unwindowed bound holds.
template <class Scalar>
double bound_of(const Tensor<Scalar, 4>& q, const Tensor<Scalar, 4>& k,
                const Tensor<Scalar, 4>& v) {
  double q_max = 0, k_max = 0, v_max = 0;
  for (Scalar x : q) q_max = std::max(q_max, std::abs(double(x)));
  for (Scalar x : k) k_max = std::max(k_max, std::abs(double(x)));
  for (Scalar x : v) v_max = std::max(v_max, std::abs(double(x)));
  const index_t d = q.dim(3), S = k.dim(2);
  const double u = testing::unit_roundoff<Scalar>();
  const double delta = testing::gamma<Scalar>(d) * d * q_max * k_max / std::sqrt(double(d));
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

std::string trace_of(const Case& c) {
  return testing::concat_for_trace("B=", c.batch, " H=", c.heads, " H_kv=", c.kv_heads,
                                   " T=", c.tokens, " S=", c.keys, " d_k=", c.head_dim,
                                   " W=", c.window);
}

template <class Scalar>
class SlidingWindow : public ::testing::Test {};
TYPED_TEST_SUITE(SlidingWindow, FloatAndDouble);

TYPED_TEST(SlidingWindow, EveryEntryPointMatchesTheBandMaskedReference) {
  for (const Case& c : cases) {
    SCOPED_TRACE(trace_of(c));
    const auto [q, k, v] = inputs_for<TypeParam>(c, 1);
    const auto expected = reference(q, k, v, c.window);
    Tensor<double, 4> bound(expected.shape());
    bound.fill(bound_of(q, k, v));
    EXPECT_TENSOR_WITHIN(causal_attention(q, k, v, std::nullopt, c.window), expected, bound)
        << "online softmax";
    AttentionCache<TypeParam> cache;
    EXPECT_TENSOR_WITHIN(causal_attention(q, k, v, cache, std::nullopt, c.window), expected, bound)
        << "training";
    EXPECT_EQ(cache.window, c.window);
    Tensor<TypeParam, 4> o(q.shape());
    causal_attention_heads_into<TypeParam>(heads_of(q.cview()), heads_of(k.cview()),
                                           heads_of(v.cview()), heads_of(o.view()), c.batch,
                                           std::nullopt, c.window);
    EXPECT_TENSOR_WITHIN(o, expected, bound) << "heads (the KV-cache step)";
    // The window moves the result: the unwindowed reference is far from it wherever a key is
    // excluded (this test could not pass with the window ignored).
    if (c.window < c.keys) {
      const auto full = reference(q, k, v, 0);
      double moved = 0;
      for (index_t i = 0; i < full.size(); ++i) {
        moved = std::max(moved, std::abs(full.data()[i] - expected.data()[i]));
      }
      EXPECT_GT(moved, 100 * bound_of(q, k, v));
    }
    // The probabilities: exactly 0 outside the band, rows summing to 1.
    const auto& p = cache.probs;
    for (index_t t = 0; t < c.tokens; ++t) {
      const index_t position = c.keys - c.tokens + t;
      double sum = 0;
      for (index_t j = 0; j < c.keys; ++j) {
        if (j > position || position - j >= c.window) {
          ASSERT_EQ(p(0, 0, t, j), TypeParam(0)) << "t=" << t << " j=" << j;
        } else {
          EXPECT_GT(p(0, 0, t, j), TypeParam(0));
        }
        sum += p(0, 0, t, j);
      }
      EXPECT_NEAR(sum, 1.0, testing::gamma<TypeParam>(c.keys + 4));
    }
  }
}

TYPED_TEST(SlidingWindow, AWindowThatExcludesNoKeyIsTheCausalPathBitForBit) {
  for (const Case& c :
       {Case{2, 4, 2, 7, 7, 4, 7}, Case{1, 2, 1, 70, 70, 4, 1000}, Case{1, 2, 1, 5, 9, 4, 9}}) {
    SCOPED_TRACE(trace_of(c));
    const auto [q, k, v] = inputs_for<TypeParam>(c, 2);
    EXPECT_TENSOR_EQ(causal_attention(q, k, v, std::nullopt, c.window), causal_attention(q, k, v));
    AttentionCache<TypeParam> windowed, full;
    EXPECT_TENSOR_EQ(causal_attention(q, k, v, windowed, std::nullopt, c.window),
                     causal_attention(q, k, v, full));
    EXPECT_TENSOR_EQ(windowed.probs, full.probs);
    std::mt19937_64 engine(3);
    const auto dout = testing::random_tensor<TypeParam, 4>(q.shape(), engine);
    const auto a = causal_attention_backward(q, k, v, windowed, dout);
    const auto b = causal_attention_backward(q, k, v, full, dout);
    EXPECT_TENSOR_EQ(a.q, b.q);
    EXPECT_TENSOR_EQ(a.k, b.k);
    EXPECT_TENSOR_EQ(a.v, b.v);
  }
  // S − 1 is the widest window that still excludes a key (the last query loses key 0).
  const Case c{1, 2, 1, 5, 9, 4, 8};
  const auto [q, k, v] = inputs_for<TypeParam>(c, 4);
  const auto windowed = causal_attention(q, k, v, std::nullopt, c.window);
  const auto full = causal_attention(q, k, v);
  EXPECT_NE(windowed(0, 0, 4, 0), full(0, 0, 4, 0));
}

TEST(SlidingWindow, BackwardMatchesFiniteDifferences) {
  for (const Case& c :
       {Case{2, 4, 2, 7, 7, 4, 3}, Case{1, 2, 1, 5, 9, 6, 4}, Case{1, 2, 2, 6, 6, 3, 1},
        Case{1, 3, 1, 70, 70, 2, 17}, Case{1, 2, 1, 70, 80, 2, 66}}) {
    SCOPED_TRACE(trace_of(c));
    // Named references: the loss lambda captures them (clang before 16 refuses bindings).
    auto inputs = inputs_for<double>(c, 5);
    auto& q = inputs.q;
    auto& k = inputs.k;
    auto& v = inputs.v;
    std::mt19937_64 engine(6);
    const auto dout = testing::random_tensor<double, 4>(q.shape(), engine);
    AttentionCache<double> cache;
    causal_attention(q, k, v, cache, std::nullopt, c.window);
    const auto grads = causal_attention_backward(q, k, v, cache, dout);
    const auto loss = [&] {
      const auto o = causal_attention(q, k, v, std::nullopt, c.window);
      double total = 0;
      for (index_t i = 0; i < o.size(); ++i) total += o.data()[i] * dout.data()[i];
      return total;
    };
    const testing::GradcheckOptions options{.richardson = true, .sample = 40, .seed = 1};
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, q, grads.q, options));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, k, grads.k, options));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, v, grads.v, options));
    // A key that no query's band reaches gets no gradient at all (S > T: keys before the first
    // query's band).
    const index_t unreached = c.keys - c.tokens - c.window + 1;
    for (index_t j = 0; j < unreached; ++j) {
      for (index_t i = 0; i < c.head_dim; ++i) {
        EXPECT_EQ(grads.k(0, 0, j, i), 0.0);
        EXPECT_EQ(grads.v(0, 0, j, i), 0.0);
      }
    }
  }
}

// ---- PyTorch fixtures: explicit band mask, softmax, autograd ---------------------------------

#ifdef DISSECT_FIXTURE_DIR
template <class Scalar>
void check_fixture(const testing::Fixture& fixture) {
  const auto tensor = [&](const char* name) {
    return testing::tensor_from<Scalar, 4>(fixture.tensor(name));
  };
  const auto q = tensor("q"), k = tensor("k"), v = tensor("v"), dout = tensor("dout");
  const index_t window = fixture.meta_int("window");
  // Against torch: both round independently, each within bound_of of the exact output. The
  // gradients' dS sums S products dP·P, each as far off as the forward's weights, so their bound
  // grows by S, relative to the larger of the gradient's and dout's magnitude (a heuristic with
  // room: a wrong band or a lost group sum moves them by O(1) of that).
  const double bound = bound_of(q, k, v);
  Tensor<double, 4> forward_bound(q.shape());
  forward_bound.fill(2 * bound);
  const auto expected = testing::to_double(tensor("o"));
  EXPECT_TENSOR_WITHIN(causal_attention(q, k, v, std::nullopt, window), expected, forward_bound);
  AttentionCache<Scalar> cache;
  EXPECT_TENSOR_WITHIN(causal_attention(q, k, v, cache, std::nullopt, window), expected,
                       forward_bound);
  const auto grads = causal_attention_backward(q, k, v, cache, dout);
  double dout_max = 0;
  for (Scalar x : dout) dout_max = std::max(dout_max, std::abs(double(x)));
  const auto check = [&](const Tensor<Scalar, 4>& ours, const char* name) {
    const auto theirs = testing::to_double(tensor(name));
    double scale = 0;
    for (double x : theirs) scale = std::max(scale, std::abs(x));
    Tensor<double, 4> b(theirs.shape());
    b.fill(8 * bound * std::max(scale, dout_max) * std::max<index_t>(k.dim(2), 1));
    EXPECT_TENSOR_WITHIN(ours, theirs, b) << name;
  };
  check(grads.q, "dq");
  check(grads.k, "dk");
  check(grads.v, "dv");
}

TYPED_TEST(SlidingWindow, MatchesTorchForwardAndGradients) {
  int cases = 0;
  testing::for_each_fixture<TypeParam>("sliding_window", [&](const testing::Fixture& fixture) {
    if (!fixture.has_meta("window")) return;  // the model case, read by test_models
    check_fixture<TypeParam>(fixture);
    ++cases;
  });
  EXPECT_EQ(cases, 5);
}
#endif

TEST(SlidingWindow, FlopsCountTheBandOnly) {
  // Brute force: query t at position p = S − T + t sees min(W, p + 1) keys, 4·d_k FLOPs each.
  for (const Case& c : cases) {
    SCOPED_TRACE(trace_of(c));
    index_t pairs = 0;
    for (index_t t = 0; t < c.tokens; ++t) {
      pairs += std::min(c.window, c.keys - c.tokens + t + 1);
    }
    EXPECT_EQ(causal_attention_flops(c.batch, c.heads, c.tokens, c.keys, c.head_dim, c.window),
              4 * c.batch * c.heads * c.head_dim * pairs);
  }
  // T = S = 6, W = 2: 1 + 2 + 2 + 2 + 2 + 2 = 11 pairs; W ≥ S is the causal triangle (21).
  EXPECT_EQ(causal_attention_flops(1, 1, 6, 6, 1, 2), 4 * 11);
  EXPECT_EQ(causal_attention_flops(1, 1, 6, 6, 1, 6), causal_attention_flops(1, 1, 6, 6, 1));
}

// ---- RollingKVCache ----------------------------------------------------------------------------

/// A config whose attention is H = 4 query heads on H_kv = 2 key/value heads of d_k = 3, L = 2
/// layers, window W.
TransformerConfig windowed_config(index_t window) {
  return {.d_model = 12,
          .n_layers = 2,
          .n_heads = 4,
          .n_kv_heads = 2,
          .d_ff = 8,
          .vocab = 5,
          .context = 64,
          .sliding_window = window};
}

/// Rows [from, from + count) of positions (axis 2) of x, as a new tensor.
template <class Scalar>
Tensor<Scalar, 4> positions_of(const Tensor<Scalar, 4>& x, index_t from, index_t count) {
  Tensor<Scalar, 4> out({x.dim(0), x.dim(1), count, x.dim(3)});
  for (index_t b = 0; b < x.dim(0); ++b) {
    for (index_t h = 0; h < x.dim(1); ++h) {
      for (index_t t = 0; t < count; ++t) {
        for (index_t i = 0; i < x.dim(3); ++i) out(b, h, t, i) = x(b, h, from + t, i);
      }
    }
  }
  return out;
}

TYPED_TEST(SlidingWindow, ARollingCacheDecodesFarPastItsWindowWithConstantMemory) {
  // W = 4 and 40 positions per layer, fed as a prompt of 3, single steps, a chunk of 6 after
  // the ring has wrapped (the prompt path reading the ring), then single steps again. Each step's
  // output must be the matching rows of the full sequence's windowed attention, and each layer
  // keeps its own keys.
  const index_t W = 4, total = 40, batch = 2;
  const auto config = windowed_config(W);
  RollingKVCache<TypeParam> cache(config, batch);
  const index_t bytes = cache.bytes();
  EXPECT_EQ(bytes, 2 * 2 * batch * W * 2 * 3 * index_t(sizeof(TypeParam)));
  std::vector<Inputs<TypeParam>> layers;
  std::vector<Tensor<double, 4>> expected;
  for (index_t layer = 0; layer < 2; ++layer) {
    layers.push_back(inputs_for<TypeParam>({batch, 4, 2, total, total, 3, W}, 10 + layer));
    const auto& [q, k, v] = layers.back();
    expected.push_back(reference(q, k, v, W));
  }
  const std::vector<index_t> steps = [&] {
    std::vector<index_t> s{3};
    for (index_t i = 0; i < 9; ++i) s.push_back(1);
    s.push_back(6);
    while (std::accumulate(s.begin(), s.end(), index_t{0}) < total) s.push_back(1);
    return s;
  }();
  index_t at = 0;
  for (const index_t tokens : steps) {
    SCOPED_TRACE(testing::concat_for_trace("positions ", at, " … ", at + tokens - 1));
    ASSERT_EQ(cache.length(), at);
    for (index_t layer = 0; layer < 2; ++layer) {
      const auto& [q, k, v] = layers[layer];
      const auto q_step = positions_of(q, at, tokens);
      Tensor<TypeParam, 4> o(q_step.shape());
      cache.attend(layer, q_step, positions_of(k, at, tokens), positions_of(v, at, tokens), o);
      const auto want = positions_of(expected[layer], at, tokens);
      Tensor<double, 4> bound(want.shape());
      bound.fill(bound_of(q, k, v));
      EXPECT_TENSOR_WITHIN(o, want, bound) << "layer " << layer;
    }
    cache.advance(tokens);
    at += tokens;
    EXPECT_EQ(cache.bytes(), bytes) << "the ring never grows";
    EXPECT_EQ(cache.held(), std::min(at, W));
  }
  EXPECT_EQ(cache.length(), total);
  cache.clear();
  EXPECT_EQ(cache.length(), 0);
  EXPECT_EQ(cache.bytes(), bytes);
}

// ---- refused inputs (reliability rows 92, 93) ----------------------------------------------

TEST(SlidingWindowErrors, AWindowBelowOneIsRefusedEverywhere) {
  const Tensor<float, 4> q({1, 2, 3, 4}), kv({1, 2, 3, 4});
  Tensor<float, 4> o(q.shape());
  for (const index_t bad : {index_t{0}, index_t{-3}}) {
    EXPECT_THROW_WITH(causal_attention(q, kv, kv, std::nullopt, bad), ConfigError,
                      "causal_attention: window must be > 0 (got " + std::to_string(bad));
    AttentionCache<float> cache;
    EXPECT_THROW_WITH(causal_attention(q, kv, kv, cache, std::nullopt, bad), ConfigError,
                      "causal_attention: window must be > 0");
    EXPECT_FALSE(cache.window.has_value());  // a refused forward leaves the cache alone
    EXPECT_THROW_WITH(causal_attention_heads_into<float>(heads_of(q.cview()), heads_of(kv.cview()),
                                                         heads_of(kv.cview()), heads_of(o.view()),
                                                         1, std::nullopt, bad),
                      ConfigError, "causal_attention_heads_into: window must be > 0");
    EXPECT_THROW_WITH(causal_attention_flops(1, 1, 3, 3, 4, bad), ConfigError,
                      "causal_attention_flops: window must be > 0");
    EXPECT_THROW_WITH(windowed_config(bad).validate(), ConfigError,
                      "TransformerConfig: sliding_window must be > 0 (got " + std::to_string(bad));
  }
  AttentionCache<float> cache;
  causal_attention(q, kv, kv, cache, std::nullopt, 2);
  cache.window = 0;  // filled by hand
  EXPECT_THROW_WITH(causal_attention_backward(q, kv, kv, cache, q), ConfigError,
                    "causal_attention_backward: window must be > 0 (got 0");
}

TEST(SlidingWindowErrors, ARollingCacheRefusesWhatDoesNotFitAndChangesNothing) {
  auto config = windowed_config(4);
  config.sliding_window.reset();
  EXPECT_THROW_WITH(RollingKVCache<float>(config, 1), ConfigError,
                    "RollingKVCache: config.sliding_window is unset");
  EXPECT_THROW_WITH(RollingKVCache<float>(windowed_config(4), 0), ConfigError,
                    "RollingKVCache: batch must be > 0 (got 0)");
  RollingKVCache<float> cache(windowed_config(4), 2);
  EXPECT_THROW_WITH(cache.check_step("LlamaModel::forward", windowed_config(5), 2, 1), ShapeError,
                    "LlamaModel::forward: the rolling KV cache was built for [L, B, H_kv, W, d_k] "
                    "= [2, 2, 2, 4, 3], this model and batch need [2, 2, 2, 5, 3]");
  EXPECT_THROW_WITH(cache.check_step("op", config, 2, 1), ShapeError,
                    "(the config has no sliding_window)");
  EXPECT_THROW_WITH(cache.check_step("op", windowed_config(4), 2, -1), ShapeError,
                    "op: -1 new positions");
  // A decoding step, then refused steps: the ring still gives the same next result.
  std::mt19937_64 engine(20);
  const auto q = testing::random_tensor<float, 4>({2, 4, 1, 3}, engine);
  const auto k = testing::random_tensor<float, 4>({2, 2, 1, 3}, engine);
  Tensor<float, 4> o(q.shape()), again(q.shape());
  cache.attend(0, q, k, k, o);
  EXPECT_THROW_WITH(cache.attend(0, q, Tensor<float, 4>({2, 2, 1, 4}), k, again), ShapeError,
                    "RollingKVCache::attend: k must be [B, H_kv, T, d_k] = [2, 2, 1, 3], got "
                    "[2, 2, 1, 4]");
  EXPECT_THROW_WITH(cache.attend(0, Tensor<float, 4>({2, 4, 2, 3}), k, k, again), ShapeError,
                    "RollingKVCache::attend: k holds S = 1 positions (axis 2), fewer than q's T");
  EXPECT_THROW_WITH(cache.attend(0, q, k, k, Tensor<float, 4>({2, 4, 1, 2})), ShapeError,
                    "o must have q's shape");
  EXPECT_THROW_WITH(cache.attend(2, q, k, k, again), Error, "layer 2 is out of range [0, 2)");
  EXPECT_THROW_WITH(cache.attend(0, q, k, k, again, 0.0), ConfigError,
                    "RollingKVCache::attend: scale must be finite and > 0");
  cache.attend(0, q, k, k, again);
  EXPECT_TENSOR_EQ(again, o);
  EXPECT_EQ(cache.length(), 0);
  EXPECT_THROW_WITH(cache.advance(-1), ShapeError, "RollingKVCache::advance: -1 new positions");
}

}  // namespace test_sliding_window
}  // namespace dissect
