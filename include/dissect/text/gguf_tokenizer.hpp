// dissect/text/gguf_tokenizer.hpp — the tokenizer a GGUF file carries in its tokenizer.ggml.*
// metadata, as llama.cpp reads and runs it.
//
//   const dissect::GgufFile file("model.gguf");
//   const auto tokenizer = dissect::text::tokenizer_from_gguf(file);
//   auto ids = tokenizer.encode("Once upon a time");  // llama.cpp's llama_tokenize(..., true,
//   true)
//
// Two of llama.cpp's tokenizer models:
// - "gpt2": byte-level BPE over the file's merges, split first by the regular expressions
//   llama.cpp picks for tokenizer.ggml.pre (the GPT-2, LLaMA 3, Qwen 2 and StarCoder families);
// - "llama": SentencePiece's BPE, which merges the adjacent pair whose token scores highest
//   (leftmost first on a tie) and spells what no token covers as <0xNN> byte tokens. Here the
//   scores become merge ranks — every split of a token into two tokens, ranked by the score of
//   the token it makes — so dissect's BPE loop runs SentencePiece's algorithm exactly.
// Control, unknown and user-defined tokens are matched in the text as special tokens (llama.cpp
// with parse_special on); BOS and EOS are added as tokenizer.ggml.add_bos_token /
// add_eos_token say, with llama.cpp's defaults when the file is silent. Anything else is a
// ConfigError naming the key: never a silently different tokenization.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/text/regex.hpp"
#include "dissect/text/tokenizer.hpp"
#include "dissect/text/utf8.hpp"

namespace dissect::text {

/// llama.cpp's token types, the values of tokenizer.ggml.token_type.
enum class GgufTokenType : std::int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

/// Whether `file` carries a tokenizer: a tokenizer.ggml.model other than llama.cpp's "none" and
/// "no_vocab" (a model that takes token ids).
inline bool gguf_has_tokenizer(const GgufFile& file) {
  const GgufValue* model = file.find("tokenizer.ggml.model");
  if (!model) return false;
  const std::string* name = model->as_string();
  return !name || (*name != "none" && *name != "no_vocab");
}

namespace detail {

// How llama.cpp pre-tokenizes a "gpt2" model: tokenizer.ggml.pre's families.
struct GgufPreTokenizer {
  std::vector<std::string_view> patterns;  ///< applied in turn, each splitting the last's pieces
  bool ignore_merges = false;              ///< a piece that is a token is taken whole (LLaMA 3)
  bool adds_bos = false;                   ///< add_bos_token's default
};

inline constexpr std::string_view gpt2_pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
inline constexpr std::string_view llama3_pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
inline constexpr std::string_view qwen2_pattern =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// llama.cpp's whitespace (unicode_set_whitespace): Python's str.isspace less U+001C–U+001F.
// Unlike the JavaScript \s that tokenizer.json's patterns get (regex.hpp), it has U+0085 and
// not U+FEFF, so its patterns are spelled with these members instead of \s.
inline constexpr std::string_view llama_cpp_space_members =
    "\\t\\n\\x{0B}\\f\\r \\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}"
    "\\x{202F}\\x{205F}\\x{3000}";

inline std::optional<GgufPreTokenizer> gguf_pre_tokenizer(std::string_view name) {
  const auto any_of = [&](std::initializer_list<std::string_view> names) {
    return std::find(names.begin(), names.end(), name) != names.end();
  };
  if (any_of({"gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de",
              "a.x-4.0", "mellum", "modern-bert", "mpt", "olmo", "jais", "trillion",
              "granite-docling", "exaone4"}))
    return GgufPreTokenizer{{gpt2_pattern}};
  if (any_of({"llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0",
              "lfm2", "jina-v5-nano"}))
    return GgufPreTokenizer{{llama3_pattern}, true, true};
  if (any_of({"dbrx", "smaug-bpe"})) return GgufPreTokenizer{{llama3_pattern}};
  if (any_of({"qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "megrez", "hunyuan",
              "solar-open"}))
    return GgufPreTokenizer{{qwen2_pattern}};
  if (any_of({"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
              "mellum2"}))
    return GgufPreTokenizer{{R"(\p{N})", gpt2_pattern}};
  return std::nullopt;
}

// Reads tokenizer.ggml.* once, checking each key as it goes.
class GgufTokenizerReader {
 public:
  explicit GgufTokenizerReader(const GgufFile& file) : file_(file), source_(file.path().string()) {}

  Tokenizer read() {
    const std::string model = file_.require_string("tokenizer.ggml.model");
    if (model != "gpt2" && model != "llama") {
      throw ConfigError(concat(source_, ": tokenizer.ggml.model ", quote_file_text(model),
                               " is not supported (dissect reads \"gpt2\" and \"llama\")"));
    }
    spm_ = model == "llama";
    read_vocabulary();
    mark_control_tokens_by_text();
    TokenizerParts parts;
    parts.source = source_;
    bool adds_bos = spm_;
    if (spm_) {
      build_spm(parts);
    } else {
      adds_bos = build_bpe(parts);
    }
    // When the file names no BOS or EOS, SentencePiece's are llama.cpp's defaults 1 and 2. (For
    // "gpt2" llama.cpp falls back to id 11, an ordinary token in every such vocabulary: dissect
    // takes that as none, as node-llama-cpp does.)
    const auto bos = special_id("tokenizer.ggml.bos_token_id", spm_ ? 1 : -1);
    const auto eos = special_id("tokenizer.ggml.eos_token_id", spm_ ? 2 : -1);
    const bool add_bos = flag("tokenizer.ggml.add_bos_token", adds_bos);
    const bool add_eos = flag("tokenizer.ggml.add_eos_token", false);
    if (add_bos && !bos) missing_special("add_bos_token", "bos_token_id");
    if (add_eos && !eos) missing_special("add_eos_token", "eos_token_id");
    if (add_bos || add_eos)
      parts.post_processor = wrap(add_bos ? bos : std::nullopt, add_eos ? eos : std::nullopt);
    for (std::size_t id = 0; id < tokens_.size(); ++id) {
      const GgufTokenType type = types_[id];
      if (type != GgufTokenType::control && type != GgufTokenType::user_defined &&
          type != GgufTokenType::unknown)
        continue;
      AddedToken token;
      token.content = tokens_[id];
      token.id = static_cast<std::int32_t>(id);
      token.special = type != GgufTokenType::user_defined;
      parts.added_tokens.push_back(std::move(token));
    }
    parts.bos = bos;
    parts.eos = eos;
    return Tokenizer::from_parts(std::move(parts));
  }

 private:
  std::string key_message(std::string_view key, std::string_view what) const {
    return concat(source_, ": ", key, ' ', what);
  }

  void read_vocabulary() {
    const auto& tokens = file_.require_array("tokenizer.ggml.tokens");
    if (tokens.empty()) throw FormatError(key_message("tokenizer.ggml.tokens", "is empty"));
    if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max()))
      throw FormatError(key_message("tokenizer.ggml.tokens", "holds more than 2^31 tokens"));
    tokens_.reserve(tokens.size());
    for (std::size_t i = 0; i < tokens.size(); ++i) {
      const std::string* text = tokens[i].as_string();
      if (!text) {
        throw FormatError(concat(source_, ": tokenizer.ggml.tokens[", i, "] is ",
                                 tokens[i].describe(), ", not a string"));
      }
      // llama.cpp names an empty token so, and so must a tokenizer that matches its ids.
      tokens_.push_back(text->empty() ? concat("[EMPTY_", i, ']') : *text);
    }
    types_.assign(tokens_.size(), GgufTokenType::normal);
    if (const GgufValue* types = file_.find("tokenizer.ggml.token_type")) {
      const auto* list = types->as_array();
      if (!list || types->element_type() != GgufType::i32)
        throw FormatError(key_message("tokenizer.ggml.token_type", "must be an array of i32"));
      if (list->size() < tokens_.size()) {
        throw FormatError(concat(source_, ": tokenizer.ggml.token_type has ", list->size(),
                                 " entries for ", tokens_.size(), " tokens"));
      }
      for (std::size_t i = 0; i < tokens_.size(); ++i) {
        const std::int32_t value = std::get<std::int32_t>((*list)[i].storage());
        // llama.cpp treats any other value as undefined (a normal token).
        types_[i] =
            value >= 0 && value <= 6 ? static_cast<GgufTokenType>(value) : GgufTokenType::undefined;
      }
    }
  }

  // llama.cpp makes some tokens control tokens by their text, whatever the file's types say:
  // those of end of generation always, and for each special role whose id the file does not
  // give, the tokens that look like it (llama_vocab::impl::load, release v0.5.0). Control
  // tokens are matched in the text as special tokens, so this changes tokenization.
  void mark_control_tokens_by_text() {
    std::map<std::string_view, std::size_t, std::less<>> id_of;
    for (std::size_t id = 0; id < tokens_.size(); ++id) id_of.emplace(tokens_[id], id);
    const auto mark = [&](std::initializer_list<std::string_view> texts) {
      for (const std::string_view text : texts) {
        if (const auto found = id_of.find(text); found != id_of.end()) {
          types_[found->second] = GgufTokenType::control;
        }
      }
    };
    struct Role {
      std::initializer_list<std::string_view> keys;
      std::initializer_list<std::string_view> texts;
    };
    const Role roles[] = {
        {{"tokenizer.ggml.eot_token_id"},
         {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
          "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>",
          "<end_of_utterance>"}},
        {{"tokenizer.ggml.eom_token_id"}, {"<|eom_id|>"}},
        {{"tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"},
         {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<\uff5cfim\u2581begin\uff5c>", "<PRE>",
          "\u2581<PRE>", "<|code_prefix|>", "<|prefix|>"}},
        {{"tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"},
         {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<\uff5cfim\u2581hole\uff5c>", "<SUF>",
          "\u2581<SUF>", "<|code_suffix|>", "<|suffix|>"}},
        {{"tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"},
         {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<\uff5cfim\u2581end\uff5c>", "<MID>",
          "\u2581<MID>", "<|code_middle|>", "<|middle|>"}},
        {{"tokenizer.ggml.fim_pad_token_id"},
         {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"}},
        {{"tokenizer.ggml.fim_rep_token_id"},
         {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
        {{"tokenizer.ggml.fim_sep_token_id"}, {"<|file_sep|>"}},
    };
    for (const Role& role : roles) {
      const bool given = std::any_of(role.keys.begin(), role.keys.end(),
                                     [&](std::string_view key) { return file_.find(key); });
      if (!given) mark(role.texts);
    }
    mark({"<|eot_id|>",
          "<|im_end|>",
          "<|end|>",
          "<|return|>",
          "<|call|>",
          "<|flush|>",
          "<|calls|>",
          "<end_of_turn>",
          "<|endoftext|>",
          "</s>",
          "<|eom_id|>",
          "<EOT>",
          "_<EOT>",
          "[EOT]",
          "[EOS]",
          "<|end_of_text|>",
          "<end_of_utterance>",
          "<eos>",
          "<turn|>",
          "<|tool_response>",
          "<\uff5cend\u2581of\u2581sentence\uff5c>",
          "[e~["});
    // Gemma 4's and PaddleOCR's </s> is an ordinary token beside <|tool_response>.
    if (id_of.count("<|tool_response>") && id_of.count("</s>"))
      types_[id_of.find("</s>")->second] = GgufTokenType::normal;
  }

  std::vector<float> read_scores() const {
    std::vector<float> scores(tokens_.size(), 0.0f);  // llama.cpp's default
    const GgufValue* value = file_.find("tokenizer.ggml.scores");
    if (!value) return scores;
    const auto* list = value->as_array();
    if (!list || (value->element_type() != GgufType::f32 && value->element_type() != GgufType::i32))
      throw FormatError(key_message("tokenizer.ggml.scores", "must be an array of f32 or i32"));
    if (list->size() < tokens_.size()) {
      throw FormatError(concat(source_, ": tokenizer.ggml.scores has ", list->size(),
                               " entries for ", tokens_.size(), " tokens"));
    }
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      const auto& storage = (*list)[i].storage();
      scores[i] = value->element_type() == GgufType::f32
                      ? std::get<float>(storage)
                      : static_cast<float>(std::get<std::int32_t>(storage));
      if (std::isnan(scores[i]))
        throw FormatError(concat(source_, ": tokenizer.ggml.scores[", i, "] is NaN"));
    }
    return scores;
  }

  std::optional<std::int32_t> special_id(std::string_view key, std::int32_t fallback) const {
    const GgufValue* value = file_.find(key);
    if (!value) {
      if (fallback >= 0 && static_cast<std::size_t>(fallback) < tokens_.size()) return fallback;
      return std::nullopt;
    }
    const auto id = value->as_unsigned();
    if (!id || *id >= tokens_.size()) {
      throw FormatError(concat(source_, ": ", key, " is ", value->describe(),
                               ", not the id of one of the ", tokens_.size(), " tokens"));
    }
    return static_cast<std::int32_t>(*id);
  }

  bool flag(std::string_view key, bool fallback) const {
    const GgufValue* value = file_.find(key);
    if (!value) return fallback;
    const auto set = value->as_bool();
    if (!set)
      throw FormatError(concat(source_, ": ", key, " is ", value->describe(), ", not a bool"));
    return *set;
  }

  [[noreturn]] void missing_special(std::string_view add_key, std::string_view id_key) const {
    throw FormatError(concat(source_, ": tokenizer.ggml.", add_key, " is true, but tokenizer.ggml.",
                             id_key, " is not set"));
  }

  // The token list into a model; `where` names an entry only when there is something to report.
  void add_tokens(BpeModel& model) const {
    for (std::size_t id = 0; id < tokens_.size(); ++id) {
      model.add_token(tokens_[id], static_cast<std::int32_t>(id),
                      [&] { return concat(source_, ": tokenizer.ggml.tokens[", id, ']'); });
    }
  }

  PostProcessor wrap(std::optional<std::int32_t> bos, std::optional<std::int32_t> eos) const {
    nlohmann::json single = nlohmann::json::array(), specials = nlohmann::json::object();
    const auto special = [&](std::int32_t id) {
      const std::string& name = tokens_[static_cast<std::size_t>(id)];
      single.push_back({{"SpecialToken", {{"id", name}, {"type_id", 0}}}});
      specials[name] = {{"id", name}, {"ids", {id}}, {"tokens", {name}}};
    };
    if (bos) special(*bos);
    single.push_back({{"Sequence", {{"id", "A"}, {"type_id", 0}}}});
    if (eos) special(*eos);
    const nlohmann::json json = {
        {"type", "TemplateProcessing"}, {"single", single}, {"special_tokens", specials}};
    return PostProcessor::from_json(detail::JsonCursor(json, "", source_));
  }

  // "gpt2": byte-level BPE. Returns add_bos_token's default for the pre-tokenizer.
  bool build_bpe(TokenizerParts& parts) {
    const GgufValue* pre_value = file_.find("tokenizer.ggml.pre");
    const std::string pre =
        pre_value && pre_value->as_string() ? *pre_value->as_string() : std::string();
    if (pre_value && !pre_value->as_string())
      throw FormatError(key_message("tokenizer.ggml.pre", "must be a string"));
    const auto how = gguf_pre_tokenizer(pre);
    if (!how) {
      throw ConfigError(concat(
          source_, ": tokenizer.ggml.pre ", quote_file_text(pre), pre.empty() ? " (missing)" : "",
          " is not supported (dissect splits as llama.cpp does for the gpt-2, llama-bpe, qwen2, "
          "starcoder families and their aliases)"));
    }
    nlohmann::json steps = nlohmann::json::array();
    for (const std::string_view pattern : how->patterns) {
      steps.push_back(
          {{"type", "Split"},
           {"pattern", {{"Regex", to_pcre2_pattern(pattern, source_, llama_cpp_space_members)}}},
           {"behavior", "Isolated"},
           {"invert", false}});
    }
    steps.push_back({{"type", "ByteLevel"},
                     {"add_prefix_space", false},
                     {"trim_offsets", false},
                     {"use_regex", false}});
    const nlohmann::json pre_json = {{"type", "Sequence"}, {"pretokenizers", steps}};
    parts.pre_tokenizer = PreTokenizer::from_json(detail::JsonCursor(pre_json, "", source_));
    const nlohmann::json decoder = {{"type", "ByteLevel"}};
    parts.decoder = Decoder::from_json(detail::JsonCursor(decoder, "", source_));

    BpeOptions options;
    options.byte_level = true;
    options.ignore_merges = how->ignore_merges;
    BpeModel model(options);
    const auto& merges = file_.require_array("tokenizer.ggml.merges");
    model.reserve(tokens_.size(), merges.size());
    add_tokens(model);
    for (std::size_t i = 0; i < merges.size(); ++i) {
      const auto where = [&] { return concat(source_, ": tokenizer.ggml.merges[", i, ']'); };
      const std::string* line = merges[i].as_string();
      if (!line) throw FormatError(concat(where(), " is ", merges[i].describe(), ", not a string"));
      // llama.cpp splits at the first space after the first byte.
      const std::size_t space = line->size() > 1 ? line->find(' ', 1) : std::string::npos;
      if (space == std::string::npos)
        throw FormatError(
            concat(where(), ": ", quote_file_text(*line), " is not two tokens and a space"));
      model.add_merge(std::string_view(*line).substr(0, space),
                      std::string_view(*line).substr(space + 1), where);
    }
    model.finish([&] { return source_; });
    parts.model = std::move(model);
    return how->adds_bos;
  }

  // "llama": SentencePiece. Every split of a token into two tokens becomes a merge ranked by
  // the token's score (higher first), all of one score sharing a rank.
  void build_spm(TokenizerParts& parts) {
    const std::vector<float> scores = read_scores();
    std::vector<float> distinct(scores);
    std::sort(distinct.begin(), distinct.end(), std::greater<>());
    distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
    const auto rank_of = [&](float score) {
      return static_cast<std::int32_t>(
          std::lower_bound(distinct.begin(), distinct.end(), score, std::greater<>()) -
          distinct.begin());
    };

    BpeOptions options;
    options.byte_fallback = true;
    BpeModel model(options);
    model.reserve(tokens_.size(), 4 * tokens_.size());
    add_tokens(model);
    for (std::size_t id = 0; id < tokens_.size(); ++id) {
      const std::string& token = tokens_[id];
      const auto where = [&] { return concat(source_, ": tokenizer.ggml.tokens[", id, ']'); };
      // Split only between code points, as SentencePiece's symbols are; a token that is not
      // UTF-8 has no splits (llama.cpp's symbols could never join into it either).
      if (first_invalid_utf8(token)) continue;
      for (std::size_t at = 0; at < token.size();) {
        at += valid_sequence_length(token, at);
        if (at >= token.size()) break;
        const std::string_view left = std::string_view(token).substr(0, at);
        const std::string_view right = std::string_view(token).substr(at);
        if (model.id_of(left) >= 0 && model.id_of(right) >= 0)
          model.add_ranked_merge(left, right, rank_of(scores[id]), where);
      }
    }
    model.finish([&] { return source_; });
    parts.model = std::move(model);

    const bool space_prefix = flag("tokenizer.ggml.add_space_prefix", true);
    nlohmann::json normalizers = nlohmann::json::array();
    if (space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    normalizers.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}});
    const nlohmann::json normalizer = {{"type", "Sequence"}, {"normalizers", normalizers}};
    parts.normalizer = Normalizer::from_json(detail::JsonCursor(normalizer, "", source_));
    nlohmann::json decoders = nlohmann::json::array();
    decoders.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}});
    decoders.push_back({{"type", "ByteFallback"}});
    decoders.push_back({{"type", "Fuse"}});
    if (space_prefix)
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    const nlohmann::json decoder = {{"type", "Sequence"}, {"decoders", decoders}};
    parts.decoder = Decoder::from_json(detail::JsonCursor(decoder, "", source_));
  }

  const GgufFile& file_;
  std::string source_;
  bool spm_ = false;
  std::vector<std::string> tokens_;
  std::vector<GgufTokenType> types_;
};

}  // namespace detail

/// The tokenizer of a GGUF file's tokenizer.ggml.* metadata.
/// @throws FormatError naming the file and the key for missing or malformed metadata (a token
///         that is not a string, a merge of unknown tokens, fewer scores or types than tokens,
///         a special-token id beyond the vocabulary); ConfigError for a tokenizer model or
///         pre-tokenizer dissect does not implement.
inline Tokenizer tokenizer_from_gguf(const GgufFile& file) {
  return detail::GgufTokenizerReader(file).read();
}

}  // namespace dissect::text
