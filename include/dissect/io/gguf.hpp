// dissect/io/gguf.hpp — reading and writing GGUF, llama.cpp's model file: a header ("GGUF", a
// version, tensor and metadata counts), typed metadata (key, value type, value: integers of
// every width, f32, f64, bool, strings, arrays of any of these, arrays included), one record per
// tensor (name, up to four dims innermost first, ggml type, byte offset), padding to
// `general.alignment` (32 unless the file says otherwise), then the tensors' bytes, each at an
// aligned offset. Little-endian; versions 2 and 3 (the same layout; 3 added the rule that a
// big-endian file says so in its version, which dissect does not read).
//
// GgufFile maps the file read-only and checks everything before anything is read: every count
// against the bytes that remain (an array of 2⁶² elements is refused before memory is taken for
// it), every string and value inside the file, nesting at most 16 arrays deep, duplicate keys
// and tensor names, tensor names up to 63 bytes (llama.cpp's limit), known ggml types (quant/
// ggml_type.hpp), a first dim that is whole blocks, sizes computed without overflow, offsets
// aligned, inside the file and not overlapping. A corrupt file is a FormatError naming the file
// and the field. Tensor data is handed out without a copy; dequantize() decodes any type of
// quant/ggml_blocks.hpp. save_gguf writes version 3 atomically, in the layout llama.cpp writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/io/detail/atomic_file.hpp"
#include "dissect/io/detail/gguf_text.hpp"
#include "dissect/io/detail/mapped_file.hpp"
#include "dissect/quant/ggml_blocks.hpp"
#include "dissect/quant/ggml_type.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// GGUF's value types, numbered as the file stores them.
enum class GgufType : std::uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};

/// "u8", …, "bool", "string", "array", "u64", "i64", "f64"; "type <n>" for another number.
std::string gguf_type_name(GgufType type);

/// Text a file supplies (a key, a tensor name, an architecture, a string value) made fit to
/// print: every byte a terminal would act on (C0 controls such as ESC, DEL, C1 controls, the
/// bidirectional overrides) and every byte that is not part of valid UTF-8 written as \xNN (ESC
/// is \x1b), a backslash doubled; printable text, UTF-8 letters included, as it is.
std::string escape_file_text(std::string_view text);
/// escape_file_text in double quotes, a double quote inside escaped: how every message of
/// dissect's GGUF readers names what the file says (`metadata "a\x1b[2Jb" …`).
std::string quote_file_text(std::string_view text);

/// One metadata value. Arrays hold values of one element type (possibly arrays themselves).
class GgufValue {
 public:
  using Array = std::vector<GgufValue>;
  using Storage = std::variant<std::uint8_t, std::int8_t, std::uint16_t, std::int16_t,
                               std::uint32_t, std::int32_t, float, bool, std::string, Array,
                               std::uint64_t, std::int64_t, double>;

  GgufValue() = default;  ///< u8 0
  GgufValue(Storage value, GgufType element_type = GgufType::u8)
      : value_(std::move(value)), element_type_(element_type) {}
  template <class T>
  requires std::is_constructible_v<Storage, T> GgufValue(T value)
      : value_(std::move(value)) {}  // NOLINT: a value converts to its GGUF type
  GgufValue(const char* text) : value_(std::string(text)) {}
  /// An array of `element_type` (its elements must be of that type: save_gguf checks).
  static GgufValue array(GgufType element_type, Array elements) {
    return GgufValue(Storage(std::move(elements)), element_type);
  }

  GgufType type() const { return static_cast<GgufType>(value_.index()); }
  /// The type of an array's elements (meaningless for other values).
  GgufType element_type() const { return element_type_; }
  const Storage& storage() const { return value_; }

  bool is_integer() const;
  /// The value of any integer type (bool is not one), if it fits the result.
  std::optional<std::uint64_t> as_unsigned() const;
  std::optional<std::int64_t> as_signed() const;
  /// f32 or f64, or an integer converted.
  std::optional<double> as_number() const;
  const std::string* as_string() const { return std::get_if<std::string>(&value_); }
  const Array* as_array() const { return std::get_if<Array>(&value_); }
  std::optional<bool> as_bool() const;

  /// For printing: 42, -1.5, true, "text" (escaped), [1, 2, 3] (the first `max_elements`, then
  /// "… (n more)").
  std::string describe(std::size_t max_elements = 8) const;

  /// Same type, element type and value (so a NaN is unequal to itself, as in C++).
  friend bool operator==(const GgufValue&, const GgufValue&) = default;

 private:
  Storage value_;
  GgufType element_type_ = GgufType::u8;
};

/// One tensor of a GGUF file, as its (checked) record describes it.
struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::f32;
  std::vector<index_t>
      dims;            ///< ggml's order, innermost (contiguous) first: W [out, in] is {in, out}
  index_t offset = 0;  ///< from the start of the data section
  index_t bytes = 0;

  /// Row-major extents, outermost first: dims reversed ({out, in} for a weight).
  std::vector<index_t> shape() const { return {dims.rbegin(), dims.rend()}; }
  index_t elements() const;
};

/// Whether `path` is a regular file that starts with GGUF's magic "GGUF", whatever its name:
/// the one test by which detect_checkpoint (io/open_model.hpp) and the tools tell a GGUF file
/// from a safetensors one. Reads four bytes; false for a missing or unreadable path (opening it
/// says why), never throws. A file it accepts may still be corrupt: GgufFile checks the rest.
bool is_gguf_file(const std::filesystem::path& path) noexcept;

/// A GGUF file, mapped read-only and checked whole on opening. Movable, not copyable; spans and
/// references stay valid while the object lives.
class GgufFile {
 public:
  static constexpr std::uint32_t default_alignment = 32;
  static constexpr std::size_t max_name_bytes = 63;  ///< llama.cpp's GGML_MAX_NAME less its NUL
  static constexpr int max_array_depth = 16;

  /// Maps and checks `path`. @throws Error if it cannot be opened or mapped; FormatError naming
  ///         the file and the field for anything corrupt (OverflowError for a size beyond int64).
  explicit GgufFile(const std::filesystem::path& path);
  /// The same checks on bytes in memory; `name` stands for the path in messages.
  static GgufFile from_bytes(std::vector<std::byte> bytes, std::filesystem::path name = "<memory>");

  const std::filesystem::path& path() const { return path_; }
  std::uint32_t version() const { return version_; }
  std::uint32_t alignment() const { return alignment_; }
  /// Where the data section starts in the file.
  index_t data_offset() const { return data_offset_; }

  /// Every key and value, in the file's order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  /// The value of `key`, or nullptr.
  const GgufValue* find(std::string_view key) const;
  /// Typed reads of required keys. @throws FormatError naming the file and the key if it is
  ///         missing or of another type (an integer that does not fit, a negative count).
  std::uint64_t require_unsigned(std::string_view key) const;
  double require_number(std::string_view key) const;
  const std::string& require_string(std::string_view key) const;
  const GgufValue::Array& require_array(std::string_view key) const;

  /// Every tensor, in the file's order of records.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  bool contains(std::string_view name) const { return index_.find(name) != index_.end(); }
  /// @throws Error naming the file and `name` if there is no such tensor.
  const GgufTensorInfo& info(std::string_view name) const;
  /// The stored bytes of tensor `name`. @throws as info.
  std::span<const std::byte> bytes(std::string_view name) const;
  /// A loader's hint after copying tensor `name` out: its whole pages leave the process's
  /// resident set (a mapped file only; reading it again maps them back, the same bytes).
  /// @throws as info.
  void release(std::string_view name) const { storage_.release(bytes(name)); }
  /// Tensor `name` decoded to floats, row-major.
  /// @throws as info; ConfigError naming the tensor for a type dissect does not decode.
  std::vector<float> dequantize(std::string_view name) const;
  /// The same as a Tensor of the file's shape (dims reversed).
  /// @throws ShapeError naming the tensor and both ranks if its rank is not Rank; as dequantize.
  template <std::size_t Rank>
  Tensor<float, Rank> load(std::string_view name) const;

 private:
  using Storage = detail::FileBytes;
  GgufFile(Storage storage, std::filesystem::path path);
  void parse();

  Storage storage_;
  std::filesystem::path path_;
  std::uint32_t version_ = 0;
  std::uint32_t alignment_ = default_alignment;
  index_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, std::size_t, std::less<>> keys_;  ///< key → position in metadata_
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, std::size_t, std::less<>> index_;  ///< name → position in tensors_
};

/// One tensor to write: its name, ggml type, dims (innermost first, as GgufTensorInfo) and its
/// stored bytes (borrowed until save_gguf returns; ggml_row_bytes(type, dims[0]) per row).
struct GgufTensorEntry {
  std::string name;
  GgmlType type = GgmlType::f32;
  std::vector<index_t> dims;
  std::span<const std::byte> bytes;
};

/// Writes a GGUF v3 file: the metadata in the order given (`general.alignment`, if given, must
/// be a u32 power of two and sets the alignment), the tensors' records, then their bytes in the
/// same order, each padded with zeros to the alignment. Atomic, as save_safetensors.
/// @throws Error for a repeated key or tensor name, a name longer than 63 bytes, an array whose
///         elements are not of its element type, a bad alignment, or an I/O failure; ShapeError
///         for bytes that do not fill a tensor's dims or more than four dims.
void save_gguf(const std::filesystem::path& path,
               std::span<const std::pair<std::string, GgufValue>> metadata,
               std::span<const GgufTensorEntry> tensors);

}  // namespace dissect

#include "dissect/io/detail/gguf_impl.hpp"
#include "dissect/io/detail/gguf_writer_impl.hpp"
