// dissect/text/normalizer.hpp — tokenizer.json's "normalizer": what happens to the text before
// it is split (Unicode normalization forms, Prepend, Replace, Strip, and a Sequence of these).
//
// Unicode normalization is utf8proc's (Unicode 15.0 in Debian 12), not a table of ours. Offsets
// through NFC/NFKC are exact to the run between two ASCII characters: ASCII never composes with
// what precedes it, so each such run normalizes on its own, and its bytes take the run's span.
#pragma once

#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/normalized_text.hpp"
#include "dissect/text/regex.hpp"

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/text/detail/json_cursor.hpp"
#include "dissect/text/detail/replace_pattern.hpp"

namespace dissect::text {

/// A Unicode normalization form.
enum class UnicodeForm { nfc, nfd, nfkc, nfkd };

/// `text` (valid UTF-8) in normalization form `form`. utf8proc decomposes into 4 bytes per code
/// point before it composes: callers hand it runs (Normalizer does), not a whole 100 MB text.
/// @throws Error if utf8proc refuses it (it cannot: the text is validated before).
inline std::string normalize_unicode(std::string_view text, UnicodeForm form) {
  bool ascii = true;
  for (const char c : text) ascii = ascii && static_cast<unsigned char>(c) < 0x80;
  if (ascii) return std::string(text);  // ASCII is stable under every form
  int options = UTF8PROC_STABLE;
  switch (form) {
    case UnicodeForm::nfc:
      options |= UTF8PROC_COMPOSE;
      break;
    case UnicodeForm::nfd:
      options |= UTF8PROC_DECOMPOSE;
      break;
    case UnicodeForm::nfkc:
      options |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
      break;
    case UnicodeForm::nfkd:
      options |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
      break;
  }
  utf8proc_uint8_t* result = nullptr;
  const utf8proc_ssize_t length = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
      static_cast<utf8proc_ssize_t>(text.size()), &result, static_cast<utf8proc_option_t>(options));
  if (length < 0) {
    throw Error(concat("normalize_unicode: utf8proc: ", utf8proc_errmsg(length)));
  }
  const std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> owned(result, std::free);
  return std::string(reinterpret_cast<const char*>(result), static_cast<std::size_t>(length));
}

/// One normalizer of tokenizer.json, or a Sequence of them.
///
/// Memory is bounded by the input (reliability.md row 121): no normalizer may make its text
/// longer than `max_growth` times its input plus `max_growth_slack` bytes. The largest
/// expansion Unicode has, NFKC's U+FDFA (3 bytes → 33), is within it; a Replace of each
/// character by 10,000 bytes is refused as soon as its output would pass the bound, before it
/// allocates (it used to end in bad_alloc after 4 GB).
class Normalizer {
 public:
  enum class Kind { unicode, prepend, replace, strip, sequence };

  static constexpr std::size_t max_growth = 16;
  static constexpr std::size_t max_growth_slack = 4096;
  /// The most bytes a normalizer may make of `input` bytes.
  static constexpr std::size_t output_limit(std::size_t input) {
    return max_growth * input + max_growth_slack;
  }

  /// Reads tokenizer.json's "normalizer" object at `at`.
  /// @throws FormatError for a malformed one, ConfigError for a type dissect does not implement.
  static Normalizer from_json(const detail::JsonCursor& at) {
    at.expect_object();
    const std::string type = at["type"].string();
    Normalizer out;
    if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
      out.kind_ = Kind::unicode;
      out.form_ = type == "NFC"    ? UnicodeForm::nfc
                  : type == "NFD"  ? UnicodeForm::nfd
                  : type == "NFKC" ? UnicodeForm::nfkc
                                   : UnicodeForm::nfkd;
    } else if (type == "Prepend") {
      out.kind_ = Kind::prepend;
      out.content_ = at["prepend"].string();
    } else if (type == "Replace") {
      out.kind_ = Kind::replace;
      out.pattern_ = detail::ReplacePattern::from_json(at);
      out.content_ = at["content"].string();
    } else if (type == "Strip") {
      out.kind_ = Kind::strip;
      out.strip_left_ = at.boolean_or("strip_left", false);
      out.strip_right_ = at.boolean_or("strip_right", false);
    } else if (type == "Sequence") {
      out.kind_ = Kind::sequence;
      const auto list = at["normalizers"];
      for (std::size_t i = 0; i < list.size(); ++i) out.children_.push_back(from_json(list.at(i)));
    } else {
      at["type"].unsupported(concat('"', type, "\" is not supported"));
    }
    return out;
  }

  Kind kind() const { return kind_; }

  /// `in` normalized.
  /// @throws Error when the text would grow past output_limit of `in`'s size (for a Sequence,
  ///         of the text it was given, not of each step's).
  NormalizedText apply(NormalizedText in) const {
    const std::size_t base = in.text.size();
    return apply(std::move(in), base);
  }

 private:
  NormalizedText apply(NormalizedText in, std::size_t base) const {
    switch (kind_) {
      case Kind::unicode:
        return apply_unicode(std::move(in), base);
      case Kind::prepend: {
        if (in.text.empty()) return in;  // Hugging Face prepends only to non-empty text
        check_size("Prepend", base, in.text.size() + content_.size());
        NormalizedBuilder out(in.tracked);
        out.reserve(in.text.size() + content_.size());
        out.add(content_, in.span_of(0, 0));
        out.copy(in, 0, in.text.size());
        return out.take();
      }
      case Kind::replace:
        return apply_replace(std::move(in), base);
      case Kind::strip:
        return apply_strip(std::move(in));
      case Kind::sequence:
        for (const auto& child : children_) in = child.apply(std::move(in), base);
        return in;
    }
    return in;
  }

  NormalizedText apply_unicode(NormalizedText in, std::size_t base) const {
    // Run by run: a run starts at an ASCII byte (or the start) and holds what follows up to
    // the next ASCII byte. ASCII runs are stable; each other run normalizes on its own. So
    // utf8proc's buffer of 4 bytes per code point is one run's, and the copy is made once.
    NormalizedBuilder out(in.tracked);
    out.reserve(in.text.size());
    std::size_t begin = 0;
    while (begin < in.text.size()) {
      std::size_t end = begin + 1;
      while (end < in.text.size() && static_cast<unsigned char>(in.text[end]) >= 0x80) ++end;
      if (end == begin + 1 && static_cast<unsigned char>(in.text[begin]) < 0x80) {
        out.copy(in, begin, end);
      } else {
        const std::string_view run = std::string_view(in.text).substr(begin, end - begin);
        const std::string normalized = normalize_unicode(run, form_);
        if (normalized == run) {
          out.copy(in, begin, end);
        } else {
          check_size(form_name(), base, out.size() + normalized.size());
          out.add(normalized, in.span_of(begin, end));
        }
      }
      begin = end;
    }
    return out.take();
  }

  const char* form_name() const {
    switch (form_) {
      case UnicodeForm::nfc:
        return "NFC";
      case UnicodeForm::nfd:
        return "NFD";
      case UnicodeForm::nfkc:
        return "NFKC";
      case UnicodeForm::nfkd:
        return "NFKD";
    }
    return "Unicode";
  }

  // Refuses an output of `output` bytes from a text of `input` bytes past output_limit.
  static void check_size(std::string_view name, std::size_t input, std::size_t output) {
    if (output > output_limit(input)) {
      throw Error(concat("Normalizer ", name, ": ", input, " bytes of text would become more than ",
                         output_limit(input), " (at most ", max_growth, " times the input + ",
                         max_growth_slack, " bytes): refused before allocating"));
    }
  }

  NormalizedText apply_replace(NormalizedText in, std::size_t base) const {
    NormalizedBuilder out(in.tracked);
    out.reserve(in.text.size());
    std::size_t copied = 0;
    const auto replace = [&](std::size_t begin, std::size_t end) {
      // What the text has become so far, checked before the bytes are appended.
      check_size("Replace", base, out.size() + (begin - copied) + content_.size());
      out.copy(in, copied, begin);
      out.add(content_, in.span_of(begin, end));
      copied = end;
    };
    pattern_->for_each_match(in.text, "Normalizer Replace",
                             [&](std::size_t begin, std::size_t end) {
                               if (end > begin || !content_.empty()) replace(begin, end);
                             });
    out.copy(in, copied, in.text.size());
    return out.take();
  }

  NormalizedText apply_strip(NormalizedText in) const {
    // JavaScript's trim(): its whitespace is \s as regex.hpp spells it.
    static const Regex leading("^\\s+", "Strip"), trailing("\\s+\\z", "Strip");
    std::size_t begin = 0, end = in.text.size();
    if (strip_left_)
      leading.for_each_match(in.text, "Strip", [&](std::size_t, std::size_t e) { begin = e; });
    if (strip_right_ && begin < end) {
      trailing.for_each_match(in.text, "Strip", [&](std::size_t b, std::size_t e) {
        if (e == in.text.size()) end = std::max(b, begin);
      });
    }
    NormalizedBuilder out(in.tracked);
    out.copy(in, begin, end);
    return out.take();
  }

  Kind kind_ = Kind::sequence;
  UnicodeForm form_ = UnicodeForm::nfc;
  std::string content_;
  std::optional<detail::ReplacePattern> pattern_;
  bool strip_left_ = false, strip_right_ = false;
  std::vector<Normalizer> children_;
};

}  // namespace dissect::text
