// dissect/blocks/gated_feed_forward.hpp — GatedFeedForward, LLaMA's SwiGLU FFN.
//
// y = down(silu(gate(x)) ⊙ up(x)); forward(x, cache) keeps what backward needs, backward returns
// dx and adds into the three projections' gradients. pack() readies a float block for inference:
// gate and up are packed side by side so that silu(gate)·up is one product
// (blocks/detail/packed_fusion.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <utility>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/blocks/block_options.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/detail/feed_forward_core.hpp"
#include "dissect/blocks/detail/print_block.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// BlockOptions with LLaMA's default: no biases.
struct GatedFeedForwardOptions {
  bool bias = false;
  InitScheme init = InitScheme::pytorch_default;
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// LLaMA's SwiGLU: y = down(silu(gate(x)) ⊙ up(x)), gate, up: D → F, down: F → D (w1, w3, w2).
/// Caches as FeedForward does: gate(x), up(x) and their product, 3·B·T·F values, instead of
/// recomputing two GEMMs (a third of backward's work).
template <class Scalar>
class GatedFeedForward : public detail::FeedForwardCore<GatedFeedForward<Scalar>, Scalar, 3> {
  using Core = detail::FeedForwardCore<GatedFeedForward<Scalar>, Scalar, 3>;

 public:
  /// @throws ConfigError naming the field if d_model or d_ff is ≤ 0.
  GatedFeedForward(index_t d_model, index_t d_ff, GatedFeedForwardOptions options = {});

  /// [D] → [F] (LLaMA's w1), through SiLU.
  Linear<Scalar>& gate() { return this->layers_[0]; }
  const Linear<Scalar>& gate() const { return this->layers_[0]; }

  /// What backward needs from forward; fill with forward(x, cache).
  struct Cache {
    Tensor<Scalar, 3> gate;    ///< gate(x): [B, T, F]
    Tensor<Scalar, 3> up;      ///< up(x): [B, T, F]
    Tensor<Scalar, 3> hidden;  ///< silu(gate) ⊙ up: [B, T, F]
  };

  using Core::forward;
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const;

  /// x: [B, T, D], cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D]; adds to the
  /// gradients of gate, up and down. @throws ShapeError (gradients untouched) on a misfit.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy);
};

/// "GatedFeedForward(d_model=4096, d_ff=11008, bias=false)".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const GatedFeedForward<Scalar>& block);

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
GatedFeedForward<Scalar>::GatedFeedForward(index_t d_model, index_t d_ff,
                                           GatedFeedForwardOptions options)
    : Core("GatedFeedForward", d_model, d_ff, options.bias, options.init, options.seed) {}

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x,
                                                    Cache& cache) const {
  this->check_input("GatedFeedForward::forward", x);
  forward_into_cache(gate(), x, cache.gate);
  forward_into_cache(this->up(), x, cache.up);
  reuse_buffer(cache.hidden, cache.gate.shape());
  swiglu_into<Scalar>(cache.gate, cache.up, cache.hidden);
  return this->down().forward(cache.hidden);
}

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                     const Cache& cache,
                                                     ConstTensorView<Scalar, 3> dy) {
  check_ffn_backward<Scalar>(
      "GatedFeedForward::backward", this->d_model_, this->d_ff_, x, dy,
      {{"cache.gate", cache.gate}, {"cache.up", cache.up}, {"cache.hidden", cache.hidden}});
  // d hidden → d up = d hidden ⊙ silu(gate) and d gate = silu'(gate) · (d hidden ⊙ up), the
  // latter written over d hidden once both are read.
  auto d_gate = this->down().backward(cache.hidden, dy);  // d hidden: [B, T, F]
  auto d_up = Tensor<Scalar, 3>::uninitialized(d_gate.shape());
  swiglu_backward_into<Scalar>(cache.gate, cache.up, d_gate, d_up);
  auto dx = gate().backward(x, d_gate);
  dx.vector() += this->up().backward(x, d_up).vector();
  return dx;
}

// ---- printing -----------------------------------------------------------------------------------

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const GatedFeedForward<Scalar>& b) {
  const auto sizes = {std::pair<const char*, index_t>{"d_model", b.d_model()}, {"d_ff", b.d_ff()}};
  return detail::print_block(out, "GatedFeedForward", sizes, b.gate().has_bias());
}

}  // namespace dissect
