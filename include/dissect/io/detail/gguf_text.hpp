// dissect/io/detail/gguf_text.hpp — PRIVATE: text a file supplies (a GGUF key, a tensor name, an
// architecture, a string value) made fit for a message or a terminal. What a file says reaches
// the user's terminal inside error messages and reports; a name holding ESC [ … could move the
// cursor, recolour or clear the screen, or hide the rest of the message, and bytes that are not
// UTF-8 break JSON. dissect/io/gguf.hpp's escape_file_text and quote_file_text are the public
// names of the one rule written here.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error "dissect/io/detail/gguf_text.hpp is private to dissect: include dissect/io/gguf.hpp instead"
#endif

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace dissect::detail {

/// The length of the well-formed UTF-8 sequence starting at text[at] (1 to 4), or 0 if the bytes
/// there are not one (a stray continuation byte, an overlong form, a surrogate, a code point
/// past U+10FFFF, a sequence cut short): Unicode's table 3-7.
inline std::size_t utf8_sequence_length(std::string_view text, std::size_t at) {
  const auto byte = [&](std::size_t i) -> unsigned {
    return at + i < text.size() ? static_cast<unsigned char>(text[at + i]) : 0x100u;
  };
  const unsigned lead = byte(0);
  const auto continuation = [&](std::size_t i, unsigned low = 0x80, unsigned high = 0xbf) {
    return byte(i) >= low && byte(i) <= high;
  };
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) return continuation(1) ? 2 : 0;
  if (lead >= 0xe0 && lead <= 0xef) {
    const unsigned low = lead == 0xe0 ? 0xa0 : 0x80, high = lead == 0xed ? 0x9f : 0xbf;
    return continuation(1, low, high) && continuation(2) ? 3 : 0;
  }
  if (lead >= 0xf0 && lead <= 0xf4) {
    const unsigned low = lead == 0xf0 ? 0x90 : 0x80, high = lead == 0xf4 ? 0x8f : 0xbf;
    return continuation(1, low, high) && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

/// Whether a well-formed sequence of `length` bytes at text[at] is a character a terminal acts
/// on rather than shows: a C1 control (U+0080–U+009F; U+009B is CSI, like ESC [) or one that
/// reorders what follows (U+202A–U+202E, U+2066–U+2069: text could read backwards).
inline bool is_hidden_control(std::string_view text, std::size_t at, std::size_t length) {
  const auto b = [&](std::size_t i) { return static_cast<unsigned char>(text[at + i]); };
  if (length == 2) return b(0) == 0xc2 && b(1) <= 0x9f;
  if (length == 3 && b(0) == 0xe2) {
    return (b(1) == 0x80 && b(2) >= 0xaa && b(2) <= 0xae) ||
           (b(1) == 0x81 && b(2) >= 0xa6 && b(2) <= 0xa9);
  }
  return false;
}

/// `text` with every byte a terminal would act on, and every byte that is not part of valid
/// UTF-8, written as \xNN (ESC is \x1b); a backslash is doubled and, when `quote_mark` is set, a
/// double quote escaped, so the result reads back unambiguously. Printable text (UTF-8 letters
/// included) is left as it is.
inline std::string escape_file_text(std::string_view text, bool quote_mark) {
  static constexpr char hex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  const auto escape_byte = [&](unsigned char byte) {
    out += "\\x";
    out += hex[byte >> 4];
    out += hex[byte & 15];
  };
  for (std::size_t at = 0; at < text.size();) {
    const auto byte = static_cast<unsigned char>(text[at]);
    const std::size_t length = utf8_sequence_length(text, at);
    if (length == 0) {
      escape_byte(byte);  // not UTF-8: the byte alone, and resynchronise on the next one
      ++at;
    } else if (length == 1) {
      if (byte < 0x20 || byte == 0x7f) {
        escape_byte(byte);
      } else if (byte == '\\' || (quote_mark && byte == '"')) {
        out += '\\';
        out += static_cast<char>(byte);
      } else {
        out += static_cast<char>(byte);
      }
      ++at;
    } else {
      if (is_hidden_control(text, at, length)) {
        for (std::size_t i = 0; i < length; ++i)
          escape_byte(static_cast<unsigned char>(text[at + i]));
      } else {
        out.append(text.substr(at, length));
      }
      at += length;
    }
  }
  return out;
}

}  // namespace dissect::detail
