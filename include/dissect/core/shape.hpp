// dissect/core/shape.hpp — shapes, checked element counts and how shapes print.
//
// A shape is a std::array of int64 extents. Every count the library derives from a shape goes
// through the checked_* family below, so a product that would overflow int64 becomes an
// OverflowError (a ShapeError) before anything is allocated. The dimension vocabulary used across
// the library: B batch, T sequence, D model width, H heads, d_k = D/H head width, F FFN width, L
// layers, V vocabulary.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <ostream>
#include <span>
#include <sstream>
#include <string>
#include <string_view>

#include "dissect/core/error.hpp"

namespace dissect {

using index_t = std::int64_t;

template <std::size_t Rank>
using Shape = std::array<index_t, Rank>;

/// "[2, 5, 768]" — the one way shapes are printed in messages and tables. This form takes a
/// shape whose rank is known only at run time (one read from a file).
inline std::string format_shape(std::span<const index_t> shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t axis = 0; axis < shape.size(); ++axis) out << (axis ? ", " : "") << shape[axis];
  out << ']';
  return out.str();
}
template <std::size_t Rank>
std::string format_shape(const Shape<Rank>& shape) {
  return format_shape(std::span<const index_t>(shape));
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

// ---- checked int64 arithmetic: the one family every count, size and budget goes through ------
// Portable (no compiler builtins): each test decides overflow before the operation runs, so
// no signed overflow (undefined behaviour) ever happens. All throw OverflowError naming `what`.

namespace detail {
/// Whether a · b leaves int64, decided without computing it.
constexpr bool mul_overflows(index_t a, index_t b) {
  constexpr index_t max = std::numeric_limits<index_t>::max();
  constexpr index_t min = std::numeric_limits<index_t>::min();
  if (a > 0) return b > 0 ? a > max / b : b < min / a;
  if (a < 0) return b > 0 ? a < min / b : (b < 0 && a < max / b);
  return false;
}
}  // namespace detail

/// a · b, or OverflowError naming `what` if the product leaves int64.
inline index_t checked_mul(index_t a, index_t b, std::string_view what) {
  if (detail::mul_overflows(a, b)) {
    throw OverflowError(detail::concat(what, ": overflows int64 (", a, " * ", b, ")"));
  }
  return a * b;
}

/// a + b, or OverflowError naming `what` if the sum leaves int64.
inline index_t checked_add(index_t a, index_t b, std::string_view what) {
  constexpr index_t max = std::numeric_limits<index_t>::max();
  constexpr index_t min = std::numeric_limits<index_t>::min();
  if ((b > 0 && a > max - b) || (b < 0 && a < min - b)) {
    throw OverflowError(detail::concat(what, ": overflows int64 (", a, " + ", b, ")"));
  }
  return a + b;
}

/// The product of all `factors`, checked step by step, so 2·L·T·H·d_k reads as one call.
inline index_t checked_product(std::initializer_list<index_t> factors, std::string_view what) {
  index_t product = 1;
  for (index_t factor : factors) product = checked_mul(product, factor, what);
  return product;
}

/// The sum of all `terms`, checked step by step.
inline index_t checked_sum(std::initializer_list<index_t> terms, std::string_view what) {
  index_t sum = 0;
  for (index_t term : terms) sum = checked_add(sum, term, what);
  return sum;
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
    if (detail::mul_overflows(count, shape[axis])) {  // the message is built only on failure
      throw OverflowError(detail::concat(op, ": element count of shape ", format_shape(shape),
                                         " overflows int64 at axis ", axis));
    }
    count *= shape[axis];
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
