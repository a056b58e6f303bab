// Tests of dissect/attention/linear_attention.hpp: the prefix-sum forward and its O(T·d²) backward
// against the quadratic form φ(Q)φ(K)ᵀ (⊙ the causal mask) written as plain loops in double and as
// PyTorch fixtures (float32 and float64, forward and every gradient, causal and not, grouped-query,
// eps), finite differences in double, the recurrent decode against the causal forward (token by
// token and in chunks), T = 100,000 (no [T, T] anywhere), and every refused input (row 95).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "dissect/attention/linear_attention.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_linear_attention {

using testing::FloatAndDouble;
using testing::random_tensor;

struct Case {
  index_t batch, heads, kv_heads, tokens, keys, d_k, d_v;
  bool causal;
};

const std::vector<Case> cases = {
    {2, 2, 2, 5, 5, 3, 4, true},  {1, 4, 2, 9, 9, 4, 2, true},  {2, 3, 1, 4, 4, 2, 5, true},
    {2, 2, 1, 3, 7, 3, 5, false}, {1, 4, 4, 8, 2, 6, 3, false}, {3, 2, 2, 6, 6, 4, 4, false},
};

double phi(double x) {
  return x > 0 ? x + 1 : std::exp(x);
}

/// o_t = Σ_j a_tj v_j / (Σ_j a_tj + eps), a_tj = φ(q_t)·φ(k_j) over j ≤ t (causal) or every j:
/// the quadratic form in double, by plain loops.
template <class Scalar>
Tensor<double, 4> reference(const Tensor<Scalar, 4>& q, const Tensor<Scalar, 4>& k,
                            const Tensor<Scalar, 4>& v, bool causal, double eps) {
  const index_t B = q.dim(0), H = q.dim(1), T = q.dim(2), d_k = q.dim(3), S = k.dim(2);
  const index_t d_v = v.dim(3), group = H / k.dim(1);
  Tensor<double, 4> o({B, H, T, d_v});
  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h) {
      for (index_t t = 0; t < T; ++t) {
        double den = eps;
        std::vector<double> num(static_cast<std::size_t>(d_v), 0.0);
        for (index_t j = 0; j < (causal ? t + 1 : S); ++j) {
          double a = 0;
          for (index_t i = 0; i < d_k; ++i) a += phi(q(b, h, t, i)) * phi(k(b, h / group, j, i));
          den += a;
          for (index_t i = 0; i < d_v; ++i) num[i] += a * v(b, h / group, j, i);
        }
        for (index_t i = 0; i < d_v; ++i) o(b, h, t, i) = num[i] / den;
      }
    }
  }
  return o;
}

template <class Scalar>
struct Inputs {
  Tensor<Scalar, 4> q, k, v;
};

template <class Scalar>
Inputs<Scalar> inputs_for(const Case& c, std::uint64_t seed, double scale = 1.5) {
  std::mt19937_64 engine(seed);
  return {random_tensor<Scalar, 4>({c.batch, c.heads, c.tokens, c.d_k}, engine, -scale, scale),
          random_tensor<Scalar, 4>({c.batch, c.kv_heads, c.keys, c.d_k}, engine, -scale, scale),
          random_tensor<Scalar, 4>({c.batch, c.kv_heads, c.keys, c.d_v}, engine, -1, 1)};
}

std::string trace(const Case& c) {
  return testing::concat_for_trace("B=", c.batch, " H=", c.heads, " H_kv=", c.kv_heads,
                                   " T=", c.tokens, " S=", c.keys, " d_k=", c.d_k, " d_v=", c.d_v,
                                   c.causal ? " causal" : " full");
}

template <class Scalar>
class LinearAttentionTyped : public ::testing::Test {};
TYPED_TEST_SUITE(LinearAttentionTyped, FloatAndDouble);

TYPED_TEST(LinearAttentionTyped, PrefixSumsMatchTheQuadraticFormInDouble) {
  for (const Case& c : cases) {
    SCOPED_TRACE(trace(c));
    for (const double eps : {0.0, 1e-3}) {
      const auto x = inputs_for<TypeParam>(c, 1);
      const auto expected = reference(x.q, x.k, x.v, c.causal, eps);
      // o is a convex combination of v's rows (a_tj > 0, weights Σ a/(Σ a + eps) ≤ 1): every
      // term of S and z is positive, so each is accurate to γ_{d·S}; num/den then to ~2γ.
      const double bound = 4 * testing::gamma<TypeParam>(c.d_k * c.keys + 4) + 1e-300;
      EXPECT_TENSOR_NEAR(linear_attention(x.q, x.k, x.v, {.causal = c.causal, .eps = eps}),
                         expected, 0.0, bound);
    }
  }
}

TYPED_TEST(LinearAttentionTyped, StepsFromAnEmptyStateAreTheCausalForward) {
  // Token by token, and in chunks of 3, 1, 4, …: the same outputs as one causal forward, and the
  // state after the last step is Σ φ(k_j) v_jᵀ and Σ φ(k_j).
  const Case c{2, 4, 2, 11, 11, 3, 5, true};
  const auto x = inputs_for<TypeParam>(c, 2);
  const auto full = linear_attention(x.q, x.k, x.v, {.eps = 1e-6});
  const double tol = std::is_same_v<TypeParam, float> ? 1e-6 : 1e-15;
  for (const std::vector<index_t>& chunks :
       {std::vector<index_t>(11, 1), std::vector<index_t>{3, 1, 4, 0, 3}}) {
    LinearAttentionState<TypeParam> state;
    index_t start = 0;
    for (const index_t n : chunks) {
      const auto slice = [&](const Tensor<TypeParam, 4>& t) {
        Tensor<TypeParam, 4> out({t.dim(0), t.dim(1), n, t.dim(3)});
        for (index_t b = 0; b < t.dim(0); ++b)
          for (index_t h = 0; h < t.dim(1); ++h)
            for (index_t s = 0; s < n; ++s)
              for (index_t i = 0; i < t.dim(3); ++i) out(b, h, s, i) = t(b, h, start + s, i);
        return out;
      };
      const auto o = linear_attention_step(slice(x.q), slice(x.k), slice(x.v), state, 1e-6);
      EXPECT_EQ(state.positions, start + n);
      for (index_t b = 0; b < c.batch; ++b)
        for (index_t h = 0; h < c.heads; ++h)
          for (index_t s = 0; s < n; ++s)
            for (index_t i = 0; i < c.d_v; ++i)
              EXPECT_NEAR(o(b, h, s, i), full(b, h, start + s, i), tol) << "position " << start + s;
      start += n;
    }
    for (index_t b = 0; b < c.batch; ++b) {
      for (index_t g = 0; g < c.kv_heads; ++g) {
        for (index_t i = 0; i < c.d_k; ++i) {
          double z = 0;
          for (index_t j = 0; j < c.keys; ++j) z += phi(x.k(b, g, j, i));
          EXPECT_NEAR(state.z(b, g, i), z, 16 * tol * z);
          for (index_t e = 0; e < c.d_v; ++e) {
            double s = 0;
            for (index_t j = 0; j < c.keys; ++j) s += phi(x.k(b, g, j, i)) * x.v(b, g, j, e);
            EXPECT_NEAR(state.s(b, g, i, e), s, 16 * tol * z);
          }
        }
      }
    }
  }
}

// ---- gradients ----------------------------------------------------------------------------------

TEST(LinearAttention, BackwardMatchesFiniteDifferences) {
  for (const Case& c : cases) {
    SCOPED_TRACE(trace(c));
    for (const double eps : {0.0, 0.5}) {
      auto inputs = inputs_for<double>(c, 3);
      auto& q = inputs.q;
      auto& k = inputs.k;
      auto& v = inputs.v;
      std::mt19937_64 engine(4);
      const auto dout = random_tensor<double, 4>({c.batch, c.heads, c.tokens, c.d_v}, engine);
      const LinearAttentionOptions options{.causal = c.causal, .eps = eps};
      const auto grads = linear_attention_backward(q, k, v, dout, options);
      const auto loss = [&] {
        const auto o = linear_attention(q, k, v, options);
        double total = 0;
        for (index_t i = 0; i < o.size(); ++i) total += o.data()[i] * dout.data()[i];
        return total;
      };
      EXPECT_GRADIENT_OK(testing::gradcheck(loss, q, grads.q));
      EXPECT_GRADIENT_OK(testing::gradcheck(loss, k, grads.k));
      EXPECT_GRADIENT_OK(testing::gradcheck(loss, v, grads.v));
    }
  }
}

TEST(LinearAttention, AHundredThousandTokensInLinearTimeAndMemory) {
  // T = 10⁵: a [T, T] matrix would be 4·10¹⁰ bytes in float, beyond this machine, so forward and
  // backward finishing proves that neither forms one. The last output and the first key's dv are
  // checked against the quadratic form at those positions alone (O(T·d) each, in double).
  const index_t T = testing::sweep_trials(100'000);
  const Case c{1, 1, 1, T, T, 4, 4, true};
  const auto x = inputs_for<float>(c, 5, 1.0);
  std::mt19937_64 engine(6);
  const auto dout = random_tensor<float, 4>({1, 1, T, 4}, engine);
  const auto o = linear_attention(x.q, x.k, x.v);
  const auto grads = linear_attention_backward(x.q, x.k, x.v, dout);
  // o at t = T − 1 by the quadratic form.
  const index_t t = T - 1;
  double den = 0;
  std::vector<double> num(4, 0.0), z_prefix(4, 0.0);
  for (index_t j = 0; j <= t; ++j) {
    double a = 0;
    for (index_t i = 0; i < 4; ++i) a += phi(x.q(0, 0, t, i)) * phi(x.k(0, 0, j, i));
    den += a;
    for (index_t i = 0; i < 4; ++i) num[i] += a * x.v(0, 0, j, i);
  }
  // float over 10⁵ positive terms: ~T·u relative in the sums, far below this bound.
  for (index_t i = 0; i < 4; ++i) EXPECT_NEAR(o(0, 0, t, i), num[i] / den, 2e-3);
  // dv_0 = Σ_t a_t0 · dout_t / den_t: every query reads key 0.
  std::vector<double> dv0(4, 0.0);
  for (index_t s = 0; s < T; ++s) {
    for (index_t i = 0; i < 4; ++i) z_prefix[i] += phi(x.k(0, 0, s, i));
    double a = 0, d = 0;
    for (index_t i = 0; i < 4; ++i) {
      const double p = phi(x.q(0, 0, s, i));
      a += p * phi(x.k(0, 0, 0, i));
      d += p * z_prefix[i];
    }
    for (index_t i = 0; i < 4; ++i) dv0[i] += a * dout(0, 0, s, i) / d;
  }
  double scale = 0;
  for (double g : dv0) scale = std::max(scale, std::abs(g));
  for (index_t i = 0; i < 4; ++i) EXPECT_NEAR(grads.v(0, 0, 0, i), dv0[i], 1e-3 * (1 + scale));
  for (const float g : grads.q) ASSERT_TRUE(std::isfinite(g));
  for (const float g : grads.k) ASSERT_TRUE(std::isfinite(g));
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

TYPED_TEST(LinearAttentionTyped, MatchesTorchsQuadraticFormAndItsGradients) {
  using Scalar = TypeParam;
  const auto check = [](const testing::Fixture& fixture) {
    const auto t = [&](const char* name) {
      return testing::tensor_from<Scalar, 4>(fixture.tensor(name));
    };
    const auto q = t("q"), k = t("k"), v = t("v");
    const LinearAttentionOptions options{.causal = fixture.meta_bool("causal"),
                                         .eps = std::stod(fixture.meta_str("eps"))};
    const double tol = std::is_same_v<Scalar, float> ? 3e-5 : 1e-12;
    EXPECT_TENSOR_NEAR(linear_attention(q, k, v, options), t("o"), tol, tol);
    const auto grads = linear_attention_backward(q, k, v, t("dout"), options);
    EXPECT_TENSOR_NEAR(grads.q, t("dq"), tol, tol);
    EXPECT_TENSOR_NEAR(grads.k, t("dk"), tol, tol);
    EXPECT_TENSOR_NEAR(grads.v, t("dv"), tol, tol);
  };
  EXPECT_EQ(testing::for_each_fixture<Scalar>("linear_attention", check), 5);
}

// ---- bad input (reliability row 95)
// --------------------------------------------------------------

TEST(LinearAttentionErrors, ShapesEpsAndStatesNameTheOpAndTheShapes) {
  const Tensor<float, 4> q({2, 4, 3, 8}), k({2, 2, 3, 8}), v({2, 2, 3, 5});
  EXPECT_THROW_WITH(
      linear_attention(q, Tensor<float, 4>({2, 2, 3, 6}), v), ShapeError,
      "linear_attention: k must be [B=2, H_kv, S, d_k=8] (q [2, 4, 3, 8], k [2, 2, 3, "
      "6], v [2, 2, 3, 5])");
  EXPECT_THROW_WITH(linear_attention(q, k, Tensor<float, 4>({2, 2, 4, 5})), ShapeError,
                    "linear_attention: v must be [B, H_kv, S, d_v] with k's B, H_kv and S");
  EXPECT_THROW_WITH(
      linear_attention(q, Tensor<float, 4>({2, 3, 3, 8}), Tensor<float, 4>({2, 3, 3, 5})),
      ShapeError, "linear_attention: k's heads (axis 1) = 3 must divide q's heads H = 4");
  const Tensor<float, 4> k7({2, 2, 7, 8}), v7({2, 2, 7, 5});
  EXPECT_THROW_WITH(
      linear_attention(q, k7, v7), ShapeError,
      "linear_attention: causal attention needs as many keys as queries, S = 7 != T = 3");
  EXPECT_NO_THROW(linear_attention(q, k7, v7, {.causal = false}));
  EXPECT_THROW_WITH(linear_attention(q, Tensor<float, 4>({2, 2, 0, 8}),
                                     Tensor<float, 4>({2, 2, 0, 5}), {.causal = false}),
                    ShapeError, "linear_attention: S = 0 keys: there is nothing to attend to");
  EXPECT_THROW_WITH(linear_attention(q, k, v, {.eps = -1e-6}), ConfigError,
                    "linear_attention: eps must be finite and >= 0 (got -1e-06)");
  EXPECT_THROW_WITH(linear_attention(q, k, v, {.eps = NAN}), ConfigError, "(got nan)");
  EXPECT_THROW_WITH(linear_attention_backward(q, k, v, Tensor<float, 4>({2, 4, 3, 8})), ShapeError,
                    "linear_attention_backward: dout must be [B, H, T, d_v] = [2, 4, 3, 5], got "
                    "[2, 4, 3, 8]");
  // The state: shaped by its first step, refused (and left alone) for other inputs.
  LinearAttentionState<float> state;
  (void)linear_attention_step(q, k, v, state);
  const auto s = testing::snapshot(state.s);
  EXPECT_THROW_WITH(
      linear_attention_step(Tensor<float, 4>({2, 4, 1, 8}), Tensor<float, 4>({2, 4, 1, 8}),
                            Tensor<float, 4>({2, 4, 1, 5}), state),
      ShapeError,
      "linear_attention_step: the state holds s [2, 2, 8, 5], z [2, 2, 8] after 3 "
      "positions; these inputs need s [B, H_kv, d_k, d_v] = [2, 4, 8, 5]");
  EXPECT_THROW_WITH(linear_attention_step(q, k, v, state, -1.0), ConfigError,
                    "linear_attention_step: eps must be finite and >= 0");
  EXPECT_EQ(state.positions, 3);
  EXPECT_TENSOR_EQ(state.s, s);
  // Empty inputs are valid and add nothing.
  const Tensor<float, 4> none({2, 4, 0, 8});
  EXPECT_EQ(linear_attention(none, Tensor<float, 4>({2, 2, 0, 8}), Tensor<float, 4>({2, 2, 0, 5}))
                .shape(),
            (Shape<4>{2, 4, 0, 5}));
}

}  // namespace test_linear_attention
}  // namespace dissect
