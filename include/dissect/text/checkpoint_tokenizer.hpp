// dissect/text/checkpoint_tokenizer.hpp — the tokenizer a model file comes with, found from what
// detect_checkpoint (io/open_model.hpp) found, before any weight is read.
//
//   const dissect::DetectedCheckpoint found = dissect::detect_checkpoint(path);
//   const dissect::text::CheckpointTokenizer t = dissect::text::tokenizer_for(found);
//   if (t.tokenizer) ids = t.tokenizer->encode("Once upon a time");
//   else if (!t.unsupported.empty()) std::cerr << t.unsupported;  // token ids still work
//
// Where it comes from, by kind: a GGUF file's own tokenizer.ggml.* (text/gguf_tokenizer.hpp);
// for every other kind the tokenizer.json its metadata carries (tokenizer_json_key), else the
// tokenizer files in the checkpoint's directory (tokenizer.json and tokenizer_config.json, or
// vocab.json + merges.txt: text/tokenizer_files.hpp). A LoRA adapter file or bare tensors are
// searched the same way: whatever sits beside them.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "dissect/core/error.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/text/gguf_tokenizer.hpp"
#include "dissect/text/tokenizer.hpp"
#include "dissect/text/tokenizer_files.hpp"

namespace dissect::text {

// ---- declarations -------------------------------------------------------------------------------

/// What tokenizer_for found.
struct CheckpointTokenizer {
  std::optional<Tokenizer> tokenizer;  ///< empty: none comes with the file, or `unsupported`
  /// A GGUF file whose tokenizer.ggml.* names a tokenizer model or pre-tokenizer dissect does not
  /// implement: the ConfigError saying which (the model still runs on token ids). Else empty.
  std::string unsupported;
};

/// The tokenizer `checkpoint` comes with (see the top of this file), or none.
/// @throws for a GGUF file, FormatError naming the file and the key for malformed
///         tokenizer.ggml.* metadata (a tokenizer dissect does not implement is `unsupported`,
///         not thrown); for the others, as Tokenizer::from_json (naming the file and the metadata
///         key) and load_tokenizer (naming the tokenizer file).
CheckpointTokenizer tokenizer_for(const DetectedCheckpoint& checkpoint);

// ---- implementation -----------------------------------------------------------------------------

inline CheckpointTokenizer tokenizer_for(const DetectedCheckpoint& checkpoint) {
  CheckpointTokenizer found;
  if (checkpoint.kind == CheckpointKind::gguf) {
    if (!checkpoint.gguf || !gguf_has_tokenizer(*checkpoint.gguf)) return found;
    try {
      found.tokenizer = tokenizer_from_gguf(*checkpoint.gguf);
    } catch (const ConfigError& error) {
      // Not one dissect implements: only text needs it, a model on token ids runs without.
      found.unsupported = error.what();
    }
    return found;
  }
  const auto& metadata = checkpoint.checkpoint.metadata();
  if (const auto carried = metadata.find(tokenizer_json_key); carried != metadata.end()) {
    found.tokenizer = Tokenizer::from_json(
        carried->second,
        concat(checkpoint.checkpoint.path().string(), ": metadata \"", tokenizer_json_key, "\""));
    return found;
  }
  // The directory of the file opened: a checkpoint directory resolves to a file in it.
  std::filesystem::path dir = checkpoint.checkpoint.path().parent_path();
  if (dir.empty()) dir = ".";
  if (has_tokenizer(dir)) found.tokenizer = load_tokenizer(dir);
  return found;
}

}  // namespace dissect::text
