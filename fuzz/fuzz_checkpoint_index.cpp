// fuzz/fuzz_checkpoint_index.cpp — libFuzzer harness for a sharded checkpoint's index,
// model.safetensors.index.json.
//
// The input is the index; it sits in a directory of this process's own beside fixed files for
// it to name: two valid shards (tensors a, b | c), a corrupt shard, a file that is no
// safetensors file, a subdirectory and config.json. Checkpoint opens the directory (which finds
// the index), every tensor it then lists must load from its shard, and detect_checkpoint must
// say what the directory is, or throw dissect::Error.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "dissect/io/checkpoint.hpp"
#include "dissect/io/open_model.hpp"
#include "fuzz_support.hpp"

namespace dissect::fuzz {
namespace {

/// The directory, with every file but the index written once.
const std::filesystem::path& index_directory() {
  static const std::filesystem::path dir = [] {
    const auto path = scratch_directory() / "sharded";
    std::filesystem::create_directories(path / "sub");
    const std::vector<float> a{1, 2, 3, 4, 5, 6}, b{7}, c{8, 9};
    save_safetensors(path / "model-00001-of-00002.safetensors",
                     std::vector<SaveEntry>{{"a", {2, 3}, std::span<const float>(a)},
                                            {"b", {}, std::span<const float>(b)}},
                     {{"format", "pt"}});
    save_safetensors(
        path / "model-00002-of-00002.safetensors",
        std::vector<SaveEntry>{{"c", {2}, std::span<const float>(c), SaveDtype::bf16}});
    const std::uint8_t truncated[] = {200, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    write_file(path / "broken.safetensors", truncated, sizeof truncated);
    write_file(path / "notes.txt", reinterpret_cast<const std::uint8_t*>("hello"), 5);
    write_file(path / "config.json",
               reinterpret_cast<const std::uint8_t*>(tiny_gpt2_config_json.data()),
               tiny_gpt2_config_json.size());
    return path;
  }();
  return dir;
}

template <std::size_t R>
void load_at_rank(const Checkpoint& checkpoint, const std::string& name) {
  expect_only_dissect_errors([&] { (void)checkpoint.load<float, R>(name); });
}

}  // namespace
}  // namespace dissect::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  const std::filesystem::path& dir = fuzz::index_directory();
  fuzz::write_file(dir / "model.safetensors.index.json", data, size);
  fuzz::expect_only_dissect_errors([&] {
    const Checkpoint checkpoint(dir);
    fuzz::require(checkpoint.path().filename() == "model.safetensors.index.json", "the index");
    for (const std::string& name : checkpoint.tensor_names()) {
      const SafetensorsFile& shard = checkpoint.shard_of(name);
      fuzz::require(shard.contains(name), "the index puts a tensor where it is");
      fuzz::load_at_rank<1>(checkpoint, name);
      fuzz::load_at_rank<2>(checkpoint, name);
      fuzz::load_at_rank<3>(checkpoint, name);
    }
  });
  fuzz::expect_only_dissect_errors([&] {
    const DetectedCheckpoint found = detect_checkpoint(dir);
    fuzz::require(found.sharded(), "detect_checkpoint opens the index");
  });
  return 0;
}
