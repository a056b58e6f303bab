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
// shapes and the key they came from, never a model built from half-matching weights. So is
// metadata that would make llama.cpp run another model than dissect's: RoPE scaling (a
// rope.scaling.type other than "none"; a rope.scaling.factor or the older rope.scale_linear
// other than 1 without a type, which llama.cpp reads as linear scaling; a
// rope.scaling.attn_factor other than 1), an expert_count or expert_used_count above 0 (a
// mixture of experts), and a tokenizer whose token count (tokenizer.ggml.tokens, or
// <arch>.vocab_size) differs from token_embd's rows. Names from the file are printed through
// quote_file_text, so a name holding escape sequences reaches no terminal raw.
#pragma once

#include <limits>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/core/error.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/io/hf_config.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// A tensor a GGUF model must hold: its name and dims (innermost first, as the file stores them).
struct GgufExpectedTensor {
  std::string name;
  std::vector<index_t> dims;
  std::string from;  ///< the keys its dims come from, for messages
};

/// The tensors a GGUF file of `family` with `config` holds, in llama.cpp's order.
/// @throws ConfigError for a mixture of experts.
std::vector<GgufExpectedTensor> gguf_model_tensors(ModelFamily family,
                                                   const TransformerConfig& config);

/// The model of `file`: its family and validated config, after checking every tensor against it.
/// @throws FormatError naming the file and the key or tensor: a missing or mistyped key, an
///         architecture dissect does not build, a missing, misshapen or unexpected tensor;
///         ConfigError naming the file for a config dissect cannot build.
HfConfig read_gguf_config(const GgufFile& file);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// `config` with the biases `family`'s GGUF files hold, as read_gguf_config reads them: a bias
/// beside every GPT-2 linear layer, none in LLaMA's.
/// @throws ConfigError naming `op` for a mixture of experts: llama.cpp stacks a layer's experts
///         into one 3-D tensor each (ffn_gate_exps, …), which dissect neither reads nor writes.
inline TransformerConfig gguf_file_config(std::string_view op, ModelFamily family,
                                          TransformerConfig config) {
  if (config.is_moe()) {
    throw ConfigError(concat(op, ": a mixture of experts (", family_name(family), ", ",
                             config.n_experts, " experts) has no 2-D GGUF tensors per expert"));
  }
  config.bias = family == ModelFamily::gpt2;
  return config;
}

/// One dim of a GGUF tensor and the metadata it comes from.
struct GgufDim {
  index_t size;
  std::string_view from;
};

/// The dims of part `part` of `row`'s tensor (its bias's if `bias`) in a GGUF file of `family`,
/// innermost first: dissect's [out, in] reversed.
inline std::vector<GgufDim> gguf_tensor_dims(ModelFamily family, const TensorNames& row,
                                             std::size_t part, bool bias,
                                             const TransformerConfig& c) {
  const GgufDim d{c.d_model, "embedding_length"}, f{c.d_ff, "feed_forward_length"};
  // GPT-2's architecture has no head_count_kv or key_length: its heads are D wide together.
  const bool head_keys = family == ModelFamily::llama;
  const auto [q_rows, kv_rows, v_rows] = qkv_part_rows(c);
  const GgufDim q = head_keys ? GgufDim{q_rows, "head_count · key_length"} : d;
  const GgufDim kv{kv_rows, "head_count_kv · key_length"};
  const GgufDim qkv{q_rows + kv_rows + v_rows, head_keys ? "head_count · key_length + 2 · "
                                                           "head_count_kv · key_length"
                                                         : "3 · embedding_length"};
  GgufDim out = d, in = d;  // dissect's [out, in]
  switch (row.tensor) {
    case ModelTensor::token_embedding:
    case ModelTensor::head:
      out = {c.vocab, "the vocabulary"};
      break;
    case ModelTensor::position_embedding:
      out = {c.context, "context_length"};
      break;
    case ModelTensor::attention_norm:
    case ModelTensor::ffn_norm:
    case ModelTensor::final_norm:
      return {d};
    case ModelTensor::qkv:
      out = row.parts() == 1 ? qkv : part == 0 ? q : kv;
      break;
    case ModelTensor::attention_output:
      in = q;
      break;
    case ModelTensor::router:
      out = {c.n_experts, "expert_count"};
      break;
    case ModelTensor::ffn_gate:
    case ModelTensor::ffn_up:
      out = f;
      break;
    case ModelTensor::ffn_down:
      in = f;
      break;
  }
  if (bias) return {out};
  return {in, out};
}

}  // namespace detail

inline std::vector<GgufExpectedTensor> gguf_model_tensors(ModelFamily family,
                                                          const TransformerConfig& config) {
  const TransformerConfig c = detail::gguf_file_config("gguf_model_tensors", family, config);
  std::vector<GgufExpectedTensor> tensors;
  for (ParameterNames& parameter : model_parameter_names(tensor_names_of(family), c)) {
    for (std::size_t part = 0; part < parameter.gguf.size(); ++part) {
      GgufExpectedTensor tensor{std::move(parameter.gguf[part]), {}, {}};
      std::string_view last;  // "embedding_length" once for two dims that both come from it
      for (const detail::GgufDim& dim :
           detail::gguf_tensor_dims(family, *parameter.row, part, parameter.bias, c)) {
        tensor.dims.push_back(dim.size);
        if (dim.from != last) tensor.from += concat(last.empty() ? "" : ", ", dim.from);
        last = dim.from;
      }
      tensors.push_back(std::move(tensor));
    }
  }
  return tensors;
}

namespace detail {

inline std::string gguf_dims_text(const std::vector<index_t>& dims) {
  std::string text = "{";
  for (std::size_t i = 0; i < dims.size(); ++i) text += concat(i ? ", " : "", dims[i]);
  return text + "}";
}

/// RoPE scaling in a llama file, read as llama.cpp reads it (llama_model::load_hparams and
/// llama_context): `rope.scaling.type` defaults to "linear"; the factor is
/// `rope.scaling.factor`, else the older `rope.scale_linear`, and 0 means none (freq_scale =
/// 1/factor); type "none" never scales; `rope.scaling.attn_factor` multiplies every rotated
/// value whatever the type. dissect's RoPE is unscaled, so a file that asks for scaling is
/// refused rather than run as another model; a factor of 1 (or 0) and an attn_factor of 1 are
/// no scaling. `rope.scaling.original_context_length` and the yarn_* keys only act under YaRN,
/// whose type is refused here.
template <class Key>
void check_gguf_rope_scaling(const GgufFile& file, const std::string& where, const Key& key) {
  const std::string type_key = key("rope.scaling.type");
  bool none = false;
  if (const GgufValue* scaling = file.find(type_key)) {
    const std::string* type = scaling->as_string();
    if (type == nullptr || *type != "none") {
      throw FormatError(concat(where, "metadata ", quote_file_text(type_key), " is ",
                               scaling->describe(),
                               ": RoPE scaling is not supported (dissect runs RoPE unscaled; only "
                               "\"none\" is read)"));
    }
    none = true;
  }
  if (!none) {
    // llama.cpp reads the new key if it is there and the old one only if it is not.
    std::string factor_key = key("rope.scaling.factor");
    if (file.find(factor_key) == nullptr) factor_key = key("rope.scale_linear");
    if (const GgufValue* factor = file.find(factor_key)) {
      const std::optional<double> value = factor->as_number();
      if (!value) {
        throw FormatError(concat(where, "metadata ", quote_file_text(factor_key), " is ",
                                 gguf_type_name(factor->type()), " ", factor->describe(3),
                                 ", not a number"));
      }
      if (*value != 1.0 && *value != 0.0) {
        throw FormatError(
            concat(where, "metadata ", quote_file_text(factor_key), " is ", factor->describe(),
                   " and ", quote_file_text(type_key),
                   " is absent: llama.cpp reads that as linear RoPE scaling (positions divided by ",
                   factor->describe(),
                   "), which dissect does not run yet; refusing rather than run "
                   "the model unscaled"));
      }
    }
  }
  const std::string attn_key = key("rope.scaling.attn_factor");
  if (const GgufValue* attn = file.find(attn_key)) {
    const std::optional<double> value = attn->as_number();
    if (!value || *value != 1.0) {
      throw FormatError(concat(where, "metadata ", quote_file_text(attn_key), " is ",
                               gguf_type_name(attn->type()), " ", attn->describe(3),
                               ": llama.cpp scales every rotated query and key by it, which "
                               "dissect does not run yet (only 1 is read)"));
    }
  }
}

/// The vocabulary the tokenizer of a file speaks against the rows of its token embedding: llama.cpp
/// creates token_embd (and output) with n_vocab = its vocabulary's token count
/// (`tokenizer.ggml.tokens`, or `<arch>.vocab_size` for a file without a tokenizer) and refuses a
/// file where they differ; a model whose ids the tokenizer cannot decode (or whose tokens it
/// cannot embed) is never loaded.
inline void check_gguf_vocabulary(const GgufFile& file, const std::string& where,
                                  const std::string& vocab_size_key, index_t rows) {
  if (file.find("tokenizer.ggml.tokens") != nullptr) {
    const GgufValue::Array& list = file.require_array("tokenizer.ggml.tokens");
    if (static_cast<std::uint64_t>(list.size()) != static_cast<std::uint64_t>(rows)) {
      throw FormatError(concat(where, "metadata \"tokenizer.ggml.tokens\" holds ", list.size(),
                               " tokens, but tensor \"token_embd.weight\" has ", rows,
                               " rows (the model's vocabulary): llama.cpp refuses such a file, "
                               "and ids past the tokenizer's could not be decoded"));
    }
  }
  if (const GgufValue* size = file.find(vocab_size_key)) {
    const std::optional<std::uint64_t> value = size->as_unsigned();
    if (!value || *value != static_cast<std::uint64_t>(rows)) {
      throw FormatError(concat(where, "metadata ", quote_file_text(vocab_size_key), " is ",
                               gguf_type_name(size->type()), " ", size->describe(3),
                               ", but tensor \"token_embd.weight\" has ", rows,
                               " rows (the model's vocabulary)"));
    }
  }
}

/// A mixture of experts in a file's metadata: llama.cpp builds one whenever
/// `<arch>.expert_count` is above 0 (a router ffn_gate_inp and 3-D ffn_{gate,up,down}_exps
/// tensors per block), and refuses a used count without experts. dissect reads dense GGUF
/// models only: either way the file is not the dense model its FFN tensors would make.
template <class Key>
void check_gguf_no_experts(const GgufFile& file, const std::string& where, const Key& key) {
  for (const std::string_view name : {"expert_count", "expert_used_count"}) {
    const std::string expert_key = key(name);
    const GgufValue* value = file.find(expert_key);
    if (value == nullptr) continue;
    const std::optional<std::uint64_t> count = value->as_unsigned();
    if (count && *count == 0) continue;
    const bool dense =
        file.contains("blk.0.ffn_up.weight") && !file.contains("blk.0.ffn_gate_inp.weight");
    throw FormatError(
        concat(where, "metadata ", quote_file_text(expert_key), " is ",
               gguf_type_name(value->type()), " ", value->describe(3),
               ": llama.cpp reads a mixture of experts (ffn_gate_inp and "
               "ffn_*_exps tensors per block), ",
               dense ? "but the file's FFN tensors are dense (blk.0.ffn_up.weight), so llama.cpp "
                       "refuses it; dissect will not run it as a dense model"
                     : "which dissect does not read from GGUF yet"));
  }
}

}  // namespace detail

inline HfConfig read_gguf_config(const GgufFile& file) {
  const std::string where = concat("GgufFile: ", file.path().string(), ": ");
  const std::string& architecture = file.require_string("general.architecture");
  if (architecture != "llama" && architecture != "gpt2") {
    throw FormatError(concat(where, "general.architecture ", quote_file_text(architecture),
                             " is not one dissect builds (llama, gpt2)"));
  }
  const ModelFamily family = architecture == "llama" ? ModelFamily::llama : ModelFamily::gpt2;
  const auto key = [&](std::string_view name) { return concat(architecture, ".", name); };
  const auto count = [&](std::string_view name) -> index_t {
    const std::uint64_t value = file.require_unsigned(key(name));
    if (value == 0 ||
        value > static_cast<std::uint64_t>(std::numeric_limits<std::int32_t>::max())) {
      throw FormatError(concat(where, "metadata ", quote_file_text(key(name)), " is ", value,
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
  const FamilyTensorNames& names = tensor_names_of(family);
  const auto weight_of = [&](ModelTensor tensor) {
    return concat(gguf_module_name(*names.find(tensor)), ".", module_names::weight);
  };
  const std::string token_embd = weight_of(ModelTensor::token_embedding);
  if (!file.contains(token_embd) || file.info(token_embd).dims.size() != 2) {
    throw FormatError(
        concat(where, "has no 2-D tensor \"", token_embd, "\" to size the vocabulary"));
  }
  config.vocab = file.info(token_embd).dims[1];
  config.tied_embeddings = !file.contains(weight_of(ModelTensor::head));
  detail::check_gguf_vocabulary(file, where, key("vocab_size"), config.vocab);
  detail::check_gguf_no_experts(file, where, key);
  if (family == ModelFamily::llama) {
    config.n_kv_heads = optional_count("attention.head_count_kv");
    config.head_dim = optional_count("attention.key_length");
    if (const auto value_length = optional_count("attention.value_length");
        value_length && *value_length != config.head_size()) {
      throw FormatError(concat(where, "metadata ", quote_file_text(key("attention.value_length")),
                               " ", *value_length, " differs from the key length ",
                               config.head_size(), ", which dissect's attention needs"));
    }
    config.positions = Positions::rotary;
    config.norm = Norm::rms_norm;
    config.ffn = Ffn::gated;
    config.bias = false;
    config.norm_eps = number("attention.layer_norm_rms_epsilon", 1e-5);
    config.rope_theta = number("rope.freq_base", 10000.0);
    if (const auto rotary = optional_count("rope.dimension_count");
        rotary && *rotary != config.head_size()) {
      throw FormatError(concat(where, "metadata ", quote_file_text(key("rope.dimension_count")),
                               " ", *rotary, " rotates part of each head (d_k = ",
                               config.head_size(), "); dissect's RoPE rotates all of it"));
    }
    detail::check_gguf_rope_scaling(file, where, key);
  } else {
    config.norm_eps = number("attention.layer_norm_epsilon", 1e-5);
  }
  try {
    config.validate();
  } catch (const ConfigError& error) {
    throw ConfigError(concat(where, error.what()));
  }

  // Every block holds tensors: a block_count beyond the file's tensor count is refused before
  // the list of the tensors it implies is made (2^31 blocks would be 2·10^10 names).
  if (static_cast<std::uint64_t>(config.n_layers) > file.tensors().size()) {
    TransformerConfig one_block = config, no_block = config;
    one_block.n_layers = 1;
    no_block.n_layers = 0;
    const std::size_t per_block =
        gguf_model_tensors(family, one_block).size() - gguf_model_tensors(family, no_block).size();
    throw FormatError(concat(where, "metadata ", quote_file_text(key("block_count")), " is ",
                             config.n_layers, ", but the file holds ", file.tensors().size(),
                             " tensors (", architecture, " blocks hold ", per_block, " each)"));
  }
  const std::vector<GgufExpectedTensor> expected = gguf_model_tensors(family, config);
  std::map<std::string_view, const GgufExpectedTensor*> by_name;
  for (const GgufExpectedTensor& tensor : expected) {
    by_name.emplace(tensor.name, &tensor);
    if (!file.contains(tensor.name)) {
      throw FormatError(concat(where, "has no tensor ", quote_file_text(tensor.name), " (",
                               architecture, ", block_count ", config.n_layers, ")"));
    }
    const GgufTensorInfo& info = file.info(tensor.name);
    if (info.dims != tensor.dims) {
      throw FormatError(concat(where, "tensor ", quote_file_text(tensor.name), " has dims ",
                               detail::gguf_dims_text(info.dims), " (innermost first); the ",
                               "metadata (", tensor.from, ") gives ",
                               detail::gguf_dims_text(tensor.dims)));
    }
  }
  for (const GgufTensorInfo& info : file.tensors()) {
    if (by_name.count(info.name) == 0) {
      throw FormatError(concat(where, "tensor ", quote_file_text(info.name), " is not part of a ",
                               architecture, " model of ", config.n_layers,
                               " blocks as dissect builds it",
                               info.name == "rope_freqs.weight" ? " (RoPE scaling)" : ""));
    }
  }
  return {family, config};
}

}  // namespace dissect
