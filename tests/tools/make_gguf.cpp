// tests/tools/make_gguf.cpp — writes tests/support/gguf_models.hpp's small random-weight model
// as GGUF, for the `dissect` command's ctest cases (no binary model is committed for them) and
// for the llama.cpp reference files (tests/reference/gguf/make_fixtures.sh).
//
//   make_gguf OUT ARCH TYPE [SEED]
//   make_gguf OUT vocab NAME PACKAGES
//
// ARCH is llama or gpt2 (the small test models), or tinyllama (TinyLlama-1.1B's shape, 4.4 GB
// in f32, for bench/compare_llama_cpp.mjs; tinyllama:L the same with L layers); TYPE the ggml type
// of the 2-D weights (f32, f16, q8_0, q4_0, q4_K, …); SEED defaults to 1. The second form writes
// tests/support/vocab_gguf.hpp's vocabulary-only file of tokenizer NAME (llama2, gpt2, llama3,
// qwen3), read from PACKAGES
// (.deps/npm). Exit status 0, or 1 with a message.
#include <iostream>
#include <string>

#include "support/gguf_models.hpp"
#include "support/vocab_gguf.hpp"

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::cerr << "usage: make_gguf OUT llama|gpt2|tinyllama[:L] TYPE [SEED]\n";
    return 1;
  }
  try {
    using namespace dissect;
    const std::string arch = argv[2];
    if (arch == "vocab") {
      if (argc != 5) throw Error("usage: make_gguf OUT vocab NAME PACKAGES");
      for (const auto& spec : testing::vocab_ggufs()) {
        if (spec.name == argv[3]) {
          testing::write_vocab_gguf(spec, argv[4], argv[1]);
          return 0;
        }
      }
      throw Error(std::string("no vocabulary ") + argv[3]);
    }
    if (arch.starts_with("tinyllama")) {
      // tinyllama:L keeps the shape with L layers: a model that fits a machine's memory beside
      // the old loaders' peak (12.6 GiB for the 22 layers in f32).
      TransformerConfig config = testing::tinyllama_gguf_config();
      if (arch.size() > 9) {
        if (arch[9] != ':') throw Error("ARCH must be llama, gpt2, tinyllama or tinyllama:L");
        config.n_layers = std::stoll(arch.substr(10));
      }
      testing::write_random_gguf_model(argv[1], ModelFamily::llama, ggml_type_from_name(argv[3]),
                                       argc == 5 ? std::stoull(argv[4]) : 1, config);
      return 0;
    }
    if (arch != "llama" && arch != "gpt2") throw Error("ARCH must be llama, gpt2 or tinyllama");
    testing::write_random_gguf_model(argv[1], family_from_name(arch, "make_gguf"),
                                     ggml_type_from_name(argv[3]),
                                     argc == 5 ? std::stoull(argv[4]) : 1);
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "make_gguf: " << error.what() << "\n";
    return 1;
  }
}
