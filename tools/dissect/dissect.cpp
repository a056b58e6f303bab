// tools/dissect/dissect.cpp — the `dissect` command: take a checkpoint apart, or run it.
//
//   dissect inspect CHECKPOINT [--gpu-memory 24GB] [--context T] [--json]
//   dissect generate CHECKPOINT (--prompt TEXT | --tokens 464,2068,…) [--max-new-tokens N]
//                    [--temperature T] [--top-k K] [--seed S]
//
// CHECKPOINT is a .safetensors file, a sharded checkpoint's index .json, or a directory holding
// either (with a Hugging Face config.json beside them, or a file dissect's save_model wrote,
// whose metadata holds its config). All parsing, arithmetic and loading live in the library
// (io/, count.hpp, budget.hpp, models/); this file reads flags and prints.
// Exit status: 0 ok; 2 bad input (a flag, a missing or corrupt file, a config dissect cannot
// build); 1 anything else.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/budget.hpp"
#include "dissect/count.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/huggingface.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/models/generate.hpp"
#include "tools/common/byte_vocab.hpp"
#include "tools/common/parse.hpp"
#include "tools/common/table.hpp"

namespace {

using dissect::index_t;
namespace fs = std::filesystem;

constexpr int exit_ok = 0;
constexpr int exit_other = 1;
constexpr int exit_bad_input = 2;

// ---- a checkpoint and what it says about its model ----------------------------------------------

struct Source {
  dissect::Checkpoint checkpoint;
  std::optional<dissect::HfConfig> model;  ///< family and config, when the files record them
  bool hugging_face = false;               ///< config.json beside the weights: HF names and layouts
  std::string config_source;               ///< where the config came from, for the report
};

Source open_source(const fs::path& path) {
  Source source{dissect::Checkpoint(path), std::nullopt, false,
                "none (no config.json, no metadata)"};
  const fs::path folder = fs::is_directory(path) ? path : path.parent_path();
  if (const fs::path config = folder / "config.json"; fs::exists(config)) {
    source.model = dissect::read_hf_config(config);
    source.hugging_face = true;
    source.config_source = config.string();
  } else if ((source.model = dissect::model_config_of(source.checkpoint))) {
    source.config_source = "the file's metadata (dissect save_model)";
  }
  return source;
}

// ---- inspect ------------------------------------------------------------------------------------

struct TensorRow {
  std::string name, dtype, group;
  std::vector<index_t> shape;
  index_t parameters = 1, bytes = 0;
  bool buffer = false;
  std::optional<std::pair<index_t, index_t>> linear;  ///< in, out of y = x·Wᵀ + b
  bool bias = false;
};

/// "h.3." / "layers.3." → 3: the layer a tensor belongs to.
std::optional<index_t> layer_of(std::string_view name) {
  for (std::string_view marker : {"h.", "layers."}) {
    for (std::size_t at = name.find(marker); at != std::string_view::npos;
         at = name.find(marker, at + 1)) {
      if (at != 0 && name[at - 1] != '.') continue;
      const char* first = name.data() + at + marker.size();
      index_t layer = 0;
      const auto [end, ec] = std::from_chars(first, name.data() + name.size(), layer);
      if (ec == std::errc() && end < name.data() + name.size() && *end == '.') return layer;
    }
  }
  return std::nullopt;
}

bool is_buffer(std::string_view name) {
  return name.ends_with(".attn.bias") || name.ends_with(".attn.masked_bias") ||
         name.ends_with("rotary_emb.inv_freq");
}

bool is_embedding(std::string_view name) {
  return name.find("wte.") != std::string_view::npos ||
         name.find("wpe.") != std::string_view::npos ||
         name.find("embed_tokens.") != std::string_view::npos;
}

/// GPT-2's Conv1D projections store W as [in, out]; everything else as nn.Linear's [out, in].
bool is_conv1d(std::string_view name) {
  for (std::string_view part : {".c_attn.", ".c_proj.", ".c_fc."}) {
    if (name.find(part) != std::string_view::npos) return true;
  }
  return false;
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
    row.buffer = is_buffer(name);
    for (index_t extent : info.shape) row.parameters *= extent;  // checked by the reader
    if (const auto layer = layer_of(name)) {
      row.group = dissect::detail::concat("layer ", *layer);
    } else {
      row.group = row.buffer ? "buffers" : is_embedding(name) ? "embeddings" : "final";
    }
    if (info.shape.size() == 2 && !row.buffer && !is_embedding(name) && name.ends_with(".weight")) {
      row.linear = is_conv1d(name) ? std::pair{info.shape[0], info.shape[1]}
                                   : std::pair{info.shape[1], info.shape[0]};
      const std::string bias = name.substr(0, name.size() - 6) + "bias";
      row.bias = std::binary_search(names.begin(), names.end(), bias);
    }
    rows.push_back(std::move(row));
  }
  // Embeddings first, then layers in numeric order, then the rest.
  const auto rank = [](const TensorRow& row) {
    if (row.group == "embeddings") return std::pair<int, index_t>{0, 0};
    if (const auto layer = layer_of(row.name)) return std::pair<int, index_t>{1, *layer};
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
  return dissect::detail::concat("[*, ", row.linear->first, "] → [*, ", row.linear->second, "]",
                                 row.bias ? " + b" : "",
                                 is_conv1d(row.name) ? "  (Conv1D [in, out])" : "");
}

/// A layer's rows with its index blanked out: equal signatures mean equal layers.
std::string signature(const std::vector<const TensorRow*>& rows, index_t layer) {
  std::string text;
  const std::string index = dissect::detail::concat(".", layer, ".");
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

struct InspectOptions {
  fs::path checkpoint;
  index_t memory = 24'000'000'000;
  std::optional<index_t> context;
  bool json = false;
};

int inspect(const InspectOptions& o) {
  const Source source = open_source(o.checkpoint);
  const auto rows = tensor_rows(source.checkpoint);
  index_t parameters = 0, bytes = 0, linear_weights = 0, linear_count = 0, max_layer = -1;
  index_t width = 0;
  std::map<std::string, index_t> dtype_bytes;
  for (const TensorRow& row : rows) {
    if (row.buffer) continue;
    parameters += row.parameters;
    bytes += row.bytes;
    dtype_bytes[row.dtype] += row.bytes;
    if (row.linear) linear_weights += row.parameters, ++linear_count;
    if (const auto layer = layer_of(row.name)) max_layer = std::max(max_layer, *layer);
    if (is_embedding(row.name) && row.shape.size() == 2 && width == 0) width = row.shape[1];
  }
  const std::string main_dtype =
      std::max_element(dtype_bytes.begin(), dtype_bytes.end(), [](auto& a, auto& b) {
        return a.second < b.second;
      })->first;
  const index_t d_model = source.model ? source.model->config.d_model : width;
  const index_t n_layers = source.model ? source.model->config.n_layers : max_layer + 1;
  const auto approx = dissect::try_approx_parameters(d_model, n_layers);
  std::optional<index_t> exact;
  std::optional<dissect::Budget> budget;
  if (source.model) {
    exact = dissect::count_parameters(source.model->config).total;
    dissect::BudgetInputs inputs;
    inputs.weight_dtype = inputs.kv_dtype = dtype_of(main_dtype);
    inputs.context = o.context.value_or(source.model->config.context);
    inputs.memory_bytes = o.memory;
    budget = dissect::compute_budget(source.model->config, inputs);
  }

  if (o.json) {
    nlohmann::ordered_json out;
    out["checkpoint"] = source.checkpoint.path().string();
    out["files"] = source.checkpoint.shards().size();
    out["config_source"] = source.config_source;
    if (source.model) {
      out["family"] = dissect::family_name(source.model->family);
      out["config"] = dissect::config_to_json(source.model->config);
    }
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
    out["totals"] = {{"parameters", parameters},
                     {"bytes", bytes},
                     {"linear_layers", linear_count},
                     {"linear_weights", linear_weights},
                     {"approx_12_d2_l", approx ? nlohmann::ordered_json(*approx) : nullptr},
                     {"exact_from_config", exact ? nlohmann::ordered_json(*exact) : nullptr}};
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

  std::cout << "checkpoint  " << source.checkpoint.path().string() << " ("
            << source.checkpoint.shards().size() << " file"
            << (source.checkpoint.shards().size() == 1 ? "" : "s") << ", " << rows.size()
            << " tensors)\n";
  std::cout << "config      " << source.config_source << "\n";
  if (source.model) {
    const auto& c = source.model->config;
    std::cout << "model       " << dissect::family_name(source.model->family)
              << ": D = " << c.d_model << ", L = " << c.n_layers << ", H = " << c.n_heads
              << ", H_kv = " << c.kv_heads() << ", d_k = " << c.head_size() << ", F = " << c.d_ff
              << ", V = " << c.vocab << ", context = " << c.context
              << (c.tied_embeddings ? ", head tied to the embedding" : "") << "\n";
  }
  std::cout << "\n";
  dissect::tools::TextTable table({false, false, false, false, true, true, false});
  table.add_row(
      {"group", "tensor", "dtype", "shape", "parameters", "bytes", "linear: x → y = x·Wᵀ"});
  table.add_rule();
  // Layers with the first layer's names, dtypes and shapes print as one line per run.
  std::map<index_t, std::vector<const TensorRow*>> layers;
  for (const TensorRow& row : rows) {
    if (const auto layer = layer_of(row.name)) layers[*layer].push_back(&row);
  }
  std::set<index_t> repeats;
  if (!layers.empty()) {
    const auto& [first, first_rows] = *layers.begin();
    for (const auto& [layer, layer_rows] : layers) {
      if (layer != first && signature(layer_rows, layer) == signature(first_rows, first)) {
        repeats.insert(layer);
      }
    }
  }
  const auto repeating = [&](const TensorRow& row) {
    const auto layer = layer_of(row.name);
    return layer && repeats.contains(*layer);
  };
  std::string group;
  index_t run_start = -1;  // first layer of the current run of repeats
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const TensorRow& row = rows[i];
    if (repeating(row)) {
      const index_t layer = *layer_of(row.name);
      if (run_start < 0) run_start = layer;
      if (i + 1 == rows.size() || !repeating(rows[i + 1])) {
        const auto& [first, first_rows] = *layers.begin();
        index_t per_layer = 0;
        for (const TensorRow* r : first_rows) per_layer += r->buffer ? 0 : r->parameters;
        table.add_row(
            {run_start == layer ? dissect::detail::concat("layer ", layer)
                                : dissect::detail::concat("layers ", run_start, "–", layer),
             dissect::detail::concat("as layer ", first, " (", first_rows.size(), " tensors each)"),
             "", "", dissect::format_count(per_layer * (layer - run_start + 1)), "", ""});
        run_start = -1;
        group.clear();
      }
      continue;
    }
    table.add_row({row.group == group ? "" : row.group, row.name, row.dtype, shape_text(row.shape),
                   row.buffer ? "(buffer)" : dissect::format_count(row.parameters),
                   dissect::format_count(row.bytes), linear_text(row)});
    group = row.group;
  }
  std::cout << table.render() << "\n";
  std::cout << "parameters  " << dissect::format_count(parameters) << " in "
            << dissect::format_count(bytes) << " bytes";
  if (exact) {
    std::cout << "; the config's exact count: " << dissect::format_count(*exact)
              << (*exact == parameters ? " (equal)" : " (DIFFERENT)");
  }
  std::cout << "\n";
  if (approx) {
    std::cout << "12·D²·L     " << dissect::format_count(*approx) << " (D = " << d_model
              << ", L = " << n_layers
              << "): the layers' matrices, no embeddings, biases or norms\n";
  }
  std::cout << "linear      " << linear_count << " matrices, "
            << dissect::format_count(linear_weights) << " weights\n";
  if (budget && budget->memory) {
    const auto& m = *budget->memory;
    std::cout << "budget      " << dissect::format_count(m.memory_bytes) << " bytes of memory, "
              << dissect::dtype_name(budget->inputs.weight_dtype) << " weights ("
              << dissect::format_count(budget->weights_bytes) << " B) and KV cache, context "
              << budget->inputs.context << ": "
              << dissect::format_count(budget->kv_bytes_per_sequence) << " B of KV per sequence, "
              << dissect::format_count(m.max_sequences) << " sequences fit\n";
  }
  return exit_ok;
}

// ---- generate -----------------------------------------------------------------------------------

struct GenerateOptions {
  fs::path checkpoint;
  std::optional<std::string> prompt;
  std::optional<std::string> tokens;
  index_t max_new_tokens = 64;
  double temperature = 0.8;
  index_t top_k = 0;
  std::uint64_t seed = 0;
};

/// The ids of `text` in a byte vocabulary (train_gpt's checkpoints).
/// @throws ConfigError naming --prompt and the first byte the vocabulary lacks.
std::vector<index_t> encode(const dissect::tools::ByteVocab& vocab, const std::string& text) {
  std::vector<index_t> ids;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const index_t id = vocab.id_of[static_cast<unsigned char>(text[i])];
    if (id < 0) {
      throw dissect::ConfigError(dissect::detail::concat(
          "--prompt: byte ", i, " (", static_cast<int>(static_cast<unsigned char>(text[i])),
          ") is not in the model's vocabulary"));
    }
    ids.push_back(id);
  }
  return ids;
}

std::vector<index_t> parse_ids(const std::string& text) {
  std::vector<index_t> ids;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    ids.push_back(dissect::tools::parse_count(std::string_view(text).substr(start, comma - start),
                                              "--tokens"));
    start = comma + 1;
  }
  return ids;
}

/// The model a source holds: Hugging Face names and layouts, or a save_model file (quantised
/// layers included).
template <class Model>
Model load_source_model(const Source& source) {
  const auto& recorded = *source.model;
  Model model(recorded.config, {.seed = 0});
  if (source.hugging_face) {
    dissect::load_state_dict(model, dissect::HfCheckpointView(source.checkpoint, recorded));
  } else {
    dissect::load_module_quantized(model, source.checkpoint);
  }
  return model;
}

/// The source's model config, or ConfigError naming the command and the file.
const dissect::HfConfig& require_model(const Source& source, std::string_view command) {
  if (!source.model) {
    throw dissect::ConfigError(dissect::detail::concat(
        command, ": ", source.checkpoint.path().string(),
        ": no model config (a Hugging Face config.json beside it, or a file from save_model)"));
  }
  return *source.model;
}

template <class Model>
int run_generation(const Source& source, const GenerateOptions& o) {
  const Model model = load_source_model<Model>(source);
  const auto vocab = dissect::tools::ByteVocab::from_metadata(source.checkpoint.metadata(),
                                                              source.checkpoint.path().string());
  std::vector<index_t> prompt;
  if (o.prompt) {
    if (!vocab) {
      throw dissect::ConfigError(
          "--prompt: this checkpoint carries no vocabulary (no tokenizer files can be fetched "
          "here); give token ids with --tokens");
    }
    prompt = encode(*vocab, *o.prompt);
    std::cout << *o.prompt;
  } else {
    prompt = parse_ids(*o.tokens);
    std::cout << *o.tokens;
  }
  std::cout.flush();
  const dissect::GenerationOptions options{
      .max_new_tokens = o.max_new_tokens,
      .sampling = {.temperature = o.temperature, .top_k = o.top_k},
      .seed = o.seed};
  const auto stats = dissect::generate(model, prompt, options, [&](index_t id) {
    if (vocab && id < static_cast<index_t>(vocab->bytes.size())) {
      std::cout << static_cast<char>(vocab->bytes[static_cast<std::size_t>(id)]);
    } else {
      std::cout << ',' << id;
    }
    std::cout.flush();
  });
  std::cout << "\n\nprefill  " << stats.prompt_tokens << " prompt tokens (and the first new one), "
            << stats.prefill_tokens_per_second() << " tokens/s\n"
            << "decode   " << std::max<index_t>(stats.new_tokens - 1, 0) << " tokens, "
            << stats.decode_tokens_per_second() << " tokens/s"
            << (stats.stopped_at_context ? " (stopped: the context is full)" : "") << "\n";
  return exit_ok;
}

int generate(const GenerateOptions& o) {
  const Source source = open_source(o.checkpoint);
  return require_model(source, "generate").family == dissect::ModelFamily::gpt2
             ? run_generation<dissect::GPT2Model<float>>(source, o)
             : run_generation<dissect::LlamaModel<float>>(source, o);
}

// ---- quantize -----------------------------------------------------------------------------------

struct QuantizeOptions {
  fs::path input, output;
  std::string format;
};

template <class Model>
int run_quantize(const Source& source, const QuantizeOptions& o) {
  const auto format = dissect::weight_format_from_name(o.format);
  Model model = load_source_model<Model>(source);
  const auto float_bytes = dissect::linear_weight_bytes(model);
  const auto layers = dissect::quantize_model(model, format);
  // A dissect file's own metadata (a vocabulary, say) goes along; save_model rewrites the rest.
  std::map<std::string, std::string> metadata;
  if (!source.hugging_face) {
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
  return exit_ok;
}

int quantize(const QuantizeOptions& o) {
  const Source source = open_source(o.input);
  return require_model(source, "quantize").family == dissect::ModelFamily::gpt2
             ? run_quantize<dissect::GPT2Model<float>>(source, o)
             : run_quantize<dissect::LlamaModel<float>>(source, o);
}

// ---- main ---------------------------------------------------------------------------------------

int run(int argc, char** argv) {
  CLI::App app{"dissect: take a language-model checkpoint apart, or run it"};
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 ok; 2 bad input (a flag, a missing or corrupt file, a config dissect "
      "cannot build); 1 any other failure.");

  InspectOptions inspect_options;
  auto* inspect_command = app.add_subcommand(
      "inspect", "every tensor grouped by layer, the linear layers' shapes, totals and a budget");
  inspect_command
      ->add_option("checkpoint", inspect_options.checkpoint,
                   ".safetensors file, index .json, or a directory")
      ->required();
  std::string memory = "24GB";
  inspect_command->add_option("--gpu-memory", memory, "device memory for the budget (24GB, 80GiB)")
      ->capture_default_str();
  inspect_command->add_option("--context", inspect_options.context,
                              "tokens per sequence in the KV cache (default: the model's context)");
  inspect_command->add_flag("--json", inspect_options.json, "machine-readable output");

  GenerateOptions generate_options;
  auto* generate_command =
      app.add_subcommand("generate", "continue a prompt, streaming tokens, then tokens/s");
  generate_command
      ->add_option("checkpoint", generate_options.checkpoint,
                   ".safetensors file, index .json, or a directory")
      ->required();
  auto* prompt = generate_command->add_option(
      "--prompt", generate_options.prompt, "text (for a checkpoint with a character vocabulary)");
  auto* tokens =
      generate_command->add_option("--tokens", generate_options.tokens, "token ids: 464,2068,…");
  prompt->excludes(tokens);
  generate_command->add_option("--max-new-tokens", generate_options.max_new_tokens)
      ->capture_default_str();
  generate_command->add_option("--temperature", generate_options.temperature, "0: greedy")
      ->capture_default_str();
  generate_command->add_option("--top-k", generate_options.top_k, "0: every token")
      ->capture_default_str();
  generate_command->add_option("--seed", generate_options.seed)->capture_default_str();

  QuantizeOptions quantize_options;
  auto* quantize_command = app.add_subcommand(
      "quantize", "store every linear layer's weight as bf16, int8 or q4_0 (GGUF Q4_0)");
  quantize_command
      ->add_option("input", quantize_options.input,
                   "a save_model file, or a Hugging Face checkpoint with its config.json")
      ->required();
  quantize_command->add_option("output", quantize_options.output, "the .safetensors to write")
      ->required();
  quantize_command
      ->add_option("--format", quantize_options.format,
                   "bf16, int8 or q4 (q4_0: in_features % 32 == 0)")
      ->required();

  // CLI11 would call an unknown word a missing subcommand; name it instead.
  const std::string_view command = argc > 1 ? argv[1] : "";
  if (argc > 1 && argv[1][0] != '-' && command != "inspect" && command != "generate" &&
      command != "quantize") {
    std::cerr << "dissect: unknown command \"" << argv[1]
              << "\" (commands: inspect, generate, quantize; see dissect --help)\n";
    return exit_bad_input;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);  // --help
    std::cerr << "dissect: " << error.what() << "\n";
    return exit_bad_input;
  }
  if (inspect_command->parsed()) {
    inspect_options.memory = dissect::tools::parse_bytes(memory, "--gpu-memory");
    return inspect(inspect_options);
  }
  if (quantize_command->parsed()) return quantize(quantize_options);
  if (!generate_options.prompt && !generate_options.tokens) {
    throw dissect::ConfigError("generate: give --prompt TEXT or --tokens IDS");
  }
  return generate(generate_options);
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
