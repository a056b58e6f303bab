// tools/dissect/template_command.hpp — `dissect template`: a conversation through a model's chat
// template, printed exactly as the model will read it (no newline added), so that a prompt can be
// checked against transformers' apply_chat_template(…, tokenize=False) byte for byte.
//
//   dissect template MODEL_OR_TOKENIZER --messages FILE.json [--add-generation-prompt]
//                    [--tools FILE.json] [--template NAME] [--var KEY=VALUE]…
//
// MODEL_OR_TOKENIZER: a directory with tokenizer_config.json or chat_template.jinja, a
// tokenizer_config.json, a .jinja file or a .gguf file. FILE.json: a JSON array of messages, or
// an object with "messages" (and "tools"), as a chat completion request carries them. --var sets
// a template variable (enable_thinking=false, reasoning_effort="high"): VALUE is JSON, or else a
// string. Every error — the template's own raise_exception included — is one line, exit 2.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/json.hpp"
#include "dissect/text/chat_template.hpp"
#include "dissect/text/chat_template_gguf.hpp"
#include "tools/dissect/command.hpp"

namespace dissect::tools {

struct TemplateOptions {
  std::filesystem::path model;
  std::filesystem::path messages;
  std::optional<std::filesystem::path> tools;
  bool add_generation_prompt = false;
  std::string name = "default";
  std::vector<std::string> vars;
};

/// A JSON file read as the library reads JSON (a repeated key refused), keeping its key order,
/// which tojson prints.
inline nlohmann::ordered_json read_ordered_json(const std::filesystem::path& path,
                                                std::string_view flag) {
  const std::string where = concat(flag, " ", path.string());
  const std::string text = text::detail::read_text_file(path, flag);
  (void)io::parse_json_strictly(text, where);
  return nlohmann::ordered_json::parse(text);
}

/// Renders and prints; the text goes out only once the whole render succeeded.
inline int chat_template_command(const TemplateOptions& options) {
  try {
    const text::ChatTemplateFiles files = text::find_model_chat_templates(options.model);
    const text::ChatTemplate chat_template = files.parse(options.name);
    nlohmann::ordered_json request = read_ordered_json(options.messages, "--messages");
    nlohmann::ordered_json messages = request;
    text::ChatTemplateOptions render_options = files.options();
    if (request.is_object() && request.contains("messages")) {
      messages = request["messages"];
      if (request.contains("tools")) render_options.tools = request["tools"];
    }
    if (!messages.is_array())
      throw ConfigError(
          concat("--messages ", options.messages.string(),
                 ": expected a JSON array of messages or an object with \"messages\""));
    if (options.tools) {
      render_options.tools = read_ordered_json(*options.tools, "--tools");
      if (!render_options.tools.is_array() && !render_options.tools.is_null())
        throw ConfigError(concat("--tools ", options.tools->string(), ": expected a JSON array"));
    }
    render_options.add_generation_prompt = options.add_generation_prompt;
    for (const std::string& var : options.vars) {
      const std::size_t equals = var.find('=');
      if (equals == std::string::npos || equals == 0)
        throw ConfigError(concat("--var: expected KEY=VALUE, got \"", var, "\""));
      const std::string key = var.substr(0, equals);
      const std::string value = var.substr(equals + 1);
      nlohmann::ordered_json parsed = nlohmann::ordered_json::parse(value, nullptr, false);
      render_options.extra[key] = parsed.is_discarded() ? nlohmann::ordered_json(value) : parsed;
    }
    const std::string prompt = chat_template.render(messages, render_options);
    std::cout << prompt << std::flush;
    return 0;
  } catch (const Error& error) {
    // One line whatever the template's message holds.
    std::string message = concat("template: ", error.what());
    for (std::size_t at = message.find('\n'); at != std::string::npos;
         at = message.find('\n', at + 2))
      message.replace(at, 1, "\\n");
    throw ConfigError(message);
  }
}

/// `dissect template` and its flags.
class TemplateCommand final : public Command {
 public:
  explicit TemplateCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "template",
            "render a conversation through the model's chat template (prints it exactly)")) {
    CLI::App* template_command = &this->app();
    template_command
        ->add_option("model", options_.model,
                     "a directory with tokenizer_config.json or chat_template.jinja, a "
                     "tokenizer_config.json, a .jinja or a .gguf file")
        ->required();
    template_command
        ->add_option("--messages", options_.messages,
                     "a JSON array of {role, content, ...}, or an object with \"messages\"")
        ->required();
    template_command->add_option("--tools", options_.tools, "a JSON array of tool definitions");
    template_command->add_flag("--add-generation-prompt", options_.add_generation_prompt,
                               "end with the assistant's turn header");
    template_command->add_option("--template", options_.name,
                                 "a named template of tokenizer_config.json (default: default)");
    template_command->add_option("--var", options_.vars,
                                 "KEY=VALUE: a template variable (VALUE as JSON, else a string), "
                                 "e.g. enable_thinking=false");
  }

  int run() override { return chat_template_command(options_); }

 private:
  TemplateOptions options_;
};

}  // namespace dissect::tools
