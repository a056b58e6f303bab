// dissect/text/chat_template_gguf.hpp — the chat templates a GGUF file carries
// (tokenizer.chat_template, tokenizer.chat_template.<name>), and find_chat_templates for any
// model path, GGUF files included. Separate from chat_template.hpp because the GGUF reader
// brings the tensor headers with it; the renderer alone stays cheap to compile.
#pragma once

#include <filesystem>
#include <string>

#include "dissect/io/gguf.hpp"
#include "dissect/text/chat_template.hpp"

namespace dissect::text {

/// llama.cpp's keys: tokenizer.chat_template is the default, tokenizer.chat_templates lists the
/// names of the others (tokenizer.chat_template.<name>); BOS and EOS are the texts of
/// tokenizer.ggml.bos_token_id and eos_token_id in tokenizer.ggml.tokens.
/// @throws FormatError naming the file and key for a value of the wrong type.
inline ChatTemplateFiles read_gguf_templates(const GgufFile& file) {
  ChatTemplateFiles files;
  files.origin = file.path().string();
  if (file.find("tokenizer.chat_template")) {
    files.templates.emplace_back("default", file.require_string("tokenizer.chat_template"));
  }
  if (file.find("tokenizer.chat_templates")) {
    for (const GgufValue& name : file.require_array("tokenizer.chat_templates")) {
      const std::string* text = name.as_string();
      if (!text)
        throw FormatError(concat(files.origin, ": tokenizer.chat_templates holds a non-string"));
      files.templates.emplace_back(*text, file.require_string("tokenizer.chat_template." + *text));
    }
  }
  const GgufValue* tokens = file.find("tokenizer.ggml.tokens");
  auto token_text = [&](const char* key) -> std::optional<std::string> {
    const GgufValue* id = file.find(key);
    if (!id || !tokens || !tokens->as_array()) return std::nullopt;
    const auto index = id->as_unsigned();
    if (!index || *index >= tokens->as_array()->size())
      throw FormatError(concat(files.origin, ": ", key, " ", id->describe(),
                               " is not an index into tokenizer.ggml.tokens"));
    const std::string* text = (*tokens->as_array())[static_cast<std::size_t>(*index)].as_string();
    if (!text)
      throw FormatError(concat(files.origin, ": tokenizer.ggml.tokens holds a non-string"));
    return *text;
  };
  files.bos_token = token_text("tokenizer.ggml.bos_token_id");
  files.eos_token = token_text("tokenizer.ggml.eos_token_id");
  return files;
}

/// find_chat_templates, and a GGUF file's templates (a GGUF file known by its magic, whatever its
/// name: is_gguf_file). @throws ConfigError if the file carries no chat template.
inline ChatTemplateFiles find_model_chat_templates(const std::filesystem::path& path) {
  if (!is_gguf_file(path)) return find_chat_templates(path);
  ChatTemplateFiles files = read_gguf_templates(GgufFile(path));
  if (files.templates.empty())
    throw ConfigError(concat(files.origin, ": no chat template (no tokenizer.chat_template key)"));
  return files;
}

}  // namespace dissect::text
