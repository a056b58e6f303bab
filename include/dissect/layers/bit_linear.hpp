// dissect/layers/bit_linear.hpp — BitLinear<Scalar>: BitNet b1.58's linear layer, ternary weights
// and int8 activations, trained with the straight-through estimator.
//
// Source: Ma et al., "The Era of 1-bit LLMs: All Large Language Models are in 1.58 Bits" (arXiv
// 2402.17764) and Microsoft's "The Era of 1-bit LLMs: Training Tips, Code and FAQ"
// (github.com/microsoft/unilm, bitnet/The-Era-of-1-bit-LLMs__Training_Tips_Code_FAQ.pdf), whose
// reference BitLinear normalises x with an RMSNorm, fake-quantises x per token (absmax, int8) and
// W per tensor (absmean, ternary), multiplies, and passes gradients straight through both
// quantisers by the detach() trick. Forward, with x̂ = RMSNorm(x) (or x, without the norm):
//
//   y = Q(x̂)·Q(W)ᵀ + b = (x̃·W̃ᵀ)·γ·β/127 + b
//
//   γ = max(mean|W|, 1e-5) over all of W,      W̃ = clamp(round(W/γ), −1, 1) ∈ {−1, 0, +1}
//   β = max(max_j |x̂_j|, 1e-5) per token,      x̃ = clamp(round(127·x̂/β), −128, 127) ∈ int8
//
// with round half to even (torch.round) and each step in Scalar as the reference computes it
// (quant/bitnet.hpp states the exact order of operations). The bias is dissect's addition (BitNet
// has none; off by default). Backward is the gradient of the surrogate x̂ + (Q(x̂) − x̂).detach()
// times (W + (Q(W) − W).detach())ᵀ: the quantisers are the identity for the gradient, so
//
//   dx̂ = dy·Q(W),   dW += dyᵀ·Q(x̂),   db += Σ dy,   and dx, dγ_norm by RMSNorm's backward of dx̂.
//
// Degenerate inputs, by the reference's clamps: an all-zero W (γ = 1e-5) gives W̃ = 0, y = b and
// dx = 0, while dW = dyᵀ·Q(x̂) still moves W off zero; a zero token gives Q(x̂) = 0. Non-finite
// values propagate, nothing throws: NaN or ±Inf in a token makes that token's y and dx NaN (its
// max is NaN/Inf, as in torch) and, through dW's sum over tokens, all of dW; NaN or ±Inf in W
// makes every output NaN.
//
// Which door: BitLinear is the paper's layer, the RMSNorm and the ternary product together, for
// a model written with it. To put an existing model's Linear layers in the same arithmetic, use
// Linear::set_bitlinear (defined here) or use_bitlinear for a whole model; BitLinear is that mode
// plus its norm, not a second implementation. BitNet's files, by layer: quant/bitnet.hpp (the
// quantisers), this header (the layer and Linear's mode), transforms/bitlinear.hpp (a model),
// and quant/ggml_type.hpp's tq2_0 (its GGUF storage).
//
// A whole model trains with ternary weights without a new model type: use_bitlinear
// (transforms/bitlinear.hpp) puts its Linear layers in the same arithmetic without the norm
// (Linear::set_bitlinear), where the blocks' own pre-norms already normalise most inputs.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <utility>

#define DISSECT_PUBLIC_HEADER  // the detail/ header below checks it (docs/architecture.md)
#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/layers/linear/detail/bitlinear_impl.hpp"
#include "dissect/layers/norm.hpp"
#include "dissect/quant/bitnet.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

struct BitLinearOptions {
  /// The RMSNorm before the quantiser, as the paper places it (its weight a parameter, "norm").
  bool norm = true;
  /// The norm's ε (dissect's and LLaMA's RMSNorm default; BitNet b1.58 2B4T's config uses 1e-5).
  double norm_eps = 1e-6;
  /// BitNet has no biases; dissect allows one, added after the quantised product.
  bool bias = false;
  InitScheme init = InitScheme::pytorch_default;
  /// Seed of the weight's generator; when empty, the next of the sequence manual_seed() sets.
  std::optional<std::uint64_t> seed = std::nullopt;
};

template <class Scalar>
class BitLinear : public ParameterMethods<BitLinear<Scalar>> {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::BitLinear<Scalar>: Scalar must be float or double");

 public:
  using scalar_type = Scalar;

  /// What backward needs from forward(x, cache): the norm's statistics and its output x̂ (the
  /// Linear's input), [tokens, in]. Reusable across steps.
  struct Cache {
    typename RMSNorm<Scalar>::Cache norm;
    Tensor<Scalar, 2> normed{Shape<2>{0, 0}};
  };

  /// A layer with a freshly initialised master weight (as Linear's) and, with options.norm, an
  /// RMSNorm of weight 1. @throws ShapeError for a negative feature count; ConfigError for a
  /// norm with in_features = 0 or a norm_eps that is not finite and > 0, or a bad InitScheme.
  BitLinear(index_t in_features, index_t out_features, BitLinearOptions options = {});
  /// Around given master weights [out, in] (and bias [out]).
  /// @throws ShapeError if the bias does not fit; ConfigError as above.
  BitLinear(Tensor<Scalar, 2> weight, std::optional<Tensor<Scalar, 1>> bias,
            BitLinearOptions options = {});

  index_t in_features() const { return linear_.in_features(); }
  index_t out_features() const { return linear_.out_features(); }
  bool has_bias() const { return linear_.has_bias(); }
  bool has_norm() const { return norm_.has_value(); }

  /// The float master weight W [out, in] the optimizer trains (values writable, buffer fixed).
  TensorView<Scalar, 2> weight() { return linear_.weight(); }
  ConstTensorView<Scalar, 2> weight() const { return linear_.weight(); }
  /// @throws Error if the layer has no bias.
  TensorView<Scalar, 1> bias() { return linear_.bias(); }
  ConstTensorView<Scalar, 1> bias() const { return linear_.bias(); }
  /// @throws ShapeError naming the parameter if the shape differs.
  void set_weight(ConstTensorView<Scalar, 2> weight) { linear_.set_weight(weight); }
  void set_bias(ConstTensorView<Scalar, 1> bias) { linear_.set_bias(bias); }
  /// @throws Error if frozen (or, bias_grad, without a bias).
  TensorView<Scalar, 2> weight_grad() { return linear_.weight_grad(); }
  ConstTensorView<Scalar, 2> weight_grad() const { return linear_.weight_grad(); }
  TensorView<Scalar, 1> bias_grad() { return linear_.bias_grad(); }
  ConstTensorView<Scalar, 1> bias_grad() const { return linear_.bias_grad(); }
  /// The RMSNorm before the quantiser. @throws Error if built with norm = false.
  RMSNorm<Scalar>& norm() { return with_norm(); }
  const RMSNorm<Scalar>& norm() const {
    if (!norm_) throw Error("BitLinear::norm: this layer was built with norm = false");
    return *norm_;
  }

  /// For deployment: W̃ ∈ {−1, 0, +1} [out, in] and γ, with Q(W) = W̃·γ up to the rounding of
  /// W̃/(1/γ) (the exact reference value); y = (x̃·W̃ᵀ)·γ·β/127 + b.
  LevelMatrix ternary_weight() const;
  Scalar weight_scale() const { return ternary_scale<Scalar>(linear_.weight().matrix()); }

  /// Freezes (PyTorch's requires_grad_(False)) W, b and the norm's weight together; backward
  /// then computes dx only.
  void set_frozen(bool frozen);
  bool frozen() const { return linear_.frozen(); }

  /// Visits "norm.weight" (with the norm), "weight" and "bias" (with a bias): the module
  /// protocol, as a torch BitLinear(nn.Linear) with its norm as the submodule "norm" names them.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit);
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const;

  template <std::size_t Rank>
  Shape<Rank> output_shape(const Shape<Rank>& x_shape) const {
    return linear_.output_shape(x_shape);
  }

  /// x: [..., in] → y: [..., out], any rank ≥ 1, empty leading axes allowed.
  /// @throws ShapeError naming BitLinear::forward and both shapes if x's last axis is not in.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;
  /// As forward, keeping what backward needs in `cache`.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x, Cache& cache) const;

  /// x and cache from forward(x, cache), dy: [..., out] → dx: [..., in]; adds into dW, db and the
  /// norm's dweight (the straight-through estimator, see the top of this file).
  /// @throws ShapeError (no gradient touched) if x's last axis is not in, dy is not forward(x)'s
  ///         shape, or the cache holds another x's.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const Cache& cache, const DY& dy);

 private:
  RMSNorm<Scalar>& with_norm();
  template <std::size_t Rank>
  void check_input(const char* op, const ConstTensorView<Scalar, Rank>& x) const;

  std::optional<RMSNorm<Scalar>> norm_;
  Linear<Scalar> linear_;  // in bitlinear mode: the quantised product and its backward
};

/// "BitLinear(in_features=64, out_features=32, bias=false, norm=RMSNorm(64, eps=1e-06))".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const BitLinear<Scalar>& layer);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
template <class Scalar>
std::optional<RMSNorm<Scalar>> bit_linear_norm(index_t in_features, const BitLinearOptions& o) {
  if (!o.norm) return std::nullopt;
  return RMSNorm<Scalar>(in_features, o.norm_eps);
}
}  // namespace detail

template <class Scalar>
BitLinear<Scalar>::BitLinear(index_t in_features, index_t out_features, BitLinearOptions options)
    : norm_(detail::bit_linear_norm<Scalar>(in_features, options)),
      linear_(in_features, out_features,
              LinearOptions{.bias = options.bias, .init = options.init, .seed = options.seed}) {
  linear_.set_bitlinear(true);
}

template <class Scalar>
BitLinear<Scalar>::BitLinear(Tensor<Scalar, 2> weight, std::optional<Tensor<Scalar, 1>> bias,
                             BitLinearOptions options)
    : norm_(detail::bit_linear_norm<Scalar>(weight.dim(1), options)),
      linear_(std::move(weight), std::move(bias)) {
  linear_.set_bitlinear(true);
}

template <class Scalar>
RMSNorm<Scalar>& BitLinear<Scalar>::with_norm() {
  return const_cast<RMSNorm<Scalar>&>(std::as_const(*this).norm());
}

template <class Scalar>
LevelMatrix BitLinear<Scalar>::ternary_weight() const {
  LevelMatrix levels(out_features(), in_features());
  ternary_levels<Scalar>(linear_.weight().matrix(), weight_scale(), levels);
  return levels;
}

template <class Scalar>
void BitLinear<Scalar>::set_frozen(bool frozen) {
  linear_.set_frozen(frozen);
  if (norm_) norm_->set_frozen(frozen);
}

template <class Scalar>
template <class Visitor>
void BitLinear<Scalar>::for_each_parameter(Visitor&& visit) {
  if (norm_) visit_child("norm", *norm_, visit);
  linear_.for_each_parameter(visit);
}

template <class Scalar>
template <class Visitor>
void BitLinear<Scalar>::for_each_parameter(Visitor&& visit) const {
  if (norm_) visit_child("norm", std::as_const(*norm_), visit);
  linear_.for_each_parameter(visit);
}

template <class Scalar>
template <std::size_t Rank>
void BitLinear<Scalar>::check_input(const char* op, const ConstTensorView<Scalar, Rank>& x) const {
  if (x.shape()[Rank - 1] != in_features()) {
    throw ShapeError(detail::concat("BitLinear::", op, ": input last dim ", x.shape()[Rank - 1],
                                    " != in_features ", in_features(),
                                    " (x: ", format_shape(x.shape()), ", weight: [", out_features(),
                                    ", ", in_features(), "])"));
  }
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> BitLinear<Scalar>::forward(const X& x) const {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  check_input("forward", input);
  if (!norm_) return linear_.forward(input);
  return linear_.forward(norm_->forward(input));
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> BitLinear<Scalar>::forward(const X& x, Cache& cache) const {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  check_input("forward", input);
  const Shape<2> rows{leading_count(input.shape()), in_features()};
  if (!norm_) {
    cache.norm = {};
    reuse_buffer(cache.normed, rows).copy_from(input.reshape(rows));
    return linear_.forward(input);
  }
  cache.normed = norm_->forward(input, cache.norm).reshape(rows);
  return linear_.forward(cache.normed.cview().reshape(input.shape()));
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> BitLinear<Scalar>::backward(const X& x, const Cache& cache,
                                                       const DY& dy) {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  const auto input = const_view(x);
  const auto upstream = const_view(dy);
  check_input("backward", input);
  if (upstream.shape() != output_shape(input.shape())) {
    throw ShapeError(detail::concat("BitLinear::backward: dy has shape ",
                                    format_shape(upstream.shape()), " but forward(x) has shape ",
                                    format_shape(output_shape(input.shape())),
                                    " (x: ", format_shape(input.shape()), ")"));
  }
  const Shape<2> rows{leading_count(input.shape()), in_features()};
  if (cache.normed.shape() != rows) {
    throw ShapeError(detail::concat("BitLinear::backward: the cache holds the product's input ",
                                    format_shape(cache.normed.shape()), ", x ",
                                    format_shape(input.shape()), " needs ", format_shape(rows),
                                    " (fill it with forward(x, cache))"));
  }
  const auto normed = cache.normed.cview().reshape(input.shape());
  // The norm's cache is checked before the Linear adds into dW: nothing is touched on a throw.
  if (norm_ && !std::equal(cache.norm.shape.begin(), cache.norm.shape.end(), input.shape().begin(),
                           input.shape().end())) {
    throw ShapeError(detail::concat("BitLinear::backward: the norm's cache is not of x ",
                                    format_shape(input.shape()),
                                    " (fill it with forward(x, cache))"));
  }
  auto d_normed = linear_.backward(normed, upstream);  // dx̂ = dy·Q(W), dW += dyᵀ·Q(x̂)
  if (!norm_) return d_normed;
  return norm_->backward(input, cache.norm, d_normed);
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const BitLinear<Scalar>& layer) {
  out << "BitLinear(in_features=" << layer.in_features()
      << ", out_features=" << layer.out_features()
      << ", bias=" << (layer.has_bias() ? "true" : "false");
  if (layer.has_norm()) out << ", norm=" << layer.norm();
  return out << (layer.frozen() ? ", frozen" : "") << ")";
}

}  // namespace dissect
