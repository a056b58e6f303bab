// dissect/models/styles.hpp — what makes a decoder GPT-2's or LLaMA's: its parts and its names.
//
// A style fixes the parts a TransformerConfig cannot vary for that family (the norm, the FFN, the
// positions, the activation) and the state_dict names of its modules. The sizes, the head
// count, grouped-query heads, biases and tying come from the config, so a "GPT-2" with H_kv < H
// or an untied head is fine; a GPT-2 with RMSNorm is another family and refused.
#pragma once

#include <string_view>

#include "dissect/activation.hpp"
#include "dissect/config.hpp"
#include "dissect/error.hpp"

namespace dissect {

/// GPT-2 (HF GPT2LMHeadModel): pre-LayerNorm blocks, learned positions, GELU (tanh) MLP.
struct Gpt2Style {
  static constexpr std::string_view model_name = "GPT2Model";
  static constexpr std::string_view layer_name = "GPT2Block";
  static constexpr Norm norm = Norm::layer_norm;
  static constexpr Ffn ffn = Ffn::mlp;
  static constexpr Positions positions = Positions::learned;
  static constexpr Activation activation = Activation::gelu_tanh;
  // state_dict names: the model's members, then a layer's.
  static constexpr const char* token_embedding = "wte";
  static constexpr const char* position_embedding = "wpe";
  static constexpr const char* layers = "h";
  static constexpr const char* final_norm = "ln_f";
  static constexpr const char* head = "lm_head";
  static constexpr const char* attention_norm = "ln_1";
  static constexpr const char* attention = "attn";
  static constexpr const char* ffn_norm = "ln_2";
  static constexpr const char* mlp = "mlp";
};

/// LLaMA (HF LlamaForCausalLM): RMSNorm, rotary positions, SwiGLU.
struct LlamaStyle {
  static constexpr std::string_view model_name = "LlamaModel";
  static constexpr std::string_view layer_name = "LlamaDecoderLayer";
  static constexpr Norm norm = Norm::rms_norm;
  static constexpr Ffn ffn = Ffn::gated;
  static constexpr Positions positions = Positions::rotary;
  static constexpr Activation activation = Activation::silu;
  static constexpr const char* token_embedding = "embed_tokens";
  static constexpr const char* position_embedding = "";  // none: RoPE has no parameters
  static constexpr const char* layers = "layers";
  static constexpr const char* final_norm = "norm";
  static constexpr const char* head = "lm_head";
  static constexpr const char* attention_norm = "input_layernorm";
  static constexpr const char* attention = "self_attn";
  static constexpr const char* ffn_norm = "post_attention_layernorm";
  static constexpr const char* mlp = "mlp";
};

/// Validates `config` and checks that it is of Style's family, and that its heads are
/// d_k = D / H wide (the attention blocks' layout).
/// @throws ConfigError naming `op`, the field and both values.
template <class Style>
void check_style(std::string_view op, const TransformerConfig& config) {
  config.validate();
  const auto refuse = [&](std::string_view field, std::string_view got, std::string_view want) {
    throw ConfigError(detail::concat(op, ": config.", field, " is ", got, ", ", Style::model_name,
                                     " needs ", want));
  };
  if (config.norm != Style::norm) refuse("norm", norm_name(config.norm), norm_name(Style::norm));
  if (config.ffn != Style::ffn) refuse("ffn", ffn_name(config.ffn), ffn_name(Style::ffn));
  if (config.positions != Style::positions) {
    refuse("positions", positions_name(config.positions), positions_name(Style::positions));
  }
  if (config.head_size() * config.n_heads != config.d_model) {
    throw ConfigError(detail::concat(op, ": head_dim ", config.head_size(), " · n_heads ",
                                     config.n_heads, " must equal d_model ", config.d_model,
                                     " (the attention blocks split D into H heads)"));
  }
}

}  // namespace dissect
