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
#include "dissect/config.hpp"
#include "dissect/detail/heads.hpp"
#include "dissect/error.hpp"
#include "dissect/init.hpp"
#include "dissect/linear.hpp"
#include "dissect/module.hpp"
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
class QKVProjection : public ParameterMethods<QKVProjection<Scalar>> {
 public:
  using scalar_type = Scalar;

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
  /// Visits "qkv.*": the module protocol.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit_members(*this, visit);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    visit_members(*this, visit);
  }

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

 private:
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child("qkv", self.qkv_, visit);
  }
  void check_input(const char* op, ConstTensorView<Scalar, 3> x) const;
  index_t fused_width() const;

  index_t d_model_, n_heads_, n_kv_heads_, head_dim_;
  Linear<Scalar> qkv_;
};

/// Attention's per-head output a → y: heads merged to [B, T, D], then GPT-2's c_proj [D, D].
template <class Scalar>
class AttentionOutput : public ParameterMethods<AttentionOutput<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// @throws ConfigError naming the field if a size is ≤ 0 or n_heads does not divide d_model.
  AttentionOutput(index_t d_model, index_t n_heads, BlockOptions options = {});

  index_t d_model() const { return d_model_; }
  index_t n_heads() const { return n_heads_; }
  index_t head_dim() const { return head_dim_; }
  /// GPT-2's c_proj: [D] → [D].
  Linear<Scalar>& proj() { return proj_; }
  const Linear<Scalar>& proj() const { return proj_; }
  /// Visits "proj.*": the module protocol.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit_members(*this, visit);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    visit_members(*this, visit);
  }

  /// a: [B, H, T, d_k] → y: [B, T, D]. @throws ShapeError if a is not [B, H, T, d_k].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 4> a) const;

  /// a: [B, H, T, d_k], dy: [B, T, D] → da: [B, H, T, d_k]; adds to proj's gradients. The merge
  /// of a is redone here (a copy of B·T·D values, against the 2·B·T·D² flops of the GEMMs).
  /// @throws ShapeError (gradients untouched) if a or dy does not fit.
  Tensor<Scalar, 4> backward(ConstTensorView<Scalar, 4> a, ConstTensorView<Scalar, 3> dy);

 private:
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child("proj", self.proj_, visit);
  }
  void check_input(const char* op, ConstTensorView<Scalar, 4> a) const;
  Tensor<Scalar, 3> merged(ConstTensorView<Scalar, 4> a) const;

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
class FeedForward : public ParameterMethods<FeedForward<Scalar>> {
 public:
  using scalar_type = Scalar;

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
  /// Visits "up.*", "down.*": the module protocol.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit_members(*this, visit);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    visit_members(*this, visit);
  }

  /// x: [B, T, D] → y: [B, T, D]. @throws ShapeError if x is not [B, T, D].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x) const;
  /// As forward, keeping what backward needs in `cache` (its buffers reused if shaped right).
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const;

  /// x: [B, T, D], cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D]; adds to the
  /// gradients of up and down. A cache of the right shape but from another x is not detected.
  /// @throws ShapeError (gradients untouched) if x, dy or the cache does not fit.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy);

 private:
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child("up", self.up_, visit);
    visit_child("down", self.down_, visit);
  }
  void check_input(const char* op, ConstTensorView<Scalar, 3> x) const;

  index_t d_model_, d_ff_;
  Activation activation_;
  Linear<Scalar> up_, down_;
};

/// LLaMA's SwiGLU: y = down(silu(gate(x)) ⊙ up(x)), gate, up: D → F, down: F → D (w1, w3, w2).
/// Caches as FeedForward does: gate(x), up(x) and their product, 3·B·T·F values, instead of
/// recomputing two GEMMs (a third of backward's work).
template <class Scalar>
class GatedFeedForward : public ParameterMethods<GatedFeedForward<Scalar>> {
 public:
  using scalar_type = Scalar;

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
  /// Visits "gate.*", "up.*", "down.*": the module protocol.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit_members(*this, visit);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    visit_members(*this, visit);
  }

  /// x: [B, T, D] → y: [B, T, D]. @throws ShapeError if x is not [B, T, D].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x) const;
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const;

  /// x: [B, T, D], cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D]; adds to the
  /// gradients of gate, up and down. @throws ShapeError (gradients untouched) on a misfit.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy);

 private:
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child("gate", self.gate_, visit);
    visit_child("up", self.up_, visit);
    visit_child("down", self.down_, visit);
  }
  void check_input(const char* op, ConstTensorView<Scalar, 3> x) const;

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

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// The options of a block's `index`-th Linear: consecutive seeds from one block seed.
inline LinearOptions member_options(bool bias, InitScheme init, std::optional<std::uint64_t> seed,
                                    std::uint64_t index) {
  return {.bias = bias,
          .init = init,
          .seed = seed ? std::optional<std::uint64_t>(*seed + index) : std::nullopt};
}

/// "[B, T, D=768]"-style expectation text for messages.
inline std::string token_shape_text(const char* last_name, index_t last) {
  return concat("[B, T, ", last_name, "=", last, "]");
}

template <class Scalar>
void check_block_tokens(std::string_view op, const char* name, ConstTensorView<Scalar, 3> tensor,
                        const char* last_name, index_t last) {
  if (tensor.dim(2) != last) {
    throw ShapeError(concat(op, ": ", name, " must be ", token_shape_text(last_name, last),
                            ", got ", format_shape(tensor.shape())));
  }
}

/// `tensor` must be exactly `expected` (derived from an input already checked).
template <TensorLike X>
void check_block_shape(std::string_view op, const char* name, const X& tensor,
                       std::string_view pattern, const Shape<rank_of<X>>& expected,
                       std::string_view source, const std::string& source_shape,
                       std::string_view hint = "") {
  if (tensor.shape() != expected) {
    throw ShapeError(concat(op, ": ", name, " must be ", pattern, " = ", format_shape(expected),
                            " for ", source, " ", source_shape, ", got ",
                            format_shape(tensor.shape()), hint));
  }
}

/// y = layer(x) into `buffer`, reusing its memory when it already has the right shape.
template <class Scalar>
void forward_into_cache(const Linear<Scalar>& layer, ConstTensorView<Scalar, 3> x,
                        Tensor<Scalar, 3>& buffer) {
  layer.forward_into(x, reuse_buffer(buffer, layer.output_shape(x.shape())));
}

inline constexpr std::string_view cache_hint = " (fill the cache with forward(x, cache))";

}  // namespace detail

// ---- QKVProjection ------------------------------------------------------------------------------

template <class Scalar>
QKVProjection<Scalar>::QKVProjection(index_t d_model, index_t n_heads, QKVOptions options)
    : d_model_(d_model),
      n_heads_(n_heads),
      n_kv_heads_(check_heads("QKVProjection", d_model, n_heads, options.n_kv_heads).n_kv_heads),
      head_dim_(d_model / n_heads),
      qkv_(d_model, fused_width(),
           detail::member_options(options.bias, options.init, options.seed, 0)) {}

template <class Scalar>
index_t QKVProjection<Scalar>::fused_width() const {
  constexpr std::string_view what = "QKVProjection: (H + 2·H_kv)·d_k";
  return checked_mul(checked_sum({n_heads_, n_kv_heads_, n_kv_heads_}, what), head_dim_, what);
}

template <class Scalar>
void QKVProjection<Scalar>::check_input(const char* op, ConstTensorView<Scalar, 3> x) const {
  detail::check_block_tokens(op, "x", x, "D", d_model_);
}

template <class Scalar>
QKV<Scalar> QKVProjection<Scalar>::forward(ConstTensorView<Scalar, 3> x) const {
  check_input("QKVProjection::forward", x);
  const index_t batch = x.dim(0), tokens = x.dim(1);
  const auto fused = qkv_.forward(x);  // [B, T, (H + 2·H_kv)·d_k]
  QKV<Scalar> out{Tensor<Scalar, 4>::uninitialized({batch, n_heads_, tokens, head_dim_}),
                  Tensor<Scalar, 4>::uninitialized({batch, n_kv_heads_, tokens, head_dim_}),
                  Tensor<Scalar, 4>::uninitialized({batch, n_kv_heads_, tokens, head_dim_})};
  detail::split_heads<Scalar>(fused, 0, out.q);
  detail::split_heads<Scalar>(fused, n_heads_ * head_dim_, out.k);
  detail::split_heads<Scalar>(fused, (n_heads_ + n_kv_heads_) * head_dim_, out.v);
  return out;
}

template <class Scalar>
Tensor<Scalar, 3> QKVProjection<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                  ConstTensorView<Scalar, 4> dq,
                                                  ConstTensorView<Scalar, 4> dk,
                                                  ConstTensorView<Scalar, 4> dv) {
  const char* op = "QKVProjection::backward";
  check_input(op, x);
  const index_t batch = x.dim(0), tokens = x.dim(1);
  const auto x_text = format_shape(x.shape());
  detail::check_block_shape(op, "dq", dq,
                            detail::concat("[B, H=", n_heads_, ", T, d_k=", head_dim_, "]"),
                            Shape<4>{batch, n_heads_, tokens, head_dim_}, "x", x_text);
  const auto kv_pattern = detail::concat("[B, H_kv=", n_kv_heads_, ", T, d_k=", head_dim_, "]");
  const Shape<4> kv_shape{batch, n_kv_heads_, tokens, head_dim_};
  detail::check_block_shape(op, "dk", dk, kv_pattern, kv_shape, "x", x_text);
  detail::check_block_shape(op, "dv", dv, kv_pattern, kv_shape, "x", x_text);

  // Every column of the fused gradient is written by exactly one of the three merges.
  auto d_fused = Tensor<Scalar, 3>::uninitialized({batch, tokens, fused_width()});
  detail::merge_heads<Scalar>(dq, d_fused, 0);
  detail::merge_heads<Scalar>(dk, d_fused, n_heads_ * head_dim_);
  detail::merge_heads<Scalar>(dv, d_fused, (n_heads_ + n_kv_heads_) * head_dim_);
  return qkv_.backward(x, d_fused);
}

// ---- AttentionOutput ----------------------------------------------------------------------------

template <class Scalar>
AttentionOutput<Scalar>::AttentionOutput(index_t d_model, index_t n_heads, BlockOptions options)
    : d_model_(d_model),
      n_heads_(n_heads),
      head_dim_(check_heads("AttentionOutput", d_model, n_heads).head_dim),
      proj_(d_model, d_model, detail::member_options(options.bias, options.init, options.seed, 0)) {
}

template <class Scalar>
void AttentionOutput<Scalar>::check_input(const char* op, ConstTensorView<Scalar, 4> a) const {
  if (a.dim(1) != n_heads_ || a.dim(3) != head_dim_) {
    throw ShapeError(detail::concat(op, ": a must be [B, H=", n_heads_, ", T, d_k=", head_dim_,
                                    "], got ", format_shape(a.shape())));
  }
}

template <class Scalar>
Tensor<Scalar, 3> AttentionOutput<Scalar>::merged(ConstTensorView<Scalar, 4> a) const {
  auto rows = Tensor<Scalar, 3>::uninitialized({a.dim(0), a.dim(2), d_model_});
  detail::merge_heads<Scalar>(a, rows, 0);  // H·d_k = D: every column written
  return rows;
}

template <class Scalar>
Tensor<Scalar, 3> AttentionOutput<Scalar>::forward(ConstTensorView<Scalar, 4> a) const {
  check_input("AttentionOutput::forward", a);
  return proj_.forward(merged(a));
}

template <class Scalar>
Tensor<Scalar, 4> AttentionOutput<Scalar>::backward(ConstTensorView<Scalar, 4> a,
                                                    ConstTensorView<Scalar, 3> dy) {
  check_input("AttentionOutput::backward", a);
  detail::check_block_shape("AttentionOutput::backward", "dy", dy,
                            detail::concat("[B, T, D=", d_model_, "]"),
                            Shape<3>{a.dim(0), a.dim(2), d_model_}, "a", format_shape(a.shape()));
  const auto d_merged = proj_.backward(merged(a), dy);  // [B, T, D]
  auto da = Tensor<Scalar, 4>::uninitialized(a.shape());
  detail::split_heads<Scalar>(d_merged, 0, da);
  return da;
}

// ---- FeedForward --------------------------------------------------------------------------------

template <class Scalar>
FeedForward<Scalar>::FeedForward(index_t d_model, std::optional<index_t> d_ff,
                                 Activation activation, BlockOptions options)
    : d_model_(require_positive("FeedForward", "d_model", d_model)),
      d_ff_(d_ff ? require_positive("FeedForward", "d_ff", *d_ff)
                 : checked_mul(4, d_model, "FeedForward: d_ff = 4·d_model")),
      activation_(check_activation("FeedForward", activation)),
      up_(d_model_, d_ff_, detail::member_options(options.bias, options.init, options.seed, 0)),
      down_(d_ff_, d_model_, detail::member_options(options.bias, options.init, options.seed, 1)) {}

template <class Scalar>
void FeedForward<Scalar>::check_input(const char* op, ConstTensorView<Scalar, 3> x) const {
  detail::check_block_tokens(op, "x", x, "D", d_model_);
}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x) const {
  check_input("FeedForward::forward", x);
  auto hidden = up_.forward(x);                // [B, T, F]
  activate_into(hidden, hidden, activation_);  // in place
  return down_.forward(hidden);
}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x, Cache& cache) const {
  check_input("FeedForward::forward", x);
  detail::forward_into_cache(up_, x, cache.hidden);
  detail::reuse_buffer(cache.activated, cache.hidden.shape());
  activate_into(cache.hidden, cache.activated, activation_);
  return down_.forward(cache.activated);
}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                                                ConstTensorView<Scalar, 3> dy) {
  const char* op = "FeedForward::backward";
  check_input(op, x);
  const auto x_text = format_shape(x.shape());
  detail::check_block_shape(op, "dy", dy, detail::token_shape_text("D", d_model_), x.shape(), "x",
                            x_text);
  const Shape<3> hidden_shape{x.dim(0), x.dim(1), d_ff_};
  const auto hidden_pattern = detail::token_shape_text("F", d_ff_);
  detail::check_block_shape(op, "cache.hidden", cache.hidden, hidden_pattern, hidden_shape, "x",
                            x_text, detail::cache_hint);
  detail::check_block_shape(op, "cache.activated", cache.activated, hidden_pattern, hidden_shape,
                            "x", x_text, detail::cache_hint);

  auto d_hidden = down_.backward(cache.activated, dy);                    // d f(hidden): [B, T, F]
  activate_backward_into(cache.hidden, d_hidden, d_hidden, activation_);  // in place: d hidden
  return up_.backward(x, d_hidden);
}

// ---- GatedFeedForward ---------------------------------------------------------------------------

template <class Scalar>
GatedFeedForward<Scalar>::GatedFeedForward(index_t d_model, index_t d_ff,
                                           GatedFeedForwardOptions options)
    : d_model_(require_positive("GatedFeedForward", "d_model", d_model)),
      d_ff_(require_positive("GatedFeedForward", "d_ff", d_ff)),
      gate_(d_model_, d_ff_, detail::member_options(options.bias, options.init, options.seed, 0)),
      up_(d_model_, d_ff_, detail::member_options(options.bias, options.init, options.seed, 1)),
      down_(d_ff_, d_model_, detail::member_options(options.bias, options.init, options.seed, 2)) {}

template <class Scalar>
void GatedFeedForward<Scalar>::check_input(const char* op, ConstTensorView<Scalar, 3> x) const {
  detail::check_block_tokens(op, "x", x, "D", d_model_);
}

namespace detail {
/// hidden = silu(gate) ⊙ up elementwise; hidden may be gate itself.
template <class Scalar>
void swiglu_into(ConstTensorView<Scalar, 3> gate, ConstTensorView<Scalar, 3> up,
                 TensorView<Scalar, 3> hidden) {
  for (index_t i = 0; i < gate.size(); ++i) {
    hidden.data()[i] = activation_value<Activation::silu>(gate.data()[i]) * up.data()[i];
  }
}
}  // namespace detail

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x) const {
  check_input("GatedFeedForward::forward", x);
  auto hidden = gate_.forward(x);  // [B, T, F], becomes silu(gate) ⊙ up in place
  detail::swiglu_into<Scalar>(hidden, up_.forward(x), hidden);
  return down_.forward(hidden);
}

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x,
                                                    Cache& cache) const {
  check_input("GatedFeedForward::forward", x);
  detail::forward_into_cache(gate_, x, cache.gate);
  detail::forward_into_cache(up_, x, cache.up);
  detail::reuse_buffer(cache.hidden, cache.gate.shape());
  detail::swiglu_into<Scalar>(cache.gate, cache.up, cache.hidden);
  return down_.forward(cache.hidden);
}

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                     const Cache& cache,
                                                     ConstTensorView<Scalar, 3> dy) {
  const char* op = "GatedFeedForward::backward";
  check_input(op, x);
  const auto x_text = format_shape(x.shape());
  detail::check_block_shape(op, "dy", dy, detail::token_shape_text("D", d_model_), x.shape(), "x",
                            x_text);
  const Shape<3> hidden_shape{x.dim(0), x.dim(1), d_ff_};
  const auto hidden_pattern = detail::token_shape_text("F", d_ff_);
  detail::check_block_shape(op, "cache.gate", cache.gate, hidden_pattern, hidden_shape, "x", x_text,
                            detail::cache_hint);
  detail::check_block_shape(op, "cache.up", cache.up, hidden_pattern, hidden_shape, "x", x_text,
                            detail::cache_hint);
  detail::check_block_shape(op, "cache.hidden", cache.hidden, hidden_pattern, hidden_shape, "x",
                            x_text, detail::cache_hint);

  // d hidden → d up = d hidden ⊙ silu(gate) and d gate = silu'(gate) · (d hidden ⊙ up), the
  // latter written over d hidden once both are read.
  auto d_gate = down_.backward(cache.hidden, dy);  // d hidden: [B, T, F]
  auto d_up = Tensor<Scalar, 3>::uninitialized(hidden_shape);
  for (index_t i = 0; i < d_gate.size(); ++i) {
    const Scalar g = cache.gate.data()[i], d_hidden = d_gate.data()[i];
    d_up.data()[i] = d_hidden * detail::activation_value<Activation::silu>(g);
    d_gate.data()[i] =
        detail::activation_gradient<Activation::silu>(g, d_hidden * cache.up.data()[i]);
  }
  auto dx = gate_.backward(x, d_gate);
  dx.vector() += up_.backward(x, d_up).vector();
  return dx;
}

// ---- printing -----------------------------------------------------------------------------------

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const QKVProjection<Scalar>& block) {
  return out << "QKVProjection(d_model=" << block.d_model() << ", n_heads=" << block.n_heads()
             << ", n_kv_heads=" << block.n_kv_heads()
             << ", bias=" << (block.qkv().has_bias() ? "true" : "false") << ")";
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const AttentionOutput<Scalar>& block) {
  return out << "AttentionOutput(d_model=" << block.d_model() << ", n_heads=" << block.n_heads()
             << ", bias=" << (block.proj().has_bias() ? "true" : "false") << ")";
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const FeedForward<Scalar>& block) {
  return out << "FeedForward(d_model=" << block.d_model() << ", d_ff=" << block.d_ff()
             << ", activation=" << block.activation()
             << ", bias=" << (block.up().has_bias() ? "true" : "false") << ")";
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const GatedFeedForward<Scalar>& block) {
  return out << "GatedFeedForward(d_model=" << block.d_model() << ", d_ff=" << block.d_ff()
             << ", bias=" << (block.gate().has_bias() ? "true" : "false") << ")";
}

}  // namespace dissect
