// tools/common/parse.hpp — reading command-line values: sizes, rates, counts, fractions, dtypes.
//
// Shared by the tools and examples, never by the library: include/dissect/ computes with numbers
// and enums, and what "24GB", "1.5TB/s", "7B" or "half" mean on a command line is decided here.
// Sizes and counts read like a person writes them ("7e9", "124M"); identifiers — token ids, seeds,
// indices — only as plain decimal digits, so "6e1", "1k", "-1" or "+5" are errors, never a wrapped
// or rounded value.
// Every parser takes the flag it reads (e.g. "--gpu-memory") and puts it first in the message of
// the ConfigError it throws, so a tool can print the message as it is. Unit letters are
// case-insensitive.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "dissect/accounting/budget.hpp"
#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect::tools {

// ---- declarations -------------------------------------------------------------------------------

/// "fp32" (also "float32", "f32"), "fp16" ("float16", "half", "f16"), "bf16" ("bfloat16"),
/// "fp8", "int8" ("i8"), "int4" ("i4"), "fp64" ("float64"), "q4_0" ("q4").
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

/// A finite number >= 0 with nothing after it: "0", "0.8", "1e-3".
/// @throws ConfigError naming `field` if unreadable (a unit, "inf", "nan" included) or < 0.
double parse_non_negative_real(std::string_view text, std::string_view field);

/// A finite number of either sign with nothing after it: "-0.5", "0", "1e-3".
/// @throws ConfigError naming `field` if unreadable (a unit, "inf", "nan" included).
double parse_real(std::string_view text, std::string_view field);

/// A fraction in [0, 1): "0.2" or "20%".
/// @throws ConfigError naming `field` if unreadable or outside [0, 1).
double parse_fraction(std::string_view text, std::string_view field);

/// A plain decimal integer in [lowest, INT64_MAX]: digits only, blanks around them allowed; no
/// sign, point, exponent or suffix ("6e1", "1k", "+5", "-1" and "" are refused).
/// @throws ConfigError naming `field` and the text: not plain digits, < lowest, beyond int64.
index_t parse_integer(std::string_view text, std::string_view field, index_t lowest = 0);

/// A plain decimal integer in [0, 2⁶⁴ − 1] (a seed): digits only, as parse_integer.
/// @throws ConfigError naming `field` and the text: not plain digits (a sign included), > 2⁶⁴ − 1.
std::uint64_t parse_uint64(std::string_view text, std::string_view field);

/// Comma-separated token ids, "464,2068,3": each item as parse_integer (0 is an id) and below
/// `vocab`, the vocabulary's size.
/// @throws ConfigError naming `field`, the item's position (from 1) and its text: an empty item,
///         not plain digits, beyond int64, or an id >= vocab.
std::vector<index_t> parse_token_ids(std::string_view text, std::string_view field,
                                     index_t vocab = std::numeric_limits<index_t>::max());

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
  throw ConfigError(concat(field, ": unknown ", kind, " \"", text, "\" (known: ", known, ")"));
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
    throw ConfigError(concat(field, ": cannot read \"", text, "\" (examples: ", examples, ")"));
  }
  const double value = *number * *scale;
  if (!(value > 0.0) || !std::isfinite(value)) {
    throw ConfigError(concat(field, ": must be > 0 (got \"", text, "\")"));
  }
  return value;
}

/// A positive double that must be a whole number representable as int64.
inline index_t whole_positive(double value, std::string_view text, std::string_view field,
                              bool round) {
  if (round) value = std::nearbyint(value);
  if (value != std::floor(value)) {
    throw ConfigError(concat(field, ": \"", text, "\" is not a whole number"));
  }
  if (!(value > 0.0)) {
    throw ConfigError(concat(field, ": must be > 0 (got \"", text, "\")"));
  }
  // 2⁶³ is exactly representable; anything at or above it does not fit int64.
  if (value >= 9223372036854775808.0) {
    throw ConfigError(concat(field, ": \"", text, "\" overflows int64"));
  }
  return static_cast<index_t>(value);
}

/// Whether `text` is one or more decimal digits and nothing else.
inline bool plain_digits(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// ---- implementation -----------------------------------------------------------------------------

inline Dtype parse_dtype(std::string_view text, std::string_view field) {
  // The canonical names come from the library (dtype_name); the aliases are the tools' own.
  static const std::array<Choice<Dtype>, 18> names{{{dtype_name(Dtype::fp32), Dtype::fp32},
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
                                                    {"i4", Dtype::int4},
                                                    {dtype_name(Dtype::fp64), Dtype::fp64},
                                                    {"float64", Dtype::fp64},
                                                    {dtype_name(Dtype::q4_0), Dtype::q4_0},
                                                    {"q4", Dtype::q4_0}}};
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
    if (exact <= 0) throw ConfigError(concat(field, ": must be > 0 (got ", exact, ")"));
    return exact;
  }
  if (error == std::errc::result_out_of_range) {
    throw ConfigError(concat(field, ": \"", text, "\" overflows int64"));
  }
  static constexpr std::array<Choice<double>, 6> suffixes{
      {{"", 1.0}, {"k", 1e3}, {"m", 1e6}, {"b", 1e9}, {"g", 1e9}, {"t", 1e12}}};
  std::string_view unit;
  const std::optional<double> number = leading_number(trimmed, unit);
  const auto suffix = std::find_if(suffixes.begin(), suffixes.end(),
                                   [&](const Choice<double>& s) { return iequals(unit, s.first); });
  if (!number || suffix == suffixes.end()) {
    throw ConfigError(concat(field, ": cannot read \"", text,
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
    throw ConfigError(concat(field, ": cannot read \"", text,
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

inline double parse_non_negative_real(std::string_view text, std::string_view field) {
  std::string_view unit;
  const std::optional<double> number = leading_number(text, unit);
  if (!number || !unit.empty()) {
    throw ConfigError(concat(field, ": cannot read \"", text, "\" as a finite number"));
  }
  if (!(*number >= 0.0)) {
    throw ConfigError(concat(field, ": must be finite and >= 0 (got \"", text, "\")"));
  }
  return *number == 0.0 ? 0.0 : *number;  // -0 reads as 0
}

inline double parse_real(std::string_view text, std::string_view field) {
  std::string_view unit;
  const std::optional<double> number = leading_number(text, unit);
  if (!number || !unit.empty()) {
    throw ConfigError(concat(field, ": cannot read \"", text, "\" as a finite number"));
  }
  return *number == 0.0 ? 0.0 : *number;  // -0 reads as 0
}

inline double parse_fraction(std::string_view text, std::string_view field) {
  std::string_view unit;
  const std::optional<double> number = leading_number(text, unit);
  if (!number || !(unit.empty() || unit == "%")) {
    throw ConfigError(
        concat(field, ": cannot read \"", text, "\" as a fraction (examples: 0.2, 20%)"));
  }
  const double value = unit == "%" ? *number / 100.0 : *number;
  if (!(value >= 0.0 && value < 1.0)) {
    throw ConfigError(concat(field, ": must be in [0, 1) (got \"", text, "\")"));
  }
  return value;
}

inline index_t parse_integer(std::string_view text, std::string_view field, index_t lowest) {
  const std::string_view digits = trim(text);
  if (!plain_digits(digits)) {
    throw ConfigError(
        concat(field, ": \"", text, "\" is not a plain decimal integer (digits only)"));
  }
  index_t value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end != digits.data() + digits.size()) {
    throw ConfigError(concat(field, ": \"", text, "\" overflows int64"));
  }
  if (value < lowest) {
    throw ConfigError(concat(field, ": must be >= ", lowest, " (got ", value, ")"));
  }
  return value;
}

inline std::uint64_t parse_uint64(std::string_view text, std::string_view field) {
  const std::string_view digits = trim(text);
  constexpr std::uint64_t most = std::numeric_limits<std::uint64_t>::max();
  if (!plain_digits(digits)) {
    throw ConfigError(
        concat(field, ": \"", text, "\" is not a plain decimal integer in [0, ", most, "]"));
  }
  std::uint64_t value = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (error != std::errc() || end != digits.data() + digits.size()) {
    throw ConfigError(concat(field, ": \"", text, "\" is beyond ", most));
  }
  return value;
}

inline std::vector<index_t> parse_token_ids(std::string_view text, std::string_view field,
                                            index_t vocab) {
  std::vector<index_t> ids;
  std::size_t start = 0;
  for (std::size_t item = 1;; ++item) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    const std::string_view part = text.substr(start, comma - start);
    const std::string at = concat(field, ": item ", item);
    const std::string_view digits = trim(part);
    if (digits.empty()) throw ConfigError(concat(at, " is empty (ids: 464,2068,3)"));
    if (!plain_digits(digits)) {
      throw ConfigError(
          concat(at, " \"", part, "\" is not a token id (a plain decimal integer >= 0)"));
    }
    index_t id = 0;
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), id);
    if (error != std::errc() || end != digits.data() + digits.size()) {
      throw ConfigError(concat(at, " \"", part, "\" overflows int64"));
    }
    if (id >= vocab) {
      throw ConfigError(
          concat(at, " \"", part, "\" is outside the model's vocabulary [0, ", vocab, ")"));
    }
    ids.push_back(id);
    if (comma == text.size()) return ids;
    start = comma + 1;
  }
}

}  // namespace dissect::tools
