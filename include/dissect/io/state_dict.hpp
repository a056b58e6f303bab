// dissect/io/state_dict.hpp — a module's parameters to and from a checkpoint, by name.
//
// load_state_dict fills any Module (module.hpp) from a SafetensorsFile or a Checkpoint, matching
// its PyTorch state_dict names and converting each stored dtype into the parameter's scalar. It
// is strict by default, as PyTorch's: one error lists every missing, unexpected and mis-shaped
// tensor at once, and since everything is checked before the first value is written, a refused
// load leaves the module as it was. save_module writes every parameter under its name.
//
// The load writes through the views the module protocol hands out, behind the layers' backs, so
// it tells the layers that keep state derived from their weight (a Linear's packed or quantised
// copy, a merged adapter): a weight that cannot take new values (quantised, merged) is one more
// problem of the refused load, and a packed layer repacks after it.
#pragma once

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// How model names meet checkpoint names. Parameter m is looked for under
///   checkpoint_prefix + name_map(m without model_prefix)
/// (name_map left out: the identity).
struct LoadOptions {
  /// Missing and unexpected tensors are errors (mis-shaped ones always are).
  bool strict = true;
  /// What the checkpoint's names carry in front that the model's lack ("transformer." finds
  /// h.0.ln_1.weight as transformer.h.0.ln_1.weight); checkpoint tensors without it are
  /// unexpected.
  std::string checkpoint_prefix = {};
  /// What the model's names carry in front that the checkpoint's lack ("0." loads the first
  /// member of a Sequential from a checkpoint of that member alone); parameters without it are
  /// left as they are, neither loaded nor missing.
  std::string model_prefix = {};
  /// The checkpoint's name for a model name, or nullopt for a parameter that is not in the
  /// checkpoint by design (left as it is, never missing): where a model's names differ from the
  /// checkpoint's (Hugging Face's c_attn for dissect's qkv).
  std::function<std::optional<std::string>(std::string_view model_name)> name_map = {};
  /// Checkpoint tensors the model is known not to have (GPT-2's attention-mask buffers): never
  /// unexpected.
  std::function<bool(std::string_view checkpoint_name)> ignore = {};
};

/// What a load did, by name: model names loaded and missing, checkpoint names unexpected.
struct LoadResult {
  std::vector<std::string> loaded;
  std::vector<std::string> missing;
  std::vector<std::string> unexpected;
};

/// What load_state_dict reads from: a SafetensorsFile or a Checkpoint.
template <class Source>
concept TensorSource = requires(const Source& source, std::string_view name,
                                TensorView<float, 1> target) {
  { source.path() } -> std::convertible_to<std::filesystem::path>;
  { source.tensor_names() } -> std::same_as<std::vector<std::string>>;
  { source.contains(name) } -> std::same_as<bool>;
  { source.info(name) } -> std::same_as<const TensorInfo&>;
  load_into(source, name, target);
};

/// Copies every parameter of `module` from `source`, converting F32/F64/F16/BF16 into the
/// parameter's scalar. A packed Linear whose weight is loaded repacks (a block that fused it
/// runs unfused until packed again).
/// @throws Error "load_state_dict: <file>: Missing key(s): a, b; Unexpected key(s): c; size
///         mismatch for h.0.attn.qkv.weight: checkpoint [96, 32], model [64, 32]" listing every
///         problem (missing and unexpected only when strict; a dtype that cannot be converted
///         always; a weight the layer cannot take now, Linear::weight_write_refusal:
///         "h.0.mlp.up.weight: the weight is stored as int8; dequantize() the layer first"), with
///         nothing written into the module.
template <Module M, TensorSource Source>
LoadResult load_state_dict(M& module, const Source& source, const LoadOptions& options = {});

/// Writes every parameter of `module` to `path` under its state_dict name, as `dtype` (unset:
/// the parameters' own, F32 or F64), with `metadata`. @throws as save_safetensors.
template <Module M>
void save_module(const std::filesystem::path& path, const M& module,
                 const std::map<std::string, std::string>& metadata = {},
                 std::optional<SaveDtype> dtype = std::nullopt);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// A model of `config` for a loader to fill strictly (every parameter written next): built
/// without drawing random values, which the file overwrites (on TinyLlama's shape the draws cost
/// most of a load), and with gradient buffers only if the caller's ConstructionScope wants them.
template <class Model, class Config, class Options>
Model model_to_load(const Config& config, const Options& options) {
  const ConstructionScope loading(
      {.initialise = false, .gradients = ConstructionScope::current().gradients});
  return Model(config, options);
}

/// The checkpoint name of model parameter `model_name` under `options`, or nullopt if it is not
/// to be loaded.
inline std::optional<std::string> checkpoint_name(std::string_view model_name,
                                                  const LoadOptions& options) {
  if (!model_name.starts_with(options.model_prefix)) return std::nullopt;
  model_name.remove_prefix(options.model_prefix.size());
  std::optional<std::string> mapped =
      options.name_map ? options.name_map(model_name) : std::string(model_name);
  if (mapped) mapped->insert(0, options.checkpoint_prefix);
  return mapped;
}

/// Calls visit(weight_name, layer) for every layer of `module` that must hear of writes to its
/// weight made through its views (Linear: weight_write_refusal, weight_written), with the
/// state_dict name of that weight ("h.0.attn.qkv.weight").
template <class M, class Visit>
void for_each_weight_watcher(M& module, Visit&& visit) {
  for_each_layer(module, [&](const std::string& path, auto& layer) {
    if constexpr (requires {
                    { layer.weight_write_refusal() } -> std::same_as<std::optional<std::string>>;
                    layer.weight_written();
                  }) {
      visit(path.empty() ? std::string("weight") : path + ".weight", layer);
    }
  });
}

/// "a, b, c".
inline std::string join_names(const std::vector<std::string>& names) {
  std::string text;
  for (const std::string& name : names) text += concat(text.empty() ? "" : ", ", name);
  return text;
}

}  // namespace detail

template <Module M, TensorSource Source>
LoadResult load_state_dict(M& module, const Source& source, const LoadOptions& options) {
  LoadResult result;
  std::vector<std::optional<std::string>> plan;  // per parameter, in visiting order
  std::set<std::string, std::less<>> claimed;
  std::set<std::string, std::less<>> written;  // model names the load writes
  std::vector<std::string> mismatches;
  std::as_const(module).for_each_parameter([&](const ParameterName& parameter, auto value, auto) {
    const std::string model_name = parameter.str();
    std::optional<std::string> key = detail::checkpoint_name(model_name, options);
    if (key) claimed.insert(*key);
    if (key && !source.contains(*key)) {
      result.missing.push_back(model_name);
      key.reset();
    }
    plan.push_back(key);
    if (!key) return;
    const TensorInfo& info = source.info(*key);
    const std::string named =
        *key == model_name ? model_name : detail::concat(model_name, " (checkpoint ", *key, ")");
    if (!std::equal(info.shape.begin(), info.shape.end(), value.shape().begin(),
                    value.shape().end())) {
      mismatches.push_back(detail::concat("size mismatch for ", named, ": checkpoint ",
                                          format_shape(info.shape), ", model ",
                                          format_shape(value.shape())));
    } else if (!detail::convertible_dtype_named(info.dtype)) {
      mismatches.push_back(detail::concat("dtype ", info.dtype, " of ", named,
                                          " cannot be converted (",
                                          detail::convertible_dtype_list(", "), " can)"));
    } else {
      result.loaded.push_back(model_name);
      written.insert(model_name);
    }
  });
  detail::for_each_weight_watcher(module, [&](const std::string& weight, const auto& layer) {
    if (!written.contains(weight)) return;
    if (const std::optional<std::string> refusal = layer.weight_write_refusal()) {
      mismatches.push_back(detail::concat(weight, ": ", *refusal));
    }
  });
  for (const std::string& name : source.tensor_names()) {
    if (!claimed.contains(name) && !(options.ignore && options.ignore(name))) {
      result.unexpected.push_back(name);
    }
  }
  std::vector<std::string> problems;
  if (options.strict && !result.missing.empty()) {
    problems.push_back("Missing key(s): " + detail::join_names(result.missing));
  }
  if (options.strict && !result.unexpected.empty()) {
    problems.push_back("Unexpected key(s): " + detail::join_names(result.unexpected));
  }
  problems.insert(problems.end(), mismatches.begin(), mismatches.end());
  if (!problems.empty()) {
    std::string message = detail::concat("load_state_dict: ", source.path().string(), ": ");
    for (std::size_t i = 0; i < problems.size(); ++i) message += (i ? "; " : "") + problems[i];
    throw Error(message);
  }
  // Everything fits: only now write, from the same plan (no call below can fail).
  std::size_t position = 0;
  module.for_each_parameter([&](const ParameterName&, auto value, auto) {
    if (const std::optional<std::string>& key = plan[position++]) load_into(source, *key, value);
  });
  detail::for_each_weight_watcher(module, [&](const std::string& weight, auto& layer) {
    if (written.contains(weight)) layer.weight_written();  // a packed layer repacks
  });
  return result;
}

template <Module M>
void save_module(const std::filesystem::path& path, const M& module,
                 const std::map<std::string, std::string>& metadata,
                 std::optional<SaveDtype> dtype) {
  std::vector<SaveEntry> entries;
  module.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    entries.emplace_back(name.str(), value, dtype);
  });
  save_safetensors(path, entries, metadata);
}

}  // namespace dissect
