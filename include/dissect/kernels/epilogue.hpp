// dissect/kernels/epilogue.hpp — what the packed GEMM applies to each output tile while it is
// still in registers, so that y = f(x·Wᵀ + b) + r is written once instead of being written by
// the product, then read and written again by the bias, the activation and the residual add.
#pragma once

#include <optional>

#include "dissect/core/shape.hpp"
#include "dissect/tensor/activation.hpp"

namespace dissect {

/// The fused epilogue of packed_matmul, applied in this order to each accumulated value a:
///   plain weight:  y = act(a + bias) + residual
///   gated weight:  y = act(a_gate + bias) · (a_up + up_bias) + residual  (SwiGLU with silu)
/// Every part is optional: a default Epilogue stores x·Wᵀ as it is. The pointers are borrowed
/// for the call only and must not overlap y.
struct Epilogue {
  const float* bias = nullptr;  ///< [N]; for a gated weight the gate's bias [F]
  std::optional<Activation> activation = std::nullopt;  ///< after the bias (the gate's when gated)
  const float* up_bias = nullptr;   ///< gated weights only: the up projection's bias [F]
  const float* residual = nullptr;  ///< [M, N], row m at residual + m·residual_stride
  index_t residual_stride = 0;
};

}  // namespace dissect
