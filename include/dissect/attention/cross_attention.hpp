// dissect/attention/cross_attention.hpp — cross-attention, o = softmax(s·q·kᵀ + padding mask)·v,
// with the queries from one sequence (a decoder's, T positions) and the keys and values from
// another (an encoder's output, S positions): no causal mask, S and T unrelated, grouped-query
// heads as in causal_attention (query head h reads key/value head h / (H / H_kv)).
//
// Padding: a batch of memories of different lengths is padded to one S; KeyPaddingMask says, per
// batch element, which memory positions are padding (PyTorch's key_padding_mask, true = ignore).
// A padded key gets probability exactly 0. A query whose memory is all padding has nothing to
// attend to: dissect defines its output as 0 and its gradients as 0 (PyTorch's softmax over
// −inf gives NaN there; FlashAttention's kernels give 0, as here). Padded keys and values still
// meet their weight 0 in P·v and in backward's dS·k, so NaN or ±Inf stored in the padding gives
// NaN (0·NaN), as in PyTorch; finite values there change nothing.
//
// Memory: cross_attention(q, k, v, mask) for inference works on one [query_block, S] score tile
// per thread, never [T, S]; the training overload keeps P [B, H, T, S] for backward, as
// causal_attention's does.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/attention/attention.hpp"
#include "dissect/attention/qkv.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Which memory positions are padding, per batch element: [B, S], true = padding (ignored), as
/// PyTorch's key_padding_mask. Default-constructed: no mask (every position is attended).
class KeyPaddingMask {
 public:
  KeyPaddingMask() = default;
  /// `padding` holds B·S flags, row-major [B, S]: 1 = padding, 0 = a real position.
  /// @throws ShapeError if batch or keys < 0 or padding.size() ≠ B·S; Error naming the index if a
  ///         flag is neither 0 nor 1.
  KeyPaddingMask(index_t batch, index_t keys, std::vector<std::uint8_t> padding);
  /// Memory b holds lengths[b] real positions, then padding up to `keys`.
  /// @throws ShapeError if keys < 0 or a length is outside [0, keys].
  static KeyPaddingMask from_lengths(std::span<const index_t> lengths, index_t keys);

  bool has_value() const { return present_; }
  index_t batch() const { return batch_; }
  index_t keys() const { return keys_; }
  bool padded(index_t b, index_t j) const {
    return padding_[static_cast<std::size_t>(b * keys_ + j)];
  }

 private:
  bool present_ = false;
  index_t batch_ = 0, keys_ = 0;
  std::vector<std::uint8_t> padding_;
};

/// What training's cross-attention keeps for backward; reusable across steps of one shape.
template <class Scalar>
struct CrossAttentionCache {
  Tensor<Scalar, 4> probs;  ///< P [B, H, T, S]: 0 at padded keys, a whole row 0 if all padded
  std::optional<double> scale = std::nullopt;  ///< the forward's score scale (unset: 1/√d_k)
};

/// q: [B, H, T, d_k], k, v: [B, H_kv, S, d_k], mask [B, S] or none → o: [B, H, T, d_k], with
/// o = softmax(s·q·kᵀ over the unpadded keys)·v; a query whose keys are all padding gets o = 0.
/// `scale` unset → 1/√d_k. Threads: with OpenMP, the B·H heads are shared among the team.
/// @throws ShapeError naming the operation and the shapes if the ranks, B or d_k differ, v ≠ k,
///         H_kv does not divide H, S = 0, or the mask is not [B, S]; ConfigError for a scale that
///         is not finite and > 0.
template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> cross_attention(const Q& q, const K& k, const V& v,
                                        const KeyPaddingMask& mask = {},
                                        std::optional<double> scale = std::nullopt);

/// As cross_attention, keeping P and the scale in `cache` for backward.
template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> cross_attention(const Q& q, const K& k, const V& v,
                                        CrossAttentionCache<scalar_of<Q>>& cache,
                                        const KeyPaddingMask& mask = {},
                                        std::optional<double> scale = std::nullopt);

/// q, k, v and cache from cross_attention(q, k, v, cache, …), dout: [B, H, T, d_k] →
/// {dq [B, H, T, d_k], dk, dv [B, H_kv, S, d_k]}: per head dv = Pᵀ·dout, dP = dout·vᵀ,
/// dS = s·P ⊙ (dP − rowsum(dP ⊙ P)), dq = dS·k, dk = dSᵀ·q (summed over a group's query heads).
/// P = 0 at padded keys gives them dk = dv = 0; an all-padded query gets dq = 0.
/// @throws ShapeError if a shape does not fit q or the cache holds another shape; ConfigError for
///         a cached scale that is not finite and > 0.
template <TensorLike Q, TensorLike K, TensorLike V, TensorLike DO>
QKV<scalar_of<Q>> cross_attention_backward(const Q& q, const K& k, const V& v,
                                           const CrossAttentionCache<scalar_of<Q>>& cache,
                                           const DO& dout);

namespace detail {

/// The checks of every cross-attention entry point: q [B, H, T, d_k], k and v [B, H_kv, S, d_k]
/// with H_kv | H and S ≥ 1, and a mask that is none or [B, S].
template <class Scalar>
void check_cross_attention_inputs(std::string_view op, const ConstTensorView<Scalar, 4>& q,
                                  const ConstTensorView<Scalar, 4>& k,
                                  const ConstTensorView<Scalar, 4>& v, const KeyPaddingMask& mask) {
  const auto shapes = concat(" (q ", format_shape(q.shape()), ", k ", format_shape(k.shape()),
                             ", v ", format_shape(v.shape()), ")");
  if (k.dim(0) != q.dim(0) || k.dim(3) != q.dim(3)) {
    throw ShapeError(
        concat(op, ": k must be [B=", q.dim(0), ", H_kv, S, d_k=", q.dim(3), "]", shapes));
  }
  if (v.shape() != k.shape()) throw ShapeError(concat(op, ": v must have k's shape", shapes));
  if (k.dim(1) <= 0 || q.dim(1) % k.dim(1) != 0) {
    throw ShapeError(concat(op, ": k's heads (axis 1) = ", k.dim(1),
                            " must divide q's heads H = ", q.dim(1), shapes));
  }
  if (k.dim(2) == 0) {
    throw ShapeError(
        concat(op, ": the memory holds S = 0 positions: there is nothing to attend to", shapes));
  }
  if (mask.has_value() && (mask.batch() != q.dim(0) || mask.keys() != k.dim(2))) {
    throw ShapeError(concat(op, ": the key padding mask must be [B=", q.dim(0), ", S=", k.dim(2),
                            "], got [", mask.batch(), ", ", mask.keys(), "]", shapes));
  }
}

/// One block of score rows → probabilities in place: row r of `tile` holds s·q_r·kᵀ over the S
/// keys of batch element b; padded keys get 0, the others softmax; a row with no unpadded key
/// becomes all 0 (the defined output of a fully padded memory).
template <class Scalar, class Tile>
void masked_softmax_rows(Tile& tile, const KeyPaddingMask& mask, index_t b) {
  constexpr Scalar minus_inf = -std::numeric_limits<Scalar>::infinity();
  const index_t keys = tile.cols();
  // No rows (T = 0): nothing to do, and a column of a zero-row map is an offset from null.
  if (tile.rows() == 0) return;
  if (mask.has_value()) {
    for (index_t j = 0; j < keys; ++j) {
      if (mask.padded(b, j)) tile.col(j).setConstant(minus_inf);
    }
  }
  for (index_t r = 0; r < tile.rows(); ++r) {
    auto row = tile.row(r);
    const Scalar top = row.maxCoeff();
    if (top == minus_inf) {  // every key padded: exp(−inf − (−inf)) would be NaN
      row.setZero();
      continue;
    }
    row = (row.array() - top).exp().matrix();
  }
  // Eigen's vectorised float exp returns a denormal (~1e-39), not 0, for −inf: the padded keys
  // are set to exactly 0 before the rows are normalised, so they hold no weight at all.
  if (mask.has_value()) {
    for (index_t j = 0; j < keys; ++j) {
      if (mask.padded(b, j)) tile.col(j).setZero();
    }
  }
  for (index_t r = 0; r < tile.rows(); ++r) {
    const Scalar sum = tile.row(r).sum();
    if (sum > 0) tile.row(r) /= sum;  // 0 only for an all-padded row, left 0
  }
}

}  // namespace detail

// ---- implementation -----------------------------------------------------------------------------

inline KeyPaddingMask::KeyPaddingMask(index_t batch, index_t keys,
                                      std::vector<std::uint8_t> padding)
    : present_(true), batch_(batch), keys_(keys), padding_(std::move(padding)) {
  constexpr std::string_view op = "KeyPaddingMask";
  if (batch < 0 || keys < 0) {
    throw ShapeError(concat(op, ": [B, S] = [", batch, ", ", keys, "] must not be negative"));
  }
  const index_t count = checked_mul(batch, keys, op);
  if (static_cast<index_t>(padding_.size()) != count) {
    throw ShapeError(concat(op, ": ", padding_.size(), " flags for [B, S] = [", batch, ", ", keys,
                            "] (", count, " positions)"));
  }
  for (std::size_t i = 0; i < padding_.size(); ++i) {
    if (padding_[i] > 1) {
      throw Error(concat(op, ": padding[", i, "] = ", int(padding_[i]),
                         " is neither 0 (a position) nor 1 (padding)"));
    }
  }
}

inline KeyPaddingMask KeyPaddingMask::from_lengths(std::span<const index_t> lengths, index_t keys) {
  constexpr std::string_view op = "KeyPaddingMask::from_lengths";
  if (keys < 0) throw ShapeError(concat(op, ": S = ", keys, " must not be negative"));
  const auto batch = static_cast<index_t>(lengths.size());
  std::vector<std::uint8_t> padding(static_cast<std::size_t>(checked_mul(batch, keys, op)));
  for (index_t b = 0; b < batch; ++b) {
    const index_t length = lengths[static_cast<std::size_t>(b)];
    if (length < 0 || length > keys) {
      throw ShapeError(
          concat(op, ": length ", length, " of memory ", b, " is outside [0, S = ", keys, "]"));
    }
    std::fill(padding.begin() + b * keys + length, padding.begin() + (b + 1) * keys, 1);
  }
  return KeyPaddingMask(batch, keys, std::move(padding));
}

template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> cross_attention(const Q& q, const K& k, const V& v,
                                        const KeyPaddingMask& mask, std::optional<double> scale) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4,
                "dissect::cross_attention: q, k and v are [B, heads, positions, d_k]");
  constexpr std::string_view op = "cross_attention";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  detail::check_cross_attention_inputs(op, qv, kv, vv, mask);
  const Scalar s = detail::score_scale<Scalar>(op, scale, qv.dim(3));
  auto out = Tensor<Scalar, 4>::uninitialized(qv.shape());
  const index_t batch = qv.dim(0), heads = qv.dim(1), tokens = qv.dim(2), keys = kv.dim(2);
  const index_t group = heads / kv.dim(1), pairs = batch * heads;
  if (out.empty()) return out;
  const auto qh = heads_of(qv), kh = heads_of(kv), vh = heads_of(vv);
  const auto oh = heads_of(out.view());
  constexpr index_t block = detail::attention_query_block;
#ifdef _OPENMP
#pragma omp parallel if (pairs > 1 && !omp_in_parallel())
#endif
  {
    // One [block, S] score tile per thread, allocated once per call: O(S) per query, never
    // [T, S] (S is an encoder's length, which a decoder's T may exceed or not).
    RowMatrix<Scalar> scores(std::min(block, tokens), keys);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (index_t pair = 0; pair < pairs; ++pair) {
      const index_t b = pair / heads, h = pair % heads;
      const auto q_head = qh.head(b, h);
      const auto k_head = kh.head(b, h / group), v_head = vh.head(b, h / group);
      auto o_head = oh.head(b, h);
      for (index_t i0 = 0; i0 < tokens; i0 += block) {
        const index_t rows = std::min(block, tokens - i0);
        auto tile = scores.topRows(rows);
        tile.noalias() = q_head.middleRows(i0, rows) * k_head.transpose();
        tile *= s;
        detail::masked_softmax_rows<Scalar>(tile, mask, b);
        o_head.middleRows(i0, rows).noalias() = tile * v_head;
      }
    }
  }
  return out;
}

template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> cross_attention(const Q& q, const K& k, const V& v,
                                        CrossAttentionCache<scalar_of<Q>>& cache,
                                        const KeyPaddingMask& mask, std::optional<double> scale) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4,
                "dissect::cross_attention: q, k and v are [B, heads, positions, d_k]");
  constexpr std::string_view op = "cross_attention";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  detail::check_cross_attention_inputs(op, qv, kv, vv, mask);
  const Scalar s = detail::score_scale<Scalar>(op, scale, qv.dim(3));
  const index_t batch = qv.dim(0), heads = qv.dim(1), tokens = qv.dim(2), keys = kv.dim(2);
  const index_t group = heads / kv.dim(1), pairs = batch * heads;
  // Checked before the cache changes, so a refused call leaves it as it was.
  cache.scale = scale;
  auto probs = reuse_buffer(cache.probs, Shape<4>{batch, heads, tokens, keys});
  auto out = Tensor<Scalar, 4>::uninitialized(qv.shape());
  const auto qh = heads_of(qv), kh = heads_of(kv), vh = heads_of(vv);
  const auto oh = heads_of(out.view()), ph = heads_of(probs);
  if (out.empty()) return out;  // no queries (or no heads): the cache holds an empty P
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (pairs > 1 && !omp_in_parallel())
#endif
  for (index_t pair = 0; pair < pairs; ++pair) {
    const index_t b = pair / heads, h = pair % heads;
    auto p = ph.head(b, h);
    p.noalias() = qh.head(b, h) * kh.head(b, h / group).transpose();
    p *= s;
    detail::masked_softmax_rows<Scalar>(p, mask, b);
    oh.head(b, h).noalias() = p * vh.head(b, h / group);
  }
  return out;
}

template <TensorLike Q, TensorLike K, TensorLike V, TensorLike DO>
QKV<scalar_of<Q>> cross_attention_backward(const Q& q, const K& k, const V& v,
                                           const CrossAttentionCache<scalar_of<Q>>& cache,
                                           const DO& dout) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  require_layer_scalar<Scalar, DO>();
  constexpr std::string_view op = "cross_attention_backward";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  const auto dov = const_view(dout);
  detail::check_cross_attention_inputs(op, qv, kv, vv, KeyPaddingMask{});
  detail::check_attention_output(op, "dout", dov.shape(), qv);
  const index_t batch = qv.dim(0), heads = qv.dim(1), tokens = qv.dim(2), keys = kv.dim(2);
  const Shape<4> probs_shape{batch, heads, tokens, keys};
  if (cache.probs.shape() != probs_shape) {
    throw ShapeError(concat(op, ": cache.probs must be [B, H, T, S] = ", format_shape(probs_shape),
                            ", got ", format_shape(cache.probs.shape()),
                            " (fill the cache with cross_attention(q, k, v, cache))"));
  }
  const Scalar scale = detail::score_scale<Scalar>(op, cache.scale, qv.dim(3));
  // The softmax backward of causal attention, which reads its mask from P as this one does: a
  // padded key (or an all-padded row) has P = 0, so dS = 0 there.
  return detail::probabilities_backward<Scalar>(qv, kv, vv, cache.probs.cview(), dov, scale, 0);
}

}  // namespace dissect
