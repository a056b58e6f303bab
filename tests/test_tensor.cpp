// Tests for dissect/tensor/tensor.hpp: construction, access, reshape, permute, matrix views,
// printing.
#include "dissect/tensor/tensor.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <sstream>

#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_tensor {

using testing::random_tensor;

TEST(Tensor, ZeroFilledAndAligned) {
  Tensor<float, 3> t({2, 3, 5});
  EXPECT_EQ(t.size(), 30);
  for (float v : t) EXPECT_EQ(v, 0.0f);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(t.data()) % 64, 0u);
}

TEST(Tensor, FromValuesIsRowMajor) {
  Tensor<double, 2> t({2, 3}, {0, 1, 2, 10, 11, 12});
  EXPECT_EQ(t(1, 0), 10);
  EXPECT_EQ(t(0, 2), 2);
  EXPECT_EQ(t.at(1, 2), 12);
  EXPECT_EQ(t.matrix()(1, 1), 11);  // the matrix view sees the same layout
}

TEST(Tensor, ValueCountMismatchIsAShapeError) {  // reliability.md row 8
  EXPECT_THROW_WITH((Tensor<float, 2>({3, 4}, std::vector<float>(11))), ShapeError,
                    "11 values for shape [3, 4] (12 elements)");
}

TEST(Tensor, NegativeDimensionIsAShapeError) {  // row 6
  EXPECT_THROW_WITH((Tensor<float, 2>({3, -4})), ShapeError,
                    "negative dimension -4 at axis 1 of shape [3, -4]");
}

TEST(Tensor, OverflowingSizeThrowsBeforeAllocating) {  // row 7
  // 2^31 · 2^31 = 2^62 elements fits int64, but 2^62 · 4 bytes does not.
  EXPECT_THROW_WITH((Tensor<float, 2>({1LL << 31, 1LL << 31})), ShapeError, "byte size");
  EXPECT_THROW_WITH((Tensor<double, 3>({1LL << 40, 1LL << 40, 2})), ShapeError, "overflows int64");
}

TEST(Tensor, CheckedAccessNamesIndexAxisAndShape) {  // row 10
  Tensor<float, 2> t({2, 3});
  EXPECT_THROW_WITH(t.at(1, 3), Error,
                    "index 3 is out of range for axis 1 (size 3) of shape [2, 3]");
  EXPECT_THROW_WITH(t.at(-1, 0), Error, "index -1 is out of range for axis 0");
}

TEST(Tensor, CopyIsDeepMoveIsFree) {
  Tensor<float, 1> a({3}, {1, 2, 3});
  Tensor<float, 1> b = a;
  b(0) = 9;
  EXPECT_EQ(a(0), 1);
  const float* buffer = b.data();
  Tensor<float, 1> c = std::move(b);
  EXPECT_EQ(c.data(), buffer);
  EXPECT_EQ(b.size(), 0);  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
}

TEST(Tensor, ReshapeKeepsValuesAndChecksCount) {  // row 9
  Tensor<float, 3> t({2, 3, 4});
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = static_cast<float>(i);
  auto flat = t.reshape(Shape<2>{6, 4});
  EXPECT_EQ(flat(5, 3), 23);
  const float* buffer = t.data();
  auto moved = std::move(t).reshape(Shape<1>{24});
  EXPECT_EQ(moved.data(), buffer);  // the rvalue overload hands the buffer over
  EXPECT_THROW_WITH(flat.reshape(Shape<2>{5, 5}), ShapeError,
                    "cannot view shape [6, 4] (24 elements) as [5, 5] (25 elements)");
}

TEST(Tensor, PermuteMatchesIndexArithmetic) {
  std::mt19937_64 engine(7);
  auto t = random_tensor<double, 4>({2, 3, 4, 5}, engine);
  auto p = t.permute({0, 2, 1, 3});  // [B, T, H, d] -> [B, H, T, d]
  ASSERT_EQ(p.shape(), (Shape<4>{2, 4, 3, 5}));
  for (index_t b = 0; b < 2; ++b)
    for (index_t h = 0; h < 4; ++h)
      for (index_t s = 0; s < 3; ++s)
        for (index_t d = 0; d < 5; ++d) ASSERT_EQ(p(b, h, s, d), t(b, s, h, d));
  // Permuting back is the identity.
  EXPECT_TENSOR_EQ(p.permute({0, 2, 1, 3}), t);
  auto r = t.permute({3, 1, 0, 2});
  for (index_t b = 0; b < 2; ++b)
    for (index_t s = 0; s < 3; ++s)
      for (index_t h = 0; h < 4; ++h)
        for (index_t d = 0; d < 5; ++d) ASSERT_EQ(r(d, s, b, h), t(b, s, h, d));
}

TEST(Tensor, PermuteRejectsANonPermutation) {
  Tensor<float, 3> t({1, 2, 3});
  EXPECT_THROW_WITH(t.permute({0, 0, 2}), ShapeError, "(0, 0, 2) is not a permutation");
  EXPECT_THROW_WITH(t.permute({0, 1, 3}), ShapeError,
                    "not a permutation of the axes of shape [1, 2, 3]");
}

TEST(Tensor, MatrixViewFoldsLeadingAxes) {
  Tensor<float, 3> t({2, 3, 4});
  EXPECT_EQ(t.matrix().rows(), 6);
  EXPECT_EQ(t.matrix().cols(), 4);
  t.matrix()(4, 1) = 7;  // row 4 = (b=1, t=1)
  EXPECT_EQ(t(1, 1, 1), 7);
  Tensor<float, 1> v({5});
  EXPECT_EQ(v.matrix().rows(), 1);
  Tensor<float, 3> empty({2, 0, 4});
  EXPECT_EQ(empty.matrix().rows(), 0);
}

TEST(Tensor, AllcloseComparesShapeAndValues) {
  Tensor<double, 1> a({2}, {1.0, 2.0});
  Tensor<double, 1> b({2}, {1.0, 2.0 + 1e-9});
  EXPECT_TRUE(allclose(a, b));
  EXPECT_FALSE(allclose(a, b, 0, 1e-12));
  EXPECT_FALSE(allclose(a, Tensor<double, 1>({3})));
  Tensor<double, 1> nan({2}, {1.0, std::nan("")});
  EXPECT_FALSE(allclose(nan, nan));
}

TEST(Tensor, PrintsShapeAndTruncatedValues) {
  std::ostringstream out;
  out << Tensor<float, 2>({2, 4});
  EXPECT_EQ(out.str(), "Tensor<float>[2, 4] {0, 0, 0, 0, 0, 0, … (8 values)}");
}

}  // namespace test_tensor
}  // namespace dissect

namespace dissect {
namespace test_tensor {

// ---- views and the hostile-caller fixes (docs/reliability.md rows 9, 10, 20 and class 7) ------

TEST(TensorView, ReshapeAndFlattenNeverCopyAndInferOneExtent) {
  Tensor<float, 3> t({2, 3, 4});
  for (index_t i = 0; i < t.size(); ++i) t.data()[i] = float(i);
  const auto flat = t.view().flatten();
  EXPECT_EQ(flat.data(), t.data());
  EXPECT_EQ(flat.shape(), (Shape<1>{24}));
  const auto rows = t.view().reshape(Shape<2>{-1, 4});
  EXPECT_EQ(rows.shape(), (Shape<2>{6, 4}));
  EXPECT_EQ(rows.data(), t.data());
  EXPECT_EQ(rows(5, 3), 23.0f);
  rows(0, 1) = -1;  // values are shared
  EXPECT_EQ(t(0, 0, 1), -1.0f);
  EXPECT_EQ(t.cview().reshape(Shape<3>{4, -1, 2}).shape(), (Shape<3>{4, 3, 2}));
  EXPECT_THROW_WITH(t.view().reshape(Shape<2>{-1, 5}), ShapeError,
                    "cannot infer the -1 of [-1, 5] for shape [2, 3, 4] (24 elements)");
  EXPECT_THROW_WITH(t.view().reshape(Shape<2>{-1, -1}), ShapeError, "only one -1 may be inferred");
  EXPECT_THROW_WITH(t.view().reshape(Shape<2>{5, 5}), ShapeError,
                    "cannot view shape [2, 3, 4] (24 elements) as [5, 5] (25 elements)");
  EXPECT_EQ(t.view().matrix().rows(), 6);
  const auto owned = std::move(t).reshape(Shape<2>{-1, 12});
  EXPECT_EQ(owned.shape(), (Shape<2>{2, 12}));
}

TEST(TensorView, ReshapeOfAnLvalueChecksBeforeAllocating) {  // row 9: never bad_alloc
  const Tensor<double, 1> small({4});
  EXPECT_THROW_WITH(small.reshape(Shape<2>{index_t{1} << 40, index_t{1} << 20}), ShapeError,
                    "Tensor::reshape: cannot view shape [4]");
  EXPECT_THROW_WITH(small.reshape(Shape<2>{index_t{1} << 40, index_t{1} << 40}), OverflowError,
                    "overflows int64");
}

TEST(TensorView, DimOutOfRangeIsTheLibrarysError) {  // row 10: not std::out_of_range
  Tensor<float, 2> t({2, 3});
  EXPECT_THROW_WITH(t.dim(2), Error, "dim: axis 2 is out of range for shape [2, 3] (rank 2)");
  EXPECT_THROW_WITH(t.view().dim(7), Error, "axis 7 is out of range");
}

TEST(TensorView, ViewsHaveFixedShapesAndCheckCopies) {  // row 20
  Tensor<float, 2> t({2, 2});
  auto v = t.view();
  static_assert(!std::is_assignable_v<decltype(v.shape()), Shape<2>>);
  EXPECT_THROW_WITH(v.copy_from(Tensor<float, 2>({3, 2})), ShapeError,
                    "source has shape [3, 2] but the view has shape [2, 2]");
  v.copy_from(Tensor<float, 2>({2, 2}, {1, 2, 3, 4}));
  EXPECT_EQ(t(1, 1), 4.0f);
  v.copy_from(v);  // overlapping source: memmove, values unchanged
  EXPECT_EQ(t(1, 0), 3.0f);
  EXPECT_THROW_WITH((TensorView<float, 1>(nullptr, {3})), Error, "null data for shape [3]");
  static_assert(!std::is_constructible_v<TensorView<float, 2>, const Tensor<float, 2>&>);
}

TEST(Tensor, AllcloseTreatsEqualInfinitiesAsClose) {  // as torch.allclose
  const float inf = std::numeric_limits<float>::infinity();
  const Tensor<float, 1> a({3}, {inf, -inf, 1}), b({3}, {inf, -inf, 1});
  EXPECT_TRUE(allclose(a, b));
  EXPECT_FALSE(allclose(a, Tensor<float, 1>({3}, {-inf, -inf, 1})));
  EXPECT_FALSE(allclose(a, Tensor<float, 1>({3}, {1e30f, -inf, 1})));
  const Tensor<float, 1> nan({1}, {std::numeric_limits<float>::quiet_NaN()});
  EXPECT_FALSE(allclose(nan, nan));
}

}  // namespace test_tensor
}  // namespace dissect
