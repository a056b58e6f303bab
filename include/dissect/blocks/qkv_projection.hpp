// dissect/blocks/qkv_projection.hpp — QKVProjection, GPT-2's c_attn: x → per-head q, k, v.
//
// One fused weight whose output splits into q [B, H, T, d_k] and k, v [B, H_kv, T, d_k] (fewer
// k/v heads for grouped-query attention). The shapes are checked at the boundary; backward
// returns dx and adds into the fused Linear's gradients. pack() readies a float projection for
// inference (blocks/detail/packed_fusion.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/attention/qkv.hpp"
#include "dissect/blocks/block_options.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/detail/heads_block.hpp"
#include "dissect/blocks/detail/print_block.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/detail/heads.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// BlockOptions plus the number of key/value heads.
struct QKVOptions {
  /// H_kv for grouped-query attention (1 is multi-query); unset means H_kv = H.
  std::optional<index_t> n_kv_heads = std::nullopt;
  bool bias = true;
  InitScheme init = InitScheme::pytorch_default;
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// x → q, k, v with one fused Linear, GPT-2's c_attn: weight [(H + 2·H_kv)·d_k, D], d_k = D/H.
/// Its rows hold the H·d_k query features, then the H_kv·d_k key features, then the value
/// features (GPT-2's split(D, dim=2)); head h owns features h·d_k … (h+1)·d_k − 1 of its part
/// (view(B, T, H, d_k).transpose(1, 2)).
template <class Scalar>
class QKVProjection : public detail::HeadsBlock<QKVProjection<Scalar>, Scalar> {
 public:
  /// @throws ConfigError naming the field if d_model, n_heads or n_kv_heads is ≤ 0, if n_heads
  /// does not divide d_model or if n_kv_heads does not divide n_heads.
  QKVProjection(index_t d_model, index_t n_heads, QKVOptions options = {});

  index_t n_kv_heads() const { return this->heads_.n_kv_heads; }
  /// The fused projection (GPT-2's c_attn): [D] → [(H + 2·H_kv)·d_k].
  Linear<Scalar>& qkv() { return this->linear_; }
  const Linear<Scalar>& qkv() const { return this->linear_; }

  /// x: [B, T, D] → q: [B, H, T, d_k], k, v: [B, H_kv, T, d_k].
  /// @throws ShapeError if x is not [B, T, D].
  QKV<Scalar> forward(ConstTensorView<Scalar, 3> x) const;

  /// x: [B, T, D], dq: [B, H, T, d_k], dk, dv: [B, H_kv, T, d_k] → dx: [B, T, D]; adds to the
  /// fused weight's (and bias's) gradient. @throws ShapeError (gradients untouched) on any
  /// shape that does not fit x.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, ConstTensorView<Scalar, 4> dq,
                             ConstTensorView<Scalar, 4> dk, ConstTensorView<Scalar, 4> dv);
  /// As above, with the three gradients in a QKV.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const QKV<Scalar>& grads) {
    return backward(x, grads.q, grads.k, grads.v);
  }
};

/// "QKVProjection(d_model=768, n_heads=12, n_kv_heads=12, bias=true)".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const QKVProjection<Scalar>& block);

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
QKVProjection<Scalar>::QKVProjection(index_t d_model, index_t n_heads, QKVOptions options)
    : QKVProjection::HeadsBlock(
          module_names::qkv, d_model,
          check_heads("QKVProjection", d_model, n_heads, options.n_kv_heads),
          detail::fused_qkv_width(
              check_heads("QKVProjection", d_model, n_heads, options.n_kv_heads)),
          {.bias = options.bias, .init = options.init, .seed = options.seed}) {}

template <class Scalar>
QKV<Scalar> QKVProjection<Scalar>::forward(ConstTensorView<Scalar, 3> x) const {
  check_block_tokens("QKVProjection::forward", "x", x, "D", this->d_model_);
  const index_t batch = x.dim(0), tokens = x.dim(1);
  const auto fused = this->linear_.forward(x);  // [B, T, (H + 2·H_kv)·d_k]
  QKV<Scalar> out{Tensor<Scalar, 4>::uninitialized(
                      {batch, this->heads_.n_heads, tokens, this->heads_.head_dim}),
                  Tensor<Scalar, 4>::uninitialized(
                      {batch, this->heads_.n_kv_heads, tokens, this->heads_.head_dim}),
                  Tensor<Scalar, 4>::uninitialized(
                      {batch, this->heads_.n_kv_heads, tokens, this->heads_.head_dim})};
  detail::split_heads<Scalar>(fused, 0, out.q);
  detail::split_heads<Scalar>(fused, this->heads_.n_heads * this->heads_.head_dim, out.k);
  detail::split_heads<Scalar>(
      fused, (this->heads_.n_heads + this->heads_.n_kv_heads) * this->heads_.head_dim, out.v);
  return out;
}

template <class Scalar>
Tensor<Scalar, 3> QKVProjection<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                  ConstTensorView<Scalar, 4> dq,
                                                  ConstTensorView<Scalar, 4> dk,
                                                  ConstTensorView<Scalar, 4> dv) {
  const char* op = "QKVProjection::backward";
  check_block_tokens(op, "x", x, "D", this->d_model_);
  const index_t batch = x.dim(0), tokens = x.dim(1);
  const auto x_text = format_shape(x.shape());
  check_block_shape(
      op, "dq", dq,
      detail::concat("[B, H=", this->heads_.n_heads, ", T, d_k=", this->heads_.head_dim, "]"),
      Shape<4>{batch, this->heads_.n_heads, tokens, this->heads_.head_dim}, "x", x_text);
  const auto kv_pattern =
      detail::concat("[B, H_kv=", this->heads_.n_kv_heads, ", T, d_k=", this->heads_.head_dim, "]");
  const Shape<4> kv_shape{batch, this->heads_.n_kv_heads, tokens, this->heads_.head_dim};
  check_block_shape(op, "dk", dk, kv_pattern, kv_shape, "x", x_text);
  check_block_shape(op, "dv", dv, kv_pattern, kv_shape, "x", x_text);

  // Every column of the fused gradient is written by exactly one of the three merges.
  auto d_fused =
      Tensor<Scalar, 3>::uninitialized({batch, tokens, detail::fused_qkv_width(this->heads_)});
  detail::merge_heads<Scalar>(dq, d_fused, 0);
  detail::merge_heads<Scalar>(dk, d_fused, this->heads_.n_heads * this->heads_.head_dim);
  detail::merge_heads<Scalar>(
      dv, d_fused, (this->heads_.n_heads + this->heads_.n_kv_heads) * this->heads_.head_dim);
  return this->linear_.backward(x, d_fused);
}

// ---- printing -----------------------------------------------------------------------------------

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const QKVProjection<Scalar>& b) {
  const bool bias = b.qkv().has_bias();
  return detail::print_block(
      out, "QKVProjection",
      {{"d_model", b.d_model()}, {"n_heads", b.n_heads()}, {"n_kv_heads", b.n_kv_heads()}}, bias);
}

}  // namespace dissect
