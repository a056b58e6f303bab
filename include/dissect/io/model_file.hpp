// dissect/io/model_file.hpp — a dissect model saved whole: its weights under their state_dict
// names and, in the file's __metadata__, what is needed to build it again.
//
// The metadata keys (values are strings, as safetensors requires):
//   "dissect.family"  "gpt2" or "llama"
//   "dissect.config"  the TransformerConfig as a JSON object (the field names of config.hpp)
//   "dissect.quantization"  which Linear layers are stored quantised (io/quantized_file.hpp)
//   "dissect.adapters"  the LoRA adapters the model carries, as save_adapters' "dissect.lora"
//                    (io/lora_file.hpp); their A and B are saved under the model's own names
//                    ("h.0.attn.qkv.lora_A.weight"), beside the base weights
// plus whatever the caller adds (a training run's character vocabulary, say). A file written by
// save_model is read back by load_model; `dissect inspect` and `dissect generate` read it too.
// io/open_model.hpp tells such a file (quantised or not) from the other kinds of checkpoint.
#pragma once

#include <nlohmann/json.hpp>

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "dissect/accounting/config.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/checkpoint_fit.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/lora_file.hpp"
#include "dissect/io/quantized_file.hpp"
#include "dissect/io/state_dict.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/tensor/freezing.hpp"

namespace dissect {

inline constexpr const char* family_key = "dissect.family";
inline constexpr const char* config_key = "dissect.config";
/// Not "dissect.lora": a file with that key is an adapter file (open_model.hpp).
inline constexpr const char* model_adapters_key = "dissect.adapters";

/// The config as JSON, field for field (unset optionals are left out, and so is a default
/// score_scaling: {"scale": 1, "inverse_layer_index": true} only when set, so files of models
/// without one are as they were).
nlohmann::json config_to_json(const TransformerConfig& config);

/// The config back from config_to_json's JSON. @throws ConfigError naming `source` and the
/// field for a missing or mistyped field or an enum name it does not know; as validate().
TransformerConfig config_from_json(const nlohmann::json& json, std::string_view source);

/// The family and config a file's metadata records, or nullopt when it records none.
/// @throws ConfigError naming the file if the keys are there but unreadable.
std::optional<HfConfig> model_config_of(const Checkpoint& checkpoint);

/// Writes `model`'s parameters and its family and config, plus `metadata`, to `path`
/// (atomically, as save_safetensors); quantised layers in their own format (quantized_file.hpp),
/// LoRA adapters (QLoRA's too) with their rank and alpha, so that load_model builds them again.
/// @throws Error naming the layer, before anything is written, if an adapter is merged (its
///         base weight is not in memory: unmerge_adapters to save base and adapters,
///         detach_adapter to save the merged weight alone, or save_adapters for the adapters
///         alone); as save_module.
template <class Model>
void save_model(const std::filesystem::path& path, const Model& model,
                std::map<std::string, std::string> metadata = {});

/// A model of type Model read from a file save_model wrote; the layers the file records LoRA
/// adapters for get them back (and the model is frozen, as apply_lora freezes it).
/// @throws ConfigError if the file records no config or another family; FormatError naming the
///         file for adapters it records but does not hold, or for layers the model lacks; Error
///         as load_state_dict (strict).
template <class Model>
Model load_model(const Checkpoint& checkpoint);

// ---- implementation -----------------------------------------------------------------------------

inline nlohmann::json config_to_json(const TransformerConfig& c) {
  nlohmann::json json = {{"d_model", c.d_model},
                         {"n_layers", c.n_layers},
                         {"n_heads", c.n_heads},
                         {"d_ff", c.d_ff},
                         {"vocab", c.vocab},
                         {"context", c.context},
                         {"tied_embeddings", c.tied_embeddings},
                         {"positions", positions_name(c.positions)},
                         {"norm", norm_name(c.norm)},
                         {"bias", c.bias},
                         {"ffn", ffn_name(c.ffn)},
                         {"rope_theta", c.rope_theta}};
  if (c.n_kv_heads) json["n_kv_heads"] = *c.n_kv_heads;
  if (c.head_dim) json["head_dim"] = *c.head_dim;
  if (c.norm_eps) json["norm_eps"] = *c.norm_eps;
  if (c.is_moe()) {
    json["n_experts"] = c.n_experts;
    json["experts_per_token"] = c.experts_per_token;
  }
  if (c.sliding_window) json["sliding_window"] = *c.sliding_window;
  if (!c.score_scaling.is_default()) {
    nlohmann::json scaling = {{"inverse_layer_index", c.score_scaling.inverse_layer_index}};
    if (c.score_scaling.scale) scaling["scale"] = *c.score_scaling.scale;
    json["score_scaling"] = scaling;
  }
  return json;
}

namespace detail {
template <class Enum, std::size_t N>
Enum enum_from(const ConfigReader& reader, const char* key,
               const std::array<std::string_view, N>& names) {
  const std::string text = reader.text(key, "");
  for (std::size_t i = 0; i < N; ++i) {
    if (names[i] == text) return static_cast<Enum>(i);
  }
  reader.fail(key, "is not a known value", reader.value(key));
}
}  // namespace detail

inline TransformerConfig config_from_json(const nlohmann::json& json, std::string_view source) {
  if (!json.is_object()) {
    throw ConfigError(dissect::detail::concat(source, ": the config must be a JSON object"));
  }
  const detail::ConfigReader r(json, source);
  TransformerConfig c = detail::read_sizes(r, detail::dissect_size_keys);
  c.tied_embeddings = r.flag("tied_embeddings", true);
  c.positions = detail::enum_from<Positions>(r, "positions", dissect::detail::positions_names);
  c.norm = detail::enum_from<Norm>(r, "norm", dissect::detail::norm_names);
  c.bias = r.flag("bias", true);
  c.ffn = detail::enum_from<Ffn>(r, "ffn", dissect::detail::ffn_names);
  if (r.has("norm_eps")) c.norm_eps = r.number("norm_eps");
  c.rope_theta = r.number("rope_theta", 10000.0);
  if (r.has("n_experts")) {
    c.n_experts = r.count("n_experts");
    c.experts_per_token = r.count("experts_per_token");
  }
  c.sliding_window = r.optional_count("sliding_window");
  if (r.has("score_scaling")) {
    const auto& scaling = r.value("score_scaling");
    if (!scaling.is_object()) r.fail("score_scaling", "must be a JSON object", scaling);
    const std::string where = dissect::detail::concat(source, " score_scaling");
    const detail::ConfigReader s(scaling, where);
    if (s.has("scale")) c.score_scaling.scale = s.number("scale");
    c.score_scaling.inverse_layer_index = s.flag("inverse_layer_index", false);
  }
  try {
    c.validate();
  } catch (const ConfigError& error) {
    throw ConfigError(dissect::detail::concat(source, ": ", error.what()));
  }
  return c;
}

inline std::optional<HfConfig> model_config_of(const Checkpoint& checkpoint) {
  const auto& metadata = checkpoint.metadata();
  const auto family = metadata.find(family_key);
  const auto config = metadata.find(config_key);
  if (family == metadata.end() && config == metadata.end()) return std::nullopt;
  const std::string source = dissect::detail::concat(checkpoint.path().string(), " metadata");
  if (family == metadata.end() || config == metadata.end()) {
    throw ConfigError(dissect::detail::concat(source, ": \"", family_key, "\" and \"", config_key,
                                              "\" come together"));
  }
  HfConfig result{family_from_name(family->second, source), {}};
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(config->second);
  } catch (const nlohmann::json::exception& error) {
    throw ConfigError(
        dissect::detail::concat(source, ": \"", config_key, "\" is not JSON (", error.what(), ")"));
  }
  result.config = config_from_json(json, source);
  return result;
}

namespace detail {

/// Attaches to `model` the adapters `checkpoint`'s metadata records (model_adapters_key), each
/// of the rank of its stored lora_A and the recorded alpha, freezing the model first; nothing
/// when it records none. Every adapter is checked before the model changes.
template <class Model>
void attach_recorded_adapters(Model& model, const Checkpoint& checkpoint) {
  using Scalar = typename Model::scalar_type;
  const auto found = checkpoint.metadata().find(model_adapters_key);
  if (found == checkpoint.metadata().end()) return;
  const std::string where = concat("load_model: ", checkpoint.path().string());
  const nlohmann::json config =
      parse_json_strictly(found->second, concat(where, ": metadata \"", model_adapters_key, "\""));
  if (!config.is_object() || !config.contains("target_modules") ||
      !config["target_modules"].is_array()) {
    throw FormatError(
        concat(where, ": metadata \"", model_adapters_key, "\" has no \"target_modules\" list"));
  }
  std::set<std::string> targets;
  for (const auto& target : config["target_modules"]) {
    if (!target.is_string()) {
      throw FormatError(
          concat(where, ": a target module is ", describe_json(target), ", not a layer path"));
    }
    targets.insert(target.get<std::string>());
  }
  std::vector<std::pair<Linear<Scalar>*, LoRAOptions>> plan;
  for_each_layer(model, [&](const std::string& path, Linear<Scalar>& layer) {
    if (!targets.erase(path)) return;
    const std::string a = concat(path.empty() ? "" : path + ".", "lora_A.weight");
    if (!checkpoint.contains(a)) {
      throw FormatError(concat(where, " records an adapter on ", path, " but holds no ", a));
    }
    const TensorInfo& info = checkpoint.info(a);
    if (info.shape.size() != 2) {
      throw FormatError(concat(where, ": ", a, " has shape ", format_shape(info.shape),
                               ", not [rank, in_features]"));
    }
    const LoRAOptions options{.rank = info.shape[0], .alpha = lora_alpha_in(config, path, where)};
    check_lora_options(where, options);
    plan.emplace_back(&layer, options);
  });
  if (!targets.empty()) {
    throw FormatError(concat(where, " records an adapter on ", *targets.begin(),
                             ", which the model does not have as a Linear layer"));
  }
  freeze(model);
  for (auto& [layer, options] : plan) layer->attach_adapter(options);
}

}  // namespace detail

template <class Model>
void save_model(const std::filesystem::path& path, const Model& model,
                std::map<std::string, std::string> metadata) {
  using Scalar = typename Model::scalar_type;
  for_each_layer(model, [&](const std::string& layer_path, const Linear<Scalar>& layer) {
    if (!layer.adapter_merged()) return;
    throw Error(dissect::detail::concat(
        "save_model: ", path.string(), ": the LoRA adapter of ", layer_path,
        " is merged into its weight, whose base is not kept; unmerge_adapters(model) to save the "
        "base and its adapters, detach_adapter() each to save the merged weights alone "
        "(merge_and_unload), or save_adapters for the adapters alone"));
  });
  metadata[family_key] = std::string(Model::style.family);
  metadata[config_key] = config_to_json(model.config()).dump();
  if (const auto adapters = detail::lora_config_of(model)) {
    metadata[model_adapters_key] = adapters->dump();
  } else {
    metadata.erase(model_adapters_key);
  }
  save_module_quantized(path, model, metadata);
}

template <class Model>
Model load_model(const Checkpoint& checkpoint) {
  const auto recorded = model_config_of(checkpoint);
  if (!recorded) {
    throw ConfigError(dissect::detail::concat(checkpoint.path().string(),
                                              ": records no dissect model (no \"", config_key,
                                              "\" in its metadata)"));
  }
  require_family<Model>(recorded->family, checkpoint.path().string());
  // The config is checked against the weights' header before the model is allocated.
  check_checkpoint_fits(
      "load_model", *recorded, checkpoint,
      dissect::detail::concat(checkpoint.path().string(), " (metadata \"", config_key, "\")"),
      detail::dissect_size_keys);
  Model model = detail::model_to_load<Model>(recorded->config, ModelOptions{.seed = 0});
  detail::attach_recorded_adapters(model, checkpoint);
  load_module_quantized(model, checkpoint);
  return model;
}

}  // namespace dissect
