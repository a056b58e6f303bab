// dissect/io/detail/json.hpp — private: do not include directly (dissect/io/safetensors.hpp and
// dissect/io/checkpoint.hpp do).
//
// JSON from a file, parsed strictly: nlohmann's parser keeps the last of two equal keys in an
// object without a word, which would let a checkpoint name one tensor twice and have us read
// whichever came last. Here a repeated key is a FormatError naming where it sits.
//
// The value is built by our own SAX handler rather than json::parse with a callback: nlohmann's
// callback parser scans the whole enclosing object after every nested object closes (to drop
// discarded values), which made a safetensors header of n tensors cost O(n²) — 40,000 tensors
// took half a minute. Here each key costs one lookup: O(n log n). parse_json_members_strictly
// goes further for a top-level object of a million members (a hostile safetensors header): each
// member is handed over as soon as it is complete, so the whole tree never exists at once.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error "dissect/io/detail/json.hpp is private to dissect: include dissect/io/checkpoint.hpp instead"
#endif

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <numeric>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"

namespace dissect::detail {

/// Builds a JSON value from nlohmann's SAX events, as its DOM parser does, and notes the first
/// key that repeats within one object (with the latest key of every object around it). Given a
/// `member` function and a top-level object, it passes each member to it when complete instead
/// of keeping it (the root stays an empty object), and keeps the Error `member` threw for the
/// smallest key.
class StrictJsonBuilder {
 public:
  using json = nlohmann::json;
  using Member = std::function<void(const std::string& key, json&& value)>;

  StrictJsonBuilder() = default;
  explicit StrictJsonBuilder(Member member) : member_(std::move(member)) {}

  bool null() { return place(nullptr); }
  bool boolean(bool value) { return place(value); }
  bool number_integer(json::number_integer_t value) { return place(value); }
  bool number_unsigned(json::number_unsigned_t value) { return place(value); }
  bool number_float(json::number_float_t value, const json::string_t&) { return place(value); }
  bool string(json::string_t& value) { return place(std::move(value)); }
  bool binary(json::binary_t& value) { return place(json::binary(std::move(value))); }

  bool start_object(std::size_t) {
    if (open_.empty()) streaming_ = static_cast<bool>(member_);
    open_.push_back(add(json::object()));
    latest_keys_.emplace_back();
    return true;
  }
  bool key(json::string_t& key) {
    if (streaming_ && open_.size() == 1) {  // a repeat among these is found by finish()
      slot_ = &member_value_;
      latest_keys_.back() = std::move(key);
      return true;
    }
    const auto [slot, inserted] = open_.back()->get_ref<json::object_t&>().try_emplace(key);
    slot_ = &slot->second;  // a repeated key's later value replaces the earlier, as nlohmann's
    if (!inserted && repeated_.empty()) {
      repeated_member_ = member_keys_.size();
      repeated_ = concat("key \"", key, "\" appears twice");
      for (std::size_t i = 0; i + 1 < latest_keys_.size(); ++i) {
        repeated_ += concat(i == 0 ? " (in \"" : "\" → \"", latest_keys_[i]);
      }
      if (latest_keys_.size() > 1) repeated_ += "\")";
    }
    latest_keys_.back() = std::move(key);
    return true;
  }
  bool end_object() {
    open_.pop_back();
    latest_keys_.pop_back();
    if (streaming_ && open_.size() == 1) hand_over();
    return true;
  }
  bool start_array(std::size_t) {
    open_.push_back(add(json::array()));
    return true;
  }
  bool end_array() {
    open_.pop_back();
    if (streaming_ && open_.size() == 1) hand_over();
    return true;
  }
  template <class Exception>
  bool parse_error(std::size_t, const std::string&, const Exception& error) {
    throw error;
  }

  /// After the last event: finds the first repeat among the top-level keys handed over, if it
  /// comes before any repeat found within a member. A sort, not a hash set, so that no choice of
  /// keys makes it slower than O(n log n).
  void finish() {
    if (!streaming_) return;
    std::vector<std::size_t> order(member_keys_.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const int compared = member_keys_[a].compare(member_keys_[b]);
      return compared != 0 ? compared < 0 : a < b;
    });
    std::size_t first = member_keys_.size();  // the first key that repeats an earlier one
    for (std::size_t i = 1; i < order.size(); ++i) {
      if (member_keys_[order[i]] == member_keys_[order[i - 1]]) first = std::min(first, order[i]);
    }
    // A repeat inside member k came after key k was read: after a top-level repeat at key j <= k.
    if (first < member_keys_.size() && (repeated_.empty() || first <= repeated_member_)) {
      repeated_ = concat("key \"", member_keys_[first], "\" appears twice");
    }
  }

  json& value() { return root_; }
  /// "key "x" appears twice (in "a")" for the first repeated key, or empty.
  const std::string& repeated() const { return repeated_; }
  /// What `member` threw for the smallest key, or null.
  std::exception_ptr member_error() const { return member_error_; }

 private:
  // Where a new value goes: the root, the end of the open array, or the slot of the latest key.
  // Pointers stay valid: an array grows only while no child of it is open, map nodes never move.
  json* add(json value) {
    if (open_.empty()) {
      root_ = std::move(value);
      return &root_;
    }
    json& container = *open_.back();
    if (container.is_array()) {
      auto& array = container.get_ref<json::array_t&>();
      array.push_back(std::move(value));
      return &array.back();
    }
    *slot_ = std::move(value);
    return slot_;
  }
  template <class Value>
  bool place(Value&& value) {
    add(json(std::forward<Value>(value)));
    if (streaming_ && open_.size() == 1) hand_over();  // a member that is a plain value
    return true;
  }

  // The top-level member just completed goes to member_; an Error it throws waits, so that the
  // smallest key's wins, as in a walk over the whole object in key order.
  void hand_over() {
    const std::string& key = latest_keys_.front();
    try {
      member_(key, std::move(member_value_));
    } catch (const Error&) {
      if (!member_error_ || key < member_error_key_) {
        member_error_ = std::current_exception();
        member_error_key_ = key;
      }
    }
    member_value_ = json();
    member_keys_.push_back(std::move(latest_keys_.front()));
  }

  json root_;
  std::vector<json*> open_;               ///< the arrays and objects being filled, innermost last
  std::vector<std::string> latest_keys_;  ///< per open object, its latest key
  json* slot_ = nullptr;                  ///< the value of the open object's latest key
  std::string repeated_;
  std::size_t repeated_member_ = 0;  ///< while streaming, the member repeated_ was found in
  // Streaming the top-level object's members:
  Member member_;
  bool streaming_ = false;
  std::vector<std::string> member_keys_;  ///< the top-level keys handed over, in order
  json member_value_;
  std::exception_ptr member_error_;
  std::string member_error_key_;
};

/// Runs the SAX `handler` over `text`. @throws FormatError "<where> is not valid JSON: ...".
template <class Handler>
void run_json_sax(std::string_view text, std::string_view where, Handler& handler) {
  try {
    nlohmann::json::sax_parse(text.begin(), text.end(), &handler);
  } catch (const nlohmann::json::exception& error) {
    // The parser quotes what it last read, which may be any bytes: keep the message ASCII.
    std::string message = error.what();
    for (char& c : message) c = static_cast<unsigned char>(c) < 0x80 ? c : '?';
    throw FormatError(concat(where, " is not valid JSON: ", message));
  }
}

/// Runs `builder` over `text`. @throws FormatError as parse_json_strictly.
inline void build_json_strictly(std::string_view text, std::string_view where,
                                StrictJsonBuilder& builder) {
  try {
    nlohmann::json::sax_parse(text.begin(), text.end(), &builder);
    builder.finish();
  } catch (const nlohmann::json::exception& error) {
    // The parser quotes what it last read, which may be any bytes: keep the message ASCII.
    std::string message = error.what();
    for (char& c : message) c = static_cast<unsigned char>(c) < 0x80 ? c : '?';
    throw FormatError(concat(where, " is not valid JSON: ", message));
  }
  if (!builder.repeated().empty()) throw FormatError(concat(where, ": ", builder.repeated()));
}

/// `text` as JSON. `where` ("SafetensorsFile: model.safetensors: header") starts every message.
/// @throws FormatError "<where> is not valid JSON: <the parser's message>", or
///         "<where>: key "dtype" appears twice (in "h.0.weight")".
inline nlohmann::json parse_json_strictly(std::string_view text, std::string_view where) {
  StrictJsonBuilder builder;
  build_json_strictly(text, where, builder);
  return std::move(builder.value());
}

/// `text` as parse_json_strictly reads it, but if it is an object each member goes to
/// `member(key, value)` as soon as it is parsed, and is not kept. The outcome is that of
/// parse_json_strictly followed by `member` on each member in key order: an invalid text or a
/// repeated key anywhere throws as there, whatever `member` threw; otherwise the Error `member`
/// threw for the smallest key is rethrown.
/// @returns an empty object if `text` is an object, else its value (for the caller to refuse).
inline nlohmann::json parse_json_members_strictly(std::string_view text, std::string_view where,
                                                  StrictJsonBuilder::Member member) {
  StrictJsonBuilder builder(std::move(member));
  build_json_strictly(text, where, builder);
  if (builder.member_error()) std::rethrow_exception(builder.member_error());
  return std::move(builder.value());
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
