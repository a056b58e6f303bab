// dissect/training/alignment_loss.hpp — the losses of preference and reinforcement fine-tuning:
// DPO, PPO's clipped surrogate (with value loss and entropy bonus) and GRPO, each with its
// backward.
//
// All three start from a causal LM's logits [N, T, V] over N sequences, the token each position
// chose (targets [N, T]) and a 0/1 mask [N, T] selecting the response tokens: the prompt and the
// padding are masked out and never read. sequence_log_probs turns these into per-token and
// per-sequence log-probabilities; the losses return their value, their diagnostics and the
// gradient with respect to the policy's log-probabilities (and, for PPO and GRPO, the logits).
// Everything computed from a reference or an old policy is a constant, as the papers detach it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/tensor.hpp"
#include "dissect/training/loss.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Log-probabilities of the chosen tokens.
template <class Scalar>
struct TokenLogProbs {
  /// [N, T]: log softmax(logits[n, t])[targets[n, t]] where mask[n, t] = 1, 0 where it is 0.
  Tensor<Scalar, 2> token;
  /// [N]: Σ_t mask[n, t]·token[n, t], the log-probability of the response (DPO's log π(y|x)).
  Tensor<Scalar, 1> sequence;
};

/// logits: [N, T, V], targets: N·T ids (row-major [N, T]), mask: [N, T] of 0 and 1 → the
/// per-token and per-sequence log-probabilities. A masked-out position is not read at all: its
/// target may be padding (−100, say) and its logits NaN.
/// @throws ShapeError if targets or mask do not fit the logits, or if a row of the mask selects
///         no token (an empty response, whose log-probability is 0 under every model); Error if
///         a mask value is neither 0 nor 1 or a selected target is outside [0, V).
template <TensorLike L, class Scalar = scalar_of<L>>
requires(rank_of<L> == 3)
    TokenLogProbs<Scalar> sequence_log_probs(const L& logits, std::span<const index_t> targets,
                                             std::type_identity_t<ConstTensorView<Scalar, 2>> mask);

/// dtoken: [N, T], the gradient of a loss with respect to TokenLogProbs::token → dlogits
/// [N, T, V] = mask·dtoken[n, t]·(onehot(target) − softmax(logits[n, t])); 0 where masked out.
/// @throws as sequence_log_probs, and ShapeError if dtoken is not [N, T].
template <TensorLike L, class Scalar = scalar_of<L>>
requires(rank_of<L> == 3) Tensor<Scalar, 3> token_log_probs_backward(
    const L& logits, std::span<const index_t> targets,
    std::type_identity_t<ConstTensorView<Scalar, 2>> mask,
    std::type_identity_t<ConstTensorView<Scalar, 2>> dtoken);

/// dsequence: [N], the gradient with respect to TokenLogProbs::sequence → dlogits [N, T, V]
/// (token_log_probs_backward with dtoken[n, t] = dsequence[n]).
/// @throws as sequence_log_probs, and ShapeError if dsequence is not [N].
template <TensorLike L, class Scalar = scalar_of<L>>
requires(rank_of<L> == 3) Tensor<Scalar, 3> sequence_log_probs_backward(
    const L& logits, std::span<const index_t> targets,
    std::type_identity_t<ConstTensorView<Scalar, 2>> mask,
    std::type_identity_t<ConstTensorView<Scalar, 1>> dsequence);

// ---- DPO ----------------------------------------------------------------------------------------

struct DpoOptions {
  /// β of Rafailov et al. (2023), eq. 7: how far the policy may move from the reference.
  double beta = 0.1;
};

template <class Scalar>
struct DpoResult {
  /// mean over pairs of −log σ(β·[(log πθ(y_w) − log π_ref(y_w)) − (log πθ(y_l) − log
  /// π_ref(y_l))]).
  Scalar loss = 0;
  /// [P]: the implicit rewards β·(log πθ(y) − log π_ref(y)) of the chosen and rejected responses.
  Tensor<Scalar, 1> chosen_rewards, rejected_rewards;
  /// mean(chosen − rejected reward), and the fraction of pairs whose chosen reward is larger.
  Scalar reward_margin = 0, reward_accuracy = 0;
  /// [P]: d loss / d log πθ(y_w) and d loss / d log πθ(y_l); the reference gets none.
  Tensor<Scalar, 1> dpolicy_chosen, dpolicy_rejected;
};

/// Direct Preference Optimization (Rafailov et al. 2023, eq. 7) over P pairs, from the sequence
/// log-probabilities [P] of the chosen (w) and rejected (l) responses under the policy and the
/// reference. sequence_log_probs_backward carries dpolicy_* on to the policy's logits.
/// @throws ShapeError if the four are not all [P] or P = 0; ConfigError if β ≤ 0 or not finite.
template <TensorLike P, class Scalar = scalar_of<P>>
requires(rank_of<P> == 1) DpoResult<Scalar> dpo_loss(
    const P& policy_chosen, std::type_identity_t<ConstTensorView<Scalar, 1>> policy_rejected,
    std::type_identity_t<ConstTensorView<Scalar, 1>> reference_chosen,
    std::type_identity_t<ConstTensorView<Scalar, 1>> reference_rejected,
    const DpoOptions& options = {});

// ---- PPO ----------------------------------------------------------------------------------------

struct PpoOptions {
  /// ε of the clipped ratio, in (0, 1) (Schulman et al. 2017, eq. 7).
  double clip_eps = 0.2;
  /// 0: value loss ½(V − R)². > 0: the PPO2 convention of OpenAI's baselines (ppo2/model.py),
  /// ½·max((V − R)², (V_clip − R)²) with V_clip = V_old + clip(V − V_old, −value_clip, value_clip).
  double value_clip = 0;
  /// c₁ and c₂ of Schulman et al., eq. 9 (written there as a gain; here loss = −gain).
  double value_coef = 0.5;
  double entropy_coef = 0.01;
};

/// The per-token inputs of a PPO step besides the logits, each [N, T] (read where mask = 1).
/// Views, not copies: the tensors they show must outlive the ppo_loss call (a braced batch of
/// tensors written in the call itself is safe).
template <class Scalar>
struct PpoBatch {
  ConstTensorView<Scalar, 2> old_log_probs;  // log π_old(a_t) of the policy that sampled
  ConstTensorView<Scalar, 2> advantages;     // Â_t (e.g. GAE), constants
  ConstTensorView<Scalar, 2> values;         // V(s_t) of the value head being trained
  ConstTensorView<Scalar, 2> returns;        // R_t, the value head's targets
  ConstTensorView<Scalar, 2> old_values;     // V_old(s_t); read only when value_clip > 0
};

template <class Scalar>
struct PpoResult {
  /// loss = policy_loss + value_coef·value_loss − entropy_coef·entropy, each a masked mean over
  /// the M selected tokens of the batch (Σ mask·x / Σ mask).
  Scalar loss = 0, policy_loss = 0, value_loss = 0, entropy = 0;
  /// Fraction of the selected tokens with |r − 1| > ε (baselines' clipfrac).
  Scalar clip_fraction = 0;
  Tensor<Scalar, 2> log_probs;   // [N, T]: log πθ(a_t), 0 where masked out
  Tensor<Scalar, 2> dlog_probs;  // [N, T]: d loss / d log πθ(a_t) of the policy term
  Tensor<Scalar, 2> dvalues;     // [N, T]: d loss / d V(s_t)
  Tensor<Scalar, 3> dlogits;     // [N, T, V]: through log πθ and the entropy
};

/// PPO's loss (Schulman et al. 2017, eq. 9, negated): per selected token, with
/// r = exp(log πθ − log π_old), the policy term −min(r·Â, clip(r, 1 − ε, 1 + ε)·Â), the value
/// term and the entropy H = −Σ_v p log p of softmax(logits[n, t]).
/// @throws as sequence_log_probs; ShapeError if a PpoBatch tensor is not [N, T] or N = 0;
///         ConfigError if clip_eps ∉ (0, 1), value_clip < 0, or a coefficient is negative or not
///         finite.
template <TensorLike L, class Scalar = scalar_of<L>>
requires(rank_of<L> ==
         3) PpoResult<Scalar> ppo_loss(const L& logits, std::span<const index_t> targets,
                                       std::type_identity_t<ConstTensorView<Scalar, 2>> mask,
                                       const std::type_identity_t<PpoBatch<Scalar>>& batch,
                                       const PpoOptions& options = {});

// ---- GRPO ---------------------------------------------------------------------------------------

struct GrpoOptions {
  /// G: completions per prompt; the batch holds N / G groups of G consecutive sequences.
  index_t group_size = 0;
  /// ε of the clipped ratio, in (0, 1).
  double clip_eps = 0.2;
  /// β, the KL coefficient (DeepSeekMath used 0.04).
  double beta = 0.04;
  /// eps in (r − mean) / (std + eps): keeps a group of equal rewards (std 0) at advantage 0.
  double std_eps = 1e-4;
};

template <class Scalar>
struct GrpoResult {
  /// loss = policy_loss + β·kl, each (1/N)·Σ_i (1/|o_i|)·Σ_t over sequence i's selected tokens.
  Scalar loss = 0, policy_loss = 0, kl = 0;
  Scalar clip_fraction = 0;      // as PPO's, over all selected tokens
  Tensor<Scalar, 1> advantages;  // [N]: Â_i, one per sequence (outcome supervision)
  Tensor<Scalar, 2> log_probs;   // [N, T]
  Tensor<Scalar, 2> dlog_probs;  // [N, T]: d loss / d log πθ
  Tensor<Scalar, 3> dlogits;     // [N, T, V]
};

/// rewards: [N] in groups of G consecutive sequences → Â_i = (r_i − mean_g) / (std_g + eps), the
/// standard deviation unbiased (divided by G − 1, as torch.std), as in Hugging Face TRL's
/// GRPOTrainer; DeepSeekMath (§4.1.2) says "normalized" without naming the estimator.
/// @throws ConfigError if G < 2 or G does not divide N, or std_eps < 0 or not finite.
template <TensorLike R, class Scalar = scalar_of<R>>
requires(rank_of<R> == 1) Tensor<Scalar, 1> grpo_advantages(const R& rewards, index_t group_size,
                                                            double std_eps = 1e-4);

/// GRPO (Shao et al. 2024, DeepSeekMath, eq. 3, negated, outcome supervision): per selected
/// token, with r = exp(log πθ − log π_old) and Â the sequence's grpo_advantages,
///   ℓ_t = −min(r·Â, clip(r, 1 − ε, 1 + ε)·Â) + β·(π_ref/πθ − log(π_ref/πθ) − 1)   (eq. 4: k3),
/// averaged over the sequence's own tokens, then over the N sequences (eq. 3's 1/G·Σ 1/|o_i|;
/// over several groups the mean of the groups' means, since every group has G sequences).
/// old_log_probs and ref_log_probs: [N, T]; rewards: [N].
/// @throws as sequence_log_probs and grpo_advantages; ShapeError if old_log_probs,
///         ref_log_probs or rewards do not fit; ConfigError if clip_eps ∉ (0, 1) or β < 0 or not
///         finite.
template <TensorLike L, class Scalar = scalar_of<L>>
requires(rank_of<L> == 3) GrpoResult<Scalar> grpo_loss(
    const L& logits, std::span<const index_t> targets,
    std::type_identity_t<ConstTensorView<Scalar, 2>> mask,
    std::type_identity_t<ConstTensorView<Scalar, 2>> old_log_probs,
    std::type_identity_t<ConstTensorView<Scalar, 2>> ref_log_probs,
    std::type_identity_t<ConstTensorView<Scalar, 1>> rewards, const GrpoOptions& options);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// Checks what every function of this header reads: targets and mask fit logits [N, T, V], the
/// mask holds 0 and 1 and selects at least one token per row, and every selected target lies in
/// [0, V). Returns the tokens each row selects.
template <class Scalar>
std::vector<index_t> check_responses(const char* op, const Shape<3>& logits_shape,
                                     std::span<const index_t> targets,
                                     ConstTensorView<Scalar, 2> mask) {
  const index_t rows = logits_shape[0], steps = logits_shape[1], vocab = logits_shape[2];
  if (static_cast<index_t>(targets.size()) != checked_mul(rows, steps, op)) {
    throw ShapeError(concat(op, ": ", targets.size(), " targets for logits ",
                            format_shape(logits_shape), " (N·T = ", rows * steps, " expected)"));
  }
  if (mask.shape() != Shape<2>{rows, steps}) {
    throw ShapeError(concat(op, ": mask has shape ", format_shape(mask.shape()), " but logits ",
                            format_shape(logits_shape), " need [N, T] = [", rows, ", ", steps,
                            "]"));
  }
  std::vector<index_t> selected(static_cast<std::size_t>(rows), 0);
  for (index_t n = 0; n < rows; ++n) {
    for (index_t t = 0; t < steps; ++t) {
      const Scalar m = mask.data()[n * steps + t];
      if (m != Scalar(0) && m != Scalar(1)) {
        throw Error(concat(op, ": mask[", n, ", ", t, "] = ", m, " is neither 0 nor 1"));
      }
      if (m == Scalar(0)) continue;
      const index_t target = targets[static_cast<std::size_t>(n * steps + t)];
      if (target < 0 || target >= vocab) {
        throw Error(concat(op, ": target ", target, " at [", n, ", ", t, "] is outside [0, ", vocab,
                           ") (logits: ", format_shape(logits_shape), ")"));
      }
      ++selected[static_cast<std::size_t>(n)];
    }
    if (selected[static_cast<std::size_t>(n)] == 0) {
      // A sum over no tokens is 0 for every model: DPO would compare nothing, GRPO divide by 0.
      throw ShapeError(concat(op, ": row ", n, " of the mask ", format_shape(mask.shape()),
                              " selects no token (an empty response)"));
    }
  }
  return selected;
}

template <std::size_t Rank, class Scalar>
void check_input_shape(const char* op, const char* name, ConstTensorView<Scalar, Rank> x,
                       const Shape<Rank>& expected, const char* expected_text) {
  if (x.shape() != expected) {
    throw ShapeError(concat(op, ": ", name, " has shape ", format_shape(x.shape()), " but ",
                            expected_text, " is ", format_shape(expected)));
  }
}

inline void check_clip_eps(const char* op, double eps) {
  if (!(eps > 0 && eps < 1)) {
    throw ConfigError(concat(op, ": clip_eps must be in (0, 1) (got ", eps, ")"));
  }
}

inline void check_coefficient(const char* op, const char* name, double value) {
  if (!(value >= 0) || !std::isfinite(value)) {
    throw ConfigError(concat(op, ": ", name, " must be finite and >= 0 (got ", value, ")"));
  }
}

/// max and log Σ exp(x − max) of one row of logits: log softmax(x)[c] = (x[c] − max) − log_sum,
/// loss.hpp's shift and order of operations.
template <class Scalar>
struct LogSumExp {
  Scalar max, log_sum;
};

template <class Scalar>
LogSumExp<Scalar> log_sum_exp(const Scalar* x, index_t vocab) {
  const Scalar max = row_max(x, vocab);
  Scalar sum = 0;
  for (index_t c = 0; c < vocab; ++c) sum += std::exp(x[c] - max);
  return {max, std::log(sum)};
}

/// Entropy −Σ p·log p of softmax(x), accumulated in double.
template <class Scalar>
double row_entropy(const Scalar* x, index_t vocab, LogSumExp<Scalar> lse) {
  double entropy = 0;
  for (index_t c = 0; c < vocab; ++c) {
    const double log_p = static_cast<double>((x[c] - lse.max) - lse.log_sum);
    entropy -= std::exp(log_p) * log_p;
  }
  return entropy;
}

/// d[c] = g_token·(δ(c, target) − p_c) + g_entropy·(−p_c·(log p_c + H)): the gradient of
/// g_token·log p_target + g_entropy·H with respect to the logits x (dH/dx_c = −p_c(log p_c + H)).
template <class Scalar>
void write_row_gradient(const Scalar* x, index_t vocab, LogSumExp<Scalar> lse, index_t target,
                        double g_token, double g_entropy, double entropy, Scalar* d) {
  for (index_t c = 0; c < vocab; ++c) {
    const double log_p = static_cast<double>((x[c] - lse.max) - lse.log_sum);
    const double p = std::exp(log_p);
    d[c] = static_cast<Scalar>(-g_token * p - g_entropy * p * (log_p + entropy));
  }
  d[target] = static_cast<Scalar>(static_cast<double>(d[target]) + g_token);
}

/// Per-token log-probabilities of the selected targets (0 elsewhere), without checks.
template <class Scalar>
Tensor<Scalar, 2> token_log_probs_unchecked(ConstTensorView<Scalar, 3> logits,
                                            std::span<const index_t> targets,
                                            ConstTensorView<Scalar, 2> mask) {
  const index_t rows = logits.dim(0), steps = logits.dim(1), vocab = logits.dim(2);
  Tensor<Scalar, 2> token({rows, steps});  // zero-filled: masked-out positions stay 0
  for (index_t i = 0; i < rows * steps; ++i) {
    if (mask.data()[i] == Scalar(0)) continue;
    const Scalar* x = logits.data() + i * vocab;
    const auto lse = log_sum_exp(x, vocab);
    token.data()[i] = (x[targets[static_cast<std::size_t>(i)]] - lse.max) - lse.log_sum;
  }
  return token;
}

/// The clipped surrogate of one token, −min(r·A, clip(r, 1 − ε, 1 + ε)·A), and its derivative
/// with respect to log π (r = exp(log π − log π_old), so dr/dlog π = r). Inside the clip range
/// the two terms are equal and both carry r's gradient (torch.min splits it between them, torch.
/// clamp passes it); outside only the unclipped term does, when it is the smaller. There the two
/// tie only if A = 0, where the derivative is 0 whichever term is taken.
struct Surrogate {
  double loss, dlog_prob;
  bool clipped;  // |r − 1| > ε
};

inline Surrogate clipped_surrogate(double log_prob, double old_log_prob, double advantage,
                                   double eps) {
  const double ratio = std::exp(log_prob - old_log_prob);
  if (std::isnan(ratio * advantage)) {
    // NaN in, NaN out (the loss and the gradient both), as torch would propagate it.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    return {nan, nan, false};
  }
  const double clipped_ratio = std::min(std::max(ratio, 1 - eps), 1 + eps);
  const double unclipped = ratio * advantage, clipped = clipped_ratio * advantage;
  const bool inside = ratio >= 1 - eps && ratio <= 1 + eps;
  const double gain_derivative = inside || unclipped < clipped ? advantage * ratio : 0.0;
  return {-std::min(unclipped, clipped), -gain_derivative, std::abs(ratio - 1) > eps};
}

}  // namespace detail

template <TensorLike L, class Scalar>
requires(rank_of<L> == 3) TokenLogProbs<Scalar> sequence_log_probs(
    const L& logits, std::span<const index_t> targets,
    std::type_identity_t<ConstTensorView<Scalar, 2>> mask) {
  detail::check_responses("sequence_log_probs", logits.shape(), targets, mask);
  TokenLogProbs<Scalar> out;
  out.token = detail::token_log_probs_unchecked<Scalar>(const_view(logits), targets, mask);
  const index_t rows = logits.dim(0), steps = logits.dim(1);
  out.sequence = Tensor<Scalar, 1>({rows});
  for (index_t n = 0; n < rows; ++n) {
    double sum = 0;  // in double: a response of thousands of tokens sums thousands of terms
    for (index_t t = 0; t < steps; ++t) sum += static_cast<double>(out.token.data()[n * steps + t]);
    out.sequence.data()[n] = static_cast<Scalar>(sum);
  }
  return out;
}

namespace detail {
/// dlogits [N, T, V] of Σ g(n, t)·token[n, t] over the selected tokens, g(n, t) read by `grad`;
/// checks the responses first, under `op`'s name.
template <class Scalar, class Grad>
Tensor<Scalar, 3> log_probs_backward(const char* op, ConstTensorView<Scalar, 3> logits,
                                     std::span<const index_t> targets,
                                     ConstTensorView<Scalar, 2> mask, Grad&& grad) {
  check_responses(op, logits.shape(), targets, mask);
  const index_t rows = logits.dim(0), steps = logits.dim(1), vocab = logits.dim(2);
  Tensor<Scalar, 3> dlogits(logits.shape());  // zero-filled: masked-out rows get no gradient
  for (index_t n = 0; n < rows; ++n) {
    for (index_t t = 0; t < steps; ++t) {
      const index_t i = n * steps + t;
      if (mask.data()[i] == Scalar(0)) continue;
      const Scalar* x = logits.data() + i * vocab;
      write_row_gradient(x, vocab, log_sum_exp(x, vocab), targets[static_cast<std::size_t>(i)],
                         static_cast<double>(grad(n, t)), 0.0, 0.0, dlogits.data() + i * vocab);
    }
  }
  return dlogits;
}
}  // namespace detail

template <TensorLike L, class Scalar>
requires(rank_of<L> == 3) Tensor<Scalar, 3> token_log_probs_backward(
    const L& logits, std::span<const index_t> targets,
    std::type_identity_t<ConstTensorView<Scalar, 2>> mask,
    std::type_identity_t<ConstTensorView<Scalar, 2>> dtoken) {
  const char* op = "token_log_probs_backward";
  detail::check_input_shape<2, Scalar>(op, "dtoken", dtoken, Shape<2>{logits.dim(0), logits.dim(1)},
                                       "[N, T] of the logits");
  return detail::log_probs_backward<Scalar>(
      op, const_view(logits), targets, mask,
      [&](index_t n, index_t t) { return dtoken.data()[n * dtoken.dim(1) + t]; });
}

template <TensorLike L, class Scalar>
requires(rank_of<L> == 3) Tensor<Scalar, 3> sequence_log_probs_backward(
    const L& logits, std::span<const index_t> targets,
    std::type_identity_t<ConstTensorView<Scalar, 2>> mask,
    std::type_identity_t<ConstTensorView<Scalar, 1>> dsequence) {
  const char* op = "sequence_log_probs_backward";
  detail::check_input_shape<1, Scalar>(op, "dsequence", dsequence, Shape<1>{logits.dim(0)},
                                       "[N] of the logits");
  return detail::log_probs_backward<Scalar>(
      op, const_view(logits), targets, mask,
      [&](index_t n, index_t) { return dsequence.data()[n]; });
}

template <TensorLike P, class Scalar>
requires(rank_of<P> == 1) DpoResult<Scalar> dpo_loss(
    const P& policy_chosen, std::type_identity_t<ConstTensorView<Scalar, 1>> policy_rejected,
    std::type_identity_t<ConstTensorView<Scalar, 1>> reference_chosen,
    std::type_identity_t<ConstTensorView<Scalar, 1>> reference_rejected,
    const DpoOptions& options) {
  const char* op = "dpo_loss";
  const double beta = options.beta;
  if (!(beta > 0) || !std::isfinite(beta)) {
    throw ConfigError(concat(op, ": beta must be finite and > 0 (got ", beta, ")"));
  }
  const index_t pairs = policy_chosen.dim(0);
  if (pairs == 0) throw ShapeError(concat(op, ": no pairs (policy_chosen: [0])"));
  const Shape<1> expected{pairs};
  detail::check_input_shape<1, Scalar>(op, "policy_rejected", policy_rejected, expected,
                                       "policy_chosen");
  detail::check_input_shape<1, Scalar>(op, "reference_chosen", reference_chosen, expected,
                                       "policy_chosen");
  detail::check_input_shape<1, Scalar>(op, "reference_rejected", reference_rejected, expected,
                                       "policy_chosen");
  DpoResult<Scalar> out;
  out.chosen_rewards = Tensor<Scalar, 1>(expected);
  out.rejected_rewards = Tensor<Scalar, 1>(expected);
  out.dpolicy_chosen = Tensor<Scalar, 1>(expected);
  out.dpolicy_rejected = Tensor<Scalar, 1>(expected);
  double loss = 0, margin = 0, correct = 0;
  for (index_t i = 0; i < pairs; ++i) {
    // Rafailov et al. (2023), eq. 7; the implicit reward of §5 is β·log(πθ/π_ref).
    const double chosen = beta * (static_cast<double>(policy_chosen.data()[i]) -
                                  static_cast<double>(reference_chosen.data()[i]));
    const double rejected = beta * (static_cast<double>(policy_rejected.data()[i]) -
                                    static_cast<double>(reference_rejected.data()[i]));
    const double z = chosen - rejected;
    // −log σ(z) = softplus(−z), written so that exp never overflows: log1p(e^{−|z|}) + max(−z, 0).
    loss += std::log1p(std::exp(-std::abs(z))) + std::max(-z, 0.0);
    // d(−log σ(z))/dz = −σ(−z); σ(−z) from e^{−|z|} for the same reason.
    const double e = std::exp(-std::abs(z));
    const double sigma_minus_z = z >= 0 ? e / (1 + e) : 1 / (1 + e);
    const double dz = -sigma_minus_z / static_cast<double>(pairs);
    out.dpolicy_chosen.data()[i] = static_cast<Scalar>(beta * dz);
    out.dpolicy_rejected.data()[i] = static_cast<Scalar>(-beta * dz);
    out.chosen_rewards.data()[i] = static_cast<Scalar>(chosen);
    out.rejected_rewards.data()[i] = static_cast<Scalar>(rejected);
    margin += z;
    correct += chosen > rejected ? 1 : 0;
  }
  out.loss = static_cast<Scalar>(loss / static_cast<double>(pairs));
  out.reward_margin = static_cast<Scalar>(margin / static_cast<double>(pairs));
  out.reward_accuracy = static_cast<Scalar>(correct / static_cast<double>(pairs));
  return out;
}

template <TensorLike L, class Scalar>
requires(rank_of<L> ==
         3) PpoResult<Scalar> ppo_loss(const L& logits, std::span<const index_t> targets,
                                       std::type_identity_t<ConstTensorView<Scalar, 2>> mask,
                                       const std::type_identity_t<PpoBatch<Scalar>>& batch,
                                       const PpoOptions& options) {
  const char* op = "ppo_loss";
  detail::check_clip_eps(op, options.clip_eps);
  detail::check_coefficient(op, "value_clip", options.value_clip);
  detail::check_coefficient(op, "value_coef", options.value_coef);
  detail::check_coefficient(op, "entropy_coef", options.entropy_coef);
  const index_t rows = logits.dim(0), steps = logits.dim(1), vocab = logits.dim(2);
  if (rows == 0)
    throw ShapeError(concat(op, ": no sequences (logits: ", format_shape(logits.shape()), ")"));
  const auto selected = detail::check_responses(op, logits.shape(), targets, mask);
  const Shape<2> expected{rows, steps};
  const char* text = "[N, T] of the logits";
  detail::check_input_shape<2, Scalar>(op, "old_log_probs", batch.old_log_probs, expected, text);
  detail::check_input_shape<2, Scalar>(op, "advantages", batch.advantages, expected, text);
  detail::check_input_shape<2, Scalar>(op, "values", batch.values, expected, text);
  detail::check_input_shape<2, Scalar>(op, "returns", batch.returns, expected, text);
  const bool clip_values = options.value_clip > 0;
  if (clip_values) {
    detail::check_input_shape<2, Scalar>(op, "old_values", batch.old_values, expected, text);
  }
  double tokens = 0;
  for (const index_t count : selected) tokens += static_cast<double>(count);

  PpoResult<Scalar> out;
  out.log_probs = Tensor<Scalar, 2>(expected);
  out.dlog_probs = Tensor<Scalar, 2>(expected);
  out.dvalues = Tensor<Scalar, 2>(expected);
  out.dlogits = Tensor<Scalar, 3>(logits.shape());
  double policy = 0, value = 0, entropy = 0, clipped = 0;
  for (index_t i = 0; i < rows * steps; ++i) {
    if (mask.data()[i] == Scalar(0)) continue;
    const Scalar* x = logits.data() + i * vocab;
    const index_t target = targets[static_cast<std::size_t>(i)];
    const auto lse = detail::log_sum_exp(x, vocab);
    const Scalar log_prob = (x[target] - lse.max) - lse.log_sum;
    out.log_probs.data()[i] = log_prob;
    // Schulman et al. (2017), eq. 7: L^CLIP, negated.
    const auto s = detail::clipped_surrogate(
        static_cast<double>(log_prob), static_cast<double>(batch.old_log_probs.data()[i]),
        static_cast<double>(batch.advantages.data()[i]), options.clip_eps);
    policy += s.loss;
    clipped += s.clipped ? 1 : 0;
    const double dlog_prob = s.dlog_prob / tokens;
    out.dlog_probs.data()[i] = static_cast<Scalar>(dlog_prob);

    // The value term: ½(V − R)², or baselines' PPO2 clipped form ½·max((V − R)², (V_clip − R)²).
    const double v = static_cast<double>(batch.values.data()[i]);
    const double ret = static_cast<double>(batch.returns.data()[i]);
    double term = (v - ret) * (v - ret), dterm = v - ret;  // d(½·term)/dV
    if (clip_values) {
      const double old = static_cast<double>(batch.old_values.data()[i]);
      const double step = std::min(std::max(v - old, -options.value_clip), options.value_clip);
      const double v_clip = old + step;
      const double clipped_term = (v_clip - ret) * (v_clip - ret);
      const bool inside = v - old >= -options.value_clip && v - old <= options.value_clip;
      // torch.max's rule: the larger term's gradient, half of each on a tie; V_clip moves with V
      // only inside the clip range (where the two terms are equal).
      if (!inside) {
        dterm = term > clipped_term ? v - ret : term == clipped_term ? 0.5 * (v - ret) : 0.0;
      }
      term = std::max(term, clipped_term);
    }
    value += 0.5 * term;
    out.dvalues.data()[i] = static_cast<Scalar>(options.value_coef * dterm / tokens);

    const double h = detail::row_entropy(x, vocab, lse);
    entropy += h;
    // loss = … − c₂·mean(H): dloss/dH of this token is −c₂/M.
    detail::write_row_gradient(x, vocab, lse, target, dlog_prob, -options.entropy_coef / tokens, h,
                               out.dlogits.data() + i * vocab);
  }
  policy /= tokens;
  value /= tokens;
  entropy /= tokens;
  out.policy_loss = static_cast<Scalar>(policy);
  out.value_loss = static_cast<Scalar>(value);
  out.entropy = static_cast<Scalar>(entropy);
  out.clip_fraction = static_cast<Scalar>(clipped / tokens);
  out.loss =
      static_cast<Scalar>(policy + options.value_coef * value - options.entropy_coef * entropy);
  return out;
}

template <TensorLike R, class Scalar>
requires(rank_of<R> == 1) Tensor<Scalar, 1> grpo_advantages(const R& rewards, index_t group_size,
                                                            double std_eps) {
  const char* op = "grpo_advantages";
  const index_t n = rewards.dim(0);
  if (group_size < 2) {
    // One completion has no group to be compared with (and torch.std of one value is NaN).
    throw ConfigError(concat(op, ": group_size must be >= 2 (got ", group_size, ")"));
  }
  if (n % group_size != 0) {
    throw ConfigError(
        concat(op, ": group_size ", group_size, " does not divide the batch of ", n, " rewards"));
  }
  if (!(std_eps >= 0) || !std::isfinite(std_eps)) {
    throw ConfigError(concat(op, ": std_eps must be finite and >= 0 (got ", std_eps, ")"));
  }
  Tensor<Scalar, 1> advantages({n});
  for (index_t g = 0; g < n; g += group_size) {
    const Scalar* r = rewards.data() + g;
    double mean = 0;
    for (index_t i = 0; i < group_size; ++i) mean += static_cast<double>(r[i]);
    mean /= static_cast<double>(group_size);
    double squares = 0;  // two passes: the mean first, so a large common offset cancels exactly
    for (index_t i = 0; i < group_size; ++i) {
      const double d = static_cast<double>(r[i]) - mean;
      squares += d * d;
    }
    const double std = std::sqrt(squares / static_cast<double>(group_size - 1));
    for (index_t i = 0; i < group_size; ++i) {
      advantages.data()[g + i] =
          static_cast<Scalar>((static_cast<double>(r[i]) - mean) / (std + std_eps));
    }
  }
  return advantages;
}

template <TensorLike L, class Scalar>
requires(rank_of<L> == 3) GrpoResult<Scalar> grpo_loss(
    const L& logits, std::span<const index_t> targets,
    std::type_identity_t<ConstTensorView<Scalar, 2>> mask,
    std::type_identity_t<ConstTensorView<Scalar, 2>> old_log_probs,
    std::type_identity_t<ConstTensorView<Scalar, 2>> ref_log_probs,
    std::type_identity_t<ConstTensorView<Scalar, 1>> rewards, const GrpoOptions& options) {
  const char* op = "grpo_loss";
  detail::check_clip_eps(op, options.clip_eps);
  detail::check_coefficient(op, "beta", options.beta);
  const index_t rows = logits.dim(0), steps = logits.dim(1), vocab = logits.dim(2);
  if (rows == 0)
    throw ShapeError(concat(op, ": no sequences (logits: ", format_shape(logits.shape()), ")"));
  const auto selected = detail::check_responses(op, logits.shape(), targets, mask);
  const Shape<2> expected{rows, steps};
  const char* text = "[N, T] of the logits";
  detail::check_input_shape<2, Scalar>(op, "old_log_probs", old_log_probs, expected, text);
  detail::check_input_shape<2, Scalar>(op, "ref_log_probs", ref_log_probs, expected, text);
  detail::check_input_shape<1, Scalar>(op, "rewards", rewards, Shape<1>{rows}, "[N] of the logits");

  GrpoResult<Scalar> out;
  out.advantages = grpo_advantages(rewards, options.group_size, options.std_eps);
  out.log_probs = Tensor<Scalar, 2>(expected);
  out.dlog_probs = Tensor<Scalar, 2>(expected);
  out.dlogits = Tensor<Scalar, 3>(logits.shape());
  double policy = 0, kl = 0, clipped = 0, tokens = 0;
  for (index_t n = 0; n < rows; ++n) {
    const double length = static_cast<double>(selected[static_cast<std::size_t>(n)]);
    const double weight = 1 / (length * static_cast<double>(rows));  // 1/N · 1/|o_i|
    const double advantage = static_cast<double>(out.advantages.data()[n]);
    tokens += length;
    for (index_t t = 0; t < steps; ++t) {
      const index_t i = n * steps + t;
      if (mask.data()[i] == Scalar(0)) continue;
      const Scalar* x = logits.data() + i * vocab;
      const index_t target = targets[static_cast<std::size_t>(i)];
      const auto lse = detail::log_sum_exp(x, vocab);
      const Scalar log_prob = (x[target] - lse.max) - lse.log_sum;
      out.log_probs.data()[i] = log_prob;
      const auto s = detail::clipped_surrogate(static_cast<double>(log_prob),
                                               static_cast<double>(old_log_probs.data()[i]),
                                               advantage, options.clip_eps);
      clipped += s.clipped ? 1 : 0;
      // DeepSeekMath eq. 4 (Schulman's k3): π_ref/πθ − log(π_ref/πθ) − 1 = e^u − u − 1 with
      // u = log π_ref − log πθ; its derivative in log πθ is 1 − e^u.
      const double u = static_cast<double>(ref_log_probs.data()[i]) - static_cast<double>(log_prob);
      const double k3 = std::expm1(u) - u;  // expm1: exact near π_ref = πθ, where it is ~u²/2
      policy += weight * s.loss;
      kl += weight * k3;
      const double dlog_prob = weight * (s.dlog_prob + options.beta * -std::expm1(u));
      out.dlog_probs.data()[i] = static_cast<Scalar>(dlog_prob);
      detail::write_row_gradient(x, vocab, lse, target, dlog_prob, 0.0, 0.0,
                                 out.dlogits.data() + i * vocab);
    }
  }
  out.policy_loss = static_cast<Scalar>(policy);
  out.kl = static_cast<Scalar>(kl);
  out.loss = static_cast<Scalar>(policy + options.beta * kl);
  out.clip_fraction = static_cast<Scalar>(clipped / tokens);
  return out;
}

}  // namespace dissect
