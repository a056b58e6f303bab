// dissect/layers/embedding.hpp — Embedding<Scalar>: a table of V rows of width D looked up by token
// id, exactly like nn.Embedding, and the same table read by position (GPT-2's learned wpe).
//
// forward copies rows; backward scatter-adds dy's rows into the table's gradient, so an id that
// appears twice in a batch receives both rows. Token ids are integers, which Tensor does not hold:
// they come as a TokenBatch (core/token_batch.hpp), a span of B·T ids in row-major order. Every
// id, every shape and every alias with the layer's own buffers is checked before anything is
// written.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <span>
#include <type_traits>
#include <utility>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/core/token_batch.hpp"  // TokenBatch, which forward reads
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

struct EmbeddingOptions {
  /// Rows start as N(0, init_std²): 1 is nn.Embedding's default, GPT-2 uses 0.02.
  double init_std = 1.0;
  /// Seed of the layer's own generator; when empty, the next of the sequence manual_seed() sets.
  std::optional<std::uint64_t> seed = std::nullopt;
};

template <class Scalar>
class Embedding : public ParameterMethods<Embedding<Scalar>> {
  // Scalar: float or double, as its Tensor members require (their static_assert says so).
 public:
  using scalar_type = Scalar;

  /// A table of `num_embeddings` (V) rows of `embedding_dim` (D) values, drawn from N(0, std²).
  /// @throws ShapeError for a negative size or a table whose size overflows int64; ConfigError
  ///         for a negative or non-finite init_std.
  Embedding(index_t num_embeddings, index_t embedding_dim, EmbeddingOptions options = {});

  /// A layer around a given table [V, D].
  explicit Embedding(Tensor<Scalar, 2> weight);

  // Copied or moved into a new layer, never assigned over (ParameterMethods): its buffers keep
  // their address for its life. A moved-from layer is an empty [0, 0] table.

  index_t num_embeddings() const { return weight_.dim(0); }  ///< V
  index_t embedding_dim() const { return weight_.dim(1); }   ///< D

  /// [V, D]: values writable, shape and buffer fixed for the layer's life.
  TensorView<Scalar, 2> weight() { return weight_.view(); }
  ConstTensorView<Scalar, 2> weight() const { return weight_.cview(); }
  /// Copies new values in (the buffer keeps its address). @throws ShapeError unless [V, D].
  void set_weight(ConstTensorView<Scalar, 2> weight);
  /// [V, D]; filled by backward, cleared by zero_grad. @throws Error if the table is frozen.
  TensorView<Scalar, 2> weight_grad() {
    require_gradient("Embedding", "weight_grad", frozen_);
    return weight_grad_.view();
  }
  ConstTensorView<Scalar, 2> weight_grad() const {
    require_gradient("Embedding", "weight_grad", frozen_);
    return weight_grad_.cview();
  }
  /// Freezing (requires_grad_(False)): the gradient is released and backward only checks its
  /// arguments; unfreezing allocates a zeroed gradient. See module.hpp.
  void set_frozen(bool frozen) {
    frozen_ = frozen;
    set_gradient_frozen(weight_grad_, weight_.shape(), frozen);
  }
  bool frozen() const { return frozen_; }

  /// Visits "weight" with its gradient: the module protocol.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit);
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const;

  /// tokens: B×T ids → y: [B, T, D], y[b, t] = weight[ids[b·T + t]].
  /// @throws ShapeError if ids.size() ≠ B·T; Error naming [b, t] and the id if one is outside
  ///         [0, V).
  Tensor<Scalar, 3> forward(TokenBatch tokens) const;
  /// As forward, into a caller's y: [B, T, D] (its old values are never read).
  /// @throws as forward; ShapeError if y has another shape or shares memory with the table.
  template <WritableTensor Y>
  void forward_into(TokenBatch tokens, Y&& y) const;

  /// tokens: B×T ids, dy: [B, T, D]; adds dy[b, t] to weight_grad[ids[b·T + t]] (repeated ids
  /// accumulate). Ids have no gradient, so nothing is returned.
  /// @throws as forward, or ShapeError if dy is not [B, T, D] or shares memory with weight_grad;
  ///         weight_grad is untouched when it throws.
  template <TensorLike DY>
  void backward(TokenBatch tokens, const DY& dy);

  /// Rows offset … offset + T − 1: [T, D]. GPT-2's learned positions, where `offset` is the
  /// number of positions already in a KV cache while decoding.
  /// @throws ShapeError for T < 0; Error for offset < 0 or offset + T > V, naming both.
  Tensor<Scalar, 2> forward_positions(index_t seq, index_t offset = 0) const;
  /// dy: [T, D] or [B, T, D] (the gradient of positions broadcast over a batch, summed over B);
  /// adds dy's rows to weight_grad[offset + t].
  /// @throws as forward_positions, or ShapeError if dy's width is not D or it shares memory
  ///         with weight_grad; weight_grad is untouched when it throws.
  template <TensorLike DY>
  void backward_positions(const DY& dy, index_t offset = 0);

 private:
  void check_tokens(const char* op, const TokenBatch& tokens) const;
  /// check_tokens, then `name` (output y or dy) must be [B, T, D].
  void check_batch(const char* op, const TokenBatch& tokens, const char* name,
                   const Shape<3>& shape) const;
  void check_positions(const char* op, index_t seq, index_t offset) const;
  /// y[b, t] = weight[ids[b·T + t]]. Unchecked: callers check first.
  void lookup(const TokenBatch& tokens, const TensorView<Scalar, 3>& y) const;
  void check_not_grad(const char* op, const char* name, const ConstTensorView<Scalar, 3>& x) const;
  /// dy: [B, T, D]; adds dy[b, t] to weight_grad[ids[b·T + t]], or to weight_grad[first + t]
  /// when ids is null. Unchecked: callers check first.
  void scatter_add(const index_t* ids, index_t first, const ConstTensorView<Scalar, 3>& dy);

  Tensor<Scalar, 2> weight_;
  Tensor<Scalar, 2> weight_grad_;
  bool frozen_ = false;
};

/// "Embedding(50257, 768)", as PyTorch prints nn.Embedding.
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const Embedding<Scalar>& layer);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
inline Shape<2> embedding_table_shape(index_t num_embeddings, index_t embedding_dim) {
  const Shape<2> shape{num_embeddings, embedding_dim};
  if (num_embeddings < 0 || embedding_dim < 0) {
    throw ShapeError(concat("Embedding: num_embeddings and embedding_dim must be >= 0, got ",
                            format_shape(shape)));
  }
  return shape;
}

inline double checked_init_std(double init_std) {
  if (!(init_std >= 0) || !std::isfinite(init_std)) {
    throw ConfigError(concat("Embedding: init_std must be finite and >= 0 (got ", init_std, ")"));
  }
  return init_std;
}
}  // namespace detail

template <class Scalar>
Embedding<Scalar>::Embedding(index_t num_embeddings, index_t embedding_dim,
                             EmbeddingOptions options)
    : weight_(detail::embedding_table_shape(num_embeddings, embedding_dim)),
      weight_grad_(ConstructionScope::current().gradients ? weight_.shape() : Shape<2>{}),
      frozen_(!ConstructionScope::current().gradients) {
  const double std = detail::checked_init_std(options.init_std);
  // The seed is taken even when nothing is drawn: the layers built after this one are the same.
  Generator generator(options.seed ? *options.seed : next_default_seed());
  if (ConstructionScope::current().initialise) fill_normal(weight_, 0.0, std, generator);
}

template <class Scalar>
Embedding<Scalar>::Embedding(Tensor<Scalar, 2> weight)
    : weight_(std::move(weight)),
      weight_grad_(ConstructionScope::current().gradients ? weight_.shape() : Shape<2>{}),
      frozen_(!ConstructionScope::current().gradients) {}

template <class Scalar>
void Embedding<Scalar>::set_weight(ConstTensorView<Scalar, 2> weight) {
  assign_parameter("Embedding", "weight", "[num_embeddings, embedding_dim]", weight_, weight);
}

template <class Scalar>
template <class Visitor>
void Embedding<Scalar>::for_each_parameter(Visitor&& visit) {
  visit(ParameterName("weight"), weight_.view(), weight_grad_.view());
}

template <class Scalar>
template <class Visitor>
void Embedding<Scalar>::for_each_parameter(Visitor&& visit) const {
  visit(ParameterName("weight"), weight_.cview(), weight_grad_.cview());
}

template <class Scalar>
void Embedding<Scalar>::check_tokens(const char* op, const TokenBatch& tokens) const {
  const Shape<2> bt{tokens.batch, tokens.seq};
  const index_t count = element_count(bt, detail::concat("Embedding::", op, ": tokens"));
  if (static_cast<index_t>(tokens.ids.size()) != count) {
    throw ShapeError(detail::concat("Embedding::", op, ": ", tokens.ids.size(),
                                    " token ids for [B, T] = ", format_shape(bt), " (", count,
                                    " expected)"));
  }
  const index_t vocab = num_embeddings();
  for (index_t i = 0; i < count; ++i) {
    const index_t id = tokens.ids[static_cast<std::size_t>(i)];
    if (id < 0 || id >= vocab) {
      throw Error(detail::concat("Embedding::", op, ": token ", id, " at [", i / tokens.seq, ", ",
                                 i % tokens.seq, "] is outside [0, ", vocab, ")"));
    }
  }
}

template <class Scalar>
void Embedding<Scalar>::check_batch(const char* op, const TokenBatch& tokens, const char* name,
                                    const Shape<3>& shape) const {
  check_tokens(op, tokens);
  const Shape<3> expected{tokens.batch, tokens.seq, embedding_dim()};
  if (shape != expected) {
    throw ShapeError(detail::concat("Embedding::", op, ": ", name, " has shape ",
                                    format_shape(shape), " but tokens [B, T] = [", tokens.batch,
                                    ", ", tokens.seq, "] give ", format_shape(expected)));
  }
}

template <class Scalar>
void Embedding<Scalar>::check_positions(const char* op, index_t seq, index_t offset) const {
  if (seq < 0) {
    throw ShapeError(detail::concat("Embedding::", op, ": T must be >= 0, got ", seq));
  }
  // offset > V − T rather than offset + T > V: the sum could overflow.
  if (offset < 0 || offset > num_embeddings() - seq) {
    throw Error(detail::concat("Embedding::", op, ": positions [", offset, ", ", offset, " + ", seq,
                               ") (T ", seq, ", offset ", offset, ") are outside the table's [0, ",
                               num_embeddings(), ")"));
  }
}

template <class Scalar>
void Embedding<Scalar>::check_not_grad(const char* op, const char* name,
                                       const ConstTensorView<Scalar, 3>& x) const {
  // dy read while weight_grad is written: an alias would read rows already changed.
  if (x.overlaps(weight_grad_.cview())) {
    throw ShapeError(detail::concat("Embedding::", op, ": ", name, " ", format_shape(x.shape()),
                                    " aliases the layer's weight_grad ",
                                    format_shape(weight_grad_.shape())));
  }
}

template <class Scalar>
Tensor<Scalar, 3> Embedding<Scalar>::forward(TokenBatch tokens) const {
  check_tokens("forward", tokens);
  auto y = Tensor<Scalar, 3>::uninitialized({tokens.batch, tokens.seq, embedding_dim()});
  lookup(tokens, y.view());
  return y;
}

template <class Scalar>
template <WritableTensor Y>
void Embedding<Scalar>::forward_into(TokenBatch tokens, Y&& y) const {
  require_layer_scalar<Scalar, Y>();
  const auto output = writable_view(y);
  check_batch("forward_into", tokens, "output", output.shape());
  if (output.overlaps(weight_.cview()) || output.overlaps(weight_grad_.cview())) {
    throw ShapeError(detail::concat(
        "Embedding::forward_into: output ", format_shape(output.shape()),
        " aliases the layer's weight or weight_grad ", format_shape(weight_.shape())));
  }
  lookup(tokens, output);
}

template <class Scalar>
void Embedding<Scalar>::lookup(const TokenBatch& tokens, const TensorView<Scalar, 3>& y) const {
  const index_t width = embedding_dim();
  for (std::size_t i = 0; i < tokens.ids.size(); ++i) {
    std::copy_n(weight_.data() + tokens.ids[i] * width, width,
                y.data() + static_cast<index_t>(i) * width);
  }
}

template <class Scalar>
void Embedding<Scalar>::scatter_add(const index_t* ids, index_t first,
                                    const ConstTensorView<Scalar, 3>& dy) {
  // One row at a time, in order: repeated ids accumulate, and the sum's order is fixed.
  auto grad = weight_grad_.matrix();
  const auto upstream = dy.matrix();
  const index_t seq = dy.shape()[1];
  for (index_t r = 0; r < upstream.rows(); ++r) {
    grad.row(ids ? ids[r] : first + r % seq) += upstream.row(r);
  }
}

template <class Scalar>
template <TensorLike DY>
void Embedding<Scalar>::backward(TokenBatch tokens, const DY& dy) {
  require_layer_scalar<Scalar, DY>();
  static_assert(rank_of<DY> == 3, "dissect::Embedding::backward: dy is [B, T, D]");
  const auto upstream = const_view(dy);
  check_batch("backward", tokens, "dy", upstream.shape());
  check_not_grad("backward", "dy", upstream);
  if (!frozen_) scatter_add(tokens.ids.data(), 0, upstream);
}

template <class Scalar>
Tensor<Scalar, 2> Embedding<Scalar>::forward_positions(index_t seq, index_t offset) const {
  check_positions("forward_positions", seq, offset);
  const index_t width = embedding_dim();
  auto y = Tensor<Scalar, 2>::uninitialized({seq, width});
  if (y.size() > 0) std::copy_n(weight_.data() + offset * width, y.size(), y.data());
  return y;
}

template <class Scalar>
template <TensorLike DY>
void Embedding<Scalar>::backward_positions(const DY& dy, index_t offset) {
  require_layer_scalar<Scalar, DY>();
  constexpr std::size_t rank = rank_of<DY>;
  static_assert(rank == 2 || rank == 3,
                "dissect::Embedding::backward_positions: dy is [T, D] or [B, T, D]");
  const auto view = const_view(dy);
  Shape<3> shape{1, view.shape()[0], view.shape()[rank - 1]};
  if constexpr (rank == 3) shape = view.shape();
  const ConstTensorView<Scalar, 3> upstream(view.data(), shape);
  if (shape[2] != embedding_dim()) {
    throw ShapeError(detail::concat("Embedding::backward_positions: dy has shape ",
                                    format_shape(view.shape()), " but the table is ",
                                    format_shape(weight_.shape()),
                                    " (last dim must be D = ", embedding_dim(), ")"));
  }
  check_positions("backward_positions", shape[1], offset);
  check_not_grad("backward_positions", "dy", upstream);
  if (!frozen_) scatter_add(nullptr, offset, upstream);
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const Embedding<Scalar>& layer) {
  return out << "Embedding(" << layer.num_embeddings() << ", " << layer.embedding_dim() << ")";
}

}  // namespace dissect
