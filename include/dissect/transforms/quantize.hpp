// dissect/transforms/quantize.hpp — quantising layers and whole models: every Linear<float> stores
// its weight in a low-precision format (quant/weight_format.hpp); embeddings, norms, biases and a
// head tied to the embedding stay in float, as llama.cpp and bitsandbytes leave them.
#pragma once

#include <string>
#include <vector>

#include "dissect/layers/linear.hpp"
#include "dissect/layers/quantized_linear.hpp"
#include "dissect/quant/weight_format.hpp"
#include "dissect/tensor/module.hpp"

namespace dissect {

/// A copy of `layer` whose weight is stored as `format` (frozen; see Linear::quantize).
/// @throws as Linear::quantize.
Linear<float> quantize(const Linear<float>& layer, WeightFormat format);

/// Quantises every Linear<float> of `model` (for_each_layer order) and returns their module
/// paths. All are quantised before any changes: a weight that cannot be quantised leaves the
/// model as it was and throws, naming the layer.
/// @throws Error (naming the layer) as QuantizedWeight::quantize, or if a layer already is.
template <Module M>
std::vector<std::string> quantize_model(M& model, WeightFormat format);

/// Σ weight_bytes() over the Linear<float> layers of `model`: the bytes one decoding step streams
/// for the projections.
template <Module M>
index_t linear_weight_bytes(const M& model);

// ---- implementation -----------------------------------------------------------------------------

inline Linear<float> quantize(const Linear<float>& layer, WeightFormat format) {
  Linear<float> copy = layer;
  copy.quantize(format);
  return copy;
}

template <Module M>
std::vector<std::string> quantize_model(M& model, WeightFormat format) {
  std::vector<std::string> paths;
  std::vector<std::pair<Linear<float>*, QuantizedWeight>> planned;
  for_each_layer(model, [&](const std::string& path, Linear<float>& layer) {
    try {
      if (layer.quantized()) throw Error("the layer is already quantised");
      planned.emplace_back(&layer, QuantizedWeight::quantize(layer.weight(), format));
    } catch (const ShapeError& error) {
      throw ShapeError(detail::concat("quantize_model: layer ", path, ": ", error.what()));
    } catch (const Error& error) {
      throw Error(detail::concat("quantize_model: layer ", path, ": ", error.what()));
    }
    paths.push_back(path);
  });
  for (auto& [layer, weight] : planned) layer->set_quantized_weight(std::move(weight));
  return paths;
}

template <Module M>
index_t linear_weight_bytes(const M& model) {
  index_t bytes = 0;
  for_each_layer(model, [&](const std::string&, const Linear<float>& layer) {
    bytes += layer.weight_bytes();
  });
  return bytes;
}

}  // namespace dissect
