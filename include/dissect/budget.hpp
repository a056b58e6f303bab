// dissect/budget.hpp — what a model costs on a device: memory, KV cache, slots, decode/prefill.
//
// From a parameter count and the KV shape (L, H_kv, d_k) — or a whole TransformerConfig — plus
// dtypes, a context length and a device (memory, reserve, bandwidth, peak FLOP/s), compute the
// budget of lesson 0.1 §5.3: weight bytes, KV bytes per token and per sequence, how many
// sequences fit, decode and prefill time, and Adam's training memory. Bytes are exact int64
// (int4 rounds up); the parsers for "24GB", "1.5TB/s", "300TFLOPS" and dtype names live here
// too, so the command-line tool's input handling is tested like the rest.
#pragma once

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>

#include "dissect/config.hpp"
#include "dissect/count.hpp"
#include "dissect/error.hpp"
#include "dissect/shape.hpp"

namespace dissect {

// ---- dtypes -------------------------------------------------------------------------------------

/// Storage formats for weights and the KV cache.
enum class Dtype { fp32, fp16, bf16, fp8, int8, int4 };

/// Bits per element: 32, 16, 16, 8, 8, 4.
constexpr int dtype_bits(Dtype dtype);

/// The canonical name: "fp32", "fp16", "bf16", "fp8", "int8", "int4".
constexpr std::string_view dtype_name(Dtype dtype);

/// Bytes to store `elements` values of `dtype`, rounded up to whole bytes (int4 packs two per
/// byte, so an odd count needs one more half-empty byte).
/// @throws ConfigError naming `what` if `elements` < 0 or the size overflows int64.
index_t bytes_for(index_t elements, Dtype dtype, std::string_view what = "bytes_for");

// ---- parsing command-line values ----------------------------------------------------------------
// Every parser takes the field it reads (e.g. "--gpu-memory") and puts it first in the message of
// the ConfigError it throws. Unit letters are case-insensitive.

/// "fp32" (also "float32", "f32"), "fp16" ("float16", "half", "f16"), "bf16" ("bfloat16"),
/// "fp8", "int8" ("i8"), "int4" ("i4").
/// @throws ConfigError naming `field` and listing the accepted names.
Dtype parse_dtype(std::string_view text, std::string_view field);

/// A positive whole count: "7000000000", "7e9", "6.7e9", or with a suffix k, M, B (or G), T:
/// "7B", "124M".
/// @throws ConfigError naming `field` if it is not a number, not whole, <= 0 or beyond int64.
index_t parse_count(std::string_view text, std::string_view field);

/// A positive size in bytes: plain bytes ("24000000000", "2.4e10") or with a unit, decimal
/// kB MB GB TB PB (10³ⁿ) or binary KiB MiB GiB TiB PiB (2¹⁰ⁿ); the "B" may be left off ("24G").
/// Rounded to the nearest byte.
/// @throws ConfigError naming `field` if unreadable, <= 0 or beyond int64.
index_t parse_bytes(std::string_view text, std::string_view field);

/// A positive bandwidth in bytes per second: "1.5TB/s", "900GB/s", "2TiB/s", a plain number
/// of bytes per second, or a prefix alone ("1.5T").
/// @throws ConfigError naming `field` if unreadable or <= 0.
double parse_bandwidth(std::string_view text, std::string_view field);

/// A positive compute rate in FLOP/s: "300TFLOPS", "312TFLOP/s", "1e15", "300T".
/// @throws ConfigError naming `field` if unreadable or <= 0.
double parse_flops(std::string_view text, std::string_view field);

/// A fraction in [0, 1): "0.2" or "20%".
/// @throws ConfigError naming `field` if unreadable or outside [0, 1).
double parse_fraction(std::string_view text, std::string_view field);

// ---- printing -----------------------------------------------------------------------------------

/// Three significant digits in the largest decimal unit that keeps the value >= 1:
/// "1.07 GB", "524 kB", "14.0 GB", "-2.00 GB", "0 B".
std::string format_decimal_bytes(index_t bytes);

/// The same with binary units: "1.00 GiB", "512 KiB".
std::string format_binary_bytes(index_t bytes);

// ---- the budget ---------------------------------------------------------------------------------

/// What the budget needs to know about a model.
struct ModelSize {
  index_t parameters = 0;  ///< every weight that must sit in device memory
  index_t n_layers = 0;    ///< L
  index_t n_heads = 0;     ///< H, query heads (they set the attention FLOPs)
  index_t n_kv_heads = 0;  ///< H_kv (they set the KV cache)
  index_t head_dim = 0;    ///< d_k

  /// @throws ConfigError naming the field if a size is <= 0 or H_kv does not divide H.
  void validate() const;
};

/// The exact parameter count and KV shape of `config`.
/// @throws ConfigError if the config is invalid or its count overflows.
ModelSize model_size(const TransformerConfig& config);

/// The scenario: dtypes, context, and the device. Device fields left unset leave the matching
/// parts of the Budget unset.
struct BudgetInputs {
  Dtype weight_dtype = Dtype::fp16;
  Dtype kv_dtype = Dtype::fp16;
  index_t context = 0;                  ///< T, tokens per sequence held in the KV cache
  std::optional<index_t> batch;         ///< sequences decoded together; unset → all that fit
  std::optional<index_t> memory_bytes;  ///< device memory
  double reserve = 0.0;                 ///< fraction of memory kept free, in [0, 1)
  std::optional<double> bandwidth;      ///< memory bandwidth, bytes/s
  std::optional<double> peak_flops;     ///< FLOP/s

  /// @throws ConfigError naming the field: context or batch <= 0, memory, bandwidth or peak
  /// <= 0 (or not finite), reserve outside [0, 1).
  void validate() const;
};

/// How the device memory divides up. `free_bytes` is the lesson's "left after the weights";
/// `free_after_first_bytes` its "8.9 GB" — what remains once one sequence is admitted.
struct MemoryFit {
  index_t memory_bytes = 0;
  index_t reserve_bytes = 0;           ///< memory · reserve, rounded to the nearest byte
  index_t free_bytes = 0;              ///< memory − reserve − weights; < 0: weights do not fit
  index_t free_after_first_bytes = 0;  ///< free − one sequence's KV cache
  index_t max_sequences = 0;           ///< ⌊free / KV per sequence⌋, 0 when free < 0
  double sequences = 0.0;              ///< free / KV per sequence, clamped at 0
};

/// Decode is memory-bound: every step reads all weights once, however many sequences share it.
struct DecodeTime {
  index_t batch = 0;
  double ms_per_step = 0.0;          ///< weights / bandwidth (the lesson's estimate)
  double ms_per_token = 0.0;         ///< ms_per_step / batch
  double ms_per_step_with_kv = 0.0;  ///< also reading batch full-context KV caches: the worst step
};

/// Prefill is compute-bound: T tokens through every weight at once.
struct PrefillTime {
  double ms = 0.0;                 ///< prefill_flops / peak (the lesson's estimate)
  double ms_with_attention = 0.0;  ///< (prefill_flops + prefill_attention_flops) / peak
};

/// Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO, §3.1): weights and gradients in the
/// weight dtype, an fp32 master copy unless the weights already are fp32, two fp32 moments —
/// 16 bytes per parameter for fp16 or fp32. Activations are not included: they depend on the
/// batch and on checkpointing.
struct TrainingMemory {
  index_t weights = 0;
  index_t gradients = 0;
  index_t master_weights = 0;
  index_t adam_moments = 0;
  index_t total = 0;
};

/// Everything compute_budget derives; the optional parts need the matching device field.
struct Budget {
  ModelSize model;
  BudgetInputs inputs;
  index_t weights_bytes = 0;
  index_t kv_bytes_per_token = 0;       ///< 2 · L · H_kv · d_k · bytes: K and V, every layer
  index_t kv_bytes_per_sequence = 0;    ///< kv_bytes_per_token · T
  index_t prefill_flops = 0;            ///< 2 · parameters · T (two FLOPs per weight per token)
  index_t prefill_attention_flops = 0;  ///< 4 · L · T² · H · d_k: QKᵀ and PV, no causal skip
  TrainingMemory training;
  std::optional<MemoryFit> memory;     ///< set when memory_bytes is
  std::optional<DecodeTime> decode;    ///< set when bandwidth is
  std::optional<PrefillTime> prefill;  ///< set when peak_flops is
};

/// Bytes of `parameters` weights in `dtype` (rounded up for int4).
/// @throws ConfigError if `parameters` < 0 or the size overflows int64.
index_t weight_bytes(index_t parameters, Dtype dtype);

/// KV cache of one sequence of `context` tokens: 2 · L · T · H_kv · d_k elements of `dtype`.
/// @throws ConfigError if a size is negative or the size overflows int64.
index_t kv_cache_bytes(index_t n_layers, index_t context, index_t n_kv_heads, index_t head_dim,
                       Dtype dtype);

/// The whole budget of `model` in the scenario `inputs`.
/// @throws ConfigError naming the field for invalid inputs, or if a total overflows int64.
Budget compute_budget(const ModelSize& model, const BudgetInputs& inputs);

/// The same for a configuration, with its exact parameter count.
/// @throws ConfigError as above, or if the config is invalid.
Budget compute_budget(const TransformerConfig& config, const BudgetInputs& inputs);

// ---- implementation: dtypes ---------------------------------------------------------------------

constexpr int dtype_bits(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp32:
      return 32;
    case Dtype::fp16:
      return 16;
    case Dtype::bf16:
      return 16;
    case Dtype::fp8:
      return 8;
    case Dtype::int8:
      return 8;
    case Dtype::int4:
      return 4;
  }
  return 0;
}

constexpr std::string_view dtype_name(Dtype dtype) {
  switch (dtype) {
    case Dtype::fp32:
      return "fp32";
    case Dtype::fp16:
      return "fp16";
    case Dtype::bf16:
      return "bf16";
    case Dtype::fp8:
      return "fp8";
    case Dtype::int8:
      return "int8";
    case Dtype::int4:
      return "int4";
  }
  return "?";
}

inline index_t bytes_for(index_t elements, Dtype dtype, std::string_view what) {
  if (elements < 0) throw ConfigError(detail::concat(what, ": negative element count ", elements));
  const int bits = dtype_bits(dtype);
  if (bits % 8 == 0) return checked_mul(elements, bits / 8, what);
  // Sub-byte: ceil(elements · bits / 8) without forming elements · bits, which could overflow.
  const index_t per_byte = 8 / bits;
  return elements / per_byte + (elements % per_byte != 0 ? 1 : 0);
}

// ---- implementation: parsing --------------------------------------------------------------------

namespace detail {

inline char lower(char c) {
  return (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
}

inline bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return lower(x) == lower(y); });
}

inline std::string_view trim(std::string_view text) {
  while (!text.empty() && text.front() == ' ') text.remove_prefix(1);
  while (!text.empty() && text.back() == ' ') text.remove_suffix(1);
  return text;
}

/// A finite number at the start of `text`; `unit` receives the rest, trimmed. nullopt if there
/// is no number.
inline std::optional<double> leading_number(std::string_view text, std::string_view& unit) {
  text = trim(text);
  double value = 0.0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || !std::isfinite(value)) return std::nullopt;
  unit = trim(std::string_view(end, static_cast<std::size_t>(text.data() + text.size() - end)));
  return value;
}

struct Prefix {
  std::string_view letters;
  double scale;
};

// Decimal prefixes are powers of 10³ and binary ones of 2¹⁰, as in IEC 80000-13.
inline constexpr std::array<Prefix, 11> size_prefixes{{{"", 1.0},
                                                       {"k", 1e3},
                                                       {"m", 1e6},
                                                       {"g", 1e9},
                                                       {"t", 1e12},
                                                       {"p", 1e15},
                                                       {"ki", 1024.0},
                                                       {"mi", 1048576.0},
                                                       {"gi", 1073741824.0},
                                                       {"ti", 1099511627776.0},
                                                       {"pi", 1125899906842624.0}}};

/// The scale of `unit` = prefix + one of `suffixes` (the empty suffix is always allowed).
inline std::optional<double> unit_scale(std::string_view unit,
                                        std::initializer_list<std::string_view> suffixes,
                                        bool binary_allowed) {
  for (const Prefix& prefix : size_prefixes) {
    if (!binary_allowed && prefix.letters.size() == 2) continue;
    if (unit.size() < prefix.letters.size() ||
        !iequals(unit.substr(0, prefix.letters.size()), prefix.letters)) {
      continue;
    }
    const std::string_view rest = unit.substr(prefix.letters.size());
    if (rest.empty()) return prefix.scale;
    for (std::string_view suffix : suffixes) {
      if (iequals(rest, suffix)) return prefix.scale;
    }
  }
  return std::nullopt;
}

/// A positive rate such as "1.5TB/s" or "300TFLOPS".
inline double parse_rate(std::string_view text, std::string_view field,
                         std::initializer_list<std::string_view> suffixes, bool binary_allowed,
                         std::string_view examples) {
  std::string_view unit;
  const std::optional<double> number = leading_number(text, unit);
  const std::optional<double> scale =
      number ? unit_scale(unit, suffixes, binary_allowed) : std::nullopt;
  if (!scale) {
    throw ConfigError(concat(field, ": cannot read \"", text, "\" (examples: ", examples, ")"));
  }
  const double value = *number * *scale;
  if (!(value > 0.0) || !std::isfinite(value)) {
    throw ConfigError(concat(field, ": must be > 0 (got \"", text, "\")"));
  }
  return value;
}

/// A positive double that must be a whole number representable as int64.
inline index_t whole_positive(double value, std::string_view text, std::string_view field,
                              bool round) {
  if (round) value = std::nearbyint(value);
  if (value != std::floor(value)) {
    throw ConfigError(concat(field, ": \"", text, "\" is not a whole number"));
  }
  if (!(value > 0.0)) throw ConfigError(concat(field, ": must be > 0 (got \"", text, "\")"));
  // 2⁶³ is exactly representable; anything at or above it does not fit int64.
  if (value >= 9223372036854775808.0) {
    throw ConfigError(concat(field, ": \"", text, "\" overflows int64"));
  }
  return static_cast<index_t>(value);
}

}  // namespace detail

inline Dtype parse_dtype(std::string_view text, std::string_view field) {
  struct Name {
    std::string_view name;
    Dtype dtype;
  };
  static constexpr std::array<Name, 14> names{{{"fp32", Dtype::fp32},
                                               {"float32", Dtype::fp32},
                                               {"f32", Dtype::fp32},
                                               {"fp16", Dtype::fp16},
                                               {"float16", Dtype::fp16},
                                               {"half", Dtype::fp16},
                                               {"f16", Dtype::fp16},
                                               {"bf16", Dtype::bf16},
                                               {"bfloat16", Dtype::bf16},
                                               {"fp8", Dtype::fp8},
                                               {"int8", Dtype::int8},
                                               {"i8", Dtype::int8},
                                               {"int4", Dtype::int4},
                                               {"i4", Dtype::int4}}};
  for (const Name& name : names) {
    if (detail::iequals(detail::trim(text), name.name)) return name.dtype;
  }
  throw ConfigError(detail::concat(field, ": unknown dtype \"", text,
                                   "\" (known: fp32, fp16, bf16, fp8, int8, int4)"));
}

inline index_t parse_count(std::string_view text, std::string_view field) {
  const std::string_view trimmed = detail::trim(text);
  // Digits alone are read as an integer, so counts beyond 2⁵³ stay exact.
  index_t exact = 0;
  const auto [end, error] = std::from_chars(trimmed.data(), trimmed.data() + trimmed.size(), exact);
  if (error == std::errc() && end == trimmed.data() + trimmed.size()) {
    if (exact <= 0) throw ConfigError(detail::concat(field, ": must be > 0 (got ", exact, ")"));
    return exact;
  }
  if (error == std::errc::result_out_of_range) {
    throw ConfigError(detail::concat(field, ": \"", text, "\" overflows int64"));
  }
  std::string_view unit;
  const std::optional<double> number = detail::leading_number(trimmed, unit);
  double scale = 0.0;
  if (number) {
    if (unit.empty())
      scale = 1.0;
    else if (detail::iequals(unit, "k"))
      scale = 1e3;
    else if (detail::iequals(unit, "m"))
      scale = 1e6;
    else if (detail::iequals(unit, "b") || detail::iequals(unit, "g"))
      scale = 1e9;
    else if (detail::iequals(unit, "t"))
      scale = 1e12;
  }
  if (scale == 0.0) {
    throw ConfigError(detail::concat(field, ": cannot read \"", text,
                                     "\" as a count (examples: 7000000000, 7e9, 7B, 124M)"));
  }
  return detail::whole_positive(*number * scale, text, field, /*round=*/false);
}

inline index_t parse_bytes(std::string_view text, std::string_view field) {
  std::string_view unit;
  const std::optional<double> number = detail::leading_number(text, unit);
  const std::optional<double> scale =
      number ? detail::unit_scale(unit, {"b"}, /*binary_allowed=*/true) : std::nullopt;
  if (!scale) {
    throw ConfigError(detail::concat(field, ": cannot read \"", text,
                                     "\" as a size (examples: 24GB, 80GiB, 24000000000)"));
  }
  return detail::whole_positive(*number * *scale, text, field, /*round=*/true);
}

inline double parse_bandwidth(std::string_view text, std::string_view field) {
  return detail::parse_rate(text, field, {"b/s", "bps"}, /*binary_allowed=*/true,
                            "1.5TB/s, 900GB/s, 2TiB/s, 1.5e12");
}

inline double parse_flops(std::string_view text, std::string_view field) {
  return detail::parse_rate(text, field, {"flops", "flop/s"}, /*binary_allowed=*/false,
                            "300TFLOPS, 312TFLOP/s, 3e14");
}

inline double parse_fraction(std::string_view text, std::string_view field) {
  std::string_view unit;
  const std::optional<double> number = detail::leading_number(text, unit);
  if (!number || !(unit.empty() || unit == "%")) {
    throw ConfigError(
        detail::concat(field, ": cannot read \"", text, "\" as a fraction (examples: 0.2, 20%)"));
  }
  const double value = unit == "%" ? *number / 100.0 : *number;
  if (!(value >= 0.0 && value < 1.0)) {
    throw ConfigError(detail::concat(field, ": must be in [0, 1) (got \"", text, "\")"));
  }
  return value;
}

// ---- implementation: printing -------------------------------------------------------------------

namespace detail {

inline std::string format_scaled(index_t bytes, double base,
                                 const std::array<std::string_view, 6>& units) {
  if (bytes == 0) return "0 B";
  double value = std::abs(static_cast<double>(bytes));
  std::size_t unit = 0;
  // 999.5 rather than the base, so rounding never prints "1000 kB" or "1024 KiB".
  while (unit + 1 < units.size() && value >= 999.5) {
    value /= base;
    ++unit;
  }
  // Three significant digits; plain bytes are whole.
  const int decimals = unit == 0 ? 0 : value < 10 ? 2 : value < 100 ? 1 : 0;
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%s%.*f %s", bytes < 0 ? "-" : "", decimals, value,
                std::string(units[unit]).c_str());
  return buffer;
}

}  // namespace detail

inline std::string format_decimal_bytes(index_t bytes) {
  return detail::format_scaled(bytes, 1000.0, {"B", "kB", "MB", "GB", "TB", "PB"});
}

inline std::string format_binary_bytes(index_t bytes) {
  return detail::format_scaled(bytes, 1024.0, {"B", "KiB", "MiB", "GiB", "TiB", "PiB"});
}

// ---- implementation: the budget -----------------------------------------------------------------

inline void ModelSize::validate() const {
  const auto positive = [](index_t value, std::string_view field) {
    if (value <= 0) {
      throw ConfigError(detail::concat("ModelSize: ", field, " must be > 0 (got ", value, ")"));
    }
  };
  positive(parameters, "parameters");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(head_dim, "head_dim");
  if (n_heads % n_kv_heads != 0) {
    throw ConfigError(
        detail::concat("ModelSize: n_kv_heads ", n_kv_heads, " does not divide n_heads ", n_heads));
  }
}

inline ModelSize model_size(const TransformerConfig& config) {
  return {count_parameters(config).total, config.n_layers, config.n_heads, config.kv_heads(),
          config.head_size()};
}

inline void BudgetInputs::validate() const {
  const auto fail = [](std::string_view field, std::string_view rule, auto value) {
    throw ConfigError(detail::concat("budget: ", field, " must be ", rule, " (got ", value, ")"));
  };
  if (context <= 0) fail("context", "> 0", context);
  if (batch && *batch <= 0) fail("batch", ">= 1", *batch);
  if (memory_bytes && *memory_bytes <= 0) fail("memory_bytes", "> 0", *memory_bytes);
  if (!(reserve >= 0.0 && reserve < 1.0)) fail("reserve", "in [0, 1)", reserve);
  if (bandwidth && !(*bandwidth > 0.0 && std::isfinite(*bandwidth))) {
    fail("bandwidth", "> 0 and finite", *bandwidth);
  }
  if (peak_flops && !(*peak_flops > 0.0 && std::isfinite(*peak_flops))) {
    fail("peak_flops", "> 0 and finite", *peak_flops);
  }
}

inline index_t weight_bytes(index_t parameters, Dtype dtype) {
  return bytes_for(parameters, dtype, "weight_bytes");
}

inline index_t kv_cache_bytes(index_t n_layers, index_t context, index_t n_kv_heads,
                              index_t head_dim, Dtype dtype) {
  constexpr std::string_view what = "kv_cache_bytes";
  if (n_layers < 0 || context < 0 || n_kv_heads < 0 || head_dim < 0) {
    throw ConfigError(detail::concat(what, ": negative size (L ", n_layers, ", T ", context,
                                     ", H_kv ", n_kv_heads, ", d_k ", head_dim, ")"));
  }
  // The 2 is K and V: forgetting it is the lesson's first failure mode.
  return bytes_for(checked_product({2, n_layers, context, n_kv_heads, head_dim}, what), dtype,
                   what);
}

namespace detail {

inline double milliseconds(double amount, double per_second) {
  return amount / per_second * 1e3;
}

inline MemoryFit fit_memory(index_t memory_bytes, double reserve, index_t weights,
                            index_t kv_per_sequence) {
  MemoryFit fit;
  fit.memory_bytes = memory_bytes;
  const double reserve_bytes = static_cast<double>(memory_bytes) * reserve;
  // Near 2⁶³ the double product can round up past memory (and past int64): clamp first.
  fit.reserve_bytes = reserve_bytes >= static_cast<double>(memory_bytes)
                          ? memory_bytes
                          : static_cast<index_t>(std::llround(reserve_bytes));
  // memory − reserve and weights are in [0, 2⁶³), so this difference cannot overflow; the next
  // one can, when the weights alone already overshoot by almost 2⁶³.
  fit.free_bytes = memory_bytes - fit.reserve_bytes - weights;
  fit.free_after_first_bytes = checked_add(fit.free_bytes, -kv_per_sequence, "free_after_first");
  if (fit.free_bytes > 0) {
    fit.max_sequences = fit.free_bytes / kv_per_sequence;
    fit.sequences = static_cast<double>(fit.free_bytes) / static_cast<double>(kv_per_sequence);
  }
  return fit;
}

inline TrainingMemory adam_memory(index_t parameters, Dtype weight_dtype) {
  constexpr std::string_view what = "training memory";
  TrainingMemory memory;
  memory.weights = bytes_for(parameters, weight_dtype, what);
  memory.gradients = memory.weights;
  if (weight_dtype != Dtype::fp32) memory.master_weights = bytes_for(parameters, Dtype::fp32, what);
  memory.adam_moments = checked_mul(2, bytes_for(parameters, Dtype::fp32, what), what);
  memory.total = checked_sum(
      {memory.weights, memory.gradients, memory.master_weights, memory.adam_moments}, what);
  return memory;
}

}  // namespace detail

inline Budget compute_budget(const ModelSize& model, const BudgetInputs& inputs) {
  model.validate();
  inputs.validate();
  const index_t T = inputs.context;
  Budget budget;
  budget.model = model;
  budget.inputs = inputs;
  budget.weights_bytes = weight_bytes(model.parameters, inputs.weight_dtype);
  budget.kv_bytes_per_token =
      kv_cache_bytes(model.n_layers, 1, model.n_kv_heads, model.head_dim, inputs.kv_dtype);
  budget.kv_bytes_per_sequence =
      kv_cache_bytes(model.n_layers, T, model.n_kv_heads, model.head_dim, inputs.kv_dtype);
  budget.prefill_flops = checked_product({2, model.parameters, T}, "prefill_flops");
  // Per layer and head: QKᵀ is [T, d_k]·[d_k, T] and PV is [T, T]·[T, d_k], 2·T²·d_k each. GQA
  // shares K and V between heads but not this work.
  budget.prefill_attention_flops = checked_product(
      {4, model.n_layers, T, T, model.n_heads, model.head_dim}, "prefill_attention_flops");
  budget.training = detail::adam_memory(model.parameters, inputs.weight_dtype);

  if (inputs.memory_bytes) {
    budget.memory = detail::fit_memory(*inputs.memory_bytes, inputs.reserve, budget.weights_bytes,
                                       budget.kv_bytes_per_sequence);
  }
  if (inputs.bandwidth) {
    DecodeTime decode;
    const index_t fitting = budget.memory ? budget.memory->max_sequences : 0;
    decode.batch = inputs.batch.value_or(std::max<index_t>(fitting, 1));
    decode.ms_per_step =
        detail::milliseconds(static_cast<double>(budget.weights_bytes), *inputs.bandwidth);
    decode.ms_per_token = decode.ms_per_step / static_cast<double>(decode.batch);
    const double kv_read =
        static_cast<double>(decode.batch) * static_cast<double>(budget.kv_bytes_per_sequence);
    decode.ms_per_step_with_kv = detail::milliseconds(
        static_cast<double>(budget.weights_bytes) + kv_read, *inputs.bandwidth);
    budget.decode = decode;
  }
  if (inputs.peak_flops) {
    const double matmul = static_cast<double>(budget.prefill_flops);
    const double attention = static_cast<double>(budget.prefill_attention_flops);
    budget.prefill = PrefillTime{detail::milliseconds(matmul, *inputs.peak_flops),
                                 detail::milliseconds(matmul + attention, *inputs.peak_flops)};
  }
  return budget;
}

inline Budget compute_budget(const TransformerConfig& config, const BudgetInputs& inputs) {
  return compute_budget(model_size(config), inputs);
}

}  // namespace dissect
