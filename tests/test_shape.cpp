// Tests for dissect/core/shape.hpp: formatting, checked counts and overflow detection.
#include "dissect/core/shape.hpp"

#include <gtest/gtest.h>

#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_shape {

TEST(Shape, FormatsLikeTheMessagesPrintIt) {
  EXPECT_EQ(format_shape(Shape<3>{2, 5, 768}), "[2, 5, 768]");
  EXPECT_EQ(format_shape(Shape<1>{0}), "[0]");
}

TEST(Shape, CountsPrintWithThousandsGrouped) {
  EXPECT_EQ(format_count(1'073'741'824), "1,073,741,824");
  EXPECT_EQ(format_count(999), "999");
  EXPECT_EQ(format_count(-1234567), "-1,234,567");
  EXPECT_EQ(format_count(0), "0");
}

TEST(Shape, ElementCountMultipliesExtents) {
  EXPECT_EQ(element_count(Shape<3>{2, 3, 4}), 24);
  EXPECT_EQ(element_count(Shape<2>{0, 7}), 0);
  // 12·4096²·32 = 6,442,450,944 > UINT32_MAX: counts must not be 32-bit anywhere.
  EXPECT_EQ(element_count(Shape<4>{12, 4096, 4096, 32}), 6'442'450'944);
}

TEST(Shape, LeadingCountFoldsAllButTheLastAxis) {
  EXPECT_EQ(leading_count(Shape<3>{2, 3, 4}), 6);
  EXPECT_EQ(leading_count(Shape<1>{9}), 1);  // a rank-1 vector is one row
}

TEST(Shape, NegativeExtentNamesTheAxisAndShape) {
  EXPECT_THROW_WITH(element_count(Shape<3>{2, -1, 4}, "op"), ShapeError,
                    "op: negative dimension -1 at axis 1 of shape [2, -1, 4]");
}

TEST(Shape, OverflowIsAShapeErrorNotAWrappedNumber) {
  // 2^32 · 2^32 = 2^64 does not fit in int64.
  EXPECT_THROW_WITH(element_count(Shape<2>{1LL << 32, 1LL << 32}), ShapeError,
                    "overflows int64 at axis 1");
  EXPECT_THROW_WITH(checked_mul(1LL << 62, 4, "bytes"), ShapeError, "bytes: overflows int64");
  EXPECT_EQ(checked_mul(1LL << 31, 1LL << 31, "ok"), 1LL << 62);
}

}  // namespace test_shape
}  // namespace dissect
