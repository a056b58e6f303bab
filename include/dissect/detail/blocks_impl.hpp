// dissect/detail/blocks_impl.hpp — private: do not include directly (dissect/blocks.hpp does).
//
// The bodies of the blocks declared in blocks.hpp. Each public method checks every input shape
// and every member's parameter shapes before touching a gradient, so a throw leaves the block as
// it was; then it only calls Linear, the activation loops and the head split/merge copies.
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "dissect/activation.hpp"
#include "dissect/detail/heads.hpp"
#include "dissect/error.hpp"
#include "dissect/linear.hpp"

namespace dissect {
namespace detail {

inline index_t positive_block_size(const char* block, const char* field, index_t value) {
  if (value <= 0) throw ConfigError(concat(block, ": ", field, " must be > 0 (got ", value, ")"));
  return value;
}

/// d_model / n_heads, after checking both sizes and that the division is exact.
inline index_t block_head_dim(const char* block, index_t d_model, index_t n_heads) {
  positive_block_size(block, "d_model", d_model);
  positive_block_size(block, "n_heads", n_heads);
  if (d_model % n_heads != 0) {
    throw ConfigError(
        concat(block, ": d_model ", d_model, " is not divisible by n_heads ", n_heads));
  }
  return d_model / n_heads;
}

/// H_kv: `n_kv_heads` or, unset, n_heads; checked after d_model and n_heads themselves.
inline index_t block_kv_heads(const char* block, index_t d_model, index_t n_heads,
                              std::optional<index_t> n_kv_heads) {
  block_head_dim(block, d_model, n_heads);
  const index_t kv_heads = positive_block_size(block, "n_kv_heads", n_kv_heads.value_or(n_heads));
  if (n_heads % kv_heads != 0) {
    throw ConfigError(
        concat(block, ": n_kv_heads ", kv_heads, " does not divide n_heads ", n_heads));
  }
  return kv_heads;
}

inline Activation block_activation(const char* block, Activation activation) {
  switch (activation) {
    case Activation::relu:
    case Activation::gelu:
    case Activation::gelu_tanh:
    case Activation::silu:
      return activation;
  }
  throw ConfigError(concat(block, ": activation ", static_cast<int>(activation),
                           " is not one of relu, gelu, gelu_tanh, silu"));
}

/// The options of a block's `index`-th Linear: consecutive seeds from one block seed.
inline LinearOptions member_options(bool bias, InitScheme init, std::optional<std::uint64_t> seed,
                                    std::uint64_t index) {
  return {.bias = bias,
          .init = init,
          .seed = seed ? std::optional<std::uint64_t>(*seed + index) : std::nullopt};
}

/// A member's parameters still have the shapes the block was built with: weight() hands out a
/// mutable reference, and a misfit must be reported (naming the block) before any member's
/// gradient is touched, not halfway through a backward.
template <class Scalar>
void check_block_member(std::string_view op, std::string_view name, const Linear<Scalar>& layer,
                        std::string_view dims, index_t out, index_t in) {
  if (layer.weight().shape() != Shape<2>{out, in}) {
    throw ShapeError(concat(op, ": ", name, " weight has shape ",
                            format_shape(layer.weight().shape()), ", expected ", dims, " = [", out,
                            ", ", in, "] (use set_weight)"));
  }
  if (layer.has_bias() && layer.bias().shape() != Shape<1>{out}) {
    throw ShapeError(concat(op, ": ", name, " bias has shape ", format_shape(layer.bias().shape()),
                            ", expected [", out, "] (use set_bias)"));
  }
}

/// "[B, T, D=768]"-style expectation text for messages.
inline std::string token_shape_text(const char* last_name, index_t last) {
  return concat("[B, T, ", last_name, "=", last, "]");
}

template <class Scalar>
void check_block_tokens(std::string_view op, const char* name, const Tensor<Scalar, 3>& tensor,
                        const char* last_name, index_t last) {
  if (tensor.dim(2) != last) {
    throw ShapeError(concat(op, ": ", name, " must be ", token_shape_text(last_name, last),
                            ", got ", format_shape(tensor.shape())));
  }
}

/// `tensor` must be exactly `expected` (derived from an input already checked).
template <class Scalar, std::size_t Rank>
void check_block_shape(std::string_view op, const char* name, const Tensor<Scalar, Rank>& tensor,
                       std::string_view pattern, const Shape<Rank>& expected,
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
void forward_into_cache(const Linear<Scalar>& layer, const Tensor<Scalar, 3>& x,
                        Tensor<Scalar, 3>& buffer) {
  const Shape<3> shape{x.dim(0), x.dim(1), layer.out_features()};
  if (buffer.shape() == shape) {
    layer.forward_into(x, buffer);
  } else {
    buffer = layer.forward(x);
  }
}

inline constexpr std::string_view cache_hint = " (fill the cache with forward(x, cache))";

template <class Scalar>
void resize_block_buffer(Tensor<Scalar, 3>& buffer, const Shape<3>& shape) {
  if (buffer.shape() != shape) buffer = Tensor<Scalar, 3>::uninitialized(shape);
}

}  // namespace detail

// ---- QKVProjection ------------------------------------------------------------------------------

template <class Scalar>
QKVProjection<Scalar>::QKVProjection(index_t d_model, index_t n_heads, QKVOptions options)
    : d_model_(d_model),
      n_heads_(n_heads),
      n_kv_heads_(detail::block_kv_heads("QKVProjection", d_model, n_heads, options.n_kv_heads)),
      head_dim_(d_model / n_heads),
      qkv_(d_model, fused_width(),
           detail::member_options(options.bias, options.init, options.seed, 0)) {}

template <class Scalar>
index_t QKVProjection<Scalar>::fused_width() const {
  return checked_mul(n_heads_ + 2 * n_kv_heads_, head_dim_, "QKVProjection: (H + 2·H_kv)·d_k");
}

template <class Scalar>
void QKVProjection<Scalar>::check_input(const char* op, const Tensor<Scalar, 3>& x) const {
  detail::check_block_member(op, "qkv", qkv_, "[(H + 2·H_kv)·d_k, D]", fused_width(), d_model_);
  detail::check_block_tokens(op, "x", x, "D", d_model_);
}

template <class Scalar>
QKV<Scalar> QKVProjection<Scalar>::forward(const Tensor<Scalar, 3>& x) const {
  check_input("QKVProjection::forward", x);
  const index_t batch = x.dim(0), tokens = x.dim(1);
  const auto fused = qkv_.forward(x);  // [B, T, (H + 2·H_kv)·d_k]
  QKV<Scalar> out{Tensor<Scalar, 4>::uninitialized({batch, n_heads_, tokens, head_dim_}),
                  Tensor<Scalar, 4>::uninitialized({batch, n_kv_heads_, tokens, head_dim_}),
                  Tensor<Scalar, 4>::uninitialized({batch, n_kv_heads_, tokens, head_dim_})};
  detail::split_heads(fused, 0, out.q);
  detail::split_heads(fused, n_heads_ * head_dim_, out.k);
  detail::split_heads(fused, (n_heads_ + n_kv_heads_) * head_dim_, out.v);
  return out;
}

template <class Scalar>
Tensor<Scalar, 3> QKVProjection<Scalar>::backward(const Tensor<Scalar, 3>& x,
                                                  const Tensor<Scalar, 4>& dq,
                                                  const Tensor<Scalar, 4>& dk,
                                                  const Tensor<Scalar, 4>& dv) {
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
  detail::merge_heads(dq, d_fused, 0);
  detail::merge_heads(dk, d_fused, n_heads_ * head_dim_);
  detail::merge_heads(dv, d_fused, (n_heads_ + n_kv_heads_) * head_dim_);
  return qkv_.backward(x, d_fused);
}

// ---- AttentionOutput ----------------------------------------------------------------------------

template <class Scalar>
AttentionOutput<Scalar>::AttentionOutput(index_t d_model, index_t n_heads, BlockOptions options)
    : d_model_(d_model),
      n_heads_(n_heads),
      head_dim_(detail::block_head_dim("AttentionOutput", d_model, n_heads)),
      proj_(d_model, d_model, detail::member_options(options.bias, options.init, options.seed, 0)) {
}

template <class Scalar>
void AttentionOutput<Scalar>::check_input(const char* op, const Tensor<Scalar, 4>& a) const {
  detail::check_block_member(op, "proj", proj_, "[D, D]", d_model_, d_model_);
  if (a.dim(1) != n_heads_ || a.dim(3) != head_dim_) {
    throw ShapeError(detail::concat(op, ": a must be [B, H=", n_heads_, ", T, d_k=", head_dim_,
                                    "], got ", format_shape(a.shape())));
  }
}

template <class Scalar>
Tensor<Scalar, 3> AttentionOutput<Scalar>::merged(const Tensor<Scalar, 4>& a) const {
  auto rows = Tensor<Scalar, 3>::uninitialized({a.dim(0), a.dim(2), d_model_});
  detail::merge_heads(a, rows, 0);  // H·d_k = D: every column written
  return rows;
}

template <class Scalar>
Tensor<Scalar, 3> AttentionOutput<Scalar>::forward(const Tensor<Scalar, 4>& a) const {
  check_input("AttentionOutput::forward", a);
  return proj_.forward(merged(a));
}

template <class Scalar>
Tensor<Scalar, 4> AttentionOutput<Scalar>::backward(const Tensor<Scalar, 4>& a,
                                                    const Tensor<Scalar, 3>& dy) {
  check_input("AttentionOutput::backward", a);
  detail::check_block_shape("AttentionOutput::backward", "dy", dy,
                            detail::concat("[B, T, D=", d_model_, "]"),
                            Shape<3>{a.dim(0), a.dim(2), d_model_}, "a", format_shape(a.shape()));
  const auto d_merged = proj_.backward(merged(a), dy);  // [B, T, D]
  auto da = Tensor<Scalar, 4>::uninitialized(a.shape());
  detail::split_heads(d_merged, 0, da);
  return da;
}

// ---- FeedForward --------------------------------------------------------------------------------

template <class Scalar>
FeedForward<Scalar>::FeedForward(index_t d_model, std::optional<index_t> d_ff,
                                 Activation activation, BlockOptions options)
    : d_model_(detail::positive_block_size("FeedForward", "d_model", d_model)),
      d_ff_(d_ff ? detail::positive_block_size("FeedForward", "d_ff", *d_ff)
                 : checked_mul(4, d_model, "FeedForward: d_ff = 4·d_model")),
      activation_(detail::block_activation("FeedForward", activation)),
      up_(d_model_, d_ff_, detail::member_options(options.bias, options.init, options.seed, 0)),
      down_(d_ff_, d_model_, detail::member_options(options.bias, options.init, options.seed, 1)) {}

template <class Scalar>
void FeedForward<Scalar>::check_input(const char* op, const Tensor<Scalar, 3>& x) const {
  detail::check_block_member(op, "up", up_, "[F, D]", d_ff_, d_model_);
  detail::check_block_member(op, "down", down_, "[D, F]", d_model_, d_ff_);
  detail::check_block_tokens(op, "x", x, "D", d_model_);
}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::forward(const Tensor<Scalar, 3>& x) const {
  check_input("FeedForward::forward", x);
  auto hidden = up_.forward(x);                // [B, T, F]
  activate_into(hidden, hidden, activation_);  // in place
  return down_.forward(hidden);
}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::forward(const Tensor<Scalar, 3>& x, Cache& cache) const {
  check_input("FeedForward::forward", x);
  detail::forward_into_cache(up_, x, cache.hidden);
  detail::resize_block_buffer(cache.activated, cache.hidden.shape());
  activate_into(cache.hidden, cache.activated, activation_);
  return down_.forward(cache.activated);
}

template <class Scalar>
Tensor<Scalar, 3> FeedForward<Scalar>::backward(const Tensor<Scalar, 3>& x, const Cache& cache,
                                                const Tensor<Scalar, 3>& dy) {
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
    : d_model_(detail::positive_block_size("GatedFeedForward", "d_model", d_model)),
      d_ff_(detail::positive_block_size("GatedFeedForward", "d_ff", d_ff)),
      gate_(d_model_, d_ff_, detail::member_options(options.bias, options.init, options.seed, 0)),
      up_(d_model_, d_ff_, detail::member_options(options.bias, options.init, options.seed, 1)),
      down_(d_ff_, d_model_, detail::member_options(options.bias, options.init, options.seed, 2)) {}

template <class Scalar>
void GatedFeedForward<Scalar>::check_input(const char* op, const Tensor<Scalar, 3>& x) const {
  detail::check_block_member(op, "gate", gate_, "[F, D]", d_ff_, d_model_);
  detail::check_block_member(op, "up", up_, "[F, D]", d_ff_, d_model_);
  detail::check_block_member(op, "down", down_, "[D, F]", d_model_, d_ff_);
  detail::check_block_tokens(op, "x", x, "D", d_model_);
}

namespace detail {
/// hidden = silu(gate) ⊙ up elementwise; hidden may be gate itself.
template <class Scalar>
void swiglu_into(const Tensor<Scalar, 3>& gate, const Tensor<Scalar, 3>& up,
                 Tensor<Scalar, 3>& hidden) {
  for (index_t i = 0; i < gate.size(); ++i) {
    hidden.data()[i] = activation_value<Activation::silu>(gate.data()[i]) * up.data()[i];
  }
}
}  // namespace detail

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::forward(const Tensor<Scalar, 3>& x) const {
  check_input("GatedFeedForward::forward", x);
  auto hidden = gate_.forward(x);  // [B, T, F], becomes silu(gate) ⊙ up in place
  detail::swiglu_into(hidden, up_.forward(x), hidden);
  return down_.forward(hidden);
}

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::forward(const Tensor<Scalar, 3>& x,
                                                    Cache& cache) const {
  check_input("GatedFeedForward::forward", x);
  detail::forward_into_cache(gate_, x, cache.gate);
  detail::forward_into_cache(up_, x, cache.up);
  detail::resize_block_buffer(cache.hidden, cache.gate.shape());
  detail::swiglu_into(cache.gate, cache.up, cache.hidden);
  return down_.forward(cache.hidden);
}

template <class Scalar>
Tensor<Scalar, 3> GatedFeedForward<Scalar>::backward(const Tensor<Scalar, 3>& x, const Cache& cache,
                                                     const Tensor<Scalar, 3>& dy) {
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
