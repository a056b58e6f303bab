// dissect/io/checkpoint_fit.hpp — does a checkpoint's config describe the weights beside it?
//
// A config is read first and a model of its sizes allocated before a single weight is loaded, so
// a config that claims more than the file holds (a vocabulary of 10¹², a context of 10⁷, a
// million layers) would allocate gigabytes, or fail with std::bad_alloc, before load_state_dict
// could say "size mismatch". check_checkpoint_fits compares the config with the tensors' shapes
// in the file's header first: each weight matrix model_shape.hpp lists (layer 0's for the
// per-layer ones) and the layer count. What remains to check (the norms, the later layers, the
// dtypes) load_state_dict checks on the allocated model, which is by then no larger than the file.
#pragma once

#include <algorithm>
#include <limits>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/accounting/model_shape.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/core/error.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/hf_names.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/models/styles.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Checks, before a model of `model` is allocated, that `tensors` can fill it: every weight
/// matrix of weight_matrices(model.config) that the file holds under its state_dict name (layer
/// 0's for a per-layer one; a tied head is skipped) has the shape the config gives it, and the
/// file holds at least model.config.n_layers layers. `tensors` holds dissect's names: a
/// Checkpoint, or an HfCheckpointView. A matrix stored in a dtype dissect does not convert to
/// float (a quantised weight's U8 or I8, io/quantized_file.hpp) has its format's own columns and
/// is compared by rows only; what its format makes of them load_module_quantized checks. A matrix
/// the file lacks is left for load_state_dict to report as missing.
/// @param keys what the config calls its sizes (hf_size_keys(family) for a config.json,
///        detail::dissect_size_keys for save_model's metadata), for the message
/// @throws ConfigError "op: <config_source>: n_positions = 10000000, n_embd = 32 make wpe.weight
///         [10000000, 32], but <file> holds [64, 32]" (every such mismatch, joined by "; "), or
///         "… n_layer = 1000000, but <file> holds 2 layers (h.0 … h.1)"; OverflowError (as
///         weight_matrices) naming the source if a size overflows.
template <class Tensors>
void check_checkpoint_fits(std::string_view op, const HfConfig& model, const Tensors& tensors,
                           std::string_view config_source, const detail::SizeKeys& keys);

/// The module path weight_matrices' matrix `matrix` ("attn.qkv") has in a `style` model's
/// state_dict, in layer `layer` for a per-layer one ("h.0.attn.qkv"; "wte" for embed.tokens).
/// The path comes from accounting/tensor_names.hpp's table for `style`'s family.
/// @throws Error naming a matrix name model_shape.hpp does not list, or one `style`'s family has
///         not; ConfigError for a family the table does not hold.
std::string module_path_of(const DecoderStyle& style, std::string_view matrix, index_t layer = 0);

// ---- implementation -----------------------------------------------------------------------------

inline std::string module_path_of(const DecoderStyle& style, std::string_view matrix,
                                  index_t layer) {
  const ModelTensor tensor = tensor_of_matrix("module_path_of", matrix);
  const FamilyTensorNames& names = tensor_names_of(style.family);
  const TensorNames* row = names.find(tensor);
  if (row == nullptr) {
    throw Error(concat("module_path_of: ", style.model_name, " has no matrix \"", matrix, "\""));
  }
  // A mixture's FFN matrices are its experts'; expert 0's stands for them all.
  // test_checkpoint_fit checks every path against a built model's parameter names.
  return module_path(names, *row, layer, 0);
}

namespace detail {

/// The sizes each of weight_matrices' matrices is made of, for a message: its rows' then its
/// columns'.
inline std::vector<SizeKeys::Size> sizes_of_matrix(std::string_view matrix) {
  using S = SizeKeys;
  switch (tensor_of_matrix("sizes_of_matrix", matrix)) {
    case ModelTensor::token_embedding:
    case ModelTensor::head:
      return {S::vocab, S::d_model};
    case ModelTensor::position_embedding:
      return {S::context, S::d_model};
    case ModelTensor::qkv:
      return {S::n_heads, S::n_kv_heads, S::head_dim, S::d_model};
    case ModelTensor::attention_output:
      return {S::d_model, S::n_heads, S::head_dim};
    case ModelTensor::router:  // its rows, E, are no size key
    case ModelTensor::attention_norm:
    case ModelTensor::ffn_norm:
    case ModelTensor::final_norm:
      return {S::d_model};
    case ModelTensor::ffn_gate:
    case ModelTensor::ffn_up:
    case ModelTensor::ffn_down:
      break;
  }
  return {S::d_ff, S::d_model};
}

/// "n_positions = 10000000, n_embd = 32": the keys the file has among `sizes`, with their values.
inline std::string size_values(const TransformerConfig& c, const SizeKeys& keys,
                               const std::vector<SizeKeys::Size>& sizes) {
  std::string text;
  for (SizeKeys::Size size : sizes) {
    const char* key = keys[size];
    if (key == nullptr) continue;
    index_t value = 0;
    switch (size) {
      case SizeKeys::d_model:
        value = c.d_model;
        break;
      case SizeKeys::n_layers:
        value = c.n_layers;
        break;
      case SizeKeys::n_heads:
        value = c.n_heads;
        break;
      case SizeKeys::n_kv_heads:
        value = c.kv_heads();
        break;
      case SizeKeys::head_dim:
        value = c.head_size();
        break;
      case SizeKeys::d_ff:
        value = c.d_ff;
        break;
      case SizeKeys::vocab:
        value = c.vocab;
        break;
      case SizeKeys::context:
        value = c.context;
        break;
    }
    text += concat(text.empty() ? "" : ", ", key, " = ", value);
  }
  return text;
}

}  // namespace detail

template <class Tensors>
void check_checkpoint_fits(std::string_view op, const HfConfig& model, const Tensors& tensors,
                           std::string_view config_source, const detail::SizeKeys& keys) {
  using detail::concat;
  const DecoderStyle& style = style_of(model.family);
  const TransformerConfig& config = model.config;
  const std::string file = tensors.path().string();
  const std::string where = concat(op, ": ", config_source, ": ");

  std::vector<WeightMatrix> matrices;
  try {
    matrices = weight_matrices(config);
  } catch (const OverflowError& error) {
    throw OverflowError(where + error.what());
  }
  std::string problems;
  const auto add_problem = [&](const std::string& problem) {
    problems += concat(problems.empty() ? "" : "; ", problem);
  };
  for (const WeightMatrix& matrix : matrices) {
    if (matrix.tied) continue;
    const std::string module = module_path_of(style, matrix.name);
    const std::string name = module + ".weight";
    if (!tensors.contains(name)) continue;
    const TensorInfo& info = tensors.info(name);
    const std::vector<index_t>& held = info.shape;
    const auto float_names = detail::convertible_dtype_names();
    const bool rows_only =
        std::find(float_names.begin(), float_names.end(), info.dtype) == float_names.end();
    const bool fits =
        held.size() == 2 && held[0] == matrix.shape[0] && (rows_only || held[1] == matrix.shape[1]);
    if (!fits) {
      add_problem(
          concat(detail::size_values(config, keys, detail::sizes_of_matrix(matrix.name)), " make ",
                 name, " ", format_shape(std::span<const index_t>(matrix.shape)),
                 rows_only ? concat(" (its rows: stored as ", info.dtype, ")") : std::string(),
                 ", but ", file, " holds ", format_shape(std::span<const index_t>(held))));
    }
  }

  // The layers the file holds: one past the highest "h.N." index (a gap is a missing tensor).
  index_t held_layers = 0;
  for (const std::string& name : tensors.tensor_names()) {
    if (const auto layer = layer_index_of(name); layer && *layer >= held_layers) {
      held_layers = *layer < std::numeric_limits<index_t>::max() ? *layer + 1 : *layer;
    }
  }
  if (held_layers < config.n_layers) {
    add_problem(
        concat(detail::size_values(config, keys, {detail::SizeKeys::n_layers}), ", but ", file,
               held_layers == 0
                   ? std::string(" holds no layers")
                   : concat(" holds ", held_layers, held_layers == 1 ? " layer (" : " layers (",
                            style.layers, ".0",
                            held_layers > 1 ? concat(" … ", style.layers, ".", held_layers - 1)
                                            : std::string(),
                            ")")));
  }
  if (!problems.empty()) throw ConfigError(where + problems);
}

}  // namespace dissect
