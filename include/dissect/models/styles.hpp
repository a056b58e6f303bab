// dissect/models/styles.hpp — what makes a decoder GPT-2's, LLaMA's or Mixtral's: its parts and
// its names.
//
// A style fixes the parts a TransformerConfig cannot vary for that family (the norm, the FFN, the
// positions, the activation) and the state_dict names of its modules. The sizes, the head
// count, grouped-query heads, biases and tying come from the config, so a "GPT-2" with H_kv < H
// or an untied head is fine; a GPT-2 with RMSNorm is another family and refused. So is a LLaMA
// whose attention scores are scaled otherwise than by 1/√d_k: GPT-2's attention has switches for
// that (scale_attn_weights, scale_attn_by_inverse_layer_idx), LLaMA's has none, so no LLaMA
// checkpoint holds such a model.
#pragma once

#include <string_view>

#include "dissect/tensor/activation.hpp"
#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"

namespace dissect {

/// A decoder family: the parts a config cannot vary for it, and its modules' state_dict names.
struct DecoderStyle {
  std::string_view family;      ///< "gpt2", "llama": Hugging Face's model_type
  std::string_view model_name;  ///< "GPT2Model": how messages name the model
  std::string_view layer_name;  ///< "GPT2Block"
  Norm norm;
  Ffn ffn;
  Positions positions;
  Activation activation;  ///< of a plain MLP (a gated FFN is SwiGLU whatever this says)
  /// Whether the family's attention may scale its scores otherwise than by 1/√d_k
  /// (TransformerConfig::score_scaling): GPT-2's may, LLaMA's always uses 1/√d_k.
  bool score_scaling;
  // state_dict names: the model's members, then a layer's.
  const char* token_embedding;
  const char* position_embedding;  ///< "" when positions are rotary (no parameters)
  const char* layers;
  const char* final_norm;
  const char* head;
  const char* attention_norm;
  const char* attention;
  const char* ffn_norm;
  const char* mlp;
  /// Whether every layer's FFN is a mixture of experts (MixtureOfExperts over the FFN `ffn`
  /// names; the config's n_experts and experts_per_token size it).
  bool moe = false;
};

/// GPT-2 (HF GPT2LMHeadModel): pre-LayerNorm blocks, learned positions, GELU (tanh) MLP.
inline constexpr DecoderStyle gpt2_style{"gpt2",
                                         "GPT2Model",
                                         "GPT2Block",
                                         Norm::layer_norm,
                                         Ffn::mlp,
                                         Positions::learned,
                                         Activation::gelu_tanh,
                                         true,
                                         "wte",
                                         "wpe",
                                         "h",
                                         "ln_f",
                                         "lm_head",
                                         "ln_1",
                                         "attn",
                                         "ln_2",
                                         "mlp"};

/// LLaMA (HF LlamaForCausalLM): RMSNorm, rotary positions, SwiGLU.
inline constexpr DecoderStyle llama_style{"llama",
                                          "LlamaModel",
                                          "LlamaDecoderLayer",
                                          Norm::rms_norm,
                                          Ffn::gated,
                                          Positions::rotary,
                                          Activation::silu,
                                          false,
                                          "embed_tokens",
                                          "",
                                          "layers",
                                          "norm",
                                          "lm_head",
                                          "input_layernorm",
                                          "self_attn",
                                          "post_attention_layernorm",
                                          "mlp"};

/// Mixtral (HF MixtralForCausalLM): LLaMA's layer with its SwiGLU FFN replaced by a sparse
/// mixture of SwiGLU experts ("block_sparse_moe"), each token routed to k of E.
inline constexpr DecoderStyle mixtral_style = [] {
  DecoderStyle style = llama_style;
  style.family = "mixtral";
  style.model_name = "MixtralModel";
  style.layer_name = "MixtralDecoderLayer";
  style.mlp = "block_sparse_moe";
  style.moe = true;
  return style;
}();

/// Validates `config` and checks that it is of `style`'s family (the style's parts, and the
/// default score scaling for a family that has no other), and that its heads are d_k = D / H
/// wide (the attention blocks' layout).
/// @throws ConfigError naming `op`, the field and both values.
inline void check_style(std::string_view op, const DecoderStyle& style,
                        const TransformerConfig& config) {
  config.validate();
  const auto refuse = [&](std::string_view field, std::string_view got, std::string_view want) {
    throw ConfigError(detail::concat(op, ": config.", field, " is ", got, ", ", style.model_name,
                                     " needs ", want));
  };
  if (config.norm != style.norm) refuse("norm", norm_name(config.norm), norm_name(style.norm));
  if (config.ffn != style.ffn) refuse("ffn", ffn_name(config.ffn), ffn_name(style.ffn));
  if (config.positions != style.positions) {
    refuse("positions", positions_name(config.positions), positions_name(style.positions));
  }
  if (config.is_moe() != style.moe) {
    throw ConfigError(detail::concat(op, ": config.n_experts is ", config.n_experts, ", ",
                                     style.model_name,
                                     style.moe ? " needs a mixture of experts (n_experts > 0)"
                                               : " has a dense FFN (n_experts = 0)"));
  }
  if (!style.score_scaling && !config.score_scaling.is_default()) {
    refuse("score_scaling", "not 1/√d_k", "1/√d_k in every layer (its attention has no other)");
  }
  if (config.head_size() * config.n_heads != config.d_model) {
    throw ConfigError(detail::concat(op, ": head_dim ", config.head_size(), " · n_heads ",
                                     config.n_heads, " must equal d_model ", config.d_model,
                                     " (the attention blocks split D into H heads)"));
  }
}

}  // namespace dissect
