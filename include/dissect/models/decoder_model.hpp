// dissect/models/decoder_model.hpp — a whole decoder-only language model: token ids → logits.
//
//   x = E[ids] (+ P[positions] for learned positions)
//   x = layer_{L−1}(… layer_0(x))       (layer i scales its scores by config.score_scale(i))
//   logits = norm_f(x) · W_headᵀ,   W_head = E when the head is tied (GPT-2), else its own [V, D]
//
// GPT2Model and LlamaModel are this template with a style (models/styles.hpp); the config gives
// every size, so parameter_count() is count_parameters(config) exactly. Forward comes in three
// kinds: inference over a whole sequence, decoding with a KV cache (contiguous, rolling, or paged:
// B sequences each at its own position in one forward), and training, whose cache feeds backward;
// loss_and_backward is the training step's arithmetic (an optimizer from optim.hpp then updates
// parameters_of(model)). Inference is one function over any InferenceCache
// (attention/kv_cache_concept.hpp): each cache's forward is a call of it, and so is the
// whole-sequence forward, over a cache that keeps nothing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/attention/kv_cache.hpp"
#include "dissect/attention/kv_cache_concept.hpp"
#include "dissect/attention/paged_kv_cache.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/layers/embedding.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/layers/rope.hpp"
#include "dissect/models/decoder_layer.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/sequential.hpp"
#include "dissect/training/loss.hpp"

namespace dissect {

template <class Scalar, const DecoderStyle& Style>
class DecoderModel : public ComposedModule<DecoderModel<Scalar, Style>> {
 public:
  using scalar_type = Scalar;
  /// The family: its parts and names.
  static constexpr const DecoderStyle& style = Style;
  using Layer = DecoderLayer<Scalar, Style>;
  using NormType = typename Layer::NormType;

  /// What backward needs from the training forward; reusable across steps of one shape.
  struct Cache {
    Tensor<Scalar, 3> embedded;              ///< the first layer's input: [B, T, D]
    std::vector<Tensor<Scalar, 3>> outputs;  ///< each layer's output
    std::vector<typename Layer::Cache> layers;
    typename NormType::Cache final_norm;
    Tensor<Scalar, 3> normed;  ///< norm_f(x): [B, T, D]
  };

  /// A model of `config`'s sizes, initialised as ModelOptions says.
  /// @throws ConfigError as check_style (invalid config, or one of another family).
  explicit DecoderModel(const TransformerConfig& config, ModelOptions options = {});

  const TransformerConfig& config() const { return config_; }
  /// Packs every layer for inference (DecoderLayer::pack) and an untied head, freezing them;
  /// the tied head stays as it is (it is the embedding, which training still updates).
  void pack() requires std::is_same_v<Scalar, float> {
    for (std::size_t i = 0; i < layers_.size(); ++i) layers_.at(i).pack();
    if (head_) head_->pack();
  }
  void unpack() {
    for (std::size_t i = 0; i < layers_.size(); ++i) layers_.at(i).unpack();
    if (head_) head_->unpack();
  }
  bool tied() const { return !head_.has_value(); }

  Embedding<Scalar>& token_embedding() { return embedding_; }
  const Embedding<Scalar>& token_embedding() const { return embedding_; }
  /// The learned position table [context, D]. @throws Error for a rotary model.
  Embedding<Scalar>& position_embedding();
  const Embedding<Scalar>& position_embedding() const;
  Stack<Layer>& layers() { return layers_; }
  const Stack<Layer>& layers() const { return layers_; }
  /// Positions the RoPE table holds now (0 for learned positions): it grows with the longest
  /// forward so far, never past the context, so a context that is merely large costs nothing
  /// until a sequence reaches it (GrowingRotaryTable).
  index_t rope_positions() const { return rope_ ? rope_->positions() : 0; }
  NormType& final_norm() { return final_norm_; }
  const NormType& final_norm() const { return final_norm_; }
  /// The head's weight [V, D] and its gradient: the token embedding's own when tied.
  TensorView<Scalar, 2> head_weight();
  ConstTensorView<Scalar, 2> head_weight() const;
  TensorView<Scalar, 2> head_weight_grad();
  // for_each_parameter (state_dict names; a tied head is visited once, as wte), zero_grad,
  // parameter_count: from ComposedModule.

  /// Inference: B×T token ids at positions 0 … T − 1 → logits [B, T, V], keeping nothing.
  /// Records each stage's shape in `trace` (a layer's stages once). @throws as check_tokens.
  Tensor<Scalar, 3> forward(TokenBatch tokens, ShapeTrace* trace = nullptr) const;

  /// Decoding: T new tokens per sequence at positions kv.length() … → their logits [B, T, V];
  /// their keys and values are added to `kv`. Equal to the matching rows of a full forward.
  /// @throws ShapeError if kv was built for another config or batch or has no room for T more
  ///         positions; as check_tokens otherwise. Nothing (kv included) changes on a throw.
  Tensor<Scalar, 3> forward(TokenBatch tokens, KVCache<Scalar>& kv) const;
  /// Decoding as forward(tokens, kv), returning only the logits of each sequence's last new
  /// token, [B, 1, V]: what generation samples from. Prefill then runs the head (V·D per row) on
  /// one row, not T. Equal to the last row of forward(tokens, kv). @throws as that forward.
  Tensor<Scalar, 3> forward_last(TokenBatch tokens, KVCache<Scalar>& kv) const;

  /// A cache of another scalar type is refused at compile time (no silent conversion).
  template <class Other>
  requires(!std::is_same_v<Other, Scalar>) Tensor<Scalar, 3> forward(TokenBatch, KVCache<Other>&)
  const {
    static_assert(std::is_same_v<Other, Scalar>,
                  "dissect: the KV cache's scalar type must match the model's");
    return {};
  }

  /// Decoding with a rolling cache (a config with a sliding_window): as forward(tokens, KVCache&),
  /// but the cache holds only the last W positions, so its memory stays W's however long the
  /// sequence (up to the context, which RoPE's table and the positions still bound).
  /// @throws ShapeError if kv was built for another config or batch; as check_tokens otherwise.
  ///         Nothing (kv included) changes when these checks refuse the step; a step that throws
  ///         later (a MoE's non-finite router logit) may have overwritten ring slots a retry of a
  ///         prompt step would read: clear() the cache then.
  Tensor<Scalar, 3> forward(TokenBatch tokens, RollingKVCache<Scalar>& kv) const;

  /// Batched decoding over a paged cache: row b of `tokens` (B rows of T) continues sequence
  /// sequences[b] of `kv` at its own position kv.length(sequences[b]) → logits [B, T, V], each
  /// row equal (to rounding) to decoding that sequence alone; every linear layer runs once over
  /// the B·T rows. The step's k and v go to the sequences' blocks, taken from the pool as needed.
  /// @throws ShapeError if sequences does not hold B ids, kv was built for another config, or a
  ///         sequence's positions would pass the context; Error for an id that is not active or
  ///         repeats, or a pool without the blocks the step needs; as check_tokens otherwise.
  ///         Nothing (kv included) changes when these checks refuse the step.
  Tensor<Scalar, 3> forward(TokenBatch tokens, PagedKVCache<Scalar>& kv,
                            std::span<const index_t> sequences) const;

  /// A paged cache for this model: `blocks` blocks of `block_size` positions.
  PagedKVCache<Scalar> make_paged_kv_cache(
      index_t blocks, index_t block_size = PagedKVCache<Scalar>::default_block_size) const {
    return PagedKVCache<Scalar>(config_, blocks, block_size);
  }

  /// A rolling cache of the config's sliding_window positions for `batch` sequences.
  /// @throws ConfigError if the config has no sliding_window.
  RollingKVCache<Scalar> make_rolling_kv_cache(index_t batch) const {
    return RollingKVCache<Scalar>(config_, batch);
  }

  /// A KV cache for this model and `batch` sequences of up to `capacity` positions (default:
  /// the config's context).
  KVCache<Scalar> make_kv_cache(index_t batch,
                                std::optional<index_t> capacity = std::nullopt) const {
    return KVCache<Scalar>(config_, batch, capacity);
  }

  /// Training: as forward, keeping in `cache` what backward needs.
  Tensor<Scalar, 3> forward(TokenBatch tokens, Cache& cache, ShapeTrace* trace = nullptr) const;

  /// tokens and cache from forward(tokens, cache), dlogits [B, T, V] → adds into the gradient of
  /// every parameter (the tied embedding receives the head's and the lookup's).
  /// @throws ShapeError (no gradient touched) if dlogits or the cache does not fit the tokens.
  void backward(TokenBatch tokens, Cache& cache, ConstTensorView<Scalar, 3> dlogits);

  /// The training step's arithmetic: logits of `inputs`, the mean cross-entropy against
  /// `targets` (B·T ids, row-major; the next tokens for language modelling), and backward from
  /// it into every gradient. Returns the loss. @throws as forward; ShapeError or Error for
  /// targets that do not fit (no gradient touched).
  Scalar loss_and_backward(TokenBatch inputs, std::span<const index_t> targets, Cache& cache);

  /// The checks of every forward before any work: B, T > 0 and positions offset … offset + T − 1
  /// inside the context. (The embedding, which runs first, then checks ids.size() = B·T and
  /// each id against V, naming [b, t].)
  /// @throws ShapeError naming `op`, T, the offset and the context.
  void check_tokens(std::string_view op, const TokenBatch& tokens, index_t offset) const;

 private:
  friend class ComposedModule<DecoderModel>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child(Style.token_embedding, self.embedding_, visit);
    if (self.positions_) visit_child(Style.position_embedding, *self.positions_, visit);
    visit_child(Style.layers, self.layers_, visit);
    visit_child(Style.final_norm, self.final_norm_, visit);
    if (self.head_) visit_child(Style.head, *self.head_, visit);
  }

  /// Which logits a cached forward returns: every position's, or each row's last (forward_last).
  enum class LogitRows { all, last };
  /// The one inference forward: T new tokens per row, row b at positions kv.position(b) … (their
  /// keys and values go to kv, whose lengths then move on by T) → logits [B, T, V], or [B, 1, V]
  /// for LogitRows::last. Checks (naming `op`) before any work: kv.check_step, then check_tokens
  /// for every row's positions, then (the embedding) every id; nothing changes when one refuses.
  /// Records the stages in `trace` (layer 0's once). Inference without a cache runs it over
  /// detail::NoCache.
  template <InferenceCache Kv>
  Tensor<Scalar, 3> forward_cached(std::string_view op, TokenBatch tokens, Kv& kv, LogitRows rows,
                                   ShapeTrace* trace = nullptr) const;
  /// E[ids] + P[offset …]: [B, T, D].
  Tensor<Scalar, 3> embed(const TokenBatch& tokens, index_t offset) const {
    return embed_rows(tokens, [offset](index_t) { return offset; });
  }
  /// E[ids] + P[offset_of(b) …] for each row b: [B, T, D].
  template <class Offset>
  Tensor<Scalar, 3> embed_rows(const TokenBatch& tokens, Offset offset_of) const;
  /// norm_f(x)·W_headᵀ: [B, T, V].
  Tensor<Scalar, 3> logits_of(ConstTensorView<Scalar, 3> normed, ShapeTrace* trace) const;
  /// The RoPE table for positions [0, end) (null for learned positions); `end` is within the
  /// context, which check_tokens has checked.
  std::shared_ptr<const RotaryTable<Scalar>> rope_for(index_t end) const {
    return rope_ ? rope_->covering(end) : nullptr;
  }
  void initialise(const ModelOptions& options, std::uint64_t seed);

  TransformerConfig config_;
  Embedding<Scalar> embedding_;
  std::optional<Embedding<Scalar>> positions_;
  Stack<Layer> layers_;
  NormType final_norm_;
  std::optional<Linear<Scalar>> head_;
  std::optional<GrowingRotaryTable<Scalar>> rope_;
};

/// GPT-2: wte, wpe, h.N, ln_f, head tied to wte (unless the config unties it).
template <class Scalar>
using GPT2Model = DecoderModel<Scalar, gpt2_style>;
/// LLaMA: embed_tokens, layers.N, norm, lm_head (untied unless the config ties it).
template <class Scalar>
using LlamaModel = DecoderModel<Scalar, llama_style>;
/// Mixtral (MixtralForCausalLM): LLaMA with a sparse mixture of SwiGLU experts in every layer.
template <class Scalar>
using MixtralModel = DecoderModel<Scalar, mixtral_style>;

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

template <class Layer>
Stack<Layer> build_layers(const TransformerConfig& config, std::uint64_t seed) {
  std::vector<Layer> layers;
  layers.reserve(static_cast<std::size_t>(config.n_layers));
  // Each layer's Linear members take consecutive seeds from its own: 3 or 4 per layer. Each
  // knows its index, on which its attention scores' scale may depend.
  for (index_t i = 0; i < config.n_layers; ++i) {
    layers.emplace_back(config, seed + 8 * static_cast<std::uint64_t>(i), i);
  }
  return Stack<Layer>(std::move(layers));
}

}  // namespace detail

template <class Scalar, const DecoderStyle& Style>
DecoderModel<Scalar, Style>::DecoderModel(const TransformerConfig& config, ModelOptions options)
    : config_((check_style(Style.model_name, Style, config), config)),
      embedding_(config.vocab, config.d_model, {.init_std = 0, .seed = 0}),
      layers_(detail::build_layers<Layer>(config, 0)),
      final_norm_(config.d_model, config.norm_eps.value_or(NormType::default_eps)) {
  if (config.positions == Positions::learned) {
    positions_.emplace(config.context, config.d_model, EmbeddingOptions{.init_std = 0, .seed = 0});
  } else {
    rope_.emplace(config.head_size(), config.context, config.rope_theta);
  }
  if (!config.tied_embeddings) {
    head_.emplace(config.d_model, config.vocab, LinearOptions{.bias = false, .seed = 0});
  }
  initialise(options, options.seed.value_or(next_default_seed()));
}

template <class Scalar, const DecoderStyle& Style>
void DecoderModel<Scalar, Style>::initialise(const ModelOptions& options, std::uint64_t seed) {
  require_positive_finite(Style.model_name, "init_std", options.init_std);
  if (!ConstructionScope::current().initialise) return;  // a loader writes every parameter
  // GPT-2's scheme (HF _init_weights): every matrix N(0, std²), the two projections that write
  // into the residual stream scaled by 1/√(2L) so its variance does not grow with depth; biases
  // 0; norm weights 1 (as built).
  const double residual_std =
      options.init_std / std::sqrt(2.0 * static_cast<double>(config_.n_layers));
  Generator generator(seed);
  this->for_each_parameter([&](const ParameterName& name, auto value, auto) {
    if constexpr (rank_of<decltype(value)> == 2) {
      const std::string text = name.str();
      const bool residual = text.ends_with(".proj.weight") || text.ends_with(".down.weight");
      fill_normal(value, 0.0, residual ? residual_std : options.init_std, generator);
    } else if (name.str().ends_with("bias")) {
      value.fill(0);
    }
  });
}

template <class Scalar, const DecoderStyle& Style>
Embedding<Scalar>& DecoderModel<Scalar, Style>::position_embedding() {
  if (!positions_) {
    throw Error(detail::concat(Style.model_name, ": rotary positions have no table"));
  }
  return *positions_;
}

template <class Scalar, const DecoderStyle& Style>
const Embedding<Scalar>& DecoderModel<Scalar, Style>::position_embedding() const {
  return const_cast<DecoderModel&>(*this).position_embedding();
}

template <class Scalar, const DecoderStyle& Style>
TensorView<Scalar, 2> DecoderModel<Scalar, Style>::head_weight() {
  return head_ ? head_->weight() : embedding_.weight();
}

template <class Scalar, const DecoderStyle& Style>
ConstTensorView<Scalar, 2> DecoderModel<Scalar, Style>::head_weight() const {
  return head_ ? head_->weight() : embedding_.weight();
}

template <class Scalar, const DecoderStyle& Style>
TensorView<Scalar, 2> DecoderModel<Scalar, Style>::head_weight_grad() {
  return head_ ? head_->weight_grad() : embedding_.weight_grad();
}

template <class Scalar, const DecoderStyle& Style>
void DecoderModel<Scalar, Style>::check_tokens(std::string_view op, const TokenBatch& tokens,
                                               index_t offset) const {
  if (tokens.batch <= 0 || tokens.seq <= 0) {
    throw ShapeError(detail::concat(op, ": need B > 0 and T > 0 tokens, got B = ", tokens.batch,
                                    ", T = ", tokens.seq));
  }
  if (tokens.seq > config_.context - offset) {
    throw ShapeError(detail::concat(
        op, ": positions ", offset, " … ", offset + tokens.seq - 1, " (T = ", tokens.seq, " after ",
        offset, ") exceed the model's context of ", config_.context, " positions"));
  }
}

template <class Scalar, const DecoderStyle& Style>
template <class Offset>
Tensor<Scalar, 3> DecoderModel<Scalar, Style>::embed_rows(const TokenBatch& tokens,
                                                          Offset offset_of) const {
  auto x = embedding_.forward(tokens);  // checks every id against V, naming [b, t]
  if (positions_) {
    // One table [T, D] per run of rows at the same position (one for the whole batch when every
    // row is at one position).
    Tensor<Scalar, 2> table;
    index_t table_offset = -1;
    for (index_t b = 0; b < tokens.batch; ++b) {
      const index_t offset = offset_of(b);
      if (offset != table_offset) {
        table = positions_->forward_positions(tokens.seq, offset);
        table_offset = offset;
      }
      Eigen::Map<RowMatrix<Scalar>>(x.data() + b * table.size(), tokens.seq, config_.d_model) +=
          table.cview().matrix();
    }
  }
  return x;
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderModel<Scalar, Style>::logits_of(ConstTensorView<Scalar, 3> normed,
                                                         ShapeTrace* trace) const {
  auto logits = Tensor<Scalar, 3>::uninitialized({normed.dim(0), normed.dim(1), config_.vocab});
  if (head_) {
    head_->forward_into(normed, logits);  // with its LoRA adapter, if it has one
  } else {
    linear_forward<Scalar>(normed.reshape(Shape<2>{-1, config_.d_model}).matrix(),
                           head_weight().matrix(), std::nullopt,
                           logits.view().reshape(Shape<2>{-1, config_.vocab}).matrix());
  }
  detail::trace_stage(trace, stage::logits, logits.shape());
  return logits;
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderModel<Scalar, Style>::forward(TokenBatch tokens, ShapeTrace* trace) const {
  detail::NoCache<Scalar> none(tokens.batch);  // every row from position 0, nothing kept
  return forward_cached(detail::concat(Style.model_name, "::forward"), tokens, none, LogitRows::all,
                        trace);
}

template <class Scalar, const DecoderStyle& Style>
template <InferenceCache Kv>
Tensor<Scalar, 3> DecoderModel<Scalar, Style>::forward_cached(std::string_view op,
                                                              TokenBatch tokens, Kv& kv,
                                                              LogitRows rows,
                                                              ShapeTrace* trace) const {
  static_assert(std::is_same_v<typename Kv::scalar_type, Scalar>,
                "dissect: the KV cache's scalar type must match the model's");
  kv.check_step(op, config_, tokens.batch, tokens.seq);  // now kv.batch() = B
  // B, T > 0 (with row 0's positions), then every row's positions inside the context.
  check_tokens(op, tokens, tokens.batch > 0 ? kv.position(0) : 0);
  index_t end = 0;  // the furthest position any row reaches
  for (index_t b = 0; b < tokens.batch; ++b) {
    const index_t offset = kv.position(b);
    if (b > 0) check_tokens(op, tokens, offset);
    end = std::max(end, offset + tokens.seq);
  }
  // The last check: every id in range.
  auto x = embed_rows(tokens, [&kv](index_t b) { return kv.position(b); });
  detail::trace_stage(trace, stage::token_ids, Shape<2>{tokens.batch, tokens.seq});
  detail::trace_stage(trace, stage::embedding, x.shape());
  const auto rope = rope_for(end);
  kv.reserve(tokens.seq);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    x = layers_.at(i).template infer<Kv>(x, rope.get(), kv, static_cast<index_t>(i),
                                         i == 0 ? trace : nullptr);
  }
  kv.advance(tokens);
  if (rows == LogitRows::all || tokens.seq == 1) return logits_of(final_norm_.forward(x), trace);
  // The norm is per row, so the last row's norm is the norm of the last row.
  auto last = Tensor<Scalar, 3>::uninitialized({tokens.batch, 1, config_.d_model});
  for (index_t b = 0; b < tokens.batch; ++b) {
    const Scalar* row = x.data() + ((b + 1) * tokens.seq - 1) * config_.d_model;
    std::copy_n(row, config_.d_model, last.data() + b * config_.d_model);
  }
  return logits_of(final_norm_.forward(last), trace);
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderModel<Scalar, Style>::forward(TokenBatch tokens,
                                                       KVCache<Scalar>& kv) const {
  return forward_cached(detail::concat(Style.model_name, "::forward (KV cache)"), tokens, kv,
                        LogitRows::all);
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderModel<Scalar, Style>::forward_last(TokenBatch tokens,
                                                            KVCache<Scalar>& kv) const {
  return forward_cached(detail::concat(Style.model_name, "::forward_last (KV cache)"), tokens, kv,
                        LogitRows::last);
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderModel<Scalar, Style>::forward(TokenBatch tokens,
                                                       RollingKVCache<Scalar>& kv) const {
  return forward_cached(detail::concat(Style.model_name, "::forward (rolling KV cache)"), tokens,
                        kv, LogitRows::all);
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderModel<Scalar, Style>::forward(TokenBatch tokens, PagedKVCache<Scalar>& kv,
                                                       std::span<const index_t> sequences) const {
  auto rows = kv.select(sequences);  // row b continues sequences[b]
  return forward_cached(detail::concat(Style.model_name, "::forward (paged KV cache)"), tokens,
                        rows, LogitRows::all);
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> DecoderModel<Scalar, Style>::forward(TokenBatch tokens, Cache& cache,
                                                       ShapeTrace* trace) const {
  check_tokens(detail::concat(Style.model_name, "::forward"), tokens, 0);
  cache.embedded = embed(tokens, 0);
  detail::trace_stage(trace, stage::token_ids, Shape<2>{tokens.batch, tokens.seq});
  detail::trace_stage(trace, stage::embedding, cache.embedded.shape());
  cache.outputs.resize(layers_.size());
  cache.layers.resize(layers_.size());
  ConstTensorView<Scalar, 3> x = cache.embedded;
  const auto rope = rope_for(tokens.seq);
  for (std::size_t i = 0; i < layers_.size(); ++i) {
    cache.outputs[i] =
        layers_.at(i).forward(x, cache.layers[i], rope.get(), i == 0 ? trace : nullptr);
    x = cache.outputs[i];
  }
  cache.normed = final_norm_.forward(x, cache.final_norm);
  return logits_of(cache.normed, trace);
}

template <class Scalar, const DecoderStyle& Style>
void DecoderModel<Scalar, Style>::backward(TokenBatch tokens, Cache& cache,
                                           ConstTensorView<Scalar, 3> dlogits) {
  const std::string op = detail::concat(Style.model_name, "::backward");
  check_tokens(op, tokens, 0);
  const Shape<3> hidden{tokens.batch, tokens.seq, config_.d_model};
  const Shape<3> logits{tokens.batch, tokens.seq, config_.vocab};
  if (dlogits.shape() != logits) {
    throw ShapeError(detail::concat(op, ": dlogits must be [B, T, V] = ", format_shape(logits),
                                    ", got ", format_shape(dlogits.shape())));
  }
  if (cache.embedded.shape() != hidden || cache.normed.shape() != hidden ||
      cache.outputs.size() != layers_.size()) {
    throw ShapeError(detail::concat(op, ": the cache does not hold a forward of ",
                                    format_shape(hidden),
                                    " (fill it with forward(tokens, cache))"));
  }
  // The head: d normed = dlogits·W, dW += dlogitsᵀ·normed (into wte's gradient when tied; none
  // when the head or the tied table is frozen).
  auto d_normed = Tensor<Scalar, 3>::uninitialized(hidden);
  const auto d_normed_rows = d_normed.view().reshape(Shape<2>{-1, config_.d_model}).matrix();
  const auto dlogits_rows = dlogits.reshape(Shape<2>{-1, config_.vocab}).matrix();
  if (head_) {
    head_->backward_into(cache.normed, dlogits, d_normed);
  } else if (embedding_.frozen()) {
    linear_backward_input<Scalar>(head_weight().matrix(), dlogits_rows, d_normed_rows);
  } else {
    linear_backward<Scalar>(cache.normed.cview().reshape(Shape<2>{-1, config_.d_model}).matrix(),
                            head_weight().matrix(), dlogits_rows, d_normed_rows,
                            head_weight_grad().matrix(), std::nullopt);
  }
  auto dx = final_norm_.backward(cache.outputs.back(), cache.final_norm, d_normed);
  const auto rope = rope_for(tokens.seq);
  for (std::size_t i = layers_.size(); i-- > 0;) {
    const ConstTensorView<Scalar, 3> input = i == 0 ? cache.embedded : cache.outputs[i - 1];
    dx = layers_.at(i).backward(input, cache.layers[i], dx, rope.get());
  }
  embedding_.backward(tokens, dx);
  if (positions_) positions_->backward_positions(dx, 0);
}

template <class Scalar, const DecoderStyle& Style>
Scalar DecoderModel<Scalar, Style>::loss_and_backward(TokenBatch inputs,
                                                      std::span<const index_t> targets,
                                                      Cache& cache) {
  auto logits = forward(inputs, cache);
  const auto rows = logits.view().reshape(Shape<2>{-1, config_.vocab});
  // The gradient overwrites the logits in place: they are not needed after the loss.
  const Scalar loss = cross_entropy_forward_backward(rows, targets, rows);
  backward(inputs, cache, logits.cview());
  return loss;
}

}  // namespace dissect
