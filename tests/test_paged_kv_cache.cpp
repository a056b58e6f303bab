// Tests of dissect/attention/paged_kv_cache.hpp: block-by-block attention equals a naive causal
// softmax over each sequence's whole history, whatever the block size and however the blocks are
// scattered in the pool; full blocks of a common prefix are shared (by reference count, only
// along the same prefix chain) and return to the pool when the last holder is released; an
// exhausted pool and bad ids are refused without changing anything; and the budget's "how many
// sequences fit" is what the pool admits at the same memory cap.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dissect/accounting/budget.hpp"
#include "dissect/attention/paged_kv_cache.hpp"
#include "dissect/tensor/init.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_paged_kv_cache {

// H = 4 query heads over H_kv = 2 (grouped-query), d_k = 4, L = 2.
TransformerConfig config() {
  return {.d_model = 16,
          .n_layers = 2,
          .n_heads = 4,
          .n_kv_heads = 2,
          .d_ff = 8,
          .vocab = 50,
          .context = 64};
}

Tensor<double, 4> random(const Shape<4>& shape, std::uint64_t seed) {
  Tensor<double, 4> t(shape);
  Generator generator(seed);
  fill_normal(t.view(), 0.0, 1.0, generator);
  return t;
}

/// The reference: o[h, t] = Σ_j softmax_j(q[h, t]·k[h/g, j] / √d_k) v[h/g, j] over keys
/// j ≤ offset + t, for one sequence whose whole k and v are [H_kv, S, d_k], as plain loops.
Tensor<double, 4> naive_attention(const Tensor<double, 4>& q, const std::vector<double>& k,
                                  const std::vector<double>& v, index_t offset) {
  const index_t H = q.dim(1), T = q.dim(2), d = q.dim(3), H_kv = 2;
  const index_t S = static_cast<index_t>(k.size()) / (H_kv * d);
  Tensor<double, 4> o(q.shape());
  for (index_t h = 0; h < H; ++h) {
    const index_t g = h / (H / H_kv);
    for (index_t t = 0; t < T; ++t) {
      std::vector<double> w;
      double top = -INFINITY;
      for (index_t j = 0; j <= offset + t; ++j) {
        double s = 0;
        for (index_t i = 0; i < d; ++i) s += q(0, h, t, i) * k[((g * S) + j) * d + i];
        w.push_back(s / std::sqrt(double(d)));
        top = std::max(top, w.back());
      }
      double sum = 0;
      for (double& x : w) sum += (x = std::exp(x - top));
      for (index_t i = 0; i < d; ++i) {
        double acc = 0;
        for (std::size_t j = 0; j < w.size(); ++j) acc += w[j] * v[((g * S) + j) * d + i];
        o(0, h, t, i) = acc / sum;
      }
    }
  }
  return o;
}

/// A sequence's k or v as the reference reads it: [H_kv, S, d_k] grown by each step's rows.
void append(std::vector<double>& all, const Tensor<double, 4>& step, index_t b, index_t held) {
  const index_t H_kv = step.dim(1), T = step.dim(2), d = step.dim(3);
  std::vector<double> grown(static_cast<std::size_t>(H_kv * (held + T) * d));
  for (index_t h = 0; h < H_kv; ++h) {
    for (index_t j = 0; j < held + T; ++j) {
      for (index_t i = 0; i < d; ++i) {
        grown[static_cast<std::size_t>((h * (held + T) + j) * d + i)] =
            j < held ? all[static_cast<std::size_t>((h * held + j) * d + i)]
                     : step(b, h, j - held, i);
      }
    }
  }
  all = std::move(grown);
}

TEST(PagedKVCache, BlockByBlockAttentionIsTheCausalSoftmaxOverEachSequencesHistory) {
  // Three sequences prefilled alone (7, 1 and 13 positions: inside a block, one position, past
  // several), then decoded together; block size 4 puts each sequence's blocks apart in the pool,
  // interleaved with the others', and a 70-token prefill crosses a query tile of 64.
  for (index_t block_size : {1, 4, 16}) {
    PagedKVCache<double> cache(config(), 128, block_size);
    std::vector<index_t> ids{cache.add_sequence(), cache.add_sequence(), cache.add_sequence()};
    std::vector<std::vector<double>> keys(3), values(3);
    std::vector<index_t> lengths{7, 1, 13};
    std::uint64_t seed = 1;
    const auto step = [&](std::vector<index_t> rows, index_t T) {
      const index_t B = static_cast<index_t>(rows.size());
      std::vector<index_t> sequences;
      for (index_t r : rows) sequences.push_back(ids[static_cast<std::size_t>(r)]);
      const auto q = random({B, 4, T, 4}, seed++), k = random({B, 2, T, 4}, seed++),
                 v = random({B, 2, T, 4}, seed++);
      Tensor<double, 4> o({B, 4, T, 4});
      cache.reserve(sequences, T);
      for (index_t layer = 0; layer < 2; ++layer) {
        cache.attend(layer, sequences, q, k, v, o);
      }
      std::vector<index_t> tokens(static_cast<std::size_t>(B * T), 0);
      for (index_t b = 0; b < B; ++b) {
        const auto r = static_cast<std::size_t>(rows[static_cast<std::size_t>(b)]);
        const index_t held = cache.length(ids[r]);
        append(keys[r], k, b, held);
        append(values[r], v, b, held);
        Tensor<double, 4> qb({1, 4, T, 4}), ob({1, 4, T, 4});
        std::copy_n(q.data() + b * 4 * T * 4, 4 * T * 4, qb.data());
        std::copy_n(o.data() + b * 4 * T * 4, 4 * T * 4, ob.data());
        EXPECT_TENSOR_NEAR(ob, naive_attention(qb, keys[r], values[r], held), 1e-12, 1e-12)
            << "block size " << block_size << ", sequence " << r << " at " << held;
      }
      cache.advance(sequences, TokenBatch{tokens, B, T});
    };
    for (index_t r = 0; r < 3; ++r) step({r}, lengths[static_cast<std::size_t>(r)]);
    for (int s = 0; s < 6; ++s) step({0, 1, 2}, 1);
    step({2, 0}, 1);
    step({1}, 70 - 7);  // a long prefill-like step: 63 + 7 = 70 rows cross a query tile
    EXPECT_EQ(cache.length(ids[0]), 14);
    EXPECT_EQ(cache.length(ids[1]), 70);
    EXPECT_EQ(cache.length(ids[2]), 20);
    EXPECT_EQ(cache.used_blocks(),
              cache.blocks_for(14) + cache.blocks_for(70) + cache.blocks_for(20));
    for (index_t id : ids) cache.release(id);
    EXPECT_EQ(cache.free_blocks(), 128);
  }
}

TEST(PagedKVCache, FullBlocksOfACommonPrefixAreSharedAndFreedWithTheirLastHolder) {
  PagedKVCache<double> cache(config(), 16, 4);
  const auto fill = [&](index_t id, const std::vector<index_t>& tokens) {
    const index_t T = static_cast<index_t>(tokens.size()) - cache.length(id);
    const index_t ids[] = {id};
    cache.reserve(ids, T);
    cache.advance(ids, TokenBatch{std::span(tokens).subspan(tokens.size() - T), 1, T});
  };
  // A: 10 tokens, two full blocks registered and a third, partial, that is not.
  const std::vector<index_t> a{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  const index_t first = cache.add_sequence();
  fill(first, a);
  EXPECT_EQ(cache.used_blocks(), 3);
  // B shares a's first two blocks: 8 positions taken, the same block ids, each held twice.
  const index_t second = cache.add_sequence();
  const std::vector<index_t> b{1, 2, 3, 4, 5, 6, 7, 8, 11, 12};
  EXPECT_EQ(cache.share_prefix(second, b), 8);
  EXPECT_EQ(cache.length(second), 8);
  for (int j = 0; j < 2; ++j) {
    EXPECT_EQ(cache.block_table(second)[j], cache.block_table(first)[j]);
    EXPECT_EQ(cache.references(cache.block_table(first)[j]), 2);
  }
  fill(second, b);
  EXPECT_EQ(cache.used_blocks(), 4);  // 3 + b's own third block, not 6
  // 2 (K, V) · L 2 · P 4 · H_kv 2 · d_k 4 · 8 bytes = 1,024 bytes a block, in every layer.
  EXPECT_EQ((PagedKVCache<double>::block_bytes(config(), 4)), 1024);
  EXPECT_EQ(cache.bytes(), 16 * 1024);
  EXPECT_EQ(cache.used_bytes(), 4 * 1024);
  // A prompt of exactly two blocks shares only the first: its last token must be computed.
  const index_t third = cache.add_sequence();
  EXPECT_EQ(cache.share_prefix(third, std::vector<index_t>{1, 2, 3, 4, 5, 6, 7, 8}), 4);
  // The same second block's tokens after another first block are another prefix: not shared.
  const index_t fourth = cache.add_sequence();
  EXPECT_EQ(cache.share_prefix(fourth, std::vector<index_t>{9, 9, 9, 9, 5, 6, 7, 8, 1}), 0);
  cache.release(first);
  EXPECT_EQ(cache.used_blocks(), 3);  // the shared two stay with b and third; a's third goes
  EXPECT_EQ(cache.references(cache.block_table(second)[0]), 2);
  cache.release(second);
  cache.release(third);
  cache.release(fourth);
  EXPECT_EQ(cache.free_blocks(), 16);
  EXPECT_EQ(cache.active_sequences(), 0);
  // Freed blocks left the prompt cache with their holders: nothing is shared any more.
  const index_t fifth = cache.add_sequence();
  EXPECT_EQ(cache.share_prefix(fifth, a), 0);
}

TEST(PagedKVCacheErrors, AnExhaustedPoolIsAnErrorAndChangesNothing) {  // row 108
  PagedKVCache<double> cache(config(), 5, 4);
  const index_t a = cache.add_sequence(), b = cache.add_sequence();
  const index_t both[] = {a, b};
  cache.reserve(both, 8);  // 2 + 2 blocks
  EXPECT_EQ(cache.free_blocks(), 1);
  EXPECT_THROW_WITH(cache.reserve(both, 9), Error,
                    "PagedKVCache::reserve: the paged KV cache is exhausted: 2 sequences need 2 "
                    "more blocks of 4 positions for 9 new positions each, 1 of 5 blocks are free");
  EXPECT_THROW_WITH(cache.check_step("step", config(), both, 12), Error,
                    "step: the paged KV cache is exhausted");
  EXPECT_EQ(cache.free_blocks(), 1);
  EXPECT_EQ(cache.block_table(a).size(), 2u);
  EXPECT_EQ(cache.length(a), 0);
  const index_t one[] = {a};
  cache.reserve(one, 9);  // the last block fits
  EXPECT_EQ(cache.free_blocks(), 0);
}

TEST(PagedKVCacheErrors, BadIdsAndStepsNameTheSequence) {  // row 109
  PagedKVCache<double> cache(config(), 8, 4);
  const index_t a = cache.add_sequence();
  EXPECT_THROW_WITH(cache.length(3), Error, "PagedKVCache::length: sequence 3 is not active");
  EXPECT_THROW_WITH(cache.release(-1), Error, "sequence -1 is not active");
  const index_t twice[] = {a, a};
  EXPECT_THROW_WITH(cache.check_step("step", config(), twice, 1), Error,
                    "step: sequence 0 appears twice in one step (rows 0 and 1)");
  const index_t one[] = {a};
  EXPECT_THROW_WITH(cache.check_step("step", config(), one, -1), ShapeError, "-1 new positions");
  auto other = config();
  other.n_layers = 3;
  EXPECT_THROW_WITH(
      cache.check_step("step", other, one, 1), ShapeError,
      "step: the paged KV cache was built for [L, N, H_kv, P, d_k] = [2, 8, 2, 4, 4], "
      "this model needs [3, 8, 2, 4, 4]");
  // Attending before the blocks are reserved writes nothing.
  const auto q = random({1, 4, 1, 4}, 1), k = random({1, 2, 1, 4}, 2);
  Tensor<double, 4> o({1, 4, 1, 4});
  EXPECT_THROW_WITH(cache.attend(0, one, q, k, k, o), Error,
                    "PagedKVCache::attend: sequence 0 holds 0 blocks, 1 are needed");
  cache.reserve(one, 1);
  EXPECT_THROW_WITH(cache.attend(2, one, q, k, k, o), Error, "layer 2 is out of range [0, 2)");
  EXPECT_THROW_WITH(cache.attend(0, one, q, q, q, o), ShapeError,
                    "k must be [B, H_kv, T, d_k] = [1, 2, 1, 4] for 1 sequences, got [1, 4, 1, 4]");
  EXPECT_THROW_WITH(cache.references(8), Error, "block 8 is outside [0, 8)");
  const std::vector<index_t> tokens{1};
  cache.advance(one, TokenBatch{tokens, 1, 1});
  EXPECT_THROW_WITH(cache.share_prefix(a, tokens), Error,
                    "sequence 0 already holds 1 positions; only an empty sequence takes a prefix");
  EXPECT_THROW_WITH(cache.advance(one, TokenBatch{tokens, 2, 1}), ShapeError,
                    "1 sequences and 1 ids for B = 2, T = 1");
  cache.release(a);
  EXPECT_THROW_WITH(cache.release(a), Error, "PagedKVCache::release: sequence 0 is not active");
  EXPECT_EQ(cache.free_blocks(), 8);
}

TEST(PagedKVCacheErrors, ImpossiblePoolsAreConfigErrors) {  // row 110
  EXPECT_THROW_WITH(PagedKVCache<double>(config(), 0), ConfigError,
                    "PagedKVCache: blocks must be > 0 (got 0)");
  EXPECT_THROW_WITH(PagedKVCache<double>(config(), 4, 0), ConfigError,
                    "PagedKVCache: block_size must be > 0 (got 0)");
  auto windowed = config();
  windowed.sliding_window = 8;
  EXPECT_THROW_WITH(PagedKVCache<double>(windowed, 4), ConfigError,
                    "PagedKVCache: config.sliding_window is 8; a paged cache keeps every position");
}

TEST(PagedKVCache, TheBudgetsSequencesThatFitAreWhatThePoolAdmits) {
  // The lesson's arithmetic: at a memory cap, ⌊free / KV bytes per sequence⌋ sequences of n
  // positions fit. A pool of blocks of P positions built on the same free bytes admits
  // ⌊⌊free / (P·b)⌋ / ⌈n/P⌉⌋ (b: KV bytes per position): the same when P divides n (nested
  // floors), fewer by the block rounding otherwise — each sequence wastes ⌈n/P⌉·P − n positions.
  const auto cfg = config();
  const auto size = model_size(cfg);
  const index_t weights = weight_bytes(size.parameters, Dtype::fp32);
  for (index_t n : {16, 20, 33, 64}) {
    for (index_t cap : {1'000'000, 3'333'333}) {
      const auto budget = compute_budget(cfg, {.weight_dtype = Dtype::fp32,
                                               .kv_dtype = Dtype::fp32,
                                               .context = n,
                                               .memory_bytes = weights + cap});
      const index_t predicted = budget.memory->max_sequences;
      const index_t P = 16;
      const index_t blocks = PagedKVCache<float>::blocks_within(cfg, budget.memory->free_bytes, P);
      EXPECT_EQ(PagedKVCache<float>::block_bytes(cfg, P), P * budget.kv_bytes_per_token);
      PagedKVCache<float> cache(cfg, blocks, P);
      EXPECT_LE(cache.bytes(), budget.memory->free_bytes);
      index_t admitted = 0;
      try {
        for (;;) {
          const index_t id[] = {cache.add_sequence()};
          cache.reserve(id, n);
          ++admitted;
        }
      } catch (const Error& error) {
        EXPECT_NE(std::string(error.what()).find("exhausted"), std::string::npos);
      }
      const index_t per_sequence = (n + P - 1) / P;
      EXPECT_EQ(admitted, blocks / per_sequence) << "n = " << n << ", cap " << cap;
      if (n % P == 0) {
        EXPECT_EQ(admitted, predicted) << "n = " << n << ", cap " << cap;
      } else {
        // The budget's count at the rounded-up length is exactly what the pool admits.
        const auto rounded = compute_budget(cfg, {.weight_dtype = Dtype::fp32,
                                                  .kv_dtype = Dtype::fp32,
                                                  .context = per_sequence * P,
                                                  .memory_bytes = weights + cap});
        EXPECT_EQ(admitted, rounded.memory->max_sequences) << "n = " << n << ", cap " << cap;
        EXPECT_LE(admitted, predicted);
      }
      EXPECT_GT(admitted, 0);
    }
  }
}

// ---- stateful fuzz (issue 51): allocate, share a prefix, step, free, refuse -------------------

/// A key or value element as a model would write it: a function of the tokens up to and
/// including its position (and of layer, head, element), so that two sequences with the same
/// prefix hold the same rows — which is what makes sharing a full block correct.
double prefix_value(std::uint64_t prefix_hash, index_t layer, index_t head, index_t i, int kind) {
  std::uint64_t z = prefix_hash ^ (std::uint64_t(layer) << 40) ^ (std::uint64_t(head) << 32) ^
                    (std::uint64_t(i) << 8) ^ std::uint64_t(kind);
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  z ^= z >> 31;
  return double(z >> 11) / double(1ull << 53) * 2.0 - 1.0;
}

std::uint64_t extend_hash(std::uint64_t h, index_t token) {
  return (h ^ std::uint64_t(token + 1)) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
}

/// What the test believes a sequence holds: its token ids (its length) and the prefix hash at
/// each position.
struct SequenceModel {
  std::vector<index_t> tokens;
  std::vector<std::uint64_t> hashes;
  void push(index_t token) {
    hashes.push_back(extend_hash(hashes.empty() ? 0xcbf29ce484222325ull : hashes.back(), token));
    tokens.push_back(token);
  }
};

/// Everything observable of the cache: per id whether it is active, its length and block table;
/// per block its reference count; the free count.
struct Snapshot {
  std::vector<std::optional<std::pair<index_t, std::vector<index_t>>>> sequences;
  std::vector<index_t> references;
  index_t free = 0;
  bool operator==(const Snapshot&) const = default;
};

Snapshot snapshot(const PagedKVCache<double>& cache, index_t ids) {
  Snapshot s;
  for (index_t id = 0; id < ids; ++id) {
    try {
      const auto table = cache.block_table(id);
      s.sequences.emplace_back(
          std::pair{cache.length(id), std::vector(table.begin(), table.end())});
    } catch (const Error&) {
      s.sequences.emplace_back(std::nullopt);
    }
  }
  for (index_t b = 0; b < cache.n_blocks(); ++b) s.references.push_back(cache.references(b));
  s.free = cache.free_blocks();
  return s;
}

/// The invariants after every call: lengths are the model's; a table holds distinct blocks,
/// at least ⌈length / P⌉; a block's reference count is the number of tables holding it, and 0
/// exactly for the free ones; a block held twice is full and lies before each holder's length
/// (so no step ever writes into it).
void check_invariants(const PagedKVCache<double>& cache,
                      const std::map<index_t, SequenceModel>& model, const std::string& where) {
  SCOPED_TRACE(where);
  const index_t P = cache.block_size();
  std::vector<index_t> holders(static_cast<std::size_t>(cache.n_blocks()), 0);
  for (const auto& [id, m] : model) {
    ASSERT_EQ(cache.length(id), static_cast<index_t>(m.tokens.size())) << "sequence " << id;
    const auto table = cache.block_table(id);
    ASSERT_GE(static_cast<index_t>(table.size()), cache.blocks_for(cache.length(id)));
    std::vector<index_t> sorted(table.begin(), table.end());
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(std::adjacent_find(sorted.begin(), sorted.end()), sorted.end()) << "sequence " << id;
    for (index_t block : table) ++holders[static_cast<std::size_t>(block)];
  }
  index_t free = 0;
  for (index_t b = 0; b < cache.n_blocks(); ++b) {
    ASSERT_EQ(cache.references(b), holders[static_cast<std::size_t>(b)]) << "block " << b;
    free += holders[static_cast<std::size_t>(b)] == 0;
  }
  ASSERT_EQ(cache.free_blocks(), free);
  ASSERT_EQ(cache.active_sequences(), static_cast<index_t>(model.size()));
  for (const auto& [id, m] : model) {
    const auto table = cache.block_table(id);
    for (std::size_t j = 0; j < table.size(); ++j) {
      if (cache.references(table[j]) > 1) {
        ASSERT_LE(static_cast<index_t>(j + 1) * P, cache.length(id))
            << "block " << table[j] << " is shared but not full in sequence " << id;
      }
    }
  }
}

TEST(PagedKVCacheFuzz, AllocateShareStepFreeAndRefuseKeepEveryInvariantAndTheAttention) {
  // Seeded random calls on a small pool (so it runs out), tokens from a 3-letter alphabet (so
  // prompts share prefixes), bad ids, repeated ids and steps that do not fit among them. After
  // every call: the invariants above; a call that throws changed nothing; every step's attention
  // equals the naive causal softmax over the rows the sequence's tokens imply — which fails if a
  // shared block were overwritten, a table pointed at another sequence's block, or a freed block
  // were still read.
  const TransformerConfig cfg = config();
  const index_t H = 4, H_kv = 2, d = 4, L = 2;
  int calls = 0, refused = 0, shared_positions = 0, steps = 0;
  for (const index_t block_size : {1, 2, 4}) {
    for (std::uint64_t seed = 1; seed <= 4; ++seed) {
      std::mt19937_64 rng(seed * 7919 + static_cast<std::uint64_t>(block_size));
      const auto pick = [&rng](index_t lo, index_t hi) {
        return std::uniform_int_distribution<index_t>(lo, hi)(rng);
      };
      PagedKVCache<double> cache(cfg, 10 + pick(0, 8), block_size);
      std::map<index_t, SequenceModel> model;
      const index_t id_range = 8;
      const auto some_id = [&]() -> index_t {
        if (model.empty() || pick(0, 5) == 0) return pick(-2, id_range);  // maybe not active
        auto it = model.begin();
        std::advance(it, pick(0, static_cast<index_t>(model.size()) - 1));
        return it->first;
      };
      // Runs `call`; if it throws dissect::Error the cache must be exactly as before.
      const auto guarded = [&](const std::string& what, auto&& call) -> bool {
        ++calls;
        const Snapshot before = snapshot(cache, id_range);
        try {
          call();
          return true;
        } catch (const Error&) {
          ++refused;
          EXPECT_EQ(snapshot(cache, id_range), before) << what << " threw and changed the cache";
          return false;
        }
      };
      const auto step = [&](std::vector<index_t> ids,
                            const std::vector<std::vector<index_t>>& add) {
        const index_t B = static_cast<index_t>(ids.size());
        const index_t T = add.empty() ? 0 : static_cast<index_t>(add[0].size());
        bool ok = guarded("check_step", [&] { cache.check_step("fuzz", cfg, ids, T); });
        ok = ok && guarded("reserve", [&] { cache.reserve(ids, T); });
        if (!ok) return;
        ++steps;
        Tensor<double, 4> q({B, H, T, d}), k({B, H_kv, T, d}), v({B, H_kv, T, d}), o({B, H, T, d});
        for (index_t layer = 0; layer < L; ++layer) {
          std::vector<std::vector<std::uint64_t>> hashes(static_cast<std::size_t>(B));
          for (index_t b = 0; b < B; ++b) {
            SequenceModel grown = model.at(ids[static_cast<std::size_t>(b)]);
            for (index_t t : add[static_cast<std::size_t>(b)]) grown.push(t);
            hashes[static_cast<std::size_t>(b)] = grown.hashes;
            for (index_t t = 0; t < T; ++t) {
              const std::uint64_t h = grown.hashes[grown.hashes.size() - std::size_t(T - t)];
              for (index_t g = 0; g < H_kv; ++g) {
                for (index_t i = 0; i < d; ++i) {
                  k(b, g, t, i) = prefix_value(h, layer, g, i, 0);
                  v(b, g, t, i) = prefix_value(h, layer, g, i, 1);
                }
              }
              for (index_t hq = 0; hq < H; ++hq) {
                for (index_t i = 0; i < d; ++i) q(b, hq, t, i) = prefix_value(h, layer, hq, i, 2);
              }
            }
          }
          cache.attend(layer, ids, q, k, v, o);
          for (index_t b = 0; b < B && T > 0; ++b) {
            const auto& hs = hashes[static_cast<std::size_t>(b)];
            const index_t S = static_cast<index_t>(hs.size()), held = S - T;
            std::vector<double> keys(static_cast<std::size_t>(H_kv * S * d)), values(keys.size());
            for (index_t g = 0; g < H_kv; ++g) {
              for (index_t j = 0; j < S; ++j) {
                for (index_t i = 0; i < d; ++i) {
                  keys[static_cast<std::size_t>((g * S + j) * d + i)] =
                      prefix_value(hs[static_cast<std::size_t>(j)], layer, g, i, 0);
                  values[static_cast<std::size_t>((g * S + j) * d + i)] =
                      prefix_value(hs[static_cast<std::size_t>(j)], layer, g, i, 1);
                }
              }
            }
            Tensor<double, 4> qb({1, H, T, d}), ob({1, H, T, d});
            std::copy_n(q.data() + b * H * T * d, H * T * d, qb.data());
            std::copy_n(o.data() + b * H * T * d, H * T * d, ob.data());
            EXPECT_TENSOR_NEAR(ob, naive_attention(qb, keys, values, held), 1e-12, 1e-12)
                << "sequence " << ids[static_cast<std::size_t>(b)] << " at " << held;
          }
        }
        std::vector<index_t> flat;
        for (const auto& a : add) flat.insert(flat.end(), a.begin(), a.end());
        cache.advance(ids, TokenBatch{flat, B, T});
        for (index_t b = 0; b < B; ++b) {
          for (index_t t : add[static_cast<std::size_t>(b)]) {
            model.at(ids[static_cast<std::size_t>(b)]).push(t);
          }
        }
      };
      for (int op = 0; op < 160; ++op) {
        const std::string where = "block size " + std::to_string(block_size) + ", seed " +
                                  std::to_string(seed) + ", call " + std::to_string(op);
        switch (pick(0, 5)) {
          case 0: {  // a new sequence, its prompt through the prompt cache, then the rest
            if (cache.active_sequences() >= 6) break;
            const index_t id = cache.add_sequence();
            model[id];
            std::vector<index_t> prompt(static_cast<std::size_t>(pick(1, 11)));
            for (auto& t : prompt) t = pick(0, pick(0, 3) == 0 ? 2 : 0);
            index_t taken = 0;
            guarded("share_prefix", [&] { taken = cache.share_prefix(id, prompt); });
            shared_positions += static_cast<int>(taken);
            for (index_t j = 0; j < taken; ++j) model[id].push(prompt[static_cast<std::size_t>(j)]);
            step({id}, {std::vector<index_t>(prompt.begin() + taken, prompt.end())});
            break;
          }
          case 1: {  // release, sometimes an id that is not active
            const index_t id = some_id();
            if (guarded("release", [&] { cache.release(id); })) model.erase(id);
            break;
          }
          case 2:
          case 3: {  // a decode or prefill step over 1–3 sequences, sometimes one id twice
            std::vector<index_t> ids;
            const index_t B = pick(1, 3);
            for (index_t b = 0; b < B; ++b) ids.push_back(some_id());
            bool valid = true;
            for (index_t id : ids) valid = valid && model.count(id);
            const index_t T = pick(0, 4) == 0 ? pick(2, 6) : 1;
            std::vector<std::vector<index_t>> add(ids.size(), std::vector<index_t>(T));
            for (auto& a : add) {
              for (auto& t : a) t = pick(0, 2);
            }
            bool fits = valid;
            for (index_t id : ids) {
              fits = fits && model.count(id) && model.at(id).tokens.size() + T <= 40;
            }
            if (!valid) {
              EXPECT_FALSE(guarded("check_step", [&] { cache.check_step("fuzz", cfg, ids, T); }));
            } else if (fits) {
              step(ids, add);
            }
            break;
          }
          case 4: {  // share_prefix on a sequence that already holds positions: refused
            const index_t id = some_id();
            if (model.count(id) && !model.at(id).tokens.empty()) {
              const std::vector<index_t> prompt(8, 0);
              EXPECT_FALSE(guarded("share_prefix", [&] { (void)cache.share_prefix(id, prompt); }));
            }
            break;
          }
          case 5: {  // advance without the blocks, or with the wrong number of ids
            const index_t id = some_id();
            const std::vector<index_t> ids{id};
            const std::vector<index_t> tokens(3, 1);
            if (!model.count(id) || cache.block_table(id).size() * std::size_t(block_size) <
                                        model.at(id).tokens.size() + 3) {
              EXPECT_FALSE(guarded("advance", [&] {
                cache.advance(ids, TokenBatch{tokens, 1, 3});
              }));
            }
            EXPECT_FALSE(guarded("advance", [&] { cache.advance(ids, TokenBatch{tokens, 2, 1}); }));
            break;
          }
        }
        check_invariants(cache, model, where);
        if (::testing::Test::HasFatalFailure()) return;
      }
      for (const auto& [id, m] : model) cache.release(id);
      EXPECT_EQ(cache.free_blocks(), cache.n_blocks());
      EXPECT_EQ(cache.active_sequences(), 0);
    }
  }
  // Not vacuous: every kind of call ran, many were refused, and prompts did share blocks.
  EXPECT_GT(steps, 300);
  EXPECT_GT(refused, 100);
  EXPECT_GT(shared_positions, 50);
  std::cout << "[ fuzz     ] " << calls << " calls, " << steps << " steps, " << refused
            << " refused, " << shared_positions << " positions shared\n";
}

}  // namespace test_paged_kv_cache
}  // namespace dissect
