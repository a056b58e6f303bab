// dissect/blocks/cross_attention.hpp — CrossAttention, an encoder-decoder layer's attention over
// the encoder's output (BART's and Whisper's encoder_attn): queries projected from the decoder's
// x [B, T, D], keys and values from the memory [B, S, D_mem] (D_mem may differ from D), per-head
// cross_attention with an optional key padding mask, then the output projection.
//
// Four Linear layers named as PyTorch's nn.MultiheadAttention-style modules name them: q_proj
// [H·d_k, D], k_proj and v_proj [H_kv·d_k, D_mem], out_proj [D, H·d_k], d_k = D / H. backward
// returns dx and dmemory and adds into the four layers' gradients.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/accounting/config.hpp"
#include "dissect/attention/cross_attention.hpp"
#include "dissect/blocks/block_options.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/detail/print_block.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/detail/heads.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

struct CrossAttentionOptions {
  std::optional<index_t> d_memory = std::nullopt;    ///< D_mem, the memory's width; unset: D
  std::optional<index_t> n_kv_heads = std::nullopt;  ///< H_kv (grouped-query); unset: H
  bool bias = true;
  InitScheme init = InitScheme::pytorch_default;
  /// With a seed, q_proj, k_proj, v_proj, out_proj take seed, seed + 1, seed + 2, seed + 3.
  std::optional<std::uint64_t> seed = std::nullopt;
  std::optional<double> scale = std::nullopt;  ///< the score scale; unset: 1/√d_k
};

/// y = out_proj(merge(cross_attention(split(q_proj(x)), split(k_proj(memory)),
///                                    split(v_proj(memory)), mask))).
template <class Scalar>
class CrossAttention : public ComposedModule<CrossAttention<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// What backward needs from forward(x, memory, cache, mask).
  struct Cache {
    Tensor<Scalar, 4> q;                    ///< [B, H, T, d_k]
    Tensor<Scalar, 4> k, v;                 ///< [B, H_kv, S, d_k]
    Tensor<Scalar, 3> merged;               ///< the attention's output, heads merged: [B, T, D]
    CrossAttentionCache<Scalar> attention;  ///< P [B, H, T, S] and the scale
  };
  /// The memory's keys and values, projected once: what a decoder generating token by token
  /// reuses at every step, as its encoder's output does not change.
  struct MemoryKV {
    Tensor<Scalar, 4> k, v;  ///< [B, H_kv, S, d_k]
  };
  struct Gradients {
    Tensor<Scalar, 3> dx;       ///< [B, T, D]
    Tensor<Scalar, 3> dmemory;  ///< [B, S, D_mem]
  };

  /// @throws ConfigError naming the field if d_model, n_heads, n_kv_heads or d_memory is ≤ 0,
  ///         n_heads does not divide d_model or n_kv_heads does not divide n_heads, or the scale
  ///         is not finite and > 0.
  CrossAttention(index_t d_model, index_t n_heads, CrossAttentionOptions options = {});

  index_t d_model() const { return d_model_; }
  index_t d_memory() const { return d_memory_; }
  index_t n_heads() const { return heads_.n_heads; }
  index_t n_kv_heads() const { return heads_.n_kv_heads; }
  index_t head_dim() const { return heads_.head_dim; }
  std::optional<double> scale() const { return scale_; }

  Linear<Scalar>& q_proj() { return q_proj_; }
  const Linear<Scalar>& q_proj() const { return q_proj_; }
  Linear<Scalar>& k_proj() { return k_proj_; }
  const Linear<Scalar>& k_proj() const { return k_proj_; }
  Linear<Scalar>& v_proj() { return v_proj_; }
  const Linear<Scalar>& v_proj() const { return v_proj_; }
  Linear<Scalar>& out_proj() { return out_proj_; }
  const Linear<Scalar>& out_proj() const { return out_proj_; }

  /// x: [B, T, D], memory: [B, S, D_mem], mask [B, S] or none → y: [B, T, D]. A query whose
  /// memory is all padding attends to nothing: its attention output is 0 (y = out_proj's bias).
  /// @throws ShapeError naming the op and the shapes if x or memory does not fit, their B
  ///         differ, S = 0 or the mask is not [B, S].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, ConstTensorView<Scalar, 3> memory,
                            const KeyPaddingMask& mask = {}) const;
  /// memory: [B, S, D_mem] → its keys and values per head. @throws ShapeError if memory is not
  ///         [B, S ≥ 1, D_mem].
  MemoryKV project_memory(ConstTensorView<Scalar, 3> memory) const;
  /// forward(x, memory, mask) with the memory projected beforehand: equal to it for any x, so a
  /// decoding step projects only its new queries. @throws ShapeError naming the op and shapes if
  ///         x is not [B, T, D], or k and v are not [B, H_kv, S ≥ 1, d_k] alike, or the mask not
  ///         [B, S].
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, const MemoryKV& memory_kv,
                            const KeyPaddingMask& mask = {}) const;
  /// As forward, keeping what backward needs in `cache` (its buffers reused if shaped right).
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, ConstTensorView<Scalar, 3> memory,
                            Cache& cache, const KeyPaddingMask& mask = {}) const;

  /// x, memory and the cache of forward(x, memory, cache, mask), dy: [B, T, D] → {dx, dmemory};
  /// adds to the four layers' gradients. @throws ShapeError (gradients untouched) if x, memory,
  /// dy or the cache does not fit.
  Gradients backward(ConstTensorView<Scalar, 3> x, ConstTensorView<Scalar, 3> memory,
                     const Cache& cache, ConstTensorView<Scalar, 3> dy);

 private:
  friend class ComposedModule<CrossAttention<Scalar>>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child("q_proj", self.q_proj_, visit);
    visit_child("k_proj", self.k_proj_, visit);
    visit_child("v_proj", self.v_proj_, visit);
    visit_child("out_proj", self.out_proj_, visit);
  }

  void check_inputs(const char* op, ConstTensorView<Scalar, 3> x,
                    ConstTensorView<Scalar, 3> memory) const;
  Tensor<Scalar, 4> heads(const Linear<Scalar>& layer, ConstTensorView<Scalar, 3> rows,
                          index_t n_heads) const;
  Tensor<Scalar, 3> merged(ConstTensorView<Scalar, 4> heads) const;

  index_t d_model_;
  HeadLayout heads_;  // checked before d_memory_, which defaults to d_model
  index_t d_memory_;
  std::optional<double> scale_;
  Linear<Scalar> q_proj_, k_proj_, v_proj_, out_proj_;
};

/// "CrossAttention(d_model=512, d_memory=768, n_heads=8, n_kv_heads=8, bias=true)".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const CrossAttention<Scalar>& block);

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
CrossAttention<Scalar>::CrossAttention(index_t d_model, index_t n_heads,
                                       CrossAttentionOptions options)
    : d_model_(d_model),
      heads_(check_heads("CrossAttention", d_model, n_heads, options.n_kv_heads)),
      d_memory_(require_positive("CrossAttention", "d_memory", options.d_memory.value_or(d_model))),
      scale_(options.scale ? std::optional<double>(
                                 require_positive_finite("CrossAttention", "scale", *options.scale))
                           : std::nullopt),
      q_proj_(d_model, heads_.n_heads * heads_.head_dim,
              detail::member_options(options.bias, options.init, options.seed, 0)),
      k_proj_(d_memory_, heads_.n_kv_heads * heads_.head_dim,
              detail::member_options(options.bias, options.init, options.seed, 1)),
      v_proj_(d_memory_, heads_.n_kv_heads * heads_.head_dim,
              detail::member_options(options.bias, options.init, options.seed, 2)),
      out_proj_(heads_.n_heads * heads_.head_dim, d_model,
                detail::member_options(options.bias, options.init, options.seed, 3)) {}

template <class Scalar>
void CrossAttention<Scalar>::check_inputs(const char* op, ConstTensorView<Scalar, 3> x,
                                          ConstTensorView<Scalar, 3> memory) const {
  check_block_tokens(op, "x", x, "D", d_model_);
  check_block_tokens(op, "memory", memory, "D_mem", d_memory_);
  if (memory.dim(0) != x.dim(0)) {
    throw ShapeError(concat(op, ": memory must have x's batch B = ", x.dim(0), " (x ",
                            format_shape(x.shape()), ", memory ", format_shape(memory.shape()),
                            ")"));
  }
  if (memory.dim(1) == 0) {
    throw ShapeError(concat(op,
                            ": the memory holds S = 0 positions: there is nothing to attend "
                            "to (x ",
                            format_shape(x.shape()), ", memory ", format_shape(memory.shape()),
                            ")"));
  }
}

template <class Scalar>
Tensor<Scalar, 4> CrossAttention<Scalar>::heads(const Linear<Scalar>& layer,
                                                ConstTensorView<Scalar, 3> rows,
                                                index_t n_heads) const {
  const auto projected = layer.forward(rows);  // [B, rows, n_heads·d_k]
  auto out = Tensor<Scalar, 4>::uninitialized({rows.dim(0), n_heads, rows.dim(1), heads_.head_dim});
  detail::split_heads<Scalar>(projected, 0, out);
  return out;
}

template <class Scalar>
Tensor<Scalar, 3> CrossAttention<Scalar>::merged(ConstTensorView<Scalar, 4> heads) const {
  auto rows =
      Tensor<Scalar, 3>::uninitialized({heads.dim(0), heads.dim(2), heads.dim(1) * heads.dim(3)});
  detail::merge_heads<Scalar>(heads, rows, 0);  // every column written
  return rows;
}

template <class Scalar>
Tensor<Scalar, 3> CrossAttention<Scalar>::forward(ConstTensorView<Scalar, 3> x,
                                                  ConstTensorView<Scalar, 3> memory,
                                                  const KeyPaddingMask& mask) const {
  constexpr const char* op = "CrossAttention::forward";
  check_inputs(op, x, memory);
  // The mask is checked against [B, S] inside cross_attention, before any value is read; the
  // projections before it cost time but change nothing.
  const auto q = heads(q_proj_, x, heads_.n_heads);
  const auto k = heads(k_proj_, memory, heads_.n_kv_heads);
  const auto v = heads(v_proj_, memory, heads_.n_kv_heads);
  return out_proj_.forward(merged(cross_attention(q, k, v, mask, scale_)));
}

template <class Scalar>
typename CrossAttention<Scalar>::MemoryKV CrossAttention<Scalar>::project_memory(
    ConstTensorView<Scalar, 3> memory) const {
  constexpr const char* op = "CrossAttention::project_memory";
  check_block_tokens(op, "memory", memory, "D_mem", d_memory_);
  if (memory.dim(1) == 0) {
    throw ShapeError(concat(op,
                            ": the memory holds S = 0 positions: there is nothing to attend "
                            "to (memory ",
                            format_shape(memory.shape()), ")"));
  }
  return {heads(k_proj_, memory, heads_.n_kv_heads), heads(v_proj_, memory, heads_.n_kv_heads)};
}

template <class Scalar>
Tensor<Scalar, 3> CrossAttention<Scalar>::forward(ConstTensorView<Scalar, 3> x,
                                                  const MemoryKV& memory_kv,
                                                  const KeyPaddingMask& mask) const {
  constexpr const char* op = "CrossAttention::forward";
  check_block_tokens(op, "x", x, "D", d_model_);
  const auto& k = memory_kv.k;
  const Shape<4> expected{x.dim(0), heads_.n_kv_heads, k.dim(2), heads_.head_dim};
  if (k.shape() != expected || memory_kv.v.shape() != expected) {
    throw ShapeError(concat(op, ": the projected memory's k and v must be [B=", x.dim(0),
                            ", H_kv=", heads_.n_kv_heads, ", S, d_k=", heads_.head_dim, "] (x ",
                            format_shape(x.shape()), ", k ", format_shape(k.shape()), ", v ",
                            format_shape(memory_kv.v.shape()), ")"));
  }
  const auto q = heads(q_proj_, x, heads_.n_heads);
  return out_proj_.forward(merged(cross_attention(q, k, memory_kv.v, mask, scale_)));
}

template <class Scalar>
Tensor<Scalar, 3> CrossAttention<Scalar>::forward(ConstTensorView<Scalar, 3> x,
                                                  ConstTensorView<Scalar, 3> memory, Cache& cache,
                                                  const KeyPaddingMask& mask) const {
  constexpr const char* op = "CrossAttention::forward";
  check_inputs(op, x, memory);
  if (mask.has_value() && (mask.batch() != x.dim(0) || mask.keys() != memory.dim(1))) {
    // Refused here too, before the cache is written.
    throw ShapeError(concat(op, ": the key padding mask must be [B=", x.dim(0),
                            ", S=", memory.dim(1), "], got [", mask.batch(), ", ", mask.keys(),
                            "] (x ", format_shape(x.shape()), ", memory ",
                            format_shape(memory.shape()), ")"));
  }
  cache.q = heads(q_proj_, x, heads_.n_heads);
  cache.k = heads(k_proj_, memory, heads_.n_kv_heads);
  cache.v = heads(v_proj_, memory, heads_.n_kv_heads);
  cache.merged = merged(cross_attention(cache.q, cache.k, cache.v, cache.attention, mask, scale_));
  return out_proj_.forward(cache.merged);
}

template <class Scalar>
typename CrossAttention<Scalar>::Gradients CrossAttention<Scalar>::backward(
    ConstTensorView<Scalar, 3> x, ConstTensorView<Scalar, 3> memory, const Cache& cache,
    ConstTensorView<Scalar, 3> dy) {
  constexpr const char* op = "CrossAttention::backward";
  check_inputs(op, x, memory);
  const index_t batch = x.dim(0), tokens = x.dim(1), keys = memory.dim(1);
  const index_t d_k = heads_.head_dim, h = heads_.n_heads, h_kv = heads_.n_kv_heads;
  const auto x_text = format_shape(x.shape());
  check_block_shape(op, "dy", dy, detail::token_shape_text("D", d_model_), x.shape(), "x", x_text);
  // Every cached tensor checked before any gradient is touched (strong guarantee).
  const auto q_pattern = concat("[B, H=", h, ", T, d_k=", d_k, "]");
  check_block_shape(op, "cache.q", cache.q, q_pattern, Shape<4>{batch, h, tokens, d_k}, "x", x_text,
                    block_cache_hint);
  const auto mem_text = format_shape(memory.shape());
  const auto kv_pattern = concat("[B, H_kv=", h_kv, ", S, d_k=", d_k, "]");
  const Shape<4> kv_shape{batch, h_kv, keys, d_k};
  check_block_shape(op, "cache.k", cache.k, kv_pattern, kv_shape, "memory", mem_text,
                    block_cache_hint);
  check_block_shape(op, "cache.v", cache.v, kv_pattern, kv_shape, "memory", mem_text,
                    block_cache_hint);
  check_block_shape(op, "cache.merged", cache.merged, detail::token_shape_text("D", h * d_k),
                    Shape<3>{batch, tokens, h * d_k}, "x", x_text, block_cache_hint);
  check_block_shape(op, "cache.attention.probs", cache.attention.probs, "[B, H, T, S]",
                    Shape<4>{batch, h, tokens, keys}, "x and memory",
                    concat(x_text, ", ", mem_text), block_cache_hint);
  // The cached scale too: after this nothing below can throw on the cache's account.
  (void)detail::score_scale<Scalar>(op, cache.attention.scale, d_k);
  const auto d_rows = out_proj_.backward(cache.merged, dy);  // d merged: [B, T, H·d_k]
  auto d_attention = Tensor<Scalar, 4>::uninitialized(cache.q.shape());
  detail::split_heads<Scalar>(d_rows, 0, d_attention);
  const auto grads =
      cross_attention_backward(cache.q, cache.k, cache.v, cache.attention, d_attention);
  Gradients result;
  result.dx = q_proj_.backward(x, merged(grads.q));
  result.dmemory = k_proj_.backward(memory, merged(grads.k));
  const auto dmemory_v = v_proj_.backward(memory, merged(grads.v));
  for (index_t i = 0; i < result.dmemory.size(); ++i) {
    result.dmemory.data()[i] += dmemory_v.data()[i];
  }
  return result;
}

// ---- printing -----------------------------------------------------------------------------------

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const CrossAttention<Scalar>& b) {
  return detail::print_block(out, "CrossAttention",
                             {{"d_model", b.d_model()},
                              {"d_memory", b.d_memory()},
                              {"n_heads", b.n_heads()},
                              {"n_kv_heads", b.n_kv_heads()}},
                             b.q_proj().has_bias());
}

}  // namespace dissect
