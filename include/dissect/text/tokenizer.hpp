// dissect/text/tokenizer.hpp — a Hugging Face tokenizer: tokenizer.json's pipeline (added
// tokens, normalizer, pre-tokenizer, BPE model, post-processor, decoder) as one object that
// turns text into token ids and ids back into text.
//
//   auto tok = dissect::text::load_tokenizer("gpt2-dir");        // tokenizer_files.hpp
//   std::vector<std::int32_t> ids = tok.encode("Once upon a time");   // 7454, 2402, 257, 640
//   std::string text = tok.decode(ids, /*skip_special_tokens=*/true);
//
// Encoding equals transformers.js's (the reference our fixtures come from) on every vocabulary
// tests/reference/tokenizers lists. Whatever the file asks for that dissect does not implement
// is a ConfigError naming the JSON path, and a malformed file a FormatError naming it: never a
// silently different tokenization. encode() is const and keeps no state: threads may share one
// Tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/json.hpp"
#include "dissect/text/added_tokens.hpp"
#include "dissect/text/bpe.hpp"
#include "dissect/text/decoder.hpp"
#include "dissect/text/normalized_text.hpp"
#include "dissect/text/normalizer.hpp"
#include "dissect/text/post_processor.hpp"
#include "dissect/text/pre_tokenizer.hpp"
#include "dissect/text/utf8.hpp"

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/text/detail/json_cursor.hpp"
#include "dissect/text/detail/tokenizer_json_reader.hpp"

namespace dissect::text {

/// What encode() does with bytes that are not UTF-8.
enum class InvalidUtf8 {
  refuse,   ///< FormatError naming the offset (the default: text is UTF-8 or it is not text)
  replace,  ///< each invalid maximal subpart becomes U+FFFD first (offsets then refer to that text)
};

struct EncodeOptions {
  bool add_special_tokens = true;  ///< what the post-processor adds (LLaMA 2's <s>)
  bool offsets = false;            ///< fill Encoding::offsets
  InvalidUtf8 invalid_utf8 = InvalidUtf8::refuse;
};

/// Token ids and, when asked for, the byte range of the text each stands for (an empty range at
/// 0 for a token the post-processor added).
struct Encoding {
  std::vector<std::int32_t> ids;
  std::vector<Span> offsets;
};

/// A tokenizer's pipeline in pieces, for one assembled by code instead of read from
/// tokenizer.json (gguf_tokenizer.hpp builds llama.cpp's from a GGUF file's metadata).
struct TokenizerParts {
  std::string source;  ///< where it came from, for messages
  std::optional<Normalizer> normalizer;
  std::optional<PreTokenizer> pre_tokenizer;
  BpeModel model;  ///< finished (BpeModel::finish)
  std::optional<PostProcessor> post_processor;
  std::optional<Decoder> decoder;
  std::vector<AddedToken> added_tokens;  ///< ids of the model's vocabulary or beyond it
  std::optional<std::int32_t> bos, eos;
};

class Tokenizer {
 public:
  /// A tokenizer of `parts`.
  /// @throws FormatError when two added tokens share an id, or one lies far beyond the
  ///         vocabulary.
  static Tokenizer from_parts(TokenizerParts parts) {
    Tokenizer out;
    out.source_ = std::move(parts.source);
    out.normalizer_ = std::move(parts.normalizer);
    out.pre_tokenizer_ = std::move(parts.pre_tokenizer);
    out.model_ = std::move(parts.model);
    out.post_ = std::move(parts.post_processor);
    out.decoder_ = std::move(parts.decoder);
    out.added_ = std::move(parts.added_tokens);
    out.index_added_tokens();
    out.bos_ = parts.bos;
    out.eos_ = parts.eos;
    return out;
  }

  /// Reads a tokenizer.json's text; `source` (its path) starts every message.
  /// @throws FormatError (malformed JSON, a merge naming an unknown token, two tokens with one
  ///         id, ...) or ConfigError (a component dissect does not implement), naming the path.
  static Tokenizer from_json(std::string_view json_text, std::string_view source) {
    Tokenizer out;
    out.source_ = std::string(source);
    detail::TokenizerJsonReader reader(out.source_);
    const nlohmann::json root = reader.read(json_text);
    out.read(detail::JsonCursor(root, "", out.source_), reader.streamed());
    return out;
  }

  /// GPT-2's two files: vocab.json's text (token → id) and merges.txt's (one "a b" a line, after
  /// an optional "#version" line), with GPT-2's pipeline: ByteLevel pre-tokenizer and decoder,
  /// <|endoftext|> as a special token when the vocabulary has it.
  /// @throws FormatError naming the file and the line or key.
  static Tokenizer from_gpt2_files(std::string_view vocab_json, std::string_view vocab_source,
                                   std::string_view merges_text, std::string_view merges_source);

  // ---- encoding ----------------------------------------------------------------------------

  /// The ids of `text` (UTF-8).
  /// @throws FormatError for text that is not UTF-8, ConfigError for a character the vocabulary
  ///         cannot encode (no token, no byte fallback, no unk_token).
  std::vector<std::int32_t> encode(std::string_view text, bool add_special_tokens = true) const {
    EncodeOptions options;
    options.add_special_tokens = add_special_tokens;
    return encode_with(text, options).ids;
  }

  /// encode() with offsets and the other options.
  Encoding encode_with(std::string_view text, const EncodeOptions& options) const;

  /// One token as encode_each produces it: its id and, when offsets are asked for, the byte
  /// range of the text it stands for (else an empty span).
  using TokenSink = detail::FunctionRef<void(std::int32_t id, Span offsets)>;

  /// encode_with, handing each token to `sink` as it is produced instead of collecting them
  /// (`dissect tokenize` streams a 100 MB line this way). Memory is the text's, whatever the
  /// number of tokens: a normalized copy and, with offsets, 8 bytes of origin per byte, plus the
  /// piece being merged. If `sink` throws, encoding stops there and the exception propagates.
  /// @throws as encode(); Error naming a pattern that exceeds its work bound (regex.hpp) or a
  ///         normalizer whose output would be too large (normalizer.hpp).
  void encode_each(std::string_view text, const EncodeOptions& options, TokenSink sink) const;

  // ---- decoding ----------------------------------------------------------------------------

  /// The text of `ids`, through the decoder (tokens joined by " " when there is none).
  /// @throws ConfigError "Tokenizer::decode: id 99999 is not in the vocabulary (ids 0..32000)".
  std::string decode(std::span<const std::int32_t> ids, bool skip_special_tokens = false) const {
    std::vector<DecodingToken> tokens;
    tokens.reserve(ids.size());
    for (const std::int32_t id : ids) {
      const AddedToken* added = added_token(id);
      if (added) {
        if (skip_special_tokens && added->special) continue;
        tokens.push_back({added->content, true});
        continue;
      }
      const std::string* token = model_.token(id);
      if (!token) {
        throw ConfigError(concat(
            "Tokenizer::decode: id ", id, " is not in the vocabulary (ids 0..", vocab_size() - 1,
            id >= 0 && static_cast<std::size_t>(id) < vocab_size() ? ", with gaps" : "", ")"));
      }
      tokens.push_back({*token, false});
    }
    if (!decoder_) {
      std::string out;
      for (std::size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i].text;
      return out;
    }
    std::string out;
    for (auto& token : decoder_->apply(std::move(tokens))) out += token.text;
    return out;
  }

  // ---- the vocabulary ----------------------------------------------------------------------

  /// One past the largest id, added tokens included: the embedding's V.
  std::size_t vocab_size() const {
    std::size_t limit = model_.id_limit();
    for (const auto& token : added_)
      limit = std::max(limit, static_cast<std::size_t>(token.id) + 1);
    return limit;
  }
  /// The id of a token as the file writes it (an added token's content), or nothing.
  std::optional<std::int32_t> token_to_id(std::string_view token) const {
    for (const auto& added : added_) {
      if (added.content == token) return added.id;
    }
    const std::int32_t id = model_.id_of(token);
    return id >= 0 ? std::optional<std::int32_t>(id) : std::nullopt;
  }
  /// The token of an id as the file writes it, or nothing.
  std::optional<std::string> id_to_token(std::int32_t id) const {
    if (const AddedToken* added = added_token(id)) return added->content;
    if (const std::string* token = model_.token(id)) return *token;
    return std::nullopt;
  }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  const BpeModel& model() const { return model_; }

  /// "byte-level BPE", "BPE with byte fallback" or "BPE".
  std::string kind() const {
    if (model_.options().byte_level) return "byte-level BPE";
    return model_.options().byte_fallback ? "BPE with byte fallback" : "BPE";
  }
  /// The ids encode(text, true) puts before the text (LLaMA 2: {1}, GPT-2: none).
  std::vector<std::int32_t> leading_special_ids() const {
    return post_ ? post_->leading_ids() : std::vector<std::int32_t>{};
  }
  /// Beginning and end of sequence, as tokenizer_config.json names them (tokenizer_files.hpp),
  /// or else BOS as the post-processor's first token; nothing when neither says.
  std::optional<std::int32_t> bos_id() const { return bos_; }
  std::optional<std::int32_t> eos_id() const { return eos_; }
  void set_bos_eos(std::optional<std::int32_t> bos, std::optional<std::int32_t> eos) {
    bos_ = bos;
    eos_ = eos;
  }
  /// The file this came from.
  const std::string& source() const { return source_; }

 private:
  Tokenizer() = default;

  const AddedToken* added_token(std::int32_t id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= added_by_id_.size()) return nullptr;
    const std::int32_t index = added_by_id_[static_cast<std::size_t>(id)];
    return index < 0 ? nullptr : &added_[static_cast<std::size_t>(index)];
  }

  void read(const detail::JsonCursor& root, detail::StreamedModel& streamed);
  void read_model(const detail::JsonCursor& model, detail::StreamedModel& streamed, bool byte_level,
                  std::size_t added_count);
  void read_added_tokens(const detail::JsonCursor& list);
  void index_added_tokens();

  // The ids and spans of one piece, reused from piece to piece.
  struct EncodeScratch {
    std::vector<std::int32_t> ids;
    std::vector<Span> spans;
  };
  void encode_section(std::string_view text, std::size_t begin, std::size_t end, bool track,
                      TokenSink emit, EncodeScratch& scratch) const;
  void encode_piece(const Piece& piece, bool track, TokenSink emit, EncodeScratch& scratch) const;

  std::string source_;
  std::optional<Normalizer> normalizer_;
  std::optional<PreTokenizer> pre_tokenizer_;
  BpeModel model_;
  std::optional<PostProcessor> post_;
  std::optional<Decoder> decoder_;
  std::vector<AddedToken> added_;
  std::vector<std::int32_t> added_by_id_;  ///< id → index into added_, or -1
  AddedTokenMatcher raw_added_, normalized_added_;
  std::optional<std::int32_t> bos_, eos_;
};

// ============================================================================================
// Reading tokenizer.json
// ============================================================================================

inline void Tokenizer::read(const detail::JsonCursor& root, detail::StreamedModel& streamed) {
  root.expect_object();
  for (const char* ignored_if_null : {"truncation", "padding"}) {
    if (const auto value = root.find(ignored_if_null)) {
      value->unsupported("is not supported (dissect neither truncates nor pads): set it to null");
    }
  }
  if (const auto normalizer = root.find("normalizer"))
    normalizer_ = Normalizer::from_json(*normalizer);
  if (const auto pre = root.find("pre_tokenizer")) pre_tokenizer_ = PreTokenizer::from_json(*pre);
  std::size_t added_count = 0;
  if (const auto added = root.find("added_tokens")) {
    read_added_tokens(*added);
    added_count = added_.size();
  }
  read_model(root["model"], streamed, pre_tokenizer_ && pre_tokenizer_->outputs_bytes(),
             added_count);
  if (const auto post = root.find("post_processor")) post_ = PostProcessor::from_json(*post);
  if (const auto decoder = root.find("decoder")) decoder_ = Decoder::from_json(*decoder);
  index_added_tokens();
  if (post_) {
    // Hugging Face would give such an id to the model, whose embedding has no row for it.
    post_->for_each_special_id([&](std::int32_t id, std::string_view where) {
      if (!id_to_token(id)) {
        throw FormatError(concat(where, ": id ", id, " is not in the vocabulary (ids 0..",
                                 vocab_size() - 1, ")"));
      }
    });
  }
  const auto leading = leading_special_ids();
  if (!leading.empty()) bos_ = leading.front();
}

inline void Tokenizer::read_added_tokens(const detail::JsonCursor& list) {
  for (std::size_t i = 0; i < list.size(); ++i) {
    const auto entry = list.at(i);
    entry.expect_object();
    AddedToken token;
    token.id = static_cast<std::int32_t>(
        entry["id"].integer(0, std::numeric_limits<std::int32_t>::max() - 1));
    token.content = entry["content"].string();
    if (token.content.empty()) entry["content"].fail("must not be empty");
    token.special = entry.boolean_or("special", false);
    token.single_word = entry.boolean_or("single_word", false);
    token.lstrip = entry.boolean_or("lstrip", false);
    token.rstrip = entry.boolean_or("rstrip", false);
    token.normalized = entry.boolean_or("normalized", !token.special);  // Hugging Face's default
    added_.push_back(std::move(token));
  }
}

inline void Tokenizer::read_model(const detail::JsonCursor& model, detail::StreamedModel& streamed,
                                  bool byte_level, std::size_t added_count) {
  model.expect_object();
  if (const auto type = model.find("type")) {
    const std::string name = type->string();
    if (name != "BPE")
      type->unsupported(concat('"', name, "\" is not supported (dissect implements BPE)"));
  } else if (!model.has("merges")) {
    model.unsupported(
        "a model without \"type\" or \"merges\" is not BPE, the one model dissect implements");
  }
  if (const auto dropout = model.find("dropout")) {
    if (!dropout->value().is_number() || dropout->value().get<double>() != 0.0) {
      dropout->unsupported(
          "BPE dropout is not supported (encoding would be random): set it to null");
    }
  }
  for (const char* affix : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (const auto value = model.find(affix); value && !value->string().empty()) {
      value->unsupported(concat("\"", value->string(), "\" is not supported"));
    }
  }
  BpeOptions options;
  options.byte_level = byte_level;
  options.byte_fallback = model.boolean_or("byte_fallback", false);
  options.ignore_merges = model.boolean_or("ignore_merges", false);
  options.fuse_unk = model.boolean_or("fuse_unk", false);
  if (const auto unk = model.find("unk_token")) options.unk_token = unk->string();
  model_ = BpeModel(options);

  if (!streamed.has_vocab) model.fail("has no \"vocab\"");
  if (!streamed.has_merges) model.fail("has no \"merges\"");
  // Ids are indices of the embedding: a vocabulary of n tokens has ids below about n. Bounding
  // them keeps a hostile id of 2³¹ from sizing the id table at 2³¹ entries.
  const std::size_t id_bound = std::min<std::size_t>(
      2 * (streamed.vocab.size() + added_count) + 1024, std::numeric_limits<std::int32_t>::max());
  model_.reserve(streamed.vocab.size(), streamed.merges.size());
  for (auto& entry : streamed.vocab) {
    // Paths are spelled out only for a message: one per entry would cost more than the entry.
    const auto where = [&] {
      return concat(source_, ": ", model.path(), ".vocab[\"", entry.text, "\"]");
    };
    if (entry.id > id_bound) {
      throw FormatError(concat(where(), ": id ", entry.id, " is far beyond the vocabulary's ",
                               streamed.vocab.size(), " tokens (ids must stay below ", id_bound,
                               ")"));
    }
    model_.add_token(std::move(entry.text), static_cast<std::int32_t>(entry.id), where);
  }
  std::size_t i = 0;
  for (const auto& merge : streamed.merges) {
    const auto where = [&] { return concat(source_, ": ", model.path(), ".merges[", i, ']'); };
    if (merge.joined) {
      const std::string& line = merge.left;
      const std::size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        throw FormatError(
            concat(where(), ": \"", line, "\" is not two tokens separated by one space"));
      }
      model_.add_merge(std::string_view(line).substr(0, space),
                       std::string_view(line).substr(space + 1), where);
    } else {
      model_.add_merge(merge.left, merge.right, where);
    }
    ++i;
  }
  streamed = {};  // the strings are in the model now
  model_.finish([&] { return concat(source_, ": ", model.path(), ".unk_token"); });
}

inline void Tokenizer::index_added_tokens() {
  std::size_t limit = 0;
  for (const auto& token : added_) limit = std::max(limit, static_cast<std::size_t>(token.id) + 1);
  if (limit > 2 * (model_.id_limit() + added_.size()) + 1024) {
    throw FormatError(concat(source_, ": added_tokens: id ", limit - 1,
                             " is far beyond the vocabulary's ", model_.id_limit(), " ids"));
  }
  added_by_id_.assign(limit, -1);
  for (std::size_t i = 0; i < added_.size(); ++i) {
    std::int32_t& slot = added_by_id_[static_cast<std::size_t>(added_[i].id)];
    if (slot >= 0 && added_[static_cast<std::size_t>(slot)].content != added_[i].content) {
      throw FormatError(concat(source_, ": added_tokens[", i, "]: id ", added_[i].id, " of \"",
                               added_[i].content, "\" is also the id of \"",
                               added_[static_cast<std::size_t>(slot)].content, "\""));
    }
    // An added token may repeat a vocabulary entry (real files list <s>, <unk> and
    // <|endoftext|> in both) but not take another token's id: "a" would decode as "zz".
    if (const std::string* token = model_.token(added_[i].id);
        token && *token != added_[i].content) {
      throw FormatError(concat(source_, ": added_tokens[", i, "]: id ", added_[i].id, " of \"",
                               added_[i].content, "\" is the vocabulary's id of \"", *token, "\""));
    }
    slot = static_cast<std::int32_t>(i);
    // A normalized token is found after normalization; with no normalizer that is the raw text.
    (added_[i].normalized && normalizer_ ? normalized_added_ : raw_added_).add(added_[i]);
  }
}

// ============================================================================================
// Encoding
// ============================================================================================

inline Encoding Tokenizer::encode_with(std::string_view text, const EncodeOptions& options) const {
  Encoding out;
  out.ids.reserve(text.size() / 3 + 4);
  encode_each(text, options, [&](std::int32_t id, Span span) {
    out.ids.push_back(id);
    if (options.offsets) out.offsets.push_back(span);
  });
  return out;
}

inline void Tokenizer::encode_each(std::string_view text, const EncodeOptions& options,
                                   TokenSink sink) const {
  std::string replaced;
  if (const auto bad = first_invalid_utf8(text)) {
    if (options.invalid_utf8 == InvalidUtf8::refuse) {
      throw FormatError(concat("Tokenizer::encode: the text is not UTF-8: byte 0x", std::hex,
                               static_cast<int>(static_cast<unsigned char>(text[*bad])), std::dec,
                               " at offset ", *bad,
                               " (EncodeOptions::invalid_utf8 = replace substitutes U+FFFD)"));
    }
    replaced = to_valid_utf8(text);
    text = replaced;
  }
  if (text.size() >= std::numeric_limits<std::uint32_t>::max()) {
    throw Error(
        concat("Tokenizer::encode: ", text.size(), " bytes of text: at most 4 GiB in one call"));
  }
  // One work budget for every pattern this encode matches (regex.hpp, reliability.md row 119).
  const detail::RegexBudget budget(text.size());
  const bool track = options.offsets;
  const bool trim = track && post_ && post_->trims_offsets();
  const auto emit_token = [&](std::int32_t id, Span span) {
    if (trim) {  // ByteLevel's trim_offsets: spaces are not the word's
      while (span.begin < span.end && text[span.begin] == ' ') ++span.begin;
      while (span.end > span.begin && text[span.end - 1] == ' ') --span.end;
    }
    sink(id, span);
  };
  const TokenSink emit = emit_token;
  EncodeScratch scratch;
  const auto body = [&] {
    std::size_t at = 0;
    for (const AddedTokenMatch& match : raw_added_.find_all(text)) {
      encode_section(text, at, match.begin, track, emit, scratch);
      emit(match.id, track ? Span{static_cast<std::uint32_t>(match.begin),
                                  static_cast<std::uint32_t>(match.end)}
                           : Span{});
      at = match.end;
    }
    encode_section(text, at, text.size(), track, emit, scratch);
  };
  if (options.add_special_tokens && post_) {
    post_->around(body, [&](std::int32_t id) { emit(id, Span{}); });
  } else {
    body();
  }
}

inline void Tokenizer::encode_section(std::string_view text, std::size_t begin, std::size_t end,
                                      bool track, TokenSink emit, EncodeScratch& scratch) const {
  if (begin >= end) return;
  const std::string_view section = text.substr(begin, end - begin);
  const Span whole{static_cast<std::uint32_t>(begin), static_cast<std::uint32_t>(end)};
  const auto pre_tokenize = [&](const Piece& piece) {
    if (pre_tokenizer_) {
      pre_tokenizer_->split(piece, [&](const Piece& p) { encode_piece(p, track, emit, scratch); });
    } else {
      encode_piece(piece, track, emit, scratch);
    }
  };
  if (!normalizer_ && !track) return pre_tokenize(Piece{section, nullptr, whole});
  NormalizedText normalized =
      NormalizedText::original(section, track, static_cast<std::uint32_t>(begin));
  if (normalizer_) normalized = normalizer_->apply(std::move(normalized));
  if (normalized.text.empty()) return;
  const auto part = [&](std::size_t b, std::size_t e) {
    if (b >= e) return;
    pre_tokenize(Piece{std::string_view(normalized.text).substr(b, e - b),
                       track ? normalized.origin.data() + b : nullptr, whole});
  };
  if (normalized_added_.empty()) return part(0, normalized.text.size());
  std::size_t at = 0;
  for (const AddedTokenMatch& match : normalized_added_.find_all(normalized.text)) {
    part(at, match.begin);
    emit(match.id, track ? normalized.span_of(match.begin, match.end) : Span{});
    at = match.end;
  }
  part(at, normalized.text.size());
}

inline void Tokenizer::encode_piece(const Piece& piece, bool track, TokenSink emit,
                                    EncodeScratch& scratch) const {
  scratch.ids.clear();
  scratch.spans.clear();
  model_.encode(piece.text, scratch.ids, track ? &scratch.spans : nullptr);
  for (std::size_t i = 0; i < scratch.ids.size(); ++i) {
    Span span{};
    if (track) {
      const Span& s = scratch.spans[i];
      if (s.end > s.begin) span = Span{piece.origin[s.begin].begin, piece.origin[s.end - 1].end};
    }
    emit(scratch.ids[i], span);
  }
}

}  // namespace dissect::text

#include "dissect/text/detail/gpt2_files_impl.hpp"
