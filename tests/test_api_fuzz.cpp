// Stateful fuzz of the public API (docs/reliability.md, "stateful API fuzz"): seeded random
// sequences of calls on a Linear, an optimizer over it and a FeedForward block — right and wrong
// shapes, fresh and aliased buffers, writes through views — checked after every call against a
// reference model kept here as plain vectors. Each call either throws the library's exception
// and changes nothing, or leaves exactly the state the reference computes.
//
// Values are small integers, so every product and sum (and SGD with lr = 1) is exact in double:
// the reference and the library must agree bit for bit, whatever order their reductions take.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <vector>

#include "dissect/activation.hpp"
#include "dissect/blocks.hpp"
#include "dissect/linear.hpp"
#include "dissect/norm.hpp"
#include "dissect/optim.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_api_fuzz {

/// What the test believes the layer holds.
struct Reference {
  index_t in = 0, out = 0;
  bool bias = false;
  std::vector<double> w, b, dw, db;  // row-major [out, in], [out]
};

class LinearFuzz {
 public:
  explicit LinearFuzz(std::uint64_t seed) : engine_(seed) { rebuild(); }

  /// One random call; false once a check has failed.
  bool step() {
    switch (pick(0, 9)) {
      case 0:
        if (pick(0, 20) == 0) rebuild();
        return check_state();
      case 1:
        return set_weight();
      case 2:
        return set_bias();
      case 3:
        return write_through_view();
      case 4:
        return forward();
      case 5:
        return forward_into();
      case 6:
        return backward();
      case 7:
        layer_->zero_grad();
        std::fill(ref_.dw.begin(), ref_.dw.end(), 0.0);
        std::fill(ref_.db.begin(), ref_.db.end(), 0.0);
        return check_state();
      case 8:
        return optimizer_step();
      default:
        return backward_into();
    }
  }

 private:
  index_t pick(index_t low, index_t high) {
    return std::uniform_int_distribution<index_t>(low, high)(engine_);
  }
  double value() { return static_cast<double>(pick(-3, 3)); }

  template <std::size_t Rank>
  Tensor<double, Rank> integers(const Shape<Rank>& shape) {
    Tensor<double, Rank> t(shape);
    for (double& v : t) v = value();
    return t;
  }

  /// A shape [..., last] with 1 to 3 axes folded into rows (rank fixed at 3 here).
  Shape<3> rows_with(index_t last) { return {pick(0, 2), pick(0, 3), last}; }
  /// Sometimes the right extent, sometimes a wrong one.
  index_t maybe_wrong(index_t right) { return pick(0, 5) == 0 ? right + pick(1, 2) : right; }

  void rebuild() {
    ref_.in = pick(0, 4);
    ref_.out = pick(0, 4);
    ref_.bias = pick(0, 1) == 1;
    layer_.emplace(ref_.in, ref_.out,
                   LinearOptions{.bias = ref_.bias, .seed = std::uint64_t(pick(0, 1000))});
    // Integer parameters, so that the reference stays exact.
    layer_->set_weight(integers(Shape<2>{ref_.out, ref_.in}));
    if (ref_.bias) layer_->set_bias(integers(Shape<1>{ref_.out}));
    ref_.w.assign(layer_->weight().begin(), layer_->weight().end());
    ref_.b = ref_.bias ? std::vector<double>(layer_->bias().begin(), layer_->bias().end())
                       : std::vector<double>{};
    ref_.dw.assign(ref_.w.size(), 0.0);
    ref_.db.assign(ref_.b.size(), 0.0);
    sgd_.emplace(*layer_, SgdOptions{.lr = 1.0});
  }

  bool check_state() {
    const auto equal = [](auto view, const std::vector<double>& expected) {
      return std::equal(view.begin(), view.end(), expected.begin(), expected.end());
    };
    EXPECT_EQ(layer_->weight().shape(), (Shape<2>{ref_.out, ref_.in}));
    EXPECT_TRUE(equal(layer_->weight(), ref_.w)) << "weight";
    EXPECT_TRUE(equal(layer_->weight_grad(), ref_.dw)) << "weight_grad";
    if (ref_.bias) {
      EXPECT_TRUE(equal(layer_->bias(), ref_.b)) << "bias";
      EXPECT_TRUE(equal(layer_->bias_grad(), ref_.db)) << "bias_grad";
    }
    return !::testing::Test::HasFailure();
  }

  /// Runs `call`, which must throw `Expected` when `must_throw`, and must not throw otherwise.
  template <class Expected, class Call>
  bool expect_outcome(bool must_throw, Call&& call) {
    bool threw = false;
    try {
      call();
    } catch (const Expected&) {
      threw = true;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected exception type: " << e.what();
    }
    EXPECT_EQ(threw, must_throw);
    return !::testing::Test::HasFailure();
  }

  bool set_weight() {
    const Shape<2> shape{maybe_wrong(ref_.out), ref_.in};
    const auto w = integers(shape);
    const bool wrong = shape[0] != ref_.out;
    if (!expect_outcome<ShapeError>(wrong, [&] { layer_->set_weight(w); })) return false;
    if (!wrong) ref_.w.assign(w.begin(), w.end());
    return check_state();
  }

  bool set_bias() {
    const Shape<1> shape{maybe_wrong(ref_.out)};
    const auto b = integers(shape);
    const bool fails = !ref_.bias || shape[0] != ref_.out;
    if (!expect_outcome<Error>(fails, [&] { layer_->set_bias(b); })) return false;
    if (!fails) ref_.b.assign(b.begin(), b.end());
    return check_state();
  }

  bool write_through_view() {
    if (ref_.w.empty()) return check_state();
    const auto i = pick(0, static_cast<index_t>(ref_.w.size()) - 1);
    const double v = value();
    layer_->weight().data()[i] = v;
    ref_.w[static_cast<std::size_t>(i)] = v;
    return check_state();
  }

  /// y = x·Wᵀ + b by the reference.
  std::vector<double> expected_forward(const Tensor<double, 3>& x) const {
    const index_t m_count = x.dim(0) * x.dim(1);
    std::vector<double> y(static_cast<std::size_t>(m_count * ref_.out));
    for (index_t m = 0; m < m_count; ++m) {
      for (index_t n = 0; n < ref_.out; ++n) {
        double sum = ref_.bias ? ref_.b[static_cast<std::size_t>(n)] : 0.0;
        for (index_t k = 0; k < ref_.in; ++k) {
          sum += x.data()[m * ref_.in + k] * ref_.w[static_cast<std::size_t>(n * ref_.in + k)];
        }
        y[static_cast<std::size_t>(m * ref_.out + n)] = sum;
      }
    }
    return y;
  }

  bool forward() {
    const auto x = integers(rows_with(maybe_wrong(ref_.in)));
    const bool wrong = x.dim(2) != ref_.in;
    Tensor<double, 3> y;
    if (!expect_outcome<ShapeError>(wrong, [&] { y = layer_->forward(x); })) return false;
    if (!wrong) {
      const auto expected = expected_forward(x);
      EXPECT_TRUE(std::equal(y.begin(), y.end(), expected.begin(), expected.end()));
    }
    return check_state();
  }

  bool forward_into() {
    const auto x = integers(rows_with(ref_.in));
    Tensor<double, 3> fresh(Shape<3>{x.dim(0), x.dim(1), maybe_wrong(ref_.out)});
    const bool fresh_ok = fresh.dim(2) == ref_.out;
    switch (pick(0, 3)) {
      case 0: {  // a fresh buffer, prefilled with NaN: must be overwritten
        fresh.fill(std::numeric_limits<double>::quiet_NaN());
        if (!expect_outcome<ShapeError>(!fresh_ok, [&] { layer_->forward_into(x, fresh); }))
          return false;
        if (fresh_ok) {
          const auto expected = expected_forward(x);
          EXPECT_TRUE(std::equal(fresh.begin(), fresh.end(), expected.begin(), expected.end()));
        }
        break;
      }
      case 1: {  // the layer's own weight or gradient as output, when the shapes would fit
        if (ref_.in == 0 || ref_.out == 0) break;
        const Tensor<double, 2> x2 = integers(Shape<2>{ref_.out, ref_.in});
        const bool grad = pick(0, 1) == 1;
        if (ref_.in != ref_.out) break;
        if (!expect_outcome<ShapeError>(true, [&] {
              if (grad) {
                layer_->forward_into(x2, layer_->weight_grad());
              } else {
                layer_->forward_into(x2, layer_->weight());
              }
            }))
          return false;
        break;
      }
      default: {  // the input itself as output
        if (ref_.in != ref_.out || x.empty()) break;
        auto inout = x;
        if (!expect_outcome<ShapeError>(true, [&] { layer_->forward_into(inout, inout); }))
          return false;
      }
    }
    return check_state();
  }

  void accumulate(const Tensor<double, 3>& x, const Tensor<double, 3>& dy) {
    const index_t rows = x.dim(0) * x.dim(1);
    for (index_t n = 0; n < ref_.out; ++n) {
      for (index_t m = 0; m < rows; ++m) {
        const double g = dy.data()[m * ref_.out + n];
        for (index_t k = 0; k < ref_.in; ++k) {
          ref_.dw[static_cast<std::size_t>(n * ref_.in + k)] += g * x.data()[m * ref_.in + k];
        }
        if (ref_.bias) ref_.db[static_cast<std::size_t>(n)] += g;
      }
    }
  }

  bool backward() {
    const auto shape = rows_with(ref_.in);
    const auto x = integers(shape);
    const auto dy = integers(Shape<3>{shape[0], shape[1], maybe_wrong(ref_.out)});
    const bool wrong = dy.dim(2) != ref_.out;
    Tensor<double, 3> dx;
    if (!expect_outcome<ShapeError>(wrong, [&] { dx = layer_->backward(x, dy); })) return false;
    if (!wrong) {
      accumulate(x, dy);
      const index_t rows = shape[0] * shape[1];
      for (index_t m = 0; m < rows; ++m) {
        for (index_t k = 0; k < ref_.in; ++k) {
          double sum = 0;
          for (index_t n = 0; n < ref_.out; ++n) {
            sum += dy.data()[m * ref_.out + n] * ref_.w[static_cast<std::size_t>(n * ref_.in + k)];
          }
          EXPECT_EQ(dx.data()[m * ref_.in + k], sum);
        }
      }
    }
    return check_state();
  }

  bool backward_into() {
    if (ref_.in != ref_.out || ref_.in == 0) return check_state();
    const auto x = integers(Shape<2>{ref_.out, ref_.in});
    const auto dy = integers(Shape<2>{ref_.out, ref_.out});
    // dx, x or dy aliasing the gradients: refused, gradients untouched.
    const int which = static_cast<int>(pick(0, 2));
    if (!expect_outcome<ShapeError>(true, [&] {
          if (which == 0) layer_->backward_into(x, dy, layer_->weight_grad());
          if (which == 1) layer_->backward(layer_->weight_grad(), dy);
          if (which == 2) layer_->backward_into(x, dy, layer_->weight());
        }))
      return false;
    return check_state();
  }

  bool optimizer_step() {
    // Keep integers small: a layer whose values grew is reset through set_weight, which keeps
    // the buffer the optimizer holds.
    for (double& w : ref_.w) {
      if (std::abs(w) > 1e6) w = 0;
    }
    layer_->set_weight(Tensor<double, 2>(Shape<2>{ref_.out, ref_.in}, ref_.w));
    sgd_->step();
    for (std::size_t i = 0; i < ref_.w.size(); ++i) ref_.w[i] -= ref_.dw[i];
    for (std::size_t i = 0; i < ref_.b.size(); ++i) ref_.b[i] -= ref_.db[i];
    return check_state();
  }

  std::mt19937_64 engine_;
  Reference ref_;
  std::optional<Linear<double>> layer_;
  std::optional<Sgd<double>> sgd_;
};

TEST(ApiFuzz, LinearAndOptimizerAgreeWithTheReferenceAfterEveryCall) {
  constexpr int steps = 100'000;
  LinearFuzz fuzz(20261130);
  for (int i = 0; i < steps; ++i) {
    ASSERT_TRUE(fuzz.step()) << "at step " << i;
  }
}

/// Blocks and norms: any call either succeeds or throws and leaves every parameter and gradient
/// alone.
TEST(ApiFuzz, BlocksThatThrowChangeNothing) {
  std::mt19937_64 engine(7);
  const auto pick = [&](index_t low, index_t high) {
    return std::uniform_int_distribution<index_t>(low, high)(engine);
  };
  FeedForward<double> ffn(4, 6, Activation::relu, {.seed = 1});
  QKVProjection<double> qkv(4, 2, {.n_kv_heads = 1, .seed = 2});
  FeedForward<double>::Cache cache;
  LayerNorm<double> norm(4);
  LayerNorm<double>::Cache norm_cache;
  const auto state = [](const auto& module) {
    std::vector<double> all;
    module.for_each_parameter([&](const ParameterName&, auto value, auto grad) {
      all.insert(all.end(), value.begin(), value.end());
      all.insert(all.end(), grad.begin(), grad.end());
    });
    return all;
  };
  std::mt19937_64 values(3);
  for (int step = 0; step < 20'000; ++step) {
    const Shape<3> shape{pick(0, 2), pick(0, 3), pick(3, 5)};
    const auto x = testing::random_tensor<double, 3>(shape, values);
    const auto before_ffn = state(ffn);
    const auto before_qkv = state(qkv);
    const auto before_norm = state(norm);
    bool threw = false;
    try {
      switch (pick(0, 5)) {
        case 4:
          norm.forward(x, norm_cache);
          break;
        case 5: {
          const Shape<3> dy_shape{shape[0], shape[1], pick(0, 1) ? shape[2] : 4};
          norm.backward(x, norm_cache, testing::random_tensor<double, 3>(dy_shape, values));
          break;
        }
        case 0:
          ffn.forward(x, cache);
          break;
        case 1: {
          const Shape<3> dy_shape{shape[0], pick(0, 1) ? shape[1] : shape[1] + 1, 4};
          ffn.backward(x, cache, testing::random_tensor<double, 3>(dy_shape, values));
          break;
        }
        case 2:
          qkv.forward(x);
          break;
        default: {
          const index_t t = pick(0, 1) ? shape[1] : shape[1] + 1;
          qkv.backward(x, testing::random_tensor<double, 4>({shape[0], 2, t, 2}, values),
                       testing::random_tensor<double, 4>({shape[0], 1, shape[1], 2}, values),
                       testing::random_tensor<double, 4>({shape[0], 1, shape[1], 2}, values));
        }
      }
    } catch (const ShapeError&) {
      threw = true;
    }
    if (threw) {
      ASSERT_EQ(state(ffn), before_ffn) << "at step " << step;
      ASSERT_EQ(state(qkv), before_qkv) << "at step " << step;
      ASSERT_EQ(state(norm), before_norm) << "at step " << step;
    }
    if (pick(0, 50) == 0) {
      ffn.zero_grad();
      qkv.zero_grad();
      norm.zero_grad();
    }
  }
}

}  // namespace test_api_fuzz
}  // namespace dissect
