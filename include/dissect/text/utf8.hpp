// dissect/text/utf8.hpp — UTF-8 as the tokenizers read and write it: code points, validation,
// and the lossy decoding that turns bytes which are not UTF-8 into U+FFFD.
//
// The lossy rule is WHATWG's "maximal subpart" one, which JavaScript's TextDecoder and Rust's
// String::from_utf8_lossy both follow: each maximal prefix of a valid sequence that cannot be
// completed becomes one U+FFFD, and every other invalid byte becomes one U+FFFD of its own. So a
// byte-level vocabulary's tokens that end mid-character decode exactly as Hugging Face's do.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace dissect::text {

/// The replacement character U+FFFD, in UTF-8.
inline constexpr std::string_view replacement_character = "\xEF\xBF\xBD";

/// One code point decoded from UTF-8, with the number of bytes it took.
struct CodePoint {
  char32_t value = 0;
  std::size_t length = 0;
};

/// The length of the valid UTF-8 sequence at `text[at]` (1–4), or 0 when the bytes there are
/// not one: a stray continuation byte, an overlong form, a surrogate, a value above U+10FFFF, a
/// sequence cut short. `at` must be < text.size().
inline std::size_t valid_sequence_length(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  if (lead < 0x80) return 1;
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte (RFC 3629, table 3-7)
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;   // overlong below U+0800
    if (lead == 0xED) high = 0x9F;  // surrogates U+D800..U+DFFF
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;   // overlong below U+10000
    if (lead == 0xF4) high = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (text.size() - at < length) return 0;
  if (byte(at + 1) < low || byte(at + 1) > high) return 0;
  for (std::size_t i = 2; i < length; ++i) {
    if (byte(at + i) < 0x80 || byte(at + i) > 0xBF) return 0;
  }
  return length;
}

/// How many bytes of the sequence at `text[at]` are a valid start of a longer one (its maximal
/// subpart: 1 for a byte that starts nothing). What one U+FFFD replaces in lossy decoding.
inline std::size_t invalid_sequence_length(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(at);
  std::size_t length = 0;
  unsigned char low = 0x80, high = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) low = 0xA0;
    if (lead == 0xED) high = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;
  } else {
    return 1;
  }
  std::size_t taken = 1;
  if (at + taken < text.size() && byte(at + taken) >= low && byte(at + taken) <= high) {
    ++taken;
    while (taken < length && at + taken < text.size() && byte(at + taken) >= 0x80 &&
           byte(at + taken) <= 0xBF) {
      ++taken;
    }
  }
  return taken;
}

/// The code point at `text[at]`, or nothing when the bytes there are not valid UTF-8.
inline std::optional<CodePoint> decode_code_point(std::string_view text, std::size_t at) {
  const std::size_t length = valid_sequence_length(text, at);
  if (length == 0) return std::nullopt;
  const auto byte = [&](std::size_t i) {
    return static_cast<char32_t>(static_cast<unsigned char>(text[i]));
  };
  char32_t value = 0;
  switch (length) {
    case 1:
      value = byte(at);
      break;
    case 2:
      value = ((byte(at) & 0x1F) << 6) | (byte(at + 1) & 0x3F);
      break;
    case 3:
      value = ((byte(at) & 0x0F) << 12) | ((byte(at + 1) & 0x3F) << 6) | (byte(at + 2) & 0x3F);
      break;
    default:
      value = ((byte(at) & 0x07) << 18) | ((byte(at + 1) & 0x3F) << 12) |
              ((byte(at + 2) & 0x3F) << 6) | (byte(at + 3) & 0x3F);
  }
  return CodePoint{value, length};
}

/// Appends the UTF-8 of `value` (a Unicode scalar value: not a surrogate, at most U+10FFFF).
inline void append_utf8(std::string& out, char32_t value) {
  if (value < 0x80) {
    out += static_cast<char>(value);
  } else if (value < 0x800) {
    out += static_cast<char>(0xC0 | (value >> 6));
    out += static_cast<char>(0x80 | (value & 0x3F));
  } else if (value < 0x10000) {
    out += static_cast<char>(0xE0 | (value >> 12));
    out += static_cast<char>(0x80 | ((value >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (value & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (value >> 18));
    out += static_cast<char>(0x80 | ((value >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((value >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (value & 0x3F));
  }
}

/// The byte offset of the first byte of `text` that is not valid UTF-8, or nothing.
inline std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
  std::size_t at = 0;
  while (at < text.size()) {
    if (static_cast<unsigned char>(text[at]) < 0x80) {  // ASCII runs are the common case
      ++at;
      continue;
    }
    const std::size_t length = valid_sequence_length(text, at);
    if (length == 0) return at;
    at += length;
  }
  return std::nullopt;
}

/// `bytes` as valid UTF-8: each invalid maximal subpart becomes U+FFFD (see the top).
inline std::string to_valid_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  std::size_t at = 0;
  while (at < bytes.size()) {
    const std::size_t length = valid_sequence_length(bytes, at);
    if (length != 0) {
      out.append(bytes.substr(at, length));
      at += length;
    } else {
      out.append(replacement_character);
      at += invalid_sequence_length(bytes, at);
    }
  }
  return out;
}

/// How many bytes at the end of `bytes` are the start of a UTF-8 sequence that more bytes could
/// still complete (0–3): what a streaming decoder holds back instead of printing.
inline std::size_t incomplete_utf8_suffix(std::string_view bytes) {
  const std::size_t n = bytes.size();
  for (std::size_t back = 1; back <= 3 && back <= n; ++back) {
    const std::size_t at = n - back;
    const auto lead = static_cast<unsigned char>(bytes[at]);
    if (lead >= 0x80 && lead <= 0xBF) continue;  // a continuation byte: look further back
    if (lead < 0xC2 || lead > 0xF4) return 0;
    const std::size_t needed = lead <= 0xDF ? 2 : lead <= 0xEF ? 3 : 4;
    // Incomplete only if what is there is a valid start (the maximal subpart) of `needed`.
    return needed > back && invalid_sequence_length(bytes, at) == back ? back : 0;
  }
  return 0;
}

}  // namespace dissect::text
