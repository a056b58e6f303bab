// dissect/tensor/activation.hpp — the elementwise nonlinearities of a transformer: ReLU, GELU,
// SiLU.
//
// Forward and backward on tensors of any rank, as free functions (relu, gelu, silu, *_backward)
// or through the Activation enum, so a block can hold its activation as a value, or as stateless
// modules (ReLU, GELU, GELUTanh, SiLU) for Sequential. They compute
// PyTorch's functions (ReLU's gradient at 0 is 0), in forms whose negative tails do not cancel;
// the _into forms write into a caller's buffer, which may be the input: no allocation.
#pragma once

#include <array>
#include <cmath>
#include <ostream>
#include <string_view>
#include <type_traits>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/detail/enum_check.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// An activation as a value: what FeedForward takes.
enum class Activation {
  relu,       ///< max(x, 0)
  gelu,       ///< x·Φ(x), the exact (erf) form: F.gelu(x)
  gelu_tanh,  ///< x·½(1 + tanh(√(2/π)(x + 0.044715x³))): F.gelu(x, approximate='tanh'), GPT-2's
  silu,       ///< x·σ(x), also called swish: F.silu(x), LLaMA's
};

/// The enumerators' names, in order: what to_string prints and what an out-of-range value is
/// checked against.
namespace detail {
inline constexpr std::array<std::string_view, 4> activation_names{"relu", "gelu", "gelu_tanh",
                                                                  "silu"};
}  // namespace detail

/// GELU's two forms, named as PyTorch's `approximate` argument.
enum class GeluApproximation { none, tanh };

/// `activation` itself, if it is one of the enumerators.
/// @throws ConfigError naming `op` and the value otherwise (an Activation cast from an int).
Activation check_activation(const char* op, Activation activation);

/// "relu", "gelu", "gelu_tanh", "silu".
const char* to_string(Activation activation);
std::ostream& operator<<(std::ostream& out, Activation activation);

/// x: [...] → y: [...], y = f(x) elementwise.
/// @throws Error if `activation` is not one of the enumerators.
template <TensorLike X>
Tensor<scalar_of<X>, rank_of<X>> activate(const X& x, Activation activation);

/// As activate, into y: [...] (old values never read). y may be x itself: in place.
/// @throws ShapeError if y's shape differs from x's (y untouched).
template <TensorLike X, WritableTensor Y>
void activate_into(const X& x, Y&& y, Activation activation);

/// x: [...], dy: [...] → dx: [...], dx = f'(x)·dy elementwise.
/// @throws ShapeError if dy's shape differs from x's.
template <TensorLike X, TensorLike DY>
Tensor<scalar_of<X>, rank_of<X>> activate_backward(const X& x, const DY& dy, Activation activation);

/// As activate_backward, into dx: [...]. dx may be dy (or x) itself: in place.
/// @throws ShapeError if dy's or dx's shape differs from x's (dx untouched).
template <TensorLike X, TensorLike DY, WritableTensor DX>
void activate_backward_into(const X& x, const DY& dy, DX&& dx, Activation activation);

/// An activation as a stateless module (no parameters), for Sequential: ReLU, GELU, GELUTanh,
/// SiLU. backward(x, dy) runs from the saved input; ReLU can also run from its output.
template <Activation A>
struct ActivationModule {
  template <TensorLike X>
  Tensor<scalar_of<X>, rank_of<X>> forward(const X& x) const {
    return activate(x, A);
  }
  template <TensorLike X, WritableTensor Y>
  void forward_into(const X& x, Y&& y) const {
    activate_into(x, y, A);
  }
  template <TensorLike X, TensorLike DY>
  Tensor<scalar_of<X>, rank_of<X>> backward(const X& x, const DY& dy) const {
    return activate_backward(x, dy, A);
  }
  template <TensorLike X, TensorLike DY, WritableTensor DX>
  void backward_into(const X& x, const DY& dy, DX&& dx) const {
    activate_backward_into(x, dy, dx, A);
  }
  /// ReLU only: dx from y = relu(x), since y > 0 exactly where x > 0 (and NaN where x is NaN).
  template <TensorLike Y, TensorLike DY>
  requires(A ==
           Activation::relu) Tensor<scalar_of<Y>, rank_of<Y>> backward_from_output(const Y& y,
                                                                                   const DY& dy)
  const { return activate_backward(y, dy, A); }
  template <std::size_t Rank>
  Shape<Rank> output_shape(const Shape<Rank>& x_shape) const {
    return x_shape;
  }
  template <class Visitor>
  void for_each_parameter(Visitor&&) const {}
};
using ReLU = ActivationModule<Activation::relu>;
using GELU = ActivationModule<Activation::gelu>;
using GELUTanh = ActivationModule<Activation::gelu_tanh>;
using SiLU = ActivationModule<Activation::silu>;

/// The same, one function per activation (defined below, as function objects):
///   relu(x), relu_backward(x, dy) — dx = dy where x > 0, else 0 (also at x = 0, as PyTorch);
///   gelu(x, approximate = none), gelu_backward(x, dy, approximate = none); silu, silu_backward.

// ---- implementation -----------------------------------------------------------------------------

inline const char* to_string(Activation activation) {
  return detail::enum_name(activation, detail::activation_names).data();  // literals: terminated
}

inline Activation check_activation(const char* op, Activation activation) {
  return detail::check_enum(op, "Activation", activation, detail::activation_names);
}

inline std::ostream& operator<<(std::ostream& out, Activation activation) {
  return out << to_string(activation);
}

namespace detail {

/// σ(z) = 1 / (1 + e^(−z)): e^(−z) overflows to ∞ for very negative z, giving exactly 0.
template <class Scalar>
Scalar activation_sigmoid(Scalar z) {
  return Scalar(1) / (Scalar(1) + std::exp(-z));
}

/// f(x) for one element.
template <Activation A, class Scalar>
Scalar activation_value(Scalar x) {
  if constexpr (A == Activation::relu) {
    return x < Scalar(0) ? Scalar(0) : x;  // NaN passes through, as torch.relu
  } else if constexpr (A == Activation::gelu) {
    // Φ(x) = ½·erfc(−x/√2) rather than ½·(1 + erf(x/√2)): the same function, but the left tail
    // does not cancel to 0 (gelu(−10) is −7.6e−23, not −0).
    return x * (Scalar(0.5) * std::erfc(-x * Scalar(0.70710678118654752440)));
  } else if constexpr (A == Activation::gelu_tanh) {
    // ½(1 + tanh(u)) = σ(2u): one exp instead of tanh, and no cancellation for negative x.
    const Scalar u = Scalar(0.79788456080286535588) * (x + Scalar(0.044715) * x * x * x);
    return x * activation_sigmoid(Scalar(2) * u);
  } else {
    return x * activation_sigmoid(x);
  }
}

/// f'(x)·dy for one element.
template <Activation A, class Scalar>
Scalar activation_gradient(Scalar x, Scalar dy) {
  if constexpr (A == Activation::relu) {
    // A select, not f'·dy, exactly as PyTorch's threshold_backward: x < 0 with dy = ∞ gives 0,
    // and x = NaN passes dy through.
    return x <= Scalar(0) ? Scalar(0) : dy;
  } else if constexpr (A == Activation::gelu) {
    // d/dx x·Φ(x) = Φ(x) + x·φ(x), φ(x) = e^(−x²/2)/√(2π).
    const Scalar cdf = Scalar(0.5) * std::erfc(-x * Scalar(0.70710678118654752440));
    const Scalar pdf = Scalar(0.39894228040143267794) * std::exp(Scalar(-0.5) * x * x);
    return dy * (cdf + x * pdf);
  } else if constexpr (A == Activation::gelu_tanh) {
    // d/dx x·σ(2u) = σ(2u) + x·2σ(1 − σ)·u'. Where σ(1 − σ) is exactly 0, x³ may already have
    // overflowed (|x| ≳ 1e13 in float); skip the term rather than form 0·∞ = NaN for a slope
    // that is exactly 0 or 1 (torch 1.13 returns NaN there).
    const Scalar x2 = x * x;
    const Scalar u = Scalar(0.79788456080286535588) * (x + Scalar(0.044715) * x2 * x);
    const Scalar s = activation_sigmoid(Scalar(2) * u);
    const Scalar bump = s * (Scalar(1) - s);
    if (bump == Scalar(0)) return dy * s;
    const Scalar du = Scalar(0.79788456080286535588) * (Scalar(1) + Scalar(3 * 0.044715) * x2);
    return dy * (s + x * (Scalar(2) * bump * du));
  } else {
    // d/dx x·σ(x) = σ(x)·(1 + x·(1 − σ(x))).
    const Scalar s = activation_sigmoid(x);
    return dy * (s * (Scalar(1) + x * (Scalar(1) - s)));
  }
}

/// Calls body(std::integral_constant<Activation, a>{}): the elementwise loops are instantiated
/// once per activation and carry no switch per element.
template <class Body>
decltype(auto) with_activation(Activation activation, const char* op, Body&& body) {
  using A = Activation;
  switch (activation) {
    case A::relu:
      return body(std::integral_constant<A, A::relu>{});
    case A::gelu:
      return body(std::integral_constant<A, A::gelu>{});
    case A::gelu_tanh:
      return body(std::integral_constant<A, A::gelu_tanh>{});
    case A::silu:
      return body(std::integral_constant<A, A::silu>{});
  }
  throw Error(concat(op, ": unknown activation ", static_cast<int>(activation)));
}

template <class A, class B, std::size_t Rank>
void check_activation_shape(const char* op, Activation activation, const char* name,
                            const TensorView<A, Rank>& tensor, const TensorView<B, Rank>& x) {
  if (tensor.shape() != x.shape()) {
    throw ShapeError(concat(op, "(", to_string(activation), "): ", name, " has shape ",
                            format_shape(tensor.shape()), " but x has shape ",
                            format_shape(x.shape())));
  }
}

inline Activation gelu_activation(GeluApproximation approximate) {
  return approximate == GeluApproximation::tanh ? Activation::gelu_tanh : Activation::gelu;
}

}  // namespace detail

template <TensorLike X, WritableTensor Y>
void activate_into(const X& x_tensor, Y&& y_tensor, Activation activation) {
  using Scalar = scalar_of<X>;
  static_assert(std::is_same_v<Scalar, scalar_of<Y>>, "activate_into: x and y scalar types differ");
  const auto x = const_view(x_tensor);
  const auto y = writable_view(y_tensor);
  detail::check_activation_shape("activate_into", activation, "y", y, x);
  detail::with_activation(activation, "activate_into", [&](auto a) {
    // Each element is read before it is written, so y == x (in place) is safe.
    const Scalar* in = x.data();
    Scalar* out = y.data();
    for (index_t i = 0; i < x.size(); ++i)
      out[i] = detail::activation_value<decltype(a)::value>(in[i]);
  });
}

template <TensorLike X>
Tensor<scalar_of<X>, rank_of<X>> activate(const X& x, Activation activation) {
  auto y = Tensor<scalar_of<X>, rank_of<X>>::uninitialized(const_view(x).shape());
  activate_into(x, y, activation);
  return y;
}

template <TensorLike X, TensorLike DY, WritableTensor DX>
void activate_backward_into(const X& x_tensor, const DY& dy_tensor, DX&& dx_tensor,
                            Activation activation) {
  using Scalar = scalar_of<X>;
  static_assert(std::is_same_v<Scalar, scalar_of<DY>> && std::is_same_v<Scalar, scalar_of<DX>>,
                "activate_backward_into: x, dy and dx scalar types differ");
  const auto x = const_view(x_tensor);
  const auto dy = const_view(dy_tensor);
  const auto dx = writable_view(dx_tensor);
  detail::check_activation_shape("activate_backward", activation, "dy", dy, x);
  detail::check_activation_shape("activate_backward", activation, "dx", dx, x);
  detail::with_activation(activation, "activate_backward", [&](auto a) {
    const Scalar* in = x.data();
    const Scalar* upstream = dy.data();
    Scalar* out = dx.data();
    for (index_t i = 0; i < x.size(); ++i) {
      out[i] = detail::activation_gradient<decltype(a)::value>(in[i], upstream[i]);
    }
  });
}

template <TensorLike X, TensorLike DY>
Tensor<scalar_of<X>, rank_of<X>> activate_backward(const X& x, const DY& dy,
                                                   Activation activation) {
  auto dx = Tensor<scalar_of<X>, rank_of<X>>::uninitialized(const_view(x).shape());
  activate_backward_into(x, dy, dx, activation);
  return dx;
}

// One line each: activate / activate_backward with the activation fixed.
inline constexpr auto relu = [](const auto& x) { return activate(x, Activation::relu); };
inline constexpr auto relu_backward = [](const auto& x, const auto& dy) {
  return activate_backward(x, dy, Activation::relu);
};
inline constexpr auto gelu = [](const auto& x,
                                GeluApproximation approximate = GeluApproximation::none) {
  return activate(x, detail::gelu_activation(approximate));
};
inline constexpr auto gelu_backward = [](const auto& x, const auto& dy,
                                         GeluApproximation approximate = GeluApproximation::none) {
  return activate_backward(x, dy, detail::gelu_activation(approximate));
};
inline constexpr auto silu = [](const auto& x) { return activate(x, Activation::silu); };
inline constexpr auto silu_backward = [](const auto& x, const auto& dy) {
  return activate_backward(x, dy, Activation::silu);
};

}  // namespace dissect
