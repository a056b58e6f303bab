// tools/dissect/serve_request.hpp — what `dissect serve` reads from a request and how it cuts the
// text it returns: OpenAI's /v1/completions body checked field by field (its types, then the
// library's own sampling checks), and the stop sequences found in streamed text. No HTTP here
// (serve_command.hpp), so each piece can be read, and reasoned about, alone.
//
// A bad request is a ConfigError whose message becomes the 400 response's error.message
// (reliability.md row 113).
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/error.hpp"
#include "dissect/sampling.hpp"
#include "dissect/shape.hpp"

namespace dissect::tools {

// ---- declarations -------------------------------------------------------------------------------

/// One /v1/completions request, every field checked. The prompt is text or token ids, never both.
struct CompletionRequest {
  std::string model;                       ///< echoed back; the server's own name when absent
  std::optional<std::string> prompt_text;  ///< "prompt": "…"
  std::optional<std::vector<index_t>> prompt_ids;  ///< "prompt": [464, 2068, …]
  index_t max_tokens = 16;                         ///< OpenAI's default
  SamplingOptions sampling{.temperature = 1.0};    ///< OpenAI's default temperature is 1
  std::uint64_t seed = 0;         ///< as `dissect generate`: reproducible by default
  std::vector<std::string> stop;  ///< at most 4, none empty
  bool stream = false;
};

/// The largest number of stop sequences, as OpenAI's API allows.
inline constexpr std::size_t max_stop_sequences = 4;

/// Reads a request body. @throws ConfigError naming the field and what is wrong: the body not
/// JSON or not an object, a field of the wrong type, a value out of range (the sampling fields
/// by check_sampling, with its message), a batch of prompts, n, best_of, echo, logprobs or
/// suffix asking for what dissect serve does not do.
CompletionRequest parse_completion_request(std::string_view body);

/// Finds stop sequences in text that arrives piece by piece, and says how much of it is safe to
/// send: text that could still turn out to be the start of a stop sequence is held back, so that
/// a stream never sends what the finished completion would cut.
class StopScanner {
 public:
  explicit StopScanner(std::vector<std::string> stops) : stops_(std::move(stops)) {}

  /// Adds `piece`; returns the text that is now safe to send (possibly empty). After a stop
  /// sequence is found, stopped() is true and nothing more is taken.
  std::string push(std::string_view piece);
  /// The text held back, at the end of a completion that met no stop sequence.
  std::string finish();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string text_;      ///< everything pushed
  std::size_t sent_ = 0;  ///< text_[0, sent_) has been returned
  bool stopped_ = false;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline std::string json_text(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

inline double number_field(const nlohmann::json& body, const char* name, double fallback) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    throw ConfigError(concat(name, " must be a number (got ", json_text(*it), ")"));
  }
  return it->get<double>();
}

/// A whole number in [lowest, highest]; 2.0 is not one (OpenAI's schema says integer).
inline std::int64_t integer_field(const nlohmann::json& body, const char* name,
                                  std::int64_t fallback, std::int64_t lowest,
                                  std::int64_t highest) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) {
    throw ConfigError(concat(name, " must be an integer (got ", json_text(*it), ")"));
  }
  // An unsigned value above INT64_MAX is refused as out of range, not wrapped.
  if (it->is_number_unsigned() &&
      it->get<std::uint64_t>() >
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw ConfigError(
        concat(name, " must be in [", lowest, ", ", highest, "] (got ", json_text(*it), ")"));
  }
  const auto value = it->get<std::int64_t>();
  if (value < lowest || value > highest) {
    throw ConfigError(concat(name, " must be in [", lowest, ", ", highest, "] (got ", value, ")"));
  }
  return value;
}

}  // namespace detail

inline CompletionRequest parse_completion_request(std::string_view body_text) {
  nlohmann::json body;
  try {
    body = nlohmann::json::parse(body_text);
  } catch (const nlohmann::json::exception& error) {
    throw ConfigError(concat("the request body is not valid JSON: ", error.what()));
  }
  if (!body.is_object()) {
    throw ConfigError(
        concat("the request body must be a JSON object (got ", detail::json_text(body), ")"));
  }
  CompletionRequest request;
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      throw ConfigError(concat("model must be a string (got ", detail::json_text(*it), ")"));
    }
    request.model = it->get<std::string>();
  }
  const auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null()) {
    throw ConfigError("prompt is required: a string, or an array of token ids");
  }
  if (prompt->is_string()) {
    request.prompt_text = prompt->get<std::string>();
  } else if (prompt->is_array() && !prompt->empty() &&
             std::all_of(prompt->begin(), prompt->end(),
                         [](const nlohmann::json& item) { return item.is_number_integer(); })) {
    std::vector<index_t> ids;
    for (std::size_t i = 0; i < prompt->size(); ++i) {
      const nlohmann::json& item = (*prompt)[i];
      // The vocabulary is the model's to check; here only the sign and int64.
      if (item.is_number_unsigned() &&
          item.get<std::uint64_t>() >
              static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
        throw ConfigError(
            concat("prompt: token ", i, " is ", detail::json_text(item), ", beyond int64"));
      }
      const auto id = item.get<std::int64_t>();
      if (id < 0) throw ConfigError(concat("prompt: token ", i, " is ", id, ", not a token id"));
      ids.push_back(id);
    }
    request.prompt_ids = std::move(ids);
  } else if (prompt->is_array() && !prompt->empty() &&
             ((*prompt)[0].is_string() || (*prompt)[0].is_array())) {
    throw ConfigError("prompt: a batch of prompts is not supported; send one request per prompt");
  } else {
    throw ConfigError(concat("prompt must be a string or an array of token ids (got ",
                             detail::json_text(*prompt), ")"));
  }
  constexpr std::int64_t most = std::numeric_limits<std::int64_t>::max();
  request.max_tokens = detail::integer_field(body, "max_tokens", request.max_tokens, 0, most);
  SamplingOptions& s = request.sampling;
  s.temperature = detail::number_field(body, "temperature", s.temperature);
  s.top_p = detail::number_field(body, "top_p", s.top_p);
  s.min_p = detail::number_field(body, "min_p", s.min_p);
  s.top_k = detail::integer_field(body, "top_k", s.top_k, 0, most);
  s.repetition_penalty = detail::number_field(body, "repetition_penalty", s.repetition_penalty);
  s.frequency_penalty = detail::number_field(body, "frequency_penalty", s.frequency_penalty);
  s.presence_penalty = detail::number_field(body, "presence_penalty", s.presence_penalty);
  // The library's checks and messages ("completions: top_p must be in (0, 1] (got 0)").
  check_sampling("completions", s);
  if (const auto it = body.find("seed"); it != body.end() && !it->is_null()) {
    if (!it->is_number_integer() ||
        (it->is_number_integer() && !it->is_number_unsigned() && it->get<std::int64_t>() < 0)) {
      throw ConfigError(concat("seed must be an integer in [0, 18446744073709551615] (got ",
                               detail::json_text(*it), ")"));
    }
    request.seed = it->get<std::uint64_t>();
  }
  if (const auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      throw ConfigError(concat("stream must be true or false (got ", detail::json_text(*it), ")"));
    }
    request.stream = it->get<bool>();
  }
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    const auto bad = [&] {
      return ConfigError(concat("stop must be a non-empty string or an array of at most ",
                                max_stop_sequences, " of them (got ", detail::json_text(*it), ")"));
    };
    if (it->is_string()) {
      request.stop.push_back(it->get<std::string>());
    } else if (it->is_array() && it->size() <= max_stop_sequences) {
      for (const nlohmann::json& item : *it) {
        if (!item.is_string()) throw bad();
        request.stop.push_back(item.get<std::string>());
      }
    } else {
      throw bad();
    }
    if (std::any_of(request.stop.begin(), request.stop.end(),
                    [](const std::string& stop) { return stop.empty(); })) {
      throw bad();
    }
  }
  // What OpenAI's API offers and dissect serve does not: said, never silently ignored.
  if (detail::integer_field(body, "n", 1, 1, most) != 1) {
    throw ConfigError("n: only 1 completion per request is supported");
  }
  if (detail::integer_field(body, "best_of", 1, 1, most) != 1) {
    throw ConfigError("best_of: only 1 is supported");
  }
  if (const auto it = body.find("echo"); it != body.end() && !it->is_null() && *it != false) {
    throw ConfigError(concat("echo: only false is supported (got ", detail::json_text(*it), ")"));
  }
  if (const auto it = body.find("logprobs"); it != body.end() && !it->is_null()) {
    throw ConfigError("logprobs: not supported; leave it out or null");
  }
  if (const auto it = body.find("suffix"); it != body.end() && !it->is_null()) {
    throw ConfigError("suffix: not supported (no insertion); leave it out or null");
  }
  return request;
}

inline std::string StopScanner::push(std::string_view piece) {
  if (stopped_) return {};
  // A stop sequence may straddle pieces, but none starts before sent_: text that could have
  // begun one was held back, so the search starts there.
  text_.append(piece);
  std::size_t first = std::string::npos;
  for (const std::string& stop : stops_) first = std::min(first, text_.find(stop, sent_));
  if (first != std::string::npos) {
    stopped_ = true;
    std::string out = text_.substr(sent_, first - sent_);
    sent_ = first;
    return out;
  }
  // Hold back the longest tail that is the start of some stop sequence.
  std::size_t hold = 0;
  for (const std::string& stop : stops_) {
    for (std::size_t n = std::min(stop.size() - 1, text_.size() - sent_); n > hold; --n) {
      if (text_.compare(text_.size() - n, n, stop, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  const std::size_t safe = text_.size() - hold;
  std::string out = text_.substr(sent_, safe - sent_);
  sent_ = safe;
  return out;
}

inline std::string StopScanner::finish() {
  if (stopped_) return {};
  std::string out = text_.substr(sent_);
  sent_ = text_.size();
  return out;
}

}  // namespace dissect::tools
