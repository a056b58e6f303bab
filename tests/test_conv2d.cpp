// Tests for dissect/layers/conv2d.hpp: a hand-computed convolution, im2col's layout, PyTorch
// fixtures (nn.Conv2d forward and autograd: stride, padding, dilation, rectangular kernels, bias
// on/off), a direct seven-loop convolution as the oracle on the GEMM path, finite differences in
// double, the allocations of a call (one column buffer, whatever the image size: this file is in
// the `allocations` group, whose binaries count operator new), the module protocol, and every bad
// input with its type and message.
#include "dissect/layers/conv2d.hpp"

#include <gtest/gtest.h>

#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "support/allocation_counter.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_conv2d {

using testing::random_tensor;
using testing::snapshot;

/// The definition, as seven loops in double: y[n, o, i, j] = b[o] + Σ_{c,u,v} W[o, c, u, v]·
/// x[n, c, i·s − p + u·d, j·s − p + v·d] (zero outside the image). Shares no code with im2col.
template <class Scalar>
Tensor<double, 4> direct_convolution(const Conv2d<Scalar>& conv, const Tensor<Scalar, 4>& x) {
  const Shape<4> shape = conv.output_shape(x.shape());
  Tensor<double, 4> y(shape);
  const auto w = conv.weight();
  for (index_t n = 0; n < shape[0]; ++n)
    for (index_t o = 0; o < shape[1]; ++o)
      for (index_t i = 0; i < shape[2]; ++i)
        for (index_t j = 0; j < shape[3]; ++j) {
          double sum = conv.has_bias() ? static_cast<double>(conv.bias()(o)) : 0.0;
          for (index_t c = 0; c < x.dim(1); ++c)
            for (index_t u = 0; u < w.dim(2); ++u)
              for (index_t v = 0; v < w.dim(3); ++v) {
                const index_t h = i * conv.stride()[0] - conv.padding()[0] + u * conv.dilation()[0];
                const index_t k = j * conv.stride()[1] - conv.padding()[1] + v * conv.dilation()[1];
                if (h < 0 || h >= x.dim(2) || k < 0 || k >= x.dim(3)) continue;
                sum += static_cast<double>(w(o, c, u, v)) * static_cast<double>(x(n, c, h, k));
              }
          y(n, o, i, j) = sum;
        }
  return y;
}

/// A Conv2d<double> with |W| and |b| of `conv`: run on |x| and |dy| it gives Σ|terms| of every
/// output, of dx, dW and db, the quantities Higham's bound multiplies.
template <class Scalar>
Conv2d<double> absolute_copy(const Conv2d<Scalar>& conv) {
  const auto k = conv.kernel_size();
  Conv2d<double> copy(conv.in_channels(), conv.out_channels(), k,
                      {.stride = conv.stride(),
                       .padding = conv.padding(),
                       .dilation = conv.dilation(),
                       .bias = conv.has_bias(),
                       .seed = 0});
  copy.set_weight(testing::to_double(testing::absolute(conv.weight())).view());
  if (conv.has_bias()) copy.set_bias(testing::to_double(testing::absolute(conv.bias())).view());
  return copy;
}

template <class T>
Tensor<double, rank_of<T>> scaled(const T& magnitude, double factor) {
  Tensor<double, rank_of<T>> bound = testing::to_double(magnitude);
  for (double& b : bound) b = b * factor + std::numeric_limits<double>::denorm_min();
  return bound;
}

// ---- the layer ----------------------------------------------------------------------------------

TEST(Conv2d, ParametersHaveTorchNamesShapesAndBound) {
  Conv2d<float> conv(3, 8, {3, 2}, {.seed = 4});
  EXPECT_EQ(conv.weight().shape(), (Shape<4>{8, 3, 3, 2}));
  EXPECT_EQ(conv.bias().shape(), (Shape<1>{8}));
  EXPECT_EQ(parameter_names(conv), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(conv.parameter_count(), 8 * 3 * 3 * 2 + 8);
  EXPECT_EQ(conv.field_size(), 18);
  // kaiming_uniform(a = √5): |W|, |b| ≤ 1/√fan_in = 1/√18.
  for (float w : conv.weight()) EXPECT_LE(std::abs(w), 1 / std::sqrt(18.0f));
  for (float b : conv.bias()) EXPECT_LE(std::abs(b), 1 / std::sqrt(18.0f));
  std::ostringstream printed;
  printed << conv;
  EXPECT_EQ(printed.str(),
            "Conv2d(3, 8, kernel_size=(3, 2), stride=(1, 1), padding=(0, 0), dilation=(1, 1), "
            "bias=1)");
  static_assert(Module<Conv2d<double>>);
  Conv2d<double> plain(1, 1, {1, 1}, {.bias = false});
  EXPECT_EQ(parameter_names(plain), std::vector<std::string>{"weight"});
  EXPECT_THROW_WITH(plain.bias(), Error, "Conv2d::bias: this layer has no bias");
}

TEST(Conv2d, HandComputedSumsOfTwoByTwoWindows) {
  // x = [[1 2 3], [4 5 6], [7 8 9]], W = all ones 2×2, b = 10: each output is 10 + the window's
  // sum: [[10+12, 10+16], [10+24, 10+28]]. With padding 1 and stride 2 the windows start at rows
  // and columns −1 and 1, so they hold {1}, {2, 3}, {4, 7} and {5, 6, 8, 9} (the rest is
  // padding): 11, 15, 21, 38.
  const Tensor<double, 4> x({1, 1, 3, 3}, {1, 2, 3, 4, 5, 6, 7, 8, 9});
  Conv2d<double> conv(1, 1, {2, 2});
  conv.weight().fill(1.0);
  conv.bias().fill(10.0);
  EXPECT_TENSOR_EQ(conv.forward(x), (Tensor<double, 4>({1, 1, 2, 2}, {22, 26, 34, 38})));
  Conv2d<double> padded(1, 1, {2, 2}, {.stride = {2, 2}, .padding = {1, 1}});
  padded.weight().fill(1.0);
  padded.bias().fill(10.0);
  EXPECT_TENSOR_EQ(padded.forward(x), (Tensor<double, 4>({1, 1, 2, 2}, {11, 15, 21, 38})));
  // dx of Σ y: how many windows cover each pixel (corner 1, edge 2, centre 4).
  Tensor<double, 4> dy({1, 1, 2, 2});
  dy.fill(1.0);
  EXPECT_TENSOR_EQ(conv.backward(x, dy),
                   (Tensor<double, 4>({1, 1, 3, 3}, {1, 2, 1, 2, 4, 2, 1, 2, 1})));
  // dW[u, v] = Σ of the pixels under kernel tap (u, v): 1+2+4+5, 2+3+5+6, 4+5+7+8, 5+6+8+9.
  EXPECT_TENSOR_EQ(conv.weight_grad(), (Tensor<double, 4>({1, 1, 2, 2}, {12, 16, 24, 28})));
  EXPECT_EQ(conv.bias_grad()(0), 4.0);
}

TEST(Conv2d, Im2colRowsAreReceptiveFieldsInWeightOrder) {
  // 2 channels of 2×3, kernel 2×2, stride 1: 2 output pixels; row (0, 0, j) holds channel 0's
  // window then channel 1's, each row-major.
  const Tensor<double, 4> x({1, 2, 2, 3}, {1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60});
  const Conv2d<double> conv(2, 1, {2, 2});
  const Tensor<double, 2> expected({2, 8},
                                   {1, 2, 4, 5, 10, 20, 40, 50, 2, 3, 5, 6, 20, 30, 50, 60});
  EXPECT_TENSOR_EQ(conv.im2col(x), expected);
}

TEST(Conv2d, FloatOnTheGemmPathAgreesWithTheDirectDefinition) {
  // N·Ho·Wo > 32 rows, so float products run on dissect's packed GEMM; the direct loops in
  // double are the exact value up to their own rounding: each output within γ_{K+1}·Σ|terms|.
  std::mt19937_64 engine(3);
  for (int trial = 0; trial < testing::sweep_trials(20); ++trial) {
    const index_t channels = 1 + static_cast<index_t>(engine() % 4);
    const index_t kernel = 1 + static_cast<index_t>(engine() % 3);
    const index_t stride = 1 + static_cast<index_t>(engine() % 2);
    const index_t padding = static_cast<index_t>(engine() % 2);
    const index_t dilation = 1 + static_cast<index_t>(engine() % 2);
    const index_t size = 6 + static_cast<index_t>(engine() % 6);
    SCOPED_TRACE(testing::concat_for_trace("C", channels, "k", kernel, "s", stride, "p", padding,
                                           "d", dilation, "HW", size));
    Conv2d<float> conv(channels, 5, {kernel, kernel},
                       {.stride = {stride, stride},
                        .padding = {padding, padding},
                        .dilation = {dilation, dilation},
                        .seed = static_cast<std::uint64_t>(trial)});
    const auto x = random_tensor<float, 4>({2, channels, size, size}, engine);
    const auto exact = direct_convolution(conv, x);
    const auto magnitude = absolute_copy(conv).forward(testing::to_double(testing::absolute(x)));
    EXPECT_TENSOR_WITHIN(conv.forward(x), exact,
                         scaled(magnitude, testing::gamma<float>(conv.field_size() + 1)));
  }
}

TEST(Conv2d, OneColumnBufferPerCallWhateverTheImageSize) {
  // forward allocates the column buffer, the GEMM's [N·Ho·Wo, O] rows and y; backward the
  // columns, dy's rows, dcols and dx: 3 and 4 allocations, for 72 output pixels as for 1,800,
  // never one per pixel. (The GEMM's per-thread workspace grows once, in the warm-up call.)
  Conv2d<float> conv(3, 8, {3, 3}, {.padding = {1, 1}, .seed = 1});
  std::mt19937_64 engine(9);
  const auto large = random_tensor<float, 4>({2, 3, 30, 30}, engine);
  const auto small = random_tensor<float, 4>({2, 3, 6, 6}, engine);
  const auto dy_large = random_tensor<float, 4>(conv.output_shape(large.shape()), engine);
  const auto dy_small = random_tensor<float, 4>(conv.output_shape(small.shape()), engine);
  (void)conv.backward(large, dy_large);
  (void)conv.forward(large);
  for (const auto* pair : {&small, &large}) {
    const auto& x = *pair;
    const auto& dy = pair == &small ? dy_small : dy_large;
    long before = testing::allocation_count();
    (void)conv.forward(x);
    EXPECT_EQ(testing::allocation_count() - before, 3) << format_shape(x.shape());
    before = testing::allocation_count();
    (void)conv.backward(x, dy);
    EXPECT_EQ(testing::allocation_count() - before, 4) << format_shape(x.shape());
  }
}

TEST(Conv2d, ZeroImagesAreValidAndAddNothing) {
  Conv2d<double> conv(2, 3, {2, 2}, {.seed = 1});
  const Tensor<double, 4> x({0, 2, 4, 4});
  const auto y = conv.forward(x);
  EXPECT_EQ(y.shape(), (Shape<4>{0, 3, 3, 3}));
  EXPECT_EQ(conv.backward(x, y).shape(), x.shape());
  for (double g : conv.weight_grad()) EXPECT_EQ(g, 0.0);
  for (double g : conv.bias_grad()) EXPECT_EQ(g, 0.0);
}

TEST(Conv2d, NaNReachesExactlyTheOutputsWhoseFieldCoversIt) {
  // IEEE propagation, as torch: with a 3×3 kernel, stride 2 and padding 1, output (i, j) reads
  // rows 2i − 1 … 2i + 1 and columns 2j − 1 … 2j + 1, so a NaN at pixel (2, 2) of image 3 lies
  // in the field of output (1, 1) of that image alone. N·Ho·Wo = 72 rows: the packed GEMM path.
  Conv2d<float> conv(1, 2, {3, 3}, {.stride = {2, 2}, .padding = {1, 1}, .seed = 5});
  Tensor<float, 4> x({8, 1, 5, 5});
  x.fill(0.5f);
  x(3, 0, 2, 2) = NAN;
  const auto y = conv.forward(x);  // [8, 2, 3, 3]
  for (index_t n = 0; n < 8; ++n)
    for (index_t o = 0; o < 2; ++o)
      for (index_t i = 0; i < 3; ++i)
        for (index_t j = 0; j < 3; ++j) {
          EXPECT_EQ(std::isnan(y(n, o, i, j)), n == 3 && i == 1 && j == 1)
              << "at " << n << ", " << o << ", " << i << ", " << j;
        }
}

// ---- finite differences -------------------------------------------------------------------------

TEST(Conv2dGradients, MatchFiniteDifferences) {
  // L = Σ dy ⊙ forward(x) with random stride, padding, dilation and rectangular kernels: dx, dW
  // and db from one backward against central differences of L in double.
  std::mt19937_64 engine(17);
  for (int trial = 0; trial < testing::sweep_trials(30); ++trial) {
    const Pair kernel{1 + static_cast<index_t>(engine() % 3),
                      1 + static_cast<index_t>(engine() % 3)};
    const Pair stride{1 + static_cast<index_t>(engine() % 3),
                      1 + static_cast<index_t>(engine() % 2)};
    const Pair padding{static_cast<index_t>(engine() % 3), static_cast<index_t>(engine() % 2)};
    const Pair dilation{1 + static_cast<index_t>(engine() % 2),
                        1 + static_cast<index_t>(engine() % 2)};
    const index_t channels = 1 + static_cast<index_t>(engine() % 3);
    const bool bias = engine() % 2 == 0;
    Conv2d<double> conv(channels, 2, kernel,
                        {.stride = stride,
                         .padding = padding,
                         .dilation = dilation,
                         .bias = bias,
                         .seed = static_cast<std::uint64_t>(trial)});
    const index_t height = 5 + static_cast<index_t>(engine() % 3);
    const index_t width = 5 + static_cast<index_t>(engine() % 3);
    SCOPED_TRACE(testing::concat_for_trace("k", kernel[0], kernel[1], "s", stride[0], stride[1],
                                           "p", padding[0], padding[1], "d", dilation[0],
                                           dilation[1], "C", channels, "bias", bias));
    auto x = random_tensor<double, 4>({2, channels, height, width}, engine);
    const auto dy = random_tensor<double, 4>(conv.output_shape(x.shape()), engine);
    const auto dx = conv.backward(x, dy);
    const auto loss = [&] {
      const auto y = conv.forward(x);
      double total = 0;
      for (index_t i = 0; i < y.size(); ++i) total += dy.data()[i] * y.data()[i];
      return total;
    };
    ASSERT_GRADIENT_OK(testing::gradcheck(loss, x, dx));
    ASSERT_GRADIENT_OK(testing::gradcheck(loss, conv.weight(), conv.weight_grad()));
    if (bias) {
      ASSERT_GRADIENT_OK(testing::gradcheck(loss, conv.bias(), conv.bias_grad()));
    }
  }
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

template <class Scalar>
class Conv2dTyped : public ::testing::Test {};
TYPED_TEST_SUITE(Conv2dTyped, testing::FloatAndDouble);

TYPED_TEST(Conv2dTyped, AgreeWithTorchNnConv2dForwardAndAutograd) {
  using Scalar = TypeParam;
  const auto check = [](const testing::Fixture& fixture) {
    const auto x = testing::tensor_from<Scalar, 4>(fixture.tensor("x"));
    const auto weight = testing::tensor_from<Scalar, 4>(fixture.tensor("weight"));
    const bool bias = fixture.meta_int("bias") != 0;
    Conv2d<Scalar> conv(
        x.dim(1), weight.dim(0), {weight.dim(2), weight.dim(3)},
        {.stride = {fixture.meta_int("stride_h"), fixture.meta_int("stride_w")},
         .padding = {fixture.meta_int("padding_h"), fixture.meta_int("padding_w")},
         .dilation = {fixture.meta_int("dilation_h"), fixture.meta_int("dilation_w")},
         .bias = bias});
    conv.set_weight(weight.view());
    if (bias) conv.set_bias(testing::tensor_from<Scalar, 1>(fixture.tensor("bias")).view());
    const auto dy = testing::tensor_from<Scalar, 4>(fixture.tensor("dy"));

    // Both torch and dissect are within γ_L·Σ|terms| of the exact value, so within twice that of
    // each other; L is the longest of the three reductions (a field + 1, N·Ho·Wo rows for dW and
    // db, O·kh·kw taps for dx).
    const index_t rows = dy.dim(0) * dy.dim(2) * dy.dim(3);
    const index_t length = std::max(
        {conv.field_size() + 1, rows, conv.out_channels() * weight.dim(2) * weight.dim(3)});
    const double factor = 2 * testing::gamma<Scalar>(length);
    auto magnitude = absolute_copy(conv);
    const auto abs_x = testing::to_double(testing::absolute(x));
    const auto abs_dy = testing::to_double(testing::absolute(dy));
    const auto abs_y = magnitude.forward(abs_x);
    const auto abs_dx = magnitude.backward(abs_x, abs_dy);

    const auto y_torch = testing::tensor_from<Scalar, 4>(fixture.tensor("y"));
    const auto dx_torch = testing::tensor_from<Scalar, 4>(fixture.tensor("dx"));
    const auto dweight_torch = testing::tensor_from<Scalar, 4>(fixture.tensor("dweight"));
    EXPECT_TENSOR_WITHIN(conv.forward(x), y_torch, scaled(abs_y, factor));
    EXPECT_TENSOR_WITHIN(conv.backward(x, dy), dx_torch, scaled(abs_dx, factor));
    EXPECT_TENSOR_WITHIN(conv.weight_grad(), dweight_torch,
                         scaled(magnitude.weight_grad(), factor));
    if (bias) {
      const auto dbias_torch = testing::tensor_from<Scalar, 1>(fixture.tensor("dbias"));
      EXPECT_TENSOR_WITHIN(conv.bias_grad(), dbias_torch, scaled(magnitude.bias_grad(), factor));
    }
  };
  EXPECT_EQ(testing::for_each_fixture<Scalar>("conv2d", check), 4);
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(Conv2dErrors, ImpossibleConstructionsNameTheField) {
  EXPECT_THROW_WITH(Conv2d<float>(0, 4, {3, 3}), ConfigError, "in_channels must be > 0");
  EXPECT_THROW_WITH(Conv2d<float>(3, -1, {3, 3}), ConfigError, "out_channels must be > 0");
  EXPECT_THROW_WITH(Conv2d<float>(3, 4, {0, 3}), ConfigError,
                    "Conv2d: kernel_size must be > 0 (got (0, 3))");
  EXPECT_THROW_WITH(Conv2d<float>(3, 4, {3, 3}, {.stride = {1, 0}}), ConfigError,
                    "Conv2d: stride must be > 0 (got (1, 0))");
  EXPECT_THROW_WITH(Conv2d<float>(3, 4, {3, 3}, {.padding = {-1, 0}}), ConfigError,
                    "Conv2d: padding must be >= 0 (got (-1, 0))");
  EXPECT_THROW_WITH(Conv2d<float>(3, 4, {3, 3}, {.dilation = {0, 0}}), ConfigError,
                    "Conv2d: dilation must be > 0 (got (0, 0))");
  EXPECT_THROW_WITH(Conv2d<float>(3, 4, {3, 3}, {.stride = {-2, 1}}), ConfigError,
                    "stride must be > 0");
}

TEST(Conv2dErrors, WrongShapesAreShapeErrorsAndLeaveTheGradientsAlone) {
  Conv2d<double> conv(3, 2, {3, 3}, {.seed = 2});
  const auto before_w = snapshot(conv.weight_grad());
  const Tensor<double, 4> wrong_channels({1, 4, 5, 5});
  EXPECT_THROW_WITH(conv.forward(wrong_channels), ShapeError,
                    "Conv2d::forward: input channels 4 != in_channels 3 (x: [1, 4, 5, 5], "
                    "weight: [2, 3, 3, 3])");
  // Output size ≤ 0: a 2×5 image under a 3×3 kernel without padding.
  const Tensor<double, 4> small({1, 3, 2, 5});
  EXPECT_THROW_WITH(conv.forward(small), ShapeError,
                    "Conv2d::forward: output height would be 0 <= 0 (x: [1, 3, 2, 5]");
  Conv2d<double> dilated(1, 1, {3, 3}, {.dilation = {4, 4}});
  EXPECT_THROW_WITH(dilated.forward(Tensor<double, 4>({1, 1, 8, 9})), ShapeError,
                    "output height would be 0 <= 0");
  EXPECT_THROW_WITH(dilated.forward(Tensor<double, 4>({1, 1, 9, 1})), ShapeError,
                    "output width would be -7 <= 0");
  const Tensor<double, 4> x({2, 3, 5, 5});
  const Tensor<double, 4> wrong_dy({2, 2, 3, 4});
  EXPECT_THROW_WITH(conv.backward(x, wrong_dy), ShapeError,
                    "Conv2d::backward: dy has shape [2, 2, 3, 4] but forward(x) has shape "
                    "[2, 2, 3, 3] (x: [2, 3, 5, 5])");
  EXPECT_THROW_WITH(conv.backward(wrong_channels, wrong_dy), ShapeError,
                    "Conv2d::backward: input channels 4");
  EXPECT_TENSOR_EQ(conv.weight_grad(), before_w);
  for (double g : conv.bias_grad()) EXPECT_EQ(g, 0.0);
  EXPECT_THROW_WITH(conv.set_weight(Tensor<double, 4>({2, 3, 3, 2}).view()), ShapeError, "weight");
}

}  // namespace test_conv2d
}  // namespace dissect
