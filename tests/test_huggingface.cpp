// Tests of dissect/io/huggingface.hpp and io/model_file.hpp: the fixtures' Hugging Face
// checkpoints (torch's weights under HF's names and layouts: Conv1D GPT-2 with mask buffers, a
// sharded LLaMA) load into GPT2Model and LlamaModel with every parameter equal to the model
// fixture's and reproduce torch's logits; the "transformer." prefix and a saved tied head are
// accepted; missing and unexpected tensors are listed; save_model/load_model round-trip.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "dissect/io/huggingface.hpp"
#include "dissect/io/model_file.hpp"
#include "support/fixture_testing.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace {

namespace fs = std::filesystem;

fs::path hf_dir(const std::string& family) {
  return testing::fixture_dir("hf") / family;
}

/// Every parameter equals the model fixture's weights exactly (float32 dyadic values).
template <class Model>
void expect_weights_of_fixture(const Model& model, const std::string& family) {
  const auto weights =
      testing::read_fixture(testing::fixture_dir("model") / ("weights_" + family + ".txt"));
  std::size_t compared = 0;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    using View = decltype(value);
    const auto expected =
        testing::tensor_from<scalar_of<View>, rank_of<View>>(weights.tensor(name.str()));
    EXPECT_TENSOR_EQ(value, expected) << name.str();
    ++compared;
  });
  EXPECT_EQ(compared, weights.tensors.size());
}

/// The model's logits on the fixture's tokens, against torch's float64 logits: the same
/// weights, so within the float64 rounding of both (normwise 1e-12 is ~10⁴ u, far below any
/// layout mistake, which moves logits by O(1)).
template <class Model>
void expect_torch_logits(const Model& model, const std::string& family) {
  const auto run =
      testing::read_fixture(testing::fixture_dir("model") / ("f64_" + family + ".txt"));
  const auto& ids_tensor = run.tensor("ids");
  const std::vector<index_t> ids(ids_tensor.values.begin(), ids_tensor.values.end());
  const auto logits = model.forward(TokenBatch{ids, ids_tensor.shape[0], ids_tensor.shape[1]});
  const auto expected = testing::tensor_from<double, 3>(run.tensor("logits"));
  double worst = 0, scale = 0;
  for (index_t i = 0; i < logits.size(); ++i) {
    worst = std::max(worst, std::abs(logits.data()[i] - expected.data()[i]));
    scale = std::max(scale, std::abs(expected.data()[i]));
  }
  EXPECT_LE(worst, 1e-12 * scale);
}

TEST(HuggingFace, Gpt2CheckpointLoadsAndGivesTorchsLogits) {
  const auto model = load_hf_model<GPT2Model<double>>(hf_dir("gpt2"));
  expect_weights_of_fixture(model, "gpt2");
  expect_torch_logits(model, "gpt2");
}

TEST(HuggingFace, ShardedLlamaCheckpointLoadsAndGivesTorchsLogits) {
  const auto model = load_hf_model<LlamaModel<double>>(hf_dir("llama"));
  expect_weights_of_fixture(model, "llama");
  expect_torch_logits(model, "llama");
}

TEST(HuggingFace, PrefixedNamesAndASavedTiedHeadAreAccepted) {
  // "transformer.h.0…" as GPT2LMHeadModel's state_dict names them, lm_head.weight (a copy of
  // wte) saved too, no mask buffers.
  const auto model = load_hf_model<GPT2Model<float>>(hf_dir("gpt2-prefixed"));
  expect_weights_of_fixture(model, "gpt2");
}

/// The GPT-2 fixture's weights beside a config.json changed by `edit`, in a fresh directory.
fs::path gpt2_with_config(const std::string& folder,
                          const std::function<void(nlohmann::json&)>& edit) {
  const fs::path out = fs::path(::testing::TempDir()) / folder;
  fs::create_directories(out);
  fs::copy_file(hf_dir("gpt2") / "model.safetensors", out / "model.safetensors",
                fs::copy_options::overwrite_existing);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(hf_dir("gpt2") / "config.json"));
  edit(config);
  std::ofstream(out / "config.json") << config.dump();
  return out;
}

TEST(HuggingFaceErrors, EveryMissingUnexpectedAndMisshapedTensorIsListed) {
  const auto deeper = gpt2_with_config("gpt2_three_layers", [](auto& c) { c["n_layer"] = 3; });
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(deeper), Error,
                    "Missing key(s): h.2.ln_1.weight, h.2.ln_1.bias, h.2.attn.qkv.weight");
  const auto shallower = gpt2_with_config("gpt2_one_layer", [](auto& c) { c["n_layer"] = 1; });
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(shallower), Error,
                    "Unexpected key(s): h.1.attn.proj.bias, h.1.attn.proj.weight");
  const auto narrower = gpt2_with_config("gpt2_narrow_mlp", [](auto& c) { c["n_inner"] = 64; });
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(narrower), Error,
                    "size mismatch for h.0.mlp.down.weight: checkpoint [32, 128], model [32, 64]");
  EXPECT_THROW_WITH(load_hf_model<LlamaModel<float>>(hf_dir("gpt2")), ConfigError,
                    "holds a gpt2 model, which cannot load into LlamaModel");
}

TEST(ModelFile, SaveModelAndLoadModelRoundTripBitExactly) {
  LlamaModel<float> model({.d_model = 16,
                           .n_layers = 2,
                           .n_heads = 4,
                           .n_kv_heads = 2,
                           .d_ff = 24,
                           .vocab = 23,
                           .context = 12,
                           .tied_embeddings = false,
                           .positions = Positions::rotary,
                           .norm = Norm::rms_norm,
                           .bias = false,
                           .ffn = Ffn::gated,
                           .norm_eps = 1e-5,
                           .rope_theta = 500000},
                          {.seed = 9});
  const fs::path path = fs::path(::testing::TempDir()) / "llama_model.safetensors";
  save_model(path, model, {{"note", "a test"}});
  const Checkpoint file(path);
  EXPECT_EQ(file.metadata().at("note"), "a test");
  EXPECT_EQ(file.metadata().at("dissect.family"), "llama");
  const auto again = load_model<LlamaModel<float>>(file);
  EXPECT_EQ(again.config().rope_theta, 500000);
  EXPECT_EQ(*again.config().norm_eps, 1e-5);
  EXPECT_EQ(again.config().kv_heads(), 2);
  std::vector<float> a, b;
  model.for_each_parameter(
      [&](const ParameterName&, auto v, auto) { a.insert(a.end(), v.begin(), v.end()); });
  again.for_each_parameter(
      [&](const ParameterName&, auto v, auto) { b.insert(b.end(), v.begin(), v.end()); });
  EXPECT_EQ(a, b);
  EXPECT_THROW_WITH(load_model<GPT2Model<float>>(file), ConfigError,
                    "holds a llama model, which cannot load into GPT2Model");
  EXPECT_THROW_WITH(load_model<GPT2Model<float>>(Checkpoint(hf_dir("gpt2"))), ConfigError,
                    "records no dissect model");
}

TEST(ModelFile, ConfigJsonRoundTripsEveryField) {
  TransformerConfig config = find_preset("llama-2-70b").config;
  config.norm_eps = 1e-5;
  config.head_dim = 128;
  const auto again = config_from_json(config_to_json(config), "test");
  EXPECT_EQ(config_to_json(again), config_to_json(config));
  auto broken = config_to_json(config);
  broken["norm"] = "batch_norm";
  EXPECT_THROW_WITH(config_from_json(broken, "f"), ConfigError,
                    "f: \"norm\" is not a known value (got \"batch_norm\")");
}

}  // namespace
}  // namespace dissect
