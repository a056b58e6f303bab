// dissect/blocks/feed_forward.hpp — FeedForward, GPT-2's MLP: D → F → D with an activation.
//
// forward(x, cache) keeps what backward needs; backward returns dx and adds into up's and down's
// gradients. pack() readies a float block for inference: the bias and activation are fused into
// the up projection's product, the residual into down's (blocks/detail/packed_fusion.hpp).
#pragma once

#include <optional>
#include <ostream>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/blocks/block_options.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/detail/feed_forward_core.hpp"
#include "dissect/blocks/detail/print_block.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// GPT-2's MLP: y = down(f(up(x))), up: D → F, down: F → D (c_fc and c_proj).
///
/// Backward needs up(x) and f(up(x)). Rather than recompute them (one more [B·T, D]×[D, F]
/// GEMM, a quarter of backward's own work), forward(x, cache) keeps them: 2·B·T·F values, the
/// activation memory of training. Reusing one cache across steps of the same shape allocates
/// nothing for it after the first.
template <class Scalar>
class FeedForward : public detail::FeedForwardCore<FeedForward<Scalar>, Scalar, 2> {
  using Core = detail::FeedForwardCore<FeedForward<Scalar>, Scalar, 2>;

 public:
  /// What backward needs from forward; fill with forward(x, cache).
  struct Cache {
    Tensor<Scalar, 3> hidden;     ///< up(x): [B, T, F]
    Tensor<Scalar, 3> activated;  ///< f(hidden): [B, T, F]
  };

  /// d_ff defaults to 4·d_model and the activation to GPT-2's GELU (tanh form).
  /// @throws ConfigError naming the field if d_model or d_ff is ≤ 0.
  explicit FeedForward(index_t d_model, std::optional<index_t> d_ff = std::nullopt,
                       Activation activation = Activation::gelu_tanh, BlockOptions options = {});

  Activation activation() const { return activation_; }

  using Core::forward;
  /// As forward, keeping what backward needs in `cache` (its buffers reused if shaped right).
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const;

  /// x: [B, T, D], cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D]; adds to the
  /// gradients of up and down. A cache of the right shape but from another x is not detected.
  /// @throws ShapeError (gradients untouched) if x, dy or the cache does not fit.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy);

 private:
  Activation activation_;
};

/// "FeedForward(d_model=768, d_ff=3072, activation=gelu_tanh, bias=true)".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const FeedForward<Scalar>& block);

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
FeedForward<Scalar>::FeedForward(index_t d_model, std::optional<index_t> d_ff,
                                 Activation activation, BlockOptions options)
    : Core("FeedForward", d_model,
           d_ff ? *d_ff : checked_mul(4, d_model, "FeedForward: d_ff = 4·d_model"), options.bias,
           options.init, options.seed),
      activation_(check_activation("FeedForward", activation)) {}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x, Cache& cache) const {
  this->check_input("FeedForward::forward", x);
  forward_into_cache(this->up(), x, cache.hidden);
  reuse_buffer(cache.activated, cache.hidden.shape());
  activate_into(cache.hidden, cache.activated, activation_);
  return this->down().forward(cache.activated);
}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                                                ConstTensorView<Scalar, 3> dy) {
  check_ffn_backward<Scalar>(
      "FeedForward::backward", this->d_model_, this->d_ff_, x, dy,
      {{"cache.hidden", cache.hidden}, {"cache.activated", cache.activated}});
  auto d_hidden = this->down().backward(cache.activated, dy);             // d f(hidden)
  activate_backward_into(cache.hidden, d_hidden, d_hidden, activation_);  // in place: d hidden
  return this->up().backward(x, d_hidden);
}

// ---- printing -----------------------------------------------------------------------------------

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const FeedForward<Scalar>& b) {
  return detail::print_block(out, "FeedForward", {{"d_model", b.d_model()}, {"d_ff", b.d_ff()}},
                             b.up().has_bias(), to_string(b.activation()));
}

}  // namespace dissect
