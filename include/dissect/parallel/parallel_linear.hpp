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
// Every public call runs its checks (and any local work before its first collective) inside
// Communicator::agree, which also compares the shapes and a checksum of every input that must be
// the same on every rank (the full layer a constructor splits, x of ColumnParallelLinear, dy of
// RowParallelLinear): an error on one rank, or ranks that disagree, make every rank throw the
// same error instead of leaving the others waiting in a collective. That costs one all-reduce of
// 88 bytes per call and one pass over the replicated inputs' bytes for their checksums.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/parallel/communicator.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect::parallel {

// ---- declarations -------------------------------------------------------------------------------

/// y_p = x·W_pᵀ + b_p with W_p rows [p·out/P, (p+1)·out/P) of the full W: x [..., in] →
/// y_p [..., out/P], rank p's slice of y's last axis.
template <class Scalar>
class ColumnParallelLinear : public ParameterMethods<ColumnParallelLinear<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// Rank p's rows of `full`, which must be the same on every rank (checked by a checksum of its
  /// weight and bias). A collective: every rank of `comm` constructs at once, and `comm` must
  /// outlive the layer. @throws ShapeError (every rank) if the ranks' full layers differ in shape
  /// or in any value; ConfigError (every rank) if P does not divide out_features or `full` has a
  /// LoRA adapter.
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

  /// x: [..., in] (the same on every rank) → y_p: [..., out/P]. No data moves between ranks
  /// besides the agreement (x's shape and checksum).
  /// @throws ShapeError (every rank) if x differs across ranks (in shape or in any value) or does
  ///         not fit on some rank (naming it).
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;

  /// x: [..., in] (the same on every rank), dy_p: [..., out/P] → dx = Σ_p dy_p·W_p: [..., in],
  /// the same on every rank (one all-reduce of x.size() values); adds dy_pᵀ·x to this rank's
  /// dW_p and Σ dy_p to db_p.
  /// @throws ShapeError (every rank, gradients untouched) if shapes differ across ranks, x's
  ///         values do, or they do not fit on some rank; CommunicationError.
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

  /// Rank p's columns of `full` (the same on every rank, checked); the bias is replicated. A
  /// collective, as ColumnParallelLinear's.
  /// @throws ShapeError (every rank) if the ranks' full layers differ in shape or in any value;
  ///         ConfigError (every rank) if P does not divide in_features or `full` has a LoRA
  ///         adapter.
  RowParallelLinear(const Linear<Scalar>& full, const Communicator& comm);

  /// From this rank's slice already cut: `local` (no bias) holds rank p's columns of a full
  /// layer with `in_features` columns, `bias` the whole [out] bias (replicated: checked by
  /// checksum) or none. A collective, as above.
  /// @throws ShapeError (every rank) if the ranks disagree about the full shape or the bias's
  ///         values, `local` does not have this rank's share of columns or the bias is not [out];
  ///         ConfigError if P does not divide in_features or `local` has a bias or an adapter.
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

  /// x_p: [..., in/P] → y: [..., out], one all-reduce of y.size() values (after the agreement).
  /// @throws ShapeError (every rank) if shapes differ across ranks or do not fit on some rank;
  ///         CommunicationError.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;

  /// x_p: [..., in/P], dy: [..., out] (the same on every rank) → dx_p = dy·W_p: [..., in/P], no
  /// data moved but the agreement; adds dyᵀ·x_p to dW_p and Σ dy to db. @throws ShapeError
  /// (every rank, gradients untouched) if shapes differ across ranks, dy's values do, or they do
  /// not fit on some rank.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const DY& dy);

 private:
  template <class BlockScalar>
  friend class ParallelFeedForward;
  template <class BlockScalar>
  friend class ParallelGatedFeedForward;
  template <class BlockScalar>
  friend class ParallelAttention;

  /// forward's collective half, after the caller agreed: y (this rank's partial product
  /// local().forward(x_p)) ← Σ over ranks, plus the bias.
  template <std::size_t Rank>
  void finish_forward(Tensor<Scalar, Rank>& y) const;
  /// backward after the caller agreed on the shapes (no communication).
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

/// A merged LoRA adapter is refused by backward (Linear::backward's Error), checked up front.
template <class Scalar>
void check_trainable(std::string_view op, const Linear<Scalar>& local) {
  if (local.adapter_merged()) {
    throw Error(dissect::detail::concat(
        op, ": the LoRA adapter is merged into the weight; unmerge it to train"));
  }
}

/// A Checksum of the tensors' values, one after another, for CallFacts::replicated.
template <TensorLike... Xs>
std::uint64_t checksum_of(const Xs&... tensors) {
  Checksum sum;
  const auto add = [&](const auto& tensor) {
    const auto view = const_view(tensor);
    sum.add(std::span(view.data(), static_cast<std::size_t>(view.size())));
  };
  (add(tensors), ...);
  return sum.value();
}

/// A Linear's weight and bias, checksummed: what a full layer must hold alike on every rank.
template <class Scalar>
std::uint64_t checksum_of_layer(const Linear<Scalar>& layer) {
  Checksum sum;
  const auto weight = layer.weight();
  sum.add(std::span(weight.data(), static_cast<std::size_t>(weight.size())));
  if (layer.has_bias()) {
    const auto bias = layer.bias();
    sum.add(std::span(bias.data(), static_cast<std::size_t>(bias.size())));
  }
  return sum.value();
}

/// What Linear::backward(x, dy) would refuse, checked without touching a gradient, so that the
/// refusal is agreed before any rank starts accumulating: x's last dim, dy's shape, a merged
/// adapter. (Linear still checks after; a buffer aliasing the layer's own gradients is refused
/// there only, on that rank.)
template <class Scalar, TensorLike X, TensorLike DY>
void check_local_backward(std::string_view op, const Linear<Scalar>& local, const X& x,
                          const DY& dy) {
  const auto input = const_view(x);
  const auto upstream = const_view(dy);
  constexpr std::size_t Rank = rank_of<X>;
  if (input.shape()[Rank - 1] != local.in_features()) {
    throw ShapeError(dissect::detail::concat(
        op, ": input last dim ", input.shape()[Rank - 1], " != in_features ", local.in_features(),
        " (x: ", format_shape(input.shape()),
        ", this rank's weight: ", format_shape(local.weight().shape()), ")"));
  }
  if (upstream.shape() != local.output_shape(input.shape())) {
    throw ShapeError(dissect::detail::concat(op, ": dy has shape ", format_shape(upstream.shape()),
                                             " but forward(x) has shape ",
                                             format_shape(local.output_shape(input.shape())),
                                             " (x: ", format_shape(input.shape()), ")"));
  }
  check_trainable(op, local);
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

/// What every rank's full layer must hold alike before it is split: [out, in, bias, adapter],
/// the widths of the fused output's parts (none: one part), and its weight and bias.
template <class Scalar>
CallFacts full_layer_facts(const Linear<Scalar>& full, std::span<const index_t> parts) {
  std::vector<std::int64_t> shapes = {full.out_features(), full.in_features(), full.has_bias(),
                                      full.has_adapter()};
  shapes.insert(shapes.end(), parts.begin(), parts.end());
  return {.shapes = std::move(shapes),
          .shapes_what = "the full layer's [out_features, in_features, bias, adapter, parts...]",
          .replicated = {{"the full layer's weight and bias", checksum_of_layer(full)}}};
}

inline void check_no_adapter(std::string_view op, bool adapter, std::string_view what) {
  if (adapter) {
    throw ConfigError(dissect::detail::concat(op, ": the ", what,
                                              " has a LoRA adapter; merge or detach it before "
                                              "splitting"));
  }
}

}  // namespace detail

template <class Scalar>
ColumnParallelLinear<Scalar>::ColumnParallelLinear(const Linear<Scalar>& full,
                                                   const Communicator& comm)
    : ColumnParallelLinear(full, comm, std::span<const index_t>()) {}

namespace detail {

/// The widths of the fused output's parts (one part if `parts` is empty; the caller agreed on
/// them), each divisible by P, summing to out_features; returns them and sets `local_rows` to
/// this rank's share.
inline std::vector<index_t> column_parts(std::string_view op, index_t out_features, int ranks,
                                         std::span<const index_t> parts, index_t& local_rows) {
  std::vector<index_t> widths(parts.begin(), parts.end());
  if (widths.empty()) widths.push_back(out_features);
  index_t total = 0;
  local_rows = 0;
  for (index_t width : widths) {
    total += width;
    local_rows +=
        even_share(op, widths.size() == 1 ? "out_features" : "a part's width", width, ranks);
  }
  if (total != out_features) {
    throw ConfigError(dissect::detail::concat(op, ": the parts sum to ", total,
                                              " but out_features is ", out_features));
  }
  return widths;
}

/// Rank p's share of each part of `full`'s rows, stacked in part order, as a Linear. The checks
/// and the copy are the agreement's local part: one all-reduce, however the split fails.
template <class Scalar>
Linear<Scalar> column_slice(const Linear<Scalar>& full, const Communicator& comm,
                            std::span<const index_t> parts) {
  constexpr std::string_view op = "ColumnParallelLinear";
  return comm.agree(op, full_layer_facts(full, parts), [&] {
    check_no_adapter(op, full.has_adapter(), "layer");
    index_t local_rows = 0;
    const auto widths = column_parts(op, full.out_features(), comm.size(), parts, local_rows);
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
  });
}

/// A slice cut elsewhere, checked against the full shape agreed across ranks. Every check runs
/// inside the agreement, so a slice wrong on one rank makes every rank throw, naming it.
template <class Scalar>
Linear<Scalar> checked_column_slice(Linear<Scalar> local, index_t out_features,
                                    const Communicator& comm, std::span<const index_t> parts) {
  constexpr std::string_view op = "ColumnParallelLinear";
  std::vector<std::int64_t> shapes = {out_features, local.in_features(), local.has_bias(),
                                      local.has_adapter()};
  shapes.insert(shapes.end(), parts.begin(), parts.end());
  return comm.agree(
      op,
      {.shapes = std::move(shapes),
       .shapes_what = "the full layer's [out_features, in_features, bias, adapter, parts...]"},
      [&] {
        check_no_adapter(op, local.has_adapter(), "slice");
        index_t local_rows = 0;
        column_parts(op, out_features, comm.size(), parts, local_rows);
        if (local.out_features() != local_rows) {
          throw ShapeError(dissect::detail::concat(
              op, ": the slice has ", local.out_features(), " rows but a rank's share of ",
              out_features, " over ", comm.size(), " ranks is ", local_rows));
        }
        return std::move(local);
      });
}

/// Rank p's columns [p·in/P, (p+1)·in/P) of `full`'s weight, as a bias-free Linear.
template <class Scalar>
Linear<Scalar> row_slice(const Linear<Scalar>& full, const Communicator& comm) {
  constexpr std::string_view op = "RowParallelLinear";
  return comm.agree(op, full_layer_facts(full, {}), [&] {
    check_no_adapter(op, full.has_adapter(), "layer");
    const index_t share = even_share(op, "in_features", full.in_features(), comm.size());
    Tensor<Scalar, 2> weight({full.out_features(), share});
    weight.matrix() = full.weight().matrix().middleCols(comm.rank() * share, share);
    return Linear<Scalar>(std::move(weight));
  });
}

/// A row-parallel slice cut elsewhere, checked as checked_column_slice; the bias (replicated)
/// is compared by checksum.
template <class Scalar>
Linear<Scalar> checked_row_slice(Linear<Scalar> local, const std::optional<Tensor<Scalar, 1>>& bias,
                                 index_t in_features, const Communicator& comm) {
  constexpr std::string_view op = "RowParallelLinear";
  const index_t bias_size = bias ? bias->size() : -1;
  CallFacts facts{.shapes = {in_features, local.out_features(), local.in_features(), bias_size,
                             local.has_bias() || local.has_adapter()},
                  .shapes_what =
                      "the full layer's [in_features, out_features], the slice's columns and the "
                      "bias"};
  if (bias) facts.replicated.push_back({"the bias", checksum_of(*bias)});
  return comm.agree(op, facts, [&] {
    if (local.has_bias() || local.has_adapter()) {
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
      throw ShapeError(dissect::detail::concat(
          op, ": the bias has ", bias_size, " values but out_features is ", local.out_features()));
    }
    return std::move(local);
  });
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
  // The product is this rank's local part: a rank that cannot compute it makes all throw.
  return comm_->agree(
      "ColumnParallelLinear::forward",
      {.shapes = detail::shape_values(x), .replicated = {{"x", detail::checksum_of(x)}}},
      [&] { return local_.forward(x); });
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> ColumnParallelLinear<Scalar>::backward(const X& x, const DY& dy) {
  constexpr std::string_view op = "ColumnParallelLinear::backward";
  // Checks only: a rank must not add to its gradients while another is about to refuse.
  comm_->agree(
      op, {.shapes = detail::shape_values(x, dy), .replicated = {{"x", detail::checksum_of(x)}}},
      [&] { detail::check_local_backward(op, local_, x, dy); });
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
      local_(detail::checked_row_slice(std::move(local), bias, in_features, comm)),
      bias_(bias ? std::move(*bias) : Tensor<Scalar, 1>({0})),
      bias_grad_(bias_.shape()) {}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> RowParallelLinear<Scalar>::forward(const X& x) const {
  // x_p is this rank's slice: only its shape is agreed. The partial product is the local part.
  auto y = comm_->agree("RowParallelLinear::forward", {.shapes = detail::shape_values(x)},
                        [&] { return local_.forward(x); });
  finish_forward(y);
  return y;
}

template <class Scalar>
template <std::size_t Rank>
void RowParallelLinear<Scalar>::finish_forward(Tensor<Scalar, Rank>& y) const {
  comm_->all_reduce_sum(std::span<Scalar>(y.data(), static_cast<std::size_t>(y.size())));
  // Once, after the reduce: added on every rank before it, b would count P times.
  if (has_bias_) y.matrix().rowwise() += bias_.vector().transpose();
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> RowParallelLinear<Scalar>::backward(const X& x, const DY& dy) {
  constexpr std::string_view op = "RowParallelLinear::backward";
  comm_->agree(
      op, {.shapes = detail::shape_values(x, dy), .replicated = {{"dy", detail::checksum_of(dy)}}},
      [&] { detail::check_local_backward(op, local_, x, dy); });
  return backward_agreed(x, dy);
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> RowParallelLinear<Scalar>::backward_agreed(const X& x, const DY& dy) {
  auto dx = local_.backward(x, dy);  // checks every shape before touching a gradient
  // No rows add nothing; colwise() over an empty map would offset its null pointer (undefined).
  const auto dy_rows = const_view(dy).matrix();
  if (has_bias_ && dy_rows.rows() > 0) bias_grad_.vector() += dy_rows.colwise().sum().transpose();
  return dx;
}

}  // namespace dissect::parallel
