// examples/budget.cpp — the `budget` tool: how many users fit on one card, and how fast.
//
//   budget --preset llama-7b --context 2048 --dtype fp16 --gpu-memory 24GB
//   budget --params 7e9 --layers 32 --heads 32 --head-dim 128 --context 2048 --dtype fp16
//          --gpu-memory 24GB --bandwidth 1.5TB/s --peak 300TFLOPS [--json]
//
// All arithmetic and all value parsing live in dissect/budget.hpp and are unit-tested; this
// file only reads flags, builds the model and prints. Bad input exits with status 2.
#include <charconv>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dissect/budget.hpp"
#include "dissect/config.hpp"
#include "dissect/count.hpp"

namespace {

using dissect::ConfigError;
using dissect::index_t;

constexpr std::string_view help_text =
    R"(budget — memory and speed budget of a transformer on one device

Usage:
  budget --preset NAME [overrides] [device] [--json]
  budget --params N --layers L --heads H [--kv-heads H_kv] (--head-dim d_k | --d-model D)
         --context T [device] [--json]
  budget --d-model D --layers L --heads H --vocab V --context T [style] [device] [--json]

Model:
  --preset NAME      start from a public model (see --list-presets); the preset is applied
                     first and every other model flag overrides its field, in any order
  --list-presets     print the presets and exit
  --params N         total parameter count instead of counting it from the shapes
                     (7000000000, 7e9, 7B, 124M)
  --d-model D        model width D
  --layers L         number of layers L
  --heads H          query heads H
  --kv-heads H_kv    key/value heads (grouped-query attention); default H
  --head-dim d_k     width of one head; default D / H (re-derived when D or H is overridden)
  --ffn F            FFN width F; default 4·D without a preset
  --vocab V          vocabulary size V
  --context T        tokens per sequence held in the KV cache; also the model's context, which
                     sizes a learned position table
  --tied, --untied   output head shares the token embedding, or has its own
  --norm KIND        layernorm (weight + bias) or rmsnorm (weight only)
  --positions KIND   learned (a [T, D] table) or rotary (no parameters)
  --bias, --no-bias  biases on the linear layers, or none
  --mlp, --gated     FFN D → F → D with two matrices, or SwiGLU with three
  Without a preset the style is GPT-2's: layernorm, learned, bias, mlp, tied.

Precision:
  --dtype DTYPE      weight dtype: fp32, fp16, bf16, fp8, int8, int4 (default fp16)
  --kv-dtype DTYPE   KV cache dtype (default: the weight dtype)

Device (each optional; what it feeds is left out when it is missing):
  --gpu-memory SIZE  device memory: 24GB (10^9), 80GiB (2^30), or plain bytes
  --reserve FRAC     fraction of memory kept free: 0.2 or 20% (default 0)
  --bandwidth RATE   memory bandwidth: 1.5TB/s, 900GB/s, 2TiB/s
  --peak RATE        peak compute: 300TFLOPS, 312TFLOP/s, 3e14
  --batch B          sequences decoded together (default: as many as fit, else 1)

Output:
  --json             one JSON object instead of the table
  --help             this text

Sizes print as exact bytes, GB (10^9) and GiB (2^30). Exit status: 0 ok, 2 bad flags or values.
)";

struct Options {
  std::optional<std::string> preset;
  std::optional<index_t> params, d_model, layers, heads, kv_heads, head_dim, ffn, vocab, context,
      batch;
  std::optional<bool> tied, bias;
  std::optional<dissect::Norm> norm;
  std::optional<dissect::Positions> positions;
  std::optional<dissect::Ffn> ffn_kind;
  dissect::Dtype dtype = dissect::Dtype::fp16;
  std::optional<dissect::Dtype> kv_dtype;
  std::optional<index_t> memory;
  double reserve = 0.0;
  std::optional<double> bandwidth, peak;
  bool json = false, help = false, list_presets = false;
};

dissect::Norm parse_norm(std::string_view text) {
  if (dissect::detail::iequals(text, "layernorm")) return dissect::Norm::layer_norm;
  if (dissect::detail::iequals(text, "rmsnorm")) return dissect::Norm::rms_norm;
  throw ConfigError(
      dissect::detail::concat("--norm: unknown \"", text, "\" (known: layernorm, rmsnorm)"));
}

dissect::Positions parse_positions(std::string_view text) {
  if (dissect::detail::iequals(text, "learned")) return dissect::Positions::learned;
  if (dissect::detail::iequals(text, "rotary")) return dissect::Positions::rotary;
  throw ConfigError(
      dissect::detail::concat("--positions: unknown \"", text, "\" (known: learned, rotary)"));
}

Options parse_options(const std::vector<std::string_view>& args) {
  Options o;
  using Setter = std::function<void(std::string_view flag, std::string_view value)>;
  const auto count = [](std::optional<index_t>& field) -> Setter {
    return [&field](std::string_view flag, std::string_view v) {
      field = dissect::parse_count(v, flag);
    };
  };
  const std::map<std::string_view, Setter, std::less<>> valued{
      {"--preset", [&](auto, auto v) { o.preset = std::string(v); }},
      {"--params", count(o.params)},
      {"--d-model", count(o.d_model)},
      {"--layers", count(o.layers)},
      {"--heads", count(o.heads)},
      {"--kv-heads", count(o.kv_heads)},
      {"--head-dim", count(o.head_dim)},
      {"--ffn", count(o.ffn)},
      {"--vocab", count(o.vocab)},
      {"--context", count(o.context)},
      {"--batch", count(o.batch)},
      {"--norm", [&](auto, auto v) { o.norm = parse_norm(v); }},
      {"--positions", [&](auto, auto v) { o.positions = parse_positions(v); }},
      {"--dtype", [&](auto f, auto v) { o.dtype = dissect::parse_dtype(v, f); }},
      {"--kv-dtype", [&](auto f, auto v) { o.kv_dtype = dissect::parse_dtype(v, f); }},
      {"--gpu-memory", [&](auto f, auto v) { o.memory = dissect::parse_bytes(v, f); }},
      {"--reserve", [&](auto f, auto v) { o.reserve = dissect::parse_fraction(v, f); }},
      {"--bandwidth", [&](auto f, auto v) { o.bandwidth = dissect::parse_bandwidth(v, f); }},
      {"--peak", [&](auto f, auto v) { o.peak = dissect::parse_flops(v, f); }},
  };
  const std::map<std::string_view, std::function<void()>, std::less<>> switches{
      {"--tied", [&] { o.tied = true; }},
      {"--untied", [&] { o.tied = false; }},
      {"--bias", [&] { o.bias = true; }},
      {"--no-bias", [&] { o.bias = false; }},
      {"--mlp", [&] { o.ffn_kind = dissect::Ffn::mlp; }},
      {"--gated", [&] { o.ffn_kind = dissect::Ffn::gated; }},
      {"--json", [&] { o.json = true; }},
      {"--help", [&] { o.help = true; }},
      {"-h", [&] { o.help = true; }},
      {"--list-presets", [&] { o.list_presets = true; }},
  };
  for (std::size_t i = 0; i < args.size(); ++i) {
    std::string_view flag = args[i];
    std::optional<std::string_view> value;
    if (const std::size_t eq = flag.find('='); flag.starts_with("--") && eq != flag.npos) {
      value = flag.substr(eq + 1);  // --flag=value
      flag = flag.substr(0, eq);
    }
    if (const auto s = switches.find(flag); s != switches.end() && !value) {
      s->second();
      continue;
    }
    const auto v = valued.find(flag);
    if (v == valued.end()) {
      throw ConfigError(dissect::detail::concat("unknown flag \"", args[i], "\""));
    }
    if (!value) {
      if (i + 1 == args.size()) throw ConfigError(dissect::detail::concat(flag, ": missing value"));
      value = args[++i];
    }
    v->second(flag, *value);
  }
  return o;
}

// ---- the model ----------------------------------------------------------------------------------

struct Model {
  std::string label;
  dissect::ModelSize size;
  std::optional<index_t> d_model;  // for 12·D²·L; unknown for --params without D or d_k
  std::optional<dissect::ParameterCount> count;  // when counted from the shapes
};

void require(bool present, std::string_view flag, std::string_view when) {
  if (!present) throw ConfigError(dissect::detail::concat(flag, " is required ", when));
}

dissect::TransformerConfig config_from(const Options& o) {
  dissect::TransformerConfig c;
  if (o.preset) c = dissect::find_preset(*o.preset).config;
  if (o.d_model) c.d_model = *o.d_model;
  if (o.layers) c.n_layers = *o.layers;
  if (o.heads) c.n_heads = *o.heads;
  if (o.kv_heads) c.n_kv_heads = *o.kv_heads;
  if (o.head_dim) c.head_dim = *o.head_dim;
  if (o.ffn)
    c.d_ff = *o.ffn;
  else if (!o.preset && o.d_model)
    c.d_ff = dissect::checked_mul(4, *o.d_model, "--ffn");
  if (o.vocab) c.vocab = *o.vocab;
  if (o.context) c.context = *o.context;
  if (o.tied) c.tied_embeddings = *o.tied;
  if (o.bias) c.bias = *o.bias;
  if (o.norm) c.norm = *o.norm;
  if (o.positions) c.positions = *o.positions;
  if (o.ffn_kind) c.ffn = *o.ffn_kind;
  return c;
}

Model build_model(const Options& o) {
  const dissect::TransformerConfig c = config_from(o);
  Model model;
  model.label = o.preset ? *o.preset : "custom";
  const bool overridden = o.d_model || o.layers || o.heads || o.kv_heads || o.head_dim || o.ffn ||
                          o.vocab || o.tied || o.bias || o.norm || o.positions || o.ffn_kind;
  if (o.preset && overridden) model.label += " with overrides";
  if (o.params) {
    // A raw count: only the KV shape is needed, the rest of the config may stay unset.
    const std::string_view when = "with --params (or use --preset)";
    require(c.n_layers > 0, "--layers", when);
    require(c.n_heads > 0, "--heads", when);
    require(c.head_dim || c.d_model > 0, "--head-dim (or --d-model)", when);
    if (!c.head_dim && c.d_model % c.n_heads != 0) {
      throw ConfigError(dissect::detail::concat("--d-model ", c.d_model,
                                                " is not divisible by --heads ", c.n_heads));
    }
    model.size = {*o.params, c.n_layers, c.n_heads, c.kv_heads(), c.head_size()};
    // Without D, assume H·d_k = D, as in every preset.
    model.d_model = c.d_model > 0 ? c.d_model
                                  : dissect::checked_mul(c.n_heads, c.head_size(),
                                                                     "--heads * --head-dim");
    model.label += " with --params";
    return model;
  }
  if (!o.preset) {
    const std::string_view when = "without --preset or --params";
    require(c.d_model > 0, "--d-model", when);
    require(c.n_layers > 0, "--layers", when);
    require(c.n_heads > 0, "--heads", when);
    require(c.vocab > 0, "--vocab", when);
    require(c.context > 0, "--context", when);
  }
  model.count = dissect::count_parameters(c);
  model.size = dissect::model_size(c);
  model.d_model = c.d_model;
  return model;
}

// ---- printing -----------------------------------------------------------------------------------

std::string number(double value) {
  char buffer[32];
  const auto result = std::to_chars(buffer, buffer + sizeof buffer, value);  // shortest round trip
  return std::string(buffer, result.ptr);
}

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

std::string scientific(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.2e", value);
  return buffer;
}

class JsonWriter {
 public:
  explicit JsonWriter(std::ostream& out) : out_(out) {}
  void open(std::string_view key = {}) {
    separate(key);
    out_ << '{';
    first_ = true;
    ++depth_;
  }
  void close() {
    --depth_;
    out_ << '\n' << std::string(2 * depth_, ' ') << '}';
    first_ = false;
    if (depth_ == 0) out_ << '\n';
  }
  void raw(std::string_view key, std::string_view text) {
    separate(key);
    out_ << text;
  }
  void integer(std::string_view key, index_t value) { raw(key, std::to_string(value)); }
  void real(std::string_view key, double value) { raw(key, number(value)); }
  void text(std::string_view key, std::string_view value) {
    raw(key, "\"" + std::string(value) + "\"");  // only our own identifiers: nothing to escape
  }
  template <class T>
  void maybe(std::string_view key, const std::optional<T>& value) {
    if (!value) {
      raw(key, "null");
    } else if constexpr (std::is_floating_point_v<T>) {
      real(key, *value);
    } else {
      integer(key, *value);
    }
  }

 private:
  void separate(std::string_view key) {
    if (depth_ > 0) out_ << (first_ ? "" : ",") << '\n' << std::string(2 * depth_, ' ');
    if (!key.empty()) out_ << '"' << key << "\": ";
    first_ = false;
  }
  std::ostream& out_;
  int depth_ = 0;
  bool first_ = true;
};

template <class T, class F>
auto if_set(const std::optional<T>& value, F f) -> std::optional<decltype(f(*value))> {
  if (!value) return std::nullopt;
  return f(*value);
}

void print_json(const Model& model, const dissect::Budget& b) {
  const auto& m = b.memory;
  const auto& d = b.decode;
  const auto& p = b.prefill;
  JsonWriter json(std::cout);
  json.open();
  json.open("model");
  json.text("name", model.label);
  json.integer("n_layers", b.model.n_layers);
  json.integer("n_heads", b.model.n_heads);
  json.integer("n_kv_heads", b.model.n_kv_heads);
  json.integer("head_dim", b.model.head_dim);
  json.maybe("d_model", model.d_model);
  json.close();
  json.open("parameters");
  json.integer("total", b.model.parameters);
  const std::optional<index_t> approx = if_set(
      model.d_model, [&](index_t D) { return dissect::approx_parameters(D, b.model.n_layers); });
  json.maybe("approx_12d2l", approx);
  json.maybe("coverage", if_set(approx, [&](index_t a) {
               return static_cast<double>(a) / static_cast<double>(b.model.parameters);
             }));
  if (model.count) {
    const dissect::ParameterCount& c = *model.count;
    json.integer("token_embedding", c.token_embedding);
    json.integer("position_embedding", c.position_embedding);
    json.integer("attention_per_layer", c.per_layer.attention);
    json.integer("ffn_per_layer", c.per_layer.ffn);
    json.integer("norms_per_layer", c.per_layer.norms);
    json.integer("layers", c.layers);
    json.integer("final_norm", c.final_norm);
    json.integer("output_head", c.output_head);
  }
  json.close();
  json.open("inputs");
  json.text("dtype", dissect::dtype_name(b.inputs.weight_dtype));
  json.text("kv_dtype", dissect::dtype_name(b.inputs.kv_dtype));
  json.integer("context", b.inputs.context);
  json.maybe("batch", if_set(d, [](const dissect::DecodeTime& t) { return t.batch; }));
  json.maybe("gpu_memory_bytes", b.inputs.memory_bytes);
  json.real("reserve", b.inputs.reserve);
  json.maybe("bandwidth_bytes_per_s", b.inputs.bandwidth);
  json.maybe("peak_flops", b.inputs.peak_flops);
  json.close();
  json.integer("weights_bytes", b.weights_bytes);
  json.integer("kv_bytes_per_token", b.kv_bytes_per_token);
  json.integer("kv_bytes_per_sequence", b.kv_bytes_per_sequence);
  using Fit = dissect::MemoryFit;
  json.maybe("reserve_bytes", if_set(m, [](const Fit& f) { return f.reserve_bytes; }));
  json.maybe("free_bytes", if_set(m, [](const Fit& f) { return f.free_bytes; }));
  json.maybe("free_after_first_bytes",
             if_set(m, [](const Fit& f) { return f.free_after_first_bytes; }));
  json.maybe("max_sequences", if_set(m, [](const Fit& f) { return f.max_sequences; }));
  json.maybe("sequences_fractional", if_set(m, [](const Fit& f) { return f.sequences; }));
  using Decode = dissect::DecodeTime;
  json.maybe("decode_ms_per_step", if_set(d, [](const Decode& t) { return t.ms_per_step; }));
  json.maybe("decode_ms_per_token", if_set(d, [](const Decode& t) { return t.ms_per_token; }));
  json.maybe("decode_ms_per_step_with_kv",
             if_set(d, [](const Decode& t) { return t.ms_per_step_with_kv; }));
  json.integer("prefill_flops", b.prefill_flops);
  json.integer("prefill_attention_flops", b.prefill_attention_flops);
  using Prefill = dissect::PrefillTime;
  json.maybe("prefill_ms", if_set(p, [](const Prefill& t) { return t.ms; }));
  json.maybe("prefill_ms_with_attention",
             if_set(p, [](const Prefill& t) { return t.ms_with_attention; }));
  json.open("training_adam_bytes");
  json.integer("weights", b.training.weights);
  json.integer("gradients", b.training.gradients);
  json.integer("master_weights", b.training.master_weights);
  json.integer("adam_moments", b.training.adam_moments);
  json.integer("total", b.training.total);
  json.close();
  json.close();
}

// The label padded to a fixed width in characters: printf's %-30s counts bytes, and the labels
// carry UTF-8 (·, ²).
std::string label_column(std::string_view label) {
  constexpr std::size_t width = 32;
  std::size_t characters = 0;
  for (char c : label) characters += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return "  " + std::string(label) + std::string(characters < width ? width - characters : 1, ' ');
}

void row(std::string_view label, const std::string& value) {
  std::printf("%s%s\n", label_column(label).c_str(), value.c_str());
}

// One table row: label, exact bytes, GB, GiB.
void bytes_row(std::string_view label, index_t bytes) {
  std::printf("%s%26s B  %9s  %10s\n", label_column(label).c_str(),
              dissect::format_count(bytes).c_str(), dissect::format_decimal_bytes(bytes).c_str(),
              dissect::format_binary_bytes(bytes).c_str());
}

void print_table(const Model& model, const dissect::Budget& b) {
  const dissect::ModelSize& s = b.model;
  std::printf("model: %s\n", model.label.c_str());
  std::string params = dissect::format_count(s.parameters);
  if (model.d_model) {
    const index_t approx = dissect::approx_parameters(*model.d_model, s.n_layers);
    params += "  (12·D²·L = " + dissect::format_count(approx) + ", " +
              fixed(100.0 * static_cast<double>(approx) / static_cast<double>(s.parameters), 1) +
              "% of it)";
  }
  row("parameters", params);
  if (model.count) {
    const dissect::ParameterCount& c = *model.count;
    row("  embeddings (token, pos)", dissect::format_count(c.token_embedding) + ", " +
                                         dissect::format_count(c.position_embedding));
    row("  per layer (attn, FFN, norms)", dissect::format_count(c.per_layer.attention) + ", " +
                                              dissect::format_count(c.per_layer.ffn) + ", " +
                                              dissect::format_count(c.per_layer.norms));
    row("  final norm, output head", dissect::format_count(c.final_norm) + ", " +
                                         dissect::format_count(c.output_head) +
                                         (c.output_head == 0 ? " (tied)" : ""));
  }
  row("L, H, H_kv, d_k", std::to_string(s.n_layers) + ", " + std::to_string(s.n_heads) + ", " +
                             std::to_string(s.n_kv_heads) + ", " + std::to_string(s.head_dim));

  std::printf("\nmemory (weights %s, KV cache %s, T = %lld)\n",
              std::string(dissect::dtype_name(b.inputs.weight_dtype)).c_str(),
              std::string(dissect::dtype_name(b.inputs.kv_dtype)).c_str(),
              static_cast<long long>(b.inputs.context));
  bytes_row("weights", b.weights_bytes);
  bytes_row("KV cache per token", b.kv_bytes_per_token);
  bytes_row("KV cache per sequence", b.kv_bytes_per_sequence);
  if (const auto& m = b.memory) {
    bytes_row("device memory", m->memory_bytes);
    bytes_row("reserve (" + fixed(100.0 * b.inputs.reserve, 1) + "%)", m->reserve_bytes);
    bytes_row("left after the weights", m->free_bytes);
    bytes_row("weights + 1 sequence", b.weights_bytes + b.kv_bytes_per_sequence);
    bytes_row("left after 1st sequence", m->free_after_first_bytes);
    row("sequences that fit",
        std::to_string(m->max_sequences) +
            "  (left after the weights / KV per sequence = " + fixed(m->sequences, 2) + ")");
    if (m->max_sequences > 0) {
      // Dividing what is left after the first sequence counts that sequence twice: lesson 0.1
      // §5.3 gets its "8 slots" this way; the 1st plus these is the count above.
      const double more = static_cast<double>(m->free_after_first_bytes) /
                          static_cast<double>(b.kv_bytes_per_sequence);
      row("  besides the 1st",
          std::to_string(m->max_sequences - 1) +
              " more  (left after the 1st / KV per sequence = " + fixed(more, 2) + ")");
    }
    if (m->free_bytes < 0) row("WARNING", "the weights alone do not fit");
  } else {
    row("device memory", "not given (--gpu-memory)");
  }

  std::printf("\ndecode (memory-bound: every step reads all weights)\n");
  if (const auto& d = b.decode) {
    row("bandwidth", fixed(*b.inputs.bandwidth / 1e12, 3) + " TB/s");
    row("per step", fixed(d->ms_per_step, 2) + " ms");
    row("per token at batch " + std::to_string(d->batch), fixed(d->ms_per_token, 2) + " ms");
    row("per step + " + std::to_string(d->batch) + " full KV caches",
        fixed(d->ms_per_step_with_kv, 2) + " ms");
    if (b.memory && d->batch > b.memory->max_sequences) {
      row("WARNING", "batch " + std::to_string(d->batch) + " exceeds the " +
                         std::to_string(b.memory->max_sequences) + " sequences that fit");
    }
  } else {
    row("bandwidth", "not given (--bandwidth)");
  }

  std::printf("\nprefill of T = %lld tokens (compute-bound)\n",
              static_cast<long long>(b.inputs.context));
  row("2·params·T", scientific(static_cast<double>(b.prefill_flops)) + " FLOP");
  row("attention 4·L·T²·H·d_k", scientific(static_cast<double>(b.prefill_attention_flops)) +
                                    " FLOP (dense; causal kernels skip half)");
  if (const auto& p = b.prefill) {
    row("peak", fixed(*b.inputs.peak_flops / 1e12, 1) + " TFLOP/s");
    row("time (2·params·T)", fixed(p->ms, 1) + " ms");
    row("time with attention", fixed(p->ms_with_attention, 1) + " ms");
  } else {
    row("peak", "not given (--peak)");
  }

  std::printf(
      "\ntraining with Adam (%s weights and grads, fp32 master and moments; no activations)\n",
      std::string(dissect::dtype_name(b.inputs.weight_dtype)).c_str());
  bytes_row("weights", b.training.weights);
  bytes_row("gradients", b.training.gradients);
  bytes_row("fp32 master weights", b.training.master_weights);
  bytes_row("Adam moments (2 x fp32)", b.training.adam_moments);
  bytes_row("total", b.training.total);
}

void list_presets() {
  for (const dissect::Preset& preset : dissect::presets()) {
    std::printf("  %-12s %s\n", std::string(preset.name).c_str(),
                std::string(preset.description).c_str());
  }
}

int run(const std::vector<std::string_view>& args) {
  const Options o = parse_options(args);
  if (o.help) {
    std::cout << help_text;
    return 0;
  }
  if (o.list_presets) {
    list_presets();
    return 0;
  }
  const Model model = build_model(o);
  dissect::BudgetInputs inputs;
  inputs.weight_dtype = o.dtype;
  inputs.kv_dtype = o.kv_dtype.value_or(o.dtype);
  if (o.context)
    inputs.context = *o.context;
  else if (o.preset)
    inputs.context = dissect::find_preset(*o.preset).config.context;
  require(inputs.context > 0, "--context", "(no preset supplies one)");
  inputs.batch = o.batch;
  inputs.memory_bytes = o.memory;
  inputs.reserve = o.reserve;
  inputs.bandwidth = o.bandwidth;
  inputs.peak_flops = o.peak;
  const dissect::Budget budget = dissect::compute_budget(model.size, inputs);
  if (o.json)
    print_json(model, budget);
  else
    print_table(model, budget);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(std::vector<std::string_view>(argv + 1, argv + argc));
  } catch (const dissect::Error& error) {
    std::cerr << "budget: error: " << error.what() << "\n(see budget --help)\n";
    return 2;
  } catch (const std::exception& error) {
    std::cerr << "budget: internal error: " << error.what() << '\n';
    return 1;
  }
}
