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
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/detail/enum_check.hpp"
#include "dissect/core/dtype.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/io/detail/atomic_file.hpp"
#include "dissect/io/detail/json.hpp"
#include "dissect/io/detail/mapped_file.hpp"
#include "dissect/io/detail/stored_dtype.hpp"
#include "dissect/tensor/tensor.hpp"

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
  /// A loader's hint after copying tensor `name` out: its whole pages leave the process's
  /// resident set (a mapped file only; reading it again maps them back, the same bytes).
  /// @throws as info.
  void release(std::string_view name) const { storage_.release(bytes(name)); }

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
  using Storage = detail::FileBytes;

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
///         FormatError for an empty name or one holding a NUL byte (no reader could name it);
///         Error for a repeated or reserved name, a string that is not UTF-8, or an I/O failure
///         (naming the path and errno's text); ConfigError for a dtype outside SaveDtype.
void save_safetensors(const std::filesystem::path& path, std::span<const SaveEntry> entries,
                      const std::map<std::string, std::string>& metadata = {});

// ---- implementation: reading --------------------------------------------------------------------

namespace detail {

/// A tensor name as JSON writes it, quoted and escaped ("a\u0000b"): a NUL or a control byte
/// is shown, never printed raw into a message.
inline std::string quoted_name(std::string_view name) {
  return nlohmann::json(std::string(name))
      .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// Refuses a tensor name that names nothing: empty, or holding a NUL byte (C strings, and so
/// file systems and many readers, end it there: "a\0b" would be read as "a"). `where` names the
/// file or the operation. @throws FormatError.
inline void check_tensor_name(std::string_view name, std::string_view where) {
  if (name.empty()) {
    throw FormatError(concat(where, ": a tensor has an empty name"));
  }
  if (name.find('\0') != std::string_view::npos) {
    throw FormatError(concat(where, ": tensor ", quoted_name(name),
                             " has a NUL byte in its name (at byte ", name.find('\0'), ")"));
  }
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

/// The dtype of `info` if dissect converts it, or Error "<op>: tensor "x" in <file> is I64; …".
inline Dtype readable_dtype(const TensorInfo& info, std::string_view op,
                            const std::filesystem::path& file) {
  const std::optional<Dtype> dtype = convertible_dtype_named(info.dtype);
  if (!dtype) {
    throw Error(detail::concat(op, ": tensor \"", info.name, "\" in ", file.string(), " is ",
                               info.dtype, "; dissect reads ", convertible_dtype_list(" and "),
                               " into float or double"));
  }
  return *dtype;
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
  const Dtype dtype = detail::readable_dtype(entry, "SafetensorsFile::load", path_);
  auto tensor = Tensor<Scalar, Rank>::uninitialized(
      detail::shape_of_rank<Rank>(entry, "SafetensorsFile::load", path_));
  detail::decode_values(bytes(name).data(), dtype, tensor.size(), tensor.data());
  return tensor;
}

template <std::size_t Rank, class Scalar>
ConstTensorView<Scalar, Rank> SafetensorsFile::view(std::string_view name) const {
  static_assert(is_supported_scalar_v<Scalar>, "SafetensorsFile::view: Scalar is float or double");
  constexpr Dtype wanted = std::is_same_v<Scalar, float> ? Dtype::fp32 : Dtype::fp64;
  const TensorInfo& entry = info(name);
  const Shape<Rank> shape = detail::shape_of_rank<Rank>(entry, "SafetensorsFile::view", path_);
  const std::string_view stored = dtype_info(wanted).file_name;
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
  const Dtype dtype = detail::readable_dtype(entry, "load_into", file.path());
  if (!std::equal(entry.shape.begin(), entry.shape.end(), target.shape().begin(),
                  target.shape().end())) {
    throw ShapeError(detail::concat("load_into: tensor \"", entry.name, "\" in ",
                                    file.path().string(), " has shape ", format_shape(entry.shape),
                                    ", the target has shape ", format_shape(target.shape())));
  }
  detail::decode_values(file.bytes(name).data(), dtype, target.size(), target.data());
  // Copied: the file's pages need not stay resident beside the model's.
  file.release(name);
}

template <class Scalar>
void load_block_into(const SafetensorsFile& file, std::string_view name, index_t row0, index_t rows,
                     index_t col0, index_t cols, TensorView<Scalar, 2> target) {
  const TensorInfo& entry = file.info(name);
  const Dtype dtype = detail::readable_dtype(entry, "load_block_into", file.path());
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
  const index_t element = dtype_info(dtype).block_bytes;
  for (index_t r = 0; r < rows; ++r) {
    detail::decode_values(data + ((row0 + r) * width + col0) * element, dtype, cols,
                          target.data() + r * cols);
  }
}

// ---- implementation: writing --------------------------------------------------------------------

namespace detail {
/// SaveDtype's enumerators map, in order, to convertible_dtypes (io/detail/stored_dtype.hpp),
/// whose file names are these.
inline constexpr std::array<std::string_view, convertible_dtypes.size()> save_dtype_names =
    convertible_dtype_names();

/// The dtype of a SaveDtype (checked) or of the values' own type.
template <class Scalar>
Dtype save_dtype_of(std::optional<SaveDtype> dtype) {
  if (!dtype) return std::is_same_v<Scalar, float> ? Dtype::fp32 : Dtype::fp64;
  return convertible_dtypes[static_cast<std::size_t>(
      check_enum("save_safetensors", "SaveDtype", *dtype, save_dtype_names))];
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
    // What a reader refuses is not written: an empty name, or one a C string would cut short.
    detail::check_tensor_name(entry.name, "save_safetensors");
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
            const Dtype dtype = detail::save_dtype_of<std::remove_const_t<Scalar>>(entry.dtype);
            if (static_cast<index_t>(values.size()) != count) {
              throw ShapeError(detail::concat(at, ": ", values.size(), " values for shape ",
                                              format_shape(entry.shape), " (", count,
                                              " elements)"));
            }
            const detail::StoredDtype& stored = detail::stored_dtype_of(dtype);
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
                detail::encode_values(values.data() + done, *item.stored->dtype, count,
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

// The checks of a file's header, run whole on opening, are defined in a private header of their
// own, which needs SafetensorsFile above.
#include "dissect/io/detail/safetensors_header_impl.hpp"
