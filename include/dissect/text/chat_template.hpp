// dissect/text/chat_template.hpp — a model's chat template: messages in, the prompt text out,
// equal character for character to what transformers' apply_chat_template renders.
//
// Chat templates are Jinja2 programs. This renders the subset real templates use (Llama 3 and
// 3.1, Qwen 3, Gemma 3, DeepSeek V3, gpt-oss, the [INST] family; tests/reference/chat_templates
// lists them) with Jinja2's semantics as transformers configures it: trim_blocks, lstrip_blocks,
// the loopcontrols extension, transformers' tojson, raise_exception and strftime_now. A template
// using anything else is refused with a ConfigError naming it and its line — never rendered
// differently. Templates come from tokenizer_config.json, chat_template.jinja or GGUF metadata.
#pragma once

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include <nlohmann/json.hpp>

#include <ctime>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/detail/jinja_evaluator.hpp"
#include "dissect/text/detail/jinja_lexer.hpp"
#include "dissect/text/detail/jinja_parser.hpp"

namespace dissect::text {

/// A template's own raise_exception("…") (Gemma 3's "Conversation roles must alternate …"):
/// what() is "chat template: line N: raise_exception: <message>", message() the template's text.
struct TemplateRaisedError : ConfigError {
  TemplateRaisedError(std::string message, int line)
      : ConfigError(concat("chat template: line ", line, ": raise_exception: ", message)),
        message_(std::move(message)) {}
  const std::string& message() const { return message_; }

 private:
  std::string message_;
};

/// What a render sees besides the messages, as transformers passes it.
struct ChatTemplateOptions {
  bool add_generation_prompt = false;
  /// The tool definitions (a JSON array), or null: the template then sees `tools` as none.
  nlohmann::ordered_json tools = nullptr;
  /// The tokenizer's special tokens; absent ones are undefined in the template (Qwen 3 has no BOS).
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  /// More variables (an object): enable_thinking, reasoning_effort, unk_token, date_string …
  /// They override the ones above, as keyword arguments to apply_chat_template do.
  nlohmann::ordered_json extra = nlohmann::ordered_json::object();
  /// strftime_now's clock (local time); unset: now.
  std::optional<std::time_t> now;
  /// Bounds on one render; a template past one is a ConfigError.
  std::int64_t max_steps = 10'000'000;
  std::size_t max_output_bytes = 64u << 20;
};

/// A parsed chat template. Parse once, render many times; rendering is const and thread-safe.
class ChatTemplate {
 public:
  /// @throws ConfigError naming the line for a syntax error or a construct the renderer does not
  ///         implement (a tag, filter or test).
  static ChatTemplate parse(std::string_view source);

  /// The prompt for `messages` (a JSON array of {role, content, …}), as
  /// transformers.apply_chat_template(messages, tools=…, add_generation_prompt=…, tokenize=False)
  /// gives it. Key order matters (tojson keeps it): pass ordered_json read from the text.
  /// @throws TemplateRaisedError for the template's raise_exception; ConfigError naming the line
  ///         for what Python would raise (an undefined value used, "a" + 1), what the renderer
  ///         does not implement, or a bound passed.
  std::string render(const nlohmann::ordered_json& messages,
                     const ChatTemplateOptions& options = {}) const;

  const std::string& source() const { return *source_; }

 private:
  std::shared_ptr<const std::string> source_;
  std::shared_ptr<const detail::jinja::Body> body_;
};

/// The chat templates of a model's files and the special tokens its templates see.
struct ChatTemplateFiles {
  /// (name, source), the default one (named "default") first when there is one.
  std::vector<std::pair<std::string, std::string>> templates;
  std::optional<std::string> bos_token;
  std::optional<std::string> eos_token;
  /// Other special tokens transformers passes (unk_token, pad_token …), as strings.
  nlohmann::ordered_json special_tokens = nlohmann::ordered_json::object();
  /// Where the templates were read, for messages.
  std::string origin;

  /// The source of template `name`. @throws ConfigError listing the names there are.
  const std::string& source(std::string_view name = "default") const;
  /// source(name), parsed.
  ChatTemplate parse(std::string_view name = "default") const {
    return ChatTemplate::parse(source(name));
  }
  /// Options carrying the special tokens, ready for render().
  ChatTemplateOptions options() const;
};

/// Reads tokenizer_config.json's chat_template (a string, or a list of {name, template}) and its
/// special tokens (strings or {"content": …} objects); a chat_template.jinja beside it is the
/// default template (transformers reads that file first).
/// @throws FormatError for a file that is not JSON or a chat_template of another shape; Error
///         if it cannot be read.
ChatTemplateFiles read_tokenizer_config_templates(const std::filesystem::path& tokenizer_config);

/// A directory with tokenizer_config.json and/or chat_template.jinja, a tokenizer_config.json
/// or a .jinja file (GGUF files: dissect/text/chat_template_gguf.hpp, which needs the GGUF
/// reader). @throws ConfigError if none of them carries a template.
ChatTemplateFiles find_chat_templates(const std::filesystem::path& path);

}  // namespace dissect::text

#include "dissect/text/detail/chat_template_impl.hpp"
