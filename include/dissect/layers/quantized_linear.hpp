// dissect/layers/quantized_linear.hpp — a Linear<float> whose W is stored in a low-precision
// format (quant/weight_format.hpp: bf16, int8, q4_0 and GGUF's block types): Linear::quantize,
// set_quantized_weight, release_dense_weight and dequantize are defined here, with the product
// forward then runs on the quantised weight. Include it to quantise a layer (the model loaders,
// the quantize transform and the GGUF readers do); linear.hpp alone gives the float layer and
// does not compile the formats' kernels.
#pragma once

#include <array>
#include <optional>
#include <string>
#include <utility>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/quant/weight_format.hpp"

namespace dissect::detail {

/// Linear's quantised storage (a friend of Linear): switching it on and off, and the calls forward
/// makes while it is on. Float only, but for dequantize (which a double layer refuses as not
/// quantised, as every layer that is not).
template <class Scalar>
struct LinearQuantizedDoor {
  using Layer = Linear<Scalar>;

  static void quantize(Layer& layer, WeightFormat format) {
    layer.require_not_quantized("quantize");
    layer.require_not_bitlinear("quantize");
    set(layer, QuantizedWeight::quantize(layer.weight_.cview(), format), DenseCopy::keep);
  }

  static void set(Layer& layer, QuantizedWeight weight, DenseCopy dense) {
    layer.require_not_quantized("set_quantized_weight");
    layer.require_not_bitlinear("set_quantized_weight");
    if (layer.merge_) {
      throw Error(
          "Linear::set_quantized_weight: the LoRA adapter is merged into the weight; "
          "unmerge it before quantising the base");
    }
    if (weight.rows() != layer.out_features() || weight.cols() != layer.in_features()) {
      throw ShapeError(concat("Linear::set_quantized_weight: quantised weight [", weight.rows(),
                              ", ", weight.cols(), "] does not fit weight [", layer.out_features(),
                              ", ", layer.in_features(), "]"));
    }
    if (dense == DenseCopy::keep) weight.dequantize_into(layer.weight_.view());
    layer.set_frozen(true);
    layer.storage_.set_quantized(std::move(weight));
    layer.product_calls_ = &calls;
    ++layer.weight_generation_;
    if (dense == DenseCopy::release) release_dense(layer);
  }

  static void release_dense(Layer& layer) {
    if (layer.released_) return;
    if (!layer.quantized()) {
      throw Error(concat("Linear::release_dense_weight: the layer ",
                         format_shape(layer.weight_.shape()),
                         " is not quantised; forward reads W itself"));
    }
    layer.released_shape_ = layer.weight_.shape();
    layer.released_ = true;
    layer.weight_ = Tensor<Scalar, 2>();
    ++layer.weight_generation_;
  }

  static void dequantize(Layer& layer) {
    if (!layer.quantized()) throw Error("Linear::dequantize: the layer is not quantised");
    (void)layer.dense("dequantize");  // forward would read W again
    layer.storage_.set_dense();
    layer.product_calls_ = nullptr;
    ++layer.weight_generation_;
  }

  static void forward(const Layer& layer, const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> y) {
    const QuantizedWeight& q = *layer.storage_.quantized();
    const float* bias = layer.has_bias_ ? layer.bias_.data() : nullptr;
    // At every m: prefill used to run these on one thread, as if Eigen threaded them.
    q.matmul(x.data(), x.outerStride(), x.rows(), y.data(), y.outerStride(), bias,
             threads_for_weights(q.rows() * q.cols()));
  }
  static std::string describe(const Layer& layer) { return layer.storage_.quantized()->describe(); }
  static index_t weight_bytes(const Layer& layer) { return layer.storage_.quantized()->bytes(); }

  static constexpr LinearModeCalls<Scalar> calls{
      .forward = &forward,
      .backward = nullptr,  // frozen: backward's dx = dy·Ŵ reads the dense Ŵ
      .describe = &describe,
      .weight_bytes = &weight_bytes,
      .adds_to_forward = nullptr,
      .parameters = nullptr,
  };
};

}  // namespace dissect::detail
