// tools/dissect/dissect.cpp — the `dissect` command: take a checkpoint apart, or run it.
//
//   dissect inspect CHECKPOINT [--gpu-memory 24GB] [--context T] [--json]
//   dissect inspect FILE.gguf [--json [--full]]
//   dissect generate CHECKPOINT|FILE.gguf (--prompt TEXT | --tokens 464,2068,…) [--ids]
//                    [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]
//                    [--repetition-penalty R] [--frequency-penalty F] [--presence-penalty P]
//                    [--seed S] [--num-beams N [--length-penalty X] [--num-return-sequences K]]
//                    [--draft CHECKPOINT [--gamma N]]
//                    [--threads N] [--no-pack]
//   dissect quantize IN OUT --format bf16|int8|q4
//   dissect quantize IN.gguf OUT.gguf --format q8_0|q4_0|q6_k|q4_k_m|q5_k_m
//   dissect convert IN.gguf OUT_DIR [--type f32|f16|bf16]
//   dissect convert CHECKPOINT OUT.gguf [--type f32|f16|bf16|q8_0|…] [--no-tokenizer]
//   dissect tokenize --tokenizer (FILE | DIR | FILE.gguf) (--text T | --file F | --decode 1,2,3)
//                    [--no-special] [--json]
//   dissect template MODEL_OR_TOKENIZER --messages FILE.json [--add-generation-prompt]
//                    [--tools FILE.json] [--template NAME] [--var KEY=VALUE]…
//   dissect serve CHECKPOINT|FILE.gguf [--host 127.0.0.1] [--port 8080] [--threads 4] [--name N]
//                 [--allow-remote]
//
// A checkpoint directory's tokenizer.json (or GPT-2's vocab.json + merges.txt) turns --prompt
// into ids (BOS as the tokenizer says) and the new ids back into streamed text
// (text_commands.hpp); a file dissect's train_gpt wrote carries its byte vocabulary instead.
//
// CHECKPOINT is a .safetensors file, a sharded checkpoint's index .json, or a directory holding
// either (with a Hugging Face config.json beside them, or a file dissect's save_model wrote,
// whose metadata holds its config): io/open_model.hpp's detect_checkpoint tells which, and
// io/hf_names.hpp says what Hugging Face's tensor names mean. All parsing, arithmetic and
// loading live in the library (io/, count.hpp, budget.hpp, models/); this file reads flags and
// prints.
// Every flag is read and checked before any file is opened (and what the model's config decides,
// a token id against the vocabulary or the prompt's length against the context, before its weights
// load), so a command that cannot run prints nothing on stdout. `inspect` reads any safetensors
// file: without a config it lists the tensors and leaves out what it cannot infer.
// Exit status: 0 ok; 2 bad input (a flag, a missing or corrupt file, a config dissect cannot
// build); 1 anything else.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "dissect/accounting/budget.hpp"
#include "dissect/accounting/count.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/gguf_model_writer.hpp"
#include "dissect/io/gguf_quantize.hpp"
#include "dissect/io/gguf_weights.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/hf_names.hpp"
#include "dissect/io/hf_writer.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/models/beam_search.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/models/speculative_decoding.hpp"
#include "dissect/text/gguf_tokenizer.hpp"
#include "dissect/text/gguf_tokenizer_metadata.hpp"
#include "tools/common/byte_vocab.hpp"
#include "tools/common/parse.hpp"
#include "tools/common/table.hpp"
#include "tools/dissect/gguf_commands.hpp"
#include "tools/dissect/model_loading.hpp"
#ifdef DISSECT_SERVE
#include "tools/dissect/serve_command.hpp"
#endif
#include "tools/dissect/template_command.hpp"
#include "tools/dissect/text_commands.hpp"

namespace {

using dissect::index_t;
namespace fs = std::filesystem;

constexpr int exit_ok = 0;
constexpr int exit_other = 1;
constexpr int exit_bad_input = 2;

// ---- inspect ------------------------------------------------------------------------------------

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
bool conv1d(std::string_view name) {
  const bool adapter = name.find(".lora_A.") != std::string_view::npos ||
                       name.find(".lora_B.") != std::string_view::npos;
  return dissect::is_conv1d_weight(name) && !adapter;
}

std::vector<TensorRow> tensor_rows(const dissect::Checkpoint& checkpoint) {
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

std::string shape_text(const std::vector<index_t>& shape) {
  return dissect::format_shape(std::span<const index_t>(shape));
}

std::string linear_text(const TensorRow& row) {
  if (!row.linear) return "-";
  return dissect::concat("[*, ", row.linear->first, "] → [*, ", row.linear->second, "]",
                         row.bias ? " + b" : "", conv1d(row.name) ? "  (Conv1D [in, out])" : "");
}

/// A layer's rows with its index blanked out: equal signatures mean equal layers.
std::string signature(const std::vector<const TensorRow*>& rows, index_t layer) {
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

dissect::Dtype dtype_of(const std::string& stored) {
  if (stored == "BF16") return dissect::Dtype::bf16;
  if (stored == "F16") return dissect::Dtype::fp16;
  return dissect::Dtype::fp32;  // F32 (and F64, priced as the fp32 it loads as)
}

/// The tensors as a table, grouped by layer. Layers with the first layer's names, dtypes and
/// shapes fold into one line per run, and a run holds only consecutive indices that are present:
/// h.0, h.1, h.7 print layer 0 in full, then "layer 1 as layer 0" and "layer 7 as layer 0", each
/// with the parameters of the layers it stands for.
std::string layer_table(const std::vector<TensorRow>& rows,
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

Totals totals_of(const std::vector<TensorRow>& rows) {
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
std::string main_dtype_of(const Totals& t) {
  const auto most = std::max_element(t.dtype_bytes.begin(), t.dtype_bytes.end(),
                                     [](auto& a, auto& b) { return a.second < b.second; });
  return most == t.dtype_bytes.end() ? std::string("F32") : most->first;
}

/// `value` with `decimals` digits after the point.
std::string fixed(double value, int decimals) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(decimals) << value;
  return out.str();
}

int inspect(const InspectOptions& o) {
  if (dissect::tools::is_gguf_file(o.checkpoint)) {
    return dissect::tools::inspect_gguf(o.checkpoint, o.json, o.full);
  }
  const dissect::DetectedCheckpoint source = dissect::detect_checkpoint(o.checkpoint);
  const auto rows = tensor_rows(source.checkpoint);
  const Totals totals = totals_of(rows);
  const std::optional<dissect::text::Tokenizer> tokenizer =
      dissect::tools::checkpoint_tokenizer(o.checkpoint, source.checkpoint.metadata());
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

// ---- generate -----------------------------------------------------------------------------------

/// generate's flags, each already read and range-checked (run does it before any file opens).
struct GenerateOptions {
  fs::path checkpoint;
  std::optional<std::string> prompt;
  std::optional<std::string> tokens;  ///< as given; its syntax is checked, the vocabulary later
  index_t max_new_tokens = 64;
  /// temperature 0.8 unless --temperature says otherwise; the other fields as the flags give them
  dissect::SamplingOptions sampling{.temperature = 0.8};
  std::uint64_t seed = 0;
  bool print_ids = false;  ///< --ids: the prompt's and the new tokens' ids, not their text
  index_t num_beams = 0;   ///< --num-beams: 0 samples; N >= 1 runs beam search instead
  double length_penalty = 1.0;
  index_t num_return_sequences = 1;
  std::optional<fs::path> draft;  ///< --draft: speculative decoding with this model proposing
  index_t gamma = 4;              ///< --gamma: its proposals per round
  /// --threads: the threads every product may use; 0 leaves OpenMP's default (OMP_NUM_THREADS,
  /// else one per core).
  index_t threads = 0;
  bool no_pack = false;  ///< --no-pack: float weights stay as loaded, without a packed copy
  /// When generate began (before any file opened): the load's time is printed with the rates.
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

/// The threads the products run on after --threads, and where the count came from.
std::string thread_report(index_t asked) {
#ifdef _OPENMP
  return dissect::concat(omp_get_max_threads(), " (OpenMP; ",
                         asked > 0 ? "--threads" : "OMP_NUM_THREADS or the cores", ")");
#else
  (void)asked;
  return "1 (this build has no OpenMP)";
#endif
}

/// The ids of `text` in a byte vocabulary (train_gpt's checkpoints).
/// @throws ConfigError naming --prompt and the first byte the vocabulary lacks.
std::vector<index_t> encode(const dissect::tools::ByteVocab& vocab, const std::string& text) {
  std::vector<index_t> ids;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const index_t id = vocab.id_of[static_cast<unsigned char>(text[i])];
    if (id < 0) {
      throw dissect::ConfigError(dissect::concat(
          "--prompt: byte ", i, " (", static_cast<int>(static_cast<unsigned char>(text[i])),
          ") is not in the model's vocabulary"));
    }
    ids.push_back(id);
  }
  return ids;
}

/// The prompt's ids, checked against the model before it is loaded: every id inside the
/// vocabulary, 1 to context of them. @throws ConfigError naming --prompt or --tokens.
std::vector<index_t> prompt_ids(const GenerateOptions& o, const dissect::TransformerConfig& config,
                                const std::optional<dissect::tools::ByteVocab>& vocab,
                                const std::optional<dissect::text::Tokenizer>& tokenizer) {
  std::vector<index_t> ids;
  std::string_view flag = "--tokens";
  if (o.prompt) {
    flag = "--prompt";
    if (vocab) {
      ids = encode(*vocab, *o.prompt);
    } else if (tokenizer) {
      try {
        for (const std::int32_t id : tokenizer->encode(*o.prompt)) ids.push_back(id);
      } catch (const dissect::Error& error) {
        throw dissect::ConfigError(dissect::concat("--prompt: ", error.what()));
      }
    } else {
      throw dissect::ConfigError(
          "--prompt: this checkpoint carries no vocabulary and its directory holds no "
          "tokenizer.json "
          "(or vocab.json + merges.txt); give token ids with --tokens");
    }
    for (std::size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] >= config.vocab) {
        throw dissect::ConfigError(dissect::concat("--prompt: token ", i, " has id ", ids[i],
                                                   ", outside the model's vocabulary [0, ",
                                                   config.vocab, ")"));
      }
    }
  } else {
    ids = dissect::tools::parse_token_ids(*o.tokens, "--tokens", config.vocab);
  }
  const auto length = static_cast<index_t>(ids.size());
  if (length == 0) throw dissect::ConfigError(dissect::concat(flag, ": the prompt is empty"));
  if (length > config.context) {
    throw dissect::ConfigError(dissect::concat(
        flag, ": ", length, " tokens; the model's context holds at most ", config.context));
  }
  return ids;
}

/// The formats of a quantised weight: one, or one per run of rows stacked from ggml formats.
std::vector<dissect::WeightFormat> layer_formats(const dissect::QuantizedWeight& weight) {
  std::vector<dissect::WeightFormat> formats;
  for (const auto& run : weight.ggml_rows()) {
    if (std::find(formats.begin(), formats.end(), run.format) == formats.end()) {
      formats.push_back(run.format);
    }
  }
  if (formats.empty()) formats.push_back(weight.format());
  return formats;
}

/// --num-beams: the prompt once, then each of the n best continuations on a line of its own
/// with its score, as text (after the prompt, so the tokenizer decodes it in context) or ids.
template <class Model>
int run_beam_search(const Model& model, const std::vector<index_t>& prompt,
                    const std::optional<dissect::tools::ByteVocab>& vocab,
                    const std::optional<dissect::text::Tokenizer>& tokenizer,
                    const GenerateOptions& o) {
  const auto result = dissect::beam_search(model, prompt,
                                           {.num_beams = o.num_beams,
                                            .length_penalty = o.length_penalty,
                                            .max_new_tokens = o.max_new_tokens,
                                            .num_return_sequences = o.num_return_sequences});
  const bool as_text = !o.print_ids && (vocab || tokenizer);
  const auto text_of = [&](const std::vector<index_t>& ids, bool first) {
    std::string text;
    if (as_text && vocab) {
      for (const index_t id : ids) {
        text += id < static_cast<index_t>(vocab->bytes.size())
                    ? static_cast<char>(vocab->bytes[static_cast<std::size_t>(id)])
                    : '?';
      }
    } else if (as_text) {
      dissect::text::DecodeStream stream(*tokenizer);
      for (const index_t id : prompt) (void)stream.push(static_cast<std::int32_t>(id));
      for (const index_t id : ids) text += stream.push(static_cast<std::int32_t>(id));
      text += stream.finish();
    } else {
      for (std::size_t i = 0; i < ids.size(); ++i) {
        text += (first && i == 0 ? "" : ",") + std::to_string(ids[i]);
      }
    }
    return text;
  };
  std::cout << (o.prompt && !o.print_ids ? *o.prompt : text_of(prompt, true)) << "\n";
  for (std::size_t i = 0; i < result.sequences.size(); ++i) {
    std::cout << "beam " << i + 1 << "  score " << result.sequences[i].score << "  "
              << text_of(result.sequences[i].tokens, false) << "\n";
  }
  std::cout << "\n"
            << result.steps << " forwards of " << o.num_beams << " beams"
            << (result.stopped_at_context ? " (stopped: the context is full)" : "") << "\n";
  return exit_ok;
}

/// Samples (or, with a draft, decodes speculatively), streaming the tokens, then the speed.
template <class Model, class Draft = std::nullptr_t>
int run_generation(const Model& model, const std::vector<index_t>& prompt,
                   const std::optional<dissect::tools::ByteVocab>& vocab,
                   const std::optional<dissect::text::Tokenizer>& tokenizer,
                   const GenerateOptions& o, bool packed = false,
                   [[maybe_unused]] const Draft* draft = nullptr) {
  if (o.num_beams > 0) return run_beam_search(model, prompt, vocab, tokenizer, o);
  // With a tokenizer, new ids print as text as soon as they complete a character; the prompt
  // goes through the stream first, so that decoders that look at context (LLaMA's first-space
  // Strip) treat the continuation as the middle of the text it is.
  std::optional<dissect::text::DecodeStream> stream;
  if (!vocab && tokenizer && !o.print_ids) {
    stream.emplace(*tokenizer);
    std::string prompt_text;
    for (const index_t id : prompt) prompt_text += stream->push(static_cast<std::int32_t>(id));
    if (!o.prompt) std::cout << prompt_text;
  }
  if (o.prompt && !o.print_ids) {
    std::cout << *o.prompt;
  } else if (!stream) {
    for (std::size_t i = 0; i < prompt.size(); ++i) std::cout << (i ? "," : "") << prompt[i];
  }
  std::cout.flush();
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - o.started).count();
  const auto show = [&](index_t id) {
    if (stream && id < static_cast<index_t>(tokenizer->vocab_size())) {
      std::cout << stream->push(static_cast<std::int32_t>(id));
    } else if (vocab && !o.print_ids && id < static_cast<index_t>(vocab->bytes.size())) {
      std::cout << static_cast<char>(vocab->bytes[static_cast<std::size_t>(id)]);
    } else {
      std::cout << ',' << id;
    }
    std::cout.flush();
  };
  // How many threads the products ran on, and what loading cost.
  const auto print_setup = [&] {
    std::cout << "cpu      " << dissect::cpu_model_name() << " (kernel paths:";
    for (const auto path : dissect::supported_kernel_paths()) {
      std::cout << " " << dissect::kernel_path_name(path);
    }
    std::cout << ")\n"
              << "threads  " << thread_report(o.threads) << "\n"
              << "load     " << load_seconds << " s (the file read, the model built"
              << (packed ? " and packed" : "") << ")\n";
  };
  if constexpr (!std::is_same_v<Draft, std::nullptr_t>) {
    const auto result = dissect::speculative_generate(model, *draft, prompt,
                                                      {.gamma = o.gamma,
                                                       .max_new_tokens = o.max_new_tokens,
                                                       .sampling = o.sampling,
                                                       .seed = o.seed},
                                                      show);
    if (stream) std::cout << stream->finish();
    const auto& stats = result.stats;
    std::cout << "\n\nspeculative  " << stats.new_tokens << " tokens in " << stats.seconds
              << " s (prefill included), " << stats.tokens_per_second() << " tokens/s"
              << (stats.stopped_at_context ? " (stopped: the context is full)" : "") << "\n"
              << "draft        " << stats.accepted << " of " << stats.proposed
              << " proposals accepted (" << 100 * stats.acceptance_rate() << " %), gamma "
              << o.gamma << "; " << stats.target_forwards << " target forwards, "
              << stats.draft_forwards << " draft forwards\n";
    print_setup();
    return exit_ok;
  }
  const dissect::GenerationOptions options{
      .max_new_tokens = o.max_new_tokens, .sampling = o.sampling, .seed = o.seed};
  const auto stats = dissect::generate(model, prompt, options, show);
  if (stream) std::cout << stream->finish();
  std::cout << "\n\nprefill  " << stats.prompt_tokens << " prompt tokens (and the first new one), "
            << stats.prefill_tokens_per_second() << " tokens/s\n"
            << "decode   " << std::max<index_t>(stats.new_tokens - 1, 0) << " tokens, "
            << stats.decode_tokens_per_second() << " tokens/s"
            << (stats.stopped_at_context ? " (stopped: the context is full)" : "") << "\n"
            << "total    " << stats.new_tokens << " tokens in "
            << stats.prefill_seconds + stats.decode_seconds << " s (prefill included), "
            << (stats.prefill_seconds + stats.decode_seconds > 0
                    ? static_cast<double>(stats.new_tokens) /
                          (stats.prefill_seconds + stats.decode_seconds)
                    : 0.0)
            << " tokens/s\n";
  if constexpr (std::is_same_v<typename Model::scalar_type, float>) {
    // Which storage each layer's forward read, and the kernel path its format ran on.
    std::map<std::string, int> layers;
    dissect::for_each_layer(model, [&](const std::string&, const dissect::Linear<float>& layer) {
      if (!layer.quantized()) {
        // Packed: the model's products (its FFN's gate and up fused into one) read packed W.
        ++layers[packed ? "fp32 packed" : "fp32"];
        return;
      }
      for (const auto format : layer_formats(layer.quantized_weight())) {
        ++layers[dissect::concat(dissect::weight_format_name(format), " on ",
                                 dissect::kernel_path_name(dissect::quant::active_kernel_path(
                                     format, stats.prompt_tokens)))];
      }
    });
    std::cout << "weights ";
    for (const auto& [what, count] : layers) std::cout << " " << what << " ×" << count;
    std::cout << "\n";
  }
  print_setup();
  return exit_ok;
}

int generate(GenerateOptions o) {
  o.started = std::chrono::steady_clock::now();
  // Inference: the models are built without gradient buffers (as large as their weights) and
  // without the random values the file overwrites.
  const dissect::ConstructionScope inference({.gradients = false});
  std::vector<index_t> prompt;
  // The draft proposes the model's own ids: its config (and byte vocabulary, if it records one)
  // is checked with the model's, before either model's weights load.
  std::optional<dissect::DetectedCheckpoint> draft_source;
  // Everything the model's config decides (the prompt's ids against its vocabulary and context)
  // is checked before the weights load.
  const auto check = [&](const dissect::tools::ModelText& text) {
    if (o.prompt && !text.tokenizer && !text.tokenizer_error.empty()) {
      // A GGUF tokenizer dissect does not implement stops --prompt; --tokens prints ids instead.
      throw dissect::ConfigError(dissect::concat("--prompt: ", text.tokenizer_error));
    }
    if (o.prompt && text.gguf && !text.tokenizer) {
      throw dissect::ConfigError(dissect::concat("--prompt: ", o.checkpoint.string(),
                                                 " carries no tokenizer (tokenizer.ggml.model); "
                                                 "give token ids with --tokens"));
    }
    prompt = prompt_ids(o, text.config, text.vocab, text.tokenizer);
    if (!o.draft) return;
    if (text.gguf || dissect::tools::is_gguf_file(*o.draft)) {
      throw dissect::ConfigError(
          "--draft: speculative decoding reads safetensors checkpoints, not GGUF files");
    }
    draft_source.emplace(dissect::detect_checkpoint(*o.draft));
    const dissect::index_t draft_vocab = draft_source->require_model("--draft").config.vocab;
    if (draft_vocab != text.config.vocab) {
      throw dissect::ConfigError(
          dissect::concat("--draft: ", o.draft->string(), " has a vocabulary of ", draft_vocab,
                          " tokens, the model's has ", text.config.vocab,
                          " (the draft must propose the model's token ids)"));
    }
    const auto draft_bytes = dissect::tools::ByteVocab::from_metadata(
        draft_source->checkpoint.metadata(), draft_source->checkpoint.path().string());
    if (text.vocab.has_value() != draft_bytes.has_value() ||
        (text.vocab && text.vocab->bytes != draft_bytes->bytes)) {
      throw dissect::ConfigError(dissect::concat(
          "--draft: ", o.draft->string(),
          "'s byte vocabulary differs from the model's (the same ids would be other bytes)"));
    }
  };
  return dissect::tools::with_model(
      o.checkpoint, "generate", check, [&](auto& model, const dissect::tools::ModelText& text) {
        const bool packed = !o.no_pack && dissect::tools::pack_for_inference(model);
        if (!draft_source) {
          return run_generation(model, prompt, text.vocab, text.tokenizer, o, packed);
        }
        return dissect::visit_model(
            *draft_source,
            [&](const auto& draft) {
              return run_generation(model, prompt, text.vocab, text.tokenizer, o, packed, &draft);
            },
            "--draft");
      });
}

// ---- quantize -----------------------------------------------------------------------------------

struct QuantizeOptions {
  fs::path input, output;
  dissect::WeightFormat format = dissect::WeightFormat::int8;
  std::optional<dissect::GgufRecipe> recipe;  ///< set: GGUF in, GGUF out, llama.cpp's recipe
  bool force = false;  ///< round a float model to ternary (tq2_0) weights even so
};

/// What rounding a model's weights costs: their relative error ‖W − Ŵ‖/‖W‖ over every quantised
/// layer, and the mean KL divergence of the rounded model's next-token distribution from the
/// float model's over a fixed probe sequence (ids 7i + 1 mod V, as long as the context allows,
/// at most 64).
struct RoundingCost {
  double weight_error = 0;
  double kl = 0;
};

template <class Model>
std::vector<index_t> probe_ids(const Model& model) {
  const auto& c = model.config();
  std::vector<index_t> ids(static_cast<std::size_t>(std::min<index_t>(c.context, 64)));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<index_t>((7 * i + 1) % static_cast<std::size_t>(c.vocab));
  }
  return ids;
}

/// Mean over positions of KL(softmax(reference) ‖ softmax(rounded)), in nats.
template <class Logits>
double mean_kl(const Logits& reference, const Logits& rounded) {
  const index_t positions = reference.shape()[1], vocab = reference.shape()[2];
  double total = 0;
  for (index_t t = 0; t < positions; ++t) {
    const auto* p = reference.data() + t * vocab;
    const auto* q = rounded.data() + t * vocab;
    double p_max = p[0], q_max = q[0];
    for (index_t v = 1; v < vocab; ++v) p_max = std::max<double>(p_max, p[v]);
    for (index_t v = 1; v < vocab; ++v) q_max = std::max<double>(q_max, q[v]);
    double p_sum = 0, q_sum = 0;
    for (index_t v = 0; v < vocab; ++v) p_sum += std::exp(p[v] - p_max);
    for (index_t v = 0; v < vocab; ++v) q_sum += std::exp(q[v] - q_max);
    const double p_log = p_max + std::log(p_sum), q_log = q_max + std::log(q_sum);
    for (index_t v = 0; v < vocab; ++v) {
      const double log_p = p[v] - p_log;
      total += std::exp(log_p) * (log_p - (q[v] - q_log));
    }
  }
  return total / static_cast<double>(positions);
}

template <class Model>
int run_quantize(Model& model, const dissect::DetectedCheckpoint& source,
                 dissect::WeightFormat format, const QuantizeOptions& o) {
  const auto float_bytes = dissect::linear_weight_bytes(model);
  const bool ternary = format == dissect::WeightFormat::tq2_0;
  // Ternary weights are trained, not rounded: measure what rounding costs before deciding.
  std::map<std::string, std::vector<double>> before;
  std::optional<dissect::Tensor<typename Model::scalar_type, 3>> float_logits;
  const std::vector<index_t> probe = probe_ids(model);
  if (ternary) {
    model.for_each_parameter([&](const dissect::ParameterName& name, auto value, auto) {
      if constexpr (dissect::rank_of<decltype(value)> == 2) {
        before[name.str()].assign(value.begin(), value.end());
      }
    });
    float_logits = model.forward(dissect::TokenBatch{probe, 1, static_cast<index_t>(probe.size())});
  }
  const auto layers = dissect::quantize_model(model, format);
  std::optional<RoundingCost> cost;
  if (ternary) {
    double error = 0, norm = 0;
    for (const std::string& layer : layers) {
      const std::vector<double>& original = before.at(layer + ".weight");
      std::size_t i = 0;
      model.for_each_parameter([&](const dissect::ParameterName& name, auto value, auto) {
        if (name.str() != layer + ".weight") return;
        for (const auto rounded : value) {
          error += (rounded - original[i]) * (rounded - original[i]);
          norm += original[i] * original[i];
          ++i;
        }
      });
    }
    const auto rounded_logits =
        model.forward(dissect::TokenBatch{probe, 1, static_cast<index_t>(probe.size())});
    cost = RoundingCost{norm > 0 ? std::sqrt(error / norm) : 0.0,
                        mean_kl(*float_logits, rounded_logits)};
    // A model trained ternary (BitLinear, transforms::use_bitlinear) rounds with no error.
    if (!o.force && cost->weight_error > 1e-3) {
      throw dissect::ConfigError(dissect::concat(
          "quantize --format tq2_0: ", o.input.string(),
          " holds float weights, not ternary ones: rounding them to {-1, 0, +1}·d loses ",
          fixed(100.0 * cost->weight_error, 1),
          " % of their norm and moves the "
          "next-token distribution by ",
          fixed(cost->kl, 3),
          " nats (mean KL on a probe sequence). Ternary weights are trained (BitLinear, "
          "transforms::use_bitlinear), not rounded; --force rounds anyway"));
    }
  }
  // A dissect file's own metadata (a vocabulary, say) goes along; save_model rewrites the rest.
  std::map<std::string, std::string> metadata;
  if (source.kind != dissect::CheckpointKind::hugging_face) {
    metadata = source.checkpoint.metadata();
    metadata.erase(dissect::quantization_key);
  }
  dissect::save_model(o.output, model, metadata);
  const auto bytes = dissect::linear_weight_bytes(model);
  std::cout << "quantized   " << layers.size() << " linear layers to "
            << dissect::weight_format_name(format) << " (embeddings, norms and biases stay fp32)\n"
            << "weights     " << dissect::format_count(float_bytes) << " B → "
            << dissect::format_count(bytes) << " B ("
            << static_cast<double>(float_bytes) / static_cast<double>(bytes) << "× smaller)\n"
            << "file        " << o.output.string() << ", "
            << dissect::format_count(static_cast<index_t>(fs::file_size(o.output))) << " B\n";
  if (cost) {
    std::cout << "rounding    ‖W − Ŵ‖/‖W‖ = " << fixed(100.0 * cost->weight_error, 2)
              << " %, mean KL(float ‖ ternary) = " << fixed(cost->kl, 4) << " nats over "
              << probe.size() << " probe tokens (--force: a float model "
              << "rounded, not trained, to ternary)\n";
  }
  return exit_ok;
}

// The output must not be a file the checkpoint was read from: the input would be gone (or, for
// a shard of a sharded checkpoint, the checkpoint left half replaced) when the write lands.
void refuse_overwriting_the_input(const dissect::DetectedCheckpoint& source, const fs::path& out,
                                  std::string_view op) {
  std::vector<fs::path> inputs = {source.checkpoint.path()};
  for (const auto& shard : source.checkpoint.shards()) inputs.push_back(shard.path());
  if (!source.config_file.empty()) inputs.push_back(source.config_file);
  for (const auto& input : inputs) {
    if (dissect::io::same_file(input, out)) {
      throw dissect::ConfigError(dissect::concat(op, ": output ", out.string(), " is ",
                                                 input.string(),
                                                 ", which the checkpoint is read from"));
    }
  }
}

// GGUF to GGUF, as llama.cpp's llama_model_quantize writes it (io/gguf_quantize.hpp).
int quantize_gguf_file(const QuantizeOptions& o) {
  if (dissect::io::same_file(o.input, o.output)) {
    throw dissect::ConfigError(
        dissect::concat("quantize: output ", o.output.string(), " is the input file"));
  }
  const dissect::GgufFile in(o.input);
  dissect::quantize_gguf(in, o.output, *o.recipe);
  const dissect::GgufFile out(o.output);
  std::map<std::string, index_t> types;
  for (const dissect::GgufTensorInfo& info : out.tensors()) {
    ++types[dissect::ggml_type_name(info.type)];
  }
  std::cout << "quantized   " << o.input.string() << " by llama.cpp's "
            << dissect::gguf_recipe_name(*o.recipe) << " recipe (general.file_type "
            << dissect::gguf_recipe_file_type(*o.recipe) << "):";
  for (const auto& [type, count] : types) std::cout << " " << count << " " << type;
  std::cout << "\nfile        " << o.output.string() << ", "
            << dissect::format_count(static_cast<index_t>(fs::file_size(o.output))) << " B (was "
            << dissect::format_count(static_cast<index_t>(fs::file_size(o.input))) << " B)\n";
  return exit_ok;
}

int quantize(const QuantizeOptions& o) {
  if (o.recipe) return quantize_gguf_file(o);
  // Quantising freezes every layer: gradient buffers would only take memory.
  const dissect::ConstructionScope no_gradients({.gradients = false});
  const dissect::DetectedCheckpoint source = dissect::detect_checkpoint(o.input);
  refuse_overwriting_the_input(source, o.output, "quantize");
  return dissect::visit_model(
      source, [&](auto& model) { return run_quantize(model, source, o.format, o); }, "quantize");
}

// ---- convert ------------------------------------------------------------------------------------

struct ConvertOptions {
  fs::path input, output;
  std::string type = "f32";   ///< GGUF out: a ggml type; Hugging Face out: f32, f16 or bf16
  bool no_tokenizer = false;  ///< GGUF out: leave a tokenizer.json beside the checkpoint out
};

// A GGUF file to a Hugging Face directory (io/hf_writer.hpp), or any checkpoint dissect reads to
// a GGUF file (io/gguf_model_writer.hpp).
int convert(const ConvertOptions& o) {
  const bool gguf_out = o.output.extension() == ".gguf";
  if (dissect::tools::is_gguf_file(o.input)) {
    if (gguf_out) {
      throw dissect::ConfigError(
          "convert: GGUF to GGUF is `dissect quantize IN.gguf OUT.gguf --format RECIPE`");
    }
    std::optional<dissect::SaveDtype> dtype;
    if (o.type == "f16") dtype = dissect::SaveDtype::f16;
    if (o.type == "bf16") dtype = dissect::SaveDtype::bf16;
    if (!dtype && o.type != "f32") {
      throw dissect::ConfigError(dissect::concat(
          "--type: a Hugging Face checkpoint is written as f32, f16 or bf16, not \"", o.type,
          "\""));
    }
    const dissect::GgufFile file(o.input);
    const dissect::HfConfig model = dissect::read_gguf_config(file);
    dissect::GgufLoadOptions dense;  // the checkpoint is written from the float weights alone
    dense.keep_quantized = false;
    if (model.family == dissect::ModelFamily::llama) {
      dissect::save_hf_checkpoint(
          o.output, dissect::load_gguf_model<dissect::LlamaModel<float>>(file, dense), dtype);
    } else {
      dissect::save_hf_checkpoint(
          o.output, dissect::load_gguf_model<dissect::GPT2Model<float>>(file, dense), dtype);
    }
    std::cout << "converted   " << o.input.string() << " (" << dissect::family_name(model.family)
              << ", " << file.tensors().size() << " tensors) to a Hugging Face checkpoint\n"
              << "wrote       " << (o.output / dissect::hf_config_file).string() << ", "
              << (o.output / "model.safetensors").string() << " ("
              << (dtype ? dissect::save_dtype_name(*dtype) : "F32") << ")\n";
    return exit_ok;
  }
  if (!gguf_out) {
    throw dissect::ConfigError(
        dissect::concat("convert: ", o.input.string(),
                        " is not a GGUF file, so the output is one: name it OUT.gguf"));
  }
  dissect::GgmlType type;
  try {
    type = dissect::ggml_type_from_name(o.type);
  } catch (const dissect::Error& error) {
    throw dissect::ConfigError(dissect::concat("--type: ", error.what()));
  }
  const dissect::DetectedCheckpoint source = dissect::detect_checkpoint(o.input);
  refuse_overwriting_the_input(source, o.output, "convert");
  const dissect::HfConfig& recorded = source.require_model("convert");
  // The tokenizer.json beside the checkpoint, as llama.cpp's converter writes it into the file.
  std::error_code error;
  const fs::path dir = fs::is_directory(o.input, error) ? o.input : o.input.parent_path();
  const fs::path tokenizer_json = (dir.empty() ? fs::path(".") : dir) / "tokenizer.json";
  dissect::GgufModelOptions options{.type = type, .name = o.input.stem().string(), .tokenizer = {}};
  const bool carry = !o.no_tokenizer && fs::is_regular_file(tokenizer_json, error);
  if (carry) {
    options.tokenizer =
        dissect::text::gguf_tokenizer_metadata(tokenizer_json, recorded.config.vocab);
  }
  dissect::visit_model(
      source,
      [&](const auto& model) {
        dissect::save_gguf_model(o.output, model, options);
        return exit_ok;
      },
      "convert");
  std::cout << "converted   " << o.input.string() << " (" << dissect::family_name(recorded.family)
            << ") to GGUF, matrices " << dissect::ggml_type_name(type)
            << ", norms and biases f32\n";
  if (carry) {
    const auto& model_name = std::get<std::string>(options.tokenizer.front().second.storage());
    std::cout << "tokenizer   " << tokenizer_json.string() << " (" << model_name;
    for (const auto& [key, value] : options.tokenizer) {
      if (key == "tokenizer.ggml.pre") std::cout << ", pre " << *value.as_string();
    }
    std::cout << ")\n";
  } else {
    std::cout << "tokenizer   none (tokenizer.ggml.model \"none\": dissect generate --tokens runs "
                 "it; llama.cpp wants a vocabulary)\n";
  }
  std::cout << "file        " << o.output.string() << ", "
            << dissect::format_count(static_cast<index_t>(fs::file_size(o.output))) << " B\n";
  return exit_ok;
}

// ---- main ---------------------------------------------------------------------------------------

int run(int argc, char** argv) {
  CLI::App app{"dissect: take a language-model checkpoint apart, or run it"};
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 ok; 2 bad input (a flag, a missing or corrupt file, a config dissect "
      "cannot build); 1 any other failure.");

  // Values are read as text and parsed by tools/common/parse.hpp after the command line is
  // read, and before any file is opened: every flag's error names it, and nothing is loaded or
  // printed for a command that cannot run.
  InspectOptions inspect_options;
  auto* inspect_command = app.add_subcommand(
      "inspect", "every tensor grouped by layer, the linear layers' shapes, totals and a budget");
  inspect_command
      ->add_option("checkpoint", inspect_options.checkpoint,
                   ".safetensors file, index .json, a directory, or a .gguf file")
      ->required();
  std::string memory = "24GB";
  inspect_command->add_option("--gpu-memory", memory, "device memory for the budget (24GB, 80GiB)")
      ->capture_default_str();
  std::optional<std::string> context;
  inspect_command->add_option("--context", context,
                              "tokens per sequence in the KV cache (default: the model's context)");
  auto* inspect_json =
      inspect_command->add_flag("--json", inspect_options.json, "machine-readable output");
  inspect_command
      ->add_flag("--full", inspect_options.full,
                 "with --json, a GGUF file's metadata arrays whole (default: the first 16 "
                 "elements and the length)")
      ->needs(inspect_json);

  GenerateOptions generate_options;
  auto* generate_command =
      app.add_subcommand("generate", "continue a prompt, streaming tokens, then tokens/s");
  generate_command
      ->add_option("checkpoint", generate_options.checkpoint,
                   ".safetensors file, index .json, or a directory")
      ->required();
  auto* prompt = generate_command->add_option(
      "--prompt", generate_options.prompt,
      "text (the checkpoint's tokenizer.json or vocab.json + merges.txt, or a GGUF file's own "
      "tokenizer, encodes it)");
  auto* tokens = generate_command->add_option("--tokens", generate_options.tokens,
                                              "token ids, plain decimal integers >= 0: 464,2068,…");
  prompt->excludes(tokens);
  std::string max_new_tokens = "64", temperature = "0.8", top_k = "0", seed = "0";
  generate_command->add_option("--max-new-tokens", max_new_tokens, "an integer >= 0")
      ->capture_default_str();
  generate_command->add_option("--temperature", temperature, ">= 0; 0: greedy")
      ->capture_default_str();
  generate_command->add_option("--top-k", top_k, "an integer >= 0; 0: every token")
      ->capture_default_str();
  // The sampling flags of Hugging Face's generate (and OpenAI's two penalties), applied in HF's
  // order: the penalties, then temperature, top-k, top-p, min-p (dissect/decoding/sampling.hpp).
  std::string top_p = "1", min_p = "0", repetition_penalty = "1", frequency_penalty = "0",
              presence_penalty = "0";
  generate_command
      ->add_option("--top-p", top_p,
                   "in (0, 1]: sample from the smallest set of most probable tokens whose "
                   "probabilities reach it; 1: every token")
      ->capture_default_str();
  generate_command
      ->add_option("--min-p", min_p,
                   "in [0, 1]: drop tokens less probable than it times the most probable one's "
                   "probability; 0: none")
      ->capture_default_str();
  generate_command
      ->add_option("--repetition-penalty", repetition_penalty,
                   "> 0: Hugging Face's, on every token of the prompt and of the output (a logit "
                   "l >= 0 becomes l / R, l < 0 becomes l * R); 1: none")
      ->capture_default_str();
  generate_command
      ->add_option("--frequency-penalty", frequency_penalty,
                   "OpenAI's: subtract it times how often a token was generated; 0: none")
      ->capture_default_str();
  generate_command
      ->add_option("--presence-penalty", presence_penalty,
                   "OpenAI's: subtract it from every token generated so far; 0: none")
      ->capture_default_str();
  generate_command->add_option("--seed", seed, "an integer in [0, 2^64 - 1]")
      ->capture_default_str();
  generate_command->add_flag("--ids", generate_options.print_ids,
                             "print the prompt's and the new tokens' ids, not their text");
  std::string num_beams, length_penalty = "1", num_return_sequences = "1";
  auto* beams_option = generate_command->add_option(
      "--num-beams", num_beams,
      "beam search with N beams (an integer >= 1) instead of sampling: prints the best "
      "continuations with their scores");
  generate_command
      ->add_option("--length-penalty", length_penalty,
                   "beam search: a score is the sum of log-probabilities / new tokens^X (X >= 0)")
      ->needs(beams_option)
      ->capture_default_str();
  generate_command
      ->add_option("--num-return-sequences", num_return_sequences,
                   "beam search: how many of the best to print (1 to --num-beams)")
      ->needs(beams_option)
      ->capture_default_str();
  std::string draft_path, gamma = "4";
  auto* draft_option =
      generate_command
          ->add_option("--draft", draft_path,
                       "speculative decoding: a smaller model of the same vocabulary proposes "
                       "tokens that the model verifies, the output distributed as the model's "
                       "alone; prints the proposals accepted")
          ->excludes(beams_option);
  generate_command
      ->add_option("--gamma", gamma, "speculative decoding: proposals per round (an integer >= 1)")
      ->needs(draft_option)
      ->capture_default_str();
  generate_command->add_flag(
      "--no-pack", generate_options.no_pack,
      "keep float weights as loaded: no packed copy (as many bytes again), slower prefill");
  std::string threads;
  generate_command->add_option(
      "--threads", threads,
      "an integer >= 1: the threads the products run on (default: OMP_NUM_THREADS, else the "
      "cores); a build without OpenMP runs 1");

  dissect::tools::TokenizeOptions tokenize_options;
  auto* tokenize_command = app.add_subcommand(
      "tokenize", "text to token ids and pieces (or ids to text) with a Hugging Face tokenizer");
  tokenize_command
      ->add_option("--tokenizer", tokenize_options.tokenizer,
                   "a tokenizer.json, a directory holding one (or vocab.json + merges.txt), or "
                   "a .gguf file (its own tokenizer)")
      ->required();
  auto* text_option =
      tokenize_command->add_option("--text", tokenize_options.text, "the text to encode");
  std::optional<std::string> text_file;
  auto* file_option = tokenize_command->add_option("--file", text_file, "a UTF-8 file to encode");
  auto* decode_option = tokenize_command->add_option("--decode", tokenize_options.decode,
                                                     "token ids to decode: 1,2,3");
  text_option->excludes(file_option)->excludes(decode_option);
  file_option->excludes(decode_option);
  tokenize_command->add_flag("--no-special", tokenize_options.no_special,
                             "encode without BOS/EOS; decode skipping special tokens");
  tokenize_command->add_flag("--json", tokenize_options.json, "machine-readable output");

  dissect::tools::TemplateOptions template_options;
  auto* template_command = app.add_subcommand(
      "template", "render a conversation through the model's chat template (prints it exactly)");
  template_command
      ->add_option("model", template_options.model,
                   "a directory with tokenizer_config.json or chat_template.jinja, a "
                   "tokenizer_config.json, a .jinja or a .gguf file")
      ->required();
  template_command
      ->add_option("--messages", template_options.messages,
                   "a JSON array of {role, content, ...}, or an object with \"messages\"")
      ->required();
  template_command->add_option("--tools", template_options.tools,
                               "a JSON array of tool definitions");
  template_command->add_flag("--add-generation-prompt", template_options.add_generation_prompt,
                             "end with the assistant's turn header");
  template_command->add_option("--template", template_options.name,
                               "a named template of tokenizer_config.json (default: default)");
  template_command->add_option("--var", template_options.vars,
                               "KEY=VALUE: a template variable (VALUE as JSON, else a string), "
                               "e.g. enable_thinking=false");

  QuantizeOptions quantize_options;
  auto* quantize_command = app.add_subcommand(
      "quantize", "store every linear layer's weight as bf16, int8 or q4_0 (GGUF Q4_0)");
  quantize_command
      ->add_option("input", quantize_options.input,
                   "a save_model file, or a Hugging Face checkpoint with its config.json")
      ->required();
  quantize_command->add_option("output", quantize_options.output, "the .safetensors to write")
      ->required();
  std::string format;
  quantize_command
      ->add_option("--format", format,
                   "bf16, int8 or q4 (q4_0: in_features % 32 == 0); for a .gguf: q8_0, q4_0, "
                   "q6_k, q4_k_m or q5_k_m (llama.cpp's recipes); tq2_0: ternary, refused for a "
                   "float model unless --force")
      ->required();
  quantize_command->add_flag("--force", quantize_options.force,
                             "tq2_0: round a float model to ternary weights anyway (and report "
                             "what it costs)");

  ConvertOptions convert_options;
  auto* convert_command = app.add_subcommand(
      "convert", "a GGUF file to a Hugging Face checkpoint, or a checkpoint to a GGUF file");
  convert_command
      ->add_option("input", convert_options.input,
                   "a .gguf, a save_model file, or a Hugging Face checkpoint with its config.json")
      ->required();
  convert_command
      ->add_option("output", convert_options.output,
                   "a directory (from a .gguf: config.json + model.safetensors) or OUT.gguf")
      ->required();
  convert_command
      ->add_option("--type", convert_options.type,
                   "to GGUF: the matrices' ggml type (f32, f16, bf16, q8_0, q4_0, q4_K, ...); to "
                   "Hugging Face: f32, f16 or bf16")
      ->capture_default_str();
  convert_command->add_flag("--no-tokenizer", convert_options.no_tokenizer,
                            "to GGUF: leave out the tokenizer.json beside the checkpoint");

#ifdef DISSECT_SERVE
  dissect::tools::ServeOptions serve_options;
  auto* serve_command = app.add_subcommand(
      "serve",
      "OpenAI's /v1/completions and /v1/chat/completions over HTTP (streaming with server-sent "
      "events)");
  serve_command
      ->add_option("checkpoint", serve_options.checkpoint,
                   ".safetensors file, index .json, a directory, or a .gguf file")
      ->required();
  serve_command
      ->add_option("--host", serve_options.host,
                   "the address to listen on: a loopback one unless --allow-remote")
      ->capture_default_str();
  std::string port = "8080", serve_threads = "4";
  serve_command->add_option("--port", port, "0 to 65535; 0: any free port")->capture_default_str();
  serve_command
      ->add_option("--threads", serve_threads,
                   "1 to 64 HTTP threads: requests open at once (one generates at a time)")
      ->capture_default_str();
  serve_command->add_option("--name", serve_options.name,
                            "the model's id in /v1/models (default: the file's name)");
  serve_command->add_flag("--allow-remote", serve_options.allow_remote,
                          "listen on a non-loopback --host: anyone who reaches it may use the "
                          "model (there is no authentication)");
#endif

  // CLI11 would call an unknown word a missing subcommand; name it instead.
  const std::string_view command = argc > 1 ? argv[1] : "";
#ifndef DISSECT_SERVE
  if (command == "serve") {
    std::cerr << "dissect: serve: this dissect was built without cpp-httplib "
                 "(libcpp-httplib-dev), which serve needs\n";
    return exit_bad_input;
  }
#endif
  if (argc > 1 && argv[1][0] != '-' && command != "inspect" && command != "generate" &&
      command != "quantize" && command != "tokenize" && command != "convert" &&
      command != "serve" && command != "template") {
    std::cerr << "dissect: unknown command \"" << argv[1]
              << "\" (commands: inspect, generate, tokenize, template, quantize, convert, serve; "
                 "see dissect --help)\n";
    return exit_bad_input;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);  // --help
    std::cerr << "dissect: " << error.what() << "\n";
    return exit_bad_input;
  }
  namespace tools = dissect::tools;
  if (inspect_command->parsed()) {
    inspect_options.memory = tools::parse_bytes(memory, "--gpu-memory");
    if (context) inspect_options.context = tools::parse_count(*context, "--context");
    return inspect(inspect_options);
  }
  if (tokenize_command->parsed()) {
    if (!tokenize_options.text && !text_file && !tokenize_options.decode) {
      throw dissect::ConfigError("tokenize: give --text TEXT, --file FILE or --decode IDS");
    }
    if (tokenize_options.decode) (void)tools::parse_token_ids(*tokenize_options.decode, "--decode");
    if (text_file) tokenize_options.file = *text_file;
    return dissect::tools::tokenize(tokenize_options);
  }
  if (template_command->parsed()) return dissect::tools::chat_template_command(template_options);
  if (quantize_command->parsed()) {
    const bool gguf_in = tools::is_gguf_file(quantize_options.input);
    const bool gguf_out = quantize_options.output.extension() == ".gguf";
    if (gguf_in != gguf_out) {
      throw dissect::ConfigError(dissect::concat(
          "quantize: ", gguf_in ? "a GGUF input is written as GGUF (OUT.gguf)"
                                : "a GGUF output needs a GGUF input (`dissect convert IN "
                                  "OUT.gguf` writes a checkpoint as GGUF)"));
    }
    try {
      if (gguf_in) {
        quantize_options.recipe = dissect::gguf_recipe_from_name(format);
      } else {
        quantize_options.format = dissect::weight_format_from_name(format);
      }
    } catch (const dissect::Error& error) {
      throw dissect::ConfigError(dissect::concat("--format: ", error.what()));
    }
    std::error_code error;
    const fs::path folder = fs::absolute(quantize_options.output, error).parent_path();
    if (!fs::is_directory(folder, error)) {
      throw dissect::ConfigError(dissect::concat("quantize: output ",
                                                 quantize_options.output.string(), ": the folder ",
                                                 folder.string(), " does not exist"));
    }
    return quantize(quantize_options);
  }
  if (convert_command->parsed()) return convert(convert_options);
#ifdef DISSECT_SERVE
  if (serve_command->parsed()) {
    dissect::tools::ServeOptions& o = serve_options;
    const index_t port_number = tools::parse_integer(port, "--port");
    if (port_number > 65535) {
      throw dissect::ConfigError(
          dissect::concat("--port: must be in [0, 65535] (got \"", port, "\")"));
    }
    o.port = static_cast<int>(port_number);
    o.threads = tools::parse_integer(serve_threads, "--threads", 1);
    if (o.threads > 64) {
      throw dissect::ConfigError(
          dissect::concat("--threads: must be in [1, 64] (got \"", serve_threads, "\")"));
    }
    if (o.host.empty()) throw dissect::ConfigError("--host: the address is empty");
    if (!o.allow_remote && !tools::is_loopback_host(o.host)) {
      throw dissect::ConfigError(dissect::concat(
          "--host: ", o.host,
          " is not a loopback address; dissect serve has no authentication, so listening "
          "there needs --allow-remote"));
    }
    return tools::serve(o);
  }
#endif
  GenerateOptions& g = generate_options;
  if (!g.prompt && !g.tokens) {
    throw dissect::ConfigError("generate: give --prompt TEXT or --tokens IDS");
  }
  if (g.tokens) (void)tools::parse_token_ids(*g.tokens, "--tokens");  // the vocabulary: later
  if (g.prompt && g.prompt->empty()) throw dissect::ConfigError("--prompt: the prompt is empty");
  g.max_new_tokens = tools::parse_integer(max_new_tokens, "--max-new-tokens");
  g.sampling.temperature = tools::parse_non_negative_real(temperature, "--temperature");
  g.sampling.top_k = tools::parse_integer(top_k, "--top-k");
  const auto real_in = [](const std::string& text, std::string_view flag, std::string_view range,
                          auto inside) {
    const double value = tools::parse_real(text, flag);
    if (!inside(value)) {
      throw dissect::ConfigError(
          dissect::concat(flag, ": must be ", range, " (got \"", text, "\")"));
    }
    return value;
  };
  g.sampling.top_p =
      real_in(top_p, "--top-p", "in (0, 1]", [](double p) { return p > 0 && p <= 1; });
  g.sampling.min_p =
      real_in(min_p, "--min-p", "in [0, 1]", [](double p) { return p >= 0 && p <= 1; });
  g.sampling.repetition_penalty =
      real_in(repetition_penalty, "--repetition-penalty", "> 0", [](double r) { return r > 0; });
  g.sampling.frequency_penalty = tools::parse_real(frequency_penalty, "--frequency-penalty");
  g.sampling.presence_penalty = tools::parse_real(presence_penalty, "--presence-penalty");
  g.seed = tools::parse_uint64(seed, "--seed");
  if (!threads.empty()) {
    // More threads than this bound is a typo, not a machine: refuse it before OpenMP tries.
    constexpr index_t most_threads = 4096;
    g.threads = tools::parse_integer(threads, "--threads", 1);
    if (g.threads > most_threads) {
      throw dissect::ConfigError(
          dissect::concat("--threads: must be <= ", most_threads, " (got ", g.threads, ")"));
    }
#ifdef _OPENMP
    omp_set_num_threads(static_cast<int>(g.threads));
#else
    if (g.threads > 1) {
      throw dissect::ConfigError(
          dissect::concat("--threads: ", g.threads,
                          " threads need OpenMP, and this build has none (configure with "
                          "-DDISSECT_USE_OPENMP=ON, as the release preset does)"));
    }
#endif
  }
  if (!num_beams.empty()) {
    g.num_beams = tools::parse_integer(num_beams, "--num-beams", 1);
    g.length_penalty = tools::parse_non_negative_real(length_penalty, "--length-penalty");
    g.num_return_sequences =
        tools::parse_integer(num_return_sequences, "--num-return-sequences", 1);
    if (g.num_return_sequences > g.num_beams) {
      throw dissect::ConfigError(dissect::concat("--num-return-sequences: ", g.num_return_sequences,
                                                 " is more than the ", g.num_beams,
                                                 " of --num-beams"));
    }
  }
  if (draft_option->count() > 0) {
    g.draft = draft_path;
    g.gamma = tools::parse_integer(gamma, "--gamma", 1);
  }
  return generate(g);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const dissect::Error& error) {
    // The library's own errors are about the input: a file, a config, a flag's value.
    std::cerr << "dissect: " << error.what() << "\n";
    return exit_bad_input;
  } catch (const std::exception& error) {
    std::cerr << "dissect: " << error.what() << "\n";
    return exit_other;
  }
}
