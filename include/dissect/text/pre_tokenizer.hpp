// dissect/text/pre_tokenizer.hpp — tokenizer.json's "pre_tokenizer": how normalized text is cut
// into the pieces the model encodes one by one (Split by a pattern, ByteLevel, Metaspace, and a
// Sequence of these).
//
// Pieces flow to the next stage through a callback, never through a vector of strings: most are
// views of the text, and only a stage that rewrites (a prefix space, "▁" for " ") makes a copy.
// Split's behaviours follow Hugging Face's Rust library; transformers.js, our fixtures'
// reference, treats every behaviour but Removed as Isolated, which agrees with it on every
// vocabulary we test (docs: tests/reference/tokenizers/README.md).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/normalized_text.hpp"
#include "dissect/text/regex.hpp"
#include "dissect/text/utf8.hpp"

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/text/detail/function_ref.hpp"
#include "dissect/text/detail/json_cursor.hpp"

namespace dissect::text {

/// A piece of normalized text on its way to the model.
struct Piece {
  std::string_view text;
  const Span* origin = nullptr;  ///< per byte of text, or null when offsets are not tracked
  Span section{};                ///< the original span of the whole section (for Metaspace "first")
};

using PieceSink = detail::FunctionRef<void(const Piece&)>;

/// How Split treats what its pattern matches (Hugging Face's SplitDelimiterBehavior).
enum class SplitBehavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

/// One pre-tokenizer of tokenizer.json, or a Sequence of them.
class PreTokenizer {
 public:
  enum class Kind { split, byte_level, metaspace, sequence };
  enum class PrependScheme { always, first, never };

  /// Reads tokenizer.json's "pre_tokenizer" object at `at`.
  /// @throws FormatError for a malformed one, ConfigError for a type dissect does not implement
  ///         or a ByteLevel stage that is not the last (its output is bytes, not text).
  static PreTokenizer from_json(const detail::JsonCursor& at) {
    at.expect_object();
    const std::string type = at["type"].string();
    PreTokenizer out;
    if (type == "Split") {
      out.kind_ = Kind::split;
      const auto pattern = at["pattern"];
      pattern.expect_object();
      std::string regex;
      if (const auto literal = pattern.find("String")) {
        regex = quote_literal(literal->string());
        if (regex.empty()) literal->fail("must not be empty");
      } else if (const auto source = pattern.find("Regex")) {
        regex = source->string();
      } else {
        pattern.fail("must hold \"String\" or \"Regex\"");
      }
      out.regex_ = std::make_shared<Regex>(regex, concat(at.source(), ": ", pattern.path()));
      out.invert_ = at.boolean_or("invert", false);
      const auto behavior = at["behavior"];
      const std::string name = behavior.string();
      if (name == "Removed")
        out.behavior_ = SplitBehavior::removed;
      else if (name == "Isolated")
        out.behavior_ = SplitBehavior::isolated;
      else if (name == "MergedWithPrevious")
        out.behavior_ = SplitBehavior::merged_with_previous;
      else if (name == "MergedWithNext")
        out.behavior_ = SplitBehavior::merged_with_next;
      else if (name == "Contiguous")
        out.behavior_ = SplitBehavior::contiguous;
      else
        behavior.fail(concat('"', name, "\" is not a split behavior"));
    } else if (type == "ByteLevel") {
      out.kind_ = Kind::byte_level;
      out.add_prefix_space_ = at.boolean_or("add_prefix_space", true);
      if (at.boolean_or("use_regex", true)) {
        // GPT-2's pattern, as Hugging Face's ByteLevel applies it when use_regex is true.
        out.regex_ = std::make_shared<Regex>(
            "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
            "ByteLevel");
        out.behavior_ = SplitBehavior::isolated;
      }
    } else if (type == "Metaspace") {
      out.kind_ = Kind::metaspace;
      out.replacement_ = at.string_or("replacement", "\xE2\x96\x81");
      // One character, as Hugging Face's `char` (it refuses "▁▁" or ""; reliability.md row 122).
      if (out.replacement_.empty() ||
          valid_sequence_length(out.replacement_, 0) != out.replacement_.size()) {
        at["replacement"].fail(concat("must be one character, not \"", out.replacement_, '"'));
      }
      out.split_ = at.boolean_or("split", true);
      if (const auto scheme = at.find("prepend_scheme")) {
        const std::string name = scheme->string();
        if (name == "always")
          out.prepend_ = PrependScheme::always;
        else if (name == "first")
          out.prepend_ = PrependScheme::first;
        else if (name == "never")
          out.prepend_ = PrependScheme::never;
        else
          scheme->fail(concat('"', name, "\" is not a prepend scheme"));
      } else {
        out.prepend_ =
            at.boolean_or("add_prefix_space", true) ? PrependScheme::always : PrependScheme::never;
      }
    } else if (type == "Sequence") {
      out.kind_ = Kind::sequence;
      const auto list = at["pretokenizers"];
      for (std::size_t i = 0; i < list.size(); ++i) {
        out.children_.push_back(from_json(list.at(i)));
        if (i + 1 < list.size() && out.children_.back().outputs_bytes()) {
          list.at(i)["type"].unsupported("ByteLevel must be the last pre-tokenizer of a Sequence");
        }
      }
    } else {
      at["type"].unsupported(concat('"', type, "\" is not supported"));
    }
    return out;
  }

  Kind kind() const { return kind_; }

  /// True when the pieces this emits are raw bytes for a byte-level model (a ByteLevel stage).
  bool outputs_bytes() const {
    if (kind_ == Kind::byte_level) return true;
    return kind_ == Kind::sequence && !children_.empty() && children_.back().outputs_bytes();
  }

  /// Cuts `in` into pieces, handing each non-empty one to `sink` in order.
  void split(const Piece& in, PieceSink sink) const {
    switch (kind_) {
      case Kind::split:
        return split_by_pattern(in, sink);
      case Kind::byte_level:
        return split_byte_level(in, sink);
      case Kind::metaspace:
        return split_metaspace(in, sink);
      case Kind::sequence:
        return split_from(0, in, sink);
    }
  }

 private:
  // A pattern matching `literal` exactly.
  static std::string quote_literal(std::string_view literal) {
    if (literal.empty()) return {};
    std::string out = "\\Q";
    for (std::size_t at = 0;;) {  // \E inside \Q...\E ends it: spell it \E\\E\Q
      const std::size_t found = literal.find("\\E", at);
      out.append(literal.substr(at, found - at));
      if (found == std::string_view::npos) break;
      out += "\\E\\\\E\\Q";
      at = found + 2;
    }
    return out + "\\E";
  }

  void split_from(std::size_t stage, const Piece& in, PieceSink sink) const {
    if (stage == children_.size()) return sink(in);
    children_[stage].split(in, [&](const Piece& piece) { split_from(stage + 1, piece, sink); });
  }

  static Piece sub(const Piece& in, std::size_t begin, std::size_t end) {
    return Piece{in.text.substr(begin, end - begin), in.origin ? in.origin + begin : nullptr,
                 in.section};
  }

  void split_by_pattern(const Piece& in, PieceSink sink) const {
    // Segments alternate between gaps and matches; is_delimiter says which are the pattern's
    // delimiters (the matches, or the gaps when inverted). A behaviour then joins or drops them.
    struct Pending {
      std::size_t begin = 0, end = 0;
      bool open = false;
    } pending;
    bool previous_delimiter = false;
    const auto flush = [&] {
      if (pending.open && pending.end > pending.begin) sink(sub(in, pending.begin, pending.end));
      pending.open = false;
    };
    const auto segment = [&](std::size_t begin, std::size_t end, bool is_match) {
      const bool delimiter = is_match != invert_;
      switch (behavior_) {
        case SplitBehavior::removed:
          if (!delimiter && end > begin) sink(sub(in, begin, end));
          break;
        case SplitBehavior::isolated:
          if (end > begin) sink(sub(in, begin, end));
          break;
        case SplitBehavior::merged_with_previous:
          if (delimiter && !previous_delimiter && pending.open) {
            pending.end = end;
          } else {
            flush();
            pending = {begin, end, true};
          }
          break;
        case SplitBehavior::merged_with_next:
          // A delimiter opens a piece that the next non-delimiter joins.
          if (!delimiter && previous_delimiter && pending.open) {
            pending.end = end;
          } else {
            flush();
            pending = {begin, end, true};
          }
          break;
        case SplitBehavior::contiguous:
          if (pending.open && delimiter == previous_delimiter) {
            pending.end = end;
          } else {
            flush();
            pending = {begin, end, true};
          }
          break;
      }
      previous_delimiter = delimiter;
    };
    std::size_t previous = 0;
    regex_->for_each_match(in.text, "PreTokenizer Split", [&](std::size_t begin, std::size_t end) {
      if (begin > previous) segment(previous, begin, false);
      if (end > begin) segment(begin, end, true);
      previous = end;
    });
    if (previous < in.text.size()) segment(previous, in.text.size(), false);
    flush();
  }

  void split_byte_level(const Piece& in, PieceSink sink) const {
    if (add_prefix_space_ && !in.text.empty() && in.text.front() != ' ') {
      std::string spaced = " ";
      spaced.append(in.text);
      std::vector<Span> origin;
      if (in.origin) {
        origin.reserve(spaced.size());
        origin.push_back({in.origin[0].begin, in.origin[0].begin});
        origin.insert(origin.end(), in.origin, in.origin + in.text.size());
      }
      const Piece piece{spaced, in.origin ? origin.data() : nullptr, in.section};
      return split_byte_level_as_is(piece, sink);
    }
    split_byte_level_as_is(in, sink);
  }
  void split_byte_level_as_is(const Piece& in, PieceSink sink) const {
    if (regex_) return split_by_pattern(in, sink);
    if (!in.text.empty()) sink(in);
  }

  void split_metaspace(const Piece& in, PieceSink sink) const {
    std::string text;
    std::vector<Span> origin;
    const bool prepend = prepend_ == PrependScheme::always ||
                         (prepend_ == PrependScheme::first && in.section.begin == 0);
    const bool starts_with_replacement =
        in.text.substr(0, 1) == " " || in.text.substr(0, replacement_.size()) == replacement_;
    if (prepend && !in.text.empty() && !starts_with_replacement) {
      text += replacement_;
      if (in.origin)
        origin.insert(origin.end(), replacement_.size(),
                      Span{in.origin[0].begin, in.origin[0].begin});
    }
    for (std::size_t i = 0; i < in.text.size(); ++i) {
      if (in.text[i] == ' ') {
        text += replacement_;
        if (in.origin) origin.insert(origin.end(), replacement_.size(), in.origin[i]);
      } else {
        text += in.text[i];
        if (in.origin) origin.push_back(in.origin[i]);
      }
    }
    const Piece whole{text, in.origin ? origin.data() : nullptr, in.section};
    if (!split_) {
      if (!text.empty()) sink(whole);
      return;
    }
    // Split before each replacement (Hugging Face: MergedWithNext on the replacement).
    std::size_t begin = 0;
    for (std::size_t at = text.find(replacement_, 1); at != std::string::npos;
         at = text.find(replacement_, at + replacement_.size())) {
      if (at > begin) sink(sub(whole, begin, at));
      begin = at;
    }
    if (begin < text.size()) sink(sub(whole, begin, text.size()));
  }

  Kind kind_ = Kind::sequence;
  std::shared_ptr<Regex> regex_;
  bool invert_ = false;
  SplitBehavior behavior_ = SplitBehavior::isolated;
  bool add_prefix_space_ = false;
  std::string replacement_;
  PrependScheme prepend_ = PrependScheme::always;
  bool split_ = true;
  std::vector<PreTokenizer> children_;
};

}  // namespace dissect::text
