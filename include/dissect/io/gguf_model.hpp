// dissect/io/gguf_model.hpp — the model a GGUF file describes: its architecture's metadata read
// into a TransformerConfig, and every tensor checked against the shape that config gives it.
//
// Two architectures, under llama.cpp's names:
//   llama  keys llama.context_length, embedding_length, block_count, feed_forward_length,
//          attention.head_count, attention.head_count_kv (default: head_count),
//          attention.key_length (default: D / H), rope.freq_base (default 10000),
//          rope.dimension_count (must be d_k: partial rotary is not dissect's RoPE),
//          attention.layer_norm_rms_epsilon (default 1e-5, llama.cpp's);
//          tensors token_embd, blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, ffn_norm,
//          ffn_gate, ffn_up, ffn_down}, output_norm, and output (absent: tied to token_embd).
//   gpt2   keys gpt2.context_length, embedding_length, block_count, feed_forward_length,
//          attention.head_count, attention.layer_norm_epsilon (default 1e-5);
//          tensors token_embd, position_embd, blk.N.{attn_norm, attn_qkv, attn_output, ffn_norm,
//          ffn_up, ffn_down} with .bias beside each weight, output_norm(.bias), and output.
// The vocabulary size is token_embd's second dim. Every tensor must be there with its dims, and
// no other may be (rope_freqs, for one, means RoPE scaling, which dissect does not run): a file
// whose metadata contradicts its tensors is a FormatError naming the file, the tensor, both
// shapes and the key they came from, never a model built from half-matching weights.
#pragma once

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/config.hpp"
#include "dissect/error.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/io/hf_config.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// A tensor a GGUF model must hold: its name and dims (innermost first, as the file stores them).
struct GgufExpectedTensor {
  std::string name;
  std::vector<index_t> dims;
  std::string_view from;  ///< the keys its dims come from, for messages
};

/// The tensors a GGUF file of `family` with `config` holds, in llama.cpp's order.
std::vector<GgufExpectedTensor> gguf_model_tensors(ModelFamily family,
                                                   const TransformerConfig& config);

/// The model of `file`: its family and validated config, after checking every tensor against it.
/// @throws FormatError naming the file and the key or tensor: a missing or mistyped key, an
///         architecture dissect does not build, a missing, misshapen or unexpected tensor;
///         ConfigError naming the file for a config dissect cannot build.
HfConfig read_gguf_config(const GgufFile& file);

// ---- implementation -----------------------------------------------------------------------------

inline std::vector<GgufExpectedTensor> gguf_model_tensors(ModelFamily family,
                                                          const TransformerConfig& config) {
  const index_t d = config.d_model, v = config.vocab, f = config.d_ff;
  const index_t q = config.n_heads * config.head_size(),
                kv = config.kv_heads() * config.head_size();
  std::vector<GgufExpectedTensor> tensors;
  const auto add = [&](std::string name, std::vector<index_t> dims, std::string_view from) {
    tensors.push_back({std::move(name), std::move(dims), from});
  };
  constexpr std::string_view width = "embedding_length";
  add("token_embd.weight", {d, v}, "embedding_length, the vocabulary");
  if (family == ModelFamily::gpt2) {
    add("position_embd.weight", {d, config.context}, "embedding_length, context_length");
  }
  for (index_t layer = 0; layer < config.n_layers; ++layer) {
    const std::string blk = concat("blk.", layer, ".");
    if (family == ModelFamily::llama) {
      add(blk + "attn_norm.weight", {d}, width);
      add(blk + "attn_q.weight", {d, q}, "embedding_length, head_count · key_length");
      add(blk + "attn_k.weight", {d, kv}, "embedding_length, head_count_kv · key_length");
      add(blk + "attn_v.weight", {d, kv}, "embedding_length, head_count_kv · key_length");
      add(blk + "attn_output.weight", {q, d}, "head_count · key_length, embedding_length");
      add(blk + "ffn_norm.weight", {d}, width);
      add(blk + "ffn_gate.weight", {d, f}, "embedding_length, feed_forward_length");
      add(blk + "ffn_up.weight", {d, f}, "embedding_length, feed_forward_length");
      add(blk + "ffn_down.weight", {f, d}, "feed_forward_length, embedding_length");
    } else {
      add(blk + "attn_norm.weight", {d}, width);
      add(blk + "attn_norm.bias", {d}, width);
      add(blk + "attn_qkv.weight", {d, 3 * d}, "embedding_length, 3 · embedding_length");
      add(blk + "attn_qkv.bias", {3 * d}, "3 · embedding_length");
      add(blk + "attn_output.weight", {d, d}, width);
      add(blk + "attn_output.bias", {d}, width);
      add(blk + "ffn_norm.weight", {d}, width);
      add(blk + "ffn_norm.bias", {d}, width);
      add(blk + "ffn_up.weight", {d, f}, "embedding_length, feed_forward_length");
      add(blk + "ffn_up.bias", {f}, "feed_forward_length");
      add(blk + "ffn_down.weight", {f, d}, "feed_forward_length, embedding_length");
      add(blk + "ffn_down.bias", {d}, width);
    }
  }
  add("output_norm.weight", {d}, width);
  if (family == ModelFamily::gpt2) add("output_norm.bias", {d}, width);
  if (!config.tied_embeddings) add("output.weight", {d, v}, "embedding_length, the vocabulary");
  return tensors;
}

namespace detail {

inline std::string gguf_dims_text(const std::vector<index_t>& dims) {
  std::string text = "{";
  for (std::size_t i = 0; i < dims.size(); ++i) text += concat(i ? ", " : "", dims[i]);
  return text + "}";
}

}  // namespace detail

inline HfConfig read_gguf_config(const GgufFile& file) {
  const std::string where = concat("GgufFile: ", file.path().string(), ": ");
  const std::string& architecture = file.require_string("general.architecture");
  if (architecture != "llama" && architecture != "gpt2") {
    throw FormatError(concat(where, "general.architecture \"", architecture,
                             "\" is not one dissect builds (llama, gpt2)"));
  }
  const ModelFamily family = architecture == "llama" ? ModelFamily::llama : ModelFamily::gpt2;
  const auto key = [&](std::string_view name) { return concat(architecture, ".", name); };
  const auto count = [&](std::string_view name) -> index_t {
    const std::uint64_t value = file.require_unsigned(key(name));
    if (value == 0 ||
        value > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
      throw FormatError(concat(where, "metadata \"", key(name), "\" is ", value,
                               ", not a positive size below 2^31"));
    }
    return static_cast<index_t>(value);
  };
  const auto optional_count = [&](std::string_view name) -> std::optional<index_t> {
    if (file.find(key(name)) == nullptr) return std::nullopt;
    return count(name);
  };
  const auto number = [&](std::string_view name, double fallback) {
    return file.find(key(name)) ? file.require_number(key(name)) : fallback;
  };

  TransformerConfig config;  // GPT-2's style; LLaMA's is set below
  config.d_model = count("embedding_length");
  config.n_layers = count("block_count");
  config.n_heads = count("attention.head_count");
  config.d_ff = count("feed_forward_length");
  config.context = count("context_length");
  if (!file.contains("token_embd.weight") || file.info("token_embd.weight").dims.size() != 2) {
    throw FormatError(
        concat(where, "has no 2-D tensor \"token_embd.weight\" to size the vocabulary"));
  }
  config.vocab = file.info("token_embd.weight").dims[1];
  config.tied_embeddings = !file.contains("output.weight");
  if (family == ModelFamily::llama) {
    config.n_kv_heads = optional_count("attention.head_count_kv");
    config.head_dim = optional_count("attention.key_length");
    if (const auto value_length = optional_count("attention.value_length");
        value_length && *value_length != config.head_size()) {
      throw FormatError(concat(where, "metadata \"", key("attention.value_length"), "\" ",
                               *value_length, " differs from the key length ", config.head_size(),
                               ", which dissect's attention needs"));
    }
    config.positions = Positions::rotary;
    config.norm = Norm::rms_norm;
    config.ffn = Ffn::gated;
    config.bias = false;
    config.norm_eps = number("attention.layer_norm_rms_epsilon", 1e-5);
    config.rope_theta = number("rope.freq_base", 10000.0);
    if (const auto rotary = optional_count("rope.dimension_count");
        rotary && *rotary != config.head_size()) {
      throw FormatError(concat(where, "metadata \"", key("rope.dimension_count"), "\" ", *rotary,
                               " rotates part of each head (d_k = ", config.head_size(),
                               "); dissect's RoPE rotates all of it"));
    }
    if (const GgufValue* scaling = file.find(key("rope.scaling.type"))) {
      const std::string* type = scaling->as_string();
      if (type == nullptr || *type != "none") {
        throw FormatError(concat(where, "metadata \"", key("rope.scaling.type"), "\" is ",
                                 scaling->describe(), ": RoPE scaling is not supported"));
      }
    }
  } else {
    config.norm_eps = number("attention.layer_norm_epsilon", 1e-5);
  }
  try {
    config.validate();
  } catch (const ConfigError& error) {
    throw ConfigError(concat(where, error.what()));
  }

  const std::vector<GgufExpectedTensor> expected = gguf_model_tensors(family, config);
  std::map<std::string_view, const GgufExpectedTensor*> by_name;
  for (const GgufExpectedTensor& tensor : expected) {
    by_name.emplace(tensor.name, &tensor);
    if (!file.contains(tensor.name)) {
      throw FormatError(concat(where, "has no tensor \"", tensor.name, "\" (", architecture,
                               ", block_count ", config.n_layers, ")"));
    }
    const GgufTensorInfo& info = file.info(tensor.name);
    if (info.dims != tensor.dims) {
      throw FormatError(concat(where, "tensor \"", tensor.name, "\" has dims ",
                               detail::gguf_dims_text(info.dims), " (innermost first); the ",
                               "metadata (", tensor.from, ") gives ",
                               detail::gguf_dims_text(tensor.dims)));
    }
  }
  for (const GgufTensorInfo& info : file.tensors()) {
    if (by_name.count(info.name) == 0) {
      throw FormatError(concat(where, "tensor \"", info.name, "\" is not part of a ", architecture,
                               " model of ", config.n_layers, " blocks as dissect builds it",
                               info.name == "rope_freqs.weight" ? " (RoPE scaling)" : ""));
    }
  }
  return {family, config};
}

}  // namespace dissect
