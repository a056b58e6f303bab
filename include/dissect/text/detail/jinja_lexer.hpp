// dissect/text/detail/jinja_lexer.hpp — private: do not include directly
// (dissect/text/chat_template.hpp does).
//
// Splits a chat template into text, `{{ … }}` and `{% … %}` pieces, with the whitespace rules
// of Jinja2 as transformers configures it: trim_blocks (the newline after a block or comment tag
// goes), lstrip_blocks (spaces and tabs from a line's start to a block or comment tag go), the
// `-` and `+` markers, newlines normalized to "\n" and one trailing newline dropped
// (keep_trailing_newline=False). Each rule is Jinja2's lexer's, because one space more or less
// is a different prompt.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/jinja_lexer.hpp is private to dissect: include dissect/text/chat_template.hpp instead"
#endif

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/utf8.hpp"

namespace dissect::text::detail::jinja {

enum class TokenType { name, string, integer, floating, op, end };

struct Token {
  TokenType type = TokenType::end;
  std::string text;  ///< the name, the operator, the decoded string
  std::int64_t integer = 0;
  double floating = 0;
  int line = 1;
};

/// A piece of the template: literal text, an expression to print, or a statement.
struct Segment {
  enum class Kind { text, output, statement } kind = Kind::text;
  std::string text;
  std::vector<Token> tokens;  ///< ends with a TokenType::end
  int line = 1;
};

[[noreturn]] inline void syntax_error(int line, std::string_view what) {
  throw ConfigError(concat("chat template: line ", line, ": syntax error: ", what));
}

/// Python's str.isspace for one code point (what `\s`, strip() and trim use).
inline bool is_py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f ||
         c == 0x205f || c == 0x3000;
}

/// The code points of `s` (bytes that are not UTF-8 count as U+FFFD, one each).
inline std::u32string code_points(std::string_view s) {
  std::u32string out;
  for (std::size_t i = 0; i < s.size();) {
    const auto cp = decode_code_point(s, i);
    out += cp ? cp->value : char32_t{0xFFFD};
    i += cp ? cp->length : 1;
  }
  return out;
}
inline std::string utf8_of(std::u32string_view s) {
  std::string out;
  for (const char32_t c : s) append_utf8(out, c);
  return out;
}

/// How many bytes of whitespace `s` starts with (forward) or ends with (backward).
inline std::size_t leading_space(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto cp = decode_code_point(s, i);
    if (!cp || !is_py_space(cp->value)) break;
    i += cp->length;
  }
  return i;
}
inline std::string_view rstrip_space(std::string_view s) {
  std::size_t end = s.size();
  while (end > 0) {
    std::size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const auto cp = decode_code_point(s, start);
    if (!cp || start + cp->length != end || !is_py_space(cp->value)) break;
    end = start;
  }
  return s.substr(0, end);
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) {
    // Jinja2 splits the source on \r\n, \r and \n and joins with "\n", dropping one empty last
    // line: every newline becomes "\n" and one trailing newline goes.
    src_.reserve(source.size());
    for (std::size_t i = 0; i < source.size(); ++i) {
      if (source[i] == '\r') {
        src_ += '\n';
        if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
      } else {
        src_ += source[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Segment> run() {
    std::vector<Segment> out;
    std::size_t pos = 0;
    bool line_starting = true;
    while (pos <= src_.size()) {
      const std::size_t p = next_tag(pos);
      if (p == std::string::npos) {
        push_text(out, std::string_view(src_).substr(pos), line_at(pos));
        break;
      }
      const char kind = src_[p + 1];
      std::size_t q = p + 2;
      char sign = 0;
      if (q < src_.size() && (src_[q] == '-' || (src_[q] == '+' && kind != '{'))) sign = src_[q++];
      std::string_view text = std::string_view(src_).substr(pos, p - pos);
      if (sign == '-') {
        text = rstrip_space(text);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: only whitespace between the line's start and the tag.
        const std::size_t newline = text.rfind('\n');
        const std::size_t l_pos = newline == std::string_view::npos ? 0 : newline + 1;
        if ((l_pos > 0 || line_starting) &&
            leading_space(text.substr(l_pos)) == text.size() - l_pos)
          text = text.substr(0, l_pos);
      }
      push_text(out, text, line_at(pos));
      const int line = line_at(p);
      if (kind == '#') {
        const std::size_t e = src_.find("#}", q);
        if (e == std::string::npos) syntax_error(line, "a comment is not closed with #}");
        pos = finish_tag(e + 2, e > q ? src_[e - 1] : 0, true, line_starting);
        continue;
      }
      Segment segment;
      segment.kind = kind == '{' ? Segment::Kind::output : Segment::Kind::statement;
      segment.line = line;
      char end_sign = 0;
      pos = lex_tag(q, kind == '{' ? '}' : '%', segment.tokens, end_sign);
      pos = finish_tag(pos, end_sign, kind == '%', line_starting);
      if (kind == '%' && segment.tokens.size() == 2 && segment.tokens[0].type == TokenType::name &&
          segment.tokens[0].text == "raw") {
        pos = lex_raw(out, pos, line, line_starting);
        continue;
      }
      out.push_back(std::move(segment));
    }
    return out;
  }

 private:
  std::string src_;

  // The line of `pos`, counted on from the last position asked (the lexer moves forward), so
  // that a long template costs one pass, not one per tag.
  std::size_t line_pos_ = 0;
  int line_ = 1;
  int line_at(std::size_t pos) {
    pos = std::min(pos, src_.size());
    if (pos < line_pos_) {
      line_pos_ = 0;
      line_ = 1;
    }
    for (; line_pos_ < pos; ++line_pos_) line_ += src_[line_pos_] == '\n';
    return line_;
  }

  std::size_t next_tag(std::size_t from) const {
    for (std::size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1)) {
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    }
    return std::string::npos;
  }

  static void push_text(std::vector<Segment>& out, std::string_view text, int line) {
    if (text.empty()) return;
    Segment segment;
    segment.text = std::string(text);
    segment.line = line;
    out.push_back(std::move(segment));
  }

  /// After a tag's end: `-` eats all following whitespace; trim_blocks one newline after a
  /// block or comment tag (not after `+%}`).
  std::size_t finish_tag(std::size_t pos, char end_sign, bool block, bool& line_starting) const {
    const std::size_t start = pos;
    if (end_sign == '-') {
      pos += leading_space(std::string_view(src_).substr(pos));
    } else if (block && end_sign != '+' && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    line_starting = pos > start ? src_[pos - 1] == '\n' : src_[pos - 1] == '\n';
    return pos;
  }

  /// `{% raw %}…{% endraw %}`: the text between, as it is.
  std::size_t lex_raw(std::vector<Segment>& out, std::size_t pos, int line, bool& line_starting) {
    for (std::size_t p = src_.find("{%", pos); p != std::string::npos; p = src_.find("{%", p + 1)) {
      std::size_t q = p + 2;
      const char sign = q < src_.size() && (src_[q] == '-' || src_[q] == '+') ? src_[q++] : 0;
      while (q < src_.size() && (src_[q] == ' ' || src_[q] == '\t' || src_[q] == '\n')) ++q;
      if (src_.compare(q, 6, "endraw") != 0) continue;
      q += 6;
      while (q < src_.size() && (src_[q] == ' ' || src_[q] == '\t' || src_[q] == '\n')) ++q;
      char end_sign = 0;
      if (q < src_.size() && (src_[q] == '-' || src_[q] == '+')) end_sign = src_[q++];
      if (src_.compare(q, 2, "%}") != 0) continue;
      std::string_view text = std::string_view(src_).substr(pos, p - pos);
      if (sign == '-') text = rstrip_space(text);
      push_text(out, text, line);
      return finish_tag(q + 2, end_sign, true, line_starting);
    }
    syntax_error(line, "{% raw %} without {% endraw %}");
  }

  static bool is_name_start(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  }
  static bool is_digit(char c) { return c >= '0' && c <= '9'; }

  /// The tokens of one tag up to its end (`%}` or `}}`, with an optional `-`/`+` before);
  /// inside brackets an end marker is an operator, as in Jinja2's balancing.
  std::size_t lex_tag(std::size_t pos, char closer, std::vector<Token>& tokens, char& end_sign) {
    int depth = 0;
    const int tag_line = line_at(pos);
    int line = tag_line;
    while (true) {
      while (pos < src_.size() && (src_[pos] == ' ' || src_[pos] == '\t' || src_[pos] == '\n' ||
                                   src_[pos] == '\f' || src_[pos] == '\v')) {
        line += src_[pos] == '\n';
        ++pos;
      }
      if (pos >= src_.size())
        syntax_error(tag_line,
                     closer == '%' ? "a tag is not closed with %}" : "{{ is not closed with }}");
      const std::string_view rest = std::string_view(src_).substr(pos);
      if (depth == 0) {
        const std::string end = std::string(1, closer) + "}";
        if (rest.substr(0, 2) == end) {
          tokens.push_back(Token{TokenType::end, "", 0, 0, line});
          return pos + 2;
        }
        if ((rest[0] == '-' || (rest[0] == '+' && closer == '%')) && rest.substr(1, 2) == end) {
          end_sign = rest[0];
          tokens.push_back(Token{TokenType::end, "", 0, 0, line});
          return pos + 3;
        }
      }
      Token token;
      token.line = line;
      const char c = rest[0];
      if (is_name_start(c)) {
        std::size_t n = 1;
        while (n < rest.size() && (is_name_start(rest[n]) || is_digit(rest[n]))) ++n;
        token.type = TokenType::name;
        token.text = std::string(rest.substr(0, n));
        pos += n;
      } else if (is_digit(c)) {
        pos += lex_number(rest, token);
      } else if (c == '\'' || c == '"') {
        std::size_t n = 1;
        std::string raw;
        while (n < rest.size() && rest[n] != c) {
          if (rest[n] == '\\' && n + 1 < rest.size()) raw += rest[n++];
          line += rest[n] == '\n';
          raw += rest[n++];
        }
        if (n >= rest.size()) syntax_error(token.line, "a string is not closed");
        token.type = TokenType::string;
        token.text = unescape(raw, token.line);
        pos += n + 1;
      } else {
        static const char* const two[] = {"//", "**", "==", "!=", "<=", ">="};
        std::string op;
        for (const char* t : two)
          if (rest.substr(0, 2) == t) op = t;
        if (op.empty()) {
          if (std::string_view("+-*/%~()[]{},.:|=<>").find(c) == std::string_view::npos)
            syntax_error(line, concat("unexpected character '", c, "'"));
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if ((op == ")" || op == "]" || op == "}") && depth > 0) --depth;
        token.type = TokenType::op;
        token.text = op;
        pos += op.size();
      }
      tokens.push_back(std::move(token));
    }
  }

  static std::size_t lex_number(std::string_view rest, Token& token) {
    std::size_t n = 0;
    std::string digits;
    auto run = [&] {
      while (n < rest.size() && (is_digit(rest[n]) || (rest[n] == '_' && n + 1 < rest.size() &&
                                                       is_digit(rest[n + 1])))) {
        if (rest[n] != '_') digits += rest[n];
        ++n;
      }
    };
    run();
    bool is_float = false;
    if (n + 1 < rest.size() && rest[n] == '.' && is_digit(rest[n + 1])) {
      is_float = true;
      digits += rest[n++];
      run();
    }
    if (n < rest.size() && (rest[n] == 'e' || rest[n] == 'E')) {
      std::size_t m = n + 1;
      if (m < rest.size() && (rest[m] == '+' || rest[m] == '-')) ++m;
      if (m < rest.size() && is_digit(rest[m])) {
        is_float = true;
        digits += std::string(rest.substr(n, m - n));
        n = m;
        run();
      }
    }
    if (is_float) {
      token.type = TokenType::floating;
      token.floating = std::stod(digits);
    } else {
      token.type = TokenType::integer;
      std::int64_t value = 0;
      for (const char d : digits) {
        if (value > (INT64_MAX - (d - '0')) / 10)
          syntax_error(token.line, "an integer beyond int64");
        value = value * 10 + (d - '0');
      }
      token.integer = value;
    }
    token.text = digits;
    return n;
  }

  /// A string literal's escapes, as Python's "unicode-escape" decodes them (Jinja2's rule);
  /// an unknown escape stays as it is.
  static std::string unescape(std::string_view raw, int line) {
    std::string out;
    for (std::size_t i = 0; i < raw.size(); ++i) {
      if (raw[i] != '\\' || i + 1 >= raw.size()) {
        out += raw[i];
        continue;
      }
      const char c = raw[++i];
      switch (c) {
        case 'n':
          out += '\n';
          break;
        case 't':
          out += '\t';
          break;
        case 'r':
          out += '\r';
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'v':
          out += '\v';
          break;
        case '\n':
          break;  // a line continuation
        case 'x':
        case 'u':
        case 'U': {
          const std::size_t width = c == 'x' ? 2 : c == 'u' ? 4 : 8;
          char32_t value = 0;
          for (std::size_t k = 1; k <= width; ++k) {
            const char h = i + k < raw.size() ? raw[i + k] : 'g';
            int digit = h >= '0' && h <= '9'   ? h - '0'
                        : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                               : -1;
            if (digit < 0) syntax_error(line, concat("a truncated \\", c, " escape in a string"));
            value = value * 16 + static_cast<char32_t>(digit);
          }
          if (value > 0x10FFFF || (value >= 0xD800 && value <= 0xDFFF))
            syntax_error(line, "an escape that is not a Unicode scalar value");
          append_utf8(out, value);
          i += width;
          break;
        }
        default:
          if (c >= '0' && c <= '7') {
            char32_t value = static_cast<char32_t>(c - '0');
            for (int k = 0; k < 2 && i + 1 < raw.size() && raw[i + 1] >= '0' && raw[i + 1] <= '7';
                 ++k)
              value = value * 8 + static_cast<char32_t>(raw[++i] - '0');
            append_utf8(out, value);
          } else {
            out += '\\';
            out += c;
          }
      }
    }
    return out;
  }
};

}  // namespace dissect::text::detail::jinja
