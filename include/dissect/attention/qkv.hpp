// dissect/attention/qkv.hpp — QKV<Scalar>: the per-head queries, keys and values of one attention
// layer.
//
// QKVProjection makes them from x, causal_attention reads them, and both backwards hand their
// gradients back in the same struct. It needs only tensors, so attention.hpp can name it without
// pulling in the blocks.
#pragma once

#include "dissect/tensor/tensor.hpp"

namespace dissect {

/// What QKVProjection::forward returns (and its backward can take as gradients).
template <class Scalar>
struct QKV {
  Tensor<Scalar, 4> q;  ///< [B, H, T, d_k]
  Tensor<Scalar, 4> k;  ///< [B, H_kv, T, d_k]
  Tensor<Scalar, 4> v;  ///< [B, H_kv, T, d_k]
};

}  // namespace dissect
