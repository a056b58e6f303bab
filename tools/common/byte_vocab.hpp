// tools/common/byte_vocab.hpp — the vocabulary of dissect's byte-level models (train_gpt's): token
// id i stands for one byte, and a checkpoint records which under "dissect.vocab_bytes", a JSON
// array of the byte value (0 … 255) of each id: "[9,10,32,…]". train_gpt writes it, `dissect
// generate` and lora_finetune read it; the format is decided here, once.
//
// Shared by the tools and examples, never by the library (a tokenizer is not linear algebra).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect::tools {

// ---- declarations -------------------------------------------------------------------------------

/// The metadata key of a tokenizer.json carried in a checkpoint (train_gpt --tokenizer bpe:N): the
/// library's text::tokenizer_json_key, spelled again for the examples that do not link
/// dissect::text (tools/dissect/model_loading.hpp checks the two agree).
inline constexpr const char* tokenizer_json_key = "dissect.tokenizer_json";

/// The metadata key of a byte vocabulary.
inline constexpr const char* vocab_bytes_key = "dissect.vocab_bytes";

/// A byte vocabulary: token id i stands for the byte bytes[i].
struct ByteVocab {
  std::vector<unsigned char> bytes;  ///< token id → byte
  std::array<index_t, 256> id_of{};  ///< byte → token id (−1: not in the vocabulary)

  /// The sorted set of the distinct bytes of `text`: ids ascend with the byte values.
  static ByteVocab of_text(std::string_view text);
  /// The vocabulary `metadata` records under vocab_bytes_key, or nullopt when it records none.
  /// @throws FormatError naming `source` unless it is a JSON array of distinct bytes 0 … 255.
  static std::optional<ByteVocab> from_metadata(const std::map<std::string, std::string>& metadata,
                                                std::string_view source);

  index_t size() const { return static_cast<index_t>(bytes.size()); }
  /// The metadata value: "[9,10,32,…]".
  std::string to_json() const;
};

// ---- implementation -----------------------------------------------------------------------------

inline ByteVocab ByteVocab::of_text(std::string_view text) {
  std::array<bool, 256> present{};
  for (const char c : text) present[static_cast<unsigned char>(c)] = true;
  ByteVocab vocab;
  vocab.id_of.fill(-1);
  for (std::size_t byte = 0; byte < 256; ++byte) {
    if (!present[byte]) continue;
    vocab.id_of[byte] = vocab.size();
    vocab.bytes.push_back(static_cast<unsigned char>(byte));
  }
  return vocab;
}

inline std::optional<ByteVocab> ByteVocab::from_metadata(
    const std::map<std::string, std::string>& metadata, std::string_view source) {
  const auto found = metadata.find(vocab_bytes_key);
  if (found == metadata.end()) return std::nullopt;
  const auto bad = [&] {
    return FormatError(dissect::concat(source, ": metadata \"", vocab_bytes_key,
                                       "\" must be a JSON array of distinct byte values 0 … 255"));
  };
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(found->second);
  } catch (const nlohmann::json::exception&) {
    throw bad();
  }
  if (!json.is_array()) throw bad();
  ByteVocab vocab;
  vocab.id_of.fill(-1);
  for (const auto& value : json) {
    // Read as uint64 so that no JSON integer (negative ones wrap past 255) narrows silently.
    if (!value.is_number_integer()) throw bad();
    const auto byte = value.get<std::uint64_t>();
    if (byte > 255 || vocab.id_of[byte] >= 0) throw bad();
    vocab.id_of[byte] = vocab.size();
    vocab.bytes.push_back(static_cast<unsigned char>(byte));
  }
  return vocab;
}

inline std::string ByteVocab::to_json() const {
  std::string json = "[";
  for (const unsigned char byte : bytes) {
    json += (json.size() > 1 ? "," : "") + std::to_string(byte);
  }
  return json + "]";
}

}  // namespace dissect::tools
