// dissect/detail/checked.hpp — PRIVATE: do not include directly; config.hpp, count.hpp and
// budget.hpp use it.
//
// Checked int64 arithmetic for model and budget accounting. shape.hpp's checked_mul reports a
// ShapeError; a parameter count or a byte budget that leaves int64 is an impossible
// configuration instead, so these throw ConfigError naming the quantity being computed.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "dissect/error.hpp"
#include "dissect/shape.hpp"

namespace dissect::detail {

/// a + b, or a ConfigError naming `what` if the sum leaves int64.
inline index_t checked_add(index_t a, index_t b, std::string_view what) {
  index_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) {
    throw ConfigError(concat(what, ": overflows int64 (", a, " + ", b, ")"));
  }
  return sum;
}

/// a · b, or a ConfigError naming `what` if the product leaves int64.
inline index_t checked_product(index_t a, index_t b, std::string_view what) {
  index_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) {
    throw ConfigError(concat(what, ": overflows int64 (", a, " * ", b, ")"));
  }
  return product;
}

/// The product of all `factors`, checked step by step, so 2·L·T·H·d_k reads as one call.
inline index_t checked_product(std::initializer_list<index_t> factors, std::string_view what) {
  index_t product = 1;
  for (index_t factor : factors) product = checked_product(product, factor, what);
  return product;
}

/// The sum of all `terms`, checked step by step.
inline index_t checked_sum(std::initializer_list<index_t> terms, std::string_view what) {
  index_t sum = 0;
  for (index_t term : terms) sum = checked_add(sum, term, what);
  return sum;
}

}  // namespace dissect::detail
