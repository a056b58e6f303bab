// dissect/io/detail/atomic_file.hpp — private: do not include directly (dissect/io/safetensors.hpp
// does).
//
// Writes a file so that its path only ever names the old file or the complete new one: the bytes
// go to a temporary `path + ".tmp." + 12 random letters` created exclusively in the same directory
// (O_EXCL | O_NOFOLLOW: a file or symlink planted at that name is never opened, let alone
// followed), take the old file's permission bits (and owner, where allowed), are fsync'ed, and the
// temporary is renamed over `path` (atomic within a file system; a symlink at `path` is replaced,
// as rename does); then the directory is fsync'ed. Each call has a temporary of its own, so
// threads saving one path concurrently leave one of their files, whole. On any failure the
// temporary is removed, the old file stays as it was, and the Error names the path and errno's
// text. dissect::io::same_file lets a tool refuse to write its output over one of its inputs.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/io/detail/atomic_file.hpp is private to dissect: include dissect/io/safetensors.hpp instead"
#endif

#include <fcntl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/detail/mapped_file.hpp"

namespace dissect::io {

/// Whether paths `a` and `b` name the same file: the same device and inode once symlinks are
/// followed (so a hard link or a symlink to a file is that file), or, when either does not
/// exist, the same path once made absolute and normalised. Never throws.
inline bool same_file(const std::filesystem::path& a, const std::filesystem::path& b) noexcept {
  struct ::stat sa {};
  struct ::stat sb {};
  if (::stat(a.c_str(), &sa) == 0 && ::stat(b.c_str(), &sb) == 0) {
    return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  }
  std::error_code error_a, error_b;
  const std::filesystem::path canonical_a = std::filesystem::weakly_canonical(a, error_a);
  const std::filesystem::path canonical_b = std::filesystem::weakly_canonical(b, error_b);
  if (error_a || error_b) return a.lexically_normal() == b.lexically_normal();
  return canonical_a == canonical_b;
}

}  // namespace dissect::io

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

/// 12 random letters and digits (71 bits) for a temporary's name, from getrandom; should that
/// fail, from the clock, the thread and a counter — still unique in this process, and O_EXCL is
/// what makes the name safe: the randomness only keeps others from guessing it in advance.
inline std::string random_name_suffix() {
  static constexpr std::string_view alphabet =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::array<std::uint64_t, 2> random{};
  if (::getrandom(random.data(), sizeof random, GRND_NONBLOCK) != ssize_t{sizeof random}) {
    static std::atomic<std::uint64_t> counter{0};
    random[0] =
        static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
        (counter.fetch_add(1) * 0x9e37'79b9'7f4a'7c15u);
    random[1] = std::hash<std::thread::id>{}(std::this_thread::get_id()) ^
                static_cast<std::uint64_t>(::getpid());
  }
  std::string suffix;
  for (std::size_t i = 0; i < 12; ++i) {
    std::uint64_t& word = random[i % 2];
    suffix += alphabet[word % alphabet.size()];
    word /= alphabet.size();
  }
  return suffix;
}

/// The temporary for writing `path`, created exclusively (never following a symlink at its
/// name) in `path`'s directory with mode 0666 less the umask; its name is stored in `temporary`.
/// @throws Error naming `op`, the temporary, `path` and errno's text.
inline int create_temporary_for(const std::filesystem::path& path, std::string_view op,
                                std::filesystem::path& temporary) {
  // Keep the name within NAME_MAX (255) however long the target's name is.
  const std::string base = path.filename().string().substr(0, 200);
  const std::filesystem::path directory = path.parent_path();
  int error = EEXIST;
  for (int attempt = 0; attempt < 100 && error == EEXIST; ++attempt) {
    temporary = directory / (base + ".tmp." + random_name_suffix());
    const int fd =
        ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd >= 0) return fd;
    error = errno;
    if (error == EINTR) error = EEXIST;  // try again
  }
  throw Error(concat(op, ": cannot create ", temporary.string(), " (to write ", path.string(),
                     "): ", errno_text(error)));
}

/// Writes `path` atomically: `contents(writer)` writes every byte through a FileWriter. An
/// existing regular file at `path` passes on its permission bits (rwx for user, group, others)
/// and, where the process may (as root), its owner and group.
/// @throws Error naming `op`, the path and errno's text; whatever `contents` throws. Either way
///         the temporary file is gone and `path` is untouched.
template <class Contents>
void write_file_atomically(const std::filesystem::path& path, std::string_view op,
                           Contents&& contents) {
  struct ::stat old_file {};
  const bool replaces_a_file = ::lstat(path.c_str(), &old_file) == 0 && S_ISREG(old_file.st_mode);
  std::filesystem::path temporary;
  int fd = create_temporary_for(path, op, temporary);
  try {
    FileWriter writer(fd, path, op);
    if (replaces_a_file) {
      struct ::stat created {};
      if (::fstat(fd, &created) != 0) writer.fail("stat the temporary file for");
      if (created.st_uid != old_file.st_uid || created.st_gid != old_file.st_gid) {
        // Best effort: only root may give a file away; anyone else keeps their own ownership.
        [[maybe_unused]] const int ignored = ::fchown(fd, old_file.st_uid, old_file.st_gid);
      }
      // A file the user kept private must not become readable by being saved again.
      const ::mode_t mode = old_file.st_mode & 0777;
      if ((created.st_mode & 0777) != mode && ::fchmod(fd, mode) != 0) {
        writer.fail("set the permissions of the new file for");
      }
    }
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
