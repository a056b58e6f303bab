// Tests for dissect/tensor/module.hpp and the views every module hands out: the Module concept and
// state_dict names, generic zero_grad/parameter_count, optimizers built from modules alone,
// reuse_buffer, and the hostile-caller rows 20–22 of docs/reliability.md. Sequential and Stack
// against hand compositions are test_sequential's.
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/sequential.hpp"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "dissect/blocks.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/training/loss.hpp"
#include "dissect/training/optim.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_module {

using testing::random_tensor;
using testing::snapshot;

static_assert(Module<Linear<float>>);
static_assert(Module<ReLU>);
static_assert(Module<QKVProjection<double>>);
static_assert(Module<AttentionOutput<float>>);
static_assert(Module<FeedForward<float>>);
static_assert(Module<GatedFeedForward<double>>);
static_assert(Module<Sequential<Linear<float>, ReLU, Linear<float>>>);
static_assert(!Module<Tensor<float, 2>>);

using Mlp = testing::SmallMlp;
using testing::small_mlp;

TEST(Module, NamesFollowPyTorchStateDict) {
  EXPECT_EQ(parameter_names(Linear<float>(3, 2)), (std::vector<std::string>{"weight", "bias"}));
  EXPECT_EQ(parameter_names(QKVProjection<float>(8, 2)),
            (std::vector<std::string>{"qkv.weight", "qkv.bias"}));
  EXPECT_EQ(parameter_names(GatedFeedForward<float>(8, 12)),
            (std::vector<std::string>{"gate.weight", "up.weight", "down.weight"}));
  // nn.Sequential(Linear, ReLU, Linear): the ReLU takes position 1 but has no parameters.
  EXPECT_EQ(parameter_names(small_mlp(1)),
            (std::vector<std::string>{"0.weight", "0.bias", "2.weight"}));
  using Nested = Sequential<FeedForward<float>, Sequential<Linear<float>, ReLU>>;
  Nested nested(FeedForward<float>(4, 8), Sequential<Linear<float>, ReLU>(Linear<float>(4, 4), {}));
  EXPECT_EQ(parameter_names(nested),
            (std::vector<std::string>{"0.up.weight", "0.up.bias", "0.down.weight", "0.down.bias",
                                      "1.0.weight", "1.0.bias"}));
}

TEST(Module, CountAndZeroGradComeFromTheProtocol) {
  auto mlp = small_mlp(2);
  EXPECT_EQ(mlp.parameter_count(), 5 * 7 + 7 + 7 * 3);
  EXPECT_EQ(parameter_count(mlp), mlp.parameter_count());
  GatedFeedForward<float> swiglu(8, 12);
  EXPECT_EQ(swiglu.parameter_count(), 3 * 8 * 12);
  std::mt19937_64 engine(3);
  const auto x = random_tensor<double, 2>({4, 5}, engine);
  Mlp::Cache<2> cache;
  const auto y = mlp.forward(x, cache);
  mlp.backward(x, cache, y);
  double total = 0;
  mlp.for_each_parameter([&](const ParameterName&, auto, auto grad) {
    for (double g : grad) total += std::abs(g);
  });
  EXPECT_GT(total, 0);
  mlp.zero_grad();
  mlp.for_each_parameter([](const ParameterName& name, auto, auto grad) {
    for (double g : grad) EXPECT_EQ(g, 0.0) << name;
  });
}

/// Trains `module` on a fixed regression target with Adam built from the module alone; the loss
/// must fall by half: every parameter was reached (a missed one leaves a floor).
template <class Module, class Step>
void expect_training_lowers_the_loss(Module& module, Step&& loss_and_backward) {
  Adam adam(module, {.lr = 1e-2});
  EXPECT_EQ(adam.parameter_count(), module.parameter_count());
  const double initial = loss_and_backward();
  double last = initial;
  for (int step = 0; step < 200; ++step) {
    adam.zero_grad();
    last = loss_and_backward();
    adam.step();
  }
  EXPECT_LT(last, 0.5 * initial) << "initial " << initial << ", final " << last;
}

/// ½‖y − target‖² and dy = y − target.
template <class Scalar, std::size_t Rank>
double squared_error(const Tensor<Scalar, Rank>& y, const Tensor<Scalar, Rank>& target,
                     Tensor<Scalar, Rank>& dy) {
  dy = Tensor<Scalar, Rank>(y.shape());
  double sum = 0;
  for (index_t i = 0; i < y.size(); ++i) {
    dy.data()[i] = y.data()[i] - target.data()[i];
    sum += 0.5 * double(dy.data()[i]) * double(dy.data()[i]);
  }
  return sum;
}

TEST(Training, AnOptimizerTrainsBlocksAndSequentialsWithoutAParameterList) {
  std::mt19937_64 engine(7);
  {
    QKVProjection<double> qkv(8, 2, {.n_kv_heads = 1, .seed = 1});
    const auto x = random_tensor<double, 3>({2, 4, 8}, engine);
    const auto tq = random_tensor<double, 4>({2, 2, 4, 4}, engine);
    const auto tk = random_tensor<double, 4>({2, 1, 4, 4}, engine);
    const auto tv = random_tensor<double, 4>({2, 1, 4, 4}, engine);
    expect_training_lowers_the_loss(qkv, [&] {
      auto out = qkv.forward(x);
      QKV<double> d;
      const double loss = squared_error(out.q, tq, d.q) + squared_error(out.k, tk, d.k) +
                          squared_error(out.v, tv, d.v);
      qkv.backward(x, d);
      return loss;
    });
  }
  {
    GatedFeedForward<double> swiglu(6, 10, {.seed = 2});
    const auto x = random_tensor<double, 3>({2, 5, 6}, engine);
    const auto target = random_tensor<double, 3>({2, 5, 6}, engine, -0.1, 0.1);
    GatedFeedForward<double>::Cache cache;
    expect_training_lowers_the_loss(swiglu, [&] {
      Tensor<double, 3> dy;
      const double loss = squared_error(swiglu.forward(x, cache), target, dy);
      swiglu.backward(x, cache, dy);
      return loss;
    });
  }
  {
    auto mlp = small_mlp(3);
    const auto x = random_tensor<double, 2>({16, 5}, engine);
    const auto target = random_tensor<double, 2>({16, 3}, engine);
    Mlp::Cache<2> cache;
    expect_training_lowers_the_loss(mlp, [&] {
      Tensor<double, 2> dy;
      const double loss = squared_error(mlp.forward(x, cache), target, dy);
      mlp.backward(x, cache, dy);
      return loss;
    });
  }
}

// ---- hostile callers: docs/reliability.md rows 20–22
// ----------------------------------------------

TEST(HostileCallers, ParametersAndGradientsCannotBeReshapedOrReplaced) {  // row 20
  Linear<float> layer(4, 3);
  static_assert(!std::is_assignable_v<decltype(layer.weight_grad()), Tensor<float, 2>>);
  static_assert(!std::is_assignable_v<decltype(layer.bias_grad()), Tensor<float, 1>>);
  static_assert(!std::is_assignable_v<Linear<float>&, Linear<float>&&>);
  const float* weight = layer.weight().data();
  const float* grad = layer.weight_grad().data();
  EXPECT_THROW_WITH(layer.weight_grad().copy_from(Tensor<float, 2>({4, 3})), ShapeError,
                    "source has shape [4, 3] but the view has shape [3, 4]");
  layer.set_weight(Tensor<float, 2>({3, 4}));
  EXPECT_EQ(layer.weight().data(), weight);  // set_weight keeps the buffer
  EXPECT_EQ(layer.weight_grad().data(), grad);
  // A moved-from layer is an empty 0 → 0 layer, never a dangling one.
  Linear<float> moved(std::move(layer));
  EXPECT_EQ(layer.in_features(), 0);
  EXPECT_EQ(layer.parameter_count(), 0);
  EXPECT_THROW_WITH(layer.forward(Tensor<float, 2>({2, 4})), ShapeError,
                    "input last dim 4 != in_features 0");
  EXPECT_EQ(moved.weight().data(), weight);
}

TEST(HostileCallers, BuffersThatAliasTheLayerAreRefusedByName) {  // row 21
  Linear<float> square(4, 4, {.seed = 1});
  Tensor<float, 2> x({4, 4}), dy({4, 4}), dx({4, 4});
  const auto before = snapshot(square.weight());
  EXPECT_THROW_WITH(square.forward_into(x, square.weight()), ShapeError,
                    "forward_into: output y [4, 4] aliases the layer's weight [4, 4]");
  EXPECT_THROW_WITH(
      square.forward_into(x.view().flatten().reshape(Shape<1>{-1}).reshape(Shape<2>{4, 4}),
                          square.weight_grad()),
      ShapeError, "aliases the layer's weight_grad");
  EXPECT_THROW_WITH(square.backward_into(x, dy, square.weight_grad()), ShapeError,
                    "dx [4, 4] aliases the layer's weight_grad [4, 4]");
  EXPECT_THROW_WITH(square.backward_into(x, dy, square.weight()), ShapeError,
                    "dx [4, 4] aliases the layer's weight [4, 4]");
  EXPECT_THROW_WITH(square.backward(square.weight_grad(), dy), ShapeError,
                    "backward: x [4, 4] aliases the layer's weight_grad");
  EXPECT_THROW_WITH(square.backward_parameters(x, square.weight_grad()), ShapeError,
                    "dy [4, 4] aliases the layer's weight_grad");
  Linear<float> wide(4, 16, {.seed = 2});
  EXPECT_THROW_WITH(wide.forward_into(Tensor<float, 1>({4}), wide.bias()), ShapeError,
                    "aliases the layer's bias [16]");
  EXPECT_TENSOR_EQ(square.weight(), before);
  for (float g : square.weight_grad()) EXPECT_EQ(g, 0.0f);
  // Reading the weight as an input is legitimate: y = W·Wᵀ.
  Tensor<float, 2> y({4, 4});
  EXPECT_NO_THROW(square.forward_into(square.weight(), y));
}

TEST(HostileCallers, OptimizersStayCorrectAfterSetWeight) {  // row 22
  Linear<double> layer(3, 2, {.seed = 4});
  Sgd sgd(layer, {.lr = 0.5});
  Tensor<double, 2> fresh({2, 3}, {1, 2, 3, 4, 5, 6});
  layer.set_weight(fresh);
  layer.weight_grad().fill(1.0);
  sgd.step();
  for (index_t i = 0; i < 6; ++i) EXPECT_EQ(layer.weight().data()[i], fresh.data()[i] - 0.5);
  sgd.zero_grad();
  for (double g : layer.weight_grad()) EXPECT_EQ(g, 0.0);
}

TEST(HostileCallers, EnumsFromOutsideTheirRangeAreConfigErrors) {  // row 23
  EXPECT_THROW_WITH(Linear<float>(2, 2, {.init = static_cast<InitScheme>(42)}), ConfigError,
                    "Linear: InitScheme(42) is out of range (known: pytorch_default,");
  EXPECT_THROW_WITH(FeedForward<float>(4, 8, static_cast<Activation>(7)), ConfigError,
                    "FeedForward: Activation(7) is out of range");
  Tensor<float, 2> w({2, 2});
  Generator generator(1);
  EXPECT_THROW_WITH(
      init_linear<float>(w.view(), std::nullopt, static_cast<InitScheme>(-1), generator),
      ConfigError, "init_linear: InitScheme(-1) is out of range");
}

TEST(HostileCallers, FusedQkvWidthThatOverflowsIsAnOverflowError) {  // row 16
  const index_t huge = index_t{1} << 62;                             // 3·2⁶² leaves int64
  EXPECT_THROW_WITH(QKVProjection<float>(huge, 1), OverflowError,
                    "QKVProjection: (H + 2·H_kv)·d_k: overflows int64");
}

TEST(ReuseBuffer, KeepsTheStorageOfAFittingBufferAndReshapesAnyOther) {
  Tensor<float, 2> buffer({3, 4});
  const float* storage = buffer.data();
  const TensorView<float, 2> same = reuse_buffer(buffer, Shape<2>{3, 4});
  EXPECT_EQ(same.data(), storage);
  EXPECT_EQ(same.shape(), (Shape<2>{3, 4}));
  const TensorView<float, 2> other = reuse_buffer(buffer, Shape<2>{5, 2});
  EXPECT_EQ(other.shape(), (Shape<2>{5, 2}));
  EXPECT_EQ(buffer.shape(), (Shape<2>{5, 2}));
  EXPECT_EQ(other.data(), buffer.data());
}

}  // namespace test_module
}  // namespace dissect
