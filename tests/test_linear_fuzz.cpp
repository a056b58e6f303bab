// A deterministic fuzz loop over Linear (reliability.md): random shapes, some of them wrong, and
// values that include NaN, ±Inf and subnormals. Every iteration must end in the documented
// ShapeError or in agreement with the naive oracle — never in a crash, a sanitizer report or
// an Eigen assertion.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "dissect/layers/linear.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_linear_fuzz {

template <class Scalar>
class Fuzz {
 public:
  explicit Fuzz(std::uint64_t seed) : engine_(seed) {}

  /// One iteration; returns false (after reporting) on disagreement.
  bool run_once() {
    const index_t in = pick(0, 8), out = pick(0, 8), rows = pick(0, 6), batch = pick(0, 3);
    const bool with_bias = coin(0.7);
    Tensor<Scalar, 2> weight({out, in});
    fill(weight);
    std::optional<Tensor<Scalar, 1>> bias;
    if (with_bias) {
      bias.emplace(Shape<1>{out});
      fill(*bias);
    }
    Linear<Scalar> layer(weight, bias);

    // Sometimes the wrong input width or the wrong dy: the layer must refuse, not read past.
    const index_t x_width = coin(0.15) ? pick(0, 9) : in;
    const index_t dy_width = coin(0.15) ? pick(0, 9) : out;
    Tensor<Scalar, 3> x({batch, rows, x_width}), dy({batch, rows, dy_width});
    fill(x);
    fill(dy);

    if (x_width != in) {
      EXPECT_THROW_WITH(layer.forward(x), ShapeError, "Linear::forward: input last dim");
      EXPECT_THROW_WITH(layer.backward(x, dy), ShapeError, "Linear::backward");
      return !::testing::Test::HasFailure();
    }
    const auto y = layer.forward(x);
    Tensor<Scalar, 2> y_naive({batch * rows, out});
    std::optional<ConstVectorMap<Scalar>> bias_view;
    if (bias) bias_view.emplace(bias->data(), out);
    linear_forward_naive<Scalar>(x.matrix(), weight.matrix(), bias_view, y_naive.matrix());
    if (!agree(y.reshape(Shape<2>{batch * rows, out}), y_naive, in + 1)) return false;

    if (dy_width != out) {
      EXPECT_THROW_WITH(layer.backward(x, dy), ShapeError, "Linear::backward: dy has shape");
      for (Scalar g : layer.weight_grad()) EXPECT_EQ(g, Scalar(0));  // untouched after a throw
      return !::testing::Test::HasFailure();
    }
    const auto dx = layer.backward(x, dy);
    Tensor<Scalar, 2> dx_naive({batch * rows, in}), dw_naive({out, in});
    linear_backward_naive<Scalar>(x.matrix(), weight.matrix(), dy.matrix(), dx_naive.matrix(),
                                  dw_naive.matrix(), std::nullopt);
    return agree(dx.reshape(Shape<2>{batch * rows, in}), dx_naive, out) &&
           agree(layer.weight_grad(), dw_naive, batch * rows);
  }

 private:
  index_t pick(index_t low, index_t high) {
    return std::uniform_int_distribution<index_t>(low, high)(engine_);
  }
  bool coin(double p) { return std::bernoulli_distribution(p)(engine_); }

  template <std::size_t Rank>
  void fill(Tensor<Scalar, Rank>& tensor) {
    using limits = std::numeric_limits<Scalar>;
    for (Scalar& value : tensor) {
      const double roll = std::uniform_real_distribution<double>(0, 1)(engine_);
      if (roll < 0.01)
        value = limits::quiet_NaN();
      else if (roll < 0.02)
        value = coin(0.5) ? limits::infinity() : -limits::infinity();
      else if (roll < 0.04)
        value = limits::denorm_min() * Scalar(pick(1, 1000));
      else
        value = Scalar(std::uniform_real_distribution<double>(-1e3, 1e3)(engine_));
    }
  }

  /// Same NaN pattern, same infinities, finite values within 2·γ_L·(|values| bound).
  bool agree(ConstTensorView<Scalar, 2> fast, ConstTensorView<Scalar, 2> naive, index_t length) {
    const double scale = 2 * testing::gamma<Scalar>(length) * double(length) * 1e6 + 1e-300;
    for (index_t i = 0; i < fast.size(); ++i) {
      const Scalar a = fast.data()[i], b = naive.data()[i];
      const bool same = (std::isnan(a) && std::isnan(b)) || a == b ||
                        (std::isfinite(a) && std::isfinite(b) && std::abs(double(a) - b) <= scale);
      if (!same) {
        ADD_FAILURE() << "element " << i << ": fast " << a << " vs naive " << b;
        return false;
      }
    }
    return true;
  }

  std::mt19937_64 engine_;
};

template <class Scalar>
class LinearFuzz : public ::testing::Test {};
using Scalars = ::testing::Types<float, double>;
TYPED_TEST_SUITE(LinearFuzz, Scalars);

TYPED_TEST(LinearFuzz, HundredThousandIterationsEndInErrorsOrAgreement) {
  Fuzz<TypeParam> fuzz(0xF0221);
  for (int iteration = 0; iteration < 50000; ++iteration) {
    ASSERT_TRUE(fuzz.run_once()) << "iteration " << iteration;
  }
}

}  // namespace test_linear_fuzz
}  // namespace dissect
