// Tests of dissect/io/checkpoint_fit.hpp and of the checks HfCheckpointView makes of a file
// against its config: a config that claims more than the weights hold (a huge vocabulary,
// context or layer count, a width whose 4·D overflows) fails before a model is allocated,
// naming the key, the file and the tensor; q_proj, k_proj and v_proj are checked one by one, so
// swapped or re-split projections are refused although their stacked total fits; a file that
// holds a tensor under two names (prefixed and not) is refused rather than loaded with either
// copy; and module_path_of names exactly the parameters a built model has.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "dissect/io/checkpoint_fit.hpp"
#include "dissect/io/huggingface.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/io/open_model.hpp"
#include "support/fixture_testing.hpp"
#include "support/io_testing.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_checkpoint_fit {

namespace fs = std::filesystem;

fs::path hf_dir(const std::string& family) {
  return testing::fixture_dir("hf") / family;
}

/// A checkpoint's tensors as stored, by name: the fixtures' matrices, vectors, GPT-2's scalar and
/// 4-d mask buffers alike.
struct StoredTensor {
  std::vector<index_t> shape;
  std::string dtype;
  std::vector<std::byte> bytes;
};
using Tensors = std::map<std::string, StoredTensor>;

Tensors read_tensors(const fs::path& path) {
  const Checkpoint checkpoint(path);
  Tensors tensors;
  for (const std::string& name : checkpoint.tensor_names()) {
    const TensorInfo& info = checkpoint.info(name);
    const auto bytes = checkpoint.shard_of(name).bytes(name);
    tensors[name] = {info.shape, info.dtype, {bytes.begin(), bytes.end()}};
  }
  return tensors;
}

/// A fresh Hugging Face directory in `dir`: `tensors` as one model.safetensors beside `family`'s
/// fixture config.json changed by `edit`.
fs::path write_hf_dir(const fs::path& dir, const std::string& family, const Tensors& tensors,
                      const std::function<void(nlohmann::json&)>& edit = {}) {
  fs::create_directories(dir);
  std::vector<SaveEntry> entries;
  for (const auto& [name, stored] : tensors) {
    entries.emplace_back(name, stored.shape, StoredBytes{stored.dtype, stored.bytes});
  }
  save_safetensors(dir / "model.safetensors", entries);
  nlohmann::json config = nlohmann::json::parse(std::ifstream(hf_dir(family) / "config.json"));
  if (edit) edit(config);
  std::ofstream(dir / "config.json") << config.dump();
  return dir;
}

/// The GPT-2 fixture's weights beside its config changed by `edit`.
fs::path gpt2_with_config(const testing::TemporaryDirectory& tmp,
                          const std::function<void(nlohmann::json&)>& edit) {
  return write_hf_dir(tmp.path() / "gpt2", "gpt2", read_tensors(hf_dir("gpt2")), edit);
}

/// Runs `load` and returns how long it took, so a test can show it failed before allocating.
double seconds_of(const std::function<void()>& load) {
  const auto start = std::chrono::steady_clock::now();
  load();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// ---- module_path_of is the models' own naming ---------------------------------------------------

template <class Model>
void expect_every_matrix_named_as_the_model_names_it(const TransformerConfig& config) {
  const Model model(config, {.seed = 1});
  std::map<std::string, std::vector<index_t>> parameters;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    parameters[name.str()] = std::vector<index_t>(value.shape().begin(), value.shape().end());
  });
  std::size_t checked = 0;
  for (const WeightMatrix& matrix : weight_matrices(config)) {
    if (matrix.tied) continue;
    for (index_t layer : {index_t{0}, config.n_layers - 1}) {
      const std::string name = module_path_of(Model::style, matrix.name, layer) + ".weight";
      ASSERT_TRUE(parameters.contains(name)) << matrix.name << " → " << name;
      EXPECT_EQ(parameters[name], std::vector<index_t>(matrix.shape.begin(), matrix.shape.end()))
          << name;
      ++checked;
      if (!matrix.per_layer) break;
    }
  }
  EXPECT_GE(checked, 6u);
}

TEST(ModulePathOf, NamesEveryWeightMatrixAsTheBuiltModelDoes) {
  expect_every_matrix_named_as_the_model_names_it<GPT2Model<float>>({.d_model = 16,
                                                                     .n_layers = 3,
                                                                     .n_heads = 2,
                                                                     .d_ff = 24,
                                                                     .vocab = 11,
                                                                     .context = 9,
                                                                     .tied_embeddings = false});
  TransformerConfig llama{.d_model = 16,
                          .n_layers = 2,
                          .n_heads = 4,
                          .n_kv_heads = 2,
                          .d_ff = 40,
                          .vocab = 13,
                          .context = 8,
                          .tied_embeddings = false,
                          .positions = Positions::rotary,
                          .norm = Norm::rms_norm,
                          .bias = false,
                          .ffn = Ffn::gated};
  expect_every_matrix_named_as_the_model_names_it<LlamaModel<float>>(llama);
  EXPECT_THROW_WITH(module_path_of(gpt2_style, "attn.qkvx"), Error,
                    "\"attn.qkvx\" is not a matrix model_shape.hpp lists");
}

// ---- a config that claims more than the file holds fails before allocating ---------------------

TEST(CheckpointFit, AHugeVocabularyNamesTheKeysTheTensorAndTheFile) {
  const testing::TemporaryDirectory tmp;
  const auto dir = gpt2_with_config(tmp, [](auto& c) { c["vocab_size"] = 1'000'000'000'000; });
  // Allocating the embedding would take 128 TB: the error comes from the header alone, fast.
  const double seconds = seconds_of([&] {
    EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(dir), ConfigError,
                      "vocab_size = 1000000000000, n_embd = 32 make wte.weight [1000000000000, "
                      "32], but " +
                          (dir / "model.safetensors").string() + " holds [97, 32]");
  });
  EXPECT_LT(seconds, 5.0);
  EXPECT_THROW_WITH(open_model<GPT2Model<float>>(dir), ConfigError,
                    "load_model: " + (dir / "config.json").string() + ": vocab_size = ");
}

TEST(CheckpointFit, AHugeContextOrLayerCountFailsFromTheHeader) {
  const testing::TemporaryDirectory tmp;
  const auto context = gpt2_with_config(tmp, [](auto& c) { c["n_positions"] = 10'000'000; });
  const double seconds = seconds_of([&] {
    EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(context), ConfigError,
                      "n_positions = 10000000, n_embd = 32 make wpe.weight [10000000, 32], but");
  });
  EXPECT_LT(seconds, 5.0);

  const testing::TemporaryDirectory tmp2;
  const auto layers = gpt2_with_config(tmp2, [](auto& c) { c["n_layer"] = 1'000'000; });
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(layers), ConfigError,
                    "n_layer = 1000000, but " + (layers / "model.safetensors").string() +
                        " holds 2 layers (h.0 … h.1)");
}

TEST(CheckpointFit, EveryMismatchIsListedAtOnce) {
  const testing::TemporaryDirectory tmp;
  const auto dir = gpt2_with_config(tmp, [](auto& c) {
    c["n_inner"] = 64;
    c["n_layer"] = 3;
  });
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(dir), ConfigError,
                    "n_inner = 64, n_embd = 32 make h.0.mlp.up.weight [64, 32], but ");
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(dir), ConfigError,
                    "holds [32, 128]; n_layer = 3, but ");
}

TEST(CheckpointFit, AWidthWhoseDefaultFfnOverflowsNamesTheKey) {
  // n_inner null means 4·n_embd: with n_embd = 2⁶² that product overflows int64.
  const testing::TemporaryDirectory tmp;
  const auto dir = gpt2_with_config(tmp, [](auto& c) {
    c["n_embd"] = index_t{1} << 62;
    c["n_head"] = 1;
  });
  EXPECT_THROW_WITH(
      load_hf_model<GPT2Model<float>>(dir), ConfigError,
      "\"n_embd\" is too large: n_inner (null) means 4·n_embd, which overflows int64");
}

TEST(CheckpointFit, ASavedModelWithTamperedMetadataFailsBeforeAllocating) {
  const testing::TemporaryDirectory tmp;
  const GPT2Model<float> model(
      {.d_model = 8, .n_layers = 2, .n_heads = 2, .d_ff = 16, .vocab = 7, .context = 5},
      {.seed = 2});
  const auto file = tmp / "model.safetensors";
  save_model(file, model, {});
  // The metadata's config, rewritten with a context of 10⁹: a file only a hostile hand makes.
  const Checkpoint saved(file);
  auto config = nlohmann::json::parse(saved.metadata().at(config_key));
  config["context"] = 1'000'000'000;
  std::map<std::string, std::string> metadata = saved.metadata();
  metadata[config_key] = config.dump();
  std::vector<SaveEntry> entries;
  const Tensors tensors = read_tensors(file);
  for (const auto& [name, stored] : tensors) {
    entries.emplace_back(name, stored.shape, StoredBytes{stored.dtype, stored.bytes});
  }
  save_safetensors(file, entries, metadata);
  EXPECT_THROW_WITH(load_model<GPT2Model<float>>(Checkpoint(file)), ConfigError,
                    "context = 1000000000, d_model = 8 make wpe.weight [1000000000, 8], but");
  EXPECT_THROW_WITH(open_model<GPT2Model<float>>(file), ConfigError,
                    "(metadata \"dissect.config\"): context = 1000000000");
}

// ---- q, k and v one by one; no tensor under two names
// --------------------------------------------

TEST(CheckpointFit, SwappedQueryAndKeyProjectionsAreRefusedThoughTheirTotalFits) {
  Tensors tensors = read_tensors(hf_dir("llama"));
  // q_proj is [32, 32] and k_proj [16, 32]: swapped, the stacked qkv is still [64, 32].
  std::swap(tensors["model.layers.1.self_attn.q_proj.weight"],
            tensors["model.layers.1.self_attn.k_proj.weight"]);
  const testing::TemporaryDirectory tmp;
  const auto dir = write_hf_dir(tmp.path() / "llama", "llama", tensors);
  EXPECT_THROW_WITH(load_hf_model<LlamaModel<float>>(dir), ConfigError,
                    "model.layers.1.self_attn.q_proj.weight has 16 rows, but "
                    "num_attention_heads = 4 heads of head_dim = 8 make 32");
}

TEST(CheckpointFit, RowsMovedBetweenKeyAndValueAreRefused) {
  Tensors tensors = read_tensors(hf_dir("llama"));
  // Eight rows of v_proj moved to the end of k_proj: k [24, 32], v [8, 32].
  StoredTensor& k = tensors["model.layers.0.self_attn.k_proj.weight"];
  StoredTensor& v = tensors["model.layers.0.self_attn.v_proj.weight"];
  const std::ptrdiff_t moved = 8 * 32 * sizeof(float);
  k.bytes.insert(k.bytes.end(), v.bytes.begin(), v.bytes.begin() + moved);
  v.bytes.erase(v.bytes.begin(), v.bytes.begin() + moved);
  k.shape[0] = 24;
  v.shape[0] = 8;
  const testing::TemporaryDirectory tmp;
  const auto dir = write_hf_dir(tmp.path() / "llama", "llama", tensors);
  EXPECT_THROW_WITH(load_hf_model<LlamaModel<float>>(dir), ConfigError,
                    "k_proj.weight has 24 rows, but num_key_value_heads = 2 heads of head_dim = "
                    "8 make 16");
}

TEST(CheckpointFit, ATensorUnderTwoNamesIsRefusedNotLoadedWithEitherCopy) {
  Tensors gpt2 = read_tensors(hf_dir("gpt2"));
  StoredTensor other = gpt2["h.0.ln_1.weight"];
  other.bytes[0] ^= std::byte{1};  // which copy would win is exactly the question
  gpt2["transformer.h.0.ln_1.weight"] = other;
  const testing::TemporaryDirectory tmp;
  const auto dir = write_hf_dir(tmp.path() / "gpt2", "gpt2", gpt2);
  EXPECT_THROW_WITH(load_hf_model<GPT2Model<float>>(dir), FormatError,
                    "transformer.h.0.ln_1.weight (h.0.ln_1.weight): so is h.0.ln_1.weight: the "
                    "file holds this tensor twice");

  Tensors llama = read_tensors(hf_dir("llama"));
  llama["layers.0.self_attn.v_proj.weight"] = llama["model.layers.0.self_attn.v_proj.weight"];
  const auto llama_dir = write_hf_dir(tmp.path() / "llama", "llama", llama);
  EXPECT_THROW_WITH(load_hf_model<LlamaModel<float>>(llama_dir), FormatError,
                    "are both layers.0.self_attn.qkv.weight's part: the file holds it twice");
}

TEST(CheckpointFit, TheUnchangedFixturesStillLoad) {
  const testing::TemporaryDirectory tmp;
  const auto llama = write_hf_dir(tmp.path() / "llama", "llama", read_tensors(hf_dir("llama")));
  EXPECT_NO_THROW(load_hf_model<LlamaModel<float>>(llama));
  EXPECT_NO_THROW(open_model<GPT2Model<float>>(hf_dir("gpt2")));
}

}  // namespace test_checkpoint_fit
}  // namespace dissect
