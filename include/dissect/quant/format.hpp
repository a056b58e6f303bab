// dissect/quant/format.hpp — the low-precision weight formats: a subset of the dtypes
// (dtype.hpp), whose names and block sizes they take. What each stores and how it rounds is in
// quant/weight_format.hpp; the kernels that read them in quant/detail/quant_kernels.hpp.
#pragma once

#include <array>
#include <string_view>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/detail/enum_check.hpp"
#include "dissect/dtype.hpp"
#include "dissect/error.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

enum class WeightFormat { bf16, int8, q4_0 };

/// The dtype a format stores its weights as (int8 adds one fp32 scale per row, which the
/// format's own byte count includes). @throws ConfigError for a value outside the enum.
Dtype dtype_of(WeightFormat format);

/// "bf16", "int8", "q4_0". @throws ConfigError for a value outside the enum.
std::string_view weight_format_name(WeightFormat format);
/// The format called `name` ("q4" is accepted for "q4_0"). @throws ConfigError listing the names.
WeightFormat weight_format_from_name(std::string_view name);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
inline constexpr std::array<Dtype, 3> weight_format_dtypes{Dtype::bf16, Dtype::int8, Dtype::q4_0};
inline constexpr std::array<std::string_view, 3> weight_format_names{
    dtype_table[static_cast<std::size_t>(Dtype::bf16)].name,
    dtype_table[static_cast<std::size_t>(Dtype::int8)].name,
    dtype_table[static_cast<std::size_t>(Dtype::q4_0)].name};
}  // namespace detail

inline Dtype dtype_of(WeightFormat format) {
  return detail::weight_format_dtypes[static_cast<std::size_t>(
      detail::check_enum("dtype_of", "WeightFormat", format, detail::weight_format_names))];
}

inline std::string_view weight_format_name(WeightFormat format) {
  return dtype_name(detail::weight_format_dtypes[static_cast<std::size_t>(detail::check_enum(
      "weight_format_name", "WeightFormat", format, detail::weight_format_names))]);
}

inline WeightFormat weight_format_from_name(std::string_view name) {
  if (name == "q4") return WeightFormat::q4_0;
  for (std::size_t i = 0; i < detail::weight_format_names.size(); ++i) {
    if (detail::weight_format_names[i] == name) return static_cast<WeightFormat>(i);
  }
  throw ConfigError(
      detail::concat("weight format \"", name, "\" is not one of bf16, int8, q4_0 (or q4)"));
}

}  // namespace dissect
