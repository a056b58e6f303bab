// Tests of dissect/io/lora_file.hpp: adapters saved alone under PEFT's names and read back into a
// fresh model (which then computes what the trained one did), and every refused file, each of
// which leaves the model as it was.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "dissect/io/lora_file.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/tensor/freezing.hpp"
#include "dissect/transforms/lora.hpp"
#include "dissect/transforms/quantize.hpp"
#include "support/io_testing.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_lora_file {

using testing::random_ids;
using testing::small_gpt2;

/// A small GPT-2 with adapters on qkv and mlp.down whose B is non-zero (as after training), and
/// the down projections' alpha different from the rest.
GPT2Model<float> adapted_model() {
  GPT2Model<float> model(small_gpt2(), {.seed = 4});
  apply_lora(model, {.adapter = {.rank = 4, .alpha = 8, .seed = 1}, .target_modules = {"qkv"}});
  for_each_layer(model, [](const std::string&, Linear<float>& layer) {
    if (!layer.has_adapter() && layer.out_features() == 16 && layer.in_features() == 32) {
      layer.attach_adapter({.rank = 2, .alpha = 3, .seed = 2});  // mlp.down
    }
  });
  std::mt19937_64 engine(3);
  for_each_layer(model, [&](const std::string&, Linear<float>& layer) {
    if (!layer.has_adapter()) return;
    for (auto& v : layer.adapter().B()) v = std::uniform_real_distribution<float>(-1, 1)(engine);
  });
  return model;
}

TEST(LoRAFile, SavesPeftNamesAndLoadsIntoAFreshModel) {
  const testing::TemporaryDirectory dir;
  const auto model = adapted_model();
  save_adapters(dir / "adapter.safetensors", model, {{"task", "test"}});

  const SafetensorsFile file(dir / "adapter.safetensors");
  EXPECT_EQ(file.tensor_names(),
            (std::vector<std::string>{"base_model.model.h.0.attn.qkv.lora_A.weight",
                                      "base_model.model.h.0.attn.qkv.lora_B.weight",
                                      "base_model.model.h.0.mlp.down.lora_A.weight",
                                      "base_model.model.h.0.mlp.down.lora_B.weight",
                                      "base_model.model.h.1.attn.qkv.lora_A.weight",
                                      "base_model.model.h.1.attn.qkv.lora_B.weight",
                                      "base_model.model.h.1.mlp.down.lora_A.weight",
                                      "base_model.model.h.1.mlp.down.lora_B.weight"}));
  EXPECT_EQ(file.info("base_model.model.h.0.attn.qkv.lora_B.weight").shape,
            (std::vector<index_t>{48, 4}));
  const auto config = nlohmann::json::parse(file.metadata().at(lora_config_key));
  EXPECT_EQ(config["peft_type"], "LORA");
  EXPECT_EQ(config["r"], 4);
  EXPECT_EQ(config["lora_alpha"], 8.0);
  EXPECT_EQ(config["alpha_pattern"]["h.0.mlp.down"], 3.0);
  EXPECT_EQ(config["target_modules"].size(), 4u);
  EXPECT_EQ(file.metadata().at("task"), "test");

  GPT2Model<float> fresh(small_gpt2(), {.seed = 4});  // the same base weights
  EXPECT_EQ(load_adapters(fresh, file), (std::vector<std::string>{"h.0.attn.qkv", "h.0.mlp.down",
                                                                  "h.1.attn.qkv", "h.1.mlp.down"}));
  EXPECT_EQ(trainable_parameter_count(fresh), trainable_parameter_count(model));
  EXPECT_EQ(fresh.layers().at(0).ffn().down().adapter().alpha(), 3.0);
  const auto ids = random_ids(10, 23, 5);
  EXPECT_TENSOR_EQ(fresh.forward({ids, 2, 5}), model.forward({ids, 2, 5}));
  // Loading again into the adapted model overwrites the same adapters.
  EXPECT_NO_THROW(load_adapters(fresh, file));
}

/// The largest |a − b| / (1 + |b|) over two tensors of one shape.
template <TensorLike A, TensorLike B>
double relative_gap(const A& a, const B& b) {
  double gap = 0;
  for (index_t i = 0; i < a.size(); ++i) {
    const double x = a.data()[i], y = b.data()[i];
    gap = std::max(gap, std::abs(x - y) / (1 + std::abs(y)));
  }
  return gap;
}

/// Every parameter's values, by name.
template <Module M>
std::vector<std::pair<std::string, std::vector<float>>> values_of(const M& model) {
  std::vector<std::pair<std::string, std::vector<float>>> all;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    all.emplace_back(name.str(), std::vector<float>(value.begin(), value.end()));
  });
  return all;
}

TEST(LoRAFile, LoadingIntoAMergedModelIsSeenByForwardAndUnmergeRestoresTheBase) {
  const testing::TemporaryDirectory dir;
  auto donor = adapted_model();
  for_each_layer(donor, [](const std::string&, Linear<float>& layer) {
    if (layer.has_adapter()) layer.adapter().B().vector() *= -2.0f;  // other adapters
  });
  save_adapters(dir / "adapter.safetensors", donor);
  auto model = adapted_model();
  const GPT2Model<float> base(small_gpt2(), {.seed = 4});
  merge_adapters(model);
  load_adapters(model, SafetensorsFile(dir / "adapter.safetensors"));
  const auto ids = random_ids(10, 23, 5);
  EXPECT_LT(relative_gap(model.forward({ids, 2, 5}), donor.forward({ids, 2, 5})), 1e-5);
  unmerge_adapters(model);
  for_each_layer(model, [&](const std::string& path, const Linear<float>& layer) {
    if (!layer.has_adapter()) return;
    const Linear<float>* original = nullptr;
    for_each_layer(base, [&](const std::string& p, const Linear<float>& l) {
      if (p == path) original = &l;
    });
    ASSERT_NE(original, nullptr);
    EXPECT_LT(relative_gap(layer.weight(), original->weight()), 1e-6) << path;
  });
}

TEST(LoRAFile, SaveModelOfAnAdaptedModelLoadsBackAnEqualModel) {
  const testing::TemporaryDirectory dir;
  const auto model = adapted_model();
  save_model(dir / "adapted.safetensors", model);
  const auto loaded = load_model<GPT2Model<float>>(Checkpoint(dir / "adapted.safetensors"));
  EXPECT_EQ(values_of(loaded), values_of(model));
  EXPECT_EQ(trainable_parameter_count(loaded), trainable_parameter_count(model));
  EXPECT_EQ(loaded.layers().at(0).ffn().down().adapter().alpha(), 3.0);
  const auto ids = random_ids(10, 23, 6);
  EXPECT_TENSOR_EQ(loaded.forward({ids, 2, 5}), model.forward({ids, 2, 5}));
  // Still a model file, not an adapter file.
  EXPECT_FALSE(SafetensorsFile(dir / "adapted.safetensors").metadata().contains(lora_config_key));
}

TEST(LoRAFile, SaveModelOfAQLoRAModelLoadsBackAnEqualModel) {
  const testing::TemporaryDirectory dir;
  LlamaModel<float> model(testing::quantisable_llama(), {.seed = 7});
  quantize_model(model, WeightFormat::int8);
  apply_lora(model, {.adapter = {.rank = 2, .alpha = 4, .seed = 1}, .target_modules = {"qkv"}});
  model.layers().at(1).qkv().qkv().adapter().B().fill(0.25f);
  save_model(dir / "qlora.safetensors", model);
  const auto loaded = load_model<LlamaModel<float>>(Checkpoint(dir / "qlora.safetensors"));
  const auto& qkv = loaded.layers().at(1).qkv().qkv();
  EXPECT_TRUE(qkv.quantized());
  EXPECT_TRUE(qkv.has_adapter());
  EXPECT_EQ(values_of(loaded), values_of(model));
  const auto ids = random_ids(8, 37, 7);
  EXPECT_TENSOR_EQ(loaded.forward({ids, 2, 4}), model.forward({ids, 2, 4}));
}

TEST(LoRAFile, SaveModelOfAMergedModelIsRefusedNamingTheLayerAndTheWaysOut) {
  const testing::TemporaryDirectory dir;
  auto model = adapted_model();
  merge_adapters(model);
  EXPECT_THROW_WITH(save_model(dir / "merged.safetensors", model), Error,
                    "save_model: " + (dir / "merged.safetensors").string() +
                        ": the LoRA adapter of h.0.attn.qkv is merged into its weight");
  EXPECT_THROW_WITH(save_model(dir / "merged.safetensors", model), Error, "save_adapters");
  EXPECT_FALSE(std::filesystem::exists(dir / "merged.safetensors"));
}

TEST(LoRAFile, RefusesFilesThatDoNotFitAndChangesNothing) {
  const testing::TemporaryDirectory dir;
  const auto model = adapted_model();
  save_adapters(dir / "adapter.safetensors", model);
  const SafetensorsFile good(dir / "adapter.safetensors");

  const auto expect_untouched = [](const GPT2Model<float>& m) {
    EXPECT_EQ(trainable_parameter_count(m), m.parameter_count());
  };
  {  // Another model's sizes.
    TransformerConfig wider = small_gpt2();
    wider.d_ff = 40;
    GPT2Model<float> other(wider, {.seed = 4});
    EXPECT_THROW_WITH(load_adapters(other, good), ShapeError, "do not fit h.0.mlp.down");
    expect_untouched(other);
  }
  {  // Fewer layers: the file's h.1 adapters have no home.
    TransformerConfig shallow = small_gpt2();
    shallow.n_layers = 1;
    GPT2Model<float> other(shallow, {.seed = 4});
    EXPECT_THROW_WITH(load_adapters(other, good), Error,
                      "no Linear layer for base_model.model.h.1.attn.qkv.lora_A.weight");
    expect_untouched(other);
  }
  {  // An adapter of another rank already there.
    GPT2Model<float> other(small_gpt2(), {.seed = 4});
    apply_lora(other, {.adapter = {.rank = 2}, .target_modules = {"qkv"}});
    EXPECT_THROW_WITH(load_adapters(other, good), ShapeError, "rank 2, the file's has rank 4");
  }
  {  // No metadata, and lora_A without lora_B.
    GPT2Model<float> other(small_gpt2(), {.seed = 4});
    const Tensor<float, 2> a({4, 16});
    const std::vector<SaveEntry> entries{{"base_model.model.h.0.attn.qkv.lora_A.weight", a}};
    save_safetensors(dir / "bare.safetensors", entries);
    EXPECT_THROW_WITH(load_adapters(other, SafetensorsFile(dir / "bare.safetensors")), FormatError,
                      "has no \"dissect.lora\" metadata");
    save_safetensors(dir / "half.safetensors", entries,
                     {{lora_config_key, R"({"peft_type": "LORA", "r": 4, "lora_alpha": 8})"}});
    EXPECT_THROW_WITH(load_adapters(other, SafetensorsFile(dir / "half.safetensors")), Error,
                      "has no lora_B partner");
    expect_untouched(other);
  }
  GPT2Model<float> plain(small_gpt2(), {.seed = 4});
  EXPECT_THROW_WITH(save_adapters(dir / "none.safetensors", plain), Error, "no LoRA adapter");
}

}  // namespace test_lora_file
}  // namespace dissect
