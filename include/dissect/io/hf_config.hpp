// dissect/io/hf_config.hpp — a Hugging Face config.json as a TransformerConfig.
//
// Three model types are read: "gpt2" (n_embd, n_layer, n_head, n_inner, vocab_size, n_positions,
// layer_norm_epsilon, activation_function, tie_word_embeddings, scale_attn_weights,
// scale_attn_by_inverse_layer_idx) and "llama" (hidden_size, intermediate_size,
// num_attention_heads, num_key_value_heads, num_hidden_layers, vocab_size,
// max_position_embeddings, rms_norm_eps, rope_theta, tie_word_embeddings, attention_bias,
// hidden_act) and "mixtral" (llama's keys plus num_local_experts, num_experts_per_tok and
// sliding_window; router_aux_loss_coef, output_router_logits and router_jitter_noise concern
// training in transformers and are not read). "mistral" is read as the llama family with its
// sliding_window (MistralForCausalLM is LlamaForCausalLM's layers and tensor names with every
// query limited to its last W positions; MistralConfig's default W is 4096, null means none), so
// it loads into a LlamaModel, which honours TransformerConfig::sliding_window; a LLaMA saved with
// a window is written back as "mistral". A llama config.json's sliding_window, a key LlamaConfig
// does not have, is ignored, as transformers ignores it. A setting dissect's models do not
// implement (another activation, RoPE scaling, biases on attention but not the MLP — mlp_bias is
// false when absent, as in LlamaConfig) is a ConfigError naming the key, never a silently
// different model; Mistral and Mixtral have no biases, so their files' bias keys are ignored, as
// transformers ignores them. A size beyond int64 is refused with the file's own number.
//
// GPT-2's two attention switches become TransformerConfig::score_scaling, as GPT2Attention applies
// them: scale_attn_weights: false → scale 1 (no 1/√d_k), scale_attn_by_inverse_layer_idx: true →
// layer i's scores further divided by i + 1. reorder_and_upcast_attn is read by no one: it changes
// only the precision of transformers' fp16 attention (scores computed in fp32), never the
// function, and dissect's scores are in the model's own precision (float or double) anyway.
// LLaMA's attention has no such switches (LlamaAttention always scales by 1/√d_k), so in a llama
// config.json these keys are ignored, as transformers ignores them.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/core/error.hpp"
#include "dissect/models/styles.hpp"
#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/io/detail/json.hpp"

namespace dissect {

/// The model families dissect can build from a checkpoint.
enum class ModelFamily { gpt2, llama, mixtral };

/// The decoder style (models/styles.hpp) of `family`: its parts and its state_dict names.
/// @throws ConfigError for a value outside the enum.
inline const DecoderStyle& style_of(ModelFamily family) {
  switch (family) {
    case ModelFamily::gpt2:
      return gpt2_style;
    case ModelFamily::llama:
      return llama_style;
    case ModelFamily::mixtral:
      return mixtral_style;
  }
  throw ConfigError(dissect::detail::concat("style_of: ModelFamily(", static_cast<int>(family),
                                            ") is out of range (known: gpt2, llama, mixtral)"));
}

/// "gpt2" / "llama" / "mixtral", as config.json's model_type spells them.
inline std::string_view family_name(ModelFamily family) {
  return style_of(family).family;
}

/// `family`'s tensor names: dissect's, Hugging Face's, llama.cpp's (accounting/tensor_names.hpp).
/// @throws ConfigError for a value outside the enum.
inline const FamilyTensorNames& tensor_names_of(ModelFamily family) {
  return tensor_names_of(family_name(family));
}

/// Whether `family` names its attention and FFN as LLaMA does (q_proj … o_proj, rotary rows):
/// llama and mixtral.
inline bool has_llama_layout(ModelFamily family) {
  return style_of(family).positions == Positions::rotary;
}

/// The family config.json's model_type names ("mistral": llama, whose models honour a sliding
/// window). @throws ConfigError naming `source` otherwise.
inline ModelFamily family_from_name(std::string_view name, std::string_view source) {
  for (ModelFamily family : {ModelFamily::gpt2, ModelFamily::llama, ModelFamily::mixtral}) {
    if (name == family_name(family)) return family;
  }
  if (name == "mistral") return ModelFamily::llama;
  throw ConfigError(dissect::detail::concat(
      source, ": model_type \"", name,
      "\" is not one dissect builds (known: gpt2, llama, mistral, mixtral)"));
}

/// Checks that a file of `family` can fill a Model (GPT2Model, LlamaModel, MixtralModel).
/// @throws ConfigError naming `source`, the family and the model otherwise.
template <class Model>
void require_family(ModelFamily family, std::string_view source) {
  if (family_name(family) != Model::style.family) {
    throw ConfigError(dissect::detail::concat(source, ": holds a ", family_name(family),
                                              " model, which cannot load into ",
                                              Model::style.model_name));
  }
}

struct HfConfig {
  ModelFamily family;
  TransformerConfig config;  ///< validated
};

/// Reads a parsed config.json; `source` names it in messages (a path).
/// @throws ConfigError naming the source and the key: a missing or mistyped key, an unknown
///         model_type, or a setting dissect does not implement; as TransformerConfig::validate.
HfConfig parse_hf_config(const nlohmann::json& json, std::string_view source);

/// Reads and parses the file. @throws Error naming the path if it cannot be read; FormatError
///         "<path> is not valid JSON: …", or "<path>: key "n_embd" appears twice" (nlohmann's
///         own parser would silently keep the last of two equal keys, and so run another model
///         than the first reader of the file sees); as parse_hf_config otherwise.
HfConfig read_hf_config(const std::filesystem::path& path);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// One config.json's keys, read with the file's name in every message.
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& json, std::string_view source)
      : json_(json), source_(source) {}

  bool has(const char* key) const { return json_.contains(key) && !json_.at(key).is_null(); }
  /// Whether the key is there at all, null included.
  bool present(const char* key) const { return json_.contains(key); }

  index_t count(const char* key) const {
    const auto& value = at(key);
    if (!value.is_number_integer()) fail(key, "must be a whole number", value);
    // nlohmann keeps integers above INT64_MAX as unsigned; read as int64 they would wrap
    // (2⁶⁴ − 1 to −1) and be refused as a size that is not > 0, naming a value the file lacks.
    constexpr auto largest = static_cast<std::uint64_t>(std::numeric_limits<index_t>::max());
    if (value.is_number_unsigned() && value.get<std::uint64_t>() > largest) {
      fail(key, "is beyond int64, the largest size dissect represents", value);
    }
    return value.get<index_t>();
  }
  std::optional<index_t> optional_count(const char* key) const {
    return has(key) ? std::optional<index_t>(count(key)) : std::nullopt;
  }
  double number(const char* key, std::optional<double> fallback = std::nullopt) const {
    if (!has(key) && fallback) return *fallback;
    const auto& value = at(key);
    if (!value.is_number()) fail(key, "must be a number", value);
    return value.get<double>();
  }
  bool flag(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!json_.at(key).is_boolean()) fail(key, "must be true or false", json_.at(key));
    return json_.at(key).get<bool>();
  }
  std::string text(const char* key, std::string_view fallback) const {
    if (!has(key)) return std::string(fallback);
    if (!json_.at(key).is_string()) fail(key, "must be a string", json_.at(key));
    return json_.at(key).get<std::string>();
  }
  /// A key whose only supported value is `supported` (or absence).
  void require_text(const char* key, std::initializer_list<std::string_view> supported,
                    std::string_view fallback) const {
    const std::string value = text(key, fallback);
    for (std::string_view ok : supported) {
      if (value == ok) return;
    }
    fail(key, "is not supported by dissect's models", json_.at(key));
  }

  const nlohmann::json& value(const char* key) const { return at(key); }

  [[noreturn]] void fail(const char* key, std::string_view problem,
                         const nlohmann::json& value) const {
    throw ConfigError(
        dissect::detail::concat(source_, ": \"", key, "\" ", problem, " (got ", value.dump(), ")"));
  }

 private:
  const nlohmann::json& at(const char* key) const {
    if (!json_.contains(key)) {
      throw ConfigError(dissect::detail::concat(source_, ": missing \"", key, "\""));
    }
    return json_.at(key);
  }

  const nlohmann::json& json_;
  std::string_view source_;
};

/// What a file calls each size of TransformerConfig, in the order d_model, n_layers, n_heads,
/// n_kv_heads, head_dim, d_ff, vocab, context (nullptr: the file has no such key).
struct SizeKeys {
  std::array<const char*, 8> names;
  bool d_ff_defaults_to_4d;  ///< GPT-2's n_inner: null or absent means 4·D

  enum Size { d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff, vocab, context };
  /// The file's key for `size`, or nullptr.
  const char* operator[](Size size) const { return names[size]; }
};

inline constexpr SizeKeys gpt2_size_keys{
    {"n_embd", "n_layer", "n_head", nullptr, nullptr, "n_inner", "vocab_size", "n_positions"},
    true};
inline constexpr SizeKeys llama_size_keys{
    {"hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
     "intermediate_size", "vocab_size", "max_position_embeddings"},
    false};
/// config_to_json's names (io/model_file.hpp): TransformerConfig's own fields.
inline constexpr SizeKeys dissect_size_keys{
    {"d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "d_ff", "vocab", "context"},
    false};

/// The keys a config.json of `family` gives its sizes under.
inline const SizeKeys& hf_size_keys(ModelFamily family) {
  return family == ModelFamily::gpt2 ? gpt2_size_keys : llama_size_keys;  // mixtral: llama's
}

/// The sizes of a config, read under the file's own key names; the style is left as given.
inline TransformerConfig read_sizes(const ConfigReader& r, const SizeKeys& keys,
                                    TransformerConfig c = {}) {
  const auto& [d_model, n_layers, n_heads, n_kv_heads, head_dim, d_ff, vocab, context] = keys.names;
  c.d_model = r.count(d_model);
  c.n_layers = r.count(n_layers);
  c.n_heads = r.count(n_heads);
  if (n_kv_heads) c.n_kv_heads = r.optional_count(n_kv_heads);
  if (head_dim) c.head_dim = r.optional_count(head_dim);
  if (keys.d_ff_defaults_to_4d && !r.has(d_ff)) {
    if (c.d_model > std::numeric_limits<index_t>::max() / 4) {
      r.fail(d_model,
             dissect::detail::concat("is too large: ", d_ff, " (null) means 4·", d_model,
                                     ", which overflows int64"),
             r.value(d_model));
    }
    c.d_ff = 4 * c.d_model;
  } else {
    c.d_ff = r.count(d_ff);
  }
  c.vocab = r.count(vocab);
  c.context = r.count(context);
  return c;
}

inline TransformerConfig gpt2_from(const ConfigReader& r) {
  // GPT-2's style is TransformerConfig's default.
  TransformerConfig c = read_sizes(r, gpt2_size_keys);
  c.norm_eps = r.number("layer_norm_epsilon", 1e-5);
  c.tied_embeddings = r.flag("tie_word_embeddings", true);
  // GPT-2's "gelu_new" is the tanh approximation, the only GELU its blocks use.
  r.require_text("activation_function", {"gelu_new", "gelu_pytorch_tanh"}, "gelu_new");
  // GPT2Attention: scores /= √d_k only if scale_attn_weights (default true), then /= layer_idx + 1
  // if scale_attn_by_inverse_layer_idx (default false).
  if (!r.flag("scale_attn_weights", true)) c.score_scaling.scale = 1.0;
  c.score_scaling.inverse_layer_index = r.flag("scale_attn_by_inverse_layer_idx", false);
  return c;
}

/// LlamaConfig's attention_bias (q, k, v and o_proj) and mlp_bias (gate, up and down_proj), both
/// false when absent. dissect's models bias every linear layer or none (TransformerConfig::bias),
/// so the two must agree: attention_bias alone would load an MLP with biases the file's model
/// does not have. MistralConfig and MixtralConfig have neither key (their layers are built with
/// bias=False whatever the file says), so their files are not asked.
inline bool llama_bias(const ConfigReader& r) {
  const bool attention = r.flag("attention_bias", false), mlp = r.flag("mlp_bias", false);
  if (attention != mlp) {
    // Named: the key the file sets; mlp_bias when it sets both.
    const bool explicit_mlp = r.has("mlp_bias");
    const char* key = explicit_mlp ? "mlp_bias" : "attention_bias";
    r.fail(key,
           dissect::detail::concat("disagrees with ", explicit_mlp ? "attention_bias" : "mlp_bias",
                                   " (attention_bias = ", attention ? "true" : "false",
                                   ", mlp_bias = ", mlp ? "true" : "false",
                                   explicit_mlp ? "" : ", LlamaConfig's default",
                                   "): dissect's models bias every linear layer or none"),
           r.value(key));
  }
  return attention;
}

inline TransformerConfig llama_from(const ConfigReader& r, bool biases = true) {
  TransformerConfig c = read_sizes(r, llama_size_keys);
  c.norm_eps = r.number("rms_norm_eps", 1e-6);
  c.rope_theta = r.number("rope_theta", 10000.0);
  c.tied_embeddings = r.flag("tie_word_embeddings", false);
  c.positions = Positions::rotary;
  c.norm = Norm::rms_norm;
  c.ffn = Ffn::gated;
  c.bias = biases && llama_bias(r);
  r.require_text("hidden_act", {"silu"}, "silu");
  if (r.has("rope_scaling")) {
    r.fail("rope_scaling", "is not supported (plain RoPE only)", r.value("rope_scaling"));
  }
  // GPT-2's scale_attn_weights / scale_attn_by_inverse_layer_idx, if a llama file carries them,
  // are left alone: LlamaAttention never reads them, so the model keeps 1/√d_k.
  return c;
}

inline TransformerConfig mixtral_from(const ConfigReader& r) {
  TransformerConfig c = llama_from(r, /*biases=*/false);
  c.norm_eps = r.number("rms_norm_eps", 1e-5);  // MixtralConfig's default
  c.rope_theta = r.number("rope_theta", 1e6);
  c.n_experts = r.count("num_local_experts");
  c.experts_per_token = r.count("num_experts_per_tok");
  if (c.n_experts < 1) r.fail("num_local_experts", "must be >= 1", r.value("num_local_experts"));
  // MixtralConfig's sliding_window defaults to null: full causal attention.
  c.sliding_window = r.optional_count("sliding_window");
  return c;
}

inline TransformerConfig mistral_from(const ConfigReader& r) {
  // MistralConfig's other defaults are LlamaConfig's; it has no bias keys.
  TransformerConfig c = llama_from(r, /*biases=*/false);
  // MistralConfig: sliding_window = 4096 when the key is absent; an explicit null turns it off.
  c.sliding_window = r.present("sliding_window") ? r.optional_count("sliding_window")
                                                 : std::optional<index_t>(4096);
  return c;
}

}  // namespace detail

inline HfConfig parse_hf_config(const nlohmann::json& json, std::string_view source) {
  if (!json.is_object()) {
    throw ConfigError(dissect::detail::concat(source, ": a config.json must be a JSON object"));
  }
  const detail::ConfigReader reader(json, source);
  HfConfig result{family_from_name(reader.text("model_type", ""), source), {}};
  const bool mistral = reader.text("model_type", "") == "mistral";
  result.config = result.family == ModelFamily::gpt2    ? detail::gpt2_from(reader)
                  : mistral                             ? detail::mistral_from(reader)
                  : result.family == ModelFamily::llama ? detail::llama_from(reader)
                                                        : detail::mixtral_from(reader);
  try {
    result.config.validate();
  } catch (const ConfigError& error) {
    throw ConfigError(dissect::detail::concat(source, ": ", error.what()));
  }
  return result;
}

inline HfConfig read_hf_config(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(dissect::detail::concat(path.string(), ": cannot open for reading"));
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  if (in.bad()) throw Error(dissect::detail::concat(path.string(), ": read failed"));
  return parse_hf_config(dissect::detail::parse_json_strictly(text, path.string()), path.string());
}

}  // namespace dissect
