// dissect/sampling.hpp — choosing the next token from a row of logits.
//
// Greedy (temperature 0) takes the argmax; otherwise the token is drawn from
// softmax(logits / temperature), restricted to the top_k largest logits when top_k > 0. The draw
// uses dissect's Generator, so a seed reproduces a generation bit for bit on any platform: the
// probabilities are computed in double from the logits, and one uniform number picks the token.
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <string_view>
#include <vector>

#include "dissect/config.hpp"
#include "dissect/error.hpp"
#include "dissect/init.hpp"
#include "dissect/shape.hpp"

namespace dissect {

struct SamplingOptions {
  /// 0: greedy. Otherwise logits are divided by it before the softmax (< 1 sharpens).
  double temperature = 1.0;
  /// 0: every token. Otherwise only the top_k largest logits can be drawn.
  index_t top_k = 0;
};

/// Checks the options: temperature finite and ≥ 0, top_k ≥ 0.
/// @throws ConfigError naming the field and its value.
inline void check_sampling(std::string_view op, const SamplingOptions& options) {
  if (!(std::isfinite(options.temperature) && options.temperature >= 0)) {
    throw ConfigError(detail::concat(op, ": temperature must be finite and >= 0 (got ",
                                     options.temperature, ")"));
  }
  if (options.top_k < 0) {
    throw ConfigError(detail::concat(op, ": top_k must be >= 0 (got ", options.top_k, ")"));
  }
}

/// The next token id from one row of logits [V]. `scratch` holds candidate ids between calls,
/// so decoding allocates nothing per token once it has grown to V.
/// @throws ConfigError as check_sampling; Error if the row is empty or holds NaN (naming the id).
template <class Scalar>
index_t sample_token(std::span<const Scalar> logits, const SamplingOptions& options,
                     Generator& generator, std::vector<index_t>& scratch) {
  constexpr std::string_view op = "sample_token";
  check_sampling(op, options);
  const auto vocab = static_cast<index_t>(logits.size());
  if (vocab == 0) throw Error(detail::concat(op, ": no logits to sample from"));
  for (index_t id = 0; id < vocab; ++id) {
    if (std::isnan(logits[static_cast<std::size_t>(id)])) {
      throw Error(detail::concat(op, ": logit of token ", id, " is NaN"));
    }
  }
  // Larger logit first, lower id first on ties: the order greedy and top-k agree on.
  const auto before = [&](index_t a, index_t b) {
    const Scalar la = logits[static_cast<std::size_t>(a)], lb = logits[static_cast<std::size_t>(b)];
    return la > lb || (la == lb && a < b);
  };
  if (options.temperature == 0 || options.top_k == 1) {
    index_t best = 0;
    for (index_t id = 1; id < vocab; ++id) best = before(id, best) ? id : best;
    return best;
  }
  scratch.resize(static_cast<std::size_t>(vocab));
  std::iota(scratch.begin(), scratch.end(), index_t{0});
  index_t candidates = vocab;
  if (options.top_k > 0 && options.top_k < vocab) {
    candidates = options.top_k;
    std::nth_element(scratch.begin(), scratch.begin() + candidates - 1, scratch.end(), before);
    std::sort(scratch.begin(), scratch.begin() + candidates);  // id order: a stable draw
  }
  double top = -INFINITY;
  for (index_t i = 0; i < candidates; ++i) {
    top = std::max(top, static_cast<double>(logits[static_cast<std::size_t>(scratch[i])]));
  }
  // All −∞, or some +∞: no softmax exists; the first of the largest is the limit of one.
  if (!std::isfinite(top)) {
    for (index_t i = 0; i < candidates; ++i) {
      if (static_cast<double>(logits[static_cast<std::size_t>(scratch[i])]) == top)
        return scratch[i];
    }
  }
  // exp((l − max)/T) ∈ (0, 1]: the max itself weighs 1, so the total is ≥ 1 and never 0.
  double total = 0;
  const auto weight = [&](index_t id) {
    return std::exp((static_cast<double>(logits[static_cast<std::size_t>(id)]) - top) /
                    options.temperature);
  };
  for (index_t i = 0; i < candidates; ++i) total += weight(scratch[i]);
  const double target = generator.uniform() * total;
  double running = 0;
  for (index_t i = 0; i < candidates; ++i) {
    running += weight(scratch[i]);
    if (target < running) return scratch[i];
  }
  return scratch[candidates - 1];  // target within rounding of the total
}

}  // namespace dissect
