// dissect/io/safetensors.hpp — reading and writing safetensors, the checkpoint format of Hugging
// Face: an 8-byte little-endian header length N, N bytes of JSON
// {name: {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section, which the tensors' byte ranges cover exactly, without gaps or overlap.
//
// SafetensorsFile maps a file read-only and checks the whole header before anything is read, so
// a corrupt file is a FormatError naming the file and the tensor or field, never an out-of-bounds
// read. load() converts F32, F64, F16 and BF16 into float or double; view() hands out F32 (or
// F64) data without copying. save_safetensors writes atomically (a temporary file, fsync, rename).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/detail/enum_check.hpp"
#include "dissect/error.hpp"
#include "dissect/io/detail/atomic_file.hpp"
#include "dissect/io/detail/json.hpp"
#include "dissect/io/detail/mapped_file.hpp"
#include "dissect/io/detail/stored_dtype.hpp"
#include "dissect/shape.hpp"
#include "dissect/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// One tensor of a safetensors file, as its (checked) header describes it.
struct TensorInfo {
  std::string name;
  std::string dtype;           ///< as stored: "F32", "BF16", "I64", …
  std::vector<index_t> shape;  ///< row-major extents; empty for a scalar
  index_t begin = 0;           ///< byte range [begin, end) within the data section
  index_t end = 0;
};

namespace detail {
/// Tensor name → position: how a file or a checkpoint finds a tensor.
using TensorIndex = std::map<std::string, std::size_t, std::less<>>;
}  // namespace detail

/// A safetensors file, mapped read-only and checked whole on opening. Movable, not copyable;
/// views and TensorInfo references stay valid while the object that owns the bytes lives.
class SafetensorsFile {
 public:
  /// Headers beyond this are refused as absurd (the reference implementation's limit).
  static constexpr index_t max_header_bytes = 100'000'000;

  /// Maps and checks `path`.
  /// @throws Error if the file cannot be opened or mapped (naming the path and errno's text);
  ///         FormatError naming the file and the tensor or field for a corrupt header (and
  ///         OverflowError for a shape or byte size beyond int64).
  explicit SafetensorsFile(const std::filesystem::path& path);

  /// The same checks on a file's bytes held in memory; `name` stands for the path in messages.
  static SafetensorsFile from_bytes(std::vector<std::byte> bytes,
                                    std::filesystem::path name = "<memory>");

  const std::filesystem::path& path() const { return path_; }
  /// The "__metadata__" strings (empty if the file has none).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// Every tensor, in the order of its bytes in the file (ties, which only empty tensors make,
  /// by name).
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// Every tensor's name, sorted.
  std::vector<std::string> tensor_names() const;
  bool contains(std::string_view name) const { return index_.find(name) != index_.end(); }
  /// @throws Error naming the file and `name` if there is no such tensor.
  const TensorInfo& info(std::string_view name) const;
  /// The stored bytes of tensor `name`, whatever its dtype. @throws as info.
  std::span<const std::byte> bytes(std::string_view name) const;

  /// Tensor `name` converted to Scalar: F32, F64, F16 or BF16 into float or double (F16 and BF16
  /// exactly, F64 into float rounded to nearest).
  /// @throws Error as info, or naming the tensor and its dtype if it is another (I64, U8, …);
  ///         ShapeError naming the tensor, the file and both shapes if its rank is not Rank.
  template <class Scalar, std::size_t Rank>
  Tensor<Scalar, Rank> load(std::string_view name) const;

  /// Tensor `name` without a copy: F32 data as float, F64 as double, valid while this object's
  /// bytes live. @throws Error for another dtype or data not aligned in memory for Scalar (then
  ///         use load()); ShapeError as load.
  template <std::size_t Rank, class Scalar = float>
  ConstTensorView<Scalar, Rank> view(std::string_view name) const;

 private:
  struct Storage {
    detail::MappedFile mapped;
    std::vector<std::byte> owned;
    std::span<const std::byte> bytes() const {
      return owned.empty() ? mapped.bytes() : std::span<const std::byte>(owned);
    }
  };

  SafetensorsFile(Storage storage, std::filesystem::path path);
  void parse();
  TensorInfo parse_entry(const std::string& name, const nlohmann::json& entry) const;
  void parse_metadata(const nlohmann::json& metadata);
  void check_coverage(index_t data_bytes) const;
  std::string where() const { return detail::concat("SafetensorsFile: ", path_.string()); }

  Storage storage_;
  std::filesystem::path path_;
  index_t data_begin_ = 0;  ///< where the data section starts in the file: 8 + N
  std::vector<TensorInfo> tensors_;
  detail::TensorIndex index_;  ///< name → position in tensors_
  std::map<std::string, std::string> metadata_;
};

/// Converts tensor `name` straight into `target` (no temporary), as SafetensorsFile::load.
/// @throws ShapeError naming the tensor, the file and both shapes if they differ; Error as
///         load. `target` is untouched on a throw.
template <class Scalar, std::size_t Rank>
void load_into(const SafetensorsFile& file, std::string_view name, TensorView<Scalar, Rank> target);

/// Rows [row0, row0 + rows) × columns [col0, col0 + cols) of the 1-D or 2-D tensor `name`,
/// converted straight into `target` [rows, cols] (row-major, contiguous): one rank's slice of a
/// weight, read without loading the rest (a 1-D tensor [n] reads as [n, 1]).
/// @throws ShapeError naming the tensor, the file, its shape and the block if the block leaves
///         the tensor or the tensor has another rank; Error as load. `target` is untouched then.
template <class Scalar>
void load_block_into(const SafetensorsFile& file, std::string_view name, index_t row0, index_t rows,
                     index_t col0, index_t cols, TensorView<Scalar, 2> target);

/// The dtypes dissect writes.
enum class SaveDtype { f32, f64, f16, bf16 };

/// Its name in a file: "F32", "F64", "F16", "BF16". @throws ConfigError for a value outside the
/// enum.
std::string_view save_dtype_name(SaveDtype dtype);

/// Values already in a stored dtype, written byte for byte: quantised weights (I8, U8) and their
/// fp16 scales (F16). `dtype` is the file's name for it ("I8", "U8", "F16", "BF16", …).
struct StoredBytes {
  std::string_view dtype;
  std::span<const std::byte> bytes;
};

/// One tensor to write: its name, shape and values (row-major, borrowed: keep them alive until
/// save_safetensors returns), and the dtype to store them as.
struct SaveEntry {
  std::string name;
  std::vector<index_t> shape;
  std::variant<std::span<const float>, std::span<const double>, StoredBytes> values;
  std::optional<SaveDtype> dtype;  ///< unset: F32 for float values, F64 for double

  SaveEntry(std::string name, std::vector<index_t> shape, std::span<const float> values,
            std::optional<SaveDtype> dtype = std::nullopt);
  SaveEntry(std::string name, std::vector<index_t> shape, std::span<const double> values,
            std::optional<SaveDtype> dtype = std::nullopt);
  /// Raw stored values (dtype is theirs; the byte count must fill the shape).
  SaveEntry(std::string name, std::vector<index_t> shape, StoredBytes values);
  /// A Tensor's or a view's shape and values.
  template <TensorLike X>
  SaveEntry(std::string name, const X& tensor, std::optional<SaveDtype> dtype = std::nullopt);
};

/// Writes `entries` (and `metadata` as "__metadata__", if any) to `path` as safetensors:
/// the header's keys sorted, padded with spaces to a multiple of 8 bytes; the data ordered by
/// element size, then name, so every tensor starts aligned to its element size. Atomic: the
/// bytes go to a new temporary path + ".tmp.<random>" (created exclusively: never a symlink
/// planted there), are synced and renamed over `path`, keeping an existing file's permission
/// bits; on any failure the temporary is removed and an existing file stays as it was.
/// Everything is checked before the file is created.
/// @throws ShapeError if an entry's values do not fill its shape (or a dim is negative);
///         Error for a repeated or reserved name, a string that is not UTF-8, or an I/O failure
///         (naming the path and errno's text); ConfigError for a dtype outside SaveDtype.
void save_safetensors(const std::filesystem::path& path, std::span<const SaveEntry> entries,
                      const std::map<std::string, std::string>& metadata = {});

// ---- implementation: reading --------------------------------------------------------------------

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

/// Every name `index` holds, sorted.
inline std::vector<std::string> names_of(const TensorIndex& index) {
  std::vector<std::string> names;
  names.reserve(index.size());
  for (const auto& [name, position] : index) names.push_back(name);
  return names;
}

/// The position of tensor `name`, or Error "<owner>: <path> has no tensor "name"".
inline std::size_t find_tensor(const TensorIndex& index, std::string_view name,
                               std::string_view owner, const std::filesystem::path& path) {
  const auto found = index.find(name);
  if (found == index.end()) {
    throw Error(concat(owner, ": ", path.string(), " has no tensor \"", name, "\""));
  }
  return found->second;
}

/// `file`'s dtype kind for `info`, or Error "<op>: tensor "x" in <file> is I64; …".
inline StoredKind readable_kind(const TensorInfo& info, std::string_view op,
                                const std::filesystem::path& file) {
  const StoredDtype* dtype = find_stored_dtype(info.dtype);
  if (dtype == nullptr || dtype->kind == StoredKind::other) {
    throw Error(detail::concat(op, ": tensor \"", info.name, "\" in ", file.string(), " is ",
                               info.dtype,
                               "; dissect reads F32, F64, F16 and BF16 into float or double"));
  }
  return dtype->kind;
}

/// `info`'s shape as a Shape<Rank>, or ShapeError naming the tensor, the file and both ranks.
template <std::size_t Rank>
Shape<Rank> shape_of_rank(const TensorInfo& info, std::string_view op,
                          const std::filesystem::path& file) {
  if (info.shape.size() != Rank) {
    throw ShapeError(detail::concat(op, ": tensor \"", info.name, "\" in ", file.string(),
                                    " has shape ", format_shape(info.shape), " (rank ",
                                    info.shape.size(), "), asked for rank ", Rank));
  }
  Shape<Rank> shape{};
  std::copy(info.shape.begin(), info.shape.end(), shape.begin());
  return shape;
}

}  // namespace detail

inline SafetensorsFile::SafetensorsFile(const std::filesystem::path& path)
    : SafetensorsFile(Storage{detail::MappedFile(path, "SafetensorsFile"), {}}, path) {}

inline SafetensorsFile SafetensorsFile::from_bytes(std::vector<std::byte> bytes,
                                                   std::filesystem::path name) {
  return SafetensorsFile(Storage{{}, std::move(bytes)}, std::move(name));
}

inline SafetensorsFile::SafetensorsFile(Storage storage, std::filesystem::path path)
    : storage_(std::move(storage)), path_(std::move(path)) {
  parse();
}

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

inline std::vector<std::string> SafetensorsFile::tensor_names() const {
  return detail::names_of(index_);
}

inline const TensorInfo& SafetensorsFile::info(std::string_view name) const {
  return tensors_[detail::find_tensor(index_, name, "SafetensorsFile", path_)];
}

inline std::span<const std::byte> SafetensorsFile::bytes(std::string_view name) const {
  const TensorInfo& entry = info(name);
  return storage_.bytes().subspan(static_cast<std::size_t>(data_begin_ + entry.begin),
                                  static_cast<std::size_t>(entry.end - entry.begin));
}

template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> SafetensorsFile::load(std::string_view name) const {
  const TensorInfo& entry = info(name);
  const detail::StoredKind kind = detail::readable_kind(entry, "SafetensorsFile::load", path_);
  auto tensor = Tensor<Scalar, Rank>::uninitialized(
      detail::shape_of_rank<Rank>(entry, "SafetensorsFile::load", path_));
  detail::decode_values(bytes(name).data(), kind, tensor.size(), tensor.data());
  return tensor;
}

template <std::size_t Rank, class Scalar>
ConstTensorView<Scalar, Rank> SafetensorsFile::view(std::string_view name) const {
  static_assert(is_supported_scalar_v<Scalar>, "SafetensorsFile::view: Scalar is float or double");
  constexpr detail::StoredKind wanted =
      std::is_same_v<Scalar, float> ? detail::StoredKind::f32 : detail::StoredKind::f64;
  const TensorInfo& entry = info(name);
  const Shape<Rank> shape = detail::shape_of_rank<Rank>(entry, "SafetensorsFile::view", path_);
  const std::string_view stored = detail::stored_dtype_of(wanted).name;
  const std::string at =
      detail::concat("SafetensorsFile::view: tensor \"", entry.name, "\" in ", path_.string());
  if (entry.dtype != stored) {
    throw Error(detail::concat(at, " is ", entry.dtype, ", a view of ",
                               sizeof(Scalar) == 4 ? "float" : "double", " needs ", stored,
                               ": use load()"));
  }
  const std::byte* data = bytes(name).data();
  if (reinterpret_cast<std::uintptr_t>(data) % alignof(Scalar) != 0) {
    throw Error(
        detail::concat(at, " is not ", alignof(Scalar), "-byte aligned in memory: use load()"));
  }
  return {reinterpret_cast<const Scalar*>(data), shape};
}

template <class Scalar, std::size_t Rank>
void load_into(const SafetensorsFile& file, std::string_view name,
               TensorView<Scalar, Rank> target) {
  const TensorInfo& entry = file.info(name);
  const detail::StoredKind kind = detail::readable_kind(entry, "load_into", file.path());
  if (!std::equal(entry.shape.begin(), entry.shape.end(), target.shape().begin(),
                  target.shape().end())) {
    throw ShapeError(detail::concat("load_into: tensor \"", entry.name, "\" in ",
                                    file.path().string(), " has shape ", format_shape(entry.shape),
                                    ", the target has shape ", format_shape(target.shape())));
  }
  detail::decode_values(file.bytes(name).data(), kind, target.size(), target.data());
}

template <class Scalar>
void load_block_into(const SafetensorsFile& file, std::string_view name, index_t row0, index_t rows,
                     index_t col0, index_t cols, TensorView<Scalar, 2> target) {
  const TensorInfo& entry = file.info(name);
  const detail::StoredKind kind = detail::readable_kind(entry, "load_block_into", file.path());
  const std::size_t rank = entry.shape.size();
  const index_t height = rank >= 1 ? entry.shape[0] : 0;
  const index_t width = rank == 2 ? entry.shape[1] : 1;
  const bool inside = (rank == 1 || rank == 2) && row0 >= 0 && rows >= 0 && col0 >= 0 &&
                      cols >= 0 && row0 <= height - rows && col0 <= width - cols;
  if (!inside || target.shape() != Shape<2>{rows, cols}) {
    throw ShapeError(detail::concat(
        "load_block_into: tensor \"", entry.name, "\" in ", file.path().string(), " has shape ",
        format_shape(entry.shape), "; rows [", row0, ", ", row0, " + ", rows, "), columns [", col0,
        ", ", col0, " + ", cols, ") into a target ", format_shape(target.shape()),
        " must lie inside a 1-D or 2-D tensor and match the block"));
  }
  const std::byte* data = file.bytes(name).data();
  const index_t element = detail::stored_dtype_of(kind).bytes;
  for (index_t r = 0; r < rows; ++r) {
    detail::decode_values(data + ((row0 + r) * width + col0) * element, kind, cols,
                          target.data() + r * cols);
  }
}

// ---- implementation: writing --------------------------------------------------------------------

namespace detail {
inline constexpr std::array<std::string_view, 4> save_dtype_names{"F32", "F64", "F16", "BF16"};

/// The stored kind of a SaveDtype (checked) or of the values' own type.
template <class Scalar>
StoredKind save_kind(std::optional<SaveDtype> dtype) {
  if (!dtype) return std::is_same_v<Scalar, float> ? StoredKind::f32 : StoredKind::f64;
  check_enum("save_safetensors", "SaveDtype", *dtype, save_dtype_names);
  constexpr std::array<StoredKind, 4> kinds{StoredKind::f32, StoredKind::f64, StoredKind::f16,
                                            StoredKind::bf16};
  return kinds[static_cast<std::size_t>(*dtype)];
}

/// Error unless `text` is valid UTF-8 (JSON strings must be): `what` names the string.
inline void require_utf8(const std::string& text, std::string_view what) {
  try {
    (void)nlohmann::json(text).dump();
  } catch (const nlohmann::json::exception&) {
    throw Error(detail::concat("save_safetensors: ", what, " is not valid UTF-8"));
  }
}
}  // namespace detail

inline std::string_view save_dtype_name(SaveDtype dtype) {
  return detail::save_dtype_names[static_cast<std::size_t>(
      detail::check_enum("save_dtype_name", "SaveDtype", dtype, detail::save_dtype_names))];
}

inline SaveEntry::SaveEntry(std::string name, std::vector<index_t> shape,
                            std::span<const float> values, std::optional<SaveDtype> dtype)
    : name(std::move(name)), shape(std::move(shape)), values(values), dtype(dtype) {}

inline SaveEntry::SaveEntry(std::string name, std::vector<index_t> shape,
                            std::span<const double> values, std::optional<SaveDtype> dtype)
    : name(std::move(name)), shape(std::move(shape)), values(values), dtype(dtype) {}

inline SaveEntry::SaveEntry(std::string name, std::vector<index_t> shape, StoredBytes values)
    : name(std::move(name)), shape(std::move(shape)), values(values) {}

template <TensorLike X>
SaveEntry::SaveEntry(std::string name, const X& tensor, std::optional<SaveDtype> dtype)
    : name(std::move(name)), dtype(dtype) {
  const auto view = const_view(tensor);
  shape.assign(view.shape().begin(), view.shape().end());
  values = std::span<const scalar_of<X>>(view.data(), static_cast<std::size_t>(view.size()));
}

inline void save_safetensors(const std::filesystem::path& path, std::span<const SaveEntry> entries,
                             const std::map<std::string, std::string>& metadata) {
  struct Planned {
    const SaveEntry* entry;
    const detail::StoredDtype* stored;
    index_t bytes;
  };
  // Check everything and fix the layout before the file is created.
  std::vector<Planned> planned;
  std::map<std::string_view, const SaveEntry*> by_name;
  for (const SaveEntry& entry : entries) {
    const std::string at = detail::concat("save_safetensors: tensor \"", entry.name, "\"");
    if (entry.name == "__metadata__") throw Error(detail::concat(at, ": the name is reserved"));
    if (!by_name.emplace(entry.name, &entry).second)
      throw Error(detail::concat(at, " appears twice"));
    detail::require_utf8(entry.name, detail::concat("the name of tensor \"", entry.name, "\""));
    index_t count = 1;
    for (std::size_t axis = 0; axis < entry.shape.size(); ++axis) {
      if (entry.shape[axis] < 0) {
        throw ShapeError(detail::concat(at, ": negative dimension ", entry.shape[axis], " at axis ",
                                        axis, " of shape ", format_shape(entry.shape)));
      }
      count = checked_mul(count, entry.shape[axis], detail::concat(at, ": element count"));
    }
    if (const auto* raw = std::get_if<StoredBytes>(&entry.values)) {
      const detail::StoredDtype* stored = detail::find_stored_dtype(raw->dtype);
      if (stored == nullptr) {
        throw Error(detail::concat(at, ": \"", raw->dtype, "\" is not a safetensors dtype"));
      }
      const index_t bytes = checked_mul(count, stored->bytes, detail::concat(at, ": byte size"));
      if (static_cast<index_t>(raw->bytes.size()) != bytes) {
        throw ShapeError(detail::concat(at, ": ", raw->bytes.size(), " bytes for shape ",
                                        format_shape(entry.shape), " of ", raw->dtype, " (", bytes,
                                        " bytes)"));
      }
      planned.push_back({&entry, stored, bytes});
      continue;
    }
    std::visit(
        [&](auto values) {
          if constexpr (!std::is_same_v<decltype(values), StoredBytes>) {
            using Scalar = typename decltype(values)::element_type;
            const detail::StoredKind kind =
                detail::save_kind<std::remove_const_t<Scalar>>(entry.dtype);
            if (static_cast<index_t>(values.size()) != count) {
              throw ShapeError(detail::concat(at, ": ", values.size(), " values for shape ",
                                              format_shape(entry.shape), " (", count,
                                              " elements)"));
            }
            const detail::StoredDtype& stored = detail::stored_dtype_of(kind);
            const index_t bytes =
                checked_mul(count, stored.bytes, detail::concat(at, ": byte size"));
            planned.push_back({&entry, &stored, bytes});
          }
        },
        entry.values);
  }
  for (const auto& [key, value] : metadata) {
    detail::require_utf8(key, detail::concat("metadata key \"", key, "\""));
    detail::require_utf8(value, detail::concat("the metadata value of \"", key, "\""));
  }
  // Widest elements first, so with an 8-byte aligned data section every tensor is aligned.
  std::sort(planned.begin(), planned.end(), [](const Planned& a, const Planned& b) {
    const index_t a_size = a.stored->bytes;
    const index_t b_size = b.stored->bytes;
    return a_size != b_size ? a_size > b_size : a.entry->name < b.entry->name;
  });
  nlohmann::json header = nlohmann::json::object();
  index_t offset = 0;
  for (const Planned& item : planned) {
    const index_t end = checked_add(offset, item.bytes, "save_safetensors: data size");
    header[item.entry->name] = {{"dtype", item.stored->name},
                                {"shape", item.entry->shape},
                                {"data_offsets", {offset, end}}};
    offset = end;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data section 8-byte aligned

  detail::write_file_atomically(path, "save_safetensors", [&](detail::FileWriter& out) {
    const std::uint64_t length = text.size();
    out.write(std::as_bytes(std::span(&length, 1)));
    out.write(std::as_bytes(std::span(text)));
    constexpr index_t chunk = 1 << 16;  // elements converted at a time
    std::vector<std::byte> buffer;
    for (const Planned& item : planned) {
      std::visit(
          [&](auto values) {
            if constexpr (std::is_same_v<decltype(values), StoredBytes>) {
              out.write(values.bytes);
            } else {
              const index_t size = item.stored->bytes;
              for (index_t done = 0; done < static_cast<index_t>(values.size()); done += chunk) {
                const index_t count = std::min(chunk, static_cast<index_t>(values.size()) - done);
                buffer.resize(static_cast<std::size_t>(count * size));
                detail::encode_values(values.data() + done, item.stored->kind, count,
                                      buffer.data());
                out.write(buffer);
              }
            }
          },
          item.entry->values);
    }
  });
}

}  // namespace dissect
