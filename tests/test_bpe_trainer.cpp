// Tests of dissect/text/bpe_trainer.hpp: hand-computed merges (the classic "aaabdaaabac" and the
// tie rule), agreement with a direct implementation of the definition (a full recount per
// merge) on random small corpora and on the fortunes, the properties of a trained vocabulary
// (counts never rise, encode and decode undo each other), its tokenizer.json, and the committed
// reference: tests/reference/tokenizers/trained/fortunes-500.* (made by train_fixture.cpp and
// make_trainer_fixture.mjs, which encodes with transformers.js).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "dissect/text/bpe_trainer.hpp"
#include "dissect/text/tokenizer_files.hpp"
#include "support/sanitizers.hpp"
#include "support/tokenizer_fixtures.hpp"

namespace dissect {
namespace test_bpe_trainer {

namespace fs = std::filesystem;
using text::BpeMerge;
using text::BpeTrainer;
using text::BpeTrainerOptions;
using text::Tokenizer;
using text::TrainedBpe;

fs::path references() {
  return testing::tokenizer_references();
}

using testing::read_ids;
using testing::read_jsonl;
using testing::read_lines;

TrainedBpe train(const std::vector<std::string>& texts, BpeTrainerOptions options) {
  return text::train_bpe(std::span<const std::string>(texts), std::move(options));
}

// (left, right) of every merge.
std::vector<std::pair<std::int32_t, std::int32_t>> pairs_of(const TrainedBpe& bpe) {
  std::vector<std::pair<std::int32_t, std::int32_t>> out;
  for (const BpeMerge& m : bpe.merges) out.emplace_back(m.left, m.right);
  return out;
}

// The definition, directly: count every adjacent pair of every word (weighted by the word's
// count) afresh before each merge, take the largest count and among equal counts the smallest
// (left, right), merge it left to right in every word. Slow, and obviously right.
std::vector<BpeMerge> train_by_recounting(const std::map<std::string, std::uint64_t>& word_counts,
                                          std::size_t merges, std::uint64_t min_frequency,
                                          std::vector<std::string>& tokens) {
  std::vector<std::pair<std::vector<std::int32_t>, std::uint64_t>> words;
  for (const auto& [word, count] : word_counts) {
    std::vector<std::int32_t> symbols;
    for (const char c : word) symbols.push_back(static_cast<unsigned char>(c));
    words.emplace_back(std::move(symbols), count);
  }
  tokens.clear();
  for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
  std::vector<BpeMerge> out;
  while (out.size() < merges) {
    // key = left · 2³² + right, which orders pairs as (left, right) does
    std::unordered_map<std::uint64_t, std::uint64_t> counts;
    for (const auto& [symbols, count] : words) {
      for (std::size_t i = 0; i + 1 < symbols.size(); ++i) {
        counts[static_cast<std::uint64_t>(symbols[i]) << 32 |
               static_cast<std::uint32_t>(symbols[i + 1])] += count;
      }
    }
    std::uint64_t best_key = 0, best_count = 0;
    for (const auto& [key, count] : counts) {
      if (count > best_count || (count == best_count && key < best_key)) {
        best_key = key;
        best_count = count;
      }
    }
    if (best_count == 0 || best_count < min_frequency) break;
    const std::pair<std::int32_t, std::int32_t> best(
        static_cast<std::int32_t>(best_key >> 32),
        static_cast<std::int32_t>(best_key & 0xFFFFFFFFu));
    const std::string joined = tokens[best.first] + tokens[best.second];
    const auto found = std::find(tokens.begin(), tokens.end(), joined);
    const auto id = static_cast<std::int32_t>(found - tokens.begin());
    if (found == tokens.end()) tokens.push_back(joined);
    out.push_back({best.first, best.second, id, best_count});
    for (auto& [symbols, count] : words) {
      std::vector<std::int32_t> merged;
      for (std::size_t i = 0; i < symbols.size();) {
        if (i + 1 < symbols.size() && symbols[i] == best.first && symbols[i + 1] == best.second) {
          merged.push_back(id);
          i += 2;
        } else {
          merged.push_back(symbols[i++]);
        }
      }
      symbols = std::move(merged);
    }
  }
  return out;
}

// The words GPT-2's pre-tokenizer cuts `texts` into, counted: what the trainer counts too.
std::map<std::string, std::uint64_t> count_words(const std::vector<std::string>& texts) {
  const nlohmann::json spec = {
      {"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  const auto pre = text::PreTokenizer::from_json(text::detail::JsonCursor(spec, "", "test"));
  std::map<std::string, std::uint64_t> counts;
  for (const auto& t : texts) {
    pre.split(text::Piece{t, nullptr, {}},
              [&](const text::Piece& word) { ++counts[std::string(word.text)]; });
  }
  return counts;
}

void expect_same_merges(const TrainedBpe& got, const std::vector<BpeMerge>& expected,
                        const std::vector<std::string>& expected_tokens) {
  ASSERT_EQ(got.merges.size(), expected.size());
  EXPECT_EQ(got.tokens, expected_tokens);
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const BpeMerge& a = got.merges[i];
    const BpeMerge& b = expected[i];
    ASSERT_TRUE(a.left == b.left && a.right == b.right && a.id == b.id && a.count == b.count)
        << "merge " << i << ": got " << a.left << " + " << a.right << " = " << a.id << " ("
        << a.count << "), expected " << b.left << " + " << b.right << " = " << b.id << " ("
        << b.count << ")";
  }
}

// ---- hand-computed ----------------------------------------------------------------------------

// The classic example (Gage 1994; Wikipedia's "Byte pair encoding"). "aaabdaaabac" is one word
// (all letters); a = 97, b = 98, c = 99, d = 100.
//   a a a b d a a a b a c: (a,a) 4, (a,b) 2, then (b,d) (d,a) (b,a) (a,c) 1 each
//   merge 1: (97,97) count 4 → 256 "aa"; left to right "aaa" becomes aa a:  256 a b d 256 a b a c
//            now (256,a) 2, (a,b) 2, (b,d) (d,256) (b,a) (a,c) 1
//   merge 2: a tie at 2, (97,98) < (256,97) → 257 "ab":                    256 257 d 256 257 a c
//            now (256,257) 2, the rest 1
//   merge 3: (256,257) count 2 → 258 "aaab":                               258 d 258 a c
//   then every pair occurs once, below min_frequency 2: training stops with 3 merges.
TEST(BpeTrainer, LearnsTheClassicExampleByHand) {
  const TrainedBpe bpe = train({"aaabdaaabac"}, {.merges = 10});
  ASSERT_EQ(bpe.merges.size(), 3u);
  EXPECT_EQ(pairs_of(bpe),
            (std::vector<std::pair<std::int32_t, std::int32_t>>{{97, 97}, {97, 98}, {256, 257}}));
  EXPECT_EQ(bpe.merges[0].count, 4u);
  EXPECT_EQ(bpe.merges[1].count, 2u);
  EXPECT_EQ(bpe.merges[2].count, 2u);
  EXPECT_EQ(bpe.merges[2].id, 258);
  ASSERT_EQ(bpe.tokens.size(), 259u);
  EXPECT_EQ(bpe.tokens[256], "aa");
  EXPECT_EQ(bpe.tokens[257], "ab");
  EXPECT_EQ(bpe.tokens[258], "aaab");
  EXPECT_EQ(bpe.words, 1u);
  EXPECT_EQ(bpe.distinct_words, 1u);
  EXPECT_EQ(bpe.to_tokenizer().encode("aaabdaaabac"),
            (std::vector<std::int32_t>{258, 100, 258, 97, 99}));

  // At most `merges`; and min_frequency 1 goes on merging pairs seen once: (97,99) "ac" is the
  // smallest of the pairs left at 1, (258,97), (258,100), (100,258), (97,99).
  EXPECT_EQ(pairs_of(train({"aaabdaaabac"}, {.merges = 1})),
            (std::vector<std::pair<std::int32_t, std::int32_t>>{{97, 97}}));
  const TrainedBpe more = train({"aaabdaaabac"}, {.merges = 4, .min_frequency = 1});
  ASSERT_EQ(more.merges.size(), 4u);
  EXPECT_EQ(std::pair(more.merges[3].left, more.merges[3].right), std::pair(97, 99));
  EXPECT_EQ(more.merges[3].count, 1u);
}

// The tie rule on its own: "yz" and "ab" twice each (texts of their own, so each is one word):
// (121,122) and (97,98) both occur twice. The smaller pair, (97,98), is merged first, although
// "yz" came first; then "ab" has no pairs left and "yz" is merged. Among pairs with one left id,
// the smaller right id wins: "ac" ×2 and "ab" ×2 give "ab" first.
TEST(BpeTrainer, BreaksTiesByTheSmallestPairOfIds) {
  const TrainedBpe bpe = train({"yz", "yz", "ab", "ab"}, {.merges = 10});
  EXPECT_EQ(pairs_of(bpe),
            (std::vector<std::pair<std::int32_t, std::int32_t>>{{97, 98}, {121, 122}}));
  EXPECT_EQ(bpe.tokens[256], "ab");
  EXPECT_EQ(bpe.tokens[257], "yz");
  EXPECT_EQ(pairs_of(train({"ac", "ac", "ab", "ab"}, {.merges = 10})),
            (std::vector<std::pair<std::int32_t, std::int32_t>>{{97, 98}, {97, 99}}));
}

// Words come from GPT-2's pre-tokenizer and count with their frequency: the texts cut into
// "low" ×2, " low" ×2, " lower", " lowest". (l,o) and (o,w) occur 2 + 2 + 1 + 1 = 6 times, ( ,l)
// 4, (w,e) 2, the rest once. The tie at 6 goes to (108,111) < (111,119): "lo"; then (256,119)
// "low" occurs 6 times, ( ,256) 4.
TEST(BpeTrainer, CountsPreTokenizedWordsWithTheirFrequency) {
  const TrainedBpe bpe = train({"low lower lowest", "low low low"}, {.merges = 2});
  EXPECT_EQ(pairs_of(bpe),
            (std::vector<std::pair<std::int32_t, std::int32_t>>{{108, 111}, {256, 119}}));
  EXPECT_EQ(bpe.merges[0].count, 6u);
  EXPECT_EQ(bpe.merges[1].count, 6u);
  EXPECT_EQ(bpe.words, 6u);           // low, " lower", " lowest", low, " low", " low"
  EXPECT_EQ(bpe.distinct_words, 4u);  // "low", " low", " lower", " lowest"
}

// Special tokens are cut out of the text before counting (else "<|", "endoftext" and "|>"
// would be words, their pairs merged) and take the ids after the learned tokens.
TEST(BpeTrainer, CutsSpecialTokensOutAndNumbersThemLast) {
  const TrainedBpe bpe = train({"<|endoftext|>xy<|endoftext|>", "<|endoftext|>xy"},
                               {.merges = 10, .special_tokens = {"<|endoftext|>"}});
  EXPECT_EQ(pairs_of(bpe), (std::vector<std::pair<std::int32_t, std::int32_t>>{{120, 121}}));
  EXPECT_EQ(bpe.vocab_size(), 258u);
  const Tokenizer tok = bpe.to_tokenizer();
  EXPECT_EQ(tok.token_to_id("<|endoftext|>"), 257);
  EXPECT_EQ(tok.encode("<|endoftext|>xy"), (std::vector<std::int32_t>{257, 256}));
  EXPECT_EQ(tok.decode(tok.encode("xy<|endoftext|>"), true), "xy");
  EXPECT_EQ(tok.vocab_size(), 258u);
}

TEST(BpeTrainer, LearnsNothingFromNothing) {
  BpeTrainer trainer({.merges = 5});
  const TrainedBpe bpe = trainer.train();
  EXPECT_TRUE(bpe.merges.empty());
  EXPECT_EQ(bpe.tokens.size(), 256u);
  EXPECT_EQ(bpe.to_tokenizer().encode("hi"), (std::vector<std::int32_t>{104, 105}));
  trainer.add_text("");
  trainer.add_text("x");  // a word of one byte has no pairs
  EXPECT_TRUE(trainer.train().merges.empty());
  EXPECT_EQ(trainer.texts(), 2u);
}

// ---- against the definition ------------------------------------------------------------------

// Random small corpora over two or three letters, where counts tie all the time and runs like
// "aaaa" test the left-to-right merge: the incremental trainer must learn exactly what a full
// recount per merge learns, counts included.
TEST(BpeTrainer, LearnsWhatRecountingEveryMergeLearnsOnRandomCorpora) {
  std::mt19937 random(20240601);
  for (int trial = 0; trial < 400; ++trial) {
    const int letters = 2 + static_cast<int>(random() % 2);
    std::vector<std::string> texts;
    for (int w = 0, n = 1 + static_cast<int>(random() % 10); w < n; ++w) {
      std::string word;
      for (int i = 0, length = 1 + static_cast<int>(random() % 16); i < length; ++i) {
        word += static_cast<char>('a' + random() % static_cast<unsigned>(letters));
      }
      texts.push_back(word + (random() % 2 ? " " + word : ""));  // sometimes two words
    }
    const std::size_t merges = 1 + random() % 40;
    const std::uint64_t min_frequency = random() % 3;
    std::vector<std::string> tokens;
    const auto expected = train_by_recounting(count_words(texts), merges, min_frequency, tokens);
    SCOPED_TRACE(::testing::Message() << "trial " << trial << ": " << nlohmann::json(texts).dump());
    expect_same_merges(train(texts, {.merges = merges, .min_frequency = min_frequency}), expected,
                       tokens);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

// ---- the fortunes ----------------------------------------------------------------------------

// What train_fixture.cpp trains the committed fixture with (keep the two the same).
BpeTrainerOptions fixture_options() {
  return {.merges = 500, .min_frequency = 2, .special_tokens = {"<|endoftext|>"}};
}

const std::vector<std::string>& corpus(const std::string& name) {
  static std::map<std::string, std::vector<std::string>> loaded;
  auto found = loaded.find(name);
  if (found == loaded.end())
    found = loaded.emplace(name, read_jsonl(references() / "corpus" / (name + ".jsonl"))).first;
  return found->second;
}

const TrainedBpe& fortunes_500() {
  static const TrainedBpe bpe = train(corpus("fortunes"), fixture_options());
  return bpe;
}

TEST(BpeTrainerFortunes, LearnsWhatRecountingEveryMergeLearns) {
#if defined(DISSECT_TEST_SANITIZED)
  // Recounting costs a pass over every word per merge: 25 s for 500 merges under the sanitizers,
  // which look for memory errors, and the first 100 merges run every code path the 500 do.
  BpeTrainerOptions options = fixture_options();
  options.merges = 100;
  const TrainedBpe got = train(corpus("fortunes"), options);
#else
  const TrainedBpe& got = fortunes_500();
#endif
  std::vector<std::string> tokens;
  const auto expected =
      train_by_recounting(count_words(corpus("fortunes")), got.merges.size(), 2, tokens);
  expect_same_merges(got, expected, tokens);
}

TEST(BpeTrainerFortunes, MergesAreConsistentAndTheirCountsNeverRise) {
  const TrainedBpe& bpe = fortunes_500();
  ASSERT_EQ(bpe.merges.size(), 500u);
  ASSERT_EQ(bpe.tokens.size(), 756u);  // no two merges spelled one token
  EXPECT_EQ(bpe.special_tokens, std::vector<std::string>{"<|endoftext|>"});
  EXPECT_EQ(bpe.vocab_size(), 757u);
  EXPECT_GT(bpe.words, 30000u);
  for (std::size_t i = 0; i < bpe.merges.size(); ++i) {
    const BpeMerge& m = bpe.merges[i];
    EXPECT_EQ(m.id, static_cast<std::int32_t>(256 + i));
    EXPECT_LT(m.left, m.id);
    EXPECT_LT(m.right, m.id);
    EXPECT_EQ(bpe.tokens[static_cast<std::size_t>(m.id)],
              bpe.tokens[static_cast<std::size_t>(m.left)] +
                  bpe.tokens[static_cast<std::size_t>(m.right)]);
    EXPECT_GE(m.count, 2u);
    if (i > 0) {
      EXPECT_LE(m.count, bpe.merges[i - 1].count) << "merge " << i;
    }
  }
  // The most frequent pair of English text split GPT-2's way: " t" (" the", " to", " that").
  EXPECT_EQ(bpe.tokens[256], " t");
}

TEST(BpeTrainerFortunes, EncodesTheTrainingTextInFewerTokensThanBytesAndDecodesItBack) {
  const Tokenizer tok = fortunes_500().to_tokenizer();
  std::size_t bytes = 0, tokens = 0;
  for (const auto& s : corpus("fortunes")) {
    const auto ids = tok.encode(s);
    bytes += s.size();
    tokens += ids.size();
    ASSERT_EQ(tok.decode(ids), s);
  }
  EXPECT_LT(tokens, bytes / 2) << tokens << " tokens for " << bytes
                               << " bytes";  // about 2.2 bytes a token
  for (const auto& s : corpus("hard")) {
    EXPECT_EQ(tok.decode(tok.encode(s, false)), s) << nlohmann::json(s.substr(0, 200)).dump();
  }
}

// ---- tokenizer.json ---------------------------------------------------------------------------

TEST(BpeTrainerJson, WritesGpt2sPipelineAndTheVocabularyInTheByteLevelAlphabet) {
  const TrainedBpe bpe =
      train({"the the the", "<s>"}, {.merges = 3, .special_tokens = {"<s>", "<pad>"}});
  const std::string text = bpe.to_tokenizer_json();
  EXPECT_EQ(text, bpe.to_tokenizer_json());
  EXPECT_EQ(text.back(), '\n');
  const auto json = nlohmann::json::parse(text);
  EXPECT_EQ(json["version"], "1.0");
  for (const char* key : {"normalizer", "truncation", "padding"})
    EXPECT_TRUE(json[key].is_null()) << key;
  EXPECT_EQ(json["pre_tokenizer"], nlohmann::json::parse(R"({"type": "ByteLevel",
      "add_prefix_space": false, "trim_offsets": true, "use_regex": true})"));
  EXPECT_EQ(json["post_processor"]["type"], "ByteLevel");
  EXPECT_EQ(json["post_processor"]["trim_offsets"], false);
  EXPECT_EQ(json["decoder"]["type"], "ByteLevel");
  const auto& model = json["model"];
  EXPECT_EQ(model["type"], "BPE");
  EXPECT_EQ(model["byte_fallback"], false);
  EXPECT_EQ(model["ignore_merges"], false);
  // The words are "the", " the", " the" ("<s>" is cut out): "th" (116,104) and "he" (104,101)
  // occur 3 times, " t" twice. The tie goes to "he"; then "the" (116,256) occurs 3 times, " the"
  // (32,257) twice.
  EXPECT_EQ(model["merges"], nlohmann::json::parse(R"([["h", "e"], ["t", "he"], ["Ġ", "the"]])"));
  EXPECT_EQ(model["vocab"].size(), 256u + 3u + 2u);
  EXPECT_EQ(model["vocab"]["Ġ"], 32);
  EXPECT_EQ(model["vocab"]["Ā"], 0);
  EXPECT_EQ(model["vocab"]["Ġthe"], 258);
  EXPECT_EQ(model["vocab"]["<pad>"], 260);
  ASSERT_EQ(json["added_tokens"].size(), 2u);
  EXPECT_EQ(json["added_tokens"][0],
            nlohmann::json::parse(R"({"id": 259, "content": "<s>", "single_word": false,
      "lstrip": false, "rstrip": false, "normalized": false, "special": true})"));
  EXPECT_EQ(json["added_tokens"][1]["id"], 260);

  const Tokenizer tok = bpe.to_tokenizer();
  EXPECT_EQ(tok.kind(), "byte-level BPE");
  EXPECT_EQ(tok.vocab_size(), 261u);
  EXPECT_EQ(tok.encode("<s>the the"), (std::vector<std::int32_t>{259, 257, 258}));
}

// ---- errors ------------------------------------------------------------------------------------

// Runs `f`, which must throw an E whose message holds `expected`.
template <class E, class F>
void expect_error(F&& f, std::string_view expected) {
  try {
    f();
  } catch (const E& e) {
    EXPECT_NE(std::string_view(e.what()).find(expected), std::string_view::npos) << e.what();
    return;
  }
  ADD_FAILURE() << "nothing thrown; expected \"" << expected << "\"";
}

TEST(BpeTrainerErrors, RefusesOptionsThatMakeNoSense) {
  expect_error<ConfigError>([] { BpeTrainer({.merges = 0}); }, "BpeTrainerOptions::merges is 0");
  expect_error<ConfigError>([] { BpeTrainer({.merges = 10'000'001}); }, "merges is 10000001");
  EXPECT_NO_THROW(BpeTrainer({.merges = 10'000'000}));
  const auto with_specials = [](std::vector<std::string> specials) {
    return [specials] { BpeTrainer({.merges = 1, .special_tokens = specials}); };
  };
  expect_error<ConfigError>(with_specials({"<s>", ""}), "special_tokens[1] is empty");
  expect_error<ConfigError>(with_specials({"<s>", "<s>"}),
                            "special_tokens[1] \"<s>\" is also special_tokens[0]");
  expect_error<ConfigError>(with_specials({"\xC0\xAF"}), "special_tokens[0] is not UTF-8");
  // A special token spelled like a token of the vocabulary: the byte "a", or " x" ("Ġx").
  expect_error<ConfigError>([] { train({"ab"}, {.merges = 1, .special_tokens = {"a"}}); },
                            "special_tokens[0] \"a\" is spelled like token 97");
  expect_error<ConfigError>([] { train({" x x x"}, {.merges = 1, .special_tokens = {"Ġx"}}); },
                            "is spelled like token 256");
}

TEST(BpeTrainerErrors, RefusesTextThatIsNotUtf8NamingTheTextAndTheOffset) {
  BpeTrainer trainer({.merges = 5});
  trainer.add_text("fine");
  const std::string bad = std::string("ab") + '\xFF' + "cd";
  expect_error<FormatError>([&] { trainer.add_text(bad); },
                            "BpeTrainer::add_text: text 1 is not UTF-8: byte 0xff at offset 2");
  const std::vector<std::string_view> texts = {"ok", "ok", "\xE2\x82"};
  expect_error<FormatError>([&] { text::train_bpe(texts, {.merges = 5}); }, "text 2 is not UTF-8");
}

// ---- the reference ---------------------------------------------------------------------------

// The committed tokenizer.json is what training gives today, byte for byte, and the reference
// (transformers.js, reading that file) encodes the hard set and the GPL as our Tokenizer does.
TEST(BpeTrainerReference, RetrainingGivesTheCommittedTokenizerJson) {
  const fs::path path = references() / "trained" / "fortunes-500.tokenizer.json";
  const std::string committed = text::read_text_file(path, "test");
  const std::string trained = fortunes_500().to_tokenizer_json();
  if (trained != committed) {
    const auto at =
        std::mismatch(trained.begin(), trained.end(), committed.begin(), committed.end());
    const auto offset = static_cast<std::size_t>(at.first - trained.begin());
    FAIL() << "the trained tokenizer.json differs from " << path << " from byte " << offset << ": "
           << nlohmann::json(trained.substr(offset > 80 ? offset - 80 : 0, 160)).dump() << " vs "
           << nlohmann::json(committed.substr(offset > 80 ? offset - 80 : 0, 160)).dump()
           << " (regenerate: tests/reference/tokenizers/README.md)";
  }
}

TEST(BpeTrainerReference, EncodesTheHardSetAndTheGplAsTransformersJsDoes) {
  const fs::path dir = references() / "trained";
  const Tokenizer tok = text::load_tokenizer_json(dir / "fortunes-500.tokenizer.json");
  EXPECT_EQ(tok.vocab_size(), 757u);
  for (const std::string name : {"hard", "gpl"}) {
    const auto& cases = corpus(name);
    const auto expected = read_ids(dir / ("fortunes-500." + name + ".ids"));
    ASSERT_EQ(cases.size(), expected.size()) << name;
    std::size_t mismatches = 0;
    for (std::size_t i = 0; i < cases.size(); ++i) {
      if (tok.encode(cases[i], true) == expected[i]) continue;
      if (mismatches++ < 3) {
        ADD_FAILURE() << name << " case " << i << " "
                      << nlohmann::json(cases[i].substr(0, 200)).dump();
      }
    }
    EXPECT_EQ(mismatches, 0u) << name << ": " << mismatches << " of " << cases.size()
                              << " cases differ";
  }
}

}  // namespace test_bpe_trainer
}  // namespace dissect
