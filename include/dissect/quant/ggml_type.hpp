// dissect/quant/ggml_type.hpp — ggml's tensor types, as GGUF files number them: the id a file
// stores, ggml's name for it ("q4_K"), and its block (elements per block, bytes per block).
//
// The table lists every id ggml has given out, so that a reader can measure and name a tensor
// of any type it meets, and say which types dissect decodes: F32, F16, BF16, Q8_0, Q4_0, Q4_1,
// Q5_0, Q5_1, the K-quants Q4_K, Q5_K, Q6_K (with Q8_K, the K-quants' activation format) and
// TQ2_0, the ternary format of BitNet b1.58 models.
// The formats dtype.hpp also holds (f32, f16, bf16, i8, f64, q4_0, q8_0, the K-quants dissect
// runs, tq2_0) take their blocks from its table: one size per format.
// How each decoded type turns into floats and back is in quant/ggml_blocks.hpp. Ids 4, 5 and
// 31–33, 36–38 are retired (ggml removed those types; no current file holds them).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dissect/core/dtype.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// ggml's type ids (enum ggml_type): the values GGUF stores.
enum class GgmlType : std::uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q8_1 = 9,
  q2_K = 10,
  q3_K = 11,
  q4_K = 12,
  q5_K = 13,
  q6_K = 14,
  q8_K = 15,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  i8 = 24,
  i16 = 25,
  i32 = 26,
  i64 = 27,
  f64 = 28,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
  nvfp4 = 40,
  q1_0 = 41,
  q2_0 = 42,
};

/// One type: ggml's name and block. A block is the unit a row is cut into: a row of a quantised
/// type holds a whole number of blocks.
struct GgmlTypeInfo {
  GgmlType type;
  std::string_view name;        ///< ggml's: "f32", "q8_0", "q4_K"
  std::int64_t block_elements;  ///< 1 for plain element types, 32 or 256 for most quantised ones
  std::int64_t block_bytes;     ///< bytes one block occupies
  bool decoded_by_dissect;      ///< dequantize_ggml_row / quantize_ggml_row handle it
};

/// The row of `id`, or nothing for an id ggml has never used or has retired.
constexpr std::optional<GgmlTypeInfo> ggml_type_info(std::uint32_t id);
/// The row of `type`. @throws ConfigError for a value that is not an enumerator.
constexpr GgmlTypeInfo ggml_type_info(GgmlType type);

/// ggml's name of `type` ("q4_K"), or "type <id>" for one the table does not hold.
std::string ggml_type_name(GgmlType type);
/// The type called `name`, matched without regard to case ("Q4_K", "q4_k", "BF16").
/// @throws ConfigError naming `name` and the types dissect decodes.
GgmlType ggml_type_from_name(std::string_view name);

/// Bytes of one row of `elements` values of `type`.
/// @throws ShapeError naming `what`, the type and its block if `elements` is negative or not a
///         multiple of the block; OverflowError if the size leaves int64.
index_t ggml_row_bytes(GgmlType type, index_t elements, std::string_view what = "ggml_row_bytes");

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// A row whose block is dtype.hpp's row `same`'s: a format both tables hold (fp32, q4_K, tq2_0, …)
/// is sized once, there, and ggml's table reads it. Only the names differ ("f32" and "fp32").
constexpr GgmlTypeInfo sized_as(GgmlType type, std::string_view name, Dtype same, bool decoded) {
  const DtypeInfo& info = dtype_table[static_cast<std::size_t>(same)];
  return {type, name, info.block_elements, info.block_bytes, decoded};
}

inline constexpr std::array<GgmlTypeInfo, 35> ggml_type_table{{
    sized_as(GgmlType::f32, "f32", Dtype::fp32, true),
    sized_as(GgmlType::f16, "f16", Dtype::fp16, true),
    sized_as(GgmlType::q4_0, "q4_0", Dtype::q4_0, true),
    {GgmlType::q4_1, "q4_1", 32, 20, true},
    {GgmlType::q5_0, "q5_0", 32, 22, true},
    {GgmlType::q5_1, "q5_1", 32, 24, true},
    sized_as(GgmlType::q8_0, "q8_0", Dtype::q8_0, true),
    {GgmlType::q8_1, "q8_1", 32, 36, false},
    {GgmlType::q2_K, "q2_K", 256, 84, false},
    {GgmlType::q3_K, "q3_K", 256, 110, false},
    sized_as(GgmlType::q4_K, "q4_K", Dtype::q4_K, true),
    sized_as(GgmlType::q5_K, "q5_K", Dtype::q5_K, true),
    sized_as(GgmlType::q6_K, "q6_K", Dtype::q6_K, true),
    {GgmlType::q8_K, "q8_K", 256, 292, true},
    {GgmlType::iq2_xxs, "iq2_xxs", 256, 66, false},
    {GgmlType::iq2_xs, "iq2_xs", 256, 74, false},
    {GgmlType::iq3_xxs, "iq3_xxs", 256, 98, false},
    {GgmlType::iq1_s, "iq1_s", 256, 50, false},
    {GgmlType::iq4_nl, "iq4_nl", 32, 18, false},
    {GgmlType::iq3_s, "iq3_s", 256, 110, false},
    {GgmlType::iq2_s, "iq2_s", 256, 82, false},
    {GgmlType::iq4_xs, "iq4_xs", 256, 136, false},
    sized_as(GgmlType::i8, "i8", Dtype::int8, false),
    {GgmlType::i16, "i16", 1, 2, false},
    {GgmlType::i32, "i32", 1, 4, false},
    {GgmlType::i64, "i64", 1, 8, false},
    sized_as(GgmlType::f64, "f64", Dtype::fp64, false),
    {GgmlType::iq1_m, "iq1_m", 256, 56, false},
    sized_as(GgmlType::bf16, "bf16", Dtype::bf16, true),
    {GgmlType::tq1_0, "tq1_0", 256, 54, false},
    sized_as(GgmlType::tq2_0, "tq2_0", Dtype::tq2_0, true),
    {GgmlType::mxfp4, "mxfp4", 32, 17, false},
    {GgmlType::nvfp4, "nvfp4", 64, 36, false},
    {GgmlType::q1_0, "q1_0", 128, 18, false},
    {GgmlType::q2_0, "q2_0", 64, 18, false},
}};

constexpr char ascii_lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c + 32) : c;
}

constexpr bool equal_ignoring_case(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (ascii_lower(a[i]) != ascii_lower(b[i])) return false;
  }
  return true;
}

}  // namespace detail

constexpr std::optional<GgmlTypeInfo> ggml_type_info(std::uint32_t id) {
  for (const GgmlTypeInfo& info : detail::ggml_type_table) {
    if (static_cast<std::uint32_t>(info.type) == id) return info;
  }
  return std::nullopt;
}

constexpr GgmlTypeInfo ggml_type_info(GgmlType type) {
  const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<std::uint32_t>(type));
  if (!info) {
    throw ConfigError(concat("ggml_type_info: GgmlType(", static_cast<std::uint32_t>(type),
                             ") is not a ggml type"));
  }
  return *info;
}

inline std::string ggml_type_name(GgmlType type) {
  const std::optional<GgmlTypeInfo> info = ggml_type_info(static_cast<std::uint32_t>(type));
  return info ? std::string(info->name) : concat("type ", static_cast<std::uint32_t>(type));
}

inline GgmlType ggml_type_from_name(std::string_view name) {
  for (const GgmlTypeInfo& info : detail::ggml_type_table) {
    if (detail::equal_ignoring_case(info.name, name)) return info.type;
  }
  std::string decoded;
  for (const GgmlTypeInfo& info : detail::ggml_type_table) {
    if (info.decoded_by_dissect) decoded += concat(decoded.empty() ? "" : ", ", info.name);
  }
  throw ConfigError(
      concat("ggml type \"", name, "\" is not a ggml type (dissect decodes ", decoded, ")"));
}

inline index_t ggml_row_bytes(GgmlType type, index_t elements, std::string_view what) {
  const GgmlTypeInfo info = ggml_type_info(type);
  if (elements < 0 || elements % info.block_elements != 0) {
    throw ShapeError(concat(what, ": a row of ", elements, " values is not a whole number of ",
                            info.name, " blocks (", info.block_elements, " values each)"));
  }
  return checked_mul(elements / info.block_elements, info.block_bytes, what);
}

}  // namespace dissect
