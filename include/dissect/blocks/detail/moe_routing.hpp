// dissect/blocks/detail/moe_routing.hpp — private: do not include directly
// (dissect/blocks/mixture_of_experts.hpp does).
//
// The per-token arithmetic of a mixture-of-experts router, on one row of logits at a time: the
// softmax and its log-sum-exp, the top-k choice (ties to the lowest index: dissect's own rule,
// see top_k_row), the gates of both gatings and the gradient of each back to the logits.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/blocks/detail/moe_routing.hpp is private to dissect: include dissect/blocks/mixture_of_experts.hpp instead"
#endif

#include <cmath>

#include "dissect/core/shape.hpp"

namespace dissect::detail {

// ---- declarations -------------------------------------------------------------------------------

/// p = softmax(z) over n values, z and p of length n (p may not alias z); returns logsumexp(z).
/// Computed as torch does: exp(z − max z) / Σ, in Scalar.
template <class Scalar>
Scalar softmax_row(const Scalar* z, index_t n, Scalar* p);

/// The k largest of score[0 … n) into chosen[0 … k), largest first; among equal scores the
/// lowest index first. That order is dissect's own rule, chosen so a routing is reproducible:
/// torch.topk fixes none for ties (on the CPU, topk of softmax(zeros(1, 8)) with k = 2 gives
/// experts [6, 5], with 4 experts [2, 3]), so a tied router may pick other experts in torch.
/// A NaN never wins a comparison, so a row of NaN picks 0, 1, …, k − 1: the choice is always k
/// distinct indices.
template <class Scalar>
void top_k_row(const Scalar* score, index_t n, index_t k, index_t* chosen);

/// Gates g[0 … k) of the chosen experts as softmax over their logits z[chosen[j]] (Mixtral).
template <class Scalar>
void softmax_of_top_k_gates(const Scalar* z, const index_t* chosen, index_t k, Scalar* g);

/// Gates g[j] = p[chosen[j]] (Switch), divided by their sum when `renormalize` (DeepSeek's
/// norm_topk_prob; with it, the gates equal softmax_of_top_k's up to rounding).
template <class Scalar>
void top_k_of_softmax_gates(const Scalar* p, const index_t* chosen, index_t k, bool renormalize,
                            Scalar* g);

/// dz[chosen[j]] += g_j·(dg_j − Σ_i g_i·dg_i): softmax_of_top_k_gates's gradient.
template <class Scalar>
void softmax_of_top_k_backward(const index_t* chosen, index_t k, const Scalar* g, const Scalar* dg,
                               Scalar* dz);

/// dz[e] += p_e·(dp_e − Σ_i p_i·dp_i) for dp the gradient of the gates on p (dg_j, or
/// (dg_j − Σ_i g_i·dg_i) / Σ_i p[chosen[i]] when renormalised), zero off the chosen experts.
/// `scratch` holds n values.
template <class Scalar>
void top_k_of_softmax_backward(const Scalar* p, index_t n, const index_t* chosen, index_t k,
                               bool renormalize, const Scalar* g, const Scalar* dg, Scalar* dz,
                               Scalar* scratch);

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
Scalar softmax_row(const Scalar* z, index_t n, Scalar* p) {
  Scalar max = z[0];
  for (index_t i = 1; i < n; ++i) max = z[i] > max ? z[i] : max;
  Scalar sum = 0;
  for (index_t i = 0; i < n; ++i) {
    p[i] = std::exp(z[i] - max);
    sum += p[i];
  }
  for (index_t i = 0; i < n; ++i) p[i] /= sum;
  return max + std::log(sum);
}

template <class Scalar>
void top_k_row(const Scalar* score, index_t n, index_t k, index_t* chosen) {
  // k passes over n values: E is 8 to 256 and k at most 8 in the models this serves, and a pass
  // that takes the first strict maximum is what makes ties go to the lowest index.
  for (index_t j = 0; j < k; ++j) {
    index_t best = -1;
    for (index_t i = 0; i < n; ++i) {
      bool taken = false;
      for (index_t m = 0; m < j; ++m) taken = taken || chosen[m] == i;
      if (taken) continue;
      if (best < 0 || score[i] > score[best]) best = i;
    }
    chosen[j] = best;
  }
}

template <class Scalar>
void softmax_of_top_k_gates(const Scalar* z, const index_t* chosen, index_t k, Scalar* g) {
  for (index_t j = 0; j < k; ++j) g[j] = z[chosen[j]];
  Scalar max = g[0];
  for (index_t j = 1; j < k; ++j) max = g[j] > max ? g[j] : max;
  Scalar sum = 0;
  for (index_t j = 0; j < k; ++j) {
    g[j] = std::exp(g[j] - max);
    sum += g[j];
  }
  for (index_t j = 0; j < k; ++j) g[j] /= sum;
}

template <class Scalar>
void top_k_of_softmax_gates(const Scalar* p, const index_t* chosen, index_t k, bool renormalize,
                            Scalar* g) {
  Scalar sum = 0;
  for (index_t j = 0; j < k; ++j) {
    g[j] = p[chosen[j]];
    sum += g[j];
  }
  if (renormalize) {
    for (index_t j = 0; j < k; ++j) g[j] /= sum;
  }
}

template <class Scalar>
void softmax_of_top_k_backward(const index_t* chosen, index_t k, const Scalar* g, const Scalar* dg,
                               Scalar* dz) {
  Scalar dot = 0;
  for (index_t j = 0; j < k; ++j) dot += g[j] * dg[j];
  for (index_t j = 0; j < k; ++j) dz[chosen[j]] += g[j] * (dg[j] - dot);
}

template <class Scalar>
void top_k_of_softmax_backward(const Scalar* p, index_t n, const index_t* chosen, index_t k,
                               bool renormalize, const Scalar* g, const Scalar* dg, Scalar* dz,
                               Scalar* scratch) {
  Scalar* dp = scratch;
  for (index_t i = 0; i < n; ++i) dp[i] = 0;
  if (renormalize) {  // g_j = p_j / S: dp_j = (dg_j − Σ_i g_i·dg_i) / S
    Scalar dot = 0, sum = 0;
    for (index_t j = 0; j < k; ++j) {
      dot += g[j] * dg[j];
      sum += p[chosen[j]];
    }
    for (index_t j = 0; j < k; ++j) dp[chosen[j]] = (dg[j] - dot) / sum;
  } else {
    for (index_t j = 0; j < k; ++j) dp[chosen[j]] = dg[j];
  }
  Scalar dot = 0;
  for (index_t i = 0; i < n; ++i) dot += p[i] * dp[i];
  for (index_t i = 0; i < n; ++i) dz[i] += p[i] * (dp[i] - dot);
}

}  // namespace dissect::detail
