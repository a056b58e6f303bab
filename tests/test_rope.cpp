// Tests for dissect/layers/rope.hpp: hand-derived rotations, the table against the formula, Hugging
// Face's LLaMA rotary embedding (PyTorch fixtures, float32 and float64, offsets 0 and 5, d_k 8 and
// 64, theta 10⁴ and 5·10⁵), finite differences in double, the algebra of rotations (pair norms
// kept, offsets compose, q·k depends only on the position difference, backward inverts forward),
// in-place use, the growing table a model holds (sized by the positions asked, its entries the
// full table's bit for bit), and every bad input with its type and message.
#include "dissect/layers/rope.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_rope {

using testing::random_tensor;
using testing::snapshot;

template <class Scalar>
class RopeTyped : public ::testing::Test {};
TYPED_TEST_SUITE(RopeTyped, testing::FloatAndDouble);

/// Per-element bound on |rope(x) − exact| + |reference − exact| for two implementations that
/// each round θ_i, the angle p·θ_i (relative error a few u, so an absolute error ~ p·u), cos and
/// sin, two products and a sum: (|x_i| + |x_{i+d/2}|)·u·(8 + 4p) for both members of pair i.
template <class Scalar>
Tensor<double, 4> rotation_bound(const ConstTensorView<Scalar, 4>& x, index_t offset) {
  const auto& shape = x.shape();
  const index_t half = shape[3] / 2;
  Tensor<double, 4> bound(shape);
  for (index_t r = 0; r < leading_count(shape); ++r) {
    const double position = static_cast<double>(offset + r % shape[2]);
    for (index_t i = 0; i < half; ++i) {
      const double pair = std::abs(double(x.data()[r * 2 * half + i])) +
                          std::abs(double(x.data()[r * 2 * half + i + half]));
      const double b = pair * testing::unit_roundoff<Scalar>() * (8 + 4 * position);
      bound.data()[r * 2 * half + i] = b;
      bound.data()[r * 2 * half + i + half] = b;
    }
  }
  return bound;
}

// ---- hand-derived values ------------------------------------------------------------------------

TEST(Rope, RotatesEachPairByPositionTimesItsFrequency) {
  // d_k = 4, theta = 100: θ_0 = 100⁰ = 1 and θ_1 = 100^(−2/4) = 0.1; pairs (0, 2) and (1, 3).
  // x = (1, 2, 0, 0) at position p: pair 0 is (1, 0) → (cos p, sin p); pair 1 is (2, 0) →
  // (2 cos 0.1p, 2 sin 0.1p). In the output layout: (cos p, 2 cos 0.1p, sin p, 2 sin 0.1p).
  const RotaryTable<double> table(4, 10, 100.0);
  Tensor<double, 4> x({1, 1, 3, 4});
  for (index_t t = 0; t < 3; ++t) {
    x(0, 0, t, 0) = 1;
    x(0, 0, t, 1) = 2;
  }
  const auto y = apply_rope(x, 2, table);  // positions 2, 3, 4
  for (index_t t = 0; t < 3; ++t) {
    const double p = static_cast<double>(2 + t);
    EXPECT_NEAR(y(0, 0, t, 0), std::cos(p), 1e-15);
    EXPECT_NEAR(y(0, 0, t, 1), 2 * std::cos(0.1 * p), 1e-15);
    EXPECT_NEAR(y(0, 0, t, 2), std::sin(p), 1e-15);
    EXPECT_NEAR(y(0, 0, t, 3), 2 * std::sin(0.1 * p), 1e-15);
  }
  // Position 0 is the identity, exactly.
  std::mt19937_64 engine(1);
  const auto z = random_tensor<double, 4>({2, 2, 1, 4}, engine);
  EXPECT_TENSOR_EQ(apply_rope(z, 0, table), z);
}

TEST(Rope, TableHoldsCosAndSinOfTheDoubleAngleRoundedOnce) {
  const RotaryTable<float> table(64, 4096, 500000.0);
  EXPECT_EQ(table.cos().shape(), (Shape<2>{4096, 32}));
  EXPECT_EQ(table.head_dim(), 64);
  EXPECT_EQ(table.max_positions(), 4096);
  EXPECT_EQ(table.theta(), 500000.0);
  for (index_t p : {0, 1, 7, 1000, 4095}) {
    for (index_t i : {0, 1, 13, 31}) {
      const double angle = static_cast<double>(p) * std::pow(500000.0, -2.0 * i / 64.0);
      EXPECT_EQ(table.cos()(p, i), static_cast<float>(std::cos(angle))) << p << " " << i;
      EXPECT_EQ(table.sin()(p, i), static_cast<float>(std::sin(angle))) << p << " " << i;
    }
  }
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

TYPED_TEST(RopeTyped, AgreeWithHuggingFaceLlamaRotaryEmbeddingAndAutograd) {
  using Scalar = TypeParam;
  const auto check = [](const testing::Fixture& fixture) {
    const index_t offset = fixture.meta_int("offset");
    const auto x = testing::tensor_from<Scalar, 4>(fixture.tensor("x"));
    const auto y_torch = testing::tensor_from<Scalar, 4>(fixture.tensor("y"));
    const auto dy = testing::tensor_from<Scalar, 4>(fixture.tensor("dy"));
    const auto dx_torch = testing::tensor_from<Scalar, 4>(fixture.tensor("dx"));
    const RotaryTable<Scalar> table(fixture.meta_int("d_k"), offset + fixture.meta_int("T"),
                                    static_cast<double>(fixture.meta_int("theta")));
    EXPECT_TENSOR_WITHIN(apply_rope(x, offset, table), y_torch, rotation_bound(x.view(), offset));
    EXPECT_TENSOR_WITHIN(rope_backward(dy, offset, table), dx_torch,
                         rotation_bound(dy.view(), offset));
  };
  EXPECT_EQ(testing::for_each_fixture<Scalar>("rope", check), 6);
}

// ---- finite differences -------------------------------------------------------------------------

TEST(RopeGradients, BackwardMatchesFiniteDifferences) {
  // L = Σ dy ⊙ rope(x) is linear in x: the central difference is exact up to the loss's own
  // rounding, which the default tolerance covers.
  std::mt19937_64 engine(17);
  for (int trial = 0; trial < 30; ++trial) {
    const Shape<4> shape{
        1 + static_cast<index_t>(engine() % 2), 1 + static_cast<index_t>(engine() % 3),
        1 + static_cast<index_t>(engine() % 4), 2 * (1 + static_cast<index_t>(engine() % 5))};
    const index_t offset = static_cast<index_t>(engine() % 20);
    const double theta = trial % 2 ? 10000.0 : 500000.0;
    SCOPED_TRACE(format_shape(shape) + " offset " + std::to_string(offset));
    const RotaryTable<double> table(shape[3], offset + shape[2], theta);
    auto x = random_tensor<double, 4>(shape, engine);
    const auto dy = random_tensor<double, 4>(shape, engine);
    const auto dx = rope_backward(dy, offset, table);
    const auto loss = [&] {
      const auto y = apply_rope(x, offset, table);
      double total = 0;
      for (index_t i = 0; i < y.size(); ++i) total += dy.data()[i] * y.data()[i];
      return total;
    };
    ASSERT_GRADIENT_OK(testing::gradcheck(loss, x, dx));
  }
}

// ---- algebra ------------------------------------------------------------------------------------

TYPED_TEST(RopeTyped, KeepsTheNormOfEveryPair) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(3);
  const RotaryTable<Scalar> table(16, 300, 10000.0);
  for (int trial = 0; trial < 100; ++trial) {
    const auto x = random_tensor<Scalar, 4>({2, 2, 3, 16}, engine, -4, 4);
    const index_t offset = static_cast<index_t>(engine() % 297);
    const auto y = apply_rope(x, offset, table);
    for (index_t r = 0; r < 12; ++r) {
      for (index_t i = 0; i < 8; ++i) {
        const auto norm = [&](const Tensor<Scalar, 4>& t) {
          const double a = t.data()[r * 16 + i], b = t.data()[r * 16 + i + 8];
          return a * a + b * b;
        };
        // cos² + sin² = 1 within 2u, and four roundings in each of y's two elements.
        ASSERT_NEAR(norm(y), norm(x), 16 * testing::unit_roundoff<Scalar>() * norm(x));
      }
    }
  }
}

TYPED_TEST(RopeTyped, RotatingByOffsetAThenBEqualsRotatingByAPlusB) {
  // One position per head vector (T = 1), so the offset is the position: R(b)·R(a) = R(a + b).
  using Scalar = TypeParam;
  std::mt19937_64 engine(5);
  const RotaryTable<Scalar> table(8, 200, 10000.0);
  for (int trial = 0; trial < 100; ++trial) {
    const auto x = random_tensor<Scalar, 4>({2, 3, 1, 8}, engine);
    const index_t a = static_cast<index_t>(engine() % 100),
                  b = static_cast<index_t>(engine() % 100);
    const auto twice = apply_rope(apply_rope(x, a, table), b, table);
    const auto once = apply_rope(x, a + b, table);
    EXPECT_TENSOR_WITHIN(twice, once, rotation_bound(x.view(), a + b));
  }
}

TYPED_TEST(RopeTyped, QueryKeyProductDependsOnlyOnThePositionDifference) {
  // <R(m)·q, R(n)·k> = <q, R(n − m)·k>: shifting both positions by s changes nothing.
  using Scalar = TypeParam;
  std::mt19937_64 engine(7);
  const RotaryTable<Scalar> table(32, 400, 500000.0);
  const auto dot = [](const Tensor<Scalar, 4>& u, const Tensor<Scalar, 4>& v) {
    double total = 0;
    for (index_t i = 0; i < u.size(); ++i) total += double(u.data()[i]) * double(v.data()[i]);
    return total;
  };
  for (int trial = 0; trial < 100; ++trial) {
    const auto q = random_tensor<Scalar, 4>({1, 1, 1, 32}, engine);
    const auto k = random_tensor<Scalar, 4>({1, 1, 1, 32}, engine);
    const index_t m = static_cast<index_t>(engine() % 100),
                  n = static_cast<index_t>(engine() % 100);
    const index_t s = static_cast<index_t>(engine() % 200);
    const double base = dot(apply_rope(q, m, table), apply_rope(k, n, table));
    const double shifted = dot(apply_rope(q, m + s, table), apply_rope(k, n + s, table));
    double scale = 0;
    for (index_t i = 0; i < 32; ++i) scale += std::abs(double(q.data()[i]) * double(k.data()[i]));
    // Each rotated vector is within ~(8 + 4p)·u·|x| of exact (p < 300): the products differ by
    // at most twice that on each side, relative to Σ|q|·|k| (≤ 2·scale for the pairs).
    EXPECT_NEAR(shifted, base, 8 * (8 + 4 * 300) * testing::unit_roundoff<Scalar>() * scale);
  }
}

TYPED_TEST(RopeTyped, BackwardInvertsForwardAndInPlaceMatchesBitwise) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(9);
  const RotaryTable<Scalar> table(64, 64, 10000.0);
  const auto x = random_tensor<Scalar, 4>({2, 4, 6, 64}, engine);
  const auto y = apply_rope(x, 5, table);
  EXPECT_TENSOR_WITHIN(rope_backward(y, 5, table), x, rotation_bound(x.view(), 10));

  auto in_place = snapshot(x);
  apply_rope_into(in_place, in_place, 5, table);
  EXPECT_TENSOR_EQ(in_place, y);
  rope_backward_into(in_place, in_place, 5, table);
  EXPECT_TENSOR_EQ(in_place, rope_backward(y, 5, table));

  // The theta overloads build the same table for the call: the same bits.
  EXPECT_TENSOR_EQ(apply_rope(x, 5, 10000.0), y);
  EXPECT_TENSOR_EQ(apply_rope(x, 5), y);
  EXPECT_TENSOR_EQ(rope_backward(y, 5), rope_backward(y, 5, table));

  // Views work as tensors do: q of a fused buffer, rotated into a caller's buffer whose old
  // values are never read.
  Tensor<Scalar, 4> out(x.shape());
  out.fill(Scalar(NAN));
  apply_rope_into(x.view(), out.view(), 5, table);
  EXPECT_TENSOR_EQ(out, y);
}

// ---- the growing table (docs/reliability.md row 131) --------------------------------------------

TEST(GrowingRotaryTable, HoldsWhatIsAskedNotTheLimitAndMatchesTheFullTableBitForBit) {
  // A limit of 2³¹ − 1 positions (a context read from a file) allocates nothing up front; a full
  // RotaryTable of it would be 2³¹ · 4 · 2 doubles, and 10⁸ of them took 6.1 GB.
  const GrowingRotaryTable<double> growing(8, 2147483647, 5e5);
  EXPECT_EQ(growing.positions(), 0);
  EXPECT_EQ(growing.limit(), 2147483647);
  const RotaryTable<double> full(8, 40, 5e5);
  const auto first = growing.covering(5);
  EXPECT_EQ(first->max_positions(), 5);
  // One more position doubles (decoding token by token recomputes O(length) entries in all);
  // fewer returns the table held.
  const auto second = growing.covering(6);
  EXPECT_EQ(second->max_positions(), 10);
  EXPECT_EQ(growing.covering(3), second);
  const auto third = growing.covering(33);
  EXPECT_EQ(third->max_positions(), 33);  // past twice the last: exactly what is asked
  EXPECT_EQ(growing.positions(), 33);
  // Every entry is the full table's, bit for bit, and a table handed out earlier stays valid.
  for (const auto& table : {first, second, third}) {
    for (index_t p = 0; p < table->max_positions(); ++p) {
      for (index_t i = 0; i < 4; ++i) {
        EXPECT_EQ(table->cos()(p, i), full.cos()(p, i));
        EXPECT_EQ(table->sin()(p, i), full.sin()(p, i));
      }
    }
  }
  // Copies share what is built; the limit caps the doubling.
  const GrowingRotaryTable<double> copy = growing;
  EXPECT_EQ(copy.covering(20), third);
  const GrowingRotaryTable<float> capped(8, 12);
  EXPECT_EQ(capped.covering(7)->max_positions(), 7);
  EXPECT_EQ(capped.covering(8)->max_positions(), 12);
  EXPECT_THROW_WITH(capped.covering(13), Error,
                    "GrowingRotaryTable::covering: 13 positions are beyond the limit of 12");
  EXPECT_THROW_WITH(GrowingRotaryTable<float>(7, 12), ConfigError, "head_dim must be even");
  EXPECT_THROW_WITH(GrowingRotaryTable<float>(8, -1), ConfigError,
                    "GrowingRotaryTable: limit must be >= 0 (got -1)");
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(RopeErrors, ImpossibleTablesAreConfigErrors) {
  EXPECT_THROW_WITH(RotaryTable<float>(7, 16), ConfigError,
                    "RotaryTable: head_dim must be even (got 7)");
  EXPECT_THROW_WITH(RotaryTable<float>(0, 16), ConfigError, "RotaryTable: head_dim must be > 0");
  EXPECT_THROW_WITH(RotaryTable<float>(-2, 16), ConfigError, "head_dim must be > 0 (got -2)");
  EXPECT_THROW_WITH(RotaryTable<float>(8, -1), ConfigError,
                    "RotaryTable: max_positions must be >= 0 (got -1)");
  EXPECT_THROW_WITH(RotaryTable<double>(8, 4, 0.0), ConfigError,
                    "RotaryTable: rope_theta must be finite and > 0 (got 0)");
  EXPECT_THROW_WITH(RotaryTable<double>(8, 4, NAN), ConfigError, "rope_theta");
  EXPECT_THROW_WITH(RotaryTable<double>(8, 4, INFINITY), ConfigError, "rope_theta");
  Tensor<double, 4> odd({1, 1, 2, 5});
  EXPECT_THROW_WITH(apply_rope(odd, 0), ConfigError, "head_dim must be even (got 5)");
}

TEST(RopeErrors, PositionsBeyondTheTableNameOffsetAndLength) {
  const RotaryTable<float> table(8, 10);
  Tensor<float, 4> x({1, 2, 4, 8});
  EXPECT_THROW_WITH(apply_rope(x, 7, table), Error,
                    "apply_rope: positions offset 7 + T 4 are outside the table's 10 positions");
  EXPECT_THROW_WITH(rope_backward(x, -1, table), Error,
                    "rope_backward: positions offset -1 + T 4 are outside");
  EXPECT_THROW_WITH(apply_rope_into(x, x, 7, table), Error, "apply_rope_into: positions offset 7");
  EXPECT_THROW_WITH(apply_rope(x, -3, 10000.0), Error, "positions offset -3 + T 4");
  EXPECT_NO_THROW(apply_rope(x, 6, table));  // positions 6..9: the table's end
}

TEST(RopeErrors, WrongWidthsAndBuffersAreShapeErrorsAndWriteNothing) {
  const RotaryTable<double> table(8, 10);
  std::mt19937_64 engine(2);
  const auto x = random_tensor<double, 4>({1, 2, 3, 8}, engine);
  Tensor<double, 4> narrow({1, 2, 3, 6});
  EXPECT_THROW_WITH(
      apply_rope(narrow, 0, table), ShapeError,
      "apply_rope: last dim 6 of [1, 2, 3, 6] [B, H, T, d_k] != the table's head_dim 8");
  Tensor<double, 4> wrong({1, 3, 2, 8});
  wrong.fill(4);
  EXPECT_THROW_WITH(apply_rope_into(x, wrong, 0, table), ShapeError,
                    "apply_rope_into: output has shape [1, 3, 2, 8] but the input has shape "
                    "[1, 2, 3, 8]");
  for (double v : wrong) EXPECT_EQ(v, 4.0);
  // A buffer shifted by one head vector overlaps x without being x.
  Tensor<double, 1> buffer({x.size() + 8});
  TensorView<double, 4> in(buffer.data(), x.shape()), out(buffer.data() + 8, x.shape());
  in.copy_from(x);
  const auto before = snapshot(buffer);
  EXPECT_THROW_WITH(rope_backward_into(in, out, 0, table), ShapeError,
                    "rope_backward_into: output [1, 2, 3, 8] partly overlaps the input");
  EXPECT_TENSOR_EQ(buffer, before);
}

}  // namespace test_rope
}  // namespace dissect
