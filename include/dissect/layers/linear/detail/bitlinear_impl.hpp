// dissect/layers/linear/detail/bitlinear_impl.hpp — private: do not include directly
// (dissect/layers/bit_linear.hpp includes it).
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
    "dissect/layers/linear/detail/bitlinear_impl.hpp is private to dissect: include dissect/layers/bit_linear.hpp instead"
#endif

#include <Eigen/Core>
#include <optional>
#include <string>

#include "dissect/core/error.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/quant/bitnet.hpp"

namespace dissect::detail {

/// Linear's BitLinear mode (a friend of Linear): set_bitlinear, and the product and backward on
/// Q(x) and Q(W) that replace the dense ones while it is on.
template <class Scalar>
struct LinearBitNetDoor {
  using Layer = Linear<Scalar>;

  static void set(Layer& layer, bool on) {
    if (on && !layer.bitlinear_) {
      layer.require_not_quantized("set_bitlinear");
      if (layer.storage_.packed()) {
        throw Error(
            "Linear::set_bitlinear: the layer is packed for float inference; unpack() first");
      }
      if (layer.adapter_) {
        throw Error("Linear::set_bitlinear: the layer carries a LoRA adapter; detach it first");
      }
    }
    if (on != layer.bitlinear_) ++layer.weight_generation_;  // forward reads W differently now
    layer.bitlinear_ = on;
    layer.product_calls_ = on ? &calls : nullptr;
  }

  static void forward(const Layer& layer, const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> y) {
    RowMatrix<Scalar> qx(x.rows(), x.cols()), qw(layer.out_features(), layer.in_features());
    int8_fake_quantize_rows<Scalar>(x, qx);
    ternary_fake_quantize<Scalar>(layer.weight_.matrix(), qw);
    linear_forward<Scalar>(qx, qw, layer.bias_map(), y);
  }

  static void backward(Layer& layer, const ConstMatrixRef<Scalar>& x,
                       const ConstMatrixRef<Scalar>& dy, std::optional<MatrixRef<Scalar>> dx) {
    if (dx) {
      RowMatrix<Scalar> qw(layer.out_features(), layer.in_features());
      ternary_fake_quantize<Scalar>(layer.weight_.matrix(), qw);
      linear_backward_input<Scalar>(qw, dy, *dx);  // dx = dy·Q(W)
    }
    if (layer.frozen_) return;
    RowMatrix<Scalar> qx(x.rows(), x.cols());
    int8_fake_quantize_rows<Scalar>(x, qx);
    linear_backward_parameters<Scalar>(qx, dy, layer.weight_grad_.matrix(), layer.bias_grad_map());
  }

  static std::string describe(const Layer&) { return "bitlinear"; }

  static constexpr LinearModeCalls<Scalar> calls{
      .forward = &forward,
      .backward = &backward,
      .describe = &describe,
      .weight_bytes = nullptr,
      .adds_to_forward = nullptr,
      .parameters = nullptr,
  };
};

}  // namespace dissect::detail
