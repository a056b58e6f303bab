// dissect/attention/paged_kv_cache.hpp — a KV cache of fixed-size blocks shared by sequences of
// different lengths (vLLM's PagedAttention), the memory that continuous batching decodes over.
//
// The pool holds N blocks of P positions (16 by default) in every layer, allocated once. A
// sequence owns a block table, the ids of its blocks in position order, and takes a block from
// the pool only when a position falls past its last one, so a sequence of n positions holds
// ⌈n/P⌉ blocks whatever the others hold. A full block is registered under its tokens and the
// block before it (so under its whole prefix, exactly): a new sequence whose prompt begins with
// the same full blocks takes them, reference counted, instead of computing them again (the
// prompt cache). Only full blocks are shared and a sequence writes only after its length, so a
// shared block is never written. A block returns to the pool when the last sequence holding it
// is released. Attention walks a sequence's blocks one by one with the online softmax: nothing
// is gathered into a contiguous copy. A forward extends the sequences it names: the cache bound
// to them, select(sequences), is an InferenceCache (kv_cache_concept.hpp), row b being
// sequences[b] at its own length.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/attention/attention.hpp"
#include "dissect/attention/kv_cache_concept.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/core/token_batch.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

template <class Scalar>
class PagedKVCache {
 public:
  using scalar_type = Scalar;
  static constexpr index_t default_block_size = 16;

  /// A pool of `blocks` blocks of `block_size` positions in each of the config's layers,
  /// zero-filled. @throws ConfigError if the config is invalid or has a sliding_window (a paged
  ///         cache keeps every position: use RollingKVCache), or blocks or block_size ≤ 0;
  ///         OverflowError if the size leaves int64.
  PagedKVCache(const TransformerConfig& config, index_t blocks,
               index_t block_size = default_block_size);

  /// Bytes of one block in every layer, K and V: 2 · L · P · H_kv · d_k · sizeof(Scalar) — the
  /// budget's KV bytes per position times P.
  static index_t block_bytes(const TransformerConfig& config,
                             index_t block_size = default_block_size);
  /// The blocks that `memory_bytes` holds: ⌊memory / block_bytes⌋ (0 if it holds none).
  static index_t blocks_within(const TransformerConfig& config, index_t memory_bytes,
                               index_t block_size = default_block_size);
  /// Blocks a sequence of `positions` positions holds: ⌈positions / P⌉.
  index_t blocks_for(index_t positions) const {
    return positions <= 0 ? 0 : (positions + block_size() - 1) / block_size();
  }

  index_t n_layers() const { return keys_.dim(0); }
  index_t n_blocks() const { return keys_.dim(1); }
  index_t n_kv_heads() const { return keys_.dim(2); }
  index_t block_size() const { return keys_.dim(3); }
  index_t head_dim() const { return keys_.dim(4); }
  /// Blocks in the pool, free now; blocks held by at least one sequence.
  index_t free_blocks() const { return static_cast<index_t>(free_.size()); }
  index_t used_blocks() const { return n_blocks() - free_blocks(); }
  /// Bytes of the pool (all N blocks) and of the blocks in use.
  index_t bytes() const { return 2 * keys_.size() * static_cast<index_t>(sizeof(Scalar)); }
  index_t used_bytes() const { return used_blocks() * (bytes() / n_blocks()); }
  /// Sequences added and not yet released.
  index_t active_sequences() const;

  /// A new, empty sequence; returns its id (ids of released sequences are reused).
  index_t add_sequence();
  /// Gives back every block of `sequence` (each returns to the pool when no other sequence
  /// holds it) and ends the sequence. @throws Error for an id that is not active.
  void release(index_t sequence);
  /// Positions `sequence` holds; the ids of its blocks, in position order.
  /// @throws Error for an id that is not active.
  index_t length(index_t sequence) const { return at("PagedKVCache::length", sequence).length; }
  std::span<const index_t> block_table(index_t sequence) const {
    return at("PagedKVCache::block_table", sequence).blocks;
  }
  /// How many sequences hold block `block` (0: free). @throws Error if out of range.
  index_t references(index_t block) const;

  /// The prompt cache: the empty `sequence` takes the registered full blocks that hold the
  /// beginning of `prompt`, as many as match, leaving at least its last token to compute (its
  /// logits are the first draw's). Returns the positions taken (a multiple of P); the caller
  /// forwards prompt[taken …]. @throws Error if the sequence is not active or not empty.
  index_t share_prefix(index_t sequence, std::span<const index_t> prompt);

  /// Checks a step of `tokens` new positions for each of `sequences` before any work: this cache
  /// was built for `config`, every id is active and appears once, and the pool has the blocks
  /// the step needs. @throws ShapeError naming `op` for another config or tokens < 0; Error for
  ///         a bad id, and for an exhausted pool naming the blocks needed and free.
  void check_step(std::string_view op, const TransformerConfig& config,
                  std::span<const index_t> sequences, index_t tokens) const;

  /// Takes from the pool the blocks that `tokens` more positions of each sequence need (none
  /// changes on a throw). @throws as check_step.
  void reserve(std::span<const index_t> sequences, index_t tokens);

  /// Layer `layer`'s attention for sequences[b]'s T new positions length … length + T − 1:
  /// writes k and v [B, H_kv, T, d_k] into its blocks (reserved first), then
  /// o [B, H, T, d_k] = causal softmax(scale·q·kᵀ)·v over every position it holds, block by
  /// block. length does not move until advance(). @throws ShapeError if a shape does not fit;
  /// Error for a bad layer or id, or blocks not reserved (nothing written); ConfigError for a
  /// scale not finite and > 0.
  template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
  void attend(index_t layer, std::span<const index_t> sequences, const Q& q, const K& k, const V& v,
              O&& o, std::optional<double> scale = std::nullopt);

  /// Once every layer has attended: moves each sequence's length on by the batch's T and
  /// records its token ids (tokens.ids, B·T, row b for sequences[b]); a block that becomes
  /// full is registered for share_prefix. @throws as check_step (nothing changes).
  void advance(std::span<const index_t> sequences, TokenBatch tokens);

  class Batch;
  /// The cache bound to the sequences one step extends, row b being sequences[b]: what a
  /// decoder's forward runs over (an InferenceCache). It refers to this cache and to the ids,
  /// which must outlive it.
  Batch select(std::span<const index_t> sequences);

 private:
  struct Sequence {
    bool active = false;
    index_t length = 0;
    std::vector<index_t> blocks;  // the block table
    std::vector<index_t> tokens;  // the ids at positions 0 … length − 1, for registration
  };
  // A registered block: the block before it (−1 for the first) and its P tokens.
  struct Registration {
    bool registered = false;
    std::uint64_t hash = 0;
    index_t parent = -1;
  };

  const Sequence& at(std::string_view op, index_t sequence) const;
  Sequence& at(std::string_view op, index_t sequence) {
    return const_cast<Sequence&>(std::as_const(*this).at(op, sequence));
  }
  index_t blocks_needed(std::span<const index_t> sequences, index_t tokens) const;
  std::uint64_t block_hash(index_t parent, std::span<const index_t> tokens) const;
  /// The registered block under `parent` holding `tokens`, or −1.
  index_t find_block(index_t parent, std::span<const index_t> tokens) const;
  void register_block(index_t block, index_t parent, std::span<const index_t> tokens);
  Scalar* row(Tensor<Scalar, 5>& store, index_t layer, index_t block, index_t head, index_t slot) {
    return store.data() +
           (((layer * n_blocks() + block) * n_kv_heads() + head) * block_size() + slot) *
               head_dim();
  }
  const Scalar* row(const Tensor<Scalar, 5>& store, index_t layer, index_t block, index_t head,
                    index_t slot) const {
    return const_cast<PagedKVCache*>(this)->row(const_cast<Tensor<Scalar, 5>&>(store), layer, block,
                                                head, slot);
  }
  void attend_sequence(index_t layer, const Sequence& sequence, const Scalar* q, Scalar* o,
                       index_t heads, index_t tokens, Scalar scale) const;

  Tensor<Scalar, 5> keys_;              // [L, N, H_kv, P, d_k]
  Tensor<Scalar, 5> values_;            // [L, N, H_kv, P, d_k]
  std::vector<index_t> references_;     // per block: the sequences holding it
  std::vector<index_t> free_;           // a stack of free block ids
  std::vector<Registration> registry_;  // per block
  std::vector<index_t> block_tokens_;   // per block: the P tokens it was registered under
  std::unordered_multimap<std::uint64_t, index_t> prefixes_;  // hash → registered block
  std::vector<Sequence> sequences_;
};

/// A PagedKVCache bound to the sequences of one step (PagedKVCache::select): InferenceCache's
/// members, each the cache's own for those sequences.
template <class Scalar>
class PagedKVCache<Scalar>::Batch {
 public:
  using scalar_type = Scalar;

  Batch(PagedKVCache& cache, std::span<const index_t> sequences)
      : cache_(&cache), sequences_(sequences) {}

  PagedKVCache& cache() const { return *cache_; }
  std::span<const index_t> sequences() const { return sequences_; }
  /// B: the sequences bound.
  index_t batch() const { return static_cast<index_t>(sequences_.size()); }
  /// Positions sequences[row] holds: where its next token goes.
  /// @throws Error if row is outside [0, B) or its sequence is not active.
  index_t position(index_t row) const;
  /// Checks one id per row of a step of `batch` rows, then the cache's check_step for the
  /// sequences. @throws ShapeError naming `op` if the counts differ; as PagedKVCache::check_step.
  void check_step(std::string_view op, const TransformerConfig& config, index_t batch,
                  index_t tokens) const;
  /// Takes the blocks `tokens` more positions of each sequence need (PagedKVCache::reserve).
  void reserve(index_t tokens) { cache_->reserve(sequences_, tokens); }
  /// PagedKVCache::attend for the sequences. A paged cache keeps every position, so `window`
  /// must be unset. @throws ShapeError for a window (nothing written); as PagedKVCache::attend.
  template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
  void attend(index_t layer, const Q& q, const K& k, const V& v, O&& o,
              std::optional<double> scale = std::nullopt,
              std::optional<index_t> window = std::nullopt);
  /// PagedKVCache::advance for the sequences.
  void advance(TokenBatch tokens) { cache_->advance(sequences_, tokens); }

 private:
  PagedKVCache* cache_;
  std::span<const index_t> sequences_;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
inline Shape<5> paged_cache_shape(const TransformerConfig& config, index_t blocks,
                                  index_t block_size) {
  config.validate();
  if (config.sliding_window) {
    throw ConfigError(detail::concat("PagedKVCache: config.sliding_window is ",
                                     *config.sliding_window,
                                     "; a paged cache keeps every position (use RollingKVCache)"));
  }
  return {config.n_layers, require_positive("PagedKVCache", "blocks", blocks), config.kv_heads(),
          require_positive("PagedKVCache", "block_size", block_size), config.head_size()};
}
}  // namespace detail

template <class Scalar>
PagedKVCache<Scalar>::PagedKVCache(const TransformerConfig& config, index_t blocks,
                                   index_t block_size)
    : keys_(detail::paged_cache_shape(config, blocks, block_size)),
      values_(keys_.shape()),
      references_(static_cast<std::size_t>(blocks), 0),
      registry_(static_cast<std::size_t>(blocks)),
      block_tokens_(static_cast<std::size_t>(checked_mul(blocks, block_size, "PagedKVCache"))) {
  // Popped from the back: block 0 first, so a fresh pool fills in order.
  free_.reserve(static_cast<std::size_t>(blocks));
  for (index_t b = blocks; b-- > 0;) free_.push_back(b);
}

template <class Scalar>
index_t PagedKVCache<Scalar>::block_bytes(const TransformerConfig& config, index_t block_size) {
  const auto shape = detail::paged_cache_shape(config, 1, block_size);
  return checked_mul(2 * static_cast<index_t>(sizeof(Scalar)),
                     checked_mul(checked_mul(shape[0], shape[2], "PagedKVCache::block_bytes"),
                                 checked_mul(shape[3], shape[4], "PagedKVCache::block_bytes"),
                                 "PagedKVCache::block_bytes"),
                     "PagedKVCache::block_bytes");
}

template <class Scalar>
index_t PagedKVCache<Scalar>::blocks_within(const TransformerConfig& config, index_t memory_bytes,
                                            index_t block_size) {
  return std::max<index_t>(0, memory_bytes) / block_bytes(config, block_size);
}

template <class Scalar>
index_t PagedKVCache<Scalar>::active_sequences() const {
  return static_cast<index_t>(
      std::count_if(sequences_.begin(), sequences_.end(), [](const auto& s) { return s.active; }));
}

template <class Scalar>
auto PagedKVCache<Scalar>::at(std::string_view op, index_t sequence) const -> const Sequence& {
  if (sequence < 0 || sequence >= static_cast<index_t>(sequences_.size()) ||
      !sequences_[static_cast<std::size_t>(sequence)].active) {
    throw Error(detail::concat(op, ": sequence ", sequence,
                               " is not active (added and not released; ", active_sequences(),
                               " active of ", sequences_.size(), " ids)"));
  }
  return sequences_[static_cast<std::size_t>(sequence)];
}

template <class Scalar>
index_t PagedKVCache<Scalar>::references(index_t block) const {
  if (block < 0 || block >= n_blocks()) {
    throw Error(detail::concat("PagedKVCache::references: block ", block, " is outside [0, ",
                               n_blocks(), ")"));
  }
  return references_[static_cast<std::size_t>(block)];
}

template <class Scalar>
index_t PagedKVCache<Scalar>::add_sequence() {
  auto free_id =
      std::find_if(sequences_.begin(), sequences_.end(), [](const auto& s) { return !s.active; });
  if (free_id == sequences_.end()) free_id = sequences_.insert(sequences_.end(), Sequence{});
  *free_id = Sequence{};
  free_id->active = true;
  return static_cast<index_t>(free_id - sequences_.begin());
}

template <class Scalar>
void PagedKVCache<Scalar>::release(index_t sequence) {
  auto& s = at("PagedKVCache::release", sequence);
  for (index_t block : s.blocks) {
    auto& count = references_[static_cast<std::size_t>(block)];
    if (--count > 0) continue;
    // The last holder: the block leaves the prompt cache with its contents.
    auto& registration = registry_[static_cast<std::size_t>(block)];
    if (registration.registered) {
      auto [first, last] = prefixes_.equal_range(registration.hash);
      for (auto it = first; it != last; ++it) {
        if (it->second == block) {
          prefixes_.erase(it);
          break;
        }
      }
      registration = Registration{};
    }
    free_.push_back(block);
  }
  s = Sequence{};
}

template <class Scalar>
std::uint64_t PagedKVCache<Scalar>::block_hash(index_t parent,
                                               std::span<const index_t> tokens) const {
  // FNV-1a over the parent's id and the ids: the parent stands for the whole prefix before the
  // block, because it is itself registered under its own parent and tokens. find_block compares
  // the tokens, so a collision costs a comparison, never a wrong block.
  std::uint64_t h = 1469598103934665603ULL;
  const auto mix = [&h](index_t value) {
    auto bits = static_cast<std::uint64_t>(value);
    for (int i = 0; i < 8; ++i, bits >>= 8) {
      h ^= bits & 0xff;
      h *= 1099511628211ULL;
    }
  };
  mix(parent);
  for (index_t token : tokens) mix(token);
  return h;
}

template <class Scalar>
index_t PagedKVCache<Scalar>::find_block(index_t parent, std::span<const index_t> tokens) const {
  auto [first, last] = prefixes_.equal_range(block_hash(parent, tokens));
  for (auto it = first; it != last; ++it) {
    const index_t block = it->second;
    const auto held = std::span<const index_t>(block_tokens_)
                          .subspan(static_cast<std::size_t>(block * block_size()),
                                   static_cast<std::size_t>(block_size()));
    if (registry_[static_cast<std::size_t>(block)].parent == parent &&
        std::equal(held.begin(), held.end(), tokens.begin(), tokens.end())) {
      return block;
    }
  }
  return -1;
}

template <class Scalar>
void PagedKVCache<Scalar>::register_block(index_t block, index_t parent,
                                          std::span<const index_t> tokens) {
  // A block computed twice (two sequences prefilled the same prefix before either was full) is
  // registered once; the second copy stays private to its sequence, and so do the blocks after
  // it: a lookup reaches a block only through its registered parent.
  if (parent >= 0 && !registry_[static_cast<std::size_t>(parent)].registered) return;
  if (find_block(parent, tokens) >= 0) return;
  auto& registration = registry_[static_cast<std::size_t>(block)];
  registration = {true, block_hash(parent, tokens), parent};
  std::copy(tokens.begin(), tokens.end(),
            block_tokens_.begin() + static_cast<std::ptrdiff_t>(block * block_size()));
  prefixes_.emplace(registration.hash, block);
}

template <class Scalar>
index_t PagedKVCache<Scalar>::share_prefix(index_t sequence, std::span<const index_t> prompt) {
  constexpr std::string_view op = "PagedKVCache::share_prefix";
  auto& s = at(op, sequence);
  if (s.length != 0) {
    throw Error(detail::concat(op, ": sequence ", sequence, " already holds ", s.length,
                               " positions; only an empty sequence takes a prefix"));
  }
  const index_t P = block_size();
  // The last token is always computed: its logits are what the first draw reads.
  const index_t most = prompt.empty() ? 0 : (static_cast<index_t>(prompt.size()) - 1) / P;
  index_t parent = -1, taken = 0;
  for (; taken < most; ++taken) {
    const index_t block = find_block(
        parent, prompt.subspan(static_cast<std::size_t>(taken * P), static_cast<std::size_t>(P)));
    if (block < 0) break;
    parent = block;
  }
  // Only now that every lookup is done is anything changed (nothing above throws but bad_alloc).
  s.blocks.reserve(static_cast<std::size_t>(taken));
  s.tokens.assign(prompt.begin(), prompt.begin() + static_cast<std::ptrdiff_t>(taken * P));
  parent = -1;
  for (index_t i = 0; i < taken; ++i) {
    parent = find_block(
        parent, prompt.subspan(static_cast<std::size_t>(i * P), static_cast<std::size_t>(P)));
    s.blocks.push_back(parent);
    ++references_[static_cast<std::size_t>(parent)];
  }
  s.length = taken * P;
  return s.length;
}

template <class Scalar>
index_t PagedKVCache<Scalar>::blocks_needed(std::span<const index_t> sequences,
                                            index_t tokens) const {
  index_t needed = 0;
  for (index_t id : sequences) {
    const auto& s = sequences_[static_cast<std::size_t>(id)];
    needed +=
        std::max<index_t>(0, blocks_for(s.length + tokens) - static_cast<index_t>(s.blocks.size()));
  }
  return needed;
}

template <class Scalar>
void PagedKVCache<Scalar>::check_step(std::string_view op, const TransformerConfig& config,
                                      std::span<const index_t> sequences, index_t tokens) const {
  const Shape<5> wanted{config.n_layers, n_blocks(), config.kv_heads(), block_size(),
                        config.head_size()};
  if (wanted != keys_.shape() || config.sliding_window) {
    throw ShapeError(
        detail::concat(op, ": the paged KV cache was built for [L, N, H_kv, P, d_k] = ",
                       format_shape(keys_.shape()), ", this model needs ", format_shape(wanted),
                       config.sliding_window ? " (and has a sliding window)" : ""));
  }
  if (tokens < 0) {
    throw ShapeError(detail::concat(op, ": ", tokens, " new positions (need >= 0)"));
  }
  for (std::size_t i = 0; i < sequences.size(); ++i) {
    at(op, sequences[i]);
    if (std::find(sequences.begin(), sequences.begin() + static_cast<std::ptrdiff_t>(i),
                  sequences[i]) != sequences.begin() + static_cast<std::ptrdiff_t>(i)) {
      throw Error(detail::concat(
          op, ": sequence ", sequences[i], " appears twice in one step (rows ",
          std::find(sequences.begin(), sequences.end(), sequences[i]) - sequences.begin(), " and ",
          i, ")"));
    }
  }
  const index_t needed = blocks_needed(sequences, tokens);
  if (needed > free_blocks()) {
    throw Error(detail::concat(op, ": the paged KV cache is exhausted: ", sequences.size(),
                               " sequences need ", needed, " more blocks of ", block_size(),
                               " positions for ", tokens, " new positions each, ", free_blocks(),
                               " of ", n_blocks(), " blocks are free (", active_sequences(),
                               " sequences hold the rest)"));
  }
}

template <class Scalar>
void PagedKVCache<Scalar>::reserve(std::span<const index_t> sequences, index_t tokens) {
  constexpr std::string_view op = "PagedKVCache::reserve";
  if (tokens < 0) throw ShapeError(detail::concat(op, ": ", tokens, " new positions (need >= 0)"));
  for (index_t id : sequences) at(op, id);
  const index_t needed = blocks_needed(sequences, tokens);
  if (needed > free_blocks()) {
    throw Error(detail::concat(op, ": the paged KV cache is exhausted: ", sequences.size(),
                               " sequences need ", needed, " more blocks of ", block_size(),
                               " positions for ", tokens, " new positions each, ", free_blocks(),
                               " of ", n_blocks(), " blocks are free"));
  }
  for (index_t id : sequences) {
    auto& s = sequences_[static_cast<std::size_t>(id)];
    while (static_cast<index_t>(s.blocks.size()) < blocks_for(s.length + tokens)) {
      const index_t block = free_.back();
      free_.pop_back();
      references_[static_cast<std::size_t>(block)] = 1;
      s.blocks.push_back(block);
    }
  }
}

template <class Scalar>
template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
void PagedKVCache<Scalar>::attend(index_t layer, std::span<const index_t> sequences, const Q& q,
                                  const K& k, const V& v, O&& o, std::optional<double> scale) {
  require_layer_scalar<Scalar, Q>();
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  require_layer_scalar<Scalar, O>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4 && rank_of<O> == 4,
                "PagedKVCache::attend: q, k, v and o are [B, heads, T, d_k]");
  constexpr std::string_view op = "PagedKVCache::attend";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  const auto out = writable_view(o);
  if (layer < 0 || layer >= n_layers()) {
    throw Error(detail::concat(op, ": layer ", layer, " is out of range [0, ", n_layers(), ")"));
  }
  const index_t batch = static_cast<index_t>(sequences.size()), tokens = kv.dim(2),
                d_k = head_dim();
  const Shape<4> expected{batch, n_kv_heads(), tokens, d_k};
  for (const auto* tensor : {&kv, &vv}) {
    if (tensor->shape() != expected) {
      throw ShapeError(detail::concat(op, ": ", tensor == &kv ? "k" : "v",
                                      " must be [B, H_kv, T, d_k] = ", format_shape(expected),
                                      " for ", batch, " sequences, got ",
                                      format_shape(tensor->shape())));
    }
  }
  detail::check_attention_inputs(op, qv, kv, vv);  // q's B, H (a multiple of H_kv), d_k
  if (qv.dim(2) != tokens) {
    throw ShapeError(detail::concat(op, ": q must hold k's T = ", tokens, " positions, got ",
                                    format_shape(qv.shape())));
  }
  detail::check_attention_output(op, "o", out.shape(), qv);
  if (out.overlaps(qv) || out.overlaps(kv) || out.overlaps(vv)) {
    throw ShapeError(detail::concat(op, ": o must not share memory with q, k or v"));
  }
  for (index_t id : sequences) {
    const auto& s = at(op, id);
    if (static_cast<index_t>(s.blocks.size()) < blocks_for(s.length + tokens)) {
      throw Error(detail::concat(op, ": sequence ", id, " holds ", s.blocks.size(), " blocks, ",
                                 blocks_for(s.length + tokens), " are needed for ", s.length, " + ",
                                 tokens, " positions (reserve them first)"));
    }
  }
  const Scalar s = detail::score_scale<Scalar>(op, scale, d_k);
  if (tokens == 0 || batch == 0) return;
  // The new rows go after each sequence's length: into blocks it alone holds, since a shared
  // block is full and lies before the length.
  for (auto [store, source] : {std::pair{&keys_, kv.data()}, std::pair{&values_, vv.data()}}) {
    for (index_t b = 0; b < batch; ++b) {
      const auto& seq =
          sequences_[static_cast<std::size_t>(sequences[static_cast<std::size_t>(b)])];
      for (index_t h = 0; h < n_kv_heads(); ++h) {
        for (index_t t = 0; t < tokens; ++t, source += d_k) {
          const index_t position = seq.length + t;
          std::copy_n(
              source, d_k,
              row(*store, layer, seq.blocks[static_cast<std::size_t>(position / block_size())], h,
                  position % block_size()));
        }
      }
    }
  }
  const index_t heads = qv.dim(1), per_sequence = heads * tokens * d_k;
  for (index_t b = 0; b < batch; ++b) {
    attend_sequence(layer,
                    sequences_[static_cast<std::size_t>(sequences[static_cast<std::size_t>(b)])],
                    qv.data() + b * per_sequence, out.data() + b * per_sequence, heads, tokens, s);
  }
}

template <class Scalar>
void PagedKVCache<Scalar>::attend_sequence(index_t layer, const Sequence& sequence, const Scalar* q,
                                           Scalar* o, index_t heads, index_t tokens,
                                           Scalar scale) const {
  // The online softmax of detail::online_causal_attention, with the sequence's blocks as the key
  // tiles: block j holds positions j·P … j·P + P − 1, each head's rows contiguous, [P, d_k].
  constexpr index_t query_block = detail::attention_query_block;
  constexpr Scalar minus_inf = -std::numeric_limits<Scalar>::infinity();
  const index_t P = block_size(), d_k = head_dim(), group = heads / n_kv_heads();
  const index_t offset = sequence.length;
#ifdef _OPENMP
#pragma omp parallel if (heads > 1 && !omp_in_parallel())
#endif
  {
    // One scratch set per thread and call, never per head or block.
    RowMatrix<Scalar> scores(query_block, P), acc(query_block, d_k), tile_values(query_block, d_k);
    Eigen::Matrix<Scalar, Eigen::Dynamic, 1> row_max(query_block), row_sum(query_block);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (index_t h = 0; h < heads; ++h) {
      const Eigen::Map<const RowMatrix<Scalar>> q_head(q + h * tokens * d_k, tokens, d_k);
      Eigen::Map<RowMatrix<Scalar>> o_head(o + h * tokens * d_k, tokens, d_k);
      for (index_t i0 = 0; i0 < tokens; i0 += query_block) {
        const index_t rows = std::min(query_block, tokens - i0);
        const index_t keys = offset + i0 + rows;  // the block's last query sees keys [0, keys)
        row_max.head(rows).setConstant(minus_inf);
        row_sum.head(rows).setZero();
        acc.topRows(rows).setZero();
        for (index_t j0 = 0; j0 < keys; j0 += P) {
          const index_t cols = std::min(P, keys - j0);
          const index_t block = sequence.blocks[static_cast<std::size_t>(j0 / P)];
          const Eigen::Map<const RowMatrix<Scalar>> k_block(row(keys_, layer, block, h / group, 0),
                                                            cols, d_k);
          const Eigen::Map<const RowMatrix<Scalar>> v_block(
              row(values_, layer, block, h / group, 0), cols, d_k);
          auto tile = scores.topLeftCorner(rows, cols);
          linear_forward<Scalar>(q_head.middleRows(i0, rows), k_block, std::nullopt, tile);
          tile *= scale;
          for (index_t r = 0; r < rows; ++r) {
            // Row r sees keys up to its own position; key 0 is in the first block, so its
            // maximum is finite from then on and a later fully masked tile adds exp(−inf) = 0.
            const index_t visible = std::clamp<index_t>(offset + i0 + r + 1 - j0, 0, cols);
            if (visible < cols) tile.row(r).tail(cols - visible).setConstant(minus_inf);
            const Scalar new_max = std::max(row_max[r], tile.row(r).maxCoeff());
            const Scalar correction = std::exp(row_max[r] - new_max);
            tile.row(r) = (tile.row(r).array() - new_max).exp().matrix();
            // Exactly 0 where masked (Eigen's vectorised exp of −inf is a denormal).
            if (visible < cols) tile.row(r).tail(cols - visible).setZero();
            row_sum[r] = row_sum[r] * correction + tile.row(r).sum();
            acc.row(r) *= correction;
            row_max[r] = new_max;
          }
          auto values = tile_values.topRows(rows);
          linear_backward_input<Scalar>(v_block, tile, values);
          acc.topRows(rows) += values;
        }
        o_head.middleRows(i0, rows) =
            row_sum.head(rows).cwiseInverse().asDiagonal() * acc.topRows(rows);
      }
    }
  }
}

template <class Scalar>
auto PagedKVCache<Scalar>::select(std::span<const index_t> sequences) -> Batch {
  return Batch(*this, sequences);
}

template <class Scalar>
index_t PagedKVCache<Scalar>::Batch::position(index_t row) const {
  if (row < 0 || row >= batch()) {
    throw Error(detail::concat("PagedKVCache::Batch::position: row ", row, " is outside [0, ",
                               batch(), ")"));
  }
  return cache_->length(sequences_[static_cast<std::size_t>(row)]);
}

template <class Scalar>
void PagedKVCache<Scalar>::Batch::check_step(std::string_view op, const TransformerConfig& config,
                                             index_t batch, index_t tokens) const {
  if (this->batch() != batch) {
    throw ShapeError(detail::concat(op, ": ", sequences_.size(), " sequence ids for B = ", batch,
                                    " rows of tokens (one id per row)"));
  }
  cache_->check_step(op, config, sequences_, tokens);
}

template <class Scalar>
template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
void PagedKVCache<Scalar>::Batch::attend(index_t layer, const Q& q, const K& k, const V& v, O&& o,
                                         std::optional<double> scale,
                                         std::optional<index_t> window) {
  if (window) {
    throw ShapeError(detail::concat(
        "PagedKVCache::attend: a sliding window (W = ", *window,
        ") reads only the last W positions; a paged cache keeps every one (use RollingKVCache)"));
  }
  cache_->attend(layer, sequences_, q, k, v, std::forward<O>(o), scale);
}

template <class Scalar>
void PagedKVCache<Scalar>::advance(std::span<const index_t> sequences, TokenBatch tokens) {
  constexpr std::string_view op = "PagedKVCache::advance";
  if (tokens.batch != static_cast<index_t>(sequences.size()) || tokens.seq < 0 ||
      static_cast<index_t>(tokens.ids.size()) != tokens.batch * tokens.seq) {
    throw ShapeError(detail::concat(op, ": ", sequences.size(), " sequences and ",
                                    tokens.ids.size(), " ids for B = ", tokens.batch,
                                    ", T = ", tokens.seq, " (need B = the sequences, B·T ids)"));
  }
  for (index_t id : sequences) {
    const auto& s = at(op, id);
    if (static_cast<index_t>(s.blocks.size()) < blocks_for(s.length + tokens.seq)) {
      throw Error(detail::concat(op, ": sequence ", id, " holds ", s.blocks.size(),
                                 " blocks, too few for ", s.length, " + ", tokens.seq,
                                 " positions (reserve and attend first)"));
    }
  }
  const index_t P = block_size();
  for (std::size_t b = 0; b < sequences.size(); ++b) {
    auto& s = sequences_[static_cast<std::size_t>(sequences[b])];
    const auto ids = tokens.ids.subspan(b * static_cast<std::size_t>(tokens.seq),
                                        static_cast<std::size_t>(tokens.seq));
    s.tokens.insert(s.tokens.end(), ids.begin(), ids.end());
    const index_t full_before = s.length / P;
    s.length += tokens.seq;
    for (index_t j = full_before; j < s.length / P; ++j) {
      register_block(s.blocks[static_cast<std::size_t>(j)],
                     j == 0 ? -1 : s.blocks[static_cast<std::size_t>(j - 1)],
                     std::span<const index_t>(s.tokens).subspan(static_cast<std::size_t>(j * P),
                                                                static_cast<std::size_t>(P)));
    }
  }
}

static_assert(InferenceCache<PagedKVCache<float>::Batch> &&
              InferenceCache<PagedKVCache<double>::Batch>);

}  // namespace dissect
