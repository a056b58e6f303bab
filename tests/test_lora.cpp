// Tests of LoRA (dissect/lora.hpp, lora_adapter.hpp) and of freezing (module.hpp): LoRALinear
// against PyTorch fixtures (PEFT's arithmetic in plain torch) in float and double, finite
// differences in double (with and without dropout), merge and unmerge within the bound of their
// rounding, adapters applied to whole GPT-2 and LLaMA models by name (only the adapters train,
// the frozen base stays bit-identical), and every refused configuration.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "dissect/layers/quantized_linear.hpp"
#include "dissect/lora.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/tensor/freezing.hpp"
#include "dissect/training/loss.hpp"
#include "dissect/training/optim.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_lora {

using testing::FloatAndDouble;
using testing::random_ids;
using testing::random_tensor;
using testing::small_gpt2;
using testing::small_llama;

template <class Scalar>
using Matrix = Tensor<Scalar, 2>;

/// A LoRALinear in → out with random W, b, A and B (B non-zero, so the adapter is visible).
template <class Scalar>
LoRALinear<Scalar> random_lora(index_t in, index_t out, LoRAOptions options,
                               std::mt19937_64& engine) {
  Linear<Scalar> base(random_tensor<Scalar, 2>({out, in}, engine),
                      random_tensor<Scalar, 1>({out}, engine));
  LoRALinear<Scalar> layer(std::move(base), options);
  layer.adapter().set_A(random_tensor<Scalar, 2>({options.rank, in}, engine));
  layer.adapter().set_B(random_tensor<Scalar, 2>({out, options.rank}, engine));
  return layer;
}

/// y = x·Wᵀ + b + s·(x·Aᵀ)·Bᵀ in double, and the per-element bound on the error of computing it
/// in Scalar by each of two implementations: 2·γ_{K+r+3}·(|x|·|W|ᵀ + |b| + |s|·(|x|·|A|ᵀ)·|B|ᵀ).
struct Oracle {
  Tensor<double, 2> y;
  Tensor<double, 2> bound;
};
template <class Scalar>
Oracle lora_oracle(const Matrix<Scalar>& x, const Matrix<Scalar>& w,
                   std::type_identity_t<const Tensor<Scalar, 1>*> b, const Matrix<Scalar>& a,
                   const Matrix<Scalar>& bm, double scale) {
  const auto xd = testing::to_double(x), wd = testing::to_double(w), ad = testing::to_double(a),
             bd = testing::to_double(bm);
  Oracle oracle{Tensor<double, 2>({x.dim(0), w.dim(0)}), Tensor<double, 2>({x.dim(0), w.dim(0)})};
  oracle.y.matrix() = xd.matrix() * wd.matrix().transpose() +
                      scale * (xd.matrix() * ad.matrix().transpose()) * bd.matrix().transpose();
  oracle.bound.matrix() = xd.matrix().cwiseAbs() * wd.matrix().cwiseAbs().transpose() +
                          std::abs(scale) *
                              (xd.matrix().cwiseAbs() * ad.matrix().cwiseAbs().transpose()) *
                              bd.matrix().cwiseAbs().transpose();
  if (b) {
    const auto bias = testing::to_double(*b);
    oracle.y.matrix().rowwise() += bias.vector().transpose();
    oracle.bound.matrix().rowwise() += bias.vector().cwiseAbs().transpose();
  }
  oracle.bound.matrix() *= 2 * testing::gamma<Scalar>(x.dim(1) + a.dim(0) + 3);
  return oracle;
}

// ---- the layer ----------------------------------------------------------------------------------

template <class Scalar>
class LoRALinearTest : public ::testing::Test {};
TYPED_TEST_SUITE(LoRALinearTest, FloatAndDouble);

TYPED_TEST(LoRALinearTest, StartsEqualToItsBaseAndTrainsOnlyAAndB) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(1);
  Linear<Scalar> base(12, 7, {.seed = 3});
  const LoRALinear<Scalar> layer(base, {.rank = 4, .alpha = 8, .seed = 5});
  const auto x = random_tensor<Scalar, 3>({2, 3, 12}, engine);
  // B = 0 at initialisation, so the update adds exact zeros.
  EXPECT_TENSOR_EQ(layer.forward(x), base.forward(x));
  EXPECT_EQ(parameter_names(layer), (std::vector<std::string>{"lora_A.weight", "lora_B.weight"}));
  EXPECT_EQ(layer.parameter_count(), 4 * 12 + 7 * 4);
  EXPECT_TRUE(layer.base().frozen());
  EXPECT_EQ(layer.adapter().scale(), Scalar(2));
  // A is Kaiming-uniform as nn.Linear's weight: inside ±1/√in, and not all zero.
  const auto a = layer.adapter().A();
  const double bound = 1 / std::sqrt(12.0);
  EXPECT_TRUE(std::all_of(a.begin(), a.end(), [&](Scalar v) { return std::abs(v) <= bound; }));
  EXPECT_TRUE(std::any_of(a.begin(), a.end(), [](Scalar v) { return v != 0; }));
}

/// A fixture tensor as a [numel / cols, cols] matrix: leading axes folded, as the layer folds them.
template <class Scalar>
Matrix<Scalar> matrix_from(const testing::FixtureTensor& source, index_t cols) {
  std::vector<Scalar> values(source.values.begin(), source.values.end());
  return Matrix<Scalar>({source.numel() / cols, cols}, std::move(values));
}

/// |P|·|Q| in double: the magnitude a rounded product P·Q is bounded by.
Eigen::MatrixXd abs_product(const Eigen::MatrixXd& p, const Eigen::MatrixXd& q) {
  return p.cwiseAbs() * q.cwiseAbs();
}

TYPED_TEST(LoRALinearTest, MatchesPyTorchFixtures) {
  using Scalar = TypeParam;
  const auto check = [](const testing::Fixture& f) {
    const index_t in = f.meta_int("in_features"), out = f.meta_int("out_features");
    const index_t rank = f.meta_int("rank");
    const double alpha = static_cast<double>(f.meta_int("alpha"));
    std::optional<Tensor<Scalar, 1>> bias;
    if (f.meta_bool("bias")) bias = testing::tensor_from<Scalar, 1>(f.tensor("b"));
    const auto w = testing::tensor_from<Scalar, 2>(f.tensor("W"));
    LoRALinear<Scalar> layer(Linear<Scalar>(w, bias), {.rank = rank, .alpha = alpha});
    layer.adapter().set_A(testing::tensor_from<Scalar, 2>(f.tensor("A")));
    layer.adapter().set_B(testing::tensor_from<Scalar, 2>(f.tensor("B")));
    ASSERT_DOUBLE_EQ(layer.adapter().scale(), std::stod(f.meta_str("scaling")));
    const auto x = matrix_from<Scalar>(f.tensor("x"), in);
    const auto dy = matrix_from<Scalar>(f.tensor("dy"), out);
    const auto a = Matrix<Scalar>(layer.adapter().A()), b = Matrix<Scalar>(layer.adapter().B());

    // y: each of torch and dissect within the oracle's bound of the exact value.
    const Oracle oracle = lora_oracle(x, w, bias ? &*bias : nullptr, a, b, alpha / rank);
    const auto y = layer.forward(x);
    EXPECT_TENSOR_WITHIN(testing::to_double(y),
                         testing::to_double(matrix_from<Scalar>(f.tensor("y"), out)), oracle.bound);

    // dx = dy·W + s·(dy·B)·A, dA = s·(dy·B)ᵀ·x, dB = s·dyᵀ·(x·Aᵀ): two implementations, each
    // within γ_n of the magnitudes of its products, n the longest chain of sums.
    const auto dx = layer.backward(x, dy);
    const Eigen::MatrixXd xd = testing::to_double(x).matrix(),
                          dyd = testing::to_double(dy).matrix(),
                          wd = testing::to_double(w).matrix(), ad = testing::to_double(a).matrix(),
                          bd = testing::to_double(b).matrix();
    const double s = std::abs(alpha / rank);
    const index_t rows = x.dim(0);
    const auto within = [&](const auto& actual, const char* name, const Eigen::MatrixXd& magnitude,
                            index_t chain) {
      SCOPED_TRACE(name);
      const auto expected = testing::tensor_from<Scalar, 2>(f.tensor(name));
      Tensor<double, 2> bound(expected.shape());
      bound.matrix() = 2 * testing::gamma<Scalar>(chain) * magnitude;
      EXPECT_TENSOR_WITHIN(testing::to_double(actual), testing::to_double(expected), bound);
    };
    Tensor<double, 2> dx_magnitude({rows, in});
    dx_magnitude.matrix() = abs_product(dyd, wd) + s * abs_product(abs_product(dyd, bd), ad);
    const auto expected_dx = matrix_from<Scalar>(f.tensor("dx"), in);
    Tensor<double, 2> dx_bound(expected_dx.shape());
    dx_bound.matrix() = 2 * testing::gamma<Scalar>(out + rank + 3) * dx_magnitude.matrix();
    EXPECT_TENSOR_WITHIN(testing::to_double(dx), testing::to_double(expected_dx), dx_bound);
    within(layer.adapter().A_grad(), "dA", s * abs_product(abs_product(dyd, bd).transpose(), xd),
           out + rows + 3);
    within(layer.adapter().B_grad(), "dB",
           s * abs_product(dyd.transpose(), abs_product(xd, ad.transpose())), in + rows + 3);

    // PEFT's merge: W + (B·A)·s.
    layer.merge();
    within(layer.base().weight(), "W_merged", wd.cwiseAbs() + s * abs_product(bd, ad), rank + 2);
  };
  EXPECT_EQ(testing::for_each_fixture<Scalar>("lora", check), 4);
}

TYPED_TEST(LoRALinearTest, ForwardAndBackwardAreWithinTheRoundingBoundOfTheDoubleOracle) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(2);
  const index_t in = 33, out = 17, rank = 3;
  auto layer = random_lora<Scalar>(in, out, {.rank = rank, .alpha = 5}, engine);
  const auto x = random_tensor<Scalar, 2>({9, in}, engine);
  const auto dy = random_tensor<Scalar, 2>({9, out}, engine);
  const auto& base = layer.base();
  const auto bias = Tensor<Scalar, 1>(base.bias());
  const Oracle oracle =
      lora_oracle(x, Matrix<Scalar>(base.weight()), &bias, Matrix<Scalar>(layer.adapter().A()),
                  Matrix<Scalar>(layer.adapter().B()), 5.0 / 3.0);
  EXPECT_TENSOR_WITHIN(testing::to_double(layer.forward(x)), oracle.y, oracle.bound);

  const auto dx = layer.backward(x, dy);
  // dx = dy·W + s·(dy·B)·A; dA = s·(dy·B)ᵀ·x; dB = s·dyᵀ·(x·Aᵀ), in double.
  const auto xd = testing::to_double(x), dyd = testing::to_double(dy);
  const auto w = testing::to_double(base.weight()), a = testing::to_double(layer.adapter().A()),
             b = testing::to_double(layer.adapter().B());
  const double s = 5.0 / 3.0;
  Tensor<double, 2> dx_ref({9, in}), da_ref({rank, in}), db_ref({out, rank});
  dx_ref.matrix() = dyd.matrix() * w.matrix() + s * (dyd.matrix() * b.matrix()) * a.matrix();
  da_ref.matrix() = s * (dyd.matrix() * b.matrix()).transpose() * xd.matrix();
  db_ref.matrix() = s * dyd.matrix().transpose() * (xd.matrix() * a.matrix().transpose());
  // Each is a sum of at most max(in, out, 9)·(r + 1) rounded products: a normwise bound.
  const double tol = 4 * testing::gamma<Scalar>(2 * (in + out + 9 + rank));
  const auto close = [&](const auto& actual, const Tensor<double, 2>& expected) {
    const double scale = std::max(1.0, expected.matrix().cwiseAbs().maxCoeff()) * 40;
    EXPECT_TENSOR_NEAR(testing::to_double(actual), expected, 0.0, tol * scale);
  };
  close(dx, dx_ref);
  close(layer.adapter().A_grad(), da_ref);
  close(layer.adapter().B_grad(), db_ref);
  EXPECT_THROW_WITH((void)base.weight_grad(), Error, "frozen");
}

TEST(LoRALinear, GradientsMatchFiniteDifferences) {
  std::mt19937_64 engine(3);
  for (const double dropout : {0.0, 0.3}) {
    SCOPED_TRACE(dropout);
    auto layer =
        random_lora<double>(10, 6, {.rank = 2, .alpha = 3, .dropout = dropout, .seed = 9}, engine);
    auto x = random_tensor<double, 3>({2, 4, 10}, engine);
    const auto dy = random_tensor<double, 3>({2, 4, 6}, engine);
    LoRALinear<double>::Cache cache;
    layer.forward(x, cache);
    const LoRALinear<double>::Cache fixed = cache;  // the mask of this draw, for every loss call
    const auto loss = [&] {
      LoRALinear<double>::Cache replay = fixed;
      replay.draws -= 1;
      const auto y = layer.forward(x, replay);
      return (y.matrix().array() * dy.matrix().array()).sum();
    };
    layer.zero_grad();
    const auto dx = layer.backward(x, cache, dy);
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, x, dx));
    EXPECT_GRADIENT_OK(
        testing::gradcheck(loss, layer.adapter().A(), testing::snapshot(layer.adapter().A_grad())));
    EXPECT_GRADIENT_OK(
        testing::gradcheck(loss, layer.adapter().B(), testing::snapshot(layer.adapter().B_grad())));
  }
}

TEST(LoRALinear, DropoutIsSeededInvertedAndOnlyInTraining) {
  std::mt19937_64 engine(4);
  const auto layer =
      random_lora<double>(200, 3, {.rank = 2, .alpha = 2, .dropout = 0.25, .seed = 1}, engine);
  const auto x = random_tensor<double, 2>({50, 200}, engine, 0.5, 1.0);
  LoRALinear<double>::Cache first, second;
  const auto y1 = layer.forward(x, first);
  const auto y2 = layer.forward(x, second);
  EXPECT_TENSOR_EQ(y1, y2);  // same seed, same draw: reproducible
  const auto y3 = layer.forward(x, first);
  EXPECT_GT((y3.matrix() - y1.matrix()).cwiseAbs().maxCoeff(), 0.0);  // the next draw differs
  const auto keep = first.keep.matrix();
  const double dropped = static_cast<double>((keep.array() == 0).count()) / keep.size();
  EXPECT_NEAR(dropped, 0.25, 0.02);  // 10,000 draws: σ ≈ 0.004
  EXPECT_TRUE(((keep.array() == 0) || (keep.array() == 1 / 0.75)).all());
  // Inference applies no dropout.
  auto plain = layer.base().forward(x);
  layer.adapter().forward_add(x.matrix(), plain.matrix());
  EXPECT_TENSOR_EQ(layer.forward(x), plain);
}

TYPED_TEST(LoRALinearTest, MergeEqualsTheAdaptedForwardAndUnmergeRestoresTheWeight) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(5);
  auto layer = random_lora<Scalar>(24, 20, {.rank = 4, .alpha = 16}, engine);
  const auto w0 = Matrix<Scalar>(layer.base().weight());
  const auto x = random_tensor<Scalar, 2>({6, 24}, engine);
  const auto adapted = layer.forward(x);
  const auto delta = layer.adapter().delta_weight();
  layer.merge();
  EXPECT_TRUE(layer.merged());
  const auto merged = layer.forward(x);
  // Merging rounds ΔW once more into W (u·|W + ΔW| per entry) and moves the adapter's products
  // into the base's: both are within the oracle's bound.
  const Oracle oracle = lora_oracle(x, w0, nullptr, Matrix<Scalar>(layer.adapter().A()),
                                    Matrix<Scalar>(layer.adapter().B()), 4.0);
  auto bound = oracle.bound;
  bound.matrix().array() *= 2;
  EXPECT_TENSOR_WITHIN(testing::to_double(merged), testing::to_double(adapted), bound);
  EXPECT_THROW_WITH(layer.merge(), Error, "already merged");
  typename LoRALinear<Scalar>::Cache cache;
  EXPECT_THROW_WITH(layer.forward(x, cache), Error, "unmerge it to train");
  EXPECT_THROW_WITH(layer.backward(x, adapted), Error, "unmerge it to train");
  layer.unmerge();
  // W + ΔW − ΔW: two roundings, each at most u·(|W| + |ΔW|).
  Tensor<double, 2> restore_bound(w0.shape());
  restore_bound.matrix() =
      2 * testing::unit_roundoff<Scalar>() *
      (testing::to_double(w0).matrix().cwiseAbs() + testing::to_double(delta).matrix().cwiseAbs());
  EXPECT_TENSOR_WITHIN(testing::to_double(layer.base().weight()), testing::to_double(w0),
                       restore_bound);
  EXPECT_THROW_WITH(layer.unmerge(), Error, "not merged");
}

TYPED_TEST(LoRALinearTest, ALinearCarryingAnAdapterIsTheSameLayer) {
  using Scalar = TypeParam;
  std::mt19937_64 engine(6);
  auto lora = random_lora<Scalar>(16, 8, {.rank = 2, .alpha = 4}, engine);
  Linear<Scalar> carrier(Matrix<Scalar>(lora.base().weight()),
                         Tensor<Scalar, 1>(lora.base().bias()));
  carrier.attach_adapter(lora.adapter());
  EXPECT_TRUE(carrier.frozen());
  EXPECT_EQ(parameter_names(carrier),
            (std::vector<std::string>{"weight", "bias", "lora_A.weight", "lora_B.weight"}));
  EXPECT_EQ(trainable_parameter_count(carrier), lora.parameter_count());
  std::ostringstream printed;
  printed << carrier;
  EXPECT_EQ(printed.str(),
            "Linear(in_features=16, out_features=8, bias=true, frozen, lora_rank=2, lora_alpha=4)");
  const auto x = random_tensor<Scalar, 2>({5, 16}, engine);
  const auto dy = random_tensor<Scalar, 2>({5, 8}, engine);
  EXPECT_TENSOR_EQ(carrier.forward(x), lora.forward(x));
  EXPECT_TENSOR_EQ(carrier.backward(x, dy), lora.backward(x, dy));
  EXPECT_TENSOR_EQ(carrier.adapter().A_grad(), lora.adapter().A_grad());
  EXPECT_TENSOR_EQ(carrier.adapter().B_grad(), lora.adapter().B_grad());
  // A first layer's parameter-only backward trains the adapter and nothing else.
  carrier.zero_grad();
  carrier.backward_parameters(x, dy);
  EXPECT_TENSOR_EQ(carrier.adapter().B_grad(), lora.adapter().B_grad());
  carrier.merge_adapter();
  EXPECT_THROW_WITH(carrier.backward(x, dy), Error, "unmerge it to train");
  EXPECT_THROW_WITH(carrier.merge_adapter(), Error, "already merged");
  const auto adapter = carrier.detach_adapter();  // merged: W keeps ΔW (merge_and_unload)
  EXPECT_FALSE(carrier.has_adapter());
  EXPECT_EQ(adapter.rank(), 2);
  EXPECT_THROW_WITH(carrier.adapter(), Error, "no LoRA adapter");
}

// ---- state changed behind a merged layer's back (docs/reliability.md rows 57 and 58) ---------

/// A Linear in → out with random W and b, carrying an adapter with random A and B whose
/// gradients one backward has filled.
Linear<double> adapted_linear(index_t in, index_t out, std::mt19937_64& engine) {
  Linear<double> layer(random_tensor<double, 2>({out, in}, engine),
                       random_tensor<double, 1>({out}, engine));
  auto& adapter = layer.attach_adapter({.rank = 3, .alpha = 6, .seed = 1});
  adapter.set_B(random_tensor<double, 2>({out, 3}, engine));
  layer.backward(random_tensor<double, 2>({5, in}, engine),
                 random_tensor<double, 2>({5, out}, engine));
  return layer;
}

/// The adapted forward of base W and b and `adapter` as it is now, in double.
Tensor<double, 2> adapted_forward(const Matrix<double>& w, const Linear<double>& layer,
                                  const Matrix<double>& x) {
  Linear<double> reference(w, Tensor<double, 1>(layer.bias()));
  reference.attach_adapter(LoRAAdapter<double>(layer.adapter()));
  return reference.forward(x);
}

TEST(LoRAMergedState, AnOptimizerStepOnAMergedAdapterIsSeenAndUnmergeRestoresTheBase) {
  std::mt19937_64 engine(21);
  Linear<double> layer = adapted_linear(10, 12, engine);
  const Matrix<double> w0(layer.weight());
  const auto x = random_tensor<double, 2>({4, 10}, engine);
  Sgd<double> sgd(layer, {.lr = 0.5});  // A and B: built before the merge
  layer.merge_adapter();
  sgd.step();  // moves A and B while merged
  EXPECT_TENSOR_NEAR(layer.forward(x), adapted_forward(w0, layer, x), 1e-12, 1e-12);
  layer.unmerge_adapter();
  EXPECT_TENSOR_NEAR(layer.weight(), w0, 1e-13, 1e-13);  // not W0 + ΔW(old) − ΔW(new)
  EXPECT_TENSOR_NEAR(layer.forward(x), adapted_forward(w0, layer, x), 1e-12, 1e-12);
  // Merged again and changed again, then detached: W keeps the update forward computed.
  layer.merge_adapter();
  layer.adapter().set_A(random_tensor<double, 2>({3, 10}, engine));
  const auto before = layer.forward(x);
  EXPECT_TENSOR_NEAR(before, adapted_forward(w0, layer, x), 1e-12, 1e-12);
  layer.detach_adapter();
  EXPECT_TENSOR_NEAR(layer.forward(x), before, 1e-12, 1e-12);
}

TEST(LoRAMergedState, ANewWeightOrTrainingOnAMergedLayerIsRefusedAndChangesNothing) {
  std::mt19937_64 engine(22);
  Linear<double> layer = adapted_linear(6, 5, engine);
  layer.merge_adapter();
  const Matrix<double> merged(layer.weight());
  EXPECT_THROW_WITH(layer.set_weight(random_tensor<double, 2>({5, 6}, engine)), Error,
                    "Linear::set_weight: the LoRA adapter is merged into the weight; "
                    "unmerge_adapter() first");
  EXPECT_THROW_WITH(layer.set_frozen(false), Error,
                    "Linear::set_frozen(false): the LoRA adapter is merged into the weight");
  EXPECT_TRUE(layer.frozen());
  EXPECT_TENSOR_EQ(layer.weight(), merged);
  ASSERT_TRUE(layer.weight_write_refusal().has_value());
  layer.unmerge_adapter();
  EXPECT_FALSE(layer.weight_write_refusal().has_value());
  // A base made trainable again must be frozen before merging: an optimizer would move W.
  layer.set_frozen(false);
  const Matrix<double> base(layer.weight());
  EXPECT_THROW_WITH(layer.merge_adapter(), Error, "Linear::merge_adapter: the weight is trainable");
  EXPECT_FALSE(layer.adapter_merged());
  EXPECT_TENSOR_EQ(layer.weight(), base);
}

TEST(LoRAMergedState, ALoRALinearStaysRightWhenItsAdapterMovesOrItsBaseIsPacked) {
  std::mt19937_64 engine(23);
  auto layer = random_lora<float>(16, 8, {.rank = 2, .alpha = 4}, engine);
  const Matrix<float> w0(layer.base().weight());
  const auto x = random_tensor<float, 2>({3, 16}, engine);
  layer.backward(x, random_tensor<float, 2>({3, 8}, engine));
  Sgd<float> sgd(layer, {.lr = 0.5});
  layer.merge();
  sgd.step();
  Linear<float> reference(w0, Tensor<float, 1>(layer.base().bias()));
  reference.attach_adapter(LoRAAdapter<float>(layer.adapter()));
  EXPECT_TENSOR_NEAR(layer.forward(x), reference.forward(x), 1e-5, 1e-5);
  layer.unmerge();
  EXPECT_TENSOR_NEAR(layer.base().weight(), w0, 1e-6, 1e-6);
  // A packed base repacks on merge: forward sees ΔW, not the packed copy of W alone.
  Linear<float> packed_base(w0, Tensor<float, 1>(layer.base().bias()));
  packed_base.pack();
  LoRALinear<float> packed(std::move(packed_base), {.rank = 2, .alpha = 4});
  packed.adapter().set_A(Matrix<float>(layer.adapter().A()));
  packed.adapter().set_B(Matrix<float>(layer.adapter().B()));
  const auto adapted = packed.forward(x);
  packed.merge();
  EXPECT_TENSOR_NEAR(packed.forward(x), adapted, 1e-5, 1e-5);
  packed.unmerge();
  EXPECT_TENSOR_NEAR(packed.forward(x), adapted, 1e-5, 1e-5);
}

TEST(LoRALinear, RefusesBadOptionsAndShapes) {
  const Linear<float> base(8, 4, {.seed = 1});
  EXPECT_THROW_WITH(LoRALinear<float>(base, {.rank = 0}), ConfigError, "LoRAOptions.rank");
  EXPECT_THROW_WITH(LoRALinear<float>(base, {.rank = -3}), ConfigError, "LoRAOptions.rank");
  EXPECT_THROW_WITH(LoRALinear<float>(base, {.alpha = NAN}), ConfigError, "LoRAOptions.alpha");
  EXPECT_THROW_WITH(LoRALinear<float>(base, {.alpha = 0}), ConfigError, "LoRAOptions.alpha");
  EXPECT_THROW_WITH(LoRALinear<float>(base, {.dropout = 1}), ConfigError, "LoRAOptions.dropout");
  EXPECT_THROW_WITH(LoRALinear<float>(base, {.dropout = -0.1}), ConfigError, "LoRAOptions.dropout");
  EXPECT_THROW_WITH(LoRALinear<float>(base, {.dropout = NAN}), ConfigError, "LoRAOptions.dropout");

  LoRALinear<float> layer(base, {.rank = 2, .dropout = 0.5, .seed = 2});
  const Tensor<float, 2> x({3, 8}), wrong_x({3, 9}), dy({3, 4}), wrong_dy({3, 5});
  EXPECT_THROW_WITH(layer.forward(wrong_x), ShapeError, "in_features 8");
  EXPECT_THROW_WITH(layer.backward(x, wrong_dy), ShapeError, "dy has shape [3, 5]");
  LoRALinear<float>::Cache empty;
  EXPECT_THROW_WITH(layer.backward(x, empty, dy), ShapeError, "dropout mask [0, 0]");
  EXPECT_EQ(layer.adapter().A_grad().matrix().cwiseAbs().maxCoeff(), 0.0f);  // untouched

  Linear<float> carrier(8, 4, {.seed = 3});
  carrier.attach_adapter({.rank = 2});
  EXPECT_THROW_WITH(carrier.attach_adapter({.rank = 2}), Error, "already has a LoRA adapter");
  EXPECT_THROW_WITH((void)LoRALinear<float>(carrier), Error, "already carries a LoRA adapter");
  Linear<float> other(8, 4, {.seed = 4});
  EXPECT_THROW_WITH(other.attach_adapter(LoRAAdapter<float>(8, 5, {.rank = 2})), ShapeError,
                    "does not fit weight [4, 8]");
  EXPECT_THROW_WITH(other.unmerge_adapter(), Error, "no LoRA adapter");
}

// ---- adapters in models -------------------------------------------------------------------------

/// The mean cross-entropy of `model` on fixed tokens.
template <class Model>
auto loss_of(const Model& model, const TokenBatch& tokens, const std::vector<index_t>& targets) {
  const auto logits = model.forward(tokens);
  return cross_entropy(logits.cview().reshape(Shape<2>{-1, model.config().vocab}), targets);
}

template <class Model>
void expect_adapters_train_alone(const TransformerConfig& config, const LoRAConfig& lora,
                                 const std::vector<std::string>& expected_paths) {
  Model model(config, {.seed = 11});
  const Model base = model;
  const auto ids = random_ids(2 * 8, config.vocab, 1);
  const auto targets = random_ids(ids.size(), config.vocab, 2);
  const TokenBatch tokens{ids, 2, 8};
  const auto logits_before = model.forward(tokens);

  EXPECT_EQ(apply_lora(model, lora), expected_paths);
  EXPECT_TENSOR_EQ(model.forward(tokens), logits_before);  // B = 0: the base model, exactly
  index_t adapter_size = 0;
  for_each_layer(model, [&](const std::string&, Linear<float>& layer) {
    if (layer.has_adapter()) adapter_size += layer.adapter().parameter_count();
  });
  EXPECT_EQ(trainable_parameter_count(model), adapter_size);
  Adam<float> adam(model, {.lr = 1e-2});
  ASSERT_EQ(adam.parameter_count(), adapter_size);
  for (const auto& ref : adam.parameters()) {
    EXPECT_TRUE(ref.name.ends_with(".lora_A.weight") || ref.name.ends_with(".lora_B.weight"))
        << ref.name;
  }

  typename Model::Cache cache;
  const float first = loss_of(model, tokens, targets);
  for (int step = 0; step < 20; ++step) {
    adam.zero_grad();
    model.loss_and_backward(tokens, targets, cache);
    adam.step();
  }
  EXPECT_LT(loss_of(model, tokens, targets), first - 0.05f);
  // The frozen base: every value bit-identical to the untouched copy.
  std::vector<std::string> changed;
  std::vector<Tensor<float, 1>> base_values;
  base.for_each_parameter(
      [&](const ParameterName&, auto value, auto) { base_values.emplace_back(value.flatten()); });
  std::size_t i = 0;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto grad) {
    if (!is_frozen_parameter(value, grad)) return;
    const auto flat = value.flatten();
    if (!std::equal(flat.begin(), flat.end(), base_values.at(i).begin())) {
      changed.push_back(name.str());
    }
    ++i;
  });
  EXPECT_EQ(i, base_values.size());
  EXPECT_TRUE(changed.empty()) << changed.front();

  // Merged, the model computes the same logits with its base's products alone.
  const auto adapted = model.forward(tokens);
  EXPECT_EQ(merge_adapters(model), static_cast<index_t>(expected_paths.size()));
  EXPECT_TENSOR_NEAR(model.forward(tokens), adapted, 1e-4, 1e-4);
  EXPECT_EQ(unmerge_adapters(model), static_cast<index_t>(expected_paths.size()));
}

TEST(LoRAModels, Gpt2AttentionAdaptersTrainAloneAndMerge) {
  expect_adapters_train_alone<GPT2Model<float>>(
      small_gpt2(), {.adapter = {.rank = 4, .alpha = 8, .seed = 3}, .target_modules = {"qkv"}},
      {"h.0.attn.qkv", "h.1.attn.qkv"});
}

TEST(LoRAModels, LlamaPatternAdaptersIncludingTheHeadTrainAloneAndMerge) {
  expect_adapters_train_alone<LlamaModel<float>>(
      small_llama(),
      {.adapter = {.rank = 2, .alpha = 4, .seed = 5},
       .target_pattern = R"(layers\.1\.mlp\.(gate|down)|lm_head)"},
      {"layers.1.mlp.gate", "layers.1.mlp.down", "lm_head"});
}

template <class Model>
void expect_adapter_gradients_match_finite_differences(const TransformerConfig& config,
                                                       const LoRAConfig& lora) {
  Model model(config, {.init_std = 0.3, .seed = 21});
  apply_lora(model, lora);
  // Non-zero B, so that A's gradient is not trivially zero.
  std::mt19937_64 engine(8);
  for_each_layer(model, [&](const std::string&, Linear<double>& layer) {
    if (!layer.has_adapter()) return;
    auto b = layer.adapter().B();
    for (auto& v : b) v = std::uniform_real_distribution<double>(-0.5, 0.5)(engine);
  });
  const auto ids = random_ids(2 * 6, config.vocab, 3);
  const auto targets = random_ids(ids.size(), config.vocab, 4);
  const TokenBatch tokens{ids, 2, 6};
  typename Model::Cache cache;
  model.zero_grad();
  model.loss_and_backward(tokens, targets, cache);
  const auto loss = [&] { return loss_of(model, tokens, targets); };
  index_t checked = 0;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto grad) {
    if (is_frozen_parameter(value, grad)) return;
    SCOPED_TRACE(name.str());
    ++checked;
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, value, testing::snapshot(grad),
                                          {.richardson = true, .sample = 10, .seed = 5}));
  });
  EXPECT_GT(checked, 0);
}

TEST(LoRAModels, Gpt2AdapterGradientsMatchFiniteDifferences) {
  expect_adapter_gradients_match_finite_differences<GPT2Model<double>>(
      small_gpt2(), {.adapter = {.rank = 2, .alpha = 4, .seed = 1},
                     .target_modules = {"attn.qkv", "attn.proj", "mlp.up", "mlp.down"}});
}

TEST(LoRAModels, LlamaAdapterGradientsMatchFiniteDifferences) {
  expect_adapter_gradients_match_finite_differences<LlamaModel<double>>(
      small_llama(), {.adapter = {.rank = 2, .alpha = 2, .seed = 2},
                      .target_modules = {"qkv", "gate", "lm_head"}});
}

TEST(LoRAModels, RefusesTargetsThatSelectNothing) {
  GPT2Model<float> model(small_gpt2(), {.seed = 1});
  EXPECT_THROW_WITH(apply_lora(model, {}), ConfigError, "no target_modules");
  EXPECT_THROW_WITH(apply_lora(model, {.target_modules = {"q_proj"}}), ConfigError,
                    "h.0.attn.qkv, h.0.attn.proj");
  // "attn" names a block, not a Linear; a suffix must match whole module names.
  EXPECT_THROW_WITH(apply_lora(model, {.target_modules = {"attn", "kv"}}), ConfigError,
                    "no Linear layer matches");
  EXPECT_THROW_WITH(apply_lora(model, {.target_pattern = "h.(0"}), ConfigError,
                    "not a regular expression");
  EXPECT_THROW_WITH(apply_lora(model, {.adapter = {.rank = 0}, .target_modules = {"qkv"}}),
                    ConfigError, "rank");
  // Nothing was frozen by the refused calls.
  EXPECT_EQ(trainable_parameter_count(model), model.parameter_count());
  apply_lora(model, {.target_modules = {"qkv"}});
  EXPECT_THROW_WITH(apply_lora(model, {.target_modules = {"qkv"}}), Error,
                    "already has a LoRA adapter");
}

TEST(LoRAModels, TargetsMatchWholeNamesOrTheWholePattern) {
  const LoRAConfig names{.target_modules = {"qkv", "mlp.up"}};
  EXPECT_TRUE(lora_targets(names, "h.0.attn.qkv"));
  EXPECT_TRUE(lora_targets(names, "qkv"));
  EXPECT_TRUE(lora_targets(names, "h.11.mlp.up"));
  EXPECT_FALSE(lora_targets(names, "h.0.attn.xqkv"));
  EXPECT_FALSE(lora_targets(names, "h.0.attn.proj"));
  const LoRAConfig pattern{.target_pattern = R"(h\.[01]\.attn\.qkv)"};
  EXPECT_TRUE(lora_targets(pattern, "h.1.attn.qkv"));
  EXPECT_FALSE(lora_targets(pattern, "h.10.attn.qkv"));
  EXPECT_FALSE(lora_targets(pattern, "xh.1.attn.qkv"));
}

}  // namespace test_lora
}  // namespace dissect

namespace dissect {
namespace test_lora {

// Linear keeps a mode's state in boxes that a move empties (layers/linear/detail/boxed.hpp); the
// calls that reach into them must leave with them, or a moved-from layer (an empty 0 → 0 layer)
// would follow a call into an empty box.
TEST(LinearModes, AMovedFromLayerKeepsNoModeAndStillRuns) {
  Linear<float> adapted(8, 4, {.seed = 1});
  adapted.attach_adapter({.rank = 2, .seed = 3});
  Linear<float> quantised(32, 4, {.seed = 2});
  quantised.quantize(WeightFormat::int8);
  const Linear<float> adapted_now(std::move(adapted));
  const Linear<float> quantised_now(std::move(quantised));
  EXPECT_TRUE(adapted_now.has_adapter());
  EXPECT_TRUE(quantised_now.quantized());
  for (Linear<float>* moved : {&adapted, &quantised}) {  // NOLINT(bugprone-use-after-move)
    EXPECT_FALSE(moved->has_adapter());
    EXPECT_FALSE(moved->quantized());
    EXPECT_EQ(moved->in_features(), 0);
    const Tensor<float, 2> x({3, 0});
    EXPECT_EQ(moved->forward(x).shape(), (Shape<2>{3, 0}));
    EXPECT_EQ(moved->weight_bytes(), 0);
    std::ostringstream printed;
    printed << *moved;
    EXPECT_EQ(printed.str().find("lora"), std::string::npos);
  }
}

}  // namespace test_lora
}  // namespace dissect
