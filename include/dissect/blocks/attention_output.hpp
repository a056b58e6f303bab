// dissect/blocks/attention_output.hpp — AttentionOutput, GPT-2's c_proj after attention.
//
// Merges the per-head output a [B, H, T, d_k] back to [B, T, D] and projects it [D, D]; its
// residual form adds the residual in the product's epilogue when packed. Shapes are checked at
// the boundary; backward returns da and adds into proj's gradients.
#pragma once

#include <ostream>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/blocks/block_options.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/detail/heads_block.hpp"
#include "dissect/blocks/detail/packed_fusion.hpp"
#include "dissect/blocks/detail/print_block.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/detail/heads.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Attention's per-head output a → y: heads merged to [B, T, D], then GPT-2's c_proj [D, D].
template <class Scalar>
class AttentionOutput : public detail::HeadsBlock<AttentionOutput<Scalar>, Scalar> {
 public:
  /// @throws ConfigError naming the field if a size is ≤ 0 or n_heads does not divide d_model.
  AttentionOutput(index_t d_model, index_t n_heads, BlockOptions options = {});

  /// GPT-2's c_proj: [D] → [D].
  Linear<Scalar>& proj() { return this->linear_; }
  const Linear<Scalar>& proj() const { return this->linear_; }

  /// a: [B, H, T, d_k] → y: [B, T, D]. @throws ShapeError if a is not [B, H, T, d_k].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 4> a) const;
  /// y = forward(a) + residual, the residual [B, T, D] added in the product's epilogue when
  /// packed. @throws ShapeError if a or the residual does not fit.
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 4> a,
                            ConstTensorView<Scalar, 3> residual) const;

  /// a: [B, H, T, d_k], dy: [B, T, D] → da: [B, H, T, d_k]; adds to proj's gradients. The merge
  /// of a is redone here (a copy of B·T·D values, against the 2·B·T·D² flops of the GEMMs).
  /// @throws ShapeError (gradients untouched) if a or dy does not fit.
  Tensor<Scalar, 4> backward(ConstTensorView<Scalar, 4> a, ConstTensorView<Scalar, 3> dy);

 private:
  void check_input(const char* op, ConstTensorView<Scalar, 4> a) const;
  Tensor<Scalar, 3> merged(ConstTensorView<Scalar, 4> a) const;
};

/// "AttentionOutput(d_model=768, n_heads=12, bias=true)".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const AttentionOutput<Scalar>& block);

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
AttentionOutput<Scalar>::AttentionOutput(index_t d_model, index_t n_heads, BlockOptions options)
    : AttentionOutput::HeadsBlock(module_names::proj, d_model,
                                  check_heads("AttentionOutput", d_model, n_heads), d_model,
                                  options) {}

template <class Scalar>
void AttentionOutput<Scalar>::check_input(const char* op, ConstTensorView<Scalar, 4> a) const {
  if (a.dim(1) != this->heads_.n_heads || a.dim(3) != this->heads_.head_dim) {
    throw ShapeError(detail::concat(op, ": a must be [B, H=", this->heads_.n_heads, ", T, d_k=",
                                    this->heads_.head_dim, "], got ", format_shape(a.shape())));
  }
}

template <class Scalar>
Tensor<Scalar, 3> AttentionOutput<Scalar>::merged(ConstTensorView<Scalar, 4> a) const {
  auto rows = Tensor<Scalar, 3>::uninitialized({a.dim(0), a.dim(2), this->d_model_});
  detail::merge_heads<Scalar>(a, rows, 0);  // H·d_k = D: every column written
  return rows;
}

template <class Scalar>
Tensor<Scalar, 3> AttentionOutput<Scalar>::forward(ConstTensorView<Scalar, 4> a) const {
  check_input("AttentionOutput::forward", a);
  return this->linear_.forward(merged(a));
}

template <class Scalar>
Tensor<Scalar, 3> AttentionOutput<Scalar>::forward(ConstTensorView<Scalar, 4> a,
                                                   ConstTensorView<Scalar, 3> residual) const {
  const char* op = "AttentionOutput::forward";
  check_input(op, a);
  check_block_shape(op, "residual", residual, detail::concat("[B, T, D=", this->d_model_, "]"),
                    Shape<3>{a.dim(0), a.dim(2), this->d_model_}, "a", format_shape(a.shape()));
  const auto rows = merged(a);
  if (detail::runs_packed(this->linear_)) {
    auto y = Tensor<Scalar, 3>::uninitialized(residual.shape());
    detail::packed_forward<Scalar, 3>(this->linear_, rows.cview(), y.view(), residual);
    return y;
  }
  auto y = this->linear_.forward(rows);
  detail::add_residual<Scalar>(y, residual);
  return y;
}

template <class Scalar>
Tensor<Scalar, 4> AttentionOutput<Scalar>::backward(ConstTensorView<Scalar, 4> a,
                                                    ConstTensorView<Scalar, 3> dy) {
  check_input("AttentionOutput::backward", a);
  check_block_shape("AttentionOutput::backward", "dy", dy,
                    detail::concat("[B, T, D=", this->d_model_, "]"),
                    Shape<3>{a.dim(0), a.dim(2), this->d_model_}, "a", format_shape(a.shape()));
  const auto d_merged = this->linear_.backward(merged(a), dy);  // [B, T, D]
  auto da = Tensor<Scalar, 4>::uninitialized(a.shape());
  detail::split_heads<Scalar>(d_merged, 0, da);
  return da;
}

// ---- printing -----------------------------------------------------------------------------------

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const AttentionOutput<Scalar>& b) {
  return detail::print_block(out, "AttentionOutput",
                             {{"d_model", b.d_model()}, {"n_heads", b.n_heads()}},
                             b.proj().has_bias());
}

}  // namespace dissect
