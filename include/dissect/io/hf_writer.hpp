// dissect/io/hf_writer.hpp — a GPT2Model or LlamaModel written as a Hugging Face checkpoint
// directory: config.json under transformers' keys and model.safetensors under Hugging Face's
// tensor names (hf_names.hpp's dissect_to_hf_names), which io/huggingface.hpp and
// transformers' from_pretrained both read.
//
//   dissect::save_hf_checkpoint("out-dir", model);  // out-dir/config.json, model.safetensors
//
// GPT-2's Conv1D weights are written [in, out] as transformers stores them, LLaMA's qkv split
// back into q_proj, k_proj and v_proj, and LLaMA's names get their "model." prefix. The tensors
// keep the model's scalar type (F32 for a float model) unless `dtype` says otherwise.
#pragma once

#include <array>
#include <filesystem>
#include <fstream>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dissect/accounting/tensor_names.hpp"
#include "dissect/core/error.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/hf_names.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/tensor/module.hpp"

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/io/detail/atomic_file.hpp"

namespace dissect {

/// `model` as a config.json object that parse_hf_config reads back to the same config.
/// A LLaMA with a sliding window is written as "mistral".
/// @throws ConfigError for a config transformers' GPT2Config or LlamaConfig cannot say (a GPT-2
///         with a scale other than 1/√d_k or 1, with gated FFN or a sliding window; a LLaMA with
///         score scaling, or with both a window and biases).
inline nlohmann::json hf_config_json(const HfConfig& model) {
  const TransformerConfig& c = model.config;
  const detail::SizeKeys& keys = detail::hf_size_keys(model.family);
  // A LLaMA with a sliding window is Mistral (MistralConfig: LlamaConfig's keys + sliding_window).
  const bool mistral = model.family == ModelFamily::llama && c.sliding_window;
  nlohmann::json json = {
      {"model_type", mistral ? std::string("mistral") : std::string(family_name(model.family))}};
  using Size = detail::SizeKeys::Size;
  json[keys[Size::d_model]] = c.d_model;
  json[keys[Size::n_layers]] = c.n_layers;
  json[keys[Size::n_heads]] = c.n_heads;
  if (keys[Size::n_kv_heads]) json[keys[Size::n_kv_heads]] = c.kv_heads();
  if (keys[Size::head_dim] && c.head_dim) json[keys[Size::head_dim]] = *c.head_dim;
  json[keys[Size::d_ff]] = c.d_ff;
  json[keys[Size::vocab]] = c.vocab;
  json[keys[Size::context]] = c.context;
  json["tie_word_embeddings"] = c.tied_embeddings;
  if (model.family == ModelFamily::gpt2) {
    if (c.score_scaling.scale && *c.score_scaling.scale != 1.0) {
      throw ConfigError(concat("hf_config_json: a score scale of ", *c.score_scaling.scale,
                               " has no GPT2Config key (1/sqrt(d_k) or 1 only)"));
    }
    json["layer_norm_epsilon"] = c.norm_eps.value_or(1e-5);
    json["activation_function"] = "gelu_new";
    json["scale_attn_weights"] = !c.score_scaling.scale.has_value();
    json["scale_attn_by_inverse_layer_idx"] = c.score_scaling.inverse_layer_index;
    if (c.sliding_window) {
      throw ConfigError("hf_config_json: GPT2Config has no key for a sliding window");
    }
  } else {
    if (c.score_scaling != ScoreScaling{}) {
      throw ConfigError("hf_config_json: LlamaConfig has no key for score scaling");
    }
    json["rms_norm_eps"] = c.norm_eps.value_or(1e-6);
    json["rope_theta"] = c.rope_theta;
    json["attention_bias"] = c.bias;
    json["mlp_bias"] = c.bias;
    json["hidden_act"] = "silu";
    if (model.family == ModelFamily::mixtral) {
      json.erase("mlp_bias");  // MixtralConfig has no biases to set
      json.erase("attention_bias");
      json["num_local_experts"] = c.n_experts;
      json["num_experts_per_tok"] = c.experts_per_token;
      json["sliding_window"] = c.sliding_window ? nlohmann::json(*c.sliding_window) : nullptr;
    } else if (mistral) {
      if (c.bias) throw ConfigError("hf_config_json: MistralConfig has no key for biases");
      json.erase("mlp_bias");
      json.erase("attention_bias");
      json["sliding_window"] = *c.sliding_window;
    }
  }
  return json;
}

/// Writes `model` as `dir`/config.json and `dir`/model.safetensors (creating `dir`), each file
/// atomically.
/// @throws ConfigError as hf_config_json; Error for an I/O failure.
template <class Model>
void save_hf_checkpoint(const std::filesystem::path& dir, const Model& model,
                        std::optional<SaveDtype> dtype = std::nullopt) {
  const ModelFamily family = family_from_name(Model::style.family, "save_hf_checkpoint");
  const HfConfig config{family, model.config()};
  const std::string text = hf_config_json(config).dump(2) + "\n";
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw Error(concat("save_hf_checkpoint: cannot create ", dir.string(), ": ", error.message()));
  }

  using Scalar = typename Model::scalar_type;
  const std::array<index_t, 3> part_rows = qkv_part_rows(config.config);
  std::vector<SaveEntry> entries;
  std::vector<std::vector<Scalar>> transposed;  // GPT-2's Conv1D weights, alive until saved
  transposed.reserve(4 * static_cast<std::size_t>(config.config.n_layers));
  model.for_each_parameter([&](const ParameterName& parameter, auto value, auto) {
    HfTensorNames hf = dissect_to_hf_names(family, parameter.str());
    const std::vector<index_t> shape(value.shape().begin(), value.shape().end());
    const index_t row_length = shape.size() > 1 ? shape[1] : 1;
    if (hf.names.size() > 1) {
      // qkv: q_proj, k_proj and v_proj, its rows in that order.
      index_t first_row = 0;
      for (std::size_t part = 0; part < hf.names.size(); ++part) {
        std::vector<index_t> part_shape = shape;
        part_shape[0] = part_rows[part];
        entries.emplace_back(
            std::move(hf.names[part]), std::move(part_shape),
            std::span<const Scalar>(value.data() + first_row * row_length,
                                    static_cast<std::size_t>(part_rows[part] * row_length)),
            dtype);
        first_row += part_rows[part];
      }
      return;
    }
    if (hf.transpose && shape.size() == 2) {  // Conv1D: stored [in, out]
      std::vector<Scalar>& t = transposed.emplace_back(static_cast<std::size_t>(value.size()));
      for (index_t r = 0; r < shape[0]; ++r) {
        for (index_t k = 0; k < shape[1]; ++k) t[k * shape[0] + r] = value.data()[r * shape[1] + k];
      }
      entries.emplace_back(std::move(hf.names.front()), std::vector<index_t>{shape[1], shape[0]},
                           std::span<const Scalar>(t), dtype);
      return;
    }
    entries.emplace_back(
        std::move(hf.names.front()), shape,
        std::span<const Scalar>(value.data(), static_cast<std::size_t>(value.size())), dtype);
  });
  save_safetensors(dir / "model.safetensors", entries, {{"format", "pt"}});
  detail::write_file_atomically(dir / hf_config_file, "save_hf_checkpoint", [&](auto& writer) {
    writer.write(std::as_bytes(std::span<const char>(text.data(), text.size())));
  });
}

}  // namespace dissect
