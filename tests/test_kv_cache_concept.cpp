// Tests of dissect/attention/kv_cache_concept.hpp: the three caches model InferenceCache (the
// paged one bound to a step's sequences) and a type missing any member does not; the decoder's one
// cached forward gives the full forward's logits over a KVCache, a RollingKVCache and a
// PagedKVCache alike; the members the concept added to each cache do what it says and refuse
// what does not fit, changing nothing.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "dissect/attention/kv_cache.hpp"
#include "dissect/attention/kv_cache_concept.hpp"
#include "dissect/attention/paged_kv_cache.hpp"
#include "dissect/attention/rolling_kv_cache.hpp"
#include "dissect/models/decoder_model.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_kv_cache_concept {

/// Which members a FakeCache has: all of them by default, so that each test removes one.
struct Has {
  bool batch = true, position = true, check_step = true, reserve = true, attend = true,
       advance = true, length = true, truncate = true, reorder = true;
};

template <Has M>
struct FakeCache {
  using scalar_type = float;
  index_t batch() const requires(M.batch) { return 1; }
  index_t position(index_t) const requires(M.position) { return 0; }
  void check_step(std::string_view, const TransformerConfig&, index_t, index_t) const
      requires(M.check_step) {}
  void reserve(index_t) requires(M.reserve) {}
  template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
  void attend(index_t, const Q&, const K&, const V&, O&&, std::optional<double>,
              std::optional<index_t>) requires(M.attend) {}
  void advance(TokenBatch) requires(M.advance) {}
  index_t length() const requires(M.length) { return 0; }
  void truncate(index_t) requires(M.truncate) {}
  void reorder(std::span<const index_t>) requires(M.reorder) {}
};

/// A cache whose position is not an index_t.
struct NarrowPosition : FakeCache<Has{.position = false}> {
  int position(index_t) const { return 0; }
};

TEST(InferenceCache, EveryCacheModelsItAndATypeMissingAMemberDoesNot) {
  static_assert(InferenceCache<KVCache<float>> && InferenceCache<KVCache<double>>);
  static_assert(InferenceCache<RollingKVCache<float>> && InferenceCache<RollingKVCache<double>>);
  static_assert(InferenceCache<PagedKVCache<float>::Batch>);
  static_assert(InferenceCache<PagedKVCache<double>::Batch>);
  // A paged cache holds any number of sequences: only bound to a step's is it one.
  static_assert(!InferenceCache<PagedKVCache<float>>);
  static_assert(!InferenceCache<KVCache<float>*>);
  // What the decoding loops need beyond a forward: speculative decoding truncates, beam search
  // reorders; a ring or a paged step can do neither.
  static_assert(TruncatableCache<KVCache<float>> && ReorderableCache<KVCache<double>>);
  static_assert(!TruncatableCache<RollingKVCache<float>>);
  static_assert(!ReorderableCache<RollingKVCache<float>>);
  static_assert(!ReorderableCache<PagedKVCache<float>::Batch>);

  static_assert(InferenceCache<FakeCache<Has{}>>);
  static_assert(TruncatableCache<FakeCache<Has{}>> && ReorderableCache<FakeCache<Has{}>>);
  static_assert(!InferenceCache<FakeCache<Has{.batch = false}>>);
  static_assert(!InferenceCache<FakeCache<Has{.position = false}>>);
  static_assert(!InferenceCache<FakeCache<Has{.check_step = false}>>);
  static_assert(!InferenceCache<FakeCache<Has{.reserve = false}>>);
  static_assert(!InferenceCache<FakeCache<Has{.attend = false}>>);
  static_assert(!InferenceCache<FakeCache<Has{.advance = false}>>);
  static_assert(!InferenceCache<NarrowPosition>);
  static_assert(!TruncatableCache<FakeCache<Has{.length = false}>>);
  static_assert(!TruncatableCache<FakeCache<Has{.truncate = false}>>);
  static_assert(!ReorderableCache<FakeCache<Has{.reorder = false}>>);
  // The refinements need the base: a cache that truncates but cannot attend is not one.
  static_assert(!TruncatableCache<FakeCache<Has{.attend = false}>>);
  SUCCEED();
}

/// The [1, T, V] logits of `steps` fed one after another, concatenated along T.
Tensor<double, 3> concat_steps(const std::vector<Tensor<double, 3>>& steps) {
  index_t tokens = 0;
  for (const auto& step : steps) tokens += step.dim(1);
  Tensor<double, 3> all({1, tokens, steps.front().dim(2)});
  double* out = all.data();
  for (const auto& step : steps) out = std::copy_n(step.data(), step.size(), out);
  return all;
}

TEST(InferenceCache, TheOneForwardGivesEveryCacheTheFullForwardsLogits) {
  // A window of the whole context reads every position: the same attention as none, so one
  // prompt can run over all three caches (a rolling cache needs a window, a paged one refuses
  // it). The same seed draws the same weights whatever the window.
  const auto config = testing::small_llama();
  auto windowed = config;
  windowed.sliding_window = config.context;
  const LlamaModel<double> model(config, {.init_std = 0.5, .seed = 7});
  const LlamaModel<double> ring_model(windowed, {.init_std = 0.5, .seed = 7});
  const auto ids = testing::random_ids(10, config.vocab, 11);
  const auto full = model.forward(TokenBatch{ids, 1, 10});
  EXPECT_TENSOR_EQ(ring_model.forward(TokenBatch{ids, 1, 10}), full);

  // A prompt of 6, then a step of 1, one of 2 and one of 1.
  const std::vector<std::pair<index_t, index_t>> steps{{0, 6}, {6, 1}, {7, 2}, {9, 1}};
  const auto batch = [&](std::pair<index_t, index_t> step) {
    return TokenBatch{std::span<const index_t>(ids).subspan(static_cast<std::size_t>(step.first),
                                                            static_cast<std::size_t>(step.second)),
                      1, step.second};
  };
  auto kv = model.make_kv_cache(1);
  auto last_kv = model.make_kv_cache(1);
  auto ring = ring_model.make_rolling_kv_cache(1);
  auto paged = model.make_paged_kv_cache(8, 4);
  const index_t sequence[] = {paged.add_sequence()};
  std::vector<Tensor<double, 3>> over_kv, over_ring, over_paged;
  for (const auto& step : steps) {
    over_kv.push_back(model.forward(batch(step), kv));
    over_ring.push_back(ring_model.forward(batch(step), ring));
    over_paged.push_back(model.forward(batch(step), paged, sequence));
    // forward_last: the last row of the step's logits (the head's product over one row may
    // block its sums otherwise than over T).
    const auto last = model.forward_last(batch(step), last_kv);
    const auto& all = over_kv.back();
    ASSERT_EQ(last.shape(), (Shape<3>{1, 1, config.vocab}));
    for (index_t v = 0; v < config.vocab; ++v) {
      EXPECT_NEAR(last(0, 0, v), all(0, step.second - 1, v), 1e-12);
    }
  }
  EXPECT_EQ(kv.length(), 10);
  EXPECT_EQ(ring.length(), 10);
  EXPECT_EQ(paged.length(sequence[0]), 10);
  // The caches walk their keys in other tiles (a paged cache block by block), so the sums may
  // round differently: equal to rounding.
  EXPECT_TENSOR_NEAR(concat_steps(over_kv), full, 1e-12, 1e-12);
  EXPECT_TENSOR_NEAR(concat_steps(over_ring), full, 1e-12, 1e-12);
  EXPECT_TENSOR_NEAR(concat_steps(over_paged), full, 1e-12, 1e-12);
}

/// L = 2 layers of H = 4 heads over H_kv = 2, d_k = 4.
TransformerConfig small_config() {
  return testing::small_llama();
}

/// k and v of two steps, one after the other along T: [B, H_kv, T₁ + T₂, d_k].
Tensor<double, 4> along_t(const Tensor<double, 4>& first, const Tensor<double, 4>& second) {
  Tensor<double, 4> both({first.dim(0), first.dim(1), first.dim(2) + second.dim(2), first.dim(3)});
  for (index_t b = 0; b < both.dim(0); ++b) {
    for (index_t h = 0; h < both.dim(1); ++h) {
      for (index_t t = 0; t < both.dim(2); ++t) {
        for (index_t i = 0; i < both.dim(3); ++i) {
          both(b, h, t, i) =
              t < first.dim(2) ? first(b, h, t, i) : second(b, h, t - first.dim(2), i);
        }
      }
    }
  }
  return both;
}

TEST(KVCacheAttend, KeepsTheStepAndAttendsOverEveryHeldPosition) {
  KVCache<double> cache(small_config(), 2, 6);
  std::mt19937_64 engine(3);
  const auto q1 = testing::random_tensor<double, 4>({2, 4, 4, 4}, engine);
  const auto k1 = testing::random_tensor<double, 4>({2, 2, 4, 4}, engine);
  const auto v1 = testing::random_tensor<double, 4>({2, 2, 4, 4}, engine);
  const auto q2 = testing::random_tensor<double, 4>({2, 4, 2, 4}, engine);
  const auto k2 = testing::random_tensor<double, 4>({2, 2, 2, 4}, engine);
  const auto v2 = testing::random_tensor<double, 4>({2, 2, 2, 4}, engine);
  const std::vector<index_t> ids(8, 1);
  for (const std::optional<index_t> window :
       {std::optional<index_t>{}, std::optional<index_t>{2}}) {
    SCOPED_TRACE(window ? "window 2" : "no window");
    cache.clear();
    Tensor<double, 4> o1(q1.shape()), o2(q2.shape());
    cache.attend(1, q1, k1, v1, o1, 0.5, window);
    EXPECT_EQ(cache.length(), 0);  // until advance
    cache.advance(TokenBatch{ids, 2, 4});
    cache.attend(1, q2, k2, v2, o2, 0.5, window);
    cache.advance(TokenBatch{ids, 2, 2});
    EXPECT_EQ(cache.length(), 6);
    EXPECT_TENSOR_NEAR(o1, causal_attention(q1, k1, v1, 0.5, window), 0.0, 1e-15);
    EXPECT_TENSOR_NEAR(o2, causal_attention(q2, along_t(k1, k2), along_t(v1, v2), 0.5, window), 0.0,
                       1e-15);
    EXPECT_EQ(cache.position(0), 6);
    EXPECT_EQ(cache.position(1), 6);
  }
}

TEST(KVCacheAttend, RefusesWhatDoesNotFitAndWritesNothing) {
  KVCache<double> cache(small_config(), 2, 6);
  std::mt19937_64 engine(4);
  const auto q = testing::random_tensor<double, 4>({2, 4, 4, 4}, engine);
  const auto k = testing::random_tensor<double, 4>({2, 2, 4, 4}, engine);
  Tensor<double, 4> o(q.shape());
  const auto three = testing::random_tensor<double, 4>({2, 4, 3, 4}, engine);
  Tensor<double, 4> o3(three.shape());
  EXPECT_THROW_WITH(cache.attend(0, three, k, k, o3), ShapeError,
                    "KVCache::attend: q must hold k's T = 4 positions, got [2, 4, 3, 4]");
  EXPECT_THROW_WITH(cache.attend(2, q, k, k, o), Error,
                    "KVCache::attend: layer 2 is out of range [0, 2)");
  EXPECT_THROW_WITH(cache.attend(0, q, k, k, o3), ShapeError, "KVCache::attend: o must have");
  EXPECT_THROW_WITH(cache.attend(0, q, k, k, o, 0.0), ConfigError,
                    "KVCache::attend: scale must be finite and > 0");
  EXPECT_THROW_WITH(cache.attend(0, q, k, k, o, std::nullopt, 0), ConfigError,
                    "KVCache::attend: window must be > 0");
  const auto seven = testing::random_tensor<double, 4>({2, 2, 7, 4}, engine);
  const auto q7 = testing::random_tensor<double, 4>({2, 4, 7, 4}, engine);
  Tensor<double, 4> o7(q7.shape());
  EXPECT_THROW_WITH(cache.attend(0, q7, seven, seven, o7), ShapeError,
                    "7 new positions do not fit the KV cache (0 of 6 positions used)");
  // Nothing was written: layer 0's first positions are still the zeros the cache began with.
  const auto keys = cache.keys(0, 6);
  for (index_t b = 0; b < 2; ++b) {
    for (index_t h = 0; h < 2; ++h) EXPECT_EQ(keys.head(b, h).cwiseAbs().maxCoeff(), 0.0);
  }
  EXPECT_EQ(cache.length(), 0);

  EXPECT_THROW_WITH(cache.position(2), Error, "KVCache::position: row 2 is outside [0, 2)");
  EXPECT_THROW_WITH(cache.reserve(7), ShapeError, "KVCache::reserve: 7 new positions do not fit");
  cache.reserve(6);
  const std::vector<index_t> ids(3, 1);
  EXPECT_THROW_WITH(cache.advance(TokenBatch{ids, 1, 3}), ShapeError,
                    "KVCache::advance: a step of B = 1 rows for a cache of batch 2");
  EXPECT_EQ(cache.length(), 0);
}

TEST(RollingKVCacheConcept, TheWindowMustBeTheRingsAndEveryRowIsAtItsLength) {
  auto config = small_config();
  config.sliding_window = 3;
  RollingKVCache<double> cache(config, 2);
  std::mt19937_64 engine(5);
  const auto q = testing::random_tensor<double, 4>({2, 4, 1, 4}, engine);
  const auto k = testing::random_tensor<double, 4>({2, 2, 1, 4}, engine);
  Tensor<double, 4> o(q.shape()), expected(q.shape());
  EXPECT_THROW_WITH(cache.attend(0, q, k, k, o, std::nullopt, 2), ShapeError,
                    "RollingKVCache::attend: the ring holds W = 3 positions, the attention's "
                    "window is 2");
  EXPECT_THROW_WITH(cache.attend(0, q, k, k, o, std::nullopt, std::nullopt), ShapeError,
                    "the attention's window is 0 (0: none)");
  EXPECT_EQ(cache.held(), 0);
  cache.attend(0, q, k, k, o, 0.5, 3);
  RollingKVCache<double> plain(config, 2);
  plain.attend(0, q, k, k, expected, 0.5);
  EXPECT_TENSOR_EQ(o, expected);

  const std::vector<index_t> ids(2, 1);
  cache.advance(TokenBatch{ids, 2, 1});
  EXPECT_EQ(cache.position(0), 1);
  EXPECT_EQ(cache.position(1), 1);
  EXPECT_THROW_WITH(cache.position(-1), Error, "RollingKVCache::position: row -1 is outside");
  EXPECT_THROW_WITH(cache.advance(TokenBatch{ids, 1, 2}), ShapeError,
                    "RollingKVCache::advance: a step of B = 1 rows for a cache of batch 2");
  EXPECT_THROW_WITH(cache.reserve(-1), ShapeError, "RollingKVCache::reserve: -1 new positions");
  EXPECT_EQ(cache.length(), 1);
}

TEST(PagedKVCacheBatch, IsTheCacheForTheSelectedSequences) {
  const auto config = small_config();
  PagedKVCache<double> cache(config, 8, 4);
  const index_t a = cache.add_sequence(), b = cache.add_sequence();
  const index_t rows[] = {b, a};
  auto step = cache.select(rows);
  EXPECT_EQ(step.batch(), 2);
  EXPECT_EQ(&step.cache(), &cache);
  EXPECT_THROW_WITH(step.check_step("op", config, 1, 1), ShapeError,
                    "op: 2 sequence ids for B = 1 rows of tokens (one id per row)");
  step.check_step("op", config, 2, 5);
  step.reserve(5);  // 2 blocks each
  EXPECT_EQ(cache.used_blocks(), 4);
  std::mt19937_64 engine(6);
  const auto q = testing::random_tensor<double, 4>({2, 4, 5, 4}, engine);
  const auto k = testing::random_tensor<double, 4>({2, 2, 5, 4}, engine);
  Tensor<double, 4> o(q.shape()), expected(q.shape());
  EXPECT_THROW_WITH(step.attend(0, q, k, k, o, std::nullopt, 3), ShapeError,
                    "PagedKVCache::attend: a sliding window (W = 3) reads only the last W");
  step.attend(0, q, k, k, o);
  EXPECT_TENSOR_NEAR(o, causal_attention(q, k, k), 1e-14, 1e-14);
  const std::vector<index_t> ids(10, 2);
  step.advance(TokenBatch{ids, 2, 5});
  EXPECT_EQ(step.position(0), 5);
  EXPECT_EQ(cache.length(a), 5);
  EXPECT_THROW_WITH(step.position(2), Error, "PagedKVCache::Batch::position: row 2 is outside");
}

}  // namespace test_kv_cache_concept
}  // namespace dissect
