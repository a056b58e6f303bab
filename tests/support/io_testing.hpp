// Test helpers for dissect/io: a temporary directory that cleans up after itself, raw
// safetensors bytes built by hand (so a test can write any header, valid or not), and files
// written and read as bytes.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace dissect::testing {

/// A fresh directory under the system's temporary directory, removed with everything in it.
class TemporaryDirectory {
 public:
  TemporaryDirectory() {
    std::string pattern = (std::filesystem::temp_directory_path() / "dissect-io-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  TemporaryDirectory(const TemporaryDirectory&) = delete;
  TemporaryDirectory& operator=(const TemporaryDirectory&) = delete;
  ~TemporaryDirectory() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(std::string_view name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

/// The bytes of a value, as a file stores them (little-endian, as this machine).
template <class T>
std::vector<std::byte> bytes_of(std::span<const T> values) {
  const auto bytes = std::as_bytes(values);
  return {bytes.begin(), bytes.end()};
}
template <class T>
std::vector<std::byte> bytes_of(const std::vector<T>& values) {
  return bytes_of(std::span<const T>(values));
}

/// A safetensors file: the 8-byte header length (`length`, or the header's true size), the
/// header text as given, then `data`.
inline std::vector<std::byte> safetensors_bytes(std::string_view header,
                                                const std::vector<std::byte>& data = {},
                                                std::optional<std::uint64_t> length = {}) {
  const std::uint64_t stated = length.value_or(header.size());
  std::string file(reinterpret_cast<const char*>(&stated), 8);
  file.append(header);
  file.append(reinterpret_cast<const char*>(data.data()), data.size());
  const auto bytes = std::as_bytes(std::span(file));
  return {bytes.begin(), bytes.end()};
}

inline void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

inline std::vector<std::byte> read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  const std::vector<char> chars{std::istreambuf_iterator<char>(in), {}};
  const auto bytes = std::as_bytes(std::span(chars));
  return {bytes.begin(), bytes.end()};
}

/// Whether `text` contains `part`, saying what it holds if not.
inline ::testing::AssertionResult contains(std::string_view text, std::string_view part) {
  if (text.find(part) != std::string_view::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << text << "\"\n  lacks \"" << part << "\"";
}

}  // namespace dissect::testing
