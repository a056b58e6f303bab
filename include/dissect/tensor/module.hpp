// dissect/tensor/module.hpp — what makes a layer trainable: the module protocol.
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
// composed module down to them (for_each_layer; freeze and unfreeze are in freezing.hpp).
// Sequential and Stack, the containers, are in sequential.hpp.
#pragma once

#include <algorithm>
#include <array>
#include <concepts>
#include <cstddef>
#include <ostream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/tensor.hpp"

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

/// A layer that computes differently while training and in evaluation (BatchNorm's statistics,
/// Dropout's masks): set_training(mode) is torch's module.train(mode) (train(False) = eval()),
/// training() its module.training. Layers without a mode (Linear, LayerNorm) do not model it; the
/// training step remains the forward(x, cache) overload, whatever the mode.
template <class L>
concept ModalLayer = requires(L& layer, const L& const_layer) {
  layer.set_training(true);
  { const_layer.training() } -> std::same_as<bool>;
};

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

/// `buffer` shaped `shape`, reallocated only when its shape differs (its values are then
/// unspecified; a view of it is returned): the cache reuse that keeps a module's training steps
/// of one shape, forward(x, cache) after forward(x, cache), free of allocation.
template <class Scalar, std::size_t Rank>
TensorView<Scalar, Rank> reuse_buffer(Tensor<Scalar, Rank>& buffer, const Shape<Rank>& shape);

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

template <class Scalar, std::size_t Rank>
TensorView<Scalar, Rank> reuse_buffer(Tensor<Scalar, Rank>& buffer, const Shape<Rank>& shape) {
  if (buffer.shape() != shape) buffer = Tensor<Scalar, Rank>::uninitialized(shape);
  return buffer.view();
}

}  // namespace dissect
