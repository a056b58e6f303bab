// dissect/text/detail/json_cursor.hpp — private: do not include directly
// (dissect/text/tokenizer.hpp does).
//
// A place in a parsed tokenizer.json: the value and its JSON path ("pre_tokenizer.
// pretokenizers[1].type"), so that every refusal names the file and the exact field, as the
// reliability policy asks. Malformed values are FormatErrors; well-formed ones dissect does not
// implement are ConfigErrors ("... \"Digits\" is not supported"), never a silently different
// tokenization.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/json_cursor.hpp is private to dissect: include dissect/text/tokenizer.hpp instead"
#endif

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "dissect/core/error.hpp"
#include "dissect/io/json.hpp"

namespace dissect::text::detail {

class JsonCursor {
 public:
  using json = nlohmann::json;

  JsonCursor(const json& value, std::string path, std::string_view source)
      : value_(&value), path_(std::move(path)), source_(source) {}

  const json& value() const { return *value_; }
  const std::string& path() const { return path_; }
  std::string_view source() const { return source_; }
  bool is_null() const { return value_->is_null(); }

  /// The member `key`, which must be there (null counts as there).
  JsonCursor operator[](std::string_view key) const {
    expect_object();
    const auto found = value_->find(key);
    if (found == value_->end()) {
      JsonCursor(*value_, child_path(key), source_).fail("is missing");
    }
    return JsonCursor(*found, child_path(key), source_);
  }
  /// The member `key`, or nothing when it is absent or null.
  std::optional<JsonCursor> find(std::string_view key) const {
    expect_object();
    const auto found = value_->find(key);
    if (found == value_->end() || found->is_null()) return std::nullopt;
    return JsonCursor(*found, child_path(key), source_);
  }
  bool has(std::string_view key) const { return find(key).has_value(); }

  /// Element `i` of an array.
  JsonCursor at(std::size_t i) const {
    expect_array();
    return JsonCursor((*value_)[i], concat(path_, '[', i, ']'), source_);
  }
  std::size_t size() const {
    expect_array();
    return value_->size();
  }

  std::string string() const {
    if (!value_->is_string())
      fail(concat("must be a string, not ", dissect::io::describe_json(*value_)));
    return value_->get<std::string>();
  }
  bool boolean() const {
    if (!value_->is_boolean())
      fail(concat("must be true or false, not ", dissect::io::describe_json(*value_)));
    return value_->get<bool>();
  }
  /// An integer in [low, high].
  std::int64_t integer(std::int64_t low, std::int64_t high) const {
    if (!value_->is_number_integer() && !value_->is_number_unsigned()) {
      fail(concat("must be an integer, not ", dissect::io::describe_json(*value_)));
    }
    if (value_->is_number_unsigned() &&
        value_->get<std::uint64_t>() > static_cast<std::uint64_t>(high)) {
      fail(concat("is ", value_->dump(), ", above ", high));
    }
    const auto v = value_->get<std::int64_t>();
    if (v < low || v > high) fail(concat("is ", v, ", outside [", low, ", ", high, "]"));
    return v;
  }
  bool boolean_or(std::string_view key, bool otherwise) const {
    const auto member = find(key);
    return member ? member->boolean() : otherwise;
  }
  std::string string_or(std::string_view key, std::string otherwise) const {
    const auto member = find(key);
    return member ? member->string() : std::move(otherwise);
  }

  void expect_object() const {
    if (!value_->is_object())
      fail(concat("must be an object, not ", dissect::io::describe_json(*value_)));
  }
  void expect_array() const {
    if (!value_->is_array())
      fail(concat("must be an array, not ", dissect::io::describe_json(*value_)));
  }

  /// FormatError "<source>: <path>: <what>".
  [[noreturn]] void fail(std::string_view what) const {
    throw FormatError(concat(source_, ": ", path_.empty() ? "(top level)" : path_, ": ", what));
  }
  /// ConfigError "<source>: <path>: <what>", for what is well-formed but not implemented.
  [[noreturn]] void unsupported(std::string_view what) const {
    throw ConfigError(concat(source_, ": ", path_.empty() ? "(top level)" : path_, ": ", what));
  }

 private:
  std::string child_path(std::string_view key) const {
    return path_.empty() ? std::string(key) : concat(path_, '.', key);
  }

  const json* value_;
  std::string path_;
  std::string_view source_;
};

}  // namespace dissect::text::detail
