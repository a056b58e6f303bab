// dissect/blocks/block_parts.hpp — the parts of the blocks besides their Linear layers, public so
// that a block assembled elsewhere from the same layers (the tensor-parallel FFNs and attention of
// dissect/parallel/) checks and computes exactly as the blocks do.
//
// The boundary checks every block runs before touching a value or a gradient, with the text of
// their ShapeErrors (op, the tensor's name, the expected shape with dimension names, the input it
// was derived from, and what was given); a projection's forward into a reused cache buffer; and
// SwiGLU's gating, silu(gate) ⊙ up, with its gradient.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// A block's token input: `tensor` must be [B, T, last] (any B and T).
/// @throws ShapeError "op: x must be [B, T, D=768], got [2, 16, 512]" (`name` "x", `last_name`
///         "D").
template <class Scalar>
void check_block_tokens(std::string_view op, const char* name, ConstTensorView<Scalar, 3> tensor,
                        const char* last_name, index_t last);

/// `tensor` must be exactly `expected`, a shape derived from an input already checked: `source`
/// (its name, "x") of shape `source_shape`. `pattern` names the dimensions ("[B, T, D=768]").
/// @throws ShapeError "op: dy must be [B, T, D=768] = [2, 16, 768] for x [2, 16, 768], got …",
///         followed by `hint` (block_cache_hint for a cached tensor).
template <TensorLike X>
void check_block_shape(std::string_view op, const char* name, const X& tensor,
                       std::string_view pattern, const Shape<rank_of<X>>& expected,
                       std::string_view source, const std::string& source_shape,
                       std::string_view hint = "");

/// What a backward's message adds when a cached tensor does not fit the input.
inline constexpr std::string_view block_cache_hint = " (fill the cache with forward(x, cache))";

/// An FFN's backward checks, run before any gradient is touched: x is [B, T, D], dy is x's shape
/// and every cached tensor (named, as "cache.hidden") is [B, T, F].
/// @throws ShapeError from check_block_tokens or check_block_shape.
template <class Scalar>
void check_ffn_backward(
    const char* op, index_t d_model, index_t d_ff, ConstTensorView<Scalar, 3> x,
    ConstTensorView<Scalar, 3> dy,
    std::initializer_list<std::pair<const char*, ConstTensorView<Scalar, 3>>> cached);

/// buffer = layer(x): x [B, T, in] → buffer [B, T, out], reusing the buffer's memory when it
/// already has that shape (reuse_buffer). @throws ShapeError as Linear::forward_into.
template <class Scalar>
void forward_into_cache(const Linear<Scalar>& layer, ConstTensorView<Scalar, 3> x,
                        Tensor<Scalar, 3>& buffer);

/// hidden = silu(gate) ⊙ up, element by element: SwiGLU between its projections. The three have
/// one shape (the caller made them); hidden may be gate itself.
template <class Scalar>
void swiglu_into(ConstTensorView<Scalar, 3> gate, ConstTensorView<Scalar, 3> up,
                 TensorView<Scalar, 3> hidden);

/// swiglu_into's gradient. On entry d_gate holds d hidden; then d_up = d hidden ⊙ silu(gate) and
/// d_gate = silu'(gate) · (d hidden ⊙ up), each element of d hidden read before it is overwritten.
/// The four have gate's shape (the caller made them).
template <class Scalar>
void swiglu_backward_into(ConstTensorView<Scalar, 3> gate, ConstTensorView<Scalar, 3> up,
                          TensorView<Scalar, 3> d_gate, TensorView<Scalar, 3> d_up);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// "[B, T, D=768]"-style expectation text for messages.
inline std::string token_shape_text(const char* last_name, index_t last) {
  return concat("[B, T, ", last_name, "=", last, "]");
}

}  // namespace detail

template <class Scalar>
void check_block_tokens(std::string_view op, const char* name, ConstTensorView<Scalar, 3> tensor,
                        const char* last_name, index_t last) {
  if (tensor.dim(2) != last) {
    throw ShapeError(concat(op, ": ", name, " must be ", detail::token_shape_text(last_name, last),
                            ", got ", format_shape(tensor.shape())));
  }
}

template <TensorLike X>
void check_block_shape(std::string_view op, const char* name, const X& tensor,
                       std::string_view pattern, const Shape<rank_of<X>>& expected,
                       std::string_view source, const std::string& source_shape,
                       std::string_view hint) {
  if (tensor.shape() != expected) {
    throw ShapeError(concat(op, ": ", name, " must be ", pattern, " = ", format_shape(expected),
                            " for ", source, " ", source_shape, ", got ",
                            format_shape(tensor.shape()), hint));
  }
}

template <class Scalar>
void check_ffn_backward(
    const char* op, index_t d_model, index_t d_ff, ConstTensorView<Scalar, 3> x,
    ConstTensorView<Scalar, 3> dy,
    std::initializer_list<std::pair<const char*, ConstTensorView<Scalar, 3>>> cached) {
  check_block_tokens(op, "x", x, "D", d_model);
  const auto x_text = format_shape(x.shape());
  check_block_shape(op, "dy", dy, detail::token_shape_text("D", d_model), x.shape(), "x", x_text);
  const Shape<3> hidden_shape{x.dim(0), x.dim(1), d_ff};
  for (const auto& [name, tensor] : cached) {
    check_block_shape(op, name, tensor, detail::token_shape_text("F", d_ff), hidden_shape, "x",
                      x_text, block_cache_hint);
  }
}

template <class Scalar>
void forward_into_cache(const Linear<Scalar>& layer, ConstTensorView<Scalar, 3> x,
                        Tensor<Scalar, 3>& buffer) {
  layer.forward_into(x, reuse_buffer(buffer, layer.output_shape(x.shape())));
}

template <class Scalar>
void swiglu_into(ConstTensorView<Scalar, 3> gate, ConstTensorView<Scalar, 3> up,
                 TensorView<Scalar, 3> hidden) {
  for (index_t i = 0; i < gate.size(); ++i) {
    hidden.data()[i] = detail::activation_value<Activation::silu>(gate.data()[i]) * up.data()[i];
  }
}

template <class Scalar>
void swiglu_backward_into(ConstTensorView<Scalar, 3> gate, ConstTensorView<Scalar, 3> up,
                          TensorView<Scalar, 3> d_gate, TensorView<Scalar, 3> d_up) {
  for (index_t i = 0; i < gate.size(); ++i) {
    const Scalar g = gate.data()[i], d_hidden = d_gate.data()[i];
    d_up.data()[i] = d_hidden * detail::activation_value<Activation::silu>(g);
    d_gate.data()[i] = detail::activation_gradient<Activation::silu>(g, d_hidden * up.data()[i]);
  }
}

}  // namespace dissect
