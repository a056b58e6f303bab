// dissect/accounting/tensor_names.hpp — the one table of a decoder's tensor names: for every
// family, what dissect calls each tensor (what for_each_parameter visits), what Hugging Face's
// checkpoints call it and what llama.cpp's GGUF files call it (llama.cpp keeps its own as
// LLM_TENSOR_NAMES in src/llama-arch.cpp).
//
// Each name is written here once. The blocks name their members with module_names; the decoder
// styles (models/styles.hpp) take their members' names from a family's row; the Hugging Face and
// GGUF readers and writers (io/hf_names.hpp, io/hf_writer.hpp, io/gguf_weights.hpp,
// io/gguf_model.hpp, io/gguf_model_writer.hpp) map through it; tensor parallelism
// (parallel/parallel_decoder_layer.hpp) reads a layer's tensors by it; the accounting
// (model_shape.hpp, forward_chain.hpp, count.hpp) names its matrices from ModelTensorInfo. A
// family is one FamilyTensorNames: adding one is adding its rows, not another code path.
//
// A family's rows are in for_each_parameter's order (the model's members, then a layer's, an
// expert's inside them), which is also llama.cpp's order of a GGUF file's tensors, and the order
// the Hugging Face renames are tried in: the first rename that matches a name applies, so
// Mixtral's router ("block_sparse_moe.gate") comes before its experts' gate ("w1").
#pragma once

#include <array>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// The names dissect's blocks give their members, in every family: QKVProjection's and
/// AttentionOutput's Linear, the FFNs' Linear layers, MixtureOfExperts' router and experts; and
/// the parameters a module holds.
namespace module_names {
inline constexpr const char* qkv = "qkv";
inline constexpr const char* proj = "proj";
inline constexpr const char* gate = "gate";
inline constexpr const char* up = "up";
inline constexpr const char* down = "down";
inline constexpr const char* router = "router";
inline constexpr const char* experts = "experts";
inline constexpr const char* weight = "weight";
inline constexpr const char* bias = "bias";
}  // namespace module_names

/// What a tensor of a decoder is, whatever its family calls it (llama.cpp's llm_tensor).
enum class ModelTensor {
  token_embedding,
  position_embedding,
  attention_norm,
  qkv,  ///< the queries, keys and values stacked by rows, in that order
  attention_output,
  ffn_norm,
  router,  ///< a mixture of experts' gate: [E, D]
  ffn_gate,
  ffn_up,
  ffn_down,
  final_norm,
  head
};

/// Whether a tensor's module holds a bias beside its weight.
enum class TensorBias {
  none,    ///< never: the embeddings, the router, the head
  linear,  ///< when TransformerConfig::bias
  norm     ///< a LayerNorm's; an RMSNorm has none
};

/// What is true of a tensor in every family.
struct ModelTensorInfo {
  ModelTensor tensor;
  std::string_view matrix;  ///< weight_matrices' name ("attn.qkv"); "" for a norm (a vector)
  TensorBias bias;
};

/// Every ModelTensor's info, in the enum's order.
inline constexpr std::array<ModelTensorInfo, 12> model_tensor_infos{{
    {ModelTensor::token_embedding, "embed.tokens", TensorBias::none},
    {ModelTensor::position_embedding, "embed.positions", TensorBias::none},
    {ModelTensor::attention_norm, "", TensorBias::norm},
    {ModelTensor::qkv, "attn.qkv", TensorBias::linear},
    {ModelTensor::attention_output, "attn.out", TensorBias::linear},
    {ModelTensor::ffn_norm, "", TensorBias::norm},
    {ModelTensor::router, "moe.router", TensorBias::none},
    {ModelTensor::ffn_gate, "mlp.gate", TensorBias::linear},
    {ModelTensor::ffn_up, "mlp.up", TensorBias::linear},
    {ModelTensor::ffn_down, "mlp.down", TensorBias::linear},
    {ModelTensor::final_norm, "", TensorBias::norm},
    {ModelTensor::head, "lm_head", TensorBias::none},
}};

/// `tensor`'s info.
constexpr const ModelTensorInfo& model_tensor_info(ModelTensor tensor) {
  return model_tensor_infos[static_cast<std::size_t>(tensor)];
}

/// weight_matrices' name of `tensor` ("attn.qkv"); "" for a norm.
constexpr std::string_view matrix_name(ModelTensor tensor) {
  return model_tensor_info(tensor).matrix;
}

/// The tensor weight_matrices calls `matrix`.
/// @throws Error naming `op` and `matrix` if no tensor is called so.
ModelTensor tensor_of_matrix(std::string_view op, std::string_view matrix);

/// What a tensor's module sits in, which its names are relative to.
enum class TensorParent {
  model,      ///< the model: "wte"
  layer,      ///< a layer: "h.N.ln_1"
  attention,  ///< a layer's attention: "h.N.attn.qkv"
  ffn,        ///< a layer's FFN: "h.N.mlp.up"
  expert      ///< an expert of a layer's mixture: "layers.N.block_sparse_moe.experts.M.gate"
};

/// One tensor of a family under its three names. Hugging Face's containers (the layers, the
/// attention, the FFN, the experts) are dissect's: dissect names its modules after Hugging Face's.
struct TensorNames {
  ModelTensor tensor;
  TensorParent parent;
  const char* dissect;  ///< its module in `parent`, as for_each_parameter names it
  /// Hugging Face's module in `parent`; three for the queries, keys and values that stack by rows
  /// into dissect's one, in that order.
  std::array<std::string_view, 3> hf;
  /// llama.cpp's tensor, under "blk.N." in a layer (an expert's: the layer's one tensor that
  /// stacks every expert's); three as for hf.
  std::array<std::string_view, 3> gguf;
  /// A Conv1D in Hugging Face's model (GPT-2's): its weight is stored [in, out], dissect's is
  /// [out, in].
  bool hf_transposed = false;

  /// How many tensors of Hugging Face's (or llama.cpp's) stack into this one: 1 or 3.
  constexpr std::size_t parts() const { return hf[1].empty() ? 1 : 3; }
};

/// A family's names: its containers and its tensors.
struct FamilyTensorNames {
  std::string_view family;  ///< config.json's model_type: "gpt2", "llama", "mistral", "mixtral"
  const char* layers;       ///< the list of layers: "h", "layers"
  const char* attention;    ///< a layer's attention: "attn", "self_attn"
  const char* ffn;          ///< a layer's FFN: "mlp", "block_sparse_moe"
  /// The base model's name in Hugging Face's *ForCausalLM ("transformer.", "model."), before
  /// every tensor but the head, which sits beside it.
  std::string_view hf_prefix;
  /// Whether dissect writes hf_prefix: GPT-2's official files (saved from GPT2Model) have none.
  bool hf_prefix_written;
  /// The endings of Hugging Face's buffers, which stand for no parameter (GPT-2's attention
  /// masks, LLaMA's rotary frequencies).
  std::span<const std::string_view> hf_buffers;
  /// Whether llama.cpp's converter reorders each head's query and key rows from Hugging Face's
  /// halves (rotate_half pairs i and i + d_k/2) to its RoPE's interleaved pairs (2i, 2i + 1).
  bool gguf_rotary_permuted;
  std::span<const TensorNames> tensors;  ///< in for_each_parameter's order

  /// The row of `tensor`, or nullptr if the family has none.
  constexpr const TensorNames* find(ModelTensor tensor) const {
    for (const TensorNames& row : tensors) {
      if (row.tensor == tensor) return &row;
    }
    return nullptr;
  }
  /// dissect's module name of `tensor` in its parent ("wte", "ln_1"); "" if the family has none.
  constexpr const char* module(ModelTensor tensor) const {
    const TensorNames* row = find(tensor);
    return row ? row->dissect : "";
  }
};

/// GGUF's name of the list of layers: "blk.N.attn_q.weight".
inline constexpr std::string_view gguf_layers = "blk";

// The families. Mistral's names are LLaMA's (MistralForCausalLM is LlamaForCausalLM's layers with
// a sliding window; llama.cpp writes it as its llama architecture).
namespace detail::tensor_rows {

using T = ModelTensor;
using P = TensorParent;
namespace m = module_names;

inline constexpr std::array<std::string_view, 2> gpt2_hf_buffers{".attn.bias", ".attn.masked_bias"};
inline constexpr std::array<std::string_view, 1> llama_hf_buffers{"rotary_emb.inv_freq"};

inline constexpr std::array<TensorNames, 10> gpt2{{
    {T::token_embedding, P::model, "wte", {"wte"}, {"token_embd"}},
    {T::position_embedding, P::model, "wpe", {"wpe"}, {"position_embd"}},
    {T::attention_norm, P::layer, "ln_1", {"ln_1"}, {"attn_norm"}},
    {T::qkv, P::attention, m::qkv, {"c_attn"}, {"attn_qkv"}, true},
    {T::attention_output, P::attention, m::proj, {"c_proj"}, {"attn_output"}, true},
    {T::ffn_norm, P::layer, "ln_2", {"ln_2"}, {"ffn_norm"}},
    {T::ffn_up, P::ffn, m::up, {"c_fc"}, {"ffn_up"}, true},
    {T::ffn_down, P::ffn, m::down, {"c_proj"}, {"ffn_down"}, true},
    {T::final_norm, P::model, "ln_f", {"ln_f"}, {"output_norm"}},
    {T::head, P::model, "lm_head", {"lm_head"}, {"output"}},
}};

inline constexpr std::array<TensorNames, 10> llama{{
    {T::token_embedding, P::model, "embed_tokens", {"embed_tokens"}, {"token_embd"}},
    {T::attention_norm, P::layer, "input_layernorm", {"input_layernorm"}, {"attn_norm"}},
    {T::qkv, P::attention, m::qkv, {"q_proj", "k_proj", "v_proj"}, {"attn_q", "attn_k", "attn_v"}},
    {T::attention_output, P::attention, m::proj, {"o_proj"}, {"attn_output"}},
    {T::ffn_norm, P::layer, "post_attention_layernorm", {"post_attention_layernorm"}, {"ffn_norm"}},
    {T::ffn_gate, P::ffn, m::gate, {"gate_proj"}, {"ffn_gate"}},
    {T::ffn_up, P::ffn, m::up, {"up_proj"}, {"ffn_up"}},
    {T::ffn_down, P::ffn, m::down, {"down_proj"}, {"ffn_down"}},
    {T::final_norm, P::model, "norm", {"norm"}, {"output_norm"}},
    {T::head, P::model, "lm_head", {"lm_head"}, {"output"}},
}};

/// LLaMA's row of `tensor`.
constexpr TensorNames llama_row(ModelTensor tensor) {
  for (const TensorNames& row : llama) {
    if (row.tensor == tensor) return row;
  }
  // Reached only for a tensor LLaMA lacks: no constant expression, so the table does not compile.
  throw "LLaMA has no such tensor";
}

// LLaMA's layer with a sparse mixture of SwiGLU experts for its FFN: Hugging Face's router is
// block_sparse_moe.gate and each expert's w1, w3, w2 are its gate, up and down; llama.cpp stacks
// a layer's experts into one 3-D tensor each (ffn_gate_exps, …) beside the router ffn_gate_inp.
inline constexpr std::array<TensorNames, 11> mixtral{{
    llama_row(T::token_embedding),
    llama_row(T::attention_norm),
    llama_row(T::qkv),
    llama_row(T::attention_output),
    llama_row(T::ffn_norm),
    {T::router, P::ffn, m::router, {"gate"}, {"ffn_gate_inp"}},
    {T::ffn_gate, P::expert, m::gate, {"w1"}, {"ffn_gate_exps"}},
    {T::ffn_up, P::expert, m::up, {"w3"}, {"ffn_up_exps"}},
    {T::ffn_down, P::expert, m::down, {"w2"}, {"ffn_down_exps"}},
    llama_row(T::final_norm),
    llama_row(T::head),
}};

}  // namespace detail::tensor_rows

inline constexpr FamilyTensorNames gpt2_tensor_names{
    .family = "gpt2",
    .layers = "h",
    .attention = "attn",
    .ffn = "mlp",
    .hf_prefix = "transformer.",
    .hf_prefix_written = false,
    .hf_buffers = detail::tensor_rows::gpt2_hf_buffers,
    .gguf_rotary_permuted = false,
    .tensors = detail::tensor_rows::gpt2};

inline constexpr FamilyTensorNames llama_tensor_names{
    .family = "llama",
    .layers = "layers",
    .attention = "self_attn",
    .ffn = "mlp",
    .hf_prefix = "model.",
    .hf_prefix_written = true,
    .hf_buffers = detail::tensor_rows::llama_hf_buffers,
    .gguf_rotary_permuted = true,
    .tensors = detail::tensor_rows::llama};

inline constexpr FamilyTensorNames mistral_tensor_names = [] {
  FamilyTensorNames names = llama_tensor_names;
  names.family = "mistral";
  return names;
}();

inline constexpr FamilyTensorNames mixtral_tensor_names = [] {
  FamilyTensorNames names = llama_tensor_names;
  names.family = "mixtral";
  names.ffn = "block_sparse_moe";
  names.tensors = detail::tensor_rows::mixtral;
  return names;
}();

/// Every family's names.
inline constexpr std::array<const FamilyTensorNames*, 4> tensor_name_families{
    &gpt2_tensor_names, &llama_tensor_names, &mistral_tensor_names, &mixtral_tensor_names};

/// The names of the family config.json calls `family` ("gpt2", "llama", "mistral", "mixtral").
/// @throws ConfigError naming `family` and the known ones otherwise.
const FamilyTensorNames& tensor_names_of(std::string_view family);

/// dissect's module path of `row` in a `names` model, in layer `layer` and expert `expert` where
/// it has them: "wte", "h.1.attn.qkv", "layers.0.block_sparse_moe.experts.2.gate".
std::string module_path(const FamilyTensorNames& names, const TensorNames& row, index_t layer = 0,
                        index_t expert = 0);

/// `row`'s module path below its layer ("attn.qkv", "ln_1"); `row` must not be the model's.
std::string module_path_in_layer(const FamilyTensorNames& names, const TensorNames& row,
                                 index_t expert = 0);

/// llama.cpp's name of part `part` of `row`'s tensor in layer `layer`, without ".weight":
/// "token_embd", "blk.1.attn_k".
std::string gguf_module_name(const TensorNames& row, index_t layer = 0, std::size_t part = 0);

/// The rows of the queries', keys' and values' parts of the stacked qkv: H·d_k, H_kv·d_k, H_kv·d_k.
std::array<index_t, 3> qkv_part_rows(const TransformerConfig& config);

/// One parameter of a model under its three names.
struct ParameterNames {
  const TensorNames* row;
  index_t layer = -1;   ///< −1 outside the layers
  index_t expert = -1;  ///< −1 outside a mixture's experts (also the slice of llama.cpp's
                        ///< stacked expert tensor)
  bool bias = false;    ///< the module's bias, not its weight
  std::string dissect;  ///< the state_dict name: "layers.0.self_attn.qkv.weight"
  /// Hugging Face's, as dissect writes them: "model.layers.0.self_attn.q_proj.weight", k, v.
  std::vector<std::string> hf;
  std::vector<std::string> gguf;  ///< llama.cpp's: "blk.0.attn_q.weight", k, v
};

/// Every parameter of a `names` model of `config`, in for_each_parameter's order: each row's
/// weight, then its bias where its TensorBias and the config give one; a layer's rows in each of
/// the L layers, an expert's in each of the E experts; the position table only for learned
/// positions, the head only when not tied.
std::vector<ParameterNames> model_parameter_names(const FamilyTensorNames& names,
                                                  const TransformerConfig& config);

// ---- implementation -----------------------------------------------------------------------------

static_assert(
    [] {
      for (std::size_t i = 0; i < model_tensor_infos.size(); ++i) {
        if (static_cast<std::size_t>(model_tensor_infos[i].tensor) != i) return false;
      }
      return true;
    }(),
    "model_tensor_infos must list the tensors in ModelTensor's order");

// io/hf_names.hpp renames a tensor where it stands between dots in its parent, which a model's
// own tensor (at the start of a name) never does: those keep Hugging Face's names, as dissect's
// styles do.
static_assert(
    [] {
      for (const FamilyTensorNames* names : tensor_name_families) {
        for (const TensorNames& row : names->tensors) {
          if (row.parent == TensorParent::model && (row.parts() != 1 || row.hf[0] != row.dissect))
            return false;
        }
      }
      return true;
    }(),
    "a model's own tensors must keep Hugging Face's names");

inline ModelTensor tensor_of_matrix(std::string_view op, std::string_view matrix) {
  for (const ModelTensorInfo& info : model_tensor_infos) {
    if (!info.matrix.empty() && info.matrix == matrix) return info.tensor;
  }
  throw Error(detail::concat(op, ": \"", matrix, "\" is not a matrix model_shape.hpp lists"));
}

inline const FamilyTensorNames& tensor_names_of(std::string_view family) {
  std::string known;
  for (const FamilyTensorNames* names : tensor_name_families) {
    if (names->family == family) return *names;
    known += detail::concat(known.empty() ? "" : ", ", names->family);
  }
  throw ConfigError(
      detail::concat("tensor_names_of: no family \"", family, "\" (known: ", known, ")"));
}

namespace detail {

/// `leaf` in `parent` below its layer: the containers of `names`, expert `expert`'s for an expert.
inline std::string path_in_layer(const FamilyTensorNames& names, TensorParent parent,
                                 std::string_view leaf, index_t expert) {
  switch (parent) {
    case TensorParent::attention:
      return concat(names.attention, ".", leaf);
    case TensorParent::ffn:
      return concat(names.ffn, ".", leaf);
    case TensorParent::expert:
      return concat(names.ffn, ".", module_names::experts, ".", expert, ".", leaf);
    case TensorParent::model:
    case TensorParent::layer:
      break;
  }
  return std::string(leaf);
}

/// `leaf` in `row`'s parent, in layer `layer`.
inline std::string path_of(const FamilyTensorNames& names, const TensorNames& row,
                           std::string_view leaf, index_t layer, index_t expert) {
  if (row.parent == TensorParent::model) return std::string(leaf);
  return concat(names.layers, ".", layer, ".", path_in_layer(names, row.parent, leaf, expert));
}

}  // namespace detail

inline std::string module_path(const FamilyTensorNames& names, const TensorNames& row,
                               index_t layer, index_t expert) {
  return detail::path_of(names, row, row.dissect, layer, expert);
}

inline std::string module_path_in_layer(const FamilyTensorNames& names, const TensorNames& row,
                                        index_t expert) {
  return detail::path_in_layer(names, row.parent, row.dissect, expert);
}

inline std::string gguf_module_name(const TensorNames& row, index_t layer, std::size_t part) {
  if (row.parent == TensorParent::model) return std::string(row.gguf[part]);
  return detail::concat(gguf_layers, ".", layer, ".", row.gguf[part]);
}

inline std::array<index_t, 3> qkv_part_rows(const TransformerConfig& config) {
  const index_t q = config.n_heads * config.head_size(),
                kv = config.kv_heads() * config.head_size();
  return {q, kv, kv};
}

inline std::vector<ParameterNames> model_parameter_names(const FamilyTensorNames& names,
                                                         const TransformerConfig& config) {
  using detail::concat;
  std::vector<ParameterNames> out;
  const auto add = [&](const TensorNames& row, index_t layer, index_t expert) {
    if (row.tensor == ModelTensor::head && config.tied_embeddings) return;
    if (row.tensor == ModelTensor::position_embedding && config.positions != Positions::learned)
      return;
    const TensorBias bias_rule = model_tensor_info(row.tensor).bias;
    const bool has_bias = bias_rule == TensorBias::linear ? config.bias
                          : bias_rule == TensorBias::norm ? config.norm == Norm::layer_norm
                                                          : false;
    for (const bool bias : {false, true}) {
      if (bias && !has_bias) continue;
      const std::string_view parameter = bias ? module_names::bias : module_names::weight;
      ParameterNames entry{&row, layer, expert, bias, {}, {}, {}};
      entry.dissect = concat(module_path(names, row, layer, expert), ".", parameter);
      // The head sits beside Hugging Face's base model, every other tensor in it.
      const std::string_view prefix = names.hf_prefix_written && row.tensor != ModelTensor::head
                                          ? names.hf_prefix
                                          : std::string_view{};
      for (std::size_t part = 0; part < row.parts(); ++part) {
        entry.hf.push_back(concat(prefix, detail::path_of(names, row, row.hf[part], layer, expert),
                                  ".", parameter));
        entry.gguf.push_back(concat(gguf_module_name(row, layer, part), ".", parameter));
      }
      out.push_back(std::move(entry));
    }
  };
  // Runs of rows that share a scope: a model's row alone; a layer's rows in each layer, and
  // inside them a run of an expert's rows in each expert.
  const std::span<const TensorNames> rows = names.tensors;
  const auto run_end = [&](std::size_t from, auto inside) {
    while (from < rows.size() && inside(rows[from].parent)) ++from;
    return from;
  };
  for (std::size_t i = 0; i < rows.size();) {
    if (rows[i].parent == TensorParent::model) {
      add(rows[i++], -1, -1);
      continue;
    }
    const std::size_t layer_end =
        run_end(i, [](TensorParent p) { return p != TensorParent::model; });
    for (index_t layer = 0; layer < config.n_layers; ++layer) {
      for (std::size_t j = i; j < layer_end;) {
        if (rows[j].parent != TensorParent::expert) {
          add(rows[j++], layer, -1);
          continue;
        }
        const std::size_t expert_end =
            run_end(j, [](TensorParent p) { return p == TensorParent::expert; });
        for (index_t expert = 0; expert < config.n_experts; ++expert) {
          for (std::size_t k = j; k < expert_end; ++k) add(rows[k], layer, expert);
        }
        j = expert_end;
      }
    }
    i = layer_end;
  }
  return out;
}

}  // namespace dissect
