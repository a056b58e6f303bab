// Tests of dissect/attention/flash_attention.hpp: forward and backward, causal (with the KV-cache
// offset) and not, grouped-query, against a plain-loop reference in double and against
// attention.hpp's materialised path, across shapes that do not divide the 64-row tiles; PyTorch
// fixtures (f32, f64); finite differences in double; strided heads read from a KV-cache-like
// buffer; the memory bound (T = 16,384 forward and backward with the peak resident memory far under
// the 1 GiB of [T, T] probabilities); every refused input (reliability rows 90, 91).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dissect/attention/flash_attention.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/sanitizers.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_flash_attention {

using testing::FloatAndDouble;

struct Case {
  index_t batch, heads, kv_heads, tokens, keys, head_dim;
};

// T = 1 (a decoding step, alone and after 76 positions), 63 and 65 (one short of and one past a
// 64-row tile), 130 (three tiles), S > T (a KV-cache offset of 135), GQA 4/2 and 4/1, d_k 8, 64.
// Under the sanitizers (-O0, where the plain-loop reference is ~30× slower) the d_k = 64 cases
// and one of the two three-tile ones are left out: the tiles' indexing is the same at d_k = 8.
const std::vector<Case> cases = {
    {1, 4, 2, 1, 1, 8},     {1, 4, 1, 1, 77, 8},   {2, 4, 2, 63, 63, 8},   {2, 2, 1, 130, 131, 8},
#if !defined(DISSECT_TEST_SANITIZED)
    {1, 2, 2, 130, 130, 8}, {1, 4, 1, 65, 65, 64}, {1, 4, 2, 65, 200, 64},
#endif
};

/// Everything the double reference gives: o and the gradients of Σ o ⊙ dout, and per element a
/// magnitude M (the same sums over absolute values) that bounds the rounding of a float result.
struct Reference {
  Tensor<double, 4> o, dq, dk, dv;
  Tensor<double, 4> o_mag, dq_mag, dk_mag, dv_mag;
};

/// Plain loops in double: P = softmax(s·q·kᵀ + mask) row by row (mask: query t sees keys
/// ≤ S − T + t when causal), o = P·v, dv = Pᵀ·dout, dP = dout·vᵀ, dS = s·P ⊙ (dP − rowsum(P ⊙ dP)),
/// dq = dS·k, dk = dSᵀ·q, with dk, dv summed over each KV head's query heads.
template <class Scalar>
Reference reference(const Tensor<Scalar, 4>& q, const Tensor<Scalar, 4>& k,
                    const Tensor<Scalar, 4>& v, const Tensor<Scalar, 4>& dout, bool causal,
                    std::optional<double> score_scale = std::nullopt) {
  const index_t B = q.dim(0), H = q.dim(1), T = q.dim(2), d = q.dim(3), S = k.dim(2);
  const index_t group = H / k.dim(1);
  const double scale = score_scale.value_or(1.0 / std::sqrt(static_cast<double>(d)));
  Reference r{Tensor<double, 4>(q.shape()), Tensor<double, 4>(q.shape()),
              Tensor<double, 4>(k.shape()), Tensor<double, 4>(k.shape()),
              Tensor<double, 4>(q.shape()), Tensor<double, 4>(q.shape()),
              Tensor<double, 4>(k.shape()), Tensor<double, 4>(k.shape())};
  std::vector<double> p(static_cast<std::size_t>(S)), dp(static_cast<std::size_t>(S));
  for (index_t b = 0; b < B; ++b) {
    for (index_t h = 0; h < H; ++h) {
      const index_t g = h / group;
      for (index_t t = 0; t < T; ++t) {
        const index_t visible = causal ? S - T + t + 1 : S;
        double top = -INFINITY, sum = 0, dot = 0;
        for (index_t j = 0; j < visible; ++j) {
          double s = 0;
          for (index_t i = 0; i < d; ++i) s += double(q(b, h, t, i)) * double(k(b, g, j, i));
          p[j] = s * scale;
          top = std::max(top, p[j]);
        }
        for (index_t j = 0; j < visible; ++j) sum += (p[j] = std::exp(p[j] - top));
        for (index_t j = 0; j < visible; ++j) {
          p[j] /= sum;
          dp[j] = 0;
          for (index_t i = 0; i < d; ++i) {
            r.o(b, h, t, i) += p[j] * double(v(b, g, j, i));
            r.o_mag(b, h, t, i) += p[j] * std::abs(double(v(b, g, j, i)));
            dp[j] += double(dout(b, h, t, i)) * double(v(b, g, j, i));
            r.dv(b, g, j, i) += p[j] * double(dout(b, h, t, i));
            r.dv_mag(b, g, j, i) += p[j] * std::abs(double(dout(b, h, t, i)));
          }
          dot += p[j] * dp[j];
        }
        for (index_t j = 0; j < visible; ++j) {
          const double ds = scale * p[j] * (dp[j] - dot);
          // |dS| can cancel to far below the terms it is made of: bound with those instead.
          double dp_mag = 0;
          for (index_t i = 0; i < d; ++i) {
            dp_mag += std::abs(double(dout(b, h, t, i)) * double(v(b, g, j, i)));
          }
          const double ds_mag = scale * p[j] * (dp_mag + std::abs(dot) + std::abs(dp[j]));
          for (index_t i = 0; i < d; ++i) {
            r.dq(b, h, t, i) += ds * double(k(b, g, j, i));
            r.dq_mag(b, h, t, i) += ds_mag * std::abs(double(k(b, g, j, i)));
            r.dk(b, g, j, i) += ds * double(q(b, h, t, i));
            r.dk_mag(b, g, j, i) += ds_mag * std::abs(double(q(b, h, t, i)));
          }
        }
      }
    }
  }
  return r;
}

/// The allowed error of a Scalar result against the double reference: c·(γ_{S+d} + the score's
/// rounding δ)·M elementwise, M the reference's magnitude sums. The scores s·q·k are off by
/// δ ≤ γ_d·s·Σ|q||k|, so every P (and the log-sum-exp it is rebuilt from) is off by a factor
/// e^{±4δ}; the products then add γ_S and γ_d of their absolute sums (Higham §3.1).
template <class Scalar>
Tensor<double, 4> bound_of(const Tensor<double, 4>& magnitude, double delta, index_t S, index_t d) {
  Tensor<double, 4> bound(magnitude.shape());
  const double factor = 8.0 * (testing::gamma<Scalar>(S + d + 4) + 4.0 * delta);
  for (index_t i = 0; i < bound.size(); ++i) {
    bound.data()[i] = factor * magnitude.data()[i] + testing::unit_roundoff<Scalar>();
  }
  return bound;
}

template <class Scalar>
double score_delta(const Tensor<Scalar, 4>& q, const Tensor<Scalar, 4>& k,
                   std::optional<double> score_scale) {
  double q_max = 0, k_max = 0;
  for (Scalar x : q) q_max = std::max(q_max, std::abs(double(x)));
  for (Scalar x : k) k_max = std::max(k_max, std::abs(double(x)));
  const index_t d = q.dim(3);
  const double scale = score_scale.value_or(1.0 / std::sqrt(double(d)));
  return testing::gamma<Scalar>(d + 2) * d * q_max * k_max * scale;
}

template <class Scalar>
struct Inputs {
  Tensor<Scalar, 4> q, k, v, dout;
};

template <class Scalar>
Inputs<Scalar> inputs_for(const Case& c, std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  const Shape<4> q_shape{c.batch, c.heads, c.tokens, c.head_dim};
  const Shape<4> kv_shape{c.batch, c.kv_heads, c.keys, c.head_dim};
  return {testing::random_tensor<Scalar, 4>(q_shape, engine, -2, 2),
          testing::random_tensor<Scalar, 4>(kv_shape, engine, -2, 2),
          testing::random_tensor<Scalar, 4>(kv_shape, engine, -1, 1),
          testing::random_tensor<Scalar, 4>(q_shape, engine, -1, 1)};
}

std::string trace_of(const Case& c, bool causal) {
  return testing::concat_for_trace("B=", c.batch, " H=", c.heads, " H_kv=", c.kv_heads,
                                   " T=", c.tokens, " S=", c.keys, " d_k=", c.head_dim,
                                   causal ? " causal" : " full");
}

template <class Scalar>
class FlashAttention : public ::testing::Test {};
TYPED_TEST_SUITE(FlashAttention, FloatAndDouble);

TYPED_TEST(FlashAttention, ForwardAndBackwardMatchTheDoubleReferenceCausalAndNot) {
  for (const Case& c : cases) {
    for (const bool causal : {true, false}) {
      SCOPED_TRACE(trace_of(c, causal));
      const auto [q, k, v, dout] = inputs_for<TypeParam>(c, 1);
      const auto ref = reference(q, k, v, dout, causal);
      const double delta = score_delta(q, k, std::nullopt);
      const auto bound = [&](const Tensor<double, 4>& m) {
        return bound_of<TypeParam>(m, delta, c.keys, c.head_dim);
      };
      const FlashAttentionOptions options{.causal = causal};
      FlashAttentionCache<TypeParam> cache;
      const auto o = flash_attention(q, k, v, cache, options);
      EXPECT_TENSOR_WITHIN(o, ref.o, bound(ref.o_mag)) << "forward with cache";
      EXPECT_TENSOR_WITHIN(flash_attention(q, k, v, options), ref.o, bound(ref.o_mag))
          << "forward without cache";
      EXPECT_EQ(cache.lse.shape(), (Shape<3>{c.batch, c.heads, c.tokens}));
      const auto grads = flash_attention_backward(q, k, v, o, cache, dout);
      EXPECT_TENSOR_WITHIN(grads.q, ref.dq, bound(ref.dq_mag)) << "dq";
      EXPECT_TENSOR_WITHIN(grads.k, ref.dk, bound(ref.dk_mag)) << "dk";
      EXPECT_TENSOR_WITHIN(grads.v, ref.dv, bound(ref.dv_mag)) << "dv";
    }
  }
}

// The materialised path of attention.hpp (P kept, then causal_attention_backward) and flash agree
// within the two paths' rounding, causal with a given scale, on the same inputs.
TYPED_TEST(FlashAttention, AgreesWithTheMaterialisedTrainingPath) {
  for (const Case& c : cases) {
    for (const double scale : {0.3, 1.0}) {
      SCOPED_TRACE(trace_of(c, true) + testing::concat_for_trace(" scale=", scale));
      const auto [q, k, v, dout] = inputs_for<TypeParam>(c, 2);
      const auto ref = reference(q, k, v, dout, true, scale);
      const double delta = score_delta(q, k, std::optional<double>(scale));
      const auto bound = [&](const Tensor<double, 4>& m) {
        // Both paths are within bound_of of the exact result, so within twice that of each other.
        auto b = bound_of<TypeParam>(m, delta, c.keys, c.head_dim);
        for (double& x : b) x *= 2;
        return b;
      };
      AttentionCache<TypeParam> materialised;
      const auto o_ref = testing::to_double(causal_attention(q, k, v, materialised, scale));
      const auto g_ref = causal_attention_backward(q, k, v, materialised, dout);
      FlashAttentionCache<TypeParam> cache;
      const auto o = flash_attention(q, k, v, cache, {.causal = true, .scale = scale});
      EXPECT_EQ(cache.options.scale, scale);
      const auto grads = flash_attention_backward(q, k, v, o, cache, dout);
      EXPECT_TENSOR_WITHIN(o, o_ref, bound(ref.o_mag));
      EXPECT_TENSOR_WITHIN(grads.q, testing::to_double(g_ref.q), bound(ref.dq_mag));
      EXPECT_TENSOR_WITHIN(grads.k, testing::to_double(g_ref.k), bound(ref.dk_mag));
      EXPECT_TENSOR_WITHIN(grads.v, testing::to_double(g_ref.v), bound(ref.dv_mag));
    }
  }
}

// L is the log-sum-exp of each row's visible scaled scores: check it against the reference.
TEST(FlashAttention, TheCacheHoldsEachRowsLogSumExp) {
  const Case c{1, 2, 1, 70, 75, 8};
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    const auto [q, k, v, dout] = inputs_for<double>(c, 3);
    FlashAttentionCache<double> cache;
    flash_attention(q, k, v, cache, {.causal = causal, .scale = 0.5});
    for (index_t h = 0; h < c.heads; ++h) {
      for (index_t t = 0; t < c.tokens; ++t) {
        const index_t visible = causal ? c.keys - c.tokens + t + 1 : c.keys;
        double top = -INFINITY, sum = 0;
        std::vector<double> s(visible);
        for (index_t j = 0; j < visible; ++j) {
          s[j] = 0;
          for (index_t i = 0; i < c.head_dim; ++i) s[j] += q(0, h, t, i) * k(0, 0, j, i);
          top = std::max(top, s[j] *= 0.5);
        }
        for (double x : s) sum += std::exp(x - top);
        EXPECT_NEAR(cache.lse(0, h, t), top + std::log(sum), 1e-12) << "h=" << h << " t=" << t;
      }
    }
  }
}

TEST(FlashAttention, BackwardMatchesFiniteDifferences) {
  const std::vector<std::pair<Case, bool>> checks = {
    {{2, 4, 2, 5, 5, 4}, true},
    {{1, 4, 1, 3, 9, 6}, true},
    {{1, 2, 1, 70, 70, 3}, true},
    {{1, 2, 2, 7, 4, 4}, false},
#if !defined(DISSECT_TEST_SANITIZED)  // a second two-tile case only where it is cheap
    {{1, 4, 2, 66, 67, 2}, false},
#endif
  };
  for (const auto& [c, causal] : checks) {
    SCOPED_TRACE(trace_of(c, causal));
    auto inputs = inputs_for<double>(c, 4);
    auto& q = inputs.q;
    auto& k = inputs.k;
    auto& v = inputs.v;
    const auto& dout = inputs.dout;
    const FlashAttentionOptions options{.causal = causal, .scale = 0.7};
    FlashAttentionCache<double> cache;
    const auto o = flash_attention(q, k, v, cache, options);
    const auto grads = flash_attention_backward(q, k, v, o, cache, dout);
    const auto loss = [&] {
      const auto out = flash_attention(q, k, v, options);
      double total = 0;
      for (index_t i = 0; i < out.size(); ++i) total += out.data()[i] * dout.data()[i];
      return total;
    };
    const testing::GradcheckOptions check{.richardson = true, .sample = 40, .seed = 5};
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, q, grads.q, check));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, k, grads.k, check));
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, v, grads.v, check));
  }
}

TYPED_TEST(FlashAttention, MatchesPyTorchFixtures) {
  const auto check = [](const testing::Fixture& fixture) {
    const auto get = [&](const char* name) {
      return testing::tensor_from<TypeParam, 4>(fixture.tensor(name));
    };
    const auto q = get("q"), k = get("k"), v = get("v"), dout = get("dout");
    const bool causal = fixture.meta_str("causal") == "1";
    const std::string scale_text = fixture.meta_str("scale");
    const std::optional<double> scale =
        scale_text == "default" ? std::nullopt : std::optional<double>(std::stod(scale_text));
    const auto ref = reference(q, k, v, dout, causal, scale);
    const double delta = score_delta(q, k, scale);
    const auto bound = [&](const Tensor<double, 4>& m) {
      // torch's float result has its own rounding beside ours: twice the one-sided bound.
      auto b = bound_of<TypeParam>(m, delta, k.dim(2), q.dim(3));
      for (double& x : b) x *= 2;
      return b;
    };
    FlashAttentionCache<TypeParam> cache;
    const auto o = flash_attention(q, k, v, cache, {.causal = causal, .scale = scale});
    const auto grads = flash_attention_backward(q, k, v, o, cache, dout);
    EXPECT_TENSOR_WITHIN(o, get("o"), bound(ref.o_mag));
    EXPECT_TENSOR_WITHIN(grads.q, get("dq"), bound(ref.dq_mag));
    EXPECT_TENSOR_WITHIN(grads.k, get("dk"), bound(ref.dk_mag));
    EXPECT_TENSOR_WITHIN(grads.v, get("dv"), bound(ref.dv_mag));
  };
  EXPECT_EQ(testing::for_each_fixture<TypeParam>("flash_attention", check), 5);
}

// The KV-cache step: k and v are the first S positions of [B, H_kv, capacity, d_k] buffers whose
// positions past S hold NaN, which flash must never read; the result equals the contiguous call.
TYPED_TEST(FlashAttention, StridedHeadsReadOnlyTheCachedPositions) {
  const index_t B = 2, H = 4, H_kv = 2, T = 3, S = 70, capacity = 96, d = 8;
  std::mt19937_64 engine(6);
  const auto q = testing::random_tensor<TypeParam, 4>({B, H, T, d}, engine, -2, 2);
  const auto k = testing::random_tensor<TypeParam, 4>({B, H_kv, S, d}, engine, -2, 2);
  const auto v = testing::random_tensor<TypeParam, 4>({B, H_kv, S, d}, engine);
  Tensor<TypeParam, 4> k_buffer({B, H_kv, capacity, d}), v_buffer({B, H_kv, capacity, d});
  k_buffer.fill(std::numeric_limits<TypeParam>::quiet_NaN());
  v_buffer.fill(std::numeric_limits<TypeParam>::quiet_NaN());
  for (index_t b = 0; b < B; ++b) {
    for (index_t g = 0; g < H_kv; ++g) {
      for (index_t j = 0; j < S; ++j) {
        for (index_t i = 0; i < d; ++i) {
          k_buffer(b, g, j, i) = k(b, g, j, i);
          v_buffer(b, g, j, i) = v(b, g, j, i);
        }
      }
    }
  }
  const HeadMatrices<const TypeParam> k_heads{k_buffer.data(), H_kv, S, d, capacity * d};
  const HeadMatrices<const TypeParam> v_heads{v_buffer.data(), H_kv, S, d, capacity * d};
  for (const bool causal : {true, false}) {
    SCOPED_TRACE(causal ? "causal" : "full");
    Tensor<TypeParam, 4> o(q.shape());
    o.fill(std::numeric_limits<TypeParam>::quiet_NaN());  // never read
    flash_attention_heads_into<TypeParam>(heads_of(q.cview()), k_heads, v_heads, heads_of(o.view()),
                                          B, {.causal = causal});
    EXPECT_TENSOR_EQ(o, flash_attention(q, k, v, {.causal = causal}));
  }
  // And the causal step agrees with attention.hpp's online path on the same heads.
  Tensor<TypeParam, 4> o(q.shape()), online(q.shape());
  flash_attention_heads_into<TypeParam>(heads_of(q.cview()), k_heads, v_heads, heads_of(o.view()),
                                        B);
  causal_attention_heads_into<TypeParam>(heads_of(q.cview()), k_heads, v_heads,
                                         heads_of(online.view()), B);
  EXPECT_TENSOR_NEAR(o, online, 0.0, 64 * testing::unit_roundoff<TypeParam>());
}

// A NaN in one query row poisons that row's output only (IEEE propagation, as torch), and the
// backward's dq row; every other query row stays finite.
TEST(FlashAttention, NonFiniteQueriesPoisonOnlyTheirOwnRow) {
  const Case c{1, 2, 1, 70, 70, 8};
  auto [q, k, v, dout] = inputs_for<float>(c, 7);
  q(0, 1, 40, 3) = std::numeric_limits<float>::quiet_NaN();
  FlashAttentionCache<float> cache;
  const auto o = flash_attention(q, k, v, cache);
  const auto grads = flash_attention_backward(q, k, v, o, cache, dout);
  for (index_t h = 0; h < 2; ++h) {
    for (index_t t = 0; t < c.tokens; ++t) {
      const bool poisoned = h == 1 && t == 40;
      EXPECT_EQ(std::isnan(o(0, h, t, 0)), poisoned) << "o h=" << h << " t=" << t;
      EXPECT_EQ(std::isnan(grads.q(0, h, t, 0)), poisoned) << "dq h=" << h << " t=" << t;
      EXPECT_EQ(std::isnan(cache.lse(0, h, t)), poisoned) << "L h=" << h << " t=" << t;
    }
  }
}

TEST(FlashAttention, FlopsCountTheVisiblePairs) {
  EXPECT_EQ(flash_attention_flops(2, 3, 5, 5, 4, true), causal_attention_flops(2, 3, 5, 5, 4));
  EXPECT_EQ(flash_attention_flops(2, 3, 5, 7, 4, false), 4 * 2 * 3 * 4 * 5 * 7);
  EXPECT_THROW_WITH(flash_attention_flops(1, 1, -1, 3, 4, false), ShapeError,
                    "flash_attention_flops: need sizes >= 0");
}

// ---- memory -------------------------------------------------------------------------------------

/// A field of /proc/self/status in kB (VmHWM: the peak resident set; VmRSS: now).
long status_kb(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
  }
  return -1;
}

/// Resets VmHWM to the current resident set (Linux ≥ 4.0: "5" to clear_refs); false if refused.
bool reset_peak() {
  std::ofstream clear("/proc/self/clear_refs");
  clear << "5";
  clear.flush();
  return static_cast<bool>(clear);
}

/// How far the peak resident set rose above the resident set at the start, in bytes, while
/// `run` ran.
template <class Run>
double peak_growth(Run&& run) {
  if (!reset_peak()) return -1;
  const long before = status_kb("VmRSS");
  run();
  return 1024.0 * static_cast<double>(status_kb("VmHWM") - before);
}

// Flash attention's forward and backward at T = 16,384 (B = H = 1, d_k = 16, float): the peak
// resident memory rises by under 64 MiB, where causal_attention's training cache alone, P
// [1, 1, T, T], would be 1 GiB. The meter is shown to see growth: a touched buffer of twice the
// cap raises it past the cap. Unoptimised builds run T = 4,096 (cap 16 MiB,
// P = 64 MiB); under the sanitizers (whose shadow and quarantine are resident too) the run only
// proves memory safety.
TEST(FlashAttentionMemory, SixteenThousandTokensStayFarUnderTheMaterialisedProbabilities) {
#if defined(DISSECT_TEST_SANITIZED)
  const index_t T = 1024;
  const bool measure = false;
#elif defined(NDEBUG)
  const index_t T = 16384;
  const bool measure = true;
#else
  const index_t T = 4096;
  const bool measure = true;
#endif
  const index_t d = 16;
  const double probs_bytes = double(T) * double(T) * sizeof(float);
  const double cap = std::max(16.0 * (1 << 20), probs_bytes / 16);
  std::mt19937_64 engine(8);
  const auto q = testing::random_tensor<float, 4>({1, 1, T, d}, engine, -2, 2);
  const auto k = testing::random_tensor<float, 4>({1, 1, T, d}, engine, -2, 2);
  const auto v = testing::random_tensor<float, 4>({1, 1, T, d}, engine);
  const auto dout = testing::random_tensor<float, 4>({1, 1, T, d}, engine);
  FlashAttentionCache<float> cache;
  Tensor<float, 4> o;
  QKV<float> grads;
  const double growth = peak_growth([&] {
    o = flash_attention(q, k, v, cache);
    grads = flash_attention_backward(q, k, v, o, cache, dout);
  });
  // The result is attention, not only small: spot-check the last row (it sees every key).
  {
    double top = -INFINITY, sum = 0, out0 = 0;
    std::vector<double> s(T);
    for (index_t j = 0; j < T; ++j) {
      for (index_t i = 0; i < d; ++i) s[j] += double(q(0, 0, T - 1, i)) * k(0, 0, j, i);
      top = std::max(top, s[j] /= 4.0);
    }
    for (index_t j = 0; j < T; ++j) sum += (s[j] = std::exp(s[j] - top));
    for (index_t j = 0; j < T; ++j) out0 += s[j] / sum * v(0, 0, j, 0);
    EXPECT_NEAR(o(0, 0, T - 1, 0), out0, 1e-4);
    for (float x : grads.k) ASSERT_TRUE(std::isfinite(x));
  }
  if (!measure) GTEST_SKIP() << "peak memory is not measured under the sanitizers";
  if (growth < 0) GTEST_SKIP() << "/proc/self/clear_refs refused: the peak cannot be reset";
  RecordProperty("peak_growth_bytes", std::to_string(growth));
  std::printf(
      "T = %td: forward + backward raised the peak resident set by %.1f MiB (cap %.0f MiB; "
      "P would be %.0f MiB)\n",
      T, growth / (1 << 20), cap / (1 << 20), probs_bytes / (1 << 20));
  EXPECT_LT(growth, cap) << "T=" << T << ": the peak rose by " << growth / (1 << 20)
                         << " MiB; the materialised P would be " << probs_bytes / (1 << 20)
                         << " MiB";
  EXPECT_GE(probs_bytes, 4 * cap);
  // The control: the meter does see a buffer of twice the cap, allocated and touched.
  const double control = peak_growth([&] {
    std::vector<float> probs(static_cast<std::size_t>(2 * cap / sizeof(float)), 1.0f);
    volatile float sink = probs[probs.size() / 2];
    (void)sink;
  });
  EXPECT_GT(control, cap) << "the meter did not see a " << 2 * cap / (1 << 20) << " MiB buffer";
}

// ---- refused inputs (reliability rows 90, 91)
// ----------------------------------------------------

TEST(FlashAttentionErrors, BadShapesAndScalesNameTheOpAndShapes) {  // row 90
  const Tensor<float, 4> q({1, 4, 3, 8}), k({1, 2, 5, 8}), v({1, 2, 5, 8});
  EXPECT_THROW_WITH(flash_attention(q, Tensor<float, 4>({1, 2, 5, 4}), v), ShapeError,
                    "flash_attention: k must be [B=1, H_kv, S, d_k=8] for q [1, 4, 3, 8], got "
                    "[1, 2, 5, 4]");
  EXPECT_THROW_WITH(flash_attention(q, k, Tensor<float, 4>({1, 2, 6, 8})), ShapeError,
                    "flash_attention: v must have k's shape [1, 2, 5, 8], got [1, 2, 6, 8]");
  EXPECT_THROW_WITH(flash_attention(q, Tensor<float, 4>({1, 3, 5, 8}),
                                    Tensor<float, 4>({1, 3, 5, 8}), {.causal = false}),
                    ShapeError,
                    "flash_attention: k's heads (axis 1) = 3 must divide q's heads H = 4");
  // Causal needs S ≥ T; without the mask S < T is fine, S = 0 is not.
  const Tensor<float, 4> short_kv({1, 2, 2, 8});
  EXPECT_THROW_WITH(flash_attention(q, short_kv, short_kv), ShapeError,
                    "flash_attention: k holds S = 2 positions (axis 2), fewer than q's T = 3");
  EXPECT_NO_THROW(flash_attention(q, short_kv, short_kv, {.causal = false}));
  const Tensor<float, 4> no_kv({1, 2, 0, 8});
  EXPECT_THROW_WITH(flash_attention(q, no_kv, no_kv, {.causal = false}), ShapeError,
                    "flash_attention: k holds no positions (axis 2) for q's T = 3 queries");
  Tensor<float, 4> o({1, 4, 3, 7});
  EXPECT_THROW_WITH(flash_attention_into(q, k, v, o), ShapeError,
                    "flash_attention: o must have q's shape [1, 4, 3, 8], got [1, 4, 3, 7]");
  Tensor<float, 4> x(q.shape());
  EXPECT_THROW_WITH(flash_attention_into(x, k, v, x), ShapeError,
                    "flash_attention: o must not share memory with q, k or v");
  for (const double bad : {0.0, -0.5, std::nan(""), HUGE_VAL}) {
    FlashAttentionCache<float> cache;
    EXPECT_THROW_WITH(flash_attention(q, k, v, cache, {.scale = bad}), ConfigError,
                      "flash_attention: scale must be finite and > 0");
    EXPECT_EQ(cache.lse.size(), 0);  // a refused forward leaves the cache alone
  }
  // The strided entry point names every operand.
  Tensor<float, 4> out(q.shape());
  EXPECT_THROW_WITH(
      flash_attention_heads_into<float>(heads_of(q.cview()), heads_of(short_kv.cview()),
                                        heads_of(short_kv.cview()), heads_of(out.view()), 1),
      ShapeError, "flash_attention_heads_into: k and v must be alike");
  EXPECT_THROW_WITH(flash_attention_heads_into<float>(heads_of(q.cview()), heads_of(k.cview()),
                                                      heads_of(v.cview()), heads_of(out.view()), 1,
                                                      {.scale = -1.0}),
                    ConfigError, "flash_attention_heads_into: scale must be finite and > 0");
}

TEST(FlashAttentionErrors, ABackwardWhoseCacheOrOutputDoesNotFitIsRefused) {  // row 91
  std::mt19937_64 engine(9);
  const auto q = testing::random_tensor<float, 4>({1, 4, 3, 8}, engine);
  const auto k = testing::random_tensor<float, 4>({1, 2, 5, 8}, engine);
  const auto v = testing::random_tensor<float, 4>({1, 2, 5, 8}, engine);
  const auto dout = testing::random_tensor<float, 4>(q.shape(), engine);
  FlashAttentionCache<float> empty;
  EXPECT_THROW_WITH(flash_attention_backward(q, k, v, q, empty, dout), ShapeError,
                    "flash_attention_backward: cache.lse must be [B, H, T] = [1, 4, 3] for q "
                    "[1, 4, 3, 8], got [0, 0, 0] (fill the cache with flash_attention(q, k, v, "
                    "cache))");
  FlashAttentionCache<float> other;
  const auto q2 = testing::random_tensor<float, 4>({1, 4, 2, 8}, engine);
  flash_attention(q2, k, v, other);
  EXPECT_THROW_WITH(flash_attention_backward(q, k, v, q, other, dout), ShapeError, "got [1, 4, 2]");
  FlashAttentionCache<float> cache;
  const auto o = flash_attention(q, k, v, cache);
  EXPECT_THROW_WITH(flash_attention_backward(q, k, v, Tensor<float, 4>({1, 4, 3, 4}), cache, dout),
                    ShapeError, "flash_attention_backward: o must have q's shape [1, 4, 3, 8]");
  EXPECT_THROW_WITH(flash_attention_backward(q, k, v, o, cache, Tensor<float, 4>({1, 4, 4, 8})),
                    ShapeError, "flash_attention_backward: dout must have q's shape");
  auto bad_scale = cache;
  bad_scale.options.scale = std::nan("");
  EXPECT_THROW_WITH(flash_attention_backward(q, k, v, o, bad_scale, dout), ConfigError,
                    "flash_attention_backward: scale must be finite and > 0");
  // A cache filled without the mask keeps that: backward differentiates the forward it ran.
  FlashAttentionCache<float> full;
  const auto o_full = flash_attention(q, k, v, full, {.causal = false});
  EXPECT_FALSE(full.options.causal);
  const auto g_full = flash_attention_backward(q, k, v, o_full, full, dout);
  const auto g_causal = flash_attention_backward(q, k, v, o, cache, dout);
  double difference = 0;
  for (index_t i = 0; i < g_full.k.size(); ++i) {
    difference = std::max(difference, double(std::abs(g_full.k.data()[i] - g_causal.k.data()[i])));
  }
  EXPECT_GT(difference, 1e-3);
}

}  // namespace test_flash_attention
}  // namespace dissect
