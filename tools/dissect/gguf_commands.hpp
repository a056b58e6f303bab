// tools/dissect/gguf_commands.hpp — `dissect inspect FILE.gguf`: a llama.cpp model file taken
// apart. The reading, the checks and the arithmetic are the library's (io/gguf.hpp,
// io/gguf_model.hpp, count.hpp); this groups and prints.
//
// The report: the file (version, alignment, data offset), its metadata (arrays summarised; the
// tokenizer's long lists by their length), the tensors grouped by layer with their ggml type,
// shape [out, in] (row-major, as dissect and PyTorch write it), bytes and bits per weight, the
// totals per type, and for a llama or gpt2 file the config its metadata gives with the config's
// exact parameter count beside the tensors' (a file whose tensors contradict its metadata is
// refused with the library's message).
//
// `--json` gives the metadata machine-readable: each key maps to {"type", "value"} with numbers
// as JSON numbers (f32/f64 non-finite as the strings "nan", "inf", "-inf"), strings as
// strings, bools as bools, and arrays as {"type": "array", "element_type", "length", "value"}
// holding their first 16 elements (every one with `--full`; nested arrays alike). Text the file
// holds that is not UTF-8 (keys, values, tensor names) has each bad byte replaced by U+FFFD,
// so the output is JSON whatever the file holds; the plain report prints such text, and any
// control character, escaped (\xNN), as the library's messages do.
#pragma once

#include <nlohmann/json.hpp>

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>
#include <variant>
#include <vector>

#include "dissect/accounting/count.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"
#include "dissect/io/open_model.hpp"
#include "tools/common/table.hpp"

namespace dissect::tools {

/// The library's test (io/gguf.hpp), under the name the tools had for it; kept for one release.
using dissect::is_gguf_file;

namespace detail_gguf {

/// "blk.3.attn_q.weight" → 3; others → nothing.
inline std::optional<index_t> layer_of(std::string_view name) {
  if (name.rfind("blk.", 0) != 0) return std::nullopt;
  const std::size_t end = name.find('.', 4);
  if (end == std::string_view::npos || end == 4) return std::nullopt;
  index_t layer = 0;
  for (std::size_t i = 4; i < end; ++i) {
    if (name[i] < '0' || name[i] > '9' || layer > 1'000'000'000) return std::nullopt;
    layer = layer * 10 + (name[i] - '0');
  }
  return layer;
}

inline std::string shape_text(const GgufTensorInfo& info) {
  return format_shape(info.shape());
}

inline std::string bits_per_weight(index_t bytes, index_t elements) {
  if (elements == 0) return "-";
  std::ostringstream out;
  out.setf(std::ios::fixed);
  out.precision(2);
  out << 8.0 * static_cast<double>(bytes) / static_cast<double>(elements);
  return out.str();
}

/// A metadata value for the report: short values whole, long arrays by their length and start.
inline std::string value_text(const GgufValue& value) {
  if (const auto* elements = value.as_array(); elements && elements->size() > 8) {
    return concat(elements->size(), " elements: ", value.describe(3));
  }
  std::string text = value.describe(8);
  if (text.size() > 120) text = text.substr(0, 117) + "...";
  return text;
}

/// How many elements of a metadata array `--json` prints without `--full`.
inline constexpr std::size_t json_array_elements = 16;

/// A float as the JSON number that reads back as the same float: the shortest decimal that
/// round-trips it (1e-05 for 1e-5f, not float→double's 9.99999974737875e-06); a NaN or an
/// infinity, which JSON has no number for, as the string "nan", "inf" or "-inf".
template <class Float>
nlohmann::ordered_json json_number(Float value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  if constexpr (std::is_same_v<Float, float>) {
    char text[64];
    const auto end = std::to_chars(text, text + sizeof(text), value).ptr;
    *end = '\0';
    return std::strtod(text, nullptr);
  } else {
    return value;
  }
}

/// One metadata value for --json: its element (a number, string, bool, or for an array
/// {"type": "array", "element_type", "length", "value": its first `max_elements`}).
inline nlohmann::ordered_json json_element(const GgufValue& value, std::size_t max_elements) {
  return std::visit(
      [&](const auto& v) -> nlohmann::ordered_json {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, GgufValue::Array>) {
          nlohmann::ordered_json elements = nlohmann::ordered_json::array();
          for (std::size_t i = 0; i < v.size() && i < max_elements; ++i)
            elements.push_back(json_element(v[i], max_elements));
          return {{"type", "array"},
                  {"element_type", gguf_type_name(value.element_type())},
                  {"length", v.size()},
                  {"value", std::move(elements)}};
        } else if constexpr (std::is_floating_point_v<T>) {
          return json_number(v);
        } else if constexpr (std::is_same_v<T, std::uint8_t>) {
          return static_cast<unsigned>(v);
        } else if constexpr (std::is_same_v<T, std::int8_t>) {
          return static_cast<int>(v);
        } else {
          return v;  // integers, bool, string (made UTF-8 when the whole is dumped)
        }
      },
      value.storage());
}

/// One metadata entry for --json: {"type", "value"}, an array's fields beside them.
inline nlohmann::ordered_json json_metadata_value(const GgufValue& value, bool full) {
  const std::size_t most = full ? std::numeric_limits<std::size_t>::max() : json_array_elements;
  if (value.as_array()) return json_element(value, most);
  return {{"type", gguf_type_name(value.type())}, {"value", json_element(value, most)}};
}

}  // namespace detail_gguf

/// `inspect FILE.gguf`: the report of what detect_checkpoint found in a GGUF file (its config
/// when its architecture is one dissect builds; a contradiction was the library's error, exit
/// 2), or with `json` the same as JSON (metadata arrays whole with `full`, else their first 16
/// elements and their length).
inline int inspect_gguf(const DetectedCheckpoint& source, bool json, bool full = false) {
  namespace g = detail_gguf;
  if (source.kind != CheckpointKind::gguf || !source.gguf) {
    throw Error(concat("inspect: ", source.checkpoint.path().string(), " is not a GGUF file"));
  }
  const std::filesystem::path& path = source.checkpoint.path();
  const GgufFile& file = *source.gguf;
  const std::optional<HfConfig>& model = source.model;
  index_t parameters = 0, bytes = 0;
  struct TypeTotal {
    index_t tensors = 0, elements = 0, bytes = 0;
  };
  std::map<std::string, TypeTotal> by_type;
  for (const GgufTensorInfo& info : file.tensors()) {
    parameters = checked_add(parameters, info.elements(), "inspect: parameters");
    bytes = checked_add(bytes, info.bytes, "inspect: bytes");
    TypeTotal& total = by_type[ggml_type_name(info.type)];
    ++total.tensors;
    total.elements += info.elements();
    total.bytes += info.bytes;
  }
  // -1: no config to count (an optional here trips GCC 12's -Wmaybe-uninitialized).
  const index_t exact = model ? count_parameters(model->config).total : -1;

  if (json) {
    nlohmann::ordered_json out;
    out["file"] = path.string();
    out["format"] = "gguf";
    out["version"] = file.version();
    out["alignment"] = file.alignment();
    out["data_offset"] = file.data_offset();
    auto& metadata = out["metadata"] = nlohmann::ordered_json::object();
    for (const auto& [key, value] : file.metadata()) {
      metadata[key] = g::json_metadata_value(value, full);
    }
    if (model) {
      out["family"] = family_name(model->family);
      out["config"] = {{"d_model", model->config.d_model},
                       {"n_layers", model->config.n_layers},
                       {"n_heads", model->config.n_heads},
                       {"n_kv_heads", model->config.kv_heads()},
                       {"head_dim", model->config.head_size()},
                       {"d_ff", model->config.d_ff},
                       {"vocab", model->config.vocab},
                       {"context", model->config.context},
                       {"tied_embeddings", model->config.tied_embeddings}};
    }
    auto& tensors = out["tensors"] = nlohmann::ordered_json::array();
    for (const GgufTensorInfo& info : file.tensors()) {
      tensors.push_back({{"name", info.name},
                         {"type", ggml_type_name(info.type)},
                         {"shape", info.shape()},
                         {"parameters", info.elements()},
                         {"bytes", info.bytes},
                         {"offset", file.data_offset() + info.offset}});
    }
    auto& types = out["types"] = nlohmann::ordered_json::object();
    for (const auto& [name, total] : by_type) {
      types[name] = {
          {"tensors", total.tensors}, {"parameters", total.elements}, {"bytes", total.bytes}};
    }
    out["totals"] = {{"parameters", parameters},
                     {"bytes", bytes},
                     {"exact_from_config", exact >= 0 ? nlohmann::ordered_json(exact) : nullptr}};
    // Text that is not UTF-8 (a key, a string value, a tensor name) cannot be a JSON string:
    // each bad byte becomes U+FFFD, so the output is valid JSON whatever the file holds.
    std::cout << out.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) << "\n";
    return 0;
  }

  std::ostringstream report;
  report << "file        " << path.string() << " (GGUF v" << file.version() << ", "
         << file.tensors().size() << " tensors, " << file.metadata().size()
         << " metadata keys, alignment " << file.alignment() << ", data from byte "
         << file.data_offset() << ")\n";
  if (model) {
    const TransformerConfig& c = model->config;
    report << "model       " << family_name(model->family) << ": D = " << c.d_model
           << ", L = " << c.n_layers << ", H = " << c.n_heads << ", H_kv = " << c.kv_heads()
           << ", d_k = " << c.head_size() << ", F = " << c.d_ff << ", V = " << c.vocab
           << ", context = " << c.context
           << (c.tied_embeddings ? ", head tied to the embedding" : "") << "\n";
  } else {
    report << "model       not one dissect builds (architecture "
           << (file.find("general.architecture") ? file.find("general.architecture")->describe()
                                                 : std::string("unset"))
           << "): the tensors alone\n";
  }
  report << "\nmetadata\n";
  TextTable metadata;
  for (const auto& [key, value] : file.metadata()) {
    const std::string type = value.as_array() ? concat(gguf_type_name(value.element_type()), "[]")
                                              : gguf_type_name(value.type());
    metadata.add_row({"  " + escape_file_text(key), type, g::value_text(value)});
  }
  report << metadata.render() << "\n";

  TextTable tensors({false, false, false, true, true, true});
  tensors.add_row({"tensor", "type", "shape", "parameters", "bytes", "bits/weight"});
  tensors.add_rule();
  std::optional<index_t> current_layer;
  for (const GgufTensorInfo& info : file.tensors()) {
    const std::optional<index_t> layer = g::layer_of(info.name);
    if (layer && layer != current_layer) tensors.add_row({concat("layer ", *layer)});
    current_layer = layer;
    tensors.add_row({(layer ? "  " : "") + escape_file_text(info.name), ggml_type_name(info.type),
                     g::shape_text(info), format_count(info.elements()), format_count(info.bytes),
                     g::bits_per_weight(info.bytes, info.elements())});
  }
  report << tensors.render() << "\n";

  TextTable types({false, true, true, true, true});
  types.add_row({"type", "tensors", "parameters", "bytes", "bits/weight"});
  types.add_rule();
  for (const auto& [name, total] : by_type) {
    types.add_row({name, concat(total.tensors), format_count(total.elements),
                   format_count(total.bytes), g::bits_per_weight(total.bytes, total.elements)});
  }
  report << types.render() << "\n";
  report << "parameters  " << format_count(parameters) << " in " << format_count(bytes)
         << " bytes (" << g::bits_per_weight(bytes, parameters) << " bits per weight)";
  if (exact >= 0) {
    report << "; the config's exact count: " << format_count(exact)
           << (exact == parameters ? " (equal)" : " (DIFFERENT)");
  }
  report << "\n";
  std::cout << report.str();
  return 0;
}

}  // namespace dissect::tools
