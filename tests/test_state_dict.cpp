// Tests for dissect/io/state_dict.hpp: save_module then load_state_dict reproduces a Sequential
// of Linear layers and a GPT-2 model bit for bit; a float32 file fills a double model exactly;
// a refused load lists every missing, unexpected and mis-shaped tensor at once and changes
// nothing; prefixes, the name map and the ignore list match names the way the Hugging Face
// loaders will need.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/io/state_dict.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/sequential.hpp"
#include "support/io_testing.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_state_dict {

using Mlp = Sequential<Linear<float>, ReLU, Linear<float>>;
Mlp make_mlp(std::uint64_t seed) {
  return Mlp(Linear<float>(4, 3, {.seed = seed}), ReLU{}, Linear<float>(3, 2, {.seed = seed + 1}));
}

using testing::small_gpt2;

/// f(name, values) for every parameter, collected in visiting order.
template <Module M, class F>
auto collect(const M& module, F f) {
  std::vector<decltype(f(std::string(), ConstTensorView<float, 1>()))> all;
  module.for_each_parameter(
      [&](const ParameterName& name, auto value, auto) { all.push_back(f(name.str(), value)); });
  return all;
}

/// Every parameter's values as doubles, by name.
template <Module M>
auto parameter_values(const M& module) {
  return collect(module, [](std::string name, auto value) {
    return std::pair{name, std::vector<double>(value.begin(), value.end())};
  });
}

/// Every parameter's bytes: equality means bit for bit.
template <Module M>
auto bits_of(const M& module) {
  return collect(module, [](const std::string&, auto value) {
    const auto* first = reinterpret_cast<const unsigned char*>(value.data());
    return std::vector<unsigned char>(first, first + value.size() * sizeof(*value.data()));
  });
}

class StateDictTest : public ::testing::Test {
 protected:
  testing::TemporaryDirectory directory_;
};

TEST_F(StateDictTest, ASequentialOfLinearLayersRoundTripsBitExactly) {
  const Mlp saved = make_mlp(1);
  const auto path = directory_ / "mlp.safetensors";
  save_module(path, saved, {{"format", "pt"}});
  Mlp loaded = make_mlp(100);
  ASSERT_NE(bits_of(loaded), bits_of(saved));
  const LoadResult result = load_state_dict(loaded, SafetensorsFile(path));
  EXPECT_EQ(bits_of(loaded), bits_of(saved));
  EXPECT_EQ(result.loaded, (std::vector<std::string>{"0.weight", "0.bias", "2.weight", "2.bias"}));
  EXPECT_TRUE(result.missing.empty());
  EXPECT_TRUE(result.unexpected.empty());
  EXPECT_EQ(SafetensorsFile(path).metadata().at("format"), "pt");
}

TEST_F(StateDictTest, AGpt2ModelRoundTripsBitExactlyAndComputesTheSameLogits) {
  const GPT2Model<float> saved(small_gpt2(), {.seed = 1});
  const auto path = directory_ / "gpt2.safetensors";
  save_module(path, saved);
  GPT2Model<float> loaded(small_gpt2(), {.seed = 2});
  load_state_dict(loaded, Checkpoint(path));
  EXPECT_EQ(bits_of(loaded), bits_of(saved));
  const std::vector<index_t> ids{1, 5, 22, 0, 7, 3};
  const TokenBatch tokens{ids, 2, 3};
  EXPECT_TENSOR_EQ(loaded.forward(tokens), saved.forward(tokens));
  // The tied head is stored once, as wte.weight.
  EXPECT_FALSE(SafetensorsFile(path).contains("lm_head.weight"));
}

TEST_F(StateDictTest, AFloat32FileFillsADoubleModelExactly) {
  const GPT2Model<float> saved(small_gpt2(), {.seed = 3});
  const auto path = directory_ / "gpt2-f32.safetensors";
  save_module(path, saved);
  GPT2Model<double> loaded(small_gpt2(), {.seed = 4});
  load_state_dict(loaded, SafetensorsFile(path));
  EXPECT_EQ(parameter_values(loaded), parameter_values(saved)) << "float → double is exact";
}

TEST_F(StateDictTest, SavingAsBf16RoundsEachParameterOnce) {
  const Mlp saved = make_mlp(5);
  const auto path = directory_ / "mlp-bf16.safetensors";
  save_module(path, saved, {}, SaveDtype::bf16);
  EXPECT_EQ(SafetensorsFile(path).info("0.weight").dtype, "BF16");
  Mlp loaded = make_mlp(6);
  load_state_dict(loaded, SafetensorsFile(path));
  auto expected = parameter_values(saved);
  for (auto& [name, values] : expected) {
    for (double& value : values) value = bf16_to_float(float_to_bf16(static_cast<float>(value)));
  }
  EXPECT_EQ(parameter_values(loaded), expected);
}

/// A checkpoint for make_mlp's model without layer 2, with two tensors the model lacks and
/// 0.weight of the wrong shape.
std::filesystem::path broken_mlp_checkpoint(const testing::TemporaryDirectory& directory) {
  const Tensor<float, 2> wide({5, 4});
  const Tensor<float, 1> bias({3});
  const Tensor<float, 2> extra({1, 1});
  const auto path = directory / "broken.safetensors";
  save_safetensors(
      path, std::vector<SaveEntry>{
                {"0.weight", wide}, {"0.bias", bias}, {"extra.weight", extra}, {"unused", extra}});
  return path;
}

TEST_F(StateDictTest, AStrictLoadListsEveryProblemAtOnceAndChangesNothing) {
  Mlp model = make_mlp(7);
  const auto before = bits_of(model);
  const SafetensorsFile file(broken_mlp_checkpoint(directory_));
  EXPECT_THROW_WITH(load_state_dict(model, file), Error,
                    "load_state_dict: " + file.path().string() +
                        ": Missing key(s): 2.weight, 2.bias; Unexpected key(s): extra.weight, "
                        "unused; size mismatch for 0.weight: checkpoint [5, 4], model [3, 4]");
  EXPECT_EQ(bits_of(model), before) << "0.bias fitted, but nothing may be written";
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

template <class Model>
void expect_packed_load_uses_the_new_weights(const TransformerConfig& config,
                                             const std::filesystem::path& path) {
  const Model saved(config, {.seed = 1});
  save_module(path, saved);
  Model packed(config, {.seed = 2});
  packed.pack();
  load_state_dict(packed, Checkpoint(path));
  EXPECT_EQ(bits_of(packed), bits_of(saved));
  const std::vector<index_t> ids{1, 5, 22, 0, 7, 3};
  // Forward must read the loaded weights, not the packed copy of the old ones: repacked layers
  // and the fused blocks' fallback differ from the plain model by the packed GEMM's rounding.
  EXPECT_LT(relative_gap(packed.forward({ids, 2, 3}), saved.forward({ids, 2, 3})), 1e-5);
  packed.pack();  // and packing again fuses the new weights
  EXPECT_LT(relative_gap(packed.forward({ids, 2, 3}), saved.forward({ids, 2, 3})), 1e-5);
}

TEST_F(StateDictTest, ALoadIntoAPackedModelRepacksSoForwardUsesTheNewWeights) {
  expect_packed_load_uses_the_new_weights<GPT2Model<float>>(small_gpt2(),
                                                            directory_ / "gpt2.safetensors");
  expect_packed_load_uses_the_new_weights<LlamaModel<float>>(testing::small_llama(),
                                                             directory_ / "llama.safetensors");
}

TEST_F(StateDictTest, ALoadIntoAQuantisedOrMergedWeightIsRefusedAndChangesNothing) {
  const auto path = directory_ / "layer.safetensors";
  Linear<float> saved(4, 3, {.seed = 1});
  saved.attach_adapter({.rank = 2, .seed = 2});
  save_module(path, saved);
  {
    Linear<float> quantised(4, 3, {.seed = 3});
    quantised.attach_adapter({.rank = 2, .seed = 4});  // QLoRA
    quantised.quantize(WeightFormat::bf16);
    const auto before = bits_of(quantised);
    EXPECT_THROW_WITH(load_state_dict(quantised, SafetensorsFile(path)), Error,
                      "load_state_dict: " + path.string() +
                          ": weight: the weight is stored as bf16; dequantize() the layer first");
    EXPECT_EQ(bits_of(quantised), before);
  }
  {
    Linear<float> merged(4, 3, {.seed = 3});
    merged.attach_adapter({.rank = 2, .seed = 4}).B().fill(0.5f);
    merged.merge_adapter();
    const auto before = bits_of(merged);
    EXPECT_THROW_WITH(
        load_state_dict(merged, SafetensorsFile(path)), Error,
        "weight: the LoRA adapter is merged into the weight; unmerge_adapter() first");
    EXPECT_EQ(bits_of(merged), before);
    // Loading only what the merged layer can take (its adapter) works: forward then uses it.
    LoadOptions adapters_only;
    adapters_only.strict = false;  // weight and bias are left out by design
    adapters_only.name_map = [](std::string_view name) -> std::optional<std::string> {
      if (name.starts_with("lora_")) return std::string(name);
      return std::nullopt;
    };
    load_state_dict(merged, SafetensorsFile(path), adapters_only);
    merged.unmerge_adapter();
    EXPECT_TENSOR_EQ(merged.adapter().A(), saved.adapter().A());
  }
}

TEST_F(StateDictTest, ANonStrictLoadReportsWhatItSkippedButStillRefusesWrongShapes) {
  Mlp model = make_mlp(8);
  const auto before = bits_of(model);
  const SafetensorsFile file(broken_mlp_checkpoint(directory_));
  EXPECT_THROW_WITH(load_state_dict(model, file, {.strict = false}), Error,
                    ": size mismatch for 0.weight: checkpoint [5, 4], model [3, 4]");
  EXPECT_EQ(bits_of(model), before);

  // Without the mis-shaped tensor, the rest loads and the result says what was skipped.
  const Tensor<float, 1> bias({3}, {1, 2, 3});
  const auto path = directory_ / "partial.safetensors";
  save_safetensors(path, std::vector<SaveEntry>{{"0.bias", bias}, {"extra", bias}});
  const LoadResult result = load_state_dict(model, SafetensorsFile(path), {.strict = false});
  EXPECT_EQ(result.loaded, std::vector<std::string>{"0.bias"});
  EXPECT_EQ(result.missing, (std::vector<std::string>{"0.weight", "2.weight", "2.bias"}));
  EXPECT_EQ(result.unexpected, std::vector<std::string>{"extra"});
  EXPECT_TENSOR_EQ(model.get<0>().bias(), bias.view());
}

TEST_F(StateDictTest, ADtypeThatCannotBeConvertedIsAlwaysAnError) {
  const std::vector<std::int64_t> ids{1, 2};
  const auto path = directory_ / "ids.safetensors";
  testing::write_file(path, testing::safetensors_bytes(
                                R"({"bias":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})",
                                testing::bytes_of(ids)));
  Linear<float> layer(3, 2, {.seed = 1});
  EXPECT_THROW_WITH(load_state_dict(layer, SafetensorsFile(path), {.strict = false}), Error,
                    "dtype I64 of bias cannot be converted");
}

TEST_F(StateDictTest, PrefixesNameMapAndIgnoreListMatchOtherNamings) {
  const Mlp saved = make_mlp(9);
  Linear<float> first(4, 3, {.seed = 10});
  const auto path = directory_ / "renamed.safetensors";
  // A checkpoint in another naming: everything under "transformer.", layer 0 called "fc_in",
  // layer 2 "fc_out", plus a buffer the model has no parameter for.
  const Tensor<float, 1> mask({1});
  save_safetensors(path,
                   std::vector<SaveEntry>{{"transformer.fc_in.weight", saved.get<0>().weight()},
                                          {"transformer.fc_in.bias", saved.get<0>().bias()},
                                          {"transformer.fc_out.weight", saved.get<2>().weight()},
                                          {"transformer.fc_out.bias", saved.get<2>().bias()},
                                          {"transformer.attn.masked_bias", mask}});
  const LoadOptions options{
      .checkpoint_prefix = "transformer.",
      .name_map = [](std::string_view name) -> std::optional<std::string> {
        const std::string text(name);
        return (text[0] == '0' ? "fc_in" : "fc_out") + text.substr(1);
      },
      .ignore = [](std::string_view name) { return name.ends_with(".masked_bias"); }};
  Mlp model = make_mlp(11);
  const LoadResult result = load_state_dict(model, SafetensorsFile(path), options);
  EXPECT_EQ(bits_of(model), bits_of(saved));
  EXPECT_TRUE(result.unexpected.empty());

  // Without the ignore list the buffer is unexpected; mapped names show their checkpoint name.
  LoadOptions strict = options;
  strict.ignore = nullptr;
  EXPECT_THROW_WITH(load_state_dict(model, SafetensorsFile(path), strict), Error,
                    "Unexpected key(s): transformer.attn.masked_bias");
  strict.name_map = [](std::string_view name) { return "fc_in" + std::string(name.substr(1)); };
  EXPECT_THROW_WITH(load_state_dict(model, SafetensorsFile(path), strict), Error,
                    "size mismatch for 2.weight (checkpoint transformer.fc_in.weight): "
                    "checkpoint [3, 4], model [2, 3]");

  // A name map's nullopt leaves a parameter as it is (not missing); model_prefix picks a member.
  const auto bias_before = bits_of(model.get<2>());
  const LoadOptions only_first{
      .checkpoint_prefix = "transformer.fc_in.",
      .model_prefix = "0.",
      .ignore = [](std::string_view name) { return !name.starts_with("transformer.fc_in."); }};
  load_state_dict(model, SafetensorsFile(path), only_first);
  EXPECT_EQ(bits_of(model.get<2>()), bias_before);
  const LoadResult skipped = load_state_dict(
      first, SafetensorsFile(path),
      {.checkpoint_prefix = "transformer.fc_in.",
       .name_map = [](std::string_view name) -> std::optional<std::string> {
         if (name == "bias") return std::nullopt;
         return std::string(name);
       },
       .ignore = [](std::string_view name) { return !name.ends_with("fc_in.weight"); }});
  EXPECT_EQ(skipped.loaded, std::vector<std::string>{"weight"});
  EXPECT_TRUE(skipped.missing.empty());
  EXPECT_TENSOR_EQ(first.weight(), saved.get<0>().weight());
}

TEST_F(StateDictTest, AShardedCheckpointFillsAModel) {
  const GPT2Model<float> saved(small_gpt2(), {.seed = 12});
  // Split the state dict over two shards by name, with an index, as Hugging Face does.
  std::vector<SaveEntry> first, second;
  std::string weight_map;
  saved.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    const bool early = name.str().starts_with("h.0.") || name.str().starts_with("w");
    (early ? first : second).emplace_back(name.str(), value);
    weight_map += (weight_map.empty() ? "\"" : ", \"") + name.str() + "\": \"" +
                  (early ? "a.safetensors" : "b.safetensors") + "\"";
  });
  save_safetensors(directory_ / "a.safetensors", first);
  save_safetensors(directory_ / "b.safetensors", second);
  const std::string index = "{\"weight_map\": {" + weight_map + "}}";
  testing::write_file(directory_ / "model.safetensors.index.json", std::as_bytes(std::span(index)));

  GPT2Model<float> loaded(small_gpt2(), {.seed = 13});
  load_state_dict(loaded, Checkpoint(directory_.path()));
  EXPECT_EQ(bits_of(loaded), bits_of(saved));
}

}  // namespace test_state_dict
}  // namespace dissect
