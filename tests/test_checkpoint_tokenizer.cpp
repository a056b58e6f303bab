// Tests of dissect/text/checkpoint_tokenizer.hpp: tokenizer_for finds the tokenizer a model file
// comes with from what detect_checkpoint found, before any weight is read — a GGUF file's own
// tokenizer.ggml.* (whatever the file's name), the tokenizer.json a checkpoint's metadata
// carries, or the tokenizer files beside it — and says why for a GGUF tokenizer dissect does not
// implement instead of throwing.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dissect/io/gguf_model_writer.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/text/checkpoint_tokenizer.hpp"
#include "support/io_testing.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_checkpoint_tokenizer {

namespace fs = std::filesystem;
using testing::contains;
using testing::TemporaryDirectory;

/// The reference GGUF file whose tokenizer (a SentencePiece one of 260 tokens, as llama.cpp reads
/// it) the tests copy into files of their own.
fs::path reference_gguf() {
  return fs::path(DISSECT_GGUF_FIXTURE_DIR) / "llama_q8_0.gguf";
}

/// The tiny LLaMA's tokenizer.json and tokenizer_config.json of the tool tests.
fs::path chat_llama_dir() {
  return fs::path(DISSECT_FIXTURE_DIR).parent_path().parent_path() / "tools" / "chat-llama";
}

/// A LLaMA of `vocab` tokens written as GGUF at `path` with the metadata entries `tokenizer`.
void write_gguf(const fs::path& path, index_t vocab,
                std::vector<std::pair<std::string, GgufValue>> tokenizer) {
  GgufModelOptions options;
  options.tokenizer = std::move(tokenizer);
  save_gguf_model(path, LlamaModel<float>(testing::small_llama(vocab), {.seed = 3}), options);
}

TEST(TokenizerFor, AGgufFilesOwnTokenizerWhateverTheFilesName) {
  const GgufFile reference(reference_gguf());
  std::vector<std::pair<std::string, GgufValue>> entries;
  for (const auto& [key, value] : reference.metadata()) {
    if (key.starts_with("tokenizer.ggml.")) entries.emplace_back(key, value);
  }
  ASSERT_FALSE(entries.empty());
  const TemporaryDirectory dir;
  write_gguf(dir / "model.bin", 260, entries);
  const auto found = detect_checkpoint(dir / "model.bin");
  ASSERT_EQ(found.kind, CheckpointKind::gguf);
  const text::CheckpointTokenizer tokenizer = text::tokenizer_for(found);
  ASSERT_TRUE(tokenizer.tokenizer);
  EXPECT_TRUE(tokenizer.unsupported.empty());
  EXPECT_TRUE(contains(tokenizer.tokenizer->source(), (dir / "model.bin").string()));
  const text::Tokenizer expected = text::tokenizer_from_gguf(reference);
  for (const char* sample : {"Once upon a time", "Hello, world!"}) {
    EXPECT_EQ(tokenizer.tokenizer->encode(sample), expected.encode(sample)) << sample;
  }
}

TEST(TokenizerFor, AGgufFileWithoutATokenizerHasNone) {
  const TemporaryDirectory dir;
  write_gguf(dir / "ids.gguf", 23, {});  // tokenizer.ggml.model "none": a model on token ids
  const auto tokenizer = text::tokenizer_for(detect_checkpoint(dir / "ids.gguf"));
  EXPECT_FALSE(tokenizer.tokenizer);
  EXPECT_TRUE(tokenizer.unsupported.empty());
}

TEST(TokenizerFor, AGgufTokenizerDissectDoesNotImplementIsSaidNotThrown) {
  const TemporaryDirectory dir;
  write_gguf(dir / "bert.gguf", 23, {{"tokenizer.ggml.model", std::string("bert")}});
  const auto found = detect_checkpoint(dir / "bert.gguf");
  ASSERT_TRUE(found.model);  // the model runs on token ids all the same
  const auto tokenizer = text::tokenizer_for(found);
  EXPECT_FALSE(tokenizer.tokenizer);
  EXPECT_TRUE(contains(tokenizer.unsupported, (dir / "bert.gguf").string() +
                                                  ": tokenizer.ggml.model \"bert\" is not "
                                                  "supported"))
      << tokenizer.unsupported;
  // Malformed metadata of a tokenizer dissect does implement is an error naming the file.
  write_gguf(dir / "broken.gguf", 23, {{"tokenizer.ggml.model", std::string("gpt2")}});
  EXPECT_THROW_WITH((void)text::tokenizer_for(detect_checkpoint(dir / "broken.gguf")), FormatError,
                    (dir / "broken.gguf").string());
}

TEST(TokenizerFor, TheTokenizerFilesBesideACheckpoint) {
  const TemporaryDirectory dir;
  save_model(dir / "model.safetensors", LlamaModel<float>(testing::small_llama(97), {.seed = 1}));
  EXPECT_FALSE(text::tokenizer_for(detect_checkpoint(dir.path())).tokenizer);  // none yet
  fs::copy_file(chat_llama_dir() / "tokenizer.json", dir / "tokenizer.json");
  fs::copy_file(chat_llama_dir() / "tokenizer_config.json", dir / "tokenizer_config.json");
  const text::Tokenizer expected = text::load_tokenizer(chat_llama_dir());
  // Asked for by the directory or by the file: the same files.
  for (const fs::path& path : {dir.path(), dir / "model.safetensors"}) {
    SCOPED_TRACE(path.string());
    const auto tokenizer = text::tokenizer_for(detect_checkpoint(path));
    ASSERT_TRUE(tokenizer.tokenizer);
    EXPECT_EQ(tokenizer.tokenizer->source(), (dir / "tokenizer.json").string());
    EXPECT_EQ(tokenizer.tokenizer->bos_id(), expected.bos_id());
    EXPECT_EQ(tokenizer.tokenizer->encode("hello there"), expected.encode("hello there"));
  }
}

TEST(TokenizerFor, ATokenizerJsonTheMetadataCarriesComesFirst) {
  const TemporaryDirectory dir;
  fs::copy_file(chat_llama_dir() / "tokenizer.json", dir / "tokenizer.json");
  const std::string json = text::read_text_file(chat_llama_dir() / "tokenizer.json", "test");
  save_model(dir / "carried.safetensors", LlamaModel<float>(testing::small_llama(97), {.seed = 1}),
             {{text::tokenizer_json_key, json}});
  const auto tokenizer = text::tokenizer_for(detect_checkpoint(dir / "carried.safetensors"));
  ASSERT_TRUE(tokenizer.tokenizer);
  EXPECT_EQ(tokenizer.tokenizer->source(),
            (dir / "carried.safetensors").string() + ": metadata \"dissect.tokenizer_json\"");
  EXPECT_EQ(tokenizer.tokenizer->vocab_size(), text::load_tokenizer(dir.path()).vocab_size());
}

}  // namespace test_checkpoint_tokenizer
}  // namespace dissect
