// dissect/accounting/forward_chain.hpp — a transformer's forward pass as a ShapeChain.
//
// forward_shape_chain(config, B, T) records the shapes of one forward pass stage by stage (token
// ids, embedding, the layer's attention and FFN, logits, sampling) with each step's FLOPs. The
// matrices and their FLOPs come from model_shape.hpp, so the chain's total is forward_flops() by
// construction — the same prefill FLOPs the budget reports.
#pragma once

#include <initializer_list>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/model_shape.hpp"
#include "dissect/accounting/shape_chain.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/forward_stages.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

/// The forward pass of `config` on `batch` sequences of `tokens` tokens: token ids, embedding,
/// QKV projection, head split, scores, softmax, weighted sum, head merge + W_O, FFN (steps 3–9
/// per layer, "×L"), logits, sampling.
///
/// FLOPs count only matrix products, as forward_flops() defines them: the linear steps (QKV, W_O,
/// FFN, logits) are product_flops of the matrices of weight_matrices(config) and sum to
/// 2 · W · B·T (W from forward_shape: the tied head included, embeddings, biases and norms not);
/// the two attention steps are attention_product_flops each, per layer (full T×T). So
/// total_flops() == forward_flops(config, batch, tokens).total.
/// @throws ConfigError if the config is invalid, batch or tokens is <= 0, tokens exceeds the
///         context of a learned position table; OverflowError if a FLOP count overflows int64.
ShapeChain forward_shape_chain(const TransformerConfig& config, index_t batch, index_t tokens);

// ---- implementation -----------------------------------------------------------------------------

inline ShapeChain forward_shape_chain(const TransformerConfig& config, index_t batch,
                                      index_t tokens) {
  constexpr std::string_view op = "forward_shape_chain";
  config.validate();
  if (batch <= 0) throw ConfigError(detail::concat(op, ": batch B must be > 0 (got ", batch, ")"));
  if (tokens <= 0) {
    throw ConfigError(detail::concat(op, ": tokens T must be > 0 (got ", tokens, ")"));
  }
  if (config.positions == Positions::learned && tokens > config.context) {
    throw ConfigError(detail::concat(op, ": tokens T = ", tokens, " exceed the context ",
                                     config.context, " of the learned position table"));
  }
  const TransformerConfig& c = config;
  const index_t d_k = c.head_size();
  const bool grouped_query = c.kv_heads() != c.n_heads;

  DimensionTable dims{{"B", batch}, {"T", tokens}, {"D", c.d_model}, {"H", c.n_heads}};
  if (grouped_query) dims.add("H_kv", c.kv_heads());
  dims.add("d_k", d_k).add("F", c.d_ff);
  if (c.is_moe()) dims.add("E", c.n_experts).add("k", c.experts_per_token);
  dims.add("L", c.n_layers).add("V", c.vocab);

  // Every count of the chain is a part of this one, so once it fits, none of the chain's own
  // sums can overflow.
  const ForwardShape shape = forward_shape(c);
  forward_flops(shape, batch, tokens);
  const index_t rows = checked_mul(batch, tokens, op);
  const std::vector<WeightMatrix> matrices = weight_matrices(c);
  const auto linear = [&](std::initializer_list<ModelTensor> tensors) {
    StepCost cost{0, false, StepKind::linear};
    for (ModelTensor tensor : tensors) {
      const WeightMatrix& matrix = find_matrix(matrices, matrix_name(tensor));
      // An expert's matrix multiplies each token k times (its k experts), not E times.
      cost.flops =
          checked_add(cost.flops, checked_mul(product_flops(matrix, rows), matrix.active, op), op);
      cost.per_layer = matrix.per_layer;
    }
    return cost;
  };
  const StepCost attention{attention_product_flops(batch, c.n_heads, tokens, d_k), true,
                           StepKind::attention};
  const StepCost in_layer{0, true, StepKind::other};
  const bool gated = c.ffn == Ffn::gated;

  ShapeChain chain(std::move(dims));
  chain.record(stage::token_ids, "B T", "tokenizer output");
  chain.record(stage::embedding, "B T D",
               c.positions == Positions::learned ? "E[ids] + P[0:T]" : "E[ids]");
  // With an explicit head_dim (Gemma), H·d_k need not be D.
  const bool q_is_d = checked_mul(c.n_heads, d_k, op) == c.d_model;
  chain.record(stage::qkv_projection, q_is_d ? "B T D" : "B T H*d_k",
               grouped_query ? "X·W_Q, X·W_K, X·W_V (K, V: H_kv*d_k wide)" : "X·W_Q, X·W_K, X·W_V",
               linear({ModelTensor::qkv}));
  chain.record(stage::head_split, "B H T d_k", "reshape + transpose", in_layer);
  chain.record(stage::scores, "B H T T", "Q·Kᵀ / √d_k", attention);
  chain.record(stage::softmax, "B H T T", "over the last axis", in_layer);
  chain.record(stage::weighted_sum, "B H T d_k", "P·V", attention);
  chain.record(stage::head_merge, "B T D", "transpose + reshape, ·W_O",
               linear({ModelTensor::attention_output}));
  const StepCost ffn =
      gated ? linear({ModelTensor::ffn_gate, ModelTensor::ffn_up, ModelTensor::ffn_down})
            : linear({ModelTensor::ffn_up, ModelTensor::ffn_down});
  if (c.is_moe()) {
    chain.record(stage::routing, "B T E", "X·W_routerᵀ, each token's top-k of E experts",
                 linear({ModelTensor::router}));
    chain.record(stage::ffn, "B T D",
                 gated ? "k SwiGLU experts D → F → D, gate-weighted sum"
                       : "k experts D → F → D, gate-weighted sum",
                 ffn);
  } else {
    chain.record(stage::ffn, "B T D", gated ? "SwiGLU D → F → D" : "D → F → D", ffn);
  }
  chain.record(stage::logits, "B T V", c.tied_embeddings ? "X·Eᵀ (tied head)" : "X·W_vocab",
               linear({ModelTensor::head}));
  chain.record(stage::sampling, "B T", "softmax + sample");

  chain.add_note(detail::concat("linear steps = 2 · ", format_count(shape.linear_weights),
                                " weights · ", format_count(rows),
                                " tokens, the weights being W_Q, W_K, W_V, W_O and"));
  chain.add_note(
      c.is_moe() ? "  the router and k of the E experts' FFN matrices × L, plus the V·D head (no "
                   "biases, norms or embeddings)"
                 : "  the FFN matrices × L, plus the V·D head (no biases, norms or embeddings)");
  chain.add_note(
      "attention products = 2 · 2·B·H·T²·d_k per layer (full T×T: the causal mask is not used)");
  return chain;
}

}  // namespace dissect
