// dissect/io/quantized_file.hpp — quantised Linear weights in safetensors, next to the float
// parameters of the same module.
//
// A quantised layer at module path P stores its weight under P's usual name, in its format's own
// dtype, and its scales as one extra tensor:
//   bf16  P.weight        BF16 [out, in]      (the bits: readable as a float weight by any reader)
//   int8  P.weight        I8   [out, in]      values in −127..127
//         P.weight_scale  F32  [out]          ŵ = scale[row]·value
//   q4_0  P.weight        U8   [out, in/2]    GGUF Q4_0 nibbles, 16 bytes per block of 32
//         P.weight_scale  F16  [out, in/32]   ŵ = (nibble − 8)·scale[row, block]
//   q8_0, q4_K, q5_K, q6_K, tq2_0
//         P.weight        U8   [out, row bytes]  ggml's blocks as GGUF stores them, scales inside
// (a layer stacked from several ggml formats, as a GGUF model's q, k and v can be, has no single
// format to name: saving it is an Error; GGUF is its file format)
// and the file's metadata says which layers are stored so, under "dissect.quantization":
//   {"layers": {"h.0.attn.qkv": "int8", …}}
// Every other parameter (embeddings, norms, biases) is F32 as save_module writes it.
#pragma once

#include <nlohmann/json.hpp>

#include <cstring>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "dissect/io/checkpoint.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/io/state_dict.hpp"
#include "dissect/transforms/quantize.hpp"

namespace dissect {

inline constexpr const char* quantization_key = "dissect.quantization";

/// As save_module, with each quantised Linear's weight in its stored format (above).
template <Module M>
void save_module_quantized(const std::filesystem::path& path, const M& module,
                           std::map<std::string, std::string> metadata);

/// As load_state_dict (strict), then the quantised weights the metadata lists into their layers.
/// @throws FormatError naming the file and tensor for unreadable metadata, a layer the module
///         does not have, a tensor of the wrong dtype, or a scale of the wrong shape; as
///         load_state_dict and QuantizedWeight::from_* otherwise.
template <Module M>
void load_module_quantized(M& module, const Checkpoint& checkpoint);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

template <class T>
std::span<const std::byte> stored_bytes_of(std::span<const T> values) {
  return std::as_bytes(values);
}

/// The layers a file lists as quantised: path → format. Empty without the key.
inline std::map<std::string, WeightFormat> quantized_layers_of(const Checkpoint& checkpoint) {
  std::map<std::string, WeightFormat> layers;
  const auto found = checkpoint.metadata().find(quantization_key);
  if (found == checkpoint.metadata().end()) return layers;
  const std::string where =
      concat(checkpoint.path().string(), ": metadata \"", quantization_key, "\"");
  try {
    const auto json = nlohmann::json::parse(found->second);
    for (const auto& [path, format] : json.at("layers").items()) {
      layers.emplace(path, weight_format_from_name(format.get<std::string>()));
    }
  } catch (const nlohmann::json::exception& error) {
    throw FormatError(concat(where, " is not {\"layers\": {path: format}}: ", error.what()));
  } catch (const ConfigError& error) {
    throw FormatError(concat(where, ": ", error.what()));
  }
  return layers;
}

/// Tensor `name` of the checkpoint as raw values of T, after checking its dtype and shape.
template <class T>
std::vector<T> read_stored(const Checkpoint& checkpoint, const std::string& name,
                           std::string_view dtype, const std::vector<index_t>& shape) {
  const std::string where = concat(checkpoint.path().string(), ": tensor \"", name, "\"");
  if (!checkpoint.contains(name)) throw FormatError(concat(where, " is missing"));
  const TensorInfo& info = checkpoint.info(name);
  if (info.dtype != dtype) {
    throw FormatError(concat(where, " is ", info.dtype, ", its quantised format stores ", dtype));
  }
  if (info.shape != shape) {
    throw FormatError(concat(where, " has shape ", format_shape(info.shape), ", the layer needs ",
                             format_shape(shape)));
  }
  const auto bytes = checkpoint.shard_of(name).bytes(name);
  std::vector<T> values(bytes.size() / sizeof(T));
  std::memcpy(values.data(), bytes.data(), values.size() * sizeof(T));
  return values;
}

inline QuantizedWeight read_quantized_weight(const Checkpoint& checkpoint, const std::string& path,
                                             WeightFormat format, index_t rows, index_t cols) {
  const std::string weight = path + ".weight", scale = path + ".weight_scale";
  // The weight is read (and checked) before its scales: an error names the first that is wrong.
  switch (format) {
    case WeightFormat::bf16:
      return QuantizedWeight::from_bf16(
          rows, cols, read_stored<std::uint16_t>(checkpoint, weight, "BF16", {rows, cols}));
    case WeightFormat::int8: {
      auto values = read_stored<std::int8_t>(checkpoint, weight, "I8", {rows, cols});
      return QuantizedWeight::from_int8(rows, cols, std::move(values),
                                        read_stored<float>(checkpoint, scale, "F32", {rows}));
    }
    case WeightFormat::q8_0:
    case WeightFormat::q4_K:
    case WeightFormat::q5_K:
    case WeightFormat::q6_K:
    case WeightFormat::tq2_0: {
      const GgmlType type = ggml_type_of(format);
      const index_t block = ggml_type_info(type).block_elements;
      if (cols % block != 0) {
        throw FormatError(concat(checkpoint.path().string(), ": layer ", path, " has in_features ",
                                 cols, ", which ", weight_format_name(format),
                                 " cannot store (a multiple of ", block, ")"));
      }
      const auto blocks =
          read_stored<std::uint8_t>(checkpoint, weight, "U8", {rows, ggml_row_bytes(type, cols)});
      return QuantizedWeight::from_ggml(type, rows, cols, blocks);
    }
    case WeightFormat::q4_0: {
      if (cols % q4_block != 0) {
        throw FormatError(concat(checkpoint.path().string(), ": layer ", path, " has in_features ",
                                 cols, ", which q4_0 cannot store (a multiple of 32)"));
      }
      auto nibbles = read_stored<std::uint8_t>(checkpoint, weight, "U8", {rows, cols / 2});
      return QuantizedWeight::from_q4_0(
          rows, cols, std::move(nibbles),
          read_stored<std::uint16_t>(checkpoint, scale, "F16", {rows, cols / q4_block}));
    }
  }
  return QuantizedWeight::from_bf16(0, 0, {});  // unreachable: the format was parsed
}

}  // namespace detail

template <Module M>
void save_module_quantized(const std::filesystem::path& path, const M& module,
                           std::map<std::string, std::string> metadata) {
  std::map<std::string, const QuantizedWeight*> quantized;  // "P.weight" → its storage
  nlohmann::json layers = nlohmann::json::object();
  for_each_layer(module, [&](const std::string& layer_path, const Linear<float>& layer) {
    if (!layer.quantized()) return;
    quantized.emplace(layer_path + ".weight", &layer.quantized_weight());
    layers[layer_path] = std::string(weight_format_name(layer.quantized_weight().format()));
  });
  if (quantized.empty()) {
    save_module(path, module, metadata);
    return;
  }
  metadata[quantization_key] = nlohmann::json{{"layers", layers}}.dump();
  std::vector<SaveEntry> entries;
  module.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    const std::string text = name.str();
    const auto found = quantized.find(text);
    if (found == quantized.end()) {
      entries.emplace_back(text, value);
      return;
    }
    const QuantizedWeight& q = *found->second;
    const index_t rows = q.rows(), cols = q.cols();
    if (q.ggml_rows().size() > 1) {
      throw Error(concat("save_module_quantized: ", path.string(), ": ", text, " is stored as ",
                         q.describe(), ", several formats; save the model as GGUF"));
    }
    switch (q.format()) {
      case WeightFormat::q8_0:
      case WeightFormat::q4_K:
      case WeightFormat::q5_K:
      case WeightFormat::q6_K:
      case WeightFormat::tq2_0:
        entries.emplace_back(
            text, std::vector<index_t>{rows, ggml_row_bytes(ggml_type_of(q.format()), cols)},
            StoredBytes{"U8", detail::stored_bytes_of(
                                  std::span<const std::uint8_t>(q.ggml_rows().front().blocks))});
        break;
      case WeightFormat::bf16:
        entries.emplace_back(text, std::vector<index_t>{rows, cols},
                             StoredBytes{"BF16", detail::stored_bytes_of(q.bf16_bits())});
        break;
      case WeightFormat::int8:
        entries.emplace_back(text, std::vector<index_t>{rows, cols},
                             StoredBytes{"I8", detail::stored_bytes_of(q.int8_values())});
        entries.emplace_back(text + "_scale", std::vector<index_t>{rows},
                             StoredBytes{"F32", detail::stored_bytes_of(q.int8_scales())});
        break;
      case WeightFormat::q4_0:
        entries.emplace_back(text, std::vector<index_t>{rows, cols / 2},
                             StoredBytes{"U8", detail::stored_bytes_of(q.q4_nibbles())});
        entries.emplace_back(text + "_scale", std::vector<index_t>{rows, cols / q4_block},
                             StoredBytes{"F16", detail::stored_bytes_of(q.q4_scales())});
        break;
    }
  });
  save_safetensors(path, entries, metadata);
}

template <Module M>
void load_module_quantized(M& module, const Checkpoint& checkpoint) {
  const auto layers = detail::quantized_layers_of(checkpoint);
  if (layers.empty()) {
    load_state_dict(module, checkpoint);
    return;
  }
  std::map<std::string, Linear<float>*> targets;
  for_each_layer(module, [&](const std::string& path, Linear<float>& layer) {
    if (layers.contains(path)) targets.emplace(path, &layer);
  });
  for (const auto& [path, format] : layers) {
    if (!targets.contains(path)) {
      throw FormatError(detail::concat(checkpoint.path().string(), ": metadata \"",
                                       quantization_key, "\" lists layer ", path,
                                       ", which the model does not have as a float Linear"));
    }
  }
  // Read and check every quantised weight before the module changes.
  std::vector<std::pair<Linear<float>*, QuantizedWeight>> weights;
  for (const auto& [path, format] : layers) {
    Linear<float>& layer = *targets.at(path);
    weights.emplace_back(
        &layer, detail::read_quantized_weight(checkpoint, path, format, layer.out_features(),
                                              layer.in_features()));
  }
  LoadOptions options;
  options.name_map = [&](std::string_view name) -> std::optional<std::string> {
    constexpr std::string_view suffix = ".weight";
    if (name.ends_with(suffix) &&
        layers.contains(std::string(name.substr(0, name.size() - suffix.size())))) {
      return std::nullopt;  // read above, in its own format
    }
    return std::string(name);
  };
  options.ignore = [&](std::string_view name) {
    for (const std::string_view suffix : {".weight", ".weight_scale"}) {
      if (name.ends_with(suffix) &&
          layers.contains(std::string(name.substr(0, name.size() - suffix.size())))) {
        return true;
      }
    }
    return false;
  };
  load_state_dict(module, checkpoint, options);
  for (auto& [layer, weight] : weights) {
    if (layer->quantized()) layer->dequantize();
    layer->set_quantized_weight(std::move(weight));
  }
}

}  // namespace dissect
