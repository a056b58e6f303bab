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

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/decoding/sampling.hpp"

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
  /// Whether a text prompt gets what the tokenizer's post-processor adds (BOS): yes for a
  /// completion; no for a chat's rendered prompt, whose template wrote its own special tokens
  /// (transformers' apply_chat_template tokenizes with add_special_tokens=False).
  bool add_special_tokens = true;
};

/// The largest number of stop sequences, as OpenAI's API allows.
inline constexpr std::size_t max_stop_sequences = 4;

/// Reads a request body. @throws ConfigError naming the field and what is wrong: the body not
/// JSON or not an object, a field of the wrong type, a value out of range (the sampling fields
/// by check_sampling, with its message), a batch of prompts, n, best_of, echo, logprobs or
/// suffix asking for what dissect serve does not do.
CompletionRequest parse_completion_request(std::string_view body);

/// One /v1/chat/completions request: the sampling fields as a completion's, and the conversation
/// the model's chat template turns into the prompt (prompt_text stays empty until it has).
struct ChatRequest {
  CompletionRequest completion;
  nlohmann::ordered_json messages;         ///< an array of {role, content, …}, key order kept
  nlohmann::ordered_json tools = nullptr;  ///< an array of tool definitions, or null
};

/// Reads a chat request body: the fields a completion shares (model, max_tokens or
/// max_completion_tokens, the sampling fields, seed, stop, stream, n) checked as
/// parse_completion_request checks them, then messages (an array of objects, each with a string
/// role; content a string, null, or an array of text parts, joined) and tools (an array).
/// @throws ConfigError naming the field: anything above malformed, tool_choice other than "auto"
///         or "none", logprobs true, and every field outside the ones listed in the README, so
///         that what dissect serve does not do (response_format, logit_bias …) is never ignored.
ChatRequest parse_chat_request(std::string_view body);

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

template <class Json>
std::string json_text(const Json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

template <class Json>
double number_field(const Json& body, const char* name, double fallback) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number()) {
    throw ConfigError(concat(name, " must be a number (got ", json_text(*it), ")"));
  }
  return it->template get<double>();
}

/// A whole number in [lowest, highest]; 2.0 is not one (OpenAI's schema says integer).
template <class Json>
std::int64_t integer_field(const Json& body, const char* name, std::int64_t fallback,
                           std::int64_t lowest, std::int64_t highest) {
  const auto it = body.find(name);
  if (it == body.end() || it->is_null()) return fallback;
  if (!it->is_number_integer()) {
    throw ConfigError(concat(name, " must be an integer (got ", json_text(*it), ")"));
  }
  // An unsigned value above INT64_MAX is refused as out of range, not wrapped.
  if (it->is_number_unsigned() &&
      it->template get<std::uint64_t>() >
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    throw ConfigError(
        concat(name, " must be in [", lowest, ", ", highest, "] (got ", json_text(*it), ")"));
  }
  const auto value = it->template get<std::int64_t>();
  if (value < lowest || value > highest) {
    throw ConfigError(concat(name, " must be in [", lowest, ", ", highest, "] (got ", value, ")"));
  }
  return value;
}

}  // namespace detail

namespace detail {

/// The body as JSON, key order kept (a chat template's tojson prints it). @throws ConfigError
/// when it is not JSON or not an object.
inline nlohmann::ordered_json request_object(std::string_view body_text) {
  nlohmann::ordered_json body;
  try {
    body = nlohmann::ordered_json::parse(body_text);
  } catch (const nlohmann::json::exception& error) {
    throw ConfigError(concat("the request body is not valid JSON: ", error.what()));
  }
  if (!body.is_object()) {
    throw ConfigError(
        concat("the request body must be a JSON object (got ", detail::json_text(body), ")"));
  }
  return body;
}

/// The fields /v1/completions and /v1/chat/completions share: model, max_tokens, the sampling
/// fields, seed, stream, stop and n.
template <class Json>
void read_shared_fields(const Json& body, CompletionRequest& request) {
  if (const auto it = body.find("model"); it != body.end() && !it->is_null()) {
    if (!it->is_string()) {
      throw ConfigError(concat("model must be a string (got ", detail::json_text(*it), ")"));
    }
    request.model = it->template get<std::string>();
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
    if (!it->is_number_integer() || (it->is_number_integer() && !it->is_number_unsigned() &&
                                     it->template get<std::int64_t>() < 0)) {
      throw ConfigError(concat("seed must be an integer in [0, 18446744073709551615] (got ",
                               detail::json_text(*it), ")"));
    }
    request.seed = it->template get<std::uint64_t>();
  }
  if (const auto it = body.find("stream"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) {
      throw ConfigError(concat("stream must be true or false (got ", detail::json_text(*it), ")"));
    }
    request.stream = it->template get<bool>();
  }
  if (const auto it = body.find("stop"); it != body.end() && !it->is_null()) {
    const auto bad = [&] {
      return ConfigError(concat("stop must be a non-empty string or an array of at most ",
                                max_stop_sequences, " of them (got ", detail::json_text(*it), ")"));
    };
    if (it->is_string()) {
      request.stop.push_back(it->template get<std::string>());
    } else if (it->is_array() && it->size() <= max_stop_sequences) {
      for (const auto& item : *it) {
        if (!item.is_string()) throw bad();
        request.stop.push_back(item.template get<std::string>());
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
}

}  // namespace detail

inline CompletionRequest parse_completion_request(std::string_view body_text) {
  const nlohmann::ordered_json body = detail::request_object(body_text);
  CompletionRequest request;
  detail::read_shared_fields(body, request);
  const auto prompt = body.find("prompt");
  if (prompt == body.end() || prompt->is_null()) {
    throw ConfigError("prompt is required: a string, or an array of token ids");
  }
  if (prompt->is_string()) {
    request.prompt_text = prompt->template get<std::string>();
  } else if (prompt->is_array() && !prompt->empty() &&
             std::all_of(prompt->begin(), prompt->end(), [](const nlohmann::ordered_json& item) {
               return item.is_number_integer();
             })) {
    std::vector<index_t> ids;
    for (std::size_t i = 0; i < prompt->size(); ++i) {
      const nlohmann::ordered_json& item = (*prompt)[i];
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

inline ChatRequest parse_chat_request(std::string_view body_text) {
  const nlohmann::ordered_json body = detail::request_object(body_text);
  // Every field is one dissect reads or one whose only meaning is bookkeeping; anything else
  // (response_format, logit_bias, functions, grammar …) would change the answer, so it is refused
  // by name rather than ignored.
  static constexpr std::string_view known[] = {"model",
                                               "messages",
                                               "max_tokens",
                                               "max_completion_tokens",
                                               "temperature",
                                               "top_p",
                                               "min_p",
                                               "top_k",
                                               "repetition_penalty",
                                               "frequency_penalty",
                                               "presence_penalty",
                                               "seed",
                                               "stream",
                                               "stream_options",
                                               "stop",
                                               "n",
                                               "tools",
                                               "tool_choice",
                                               "logprobs",
                                               "user"};
  for (const auto& item : body.items()) {
    if (std::find(std::begin(known), std::end(known), item.key()) == std::end(known) &&
        !item.value().is_null())
      throw ConfigError(concat(item.key(), ": not supported by dissect serve; leave it out"));
  }
  ChatRequest chat;
  CompletionRequest& request = chat.completion;
  detail::read_shared_fields(body, request);
  // OpenAI's newer name for max_tokens; both at once would be ambiguous.
  if (const auto it = body.find("max_completion_tokens"); it != body.end() && !it->is_null()) {
    if (body.contains("max_tokens") && !body["max_tokens"].is_null())
      throw ConfigError("max_completion_tokens: give it or max_tokens, not both");
    request.max_tokens = detail::integer_field(body, "max_completion_tokens", request.max_tokens, 0,
                                               std::numeric_limits<std::int64_t>::max());
  }
  request.add_special_tokens = false;
  if (const auto it = body.find("logprobs"); it != body.end() && !it->is_null() && *it != false)
    throw ConfigError("logprobs: not supported; leave it out or false");
  if (const auto it = body.find("tool_choice");
      it != body.end() && !it->is_null() && *it != "auto" && *it != "none")
    throw ConfigError(concat("tool_choice: only \"auto\" and \"none\" are supported (got ",
                             detail::json_text(*it), ")"));
  if (const auto it = body.find("stream_options"); it != body.end() && !it->is_null()) {
    // include_usage: the last chunk carries usage whatever it says.
    bool valid = it->is_object();
    for (auto field = it->begin(); valid && field != it->end(); ++field)
      valid = field.key() == "include_usage" && field.value().is_boolean();
    if (!valid)
      throw ConfigError(
          concat("stream_options: only include_usage (true or false) is supported (got ",
                 detail::json_text(*it), ")"));
  }
  if (const auto it = body.find("user"); it != body.end() && !it->is_null() && !it->is_string())
    throw ConfigError(concat("user must be a string (got ", detail::json_text(*it), ")"));
  if (const auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array())
      throw ConfigError(concat("tools must be an array (got ", detail::json_text(*it), ")"));
    if (!it->empty()) chat.tools = *it;  // [] is no tools, as for transformers
  }
  const auto messages = body.find("messages");
  if (messages == body.end() || !messages->is_array() || messages->empty()) {
    throw ConfigError(concat("messages must be a non-empty array of {role, content} (got ",
                             messages == body.end() ? "nothing" : detail::json_text(*messages),
                             ")"));
  }
  chat.messages = *messages;
  for (std::size_t i = 0; i < chat.messages.size(); ++i) {
    nlohmann::ordered_json& message = chat.messages[i];
    if (!message.is_object())
      throw ConfigError(
          concat("messages[", i, "] must be an object (got ", detail::json_text(message), ")"));
    if (!message.contains("role") || !message["role"].is_string())
      throw ConfigError(concat(
          "messages[", i, "].role must be a string (got ",
          message.contains("role") ? detail::json_text(message["role"]) : std::string("nothing"),
          ")"));
    // Content parts ([{"type": "text", "text": …}]), as OpenAI's clients send them, become the
    // one string a chat template expects; other parts (images, audio) a model here cannot read.
    if (message.contains("content") && message["content"].is_array()) {
      std::string text;
      for (std::size_t j = 0; j < message["content"].size(); ++j) {
        const nlohmann::ordered_json& part = message["content"][j];
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string())
          throw ConfigError(concat("messages[", i, "].content[", j,
                                   "]: only {\"type\": \"text\", \"text\": …} parts are "
                                   "supported (got ",
                                   detail::json_text(part), ")"));
        text += part["text"].get<std::string>();
      }
      message["content"] = text;
    } else if (message.contains("content") && !message["content"].is_string() &&
               !message["content"].is_null()) {
      throw ConfigError(concat("messages[", i,
                               "].content must be a string, null or an array of "
                               "text parts (got ",
                               detail::json_text(message["content"]), ")"));
    }
  }
  return chat;
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
