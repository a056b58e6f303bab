// dissect/tensor/detail/heads.hpp — private: do not include directly (dissect/blocks.hpp does).
//
// Moves per-head data between the token-major layout a Linear produces — rows [B, T, width]
// in which head h of a group owns columns column + h·d_k … column + (h+1)·d_k − 1 — and the
// head-major layout attention works on, [B, H, T, d_k]: PyTorch's
// view(B, T, H, d_k).transpose(1, 2) and its inverse, each as one pass of d_k-long copies.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/tensor/detail/heads.hpp is private to dissect: include any public dissect header (they share it) instead"
#endif

#include <algorithm>

#include "dissect/tensor/tensor.hpp"

namespace dissect::detail {

/// rows: [B, T, width] → heads: [B, H, T, d_k] (overwritten), taking columns
/// column … column + H·d_k − 1. The caller has checked that the shapes agree.
template <class Scalar>
void split_heads(ConstTensorView<Scalar, 3> rows, index_t column, TensorView<Scalar, 4> heads) {
  const index_t batch = heads.dim(0), n_heads = heads.dim(1), tokens = heads.dim(2),
                head_dim = heads.dim(3), width = rows.dim(2);
  const Scalar* source = rows.data();
  Scalar* target = heads.data();  // written in order
  for (index_t b = 0; b < batch; ++b) {
    for (index_t h = 0; h < n_heads; ++h) {
      for (index_t t = 0; t < tokens; ++t) {
        std::copy_n(source + (b * tokens + t) * width + column + h * head_dim, head_dim, target);
        target += head_dim;
      }
    }
  }
}

/// heads: [B, H, T, d_k] → rows: [B, T, width], writing columns column … column + H·d_k − 1
/// and leaving the others alone. The caller has checked that the shapes agree.
template <class Scalar>
void merge_heads(ConstTensorView<Scalar, 4> heads, TensorView<Scalar, 3> rows, index_t column) {
  const index_t batch = heads.dim(0), n_heads = heads.dim(1), tokens = heads.dim(2),
                head_dim = heads.dim(3), width = rows.dim(2);
  const Scalar* source = heads.data();  // read in order
  Scalar* target = rows.data();
  for (index_t b = 0; b < batch; ++b) {
    for (index_t h = 0; h < n_heads; ++h) {
      for (index_t t = 0; t < tokens; ++t) {
        std::copy_n(source, head_dim, target + (b * tokens + t) * width + column + h * head_dim);
        source += head_dim;
      }
    }
  }
}

}  // namespace dissect::detail
