// dissect/attention/rolling_kv_cache.hpp — a KV cache for sliding-window attention that keeps only
// the last W positions of every layer, so decoding past the window needs no more memory.
//
// With a window W (TransformerConfig::sliding_window, Mistral's) the query at position p reads
// keys p − W < j ≤ p only, so a key older than the last W positions is never read again. Each
// layer's K and V live in a ring of W slots, [L, B, H_kv, W, d_k], allocated once: position j
// sits in slot j mod W. bytes() is 2·L·B·W·H_kv·d_k·sizeof(Scalar) whatever the length, where a
// KVCache of the context holds the context's positions.
//
// A decoding step (T = 1) writes its k and v over the oldest slot and attends to the ring as it
// is: every held key is inside the new query's window and softmax·v does not depend on the keys'
// order, so no mask and no copy is needed (only the summation order differs from the full path).
// A step of T > 1 positions (a prompt) gathers the W − 1 held positions before it and its own into
// one scratch in position order, attends with the band mask there, then keeps its last W. It is
// an InferenceCache (kv_cache_concept.hpp): a decoder's one cached forward runs over it.
#pragma once

#include <algorithm>
#include <optional>
#include <string_view>
#include <tuple>
#include <utility>

#include "dissect/accounting/config.hpp"
#include "dissect/attention/attention.hpp"
#include "dissect/attention/kv_cache_concept.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/core/token_batch.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

template <class Scalar>
class RollingKVCache {
 public:
  using scalar_type = Scalar;

  /// A ring of config.sliding_window positions in each of the config's layers, for `batch`
  /// sequences, zero-filled.
  /// @throws ConfigError if the config is invalid, has no sliding_window, or batch ≤ 0;
  ///         OverflowError if the size leaves int64.
  RollingKVCache(const TransformerConfig& config, index_t batch);

  index_t n_layers() const { return keys_.dim(0); }
  index_t batch() const { return keys_.dim(1); }
  index_t n_kv_heads() const { return keys_.dim(2); }
  /// W: the ring's slots, the positions held at most.
  index_t window() const { return keys_.dim(3); }
  index_t head_dim() const { return keys_.dim(4); }
  /// Positions seen so far (the next step starts at this position), the same in every layer.
  index_t length() const { return length_; }
  /// Positions held: min(length(), W).
  index_t held() const { return std::min(length_, window()); }
  /// Where row `row`'s next position goes: length(), the same for every row (InferenceCache).
  /// @throws Error if row is outside [0, batch()).
  index_t position(index_t row) const;

  /// Bytes of the rings: 2 · L · B · W · H_kv · d_k · sizeof(Scalar), constant while decoding. (A
  /// step of T > 1 positions also uses a scratch of W − 1 + T positions per K and V.)
  index_t bytes() const { return 2 * keys_.size() * static_cast<index_t>(sizeof(Scalar)); }

  /// Forgets every position (the memory stays, for the next sequence).
  void clear() { length_ = 0; }

  /// Checks that this cache was built for `config` (its layers, KV heads, d_k and window) and
  /// `batch`, and that `tokens` ≥ 0. @throws ShapeError naming `op` and what differs.
  void check_step(std::string_view op, const TransformerConfig& config, index_t batch,
                  index_t tokens) const;

  /// Checks tokens ≥ 0: the ring is allocated when the cache is built and a step overwrites its
  /// oldest slots, so there is nothing to take (InferenceCache's reserve).
  /// @throws ShapeError if tokens < 0.
  void reserve(index_t tokens) const;

  /// Layer `layer`'s attention for T new positions length() … length() + T − 1: q [B, H, T, d_k],
  /// their k and v [B, H_kv, T, d_k] → o [B, H, T, d_k] = softmax(scale·q·kᵀ over the band)·v,
  /// keys from this step and the ring; the new k and v then replace the oldest slots. length()
  /// does not move until advance(). @throws ShapeError if a shape does not fit (nothing
  /// written); Error if layer is out of range; ConfigError for a scale not finite and > 0.
  template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
  void attend(index_t layer, const Q& q, const K& k, const V& v, O&& o,
              std::optional<double> scale = std::nullopt);
  /// As attend(layer, q, k, v, o, scale) for an attention whose window is `window`, which must be
  /// the ring's W (InferenceCache's attend, to which a layer passes its own window).
  /// @throws ShapeError if window is not W (unset: none), before anything is written; as attend.
  template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
  void attend(index_t layer, const Q& q, const K& k, const V& v, O&& o, std::optional<double> scale,
              std::optional<index_t> window);

  /// Moves length() on by `tokens` once every layer has attended.
  /// @throws ShapeError if tokens < 0.
  void advance(index_t tokens);
  /// advance(tokens.seq) for a step of B = batch() rows (InferenceCache; the ids are not kept).
  /// @throws ShapeError if tokens.batch is not batch(), or as advance(tokens.seq).
  void advance(TokenBatch tokens);

 private:
  void check_layer(std::string_view op, index_t layer) const;
  /// Layer `layer`'s ring heads, the first `rows` slots.
  HeadMatrices<const Scalar> ring(const Tensor<Scalar, 5>& store, index_t layer,
                                  index_t rows) const {
    return {store.data() + layer * batch() * n_kv_heads() * window() * head_dim(), n_kv_heads(),
            rows, head_dim(), window() * head_dim()};
  }
  Scalar* slot(Tensor<Scalar, 5>& store, index_t layer, index_t b, index_t h, index_t position) {
    return &store(layer, b, h, position % window(), index_t{0});
  }

  Tensor<Scalar, 5> keys_;                             // [L, B, H_kv, W, d_k]
  Tensor<Scalar, 5> values_;                           // [L, B, H_kv, W, d_k]
  Tensor<Scalar, 4> gathered_keys_, gathered_values_;  // a prompt step's scratch, reused
  index_t length_ = 0;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
inline Shape<5> rolling_cache_shape(const TransformerConfig& config, index_t batch) {
  config.validate();
  if (!config.sliding_window) {
    throw ConfigError(
        "RollingKVCache: config.sliding_window is unset; a model without a window reads every "
        "position (use KVCache)");
  }
  return {config.n_layers, require_positive("RollingKVCache", "batch", batch), config.kv_heads(),
          *config.sliding_window, config.head_size()};
}
}  // namespace detail

template <class Scalar>
RollingKVCache<Scalar>::RollingKVCache(const TransformerConfig& config, index_t batch)
    : keys_(detail::rolling_cache_shape(config, batch)), values_(keys_.shape()) {}

template <class Scalar>
void RollingKVCache<Scalar>::check_layer(std::string_view op, index_t layer) const {
  if (layer < 0 || layer >= n_layers()) {
    throw Error(detail::concat(op, ": layer ", layer, " is out of range [0, ", n_layers(), ")"));
  }
}

template <class Scalar>
index_t RollingKVCache<Scalar>::position(index_t row) const {
  if (row < 0 || row >= batch()) {
    throw Error(
        detail::concat("RollingKVCache::position: row ", row, " is outside [0, ", batch(), ")"));
  }
  return length_;
}

template <class Scalar>
void RollingKVCache<Scalar>::reserve(index_t tokens) const {
  if (tokens < 0) {
    throw ShapeError(
        detail::concat("RollingKVCache::reserve: ", tokens, " new positions (need >= 0)"));
  }
}

template <class Scalar>
template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
void RollingKVCache<Scalar>::attend(index_t layer, const Q& q, const K& k, const V& v, O&& o,
                                    std::optional<double> scale, std::optional<index_t> window) {
  if (window.value_or(0) != this->window()) {
    throw ShapeError(detail::concat("RollingKVCache::attend: the ring holds W = ", this->window(),
                                    " positions, the attention's window is ", window.value_or(0),
                                    " (0: none)"));
  }
  attend(layer, q, k, v, std::forward<O>(o), scale);
}

template <class Scalar>
void RollingKVCache<Scalar>::check_step(std::string_view op, const TransformerConfig& config,
                                        index_t batch, index_t tokens) const {
  const Shape<5> wanted{config.n_layers, batch, config.kv_heads(),
                        config.sliding_window.value_or(0), config.head_size()};
  if (wanted != keys_.shape()) {
    throw ShapeError(detail::concat(
        op, ": the rolling KV cache was built for [L, B, H_kv, W, d_k] = ",
        format_shape(keys_.shape()), ", this model and batch need ", format_shape(wanted),
        config.sliding_window ? "" : " (the config has no sliding_window)"));
  }
  if (tokens < 0) {
    throw ShapeError(detail::concat(op, ": ", tokens, " new positions (need >= 0)"));
  }
}

template <class Scalar>
template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
void RollingKVCache<Scalar>::attend(index_t layer, const Q& q, const K& k, const V& v, O&& o,
                                    std::optional<double> scale) {
  require_layer_scalar<Scalar, Q>();
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  require_layer_scalar<Scalar, O>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4 && rank_of<O> == 4,
                "RollingKVCache::attend: q, k, v and o are [B, heads, T, d_k]");
  constexpr std::string_view op = "RollingKVCache::attend";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  const auto out = writable_view(o);
  check_layer(op, layer);
  const index_t tokens = kv.dim(2), row = head_dim();
  const Shape<4> expected{batch(), n_kv_heads(), tokens, row};
  for (const auto* tensor : {&kv, &vv}) {
    if (tensor->shape() != expected) {
      throw ShapeError(detail::concat(op, ": ", tensor == &kv ? "k" : "v",
                                      " must be [B, H_kv, T, d_k] = ", format_shape(expected),
                                      ", got ", format_shape(tensor->shape())));
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
  const Scalar s = detail::score_scale<Scalar>(op, scale, row);
  if (tokens == 0) return;
  const index_t W = window(), start = length_;
  if (tokens == 1) {
    // Decoding: the new position overwrites the one W before it, which its query no longer
    // reads; the ring then holds exactly the query's window (or every position, before W).
    for (auto [store, source] : {std::pair{&keys_, kv.data()}, std::pair{&values_, vv.data()}}) {
      for (index_t b = 0; b < batch(); ++b) {
        for (index_t h = 0; h < n_kv_heads(); ++h, source += row) {
          std::copy_n(source, row, slot(*store, layer, b, h, start));
        }
      }
    }
    const index_t rows = std::min(start + 1, W);
    // One query that sees all `rows` keys (offset rows − 1): no band needed inside the ring.
    detail::online_causal_attention<Scalar>(heads_of(qv), ring(keys_, layer, rows),
                                            ring(values_, layer, rows), heads_of(out), batch(), s);
    return;
  }
  // A prompt step: the held positions its first query still reads (the last W − 1), then its own,
  // in position order, attended with the band mask.
  const index_t old = std::min(start, W - 1), rows = old + tokens;
  const Shape<4> gathered{batch(), n_kv_heads(), rows, row};
  auto gk = reuse_buffer(gathered_keys_, gathered);
  auto gv = reuse_buffer(gathered_values_, gathered);
  for (auto [store, from, to] :
       {std::tuple{&keys_, kv.data(), gk.data()}, std::tuple{&values_, vv.data(), gv.data()}}) {
    for (index_t b = 0; b < batch(); ++b) {
      for (index_t h = 0; h < n_kv_heads(); ++h) {
        for (index_t i = 0; i < old; ++i, to += row) {
          std::copy_n(slot(*store, layer, b, h, start - old + i), row, to);
        }
        to = std::copy_n(from, tokens * row, to);
        from += tokens * row;
      }
    }
  }
  detail::online_causal_attention<Scalar>(heads_of(qv), heads_of(ConstTensorView<Scalar, 4>(gk)),
                                          heads_of(ConstTensorView<Scalar, 4>(gv)), heads_of(out),
                                          batch(), s, W);
  // Only the step's last W positions can be read again.
  const index_t kept = std::min(tokens, W);
  for (auto [store, source] : {std::pair{&keys_, kv.data()}, std::pair{&values_, vv.data()}}) {
    for (index_t b = 0; b < batch(); ++b) {
      for (index_t h = 0; h < n_kv_heads(); ++h, source += tokens * row) {
        for (index_t i = tokens - kept; i < tokens; ++i) {
          std::copy_n(source + i * row, row, slot(*store, layer, b, h, start + i));
        }
      }
    }
  }
}

template <class Scalar>
void RollingKVCache<Scalar>::advance(index_t tokens) {
  if (tokens < 0) {
    throw ShapeError(
        detail::concat("RollingKVCache::advance: ", tokens, " new positions (need >= 0)"));
  }
  length_ = checked_add(length_, tokens, "RollingKVCache::advance");
}

template <class Scalar>
void RollingKVCache<Scalar>::advance(TokenBatch tokens) {
  if (tokens.batch != batch()) {
    throw ShapeError(detail::concat("RollingKVCache::advance: a step of B = ", tokens.batch,
                                    " rows for a cache of batch ", batch()));
  }
  advance(tokens.seq);
}

static_assert(InferenceCache<RollingKVCache<float>> && InferenceCache<RollingKVCache<double>>);

}  // namespace dissect
