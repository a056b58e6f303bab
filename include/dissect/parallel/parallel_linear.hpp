// dissect/parallel/parallel_linear.hpp — Linear split across the ranks of a Communicator.
//
// Megatron-LM's two halves of a tensor-parallel product, each built from a full Linear that
// every rank holds (same values on every rank: each keeps only its slice), or from the rank's
// slice alone (read from a checkpoint: load_parallel_layer), checked against the full shape:
// - ColumnParallelLinear: rank p keeps rows [p·out/P, (p+1)·out/P) of W and b, so y_p = x·W_pᵀ +
// b_p
//   is its slice of y's last axis. Forward needs no communication; backward all-reduces
//   dx = Σ_p dy_p·W_p (Megatron's f: identity forward, all-reduce backward).
// - RowParallelLinear: rank p keeps columns [p·in/P, (p+1)·in/P) of W and takes its slice of x's
//   last axis; the partial products are all-reduced and the (replicated) bias added once after.
//   Backward dx_p = dy·W_p needs no communication (Megatron's g).
// Splits must be even: a feature count that P does not divide is a ConfigError on every rank.
// Every public call that takes tensors first agree()s on their shapes, so ranks that disagree
// all throw the same ShapeError instead of hanging in a collective.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "dissect/error.hpp"
#include "dissect/linear.hpp"
#include "dissect/module.hpp"
#include "dissect/parallel/communicator.hpp"
#include "dissect/tensor.hpp"

namespace dissect::parallel {

// ---- declarations -------------------------------------------------------------------------------

/// y_p = x·W_pᵀ + b_p with W_p rows [p·out/P, (p+1)·out/P) of the full W: x [..., in] →
/// y_p [..., out/P], rank p's slice of y's last axis.
template <class Scalar>
class ColumnParallelLinear : public ParameterMethods<ColumnParallelLinear<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// Rank p's rows of `full`. A collective: every rank of `comm` constructs at once, and `comm`
  /// must outlive the layer. @throws ShapeError if the ranks' full layers differ in shape;
  /// ConfigError (every rank) if P does not divide out_features or `full` has a LoRA adapter.
  ColumnParallelLinear(const Linear<Scalar>& full, const Communicator& comm);

  /// For a fused output made of consecutive parts (QKV's q, k and v): the widths `parts` sum to
  /// out_features and rank p takes its even share of each part, in order.
  /// @throws as above, ConfigError if the parts do not sum to out_features or one of them does
  ///         not divide by P.
  ColumnParallelLinear(const Linear<Scalar>& full, const Communicator& comm,
                       std::span<const index_t> parts);

  /// From this rank's slice already cut (read from a checkpoint, say): `local` holds rank p's
  /// rows, as the constructors above would take them, of a full layer with `out_features` rows
  /// (made of `parts`, as above; empty for one part). Only the slice is ever in memory. A
  /// collective: the full shape is agreed across ranks.
  /// @throws ShapeError (every rank) if the ranks disagree about the full shape or `local` does
  ///         not have this rank's share of rows; ConfigError as above.
  ColumnParallelLinear(Linear<Scalar> local, index_t out_features, const Communicator& comm,
                       std::span<const index_t> parts = {});

  index_t in_features() const { return local_.in_features(); }
  /// Of the full layer; this rank holds local_out_features() = out_features()/P of them.
  index_t out_features() const { return out_features_; }
  index_t local_out_features() const { return local_.out_features(); }
  bool has_bias() const { return local_.has_bias(); }
  const Communicator& communicator() const { return *comm_; }
  /// This rank's slice as a Linear [in] → [out/P].
  Linear<Scalar>& local() { return local_; }
  const Linear<Scalar>& local() const { return local_; }

  /// "weight" [out/P, in] and "bias" [out/P]: the full layer's names, this rank's slices.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    local_.for_each_parameter(visit);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    local_.for_each_parameter(visit);
  }

  /// x: [..., in] (the same on every rank) → y_p: [..., out/P]. No data moves between ranks.
  /// @throws ShapeError (every rank) if the ranks' x shapes differ or x does not fit.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;

  /// x: [..., in], dy_p: [..., out/P] → dx = Σ_p dy_p·W_p: [..., in], the same on every rank
  /// (one all-reduce of x.size() values); adds dy_pᵀ·x to this rank's dW_p and Σ dy_p to db_p.
  /// @throws ShapeError (every rank, gradients untouched) if shapes differ across ranks or do not
  ///         fit; CommunicationError.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const DY& dy);

  /// As backward without the all-reduce or the agreement: returns this rank's term dy_p·W_p, for
  /// blocks that sum several terms before one all-reduce. Not a collective.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward_partial(const X& x, const DY& dy) {
    return local_.backward(x, dy);
  }

 private:
  const Communicator* comm_;
  index_t out_features_;
  Linear<Scalar> local_;
};

/// y = Σ_p x_p·W_pᵀ + b with W_p columns [p·in/P, (p+1)·in/P) of the full W and x_p rank p's
/// slice of x's last axis: x_p [..., in/P] → y [..., out], the same on every rank.
template <class Scalar>
class RowParallelLinear : public ParameterMethods<RowParallelLinear<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// Rank p's columns of `full`; the bias is replicated. A collective, as ColumnParallelLinear's.
  /// @throws ShapeError if the ranks' full layers differ in shape; ConfigError (every rank) if P
  ///         does not divide in_features or `full` has a LoRA adapter.
  RowParallelLinear(const Linear<Scalar>& full, const Communicator& comm);

  /// From this rank's slice already cut: `local` (no bias) holds rank p's columns of a full
  /// layer with `in_features` columns, `bias` the whole [out] bias (replicated) or none. A
  /// collective, as above.
  /// @throws ShapeError (every rank) if the ranks disagree about the full shape, `local` does not
  ///         have this rank's share of columns or the bias is not [out]; ConfigError if P does not
  ///         divide in_features or `local` has a bias or an adapter.
  RowParallelLinear(Linear<Scalar> local, std::optional<Tensor<Scalar, 1>> bias,
                    index_t in_features, const Communicator& comm);

  /// Of the full layer; this rank holds local_in_features() = in_features()/P columns.
  index_t in_features() const { return in_features_; }
  index_t local_in_features() const { return local_.in_features(); }
  index_t out_features() const { return local_.out_features(); }
  bool has_bias() const { return has_bias_; }
  const Communicator& communicator() const { return *comm_; }
  /// This rank's columns as a bias-free Linear [in/P] → [out].
  Linear<Scalar>& local() { return local_; }
  const Linear<Scalar>& local() const { return local_; }

  /// "weight" [out, in/P] (this rank's columns) and "bias" [out] (whole, replicated: its gradient
  /// is the same on every rank).
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    local_.for_each_parameter(visit);
    if (has_bias_) visit(ParameterName("bias"), bias_.view(), bias_grad_.view());
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    local_.for_each_parameter(visit);
    if (has_bias_) visit(ParameterName("bias"), bias_.cview(), bias_grad_.cview());
  }

  /// x_p: [..., in/P] → y: [..., out], one all-reduce of y.size() values.
  /// @throws ShapeError (every rank) if shapes differ across ranks or do not fit;
  ///         CommunicationError.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;

  /// x_p: [..., in/P], dy: [..., out] (the same on every rank) → dx_p = dy·W_p: [..., in/P], no
  /// data moved; adds dyᵀ·x_p to dW_p and Σ dy to db. @throws ShapeError (every rank, gradients
  /// untouched) if shapes differ across ranks or do not fit.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const DY& dy);

 private:
  template <class BlockScalar>
  friend class ParallelFeedForward;
  template <class BlockScalar>
  friend class ParallelGatedFeedForward;
  template <class BlockScalar>
  friend class ParallelAttention;

  /// forward and backward after the caller agreed on the shapes.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward_agreed(const X& x) const;
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward_agreed(const X& x, const DY& dy);

  const Communicator* comm_;
  index_t in_features_;
  bool has_bias_;
  Linear<Scalar> local_;
  Tensor<Scalar, 1> bias_;  // [out], or [0] without a bias
  Tensor<Scalar, 1> bias_grad_;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// The shapes of several tensors, one after another with their ranks, for Communicator::agree.
template <TensorLike... Xs>
std::vector<std::int64_t> shape_values(const Xs&... tensors) {
  std::vector<std::int64_t> values;
  const auto append = [&](const auto& tensor) {
    const auto shape = const_view(tensor).shape();
    values.push_back(static_cast<std::int64_t>(shape.size()));
    values.insert(values.end(), shape.begin(), shape.end());
  };
  (append(tensors), ...);
  return values;
}

template <TensorLike... Xs>
void agree_shapes(const Communicator& comm, std::string_view op, const Xs&... tensors) {
  comm.agree(op, shape_values(tensors...), "the shapes of their inputs");
}

/// count / P, or a ConfigError naming `what` (the same on every rank, since count and P are).
inline index_t even_share(std::string_view op, std::string_view what, index_t count, int ranks) {
  if (count % ranks != 0) {
    throw ConfigError(
        dissect::detail::concat(op, ": ", what, " = ", count, " does not divide evenly over ",
                                ranks, " ranks (uneven tensor-parallel splits are not supported)"));
  }
  return count / ranks;
}

/// The full layer's [out, in, bias] agreed across ranks, and no adapter.
template <class Scalar>
void agree_full_layer(std::string_view op, const Linear<Scalar>& full, const Communicator& comm) {
  const std::int64_t layout[3] = {full.out_features(), full.in_features(), full.has_bias()};
  comm.agree(op, layout, "the full layer's [out_features, in_features, bias]");
  // Adapter state may differ per rank only by a user's mistake; agree on it too.
  const std::int64_t adapter = full.has_adapter();
  comm.agree(op, std::span<const std::int64_t>(&adapter, 1), "whether the layer has an adapter");
  if (adapter) {
    throw ConfigError(dissect::detail::concat(
        op, ": the layer has a LoRA adapter; merge or detach it before splitting"));
  }
}

}  // namespace detail

template <class Scalar>
ColumnParallelLinear<Scalar>::ColumnParallelLinear(const Linear<Scalar>& full,
                                                   const Communicator& comm)
    : ColumnParallelLinear(full, comm, std::span<const index_t>()) {}

namespace detail {

/// The widths of the fused output's parts (one part if `parts` is empty), agreed across ranks,
/// each divisible by P, summing to out_features; returns them and sets `local_rows` to this
/// rank's share.
inline std::vector<index_t> column_parts(std::string_view op, index_t out_features,
                                         const Communicator& comm, std::span<const index_t> parts,
                                         index_t& local_rows) {
  std::vector<index_t> widths(parts.begin(), parts.end());
  if (widths.empty()) widths.push_back(out_features);
  const std::vector<std::int64_t> agreed(widths.begin(), widths.end());
  comm.agree(op, agreed, "the parts of the fused output");
  index_t total = 0;
  local_rows = 0;
  for (index_t width : widths) {
    total += width;
    local_rows +=
        even_share(op, widths.size() == 1 ? "out_features" : "a part's width", width, comm.size());
  }
  if (total != out_features) {
    throw ConfigError(dissect::detail::concat(op, ": the parts sum to ", total,
                                              " but out_features is ", out_features));
  }
  return widths;
}

/// Rank p's share of each part of `full`'s rows, stacked in part order, as a Linear.
template <class Scalar>
Linear<Scalar> column_slice(const Linear<Scalar>& full, const Communicator& comm,
                            std::span<const index_t> parts) {
  constexpr std::string_view op = "ColumnParallelLinear";
  agree_full_layer(op, full, comm);
  index_t local_rows = 0;
  const auto widths = column_parts(op, full.out_features(), comm, parts, local_rows);
  Tensor<Scalar, 2> weight({local_rows, full.in_features()});
  std::optional<Tensor<Scalar, 1>> bias;
  if (full.has_bias()) bias.emplace(Shape<1>{local_rows});
  index_t part_start = 0, row = 0;
  for (index_t width : widths) {
    const index_t share = width / comm.size();
    const index_t first = part_start + comm.rank() * share;
    weight.matrix().middleRows(row, share) = full.weight().matrix().middleRows(first, share);
    if (bias) bias->vector().segment(row, share) = full.bias().vector().segment(first, share);
    part_start += width;
    row += share;
  }
  return Linear<Scalar>(std::move(weight), std::move(bias));
}

/// A slice cut elsewhere, checked against the full shape agreed across ranks. Every check that
/// can fail on one rank only is agreed first, so all ranks throw together.
template <class Scalar>
Linear<Scalar> checked_column_slice(Linear<Scalar> local, index_t out_features,
                                    const Communicator& comm, std::span<const index_t> parts) {
  constexpr std::string_view op = "ColumnParallelLinear";
  const std::int64_t layout[4] = {out_features, local.in_features(), local.has_bias(),
                                  local.has_adapter()};
  comm.agree(op, layout, "the full layer's [out_features, in_features, bias, adapter]");
  if (local.has_adapter()) {
    throw ConfigError(dissect::detail::concat(
        op, ": the slice has a LoRA adapter; merge or detach it before splitting"));
  }
  index_t local_rows = 0;
  column_parts(op, out_features, comm, parts, local_rows);
  const std::int64_t rows = local.out_features();
  comm.agree(op, std::span<const std::int64_t>(&rows, 1), "the rows of their slices");
  if (rows != local_rows) {
    throw ShapeError(dissect::detail::concat(op, ": the slice has ", rows,
                                             " rows but a rank's share of ", out_features, " over ",
                                             comm.size(), " ranks is ", local_rows));
  }
  return local;
}

/// Rank p's columns [p·in/P, (p+1)·in/P) of `full`'s weight, as a bias-free Linear.
template <class Scalar>
Linear<Scalar> row_slice(const Linear<Scalar>& full, const Communicator& comm) {
  constexpr std::string_view op = "RowParallelLinear";
  agree_full_layer(op, full, comm);
  const index_t share = even_share(op, "in_features", full.in_features(), comm.size());
  Tensor<Scalar, 2> weight({full.out_features(), share});
  weight.matrix() = full.weight().matrix().middleCols(comm.rank() * share, share);
  return Linear<Scalar>(std::move(weight));
}

/// A row-parallel slice cut elsewhere, checked as checked_column_slice; `bias_size` is −1 for
/// none.
template <class Scalar>
Linear<Scalar> checked_row_slice(Linear<Scalar> local, index_t bias_size, index_t in_features,
                                 const Communicator& comm) {
  constexpr std::string_view op = "RowParallelLinear";
  const std::int64_t layout[5] = {in_features, local.out_features(), local.in_features(), bias_size,
                                  local.has_bias() || local.has_adapter()};
  comm.agree(op, layout,
             "the full layer's [in_features, out_features], the slice's columns and the bias");
  if (layout[4]) {
    throw ConfigError(dissect::detail::concat(
        op, ": the slice must be a plain bias-free Linear (pass the bias separately)"));
  }
  const index_t share = even_share(op, "in_features", in_features, comm.size());
  if (local.in_features() != share) {
    throw ShapeError(dissect::detail::concat(op, ": the slice has ", local.in_features(),
                                             " columns but a rank's share of ", in_features,
                                             " over ", comm.size(), " ranks is ", share));
  }
  if (bias_size >= 0 && bias_size != local.out_features()) {
    throw ShapeError(dissect::detail::concat(op, ": the bias has ", bias_size,
                                             " values but out_features is ", local.out_features()));
  }
  return local;
}

}  // namespace detail

template <class Scalar>
ColumnParallelLinear<Scalar>::ColumnParallelLinear(const Linear<Scalar>& full,
                                                   const Communicator& comm,
                                                   std::span<const index_t> parts)
    : comm_(&comm),
      out_features_(full.out_features()),
      local_(detail::column_slice(full, comm, parts)) {}

template <class Scalar>
ColumnParallelLinear<Scalar>::ColumnParallelLinear(Linear<Scalar> local, index_t out_features,
                                                   const Communicator& comm,
                                                   std::span<const index_t> parts)
    : comm_(&comm),
      out_features_(out_features),
      local_(detail::checked_column_slice(std::move(local), out_features, comm, parts)) {}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> ColumnParallelLinear<Scalar>::forward(const X& x) const {
  detail::agree_shapes(*comm_, "ColumnParallelLinear::forward", x);
  return local_.forward(x);
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> ColumnParallelLinear<Scalar>::backward(const X& x, const DY& dy) {
  detail::agree_shapes(*comm_, "ColumnParallelLinear::backward", x, dy);
  auto dx = local_.backward(x, dy);
  comm_->all_reduce_sum(std::span<Scalar>(dx.data(), static_cast<std::size_t>(dx.size())));
  return dx;
}

template <class Scalar>
RowParallelLinear<Scalar>::RowParallelLinear(const Linear<Scalar>& full, const Communicator& comm)
    : comm_(&comm),
      in_features_(full.in_features()),
      has_bias_(full.has_bias()),
      local_(detail::row_slice(full, comm)),
      bias_(has_bias_ ? Tensor<Scalar, 1>(full.bias()) : Tensor<Scalar, 1>({0})),
      bias_grad_(bias_.shape()) {}

template <class Scalar>
RowParallelLinear<Scalar>::RowParallelLinear(Linear<Scalar> local,
                                             std::optional<Tensor<Scalar, 1>> bias,
                                             index_t in_features, const Communicator& comm)
    : comm_(&comm),
      in_features_(in_features),
      has_bias_(bias.has_value()),
      local_(
          detail::checked_row_slice(std::move(local), bias ? bias->size() : -1, in_features, comm)),
      bias_(bias ? std::move(*bias) : Tensor<Scalar, 1>({0})),
      bias_grad_(bias_.shape()) {}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> RowParallelLinear<Scalar>::forward(const X& x) const {
  detail::agree_shapes(*comm_, "RowParallelLinear::forward", x);
  return forward_agreed(x);
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> RowParallelLinear<Scalar>::forward_agreed(const X& x) const {
  auto y = local_.forward(x);  // this rank's partial sum over its in/P columns
  comm_->all_reduce_sum(std::span<Scalar>(y.data(), static_cast<std::size_t>(y.size())));
  // Once, after the reduce: added on every rank before it, b would count P times.
  if (has_bias_) y.matrix().rowwise() += bias_.vector().transpose();
  return y;
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> RowParallelLinear<Scalar>::backward(const X& x, const DY& dy) {
  detail::agree_shapes(*comm_, "RowParallelLinear::backward", x, dy);
  return backward_agreed(x, dy);
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> RowParallelLinear<Scalar>::backward_agreed(const X& x, const DY& dy) {
  auto dx = local_.backward(x, dy);  // checks every shape before touching a gradient
  if (has_bias_) bias_grad_.vector() += const_view(dy).matrix().colwise().sum().transpose();
  return dx;
}

}  // namespace dissect::parallel
