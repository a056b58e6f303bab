// dissect/text/prompt_codec.hpp — a model's prompt between text and ids, in one place: text (or
// ids) in, the ids a model may run on out, checked against its vocabulary and context; and the
// ids a generation produces back into text, one at a time, never half a character.
//
// What turns text into ids is a model's own: a Hugging Face or GGUF tokenizer, a byte vocabulary
// (dissect's train_gpt models: id i stands for one byte), or nothing (the model takes ids only,
// and a text prompt is refused with the reason the caller gives). The BOS rule is the caller's
// to state: plain text gets what the tokenizer's post-processor adds (LLaMA's <s>); text a chat
// template rendered already starts with it, and is encoded as it stands (transformers'
// apply_chat_template tokenizes with add_special_tokens=False), so BOS never comes twice.
//
// Every message starts with `where`, the name the caller's user knows the prompt by ("--prompt",
// "prompt"): the codec never parses a command line or a request, it only names what it is given.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/text/decode_stream.hpp"
#include "dissect/text/tokenizer.hpp"

namespace dissect::text {

// ---- declarations -------------------------------------------------------------------------------

/// What a prompt must fit: the model's vocabulary and context.
struct PromptLimits {
  index_t vocab = 0;    ///< every id in [0, vocab)
  index_t context = 0;  ///< at most this many ids
};

/// Checks `ids` as a prompt of a model: 1 to limits.context ids, each in [0, limits.vocab).
/// @throws ConfigError "where: token 1 has id 97, outside the model's vocabulary [0, 97)",
///         "where: the prompt is empty (0 tokens)" or
///         "where: 25 tokens; the model's context holds at most 24".
void check_prompt(std::span<const index_t> ids, const PromptLimits& limits, std::string_view where);

/// Text to a model's ids and back: a tokenizer, a byte vocabulary, or ids only. Copyable; one
/// made of a tokenizer borrows it, and the tokenizer must outlive the codec and its decoders.
class PromptCodec {
 public:
  class Decoder;

  /// A model that takes ids only: encode refuses text with "where: why_no_text" (the caller
  /// knows how its user gives ids instead: "… give token ids with --tokens").
  static PromptCodec ids_only(std::string why_no_text);
  /// `tokenizer`'s ids.
  static PromptCodec of_tokenizer(const Tokenizer& tokenizer);
  /// A byte vocabulary: id i stands for the byte bytes[i].
  /// @throws ConfigError if a byte stands for two ids (text would have two encodings).
  static PromptCodec of_bytes(std::span<const unsigned char> bytes);

  /// Whether the codec turns text into ids and back (a tokenizer or a byte vocabulary).
  bool has_text() const { return kind_ != Kind::ids_only; }

  /// The ids of `text`, not yet checked against a model. `add_special_tokens`: whether the
  /// tokenizer's post-processor adds its tokens (BOS); false for text that already holds them,
  /// as a chat template renders it. A byte vocabulary has no special tokens.
  /// @throws ConfigError "where: byte 3 (233) is not in the model's vocabulary", "where: " and
  ///         the tokenizer's error, or "where: " and why_no_text for an ids-only codec.
  std::vector<index_t> encode(std::string_view text, std::string_view where,
                              bool add_special_tokens = true) const;

  /// encode(text), checked as check_prompt checks ids: the prompt a model of `limits` runs on.
  /// @throws ConfigError as encode and check_prompt.
  std::vector<index_t> prompt(std::string_view text, const PromptLimits& limits,
                              std::string_view where, bool add_special_tokens = true) const;

  /// A decoder of ids into text, as a generation produces them.
  Decoder decoder() const;

 private:
  enum class Kind { ids_only, tokenizer, bytes };

  Kind kind_ = Kind::ids_only;
  std::string why_no_text_;
  const Tokenizer* tokenizer_ = nullptr;
  std::vector<unsigned char> bytes_;       ///< id → byte
  std::array<index_t, 256> id_of_byte_{};  ///< byte → id, −1 for a byte the vocabulary lacks
};

/// Ids into text, one at a time. With a tokenizer it is a DecodeStream: a character is emitted
/// once its last byte has come, and the text is decode() of all the ids, context included (so
/// push the prompt first, and decoders that look at context — LLaMA's first-space Strip — treat
/// the continuation as the middle of the text it is). With bytes, each id is its byte.
class PromptCodec::Decoder {
 public:
  /// The text `id` completes (often empty while a character is incomplete), or nullopt when
  /// `id` has no text here: outside the tokenizer's or the byte vocabulary (a model's may be
  /// larger, padded to a round size), a gap in the tokenizer's ids, or an ids-only codec. Such
  /// an id leaves the decoder as it was; the caller shows it as it likes (",id", "?", nothing).
  std::optional<std::string> push(index_t id);
  /// What is still held back (an incomplete character, as U+FFFD), emptying the decoder.
  std::string finish();

 private:
  friend class PromptCodec;
  explicit Decoder(const PromptCodec& codec);

  std::vector<unsigned char> bytes_;  ///< a byte vocabulary's, copied: no lifetime to mind
  std::optional<DecodeStream> stream_;
  index_t tokenizer_vocab_ = 0;  ///< Tokenizer::vocab_size(), read once
};

// ---- implementation -----------------------------------------------------------------------------

inline void check_prompt(std::span<const index_t> ids, const PromptLimits& limits,
                         std::string_view where) {
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= limits.vocab) {
      throw ConfigError(concat(where, ": token ", i, " has id ", ids[i],
                               ", outside the model's vocabulary [0, ", limits.vocab, ")"));
    }
  }
  const auto length = static_cast<index_t>(ids.size());
  if (length == 0) throw ConfigError(concat(where, ": the prompt is empty (0 tokens)"));
  if (length > limits.context) {
    throw ConfigError(
        concat(where, ": ", length, " tokens; the model's context holds at most ", limits.context));
  }
}

inline PromptCodec PromptCodec::ids_only(std::string why_no_text) {
  PromptCodec codec;
  codec.why_no_text_ = std::move(why_no_text);
  return codec;
}

inline PromptCodec PromptCodec::of_tokenizer(const Tokenizer& tokenizer) {
  PromptCodec codec;
  codec.kind_ = Kind::tokenizer;
  codec.tokenizer_ = &tokenizer;
  return codec;
}

inline PromptCodec PromptCodec::of_bytes(std::span<const unsigned char> bytes) {
  PromptCodec codec;
  codec.kind_ = Kind::bytes;
  codec.bytes_.assign(bytes.begin(), bytes.end());
  codec.id_of_byte_.fill(-1);
  for (std::size_t id = 0; id < bytes.size(); ++id) {
    index_t& slot = codec.id_of_byte_[bytes[id]];
    if (slot >= 0) {
      throw ConfigError(concat("PromptCodec::of_bytes: byte ", static_cast<int>(bytes[id]),
                               " stands for ids ", slot, " and ", id));
    }
    slot = static_cast<index_t>(id);
  }
  return codec;
}

inline std::vector<index_t> PromptCodec::encode(std::string_view text, std::string_view where,
                                                bool add_special_tokens) const {
  std::vector<index_t> ids;
  switch (kind_) {
    case Kind::ids_only:
      throw ConfigError(concat(where, ": ", why_no_text_));
    case Kind::bytes:
      ids.reserve(text.size());
      for (std::size_t i = 0; i < text.size(); ++i) {
        const auto byte = static_cast<unsigned char>(text[i]);
        if (id_of_byte_[byte] < 0) {
          throw ConfigError(concat(where, ": byte ", i, " (", static_cast<int>(byte),
                                   ") is not in the model's vocabulary"));
        }
        ids.push_back(id_of_byte_[byte]);
      }
      return ids;
    case Kind::tokenizer:
      break;
  }
  try {
    for (const std::int32_t id : tokenizer_->encode(text, add_special_tokens)) ids.push_back(id);
  } catch (const Error& error) {
    throw ConfigError(concat(where, ": ", error.what()));
  }
  return ids;
}

inline std::vector<index_t> PromptCodec::prompt(std::string_view text, const PromptLimits& limits,
                                                std::string_view where,
                                                bool add_special_tokens) const {
  std::vector<index_t> ids = encode(text, where, add_special_tokens);
  check_prompt(ids, limits, where);
  return ids;
}

inline PromptCodec::Decoder PromptCodec::decoder() const {
  return Decoder(*this);
}

inline PromptCodec::Decoder::Decoder(const PromptCodec& codec) : bytes_(codec.bytes_) {
  if (codec.kind_ == Kind::tokenizer) {
    stream_.emplace(*codec.tokenizer_);
    tokenizer_vocab_ = static_cast<index_t>(codec.tokenizer_->vocab_size());
  }
}

inline std::optional<std::string> PromptCodec::Decoder::push(index_t id) {
  if (!stream_) {
    if (id < 0 || id >= static_cast<index_t>(bytes_.size())) return std::nullopt;
    return std::string(1, static_cast<char>(bytes_[static_cast<std::size_t>(id)]));
  }
  if (id < 0 || id >= tokenizer_vocab_) return std::nullopt;
  try {
    return stream_->push(static_cast<std::int32_t>(id));
  } catch (const ConfigError&) {
    return std::nullopt;  // a gap in the ids; the stream is unchanged (DecodeStream's guarantee)
  }
}

inline std::string PromptCodec::Decoder::finish() {
  return stream_ ? stream_->finish() : "";
}

}  // namespace dissect::text
