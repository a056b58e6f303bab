// dissect/io/detail/atomic_file.hpp — private: do not include directly (dissect/io/safetensors.hpp
// does).
//
// Writes a file so that its path only ever names the old file or the complete new one: the bytes
// go to `path + ".tmp.<pid>"` in the same directory, are fsync'ed, and the temporary is renamed
// over `path` (rename is atomic within a file system). On any failure the temporary is removed,
// the old file stays as it was, and the Error names the path and errno's text.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/error.hpp"
#include "dissect/io/detail/mapped_file.hpp"

namespace dissect::detail {

/// Buffered writes to the temporary file; every failure throws Error naming the target path.
class FileWriter {
 public:
  FileWriter(int fd, const std::filesystem::path& target, std::string_view op)
      : fd_(fd), target_(target), op_(op) {
    buffer_.reserve(buffer_size);
  }

  void write(std::span<const std::byte> bytes) {
    if (buffer_.size() + bytes.size() > buffer_size) flush();
    if (bytes.size() >= buffer_size) {
      write_through(bytes);
    } else {
      buffer_.insert(buffer_.end(), bytes.begin(), bytes.end());
    }
  }

  void flush() {
    write_through(buffer_);
    buffer_.clear();
  }

  /// Throws Error "op: cannot <what> <target>: <errno text>" for the current errno.
  [[noreturn]] void fail(std::string_view what) const { fail(what, errno); }
  [[noreturn]] void fail(std::string_view what, int error) const {
    throw Error(concat(op_, ": cannot ", what, " ", target_.string(), ": ", errno_text(error)));
  }

 private:
  static constexpr std::size_t buffer_size = std::size_t{1} << 20;

  void write_through(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      const ::ssize_t written = ::write(fd_, bytes.data(), bytes.size());
      if (written < 0 && errno == EINTR) continue;
      if (written <= 0) fail("write", written < 0 ? errno : EIO);
      bytes = bytes.subspan(static_cast<std::size_t>(written));
    }
  }

  int fd_;
  const std::filesystem::path& target_;
  std::string_view op_;
  std::vector<std::byte> buffer_;
};

/// Writes `path` atomically: `contents(writer)` writes every byte through a FileWriter.
/// @throws Error naming `op`, the path and errno's text; whatever `contents` throws. Either way
///         the temporary file is gone and `path` is untouched.
template <class Contents>
void write_file_atomically(const std::filesystem::path& path, std::string_view op,
                           Contents&& contents) {
  const std::filesystem::path temporary = path.string() + ".tmp." + std::to_string(::getpid());
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
  if (fd < 0) {
    throw Error(concat(op, ": cannot create ", temporary.string(), " (to write ", path.string(),
                       "): ", errno_text(errno)));
  }
  try {
    FileWriter writer(fd, path, op);
    std::forward<Contents>(contents)(writer);
    writer.flush();
    if (::fsync(fd) != 0) writer.fail("sync");
    const int closed = ::close(fd);
    fd = -1;
    if (closed != 0) writer.fail("close");
    if (::rename(temporary.c_str(), path.c_str()) != 0) writer.fail("rename the new file onto");
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(temporary.c_str());
    throw;
  }
  // Make the rename itself durable. The new file is complete and in place already, so a
  // directory that cannot be synced (some file systems refuse) is not an error.
  const std::filesystem::path directory = path.has_parent_path() ? path.parent_path() : ".";
  const int directory_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory_fd >= 0) {
    ::fsync(directory_fd);
    ::close(directory_fd);
  }
}

}  // namespace dissect::detail
