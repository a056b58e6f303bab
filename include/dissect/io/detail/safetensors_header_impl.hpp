// dissect/io/detail/safetensors_header_impl.hpp — private: do not include directly
// (dissect/io/safetensors.hpp includes it at its end, after SafetensorsFile).
//
// The parsing and checking of a safetensors header, which SafetensorsFile runs whole on opening:
// the 8-byte length, each tensor's dtype, shape and byte range, the "__metadata__" strings, and
// that the ranges cover the data section exactly. Every failure is a FormatError naming the file
// and the tensor or field (an OverflowError for a size beyond int64), never a read out of bounds.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/io/detail/safetensors_header_impl.hpp is private to dissect: include dissect/io/safetensors.hpp instead"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <tuple>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/io/detail/json.hpp"
#include "dissect/io/detail/stored_dtype.hpp"

namespace dissect {

namespace detail {

// The header of a file with a million tensors holds millions of fields: the checks below build
// their messages (`where()`, `field()`) only when they fail, not for every field that passes.

/// A JSON integer in [0, INT64_MAX], or FormatError "<where()>: <field()> is …".
template <class Where, class Field>
index_t read_extent(const nlohmann::json& value, const Where& where, const Field& field) {
  if (value.is_number_unsigned()) {
    const auto extent = value.get<std::uint64_t>();
    if (extent > static_cast<std::uint64_t>(std::numeric_limits<index_t>::max())) {
      throw FormatError(detail::concat(where(), ": ", field(), " ", extent, " does not fit int64"));
    }
    return static_cast<index_t>(extent);
  }
  if (value.is_number_integer()) {
    throw FormatError(
        detail::concat(where(), ": ", field(), " is negative (", value.get<std::int64_t>(), ")"));
  }
  throw FormatError(detail::concat(where(), ": ", field(), " is ", describe_json(value),
                                   ", not a non-negative integer"));
}

/// The member `key` of a header entry, or FormatError "<where()> has no "key"".
template <class Where>
const nlohmann::json& entry_field(const nlohmann::json& entry, const Where& where,
                                  const char* key) {
  const auto found = entry.find(key);
  if (found == entry.end()) throw FormatError(detail::concat(where(), " has no \"", key, "\""));
  return *found;
}

}  // namespace detail

inline void SafetensorsFile::parse() {
  const std::span<const std::byte> file = storage_.bytes();
  if (file.size() < 8) {
    throw FormatError(detail::concat(where(), ": the file is ", file.size(),
                                     " bytes, too short for the 8-byte header length"));
  }
  std::uint64_t header_bytes = 0;
  std::memcpy(&header_bytes, file.data(), 8);  // little-endian, as this machine (stored_dtype.hpp)
  if (header_bytes > static_cast<std::uint64_t>(max_header_bytes)) {
    throw FormatError(detail::concat(where(), ": header length ", header_bytes,
                                     " exceeds the limit of ", format_count(max_header_bytes),
                                     " bytes"));
  }
  if (header_bytes > file.size() - 8) {
    throw FormatError(detail::concat(where(), ": header length ", header_bytes,
                                     " runs past the end of the ", file.size(), "-byte file"));
  }
  data_begin_ = 8 + static_cast<index_t>(header_bytes);
  const std::string_view text(reinterpret_cast<const char*>(file.data()) + 8, header_bytes);
  // Each entry is checked as soon as it is parsed (a header may list a million tensors: it is
  // never held as one JSON tree), with the errors a check in key order would give.
  const nlohmann::json header = detail::parse_json_members_strictly(
      text, where() + ": the header", [&](const std::string& name, nlohmann::json&& entry) {
        if (name == "__metadata__") {
          parse_metadata(entry);
        } else {
          tensors_.push_back(parse_entry(name, entry));
        }
      });
  if (!header.is_object()) {
    throw FormatError(detail::concat(where(), ": the header is ", detail::describe_json(header),
                                     ", not a JSON object"));
  }
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return std::tie(a.begin, a.end, a.name) < std::tie(b.begin, b.end, b.name);
  });
  check_coverage(static_cast<index_t>(file.size()) - data_begin_);
  for (std::size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
}

inline TensorInfo SafetensorsFile::parse_entry(const std::string& name,
                                               const nlohmann::json& entry) const {
  if (name.empty() || name.find('\0') != std::string::npos) {
    detail::check_tensor_name(name, where());
  }
  const auto at = [&] { return detail::concat(where(), ": tensor \"", name, "\""); };
  if (!entry.is_object()) {
    throw FormatError(
        detail::concat(at(), " is ", detail::describe_json(entry), ", not an object"));
  }
  TensorInfo info;
  info.name = name;
  const nlohmann::json& dtype = detail::entry_field(entry, at, "dtype");
  if (!dtype.is_string()) {
    throw FormatError(
        detail::concat(at(), ": \"dtype\" is ", detail::describe_json(dtype), ", not a string"));
  }
  info.dtype = dtype.get<std::string>();
  const detail::StoredDtype* stored = detail::find_stored_dtype(info.dtype);
  if (stored == nullptr)
    throw FormatError(detail::concat(at(), ": unknown dtype \"", info.dtype, "\""));

  const nlohmann::json& shape = detail::entry_field(entry, at, "shape");
  if (!shape.is_array()) {
    throw FormatError(
        detail::concat(at(), ": \"shape\" is ", detail::describe_json(shape), ", not an array"));
  }
  info.shape.reserve(shape.size());
  for (std::size_t axis = 0; axis < shape.size(); ++axis) {
    info.shape.push_back(
        detail::read_extent(shape[axis], at, [&] { return detail::concat("shape[", axis, "]"); }));
  }
  index_t bytes = stored->bytes;
  for (index_t extent : info.shape) {  // checked_mul throws the OverflowError
    bytes = !detail::mul_overflows(bytes, extent)
                ? bytes * extent
                : checked_mul(bytes, extent,
                              detail::concat(at(), ": size of ", info.dtype, " ",
                                             format_shape(info.shape)));
  }

  const nlohmann::json& offsets = detail::entry_field(entry, at, "data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    throw FormatError(detail::concat(
        at(), ": \"data_offsets\" is ", detail::describe_json(offsets),
        offsets.is_array() ? detail::concat(" of ", offsets.size()) : "", ", not [begin, end]"));
  }
  info.begin = detail::read_extent(offsets[0], at, [] { return "data_offsets[0]"; });
  info.end = detail::read_extent(offsets[1], at, [] { return "data_offsets[1]"; });
  const auto range = [&] {
    return detail::concat("data_offsets [", info.begin, ", ", info.end, "]");
  };
  const index_t data_bytes = static_cast<index_t>(storage_.bytes().size()) - data_begin_;
  if (info.end < info.begin)
    throw FormatError(detail::concat(at(), ": ", range(), " end before they begin"));
  if (info.end > data_bytes) {
    throw FormatError(detail::concat(at(), ": ", range(), " reach past the data section (",
                                     data_bytes, " bytes)"));
  }
  if (info.end - info.begin != bytes) {
    throw FormatError(detail::concat(at(), ": ", range(), " hold ", info.end - info.begin,
                                     " bytes, but ", info.dtype, " ", format_shape(info.shape),
                                     " needs ", bytes));
  }
  return info;
}

inline void SafetensorsFile::parse_metadata(const nlohmann::json& metadata) {
  if (!metadata.is_object()) {
    throw FormatError(detail::concat(where(), ": \"__metadata__\" is ",
                                     detail::describe_json(metadata), ", not an object"));
  }
  for (const auto& [key, value] : metadata.items()) {
    if (!value.is_string()) {
      throw FormatError(detail::concat(where(), ": __metadata__ \"", key, "\" is ",
                                       detail::describe_json(value), ", not a string"));
    }
    metadata_.emplace(key, value.get<std::string>());
  }
}

// The format asks the tensors to cover the data section exactly; dissect refuses a gap or
// trailing bytes as firmly as an overlap (as the reference implementation does): bytes no
// tensor owns are a sign of a truncated or spliced file.
inline void SafetensorsFile::check_coverage(index_t data_bytes) const {
  index_t covered = 0;  // tensors_ is sorted by range: each must start where the last ended
  const TensorInfo* previous = nullptr;
  const auto unowned = [&](index_t from, index_t to) {
    return FormatError(detail::concat(
        where(), ": bytes [", from, ", ", to, ") of the data section belong to no tensor",
        previous ? " (after \"" : "", previous ? previous->name : "", previous ? "\")" : ""));
  };
  for (const TensorInfo& info : tensors_) {
    if (info.begin < covered) {
      throw FormatError(detail::concat(where(), ": tensors \"", previous->name, "\" [",
                                       previous->begin, ", ", previous->end, ") and \"", info.name,
                                       "\" [", info.begin, ", ", info.end, ") overlap"));
    }
    if (info.begin > covered) throw unowned(covered, info.begin);
    covered = info.end;
    previous = &info;
  }
  if (covered != data_bytes) throw unowned(covered, data_bytes);
}

}  // namespace dissect
