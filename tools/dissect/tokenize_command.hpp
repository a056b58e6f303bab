// tools/dissect/tokenize_command.hpp — `dissect tokenize`: text to token ids and pieces, or ids to
// text, with a Hugging Face tokenizer or a GGUF file's own. The tokenizer is the library's
// (dissect/text/); this reads flags and prints.
//
//   dissect tokenize --tokenizer (FILE | DIR | FILE.gguf) (--text T | --file F | --decode 1,2,3)
//                    [--no-special] [--json]
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/text/gguf_tokenizer.hpp"
#include "dissect/text/tokenizer_files.hpp"
#include "tools/common/parse.hpp"
#include "tools/dissect/command.hpp"
#include "tools/dissect/gguf_commands.hpp"
#include "tools/dissect/text_commands.hpp"

namespace dissect::tools {

/// tokenize's flags, each read and checked before any file is opened.
struct TokenizeOptions {
  std::filesystem::path
      tokenizer;  ///< a tokenizer.json, or a directory holding one (or vocab.json + merges.txt)
  std::optional<std::string> text;
  std::optional<std::filesystem::path> file;
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

/// `dissect tokenize` and its flags.
class TokenizeCommand final : public Command {
 public:
  explicit TokenizeCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "tokenize",
            "text to token ids and pieces (or ids to text) with a Hugging Face tokenizer")) {
    CLI::App* tokenize_command = &this->app();
    tokenize_command
        ->add_option("--tokenizer", options_.tokenizer,
                     "a tokenizer.json, a directory holding one (or vocab.json + merges.txt), or "
                     "a .gguf file (its own tokenizer)")
        ->required();
    auto* text_option = tokenize_command->add_option("--text", options_.text, "the text to encode");
    auto* file_option =
        tokenize_command->add_option("--file", text_file_, "a UTF-8 file to encode");
    auto* decode_option =
        tokenize_command->add_option("--decode", options_.decode, "token ids to decode: 1,2,3");
    text_option->excludes(file_option)->excludes(decode_option);
    file_option->excludes(decode_option);
    tokenize_command->add_flag("--no-special", options_.no_special,
                               "encode without BOS/EOS; decode skipping special tokens");
    tokenize_command->add_flag("--json", options_.json, "machine-readable output");
  }

  int run() override {
    if (!options_.text && !text_file_ && !options_.decode) {
      throw dissect::ConfigError("tokenize: give --text TEXT, --file FILE or --decode IDS");
    }
    if (options_.decode) (void)tools::parse_token_ids(*options_.decode, "--decode");
    if (text_file_) options_.file = *text_file_;
    return dissect::tools::tokenize(options_);
  }

 private:
  TokenizeOptions options_;
  std::optional<std::string> text_file_;
};

}  // namespace dissect::tools
