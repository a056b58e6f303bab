// dissect/text/added_tokens.hpp — the added tokens of a tokenizer ("<|endoftext|>", "<s>",
// chat markers): found in the text before anything else touches it, so that normalization and
// splitting can never break one apart.
//
// Matching is leftmost-longest over a byte trie, as Hugging Face's Aho-Corasick matcher and
// transformers.js's dictionary splitter both do. The flags follow Hugging Face: single_word
// refuses a match inside a word, lstrip/rstrip take the whitespace beside the token into it,
// and a `normalized` token is looked for in the normalized text instead of the raw one.
// (transformers.js ignores single_word and normalized; no vocabulary we test sets them.)
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dissect/text/utf8.hpp"

namespace dissect::text {

/// One entry of tokenizer.json's "added_tokens".
struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = false;      ///< skipped by decode(skip_special_tokens)
  bool single_word = false;  ///< only matched where no word character touches it
  bool lstrip = false;       ///< takes the whitespace on its left
  bool rstrip = false;       ///< takes the whitespace on its right
  bool normalized = false;   ///< matched in the normalized text
};

/// A match of an added token: its bytes in the searched text (with any stripped whitespace).
struct AddedTokenMatch {
  std::size_t begin = 0, end = 0;
  std::int32_t id = 0;
};

/// JavaScript's whitespace (the \s of regex.hpp) at text[at], as its length in bytes, or 0.
inline std::size_t whitespace_length(std::string_view text, std::size_t at) {
  const auto c = decode_code_point(text, at);
  if (!c) return 0;
  const char32_t v = c->value;
  const bool space = (v >= 0x09 && v <= 0x0D) || v == 0x20 || v == 0xA0 || v == 0x1680 ||
                     (v >= 0x2000 && v <= 0x200A) || v == 0x2028 || v == 0x2029 || v == 0x202F ||
                     v == 0x205F || v == 0x3000 || v == 0xFEFF;
  return space ? c->length : 0;
}

/// Finds a set of added tokens in text.
class AddedTokenMatcher {
 public:
  AddedTokenMatcher() { nodes_.push_back({}); }

  void add(const AddedToken& token) {
    if (token.content.empty()) return;
    std::int32_t node = 0;
    for (const char c : token.content) {
      const std::uint64_t key = edge(node, c);
      const auto found = edges_.find(key);
      if (found != edges_.end()) {
        node = found->second;
      } else {
        nodes_.push_back({});
        const auto child = static_cast<std::int32_t>(nodes_.size() - 1);
        edges_.emplace(key, child);
        node = child;
      }
    }
    first_byte_[static_cast<unsigned char>(token.content[0])] = true;
    Node& end = nodes_[static_cast<std::size_t>(node)];
    if (end.token < 0) {  // the first of two equal contents wins, as in a dictionary
      end.token = static_cast<std::int32_t>(tokens_.size());
      tokens_.push_back(token);
    }
  }

  bool empty() const { return tokens_.empty(); }

  /// The matches in `text`, left to right, not overlapping.
  std::vector<AddedTokenMatch> find_all(std::string_view text) const {
    std::vector<AddedTokenMatch> out;
    if (tokens_.empty()) return out;
    std::size_t at = 0, free_from = 0;  // free_from: where the previous match ended
    while (at < text.size()) {
      if (!first_byte_[static_cast<unsigned char>(text[at])]) {
        ++at;
        continue;
      }
      const std::int32_t found = longest_at(text, at);
      if (found < 0) {
        ++at;
        continue;
      }
      const AddedToken& token = tokens_[static_cast<std::size_t>(found)];
      std::size_t begin = at, end = at + token.content.size();
      if (token.single_word &&
          (touches_word_before(text, begin) || touches_word_after(text, end))) {
        ++at;
        continue;
      }
      if (token.lstrip) {
        while (begin > free_from) {
          const std::size_t start = previous_code_point(text, begin);
          if (whitespace_length(text, start) == 0) break;
          begin = start;
        }
      }
      if (token.rstrip) {
        while (end < text.size()) {
          const std::size_t length = whitespace_length(text, end);
          if (length == 0) break;
          end += length;
        }
      }
      out.push_back({begin, end, token.id});
      at = free_from = end;
    }
    return out;
  }

 private:
  struct Node {
    std::int32_t token = -1;  ///< index into tokens_ of the token ending here
  };
  static std::uint64_t edge(std::int32_t node, char c) {
    return (static_cast<std::uint64_t>(node) << 8) | static_cast<unsigned char>(c);
  }

  std::int32_t longest_at(std::string_view text, std::size_t at) const {
    std::int32_t node = 0, best = -1;
    for (std::size_t j = at; j < text.size(); ++j) {
      const auto found = edges_.find(edge(node, text[j]));
      if (found == edges_.end()) break;
      node = found->second;
      if (nodes_[static_cast<std::size_t>(node)].token >= 0)
        best = nodes_[static_cast<std::size_t>(node)].token;
    }
    return best;
  }

  static std::size_t previous_code_point(std::string_view text, std::size_t at) {
    std::size_t start = at - 1;
    while (start > 0 && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80) --start;
    return start;
  }
  // A word character as single_word means it: a letter, a digit or '_' (ASCII), or any
  // non-ASCII character that is not whitespace.
  static bool is_word_at(std::string_view text, std::size_t at) {
    const auto c = static_cast<unsigned char>(text[at]);
    if (c < 0x80)
      return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    return whitespace_length(text, at) == 0;
  }
  static bool touches_word_before(std::string_view text, std::size_t begin) {
    return begin > 0 && is_word_at(text, previous_code_point(text, begin));
  }
  static bool touches_word_after(std::string_view text, std::size_t end) {
    return end < text.size() && is_word_at(text, end);
  }

  std::vector<Node> nodes_;
  std::unordered_map<std::uint64_t, std::int32_t> edges_;
  std::array<bool, 256> first_byte_{};
  std::vector<AddedToken> tokens_;
};

}  // namespace dissect::text
