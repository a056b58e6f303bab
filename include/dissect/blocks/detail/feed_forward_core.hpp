// dissect/blocks/detail/feed_forward_core.hpp — private: do not include directly
// (dissect/blocks/feed_forward.hpp and dissect/blocks/gated_feed_forward.hpp do).
//
// FeedForwardCore, what FeedForward (D → F → D) and GatedFeedForward (SwiGLU) share: the
// projections, their seeds and names, the packed forward without a cache, the input check. The
// steps both FFNs' training forwards and backwards share with the tensor-parallel FFNs are public,
// in dissect/blocks/block_parts.hpp.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/blocks/detail/feed_forward_core.hpp is private to dissect: include dissect/blocks/feed_forward.hpp instead"
#endif

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/blocks/block_options.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/detail/packed_fusion.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/kernels/packed_weight.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect::detail {

// ---- declarations -------------------------------------------------------------------------------

/// What the two FFNs share: D, F, their N projections D → F (the first N − 1) and F → D (the
/// last, "down"), the forward without a cache and the input check. Members are built in order
/// (gate, up, down), taking consecutive seeds.
template <class Derived, class Scalar, std::size_t N>
class FeedForwardCore : public ComposedModule<Derived> {
 public:
  using scalar_type = Scalar;

  index_t d_model() const { return d_model_; }
  index_t d_ff() const { return d_ff_; }
  /// [D] → [F] (GPT-2's c_fc, LLaMA's w3).
  Linear<Scalar>& up() { return layers_[N - 2]; }
  const Linear<Scalar>& up() const { return layers_[N - 2]; }
  /// [F] → [D] (GPT-2's c_proj, LLaMA's w2).
  Linear<Scalar>& down() { return layers_[N - 1]; }
  const Linear<Scalar>& down() const { return layers_[N - 1]; }
  // for_each_parameter ("gate.*", "up.*", "down.*"), zero_grad, parameter_count: from
  // ComposedModule.

  /// x: [B, T, D] → y: [B, T, D], keeping nothing: fused when packed.
  /// @throws ShapeError if x is not [B, T, D].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x) const { return forward_fused(x, {}); }
  /// y = forward(x) + residual, the residual [B, T, D] added in the down projection's epilogue
  /// when packed. @throws ShapeError if x or the residual is not [B, T, D].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x,
                            ConstTensorView<Scalar, 3> residual) const;

  /// Packs the block for inference and freezes it (see blocks/detail/packed_fusion.hpp).
  void pack() requires std::is_same_v<Scalar, float>;
  void unpack();
  /// Whether forward without a cache runs fused: packed, and unchanged since.
  bool packed() const;

 protected:
  FeedForwardCore(const char* block, index_t d_model, index_t d_ff, bool bias, InitScheme init,
                  std::optional<std::uint64_t> seed);

  void check_input(const char* op, ConstTensorView<Scalar, 3> x) const;
  /// forward(x) (+ residual when given): fused if packed() holds, else through the cache form.
  Tensor<Scalar, 3> forward_fused(ConstTensorView<Scalar, 3> x,
                                  std::optional<ConstTensorView<Scalar, 3>> residual) const;

  index_t d_model_, d_ff_;
  std::array<Linear<Scalar>, N> layers_;  // (gate,) up, down
  /// What pack() built for the D → F products: up alone, or gate and up side by side; and the
  /// weight generations of the layers it was built from.
  std::optional<PackedWeight> packed_in_;
  std::array<std::uint64_t, N> packed_generations_{};

 private:
  friend class ComposedModule<Derived>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    constexpr std::array<std::string_view, 3> names{module_names::gate, module_names::up,
                                                    module_names::down};
    for (std::size_t i = 0; i < N; ++i) visit_child(names[3 - N + i], self.layers_[i], visit);
  }
};

// ---- implementation -----------------------------------------------------------------------------

template <class Derived, class Scalar, std::size_t N>
FeedForwardCore<Derived, Scalar, N>::FeedForwardCore(const char* block, index_t d_model,
                                                     index_t d_ff, bool bias, InitScheme init,
                                                     std::optional<std::uint64_t> seed)
    : d_model_(require_positive(block, "d_model", d_model)),
      d_ff_(require_positive(block, "d_ff", d_ff)),
      layers_([&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::array<Linear<Scalar>, N>{
            Linear<Scalar>(I + 1 < N ? d_model_ : d_ff_, I + 1 < N ? d_ff_ : d_model_,
                           member_options(bias, init, seed, I))...};
      }(std::make_index_sequence<N>{})) {}

template <class Derived, class Scalar, std::size_t N>
void FeedForwardCore<Derived, Scalar, N>::check_input(const char* op,
                                                      ConstTensorView<Scalar, 3> x) const {
  check_block_tokens(op, "x", x, "D", d_model_);
}

template <class Derived, class Scalar, std::size_t N>
void FeedForwardCore<Derived, Scalar, N>::pack() requires std::is_same_v<Scalar, float> {
  auto& up_layer = layers_[N - 2];
  for (auto& layer : layers_) {
    if (layer.quantized()) {
      throw Error("FeedForward::pack: a layer is quantised; its own kernels already run packed");
    }
    if (layer.bitlinear()) {
      throw Error("FeedForward::pack: a layer runs as BitLinear, which packing would bypass");
    }
    layer.set_frozen(true);
  }
  layers_[N - 1].pack();
  if constexpr (N == 3) {
    const auto& gate = layers_[0];
    packed_in_.emplace(PackedWeight::gated(gate.weight().data(), up_layer.weight().data(), d_ff_,
                                           d_model_, d_model_, d_model_));
  } else {
    packed_in_.emplace(up_layer.weight().data(), d_ff_, d_model_, d_model_);
  }
  for (std::size_t i = 0; i < N; ++i) packed_generations_[i] = layers_[i].weight_generation();
}

template <class Derived, class Scalar, std::size_t N>
void FeedForwardCore<Derived, Scalar, N>::unpack() {
  packed_in_.reset();
  layers_[N - 1].unpack();
}

template <class Derived, class Scalar, std::size_t N>
bool FeedForwardCore<Derived, Scalar, N>::packed() const {
  if (!packed_in_ || !runs_packed(layers_[N - 1])) return false;
  for (std::size_t i = 0; i + 1 < N; ++i) {
    const auto& layer = layers_[i];
    if (layer.weight_generation() != packed_generations_[i] || layer.has_adapter()) return false;
  }
  return true;
}

template <class Derived, class Scalar, std::size_t N>
Tensor<Scalar, 3> FeedForwardCore<Derived, Scalar, N>::forward(
    ConstTensorView<Scalar, 3> x, ConstTensorView<Scalar, 3> residual) const {
  check_input("FeedForward::forward", x);
  check_block_shape("FeedForward::forward", "residual", residual, token_shape_text("D", d_model_),
                    x.shape(), "x", format_shape(x.shape()));
  return forward_fused(x, residual);
}

template <class Derived, class Scalar, std::size_t N>
Tensor<Scalar, 3> FeedForwardCore<Derived, Scalar, N>::forward_fused(
    ConstTensorView<Scalar, 3> x, std::optional<ConstTensorView<Scalar, 3>> residual) const {
  const auto& self = static_cast<const Derived&>(*this);
  if (!packed()) {
    typename Derived::Cache scratch;
    auto y = self.forward(x, scratch);
    if (residual) add_residual<Scalar>(y, *residual);
    return y;
  }
  check_input("FeedForward::forward", x);
  auto hidden = Tensor<Scalar, 3>::uninitialized({x.dim(0), x.dim(1), d_ff_});
  if constexpr (N == 3) {  // silu(x·W_gᵀ + b_g) ⊙ (x·W_uᵀ + b_u) in one product
    packed_forward<Scalar, 3>(layers_[0], x, hidden.view(), std::nullopt, Activation::silu,
                              &*packed_in_, &layers_[1]);
  } else {
    packed_forward<Scalar, 3>(layers_[0], x, hidden.view(), std::nullopt, self.activation(),
                              &*packed_in_);
  }
  auto y = Tensor<Scalar, 3>::uninitialized(x.shape());
  packed_forward<Scalar, 3>(layers_[N - 1], hidden.cview(), y.view(), residual);
  return y;
}

}  // namespace dissect::detail
