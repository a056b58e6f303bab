// tests/support/gguf_models.hpp — small random-weight models written as GGUF under llama.cpp's
// keys and tensor names (io/gguf_model.hpp), with a vocabulary llama.cpp accepts: the same
// bytes on every run, so tests can make them at test time and the reference generator
// (tests/reference/gguf/make_fixtures.sh, through tests/tools/make_gguf.cpp) can hand them to
// llama.cpp.
//
// The model: D 256, L 2, H 4 (LLaMA: H_kv 2, d_k 64), F 256, V 260, context 128; 2-D weights
// uniform in ±0.05 stored as `type`, norms near 1 and biases stored as f32 (as llama.cpp's
// quantiser leaves them), from Knuth's LCG seeded with `seed`. Every 2-D weight's rows are
// whole blocks of every type (256 values), so any block type can store it.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"

namespace dissect::testing {

/// The config of the model write_random_gguf_model writes.
inline TransformerConfig random_gguf_config(ModelFamily family) {
  TransformerConfig config;
  config.d_model = 256;
  config.n_layers = 2;
  config.n_heads = 4;
  config.d_ff = 256;
  config.vocab = 260;
  config.context = 128;
  config.tied_embeddings = false;
  if (family == ModelFamily::llama) {
    config.n_kv_heads = 2;
    config.positions = Positions::rotary;
    config.norm = Norm::rms_norm;
    config.ffn = Ffn::gated;
    config.bias = false;
  }
  return config;
}

/// TinyLlama-1.1B's shape (D 2048, L 22, H 32, H_kv 4, F 5632, V 32000, context 2048): the
/// LLaMA the llama.cpp comparison (bench/compare_llama_cpp.mjs) runs, with random weights.
inline TransformerConfig tinyllama_gguf_config() {
  TransformerConfig config = random_gguf_config(ModelFamily::llama);
  config.d_model = 2048;
  config.n_layers = 22;
  config.n_heads = 32;
  config.n_kv_heads = 4;
  config.d_ff = 5632;
  config.vocab = 32000;
  config.context = 2048;
  return config;
}

/// Writes the model of `config` (random_gguf_config's unless given) as GGUF at `path`.
inline void write_random_gguf_model(const std::filesystem::path& path, ModelFamily family,
                                    GgmlType type, std::uint64_t seed = 1,
                                    std::optional<TransformerConfig> shape = std::nullopt) {
  TransformerConfig config = shape ? *shape : random_gguf_config(family);
  const std::string arch(family_name(family));
  std::uint64_t state = seed;
  const auto u32 = [](index_t value) { return static_cast<std::uint32_t>(value); };
  std::vector<std::pair<std::string, GgufValue>> metadata{
      {"general.architecture", arch},
      {"general.name", "dissect make_gguf"},
      {arch + ".context_length", u32(config.context)},
      {arch + ".embedding_length", u32(config.d_model)},
      {arch + ".block_count", u32(config.n_layers)},
      {arch + ".feed_forward_length", u32(config.d_ff)},
      {arch + ".attention.head_count", u32(config.n_heads)},
  };
  if (family == ModelFamily::llama) {
    metadata.push_back({"llama.attention.head_count_kv", u32(config.kv_heads())});
    metadata.push_back({"llama.rope.freq_base", 10000.0f});
    metadata.push_back({"llama.attention.layer_norm_rms_epsilon", 1e-5f});
  } else {
    metadata.push_back({"gpt2.attention.layer_norm_epsilon", 1e-5f});
  }
  // A vocabulary llama.cpp accepts, V entries long: for llama a SentencePiece one (<unk>,
  // <s>, </s>, the 256 byte tokens <0x00>…<0xFF>, then letters), for gpt2 a byte-level BPE
  // one (the 256 byte symbols, then letters; no merges). Only ids are evaluated here.
  {
    using Array = GgufValue::Array;
    Array tokens, scores, types;
    const auto piece = [&](std::string text, float score, std::int32_t type) {
      tokens.emplace_back(std::move(text));
      scores.emplace_back(score);
      types.emplace_back(type);
    };
    if (family == ModelFamily::llama) {
      piece("<unk>", 0, 2);
      piece("<s>", 0, 3);
      piece("</s>", 0, 3);
      for (int b = 0; b < 256; ++b) {
        static constexpr char hex[] = "0123456789ABCDEF";
        piece(std::string("<0x") + hex[b >> 4] + hex[b & 15] + ">", 0, 6);
      }
    } else {
      int shifted = 0;
      for (int b = 0; b < 256; ++b) {
        // GPT-2's byte-to-symbol map: printable Latin-1 bytes as themselves, the rest moved
        // to U+0100 onwards, each written as UTF-8.
        const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;

        const int code = printable ? b : 256 + shifted++;
        std::string utf8;
        if (code < 0x80) {
          utf8 += static_cast<char>(code);
        } else {
          utf8 += static_cast<char>(0xc0 | (code >> 6));
          utf8 += static_cast<char>(0x80 | (code & 0x3f));
        }
        piece(utf8, 0, 1);
      }
    }
    // Two letters, and past 676 pieces a number after them, so every token is distinct.
    for (int i = static_cast<int>(tokens.size()); i < static_cast<int>(config.vocab); ++i) {
      piece(std::string("\xe2\x96\x81") + static_cast<char>('a' + i % 26) +
                static_cast<char>('a' + (i / 26) % 26) +
                (i / 676 > 0 ? std::to_string(i / 676) : std::string()),
            -static_cast<float>(i), 1);
    }
    metadata.push_back({"tokenizer.ggml.model", family == ModelFamily::llama ? "llama" : "gpt2"});
    metadata.push_back({"tokenizer.ggml.tokens", GgufValue::array(GgufType::string, tokens)});
    if (family == ModelFamily::llama) {
      metadata.push_back({"tokenizer.ggml.scores", GgufValue::array(GgufType::f32, scores)});
      metadata.push_back({"tokenizer.ggml.bos_token_id", std::uint32_t{1}});
      metadata.push_back({"tokenizer.ggml.eos_token_id", std::uint32_t{2}});
      metadata.push_back({"tokenizer.ggml.unknown_token_id", std::uint32_t{0}});
    } else {
      metadata.push_back({"tokenizer.ggml.merges", GgufValue::array(GgufType::string, {})});
      metadata.push_back({"tokenizer.ggml.bos_token_id", std::uint32_t{256}});
      metadata.push_back({"tokenizer.ggml.eos_token_id", std::uint32_t{256}});
    }
    metadata.push_back({"tokenizer.ggml.token_type", GgufValue::array(GgufType::i32, types)});
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
  save_gguf(path, metadata, entries);
}

}  // namespace dissect::testing
