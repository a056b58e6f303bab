// dissect/text/decode_stream.hpp — decoding one token at a time, as generation produces them,
// without ever printing half a character or a different text than decode() of all the ids.
//
// The window is Hugging Face's DecodeStream: the text of the last few ids is decoded again
// with each new id, and only what it adds is emitted, once it no longer ends in U+FFFD (a
// character whose bytes are still arriving). Decoders that look at context (LLaMA 2's Strip of
// the first space) then see the same context as in a whole decode.
//
// Two bounds Hugging Face's has not (reliability.md row 118): a throwing push or finish leaves
// the stream as it was (the id is not kept), and the window stays short. Hugging Face holds ids
// whose text ends in U+FFFD for as long as that lasts, so bytes that never form a character
// (a run of stray continuation bytes) would grow the window and make each push decode all of
// it again: quadratic. Here, once more than `max_pending` ids wait, the text of all but the last
// three (a UTF-8 character has at most four bytes, so an incomplete one fits in three ids that
// each add a byte) is final: it is emitted, U+FFFD as decode() gives it, and the window moves on.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "dissect/text/tokenizer.hpp"
#include "dissect/text/utf8.hpp"

namespace dissect::text {

class DecodeStream {
 public:
  /// Ids held back at most while their text ends in U+FFFD: one more than UTF-8's longest
  /// character, so that a character arriving one byte per id is never cut.
  static constexpr std::size_t max_pending = 5;

  /// `tokenizer` must outlive the stream.
  explicit DecodeStream(const Tokenizer& tokenizer, bool skip_special_tokens = false)
      : tokenizer_(&tokenizer), skip_special_(skip_special_tokens) {}

  /// Adds one id; returns the text it completes (often empty while a character is incomplete).
  /// Each push decodes at most about 2·max_pending ids: time linear in the ids pushed.
  /// @throws ConfigError for an id outside the vocabulary (as Tokenizer::decode); the stream is
  ///         then unchanged (strong guarantee), and the next push goes on as if it never came.
  std::string push(std::int32_t id) {
    // Everything is computed on copies and committed by moves that cannot throw.
    std::vector<std::int32_t> ids = ids_;
    std::string prefix = prefix_;
    std::size_t prefix_index = prefix_index_;
    if (prefix.empty() && !ids.empty()) {
      std::string text = tokenizer_->decode(ids, skip_special_);
      if (!ends_with_replacement(text)) {
        prefix = std::move(text);
        prefix_index = ids.size();
      }
    }
    ids.push_back(id);
    std::string text = tokenizer_->decode(ids, skip_special_);
    std::size_t cut = ids.size();  // the ids whose text is final
    if (ends_with_replacement(text)) {
      if (ids.size() - prefix_index <= max_pending)
        return commit_held(std::move(ids), std::move(prefix), prefix_index);
      // Bytes that have not formed a character for max_pending ids: all but the last three ids
      // are final, provided their text is where the whole window's starts (the cut does not
      // split a character).
      cut = ids.size() - (max_utf8_length - 1);
      std::string final_text =
          tokenizer_->decode(std::span<const std::int32_t>(ids.data(), cut), skip_special_);
      if (final_text.size() <= prefix.size() || text.compare(0, final_text.size(), final_text) != 0)
        return commit_held(std::move(ids), std::move(prefix), prefix_index);
      text = std::move(final_text);
    } else if (text.size() < prefix.size()) {
      return commit_held(std::move(ids), std::move(prefix), prefix_index);
    }
    // (Text no longer than the prefix, an id that adds nothing such as a skipped special
    // token, moves the window on too: a run of them must not grow it.)
    std::size_t common = 0;  // the decoders we have only ever extend the prefix
    while (common < prefix.size() && text[common] == prefix[common]) ++common;
    std::string added = text.substr(common);
    // Keep the ids after the old prefix, up to the cut, as the next window's context.
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(prefix_index));
    prefix_index = cut - prefix_index;
    prefix =
        tokenizer_->decode(std::span<const std::int32_t>(ids.data(), prefix_index), skip_special_);
    commit(std::move(ids), std::move(prefix), prefix_index);
    return added;
  }

  /// What is still held back (an incomplete character, shown as U+FFFD), emptying the stream.
  /// @throws ConfigError only as decode() does (it cannot: every id held was decoded before);
  ///         the stream is then unchanged.
  std::string finish() {
    std::string text = tokenizer_->decode(ids_, skip_special_);
    std::string rest = text.size() > prefix_.size() ? text.substr(prefix_.size()) : std::string();
    ids_.clear();
    prefix_.clear();
    prefix_index_ = 0;
    return rest;
  }

  /// The ids the window holds (context and pending): at most about 2·max_pending.
  std::size_t window_size() const { return ids_.size(); }

 private:
  static constexpr std::size_t max_utf8_length = 4;

  static bool ends_with_replacement(const std::string& text) {
    return text.size() >= 3 && text.compare(text.size() - 3, 3, replacement_character) == 0;
  }

  void commit(std::vector<std::int32_t>&& ids, std::string&& prefix,
              std::size_t prefix_index) noexcept {
    ids_ = std::move(ids);
    prefix_ = std::move(prefix);
    prefix_index_ = prefix_index;
  }
  std::string commit_held(std::vector<std::int32_t>&& ids, std::string&& prefix,
                          std::size_t prefix_index) noexcept {
    commit(std::move(ids), std::move(prefix), prefix_index);
    return {};
  }

  const Tokenizer* tokenizer_;
  bool skip_special_;
  std::vector<std::int32_t> ids_;
  std::string prefix_;
  std::size_t prefix_index_ = 0;
};

}  // namespace dissect::text
