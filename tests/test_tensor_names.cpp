// Tests of dissect/accounting/tensor_names.hpp, the one table of a decoder's tensor names: its
// dissect names are what each model's for_each_parameter visits, in that order; every family's
// Hugging Face and GGUF names map to dissect's and back through the readers and writers that
// read the table (io/hf_names.hpp, io/hf_writer.hpp, io/gguf_weights.hpp, io/gguf_model.hpp);
// no family names two tensors alike; and the accounting's matrix names are the table's.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dissect/accounting/model_shape.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/io/checkpoint_fit.hpp"
#include "dissect/io/gguf_model_writer.hpp"
#include "dissect/io/gguf_weights.hpp"
#include "dissect/io/hf_names.hpp"
#include "dissect/io/hf_writer.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/models/decoder_model.hpp"
#include "support/io_testing.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_tensor_names {

/// One model to check: its family's names, the ModelFamily its files carry and its config.
struct Case {
  const FamilyTensorNames* names;
  ModelFamily family;
  TransformerConfig config;
};

/// Every family, with a tied and an untied head and with and without biases where the family
/// allows both.
std::vector<Case> cases() {
  TransformerConfig gpt2_untied = testing::small_gpt2();
  gpt2_untied.tied_embeddings = false;
  TransformerConfig llama_tied = testing::small_llama();
  llama_tied.tied_embeddings = true;
  llama_tied.bias = true;
  TransformerConfig mistral = testing::small_llama();
  mistral.sliding_window = 4;
  return {{&gpt2_tensor_names, ModelFamily::gpt2, testing::small_gpt2()},
          {&gpt2_tensor_names, ModelFamily::gpt2, gpt2_untied},
          {&llama_tensor_names, ModelFamily::llama, testing::small_llama()},
          {&llama_tensor_names, ModelFamily::llama, llama_tied},
          {&mistral_tensor_names, ModelFamily::llama, mistral},
          {&mixtral_tensor_names, ModelFamily::mixtral, testing::small_mixtral()}};
}

std::string label(const Case& c) {
  return concat(c.names->family, c.config.tied_embeddings ? " tied" : " untied",
                c.config.bias ? " with biases" : "");
}

template <class Model>
std::vector<std::string> visited_names(const TransformerConfig& config) {
  const Model model(config, ModelOptions{});
  std::vector<std::string> names;
  model.for_each_parameter(
      [&](const ParameterName& name, auto, auto) { names.push_back(name.str()); });
  return names;
}

std::vector<std::string> visited_names(const Case& c) {
  switch (c.family) {
    case ModelFamily::gpt2:
      return visited_names<GPT2Model<float>>(c.config);
    case ModelFamily::llama:
      return visited_names<LlamaModel<float>>(c.config);
    case ModelFamily::mixtral:
      break;
  }
  return visited_names<MixtralModel<float>>(c.config);
}

std::vector<std::string> dissect_names(const std::vector<ParameterNames>& parameters) {
  std::vector<std::string> names;
  for (const ParameterNames& parameter : parameters) names.push_back(parameter.dissect);
  return names;
}

// ---- dissect's names ----------------------------------------------------------------------------

TEST(TensorNames, DissectNamesAreWhatEachModelVisitsInOrder) {
  for (const Case& c : cases()) {
    EXPECT_EQ(dissect_names(model_parameter_names(*c.names, c.config)), visited_names(c))
        << label(c);
  }
}

TEST(TensorNames, StylesAndFamiliesAgree) {
  for (const DecoderStyle* style : {&gpt2_style, &llama_style, &mixtral_style}) {
    const FamilyTensorNames& names = tensor_names_of(style->family);
    EXPECT_EQ(std::string_view(style->token_embedding), names.module(ModelTensor::token_embedding));
    EXPECT_EQ(std::string_view(style->head), names.module(ModelTensor::head));
    EXPECT_EQ(std::string_view(style->layers), names.layers);
    EXPECT_EQ(std::string_view(style->attention), names.attention);
    EXPECT_EQ(std::string_view(style->mlp), names.ffn);
    EXPECT_EQ(style->moe, names.find(ModelTensor::router) != nullptr);
  }
  EXPECT_EQ(tensor_names_of("mistral").tensors.data(), llama_tensor_names.tensors.data());
  EXPECT_THROW_WITH(tensor_names_of("mamba"), ConfigError,
                    "no family \"mamba\" (known: gpt2, llama, mistral, mixtral)");
}

TEST(TensorNames, NamesAreUniquePerFamily) {
  std::set<std::string_view> families;
  for (const FamilyTensorNames* names : tensor_name_families) {
    EXPECT_TRUE(families.insert(names->family).second) << names->family;
    std::set<ModelTensor> tensors;
    for (const TensorNames& row : names->tensors)
      EXPECT_TRUE(tensors.insert(row.tensor).second) << names->family;
    TransformerConfig config = names->find(ModelTensor::router) ? testing::small_mixtral()
                               : names == &gpt2_tensor_names    ? testing::small_gpt2()
                                                                : testing::small_llama();
    config.bias = true;  // every bias the table has
    std::set<std::string> dissect, hf;
    std::set<std::pair<std::string, index_t>> gguf;  // an expert: a slice of a stacked tensor
    for (const ParameterNames& parameter : model_parameter_names(*names, config)) {
      EXPECT_TRUE(dissect.insert(parameter.dissect).second) << parameter.dissect;
      for (const std::string& name : parameter.hf) EXPECT_TRUE(hf.insert(name).second) << name;
      for (const std::string& name : parameter.gguf)
        EXPECT_TRUE(gguf.insert({name, parameter.expert}).second) << name;
    }
  }
}

// ---- Hugging Face's names -----------------------------------------------------------------------

TEST(TensorNames, HuggingFaceNamesRoundTrip) {
  for (const Case& c : cases()) {
    for (const ParameterNames& parameter : model_parameter_names(*c.names, c.config)) {
      const HfTensorNames hf = dissect_to_hf_names(c.family, parameter.dissect);
      EXPECT_EQ(hf.names, parameter.hf) << label(c);
      EXPECT_EQ(hf.transpose, parameter.row->hf_transposed && !parameter.bias) << parameter.dissect;
      for (std::size_t part = 0; part < hf.names.size(); ++part) {
        const auto back = hf_to_dissect_name(c.family, hf.names[part], c.config.tied_embeddings);
        ASSERT_TRUE(back) << hf.names[part];
        EXPECT_EQ(back->name, parameter.dissect) << hf.names[part];
        EXPECT_EQ(back->transpose, hf.transpose) << hf.names[part];
        EXPECT_EQ(back->qkv_part, hf.names.size() > 1 ? static_cast<int>(part) : -1)
            << hf.names[part];
      }
    }
  }
}

template <class Model>
std::set<std::string> saved_hf_names(const TransformerConfig& config) {
  testing::TemporaryDirectory directory;
  save_hf_checkpoint(directory.path(), Model(config, ModelOptions{}));
  const SafetensorsFile file(directory.path() / "model.safetensors");
  const std::vector<std::string> names = file.tensor_names();
  return {names.begin(), names.end()};
}

TEST(TensorNames, SavedHuggingFaceCheckpointsHoldTheTablesNames) {
  for (const Case& c : cases()) {
    std::set<std::string> expected;
    for (const ParameterNames& parameter : model_parameter_names(*c.names, c.config))
      expected.insert(parameter.hf.begin(), parameter.hf.end());
    const std::set<std::string> saved =
        c.family == ModelFamily::gpt2    ? saved_hf_names<GPT2Model<float>>(c.config)
        : c.family == ModelFamily::llama ? saved_hf_names<LlamaModel<float>>(c.config)
                                         : saved_hf_names<MixtralModel<float>>(c.config);
    EXPECT_EQ(saved, expected) << label(c);
  }
}

TEST(TensorNames, HuggingFaceNamesOfEachFamily) {
  // The table's rows, spelled out once: a rename there must be a rename here.
  const auto hf = [](const FamilyTensorNames& names, ModelTensor tensor, TransformerConfig config) {
    for (const ParameterNames& parameter : model_parameter_names(names, config)) {
      if (parameter.row->tensor == tensor && !parameter.bias && parameter.layer <= 0 &&
          parameter.expert <= 0)
        return parameter.hf;
    }
    return std::vector<std::string>{};
  };
  TransformerConfig gpt2 = testing::small_gpt2();
  gpt2.tied_embeddings = false;
  EXPECT_EQ(hf(gpt2_tensor_names, ModelTensor::qkv, gpt2),
            std::vector<std::string>{"h.0.attn.c_attn.weight"});
  EXPECT_EQ(hf(gpt2_tensor_names, ModelTensor::ffn_down, gpt2),
            std::vector<std::string>{"h.0.mlp.c_proj.weight"});
  EXPECT_EQ(hf(gpt2_tensor_names, ModelTensor::head, gpt2),
            std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(hf(llama_tensor_names, ModelTensor::qkv, testing::small_llama()),
            (std::vector<std::string>{"model.layers.0.self_attn.q_proj.weight",
                                      "model.layers.0.self_attn.k_proj.weight",
                                      "model.layers.0.self_attn.v_proj.weight"}));
  EXPECT_EQ(hf(llama_tensor_names, ModelTensor::head, testing::small_llama()),
            std::vector<std::string>{"lm_head.weight"});
  EXPECT_EQ(hf(mixtral_tensor_names, ModelTensor::router, testing::small_mixtral()),
            std::vector<std::string>{"model.layers.0.block_sparse_moe.gate.weight"});
  EXPECT_EQ(hf(mixtral_tensor_names, ModelTensor::ffn_up, testing::small_mixtral()),
            std::vector<std::string>{"model.layers.0.block_sparse_moe.experts.0.w3.weight"});
}

// ---- llama.cpp's names --------------------------------------------------------------------------

TEST(TensorNames, GgufNamesRoundTrip) {
  for (const Case& c : cases()) {
    if (c.config.is_moe() || c.config.sliding_window) continue;  // GGUF has neither yet
    const HfConfig model{c.family, c.config};
    // What the reader expects of a file: every tensor once.
    std::map<std::string, int> expected;
    for (const GgufExpectedTensor& tensor : gguf_model_tensors(c.family, c.config))
      EXPECT_EQ(++expected[tensor.name], 1) << tensor.name;
    // What the reader and the writer map: each dissect parameter from the table's GGUF names.
    std::vector<std::string> sourced;
    std::map<std::string, std::string> dissect_of;
    for (const GgufTensorSource& source : gguf_tensor_sources(model)) {
      sourced.push_back(source.name);
      for (const GgufPart& part : source.parts) dissect_of[part.name] = source.name;
    }
    std::vector<std::string> expected_dissect;
    for (const ParameterNames& parameter : model_parameter_names(*c.names, c.config)) {
      // A LLaMA's biases have no tensor in dissect's GGUF (read_gguf_config reads none).
      if (parameter.bias && c.family == ModelFamily::llama) continue;
      expected_dissect.push_back(parameter.dissect);
      for (const std::string& name : parameter.gguf) {
        const auto found = dissect_of.find(name);
        EXPECT_TRUE(found != dissect_of.end() && found->second == parameter.dissect) << name;
        EXPECT_EQ(expected.count(name), 1u) << name;
      }
    }
    EXPECT_EQ(sourced, expected_dissect) << label(c);
    EXPECT_EQ(dissect_of.size(), expected.size()) << label(c);
  }
}

TEST(TensorNames, GgufNamesOfEachFamily) {
  TransformerConfig gpt2 = testing::small_gpt2();
  gpt2.tied_embeddings = false;
  std::vector<std::string> names;
  for (const GgufExpectedTensor& tensor : gguf_model_tensors(ModelFamily::gpt2, gpt2)) {
    if (!tensor.name.starts_with("blk.1.")) names.push_back(tensor.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{
                       "token_embd.weight", "position_embd.weight", "blk.0.attn_norm.weight",
                       "blk.0.attn_norm.bias", "blk.0.attn_qkv.weight", "blk.0.attn_qkv.bias",
                       "blk.0.attn_output.weight", "blk.0.attn_output.bias",
                       "blk.0.ffn_norm.weight", "blk.0.ffn_norm.bias", "blk.0.ffn_up.weight",
                       "blk.0.ffn_up.bias", "blk.0.ffn_down.weight", "blk.0.ffn_down.bias",
                       "output_norm.weight", "output_norm.bias", "output.weight"}));
  names.clear();
  for (const GgufExpectedTensor& tensor :
       gguf_model_tensors(ModelFamily::llama, testing::small_llama())) {
    if (!tensor.name.starts_with("blk.1.")) names.push_back(tensor.name);
  }
  EXPECT_EQ(names, (std::vector<std::string>{
                       "token_embd.weight", "blk.0.attn_norm.weight", "blk.0.attn_q.weight",
                       "blk.0.attn_k.weight", "blk.0.attn_v.weight", "blk.0.attn_output.weight",
                       "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight",
                       "blk.0.ffn_down.weight", "output_norm.weight", "output.weight"}));
  // Mixtral's, as llama.cpp names them: one router and one tensor per projection stacking the
  // experts, in each block.
  std::set<std::string> mixtral;
  for (const ParameterNames& parameter :
       model_parameter_names(mixtral_tensor_names, testing::small_mixtral())) {
    if (parameter.layer == 0) mixtral.insert(parameter.gguf.begin(), parameter.gguf.end());
  }
  EXPECT_EQ(mixtral, (std::set<std::string>{
                         "blk.0.attn_norm.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight",
                         "blk.0.attn_v.weight", "blk.0.attn_output.weight", "blk.0.ffn_norm.weight",
                         "blk.0.ffn_gate_inp.weight", "blk.0.ffn_gate_exps.weight",
                         "blk.0.ffn_up_exps.weight", "blk.0.ffn_down_exps.weight"}));
  EXPECT_THROW_WITH(gguf_tensor_sources({ModelFamily::mixtral, testing::small_mixtral()}),
                    ConfigError, "gguf_tensor_sources: a mixture of experts (mixtral, 4 experts)");
}

/// `file` saved again at `path`, its block_count said to be 1000.
void save_with_1000_blocks(const GgufFile& file, const std::filesystem::path& path) {
  std::vector<std::pair<std::string, GgufValue>> metadata = file.metadata();
  for (auto& [key, value] : metadata) {
    if (key.ends_with(".block_count")) value = std::uint32_t{1000};
  }
  std::vector<GgufTensorEntry> entries;
  for (const GgufTensorInfo& info : file.tensors())
    entries.push_back({info.name, info.type, info.dims, file.bytes(info.name)});
  save_gguf(path, metadata, entries);
}

TEST(TensorNames, GgufBlockSizesComeFromTheTable) {
  // A block_count beyond the file's tensors is refused naming how many tensors a block holds.
  testing::TemporaryDirectory directory;
  save_gguf_model(directory / "gpt2.gguf", GPT2Model<float>(testing::small_gpt2(), {}));
  save_gguf_model(directory / "llama.gguf", LlamaModel<float>(testing::small_llama(), {}));
  for (const auto& [family, per_block] : {std::pair{"gpt2", 12}, std::pair{"llama", 9}}) {
    save_with_1000_blocks(GgufFile(directory / concat(family, ".gguf")), directory / "bad.gguf");
    EXPECT_THROW_WITH(read_gguf_config(GgufFile(directory / "bad.gguf")), FormatError,
                      concat("(", family, " blocks hold ", per_block, " each)"));
  }
}

// ---- the accounting's matrices ------------------------------------------------------------------

TEST(TensorNames, MatrixNamesAreTheTables) {
  for (const Case& c : cases()) {
    const DecoderStyle& style = style_of(c.family);
    const std::vector<std::string> visited = visited_names(c);
    for (const WeightMatrix& matrix : weight_matrices(c.config)) {
      const ModelTensor tensor = tensor_of_matrix("test", matrix.name);
      EXPECT_EQ(matrix_name(tensor), matrix.name);
      // Its module holds a weight the model has (layer 0's, expert 0's).
      if (matrix.tied) continue;
      const std::string weight = module_path_of(style, matrix.name) + ".weight";
      EXPECT_NE(std::find(visited.begin(), visited.end(), weight), visited.end()) << weight;
    }
  }
  EXPECT_THROW_WITH(tensor_of_matrix("op", "attn.qkvx"), Error,
                    "op: \"attn.qkvx\" is not a matrix model_shape.hpp lists");
  EXPECT_THROW_WITH(module_path_of(llama_style, "embed.positions"), Error,
                    "module_path_of: LlamaModel has no matrix \"embed.positions\"");
}

}  // namespace test_tensor_names
}  // namespace dissect
