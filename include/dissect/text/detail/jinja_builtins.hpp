// dissect/text/detail/jinja_builtins.hpp — private: do not include directly
// (dissect/text/chat_template.hpp does).
//
// Jinja2's operators, attribute and item lookup, filters, tests and the str/dict methods chat
// templates call, each with Python's result, and Python's error where Python raises. What the
// renderer does not implement raises RuntimeFailure{…, unsupported = true}: refused, never
// approximated.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/jinja_builtins.hpp is private to dissect: include dissect/text/chat_template.hpp instead"
#endif

#include <utf8proc.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/detail/jinja_lexer.hpp"
#include "dissect/text/detail/jinja_value.hpp"

namespace dissect::text::detail::jinja {

/// Bounds on what one render may build.
struct Limits {
  std::size_t max_string_bytes = 64u << 20;  ///< any string, the output included
  std::size_t max_list_items = 1u << 20;     ///< any list a template builds
  std::int64_t max_range = 100000;           ///< Jinja2's sandbox refuses bigger ranges too
};

[[noreturn]] inline void fail(std::string message) {
  throw RuntimeFailure{std::move(message)};
}
[[noreturn]] inline void not_supported(std::string what) {
  throw RuntimeFailure{std::move(what), true};
}

/// An undefined value used where Jinja2's Undefined raises.
[[noreturn]] inline void fail_undefined(const Value& v) {
  fail(v.text.empty() ? std::string("a value is undefined") : v.text);
}

inline std::string quoted_type(const Value& v) {
  return concat("'", type_name(v), "'");
}

inline void check_string(const std::string& s, const Limits& limits) {
  if (s.size() > limits.max_string_bytes)
    fail(concat("a string of more than ", limits.max_string_bytes, " bytes"));
}

// ---- iteration ---------------------------------------------------------------------------------

/// The items of `for x in v`: a list's items, a dict's keys, a string's characters; an undefined
/// value has none; an iterator is used up.
inline Array iterate(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return {};
    case Kind::array:
    case Kind::tuple:
      return *v.array;
    case Kind::generator:
      return std::exchange(*v.array, {});
    case Kind::object: {
      Array keys;
      for (const auto& item : v.object->items) keys.push_back(Value::from_string(item.first));
      return keys;
    }
    case Kind::string: {
      Array chars;
      for (const char32_t c : code_points(v.text))
        chars.push_back(Value::from_string(utf8_of({&c, 1})));
      return chars;
    }
    default:
      fail(concat(quoted_type(v), " object is not iterable"));
  }
}

inline Value generator(Array items) {
  return Value::list(std::move(items), Kind::generator);
}

/// Python's len().
inline std::int64_t length(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return 0;
    case Kind::string:
      return static_cast<std::int64_t>(code_points(v.text).size());
    case Kind::array:
    case Kind::tuple:
      return static_cast<std::int64_t>(v.array->size());
    case Kind::object:
      return static_cast<std::int64_t>(v.object->items.size());
    default:
      fail(concat("object of type ", quoted_type(v), " has no len()"));
  }
}

// ---- comparison --------------------------------------------------------------------------------

/// Python's a < b for the types that order: numbers, strings (by code point, which is UTF-8's
/// byte order), lists and tuples (lexicographically).
inline bool less(const Value& a, const Value& b, const char* op = "<", int depth = 0) {
  if (depth > max_value_depth)
    fail(concat("a value nested more than ", max_value_depth, " levels deep"));
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::floating || b.kind == Kind::floating) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.text < b.text;
  if (a.kind == b.kind && a.is_list()) {
    const Array& x = *a.array;
    const Array& y = *b.array;
    for (std::size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!equal(x[i], y[i])) return less(x[i], y[i], op, depth + 1);
    }
    return x.size() < y.size();
  }
  fail(concat("'", op, "' not supported between instances of ", quoted_type(a), " and ",
              quoted_type(b)));
}

/// Python's `item in container`.
inline bool contains(const Value& container, const Value& item) {
  switch (container.kind) {
    case Kind::undefined:
      return false;
    case Kind::string:
      if (!item.is_string())
        fail(concat("'in <string>' requires string as left operand, not ", type_name(item)));
      return container.text.find(item.text) != std::string::npos;
    case Kind::object:
      return item.is_string() && container.object->find(item.text) != nullptr;
    case Kind::array:
    case Kind::tuple:
    case Kind::generator:
      for (const Value& v :
           container.kind == Kind::generator ? iterate(container) : *container.array)
        if (equal(v, item)) return true;
      return false;
    default:
      fail(concat("argument of type ", quoted_type(container), " is not iterable"));
  }
}

// ---- arithmetic --------------------------------------------------------------------------------

/// Python's integers are unbounded; int64 arithmetic that would wrap is refused instead.
[[noreturn]] inline void int_overflow() {
  fail("an integer beyond int64 (Python's integers are unbounded: refused, not wrapped)");
}
inline Value checked_int(char op, std::int64_t a, std::int64_t b) {
  std::int64_t r = 0;
  const bool overflow = op == '+'   ? __builtin_add_overflow(a, b, &r)
                        : op == '-' ? __builtin_sub_overflow(a, b, &r)
                                    : __builtin_mul_overflow(a, b, &r);
  if (overflow) int_overflow();
  return Value::from_int(r);
}
inline Value negate(std::int64_t a) {
  return checked_int('-', 0, a);
}

[[noreturn]] inline void bad_operands(const std::string& op, const Value& a, const Value& b) {
  fail(concat("unsupported operand type(s) for ", op, ": ", quoted_type(a), " and ",
              quoted_type(b)));
}

inline Value repeat(const Value& sequence, std::int64_t times, const Limits& limits) {
  times = std::max<std::int64_t>(times, 0);
  if (sequence.is_string()) {
    if (times > 0 &&
        sequence.text.size() > limits.max_string_bytes / static_cast<std::size_t>(times))
      fail(concat("a string of more than ", limits.max_string_bytes, " bytes"));
    std::string out;
    for (std::int64_t i = 0; i < times; ++i) out += sequence.text;
    return Value::from_string(std::move(out));
  }
  if (times > 0 && sequence.array->size() > limits.max_list_items / static_cast<std::size_t>(times))
    fail(concat("a list of more than ", limits.max_list_items, " items"));
  Array out;
  for (std::int64_t i = 0; i < times; ++i)
    out.insert(out.end(), sequence.array->begin(), sequence.array->end());
  return Value::list(std::move(out), sequence.kind);
}

/// Python's floor division and modulo: the remainder has the divisor's sign.
inline std::int64_t floor_div(std::int64_t a, std::int64_t b) {
  std::int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

inline Value arithmetic(const std::string& op, const Value& a, const Value& b,
                        const Limits& limits) {
  if (a.is_undefined()) fail_undefined(a);
  if (b.is_undefined()) fail_undefined(b);
  const bool numbers = a.is_number() && b.is_number();
  const bool floats = numbers && (a.kind == Kind::floating || b.kind == Kind::floating);
  if (op == "+") {
    if (numbers) {
      return floats ? Value::from_float(a.as_double() + b.as_double())
                    : checked_int('+', a.as_int(), b.as_int());
    }
    if (a.is_string() && b.is_string()) {
      std::string out = a.text + b.text;
      check_string(out, limits);
      return Value::from_string(std::move(out));
    }
    if (a.is_list() && a.kind == b.kind) {
      if (a.array->size() + b.array->size() > limits.max_list_items)
        fail(concat("a list of more than ", limits.max_list_items, " items"));
      Array out = *a.array;
      out.insert(out.end(), b.array->begin(), b.array->end());
      return Value::list(std::move(out), a.kind);
    }
    if (a.is_string()) fail(concat("can only concatenate str (not \"", type_name(b), "\") to str"));
    if (a.kind == Kind::array)
      fail(concat("can only concatenate list (not \"", type_name(b), "\") to list"));
    bad_operands(op, a, b);
  }
  if (op == "*") {
    if (numbers) {
      return floats ? Value::from_float(a.as_double() * b.as_double())
                    : checked_int('*', a.as_int(), b.as_int());
    }
    if ((a.is_string() || a.is_list()) && b.is_integral()) return repeat(a, b.as_int(), limits);
    if ((b.is_string() || b.is_list()) && a.is_integral()) return repeat(b, a.as_int(), limits);
    bad_operands(op, a, b);
  }
  if (!numbers) {
    if (op == "%" && a.is_string()) not_supported("%-formatting of strings");
    bad_operands(op, a, b);
  }
  if (op == "-") {
    return floats ? Value::from_float(a.as_double() - b.as_double())
                  : checked_int('-', a.as_int(), b.as_int());
  }
  if (op == "/") {
    if (b.as_double() == 0) fail("division by zero");
    return Value::from_float(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (floats) {
      const double x = a.as_double();
      const double y = b.as_double();
      if (y == 0) fail("float division by zero");
      const double q = std::floor(x / y);
      return Value::from_float(op == "//" ? q : x - y * q);
    }
    if (b.as_int() == 0) fail("integer division or modulo by zero");
    if (a.as_int() == std::numeric_limits<std::int64_t>::min() && b.as_int() == -1)
      fail("an integer beyond int64");
    const std::int64_t q = floor_div(a.as_int(), b.as_int());
    return Value::from_int(op == "//" ? q : a.as_int() - q * b.as_int());
  }
  if (op == "**") {
    if (!floats && b.as_int() >= 0) {
      const std::int64_t base = a.as_int();
      if (base == 0 || base == 1) return Value::from_int(b.as_int() == 0 ? 1 : base);
      if (base == -1) return Value::from_int(b.as_int() % 2 == 0 ? 1 : -1);
      std::int64_t result = 1;
      for (std::int64_t i = 0; i < b.as_int(); ++i) {  // |base| >= 2: at most 63 rounds
        if (__builtin_mul_overflow(result, base, &result)) int_overflow();
      }
      return Value::from_int(result);
    }
    if (a.as_double() == 0 && b.as_double() < 0) fail("0.0 cannot be raised to a negative power");
    return Value::from_float(std::pow(a.as_double(), b.as_double()));
  }
  not_supported(concat("the operator ", op));
}

// ---- strings -----------------------------------------------------------------------------------

inline std::string map_case(std::string_view s, utf8proc_int32_t (*f)(utf8proc_int32_t)) {
  std::string out;
  for (const char32_t c : code_points(s))
    append_utf8(out, static_cast<char32_t>(f(static_cast<utf8proc_int32_t>(c))));
  return out;
}
inline bool is_cased(char32_t c) {
  const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return category == UTF8PROC_CATEGORY_LU || category == UTF8PROC_CATEGORY_LL ||
         category == UTF8PROC_CATEGORY_LT;
}
/// str.title(): a cased character after an uncased one is title-cased, the others lowered.
inline std::string title_case(std::string_view s) {
  std::string out;
  bool previous_cased = false;
  for (const char32_t c : code_points(s)) {
    const auto cp = static_cast<utf8proc_int32_t>(c);
    append_utf8(
        out, static_cast<char32_t>(previous_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp)));
    previous_cased = is_cased(c);
  }
  return out;
}
inline std::string capitalize(std::string_view s) {
  std::u32string cps = code_points(s);
  std::string out;
  for (std::size_t i = 0; i < cps.size(); ++i) {
    const auto cp = static_cast<utf8proc_int32_t>(cps[i]);
    append_utf8(out, static_cast<char32_t>(i == 0 ? utf8proc_totitle(cp) : utf8proc_tolower(cp)));
  }
  return out;
}

/// str.strip / lstrip / rstrip: whitespace, or any of `chars`.
inline std::string strip(std::string_view s, const Value& chars, bool left, bool right) {
  std::u32string cps = code_points(s);
  std::u32string set;
  const bool whitespace = chars.is_none() || chars.is_undefined();
  if (!whitespace) {
    if (!chars.is_string()) fail("strip arg must be None or str");
    set = code_points(chars.text);
  }
  auto strippable = [&](char32_t c) {
    return whitespace ? is_py_space(c) : set.find(c) != std::u32string::npos;
  };
  std::size_t begin = 0;
  std::size_t end = cps.size();
  if (left)
    while (begin < end && strippable(cps[begin])) ++begin;
  if (right)
    while (end > begin && strippable(cps[end - 1])) --end;
  return utf8_of(std::u32string_view(cps).substr(begin, end - begin));
}

/// str.split(sep=None, maxsplit=-1).
inline Value split(std::string_view s, const Value& sep, std::int64_t maxsplit) {
  Array parts;
  if (sep.is_none() || sep.is_undefined()) {
    std::u32string cps = code_points(s);
    std::size_t i = 0;
    while (true) {
      while (i < cps.size() && is_py_space(cps[i])) ++i;
      if (i >= cps.size()) break;
      if (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) >= maxsplit) {
        std::size_t end = cps.size();
        while (end > i && is_py_space(cps[end - 1])) --end;
        parts.push_back(Value::from_string(utf8_of(std::u32string_view(cps).substr(i, end - i))));
        break;
      }
      std::size_t j = i;
      while (j < cps.size() && !is_py_space(cps[j])) ++j;
      parts.push_back(Value::from_string(utf8_of(std::u32string_view(cps).substr(i, j - i))));
      i = j;
    }
    return Value::list(std::move(parts));
  }
  if (!sep.is_string()) fail(concat("must be str or None, not ", type_name(sep)));
  if (sep.text.empty()) fail("empty separator");
  std::size_t start = 0;
  while (true) {
    const std::size_t at = s.find(sep.text, start);
    if (at == std::string_view::npos ||
        (maxsplit >= 0 && static_cast<std::int64_t>(parts.size()) >= maxsplit)) {
      parts.push_back(Value::from_string(std::string(s.substr(start))));
      break;
    }
    parts.push_back(Value::from_string(std::string(s.substr(start, at - start))));
    start = at + sep.text.size();
  }
  return Value::list(std::move(parts));
}

/// str.replace(old, new, count=-1): an empty `old` goes between every character, as in Python.
inline std::string replace(std::string_view s, std::string_view old, std::string_view with,
                           std::int64_t count, const Limits& limits) {
  std::string out;
  std::int64_t done = 0;
  if (old.empty()) {
    const std::u32string cps = code_points(s);
    for (std::size_t i = 0; i <= cps.size(); ++i) {
      if (count < 0 || done < count) {
        out += with;
        ++done;
      }
      if (i < cps.size()) append_utf8(out, cps[i]);
      check_string(out, limits);
    }
    return out;
  }
  std::size_t start = 0;
  while (true) {
    const std::size_t at = s.find(old, start);
    if (at == std::string_view::npos || (count >= 0 && done >= count)) break;
    out += s.substr(start, at - start);
    out += with;
    check_string(out, limits);
    start = at + old.size();
    ++done;
  }
  out += s.substr(start);
  check_string(out, limits);
  return out;
}

// ---- lookups -----------------------------------------------------------------------------------

/// An argument by position or keyword, else `fallback`.
inline Value argument(CallArgs& args, std::size_t position, std::string_view keyword,
                      Value fallback = Value::none()) {
  for (auto& [key, value] : args.keywords)
    if (key == keyword) return value;
  if (position < args.positional.size()) return args.positional[position];
  return fallback;
}

/// Refuses arguments a builtin does not take (Python's TypeError).
inline void check_arguments(const CallArgs& args, std::size_t max_positional,
                            std::initializer_list<std::string_view> keywords,
                            std::string_view name) {
  if (args.positional.size() > max_positional)
    fail(concat(name, "() takes at most ", max_positional, " argument(s) (", args.positional.size(),
                " given)"));
  for (const auto& [key, value] : args.keywords)
    if (std::find(keywords.begin(), keywords.end(), key) == keywords.end())
      fail(concat(name, "() got an unexpected keyword argument '", key, "'"));
}

inline std::int64_t int_argument(const Value& v, std::string_view what) {
  if (!v.is_integral()) fail(concat(what, ": an integer is required, not ", type_name(v)));
  return v.as_int();
}

inline Value get_attribute(const Value& object, const std::string& name);

/// Jinja2's obj[key]: the item, else (for a string key) the attribute, else undefined.
inline Value get_item(const Value& object, const Value& key) {
  if (object.is_undefined()) fail_undefined(object);
  if (object.is_dict() && key.is_string()) {
    if (const Value* found = object.object->find(key.text)) return *found;
  } else if ((object.is_list() || object.is_string()) && key.is_integral()) {
    std::int64_t i = key.as_int();
    if (object.is_list()) {
      const auto n = static_cast<std::int64_t>(object.array->size());
      if (i < 0) i += n;
      if (i >= 0 && i < n) return (*object.array)[static_cast<std::size_t>(i)];
    } else {
      const std::u32string cps = code_points(object.text);
      const auto n = static_cast<std::int64_t>(cps.size());
      if (i < 0) i += n;
      if (i >= 0 && i < n)
        return Value::from_string(utf8_of({&cps[static_cast<std::size_t>(i)], 1}));
    }
    return Value::undefined(concat(type_name(object), " object has no element ", key.as_int()));
  }
  if (key.is_string() && !object.is_dict()) return get_attribute(object, key.text);
  if (key.is_string()) {
    Value method = get_attribute(object, key.text);
    if (!method.is_undefined()) return method;
  }
  return Value::undefined(concat("'", type_name(object), " object' has no attribute ", repr(key)));
}

/// obj[start:stop:step] for lists, tuples and strings (by code point), Python's rules.
inline Value slice(const Value& object, const Value& start, const Value& stop, const Value& step) {
  if (object.is_undefined()) fail_undefined(object);
  auto bound = [](const Value& v, std::string_view what) -> std::optional<std::int64_t> {
    if (v.is_none() || v.is_undefined()) return std::nullopt;
    if (!v.is_integral()) fail(concat("slice ", what, " must be an integer or None"));
    return v.as_int();
  };
  const std::int64_t s = bound(step, "step").value_or(1);
  if (s == 0) fail("slice step cannot be zero");
  std::u32string cps;
  std::int64_t n = 0;
  if (object.is_string()) {
    cps = code_points(object.text);
    n = static_cast<std::int64_t>(cps.size());
  } else if (object.is_list()) {
    n = static_cast<std::int64_t>(object.array->size());
  } else {
    fail(concat(quoted_type(object), " object is not subscriptable"));
  }
  auto adjust = [&](std::optional<std::int64_t> v, std::int64_t fallback) {
    if (!v) return fallback;
    std::int64_t i = *v;
    if (i < 0) {
      i += n;
      if (i < 0) i = s < 0 ? -1 : 0;
    } else if (i >= n) {
      i = s < 0 ? n - 1 : n;
    }
    return i;
  };
  const std::int64_t begin = adjust(bound(start, "start"), s < 0 ? n - 1 : 0);
  const std::int64_t end = adjust(bound(stop, "stop"), s < 0 ? -1 : n);
  std::vector<std::size_t> picks;
  for (std::int64_t i = begin; s > 0 ? i < end : i > end; i += s)
    picks.push_back(static_cast<std::size_t>(i));
  if (object.is_string()) {
    std::u32string out;
    for (std::size_t i : picks) out += cps[i];
    return Value::from_string(utf8_of(out));
  }
  Array out;
  for (std::size_t i : picks) out.push_back((*object.array)[i]);
  return Value::list(std::move(out), object.kind);
}

inline Value bound_method(const Value& self, const std::string& name,
                          std::function<Value(const Value&, CallArgs&)> body) {
  return Value::function(
      name, [self, body = std::move(body)](CallArgs& args) { return body(self, args); });
}

inline bool starts_or_ends(const Value& self, CallArgs& args, bool start, const char* name) {
  check_arguments(args, 1, {}, name);
  const Value affix = argument(args, 0, "");
  std::vector<std::string> options;
  if (affix.is_string()) {
    options.push_back(affix.text);
  } else if (affix.kind == Kind::tuple) {
    for (const Value& v : *affix.array) {
      if (!v.is_string()) fail(concat("tuple for ", name, " must only contain str"));
      options.push_back(v.text);
    }
  } else {
    fail(concat(name, " first arg must be str or a tuple of str, not ", type_name(affix)));
  }
  const std::string_view s = self.text;
  for (const std::string& o : options) {
    if (start ? s.substr(0, o.size()) == o
              : s.size() >= o.size() && s.substr(s.size() - o.size()) == o)
      return true;
  }
  return false;
}

inline Value string_method(const Value& self, const std::string& name) {
  static const Limits limits;
  if (name == "startswith" || name == "endswith") {
    const bool start = name == "startswith";
    return bound_method(self, name, [start](const Value& s, CallArgs& args) {
      return Value::from_bool(starts_or_ends(s, args, start, start ? "startswith" : "endswith"));
    });
  }
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip";
    const bool right = name != "lstrip";
    return bound_method(self, name, [left, right, name](const Value& s, CallArgs& args) {
      check_arguments(args, 1, {}, name);
      return Value::from_string(strip(s.text, argument(args, 0, ""), left, right));
    });
  }
  if (name == "split") {
    return bound_method(self, name, [](const Value& s, CallArgs& args) {
      check_arguments(args, 2, {"sep", "maxsplit"}, "split");
      return split(s.text, argument(args, 0, "sep"),
                   int_argument(argument(args, 1, "maxsplit", Value::from_int(-1)), "split"));
    });
  }
  if (name == "replace") {
    return bound_method(self, name, [](const Value& s, CallArgs& args) {
      check_arguments(args, 3, {}, "replace");
      const Value old = argument(args, 0, "");
      const Value with = argument(args, 1, "");
      if (!old.is_string() || !with.is_string()) fail("replace() arguments must be str");
      return Value::from_string(
          replace(s.text, old.text, with.text,
                  int_argument(argument(args, 2, "", Value::from_int(-1)), "replace"), limits));
    });
  }
  if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
    return bound_method(self, name, [name](const Value& s, CallArgs& args) {
      check_arguments(args, 0, {}, name);
      if (name == "upper") return Value::from_string(map_case(s.text, utf8proc_toupper));
      if (name == "lower") return Value::from_string(map_case(s.text, utf8proc_tolower));
      if (name == "title") return Value::from_string(title_case(s.text));
      return Value::from_string(capitalize(s.text));
    });
  }
  if (name == "join") {
    return bound_method(self, name, [](const Value& s, CallArgs& args) {
      check_arguments(args, 1, {}, "join");
      std::string out;
      bool first = true;
      for (const Value& item : iterate(argument(args, 0, ""))) {
        if (!item.is_string())
          fail(concat("sequence item: expected str instance, ", type_name(item), " found"));
        if (!first) out += s.text;
        first = false;
        out += item.text;
        check_string(out, limits);
      }
      return Value::from_string(std::move(out));
    });
  }
  static constexpr std::string_view python_methods[] = {
      "format",       "format_map",   "rsplit",       "splitlines", "find",      "rfind",
      "index",        "rindex",       "count",        "isdigit",    "isalpha",   "isalnum",
      "isspace",      "islower",      "isupper",      "istitle",    "isnumeric", "isdecimal",
      "isidentifier", "isprintable",  "isascii",      "zfill",      "center",    "ljust",
      "rjust",        "partition",    "rpartition",   "encode",     "casefold",  "swapcase",
      "expandtabs",   "removeprefix", "removesuffix", "translate",  "maketrans"};
  if (std::find(std::begin(python_methods), std::end(python_methods), name) !=
      std::end(python_methods))
    not_supported(concat("the string method '", name, "'"));
  return Value::undefined(concat("'str object' has no attribute '", name, "'"));
}

inline Value dict_method(const Value& self, const std::string& name) {
  if (name == "items" || name == "keys" || name == "values") {
    return bound_method(self, name, [name](const Value& d, CallArgs& args) {
      check_arguments(args, 0, {}, name);
      Array out;
      for (const auto& [key, value] : d.object->items) {
        if (name == "items") {
          out.push_back(Value::list({Value::from_string(key), value}, Kind::tuple));
        } else {
          out.push_back(name == "keys" ? Value::from_string(key) : value);
        }
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return bound_method(self, name, [](const Value& d, CallArgs& args) {
      check_arguments(args, 2, {}, "get");
      const Value key = argument(args, 0, "");
      if (key.is_string())
        if (const Value* found = d.object->find(key.text)) return *found;
      return argument(args, 1, "", Value::none());
    });
  }
  static constexpr std::string_view python_methods[] = {"pop",   "popitem", "update",  "setdefault",
                                                        "clear", "copy",    "fromkeys"};
  if (std::find(std::begin(python_methods), std::end(python_methods), name) !=
      std::end(python_methods))
    not_supported(concat("the dict method '", name, "'"));
  return Value::undefined();
}

inline Value get_attribute(const Value& object, const std::string& name) {
  switch (object.kind) {
    case Kind::undefined:
      fail_undefined(object);
    case Kind::object: {
      Value method = dict_method(object, name);
      if (!method.is_undefined()) return method;
      if (const Value* found = object.object->find(name)) return *found;
      return Value::undefined(concat("'dict object' has no attribute '", name, "'"));
    }
    case Kind::namespace_:
      if (const Value* found = object.object->find(name)) return *found;
      break;
    case Kind::string:
      return string_method(object, name);
    case Kind::array:
    case Kind::tuple: {
      static constexpr std::string_view python_methods[] = {"append",  "extend", "insert", "pop",
                                                            "remove",  "index",  "count",  "sort",
                                                            "reverse", "clear",  "copy"};
      if (std::find(std::begin(python_methods), std::end(python_methods), name) !=
          std::end(python_methods))
        not_supported(concat("the list method '", name, "'"));
      break;
    }
    default:
      break;
  }
  return Value::undefined(concat("'", type_name(object), " object' has no attribute '", name, "'"));
}

/// Jinja2's attribute getter for filters (`attribute="function.name"`): dotted, each part an
/// item lookup, digits as indexes.
inline Value get_path(const Value& object, const std::string& path) {
  Value current = object;
  std::size_t start = 0;
  while (true) {
    const std::size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    const bool digits = !part.empty() && std::all_of(part.begin(), part.end(),
                                                     [](char c) { return c >= '0' && c <= '9'; });
    current = get_item(current, digits ? Value::from_int(std::stoll(part.substr(0, 18)))
                                       : Value::from_string(part));
    if (dot == std::string::npos) return current;
    start = dot + 1;
  }
}

// ---- tests -------------------------------------------------------------------------------------

inline bool apply_test(const std::string& name, const Value& v, const std::vector<Value>& args) {
  auto arg = [&](std::size_t i) -> const Value& {
    if (i >= args.size()) fail(concat("the test '", name, "' needs an argument"));
    return args[i];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.kind == Kind::boolean;
  if (name == "false") return v.kind == Kind::boolean && !v.boolean;
  if (name == "true") return v.kind == Kind::boolean && v.boolean;
  if (name == "integer") return v.kind == Kind::integer;
  if (name == "float") return v.kind == Kind::floating;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable")
    return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict() ||
           v.kind == Kind::generator;
  if (name == "sequence") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "callable") return v.kind == Kind::callable;
  if (name == "odd" || name == "even" || name == "divisibleby") {
    const Value divisor = name == "divisibleby" ? arg(0) : Value::from_int(2);
    const Value rest = arithmetic("%", v, divisor, Limits{});
    const bool zero = !truthy(rest);
    return name == "odd" ? !zero : zero;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg(0));
  if (name == "ne" || name == "!=") return !equal(v, arg(0));
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, arg(0));
  if (name == "le" || name == "<=") return !less(arg(0), v, "<=");
  if (name == "gt" || name == "greaterthan" || name == ">") return less(arg(0), v, ">");
  if (name == "ge" || name == ">=") return !less(v, arg(0), ">=");
  if (name == "in") return contains(arg(0), v);
  if (name == "sameas") {
    const Value& other = arg(0);
    if (v.kind != other.kind) return false;
    switch (v.kind) {
      case Kind::none:
      case Kind::undefined:
        return v.kind == Kind::none;
      case Kind::boolean:
        return v.boolean == other.boolean;
      case Kind::array:
      case Kind::tuple:
      case Kind::generator:
        return v.array == other.array;
      case Kind::object:
      case Kind::namespace_:
        return v.object == other.object;
      case Kind::callable:
        return v.callable == other.callable;
      default:
        not_supported("'is sameas' on numbers and strings (object identity)");
    }
  }
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return false;
    bool cased = false;
    for (const char32_t c : code_points(v.text)) {
      const auto category = utf8proc_category(static_cast<utf8proc_int32_t>(c));
      if (category == UTF8PROC_CATEGORY_LT) return false;
      if (category == UTF8PROC_CATEGORY_LU) {
        if (name == "lower") return false;
        cased = true;
      } else if (category == UTF8PROC_CATEGORY_LL) {
        if (name == "upper") return false;
        cased = true;
      }
    }
    return cased;
  }
  not_supported(concat("the test '", name, "'"));
}

}  // namespace dissect::text::detail::jinja
