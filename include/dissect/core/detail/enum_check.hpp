// dissect/core/detail/enum_check.hpp — PRIVATE: do not include directly (config.hpp, init.hpp,
// activation.hpp and budget.hpp do).
//
// One way to validate an enum that came from outside (a cast int, a file): its value must index
// the array of its enumerators' names, so the check and the names cannot drift apart.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/core/detail/enum_check.hpp is private to dissect: include any public dissect header (they share it) instead"
#endif

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#include "dissect/core/error.hpp"

namespace dissect::detail {

[[noreturn]] inline void throw_enum_out_of_range(std::string_view op, std::string_view type,
                                                 long long raw,
                                                 std::span<const std::string_view> names) {
  std::string known;
  for (std::string_view name : names) known += (known.empty() ? "" : ", ") + std::string(name);
  throw ConfigError(concat(op, ": ", type, "(", raw, ") is out of range (known: ", known, ")"));
}

/// `value` if its underlying integer indexes `names` (enumerators are 0, 1, …, in the order of
/// `names`), else ConfigError naming `type`, the value and the known names. constexpr so that
/// dtype_bits and friends stay usable in constant expressions; the throw path is never constant.
template <class Enum, std::size_t N>
constexpr Enum check_enum(std::string_view op, std::string_view type, Enum value,
                          const std::array<std::string_view, N>& names) {
  const auto raw = static_cast<std::underlying_type_t<Enum>>(value);
  if (raw < 0 || static_cast<std::size_t>(raw) >= N) {
    throw_enum_out_of_range(op, type, static_cast<long long>(raw), names);
  }
  return value;
}

/// The enumerator's name, or "unknown" for a value outside the enum (printing never throws).
template <class Enum, std::size_t N>
constexpr std::string_view enum_name(Enum value, const std::array<std::string_view, N>& names) {
  const auto raw = static_cast<std::underlying_type_t<Enum>>(value);
  return raw >= 0 && static_cast<std::size_t>(raw) < N ? names[static_cast<std::size_t>(raw)]
                                                       : std::string_view("unknown");
}

}  // namespace dissect::detail
