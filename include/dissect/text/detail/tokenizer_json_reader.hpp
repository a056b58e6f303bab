// dissect/text/detail/tokenizer_json_reader.hpp — private: do not include directly
// (dissect/text/tokenizer.hpp does).
//
// Reads a tokenizer.json in one SAX pass that streams model.vocab and model.merges into flat
// vectors and builds the small rest (normalizer, pre-tokenizer, ...) as a JSON value by the
// strict rules of io/json.hpp. A 9 MB vocabulary's 10⁵ entries as JSON values cost twice the
// parse itself (a std::map node and a string per entry); streamed, the whole load of LLaMA 3's
// tokenizer.json takes a quarter of a second.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/tokenizer_json_reader.hpp is private to dissect: include dissect/text/tokenizer.hpp instead"
#endif

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/json.hpp"

namespace dissect::text::detail {

/// What the reader streamed out of model.vocab and model.merges.
struct StreamedModel {
  struct Token {
    std::string text;
    std::uint64_t id;
  };
  struct Merge {
    std::string left, right;
    bool joined = false;  ///< the old spelling "left right" in `left` (split later, with checks)
  };
  bool has_vocab = false, has_merges = false;
  std::vector<Token> vocab;
  std::vector<Merge> merges;
};

class TokenizerJsonReader {
 public:
  using json = nlohmann::json;

  explicit TokenizerJsonReader(std::string_view source) : source_(source) {}

  /// Parses `text`: the JSON without model.vocab and model.merges, which go to streamed().
  json read(std::string_view text) {
    dissect::io::run_json_sax(text, source_, *this);
    rest_.finish();
    if (!rest_.repeated().empty()) throw FormatError(concat(source_, ": ", rest_.repeated()));
    return std::move(rest_.value());
  }
  StreamedModel& streamed() { return model_; }

  // ---- nlohmann's SAX interface -------------------------------------------------------------
  bool null() {
    return scalar([&] { return rest_.null(); }, "null");
  }
  bool boolean(bool v) {
    return scalar([&] { return rest_.boolean(v); }, "a boolean");
  }
  bool number_integer(json::number_integer_t v) {
    if (capture_ == Capture::vocab && depth_ == capture_depth_) {
      if (v < 0) fail(concat(vocab_path(), ": id ", v, " is negative"));
      model_.vocab.push_back({std::move(key_), static_cast<std::uint64_t>(v)});
      return true;
    }
    return scalar([&] { return rest_.number_integer(v); }, "a number");
  }
  bool number_unsigned(json::number_unsigned_t v) {
    if (capture_ == Capture::vocab && depth_ == capture_depth_) {
      model_.vocab.push_back({std::move(key_), v});
      return true;
    }
    return scalar([&] { return rest_.number_unsigned(v); }, "a number");
  }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    return scalar([&] { return rest_.number_float(v, s); }, concat("the number ", s));
  }
  bool string(json::string_t& v) {
    if (capture_ == Capture::merges) {
      if (depth_ == capture_depth_) {
        model_.merges.push_back({std::move(v), {}, true});
        return true;
      }
      if (pair_.size() >= 2)
        fail(concat(merge_path(), ": must be \"a b\" or [\"a\", \"b\"], not an array of 3"));
      pair_.push_back(std::move(v));
      return true;
    }
    return scalar([&] { return rest_.string(v); }, "a string");
  }
  bool binary(json::binary_t& v) {
    return scalar([&] { return rest_.binary(v); }, "binary");
  }

  bool start_object(std::size_t n) {
    if (pending_ == Capture::vocab) {
      begin_capture();
      model_.vocab.reserve(n == static_cast<std::size_t>(-1) ? 0 : n);
      return true;
    }
    if (pending_ == Capture::merges)
      fail(concat(source_, ": model.merges: must be an array, not an object"));
    if (capture_ != Capture::none)
      fail(concat(capture_ == Capture::vocab ? vocab_path() : merge_path(),
                  ": must not be an object"));
    ++depth_;
    return rest_.start_object(n);
  }
  bool key(json::string_t& k) {
    if (capture_ == Capture::vocab && depth_ == capture_depth_) {
      key_ = std::move(k);
      return true;
    }
    if (depth_ == 1) top_key_ = k;
    if (depth_ == 2 && top_key_ == "model" && (k == "vocab" || k == "merges")) {
      pending_ = k == "vocab" ? Capture::vocab : Capture::merges;
      (k == "vocab" ? model_.has_vocab : model_.has_merges) = true;
      return true;  // not in the rest: streamed
    }
    return rest_.key(k);
  }
  bool end_object() {
    if (capture_ == Capture::vocab && depth_ == capture_depth_) {
      end_capture();
      return true;
    }
    --depth_;
    return rest_.end_object();
  }
  bool start_array(std::size_t n) {
    if (pending_ == Capture::merges) {
      begin_capture();
      model_.merges.reserve(n == static_cast<std::size_t>(-1) ? 0 : n);
      return true;
    }
    if (pending_ == Capture::vocab)
      fail(concat(source_, ": model.vocab: must be an object, not an array"));
    if (capture_ == Capture::merges && depth_ == capture_depth_) {
      ++depth_;
      pair_.clear();
      return true;
    }
    if (capture_ != Capture::none)
      fail(concat(capture_ == Capture::vocab ? vocab_path() : merge_path(),
                  ": must not be an array"));
    ++depth_;
    return rest_.start_array(n);
  }
  bool end_array() {
    if (capture_ == Capture::merges) {
      if (depth_ == capture_depth_) {
        end_capture();
        return true;
      }
      if (pair_.size() != 2)
        fail(concat(merge_path(), ": must be \"a b\" or [\"a\", \"b\"], not an array of ",
                    pair_.size()));
      model_.merges.push_back({std::move(pair_[0]), std::move(pair_[1]), false});
      --depth_;
      return true;
    }
    --depth_;
    return rest_.end_array();
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& error) {
    throw error;
  }

 private:
  enum class Capture { none, vocab, merges };

  template <class Forward>
  bool scalar(Forward&& forward, std::string_view what) {
    if (pending_ != Capture::none) {
      fail(concat(
          source_, ": model.",
          pending_ == Capture::vocab ? "vocab: must be an object" : "merges: must be an array",
          ", not ", what));
    }
    if (capture_ == Capture::vocab)
      fail(concat(vocab_path(), ": must be an integer id, not ", what));
    if (capture_ == Capture::merges)
      fail(concat(merge_path(), ": must be \"a b\" or [\"a\", \"b\"], not ", what));
    return forward();
  }
  void begin_capture() {
    capture_ = pending_;
    pending_ = Capture::none;
    capture_depth_ = ++depth_;
  }
  void end_capture() {
    capture_ = Capture::none;
    --depth_;
  }
  std::string vocab_path() const { return concat(source_, ": model.vocab[\"", key_, "\"]"); }
  std::string merge_path() const {
    return concat(source_, ": model.merges[", model_.merges.size(), ']');
  }
  [[noreturn]] static void fail(const std::string& message) { throw FormatError(message); }

  std::string_view source_;
  dissect::io::StrictJsonBuilder rest_;
  StreamedModel model_;
  std::size_t depth_ = 0, capture_depth_ = 0;
  std::string top_key_, key_;
  Capture pending_ = Capture::none, capture_ = Capture::none;
  std::vector<std::string> pair_;
};

}  // namespace dissect::text::detail
