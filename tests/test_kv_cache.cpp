// Tests of dissect/attention/kv_cache.hpp: its bytes are the budget's kv_cache_bytes for the same
// config, batch and capacity; writes land at the positions attention reads; refused writes and
// advances change nothing.
#include <gtest/gtest.h>

#include <random>

#include "dissect/accounting/budget.hpp"
#include "dissect/attention/kv_cache.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_kv_cache {

TransformerConfig small_config() {
  return {.d_model = 16,
          .n_layers = 3,
          .n_heads = 4,
          .n_kv_heads = 2,
          .d_ff = 32,
          .vocab = 11,
          .context = 10};
}

TEST(KVCache, BytesEqualTheBudgetsKvCacheBytes) {
  struct Case {
    TransformerConfig config;
    index_t batch, capacity;
  };
  const std::vector<Case> cases = {
      {small_config(), 1, 10},
      {small_config(), 3, 7},
      {find_preset("gpt2-small").config, 2, 64},
      {find_preset("llama-2-70b").config, 1, 8},  // GQA: 8 KV heads of 64
  };
  for (const auto& [config, batch, capacity] : cases) {
    SCOPED_TRACE(testing::concat_for_trace("L=", config.n_layers, " B=", batch, " T=", capacity));
    const KVCache<float> cache(config, batch, capacity);
    EXPECT_EQ(cache.bytes(), kv_cache_bytes(config.n_layers, capacity, config.kv_heads(),
                                            config.head_size(), Dtype::fp32) *
                                 batch);
    EXPECT_EQ(cache.capacity(), capacity);
    EXPECT_EQ(cache.length(), 0);
  }
  // Without a capacity, the config's context.
  EXPECT_EQ(KVCache<double>(small_config(), 2).capacity(), 10);
  EXPECT_EQ(KVCache<double>(small_config(), 2).bytes(), 2 * 3 * 2 * 10 * 2 * 4 * 8);
}

TEST(KVCache, WritesLandWhereAttentionReadsThem) {
  KVCache<double> cache(small_config(), 2, 6);
  std::mt19937_64 engine(1);
  const auto k0 = testing::random_tensor<double, 4>({2, 2, 4, 4}, engine);
  const auto v0 = testing::random_tensor<double, 4>({2, 2, 4, 4}, engine);
  const auto k1 = testing::random_tensor<double, 4>({2, 2, 2, 4}, engine);
  const auto v1 = testing::random_tensor<double, 4>({2, 2, 2, 4}, engine);
  for (index_t layer = 0; layer < 3; ++layer) cache.write(layer, k0, v0);
  cache.advance(4);
  cache.write(1, k1, v1);
  cache.advance(2);
  EXPECT_EQ(cache.length(), 6);
  EXPECT_EQ(cache.remaining(), 0);
  const auto keys = cache.keys(1, 6), values = cache.values(1, 6);
  for (index_t b = 0; b < 2; ++b) {
    for (index_t h = 0; h < 2; ++h) {
      for (index_t t = 0; t < 6; ++t) {
        for (index_t i = 0; i < 4; ++i) {
          EXPECT_EQ(keys.head(b, h)(t, i), t < 4 ? k0(b, h, t, i) : k1(b, h, t - 4, i));
          EXPECT_EQ(values.head(b, h)(t, i), t < 4 ? v0(b, h, t, i) : v1(b, h, t - 4, i));
        }
      }
    }
  }
  cache.clear();
  EXPECT_EQ(cache.length(), 0);
  EXPECT_EQ(cache.remaining(), 6);
}

TEST(KVCache, TruncateKeepsAPrefixAndRefusesToGrow) {
  KVCache<float> cache(small_config(), 2, 5);
  const Tensor<float, 4> three({2, 2, 3, 4});
  for (index_t layer = 0; layer < 3; ++layer) cache.write(layer, three, three);
  cache.advance(3);
  EXPECT_THROW_WITH(cache.truncate(4), ShapeError, "KVCache::truncate: cannot keep 4");
  EXPECT_THROW_WITH(cache.truncate(-1), ShapeError, "cannot keep -1");
  EXPECT_EQ(cache.length(), 3);
  cache.truncate(1);
  EXPECT_EQ(cache.length(), 1);
  EXPECT_EQ(cache.remaining(), 4);
  cache.truncate(0);
  EXPECT_EQ(cache.length(), 0);
}

TEST(KVCache, ReorderGathersEveryLayersRowsByParent) {
  KVCache<double> cache(small_config(), 3, 6);
  std::mt19937_64 engine(4);
  std::vector<Tensor<double, 4>> keys, values;
  for (index_t layer = 0; layer < 3; ++layer) {
    keys.push_back(testing::random_tensor<double, 4>({3, 2, 4, 4}, engine));
    values.push_back(testing::random_tensor<double, 4>({3, 2, 4, 4}, engine));
    cache.write(layer, keys.back(), values.back());
  }
  cache.advance(4);
  // Row 0 is dropped, row 2 repeated: what beam search does when two beams extend one parent.
  const std::vector<index_t> parents{2, 1, 2};
  cache.reorder(parents);
  EXPECT_EQ(cache.length(), 4);
  for (index_t layer = 0; layer < 3; ++layer) {
    const auto k = cache.keys(layer, 4), v = cache.values(layer, 4);
    for (index_t b = 0; b < 3; ++b) {
      for (index_t h = 0; h < 2; ++h) {
        for (index_t t = 0; t < 4; ++t) {
          for (index_t i = 0; i < 4; ++i) {
            EXPECT_EQ(k.head(b, h)(t, i), keys[layer](parents[b], h, t, i));
            EXPECT_EQ(v.head(b, h)(t, i), values[layer](parents[b], h, t, i));
          }
        }
      }
    }
  }
  // Refused reorders change nothing (row 0 still holds the old row 2).
  EXPECT_THROW_WITH(cache.reorder(std::vector<index_t>{0, 1}), ShapeError,
                    "KVCache::reorder: 2 parent rows for a cache of batch 3");
  EXPECT_THROW_WITH(cache.reorder(std::vector<index_t>{0, 3, 1}), Error,
                    "KVCache::reorder: parent 3 of row 1 is outside [0, 3)");
  EXPECT_THROW_WITH(cache.reorder(std::vector<index_t>{-1, 0, 1}), Error, "parent -1 of row 0");
  EXPECT_EQ(cache.keys(2, 4).head(0, 1)(3, 2), keys[2](2, 1, 3, 2));
}

TEST(KVCacheErrors, RefusedWritesAndAdvancesChangeNothing) {
  KVCache<float> cache(small_config(), 2, 5);
  const Tensor<float, 4> three({2, 2, 3, 4});
  cache.write(0, three, three);
  cache.advance(3);
  EXPECT_THROW_WITH(cache.write(0, three, three), ShapeError,
                    "KVCache::write: 3 new positions do not fit the KV cache (3 of 5 positions "
                    "used)");
  EXPECT_THROW_WITH(cache.advance(3), ShapeError, "KVCache::advance: 3 new positions");
  EXPECT_THROW_WITH(cache.advance(-1), ShapeError, "-1 new positions");
  EXPECT_THROW_WITH(cache.write(3, three, three), Error, "layer 3 is out of range [0, 3)");
  EXPECT_THROW_WITH(cache.write(0, Tensor<float, 4>({2, 4, 1, 4}), three), ShapeError,
                    "k must be [B, H_kv, T, d_k] = [2, 2, 1, 4], got [2, 4, 1, 4]");
  EXPECT_THROW_WITH(cache.write(0, Tensor<float, 4>({2, 2, 1, 4}), three), ShapeError,
                    "v must be [B, H_kv, T, d_k] = [2, 2, 1, 4], got [2, 2, 3, 4]");
  EXPECT_EQ(cache.length(), 3);
  EXPECT_THROW_WITH(cache.keys(0, 6), ShapeError, "6 positions asked of a cache of 5");
}

TEST(KVCacheErrors, ImpossibleCachesAreConfigErrors) {
  EXPECT_THROW_WITH(KVCache<float>(small_config(), 0), ConfigError,
                    "KVCache: batch must be > 0 (got 0)");
  EXPECT_THROW_WITH(KVCache<float>(small_config(), 1, 0), ConfigError,
                    "KVCache: capacity must be > 0 (got 0)");
  TransformerConfig bad = small_config();
  bad.n_kv_heads = 3;
  EXPECT_THROW_WITH(KVCache<float>(bad, 1), ConfigError, "n_kv_heads 3 does not divide n_heads 4");
}

}  // namespace test_kv_cache
}  // namespace dissect
