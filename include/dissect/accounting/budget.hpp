// dissect/accounting/budget.hpp — what a model costs on a device: memory, KV cache, slots,
// decode/prefill.
//
// From a parameter count and the KV shape (L, H_kv, d_k) — or a whole TransformerConfig — plus
// dtypes, a context length and a device (memory, reserve, bandwidth, peak FLOP/s), compute the
// serving budget: weight bytes, KV bytes per token and per sequence, how many sequences fit,
// decode and prefill time, and Adam's training memory. The dtypes and their sizes are
// dtype.hpp's. Bytes are exact int64 (int4 and Q4_0 round up to whole blocks);
// prefill FLOPs are forward_flops() of model_shape.hpp. Pure arithmetic: reading "24GB" from a
// command line is the tools' business (tools/common/parse.hpp).
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/count.hpp"
#include "dissect/accounting/model_shape.hpp"
#include "dissect/core/dtype.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

// ---- printing -----------------------------------------------------------------------------------

/// Three significant digits in the largest decimal unit that keeps the value >= 1:
/// "1.07 GB", "524 kB", "14.0 GB", "-2.00 GB", "0 B".
std::string format_decimal_bytes(index_t bytes);

/// The same with binary units: "1.00 GiB", "512 KiB".
std::string format_binary_bytes(index_t bytes);

// ---- the budget ---------------------------------------------------------------------------------

/// What the budget needs to know about a model when only its parameter count is known.
struct ModelSize {
  index_t parameters = 0;  ///< every weight that must sit in device memory
  index_t n_layers = 0;    ///< L
  index_t n_heads = 0;     ///< H, query heads (they set the attention FLOPs)
  index_t n_kv_heads = 0;  ///< H_kv (they set the KV cache)
  index_t head_dim = 0;    ///< d_k
  /// A mixture of experts: the parameters of all its experts (part of `parameters`), E and k.
  /// A decode step reads only the experts its tokens were routed to. 0: a dense model.
  index_t expert_parameters = 0;
  index_t n_experts = 0;
  index_t experts_per_token = 0;
  /// W, a sliding window (TransformerConfig::sliding_window): a sequence's KV cache then holds
  /// min(T, W) positions (a RollingKVCache). 0: no window.
  index_t sliding_window = 0;

  /// The parameters one decode step over `batch` sequences reads: the dense ones, and of the
  /// experts the share E·(1 − (1 − k/E)^B) / E a batch is expected to touch when the router
  /// spreads tokens uniformly (k/E for one sequence; → all of them as B grows). `parameters`
  /// for a dense model.
  double parameters_read(index_t batch) const;

  /// @throws ConfigError naming the field if a size is <= 0 or H_kv does not divide H, or the
  ///         experts are inconsistent (expert_parameters > parameters, k ∉ [1, E]).
  void validate() const;
};

/// The exact parameter count and KV shape of `config`.
/// @throws ConfigError if the config is invalid; OverflowError if its count overflows.
ModelSize model_size(const TransformerConfig& config);

/// The scenario: dtypes, context, and the device. Device fields left unset leave the matching
/// parts of the Budget unset.
struct BudgetInputs {
  Dtype weight_dtype = Dtype::fp16;
  Dtype kv_dtype = Dtype::fp16;
  index_t context = 0;                    ///< T, tokens per sequence held in the KV cache
  std::optional<index_t> batch{};         ///< sequences decoded together; unset → all that fit
  std::optional<index_t> memory_bytes{};  ///< device memory
  double reserve = 0.0;                   ///< fraction of memory kept free, in [0, 1)
  std::optional<double> bandwidth{};      ///< memory bandwidth, bytes/s
  std::optional<double> peak_flops{};     ///< FLOP/s

  /// @throws ConfigError naming the field: a dtype out of range, context or batch <= 0, memory,
  /// bandwidth or peak <= 0 (or not finite), reserve outside [0, 1).
  void validate() const;
};

/// How the device memory divides up: `free_bytes` is what is left after the weights,
/// `free_after_first_bytes` what remains once one sequence is admitted.
struct MemoryFit {
  index_t memory_bytes = 0;
  index_t reserve_bytes = 0;           ///< memory · reserve, rounded to the nearest byte
  index_t free_bytes = 0;              ///< memory − reserve − weights; < 0: weights do not fit
  index_t free_after_first_bytes = 0;  ///< free − one sequence's KV cache
  index_t max_sequences = 0;           ///< ⌊free / KV per sequence⌋, 0 when free < 0
  double sequences = 0.0;              ///< free / KV per sequence, clamped at 0
};

/// Decode is memory-bound: every step reads all weights once, however many sequences share it
/// (a mixture of experts: the dense weights and the experts the batch was routed to,
/// ModelSize::parameters_read).
struct DecodeTime {
  index_t batch = 0;
  /// batch · kv_bytes_per_sequence: the full KV caches the worst step also reads. Exact, so a
  /// batch whose caches leave int64 (10¹⁸ sequences of 1 GB) is an OverflowError naming the
  /// batch, not a time computed from bytes no device holds.
  index_t kv_bytes_read = 0;
  double ms_per_step = 0.0;          ///< weights read / bandwidth
  double ms_per_token = 0.0;         ///< ms_per_step / batch
  double ms_per_step_with_kv = 0.0;  ///< also reading batch full-context KV caches: the worst step
};

/// Prefill is compute-bound: T tokens through every weight at once. Times are IEEE doubles: an
/// absurdly small peak makes them inf, which a caller that prints them must check.
struct PrefillTime {
  double ms = 0.0;         ///< prefill_flops / peak
  double ms_linear = 0.0;  ///< prefill_linear_flops / peak: the weights-only estimate
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
///
/// Prefill FLOPs are forward_flops(…, B = 1, T = context) of model_shape.hpp: every matrix product
/// by weights, the output head included, plus attention's Q·Kᵀ and P·V over the full T×T square.
struct Budget {
  ModelSize model;
  BudgetInputs inputs;
  index_t weights_bytes = 0;
  index_t kv_bytes_per_token = 0;     ///< 2 · L · H_kv · d_k · bytes: K and V, every layer
  index_t kv_bytes_per_sequence = 0;  ///< kv_bytes_per_token · T (· min(T, W) with a window)
  index_t single_sequence_bytes = 0;  ///< weights_bytes + kv_bytes_per_sequence
  index_t linear_weights = 0;         ///< W behind prefill_linear_flops (see the flag below)
  bool linear_weights_exact = false;  ///< W counted from a config; false: W = parameters
  index_t prefill_linear_flops = 0;   ///< 2 · W · T
  index_t prefill_attention_flops = 0;  ///< 2 · (2 · H · T² · d_k) · L: Q·Kᵀ and P·V, full T×T
  index_t prefill_flops = 0;            ///< prefill_linear_flops + prefill_attention_flops
  TrainingMemory training;
  std::optional<MemoryFit> memory;     ///< set when memory_bytes is
  std::optional<DecodeTime> decode;    ///< set when bandwidth is
  std::optional<PrefillTime> prefill;  ///< set when peak_flops is
};

/// Tensor parallelism over P devices (Megatron-LM, as in dissect/parallel): every device holds
/// 1/P of each weight matrix and the K and V of H_kv/P heads, and every layer all-reduces two
/// [B, T, D] activations in forward (after attention's output projection and after the FFN's down
/// projection) and two in backward.
struct TensorParallelBudget {
  index_t ranks = 1;
  /// ⌈weights_bytes / P⌉: every parameter counted as split. Replicated ones (norms, the biases of
  /// row-parallel layers) make the truth slightly larger: about 0.01 % of a 7B model.
  index_t weights_bytes_per_device = 0;
  index_t kv_bytes_per_token_per_device = 0;          ///< ⌈kv_bytes_per_token / P⌉
  index_t kv_bytes_per_sequence_per_device = 0;       ///< ⌈kv_bytes_per_sequence / P⌉
  index_t all_reduce_values_per_token_per_layer = 0;  ///< 2·D in forward (B·T·D per all-reduce)
  /// The values in the activation dtype: fp32 when the weights are fp32, else 2 bytes (fp16/bf16).
  index_t all_reduce_bytes_per_token_per_layer = 0;
};

/// The per-device share of `budget` over `ranks` devices, for a model of width `d_model`.
/// @throws ConfigError naming the field if ranks ≤ 0 or ranks does not divide H or H_kv (heads are
///         what attention splits, exactly as ParallelAttention requires); OverflowError.
TensorParallelBudget tensor_parallel_budget(const Budget& budget, index_t d_model, index_t ranks);

/// Bytes of `parameters` weights in `dtype` (rounded up for int4).
/// @throws ConfigError if `parameters` < 0 or the size overflows int64.
index_t weight_bytes(index_t parameters, Dtype dtype);

/// KV cache of one sequence of `context` tokens: 2 · L · T · H_kv · d_k elements of `dtype`.
/// @throws ConfigError if a size is negative or the size overflows int64.
index_t kv_cache_bytes(index_t n_layers, index_t context, index_t n_kv_heads, index_t head_dim,
                       Dtype dtype);

/// The whole budget of `model` in the scenario `inputs`. A parameter count alone does not say
/// which parameters are matrix weights, so the linear FLOPs take W = parameters: 2 · parameters
/// · T, as if every parameter met every token once. That overcounts the embedding tables, biases
/// and norms (about 1 % for GPT-2 small, 2 % for LLaMA-7B) and is exact when they are negligible.
/// @throws ConfigError naming the field for invalid inputs; OverflowError if a total overflows
///         (the batch's KV caches among them: it names the batch).
Budget compute_budget(const ModelSize& model, const BudgetInputs& inputs);

/// The same for a configuration: its exact parameter count, and the exact W of forward_shape.
/// @throws ConfigError as above, or if the config is invalid.
Budget compute_budget(const TransformerConfig& config, const BudgetInputs& inputs);

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
  constexpr std::string_view op = "ModelSize";
  require_positive(op, "parameters", parameters);
  require_positive(op, "n_layers", n_layers);
  require_positive(op, "n_heads", n_heads);
  require_positive(op, "head_dim", head_dim);
  // Without D, H·d_k stands in for it: only the head arithmetic is checked here.
  check_heads(op, checked_mul(n_heads, head_dim, "ModelSize H*d_k"), n_heads, n_kv_heads, head_dim);
  if (expert_parameters < 0 || expert_parameters > parameters) {
    throw ConfigError(detail::concat(op, ": expert_parameters ", expert_parameters,
                                     " must be in [0, parameters = ", parameters, "]"));
  }
  if (expert_parameters > 0 &&
      (n_experts < 1 || experts_per_token < 1 || experts_per_token > n_experts)) {
    throw ConfigError(detail::concat(op, ": experts_per_token ", experts_per_token,
                                     " must be in [1, n_experts = ", n_experts, "]"));
  }
  if (sliding_window < 0) {
    throw ConfigError(
        detail::concat(op, ": sliding_window must be >= 0 (0: none; got ", sliding_window, ")"));
  }
}

inline double ModelSize::parameters_read(index_t batch) const {
  if (expert_parameters == 0) return static_cast<double>(parameters);
  const double share_skipped =
      1.0 - static_cast<double>(experts_per_token) / static_cast<double>(n_experts);
  const double share_read = 1.0 - std::pow(share_skipped, static_cast<double>(batch));
  return static_cast<double>(parameters - expert_parameters) +
         share_read * static_cast<double>(expert_parameters);
}

inline ModelSize model_size(const TransformerConfig& config) {
  const ParameterCount count = count_parameters(config);
  return {count.total,
          config.n_layers,
          config.n_heads,
          config.kv_heads(),
          config.head_size(),
          count.experts,
          config.is_moe() ? config.n_experts : 0,
          config.is_moe() ? config.experts_per_token : 0,
          config.sliding_window.value_or(0)};
}

inline void BudgetInputs::validate() const {
  constexpr std::string_view op = "budget";
  check_dtype("budget: weight_dtype", weight_dtype);
  check_dtype("budget: kv_dtype", kv_dtype);
  require_positive(op, "context", context);
  if (batch) require_positive(op, "batch", *batch);
  if (memory_bytes) require_positive(op, "memory_bytes", *memory_bytes);
  if (!(reserve >= 0.0 && reserve < 1.0)) {
    throw ConfigError(detail::concat("budget: reserve must be in [0, 1) (got ", reserve, ")"));
  }
  // NaN fails every comparison, so !(x > 0) also rejects it.
  const std::pair<std::string_view, std::optional<double>> rates[] = {{"bandwidth", bandwidth},
                                                                      {"peak_flops", peak_flops}};
  for (const auto& [field, rate] : rates) {
    if (rate && !(*rate > 0.0 && std::isfinite(*rate))) {
      throw ConfigError(
          detail::concat("budget: ", field, " must be > 0 and finite (got ", *rate, ")"));
    }
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
  // The 2 is K and V: forgetting it halves the cache and doubles the sequences that "fit".
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
  // memory − reserve − weights stays within int64 (all three are in [0, 2⁶³)); free − KV can
  // leave it when the weights alone already overshoot by almost 2⁶³.
  fit.free_bytes = checked_sum({memory_bytes, -fit.reserve_bytes, -weights}, "free_bytes");
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

/// The budget of `model`, with the forward pass's FLOPs taken from `forward`.
inline Budget compute_budget(const ModelSize& model, const ForwardShape& forward,
                             bool exact_weights, const BudgetInputs& inputs) {
  model.validate();
  inputs.validate();
  const index_t T = inputs.context;
  Budget budget;
  budget.model = model;
  budget.inputs = inputs;
  budget.weights_bytes = weight_bytes(model.parameters, inputs.weight_dtype);
  budget.kv_bytes_per_token =
      kv_cache_bytes(model.n_layers, 1, model.n_kv_heads, model.head_dim, inputs.kv_dtype);
  // A windowed model's rolling cache holds only the last W positions.
  const index_t held = model.sliding_window > 0 ? std::min(T, model.sliding_window) : T;
  budget.kv_bytes_per_sequence =
      kv_cache_bytes(model.n_layers, held, model.n_kv_heads, model.head_dim, inputs.kv_dtype);
  budget.single_sequence_bytes = checked_add(budget.weights_bytes, budget.kv_bytes_per_sequence,
                                             "budget: weights + one sequence's KV cache");
  budget.linear_weights = forward.linear_weights;
  budget.linear_weights_exact = exact_weights;
  const ForwardFlops prefill = forward_flops(forward, 1, T);
  budget.prefill_linear_flops = prefill.linear;
  budget.prefill_attention_flops = prefill.attention;
  budget.prefill_flops = prefill.total;
  budget.training = adam_memory(model.parameters, inputs.weight_dtype);

  if (inputs.memory_bytes) {
    budget.memory = fit_memory(*inputs.memory_bytes, inputs.reserve, budget.weights_bytes,
                               budget.kv_bytes_per_sequence);
  }
  if (inputs.bandwidth) {
    DecodeTime decode;
    const index_t fitting = budget.memory ? budget.memory->max_sequences : 0;
    decode.batch = inputs.batch.value_or(std::max<index_t>(fitting, 1));
    // The bytes of the weights one step reads: all of them for a dense model.
    const double weights_read = static_cast<double>(budget.weights_bytes) *
                                model.parameters_read(decode.batch) /
                                static_cast<double>(model.parameters);
    decode.ms_per_step = milliseconds(weights_read, *inputs.bandwidth);
    decode.ms_per_token = decode.ms_per_step / static_cast<double>(decode.batch);
    decode.kv_bytes_read = checked_mul(
        decode.batch, budget.kv_bytes_per_sequence,
        detail::concat("budget: batch ", decode.batch,
                       ": the KV caches one decode step reads (batch · kv_bytes_per_sequence)"));
    decode.ms_per_step_with_kv =
        milliseconds(weights_read + static_cast<double>(decode.kv_bytes_read), *inputs.bandwidth);
    budget.decode = decode;
  }
  if (inputs.peak_flops) {
    budget.prefill = PrefillTime{
        milliseconds(static_cast<double>(budget.prefill_flops), *inputs.peak_flops),
        milliseconds(static_cast<double>(budget.prefill_linear_flops), *inputs.peak_flops)};
  }
  return budget;
}

}  // namespace detail

inline Budget compute_budget(const ModelSize& model, const BudgetInputs& inputs) {
  // W = parameters: the approximation documented at the declaration.
  const ForwardShape forward{model.parameters, model.n_layers, model.n_heads, model.head_dim};
  return detail::compute_budget(model, forward, /*exact_weights=*/false, inputs);
}

inline Budget compute_budget(const TransformerConfig& config, const BudgetInputs& inputs) {
  return detail::compute_budget(model_size(config), forward_shape(config), /*exact_weights=*/true,
                                inputs);
}

inline TensorParallelBudget tensor_parallel_budget(const Budget& budget, index_t d_model,
                                                   index_t ranks) {
  constexpr std::string_view what = "tensor_parallel_budget";
  if (ranks <= 0) {
    throw ConfigError(detail::concat(what, ": tensor-parallel ranks must be > 0, got ", ranks));
  }
  if (d_model <= 0) throw ConfigError(detail::concat(what, ": d_model must be > 0, got ", d_model));
  for (const auto& [name, heads] :
       {std::pair<const char*, index_t>{"n_heads", budget.model.n_heads},
        {"n_kv_heads", budget.model.n_kv_heads}}) {
    if (heads % ranks != 0) {
      throw ConfigError(detail::concat(what, ": ", ranks, " tensor-parallel ranks do not divide ",
                                       name, " = ", heads, " (attention is split by heads)"));
    }
  }
  const auto share = [&](index_t bytes) { return bytes / ranks + (bytes % ranks != 0 ? 1 : 0); };
  TensorParallelBudget tp;
  tp.ranks = ranks;
  tp.weights_bytes_per_device = share(budget.weights_bytes);
  tp.kv_bytes_per_token_per_device = share(budget.kv_bytes_per_token);
  tp.kv_bytes_per_sequence_per_device = share(budget.kv_bytes_per_sequence);
  tp.all_reduce_values_per_token_per_layer = checked_mul(2, d_model, what);
  const index_t activation_bytes = budget.inputs.weight_dtype == Dtype::fp32 ? 4 : 2;
  tp.all_reduce_bytes_per_token_per_layer =
      checked_mul(tp.all_reduce_values_per_token_per_layer, activation_bytes, what);
  return tp;
}

}  // namespace dissect
