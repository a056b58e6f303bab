// dissect/quant/format.hpp — the low-precision weight formats: a subset of the dtypes
// (dtype.hpp), whose names and block sizes they take. What each stores and how it rounds is in
// quant/weight_format.hpp; the kernels that read them in quant/detail/quant_kernels.hpp and (for
// ggml's blocks) quant/detail/ggml_dot.hpp.
//
// Two families: dissect's own layouts (bf16, int8 per channel, q4_0 with its nibbles and scales
// in separate arrays), and ggml's blocks kept as a GGUF file stores them (q8_0, q4_K, q5_K, q6_K,
// and tq2_0, the ternary layout llama.cpp stores BitNet b1.58 models in), so a llama.cpp model
// runs on its own bytes.
#pragma once

#include <array>
#include <optional>
#include <string_view>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/detail/enum_check.hpp"
#include "dissect/core/dtype.hpp"
#include "dissect/core/error.hpp"
#include "dissect/quant/ggml_type.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

enum class WeightFormat { bf16, int8, q4_0, q8_0, q4_K, q5_K, q6_K, tq2_0 };

/// The dtype a format stores its weights as (int8 adds one fp32 scale per row, which the
/// format's own byte count includes). @throws ConfigError for a value outside the enum.
Dtype dtype_of(WeightFormat format);

/// "bf16", "int8", "q4_0", "q8_0", "q4_K", "q5_K", "q6_K", "tq2_0". @throws ConfigError for a
/// value outside the enum.
std::string_view weight_format_name(WeightFormat format);
/// The format called `name`, without regard to case ("q4_k" is "q4_K"; "q4" is accepted for
/// "q4_0"). @throws ConfigError listing the names.
WeightFormat weight_format_from_name(std::string_view name);

/// Whether `format` stores ggml's blocks as they are (q8_0, q4_K, q5_K, q6_K, tq2_0), and which
/// ggml type those blocks are. @throws ConfigError (ggml_type_of) for one of dissect's own layouts.
constexpr bool is_ggml_format(WeightFormat format);
GgmlType ggml_type_of(WeightFormat format);
/// The format that keeps `type`'s blocks as they are, if there is one.
std::optional<WeightFormat> weight_format_of(GgmlType type);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
inline constexpr std::array<Dtype, 8> weight_format_dtypes{Dtype::bf16, Dtype::int8, Dtype::q4_0,
                                                           Dtype::q8_0, Dtype::q4_K, Dtype::q5_K,
                                                           Dtype::q6_K, Dtype::tq2_0};
inline constexpr std::array<std::string_view, 8> weight_format_names = [] {
  std::array<std::string_view, 8> names{};
  for (std::size_t i = 0; i < names.size(); ++i) {
    names[i] = dtype_table[static_cast<std::size_t>(weight_format_dtypes[i])].name;
  }
  return names;
}();
/// The ggml block types of the ggml formats, in enum order from q8_0.
inline constexpr std::array<GgmlType, 5> weight_format_ggml_types{
    GgmlType::q8_0, GgmlType::q4_K, GgmlType::q5_K, GgmlType::q6_K, GgmlType::tq2_0};
static_assert(weight_format_ggml_types.size() ==
                  weight_format_names.size() - static_cast<std::size_t>(WeightFormat::q8_0),
              "every format from q8_0 on is one of ggml's");
}  // namespace detail

constexpr bool is_ggml_format(WeightFormat format) {
  return static_cast<int>(format) >= static_cast<int>(WeightFormat::q8_0) &&
         static_cast<std::size_t>(format) < detail::weight_format_names.size();
}

inline GgmlType ggml_type_of(WeightFormat format) {
  if (!is_ggml_format(format)) {
    throw ConfigError(
        concat("ggml_type_of: ",
               static_cast<std::size_t>(format) < detail::weight_format_names.size()
                   ? std::string(detail::weight_format_names[static_cast<std::size_t>(format)])
                   : concat("WeightFormat(", static_cast<int>(format), ")"),
               " is not one of ggml's block formats (q8_0, q4_K, q5_K, q6_K, tq2_0)"));
  }
  return detail::weight_format_ggml_types[static_cast<std::size_t>(format) -
                                          static_cast<std::size_t>(WeightFormat::q8_0)];
}

inline std::optional<WeightFormat> weight_format_of(GgmlType type) {
  for (std::size_t i = 0; i < detail::weight_format_ggml_types.size(); ++i) {
    if (detail::weight_format_ggml_types[i] == type) {
      return static_cast<WeightFormat>(i + static_cast<std::size_t>(WeightFormat::q8_0));
    }
  }
  return std::nullopt;
}

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
    if (detail::equal_ignoring_case(detail::weight_format_names[i], name)) {
      return static_cast<WeightFormat>(i);
    }
  }
  throw ConfigError(detail::concat("weight format \"", name,
                                   "\" is not one of bf16, int8, q4_0 (or q4), q8_0, q4_K, q5_K, "
                                   "q6_K, tq2_0"));
}

}  // namespace dissect
