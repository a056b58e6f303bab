// dissect/linear.hpp — Linear<Scalar>: y = x·Wᵀ + b with W [out, in], exactly like nn.Linear.
//
// The layer owns its parameters and their gradients, checks every shape at the boundary (in
// every build mode) and then folds all leading axes of x into one matrix so that a whole batch
// of sequences is a single GEMM in kernels.hpp. backward() adds into the gradients until
// zero_grad(), as PyTorch does. forward() is const and keeps no state: one layer may serve any
// number of threads at once (concurrent backward() into the same gradients is not safe).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>

#include "dissect/error.hpp"
#include "dissect/init.hpp"
#include "dissect/kernels.hpp"
#include "dissect/shape.hpp"
#include "dissect/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

struct LinearOptions {
  bool bias = true;
  InitScheme init = InitScheme::pytorch_default;
  /// Seed of the layer's own generator; when empty, the next of the sequence manual_seed() sets.
  std::optional<std::uint64_t> seed = std::nullopt;
};

template <class Scalar>
class Linear {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::Linear<Scalar>: Scalar must be float or double");

 public:
  using scalar_type = Scalar;

  /// A layer with freshly initialised parameters.
  /// @throws ShapeError for a negative feature count or a parameter count that overflows int64.
  Linear(index_t in_features, index_t out_features, LinearOptions options = {});

  /// A layer around given parameters: weight [out, in] and, optionally, bias [out].
  /// @throws ShapeError if the bias length differs from the weight's rows.
  explicit Linear(Tensor<Scalar, 2> weight, std::optional<Tensor<Scalar, 1>> bias = std::nullopt);

  index_t in_features() const { return in_features_; }
  index_t out_features() const { return out_features_; }
  bool has_bias() const { return has_bias_; }
  /// out·in (+ out with bias), the number of trainable values.
  index_t parameter_count() const;

  /// [out_features, in_features]. Assign new values through set_weight, which checks the shape.
  Tensor<Scalar, 2>& weight() { return weight_; }
  const Tensor<Scalar, 2>& weight() const { return weight_; }
  /// [out_features]. @throws Error if the layer was built without a bias.
  Tensor<Scalar, 1>& bias();
  const Tensor<Scalar, 1>& bias() const;
  /// @throws ShapeError naming the parameter if the shape is not [out, in] / [out].
  void set_weight(Tensor<Scalar, 2> weight);
  void set_bias(Tensor<Scalar, 1> bias);

  /// x: [..., in] → y: [..., out]. Rank 1 ([in] → [out]) and empty leading axes work.
  /// @throws ShapeError if x's last axis is not in_features.
  template <class XScalar, std::size_t Rank>
  Tensor<Scalar, Rank> forward(const Tensor<XScalar, Rank>& x) const;

  /// As forward, into a caller's buffer y: [..., out] (its old values are never read).
  /// @throws ShapeError if y has the wrong shape or shares memory with x.
  template <std::size_t Rank>
  void forward_into(const Tensor<Scalar, Rank>& x, Tensor<Scalar, Rank>& y) const;

  /// x: [..., in], dy: [..., out] → dx: [..., in]; adds dyᵀ·x to dW and Σ dy to db over all
  /// leading axes. @throws ShapeError (gradients untouched) if the shapes do not fit.
  template <class XScalar, std::size_t Rank>
  Tensor<Scalar, Rank> backward(const Tensor<XScalar, Rank>& x, const Tensor<XScalar, Rank>& dy);

  /// As backward, writing dx into a caller's buffer.
  template <std::size_t Rank>
  void backward_into(const Tensor<Scalar, Rank>& x, const Tensor<Scalar, Rank>& dy,
                     Tensor<Scalar, Rank>& dx);

  /// The parameter half of backward: adds dyᵀ·x to dW and Σ dy to db, and skips dx = dy·W — for
  /// a first layer whose input needs no gradient (PyTorch's requires_grad=False), where dx would
  /// cost as much as the forward product. @throws ShapeError (gradients untouched) as backward.
  template <std::size_t Rank>
  void backward_parameters(const Tensor<Scalar, Rank>& x, const Tensor<Scalar, Rank>& dy);

  const Tensor<Scalar, 2>& weight_grad() const { return weight_grad_; }
  /// @throws Error if the layer was built without a bias.
  const Tensor<Scalar, 1>& bias_grad() const;
  Tensor<Scalar, 2>& weight_grad() { return weight_grad_; }
  Tensor<Scalar, 1>& bias_grad();
  void zero_grad();

 private:
  template <std::size_t Rank>
  void check_input(const char* op, const Tensor<Scalar, Rank>& x) const;
  template <std::size_t Rank>
  Shape<Rank> output_shape(const Shape<Rank>& x_shape) const;
  template <std::size_t Rank>
  void check_backward(const char* op, const Tensor<Scalar, Rank>& x,
                      const Tensor<Scalar, Rank>& dy) const;
  std::optional<VectorMap<Scalar>> bias_grad_view();
  void check_parameters(const char* op) const;
  std::optional<ConstVectorMap<Scalar>> bias_view() const;

  index_t in_features_;
  index_t out_features_;
  bool has_bias_;
  Tensor<Scalar, 2> weight_;
  Tensor<Scalar, 1> bias_;  // [0] without a bias
  Tensor<Scalar, 2> weight_grad_;
  Tensor<Scalar, 1> bias_grad_;
};

/// "Linear(in_features=768, out_features=3072, bias=true)", as PyTorch prints nn.Linear.
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const Linear<Scalar>& layer);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

template <std::size_t Rank, class A, class B>
bool shares_memory(const Tensor<A, Rank>& a, const Tensor<B, Rank>& b) {
  if (a.empty() || b.empty()) return false;
  auto a_begin = reinterpret_cast<std::uintptr_t>(a.data());
  auto b_begin = reinterpret_cast<std::uintptr_t>(b.data());
  auto a_end = a_begin + static_cast<std::uintptr_t>(a.size()) * sizeof(A);
  auto b_end = b_begin + static_cast<std::uintptr_t>(b.size()) * sizeof(B);
  return a_begin < b_end && b_begin < a_end;
}

inline index_t checked_feature_count(index_t count, const char* name) {
  if (count < 0) {
    throw ShapeError(concat("Linear: ", name, " must be >= 0, got ", count));
  }
  return count;
}

template <class>
inline constexpr bool dependent_false = false;

}  // namespace detail

template <class Scalar>
Linear<Scalar>::Linear(index_t in_features, index_t out_features, LinearOptions options)
    : in_features_(detail::checked_feature_count(in_features, "in_features")),
      out_features_(detail::checked_feature_count(out_features, "out_features")),
      has_bias_(options.bias),
      weight_({out_features_, in_features_}),
      bias_({has_bias_ ? out_features_ : 0}),
      weight_grad_({out_features_, in_features_}),
      bias_grad_({has_bias_ ? out_features_ : 0}) {
  Generator generator(options.seed ? *options.seed : next_default_seed());
  init_linear(weight_, has_bias_ ? &bias_ : nullptr, options.init, generator);
}

template <class Scalar>
Linear<Scalar>::Linear(Tensor<Scalar, 2> weight, std::optional<Tensor<Scalar, 1>> bias)
    : in_features_(weight.dim(1)),
      out_features_(weight.dim(0)),
      has_bias_(bias.has_value()),
      weight_(std::move(weight)),
      bias_(bias ? std::move(*bias) : Tensor<Scalar, 1>({0})),
      weight_grad_({out_features_, in_features_}),
      bias_grad_({has_bias_ ? out_features_ : 0}) {
  if (has_bias_ && bias_.dim(0) != out_features_) {
    throw ShapeError(detail::concat("Linear: bias has shape ", format_shape(bias_.shape()),
                                    " but weight ", format_shape(weight_.shape()), " needs [",
                                    out_features_, "]"));
  }
}

template <class Scalar>
index_t Linear<Scalar>::parameter_count() const {
  index_t count = checked_mul(out_features_, in_features_, "Linear::parameter_count");
  return has_bias_ ? count + out_features_ : count;
}

template <class Scalar>
Tensor<Scalar, 1>& Linear<Scalar>::bias() {
  return const_cast<Tensor<Scalar, 1>&>(std::as_const(*this).bias());
}

template <class Scalar>
const Tensor<Scalar, 1>& Linear<Scalar>::bias() const {
  if (!has_bias_) throw Error("Linear::bias: this layer was built with bias=false");
  return bias_;
}

template <class Scalar>
const Tensor<Scalar, 1>& Linear<Scalar>::bias_grad() const {
  if (!has_bias_) throw Error("Linear::bias_grad: this layer was built with bias=false");
  return bias_grad_;
}

template <class Scalar>
Tensor<Scalar, 1>& Linear<Scalar>::bias_grad() {
  return const_cast<Tensor<Scalar, 1>&>(std::as_const(*this).bias_grad());
}

template <class Scalar>
void Linear<Scalar>::set_weight(Tensor<Scalar, 2> weight) {
  if (weight.shape() != Shape<2>{out_features_, in_features_}) {
    throw ShapeError(
        detail::concat("Linear::set_weight: weight must be [out_features, in_features]", " = [",
                       out_features_, ", ", in_features_, "], got ", format_shape(weight.shape())));
  }
  weight_ = std::move(weight);
}

template <class Scalar>
void Linear<Scalar>::set_bias(Tensor<Scalar, 1> bias) {
  if (!has_bias_) throw Error("Linear::set_bias: this layer was built with bias=false");
  if (bias.dim(0) != out_features_) {
    throw ShapeError(detail::concat("Linear::set_bias: bias must be [out_features] = [",
                                    out_features_, "], got ", format_shape(bias.shape())));
  }
  bias_ = std::move(bias);
}

template <class Scalar>
void Linear<Scalar>::zero_grad() {
  weight_grad_.fill(Scalar(0));
  bias_grad_.fill(Scalar(0));
}

template <class Scalar>
void Linear<Scalar>::check_parameters(const char* op) const {
  // weight() hands out a mutable reference; a wrong-shaped tensor assigned through it is caught
  // here, before a kernel could read past its end.
  if (weight_.shape() != Shape<2>{out_features_, in_features_}) {
    throw ShapeError(detail::concat("Linear::", op, ": weight was reassigned to shape ",
                                    format_shape(weight_.shape()), ", expected [", out_features_,
                                    ", ", in_features_, "]; use set_weight"));
  }
  if (has_bias_ && bias_.shape() != Shape<1>{out_features_}) {
    throw ShapeError(detail::concat("Linear::", op, ": bias was reassigned to shape ",
                                    format_shape(bias_.shape()), ", expected [", out_features_,
                                    "]; use set_bias"));
  }
}

template <class Scalar>
template <std::size_t Rank>
void Linear<Scalar>::check_input(const char* op, const Tensor<Scalar, Rank>& x) const {
  check_parameters(op);
  if (x.dim(Rank - 1) != in_features_) {
    throw ShapeError(detail::concat(
        "Linear::", op, ": input last dim ", x.dim(Rank - 1), " != in_features ", in_features_,
        " (x: ", format_shape(x.shape()), ", weight: ", format_shape(weight_.shape()), ")"));
  }
}

template <class Scalar>
template <std::size_t Rank>
Shape<Rank> Linear<Scalar>::output_shape(const Shape<Rank>& x_shape) const {
  Shape<Rank> shape = x_shape;
  shape[Rank - 1] = out_features_;
  return shape;
}

template <class Scalar>
std::optional<ConstVectorMap<Scalar>> Linear<Scalar>::bias_view() const {
  if (!has_bias_) return std::nullopt;
  return ConstVectorMap<Scalar>(bias_.data(), out_features_);
}

template <class Scalar>
template <class XScalar, std::size_t Rank>
Tensor<Scalar, Rank> Linear<Scalar>::forward(const Tensor<XScalar, Rank>& x) const {
  if constexpr (!std::is_same_v<Scalar, XScalar>) {
    static_assert(detail::dependent_false<XScalar>,
                  "dissect::Linear<Scalar>: the input tensor's scalar type must match the layer's "
                  "(convert float <-> double explicitly; there is no silent precision change)");
    return {};
  } else {
    check_input("forward", x);
    auto y = Tensor<Scalar, Rank>::uninitialized(output_shape(x.shape()));
    linear_forward<Scalar>(x.matrix(), weight_.matrix(), bias_view(), y.matrix());
    return y;
  }
}

template <class Scalar>
template <std::size_t Rank>
void Linear<Scalar>::forward_into(const Tensor<Scalar, Rank>& x, Tensor<Scalar, Rank>& y) const {
  check_input("forward_into", x);
  if (y.shape() != output_shape(x.shape())) {
    throw ShapeError(detail::concat("Linear::forward_into: output has shape ",
                                    format_shape(y.shape()), " but x ", format_shape(x.shape()),
                                    " gives ", format_shape(output_shape(x.shape()))));
  }
  if (detail::shares_memory(x, y)) {
    throw ShapeError(
        detail::concat("Linear::forward_into: output aliases input (x: ", format_shape(x.shape()),
                       ", y: ", format_shape(y.shape()), ")"));
  }
  linear_forward<Scalar>(x.matrix(), weight_.matrix(), bias_view(), y.matrix());
}

template <class Scalar>
template <class XScalar, std::size_t Rank>
Tensor<Scalar, Rank> Linear<Scalar>::backward(const Tensor<XScalar, Rank>& x,
                                              const Tensor<XScalar, Rank>& dy) {
  if constexpr (!std::is_same_v<Scalar, XScalar>) {
    static_assert(detail::dependent_false<XScalar>,
                  "dissect::Linear<Scalar>: the input tensor's scalar type must match the layer's "
                  "(convert float <-> double explicitly; there is no silent precision change)");
    return {};
  } else {
    auto dx = Tensor<Scalar, Rank>::uninitialized(x.shape());
    backward_into(x, dy, dx);
    return dx;
  }
}

template <class Scalar>
template <std::size_t Rank>
void Linear<Scalar>::backward_into(const Tensor<Scalar, Rank>& x, const Tensor<Scalar, Rank>& dy,
                                   Tensor<Scalar, Rank>& dx) {
  check_backward("backward", x, dy);
  if (dx.shape() != x.shape()) {
    throw ShapeError(detail::concat("Linear::backward: dx has shape ", format_shape(dx.shape()),
                                    " but x has shape ", format_shape(x.shape())));
  }
  if (detail::shares_memory(dx, x) || detail::shares_memory(dx, dy)) {
    throw ShapeError(
        detail::concat("Linear::backward: dx aliases an input (x: ", format_shape(x.shape()),
                       ", dy: ", format_shape(dy.shape()), ")"));
  }
  linear_backward<Scalar>(x.matrix(), std::as_const(weight_).matrix(), dy.matrix(), dx.matrix(),
                          weight_grad_.matrix(), bias_grad_view());
}

template <class Scalar>
template <std::size_t Rank>
void Linear<Scalar>::backward_parameters(const Tensor<Scalar, Rank>& x,
                                         const Tensor<Scalar, Rank>& dy) {
  check_backward("backward_parameters", x, dy);
  linear_backward_parameters<Scalar>(x.matrix(), dy.matrix(), weight_grad_.matrix(),
                                     bias_grad_view());
}

template <class Scalar>
template <std::size_t Rank>
void Linear<Scalar>::check_backward(const char* op, const Tensor<Scalar, Rank>& x,
                                    const Tensor<Scalar, Rank>& dy) const {
  check_input(op, x);
  if (dy.shape() != output_shape(x.shape())) {
    throw ShapeError(detail::concat(
        "Linear::", op, ": dy has shape ", format_shape(dy.shape()), " but forward(x) has shape ",
        format_shape(output_shape(x.shape())), " (x: ", format_shape(x.shape()), ")"));
  }
}

template <class Scalar>
std::optional<VectorMap<Scalar>> Linear<Scalar>::bias_grad_view() {
  if (!has_bias_) return std::nullopt;
  return VectorMap<Scalar>(bias_grad_.data(), out_features_);
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const Linear<Scalar>& layer) {
  return out << "Linear(in_features=" << layer.in_features()
             << ", out_features=" << layer.out_features()
             << ", bias=" << (layer.has_bias() ? "true" : "false") << ")";
}

}  // namespace dissect
