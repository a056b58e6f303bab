// dissect/io/model_file.hpp — a dissect model saved whole: its weights under their state_dict
// names and, in the file's __metadata__, what is needed to build it again.
//
// The metadata keys (values are strings, as safetensors requires):
//   "dissect.family"  "gpt2" or "llama"
//   "dissect.config"  the TransformerConfig as a JSON object (the field names of config.hpp)
//   "dissect.quantization"  which Linear layers are stored quantised (io/quantized_file.hpp)
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

#include "dissect/config.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/quantized_file.hpp"
#include "dissect/io/state_dict.hpp"
#include "dissect/models/decoder_model.hpp"

namespace dissect {

inline constexpr const char* family_key = "dissect.family";
inline constexpr const char* config_key = "dissect.config";

/// The config as JSON, field for field (unset optionals are left out).
nlohmann::json config_to_json(const TransformerConfig& config);

/// The config back from config_to_json's JSON. @throws ConfigError naming `source` and the
/// field for a missing or mistyped field or an enum name it does not know; as validate().
TransformerConfig config_from_json(const nlohmann::json& json, std::string_view source);

/// The family and config a file's metadata records, or nullopt when it records none.
/// @throws ConfigError naming the file if the keys are there but unreadable.
std::optional<HfConfig> model_config_of(const Checkpoint& checkpoint);

/// Writes `model`'s parameters and its family and config, plus `metadata`, to `path`
/// (atomically, as save_safetensors); quantised layers in their own format (quantized_file.hpp).
/// @throws as save_module.
template <class Model>
void save_model(const std::filesystem::path& path, const Model& model,
                std::map<std::string, std::string> metadata = {});

/// A model of type Model read from a file save_model wrote. @throws ConfigError if the file
/// records no config or another family; Error as load_state_dict (strict).
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
  TransformerConfig c = detail::read_sizes(
      r, {{"d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab", "context"},
          false});
  c.tied_embeddings = r.flag("tied_embeddings", true);
  c.positions = detail::enum_from<Positions>(r, "positions", dissect::detail::positions_names);
  c.norm = detail::enum_from<Norm>(r, "norm", dissect::detail::norm_names);
  c.bias = r.flag("bias", true);
  c.ffn = detail::enum_from<Ffn>(r, "ffn", dissect::detail::ffn_names);
  if (r.has("norm_eps")) c.norm_eps = r.number("norm_eps");
  c.rope_theta = r.number("rope_theta", 10000.0);
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

template <class Model>
void save_model(const std::filesystem::path& path, const Model& model,
                std::map<std::string, std::string> metadata) {
  metadata[family_key] = std::string(Model::style.family);
  metadata[config_key] = config_to_json(model.config()).dump();
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
  Model model(recorded->config, {.seed = 0});
  load_module_quantized(model, checkpoint);
  return model;
}

}  // namespace dissect
