// dissect/transforms/bitlinear.hpp — BitNet b1.58 training over a whole model: use_bitlinear puts
// its Linear layers in bitlinear mode (Linear::set_bitlinear), by name, as apply_lora adapts them.
//
// No type changes: every selected layer keeps its float master weight W (the optimizer's, the
// state dict's) and from then on multiplies Q(x)·Q(W)ᵀ (int8 tokens, ternary W) forward and
// passes gradients straight through both quantisers backward; quant/bitnet.hpp has the formulas,
// bit_linear.hpp the single-layer module. The layers run without BitLinear's own RMSNorm: a model
// keeps its own norms (a pre-norm block already normalises the inputs of qkv and of the FFN's
// first layers), and the sub-layer norms of BitNet's architecture before o_proj and down_proj
// would be a change of the model, not of its Linear layers. The head stays in float by default,
// as BitNet keeps it (the authors: sampling needs high-precision probabilities); embeddings and
// norms are not Linear layers and are never touched.
#pragma once

#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/layers/bit_linear.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/transforms/lora.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Which Linear layers use_bitlinear selects. A layer matches an entry as in LoRAConfig (its path
/// equals it or ends with "." + it), or the whole path matches target_pattern (ECMAScript). With
/// neither set, every Linear matches. A layer that matches exclude_modules is left alone.
struct BitLinearConfig {
  std::vector<std::string> target_modules{};
  std::string target_pattern{};
  std::vector<std::string> exclude_modules{"lm_head"};
};

/// Puts every selected Linear of `model` in bitlinear mode and returns their paths, in
/// for_each_layer order. Each layer is checked before any changes: on a throw nothing changed.
/// @throws ConfigError for a target_pattern that is not a regular expression, or if nothing is
///         selected (the message lists the model's Linear layers); Error naming the layer if one
///         is quantised, packed or carries a LoRA adapter.
template <Module M>
std::vector<std::string> use_bitlinear(M& model, const BitLinearConfig& config = {});

/// Turns bitlinear mode off in every Linear of `model` (W is the master weight, untouched);
/// returns how many were on.
template <Module M>
index_t remove_bitlinear(M& model);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
inline bool bitlinear_selects(const BitLinearConfig& config, std::string_view path) {
  if (lora_targets(LoRAConfig{.target_modules = config.exclude_modules}, path)) return false;
  if (config.target_modules.empty() && config.target_pattern.empty()) return true;
  return lora_targets(
      LoRAConfig{.target_modules = config.target_modules, .target_pattern = config.target_pattern},
      path);
}
}  // namespace detail

template <Module M>
std::vector<std::string> use_bitlinear(M& model, const BitLinearConfig& config) {
  if (!config.target_pattern.empty()) {
    try {
      std::regex{config.target_pattern};
    } catch (const std::regex_error& error) {
      throw ConfigError(detail::concat("use_bitlinear: target_pattern \"", config.target_pattern,
                                       "\" is not a regular expression: ", error.what()));
    }
  }
  using Scalar = typename M::scalar_type;
  std::vector<std::string> selected, linear_layers;
  std::vector<Linear<Scalar>*> layers;
  for_each_layer(model, [&](const std::string& path, Linear<Scalar>& layer) {
    linear_layers.push_back(path);
    if (!detail::bitlinear_selects(config, path)) return;
    const char* refusal = layer.quantized()     ? "is quantised; dequantize() it first"
                          : layer.packed()      ? "is packed; unpack() it first"
                          : layer.has_adapter() ? "carries a LoRA adapter; detach it first"
                                                : nullptr;
    if (refusal) throw Error(detail::concat("use_bitlinear: layer ", path, " ", refusal));
    selected.push_back(path);
    layers.push_back(&layer);
  });
  if (selected.empty()) {
    std::string names;
    for (const std::string& name : linear_layers) names += (names.empty() ? "" : ", ") + name;
    throw ConfigError(
        detail::concat("use_bitlinear: no Linear layer is selected; the model's "
                       "Linear layers are: ",
                       names.empty() ? "(none)" : names));
  }
  for (Linear<Scalar>* layer : layers) layer->set_bitlinear(true);
  return selected;
}

template <Module M>
index_t remove_bitlinear(M& model) {
  index_t count = 0;
  for_each_layer(model, [&](const std::string&, Linear<typename M::scalar_type>& layer) {
    if (!layer.bitlinear()) return;
    layer.set_bitlinear(false);
    ++count;
  });
  return count;
}

}  // namespace dissect
