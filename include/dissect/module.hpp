// dissect/module.hpp — what makes a layer trainable, and Sequential, the simplest composition.
//
// A module is anything with for_each_parameter(visit): it calls visit(name, value, grad) once per
// parameter, with PyTorch state_dict names ("qkv.weight", "0.bias") and views of the values and
// their gradients. That one function gives every module zero_grad, parameter_count and names,
// and lets an optimizer take any module. Composition is by value (members, Sequential), never
// through a virtual base: each module's backward is written and proven by hand.
//
// A frozen parameter (PyTorch's requires_grad=False) is visited with an empty gradient view: it
// has no gradient buffer, optimizers skip it, zero_grad has nothing to clear. Layers that own
// parameters (Linear, Embedding, the norms) are frozen with set_frozen; freeze(module) walks a
// composed module down to them (for_each_layer).
#pragma once

#include <array>
#include <concepts>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/error.hpp"
#include "dissect/shape.hpp"
#include "dissect/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// A parameter's state_dict name as a path of parts ("h", "0", "attn", "qkv", "weight"): views
/// into the modules' own storage, so visiting parameters (every zero_grad) never allocates.
class ParameterName {
 public:
  static constexpr std::size_t max_depth = 16;

  explicit ParameterName(std::string_view leaf) : parts_{leaf}, depth_(1) {}

  /// This name inside a module called `prefix`: "weight" under "qkv" is "qkv.weight".
  /// @throws Error if the path would be deeper than max_depth.
  ParameterName under(std::string_view prefix) const;

  /// The dotted name, "qkv.weight".
  std::string str() const;
  friend bool operator==(const ParameterName& name, std::string_view text) {
    return name.str() == text;
  }
  friend std::ostream& operator<<(std::ostream& out, const ParameterName& name) {
    return out << name.str();
  }

 private:
  ParameterName() = default;
  std::array<std::string_view, max_depth> parts_{};
  std::size_t depth_ = 0;
};

namespace detail {
/// Accepts any parameter: what the Module concept calls for_each_parameter with.
struct ParameterProbe {
  template <class Value, class Grad>
  void operator()(const ParameterName&, Value, Grad) const {}
};
}  // namespace detail

/// Anything whose parameters can be visited, mutably and read-only. Stateless layers (ReLU) are
/// modules with no parameters.
template <class M>
concept Module = requires(M& module, const M& const_module) {
  module.for_each_parameter(detail::ParameterProbe{});
  const_module.for_each_parameter(detail::ParameterProbe{});
};

/// Visits `child`'s parameters under `prefix` ("up" + "weight" → "up.weight"): how a module
/// made of modules writes its for_each_parameter.
template <class Child, class Visitor>
void visit_child(std::string_view prefix, Child& child, Visitor& visit) {
  child.for_each_parameter([&](const ParameterName& name, auto value, auto grad) {
    visit(name.under(prefix), value, grad);
  });
}

/// A parameter visited with this value and gradient is frozen: it has values but no gradient.
template <class Value, class Grad>
bool is_frozen_parameter(const Value& value, const Grad& grad) {
  return grad.size() == 0 && value.size() > 0;
}

/// Sets every gradient of `module` to zero (gradients accumulate until then, as in PyTorch).
template <Module M>
void zero_grad(M& module);

/// Σ of the parameters' element counts. @throws OverflowError if it leaves int64.
template <Module M>
index_t parameter_count(const M& module);

/// Σ of the element counts of the parameters that are not frozen (what an optimizer updates).
template <Module M>
index_t trainable_parameter_count(const M& module);

/// Every parameter's state_dict name, in visiting order.
template <Module M>
std::vector<std::string> parameter_names(const M& module);

/// A layer that owns parameters and can be frozen: the leaves for_each_layer stops at.
template <class L>
concept FreezableLayer = requires(L& layer, const L& const_layer) {
  layer.set_frozen(true);
  { const_layer.frozen() } -> std::same_as<bool>;
};

/// Calls visit(name, layer) for every FreezableLayer inside `module` (or `module` itself, named
/// ""), with its module path as a state_dict prefix ("h.0.attn.qkv"): how adapters are placed
/// by name and models are frozen. visit may take only some layer types (Linear<float>&, or
/// const Linear<float>& when `module` is const), the others are skipped. A tied layer is visited
/// once, where the state_dict names it.
template <Module M, class Visitor>
void for_each_layer(M& module, Visitor&& visit);

/// set_frozen(true / false) on every layer of `module`.
template <Module M>
void freeze(M& module);
template <Module M>
void unfreeze(M& module);

/// zero_grad() and parameter_count() as members, from for_each_parameter: a module derives from
/// ParameterMethods<Itself> (CRTP, no virtual functions) instead of writing them by hand.
///
/// It also makes every module non-assignable: a module's buffers keep their address for its life
/// (views of them, an optimizer's, stay valid), so a module is copied or moved into a new one but
/// never assigned over, which would free what those views point to.
template <class Derived>
class ParameterMethods {
 public:
  void zero_grad() { dissect::zero_grad(static_cast<Derived&>(*this)); }
  index_t parameter_count() const {
    return dissect::parameter_count(static_cast<const Derived&>(*this));
  }

 protected:
  ParameterMethods() = default;
  ParameterMethods(const ParameterMethods&) = default;
  ParameterMethods(ParameterMethods&&) noexcept = default;
  ParameterMethods& operator=(const ParameterMethods&) = delete;
  ParameterMethods& operator=(ParameterMethods&&) = delete;
  ~ParameterMethods() = default;
};

/// A module made of named member modules. Derived defines a private static
/// visit_members(self, visit) that calls visit_child once per member (self is Derived or const
/// Derived) and befriends ComposedModule; it gets for_each_parameter, zero_grad and
/// parameter_count.
template <class Derived>
class ComposedModule : public ParameterMethods<Derived> {
 public:
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    Derived::visit_members(static_cast<Derived&>(*this), visit);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    Derived::visit_members(static_cast<const Derived&>(*this), visit);
  }
};

/// Copies `source` into a module's parameter `target`, whose buffer keeps its address: what every
/// set_weight/set_bias does. @throws ShapeError "layer::set_<what>: <what> must be <dims> =
/// [..], got [..]" if the shapes differ (target untouched).
template <class Scalar, std::size_t Rank>
void assign_parameter(std::string_view layer, std::string_view what, std::string_view dims,
                      Tensor<Scalar, Rank>& target, ConstTensorView<Scalar, Rank> source) {
  if (source.shape() != target.shape()) {
    throw ShapeError(detail::concat(layer, "::set_", what, ": ", what, " must be ", dims, " = ",
                                    format_shape(target.shape()), ", got ",
                                    format_shape(source.shape())));
  }
  target.view().copy_from(source);
}

/// What a freezable layer's set_frozen does to one gradient buffer: releases it (frozen) or
/// allocates it zero-filled, shaped `value_shape` (unfrozen).
template <class Scalar, std::size_t Rank>
void set_gradient_frozen(Tensor<Scalar, Rank>& grad, const Shape<Rank>& value_shape, bool frozen) {
  grad = Tensor<Scalar, Rank>(frozen ? Shape<Rank>{} : value_shape);
}

/// What a frozen layer's gradient accessors do. @throws Error "layer::accessor: this layer is
/// frozen and keeps no gradient" when `frozen`.
inline void require_gradient(std::string_view layer, std::string_view accessor, bool frozen) {
  if (frozen) {
    throw Error(
        detail::concat(layer, "::", accessor, ": this layer is frozen and keeps no gradient"));
  }
}

/// Refuses, at compile time, a tensor argument X whose scalar is not the layer's Scalar.
template <class Scalar, class X>
constexpr void require_layer_scalar() {
  static_assert(std::is_same_v<scalar_of<X>, Scalar>,
                "dissect: the tensor's scalar type must match the layer's "
                "(convert float <-> double explicitly; there is no silent precision change)");
}

/// "0", "1", …: the names of positions in a Sequential or a layer stack, as stable views.
std::string_view index_name(std::size_t index);

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

inline ParameterName ParameterName::under(std::string_view prefix) const {
  if (depth_ == max_depth) {
    throw Error(detail::concat("ParameterName: \"", prefix, ".", str(), "\" is deeper than ",
                               max_depth, " parts"));
  }
  ParameterName result;
  result.parts_[0] = prefix;
  std::copy_n(parts_.begin(), depth_, result.parts_.begin() + 1);
  result.depth_ = depth_ + 1;
  return result;
}

inline std::string ParameterName::str() const {
  std::string text;
  for (std::size_t i = 0; i < depth_; ++i) {
    if (i > 0) text += '.';
    text += parts_[i];
  }
  return text;
}

template <Module M>
void zero_grad(M& module) {
  module.for_each_parameter([](const ParameterName&, auto, auto grad) { grad.fill(0); });
}

template <Module M>
index_t parameter_count(const M& module) {
  index_t count = 0;
  module.for_each_parameter([&](const ParameterName&, auto value, auto) {
    count = checked_add(count, value.size(), "parameter_count");
  });
  return count;
}

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

namespace detail {

/// The visitor for_each_layer passes down a ComposedModule's visit_members: visit_child's
/// overload below sends it into composed children and hands it the leaves.
template <class Visitor>
struct LayerWalk {
  Visitor& visit;
  std::string prefix;  // "" or "h.0.attn."

  std::string path(std::string_view name) const { return prefix + std::string(name); }
  /// A module that visits its parameters itself (not through visit_child) has no layers to walk.
  template <class Value, class Grad>
  void operator()(const ParameterName&, Value, Grad) const {}
};

template <class Visitor, class Layer>
void walk_layer(LayerWalk<Visitor>& walk, std::string_view name, Layer& layer) {
  if constexpr (FreezableLayer<std::remove_const_t<Layer>>) {  // a const model's leaves too
    if constexpr (std::is_invocable_v<Visitor&, const std::string&, Layer&>) {
      walk.visit(walk.path(name), layer);
    }
  } else {
    // A composed module: its members, one level deeper. Stateless layers visit nothing.
    LayerWalk<Visitor> inner{walk.visit, name.empty() ? walk.prefix : walk.path(name) + "."};
    layer.for_each_parameter(inner);
  }
}

}  // namespace detail

/// visit_child for the layer walk: the child is a leaf to visit or a module to walk into.
template <class Child, class Visitor>
void visit_child(std::string_view prefix, Child& child, detail::LayerWalk<Visitor>& walk) {
  detail::walk_layer(walk, prefix, child);
}

template <Module M, class Visitor>
void for_each_layer(M& module, Visitor&& visit) {
  detail::LayerWalk<std::remove_reference_t<Visitor>> walk{visit, ""};
  detail::walk_layer(walk, "", module);
}

template <Module M>
void freeze(M& module) {
  for_each_layer(module,
                 [](const std::string&, FreezableLayer auto& layer) { layer.set_frozen(true); });
}

template <Module M>
void unfreeze(M& module) {
  for_each_layer(module,
                 [](const std::string&, FreezableLayer auto& layer) { layer.set_frozen(false); });
}

template <Module M>
std::vector<std::string> parameter_names(const M& module) {
  std::vector<std::string> names;
  module.for_each_parameter(
      [&](const ParameterName& name, auto, auto) { names.push_back(name.str()); });
  return names;
}

inline std::string_view index_name(std::size_t index) {
  // Built once; the strings never move, so the views stay valid for the program's life.
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all(1024);
    for (std::size_t i = 0; i < all.size(); ++i) all[i] = std::to_string(i);
    return all;
  }();
  if (index >= names.size()) {
    throw Error(detail::concat("index_name: position ", index, " is beyond ", names.size()));
  }
  return names[index];
}

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

/// `buffer` shaped `shape`, reallocated only when its shape differs: the cache reuse that keeps
/// training steps of one shape free of allocation.
template <class Scalar, std::size_t Rank>
TensorView<Scalar, Rank> reuse_buffer(Tensor<Scalar, Rank>& buffer, const Shape<Rank>& shape) {
  if (buffer.shape() != shape) buffer = Tensor<Scalar, Rank>::uninitialized(shape);
  return buffer.view();
}

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
