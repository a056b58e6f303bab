// dissect/models/generate.hpp — text generation: a prompt prefilled into a KV cache, then one
// token at a time, each sampled from the last position's logits (sampling.hpp), the penalties
// reading the prompt and the tokens generated before it.
//
// Prefill runs the whole prompt in one forward (matrix products over all its tokens); decoding
// then feeds one token per step, reading every earlier key and value from the cache. The two are
// timed apart, because they are bound by different things: prefill by FLOPs, decode by the bytes
// of weights read per token.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/decoding/sampling.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/tensor/init.hpp"

namespace dissect {

struct GenerationOptions {
  index_t max_new_tokens = 64;
  SamplingOptions sampling = {};
  std::uint64_t seed = 0;  ///< of the sampling draws
};

/// What a generation did, and how fast.
struct GenerationStats {
  index_t prompt_tokens = 0;
  index_t new_tokens = 0;
  bool stopped_at_context = false;  ///< fewer than max_new_tokens: the context was full
  /// Positions the KV cache was built for: the prompt and max_new_tokens − 1, capped by the
  /// context (the request, not the context, sizes it).
  index_t kv_cache_positions = 0;
  double prefill_seconds = 0;  ///< the prompt's forward and the first draw
  double decode_seconds = 0;   ///< every later step

  double prefill_tokens_per_second() const { return rate(prompt_tokens, prefill_seconds); }
  /// Tokens decoded after the first, per second.
  double decode_tokens_per_second() const {
    return rate(new_tokens > 0 ? new_tokens - 1 : 0, decode_seconds);
  }

 private:
  static double rate(index_t tokens, double seconds) {
    return seconds > 0 ? static_cast<double>(tokens) / seconds : 0;
  }
};

namespace detail {

/// The KV-cache positions a generation of up to `max_new_tokens` after a prompt of `prompt`
/// tokens feeds a model of `context` positions: the prompt and every new token but the last
/// (which is only returned), never past the context. The cache is sized by this, the request,
/// not by the context: a model whose context is 2³¹ − 1 generates 8 tokens in the memory of 8.
/// At least 1, so a cache can be built before a bad prompt is refused by name.
inline index_t generation_positions(index_t context, index_t prompt, index_t max_new_tokens) {
  if (prompt <= 0 || context <= 0) return 1;
  if (prompt >= context) return context;
  // prompt + max_new_tokens − 1 without overflow, capped by the context.
  return prompt + std::clamp<index_t>(max_new_tokens - 1, 0, context - prompt);
}

}  // namespace detail

/// Continues `prompt` (one sequence of ids) by up to max_new_tokens, calling on_token(id) as
/// each is chosen (to stream it). Stops early, and says so, when the model's context is full.
/// @throws ShapeError for an empty prompt or one longer than the context; as the model's
///         forward for ids outside the vocabulary; ConfigError for bad options.
template <class Model, class OnToken>
GenerationStats generate(const Model& model, std::span<const index_t> prompt,
                         const GenerationOptions& options, OnToken&& on_token) {
  using Scalar = typename Model::scalar_type;
  using Clock = std::chrono::steady_clock;
  constexpr std::string_view op = "generate";
  check_sampling(op, options.sampling);
  if (options.max_new_tokens < 0) {
    throw ConfigError(
        detail::concat(op, ": max_new_tokens must be >= 0 (got ", options.max_new_tokens, ")"));
  }
  const index_t context = model.config().context, vocab = model.config().vocab;
  const auto length = static_cast<index_t>(prompt.size());
  if (length == 0 || length > context) {
    throw ShapeError(detail::concat(op, ": the prompt has ", length,
                                    " tokens; it needs 1 to the context, ", context));
  }
  GenerationStats stats;
  stats.prompt_tokens = length;
  const index_t wanted = std::min(options.max_new_tokens, context - length + 1);
  stats.stopped_at_context = wanted < options.max_new_tokens;
  auto cache =
      model.make_kv_cache(1, detail::generation_positions(context, length, options.max_new_tokens));
  stats.kv_cache_positions = cache.capacity();
  Generator generator(options.seed);
  SamplingScratch scratch;
  // The penalties read the prompt and every token generated so far; reserved once, so a step
  // appends without allocating.
  std::vector<index_t> history(prompt.begin(), prompt.end());
  history.reserve(static_cast<std::size_t>(length + wanted));
  const auto last_row = [&](const Tensor<Scalar, 3>& logits) {
    return std::span<const Scalar>(logits.data() + (logits.dim(1) - 1) * vocab,
                                   static_cast<std::size_t>(vocab));
  };
  auto start = Clock::now();
  // Only the last position's logits are sampled from: the head runs on that row alone.
  auto logits = model.forward_last(TokenBatch{prompt, 1, length}, cache);
  for (index_t step = 0; step < wanted; ++step) {
    index_t token = sample_token(last_row(logits), options.sampling, TokenHistory{history, length},
                                 generator, scratch);
    history.push_back(token);
    on_token(token);
    ++stats.new_tokens;
    const auto now = Clock::now();
    (step == 0 ? stats.prefill_seconds : stats.decode_seconds) +=
        std::chrono::duration<double>(now - start).count();
    start = now;
    // The last token is only shown: feeding it would need one position past the context.
    if (step + 1 == wanted) break;
    logits = model.forward_last(TokenBatch{std::span<const index_t>(&token, 1), 1, 1}, cache);
  }
  return stats;
}

}  // namespace dissect
