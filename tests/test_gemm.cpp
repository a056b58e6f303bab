// Tests for dissect/kernels/gemm.hpp, packed_weight.hpp and epilogue.hpp, and for the packed
// inference forward of Linear, the blocks and the models: every code path this CPU supports,
// pinned one at a time, against a double-precision oracle and against the unfused composition,
// over random shapes with every edge; the training products on the same driver; no allocation
// per call; errors.
//
// The bounds. A float dot product of n terms summed in any order is within γ_n·Σ|x_k·w_k| of the
// exact value (γ_n = n·u/(1 − n·u), u = 2⁻²⁴); adding the bias is one more term. An activation
// f with |f′| ≤ L (relu 1, silu 1.1, gelu 1.13, gelu_tanh 1.13) carries an input error e to
// L·e, plus its own approximation error (activation_bound, kernels/detail/vector_math_bounds.hpp);
// a product g·v carries |v|·e_g + |g|·e_v; each final add or multiply rounds once more (u·|y|).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dissect/blocks.hpp"
#include "dissect/kernels/gemm.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/transforms/quantize.hpp"
#include "support/allocation_counter.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_gemm {

using quant::KernelPath;

constexpr double u32 = 0x1.0p-24;

double gamma(index_t n) {
  return double(n) * u32 / (1.0 - double(n) * u32);
}

/// The paths the GEMM has that this CPU runs.
std::vector<KernelPath> gemm_paths() {
  std::vector<KernelPath> paths;
  for (auto p : {KernelPath::scalar, KernelPath::avx2, KernelPath::avx512}) {
    if (quant::cpu_supports(p)) paths.push_back(p);
  }
  return paths;
}

/// |f′| over the reals: how much an activation can amplify an error in its input.
double lipschitz(std::optional<Activation> a) {
  if (!a) return 1.0;
  switch (*a) {
    case Activation::relu:
      return 1.0;
    case Activation::silu:
      return 1.1;
    default:
      return 1.13;
  }
}

double activation_exact(Activation a, double v) {
  switch (a) {
    case Activation::relu:
      return v > 0 ? v : 0;
    case Activation::gelu:
      return v * 0.5 * std::erfc(-v / std::sqrt(2.0));
    case Activation::gelu_tanh:
      return 0.5 * v * (1 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    case Activation::silu:
      return v / (1 + std::exp(-v));
  }
  return 0;
}

/// One random problem: x [m, K] (row stride ldx, offset by `shift` floats so rows are
/// unaligned), W (and, gated, the up weight) [N, K], biases, a residual, y [m, N] at ldy.
struct Problem {
  index_t m, n, k, ldx, ldy;
  bool gated;
  std::vector<float> x, w, w_up, bias, up_bias, residual, y;
  int shift;
  const float* xp() const { return x.data() + shift; }
  float* yp() { return y.data() + shift; }
};

Problem random_problem(std::mt19937_64& rng) {
  static constexpr index_t edges[] = {1,  2,  3,  7,  8,  12, 13, 15, 16, 17,
                                      24, 31, 32, 33, 47, 48, 63, 64, 65};
  auto pick = [&](index_t cap) {
    return rng() % 4 == 0 ? index_t(1 + rng() % cap) : edges[rng() % std::size(edges)];
  };
  Problem p;
  p.m = pick(80);
  p.n = pick(120);
  p.k = rng() % 20 == 0 ? 300 + index_t(rng() % 300) : pick(100);  // some cross a depth block
  p.gated = rng() % 4 == 0;
  p.ldx = p.k + index_t(rng() % 3);
  p.ldy = p.n + index_t(rng() % 3);
  p.shift = int(rng() % 2);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& v, index_t size) {
    v.resize(std::size_t(size + 1));
    for (auto& f : v) f = value(rng);
  };
  fill(p.x, p.m * p.ldx);
  fill(p.w, p.n * p.k);
  fill(p.w_up, p.n * p.k);
  fill(p.bias, p.n);
  fill(p.up_bias, p.n);
  fill(p.residual, p.m * p.n);
  p.y.assign(std::size_t(p.m * p.ldy + 1), -7.0f);
  return p;
}

/// The double-precision value of output (i, j) and the bound its float result must meet.
struct Expected {
  double value, bound;
  double pre, activated, up;  ///< a + bias, act(a + bias), and (gated) the up projection
};

Expected oracle(const Problem& p, const Epilogue& e, index_t i, index_t j, bool drop_last = false) {
  double g = e.bias ? e.bias[j] : 0.0, g_abs = e.bias ? std::abs(e.bias[j]) : 0.0;
  double v = e.up_bias ? e.up_bias[j] : 0.0, v_abs = std::abs(v);
  const index_t terms = drop_last ? p.k - 1 : p.k;
  for (index_t k = 0; k < terms; ++k) {
    const double x = p.xp()[i * p.ldx + k];
    g += x * p.w[j * p.k + k];
    g_abs += std::abs(x * p.w[j * p.k + k]);
    if (p.gated) {
      v += x * p.w_up[j * p.k + k];
      v_abs += std::abs(x * p.w_up[j * p.k + k]);
    }
  }
  const double eg = gamma(p.k + 1) * g_abs;
  const double pre = g, up = v;
  double value = g, bound = eg;
  if (e.activation) {
    value = activation_exact(*e.activation, g);
    const auto approx = kernels::detail::activation_bound(*e.activation);
    bound = lipschitz(e.activation) * eg + approx.allowed(g, value) + u32 * std::abs(value);
  }
  const double activated = value;
  if (p.gated) {
    const double ev = gamma(p.k + 1) * v_abs;
    bound = bound * std::abs(v) + (std::abs(value) + bound) * ev + u32 * std::abs(value * v);
    value *= v;
  }
  if (e.residual) {
    value += e.residual[i * e.residual_stride + j];
    bound += u32 * (std::abs(value) + bound);
  }
  return {value, bound * 1.01 + 1e-30, pre, activated, up};
}

Epilogue random_epilogue(const Problem& p, std::mt19937_64& rng) {
  Epilogue e;
  if (rng() % 3) e.bias = p.bias.data();
  if (p.gated && rng() % 2) e.up_bias = p.up_bias.data();
  switch (rng() % 6) {
    case 0:
      break;
    case 1:
      e.activation = Activation::relu;
      break;
    case 2:
      e.activation = Activation::gelu;
      break;
    case 3:
      e.activation = Activation::gelu_tanh;
      break;
    default:
      e.activation = Activation::silu;
  }
  if (rng() % 3 == 0) {
    e.residual = p.residual.data();
    e.residual_stride = p.n;
  }
  return e;
}

PackedWeight pack(const Problem& p) {
  return p.gated ? PackedWeight::gated(p.w.data(), p.w_up.data(), p.n, p.k, p.k, p.k)
                 : PackedWeight(p.w.data(), p.n, p.k, p.k);
}

/// The unfused composition on the same path: the plain products, then bias, activation,
/// gating and residual in float through activation.hpp's scalar functions.
std::vector<float> unfused(const Problem& p, const Epilogue& e, KernelPath path) {
  const testing::ScopedKernelPath pin(path);
  std::vector<float> g(std::size_t(p.m * p.n)), v(std::size_t(p.m * p.n));
  PackedWeight wg(p.w.data(), p.n, p.k, p.k);
  packed_matmul(p.xp(), p.ldx, p.m, wg, g.data(), p.n);
  if (p.gated) {
    PackedWeight wu(p.w_up.data(), p.n, p.k, p.k);
    packed_matmul(p.xp(), p.ldx, p.m, wu, v.data(), p.n);
  }
  std::vector<float> out(g.size());
  for (index_t i = 0; i < p.m; ++i) {
    for (index_t j = 0; j < p.n; ++j) {
      float a = g[std::size_t(i * p.n + j)] + (e.bias ? e.bias[j] : 0.0f);
      if (e.activation) {
        a = detail::with_activation(*e.activation, "test", [&](auto act) {
          return detail::activation_value<decltype(act)::value>(a);
        });
      }
      if (p.gated) a *= v[std::size_t(i * p.n + j)] + (e.up_bias ? e.up_bias[j] : 0.0f);
      if (e.residual) a += e.residual[i * e.residual_stride + j];
      out[std::size_t(i * p.n + j)] = a;
    }
  }
  return out;
}

// ---- packed_matmul: 1,000 random shapes × every path ------------------------------------------

TEST(PackedMatmul, AgreesWithTheOracleAndTheUnfusedCompositionOnEveryPath) {
  std::mt19937_64 rng(20261201);
  const auto paths = gemm_paths();
  long checked = 0;
  for (int trial = 0; trial < 1000; ++trial) {
    Problem p = random_problem(rng);
    const Epilogue e = random_epilogue(p, rng);
    const PackedWeight w = pack(p);
    for (KernelPath path : paths) {
      const testing::ScopedKernelPath pin(path);
      std::fill(p.y.begin(), p.y.end(), -7.0f);
      packed_matmul(p.xp(), p.ldx, p.m, w, p.yp(), p.ldy, e, trial % 2 ? 2 : 0);
      const auto composed = unfused(p, e, path);
      for (index_t i = 0; i < p.m; ++i) {
        for (index_t j = 0; j < p.ldy; ++j) {
          const float y = p.yp()[i * p.ldy + j];
          if (j >= p.n) {  // the padding of each row is never written
            ASSERT_EQ(y, -7.0f) << "row " << i << " col " << j << " written past N";
            continue;
          }
          const Expected want = oracle(p, e, i, j);
          ASSERT_LE(std::abs(y - want.value), want.bound)
              << "path " << quant::kernel_path_name(path) << " m " << p.m << " n " << p.n << " k "
              << p.k << (p.gated ? " gated" : "") << " at (" << i << ", " << j << ")";
          // Fused and unfused sum the same products in the same order; they differ only by the
          // vectorised activation's error (and the scalar's), amplified by the gate.
          // Each side may also round its last multiply-add once more or once less (an FMA).
          const float c = composed[std::size_t(i * p.n + j)];
          double approx = 0;
          if (e.activation) {
            // The scalar float activations round their argument first (−x/√2 for erfc, the
            // cubic for gelu_tanh), which the tails amplify: ~(2g² + 0.3|g|³ + 6|g|)·u relative.
            const double g = std::abs(want.pre);
            approx = 2 * kernels::detail::activation_bound(*e.activation)
                             .allowed(want.pre, want.activated) +
                     (8 + 6 * g + 2 * g * g + 0.3 * g * g * g) * u32 * std::abs(want.activated);
          }
          const double product =
              std::abs(want.activated) * (p.gated ? std::abs(want.up) : 1.0) + approx;
          if (p.gated) approx *= std::abs(want.up) * (1 + 4 * u32);
          approx += 4 * u32 * (product + (e.residual ? std::abs(e.residual[i * p.n + j]) : 0.0));
          ASSERT_LE(std::abs(y - c), approx + 1e-30)
              << "fused vs unfused, path " << quant::kernel_path_name(path) << " at (" << i << ", "
              << j << ")";
          ++checked;
        }
      }
      ASSERT_EQ(p.y[0] == -7.0f || p.shift == 0, true);  // nothing before y either
    }
  }
  EXPECT_GT(checked, 1000000);
}

TEST(PackedMatmul, TheBoundCatchesAProductWrongByOneTerm) {
  // A kernel that skipped the last depth step must fail the bound above: it is not vacuous.
  std::mt19937_64 rng(5);
  Problem p = random_problem(rng);
  p.m = 4;
  p.n = 40;
  p.k = 64;
  p = [&] {
    Problem q = p;
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    q.ldx = q.k;
    q.ldy = q.n;
    q.shift = 0;
    q.gated = false;
    q.x.assign(std::size_t(q.m * q.k + 1), 0.0f);
    q.w.assign(std::size_t(q.n * q.k + 1), 0.0f);
    for (auto& f : q.x) f = value(rng);
    for (auto& f : q.w) f = value(rng);
    q.y.assign(std::size_t(q.m * q.n + 1), 0.0f);
    return q;
  }();
  const PackedWeight w = pack(p);
  packed_matmul(p.xp(), p.ldx, p.m, w, p.yp(), p.ldy);
  int caught = 0;
  for (index_t i = 0; i < p.m; ++i) {
    for (index_t j = 0; j < p.n; ++j) {
      const Expected right = oracle(p, {}, i, j), wrong = oracle(p, {}, i, j, true);
      EXPECT_LE(std::abs(p.yp()[i * p.n + j] - right.value), right.bound);
      caught += std::abs(p.yp()[i * p.n + j] - wrong.value) > wrong.bound;
    }
  }
  EXPECT_EQ(caught, p.m * p.n);
}

TEST(PackedMatmul, ResultDoesNotDependOnTheThreadCount) {
  std::mt19937_64 rng(11);
  Problem p = random_problem(rng);
  const PackedWeight w = pack(p);
  packed_matmul(p.xp(), p.ldx, p.m, w, p.yp(), p.ldy, {}, 1);
  const auto one = p.y;
  packed_matmul(p.xp(), p.ldx, p.m, w, p.yp(), p.ldy, {}, 2);
  EXPECT_EQ(one, p.y);
}

TEST(PackedMatmul, EmptyDepthWritesTheEpilogueOfZero) {
  const std::vector<float> bias{1.0f, -2.0f, 3.0f}, residual{0.5f, 0.5f, 0.5f};
  PackedWeight w(nullptr, 3, 0, 0);
  std::vector<float> y(3, 99.0f);
  Epilogue e;
  e.bias = bias.data();
  e.activation = Activation::relu;
  e.residual = residual.data();
  e.residual_stride = 3;
  packed_matmul(nullptr, 0, 1, w, y.data(), 3, e);
  EXPECT_EQ(y, (std::vector<float>{1.5f, 0.5f, 3.5f}));
}

TEST(PackedMatmul, DefaultFlagsBuildRunsTheWidestPathTheCpuHas) {
  // This test binary is built without -march flags: the kernels carry their own targets.
  const testing::ScopedKernelPath unpinned(std::nullopt);
  if (quant::cpu_supports(KernelPath::avx512)) {
    EXPECT_EQ(gemm_kernel_path(), KernelPath::avx512);
  } else if (quant::cpu_supports(KernelPath::avx2)) {
    EXPECT_EQ(gemm_kernel_path(), KernelPath::avx2);
  } else {
    EXPECT_EQ(gemm_kernel_path(), KernelPath::scalar);
  }
  if (quant::cpu_supports(KernelPath::avx512_vnni)) {
    const testing::ScopedKernelPath vnni(KernelPath::avx512_vnni);
    EXPECT_EQ(gemm_kernel_path(), KernelPath::avx512);  // the fp32 GEMM's widest path
  }
}

TEST(PackedMatmul, RefusesBadCallsNamingTheShapes) {
  std::vector<float> w(12, 1.0f), x(12, 1.0f), y(12, 0.0f), bias(4, 0.0f);
  const PackedWeight packed(w.data(), 4, 3, 3);  // N = 4, K = 3
  EXPECT_THROW_WITH(packed_matmul(x.data(), 2, 1, packed, y.data(), 4), ShapeError,
                    "x's row stride is smaller than K: x [1, 3] (row stride 2), W [4, 3]");
  EXPECT_THROW_WITH(packed_matmul(x.data(), 3, 1, packed, y.data(), 3), ShapeError,
                    "y's row stride is smaller than N");
  EXPECT_THROW_WITH(packed_matmul(x.data(), 3, -1, packed, y.data(), 4), ShapeError,
                    "negative row count");
  EXPECT_THROW_WITH(packed_matmul(x.data(), 3, 1, packed, y.data(), 4, {}, -1), ConfigError,
                    "threads = -1");
  Epilogue up;
  up.up_bias = bias.data();
  EXPECT_THROW_WITH(packed_matmul(x.data(), 3, 1, packed, y.data(), 4, up), ConfigError,
                    "up_bias needs a gated weight");
  Epilogue aliasing;
  aliasing.residual = y.data() + 2;
  aliasing.residual_stride = 4;
  EXPECT_THROW_WITH(packed_matmul(x.data(), 3, 2, packed, y.data(), 4, aliasing), ShapeError,
                    "the residual overlaps y");
  EXPECT_THROW_WITH(packed_matmul(y.data() + 1, 3, 2, packed, y.data(), 4), ShapeError,
                    "x overlaps y");
  EXPECT_THROW_WITH(packed_matmul(x.data(), 3, 1, packed, nullptr, 4), Error, "null x or y");
  EXPECT_THROW_WITH(PackedWeight(w.data(), -1, 3, 3), ShapeError, "negative extent");
  EXPECT_THROW_WITH(PackedWeight(w.data(), 4, 3, 2), ShapeError, "row stride 2 < its 3 columns");
  EXPECT_THROW_WITH(PackedWeight(nullptr, 4, 3, 3), Error, "null pointer");
  EXPECT_THROW_WITH(PackedWeight::gated(w.data(), nullptr, 4, 3, 3, 3), Error, "(up)");
}

TEST(PackedWeight, LaysOutPanelsOfSixteenZeroPadded) {
  std::vector<float> w(18 * 2);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = float(i + 1);
  const PackedWeight p(w.data(), 18, 2, 2);  // features 0..17, two panels
  ASSERT_EQ(p.panels(), 2);
  EXPECT_EQ(p.panel(0)[0 * 16 + 5], w[5 * 2 + 0]);   // feature 5, k 0
  EXPECT_EQ(p.panel(0)[1 * 16 + 5], w[5 * 2 + 1]);   // feature 5, k 1
  EXPECT_EQ(p.panel(1)[1 * 16 + 1], w[17 * 2 + 1]);  // feature 17, k 1
  EXPECT_EQ(p.panel(1)[0 * 16 + 2], 0.0f);           // padding
  const PackedWeight g = PackedWeight::gated(w.data(), w.data() + 2, 17, 2, 2, 2);
  EXPECT_EQ(g.panels(), 4);                         // gate, up, gate, up
  EXPECT_EQ(g.panel(1)[0 * 16 + 3], w[2 + 3 * 2]);  // up feature 3, k 0
  EXPECT_EQ(g.out_features(), 17);
}

// ---- the training products on the same driver ---------------------------------------------------

TEST(TrainingProducts, MatchTheOracleOnEveryPathWithStridedViews) {
  std::mt19937_64 rng(99);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (int trial = 0; trial < 60; ++trial) {
    const index_t m = 1 + index_t(rng() % 70), in = 1 + index_t(rng() % 90),
                  out = 1 + index_t(rng() % 90), pad = index_t(rng() % 3);
    RowMatrix<float> xs(m, in + pad), ws(out, in + pad), dys(m, out + pad);
    for (auto* a : {&xs, &ws, &dys}) a->setRandom();
    ConstMatrixRef<float> x(xs.leftCols(in)), w(ws.leftCols(in)), dy(dys.leftCols(out));
    RowMatrix<float> b = RowMatrix<float>::Random(out, 1);
    const ConstVectorMap<float> bias(b.data(), out);
    for (KernelPath path : gemm_paths()) {
      const testing::ScopedKernelPath pin(path);
      RowMatrix<float> y(m, out), dx(m, in), dw = RowMatrix<float>::Constant(out, in, 0.5f);
      RowMatrix<float> db_store = RowMatrix<float>::Constant(out, 1, 0.25f);
      linear_forward<float>(x, w, bias, y);
      linear_backward<float>(x, w, dy, dx, dw, VectorMap<float>(db_store.data(), out));
      for (index_t i = 0; i < m; ++i) {
        for (index_t j = 0; j < out; ++j) {
          double s = b(j), a = std::abs(b(j));
          for (index_t k = 0; k < in; ++k) {
            s += double(x(i, k)) * w(j, k);
            a += std::abs(double(x(i, k)) * w(j, k));
          }
          ASSERT_LE(std::abs(y(i, j) - s), gamma(in + 1) * a + 1e-30)
              << quant::kernel_path_name(path) << " y";
        }
        for (index_t k = 0; k < in; ++k) {
          double s = 0, a = 0;
          for (index_t j = 0; j < out; ++j) {
            s += double(dy(i, j)) * w(j, k);
            a += std::abs(double(dy(i, j)) * w(j, k));
          }
          ASSERT_LE(std::abs(dx(i, k) - s), gamma(out) * a + 1e-30)
              << quant::kernel_path_name(path) << " dx";
        }
      }
      for (index_t j = 0; j < out; ++j) {
        for (index_t k = 0; k < in; ++k) {
          double s = 0.5, a = 0.5;  // accumulated into
          for (index_t i = 0; i < m; ++i) {
            s += double(dy(i, j)) * x(i, k);
            a += std::abs(double(dy(i, j)) * x(i, k));
          }
          ASSERT_LE(std::abs(dw(j, k) - s), gamma(m + 1) * a + 1e-30)
              << quant::kernel_path_name(path) << " dW";
        }
        double s = 0.25;
        for (index_t i = 0; i < m; ++i) s += dy(i, j);
        ASSERT_NEAR(db_store(j), s, gamma(m + 1) * (0.25 + m));
      }
    }
  }
}

TEST(TrainingProducts, AllocateNothingOnceWarm) {
  // The 7B FFN shapes would take seconds here; the workspace logic is the same at any size.
  const index_t m = 64, in = 300, out = 520;
  RowMatrix<float> x = RowMatrix<float>::Random(m, in), w = RowMatrix<float>::Random(out, in),
                   dy = RowMatrix<float>::Random(m, out), y(m, out), dx(m, in),
                   dw = RowMatrix<float>::Zero(out, in);
  RowMatrix<float> b = RowMatrix<float>::Random(out, 1), db = RowMatrix<float>::Zero(out, 1);
  const ConstVectorMap<float> bias(b.data(), out);
  auto step = [&] {
    linear_forward<float>(x, w, bias, y);
    linear_backward<float>(x, w, dy, dx, dw, VectorMap<float>(db.data(), out));
  };
  step();  // grows this thread's workspace
  const long before = testing::allocation_count();
  for (int i = 0; i < 3; ++i) step();
  const long allocations = testing::allocation_count() - before;
  if (gemm_kernel_path() != KernelPath::scalar) {
    EXPECT_EQ(allocations, 0);
  }
}

// ---- packed layers, blocks and models -----------------------------------------------------------

/// max |a − b| / (1 + |b|) over two tensors of one shape.
template <class A, class B>
double max_relative_gap(const A& a, const B& b) {
  double gap = 0;
  for (index_t i = 0; i < a.size(); ++i) {
    gap = std::max(gap, std::abs(double(a.data()[i]) - b.data()[i]) / (1 + std::abs(b.data()[i])));
  }
  return gap;
}

Tensor<float, 3> random_tokens(index_t b, index_t t, index_t d, std::uint64_t seed) {
  Tensor<float, 3> x({b, t, d});
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = normal(rng);
  return x;
}

TEST(PackedLinear, ForwardMatchesUnpackedAndRepacksOnEveryWeightChange) {
  Linear<float> layer(40, 70, {.seed = 3});
  const auto x = random_tokens(2, 5, 40, 1);
  const auto plain = layer.forward(x);
  layer.pack();
  EXPECT_TRUE(layer.packed());
  EXPECT_TRUE(layer.frozen());
  EXPECT_LT(max_relative_gap(layer.forward(x), plain), 1e-5);
  // set_weight repacks: the packed forward sees the new weight.
  Tensor<float, 2> doubled({70, 40});
  doubled.vector() = layer.weight().vector() * 2.0f;
  layer.set_weight(doubled);
  Linear<float> reference(doubled, Tensor<float, 1>(layer.bias()));
  EXPECT_LT(max_relative_gap(layer.forward(x), reference.forward(x)), 1e-5);
  // An adapter runs beside the packed product; merging repacks.
  auto& adapter = layer.attach_adapter({.rank = 2, .alpha = 4, .seed = 8});
  adapter.B().fill(0.1f);
  const auto adapted = layer.forward(x);
  layer.merge_adapter();
  EXPECT_LT(max_relative_gap(layer.forward(x), adapted), 1e-5);
  layer.unmerge_adapter();
  EXPECT_LT(max_relative_gap(layer.forward(x), adapted), 1e-5);
  // Training unpacks; quantised layers refuse to pack.
  layer.detach_adapter();
  layer.set_frozen(false);
  EXPECT_FALSE(layer.packed());
  layer.quantize(WeightFormat::int8);
  EXPECT_THROW_WITH(layer.pack(), Error, "dequantize() the layer first");
  std::ostringstream printed;
  Linear<float> shown(4, 4, {.seed = 1});
  shown.pack();
  printed << shown;
  EXPECT_NE(printed.str().find(", packed"), std::string::npos);
}

template <class Block>
void expect_fused_equals_unfused(Block& block, index_t d) {
  const auto x = random_tokens(2, 7, d, 2);
  const auto residual = random_tokens(2, 7, d, 3);
  const auto plain = block.forward(x);
  const auto plain_residual = block.forward(x, residual);
  block.pack();
  ASSERT_TRUE(block.packed());
  // The fused forward differs from the unfused one by the reduction order of the packed GEMM
  // and the vectorised activation: far below 1e-5 relative at these widths.
  EXPECT_LT(max_relative_gap(block.forward(x), plain), 1e-5);
  EXPECT_LT(max_relative_gap(block.forward(x, residual), plain_residual), 1e-5);
  block.unpack();
  EXPECT_FALSE(block.packed());
  EXPECT_LT(max_relative_gap(block.forward(x), plain), 1e-6);
}

TEST(PackedBlocks, FusedFeedForwardMatchesUnfusedForEveryActivation) {
  for (Activation a :
       {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu}) {
    SCOPED_TRACE(to_string(a));
    FeedForward<float> ffn(24, 72, a, {.seed = 5});
    expect_fused_equals_unfused(ffn, 24);
  }
}

TEST(PackedBlocks, FusedSwiGLUMatchesUnfusedWithAndWithoutBiases) {
  for (bool bias : {false, true}) {
    GatedFeedForward<float> ffn(24, 40, {.bias = bias, .seed = 6});
    expect_fused_equals_unfused(ffn, 24);
  }
}

TEST(PackedBlocks, AStaleGatedPackingFallsBackToTheUnfusedForward) {
  GatedFeedForward<float> ffn(16, 32, {.seed = 9});
  const auto x = random_tokens(1, 3, 16, 4);
  ffn.pack();
  Tensor<float, 2> zero({32, 16});
  ffn.gate().set_weight(zero);  // the side-by-side copy no longer matches
  EXPECT_FALSE(ffn.packed());
  const auto y = ffn.forward(x);
  for (index_t i = 0; i < y.size(); ++i) EXPECT_EQ(y.data()[i], 0.0f) << "silu(0)·up = 0";
}

TEST(PackedBlocks, AttentionOutputFusesTheResidualAndChecksIt) {
  AttentionOutput<float> proj(32, 4, {.seed = 2});
  Tensor<float, 4> a({2, 4, 3, 8});
  for (index_t i = 0; i < a.size(); ++i) a.data()[i] = float(i % 13) * 0.1f - 0.6f;
  const auto residual = random_tokens(2, 3, 32, 7);
  auto expected = proj.forward(a);
  expected.vector() += residual.vector();
  proj.pack();
  EXPECT_LT(max_relative_gap(proj.forward(a, residual), expected), 1e-5);
  EXPECT_THROW_WITH(proj.forward(a, random_tokens(2, 4, 32, 1)), ShapeError, "residual");
}

TEST(PackedModels, PackedLogitsMatchUnpackedForGpt2AndLlama) {
  {
    GPT2Model<float> model(testing::small_gpt2(), {.seed = 1});
    const auto ids = testing::random_ids(6, 23, 1);
    const TokenBatch tokens{ids, 2, 3};
    const auto plain = model.forward(tokens);
    model.pack();
    EXPECT_LT(max_relative_gap(model.forward(tokens), plain), 1e-5);
  }
  {
    LlamaModel<float> model(testing::quantisable_llama(), {.seed = 2});
    const auto ids = testing::random_ids(4, 37, 2);
    const TokenBatch tokens{ids, 1, 4};
    const auto plain = model.forward(tokens);
    model.pack();
    EXPECT_LT(max_relative_gap(model.forward(tokens), plain), 1e-5);
  }
}

}  // namespace test_gemm
}  // namespace dissect
