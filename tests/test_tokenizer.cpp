// Tests of dissect/text's parts on small hand-made tokenizers, with the expected outcome worked
// out by hand: UTF-8 and lossy decoding, the JavaScript meaning of the split patterns, Split's
// five behaviours (Hugging Face's own documentation example), Metaspace, the added-token flags,
// BPE's two merge loops against each other, and every refusal: malformed JSON, a merge naming no
// token, one id twice, an id past the vocabulary, a symbol nothing encodes, an unsupported
// component named by its JSON path, a 100 MB line in linear time.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dissect/text/decode_stream.hpp"
#include "dissect/text/normalizer.hpp"
#include "dissect/text/tokenizer_files.hpp"
#include "support/io_testing.hpp"
#include "support/sanitizers.hpp"

namespace dissect {
namespace test_tokenizer {

using nlohmann::json;
using text::Tokenizer;

// A byte-level tokenizer.json: the 256 bytes, then `merges` (in the byte-level alphabet, "Ġ" for
// a space) each adding its result as the next id.
json byte_level_json(const std::vector<std::pair<std::string, std::string>>& merges,
                     json pre_tokenizer = nullptr) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[text::to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  json merge_list = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    if (!vocab.contains(a + b)) vocab[a + b] = next++;
    merge_list.push_back(json::array({a, b}));
  }
  if (pre_tokenizer.is_null())
    pre_tokenizer = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", pre_tokenizer},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merge_list}}}};
}

Tokenizer load(const json& j) {
  return Tokenizer::from_json(j.dump(), "test.json");
}

std::vector<std::string> pieces_of(const Tokenizer& tokenizer, const std::string& s) {
  std::vector<std::string> out;
  for (const auto id : tokenizer.encode(s)) out.push_back(*tokenizer.id_to_token(id));
  return out;
}

template <class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const Error& error) {
    return error.what();
  }
  return "(nothing thrown)";
}

// ---- UTF-8 ----------------------------------------------------------------------------------

TEST(Utf8, ValidSequencesAndTheirLengths) {
  EXPECT_EQ(text::valid_sequence_length("a", 0), 1u);
  EXPECT_EQ(text::valid_sequence_length("\xC3\xA9", 0), 2u);          // é
  EXPECT_EQ(text::valid_sequence_length("\xE2\x82\xAC", 0), 3u);      // €
  EXPECT_EQ(text::valid_sequence_length("\xF0\x9F\x98\x80", 0), 4u);  // 😀
  EXPECT_EQ(text::valid_sequence_length("\xC0\xAF", 0), 0u);          // overlong '/'
  EXPECT_EQ(text::valid_sequence_length("\xED\xA0\x80", 0), 0u);      // a surrogate
  EXPECT_EQ(text::valid_sequence_length("\xF4\x90\x80\x80", 0), 0u);  // above U+10FFFF
  EXPECT_EQ(text::valid_sequence_length("\xE2\x82", 0), 0u);          // cut short
}

TEST(Utf8, LossyDecodingReplacesEachMaximalSubpartOnce) {
  // WHATWG: "\xE2\x82" is one incomplete sequence (one U+FFFD); "\xC0\xAF" two invalid bytes.
  EXPECT_EQ(text::to_valid_utf8("a\xE2\x82"
                                "b"),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(text::to_valid_utf8("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(text::to_valid_utf8("\xF0\x9F\x98"), "\xEF\xBF\xBD");
  EXPECT_EQ(text::incomplete_utf8_suffix("ok\xF0\x9F\x98"), 3u);
  EXPECT_EQ(text::incomplete_utf8_suffix("ok\xC0"), 0u);  // can never be completed
  EXPECT_EQ(text::incomplete_utf8_suffix("ok\xF0\x9F\x98\x80"), 0u);
}

TEST(ByteLevel, TheAlphabetRoundTripsEveryByte) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
  EXPECT_EQ(text::from_byte_level(text::to_byte_level(all)), all);
  EXPECT_EQ(text::to_byte_level(" hello\n"), "\xC4\xA0hello\xC4\x8A");  // Ġhello Ċ
  EXPECT_FALSE(text::from_byte_level("\xE2\x96\x81").has_value());      // ▁ is not in it
}

// ---- patterns -------------------------------------------------------------------------------

TEST(Regex, SpacesAndCaseFollowJavaScript) {
  const text::Regex space("\\s", "test");
  const auto matches = [](const text::Regex& regex, const std::string& s) {
    int n = 0;
    regex.for_each_match(s, "test", [&](std::size_t, std::size_t) { ++n; });
    return n;
  };
  EXPECT_EQ(matches(space, "\xEF\xBB\xBF"), 1);  // U+FEFF is JavaScript whitespace
  EXPECT_EQ(matches(space, "\xC2\x85"), 0);      // U+0085 is not
  EXPECT_EQ(matches(space, "\xE1\xA0\x8E"), 0);  // nor U+180E
  const text::Regex contraction("(?i:'s|'t)", "test");
  EXPECT_EQ(matches(contraction, "'S 's 'T"), 3);
  EXPECT_EQ(matches(contraction, "'\xC5\xBF"), 0);  // the long s ſ folds to s in Unicode, not here
  EXPECT_THROW(text::Regex("(unclosed", "test"), ConfigError);
}

// Row 119: a pattern that backtracks catastrophically at every position, each call under
// PCRE2's own limit (57 s on 100 KB before), meets the work bound of the whole encode: an Error
// naming the pattern, in well under a second. A text it matches cheaply still encodes.
TEST(Regex, CatastrophicBacktrackingMeetsTheWorkBoundOfTheEncode) {
  const auto tokenizer = load(byte_level_json(
      {}, json{{"type", "Sequence"},
               {"pretokenizers",
                {{{"type", "Split"},
                  {"pattern", {{"Regex", "(a+)+b|\\s"}}},
                  {"behavior", "Isolated"},
                  {"invert", false}},
                 {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}}));
  EXPECT_EQ(tokenizer.encode("aab ab  x").size(), 9u);
  std::string text;
  while (text.size() < (100u << 10)) text += std::string(22, 'a') + " ";
  const auto start = std::chrono::steady_clock::now();
  const std::string message = message_of([&] { tokenizer.encode(text); });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(message.find("PreTokenizer Split: the pattern \"(a+)+b|\\s\" exceeded the work bound "
                         "of matching 102419 bytes of text"),
            std::string::npos)
      << message;
  EXPECT_LT(seconds, 20.0);  // about 1 s in a Debug build; the budget is 1.1e8 steps + 1e4/byte
}

// Row 120: when the JIT's stack is too small, the interpreter really takes over (it was called
// without PCRE2_NO_JIT and failed the same way): a repeated group over 1 MB, and recursion
// 20,000 parentheses deep, each one match of the whole text.
TEST(Regex, TheJitStackFallbackRunsTheInterpreter) {
  const auto whole = [](const text::Regex& regex, const std::string& s) {
    std::vector<std::pair<std::size_t, std::size_t>> found;
    regex.for_each_match(s, "test",
                         [&](std::size_t b, std::size_t e) { found.emplace_back(b, e); });
    return found == std::vector<std::pair<std::size_t, std::size_t>>{{0, s.size()}};
  };
  std::string ab;
  while (ab.size() < (1u << 20)) ab += "ab";
  EXPECT_TRUE(whole(text::Regex("(?:a|b)*c", "test"), ab + "c"));
  const std::size_t depth = 20000;
  EXPECT_TRUE(whole(text::Regex("\\((?:[^()]|(?R))*\\)", "test"),
                    std::string(depth, '(') + std::string(depth, ')')));
}

// Hugging Face's documentation of SplitDelimiterBehavior: "the-final--countdown" split on "-".
TEST(Split, TheFiveBehavioursOfHuggingFacesExample) {
  // The pieces themselves: a pre-tokenizer on its own.
  const auto pieces = [](const std::string& behavior, bool invert = false) {
    const json pre = {{"type", "Split"},
                      {"pattern", {{"String", "-"}}},
                      {"behavior", behavior},
                      {"invert", invert}};
    const auto splitter =
        text::PreTokenizer::from_json(text::detail::JsonCursor(pre, "pre_tokenizer", "test"));
    std::vector<std::string> out;
    const std::string s = "the-final--countdown";
    splitter.split(text::Piece{s, nullptr, {}},
                   [&](const text::Piece& p) { out.emplace_back(p.text); });
    return out;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Removed"), (V{"the", "final", "countdown"}));
  EXPECT_EQ(pieces("Isolated"), (V{"the", "-", "final", "-", "-", "countdown"}));
  EXPECT_EQ(pieces("MergedWithPrevious"), (V{"the-", "final-", "-", "countdown"}));
  EXPECT_EQ(pieces("MergedWithNext"), (V{"the", "-final", "-", "-countdown"}));
  EXPECT_EQ(pieces("Contiguous"), (V{"the", "-", "final", "--", "countdown"}));
  EXPECT_EQ(pieces("Removed", true), (V{"-", "-", "-"}));  // inverted: the matches are kept
}

TEST(Metaspace, ReplacesSpacesPrependsAndSplitsBeforeEachReplacement) {
  const json pre = {{"type", "Metaspace"},
                    {"replacement", "\xE2\x96\x81"},
                    {"prepend_scheme", "always"},
                    {"split", true}};
  const auto splitter =
      text::PreTokenizer::from_json(text::detail::JsonCursor(pre, "pre_tokenizer", "test"));
  std::vector<std::string> out;
  const std::string s = "Hey  friend";
  splitter.split(text::Piece{s, nullptr, {}},
                 [&](const text::Piece& p) { out.emplace_back(p.text); });
  EXPECT_EQ(out, (std::vector<std::string>{"\xE2\x96\x81Hey", "\xE2\x96\x81",
                                           "\xE2\x96\x81"
                                           "friend"}));
}

// Row 121: a normalizer's output is bounded by its input, checked before the bytes are
// appended: a Replace of each letter by 10,000 bytes is refused naming the normalizer and the
// sizes (it used to allocate 10,000 times the text, 4 GB before bad_alloc); inside a Sequence the
// bound is of the Sequence's input, not of each step's.
TEST(Normalizer, AnExpansionPastTheBoundIsRefusedBeforeAllocating) {
  const auto normalizer = [](const json& j) {
    return text::Normalizer::from_json(text::detail::JsonCursor(j, "normalizer", "t.json"));
  };
  const json replace = {
      {"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", std::string(10000, 'x')}};
  const std::string text(100000, 'a');
  for (const bool tracked : {false, true}) {
    EXPECT_NE(message_of(
                  [&] { normalizer(replace).apply(text::NormalizedText::original(text, tracked)); })
                  .find("Normalizer Replace: 100000 bytes of text would become more than 1604096 "
                        "(at most 16 times the input + 4096 bytes)"),
              std::string::npos);
  }
  // Four steps of 4× each: 256× the Sequence's input, though each step is within its own.
  const json quadruple = {{"type", "Replace"}, {"pattern", {{"String", "a"}}}, {"content", "aaaa"}};
  const json sequence = {{"type", "Sequence"},
                         {"normalizers", {quadruple, quadruple, quadruple, quadruple}}};
  EXPECT_THROW(normalizer(sequence).apply(text::NormalizedText::original(text, false)), Error);
  EXPECT_EQ(normalizer(sequence).apply(text::NormalizedText::original("ab", false)).text,
            std::string(256, 'a') + "b");  // 257 bytes: within the slack
}

// Row 121: NFKC's largest expansion, U+FDFA (3 bytes, 18 characters: 33 bytes), is within the
// bound: 300 KB of it normalize, with and without offsets.
TEST(Normalizer, NfkcOfItsLargestExpansionIsWithinTheBound) {
  const json nfkc = {{"type", "NFKC"}};
  const auto normalizer =
      text::Normalizer::from_json(text::detail::JsonCursor(nfkc, "normalizer", "t.json"));
  std::string text;
  for (int i = 0; i < 100000; ++i) text += "\xEF\xB7\xBA";  // U+FDFA
  for (const bool tracked : {false, true}) {
    const auto out = normalizer.apply(text::NormalizedText::original(text, tracked));
    EXPECT_EQ(out.text.size(), 3300000u);
    EXPECT_EQ(out.origin.size(), tracked ? 3300000u : 0u);
  }
}

// ---- the model --------------------------------------------------------------------------------

TEST(Bpe, MergesTheLowestRankFirstAndTheLeftmostOnATie) {
  // Merges: "a a" (rank 0), "aa a" (rank 1). "aaaa": a a a a → aa a a (leftmost of three equal
  // pairs) → aa aa (rank 0 again beats "aa a" at rank 1).
  const auto tokenizer = load(byte_level_json({{"a", "a"}, {"aa", "a"}}));
  EXPECT_EQ(pieces_of(tokenizer, "aaaa"), (std::vector<std::string>{"aa", "aa"}));
  EXPECT_EQ(pieces_of(tokenizer, "aaa"), (std::vector<std::string>{"aaa"}));
}

TEST(Bpe, TheRescanAndTheHeapMergeAlike) {
  // A real vocabulary's merges on random words of up to 300 symbols.
  const auto tokenizer =
      text::load_tokenizer(std::filesystem::path(DISSECT_TOKENIZER_PACKAGES) / "gpt2");
  std::mt19937 rng(7);
  const std::string letters = "etaoinshrdlu ";
  for (int trial = 0; trial < 300; ++trial) {
    std::string word;
    const int length = 1 + static_cast<int>(rng() % 300);
    for (int i = 0; i < length; ++i) word += letters[rng() % (letters.size() - 1)];
    std::vector<std::int32_t> rescan, heap;
    tokenizer.model().encode(word, rescan, nullptr, text::MergeStrategy::rescan);
    tokenizer.model().encode(word, heap, nullptr, text::MergeStrategy::heap);
    ASSERT_EQ(rescan, heap) << word;
  }
}

TEST(Bpe, IgnoreMergesTakesAWholeTokenAsItIs) {
  // "ab" is a token but no merge makes it from a + b... with ignore_merges it is found whole.
  json j = byte_level_json({{"b", "c"}});
  j["model"]["vocab"]["ab"] = 300;
  EXPECT_EQ(load(j).encode("ab").size(), 2u);
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(j).encode("ab"), (std::vector<std::int32_t>{300}));
}

TEST(Bpe, AnUnknownSymbolIsByteFallbackThenUnkThenAnError) {
  json j = {
      {"model",
       {{"type", "BPE"},
        {"vocab", {{"<unk>", 0}, {"a", 1}, {"<0xC3>", 2}, {"<0xA9>", 3}}},
        {"merges", json::array()},
        {"byte_fallback", true},
        {"unk_token", "<unk>"},
        {"fuse_unk", true}}},
      {"decoder",
       {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}}}}}}};
  EXPECT_EQ(load(j).encode("a\xC3\xA9"), (std::vector<std::int32_t>{1, 2, 3}));  // é as its bytes
  EXPECT_EQ(load(j).encode("a\xE2\x82\xAC\xE2\x82\xAC"),
            (std::vector<std::int32_t>{1, 0}));  // €€: one fused unk
  EXPECT_EQ(load(j).decode(std::vector<std::int32_t>{1, 2, 3}), "a\xC3\xA9");
  j["model"].erase("unk_token");
  j["model"]["byte_fallback"] = false;
  EXPECT_NE(message_of([&] {
              load(j).encode("a\xE2\x82\xAC");
            }).find("no token for \"\xE2\x82\xAC\" (U+20AC)"),
            std::string::npos);
}

// ---- added tokens -----------------------------------------------------------------------------

TEST(AddedTokens, AreFoundFirstLongestAndWithTheirFlags) {
  json j = byte_level_json({});
  j["added_tokens"] =
      json::array({{{"id", 256}, {"content", "<|end|>"}, {"special", true}},
                   {{"id", 257}, {"content", "<|end|>x"}, {"special", false}},
                   {{"id", 258}, {"content", "[L]"}, {"special", false}, {"lstrip", true}},
                   {{"id", 259}, {"content", "[R]"}, {"special", false}, {"rstrip", true}},
                   {{"id", 260}, {"content", "cat"}, {"special", false}, {"single_word", true}}});
  const auto tokenizer = load(j);
  using Ids = std::vector<std::int32_t>;
  EXPECT_EQ(tokenizer.encode("<|end|>"), (Ids{256}));
  EXPECT_EQ(tokenizer.encode("<|end|>x"), (Ids{257}));     // the longest match
  EXPECT_EQ(tokenizer.encode("a  [L]"), (Ids{'a', 258}));  // [L] takes the spaces on its left
  EXPECT_EQ(tokenizer.encode("[R]  b"), (Ids{259, 'b'}));  // [R] those on its right
  EXPECT_EQ(tokenizer.encode("cat"), (Ids{260}));
  EXPECT_EQ(tokenizer.encode("cats").size(), 4u);               // single_word: not inside a word
  EXPECT_EQ(tokenizer.decode(Ids{'a', 256, 'b'}, true), "ab");  // skip_special_tokens
  EXPECT_EQ(tokenizer.decode(Ids{'a', 257, 'b'}, true), "a<|end|>xb");  // not special: kept
}

// ---- decoding ---------------------------------------------------------------------------------

TEST(DecodeStream, HoldsACharacterBackUntilItsLastByte) {
  const auto tokenizer = load(byte_level_json({}));
  text::DecodeStream stream(tokenizer);
  EXPECT_EQ(stream.push('a'), "a");
  EXPECT_EQ(stream.push(0xF0), "");
  EXPECT_EQ(stream.push(0x9F), "");
  EXPECT_EQ(stream.push(0x98), "");
  EXPECT_EQ(stream.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(stream.push(0xE2), "");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD");  // a character that never completed
}

// Row 118: an id outside the vocabulary is refused and leaves the stream as it was; the stream
// goes on as if the id never came (it used to stay in the window, so every later push threw).
TEST(DecodeStream, AThrowingPushOrFinishChangesNothing) {
  const auto tokenizer = load(byte_level_json({}));
  text::DecodeStream stream(tokenizer);
  EXPECT_EQ(stream.push('a'), "a");
  EXPECT_EQ(stream.push(0xE2), "");
  EXPECT_THROW(stream.push(100000), ConfigError);
  EXPECT_THROW(stream.push(-1), ConfigError);
  EXPECT_EQ(stream.push(0x82), "");
  EXPECT_EQ(stream.push(0xAC), "\xE2\x82\xAC");
  EXPECT_THROW(stream.push(256), ConfigError);
  EXPECT_EQ(stream.push('b'), "b");
  EXPECT_EQ(stream.finish(), "");
}

// Row 118: bytes that never form a character are emitted as U+FFFD once max_pending ids wait,
// and the window stays a few ids long: 20,000 stray continuation bytes in linear time (4,000
// took 18.5 s when the window held them all). Random byte streams, valid characters among
// invalid bytes, give exactly decode() of all their ids.
TEST(DecodeStream, BytesThatNeverFormACharacterKeepTheWindowShort) {
  const auto tokenizer = load(byte_level_json({}));
  text::DecodeStream stream(tokenizer);
  std::string streamed;
  std::vector<std::int32_t> ids(20000, 0x80);
  std::size_t widest = 0;
  const auto start = std::chrono::steady_clock::now();
  for (const auto id : ids) {
    streamed += stream.push(id);
    widest = std::max(widest, stream.window_size());
  }
  streamed += stream.finish();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LE(widest, 3 * text::DecodeStream::max_pending);
  EXPECT_EQ(streamed, tokenizer.decode(ids));
  EXPECT_LT(seconds, 10.0);  // milliseconds; quadratic took minutes

  std::mt19937 random(51);
  // Lead bytes of each length, continuation bytes, ASCII and bytes never valid.
  const std::vector<int> bytes = {'a',  ' ',  0x80, 0x82, 0xAC, 0xBF, 0x9F, 0x98, 0xC3,
                                  0xA9, 0xE2, 0xF0, 0xF4, 0xC0, 0xFF, 0xED, 0xA0, 0xE0};
  for (int round = 0; round < 3000; ++round) {
    std::vector<std::int32_t> seq(random() % 40);
    for (auto& id : seq) id = bytes[random() % bytes.size()];
    text::DecodeStream s(tokenizer);
    std::string out;
    for (const auto id : seq) {
      out += s.push(id);
      ASSERT_LE(s.window_size(), 3 * text::DecodeStream::max_pending);
      ASSERT_FALSE(text::first_invalid_utf8(out).has_value());
    }
    out += s.finish();
    ASSERT_EQ(out, tokenizer.decode(seq)) << "round " << round;
  }
}

TEST(Decode, AnIdOutsideTheVocabularyIsRefused) {
  const auto tokenizer = load(byte_level_json({}));
  EXPECT_NE(message_of([&] {
              tokenizer.decode(std::vector<std::int32_t>{256});
            }).find("Tokenizer::decode: id 256 is not in the vocabulary (ids 0..255)"),
            std::string::npos);
  EXPECT_THROW(tokenizer.decode(std::vector<std::int32_t>{-1}), ConfigError);
}

// ---- refusals, each naming the file and the JSON path -------------------------------------------

TEST(TokenizerJson, MalformedFilesAreFormatErrorsNamingThePath) {
  const auto refused = [](const std::string& text) {
    return message_of([&] { Tokenizer::from_json(text, "t.json"); });
  };
  EXPECT_NE(refused("{\"model\": ").find("t.json is not valid JSON"), std::string::npos);
  json j = byte_level_json({{"a", "zz"}});
  EXPECT_NE(refused(j.dump()).find("t.json: model.merges[0]: \"zz\" is not in the vocabulary"),
            std::string::npos);
  j = byte_level_json({});
  j["model"]["vocab"]["extra"] = 5;  // the id of byte 5
  EXPECT_NE(refused(j.dump()).find("is also the id of \""), std::string::npos);
  j = byte_level_json({});
  j["model"]["vocab"]["far"] = 2000000000;
  EXPECT_NE(refused(j.dump()).find("model.vocab[\"far\"]: id 2000000000 is far beyond"),
            std::string::npos);
  j = byte_level_json({});
  j["model"]["vocab"]["bad"] = "7";
  EXPECT_NE(refused(j.dump()).find("model.vocab[\"bad\"]: must be an integer id, not a string"),
            std::string::npos);
  j = byte_level_json({});
  j["model"]["merges"] = json::array({"a b c"});
  EXPECT_NE(
      refused(j.dump()).find("model.merges[0]: \"a b c\" is not two tokens separated by one space"),
      std::string::npos);
  EXPECT_NE(refused(R"({"model": {"type": "BPE", "vocab": {"a": 0, "a": 1}, "merges": []}})")
                .find("appears twice"),
            std::string::npos);
  j = byte_level_json({});
  j["model"].erase("merges");
  EXPECT_NE(refused(j.dump()).find("t.json: model: has no \"merges\""), std::string::npos);
}

// Row 122: what Hugging Face would load into a silently different tokenizer, or refuses.
TEST(TokenizerJson, IdsTheVocabularyDoesNotBackAndLongReplacementsAreFormatErrors) {
  const auto refused = [](const json& j) {
    return message_of([&] { Tokenizer::from_json(j.dump(), "t.json"); });
  };
  // An added token on the id of another token: "zz" would encode as 97 and 97 decode as "a".
  json j = byte_level_json({});
  j["added_tokens"] = json::array({{{"id", 97}, {"content", "zz"}, {"special", false}}});
  EXPECT_NE(refused(j).find("t.json: added_tokens[0]: id 97 of \"zz\" is the vocabulary's id of "
                            "\"a\""),
            std::string::npos);
  // The same content as the vocabulary's entry is what real files do: valid.
  j["added_tokens"] = json::array({{{"id", 97}, {"content", "a"}, {"special", true}}});
  const auto same = load(j);
  EXPECT_EQ(same.encode("ab"), (std::vector<std::int32_t>{97, 98}));
  EXPECT_EQ(same.decode(std::vector<std::int32_t>{97}), "a");

  // A template's special token outside the vocabulary.
  j = byte_level_json({});
  j["post_processor"] = {
      {"type", "TemplateProcessing"},
      {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
      {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {5000}}, {"tokens", {"<s>"}}}}}}};
  EXPECT_NE(refused(j).find("t.json: post_processor.special_tokens.<s>.ids[0]: id 5000 is not in "
                            "the vocabulary (ids 0..255)"),
            std::string::npos);
  j["post_processor"]["special_tokens"]["<s>"]["ids"] = {65};  // in the vocabulary: valid
  EXPECT_EQ(load(j).encode("b"), (std::vector<std::int32_t>{65, 98}));

  // Metaspace's replacement is one character (Hugging Face's `char`), in either stage.
  for (const std::string replacement : {"\xE2\x96\x81\xE2\x96\x81", "ab", ""}) {
    j = byte_level_json({}, {{"type", "Metaspace"}, {"replacement", replacement}});
    EXPECT_NE(refused(j).find("t.json: pre_tokenizer.replacement: must be one character"),
              std::string::npos)
        << replacement;
    j = byte_level_json({});
    j["decoder"] = {{"type", "Metaspace"}, {"replacement", replacement}};
    EXPECT_NE(refused(j).find("t.json: decoder.replacement: must be one character"),
              std::string::npos)
        << replacement;
  }
  j = byte_level_json({});
  j["decoder"] = {{"type", "Strip"}, {"content", ""}, {"start", 1}, {"stop", 0}};
  EXPECT_NE(refused(j).find("t.json: decoder.content: must be one character"), std::string::npos);
}

TEST(TokenizerJson, WhatDissectDoesNotImplementIsAConfigErrorNamingThePath) {
  json j =
      byte_level_json({}, json{{"type", "Sequence"},
                               {"pretokenizers", {{{"type", "ByteLevel"}}, {{"type", "Digits"}}}}});
  EXPECT_NE(message_of([&] {
              load(j);
            }).find("pre_tokenizer.pretokenizers[0].type: ByteLevel must be the last"),
            std::string::npos);
  j = byte_level_json({},
                      json{{"type", "Sequence"},
                           {"pretokenizers", {{{"type", "Digits"}, {"individual_digits", true}}}}});
  EXPECT_NE(message_of([&] {
              load(j);
            }).find("t.json: pre_tokenizer.pretokenizers[0].type: \"Digits\" is not supported"),
            std::string::npos);
  j = byte_level_json({});
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(message_of([&] { load(j); }).find("model.type: \"WordPiece\" is not supported"),
            std::string::npos);
  j = byte_level_json({});
  j["truncation"] = {{"max_length", 512}};
  EXPECT_THROW(load(j), ConfigError);
  j = byte_level_json({});
  j["normalizer"] = {{"type", "Lowercase"}};
  EXPECT_NE(message_of([&] { load(j); }).find("normalizer.type: \"Lowercase\" is not supported"),
            std::string::npos);
  j = byte_level_json({});
  j["model"]["dropout"] = 0.1;
  EXPECT_THROW(load(j), ConfigError);
}

TEST(Encode, TextThatIsNotUtf8IsRefusedNamingTheOffset) {
  const auto tokenizer = load(byte_level_json({}));
  EXPECT_NE(message_of([&] { tokenizer.encode("ok\xFFno"); }).find("byte 0xff at offset 2"),
            std::string::npos);
  text::EncodeOptions replace;
  replace.invalid_utf8 = text::InvalidUtf8::replace;
  EXPECT_EQ(tokenizer.encode_with("ok\xFF", replace).ids, tokenizer.encode("ok\xEF\xBF\xBD"));
}

// A single line of 100 MB of text (4 MB under the sanitizers) in linear time, and one piece of
// 4 MB of letters (1 MB), which the pre-tokenizer cannot split, through the merge heap in
// O(n log n).
TEST(Encode, AHundredMegabyteLineTakesLinearTime) {
#if defined(DISSECT_TEST_SANITIZED)
  // The time bound means nothing under the sanitizers (27 s for 4 MB); the encoder's paths are
  // the same at 512 KB.
  const std::size_t size = 1u << 19, letter_count = 1u << 17;
#else
  const std::size_t size = 100u << 20, letter_count = 4u << 20;
#endif
  const auto tokenizer =
      text::load_tokenizer(std::filesystem::path(DISSECT_TOKENIZER_PACKAGES) / "gpt2");
  std::string line;
  line.reserve(size + 64);
  while (line.size() < size)
    line += "The quick brown fox, 12345 times;  jumps\tover the lazy dog! ";
  const auto start = std::chrono::steady_clock::now();
  const auto ids = tokenizer.encode(line);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(tokenizer.decode(ids), line);
  EXPECT_LT(seconds, 60.0);  // about 3 s in a release build: a gross bound, for a quadratic slip
  const std::string letters(letter_count, 'a');
  const auto merged = tokenizer.encode(letters);
  EXPECT_EQ(tokenizer.decode(merged), letters);
  EXPECT_EQ(merged.size(), letters.size() / 4);  // "aaaa" is GPT-2's longest run of a's
}

}  // namespace test_tokenizer
}  // namespace dissect
