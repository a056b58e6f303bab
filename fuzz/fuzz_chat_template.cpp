// fuzz/fuzz_chat_template.cpp — libFuzzer harness for chat templates (dissect/text): the input is
// a template's source, parsed and rendered over a fixed conversation with tools, with and without
// the generation prompt, under small bounds. Whatever the template says, the renderer may only
// refuse it with dissect's errors (a ConfigError naming the construct or the bound, the
// template's own TemplateRaisedError): no crash, no hang, no memory beyond the bounds.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "dissect/text/chat_template.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  static const nlohmann::ordered_json messages = nlohmann::ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Ça va ? 日本語"},
    {"role": "assistant", "content": "", "reasoning_content": "think",
     "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5, null]}}}]},
    {"role": "tool", "content": "{\"r\": true}"},
    {"role": "assistant", "content": "<think>\nx\n</think>\n\ndone"}])");
  static const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(R"([
    {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object",
     "properties": {"a": {"type": "array", "items": {"type": "number"}}}, "required": ["a"]}}}])");
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_dissect_errors([&] {
    const text::ChatTemplate chat_template = text::ChatTemplate::parse(source);
    text::ChatTemplateOptions options;
    options.tools = tools;
    options.bos_token = "<s>";
    options.eos_token = "</s>";
    options.now = 1768478400;
    options.max_steps = 200000;  // enough for every real template, fast enough to fuzz
    options.max_output_bytes = 1 << 20;
    for (const bool generation_prompt : {false, true}) {
      options.add_generation_prompt = generation_prompt;
      try {
        (void)chat_template.render(messages, options);
      } catch (const ConfigError&) {
        // refused: a bound, an unsupported construct, the template's raise_exception
      }
    }
  });
  return 0;
}
