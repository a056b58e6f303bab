// dissect/models/beam_search.hpp — beam search as Hugging Face transformers defines it: the
// num_beams best partial continuations kept at every step, the n best finished ones returned
// with their length-penalised scores.
//
// The semantics are those of the vectorised `_beam_search` of transformers' generation/utils.py
// (pull request #35802, released after v4.48), for one sequence and one EOS id:
//
//   step:  logp = log_softmax(logits of each running beam's last position)      [n, V]
//          candidates = logp + the beam's running score, flattened              [n·V]
//          the 2n best candidates, best first (token = index mod V, parent = index div V)
//          a candidate "hits" if its token is EOS or the sequence reaches max_length
//   run:   the next beams are the n best candidates that do not hit
//   done:  a hitting candidate of rank < n is a finished hypothesis scored
//          sum_logprobs / new_len^length_penalty, new_len = the tokens generated including
//          the last one; the prompt is not counted since pull requests #27351 and #27808
//          (`decoder_prompt_len`, late 2023; before, the whole sequence's length was used);
//          the n best finished hypotheses are kept
//   stop:  max_length reached; or, once n hypotheses are finished, early_stopping = when_full
//          (HF's True) stops; otherwise the best running score divided by
//          (generated length)^length_penalty — or, for `never` with length_penalty > 0, by
//          (max_new_tokens)^length_penalty — must still beat the worst kept hypothesis
//
// The first step only extends beam 0 (the others start at −1e9, as in HF), so the beams do not
// all pick the same tokens. Every beam has its own rows of one KV cache of batch n; after each
// step the rows are gathered by the chosen parents (KVCache::reorder, HF's `_reorder_cache`) and
// all beams decode in one forward. Scores are summed in the model's scalar type (HF sums in
// float32 whatever the model's type). Equal scores are ranked by the lower index (candidate
// beam·V + token; a hypothesis kept before a new one): torch.topk leaves the order of ties
// unspecified, so the reference fixtures are drawn without them.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "dissect/attention/kv_cache_concept.hpp"
#include "dissect/core/error.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/training/loss.hpp"

namespace dissect {

/// When beam search stops before max_new_tokens (transformers' `early_stopping`).
enum class EarlyStopping {
  heuristic,  ///< HF's False: stop when the best running beam, scored at its current length,
              ///< cannot beat the worst of num_beams finished hypotheses
  when_full,  ///< HF's True: stop as soon as num_beams hypotheses are finished
  never,      ///< HF's "never": as heuristic, but with length_penalty > 0 the best running beam
              ///< is scored at the longest length it could still reach
};

struct BeamSearchOptions {
  index_t num_beams = 1;
  double length_penalty = 1.0;  ///< the exponent of the generated length dividing a score
  EarlyStopping early_stopping = EarlyStopping::heuristic;
  index_t max_new_tokens = 64;
  std::optional<index_t> eos_token_id{};  ///< none: every hypothesis runs to max_new_tokens
  index_t num_return_sequences = 1;       ///< ≤ num_beams
};

/// One finished continuation: the generated tokens only (with the EOS that ended it, if one
/// did) and sum of their log-probabilities / tokens.size()^length_penalty.
struct BeamHypothesis {
  std::vector<index_t> tokens;
  double score = 0;
};

struct BeamSearchResult {
  std::vector<BeamHypothesis> sequences;  ///< num_return_sequences of them, best first
  index_t steps = 0;                      ///< forwards run (the prompt's included)
  bool stopped_at_context = false;        ///< max_new_tokens was cut to fit the context
};

/// Checks options against a vocabulary of `vocab` tokens. @throws ConfigError naming `op` and
/// the field.
inline void check_beam_search(std::string_view op, const BeamSearchOptions& options,
                              index_t vocab) {
  if (options.num_beams < 1) {
    throw ConfigError(concat(op, ": num_beams must be >= 1 (got ", options.num_beams, ")"));
  }
  if (options.num_return_sequences < 1 || options.num_return_sequences > options.num_beams) {
    throw ConfigError(concat(op, ": num_return_sequences must be in [1, num_beams = ",
                             options.num_beams, "] (got ", options.num_return_sequences, ")"));
  }
  if (options.max_new_tokens < 0) {
    throw ConfigError(
        concat(op, ": max_new_tokens must be >= 0 (got ", options.max_new_tokens, ")"));
  }
  if (!std::isfinite(options.length_penalty)) {
    throw ConfigError(
        concat(op, ": length_penalty must be finite (got ", options.length_penalty, ")"));
  }
  if (options.eos_token_id && (*options.eos_token_id < 0 || *options.eos_token_id >= vocab)) {
    throw ConfigError(concat(op, ": eos_token_id ", *options.eos_token_id,
                             " is outside the vocabulary [0, ", vocab, ")"));
  }
  detail::check_enum(op, "EarlyStopping", options.early_stopping,
                     std::array<std::string_view, 3>{"heuristic", "when_full", "never"});
  // 2·num_beams candidates are ranked among num_beams·V (HF's torch.topk would fail too).
  if (vocab < 2) {
    throw ConfigError(concat(op, ": a vocabulary of ", vocab, " token has no 2 candidates"));
  }
}

/// The num_return_sequences best continuations of `prompt` by beam search (see the top of this
/// file). max_new_tokens = 0 returns no sequence. As generate, the model's context bounds the
/// length: the last token is only scored, never fed, so prompt + max_new_tokens − 1 positions
/// must fit; beyond that max_new_tokens is cut and the result says so.
/// @throws ConfigError for bad options (above); ShapeError for an empty prompt or one longer
///         than the context; as the model's forward for ids outside the vocabulary.
template <class Model>
BeamSearchResult beam_search(const Model& model, std::span<const index_t> prompt,
                             const BeamSearchOptions& options) {
  using Scalar = typename Model::scalar_type;
  constexpr std::string_view op = "beam_search";
  const index_t context = model.config().context, vocab = model.config().vocab;
  check_beam_search(op, options, vocab);
  const auto length = static_cast<index_t>(prompt.size());
  if (length == 0 || length > context) {
    throw ShapeError(
        concat(op, ": the prompt has ", length, " tokens; it needs 1 to the context, ", context));
  }
  BeamSearchResult result;
  const index_t wanted = std::min(options.max_new_tokens, context - length + 1);
  result.stopped_at_context = wanted < options.max_new_tokens;
  if (wanted == 0) return result;

  const index_t beams = options.num_beams, candidates = 2 * beams;
  const index_t max_length = length + wanted;
  // HF's stand-in for "impossible": large enough to lose every comparison with a real score.
  const Scalar impossible = Scalar(-1e9);
  const auto penalty = [&](index_t generated) {
    return static_cast<Scalar>(std::pow(static_cast<double>(generated), options.length_penalty));
  };

  struct Beam {
    std::vector<index_t> tokens;
    Scalar score;
  };
  std::vector<Beam> running(static_cast<std::size_t>(beams), Beam{{}, impossible});
  running[0].score = 0;
  std::vector<Beam> finished;  // best first, at most `beams`

  // Every beam starts from the whole prompt.
  std::vector<index_t> ids;
  ids.reserve(static_cast<std::size_t>(beams * length));
  for (index_t b = 0; b < beams; ++b) ids.insert(ids.end(), prompt.begin(), prompt.end());
  // Sized by the request (the prompt and every new token but the last), not by the context.
  auto cache = model.make_kv_cache(beams, detail::generation_positions(context, length, wanted));
  static_assert(ReorderableCache<decltype(cache)>, "beam search regathers the cache's rows");
  auto logits = model.forward(TokenBatch{ids, beams, length}, cache);

  std::vector<index_t> order(static_cast<std::size_t>(beams * vocab));
  std::vector<Scalar> total(order.size());
  std::vector<index_t> parents(static_cast<std::size_t>(beams)), next(parents.size());
  bool improvable = true;
  for (index_t current = length;;) {
    ++result.steps;
    const index_t positions = logits.dim(1);
    Tensor<Scalar, 2> last({beams, vocab});
    for (index_t b = 0; b < beams; ++b) {
      std::copy_n(logits.data() + (b * positions + positions - 1) * vocab, vocab,
                  last.data() + b * vocab);
    }
    const auto logp = log_softmax(last);
    for (index_t i = 0; i < beams * vocab; ++i) {
      total[static_cast<std::size_t>(i)] = logp.data()[i] + running[i / vocab].score;
    }
    std::iota(order.begin(), order.end(), index_t{0});
    const auto better = [&](index_t a, index_t b) {
      const Scalar x = total[static_cast<std::size_t>(a)], y = total[static_cast<std::size_t>(b)];
      return x > y || (x == y && a < b);
    };
    std::partial_sort(order.begin(), order.begin() + candidates, order.end(), better);

    const bool at_max_length = current + 1 >= max_length;
    const index_t generated = current + 1 - length;
    std::vector<Beam> next_running;
    std::vector<Beam> merged = finished;
    for (index_t rank = 0; rank < candidates; ++rank) {
      const index_t index = order[static_cast<std::size_t>(rank)];
      const index_t token = index % vocab, parent = index / vocab;
      const Scalar score = total[static_cast<std::size_t>(index)];
      const bool hits = at_max_length || (options.eos_token_id && token == *options.eos_token_id);
      if (hits) {
        // Only the top n candidates may finish: the rest exist to keep n beams running.
        if (rank < beams) {
          Beam done{running[static_cast<std::size_t>(parent)].tokens, score / penalty(generated)};
          done.tokens.push_back(token);
          merged.push_back(std::move(done));
        }
      } else if (static_cast<index_t>(next_running.size()) < beams) {
        parents[next_running.size()] = parent;
        next[next_running.size()] = token;
        Beam extended{running[static_cast<std::size_t>(parent)].tokens, score};
        extended.tokens.push_back(token);
        next_running.push_back(std::move(extended));
      }
    }
    // Kept hypotheses come before new ones, so a tie keeps the older.
    std::stable_sort(merged.begin(), merged.end(),
                     [](const Beam& a, const Beam& b) { return a.score > b.score; });
    if (static_cast<index_t>(merged.size()) > beams) merged.resize(static_cast<std::size_t>(beams));
    finished = std::move(merged);
    // At max_length every candidate hits: the loop ends with n hypotheses finished.
    if (at_max_length) break;
    running = std::move(next_running);
    ++current;

    // HF checks the two rules for a whole batch, with each sequence's further hypotheses
    // refused once its own rule holds; for one sequence the loop simply ends there.
    const bool full = static_cast<index_t>(finished.size()) == beams;
    if (full) {
      const index_t best_length =
          options.early_stopping == EarlyStopping::never && options.length_penalty > 0
              ? max_length - length
              : current - length;
      improvable = improvable && running[0].score / penalty(best_length) > finished.back().score;
      if (!improvable || options.early_stopping == EarlyStopping::when_full) break;
    }
    cache.reorder(parents);
    logits = model.forward(TokenBatch{next, beams, 1}, cache);
  }
  const auto returned = static_cast<std::size_t>(options.num_return_sequences);
  for (std::size_t i = 0; i < returned && i < finished.size(); ++i) {
    result.sequences.push_back(
        {std::move(finished[i].tokens), static_cast<double>(finished[i].score)});
  }
  return result;
}

}  // namespace dissect
