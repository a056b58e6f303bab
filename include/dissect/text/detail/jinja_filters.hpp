// dissect/text/detail/jinja_filters.hpp — private: do not include directly
// (dissect/text/chat_template.hpp does).
//
// The filters chat templates use (`x | trim`, `tools | tojson(indent=4)`, `messages |
// selectattr("role", "equalto", "system") | list`), each as Jinja2 3.1 defines it, with
// transformers' own `tojson` (json.dumps with ensure_ascii=False, no HTML escaping). map, select,
// selectattr and reject give iterators, as in Jinja2: `| length` on them is Python's TypeError,
// and they are true even when empty.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/jinja_filters.hpp is private to dissect: include dissect/text/chat_template.hpp instead"
#endif

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "dissect/text/detail/jinja_builtins.hpp"
#include "dissect/text/detail/jinja_parser.hpp"

namespace dissect::text::detail::jinja {

inline Value apply_filter(const std::string& name, const Value& v, CallArgs& args,
                          const Limits& limits);

/// transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None, separators=None,
/// sort_keys=False).
inline Value filter_tojson(const Value& v, CallArgs& args) {
  check_arguments(args, 4, {"ensure_ascii", "indent", "separators", "sort_keys"}, "tojson");
  JsonStyle style;
  style.ensure_ascii = truthy(argument(args, 0, "ensure_ascii", Value::from_bool(false)));
  const Value indent = argument(args, 1, "indent");
  if (indent.is_integral()) {
    style.indent = true;
    style.indent_text = std::string(
        static_cast<std::size_t>(std::clamp<std::int64_t>(indent.as_int(), 0, 256)), ' ');
  } else if (indent.is_string()) {
    style.indent = true;
    style.indent_text = indent.text;
  } else if (!indent.is_none()) {
    fail(concat("tojson: indent must be an integer, a string or None, not ", type_name(indent)));
  }
  if (style.indent) style.item_separator = ",";
  const Value separators = argument(args, 2, "separators");
  if (!separators.is_none()) {
    if (!separators.is_list() || separators.array->size() != 2 ||
        !(*separators.array)[0].is_string() || !(*separators.array)[1].is_string())
      fail("tojson: separators must be two strings");
    style.item_separator = (*separators.array)[0].text;
    style.key_separator = (*separators.array)[1].text;
  }
  style.sort_keys = truthy(argument(args, 3, "sort_keys", Value::from_bool(false)));
  std::string out;
  dump_json(out, v, style, 0);
  return Value::from_string(std::move(out));
}

/// The items of select/reject/selectattr/rejectattr that pass (or, `keep` false, fail) the test.
inline Value select(const Value& v, CallArgs& args, bool by_attribute, bool keep,
                    const char* name) {
  if (!args.keywords.empty()) fail(concat(name, "() takes no keyword arguments"));
  std::size_t at = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty() || !args.positional[0].is_string())
      fail(concat(name, "() needs an attribute name"));
    attribute = args.positional[at++].text;
  }
  std::string test;
  if (at < args.positional.size()) {
    if (!args.positional[at].is_string()) fail(concat(name, "(): the test name must be a string"));
    test = args.positional[at++].text;
    if (!is_known_test(test)) not_supported(concat("the test '", test, "'"));
  }
  const std::vector<Value> test_args(args.positional.begin() + static_cast<std::ptrdiff_t>(at),
                                     args.positional.end());
  Array out;
  for (const Value& item : iterate(v)) {
    const Value subject = by_attribute ? get_path(item, attribute) : item;
    const bool passes = test.empty() ? truthy(subject) : apply_test(test, subject, test_args);
    if (passes == keep) out.push_back(item);
  }
  return generator(std::move(out));
}

inline Value filter_map(const Value& v, CallArgs& args, const Limits& limits) {
  Array out;
  const Value attribute = argument(args, 99, "attribute", Value::undefined());
  if (!attribute.is_undefined()) {
    check_arguments(args, 0, {"attribute", "default"}, "map");
    const Value fallback = argument(args, 99, "default", Value::undefined());
    for (const Value& item : iterate(v)) {
      Value value = get_path(item, to_str(attribute));
      if (value.is_undefined() && !fallback.is_undefined()) value = fallback;
      out.push_back(std::move(value));
    }
    return generator(std::move(out));
  }
  if (args.positional.empty() || !args.positional[0].is_string())
    fail("map() needs a filter name or attribute=");
  const std::string filter = args.positional[0].text;
  if (!is_known_filter(filter)) not_supported(concat("the filter '", filter, "'"));
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keywords = args.keywords;
  for (const Value& item : iterate(v)) {
    CallArgs copy = rest;
    out.push_back(apply_filter(filter, item, copy, limits));
  }
  return generator(std::move(out));
}

/// Python's float(text) for the `float` and `int` filters: decimal text with optional sign,
/// surrounding whitespace, inf and nan.
inline std::optional<double> parse_float(const std::string& text) {
  const std::string s = strip(text, Value::none(), true, true);
  if (s.empty()) return std::nullopt;
  std::string lower = map_case(s, utf8proc_tolower);
  const std::string unsigned_part = lower[0] == '+' || lower[0] == '-' ? lower.substr(1) : lower;
  const double sign = lower[0] == '-' ? -1.0 : 1.0;
  if (unsigned_part == "inf" || unsigned_part == "infinity") return sign * INFINITY;
  if (unsigned_part == "nan") return NAN;
  bool digit = false;
  for (const char c : unsigned_part) {
    if (c >= '0' && c <= '9') {
      digit = true;
    } else if (c != '.' && c != 'e' && c != '+' && c != '-' && c != '_') {
      return std::nullopt;
    }
  }
  if (!digit) return std::nullopt;
  try {
    std::size_t used = 0;
    const double d = std::stod(s, &used);
    if (used != s.size()) return std::nullopt;
    return d;
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

inline Value sort_key(const Value& item, const std::string& attribute, bool case_sensitive) {
  Value key = attribute.empty() ? item : get_path(item, attribute);
  if (!case_sensitive && key.is_string())
    key = Value::from_string(map_case(key.text, utf8proc_tolower));
  return key;
}

inline Value apply_filter(const std::string& name, const Value& v, CallArgs& args,
                          const Limits& limits) {
  auto plain = [&](std::size_t max_positional) { check_arguments(args, max_positional, {}, name); };
  if (name == "tojson") return filter_tojson(v, args);
  if (name == "trim") {
    check_arguments(args, 1, {"chars"}, name);
    return Value::from_string(strip(to_str(v), argument(args, 0, "chars"), true, true));
  }
  if (name == "length" || name == "count") {
    plain(0);
    return Value::from_int(length(v));
  }
  if (name == "default" || name == "d") {
    check_arguments(args, 2, {"default_value", "boolean"}, name);
    const Value fallback = argument(args, 0, "default_value", Value::from_string(""));
    const bool boolean = truthy(argument(args, 1, "boolean", Value::from_bool(false)));
    if (v.is_undefined() || (boolean && !truthy(v))) return fallback;
    return v;
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    plain(0);
    const std::string s = to_str(v);
    if (name == "upper") return Value::from_string(map_case(s, utf8proc_toupper));
    if (name == "lower") return Value::from_string(map_case(s, utf8proc_tolower));
    if (name == "title") return Value::from_string(title_case(s));
    return Value::from_string(capitalize(s));
  }
  if (name == "string" || name == "safe") {
    plain(0);
    return Value::from_string(to_str(v));
  }
  if (name == "items") {
    plain(0);
    if (v.is_undefined()) return generator({});
    if (!v.is_dict()) fail("Can only get item pairs from a mapping.");
    Array out;
    for (const auto& [key, value] : v.object->items)
      out.push_back(Value::list({Value::from_string(key), value}, Kind::tuple));
    return generator(std::move(out));
  }
  if (name == "join") {
    check_arguments(args, 2, {"d", "attribute"}, name);
    const Value separator = argument(args, 0, "d", Value::from_string(""));
    const Value attribute = argument(args, 1, "attribute");
    std::string out;
    bool first = true;
    for (const Value& item : iterate(v)) {
      if (!first) out += to_str(separator);
      first = false;
      out += to_str(attribute.is_none() ? item : get_path(item, to_str(attribute)));
      check_string(out, limits);
    }
    return Value::from_string(std::move(out));
  }
  if (name == "selectattr" || name == "rejectattr")
    return select(v, args, true, name == "selectattr", name.c_str());
  if (name == "select" || name == "reject")
    return select(v, args, false, name == "select", name.c_str());
  if (name == "map") return filter_map(v, args, limits);
  if (name == "list") {
    plain(0);
    return Value::list(iterate(v));
  }
  if (name == "first") {
    plain(0);
    if (v.kind == Kind::generator) {
      if (v.array->empty()) return Value::undefined("No first item, sequence was empty.");
      Value front = v.array->front();
      v.array->erase(v.array->begin());
      return front;
    }
    const Array items = iterate(v);
    if (items.empty()) return Value::undefined("No first item, sequence was empty.");
    return items.front();
  }
  if (name == "last") {
    plain(0);
    if (v.kind == Kind::generator || v.is_undefined())
      fail(concat(quoted_type(v), " object is not reversible"));
    const Array items = iterate(v);
    if (items.empty()) return Value::undefined("No last item, sequence was empty.");
    return items.back();
  }
  if (name == "reverse") {
    plain(0);
    if (v.is_string()) {
      std::u32string cps = code_points(v.text);
      std::reverse(cps.begin(), cps.end());
      return Value::from_string(utf8_of(cps));
    }
    Array items = iterate(v);
    std::reverse(items.begin(), items.end());
    return generator(std::move(items));
  }
  if (name == "replace") {
    check_arguments(args, 3, {"old", "new", "count"}, name);
    const Value old = argument(args, 0, "old", Value::from_string(""));
    const Value with = argument(args, 1, "new", Value::from_string(""));
    const Value count = argument(args, 2, "count");
    return Value::from_string(replace(to_str(v), to_str(old), to_str(with),
                                      count.is_none() ? -1 : int_argument(count, "replace"),
                                      limits));
  }
  if (name == "abs") {
    plain(0);
    if (v.kind == Kind::floating) return Value::from_float(std::fabs(v.floating));
    if (!v.is_integral()) fail(concat("bad operand type for abs(): ", quoted_type(v)));
    return v.as_int() < 0 ? negate(v.as_int()) : Value::from_int(v.as_int());
  }
  if (name == "int") {
    check_arguments(args, 2, {"default", "base"}, name);
    const Value fallback = argument(args, 0, "default", Value::from_int(0));
    if (!argument(args, 1, "base", Value::from_int(10)).is_integral() ||
        argument(args, 1, "base", Value::from_int(10)).as_int() != 10)
      not_supported("the int filter with a base other than 10");
    if (v.is_integral()) return Value::from_int(v.as_int());
    if (v.kind == Kind::floating) {
      if (!std::isfinite(v.floating) || std::fabs(v.floating) >= 9.2e18) return fallback;
      return Value::from_int(static_cast<std::int64_t>(v.floating));
    }
    if (v.is_string()) {
      const std::string s = strip(v.text, Value::none(), true, true);
      std::int64_t value = 0;
      std::size_t i = s.size() > 0 && (s[0] == '+' || s[0] == '-') ? 1 : 0;
      bool ok = i < s.size();
      for (std::size_t k = i; k < s.size() && ok; ++k) {
        if (s[k] < '0' || s[k] > '9' || value > (INT64_MAX - 9) / 10) {
          ok = false;
        } else {
          value = value * 10 + (s[k] - '0');
        }
      }
      if (ok) return Value::from_int(s[0] == '-' ? -value : value);
      const auto d = parse_float(v.text);
      if (d && std::isfinite(*d) && std::fabs(*d) < 9.2e18)
        return Value::from_int(static_cast<std::int64_t>(*d));
    }
    return fallback;
  }
  if (name == "float") {
    check_arguments(args, 1, {"default"}, name);
    const Value fallback = argument(args, 0, "default", Value::from_float(0.0));
    if (v.is_number()) return Value::from_float(v.as_double());
    if (v.is_string()) {
      if (const auto d = parse_float(v.text)) return Value::from_float(*d);
    }
    return fallback;
  }
  if (name == "sort") {
    check_arguments(args, 3, {"reverse", "case_sensitive", "attribute"}, name);
    const bool reverse = truthy(argument(args, 0, "reverse", Value::from_bool(false)));
    const bool case_sensitive =
        truthy(argument(args, 1, "case_sensitive", Value::from_bool(false)));
    const Value attribute = argument(args, 2, "attribute");
    const std::string path = attribute.is_none() ? "" : to_str(attribute);
    Array items = iterate(v);
    std::vector<std::pair<Value, Value>> keyed;
    for (Value& item : items)
      keyed.emplace_back(sort_key(item, path, case_sensitive), std::move(item));
    std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
      return reverse ? less(b.first, a.first) : less(a.first, b.first);
    });
    Array out;
    for (auto& [key, item] : keyed) out.push_back(std::move(item));
    return Value::list(std::move(out));
  }
  if (name == "min" || name == "max") {
    check_arguments(args, 2, {"case_sensitive", "attribute"}, name);
    const bool case_sensitive =
        truthy(argument(args, 0, "case_sensitive", Value::from_bool(false)));
    const Value attribute = argument(args, 1, "attribute");
    const std::string path = attribute.is_none() ? "" : to_str(attribute);
    const Array items = iterate(v);
    if (items.empty()) return Value::undefined(concat("No aggregated item, sequence was empty."));
    std::size_t best = 0;
    for (std::size_t i = 1; i < items.size(); ++i) {
      const Value a = sort_key(items[i], path, case_sensitive);
      const Value b = sort_key(items[best], path, case_sensitive);
      if (name == "min" ? less(a, b) : less(b, a)) best = i;
    }
    return items[best];
  }
  if (name == "sum") {
    check_arguments(args, 2, {"attribute", "start"}, name);
    const Value attribute = argument(args, 0, "attribute");
    Value total = argument(args, 1, "start", Value::from_int(0));
    for (const Value& item : iterate(v))
      total = arithmetic("+", total, attribute.is_none() ? item : get_path(item, to_str(attribute)),
                         limits);
    return total;
  }
  not_supported(concat("the filter '", name, "'"));
}

}  // namespace dissect::text::detail::jinja
