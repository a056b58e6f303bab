// fuzz/fuzz_hf_config.cpp — libFuzzer harness for config.json: the strict JSON reader
// (detail::parse_json_strictly) and the reading of a gpt2 or llama config from it
// (parse_hf_config, the whole of read_hf_config after the file's bytes are read).
//
// The strict reader is also held against nlohmann's own parser: it must accept exactly the
// texts nlohmann accepts, build the same value, and differ only in refusing a repeated key.
#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "dissect/io/hf_config.hpp"
#include "fuzz_support.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace dissect;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const nlohmann::json reference = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  nlohmann::json strict;
  bool parsed = false;
  try {
    strict = detail::parse_json_strictly(text, "config.json");
    parsed = true;
  } catch (const FormatError& error) {
    const std::string_view message = error.what();
    // Refused: either nlohmann refuses it too, or it repeats a key (which nlohmann keeps quiet).
    fuzz::require(message.starts_with("config.json"), "the message names the file");
    fuzz::require(reference.is_discarded() || message.find("appears twice") != message.npos,
                  "the strict reader refuses only invalid JSON and repeated keys");
  }
  if (!parsed) return 0;
  fuzz::require(!reference.is_discarded(), "the strict reader accepts only valid JSON");
  fuzz::require(strict == reference, "the strict reader builds nlohmann's value");
  fuzz::expect_only_dissect_errors([&] {
    const HfConfig config = parse_hf_config(strict, "config.json");
    config.config.validate();  // what it returns is a model dissect can describe
  });
  return 0;
}
