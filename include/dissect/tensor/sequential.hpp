// dissect/tensor/sequential.hpp — Sequential and Stack: modules made of layers applied in order.
//
// Sequential<Layers...> is nn.Sequential over a fixed list of layer types; Stack<Layer> holds
// any number of one type (a model's h.0 … h.N, an MLP of runtime depth). Both name parameters by
// position ("0.weight") and train through a reusable Cache: forward(x, cache) keeps each layer's
// output, backward(x, cache, dy) runs the layers' backwards in reverse.
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Layers applied in order, y = layers[n−1](…layers[0](x)), as nn.Sequential: parameters are
/// named by position ("0.weight", "2.bias"; stateless layers take a position but no names).
/// Every layer maps [..., features] to [..., features'] at the same rank; Scalar comes from the
/// layers that have one (Linear<float>: float).
///
/// Training: forward(x, cache) keeps each layer's output (and each layer's own Cache, for blocks
/// that have one); backward(x, cache, dy) runs the layers' backwards in reverse. The cache's
/// buffers are reused across steps of the same shape: no allocation after the first step, for
/// layers with forward_into/backward_into.
template <class... Layers>
class Sequential;

/// Any number of layers of one type, applied in order: what a model's repeated blocks are
/// (GPT-2's h.0 … h.11) and what an MLP of runtime depth is. Parameters are named by position
/// ("0.weight", "1.weight", …); training works as Sequential's, with a Cache<Rank>.
template <class Layer>
class Stack;

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

template <class Layer>
concept HasScalar = requires {
  typename Layer::scalar_type;
};

template <class... Layers>
struct first_scalar {
  using type = void;
};
template <class First, class... Rest>
struct first_scalar<First, Rest...> {
  using type = typename first_scalar<Rest...>::type;
};
template <class First, class... Rest>
requires HasScalar<First>
struct first_scalar<First, Rest...> {
  using type = typename First::scalar_type;
};

/// What a layer keeps from forward for backward: its own Cache (FeedForward), its Cache<Rank>
/// (Sequential, Stack), or nothing (Linear, ReLU: they run from their input).
template <class Layer, std::size_t Rank>
struct layer_cache {
  struct type {};
};
template <class Layer, std::size_t Rank>
requires requires {
  typename Layer::Cache;
}
struct layer_cache<Layer, Rank> {
  using type = typename Layer::Cache;
};
template <class Layer, std::size_t Rank>
requires requires {
  typename Layer::template Cache<Rank>;
}
struct layer_cache<Layer, Rank> {
  using type = typename Layer::template Cache<Rank>;
};
template <class Layer, std::size_t Rank>
using layer_cache_t = typename layer_cache<Layer, Rank>::type;
template <class Layer, std::size_t Rank>
concept Cached = requires {
  typename Layer::Cache;
}
|| requires {
  typename Layer::template Cache<Rank>;
};

template <class Layer, class Scalar, std::size_t Rank>
concept ForwardsInto = requires(const Layer& layer, ConstTensorView<Scalar, Rank> x,
                                TensorView<Scalar, Rank> y, Shape<Rank> shape) {
  { layer.output_shape(shape) } -> std::same_as<Shape<Rank>>;
  layer.forward_into(x, y);
};
template <class Layer, class Scalar, std::size_t Rank>
concept BackwardsInto = requires(Layer& layer, ConstTensorView<Scalar, Rank> x,
                                 TensorView<Scalar, Rank> dx) {
  layer.backward_into(x, x, dx);
};
template <class Layer, class Scalar, std::size_t Rank>
concept HasBackwardParameters = requires(Layer& layer, ConstTensorView<Scalar, Rank> x,
                                         layer_cache_t<Layer, Rank>& cache) {
  layer.backward_parameters(x, x);
}
|| requires(Layer& layer, ConstTensorView<Scalar, Rank> x, layer_cache_t<Layer, Rank>& cache) {
  layer.backward_parameters(x, cache, x);
};

/// out = layer(x), keeping in `cache` what the layer's backward needs. The one way a container
/// (Sequential, Stack) runs a member forward: into its reused buffer when the layer can.
template <class Layer, class Scalar, std::size_t Rank>
void forward_layer(const Layer& layer, ConstTensorView<Scalar, Rank> x, Tensor<Scalar, Rank>& out,
                   layer_cache_t<Layer, Rank>& cache) {
  if constexpr (Cached<Layer, Rank>) {
    out = layer.forward(x, cache);
  } else if constexpr (ForwardsInto<Layer, Scalar, Rank>) {
    layer.forward_into(x, reuse_buffer(out, layer.output_shape(x.shape())));
  } else {
    out = layer.forward(x);
  }
}

/// The layer's backward from its input x and upstream dy: dx into `dx` (reused) — or, when
/// `input_grad` is false and the layer can skip it, only the parameter gradients (dx untouched).
template <bool input_grad, class Layer, class Scalar, std::size_t Rank>
void backward_layer(Layer& layer, ConstTensorView<Scalar, Rank> x,
                    layer_cache_t<Layer, Rank>& cache, ConstTensorView<Scalar, Rank> dy,
                    Tensor<Scalar, Rank>& dx) {
  if constexpr (!input_grad && HasBackwardParameters<Layer, Scalar, Rank>) {
    if constexpr (Cached<Layer, Rank>) {
      layer.backward_parameters(x, cache, dy);
    } else {
      layer.backward_parameters(x, dy);
    }
  } else if constexpr (Cached<Layer, Rank>) {
    dx = layer.backward(x, cache, dy);
  } else if constexpr (BackwardsInto<Layer, Scalar, Rank>) {
    layer.backward_into(x, dy, reuse_buffer(dx, x.shape()));
  } else {
    dx = layer.backward(x, dy);
  }
}

}  // namespace detail

template <class... Layers>
class Sequential : public ComposedModule<Sequential<Layers...>> {
  static_assert(sizeof...(Layers) >= 1, "dissect::Sequential needs at least one layer");

 public:
  using scalar_type = typename detail::first_scalar<Layers...>::type;
  static_assert(
      is_supported_scalar_v<scalar_type>,
      "dissect::Sequential: at least one layer must have a scalar_type (float or double)");
  static constexpr std::size_t size = sizeof...(Layers);

  /// What backward needs from forward(x, cache); reusable across steps.
  template <std::size_t Rank>
  struct Cache {
    std::array<Tensor<scalar_type, Rank>, size> outputs;  ///< each layer's output
    std::array<Tensor<scalar_type, Rank>, size> grads;    ///< backward's workspace
    std::tuple<detail::layer_cache_t<Layers, Rank>...> layers;
  };

  explicit Sequential(Layers... layers) : layers_(std::move(layers)...) {}

  /// Layer I, by position.
  template <std::size_t I>
  auto& get() {
    return std::get<I>(layers_);
  }
  template <std::size_t I>
  const auto& get() const {
    return std::get<I>(layers_);
  }

  /// x: [..., in] → y: [..., out] through every layer.
  template <TensorLike X>
  Tensor<scalar_type, rank_of<X>> forward(const X& x) const {
    return forward_impl<0>(const_view(x));
  }

  /// As forward, keeping what backward needs in `cache`.
  template <TensorLike X>
  Tensor<scalar_type, rank_of<X>> forward(const X& x, Cache<rank_of<X>>& cache) const {
    return forward_cached<0>(const_view(x), cache);
  }

  /// x and cache from forward(x, cache), dy: [..., out] → dx: [..., in]; every layer adds to its
  /// gradients. @throws ShapeError from the first layer that does not fit (layers after it in the
  /// backward order have already added their gradients: check shapes with forward first).
  template <TensorLike X, TensorLike DY>
  Tensor<scalar_type, rank_of<X>> backward(const X& x, Cache<rank_of<X>>& cache, const DY& dy) {
    return Tensor<scalar_type, rank_of<X>>(
        backward_from<size - 1, true>(const_view(x), cache, const_view(dy)));
  }

  /// As backward, without dx: the first layer adds only its parameter gradients (for a model's
  /// input layer, whose input needs no gradient).
  template <TensorLike X, TensorLike DY>
  void backward_parameters(const X& x, Cache<rank_of<X>>& cache, const DY& dy) {
    backward_from<size - 1, false>(const_view(x), cache, const_view(dy));
  }

  // for_each_parameter, zero_grad, parameter_count: from ComposedModule.

 private:
  friend class ComposedModule<Sequential>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_layers(self, visit, std::make_index_sequence<size>{});
  }
  template <class Self, class Visitor, std::size_t... I>
  static void visit_layers(Self& self, Visitor& visit, std::index_sequence<I...>) {
    (visit_child(index_name(I), std::get<I>(self.layers_), visit), ...);
  }

  template <std::size_t I, std::size_t Rank>
  Tensor<scalar_type, Rank> forward_impl(ConstTensorView<scalar_type, Rank> x) const {
    auto y = std::get<I>(layers_).forward(x);
    if constexpr (I + 1 == size) {
      return y;
    } else {
      return forward_impl<I + 1>(y.cview());
    }
  }

  template <std::size_t I, std::size_t Rank>
  Tensor<scalar_type, Rank> forward_cached(ConstTensorView<scalar_type, Rank> x,
                                           Cache<Rank>& cache) const {
    Tensor<scalar_type, Rank>& out = cache.outputs[I];
    detail::forward_layer(std::get<I>(layers_), x, out, std::get<I>(cache.layers));
    if constexpr (I + 1 == size) {
      return out;  // a copy: the cache keeps its own for the next step's reuse
    } else {
      return forward_cached<I + 1>(out.cview(), cache);
    }
  }

  /// Runs layer I's backward, then the layers before it; returns dx of layer 0 (a view into the
  /// cache; empty when `input_grad` is false).
  template <std::size_t I, bool input_grad, std::size_t Rank>
  ConstTensorView<scalar_type, Rank> backward_from(ConstTensorView<scalar_type, Rank> x,
                                                   Cache<Rank>& cache,
                                                   ConstTensorView<scalar_type, Rank> dy) {
    const ConstTensorView<scalar_type, Rank> input =
        I == 0 ? x : ConstTensorView<scalar_type, Rank>(cache.outputs[I == 0 ? 0 : I - 1]);
    Tensor<scalar_type, Rank>& dx = cache.grads[I];
    constexpr bool layer_input_grad = I != 0 || input_grad;
    detail::backward_layer<layer_input_grad>(std::get<I>(layers_), input, std::get<I>(cache.layers),
                                             dy, dx);
    if constexpr (I == 0) {
      return dx.cview();
    } else {
      return backward_from<I - 1, input_grad>(x, cache, dx.cview());
    }
  }

  std::tuple<Layers...> layers_;
};

template <class Layer>
class Stack : public ComposedModule<Stack<Layer>> {
 public:
  using scalar_type = typename Layer::scalar_type;

  template <std::size_t Rank>
  struct Cache {
    std::vector<Tensor<scalar_type, Rank>> outputs;  ///< each layer's output
    std::vector<Tensor<scalar_type, Rank>> grads;    ///< backward's workspace
    std::vector<detail::layer_cache_t<Layer, Rank>> layers;
  };

  Stack() = default;
  explicit Stack(std::vector<Layer> layers) : layers_(std::move(layers)) {}

  void push_back(Layer layer) { layers_.push_back(std::move(layer)); }
  std::size_t size() const { return layers_.size(); }
  bool empty() const { return layers_.empty(); }
  /// @throws Error if `index` >= size().
  Layer& at(std::size_t index) { return layers_.at(checked_index(index)); }
  const Layer& at(std::size_t index) const { return layers_.at(checked_index(index)); }

  /// x → every layer in order (an empty stack copies x through).
  template <TensorLike X>
  Tensor<scalar_type, rank_of<X>> forward(const X& x) const {
    Tensor<scalar_type, rank_of<X>> y(const_view(x));
    for (const Layer& layer : layers_) y = layer.forward(y.cview());
    return y;
  }

  template <TensorLike X>
  Tensor<scalar_type, rank_of<X>> forward(const X& x, Cache<rank_of<X>>& cache) const {
    resize(cache);
    ConstTensorView<scalar_type, rank_of<X>> input = const_view(x);
    for (std::size_t i = 0; i < layers_.size(); ++i) {
      detail::forward_layer(layers_[i], input, cache.outputs[i], cache.layers[i]);
      input = cache.outputs[i].cview();
    }
    return Tensor<scalar_type, rank_of<X>>(input);
  }

  template <TensorLike X, TensorLike DY>
  Tensor<scalar_type, rank_of<X>> backward(const X& x, Cache<rank_of<X>>& cache, const DY& dy) {
    return Tensor<scalar_type, rank_of<X>>(
        backward_impl<true>(const_view(x), cache, const_view(dy)));
  }

  template <TensorLike X, TensorLike DY>
  void backward_parameters(const X& x, Cache<rank_of<X>>& cache, const DY& dy) {
    backward_impl<false>(const_view(x), cache, const_view(dy));
  }

  // for_each_parameter, zero_grad, parameter_count: from ComposedModule.

 private:
  friend class ComposedModule<Stack>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    for (std::size_t i = 0; i < self.layers_.size(); ++i) {
      visit_child(index_name(i), self.layers_[i], visit);
    }
  }

  std::size_t checked_index(std::size_t index) const {
    if (index >= layers_.size()) {
      throw Error(detail::concat("Stack::at: index ", index, " is out of range (", layers_.size(),
                                 " layers)"));
    }
    return index;
  }

  template <std::size_t Rank>
  void resize(Cache<Rank>& cache) const {
    // Resizing keeps the existing tensors (and their buffers) in place.
    cache.outputs.resize(layers_.size());
    cache.grads.resize(layers_.size());
    cache.layers.resize(layers_.size());
  }

  template <bool input_grad, std::size_t Rank>
  ConstTensorView<scalar_type, Rank> backward_impl(ConstTensorView<scalar_type, Rank> x,
                                                   Cache<Rank>& cache,
                                                   ConstTensorView<scalar_type, Rank> dy) {
    if (cache.outputs.size() != layers_.size()) {
      throw ShapeError(detail::concat("Stack::backward: the cache holds ", cache.outputs.size(),
                                      " layers' outputs, the stack has ", layers_.size(),
                                      " (fill the cache with forward(x, cache))"));
    }
    for (std::size_t i = layers_.size(); i-- > 0;) {
      const ConstTensorView<scalar_type, Rank> input = i == 0 ? x : cache.outputs[i - 1].cview();
      if (i == 0 && !input_grad) {
        detail::backward_layer<false>(layers_[i], input, cache.layers[i], dy, cache.grads[i]);
        return {};
      }
      detail::backward_layer<true>(layers_[i], input, cache.layers[i], dy, cache.grads[i]);
      dy = cache.grads[i].cview();
    }
    return dy;
  }

  std::vector<Layer> layers_;
};

}  // namespace dissect
