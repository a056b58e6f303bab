// dissect/accounting/count.hpp — parameter counts read off the shapes of a TransformerConfig.
//
// Two answers: the classic estimate 12·D²·L (attention 4D², FFN 8D² per layer; no biases,
// norms or embeddings) and the exact count, component by component, summed over the matrices
// weight_matrices() lists plus the norms; it reproduces the published totals (GPT-2 small
// 124,439,808; LLaMA-7B 6,738,415,616). Everything is int64 with checked arithmetic: a count
// that overflows is an OverflowError, never a wrapped number.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/model_shape.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

/// Parameters of one transformer block.
struct LayerParameters {
  index_t attention = 0;  ///< W_Q, W_K, W_V, W_O (+ biases)
  index_t ffn = 0;        ///< the two (mlp) or three (gated) FFN matrices (+ biases); with
                          ///< experts, E copies of them and the router [E, D]
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
  /// The parameters one token is multiplied by or looks up: total with each layer's E experts
  /// counted as its k active ones (equal to total for a dense model). Mixtral-8x7B: 12.9 B of
  /// 46.7 B.
  index_t active = 0;
  /// All layers' experts (E copies of the FFN matrices, × L): the weights a mixture keeps in
  /// memory though a token reads only k/E of them; 0 for a dense model.
  index_t experts = 0;
  /// The estimate 12·D²·L, for comparison; unset when it overflows int64 (a model with a narrow
  /// FFN or few KV heads can have an exact count that fits while 12·D²·L does not).
  std::optional<index_t> approx_12d2l;
  std::optional<double> coverage;  ///< approx_12d2l / total: how much the estimate sees
};

/// The estimate 12·D²·L: W_Q, W_K, W_V, W_O are D×D (4D²), the FFN D → 4D → D (8D²).
/// @throws ConfigError if D or L is <= 0; OverflowError if the product overflows int64.
index_t approx_parameters(index_t d_model, index_t n_layers);

/// approx_parameters, or nullopt when 12·D²·L overflows int64: for reports that show the
/// estimate beside an exact count and must not lose the count to the estimate.
/// @throws ConfigError if D or L is <= 0.
std::optional<index_t> try_approx_parameters(index_t d_model, index_t n_layers);

/// 12·D²·L for `config`'s D and L (the rest of the config does not enter the estimate).
/// @throws ConfigError if the config is invalid or the product overflows int64.
index_t approx_parameters(const TransformerConfig& config);

/// The exact count of every parameter tensor `config` implies: the matrices of
/// weight_matrices(config) (a tied head adds nothing) and the norms.
/// @throws ConfigError if the config is invalid; OverflowError if any count overflows int64.
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

inline std::optional<index_t> try_approx_parameters(index_t d_model, index_t n_layers) {
  try {
    return approx_parameters(d_model, n_layers);
  } catch (const OverflowError&) {
    return std::nullopt;
  }
}

namespace detail {

// LayerNorm has a weight and a bias per feature, RMSNorm only a weight.
inline index_t norm_parameters(index_t width, Norm norm, std::string_view what) {
  return checked_mul(width, check_norm(what, norm) == Norm::layer_norm ? 2 : 1, what);
}

}  // namespace detail

inline ParameterCount count_parameters(const TransformerConfig& config) {
  const std::vector<WeightMatrix> matrices = weight_matrices(config);  // validates the config
  constexpr std::string_view what = "count_parameters";
  const TransformerConfig& c = config;
  ParameterCount count;
  index_t expert_layer = 0, inactive_layer = 0;  // one layer's experts, and those a token skips
  constexpr std::string_view positions = matrix_name(ModelTensor::position_embedding);
  for (const WeightMatrix& matrix : matrices) {
    // Per-layer matrices are attention's and the FFN's; the rest exist once.
    index_t& slot = matrix.role == MatrixRole::attention     ? count.per_layer.attention
                    : matrix.role == MatrixRole::ffn         ? count.per_layer.ffn
                    : matrix.role == MatrixRole::output_head ? count.output_head
                    : matrix.name == positions               ? count.position_embedding
                                                             : count.token_embedding;
    slot = checked_add(slot, matrix.all_parameters(), what);
    if (matrix.expert) {
      expert_layer = checked_add(expert_layer, matrix.all_parameters(), what);
      inactive_layer =
          checked_add(inactive_layer,
                      checked_mul(matrix.parameters(), matrix.copies - matrix.active, what), what);
    }
  }
  count.per_layer.norms =
      checked_mul(2, detail::norm_parameters(c.d_model, c.norm, "count_parameters norms"), what);
  count.per_layer.total =
      checked_sum({count.per_layer.attention, count.per_layer.ffn, count.per_layer.norms}, what);
  count.layers = checked_mul(count.per_layer.total, c.n_layers, "count_parameters layers");
  count.final_norm = detail::norm_parameters(c.d_model, c.norm, "count_parameters final norm");
  count.total = checked_sum({count.token_embedding, count.position_embedding, count.layers,
                             count.final_norm, count.output_head},
                            "count_parameters total");
  count.experts = checked_mul(expert_layer, c.n_layers, what);
  // inactive ≤ total by construction: a subtraction that cannot overflow.
  count.active = count.total - checked_mul(inactive_layer, c.n_layers, what);
  count.approx_12d2l = try_approx_parameters(c.d_model, c.n_layers);
  if (count.approx_12d2l) {
    count.coverage = static_cast<double>(*count.approx_12d2l) / static_cast<double>(count.total);
  }
  return count;
}

}  // namespace dissect
