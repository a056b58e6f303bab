// dissect/blocks/detail/print_block.hpp — private: do not include directly (the headers of
// dissect/blocks/ do).
//
// The one format of every block's operator<<, "Name(field=value, …, bias=true)", like the
// printed form of a PyTorch module.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/blocks/detail/print_block.hpp is private to dissect: include dissect/blocks/attention_output.hpp instead"
#endif

#include <initializer_list>
#include <ostream>
#include <string_view>
#include <utility>

#include "dissect/core/shape.hpp"

namespace dissect {

namespace detail {
/// "Name(field=value, …, bias=true)": the one format of every block's operator<<.
inline std::ostream& print_block(std::ostream& out, std::string_view name,
                                 std::initializer_list<std::pair<const char*, index_t>> sizes,
                                 bool bias, const char* activation = nullptr) {
  out << name << '(';
  for (const auto& [field, value] : sizes) out << field << '=' << value << ", ";
  if (activation) out << "activation=" << activation << ", ";
  return out << "bias=" << (bias ? "true" : "false") << ')';
}
}  // namespace detail

}  // namespace dissect
