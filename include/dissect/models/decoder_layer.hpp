// dissect/models/decoder_layer.hpp — one pre-norm decoder layer, GPT-2's, LLaMA's or Mixtral's:
//
//   x₂ = x + W_O · attention(rope(q), rope(k), v),   q, k, v = QKV(norm₁(x))
//   y  = x₂ + FFN(norm₂(x₂))
//
// built from the library's blocks (QKVProjection, causal attention, AttentionOutput, FeedForward
// or GatedFeedForward, or a MixtureOfExperts of them, LayerNorm or RMSNorm). Style
// (models/styles.hpp) picks the parts and the names; the config gives the sizes and the attention
// scores' scale, which can depend on the layer's index in its model
// (TransformerConfig::score_scale). Three forwards: training (keeps what backward needs), inference
// (online-softmax attention, nothing kept) and decoding with a KV cache; all three scale the scores
// alike, and backward by the scale its forward used. Inference and decoding are one function over
// any InferenceCache (attention/kv_cache_concept.hpp): row b of x continues the cache's row b at
// its own position, and the cache keeps k and v and attends (inference: a cache that keeps none). A
// config's sliding_window W (Mistral's) limits every query to its last W positions in all of them:
// over a full KVCache by the band mask, or with a RollingKVCache that holds only those W. A
// PagedKVCache serves a batch of sequences of different lengths, each at its own position.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/attention/attention.hpp"
#include "dissect/attention/flash_attention.hpp"
#include "dissect/attention/kv_cache.hpp"
#include "dissect/attention/kv_cache_concept.hpp"
#include "dissect/attention/paged_kv_cache.hpp"
#include "dissect/attention/rolling_kv_cache.hpp"
#include "dissect/blocks/attention_output.hpp"
#include "dissect/blocks/feed_forward.hpp"
#include "dissect/blocks/gated_feed_forward.hpp"
#include "dissect/blocks/mixture_of_experts.hpp"
#include "dissect/blocks/qkv_projection.hpp"
#include "dissect/core/forward_stages.hpp"
#include "dissect/layers/norm.hpp"
#include "dissect/layers/rope.hpp"
#include "dissect/models/styles.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

/// One stage of a forward pass as it ran: its name (as forward_shape_chain names it) and the
/// shape of what it produced.
struct StageShape {
  std::string stage;
  std::vector<index_t> shape;
};
/// The stages a forward pass recorded, in order (a layer's stages once, for layer 0).
using ShapeTrace = std::vector<StageShape>;

/// How a model builds its layers' Linear weights: N(0, init_std²), GPT-2's initialisation, with
/// the projections into the residual stream (W_O, the FFN's down) scaled by 1/√(2L); biases 0,
/// norms 1. Seeded: the same seed builds the same model.
struct ModelOptions {
  double init_std = 0.02;
  std::optional<std::uint64_t> seed = std::nullopt;
};

template <class Scalar, const DecoderStyle& Style>
class DecoderLayer : public ComposedModule<DecoderLayer<Scalar, Style>> {
 public:
  using scalar_type = Scalar;
  using NormType = Normalization<Scalar, Style.norm>;
  /// One FFN of the style's kind; a mixture-of-experts style has E of them behind a router.
  using DenseFfnType =
      std::conditional_t<Style.ffn == Ffn::mlp, FeedForward<Scalar>, GatedFeedForward<Scalar>>;
  using FfnType =
      std::conditional_t<Style.moe, MixtureOfExperts<Scalar, DenseFfnType>, DenseFfnType>;

  /// What backward needs from the training forward; reusable across steps.
  struct Cache {
    typename NormType::Cache norm1, norm2;
    Tensor<Scalar, 3> normed1;  ///< norm₁(x): [B, T, D]
    QKV<Scalar> qkv;            ///< q, k after RoPE (if any), v
    /// Attention's state for backward: P (attention) below flash_attention_pays' T, else the
    /// per-row log-sum-exp (flash); the forward's T picks one, and backward's T the same.
    AttentionCache<Scalar> attention;
    FlashAttentionCache<Scalar> flash;
    Tensor<Scalar, 4> attended;  ///< attention output per head: [B, H, T, d_k]
    Tensor<Scalar, 3> residual;  ///< x₂: [B, T, D]
    Tensor<Scalar, 3> normed2;   ///< norm₂(x₂)
    typename FfnType::Cache ffn;
  };

  /// Layer `index` (from 0) of a model of `config` (checked with check_style); its Linear layers
  /// are drawn from `seed`. The index matters only to a config whose score scaling depends on
  /// the layer (score_scaling.inverse_layer_index).
  /// @throws ConfigError as check_style, or if index is outside [0, n_layers).
  DecoderLayer(const TransformerConfig& config, std::uint64_t seed, index_t index = 0);

  /// The layer's index in its model, and the factor of its attention scores q·kᵀ
  /// (config.score_scale(index)).
  index_t index() const { return index_; }
  double score_scale() const { return score_scale_; }
  /// The sliding window W of its attention (config.sliding_window; unset: full causal).
  std::optional<index_t> sliding_window() const { return window_; }

  NormType& attention_norm() { return norm1_; }
  const NormType& attention_norm() const { return norm1_; }
  QKVProjection<Scalar>& qkv() { return qkv_; }
  const QKVProjection<Scalar>& qkv() const { return qkv_; }
  AttentionOutput<Scalar>& attention_output() { return proj_; }
  const AttentionOutput<Scalar>& attention_output() const { return proj_; }
  NormType& ffn_norm() { return norm2_; }
  const NormType& ffn_norm() const { return norm2_; }
  FfnType& ffn() { return ffn_; }
  const FfnType& ffn() const { return ffn_; }
  // for_each_parameter ("ln_1.weight", "attn.qkv.weight", …), zero_grad, parameter_count: from
  // ComposedModule.

  /// Training: x [B, T, D] at positions 0 … T − 1 → y [B, T, D], keeping what backward needs.
  /// `rope` is the model's table (rotary styles; null otherwise). Records its stages in `trace`.
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache,
                            const RotaryTable<Scalar>* rope, ShapeTrace* trace = nullptr) const;

  /// x, cache from forward(x, cache, …), dy [B, T, D] → dx [B, T, D]; adds into every gradient.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, Cache& cache,
                             ConstTensorView<Scalar, 3> dy, const RotaryTable<Scalar>* rope);

  /// Packs the layer's four projections for inference (freezing them): infer then runs the
  /// packed GEMM with bias, activation, SwiGLU and the residual adds fused (blocks.hpp).
  /// A mixture of experts packs each expert (the router stays a plain Linear: E rows).
  void pack() requires std::is_same_v<Scalar, float> {
    qkv_.pack();
    proj_.pack();
    for_each_dense_ffn([](DenseFfnType& ffn) { ffn.pack(); });
  }
  void unpack() {
    qkv_.unpack();
    proj_.unpack();
    for_each_dense_ffn([](DenseFfnType& ffn) { ffn.unpack(); });
  }

  /// Inference over a cache (the one inference forward): row b of x [B, T, D] holds the T
  /// positions after kv.position(b) (q and k rotated to them); layer `layer` of the cache keeps
  /// their k and v and q attends to what the row may read (InferenceCache::attend, with this
  /// layer's score scale and window). The cache's lengths move when the model advances it, after
  /// every layer. The projections see all B·T rows at once: one read of the weights for the batch.
  /// Records the attention stages in `trace` with row 0's keys.
  /// @throws ShapeError if x's B is not kv.batch(); as the cache's attend.
  template <InferenceCache Kv>
  Tensor<Scalar, 3> infer(ConstTensorView<Scalar, 3> x, const RotaryTable<Scalar>* rope, Kv& kv,
                          index_t layer, ShapeTrace* trace = nullptr) const;

  /// Inference: as the training forward, keeping nothing (attention by online softmax; the one
  /// infer over a cache that keeps nothing). With a KV cache, x holds the T positions after
  /// kv->length(): infer(x, rope, *kv, layer, trace) (with a sliding window, q reads its last W:
  /// the band mask over the full cache).
  Tensor<Scalar, 3> infer(ConstTensorView<Scalar, 3> x, const RotaryTable<Scalar>* rope,
                          KVCache<Scalar>* kv, index_t layer, ShapeTrace* trace = nullptr) const;

  /// Inference with a rolling cache (a windowed config): infer(x, rope, kv, layer); q attends to
  /// the window's keys, from the ring and this step, and the step's k and v replace the ring's
  /// oldest (RollingKVCache::attend). @throws ShapeError if the ring's W is not this layer's.
  Tensor<Scalar, 3> infer(ConstTensorView<Scalar, 3> x, const RotaryTable<Scalar>* rope,
                          RollingKVCache<Scalar>& kv, index_t layer) const;

  /// Inference over a paged cache: infer(x, rope, kv.select(sequences), layer), row b of x
  /// continuing sequence sequences[b] at its own length (PagedKVCache::attend).
  /// @throws ShapeError if sequences does not hold x's B ids.
  Tensor<Scalar, 3> infer(ConstTensorView<Scalar, 3> x, const RotaryTable<Scalar>* rope,
                          PagedKVCache<Scalar>& kv, std::span<const index_t> sequences,
                          index_t layer) const;

 private:
  friend class ComposedModule<DecoderLayer>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child(Style.attention_norm, self.norm1_, visit);
    visit_child(Style.attention, self.qkv_, visit);
    visit_child(Style.attention, self.proj_, visit);
    visit_child(Style.ffn_norm, self.norm2_, visit);
    visit_child(Style.mlp, self.ffn_, visit);
  }

  static FfnType make_ffn(const TransformerConfig& config, std::uint64_t seed);
  /// f(ffn) for the FFN, or for each expert of a mixture.
  template <class F>
  void for_each_dense_ffn(F&& f) {
    if constexpr (Style.moe) {
      for (index_t e = 0; e < ffn_.n_experts(); ++e) f(ffn_.expert(e));
    } else {
      f(ffn_);
    }
  }
  /// q and k rotated in place to positions offset … offset + T − 1 (rotary styles only).
  static void rotate(QKV<Scalar>& qkv, index_t offset, const RotaryTable<Scalar>* rope);
  /// q and k rotated in place, row b to positions kv.position(b) … (rotary styles only): one
  /// rotate when every row is at the same position, else one per row.
  template <class Kv>
  static void rotate_rows(QKV<Scalar>& qkv, const Kv& kv, const RotaryTable<Scalar>* rope);
  /// A mixture of experts records its router's logits [B, T, E] as the routing stage.
  void trace_routing(ShapeTrace* trace, const Shape<3>& shape) const;
  /// x₂ + FFN(norm₂(x₂)) without a cache, x₂ = x + W_O(attended): the inference tail.
  Tensor<Scalar, 3> finish(ConstTensorView<Scalar, 3> x, ConstTensorView<Scalar, 4> attended,
                           ShapeTrace* trace) const;

  index_t index_;
  double score_scale_;
  std::optional<index_t> window_;
  NormType norm1_;
  QKVProjection<Scalar> qkv_;
  AttentionOutput<Scalar> proj_;
  NormType norm2_;
  FfnType ffn_;
};

/// GPT-2's block, LLaMA's and Mixtral's decoder layers.
template <class Scalar>
using GPT2Block = DecoderLayer<Scalar, gpt2_style>;
template <class Scalar>
using LlamaDecoderLayer = DecoderLayer<Scalar, llama_style>;
template <class Scalar>
using MixtralDecoderLayer = DecoderLayer<Scalar, mixtral_style>;

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

template <std::size_t Rank>
void trace_stage(ShapeTrace* trace, std::string_view stage, const Shape<Rank>& shape) {
  if (trace)
    trace->push_back({std::string(stage), std::vector<index_t>(shape.begin(), shape.end())});
}

/// The attention stages of a trace: QKV projection (q's features before the split), head split,
/// scores and softmax ([B, H, T, S]), weighted sum.
template <class Scalar>
void trace_attention(ShapeTrace* trace, const QKV<Scalar>& qkv, index_t keys) {
  if (!trace) return;
  const auto& q = qkv.q.shape();
  trace_stage(trace, stage::qkv_projection, Shape<3>{q[0], q[2], q[1] * q[3]});
  trace_stage(trace, stage::head_split, q);
  trace_stage(trace, stage::scores, Shape<4>{q[0], q[1], q[2], keys});
  trace_stage(trace, stage::softmax, Shape<4>{q[0], q[1], q[2], keys});
  trace_stage(trace, stage::weighted_sum, q);
}

template <class Scalar>
void add_into(Tensor<Scalar, 3>& target, ConstTensorView<Scalar, 3> addend) {
  target.vector() += addend.vector();
}

/// The cache of an inference forward that keeps nothing (a whole sequence at once): B rows at
/// position 0, each layer's queries attending to the step's own keys (causal_attention_into), so
/// that it too is a call of the one cached forward.
template <class Scalar>
class NoCache {
 public:
  using scalar_type = Scalar;
  explicit NoCache(index_t batch) : batch_(batch) {}
  index_t batch() const { return batch_; }
  index_t position(index_t) const { return 0; }
  void check_step(std::string_view, const TransformerConfig&, index_t, index_t) const {}
  void reserve(index_t) const {}
  template <TensorLike Q, TensorLike K, TensorLike V, WritableTensor O>
  void attend(index_t, const Q& q, const K& k, const V& v, O&& o, std::optional<double> scale,
              std::optional<index_t> window) const {
    causal_attention_into(q, k, v, std::forward<O>(o), scale, window);
  }
  void advance(TokenBatch) const {}

 private:
  index_t batch_;
};
static_assert(InferenceCache<NoCache<float>> && InferenceCache<NoCache<double>>);

}  // namespace detail

template <class Scalar, const DecoderStyle& Style>
auto DecoderLayer<Scalar, Style>::make_ffn(const TransformerConfig& config, std::uint64_t seed)
    -> FfnType {
  if constexpr (Style.moe) {
    return FfnType(config.d_model, config.d_ff,
                   MixtureOfExpertsOptions{.n_experts = config.n_experts,
                                           .routing = {.top_k = config.experts_per_token},
                                           .bias = config.bias,
                                           .activation = Style.activation,
                                           .seed = seed});
  } else if constexpr (Style.ffn == Ffn::mlp) {
    return FfnType(config.d_model, config.d_ff, Style.activation,
                   BlockOptions{.bias = config.bias, .seed = seed});
  } else {
    return FfnType(config.d_model, config.d_ff,
                   GatedFeedForwardOptions{.bias = config.bias, .seed = seed});
  }
}

template <class Scalar, const DecoderStyle& Style>
DecoderLayer<Scalar, Style>::DecoderLayer(const TransformerConfig& config, std::uint64_t seed,
                                          index_t index)
    : index_(index),
      score_scale_((check_style(Style.layer_name, Style, config), config.score_scale(index))),
      window_(config.sliding_window),
      norm1_(config.d_model, config.norm_eps.value_or(NormType::default_eps)),
      qkv_(config.d_model, config.n_heads,
           QKVOptions{.n_kv_heads = config.kv_heads(), .bias = config.bias, .seed = seed}),
      proj_(config.d_model, config.n_heads, BlockOptions{.bias = config.bias, .seed = seed + 1}),
      norm2_(config.d_model, config.norm_eps.value_or(NormType::default_eps)),
      ffn_(make_ffn(config, seed + 2)) {}

template <class Scalar, const DecoderStyle& Style>
void DecoderLayer<Scalar, Style>::trace_routing(ShapeTrace* trace, const Shape<3>& shape) const {
  if constexpr (Style.moe) {
    detail::trace_stage(trace, stage::routing, Shape<3>{shape[0], shape[1], ffn_.n_experts()});
  }
}

template <class Scalar, const DecoderStyle& Style>
void DecoderLayer<Scalar, Style>::rotate(QKV<Scalar>& qkv, index_t offset,
                                         const RotaryTable<Scalar>* rope) {
  if constexpr (Style.positions == Positions::rotary) {
    if (!rope) throw Error(detail::concat(Style.layer_name, ": a rotary layer needs a RoPE table"));
    apply_rope_into(qkv.q, qkv.q, offset, *rope);
    apply_rope_into(qkv.k, qkv.k, offset, *rope);
  }
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderLayer<Scalar, Style>::forward(ConstTensorView<Scalar, 3> x, Cache& cache,
                                                       const RotaryTable<Scalar>* rope,
                                                       ShapeTrace* trace) const {
  cache.normed1 = norm1_.forward(x, cache.norm1);
  cache.qkv = qkv_.forward(cache.normed1);
  rotate(cache.qkv, 0, rope);
  // Flash attention where it pays and no window bands the keys (it has no band mask).
  if (!window_ && flash_attention_pays(cache.qkv.q.dim(2))) {
    cache.attended = flash_attention(cache.qkv.q, cache.qkv.k, cache.qkv.v, cache.flash,
                                     {.causal = true, .scale = score_scale_});
  } else {
    cache.attended = causal_attention(cache.qkv.q, cache.qkv.k, cache.qkv.v, cache.attention,
                                      score_scale_, window_);
  }
  detail::trace_attention(trace, cache.qkv, cache.qkv.k.dim(2));
  cache.residual = proj_.forward(cache.attended);
  detail::trace_stage(trace, stage::head_merge, cache.residual.shape());
  detail::add_into<Scalar>(cache.residual, x);
  cache.normed2 = norm2_.forward(cache.residual, cache.norm2);
  auto y = ffn_.forward(cache.normed2, cache.ffn);
  trace_routing(trace, y.shape());
  detail::trace_stage(trace, stage::ffn, y.shape());
  detail::add_into<Scalar>(y, cache.residual);
  return y;
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderLayer<Scalar, Style>::backward(ConstTensorView<Scalar, 3> x, Cache& cache,
                                                        ConstTensorView<Scalar, 3> dy,
                                                        const RotaryTable<Scalar>* rope) {
  // Through the FFN branch and its residual: d x₂ = dy + norm₂ᵀ(FFNᵀ(dy)).
  auto d_residual =
      norm2_.backward(cache.residual, cache.norm2, ffn_.backward(cache.normed2, cache.ffn, dy));
  detail::add_into<Scalar>(d_residual, dy);
  // Through attention and its residual: dx = d x₂ + norm₁ᵀ(QKVᵀ(attentionᵀ(W_Oᵀ d x₂))); the
  // attention cache holds the forward's score scale and window; the path is forward's choice.
  const auto d_attended = proj_.backward(cache.attended, d_residual);
  auto grads = !window_ && flash_attention_pays(cache.qkv.q.dim(2))
                   ? flash_attention_backward(cache.qkv.q, cache.qkv.k, cache.qkv.v, cache.attended,
                                              cache.flash, d_attended)
                   : causal_attention_backward(cache.qkv.q, cache.qkv.k, cache.qkv.v,
                                               cache.attention, d_attended);
  if constexpr (Style.positions == Positions::rotary) {
    rope_backward_into(grads.q, grads.q, 0, *rope);
    rope_backward_into(grads.k, grads.k, 0, *rope);
  }
  auto dx = norm1_.backward(x, cache.norm1, qkv_.backward(cache.normed1, grads));
  detail::add_into<Scalar>(dx, d_residual);
  return dx;
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderLayer<Scalar, Style>::finish(ConstTensorView<Scalar, 3> x,
                                                      ConstTensorView<Scalar, 4> attended,
                                                      ShapeTrace* trace) const {
  const auto attention_out = proj_.forward(attended, x);  // the residual add fused when packed
  detail::trace_stage(trace, stage::head_merge, attention_out.shape());
  if constexpr (Style.moe) {
    // The experts' outputs are summed by gate before the residual can be added.
    auto y = ffn_.forward(norm2_.forward(attention_out));
    trace_routing(trace, y.shape());
    detail::add_into<Scalar>(y, attention_out);
    detail::trace_stage(trace, stage::ffn, y.shape());
    return y;
  } else {
    auto y = ffn_.forward(norm2_.forward(attention_out), attention_out);
    detail::trace_stage(trace, stage::ffn, y.shape());
    return y;
  }
}

template <class Scalar, const DecoderStyle& Style>
template <class Kv>
void DecoderLayer<Scalar, Style>::rotate_rows(QKV<Scalar>& qkv, const Kv& kv,
                                              const RotaryTable<Scalar>* rope) {
  if constexpr (Style.positions == Positions::rotary) {
    const index_t rows = kv.batch(), first = rows > 0 ? kv.position(0) : 0;
    bool same = true;
    for (index_t b = 1; b < rows && same; ++b) same = kv.position(b) == first;
    if (same) return rotate(qkv, first, rope);
    if (!rope) throw Error(detail::concat(Style.layer_name, ": a rotary layer needs a RoPE table"));
    // Row b's q and k heads are one contiguous [1, H, T, d_k] slice.
    for (auto* part : {&qkv.q, &qkv.k}) {
      const Shape<4> one{1, part->dim(1), part->dim(2), part->dim(3)};
      const index_t stride = part->size() / part->dim(0);
      for (index_t b = 0; b < rows; ++b) {
        TensorView<Scalar, 4> row(part->data() + b * stride, one);
        apply_rope_into(row, row, kv.position(b), *rope);
      }
    }
  }
}

template <class Scalar, const DecoderStyle& Style>
template <InferenceCache Kv>
Tensor<Scalar, 3> DecoderLayer<Scalar, Style>::infer(ConstTensorView<Scalar, 3> x,
                                                     const RotaryTable<Scalar>* rope, Kv& kv,
                                                     index_t layer, ShapeTrace* trace) const {
  static_assert(std::is_same_v<typename Kv::scalar_type, Scalar>,
                "dissect: the KV cache's scalar type must match the model's");
  if (x.dim(0) != kv.batch()) {
    throw ShapeError(detail::concat(Style.layer_name, "::infer: x ", format_shape(x.shape()),
                                    " holds ", x.dim(0), " rows, the cache's step extends ",
                                    kv.batch()));
  }
  auto qkv = qkv_.forward(norm1_.forward(x));
  rotate_rows(qkv, kv, rope);
  auto attended = Tensor<Scalar, 4>::uninitialized(qkv.q.shape());
  if (trace) detail::trace_attention(trace, qkv, kv.position(0) + qkv.q.dim(2));
  kv.attend(layer, qkv.q, qkv.k, qkv.v, attended, score_scale_, window_);
  return finish(x, attended, trace);
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderLayer<Scalar, Style>::infer(ConstTensorView<Scalar, 3> x,
                                                     const RotaryTable<Scalar>* rope,
                                                     KVCache<Scalar>* kv, index_t layer,
                                                     ShapeTrace* trace) const {
  if (kv) return infer<KVCache<Scalar>>(x, rope, *kv, layer, trace);
  detail::NoCache<Scalar> none(x.dim(0));
  return infer<detail::NoCache<Scalar>>(x, rope, none, layer, trace);
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderLayer<Scalar, Style>::infer(ConstTensorView<Scalar, 3> x,
                                                     const RotaryTable<Scalar>* rope,
                                                     RollingKVCache<Scalar>& kv,
                                                     index_t layer) const {
  if (kv.window() != window_.value_or(0)) {
    throw ShapeError(
        detail::concat(Style.layer_name, "::infer: the rolling KV cache holds W = ", kv.window(),
                       " positions, this layer's window is ", window_.value_or(0), " (0: none)"));
  }
  return infer<RollingKVCache<Scalar>>(x, rope, kv, layer);
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderLayer<Scalar, Style>::infer(ConstTensorView<Scalar, 3> x,
                                                     const RotaryTable<Scalar>* rope,
                                                     PagedKVCache<Scalar>& kv,
                                                     std::span<const index_t> sequences,
                                                     index_t layer) const {
  if (static_cast<index_t>(sequences.size()) != x.dim(0)) {
    throw ShapeError(detail::concat(Style.layer_name, "::infer: ", sequences.size(),
                                    " sequences for x ", format_shape(x.shape()),
                                    " (one per row of B)"));
  }
  auto rows = kv.select(sequences);
  return infer<typename PagedKVCache<Scalar>::Batch>(x, rope, rows, layer);
}

}  // namespace dissect
