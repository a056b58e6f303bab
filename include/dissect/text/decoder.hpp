// dissect/text/decoder.hpp — tokenizer.json's "decoder": how token strings become text again
// (ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, and a Sequence of these).
//
// Invalid UTF-8 that byte tokens spell out becomes U+FFFD by the maximal-subpart rule, as
// transformers.js's TextDecoder does (utf8.hpp). Added tokens pass the ByteLevel decoder as they
// are, as in both reference libraries.
#pragma once

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/byte_level.hpp"
#include "dissect/text/regex.hpp"
#include "dissect/text/utf8.hpp"

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/text/detail/json_cursor.hpp"
#include "dissect/text/detail/replace_pattern.hpp"

namespace dissect::text {

/// A token on its way back to text: its string, and whether it is an added token.
struct DecodingToken {
  std::string text;
  bool added = false;
};

class Decoder {
 public:
  /// Reads tokenizer.json's "decoder" object at `at`.
  /// @throws FormatError for a malformed one, ConfigError for a type dissect does not implement.
  static Decoder from_json(const detail::JsonCursor& at) {
    at.expect_object();
    const std::string type = at["type"].string();
    Decoder out;
    if (type == "ByteLevel") {
      out.kind_ = Kind::byte_level;
    } else if (type == "ByteFallback") {
      out.kind_ = Kind::byte_fallback;
    } else if (type == "Fuse") {
      out.kind_ = Kind::fuse;
    } else if (type == "Strip") {
      out.kind_ = Kind::strip;
      out.content_ = at["content"].string();
      if (out.content_.empty() || !decode_code_point(out.content_, 0) ||
          decode_code_point(out.content_, 0)->length != out.content_.size()) {
        at["content"].fail("must be one character");
      }
      out.start_ = static_cast<std::size_t>(at["start"].integer(0, 1 << 20));
      out.stop_ = static_cast<std::size_t>(at["stop"].integer(0, 1 << 20));
    } else if (type == "Replace") {
      out.kind_ = Kind::replace;
      out.pattern_ = detail::ReplacePattern::from_json(at);
      out.content_ = at["content"].string();
    } else if (type == "Metaspace") {
      out.kind_ = Kind::metaspace;
      out.replacement_ = at.string_or("replacement", "\xE2\x96\x81");
      // One character, as Hugging Face's `char` (it refuses "▁▁" or ""; reliability.md row 122).
      if (out.replacement_.empty() ||
          valid_sequence_length(out.replacement_, 0) != out.replacement_.size()) {
        at["replacement"].fail(concat("must be one character, not \"", out.replacement_, '"'));
      }
      if (const auto scheme = at.find("prepend_scheme")) {
        out.strip_first_space_ = scheme->string() != "never";
      } else {
        out.strip_first_space_ = at.boolean_or("add_prefix_space", true);
      }
    } else if (type == "Sequence") {
      out.kind_ = Kind::sequence;
      const auto list = at["decoders"];
      for (std::size_t i = 0; i < list.size(); ++i) out.children_.push_back(from_json(list.at(i)));
    } else {
      at["type"].unsupported(concat('"', type, "\" is not supported"));
    }
    return out;
  }

  /// The tokens after this decoder (a chain step: Fuse makes them one).
  std::vector<DecodingToken> apply(std::vector<DecodingToken> tokens) const {
    switch (kind_) {
      case Kind::byte_level:
        return apply_byte_level(std::move(tokens));
      case Kind::byte_fallback:
        return apply_byte_fallback(std::move(tokens));
      case Kind::fuse: {
        DecodingToken all;
        for (const auto& t : tokens) all.text += t.text;
        return {std::move(all)};
      }
      case Kind::strip:
        for (auto& t : tokens) t.text = strip(t.text);
        return tokens;
      case Kind::replace:
        for (auto& t : tokens) t.text = replace(t.text);
        return tokens;
      case Kind::metaspace:
        for (std::size_t i = 0; i < tokens.size(); ++i) {
          std::string& text = tokens[i].text;
          std::string out;
          for (std::size_t at = 0; at < text.size();) {
            if (text.compare(at, replacement_.size(), replacement_) == 0) {
              out += ' ';
              at += replacement_.size();
            } else {
              out += text[at++];
            }
          }
          if (i == 0 && strip_first_space_ && !out.empty() && out.front() == ' ') out.erase(0, 1);
          text = std::move(out);
        }
        return tokens;
      case Kind::sequence:
        for (const auto& child : children_) tokens = child.apply(std::move(tokens));
        return tokens;
    }
    return tokens;
  }

 private:
  enum class Kind { byte_level, byte_fallback, fuse, strip, replace, metaspace, sequence };

  static std::vector<DecodingToken> apply_byte_level(std::vector<DecodingToken> tokens) {
    // Runs of ordinary tokens become bytes and then text together: a character's bytes may be
    // split across tokens.
    std::vector<DecodingToken> out;
    std::string bytes;
    const auto flush = [&] {
      if (!bytes.empty()) out.push_back({to_valid_utf8(bytes), false});
      bytes.clear();
    };
    for (auto& token : tokens) {
      if (token.added) {
        flush();
        out.push_back(std::move(token));
        continue;
      }
      for (std::size_t at = 0; at < token.text.size();) {
        const auto c = decode_code_point(token.text, at);
        const std::size_t length = c ? c->length : 1;
        const auto byte = c ? byte_level_alphabet.byte_of(c->value) : std::nullopt;
        if (byte) {
          bytes += static_cast<char>(*byte);
        } else {
          bytes.append(token.text, at, length);  // not in the alphabet: the character itself
        }
        at += length;
      }
    }
    flush();
    return out;
  }

  static std::optional<unsigned char> byte_token(std::string_view text) {
    if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return std::nullopt;
    const auto digit = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int high = digit(text[3]), low = digit(text[4]);
    if (high < 0 || low < 0) return std::nullopt;
    return static_cast<unsigned char>(high * 16 + low);
  }

  static std::vector<DecodingToken> apply_byte_fallback(std::vector<DecodingToken> tokens) {
    std::vector<DecodingToken> out;
    std::string bytes;
    for (auto& token : tokens) {
      if (const auto byte = byte_token(token.text)) {
        bytes += static_cast<char>(*byte);
        continue;
      }
      if (!bytes.empty()) out.push_back({to_valid_utf8(bytes), false});
      bytes.clear();
      out.push_back(std::move(token));
    }
    if (!bytes.empty()) out.push_back({to_valid_utf8(bytes), false});
    return out;
  }

  std::string strip(const std::string& text) const {
    std::size_t begin = 0, end = text.size();
    for (std::size_t i = 0; i < start_ && text.compare(begin, content_.size(), content_) == 0;
         ++i) {
      begin += content_.size();
    }
    for (std::size_t i = 0; i < stop_ && end >= begin + content_.size() &&
                            text.compare(end - content_.size(), content_.size(), content_) == 0;
         ++i) {
      end -= content_.size();
    }
    return text.substr(begin, end - begin);
  }

  std::string replace(const std::string& text) const {
    std::string out;
    std::size_t copied = 0;
    pattern_->for_each_match(text, "Decoder Replace", [&](std::size_t begin, std::size_t end) {
      out.append(text, copied, begin - copied).append(content_);
      copied = end;
    });
    return out.append(text, copied, std::string::npos);
  }

  Kind kind_ = Kind::sequence;
  std::string content_, replacement_;
  std::optional<detail::ReplacePattern> pattern_;
  std::size_t start_ = 0, stop_ = 0;
  bool strip_first_space_ = true;
  std::vector<Decoder> children_;
};

}  // namespace dissect::text
