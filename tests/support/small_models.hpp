// Small GPT-2 and LLaMA configurations for the algebraic model tests (a few thousand
// parameters: fast in double, big enough to have every part), random token ids, and the small
// MLP the module and Sequential tests compose.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/sequential.hpp"

namespace dissect::testing {

/// GPT-2's parts at D = 16, L = 2, H = 4, F = 32, V = 23, context 12 (tied head).
inline TransformerConfig small_gpt2() {
  return {.d_model = 16, .n_layers = 2, .n_heads = 4, .d_ff = 32, .vocab = 23, .context = 12};
}

/// LLaMA's parts at D = 16, L = 2, H = 4, H_kv = 2, F = 24, context 12 (untied head).
inline TransformerConfig small_llama(index_t vocab = 23) {
  return {.d_model = 16,
          .n_layers = 2,
          .n_heads = 4,
          .n_kv_heads = 2,
          .d_ff = 24,
          .vocab = vocab,
          .context = 12,
          .tied_embeddings = false,
          .positions = Positions::rotary,
          .norm = Norm::rms_norm,
          .bias = false,
          .ffn = Ffn::gated};
}

/// small_llama with a mixture of 4 SwiGLU experts, 2 per token, in every layer (Mixtral).
inline TransformerConfig small_mixtral(index_t vocab = 23) {
  auto config = small_llama(vocab);
  config.n_experts = 4;
  config.experts_per_token = 2;
  return config;
}

/// small_llama at D = 32, F = 64 (V = 37): every in_features a multiple of q4_0's 32.
inline TransformerConfig quantisable_llama() {
  auto config = small_llama(37);
  config.d_model = 32;
  config.d_ff = 64;
  return config;
}

/// `count` ids uniform in [0, vocab), from `seed`.
inline std::vector<index_t> random_ids(std::size_t count, index_t vocab, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  std::uniform_int_distribution<index_t> pick(0, vocab - 1);
  std::vector<index_t> ids(count);
  for (auto& id : ids) id = pick(engine);
  return ids;
}

/// nn.Sequential(Linear(5, 7), ReLU(), Linear(7, 3, bias=False)) in double.
using SmallMlp = Sequential<Linear<double>, ReLU, Linear<double>>;

/// A SmallMlp whose layers are initialised from `seed` and `seed + 1`.
inline SmallMlp small_mlp(std::uint64_t seed) {
  return SmallMlp(Linear<double>(5, 7, {.seed = seed}), ReLU{},
                  Linear<double>(7, 3, {.bias = false, .seed = seed + 1}));
}

}  // namespace dissect::testing
