// dissect/text/detail/chat_template_impl.hpp — private: do not include directly
// (dissect/text/chat_template.hpp does).
//
// ChatTemplate's parse and render, and the readers of tokenizer_config.json and
// chat_template.jinja.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/chat_template_impl.hpp is private to dissect: include dissect/text/chat_template.hpp instead"
#endif

#include <fstream>
#include <sstream>

#include "dissect/io/json.hpp"

namespace dissect::text {

inline ChatTemplate ChatTemplate::parse(std::string_view source) {
  ChatTemplate result;
  result.source_ = std::make_shared<const std::string>(source);
  detail::jinja::Lexer lexer(source);
  detail::jinja::Parser parser(lexer.run());
  result.body_ = std::make_shared<const detail::jinja::Body>(parser.parse());
  return result;
}

inline std::string ChatTemplate::render(const nlohmann::ordered_json& messages,
                                        const ChatTemplateOptions& options) const {
  namespace jinja = detail::jinja;
  if (!messages.is_array())
    throw ConfigError(
        concat("ChatTemplate::render: messages must be a JSON array, not ", messages.type_name()));
  if (!options.extra.is_object() && !options.extra.is_null())
    throw ConfigError("ChatTemplate::render: extra must be a JSON object");
  jinja::Frame root;
  try {
    root.set("messages", jinja::from_json(messages));
    root.set("tools", jinja::from_json(options.tools));
    root.set("documents", jinja::Value::none());
    root.set("add_generation_prompt", jinja::Value::from_bool(options.add_generation_prompt));
    if (options.bos_token) root.set("bos_token", jinja::Value::from_string(*options.bos_token));
    if (options.eos_token) root.set("eos_token", jinja::Value::from_string(*options.eos_token));
    if (options.extra.is_object())
      for (const auto& [key, value] : options.extra.items()) root.set(key, jinja::from_json(value));
    jinja::RenderLimits limits;
    limits.max_steps = options.max_steps;
    limits.max_string_bytes = options.max_output_bytes;
    jinja::Evaluator evaluator(limits, options.now);
    return evaluator.render(*body_, root);
  } catch (const jinja::Raised& raised) {
    throw TemplateRaisedError(raised.message, raised.line);
  } catch (const jinja::RuntimeFailure& failure) {
    throw ConfigError(concat("chat template: ", failure.message));
  }
}

inline const std::string& ChatTemplateFiles::source(std::string_view name) const {
  for (const auto& [key, text] : templates)
    if (key == name) return text;
  std::string names;
  for (const auto& [key, text] : templates) names += (names.empty() ? "" : ", ") + key;
  throw ConfigError(concat(origin, ": no chat template named \"", name,
                           "\" (there are: ", names.empty() ? "none" : names, ")"));
}

inline ChatTemplateOptions ChatTemplateFiles::options() const {
  ChatTemplateOptions options;
  options.bos_token = bos_token;
  options.eos_token = eos_token;
  options.extra = special_tokens;
  return options;
}

namespace detail {

inline std::string read_text_file(const std::filesystem::path& path, std::string_view operation) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(concat(operation, ": cannot read ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(concat(operation, ": cannot read ", path.string()));
  return text.str();
}

/// A special token as tokenizer_config.json writes it: "<s>" or {"content": "<s>", …}.
inline std::optional<std::string> special_token_text(const nlohmann::json& config,
                                                     const std::string& key,
                                                     const std::string& where) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    const auto content = it->find("content");
    if (content != it->end() && content->is_string()) return content->get<std::string>();
  }
  throw FormatError(concat(where, ": ", key, " is ", io::describe_json(*it),
                           ", not a string or an object with a string \"content\""));
}

}  // namespace detail

inline ChatTemplateFiles read_tokenizer_config_templates(
    const std::filesystem::path& tokenizer_config) {
  const std::string where = tokenizer_config.string();
  const nlohmann::json config = io::parse_json_strictly(
      detail::read_text_file(tokenizer_config, "read_tokenizer_config_templates"), where);
  if (!config.is_object())
    throw FormatError(
        concat(where, ": the file is ", io::describe_json(config), ", not an object"));
  ChatTemplateFiles files;
  files.origin = where;
  if (const auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      files.templates.emplace_back("default", it->get<std::string>());
    } else if (it->is_array()) {
      for (std::size_t i = 0; i < it->size(); ++i) {
        const nlohmann::json& entry = (*it)[i];
        if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
            !entry.contains("template") || !entry["template"].is_string())
          throw FormatError(concat(where, ": chat_template[", i, "] is ", io::describe_json(entry),
                                   ", not {\"name\": string, \"template\": string}"));
        files.templates.emplace_back(entry["name"].get<std::string>(),
                                     entry["template"].get<std::string>());
      }
      std::stable_partition(files.templates.begin(), files.templates.end(),
                            [](const auto& t) { return t.first == "default"; });
    } else {
      throw FormatError(concat(where, ": chat_template is ", io::describe_json(*it),
                               ", not a string or a list of {name, template}"));
    }
  }
  files.bos_token = detail::special_token_text(config, "bos_token", where);
  files.eos_token = detail::special_token_text(config, "eos_token", where);
  for (const char* key : {"unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (auto text = detail::special_token_text(config, key, where))
      files.special_tokens[key] = *text;
  }
  if (const auto it = config.find("additional_special_tokens");
      it != config.end() && it->is_array() && !it->empty()) {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < it->size(); ++i) {
      nlohmann::json holder = {{"token", (*it)[i]}};
      list.push_back(*detail::special_token_text(
          holder, "token", concat(where, ": additional_special_tokens[", i, "]")));
    }
    files.special_tokens["additional_special_tokens"] = std::move(list);
  }
  // transformers reads chat_template.jinja first: it is the default template when present.
  const std::filesystem::path beside = tokenizer_config.parent_path() / "chat_template.jinja";
  std::error_code ec;
  if (std::filesystem::is_regular_file(beside, ec)) {
    std::erase_if(files.templates, [](const auto& t) { return t.first == "default"; });
    files.templates.emplace(files.templates.begin(), "default",
                            detail::read_text_file(beside, "read_tokenizer_config_templates"));
  }
  return files;
}

inline ChatTemplateFiles find_chat_templates(const std::filesystem::path& path) {
  std::error_code ec;
  ChatTemplateFiles files;
  if (std::filesystem::is_directory(path, ec)) {
    const auto config = path / "tokenizer_config.json";
    const auto jinja = path / "chat_template.jinja";
    if (std::filesystem::is_regular_file(config, ec)) {
      files = read_tokenizer_config_templates(config);
    } else if (std::filesystem::is_regular_file(jinja, ec)) {
      files.origin = jinja.string();
      files.templates.emplace_back("default", detail::read_text_file(jinja, "find_chat_templates"));
    } else {
      throw ConfigError(concat("find_chat_templates: ", path.string(),
                               " has neither tokenizer_config.json nor chat_template.jinja"));
    }
  } else if (path.extension() == ".jinja") {
    files.origin = path.string();
    files.templates.emplace_back("default", detail::read_text_file(path, "find_chat_templates"));
  } else if (path.extension() == ".json") {
    files = read_tokenizer_config_templates(path);
  } else if (!std::filesystem::exists(path, ec)) {
    throw Error(concat("find_chat_templates: ", path.string(), " does not exist"));
  } else {
    throw ConfigError(concat("find_chat_templates: ", path.string(),
                             " is not a directory, a tokenizer_config.json or a .jinja file"));
  }
  if (files.templates.empty())
    throw ConfigError(concat(files.origin,
                             ": no chat template (no chat_template key and no "
                             "chat_template.jinja beside it)"));
  return files;
}

}  // namespace dissect::text
