// dissect/models/speculative_decoding.hpp — speculative decoding (Leviathan, Kalman and Matias
// 2023; Chen et al. 2023): a small draft model proposes γ tokens one at a time, the target model
// scores all of them in one forward, and a rejection rule keeps a prefix of them so that every
// token returned is distributed exactly as the target's generate() would draw it.
//
// One round, with the sequence s so far (prompt + tokens returned), k = min(γ, room) proposals:
//   draft:   q_i = D(· | s, x_1 … x_{i−1}),  x_i ~ q_i                       i = 1 … k
//   target:  p_i = P(· | s, x_1 … x_{i−1}) for i = 1 … k + 1, in ONE forward over x_1 … x_k
//   accept:  x_i with probability min(1, p_i(x_i) / q_i(x_i)), in order, until one is rejected
//   then:    at the first rejection (i), y ~ norm(max(0, p_i − q_i)); all k accepted, y ~ p_{k+1}
// The round returns the accepted x's and y: 1 to k + 1 tokens for one target forward. p and q
// are the processed distributions generate() draws from (sampling_distribution: penalties with
// the history each position has, temperature, top-k, top-p, min-p), so the output distribution
// is the target's generate()'s. Greedy (temperature 0) is the limit where p and q are one-hot:
// x_i is kept iff it is the target's argmax, and y is the target's argmax, so the tokens are
// generate()'s, token for token. A sampled run is reproducible from its seed, but its draws are
// not generate()'s: the same seed gives another (equally distributed) continuation.
//
// Both KV caches hold only positions whose tokens were kept: after a round the target's is
// truncated to the prefix it verified (s and the accepted x's), the draft's to the part of its
// own proposals that was accepted; the tokens the draft has not seen (y, and x_k when all were
// accepted) are fed to it at the start of the next round, in the forward that gives q_1.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dissect/attention/kv_cache_concept.hpp"
#include "dissect/core/error.hpp"
#include "dissect/decoding/sampling.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/tensor/init.hpp"

namespace dissect {

struct SpeculativeOptions {
  index_t gamma = 4;  ///< γ ≥ 1: tokens the draft proposes per round (fewer near the end)
  index_t max_new_tokens = 64;
  SamplingOptions sampling = {};          ///< applied alike to the target's and the draft's logits
  std::uint64_t seed = 0;                 ///< of the draws: proposals, acceptances and corrections
  std::optional<index_t> eos_token_id{};  ///< stop after returning it (it is returned)
};

/// What a speculative generation did, and how fast.
struct SpeculativeStats {
  index_t prompt_tokens = 0;
  index_t new_tokens = 0;
  index_t proposed = 0;         ///< draft tokens proposed
  index_t accepted = 0;         ///< of them, accepted by the target
  index_t target_forwards = 0;  ///< one per round: prefill and verification together
  index_t draft_forwards = 0;
  bool stopped_at_context = false;  ///< fewer than max_new_tokens: the target's context was full
  bool stopped_at_eos = false;
  double seconds = 0;  ///< the whole generation, prompt included

  /// accepted / proposed (0 when nothing was proposed).
  double acceptance_rate() const {
    return proposed > 0 ? static_cast<double>(accepted) / static_cast<double>(proposed) : 0;
  }
  /// New tokens per second over the whole generation, prompt included.
  double tokens_per_second() const {
    return seconds > 0 ? static_cast<double>(new_tokens) / seconds : 0;
  }
};

struct SpeculativeResult {
  std::vector<index_t> tokens;  ///< the new tokens only (with the EOS that ended them, if any)
  SpeculativeStats stats;
};

/// Checks the options and that `draft` can propose tokens for `target`: the same vocabulary
/// (its ids are the target's). @throws ConfigError naming `op`, the field and the values.
template <class Target, class Draft>
void check_speculative(std::string_view op, const Target& target, const Draft& draft,
                       const SpeculativeOptions& options);

/// A speculative generation in progress, one round at a time: the prompt (prefilled by the first
/// round), the two models' KV caches and the draws so far. `target` and `draft` must outlive it.
/// speculative_generate runs it to the end; a caller that wants to watch the caches between
/// rounds (a test, a visualisation) drives it itself.
template <class Target, class Draft>
class SpeculativeDecoder {
 public:
  /// @throws as speculative_generate, before any forward.
  SpeculativeDecoder(const Target& target, const Draft& draft, std::span<const index_t> prompt,
                     const SpeculativeOptions& options);

  /// Whether max_new_tokens (cut to the target's context) are out, or an EOS was.
  bool done() const { return stats_.stopped_at_eos || generated_ >= wanted_; }
  /// One round (see the top of this file): the tokens it returned, 1 to γ + 1 of them, ending at
  /// an EOS; none once done(). Valid until the next call.
  /// @throws as the models' forwards (an id of the prompt outside the vocabulary, in the first
  ///         round, before anything changes; a MoE's non-finite router logit in a later one, after
  ///         which the decoder is left mid-round and must not be used again).
  std::span<const index_t> round();

  /// The prompt and every token returned so far.
  std::span<const index_t> sequence() const { return sequence_; }
  const KVCache<typename Target::scalar_type>& target_cache() const { return target_cache_; }
  const KVCache<typename Draft::scalar_type>& draft_cache() const { return draft_cache_; }
  /// Counts so far; seconds is left 0 (speculative_generate times the whole run).
  const SpeculativeStats& stats() const { return stats_; }

 private:
  template <class Logits>
  void distribution(const Logits& logits, index_t row, std::size_t history, std::span<double> into);
  std::span<double> q(std::size_t i) { return {q_.data() + i * vocab_, vocab_}; }
  std::span<double> p(std::size_t i) { return {p_.data() + i * vocab_, vocab_}; }

  const Target& target_;
  const Draft& draft_;
  SpeculativeOptions options_;
  std::size_t vocab_;
  index_t prompt_length_, wanted_, generated_ = 0;
  KVCache<typename Target::scalar_type> target_cache_;
  KVCache<typename Draft::scalar_type> draft_cache_;
  // A rejected draft's positions are cut from both caches.
  static_assert(TruncatableCache<decltype(target_cache_)> &&
                TruncatableCache<decltype(draft_cache_)>);
  Generator generator_;
  SamplingScratch scratch_;
  // The sequence so far, then a round's proposals: the history every distribution of the round
  // reads (the penalties see exactly the tokens before the position they score).
  std::vector<index_t> sequence_;
  std::vector<double> q_, p_, residual_;  // [γ, V] draft, [γ + 1, V] target, [V]
  SpeculativeStats stats_;
};

/// Continues `prompt` by up to max_new_tokens tokens of `target`, proposed by `draft` (see the
/// top of this file), calling on_token(id) as each is returned. As generate(), the target's
/// context bounds the length (the last token is only returned, never fed) and the result says
/// so. A draft whose context is shorter than the target's is valid: once the sequence no longer
/// fits it, it proposes nothing and each round is one ordinary step of the target.
/// @throws ConfigError as check_speculative and check_sampling; ShapeError for an empty prompt or
///         one longer than the target's context; as the models' forwards for ids outside the
///         vocabulary.
template <class Target, class Draft, class OnToken>
SpeculativeResult speculative_generate(const Target& target, const Draft& draft,
                                       std::span<const index_t> prompt,
                                       const SpeculativeOptions& options, OnToken&& on_token) {
  const auto start = std::chrono::steady_clock::now();
  SpeculativeDecoder<Target, Draft> decoder(target, draft, prompt, options);
  SpeculativeResult result;
  while (!decoder.done()) {
    for (const index_t token : decoder.round()) {
      result.tokens.push_back(token);
      on_token(token);
    }
  }
  result.stats = decoder.stats();
  result.stats.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return result;
}

/// As above, without a callback.
template <class Target, class Draft>
SpeculativeResult speculative_generate(const Target& target, const Draft& draft,
                                       std::span<const index_t> prompt,
                                       const SpeculativeOptions& options) {
  return speculative_generate(target, draft, prompt, options, [](index_t) {});
}

// ---- implementation -----------------------------------------------------------------------------

template <class Target, class Draft>
void check_speculative(std::string_view op, const Target& target, const Draft& draft,
                       const SpeculativeOptions& options) {
  const index_t vocab = target.config().vocab;
  if (draft.config().vocab != vocab) {
    throw ConfigError(concat(op, ": the draft's vocabulary has ", draft.config().vocab,
                             " tokens, the target's ", vocab,
                             " (the draft must propose the target's token ids)"));
  }
  if (options.gamma < 1) {
    throw ConfigError(concat(op, ": gamma must be >= 1 (got ", options.gamma, ")"));
  }
  if (options.max_new_tokens < 0) {
    throw ConfigError(
        concat(op, ": max_new_tokens must be >= 0 (got ", options.max_new_tokens, ")"));
  }
  if (options.eos_token_id && (*options.eos_token_id < 0 || *options.eos_token_id >= vocab)) {
    throw ConfigError(concat(op, ": eos_token_id ", *options.eos_token_id,
                             " is outside the vocabulary [0, ", vocab, ")"));
  }
  check_sampling(op, options.sampling);
}

namespace detail {

/// One id drawn from `probabilities` (summing to 1 up to rounding) with one uniform number,
/// walking the ids in order, as sample_token walks its kept tokens; no draw when one id holds
/// all the mass (greedy).
inline index_t draw_from(std::span<const double> probabilities, Generator& generator) {
  index_t only = -1, nonzero = 0;
  double total = 0;
  for (std::size_t id = 0; id < probabilities.size(); ++id) {
    if (probabilities[id] > 0) {
      only = static_cast<index_t>(id);
      ++nonzero;
      total += probabilities[id];
    }
  }
  if (nonzero == 1) return only;
  const double target = generator.uniform() * total;
  double running = 0;
  for (std::size_t id = 0; id < probabilities.size(); ++id) {
    running += probabilities[id];
    if (target < running) return static_cast<index_t>(id);
  }
  return only;  // target within rounding of the total: the last id with mass
}

}  // namespace detail

template <class Target, class Draft>
SpeculativeDecoder<Target, Draft>::SpeculativeDecoder(const Target& target, const Draft& draft,
                                                      std::span<const index_t> prompt,
                                                      const SpeculativeOptions& options)
    : target_(target),
      draft_(draft),
      options_((check_speculative("speculative_generate", target, draft, options), options)),
      vocab_(static_cast<std::size_t>(target.config().vocab)),
      prompt_length_(static_cast<index_t>(prompt.size())),
      wanted_(0),
      // Each cache sized by the request, not by its model's context: the target is fed the
      // prompt and every new token but the last; the draft never more (nor past its context).
      target_cache_(target.make_kv_cache(
          1, detail::generation_positions(target.config().context, prompt_length_,
                                          options.max_new_tokens))),
      draft_cache_(draft.make_kv_cache(
          1, detail::generation_positions(draft.config().context, prompt_length_,
                                          options.max_new_tokens))),
      generator_(options.seed) {
  const index_t context = target.config().context;
  if (prompt_length_ == 0 || prompt_length_ > context) {
    throw ShapeError(concat("speculative_generate: the prompt has ", prompt_length_,
                            " tokens; it needs 1 to the target's context, ", context));
  }
  // As generate(): the last token is never fed, so the context holds prompt + wanted − 1.
  wanted_ = std::min(options.max_new_tokens, context - prompt_length_ + 1);
  stats_.prompt_tokens = prompt_length_;
  stats_.stopped_at_context = wanted_ < options.max_new_tokens;
  sequence_.assign(prompt.begin(), prompt.end());
  sequence_.reserve(static_cast<std::size_t>(prompt_length_ + wanted_ + options.gamma));
  const auto gamma = static_cast<std::size_t>(options.gamma);
  q_.resize(gamma * vocab_);
  p_.resize((gamma + 1) * vocab_);
  residual_.resize(vocab_);
}

template <class Target, class Draft>
template <class Logits>
void SpeculativeDecoder<Target, Draft>::distribution(const Logits& logits, index_t row,
                                                     std::size_t history, std::span<double> into) {
  using Scalar = typename Logits::scalar_type;
  const std::span<const Scalar> logits_row(logits.data() + row * static_cast<index_t>(vocab_),
                                           vocab_);
  sampling_distribution(
      logits_row, options_.sampling,
      TokenHistory{std::span<const index_t>(sequence_.data(), history), prompt_length_}, into,
      scratch_);
}

template <class Target, class Draft>
std::span<const index_t> SpeculativeDecoder<Target, Draft>::round() {
  if (done()) return {};
  const auto current = static_cast<index_t>(sequence_.size());
  // Proposals: fewer than γ when fewer tokens remain (the round's own y is one of them), and
  // none once the draft's context cannot hold the sequence and its proposals but the last.
  const index_t k = std::max<index_t>(0, std::min({options_.gamma, wanted_ - generated_ - 1,
                                                   draft_.config().context - current + 1}));
  // The tokens of sequence_ after a cache, as one batch row.
  const auto unseen = [&](index_t cached) {
    const index_t fed = static_cast<index_t>(sequence_.size()) - cached;
    return TokenBatch{
        std::span<const index_t>(sequence_.data() + cached, static_cast<std::size_t>(fed)), 1, fed};
  };

  // Draft: the tokens it has not seen in one forward (q_1 from its last row), then one token
  // per forward.
  for (index_t i = 0; i < k; ++i) {
    const TokenBatch fed = unseen(draft_cache_.length());
    const auto logits = draft_.forward(fed, draft_cache_);
    ++stats_.draft_forwards;
    const auto q_i = q(static_cast<std::size_t>(i));
    distribution(logits, fed.seq - 1, sequence_.size(), q_i);
    sequence_.push_back(detail::draw_from(q_i, generator_));
  }
  stats_.proposed += k;

  // Target: everything after its cache (the last returned token, or the prompt, and the k
  // proposals) in one forward; its last k + 1 rows are p_1 … p_{k+1}.
  const TokenBatch fed = unseen(target_cache_.length());
  const auto logits = target_.forward(fed, target_cache_);
  ++stats_.target_forwards;
  for (index_t i = 0; i <= k; ++i) {
    distribution(logits, fed.seq - 1 - k + i, static_cast<std::size_t>(current + i),
                 p(static_cast<std::size_t>(i)));
  }

  // Accept in order while min(1, p/q) says so. u·q < p is u < p/q without the division; a
  // proposal the target finds at least as likely is kept without a draw.
  index_t kept = 0;
  std::optional<index_t> correction;
  for (; kept < k; ++kept) {
    const auto i = static_cast<std::size_t>(kept);
    const auto x = static_cast<std::size_t>(sequence_[static_cast<std::size_t>(current) + i]);
    const double p_x = p(i)[x], q_x = q(i)[x];
    if (p_x >= q_x || generator_.uniform() * q_x < p_x) continue;
    // Rejected: y from norm(max(0, p − q)). It has mass, since p(x) < q(x) and both sum to 1;
    // should rounding leave none, p itself is the distribution the rule approximates.
    double total = 0;
    for (std::size_t id = 0; id < vocab_; ++id) {
      total += residual_[id] = std::max(0.0, p(i)[id] - q(i)[id]);
    }
    correction = detail::draw_from(
        total > 0 ? std::span<const double>(residual_) : std::span<const double>(p(i)), generator_);
    break;
  }
  stats_.accepted += kept;
  const index_t y =
      correction ? *correction : detail::draw_from(p(static_cast<std::size_t>(k)), generator_);
  sequence_.resize(static_cast<std::size_t>(current + kept));
  sequence_.push_back(y);

  // Roll back: the target keeps the sequence and the accepted proposals (y is fed next round);
  // the draft keeps what it fed of them (it never fed x_k).
  target_cache_.truncate(current + kept);
  draft_cache_.truncate(std::min(draft_cache_.length(), current + kept));

  // The round's tokens, up to an EOS: what follows it is dropped.
  auto returned = static_cast<index_t>(sequence_.size()) - current;
  for (index_t i = 0; i < returned; ++i) {
    if (options_.eos_token_id &&
        sequence_[static_cast<std::size_t>(current + i)] == *options_.eos_token_id) {
      returned = i + 1;
      stats_.stopped_at_eos = true;
      // An EOS ends the run before the context does.
      stats_.stopped_at_context = false;
      sequence_.resize(static_cast<std::size_t>(current + returned));
      target_cache_.truncate(std::min(target_cache_.length(), current + returned - 1));
      draft_cache_.truncate(std::min(draft_cache_.length(), current + returned - 1));
    }
  }
  generated_ += returned;
  stats_.new_tokens = generated_;
  return {sequence_.data() + current, static_cast<std::size_t>(returned)};
}

}  // namespace dissect
