// dissect/blocks.hpp — the linear blocks of a transformer layer, each a few Linear layers.
//
// QKVProjection is GPT-2's c_attn: one fused weight whose output splits into per-head q, k, v
// [B, H, T, d_k] (with fewer k/v heads for grouped-query attention). AttentionOutput merges the
// heads back to [B, T, D] and projects them (c_proj). FeedForward is GPT-2's MLP, D → F → D;
// GatedFeedForward is LLaMA's SwiGLU. Every block checks its shapes at the boundary, and its
// backward returns the input gradient and adds into the gradients of its Linear members.
//
// pack() readies a float block for inference (and freezes it): its weights are laid out once for
// the packed GEMM (kernels/gemm.hpp), and the forward without a cache then fuses what follows
// each product into it — the bias everywhere, the activation into the FFN's up projection,
// SwiGLU's silu(gate)·up into one product over gate and up packed side by side, and, through
// the residual forms, the residual add into the last projection. A packed block whose layers
// changed since (a new weight, an adapter) falls back to the unfused forward.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <utility>

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

/// How a block builds its Linear layers: LinearOptions applied to all of them. With a seed, the
/// block's layers take seed, seed + 1, … in the order their accessors are listed below; without
/// one, each draws the next default seed (see manual_seed).
using BlockOptions = LinearOptions;

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

namespace detail {

/// The options of a block's `index`-th Linear: consecutive seeds from one block seed.
inline LinearOptions member_options(bool bias, InitScheme init, std::optional<std::uint64_t> seed,
                                    std::uint64_t index) {
  return {.bias = bias,
          .init = init,
          .seed = seed ? std::optional<std::uint64_t>(*seed + index) : std::nullopt};
}

/// What the two attention projections share: D, the head layout and one Linear member, named
/// `member` in the state_dict ("qkv", "proj").
template <class Derived, class Scalar>
class HeadsBlock : public ComposedModule<Derived> {
 public:
  using scalar_type = Scalar;

  index_t d_model() const { return d_model_; }
  index_t n_heads() const { return heads_.n_heads; }
  index_t head_dim() const { return heads_.head_dim; }
  // for_each_parameter ("qkv.*" or "proj.*"), zero_grad, parameter_count: from ComposedModule.

  /// Packs the projection for inference (Linear::pack): forward then runs the packed GEMM with
  /// the bias (and AttentionOutput's residual) fused. Freezes it.
  void pack() requires std::is_same_v<Scalar, float> { linear_.pack(); }
  void unpack() { linear_.unpack(); }
  bool packed() const { return linear_.packed(); }

 protected:
  HeadsBlock(const char* member, index_t d_model, HeadLayout heads, index_t out_features,
             const LinearOptions& options)
      : member_(member),
        d_model_(d_model),
        heads_(heads),
        linear_(d_model, out_features,
                member_options(options.bias, options.init, options.seed, 0)) {}

  const char* member_;
  index_t d_model_;
  HeadLayout heads_;
  Linear<Scalar> linear_;

 private:
  friend class ComposedModule<Derived>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child(self.member_, self.linear_, visit);
  }
};

/// (H + 2·H_kv)·d_k, the fused QKV width. @throws OverflowError if it leaves int64.
inline index_t fused_qkv_width(const HeadLayout& heads) {
  constexpr std::string_view what = "QKVProjection: (H + 2·H_kv)·d_k";
  return checked_mul(checked_sum({heads.n_heads, heads.n_kv_heads, heads.n_kv_heads}, what),
                     heads.head_dim, what);
}

}  // namespace detail

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

namespace detail {

/// What the two FFNs share: D, F, their N projections D → F (the first N − 1) and F → D (the
/// last, "down"), the forward without a cache and the input check. Members are built in order
/// (gate, up, down), taking consecutive seeds.
template <class Derived, class Scalar, std::size_t N>
class FeedForwardCore : public ComposedModule<Derived> {
 public:
  using scalar_type = Scalar;

  index_t d_model() const { return d_model_; }
  index_t d_ff() const { return d_ff_; }
  /// [D] → [F] (GPT-2's c_fc, LLaMA's w3).
  Linear<Scalar>& up() { return layers_[N - 2]; }
  const Linear<Scalar>& up() const { return layers_[N - 2]; }
  /// [F] → [D] (GPT-2's c_proj, LLaMA's w2).
  Linear<Scalar>& down() { return layers_[N - 1]; }
  const Linear<Scalar>& down() const { return layers_[N - 1]; }
  // for_each_parameter ("gate.*", "up.*", "down.*"), zero_grad, parameter_count: from
  // ComposedModule.

  /// x: [B, T, D] → y: [B, T, D], keeping nothing: fused when packed.
  /// @throws ShapeError if x is not [B, T, D].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x) const { return forward_fused(x, {}); }
  /// y = forward(x) + residual, the residual [B, T, D] added in the down projection's epilogue
  /// when packed. @throws ShapeError if x or the residual is not [B, T, D].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x,
                            ConstTensorView<Scalar, 3> residual) const;

  /// Packs the block for inference and freezes it (see the header comment).
  void pack() requires std::is_same_v<Scalar, float>;
  void unpack();
  /// Whether forward without a cache runs fused: packed, and unchanged since.
  bool packed() const;

 protected:
  FeedForwardCore(const char* block, index_t d_model, index_t d_ff, bool bias, InitScheme init,
                  std::optional<std::uint64_t> seed);

  void check_input(const char* op, ConstTensorView<Scalar, 3> x) const;
  /// forward(x) (+ residual when given): fused if packed() holds, else through the cache form.
  Tensor<Scalar, 3> forward_fused(ConstTensorView<Scalar, 3> x,
                                  std::optional<ConstTensorView<Scalar, 3>> residual) const;

  index_t d_model_, d_ff_;
  std::array<Linear<Scalar>, N> layers_;  // (gate,) up, down
  /// What pack() built for the D → F products: up alone, or gate and up side by side; and the
  /// weight generations of the layers it was built from.
  std::optional<PackedWeight> packed_in_;
  std::array<std::uint64_t, N> packed_generations_{};

 private:
  friend class ComposedModule<Derived>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    constexpr std::array<std::string_view, 3> names{"gate", "up", "down"};
    for (std::size_t i = 0; i < N; ++i) visit_child(names[3 - N + i], self.layers_[i], visit);
  }
};

}  // namespace detail

/// GPT-2's MLP: y = down(f(up(x))), up: D → F, down: F → D (c_fc and c_proj).
///
/// Backward needs up(x) and f(up(x)). Rather than recompute them (one more [B·T, D]×[D, F]
/// GEMM, a quarter of backward's own work), forward(x, cache) keeps them: 2·B·T·F values, the
/// activation memory of training. Reusing one cache across steps of the same shape allocates
/// nothing for it after the first.
template <class Scalar>
class FeedForward : public detail::FeedForwardCore<FeedForward<Scalar>, Scalar, 2> {
  using Core = detail::FeedForwardCore<FeedForward<Scalar>, Scalar, 2>;

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

  Activation activation() const { return activation_; }

  using Core::forward;
  /// As forward, keeping what backward needs in `cache` (its buffers reused if shaped right).
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const;

  /// x: [B, T, D], cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D]; adds to the
  /// gradients of up and down. A cache of the right shape but from another x is not detected.
  /// @throws ShapeError (gradients untouched) if x, dy or the cache does not fit.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy);

 private:
  Activation activation_;
};

/// LLaMA's SwiGLU: y = down(silu(gate(x)) ⊙ up(x)), gate, up: D → F, down: F → D (w1, w3, w2).
/// Caches as FeedForward does: gate(x), up(x) and their product, 3·B·T·F values, instead of
/// recomputing two GEMMs (a third of backward's work).
template <class Scalar>
class GatedFeedForward : public detail::FeedForwardCore<GatedFeedForward<Scalar>, Scalar, 3> {
  using Core = detail::FeedForwardCore<GatedFeedForward<Scalar>, Scalar, 3>;

 public:
  /// @throws ConfigError naming the field if d_model or d_ff is ≤ 0.
  GatedFeedForward(index_t d_model, index_t d_ff, GatedFeedForwardOptions options = {});

  /// [D] → [F] (LLaMA's w1), through SiLU.
  Linear<Scalar>& gate() { return this->layers_[0]; }
  const Linear<Scalar>& gate() const { return this->layers_[0]; }

  /// What backward needs from forward; fill with forward(x, cache).
  struct Cache {
    Tensor<Scalar, 3> gate;    ///< gate(x): [B, T, F]
    Tensor<Scalar, 3> up;      ///< up(x): [B, T, F]
    Tensor<Scalar, 3> hidden;  ///< silu(gate) ⊙ up: [B, T, F]
  };

  using Core::forward;
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const;

  /// x: [B, T, D], cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D]; adds to the
  /// gradients of gate, up and down. @throws ShapeError (gradients untouched) on a misfit.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy);
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

/// Whether `layer`'s forward is exactly its packed product plus bias (no live adapter), so that
/// a block may call the packed GEMM with more fused into it.
template <class Scalar>
bool runs_packed(const Linear<Scalar>& layer) {
  return layer.packed() && !(layer.has_adapter() && !layer.adapter_merged());
}

/// y = act(x·Wᵀ + b) + residual on a packed weight (`packed`, by default the layer's own), the
/// bias the layer's (and `up` 's for a gated weight). x, y: [..., in] / [..., out], contiguous.
template <class Scalar, std::size_t Rank>
void packed_forward(const Linear<Scalar>& layer, ConstTensorView<Scalar, Rank> x,
                    TensorView<Scalar, Rank> y,
                    std::optional<ConstTensorView<Scalar, Rank>> residual = std::nullopt,
                    std::optional<Activation> activation = std::nullopt,
                    const PackedWeight* packed = nullptr, const Linear<Scalar>* up = nullptr) {
  if constexpr (std::is_same_v<Scalar, float>) {
    const PackedWeight& w = packed ? *packed : layer.packed_weight();
    const index_t in = x.shape()[Rank - 1], out = y.shape()[Rank - 1];
    const Epilogue epilogue{.bias = layer.has_bias() ? layer.bias().data() : nullptr,
                            .activation = activation,
                            .up_bias = up && up->has_bias() ? up->bias().data() : nullptr,
                            .residual = residual ? residual->data() : nullptr,
                            .residual_stride = out};
    packed_matmul(x.data(), in, in ? x.size() / in : 0, w, y.data(), out, epilogue);
  } else {
    throw Error("packed_forward: packed weights are float only");
  }
}

/// y += residual (same shape, checked by the caller).
template <class Scalar>
void add_residual(Tensor<Scalar, 3>& y, ConstTensorView<Scalar, 3> residual) {
  for (index_t i = 0; i < y.size(); ++i) y.data()[i] += residual.data()[i];
}

}  // namespace detail

// ---- QKVProjection ------------------------------------------------------------------------------

template <class Scalar>
QKVProjection<Scalar>::QKVProjection(index_t d_model, index_t n_heads, QKVOptions options)
    : QKVProjection::HeadsBlock(
          "qkv", d_model, check_heads("QKVProjection", d_model, n_heads, options.n_kv_heads),
          detail::fused_qkv_width(
              check_heads("QKVProjection", d_model, n_heads, options.n_kv_heads)),
          {.bias = options.bias, .init = options.init, .seed = options.seed}) {}

template <class Scalar>
QKV<Scalar> QKVProjection<Scalar>::forward(ConstTensorView<Scalar, 3> x) const {
  detail::check_block_tokens("QKVProjection::forward", "x", x, "D", this->d_model_);
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
  detail::check_block_tokens(op, "x", x, "D", this->d_model_);
  const index_t batch = x.dim(0), tokens = x.dim(1);
  const auto x_text = format_shape(x.shape());
  detail::check_block_shape(
      op, "dq", dq,
      detail::concat("[B, H=", this->heads_.n_heads, ", T, d_k=", this->heads_.head_dim, "]"),
      Shape<4>{batch, this->heads_.n_heads, tokens, this->heads_.head_dim}, "x", x_text);
  const auto kv_pattern =
      detail::concat("[B, H_kv=", this->heads_.n_kv_heads, ", T, d_k=", this->heads_.head_dim, "]");
  const Shape<4> kv_shape{batch, this->heads_.n_kv_heads, tokens, this->heads_.head_dim};
  detail::check_block_shape(op, "dk", dk, kv_pattern, kv_shape, "x", x_text);
  detail::check_block_shape(op, "dv", dv, kv_pattern, kv_shape, "x", x_text);

  // Every column of the fused gradient is written by exactly one of the three merges.
  auto d_fused =
      Tensor<Scalar, 3>::uninitialized({batch, tokens, detail::fused_qkv_width(this->heads_)});
  detail::merge_heads<Scalar>(dq, d_fused, 0);
  detail::merge_heads<Scalar>(dk, d_fused, this->heads_.n_heads * this->heads_.head_dim);
  detail::merge_heads<Scalar>(
      dv, d_fused, (this->heads_.n_heads + this->heads_.n_kv_heads) * this->heads_.head_dim);
  return this->linear_.backward(x, d_fused);
}

// ---- AttentionOutput ----------------------------------------------------------------------------

template <class Scalar>
AttentionOutput<Scalar>::AttentionOutput(index_t d_model, index_t n_heads, BlockOptions options)
    : AttentionOutput::HeadsBlock("proj", d_model, check_heads("AttentionOutput", d_model, n_heads),
                                  d_model, options) {}

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
  detail::check_block_shape(
      op, "residual", residual, detail::concat("[B, T, D=", this->d_model_, "]"),
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
  detail::check_block_shape(
      "AttentionOutput::backward", "dy", dy, detail::concat("[B, T, D=", this->d_model_, "]"),
      Shape<3>{a.dim(0), a.dim(2), this->d_model_}, "a", format_shape(a.shape()));
  const auto d_merged = this->linear_.backward(merged(a), dy);  // [B, T, D]
  auto da = Tensor<Scalar, 4>::uninitialized(a.shape());
  detail::split_heads<Scalar>(d_merged, 0, da);
  return da;
}

// ---- the FFNs -----------------------------------------------------------------------------------

namespace detail {

template <class Derived, class Scalar, std::size_t N>
FeedForwardCore<Derived, Scalar, N>::FeedForwardCore(const char* block, index_t d_model,
                                                     index_t d_ff, bool bias, InitScheme init,
                                                     std::optional<std::uint64_t> seed)
    : d_model_(require_positive(block, "d_model", d_model)),
      d_ff_(require_positive(block, "d_ff", d_ff)),
      layers_([&]<std::size_t... I>(std::index_sequence<I...>) {
        return std::array<Linear<Scalar>, N>{
            Linear<Scalar>(I + 1 < N ? d_model_ : d_ff_, I + 1 < N ? d_ff_ : d_model_,
                           member_options(bias, init, seed, I))...};
      }(std::make_index_sequence<N>{})) {}

template <class Derived, class Scalar, std::size_t N>
void FeedForwardCore<Derived, Scalar, N>::check_input(const char* op,
                                                      ConstTensorView<Scalar, 3> x) const {
  check_block_tokens(op, "x", x, "D", d_model_);
}

template <class Derived, class Scalar, std::size_t N>
void FeedForwardCore<Derived, Scalar, N>::pack() requires std::is_same_v<Scalar, float> {
  auto& up_layer = layers_[N - 2];
  for (auto& layer : layers_) {
    if (layer.quantized()) {
      throw Error("FeedForward::pack: a layer is quantised; its own kernels already run packed");
    }
    layer.set_frozen(true);
  }
  layers_[N - 1].pack();
  if constexpr (N == 3) {
    const auto& gate = layers_[0];
    packed_in_.emplace(PackedWeight::gated(gate.weight().data(), up_layer.weight().data(), d_ff_,
                                           d_model_, d_model_, d_model_));
  } else {
    packed_in_.emplace(up_layer.weight().data(), d_ff_, d_model_, d_model_);
  }
  for (std::size_t i = 0; i < N; ++i) packed_generations_[i] = layers_[i].weight_generation();
}

template <class Derived, class Scalar, std::size_t N>
void FeedForwardCore<Derived, Scalar, N>::unpack() {
  packed_in_.reset();
  layers_[N - 1].unpack();
}

template <class Derived, class Scalar, std::size_t N>
bool FeedForwardCore<Derived, Scalar, N>::packed() const {
  if (!packed_in_ || !runs_packed(layers_[N - 1])) return false;
  for (std::size_t i = 0; i + 1 < N; ++i) {
    const auto& layer = layers_[i];
    if (layer.weight_generation() != packed_generations_[i] || layer.has_adapter()) return false;
  }
  return true;
}

template <class Derived, class Scalar, std::size_t N>
Tensor<Scalar, 3> FeedForwardCore<Derived, Scalar, N>::forward(
    ConstTensorView<Scalar, 3> x, ConstTensorView<Scalar, 3> residual) const {
  check_input("FeedForward::forward", x);
  check_block_shape("FeedForward::forward", "residual", residual, token_shape_text("D", d_model_),
                    x.shape(), "x", format_shape(x.shape()));
  return forward_fused(x, residual);
}

template <class Derived, class Scalar, std::size_t N>
Tensor<Scalar, 3> FeedForwardCore<Derived, Scalar, N>::forward_fused(
    ConstTensorView<Scalar, 3> x, std::optional<ConstTensorView<Scalar, 3>> residual) const {
  const auto& self = static_cast<const Derived&>(*this);
  if (!packed()) {
    typename Derived::Cache scratch;
    auto y = self.forward(x, scratch);
    if (residual) add_residual<Scalar>(y, *residual);
    return y;
  }
  check_input("FeedForward::forward", x);
  auto hidden = Tensor<Scalar, 3>::uninitialized({x.dim(0), x.dim(1), d_ff_});
  if constexpr (N == 3) {  // silu(x·W_gᵀ + b_g) ⊙ (x·W_uᵀ + b_u) in one product
    packed_forward<Scalar, 3>(layers_[0], x, hidden.view(), std::nullopt, Activation::silu,
                              &*packed_in_, &layers_[1]);
  } else {
    packed_forward<Scalar, 3>(layers_[0], x, hidden.view(), std::nullopt, self.activation(),
                              &*packed_in_);
  }
  auto y = Tensor<Scalar, 3>::uninitialized(x.shape());
  packed_forward<Scalar, 3>(layers_[N - 1], hidden.cview(), y.view(), residual);
  return y;
}

/// Before any gradient is touched: x is [B, T, D], dy is x's shape and every cached tensor is
/// [B, T, F].
template <class Scalar>
void check_ffn_backward(
    const char* op, index_t d_model, index_t d_ff, ConstTensorView<Scalar, 3> x,
    ConstTensorView<Scalar, 3> dy,
    std::initializer_list<std::pair<const char*, ConstTensorView<Scalar, 3>>> cached) {
  check_block_tokens(op, "x", x, "D", d_model);
  const auto x_text = format_shape(x.shape());
  check_block_shape(op, "dy", dy, token_shape_text("D", d_model), x.shape(), "x", x_text);
  const Shape<3> hidden_shape{x.dim(0), x.dim(1), d_ff};
  for (const auto& [name, tensor] : cached) {
    check_block_shape(op, name, tensor, token_shape_text("F", d_ff), hidden_shape, "x", x_text,
                      cache_hint);
  }
}

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
FeedForward<Scalar>::FeedForward(index_t d_model, std::optional<index_t> d_ff,
                                 Activation activation, BlockOptions options)
    : Core("FeedForward", d_model,
           d_ff ? *d_ff : checked_mul(4, d_model, "FeedForward: d_ff = 4·d_model"), options.bias,
           options.init, options.seed),
      activation_(check_activation("FeedForward", activation)) {}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x, Cache& cache) const {
  this->check_input("FeedForward::forward", x);
  detail::forward_into_cache(this->up(), x, cache.hidden);
  detail::reuse_buffer(cache.activated, cache.hidden.shape());
  activate_into(cache.hidden, cache.activated, activation_);
  return this->down().forward(cache.activated);
}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                                                ConstTensorView<Scalar, 3> dy) {
  detail::check_ffn_backward<Scalar>(
      "FeedForward::backward", this->d_model_, this->d_ff_, x, dy,
      {{"cache.hidden", cache.hidden}, {"cache.activated", cache.activated}});
  auto d_hidden = this->down().backward(cache.activated, dy);             // d f(hidden)
  activate_backward_into(cache.hidden, d_hidden, d_hidden, activation_);  // in place: d hidden
  return this->up().backward(x, d_hidden);
}

template <class Scalar>
GatedFeedForward<Scalar>::GatedFeedForward(index_t d_model, index_t d_ff,
                                           GatedFeedForwardOptions options)
    : Core("GatedFeedForward", d_model, d_ff, options.bias, options.init, options.seed) {}

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::forward(ConstTensorView<Scalar, 3> x,
                                                    Cache& cache) const {
  this->check_input("GatedFeedForward::forward", x);
  detail::forward_into_cache(gate(), x, cache.gate);
  detail::forward_into_cache(this->up(), x, cache.up);
  detail::reuse_buffer(cache.hidden, cache.gate.shape());
  detail::swiglu_into<Scalar>(cache.gate, cache.up, cache.hidden);
  return this->down().forward(cache.hidden);
}

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::backward(ConstTensorView<Scalar, 3> x,
                                                     const Cache& cache,
                                                     ConstTensorView<Scalar, 3> dy) {
  detail::check_ffn_backward<Scalar>(
      "GatedFeedForward::backward", this->d_model_, this->d_ff_, x, dy,
      {{"cache.gate", cache.gate}, {"cache.up", cache.up}, {"cache.hidden", cache.hidden}});
  // d hidden → d up = d hidden ⊙ silu(gate) and d gate = silu'(gate) · (d hidden ⊙ up), the
  // latter written over d hidden once both are read.
  auto d_gate = this->down().backward(cache.hidden, dy);  // d hidden: [B, T, F]
  auto d_up = Tensor<Scalar, 3>::uninitialized(d_gate.shape());
  for (index_t i = 0; i < d_gate.size(); ++i) {
    const Scalar g = cache.gate.data()[i], d_hidden = d_gate.data()[i];
    d_up.data()[i] = d_hidden * detail::activation_value<Activation::silu>(g);
    d_gate.data()[i] =
        detail::activation_gradient<Activation::silu>(g, d_hidden * cache.up.data()[i]);
  }
  auto dx = gate().backward(x, d_gate);
  dx.vector() += this->up().backward(x, d_up).vector();
  return dx;
}

// ---- printing -----------------------------------------------------------------------------------

namespace detail {
/// "Name(field=value, …, bias=true)": the one format of every block's operator<<.
inline std::ostream& print_block(std::ostream& out, std::string_view name,
                                 std::initializer_list<std::pair<const char*, index_t>> sizes,
                                 bool bias, const char* activation = nullptr) {
  out << name << '(';
  for (const auto& [field, value] : sizes) out << field << '=' << value << ", ";
  if (activation) out << "activation=" << activation << ", ";
  return out << "bias=" << (bias ? "true" : "false") << ')';
}
}  // namespace detail

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const QKVProjection<Scalar>& b) {
  const bool bias = b.qkv().has_bias();
  return detail::print_block(
      out, "QKVProjection",
      {{"d_model", b.d_model()}, {"n_heads", b.n_heads()}, {"n_kv_heads", b.n_kv_heads()}}, bias);
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const AttentionOutput<Scalar>& b) {
  return detail::print_block(out, "AttentionOutput",
                             {{"d_model", b.d_model()}, {"n_heads", b.n_heads()}},
                             b.proj().has_bias());
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const FeedForward<Scalar>& b) {
  return detail::print_block(out, "FeedForward", {{"d_model", b.d_model()}, {"d_ff", b.d_ff()}},
                             b.up().has_bias(), to_string(b.activation()));
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const GatedFeedForward<Scalar>& b) {
  const auto sizes = {std::pair<const char*, index_t>{"d_model", b.d_model()}, {"d_ff", b.d_ff()}};
  return detail::print_block(out, "GatedFeedForward", sizes, b.gate().has_bias());
}

}  // namespace dissect
