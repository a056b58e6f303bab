// dissect/io/detail/gguf_impl.hpp — PRIVATE: the out-of-line definitions of dissect/io/gguf.hpp
// (included at its end): the checked parser and value printing (the writer: gguf_writer_impl.hpp).
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error "dissect/io/detail/gguf_impl.hpp is private to dissect: include dissect/io/gguf.hpp instead"
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>
#include <utility>

namespace dissect {

namespace detail {

inline constexpr std::array<std::string_view, 13> gguf_type_names{
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};

/// Bytes of one value of a fixed-size type; 0 for string and array.
constexpr std::size_t gguf_fixed_size(GgufType type) {
  switch (type) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
      return 8;
    default:
      return 0;
  }
}

/// The fewest bytes a value of `type` can take in a file: what bounds a count before it is
/// trusted (a string's length prefix, an array's element type and count).
constexpr std::size_t gguf_min_size(GgufType type) {
  if (type == GgufType::string) return 8;
  if (type == GgufType::array) return 12;
  return gguf_fixed_size(type);
}

/// Reads a GGUF file front to back; every read is checked against the bytes left, and every
/// failure names the file and where in it the reader was.
class GgufReader {
 public:
  GgufReader(std::span<const std::byte> bytes, const std::filesystem::path& path)
      : bytes_(bytes), path_(path) {}

  std::size_t position() const { return position_; }
  std::size_t remaining() const { return bytes_.size() - position_; }

  [[noreturn]] void fail(std::string_view what) const {
    throw FormatError(concat("GgufFile: ", path_.string(), ": ", what));
  }

  /// The next T; `field` (a string, or a callable giving one, so that reading a vocabulary's
  /// 10⁵ values builds no message unless one fails) names it in the error.
  template <class T, class Field>
  T read(const Field& field) {
    if (remaining() < sizeof(T)) {
      fail(concat(name_of(field), " at byte ", position_, " needs ", sizeof(T),
                  " bytes, but the file ends ", remaining(), " bytes later (truncated)"));
    }
    T value;
    std::memcpy(&value, bytes_.data() + position_, sizeof(T));  // little-endian hosts only
    position_ += sizeof(T);
    return value;
  }

  template <class Field>
  std::string read_string(const Field& field) {
    const auto length = read<std::uint64_t>(field);
    if (length > remaining()) {
      fail(concat(name_of(field), ": a string of ", length, " bytes at byte ", position_ - 8,
                  " is longer than the ", remaining(), " bytes left in the file"));
    }
    std::string text(reinterpret_cast<const char*>(bytes_.data() + position_),
                     static_cast<std::size_t>(length));
    position_ += static_cast<std::size_t>(length);
    return text;
  }

  GgufType read_type(std::string_view field) {
    const auto raw = read<std::uint32_t>(field);
    if (raw >= gguf_type_names.size()) {
      fail(concat(field, " has value type ", raw, ", which GGUF does not define (0..12)"));
    }
    return static_cast<GgufType>(raw);
  }

  GgufValue read_value(GgufType type, const std::string& key, int depth) {
    const auto field = [&key] { return concat("metadata ", quote_file_text(key)); };
    switch (type) {
      case GgufType::u8:
        return read<std::uint8_t>(field);
      case GgufType::i8:
        return read<std::int8_t>(field);
      case GgufType::u16:
        return read<std::uint16_t>(field);
      case GgufType::i16:
        return read<std::int16_t>(field);
      case GgufType::u32:
        return read<std::uint32_t>(field);
      case GgufType::i32:
        return read<std::int32_t>(field);
      case GgufType::f32:
        return read<float>(field);
      case GgufType::boolean: {
        const auto raw = read<std::uint8_t>(field);
        if (raw > 1) fail(concat(field(), " is a bool stored as ", int{raw}, ", not 0 or 1"));
        return raw == 1;
      }
      case GgufType::string:
        return read_string(field);
      case GgufType::u64:
        return read<std::uint64_t>(field);
      case GgufType::i64:
        return read<std::int64_t>(field);
      case GgufType::f64:
        return read<double>(field);
      case GgufType::array: {
        if (depth >= GgufFile::max_array_depth) {
          fail(concat(field(), " nests arrays more than ", GgufFile::max_array_depth, " deep"));
        }
        const GgufType element = read_type(concat(field(), "'s element type"));
        const auto count = read<std::uint64_t>([&] { return concat(field(), "'s element count"); });
        if (count > remaining() / std::max<std::size_t>(1, gguf_min_size(element))) {
          fail(concat(field(), " claims ", count, " elements of ",
                      gguf_type_names[static_cast<std::size_t>(element)], ", more than the ",
                      remaining(), " bytes left in the file can hold"));
        }
        GgufValue::Array elements;
        elements.reserve(static_cast<std::size_t>(count));
        for (std::uint64_t i = 0; i < count; ++i)
          elements.push_back(read_value(element, key, depth + 1));
        return GgufValue::array(element, std::move(elements));
      }
    }
    fail(concat(field(), ": unreachable value type"));
  }

  template <class Field>
  static std::string name_of(const Field& field) {
    if constexpr (std::is_invocable_v<const Field&>) {
      return field();
    } else {
      return std::string(field);
    }
  }

 private:
  std::span<const std::byte> bytes_;
  const std::filesystem::path& path_;
  std::size_t position_ = 0;
};

}  // namespace detail

inline std::string escape_file_text(std::string_view text) {
  return detail::escape_file_text(text, false);
}

inline std::string quote_file_text(std::string_view text) {
  return concat("\"", detail::escape_file_text(text, true), "\"");
}

inline std::string gguf_type_name(GgufType type) {
  const auto raw = static_cast<std::uint32_t>(type);
  return raw < detail::gguf_type_names.size() ? std::string(detail::gguf_type_names[raw])
                                              : concat("type ", raw);
}

// ---- GgufValue ----------------------------------------------------------------------------------

inline bool GgufValue::is_integer() const {
  switch (type()) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::u16:
    case GgufType::i16:
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::u64:
    case GgufType::i64:
      return true;
    default:
      return false;
  }
}

inline std::optional<std::uint64_t> GgufValue::as_unsigned() const {
  if (!is_integer()) return std::nullopt;
  return std::visit(
      [](const auto& v) -> std::optional<std::uint64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_signed_v<T>) {
            if (v < 0) return std::nullopt;
          }
          return static_cast<std::uint64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      value_);
}

inline std::optional<std::int64_t> GgufValue::as_signed() const {
  if (!is_integer()) return std::nullopt;
  return std::visit(
      [](const auto& v) -> std::optional<std::int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          if constexpr (std::is_same_v<T, std::uint64_t>) {
            if (v > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
              return std::nullopt;
            }
          }
          return static_cast<std::int64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      value_);
}

inline std::optional<double> GgufValue::as_number() const {
  if (const auto* f = std::get_if<float>(&value_)) return *f;
  if (const auto* d = std::get_if<double>(&value_)) return *d;
  if (const auto s = as_signed()) return static_cast<double>(*s);
  if (const auto u = as_unsigned()) return static_cast<double>(*u);
  return std::nullopt;
}

inline std::optional<bool> GgufValue::as_bool() const {
  if (const auto* b = std::get_if<bool>(&value_)) return *b;
  return std::nullopt;
}

inline std::string GgufValue::describe(std::size_t max_elements) const {
  return std::visit(
      [&](const auto& v) -> std::string {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          return v ? "true" : "false";
        } else if constexpr (std::is_same_v<T, std::string>) {
          return quote_file_text(v);
        } else if constexpr (std::is_same_v<T, Array>) {
          std::string out = "[";
          for (std::size_t i = 0; i < v.size() && i < max_elements; ++i) {
            if (i > 0) out += ", ";
            out += v[i].describe(max_elements);
          }
          if (v.size() > max_elements) out += concat(", … (", v.size() - max_elements, " more)");
          return out + "]";
        } else if constexpr (std::is_same_v<T, std::uint8_t> || std::is_same_v<T, std::int8_t>) {
          return concat(static_cast<int>(v));
        } else if constexpr (std::is_floating_point_v<T>) {
          std::ostringstream out;
          out.precision(std::numeric_limits<T>::max_digits10);
          out << v;
          return out.str();
        } else {
          return concat(v);
        }
      },
      value_);
}

// ---- GgufFile -----------------------------------------------------------------------------------

inline bool is_gguf_file(const std::filesystem::path& path) noexcept {
  try {
    std::error_code error;
    if (!std::filesystem::is_regular_file(path, error)) return false;
    std::ifstream in(path, std::ios::binary);
    char magic[4] = {};
    in.read(magic, 4);
    return in.gcount() == 4 && std::string_view(magic, 4) == "GGUF";
  } catch (...) {
    return false;  // std::ifstream may allocate; a path that cannot be read is no GGUF file here
  }
}

inline index_t GgufTensorInfo::elements() const {
  index_t n = 1;
  for (const index_t d : dims) n = checked_mul(n, d, "GgufTensorInfo::elements");
  return n;
}

inline GgufFile::GgufFile(const std::filesystem::path& path)
    : GgufFile(Storage{detail::MappedFile(path, "GgufFile"), {}}, path) {}

inline GgufFile GgufFile::from_bytes(std::vector<std::byte> bytes, std::filesystem::path name) {
  return GgufFile(Storage{{}, std::move(bytes)}, std::move(name));
}

inline GgufFile::GgufFile(Storage storage, std::filesystem::path path)
    : storage_(std::move(storage)), path_(std::move(path)) {
  parse();
}

inline void GgufFile::parse() {
  const std::span<const std::byte> file = storage_.bytes();
  detail::GgufReader in(file, path_);
  const auto magic = in.read<std::uint32_t>("the magic");
  if (magic != 0x46554747u) {  // "GGUF" read little-endian
    in.fail("does not start with \"GGUF\": not a GGUF file");
  }
  version_ = in.read<std::uint32_t>("the version");
  const auto swapped = [](std::uint32_t v) {
    return (v >> 24) | ((v >> 8) & 0xff00u) | ((v << 8) & 0xff0000u) | (v << 24);
  };
  if (version_ == 1) in.fail("is GGUF version 1 (32-bit counts), which dissect does not read");
  if (version_ != 2 && version_ != 3) {
    if (swapped(version_) == 2 || swapped(version_) == 3) {
      in.fail(concat("is a big-endian GGUF (version ", swapped(version_),
                     "), which dissect does not read"));
    }
    in.fail(concat("has GGUF version ", version_, "; dissect reads versions 2 and 3"));
  }
  const auto tensor_count = in.read<std::int64_t>("the tensor count");
  const auto key_count = in.read<std::int64_t>("the metadata count");
  // The smallest record: a key (its 8-byte length; an empty key is refused below, by name), a
  // type and a 1-byte value; a tensor with an empty name, no dims, a type and an offset.
  constexpr std::size_t min_key_record = 8 + 4 + 1, min_tensor_record = 8 + 4 + 4 + 8;
  if (key_count < 0 || static_cast<std::uint64_t>(key_count) > in.remaining() / min_key_record) {
    in.fail(concat("claims ", key_count, " metadata entries; the ", in.remaining(),
                   " bytes left hold at most ", in.remaining() / min_key_record));
  }
  if (tensor_count < 0 ||
      static_cast<std::uint64_t>(tensor_count) > in.remaining() / min_tensor_record) {
    in.fail(concat("claims ", tensor_count, " tensors; the ", in.remaining(),
                   " bytes left hold at most ", in.remaining() / min_tensor_record));
  }

  metadata_.reserve(static_cast<std::size_t>(key_count));
  for (std::int64_t i = 0; i < key_count; ++i) {
    std::string key = in.read_string(concat("metadata key ", i));
    if (key.empty()) in.fail(concat("metadata key ", i, " is empty"));
    if (keys_.count(key) != 0)
      in.fail(concat("metadata key ", quote_file_text(key), " appears twice"));
    const GgufType type = in.read_type(concat("metadata ", quote_file_text(key)));
    GgufValue value = in.read_value(type, key, 0);
    keys_.emplace(key, metadata_.size());
    metadata_.emplace_back(std::move(key), std::move(value));
  }
  if (const GgufValue* alignment = find("general.alignment")) {
    const auto* value = std::get_if<std::uint32_t>(&alignment->storage());
    if (value == nullptr) {
      in.fail(concat("metadata \"general.alignment\" is a ", gguf_type_name(alignment->type()),
                     "; GGUF requires a u32"));
    }
    if (*value == 0 || (*value & (*value - 1)) != 0) {
      in.fail(concat("metadata \"general.alignment\" is ", *value, ", not a power of two"));
    }
    alignment_ = *value;
  }

  tensors_.reserve(static_cast<std::size_t>(tensor_count));
  for (std::int64_t i = 0; i < tensor_count; ++i) {
    GgufTensorInfo info;
    info.name = in.read_string(concat("the name of tensor ", i));
    const std::string field = concat("tensor ", quote_file_text(info.name));
    if (info.name.empty()) in.fail(concat("tensor ", i, " has an empty name"));
    if (info.name.size() > max_name_bytes) {
      in.fail(concat(field, ": its name is ", info.name.size(), " bytes; GGUF names take at most ",
                     max_name_bytes));
    }
    if (index_.count(info.name) != 0) in.fail(concat(field, " appears twice"));
    const auto rank = in.read<std::uint32_t>(concat(field, "'s dim count"));
    if (rank > 4) in.fail(concat(field, " has ", rank, " dims; ggml tensors have at most 4"));
    for (std::uint32_t d = 0; d < rank; ++d) {
      const auto extent = in.read<std::int64_t>(concat(field, "'s dim ", d));
      if (extent < 0) in.fail(concat(field, "'s dim ", d, " is negative (", extent, ")"));
      info.dims.push_back(extent);
    }
    const auto type_id = in.read<std::uint32_t>(concat(field, "'s type"));
    const std::optional<GgmlTypeInfo> type = ggml_type_info(type_id);
    if (!type) in.fail(concat(field, " has ggml type ", type_id, ", which ggml does not define"));
    info.type = type->type;
    const auto offset = in.read<std::uint64_t>(concat(field, "'s offset"));
    try {
      const index_t row = info.dims.empty() ? 1 : info.dims[0];
      if (row % type->block_elements != 0) {
        in.fail(concat(field, " ", format_shape(info.shape()), " is ", type->name,
                       ", whose blocks hold ", type->block_elements, " values: its rows of ", row,
                       " are not whole blocks"));
      }
      info.bytes = ggml_row_bytes(info.type, row, field);
      for (std::size_t d = 1; d < info.dims.size(); ++d) {
        info.bytes = checked_mul(info.bytes, info.dims[d], field);
      }
    } catch (const OverflowError& error) {
      throw OverflowError(concat("GgufFile: ", path_.string(), ": ", error.what()));
    }
    if (offset % alignment_ != 0) {
      in.fail(
          concat(field, "'s offset ", offset, " is not a multiple of the alignment ", alignment_));
    }
    if (offset > static_cast<std::uint64_t>(std::numeric_limits<index_t>::max())) {
      in.fail(concat(field, "'s offset ", offset, " is beyond any file"));
    }
    info.offset = static_cast<index_t>(offset);
    index_.emplace(info.name, tensors_.size());
    tensors_.push_back(std::move(info));
  }

  // The data section starts at the first aligned byte after the records.
  const std::size_t end_of_records = in.position();
  const std::size_t data = (end_of_records + alignment_ - 1) / alignment_ * alignment_;
  data_offset_ = static_cast<index_t>(data);
  const index_t data_bytes =
      data <= file.size() ? static_cast<index_t>(file.size() - data) : index_t{0};
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const GgufTensorInfo& info : tensors_) {
    if (info.bytes > 0 &&
        (data > file.size() || info.offset > data_bytes || info.bytes > data_bytes - info.offset)) {
      in.fail(concat("tensor ", quote_file_text(info.name), " (", ggml_type_name(info.type), " ",
                     format_shape(info.shape()), ", ", info.bytes, " bytes at data offset ",
                     info.offset, ") runs past the end of the file (", data_bytes,
                     " data bytes): truncated"));
    }
    by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (std::size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& before = *by_offset[i - 1];
    const GgufTensorInfo& after = *by_offset[i];
    if (before.bytes > 0 && after.bytes > 0 && before.offset + before.bytes > after.offset) {
      in.fail(concat("tensors ", quote_file_text(before.name), " (bytes ", before.offset, "..",
                     before.offset + before.bytes, ") and ", quote_file_text(after.name), " (from ",
                     after.offset, ") overlap"));
    }
  }
}

inline const GgufValue* GgufFile::find(std::string_view key) const {
  const auto it = keys_.find(key);
  return it == keys_.end() ? nullptr : &metadata_[it->second].second;
}

namespace detail {
inline const GgufValue& require_key(const GgufFile& file, std::string_view key) {
  const GgufValue* value = file.find(key);
  if (value == nullptr) {
    throw FormatError(
        concat("GgufFile: ", file.path().string(), ": has no metadata ", quote_file_text(key)));
  }
  return *value;
}
[[noreturn]] inline void wrong_key_type(const GgufFile& file, std::string_view key,
                                        const GgufValue& value, std::string_view wanted) {
  throw FormatError(concat("GgufFile: ", file.path().string(), ": metadata ", quote_file_text(key),
                           " is ", gguf_type_name(value.type()), " ", value.describe(3), ", not ",
                           wanted));
}
}  // namespace detail

inline std::uint64_t GgufFile::require_unsigned(std::string_view key) const {
  const GgufValue& value = detail::require_key(*this, key);
  if (const auto number = value.as_unsigned()) return *number;
  detail::wrong_key_type(*this, key, value, "a non-negative integer");
}

inline double GgufFile::require_number(std::string_view key) const {
  const GgufValue& value = detail::require_key(*this, key);
  if (const auto number = value.as_number()) return *number;
  detail::wrong_key_type(*this, key, value, "a number");
}

inline const std::string& GgufFile::require_string(std::string_view key) const {
  const GgufValue& value = detail::require_key(*this, key);
  if (const auto* text = value.as_string()) return *text;
  detail::wrong_key_type(*this, key, value, "a string");
}

inline const GgufValue::Array& GgufFile::require_array(std::string_view key) const {
  const GgufValue& value = detail::require_key(*this, key);
  if (const auto* elements = value.as_array()) return *elements;
  detail::wrong_key_type(*this, key, value, "an array");
}

inline const GgufTensorInfo& GgufFile::info(std::string_view name) const {
  const auto it = index_.find(name);
  if (it == index_.end()) {
    throw Error(concat("GgufFile: ", path_.string(), " has no tensor ", quote_file_text(name)));
  }
  return tensors_[it->second];
}

inline std::span<const std::byte> GgufFile::bytes(std::string_view name) const {
  const GgufTensorInfo& tensor = info(name);
  // An empty tensor's offset is never checked against the file (it reads nothing): no subspan.
  if (tensor.bytes == 0) return {};
  return storage_.bytes().subspan(static_cast<std::size_t>(data_offset_ + tensor.offset),
                                  static_cast<std::size_t>(tensor.bytes));
}

inline std::vector<float> GgufFile::dequantize(std::string_view name) const {
  const GgufTensorInfo& tensor = info(name);
  if (!ggml_type_info(tensor.type).decoded_by_dissect) {
    throw ConfigError(concat("GgufFile: ", path_.string(), ": tensor ", quote_file_text(name),
                             " is ", ggml_type_name(tensor.type),
                             ", which dissect does not decode"));
  }
  std::vector<float> values(static_cast<std::size_t>(tensor.elements()));
  dequantize_ggml(tensor.type, bytes(name), values);
  return values;
}

template <std::size_t Rank>
Tensor<float, Rank> GgufFile::load(std::string_view name) const {
  const GgufTensorInfo& tensor = info(name);
  const std::vector<index_t> shape = tensor.shape();
  if (shape.size() != Rank) {
    throw ShapeError(concat("GgufFile::load: tensor ", quote_file_text(name), " of ",
                            path_.string(), " is ", format_shape(shape), " (rank ", shape.size(),
                            "), not rank ", Rank));
  }
  std::array<index_t, Rank> extents{};
  std::copy(shape.begin(), shape.end(), extents.begin());
  Tensor<float, Rank> result(extents);
  const std::vector<float> values = dequantize(name);
  std::copy(values.begin(), values.end(), result.data());
  return result;
}

}  // namespace dissect
