// dissect/layers/dropout.hpp — Dropout<Scalar>: nn.Dropout, inverted, seeded, with train/eval mode.
//
// While training, each element of x is kept with probability 1 − p and scaled by 1/(1 − p), or
// dropped (multiplied by 0), so the expectation of y is x; in evaluation dropout is the identity.
// Masks come from the module's seed and a draw counter kept in the training Cache, so a run is
// reproducible and the module stays const while it trains (Sequential calls a const layer), as
// LoRALinear's dropout. backward multiplies dy by the very mask the forward used.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

struct DropoutOptions {
  /// The masks' seed; when empty, the next of the default sequence (manual_seed sets it), as
  /// Linear's initialisation.
  std::optional<std::uint64_t> seed{};
};

/// nn.Dropout(p) over x of any shape: y = x ⊙ m with m = 0 (dropped, probability p) or
/// 1/(1 − p) (kept), the scale rounded as torch's `bernoulli_(1 − p).div_(1 − p)`: 1 / Scalar(1 −
/// p). Dropping multiplies by 0, as torch, so a dropped NaN or Inf stays NaN. p = 0 is the
/// identity; p = 1 drops everything (y = x·0, as torch). A module without parameters and a
/// ModalLayer, training by default as torch.
template <class Scalar>
class Dropout : public ParameterMethods<Dropout<Scalar>> {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::Dropout<Scalar>: Scalar must be float or double");

 public:
  using scalar_type = Scalar;

  /// What backward needs: the shape and the mask m of the last training forward (empty when the
  /// forward was the identity: evaluation or p = 0), and how many masks this cache has drawn —
  /// the draw counter: mask k of a module comes from its seed and k alone.
  struct Cache {
    std::vector<index_t> shape;
    Tensor<Scalar, 1> mask{Shape<1>{0}};
    bool masked = false;
    std::uint64_t draws = 0;
  };

  /// @throws ConfigError "Dropout: p must be in [0, 1] (got …)" for p outside it or NaN.
  explicit Dropout(double p = 0.5, DropoutOptions options = {});

  double p() const { return p_; }
  std::uint64_t seed() const { return seed_; }
  /// The kept elements' factor, 1/(1 − p) rounded as torch rounds it (∞ for p = 1: never used).
  Scalar scale() const { return Scalar(1) / static_cast<Scalar>(1.0 - p_); }

  /// The mode (ModalLayer): torch's module.train(mode) and module.training.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }

  /// No parameters: the module protocol with nothing to visit.
  template <class Visitor>
  void for_each_parameter(Visitor&&) const {}

  template <std::size_t Rank>
  Shape<Rank> output_shape(const Shape<Rank>& x_shape) const {
    return x_shape;
  }

  /// Inference: y = x in evaluation mode (or p = 0).
  /// @throws Error in training mode with p > 0: a mask must be drawn and kept for backward, which
  ///         is forward(x, cache)'s job (this const call has nowhere to keep the draw count).
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;

  /// The training step: in training mode (p > 0) draws mask number cache.draws from the seed,
  /// keeps it in `cache` and counts the draw; in evaluation (or p = 0) y = x and the cache records
  /// that nothing was masked.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x, Cache& cache) const;

  /// The training computation with a caller's mask `keep` (x's shape, each value 0 or 1, 1 =
  /// kept), whatever the mode: y = x ⊙ keep·scale(). How a mask drawn elsewhere (torch's) is
  /// replayed. @throws ShapeError if keep's shape is not x's; Error naming the index if a value
  ///         is neither 0 nor 1 (cache untouched).
  template <TensorLike X, TensorLike K>
  Tensor<Scalar, rank_of<X>> forward_masked(const X& x, const K& keep, Cache& cache) const;

  /// dx = dy ⊙ m with the cache's mask (dy itself when nothing was masked).
  /// @throws ShapeError if dy's or x's shape is not the one the cache was filled for.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const Cache& cache, const DY& dy) const;

 private:
  template <std::size_t Rank>
  static void record_shape(Cache& cache, const Shape<Rank>& shape) {
    cache.shape.assign(shape.begin(), shape.end());
  }

  double p_;
  std::uint64_t seed_;
  bool training_ = true;
};

/// "Dropout(p=0.1)".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const Dropout<Scalar>& dropout) {
  return out << "Dropout(p=" << dropout.p() << ")";
}

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline double require_dropout_probability(double p) {
  // !(a && b) also catches NaN, which compares false with everything. torch accepts p = 1.
  if (!(p >= 0.0 && p <= 1.0)) {
    throw ConfigError(concat("Dropout: p must be in [0, 1] (got ", p, ")"));
  }
  return p;
}

}  // namespace detail

template <class Scalar>
Dropout<Scalar>::Dropout(double p, DropoutOptions options)
    : p_(detail::require_dropout_probability(p)),
      seed_(options.seed ? *options.seed : next_default_seed()) {}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> Dropout<Scalar>::forward(const X& x) const {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  if (training_ && p_ > 0) {
    throw Error(detail::concat("Dropout::forward: in training mode (p = ", p_,
                               ") the mask must be kept for backward: call forward(x, cache), or "
                               "set_training(false) for inference (x: ",
                               format_shape(input.shape()), ")"));
  }
  auto y = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  y.view().copy_from(input);
  return y;
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> Dropout<Scalar>::forward(const X& x, Cache& cache) const {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  auto y = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  record_shape(cache, input.shape());
  if (!training_ || p_ == 0) {
    cache.masked = false;
    y.view().copy_from(input);
    return y;
  }
  auto mask = reuse_buffer(cache.mask, Shape<1>{input.size()});
  // One generator per draw, seeded by the module's seed and the draw's number: mask k is the
  // same whatever happened before it, and needs no state in the (const) module.
  Generator generator(seed_ + 0x9E3779B97F4A7C15ull * (cache.draws + 1));
  ++cache.draws;
  cache.masked = true;
  const Scalar kept = scale();
  for (index_t i = 0; i < mask.size(); ++i) {
    // Kept with probability 1 − p; a multiplication, not a select, so NaN·0 is NaN as in torch.
    mask.data()[i] = generator.uniform() < p_ ? Scalar(0) : kept;
    y.data()[i] = input.data()[i] * mask.data()[i];
  }
  return y;
}

template <class Scalar>
template <TensorLike X, TensorLike K>
Tensor<Scalar, rank_of<X>> Dropout<Scalar>::forward_masked(const X& x, const K& keep,
                                                           Cache& cache) const {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, K>();
  const auto input = const_view(x);
  const auto given = const_view(keep);
  if (!std::equal(given.shape().begin(), given.shape().end(), input.shape().begin(),
                  input.shape().end())) {
    throw ShapeError(detail::concat("Dropout::forward_masked: keep has shape ",
                                    format_shape(given.shape()), " but x has shape ",
                                    format_shape(input.shape())));
  }
  for (index_t i = 0; i < given.size(); ++i) {
    const Scalar k = given.data()[i];
    if (k != Scalar(0) && k != Scalar(1)) {
      throw Error(detail::concat("Dropout::forward_masked: keep[", i, "] = ", k,
                                 " is neither 0 nor 1 (keep: ", format_shape(given.shape()), ")"));
    }
  }
  auto y = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  auto mask = reuse_buffer(cache.mask, Shape<1>{input.size()});
  record_shape(cache, input.shape());
  cache.masked = true;
  const Scalar kept = scale();
  for (index_t i = 0; i < mask.size(); ++i) {
    // p = 1 keeps nothing whatever keep says: torch's x·0, never 1·∞.
    mask.data()[i] = given.data()[i] == Scalar(1) && p_ < 1 ? kept : Scalar(0);
    y.data()[i] = input.data()[i] * mask.data()[i];
  }
  return y;
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> Dropout<Scalar>::backward(const X& x, const Cache& cache,
                                                     const DY& dy) const {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  const auto input = const_view(x);
  const auto upstream = const_view(dy);
  if (upstream.shape() != input.shape()) {
    throw ShapeError(detail::concat("Dropout::backward: dy has shape ",
                                    format_shape(upstream.shape()), " but x has shape ",
                                    format_shape(input.shape())));
  }
  if (!std::equal(cache.shape.begin(), cache.shape.end(), input.shape().begin(),
                  input.shape().end()) ||
      (cache.masked && cache.mask.size() != input.size())) {
    throw ShapeError(detail::concat("Dropout::backward: the cache does not hold the mask of x ",
                                    format_shape(input.shape()),
                                    " (fill it with forward(x, cache))"));
  }
  auto dx = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  if (!cache.masked) {
    dx.view().copy_from(upstream);
    return dx;
  }
  for (index_t i = 0; i < dx.size(); ++i) dx.data()[i] = upstream.data()[i] * cache.mask.data()[i];
  return dx;
}

}  // namespace dissect
