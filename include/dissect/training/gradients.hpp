// dissect/training/gradients.hpp — what a training step does to the gradients between backward and
// step: accumulate them over micro-batches, scale them, clip them by their global norm.
//
// Accumulation needs no machinery: every backward *adds* into the gradients (module.hpp) until
// zero_grad, as in PyTorch. k micro-batches whose losses are means over their own tokens give
// Σ_k ∇L_k; scale_grad(model, 1.0 / k) turns that into the gradient of the mean over their union
// (for micro-batches of equal size), what torch users get by dividing each loss by k. Clipping is
// torch.nn.utils.clip_grad_norm_, over a model or the parameter list an optimizer holds.
#pragma once

#include <cmath>
#include <cstddef>
#include <limits>
#include <string>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/training/optim.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

struct ClipGradOptions {
  /// p of the norm: finite and > 0, or ∞ (the largest |g|). torch's default 2.
  double norm_type = 2;
  /// true: a non-finite total norm throws and leaves the gradients alone; false (torch's default):
  /// they are scaled by max_norm/(norm + 1e-6) anyway, which makes them 0 or NaN.
  bool error_if_nonfinite = false;
};

/// torch.nn.utils.clip_grad_norm_: the total p-norm of all gradients as one vector,
/// ‖(‖g₁‖, ‖g₂‖, …)‖ = (Σ|g|ᵖ)^(1/p) (max |g| for p = ∞), then every gradient is multiplied by
/// min(1, max_norm/(norm + 1e-6)), computed in Scalar as torch computes it in the gradients' dtype.
/// As torch, the multiplication happens even when the factor is 1 (a no-op then). The norm is
/// accumulated in double and rounded to Scalar once. Frozen parameters (no gradient) are not
/// part of a module's list; an empty list has norm 0.
/// @returns the total norm, as torch returns it (before clipping).
/// @throws ConfigError naming the field if max_norm is not > 0 (NaN included; +∞ only measures)
///         or norm_type is not > 0; Error naming the norm type, its value and the first
///         parameter with a non-finite gradient, if error_if_nonfinite and the norm is NaN or
///         ±∞ (gradients untouched).
template <class Scalar>
Scalar clip_grad_norm(const std::vector<ParameterRef<Scalar>>& parameters, double max_norm,
                      ClipGradOptions options = {});
/// The same over every trainable parameter of `module`.
template <Module M>
typename M::scalar_type clip_grad_norm(M& module, double max_norm, ClipGradOptions options = {});

/// Multiplies every gradient by `factor` (in Scalar): after k accumulated micro-batches,
/// scale_grad(model, 1.0 / k) gives the gradient of the union's mean loss.
/// @throws ConfigError if factor is not finite (gradients untouched).
template <class Scalar>
void scale_grad(const std::vector<ParameterRef<Scalar>>& parameters, double factor);
template <Module M>
void scale_grad(M& module, double factor);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// (Σ|g|ᵖ)^(1/p) over every gradient, or max |g| for p = ∞; NaN if any |g| is NaN, as torch.
template <class Scalar>
double total_grad_norm(const std::vector<ParameterRef<Scalar>>& parameters, double p) {
  double total = 0;
  bool nan = false;
  for (const auto& parameter : parameters) {
    for (const Scalar g : parameter.grad) {
      const double a = std::abs(static_cast<double>(g));
      nan = nan || std::isnan(a);
      if (std::isinf(p)) {
        total = a > total ? a : total;
      } else if (p == 2) {
        // Float gradients cannot overflow this (a square is < 1e77); double ones beyond 1e154 can,
        // and the norm is then ∞, as the error_if_nonfinite message says.
        total += a * a;
      } else if (p == 1) {
        total += a;
      } else {
        total += std::pow(a, p);
      }
    }
  }
  if (nan) return std::numeric_limits<double>::quiet_NaN();
  if (std::isinf(p) || p == 1) return total;
  return p == 2 ? std::sqrt(total) : std::pow(total, 1 / p);
}

/// The first parameter whose gradient holds NaN or ±∞, for the message.
template <class Scalar>
std::string first_nonfinite_gradient(const std::vector<ParameterRef<Scalar>>& parameters) {
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const auto& grad = parameters[i].grad;
    for (index_t k = 0; k < grad.size(); ++k) {
      if (!std::isfinite(grad.data()[k])) {
        return concat("; first at ", describe_parameter(i, parameters[i]), " [",
                      parameters[i].size(), " values], element ", k, " = ",
                      static_cast<double>(grad.data()[k]));
      }
    }
  }
  // Every gradient is finite but the norm overflows (Σ|g|ᵖ in double, or the norm in Scalar).
  return "; every gradient is finite, their norm overflows";
}

}  // namespace detail

template <class Scalar>
Scalar clip_grad_norm(const std::vector<ParameterRef<Scalar>>& parameters, double max_norm,
                      ClipGradOptions options) {
  if (!(max_norm > 0)) {
    throw ConfigError(detail::concat("clip_grad_norm: max_norm must be > 0 (got ", max_norm, ")"));
  }
  const double p = options.norm_type;
  if (!(p > 0)) {
    throw ConfigError(detail::concat("clip_grad_norm: norm_type must be > 0 or inf (got ", p, ")"));
  }
  const auto norm = static_cast<Scalar>(detail::total_grad_norm(parameters, p));
  if (options.error_if_nonfinite && !std::isfinite(norm)) {
    throw Error(detail::concat("clip_grad_norm: the total norm of order ", p, " of ",
                               parameters.size(), " parameters' gradients is ",
                               static_cast<double>(norm),
                               detail::first_nonfinite_gradient(parameters),
                               " (error_if_nonfinite: the gradients are left unscaled)"));
  }
  // torch: clip_coef = max_norm / (total_norm + 1e-6), both Python floats meeting a tensor of the
  // gradients' dtype; a float divided by a tensor is Tensor.__rtruediv__, reciprocal(t)·max_norm,
  // rounded twice. Then clamp(max=1.0), which keeps a NaN.
  Scalar coefficient =
      Scalar(1) / (norm + static_cast<Scalar>(1e-6)) * static_cast<Scalar>(max_norm);
  if (coefficient > Scalar(1)) coefficient = Scalar(1);
  for (const auto& parameter : parameters) {
    for (Scalar& g : parameter.grad) g *= coefficient;
  }
  return norm;
}

template <Module M>
typename M::scalar_type clip_grad_norm(M& module, double max_norm, ClipGradOptions options) {
  return clip_grad_norm(parameters_of(module), max_norm, options);
}

template <class Scalar>
void scale_grad(const std::vector<ParameterRef<Scalar>>& parameters, double factor) {
  if (!std::isfinite(factor)) {
    throw ConfigError(detail::concat("scale_grad: factor must be finite (got ", factor, ")"));
  }
  const auto s = static_cast<Scalar>(factor);
  for (const auto& parameter : parameters) {
    for (Scalar& g : parameter.grad) g *= s;
  }
}

template <Module M>
void scale_grad(M& module, double factor) {
  scale_grad(parameters_of(module), factor);
}

}  // namespace dissect
