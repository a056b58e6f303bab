// dissect/parallel/parallel_feed_forward.hpp — tensor-parallel FFN and SwiGLU (Megatron-LM).
//
// Each block is built from the single-process block that every rank holds and keeps only its
// slice (or from the rank's slices alone, already cut): the first projections (up, and gate) are
// column-parallel, the activation is local, and down is row-parallel. So
// each forward makes exactly one all-reduce (of B·T·D values, in the row-parallel output) and each
// backward exactly one (of B·T·D values, dx), besides one small agreement per call
// (Communicator::agree: 88 bytes, and a checksum pass over x — and dy in backward — which must be
// the same on every rank). Forward runs all its local work, up to the all-reduce, inside the
// agreement; backward runs its checks there, so that a refusal on any rank leaves every rank's
// gradients untouched.
#pragma once

#include <array>
#include <optional>
#include <string_view>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/feed_forward.hpp"
#include "dissect/blocks/gated_feed_forward.hpp"
#include "dissect/core/error.hpp"
#include "dissect/parallel/communicator.hpp"
#include "dissect/parallel/parallel_linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

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
    visit_child(module_names::up, self.up_, visit);
    visit_child(module_names::down, self.down_, visit);
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
    visit_child(module_names::gate, self.gate_, visit);
    visit_child(module_names::up, self.up_, visit);
    visit_child(module_names::down, self.down_, visit);
  }

  const Communicator* comm_;
  ColumnParallelLinear<Scalar> gate_, up_;
  RowParallelLinear<Scalar> down_;
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
  // Everything before the all-reduce is local: it runs inside the agreement.
  auto y = comm_->agree(
      op, {.shapes = detail::shape_values(x), .replicated = {{"x", detail::checksum_of(x)}}}, [&] {
        check_block_tokens(op, "x", x, "D", d_model());
        forward_into_cache(up_.local(), x, cache.hidden);
        reuse_buffer(cache.activated, cache.hidden.shape());
        activate_into(cache.hidden, cache.activated, activation_);
        return down_.local().forward(cache.activated);  // this rank's partial product
      });
  down_.finish_forward(y);  // the one all-reduce
  return y;
}

template <class Scalar>
Tensor<Scalar, 3> ParallelFeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                        const Cache& cache,
                                                        ConstTensorView<Scalar, 3> dy) {
  constexpr const char* op = "ParallelFeedForward::backward";
  // Checks only, agreed before any rank touches a gradient.
  comm_->agree(op,
               {.shapes = detail::shape_values(x, dy, cache.hidden, cache.activated),
                .replicated = {{"x", detail::checksum_of(x)}, {"dy", detail::checksum_of(dy)}}},
               [&] {
                 check_ffn_backward<Scalar>(
                     op, d_model(), up_.local_out_features(), x, dy,
                     {{"cache.hidden", cache.hidden}, {"cache.activated", cache.activated}});
                 detail::check_trainable(op, up_.local());
                 detail::check_trainable(op, down_.local());
               });
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
  auto y = comm_->agree(
      op, {.shapes = detail::shape_values(x), .replicated = {{"x", detail::checksum_of(x)}}}, [&] {
        check_block_tokens(op, "x", x, "D", d_model());
        forward_into_cache(gate_.local(), x, cache.gate);
        forward_into_cache(up_.local(), x, cache.up);
        reuse_buffer(cache.hidden, cache.gate.shape());
        swiglu_into<Scalar>(cache.gate, cache.up, cache.hidden);
        return down_.local().forward(cache.hidden);  // this rank's partial product
      });
  down_.finish_forward(y);  // the one all-reduce
  return y;
}

template <class Scalar>
Tensor<Scalar, 3> ParallelGatedFeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                             const Cache& cache,
                                                             ConstTensorView<Scalar, 3> dy) {
  constexpr const char* op = "ParallelGatedFeedForward::backward";
  comm_->agree(
      op,
      {.shapes = detail::shape_values(x, dy, cache.gate, cache.up, cache.hidden),
       .replicated = {{"x", detail::checksum_of(x)}, {"dy", detail::checksum_of(dy)}}},
      [&] {
        check_ffn_backward<Scalar>(
            op, d_model(), up_.local_out_features(), x, dy,
            {{"cache.gate", cache.gate}, {"cache.up", cache.up}, {"cache.hidden", cache.hidden}});
        for (const auto* part : {&gate_.local(), &up_.local(), &down_.local()}) {
          detail::check_trainable(op, *part);
        }
      });
  // As GatedFeedForward::backward, on this rank's F/P features.
  auto d_gate = down_.backward_agreed(cache.hidden, dy);  // d hidden: [B, T, F/P]
  auto d_up = Tensor<Scalar, 3>::uninitialized(d_gate.shape());
  swiglu_backward_into<Scalar>(cache.gate, cache.up, d_gate, d_up);
  auto dx = gate_.backward_partial(x, d_gate);
  dx.vector() += up_.backward_partial(x, d_up).vector();
  detail::all_reduce_tensor(*comm_, dx);  // the one all-reduce, of the sum of both terms
  return dx;
}

}  // namespace dissect::parallel
