// dissect/text/detail/gpt2_files_impl.hpp — private: do not include directly
// (dissect/text/tokenizer.hpp does, at its end).
//
// Tokenizer::from_gpt2_files: GPT-2's vocab.json + merges.txt, the form OpenAI published and
// transformers' GPT2Tokenizer reads, with the pipeline GPT-2's tokenizer.json spells out.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/text/detail/gpt2_files_impl.hpp is private to dissect: include dissect/text/tokenizer.hpp instead"
#endif

#include <cstddef>
#include <string>
#include <string_view>

namespace dissect::text {

inline Tokenizer Tokenizer::from_gpt2_files(std::string_view vocab_json,
                                            std::string_view vocab_source,
                                            std::string_view merges_text,
                                            std::string_view merges_source) {
  // GPT-2's pipeline around the model, as its tokenizer.json writes it.
  static const nlohmann::json pipeline = nlohmann::json::parse(R"({
    "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
    "post_processor": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
    "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true}
  })");
  Tokenizer out;
  out.source_ = std::string(vocab_source);
  const detail::JsonCursor root(pipeline, "", "GPT-2's pipeline");
  out.pre_tokenizer_ = PreTokenizer::from_json(root["pre_tokenizer"]);
  out.post_ = PostProcessor::from_json(root["post_processor"]);
  out.decoder_ = Decoder::from_json(root["decoder"]);

  const nlohmann::json vocab = dissect::io::parse_json_strictly(vocab_json, vocab_source);
  const detail::JsonCursor vocab_at(vocab, "", vocab_source);
  vocab_at.expect_object();
  BpeOptions options;
  options.byte_level = true;
  out.model_ = BpeModel(options);
  const std::size_t id_bound = 2 * vocab.size() + 1024;
  for (const auto& item : vocab.items()) {
    // Named copies, not structured bindings: a lambda may not capture those before C++20's
    // P1091 (clang 14 refuses).
    const std::string& token = item.key();
    const nlohmann::json& id_value = item.value();
    const auto path = [&] { return concat('"', token, '"'); };
    const bool integral = id_value.is_number_unsigned() || id_value.is_number_integer();
    if (!integral || (id_value.is_number_integer() && id_value.get<std::int64_t>() < 0) ||
        id_value.get<std::uint64_t>() > id_bound) {
      detail::JsonCursor(id_value, path(), vocab_source)
          .integer(0, static_cast<std::int64_t>(id_bound));
    }
    out.model_.add_token(token, static_cast<std::int32_t>(id_value.get<std::int64_t>()),
                         [&] { return concat(vocab_source, ": ", path()); });
  }
  std::size_t line_number = 0, begin = 0;
  while (begin < merges_text.size()) {
    std::size_t end = merges_text.find('\n', begin);
    if (end == std::string_view::npos) end = merges_text.size();
    std::string_view line = merges_text.substr(begin, end - begin);
    begin = end + 1;
    ++line_number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_number == 1 && line.substr(0, 8) == "#version")) continue;
    const auto where = [&] { return concat(merges_source, ": line ", line_number); };
    const std::size_t space = line.find(' ');
    if (space == std::string_view::npos || line.find(' ', space + 1) != std::string_view::npos) {
      throw FormatError(
          concat(where(), ": \"", line, "\" is not two tokens separated by one space"));
    }
    out.model_.add_merge(line.substr(0, space), line.substr(space + 1), where);
  }
  out.model_.finish([&] { return std::string(vocab_source); });
  if (const std::int32_t end_of_text = out.model_.id_of("<|endoftext|>"); end_of_text >= 0) {
    out.added_.push_back(AddedToken{"<|endoftext|>", end_of_text, true, false, false, false, true});
    out.bos_ = out.eos_ = end_of_text;
  }
  out.index_added_tokens();
  return out;
}

}  // namespace dissect::text
