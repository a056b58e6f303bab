// Tests of parallel/parallel_decoder_layer.hpp on 2 ranks and on 1: a whole GPT-2 block and a
// LLaMA layer (GQA, RoPE) split over the ranks give the single-process DecoderLayer's output,
// input gradient and every parameter gradient (gathered) within the block tests' bound; a layer
// read slice by slice from a save_model checkpoint equals the one split from the model in memory
// bit for bit; a checkpoint missing a tensor or holding one of the wrong shape makes every rank
// throw the same error, even when only one rank's file is bad.
#include "dissect/parallel/parallel_decoder_layer.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "dissect/io/model_file.hpp"
#include "dissect/models/decoder_model.hpp"
#include "parallel/parallel_testing.hpp"
#include "support/small_models.hpp"

namespace dissect::testing {
namespace test_parallel_decoder_layer {

using parallel::ParallelDecoderLayer;

bool ends_with(const std::string& text, std::string_view suffix) {
  return text.size() >= suffix.size() &&
         text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// The full tensor of a parallel layer's parameter (or gradient) `name`, put back together from
/// the ranks' slices, flattened row-major: the fused qkv by its parts, column-parallel rows,
/// row-parallel columns; the rest is replicated.
template <class Scalar, class View>
std::vector<Scalar> gathered(const std::string& name, const View& part,
                             const TransformerConfig& config) {
  const auto& comm = world();
  const index_t P = comm.size();
  Tensor<Scalar, rank_of<View>> full(part.shape());
  std::copy(part.begin(), part.end(), full.data());
  if (name.find(".qkv.") != std::string::npos) {
    const auto rows = gather_first(comm, part);
    const index_t d_k = config.head_size(), row = rows.size() / rows.dim(0);
    const index_t parts[3] = {config.n_heads * d_k, config.kv_heads() * d_k,
                              config.kv_heads() * d_k};
    const index_t local_rows = part.dim(0);
    std::vector<Scalar> fused(static_cast<std::size_t>(rows.size()));
    index_t part_start = 0, local_start = 0;
    for (index_t width : parts) {
      const index_t share = width / P;
      for (index_t p = 0; p < P; ++p) {
        std::copy_n(rows.data() + (p * local_rows + local_start) * row, share * row,
                    fused.data() + (part_start + p * share) * row);
      }
      part_start += width;
      local_start += share;
    }
    return fused;
  }
  Tensor<Scalar, rank_of<View>> result = full;
  if (name.find(".up.") != std::string::npos || name.find(".gate.") != std::string::npos) {
    result = gather_first(comm, part);
  } else if (ends_with(name, "proj.weight") || ends_with(name, "down.weight")) {
    if constexpr (rank_of<View> == 2) result = gather_last(comm, part);
  }
  return std::vector<Scalar>(result.data(), result.data() + result.size());
}

template <class Scalar, const DecoderStyle& Style>
void expect_layer_matches(const TransformerConfig& config, index_t index = 0) {
  const auto& comm = world();
  constexpr index_t B = 2, T = 5;
  const index_t D = config.d_model;
  std::mt19937_64 engine(31);
  const auto x = random_tensor<Scalar, 3>({B, T, D}, engine);
  const auto dy = random_tensor<Scalar, 3>({B, T, D}, engine);
  std::optional<RotaryTable<Scalar>> rope;
  if (Style.positions == Positions::rotary) {
    rope.emplace(config.head_size(), config.context, config.rope_theta);
  }
  const RotaryTable<Scalar>* table = rope ? &*rope : nullptr;
  // Larger weights than the models' 0.02, so every path matters.
  DecoderLayer<Scalar, Style> full(config, 11, index);
  full.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    if (name.str().find("weight") != std::string::npos && rank_of<decltype(value)> == 2) {
      for (auto& v : value) v *= Scalar(20);
    }
  });
  typename DecoderLayer<Scalar, Style>::Cache cache;
  const auto y_ref = full.forward(x, cache, table);
  const auto dx_ref = full.backward(x, cache, dy, table);

  ParallelDecoderLayer<Scalar, Style> split(full, comm);
  typename ParallelDecoderLayer<Scalar, Style>::Cache split_cache;
  const auto y = split.forward(x, split_cache, table);
  // The chains of a layer: q·kᵀ over d_k, P·v over T, the projections over D, the FFN over D + F.
  const index_t length = 3 * D + T + config.d_ff;
  EXPECT_TENSOR_NEAR(y, y_ref, 0.0, block_bound<Scalar>(length, comm.size(), y_ref));
  EXPECT_TENSOR_NEAR(split.forward(x, table), y, 0.0, 0.0);
  const auto dx = split.backward(x, split_cache, dy, table);
  EXPECT_TENSOR_NEAR(dx, dx_ref, 0.0, block_bound<Scalar>(2 * length, comm.size(), dx_ref));

  std::map<std::string, std::vector<Scalar>> expected;
  full.for_each_parameter([&](const ParameterName& name, auto, auto grad) {
    expected[name.str()] = std::vector<Scalar>(grad.begin(), grad.end());
  });
  std::vector<std::string> names;
  split.for_each_parameter([&](const ParameterName& name, auto, auto grad) {
    const std::string text = name.str();
    names.push_back(text);
    const auto got = gathered<Scalar>(text, grad, config);
    const auto& want = expected.at(text);
    ASSERT_EQ(got.size(), want.size()) << text;
    double scale = 1, diff = 0;
    for (std::size_t i = 0; i < want.size(); ++i) {
      scale = std::max(scale, std::abs(static_cast<double>(want[i])));
      diff = std::max(diff, std::abs(static_cast<double>(got[i]) - static_cast<double>(want[i])));
    }
    const double bound = 4.0 * gamma<Scalar>(2 * length + 10 + comm.size()) *
                         static_cast<double>(2 * length + 10) * scale;
    EXPECT_LE(diff, bound) << text;
  });
  EXPECT_EQ(names, parameter_names(full));
}

template <class Scalar>
class ParallelDecoderLayerTest : public ::testing::Test {};
TYPED_TEST_SUITE(ParallelDecoderLayerTest, FloatAndDouble);

TYPED_TEST(ParallelDecoderLayerTest, GPT2BlockMatchesTheFullLayer) {
  expect_layer_matches<TypeParam, gpt2_style>(small_gpt2());
}

TYPED_TEST(ParallelDecoderLayerTest, GPT2BlockWithScoreScalingMatchesTheFullLayer) {
  // GPT-2's scale_attn_weights: false, and scale_attn_by_inverse_layer_idx in layer 1 (/ 2): the
  // split layer keeps the full one's scale, forward and backward.
  TransformerConfig config = small_gpt2();
  config.score_scaling.scale = 1.0;
  expect_layer_matches<TypeParam, gpt2_style>(config);
  config.score_scaling = {.scale = std::nullopt, .inverse_layer_index = true};
  expect_layer_matches<TypeParam, gpt2_style>(config, 1);
}

TYPED_TEST(ParallelDecoderLayerTest, LlamaLayerWithGroupedQueryAttentionMatchesTheFullLayer) {
  const auto config = small_llama();
  ASSERT_EQ(config.n_heads, 4);
  ASSERT_EQ(config.kv_heads(), 2);
  expect_layer_matches<TypeParam, llama_style>(config);
}

/// A path every rank agrees on (rank 0's pid), distinct for np1 and np2 runs.
std::filesystem::path shared_path(const std::string& stem) {
  const auto& comm = world();
  std::int64_t pid = comm.rank() == 0 ? static_cast<std::int64_t>(::getpid()) : 0;
  comm.all_reduce_sum(std::span<std::int64_t>(&pid, 1));
  return std::filesystem::temp_directory_path() /
         (stem + "_np" + std::to_string(comm.size()) + "_" + std::to_string(pid) + ".safetensors");
}

void barrier() {
  MPI_Barrier(MPI_COMM_WORLD);
}

template <class Model>
void expect_loaded_layer_is_bit_identical(const TransformerConfig& config, const char* stem) {
  using Layer = ParallelDecoderLayer<float, Model::style>;
  const auto& comm = world();
  const Model model(config, {.init_std = 0.3, .seed = 9});
  const auto path = shared_path(stem);
  if (comm.rank() == 0) save_model(path, model);
  barrier();
  const SafetensorsFile file(path);
  const std::string prefix = std::string(Model::style.layers) + ".1.";
  const auto loaded = parallel::load_parallel_layer<Layer>(file, prefix, config, comm);
  const Layer split(model.layers().at(1), comm);
  std::vector<std::vector<float>> a, b;
  loaded.for_each_parameter(
      [&](const ParameterName&, auto value, auto) { a.emplace_back(value.begin(), value.end()); });
  split.for_each_parameter(
      [&](const ParameterName&, auto value, auto) { b.emplace_back(value.begin(), value.end()); });
  EXPECT_EQ(parameter_names(loaded), parameter_names(split));
  EXPECT_EQ(a, b);  // bit for bit
  std::mt19937_64 engine(41);
  const auto x = random_tensor<float, 3>({1, 4, config.d_model}, engine);
  const RotaryTable<float> rope(config.head_size(), config.context, config.rope_theta);
  EXPECT_TENSOR_NEAR(loaded.forward(x, &rope), split.forward(x, &rope), 0.0, 0.0);
  barrier();
  if (comm.rank() == 0) std::filesystem::remove(path);
}

TEST(ParallelDecoderLayer, GPT2LayerLoadedSliceBySliceEqualsTheSplitModel) {
  expect_loaded_layer_is_bit_identical<GPT2Model<float>>(small_gpt2(), "dissect_tp_gpt2");
}

TEST(ParallelDecoderLayer, GPT2LayerWithPerLayerScoreScalingLoadsItsOwnScale) {
  // Layer 1 of the file scales by 1/(√d_k · 2), read from the prefix "h.1.".
  TransformerConfig config = small_gpt2();
  config.score_scaling.inverse_layer_index = true;
  expect_loaded_layer_is_bit_identical<GPT2Model<float>>(config, "dissect_tp_gpt2_scaled");
}

TEST(ParallelDecoderLayer, LlamaLayerLoadedSliceBySliceEqualsTheSplitModel) {
  expect_loaded_layer_is_bit_identical<LlamaModel<float>>(small_llama(), "dissect_tp_llama");
}

TEST(ParallelDecoderLayer, HalfPrecisionCheckpointsConvertAsLoadDoes) {
  // A BF16 file read into double: each slice is exactly the converted full tensor's slice.
  const auto& comm = world();
  const auto config = small_llama();
  const LlamaModel<float> model(config, {.init_std = 0.3, .seed = 9});
  const auto path = shared_path("dissect_tp_bf16");
  if (comm.rank() == 0) save_model(path, model, {});
  barrier();
  // save_model keeps fp32; write a BF16 copy of layer 0 by hand.
  const auto bf16_path = shared_path("dissect_tp_bf16_copy");
  if (comm.rank() == 0) {
    const SafetensorsFile source(path);
    std::vector<Tensor<float, 2>> matrices;
    std::vector<Tensor<float, 1>> vectors;
    std::vector<SaveEntry> entries;
    for (const auto& info : source.tensors()) {
      if (info.shape.size() == 2) {
        matrices.push_back(source.load<float, 2>(info.name));
      } else if (info.shape.size() == 1) {
        vectors.push_back(source.load<float, 1>(info.name));
      }
    }
    std::size_t m = 0, v = 0;
    for (const auto& info : source.tensors()) {
      if (info.shape.size() == 2) entries.emplace_back(info.name, matrices[m++], SaveDtype::bf16);
      if (info.shape.size() == 1) entries.emplace_back(info.name, vectors[v++], SaveDtype::bf16);
    }
    save_safetensors(bf16_path, entries, source.metadata());
  }
  barrier();
  const SafetensorsFile file(bf16_path);
  using Layer = parallel::ParallelLlamaDecoderLayer<double>;
  const auto loaded = parallel::load_parallel_layer<Layer>(file, "layers.0.", config, comm);
  // The reference: the whole model loaded (converted) into double, then split in memory.
  const auto whole = load_model<LlamaModel<double>>(Checkpoint(bf16_path));
  const Layer split(whole.layers().at(0), comm);
  std::vector<std::vector<double>> a, b;
  loaded.for_each_parameter(
      [&](const ParameterName&, auto value, auto) { a.emplace_back(value.begin(), value.end()); });
  split.for_each_parameter(
      [&](const ParameterName&, auto value, auto) { b.emplace_back(value.begin(), value.end()); });
  EXPECT_EQ(a, b);
  barrier();
  if (comm.rank() == 0) {
    std::filesystem::remove(path);
    std::filesystem::remove(bf16_path);
  }
}

/// save_model's tensors of `model`, with `change` applied to the list.
template <class Model, class Change>
void save_changed(const std::filesystem::path& path, const Model& model, Change change) {
  std::vector<std::pair<std::string, Tensor<float, 2>>> matrices;
  std::vector<std::pair<std::string, Tensor<float, 1>>> vectors;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    if constexpr (rank_of<decltype(value)> == 2) {
      matrices.emplace_back(name.str(), Tensor<float, 2>(value));
    } else {
      vectors.emplace_back(name.str(), Tensor<float, 1>(value));
    }
  });
  change(matrices);
  std::vector<SaveEntry> entries;
  for (const auto& [name, tensor] : matrices) entries.emplace_back(name, tensor);
  for (const auto& [name, tensor] : vectors) entries.emplace_back(name, tensor);
  save_safetensors(path, entries);
}

TEST(ParallelDecoderLayer, AMissingOrMisshapenTensorIsTheSameErrorOnEveryRank) {
  const auto& comm = world();
  const auto config = small_gpt2();
  const GPT2Model<float> model(config, {.seed = 9});
  using Layer = parallel::ParallelGPT2Block<float>;
  const auto missing = shared_path("dissect_tp_missing");
  const auto misshapen = shared_path("dissect_tp_misshapen");
  const auto good = shared_path("dissect_tp_good");
  if (comm.rank() == 0) {
    save_changed(missing, model, [](auto& matrices) {
      std::erase_if(matrices, [](const auto& entry) { return entry.first == "h.1.mlp.up.weight"; });
    });
    save_changed(misshapen, model, [](auto& matrices) {
      for (auto& [name, tensor] : matrices) {
        if (name == "h.1.attn.proj.weight") tensor = Tensor<float, 2>({16, 8});
      }
    });
    save_model(good, model);
  }
  barrier();
  {
    const SafetensorsFile file(missing);
    EXPECT_THROW_WITH(parallel::load_parallel_layer<Layer>(file, "h.1.", config, comm), Error,
                      "h.1.mlp.up.weight");
  }
  {
    const SafetensorsFile file(misshapen);
    EXPECT_THROW_WITH(parallel::load_parallel_layer<Layer>(file, "h.1.", config, comm), ShapeError,
                      "load_parallel_layer: tensor \"h.1.attn.proj.weight\" in " +
                          misshapen.string() + " has shape [16, 8], the config needs [16, 16]");
  }
  if (comm.size() >= 2) {
    // Only the last rank's file is bad: the others read theirs fine and still throw its error,
    // which names that rank.
    const SafetensorsFile file(comm.rank() == comm.size() - 1 ? misshapen : good);
    EXPECT_THROW_WITH(parallel::load_parallel_layer<Layer>(file, "h.1.", config, comm), ShapeError,
                      "load_parallel_layer: rank " + std::to_string(comm.size() - 1) +
                          ": tensor \"h.1.attn.proj.weight\"");
  }
  // A prefix that names no layer: every rank, the same Error.
  {
    const SafetensorsFile file(good);
    EXPECT_THROW_WITH(parallel::load_parallel_layer<Layer>(file, "h.7.", config, comm), Error,
                      "h.7.");
    // A sliding window the tensor-parallel attention would ignore: refused on every rank.
    auto windowed = config;
    windowed.sliding_window = 4;
    EXPECT_THROW_WITH(parallel::load_parallel_layer<Layer>(file, "h.1.", windowed, comm),
                      ConfigError,
                      "load_parallel_layer: config.sliding_window is 4; the tensor-parallel "
                      "layers have no window yet");
  }
  barrier();
  if (comm.rank() == 0) {
    for (const auto& path : {missing, misshapen, good}) std::filesystem::remove(path);
  }
}

}  // namespace test_parallel_decoder_layer
}  // namespace dissect::testing
