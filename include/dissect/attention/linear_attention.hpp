// dissect/attention/linear_attention.hpp — linear attention (Katharopoulos et al. 2020,
// "Transformers are RNNs"): the softmax kernel exp(q·k) replaced by φ(q)·φ(k) with φ(x) = elu(x) +
// 1 > 0, so
//   o_t = φ(q_t)ᵀ S / (φ(q_t)ᵀ z + eps),  S = Σ_j φ(k_j) v_jᵀ [d_k, d_v],  z = Σ_j φ(k_j) [d_k],
// the sums over every key (non-causal) or over j ≤ t (causal: S_t and z_t are prefix sums, the
// state of an RNN). Time O(T·d_k·d_v) per head and O(d_k·d_v) state; no [T, S] matrix is ever
// formed, in forward or in backward.
//
// Backward follows the paper's Algorithm 1: a forward sweep rebuilds S_t, z_t for dq, a reverse
// sweep sums R_j = Σ_{t≥j} φ(q_t) dnum_tᵀ and r_j = Σ_{t≥j} φ(q_t) dden_t for dk and dv, so it
// too is O(T·d²) time with O(d²) state (plus O(T) scalars per head). It needs no cache: the
// state is recomputed, which costs what the forward did.
//
// eps (default 0, the paper's equation) is added to every denominator; φ > 0 makes φ(q)ᵀz > 0
// already, but it can underflow for very negative q and k (φ = e^x); the authors' library
// (fast-transformers) adds 1e-6. Grouped-query heads as in causal_attention.
#pragma once

#include <Eigen/Core>
#include <cmath>
#include <string_view>

#include "dissect/attention/attention.hpp"
#include "dissect/attention/qkv.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

#ifdef _OPENMP
#include <omp.h>
#endif

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

struct LinearAttentionOptions {
  bool causal = true;  ///< query t sees keys j ≤ t (then S = T), else every key
  double eps = 0.0;    ///< added to the denominator φ(q)ᵀz: finite and ≥ 0
};

/// The recurrent state of causal linear attention after `positions` tokens, per KV head: what a
/// decoder carries instead of a KV cache. Default-constructed: empty, shaped by the first step.
template <class Scalar>
struct LinearAttentionState {
  Tensor<Scalar, 4> s;  ///< S = Σ_{j<positions} φ(k_j) v_jᵀ: [B, H_kv, d_k, d_v]
  Tensor<Scalar, 3> z;  ///< z = Σ_{j<positions} φ(k_j): [B, H_kv, d_k]
  index_t positions = 0;
};

/// q: [B, H, T, d_k], k: [B, H_kv, S, d_k], v: [B, H_kv, S, d_v] → o: [B, H, T, d_v]; causal
/// needs S = T. Threads: with OpenMP, the B·H_kv groups of heads are shared among the team.
/// @throws ShapeError naming the operation and the shapes if the ranks, B, d_k, S differ, H_kv
///         does not divide H, causal with S ≠ T, or S = 0 with T > 0 (non-causal: nothing to
///         attend to); ConfigError "linear_attention: eps must be finite and >= 0 (got …)".
template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> linear_attention(const Q& q, const K& k, const V& v,
                                         LinearAttentionOptions options = {});

/// The gradients of Σ dout ⊙ linear_attention(q, k, v, options): dout [B, H, T, d_v] →
/// {dq [B, H, T, d_k], dk [B, H_kv, S, d_k], dv [B, H_kv, S, d_v]}, recomputing the state.
/// @throws as linear_attention, or ShapeError if dout is not [B, H, T, d_v].
template <TensorLike Q, TensorLike K, TensorLike V, TensorLike DO>
QKV<scalar_of<Q>> linear_attention_backward(const Q& q, const K& k, const V& v, const DO& dout,
                                            LinearAttentionOptions options = {});

/// Causal linear attention over T new tokens that continue `state` (T = 1: one decoding step):
/// q [B, H, T, d_k], k [B, H_kv, T, d_k], v [B, H_kv, T, d_v] → o [B, H, T, d_v], state advanced
/// by T positions. From an empty state, steps of any lengths give linear_attention's causal
/// output (the same arithmetic in the same order). An empty state is shaped (zeros) here.
/// @throws ShapeError (state unchanged) if the shapes differ as in linear_attention, or the
///         state holds another B, H_kv, d_k or d_v; ConfigError for eps.
template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> linear_attention_step(const Q& q, const K& k, const V& v,
                                              LinearAttentionState<scalar_of<Q>>& state,
                                              double eps = 0.0);

namespace detail {

/// φ(x) = elu(x) + 1: x + 1 for x > 0, e^x otherwise (continuous at 0, always > 0).
template <class Scalar>
Scalar elu_plus_one(Scalar x) {
  return x > 0 ? x + Scalar(1) : std::exp(x);
}
/// φ'(x): 1 for x > 0, e^x otherwise (torch's elu backward takes the e^x branch at 0 too).
template <class Scalar>
Scalar elu_plus_one_gradient(Scalar x) {
  return x > 0 ? Scalar(1) : std::exp(x);
}

template <class Scalar>
using ColumnVector = Eigen::Matrix<Scalar, Eigen::Dynamic, 1>;
template <class Scalar>
using RowVector = Eigen::Matrix<Scalar, 1, Eigen::Dynamic>;

/// The heads linear attention reads and writes, contiguous [B, heads, rows, width] each.
template <class Scalar>
struct LinearAttentionHeads {
  HeadMatrices<const Scalar> q, k, v;
  index_t group;  ///< H / H_kv
  Scalar eps;
};

/// One thread's vectors, sized once per call.
template <class Scalar>
struct LinearAttentionScratch {
  ColumnVector<Scalar> phi_k;
  RowVector<Scalar> phi_q, num;
  LinearAttentionScratch(index_t d_k, index_t d_v) : phi_k(d_k), phi_q(d_k), num(d_v) {}
};

/// Causal forward of KV head (b, g) and its query heads, continuing from the state (s, z), which
/// it leaves after the last token: the one kernel of linear_attention (causal) and its steps.
template <class Scalar, class StateMatrix, class StateVector>
void causal_linear_group(const LinearAttentionHeads<Scalar>& x, HeadMatrices<Scalar> o, index_t b,
                         index_t g, StateMatrix& s, StateVector& z,
                         LinearAttentionScratch<Scalar>& w) {
  const auto k = x.k.head(b, g), v = x.v.head(b, g);
  for (index_t t = 0; t < k.rows(); ++t) {
    w.phi_k = k.row(t).transpose().unaryExpr(&elu_plus_one<Scalar>);
    s.noalias() += w.phi_k * v.row(t);  // rank-1 update: S_t = S_{t−1} + φ(k_t) v_tᵀ
    z += w.phi_k;
    for (index_t h = g * x.group; h < (g + 1) * x.group; ++h) {
      w.phi_q = x.q.head(b, h).row(t).unaryExpr(&elu_plus_one<Scalar>);
      w.num.noalias() = w.phi_q * s;
      const Scalar den = w.phi_q.dot(z) + x.eps;
      o.head(b, h).row(t) = w.num / den;
    }
  }
}

template <class Scalar>
void check_linear_attention(std::string_view op, const ConstTensorView<Scalar, 4>& q,
                            const ConstTensorView<Scalar, 4>& k,
                            const ConstTensorView<Scalar, 4>& v, bool causal) {
  const auto shapes = concat(" (q ", format_shape(q.shape()), ", k ", format_shape(k.shape()),
                             ", v ", format_shape(v.shape()), ")");
  if (k.dim(0) != q.dim(0) || k.dim(3) != q.dim(3)) {
    throw ShapeError(
        concat(op, ": k must be [B=", q.dim(0), ", H_kv, S, d_k=", q.dim(3), "]", shapes));
  }
  if (v.dim(0) != k.dim(0) || v.dim(1) != k.dim(1) || v.dim(2) != k.dim(2)) {
    throw ShapeError(concat(op, ": v must be [B, H_kv, S, d_v] with k's B, H_kv and S", shapes));
  }
  if (k.dim(1) <= 0 || q.dim(1) % k.dim(1) != 0) {
    throw ShapeError(concat(op, ": k's heads (axis 1) = ", k.dim(1),
                            " must divide q's heads H = ", q.dim(1), shapes));
  }
  if (causal && k.dim(2) != q.dim(2)) {
    throw ShapeError(concat(op, ": causal attention needs as many keys as queries, S = ", k.dim(2),
                            " != T = ", q.dim(2), shapes));
  }
  if (!causal && k.dim(2) == 0 && q.dim(2) > 0) {
    throw ShapeError(concat(op, ": S = 0 keys: there is nothing to attend to", shapes));
  }
}

template <class Scalar>
Scalar linear_attention_eps(std::string_view op, double eps) {
  if (!std::isfinite(eps) || eps < 0) {
    throw ConfigError(concat(op, ": eps must be finite and >= 0 (got ", eps, ")"));
  }
  return static_cast<Scalar>(eps);
}

}  // namespace detail

// ---- implementation -----------------------------------------------------------------------------

template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> linear_attention(const Q& q, const K& k, const V& v,
                                         LinearAttentionOptions options) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4,
                "dissect::linear_attention: q, k and v are [B, heads, positions, features]");
  constexpr std::string_view op = "linear_attention";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  detail::check_linear_attention(op, qv, kv, vv, options.causal);
  const detail::LinearAttentionHeads<Scalar> x{
      heads_of(qv), heads_of(kv), heads_of(vv), qv.dim(1) / kv.dim(1),
      detail::linear_attention_eps<Scalar>(op, options.eps)};
  const index_t batch = qv.dim(0), kv_heads = kv.dim(1), d_k = qv.dim(3), d_v = vv.dim(3);
  auto out = Tensor<Scalar, 4>::uninitialized({batch, qv.dim(1), qv.dim(2), d_v});
  if (out.empty()) return out;
  const auto o = heads_of(out.view());
  const index_t groups = batch * kv_heads;
#ifdef _OPENMP
#pragma omp parallel if (groups > 1 && !omp_in_parallel())
#endif
  {
    // O(d_k·d_v) per thread, allocated once per call, whatever T.
    RowMatrix<Scalar> s(d_k, d_v);
    detail::ColumnVector<Scalar> z(d_k);
    detail::LinearAttentionScratch<Scalar> w(d_k, d_v);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (index_t pair = 0; pair < groups; ++pair) {
      const index_t b = pair / kv_heads, g = pair % kv_heads;
      s.setZero();
      z.setZero();
      if (options.causal) {
        detail::causal_linear_group(x, o, b, g, s, z, w);
        continue;
      }
      const auto kh = x.k.head(b, g), vh = x.v.head(b, g);
      for (index_t j = 0; j < kh.rows(); ++j) {
        w.phi_k = kh.row(j).transpose().unaryExpr(&detail::elu_plus_one<Scalar>);
        s.noalias() += w.phi_k * vh.row(j);
        z += w.phi_k;
      }
      for (index_t h = g * x.group; h < (g + 1) * x.group; ++h) {
        const auto qh = x.q.head(b, h);
        auto oh = o.head(b, h);
        for (index_t t = 0; t < qh.rows(); ++t) {
          w.phi_q = qh.row(t).unaryExpr(&detail::elu_plus_one<Scalar>);
          w.num.noalias() = w.phi_q * s;
          oh.row(t) = w.num / (w.phi_q.dot(z) + x.eps);
        }
      }
    }
  }
  return out;
}

template <TensorLike Q, TensorLike K, TensorLike V, TensorLike DO>
QKV<scalar_of<Q>> linear_attention_backward(const Q& q, const K& k, const V& v, const DO& dout,
                                            LinearAttentionOptions options) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  require_layer_scalar<Scalar, DO>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4 && rank_of<DO> == 4,
                "dissect::linear_attention_backward: q, k, v and dout are [B, heads, positions, "
                "features]");
  constexpr std::string_view op = "linear_attention_backward";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  const auto dov = const_view(dout);
  detail::check_linear_attention(op, qv, kv, vv, options.causal);
  const Shape<4> out_shape{qv.dim(0), qv.dim(1), qv.dim(2), vv.dim(3)};
  if (dov.shape() != out_shape) {
    throw ShapeError(concat(op, ": dout must be [B, H, T, d_v] = ", format_shape(out_shape),
                            ", got ", format_shape(dov.shape()), " (q ", format_shape(qv.shape()),
                            ", v ", format_shape(vv.shape()), ")"));
  }
  const detail::LinearAttentionHeads<Scalar> x{
      heads_of(qv), heads_of(kv), heads_of(vv), qv.dim(1) / kv.dim(1),
      detail::linear_attention_eps<Scalar>(op, options.eps)};
  const index_t batch = qv.dim(0), kv_heads = kv.dim(1), tokens = qv.dim(2);
  const index_t d_k = qv.dim(3), d_v = vv.dim(3), group = x.group;
  QKV<Scalar> grads{Tensor<Scalar, 4>(qv.shape()), Tensor<Scalar, 4>(kv.shape()),
                    Tensor<Scalar, 4>(vv.shape())};
  if (grads.q.empty() && grads.k.empty() && grads.v.empty()) return grads;
  const auto doh = heads_of(dov);
  const auto dqh = heads_of(grads.q.view()), dkh = heads_of(grads.k.view()),
             dvh = heads_of(grads.v.view());
  const index_t groups = batch * kv_heads;
  using detail::elu_plus_one;
  using detail::elu_plus_one_gradient;
#ifdef _OPENMP
#pragma omp parallel if (groups > 1 && !omp_in_parallel())
#endif
  {
    // O(d_k·d_v) state, and the denominators and their gradients: O(T) scalars per query head of
    // a group (the reverse sweep needs them), never [T, S].
    RowMatrix<Scalar> s(d_k, d_v), r_mat(d_k, d_v);
    detail::ColumnVector<Scalar> z(d_k), r_vec(d_k), d_phi_k(d_k);
    detail::RowVector<Scalar> d_num(d_v), d_phi_q(d_k);
    detail::LinearAttentionScratch<Scalar> w(d_k, d_v);
    RowMatrix<Scalar> den(group, tokens), d_den(group, tokens);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (index_t pair = 0; pair < groups; ++pair) {
      const index_t b = pair / kv_heads, g = pair % kv_heads;
      const auto kh = x.k.head(b, g), vh = x.v.head(b, g);
      auto dk = dkh.head(b, g);
      auto dv = dvh.head(b, g);
      s.setZero();
      z.setZero();
      r_mat.setZero();
      r_vec.setZero();
      // The gradient of query (h, t) given the state it read: o = num/den with num = φ(q)ᵀS,
      // den = φ(q)ᵀz + eps; dnum = g/den, dden = −(g·num)/den², dφ(q) = S·dnum + z·dden. R and r
      // gather φ(q)·dnumᵀ and φ(q)·dden for the keys' gradients.
      const auto query = [&](index_t h, index_t t, bool gather) {
        const auto q_row = x.q.head(b, h).row(t);
        const auto g_row = doh.head(b, h).row(t);
        w.phi_q = q_row.unaryExpr(&elu_plus_one<Scalar>);
        w.num.noalias() = w.phi_q * s;
        const Scalar d = w.phi_q.dot(z) + x.eps;
        d_num = g_row / d;
        const Scalar dd = -g_row.dot(w.num) / d / d;
        d_phi_q.noalias() = d_num * s.transpose();
        d_phi_q += dd * z.transpose();
        dqh.head(b, h).row(t) =
            d_phi_q.cwiseProduct(q_row.unaryExpr(&elu_plus_one_gradient<Scalar>));
        den(h - g * group, t) = d;
        d_den(h - g * group, t) = dd;
        if (gather) {
          r_mat.noalias() += w.phi_q.transpose() * d_num;
          r_vec += w.phi_q.transpose() * dd;
        }
      };
      // The gradients of key j from R, r summed over the queries that read it.
      const auto key = [&](index_t j) {
        w.phi_k = kh.row(j).transpose().unaryExpr(&elu_plus_one<Scalar>);
        d_phi_k.noalias() = r_mat * vh.row(j).transpose();
        d_phi_k += r_vec;
        dk.row(j) =
            d_phi_k.cwiseProduct(kh.row(j).transpose().unaryExpr(&elu_plus_one_gradient<Scalar>))
                .transpose();
        dv.row(j).noalias() = w.phi_k.transpose() * r_mat;
      };
      if (!options.causal) {
        for (index_t j = 0; j < kh.rows(); ++j) {
          w.phi_k = kh.row(j).transpose().unaryExpr(&elu_plus_one<Scalar>);
          s.noalias() += w.phi_k * vh.row(j);
          z += w.phi_k;
        }
        for (index_t h = g * group; h < (g + 1) * group; ++h) {
          for (index_t t = 0; t < tokens; ++t) query(h, t, true);
        }
        for (index_t j = 0; j < kh.rows(); ++j) key(j);
        continue;
      }
      // Forward sweep: S_t, z_t as the forward built them; dq, and each query's den and dden.
      for (index_t t = 0; t < tokens; ++t) {
        w.phi_k = kh.row(t).transpose().unaryExpr(&elu_plus_one<Scalar>);
        s.noalias() += w.phi_k * vh.row(t);
        z += w.phi_k;
        for (index_t h = g * group; h < (g + 1) * group; ++h) query(h, t, false);
      }
      // Reverse sweep: R_j = Σ_{t≥j} φ(q_t)·dnum_tᵀ and r_j = Σ_{t≥j} φ(q_t)·dden_t, then key j.
      for (index_t t = tokens - 1; t >= 0; --t) {
        for (index_t h = g * group; h < (g + 1) * group; ++h) {
          w.phi_q = x.q.head(b, h).row(t).unaryExpr(&elu_plus_one<Scalar>);
          d_num = doh.head(b, h).row(t) / den(h - g * group, t);
          r_mat.noalias() += w.phi_q.transpose() * d_num;
          r_vec += w.phi_q.transpose() * d_den(h - g * group, t);
        }
        key(t);
      }
    }
  }
  return grads;
}

template <TensorLike Q, TensorLike K, TensorLike V>
Tensor<scalar_of<Q>, 4> linear_attention_step(const Q& q, const K& k, const V& v,
                                              LinearAttentionState<scalar_of<Q>>& state,
                                              double eps) {
  using Scalar = scalar_of<Q>;
  require_layer_scalar<Scalar, K>();
  require_layer_scalar<Scalar, V>();
  static_assert(rank_of<Q> == 4 && rank_of<K> == 4 && rank_of<V> == 4,
                "dissect::linear_attention_step: q, k and v are [B, heads, positions, features]");
  constexpr std::string_view op = "linear_attention_step";
  const auto qv = const_view(q), kv = const_view(k), vv = const_view(v);
  detail::check_linear_attention(op, qv, kv, vv, true);
  const detail::LinearAttentionHeads<Scalar> x{heads_of(qv), heads_of(kv), heads_of(vv),
                                               qv.dim(1) / kv.dim(1),
                                               detail::linear_attention_eps<Scalar>(op, eps)};
  const index_t batch = qv.dim(0), kv_heads = kv.dim(1), d_k = qv.dim(3), d_v = vv.dim(3);
  const Shape<4> s_shape{batch, kv_heads, d_k, d_v};
  const Shape<3> z_shape{batch, kv_heads, d_k};
  const bool fresh = state.positions == 0 && state.s.empty() && state.z.empty();
  if (!fresh && (state.s.shape() != s_shape || state.z.shape() != z_shape)) {
    throw ShapeError(
        concat(op, ": the state holds s ", format_shape(state.s.shape()), ", z ",
               format_shape(state.z.shape()), " after ", state.positions,
               " positions; these inputs need s [B, H_kv, d_k, d_v] = ", format_shape(s_shape),
               ", z ", format_shape(z_shape), " (q ", format_shape(qv.shape()), ", k ",
               format_shape(kv.shape()), ", v ", format_shape(vv.shape()), ")"));
  }
  if (fresh) {
    state.s = Tensor<Scalar, 4>(s_shape);  // zeros: nothing seen yet
    state.z = Tensor<Scalar, 3>(z_shape);
  }
  auto out = Tensor<Scalar, 4>::uninitialized({batch, qv.dim(1), qv.dim(2), d_v});
  const auto o = heads_of(out.view());
  const index_t groups = batch * kv_heads;
#ifdef _OPENMP
#pragma omp parallel if (groups > 1 && !omp_in_parallel())
#endif
  {
    detail::LinearAttentionScratch<Scalar> w(d_k, d_v);
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
    for (index_t pair = 0; pair < groups; ++pair) {
      const index_t b = pair / kv_heads, g = pair % kv_heads;
      // (b, g) is KV head `pair` of the [B, H_kv, …] state.
      Eigen::Map<RowMatrix<Scalar>> s(state.s.data() + pair * d_k * d_v, d_k, d_v);
      Eigen::Map<detail::ColumnVector<Scalar>> z(state.z.data() + pair * d_k, d_k);
      detail::causal_linear_group(x, o, b, g, s, z, w);
    }
  }
  state.positions = checked_add(state.positions, qv.dim(2), op);
  return out;
}

}  // namespace dissect
