// dissect/io/detail/json.hpp — private: do not include directly (dissect/io/safetensors.hpp and
// dissect/io/checkpoint.hpp do).
//
// JSON from a file, parsed strictly: nlohmann's parser keeps the last of two equal keys in an
// object without a word, which would let a checkpoint name one tensor twice and have us read
// whichever came last. Here a repeated key is a FormatError naming where it sits.
#pragma once

#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/error.hpp"

namespace dissect::detail {

/// `text` as JSON. `where` ("SafetensorsFile: model.safetensors: header") starts every message.
/// @throws FormatError "<where> is not valid JSON: <the parser's message>", or
///         "<where>: key "dtype" appears twice (in "h.0.weight")".
inline nlohmann::json parse_json_strictly(std::string_view text, std::string_view where) {
  // One entry per object being parsed: the keys seen so far and the latest of them.
  std::vector<std::pair<std::set<std::string, std::less<>>, std::string>> objects;
  std::string repeated;  // the first repeated key, with the keys of the objects around it
  const nlohmann::json::parser_callback_t check_keys = [&](int, nlohmann::json::parse_event_t event,
                                                           nlohmann::json& parsed) {
    using Event = nlohmann::json::parse_event_t;
    if (event == Event::object_start) {
      objects.emplace_back();
    } else if (event == Event::object_end && !objects.empty()) {
      objects.pop_back();
    } else if (event == Event::key && !objects.empty()) {
      auto& [keys, latest] = objects.back();
      latest = parsed.get<std::string>();
      if (!keys.insert(latest).second && repeated.empty()) {
        repeated = concat("key \"", latest, "\" appears twice");
        for (std::size_t i = 0; i + 1 < objects.size(); ++i) {
          repeated += concat(i == 0 ? " (in \"" : "\" → \"", objects[i].second);
        }
        if (objects.size() > 1) repeated += "\")";
      }
    }
    return true;
  };
  nlohmann::json value;
  try {
    value = nlohmann::json::parse(text.begin(), text.end(), check_keys);
  } catch (const nlohmann::json::exception& error) {
    // The parser quotes what it last read, which may be any bytes: keep the message ASCII.
    std::string message = error.what();
    for (char& c : message) c = static_cast<unsigned char>(c) < 0x80 ? c : '?';
    throw FormatError(concat(where, " is not valid JSON: ", message));
  }
  if (!repeated.empty()) throw FormatError(concat(where, ": ", repeated));
  return value;
}

/// What a JSON value is, for messages: "a string", "an array", "the number 2.5", "null".
inline std::string describe_json(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::number_integer:
    case nlohmann::json::value_t::number_unsigned:
    case nlohmann::json::value_t::number_float:
      return "the number " + value.dump();
    case nlohmann::json::value_t::object:
    case nlohmann::json::value_t::array:
      return concat("an ", value.type_name());
    case nlohmann::json::value_t::null:
      return "null";
    default:
      return concat("a ", value.type_name());
  }
}

}  // namespace dissect::detail
