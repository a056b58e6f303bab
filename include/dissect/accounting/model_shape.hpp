// dissect/accounting/model_shape.hpp — the one place that lists a transformer's weight matrices and
// counts the FLOPs of its forward pass.
//
// weight_matrices(config) enumerates every matrix a TransformerConfig implies (embedding tables,
// the attention and FFN projections, the output head) with its [out, in] shape, whether it repeats
// in each layer and whether it carries a bias. forward_flops() is the single definition of a
// forward pass's FLOPs. count.hpp, budget.hpp and forward_chain.hpp all read these, so a parameter
// count, a prefill budget and a shape chain cannot disagree about what a model is.
#pragma once

#include <span>
#include <string_view>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// What a matrix is for; count_parameters reports parameters by role.
enum class MatrixRole { embedding, attention, ffn, output_head };

/// One weight matrix of a model. Shapes follow PyTorch: [out, in] for a linear layer's weight
/// (y = x·Wᵀ), [entries, D] for an embedding table.
struct WeightMatrix {
  std::string_view name;  ///< "embed.tokens", "embed.positions", "attn.qkv", "attn.out",
                          ///< "mlp.gate", "mlp.up", "mlp.down", "lm_head": matrix_name's
                          ///< (accounting/tensor_names.hpp)
  Shape<2> shape{};       ///< [out, in]
  MatrixRole role = MatrixRole::attention;
  bool per_layer = false;   ///< one copy in each of the L layers, or one for the whole model
  bool bias = false;        ///< a bias [out] beside the weight
  bool multiplied = false;  ///< the forward pass multiplies every token by it (false: a lookup)
  bool tied = false;        ///< its values are another matrix's (the head tied to the token
                            ///< embedding): it costs FLOPs but has no parameters of its own
  /// One of a mixture of experts' FFN matrices (not its router).
  bool expert = false;
  /// Copies in each layer: E for an expert's matrix of a mixture of experts (one per expert),
  /// else 1. Every copy is a parameter; only `active` of them multiply a given token.
  index_t copies = 1;
  /// The copies each token is multiplied by: k for an expert's matrix (top-k routing), else 1.
  index_t active = 1;

  /// out · in.
  index_t weights() const;
  /// The parameters of one copy: 0 when tied, else out · in, plus out for the bias.
  index_t parameters() const;
  /// The parameters of all `copies` (of one layer, for a per-layer matrix).
  index_t all_parameters() const;
  /// The parameters a token is multiplied by: `active` copies' worth.
  index_t active_parameters() const;
};

/// Every weight matrix of `config`, in forward order: token embedding, position embedding (learned
/// positions only), attn.qkv (Q, K and V fused: [H·d_k + 2·H_kv·d_k, D]), attn.out [D, H·d_k],
/// the FFN (mlp.up [F, D] and mlp.down [D, F]; a gated FFN adds mlp.gate [F, D] before up), and
/// lm_head [V, D] — always listed, since the logits are always computed, and marked tied when it
/// shares the token embedding. Biases follow config.bias; the head never has one (neither GPT-2's
/// nor LLaMA's does). Norms are vectors, not matrices, and are not listed. A mixture of experts
/// (config.n_experts = E > 0) adds moe.router [E, D] (no bias) before the FFN, and its FFN
/// matrices have E copies of which k = experts_per_token are active.
/// @throws ConfigError if the config is invalid; OverflowError if a width overflows int64.
std::vector<WeightMatrix> weight_matrices(const TransformerConfig& config);

/// The matrix called `name` in `matrices`.
/// @throws Error if there is none.
const WeightMatrix& find_matrix(std::span<const WeightMatrix> matrices, std::string_view name);

/// What the FLOPs of a forward pass depend on.
struct ForwardShape {
  index_t linear_weights = 0;  ///< W: weights of the multiplied matrices, × L for per-layer ones
  index_t n_layers = 0;        ///< L
  index_t n_heads = 0;         ///< H, query heads (GQA shares K and V, not the attention work)
  index_t head_dim = 0;        ///< d_k
};

/// The ForwardShape of `config`: W sums weights() × copies over every multiplied matrix, so it
/// includes the output head even when tied, and excludes the embedding lookups. Of an expert's
/// matrix only the k active copies count: the FLOPs of a mixture of experts are its active ones
/// (the router's product included).
/// @throws ConfigError if the config is invalid; OverflowError if W overflows int64.
ForwardShape forward_shape(const TransformerConfig& config);

/// One matrix product x·Wᵀ over `rows` token rows: 2 · rows · out · in (a multiply and an add per
/// weight per row). One pass, one layer.
/// @throws OverflowError if the count overflows int64.
index_t product_flops(const WeightMatrix& matrix, index_t rows);

/// One of attention's two products in one layer, Q·Kᵀ ([T, d_k]·[d_k, T]) or P·V ([T, T]·[T, d_k])
/// for each of B·H heads: 2 · B · H · T · T · d_k. The full T×T square, as a dense kernel computes
/// it: the causal mask would let a kernel skip about half, and dissect does not count that saving
/// anywhere, so every FLOP figure in the library is on the same footing.
/// @throws OverflowError if the count overflows int64.
index_t attention_product_flops(index_t batch, index_t n_heads, index_t tokens, index_t head_dim);

/// The FLOPs of one forward pass, split by kind.
struct ForwardFlops {
  index_t linear = 0;     ///< 2 · B·T · W: every token through every multiplied matrix
  index_t attention = 0;  ///< 2 · attention_product_flops · L: Q·Kᵀ and P·V in every layer
  index_t total = 0;      ///< linear + attention
};

/// THE definition of a forward pass's FLOPs over `batch` sequences of `tokens` tokens: the matrix
/// products by weights (including the output head over all B·T tokens) plus attention's two
/// products per layer. Embedding lookups, norms, softmax, activations and residual adds are not
/// counted: they are O(B·T·D) elementwise work, not products. Prefill FLOPs are forward_flops with
/// B = 1 and T the prompt length.
/// @throws ConfigError if a size of `shape`, `batch` or `tokens` is <= 0; OverflowError if a
///         count overflows int64.
ForwardFlops forward_flops(const ForwardShape& shape, index_t batch, index_t tokens);

/// forward_flops(forward_shape(config), batch, tokens).
ForwardFlops forward_flops(const TransformerConfig& config, index_t batch, index_t tokens);

// ---- implementation -----------------------------------------------------------------------------

inline index_t WeightMatrix::weights() const {
  if (detail::mul_overflows(shape[0], shape[1])) {  // the message is built only on failure
    throw OverflowError(detail::concat("WeightMatrix ", name, " ", format_shape(shape),
                                       ": weight count overflows int64"));
  }
  return shape[0] * shape[1];
}

inline index_t WeightMatrix::parameters() const {
  if (tied) return 0;
  // out · in + out cannot overflow once out · in does not: in >= 1 for every listed matrix, and
  // a bias-free matrix adds nothing.
  return checked_add(weights(), bias ? shape[0] : 0, "WeightMatrix::parameters");
}

inline std::vector<WeightMatrix> weight_matrices(const TransformerConfig& config) {
  config.validate();
  constexpr std::string_view what = "weight_matrices";
  const TransformerConfig& c = config;
  const index_t D = c.d_model, F = c.d_ff, V = c.vocab;
  const index_t q_width = checked_mul(c.n_heads, c.head_size(), what);
  const index_t kv_width = checked_mul(c.kv_heads(), c.head_size(), what);
  const index_t qkv_width = checked_sum({q_width, kv_width, kv_width}, what);
  using R = MatrixRole;
  using T = ModelTensor;
  // One row per matrix, in forward order. A bias follows config.bias on every linear layer but
  // the head; the tables are lookups, not products.
  std::vector<WeightMatrix> matrices;
  matrices.push_back(
      {.name = matrix_name(T::token_embedding), .shape = {V, D}, .role = R::embedding});
  if (c.positions == Positions::learned) {
    matrices.push_back({.name = matrix_name(T::position_embedding),
                        .shape = {c.context, D},
                        .role = R::embedding});
  }
  const auto layer = [&](ModelTensor tensor, index_t out, index_t in, MatrixRole role) {
    matrices.push_back({.name = matrix_name(tensor),
                        .shape = {out, in},
                        .role = role,
                        .per_layer = true,
                        .bias = c.bias,
                        .multiplied = true});
  };
  layer(T::qkv, qkv_width, D, R::attention);
  layer(T::attention_output, D, q_width, R::attention);
  if (c.is_moe()) {
    layer(T::router, c.n_experts, D, R::ffn);
    matrices.back().bias = false;  // Mixtral's gate is nn.Linear(D, E, bias=False)
  }
  const std::size_t first_expert = matrices.size();
  if (c.ffn == Ffn::gated) layer(T::ffn_gate, F, D, R::ffn);  // SwiGLU's gate: the up's shape
  layer(T::ffn_up, F, D, R::ffn);
  layer(T::ffn_down, D, F, R::ffn);
  if (c.is_moe()) {
    for (std::size_t i = first_expert; i < matrices.size(); ++i) {
      matrices[i].expert = true;
      matrices[i].copies = c.n_experts;
      matrices[i].active = c.experts_per_token;
    }
  }
  matrices.push_back({.name = matrix_name(T::head),
                      .shape = {V, D},
                      .role = R::output_head,
                      .multiplied = true,
                      .tied = c.tied_embeddings});
  return matrices;
}

inline index_t WeightMatrix::all_parameters() const {
  return checked_mul(parameters(), copies, "WeightMatrix::all_parameters");
}

inline index_t WeightMatrix::active_parameters() const {
  return checked_mul(parameters(), active, "WeightMatrix::active_parameters");
}

inline const WeightMatrix& find_matrix(std::span<const WeightMatrix> matrices,
                                       std::string_view name) {
  for (const WeightMatrix& matrix : matrices) {
    if (matrix.name == name) return matrix;
  }
  throw Error(detail::concat("find_matrix: no matrix \"", name, "\""));
}

inline ForwardShape forward_shape(const TransformerConfig& config) {
  ForwardShape shape{0, config.n_layers, config.n_heads, config.head_size()};
  for (const WeightMatrix& matrix : weight_matrices(config)) {
    if (!matrix.multiplied) continue;
    // A token is multiplied by the active copies only: k experts of E.
    const index_t copies =
        checked_mul(matrix.per_layer ? config.n_layers : 1, matrix.active, "forward_shape");
    shape.linear_weights =
        checked_add(shape.linear_weights, checked_mul(matrix.weights(), copies, "forward_shape"),
                    "forward_shape");
  }
  return shape;
}

inline index_t product_flops(const WeightMatrix& matrix, index_t rows) {
  return checked_product({2, rows, matrix.shape[0], matrix.shape[1]}, "product_flops");
}

inline index_t attention_product_flops(index_t batch, index_t n_heads, index_t tokens,
                                       index_t head_dim) {
  return checked_product({2, batch, n_heads, tokens, tokens, head_dim}, "attention_product_flops");
}

inline ForwardFlops forward_flops(const ForwardShape& shape, index_t batch, index_t tokens) {
  constexpr std::string_view op = "forward_flops";
  require_positive(op, "linear_weights", shape.linear_weights);
  require_positive(op, "n_layers", shape.n_layers);
  require_positive(op, "n_heads", shape.n_heads);
  require_positive(op, "head_dim", shape.head_dim);
  require_positive(op, "batch", batch);
  require_positive(op, "tokens", tokens);
  ForwardFlops flops;
  flops.linear = checked_product({2, batch, tokens, shape.linear_weights}, "forward_flops linear");
  flops.attention = checked_product(
      {2, shape.n_layers, attention_product_flops(batch, shape.n_heads, tokens, shape.head_dim)},
      "forward_flops attention");
  flops.total = checked_add(flops.linear, flops.attention, "forward_flops total");
  return flops;
}

inline ForwardFlops forward_flops(const TransformerConfig& config, index_t batch, index_t tokens) {
  return forward_flops(forward_shape(config), batch, tokens);
}

}  // namespace dissect
