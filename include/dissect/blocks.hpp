// dissect/blocks.hpp — the linear blocks of a transformer layer, each a few Linear layers.
//
// QKVProjection is GPT-2's c_attn: one fused weight whose output splits into per-head q, k, v
// [B, H, T, d_k] (with fewer k/v heads for grouped-query attention). AttentionOutput merges the
// heads back to [B, T, D] and projects them (c_proj). FeedForward is GPT-2's MLP, D → F → D;
// GatedFeedForward is LLaMA's SwiGLU. Every block checks its shapes at the boundary, and its
// backward returns the input gradient and adds into the gradients of its Linear members.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

#include "dissect/activation.hpp"
#include "dissect/detail/heads.hpp"
#include "dissect/error.hpp"
#include "dissect/init.hpp"
#include "dissect/linear.hpp"
#include "dissect/shape.hpp"
#include "dissect/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// How a block builds its Linear layers; each field as in LinearOptions, applied to all of them.
/// With a seed, the block's layers take seed, seed + 1, … in the order their accessors are
/// listed below; without one, each draws the next default seed (see manual_seed).
struct BlockOptions {
  bool bias = true;
  InitScheme init = InitScheme::pytorch_default;
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// BlockOptions plus the number of key/value heads.
struct QKVOptions {
  /// H_kv for grouped-query attention (1 is multi-query); unset means H_kv = H.
  std::optional<index_t> n_kv_heads = std::nullopt;
  bool bias = true;
  InitScheme init = InitScheme::pytorch_default;
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// BlockOptions with LLaMA's default: no biases.
struct GatedFeedForwardOptions {
  bool bias = false;
  InitScheme init = InitScheme::pytorch_default;
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// What QKVProjection::forward returns (and its backward can take as gradients).
template <class Scalar>
struct QKV {
  Tensor<Scalar, 4> q;  ///< [B, H, T, d_k]
  Tensor<Scalar, 4> k;  ///< [B, H_kv, T, d_k]
  Tensor<Scalar, 4> v;  ///< [B, H_kv, T, d_k]
};

/// x → q, k, v with one fused Linear, GPT-2's c_attn: weight [(H + 2·H_kv)·d_k, D], d_k = D/H.
/// Its rows hold the H·d_k query features, then the H_kv·d_k key features, then the value
/// features (GPT-2's split(D, dim=2)); head h owns features h·d_k … (h+1)·d_k − 1 of its part
/// (view(B, T, H, d_k).transpose(1, 2)).
template <class Scalar>
class QKVProjection {
 public:
  /// @throws ConfigError naming the field if d_model, n_heads or n_kv_heads is ≤ 0, if n_heads
  /// does not divide d_model or if n_kv_heads does not divide n_heads.
  QKVProjection(index_t d_model, index_t n_heads, QKVOptions options = {});

  index_t d_model() const { return d_model_; }
  index_t n_heads() const { return n_heads_; }
  index_t n_kv_heads() const { return n_kv_heads_; }
  index_t head_dim() const { return head_dim_; }
  /// The fused projection (GPT-2's c_attn): [D] → [(H + 2·H_kv)·d_k].
  Linear<Scalar>& qkv() { return qkv_; }
  const Linear<Scalar>& qkv() const { return qkv_; }
  index_t parameter_count() const { return qkv_.parameter_count(); }
  void zero_grad() { qkv_.zero_grad(); }

  /// x: [B, T, D] → q: [B, H, T, d_k], k, v: [B, H_kv, T, d_k].
  /// @throws ShapeError if x is not [B, T, D].
  QKV<Scalar> forward(const Tensor<Scalar, 3>& x) const;

  /// x: [B, T, D], dq: [B, H, T, d_k], dk, dv: [B, H_kv, T, d_k] → dx: [B, T, D]; adds to the
  /// fused weight's (and bias's) gradient. @throws ShapeError (gradients untouched) on any
  /// shape that does not fit x.
  Tensor<Scalar, 3> backward(const Tensor<Scalar, 3>& x, const Tensor<Scalar, 4>& dq,
                             const Tensor<Scalar, 4>& dk, const Tensor<Scalar, 4>& dv);
  /// As above, with the three gradients in a QKV.
  Tensor<Scalar, 3> backward(const Tensor<Scalar, 3>& x, const QKV<Scalar>& grads) {
    return backward(x, grads.q, grads.k, grads.v);
  }

 private:
  void check_input(const char* op, const Tensor<Scalar, 3>& x) const;
  index_t fused_width() const;

  index_t d_model_, n_heads_, n_kv_heads_, head_dim_;
  Linear<Scalar> qkv_;
};

/// Attention's per-head output a → y: heads merged to [B, T, D], then GPT-2's c_proj [D, D].
template <class Scalar>
class AttentionOutput {
 public:
  /// @throws ConfigError naming the field if a size is ≤ 0 or n_heads does not divide d_model.
  AttentionOutput(index_t d_model, index_t n_heads, BlockOptions options = {});

  index_t d_model() const { return d_model_; }
  index_t n_heads() const { return n_heads_; }
  index_t head_dim() const { return head_dim_; }
  /// GPT-2's c_proj: [D] → [D].
  Linear<Scalar>& proj() { return proj_; }
  const Linear<Scalar>& proj() const { return proj_; }
  index_t parameter_count() const { return proj_.parameter_count(); }
  void zero_grad() { proj_.zero_grad(); }

  /// a: [B, H, T, d_k] → y: [B, T, D]. @throws ShapeError if a is not [B, H, T, d_k].
  Tensor<Scalar, 3> forward(const Tensor<Scalar, 4>& a) const;

  /// a: [B, H, T, d_k], dy: [B, T, D] → da: [B, H, T, d_k]; adds to proj's gradients. The merge
  /// of a is redone here (a copy of B·T·D values, against the 2·B·T·D² flops of the GEMMs).
  /// @throws ShapeError (gradients untouched) if a or dy does not fit.
  Tensor<Scalar, 4> backward(const Tensor<Scalar, 4>& a, const Tensor<Scalar, 3>& dy);

 private:
  void check_input(const char* op, const Tensor<Scalar, 4>& a) const;
  Tensor<Scalar, 3> merged(const Tensor<Scalar, 4>& a) const;

  index_t d_model_, n_heads_, head_dim_;
  Linear<Scalar> proj_;
};

/// GPT-2's MLP: y = down(f(up(x))), up: D → F, down: F → D (c_fc and c_proj).
///
/// Backward needs up(x) and f(up(x)). Rather than recompute them (one more [B·T, D]×[D, F]
/// GEMM, a quarter of backward's own work), forward(x, cache) keeps them: 2·B·T·F values, the
/// activation memory of training. Reusing one cache across steps of the same shape allocates
/// nothing for it after the first.
template <class Scalar>
class FeedForward {
 public:
  /// What backward needs from forward; fill with forward(x, cache).
  struct Cache {
    Tensor<Scalar, 3> hidden;     ///< up(x): [B, T, F]
    Tensor<Scalar, 3> activated;  ///< f(hidden): [B, T, F]
  };

  /// d_ff defaults to 4·d_model and the activation to GPT-2's GELU (tanh form).
  /// @throws ConfigError naming the field if d_model or d_ff is ≤ 0.
  explicit FeedForward(index_t d_model, std::optional<index_t> d_ff = std::nullopt,
                       Activation activation = Activation::gelu_tanh, BlockOptions options = {});

  index_t d_model() const { return d_model_; }
  index_t d_ff() const { return d_ff_; }
  Activation activation() const { return activation_; }
  /// [D] → [F] (GPT-2's c_fc).
  Linear<Scalar>& up() { return up_; }
  const Linear<Scalar>& up() const { return up_; }
  /// [F] → [D] (GPT-2's c_proj).
  Linear<Scalar>& down() { return down_; }
  const Linear<Scalar>& down() const { return down_; }
  index_t parameter_count() const { return up_.parameter_count() + down_.parameter_count(); }
  void zero_grad() {
    up_.zero_grad();
    down_.zero_grad();
  }

  /// x: [B, T, D] → y: [B, T, D]. @throws ShapeError if x is not [B, T, D].
  Tensor<Scalar, 3> forward(const Tensor<Scalar, 3>& x) const;
  /// As forward, keeping what backward needs in `cache` (its buffers reused if shaped right).
  Tensor<Scalar, 3> forward(const Tensor<Scalar, 3>& x, Cache& cache) const;

  /// x: [B, T, D], cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D]; adds to the
  /// gradients of up and down. A cache of the right shape but from another x is not detected.
  /// @throws ShapeError (gradients untouched) if x, dy or the cache does not fit.
  Tensor<Scalar, 3> backward(const Tensor<Scalar, 3>& x, const Cache& cache,
                             const Tensor<Scalar, 3>& dy);

 private:
  void check_input(const char* op, const Tensor<Scalar, 3>& x) const;

  index_t d_model_, d_ff_;
  Activation activation_;
  Linear<Scalar> up_, down_;
};

/// LLaMA's SwiGLU: y = down(silu(gate(x)) ⊙ up(x)), gate, up: D → F, down: F → D (w1, w3, w2).
/// Caches as FeedForward does: gate(x), up(x) and their product, 3·B·T·F values, instead of
/// recomputing two GEMMs (a third of backward's work).
template <class Scalar>
class GatedFeedForward {
 public:
  struct Cache {
    Tensor<Scalar, 3> gate;    ///< gate(x): [B, T, F]
    Tensor<Scalar, 3> up;      ///< up(x): [B, T, F]
    Tensor<Scalar, 3> hidden;  ///< silu(gate) ⊙ up: [B, T, F]
  };

  /// @throws ConfigError naming the field if d_model or d_ff is ≤ 0.
  GatedFeedForward(index_t d_model, index_t d_ff, GatedFeedForwardOptions options = {});

  index_t d_model() const { return d_model_; }
  index_t d_ff() const { return d_ff_; }
  /// [D] → [F] (LLaMA's w1), through SiLU.
  Linear<Scalar>& gate() { return gate_; }
  const Linear<Scalar>& gate() const { return gate_; }
  /// [D] → [F] (LLaMA's w3).
  Linear<Scalar>& up() { return up_; }
  const Linear<Scalar>& up() const { return up_; }
  /// [F] → [D] (LLaMA's w2).
  Linear<Scalar>& down() { return down_; }
  const Linear<Scalar>& down() const { return down_; }
  index_t parameter_count() const {
    return gate_.parameter_count() + up_.parameter_count() + down_.parameter_count();
  }
  void zero_grad() {
    gate_.zero_grad();
    up_.zero_grad();
    down_.zero_grad();
  }

  /// x: [B, T, D] → y: [B, T, D]. @throws ShapeError if x is not [B, T, D].
  Tensor<Scalar, 3> forward(const Tensor<Scalar, 3>& x) const;
  Tensor<Scalar, 3> forward(const Tensor<Scalar, 3>& x, Cache& cache) const;

  /// x: [B, T, D], cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D]; adds to the
  /// gradients of gate, up and down. @throws ShapeError (gradients untouched) on a misfit.
  Tensor<Scalar, 3> backward(const Tensor<Scalar, 3>& x, const Cache& cache,
                             const Tensor<Scalar, 3>& dy);

 private:
  void check_input(const char* op, const Tensor<Scalar, 3>& x) const;

  index_t d_model_, d_ff_;
  Linear<Scalar> gate_, up_, down_;
};

/// "QKVProjection(d_model=768, n_heads=12, n_kv_heads=12, bias=true)" and likewise.
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const QKVProjection<Scalar>& block);
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const AttentionOutput<Scalar>& block);
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const FeedForward<Scalar>& block);
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const GatedFeedForward<Scalar>& block);

}  // namespace dissect

#include "dissect/detail/blocks_impl.hpp"
