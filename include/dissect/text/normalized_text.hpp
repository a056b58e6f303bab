// dissect/text/normalized_text.hpp — text on its way through a tokenizer, with where each of
// its bytes came from in the caller's text, so that every token can report its offsets.
//
// A normalizer or pre-tokenizer that rewrites text (NFC, "▁" for " ", a prepended space) keeps
// `origin` in step: origin[i] is the span of the original text that byte i stands for. An
// inserted byte has an empty span where it was inserted. Tracking is off unless offsets are
// asked for, and then `origin` is empty and costs nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace dissect::text {

/// A byte range [begin, end) of the caller's text.
struct Span {
  std::uint32_t begin = 0;
  std::uint32_t end = 0;
  friend bool operator==(const Span&, const Span&) = default;
};

/// Text and, when tracked, the origin of each of its bytes.
struct NormalizedText {
  std::string text;
  std::vector<Span> origin;  ///< empty, or one span per byte of text
  bool tracked = false;

  /// `text` as the caller gave it, starting at byte `base` of the caller's text.
  static NormalizedText original(std::string_view text, bool track, std::uint32_t base = 0) {
    NormalizedText out{std::string(text), {}, track};
    if (track) {
      out.origin.resize(text.size());
      for (std::size_t i = 0; i < text.size(); ++i) {
        const auto at = static_cast<std::uint32_t>(base + i);
        out.origin[i] = {at, at + 1};
      }
    }
    return out;
  }

  /// The original span of bytes [begin, end) of `text`: from the first one's start to the last
  /// one's end (an empty range: the empty span where it sits).
  Span span_of(std::size_t begin, std::size_t end) const {
    if (!tracked) return {};
    if (begin >= end) {
      const std::uint32_t at =
          begin < origin.size() ? origin[begin].begin : (origin.empty() ? 0 : origin.back().end);
      return {at, at};
    }
    return {origin[begin].begin, origin[end - 1].end};
  }
};

/// Builds a NormalizedText piece by piece: copied bytes keep their origin, new bytes take the
/// origin given.
class NormalizedBuilder {
 public:
  explicit NormalizedBuilder(bool track) : track_(track) { out_.tracked = track; }

  /// Bytes [begin, end) of `from`, with their origins.
  void copy(const NormalizedText& from, std::size_t begin, std::size_t end) {
    out_.text.append(from.text, begin, end - begin);
    if (track_)
      out_.origin.insert(out_.origin.end(),
                         from.origin.begin() + static_cast<std::ptrdiff_t>(begin),
                         from.origin.begin() + static_cast<std::ptrdiff_t>(end));
  }
  /// New bytes standing for the original span `origin`.
  void add(std::string_view bytes, Span origin) {
    out_.text.append(bytes);
    if (track_) out_.origin.insert(out_.origin.end(), bytes.size(), origin);
  }
  void reserve(std::size_t bytes) {
    out_.text.reserve(bytes);
    if (track_) out_.origin.reserve(bytes);
  }
  /// The bytes built so far.
  std::size_t size() const { return out_.text.size(); }
  NormalizedText take() { return std::move(out_); }

 private:
  bool track_;
  NormalizedText out_;
};

}  // namespace dissect::text
