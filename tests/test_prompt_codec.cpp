// Tests of dissect/text/prompt_codec.hpp: a prompt's text (or ids) to the ids a model runs on,
// checked against its vocabulary and context, and generated ids back into text — through a
// tokenizer, a byte vocabulary (train_gpt's models) or nothing (ids only). Every refusal names
// the prompt as the caller calls it; BOS comes once, whether the post-processor or a chat
// template wrote it; a decoder never emits half a character and passes over ids it has no text
// for, as generate and serve show them.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dissect/text/byte_level.hpp"
#include "dissect/text/prompt_codec.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_prompt_codec {

using nlohmann::json;
using text::PromptCodec;
using text::PromptLimits;
using text::Tokenizer;
using Ids = std::vector<index_t>;

// A byte-level tokenizer (id b is byte b) whose post-processor writes <s> (id 256, special) before
// the text, as LLaMA's does; `extra` added tokens follow.
Tokenizer bos_tokenizer(const json& extra = json::array()) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[text::to_byte_level(std::string(1, static_cast<char>(b)))] = b;
  json added = json::array({{{"id", 256}, {"content", "<s>"}, {"special", true}}});
  for (const json& token : extra) added.push_back(token);
  const json j = {
      {"version", "1.0"},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {256}}, {"tokens", {"<s>"}}}}}}}},
      {"decoder", {{"type", "ByteLevel"}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}}};
  return Tokenizer::from_json(j.dump(), "bos.json");
}

/// The whole text of `ids` through a decoder, after `context` (pushed first, its text dropped).
std::string streamed(const PromptCodec& codec, const Ids& context, const Ids& ids) {
  auto decoder = codec.decoder();
  for (const index_t id : context) (void)decoder.push(id);
  std::string out;
  for (const index_t id : ids) out += decoder.push(id).value_or("<none>");
  return out + decoder.finish();
}

// ---- text to ids ------------------------------------------------------------------------------

TEST(PromptCodec, PlainTextGetsBosAndRenderedTextKeepsItsOwn) {
  const Tokenizer tokenizer = bos_tokenizer();
  const PromptCodec codec = PromptCodec::of_tokenizer(tokenizer);
  EXPECT_TRUE(codec.has_text());
  EXPECT_EQ(codec.encode("ab", "prompt"), (Ids{256, 'a', 'b'}));
  // A chat template wrote <s> itself: encoded as it stands, BOS comes once; with the
  // post-processor's on top it would come twice.
  EXPECT_EQ(codec.encode("<s>ab", "prompt", false), (Ids{256, 'a', 'b'}));
  EXPECT_EQ(codec.encode("<s>ab", "prompt", true), (Ids{256, 256, 'a', 'b'}));
  EXPECT_EQ(codec.prompt("ab", {.vocab = 257, .context = 3}, "prompt"), (Ids{256, 'a', 'b'}));
}

TEST(PromptCodec, AByteVocabularyEncodesEachByteAndNamesTheFirstItLacks) {
  const std::vector<unsigned char> bytes = {'\n', ' ', 'a', 'b'};
  const PromptCodec codec = PromptCodec::of_bytes(bytes);
  EXPECT_TRUE(codec.has_text());
  EXPECT_EQ(codec.encode("ab a\n", "--prompt"), (Ids{2, 3, 1, 2, 0}));
  EXPECT_EQ(codec.encode("ab", "--prompt", true), (Ids{2, 3}));  // no special tokens to add
  EXPECT_THROW_WITH(codec.encode("ab\xC3\xA9", "--prompt"), ConfigError,
                    "--prompt: byte 2 (195) is not in the model's vocabulary");
  const std::vector<unsigned char> twice = {'a', 'b', 'a'};
  EXPECT_THROW_WITH(PromptCodec::of_bytes(twice), ConfigError,
                    "PromptCodec::of_bytes: byte 97 stands for ids 0 and 2");
}

TEST(PromptCodec, IdsOnlyRefusesTextWithTheCallersReason) {
  const PromptCodec codec =
      PromptCodec::ids_only("no tokenizer here; give token ids with --tokens");
  EXPECT_FALSE(codec.has_text());
  EXPECT_THROW_WITH(codec.encode("hello", "--prompt"), ConfigError,
                    "--prompt: no tokenizer here; give token ids with --tokens");
  EXPECT_THROW_WITH(codec.prompt("hello", {.vocab = 10, .context = 10}, "prompt"), ConfigError,
                    "prompt: no tokenizer here");
}

TEST(PromptCodec, ATokenizersRefusalIsAConfigErrorNamingThePrompt) {
  const json j = {{"model",
                   {{"type", "BPE"},
                    {"vocab", {{"a", 0}, {"b", 1}}},
                    {"merges", json::array()},
                    {"byte_fallback", false}}}};
  const Tokenizer tokenizer = Tokenizer::from_json(j.dump(), "ab.json");
  const PromptCodec codec = PromptCodec::of_tokenizer(tokenizer);
  EXPECT_EQ(codec.encode("ab", "prompt"), (Ids{0, 1}));
  EXPECT_THROW_WITH(codec.encode("a\xE2\x82\xAC", "prompt"), ConfigError, "prompt: ");
  EXPECT_THROW_WITH(codec.encode("a\xE2\x82\xAC", "prompt"), ConfigError,
                    "no token for \"\xE2\x82\xAC\" (U+20AC)");
}

// ---- the checks -------------------------------------------------------------------------------

TEST(CheckPrompt, EveryIdInTheVocabularyOneToContextOfThem) {
  const PromptLimits limits{.vocab = 97, .context = 4};
  EXPECT_NO_THROW(text::check_prompt(Ids{0, 96}, limits, "prompt"));
  EXPECT_NO_THROW(text::check_prompt(Ids{1, 2, 3, 4}, limits, "prompt"));  // the whole context
  EXPECT_THROW_WITH(text::check_prompt(Ids{1, 97}, limits, "prompt"), ConfigError,
                    "prompt: token 1 has id 97, outside the model's vocabulary [0, 97)");
  EXPECT_THROW_WITH(text::check_prompt(Ids{-1}, limits, "--tokens"), ConfigError,
                    "--tokens: token 0 has id -1, outside the model's vocabulary [0, 97)");
  EXPECT_THROW_WITH(text::check_prompt(Ids{}, limits, "prompt"), ConfigError,
                    "prompt: the prompt is empty (0 tokens)");
  EXPECT_THROW_WITH(text::check_prompt(Ids{1, 2, 3, 4, 5}, limits, "--tokens"), ConfigError,
                    "--tokens: 5 tokens; the model's context holds at most 4");
  // Text whose ids fall outside a smaller model: the tokenizer's 257 ids, a model of 100.
  const Tokenizer tokenizer = bos_tokenizer();
  EXPECT_THROW_WITH(PromptCodec::of_tokenizer(tokenizer).prompt("a", {100, 8}, "prompt"),
                    ConfigError, "prompt: token 0 has id 256, outside the model's vocabulary");
}

// ---- ids to text ------------------------------------------------------------------------------

TEST(PromptDecoder, HoldsACharacterBackAndGivesTheWholeDecode) {
  const Tokenizer tokenizer = bos_tokenizer();
  const PromptCodec codec = PromptCodec::of_tokenizer(tokenizer);
  auto decoder = codec.decoder();
  EXPECT_EQ(decoder.push(256), "<s>");
  EXPECT_EQ(decoder.push('a'), "a");
  EXPECT_EQ(decoder.push(0xE2), "");
  EXPECT_EQ(decoder.push(0x82), "");
  EXPECT_EQ(decoder.push(0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(decoder.push(0xC3), "");
  EXPECT_EQ(decoder.finish(), "\xEF\xBF\xBD");  // a character that never completed
  const Ids ids = {'h', 0xC3, 0xA9, ' ', 'x'};
  EXPECT_EQ(streamed(codec, {256, 'a'}, ids), "h\xC3\xA9 x");
  const std::vector<std::int32_t> narrow(ids.begin(), ids.end());
  EXPECT_EQ(streamed(codec, {}, ids), tokenizer.decode(narrow));
}

TEST(PromptDecoder, AnIdWithoutTextIsPassedOverAndChangesNothing) {
  // The model's vocabulary may be padded past the tokenizer's (ids 257 …), and a tokenizer's ids
  // may have gaps (here 257 … 299, below the added token 300): neither has text, and neither
  // cuts the character being decoded.
  const Tokenizer tokenizer =
      bos_tokenizer(json::array({{{"id", 300}, {"content", "<|end|>"}, {"special", true}}}));
  const PromptCodec codec = PromptCodec::of_tokenizer(tokenizer);
  auto decoder = codec.decoder();
  EXPECT_EQ(decoder.push(0xE2), "");
  EXPECT_EQ(decoder.push(280), std::nullopt);  // a gap
  EXPECT_EQ(decoder.push(301), std::nullopt);  // past the tokenizer: padding
  EXPECT_EQ(decoder.push(-1), std::nullopt);
  EXPECT_EQ(decoder.push(0x82), "");
  EXPECT_EQ(decoder.push(0xAC), "\xE2\x82\xAC");
  EXPECT_EQ(decoder.push(300), "<|end|>");
  EXPECT_EQ(decoder.finish(), "");

  const std::vector<unsigned char> bytes = {'a', 'b'};
  EXPECT_EQ(streamed(PromptCodec::of_bytes(bytes), {0}, {1, 2, -1, 0}), "b<none><none>a");
  EXPECT_EQ(streamed(PromptCodec::ids_only("ids only"), {0}, {0, 1}), "<none><none>");
}

}  // namespace test_prompt_codec
}  // namespace dissect
