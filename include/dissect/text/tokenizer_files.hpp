// dissect/text/tokenizer_files.hpp — a tokenizer from the files a model comes with: a
// tokenizer.json (and the tokenizer_config.json beside it, for BOS and EOS), GPT-2's vocab.json
// + merges.txt, or a checkpoint directory holding either.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

#include "dissect/core/error.hpp"
#include "dissect/io/json.hpp"
#include "dissect/text/tokenizer.hpp"

namespace dissect::text {

/// The metadata key under which a safetensors checkpoint may carry its tokenizer.json whole
/// (examples/train_gpt.cpp --tokenizer bpe:N writes it); tokenizer_for reads it first.
inline constexpr const char* tokenizer_json_key = "dissect.tokenizer_json";

/// The whole of a file. @throws Error "<op>: cannot read <path>".
inline std::string read_text_file(const std::filesystem::path& path, std::string_view op) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(concat(op, ": cannot read ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(concat(op, ": cannot read ", path.string()));
  return std::move(text).str();
}

/// Whether `dir` holds a tokenizer load_tokenizer can read.
inline bool has_tokenizer(const std::filesystem::path& dir) {
  std::error_code error;
  return std::filesystem::is_regular_file(dir / "tokenizer.json", error) ||
         (std::filesystem::is_regular_file(dir / "vocab.json", error) &&
          std::filesystem::is_regular_file(dir / "merges.txt", error));
}

namespace detail {

// bos_token / eos_token of a tokenizer_config.json: a string, an AddedToken object
// ({"content": ...}), or null.
inline std::optional<std::int32_t> config_token(const Tokenizer& tokenizer,
                                                const nlohmann::json& config, const char* key,
                                                const std::string& source) {
  const auto found = config.find(key);
  if (found == config.end() || found->is_null()) return std::nullopt;
  std::string content;
  if (found->is_string()) {
    content = found->get<std::string>();
  } else if (found->is_object() && found->contains("content") && (*found)["content"].is_string()) {
    content = (*found)["content"].get<std::string>();
  } else {
    throw FormatError(concat(source, ": ", key, " must be a string or {\"content\": ...}, not ",
                             dissect::io::describe_json(*found)));
  }
  const auto id = tokenizer.token_to_id(content);
  if (!id)
    throw FormatError(
        concat(source, ": ", key, " \"", content, "\" is not a token of the tokenizer"));
  return id;
}

}  // namespace detail

/// A tokenizer.json; a tokenizer_config.json beside it names BOS and EOS.
/// @throws Error if it cannot be read, FormatError / ConfigError as Tokenizer::from_json.
inline Tokenizer load_tokenizer_json(const std::filesystem::path& path) {
  Tokenizer tokenizer = Tokenizer::from_json(read_text_file(path, "load_tokenizer"), path.string());
  const auto config_path = path.parent_path() / "tokenizer_config.json";
  std::error_code error;
  if (std::filesystem::is_regular_file(config_path, error)) {
    const std::string source = config_path.string();
    const nlohmann::json config =
        dissect::io::parse_json_strictly(read_text_file(config_path, "load_tokenizer"), source);
    if (!config.is_object()) throw FormatError(concat(source, ": must be a JSON object"));
    auto bos = detail::config_token(tokenizer, config, "bos_token", source);
    auto eos = detail::config_token(tokenizer, config, "eos_token", source);
    tokenizer.set_bos_eos(bos ? bos : tokenizer.bos_id(), eos ? eos : tokenizer.eos_id());
  }
  return tokenizer;
}

/// A tokenizer from `path`: a tokenizer.json file, or a directory holding tokenizer.json (read
/// first) or GPT-2's vocab.json and merges.txt.
/// @throws Error naming the path when there is none there.
inline Tokenizer load_tokenizer(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::is_regular_file(path, error)) return load_tokenizer_json(path);
  if (std::filesystem::is_regular_file(path / "tokenizer.json", error))
    return load_tokenizer_json(path / "tokenizer.json");
  if (std::filesystem::is_regular_file(path / "vocab.json", error) &&
      std::filesystem::is_regular_file(path / "merges.txt", error)) {
    const auto vocab = path / "vocab.json", merges = path / "merges.txt";
    return Tokenizer::from_gpt2_files(read_text_file(vocab, "load_tokenizer"), vocab.string(),
                                      read_text_file(merges, "load_tokenizer"), merges.string());
  }
  throw Error(concat("load_tokenizer: ", path.string(),
                     " is not a tokenizer.json, nor a directory holding "
                     "tokenizer.json or vocab.json + merges.txt"));
}

}  // namespace dissect::text
