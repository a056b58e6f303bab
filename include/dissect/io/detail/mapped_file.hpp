// dissect/io/detail/mapped_file.hpp — private: do not include directly (dissect/io/safetensors.hpp
// does).
//
// A whole file mapped read-only into memory (POSIX open/fstat/mmap, MAP_PRIVATE), unmapped when
// its owner goes: how checkpoints are read without copying them. Movable, not copyable. A file
// truncated by another process while mapped makes reads past its new end fault (SIGBUS); that
// is the price of mmap, as in every mmap-based loader.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/io/detail/mapped_file.hpp is private to dissect: include dissect/io/checkpoint.hpp instead"
#endif

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"

namespace dissect::detail {

/// errno's text: "No such file or directory". (std::strerror is not thread-safe.)
inline std::string errno_text(int error) {
  return std::system_category().message(error);
}

class MappedFile {
 public:
  MappedFile() = default;

  /// Maps `path` whole. An empty file maps to no bytes.
  /// @throws Error "op: cannot open <path>: <errno text>" (also for a directory or a device).
  MappedFile(const std::filesystem::path& path, std::string_view op) {
    const int fd =
        ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // a FIFO must not block us
    if (fd < 0) fail(op, "cannot open", path, errno);
    struct ::stat status {};
    if (::fstat(fd, &status) != 0) fail_closing(fd, op, "cannot stat", path);
    if (!S_ISREG(status.st_mode)) {
      ::close(fd);
      throw Error(concat(op, ": cannot read ", path.string(), ": not a regular file"));
    }
    size_ = static_cast<std::size_t>(status.st_size);
    if (size_ > 0) {
      void* address = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (address == MAP_FAILED) fail_closing(fd, op, "cannot map", path);
      data_ = static_cast<const std::byte*>(address);
    }
    ::close(fd);  // the mapping keeps the file's pages; the descriptor is not needed
  }

  MappedFile(MappedFile&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}
  MappedFile& operator=(MappedFile&& other) noexcept {
    if (this != &other) {
      unmap();
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
    }
    return *this;
  }
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile() { unmap(); }

  /// The file's bytes; the start is page aligned.
  std::span<const std::byte> bytes() const { return {data_, size_}; }

 private:
  [[noreturn]] static void fail(std::string_view op, std::string_view what,
                                const std::filesystem::path& path, int error) {
    throw Error(concat(op, ": ", what, " ", path.string(), ": ", errno_text(error)));
  }
  [[noreturn]] static void fail_closing(int fd, std::string_view op, std::string_view what,
                                        const std::filesystem::path& path) {
    const int error = errno;
    ::close(fd);
    fail(op, what, path, error);
  }

  void unmap() noexcept {
    if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
    data_ = nullptr;
    size_ = 0;
  }

  const std::byte* data_ = nullptr;
  std::size_t size_ = 0;
};

/// A file's bytes as a reader parses them: mapped from disk, or held in memory (the readers'
/// from_bytes, which fuzzers and tests use).
struct FileBytes {
  MappedFile mapped;
  std::vector<std::byte> owned;
  std::span<const std::byte> bytes() const {
    return owned.empty() ? mapped.bytes() : std::span<const std::byte>(owned);
  }
  /// Drops the whole pages inside `range` (a part of bytes()) from the process's resident set,
  /// when the bytes are mapped: a loader that has copied a tensor out calls it, so that the
  /// file and the model are not both resident at the end of a load. The mapping is read-only
  /// and private, so its pages are clean: a later read maps them in again from the page cache,
  /// the same bytes. Bytes held in memory are left alone (MADV_DONTNEED would zero them).
  void release(std::span<const std::byte> range) const noexcept {
    if (!owned.empty() || range.empty()) return;
    const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
    const auto first = reinterpret_cast<std::uintptr_t>(range.data());
    const std::uintptr_t start = (first + page - 1) / page * page;
    const std::uintptr_t end = (first + range.size()) / page * page;
    if (end > start) {
      // A hint: if the kernel refuses it, the pages just stay resident.
      (void)::madvise(reinterpret_cast<void*>(start), end - start, MADV_DONTNEED);
    }
  }
};

}  // namespace dissect::detail
