// dissect/text/detail/replace_pattern.hpp — private: do not include directly
// (dissect/text/normalizer.hpp and decoder.hpp do).
//
// The "pattern" of a Replace normalizer or decoder: {"String": literal} or {"Regex": pattern},
// read once and matched the same way by both.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/replace_pattern.hpp is private to dissect: include dissect/text/tokenizer.hpp instead"
#endif

#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "dissect/text/detail/json_cursor.hpp"
#include "dissect/text/regex.hpp"

namespace dissect::text::detail {

class ReplacePattern {
 public:
  /// Reads `at`'s "pattern" member. @throws FormatError naming the path for an empty literal or
  /// a pattern that is neither; ConfigError for a regex PCRE2 refuses.
  static ReplacePattern from_json(const JsonCursor& at) {
    const auto pattern = at["pattern"];
    pattern.expect_object();
    ReplacePattern out;
    if (const auto literal = pattern.find("String")) {
      out.literal_ = literal->string();
      if (out.literal_->empty()) literal->fail("must not be empty");
    } else if (const auto regex = pattern.find("Regex")) {
      out.regex_ =
          std::make_shared<Regex>(regex->string(), concat(at.source(), ": ", regex->path()));
    } else {
      pattern.fail("must hold \"String\" or \"Regex\"");
    }
    return out;
  }

  /// Calls `on_match(begin, end)` for each match in `text`, left to right, not overlapping.
  template <class OnMatch>
  void for_each_match(std::string_view text, std::string_view op, OnMatch&& on_match) const {
    if (regex_) return regex_->for_each_match(text, op, on_match);
    for (std::size_t at = text.find(*literal_); at != std::string_view::npos;
         at = text.find(*literal_, at + literal_->size())) {
      on_match(at, at + literal_->size());
    }
  }

 private:
  std::optional<std::string> literal_;
  std::shared_ptr<Regex> regex_;
};

}  // namespace dissect::text::detail
