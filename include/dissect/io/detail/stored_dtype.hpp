// dissect/io/detail/stored_dtype.hpp — private: do not include directly
// (dissect/io/safetensors.hpp does).
//
// The element types a safetensors file may name, with their sizes, and the conversions between
// the four dissect reads and writes (F32, F64, F16, BF16) and float or double. Values are stored
// little-endian, which is this machine's order (checked at compile time), so F32 and F64 move as
// plain bytes.
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
#include <string_view>
#include <type_traits>

#include "dissect/numeric/half.hpp"
#include "dissect/shape.hpp"

namespace dissect::detail {

static_assert(std::endian::native == std::endian::little,
              "dissect/io: safetensors files are little-endian; this machine is not");

/// What dissect can do with a stored element type.
enum class StoredKind { f32, f64, f16, bf16, other };

struct StoredDtype {
  std::string_view name;  ///< as in the file: "F32"
  index_t bytes;          ///< per element
  StoredKind kind;
};

/// Every dtype of the safetensors format whose elements are whole bytes. (Sub-byte formats such
/// as F4 are refused when a file is opened: their sizes cannot be checked the same way.)
inline constexpr std::array<StoredDtype, 17> stored_dtypes{{
    {"BOOL", 1, StoredKind::other},
    {"U8", 1, StoredKind::other},
    {"I8", 1, StoredKind::other},
    {"F8_E5M2", 1, StoredKind::other},
    {"F8_E4M3", 1, StoredKind::other},
    {"F8_E8M0", 1, StoredKind::other},
    {"I16", 2, StoredKind::other},
    {"U16", 2, StoredKind::other},
    {"F16", 2, StoredKind::f16},
    {"BF16", 2, StoredKind::bf16},
    {"I32", 4, StoredKind::other},
    {"U32", 4, StoredKind::other},
    {"F32", 4, StoredKind::f32},
    {"I64", 8, StoredKind::other},
    {"U64", 8, StoredKind::other},
    {"F64", 8, StoredKind::f64},
    {"C64", 8, StoredKind::other},
}};

/// The dtype called `name`, or nullptr.
inline const StoredDtype* find_stored_dtype(std::string_view name) {
  for (const StoredDtype& dtype : stored_dtypes) {
    if (dtype.name == name) return &dtype;
  }
  return nullptr;
}

/// The entry of a kind dissect reads and writes (never StoredKind::other).
inline const StoredDtype& stored_dtype_of(StoredKind kind) {
  for (const StoredDtype& dtype : stored_dtypes) {
    if (dtype.kind == kind) return dtype;
  }
  return stored_dtypes.front();  // unreachable for the four kinds
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
/// exactly; F64 into float rounds to nearest). `kind` is one of the four dissect reads.
template <class Scalar>
void decode_values(const std::byte* source, StoredKind kind, index_t count, Scalar* target) {
  switch (kind) {
    case StoredKind::f32:
      decode_ieee<float, std::uint32_t>(source, count, target);
      break;
    case StoredKind::f64:
      decode_ieee<double, std::uint64_t>(source, count, target);
      break;
    case StoredKind::f16:
      for (index_t i = 0; i < count; ++i) {
        target[i] = static_cast<Scalar>(fp16_to_float(load_bits<std::uint16_t>(source, i)));
      }
      break;
    case StoredKind::bf16:
      for (index_t i = 0; i < count; ++i) {
        target[i] = static_cast<Scalar>(bf16_to_float(load_bits<std::uint16_t>(source, i)));
      }
      break;
    case StoredKind::other:
      break;
  }
}

/// target = `count` values from `source` stored as `kind` (F16 and BF16 rounded once, to
/// nearest even). `target` holds count · bytes(kind) bytes.
template <class Scalar>
void encode_values(const Scalar* source, StoredKind kind, index_t count, std::byte* target) {
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
  switch (kind) {
    case StoredKind::f32:
      each([](Scalar x) { return std::bit_cast<std::uint32_t>(static_cast<float>(x)); });
      break;
    case StoredKind::f64:
      each([](Scalar x) { return std::bit_cast<std::uint64_t>(static_cast<double>(x)); });
      break;
    case StoredKind::f16:
      each(fp16);
      break;
    case StoredKind::bf16:
      each(bf16);
      break;
    case StoredKind::other:
      break;
  }
}

}  // namespace dissect::detail
