// fuzz/fuzz_gguf.cpp — libFuzzer harness for the GGUF reader and ggml's block decoders.
//
// The input is a whole file, checked in memory (GgufFile::from_bytes runs the very parse() that
// opening a path runs). A file that opens must keep its records' promises: every tensor's bytes
// lie inside the input at an aligned offset after the records, have the size its type and dims
// make, and every tensor of a type dissect decodes dequantises (any bit pattern is a value) or
// throws dissect::Error; every metadata value prints.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dissect/io/gguf.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  fuzz::expect_only_dissect_errors([&] {
    const GgufFile file = GgufFile::from_bytes(fuzz::bytes_of(data, size), "fuzz.gguf");
    fuzz::require(file.data_offset() % file.alignment() == 0, "aligned data section");
    for (const auto& [key, value] : file.metadata()) {
      fuzz::require(file.find(key) == &value, "metadata index");
      (void)value.describe();
    }
    for (const GgufTensorInfo& info : file.tensors()) {
      fuzz::require(&file.info(info.name) == &info, "tensor index");
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
  });
  return 0;
}
