// dissect/tensor/freezing.hpp — freeze, unfreeze and trainable_parameter_count, for any module.
//
// Freezing is PyTorch's requires_grad=False: a frozen layer keeps no gradient buffer and its
// parameters are visited with an empty gradient view (module.hpp), so optimizers skip them.
// freeze walks a composed module down to its layers (for_each_layer) and freezes each; what is
// left to train is counted by trainable_parameter_count.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "dissect/core/shape.hpp"
#include "dissect/tensor/module.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Σ of the element counts of the parameters that are not frozen (what an optimizer updates).
template <Module M>
index_t trainable_parameter_count(const M& module);

/// set_frozen(true / false) on every layer of `module`. unfreeze is all or nothing: if a layer
/// refuses (Linear::set_frozen(false) of a quantised or merged layer), every layer is left frozen
/// as it was and the layer's error propagates.
template <Module M>
void freeze(M& module);
template <Module M>
void unfreeze(M& module);

// ---- implementation -----------------------------------------------------------------------------

template <Module M>
index_t trainable_parameter_count(const M& module) {
  index_t count = 0;
  module.for_each_parameter([&](const ParameterName&, auto value, auto grad) {
    if (!is_frozen_parameter(value, grad)) {
      count = checked_add(count, value.size(), "trainable_parameter_count");
    }
  });
  return count;
}

template <Module M>
void freeze(M& module) {
  for_each_layer(module,
                 [](const std::string&, FreezableLayer auto& layer) { layer.set_frozen(true); });
}

template <Module M>
void unfreeze(M& module) {
  // All or nothing: a layer that refuses (a quantised one, or one with a merged LoRA adapter)
  // throws after the layers before it were unfrozen, and those are frozen again.
  std::vector<std::function<void()>> refreeze;
  try {
    for_each_layer(module, [&](const std::string&, FreezableLayer auto& layer) {
      const bool was_frozen = layer.frozen();
      layer.set_frozen(false);
      if (was_frozen) refreeze.emplace_back([&layer] { layer.set_frozen(true); });
    });
  } catch (...) {
    for (const auto& undo : refreeze) undo();
    throw;
  }
}

}  // namespace dissect
