// dissect/layers/linear/weight_storage.hpp — how a Linear's forward reads its weight: the dense
// values themselves, a copy laid out for the packed GEMM, or a low-precision format.
//
// A layer holds exactly one of the three. The quantised weight is boxed (its header,
// quant/weight_format.hpp, and its kernels are included only by layers/quantized_linear.hpp,
// whose code the layer calls for its product), so forward_matmul here runs the dense and packed
// products. The dense values W stay the layer's own tensor in every case (backward, the module
// protocol and state dicts read them), so the storage only adds what forward streams instead.
#pragma once

#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/shape.hpp"
#include "dissect/kernels/epilogue.hpp"
#include "dissect/kernels/gemm.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/kernels/packed_weight.hpp"
#include "dissect/layers/linear/detail/boxed.hpp"
#include "dissect/tensor/detail/panelled_gemm.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

class QuantizedWeight;  // quant/weight_format.hpp

// ---- declarations -------------------------------------------------------------------------------

/// Forward reads W [out, in] itself, through Eigen or dissect's training GEMM (kernels.hpp).
struct DenseWeight {};

/// One of DenseWeight, PackedWeight (kernels/packed_weight.hpp) or QuantizedWeight
/// (quant/weight_format.hpp); dense until told otherwise. The last two are float only: a double
/// layer stays dense (Linear's pack and quantize require float).
class WeightStorage {
 public:
  using Alternatives = std::variant<DenseWeight, PackedWeight, detail::Boxed<QuantizedWeight>>;

  bool dense() const { return std::holds_alternative<DenseWeight>(store_); }
  /// The packed copy, or nullptr.
  const PackedWeight* packed() const { return std::get_if<PackedWeight>(&store_); }
  /// The quantised weight, or nullptr.
  const QuantizedWeight* quantized() const {
    const auto* box = std::get_if<detail::Boxed<QuantizedWeight>>(&store_);
    return box ? box->get() : nullptr;
  }

  /// Forgets any other storage: forward reads W again.
  void set_dense() { store_.emplace<DenseWeight>(); }
  /// Lays out the float W [out, in] (row-major) for the packed GEMM.
  void set_packed(const float* weight, index_t out, index_t in) {
    store_.emplace<PackedWeight>(weight, out, in, in);
  }
  /// Instantiated only where QuantizedWeight is complete (layers/quantized_linear.hpp).
  template <class Weight = QuantizedWeight>
  void set_quantized(Weight weight) {
    store_.emplace<detail::Boxed<QuantizedWeight>>(
        detail::Boxed<QuantizedWeight>::make(std::move(weight)));
  }

  /// x: [M, in]  W: [out, in]  b: [out] or none  →  y: [M, out] = x·Wᵀ + b, packed or dense
  /// (the layer runs a quantised weight's own product); `weight` and `bias` are the layer's own
  /// values. Shapes checked by the caller.
  template <class Scalar>
  void forward_matmul(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                      std::optional<ConstVectorMap<Scalar>> bias, MatrixRef<Scalar> y) const;

 private:
  Alternatives store_;
};

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
void WeightStorage::forward_matmul(const ConstMatrixRef<Scalar>& x,
                                   const ConstMatrixRef<Scalar>& weight,
                                   std::optional<ConstVectorMap<Scalar>> bias,
                                   MatrixRef<Scalar> y) const {
  if constexpr (std::is_same_v<Scalar, float>) {
    if (const PackedWeight* p = packed()) {
      const float* b = bias ? bias->data() : nullptr;
      Epilogue epilogue;
      epilogue.bias = b;
      packed_matmul(x.data(), x.outerStride(), x.rows(), *p, y.data(), y.outerStride(), epilogue);
      return;
    }
  }
  linear_forward<Scalar>(x, weight, bias, y);
}

}  // namespace dissect
