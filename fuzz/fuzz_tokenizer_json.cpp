// fuzz/fuzz_tokenizer_json.cpp — libFuzzer harness for tokenizer.json (dissect/text): the
// streaming reader, every component's from_json, and then the pipeline the file describes, run
// on fixed texts, on the input's own bytes (invalid UTF-8 replaced) and on ids taken from the
// input, and a DecodeStream fed those ids one by one, invalid ones among them, its invariants
// checked after every step. Whatever the file says, the library may only refuse it with its own
// errors; a file it loads must encode and decode without undefined behaviour, and decode what
// it encodes. Seeds (fuzz/corpus/tokenizer_json) include reliability rows 117–123's files.
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
    // A DecodeStream driven step by step by those ids, negative ones among them (reliability
    // row 118), beside a twin that is given only the ids the stream accepts: a push that throws
    // changes nothing (the two agree after every step), every piece is UTF-8, and finish
    // empties the stream.
    for (const bool skip_special : {false, true}) {
      text::DecodeStream stream(tokenizer, skip_special), twin(tokenizer, skip_special);
      for (std::size_t i = 0; i < ids.size(); ++i) {
        const std::int32_t id = i % 5 == 4 ? -1 - static_cast<std::int32_t>(i) : ids[i];
        std::string piece;
        try {
          piece = stream.push(id);
        } catch (const ConfigError&) {
          fuzz::require(stream.window_size() == twin.window_size(),
                        "a throwing push changes nothing");
          continue;
        }
        fuzz::require(piece == twin.push(id), "a throwing push changed what followed");
        fuzz::require(stream.window_size() == twin.window_size(), "the twins' windows agree");
        fuzz::require(!text::first_invalid_utf8(piece).has_value(), "each piece is UTF-8");
      }
      const std::string rest = stream.finish();
      fuzz::require(rest == twin.finish(), "the twins finish alike");
      fuzz::require(!text::first_invalid_utf8(rest).has_value(), "finish gives UTF-8");
      fuzz::require(stream.window_size() == 0, "finish empties the stream");
    }
  });
  return 0;
}
