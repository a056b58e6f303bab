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
#include <type_traits>

#include "dissect/core/error.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/io/gguf_weights.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/module.hpp"
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
/// loads the model as GPT2Model<float>, LlamaModel<float> or MixtralModel<float>, releases the
/// file (its mapped pages leave the resident set before run packs or allocates anything) and
/// returns run(model, text) with the model mutable, so run may pack it; run must return one type
/// for every family. A ConstructionScope the caller holds decides whether the model gets gradient
/// buffers. @throws as detect_checkpoint, GgufFile, read_gguf_config, the loaders and check.
template <class Check, class Run>
auto with_model(const std::filesystem::path& path, std::string_view op, Check&& check, Run&& run) {
  ModelText text;
  const ModelText& read_only = text;
  if (is_gguf_file(path)) {
    // Its config from the metadata, checked against every tensor before anything else; its
    // tokenizer from tokenizer.ggml.*; the kept block types run on their own blocks alone, the
    // other tensors are dequantised to float.
    std::optional<GgufFile> file(std::in_place, path);
    const HfConfig model = read_gguf_config(*file);
    text.config = model.config;
    text.gguf = true;
    if (text::gguf_has_tokenizer(*file)) {
      try {
        text.tokenizer = text::tokenizer_from_gguf(*file);
      } catch (const ConfigError& error) {
        text.tokenizer_error = error.what();  // only a text prompt needs it
      }
    }
    check(read_only);
    const auto load_and_run = [&](auto type) {
      // For inference: the kept blocks are all a quantised layer holds (no float copy).
      auto loaded = load_gguf_model<typename decltype(type)::type>(
          *file, {.keep_quantized = true, .release_dense = true});
      file.reset();
      return run(loaded, read_only);
    };
    if (model.family == ModelFamily::llama) {
      return load_and_run(std::type_identity<LlamaModel<float>>{});
    }
    return load_and_run(std::type_identity<GPT2Model<float>>{});
  }
  std::optional<DetectedCheckpoint> source(detect_checkpoint(path));
  const HfConfig recorded = source->require_model(op);
  text.config = recorded.config;
  text.vocab =
      ByteVocab::from_metadata(source->checkpoint.metadata(), source->checkpoint.path().string());
  if (!text.vocab) text.tokenizer = checkpoint_tokenizer(path, source->checkpoint.metadata());
  check(read_only);
  const auto load_and_run = [&](auto type) {
    auto loaded = load_model<typename decltype(type)::type>(*source);
    source.reset();
    return run(loaded, read_only);
  };
  switch (recorded.family) {
    case ModelFamily::gpt2:
      return load_and_run(std::type_identity<GPT2Model<float>>{});
    case ModelFamily::llama:
      return load_and_run(std::type_identity<LlamaModel<float>>{});
    case ModelFamily::mixtral:
      break;
  }
  return load_and_run(std::type_identity<MixtralModel<float>>{});
}

/// Lays out every float layer for the packed GEMM once, at load (DecoderModel::pack), unless a
/// layer is quantised or BitLinear (their own kernels read their own bytes). Returns whether it
/// packed. The copy costs the layers' float bytes again; it buys prefill without repacking W per
/// product, and SwiGLU and the residual adds fused into the products.
template <class Model>
bool pack_for_inference(Model& model) {
  if constexpr (!std::is_same_v<typename Model::scalar_type, float>) {
    return false;
  } else {
    bool own_kernels = false;
    for_each_layer(model, [&](const std::string&, const Linear<float>& layer) {
      own_kernels = own_kernels || layer.quantized() || layer.bitlinear();
    });
    if (own_kernels) return false;
    model.pack();
    return true;
  }
}

}  // namespace dissect::tools
