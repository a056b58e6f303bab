// dissect/layers/linear/detail/bitlinear_impl.hpp — private: do not include directly (dissect/layers/linear.hpp
// includes it at its end, after the class).
//
// Linear's bitlinear mode: BitNet b1.58's quantised product and its straight-through backward.
// The quantisers are quant/bitnet.hpp's; the module that adds the RMSNorm is BitLinear
// (bit_linear.hpp). The reference computes the straight-through estimator as
// x + (Q(x) − x).detach() and W + (Q(W) − W).detach(): the value is Q(x)·Q(W)ᵀ and the Jacobian
// that of the bilinear product with Q(x) and Q(W) held fixed, which is what backward runs here on
// freshly recomputed Q(x) and Q(W) (forward keeps no state).
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/layers/linear/detail/bitlinear_impl.hpp is private to dissect: include dissect/layers/linear.hpp instead"
#endif

#include <Eigen/Core>
#include <optional>

#include "dissect/core/error.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/quant/bitnet.hpp"

namespace dissect {

template <class Scalar>
void Linear<Scalar>::require_not_bitlinear(const char* op) const {
  if (bitlinear_) {
    throw Error(detail::concat("Linear::", op,
                               ": the layer runs as BitLinear (set_bitlinear(true)); turn that "
                               "off first"));
  }
}

template <class Scalar>
void Linear<Scalar>::set_bitlinear(bool on) {
  if (on && !bitlinear_) {
    require_not_quantized("set_bitlinear");
    if (storage_.packed()) {
      throw Error("Linear::set_bitlinear: the layer is packed for float inference; unpack() first");
    }
    if (adapter_) {
      throw Error("Linear::set_bitlinear: the layer carries a LoRA adapter; detach it first");
    }
  }
  if (on != bitlinear_) ++weight_generation_;  // forward reads W differently now
  bitlinear_ = on;
}

template <class Scalar>
void Linear<Scalar>::bitlinear_forward(const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> y) const {
  RowMatrix<Scalar> qx(x.rows(), x.cols()), qw(out_features(), in_features());
  int8_fake_quantize_rows<Scalar>(x, qx);
  ternary_fake_quantize<Scalar>(weight_.matrix(), qw);
  linear_forward<Scalar>(qx, qw, bias_map(), y);
}

template <class Scalar>
void Linear<Scalar>::bitlinear_backward(const ConstMatrixRef<Scalar>& x,
                                        const ConstMatrixRef<Scalar>& dy,
                                        std::optional<MatrixRef<Scalar>> dx) {
  if (dx) {
    RowMatrix<Scalar> qw(out_features(), in_features());
    ternary_fake_quantize<Scalar>(weight_.matrix(), qw);
    linear_backward_input<Scalar>(qw, dy, *dx);  // dx = dy·Q(W)
  }
  if (frozen_) return;
  RowMatrix<Scalar> qx(x.rows(), x.cols());
  int8_fake_quantize_rows<Scalar>(x, qx);
  linear_backward_parameters<Scalar>(qx, dy, weight_grad_.matrix(), bias_grad_map());
}

}  // namespace dissect
