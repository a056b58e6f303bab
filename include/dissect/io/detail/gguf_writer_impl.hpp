// dissect/io/detail/gguf_writer_impl.hpp — PRIVATE: save_gguf's definition, the writer of
// dissect/io/gguf.hpp (included at its end, after the reader's gguf_impl.hpp).
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/io/detail/gguf_writer_impl.hpp is private to dissect: include dissect/io/gguf.hpp instead"
#endif

#include <cstring>
#include <type_traits>

namespace dissect {

namespace detail {

class GgufBytes {
 public:
  template <class T>
  void put(T value) {
    const auto* p = reinterpret_cast<const std::byte*>(&value);
    out_.insert(out_.end(), p, p + sizeof(T));
  }
  void put_string(std::string_view text) {
    put<std::uint64_t>(text.size());
    const auto* p = reinterpret_cast<const std::byte*>(text.data());
    out_.insert(out_.end(), p, p + text.size());
  }
  void put_value(const GgufValue& value, const std::string& key) {
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) {
            put_string(v);
          } else if constexpr (std::is_same_v<T, GgufValue::Array>) {
            put<std::uint32_t>(static_cast<std::uint32_t>(value.element_type()));
            put<std::uint64_t>(v.size());
            for (const GgufValue& element : v) {
              if (element.type() != value.element_type()) {
                throw Error(concat("save_gguf: metadata ", quote_file_text(key), " is an array of ",
                                   gguf_type_name(value.element_type()), " holding a ",
                                   gguf_type_name(element.type())));
              }
              put_value(element, key);
            }
          } else if constexpr (std::is_same_v<T, bool>) {
            put<std::uint8_t>(v ? 1 : 0);
          } else {
            put<T>(v);
          }
        },
        value.storage());
  }
  void pad_to(std::size_t alignment) {
    out_.resize((out_.size() + alignment - 1) / alignment * alignment, std::byte{0});
  }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  std::vector<std::byte> out_;
};

}  // namespace detail

inline void save_gguf(const std::filesystem::path& path,
                      std::span<const std::pair<std::string, GgufValue>> metadata,
                      std::span<const GgufTensorEntry> tensors) {
  std::uint32_t alignment = GgufFile::default_alignment;
  std::map<std::string_view, int> seen;
  for (const auto& [key, value] : metadata) {
    if (key.empty() || !seen.emplace(key, 0).second) {
      throw Error(concat("save_gguf: metadata key ", quote_file_text(key), " is ",
                         key.empty() ? "empty" : "given twice"));
    }
    if (key == "general.alignment") {
      const auto* a = std::get_if<std::uint32_t>(&value.storage());
      if (a == nullptr || *a == 0 || (*a & (*a - 1)) != 0) {
        throw Error(concat("save_gguf: general.alignment must be a u32 power of two, not ",
                           gguf_type_name(value.type()), " ", value.describe()));
      }
      alignment = *a;
    }
  }
  detail::GgufBytes header;
  header.put<std::uint32_t>(0x46554747u);
  header.put<std::uint32_t>(3);
  header.put<std::int64_t>(static_cast<std::int64_t>(tensors.size()));
  header.put<std::int64_t>(static_cast<std::int64_t>(metadata.size()));
  for (const auto& [key, value] : metadata) {
    header.put_string(key);
    header.put<std::uint32_t>(static_cast<std::uint32_t>(value.type()));
    header.put_value(value, key);
  }
  std::map<std::string_view, int> names;
  index_t offset = 0;
  for (const GgufTensorEntry& tensor : tensors) {
    const std::string field = concat("save_gguf: tensor ", quote_file_text(tensor.name));
    if (tensor.name.empty() || tensor.name.size() > GgufFile::max_name_bytes) {
      throw Error(concat(field, ": a name takes 1 to ", GgufFile::max_name_bytes, " bytes"));
    }
    if (!names.emplace(tensor.name, 0).second) throw Error(concat(field, " is given twice"));
    if (tensor.dims.size() > 4) {
      throw ShapeError(concat(field, " has ", tensor.dims.size(), " dims; GGUF allows 4"));
    }
    index_t bytes = ggml_row_bytes(tensor.type, tensor.dims.empty() ? 1 : tensor.dims[0], field);
    for (std::size_t d = 1; d < tensor.dims.size(); ++d) {
      if (tensor.dims[d] < 0) throw ShapeError(concat(field, ": dim ", d, " is negative"));
      bytes = checked_mul(bytes, tensor.dims[d], field);
    }
    if (static_cast<index_t>(tensor.bytes.size()) != bytes) {
      throw ShapeError(concat(
          field, " (", ggml_type_name(tensor.type), ", dims innermost first [",
          [&] {
            std::string dims;
            for (const index_t d : tensor.dims) {
              dims += concat(dims.empty() ? "" : ", ", d);
            }
            return dims;
          }(),
          "]) takes ", bytes, " bytes, not ", tensor.bytes.size()));
    }
    header.put_string(tensor.name);
    header.put<std::uint32_t>(static_cast<std::uint32_t>(tensor.dims.size()));
    for (const index_t d : tensor.dims) header.put<std::int64_t>(d);
    header.put<std::uint32_t>(static_cast<std::uint32_t>(tensor.type));
    header.put<std::uint64_t>(static_cast<std::uint64_t>(offset));
    offset = checked_add(offset, (bytes + alignment - 1) / alignment * alignment, field);
  }
  header.pad_to(alignment);
  detail::write_file_atomically(path, "save_gguf", [&](detail::FileWriter& out) {
    out.write(header.bytes());
    const std::vector<std::byte> zeros(alignment, std::byte{0});
    for (const GgufTensorEntry& tensor : tensors) {
      out.write(tensor.bytes);
      const std::size_t tail = tensor.bytes.size() % alignment;
      if (tail != 0) out.write(std::span<const std::byte>(zeros).first(alignment - tail));
    }
  });
}

}  // namespace dissect
