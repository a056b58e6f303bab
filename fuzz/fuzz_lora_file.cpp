// fuzz/fuzz_lora_file.cpp — libFuzzer harness for a LoRA adapter file (io/lora_file.hpp).
//
// The input is the file, checked in memory, then loaded into a fresh tiny GPT-2 (which the
// adapters must fit) and loaded again into the adapted model (whose adapters must then have the
// file's rank and alpha). load_adapters promises to check everything before the model changes:
// a refused file must leave the model without adapters.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/io/lora_file.hpp"
#include "dissect/models/decoder_model.hpp"
#include "fuzz_support.hpp"

namespace dissect::fuzz {
namespace {

int adapter_count(const GPT2Model<float>& model) {
  int count = 0;
  for_each_layer(
      model, [&](const std::string&, const Linear<float>& layer) { count += layer.has_adapter(); });
  return count;
}

}  // namespace
}  // namespace dissect::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  std::optional<SafetensorsFile> file;
  fuzz::expect_only_dissect_errors([&] {
    file.emplace(SafetensorsFile::from_bytes(fuzz::bytes_of(data, size), "adapter.safetensors"));
  });
  if (!file) return 0;
  GPT2Model<float> model(fuzz::tiny_gpt2(), {.seed = 1});
  std::vector<std::string> paths;
  try {
    paths = load_adapters(model, *file);
  } catch (const Error& error) {
    // Refused before any change, except a dtype found unreadable while loading (documented).
    fuzz::require(
        fuzz::adapter_count(model) == 0 ||
            std::string_view(error.what()).find("dissect reads") != std::string_view::npos,
        "a refused file leaves the model as it was");
    return 0;
  }
  fuzz::require(!paths.empty() && fuzz::adapter_count(model) == static_cast<int>(paths.size()),
                "one adapter per path loaded");
  // Loaded again into the adapted model: the same ranks and alphas, so it must be accepted.
  const std::vector<std::string> again = load_adapters(model, *file);
  fuzz::require(again == paths, "a second load adapts the same layers");
  const std::vector<index_t> ids{0};
  (void)model.forward(TokenBatch{ids, 1, 1});
  return 0;
}
