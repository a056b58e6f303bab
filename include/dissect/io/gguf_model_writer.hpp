// dissect/io/gguf_model_writer.hpp — a GPT2Model or LlamaModel written as the GGUF file
// llama.cpp's converter would write for it: llama.cpp's keys and tensor names (the table of
// accounting/tensor_names.hpp, through gguf_weights.hpp's gguf_tensor_sources and gguf_model.hpp's
// gguf_model_tensors), LLaMA's q and k rows permuted into llama.cpp's interleaved
// RoPE order, the matrices in a ggml type of your choice and the norms and biases in F32 (as
// llama.cpp keeps them).
//
//   dissect::save_gguf_model("model.gguf", model);  // all F32
//   dissect::GgufModelOptions options;
//   options.type = dissect::GgmlType::q8_0;
//   dissect::save_gguf_model("model-q8_0.gguf", model, options);
//
// The tokenizer is the caller's: GgufModelOptions::tokenizer holds tokenizer.ggml.* entries to
// write (copied from another GGUF file, say). Without one the file says tokenizer.ggml.model
// "none" and <arch>.vocab_size, which llama.cpp loads as a model that takes token ids.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"
#include "dissect/io/gguf_weights.hpp"
#include "dissect/quant/ggml_blocks.hpp"

namespace dissect {

struct GgufModelOptions {
  GgmlType type = GgmlType::f32;  ///< of the 2-D weights; norms and biases stay F32
  std::string name = "dissect";   ///< general.name
  /// tokenizer.ggml.* (and any other) entries, written after the model's keys.
  std::vector<std::pair<std::string, GgufValue>> tokenizer;
};

/// The metadata save_gguf_model writes for `model`'s config before the tokenizer's entries.
inline std::vector<std::pair<std::string, GgufValue>> gguf_model_metadata(const HfConfig& model,
                                                                          const std::string& name) {
  const TransformerConfig& c = model.config;
  const std::string arch(family_name(model.family));
  const auto u32 = [](index_t value) { return GgufValue(static_cast<std::uint32_t>(value)); };
  std::vector<std::pair<std::string, GgufValue>> metadata{
      {"general.architecture", arch},
      {"general.name", name},
      {arch + ".context_length", u32(c.context)},
      {arch + ".embedding_length", u32(c.d_model)},
      {arch + ".block_count", u32(c.n_layers)},
      {arch + ".feed_forward_length", u32(c.d_ff)},
      {arch + ".attention.head_count", u32(c.n_heads)},
  };
  if (model.family == ModelFamily::llama) {
    metadata.push_back({"llama.attention.head_count_kv", u32(c.kv_heads())});
    if (c.head_size() * c.n_heads != c.d_model) {
      metadata.push_back({"llama.attention.key_length", u32(c.head_size())});
      metadata.push_back({"llama.attention.value_length", u32(c.head_size())});
    }
    metadata.push_back({"llama.rope.freq_base", static_cast<float>(c.rope_theta)});
    metadata.push_back(
        {"llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.norm_eps.value_or(1e-6))});
  } else {
    metadata.push_back(
        {"gpt2.attention.layer_norm_epsilon", static_cast<float>(c.norm_eps.value_or(1e-5))});
  }
  return metadata;
}

/// Writes `model` (a GPT2Model or LlamaModel) as a GGUF file at `path`.
/// @throws ConfigError for a mixture of experts (MixtralModel: not written yet) or a sliding
///         window (Mistral: llama's GGUF has no key for it); naming the tensor
/// when options.type's blocks do not divide its rows, or
///         a type dissect cannot encode; Error as save_gguf.
template <class Model>
void save_gguf_model(const std::filesystem::path& path, const Model& model,
                     const GgufModelOptions& options = {}) {
  const HfConfig config{family_from_name(Model::style.family, "save_gguf_model"), model.config()};
  const TransformerConfig& c = config.config;
  const std::string where = concat("save_gguf_model: ", path.string());
  if (c.is_moe()) {
    // llama.cpp stacks a layer's experts into 3-D ffn_{gate,up,down}_exps tensors with
    // ffn_gate_inp as the router; dissect's GGUF reader and writer know only 2-D dense layers.
    throw ConfigError(concat(where, ": a mixture of experts (", family_name(config.family), ", ",
                             c.n_experts,
                             " experts) cannot be written as GGUF yet; convert it to a Hugging "
                             "Face checkpoint or save_model instead"));
  }
  if (c.sliding_window) {
    // llama.cpp's llama architecture reads no window: the file would run another model past W.
    throw ConfigError(concat(where, ": a sliding window (W = ", *c.sliding_window,
                             ") has no key in GGUF's ", family_name(config.family),
                             " architecture; convert it to a Hugging Face checkpoint instead"));
  }
  if (!ggml_type_info(options.type).decoded_by_dissect) {
    throw ConfigError(concat(where, ": dissect does not encode ", ggml_type_name(options.type)));
  }

  // dissect's parameters as float rows, by name.
  std::map<std::string, std::vector<float>, std::less<>> values;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    std::vector<float>& out = values[name.str()];
    out.resize(static_cast<std::size_t>(value.size()));
    const auto* data = value.data();
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(data[i]);
  });

  // Each GGUF tensor's floats, from its dissect parameter's rows (q and k rows permuted back into
  // llama.cpp's order: file row 2i + j of a head is dissect row j·d_k/2 + i).
  std::map<std::string, std::pair<const std::vector<float>*, GgufPart>, std::less<>> source_of;
  for (const GgufTensorSource& source : gguf_tensor_sources(config)) {
    const auto found = values.find(source.name);
    if (found == values.end()) throw Error(concat(where, ": the model has no ", source.name));
    for (const GgufPart& part : source.parts) source_of[part.name] = {&found->second, part};
  }
  std::vector<std::vector<std::byte>> stored;
  std::vector<GgufTensorEntry> entries;
  const std::vector<GgufExpectedTensor> tensors = gguf_model_tensors(config.family, c);
  stored.reserve(tensors.size());
  for (const GgufExpectedTensor& tensor : tensors) {
    const auto& [from, part] = source_of.at(tensor.name);
    const index_t row_length = tensor.dims[0];
    const index_t rows = tensor.dims.size() > 1 ? tensor.dims[1] : 1;
    std::vector<float> floats(static_cast<std::size_t>(row_length * rows));
    const index_t head_rows = part.heads > 0 ? rows / part.heads : 0;
    for (index_t r = 0; r < rows; ++r) {
      // The inverse of detail::gguf_rotary_source_row: which dissect row lands at file row r.
      index_t dissect_row = r;
      if (head_rows > 0) {
        const index_t head = r / head_rows, within = r % head_rows, half = head_rows / 2;
        dissect_row = head * head_rows + (within % 2) * half + within / 2;
      }
      const float* row = from->data() + (part.first_row + dissect_row) * row_length;
      std::copy(row, row + row_length, floats.begin() + r * row_length);
    }
    const GgmlType type = tensor.dims.size() == 2 ? options.type : GgmlType::f32;
    if (row_length % ggml_type_info(type).block_elements != 0) {
      throw ConfigError(concat(where, ": ", tensor.name, "'s rows of ", row_length,
                               " are not whole blocks of ", ggml_type_name(type), " (",
                               ggml_type_info(type).block_elements, " values)"));
    }
    stored.push_back(quantize_ggml(type, floats));
    entries.push_back({tensor.name, type, tensor.dims, stored.back()});
  }

  std::vector<std::pair<std::string, GgufValue>> metadata =
      gguf_model_metadata(config, options.name);
  if (options.tokenizer.empty()) {
    metadata.push_back({"tokenizer.ggml.model", "none"});
    metadata.push_back(
        {concat(family_name(config.family), ".vocab_size"), static_cast<std::uint32_t>(c.vocab)});
  }
  metadata.insert(metadata.end(), options.tokenizer.begin(), options.tokenizer.end());
  save_gguf(path, metadata, entries);
}

}  // namespace dissect
