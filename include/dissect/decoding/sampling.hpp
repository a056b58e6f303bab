// dissect/decoding/sampling.hpp — choosing the next token from a row of logits, as Hugging Face's
// logits processors and warpers define it.
//
// The logits pass, in Hugging Face's order, through the repetition penalty (multiplicative, over
// the prompt and every generated token) and OpenAI's frequency and presence penalties (additive,
// over the generated tokens), then temperature, top-k, top-p (nucleus) and min-p; what is left is
// renormalised and one uniform number from dissect's Generator picks a token, so a seed
// reproduces a generation bit for bit on any platform. Temperature 0 is greedy: the argmax of the
// penalised logits. Everything is computed in double from the logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/init.hpp"

namespace dissect {

struct SamplingOptions {
  /// 0: greedy. Otherwise logits are divided by it before the softmax (< 1 sharpens).
  double temperature = 1.0;
  /// 0: every token. Otherwise only tokens whose logit is at least the top_k-th largest (ties
  /// with it included, as Hugging Face's `scores < topk(scores)[-1]`) can be drawn.
  index_t top_k = 0;
  /// In (0, 1]; 1: every token. Otherwise nucleus sampling: the smallest set of the most probable
  /// tokens whose probabilities add up to at least top_p (never fewer than one token).
  double top_p = 1.0;
  /// In [0, 1]; 0: every token. Otherwise tokens less probable than min_p × the most probable
  /// one's probability are removed.
  double min_p = 0.0;
  /// > 0; 1: none. Hugging Face's rule, once per distinct token of the history (prompt
  /// included): a logit l becomes l / penalty if l ≥ 0, l · penalty if l < 0 (> 1 discourages).
  double repetition_penalty = 1.0;
  /// Finite; 0: none. OpenAI's rule: l − count · frequency_penalty, count = how often the token
  /// was generated so far (the prompt not counted). Negative values encourage repeats.
  double frequency_penalty = 0.0;
  /// Finite; 0: none. OpenAI's rule: l − presence_penalty for every token generated so far.
  double presence_penalty = 0.0;
};

/// The tokens before the one being chosen, for the penalties: the prompt, then every token
/// generated so far. The repetition penalty reads all of them (as Hugging Face's input_ids);
/// the frequency and presence penalties only those after the prompt (OpenAI's "sampled").
struct TokenHistory {
  std::span<const index_t> tokens = {};
  index_t prompt_length = 0;  ///< how many of `tokens` are the prompt: 0 to tokens.size()
};

/// Buffers reused between calls, so that decoding allocates nothing per token once they have
/// grown to the vocabulary (test_sampling_allocations counts operator new to prove it).
struct SamplingScratch {
  std::vector<index_t> order;   ///< candidate ids
  std::vector<double> values;   ///< [V] penalised logits, only when a penalty applies
  std::vector<index_t> counts;  ///< [V] occurrences in the history, all 0 between calls
};

/// Checks the options: temperature finite and ≥ 0, top_k ≥ 0, top_p ∈ (0, 1], min_p ∈ [0, 1],
/// repetition_penalty finite and > 0, frequency and presence penalties finite.
/// @throws ConfigError naming `op`, the field and its value.
inline void check_sampling(std::string_view op, const SamplingOptions& options);

/// The filtered, renormalised distribution the next token is drawn from, written into
/// `probabilities` [V] (0 for every removed token). Greedy (temperature 0), and the limits
/// where no softmax exists (a logit of +∞, every logit −∞), put all the mass on one token: the
/// first of the largest.
/// @throws ConfigError as check_sampling; ShapeError if probabilities.size() ≠ logits.size();
///         Error for no logits, a NaN logit or a bad history (naming the id or the position).
template <class Scalar>
void sampling_distribution(std::span<const Scalar> logits, const SamplingOptions& options,
                           const TokenHistory& history, std::span<double> probabilities,
                           SamplingScratch& scratch);

/// As above, into a new vector [V].
template <class Scalar>
std::vector<double> sampling_distribution(std::span<const Scalar> logits,
                                          const SamplingOptions& options,
                                          const TokenHistory& history = {});

/// The next token id from one row of logits [V]: drawn from sampling_distribution with one
/// uniform number, walking the kept tokens in id order (no draw when one token is left).
/// @throws as sampling_distribution.
template <class Scalar>
index_t sample_token(std::span<const Scalar> logits, const SamplingOptions& options,
                     const TokenHistory& history, Generator& generator, SamplingScratch& scratch);

/// The next token without a history (the penalties have nothing to act on). `scratch` holds
/// candidate ids between calls, so decoding allocates nothing per token once it has grown to V.
template <class Scalar>
index_t sample_token(std::span<const Scalar> logits, const SamplingOptions& options,
                     Generator& generator, std::vector<index_t>& scratch);

// ---- implementation -----------------------------------------------------------------------------

inline void check_sampling(std::string_view op, const SamplingOptions& options) {
  if (!(std::isfinite(options.temperature) && options.temperature >= 0)) {
    throw ConfigError(detail::concat(op, ": temperature must be finite and >= 0 (got ",
                                     options.temperature, ")"));
  }
  if (options.top_k < 0) {
    throw ConfigError(detail::concat(op, ": top_k must be >= 0 (got ", options.top_k, ")"));
  }
  if (!(options.top_p > 0 && options.top_p <= 1)) {
    throw ConfigError(detail::concat(op, ": top_p must be in (0, 1] (got ", options.top_p, ")"));
  }
  if (!(options.min_p >= 0 && options.min_p <= 1)) {
    throw ConfigError(detail::concat(op, ": min_p must be in [0, 1] (got ", options.min_p, ")"));
  }
  if (!(std::isfinite(options.repetition_penalty) && options.repetition_penalty > 0)) {
    throw ConfigError(detail::concat(op, ": repetition_penalty must be finite and > 0 (got ",
                                     options.repetition_penalty, ")"));
  }
  if (!std::isfinite(options.frequency_penalty)) {
    throw ConfigError(detail::concat(op, ": frequency_penalty must be finite (got ",
                                     options.frequency_penalty, ")"));
  }
  if (!std::isfinite(options.presence_penalty)) {
    throw ConfigError(detail::concat(op, ": presence_penalty must be finite (got ",
                                     options.presence_penalty, ")"));
  }
}

namespace detail {

/// Checks the logits (some, none NaN) and the history (ids inside [0, V), prompt_length within
/// it) before anything is computed.
template <class Scalar>
void check_sampling_inputs(std::string_view op, std::span<const Scalar> logits,
                           const TokenHistory& history) {
  const auto vocab = static_cast<index_t>(logits.size());
  if (vocab == 0) throw Error(concat(op, ": no logits to sample from"));
  for (index_t id = 0; id < vocab; ++id) {
    if (std::isnan(logits[static_cast<std::size_t>(id)])) {
      throw Error(concat(op, ": logit of token ", id, " is NaN"));
    }
  }
  const auto length = static_cast<index_t>(history.tokens.size());
  if (history.prompt_length < 0 || history.prompt_length > length) {
    throw Error(concat(op, ": the history's prompt_length ", history.prompt_length,
                       " is outside [0, ", length, "], its number of tokens"));
  }
  for (index_t i = 0; i < length; ++i) {
    const index_t id = history.tokens[static_cast<std::size_t>(i)];
    if (id < 0 || id >= vocab) {
      throw Error(concat(op, ": history token ", i, " has id ", id, ", outside the vocabulary [0, ",
                         vocab, ")"));
    }
  }
}

inline bool penalises(const SamplingOptions& options, const TokenHistory& history) {
  return !history.tokens.empty() &&
         (options.repetition_penalty != 1 || options.frequency_penalty != 0 ||
          options.presence_penalty != 0);
}

/// The penalised logits, in double, into scratch.values [V]. The repetition penalty comes first,
/// then the frequency and presence penalties: Hugging Face has only the first; vLLM's
/// `apply_penalties` (vllm/model_executor/layers/utils.py, run before temperature) applies the
/// repetition penalty over prompt and output, then OpenAI's two over the output tokens' counts.
template <class Scalar>
void penalise(std::span<const Scalar> logits, const SamplingOptions& options,
              const TokenHistory& history, SamplingScratch& scratch) {
  const std::size_t vocab = logits.size();
  scratch.values.resize(vocab);
  for (std::size_t id = 0; id < vocab; ++id) scratch.values[id] = static_cast<double>(logits[id]);
  // counts is all zeros between calls: each pass marks what it touches and clears it again, so a
  // call costs O(history) here, not another O(V).
  scratch.counts.resize(vocab, 0);
  const auto at = [](auto& vector, index_t id) -> auto& {
    return vector[static_cast<std::size_t>(id)];
  };
  if (options.repetition_penalty != 1) {
    // Once per distinct token, as Hugging Face's gather/scatter over input_ids.
    for (const index_t id : history.tokens) {
      if (at(scratch.counts, id) != 0) continue;
      at(scratch.counts, id) = 1;
      double& value = at(scratch.values, id);
      value = value < 0 ? value * options.repetition_penalty : value / options.repetition_penalty;
    }
    for (const index_t id : history.tokens) at(scratch.counts, id) = 0;
  }
  if (options.frequency_penalty != 0 || options.presence_penalty != 0) {
    const auto generated = history.tokens.subspan(static_cast<std::size_t>(history.prompt_length));
    for (const index_t id : generated) ++at(scratch.counts, id);
    for (const index_t id : generated) {
      index_t& count = at(scratch.counts, id);
      if (count == 0) continue;  // already applied for an earlier occurrence
      at(scratch.values, id) -= static_cast<double>(count) * options.frequency_penalty;
      at(scratch.values, id) -= options.presence_penalty;
      count = 0;
    }
  }
}

/// The tokens that survive the warpers, in id order, in order[0, kept), and the largest value
/// among them (`top`). `value(id)` is the token's (penalised) logit as a double.
///
/// Hugging Face's order of the warpers (GenerationMixin._get_logits_processor in
/// transformers/generation/utils.py): after the processors (the repetition penalty), when
/// sampling, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper, MinPLogitsWarper, each
/// with min_tokens_to_keep = 1. Temperature is applied inside the exponentials below,
/// exp((l − top) / T) = softmax(l / T) up to its sum: dividing by T > 0 changes no order, so top-k
/// sees the same ranking, and top-p and min-p see exactly softmax(l / T).
template <class Value>
index_t surviving_tokens(const Value& value, index_t vocab, const SamplingOptions& options,
                         std::vector<index_t>& order, double& top) {
  // Larger value first, lower id first on ties: the order greedy and "the first of the largest"
  // agree on.
  const auto before = [&](index_t a, index_t b) {
    const double va = value(a), vb = value(b);
    return va > vb || (va == vb && a < b);
  };
  order.resize(static_cast<std::size_t>(vocab));
  if (options.temperature == 0) {
    index_t best = 0;
    for (index_t id = 1; id < vocab; ++id) best = before(id, best) ? id : best;
    order[0] = best;
    top = value(best);
    return 1;
  }
  std::iota(order.begin(), order.end(), index_t{0});
  index_t kept = vocab;
  if (options.top_k > 0 && options.top_k < vocab) {
    // The k-th largest value is the threshold; every token at or above it stays (ties with the
    // k-th included). Written back in id order: a stable draw.
    std::nth_element(order.begin(), order.begin() + (options.top_k - 1), order.end(), before);
    const double threshold = value(order[static_cast<std::size_t>(options.top_k - 1)]);
    kept = 0;
    for (index_t id = 0; id < vocab; ++id) {
      if (value(id) >= threshold) order[static_cast<std::size_t>(kept++)] = id;
    }
  }
  top = -INFINITY;
  for (index_t i = 0; i < kept; ++i) top = std::max(top, value(order[static_cast<std::size_t>(i)]));
  // All −∞, or some +∞: no softmax exists; the first of the largest is the limit of one.
  if (!std::isfinite(top)) {
    for (index_t i = 0; i < kept; ++i) {
      if (value(order[static_cast<std::size_t>(i)]) == top) {
        order[0] = order[static_cast<std::size_t>(i)];
        return 1;
      }
    }
  }
  const double temperature = options.temperature;
  const auto weight = [&](index_t id) { return std::exp((value(id) - top) / temperature); };
  if (options.top_p < 1 && kept > 1) {
    // TopPLogitsWarper: sort ascending, remove the tokens whose cumulative probability is
    // <= 1 − top_p, never the last (largest) one. Ascending ties put the higher id first, the
    // reverse of `before`, so the tokens removed first are the ones greedy would take last.
    const auto first = order.begin(), last = order.begin() + kept;
    const double threshold = 1 - options.top_p;
    double total = 0;  // ≥ 1: the top token weighs exp(0)
    for (auto it = first; it != last; ++it) total += weight(*it);
    // Only the head needs sorting. The tokens lighter than threshold·total / kept weigh less than
    // threshold·total together, so they are an ascending prefix that is removed whatever its
    // order (the top token, weighing 1 > threshold, is never among them). For V = 50,257 this
    // skips sorting the long tail (logits ~ N(0, 9): 25 ms per token with a full sort, 6 ms).
    const double light = threshold * total / static_cast<double>(kept);
    const auto head = std::partition(first, last, [&](index_t id) { return weight(id) < light; });
    double cumulative = 0;
    for (auto it = first; it != head; ++it) cumulative += weight(*it) / total;
    std::sort(head, last, [&](index_t a, index_t b) { return before(b, a); });
    auto kept_from = head;
    for (; kept_from + 1 < last; ++kept_from) {
      cumulative += weight(*kept_from) / total;
      if (!(cumulative <= threshold)) break;
    }
    kept = static_cast<index_t>(last - kept_from);
    std::move(kept_from, last, first);
    std::sort(first, first + kept);  // back to id order
  }
  if (options.min_p > 0) {
    // MinPLogitsWarper: remove p < min_p · p_max. p / p_max = exp((l − top) / T) = weight, and
    // the top token (weight 1 ≥ min_p) always stays: min_tokens_to_keep = 1 holds by itself.
    index_t written = 0;
    for (index_t i = 0; i < kept; ++i) {
      const index_t id = order[static_cast<std::size_t>(i)];
      if (weight(id) >= options.min_p) order[static_cast<std::size_t>(written++)] = id;
    }
    kept = written;
  }
  return kept;
}

/// Runs the checks, the penalties and the warpers; calls done(value, kept) with the tokens left in
/// scratch.order[0, kept) and `top`, their largest value.
template <class Scalar, class Done>
auto with_surviving_tokens(std::string_view op, std::span<const Scalar> logits,
                           const SamplingOptions& options, const TokenHistory& history,
                           SamplingScratch& scratch, Done&& done) {
  check_sampling(op, options);
  check_sampling_inputs(op, logits, history);
  const auto vocab = static_cast<index_t>(logits.size());
  double top = 0;
  if (penalises(options, history)) {
    penalise(logits, options, history, scratch);
    const auto value = [&](index_t id) { return scratch.values[static_cast<std::size_t>(id)]; };
    const index_t kept = surviving_tokens(value, vocab, options, scratch.order, top);
    return done(value, kept, top);
  }
  // Without a penalty the logits are read in place: no [V] copy.
  const auto value = [&](index_t id) {
    return static_cast<double>(logits[static_cast<std::size_t>(id)]);
  };
  const index_t kept = surviving_tokens(value, vocab, options, scratch.order, top);
  return done(value, kept, top);
}

}  // namespace detail

template <class Scalar>
void sampling_distribution(std::span<const Scalar> logits, const SamplingOptions& options,
                           const TokenHistory& history, std::span<double> probabilities,
                           SamplingScratch& scratch) {
  constexpr std::string_view op = "sampling_distribution";
  if (probabilities.size() != logits.size()) {
    throw ShapeError(detail::concat(op, ": probabilities has ", probabilities.size(),
                                    " entries for ", logits.size(), " logits"));
  }
  detail::with_surviving_tokens(
      op, logits, options, history, scratch, [&](const auto& value, index_t kept, double top) {
        std::fill(probabilities.begin(), probabilities.end(), 0.0);
        const std::span<const index_t> ids(scratch.order.data(), static_cast<std::size_t>(kept));
        if (kept == 1) {
          probabilities[static_cast<std::size_t>(ids[0])] = 1;
          return;
        }
        double total = 0;
        for (const index_t id : ids) {
          total += probabilities[static_cast<std::size_t>(id)] =
              std::exp((value(id) - top) / options.temperature);
        }
        for (const index_t id : ids) probabilities[static_cast<std::size_t>(id)] /= total;
      });
}

template <class Scalar>
std::vector<double> sampling_distribution(std::span<const Scalar> logits,
                                          const SamplingOptions& options,
                                          const TokenHistory& history) {
  std::vector<double> probabilities(logits.size());
  SamplingScratch scratch;
  sampling_distribution(logits, options, history, std::span<double>(probabilities), scratch);
  return probabilities;
}

template <class Scalar>
index_t sample_token(std::span<const Scalar> logits, const SamplingOptions& options,
                     const TokenHistory& history, Generator& generator, SamplingScratch& scratch) {
  return detail::with_surviving_tokens("sample_token", logits, options, history, scratch,
                                       [&](const auto& value, index_t kept, double top) -> index_t {
                                         const std::span<const index_t> ids(
                                             scratch.order.data(), static_cast<std::size_t>(kept));
                                         if (kept == 1) return ids[0];
                                         // exp((l − max)/T) ∈ (0, 1]: the max itself weighs 1, so
                                         // the total is ≥ 1 and never 0. The weights are computed
                                         // twice rather than stored: no [V] buffer for the draw.
                                         const auto weight = [&](index_t id) {
                                           return std::exp((value(id) - top) / options.temperature);
                                         };
                                         double total = 0;
                                         for (const index_t id : ids) total += weight(id);
                                         const double target = generator.uniform() * total;
                                         double running = 0;
                                         for (const index_t id : ids) {
                                           running += weight(id);
                                           if (target < running) return id;
                                         }
                                         return ids.back();  // target within rounding of the total
                                       });
}

template <class Scalar>
index_t sample_token(std::span<const Scalar> logits, const SamplingOptions& options,
                     Generator& generator, std::vector<index_t>& scratch) {
  // Without a history nothing is penalised, so only the candidate ids need a buffer: the
  // caller's, borrowed for the call (a swap moves no elements and allocates nothing).
  SamplingScratch borrowed;
  borrowed.order.swap(scratch);
  const auto restore = [&] { scratch.swap(borrowed.order); };
  try {
    const index_t id = sample_token(logits, options, TokenHistory{}, generator, borrowed);
    restore();
    return id;
  } catch (...) {
    restore();
    throw;
  }
}

}  // namespace dissect
