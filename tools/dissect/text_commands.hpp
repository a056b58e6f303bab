// tools/dissect/text_commands.hpp — the `dissect` command's use of tokenizers: how one is reported
// (by `inspect` and `tokenize`, whose command is tokenize_command.hpp). The tokenizer, and the one
// a model file comes with (text::tokenizer_for), are the library's (dissect/text/); this prints.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <new>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/decode_stream.hpp"
#include "dissect/text/gguf_tokenizer.hpp"
#include "dissect/text/tokenizer_files.hpp"
#include "tools/common/byte_vocab.hpp"
#include "tools/common/parse.hpp"
#include "tools/dissect/gguf_commands.hpp"

namespace dissect::tools {

namespace fs = std::filesystem;

/// A token as it is printed: its string as the vocabulary writes it, JSON-quoted so that
/// spaces, newlines and byte-level characters stay visible.
inline std::string quoted_token(const text::Tokenizer& tokenizer, std::int32_t id) {
  const auto token = tokenizer.id_to_token(id);
  return token
             ? nlohmann::json(*token).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
             : "?";
}

/// The special tokens of a tokenizer, by content, at most `limit` of them.
inline std::string special_token_list(const text::Tokenizer& tokenizer, std::size_t limit) {
  std::ostringstream out;
  std::size_t shown = 0, total = 0;
  for (const auto& token : tokenizer.added_tokens()) {
    if (!token.special) continue;
    if (shown < limit) out << (shown ? ", " : "") << token.content << " = " << token.id, ++shown;
    ++total;
  }
  if (total > shown) out << ", … (" << total << " in all)";
  return total == 0 ? std::string("none") : out.str();
}

/// One line for `dissect inspect`.
inline std::string tokenizer_summary(const text::Tokenizer& tokenizer) {
  std::ostringstream out;
  out << tokenizer.kind() << ", V = " << tokenizer.vocab_size() << " ("
      << tokenizer.model().merge_count() << " merges, " << tokenizer.added_tokens().size()
      << " added tokens), from " << tokenizer.source();
  const auto name = [&](std::optional<std::int32_t> id) {
    return id ? concat(*tokenizer.id_to_token(*id), " = ", *id) : std::string("none");
  };
  out << "\n            BOS " << name(tokenizer.bos_id()) << ", EOS " << name(tokenizer.eos_id())
      << "; special: " << special_token_list(tokenizer, 6);
  return out.str();
}

inline nlohmann::ordered_json tokenizer_json(const text::Tokenizer& tokenizer) {
  nlohmann::ordered_json out{
      {"source", tokenizer.source()},
      {"kind", tokenizer.kind()},
      {"vocab_size", tokenizer.vocab_size()},
      {"merges", tokenizer.model().merge_count()},
      {"bos_id", tokenizer.bos_id() ? nlohmann::ordered_json(*tokenizer.bos_id()) : nullptr},
      {"eos_id", tokenizer.eos_id() ? nlohmann::ordered_json(*tokenizer.eos_id()) : nullptr}};
  auto& specials = out["special_tokens"] = nlohmann::ordered_json::array();
  for (const auto& token : tokenizer.added_tokens()) {
    if (token.special) specials.push_back({{"id", token.id}, {"content", token.content}});
  }
  return out;
}

}  // namespace dissect::tools
