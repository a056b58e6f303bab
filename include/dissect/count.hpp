// dissect/count.hpp — parameter counts read off the shapes of a TransformerConfig.
//
// Two answers: the lesson's estimate 12·D²·L (attention 4D², FFN 8D² per layer; no biases,
// norms or embeddings) and the exact count, component by component, which reproduces the
// published totals (GPT-2 small 124,439,808; LLaMA-7B 6,738,415,616). Everything is int64
// with checked arithmetic: a count that overflows is a ConfigError, never a wrapped number.
#pragma once

#include "dissect/config.hpp"
#include "dissect/error.hpp"
#include "dissect/shape.hpp"

namespace dissect {

/// Parameters of one transformer block.
struct LayerParameters {
  index_t attention = 0;  ///< W_Q, W_K, W_V, W_O (+ biases)
  index_t ffn = 0;        ///< the two (mlp) or three (gated) FFN matrices (+ biases)
  index_t norms = 0;      ///< the two norms before attention and FFN
  index_t total = 0;
};

/// The exact parameter count of a model, by component.
struct ParameterCount {
  index_t token_embedding = 0;     ///< V · D
  index_t position_embedding = 0;  ///< context · D when learned, 0 for rotary
  LayerParameters per_layer;       ///< one block
  index_t layers = 0;              ///< per_layer.total · L
  index_t final_norm = 0;
  index_t output_head = 0;  ///< V · D, or 0 when tied to the token embedding
  index_t total = 0;
  index_t approx_12d2l = 0;  ///< the estimate 12·D²·L, for comparison
  double coverage = 0.0;     ///< approx_12d2l / total: how much of the model the estimate sees
};

/// The lesson's estimate 12·D²·L: W_Q, W_K, W_V, W_O are D×D (4D²), the FFN D → 4D → D (8D²).
/// @throws ConfigError if D or L is <= 0 or the product overflows int64.
index_t approx_parameters(index_t d_model, index_t n_layers);

/// 12·D²·L for `config`'s D and L (the rest of the config does not enter the estimate).
/// @throws ConfigError if the config is invalid or the product overflows int64.
index_t approx_parameters(const TransformerConfig& config);

/// The exact count of every parameter tensor `config` implies. The output head has no bias
/// (neither GPT-2's nor LLaMA's has one).
/// @throws ConfigError if the config is invalid or any count overflows int64.
ParameterCount count_parameters(const TransformerConfig& config);

// ---- implementation -----------------------------------------------------------------------------

inline index_t approx_parameters(index_t d_model, index_t n_layers) {
  require_positive("approx_parameters", "d_model", d_model);
  require_positive("approx_parameters", "n_layers", n_layers);
  return checked_product({12, d_model, d_model, n_layers}, "approx_parameters 12*D^2*L");
}

inline index_t approx_parameters(const TransformerConfig& config) {
  config.validate();
  return approx_parameters(config.d_model, config.n_layers);
}

namespace detail {

// A linear layer in → out: weight [out, in] and optionally bias [out].
inline index_t linear_parameters(index_t in, index_t out, bool bias, std::string_view what) {
  return checked_add(checked_mul(in, out, what), bias ? out : 0, what);
}

inline index_t norm_parameters(index_t width, Norm norm, std::string_view what) {
  return checked_mul(width, norm == Norm::layer_norm ? 2 : 1, what);
}

inline index_t attention_parameters(const TransformerConfig& c) {
  constexpr std::string_view what = "count_parameters attention";
  const index_t q_width = checked_mul(c.n_heads, c.head_size(), what);
  const index_t kv_width = checked_mul(c.kv_heads(), c.head_size(), what);
  const index_t q = linear_parameters(c.d_model, q_width, c.bias, what);
  const index_t kv = linear_parameters(c.d_model, kv_width, c.bias, what);  // K and V each
  const index_t o = linear_parameters(q_width, c.d_model, c.bias, what);
  return checked_sum({q, kv, kv, o}, what);
}

inline index_t ffn_parameters(const TransformerConfig& c) {
  constexpr std::string_view what = "count_parameters ffn";
  const index_t up = linear_parameters(c.d_model, c.d_ff, c.bias, what);
  const index_t down = linear_parameters(c.d_ff, c.d_model, c.bias, what);
  // SwiGLU's gate has the shape of the up projection.
  return checked_sum({up, c.ffn == Ffn::gated ? up : 0, down}, what);
}

}  // namespace detail

inline ParameterCount count_parameters(const TransformerConfig& config) {
  config.validate();
  constexpr std::string_view what = "count_parameters";
  const TransformerConfig& c = config;
  ParameterCount count;
  count.token_embedding = checked_mul(c.vocab, c.d_model, "count_parameters embedding");
  if (c.positions == Positions::learned) {
    count.position_embedding =
        checked_mul(c.context, c.d_model, "count_parameters position embedding");
  }
  count.per_layer.attention = detail::attention_parameters(c);
  count.per_layer.ffn = detail::ffn_parameters(c);
  count.per_layer.norms =
      checked_mul(2, detail::norm_parameters(c.d_model, c.norm, "count_parameters norms"), what);
  count.per_layer.total =
      checked_sum({count.per_layer.attention, count.per_layer.ffn, count.per_layer.norms}, what);
  count.layers = checked_mul(count.per_layer.total, c.n_layers, "count_parameters layers");
  count.final_norm = detail::norm_parameters(c.d_model, c.norm, "count_parameters final norm");
  if (!c.tied_embeddings) count.output_head = count.token_embedding;
  count.total = checked_sum({count.token_embedding, count.position_embedding, count.layers,
                             count.final_norm, count.output_head},
                            "count_parameters total");
  count.approx_12d2l = approx_parameters(c.d_model, c.n_layers);
  count.coverage = static_cast<double>(count.approx_12d2l) / static_cast<double>(count.total);
  return count;
}

}  // namespace dissect
