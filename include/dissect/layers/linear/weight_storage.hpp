// dissect/layers/linear/weight_storage.hpp — how a Linear's forward reads its weight: the dense values
// themselves, a copy laid out for the packed GEMM, or a low-precision format.
//
// A layer holds exactly one of the three, and forward_matmul is the one place that dispatches on
// which: a new format (GGUF's K-quants, ternary weights) is one more alternative here, not
// another mode flag on the layer. The dense values W stay the layer's own tensor in every case
// (backward, the module protocol and state dicts read them), so the storage only adds what
// forward streams instead.
#pragma once

#include <optional>
#include <type_traits>
#include <utility>
#include <variant>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/tensor/detail/panelled_gemm.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/kernels/epilogue.hpp"
#include "dissect/kernels/gemm.hpp"
#include "dissect/kernels/packed_weight.hpp"
#include "dissect/quant/weight_format.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Forward reads W [out, in] itself, through Eigen or dissect's training GEMM (kernels.hpp).
struct DenseWeight {};

/// One of DenseWeight, PackedWeight (kernels/packed_weight.hpp) or QuantizedWeight
/// (quant/weight_format.hpp); dense until told otherwise. The last two are float only: a double
/// layer stays dense (Linear's pack and quantize require float).
class WeightStorage {
 public:
  using Alternatives = std::variant<DenseWeight, PackedWeight, QuantizedWeight>;

  bool dense() const { return std::holds_alternative<DenseWeight>(store_); }
  /// The packed copy, or nullptr.
  const PackedWeight* packed() const { return std::get_if<PackedWeight>(&store_); }
  /// The quantised weight, or nullptr.
  const QuantizedWeight* quantized() const { return std::get_if<QuantizedWeight>(&store_); }

  /// Forgets any other storage: forward reads W again.
  void set_dense() { store_.emplace<DenseWeight>(); }
  /// Lays out the float W [out, in] (row-major) for the packed GEMM.
  void set_packed(const float* weight, index_t out, index_t in) {
    store_.emplace<PackedWeight>(weight, out, in, in);
  }
  void set_quantized(QuantizedWeight weight) { store_.emplace<QuantizedWeight>(std::move(weight)); }

  /// Bytes of W as forward reads it: the quantised values and scales, or `dense_bytes`.
  index_t bytes(index_t dense_bytes) const;

  /// x: [M, in]  W: [out, in]  b: [out] or none  →  y: [M, out] = x·Wᵀ + b, by whichever
  /// storage is held; `weight` and `bias` are the layer's own values. Shapes checked by the
  /// caller.
  template <class Scalar>
  void forward_matmul(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                      std::optional<ConstVectorMap<Scalar>> bias, MatrixRef<Scalar> y) const;

 private:
  Alternatives store_;
};

// ---- implementation -----------------------------------------------------------------------------

inline index_t WeightStorage::bytes(index_t dense_bytes) const {
  const QuantizedWeight* q = quantized();
  return q ? q->bytes() : dense_bytes;
}

template <class Scalar>
void WeightStorage::forward_matmul(const ConstMatrixRef<Scalar>& x,
                                   const ConstMatrixRef<Scalar>& weight,
                                   std::optional<ConstVectorMap<Scalar>> bias,
                                   MatrixRef<Scalar> y) const {
  if constexpr (std::is_same_v<Scalar, float>) {
    const float* b = bias ? bias->data() : nullptr;
    if (const QuantizedWeight* q = quantized()) {
      const index_t m = x.rows();
      // At every m: prefill used to run these on one thread, as if Eigen threaded them.
      q->matmul(x.data(), x.outerStride(), m, y.data(), y.outerStride(), b,
                detail::threads_for_weights(q->rows() * q->cols()));
      return;
    }
    if (const PackedWeight* p = packed()) {
      Epilogue epilogue;
      epilogue.bias = b;
      packed_matmul(x.data(), x.outerStride(), x.rows(), *p, y.data(), y.outerStride(), epilogue);
      return;
    }
  }
  linear_forward<Scalar>(x, weight, bias, y);
}

}  // namespace dissect
