// tools/dissect/model_loading.hpp — how `dissect generate` and `dissect serve` open a model: any
// checkpoint detect_checkpoint knows, or a GGUF file, together with what turns text into its ids
// (train_gpt's byte vocabulary, a Hugging Face tokenizer, a GGUF file's own). A check runs on the
// config and the vocabulary before any weight is read, so a command that cannot run loads nothing.
// The loading itself is the library's (io/open_model.hpp, io/gguf_weights.hpp).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "dissect/error.hpp"
#include "dissect/io/gguf_weights.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/text/gguf_tokenizer.hpp"
#include "tools/common/byte_vocab.hpp"
#include "tools/dissect/gguf_commands.hpp"
#include "tools/dissect/text_commands.hpp"

namespace dissect::tools {

/// What a model file brings besides its weights: its config, and what encodes text for it.
struct ModelText {
  TransformerConfig config;
  std::optional<ByteVocab> vocab;            ///< train_gpt's byte-level checkpoints
  std::optional<text::Tokenizer> tokenizer;  ///< tokenizer.json, vocab.json + merges, GGUF's own
  bool gguf = false;                         ///< read from a GGUF file
  /// A GGUF file's tokenizer that dissect does not implement: why (token ids still work).
  std::string tokenizer_error;
};

/// Opens `path` (a checkpoint or a .gguf file), calls check(text) before any weight is read, then
/// loads the model as GPT2Model<float>, LlamaModel<float> or MixtralModel<float> and returns
/// run(model, text); run must return one type for every family. @throws as detect_checkpoint,
/// GgufFile, read_gguf_config, the loaders and check.
template <class Check, class Run>
auto with_model(const std::filesystem::path& path, std::string_view op, Check&& check, Run&& run) {
  ModelText text;
  if (is_gguf_file(path)) {
    // Its config from the metadata, checked against every tensor before anything else; its
    // tokenizer from tokenizer.ggml.*; its weights dequantised to float, the kept block types
    // also run on their own blocks.
    const GgufFile file(path);
    const HfConfig model = read_gguf_config(file);
    text.config = model.config;
    text.gguf = true;
    if (text::gguf_has_tokenizer(file)) {
      try {
        text.tokenizer = text::tokenizer_from_gguf(file);
      } catch (const ConfigError& error) {
        text.tokenizer_error = error.what();  // only a text prompt needs it
      }
    }
    check(static_cast<const ModelText&>(text));
    if (model.family == ModelFamily::llama) {
      const auto llama = load_gguf_model<LlamaModel<float>>(file);
      return run(llama, static_cast<const ModelText&>(text));
    }
    const auto gpt2 = load_gguf_model<GPT2Model<float>>(file);
    return run(gpt2, static_cast<const ModelText&>(text));
  }
  const DetectedCheckpoint source = detect_checkpoint(path);
  text.config = source.require_model(op).config;
  text.vocab =
      ByteVocab::from_metadata(source.checkpoint.metadata(), source.checkpoint.path().string());
  if (!text.vocab) text.tokenizer = checkpoint_tokenizer(path, source.checkpoint.metadata());
  check(static_cast<const ModelText&>(text));
  return visit_model(
      source, [&](const auto& model) { return run(model, static_cast<const ModelText&>(text)); },
      op);
}

}  // namespace dissect::tools
