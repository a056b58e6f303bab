// dissect/text/detail/jinja_evaluator.hpp — private: do not include directly
// (dissect/text/chat_template.hpp does).
//
// Runs a parsed chat template: Jinja2's scoping (a `set` inside a for loop stays in the loop,
// which is why templates use namespace()), loop variables, macros and call blocks, the globals
// transformers adds (raise_exception, strftime_now) and Jinja2's (range, namespace, dict). Every
// run is bounded: steps, nesting, macro recursion, string and list sizes, range() as Jinja2's
// sandbox bounds it; a template past a bound is refused with a ConfigError, never cut short.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/jinja_evaluator.hpp is private to dissect: include dissect/text/chat_template.hpp instead"
#endif

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/detail/jinja_ast.hpp"
#include "dissect/text/detail/jinja_builtins.hpp"
#include "dissect/text/detail/jinja_filters.hpp"
#include "dissect/text/detail/jinja_parser.hpp"

namespace dissect::text::detail::jinja {

/// The template's own raise_exception(message).
struct Raised {
  std::string message;
  int line = 0;
};

struct RenderLimits : Limits {
  std::int64_t max_steps = 10'000'000;  ///< statements and expressions evaluated
  int max_nesting = 512;                ///< evaluation depth (blocks, expressions, macro bodies)
  int max_macro_depth = 64;             ///< macro calls inside macro calls
};

/// One scope: the template's top level, a for loop, a macro call.
struct Frame {
  std::vector<std::pair<std::string, Value>> vars;
  Frame* parent = nullptr;

  Value* find_local(std::string_view name) {
    for (auto& [key, value] : vars)
      if (key == name) return &value;
    return nullptr;
  }
  Value* find(std::string_view name) {
    for (Frame* f = this; f; f = f->parent)
      if (Value* v = f->find_local(name)) return v;
    return nullptr;
  }
  void set(const std::string& name, Value value) {
    if (Value* v = find_local(name)) {
      *v = std::move(value);
    } else {
      vars.emplace_back(name, std::move(value));
    }
  }
};

class Evaluator {
 public:
  Evaluator(const RenderLimits& limits, std::optional<std::time_t> now)
      : limits_(limits), now_(now) {}

  /// Renders `body` with `root` as the template's top-level scope.
  std::string render(const Body& body, Frame& root) {
    root_ = &root;
    std::string out;
    exec_body(body, root, out);
    return out;
  }

 private:
  enum class Flow { normal, break_, continue_ };

  const RenderLimits& limits_;
  std::optional<std::time_t> now_;
  Frame* root_ = nullptr;
  std::int64_t steps_ = 0;
  int nesting_ = 0;
  int macro_depth_ = 0;
  int line_ = 1;

  [[noreturn]] void error(int line, const std::string& message) const {
    throw ConfigError(concat("chat template: line ", line, ": ", message));
  }

  struct Nesting {
    Nesting(Evaluator& e, int line) : evaluator(e) {
      if (++evaluator.steps_ > evaluator.limits_.max_steps)
        evaluator.error(line, concat("the template ran more than ", evaluator.limits_.max_steps,
                                     " steps (a loop too long for a prompt?)"));
      if (++evaluator.nesting_ > evaluator.limits_.max_nesting)
        evaluator.error(line, concat("evaluation nested more than ", evaluator.limits_.max_nesting,
                                     " levels deep"));
    }
    ~Nesting() { --evaluator.nesting_; }
    Evaluator& evaluator;
  };

  /// Runs `f`, turning what Python would raise into a ConfigError naming the line.
  template <class F>
  auto at_line(int line, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const RuntimeFailure& failure) {
      if (failure.unsupported)
        error(line,
              concat(failure.message, " is not supported by dissect's chat template renderer"));
      error(line, failure.message);
    }
  }

  void append(std::string& out, std::string_view text, int line) {
    if (out.size() + text.size() > limits_.max_string_bytes)
      error(line, concat("the output is longer than ", limits_.max_string_bytes, " bytes"));
    out += text;
  }

  // ---- statements ----
  Flow exec_body(const Body& body, Frame& frame, std::string& out) {
    for (const auto& stmt : body) {
      const Flow flow = exec(*stmt, frame, out);
      if (flow != Flow::normal) return flow;
    }
    return Flow::normal;
  }

  Flow exec(const Stmt& stmt, Frame& frame, std::string& out) {
    Nesting guard(*this, stmt.line);
    switch (stmt.kind) {
      case Stmt::Kind::text:
        append(out, stmt.text, stmt.line);
        return Flow::normal;
      case Stmt::Kind::output: {
        const Value v = eval(*stmt.expr, frame);
        append(out, at_line(stmt.line, [&] { return to_str(v); }), stmt.line);
        return Flow::normal;
      }
      case Stmt::Kind::if_:
        for (const auto& [condition, body] : stmt.branches)
          if (truthy(eval(*condition, frame))) return exec_body(body, frame, out);
        return exec_body(stmt.else_body, frame, out);
      case Stmt::Kind::for_:
        exec_for(stmt, frame, out);
        return Flow::normal;
      case Stmt::Kind::set: {
        Value v = eval(*stmt.expr, frame);
        if (!stmt.attribute.empty()) {
          Value* target = lookup(stmt.targets[0], frame);
          if (!target || target->kind != Kind::namespace_)
            error(stmt.line, "Cannot assign attribute on non-namespace object");
          // Namespaces are the only mutable values: one stored in another could close a cycle
          // (a leak) or nest past every bound, and real templates never do it.
          if (holds_namespace(v, stmt.line))
            error(stmt.line,
                  "a namespace stored in a namespace is not supported by dissect's chat "
                  "template renderer");
          target->nest = std::max(target->nest, v.nest + 1);
          target->object->set(stmt.attribute, std::move(v));
        } else {
          assign(stmt.targets, std::move(v), frame, stmt.line);
        }
        return Flow::normal;
      }
      case Stmt::Kind::set_block: {
        std::string captured;
        exec_body(stmt.body, frame, captured);
        frame.set(stmt.targets[0], Value::from_string(std::move(captured)));
        return Flow::normal;
      }
      case Stmt::Kind::macro:
        frame.set(stmt.text, make_macro(stmt));
        return Flow::normal;
      case Stmt::Kind::call_block: {
        const Stmt* block = &stmt;
        Frame* site = &frame;
        Value caller = Value::function("caller", [this, block, site](CallArgs& args) {
          Frame scope{{}, site};
          bind_params(*block, "caller", args, scope, block->line);
          std::string captured;
          exec_body(block->body, scope, captured);
          return Value::from_string(std::move(captured));
        });
        const Expr& call = *stmt.expr;
        Value callee = eval(*call.a, frame);
        CallArgs args = eval_args(call, frame);
        args.keywords.emplace_back("caller", std::move(caller));
        append(out, at_line(stmt.line, [&] { return to_str(invoke(callee, args, stmt.line)); }),
               stmt.line);
        return Flow::normal;
      }
      case Stmt::Kind::break_:
        return Flow::break_;
      case Stmt::Kind::continue_:
        return Flow::continue_;
      case Stmt::Kind::generation:
        return exec_body(stmt.body, frame, out);
    }
    return Flow::normal;
  }

  Value* lookup(const std::string& name, Frame& frame) { return frame.find(name); }

  bool holds_namespace(const Value& v, int line) {
    switch (v.kind) {
      case Kind::namespace_:
        return true;
      case Kind::array:
      case Kind::tuple:
      case Kind::generator:
        charge(v.array->size(), line);
        for (const Value& item : *v.array)
          if (holds_namespace(item, line)) return true;
        return false;
      case Kind::object:
        charge(v.object->items.size(), line);
        for (const auto& item : v.object->items)
          if (holds_namespace(item.second, line)) return true;
        return false;
      default:
        return false;
    }
  }

  /// Counts work proportional to a size (a list copied, a string built) against max_steps.
  void charge(std::size_t units, int line) {
    steps_ += static_cast<std::int64_t>(std::min<std::size_t>(units, 1u << 30));
    if (steps_ > limits_.max_steps)
      error(line, concat("the template ran more than ", limits_.max_steps,
                         " steps (a loop too long for a prompt?)"));
  }
  Value charged(Value v, int line) {
    if (v.is_list() || v.kind == Kind::generator) charge(v.array->size(), line);
    if (v.is_string()) charge(v.text.size() / 64, line);
    if (v.nest > max_value_depth)
      error(line, concat("a value nested more than ", max_value_depth, " levels deep"));
    return v;
  }

  void assign(const std::vector<std::string>& targets, Value v, Frame& frame, int line) {
    if (targets.size() == 1) {
      frame.set(targets[0], std::move(v));
      return;
    }
    const Array items = at_line(line, [&] { return iterate(v); });
    if (items.size() != targets.size())
      error(line,
            concat("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
    for (std::size_t i = 0; i < targets.size(); ++i) frame.set(targets[i], items[i]);
  }

  void exec_for(const Stmt& stmt, Frame& frame, std::string& out) {
    const Value iterable = eval(*stmt.expr, frame);
    Array items = at_line(stmt.line, [&] { return iterate(iterable); });
    charge(items.size(), stmt.line);
    Frame scope{{}, &frame};
    if (stmt.condition) {
      Array kept;
      for (Value& item : items) {
        assign(stmt.targets, item, scope, stmt.line);
        if (truthy(eval(*stmt.condition, scope))) kept.push_back(std::move(item));
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      Frame else_scope{{}, &frame};
      exec_body(stmt.else_body, else_scope, out);
      return;
    }
    const auto n = static_cast<std::int64_t>(items.size());
    for (std::int64_t i = 0; i < n; ++i) {
      Nesting guard(*this, stmt.line);
      const auto at = static_cast<std::size_t>(i);
      assign(stmt.targets, items[at], scope, stmt.line);
      Value loop = Value::dict(Kind::namespace_);
      Object& o = *loop.object;
      o.items.reserve(12);
      o.items.emplace_back("index", Value::from_int(i + 1));
      o.items.emplace_back("index0", Value::from_int(i));
      o.items.emplace_back("revindex", Value::from_int(n - i));
      o.items.emplace_back("revindex0", Value::from_int(n - i - 1));
      o.items.emplace_back("first", Value::from_bool(i == 0));
      o.items.emplace_back("last", Value::from_bool(i == n - 1));
      o.items.emplace_back("length", Value::from_int(n));
      o.items.emplace_back("depth", Value::from_int(1));
      o.items.emplace_back("depth0", Value::from_int(0));
      o.items.emplace_back("previtem",
                           i > 0 ? items[at - 1] : Value::undefined("there is no previous item"));
      o.items.emplace_back("nextitem",
                           i + 1 < n ? items[at + 1] : Value::undefined("there is no next item"));
      o.items.emplace_back(
          "cycle", Value::function("cycle", [i](CallArgs& args) {
            if (args.positional.empty()) fail("no items for cycling given");
            return args.positional[static_cast<std::size_t>(i) % args.positional.size()];
          }));
      scope.set("loop", std::move(loop));
      const Flow flow = exec_body(stmt.body, scope, out);
      if (flow == Flow::break_) break;
    }
  }

  // ---- macros ----
  void bind_params(const Stmt& macro, const std::string& name, CallArgs& args, Frame& scope,
                   int line) {
    if (args.positional.size() > macro.params.size())
      error(line,
            concat("macro '", name, "' takes not more than ", macro.params.size(), " argument(s)"));
    std::vector<bool> bound(macro.params.size(), false);
    for (std::size_t i = 0; i < args.positional.size(); ++i) {
      scope.set(macro.params[i].name, std::move(args.positional[i]));
      bound[i] = true;
    }
    for (auto& [key, value] : args.keywords) {
      std::size_t i = 0;
      while (i < macro.params.size() && macro.params[i].name != key) ++i;
      if (i == macro.params.size()) {
        if (key == "caller") {
          scope.set(key, std::move(value));
          continue;
        }
        error(line, concat("macro '", name, "' takes no keyword argument '", key, "'"));
      }
      if (bound[i])
        error(line, concat("macro '", name, "' got multiple values for argument '", key, "'"));
      scope.set(key, std::move(value));
      bound[i] = true;
    }
    for (std::size_t i = 0; i < macro.params.size(); ++i) {
      if (bound[i]) continue;
      const MacroParam& param = macro.params[i];
      scope.set(param.name, param.default_value ? eval(*param.default_value, scope)
                                                : Value::undefined(concat("parameter '", param.name,
                                                                          "' was not provided")));
    }
  }

  Value make_macro(const Stmt& stmt) {
    const Stmt* macro = &stmt;
    return Value::function(stmt.text, [this, macro](CallArgs& args) {
      if (++macro_depth_ > limits_.max_macro_depth) {
        --macro_depth_;
        error(macro->line, concat("macro '", macro->text, "' nested more than ",
                                  limits_.max_macro_depth, " calls deep"));
      }
      struct Leave {
        int& depth;
        ~Leave() { --depth; }
      } leave{macro_depth_};
      // Jinja2 resolves a macro's free names in the template's top-level scope.
      Frame scope{{}, root_};
      bind_params(*macro, macro->text, args, scope, macro->line);
      std::string captured;
      exec_body(macro->body, scope, captured);
      return Value::from_string(std::move(captured));
    });
  }

  // ---- expressions ----
  CallArgs eval_args(const Expr& e, Frame& frame) {
    CallArgs args;
    for (const auto& arg : e.args) args.positional.push_back(eval(*arg, frame));
    for (const auto& [key, arg] : e.keywords) args.keywords.emplace_back(key, eval(*arg, frame));
    return args;
  }

  Value invoke(const Value& callee, CallArgs& args, int line) {
    if (callee.is_undefined()) {
      fail(callee.text.empty() ? "calling an undefined value" : callee.text);
    }
    if (callee.kind != Kind::callable) fail(concat(quoted_type(callee), " object is not callable"));
    line_ = line;
    return callee.callable->call(args);
  }

  Value global(const std::string& name) {
    if (name == "raise_exception") {
      return Value::function(name, [this](CallArgs& args) -> Value {
        throw Raised{args.positional.empty() ? std::string() : to_str(args.positional[0]), line_};
      });
    }
    if (name == "strftime_now") {
      return Value::function(name, [this](CallArgs& args) {
        check_arguments(args, 1, {}, "strftime_now");
        const Value format = argument(args, 0, "");
        if (!format.is_string()) fail("strftime_now: the format must be a string");
        const std::time_t now = now_ ? *now_ : std::time(nullptr);
        std::tm local{};
        localtime_r(&now, &local);
        std::string out(256 + format.text.size() * 16, '\0');
        const std::size_t n = std::strftime(out.data(), out.size(), format.text.c_str(), &local);
        if (n == 0 && !format.text.empty()) fail("strftime_now: the formatted date is too long");
        out.resize(n);
        return Value::from_string(std::move(out));
      });
    }
    if (name == "range") {
      return Value::function(name, [this](CallArgs& args) {
        check_arguments(args, 3, {}, "range");
        if (args.positional.empty()) fail("range expected at least 1 argument, got 0");
        std::int64_t start = 0, stop = 0, step = 1;
        if (args.positional.size() == 1) {
          stop = int_argument(args.positional[0], "range");
        } else {
          start = int_argument(args.positional[0], "range");
          stop = int_argument(args.positional[1], "range");
          if (args.positional.size() == 3) step = int_argument(args.positional[2], "range");
        }
        if (step == 0) fail("range() arg 3 must not be zero");
        // In uint64, where stop - start and |step| cannot overflow.
        const bool up = step > 0;
        const std::uint64_t span =
            (up ? stop > start : start > stop)
                ? (up ? static_cast<std::uint64_t>(stop) - static_cast<std::uint64_t>(start)
                      : static_cast<std::uint64_t>(start) - static_cast<std::uint64_t>(stop))
                : 0;
        const std::uint64_t stride =
            up ? static_cast<std::uint64_t>(step) : 0 - static_cast<std::uint64_t>(step);
        const std::uint64_t count = span / stride + (span % stride != 0);
        if (count > static_cast<std::uint64_t>(limits_.max_range))
          fail(concat("Range too big. The sandbox blocks ranges larger than MAX_RANGE (",
                      limits_.max_range, ")."));
        Array out;
        for (std::uint64_t i = 0; i < count; ++i)
          out.push_back(Value::from_int(static_cast<std::int64_t>(
              static_cast<std::uint64_t>(start) + i * static_cast<std::uint64_t>(step))));
        return Value::list(std::move(out));
      });
    }
    if (name == "namespace" || name == "dict") {
      const bool is_namespace = name == "namespace";
      return Value::function(name, [is_namespace](CallArgs& args) {
        Value v = Value::dict(is_namespace ? Kind::namespace_ : Kind::object);
        if (args.positional.size() > 1)
          fail("namespace() and dict() take at most one positional argument");
        if (!args.positional.empty()) {
          if (!args.positional[0].is_dict())
            not_supported("namespace() or dict() from anything but a dict");
          v.object->items = args.positional[0].object->items;
        }
        for (auto& [key, value] : args.keywords) v.object->set(key, value);
        for (const auto& item : v.object->items) v.nest = std::max(v.nest, item.second.nest + 1);
        return v;
      });
    }
    if (name == "lipsum" || name == "cycler" || name == "joiner")
      not_supported(concat("the global '", name, "'"));
    return Value::undefined(concat("'", name, "' is undefined"));
  }

  Value eval(const Expr& e, Frame& frame) {
    Nesting guard(*this, e.line);
    return at_line(e.line, [&] { return eval_inner(e, frame); });
  }

  Value eval_inner(const Expr& e, Frame& frame) {
    switch (e.kind) {
      case Expr::Kind::literal:
        return e.value;
      case Expr::Kind::name: {
        if (const Value* v = frame.find(e.name)) return *v;
        return global(e.name);
      }
      case Expr::Kind::attribute:
        return get_attribute(eval(*e.a, frame), e.name);
      case Expr::Kind::item: {
        const Value object = eval(*e.a, frame);
        return get_item(object, eval(*e.b, frame));
      }
      case Expr::Kind::slice: {
        const Value object = eval(*e.a, frame);
        Value parts[3];
        for (int k = 0; k < 3; ++k)
          parts[k] = e.args[static_cast<std::size_t>(k)]
                         ? eval(*e.args[static_cast<std::size_t>(k)], frame)
                         : Value::none();
        return charged(slice(object, parts[0], parts[1], parts[2]), e.line);
      }
      case Expr::Kind::call: {
        const Value callee = eval(*e.a, frame);
        CallArgs args = eval_args(e, frame);
        return charged(invoke(callee, args, e.line), e.line);
      }
      case Expr::Kind::filter: {
        const Value v = eval(*e.a, frame);
        CallArgs args = eval_args(e, frame);
        return charged(apply_filter(e.name, v, args, limits_), e.line);
      }
      case Expr::Kind::test: {
        const Value v = eval(*e.a, frame);
        CallArgs args = eval_args(e, frame);
        if (!args.keywords.empty()) fail("tests take no keyword arguments");
        return Value::from_bool(apply_test(e.name, v, args.positional) != e.negated);
      }
      case Expr::Kind::unary: {
        const Value v = eval(*e.a, frame);
        if (e.name == "not") return Value::from_bool(!truthy(v));
        if (v.is_undefined()) fail_undefined(v);
        if (!v.is_number())
          fail(concat("bad operand type for unary ", e.name, ": ", quoted_type(v)));
        if (e.name == "+") return v.kind == Kind::boolean ? Value::from_int(v.as_int()) : v;
        if (v.kind == Kind::floating) return Value::from_float(-v.floating);
        return negate(v.as_int());
      }
      case Expr::Kind::binary: {
        if (e.name == "and") {
          Value left = eval(*e.a, frame);
          return truthy(left) ? eval(*e.b, frame) : left;
        }
        if (e.name == "or") {
          Value left = eval(*e.a, frame);
          return truthy(left) ? left : eval(*e.b, frame);
        }
        const Value left = eval(*e.a, frame);
        const Value right = eval(*e.b, frame);
        if (e.name == "~") {
          std::string out = to_str(left) + to_str(right);
          check_string(out, limits_);
          return charged(Value::from_string(std::move(out)), e.line);
        }
        return charged(arithmetic(e.name, left, right, limits_), e.line);
      }
      case Expr::Kind::compare: {
        Value left = eval(*e.args[0], frame);
        for (std::size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i + 1], frame);
          const std::string& op = e.ops[i];
          bool result = false;
          if (op == "==")
            result = equal(left, right);
          else if (op == "!=")
            result = !equal(left, right);
          else if (op == "<")
            result = less(left, right, "<");
          else if (op == ">")
            result = less(right, left, ">");
          else if (op == "<=")
            result = !less(right, left, "<=");
          else if (op == ">=")
            result = !less(left, right, ">=");
          else if (op == "in")
            result = contains(right, left);
          else
            result = !contains(right, left);
          if (!result) return Value::from_bool(false);
          left = std::move(right);
        }
        return Value::from_bool(true);
      }
      case Expr::Kind::conditional:
        if (truthy(eval(*e.a, frame))) return eval(*e.b, frame);
        return e.c ? eval(*e.c, frame)
                   : Value::undefined("the condition was false and there is no else");
      case Expr::Kind::list:
      case Expr::Kind::tuple: {
        Array items;
        for (const auto& arg : e.args) items.push_back(eval(*arg, frame));
        return charged(
            Value::list(std::move(items), e.kind == Expr::Kind::list ? Kind::array : Kind::tuple),
            e.line);
      }
      case Expr::Kind::dict: {
        Value v = Value::dict();
        for (std::size_t i = 0; i + 1 < e.args.size(); i += 2) {
          const Value key = eval(*e.args[i], frame);
          if (!key.is_string()) not_supported("a dict literal with keys that are not strings");
          Value item = eval(*e.args[i + 1], frame);
          v.nest = std::max(v.nest, item.nest + 1);
          v.object->set(key.text, std::move(item));
        }
        return charged(std::move(v), e.line);
      }
    }
    return Value::undefined();
  }
};

}  // namespace dissect::text::detail::jinja
