// dissect/blocks/detail/packed_fusion.hpp — private: do not include directly (the headers of
// dissect/blocks/ do).
//
// pack() readies a float block for inference (and freezes it): its weights are laid out once for
// the packed GEMM (kernels/gemm.hpp), and the forward without a cache then fuses what follows
// each product into it — the bias everywhere, the activation into the FFN's up projection,
// SwiGLU's silu(gate)·up into one product over gate and up packed side by side, and, through
// the residual forms, the residual add into the last projection. A packed block whose layers
// changed since (a new weight, an adapter) falls back to the unfused forward.
//
// This header holds the plumbing those forwards share: when a layer may run fused, the packed
// product with its epilogue, and the residual add of the unfused fallback.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/blocks/detail/packed_fusion.hpp is private to dissect: include dissect/blocks/attention_output.hpp instead"
#endif

#include <cstddef>
#include <optional>
#include <type_traits>

#include "dissect/core/error.hpp"
#include "dissect/kernels/epilogue.hpp"
#include "dissect/kernels/gemm.hpp"
#include "dissect/kernels/packed_weight.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect::detail {

/// Whether `layer`'s forward is exactly its packed product plus bias (no adapter term: none, or
/// one merged and unchanged since), so that a block may call the packed GEMM with more fused
/// into it.
template <class Scalar>
bool runs_packed(const Linear<Scalar>& layer) {
  return layer.packed() && !layer.adapter_adds_to_forward();
}

/// y = act(x·Wᵀ + b) + residual on a packed weight (`packed`, by default the layer's own), the
/// bias the layer's (and `up` 's for a gated weight). x, y: [..., in] / [..., out], contiguous.
template <class Scalar, std::size_t Rank>
void packed_forward(const Linear<Scalar>& layer, ConstTensorView<Scalar, Rank> x,
                    TensorView<Scalar, Rank> y,
                    std::optional<ConstTensorView<Scalar, Rank>> residual = std::nullopt,
                    std::optional<Activation> activation = std::nullopt,
                    const PackedWeight* packed = nullptr, const Linear<Scalar>* up = nullptr) {
  if constexpr (std::is_same_v<Scalar, float>) {
    const PackedWeight& w = packed ? *packed : layer.packed_weight();
    const index_t in = x.shape()[Rank - 1], out = y.shape()[Rank - 1];
    const Epilogue epilogue{.bias = layer.has_bias() ? layer.bias().data() : nullptr,
                            .activation = activation,
                            .up_bias = up && up->has_bias() ? up->bias().data() : nullptr,
                            .residual = residual ? residual->data() : nullptr,
                            .residual_stride = out};
    packed_matmul(x.data(), in, in ? x.size() / in : 0, w, y.data(), out, epilogue);
  } else {
    throw Error("packed_forward: packed weights are float only");
  }
}

/// y += residual (same shape, checked by the caller).
template <class Scalar>
void add_residual(Tensor<Scalar, 3>& y, ConstTensorView<Scalar, 3> residual) {
  for (index_t i = 0; i < y.size(); ++i) y.data()[i] += residual.data()[i];
}

}  // namespace dissect::detail
