// dissect/io/detail/stored_dtype.hpp — private: do not include directly
// (dissect/io/safetensors.hpp does).
//
// The element types a safetensors file may name, with their sizes, and the conversions between
// the four dissect reads and writes (F32, F64, F16, BF16) and float or double. Names and sizes
// come from dtype.hpp's table where it has the type; only the file's other dtypes are listed
// here. Values are stored little-endian, which is this machine's order (checked at compile time),
// so F32 and F64 move as plain bytes.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/io/detail/stored_dtype.hpp is private to dissect: include dissect/io/safetensors.hpp instead"
#endif

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "dissect/core/dtype.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/numeric/half.hpp"

namespace dissect::detail {

static_assert(std::endian::native == std::endian::little,
              "dissect/io: safetensors files are little-endian; this machine is not");

/// A dtype a safetensors file may name.
struct StoredDtype {
  std::string_view name;       ///< as in the file: "F32"
  index_t bytes = 0;           ///< per element
  std::optional<Dtype> dtype;  ///< its row in dtype.hpp's table, if it has one
};

/// A safetensors dtype that dtype.hpp has no row for: its name and element size.
struct FileOnlyDtype {
  std::string_view name;
  index_t bytes;
};

/// The safetensors dtypes that dtype.hpp has no row for: known, so that a file holding them opens
/// (their sizes check its byte ranges) and raw bytes can be written as them, but never converted.
/// With the table's rows that have a file name, they are every dtype of the format whose elements
/// are whole bytes. (Sub-byte formats such as F4 are refused when a file is opened: their sizes
/// cannot be checked the same way.)
inline constexpr std::array<FileOnlyDtype, 11> file_only_dtypes{{
    {"BOOL", 1},
    {"U8", 1},
    {"F8_E5M2", 1},
    {"F8_E8M0", 1},
    {"I16", 2},
    {"U16", 2},
    {"I32", 4},
    {"U32", 4},
    {"I64", 8},
    {"U64", 8},
    {"C64", 8},
}};

/// How many of dtype.hpp's rows a safetensors file can name.
constexpr std::size_t file_named_dtype_count() {
  std::size_t count = 0;
  for (const DtypeInfo& info : dtype_table) count += !info.file_name.empty();
  return count;
}

/// Every dtype a file may name: dtype.hpp's rows that have a file name (one element a block), then
/// file_only_dtypes.
constexpr std::array<StoredDtype, file_named_dtype_count() + file_only_dtypes.size()>
make_stored_dtypes() {
  std::array<StoredDtype, file_named_dtype_count() + file_only_dtypes.size()> all{};
  std::size_t n = 0;
  for (std::size_t i = 0; i < dtype_table.size(); ++i) {
    const DtypeInfo& info = dtype_table[i];
    if (!info.file_name.empty())
      all[n++] = {info.file_name, info.block_bytes, static_cast<Dtype>(i)};
  }
  for (const FileOnlyDtype& other : file_only_dtypes) all[n++] = {other.name, other.bytes, {}};
  return all;
}

inline constexpr auto stored_dtypes = make_stored_dtypes();

/// Whether every name is one dtype, of whole-byte elements (the file's byte ranges count elements).
constexpr bool stored_dtypes_are_consistent() {
  for (std::size_t i = 0; i < stored_dtypes.size(); ++i) {
    if (stored_dtypes[i].bytes <= 0) return false;
    if (stored_dtypes[i].dtype &&
        dtype_table[static_cast<std::size_t>(*stored_dtypes[i].dtype)].block_elements != 1) {
      return false;
    }
    for (std::size_t j = 0; j < i; ++j) {
      if (stored_dtypes[j].name == stored_dtypes[i].name) return false;
    }
  }
  return true;
}
static_assert(stored_dtypes_are_consistent(),
              "dissect/io: a safetensors dtype is named twice or is not a whole-byte element type");

/// The dtypes dissect converts from and to float and double, in SaveDtype's order
/// (io/safetensors.hpp): F32, F64, F16, BF16.
inline constexpr std::array<Dtype, 4> convertible_dtypes{Dtype::fp32, Dtype::fp64, Dtype::fp16,
                                                         Dtype::bf16};

/// Their file names, in that order: the names check_enum lists for SaveDtype.
constexpr std::array<std::string_view, convertible_dtypes.size()> convertible_dtype_names() {
  std::array<std::string_view, convertible_dtypes.size()> names{};
  for (std::size_t i = 0; i < names.size(); ++i) {
    names[i] = dtype_table[static_cast<std::size_t>(convertible_dtypes[i])].file_name;
  }
  return names;
}

/// Those names for a message: "F32, F64, F16", then `last` (" and ", ", "), then "BF16".
inline std::string convertible_dtype_list(std::string_view last) {
  std::string list;
  const auto names = convertible_dtype_names();
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0) list += i + 1 < names.size() ? ", " : std::string(last);
    list += names[i];
  }
  return list;
}

/// The dtype called `name`, or nullptr.
inline const StoredDtype* find_stored_dtype(std::string_view name) {
  for (const StoredDtype& dtype : stored_dtypes) {
    if (dtype.name == name) return &dtype;
  }
  return nullptr;
}

/// The Dtype of the stored dtype called `name` if dissect converts it, else nullopt.
inline std::optional<Dtype> convertible_dtype_named(std::string_view name) {
  const StoredDtype* stored = find_stored_dtype(name);
  if (stored == nullptr || !stored->dtype) return std::nullopt;
  for (Dtype dtype : convertible_dtypes) {
    if (*stored->dtype == dtype) return dtype;
  }
  return std::nullopt;
}

/// The entry of a dtype that a file can name (one of convertible_dtypes, when writing).
inline const StoredDtype& stored_dtype_of(Dtype dtype) {
  for (const StoredDtype& stored : stored_dtypes) {
    if (stored.dtype == dtype) return stored;
  }
  return stored_dtypes.front();  // unreachable for the dtypes with a file name
}

/// Element i of little-endian `Bits` at `source` (any alignment).
template <class Bits>
Bits load_bits(const std::byte* source, index_t i) {
  Bits bits;
  std::memcpy(&bits, source + i * static_cast<index_t>(sizeof(Bits)), sizeof(Bits));
  return bits;
}

/// target[0 … count) = `count` IEEE values of type Stored (float or double, as `Bits`) at
/// `source`: a plain copy when Stored is Scalar, else each value converted.
template <class Stored, class Bits, class Scalar>
void decode_ieee(const std::byte* source, index_t count, Scalar* target) {
  if constexpr (std::is_same_v<Stored, Scalar>) {
    if (count > 0) std::memcpy(target, source, static_cast<std::size_t>(count) * sizeof(Stored));
  } else {
    for (index_t i = 0; i < count; ++i) {
      target[i] = static_cast<Scalar>(std::bit_cast<Stored>(load_bits<Bits>(source, i)));
    }
  }
}

/// target[0 … count) = the `count` stored values at `source`, converted to Scalar (F16 and BF16
/// exactly; F64 into float rounds to nearest). `dtype` is one of convertible_dtypes.
template <class Scalar>
void decode_values(const std::byte* source, Dtype dtype, index_t count, Scalar* target) {
  switch (dtype) {
    case Dtype::fp32:
      decode_ieee<float, std::uint32_t>(source, count, target);
      break;
    case Dtype::fp64:
      decode_ieee<double, std::uint64_t>(source, count, target);
      break;
    case Dtype::fp16:
      for (index_t i = 0; i < count; ++i) {
        target[i] = static_cast<Scalar>(fp16_to_float(load_bits<std::uint16_t>(source, i)));
      }
      break;
    case Dtype::bf16:
      for (index_t i = 0; i < count; ++i) {
        target[i] = static_cast<Scalar>(bf16_to_float(load_bits<std::uint16_t>(source, i)));
      }
      break;
    default:  // not convertible: the callers refused it
      break;
  }
}

/// target = `count` values from `source` stored as `dtype` (F16 and BF16 rounded once, to
/// nearest even). `dtype` is one of convertible_dtypes; `target` holds count · its size bytes.
template <class Scalar>
void encode_values(const Scalar* source, Dtype dtype, index_t count, std::byte* target) {
  const auto each = [&](auto convert) {
    for (index_t i = 0; i < count; ++i) {
      const auto bits = convert(source[i]);
      std::memcpy(target + i * static_cast<index_t>(sizeof(bits)), &bits, sizeof(bits));
    }
  };
  const auto fp16 = [](Scalar x) {
    if constexpr (std::is_same_v<Scalar, double>)
      return double_to_fp16(x);
    else
      return float_to_fp16(x);
  };
  const auto bf16 = [](Scalar x) {
    if constexpr (std::is_same_v<Scalar, double>)
      return double_to_bf16(x);
    else
      return float_to_bf16(x);
  };
  switch (dtype) {
    case Dtype::fp32:
      each([](Scalar x) { return std::bit_cast<std::uint32_t>(static_cast<float>(x)); });
      break;
    case Dtype::fp64:
      each([](Scalar x) { return std::bit_cast<std::uint64_t>(static_cast<double>(x)); });
      break;
    case Dtype::fp16:
      each(fp16);
      break;
    case Dtype::bf16:
      each(bf16);
      break;
    default:  // not convertible: the callers refused it
      break;
  }
}

}  // namespace dissect::detail
