// Tests of dissect/io/open_model.hpp: detect_checkpoint names the kind of every checkpoint dissect
// reads — a Hugging Face directory (one file or shards, asked for by the directory, the file or
// the index), a save_model file with and without quantised layers, a LoRA adapter file, bare
// tensors, a GGUF file (by its magic, whatever its name) — and open_model / visit_model load the
// model each holds exactly as the kind's own loader does. A path that is none of these (missing,
// an empty directory, a random file, a config.json without weights, a truncated GGUF file) is an
// Error of the documented type naming the path.
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "dissect/io/gguf_model_writer.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/lora.hpp"
#include "support/fixture_testing.hpp"
#include "support/io_testing.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_open_model {

namespace fs = std::filesystem;
using testing::contains;
using testing::TemporaryDirectory;

fs::path hf_dir(const std::string& family) {
  return testing::fixture_dir("hf") / family;
}

/// Every parameter of `model`, in for_each_parameter's order, as doubles.
template <class Model>
std::vector<double> parameters_of_model(const Model& model) {
  std::vector<double> values;
  model.for_each_parameter(
      [&](const ParameterName&, auto v, auto) { values.insert(values.end(), v.begin(), v.end()); });
  return values;
}

// ---- each kind ----------------------------------------------------------------------------------

TEST(DetectCheckpoint, HuggingFaceDirectoryWithOneFile) {
  // The directory, or its safetensors file: config.json sits beside it either way.
  for (const fs::path& path : {hf_dir("gpt2"), hf_dir("gpt2") / "model.safetensors"}) {
    SCOPED_TRACE(path.string());
    const auto found = detect_checkpoint(path);
    EXPECT_EQ(found.kind, CheckpointKind::hugging_face);
    EXPECT_EQ(checkpoint_kind_name(found.kind), "hugging_face");
    EXPECT_FALSE(found.sharded());
    EXPECT_EQ(found.checkpoint.shards().size(), 1u);
    ASSERT_TRUE(found.model);
    EXPECT_EQ(found.model->family, ModelFamily::gpt2);
    EXPECT_EQ(found.config_file, hf_dir("gpt2") / "config.json");
    EXPECT_EQ(found.config_source(), (hf_dir("gpt2") / "config.json").string());
  }
  // The same model load_hf_model reads, bit for bit.
  EXPECT_EQ(parameters_of_model(open_model<GPT2Model<double>>(hf_dir("gpt2"))),
            parameters_of_model(load_hf_model<GPT2Model<double>>(hf_dir("gpt2"))));
}

TEST(DetectCheckpoint, ShardedHuggingFaceDirectoryOrItsIndex) {
  for (const fs::path& path : {hf_dir("llama"), hf_dir("llama") / "model.safetensors.index.json"}) {
    SCOPED_TRACE(path.string());
    const auto found = detect_checkpoint(path);
    EXPECT_EQ(found.kind, CheckpointKind::hugging_face);
    EXPECT_TRUE(found.sharded());
    EXPECT_EQ(found.checkpoint.shards().size(), 2u);
    ASSERT_TRUE(found.model);
    EXPECT_EQ(found.model->family, ModelFamily::llama);
  }
  EXPECT_EQ(parameters_of_model(open_model<LlamaModel<double>>(hf_dir("llama"))),
            parameters_of_model(load_hf_model<LlamaModel<double>>(hf_dir("llama"))));
  EXPECT_THROW_WITH(open_model<GPT2Model<float>>(hf_dir("llama")), ConfigError,
                    "config.json: holds a llama model, which cannot load into GPT2Model");
}

TEST(DetectCheckpoint, DissectModelFile) {
  const TemporaryDirectory dir;
  const GPT2Model<float> model(testing::small_gpt2(), {.seed = 3});
  save_model(dir / "model.safetensors", model, {{"note", "kept"}});
  // The file, or the directory holding it.
  for (const fs::path& path : {dir / "model.safetensors", dir.path()}) {
    SCOPED_TRACE(path.string());
    const auto found = detect_checkpoint(path);
    EXPECT_EQ(found.kind, CheckpointKind::dissect_model);
    EXPECT_EQ(checkpoint_kind_name(found.kind), "dissect_model");
    ASSERT_TRUE(found.model);
    EXPECT_EQ(found.model->family, ModelFamily::gpt2);
    EXPECT_EQ(config_to_json(found.model->config), config_to_json(model.config()));
    EXPECT_TRUE(found.config_file.empty());
    EXPECT_TRUE(contains(found.config_source(), "metadata"));
    EXPECT_EQ(found.checkpoint.metadata().at("note"), "kept");
  }
  EXPECT_EQ(parameters_of_model(open_model<GPT2Model<float>>(dir.path())),
            parameters_of_model(model));
  EXPECT_THROW_WITH(open_model<LlamaModel<float>>(dir.path()), ConfigError,
                    "holds a gpt2 model, which cannot load into LlamaModel");
}

TEST(DetectCheckpoint, DissectQuantizedFile) {
  const TemporaryDirectory dir;
  LlamaModel<float> model(testing::quantisable_llama(), {.seed = 5});
  quantize_model(model, WeightFormat::int8);
  save_model(dir / "int8.safetensors", model);
  const auto found = detect_checkpoint(dir / "int8.safetensors");
  EXPECT_EQ(found.kind, CheckpointKind::dissect_quantized);
  EXPECT_EQ(checkpoint_kind_name(found.kind), "dissect_quantized");
  ASSERT_TRUE(found.model);
  EXPECT_EQ(found.model->family, ModelFamily::llama);
  // Read back with its quantised layers: the same logits, bit for bit.
  const auto back = load_model<LlamaModel<float>>(found);
  const auto ids = testing::random_ids(2 * 5, 37, 3);
  EXPECT_TENSOR_EQ(back.forward(TokenBatch{ids, 2, 5}), model.forward(TokenBatch{ids, 2, 5}));
  EXPECT_EQ(linear_weight_bytes(back), linear_weight_bytes(model));
}

TEST(DetectCheckpoint, DissectMetadataWinsOverAConfigJsonBesideIt) {
  // A save_model file dropped into a Hugging Face directory is still read as what it says it is.
  const TemporaryDirectory dir;
  fs::copy_file(hf_dir("gpt2") / "config.json", dir / "config.json");
  const LlamaModel<float> model(testing::small_llama(), {.seed = 2});
  save_model(dir / "mine.safetensors", model);
  const auto found = detect_checkpoint(dir / "mine.safetensors");
  EXPECT_EQ(found.kind, CheckpointKind::dissect_model);
  ASSERT_TRUE(found.model);
  EXPECT_EQ(found.model->family, ModelFamily::llama);
  EXPECT_EQ(parameters_of_model(load_model<LlamaModel<float>>(found)), parameters_of_model(model));
}

TEST(DetectCheckpoint, LoraAdapterFileHoldsNoModel) {
  const TemporaryDirectory dir;
  GPT2Model<float> model(testing::small_gpt2(), {.seed = 4});
  apply_lora(model, {.adapter = {.rank = 2, .alpha = 4, .seed = 1}, .target_modules = {"qkv"}});
  save_adapters(dir / "adapter.safetensors", model);
  const auto found = detect_checkpoint(dir / "adapter.safetensors");
  EXPECT_EQ(found.kind, CheckpointKind::lora_adapter);
  EXPECT_EQ(checkpoint_kind_name(found.kind), "lora_adapter");
  EXPECT_FALSE(found.model);
  EXPECT_TRUE(contains(found.config_source(), "LoRA"));
  EXPECT_THROW_WITH(
      (void)found.require_model("generate"), ConfigError,
      "generate: " + (dir / "adapter.safetensors").string() + ": holds LoRA adapters, not a model");
  EXPECT_THROW_WITH(open_model<GPT2Model<float>>(dir / "adapter.safetensors"), ConfigError,
                    "load_model: " + (dir / "adapter.safetensors").string());
}

TEST(DetectCheckpoint, BareTensorsAreAStateDictWithoutAModel) {
  const TemporaryDirectory dir;
  const GPT2Model<float> model(testing::small_gpt2(), {.seed = 1});
  save_module(dir / "weights.safetensors", model);
  const auto found = detect_checkpoint(dir.path());
  EXPECT_EQ(found.kind, CheckpointKind::state_dict);
  EXPECT_EQ(checkpoint_kind_name(found.kind), "state_dict");
  EXPECT_FALSE(found.model);
  EXPECT_EQ(found.checkpoint.tensor_names().size(), found.checkpoint.shards()[0].tensors().size());
  EXPECT_TRUE(contains(found.config_source(), "none"));
  EXPECT_THROW_WITH(open_model<GPT2Model<float>>(dir.path()), ConfigError,
                    (dir / "weights.safetensors").string() + ": no model config");
}

TEST(VisitModel, CallsWithTheModelOfTheCheckpointsFamily) {
  const auto name_of = [](const auto& model) {
    return std::string(std::remove_cvref_t<decltype(model)>::style.model_name);
  };
  EXPECT_EQ(visit_model(detect_checkpoint(hf_dir("gpt2")), name_of), "GPT2Model");
  EXPECT_EQ(visit_model<double>(detect_checkpoint(hf_dir("llama")), name_of), "LlamaModel");
  // f may change the model it is given.
  EXPECT_GT(visit_model(detect_checkpoint(hf_dir("gpt2")),
                        [](auto& model) { return quantize_model(model, WeightFormat::bf16); })
                .size(),
            0u);
  const TemporaryDirectory dir;
  save_module(dir / "weights.safetensors", GPT2Model<float>(testing::small_gpt2(), {.seed = 1}));
  EXPECT_THROW_WITH(visit_model(detect_checkpoint(dir.path()), name_of, "inspect"), ConfigError,
                    "inspect: " + (dir / "weights.safetensors").string() + ": no model config");
}

// ---- GGUF ---------------------------------------------------------------------------------------

/// A LLaMA whose every matrix is whole q8_0 blocks (32 inputs), so a GGUF file of it keeps blocks.
TransformerConfig gguf_llama() {
  TransformerConfig config = testing::small_llama(40);
  config.d_model = 32;
  config.d_ff = 64;
  return config;
}

/// A GPT-2 of the same shape.
TransformerConfig gguf_gpt2() {
  return {.d_model = 32, .n_layers = 2, .n_heads = 4, .d_ff = 64, .vocab = 40, .context = 12};
}

/// `model` written by save_gguf_model at `path`, its matrices q8_0.
template <class Model>
void write_gguf(const fs::path& path, const Model& model) {
  GgufModelOptions options;
  options.type = GgmlType::q8_0;
  save_gguf_model(path, model, options);
}

/// Whether this process maps `path` (Linux's /proc/self/maps); nullopt where there is no such
/// file to ask.
std::optional<bool> maps_file(const fs::path& path) {
  std::ifstream maps("/proc/self/maps");
  if (!maps) return std::nullopt;
  const std::string name = fs::canonical(path).string();
  for (std::string line; std::getline(maps, line);) {
    if (line.ends_with(name)) return true;
  }
  return false;
}

template <class Model>
Tensor<float, 3> logits_of(const Model& model) {
  const auto ids = testing::random_ids(2 * 5, model.config().vocab, 7);
  return model.forward(TokenBatch{ids, 2, 5});
}

TEST(DetectGguf, AGgufFileIsKnownByItsMagicWhateverItsName) {
  const TemporaryDirectory dir;
  const LlamaModel<float> model(gguf_llama(), {.seed = 6});
  for (const char* name : {"model.gguf", "model.bin", "model.safetensors"}) {
    SCOPED_TRACE(name);
    write_gguf(dir / name, model);
    EXPECT_TRUE(is_gguf_file(dir / name));
    const auto found = detect_checkpoint(dir / name);
    EXPECT_EQ(found.kind, CheckpointKind::gguf);
    EXPECT_EQ(checkpoint_kind_name(found.kind), "gguf");
    // The config, read from the metadata and checked against every tensor, before any weight.
    ASSERT_TRUE(found.model);
    EXPECT_EQ(found.model->family, ModelFamily::llama);
    EXPECT_EQ(config_to_json(found.model->config),
              config_to_json(read_gguf_config(GgufFile(dir / name)).config));
    EXPECT_EQ(found.model->config.d_model, 32);
    EXPECT_EQ(found.model->config.vocab, 40);
    EXPECT_EQ(&found.require_model("generate"), &*found.model);
    ASSERT_TRUE(found.gguf);
    EXPECT_EQ(found.gguf->path(), dir / name);
    EXPECT_EQ(found.gguf->tensors().size(), 2u * 9 + 3);  // 9 per block, embedding, norm, head
    // The Checkpoint holds no tensors of its own but names the file.
    EXPECT_EQ(found.checkpoint.path(), dir / name);
    EXPECT_TRUE(found.checkpoint.shards().empty());
    EXPECT_TRUE(found.checkpoint.tensor_names().empty());
    EXPECT_FALSE(found.sharded());
    EXPECT_TRUE(found.config_file.empty());
    EXPECT_TRUE(contains(found.config_source(), "GGUF metadata"));
  }
  // Nothing else is: a safetensors file, a directory, a missing path, three bytes of the magic.
  save_model(dir / "saved.safetensors", model);
  EXPECT_FALSE(is_gguf_file(dir / "saved.safetensors"));
  EXPECT_FALSE(is_gguf_file(dir.path()));
  EXPECT_FALSE(is_gguf_file(dir / "missing.gguf"));
  const std::string three = "GGU";
  testing::write_file(dir / "three.gguf", std::as_bytes(std::span(three)));
  EXPECT_FALSE(is_gguf_file(dir / "three.gguf"));
}

TEST(DetectGguf, OpenModelLoadsWhatLoadGgufModelLoads) {
  const TemporaryDirectory dir;
  const LlamaModel<float> llama(gguf_llama(), {.seed = 6});
  const GPT2Model<float> gpt2(gguf_gpt2(), {.seed = 8});
  write_gguf(dir / "llama.bin", llama);
  write_gguf(dir / "gpt2.gguf", gpt2);
  const GgufFile llama_file(dir / "llama.bin"), gpt2_file(dir / "gpt2.gguf");

  // By default as load_gguf_model's default: the q8_0 blocks kept, on the quantised kernels.
  const auto opened = open_model<LlamaModel<float>>(dir / "llama.bin");
  const auto direct = load_gguf_model<LlamaModel<float>>(llama_file);
  EXPECT_TENSOR_EQ(logits_of(opened), logits_of(direct));
  int kept = 0;
  for_each_layer(opened, [&](const std::string&, const Linear<float>& layer) {
    kept += layer.quantized() ? 1 : 0;
  });
  EXPECT_EQ(kept, 2 * 5 + 1);
  EXPECT_TENSOR_EQ(logits_of(open_model<GPT2Model<float>>(dir / "gpt2.gguf")),
                   logits_of(load_gguf_model<GPT2Model<float>>(gpt2_file)));

  // The GGUF load options pass through: every layer in float, or the float copy freed.
  const ModelLoadOptions in_float{.gguf = {.keep_quantized = false}};
  const auto floats = open_model<LlamaModel<float>>(dir / "llama.bin", in_float);
  EXPECT_TENSOR_EQ(logits_of(floats),
                   logits_of(load_gguf_model<LlamaModel<float>>(llama_file, in_float.gguf)));
  for_each_layer(floats, [&](const std::string& name, const Linear<float>& layer) {
    EXPECT_FALSE(layer.quantized()) << name;
  });
  const ModelLoadOptions lean{.gguf = {.keep_quantized = true, .release_dense = true}};
  const std::string name = visit_model(
      detect_checkpoint(dir / "llama.bin"), lean,
      [&](auto& model) {
        int released = 0;
        for_each_layer(model, [&](const std::string&, const Linear<float>& layer) {
          released += layer.dense_weight_released() ? 1 : 0;
        });
        EXPECT_EQ(released, 2 * 5 + 1);
        EXPECT_TENSOR_EQ(logits_of(model), logits_of(direct));
        return std::string(std::remove_cvref_t<decltype(model)>::style.model_name);
      },
      "generate");
  EXPECT_EQ(name, "LlamaModel");
  EXPECT_EQ(
      visit_model(detect_checkpoint(dir / "gpt2.gguf"),
                  [](const auto& model) {
                    return std::string(std::remove_cvref_t<decltype(model)>::style.model_name);
                  }),
      "GPT2Model");

  // A model of the other family is refused, naming the file.
  EXPECT_THROW_WITH(
      open_model<GPT2Model<float>>(dir / "llama.bin"), ConfigError,
      (dir / "llama.bin").string() + ": holds a llama model, which cannot load into GPT2Model");
}

TEST(DetectGguf, AHandedOverCheckpointIsReleasedBeforeTheVisitorRuns) {
  const TemporaryDirectory dir;
  const fs::path path = dir / "model.gguf";
  write_gguf(path, LlamaModel<float>(gguf_llama(), {.seed = 6}));
  {
    const auto detected = detect_checkpoint(path);
    if (!maps_file(path)) GTEST_SKIP() << "no /proc/self/maps here";
    // Kept by the caller: still mapped while f runs.
    visit_model(detected, [&](auto&) { EXPECT_EQ(maps_file(path), true); });
  }
  EXPECT_EQ(maps_file(path), false);
  // Handed over: unmapped once the model is loaded, before f packs or allocates anything.
  visit_model(detect_checkpoint(path), [&](auto&) { EXPECT_EQ(maps_file(path), false); });
  visit_model(
      detect_checkpoint(path), ModelLoadOptions{},
      [&](auto& model) {
        EXPECT_EQ(maps_file(path), false);
        EXPECT_TENSOR_EQ(logits_of(model), logits_of(open_model<LlamaModel<float>>(path)));
      },
      "generate");
}

TEST(DetectGguf, AnArchitectureDissectDoesNotBuildIsDetectedWithoutAModel) {
  const TemporaryDirectory dir;
  const std::vector<std::pair<std::string, GgufValue>> metadata{
      {"general.architecture", std::string("bert")}};
  const std::vector<float> values(32, 0.5f);
  const std::vector<GgufTensorEntry> tensors{
      {"t.weight", GgmlType::f32, {32}, std::as_bytes(std::span(values))}};
  save_gguf(dir / "bert.gguf", metadata, tensors);
  const auto found = detect_checkpoint(dir / "bert.gguf");
  EXPECT_EQ(found.kind, CheckpointKind::gguf);
  EXPECT_FALSE(found.model);
  ASSERT_TRUE(found.gguf);
  EXPECT_EQ(found.gguf->tensors().size(), 1u);
  EXPECT_TRUE(contains(found.config_source(), "none"));
  // The reader's own refusal, naming the file and the architecture.
  EXPECT_THROW_WITH(
      (void)found.require_model("generate"), FormatError,
      (dir / "bert.gguf").string() + ": general.architecture \"bert\" is not one dissect builds");
  EXPECT_THROW_WITH(open_model<LlamaModel<float>>(dir / "bert.gguf"), FormatError,
                    "is not one dissect builds");
}

TEST(DetectGguf, ATruncatedOrGarbledGgufFileIsAFormatErrorNamingIt) {
  const TemporaryDirectory dir;
  write_gguf(dir / "model.gguf", LlamaModel<float>(gguf_llama(), {.seed = 6}));
  // Cut in its data: the magic says GGUF, the reader says what is missing.
  const auto size = fs::file_size(dir / "model.gguf");
  fs::copy_file(dir / "model.gguf", dir / "cut.bin");
  fs::resize_file(dir / "cut.bin", size / 2);
  EXPECT_THROW_WITH(detect_checkpoint(dir / "cut.bin"), FormatError,
                    "GgufFile: " + (dir / "cut.bin").string() + ": ");
  EXPECT_THROW_WITH(open_model<LlamaModel<float>>(dir / "cut.bin"), FormatError,
                    (dir / "cut.bin").string());
  // Cut in its header.
  fs::copy_file(dir / "model.gguf", dir / "header.gguf");
  fs::resize_file(dir / "header.gguf", 10);
  EXPECT_THROW_WITH(detect_checkpoint(dir / "header.gguf"), FormatError,
                    "GgufFile: " + (dir / "header.gguf").string() + ": ");
  // Bytes that are no GGUF file, whatever the name says.
  std::mt19937_64 engine(5);
  std::vector<std::byte> noise(512);
  for (auto& b : noise) b = static_cast<std::byte>(engine() | 0x80);  // never 'G': no GGUF magic
  testing::write_file(dir / "noise.gguf", noise);
  EXPECT_THROW_WITH(detect_checkpoint(dir / "noise.gguf"), FormatError,
                    "detect_checkpoint: " + (dir / "noise.gguf").string() +
                        " is not a checkpoint dissect reads (a GGUF file");
}

// ---- loading for inference ----------------------------------------------------------------------

/// Whether `model` holds any gradient of a matrix (the memory as large as its weights).
template <class Model>
index_t matrix_gradient_values(const Model& model) {
  index_t values = 0;
  model.for_each_parameter([&](const ParameterName&, auto value, auto grad) {
    if constexpr (rank_of<decltype(value)> == 2) values += grad.size();
  });
  return values;
}

TEST(LoadForInference, SkippingTheRandomDrawsLoadsTheModelTheOldWayLoaded) {
  // The old way: the model built with its random values (seed 0, as the loaders passed), then
  // filled strictly. A parameter the file did not overwrite would stay random there and 0 now.
  const auto found = detect_checkpoint(hf_dir("llama"));
  LlamaModel<float> reference(found.model->config, {.seed = 0});
  load_state_dict(reference, HfCheckpointView(found.checkpoint, *found.model));
  const auto loaded = load_model<LlamaModel<float>>(found);
  EXPECT_EQ(parameters_of_model(loaded), parameters_of_model(reference));
  const auto ids = testing::random_ids(2 * 4, found.model->config.vocab, 9);
  EXPECT_TENSOR_EQ(loaded.forward(TokenBatch{ids, 2, 4}), reference.forward(TokenBatch{ids, 2, 4}));
  // Trainable as before: every gradient there.
  EXPECT_GT(matrix_gradient_values(loaded), 0);
  EXPECT_EQ(matrix_gradient_values(loaded), matrix_gradient_values(reference));
}

TEST(LoadForInference, AScopeWithoutGradientsLoadsTheSameModelWithNoGradientBuffers) {
  const TemporaryDirectory dir;
  const GPT2Model<float> saved(testing::small_gpt2(), {.seed = 4});
  save_model(dir / "model.safetensors", saved);
  for (const fs::path& path : {dir / "model.safetensors", hf_dir("llama")}) {
    SCOPED_TRACE(path.string());
    const auto found = detect_checkpoint(path);
    visit_model(found, [&](const auto& trainable) {
      using Model = std::remove_cvref_t<decltype(trainable)>;
      std::optional<Model> inference;
      {
        const ConstructionScope scope({.gradients = false});
        inference.emplace(load_model<Model>(found));
      }
      EXPECT_EQ(parameters_of_model(*inference), parameters_of_model(trainable));
      EXPECT_EQ(matrix_gradient_values(*inference), 0);
      EXPECT_GT(matrix_gradient_values(trainable), 0);
      for_each_layer(*inference, [](const std::string& name, const Linear<float>& layer) {
        EXPECT_TRUE(layer.frozen()) << name;
      });
      EXPECT_TRUE(inference->token_embedding().frozen());
      const auto ids = testing::random_ids(3, found.model->config.vocab, 2);
      EXPECT_TENSOR_EQ(inference->forward(TokenBatch{ids, 1, 3}),
                       trainable.forward(TokenBatch{ids, 1, 3}));
      return 0;
    });
  }
}

// ---- what is none of them -----------------------------------------------------------------------

TEST(DetectCheckpointErrors, AMissingPathIsNamed) {
  const TemporaryDirectory dir;
  EXPECT_THROW_WITH(
      detect_checkpoint(dir / "no-such.safetensors"), Error,
      "detect_checkpoint: " + (dir / "no-such.safetensors").string() + " does not exist");
  EXPECT_THROW_WITH(open_model<GPT2Model<float>>(dir / "nothing"), Error, "does not exist");
}

TEST(DetectCheckpointErrors, AnEmptyDirectoryIsNoCheckpoint) {
  const TemporaryDirectory dir;
  EXPECT_THROW_WITH(detect_checkpoint(dir.path()), Error,
                    "detect_checkpoint: " + dir.path().string() +
                        " is not a checkpoint: no config.json, no weights dissect can open");
}

TEST(DetectCheckpointErrors, ARandomFileIsNoCheckpoint) {
  const TemporaryDirectory dir;
  std::mt19937_64 engine(11);
  std::vector<std::byte> noise(4096);
  for (auto& b : noise) b = static_cast<std::byte>(engine());
  testing::write_file(dir / "random.bin", noise);
  const std::string expected =
      "detect_checkpoint: " + (dir / "random.bin").string() + " is not a checkpoint dissect reads";
  EXPECT_THROW_WITH(detect_checkpoint(dir / "random.bin"), FormatError, expected);
  // Shorter than a safetensors header's own length field.
  const std::string text = "hello";
  testing::write_file(dir / "short.safetensors", std::as_bytes(std::span(text)));
  EXPECT_THROW_WITH(detect_checkpoint(dir / "short.safetensors"), FormatError,
                    (dir / "short.safetensors").string() + " is not a checkpoint dissect reads");
}

TEST(DetectCheckpointErrors, AConfigJsonWithoutWeightsIsNamed) {
  const TemporaryDirectory dir;
  fs::copy_file(hf_dir("gpt2") / "config.json", dir / "config.json");
  EXPECT_THROW_WITH(detect_checkpoint(dir.path()), Error,
                    "detect_checkpoint: " + dir.path().string() +
                        " holds a config.json but no weights dissect can open");
  EXPECT_THROW_WITH(open_model<GPT2Model<float>>(dir.path()), Error,
                    "holds a config.json but no weights");
  // The config.json itself, where its directory was meant.
  EXPECT_THROW_WITH(
      detect_checkpoint(hf_dir("gpt2") / "config.json"), Error,
      (hf_dir("gpt2") / "config.json").string() + " describes a model but holds no weights");
}

TEST(DetectCheckpointErrors, SeveralCandidateFilesAreNamed) {
  const TemporaryDirectory dir;
  const GPT2Model<float> model(testing::small_gpt2(), {.seed = 1});
  save_module(dir / "a.safetensors", model);
  save_module(dir / "b.safetensors", model);
  EXPECT_THROW_WITH(detect_checkpoint(dir.path()), Error,
                    "more than one candidate: a.safetensors, b.safetensors");
}

TEST(DetectCheckpointErrors, AnUnreadableConfigJsonIsNamed) {
  const TemporaryDirectory dir;
  fs::copy_file(hf_dir("gpt2") / "model.safetensors", dir / "model.safetensors");
  const std::string broken = "{\"model_type\": ";
  testing::write_file(dir / "config.json", std::as_bytes(std::span(broken)));
  EXPECT_THROW_WITH(detect_checkpoint(dir.path()), Error,
                    (dir / "config.json").string() + " is not valid JSON");
  const std::string bert = "{\"model_type\": \"bert\"}";
  testing::write_file(dir / "config.json", std::as_bytes(std::span(bert)));
  EXPECT_THROW_WITH(detect_checkpoint(dir.path()), ConfigError,
                    "model_type \"bert\" is not one dissect builds");
}

TEST(DetectCheckpointErrors, AKindOutsideTheEnumIsNamed) {
  EXPECT_THROW_WITH((void)checkpoint_kind_name(static_cast<CheckpointKind>(17)), ConfigError,
                    "CheckpointKind(17) is not a checkpoint kind");
}

}  // namespace test_open_model
}  // namespace dissect
