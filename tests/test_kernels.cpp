// Tests for dissect/kernels/linear_products.hpp: the fast kernels against the naive oracle over
// random shapes (including empty ones and shapes that cross the GEMM column panel), IEEE
// propagation, and output buffers that are written before they are read.
#include "dissect/kernels/linear_products.hpp"

#include <gtest/gtest.h>

#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_kernels {

using testing::gamma;
using testing::random_tensor;

template <class Scalar>
class Kernels : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(Kernels, Scalars);

template <class Scalar>
std::optional<ConstVectorMap<Scalar>> view(const Tensor<Scalar, 1>* bias) {
  if (!bias) return std::nullopt;
  return ConstVectorMap<Scalar>(bias->data(), bias->size());
}

/// One random case: fast forward and backward against the naive loops, within the γ bounds.
template <class Scalar>
void check_against_naive(index_t rows, index_t in, index_t out, bool with_bias,
                         std::mt19937_64& engine) {
  SCOPED_TRACE(testing::concat_for_trace(rows, in, out, with_bias));
  const auto x = random_tensor<Scalar, 2>({rows, in}, engine);
  const auto w = random_tensor<Scalar, 2>({out, in}, engine);
  const auto b = random_tensor<Scalar, 1>({out}, engine);
  const auto dy = random_tensor<Scalar, 2>({rows, out}, engine);
  const Tensor<Scalar, 1>* bias = with_bias ? &b : nullptr;

  Tensor<Scalar, 2> y_fast({rows, out}), y_naive({rows, out});
  y_fast.fill(std::numeric_limits<Scalar>::quiet_NaN());  // must be overwritten, never read
  linear_forward<Scalar>(x.matrix(), w.matrix(), view(bias), y_fast.matrix());
  linear_forward_naive<Scalar>(x.matrix(), w.matrix(), view(bias), y_naive.matrix());
  EXPECT_TENSOR_WITHIN(y_fast, y_naive, testing::linear_forward_bound(x, w, bias));

  // Backward: gradients start from a non-zero value to prove accumulation (+=).
  Tensor<Scalar, 2> dx_fast({rows, in}), dx_naive({rows, in});
  dx_fast.fill(std::numeric_limits<Scalar>::quiet_NaN());
  Tensor<Scalar, 2> dw_fast({out, in}), dw_naive({out, in});
  Tensor<Scalar, 1> db_fast({out}), db_naive({out});
  dw_fast.fill(1), dw_naive.fill(1), db_fast.fill(1), db_naive.fill(1);
  std::optional<VectorMap<Scalar>> db_fast_view, db_naive_view;
  if (with_bias)
    db_fast_view.emplace(db_fast.data(), out), db_naive_view.emplace(db_naive.data(), out);
  linear_backward<Scalar>(x.matrix(), w.matrix(), dy.matrix(), dx_fast.matrix(), dw_fast.matrix(),
                          db_fast_view);
  linear_backward_naive<Scalar>(x.matrix(), w.matrix(), dy.matrix(), dx_naive.matrix(),
                                dw_naive.matrix(), db_naive_view);
  // Every value is in [−1, 1), so a length-L reduction is off by at most 2·γ_L·L (+1 for the
  // accumulated start value).
  const double u = 2 * gamma<Scalar>(out) * double(out);
  EXPECT_TENSOR_NEAR(dx_fast, dx_naive, 0.0, u + 1e-300);
  const double v = 2 * gamma<Scalar>(rows + 1) * double(rows + 1);
  EXPECT_TENSOR_NEAR(dw_fast, dw_naive, 0.0, v);
  EXPECT_TENSOR_NEAR(db_fast, db_naive, 0.0, v);
}

TYPED_TEST(Kernels, AgreeWithNaiveOnAThousandRandomShapes) {
  std::mt19937_64 engine(20261129);
  std::uniform_int_distribution<index_t> dim(0, 64);
  for (int i = 0; i < testing::sweep_trials(1000); ++i) {
    check_against_naive<TypeParam>(dim(engine), dim(engine), dim(engine), engine() % 4 != 0,
                                   engine);
    if (::testing::Test::HasFailure()) return;  // one report is enough
  }
}

TYPED_TEST(Kernels, AgreeWithNaiveOnLargeAndPanelCrossingShapes) {
  std::mt19937_64 engine(5);
  check_against_naive<TypeParam>(3, 768, 2304, true, engine);   // GPT-2 fused QKV, a few tokens
  check_against_naive<TypeParam>(2, 5, 4097, true, engine);     // one column past a GEMM panel
  check_against_naive<TypeParam>(2, 8200, 3, false, engine);    // dx crosses two panels
  check_against_naive<TypeParam>(130, 200, 70, true, engine);   // beyond Eigen's small-size path
  check_against_naive<TypeParam>(1, 1024, 1024, true, engine);  // GEMV (M = 1)
}

TYPED_TEST(Kernels, EmptyDimensionsGiveExactZeros) {
  std::mt19937_64 engine(1);
  for (auto [rows, in, out] :
       {std::tuple<index_t, index_t, index_t>{0, 4, 3}, {2, 0, 3}, {2, 4, 0}}) {
    check_against_naive<TypeParam>(rows, in, out, true, engine);
  }
  // in = 0: y is the bias, broadcast (reliability.md row 5).
  Tensor<TypeParam, 2> x({2, 0}), w({3, 0}), y({2, 3});
  Tensor<TypeParam, 1> b({3}, {1, 2, 3});
  y.fill(std::numeric_limits<TypeParam>::quiet_NaN());
  linear_forward<TypeParam>(x.matrix(), w.matrix(), view(&b), y.matrix());
  EXPECT_TENSOR_EQ(y, (Tensor<TypeParam, 2>({2, 3}, {1, 2, 3, 1, 2, 3})));
}

TYPED_TEST(Kernels, NaNAndInfPropagateLikeIEEE) {  // reliability.md row 18
  using S = TypeParam;
  const S nan = std::numeric_limits<S>::quiet_NaN(), inf = std::numeric_limits<S>::infinity();
  Tensor<S, 2> x({2, 2}, {nan, 1, 2, 3});
  Tensor<S, 2> w({2, 2}, {1, 0, 0, 1});
  Tensor<S, 2> y({2, 2});
  linear_forward<S>(x.matrix(), w.matrix(), std::nullopt, y.matrix());
  EXPECT_TRUE(std::isnan(y(0, 0)));
  EXPECT_TRUE(std::isnan(y(0, 1)));  // NaN·0 is NaN: a NaN in x[m, k] poisons all of y[m, :]
  EXPECT_EQ(y(1, 0), 2);
  EXPECT_EQ(y(1, 1), 3);
  Tensor<S, 2> xi({1, 2}, {inf, 1});
  Tensor<S, 2> yi({1, 2});
  linear_forward<S>(xi.matrix(), w.matrix(), std::nullopt, yi.matrix());
  EXPECT_TRUE(std::isinf(yi(0, 0)));
  EXPECT_TRUE(std::isnan(yi(0, 1)));  // Inf times a zero weight is NaN
}

TEST(TestPrelude, EigenAssertionsThrowInTests) {
  // Guards the meaning of every other test: if the prelude were not active, a shape error that
  // reached Eigen would go unnoticed in release builds.
  Eigen::MatrixXf a(2, 3), b(4, 5);
  EXPECT_THROW((void)(a * b).eval(), dissect::testing::EigenAssertionFired);
}

}  // namespace test_kernels
}  // namespace dissect
