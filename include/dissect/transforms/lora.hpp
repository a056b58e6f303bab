// dissect/transforms/lora.hpp — LoRA over a whole model: apply_lora, merge_adapters,
// unmerge_adapters.
//
// apply_lora changes no type: it freezes every parameter and attaches adapters to the Linear
// layers whose names match PEFT-style target_modules (Linear carries the adapter, linear.hpp). An
// optimizer built over the model then sees the adapters only, because frozen parameters have no
// gradient (module.hpp). The single-layer module is LoRALinear (lora_linear.hpp).
#pragma once

#include <cstdint>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/layers/lora_adapter.hpp"
#include "dissect/tensor/freezing.hpp"
#include "dissect/tensor/module.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Which Linear layers of a model apply_lora adapts: PEFT's target_modules. A layer matches if
/// its module path equals an entry or ends with "." + the entry ("qkv" matches "h.0.attn.qkv",
/// "attn.proj" matches "h.3.attn.proj"), or, when target_pattern is set, if the whole path
/// matches that ECMAScript regular expression (PEFT's string form, re.fullmatch).
struct LoRAConfig {
  LoRAOptions adapter{};
  std::vector<std::string> target_modules{};
  std::string target_pattern{};
};

/// Freezes every parameter of `model` and attaches an adapter to each matching Linear (layer i
/// in visiting order gets seed + i when a seed is set). Returns the adapted layers' paths.
/// @throws ConfigError if the config names no target, or nothing matches (the message lists the
///         model's Linear layers), or for bad options; Error if a layer already has an adapter.
template <Module M>
std::vector<std::string> apply_lora(M& model, const LoRAConfig& config);

/// Merges (unmerges) every adapter of `model` into its layer's weight; returns how many.
template <Module M>
index_t merge_adapters(M& model);
template <Module M>
index_t unmerge_adapters(M& model);

/// Whether `path` is selected by config's target_modules or target_pattern.
bool lora_targets(const LoRAConfig& config, std::string_view path);

// ---- implementation -----------------------------------------------------------------------------

inline bool lora_targets(const LoRAConfig& config, std::string_view path) {
  if (!config.target_pattern.empty()) {
    return std::regex_match(path.begin(), path.end(), std::regex(config.target_pattern));
  }
  for (const std::string& target : config.target_modules) {
    if (path == target) return true;
    if (path.size() > target.size() && path.ends_with(target) &&
        path[path.size() - target.size() - 1] == '.') {
      return true;
    }
  }
  return false;
}

template <Module M>
std::vector<std::string> apply_lora(M& model, const LoRAConfig& config) {
  check_lora_options("apply_lora", config.adapter);
  if (config.target_modules.empty() && config.target_pattern.empty()) {
    throw ConfigError("apply_lora: LoRAConfig names no target_modules and no target_pattern");
  }
  if (!config.target_pattern.empty()) {
    try {
      std::regex{config.target_pattern};
    } catch (const std::regex_error& error) {
      throw ConfigError(detail::concat("apply_lora: target_pattern \"", config.target_pattern,
                                       "\" is not a regular expression: ", error.what()));
    }
  }
  using Scalar = typename M::scalar_type;
  std::vector<std::string> adapted, linear_layers;
  for_each_layer(model, [&](const std::string& path, Linear<Scalar>&) {
    linear_layers.push_back(path);
    if (lora_targets(config, path)) adapted.push_back(path);
  });
  if (adapted.empty()) {
    std::string names;
    for (const std::string& name : linear_layers) names += (names.empty() ? "" : ", ") + name;
    throw ConfigError(
        detail::concat("apply_lora: no Linear layer matches the targets; the model's "
                       "Linear layers are: ",
                       names.empty() ? "(none)" : names));
  }
  freeze(model);
  std::uint64_t index = 0;
  for_each_layer(model, [&](const std::string& path, Linear<Scalar>& layer) {
    if (!lora_targets(config, path)) return;
    LoRAOptions options = config.adapter;
    if (options.seed) options.seed = *options.seed + index;
    ++index;
    layer.attach_adapter(options);
  });
  return adapted;
}

namespace detail {
template <Module M, class Change>
index_t change_adapters(M& model, Change change) {
  index_t count = 0;
  for_each_layer(model, [&](const std::string&, Linear<typename M::scalar_type>& layer) {
    if (!layer.has_adapter()) return;
    change(layer);
    ++count;
  });
  return count;
}
}  // namespace detail

template <Module M>
index_t merge_adapters(M& model) {
  return detail::change_adapters(model, [](auto& layer) { layer.merge_adapter(); });
}

template <Module M>
index_t unmerge_adapters(M& model) {
  return detail::change_adapters(model, [](auto& layer) { layer.unmerge_adapter(); });
}

}  // namespace dissect
