// dissect/attention/kv_cache_concept.hpp — InferenceCache: what a decoder's forward needs of a KV
// cache, so that one forward (DecoderModel's, DecoderLayer's) serves every cache.
//
// A forward over a cache extends B rows, each a sequence at its own position, by T tokens:
//
//   check_step   refuse a step that does not fit, before anything changes
//   position(b)  where row b's first new token goes (its RoPE and learned-position offset)
//   reserve(T)   make room for T more positions per row, once the ids are known to be good
//   attend(…)    per layer: keep the step's k and v, and attend q to every key the row may read
//   advance(tb)  once every layer has attended: the rows' lengths move on by T
//
// KVCache (B rows of up to a capacity) and RollingKVCache (a ring of the last W positions) are
// such caches as they are. A PagedKVCache holds any number of sequences and a forward names the
// ones it extends, so the cache bound to them, PagedKVCache::select(sequences), is one. What the
// decoding loops need beyond a forward is refined below: to roll back (speculative decoding) and
// to regather rows (beam search).
#pragma once

#include <concepts>
#include <optional>
#include <span>
#include <string_view>

#include "dissect/accounting/config.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/core/token_batch.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

/// A cache one decoding forward runs over (see the file comment for the order of the calls):
/// - `scalar_type`, the Scalar of its keys and values (the model's; no conversion);
/// - `batch()`: B, the rows one step extends; `position(b)`: row b's positions held so far, where
///   its next token goes;
/// - `check_step(op, config, B, T)`: throws, naming `op`, if the cache was not built for `config`
///   and B rows or has no room for T more positions (nothing changes);
/// - `reserve(T)`: takes what T more positions per row need (a paged cache's blocks);
/// - `attend(layer, q, k, v, o, scale, window)`: the layer's k and v [B, H_kv, T, d_k] kept, and
///   o [B, H, T, d_k] = causal softmax(scale·q·kᵀ)·v over the row's keys, only the last W with a
///   window W;
/// - `advance(tokens)`: every row's length moves on by tokens.seq (a paged cache records the ids).
template <class C>
concept InferenceCache = requires(C& kv, const C& held, std::string_view op,
                                  const TransformerConfig& config, index_t n, TokenBatch tokens,
                                  ConstTensorView<typename C::scalar_type, 4> q,
                                  TensorView<typename C::scalar_type, 4> o, double scale,
                                  std::optional<index_t> window) {
  { held.batch() } -> std::same_as<index_t>;
  { held.position(n) } -> std::same_as<index_t>;
  held.check_step(op, config, n, n);
  kv.reserve(n);
  kv.attend(n, q, q, q, o, scale, window);
  kv.advance(tokens);
};

/// An InferenceCache every row of which is at one length that can be cut back to a prefix:
/// speculative decoding drops the rejected draft's positions (KVCache::truncate).
template <class C>
concept TruncatableCache = InferenceCache<C> && requires(C& kv, const C& held, index_t n) {
  { held.length() } -> std::same_as<index_t>;
  kv.truncate(n);
};

/// An InferenceCache whose rows can be regathered from parent rows: beam search continues each
/// beam from the one it extends (KVCache::reorder).
template <class C>
concept ReorderableCache = InferenceCache<C> && requires(C& kv, std::span<const index_t> parents) {
  kv.reorder(parents);
};

}  // namespace dissect
