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

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/core/error.hpp"
#include "dissect/tensor/activation.hpp"

namespace dissect {

/// A decoder family: the parts a config cannot vary for it, and its modules' state_dict names.
struct DecoderStyle {
  std::string_view family{};    ///< "gpt2", "llama": Hugging Face's model_type
  std::string_view model_name;  ///< "GPT2Model": how messages name the model
  std::string_view layer_name;  ///< "GPT2Block"
  Norm norm;
  Ffn ffn;
  Positions positions;
  Activation activation;  ///< of a plain MLP (a gated FFN is SwiGLU whatever this says)
  /// Whether the family's attention may scale its scores otherwise than by 1/√d_k
  /// (TransformerConfig::score_scaling): GPT-2's may, LLaMA's always uses 1/√d_k.
  bool score_scaling;
  // state_dict names: the model's members, then a layer's. The family's, of
  // accounting/tensor_names.hpp's table (detail::with_tensor_names fills them).
  const char* token_embedding = "";
  const char* position_embedding = "";  ///< "" when positions are rotary (no parameters)
  const char* layers = "";
  const char* final_norm = "";
  const char* head = "";
  const char* attention_norm = "";
  const char* attention = "";
  const char* ffn_norm = "";
  const char* mlp = "";
  /// Whether every layer's FFN is a mixture of experts (MixtureOfExperts over the FFN `ffn`
  /// names; the config's n_experts and experts_per_token size it).
  bool moe = false;
};

namespace detail {

/// `style` with the state_dict names of its family (accounting/tensor_names.hpp).
constexpr DecoderStyle with_tensor_names(DecoderStyle style, const FamilyTensorNames& names) {
  style.family = names.family;
  style.token_embedding = names.module(ModelTensor::token_embedding);
  style.position_embedding = names.module(ModelTensor::position_embedding);
  style.layers = names.layers;
  style.final_norm = names.module(ModelTensor::final_norm);
  style.head = names.module(ModelTensor::head);
  style.attention_norm = names.module(ModelTensor::attention_norm);
  style.attention = names.attention;
  style.ffn_norm = names.module(ModelTensor::ffn_norm);
  style.mlp = names.ffn;
  return style;
}

}  // namespace detail

/// GPT-2 (HF GPT2LMHeadModel): pre-LayerNorm blocks, learned positions, GELU (tanh) MLP.
inline constexpr DecoderStyle gpt2_style =
    detail::with_tensor_names({.model_name = "GPT2Model",
                               .layer_name = "GPT2Block",
                               .norm = Norm::layer_norm,
                               .ffn = Ffn::mlp,
                               .positions = Positions::learned,
                               .activation = Activation::gelu_tanh,
                               .score_scaling = true},
                              gpt2_tensor_names);

/// LLaMA (HF LlamaForCausalLM): RMSNorm, rotary positions, SwiGLU.
inline constexpr DecoderStyle llama_style =
    detail::with_tensor_names({.model_name = "LlamaModel",
                               .layer_name = "LlamaDecoderLayer",
                               .norm = Norm::rms_norm,
                               .ffn = Ffn::gated,
                               .positions = Positions::rotary,
                               .activation = Activation::silu,
                               .score_scaling = false},
                              llama_tensor_names);

/// Mixtral (HF MixtralForCausalLM): LLaMA's layer with its SwiGLU FFN replaced by a sparse
/// mixture of SwiGLU experts ("block_sparse_moe"), each token routed to k of E.
inline constexpr DecoderStyle mixtral_style = [] {
  DecoderStyle style = detail::with_tensor_names(llama_style, mixtral_tensor_names);
  style.model_name = "MixtralModel";
  style.layer_name = "MixtralDecoderLayer";
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
