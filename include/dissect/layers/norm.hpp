// dissect/layers/norm.hpp — LayerNorm<Scalar> (GPT-2) and RMSNorm<Scalar> (LLaMA) over the last
// axis.
//
// LayerNorm: y = (x − mean)/√(var + eps)·γ + β, var biased (÷ D), exactly nn.LayerNorm's formula.
// RMSNorm:   y = x/√(mean(x²) + eps)·w, HF's LlamaRMSNorm with no bias and no centring.
// Both are one class template, Normalization<Scalar, Norm>, modules with fixed-shape parameter
// views like Linear; forward(x, cache) keeps each row's statistics for backward(x, cache, dy).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Normalisation over the last axis of x: [..., D] → [..., D], any rank, Tensor or view.
///
/// Numerics (both kinds): each row's statistics and each output are computed in double, also for
/// float inputs, and rounded to Scalar once at the end. The variance is two-pass, Σ(x − mean)²/D,
/// never E[x²] − mean², so a row of large equal values gives var = 0 exactly (a constant row of
/// floats has an exact mean in double) and y = β; mean(x²) cannot overflow for float inputs.
/// PyTorch rounds intermediate results to the input precision, so float32 results differ from
/// torch's by a few ulps of the row's scale; double results agree to rounding. NaN or Inf in a row
/// makes that row's y (and dx) NaN and leaves the other rows alone; backward then also poisons
/// dγ and dβ, whose sums run over every row, exactly as PyTorch does.
///
/// Backward, with x̂ = (x − mean)·rstd (mean = 0 for RMSNorm) and g = dy ⊙ γ, per row:
///   dx = rstd·(g − mean(g) − x̂·mean(g ⊙ x̂))   (RMSNorm: no mean(g) term)
///   dγ += Σ_rows dy ⊙ x̂,  dβ += Σ_rows dy   (accumulated in double, added once per call).
template <class Scalar, Norm kind>
class Normalization : public ParameterMethods<Normalization<Scalar, kind>> {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::LayerNorm/RMSNorm<Scalar>: Scalar must be float or double");
  static_assert(kind == Norm::layer_norm || kind == Norm::rms_norm,
                "dissect::Normalization: kind must be Norm::layer_norm or Norm::rms_norm");

 public:
  using scalar_type = Scalar;
  static constexpr bool centered = kind == Norm::layer_norm;
  /// "LayerNorm" or "RMSNorm": how messages and operator<< name the module.
  static constexpr const char* name = centered ? "LayerNorm" : "RMSNorm";
  /// nn.LayerNorm's 1e-5 (GPT-2's too); LLaMA's RMSNorm uses 1e-6.
  static constexpr double default_eps = centered ? 1e-5 : 1e-6;

  /// What backward needs from forward(x, cache): x's shape and each row's statistics, in double.
  /// Reusable across steps: buffers are reallocated only when the row count changes.
  struct Cache {
    std::vector<index_t> shape;  ///< x's shape at forward
    Tensor<double, 1> mean;      ///< [rows]; [0] for RMSNorm
    Tensor<double, 1> rstd;      ///< [rows]: 1/√(var + eps) (RMSNorm: 1/√(mean(x²) + eps))
  };

  /// γ = 1 (and β = 0), as torch initialises them.
  /// @throws ConfigError naming d_model if d_model ≤ 0, naming eps unless eps is finite and > 0.
  explicit Normalization(index_t d_model, double eps = default_eps);

  // Copied or moved into a new norm, never assigned over (ParameterMethods): its buffers keep
  // their address for its life. A moved-from norm has D = 0 (its tensors are empty).

  index_t d_model() const { return weight_.shape()[0]; }
  double eps() const { return eps_; }
  // parameter_count() and zero_grad() come from ParameterMethods (module.hpp).

  /// γ: [D]; values writable, shape and buffer fixed.
  TensorView<Scalar, 1> weight() { return weight_.view(); }
  ConstTensorView<Scalar, 1> weight() const { return weight_.cview(); }
  /// Gradients (γ's, β's): @throws Error if the norm is frozen.
  TensorView<Scalar, 1> weight_grad() { return with_grad("weight_grad", weight_grad_).view(); }
  ConstTensorView<Scalar, 1> weight_grad() const {
    return with_grad("weight_grad", weight_grad_).cview();
  }
  /// β: [D] (LayerNorm only).
  TensorView<Scalar, 1> bias() requires centered { return bias_.view(); }
  ConstTensorView<Scalar, 1> bias() const requires centered { return bias_.cview(); }
  TensorView<Scalar, 1> bias_grad() requires centered {
    return with_grad("bias_grad", bias_grad_).view();
  }
  ConstTensorView<Scalar, 1> bias_grad() const requires centered {
    return with_grad("bias_grad", bias_grad_).cview();
  }

  /// Freezing (requires_grad_(False)): the gradients are released and backward computes dx
  /// only; unfreezing allocates zeroed gradients. See module.hpp.
  void set_frozen(bool frozen) {
    frozen_ = frozen;
    set_gradient_frozen(weight_grad_, weight_.shape(), frozen);
    set_gradient_frozen(bias_grad_, bias_.shape(), frozen);
  }
  bool frozen() const { return frozen_; }

  /// Copies new values into the parameter (the buffer keeps its address).
  /// @throws ShapeError naming the parameter if the shape is not [D].
  void set_weight(ConstTensorView<Scalar, 1> weight) {
    assign_parameter(name, "weight", "[d_model]", weight_, weight);
  }
  void set_bias(ConstTensorView<Scalar, 1> bias) requires centered {
    assign_parameter(name, "bias", "[d_model]", bias_, bias);
  }

  /// Visits "weight" (and "bias") with their gradients: the module protocol.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit);
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const;

  /// [..., D] → [..., D].
  template <std::size_t Rank>
  Shape<Rank> output_shape(const Shape<Rank>& x_shape) const {
    return x_shape;
  }

  /// x: [..., D] → y: [..., D]. @throws ShapeError naming both shapes if x's last axis is not D.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;

  /// As forward, keeping each row's statistics in `cache` for backward.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x, Cache& cache) const;

  /// As forward, into a caller's y: [..., D] (old values never read).
  /// @throws ShapeError if y's shape differs from x's, or y shares memory with x or with the
  ///         module's parameters or gradients (y untouched).
  template <TensorLike X, WritableTensor Y>
  void forward_into(const X& x, Y&& y) const;

  /// x: [..., D], cache from forward(x, cache), dy: [..., D] → dx: [..., D]; adds to dγ (and dβ).
  /// @throws ShapeError (gradients untouched) if x's last axis is not D, dy's shape is not x's,
  ///         or the cache holds the statistics of another shape.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const Cache& cache, const DY& dy);

 private:
  Tensor<Scalar, 1>& with_grad(const char* accessor, Tensor<Scalar, 1>& grad) {
    require_gradient(name, accessor, frozen_);
    return grad;
  }
  const Tensor<Scalar, 1>& with_grad(const char* accessor, const Tensor<Scalar, 1>& grad) const {
    require_gradient(name, accessor, frozen_);
    return grad;
  }
  template <class X>
  static void check_scalar();
  template <std::size_t Rank>
  void check_input(const char* op, const ConstTensorView<Scalar, Rank>& x) const;
  /// check_input, and that `what` (dy, an output) has x's shape.
  template <std::size_t Rank>
  void check_like_x(const char* op, const char* what, const Shape<Rank>& shape,
                    const ConstTensorView<Scalar, Rank>& x) const;
  /// The row loop of every forward: y = normalise(x)·γ + β; stores mean and rstd when given.
  void normalize_rows(ConstMatrixMap<Scalar> x, MatrixMap<Scalar> y, double* mean,
                      double* rstd) const;

  double eps_;
  Tensor<Scalar, 1> weight_;
  Tensor<Scalar, 1> bias_;  // [0] for RMSNorm
  Tensor<Scalar, 1> weight_grad_;
  Tensor<Scalar, 1> bias_grad_;
  bool frozen_ = false;
};

/// nn.LayerNorm(D, eps): weight γ and bias β of [D].
template <class Scalar>
using LayerNorm = Normalization<Scalar, Norm::layer_norm>;
/// LLaMA's RMSNorm(D, eps): weight of [D], no bias.
template <class Scalar>
using RMSNorm = Normalization<Scalar, Norm::rms_norm>;

/// "LayerNorm(768, eps=1e-05)" / "RMSNorm(4096, eps=1e-06)".
template <class Scalar, Norm kind>
std::ostream& operator<<(std::ostream& out, const Normalization<Scalar, kind>& norm);

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar, Norm kind>
Normalization<Scalar, kind>::Normalization(index_t d_model, double eps)
    : eps_(require_positive_finite(name, "eps", eps)),
      weight_({require_positive(name, "d_model", d_model)}),
      bias_({centered ? d_model : 0}),
      weight_grad_(weight_.shape()),
      bias_grad_(bias_.shape()) {
  weight_.view().fill(Scalar(1));
}

template <class Scalar, Norm kind>
template <class Visitor>
void Normalization<Scalar, kind>::for_each_parameter(Visitor&& visit) {
  visit(ParameterName("weight"), weight_.view(), weight_grad_.view());
  if constexpr (centered) visit(ParameterName("bias"), bias_.view(), bias_grad_.view());
}

template <class Scalar, Norm kind>
template <class Visitor>
void Normalization<Scalar, kind>::for_each_parameter(Visitor&& visit) const {
  visit(ParameterName("weight"), weight_.cview(), weight_grad_.cview());
  if constexpr (centered) visit(ParameterName("bias"), bias_.cview(), bias_grad_.cview());
}

template <class Scalar, Norm kind>
template <class X>
void Normalization<Scalar, kind>::check_scalar() {
  static_assert(std::is_same_v<scalar_of<X>, Scalar>,
                "dissect::LayerNorm/RMSNorm<Scalar>: the tensor's scalar type must match the "
                "module's (convert float <-> double explicitly; there is no silent precision "
                "change)");
}

template <class Scalar, Norm kind>
template <std::size_t Rank>
void Normalization<Scalar, kind>::check_input(const char* op,
                                              const ConstTensorView<Scalar, Rank>& x) const {
  if (x.shape()[Rank - 1] != d_model()) {
    throw ShapeError(detail::concat(name, "::", op, ": input last dim ", x.shape()[Rank - 1],
                                    " != d_model ", d_model(), " (x: ", format_shape(x.shape()),
                                    ", weight: ", format_shape(weight_.shape()), ")"));
  }
}

template <class Scalar, Norm kind>
template <std::size_t Rank>
void Normalization<Scalar, kind>::check_like_x(const char* op, const char* what,
                                               const Shape<Rank>& shape,
                                               const ConstTensorView<Scalar, Rank>& x) const {
  check_input(op, x);
  if (shape != x.shape()) {
    throw ShapeError(detail::concat(name, "::", op, ": ", what, " has shape ", format_shape(shape),
                                    " but x has shape ", format_shape(x.shape())));
  }
}

template <class Scalar, Norm kind>
void Normalization<Scalar, kind>::normalize_rows(ConstMatrixMap<Scalar> x, MatrixMap<Scalar> y,
                                                 double* mean, double* rstd) const {
  const index_t rows = x.rows(), width = d_model();
  if (rows == 0 || width == 0) return;
  const Eigen::ArrayXd gamma = weight_.vector().template cast<double>().array();
  const Eigen::ArrayXd beta = centered ? Eigen::ArrayXd(bias_.vector().template cast<double>())
                                       : Eigen::ArrayXd::Zero(width);
  Eigen::ArrayXd centred(width);
  for (index_t r = 0; r < rows; ++r) {
    const auto row = x.row(r).transpose().template cast<double>().array();
    // sum()/D, not mean(): Eigen's mean() asserts on an empty row.
    const double mu = centered ? row.sum() / static_cast<double>(width) : 0.0;
    centred = row - mu;
    const double variance = centred.square().sum() / static_cast<double>(width);
    const double inverse = 1.0 / std::sqrt(variance + eps_);
    y.row(r) = ((centred * inverse) * gamma + beta).template cast<Scalar>().matrix().transpose();
    if (mean != nullptr && centered) mean[r] = mu;
    if (rstd != nullptr) rstd[r] = inverse;
  }
}

template <class Scalar, Norm kind>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> Normalization<Scalar, kind>::forward(const X& x) const {
  check_scalar<X>();
  const auto input = const_view(x);
  check_input("forward", input);
  auto y = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  normalize_rows(input.matrix(), y.matrix(), nullptr, nullptr);
  return y;
}

template <class Scalar, Norm kind>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> Normalization<Scalar, kind>::forward(const X& x, Cache& cache) const {
  check_scalar<X>();
  const auto input = const_view(x);
  check_input("forward", input);
  const index_t rows = leading_count(input.shape());
  auto y = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  cache.shape.assign(input.shape().begin(), input.shape().end());
  reuse_buffer(cache.mean, Shape<1>{centered ? rows : 0});
  reuse_buffer(cache.rstd, Shape<1>{rows});
  normalize_rows(input.matrix(), y.matrix(), cache.mean.data(), cache.rstd.data());
  return y;
}

template <class Scalar, Norm kind>
template <TensorLike X, WritableTensor Y>
void Normalization<Scalar, kind>::forward_into(const X& x, Y&& y) const {
  check_scalar<X>();
  check_scalar<Y>();
  const auto input = const_view(x);
  const auto output = writable_view(y);
  check_like_x("forward_into", "output", output.shape(), input);
  // A row's statistics are read from x before its y is written, but y overlapping another row
  // of x (or γ, β) would be read after being overwritten.
  const auto refuse = [&](const char* own, const auto& buffer) {
    if (output.overlaps(buffer)) {
      throw ShapeError(detail::concat(name, "::forward_into: output y ",
                                      format_shape(output.shape()), " aliases ", own, " ",
                                      format_shape(buffer.shape())));
    }
  };
  refuse("input x", input);
  refuse("the module's weight", weight_.cview());
  refuse("the module's bias", bias_.cview());
  refuse("the module's weight_grad", weight_grad_.cview());
  refuse("the module's bias_grad", bias_grad_.cview());
  normalize_rows(input.matrix(), output.matrix(), nullptr, nullptr);
}

template <class Scalar, Norm kind>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> Normalization<Scalar, kind>::backward(const X& x, const Cache& cache,
                                                                 const DY& dy) {
  check_scalar<X>();
  check_scalar<DY>();
  const auto input = const_view(x);
  const auto upstream = const_view(dy);
  check_like_x("backward", "dy", upstream.shape(), input);
  const index_t rows = leading_count(input.shape()), width = d_model();
  const bool cache_fits = std::equal(cache.shape.begin(), cache.shape.end(), input.shape().begin(),
                                     input.shape().end()) &&
                          cache.rstd.size() == rows && cache.mean.size() == (centered ? rows : 0);
  if (!cache_fits) {
    std::string cached = "[";
    for (std::size_t i = 0; i < cache.shape.size(); ++i) {
      cached += (i > 0 ? ", " : "") + std::to_string(cache.shape[i]);
    }
    cached += ']';
    throw ShapeError(detail::concat(name, "::backward: the cache holds statistics of x ", cached,
                                    ", not of x ", format_shape(input.shape()),
                                    " (fill it with forward(x, cache))"));
  }

  auto dx = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  if (rows == 0 || width == 0) return dx;
  const auto x_rows = input.matrix();
  const auto dy_rows = upstream.matrix();
  auto dx_rows = dx.matrix();
  const Eigen::ArrayXd gamma = weight_.vector().template cast<double>().array();
  Eigen::ArrayXd d_gamma = Eigen::ArrayXd::Zero(width), d_beta = Eigen::ArrayXd::Zero(width);
  Eigen::ArrayXd x_hat(width), upstream_row(width), g(width);
  const double inverse_width = 1.0 / static_cast<double>(width);
  for (index_t r = 0; r < rows; ++r) {
    const double mu = centered ? cache.mean.data()[r] : 0.0;
    const double rstd = cache.rstd.data()[r];
    x_hat = (x_rows.row(r).transpose().template cast<double>().array() - mu) * rstd;
    upstream_row = dy_rows.row(r).transpose().template cast<double>().array();
    g = upstream_row * gamma;
    const double mean_g = centered ? g.sum() * inverse_width : 0.0;
    const double mean_gx = (g * x_hat).sum() * inverse_width;
    dx_rows.row(r) =
        (rstd * (g - mean_g - x_hat * mean_gx)).template cast<Scalar>().matrix().transpose();
    d_gamma += upstream_row * x_hat;
    if constexpr (centered) d_beta += upstream_row;
  }
  if (frozen_) return dx;
  weight_grad_.vector() += d_gamma.matrix().template cast<Scalar>();
  if constexpr (centered) bias_grad_.vector() += d_beta.matrix().template cast<Scalar>();
  return dx;
}

template <class Scalar, Norm kind>
std::ostream& operator<<(std::ostream& out, const Normalization<Scalar, kind>& norm) {
  return out << Normalization<Scalar, kind>::name << "(" << norm.d_model() << ", eps=" << norm.eps()
             << ")";
}

}  // namespace dissect
