// Tests for tests/support/gradcheck.hpp, the finite-difference checker every gradient test
// relies on: a checker that cannot fail proves nothing, so these show it catches a gradient
// wrong in one element by 1 %, names that element, leaves the tensor bit-identical (even when
// the loss throws), samples as promised, and applies the tolerance its header documents.
#include "support/gradcheck.hpp"

#include <gtest/gtest-spi.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <set>
#include <sstream>
#include <stdexcept>
#include <string>

#include "dissect/tensor/tensor.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_gradcheck {

using testing::gradcheck;
using testing::GradcheckOptions;
using testing::GradcheckResult;

/// L(x) = Σ cᵢ·xᵢ³ + (Σ xᵢ)²: every element interacts with every other, and the cube gives the
/// differences a truncation error to see. dL/dxᵢ = 3·cᵢ·xᵢ² + 2·Σ x.
struct Cubic {
  Tensor<double, 3> c;

  double operator()(const Tensor<double, 3>& x) const {
    double cubes = 0, sum = 0;
    for (index_t i = 0; i < x.size(); ++i) {
      cubes += c.data()[i] * x.data()[i] * x.data()[i] * x.data()[i];
      sum += x.data()[i];
    }
    return cubes + sum * sum;
  }

  Tensor<double, 3> gradient(const Tensor<double, 3>& x) const {
    double sum = 0;
    for (double v : x) sum += v;
    Tensor<double, 3> g(x.shape());
    for (index_t i = 0; i < x.size(); ++i)
      g.data()[i] = 3 * c.data()[i] * x.data()[i] * x.data()[i] + 2 * sum;
    return g;
  }
};

struct Problem {
  Tensor<double, 3> x;
  Cubic loss;
};

Problem make_problem(std::uint64_t seed) {
  std::mt19937_64 engine(seed);
  const Shape<3> shape{2, 3, 4};
  return {testing::random_tensor<double, 3>(shape, engine),
          {testing::random_tensor<double, 3>(shape, engine)}};
}

bool bit_identical(const Tensor<double, 3>& a, const Tensor<double, 3>& b) {
  return a.shape() == b.shape() &&
         std::memcmp(a.data(), b.data(), sizeof(double) * static_cast<std::size_t>(a.size())) == 0;
}

std::string printed(const GradcheckResult& result) {
  std::ostringstream out;
  out << result;
  return out.str();
}

TEST(Gradcheck, CorrectGradientPasses) {
  Problem p = make_problem(1);
  auto& x = p.x;
  const auto& loss = p.loss;
  const auto result = gradcheck([&] { return loss(x); }, x, loss.gradient(x));
  EXPECT_GRADIENT_OK(result);
  EXPECT_EQ(result.size, 24);
  EXPECT_EQ(result.checked, 24);
  EXPECT_EQ(result.failures, 0);
  EXPECT_EQ(result.shape, (std::vector<std::int64_t>{2, 3, 4}));
  EXPECT_LT(result.max_abs_error, 1e-8);  // ~1e-10 expected at h = 1e-6 (header comment)
}

TEST(Gradcheck, OneElementOffByOnePercentIsTheWorstAndFails) {
  Problem p = make_problem(2);
  auto& x = p.x;
  const auto& loss = p.loss;
  auto analytic = loss.gradient(x);
  const index_t flat = 1 * 12 + 2 * 4 + 3;  // [1, 2, 3]
  const double right = analytic.data()[flat];
  ASSERT_GT(std::abs(right), 0.1);  // so 1 % of it dwarfs the differences' own error
  analytic.data()[flat] *= 1.01;
  const auto result = gradcheck([&] { return loss(x); }, x, analytic);
  EXPECT_FALSE(result.passed());
  EXPECT_EQ(result.failures, 1);
  EXPECT_EQ(result.worst.flat, flat);
  EXPECT_EQ(result.worst_index(), (std::vector<std::int64_t>{1, 2, 3}));
  EXPECT_EQ(result.worst.analytic, 1.01 * right);
  EXPECT_NEAR(result.worst.numeric, right, 1e-8);
  EXPECT_NEAR(result.worst.abs_error, 0.01 * std::abs(right), 1e-8);
  EXPECT_NEAR(result.worst.rel_error, 0.01 / 1.01, 1e-7);
  EXPECT_GT(result.worst.abs_error, result.worst.allowed);

  // The assertion fails, and its message names the element with its multi-index.
  const std::string text = printed(result);
  EXPECT_NE(text.find("1 outside tolerance; worst at [1, 2, 3] (flat 23)"), std::string::npos)
      << text;
  EXPECT_NONFATAL_FAILURE(EXPECT_GRADIENT_OK(result), "worst at [1, 2, 3] (flat 23)");
  const auto verdict = testing::gradient_ok("result", result);
  EXPECT_FALSE(verdict);
  EXPECT_NE(std::string(verdict.message()).find("gradient check result: "), std::string::npos);
}

TEST(Gradcheck, ChecksThroughTemporaryViewsAndReportsTheirShape) {
  Problem p = make_problem(6);
  auto analytic = p.loss.gradient(p.x);
  analytic.data()[23] *= 1.01;
  // A writable view made for the call perturbs the tensor underneath; the report uses its shape.
  const auto result = gradcheck([&] { return p.loss(p.x); }, p.x.view().reshape(Shape<2>{6, 4}),
                                analytic.cview().reshape(Shape<2>{6, 4}));
  EXPECT_EQ(result.failures, 1);
  EXPECT_EQ(result.shape, (std::vector<std::int64_t>{6, 4}));
  EXPECT_EQ(result.worst_index(), (std::vector<std::int64_t>{5, 3}));
}

TEST(Gradcheck, NaNInTheGradientFailsAndIsTheWorst) {
  Problem p = make_problem(3);
  auto& x = p.x;
  const auto& loss = p.loss;
  auto analytic = loss.gradient(x);
  analytic.data()[5] = std::nan("");
  const auto result = gradcheck([&] { return loss(x); }, x, analytic);
  EXPECT_EQ(result.failures, 1);
  EXPECT_EQ(result.worst.flat, 5);
  EXPECT_EQ(result.max_abs_error, INFINITY);
}

TEST(Gradcheck, PerturbedTensorIsBitIdenticalAfterwards) {
  Problem p = make_problem(4);
  auto& x = p.x;
  const auto& loss = p.loss;
  // Values whose x ± h rounds, a signed zero, a subnormal and a huge one: each must come back
  // exactly, not as (x + h) − h.
  x(0, 0, 0) = 1.0 / 3.0;
  x(0, 0, 1) = -0.0;
  x(0, 0, 2) = 4.9e-324;
  x(0, 0, 3) = 1e100;
  const auto before = x;
  static_cast<void>(gradcheck([&] { return loss(x); }, x, loss.gradient(x), {.richardson = true}));
  EXPECT_TRUE(bit_identical(x, before));
  EXPECT_TRUE(std::signbit(x(0, 0, 1)));
}

TEST(Gradcheck, RestoresTheValueWhenTheLossThrows) {
  Problem p = make_problem(5);
  auto& x = p.x;
  const auto& loss = p.loss;
  const auto before = x;
  int calls = 0;
  auto throwing = [&] {
    if (++calls == 3) throw std::runtime_error("loss failed");  // mid-way through element 1
    return loss(x);
  };
  EXPECT_THROW(static_cast<void>(gradcheck(throwing, x, loss.gradient(x))), std::runtime_error);
  EXPECT_TRUE(bit_identical(x, before));
}

TEST(Gradcheck, SamplesDistinctElementsReproduciblyBySeed) {
  std::mt19937_64 engine(6);
  auto x = testing::random_tensor<double, 1>({1000}, engine);
  const auto original = x;
  std::set<index_t> perturbed;
  auto loss = [&] {
    for (index_t i = 0; i < x.size(); ++i)
      if (x(i) != original(i)) perturbed.insert(i);
    double sum = 0;
    for (double v : x) sum += v;
    return sum;
  };
  Tensor<double, 1> ones({1000});
  ones.fill(1.0);
  const auto first = gradcheck(loss, x, ones, {.sample = 40, .seed = 9});
  EXPECT_GRADIENT_OK(first);
  EXPECT_EQ(first.checked, 40);
  EXPECT_EQ(perturbed.size(), 40u);  // distinct: no element checked twice
  const auto first_set = perturbed;
  perturbed.clear();
  static_cast<void>(gradcheck(loss, x, ones, {.sample = 40, .seed = 9}));
  EXPECT_EQ(perturbed, first_set);
  perturbed.clear();
  static_cast<void>(gradcheck(loss, x, ones, {.sample = 40, .seed = 10}));
  EXPECT_NE(perturbed, first_set);
  // A sample as large as the tensor checks every element.
  EXPECT_EQ(gradcheck(loss, x, ones, {.sample = 1000}).checked, 1000);
}

TEST(Gradcheck, ToleranceIsTheDocumentedFormula) {
  // L = x³ at x = 1 with an absolute h = 1e-3: D(h) = 3x² + h² exactly, so the truncation error
  // is 1e-6, and Richardson's |D(h) − D(2h)|/3 = |h² − 4h²|/3 recovers it.
  Tensor<double, 1> x({1});
  x(0) = 1.0;
  const double analytic = 3.0;
  auto loss = [&] { return x(0) * x(0) * x(0); };
  const GradcheckOptions options{.step = 1e-3,
                                 .relative_step = false,
                                 .rtol = 1e-9,
                                 .atol = 1e-12,
                                 .loss_rounding = 1e-16,
                                 .richardson = true,
                                 .safety = 2};
  const auto result = gradcheck(loss, x.data(), &analytic, 1, options);
  EXPECT_NEAR(result.worst.numeric, 3 + 1e-6, 1e-11);  // the loss's rounding over h: ~1e-13
  EXPECT_NEAR(result.worst.truncation, 1e-6, 1e-11);
  const double allowed =
      1e-12 + 1e-9 * result.worst.numeric + 2 * (result.worst.truncation + 1e-16 / 1e-3);
  EXPECT_DOUBLE_EQ(result.worst.allowed, allowed);
  EXPECT_GRADIENT_OK(result);  // 1e-6 of error against ~2e-6 allowed
  // error_budget: the same without atol and rtol.
  const auto budget =
      gradcheck(loss, x.data(), &analytic, 1, GradcheckOptions::error_budget(1e-3, 1e-16));
  EXPECT_DOUBLE_EQ(budget.worst.allowed, 2 * (budget.worst.truncation + 1e-16 / 1e-3));
  // Without the truncation budget the same difference fails: the tolerance is not slack.
  const auto strict = gradcheck(loss, x.data(), &analytic, 1,
                                {.step = 1e-3, .relative_step = false, .rtol = 0, .atol = 1e-7});
  EXPECT_FALSE(strict.passed());
}

TEST(Gradcheck, RelativeStepScalesWithTheValue) {
  Tensor<double, 1> x({2});
  x(0) = 0.25;
  x(1) = -300.0;
  Tensor<double, 1> analytic({2});
  analytic(0) = 2 * 0.25;
  analytic(1) = 2 * -300.0;
  auto loss = [&] { return x(0) * x(0) + x(1) * x(1); };
  // L ≈ 9e4, so the difference for x(0) carries ~u·|L|/h ≈ 1e-5 of the loss's own rounding: the
  // default loss_rounding (4u·|L|) allows it where a fixed atol of 1e-6 alone would not.
  EXPECT_GRADIENT_OK(gradcheck(loss, x, analytic));
  // h = 1e-6·max(1, |x|): a unit step below 1, a proportional one above.
  EXPECT_EQ(gradcheck(loss, &x(0), &analytic(0), 1).worst.step, 1e-6);
  EXPECT_EQ(gradcheck(loss, &x(1), &analytic(1), 1).worst.step, 300 * 1e-6);
}

TEST(Gradcheck, RawPointersReportFlatIndices) {
  double values[4] = {0.5, -1.5, 2.0, 0.25};
  double analytic[4] = {1.0, -3.0, 4.0, 0.5};  // d(Σ x²)/dx = 2x
  analytic[2] = 4.5;
  auto loss = [&] {
    double sum = 0;
    for (double v : values) sum += v * v;
    return sum;
  };
  const auto result = gradcheck(loss, values, analytic, 4);
  EXPECT_EQ(result.worst.flat, 2);
  EXPECT_TRUE(result.worst_index().empty());
  EXPECT_NE(printed(result).find("worst at flat 2: analytic 4.5"), std::string::npos)
      << printed(result);
}

TEST(Gradcheck, EmptyTensorChecksNothingAndPasses) {
  Tensor<double, 2> x({0, 3});
  const auto result = gradcheck([] { return 0.0; }, x, Tensor<double, 2>({0, 3}));
  EXPECT_GRADIENT_OK(result);
  EXPECT_EQ(result.checked, 0);
  EXPECT_EQ(printed(result), "0 of 0 elements checked, 0 outside tolerance");
}

TEST(Gradcheck, MismatchedAnalyticGradientThrowsWithBothShapes) {
  Tensor<double, 2> x({3, 4});
  auto loss = [] { return 0.0; };
  EXPECT_THROW_WITH(static_cast<void>(gradcheck(loss, x, Tensor<double, 2>({4, 3}))),
                    std::invalid_argument,
                    "gradcheck: analytic gradient has 12 elements, shape [4, 3] but values have "
                    "12, shape [3, 4]");
  EXPECT_THROW_WITH(static_cast<void>(gradcheck(loss, x, Tensor<double, 1>({11}))),
                    std::invalid_argument,
                    "analytic gradient has 11 elements, shape [11] but values have 12");
}

}  // namespace test_gradcheck
}  // namespace dissect
