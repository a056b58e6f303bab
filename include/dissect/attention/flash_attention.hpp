// dissect/attention/flash_attention.hpp — attention o = softmax(s·q·kᵀ + mask)·v for training
// without the [T, S] probabilities: FlashAttention-2's algorithm (Dao, 2023) on dissect's GEMM.
//
// Forward walks each head's queries in blocks of flash_query_block rows and, inside, the keys in
// blocks of flash_key_block, keeping a running row maximum m and sum l (online softmax). It
// writes o and one number per query row, the log-sum-exp L = m + log l of that row's scores.
// Backward recomputes every score tile from q, k and L, so P = exp(s·q·kᵀ − L) is exact without
// having been stored, and with D = rowsum(dO ⊙ O) (= rowsum(P ⊙ dP), the softmax's correction):
//   dv += Pᵀ·dO,  dP = dO·vᵀ,  dS = s · P ⊙ (dP − D),  dq += dS·k,  dk += dSᵀ·q.
// Memory: the cache is L, [B, H, T] (4·B·H·T bytes in float), where causal_attention's training
// cache is P, [B, H, T, S]; scratch is a few [64, 64] and [64, d_k] tiles and one [T] vector
// per thread. The cost is the score tiles computed twice (forward, backward) and one more tile
// product in backward: 2 products forward, 5 backward, as FlashAttention-2.
//
// Conventions are attention.hpp's: grouped-query attention (query head h reads key/value head
// h / (H / H_kv); dk and dv are summed over the group), the score scale s (unset: 1/√d_k, else
// finite and > 0), and, when causal, the KV-cache positions: q holds the T newest of S ≥ T
// positions, so query t sits at S − T + t and sees keys 0 … S − T + t. Without the mask every
// query sees all S ≥ 1 keys (S < T allowed). NaN and Inf propagate per IEEE, as in torch.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "dissect/attention/attention.hpp"
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

/// How flash attention masks and scales.
struct FlashAttentionOptions {
  bool causal = true;                          ///< the causal mask with attention.hpp's positions
  std::optional<double> scale = std::nullopt;  ///< s; unset: 1/√d_k
};

/// What flash attention's forward keeps for backward: one number per query row, not P.
template <class Scalar>
struct FlashAttentionCache {
  /// L[b, h, t] = log Σ_j exp(s·q_t·k_j) over the keys row t sees: [B, H, T].
  Tensor<Scalar, 3> lse;
  FlashAttentionOptions options;  ///< the forward's mask and scale, which backward applies again
};

/// q: [B, H, T, d_k], k, v: [B, H_kv, S, d_k] → o: [B, H, T, d_k].
/// Threads: with OpenMP, the B·H heads are shared among the team (one scratch set per thread).
/// @throws ShapeError naming the operation and the shapes if the ranks, B, d_k or the key/value
///         shapes differ, H_kv does not divide H, S < T when causal or S = 0 < T when not;
///         ConfigError "flash_attention: scale must be finite and > 0 (got …)".
template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> flash_attention(const Q& q, const K& k, const V& v,
                                        const FlashAttentionOptions& options = {});

/// As flash_attention, into a caller's o: [B, H, T, d_k] (never read; must not overlap q, k, v).
template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
void flash_attention_into(const Q& q, const K& k, const V& v, O&& o,
                          const FlashAttentionOptions& options = {});

/// As flash_attention, keeping L and the options in `cache` for flash_attention_backward. A
/// refused call leaves the cache alone.
template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> flash_attention(const Q& q, const K& k, const V& v,
                                        FlashAttentionCache<scalar_of<Q>>& cache,
                                        const FlashAttentionOptions& options = {});

/// q, k, v, the o and cache of flash_attention(q, k, v, cache, options), dout: [B, H, T, d_k] →
/// {dq [B, H, T, d_k], dk, dv [B, H_kv, S, d_k]}, recomputing P tile by tile (see the top).
/// A thread owns a whole (b, KV head) group, so the group's dk and dv have one writer.
/// @throws ShapeError as flash_attention, for o or dout not of q's shape, or a cache whose L is
///         not [B, H, T] (another shape's, or never filled); ConfigError for its scale.
template <TensorLike Q, TensorLike K, TensorLike V, TensorLike O, TensorLike DO>
QKV<scalar_of<Q>> flash_attention_backward(const Q& q, const K& k, const V& v, const O& o,
                                           const FlashAttentionCache<scalar_of<Q>>& cache,
                                           const DO& dout);

/// flash_attention on heads given as strided matrices (causal_attention_heads_into's contract):
/// k and v may be the first S positions of a KV cache's buffers (KVCache::keys / values).
/// @throws ShapeError naming the operand if the head counts, rows, d_k or strides do not fit;
///         ConfigError for the scale.
template <class Scalar>
void flash_attention_heads_into(HeadMatrices<const Scalar> q, HeadMatrices<const Scalar> k,
                                HeadMatrices<const Scalar> v, HeadMatrices<Scalar> o, index_t batch,
                                const FlashAttentionOptions& options = {});

/// The FLOPs of the forward's two products over the visible (query, key) pairs: 4·B·H·d_k·pairs
/// (causal: causal_attention_flops; otherwise every T·S pair). Backward does 2.5 times as many
/// (five products, as FlashAttention-2 counts them).
index_t flash_attention_flops(index_t batch, index_t n_heads, index_t tokens, index_t keys,
                              index_t head_dim, bool causal);

/// Whether training attention over T tokens runs faster as flash attention than materialised
/// (causal_attention with a cache, then causal_attention_backward): T >= 128. Measured with
/// bench_attention's train/ cases (forward + backward, float, 1 thread, the machine busy): the
/// mini-GPT's B = 8, H = 4, d_k = 32 took 3.5 / 10.4 / 20.0 / 54 / 227 / 811 ms by flash
/// against 2.9 / 6.1 / 20.6 / 69 / 388 / 1737 ms materialised at T = 32 / 64 / 128 / 256 /
/// 512 / 1024, and B = 4, H = 4, d_k = 64 1.7 / 4.3 / 14.9 / 40 / 135 / 644 against
/// 1.1 / 4.1 / 17.1 / 43 / 228 / 1158 ms. Below 128 tokens a head is one or two 64-row tiles,
/// and recomputing its scores costs more than keeping P; from 128 on flash is as fast or faster
/// (a quieter rerun: 6.3 / 6.2 and 4.2 / 4.6 ms at T = 128, 17.5 / 21.3 and 17.1 / 18.6 at 256)
/// and its memory is O(T) instead of O(T²). bench/README.md, "Flash attention", has the runs.
inline constexpr index_t flash_attention_min_tokens = 128;
inline bool flash_attention_pays(index_t tokens) {
  return tokens >= flash_attention_min_tokens;
}

namespace detail {

/// The tiles: 64 query rows × 64 keys keep a [64, 64] score tile (16 KB in float) in L1 beside
/// the q, k and v rows it is made of, as attention.hpp's online softmax does.
inline constexpr index_t flash_query_block = 64;
inline constexpr index_t flash_key_block = 64;

/// The keys query row `row` sees: [0, offset + row + 1) when causal, else all of them.
inline index_t flash_visible(bool causal, index_t offset, index_t row, index_t keys) {
  return causal ? std::min(keys, offset + row + 1) : keys;
}

/// Forward on checked shapes: o, and L into lse (B·H·T values, (b, h, t) row-major) if given.
template <class Scalar>
void flash_forward(HeadMatrices<const Scalar> q, HeadMatrices<const Scalar> k,
                   HeadMatrices<const Scalar> v, HeadMatrices<Scalar> o, Scalar* lse, index_t batch,
                   Scalar scale, bool causal) {
  const index_t heads = q.n_heads, group = q.n_heads / k.n_heads;
  const index_t tokens = q.rows, keys = k.rows, offset = k.rows - q.rows, d_k = q.head_dim;
  const index_t pairs = batch * heads;
  constexpr Scalar minus_inf = -std::numeric_limits<Scalar>::infinity();
#ifdef _OPENMP
#pragma omp parallel if (pairs > 1 && !omp_in_parallel())
#endif
  {
    // One scratch set per thread, allocated once per call, never per head or per tile.
    RowMatrix<Scalar> scores(flash_query_block, flash_key_block);
    RowMatrix<Scalar> acc(flash_query_block, d_k), tile_values(flash_query_block, d_k);
    Eigen::Matrix<Scalar, Eigen::Dynamic, 1> row_max(flash_query_block), row_sum(flash_query_block);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (index_t pair = 0; pair < pairs; ++pair) {
      const index_t b = pair / heads, h = pair % heads;
      const auto q_head = q.head(b, h);
      const auto k_head = k.head(b, h / group);
      const auto v_head = v.head(b, h / group);
      auto o_head = o.head(b, h);
      for (index_t i0 = 0; i0 < tokens; i0 += flash_query_block) {
        const index_t rows = std::min(flash_query_block, tokens - i0);
        // The block's last row sees the most keys; tiles past them are skipped, not masked.
        const index_t seen = flash_visible(causal, offset, i0 + rows - 1, keys);
        row_max.head(rows).setConstant(minus_inf);
        row_sum.head(rows).setZero();
        acc.topRows(rows).setZero();
        for (index_t j0 = 0; j0 < seen; j0 += flash_key_block) {
          const index_t cols = std::min(flash_key_block, seen - j0);
          auto tile = scores.topLeftCorner(rows, cols);
          linear_forward<Scalar>(q_head.middleRows(i0, rows), k_head.middleRows(j0, cols),
                                 std::nullopt, tile);
          for (index_t r = 0; r < rows; ++r) {
            auto row = tile.row(r);
            row *= scale;
            const index_t visible = flash_visible(causal, offset, i0 + r, keys) - j0;
            if (visible < cols)
              row.tail(cols - std::max<index_t>(visible, 0)).setConstant(minus_inf);
            // Every row sees key 0, in the first tile, so its maximum is finite from then on and
            // a fully masked row of a later tile changes nothing: exp(−inf − max) = 0.
            const Scalar new_max = std::max(row_max[r], row.maxCoeff());
            const Scalar correction = std::exp(row_max[r] - new_max);
            row = (row.array() - new_max).exp().matrix();
            row_sum[r] = row_sum[r] * correction + row.sum();
            acc.row(r) *= correction;
            row_max[r] = new_max;
          }
          auto values = tile_values.topRows(rows);
          linear_backward_input<Scalar>(v_head.middleRows(j0, cols), tile, values);
          acc.topRows(rows) += values;
        }
        o_head.middleRows(i0, rows) =
            row_sum.head(rows).cwiseInverse().asDiagonal() * acc.topRows(rows);
        if (lse) {
          Scalar* out = lse + pair * tokens + i0;
          for (index_t r = 0; r < rows; ++r) out[r] = row_max[r] + std::log(row_sum[r]);
        }
      }
    }
  }
}

/// Backward on checked shapes; dq, dk and dv are overwritten.
template <class Scalar>
void flash_backward(HeadMatrices<const Scalar> q, HeadMatrices<const Scalar> k,
                    HeadMatrices<const Scalar> v, HeadMatrices<const Scalar> o,
                    HeadMatrices<const Scalar> dout, const Scalar* lse, HeadMatrices<Scalar> dq,
                    HeadMatrices<Scalar> dk, HeadMatrices<Scalar> dv, index_t batch, Scalar scale,
                    bool causal) {
  const index_t heads = q.n_heads, kv_heads = k.n_heads, group = heads / kv_heads;
  const index_t tokens = q.rows, keys = k.rows, offset = k.rows - q.rows, d_k = q.head_dim;
  const index_t groups = batch * kv_heads;
#ifdef _OPENMP
#pragma omp parallel if (groups > 1 && !omp_in_parallel())
#endif
  {
    // Once per thread: two score tiles (P, then dP turned into dS), one [64, d_k] product, and
    // D for one head's T rows — O(T + d_k) per thread, never [T, S].
    RowMatrix<Scalar> p(flash_query_block, flash_key_block), ds(flash_query_block, flash_key_block);
    RowMatrix<Scalar> dq_part(flash_query_block, d_k);
    Eigen::Matrix<Scalar, Eigen::Dynamic, 1> correction(tokens);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (index_t pair = 0; pair < groups; ++pair) {
      const index_t b = pair / kv_heads, g = pair % kv_heads;
      const auto k_head = k.head(b, g);
      const auto v_head = v.head(b, g);
      auto dk_head = dk.head(b, g);
      auto dv_head = dv.head(b, g);
      dk_head.setZero();
      dv_head.setZero();
      for (index_t h = g * group; h < (g + 1) * group; ++h) {
        const auto q_head = q.head(b, h);
        const auto d_out = dout.head(b, h);
        const Scalar* row_lse = lse + (b * heads + h) * tokens;
        auto dq_head = dq.head(b, h);
        dq_head.setZero();
        // D_t = dO_t · O_t, which equals Σ_j P_tj·dP_tj (O = P·v), without a pass over keys.
        correction.noalias() = d_out.cwiseProduct(o.head(b, h)).rowwise().sum();
        // Keys outside, queries inside (FlashAttention-2): the tile's dk and dv rows stay hot.
        for (index_t j0 = 0; j0 < keys; j0 += flash_key_block) {
          const index_t cols = std::min(flash_key_block, keys - j0);
          const auto k_tile = k_head.middleRows(j0, cols);
          const auto v_tile = v_head.middleRows(j0, cols);
          // Causal: query row i sees key j0 once offset + i ≥ j0, so earlier blocks are skipped.
          const index_t first = causal ? std::max<index_t>(0, j0 - offset) : 0;
          for (index_t i0 = first / flash_query_block * flash_query_block; i0 < tokens;
               i0 += flash_query_block) {
            const index_t rows = std::min(flash_query_block, tokens - i0);
            const auto q_tile = q_head.middleRows(i0, rows);
            const auto do_tile = d_out.middleRows(i0, rows);
            auto p_tile = p.topLeftCorner(rows, cols);
            auto ds_tile = ds.topLeftCorner(rows, cols);
            linear_forward<Scalar>(q_tile, k_tile, std::nullopt, p_tile);
            for (index_t r = 0; r < rows; ++r) {
              // P = exp(s·q·kᵀ − L), 0 where masked (the forward's softmax, rebuilt exactly).
              const index_t visible =
                  std::max<index_t>(0, flash_visible(causal, offset, i0 + r, keys) - j0);
              auto row = p_tile.row(r);
              const index_t kept = std::min(visible, cols);
              row.head(kept) = (row.head(kept).array() * scale - row_lse[i0 + r]).exp().matrix();
              row.tail(cols - kept).setZero();
            }
            // dv += Pᵀ·dO (linear_backward_parameters: dW += dyᵀ·x with dy = P, x = dO).
            linear_backward_parameters<Scalar>(do_tile, p_tile, dv_head.middleRows(j0, cols),
                                               std::nullopt);
            linear_forward<Scalar>(do_tile, v_tile, std::nullopt, ds_tile);  // dP = dO·vᵀ
            for (index_t r = 0; r < rows; ++r) {
              ds_tile.row(r) =
                  (p_tile.row(r).array() * (ds_tile.row(r).array() - correction[i0 + r]) * scale)
                      .matrix();
            }
            auto dq_rows = dq_part.topRows(rows);
            linear_backward_input<Scalar>(k_tile, ds_tile, dq_rows);  // dS·k
            dq_head.middleRows(i0, rows) += dq_rows;
            // dk += dSᵀ·q.
            linear_backward_parameters<Scalar>(q_tile, ds_tile, dk_head.middleRows(j0, cols),
                                               std::nullopt);
          }
        }
      }
    }
  }
}

/// The checks of every flash entry point: q [B, H, T, d_k], k and v [B, H_kv, S, d_k], H_kv | H;
/// causal: S ≥ T; not: S ≥ 1 unless T = 0.
template <class Scalar>
void check_flash_inputs(std::string_view op, const ConstTensorView<Scalar, 4>& q,
                        const ConstTensorView<Scalar, 4>& k, const ConstTensorView<Scalar, 4>& v,
                        bool causal) {
  if (causal) {
    check_attention_inputs(op, q, k, v);
    return;
  }
  check_attention_heads(op, q, k, v);
  if (k.dim(2) == 0 && q.dim(2) > 0) {
    throw ShapeError(concat(op, ": k holds no positions (axis 2) for q's T = ", q.dim(2),
                            " queries, whose softmax would be empty (q ", format_shape(q.shape()),
                            ", k ", format_shape(k.shape()), ")"));
  }
}

}  // namespace detail

// ---- implementation -----------------------------------------------------------------------------

template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
void flash_attention_into(const Q& q, const K& k, const V& v, O&& o,
                          const FlashAttentionOptions& options) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  require_layer_scalar<Scalar, O>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4 && rank_of<O> == 4,
                "dissect::flash_attention: q, k, v and o are [B, heads, positions, d_k]");
  constexpr std::string_view op = "flash_attention";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  const auto out = writable_view(o);
  detail::check_flash_inputs(op, qv, kv, vv, options.causal);
  detail::check_attention_output(op, "o", out.shape(), qv);
  if (out.overlaps(qv) || out.overlaps(kv) || out.overlaps(vv)) {
    throw ShapeError(detail::concat(op, ": o must not share memory with q, k or v"));
  }
  const Scalar s = detail::score_scale<Scalar>(op, options.scale, qv.dim(3));
  if (out.empty()) return;
  detail::flash_forward<Scalar>(heads_of(qv), heads_of(kv), heads_of(vv), heads_of(out), nullptr,
                                out.dim(0), s, options.causal);
}

template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> flash_attention(const Q& q, const K& k, const V& v,
                                        const FlashAttentionOptions& options) {
  auto out = Tensor<scalar_of<Q>, 4>::uninitialized(const_view(q).shape());
  flash_attention_into(q, k, v, out, options);
  return out;
}

template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> flash_attention(const Q& q, const K& k, const V& v,
                                        FlashAttentionCache<scalar_of<Q>>& cache,
                                        const FlashAttentionOptions& options) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  constexpr std::string_view op = "flash_attention";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  detail::check_flash_inputs(op, qv, kv, vv, options.causal);
  const Scalar s = detail::score_scale<Scalar>(op, options.scale, qv.dim(3));
  auto out = Tensor<Scalar, 4>::uninitialized(qv.shape());
  auto lse = reuse_buffer(cache.lse, Shape<3>{qv.dim(0), qv.dim(1), qv.dim(2)});
  cache.options = options;
  if (out.empty()) return out;
  detail::flash_forward<Scalar>(heads_of(qv), heads_of(kv), heads_of(vv), heads_of(out.view()),
                                lse.data(), qv.dim(0), s, options.causal);
  return out;
}

template <TensorLike Q, TensorLike K, TensorLike V, TensorLike O, TensorLike DO>
QKV<scalar_of<Q>> flash_attention_backward(const Q& q, const K& k, const V& v, const O& o,
                                           const FlashAttentionCache<scalar_of<Q>>& cache,
                                           const DO& dout) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  require_layer_scalar<Scalar, O>();
  require_layer_scalar<Scalar, DO>();
  constexpr std::string_view op = "flash_attention_backward";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  const auto ov = const_view(o), dov = const_view(dout);
  const bool causal = cache.options.causal;
  detail::check_flash_inputs(op, qv, kv, vv, causal);
  detail::check_attention_output(op, "o", ov.shape(), qv);
  detail::check_attention_output(op, "dout", dov.shape(), qv);
  const Shape<3> lse_shape{qv.dim(0), qv.dim(1), qv.dim(2)};
  if (cache.lse.shape() != lse_shape) {
    throw ShapeError(detail::concat(op, ": cache.lse must be [B, H, T] = ", format_shape(lse_shape),
                                    " for q ", format_shape(qv.shape()), ", got ",
                                    format_shape(cache.lse.shape()),
                                    " (fill the cache with flash_attention(q, k, v, cache))"));
  }
  const Scalar s = detail::score_scale<Scalar>(op, cache.options.scale, qv.dim(3));
  QKV<Scalar> grads{Tensor<Scalar, 4>::uninitialized(qv.shape()),
                    Tensor<Scalar, 4>::uninitialized(kv.shape()),
                    Tensor<Scalar, 4>::uninitialized(kv.shape())};
  if (qv.empty() && kv.empty()) return grads;
  if (qv.empty()) {  // no query reads a key: the key and value gradients are 0
    grads.k.fill(Scalar(0));
    grads.v.fill(Scalar(0));
    return grads;
  }
  detail::flash_backward<Scalar>(heads_of(qv), heads_of(kv), heads_of(vv), heads_of(ov),
                                 heads_of(dov), cache.lse.data(), heads_of(grads.q.view()),
                                 heads_of(grads.k.view()), heads_of(grads.v.view()), qv.dim(0), s,
                                 causal);
  return grads;
}

template <class Scalar>
void flash_attention_heads_into(HeadMatrices<const Scalar> q, HeadMatrices<const Scalar> k,
                                HeadMatrices<const Scalar> v, HeadMatrices<Scalar> o, index_t batch,
                                const FlashAttentionOptions& options) {
  constexpr std::string_view op = "flash_attention_heads_into";
  const auto text = [](const char* name, const auto& m) {
    return concat(name, ": ", m.n_heads, " heads of [", m.rows, ", ", m.head_dim, "]");
  };
  const std::string shapes = concat(" (batch ", batch, "; ", text("q", q), ", ", text("k", k), ", ",
                                    text("v", v), ", ", text("o", o), ")");
  if (batch < 0 || q.n_heads <= 0 || k.n_heads <= 0 || q.n_heads % k.n_heads != 0) {
    throw ShapeError(concat(op, ": batch must be >= 0 and k's heads must divide q's", shapes));
  }
  const bool too_few_keys = options.causal ? k.rows < q.rows : (k.rows <= 0 && q.rows > 0);
  if (too_few_keys || k.head_dim != q.head_dim || v.n_heads != k.n_heads || v.rows != k.rows ||
      v.head_dim != k.head_dim) {
    throw ShapeError(concat(op, ": k and v must be alike, with d_k of q and ",
                            options.causal ? "at least q's rows" : "at least one row", shapes));
  }
  if (o.n_heads != q.n_heads || o.rows != q.rows || o.head_dim != q.head_dim) {
    throw ShapeError(concat(op, ": o must be shaped like q", shapes));
  }
  if (q.rows < 0 || q.head_dim < 0 || q.head_stride < q.rows * q.head_dim ||
      k.head_stride < k.rows * k.head_dim || v.head_stride < v.rows * v.head_dim ||
      o.head_stride < o.rows * o.head_dim) {
    throw ShapeError(concat(op, ": a head stride is shorter than its head", shapes));
  }
  const Scalar s = detail::score_scale<Scalar>(op, options.scale, q.head_dim);
  if (batch == 0 || q.rows == 0) return;
  detail::flash_forward<Scalar>(q, k, v, o, nullptr, batch, s, options.causal);
}

inline index_t flash_attention_flops(index_t batch, index_t n_heads, index_t tokens, index_t keys,
                                     index_t head_dim, bool causal) {
  if (causal) return causal_attention_flops(batch, n_heads, tokens, keys, head_dim);
  constexpr std::string_view what = "flash_attention_flops";
  if (batch < 0 || n_heads < 0 || tokens < 0 || keys < 0 || head_dim < 0) {
    throw ShapeError(detail::concat(what, ": need sizes >= 0 (B=", batch, ", H=", n_heads,
                                    ", T=", tokens, ", S=", keys, ", d_k=", head_dim, ")"));
  }
  return checked_product({4, batch, n_heads, head_dim, tokens, keys}, what);
}

}  // namespace dissect
