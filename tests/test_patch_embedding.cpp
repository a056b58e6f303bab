// Tests for dissect/layers/patch_embedding.hpp: the series' point, that ViT's patch embedding (a
// Conv2d with stride = kernel) is exactly a Linear over flattened patches; patchify's layout;
// PyTorch fixtures (timm's proj(x).flatten(2).transpose(1, 2), and F.linear on the unfolded
// patches); finite differences in double; the module protocol and bad input.
#include "dissect/layers/patch_embedding.hpp"

#include <gtest/gtest.h>

#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "dissect/layers/linear.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_patch_embedding {

using testing::random_tensor;

/// The Linear the patch embedding is: W = proj.weight viewed as [D, C·P·P], b = proj.bias.
template <class Scalar>
Linear<Scalar> as_linear(const PatchEmbedding<Scalar>& embedding) {
  const auto w = embedding.proj().weight();
  Linear<Scalar> linear(w.dim(1) * w.dim(2) * w.dim(3), w.dim(0), {.seed = 0});
  linear.set_weight(w.reshape(Shape<2>{w.dim(0), -1}));
  linear.set_bias(embedding.proj().bias());
  return linear;
}

TEST(PatchEmbedding, ProjIsAConvolutionWithStrideEqualToKernel) {
  PatchEmbedding<float> embed(3, 16, 4, {.seed = 1});
  EXPECT_EQ(parameter_names(embed), (std::vector<std::string>{"proj.weight", "proj.bias"}));
  EXPECT_EQ(embed.proj().weight().shape(), (Shape<4>{16, 3, 4, 4}));
  EXPECT_EQ(embed.proj().stride(), (Pair{4, 4}));
  EXPECT_EQ(embed.parameter_count(), 16 * 48 + 16);
  std::ostringstream printed;
  printed << embed;
  EXPECT_EQ(printed.str(), "PatchEmbedding(3, 16, patch_size=4)");
  static_assert(Module<PatchEmbedding<double>>);
}

TEST(PatchEmbedding, PatchifyOrdersPatchesRowMajorAndValuesAsTheWeight) {
  // One 2-channel 2×4 image, P = 2: two patches side by side; each holds channel 0's 2×2 block
  // then channel 1's, row-major: the order of proj.weight's [C, P, P] axes.
  const Tensor<double, 4> x({1, 2, 2, 4}, {1, 2, 3, 4, 5, 6, 7, 8,  //
                                           10, 20, 30, 40, 50, 60, 70, 80});
  const Tensor<double, 3> expected({1, 2, 8}, {1, 2, 5, 6, 10, 20, 50, 60,  //
                                               3, 4, 7, 8, 30, 40, 70, 80});
  EXPECT_TENSOR_EQ(patchify(x, 2), expected);
  // And these are exactly the rows im2col builds for a convolution with stride = kernel.
  const PatchEmbedding<double> embed(2, 3, 2);
  EXPECT_TENSOR_EQ(embed.proj().im2col(x), expected.reshape(Shape<2>{2, 8}));
}

TEST(PatchEmbedding, IsExactlyALinearOverFlattenedPatches) {
  // Bit for bit, in both scalar types, on shapes that take float onto the packed GEMM
  // (N·patches > 32 rows) and off it: the convolution's fields do not overlap, so its im2col
  // matrix is patchify(x) and its product is the Linear's, on the same kernel.
  std::mt19937_64 engine(5);
  for (const auto& sizes : std::vector<std::array<index_t, 6>>{
           {2, 3, 8, 8, 5, 4}, {3, 2, 12, 16, 7, 2}, {1, 1, 6, 9, 3, 3}, {2, 3, 32, 32, 8, 4}}) {
    // Named copies: a lambda cannot capture structured bindings before clang 16.
    const index_t batch = sizes[0], channels = sizes[1], height = sizes[2], width = sizes[3],
                  dim = sizes[4], patch = sizes[5];
    SCOPED_TRACE(testing::concat_for_trace("N", batch, "C", channels, "H", height, "W", width, "D",
                                           dim, "P", patch));
    const auto check = [&]<class Scalar>(Scalar) {
      PatchEmbedding<Scalar> embed(channels, dim, patch, {.seed = 7});
      auto linear = as_linear(embed);
      const auto x = random_tensor<Scalar, 4>({batch, channels, height, width}, engine);
      const auto patches = patchify(x, patch);
      EXPECT_TENSOR_EQ(embed.forward(x), linear.forward(patches));
      // Backward too: the same dW and db, and dx = the Linear's dx put back into the image.
      const auto dy = random_tensor<Scalar, 3>({batch, patches.dim(1), dim}, engine);
      const auto dx = embed.backward(x, dy);
      const auto d_patches = linear.backward(patches, dy);
      EXPECT_TENSOR_EQ(patchify(dx, patch), d_patches);
      EXPECT_TENSOR_EQ(embed.proj().weight_grad().reshape(Shape<2>{dim, -1}), linear.weight_grad());
      EXPECT_TENSOR_EQ(embed.proj().bias_grad(), linear.bias_grad());
    };
    check(0.0f);
    check(0.0);
  }
}

TEST(PatchEmbeddingGradients, MatchFiniteDifferences) {
  std::mt19937_64 engine(23);
  for (int trial = 0; trial < testing::sweep_trials(10); ++trial) {
    const index_t patch = 1 + static_cast<index_t>(engine() % 3);
    const index_t channels = 1 + static_cast<index_t>(engine() % 3);
    PatchEmbedding<double> embed(channels, 3, patch, {.seed = static_cast<std::uint64_t>(trial)});
    auto x = random_tensor<double, 4>({2, channels, 2 * patch, 3 * patch}, engine);
    const auto dy = random_tensor<double, 3>({2, 6, 3}, engine);
    const auto dx = embed.backward(x, dy);
    const auto loss = [&] {
      const auto y = embed.forward(x);
      double total = 0;
      for (index_t i = 0; i < y.size(); ++i) total += dy.data()[i] * y.data()[i];
      return total;
    };
    ASSERT_GRADIENT_OK(testing::gradcheck(loss, x, dx));
    ASSERT_GRADIENT_OK(testing::gradcheck(loss, embed.proj().weight(), embed.proj().weight_grad()));
    ASSERT_GRADIENT_OK(testing::gradcheck(loss, embed.proj().bias(), embed.proj().bias_grad()));
  }
}

template <class Scalar>
class PatchEmbeddingTyped : public ::testing::Test {};
TYPED_TEST_SUITE(PatchEmbeddingTyped, testing::FloatAndDouble);

TYPED_TEST(PatchEmbeddingTyped, AgreeWithTimmPatchEmbedAndWithTorchLinearOnPatches) {
  using Scalar = TypeParam;
  const auto check = [](const testing::Fixture& fixture) {
    const auto x = testing::tensor_from<Scalar, 4>(fixture.tensor("x"));
    const auto weight = testing::tensor_from<Scalar, 4>(fixture.tensor("weight"));
    const auto bias = testing::tensor_from<Scalar, 1>(fixture.tensor("bias"));
    const index_t patch = fixture.meta_int("patch_size");
    PatchEmbedding<Scalar> embed(x.dim(1), weight.dim(0), patch);
    embed.proj().set_weight(weight.view());
    embed.proj().set_bias(bias.view());
    const auto dy = testing::tensor_from<Scalar, 3>(fixture.tensor("dy"));
    const auto y_torch = testing::tensor_from<Scalar, 3>(fixture.tensor("y"));
    const auto y_linear_torch = testing::tensor_from<Scalar, 3>(fixture.tensor("y_linear"));
    const auto patches_torch = testing::tensor_from<Scalar, 3>(fixture.tensor("patches"));
    const auto dx_torch = testing::tensor_from<Scalar, 4>(fixture.tensor("dx"));
    const auto dweight_torch = testing::tensor_from<Scalar, 4>(fixture.tensor("dweight"));
    const auto dbias_torch = testing::tensor_from<Scalar, 1>(fixture.tensor("dbias"));

    // torch's unfold is a copy: exactly patchify.
    EXPECT_TENSOR_EQ(patchify(x, patch), patches_torch);
    // Each output is a dot product of C·P·P + 1 terms, each gradient a sum over at most
    // max(N·patches, D) terms (fields do not overlap: one tap per pixel): twice γ_L·Σ|terms|
    // between two correct implementations, with Σ|terms| from the same layer on |·|.
    const index_t rows = dy.dim(0) * dy.dim(1);
    const index_t length = std::max({embed.proj().field_size() + 1, rows, embed.embed_dim()});
    const double factor = 2 * testing::gamma<Scalar>(length);
    PatchEmbedding<double> magnitude(x.dim(1), weight.dim(0), patch);
    magnitude.proj().set_weight(testing::to_double(testing::absolute(weight)).view());
    magnitude.proj().set_bias(testing::to_double(testing::absolute(bias)).view());
    const auto abs_x = testing::to_double(testing::absolute(x));
    const auto bound = [&](const auto& m) {
      auto b = testing::to_double(m);
      for (double& v : b) v = v * factor + std::numeric_limits<double>::denorm_min();
      return b;
    };
    const auto abs_y = bound(magnitude.forward(abs_x));
    const auto abs_dx = bound(magnitude.backward(abs_x, testing::to_double(testing::absolute(dy))));
    const auto y = embed.forward(x);
    EXPECT_TENSOR_WITHIN(y, y_torch, abs_y);
    EXPECT_TENSOR_WITHIN(y, y_linear_torch, abs_y);
    EXPECT_TENSOR_WITHIN(embed.backward(x, dy), dx_torch, abs_dx);
    EXPECT_TENSOR_WITHIN(embed.proj().weight_grad(), dweight_torch,
                         bound(magnitude.proj().weight_grad()));
    EXPECT_TENSOR_WITHIN(embed.proj().bias_grad(), dbias_torch,
                         bound(magnitude.proj().bias_grad()));
  };
  EXPECT_EQ(testing::for_each_fixture<Scalar>("patch_embedding", check), 2);
}

TEST(PatchEmbeddingErrors, ImagesThatAreNotWholePatchesAndWrongShapes) {
  PatchEmbedding<float> embed(3, 4, 4, {.seed = 3});
  EXPECT_THROW_WITH(embed.forward(Tensor<float, 4>({1, 3, 8, 10})), ShapeError,
                    "PatchEmbedding::forward: image 8x10 is not a whole number of 4x4 patches "
                    "(x: [1, 3, 8, 10])");
  EXPECT_THROW_WITH(embed.forward(Tensor<float, 4>({1, 2, 8, 8})), ShapeError,
                    "PatchEmbedding::forward: input channels 2 != in_channels 3 (x: [1, 2, 8, 8], "
                    "proj.weight: [4, 3, 4, 4])");
  EXPECT_THROW_WITH(embed.backward(Tensor<float, 4>({2, 3, 8, 8}), Tensor<float, 3>({2, 4, 5})),
                    ShapeError,
                    "PatchEmbedding::backward: dy has shape [2, 4, 5] but forward(x) has shape "
                    "[2, 4, 4]");
  for (float g : embed.proj().weight_grad()) EXPECT_EQ(g, 0.0f);
  EXPECT_THROW_WITH(PatchEmbedding<float>(3, 4, 0), ConfigError,
                    "PatchEmbedding: patch_size must be > 0");
  EXPECT_THROW_WITH(PatchEmbedding<float>(3, 0, 2), ConfigError, "out_channels must be > 0");
  EXPECT_THROW_WITH(patchify(Tensor<float, 4>({1, 1, 4, 4}), -2), ConfigError,
                    "patchify: patch_size must be > 0");
  EXPECT_THROW_WITH(patchify(Tensor<float, 4>({1, 1, 5, 4}), 2), ShapeError,
                    "patchify: image 5x4 is not a whole number of 2x2 patches");
}

}  // namespace test_patch_embedding
}  // namespace dissect
