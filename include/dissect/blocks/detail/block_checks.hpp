// dissect/blocks/detail/block_checks.hpp — private: do not include directly (the headers of
// dissect/blocks/ do).
//
// The boundary checks every block runs before touching a value or a gradient, and the text of
// their ShapeErrors: op, the tensor's name, the expected shape with dimension names, the input it
// was derived from, and what was given.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/blocks/detail/block_checks.hpp is private to dissect: include dissect/blocks/attention_output.hpp instead"
#endif

#include <string>
#include <string_view>

#include "dissect/error.hpp"
#include "dissect/shape.hpp"
#include "dissect/tensor.hpp"

namespace dissect::detail {

/// "[B, T, D=768]"-style expectation text for messages.
inline std::string token_shape_text(const char* last_name, index_t last) {
  return concat("[B, T, ", last_name, "=", last, "]");
}

template <class Scalar>
void check_block_tokens(std::string_view op, const char* name, ConstTensorView<Scalar, 3> tensor,
                        const char* last_name, index_t last) {
  if (tensor.dim(2) != last) {
    throw ShapeError(concat(op, ": ", name, " must be ", token_shape_text(last_name, last),
                            ", got ", format_shape(tensor.shape())));
  }
}

/// `tensor` must be exactly `expected` (derived from an input already checked).
template <TensorLike X>
void check_block_shape(std::string_view op, const char* name, const X& tensor,
                       std::string_view pattern, const Shape<rank_of<X>>& expected,
                       std::string_view source, const std::string& source_shape,
                       std::string_view hint = "") {
  if (tensor.shape() != expected) {
    throw ShapeError(concat(op, ": ", name, " must be ", pattern, " = ", format_shape(expected),
                            " for ", source, " ", source_shape, ", got ",
                            format_shape(tensor.shape()), hint));
  }
}

inline constexpr std::string_view cache_hint = " (fill the cache with forward(x, cache))";

}  // namespace dissect::detail
