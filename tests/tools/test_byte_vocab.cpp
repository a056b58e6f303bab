// Tests of tools/common/byte_vocab.hpp: the byte vocabulary train_gpt writes and `dissect
// generate` and lora_finetune read, built from text, written and read back, and every malformed
// metadata value refused.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "support/tensor_testing.hpp"
#include "tools/common/byte_vocab.hpp"

namespace dissect::tools {
namespace test_byte_vocab {

TEST(ByteVocab, IdsAscendWithTheDistinctBytesOfTheText) {
  const auto vocab = ByteVocab::of_text("baa\n\xC3\xA9");
  EXPECT_EQ(vocab.size(), 5);
  EXPECT_EQ(vocab.to_json(), "[10,97,98,169,195]");
  EXPECT_EQ(vocab.id_of['\n'], 0);
  EXPECT_EQ(vocab.id_of['b'], 2);
  EXPECT_EQ(vocab.id_of['z'], -1);
}

TEST(ByteVocab, MetadataRoundTrips) {
  const auto vocab = ByteVocab::of_text("hello, world");
  const auto read = ByteVocab::from_metadata({{vocab_bytes_key, vocab.to_json()}}, "m");
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->bytes, vocab.bytes);
  EXPECT_EQ(read->id_of, vocab.id_of);
  EXPECT_FALSE(ByteVocab::from_metadata({{"other", "[1]"}}, "m").has_value());
}

TEST(ByteVocab, RefusesMalformedMetadata) {
  for (const std::string bad : {"", "{}", "[1,", "[256]", "[-1]", "[1,1]", "[1.5]", "[\"a\"]",
                                "[18446744073709551615]", "[-9223372036854775808]"}) {
    SCOPED_TRACE(bad);
    EXPECT_THROW_WITH(ByteVocab::from_metadata({{vocab_bytes_key, bad}}, "model.safetensors"),
                      FormatError, "model.safetensors: metadata \"dissect.vocab_bytes\"");
  }
}

}  // namespace test_byte_vocab
}  // namespace dissect::tools
