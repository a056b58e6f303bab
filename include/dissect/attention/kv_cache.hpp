// dissect/attention/kv_cache.hpp — the keys and values of every layer, kept while a model decodes.
//
// One KVCache serves one model and one batch: for each of the L layers it holds K and V as
// [B, H_kv, capacity, d_k], allocated once when it is built, so its bytes are exactly the
// budget's kv_cache_bytes(L, capacity, H_kv, d_k, dtype) · B, and decoding never allocates for
// it. A decoding step writes each layer's new positions after the `length()` already held and
// then advances the length once, for all layers; a step that is refused changes nothing. It is an
// InferenceCache (kv_cache_concept.hpp): a decoder's one cached forward runs over it, every row
// at position length().
#pragma once

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/attention/attention.hpp"
#include "dissect/attention/kv_cache_concept.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/core/token_batch.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

template <class Scalar>
class KVCache {
 public:
  using scalar_type = Scalar;

  /// Room for `batch` sequences of `capacity` positions (default: the config's context) in each
  /// of the config's layers, zero-filled.
  /// @throws ConfigError if the config is invalid or batch or capacity is ≤ 0; OverflowError if
  ///         the size leaves int64.
  KVCache(const TransformerConfig& config, index_t batch,
          std::optional<index_t> capacity = std::nullopt);

  index_t n_layers() const { return keys_.dim(0); }
  index_t batch() const { return keys_.dim(1); }
  index_t n_kv_heads() const { return keys_.dim(2); }
  index_t capacity() const { return keys_.dim(3); }
  index_t head_dim() const { return keys_.dim(4); }
  /// Positions held so far, the same in every layer.
  index_t length() const { return length_; }
  /// Positions still free.
  index_t remaining() const { return capacity() - length_; }
  /// Where row `row`'s next position goes: length(), the same for every row (InferenceCache).
  /// @throws Error if row is outside [0, batch()).
  index_t position(index_t row) const;

  /// Bytes of K and V storage: 2 · L · B · capacity · H_kv · d_k · sizeof(Scalar).
  index_t bytes() const { return 2 * keys_.size() * static_cast<index_t>(sizeof(Scalar)); }

  /// Forgets every position (the memory stays, for the next sequence).
  void clear() { length_ = 0; }

  /// Keeps the first `length` positions of every layer and forgets the rest (the memory stays):
  /// rolls the cache back to a prefix, e.g. to decode another continuation of the same prompt.
  /// The positions kept are untouched, so decoding from them again gives the same results.
  /// @throws ShapeError if length < 0 or length > length() (nothing changes).
  void truncate(index_t length);

  /// Replaces sequence b's positions by those of sequence parents[b], in every layer, for all b
  /// at once (rows may repeat or be dropped): beam search continues the beams it chose from
  /// the parents they extend, as Hugging Face's `_reorder_cache`. Copies through a scratch
  /// buffer of one layer's held positions, allocated per call.
  /// @throws ShapeError if parents does not hold batch() entries; Error if one is outside
  ///         [0, batch()) (nothing changes).
  void reorder(std::span<const index_t> parents);

  /// Checks that this cache was built for `config` and `batch` and has room for `tokens` more
  /// positions. @throws ShapeError naming `op` and what differs (nothing changes).
  void check_step(std::string_view op, const TransformerConfig& config, index_t batch,
                  index_t tokens) const;

  /// Writes layer `layer`'s k and v of T new positions, [B, H_kv, T, d_k], after length(); the
  /// length does not move until advance(). @throws ShapeError if the shapes differ or there is
  /// no room; Error if layer is out of range (nothing written).
  template <TensorLike K, TensorLike V>
  void write(index_t layer, const K& k, const V& v);

  /// Checks that `tokens` more positions fit: the room was allocated when the cache was built,
  /// so there is nothing to take (InferenceCache's reserve). @throws ShapeError if they do not.
  void reserve(index_t tokens) const { check_room("KVCache::reserve", tokens); }

  /// Layer `layer`'s attention for T new positions length() … length() + T − 1: writes their k
  /// and v [B, H_kv, T, d_k] (as write), then o [B, H, T, d_k] = causal softmax(scale·q·kᵀ)·v
  /// over positions [0, length() + T), each query reading only its last W with a window W (the
  /// band mask). length() does not move until advance(). @throws ShapeError if q, k, v or o do
  /// not fit or there is no room; Error if layer is out of range; ConfigError for a scale not
  /// finite and > 0 or a window ≤ 0 (nothing written on any of these).
  template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
  void attend(index_t layer, const Q& q, const K& k, const V& v, O&& o,
              std::optional<double> scale = std::nullopt,
              std::optional<index_t> window = std::nullopt);

  /// Moves length() on by `tokens` once every layer has been written.
  /// @throws ShapeError if that would pass the capacity (length unchanged).
  void advance(index_t tokens);
  /// advance(tokens.seq) for a step of B = batch() rows (InferenceCache; the ids are not kept).
  /// @throws ShapeError if tokens.batch is not batch(), or as advance(tokens.seq).
  void advance(TokenBatch tokens);

  /// Layer `layer`'s keys and values at positions [0, positions), as attention reads them.
  HeadMatrices<const Scalar> keys(index_t layer, index_t positions) const {
    return heads(keys_, layer, positions);
  }
  HeadMatrices<const Scalar> values(index_t layer, index_t positions) const {
    return heads(values_, layer, positions);
  }

 private:
  void check_layer(std::string_view op, index_t layer) const;
  void check_room(std::string_view op, index_t tokens) const;
  /// write's checks of layer, k and v [B, H_kv, T, d_k] and room, naming `op`.
  void check_write(std::string_view op, index_t layer, const ConstTensorView<Scalar, 4>& k,
                   const ConstTensorView<Scalar, 4>& v) const;
  /// Copies k and v (checked) after length() in layer `layer`.
  void store(index_t layer, const ConstTensorView<Scalar, 4>& k,
             const ConstTensorView<Scalar, 4>& v);
  HeadMatrices<const Scalar> heads(const Tensor<Scalar, 5>& store, index_t layer,
                                   index_t positions) const;

  Tensor<Scalar, 5> keys_;    // [L, B, H_kv, capacity, d_k]
  Tensor<Scalar, 5> values_;  // [L, B, H_kv, capacity, d_k]
  index_t length_ = 0;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
inline Shape<5> kv_cache_shape(const TransformerConfig& config, index_t batch,
                               std::optional<index_t> capacity) {
  config.validate();
  const index_t positions =
      require_positive("KVCache", "capacity", capacity.value_or(config.context));
  return {config.n_layers, require_positive("KVCache", "batch", batch), config.kv_heads(),
          positions, config.head_size()};
}
}  // namespace detail

template <class Scalar>
KVCache<Scalar>::KVCache(const TransformerConfig& config, index_t batch,
                         std::optional<index_t> capacity)
    : keys_(detail::kv_cache_shape(config, batch, capacity)), values_(keys_.shape()) {}

template <class Scalar>
void KVCache<Scalar>::check_layer(std::string_view op, index_t layer) const {
  if (layer < 0 || layer >= n_layers()) {
    throw Error(detail::concat(op, ": layer ", layer, " is out of range [0, ", n_layers(), ")"));
  }
}

template <class Scalar>
void KVCache<Scalar>::check_room(std::string_view op, index_t tokens) const {
  if (tokens < 0 || tokens > remaining()) {
    throw ShapeError(detail::concat(op, ": ", tokens, " new positions do not fit the KV cache (",
                                    length_, " of ", capacity(), " positions used)"));
  }
}

template <class Scalar>
void KVCache<Scalar>::check_step(std::string_view op, const TransformerConfig& config,
                                 index_t batch, index_t tokens) const {
  const Shape<5> wanted{config.n_layers, batch, config.kv_heads(), capacity(), config.head_size()};
  if (wanted != keys_.shape()) {
    throw ShapeError(detail::concat(
        op, ": the KV cache was built for [L, B, H_kv, capacity, d_k] = ",
        format_shape(keys_.shape()), ", this model and batch need ", format_shape(wanted)));
  }
  check_room(op, tokens);
}

template <class Scalar>
index_t KVCache<Scalar>::position(index_t row) const {
  if (row < 0 || row >= batch()) {
    throw Error(detail::concat("KVCache::position: row ", row, " is outside [0, ", batch(), ")"));
  }
  return length_;
}

template <class Scalar>
void KVCache<Scalar>::check_write(std::string_view op, index_t layer,
                                  const ConstTensorView<Scalar, 4>& k,
                                  const ConstTensorView<Scalar, 4>& v) const {
  check_layer(op, layer);
  const Shape<4> expected{batch(), n_kv_heads(), k.dim(2), head_dim()};
  for (const auto* tensor : {&k, &v}) {
    if (tensor->shape() != expected) {
      throw ShapeError(detail::concat(op, ": ", tensor == &k ? "k" : "v",
                                      " must be [B, H_kv, T, d_k] = ", format_shape(expected),
                                      ", got ", format_shape(tensor->shape())));
    }
  }
  check_room(op, k.dim(2));
}

template <class Scalar>
template <TensorLike K, TensorLike V>
void KVCache<Scalar>::write(index_t layer, const K& k, const V& v) {
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  static_assert(rank_of<K> == 4 && rank_of<V> == 4,
                "KVCache::write: k and v are [B, H_kv, T, d_k]");
  const auto kv = const_view(k), vv = const_view(v);
  check_write("KVCache::write", layer, kv, vv);
  store(layer, kv, vv);
}

template <class Scalar>
template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
void KVCache<Scalar>::attend(index_t layer, const Q& q, const K& k, const V& v, O&& o,
                             std::optional<double> scale, std::optional<index_t> window) {
  require_layer_scalar<Scalar, Q>();
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  require_layer_scalar<Scalar, O>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4 && rank_of<O> == 4,
                "KVCache::attend: q, k, v and o are [B, heads, T, d_k]");
  constexpr std::string_view op = "KVCache::attend";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  const auto out = writable_view(o);
  check_write(op, layer, kv, vv);
  detail::check_attention_inputs(op, qv, kv, vv);  // q's B, H (a multiple of H_kv), d_k
  if (qv.dim(2) != kv.dim(2)) {
    throw ShapeError(detail::concat(op, ": q must hold k's T = ", kv.dim(2), " positions, got ",
                                    format_shape(qv.shape())));
  }
  detail::check_attention_output(op, "o", out.shape(), qv);
  if (out.overlaps(qv) || out.overlaps(kv) || out.overlaps(vv)) {
    throw ShapeError(detail::concat(op, ": o must not share memory with q, k or v"));
  }
  const index_t held = length_ + kv.dim(2);
  // The kernel checks both again, after the write: a refused step must change nothing.
  (void)detail::score_scale<Scalar>(op, scale, head_dim());
  (void)detail::effective_window(op, window, held);
  store(layer, kv, vv);
  causal_attention_heads_into<Scalar>(heads_of(qv), keys(layer, held), values(layer, held),
                                      heads_of(out), batch(), scale, window);
}

template <class Scalar>
void KVCache<Scalar>::store(index_t layer, const ConstTensorView<Scalar, 4>& kv,
                            const ConstTensorView<Scalar, 4>& vv) {
  const index_t tokens = kv.dim(2), row = head_dim();
  for (Tensor<Scalar, 5>* buffer : {&keys_, &values_}) {
    const Scalar* source = buffer == &keys_ ? kv.data() : vv.data();
    for (index_t b = 0; b < batch(); ++b) {
      for (index_t h = 0; h < n_kv_heads(); ++h, source += tokens * row) {
        std::copy_n(source, tokens * row, &(*buffer)(layer, b, h, length_, index_t{0}));
      }
    }
  }
}

template <class Scalar>
void KVCache<Scalar>::advance(index_t tokens) {
  check_room("KVCache::advance", tokens);
  length_ += tokens;
}

template <class Scalar>
void KVCache<Scalar>::advance(TokenBatch tokens) {
  if (tokens.batch != batch()) {
    throw ShapeError(detail::concat("KVCache::advance: a step of B = ", tokens.batch,
                                    " rows for a cache of batch ", batch()));
  }
  advance(tokens.seq);
}

template <class Scalar>
void KVCache<Scalar>::truncate(index_t length) {
  if (length < 0 || length > length_) {
    throw ShapeError(detail::concat("KVCache::truncate: cannot keep ", length,
                                    " positions of a cache holding ", length_, " (capacity ",
                                    capacity(), ")"));
  }
  length_ = length;
}

template <class Scalar>
void KVCache<Scalar>::reorder(std::span<const index_t> parents) {
  constexpr std::string_view op = "KVCache::reorder";
  if (static_cast<index_t>(parents.size()) != batch()) {
    throw ShapeError(
        detail::concat(op, ": ", parents.size(), " parent rows for a cache of batch ", batch()));
  }
  for (std::size_t b = 0; b < parents.size(); ++b) {
    if (parents[b] < 0 || parents[b] >= batch()) {
      throw Error(detail::concat(op, ": parent ", parents[b], " of row ", b, " is outside [0, ",
                                 batch(), ")"));
    }
  }
  // Only the held positions move; each (layer, row, head) keeps its `length_` rows of d_k
  // values at the start of its capacity-long slot.
  const index_t heads_per_row = n_kv_heads(), slot = capacity() * head_dim(),
                held = length_ * head_dim();
  std::vector<Scalar> scratch(static_cast<std::size_t>(batch() * heads_per_row * held));
  for (Tensor<Scalar, 5>* store : {&keys_, &values_}) {
    for (index_t layer = 0; layer < n_layers(); ++layer) {
      Scalar* base = store->data() + layer * batch() * heads_per_row * slot;
      Scalar* out = scratch.data();
      for (index_t b = 0; b < batch(); ++b) {
        for (index_t h = 0; h < heads_per_row; ++h, out += held) {
          std::copy_n(base + (parents[static_cast<std::size_t>(b)] * heads_per_row + h) * slot,
                      held, out);
        }
      }
      const Scalar* in = scratch.data();
      for (index_t b = 0; b < batch(); ++b) {
        for (index_t h = 0; h < heads_per_row; ++h, in += held) {
          std::copy_n(in, held, base + (b * heads_per_row + h) * slot);
        }
      }
    }
  }
}

template <class Scalar>
HeadMatrices<const Scalar> KVCache<Scalar>::heads(const Tensor<Scalar, 5>& store, index_t layer,
                                                  index_t positions) const {
  check_layer("KVCache", layer);
  if (positions < 0 || positions > capacity()) {
    throw ShapeError(
        detail::concat("KVCache: ", positions, " positions asked of a cache of ", capacity()));
  }
  // Head (b, h) of this layer starts capacity·d_k values after head (b, h − 1).
  return {store.data() + layer * batch() * n_kv_heads() * capacity() * head_dim(), n_kv_heads(),
          positions, head_dim(), capacity() * head_dim()};
}

static_assert(TruncatableCache<KVCache<float>> && ReorderableCache<KVCache<float>>);
static_assert(TruncatableCache<KVCache<double>> && ReorderableCache<KVCache<double>>);

}  // namespace dissect
