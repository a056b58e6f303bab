// Tests for the atomic writer behind save_safetensors (dissect/io/detail/atomic_file.hpp) and
// dissect::io::same_file — issue 24, hostile files: a symlink planted where the temporary might go
// is never followed; threads saving one path concurrently each leave a whole file; a replaced
// file keeps its permission bits (and owner, as root); a failed save names the path and leaves
// no temporary behind.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <mutex>
#include <set>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "dissect/io/safetensors.hpp"
#include "support/io_testing.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_atomic_file {

using testing::contains;

/// The names in `directory`, sorted.
std::set<std::string> names_in(const std::filesystem::path& directory) {
  std::set<std::string> names;
  for (const auto& item : std::filesystem::directory_iterator(directory)) {
    names.insert(item.path().filename().string());
  }
  return names;
}

::mode_t mode_of(const std::filesystem::path& path) {
  struct ::stat status {};
  if (::stat(path.c_str(), &status) != 0) throw std::runtime_error("cannot stat " + path.string());
  return status.st_mode & 07777;
}

std::vector<std::byte> text_bytes(std::string_view text) {
  const auto bytes = std::as_bytes(std::span(text));
  return {bytes.begin(), bytes.end()};
}

/// A file's bytes as text, so that a failed comparison prints readably.
std::string text_of(const std::filesystem::path& path) {
  const auto bytes = testing::read_file(path);
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

/// Saves one tensor "x" holding `values` to `path`.
void save_values(const std::filesystem::path& path, const std::vector<float>& values) {
  const auto count = static_cast<index_t>(values.size());
  save_safetensors(path, std::vector<SaveEntry>{{"x", {count}, std::span(values)}});
}

class AtomicFileTest : public ::testing::Test {
 protected:
  testing::TemporaryDirectory directory_;
  testing::TemporaryDirectory elsewhere_;  ///< where the victims of planted symlinks live
};

// ---- planted symlinks ---------------------------------------------------------------------------

TEST_F(AtomicFileTest, SymlinksPlantedAtTemporaryNamesAreNeverFollowed) {
  const auto victim = elsewhere_ / "victim";
  const std::string victim_text = "precious, not a checkpoint";
  testing::write_file(victim, text_bytes(victim_text));
  const auto path = directory_ / "model.safetensors";
  // Every name the old writer would have used (PATH.tmp.<pid>), for this process and its
  // neighbours, and a few more in the same family: each a symlink to the victim.
  std::set<std::string> planted;
  for (int pid = ::getpid() - 2; pid <= ::getpid() + 2; ++pid) {
    planted.insert("model.safetensors.tmp." + std::to_string(pid));
  }
  for (const char* name : {"model.safetensors.tmp", "model.safetensors.tmp.", "model.safetensors~",
                           ".model.safetensors.tmp"}) {
    planted.insert(name);
  }
  for (const auto& name : planted) std::filesystem::create_symlink(victim, directory_ / name);

  const std::vector<float> first{1, 2, 3}, second{4, 5};
  save_values(path, first);   // creates the file
  save_values(path, second);  // replaces it
  EXPECT_EQ(text_of(victim), victim_text);
  EXPECT_EQ((SafetensorsFile(path).load<float, 1>("x").size()), 2);
  std::set<std::string> expected = planted;
  expected.insert("model.safetensors");
  EXPECT_EQ(names_in(directory_.path()), expected);  // the symlinks untouched, no temporary left
  for (const auto& name : planted) EXPECT_TRUE(std::filesystem::is_symlink(directory_ / name));
}

TEST_F(AtomicFileTest, ASymlinkAtTheTargetIsReplacedNotWrittenThrough) {
  // rename's semantics: the link itself is replaced by the new file; what it named stays.
  const auto victim = elsewhere_ / "victim";
  const std::string victim_text = "the file the link named";
  testing::write_file(victim, text_bytes(victim_text));
  const auto path = directory_ / "link.safetensors";
  std::filesystem::create_symlink(victim, path);
  save_values(path, {7, 8});
  EXPECT_FALSE(std::filesystem::is_symlink(path));
  EXPECT_TRUE(std::filesystem::is_regular_file(path));
  EXPECT_EQ(text_of(victim), victim_text);
  EXPECT_EQ((SafetensorsFile(path).load<float, 1>("x")(1)), 8.0f);
}

// ---- concurrent saves ---------------------------------------------------------------------------

TEST_F(AtomicFileTest, EightThreadsSavingOnePathEachLeaveAWholeFile) {
  // Thread t writes t + 1 repeated (1,000 + 4,099·t) times: any mix of two payloads, or a
  // truncated one, fails the header check or the comparison below.
  constexpr int threads = 8;
  constexpr int rounds = 20;
  const auto path = directory_ / "shared.safetensors";
  std::vector<std::vector<float>> payloads;
  for (int t = 0; t < threads; ++t) {
    payloads.emplace_back(static_cast<std::size_t>(1'000 + 4'099 * t), static_cast<float>(t + 1));
  }
  std::mutex mutex;
  std::vector<std::string> failures;
  const auto fail = [&](std::string message) {
    const std::lock_guard lock(mutex);
    failures.push_back(std::move(message));
  };
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int round = 0; round < rounds; ++round) {
        try {
          save_values(path, payloads[static_cast<std::size_t>(t)]);
          const auto loaded = SafetensorsFile(path).load<float, 1>("x");
          const auto owner = static_cast<std::size_t>(loaded(0)) - 1;
          if (owner >= payloads.size() ||
              !std::equal(loaded.data(), loaded.data() + loaded.size(), payloads[owner].begin(),
                          payloads[owner].end())) {
            fail("thread " + std::to_string(t) + " read a file that is none of the payloads");
          }
        } catch (const std::exception& error) {
          fail("thread " + std::to_string(t) + ": " + error.what());
        }
      }
    });
  }
  for (auto& worker : workers) worker.join();
  EXPECT_TRUE(failures.empty()) << failures.size() << " failures, the first: " << failures.front();
  EXPECT_EQ(names_in(directory_.path()), std::set<std::string>{"shared.safetensors"});
}

// ---- permissions and owner ----------------------------------------------------------------------

TEST_F(AtomicFileTest, AReplacedFileKeepsItsPermissionBits) {
  const auto path = directory_ / "private.safetensors";
  save_values(path, {1});
  for (const ::mode_t mode : {0640, 0600, 0444, 0755}) {
    ASSERT_EQ(::chmod(path.c_str(), mode), 0);
    save_values(path, {2, 3});
    EXPECT_EQ(mode_of(path), mode) << std::oct << "mode 0" << mode;
  }
}

TEST_F(AtomicFileTest, ANewFileGetsTheUmasksMode) {
  const ::mode_t saved = ::umask(027);
  save_values(directory_ / "new.safetensors", {1});
  ::umask(saved);
  EXPECT_EQ(mode_of(directory_ / "new.safetensors"), 0640u);
}

TEST_F(AtomicFileTest, AReplacedFileKeepsItsOwnerWhenRunAsRoot) {
  if (::geteuid() != 0) GTEST_SKIP() << "only root may give a file to another user";
  const auto path = directory_ / "owned.safetensors";
  save_values(path, {1});
  ASSERT_EQ(::chown(path.c_str(), 4321, 8765), 0);
  save_values(path, {2});
  struct ::stat status {};
  ASSERT_EQ(::stat(path.c_str(), &status), 0);
  EXPECT_EQ(status.st_uid, 4321u);
  EXPECT_EQ(status.st_gid, 8765u);
}

// ---- failures -----------------------------------------------------------------------------------

TEST_F(AtomicFileTest, ASaveIntoAMissingDirectoryNamesThePath) {
  const auto path = directory_ / "missing" / "model.safetensors";
  EXPECT_THROW_WITH(save_values(path, {1}), Error,
                    "save_safetensors: cannot create " + path.string() + ".tmp.");
  EXPECT_THROW_WITH(save_values(path, {1}), Error,
                    "(to write " + path.string() + "): No such file or directory");
  EXPECT_TRUE(names_in(directory_.path()).empty());
}

TEST_F(AtomicFileTest, ASaveIntoAReadOnlyDirectoryNamesThePathAndKeepsTheOldFile) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into a read-only directory";
  const auto path = directory_ / "model.safetensors";
  save_values(path, {1});
  const std::string before = text_of(path);
  ASSERT_EQ(::chmod(directory_.path().c_str(), 0555), 0);
  EXPECT_THROW_WITH(save_values(path, {2}), Error, "(to write " + path.string() + "): Permission");
  ::chmod(directory_.path().c_str(), 0755);
  EXPECT_EQ(text_of(path), before);
  EXPECT_EQ(names_in(directory_.path()), std::set<std::string>{"model.safetensors"});
}

TEST_F(AtomicFileTest, ContentsThatThrowHalfwayLeaveNoTemporaryAndTheOldFile) {
  const auto path = directory_ / "model.safetensors";
  save_values(path, {1});
  const std::string before = text_of(path);
  const auto half = text_bytes("half a file");
  EXPECT_THROW_WITH(detail::write_file_atomically(path, "test",
                                                  [&](detail::FileWriter& out) {
                                                    out.write(half);
                                                    out.flush();
                                                    throw Error("test: the producer failed");
                                                  }),
                    Error, "the producer failed");
  EXPECT_EQ(text_of(path), before);
  EXPECT_EQ(names_in(directory_.path()), std::set<std::string>{"model.safetensors"});
}

TEST_F(AtomicFileTest, AFailedRenameNamesThePathAndLeavesNoTemporary) {
  const auto occupied = directory_ / "occupied";  // a directory that is not empty
  std::filesystem::create_directory(occupied);
  testing::write_file(occupied / "inside", text_bytes("x"));
  EXPECT_THROW_WITH(save_values(occupied, {1}), Error,
                    "save_safetensors: cannot rename the new file onto " + occupied.string());
  EXPECT_EQ(names_in(directory_.path()), std::set<std::string>{"occupied"});
}

// ---- same_file ----------------------------------------------------------------------------------

TEST_F(AtomicFileTest, SameFileComparesDeviceAndInode) {
  const auto input = directory_ / "input.safetensors";
  const auto other = directory_ / "other.safetensors";
  save_values(input, {1});
  save_values(other, {1});
  std::filesystem::create_directory(directory_ / "sub");
  std::filesystem::create_hard_link(input, directory_ / "hard");
  std::filesystem::create_symlink(input, directory_ / "soft");

  EXPECT_TRUE(io::same_file(input, input));
  EXPECT_TRUE(io::same_file(input, directory_ / "sub" / ".." / "." / "input.safetensors"));
  EXPECT_TRUE(io::same_file(input, directory_ / "hard"));
  EXPECT_TRUE(io::same_file(directory_ / "soft", input));
  EXPECT_FALSE(io::same_file(input, other));  // equal bytes, different files
  EXPECT_FALSE(io::same_file(input, directory_ / "new.safetensors"));
  // Neither exists: the same path, spelled two ways, is the same file to be.
  EXPECT_TRUE(io::same_file(directory_ / "new", directory_ / "sub" / ".." / "new"));
  EXPECT_FALSE(io::same_file(directory_ / "new", directory_ / "newer"));
}

}  // namespace test_atomic_file
}  // namespace dissect
