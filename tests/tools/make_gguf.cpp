// tests/tools/make_gguf.cpp — writes a small random-weight model as GGUF, under llama.cpp's
// keys and tensor names (io/gguf_model.hpp), for the `dissect` command's ctest cases: no binary
// model is committed for them.
//
//   make_gguf OUT ARCH TYPE [SEED]
//
// ARCH is llama or gpt2; TYPE the ggml type of the 2-D weights (f32, f16, q8_0, q4_0, q4_K, …);
// norms and biases stay f32, as llama.cpp's quantiser leaves them. The model: D 256, L 2, H 4
// (LLaMA: H_kv 2), F 512, V 300, context 128; weights uniform in ±0.05 from SEED (default 1).
// Exit status 0, or 1 with a message.
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"

int main(int argc, char** argv) {
  if (argc < 4 || argc > 5) {
    std::cerr << "usage: make_gguf OUT llama|gpt2 TYPE [SEED]\n";
    return 1;
  }
  try {
    using namespace dissect;
    const std::string arch = argv[2];
    if (arch != "llama" && arch != "gpt2") throw Error("ARCH must be llama or gpt2");
    const GgmlType type = ggml_type_from_name(argv[3]);
    std::uint64_t state = argc == 5 ? std::stoull(argv[4]) : 1;
    TransformerConfig config;
    config.d_model = 256;
    config.n_layers = 2;
    config.n_heads = 4;
    config.d_ff = 512;
    config.vocab = 300;
    config.context = 128;
    config.tied_embeddings = false;
    const ModelFamily family = arch == "llama" ? ModelFamily::llama : ModelFamily::gpt2;
    std::vector<std::pair<std::string, GgufValue>> metadata{
        {"general.architecture", arch},
        {"general.name", "dissect make_gguf"},
        {arch + ".context_length", std::uint32_t{128}},
        {arch + ".embedding_length", std::uint32_t{256}},
        {arch + ".block_count", std::uint32_t{2}},
        {arch + ".feed_forward_length", std::uint32_t{512}},
        {arch + ".attention.head_count", std::uint32_t{4}},
    };
    if (family == ModelFamily::llama) {
      config.n_kv_heads = 2;
      config.positions = Positions::rotary;
      config.norm = Norm::rms_norm;
      config.ffn = Ffn::gated;
      config.bias = false;
      metadata.push_back({"llama.attention.head_count_kv", std::uint32_t{2}});
      metadata.push_back({"llama.rope.freq_base", 10000.0f});
      metadata.push_back({"llama.attention.layer_norm_rms_epsilon", 1e-5f});
    } else {
      metadata.push_back({"gpt2.attention.layer_norm_epsilon", 1e-5f});
    }
    std::vector<std::vector<std::byte>> stored;
    std::vector<GgufTensorEntry> entries;
    const std::vector<GgufExpectedTensor> tensors = gguf_model_tensors(family, config);
    stored.reserve(tensors.size());
    for (const GgufExpectedTensor& tensor : tensors) {
      index_t n = 1;
      for (const index_t d : tensor.dims) n *= d;
      const bool norm = tensor.name.find("norm") != std::string::npos;
      std::vector<float> values(static_cast<std::size_t>(n));
      for (float& v : values) {
        state = state * 6364136223846793005ull + 1442695040888963407ull;   // Knuth's LCG
        const float uniform = static_cast<float>(state >> 40) * 0x1p-24f;  // [0, 1)
        v = norm ? 1.0f + 0.1f * (uniform - 0.5f) : 0.1f * (uniform - 0.5f);
      }
      const GgmlType stored_type = tensor.dims.size() == 2 ? type : GgmlType::f32;
      stored.push_back(quantize_ggml(stored_type, values));
      entries.push_back({tensor.name, stored_type, tensor.dims, stored.back()});
    }
    save_gguf(argv[1], metadata, entries);
    return 0;
  } catch (const std::exception& error) {
    std::cerr << "make_gguf: " << error.what() << "\n";
    return 1;
  }
}
