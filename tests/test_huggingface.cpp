// Tests of dissect/io/huggingface.hpp and io/model_file.hpp: the fixtures' Hugging Face
// checkpoints (torch's weights under HF's names and layouts: Conv1D GPT-2 with mask buffers, a
// sharded LLaMA) load into GPT2Model and LlamaModel with every parameter equal to the model
// fixture's and reproduce torch's logits; the "transformer." prefix and a saved tied head are
// accepted; missing and unexpected tensors are listed; save_model/load_model round-trip; the
// naming rules of io/hf_names.hpp, name by name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dissect/io/gguf_model_writer.hpp"
#include "dissect/io/hf_names.hpp"
#include "dissect/io/hf_writer.hpp"
#include "dissect/io/huggingface.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/io/open_model.hpp"
#include "support/fixture_testing.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_huggingface {

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

// MixtralForCausalLM's names (block_sparse_moe.gate, experts.M.w1/w2/w3) and config keys
// (num_local_experts, num_experts_per_tok), from a checkpoint torch's Mixtral block ran.
TEST(HuggingFace, MixtralCheckpointLoadsAndGivesTorchsLogits) {
  const auto model = load_hf_model<MixtralModel<double>>(hf_dir("mixtral"));
  EXPECT_EQ(model.config().n_experts, 4);
  EXPECT_EQ(model.config().experts_per_token, 2);
  EXPECT_EQ(model.config().rope_theta, 1e6);
  expect_weights_of_fixture(model, "mixtral");
  expect_torch_logits(model, "mixtral");
  // Found by its config, loaded by its family.
  const auto detected = detect_checkpoint(hf_dir("mixtral"));
  EXPECT_EQ(detected.require_model("test").family, ModelFamily::mixtral);
  const index_t experts = visit_model<double>(
      detected, [](const auto& any) { return any.config().n_experts; }, "test");
  EXPECT_EQ(experts, 4);
}

// save_hf_checkpoint writes Mixtral's names back; the directory loads to the same weights.
TEST(HuggingFace, MixtralRoundTripsThroughItsHuggingFaceNames) {
  const auto model = load_hf_model<MixtralModel<float>>(hf_dir("mixtral"));
  const fs::path dir = fs::path(::testing::TempDir()) / "mixtral_round_trip";
  save_hf_checkpoint(dir, model);
  const Checkpoint written(dir / "model.safetensors");
  EXPECT_TRUE(written.contains("model.layers.1.block_sparse_moe.gate.weight"));
  EXPECT_TRUE(written.contains("model.layers.1.block_sparse_moe.experts.3.w1.weight"));
  EXPECT_TRUE(written.contains("model.layers.0.block_sparse_moe.experts.0.w2.weight"));
  const auto again = load_hf_model<MixtralModel<float>>(dir);
  std::vector<float> a, b;
  model.for_each_parameter(
      [&](const ParameterName&, auto v, auto) { a.insert(a.end(), v.begin(), v.end()); });
  again.for_each_parameter(
      [&](const ParameterName&, auto v, auto) { b.insert(b.end(), v.begin(), v.end()); });
  EXPECT_EQ(a, b);
  EXPECT_EQ(read_hf_config(dir / "config.json").config.n_experts, 4);
}

double max_abs_difference(const Tensor<double, 3>& a, const Tensor<double, 3>& b) {
  double worst = 0;
  for (index_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a.data()[i] - b.data()[i]));
  return worst;
}

// Mistral: the llama fixture's weights with a window of 5, saved as a Hugging Face checkpoint
// ("mistral", sliding_window 5, LLaMA's tensor names), load back into a windowed LlamaModel that
// gives the same logits, and torch's (the sliding_window block's run of the same weights). GGUF's
// llama architecture has no window: that file is refused.
TEST(HuggingFace, AMistralCheckpointRoundTripsWithItsWindowAndGivesTorchsLogits) {
  const auto llama = load_hf_model<LlamaModel<double>>(hf_dir("llama"));
  TransformerConfig config = llama.config();
  config.sliding_window = 5;
  LlamaModel<double> mistral(config, {.seed = 1});
  std::vector<std::vector<double>> values;
  llama.for_each_parameter(
      [&](const ParameterName&, auto v, auto) { values.emplace_back(v.begin(), v.end()); });
  std::size_t at = 0;
  mistral.for_each_parameter([&](const ParameterName&, auto v, auto) {
    std::copy(values.at(at).begin(), values.at(at).end(), v.begin());
    ++at;
  });
  const fs::path dir = fs::path(::testing::TempDir()) / "mistral_round_trip";
  save_hf_checkpoint(dir, mistral);
  std::ifstream in(dir / "config.json");
  const auto json = nlohmann::json::parse(in);
  EXPECT_EQ(json.at("model_type"), "mistral");
  EXPECT_EQ(json.at("sliding_window"), 5);
  const auto again = load_hf_model<LlamaModel<double>>(dir);
  EXPECT_EQ(again.config().sliding_window, 5);

  const auto run =
      testing::read_fixture(testing::fixture_dir("sliding_window") / "f64_mistral.txt");
  const auto& ids_tensor = run.tensor("ids");
  const std::vector<index_t> ids(ids_tensor.values.begin(), ids_tensor.values.end());
  const TokenBatch tokens{ids, ids_tensor.shape[0], ids_tensor.shape[1]};
  const auto logits = again.forward(tokens);
  EXPECT_TENSOR_EQ(logits, mistral.forward(tokens));
  // Normwise within 1e-12 of torch's float64 run (a dozen stages of length ≤ 97, γ ≈ 1e-14).
  const auto torch_logits = testing::tensor_from<double, 3>(run.tensor("logits"));
  double worst = 0, scale = 0;
  for (index_t i = 0; i < logits.size(); ++i) {
    worst = std::max(worst, std::abs(logits.data()[i] - torch_logits.data()[i]));
    scale = std::max(scale, std::abs(torch_logits.data()[i]));
  }
  EXPECT_LE(worst, 1e-12 * scale);
  // Without the window the same weights are another model (the window moves the logits).
  EXPECT_GT(max_abs_difference(llama.forward(tokens), torch_logits), 1e-3 * scale);

  EXPECT_THROW_WITH(save_gguf_model(dir / "mistral.gguf", mistral), ConfigError,
                    "a sliding window (W = 5) has no key in GGUF's llama architecture");
  EXPECT_FALSE(fs::exists(dir / "mistral.gguf"));
}

TEST(HuggingFaceErrors, AMixtralCheckpointMissingAnExpertIsRefusedByName) {
  const fs::path dir = fs::path(::testing::TempDir()) / "mixtral_missing_expert";
  fs::create_directories(dir);
  fs::copy_file(hf_dir("mixtral") / "config.json", dir / "config.json",
                fs::copy_options::overwrite_existing);
  const Checkpoint full(hf_dir("mixtral") / "model.safetensors");
  std::vector<SaveEntry> entries;
  for (const std::string& name : full.tensor_names()) {
    if (name == "model.layers.1.block_sparse_moe.experts.2.w3.weight") continue;
    const auto& shard = full.shard_of(name);
    entries.emplace_back(name, full.info(name).shape,
                         StoredBytes{full.info(name).dtype, shard.bytes(name)});
  }
  save_safetensors(dir / "model.safetensors", entries, {});
  EXPECT_THROW_WITH(load_hf_model<MixtralModel<float>>(dir), Error,
                    "layers.1.block_sparse_moe.experts.2.up.weight");
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

TEST(HuggingFaceErrors, ATiedHeadOfAnotherShapeThanTheEmbeddingIsRefused) {
  // Row 134: with tie_word_embeddings, lm_head.weight is a copy of wte and is not read; one of
  // another shape was hidden all the same and the file loaded as a model it does not describe.
  const SafetensorsFile fixture(hf_dir("gpt2") / "model.safetensors");
  const auto write_with_head = [&](const std::string& folder, std::vector<index_t> shape) {
    const fs::path out = gpt2_with_config(folder, [](auto&) {});
    std::vector<SaveEntry> entries;
    for (const std::string& name : fixture.tensor_names()) {
      const TensorInfo& info = fixture.info(name);
      entries.emplace_back(name, info.shape, StoredBytes{info.dtype, fixture.bytes(name)});
    }
    const std::vector<float> head(static_cast<std::size_t>(shape[0] * shape[1]), 0.5f);
    entries.emplace_back("lm_head.weight", shape, std::span<const float>(head));
    save_safetensors(out / "model.safetensors", entries);
    return out;
  };
  const auto wte = fixture.info("wte.weight").shape;  // [97, 32]
  EXPECT_NO_THROW(load_hf_model<GPT2Model<float>>(write_with_head("gpt2_tied_head", wte)));
  const auto wrong = write_with_head("gpt2_tied_head_wrong", {wte[0] - 1, wte[1]});
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(wrong), FormatError,
                    (wrong / "model.safetensors").string() +
                        ": lm_head.weight [96, 32] is the "
                        "tied head (tie_word_embeddings), a copy of wte.weight [97, 32], but their "
                        "shapes differ");
}

// ---- the naming rules (hf_names.hpp) ------------------------------------------------------------

TEST(HfNames, Gpt2NamesMapToDissectsWithConv1DMarked) {
  // Prefixed or not, the same tensor; Conv1D weights transposed, their biases not.
  for (const char* name : {"h.0.attn.c_attn.weight", "transformer.h.0.attn.c_attn.weight"}) {
    const auto mapped = hf_to_dissect_name(ModelFamily::gpt2, name);
    ASSERT_TRUE(mapped) << name;
    EXPECT_EQ(mapped->name, "h.0.attn.qkv.weight");
    EXPECT_TRUE(mapped->transpose);
    EXPECT_EQ(mapped->qkv_part, -1);
  }
  const auto bias = hf_to_dissect_name(ModelFamily::gpt2, "h.3.mlp.c_proj.bias");
  ASSERT_TRUE(bias);
  EXPECT_EQ(bias->name, "h.3.mlp.down.bias");
  EXPECT_FALSE(bias->transpose);
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::gpt2, "h.1.attn.c_proj.weight")->name,
            "h.1.attn.proj.weight");
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::gpt2, "h.1.mlp.c_fc.weight")->name,
            "h.1.mlp.up.weight");
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::gpt2, "transformer.wte.weight")->name, "wte.weight");
  // Buffers, and a tied head's copy of wte, stand for no parameter.
  EXPECT_FALSE(hf_to_dissect_name(ModelFamily::gpt2, "h.0.attn.bias"));
  EXPECT_FALSE(hf_to_dissect_name(ModelFamily::gpt2, "transformer.h.0.attn.masked_bias"));
  EXPECT_FALSE(hf_to_dissect_name(ModelFamily::gpt2, "lm_head.weight", /*tied_head=*/true));
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::gpt2, "lm_head.weight")->name, "lm_head.weight");
  // A name the rules do not know keeps its (unprefixed) name, for a strict load to report.
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::gpt2, "transformer.h.0.extra")->name, "h.0.extra");
  EXPECT_TRUE(is_conv1d_weight("transformer.h.0.mlp.c_fc.weight"));
  EXPECT_FALSE(is_conv1d_weight("h.0.mlp.c_fc.bias"));
  EXPECT_FALSE(is_conv1d_weight("h.0.attn.qkv.weight"));  // dissect's own name: [out, in]
}

TEST(HfNames, LlamaNamesMapToDissectsWithQkvPartsNumbered) {
  const char* parts[] = {"q_proj", "k_proj", "v_proj"};
  for (int i = 0; i < 3; ++i) {
    const auto mapped = hf_to_dissect_name(
        ModelFamily::llama, std::string("model.layers.1.self_attn.") + parts[i] + ".weight");
    ASSERT_TRUE(mapped);
    EXPECT_EQ(mapped->name, "layers.1.self_attn.qkv.weight");
    EXPECT_EQ(mapped->qkv_part, i);
    EXPECT_FALSE(mapped->transpose);
  }
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::llama, "model.layers.0.self_attn.o_proj.weight")->name,
            "layers.0.self_attn.proj.weight");
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::llama, "model.layers.0.mlp.gate_proj.weight")->name,
            "layers.0.mlp.gate.weight");
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::llama, "model.layers.0.mlp.down_proj.weight")->name,
            "layers.0.mlp.down.weight");
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::llama, "model.embed_tokens.weight")->name,
            "embed_tokens.weight");
  EXPECT_EQ(hf_to_dissect_name(ModelFamily::llama, "lm_head.weight")->name, "lm_head.weight");
  EXPECT_FALSE(
      hf_to_dissect_name(ModelFamily::llama, "model.layers.0.self_attn.rotary_emb.inv_freq"));
  EXPECT_EQ(strip_hf_prefix(ModelFamily::llama, "model.norm.weight"), "norm.weight");
  EXPECT_EQ(strip_hf_prefix(ModelFamily::gpt2, "model.norm.weight"), "model.norm.weight");
}

TEST(HfNames, MixtralNamesMapToTheRouterAndEachExpertsProjections) {
  const auto name = [](std::string_view hf) {
    return hf_to_dissect_name(ModelFamily::mixtral, hf, false).value().name;
  };
  EXPECT_EQ(name("model.layers.3.block_sparse_moe.gate.weight"),
            "layers.3.block_sparse_moe.router.weight");
  EXPECT_EQ(name("model.layers.0.block_sparse_moe.experts.7.w1.weight"),
            "layers.0.block_sparse_moe.experts.7.gate.weight");
  EXPECT_EQ(name("model.layers.0.block_sparse_moe.experts.7.w3.weight"),
            "layers.0.block_sparse_moe.experts.7.up.weight");
  EXPECT_EQ(name("model.layers.0.block_sparse_moe.experts.7.w2.weight"),
            "layers.0.block_sparse_moe.experts.7.down.weight");
  const auto k =
      hf_to_dissect_name(ModelFamily::mixtral, "model.layers.2.self_attn.k_proj.weight", false);
  EXPECT_EQ(k->name, "layers.2.self_attn.qkv.weight");
  EXPECT_EQ(k->qkv_part, 1);
}

TEST(HfNames, LayersEmbeddingsAndBuffersInEitherFamilysNames) {
  EXPECT_EQ(layer_index_of("h.11.ln_1.weight"), 11);
  EXPECT_EQ(layer_index_of("transformer.h.3.attn.c_attn.weight"), 3);
  EXPECT_EQ(layer_index_of("model.layers.27.mlp.up_proj.weight"), 27);
  EXPECT_EQ(layer_index_of("layers.0.self_attn.qkv.weight"), 0);
  EXPECT_EQ(layer_index_of("wte.weight"), std::nullopt);
  EXPECT_EQ(layer_index_of("ch.2.weight"), std::nullopt);  // "h" only as a whole part
  EXPECT_EQ(layer_index_of("h.x.weight"), std::nullopt);
  EXPECT_EQ(layer_index_of("h.-1.weight"), std::nullopt);
  EXPECT_TRUE(is_embedding_name("wte.weight"));
  EXPECT_TRUE(is_embedding_name("transformer.wpe.weight"));
  EXPECT_TRUE(is_embedding_name("model.embed_tokens.weight"));
  EXPECT_FALSE(is_embedding_name("lm_head.weight"));
  EXPECT_FALSE(is_embedding_name("h.0.attn.qkv.weight"));
  EXPECT_TRUE(is_hf_buffer("h.0.attn.masked_bias"));
  EXPECT_TRUE(is_hf_buffer("model.layers.0.self_attn.rotary_emb.inv_freq"));
  EXPECT_FALSE(is_hf_buffer("h.0.attn.proj.bias"));
  EXPECT_FALSE(is_hf_buffer(ModelFamily::llama, "h.0.attn.bias"));
}

TEST(HuggingFaceErrors, EveryMissingUnexpectedAndMisshapedTensorIsListed) {
  const auto deeper = gpt2_with_config("gpt2_three_layers", [](auto& c) { c["n_layer"] = 3; });
  // A config that claims more than the file holds is refused from the header, before the model
  // is allocated (test_checkpoint_fit); one that claims less leaves tensors unexpected.
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(deeper), ConfigError,
                    "n_layer = 3, but " + (deeper / "model.safetensors").string() +
                        " holds 2 layers (h.0 … h.1)");
  const auto shallower = gpt2_with_config("gpt2_one_layer", [](auto& c) { c["n_layer"] = 1; });
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(shallower), Error,
                    "Unexpected key(s): h.1.attn.proj.bias, h.1.attn.proj.weight");
  const auto narrower = gpt2_with_config("gpt2_narrow_mlp", [](auto& c) { c["n_inner"] = 64; });
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(narrower), ConfigError,
                    "n_inner = 64, n_embd = 32 make h.0.mlp.up.weight [64, 32], but ");
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
  const TransformerConfig& mixtral = find_preset("mixtral-8x7b").config;
  const auto experts = config_from_json(config_to_json(mixtral), "test");
  EXPECT_EQ(experts.n_experts, 8);
  EXPECT_EQ(experts.experts_per_token, 2);
  EXPECT_EQ(config_to_json(experts), config_to_json(mixtral));
  auto broken = config_to_json(config);
  broken["norm"] = "batch_norm";
  EXPECT_THROW_WITH(config_from_json(broken, "f"), ConfigError,
                    "f: \"norm\" is not a known value (got \"batch_norm\")");
}

}  // namespace test_huggingface
}  // namespace dissect
