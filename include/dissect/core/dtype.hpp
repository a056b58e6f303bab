// dissect/core/dtype.hpp — the one vocabulary of element types: what a budget counts, what a weight
// format stores, what a file reader and writer name.
//
// One table holds each type's name, its safetensors name and its size as a block (block
// elements and block bytes: 1 and 4 for fp32, 2 and 1 for int4, 32 and 18 for GGUF's Q4_0), so
// a new format (GGUF's K-quants, ternary weights) is one row. The enums that name subsets —
// WeightFormat (quant/format.hpp), SaveDtype (io/safetensors.hpp) — map into this one and take
// their names and sizes from it, and ggml's table of GGUF types (quant/ggml_type.hpp) takes the
// block of every format the two share from here.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string_view>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/detail/enum_check.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Element types for weights, activations and the KV cache. The first six are the budget's
/// storage dtypes (their values are stable); later ones are appended.
enum class Dtype { fp32, fp16, bf16, fp8, int8, int4, fp64, q4_0, q8_0, q4_K, q5_K, q6_K, tq2_0 };

/// One row of the table.
struct DtypeInfo {
  std::string_view name;       ///< the canonical name: "fp32", "q4_0"
  std::string_view file_name;  ///< safetensors' name ("F32", "BF16"); empty if it has none
  index_t block_elements;      ///< elements per block: 1 for element types
  index_t block_bytes;         ///< bytes per block
};

/// Returns `value` if it is a Dtype enumerator.
/// @throws ConfigError "op: Dtype(17) is out of range (known: fp32, …)".
constexpr Dtype check_dtype(std::string_view op, Dtype value);

/// The table's row for `dtype`. @throws ConfigError for a value outside the enum.
constexpr const DtypeInfo& dtype_info(Dtype dtype);

/// The canonical name: "fp32", "fp16", "bf16", "fp8", "int8", "int4", "fp64", "q4_0", "q8_0",
/// "q4_K", "q5_K", "q6_K", "tq2_0".
/// @throws ConfigError for a value outside the enum.
constexpr std::string_view dtype_name(Dtype dtype);

/// Bits per element of an element type: 32, 16, 16, 8, 8, 4, 64.
/// @throws ConfigError for a value outside the enum, or for a block format (q4_0 stores 4.5 bits
///         per weight, scales included: ask bytes_for).
constexpr int dtype_bits(Dtype dtype);

/// The dtype called `name` (canonical names only). @throws ConfigError listing the names.
Dtype dtype_from_name(std::string_view name);

/// The dtype a safetensors file calls `file_name` ("F32", "BF16", "I8"), or nothing for a name
/// the table has no row for ("U8", "I64", ""; a file may hold those, as raw bytes).
constexpr std::optional<Dtype> dtype_from_file_name(std::string_view file_name);

/// Bytes to store `elements` values of `dtype`, rounded up to whole blocks (int4 packs two per
/// byte, so an odd count needs one more half-empty byte; Q4_0 stores 18 bytes per 32 values).
/// @throws ConfigError naming `what` if `elements` < 0 or `dtype` is out of range;
///         OverflowError if the size overflows int64.
index_t bytes_for(index_t elements, Dtype dtype, std::string_view what = "bytes_for");

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline constexpr std::array<DtypeInfo, 13> dtype_table{{
    {"fp32", "F32", 1, 4},
    {"fp16", "F16", 1, 2},
    {"bf16", "BF16", 1, 2},
    {"fp8", "F8_E4M3", 1, 1},
    {"int8", "I8", 1, 1},
    {"int4", "", 2, 1},
    {"fp64", "F64", 1, 8},
    {"q4_0", "", 32, 18},  // an fp16 scale and 32 nibbles: GGUF's block_q4_0
    // ggml's blocks as GGUF stores them (quant/ggml_type.hpp has every ggml type, and reads
    // these rows' sizes; these are the ones dissect's kernels run without widening to fp32).
    {"q8_0", "", 32, 34},
    {"q4_K", "", 256, 144},
    {"q5_K", "", 256, 176},
    {"q6_K", "", 256, 210},
    // BitNet b1.58's ternary weights as llama.cpp stores them: 64 bytes of 2-bit codes and an
    // fp16 scale per 256 values, 2.0625 bits per weight.
    {"tq2_0", "", 256, 66},
}};

/// The names in enum order, as check_enum lists them.
constexpr std::array<std::string_view, dtype_table.size()> dtype_names() {
  std::array<std::string_view, dtype_table.size()> names{};
  for (std::size_t i = 0; i < names.size(); ++i) names[i] = dtype_table[i].name;
  return names;
}

}  // namespace detail

constexpr Dtype check_dtype(std::string_view op, Dtype value) {
  return detail::check_enum(op, "Dtype", value, detail::dtype_names());
}

constexpr const DtypeInfo& dtype_info(Dtype dtype) {
  return detail::dtype_table[static_cast<std::size_t>(check_dtype("dtype_info", dtype))];
}

constexpr std::string_view dtype_name(Dtype dtype) {
  return detail::dtype_table[static_cast<std::size_t>(check_dtype("dtype_name", dtype))].name;
}

constexpr int dtype_bits(Dtype dtype) {
  const DtypeInfo& info =
      detail::dtype_table[static_cast<std::size_t>(check_dtype("dtype_bits", dtype))];
  if ((info.block_bytes * 8) % info.block_elements != 0) {
    throw ConfigError(concat("dtype_bits: ", info.name, " is a block format (", info.block_bytes,
                             " bytes per ", info.block_elements, " values): use bytes_for"));
  }
  return static_cast<int>(info.block_bytes * 8 / info.block_elements);
}

inline Dtype dtype_from_name(std::string_view name) {
  for (std::size_t i = 0; i < detail::dtype_table.size(); ++i) {
    if (detail::dtype_table[i].name == name) return static_cast<Dtype>(i);
  }
  std::string known;
  for (const DtypeInfo& info : detail::dtype_table) {
    known += known.empty() ? "" : ", ";
    known += info.name;
  }
  throw ConfigError(concat("dtype \"", name, "\" is not one of ", known));
}

constexpr std::optional<Dtype> dtype_from_file_name(std::string_view file_name) {
  if (file_name.empty()) return std::nullopt;  // the rows with no file name
  for (std::size_t i = 0; i < detail::dtype_table.size(); ++i) {
    if (detail::dtype_table[i].file_name == file_name) return static_cast<Dtype>(i);
  }
  return std::nullopt;
}

inline index_t bytes_for(index_t elements, Dtype dtype, std::string_view what) {
  if (elements < 0) throw ConfigError(concat(what, ": negative element count ", elements));
  const DtypeInfo& info = detail::dtype_table[static_cast<std::size_t>(check_dtype(what, dtype))];
  // ceil(elements / block) whole blocks, without forming elements · bytes first.
  const index_t blocks = elements / info.block_elements + (elements % info.block_elements != 0);
  return checked_mul(blocks, info.block_bytes, what);
}

}  // namespace dissect
