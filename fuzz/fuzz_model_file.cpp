// fuzz/fuzz_model_file.cpp — libFuzzer harness for the files a model is loaded from: dissect's
// model file (save_model: family and config in __metadata__), its quantised form
// (io/quantized_file.hpp: "dissect.quantization", I8/U8/BF16 weights and their scales), a LoRA
// adapter file, and a Hugging Face model.safetensors, told apart by io/open_model.hpp.
//
// The input is model.safetensors in a directory of this process's own that also holds a tiny
// GPT-2's config.json. detect_checkpoint says what the file is; then the model it describes is
// loaded (visit_model: the file's own config, or config.json for Hugging Face names) and run on
// one token, or an adapter file is loaded into the tiny GPT-2. Each step either works or throws
// dissect::Error.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <vector>

#include "dissect/io/lora_file.hpp"
#include "dissect/io/open_model.hpp"
#include "fuzz_support.hpp"

namespace dissect::fuzz {
namespace {

const std::filesystem::path& model_directory() {
  static const std::filesystem::path dir = [] {
    const auto path = scratch_directory() / "model";
    std::filesystem::create_directories(path);
    write_file(path / "config.json",
               reinterpret_cast<const std::uint8_t*>(tiny_gpt2_config_json.data()),
               tiny_gpt2_config_json.size());
    return path;
  }();
  return dir;
}

}  // namespace
}  // namespace dissect::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  const std::filesystem::path& dir = fuzz::model_directory();
  fuzz::write_file(dir / "model.safetensors", data, size);
  fuzz::expect_only_dissect_errors([&] {
    const DetectedCheckpoint found = detect_checkpoint(dir);
    fuzz::require(!found.sharded(), "one file");
    if (found.kind == CheckpointKind::lora_adapter) {
      GPT2Model<float> model(fuzz::tiny_gpt2(), {.seed = 1});
      (void)load_adapters(model, found.checkpoint.shards().front());
      return;
    }
    fuzz::require(found.model.has_value(), "a config beside every file that is no adapter");
    visit_model(found, [](auto& model) {
      const std::vector<index_t> ids{0};
      const auto logits = model.forward(TokenBatch{ids, 1, 1});
      fuzz::require(logits.size() == model.config().vocab, "one row of logits");
    });
  });
  return 0;
}
