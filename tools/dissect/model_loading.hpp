// tools/dissect/model_loading.hpp — how `dissect generate` and `dissect serve` open a model: any
// model file detect_checkpoint knows (a checkpoint or a GGUF file), together with what turns text
// into its ids (train_gpt's byte vocabulary, or the library's text::tokenizer_for: a Hugging Face
// tokenizer, a GGUF file's own). A check runs on the config and the vocabulary before any weight
// is read, so a command that cannot run loads nothing. The detection, the tokenizer and the
// loading are the library's (io/open_model.hpp, text/checkpoint_tokenizer.hpp).
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dissect/core/error.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/text/checkpoint_tokenizer.hpp"
#include "dissect/text/prompt_codec.hpp"
#include "tools/common/byte_vocab.hpp"
#include "tools/dissect/text_commands.hpp"

namespace dissect::tools {

// train_gpt writes the key the library reads (byte_vocab.hpp spells it for the examples that do
// not link dissect::text).
static_assert(std::string_view(tokenizer_json_key) == text::tokenizer_json_key);

/// What a model file brings besides its weights: its config, and what encodes text for it.
struct ModelText {
  TransformerConfig config;
  std::optional<ByteVocab> vocab;            ///< train_gpt's byte-level checkpoints
  std::optional<text::Tokenizer> tokenizer;  ///< tokenizer.json, vocab.json + merges, GGUF's own
  bool gguf = false;                         ///< read from a GGUF file
  /// A GGUF file's tokenizer that dissect does not implement: why (token ids still work).
  std::string tokenizer_error;
};

/// What turns `text`'s prompts into ids and its ids back into text (the byte vocabulary, else the
/// tokenizer); without either, ids only, and a text prompt is refused with `why_no_text`. It
/// borrows text.tokenizer: `text` must outlive it.
inline text::PromptCodec prompt_codec(const ModelText& text, std::string why_no_text) {
  if (text.vocab) return text::PromptCodec::of_bytes(text.vocab->bytes);
  if (text.tokenizer) return text::PromptCodec::of_tokenizer(*text.tokenizer);
  return text::PromptCodec::ids_only(std::move(why_no_text));
}

/// Opens `path` (detect_checkpoint: a checkpoint or a GGUF file), calls check(text) before any
/// weight is read, then loads the model as GPT2Model<float>, LlamaModel<float> or
/// MixtralModel<float> (visit_model; a GGUF file's kept blocks without their float copy),
/// releases the file (its mapped pages leave the resident set before run packs or allocates
/// anything) and returns run(model, text) with the model mutable, so run may pack it; run must
/// return one type for every family. A ConstructionScope the caller holds decides whether the
/// model gets gradient buffers. @throws as detect_checkpoint, require_model, text::tokenizer_for,
/// the loaders and check.
template <class Check, class Run>
auto with_model(const std::filesystem::path& path, std::string_view op, Check&& check, Run&& run) {
  ModelText text;
  const ModelText& read_only = text;
  DetectedCheckpoint source = detect_checkpoint(path);
  text.config = source.require_model(op).config;
  text.gguf = source.kind == CheckpointKind::gguf;
  text.vocab =
      ByteVocab::from_metadata(source.checkpoint.metadata(), source.checkpoint.path().string());
  if (!text.vocab) {
    text::CheckpointTokenizer found = text::tokenizer_for(source);
    text.tokenizer = std::move(found.tokenizer);
    text.tokenizer_error = std::move(found.unsupported);  // only a text prompt needs it
  }
  check(read_only);
  // For inference: the kept blocks are all a quantised layer holds (no float copy).
  const ModelLoadOptions inference{.gguf = {.keep_quantized = true, .release_dense = true}};
  return visit_model(
      std::move(source), inference, [&](auto& model) { return run(model, read_only); }, op);
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
