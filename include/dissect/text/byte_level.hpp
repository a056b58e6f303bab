// dissect/text/byte_level.hpp — GPT-2's byte-level alphabet: each of the 256 bytes shown as one
// printable code point, so a byte-level BPE vocabulary can be written as text in vocab.json and
// tokenizer.json ("Ġ" is the space byte 0x20, "Ċ" the newline 0x0A).
//
// The printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves; the other 68 take
// U+0100 onwards in byte order. The tokenizer converts a byte-level vocabulary back to raw bytes
// when it loads it, so encoding never builds the mapped text.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "dissect/text/utf8.hpp"

namespace dissect::text {

/// The byte-level alphabet: `code_point[b]` stands for byte b.
struct ByteLevelAlphabet {
  std::array<char32_t, 256> code_point{};
  std::array<std::int16_t, 0x100 + 68> byte_for{};  ///< the inverse; -1 where none

  constexpr ByteLevelAlphabet() {
    for (auto& b : byte_for) b = -1;
    const auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const char32_t c = printable(b) ? static_cast<char32_t>(b) : next++;
      code_point[static_cast<std::size_t>(b)] = c;
      byte_for[c] = static_cast<std::int16_t>(b);
    }
  }

  /// The byte a code point stands for, or nothing when it is not in the alphabet.
  constexpr std::optional<std::uint8_t> byte_of(char32_t c) const {
    if (c >= byte_for.size() || byte_for[c] < 0) return std::nullopt;
    return static_cast<std::uint8_t>(byte_for[c]);
  }
};

inline constexpr ByteLevelAlphabet byte_level_alphabet{};

/// `bytes` written in the byte-level alphabet ("Ġhello" for " hello").
inline std::string to_byte_level(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    append_utf8(out, byte_level_alphabet.code_point[static_cast<unsigned char>(c)]);
  }
  return out;
}

/// The bytes a byte-level string stands for, into `out`; false when `text` is not valid UTF-8
/// or holds a code point outside the alphabet (an added token such as "<|endoftext|>" is fine:
/// its characters are all printable ASCII and stand for themselves).
inline bool from_byte_level(std::string_view text, std::string& out) {
  out.clear();
  std::size_t at = 0;
  while (at < text.size()) {
    const auto lead = static_cast<unsigned char>(text[at]);
    if (lead >= 0x21 && lead <= 0x7E) {  // printable ASCII stands for itself: the common case
      out += static_cast<char>(lead);
      ++at;
      continue;
    }
    const auto c = decode_code_point(text, at);
    if (!c) return false;
    const auto byte = byte_level_alphabet.byte_of(c->value);
    if (!byte) return false;
    out += static_cast<char>(*byte);
    at += c->length;
  }
  return true;
}

/// from_byte_level into a new string, or nothing.
inline std::optional<std::string> from_byte_level(std::string_view text) {
  std::string out;
  if (!from_byte_level(text, out)) return std::nullopt;
  return out;
}

}  // namespace dissect::text
