// Tests of dissect/text/gguf_tokenizer.hpp: the tokenizer of a GGUF file's tokenizer.ggml.*
// metadata against llama.cpp's own tokenizer on the same file. The files are real vocabularies
// (LLaMA 2 as SentencePiece; GPT-2, LLaMA 3 and Qwen 3 as byte-level BPE with three
// pre-tokenizer families) written as vocabulary-only GGUF by tests/support/vocab_gguf.hpp, at
// test time, byte for byte the files tests/reference/gguf/make_tokenize.mjs handed llama.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "dissect/text/gguf_tokenizer.hpp"
#include "dissect/text/gguf_tokenizer_metadata.hpp"
#include "support/io_testing.hpp"
#include "support/sanitizers.hpp"
#include "support/tokenizer_fixtures.hpp"
#include "support/vocab_gguf.hpp"

namespace dissect {
namespace test_gguf_tokenizer {

namespace fs = std::filesystem;
using text::Tokenizer;

fs::path references() {
  return fs::path(DISSECT_GGUF_FIXTURE_DIR) / "tokenize";
}

/// Under the sanitizers every third case (all of them otherwise), as the other vocabulary tests.
#if defined(DISSECT_TEST_SANITIZED)
constexpr std::size_t case_stride = 3;
#else
constexpr std::size_t case_stride = 1;
#endif

std::string show(const std::vector<std::int32_t>& ids) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ids.size() && i < 40; ++i) out << (i ? " " : "") << ids[i];
  if (ids.size() > 40) out << " …";
  return out.str();
}

// One GGUF file and its tokenizer per vocabulary, shared by the tests of a run.
struct Loaded {
  testing::TemporaryDirectory dir;
  std::optional<GgufFile> file;
  std::optional<Tokenizer> tokenizer;
};

const Loaded& vocabulary(const std::string& name) {
  static std::map<std::string, Loaded> loaded;
  auto found = loaded.find(name);
  if (found == loaded.end()) {
    found = loaded.try_emplace(name).first;
    for (const auto& spec : testing::vocab_ggufs()) {
      if (spec.name != name) continue;
      const fs::path path = found->second.dir / (name + ".gguf");
      testing::write_vocab_gguf(spec, DISSECT_TOKENIZER_PACKAGES, path);
      found->second.file.emplace(path);
      found->second.tokenizer.emplace(text::tokenizer_from_gguf(*found->second.file));
    }
  }
  return found->second;
}

const nlohmann::json& reference_summary() {
  static const nlohmann::json summary = [] {
    std::ifstream in(references() / "vocabs.json");
    return nlohmann::json::parse(in);
  }();
  return summary;
}

class GgufVocabulary : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufVocabulary, EncodesEveryCorpusAsLlamaCppDoes) {
  const Tokenizer& tokenizer = *vocabulary(GetParam()).tokenizer;
  for (const std::string corpus : {"hard", "fortunes", "gpl"}) {
    const auto cases =
        testing::read_jsonl(testing::tokenizer_references() / "corpus" / (corpus + ".jsonl"));
    const auto expected = testing::read_ids(references() / (GetParam() + "." + corpus + ".ids"));
    ASSERT_EQ(cases.size(), expected.size()) << corpus;
    std::size_t mismatches = 0;
    std::string first;
    for (std::size_t i = 0; i < cases.size(); i += case_stride) {
      const auto got = tokenizer.encode(cases[i], /*add_special_tokens=*/false);
      if (got == expected[i]) continue;
      if (mismatches++ < 3) {
        first += "\ncase " + std::to_string(i) + " " +
                 nlohmann::json(cases[i].substr(0, 200)).dump() + "\n  got       " + show(got) +
                 "\n  llama.cpp " + show(expected[i]);
      }
    }
    EXPECT_EQ(mismatches, 0u) << GetParam() << " on " << corpus << ": " << mismatches << " of "
                              << cases.size() << " cases differ; the first: " << first;
  }
}

TEST_P(GgufVocabulary, AddsBosAndNamesSpecialTokensAsLlamaCppDoes) {
  const Tokenizer& tokenizer = *vocabulary(GetParam()).tokenizer;
  const nlohmann::json& expected = reference_summary()["vocabs"][GetParam()];
  EXPECT_EQ(tokenizer.vocab_size(), expected["tokens"].get<std::size_t>());
  const auto id_or_null = [](std::optional<std::int32_t> id) {
    return id ? nlohmann::json(*id) : nlohmann::json(nullptr);
  };
  EXPECT_EQ(id_or_null(tokenizer.bos_id()), expected["bos"]);
  EXPECT_EQ(id_or_null(tokenizer.eos_id()), expected["eos"]);
  const auto leading = tokenizer.leading_special_ids();
  if (expected["prepends_bos"].get<bool>()) {
    EXPECT_EQ(leading, std::vector<std::int32_t>{expected["bos"].get<std::int32_t>()});
  } else {
    EXPECT_TRUE(leading.empty());
  }
  // add_special_tokens adds exactly that before the same ids (llama.cpp's add_special).
  const std::string sample = "Hello world, 1234 ünïcödé";
  auto with = tokenizer.encode(sample, true);
  const auto without = tokenizer.encode(sample, false);
  ASSERT_EQ(with.size(), without.size() + leading.size());
  EXPECT_TRUE(std::equal(leading.begin(), leading.end(), with.begin()));
  EXPECT_TRUE(std::equal(without.begin(), without.end(), with.begin() + leading.size()));
}

TEST_P(GgufVocabulary, ConvertsTheTokenizerJsonAsLlamaCppsConverterNamesIt) {
  // gguf_tokenizer_metadata found the model, the pre-tokenizer and BOS/EOS the vocabulary has.
  const GgufFile& file = *vocabulary(GetParam()).file;
  for (const auto& spec : testing::vocab_ggufs()) {
    if (spec.name != GetParam()) continue;
    EXPECT_EQ(file.require_string("tokenizer.ggml.model"), spec.model);
    if (spec.model == "gpt2") {
      EXPECT_EQ(file.require_string("tokenizer.ggml.pre"), spec.pre);
    }
    const Tokenizer& tokenizer = *vocabulary(GetParam()).tokenizer;
    const auto text_of = [&](std::optional<std::int32_t> id) {
      return id ? *tokenizer.id_to_token(*id) : std::string();
    };
    EXPECT_EQ(text_of(tokenizer.bos_id()), spec.bos);
    EXPECT_EQ(text_of(tokenizer.eos_id()), spec.eos);
    EXPECT_EQ(!tokenizer.leading_special_ids().empty(), spec.add_bos);
  }
}

TEST_P(GgufVocabulary, DecodesWhatItEncodesBackToTheText) {
  const Tokenizer& tokenizer = *vocabulary(GetParam()).tokenizer;
  const auto cases = testing::read_jsonl(testing::tokenizer_references() / "corpus" / "hard.jsonl");
  std::set<std::int32_t> special;
  for (const auto& token : tokenizer.added_tokens()) special.insert(token.id);
  std::size_t mismatches = 0, checked = 0;
  std::string first;
  for (std::size_t i = 0; i < cases.size(); i += case_stride) {
    const auto ids = tokenizer.encode(cases[i], false);
    // SentencePiece puts a space before the text after a special token (llama.cpp does, and
    // Hugging Face's legacy LLaMA tokenizer), and its ▁ is the space: only text with neither
    // comes back as it was.
    if (std::any_of(ids.begin(), ids.end(), [&](std::int32_t id) { return special.count(id); }))
      continue;
    if (GetParam() == "llama2" && cases[i].find("\u2581") != std::string::npos) continue;
    ++checked;
    const std::string back = tokenizer.decode(ids);
    if (back == cases[i]) continue;
    if (mismatches++ == 0)
      first = nlohmann::json(cases[i]).dump() + " came back as " + nlohmann::json(back).dump();
  }
  EXPECT_GT(checked, cases.size() / case_stride / 2);
  EXPECT_EQ(mismatches, 0u) << GetParam() << ": " << first;
}

INSTANTIATE_TEST_SUITE_P(RealVocabularies, GgufVocabulary,
                         ::testing::Values("llama2", "gpt2", "llama3", "qwen3"));

// ---- SentencePiece's merge order, on vocabularies small enough to work out by hand --------

using Metadata = std::vector<std::pair<std::string, GgufValue>>;

GgufValue strings(const std::vector<std::string>& values) {
  GgufValue::Array out(values.begin(), values.end());
  return GgufValue::array(GgufType::string, std::move(out));
}
GgufValue floats(const std::vector<float>& values) {
  GgufValue::Array out(values.begin(), values.end());
  return GgufValue::array(GgufType::f32, std::move(out));
}
GgufValue ints(const std::vector<std::int32_t>& values) {
  GgufValue::Array out(values.begin(), values.end());
  return GgufValue::array(GgufType::i32, std::move(out));
}

Tokenizer tokenizer_of(const Metadata& metadata) {
  const testing::TemporaryDirectory dir;
  save_gguf(dir / "vocab.gguf", metadata, {});
  const GgufFile file(dir / "vocab.gguf");
  return text::tokenizer_from_gguf(file);
}

// <unk> <s> </s>, the byte tokens <0x00>..<0xFF>, then `pieces` with `scores`.
Metadata spm_vocabulary(const std::vector<std::string>& pieces, const std::vector<float>& scores) {
  std::vector<std::string> tokens{"<unk>", "<s>", "</s>"};
  std::vector<float> all_scores{0, 0, 0};
  std::vector<std::int32_t> types{2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    static constexpr char hex[] = "0123456789ABCDEF";
    tokens.push_back(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">");
    all_scores.push_back(0);
    types.push_back(6);
  }
  tokens.insert(tokens.end(), pieces.begin(), pieces.end());
  all_scores.insert(all_scores.end(), scores.begin(), scores.end());
  types.resize(tokens.size(), 1);
  return {{"tokenizer.ggml.model", "llama"},
          {"tokenizer.ggml.tokens", strings(tokens)},
          {"tokenizer.ggml.scores", floats(all_scores)},
          {"tokenizer.ggml.token_type", ints(types)}};
}

constexpr std::int32_t first_piece = 259;

TEST(GgufSentencePiece, MergesTheHighestScoringPairFirstAndTheLeftmostOnATie) {
  // ▁ a b ab ba, then ▁a: "aba" is ▁ a b a.
  const std::vector<std::string> pieces{"\xe2\x96\x81", "a", "b", "ab", "ba"};
  {  // ab and ba score alike: the leftmost pair (a b) goes first → ▁ ab a.
    const Tokenizer tok = tokenizer_of(spm_vocabulary(pieces, {-1, -2, -3, -5, -5}));
    EXPECT_EQ(tok.encode("aba", false),
              (std::vector<std::int32_t>{first_piece, first_piece + 3, first_piece + 1}));
  }
  {  // ba scores higher: ▁ a ba.
    const Tokenizer tok = tokenizer_of(spm_vocabulary(pieces, {-1, -2, -3, -6, -5}));
    EXPECT_EQ(tok.encode("aba", false),
              (std::vector<std::int32_t>{first_piece, first_piece + 1, first_piece + 4}));
  }
}

TEST(GgufSentencePiece, PrefixesASpaceAfterEverySpecialTokenAndSpellsUnknownCharactersAsBytes) {
  const Tokenizer tok = tokenizer_of(spm_vocabulary({"\xe2\x96\x81", "a",
                                                     "\xe2\x96\x81"
                                                     "a"},
                                                    {-1, -2, -3}));
  // "a" is ▁a; after <s> the next text is prefixed again; "é" (C3 A9) has no token.
  EXPECT_EQ(tok.encode("a<s>a", false),
            (std::vector<std::int32_t>{first_piece + 2, 1, first_piece + 2}));
  EXPECT_EQ(tok.encode("\xc3\xa9", false),
            (std::vector<std::int32_t>{first_piece, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(tok.encode("a", true), (std::vector<std::int32_t>{1, first_piece + 2}));  // BOS
  EXPECT_EQ(tok.decode(tok.encode("a \xc3\xa9", false)), "a \xc3\xa9");
  // add_space_prefix false: no ▁ in front.
  Metadata no_prefix = spm_vocabulary({"\xe2\x96\x81", "a",
                                       "\xe2\x96\x81"
                                       "a"},
                                      {-1, -2, -3});
  no_prefix.push_back({"tokenizer.ggml.add_space_prefix", false});
  EXPECT_EQ(tokenizer_of(no_prefix).encode("a a", false),
            (std::vector<std::int32_t>{first_piece + 1, first_piece + 2}));
}

// ---- bad metadata ---------------------------------------------------------------------------

template <class E>
void expect_refused(const Metadata& metadata, const std::string& fragment) {
  try {
    tokenizer_of(metadata);
    ADD_FAILURE() << "accepted; expected an error naming " << fragment;
  } catch (const E& error) {
    EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("vocab.gguf"), std::string::npos) << error.what();
  }
}

Metadata bpe_vocabulary() {
  return {{"tokenizer.ggml.model", "gpt2"},
          {"tokenizer.ggml.pre", "gpt-2"},
          {"tokenizer.ggml.tokens", strings({"a", "b", "ab", "<|end|>"})},
          {"tokenizer.ggml.token_type", ints({1, 1, 1, 3})},
          {"tokenizer.ggml.merges", strings({"a b"})}};
}

Metadata with(Metadata metadata, const std::string& key, GgufValue value) {
  for (auto& [k, v] : metadata) {
    if (k == key) {
      v = std::move(value);
      return metadata;
    }
  }
  metadata.push_back({key, std::move(value)});
  return metadata;
}

Metadata without(Metadata metadata, const std::string& key) {
  std::erase_if(metadata, [&](const auto& entry) { return entry.first == key; });
  return metadata;
}

TEST(GgufTokenizerErrors, AWellFormedSmallBpeVocabularyReads) {
  const Tokenizer tok = tokenizer_of(bpe_vocabulary());
  EXPECT_EQ(tok.encode("ab<|end|>a", false), (std::vector<std::int32_t>{2, 3, 0}));
  const testing::TemporaryDirectory dir;
  save_gguf(dir / "plain.gguf", Metadata{{"general.architecture", "llama"}}, {});
  EXPECT_FALSE(text::gguf_has_tokenizer(GgufFile(dir / "plain.gguf")));
  save_gguf(dir / "vocab.gguf", bpe_vocabulary(), {});
  EXPECT_TRUE(text::gguf_has_tokenizer(GgufFile(dir / "vocab.gguf")));
}

TEST(GgufTokenizerErrors, NameTheFileAndTheKey) {
  expect_refused<ConfigError>(with(bpe_vocabulary(), "tokenizer.ggml.model", "bert"),
                              "tokenizer.ggml.model \"bert\" is not supported");
  expect_refused<ConfigError>(with(bpe_vocabulary(), "tokenizer.ggml.pre", "deepseek-llm"),
                              "tokenizer.ggml.pre \"deepseek-llm\" is not supported");
  expect_refused<ConfigError>(without(bpe_vocabulary(), "tokenizer.ggml.pre"),
                              "tokenizer.ggml.pre \"\" (missing)");
  expect_refused<FormatError>(without(bpe_vocabulary(), "tokenizer.ggml.tokens"),
                              "tokenizer.ggml.tokens");
  expect_refused<FormatError>(without(bpe_vocabulary(), "tokenizer.ggml.merges"),
                              "tokenizer.ggml.merges");
  expect_refused<FormatError>(with(bpe_vocabulary(), "tokenizer.ggml.tokens",
                                   GgufValue::array(GgufType::u32, {GgufValue(std::uint32_t{1})})),
                              "tokenizer.ggml.tokens[0] is 1, not a string");
  expect_refused<FormatError>(with(bpe_vocabulary(), "tokenizer.ggml.merges", strings({"a c"})),
                              "tokenizer.ggml.merges[0]: \"c\" is not in the vocabulary");
  expect_refused<FormatError>(with(bpe_vocabulary(), "tokenizer.ggml.merges", strings({"ab"})),
                              "tokenizer.ggml.merges[0]: \"ab\" is not two tokens and a space");
  expect_refused<FormatError>(with(bpe_vocabulary(), "tokenizer.ggml.token_type", ints({1, 1})),
                              "tokenizer.ggml.token_type has 2 entries for 4 tokens");
  expect_refused<FormatError>(
      with(bpe_vocabulary(), "tokenizer.ggml.token_type", floats({1, 1, 1, 1})),
      "tokenizer.ggml.token_type must be an array of i32");
  expect_refused<FormatError>(
      with(bpe_vocabulary(), "tokenizer.ggml.bos_token_id", GgufValue(std::uint32_t{4})),
      "tokenizer.ggml.bos_token_id is 4, not the id of one of the 4 tokens");
  expect_refused<FormatError>(
      with(bpe_vocabulary(), "tokenizer.ggml.add_bos_token", GgufValue(true)),
      "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set");
  expect_refused<FormatError>(
      with(bpe_vocabulary(), "tokenizer.ggml.add_bos_token", GgufValue(std::uint8_t{1})),
      "tokenizer.ggml.add_bos_token is 1, not a bool");
  expect_refused<FormatError>(
      with(bpe_vocabulary(), "tokenizer.ggml.tokens", strings({"a", "a", "ab", "<|end|>"})),
      "tokenizer.ggml.tokens[1]");
  Metadata spm = spm_vocabulary({"a"}, {-1});
  expect_refused<FormatError>(with(spm, "tokenizer.ggml.scores", floats({0, 0})),
                              "tokenizer.ggml.scores has 2 entries for 260 tokens");
  std::vector<float> nan_scores(260, 0.0f);
  nan_scores[259] = std::numeric_limits<float>::quiet_NaN();
  expect_refused<FormatError>(with(spm, "tokenizer.ggml.scores", floats(nan_scores)),
                              "tokenizer.ggml.scores[259] is NaN");
}

TEST(GgufTokenizerMetadata, PadsTheTokensToTheModelsVocabulary) {
  const auto path = testing::vocab_tokenizer_json(DISSECT_TOKENIZER_PACKAGES, "gpt2");
  const auto entries = text::gguf_tokenizer_metadata(path, 50304);
  const auto& tokens = *entries[2].second.as_array();
  ASSERT_EQ(entries[2].first, "tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 50304u);
  EXPECT_EQ(*tokens[50256].as_string(), "<|endoftext|>");
  EXPECT_EQ(*tokens[50303].as_string(), "[PAD50303]");
  EXPECT_EQ(std::get<std::int32_t>(entries[3].second.as_array()->at(50303).storage()), 5);
  try {
    (void)text::gguf_tokenizer_metadata(path, 50000);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("its 50257 token ids do not fit the model's vocabulary of 50000"),
              std::string::npos)
        << error.what();
  }
}

TEST(GgufTokenizerMetadata, RefusesTokenizersWithNoGgufForm) {
  const testing::TemporaryDirectory dir;
  const auto refused = [&](const std::string& json, const std::string& fragment) {
    std::ofstream(dir / "tokenizer.json") << json;
    try {
      (void)text::gguf_tokenizer_metadata(dir / "tokenizer.json");
      ADD_FAILURE() << "accepted " << json;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
      EXPECT_NE(std::string(error.what()).find("tokenizer.json"), std::string::npos);
    }
  };
  refused(R"({"model": {"type": "WordPiece", "vocab": {}}})",
          "model \"WordPiece\" has no GGUF form");
  refused(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
              "pre_tokenizer": {"type": "Whitespace"}})",
          "is not one llama.cpp names");
  refused(R"({"model": {"type": "BPE", "vocab": {"a": 0}}})", "model needs vocab and merges");
  refused(R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []},
              "pre_tokenizer": {"type": "ByteLevel"}})",
          "vocab[\"a\"] is not an id");
  std::ofstream(dir / "tokenizer_config.json") << R"({"bos_token": "<s>"})";
  refused(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
              "pre_tokenizer": {"type": "ByteLevel"}})",
          "bos_token \"<s>\" is not a token of the tokenizer");
}

}  // namespace test_gguf_tokenizer
}  // namespace dissect
