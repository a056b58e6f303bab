// dissect/io/lora_file.hpp — LoRA adapters saved alone, as Hugging Face PEFT saves them.
//
// The file holds only A and B of every adapted Linear, under PEFT's names:
//   base_model.model.<module path>.lora_A.weight   [r, in]
//   base_model.model.<module path>.lora_B.weight   [out, r]
// where <module path> is the layer's path in dissect's state_dict ("h.0.attn.qkv"). Its
// __metadata__ carries, under "dissect.lora", the fields of PEFT's adapter_config.json that
// rebuild the adapters: {"peft_type": "LORA", "r", "lora_alpha", "target_modules": [paths],
// "alpha_pattern": {path: alpha}} (alpha_pattern lists the layers whose alpha differs from
// lora_alpha; each layer's rank is its A's row count). A few KB to MB instead of the model's GB:
// the base checkpoint is shipped once, adapters per task.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/error.hpp"
#include "dissect/io/detail/json.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/layers/lora_adapter.hpp"
#include "dissect/tensor/freezing.hpp"
#include "dissect/tensor/module.hpp"

namespace dissect {

inline constexpr const char* peft_prefix = "base_model.model.";
inline constexpr const char* lora_config_key = "dissect.lora";

/// Writes every adapter of `model` (and `metadata`) to `path`, atomically as save_safetensors.
/// @throws Error if the model has no adapter; as save_safetensors.
template <Module M>
void save_adapters(const std::filesystem::path& path, const M& model,
                   std::map<std::string, std::string> metadata = {});

/// Reads the adapters of a file save_adapters wrote (or PEFT wrote, for the same module paths)
/// into `model`: a layer that has no adapter gets one of the file's rank and alpha (the model
/// is frozen first, as apply_lora does); one that has must have the same rank and alpha. Returns
/// the adapted paths. Strict: every lora tensor of the file must land. Into a merged adapter it
/// works too: the layer remembers what it merged (Linear::merge_adapter), so forward is that of
/// the loaded A and B, and unmerging restores the base.
/// @throws FormatError for missing or unreadable metadata; Error naming the tensors the model has
///         no Linear for, or a lora_A without its lora_B; ShapeError naming the tensor for a
///         shape or rank that does not fit; ConfigError for another alpha. All of these are found
///         before the model changes (a tensor of a dtype dissect cannot convert is found while
///         loading, after the layers have been adapted).
template <Module M>
std::vector<std::string> load_adapters(M& model, const SafetensorsFile& file);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
inline std::string lora_tensor_name(const std::string& path, const char* matrix) {
  return concat(peft_prefix, path, ".lora_", matrix, ".weight");
}

/// The "dissect.lora" config (PEFT's adapter_config fields, above) of every adapter of `model`,
/// or nullopt when it has none: what save_adapters and save_model record.
template <Module M>
std::optional<nlohmann::json> lora_config_of(const M& model) {
  using Scalar = typename M::scalar_type;
  nlohmann::json targets = nlohmann::json::array(), alpha_pattern = nlohmann::json::object();
  std::optional<double> alpha;
  std::optional<index_t> rank;
  for_each_layer(model, [&](const std::string& layer_path, const Linear<Scalar>& layer) {
    if (!layer.has_adapter()) return;
    const LoRAAdapter<Scalar>& adapter = layer.adapter();
    targets.push_back(layer_path);
    if (!alpha) alpha = adapter.alpha(), rank = adapter.rank();
    if (adapter.alpha() != *alpha) alpha_pattern[layer_path] = adapter.alpha();
  });
  if (!alpha) return std::nullopt;
  return nlohmann::json{{"peft_type", "LORA"},
                        {"r", *rank},
                        {"lora_alpha", *alpha},
                        {"target_modules", targets},
                        {"alpha_pattern", alpha_pattern}};
}

/// The alpha such a config gives layer `path`. @throws FormatError naming `where`.
inline double lora_alpha_in(const nlohmann::json& config, const std::string& path,
                            const std::string& where) {
  const nlohmann::json* value = &config;
  if (config.contains("alpha_pattern") && config["alpha_pattern"].contains(path)) {
    value = &config["alpha_pattern"][path];
  } else if (config.contains("lora_alpha")) {
    value = &config["lora_alpha"];
  } else {
    throw FormatError(concat(where, ": ", lora_config_key, " has no lora_alpha"));
  }
  if (!value->is_number()) {
    throw FormatError(
        concat(where, ": lora_alpha of ", path, " is ", describe_json(*value), ", not a number"));
  }
  return value->get<double>();
}
}  // namespace detail

template <Module M>
void save_adapters(const std::filesystem::path& path, const M& model,
                   std::map<std::string, std::string> metadata) {
  using Scalar = typename M::scalar_type;
  std::vector<SaveEntry> entries;
  for_each_layer(model, [&](const std::string& layer_path, const Linear<Scalar>& layer) {
    if (!layer.has_adapter()) return;
    entries.emplace_back(detail::lora_tensor_name(layer_path, "A"), layer.adapter().A());
    entries.emplace_back(detail::lora_tensor_name(layer_path, "B"), layer.adapter().B());
  });
  const std::optional<nlohmann::json> config = detail::lora_config_of(model);
  if (!config) {
    throw Error(
        detail::concat("save_adapters: the model has no LoRA adapter to save to ", path.string()));
  }
  metadata[lora_config_key] = config->dump();
  save_safetensors(path, entries, metadata);
}

template <Module M>
std::vector<std::string> load_adapters(M& model, const SafetensorsFile& file) {
  using Scalar = typename M::scalar_type;
  const std::string where = detail::concat("load_adapters: ", file.path().string());
  const auto found = file.metadata().find(lora_config_key);
  if (found == file.metadata().end()) {
    throw FormatError(detail::concat(where, " has no \"", lora_config_key,
                                     "\" metadata (not written by save_adapters)"));
  }
  const nlohmann::json config =
      detail::parse_json_strictly(found->second, detail::concat(where, ": ", lora_config_key));
  const auto alpha_of = [&](const std::string& path) {
    return detail::lora_alpha_in(config, path, where);
  };

  // Everything is checked before anything changes: the plan first, then the loads.
  struct Planned {
    Linear<Scalar>* layer;
    std::string path;
    LoRAOptions options;
  };
  std::vector<Planned> plan;
  std::set<std::string> claimed;
  for_each_layer(model, [&](const std::string& path, Linear<Scalar>& layer) {
    const std::string a = detail::lora_tensor_name(path, "A"),
                      b = detail::lora_tensor_name(path, "B");
    if (!file.contains(a) && !file.contains(b)) return;
    if (!file.contains(a) || !file.contains(b)) {
      throw Error(detail::concat(where, ": ", file.contains(a) ? a : b, " has no ",
                                 file.contains(a) ? "lora_B" : "lora_A", " partner"));
    }
    const TensorInfo& info_a = file.info(a);
    const TensorInfo& info_b = file.info(b);
    const index_t rank = info_a.shape.empty() ? 0 : info_a.shape[0];
    const std::vector<index_t> want_a{rank, layer.in_features()},
        want_b{layer.out_features(), rank};
    if (info_a.shape != want_a || info_b.shape != want_b) {
      throw ShapeError(detail::concat(where, ": ", a, " ", format_shape(info_a.shape), " and ", b,
                                      " ", format_shape(info_b.shape), " do not fit ", path,
                                      " (in ", layer.in_features(), ", out ", layer.out_features(),
                                      ")"));
    }
    const LoRAOptions options{.rank = rank, .alpha = alpha_of(path)};
    check_lora_options(where, options);
    if (layer.has_adapter() && layer.adapter().rank() != rank) {
      throw ShapeError(detail::concat(where, ": ", path, " carries an adapter of rank ",
                                      layer.adapter().rank(), ", the file's has rank ", rank));
    }
    if (layer.has_adapter() && layer.adapter().alpha() != options.alpha) {
      throw ConfigError(detail::concat(where, ": ", path, " carries an adapter of alpha ",
                                       layer.adapter().alpha(), ", the file's has alpha ",
                                       options.alpha));
    }
    plan.push_back({&layer, path, options});
    claimed.insert(a);
    claimed.insert(b);
  });
  std::vector<std::string> unclaimed;
  for (const std::string& name : file.tensor_names()) {
    if (!claimed.contains(name)) unclaimed.push_back(name);
  }
  if (!unclaimed.empty()) {
    std::string names;
    for (const std::string& name : unclaimed) names += (names.empty() ? "" : ", ") + name;
    throw Error(detail::concat(where, ": the model has no Linear layer for ", names));
  }
  if (plan.empty()) throw Error(detail::concat(where, " holds no adapter"));

  const bool attaching = std::any_of(plan.begin(), plan.end(),
                                     [](const Planned& p) { return !p.layer->has_adapter(); });
  if (attaching) freeze(model);
  std::vector<std::string> paths;
  for (const Planned& planned : plan) {
    if (!planned.layer->has_adapter()) planned.layer->attach_adapter(planned.options);
    LoRAAdapter<Scalar>& adapter = planned.layer->adapter();
    load_into(file, detail::lora_tensor_name(planned.path, "A"), adapter.A());
    load_into(file, detail::lora_tensor_name(planned.path, "B"), adapter.B());
    paths.push_back(planned.path);
  }
  return paths;
}

}  // namespace dissect
