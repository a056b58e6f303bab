// dissect/text/detail/jinja_value.hpp — private: do not include directly
// (dissect/text/chat_template.hpp does).
//
// The values a chat template computes with, and what Python does with them: truthiness, str()
// and repr(), ==, and json.dumps as transformers' `tojson` calls it. Jinja2 runs on Python
// objects, so every rule here is Python's (1.0 prints "1.0", True == 1, dicts keep insertion
// order); a rule that differed would give a different prompt, which the renderer must never do.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/jinja_value.hpp is private to dissect: include dissect/text/chat_template.hpp instead"
#endif

#include <nlohmann/json.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/utf8.hpp"

namespace dissect::text::detail::jinja {

struct Value;
using Array = std::vector<Value>;
/// A Python dict: insertion order kept (json.dumps and iteration follow it).
struct Object {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const;
  Value* find(std::string_view key);
  void set(std::string key, Value value);
};
/// Positional and keyword arguments of a call.
struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keywords;
};
/// A macro, a bound method (`text.strip`), a global (`range`) or `caller`.
struct Callable {
  std::string name;
  std::function<Value(CallArgs&)> call;
};

/// How deep a value may nest for printing, comparing and tojson (Python's recursion limit
/// stops it too): deeper is refused rather than recursing the stack away.
inline constexpr int max_value_depth = 512;

/// What Python would raise while rendering (a TypeError, an UndefinedError), or (`unsupported`)
/// what the renderer does not implement: the evaluator adds the line and throws a ConfigError.
struct RuntimeFailure {
  std::string message;
  bool unsupported = false;
};

/// `generator`: what map, select, selectattr, items and reverse give in Jinja2 (an iterator: always
/// true, no length, used up by one pass); its items are kept in `array`.
enum class Kind {
  undefined,
  none,
  boolean,
  integer,
  floating,
  string,
  array,
  tuple,
  object,
  namespace_,
  callable,
  generator
};

/// One value. Lists, dicts and namespaces are shared, as Python objects are (a namespace set in
/// a loop is seen after it).
struct Value {
  Kind kind = Kind::undefined;
  bool boolean = false;
  std::int64_t integer = 0;
  double floating = 0;
  std::string text;  ///< a string; for an undefined value, why (for the error it may raise)
  std::shared_ptr<Array> array;
  std::shared_ptr<Object> object;
  std::shared_ptr<Callable> callable;
  /// How deep lists and dicts nest inside (0 for a scalar): bounded by max_value_depth where
  /// values are built, so that printing, comparing and destroying them cannot overflow the stack.
  int nest = 0;

  static Value undefined(std::string why = {}) {
    Value v;
    v.text = std::move(why);
    return v;
  }
  static Value none() { return make(Kind::none); }
  static Value from_bool(bool b) {
    Value v = make(Kind::boolean);
    v.boolean = b;
    return v;
  }
  static Value from_int(std::int64_t i) {
    Value v = make(Kind::integer);
    v.integer = i;
    return v;
  }
  static Value from_float(double d) {
    Value v = make(Kind::floating);
    v.floating = d;
    return v;
  }
  static Value from_string(std::string s) {
    Value v = make(Kind::string);
    v.text = std::move(s);
    return v;
  }
  static Value list(Array items = {}, Kind kind = Kind::array) {
    Value v = make(kind);
    for (const Value& item : items) v.nest = std::max(v.nest, item.nest + 1);
    v.array = std::make_shared<Array>(std::move(items));
    return v;
  }
  static Value dict(Kind kind = Kind::object) {
    Value v = make(kind);
    v.object = std::make_shared<Object>();
    return v;
  }
  static Value function(std::string name, std::function<Value(CallArgs&)> call) {
    Value v = make(Kind::callable);
    v.callable = std::make_shared<Callable>(Callable{std::move(name), std::move(call)});
    return v;
  }

  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_none() const { return kind == Kind::none; }
  bool is_string() const { return kind == Kind::string; }
  bool is_list() const { return kind == Kind::array || kind == Kind::tuple; }
  bool is_dict() const { return kind == Kind::object; }
  /// int or bool (Python's bool is an int).
  bool is_integral() const { return kind == Kind::integer || kind == Kind::boolean; }
  bool is_number() const { return is_integral() || kind == Kind::floating; }
  std::int64_t as_int() const { return kind == Kind::boolean ? (boolean ? 1 : 0) : integer; }
  double as_double() const {
    return kind == Kind::floating ? floating : static_cast<double>(as_int());
  }

 private:
  static Value make(Kind k) {
    Value v;
    v.kind = k;
    return v;
  }
};

inline const Value* Object::find(std::string_view key) const {
  for (const auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
inline Value* Object::find(std::string_view key) {
  for (auto& [k, v] : items)
    if (k == key) return &v;
  return nullptr;
}
inline void Object::set(std::string key, Value value) {
  if (Value* existing = find(key)) {
    *existing = std::move(value);
  } else {
    items.emplace_back(std::move(key), std::move(value));
  }
}

/// Python's type name, for messages: "str", "int", "list", "dict", "undefined".
inline const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return "undefined";
    case Kind::none:
      return "NoneType";
    case Kind::boolean:
      return "bool";
    case Kind::integer:
      return "int";
    case Kind::floating:
      return "float";
    case Kind::string:
      return "str";
    case Kind::array:
      return "list";
    case Kind::tuple:
      return "tuple";
    case Kind::object:
      return "dict";
    case Kind::namespace_:
      return "Namespace";
    case Kind::callable:
      return "function";
    case Kind::generator:
      return "generator";
  }
  return "?";
}

/// Python's bool(v); Jinja2's Undefined is false.
inline bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
    case Kind::none:
      return false;
    case Kind::boolean:
      return v.boolean;
    case Kind::integer:
      return v.integer != 0;
    case Kind::floating:
      return v.floating != 0;
    case Kind::string:
      return !v.text.empty();
    case Kind::array:
    case Kind::tuple:
      return !v.array->empty();
    case Kind::object:
      return !v.object->items.empty();
    case Kind::namespace_:
    case Kind::callable:
    case Kind::generator:
      return true;
  }
  return false;
}

/// Python's repr(float): the shortest text that reads back, fixed for exponents in [-4, 16),
/// else scientific with a sign and at least two exponent digits ("1e-05", "1e+16").
inline std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buffer[64];
  const auto result =
      std::to_chars(buffer, buffer + sizeof buffer, d, std::chars_format::scientific);
  std::string sci(buffer, result.ptr);  // "-1.2345e+02"
  const std::size_t e = sci.find('e');
  const int exponent = std::stoi(sci.substr(e + 1));
  std::string mantissa = sci.substr(0, e);
  const bool negative = !mantissa.empty() && mantissa[0] == '-';
  if (negative) mantissa.erase(0, 1);
  std::string digits;
  for (char c : mantissa)
    if (c != '.') digits += c;
  std::string out = negative ? "-" : "";
  if (exponent >= -4 && exponent < 16) {
    if (exponent < 0) {
      out += "0." + std::string(static_cast<std::size_t>(-exponent - 1), '0') + digits;
    } else if (static_cast<std::size_t>(exponent) + 1 >= digits.size()) {
      out +=
          digits + std::string(static_cast<std::size_t>(exponent) + 1 - digits.size(), '0') + ".0";
    } else {
      out += digits.substr(0, static_cast<std::size_t>(exponent) + 1) + "." +
             digits.substr(static_cast<std::size_t>(exponent) + 1);
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof exp_text, "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
  return out + exp_text;
}

inline std::string repr(const Value& v, int depth = 0);

/// Python's str(v) as Jinja2 prints `{{ v }}` (an undefined value prints nothing).
inline std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return "";
    case Kind::string:
      return v.text;
    default:
      return repr(v);
  }
}

/// Python's repr of a str: single quotes unless the text has one and no double quote.
inline std::string string_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (const char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == quote || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02x", u);
      out += hex;
    } else {
      out += c;
    }
  }
  out += quote;
  return out;
}

inline std::string repr(const Value& v, int depth) {
  if (depth > max_value_depth)
    throw RuntimeFailure{concat("a value nested more than ", max_value_depth, " levels deep")};
  switch (v.kind) {
    case Kind::undefined:
      return "";
    case Kind::none:
      return "None";
    case Kind::boolean:
      return v.boolean ? "True" : "False";
    case Kind::integer:
      return std::to_string(v.integer);
    case Kind::floating:
      return float_repr(v.floating);
    case Kind::string:
      return string_repr(v.text);
    case Kind::array:
    case Kind::tuple: {
      std::string out = v.kind == Kind::array ? "[" : "(";
      for (std::size_t i = 0; i < v.array->size(); ++i) {
        if (i) out += ", ";
        out += repr((*v.array)[i], depth + 1);
      }
      if (v.kind == Kind::tuple && v.array->size() == 1) out += ",";
      return out + (v.kind == Kind::array ? "]" : ")");
    }
    case Kind::object:
    case Kind::namespace_: {
      std::string out = v.kind == Kind::object ? "{" : "<Namespace {";
      bool first = true;
      for (const auto& [key, value] : v.object->items) {
        if (!first) out += ", ";
        first = false;
        out += string_repr(key) + ": " + repr(value, depth + 1);
      }
      return out + (v.kind == Kind::object ? "}" : "}>");
    }
    case Kind::callable:
      return "<function " + v.callable->name + ">";
    case Kind::generator:
      // Python prints "<generator object … at 0x…>", an address: no prompt should carry it.
      throw RuntimeFailure{"printing an iterator (the result of map, select, items …)", true};
  }
  return "";
}

/// Python's ==: numbers by value across int, float and bool; lists and dicts deeply (dicts
/// whatever their order); Jinja2's Undefined equals only another Undefined.
inline bool equal(const Value& a, const Value& b, int depth = 0) {
  if (depth > max_value_depth)
    throw RuntimeFailure{concat("a value nested more than ", max_value_depth, " levels deep")};
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::floating || b.kind == Kind::floating) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind != b.kind) {
    return false;  // list == tuple is False in Python too
  }
  switch (a.kind) {
    case Kind::undefined:
    case Kind::none:
      return true;
    case Kind::string:
      return a.text == b.text;
    case Kind::array:
    case Kind::tuple:
      if (a.array->size() != b.array->size()) return false;
      for (std::size_t i = 0; i < a.array->size(); ++i)
        if (!equal((*a.array)[i], (*b.array)[i], depth + 1)) return false;
      return true;
    case Kind::object:
      if (a.object->items.size() != b.object->items.size()) return false;
      for (const auto& [key, value] : a.object->items) {
        const Value* other = b.object->find(key);
        if (!other || !equal(value, *other, depth + 1)) return false;
      }
      return true;
    case Kind::generator:
      return a.array == b.array;
    default:
      return a.object == b.object && a.callable == b.callable;
  }
}

/// A JSON value as Jinja2 sees what Python's json.loads gives: dicts in the text's order.
inline Value from_json(const nlohmann::ordered_json& j, int depth = 0) {
  if (depth > max_value_depth)
    throw ConfigError(
        concat("chat template: a JSON value nested more than ", max_value_depth, " levels deep"));
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::from_bool(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::from_int(j.get<std::int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const auto u = j.get<std::uint64_t>();
      if (u > static_cast<std::uint64_t>(INT64_MAX))
        throw ConfigError(concat("chat template: the integer ", u, " is beyond int64"));
      return Value::from_int(static_cast<std::int64_t>(u));
    }
    case nlohmann::ordered_json::value_t::number_float:
      return Value::from_float(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::from_string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e, depth + 1));
      return Value::list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value v = Value::dict();
      for (const auto& [key, e] : j.items()) {
        v.object->items.emplace_back(key, from_json(e, depth + 1));
        v.nest = std::max(v.nest, v.object->items.back().second.nest + 1);
      }
      return v;
    }
    default:
      return Value::none();  // binary: not produced by a JSON text
  }
}

/// How json.dumps writes one string: ensure_ascii=False keeps every non-ASCII character; the
/// control characters are escaped as \n, \t … or \u00XX (lowercase hex, as Python does).
inline void json_string(std::string& out, std::string_view s, bool ensure_ascii) {
  out += '"';
  for (std::size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    const auto u = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        continue;
      case '\\':
        out += "\\\\";
        continue;
      case '\n':
        out += "\\n";
        continue;
      case '\r':
        out += "\\r";
        continue;
      case '\t':
        out += "\\t";
        continue;
      case '\b':
        out += "\\b";
        continue;
      case '\f':
        out += "\\f";
        continue;
      default:
        break;
    }
    char hex[16];
    if (u < 0x20 || (ensure_ascii && u == 0x7f)) {
      std::snprintf(hex, sizeof hex, "\\u%04x", u);
      out += hex;
    } else if (ensure_ascii && u >= 0x80) {
      const auto cp = decode_code_point(s, i);
      char32_t value = cp ? cp->value : 0xFFFD;
      i += cp ? cp->length - 1 : 0;
      if (value >= 0x10000) {
        value -= 0x10000;
        std::snprintf(hex, sizeof hex, "\\u%04x\\u%04x", 0xD800 + (value >> 10),
                      0xDC00 + (value & 0x3FF));
      } else {
        std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(value));
      }
      out += hex;
    } else {
      out += c;
    }
  }
  out += '"';
}

/// json.dumps's options as transformers' tojson passes them.
struct JsonStyle {
  bool ensure_ascii = false;
  bool indent = false;
  std::string indent_text;  ///< one level, when indent
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
};

/// json.dumps(v): what cannot be JSON (Undefined, a namespace, a macro) is a TypeError there.
inline void dump_json(std::string& out, const Value& v, const JsonStyle& style, int depth) {
  if (depth > max_value_depth)
    throw RuntimeFailure{
        concat("tojson: a value nested more than ", max_value_depth, " levels deep")};
  auto newline = [&](int level) {
    out += '\n';
    for (int i = 0; i < level; ++i) out += style.indent_text;
  };
  switch (v.kind) {
    case Kind::none:
      out += "null";
      return;
    case Kind::boolean:
      out += v.boolean ? "true" : "false";
      return;
    case Kind::integer:
      out += std::to_string(v.integer);
      return;
    case Kind::floating:
      if (std::isnan(v.floating)) {
        out += "NaN";
      } else if (std::isinf(v.floating)) {
        out += v.floating > 0 ? "Infinity" : "-Infinity";
      } else {
        out += float_repr(v.floating);
      }
      return;
    case Kind::string:
      json_string(out, v.text, style.ensure_ascii);
      return;
    case Kind::array:
    case Kind::tuple: {
      if (v.array->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (std::size_t i = 0; i < v.array->size(); ++i) {
        if (i) out += style.item_separator;
        if (style.indent) newline(depth + 1);
        dump_json(out, (*v.array)[i], style, depth + 1);
      }
      if (style.indent) newline(depth);
      out += ']';
      return;
    }
    case Kind::object: {
      if (v.object->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& item : v.object->items) items.push_back(&item);
      if (style.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (std::size_t i = 0; i < items.size(); ++i) {
        if (i) out += style.item_separator;
        if (style.indent) newline(depth + 1);
        json_string(out, items[i]->first, style.ensure_ascii);
        out += style.key_separator;
        dump_json(out, items[i]->second, style, depth + 1);
      }
      if (style.indent) newline(depth);
      out += '}';
      return;
    }
    default:
      throw RuntimeFailure{
          concat("tojson: Object of type ", type_name(v), " is not JSON serializable")};
  }
}

}  // namespace dissect::text::detail::jinja
