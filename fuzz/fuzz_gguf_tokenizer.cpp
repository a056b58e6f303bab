// fuzz/fuzz_gguf_tokenizer.cpp — libFuzzer harness for the tokenizer of a GGUF file
// (dissect/text/gguf_tokenizer.hpp): the file is read in memory, its tokenizer.ggml.* metadata
// built into a tokenizer, and the tokenizer run on fixed texts and on ids taken from the input.
// Whatever the metadata says, the library may only refuse it with its own errors; a tokenizer
// it builds must encode and decode without undefined behaviour, and a model file dissect accepts
// (read_gguf_config) speaks no id past the tokenizer's vocabulary.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/io/gguf_model.hpp"
#include "dissect/text/gguf_tokenizer.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  fuzz::expect_only_dissect_errors([&] {
    const GgufFile file = GgufFile::from_bytes(fuzz::bytes_of(data, size), "fuzz.gguf");
    if (!text::gguf_has_tokenizer(file)) return;
    const text::Tokenizer tokenizer = text::tokenizer_from_gguf(file);
    for (const std::string_view sample :
         {std::string_view("Hello world! It's 2026, don't  you\tthink?\r\n"), std::string_view(""),
          std::string_view("ab ba aba<s></s><|end|>\xC3\xA9\xE2\x96\x81\xF0\x9F\x98\x80")}) {
      for (const bool special : {false, true}) {
        try {
          const auto ids = tokenizer.encode(sample, special);
          for (const std::int32_t id : ids) {
            fuzz::require(id >= 0 && static_cast<std::size_t>(id) < tokenizer.vocab_size(),
                          "ids in the vocabulary");
          }
          (void)tokenizer.decode(ids);
        } catch (const ConfigError&) {
          // A symbol nothing in the vocabulary encodes: refused, as documented.
        }
      }
    }
    // A model file whose config is accepted has no id this tokenizer cannot decode (row 129):
    // generate prints every id it samples as text.
    fuzz::expect_only_dissect_errors([&] {
      const HfConfig model = read_gguf_config(file);
      fuzz::require(static_cast<index_t>(tokenizer.vocab_size()) >= model.config.vocab,
                    "every model id in the tokenizer's vocabulary");
    });
    const std::vector<std::int32_t> ids = fuzz::ids_of(data, size, tokenizer.vocab_size());
    try {
      (void)tokenizer.decode(ids, true);
    } catch (const ConfigError&) {
    }
  });
  return 0;
}
