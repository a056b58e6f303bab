// dissect/parallel/parallel_attention.hpp — tensor-parallel causal self-attention (Megatron-LM).
//
// Built from the single-process QKV projection and attention output that every rank holds, it
// keeps only this rank's heads (or takes the rank's slices alone, already cut): the fused QKV is
// column-parallel, split by heads; attention over this rank's H/P query heads and H_kv/P
// key/value heads is local; the output projection is row-parallel. So
// each forward makes exactly one all-reduce (of B·T·D values, in the row-parallel output) and each
// backward exactly one (of B·T·D values, dx), besides one small agreement per call
// (Communicator::agree: 88 bytes, and a checksum pass over x — and dy in backward — which must be
// the same on every rank). Forward runs all its local work, up to the all-reduce, inside the
// agreement; backward runs its checks there, so that a refusal on any rank leaves every rank's
// gradients untouched.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/attention/attention.hpp"
#include "dissect/blocks/attention_output.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/qkv_projection.hpp"
#include "dissect/core/error.hpp"
#include "dissect/layers/rope.hpp"
#include "dissect/parallel/communicator.hpp"
#include "dissect/parallel/parallel_feed_forward.hpp"
#include "dissect/parallel/parallel_linear.hpp"
#include "dissect/tensor/detail/heads.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect::parallel {

// ---- declarations -------------------------------------------------------------------------------

/// Causal self-attention split by heads: rank p takes query heads [p·H/P, (p+1)·H/P) and
/// key/value heads [p·H_kv/P, (p+1)·H_kv/P) — its rows of each of the three parts of the fused
/// QKV weight (a group of H/H_kv query heads stays with its key/value head) — attends locally
/// and projects its D/P merged features row-parallel. Names "qkv.*" and "proj.*", as the
/// single-process QKVProjection and AttentionOutput have them.
template <class Scalar>
class ParallelAttention : public ComposedModule<ParallelAttention<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// What backward needs from forward: this rank's heads.
  struct Cache {
    QKV<Scalar> qkv;                   ///< q [B, H/P, T, d_k], k, v [B, H_kv/P, T, d_k]
    AttentionCache<Scalar> attention;  ///< probabilities [B, H/P, T, T]
    Tensor<Scalar, 3> merged;          ///< attention output, heads merged: [B, T, D/P]
  };

  /// A collective; `comm` must outlive the block. `score_scale` multiplies the scores q·kᵀ, as
  /// causal_attention's scale (unset: 1/√d_k; a DecoderLayer's score_scale()).
  /// @throws ConfigError (every rank) if P does not divide H or H_kv, or the two blocks differ in
  ///         D or H, or score_scale is not finite and > 0; ShapeError if the ranks' blocks differ
  ///         in shape.
  ParallelAttention(const QKVProjection<Scalar>& qkv, const AttentionOutput<Scalar>& out,
                    const Communicator& comm, std::optional<double> score_scale = std::nullopt);
  /// From slices already split: `qkv` holds this rank's heads of q, k and v (its parts
  /// [H·d_k, H_kv·d_k, H_kv·d_k]), `proj` its D/P columns. @throws ConfigError (every rank) if P
  /// does not divide H or H_kv, H does not divide D or the slices do not fit the heads; as the
  /// other constructor for score_scale.
  ParallelAttention(ColumnParallelLinear<Scalar> qkv, RowParallelLinear<Scalar> proj,
                    index_t n_heads, index_t n_kv_heads, const Communicator& comm,
                    std::optional<double> score_scale = std::nullopt);

  index_t d_model() const { return proj_.out_features(); }
  index_t n_heads() const { return n_heads_; }
  index_t n_kv_heads() const { return n_kv_heads_; }
  index_t head_dim() const { return head_dim_; }
  /// The factor of the scores q·kᵀ (unset: 1/√d_k).
  std::optional<double> score_scale() const { return score_scale_; }
  index_t local_heads() const { return n_heads_ / comm_->size(); }
  index_t local_kv_heads() const { return n_kv_heads_ / comm_->size(); }
  ColumnParallelLinear<Scalar>& qkv() { return qkv_; }
  const ColumnParallelLinear<Scalar>& qkv() const { return qkv_; }
  RowParallelLinear<Scalar>& proj() { return proj_; }
  const RowParallelLinear<Scalar>& proj() const { return proj_; }

  /// x: [B, T, D] (the same on every rank) → y = proj(attention(qkv(x))): [B, T, D]. With a
  /// RoPE table, q and k are rotated to positions 0 … T − 1 before attention (LLaMA); the cache
  /// then holds them rotated, as DecoderLayer's does.
  /// @throws ShapeError (every rank) if x differs across ranks or is not [B, T, D].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x) const {
    Cache scratch;
    return forward(x, scratch);
  }
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache,
                            const RotaryTable<Scalar>* rope = nullptr) const;

  /// x, cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D] (all-reduced); adds to this
  /// rank's slices of qkv's and proj's gradients. @throws ShapeError (every rank, gradients
  /// untouched) if x, dy or the cache does not fit.
  /// `rope`: the table forward had.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy,
                             const RotaryTable<Scalar>* rope = nullptr);

  /// The checks backward makes of x, cache, dy and rope on this rank, alone and local (no
  /// collective): what a layer built around this block runs inside its own agreement, so that a
  /// refusal comes before any gradient of the layer changes. @throws as backward would, on this
  /// rank only.
  void check_backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                      ConstTensorView<Scalar, 3> dy, const RotaryTable<Scalar>* rope) const;

 private:
  friend class ComposedModule<ParallelAttention>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child(module_names::qkv, self.qkv_, visit);
    visit_child(module_names::proj, self.proj_, visit);
  }

  /// The constructors' checks, in one agreement each (score_scale: checked_scale's, agreed).
  static index_t checked_split(const QKVProjection<Scalar>& qkv, const AttentionOutput<Scalar>& out,
                               const Communicator& comm, std::optional<double> score_scale);
  static std::optional<double> checked_scale(std::optional<double> scale) {
    if (scale) require_positive_finite("ParallelAttention", "score_scale", *scale);
    return scale;
  }
  static index_t checked_slices(const ColumnParallelLinear<Scalar>& qkv,
                                const RowParallelLinear<Scalar>& proj, index_t n_heads,
                                index_t n_kv_heads, const Communicator& comm,
                                std::optional<double> score_scale);
  /// forward up to its all-reduce: this rank's partial product of proj (the agreement's local
  /// part).
  Tensor<Scalar, 3> local_forward(ConstTensorView<Scalar, 3> x, Cache& cache,
                                  const RotaryTable<Scalar>* rope) const;

  const Communicator* comm_;
  index_t n_heads_, n_kv_heads_, head_dim_;
  std::optional<double> score_scale_;
  ColumnParallelLinear<Scalar> qkv_;
  RowParallelLinear<Scalar> proj_;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// The score scale (unset or its bits), checksummed: it must be the same on every rank.
inline std::uint64_t scale_checksum(std::optional<double> scale) {
  Checksum sum;
  sum.add(scale.has_value()).add(scale.value_or(0.0));
  return sum.value();
}

/// Whether there is a RoPE table, its d_k and θ, checksummed: what every rank's table must
/// share. Its length may differ (a rank whose table is too short for T throws, naming itself).
template <class Scalar>
std::uint64_t rope_checksum(const RotaryTable<Scalar>* rope) {
  Checksum sum;
  sum.add(rope != nullptr);
  if (rope) sum.add(rope->head_dim()).add(rope->theta());
  return sum.value();
}

/// What every rank's CallFacts::replicated names the table by.
inline constexpr std::string_view rope_what = "the RoPE table (whether there is one, its d_k, θ)";

/// The table covers positions 0 … T − 1 of heads of `head_dim`: what apply_rope_into and
/// rope_backward_into would refuse, checked before a backward touches any gradient.
/// @throws ShapeError / Error as apply_rope.
template <class Scalar>
void check_rope_fits(std::string_view op, const RotaryTable<Scalar>& rope, index_t tokens,
                     index_t head_dim) {
  if (rope.head_dim() != head_dim) {
    throw ShapeError(dissect::detail::concat(op, ": the RoPE table is for d_k = ", rope.head_dim(),
                                             " but the heads have d_k = ", head_dim));
  }
  if (tokens > rope.max_positions()) {
    throw Error(dissect::detail::concat(op, ": positions 0 … ", tokens - 1,
                                        " are beyond the RoPE table's ", rope.max_positions(),
                                        " positions"));
  }
}

}  // namespace detail

// ---- ParallelAttention --------------------------------------------------------------------------

template <class Scalar>
index_t ParallelAttention<Scalar>::checked_split(const QKVProjection<Scalar>& qkv,
                                                 const AttentionOutput<Scalar>& out,
                                                 const Communicator& comm,
                                                 std::optional<double> score_scale) {
  constexpr std::string_view op = "ParallelAttention";
  return comm.agree(
      op,
      {.shapes = {qkv.d_model(), qkv.n_heads(), qkv.n_kv_heads(), out.d_model(), out.n_heads()},
       .shapes_what = "[D, H, H_kv] of qkv and [D, H] of the output projection",
       .replicated = {{"the score scale", detail::scale_checksum(score_scale)}}},
      [&] {
        if (qkv.d_model() != out.d_model() || qkv.n_heads() != out.n_heads()) {
          throw ConfigError(dissect::detail::concat(
              op, ": qkv has D = ", qkv.d_model(), ", H = ", qkv.n_heads(),
              " but the output projection has D = ", out.d_model(), ", H = ", out.n_heads()));
        }
        detail::even_share(op, "n_heads", qkv.n_heads(), comm.size());
        detail::even_share(op, "n_kv_heads", qkv.n_kv_heads(), comm.size());
        checked_scale(score_scale);
        return qkv.head_dim();
      });
}

template <class Scalar>
ParallelAttention<Scalar>::ParallelAttention(const QKVProjection<Scalar>& qkv,
                                             const AttentionOutput<Scalar>& out,
                                             const Communicator& comm,
                                             std::optional<double> score_scale)
    : comm_(&comm),
      n_heads_(qkv.n_heads()),
      n_kv_heads_(qkv.n_kv_heads()),
      head_dim_(checked_split(qkv, out, comm, score_scale)),
      score_scale_(checked_scale(score_scale)),
      // The fused rows are [q heads | k heads | v heads]: rank p takes its heads of each part.
      qkv_(qkv.qkv(), comm,
           std::array<index_t, 3>{n_heads_ * head_dim_, n_kv_heads_ * head_dim_,
                                  n_kv_heads_ * head_dim_}),
      // Merged heads put head h in features h·d_k …: rank p's heads are its D/P columns.
      proj_(out.proj(), comm) {}

template <class Scalar>
index_t ParallelAttention<Scalar>::checked_slices(const ColumnParallelLinear<Scalar>& qkv,
                                                  const RowParallelLinear<Scalar>& proj,
                                                  index_t n_heads, index_t n_kv_heads,
                                                  const Communicator& comm,
                                                  std::optional<double> score_scale) {
  constexpr std::string_view op = "ParallelAttention";
  return comm.agree(op,
                    {.shapes = {n_heads, n_kv_heads},
                     .shapes_what = "[H, H_kv]",
                     .replicated = {{"the score scale", detail::scale_checksum(score_scale)}}},
                    [&] {
                      const index_t d_model = proj.out_features();
                      if (n_heads <= 0 || n_kv_heads <= 0 || d_model % n_heads != 0 ||
                          n_heads % n_kv_heads != 0) {
                        throw ConfigError(dissect::detail::concat(
                            op, ": H = ", n_heads, " and H_kv = ", n_kv_heads,
                            " do not split D = ", d_model, " into heads"));
                      }
                      detail::even_share(op, "n_heads", n_heads, comm.size());
                      detail::even_share(op, "n_kv_heads", n_kv_heads, comm.size());
                      const index_t head_dim = d_model / n_heads;
                      if (qkv.in_features() != d_model || proj.in_features() != d_model ||
                          qkv.out_features() != (n_heads + 2 * n_kv_heads) * head_dim) {
                        throw ConfigError(dissect::detail::concat(
                            op, ": qkv maps ", qkv.in_features(), " → ", qkv.out_features(),
                            " and proj ", proj.in_features(), " → ", d_model,
                            ", which do not fit H = ", n_heads, ", H_kv = ", n_kv_heads));
                      }
                      checked_scale(score_scale);
                      return head_dim;
                    });
}

template <class Scalar>
ParallelAttention<Scalar>::ParallelAttention(ColumnParallelLinear<Scalar> qkv,
                                             RowParallelLinear<Scalar> proj, index_t n_heads,
                                             index_t n_kv_heads, const Communicator& comm,
                                             std::optional<double> score_scale)
    : comm_(&comm),
      n_heads_(n_heads),
      n_kv_heads_(n_kv_heads),
      head_dim_(checked_slices(qkv, proj, n_heads, n_kv_heads, comm, score_scale)),
      score_scale_(checked_scale(score_scale)),
      qkv_(std::move(qkv)),
      proj_(std::move(proj)) {}

template <class Scalar>
Tensor<Scalar, 3> ParallelAttention<Scalar>::forward(ConstTensorView<Scalar, 3> x, Cache& cache,
                                                     const RotaryTable<Scalar>* rope) const {
  // Everything before the all-reduce is local (a table too short on one rank throws there): it
  // runs inside the agreement, which also compares x and the table across ranks.
  auto y = comm_->agree("ParallelAttention::forward",
                        {.shapes = detail::shape_values(x),
                         .replicated = {{"x", detail::checksum_of(x)},
                                        {detail::rope_what, detail::rope_checksum(rope)}}},
                        [&] { return local_forward(x, cache, rope); });
  proj_.finish_forward(y);  // the one all-reduce
  return y;
}

template <class Scalar>
Tensor<Scalar, 3> ParallelAttention<Scalar>::local_forward(ConstTensorView<Scalar, 3> x,
                                                           Cache& cache,
                                                           const RotaryTable<Scalar>* rope) const {
  constexpr const char* op = "ParallelAttention::forward";
  check_block_tokens(op, "x", x, "D", d_model());
  const index_t batch = x.dim(0), tokens = x.dim(1), heads = local_heads(),
                kv_heads = local_kv_heads();
  const auto fused = qkv_.local().forward(x);  // [B, T, (H + 2·H_kv)/P·d_k]
  auto& [q, k, v] = cache.qkv;
  reuse_buffer(q, Shape<4>{batch, heads, tokens, head_dim_});
  reuse_buffer(k, Shape<4>{batch, kv_heads, tokens, head_dim_});
  reuse_buffer(v, Shape<4>{batch, kv_heads, tokens, head_dim_});
  dissect::detail::split_heads<Scalar>(fused, 0, q);
  dissect::detail::split_heads<Scalar>(fused, heads * head_dim_, k);
  dissect::detail::split_heads<Scalar>(fused, (heads + kv_heads) * head_dim_, v);
  if (rope) {  // positions are per token, the same for every head: local heads rotate alone
    apply_rope_into(q, q, 0, *rope);
    apply_rope_into(k, k, 0, *rope);
  }
  // [B, H/P, T, d_k], local; the cache keeps the scale for backward.
  const auto o = causal_attention(q, k, v, cache.attention, score_scale_);
  reuse_buffer(cache.merged, Shape<3>{batch, tokens, heads * head_dim_});
  dissect::detail::merge_heads<Scalar>(o, cache.merged, 0);
  return proj_.local().forward(cache.merged);  // this rank's partial product
}

template <class Scalar>
void ParallelAttention<Scalar>::check_backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                                               ConstTensorView<Scalar, 3> dy,
                                               const RotaryTable<Scalar>* rope) const {
  constexpr const char* op = "ParallelAttention::backward";
  const auto& [q, k, v] = cache.qkv;
  check_block_tokens(op, "x", x, "D", d_model());
  const index_t batch = x.dim(0), tokens = x.dim(1), heads = local_heads(),
                kv_heads = local_kv_heads();
  const auto x_text = format_shape(x.shape());
  check_block_shape(op, "dy", dy, "[B, T, D]", x.shape(), "x", x_text);
  check_block_shape(op, "cache.qkv.q", q, "[B, H/P, T, d_k]",
                    Shape<4>{batch, heads, tokens, head_dim_}, "x", x_text, block_cache_hint);
  const Shape<4> kv_shape{batch, kv_heads, tokens, head_dim_};
  check_block_shape(op, "cache.qkv.k", k, "[B, H_kv/P, T, d_k]", kv_shape, "x", x_text,
                    block_cache_hint);
  check_block_shape(op, "cache.qkv.v", v, "[B, H_kv/P, T, d_k]", kv_shape, "x", x_text,
                    block_cache_hint);
  check_block_shape(op, "cache.attention.probs", cache.attention.probs, "[B, H/P, T, T]",
                    Shape<4>{batch, heads, tokens, tokens}, "x", x_text, block_cache_hint);
  check_block_shape(op, "cache.merged", cache.merged, "[B, T, D/P]",
                    Shape<3>{batch, tokens, heads * head_dim_}, "x", x_text, block_cache_hint);
  if (rope) detail::check_rope_fits(op, *rope, tokens, head_dim_);
  detail::check_trainable(op, qkv_.local());
  detail::check_trainable(op, proj_.local());
}

template <class Scalar>
Tensor<Scalar, 3> ParallelAttention<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                      const Cache& cache,
                                                      ConstTensorView<Scalar, 3> dy,
                                                      const RotaryTable<Scalar>* rope) {
  const auto& [q, k, v] = cache.qkv;
  // Checks only (the table's fit too), agreed before any rank touches a gradient.
  comm_->agree("ParallelAttention::backward",
               {.shapes = detail::shape_values(x, dy, q, k, v, cache.attention.probs, cache.merged),
                .replicated = {{"x", detail::checksum_of(x)},
                               {"dy", detail::checksum_of(dy)},
                               {detail::rope_what, detail::rope_checksum(rope)}}},
               [&] { check_backward(x, cache, dy, rope); });
  const index_t batch = x.dim(0), tokens = x.dim(1), heads = local_heads(),
                kv_heads = local_kv_heads();
  const auto d_merged = proj_.backward_agreed(cache.merged, dy);  // [B, T, D/P], no communication
  auto d_out = Tensor<Scalar, 4>::uninitialized(q.shape());
  dissect::detail::split_heads<Scalar>(d_merged, 0, d_out);
  auto grads = causal_attention_backward(q, k, v, cache.attention, d_out);
  if (rope) {
    rope_backward_into(grads.q, grads.q, 0, *rope);
    rope_backward_into(grads.k, grads.k, 0, *rope);
  }
  auto d_fused = Tensor<Scalar, 3>::uninitialized({batch, tokens, qkv_.local_out_features()});
  dissect::detail::merge_heads<Scalar>(grads.q, d_fused, 0);
  dissect::detail::merge_heads<Scalar>(grads.k, d_fused, heads * head_dim_);
  dissect::detail::merge_heads<Scalar>(grads.v, d_fused, (heads + kv_heads) * head_dim_);
  auto dx = qkv_.backward_partial(x, d_fused);
  detail::all_reduce_tensor(*comm_, dx);  // the one all-reduce
  return dx;
}

}  // namespace dissect::parallel
