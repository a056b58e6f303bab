// dissect/parallel/parallel_blocks.hpp — tensor-parallel FFN, SwiGLU and attention (Megatron-LM).
//
// Each block is built from the single-process block that every rank holds and keeps only its
// slice (or from the rank's slices alone, already cut): the first projections are column-parallel
// (the FFN's up and gate; attention's fused QKV, split by heads), the work in between is local (the
// activation; causal attention over this rank's H/P query heads and H_kv/P key/value heads), and
// the last projection is row-parallel. So each forward makes exactly one all-reduce (of B·T·D
// values, in the row-parallel output) and each backward exactly one (of B·T·D values, dx), besides
// one small agreement on shapes per call.
#pragma once

#include <array>
#include <string_view>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/activation.hpp"
#include "dissect/attention.hpp"
#include "dissect/blocks/attention_output.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/feed_forward.hpp"
#include "dissect/blocks/gated_feed_forward.hpp"
#include "dissect/blocks/qkv_projection.hpp"
#include "dissect/detail/heads.hpp"
#include "dissect/error.hpp"
#include "dissect/module.hpp"
#include "dissect/parallel/communicator.hpp"
#include "dissect/parallel/parallel_linear.hpp"
#include "dissect/rope.hpp"
#include "dissect/tensor.hpp"

namespace dissect::parallel {

// ---- declarations -------------------------------------------------------------------------------

/// GPT-2's MLP split over the ranks: up column-parallel (F/P features per rank), the activation
/// local, down row-parallel. Parameter names are FeedForward's ("up.weight", …), holding slices.
template <class Scalar>
class ParallelFeedForward : public ComposedModule<ParallelFeedForward<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// What backward needs from forward: this rank's slices, [B, T, F/P] each.
  struct Cache {
    Tensor<Scalar, 3> hidden;     ///< up_p(x)
    Tensor<Scalar, 3> activated;  ///< f(hidden)
  };

  /// Rank p's slices of `full`. A collective; `comm` must outlive the block.
  /// @throws ConfigError (every rank) if P does not divide d_ff; ShapeError if the ranks' blocks
  ///         differ in shape.
  ParallelFeedForward(const FeedForward<Scalar>& full, const Communicator& comm);
  /// From slices already split (load_parallel_layer reads them from a checkpoint).
  /// @throws ConfigError if up and down do not fit together.
  ParallelFeedForward(ColumnParallelLinear<Scalar> up, RowParallelLinear<Scalar> down,
                      Activation activation, const Communicator& comm);

  index_t d_model() const { return up_.in_features(); }
  index_t d_ff() const { return up_.out_features(); }
  Activation activation() const { return activation_; }
  ColumnParallelLinear<Scalar>& up() { return up_; }
  const ColumnParallelLinear<Scalar>& up() const { return up_; }
  RowParallelLinear<Scalar>& down() { return down_; }
  const RowParallelLinear<Scalar>& down() const { return down_; }

  /// x: [B, T, D] (the same on every rank) → y: [B, T, D], the same on every rank.
  /// @throws ShapeError (every rank) if x differs across ranks or is not [B, T, D].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x) const {
    Cache scratch;
    return forward(x, scratch);
  }
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const;

  /// x, cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D] (all-reduced); adds to this
  /// rank's slices of the gradients. @throws ShapeError (every rank, gradients untouched).
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy);

 private:
  friend class ComposedModule<ParallelFeedForward>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child("up", self.up_, visit);
    visit_child("down", self.down_, visit);
  }

  const Communicator* comm_;
  Activation activation_;
  ColumnParallelLinear<Scalar> up_;
  RowParallelLinear<Scalar> down_;
};

/// LLaMA's SwiGLU split over the ranks: gate and up column-parallel, silu(gate) ⊙ up local, down
/// row-parallel. Names "gate.weight", "up.weight", "down.weight" (and biases), holding slices.
template <class Scalar>
class ParallelGatedFeedForward : public ComposedModule<ParallelGatedFeedForward<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// This rank's slices, [B, T, F/P] each.
  struct Cache {
    Tensor<Scalar, 3> gate;    ///< gate_p(x)
    Tensor<Scalar, 3> up;      ///< up_p(x)
    Tensor<Scalar, 3> hidden;  ///< silu(gate) ⊙ up
  };

  /// @throws as ParallelFeedForward's.
  ParallelGatedFeedForward(const GatedFeedForward<Scalar>& full, const Communicator& comm);
  /// From slices already split. @throws ConfigError if the three do not fit together.
  ParallelGatedFeedForward(ColumnParallelLinear<Scalar> gate, ColumnParallelLinear<Scalar> up,
                           RowParallelLinear<Scalar> down, const Communicator& comm);

  index_t d_model() const { return up_.in_features(); }
  index_t d_ff() const { return up_.out_features(); }
  ColumnParallelLinear<Scalar>& gate() { return gate_; }
  const ColumnParallelLinear<Scalar>& gate() const { return gate_; }
  ColumnParallelLinear<Scalar>& up() { return up_; }
  const ColumnParallelLinear<Scalar>& up() const { return up_; }
  RowParallelLinear<Scalar>& down() { return down_; }
  const RowParallelLinear<Scalar>& down() const { return down_; }

  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x) const {
    Cache scratch;
    return forward(x, scratch);
  }
  /// As ParallelFeedForward::forward.
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const;
  /// As ParallelFeedForward::backward: dx = Σ_p (d gate_p·W_gate,p + d up_p·W_up,p), one
  /// all-reduce of the sum.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy);

 private:
  friend class ComposedModule<ParallelGatedFeedForward>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child("gate", self.gate_, visit);
    visit_child("up", self.up_, visit);
    visit_child("down", self.down_, visit);
  }

  const Communicator* comm_;
  ColumnParallelLinear<Scalar> gate_, up_;
  RowParallelLinear<Scalar> down_;
};

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

  /// A collective; `comm` must outlive the block.
  /// @throws ConfigError (every rank) if P does not divide H or H_kv, or the two blocks differ in
  ///         D or H; ShapeError if the ranks' blocks differ in shape.
  ParallelAttention(const QKVProjection<Scalar>& qkv, const AttentionOutput<Scalar>& out,
                    const Communicator& comm);
  /// From slices already split: `qkv` holds this rank's heads of q, k and v (its parts
  /// [H·d_k, H_kv·d_k, H_kv·d_k]), `proj` its D/P columns. @throws ConfigError (every rank) if P
  /// does not divide H or H_kv, H does not divide D or the slices do not fit the heads.
  ParallelAttention(ColumnParallelLinear<Scalar> qkv, RowParallelLinear<Scalar> proj,
                    index_t n_heads, index_t n_kv_heads, const Communicator& comm);

  index_t d_model() const { return proj_.out_features(); }
  index_t n_heads() const { return n_heads_; }
  index_t n_kv_heads() const { return n_kv_heads_; }
  index_t head_dim() const { return head_dim_; }
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

 private:
  friend class ComposedModule<ParallelAttention>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child("qkv", self.qkv_, visit);
    visit_child("proj", self.proj_, visit);
  }

  static index_t checked_split(const QKVProjection<Scalar>& qkv, const AttentionOutput<Scalar>& out,
                               const Communicator& comm);
  static index_t checked_slices(const ColumnParallelLinear<Scalar>& qkv,
                                const RowParallelLinear<Scalar>& proj, index_t n_heads,
                                index_t n_kv_heads, const Communicator& comm);

  const Communicator* comm_;
  index_t n_heads_, n_kv_heads_, head_dim_;
  ColumnParallelLinear<Scalar> qkv_;
  RowParallelLinear<Scalar> proj_;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// All-reduces a tensor in place: the block's one backward communication.
template <class Scalar, std::size_t Rank>
void all_reduce_tensor(const Communicator& comm, Tensor<Scalar, Rank>& tensor) {
  comm.all_reduce_sum(std::span<Scalar>(tensor.data(), static_cast<std::size_t>(tensor.size())));
}

}  // namespace detail

// ---- ParallelFeedForward ------------------------------------------------------------------------

template <class Scalar>
ParallelFeedForward<Scalar>::ParallelFeedForward(const FeedForward<Scalar>& full,
                                                 const Communicator& comm)
    : comm_(&comm),
      activation_(full.activation()),
      up_(full.up(), comm),
      down_(full.down(), comm) {}

namespace detail {

/// A column-parallel and a row-parallel half fit: D → F → D.
template <class Scalar>
void check_halves(std::string_view op, const ColumnParallelLinear<Scalar>& first,
                  const RowParallelLinear<Scalar>& last) {
  if (first.out_features() != last.in_features() || first.in_features() != last.out_features()) {
    throw ConfigError(dissect::detail::concat(op, ": the column-parallel half maps ",
                                              first.in_features(), " → ", first.out_features(),
                                              " features but the row-parallel half maps ",
                                              last.in_features(), " → ", last.out_features()));
  }
}

}  // namespace detail

template <class Scalar>
ParallelFeedForward<Scalar>::ParallelFeedForward(ColumnParallelLinear<Scalar> up,
                                                 RowParallelLinear<Scalar> down,
                                                 Activation activation, const Communicator& comm)
    : comm_(&comm), activation_(activation), up_(std::move(up)), down_(std::move(down)) {
  detail::check_halves("ParallelFeedForward", up_, down_);
}

template <class Scalar>
Tensor<Scalar, 3> ParallelFeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x,
                                                       Cache& cache) const {
  constexpr const char* op = "ParallelFeedForward::forward";
  detail::agree_shapes(*comm_, op, x);
  check_block_tokens(op, "x", x, "D", d_model());
  forward_into_cache(up_.local(), x, cache.hidden);
  reuse_buffer(cache.activated, cache.hidden.shape());
  activate_into(cache.hidden, cache.activated, activation_);
  return down_.forward_agreed(cache.activated);  // the one all-reduce
}

template <class Scalar>
Tensor<Scalar, 3> ParallelFeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                        const Cache& cache,
                                                        ConstTensorView<Scalar, 3> dy) {
  constexpr const char* op = "ParallelFeedForward::backward";
  detail::agree_shapes(*comm_, op, x, dy, cache.hidden, cache.activated);
  check_ffn_backward<Scalar>(
      op, d_model(), up_.local_out_features(), x, dy,
      {{"cache.hidden", cache.hidden}, {"cache.activated", cache.activated}});
  auto d_hidden = down_.backward_agreed(cache.activated, dy);             // [B, T, F/P]
  activate_backward_into(cache.hidden, d_hidden, d_hidden, activation_);  // in place
  auto dx = up_.backward_partial(x, d_hidden);                            // this rank's term
  detail::all_reduce_tensor(*comm_, dx);                                  // the one all-reduce
  return dx;
}

// ---- ParallelGatedFeedForward -------------------------------------------------------------------

template <class Scalar>
ParallelGatedFeedForward<Scalar>::ParallelGatedFeedForward(const GatedFeedForward<Scalar>& full,
                                                           const Communicator& comm)
    : comm_(&comm), gate_(full.gate(), comm), up_(full.up(), comm), down_(full.down(), comm) {}

template <class Scalar>
ParallelGatedFeedForward<Scalar>::ParallelGatedFeedForward(ColumnParallelLinear<Scalar> gate,
                                                           ColumnParallelLinear<Scalar> up,
                                                           RowParallelLinear<Scalar> down,
                                                           const Communicator& comm)
    : comm_(&comm), gate_(std::move(gate)), up_(std::move(up)), down_(std::move(down)) {
  detail::check_halves("ParallelGatedFeedForward", gate_, down_);
  detail::check_halves("ParallelGatedFeedForward", up_, down_);
}

template <class Scalar>
Tensor<Scalar, 3> ParallelGatedFeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x,
                                                            Cache& cache) const {
  constexpr const char* op = "ParallelGatedFeedForward::forward";
  detail::agree_shapes(*comm_, op, x);
  check_block_tokens(op, "x", x, "D", d_model());
  forward_into_cache(gate_.local(), x, cache.gate);
  forward_into_cache(up_.local(), x, cache.up);
  reuse_buffer(cache.hidden, cache.gate.shape());
  swiglu_into<Scalar>(cache.gate, cache.up, cache.hidden);
  return down_.forward_agreed(cache.hidden);  // the one all-reduce
}

template <class Scalar>
Tensor<Scalar, 3> ParallelGatedFeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                             const Cache& cache,
                                                             ConstTensorView<Scalar, 3> dy) {
  constexpr const char* op = "ParallelGatedFeedForward::backward";
  detail::agree_shapes(*comm_, op, x, dy, cache.gate, cache.up, cache.hidden);
  check_ffn_backward<Scalar>(
      op, d_model(), up_.local_out_features(), x, dy,
      {{"cache.gate", cache.gate}, {"cache.up", cache.up}, {"cache.hidden", cache.hidden}});
  // As GatedFeedForward::backward, on this rank's F/P features.
  auto d_gate = down_.backward_agreed(cache.hidden, dy);  // d hidden: [B, T, F/P]
  auto d_up = Tensor<Scalar, 3>::uninitialized(d_gate.shape());
  swiglu_backward_into<Scalar>(cache.gate, cache.up, d_gate, d_up);
  auto dx = gate_.backward_partial(x, d_gate);
  dx.vector() += up_.backward_partial(x, d_up).vector();
  detail::all_reduce_tensor(*comm_, dx);  // the one all-reduce, of the sum of both terms
  return dx;
}

// ---- ParallelAttention --------------------------------------------------------------------------

template <class Scalar>
index_t ParallelAttention<Scalar>::checked_split(const QKVProjection<Scalar>& qkv,
                                                 const AttentionOutput<Scalar>& out,
                                                 const Communicator& comm) {
  constexpr std::string_view op = "ParallelAttention";
  const std::int64_t layout[5] = {qkv.d_model(), qkv.n_heads(), qkv.n_kv_heads(), out.d_model(),
                                  out.n_heads()};
  comm.agree(op, layout, "[D, H, H_kv] of qkv and [D, H] of the output projection");
  if (qkv.d_model() != out.d_model() || qkv.n_heads() != out.n_heads()) {
    throw ConfigError(dissect::detail::concat(
        op, ": qkv has D = ", qkv.d_model(), ", H = ", qkv.n_heads(),
        " but the output projection has D = ", out.d_model(), ", H = ", out.n_heads()));
  }
  detail::even_share(op, "n_heads", qkv.n_heads(), comm.size());
  detail::even_share(op, "n_kv_heads", qkv.n_kv_heads(), comm.size());
  return qkv.head_dim();
}

template <class Scalar>
ParallelAttention<Scalar>::ParallelAttention(const QKVProjection<Scalar>& qkv,
                                             const AttentionOutput<Scalar>& out,
                                             const Communicator& comm)
    : comm_(&comm),
      n_heads_(qkv.n_heads()),
      n_kv_heads_(qkv.n_kv_heads()),
      head_dim_(checked_split(qkv, out, comm)),
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
                                                  const Communicator& comm) {
  constexpr std::string_view op = "ParallelAttention";
  const std::int64_t heads[2] = {n_heads, n_kv_heads};
  comm.agree(op, heads, "[H, H_kv]");
  const index_t d_model = proj.out_features();
  if (n_heads <= 0 || n_kv_heads <= 0 || d_model % n_heads != 0 || n_heads % n_kv_heads != 0) {
    throw ConfigError(dissect::detail::concat(op, ": H = ", n_heads, " and H_kv = ", n_kv_heads,
                                              " do not split D = ", d_model, " into heads"));
  }
  detail::even_share(op, "n_heads", n_heads, comm.size());
  detail::even_share(op, "n_kv_heads", n_kv_heads, comm.size());
  const index_t head_dim = d_model / n_heads;
  if (qkv.in_features() != d_model || proj.in_features() != d_model ||
      qkv.out_features() != (n_heads + 2 * n_kv_heads) * head_dim) {
    throw ConfigError(dissect::detail::concat(op, ": qkv maps ", qkv.in_features(), " → ",
                                              qkv.out_features(), " and proj ", proj.in_features(),
                                              " → ", d_model, ", which do not fit H = ", n_heads,
                                              ", H_kv = ", n_kv_heads));
  }
  return head_dim;
}

template <class Scalar>
ParallelAttention<Scalar>::ParallelAttention(ColumnParallelLinear<Scalar> qkv,
                                             RowParallelLinear<Scalar> proj, index_t n_heads,
                                             index_t n_kv_heads, const Communicator& comm)
    : comm_(&comm),
      n_heads_(n_heads),
      n_kv_heads_(n_kv_heads),
      head_dim_(checked_slices(qkv, proj, n_heads, n_kv_heads, comm)),
      qkv_(std::move(qkv)),
      proj_(std::move(proj)) {}

template <class Scalar>
Tensor<Scalar, 3> ParallelAttention<Scalar>::forward(ConstTensorView<Scalar, 3> x, Cache& cache,
                                                     const RotaryTable<Scalar>* rope) const {
  constexpr const char* op = "ParallelAttention::forward";
  detail::agree_shapes(*comm_, op, x);
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
  const auto o = causal_attention(q, k, v, cache.attention);  // [B, H/P, T, d_k], local
  reuse_buffer(cache.merged, Shape<3>{batch, tokens, heads * head_dim_});
  dissect::detail::merge_heads<Scalar>(o, cache.merged, 0);
  return proj_.forward_agreed(cache.merged);  // the one all-reduce
}

template <class Scalar>
Tensor<Scalar, 3> ParallelAttention<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                      const Cache& cache,
                                                      ConstTensorView<Scalar, 3> dy,
                                                      const RotaryTable<Scalar>* rope) {
  constexpr const char* op = "ParallelAttention::backward";
  const auto& [q, k, v] = cache.qkv;
  detail::agree_shapes(*comm_, op, x, dy, q, k, v, cache.attention.probs, cache.merged);
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
