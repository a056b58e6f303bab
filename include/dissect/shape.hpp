// dissect/shape.hpp — shapes, checked element counts and how shapes print.
//
// A shape is a std::array of int64 extents. Every count the library derives from a shape goes
// through checked_mul/element_count, so a product that would overflow int64 becomes a
// ShapeError before anything is allocated. The dimension vocabulary used across the library:
// B batch, T sequence, D model width, H heads, d_k = D/H head width, F FFN width, L layers,
// V vocabulary.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>

#include "dissect/error.hpp"

namespace dissect {

using index_t = std::int64_t;

template <std::size_t Rank>
using Shape = std::array<index_t, Rank>;

/// "[2, 5, 768]" — the one way shapes are printed in messages and tables.
template <std::size_t Rank>
std::string format_shape(const Shape<Rank>& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t axis = 0; axis < Rank; ++axis) out << (axis ? ", " : "") << shape[axis];
  out << ']';
  return out.str();
}

/// "1,073,741,824": digits grouped by thousands, for exact element, byte, parameter and FLOP
/// counts in messages and tables.
inline std::string format_count(index_t value) {
  const std::string digits = std::to_string(value);
  const std::size_t sign = value < 0 ? 1 : 0;
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > sign && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

/// a · b, or a ShapeError naming `what` if the product leaves int64. Both must be >= 0.
inline index_t checked_mul(index_t a, index_t b, std::string_view what) {
  index_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    throw ShapeError(detail::concat(what, ": size overflows int64 (", a, " * ", b, ")"));
  }
  return product;
}

/// Throws ShapeError if any extent is negative, naming the operation, the axis and the shape.
template <std::size_t Rank>
void check_extents(const Shape<Rank>& shape, std::string_view op) {
  for (std::size_t axis = 0; axis < Rank; ++axis) {
    if (shape[axis] < 0) {
      throw ShapeError(detail::concat(op, ": negative dimension ", shape[axis], " at axis ", axis,
                                      " of shape ", format_shape(shape)));
    }
  }
}

/// Number of elements of `shape`, checked: negative extents and int64 overflow are ShapeErrors.
template <std::size_t Rank>
index_t element_count(const Shape<Rank>& shape, std::string_view op = "element_count") {
  check_extents(shape, op);
  index_t count = 1;
  for (std::size_t axis = 0; axis < Rank; ++axis) {
    index_t next = 0;
    if (__builtin_mul_overflow(count, shape[axis], &next)) {
      throw ShapeError(detail::concat(op, ": element count of shape ", format_shape(shape),
                                      " overflows int64 at axis ", axis));
    }
    count = next;
  }
  return count;
}

/// Product of all extents but the last: the rows of the matrix a tensor folds into.
template <std::size_t Rank>
index_t leading_count(const Shape<Rank>& shape) {
  static_assert(Rank >= 1, "leading_count needs a shape of rank >= 1");
  index_t rows = 1;
  for (std::size_t axis = 0; axis + 1 < Rank; ++axis) rows *= shape[axis];
  return rows;
}

}  // namespace dissect
