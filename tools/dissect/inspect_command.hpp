// tools/dissect/inspect_command.hpp — `dissect inspect`: every tensor of a checkpoint grouped by
// layer, the linear layers' shapes, the totals beside the config's exact count, and a memory
// budget. A .gguf file is gguf_commands.hpp's. `inspect` reads any safetensors file: without a
// config it lists the tensors and leaves out what it cannot infer.
//
//   dissect inspect CHECKPOINT [--gpu-memory 24GB] [--context T] [--json]
//   dissect inspect FILE.gguf [--json [--full]]
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstddef>
#include <filesystem>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/accounting/budget.hpp"
#include "dissect/accounting/count.hpp"
#include "dissect/core/dtype.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/hf_names.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/text/checkpoint_tokenizer.hpp"
#include "tools/common/parse.hpp"
#include "tools/common/table.hpp"
#include "tools/dissect/command.hpp"
#include "tools/dissect/gguf_commands.hpp"
#include "tools/dissect/text_commands.hpp"

namespace dissect::tools {

namespace detail_inspect {

namespace fs = std::filesystem;

struct TensorRow {
  std::string name, dtype, group;
  std::vector<index_t> shape;
  std::optional<index_t> layer;  ///< from "h.N." / "layers.N.", any index up to INT64_MAX
  index_t parameters = 1, bytes = 0;
  bool buffer = false;
  std::optional<std::pair<index_t, index_t>> linear;  ///< in, out of y = x·Wᵀ + b
  bool bias = false;
};

/// Whether `name` is stored [in, out]: a GPT-2 Conv1D weight, but not a LoRA adapter's A or B on
/// one (PEFT's lora_A and lora_B are nn.Linear layers, [out, in], whatever module they adapt).
inline bool conv1d(std::string_view name) {
  const bool adapter = name.find(".lora_A.") != std::string_view::npos ||
                       name.find(".lora_B.") != std::string_view::npos;
  return dissect::is_conv1d_weight(name) && !adapter;
}

inline std::vector<TensorRow> tensor_rows(const dissect::Checkpoint& checkpoint) {
  const auto names = checkpoint.tensor_names();
  std::vector<TensorRow> rows;
  for (const std::string& name : names) {
    const dissect::TensorInfo& info = checkpoint.info(name);
    TensorRow row;
    row.name = name;
    row.dtype = info.dtype;
    row.shape = info.shape;
    row.bytes = info.end - info.begin;
    row.buffer = dissect::is_hf_buffer(name);
    row.layer = dissect::layer_index_of(name);
    // The reader checked that the byte size fits int64, so the element count does too.
    for (index_t extent : info.shape) {
      row.parameters = dissect::checked_mul(row.parameters, extent, "inspect: element count");
    }
    if (row.layer) {
      row.group = dissect::concat("layer ", *row.layer);
    } else {
      row.group = row.buffer                         ? "buffers"
                  : dissect::is_embedding_name(name) ? "embeddings"
                                                     : "final";
    }
    if (info.shape.size() == 2 && !row.buffer && !dissect::is_embedding_name(name) &&
        (name == "weight" || name.ends_with(".weight"))) {
      // GPT-2's Conv1D projections store W as [in, out]; everything else as nn.Linear's [out, in].
      row.linear = conv1d(name) ? std::pair{info.shape[0], info.shape[1]}
                                : std::pair{info.shape[1], info.shape[0]};
      const std::string bias = name.substr(0, name.size() - 6) + "bias";
      row.bias = std::binary_search(names.begin(), names.end(), bias);
    }
    rows.push_back(std::move(row));
  }
  // Embeddings first, then layers in numeric order, then the rest.
  const auto rank = [](const TensorRow& row) {
    if (row.layer) return std::pair<int, index_t>{1, *row.layer};
    if (row.group == "embeddings") return std::pair<int, index_t>{0, 0};
    return std::pair<int, index_t>{row.group == "final" ? 2 : 3, 0};
  };
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const auto& a, const auto& b) { return rank(a) < rank(b); });
  return rows;
}

inline std::string shape_text(const std::vector<index_t>& shape) {
  return dissect::format_shape(std::span<const index_t>(shape));
}

inline std::string linear_text(const TensorRow& row) {
  if (!row.linear) return "-";
  return dissect::concat("[*, ", row.linear->first, "] → [*, ", row.linear->second, "]",
                         row.bias ? " + b" : "", conv1d(row.name) ? "  (Conv1D [in, out])" : "");
}

/// A layer's rows with its index blanked out: equal signatures mean equal layers.
inline std::string signature(const std::vector<const TensorRow*>& rows, index_t layer) {
  std::string text;
  const std::string index = dissect::concat(".", layer, ".");
  for (const TensorRow* row : rows) {
    std::string name = row->name;
    if (const auto at = name.find(index); at != std::string::npos)
      name.replace(at, index.size(), ".#.");
    text += name + row->dtype + shape_text(row->shape) + ";";
  }
  return text;
}

/// The budget's dtype for a stored one: dtype.hpp's row of that file name when it is a 16-bit
/// float (BF16, F16), else fp32 (F32, and F64 or any other, priced as the fp32 it loads as).
inline dissect::Dtype dtype_of(const std::string& stored) {
  const std::optional<dissect::Dtype> dtype = dissect::dtype_from_file_name(stored);
  return dtype == dissect::Dtype::bf16 || dtype == dissect::Dtype::fp16 ? *dtype
                                                                        : dissect::Dtype::fp32;
}

/// The tensors as a table, grouped by layer. Layers with the first layer's names, dtypes and
/// shapes fold into one line per run, and a run holds only consecutive indices that are present:
/// h.0, h.1, h.7 print layer 0 in full, then "layer 1 as layer 0" and "layer 7 as layer 0", each
/// with the parameters of the layers it stands for.
inline std::string layer_table(const std::vector<TensorRow>& rows,
                               const std::map<index_t, std::vector<const TensorRow*>>& layers) {
  dissect::tools::TextTable table({false, false, false, false, true, true, false});
  table.add_row(
      {"group", "tensor", "dtype", "shape", "parameters", "bytes", "linear: x → y = x·Wᵀ"});
  table.add_rule();
  std::set<index_t> repeats;
  if (!layers.empty()) {
    const auto& [first, first_rows] = *layers.begin();
    const std::string first_signature = signature(first_rows, first);
    for (const auto& [layer, layer_rows] : layers) {
      if (layer != first && signature(layer_rows, layer) == first_signature) repeats.insert(layer);
    }
  }
  const auto repeating = [&](const TensorRow& row) {
    return row.layer && repeats.contains(*row.layer);
  };
  std::string group;
  for (std::size_t i = 0; i < rows.size();) {
    if (!repeating(rows[i])) {
      const TensorRow& row = rows[i++];
      table.add_row({row.group == group ? "" : row.group, row.name, row.dtype,
                     shape_text(row.shape),
                     row.buffer ? "(buffer)" : dissect::format_count(row.parameters),
                     dissect::format_count(row.bytes), linear_text(row)});
      group = row.group;
      continue;
    }
    // Rows are sorted by layer: a run is the rows of repeating layers whose indices follow one
    // another. Its parameters are those of its rows, never a product that could overflow.
    const index_t first = *rows[i].layer;
    index_t last = first, parameters = 0;
    for (; i < rows.size() && repeating(rows[i]); ++i) {
      const index_t layer = *rows[i].layer;
      if (layer != last) {
        if (last == std::numeric_limits<index_t>::max() || layer != last + 1) break;  // a gap
        last = layer;
      }
      if (!rows[i].buffer) {
        parameters = dissect::checked_add(parameters, rows[i].parameters, "inspect: a run");
      }
    }
    const auto& [model_layer, model_rows] = *layers.begin();
    table.add_row({first == last ? dissect::concat("layer ", first)
                                 : dissect::concat("layers ", first, "–", last),
                   dissect::concat("as layer ", model_layer, " (", model_rows.size(),
                                   model_rows.size() == 1 ? " tensor each)" : " tensors each)"),
                   "", "", dissect::format_count(parameters), "", ""});
    group.clear();
  }
  return table.render();
}

struct InspectOptions {
  fs::path checkpoint;
  index_t memory = 24'000'000'000;
  std::optional<index_t> context;
  bool json = false;
  bool full = false;  ///< GGUF --json: metadata arrays whole
};

/// The parameter tensors' totals (buffers excluded), over the layers that are present.
struct Totals {
  index_t parameters = 0, bytes = 0, linear_weights = 0, linear_count = 0;
  index_t buffers = 0;
  index_t width = 0;  ///< D read from the token embedding, 0 if there is none
  std::map<std::string, index_t> dtype_bytes;
};

inline Totals totals_of(const std::vector<TensorRow>& rows) {
  constexpr std::string_view what = "inspect: totals";
  Totals t;
  for (const TensorRow& row : rows) {
    if (row.buffer) {
      ++t.buffers;
      continue;
    }
    t.parameters = dissect::checked_add(t.parameters, row.parameters, what);
    t.bytes = dissect::checked_add(t.bytes, row.bytes, what);
    t.dtype_bytes[row.dtype] = dissect::checked_add(t.dtype_bytes[row.dtype], row.bytes, what);
    if (row.linear) {
      t.linear_weights = dissect::checked_add(t.linear_weights, row.parameters, what);
      ++t.linear_count;
    }
    if (dissect::is_embedding_name(row.name) && row.shape.size() == 2 && t.width == 0) {
      t.width = row.shape[1];
    }
  }
  return t;
}

/// The stored dtype holding most of the parameters' bytes; F32 when there are none.
inline std::string main_dtype_of(const Totals& t) {
  const auto most = std::max_element(t.dtype_bytes.begin(), t.dtype_bytes.end(),
                                     [](auto& a, auto& b) { return a.second < b.second; });
  return most == t.dtype_bytes.end()
             ? std::string(dissect::dtype_info(dissect::Dtype::fp32).file_name)
             : most->first;
}

inline int inspect(const InspectOptions& o) {
  const dissect::DetectedCheckpoint source = dissect::detect_checkpoint(o.checkpoint);
  if (source.kind == dissect::CheckpointKind::gguf) {
    return dissect::tools::inspect_gguf(source, o.json, o.full);
  }
  const auto rows = tensor_rows(source.checkpoint);
  const Totals totals = totals_of(rows);
  const std::optional<dissect::text::Tokenizer> tokenizer =
      dissect::text::tokenizer_for(source).tokenizer;
  // The layers present, by index: only these are counted, grouped and printed.
  std::map<index_t, std::vector<const TensorRow*>> layers;
  for (const TensorRow& row : rows) {
    if (row.layer) layers[*row.layer].push_back(&row);
  }
  // D and L for 12·D²·L: the config's, else what the tensors show (D from the token embedding,
  // L the layers present); without either, the estimate is left out.
  const index_t d_model = source.model ? source.model->config.d_model : totals.width;
  const auto n_layers =
      source.model ? source.model->config.n_layers : static_cast<index_t>(layers.size());
  std::optional<index_t> approx;
  if (d_model > 0 && n_layers > 0) approx = dissect::try_approx_parameters(d_model, n_layers);
  std::optional<dissect::ParameterCount> count;
  std::optional<index_t> exact;
  std::optional<dissect::Budget> budget;
  if (source.model) {
    count = dissect::count_parameters(source.model->config);
    exact = count->total;
    dissect::BudgetInputs inputs;
    inputs.weight_dtype = inputs.kv_dtype = dtype_of(main_dtype_of(totals));
    inputs.context = o.context.value_or(source.model->config.context);
    inputs.memory_bytes = o.memory;
    try {
      budget = dissect::compute_budget(source.model->config, inputs);
    } catch (const dissect::Error& error) {
      // Everything else was checked; what is left is a size the flags asked for.
      throw dissect::ConfigError(dissect::concat(
          o.context ? dissect::concat("--context ", *o.context, ", --gpu-memory ", o.memory)
                    : dissect::concat("--gpu-memory ", o.memory),
          ": ", error.what()));
    }
  }

  if (o.json) {
    nlohmann::ordered_json out;
    out["checkpoint"] = source.checkpoint.path().string();
    out["kind"] = dissect::checkpoint_kind_name(source.kind);
    out["files"] = source.checkpoint.shards().size();
    out["config_source"] = source.config_source();
    if (source.model) {
      out["family"] = dissect::family_name(source.model->family);
      out["config"] = dissect::config_to_json(source.model->config);
    }
    out["tokenizer"] = tokenizer ? dissect::tools::tokenizer_json(*tokenizer) : nullptr;
    auto& tensors = out["tensors"] = nlohmann::ordered_json::array();
    for (const TensorRow& row : rows) {
      nlohmann::ordered_json t{{"name", row.name},    {"dtype", row.dtype},
                               {"shape", row.shape},  {"parameters", row.parameters},
                               {"bytes", row.bytes},  {"group", row.group},
                               {"buffer", row.buffer}};
      if (row.linear) {
        t["linear"] = {{"in", row.linear->first}, {"out", row.linear->second}, {"bias", row.bias}};
      }
      tensors.push_back(t);
    }
    out["totals"] = {
        {"parameters", totals.parameters},
        {"bytes", totals.bytes},
        {"layers", layers.size()},
        {"linear_layers", totals.linear_count},
        {"linear_weights", totals.linear_weights},
        {"approx_12_d2_l", approx ? nlohmann::ordered_json(*approx) : nullptr},
        {"exact_from_config", exact ? nlohmann::ordered_json(*exact) : nullptr},
        {"active_from_config", count ? nlohmann::ordered_json(count->active) : nullptr},
        {"experts_from_config", count ? nlohmann::ordered_json(count->experts) : nullptr}};
    if (budget && budget->memory) {
      out["budget"] = {{"memory_bytes", budget->memory->memory_bytes},
                       {"weight_dtype", dissect::dtype_name(budget->inputs.weight_dtype)},
                       {"context", budget->inputs.context},
                       {"weights_bytes", budget->weights_bytes},
                       {"kv_bytes_per_sequence", budget->kv_bytes_per_sequence},
                       {"max_sequences", budget->memory->max_sequences}};
    }
    std::cout << out.dump(2) << "\n";
    return exit_ok;
  }

  // The whole report is built first and printed at once.
  std::ostringstream report;
  report << "checkpoint  " << source.checkpoint.path().string() << " ("
         << source.checkpoint.shards().size() << " file"
         << (source.checkpoint.shards().size() == 1 ? "" : "s") << ", " << rows.size() << " tensor"
         << (rows.size() == 1 ? "" : "s") << ")\n";
  report << "kind        " << dissect::checkpoint_kind_name(source.kind) << "\n";
  report << "config      " << source.config_source() << "\n";
  if (source.model) {
    const auto& c = source.model->config;
    report << "model       " << dissect::family_name(source.model->family) << ": D = " << c.d_model
           << ", L = " << c.n_layers << ", H = " << c.n_heads << ", H_kv = " << c.kv_heads()
           << ", d_k = " << c.head_size() << ", F = " << c.d_ff << ", V = " << c.vocab
           << ", context = " << c.context
           << (c.is_moe() ? dissect::concat(", E = ", c.n_experts,
                                            " experts, k = ", c.experts_per_token, " per token")
                          : std::string())
           << (c.tied_embeddings ? ", head tied to the embedding" : "") << "\n";
  } else {
    report << "model       none recorded: the tensors alone (no config count, no budget)\n";
  }
  if (tokenizer) report << "tokenizer   " << dissect::tools::tokenizer_summary(*tokenizer) << "\n";
  report << "\n";
  if (rows.empty()) {
    report << "no tensors: the file holds "
           << (source.checkpoint.metadata().empty() ? "nothing but an empty header"
                                                    : "metadata only")
           << "\n\n";
  } else {
    report << layer_table(rows, layers) << "\n";
  }
  report << "parameters  " << dissect::format_count(totals.parameters) << " in "
         << dissect::format_count(totals.bytes) << " bytes";
  if (!rows.empty() && totals.buffers == static_cast<index_t>(rows.size())) {
    report << " (no parameter tensors: buffers only)";
  }
  if (exact) {
    report << "; the config's exact count: " << dissect::format_count(*exact)
           << (*exact == totals.parameters ? " (equal)" : " (DIFFERENT)");
  }
  report << "\n";
  if (count && count->experts > 0) {
    const double bytes_per_parameter =
        totals.parameters > 0
            ? static_cast<double>(totals.bytes) / static_cast<double>(totals.parameters)
            : 4.0;
    report << "experts     " << dissect::format_count(count->experts) << " parameters ("
           << dissect::format_count(
                  static_cast<index_t>(static_cast<double>(count->experts) * bytes_per_parameter))
           << " B) in " << source.model->config.n_experts << " × " << source.model->config.n_layers
           << " experts; active per token " << dissect::format_count(count->active) << " of "
           << dissect::format_count(count->total) << " ("
           << fixed(100.0 * static_cast<double>(count->active) / static_cast<double>(count->total),
                    1)
           << " %)\n";
  }
  if (approx) {
    report << "12·D²·L     " << dissect::format_count(*approx) << " (D = " << d_model
           << ", L = " << n_layers
           << (source.model ? "" : dissect::concat(" layer", n_layers == 1 ? "" : "s", " present"))
           << "): the layers' matrices, no embeddings, biases or norms\n";
  }
  report << "linear      " << totals.linear_count << " matrices, "
         << dissect::format_count(totals.linear_weights) << " weights\n";
  if (budget && budget->memory) {
    const auto& m = *budget->memory;
    report << "budget      " << dissect::format_count(m.memory_bytes) << " bytes of memory, "
           << dissect::dtype_name(budget->inputs.weight_dtype) << " weights ("
           << dissect::format_count(budget->weights_bytes) << " B) and KV cache, context "
           << budget->inputs.context << ": " << dissect::format_count(budget->kv_bytes_per_sequence)
           << " B of KV per sequence, " << dissect::format_count(m.max_sequences)
           << " sequences fit\n";
  }
  std::cout << report.str();
  return exit_ok;
}

}  // namespace detail_inspect

/// `dissect inspect` and its flags.
class InspectCommand final : public Command {
 public:
  explicit InspectCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "inspect",
            "every tensor grouped by layer, the linear layers' shapes, totals and a budget")) {
    CLI::App* inspect_command = &this->app();
    inspect_command
        ->add_option("checkpoint", options_.checkpoint,
                     ".safetensors file, index .json, a directory, or a .gguf file")
        ->required();
    inspect_command
        ->add_option("--gpu-memory", memory_, "device memory for the budget (24GB, 80GiB)")
        ->capture_default_str();
    inspect_command->add_option(
        "--context", context_,
        "tokens per sequence in the KV cache (default: the model's context)");
    auto* inspect_json =
        inspect_command->add_flag("--json", options_.json, "machine-readable output");
    inspect_command
        ->add_flag("--full", options_.full,
                   "with --json, a GGUF file's metadata arrays whole (default: the first 16 "
                   "elements and the length)")
        ->needs(inspect_json);
  }

  int run() override {
    options_.memory = parse_bytes(memory_, "--gpu-memory");
    if (context_) options_.context = parse_count(*context_, "--context");
    return detail_inspect::inspect(options_);
  }

 private:
  detail_inspect::InspectOptions options_;
  std::string memory_ = "24GB";
  std::optional<std::string> context_;
};

}  // namespace dissect::tools
