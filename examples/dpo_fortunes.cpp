// dpo_fortunes — Direct Preference Optimization (dissect::dpo_loss) on a mini-GPT that train_gpt
// trained on fortunes: the model is taught to prefer continuations without a chosen letter ('e'
// by default, a lipogram), from pairs its own frozen copy sampled.
//
//   dpo_fortunes --model mini_gpt.safetensors                  # 300 steps, about a minute
//   dpo_fortunes --model mini_gpt.safetensors --letter t --beta 0.2
//
// Model. --model is a checkpoint train_gpt wrote (a GPT-2 with a byte vocabulary in its
// metadata, as lora_finetune reads it). The policy πθ starts as it; the reference π_ref is a
// frozen copy of it, never updated.
//
// Preference pairs. The fortunes of --data (train_gpt's corpus: examples/common/fortunes.hpp) are
// cut at their "%" lines. A fortune that ends in the first 90 % of the text is a training
// fortune, one that starts in the last 10 % a held-out one (train_gpt's split, so the held-out
// prompts are text the base model never trained on). A prompt x is the first --prompt-bytes
// bytes of a fortune (fortunes are taken in an order shuffled by Generator(seed)). For each
// prompt the reference samples two continuations of --response-bytes bytes at temperature 1
// (Generator(seed + 1) for training pairs, seed + 2 for held-out ones). The rule: the
// continuation with fewer occurrences of --letter (either case) is chosen (y_w), the other
// rejected (y_l); a pair of equal counts says nothing and is dropped, and prompts are drawn until
// --pairs training and --eval-pairs held-out pairs remain. The rule is on purpose one a model can
// learn and a reader can check: its own metric is the share of --letter in what the policy
// samples.
//
// Training. Each step takes --batch pairs (in an order reshuffled every epoch by
// Generator(seed + 1000)), runs the policy on the 2·batch sequences x·y, and takes
// log πθ(y|x) = Σ over the response's tokens of log softmax (dissect::sequence_log_probs, the
// prompt masked out); log π_ref(y|x) of every pair is computed once, before training. The loss
// is DPO's (Rafailov et al. 2023, eq. 7) with --beta:
//   −log σ(β·[(log πθ(y_w) − log π_ref(y_w)) − (log πθ(y_l) − log π_ref(y_l))]),
// averaged over the pairs; its gradient goes back through sequence_log_probs_backward and the
// model's backward. AdamW, betas (0.9, 0.999), eps 1e-8, no weight decay (decay would pull the
// weights towards 0, not towards the reference); train_gpt's schedule: a linear warm-up over
// min(100, steps / 10) steps to --lr, then a cosine down to --lr / 10.
//
// Evaluation (before training and every --eval-every steps), on the held-out pairs and prompts:
//   - the DPO loss, the implicit reward margin β·[(log πθ − log π_ref)(y_w) − (…)(y_l)] averaged
//     over the pairs, and the preference accuracy: the fraction of pairs whose margin is > 0
//     (0 before training, where every margin is exactly 0);
//   - KL(πθ ‖ π_ref) per response byte: one continuation of each held-out prompt is sampled from
//     the policy (Generator(seed + 3000), restarted at every evaluation, so every evaluation
//     draws the same uniforms), and at each of its positions the exact KL of the two next-byte
//     distributions, Σ_v πθ(v)·(log πθ(v) − log π_ref(v)) over the whole vocabulary, is
//     averaged. Summed over a continuation instead, it is an unbiased estimate of the KL between
//     the two models' distributions of continuations, lower in variance than the sampled
//     log-ratio;
//   - the share of --letter (either case) among the bytes of those same continuations: the
//     reference's own share at step 0.
// The training columns are the means over the steps since the previous evaluation of the same
// quantities on the training batches.
//
// Output. A line per evaluation, a summary (each metric before → after) and two held-out
// continuations, the reference's and the policy's. --curves writes the evaluations as CSV
// (step,lr,train_loss,train_margin,train_accuracy,heldout_loss,heldout_margin,heldout_accuracy,
// kl_per_byte,letter_share; the training columns are empty at step 0); --svg draws them.
//
// Every flag is checked before any work, then --model and --data as they are read. Exit status:
// 0 success, 2 bad input (a flag, an output path, a model or data that is missing or unusable),
// 1 anything else (a run whose loss is not finite).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/byte_checkpoint.hpp"
#include "common/char_lm.hpp"
#include "common/cli.hpp"
#include "common/fortunes.hpp"
#include "common/svg_plot.hpp"
#include "dissect/accounting/config.hpp"
#include "dissect/accounting/count.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/decoding/sampling.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/layers/embedding.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/tensor.hpp"
#include "dissect/training/alignment_loss.hpp"
#include "dissect/training/optim.hpp"
#include "tools/common/byte_vocab.hpp"

namespace {

using dissect::index_t;
using dissect::examples::check_range;
using dissect::examples::check_real;
using dissect::examples::FlagDeclarer;
using dissect::examples::UsageError;
using Model = dissect::GPT2Model<float>;

// ---- flags --------------------------------------------------------------------------------------

// Limits that keep a typo from asking for days of work or more memory than a desktop has.
constexpr index_t kMaxSteps = 1'000'000;
constexpr index_t kMaxBytes = 8192;  // train_gpt's largest context
constexpr index_t kMaxPairs = 100'000;
constexpr index_t kMaxBatch = 1024;
// Rows sampled or evaluated at once: bounds the KV cache and the logits of a chunk.
constexpr index_t kChunk = 128;

struct Flags {
  std::string model;
  std::string data = dissect::examples::kDefaultFortunes;
  std::string letter = "e";
  index_t prompt_bytes = 16;
  index_t response_bytes = 32;
  index_t pairs = 512;
  index_t eval_pairs = 128;
  double beta = 0.1;
  double lr = 1e-4;
  index_t steps = 300;
  index_t batch = 16;
  index_t eval_every = 25;
  std::uint64_t seed = 0;
  std::string svg = "dpo_fortunes.svg";
  std::string curves = "none";
};

void add_flags(CLI::App& app, Flags& flags) {
  FlagDeclarer option(app);
  option.group("Model and data");
  option("--model", flags.model, "PATH",
         "the policy's starting point and the reference: a .safetensors file train_gpt "
         "--checkpoint wrote")
      ->required();
  option("--data", flags.data, "DIR",
         std::string("the fortune files the prompts come from (default ") +
             dissect::examples::kDefaultFortunes + ")");

  option.group("Preference pairs");
  option("--letter", flags.letter, "C",
         "the letter the chosen continuation has fewer of (either case), one ASCII letter "
         "(default e)");
  option("--prompt-bytes", flags.prompt_bytes, "P",
         "bytes of a fortune's start that make a prompt, 1 to 8192 (default 16)");
  option("--response-bytes", flags.response_bytes, "R",
         "bytes of each sampled continuation, 1 to 8192; P + R - 1 must fit the model's context "
         "(default 32)");
  option("--pairs", flags.pairs, "N", "training pairs, 1 to 100,000 (default 512)");
  option("--eval-pairs", flags.eval_pairs, "N",
         "held-out pairs (and prompts sampled at each evaluation), 1 to 100,000 (default 128)");

  option.group("Training");
  option("--beta", flags.beta, "B",
         "DPO's beta: how far the policy may move from the reference; finite and > 0 "
         "(default 0.1)");
  option("--lr", flags.lr, "X", "AdamW's peak learning rate, finite and > 0 (default 1e-4)");
  option("--steps", flags.steps, "N", "optimizer steps, 1 to 1,000,000 (default 300)");
  option("--batch", flags.batch, "N", "pairs per step, 1 to 1024 and at most --pairs (default 16)");
  option("--eval-every", flags.eval_every, "N",
         "steps between evaluations on the held-out pairs, 1 to 1,000,000 (default 25)");
  option("--seed", flags.seed, "S",
         "prompts from Generator(S), pairs from S + 1 and S + 2, batches from S + 1000, the "
         "evaluations' samples from S + 3000 (default 0)");

  option.group("Output");
  option("--svg", flags.svg, "PATH",
         "where the curves are drawn, checked before training (default dpo_fortunes.svg; "
         "\"none\" to skip)");
  option("--curves", flags.curves, "PATH",
         "write the evaluations as CSV, checked before training (default none)");
  app.footer(
      "Pairs: two continuations of a fortune's start sampled from the frozen reference; the one "
      "with fewer --letter is preferred. DPO trains the policy on them and reports the held-out "
      "reward margin, preference accuracy, KL to the reference and the letter's share. (Details "
      "at the top of examples/dpo_fortunes.cpp.)\n\n" +
      std::string(dissect::examples::kExitStatusHelp));
}

/// Everything CLI11 cannot check and that needs no file. @throws UsageError naming the flag.
void validate(const Flags& flags) {
  if (flags.letter.size() != 1 || !std::isalpha(static_cast<unsigned char>(flags.letter[0]))) {
    throw UsageError("--letter: must be one ASCII letter, got \"" + flags.letter + "\"");
  }
  check_range<index_t>("--prompt-bytes", flags.prompt_bytes, 1, kMaxBytes);
  check_range<index_t>("--response-bytes", flags.response_bytes, 1, kMaxBytes);
  check_range<index_t>("--pairs", flags.pairs, 1, kMaxPairs);
  check_range<index_t>("--eval-pairs", flags.eval_pairs, 1, kMaxPairs);
  check_real("--beta", flags.beta, 0, false);
  check_real("--lr", flags.lr, 0, false);
  check_range<index_t>("--steps", flags.steps, 1, kMaxSteps);
  check_range<index_t>("--batch", flags.batch, 1, std::min(kMaxBatch, flags.pairs));
  check_range<index_t>("--eval-every", flags.eval_every, 1, kMaxSteps);
}

// ---- the model and the prompts ------------------------------------------------------------------

/// The prompts of the training and the held-out fortunes, each P token ids, in the order
/// Generator(seed) shuffled them into.
struct Prompts {
  std::vector<std::vector<index_t>> train, heldout;
};

/// Fisher–Yates with next_u64() mod (i + 1): the same order on every platform.
template <class T>
void shuffle(std::vector<T>& items, dissect::Generator& generator) {
  for (std::size_t i = items.size(); i > 1; --i) {
    const auto j = static_cast<std::size_t>(generator.next_u64() % i);
    std::swap(items[i - 1], items[j]);
  }
}

Prompts read_prompts(const std::string& text, const dissect::tools::ByteVocab& vocab,
                     index_t prompt_bytes, std::uint64_t seed) {
  Prompts prompts;
  const std::size_t split = text.size() * 9 / 10;  // train_gpt's: the first 90 % trains
  const auto P = static_cast<std::size_t>(prompt_bytes);
  std::size_t start = 0;
  while (start < text.size()) {
    // The fortune [start, end) runs up to the next line that is "%" alone.
    std::size_t end = start;
    while (end < text.size()) {
      const std::size_t newline = std::min(text.find('\n', end), text.size());
      if (std::string_view(text).substr(end, newline - end) == "%") break;
      end = newline + 1;
    }
    end = std::min(end, text.size());
    if (end - start >= P && (end <= split || start >= split)) {
      std::vector<index_t> ids;
      for (std::size_t i = start; i < start + P; ++i) {
        const index_t id = vocab.id_of[static_cast<unsigned char>(text[i])];
        if (id < 0) break;  // a byte the model never saw: not a prompt
        ids.push_back(id);
      }
      if (ids.size() == P) (end <= split ? prompts.train : prompts.heldout).push_back(ids);
    }
    start = end + 2;  // past the "%" line
  }
  dissect::Generator generator(seed);
  shuffle(prompts.train, generator);
  shuffle(prompts.heldout, generator);
  return prompts;
}

// ---- sampling and scoring -----------------------------------------------------------------------

/// N rows of `prompts` (each P ids, row-major) → N continuations of R ids (row-major), sampled at
/// temperature 1 from `model` through a KV cache, kChunk rows at a time, row after row at each
/// position: the draws depend on the seed alone.
std::vector<index_t> sample_continuations(const Model& model, std::span<const index_t> prompts,
                                          index_t P, index_t R, dissect::Generator& generator) {
  const index_t N = static_cast<index_t>(prompts.size()) / P, V = model.config().vocab;
  std::vector<index_t> out(static_cast<std::size_t>(N * R));
  std::vector<index_t> scratch, next;
  const dissect::SamplingOptions temperature_one{};
  for (index_t first = 0; first < N; first += kChunk) {
    const index_t rows = std::min(kChunk, N - first);
    // The last token is only kept: P + R − 1 positions are ever fed.
    auto cache = model.make_kv_cache(rows, P + R - 1);
    auto logits =
        model.forward(dissect::TokenBatch{prompts.subspan(static_cast<std::size_t>(first * P),
                                                          static_cast<std::size_t>(rows * P)),
                                          rows, P},
                      cache);
    next.assign(static_cast<std::size_t>(rows), 0);
    for (index_t r = 0; r < R; ++r) {
      const index_t T = logits.dim(1);
      for (index_t b = 0; b < rows; ++b) {
        const std::span<const float> row(logits.data() + (b * T + T - 1) * V,
                                         static_cast<std::size_t>(V));
        next[static_cast<std::size_t>(b)] =
            dissect::sample_token(row, temperature_one, generator, scratch);
        out[static_cast<std::size_t>((first + b) * R + r)] = next[static_cast<std::size_t>(b)];
      }
      if (r + 1 < R) logits = model.forward(dissect::TokenBatch{next, rows, 1}, cache);
    }
  }
  return out;
}

/// Sequences x·y of P + R ids as a language model reads them: inputs the first P + R − 1 ids,
/// targets the last P + R − 1, and a mask selecting the R targets that are the response.
struct Scored {
  index_t rows = 0, steps = 0;
  std::vector<index_t> inputs, targets;
  dissect::Tensor<float, 2> mask;
};

Scored as_scored(std::span<const index_t> sequences, index_t P, index_t R) {
  const index_t L = P + R, T = L - 1;
  Scored s;
  s.rows = static_cast<index_t>(sequences.size()) / L;
  s.steps = T;
  s.mask = dissect::Tensor<float, 2>(dissect::Shape<2>{s.rows, T});
  for (index_t n = 0; n < s.rows; ++n) {
    for (index_t t = 0; t < T; ++t) {
      s.inputs.push_back(sequences[static_cast<std::size_t>(n * L + t)]);
      s.targets.push_back(sequences[static_cast<std::size_t>(n * L + t + 1)]);
      // Target t is token t + 1 of x·y: a response token from t + 1 = P on.
      s.mask.data()[n * T + t] = t >= P - 1 ? 1.0f : 0.0f;
    }
  }
  return s;
}

/// log π(y|x) of each sequence (P prompt + R response ids, row-major), kChunk at a time.
std::vector<float> response_log_probs(const Model& model, std::span<const index_t> sequences,
                                      index_t P, index_t R) {
  const index_t L = P + R, N = static_cast<index_t>(sequences.size()) / L;
  std::vector<float> out;
  for (index_t first = 0; first < N; first += kChunk) {
    const index_t rows = std::min(kChunk, N - first);
    const Scored s = as_scored(
        sequences.subspan(static_cast<std::size_t>(first * L), static_cast<std::size_t>(rows * L)),
        P, R);
    const auto logits = model.forward(dissect::TokenBatch{s.inputs, s.rows, s.steps});
    const auto lp = dissect::sequence_log_probs(logits, s.targets, s.mask);
    out.insert(out.end(), lp.sequence.data(), lp.sequence.data() + rows);
  }
  return out;
}

index_t count_letter(std::span<const index_t> ids, const dissect::tools::ByteVocab& vocab,
                     char letter) {
  const int lower = std::tolower(static_cast<unsigned char>(letter));
  return std::count_if(ids.begin(), ids.end(), [&](index_t id) {
    return std::tolower(vocab.bytes[static_cast<std::size_t>(id)]) == lower;
  });
}

/// Preference pairs: row i of `chosen` and of `rejected` is x·y_w and x·y_l (P + R ids), with
/// the reference's log-probabilities of the responses.
struct Pairs {
  index_t count = 0;
  std::vector<index_t> chosen, rejected;
  std::vector<float> ref_chosen, ref_rejected;
  index_t drawn = 0;             ///< prompts used, ties included
  double chosen_letters = 0;     ///< mean occurrences of the letter in y_w
  double rejected_letters = 0;   ///< and in y_l
  std::vector<index_t> prompts;  ///< [count, P]: the prompts, for the evaluations' samples
};

/// Draws prompts in order, two reference continuations each, until `wanted` pairs of different
/// letter counts are made. @throws UsageError naming `flag` if the prompts run out.
Pairs make_pairs(const Model& reference, const std::vector<std::vector<index_t>>& prompts,
                 index_t wanted, index_t P, index_t R, const dissect::tools::ByteVocab& vocab,
                 char letter, dissect::Generator& generator, const char* flag, const char* what) {
  Pairs pairs;
  std::size_t next_prompt = 0;
  while (pairs.count < wanted) {
    // Tie rates are about a fifth: a round of a little more than the pairs still missing.
    const index_t round = std::min<index_t>((wanted - pairs.count) * 5 / 4 + 8,
                                            static_cast<index_t>(prompts.size() - next_prompt));
    if (round <= 0) {
      throw UsageError(std::string(flag) + ": " + std::to_string(wanted) + " " + what +
                       " pairs wanted, but the " + std::to_string(prompts.size()) + " " + what +
                       " prompts gave only " + std::to_string(pairs.count) +
                       " whose continuations differ in the letter");
    }
    std::vector<index_t> doubled;  // each prompt twice: [2·round, P]
    for (index_t i = 0; i < round; ++i) {
      const auto& prompt = prompts[next_prompt + static_cast<std::size_t>(i)];
      doubled.insert(doubled.end(), prompt.begin(), prompt.end());
      doubled.insert(doubled.end(), prompt.begin(), prompt.end());
    }
    const auto responses = sample_continuations(reference, doubled, P, R, generator);
    for (index_t i = 0; i < round && pairs.count < wanted; ++i) {
      ++pairs.drawn;
      const auto& prompt = prompts[next_prompt + static_cast<std::size_t>(i)];
      const std::span<const index_t> a(responses.data() + 2 * i * R, static_cast<std::size_t>(R));
      const std::span<const index_t> b(a.data() + R, static_cast<std::size_t>(R));
      const index_t na = count_letter(a, vocab, letter), nb = count_letter(b, vocab, letter);
      if (na == nb) continue;  // no preference
      const auto [w, l] = na < nb ? std::pair(a, b) : std::pair(b, a);
      for (auto* side : {&pairs.chosen, &pairs.rejected}) {
        side->insert(side->end(), prompt.begin(), prompt.end());
      }
      pairs.chosen.insert(pairs.chosen.end(), w.begin(), w.end());
      pairs.rejected.insert(pairs.rejected.end(), l.begin(), l.end());
      pairs.prompts.insert(pairs.prompts.end(), prompt.begin(), prompt.end());
      pairs.chosen_letters += static_cast<double>(std::min(na, nb));
      pairs.rejected_letters += static_cast<double>(std::max(na, nb));
      ++pairs.count;
    }
    next_prompt += static_cast<std::size_t>(round);
  }
  pairs.chosen_letters /= static_cast<double>(pairs.count);
  pairs.rejected_letters /= static_cast<double>(pairs.count);
  pairs.ref_chosen = response_log_probs(reference, pairs.chosen, P, R);
  pairs.ref_rejected = response_log_probs(reference, pairs.rejected, P, R);
  return pairs;
}

// ---- evaluation ---------------------------------------------------------------------------------

struct Metrics {
  double loss = 0, margin = 0, accuracy = 0;
};

Metrics dpo_metrics(std::span<const float> policy_w, std::span<const float> policy_l,
                    std::span<const float> ref_w, std::span<const float> ref_l, double beta) {
  const index_t n = static_cast<index_t>(policy_w.size());
  const auto tensor = [n](std::span<const float> values) {
    return dissect::Tensor<float, 1>(dissect::Shape<1>{n},
                                     std::vector<float>(values.begin(), values.end()));
  };
  const auto result = dissect::dpo_loss(tensor(policy_w), tensor(policy_l), tensor(ref_w),
                                        tensor(ref_l), {.beta = beta});
  return {result.loss, result.reward_margin, result.reward_accuracy};
}

/// One row of the CSV and the figure.
struct Evaluation {
  index_t step = 0;
  double lr = 0;
  Metrics train{}, heldout{};  ///< train: NaN at step 0
  double kl_per_byte = 0, letter_share = 0;
  std::vector<index_t> sample;  ///< the policy's continuation of the first held-out prompt
};

/// log softmax of one row of logits, in double.
void log_softmax_row(const float* x, index_t V, std::vector<double>& out) {
  out.resize(static_cast<std::size_t>(V));
  double max = x[0];
  for (index_t v = 1; v < V; ++v) max = std::max(max, static_cast<double>(x[v]));
  double sum = 0;
  for (index_t v = 0; v < V; ++v) sum += std::exp(static_cast<double>(x[v]) - max);
  const double log_sum = std::log(sum);
  for (index_t v = 0; v < V; ++v) out[static_cast<std::size_t>(v)] = x[v] - max - log_sum;
}

/// The held-out metrics of `policy` (the header says what each is).
Evaluation evaluate(const Model& policy, const Model& reference, const Pairs& heldout,
                    const Flags& flags, const dissect::tools::ByteVocab& vocab) {
  const index_t P = flags.prompt_bytes, R = flags.response_bytes, L = P + R;
  const index_t V = policy.config().vocab;
  Evaluation e;
  const auto policy_w = response_log_probs(policy, heldout.chosen, P, R);
  const auto policy_l = response_log_probs(policy, heldout.rejected, P, R);
  e.heldout = dpo_metrics(policy_w, policy_l, heldout.ref_chosen, heldout.ref_rejected, flags.beta);

  dissect::Generator generator(flags.seed + 3000);
  const auto responses = sample_continuations(policy, heldout.prompts, P, R, generator);
  e.letter_share = static_cast<double>(count_letter(responses, vocab, flags.letter[0])) /
                   static_cast<double>(responses.size());
  e.sample.assign(responses.begin(), responses.begin() + R);

  std::vector<index_t> sequences;
  for (index_t n = 0; n < heldout.count; ++n) {
    const auto prompt = heldout.prompts.begin() + n * P;
    const auto response = responses.begin() + n * R;
    sequences.insert(sequences.end(), prompt, prompt + P);
    sequences.insert(sequences.end(), response, response + R);
  }
  double kl = 0;
  std::vector<double> log_p, log_q;
  for (index_t first = 0; first < heldout.count; first += kChunk) {
    const index_t rows = std::min(kChunk, heldout.count - first);
    const Scored s =
        as_scored(std::span<const index_t>(sequences).subspan(static_cast<std::size_t>(first * L),
                                                              static_cast<std::size_t>(rows * L)),
                  P, R);
    const dissect::TokenBatch tokens{s.inputs, s.rows, s.steps};
    const auto p_logits = policy.forward(tokens), q_logits = reference.forward(tokens);
    for (index_t i = 0; i < s.rows * s.steps; ++i) {
      if (s.mask.data()[i] == 0.0f) continue;
      log_softmax_row(p_logits.data() + i * V, V, log_p);
      log_softmax_row(q_logits.data() + i * V, V, log_q);
      for (std::size_t v = 0; v < log_p.size(); ++v) {
        kl += std::exp(log_p[v]) * (log_p[v] - log_q[v]);
      }
    }
  }
  e.kl_per_byte = kl / static_cast<double>(heldout.count * R);
  return e;
}

// ---- output -------------------------------------------------------------------------------------

std::string printable(std::span<const index_t> ids, const dissect::tools::ByteVocab& vocab) {
  std::string text;
  for (const index_t id : ids) {
    const unsigned char byte = vocab.bytes[static_cast<std::size_t>(id)];
    if (byte == '\n') {
      text += "\\n";
    } else if (byte == '\t') {
      text += "\\t";
    } else if (byte < 0x20 || byte >= 0x7f) {
      // A lone byte of a UTF-8 character (the model samples bytes) would print as garbage.
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", byte);
      text += hex;
    } else {
      text += static_cast<char>(byte);
    }
  }
  return text;
}

void print_evaluation(const Evaluation& e, index_t steps, char letter) {
  std::printf("step %5lld/%lld", static_cast<long long>(e.step), static_cast<long long>(steps));
  if (e.step == 0) {
    std::printf("  %-38s", "(before training)");
  } else {
    std::printf("  train loss %.4f margin %+.4f acc %.3f", e.train.loss, e.train.margin,
                e.train.accuracy);
  }
  std::printf("  held-out loss %.4f margin %+.4f acc %.3f  KL %.5f/byte  '%c' %.2f %%\n",
              e.heldout.loss, e.heldout.margin, e.heldout.accuracy, e.kl_per_byte, letter,
              100 * e.letter_share);
  std::fflush(stdout);
}

std::string csv(const std::vector<Evaluation>& evaluations) {
  std::string out =
      "step,lr,train_loss,train_margin,train_accuracy,heldout_loss,heldout_margin,"
      "heldout_accuracy,kl_per_byte,letter_share\n";
  char line[320];
  for (const Evaluation& e : evaluations) {
    std::snprintf(line, sizeof line, "%lld,%.6e,", static_cast<long long>(e.step), e.lr);
    out += line;
    if (e.step == 0) {
      out += ",,,";
    } else {
      std::snprintf(line, sizeof line, "%.6f,%.6f,%.6f,", e.train.loss, e.train.margin,
                    e.train.accuracy);
      out += line;
    }
    std::snprintf(line, sizeof line, "%.6f,%.6f,%.6f,%.8f,%.6f\n", e.heldout.loss, e.heldout.margin,
                  e.heldout.accuracy, e.kl_per_byte, e.letter_share);
    out += line;
  }
  return out;
}

std::string figure(const std::vector<Evaluation>& evaluations, const Flags& flags,
                   const dissect::TransformerConfig& config) {
  namespace ex = dissect::examples;
  std::vector<double> step, train_step, margin, train_margin, accuracy, train_accuracy, kl, share;
  for (const Evaluation& e : evaluations) {
    step.push_back(static_cast<double>(e.step));
    margin.push_back(e.heldout.margin);
    accuracy.push_back(e.heldout.accuracy);
    kl.push_back(e.kl_per_byte);
    share.push_back(100 * e.letter_share);
    if (e.step == 0) continue;
    train_step.push_back(static_cast<double>(e.step));
    train_margin.push_back(e.train.margin);
    train_accuracy.push_back(e.train.accuracy);
  }
  const std::vector<double> ends = {0, static_cast<double>(flags.steps)};
  const std::vector<double> reference_share = {share.front(), share.front()};
  const std::string letter = "'" + flags.letter + "'";
  const ex::Style held{.label = "held-out pairs", .color = "#1f77b4"};
  const ex::Style train{.label = "training batches", .color = "#ff7f0e", .width = 1, .dash = "4 2"};
  const std::vector<ex::Panel> panels = {
      {.title = "implicit reward margin",
       .xlabel = "step",
       .ylabel = "β·Δ log-ratio (nats)",
       .series = {ex::line(step, margin, held), ex::line(train_step, train_margin, train)},
       .legend_left = true},
      // No legend where the curves run along the top: the colours are the margin panel's.
      {.title = "preference accuracy (margin > 0)",
       .xlabel = "step",
       .ylabel = "fraction of pairs",
       .series = {ex::line(step, accuracy, {.color = held.color}),
                  ex::line(train_step, train_accuracy,
                           {.color = train.color, .width = train.width, .dash = train.dash})}},
      {.title = "KL(πθ ‖ π_ref) per byte, held-out prompts",
       .xlabel = "step",
       .ylabel = "nats per sampled byte",
       .series = {ex::line(step, kl, {.color = "#2ca02c"})}},
      {.title = "share of " + letter + " in sampled continuations",
       .xlabel = "step",
       .ylabel = "% of bytes",
       .series = {ex::line(ends, reference_share,
                           {.label = "reference", .color = "#7f7f7f", .dash = "6 3"}),
                  ex::line(step, share, {.label = "policy", .color = "#d62728"})}}};
  char title[240];
  std::snprintf(title, sizeof title,
                "dpo_fortunes: GPT-2 D %lld, L %lld taught to avoid %s; β %g, %lld pairs, "
                "%lld steps",
                static_cast<long long>(config.d_model), static_cast<long long>(config.n_layers),
                letter.c_str(), flags.beta, static_cast<long long>(flags.pairs),
                static_cast<long long>(flags.steps));
  return ex::svg(panels, 1280, 380, title);
}

// ---- the run ------------------------------------------------------------------------------------

struct Outputs {
  dissect::examples::OutputFile figure, curves;
};

int run(const Flags& flags, Outputs& outputs) {
  namespace ex = dissect::examples;
  dissect::examples::ByteCheckpoint base = dissect::examples::load_byte_checkpoint(
      flags.model, "dpo_fortunes trains train_gpt's byte-level models");
  const dissect::TransformerConfig config = base.model.config();
  const index_t P = flags.prompt_bytes, R = flags.response_bytes, L = P + R;
  if (L - 1 > config.context) {
    throw UsageError("--prompt-bytes " + std::to_string(P) + " + --response-bytes " +
                     std::to_string(R) + " - 1 = " + std::to_string(L - 1) +
                     " positions do not fit the model's context of " +
                     std::to_string(config.context));
  }
  const char letter = flags.letter[0];
  if (base.vocab.id_of[static_cast<unsigned char>(std::tolower(letter))] < 0 &&
      base.vocab.id_of[static_cast<unsigned char>(std::toupper(letter))] < 0) {
    throw UsageError("--letter: the model's vocabulary has no '" + flags.letter + "'");
  }

  ex::Corpus corpus;
  try {
    corpus = ex::read_fortunes(flags.data);
  } catch (const ex::DataMissing& missing) {
    std::cerr << "dpo_fortunes: --data: " << missing.what() << "\n"
              << "The fortunes come with Debian's package: apt-get install " << ex::kFortunesPackage
              << "\n";
    return ex::kExitBadInput;
  } catch (const ex::DataError& error) {
    throw UsageError(std::string("--data: ") + error.what());
  }
  const Prompts prompts = read_prompts(corpus.text, base.vocab, P, flags.seed);

  const Model reference = base.model;  // frozen: only `policy` is ever updated
  Model& policy = base.model;
  std::printf(
      "dpo_fortunes: GPT-2 D %lld, L %lld, H %lld, context %lld, vocabulary %lld: %s parameters, "
      "from %s\n",
      static_cast<long long>(config.d_model), static_cast<long long>(config.n_layers),
      static_cast<long long>(config.n_heads), static_cast<long long>(config.context),
      static_cast<long long>(config.vocab), dissect::format_count(policy.parameter_count()).c_str(),
      flags.model.c_str());
  std::printf("  prompts: the first %lld bytes of %zu training and %zu held-out fortunes of %s\n",
              static_cast<long long>(P), prompts.train.size(), prompts.heldout.size(),
              flags.data.c_str());
  std::fflush(stdout);

  const auto start = ex::Clock::now();
  dissect::Generator train_draws(flags.seed + 1), heldout_draws(flags.seed + 2);
  const Pairs train = make_pairs(reference, prompts.train, flags.pairs, P, R, base.vocab, letter,
                                 train_draws, "--pairs", "training");
  const Pairs heldout = make_pairs(reference, prompts.heldout, flags.eval_pairs, P, R, base.vocab,
                                   letter, heldout_draws, "--eval-pairs", "held-out");
  std::printf(
      "  pairs: 2 continuations of %lld bytes per prompt from the reference (temperature 1), the "
      "one with fewer '%c' chosen, ties dropped: %lld training pairs from %lld prompts, %lld "
      "held-out from %lld; '%c' per continuation: chosen %.2f, rejected %.2f (training) [%.1fs]\n",
      static_cast<long long>(R), letter, static_cast<long long>(train.count),
      static_cast<long long>(train.drawn), static_cast<long long>(heldout.count),
      static_cast<long long>(heldout.drawn), letter, train.chosen_letters, train.rejected_letters,
      ex::seconds_since(start));
  const index_t warmup = ex::default_warmup(flags.steps);
  std::printf(
      "  DPO: beta %g, %lld steps of %lld pairs, AdamW betas (0.9, 0.999), no weight decay, lr "
      "%g (warm-up %lld steps, cosine to lr/10); seed %llu\n",
      flags.beta, static_cast<long long>(flags.steps), static_cast<long long>(flags.batch),
      flags.lr, static_cast<long long>(warmup), static_cast<unsigned long long>(flags.seed));
  std::fflush(stdout);

  std::vector<Evaluation> evaluations;
  evaluations.push_back(evaluate(policy, reference, heldout, flags, base.vocab));
  print_evaluation(evaluations.back(), flags.steps, letter);

  auto optimizer = dissect::AdamW<float>(
      policy, {.lr = flags.lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0});
  dissect::Generator batch_draws(flags.seed + 1000);
  std::vector<index_t> order(static_cast<std::size_t>(train.count));
  std::size_t cursor = order.size();  // an epoch's order is drawn when the last one runs out
  const index_t B = flags.batch;
  Model::Cache cache;
  std::vector<index_t> sequences;
  Metrics interval{};
  index_t interval_steps = 0;
  double training_seconds = 0;
  for (index_t step = 0; step < flags.steps; ++step) {
    const auto step_start = ex::Clock::now();
    // Rows 0 … B − 1 are the batch's x·y_w, rows B … 2B − 1 its x·y_l.
    std::vector<std::size_t> rows;
    for (index_t b = 0; b < B; ++b) {
      if (cursor == order.size()) {
        for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<index_t>(i);
        shuffle(order, batch_draws);
        cursor = 0;
      }
      rows.push_back(static_cast<std::size_t>(order[cursor++]));
    }
    sequences.clear();
    std::vector<float> ref_w, ref_l;
    for (const auto* side : {&train.chosen, &train.rejected}) {
      for (const std::size_t row : rows) {
        const auto first = side->begin() + static_cast<std::ptrdiff_t>(row) * L;
        sequences.insert(sequences.end(), first, first + L);
      }
    }
    for (const std::size_t row : rows) {
      ref_w.push_back(train.ref_chosen[row]);
      ref_l.push_back(train.ref_rejected[row]);
    }
    const Scored s = as_scored(sequences, P, R);
    const dissect::TokenBatch tokens{s.inputs, s.rows, s.steps};
    const double lr = ex::learning_rate(flags.lr, warmup, flags.steps, step);
    optimizer.set_lr(lr);
    policy.zero_grad();
    const auto logits = policy.forward(tokens, cache);
    const auto lp = dissect::sequence_log_probs(logits, s.targets, s.mask);
    const dissect::Shape<1> pairs_shape{B};
    const dissect::Tensor<float, 1> policy_w(
        pairs_shape, std::vector<float>(lp.sequence.data(), lp.sequence.data() + B));
    const dissect::Tensor<float, 1> policy_l(
        pairs_shape, std::vector<float>(lp.sequence.data() + B, lp.sequence.data() + 2 * B));
    const auto result =
        dissect::dpo_loss(policy_w, policy_l, dissect::Tensor<float, 1>(pairs_shape, ref_w),
                          dissect::Tensor<float, 1>(pairs_shape, ref_l), {.beta = flags.beta});
    if (!std::isfinite(result.loss)) {
      throw std::runtime_error("DPO diverged: the loss of step " + std::to_string(step + 1) +
                               " is " + std::to_string(result.loss) + " (try a lower --lr)");
    }
    dissect::Tensor<float, 1> dsequence(dissect::Shape<1>{2 * B});
    std::copy_n(result.dpolicy_chosen.data(), B, dsequence.data());
    std::copy_n(result.dpolicy_rejected.data(), B, dsequence.data() + B);
    const auto dlogits = dissect::sequence_log_probs_backward(logits, s.targets, s.mask, dsequence);
    policy.backward(tokens, cache, dlogits);
    optimizer.step();
    training_seconds += ex::seconds_since(step_start);
    interval.loss += result.loss;
    interval.margin += result.reward_margin;
    interval.accuracy += result.reward_accuracy;
    ++interval_steps;

    const index_t done = step + 1;
    if (done % flags.eval_every == 0 || done == flags.steps) {
      Evaluation e = evaluate(policy, reference, heldout, flags, base.vocab);
      e.step = done;
      e.lr = lr;
      const auto n = static_cast<double>(interval_steps);
      e.train = {interval.loss / n, interval.margin / n, interval.accuracy / n};
      interval = {};
      interval_steps = 0;
      print_evaluation(e, flags.steps, letter);
      evaluations.push_back(std::move(e));
    }
  }

  const Evaluation &first = evaluations.front(), &last = evaluations.back();
  std::printf(
      "\nheld-out, before → after %lld steps (%.1f ms a step, evaluations excluded; %.0fs in "
      "all):\n"
      "  reward margin %+.4f → %+.4f   preference accuracy %.3f → %.3f   DPO loss %.4f → %.4f\n"
      "  KL(policy ‖ reference) %.5f nats per sampled byte (%.4f per %lld-byte continuation)\n"
      "  '%c' in sampled continuations: %.2f %% (reference) → %.2f %% (policy)\n",
      static_cast<long long>(flags.steps),
      1e3 * training_seconds / static_cast<double>(flags.steps), ex::seconds_since(start),
      first.heldout.margin, last.heldout.margin, first.heldout.accuracy, last.heldout.accuracy,
      first.heldout.loss, last.heldout.loss, last.kl_per_byte,
      last.kl_per_byte * static_cast<double>(R), static_cast<long long>(R), letter,
      100 * first.letter_share, 100 * last.letter_share);
  const std::span<const index_t> prompt(heldout.prompts.data(), static_cast<std::size_t>(P));
  std::printf("first held-out prompt \"%s\"\n  reference: \"%s\"\n  policy:    \"%s\"\n",
              printable(prompt, base.vocab).c_str(), printable(first.sample, base.vocab).c_str(),
              printable(last.sample, base.vocab).c_str());

  if (outputs.curves.enabled()) {
    outputs.curves.write(csv(evaluations));
    std::cout << "wrote " << outputs.curves.path() << "\n";
  }
  if (outputs.figure.enabled()) {
    outputs.figure.write(figure(evaluations, flags, config));
    std::cout << "wrote " << outputs.figure.path() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ex = dissect::examples;
  CLI::App app("dpo_fortunes — DPO on a train_gpt checkpoint: continuations without a letter",
               "dpo_fortunes");
  Flags flags;
  add_flags(app, flags);
  if (const auto status = ex::parse_command_line(app, argc, argv)) return *status;
  return ex::run_program<dissect::Error>("dpo_fortunes", [&] {
    validate(flags);
    Outputs outputs{ex::OutputFile("--svg", flags.svg), ex::OutputFile("--curves", flags.curves)};
    return run(flags, outputs);
  });
}
