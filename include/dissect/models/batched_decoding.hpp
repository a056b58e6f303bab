// dissect/models/batched_decoding.hpp — continuous batching: many requests decoded together over
// a paged KV cache, one forward per step for every sequence in flight.
//
// B slots decode at once. Each step feeds the last token of every active sequence as one batch
// [B_active, 1]: the linear layers then read their weights once for all of them, which is what
// makes decode throughput grow with B while decode is memory-bound. A request is admitted when a
// slot is free and the pool can hold every block it may still need (so a step never runs out);
// its prompt is prefilled alone, reusing the full blocks of a prefix that another sequence in
// flight already holds. A sequence that stops (max_new_tokens, EOS, or the context) returns its
// blocks and its slot is refilled from the queue. Each request draws from its own generator, so
// its tokens are generate()'s for the same options.
#pragma once

#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "dissect/attention/paged_kv_cache.hpp"
#include "dissect/core/error.hpp"
#include "dissect/decoding/sampling.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/tensor/init.hpp"

namespace dissect {

/// One sequence to continue: its prompt and generate()'s options, and an optional end token
/// (generated, returned, and then the sequence stops).
struct BatchRequest {
  std::vector<index_t> prompt;
  GenerationOptions options = {};
  std::optional<index_t> eos_token_id = std::nullopt;
};

struct BatchedDecodingOptions {
  index_t slots = 4;  ///< sequences decoded together at most (B; no more than the requests)
  bool share_prefixes = true;  ///< take the full blocks of a common prompt prefix (prompt cache)
};

struct BatchedDecodingStats {
  index_t prefill_tokens = 0;  ///< prompt positions computed
  index_t reused_tokens = 0;   ///< prompt positions taken from shared blocks instead
  index_t decode_steps = 0;    ///< batched forwards of one token per active sequence
  index_t decode_tokens = 0;   ///< tokens those steps fed, summed over sequences
  index_t peak_blocks = 0;     ///< the most blocks in use at once
  index_t peak_batch = 0;      ///< the most sequences in one decode step
  double prefill_seconds = 0;
  double decode_seconds = 0;
  /// Decoded tokens per second summed over sequences.
  double decode_tokens_per_second() const {
    return decode_seconds > 0 ? static_cast<double>(decode_tokens) / decode_seconds : 0;
  }
};

struct BatchedDecodingResult {
  std::vector<std::vector<index_t>> tokens;  ///< per request, in request order
  std::vector<bool> stopped_at_context;      ///< per request, as GenerationStats says
  BatchedDecodingStats stats;
};

/// Decodes every request, `options.slots` at a time, over `kv` (which may hold other
/// sequences: only its free blocks are used). Returns each request's new tokens.
/// @throws ConfigError for slots ≤ 0, bad sampling options, max_new_tokens < 0 or an
///         eos_token_id outside the vocabulary; ShapeError for an empty prompt or one longer than
///         the context; Error, before any forward, for a request whose blocks exceed the whole
///         pool, and when the head of the queue cannot be admitted with nothing else in flight
///         (the cache's other sequences hold what it needs); as the model's forward for bad ids.
template <class Model>
BatchedDecodingResult batched_generate(const Model& model,
                                       PagedKVCache<typename Model::scalar_type>& kv,
                                       std::span<const BatchRequest> requests,
                                       const BatchedDecodingOptions& options = {}) {
  using Scalar = typename Model::scalar_type;
  using Clock = std::chrono::steady_clock;
  constexpr std::string_view op = "batched_generate";
  const index_t context = model.config().context, vocab = model.config().vocab;
  if (options.slots <= 0) {
    throw ConfigError(detail::concat(op, ": slots must be >= 1 (got ", options.slots, ")"));
  }
  // Every request is checked before any work; `wanted` is generate()'s: the context bounds it.
  std::vector<index_t> wanted(requests.size());
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const auto& request = requests[i];
    check_sampling(op, request.options.sampling);
    const auto length = static_cast<index_t>(request.prompt.size());
    if (request.options.max_new_tokens < 0) {
      throw ConfigError(detail::concat(op, ": request ", i, ": max_new_tokens must be >= 0 (got ",
                                       request.options.max_new_tokens, ")"));
    }
    if (request.eos_token_id && (*request.eos_token_id < 0 || *request.eos_token_id >= vocab)) {
      throw ConfigError(detail::concat(op, ": request ", i, ": eos_token_id ",
                                       *request.eos_token_id, " is outside the vocabulary [0, ",
                                       vocab, ")"));
    }
    if (length == 0 || length > context) {
      throw ShapeError(detail::concat(op, ": request ", i, ": the prompt has ", length,
                                      " tokens; it needs 1 to the context, ", context));
    }
    wanted[i] = std::min(request.options.max_new_tokens, context - length + 1);
    // The positions fed: the prompt and every new token but the last (only shown).
    const index_t blocks = kv.blocks_for(length + wanted[i] - 1);
    if (wanted[i] > 0 && blocks > kv.n_blocks()) {
      throw Error(detail::concat(op, ": request ", i, " needs ", blocks, " blocks of ",
                                 kv.block_size(), " positions (", length, " prompt + ",
                                 wanted[i] - 1, " fed tokens); the paged KV cache has ",
                                 kv.n_blocks()));
    }
  }

  BatchedDecodingResult result;
  result.tokens.resize(requests.size());
  result.stopped_at_context.resize(requests.size());
  auto& stats = result.stats;
  struct Slot {
    std::size_t request;
    index_t sequence;
    index_t final_blocks;  // the blocks it holds when its last fed token is in
    Generator generator;
    SamplingScratch scratch;
    std::vector<index_t> history;  // prompt, then the new tokens (the penalties read it)
  };
  // No more slots than requests: each slot's state is allocated up front, and a slot without a
  // request to hold would be memory for nothing (slots = 2⁴⁰ for one request is one slot).
  std::vector<std::optional<Slot>> slots(
      std::min(static_cast<std::size_t>(options.slots), requests.size()));
  // The step's rows, reserved once: a decode step allocates nothing here.
  std::vector<index_t> step_tokens, step_sequences;
  std::vector<std::size_t> step_slots;
  step_tokens.reserve(slots.size());
  step_sequences.reserve(slots.size());
  step_slots.reserve(slots.size());

  // Draws request `slot`'s next token from `row` of logits; true when the sequence is done.
  const auto draw = [&](Slot& slot, std::span<const Scalar> row) {
    const auto& request = requests[slot.request];
    const auto length = static_cast<index_t>(request.prompt.size());
    const index_t token =
        sample_token(row, request.options.sampling, TokenHistory{slot.history, length},
                     slot.generator, slot.scratch);
    slot.history.push_back(token);
    auto& out = result.tokens[slot.request];
    out.push_back(token);
    return static_cast<index_t>(out.size()) == wanted[slot.request] ||
           (request.eos_token_id && token == *request.eos_token_id);
  };
  const auto finish = [&](std::optional<Slot>& slot) {
    kv.release(slot->sequence);
    slot.reset();
  };
  const auto in_flight = [&] {
    return std::count_if(slots.begin(), slots.end(), [](const auto& s) { return s.has_value(); });
  };
  // Blocks the sequences in flight may still take: a newcomer may use only what is left.
  const auto promised = [&] {
    index_t blocks = 0;
    for (const auto& s : slots) {
      if (s) blocks += s->final_blocks - static_cast<index_t>(kv.block_table(s->sequence).size());
    }
    return blocks;
  };
  const auto note_peak = [&] { stats.peak_blocks = std::max(stats.peak_blocks, kv.used_blocks()); };

  // A forward that throws (an id outside the vocabulary) gives back the blocks of this call's
  // sequences, so the cache holds what it held before.
  struct ReleaseOnThrow {
    std::vector<std::optional<Slot>>& slots;
    PagedKVCache<Scalar>& kv;
    ~ReleaseOnThrow() {
      for (auto& s : slots) {
        if (s) kv.release(s->sequence);
      }
    }
  } release_on_throw{slots, kv};
  std::size_t next = 0;
  while (next < requests.size() || in_flight() > 0) {
    // Admit from the head of the queue, in order, while a slot and the blocks are free.
    for (auto& slot : slots) {
      if (slot || next == requests.size()) continue;
      const std::size_t i = next;
      const auto& request = requests[i];
      const auto length = static_cast<index_t>(request.prompt.size());
      result.stopped_at_context[i] = wanted[i] < request.options.max_new_tokens;
      if (wanted[i] == 0) {  // generate() returns nothing for it either
        ++next;
        continue;
      }
      const index_t sequence = kv.add_sequence();
      const index_t reused = options.share_prefixes ? kv.share_prefix(sequence, request.prompt) : 0;
      const index_t final_blocks = kv.blocks_for(length + wanted[i] - 1);
      const index_t needed = final_blocks - static_cast<index_t>(kv.block_table(sequence).size());
      if (needed > kv.free_blocks() - promised()) {
        kv.release(sequence);
        if (in_flight() == 0) {
          throw Error(detail::concat(op, ": request ", i, " needs ", needed,
                                     " free blocks, the paged KV cache has ", kv.free_blocks(),
                                     " free of ", kv.n_blocks(),
                                     " with no request of this call in flight"));
        }
        break;  // wait for a sequence to finish
      }
      ++next;
      slot.emplace(Slot{i, sequence, final_blocks, Generator(request.options.seed), {}, {}});
      slot->history.reserve(static_cast<std::size_t>(length + wanted[i]));
      slot->history.assign(request.prompt.begin(), request.prompt.end());
      result.tokens[i].reserve(static_cast<std::size_t>(wanted[i]));
      const auto start = Clock::now();
      const auto rest =
          std::span<const index_t>(request.prompt).subspan(static_cast<std::size_t>(reused));
      const index_t ids[] = {sequence};
      const auto logits =
          model.forward(TokenBatch{rest, 1, static_cast<index_t>(rest.size())}, kv, ids);
      note_peak();
      stats.prefill_tokens += static_cast<index_t>(rest.size());
      stats.reused_tokens += reused;
      const bool done =
          draw(*slot, std::span<const Scalar>(logits.data() + (logits.dim(1) - 1) * vocab,
                                              static_cast<std::size_t>(vocab)));
      stats.prefill_seconds += std::chrono::duration<double>(Clock::now() - start).count();
      if (done) finish(slot);
    }
    // One decode step: every sequence in flight feeds its last token, as one batch.
    step_tokens.clear();
    step_sequences.clear();
    step_slots.clear();
    for (std::size_t s = 0; s < slots.size(); ++s) {
      if (!slots[s]) continue;
      step_tokens.push_back(slots[s]->history.back());
      step_sequences.push_back(slots[s]->sequence);
      step_slots.push_back(s);
    }
    if (step_slots.empty()) continue;
    const auto batch = static_cast<index_t>(step_slots.size());
    const auto start = Clock::now();
    const auto logits = model.forward(TokenBatch{step_tokens, batch, 1}, kv, step_sequences);
    note_peak();
    for (index_t b = 0; b < batch; ++b) {
      auto& slot = slots[step_slots[static_cast<std::size_t>(b)]];
      if (draw(*slot, std::span<const Scalar>(logits.data() + b * vocab,
                                              static_cast<std::size_t>(vocab)))) {
        finish(slot);
      }
    }
    stats.decode_seconds += std::chrono::duration<double>(Clock::now() - start).count();
    ++stats.decode_steps;
    stats.decode_tokens += batch;
    stats.peak_batch = std::max(stats.peak_batch, batch);
  }
  return result;
}

}  // namespace dissect
