// Tests of dissect/io/quantized_file.hpp through save_model / load_model: a quantised model read
// back computes bit for bit what the saved one did, in every format; the file stores each format
// in its documented dtype and shape; refused files name the tensor.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "dissect/io/model_file.hpp"
#include "support/io_testing.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_quantized_file {

TEST(QuantizedFile, EveryFormatRoundTripsBitForBit) {
  testing::TemporaryDirectory dir;
  const auto ids = testing::random_ids(2 * 5, 37, 3);
  for (const auto format :
       {WeightFormat::bf16, WeightFormat::int8, WeightFormat::q4_0, WeightFormat::q8_0}) {
    SCOPED_TRACE(std::string(weight_format_name(format)));
    LlamaModel<float> model(testing::quantisable_llama(), {.seed = 5});
    quantize_model(model, format);
    const auto path = dir / (std::string(weight_format_name(format)) + ".safetensors");
    save_model(path, model);
    const auto back = load_model<LlamaModel<float>>(Checkpoint(path));
    EXPECT_TENSOR_EQ(back.forward(TokenBatch{ids, 2, 5}), model.forward(TokenBatch{ids, 2, 5}));
    EXPECT_EQ(linear_weight_bytes(back), linear_weight_bytes(model));
    int quantised = 0;
    for_each_layer(back, [&](const std::string&, const Linear<float>& layer) {
      quantised += layer.quantized() && layer.quantized_weight().format() == format;
    });
    EXPECT_EQ(quantised, 11);

    const SafetensorsFile file(path);
    const auto& info = file.info("layers.0.mlp.down.weight");  // [32, 64]
    const auto layers = nlohmann::json::parse(file.metadata().at(quantization_key));
    EXPECT_EQ(layers["layers"]["layers.0.mlp.down"], weight_format_name(format));
    switch (format) {
      case WeightFormat::bf16:
        EXPECT_EQ(info.dtype, "BF16");
        EXPECT_FALSE(file.contains("layers.0.mlp.down.weight_scale"));
        break;
      case WeightFormat::int8:
        EXPECT_EQ(info.dtype, "I8");
        EXPECT_EQ(file.info("layers.0.mlp.down.weight_scale").dtype, "F32");
        EXPECT_EQ(file.info("layers.0.mlp.down.weight_scale").shape, std::vector<index_t>{32});
        break;
      case WeightFormat::q4_0:
        EXPECT_EQ(info.dtype, "U8");
        EXPECT_EQ(info.shape, (std::vector<index_t>{32, 32}));
        EXPECT_EQ(file.info("layers.0.mlp.down.weight_scale").shape, (std::vector<index_t>{32, 2}));
        break;
      default:  // ggml's blocks, scales inside: 2 blocks of 34 bytes per row
        EXPECT_EQ(info.dtype, "U8");
        EXPECT_EQ(info.shape, (std::vector<index_t>{32, 68}));
        EXPECT_FALSE(file.contains("layers.0.mlp.down.weight_scale"));
        break;
    }
    EXPECT_EQ(file.info("embed_tokens.weight").dtype, "F32");
  }
}

/// Rewrites `source` into `target` with `edit` applied to its entries (as raw bytes).
void rewrite(
    const std::filesystem::path& source, const std::filesystem::path& target,
    const std::function<void(std::vector<SaveEntry>&, std::map<std::string, std::string>&)>& edit) {
  const SafetensorsFile file(source);
  std::vector<SaveEntry> entries;
  for (const auto& info : file.tensors()) {
    entries.emplace_back(info.name, info.shape, StoredBytes{info.dtype, file.bytes(info.name)});
  }
  auto metadata = file.metadata();
  edit(entries, metadata);
  save_safetensors(target, entries, metadata);
}

TEST(QuantizedFile, RefusedFilesNameTheTensor) {
  testing::TemporaryDirectory dir;
  LlamaModel<float> model(testing::quantisable_llama(), {.seed = 5});
  quantize_model(model, WeightFormat::q4_0);
  save_model(dir / "q4.safetensors", model);
  const auto refuse = [&](const std::string& name, const auto& edit, const std::string& message) {
    SCOPED_TRACE(name);
    rewrite(dir / "q4.safetensors", dir / name, edit);
    EXPECT_THROW_WITH((void)load_model<LlamaModel<float>>(Checkpoint(dir / name)), FormatError,
                      message);
  };
  const std::vector<std::uint16_t> short_scales(32);
  refuse(
      "scale_shape.safetensors",
      [&](auto& entries, auto&) {
        for (auto& e : entries) {
          if (e.name == "layers.1.self_attn.qkv.weight_scale") {
            e.shape = {static_cast<index_t>(short_scales.size())};
            e.values = StoredBytes{"F16", std::as_bytes(std::span(short_scales))};
          }
        }
      },
      "tensor \"layers.1.self_attn.qkv.weight_scale\" has shape [32], the layer needs [64, 1]");
  refuse(
      "missing_scale.safetensors",
      [&](auto& entries, auto&) {
        std::erase_if(entries, [](const SaveEntry& e) { return e.name == "lm_head.weight_scale"; });
      },
      "tensor \"lm_head.weight_scale\" is missing");
  refuse(
      "wrong_dtype.safetensors",
      [&](auto&, auto& metadata) {
        metadata[quantization_key] = R"({"layers": {"layers.0.mlp.up": "int8"}})";
      },
      "tensor \"layers.0.mlp.up.weight\" is U8, its quantised format stores I8");
  refuse(
      "unknown_layer.safetensors",
      [&](auto&, auto& metadata) {
        metadata[quantization_key] = R"({"layers": {"layers.9.mlp.up": "q4_0"}})";
      },
      "lists layer layers.9.mlp.up, which the model does not have");
  refuse(
      "bad_format.safetensors",
      [&](auto&, auto& metadata) {
        metadata[quantization_key] = R"({"layers": {"layers.0.mlp.up": "int3"}})";
      },
      "weight format \"int3\" is not one of");
  refuse(
      "bad_json.safetensors", [&](auto&, auto& metadata) { metadata[quantization_key] = "[1"; },
      "is not {\"layers\": {path: format}}");
}

}  // namespace test_quantized_file
}  // namespace dissect
