// dissect/accounting/config.hpp — a decoder-only transformer described by its shapes, and public
// presets.
//
// TransformerConfig holds exactly what the accounting needs: the sizes (D, L, H, H_kv, d_k, F,
// V, context) and the style choices that change the parameter count (tied head, learned or
// rotary positions, LayerNorm or RMSNorm, biases, plain or gated FFN), plus the few settings that
// change only a built model's arithmetic (norm eps, RoPE θ, attention-score scaling). No values,
// no weights.
// validate() is the one place that decides whether a configuration is possible; each style enum
// has one check_* function that every entry point uses, so a value cast from outside the enum's
// range is a ConfigError, never a silently wrong branch.
#pragma once

#include <array>
#include <cmath>
#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/detail/enum_check.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

/// Where token positions come from: a learned [context, D] table (GPT-2) or rotary embeddings,
/// which have no parameters (LLaMA).
enum class Positions { learned, rotary };

/// LayerNorm has a weight and a bias per feature; RMSNorm only a weight.
enum class Norm { layer_norm, rms_norm };

/// mlp: D → F → D, two matrices. gated (SwiGLU): gate and up D → F, down F → D, three matrices.
enum class Ffn { mlp, gated };

/// The enumerator names, "learned", "rotary" / "layer_norm", "rms_norm" / "mlp", "gated".
/// @throws ConfigError for a value outside the enum (as check_positions etc.).
std::string_view positions_name(Positions positions);
std::string_view norm_name(Norm norm);
std::string_view ffn_name(Ffn ffn);

/// Returns `value` if it is one of the enum's enumerators. An enum class holds any int, so a
/// value cast from a file or a command line (`Norm(7)`) must be checked before it picks a branch.
/// @throws ConfigError "op: Norm(7) is out of range (known: layer_norm, rms_norm)".
Positions check_positions(std::string_view op, Positions value);
Norm check_norm(std::string_view op, Norm value);
Ffn check_ffn(std::string_view op, Ffn value);

/// How attention scales its scores q·kᵀ before the softmax. The default, 1/√d_k in every layer,
/// is what almost every model does; Hugging Face's GPT2Attention has two switches that change it,
/// and a checkpoint trained with them computes other scores without them:
///   scale_attn_weights: false              → scale = 1 (scores not divided by √d_k)
///   scale_attn_by_inverse_layer_idx: true  → inverse_layer_index (layer i's divided by i + 1)
struct ScoreScaling {
  /// The factor of every layer's scores; unset → 1/√d_k.
  std::optional<double> scale = std::nullopt;
  /// Layer i (counting from 0) further divides its scores by i + 1.
  bool inverse_layer_index = false;

  /// Neither switch set: 1/√d_k everywhere.
  bool is_default() const { return !scale && !inverse_layer_index; }
  bool operator==(const ScoreScaling&) const = default;
};

/// The shapes and style of a decoder-only transformer. Defaults are GPT-2's style; sizes have
/// no meaningful default and must be set. Every member has a default initializer, so a designated
/// initializer (`{.d_model = 8, .n_layers = 2, …}`) may name only the fields it sets.
struct TransformerConfig {
  index_t d_model = 0;                               ///< D
  index_t n_layers = 0;                              ///< L
  index_t n_heads = 0;                               ///< H, query heads
  std::optional<index_t> n_kv_heads = std::nullopt;  ///< H_kv (grouped-query attention); unset → H
  std::optional<index_t> head_dim = std::nullopt;    ///< d_k; unset → D / H
  index_t d_ff = 0;                                  ///< F
  index_t vocab = 0;                                 ///< V
  index_t context = 0;          ///< longest sequence; sizes a learned position table
  bool tied_embeddings = true;  ///< output head shares the token embedding
  Positions positions = Positions::learned;
  Norm norm = Norm::layer_norm;
  bool bias = true;  ///< biases on every linear layer (not the output head)
  Ffn ffn = Ffn::mlp;
  /// The norms' eps; unset → the norm's own default (LayerNorm 1e-5, RMSNorm 1e-6). Changes no
  /// count, only the arithmetic of a built model.
  std::optional<double> norm_eps = std::nullopt;
  /// RoPE's base θ (config.json "rope_theta"; LLaMA 1/2: 10000, LLaMA 3: 500000). Used only with
  /// rotary positions.
  double rope_theta = 10000.0;
  /// The attention scores' factor (default: 1/√d_k in every layer). Changes no count.
  ScoreScaling score_scaling = {};
  /// E: 0 is a dense FFN; E > 0 makes every layer's FFN a sparse mixture of E experts, each an
  /// FFN of width F (its style: `ffn`), behind a router D → E without bias (Mixtral's
  /// num_local_experts). All E are parameters; a token runs through experts_per_token of them.
  index_t n_experts = 0;
  /// k, the experts each token is routed to (Mixtral's num_experts_per_tok); used when E > 0.
  index_t experts_per_token = 2;
  /// W, Mistral's sliding window: the query at position p attends to keys p − W < j ≤ p only
  /// (unset: every earlier position). Changes no count; a RollingKVCache holds W positions.
  std::optional<index_t> sliding_window = std::nullopt;

  /// Whether the FFN is a mixture of experts (n_experts > 0).
  bool is_moe() const { return n_experts > 0; }

  /// H_kv: n_kv_heads if set, else n_heads.
  index_t kv_heads() const { return n_kv_heads.value_or(n_heads); }

  /// d_k: head_dim if set, else D / H (exact once validate() has passed).
  index_t head_size() const {
    if (head_dim) return *head_dim;
    return n_heads > 0 ? d_model / n_heads : 0;
  }

  /// The factor layer `layer` (from 0) multiplies its scores q·kᵀ by: score_scaling.scale (unset:
  /// 1/√d_k), divided by layer + 1 with inverse_layer_index. Computed in double, as one factor.
  /// @throws ConfigError if layer is outside [0, n_layers).
  double score_scale(index_t layer) const;

  /// Checks that the configuration can exist: every size > 0, D % H == 0 when d_k is derived,
  /// H_kv dividing H, every style enum in range, rope_theta (and norm_eps and
  /// score_scaling.scale if set) finite and > 0, n_experts ≥ 0 and, with experts,
  /// 1 ≤ experts_per_token ≤ n_experts, sliding_window (if set) > 0.
  /// @throws ConfigError naming the offending field (or enum type) and its value.
  void validate() const;
};

/// A size that must be > 0: returns `value`.
/// @throws ConfigError "op: field must be > 0 (got value)".
index_t require_positive(std::string_view op, std::string_view field, index_t value);

/// A real number that must be finite and > 0 (an eps, a θ): returns `value`.
/// @throws ConfigError "op: field must be finite and > 0 (got value)", NaN included.
double require_positive_finite(std::string_view op, std::string_view field, double value);

/// The head arithmetic of attention, decided in one place for configs and blocks alike.
struct HeadLayout {
  index_t n_heads;     ///< H
  index_t n_kv_heads;  ///< H_kv
  index_t head_dim;    ///< d_k
};

/// Checks d_model, n_heads, n_kv_heads (unset → H) and head_dim (unset → D / H, which must then
/// divide exactly) and returns them resolved.
/// @throws ConfigError naming `op` and the field: a size ≤ 0, D % H ≠ 0 for a derived d_k, or
///         H_kv not dividing H.
HeadLayout check_heads(std::string_view op, index_t d_model, index_t n_heads,
                       std::optional<index_t> n_kv_heads = std::nullopt,
                       std::optional<index_t> head_dim = std::nullopt);

/// A named configuration of a public model.
struct Preset {
  std::string_view name;         ///< the key find_preset looks up
  std::string_view description;  ///< one line, with the published parameter count
  TransformerConfig config;
};

/// Every preset, smallest family first (the order a listing should print them in).
std::span<const Preset> presets();

/// The preset called `name`.
/// @throws ConfigError if there is none; the message lists the known names.
const Preset& find_preset(std::string_view name);

// ---- implementation: enums ---------------------------------------------------------------------

namespace detail {

inline constexpr std::array<std::string_view, 2> positions_names{"learned", "rotary"};
inline constexpr std::array<std::string_view, 2> norm_names{"layer_norm", "rms_norm"};
inline constexpr std::array<std::string_view, 2> ffn_names{"mlp", "gated"};

}  // namespace detail

inline Positions check_positions(std::string_view op, Positions value) {
  return detail::check_enum(op, "Positions", value, detail::positions_names);
}

inline Norm check_norm(std::string_view op, Norm value) {
  return detail::check_enum(op, "Norm", value, detail::norm_names);
}

inline Ffn check_ffn(std::string_view op, Ffn value) {
  return detail::check_enum(op, "Ffn", value, detail::ffn_names);
}

inline std::string_view positions_name(Positions positions) {
  return detail::positions_names[static_cast<std::size_t>(
      check_positions("positions_name", positions))];
}

inline std::string_view norm_name(Norm norm) {
  return detail::norm_names[static_cast<std::size_t>(check_norm("norm_name", norm))];
}

inline std::string_view ffn_name(Ffn ffn) {
  return detail::ffn_names[static_cast<std::size_t>(check_ffn("ffn_name", ffn))];
}

// ---- implementation: sizes and presets ----------------------------------------------------------

inline index_t require_positive(std::string_view op, std::string_view field, index_t value) {
  if (value <= 0)
    throw ConfigError(detail::concat(op, ": ", field, " must be > 0 (got ", value, ")"));
  return value;
}

inline double require_positive_finite(std::string_view op, std::string_view field, double value) {
  if (!(std::isfinite(value) && value > 0)) {
    throw ConfigError(detail::concat(op, ": ", field, " must be finite and > 0 (got ", value, ")"));
  }
  return value;
}

inline HeadLayout check_heads(std::string_view op, index_t d_model, index_t n_heads,
                              std::optional<index_t> n_kv_heads, std::optional<index_t> head_dim) {
  require_positive(op, "d_model", d_model);
  require_positive(op, "n_heads", n_heads);
  const index_t kv_heads = require_positive(op, "n_kv_heads", n_kv_heads.value_or(n_heads));
  // An explicit head_dim may make H·d_k differ from D (Gemma does); only the derived one must
  // divide evenly, or the heads would silently drop features.
  if (head_dim) require_positive(op, "head_dim", *head_dim);
  if (!head_dim && d_model % n_heads != 0) {
    throw ConfigError(detail::concat(op, ": d_model ", d_model, " is not divisible by n_heads ",
                                     n_heads, " (set head_dim explicitly if that is intended)"));
  }
  if (n_heads % kv_heads != 0) {
    throw ConfigError(detail::concat(op, ": n_kv_heads ", kv_heads, " does not divide n_heads ",
                                     n_heads,
                                     " (each KV head must serve the same number of query heads)"));
  }
  return {n_heads, kv_heads, head_dim ? *head_dim : d_model / n_heads};
}

inline void TransformerConfig::validate() const {
  constexpr std::string_view op = "TransformerConfig";
  check_heads(op, d_model, n_heads, n_kv_heads, head_dim);
  require_positive(op, "n_layers", n_layers);
  require_positive(op, "d_ff", d_ff);
  require_positive(op, "vocab", vocab);
  require_positive(op, "context", context);
  check_positions(op, positions);
  check_norm(op, norm);
  check_ffn(op, ffn);
  if (norm_eps) require_positive_finite(op, "norm_eps", *norm_eps);
  require_positive_finite(op, "rope_theta", rope_theta);
  if (score_scaling.scale) require_positive_finite(op, "score_scaling.scale", *score_scaling.scale);
  if (n_experts < 0) {
    throw ConfigError(
        detail::concat(op, ": n_experts must be >= 0 (0: a dense FFN; got ", n_experts, ")"));
  }
  if (is_moe() && (experts_per_token < 1 || experts_per_token > n_experts)) {
    throw ConfigError(detail::concat(op, ": experts_per_token ", experts_per_token,
                                     " must be in [1, n_experts = ", n_experts, "]"));
  }
  if (sliding_window && *sliding_window <= 0) {
    throw ConfigError(detail::concat(op, ": sliding_window must be > 0 (got ", *sliding_window,
                                     "; unset means no window)"));
  }
}

inline double TransformerConfig::score_scale(index_t layer) const {
  if (layer < 0 || layer >= n_layers) {
    throw ConfigError(detail::concat("TransformerConfig::score_scale: layer ", layer,
                                     " is outside [0, n_layers = ", n_layers, ")"));
  }
  // 1/√d_k exactly as attention computed it before the setting existed, so a default config's
  // scores keep their bits.
  const double scale =
      score_scaling.scale.value_or(1.0 / std::sqrt(static_cast<double>(head_size())));
  return score_scaling.inverse_layer_index ? scale / static_cast<double>(layer + 1) : scale;
}

namespace detail {

// GPT-2 (Radford et al. 2019, "Language Models are Unsupervised Multitask Learners"): LayerNorm,
// learned positions, biases, GELU MLP with F = 4D, head tied to the token embedding.
inline TransformerConfig gpt2_style(index_t d_model, index_t n_layers, index_t n_heads) {
  TransformerConfig config;
  config.d_model = d_model;
  config.n_layers = n_layers;
  config.n_heads = n_heads;
  config.d_ff = checked_mul(4, d_model, "gpt2_style d_ff");  // "n_inner": null → 4 · n_embd
  config.vocab = 50257;                                      // config.json "vocab_size"
  config.context = 1024;                                     // config.json "n_positions"
  return config;
}

// LLaMA (Touvron et al. 2023, arXiv:2302.13971, and Llama 2, arXiv:2307.09288): RMSNorm,
// rotary positions, no biases, SwiGLU FFN, separate output head.
inline TransformerConfig llama_style(index_t d_model, index_t n_layers, index_t n_heads,
                                     index_t d_ff, index_t context) {
  TransformerConfig config;
  config.d_model = d_model;
  config.n_layers = n_layers;
  config.n_heads = n_heads;
  config.d_ff = d_ff;
  config.vocab = 32000;
  config.context = context;
  config.tied_embeddings = false;  // config.json "tie_word_embeddings": false
  config.positions = Positions::rotary;
  config.norm = Norm::rms_norm;
  config.bias = false;
  config.ffn = Ffn::gated;
  return config;
}

inline TransformerConfig llama2_70b() {
  // HF meta-llama/Llama-2-70b-hf config.json: hidden_size 8192, num_hidden_layers 80,
  // num_attention_heads 64, num_key_value_heads 8, intermediate_size 28672,
  // max_position_embeddings 4096.
  TransformerConfig config = llama_style(8192, 80, 64, 28672, 4096);
  config.n_kv_heads = 8;
  return config;
}

inline TransformerConfig toy_d512_l6() {
  // A small exercise model: D = 512, L = 6, V = 32000, where 12·D²·L + V·D = 35,258,368. H, F
  // and the context are ours (d_k = 64, F = 4D). The style keeps the 12·D²·L estimate honest:
  // no biases, rotary positions, tied head, plain MLP — the exact count only adds the RMSNorm
  // weights, (2L + 1)·D = 6,656.
  TransformerConfig config;
  config.d_model = 512;
  config.n_layers = 6;
  config.n_heads = 8;
  config.d_ff = 2048;
  config.vocab = 32000;
  config.context = 1024;
  config.positions = Positions::rotary;
  config.norm = Norm::rms_norm;
  config.bias = false;
  return config;
}

inline TransformerConfig mixtral_8x7b() {
  // HF mistralai/Mixtral-8x7B-v0.1 config.json: hidden_size 4096, num_hidden_layers 32,
  // num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336, vocab_size 32000,
  // max_position_embeddings 32768, rope_theta 1e6, num_local_experts 8, num_experts_per_tok 2.
  TransformerConfig config = llama_style(4096, 32, 32, 14336, 32768);
  config.n_kv_heads = 8;
  config.rope_theta = 1e6;
  config.norm_eps = 1e-5;
  config.n_experts = 8;
  config.experts_per_token = 2;
  return config;
}

}  // namespace detail

inline std::span<const Preset> presets() {
  static const std::array<Preset, 6> all{{
      // HF gpt2 config.json: n_embd 768, n_layer 12, n_head 12.
      {"gpt2-small", "GPT-2 small (HF gpt2), 124,439,808 parameters",
       detail::gpt2_style(768, 12, 12)},
      // HF gpt2-medium config.json: n_embd 1024, n_layer 24, n_head 16.
      {"gpt2-medium", "GPT-2 medium (HF gpt2-medium), 354,823,168 parameters",
       detail::gpt2_style(1024, 24, 16)},
      // HF huggyllama/llama-7b config.json: hidden_size 4096, num_hidden_layers 32,
      // num_attention_heads 32, intermediate_size 11008, max_position_embeddings 2048.
      {"llama-7b", "LLaMA-7B (Touvron et al. 2023), 6,738,415,616 parameters",
       detail::llama_style(4096, 32, 32, 11008, 2048)},
      {"llama-2-70b", "Llama-2-70B, GQA with 8 KV heads, 68,976,648,192 parameters",
       detail::llama2_70b()},
      {"mixtral-8x7b",
       "Mixtral-8x7B, 8 experts top-2, 46,702,792,704 parameters, 12,879,925,248 active",
       detail::mixtral_8x7b()},
      {"toy", "an exercise model: D = 512, L = 6, V = 32000, 35,265,024 parameters",
       detail::toy_d512_l6()},
  }};
  return all;
}

inline const Preset& find_preset(std::string_view name) {
  for (const Preset& preset : presets()) {
    if (preset.name == name) return preset;
  }
  std::string known;
  for (const Preset& preset : presets())
    known += (known.empty() ? "" : ", ") + std::string(preset.name);
  throw ConfigError(detail::concat("preset: unknown name \"", name, "\" (known: ", known, ")"));
}

}  // namespace dissect
