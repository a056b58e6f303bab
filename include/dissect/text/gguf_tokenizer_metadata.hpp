// dissect/text/gguf_tokenizer_metadata.hpp — a Hugging Face tokenizer.json (with the
// tokenizer_config.json beside it) as the tokenizer.ggml.* metadata of a GGUF file, the way
// llama.cpp's converter writes it, so that llama.cpp — and tokenizer_from_gguf — tokenize as
// the original does.
//
//   dissect::GgufModelOptions options;
//   options.tokenizer = dissect::text::gguf_tokenizer_metadata("llama-dir/tokenizer.json");
//   dissect::save_gguf_model("model.gguf", model, options);
//
// Two kinds of tokenizer.json have a GGUF form:
// - byte-level BPE (GPT-2's ByteLevel pre-tokenizer, or a Split by LLaMA 3's or Qwen 2's
//   expression before it): tokenizer.ggml.model "gpt2", its merges, and tokenizer.ggml.pre
//   "gpt-2", "llama-bpe" or "qwen2" — the names llama.cpp gives those expressions;
// - SentencePiece's BPE with byte fallback (LLaMA 2: ▁ for spaces, <0xNN> byte tokens):
//   tokenizer.ggml.model "llama", with scores, which tokenizer.json does not have: a token made
//   by a merge scores −(1 + the merge's rank), any other 0 for special and byte tokens and −10⁹
//   for the rest, so that merging by score (SentencePiece's order) follows the merges.
// Added tokens become control (special) or user-defined tokens; <0xNN> tokens byte tokens; the
// unk_token an unknown one; ids no token holds "[PAD<id>]" unused ones, as llama.cpp's
// converter fills them. BOS and EOS are tokenizer_config.json's bos_token and eos_token (else
// the post-processor's first special token is BOS); add_bos_token / add_eos_token are the
// config's, or (BOS) whether the post-processor's template puts a token first, and are left out
// when neither says, so that llama.cpp's default for the model applies. A normalizer other than
// SentencePiece's (NFC, say) is dropped, as llama.cpp's converter drops it: llama.cpp does not
// normalize.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/io/json.hpp"

namespace dissect::text {

namespace detail {

// The Split patterns of tokenizer.json files that llama.cpp knows by a tokenizer.ggml.pre name.
inline constexpr std::pair<std::string_view, std::string_view> gguf_pre_names[] = {
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "llama-bpe"},
    {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
     "qwen2"},
};

inline std::string read_whole_file(const std::filesystem::path& path, std::string_view op) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(concat(op, ": cannot read ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  return std::move(text).str();
}

// tokenizer.ggml.pre for a byte-level tokenizer.json's pre_tokenizer, or nothing.
inline std::optional<std::string> gguf_pre_name(const nlohmann::json& pre) {
  if (!pre.is_object()) return std::nullopt;
  const std::string type = pre.value("type", "");
  if (type == "ByteLevel") {
    if (pre.value("use_regex", true)) return "gpt-2";
    return std::nullopt;
  }
  if (type != "Sequence" || !pre.contains("pretokenizers")) return std::nullopt;
  const nlohmann::json& steps = pre["pretokenizers"];
  if (!steps.is_array() || steps.size() != 2) return std::nullopt;
  const nlohmann::json &split = steps[0], &bytes = steps[1];
  if (!split.is_object() || !bytes.is_object() || split.value("type", "") != "Split" ||
      bytes.value("type", "") != "ByteLevel" || bytes.value("use_regex", true))
    return std::nullopt;
  if (!split.contains("pattern") || !split["pattern"].is_object() ||
      !split["pattern"].contains("Regex") || !split["pattern"]["Regex"].is_string())
    return std::nullopt;
  const std::string pattern = split["pattern"]["Regex"].get<std::string>();
  for (const auto& [known, name] : gguf_pre_names) {
    if (pattern == known) return std::string(name);
  }
  return std::nullopt;
}

// A bos_token / eos_token of tokenizer_config.json: a string, {"content": ...}, or null.
inline std::optional<std::string> config_token_text(const nlohmann::json& config, const char* key) {
  const auto found = config.find(key);
  if (found == config.end() || found->is_null()) return std::nullopt;
  if (found->is_string()) return found->get<std::string>();
  if (found->is_object() && found->contains("content") && (*found)["content"].is_string())
    return (*found)["content"].get<std::string>();
  return std::nullopt;
}

}  // namespace detail

/// The tokenizer.ggml.* entries for the tokenizer.json at `path` (see the top). With
/// `vocab_size` (the model's embedding rows) the token list is padded to it with unused
/// "[PAD<id>]" tokens, as llama.cpp's converter pads it: llama.cpp wants one token per row.
/// @throws ConfigError naming the file for a tokenizer with no GGUF form (not BPE, a
///         pre-tokenizer llama.cpp has no name for) or more tokens than `vocab_size`;
///         FormatError for malformed JSON or a BOS/EOS that is not a token; Error if it cannot
///         be read.
inline std::vector<std::pair<std::string, GgufValue>> gguf_tokenizer_metadata(
    const std::filesystem::path& path, std::optional<index_t> vocab_size = std::nullopt) {
  const std::string source = path.string();
  const nlohmann::json root = dissect::io::parse_json_strictly(
      detail::read_whole_file(path, "gguf_tokenizer_metadata"), source);
  const auto fail = [&](const std::string& what) {
    throw ConfigError(concat("gguf_tokenizer_metadata: ", source, ": ", what));
  };
  if (!root.is_object() || !root.contains("model") || !root["model"].is_object())
    throw FormatError(concat("gguf_tokenizer_metadata: ", source, ": no \"model\" object"));
  const nlohmann::json& model = root["model"];
  if (model.value("type", "BPE") != "BPE")
    fail(concat("model ", quote_file_text(model.value("type", "")),
                " has no GGUF form here (BPE only)"));
  if (!model.contains("vocab") || !model["vocab"].is_object() || !model.contains("merges") ||
      !model["merges"].is_array())
    throw FormatError(
        concat("gguf_tokenizer_metadata: ", source, ": model needs vocab and merges"));
  const bool byte_fallback = model.value("byte_fallback", false);
  const nlohmann::json pre = root.contains("pre_tokenizer") ? root["pre_tokenizer"] : nullptr;
  std::string ggml_model = "gpt2", pre_name;
  if (byte_fallback && pre.is_null()) {
    ggml_model = "llama";
  } else if (const auto name = detail::gguf_pre_name(pre)) {
    pre_name = *name;
  } else {
    fail(concat("pre_tokenizer ", pre.dump().substr(0, 200),
                " is not one llama.cpp names (GPT-2's ByteLevel, LLaMA 3's or Qwen 2's Split)"));
  }

  std::map<std::int64_t, std::string> by_id;
  std::map<std::int64_t, bool> added;  // id → special
  for (const auto& [token, id] : model["vocab"].items()) {
    if (!id.is_number_integer() || id.get<std::int64_t>() < 0 || id.get<std::int64_t>() > (1 << 30))
      throw FormatError(concat("gguf_tokenizer_metadata: ", source, ": vocab[",
                               quote_file_text(token), "] is not an id"));
    by_id[id.get<std::int64_t>()] = token;
  }
  if (root.contains("added_tokens") && root["added_tokens"].is_array()) {
    for (const auto& token : root["added_tokens"]) {
      if (!token.is_object() || !token.contains("id") || !token["id"].is_number_integer() ||
          token["id"].get<std::int64_t>() < 0 || token["id"].get<std::int64_t>() > (1 << 30) ||
          !token.contains("content") || !token["content"].is_string())
        throw FormatError(concat("gguf_tokenizer_metadata: ", source, ": malformed added token"));
      by_id[token["id"].get<std::int64_t>()] = token["content"].get<std::string>();
      added[token["id"].get<std::int64_t>()] = token.value("special", false);
    }
  }
  if (by_id.empty()) throw FormatError(concat("gguf_tokenizer_metadata: ", source, ": no tokens"));
  std::int64_t n = by_id.rbegin()->first + 1;
  if (vocab_size) {
    if (n > *vocab_size) {
      fail(concat("its ", n, " token ids do not fit the model's vocabulary of ", *vocab_size));
    }
    n = *vocab_size;
  }
  std::map<std::string, std::int64_t, std::less<>> id_of;
  for (const auto& [id, token] : by_id) id_of[token] = id;

  std::vector<std::string> merges;
  merges.reserve(model["merges"].size());
  for (const auto& merge : model["merges"]) {
    if (merge.is_string()) {
      merges.push_back(merge.get<std::string>());
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() &&
               merge[1].is_string()) {
      merges.push_back(merge[0].get<std::string>() + " " + merge[1].get<std::string>());
    } else {
      throw FormatError(concat("gguf_tokenizer_metadata: ", source, ": malformed merge"));
    }
  }
  std::map<std::int64_t, std::size_t> first_rank;  // id → rank of the first merge making it
  if (ggml_model == "llama") {
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string& line = merges[rank];
      const std::size_t space = line.size() > 1 ? line.find(' ', 1) : std::string::npos;
      if (space == std::string::npos) continue;
      const auto made = id_of.find(line.substr(0, space) + line.substr(space + 1));
      if (made != id_of.end()) first_rank.emplace(made->second, rank);
    }
  }
  const std::optional<std::string> unk =
      model.contains("unk_token") && model["unk_token"].is_string()
          ? std::optional<std::string>(model["unk_token"].get<std::string>())
          : std::nullopt;
  const auto is_byte_token = [&](const std::string& token) {
    return byte_fallback && token.size() == 6 && token.rfind("<0x", 0) == 0 && token[5] == '>';
  };
  GgufValue::Array tokens, types, scores;
  for (std::int64_t id = 0; id < n; ++id) {
    const auto found = by_id.find(id);
    const std::string token = found == by_id.end() ? concat("[PAD", id, ']') : found->second;
    std::int32_t type = 1;  // normal
    if (found == by_id.end()) {
      type = 5;  // unused
    } else if (const auto a = added.find(id); a != added.end()) {
      type = a->second ? 3 : 4;            // control, user-defined
      if (unk && *unk == token) type = 2;  // unknown
    } else if (is_byte_token(token)) {
      type = 6;  // byte
    }
    float score = 0.0f;
    if (const auto r = first_rank.find(id); r != first_rank.end()) {
      score = -1.0f - static_cast<float>(r->second);
    } else if (type == 1 && ggml_model == "llama" && token.size() > 1) {
      score = -1e9f;
    }
    tokens.emplace_back(token);
    types.emplace_back(type);
    scores.emplace_back(score);
  }

  // BOS, EOS and add_bos_token: tokenizer_config.json first, then the post-processor.
  std::optional<std::string> bos, eos;
  std::optional<bool> add_bos, add_eos;
  const std::filesystem::path config_path = path.parent_path() / "tokenizer_config.json";
  std::error_code error;
  if (std::filesystem::is_regular_file(config_path, error)) {
    const nlohmann::json config = dissect::io::parse_json_strictly(
        detail::read_whole_file(config_path, "gguf_tokenizer_metadata"), config_path.string());
    if (config.is_object()) {
      bos = detail::config_token_text(config, "bos_token");
      eos = detail::config_token_text(config, "eos_token");
      if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean())
        add_bos = config["add_bos_token"].get<bool>();
      if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean())
        add_eos = config["add_eos_token"].get<bool>();
    }
  }
  // The post-processor's template (alone or in a Sequence), if it has one: whether it puts a
  // token first, and which.
  std::optional<std::string> leading;
  bool has_template = false;
  const auto read_template = [&](const nlohmann::json& post) {
    if (!post.is_object() || post.value("type", "") != "TemplateProcessing") return;
    has_template = true;
    if (post.contains("single") && post["single"].is_array() && !post["single"].empty() &&
        post["single"][0].is_object() && post["single"][0].contains("SpecialToken") &&
        post["single"][0]["SpecialToken"].is_object() &&
        post["single"][0]["SpecialToken"].contains("id") &&
        post["single"][0]["SpecialToken"]["id"].is_string())
      leading = post["single"][0]["SpecialToken"]["id"].get<std::string>();
  };
  if (root.contains("post_processor")) {
    const nlohmann::json& post = root["post_processor"];
    read_template(post);
    if (post.is_object() && post.value("type", "") == "Sequence" && post.contains("processors") &&
        post["processors"].is_array()) {
      for (const auto& step : post["processors"]) read_template(step);
    }
  }
  if (!bos) bos = leading;
  if (!add_bos && has_template) add_bos = leading.has_value();

  std::vector<std::pair<std::string, GgufValue>> out{{"tokenizer.ggml.model", ggml_model}};
  if (ggml_model == "gpt2") out.push_back({"tokenizer.ggml.pre", pre_name});
  out.push_back({"tokenizer.ggml.tokens", GgufValue::array(GgufType::string, std::move(tokens))});
  if (ggml_model == "llama")
    out.push_back({"tokenizer.ggml.scores", GgufValue::array(GgufType::f32, std::move(scores))});
  out.push_back({"tokenizer.ggml.token_type", GgufValue::array(GgufType::i32, std::move(types))});
  if (ggml_model == "gpt2") {
    GgufValue::Array lines(merges.begin(), merges.end());
    out.push_back({"tokenizer.ggml.merges", GgufValue::array(GgufType::string, std::move(lines))});
  }
  const auto id_entry = [&](const char* key, const std::optional<std::string>& token,
                            const char* config_key) {
    if (!token) return;
    const auto found = id_of.find(*token);
    if (found == id_of.end()) {
      throw FormatError(concat("gguf_tokenizer_metadata: ", source, ": ", config_key, " ",
                               quote_file_text(*token), " is not a token of the tokenizer"));
    }
    out.push_back({key, static_cast<std::uint32_t>(found->second)});
  };
  id_entry("tokenizer.ggml.bos_token_id", bos, "bos_token");
  id_entry("tokenizer.ggml.eos_token_id", eos, "eos_token");
  // Said only when the files say it: otherwise llama.cpp's default for the model applies
  // (SentencePiece and LLaMA 3's expression: BOS; the others: none), as its converter leaves it.
  if (add_bos && *add_bos && !bos) {
    throw FormatError(concat("gguf_tokenizer_metadata: ", source,
                             ": add_bos_token is true, but there is no bos_token"));
  }
  if (add_eos && *add_eos && !eos) {
    throw FormatError(concat("gguf_tokenizer_metadata: ", source,
                             ": add_eos_token is true, but there is no eos_token"));
  }
  if (add_bos) out.push_back({"tokenizer.ggml.add_bos_token", *add_bos});
  if (add_eos) out.push_back({"tokenizer.ggml.add_eos_token", *add_eos});
  return out;
}

}  // namespace dissect::text
