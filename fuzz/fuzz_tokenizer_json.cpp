// fuzz/fuzz_tokenizer_json.cpp — libFuzzer harness for tokenizer.json (dissect/text): the
// streaming reader, every component's from_json, and then the pipeline the file describes, run
// on fixed texts, on the input's own bytes (invalid UTF-8 replaced) and on ids taken from the
// input. Whatever the file says, the library may only refuse it with its own errors; a file it
// loads must encode and decode without undefined behaviour, and decode what it encodes.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/text/decode_stream.hpp"
#include "dissect/text/tokenizer.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_dissect_errors([&] {
    const text::Tokenizer tokenizer = text::Tokenizer::from_json(bytes, "tokenizer.json");
    text::EncodeOptions options;
    options.invalid_utf8 = text::InvalidUtf8::replace;
    options.offsets = true;
    for (const std::string_view sample :
         {std::string_view("Hello world! It's 2026, don't  you\tthink?\r\n"), std::string_view(""),
          std::string_view("\xC3\xA9\xE2\x96\x81\xF0\x9F\x98\x80 <s></s><|endoftext|>"),
          bytes.substr(0, 256)}) {
      try {
        const text::Encoding encoding = tokenizer.encode_with(sample, options);
        fuzz::require(encoding.offsets.size() == encoding.ids.size(), "one span per id");
        for (const text::Span& span : encoding.offsets) {
          fuzz::require(span.begin <= span.end, "a span is a range");
        }
        const std::string decoded = tokenizer.decode(encoding.ids);
        fuzz::require(!text::first_invalid_utf8(decoded).has_value(), "decode gives UTF-8");
        text::DecodeStream stream(tokenizer);
        for (const std::int32_t id : encoding.ids) (void)stream.push(id);
        (void)stream.finish();
      } catch (const ConfigError&) {
        // A symbol nothing in the vocabulary encodes: refused, as documented.
      }
    }
    // Ids from the input's bytes: in the vocabulary or refused.
    const std::vector<std::int32_t> ids = fuzz::ids_of(data, size, tokenizer.vocab_size());
    try {
      (void)tokenizer.decode(ids, true);
    } catch (const ConfigError&) {
    }
  });
  return 0;
}
