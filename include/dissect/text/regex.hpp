// dissect/text/regex.hpp — the split patterns of tokenizer.json, compiled by PCRE2 (UTF mode,
// JIT) and matched with the semantics of the reference implementation, transformers.js.
//
// tokenizer.json's patterns are written for Oniguruma (Hugging Face's Rust library) and read by
// JavaScript's RegExp with the "u" flag in transformers.js, whose output our fixtures are. The
// two differ in corners, and we follow JavaScript's: \d and \w are ASCII, \s is JavaScript's
// whitespace set (which has U+FEFF, and not U+0085 or U+180E as PCRE2's Unicode \s has), and a
// case-insensitive group of ASCII letters such as (?i:'s|'t) matches only ASCII case pairs (not
// the long s U+017F or the Kelvin sign U+212A that Unicode case folding would add). \p{...}
// classes use PCRE2's Unicode tables (Debian 12's PCRE2 10.42: Unicode 14.0).
#pragma once

#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <string_view>

#include "dissect/core/error.hpp"
#include "dissect/text/utf8.hpp"

namespace dissect::text {

namespace detail {

// JavaScript's \s: WhiteSpace and LineTerminator of ECMA-262 (tab, VT, FF, space, NBSP, the Zs
// characters, ZWNBSP U+FEFF, LF, CR, U+2028, U+2029), as members of a character class.
inline constexpr std::string_view js_space_members =
    "\\t\\n\\x{0B}\\f\\r \\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}"
    "\\x{3000}\\x{FEFF}";

// The content of a (?i:...) group when it is only ASCII letters, apostrophes and alternation,
// rewritten with explicit case pairs ('s → '[sS]); empty when the group is anything else.
inline std::string ascii_caseless_group(std::string_view content) {
  std::string out;
  for (const char c : content) {
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    if (letter) {
      const char lower = static_cast<char>(c | 0x20);
      out += concat('[', lower, static_cast<char>(lower - 32), ']');
    } else if (c == '\'' || c == '|') {
      out += c;
    } else {
      return {};
    }
  }
  return out;
}

}  // namespace detail

/// A tokenizer.json pattern as PCRE2 reads it with JavaScript's meaning (see the top), \s and
/// \S spelled as the class members `space_members` (JavaScript's unless another engine's
/// whitespace is wanted: llama.cpp's, gguf_tokenizer.hpp).
/// @throws ConfigError naming `where` for a \S inside a character class (no PCRE2 spelling).
inline std::string to_pcre2_pattern(std::string_view pattern, std::string_view where,
                                    std::string_view space_members = detail::js_space_members) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      const char next = pattern[++i];
      if (next == 's') {
        out += in_class ? std::string(space_members) : concat('[', space_members, ']');
      } else if (next == 'S') {
        if (in_class) {
          throw ConfigError(concat(where, ": \\S inside a character class is not supported"));
        }
        out += concat("[^", space_members, ']');
      } else {
        out += c;
        out += next;
      }
      continue;
    }
    if (in_class) {
      if (c == ']') in_class = false;
      out += c;
      continue;
    }
    if (c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal member, not the end.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (pattern.substr(i, 4) == "(?i:") {
      const std::size_t close = pattern.find(')', i + 4);
      if (close != std::string_view::npos) {
        const std::string rewritten =
            detail::ascii_caseless_group(pattern.substr(i + 4, close - i - 4));
        if (!rewritten.empty()) {
          out += concat("(?:", rewritten, ')');
          i = close;
          continue;
        }
      }
    }
    out += c;
  }
  return out;
}

namespace detail {

/// The work a hostile pattern may make matching cost (reliability.md row 119). PCRE2 bounds
/// each start position by its match limit, but a pattern that backtracks a lot at every
/// position stays under it and still takes minutes: `(a+)+b|\s` spent 57 s on 100 KB. So each
/// match call first runs with a small limit per start position, `quick_steps`, which every
/// tokenizer pattern we know stays far below (work at most quick_steps · bytes); a call that
/// needs more runs again with PCRE2's usual 10⁷, and those retries draw on one budget for the
/// whole encode, `base_steps` + `steps_per_byte` · bytes. Past it: an Error naming the pattern.
class RegexBudget {
 public:
  static constexpr std::uint32_t quick_steps = 10'000;
  static constexpr std::uint32_t deep_steps = 10'000'000;
  static constexpr std::uint64_t base_steps = 100'000'000;
  static constexpr std::uint64_t steps_per_byte = 1'000;

  /// Opens the budget of `bytes` of text for this thread, unless one is open already (an
  /// encode's, which every pattern of it then shares).
  explicit RegexBudget(std::size_t bytes)
      : left_(base_steps + steps_per_byte * static_cast<std::uint64_t>(bytes)),
        total_(left_),
        bytes_(bytes),
        owner_(current_ == nullptr) {
    if (owner_) current_ = this;
  }
  ~RegexBudget() {
    if (owner_) current_ = nullptr;
  }
  RegexBudget(const RegexBudget&) = delete;
  RegexBudget& operator=(const RegexBudget&) = delete;

  /// The budget open on this thread (there is one while any RegexBudget lives).
  static RegexBudget& current() { return *current_; }

  /// Takes `steps`, or false when fewer are left.
  bool take(std::uint64_t steps) {
    if (steps > left_) return false;
    left_ -= steps;
    return true;
  }
  std::uint64_t total() const { return total_; }
  std::size_t bytes() const { return bytes_; }

 private:
  std::uint64_t left_, total_;
  std::size_t bytes_;
  bool owner_;
  inline static thread_local RegexBudget* current_ = nullptr;
};

}  // namespace detail

/// A compiled pattern. Copies share the compiled code, which PCRE2 allows several threads to
/// match with at once (each call has its own match data).
class Regex {
 public:
  /// Compiles `pattern` (tokenizer.json's spelling, rewritten by to_pcre2_pattern).
  /// @throws ConfigError "<where>: <PCRE2's message> at offset N" for a pattern PCRE2 refuses.
  Regex(std::string_view pattern, std::string_view where) : source_(pattern) {
    const std::string translated = to_pcre2_pattern(pattern, where);
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()),
                                     translated.size(), PCRE2_UTF, &error, &offset, nullptr);
    if (code == nullptr) {
      throw ConfigError(concat(where, ": the pattern \"", pattern,
                               "\" does not compile: ", message(error), " at offset ", offset));
    }
    code_.reset(code, pcre2_code_free);
    // The JIT makes matching several times faster; without it (an unsupported CPU) the
    // interpreter gives the same matches.
    jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  }

  /// The pattern as tokenizer.json wrote it.
  const std::string& source() const { return source_; }

  /// Calls `on_match(begin, end)` for each match in `text` (valid UTF-8), left to right and
  /// not overlapping, as JavaScript's matchAll does: after an empty match the search moves on
  /// by one code point. Work is bounded (detail::RegexBudget), and memory: when the JIT's stack
  /// is too small (deep backtracking over a long text) the rest of the text goes to the
  /// interpreter, whose frames live on the heap, at most 64 MiB + 256 bytes per byte of text
  /// (reliability.md row 120).
  /// @throws Error naming `op` and the pattern past the work bound, or if PCRE2 gives up (a
  ///         resource limit on a hostile input).
  template <class OnMatch>
  void for_each_match(std::string_view text, std::string_view op, OnMatch&& on_match) const {
    const std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
        pcre2_match_data_create_from_pattern(code_.get(), nullptr), pcre2_match_data_free);
    const std::unique_ptr<pcre2_match_context, decltype(&pcre2_match_context_free)> context(
        pcre2_match_context_create(nullptr), pcre2_match_context_free);
    if (!data || !context) throw std::bad_alloc();
    const std::uint64_t heap_kib = 65'536 + text.size() / 4;  // 64 MiB + 256 B per byte
    pcre2_set_heap_limit(context.get(),
                         static_cast<std::uint32_t>(std::min<std::uint64_t>(heap_kib, UINT32_MAX)));
    detail::RegexBudget local(text.size());  // unless an encode opened one
    detail::RegexBudget& budget = detail::RegexBudget::current();
    bool jit = jit_;
    const auto match = [&](std::size_t at, std::uint32_t limit) {
      pcre2_set_match_limit(context.get(), limit);
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
      int rc =
          jit ? pcre2_jit_match(code_.get(), subject, text.size(), at, 0, data.get(), context.get())
              : PCRE2_ERROR_JIT_STACKLIMIT;
      if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
        // Deep backtracking: the interpreter keeps its frames on the heap. PCRE2_NO_JIT, or
        // pcre2_match would run the JIT code again.
        jit = false;
        rc = pcre2_match(code_.get(), subject, text.size(), at, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                         data.get(), context.get());
      }
      return rc;
    };
    std::size_t at = 0;
    while (at <= text.size()) {
      int rc = match(at, detail::RegexBudget::quick_steps);
      if (rc == PCRE2_ERROR_MATCHLIMIT) {
        if (!budget.take(detail::RegexBudget::deep_steps)) throw over_budget(op, budget);
        rc = match(at, detail::RegexBudget::deep_steps);
        if (rc == PCRE2_ERROR_MATCHLIMIT) throw over_budget(op, budget);
      }
      if (rc == PCRE2_ERROR_NOMATCH) return;
      if (rc < 0) {
        throw Error(concat(op, ": matching the pattern \"", source_, "\" failed: ", message(rc),
                           " (on ", text.size(), " bytes of text)"));
      }
      const PCRE2_SIZE* span = pcre2_get_ovector_pointer(data.get());
      const std::size_t begin = span[0], end = span[1];
      on_match(begin, end);
      if (end > begin) {
        at = end;
      } else {
        if (end >= text.size()) return;
        const std::size_t step = valid_sequence_length(text, end);
        at = end + (step == 0 ? 1 : step);
      }
    }
  }

  /// Whether the pattern runs as JIT code (false: the interpreter; tests pin the fallback).
  bool jit() const { return jit_; }

 private:
  Error over_budget(std::string_view op, const detail::RegexBudget& budget) const {
    return Error(concat(op, ": the pattern \"", source_, "\" exceeded the work bound of matching ",
                        budget.bytes(), " bytes of text (", detail::RegexBudget::deep_steps,
                        " backtracking steps at one position, ", budget.total(),
                        " in all): it backtracks catastrophically on this text"));
  }

  static std::string message(int error) {
    PCRE2_UCHAR buffer[256];
    const int length = pcre2_get_error_message(error, buffer, sizeof buffer);
    return length < 0 ? concat("PCRE2 error ", error)
                      : std::string(reinterpret_cast<const char*>(buffer),
                                    static_cast<std::size_t>(length));
  }

  std::string source_;
  std::shared_ptr<pcre2_code> code_;
  bool jit_ = false;
};

}  // namespace dissect::text
