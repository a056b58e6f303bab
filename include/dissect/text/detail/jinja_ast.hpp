// dissect/text/detail/jinja_ast.hpp — private: do not include directly
// (dissect/text/chat_template.hpp does).
//
// The parsed form of a chat template: expressions and statements as plain trees, each node with
// its source line so that every error can say where it is.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/jinja_ast.hpp is private to dissect: include dissect/text/chat_template.hpp instead"
#endif

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dissect/text/detail/jinja_value.hpp"

namespace dissect::text::detail::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    literal,      // value
    name,         // name
    attribute,    // a.name
    item,         // a[b]
    slice,        // a[b:c:d] (args: start, stop, step, any may be null)
    call,         // a(args, keywords)
    filter,       // a | name(args, keywords)
    test,         // a is [not] name(args)
    unary,        // op a ("-", "+", "not")
    binary,       // a op b: + - * / // % ** ~ and or
    compare,      // a op b op c …: ops, operands in args
    conditional,  // b if a else c  (a: condition, b: then, c: else or null)
    list,
    tuple,
    dict,  // keys and values alternate in args
  } kind = Kind::literal;
  int line = 1;
  Value value;
  std::string name;  ///< the name, attribute, filter, test or operator
  bool negated = false;
  ExprPtr a, b, c;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> keywords;
  std::vector<std::string> ops;  ///< compare's operators
};

struct Stmt;
using Body = std::vector<std::unique_ptr<Stmt>>;

struct MacroParam {
  std::string name;
  ExprPtr default_value;  ///< null: required
};

struct Stmt {
  enum class Kind {
    text,        // text
    output,      // {{ expr }}
    if_,         // branches: (condition, body) …, else_body
    for_,        // targets in expr, filter cond, body, else_body
    set,         // targets = expr; or target.attribute = expr (namespace)
    set_block,   // {% set name %}body{% endset %}
    macro,       // name(params) body
    call_block,  // {% call(params) expr %}body{% endcall %}
    break_,
    continue_,
    generation,  // transformers' {% generation %}: its body, rendered as it is
  } kind = Kind::text;
  int line = 1;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attribute;  ///< set ns.attribute
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body;
  Body else_body;
  std::vector<MacroParam> params;
};

}  // namespace dissect::text::detail::jinja
