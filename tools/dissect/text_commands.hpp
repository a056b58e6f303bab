// tools/dissect/text_commands.hpp — the `dissect` command's use of tokenizers: `dissect tokenize`,
// the tokenizer a checkpoint directory comes with (for `generate --prompt` and `inspect`), and
// how it is reported. The tokenizer itself is the library's (dissect/text/); this reads flags
// and prints.
//
//   dissect tokenize (--tokenizer FILE | DIR) (--text T | --file F | --decode 1,2,3)
//                    [--no-special] [--json]
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

/// The tokenizer of a checkpoint: the tokenizer.json its metadata carries (train_gpt --tokenizer
/// bpe:N), else the tokenizer files beside it (its directory, or the directory of the file
/// given), or nothing when there are none.
inline std::optional<text::Tokenizer> checkpoint_tokenizer(
    const fs::path& checkpoint, const std::map<std::string, std::string>& metadata) {
  if (const auto carried = metadata.find(tokenizer_json_key); carried != metadata.end()) {
    return text::Tokenizer::from_json(
        carried->second, concat(checkpoint.string(), ": metadata \"", tokenizer_json_key, "\""));
  }
  std::error_code error;
  const fs::path dir = fs::is_directory(checkpoint, error) ? checkpoint : checkpoint.parent_path();
  if (!text::has_tokenizer(dir.empty() ? fs::path(".") : dir)) return std::nullopt;
  return text::load_tokenizer(dir.empty() ? fs::path(".") : dir);
}

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

/// tokenize's flags, each read and checked before any file is opened.
struct TokenizeOptions {
  fs::path
      tokenizer;  ///< a tokenizer.json, or a directory holding one (or vocab.json + merges.txt)
  std::optional<std::string> text;
  std::optional<fs::path> file;
  std::optional<std::string> decode;  ///< ids, as given
  bool no_special = false;
  bool json = false;
};

inline int tokenize(const TokenizeOptions& o) {
  // A GGUF file's own tokenizer (tokenizer.ggml.*), or a Hugging Face one.
  const text::Tokenizer tokenizer = is_gguf_file(o.tokenizer)
                                        ? text::tokenizer_from_gguf(GgufFile(o.tokenizer))
                                        : text::load_tokenizer(o.tokenizer);
  if (o.decode) {
    const auto ids64 =
        parse_token_ids(*o.decode, "--decode", static_cast<index_t>(tokenizer.vocab_size()));
    const std::vector<std::int32_t> ids(ids64.begin(), ids64.end());
    const std::string decoded = tokenizer.decode(ids, o.no_special);
    if (o.json) {
      std::cout << nlohmann::ordered_json{{"ids", ids}, {"text", decoded}}.dump(
                       2, ' ', false, nlohmann::json::error_handler_t::replace)
                << "\n";
    } else {
      std::cout << decoded << "\n";
    }
    return 0;
  }
  const std::string input = o.text ? *o.text : text::read_text_file(*o.file, "--file");
  // The output streams: each id is written as the encoder produces it, and nothing holds them
  // all (reliability.md row 117; `--json` of a 20 MB text once built 11.7 GB of JSON objects).
  // Three passes over the text: the first only counts, so that a text the tokenizer refuses
  // prints nothing on stdout, and gives the count the report starts with; the second writes
  // the ids, the third each token with its offsets. Memory: the text, and per pass its
  // normalized copy with 8 bytes of origin per byte: about 10 bytes per byte of input, whatever
  // the number of tokens.
  const char* const input_flag = o.text ? "--text" : "--file";
  std::size_t count = 0;
  const auto encode = [&](bool offsets, const text::Tokenizer::TokenSink& sink) {
    text::EncodeOptions options;
    options.add_special_tokens = !o.no_special;
    options.offsets = offsets;
    std::size_t produced = 0;
    try {
      tokenizer.encode_each(input, options, [&](std::int32_t id, text::Span span) {
        ++produced;
        sink(id, span);
      });
    } catch (const Error& error) {
      throw ConfigError(concat(input_flag, ": ", error.what()));
    } catch (const std::bad_alloc&) {
      // Exit status 1 with one line (main), never an abort: nothing on the way up allocates.
      throw std::runtime_error(
          concat("tokenize: out of memory encoding the ", input.size(), " bytes of ", input_flag));
    }
    if (count != 0 && produced != count) {
      throw std::logic_error(
          concat("tokenize: the passes disagree: ", produced, " tokens, then ", count));
    }
    count = produced;
  };
  encode(false, [](std::int32_t, text::Span) {});
  std::ostream& out = std::cout;
  const auto write_ids = [&](const char* separator) {
    bool first = true;
    encode(false, [&](std::int32_t id, text::Span) {
      if (!first) out << separator;
      out << id;
      first = false;
    });
  };
  if (o.json) {
    // The layout of nlohmann's dump(2), but the ids on one line.
    std::string about =
        tokenizer_json(tokenizer).dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
    for (std::size_t at = about.find('\n'); at != std::string::npos; at = about.find('\n', at + 3))
      about.insert(at + 1, "  ");
    out << "{\n  \"tokenizer\": " << about << ",\n  \"ids\": [";
    write_ids(", ");
    out << "],\n  \"tokens\": [";
    bool first = true;
    encode(true, [&](std::int32_t id, text::Span span) {
      out << (first ? "\n" : ",\n") << "    {\"id\": " << id
          << ", \"token\": " << quoted_token(tokenizer, id) << ", \"offsets\": [" << span.begin
          << ", " << span.end << "]}";
      first = false;
    });
    out << (first ? "]\n}\n" : "\n  ]\n}\n");
    out.flush();
    return 0;
  }
  out << count << " tokens from " << input.size() << " bytes (" << tokenizer.kind()
      << ", V = " << tokenizer.vocab_size() << ")\n";
  out << "ids     ";
  write_ids(",");
  out << "\npieces  ";
  bool first = true;
  encode(false, [&](std::int32_t id, text::Span) {
    out << (first ? "" : " ") << quoted_token(tokenizer, id);
    first = false;
  });
  out << "\n";
  out.flush();
  return 0;
}

}  // namespace dissect::tools
