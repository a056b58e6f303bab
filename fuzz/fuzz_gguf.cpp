// fuzz/fuzz_gguf.cpp — libFuzzer harness for the GGUF reader and ggml's block decoders.
//
// The input is a whole file, checked in memory (GgufFile::from_bytes runs the very parse() that
// opening a path runs). A file that opens must keep its records' promises: every tensor's bytes
// lie inside the input at an aligned offset after the records, have the size its type and dims
// make, and every tensor of a type dissect decodes dequantises (any bit pattern is a value) or
// throws dissect::Error; every metadata value prints. Then the model it describes: read_gguf_config
// (io/gguf_model.hpp) accepts it or refuses with dissect's own error, and a config it accepts
// fits the file (the vocabulary is the embedding's rows, and the tokenizer's when there is one).
// Every key, string value and tensor name printed through quote_file_text holds no byte a
// terminal acts on (reliability rows 124–130).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"
#include "fuzz_support.hpp"

namespace {

/// What quote_file_text makes of `text` must print nothing a terminal acts on: it is in quotes,
/// well-formed UTF-8 throughout, and holds no C0 control, DEL or C1 control (U+0080–U+009F).
void require_printable(std::string_view text) {
  const std::string quoted = dissect::quote_file_text(text);
  dissect::fuzz::require(quoted.size() >= 2 && quoted.front() == '"' && quoted.back() == '"',
                         "quoted");
  for (std::size_t i = 0; i < quoted.size();) {
    const std::size_t length = dissect::detail::utf8_sequence_length(quoted, i);
    dissect::fuzz::require(length != 0, "UTF-8 only");
    const auto byte = static_cast<unsigned char>(quoted[i]);
    dissect::fuzz::require(length > 1 || (byte >= 0x20 && byte != 0x7f), "no control byte");
    dissect::fuzz::require(
        length != 2 || byte != 0xc2 || static_cast<unsigned char>(quoted[i + 1]) > 0x9f,
        "no C1 control");
    i += length;
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  fuzz::expect_only_dissect_errors([&] {
    const GgufFile file = GgufFile::from_bytes(fuzz::bytes_of(data, size), "fuzz.gguf");
    fuzz::require(file.data_offset() % file.alignment() == 0, "aligned data section");
    for (const auto& [key, value] : file.metadata()) {
      fuzz::require(file.find(key) == &value, "metadata index");
      (void)value.describe();
      require_printable(key);
      if (const std::string* text = value.as_string()) require_printable(*text);
    }
    for (const GgufTensorInfo& info : file.tensors()) {
      fuzz::require(&file.info(info.name) == &info, "tensor index");
      require_printable(info.name);
      fuzz::require(info.offset % file.alignment() == 0, "aligned tensor");
      const auto span = file.bytes(info.name);
      fuzz::require(span.size() == static_cast<std::size_t>(info.bytes), "byte span");
      fuzz::require(info.bytes == 0 ||
                        file.data_offset() + info.offset + info.bytes <= static_cast<index_t>(size),
                    "tensor inside the file");
      if (ggml_type_info(info.type).decoded_by_dissect && info.elements() <= (1 << 16)) {
        fuzz::expect_only_dissect_errors([&] { (void)file.dequantize(info.name); });
      }
    }
    fuzz::expect_only_dissect_errors([&] {
      const HfConfig model = read_gguf_config(file);
      const GgufTensorInfo& embedding = file.info("token_embd.weight");
      fuzz::require(embedding.dims.size() == 2 && embedding.dims[1] == model.config.vocab,
                    "vocabulary from the embedding");
      if (const GgufValue* tokens = file.find("tokenizer.ggml.tokens")) {
        fuzz::require(tokens->as_array() &&
                          static_cast<index_t>(tokens->as_array()->size()) == model.config.vocab,
                      "as many tokens as embedding rows");
      }
    });
  });
  return 0;
}
