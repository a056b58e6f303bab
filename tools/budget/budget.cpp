// tools/budget/budget.cpp — the `budget` tool: how many users fit on one card, and how fast.
//
//   budget --preset llama-7b --context 2048 --dtype fp16 --gpu-memory 24GB
//   budget --params 7e9 --layers 32 --heads 32 --head-dim 128 --context 2048 --dtype fp16
//          --gpu-memory 24GB --bandwidth 1.5TB/s --peak 300TFLOPS [--json]
//
// All arithmetic lives in dissect/accounting/budget.hpp and dissect/accounting/model_shape.hpp,
// value parsing in tools/common/parse.hpp; this file reads the flags (CLI11), builds the model,
// computes the whole report and only then prints it, so an error never leaves half an output on
// stdout. Exit status: 0 ok, 2 bad input, 1 anything else.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <exception>
#include <functional>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/accounting/budget.hpp"
#include "dissect/accounting/config.hpp"
#include "dissect/accounting/count.hpp"
#include "tools/common/parse.hpp"
#include "tools/common/table.hpp"

namespace {

using dissect::ConfigError;
using dissect::index_t;
namespace tools = dissect::tools;

constexpr int exit_ok = 0;
constexpr int exit_other = 1;
constexpr int exit_bad_input = 2;

// ---- flags --------------------------------------------------------------------------------------

struct Options {
  std::optional<std::string> preset;
  std::optional<index_t> params, d_model, layers, heads, kv_heads, head_dim, ffn, vocab, context,
      batch, experts, experts_per_token;
  std::optional<bool> tied, bias;
  std::optional<dissect::Norm> norm;
  std::optional<dissect::Positions> positions;
  std::optional<dissect::Ffn> ffn_kind;
  dissect::Dtype dtype = dissect::Dtype::fp16;
  std::optional<dissect::Dtype> kv_dtype;
  std::optional<index_t> memory;
  double reserve = 0.0;
  std::optional<double> bandwidth, peak;
  std::optional<index_t> tensor_parallel;
  bool json = false, list_presets = false;
};

constexpr const char* footer = R"(
Usage:
  budget --preset NAME [overrides] [device] [--json]
  budget --params N --layers L --heads H [--kv-heads H_kv] (--head-dim d_k | --d-model D)
         --context T [device] [--json]
  budget --d-model D --layers L --heads H --vocab V --context T [style] [device] [--json]

The preset is applied first and every other model flag overrides its field, in any order;
--head-dim is re-derived as D / H when D or H is overridden. --context is also the model's
context, which sizes a learned position table. Without a preset the style is GPT-2's:
layernorm, learned, bias, mlp, tied, F = 4·D.

Prefill FLOPs are the forward pass's: every matrix product by weights over the T tokens, the
output head included (2·W·T), plus attention's Q·Kᵀ and P·V over the full T×T square in every
layer (2·2·H·T²·d_k·L). Embedding lookups, norms and elementwise work are not counted. With
--params the matrix weights W are unknown and the parameter count stands in for them.

A mixture of experts (--experts E [--experts-per-token k], or --preset mixtral-8x7b) keeps all
its experts in memory, while its FLOPs are those of the router and the k experts each token
uses, and a decode step over B sequences reads the dense weights and the E·(1 − (1 − k/E)^B)
experts a uniform router is expected to touch (k of E for one sequence).

Sizes print as exact bytes, GB (10^9) and GiB (2^30).

Exit status: 0 ok; 2 bad input (an unknown flag, an unreadable or impossible value, a model
that cannot exist, a result that overflows or is not finite); 1 any other failure.
)";

/// Every flag of the tool, writing into `o`. Each callback runs as its flag is read
/// (trigger_on_parse), so flags act in command-line order and a repeated flag's last value wins,
/// and a bad value stops the parse with a ConfigError naming the flag.
void add_flags(CLI::App& app, Options& o) {
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  const auto valued = [&](const std::string& flag, const std::string& type,
                          const std::string& group, const std::string& help,
                          std::function<void(std::string_view flag, std::string_view value)> set) {
    app.add_option_function<std::string>(
           flag, [flag, set](const std::string& value) { set(flag, value); }, help)
        ->type_name(type)
        ->group(group)
        ->trigger_on_parse();
  };
  const auto count = [&](const std::string& flag, const std::string& type, const std::string& help,
                         std::optional<index_t>& field) {
    valued(flag, type, "Model", help,
           [&field](auto f, auto v) { field = tools::parse_count(v, f); });
  };
  const auto flag = [&](const std::string& name, const std::string& group, const std::string& help,
                        std::function<void()> set) {
    app.add_flag_callback(name, std::move(set), help)->group(group)->trigger_on_parse();
  };

  valued("--preset", "NAME", "Model", "start from a public model (see --list-presets)",
         [&](auto, auto v) { o.preset = std::string(v); });
  flag("--list-presets", "Model", "print the presets and exit", [&] { o.list_presets = true; });
  count("--params", "N",
        "total parameter count instead of counting it from the shapes "
        "(7000000000, 7e9, 7B, 124M)",
        o.params);
  count("--d-model", "D", "model width D", o.d_model);
  count("--layers", "L", "number of layers L", o.layers);
  count("--heads", "H", "query heads H", o.heads);
  count("--kv-heads", "H_kv", "key/value heads (grouped-query attention); default H", o.kv_heads);
  count("--head-dim", "d_k", "width of one head; default D / H", o.head_dim);
  count("--ffn", "F", "FFN width F; default 4·D without a preset", o.ffn);
  count("--vocab", "V", "vocabulary size V", o.vocab);
  count("--context", "T", "tokens per sequence held in the KV cache (and the model's context)",
        o.context);
  flag("--tied", "Model", "output head shares the token embedding", [&] { o.tied = true; });
  flag("--untied", "Model", "output head has its own weights", [&] { o.tied = false; });
  valued("--norm", "KIND", "Model", "layernorm (weight + bias) or rmsnorm (weight only)",
         [&](auto f, auto v) { o.norm = tools::parse_norm(v, f); });
  valued("--positions", "KIND", "Model", "learned (a [T, D] table) or rotary (no parameters)",
         [&](auto f, auto v) { o.positions = tools::parse_positions(v, f); });
  flag("--bias", "Model", "biases on the linear layers", [&] { o.bias = true; });
  flag("--no-bias", "Model", "no biases", [&] { o.bias = false; });
  flag("--mlp", "Model", "FFN D → F → D with two matrices",
       [&] { o.ffn_kind = dissect::Ffn::mlp; });
  flag("--gated", "Model", "SwiGLU FFN with three matrices",
       [&] { o.ffn_kind = dissect::Ffn::gated; });
  count("--experts", "E",
        "a mixture of E experts in every layer, each an FFN of width F, behind a router",
        o.experts);
  count("--experts-per-token", "k", "experts each token is routed to (default 2)",
        o.experts_per_token);

  valued("--dtype", "DTYPE", "Precision",
         "weight dtype: fp32, fp16, bf16, fp8, int8, int4 "
         "(default fp16)",
         [&](auto f, auto v) { o.dtype = tools::parse_dtype(v, f); });
  valued("--kv-dtype", "DTYPE", "Precision", "KV cache dtype (default: the weight dtype)",
         [&](auto f, auto v) { o.kv_dtype = tools::parse_dtype(v, f); });

  const std::string device = "Device (each optional; what it feeds is left out when missing)";
  valued("--gpu-memory", "SIZE", device, "device memory: 24GB (10^9), 80GiB (2^30), or bytes",
         [&](auto f, auto v) { o.memory = tools::parse_bytes(v, f); });
  valued("--reserve", "FRAC", device, "fraction of memory kept free: 0.2 or 20% (default 0)",
         [&](auto f, auto v) { o.reserve = tools::parse_fraction(v, f); });
  valued("--bandwidth", "RATE", device, "memory bandwidth: 1.5TB/s, 900GB/s, 2TiB/s",
         [&](auto f, auto v) { o.bandwidth = tools::parse_bandwidth(v, f); });
  valued("--peak", "RATE", device, "peak compute: 300TFLOPS, 312TFLOP/s, 3e14",
         [&](auto f, auto v) { o.peak = tools::parse_flops(v, f); });
  valued("--batch", "B", device, "sequences decoded together (default: as many as fit, else 1)",
         [&](auto f, auto v) { o.batch = tools::parse_count(v, f); });

  valued("--tensor-parallel", "P", device,
         "split over P devices (Megatron): weights and KV cache per device, all-reduce traffic",
         [&](auto f, auto v) { o.tensor_parallel = tools::parse_count(v, f); });

  flag("--json", "Output", "one JSON object instead of the table", [&] { o.json = true; });
}

// ---- the model ----------------------------------------------------------------------------------

struct Model {
  std::string label;
  dissect::ModelSize size;
  std::optional<index_t> d_model;  // for 12·D²·L; unknown for --params without D or d_k
  std::optional<dissect::TransformerConfig> config;  // when counted from the shapes
  std::optional<dissect::ParameterCount> count;
};

void require(bool present, std::string_view flag, std::string_view when) {
  if (!present) throw ConfigError(dissect::concat(flag, " is required ", when));
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
    c.d_ff = dissect::checked_mul(4, *o.d_model, "--ffn 4·D");
  if (o.vocab) c.vocab = *o.vocab;
  if (o.context) c.context = *o.context;
  if (o.tied) c.tied_embeddings = *o.tied;
  if (o.bias) c.bias = *o.bias;
  if (o.norm) c.norm = *o.norm;
  if (o.positions) c.positions = *o.positions;
  if (o.ffn_kind) c.ffn = *o.ffn_kind;
  if (o.experts) c.n_experts = *o.experts;
  if (o.experts_per_token) c.experts_per_token = *o.experts_per_token;
  return c;
}

Model build_model(const Options& o) {
  const dissect::TransformerConfig c = config_from(o);
  Model model;
  model.label = o.preset ? *o.preset : "custom";
  const bool overridden = o.d_model || o.layers || o.heads || o.kv_heads || o.head_dim || o.ffn ||
                          o.vocab || o.tied || o.bias || o.norm || o.positions || o.ffn_kind ||
                          o.experts || o.experts_per_token;
  if (o.preset && overridden) model.label += " with overrides";
  if (o.params) {
    // A raw count: only the KV shape is needed, the rest of the config may stay unset.
    const std::string_view when = "with --params (or use --preset)";
    require(c.n_layers > 0, "--layers", when);
    require(c.n_heads > 0, "--heads", when);
    require(c.head_dim || c.d_model > 0, "--head-dim (or --d-model)", when);
    if (!c.head_dim && c.d_model % c.n_heads != 0) {
      throw ConfigError(
          dissect::concat("--d-model ", c.d_model, " is not divisible by --heads ", c.n_heads));
    }
    model.size = {*o.params, c.n_layers, c.n_heads, c.kv_heads(), c.head_size()};
    // Without D, assume H·d_k = D, as in every preset.
    model.d_model = c.d_model > 0
                        ? c.d_model
                        : dissect::checked_mul(c.n_heads, c.head_size(), "--heads * --head-dim");
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
  model.config = c;
  return model;
}

// ---- the report: everything computed and checked before anything prints -------------------------

/// A double the report prints, checked: a non-finite one is bad input, blamed on `flag` (a rate
/// so small that a time divided by it leaves the double range).
void require_finite(double value, std::string_view flag, std::string_view what) {
  if (!std::isfinite(value)) {
    throw ConfigError(
        dissect::concat(flag, ": too small: the ", what, " is not finite (", value, " ms)"));
  }
}

struct Report {
  Model model;
  dissect::Budget budget;
  std::optional<index_t> approx;         // 12·D²·L, unset when unknown or beyond int64
  std::optional<double> coverage;        // approx / parameters
  std::optional<double> more_sequences;  // left after the 1st / KV per sequence
  std::optional<dissect::TensorParallelBudget> tensor_parallel;  // with --tensor-parallel
};

Report compute(const Options& o) {
  Report r;
  r.model = build_model(o);
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
  r.budget = r.model.config ? dissect::compute_budget(*r.model.config, inputs)
                            : dissect::compute_budget(r.model.size, inputs);
  const dissect::Budget& b = r.budget;

  if (r.model.count) {
    r.approx = r.model.count->approx_12d2l;
    r.coverage = r.model.count->coverage;
  } else if (r.model.d_model) {
    r.approx = dissect::try_approx_parameters(*r.model.d_model, b.model.n_layers);
    if (r.approx)
      r.coverage = static_cast<double>(*r.approx) / static_cast<double>(b.model.parameters);
  }
  if (b.memory && b.memory->max_sequences > 0) {
    r.more_sequences = static_cast<double>(b.memory->free_after_first_bytes) /
                       static_cast<double>(b.kv_bytes_per_sequence);
  }
  if (o.tensor_parallel) {
    // D is known whenever the KV shape is: from the config, or H·d_k with --params.
    try {
      r.tensor_parallel =
          dissect::tensor_parallel_budget(b, r.model.d_model.value_or(0), *o.tensor_parallel);
    } catch (const ConfigError& error) {
      throw ConfigError(dissect::concat("--tensor-parallel: ", error.what()));
    }
  }
  // The only doubles that can leave the finite range come from the two rates.
  if (b.decode) {
    require_finite(b.decode->ms_per_step, "--bandwidth", "decode time per step");
    require_finite(b.decode->ms_per_token, "--bandwidth", "decode time per token");
    require_finite(b.decode->ms_per_step_with_kv, "--bandwidth", "decode time with the KV caches");
  }
  if (b.prefill) {
    require_finite(b.prefill->ms, "--peak", "prefill time");
    require_finite(b.prefill->ms_linear, "--peak", "prefill time of the linear products");
  }
  return r;
}

// ---- JSON ---------------------------------------------------------------------------------------

using Json = nlohmann::ordered_json;

template <class T>
Json or_null(const std::optional<T>& value) {
  return value ? Json(*value) : Json(nullptr);
}

/// `value->*field`, or null when the part of the budget it belongs to was not computed.
template <class T, class Field>
Json field_or_null(const std::optional<T>& value, Field T::*field) {
  return value ? Json((*value).*field) : Json(nullptr);
}

std::string render_json(const Report& r) {
  const dissect::Budget& b = r.budget;
  const auto& m = b.memory;
  const auto& d = b.decode;
  const auto& p = b.prefill;
  Json json;
  json["model"] = {{"name", r.model.label},        {"n_layers", b.model.n_layers},
                   {"n_heads", b.model.n_heads},   {"n_kv_heads", b.model.n_kv_heads},
                   {"head_dim", b.model.head_dim}, {"d_model", or_null(r.model.d_model)}};
  Json& params = json["parameters"];
  params["total"] = b.model.parameters;
  params["approx_12d2l"] = or_null(r.approx);
  params["coverage"] = or_null(r.coverage);
  if (const auto& c = r.model.count) {
    params["token_embedding"] = c->token_embedding;
    params["position_embedding"] = c->position_embedding;
    params["attention_per_layer"] = c->per_layer.attention;
    params["ffn_per_layer"] = c->per_layer.ffn;
    params["norms_per_layer"] = c->per_layer.norms;
    params["layers"] = c->layers;
    params["final_norm"] = c->final_norm;
    params["output_head"] = c->output_head;
    params["active"] = c->active;
    params["experts"] = c->experts;
  }
  params["linear_weights"] = b.linear_weights;
  params["linear_weights_exact"] = b.linear_weights_exact;
  json["inputs"] = {{"dtype", dissect::dtype_name(b.inputs.weight_dtype)},
                    {"kv_dtype", dissect::dtype_name(b.inputs.kv_dtype)},
                    {"context", b.inputs.context},
                    {"batch", field_or_null(d, &dissect::DecodeTime::batch)},
                    {"gpu_memory_bytes", or_null(b.inputs.memory_bytes)},
                    {"reserve", b.inputs.reserve},
                    {"bandwidth_bytes_per_s", or_null(b.inputs.bandwidth)},
                    {"peak_flops", or_null(b.inputs.peak_flops)}};
  json["weights_bytes"] = b.weights_bytes;
  json["kv_bytes_per_token"] = b.kv_bytes_per_token;
  json["kv_bytes_per_sequence"] = b.kv_bytes_per_sequence;
  json["single_sequence_bytes"] = b.single_sequence_bytes;
  using Fit = dissect::MemoryFit;
  using Decode = dissect::DecodeTime;
  using Prefill = dissect::PrefillTime;
  json["reserve_bytes"] = field_or_null(m, &Fit::reserve_bytes);
  json["free_bytes"] = field_or_null(m, &Fit::free_bytes);
  json["free_after_first_bytes"] = field_or_null(m, &Fit::free_after_first_bytes);
  json["max_sequences"] = field_or_null(m, &Fit::max_sequences);
  json["sequences_fractional"] = field_or_null(m, &Fit::sequences);
  json["decode_ms_per_step"] = field_or_null(d, &Decode::ms_per_step);
  json["decode_ms_per_token"] = field_or_null(d, &Decode::ms_per_token);
  json["decode_ms_per_step_with_kv"] = field_or_null(d, &Decode::ms_per_step_with_kv);
  json["prefill_flops"] = b.prefill_flops;
  json["prefill_linear_flops"] = b.prefill_linear_flops;
  json["prefill_attention_flops"] = b.prefill_attention_flops;
  json["prefill_ms"] = field_or_null(p, &Prefill::ms);
  json["prefill_ms_linear"] = field_or_null(p, &Prefill::ms_linear);
  json["training_adam_bytes"] = {{"weights", b.training.weights},
                                 {"gradients", b.training.gradients},
                                 {"master_weights", b.training.master_weights},
                                 {"adam_moments", b.training.adam_moments},
                                 {"total", b.training.total}};
  if (const auto& tp = r.tensor_parallel) {
    json["tensor_parallel"] = {
        {"ranks", tp->ranks},
        {"weights_bytes_per_device", tp->weights_bytes_per_device},
        {"kv_bytes_per_token_per_device", tp->kv_bytes_per_token_per_device},
        {"kv_bytes_per_sequence_per_device", tp->kv_bytes_per_sequence_per_device},
        {"all_reduce_values_per_token_per_layer", tp->all_reduce_values_per_token_per_layer},
        {"all_reduce_bytes_per_token_per_layer", tp->all_reduce_bytes_per_token_per_layer}};
  } else {
    json["tensor_parallel"] = nullptr;
  }
  return json.dump(2) + '\n';
}

// ---- the table ----------------------------------------------------------------------------------

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

/// The table's text, built row by row.
class TableText {
 public:
  void line(const std::string& text) { out_ += text + '\n'; }

  /// A label padded to a fixed width in columns, then the value.
  void row(std::string_view label, const std::string& value) {
    out_ += "  " + tools::pad_right(std::string(label), 32) + value + '\n';
  }

  /// Label, exact bytes, GB, GiB.
  void bytes_row(std::string_view label, index_t bytes) {
    row(label, tools::pad_left(dissect::format_count(bytes), 26) + " B  " +
                   tools::pad_left(dissect::format_decimal_bytes(bytes), 9) + "  " +
                   tools::pad_left(dissect::format_binary_bytes(bytes), 10));
  }

  /// FLOPs in scientific notation (what a reader compares), then exact.
  void flops_row(std::string_view label, index_t flops) {
    row(label,
        scientific(static_cast<double>(flops)) + " FLOP  (" + dissect::format_count(flops) + ")");
  }

  const std::string& text() const { return out_; }

 private:
  std::string out_;
};

std::string render_table(const Report& r) {
  const dissect::Budget& b = r.budget;
  const dissect::ModelSize& s = b.model;
  TableText t;
  t.line("model: " + r.model.label);
  std::string params = dissect::format_count(s.parameters);
  if (r.approx && r.coverage) {
    params += "  (12·D²·L = " + dissect::format_count(*r.approx) + ", " +
              fixed(100.0 * *r.coverage, 1) + "% of it)";
  } else if (r.model.d_model) {
    params += "  (12·D²·L: unavailable, beyond int64)";
  }
  t.row("parameters", params);
  if (const auto& c = r.model.count) {
    t.row("  embeddings (token, pos)", dissect::format_count(c->token_embedding) + ", " +
                                           dissect::format_count(c->position_embedding));
    t.row("  per layer (attn, FFN, norms)", dissect::format_count(c->per_layer.attention) + ", " +
                                                dissect::format_count(c->per_layer.ffn) + ", " +
                                                dissect::format_count(c->per_layer.norms));
    t.row("  final norm, output head", dissect::format_count(c->final_norm) + ", " +
                                           dissect::format_count(c->output_head) +
                                           (c->output_head == 0 ? " (tied)" : ""));
    if (c->experts > 0) {
      t.row("  experts (all layers)", dissect::format_count(c->experts));
      t.row("  active per token",
            dissect::format_count(c->active) + "  (" +
                fixed(100.0 * static_cast<double>(c->active) / static_cast<double>(c->total), 1) +
                "% of the parameters)");
    }
  }
  t.row("L, H, H_kv, d_k", std::to_string(s.n_layers) + ", " + std::to_string(s.n_heads) + ", " +
                               std::to_string(s.n_kv_heads) + ", " + std::to_string(s.head_dim));

  t.line("");
  t.line(dissect::concat("memory (weights ", dissect::dtype_name(b.inputs.weight_dtype),
                         ", KV cache ", dissect::dtype_name(b.inputs.kv_dtype),
                         ", T = ", b.inputs.context, ")"));
  t.bytes_row("weights", b.weights_bytes);
  t.bytes_row("KV cache per token", b.kv_bytes_per_token);
  t.bytes_row("KV cache per sequence", b.kv_bytes_per_sequence);
  if (const auto& m = b.memory) {
    t.bytes_row("device memory", m->memory_bytes);
    t.bytes_row("reserve (" + fixed(100.0 * b.inputs.reserve, 1) + "%)", m->reserve_bytes);
    t.bytes_row("left after the weights", m->free_bytes);
    t.bytes_row("weights + 1 sequence", b.single_sequence_bytes);
    t.bytes_row("left after 1st sequence", m->free_after_first_bytes);
    t.row("sequences that fit",
          std::to_string(m->max_sequences) +
              "  (left after the weights / KV per sequence = " + fixed(m->sequences, 2) + ")");
    if (r.more_sequences) {
      // Dividing what is left after the first sequence counts that sequence twice: the 1st plus
      // these is the count above (lesson 0.1 §5.3 gets its "8 slots" this way).
      t.row("  besides the 1st", std::to_string(m->max_sequences - 1) +
                                     " more  (left after the 1st / KV per sequence = " +
                                     fixed(*r.more_sequences, 2) + ")");
    }
    if (m->free_bytes < 0) t.row("WARNING", "the weights alone do not fit");
  } else {
    t.row("device memory", "not given (--gpu-memory)");
  }

  t.line("");
  t.line(b.model.expert_parameters > 0
             ? "decode (memory-bound: every step reads the dense weights and the experts its "
               "batch was routed to)"
             : "decode (memory-bound: every step reads all weights)");
  if (const auto& d = b.decode) {
    t.row("bandwidth", fixed(*b.inputs.bandwidth / 1e12, 3) + " TB/s");
    t.row("per step", fixed(d->ms_per_step, 2) + " ms");
    t.row("per token at batch " + std::to_string(d->batch), fixed(d->ms_per_token, 2) + " ms");
    t.row("per step + " + std::to_string(d->batch) + " full KV caches",
          fixed(d->ms_per_step_with_kv, 2) + " ms");
    if (b.memory && d->batch > b.memory->max_sequences) {
      t.row("WARNING", "batch " + std::to_string(d->batch) + " exceeds the " +
                           std::to_string(b.memory->max_sequences) + " sequences that fit");
    }
  } else {
    t.row("bandwidth", "not given (--bandwidth)");
  }

  t.line("");
  t.line(dissect::concat("prefill of T = ", b.inputs.context,
                         " tokens (compute-bound; the forward pass's matrix products)"));
  // With a bare parameter count the matrix weights W are unknown: the count stands in for them.
  const std::string linear = b.linear_weights_exact ? "2·W·T" : "2·params·T";
  t.flops_row("linear " + linear, b.prefill_linear_flops);
  t.flops_row("attention 4·L·T²·H·d_k", b.prefill_attention_flops);
  t.flops_row("total", b.prefill_flops);
  if (const auto& p = b.prefill) {
    t.row("peak", fixed(*b.inputs.peak_flops / 1e12, 1) + " TFLOP/s");
    t.row("time (" + linear + ")", fixed(p->ms_linear, 1) + " ms");
    t.row("time (total)", fixed(p->ms, 1) + " ms");
  } else {
    t.row("peak", "not given (--peak)");
  }
  t.line(b.linear_weights_exact
             ? "  (W = " + dissect::format_count(b.linear_weights) +
                   " matrix weights, the output head included; attention over the full T×T)"
             : "  (--params: every parameter counted as a matrix weight; attention over the full "
               "T×T)");

  if (const auto& tp = r.tensor_parallel) {
    t.line("");
    t.line(dissect::concat("tensor parallel over P = ", tp->ranks,
                           " devices (Megatron: matrices and heads split)"));
    t.bytes_row("weights per device", tp->weights_bytes_per_device);
    t.bytes_row("KV cache per token per device", tp->kv_bytes_per_token_per_device);
    t.bytes_row("KV per sequence per device", tp->kv_bytes_per_sequence_per_device);
    t.row("all-reduce per token per layer",
          dissect::format_count(tp->all_reduce_bytes_per_token_per_layer) +
              " B  (2 x D = " + dissect::format_count(tp->all_reduce_values_per_token_per_layer) +
              " values in forward; as many again in backward)");
  }

  t.line("");
  t.line(dissect::concat("training with Adam (", dissect::dtype_name(b.inputs.weight_dtype),
                         " weights and grads, fp32 master and moments; no activations)"));
  t.bytes_row("weights", b.training.weights);
  t.bytes_row("gradients", b.training.gradients);
  t.bytes_row("fp32 master weights", b.training.master_weights);
  t.bytes_row("Adam moments (2 x fp32)", b.training.adam_moments);
  t.bytes_row("total", b.training.total);
  return t.text();
}

std::string render_presets() {
  std::string out;
  for (const dissect::Preset& preset : dissect::presets()) {
    out += "  " + tools::pad_right(std::string(preset.name), 12) + " " +
           std::string(preset.description) + '\n';
  }
  return out;
}

/// Writes all of `text` to stdout at once; a failed write is an error of its own (status 1).
int emit(const std::string& text) {
  std::cout << text << std::flush;
  if (!std::cout) {
    std::cerr << "budget: error: cannot write the output\n";
    return exit_other;
  }
  return exit_ok;
}

int run(int argc, char** argv) {
  CLI::App app("budget — memory and speed budget of a transformer on one device", "budget");
  app.footer(footer);
  app.allow_extras();  // reported below as "unknown flag", with the flag's own name
  Options o;
  add_flags(app, o);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    return emit(app.help());
  } catch (const CLI::ParseError& error) {
    throw ConfigError(error.what());
  }
  if (const std::vector<std::string> extra = app.remaining(); !extra.empty()) {
    const bool is_flag = extra.front().starts_with("-");
    throw ConfigError(dissect::concat(is_flag ? "unknown flag \"" : "unexpected argument \"",
                                      extra.front(), "\""));
  }
  if (o.list_presets) return emit(render_presets());
  const Report report = compute(o);
  return emit(o.json ? render_json(report) : render_table(report));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const dissect::Error& error) {
    std::cerr << "budget: error: " << error.what() << "\n(see budget --help)\n";
    return exit_bad_input;
  } catch (const std::exception& error) {
    std::cerr << "budget: internal error: " << error.what() << '\n';
    return exit_other;
  }
}
