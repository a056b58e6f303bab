// tools/common/parse.hpp — reading command-line values: sizes, rates, counts, fractions, dtypes.
//
// Shared by the tools and examples, never by the library: include/dissect/ computes with numbers
// and enums, and what "24GB", "1.5TB/s", "7B" or "half" mean on a command line is decided here.
// Every parser takes the flag it reads (e.g. "--gpu-memory") and puts it first in the message of
// the ConfigError it throws, so a tool can print the message as it is. Unit letters are
// case-insensitive.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "dissect/budget.hpp"
#include "dissect/config.hpp"
#include "dissect/error.hpp"
#include "dissect/shape.hpp"

namespace dissect::tools {

// ---- declarations -------------------------------------------------------------------------------

/// "fp32" (also "float32", "f32"), "fp16" ("float16", "half", "f16"), "bf16" ("bfloat16"),
/// "fp8", "int8" ("i8"), "int4" ("i4").
/// @throws ConfigError naming `field` and listing the accepted names.
Dtype parse_dtype(std::string_view text, std::string_view field);

/// "layernorm" or "rmsnorm". @throws ConfigError naming `field` and the accepted names.
Norm parse_norm(std::string_view text, std::string_view field);

/// "learned" or "rotary". @throws ConfigError naming `field` and the accepted names.
Positions parse_positions(std::string_view text, std::string_view field);

/// A positive whole count: "7000000000", "7e9", "6.7e9", or with a suffix k, M, B (or G), T:
/// "7B", "124M".
/// @throws ConfigError naming `field` if it is not a number, not whole, <= 0 or beyond int64.
index_t parse_count(std::string_view text, std::string_view field);

/// A positive size in bytes: plain bytes ("24000000000", "2.4e10") or with a unit, decimal
/// kB MB GB TB PB (10³ⁿ) or binary KiB MiB GiB TiB PiB (2¹⁰ⁿ); the "B" may be left off ("24G").
/// Rounded to the nearest byte.
/// @throws ConfigError naming `field` if unreadable, <= 0 or beyond int64.
index_t parse_bytes(std::string_view text, std::string_view field);

/// A positive bandwidth in bytes per second: "1.5TB/s", "900GB/s", "2TiB/s", a plain number
/// of bytes per second, or a prefix alone ("1.5T").
/// @throws ConfigError naming `field` if unreadable or <= 0.
double parse_bandwidth(std::string_view text, std::string_view field);

/// A positive compute rate in FLOP/s: "300TFLOPS", "312TFLOP/s", "1e15", "300T".
/// @throws ConfigError naming `field` if unreadable or <= 0.
double parse_flops(std::string_view text, std::string_view field);

/// A fraction in [0, 1): "0.2" or "20%".
/// @throws ConfigError naming `field` if unreadable or outside [0, 1).
double parse_fraction(std::string_view text, std::string_view field);

// ---- helpers ------------------------------------------------------------------------------------

inline char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

inline bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return lower(x) == lower(y); });
}

inline std::string_view trim(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

/// A finite number at the start of `text`; `unit` receives the rest, trimmed. nullopt if there
/// is no number.
inline std::optional<double> leading_number(std::string_view text, std::string_view& unit) {
  text = trim(text);
  double value = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || !std::isfinite(value)) return std::nullopt;
  unit = trim(std::string_view(end, static_cast<std::size_t>(text.data() + text.size() - end)));
  return value;
}

/// A name and the value it stands for, for parse_choice.
template <class Value>
using Choice = std::pair<std::string_view, Value>;

/// The value of the first of `choices` whose name equals `text` (ignoring case and surrounding
/// blanks). @throws ConfigError "field: unknown <kind> "text" (known: <known>)".
template <class Value>
Value parse_choice(std::string_view text, std::string_view field, std::string_view kind,
                   std::span<const Choice<Value>> choices, std::string_view known) {
  for (const auto& [name, value] : choices) {
    if (iequals(trim(text), name)) return value;
  }
  throw ConfigError(
      detail::concat(field, ": unknown ", kind, " \"", text, "\" (known: ", known, ")"));
}

struct Prefix {
  std::string_view letters;
  double scale;
};

// Decimal prefixes are powers of 10³ and binary ones of 2¹⁰, as in IEC 80000-13.
inline constexpr std::array<Prefix, 11> size_prefixes{{{"", 1.0},
                                                       {"k", 1e3},
                                                       {"m", 1e6},
                                                       {"g", 1e9},
                                                       {"t", 1e12},
                                                       {"p", 1e15},
                                                       {"ki", 1024.0},
                                                       {"mi", 1048576.0},
                                                       {"gi", 1073741824.0},
                                                       {"ti", 1099511627776.0},
                                                       {"pi", 1125899906842624.0}}};

/// The scale of `unit` = prefix + one of `suffixes` (the empty suffix is always allowed).
inline std::optional<double> unit_scale(std::string_view unit,
                                        std::initializer_list<std::string_view> suffixes,
                                        bool binary_allowed) {
  for (const Prefix& prefix : size_prefixes) {
    if (!binary_allowed && prefix.letters.size() == 2) continue;
    if (unit.size() < prefix.letters.size() ||
        !iequals(unit.substr(0, prefix.letters.size()), prefix.letters)) {
      continue;
    }
    const std::string_view rest = unit.substr(prefix.letters.size());
    if (rest.empty()) return prefix.scale;
    for (std::string_view suffix : suffixes) {
      if (iequals(rest, suffix)) return prefix.scale;
    }
  }
  return std::nullopt;
}

/// A positive rate such as "1.5TB/s" or "300TFLOPS".
inline double parse_rate(std::string_view text, std::string_view field,
                         std::initializer_list<std::string_view> suffixes, bool binary_allowed,
                         std::string_view examples) {
  std::string_view unit;
  const std::optional<double> number = leading_number(text, unit);
  const std::optional<double> scale =
      number ? unit_scale(unit, suffixes, binary_allowed) : std::nullopt;
  if (!scale) {
    throw ConfigError(
        detail::concat(field, ": cannot read \"", text, "\" (examples: ", examples, ")"));
  }
  const double value = *number * *scale;
  if (!(value > 0.0) || !std::isfinite(value)) {
    throw ConfigError(detail::concat(field, ": must be > 0 (got \"", text, "\")"));
  }
  return value;
}

/// A positive double that must be a whole number representable as int64.
inline index_t whole_positive(double value, std::string_view text, std::string_view field,
                              bool round) {
  if (round) value = std::nearbyint(value);
  if (value != std::floor(value)) {
    throw ConfigError(detail::concat(field, ": \"", text, "\" is not a whole number"));
  }
  if (!(value > 0.0)) {
    throw ConfigError(detail::concat(field, ": must be > 0 (got \"", text, "\")"));
  }
  // 2⁶³ is exactly representable; anything at or above it does not fit int64.
  if (value >= 9223372036854775808.0) {
    throw ConfigError(detail::concat(field, ": \"", text, "\" overflows int64"));
  }
  return static_cast<index_t>(value);
}

// ---- implementation -----------------------------------------------------------------------------

inline Dtype parse_dtype(std::string_view text, std::string_view field) {
  // The canonical names come from the library (dtype_name); the aliases are the tools' own.
  static const std::array<Choice<Dtype>, 14> names{{{dtype_name(Dtype::fp32), Dtype::fp32},
                                                    {"float32", Dtype::fp32},
                                                    {"f32", Dtype::fp32},
                                                    {dtype_name(Dtype::fp16), Dtype::fp16},
                                                    {"float16", Dtype::fp16},
                                                    {"half", Dtype::fp16},
                                                    {"f16", Dtype::fp16},
                                                    {dtype_name(Dtype::bf16), Dtype::bf16},
                                                    {"bfloat16", Dtype::bf16},
                                                    {dtype_name(Dtype::fp8), Dtype::fp8},
                                                    {dtype_name(Dtype::int8), Dtype::int8},
                                                    {"i8", Dtype::int8},
                                                    {dtype_name(Dtype::int4), Dtype::int4},
                                                    {"i4", Dtype::int4}}};
  return parse_choice<Dtype>(text, field, "dtype", names, "fp32, fp16, bf16, fp8, int8, int4");
}

inline Norm parse_norm(std::string_view text, std::string_view field) {
  static constexpr std::array<Choice<Norm>, 2> names{
      {{"layernorm", Norm::layer_norm}, {"rmsnorm", Norm::rms_norm}}};
  return parse_choice<Norm>(text, field, "norm", names, "layernorm, rmsnorm");
}

inline Positions parse_positions(std::string_view text, std::string_view field) {
  static constexpr std::array<Choice<Positions>, 2> names{
      {{"learned", Positions::learned}, {"rotary", Positions::rotary}}};
  return parse_choice<Positions>(text, field, "positions", names, "learned, rotary");
}

inline index_t parse_count(std::string_view text, std::string_view field) {
  const std::string_view trimmed = trim(text);
  // Digits alone are read as an integer, so counts beyond 2⁵³ stay exact.
  index_t exact = 0;
  const auto [end, error] = std::from_chars(trimmed.data(), trimmed.data() + trimmed.size(), exact);
  if (error == std::errc() && end == trimmed.data() + trimmed.size()) {
    if (exact <= 0) throw ConfigError(detail::concat(field, ": must be > 0 (got ", exact, ")"));
    return exact;
  }
  if (error == std::errc::result_out_of_range) {
    throw ConfigError(detail::concat(field, ": \"", text, "\" overflows int64"));
  }
  static constexpr std::array<Choice<double>, 6> suffixes{
      {{"", 1.0}, {"k", 1e3}, {"m", 1e6}, {"b", 1e9}, {"g", 1e9}, {"t", 1e12}}};
  std::string_view unit;
  const std::optional<double> number = leading_number(trimmed, unit);
  const auto suffix = std::find_if(suffixes.begin(), suffixes.end(),
                                   [&](const Choice<double>& s) { return iequals(unit, s.first); });
  if (!number || suffix == suffixes.end()) {
    throw ConfigError(detail::concat(field, ": cannot read \"", text,
                                     "\" as a count (examples: 7000000000, 7e9, 7B, 124M)"));
  }
  return whole_positive(*number * suffix->second, text, field, /*round=*/false);
}

inline index_t parse_bytes(std::string_view text, std::string_view field) {
  std::string_view unit;
  const std::optional<double> number = leading_number(text, unit);
  const std::optional<double> scale =
      number ? unit_scale(unit, {"b"}, /*binary_allowed=*/true) : std::nullopt;
  if (!scale) {
    throw ConfigError(detail::concat(field, ": cannot read \"", text,
                                     "\" as a size (examples: 24GB, 80GiB, 24000000000)"));
  }
  return whole_positive(*number * *scale, text, field, /*round=*/true);
}

inline double parse_bandwidth(std::string_view text, std::string_view field) {
  return parse_rate(text, field, {"b/s", "bps"}, /*binary_allowed=*/true,
                    "1.5TB/s, 900GB/s, 2TiB/s, 1.5e12");
}

inline double parse_flops(std::string_view text, std::string_view field) {
  return parse_rate(text, field, {"flops", "flop/s"}, /*binary_allowed=*/false,
                    "300TFLOPS, 312TFLOP/s, 3e14");
}

inline double parse_fraction(std::string_view text, std::string_view field) {
  std::string_view unit;
  const std::optional<double> number = leading_number(text, unit);
  if (!number || !(unit.empty() || unit == "%")) {
    throw ConfigError(
        detail::concat(field, ": cannot read \"", text, "\" as a fraction (examples: 0.2, 20%)"));
  }
  const double value = unit == "%" ? *number / 100.0 : *number;
  if (!(value >= 0.0 && value < 1.0)) {
    throw ConfigError(detail::concat(field, ": must be in [0, 1) (got \"", text, "\")"));
  }
  return value;
}

}  // namespace dissect::tools
