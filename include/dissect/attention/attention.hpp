// dissect/attention/attention.hpp — causal self-attention, o = softmax(s·q·kᵀ + causal mask)·v,
// with grouped-query attention: query head h reads key/value head h / (H / H_kv), as Hugging Face's
// repeat_kv does, but without materialising the repeated k and v.
//
// The score scale s is 1/√d_k unless the caller gives another (`scale`, finite and > 0): GPT-2
// checkpoints may turn the √d_k off or divide layer i's scores by i + 1 as well
// (TransformerConfig::score_scale gives a layer's s). Training's forward records s in its cache,
// so backward always differentiates the function forward computed.
//
// Positions: q holds the T newest positions, k and v all S ≥ T positions so far (a KV cache's
// earlier ones first), so query t sits at position S − T + t and attends to keys 0 … S − T + t.
// S = T is a plain causal forward; T = 1 is one decoding step.
//
// Sliding window (Mistral's `sliding_window`, optional `window` W ≥ 1): the query at position p
// attends only to keys j with p − W < j ≤ p, its own position and the W − 1 before it. That is
// transformers' convention for Mistral (masking_utils.py: sliding_window_causal_mask_function ands
// the causal kv_idx ≤ q_idx with sliding_window_overlay's kv_idx > q_idx − sliding_window). The
// inference path then walks only the key tiles that meet the band, and training's forward and
// backward only the band's block of each query block's rows: O(T·W) work instead of O(T·S). A
// W that excludes no key (W ≥ S) is the plain causal path, bit for bit.
//
// Memory:
// - causal_attention(q, k, v), for inference, never builds the [T, S] score matrix. It walks
//   the keys in blocks of key_block, keeping a running row maximum and sum (online softmax, as
//   FlashAttention does), so its scratch is one [query_block, key_block] tile, a
//   [query_block, d_k] accumulator and two rows of query_block: O(d_k) per query, whatever S.
// - causal_attention(q, k, v, cache), for training, keeps the probabilities P [B, H, T, S] in the
//   cache: B·H·T·S values, which backward needs (PyTorch's eager attention keeps the same).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "dissect/accounting/config.hpp"
#include "dissect/attention/qkv.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// What training's attention keeps for backward; reusable across steps of one shape.
template <class Scalar>
struct AttentionCache {
  Tensor<Scalar, 4> probs;  ///< P = softmax(s·q·kᵀ + mask): [B, H, T, S]
  /// The score scale s forward used (unset: 1/√d_k), which backward applies again.
  std::optional<double> scale = std::nullopt;
  /// The sliding window W forward used (unset: full causal), which backward walks again.
  std::optional<index_t> window = std::nullopt;
};

/// q: [B, H, T, d_k], k, v: [B, H_kv, S, d_k] with S ≥ T → o: [B, H, T, d_k], by online softmax.
/// `scale` multiplies the scores q·kᵀ; unset → 1/√d_k.
/// `window` W (unset: full causal) limits the query at position p to keys p − W < j ≤ p.
/// Threads: with OpenMP, the B·H heads are shared among the team (one scratch tile per thread).
/// @throws ShapeError naming the operation, the tensor and both shapes if the ranks, B, d_k or
///         the key/value shapes differ, H_kv does not divide H, or S < T; ConfigError
///         "causal_attention: scale must be finite and > 0 (got …)", "causal_attention: window
///         must be > 0 (got 0)".
template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> causal_attention(const Q& q, const K& k, const V& v,
                                         std::optional<double> scale = std::nullopt,
                                         std::optional<index_t> window = std::nullopt);

/// As causal_attention, into a caller's o: [B, H, T, d_k] (old values never read; it must not
/// overlap q, k or v). @throws as causal_attention, or ShapeError for o.
template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
void causal_attention_into(const Q& q, const K& k, const V& v, O&& o,
                           std::optional<double> scale = std::nullopt,
                           std::optional<index_t> window = std::nullopt);

/// As causal_attention, keeping the probabilities, the scale and the window in `cache` for
/// backward (outside the band P is exactly 0).
template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> causal_attention(const Q& q, const K& k, const V& v,
                                         AttentionCache<scalar_of<Q>>& cache,
                                         std::optional<double> scale = std::nullopt,
                                         std::optional<index_t> window = std::nullopt);

/// q, k, v and cache from causal_attention(q, k, v, cache, scale, window), dout: [B, H, T, d_k]
/// → {dq [B, H, T, d_k], dk, dv [B, H_kv, S, d_k]}. Per head, with P the cached probabilities and
/// s the cached scale (the forward's, so the two cannot disagree; so is the window, whose band
/// alone is walked):
///   dv = Pᵀ·dout,  dP = dout·vᵀ,  dS = s · P ⊙ (dP − rowsum(dP ⊙ P)),
///   dq = dS·k,  dk = dSᵀ·q   (dk, dv summed over the H / H_kv query heads of a group).
/// @throws ShapeError if a shape does not fit q, or the cache holds another shape; ConfigError
///         if the cache's scale is not finite and > 0.
template <TensorLike Q, TensorLike K, TensorLike V, TensorLike DO>
QKV<scalar_of<Q>> causal_attention_backward(const Q& q, const K& k, const V& v,
                                            const AttentionCache<scalar_of<Q>>& cache,
                                            const DO& dout);

/// The FLOPs of the two products, q·kᵀ and P·v, counted over the causal triangle only:
/// 4·B·H·d_k·Σ_t (S − T + t + 1); with a window W, over the band: 4·B·H·d_k·Σ_t min(W, S − T + t
/// + 1). @throws ShapeError for negative sizes or S < T; ConfigError for W ≤ 0.
index_t causal_attention_flops(index_t batch, index_t n_heads, index_t tokens, index_t keys,
                               index_t head_dim, std::optional<index_t> window = std::nullopt);

/// The heads of a [B, heads, rows, d_k] tensor whose head (b, h) starts head_stride values after
/// head (b, h − 1): a contiguous tensor (head_stride = rows·d_k) or the first `rows` positions
/// of a KV cache's [B, H_kv, capacity, d_k] buffer (head_stride = capacity·d_k).
template <class T>
struct HeadMatrices {
  T* data;
  index_t n_heads;
  index_t rows;
  index_t head_dim;
  index_t head_stride;

  auto head(index_t b, index_t h) const {
    using Plain = RowMatrix<std::remove_const_t<T>>;
    using Map = std::conditional_t<std::is_const_v<T>, Eigen::Map<const Plain>, Eigen::Map<Plain>>;
    return Map(data + (b * n_heads + h) * head_stride, rows, head_dim);
  }
};

/// The heads of a contiguous [B, heads, rows, d_k] tensor (const or writable).
template <class T>
HeadMatrices<T> heads_of(const TensorView<T, 4>& x) {
  return {x.data(), x.dim(1), x.dim(2), x.dim(3), x.dim(2) * x.dim(3)};
}

/// o = causal softmax(scale·q·kᵀ)·v (scale unset: 1/√d_k) on heads given as strided matrices:
/// the kernel behind causal_attention_into, for callers whose keys and values are not one
/// contiguous tensor (the first S positions of a KV cache, KVCache::keys / values). q and o: B·H
/// heads of T rows; k, v: B·H_kv heads of S ≥ T rows, the last T of them at the queries'
/// positions.
/// With a window W the query at position p reads keys p − W < j ≤ p only; rows of k and v must
/// then be in position order (a rolling cache's ring is read by RollingKVCache, which knows it).
/// @throws ShapeError naming the operand if the head counts, rows or d_k do not fit;
///         ConfigError for a scale that is not finite and > 0, or a window ≤ 0.
template <class Scalar>
void causal_attention_heads_into(HeadMatrices<const Scalar> q, HeadMatrices<const Scalar> k,
                                 HeadMatrices<const Scalar> v, HeadMatrices<Scalar> o,
                                 index_t batch, std::optional<double> scale = std::nullopt,
                                 std::optional<index_t> window = std::nullopt);

namespace detail {

/// Key tile and query tile of the online softmax: a 64×64 score tile (16 KB in float) stays in
/// L1 next to its k and v rows.
inline constexpr index_t attention_key_block = 64;
inline constexpr index_t attention_query_block = 64;

/// The score scale in Scalar: `scale` if given (checked finite and > 0), else 1/√d_k, computed
/// in double and rounded once, so every entry point scales alike.
/// @throws ConfigError "op: scale must be finite and > 0 (got …)".
template <class Scalar>
Scalar score_scale(std::string_view op, std::optional<double> scale, index_t head_dim) {
  if (scale) return static_cast<Scalar>(require_positive_finite(op, "scale", *scale));
  return static_cast<Scalar>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}

/// The band the kernels walk for a window over `keys` positions: W if it excludes some key,
/// 0 (full causal) if unset or W ≥ keys, when no query is old enough to lose a key: the plain
/// path then runs, bit for bit.
/// @throws ConfigError "op: window must be > 0 (got …)".
inline index_t effective_window(std::string_view op, std::optional<index_t> window, index_t keys) {
  if (!window) return 0;
  if (*window <= 0) {
    throw ConfigError(
        concat(op, ": window must be > 0 (got ", *window, "; unset means full causal attention)"));
  }
  return *window >= keys ? 0 : *window;
}

/// The first key query position `position` reads: position − W + 1 with a window W (0: none).
inline index_t first_visible_key(index_t position, index_t window) {
  return window > 0 ? std::max<index_t>(0, position - window + 1) : 0;
}

/// o = causal softmax(q·kᵀ·scale)·v for every (b, h), by online softmax over key blocks. Shapes
/// already checked: q has B·H heads of T rows, k and v B·H_kv heads of S ≥ T rows. `window` W > 0
/// keeps only keys p − W < j ≤ p for the query at position p (0: full causal).
template <class Scalar>
void online_causal_attention(HeadMatrices<const Scalar> q, HeadMatrices<const Scalar> k,
                             HeadMatrices<const Scalar> v, HeadMatrices<Scalar> o, index_t batch,
                             Scalar scale, index_t window = 0) {
  static_assert(attention_query_block <= attention_key_block,
                "every query row must see a key in its block's first key tile");
  const index_t heads = q.n_heads, group = q.n_heads / k.n_heads;
  const index_t tokens = q.rows, offset = k.rows - q.rows, d_k = q.head_dim;
  const index_t pairs = batch * heads;
  constexpr Scalar minus_inf = -std::numeric_limits<Scalar>::infinity();
#ifdef _OPENMP
#pragma omp parallel if (pairs > 1 && !omp_in_parallel())
#endif
  {
    // One scratch set per thread, allocated once per call, never per head or per block.
    RowMatrix<Scalar> scores(attention_query_block, attention_key_block);
    RowMatrix<Scalar> acc(attention_query_block, d_k), tile_values(attention_query_block, d_k);
    Eigen::Matrix<Scalar, Eigen::Dynamic, 1> row_max(attention_query_block),
        row_sum(attention_query_block);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (index_t pair = 0; pair < pairs; ++pair) {
      const index_t b = pair / heads, h = pair % heads;
      const auto q_head = q.head(b, h);
      const auto k_head = k.head(b, h / group);
      const auto v_head = v.head(b, h / group);
      auto o_head = o.head(b, h);
      for (index_t i0 = 0; i0 < tokens; i0 += attention_query_block) {
        const index_t rows = std::min(attention_query_block, tokens - i0);
        const index_t keys = offset + i0 + rows;  // the last query row sees keys [0, keys)
        // With a window no row of the block sees a key before its first row's band: the tiles
        // start there, so a block walks rows + W − 1 keys, not all before it.
        const index_t first = first_visible_key(offset + i0, window);
        row_max.head(rows).setConstant(minus_inf);
        row_sum.head(rows).setZero();
        acc.topRows(rows).setZero();
        for (index_t j0 = first; j0 < keys; j0 += attention_key_block) {
          const index_t cols = std::min(attention_key_block, keys - j0);
          auto tile = scores.topLeftCorner(rows, cols);
          // The two tile products on dissect's GEMM (q·kᵀ is a linear layer's x·Wᵀ, p·v the
          // input gradient's dy·W): Eigen's kernels, compiled for the build's baseline ISA, ran
          // these 64 × 64 × 64 products at ~1 GFLOP/s and took a third of a 128-token prefill.
          linear_forward<Scalar>(q_head.middleRows(i0, rows), k_head.middleRows(j0, cols),
                                 std::nullopt, tile);
          tile *= scale;
          for (index_t r = 0; r < rows; ++r) {
            const index_t position = offset + i0 + r;
            // Keys of this tile row r sees: up to its own position (clamped: an early row of a
            // block that follows a cache's positions may see none of a late tile) …
            const index_t visible = std::clamp<index_t>(position + 1 - j0, 0, cols);
            if (visible < cols) tile.row(r).tail(cols - visible).setConstant(minus_inf);
            // … and, with a window, none before position − W + 1.
            const index_t hidden =
                std::clamp<index_t>(first_visible_key(position, window) - j0, 0, cols);
            if (hidden > 0) tile.row(r).head(hidden).setConstant(minus_inf);
            // Row r's first key, first + r at the latest (or its own position, if earlier), lies
            // in the first tile (r < query block ≤ key block), so after that tile its maximum is
            // finite and a fully masked later tile leaves it alone: exp(−inf − max) = 0.
            const Scalar new_max = std::max(row_max[r], tile.row(r).maxCoeff());
            const Scalar correction = std::exp(row_max[r] - new_max);
            tile.row(r) = (tile.row(r).array() - new_max).exp().matrix();
            // Exactly 0 where masked: Eigen's vectorised exp returns a denormal for −inf (2.9e-39
            // in float on SSE2, 5.6e-309 in double), not the 0 the softmax's definition gives.
            if (visible < cols) tile.row(r).tail(cols - visible).setZero();
            if (hidden > 0) tile.row(r).head(hidden).setZero();
            row_sum[r] = row_sum[r] * correction + tile.row(r).sum();
            acc.row(r) *= correction;
            row_max[r] = new_max;
          }
          auto values = tile_values.topRows(rows);
          linear_backward_input<Scalar>(v_head.middleRows(j0, cols), tile, values);
          acc.topRows(rows) += values;
        }
        o_head.middleRows(i0, rows) =
            row_sum.head(rows).cwiseInverse().asDiagonal() * acc.topRows(rows);
      }
    }
  }
}

/// The checks every attention kind shares: q [B, H, T, d_k], k and v [B, H_kv, S, d_k] with
/// H_kv | H (causal, flash and cross-attention each add their own rule for S).
template <class Scalar>
void check_attention_heads(std::string_view op, const ConstTensorView<Scalar, 4>& q,
                           const ConstTensorView<Scalar, 4>& k,
                           const ConstTensorView<Scalar, 4>& v) {
  const auto q_text = format_shape(q.shape());
  if (k.dim(0) != q.dim(0) || k.dim(3) != q.dim(3)) {
    throw ShapeError(concat(op, ": k must be [B=", q.dim(0), ", H_kv, S, d_k=", q.dim(3),
                            "] for q ", q_text, ", got ", format_shape(k.shape())));
  }
  if (v.shape() != k.shape()) {
    throw ShapeError(concat(op, ": v must have k's shape ", format_shape(k.shape()), ", got ",
                            format_shape(v.shape())));
  }
  if (k.dim(1) <= 0 || q.dim(1) % k.dim(1) != 0) {
    throw ShapeError(concat(op, ": k's heads (axis 1) = ", k.dim(1), " must divide q's heads H = ",
                            q.dim(1), " (q ", q_text, ", k ", format_shape(k.shape()), ")"));
  }
}

/// The checks of every causal entry point: check_attention_heads, and S ≥ T (the queries are
/// the last T of the S positions).
template <class Scalar>
void check_attention_inputs(std::string_view op, const ConstTensorView<Scalar, 4>& q,
                            const ConstTensorView<Scalar, 4>& k,
                            const ConstTensorView<Scalar, 4>& v) {
  check_attention_heads(op, q, k, v);
  if (k.dim(2) < q.dim(2)) {
    throw ShapeError(concat(op, ": k holds S = ", k.dim(2),
                            " positions (axis 2), fewer than q's T = ", q.dim(2), " (q ",
                            format_shape(q.shape()), ", k ", format_shape(k.shape()), ")"));
  }
}

template <class Scalar>
void check_attention_output(std::string_view op, const char* name, const Shape<4>& shape,
                            const ConstTensorView<Scalar, 4>& q) {
  if (shape != q.shape()) {
    throw ShapeError(concat(op, ": ", name, " must have q's shape ", format_shape(q.shape()),
                            ", got ", format_shape(shape)));
  }
}

/// Training's forward of one head under a window W > 0: P [T, S] (exactly 0 outside the band) and
/// o = P·v, q [T, d_k], k and v [S, d_k]. Each block of query rows multiplies only against the
/// keys its band spans (rows + W − 1 at most), so the work is O(T·W·d_k), not O(T·S·d_k); each
/// row's softmax is the unwindowed path's arithmetic over its W keys.
template <class Scalar, class QM, class KM, class VM, class PM, class OM>
void banded_probabilities(const QM& q, const KM& k, const VM& v, PM p, OM o, Scalar scale,
                          index_t window) {
  const index_t tokens = q.rows(), offset = k.rows() - q.rows();
  p.setZero();  // outside the band P is exactly 0, as backward expects
  for (index_t i0 = 0; i0 < tokens; i0 += attention_query_block) {
    const index_t rows = std::min(attention_query_block, tokens - i0);
    const index_t lo = first_visible_key(offset + i0, window), n = offset + i0 + rows - lo;
    auto block = p.block(i0, lo, rows, n);
    block.noalias() = q.middleRows(i0, rows) * k.middleRows(lo, n).transpose();
    for (index_t r = 0; r < rows; ++r) {
      // Row r sees block columns [first, first + count): keys position − W + 1 … position.
      const index_t position = offset + i0 + r;
      const index_t first = first_visible_key(position, window) - lo;
      const index_t count = position + 1 - lo - first;
      auto row = block.row(r).segment(first, count);
      row *= scale;
      row = (row.array() - row.maxCoeff()).exp().matrix();
      row /= row.sum();
      block.row(r).head(first).setZero();
      block.row(r).tail(n - first - count).setZero();
    }
    o.middleRows(i0, rows).noalias() = block * v.middleRows(lo, n);
  }
}

/// Backward of one query head under a window W > 0, over the same band blocks as
/// banded_probabilities: writes dq's rows and adds into dk and dv (the KV head's, shared by its
/// group). `d_scores` ([T, S] or larger) and `dot` (T) are the caller's per-thread scratch.
template <class Scalar, class QM, class KM, class VM, class PM, class DM, class DQ, class DK,
          class DV>
void banded_backward(const QM& q, const KM& k, const VM& v, const PM& p, const DM& d_out, DQ dq,
                     DK dk, DV dv, RowMatrix<Scalar>& d_scores,
                     Eigen::Matrix<Scalar, Eigen::Dynamic, 1>& dot, Scalar scale, index_t window) {
  const index_t tokens = q.rows(), offset = k.rows() - q.rows();
  for (index_t i0 = 0; i0 < tokens; i0 += attention_query_block) {
    const index_t rows = std::min(attention_query_block, tokens - i0);
    const index_t lo = first_visible_key(offset + i0, window), n = offset + i0 + rows - lo;
    const auto probs = p.block(i0, lo, rows, n);
    const auto d_rows = d_out.middleRows(i0, rows);
    dv.middleRows(lo, n).noalias() += probs.transpose() * d_rows;
    auto ds = d_scores.topLeftCorner(rows, n);
    ds.noalias() = d_rows * v.middleRows(lo, n).transpose();
    // dS = s · P ⊙ (dP − Σ_j dP·P), row by row; P = 0 outside the band gives dS = 0 there.
    auto d = dot.head(rows);
    d.noalias() = ds.cwiseProduct(probs).rowwise().sum();
    ds = probs.cwiseProduct(ds.colwise() - d) * scale;
    dq.middleRows(i0, rows).noalias() = ds * k.middleRows(lo, n);
    dk.middleRows(lo, n).noalias() += ds.transpose() * q.middleRows(i0, rows);
  }
}

/// dq, dk, dv of softmax attention from its probabilities P [B, H, T, S] (0 wherever masked),
/// per head: dv = Pᵀ·dout, dP = dout·vᵀ, dS = s · P ⊙ (dP − rowsum(dP ⊙ P)), dq = dS·k,
/// dk = dSᵀ·q (dk, dv summed over the H / H_kv query heads of a group). band > 0: only the band
/// of a sliding window is multiplied (banded_backward). Shapes already checked. The backward of
/// causal attention and of cross-attention, whose masks P carries.
template <class Scalar>
QKV<Scalar> probabilities_backward(const ConstTensorView<Scalar, 4>& qv,
                                   const ConstTensorView<Scalar, 4>& kv,
                                   const ConstTensorView<Scalar, 4>& vv,
                                   const ConstTensorView<Scalar, 4>& probs,
                                   const ConstTensorView<Scalar, 4>& dov, Scalar scale,
                                   index_t band) {
  const index_t batch = qv.dim(0), heads = qv.dim(1), tokens = qv.dim(2), keys = kv.dim(2);
  const index_t group = heads / kv.dim(1);
  QKV<Scalar> grads{Tensor<Scalar, 4>::uninitialized(qv.shape()), Tensor<Scalar, 4>(kv.shape()),
                    Tensor<Scalar, 4>(kv.shape())};
  // No queries: dk and dv stay 0 (and products over zero-row maps would offset null pointers).
  if (qv.empty()) return grads;
  const auto qh = heads_of(qv), kh = heads_of(kv), vh = heads_of(vv);
  const auto doh = heads_of(dov), ph = heads_of(probs);
  const auto dqh = heads_of(grads.q.view()), dkh = heads_of(grads.k.view()),
             dvh = heads_of(grads.v.view());
  // A thread takes a whole (b, KV head) group: its query heads all add into the same dk and dv,
  // which no other thread touches.
  const index_t kv_heads = kv.dim(1), groups = batch * kv_heads;
#ifdef _OPENMP
#pragma omp parallel if (groups > 1 && !omp_in_parallel())
#endif
  {
    RowMatrix<Scalar> d_scores(tokens, keys);  // one head's dP, then dS: once per thread
    Eigen::Matrix<Scalar, Eigen::Dynamic, 1> dot(tokens);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (index_t pair = 0; pair < groups; ++pair) {
      const index_t b = pair / kv_heads, g = pair % kv_heads;
      for (index_t h = g * group; h < (g + 1) * group; ++h) {
        const auto p = ph.head(b, h);
        const auto d_out = doh.head(b, h);
        if (band > 0) {
          detail::banded_backward<Scalar>(qh.head(b, h), kh.head(b, g), vh.head(b, g), p, d_out,
                                          dqh.head(b, h), dkh.head(b, g), dvh.head(b, g), d_scores,
                                          dot, scale, band);
          continue;
        }
        dvh.head(b, g).noalias() += p.transpose() * d_out;
        d_scores.noalias() = d_out * vh.head(b, g).transpose();
        // Softmax backward row by row: dS = s · P ⊙ (dP − Σ_j dP·P) (masked P = 0 gives dS = 0).
        dot.noalias() = d_scores.cwiseProduct(p).rowwise().sum();
        d_scores = p.cwiseProduct(d_scores.colwise() - dot) * scale;
        dqh.head(b, h).noalias() = d_scores * kh.head(b, g);
        dkh.head(b, g).noalias() += d_scores.transpose() * qh.head(b, h);
      }
    }
  }
  return grads;
}

}  // namespace detail

// ---- implementation -----------------------------------------------------------------------------

template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
void causal_attention_into(const Q& q, const K& k, const V& v, O&& o, std::optional<double> scale,
                           std::optional<index_t> window) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  require_layer_scalar<Scalar, O>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4 && rank_of<O> == 4,
                "dissect::causal_attention: q, k, v and o are [B, heads, positions, d_k]");
  constexpr std::string_view op = "causal_attention";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  const auto out = writable_view(o);
  detail::check_attention_inputs(op, qv, kv, vv);
  detail::check_attention_output(op, "o", out.shape(), qv);
  if (out.overlaps(qv) || out.overlaps(kv) || out.overlaps(vv)) {
    throw ShapeError(detail::concat(op, ": o must not share memory with q, k or v"));
  }
  const Scalar s = detail::score_scale<Scalar>(op, scale, qv.dim(3));
  const index_t band = detail::effective_window(op, window, kv.dim(2));
  if (out.empty()) return;
  detail::online_causal_attention<Scalar>(heads_of(qv), heads_of(kv), heads_of(vv), heads_of(out),
                                          out.dim(0), s, band);
}

template <class Scalar>
void causal_attention_heads_into(HeadMatrices<const Scalar> q, HeadMatrices<const Scalar> k,
                                 HeadMatrices<const Scalar> v, HeadMatrices<Scalar> o,
                                 index_t batch, std::optional<double> scale,
                                 std::optional<index_t> window) {
  constexpr std::string_view op = "causal_attention_heads_into";
  const auto text = [](const char* name, const auto& m) {
    return concat(name, ": ", m.n_heads, " heads of [", m.rows, ", ", m.head_dim, "]");
  };
  const std::string shapes = concat(" (batch ", batch, "; ", text("q", q), ", ", text("k", k), ", ",
                                    text("v", v), ", ", text("o", o), ")");
  if (batch < 0 || q.n_heads <= 0 || k.n_heads <= 0 || q.n_heads % k.n_heads != 0) {
    throw ShapeError(concat(op, ": batch must be >= 0 and k's heads must divide q's", shapes));
  }
  if (k.rows < q.rows || k.head_dim != q.head_dim || v.n_heads != k.n_heads || v.rows != k.rows ||
      v.head_dim != k.head_dim) {
    throw ShapeError(
        concat(op, ": k and v must be alike, with d_k of q and at least q's rows", shapes));
  }
  if (o.n_heads != q.n_heads || o.rows != q.rows || o.head_dim != q.head_dim) {
    throw ShapeError(concat(op, ": o must be shaped like q", shapes));
  }
  if (q.rows < 0 || q.head_dim < 0 || q.head_stride < q.rows * q.head_dim ||
      k.head_stride < k.rows * k.head_dim || v.head_stride < v.rows * v.head_dim ||
      o.head_stride < o.rows * o.head_dim) {
    throw ShapeError(concat(op, ": a head stride is shorter than its head", shapes));
  }
  const Scalar s = detail::score_scale<Scalar>(op, scale, q.head_dim);
  const index_t band = detail::effective_window(op, window, k.rows);
  if (batch == 0 || q.rows == 0) return;
  detail::online_causal_attention<Scalar>(q, k, v, o, batch, s, band);
}

template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> causal_attention(const Q& q, const K& k, const V& v,
                                         std::optional<double> scale,
                                         std::optional<index_t> window) {
  auto out = Tensor<scalar_of<Q>, 4>::uninitialized(const_view(q).shape());
  causal_attention_into(q, k, v, out, scale, window);
  return out;
}

template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> causal_attention(const Q& q, const K& k, const V& v,
                                         AttentionCache<scalar_of<Q>>& cache,
                                         std::optional<double> scale,
                                         std::optional<index_t> window) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  constexpr std::string_view op = "causal_attention";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  detail::check_attention_inputs(op, qv, kv, vv);
  const index_t batch = qv.dim(0), heads = qv.dim(1), tokens = qv.dim(2), keys = kv.dim(2);
  const index_t group = heads / kv.dim(1), offset = keys - tokens;
  const Scalar s = detail::score_scale<Scalar>(op, scale, qv.dim(3));
  const index_t band = detail::effective_window(op, window, keys);
  cache.scale = scale;
  cache.window = window;
  auto probs = reuse_buffer(cache.probs, Shape<4>{batch, heads, tokens, keys});
  auto out = Tensor<Scalar, 4>::uninitialized(qv.shape());
  const auto qh = heads_of(qv), kh = heads_of(kv), vh = heads_of(vv);
  const auto oh = heads_of(out.view()), ph = heads_of(probs);
  // Heads are independent: with OpenMP each thread takes whole heads, and the products inside
  // run single-threaded (Eigen does not nest), instead of every small GEMM forking the team.
  const index_t pairs = batch * heads;
#ifdef _OPENMP
#pragma omp parallel for schedule(static) if (pairs > 1 && !omp_in_parallel())
#endif
  for (index_t pair = 0; pair < pairs; ++pair) {
    const index_t b = pair / heads, h = pair % heads;
    auto p = ph.head(b, h);
    if (band > 0) {
      detail::banded_probabilities<Scalar>(qh.head(b, h), kh.head(b, h / group),
                                           vh.head(b, h / group), p, oh.head(b, h), s, band);
      continue;
    }
    p.noalias() = qh.head(b, h) * kh.head(b, h / group).transpose();
    for (index_t t = 0; t < tokens; ++t) {
      // Row t sees keys [0, offset + t]; the masked rest is exactly 0 after the softmax.
      const index_t visible = offset + t + 1;
      auto row = p.row(t).head(visible);
      row *= s;
      row = (row.array() - row.maxCoeff()).exp().matrix();
      row /= row.sum();
      p.row(t).tail(keys - visible).setZero();
    }
    oh.head(b, h).noalias() = p * vh.head(b, h / group);
  }
  return out;
}

template <TensorLike Q, TensorLike K, TensorLike V, TensorLike DO>
QKV<scalar_of<Q>> causal_attention_backward(const Q& q, const K& k, const V& v,
                                            const AttentionCache<scalar_of<Q>>& cache,
                                            const DO& dout) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  require_layer_scalar<Scalar, DO>();
  constexpr std::string_view op = "causal_attention_backward";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  const auto dov = const_view(dout);
  detail::check_attention_inputs(op, qv, kv, vv);
  detail::check_attention_output(op, "dout", dov.shape(), qv);
  const index_t batch = qv.dim(0), heads = qv.dim(1), tokens = qv.dim(2), keys = kv.dim(2);
  const Shape<4> probs_shape{batch, heads, tokens, keys};
  if (cache.probs.shape() != probs_shape) {
    throw ShapeError(
        detail::concat(op, ": cache.probs must be [B, H, T, S] = ", format_shape(probs_shape),
                       ", got ", format_shape(cache.probs.shape()),
                       " (fill the cache with causal_attention(q, k, v, cache))"));
  }
  const Scalar scale = detail::score_scale<Scalar>(op, cache.scale, qv.dim(3));
  const index_t band = detail::effective_window(op, cache.window, keys);
  return detail::probabilities_backward<Scalar>(qv, kv, vv, cache.probs.cview(), dov, scale, band);
}

inline index_t causal_attention_flops(index_t batch, index_t n_heads, index_t tokens, index_t keys,
                                      index_t head_dim, std::optional<index_t> window) {
  constexpr std::string_view what = "causal_attention_flops";
  if (batch < 0 || n_heads < 0 || tokens < 0 || head_dim < 0 || keys < tokens) {
    throw ShapeError(detail::concat(what, ": need sizes >= 0 and keys S >= tokens T (B=", batch,
                                    ", H=", n_heads, ", T=", tokens, ", S=", keys,
                                    ", d_k=", head_dim, ")"));
  }
  // Σ_{t<T} (S − T + t + 1) = T·(S − T) + T·(T + 1)/2 visible (query, key) pairs.
  const index_t offset = keys - tokens;
  const index_t triangle = tokens % 2 == 0 ? checked_mul(tokens / 2, tokens + 1, what)
                                           : checked_mul(tokens, (tokens + 1) / 2, what);
  index_t pairs = checked_add(checked_mul(tokens, offset, what), triangle, what);
  if (const index_t band = detail::effective_window(what, window, keys); band > 0) {
    // Query t sees min(W, S − T + t + 1) keys: W each once its position reaches W − 1, so the
    // pairs are the causal count less Σ over positions p ≥ W of (p + 1 − W).
    const index_t first = std::max(offset, band);  // the first position that loses keys
    if (first < keys) {
      const index_t n = keys - first, lost_first = first + 1 - band, lost_last = keys - band;
      const index_t sum = n % 2 == 0 ? checked_mul(n / 2, lost_first + lost_last, what)
                                     : checked_mul(n, (lost_first + lost_last) / 2, what);
      pairs -= sum;
    }
  }
  return checked_product({4, batch, n_heads, head_dim, pairs}, what);
}

}  // namespace dissect
