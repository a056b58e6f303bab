// Tests of dissect/io/gguf_model_writer.hpp and io/hf_writer.hpp, the two directions of
// `dissect convert`: a GGUF model through a Hugging Face checkpoint and back must give the very
// bytes it started from (the names, the q/k row permutation, the metadata, the order: all of
// them inverted exactly), and save_gguf_model's q8_0 must be llama.cpp's own quantised tensors.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "dissect/io/gguf_model_writer.hpp"
#include "dissect/io/hf_writer.hpp"
#include "dissect/io/huggingface.hpp"
#include "support/gguf_models.hpp"
#include "support/io_testing.hpp"

namespace dissect {
namespace test_gguf_convert {

namespace fs = std::filesystem;

std::string bytes_of(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// The tokenizer.ggml.* entries of `file`, in its order.
std::vector<std::pair<std::string, GgufValue>> tokenizer_entries(const GgufFile& file) {
  std::vector<std::pair<std::string, GgufValue>> out;
  for (const auto& [key, value] : file.metadata()) {
    if (key.starts_with("tokenizer.")) out.push_back({key, value});
  }
  return out;
}

template <class Model>
void expect_round_trip(ModelFamily family) {
  const testing::TemporaryDirectory dir;
  testing::write_random_gguf_model(dir / "a.gguf", family, GgmlType::f32);
  const GgufFile a(dir / "a.gguf");
  save_hf_checkpoint(dir / "hf", load_gguf_model<Model>(a));

  // The Hugging Face side: transformers' config and names, read back by the strict loader.
  const HfConfig hf = read_hf_config(dir / "hf" / "config.json");
  EXPECT_EQ(hf.family, family);
  EXPECT_EQ(hf.config.d_model, 256);
  EXPECT_EQ(hf.config.kv_heads(), family == ModelFamily::llama ? 2 : 4);
  const Model from_hf = load_hf_model<Model>(dir / "hf");
  const Checkpoint checkpoint(dir / "hf" / "model.safetensors");
  if (family == ModelFamily::llama) {
    EXPECT_TRUE(checkpoint.contains("model.layers.1.self_attn.k_proj.weight"));
    EXPECT_TRUE(checkpoint.contains("lm_head.weight"));
  } else {
    EXPECT_TRUE(checkpoint.contains("h.1.attn.c_attn.weight"));
    EXPECT_EQ(checkpoint.info("h.1.attn.c_attn.weight").shape,
              (std::vector<index_t>{256, 3 * 256}));  // Conv1D: [in, out]
  }

  GgufModelOptions options;
  options.name = "dissect make_gguf";
  options.tokenizer = tokenizer_entries(a);
  save_gguf_model(dir / "b.gguf", from_hf, options);
  const std::string original = bytes_of(dir / "a.gguf"), again = bytes_of(dir / "b.gguf");
  EXPECT_EQ(original.size(), again.size());
  EXPECT_TRUE(original == again) << "GGUF → Hugging Face → GGUF changed the bytes";
}

TEST(GgufConvert, LlamaThroughHuggingFaceAndBackGivesTheSameBytes) {
  expect_round_trip<LlamaModel<float>>(ModelFamily::llama);
}

TEST(GgufConvert, Gpt2ThroughHuggingFaceAndBackGivesTheSameBytes) {
  expect_round_trip<GPT2Model<float>>(ModelFamily::gpt2);
}

TEST(GgufConvert, Q8_0IsLlamaCppsOwnQuantisation) {
  // llama_q8_0.gguf is llama_model_quantize's Q8_0 of the f32 model write_random_gguf_model
  // writes: save_gguf_model's q8_0 of the same weights must hold the same tensor bytes.
  const testing::TemporaryDirectory dir;
  testing::write_random_gguf_model(dir / "f32.gguf", ModelFamily::llama, GgmlType::f32);
  const auto model = load_gguf_model<LlamaModel<float>>(GgufFile(dir / "f32.gguf"));
  GgufModelOptions q8_0;
  q8_0.type = GgmlType::q8_0;
  save_gguf_model(dir / "q8_0.gguf", model, q8_0);
  const GgufFile ours(dir / "q8_0.gguf");
  const GgufFile llama_cpp(fs::path(DISSECT_GGUF_FIXTURE_DIR) / "llama_q8_0.gguf");
  ASSERT_EQ(ours.tensors().size(), llama_cpp.tensors().size());
  for (const GgufTensorInfo& info : llama_cpp.tensors()) {
    const GgufTensorInfo& mine = ours.info(info.name);
    EXPECT_EQ(mine.type, info.type) << info.name;
    const auto a = ours.bytes(info.name), b = llama_cpp.bytes(info.name);
    EXPECT_TRUE(std::equal(a.begin(), a.end(), b.begin(), b.end())) << info.name;
  }
  // No tokenizer given: llama.cpp's "none", with the vocabulary's size.
  EXPECT_EQ(ours.require_string("tokenizer.ggml.model"), "none");
  EXPECT_EQ(ours.require_unsigned("llama.vocab_size"), 260u);
  EXPECT_EQ(read_gguf_config(ours).config.vocab, 260);
}

TEST(GgufConvert, RefusesATypeWhoseBlocksDoNotDivideTheRows) {
  TransformerConfig config = testing::random_gguf_config(ModelFamily::llama);
  config.d_model = 128;  // q4_K's blocks hold 256 values
  config.d_ff = 128;
  const LlamaModel<float> model(config);
  const testing::TemporaryDirectory dir;
  try {
    GgufModelOptions q4_k;
    q4_k.type = GgmlType::q4_K;
    save_gguf_model(dir / "x.gguf", model, q4_k);
    ADD_FAILURE() << "accepted";
  } catch (const ConfigError& error) {
    EXPECT_NE(std::string(error.what())
                  .find("token_embd.weight's rows of 128 are not whole "
                        "blocks of q4_K (256 values)"),
              std::string::npos)
        << error.what();
  }
  EXPECT_FALSE(fs::exists(dir / "x.gguf"));
}

TEST(GgufConvert, HfConfigJsonReadsBackAsTheSameConfig) {
  TransformerConfig llama = testing::random_gguf_config(ModelFamily::llama);
  llama.rope_theta = 500000.0;
  llama.norm_eps = 1e-5;
  llama.head_dim = 32;
  llama.tied_embeddings = true;
  TransformerConfig gpt2 = testing::random_gguf_config(ModelFamily::gpt2);
  gpt2.score_scaling.inverse_layer_index = true;
  for (const HfConfig& model :
       {HfConfig{ModelFamily::llama, llama}, HfConfig{ModelFamily::gpt2, gpt2}}) {
    const HfConfig back = parse_hf_config(hf_config_json(model), "config.json");
    EXPECT_EQ(back.family, model.family);
    const TransformerConfig &x = model.config, &y = back.config;
    EXPECT_EQ(std::tie(x.d_model, x.n_layers, x.n_heads, x.d_ff, x.vocab, x.context),
              std::tie(y.d_model, y.n_layers, y.n_heads, y.d_ff, y.vocab, y.context));
    EXPECT_EQ(x.kv_heads(), y.kv_heads());
    EXPECT_EQ(x.head_size(), y.head_size());
    EXPECT_EQ(x.tied_embeddings, y.tied_embeddings);
    EXPECT_EQ(x.norm_eps.value_or(model.family == ModelFamily::gpt2 ? 1e-5 : 1e-6), y.norm_eps);
    EXPECT_EQ(x.rope_theta, y.rope_theta);
    EXPECT_EQ(x.score_scaling, y.score_scaling);
    EXPECT_EQ(x.positions, y.positions);
    EXPECT_EQ(x.ffn, y.ffn);
    EXPECT_EQ(x.bias, y.bias);
  }
}

}  // namespace test_gguf_convert
}  // namespace dissect
