// dissect/text/detail/jinja_parser.hpp — private: do not include directly
// (dissect/text/chat_template.hpp does).
//
// Builds the tree of a chat template from the lexer's pieces, with Jinja2's grammar and operator
// precedence (a filter binds tighter than arithmetic: `messages|length - 1`). What the renderer
// does not implement — a tag, a filter, a test — is refused here, before anything renders, with
// a ConfigError naming it and its line: a template is rendered exactly or not at all.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/jinja_parser.hpp is private to dissect: include dissect/text/chat_template.hpp instead"
#endif

#include <algorithm>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/detail/jinja_ast.hpp"
#include "dissect/text/detail/jinja_lexer.hpp"

namespace dissect::text::detail::jinja {

inline bool is_known_filter(std::string_view name) {
  static constexpr std::string_view names[] = {
      "abs",   "capitalize", "count",      "d",       "default", "first", "float",  "int",
      "items", "join",       "last",       "length",  "list",    "lower", "map",    "max",
      "min",   "reject",     "rejectattr", "replace", "reverse", "safe",  "select", "selectattr",
      "sort",  "string",     "sum",        "title",   "tojson",  "trim",  "upper"};
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

inline bool is_known_test(std::string_view name) {
  static constexpr std::string_view names[] = {
      "defined",  "undefined", "none",   "boolean", "false",       "true",
      "integer",  "float",     "number", "string",  "mapping",     "iterable",
      "sequence", "callable",  "odd",    "even",    "divisibleby", "eq",
      "equalto",  "==",        "ne",     "!=",      "lt",          "lessthan",
      "<",        "le",        "<=",     "gt",      "greaterthan", ">",
      "ge",       ">=",        "in",     "sameas",  "lower",       "upper"};
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

[[noreturn]] inline void unsupported(int line, std::string_view what) {
  throw ConfigError(concat("chat template: line ", line, ": ", what,
                           " is not supported by dissect's chat template renderer"));
}

class Parser {
 public:
  /// Nesting deeper than this (expressions or blocks) is refused, so that no input can exhaust
  /// the stack.
  static constexpr int max_depth = 128;

  explicit Parser(std::vector<Segment> segments) : segments_(std::move(segments)) {}

  Body parse() {
    std::string ender;
    Body body = parse_body({}, ender);
    return body;
  }

 private:
  std::vector<Segment> segments_;
  std::size_t segment_ = 0;
  const std::vector<Token>* tokens_ = nullptr;
  std::size_t token_ = 0;
  int depth_ = 0;
  int loops_ = 0;

  struct DepthGuard {
    explicit DepthGuard(Parser& p, int line) : parser(p) {
      if (++parser.depth_ > max_depth)
        syntax_error(line, concat("nested more than ", max_depth, " levels deep"));
    }
    ~DepthGuard() { --parser.depth_; }
    Parser& parser;
  };

  // ---- tokens of the current tag ----
  const Token& peek(std::size_t ahead = 0) const {
    const std::size_t i = std::min(token_ + ahead, tokens_->size() - 1);
    return (*tokens_)[i];
  }
  const Token& next() {
    const Token& t = peek();
    if (token_ + 1 < tokens_->size()) ++token_;
    return t;
  }
  bool is_op(std::string_view op, std::size_t ahead = 0) const {
    return peek(ahead).type == TokenType::op && peek(ahead).text == op;
  }
  bool is_name(std::string_view name, std::size_t ahead = 0) const {
    return peek(ahead).type == TokenType::name && peek(ahead).text == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::end:
        return "the end of the tag";
      case TokenType::string:
        return "a string";
      default:
        return concat("'", t.text, "'");
    }
  }
  void expect_op(std::string_view op) {
    if (!skip_op(op))
      syntax_error(peek().line, concat("expected '", op, "', found ", describe(peek())));
  }
  std::string expect_name() {
    if (peek().type != TokenType::name)
      syntax_error(peek().line, concat("expected a name, found ", describe(peek())));
    return next().text;
  }
  void expect_end() {
    if (peek().type != TokenType::end)
      syntax_error(peek().line, concat("expected the end of the tag, found ", describe(peek())));
  }

  // ---- statements ----
  Body parse_body(std::initializer_list<std::string_view> enders, std::string& ender) {
    Body body;
    while (segment_ < segments_.size()) {
      Segment& segment = segments_[segment_];
      if (segment.kind == Segment::Kind::text) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::text;
        stmt->line = segment.line;
        stmt->text = std::move(segment.text);
        body.push_back(std::move(stmt));
        ++segment_;
        continue;
      }
      tokens_ = &segment.tokens;
      token_ = 0;
      if (segment.kind == Segment::Kind::output) {
        auto stmt = std::make_unique<Stmt>();
        stmt->kind = Stmt::Kind::output;
        stmt->line = segment.line;
        stmt->expr = parse_tuple();
        expect_end();
        body.push_back(std::move(stmt));
        ++segment_;
        continue;
      }
      if (peek().type != TokenType::name) syntax_error(segment.line, "a tag without a name");
      const std::string tag = peek().text;
      if (std::find(enders.begin(), enders.end(), tag) != enders.end()) {
        ender = tag;
        next();
        return body;  // the caller reads the rest of this tag
      }
      next();
      body.push_back(parse_statement(tag, segment.line));
    }
    if (enders.size() > 0)
      syntax_error(segments_.empty() ? 1 : segments_.back().line,
                   concat("the template ends before {% ", *(enders.end() - 1), " %}"));
    return body;
  }

  /// Reads the body up to one of `enders` and steps past that tag's name.
  Body block(std::initializer_list<std::string_view> enders, std::string& ender, int line) {
    DepthGuard guard(*this, line);
    ++segment_;
    return parse_body(enders, ender);
  }

  std::unique_ptr<Stmt> parse_statement(const std::string& tag, int line) {
    auto stmt = std::make_unique<Stmt>();
    stmt->line = line;
    std::string ender;
    if (tag == "if") {
      stmt->kind = Stmt::Kind::if_;
      ExprPtr condition = parse_expression();
      expect_end();
      while (true) {
        Body body = block({"elif", "else", "endif"}, ender, line);
        stmt->branches.emplace_back(std::move(condition), std::move(body));
        if (ender == "elif") {
          condition = parse_expression();
          expect_end();
          continue;
        }
        if (ender == "else") {
          expect_end();
          stmt->else_body = block({"endif"}, ender, line);
        }
        break;
      }
    } else if (tag == "for") {
      stmt->kind = Stmt::Kind::for_;
      do {
        stmt->targets.push_back(expect_name());
      } while (skip_op(","));
      if (!skip_name("in")) syntax_error(peek().line, "expected 'in' in a for loop");
      stmt->expr = parse_tuple(false);
      if (skip_name("if")) stmt->condition = parse_expression();
      if (is_name("recursive")) unsupported(line, "a recursive for loop");
      expect_end();
      ++loops_;
      stmt->body = block({"else", "endfor"}, ender, line);
      --loops_;
      if (ender == "else") {
        expect_end();
        stmt->else_body = block({"endfor"}, ender, line);
      }
    } else if (tag == "set") {
      stmt->targets.push_back(expect_name());
      if (skip_op(".")) {
        stmt->attribute = expect_name();
      } else {
        while (skip_op(",")) stmt->targets.push_back(expect_name());
      }
      if (skip_op("=")) {
        stmt->kind = Stmt::Kind::set;
        stmt->expr = parse_tuple();
      } else {
        if (stmt->targets.size() != 1 || !stmt->attribute.empty())
          syntax_error(line, "a block set assigns one name");
        if (is_op("|")) unsupported(line, "a filtered block set");
        expect_end();
        stmt->kind = Stmt::Kind::set_block;
        stmt->body = block({"endset"}, ender, line);
        return finish(std::move(stmt));
      }
    } else if (tag == "macro") {
      stmt->kind = Stmt::Kind::macro;
      stmt->text = expect_name();
      parse_params(*stmt);
      expect_end();
      const int loops = std::exchange(loops_, 0);
      stmt->body = block({"endmacro"}, ender, line);
      loops_ = loops;
      if (peek().type == TokenType::name && peek().text == stmt->text) next();
    } else if (tag == "call") {
      stmt->kind = Stmt::Kind::call_block;
      if (is_op("(")) parse_params(*stmt);
      stmt->expr = parse_expression();
      if (stmt->expr->kind != Expr::Kind::call) syntax_error(line, "{% call %} needs a call");
      expect_end();
      const int loops = std::exchange(loops_, 0);
      stmt->body = block({"endcall"}, ender, line);
      loops_ = loops;
    } else if (tag == "break" || tag == "continue") {
      if (loops_ == 0) syntax_error(line, concat("'", tag, "' outside a for loop"));
      stmt->kind = tag == "break" ? Stmt::Kind::break_ : Stmt::Kind::continue_;
    } else if (tag == "generation") {
      stmt->kind = Stmt::Kind::generation;
      expect_end();
      stmt->body = block({"endgeneration"}, ender, line);
    } else if (tag == "include" || tag == "import" || tag == "from" || tag == "extends" ||
               tag == "block" || tag == "filter" || tag == "with" || tag == "autoescape" ||
               tag == "do" || tag == "trans" || tag == "pluralize") {
      unsupported(line, concat("{% ", tag, " %}"));
    } else {
      syntax_error(line, concat("unknown tag '", tag, "'"));
    }
    return finish(std::move(stmt));
  }

  std::unique_ptr<Stmt> finish(std::unique_ptr<Stmt> stmt) {
    expect_end();
    ++segment_;
    return stmt;
  }

  void parse_params(Stmt& stmt) {
    expect_op("(");
    while (!is_op(")")) {
      if (!stmt.params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam param;
      param.name = expect_name();
      if (skip_op("=")) param.default_value = parse_expression();
      stmt.params.push_back(std::move(param));
    }
    expect_op(")");
  }

  // ---- expressions ----
  ExprPtr make(Expr::Kind kind, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = line;
    return e;
  }

  /// Comma-separated expressions: one, or a tuple.
  ExprPtr parse_tuple(bool with_condition = true) {
    const int line = peek().line;
    ExprPtr first = with_condition ? parse_expression() : parse_or();
    if (!is_op(",")) return first;
    auto tuple = make(Expr::Kind::tuple, line);
    tuple->args.push_back(std::move(first));
    while (skip_op(",")) {
      if (peek().type == TokenType::end || is_op(")")) break;
      tuple->args.push_back(with_condition ? parse_expression() : parse_or());
    }
    return tuple;
  }

  ExprPtr parse_expression() {
    DepthGuard guard(*this, peek().line);
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const int line = next().line;
      auto cond = make(Expr::Kind::conditional, line);
      cond->b = std::move(expr);
      cond->a = parse_or();
      if (skip_name("else")) cond->c = parse_expression();
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(std::string op, ExprPtr left, ExprPtr right, int line) {
    auto e = make(Expr::Kind::binary, line);
    e->name = std::move(op);
    e->a = std::move(left);
    e->b = std::move(right);
    return e;
  }

  ExprPtr parse_or() {
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const int line = next().line;
      left = binary("or", std::move(left), parse_and(), line);
    }
    return left;
  }
  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const int line = next().line;
      left = binary("and", std::move(left), parse_not(), line);
    }
    return left;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      DepthGuard guard(*this, peek().line);
      auto e = make(Expr::Kind::unary, next().line);
      e->name = "not";
      e->a = parse_not();
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    const int line = peek().line;
    ExprPtr first = parse_math1();
    ExprPtr compare;
    while (true) {
      std::string op;
      if (peek().type == TokenType::op &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" || peek().text == ">" ||
           peek().text == "<=" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      if (!compare) {
        compare = make(Expr::Kind::compare, line);
        compare->args.push_back(std::move(first));
      }
      compare->ops.push_back(op);
      compare->args.push_back(parse_math1());
    }
    return compare ? std::move(compare) : std::move(first);
  }
  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      left = binary(t.text, std::move(left), parse_concat(), t.line);
    }
    return left;
  }
  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const int line = next().line;
      left = binary("~", std::move(left), parse_math2(), line);
    }
    return left;
  }
  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      left = binary(t.text, std::move(left), parse_pow(), t.line);
    }
    return left;
  }
  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const int line = next().line;
      left = binary("**", std::move(left), parse_unary(true), line);
    }
    return left;
  }
  ExprPtr parse_unary(bool with_filter) {
    DepthGuard guard(*this, peek().line);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& t = next();
      node = make(Expr::Kind::unary, t.line);
      node->name = t.text;
      node->a = parse_unary(false);
    } else {
      node = parse_postfix(parse_primary());
    }
    return with_filter ? parse_filters(std::move(node)) : std::move(node);
  }

  ExprPtr parse_primary() {
    const Token& t = peek();
    const int line = t.line;
    auto literal = [&](Value v) {
      auto e = make(Expr::Kind::literal, line);
      e->value = std::move(v);
      return e;
    };
    switch (t.type) {
      case TokenType::name: {
        const std::string name = next().text;
        if (name == "true" || name == "True") return literal(Value::from_bool(true));
        if (name == "false" || name == "False") return literal(Value::from_bool(false));
        if (name == "none" || name == "None") return literal(Value::none());
        auto e = make(Expr::Kind::name, line);
        e->name = name;
        return e;
      }
      case TokenType::string: {
        std::string text = next().text;
        while (peek().type == TokenType::string) text += next().text;  // "a" "b" is "ab"
        return literal(Value::from_string(std::move(text)));
      }
      case TokenType::integer:
        return literal(Value::from_int(next().integer));
      case TokenType::floating:
        return literal(Value::from_float(next().floating));
      case TokenType::end:
        syntax_error(line, "an expression is missing");
      case TokenType::op:
        break;
    }
    if (skip_op("(")) {
      if (skip_op(")")) return make(Expr::Kind::tuple, line);
      ExprPtr inner = parse_expression();
      if (is_op(",")) {
        auto tuple = make(Expr::Kind::tuple, line);
        tuple->args.push_back(std::move(inner));
        while (skip_op(",")) {
          if (is_op(")")) break;
          tuple->args.push_back(parse_expression());
        }
        inner = std::move(tuple);
      }
      expect_op(")");
      return inner;
    }
    if (skip_op("[")) {
      auto list = make(Expr::Kind::list, line);
      while (!is_op("]")) {
        if (!list->args.empty()) expect_op(",");
        if (is_op("]")) break;
        list->args.push_back(parse_expression());
      }
      expect_op("]");
      return list;
    }
    if (skip_op("{")) {
      auto dict = make(Expr::Kind::dict, line);
      while (!is_op("}")) {
        if (!dict->args.empty()) expect_op(",");
        if (is_op("}")) break;
        dict->args.push_back(parse_expression());
        expect_op(":");
        dict->args.push_back(parse_expression());
      }
      expect_op("}");
      return dict;
    }
    syntax_error(line, concat("unexpected ", describe(t)));
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) unsupported(peek().line, "*args and **kwargs in a call");
      if (peek().type == TokenType::name && is_op("=", 1)) {
        std::string key = next().text;
        next();
        call.keywords.emplace_back(std::move(key), parse_expression());
      } else {
        if (!call.keywords.empty())
          syntax_error(peek().line, "a positional argument after a keyword argument");
        call.args.push_back(parse_expression());
      }
    }
    expect_op(")");
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      const int line = peek().line;
      if (skip_op(".")) {
        if (peek().type == TokenType::integer) {
          auto index = make(Expr::Kind::literal, line);
          index->value = Value::from_int(next().integer);
          auto item = make(Expr::Kind::item, line);
          item->a = std::move(node);
          item->b = std::move(index);
          node = std::move(item);
          continue;
        }
        auto attr = make(Expr::Kind::attribute, line);
        attr->name = expect_name();
        attr->a = std::move(node);
        node = std::move(attr);
      } else if (skip_op("[")) {
        ExprPtr parts[3];
        bool is_slice = false;
        for (int k = 0; k < 3; ++k) {
          if (!is_op(":") && !is_op("]")) parts[k] = parse_expression();
          if (k < 2 && skip_op(":")) {
            is_slice = true;
          } else {
            break;
          }
        }
        expect_op("]");
        if (is_slice) {
          auto slice = make(Expr::Kind::slice, line);
          slice->a = std::move(node);
          for (auto& part : parts) slice->args.push_back(std::move(part));
          node = std::move(slice);
        } else {
          if (!parts[0]) syntax_error(line, "an empty subscript");
          auto item = make(Expr::Kind::item, line);
          item->a = std::move(node);
          item->b = std::move(parts[0]);
          node = std::move(item);
        }
      } else if (is_op("(")) {
        auto call = make(Expr::Kind::call, line);
        call->a = std::move(node);
        parse_call_args(*call);
        node = std::move(call);
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_filters(ExprPtr node) {
    while (true) {
      const int line = peek().line;
      if (skip_op("|")) {
        auto filter = make(Expr::Kind::filter, line);
        filter->name = expect_name();
        if (is_op(".")) unsupported(line, "a dotted filter name");
        if (!is_known_filter(filter->name))
          unsupported(line, concat("the filter '", filter->name, "'"));
        filter->a = std::move(node);
        if (is_op("(")) parse_call_args(*filter);
        node = std::move(filter);
      } else if (is_name("is")) {
        next();
        auto test = make(Expr::Kind::test, line);
        test->negated = skip_name("not");
        if (peek().type == TokenType::name) {
          test->name = next().text;
        } else if (peek().type == TokenType::op &&
                   std::string_view("== != < <= > >=").find(peek().text) !=
                       std::string_view::npos) {
          test->name = next().text;
        } else {
          syntax_error(line, concat("expected a test name after 'is', found ", describe(peek())));
        }
        if (!is_known_test(test->name)) unsupported(line, concat("the test '", test->name, "'"));
        test->a = std::move(node);
        const Token& t = peek();
        if (is_op("(")) {
          parse_call_args(*test);
        } else if ((t.type == TokenType::name || t.type == TokenType::string ||
                    t.type == TokenType::integer || t.type == TokenType::floating || is_op("[") ||
                    is_op("{")) &&
                   !is_name("else") && !is_name("or") && !is_name("and")) {
          if (is_name("is")) syntax_error(line, "tests cannot be chained with 'is'");
          test->args.push_back(parse_postfix(parse_primary()));
        }
        node = std::move(test);
      } else if (is_op("(")) {
        auto call = make(Expr::Kind::call, line);
        call->a = std::move(node);
        parse_call_args(*call);
        node = std::move(call);
      } else {
        return node;
      }
    }
  }
};

}  // namespace dissect::text::detail::jinja
