// dissect/text/decode_stream.hpp — decoding one token at a time, as generation produces them,
// without ever printing half a character or a different text than decode() of all the ids.
//
// The window is Hugging Face's DecodeStream: the text of the last few ids is decoded again
// with each new id, and only what it adds is emitted, once it no longer ends in U+FFFD (a
// character whose bytes are still arriving). Decoders that look at context (LLaMA 2's Strip of
// the first space) then see the same context as in a whole decode.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "dissect/text/tokenizer.hpp"
#include "dissect/text/utf8.hpp"

namespace dissect::text {

class DecodeStream {
 public:
  /// `tokenizer` must outlive the stream.
  explicit DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

  /// Adds one id; returns the text it completes (often empty while a character is incomplete).
  /// @throws ConfigError for an id outside the vocabulary (as Tokenizer::decode).
  std::string push(std::int32_t id) {
    if (prefix_.empty() && !ids_.empty()) {
      std::string text = tokenizer_->decode(ids_, skip_special_);
      if (!ends_with_replacement(text)) {
        prefix_ = std::move(text);
        prefix_index_ = ids_.size();
      }
    }
    ids_.push_back(id);
    std::string text = tokenizer_->decode(ids_, skip_special_);
    if (text.size() <= prefix_.size() || ends_with_replacement(text)) return {};
    std::size_t common = 0;  // the decoders we have only ever extend the prefix
    while (common < prefix_.size() && text[common] == prefix_[common]) ++common;
    std::string added = text.substr(common);
    // Keep only the ids after the prefix as the next window's context.
    ids_.erase(ids_.begin(), ids_.begin() + static_cast<std::ptrdiff_t>(prefix_index_));
    prefix_index_ = ids_.size();
    prefix_ = tokenizer_->decode(ids_, skip_special_);
    return added;
  }

  /// What is still held back (an incomplete character, shown as U+FFFD), emptying the stream.
  std::string finish() {
    std::string text = tokenizer_->decode(ids_, skip_special_);
    std::string rest = text.size() > prefix_.size() ? text.substr(prefix_.size()) : std::string();
    ids_.clear();
    prefix_.clear();
    prefix_index_ = 0;
    return rest;
  }

 private:
  static bool ends_with_replacement(const std::string& text) {
    return text.size() >= 3 && text.compare(text.size() - 3, 3, replacement_character) == 0;
  }

  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<std::int32_t> ids_;
  std::string prefix_;
  std::size_t prefix_index_ = 0;
};

}  // namespace dissect::text
