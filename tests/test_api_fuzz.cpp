// Stateful fuzz of the public API (docs/reliability.md, "stateful API fuzz"): seeded random
// sequences of calls on a Linear, an optimizer over it and a FeedForward block — right and wrong
// shapes, fresh and aliased buffers, writes through views — checked after every call against a
// reference model kept here as plain vectors. Each call either throws the library's exception
// and changes nothing, or leaves exactly the state the reference computes.
//
// Values are small integers, so every product and sum (and SGD with lr = 1) is exact in double:
// the reference and the library must agree bit for bit, whatever order their reductions take.
//
// The same holds for the modes that keep state derived from W (rows 57–61): a LoRA adapter
// attached, merged, unmerged, detached and trained in any order, with the layer frozen and
// unfrozen; packing, quantising (bf16, exact on small integers) and writes through the views; and
// a whole small model through apply_lora, merging, packing, load_adapters, load_state_dict,
// save_model / load_model round trips through a temporary file and generation, against a plain
// twin that is never merged or packed. A mixture of experts of random (D, E, k) and routing
// options is checked against the naive per-token loop written here, and its bad calls (shapes,
// routings, NaN and Inf) against a snapshot of its state. Dropout is driven through train/eval
// switches, seeds, masked and drawn forwards and backwards, against the masks it must replay.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/attention/cross_attention.hpp"
#include "dissect/attention/flash_attention.hpp"
#include "dissect/attention/linear_attention.hpp"
#include "dissect/blocks.hpp"
#include "dissect/blocks/cross_attention.hpp"
#include "dissect/blocks/mixture_of_experts.hpp"
#include "dissect/io/lora_file.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/io/state_dict.hpp"
#include "dissect/layers/dropout.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/layers/norm.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/training/optim.hpp"
#include "dissect/transforms/lora.hpp"
#include "support/io_testing.hpp"
#include "support/small_models.hpp"
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

// ---- modes that keep state derived from W (rows 57–61) ----------------------------------------

/// A row-major matrix of exact small integers, the reference's arithmetic.
struct Dense {
  index_t rows = 0, cols = 0;
  std::vector<double> v;

  Dense() = default;
  Dense(index_t r, index_t c) : rows(r), cols(c), v(static_cast<std::size_t>(r * c), 0.0) {}
  double& at(index_t i, index_t j) { return v[static_cast<std::size_t>(i * cols + j)]; }
  double at(index_t i, index_t j) const { return v[static_cast<std::size_t>(i * cols + j)]; }
  template <TensorLike T>
  static Dense of(const T& t) {
    const auto view = const_view(t);
    Dense d(view.dim(0), view.dim(1));
    std::copy(view.begin(), view.end(), d.v.begin());
    return d;
  }
  template <class Scalar>
  Tensor<Scalar, 2> tensor() const {
    Tensor<Scalar, 2> t(Shape<2>{rows, cols});
    std::transform(v.begin(), v.end(), t.begin(), [](double x) { return static_cast<Scalar>(x); });
    return t;
  }
  Dense& operator+=(const Dense& o) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] += o.v[i];
    return *this;
  }
  Dense& operator-=(const Dense& o) {
    for (std::size_t i = 0; i < v.size(); ++i) v[i] -= o.v[i];
    return *this;
  }
  double max_abs() const {
    double m = 0;
    for (double x : v) m = std::max(m, std::abs(x));
    return m;
  }
};

/// a·b [n, m] for a [n, k], b [k, m]; transposes by flag.
Dense product(const Dense& a, bool ta, const Dense& b, bool tb) {
  const index_t n = ta ? a.cols : a.rows, k = ta ? a.rows : a.cols, m = tb ? b.rows : b.cols;
  Dense c(n, m);
  for (index_t i = 0; i < n; ++i) {
    for (index_t j = 0; j < m; ++j) {
      double sum = 0;
      for (index_t l = 0; l < k; ++l)
        sum += (ta ? a.at(l, i) : a.at(i, l)) * (tb ? b.at(j, l) : b.at(l, j));
      c.at(i, j) = sum;
    }
  }
  return c;
}

template <TensorLike T>
bool equals(const T& t, const Dense& d) {
  const auto view = const_view(t);
  return std::equal(view.begin(), view.end(), d.v.begin(), d.v.end());
}

/// What the test believes a layer in one of its modes holds. α = r keeps the adapter's scale 1.
struct ModeReference {
  index_t in = 0, out = 0, rank = 0;
  bool bias = false, adapter = false, merged = false, frozen = false;
  bool packed = false, quantized = false;
  Dense w, b, dw, db;  // w: the buffer, which holds the base + ΔW0 while merged
  Dense a, bm, da, dbm;
  Dense a0, b0;  // A and B as merged
  Dense copy;    // what a packed or quantised forward reads for W

  Dense delta() const { return product(bm, false, a, false); }
  Dense merged_delta() const { return product(b0, false, a0, false); }
  /// The W forward effectively applies, adapter included.
  Dense effective() const {
    Dense e = packed || quantized ? copy : w;
    if (adapter) e += delta();
    if (merged) e -= merged_delta();
    return e;
  }
  Dense forward(const Dense& x) const {
    Dense y = product(x, false, effective(), true);
    if (bias) {
      for (index_t i = 0; i < y.rows; ++i) {
        for (index_t j = 0; j < y.cols; ++j) y.at(i, j) += b.at(0, j);
      }
    }
    return y;
  }
  double largest() const {
    return std::max({w.max_abs(), a.max_abs(), bm.max_abs(), da.max_abs(), dbm.max_abs(),
                     dw.max_abs(), db.max_abs()});
  }
};

/// Random sequences of the calls that switch a Linear's modes, against ModeReference. Scalar
/// double: LoRA with backward and an optimizer; float: packing and quantising too.
template <class Scalar>
class ModeFuzz {
 public:
  explicit ModeFuzz(std::uint64_t seed) : engine_(seed) { rebuild(); }

  bool step() {
    constexpr bool is_float = std::is_same_v<Scalar, float>;
    if (ref_.largest() > (is_float ? 50 : 500)) rebuild();  // keeps every product exact
    switch (pick(0, is_float ? 17 : 13)) {
      case 0:
        return attach();
      case 1:
        return detach();
      case 2:
        return merge();
      case 3:
        return unmerge();
      case 4:
        return set_frozen(pick(0, 1) == 1);
      case 5:
        return set_weight();
      case 6:
        return write_adapter();
      case 7:
        return backward();
      case 8:
        return optimizer_step();
      case 9:
        layer_->zero_grad();
        for (Dense* g : {&ref_.dw, &ref_.db, &ref_.da, &ref_.dbm})
          std::fill(g->v.begin(), g->v.end(), 0.0);
        return check();
      case 10:
        return write_weight_view();
      case 11:
        if (pick(0, 30) == 0) rebuild();
        return check();
      case 12:
        return forward_rows();
      case 13:
        return set_frozen(true);
      default:
        if constexpr (is_float) return float_only();
        return check();
    }
  }

 private:
  index_t pick(index_t low, index_t high) {
    return std::uniform_int_distribution<index_t>(low, high)(engine_);
  }
  Dense integers(index_t rows, index_t cols, index_t bound = 2) {
    Dense d(rows, cols);
    for (double& x : d.v) x = static_cast<double>(pick(-bound, bound));
    return d;
  }

  void rebuild() {
    ref_ = ModeReference{};
    ref_.in = pick(1, 4);
    ref_.out = pick(1, 4);
    ref_.bias = pick(0, 1) == 1;
    ref_.w = integers(ref_.out, ref_.in);
    ref_.b = ref_.bias ? integers(1, ref_.out) : Dense(1, 0);
    ref_.dw = Dense(ref_.out, ref_.in);
    ref_.db = Dense(1, ref_.bias ? ref_.out : 0);
    sgd_.reset();
    layer_.emplace(
        ref_.w.template tensor<Scalar>(),
        ref_.bias ? std::optional<Tensor<Scalar, 1>>(Tensor<Scalar, 1>(
                        Shape<1>{ref_.out}, std::vector<Scalar>(ref_.b.v.begin(), ref_.b.v.end())))
                  : std::nullopt);
    sgd_.emplace(*layer_, SgdOptions{.lr = 1.0});
  }
  /// After a change of what is trainable: an optimizer holds views of the buffers it was built
  /// over, so one is built again (as a user must, row 22).
  void rebuild_optimizer() {
    sgd_.reset();
    sgd_.emplace(*layer_, SgdOptions{.lr = 1.0});
  }

  template <class Expected = Error, class Call>
  bool outcome(bool must_throw, Call&& call) {
    bool threw = false;
    try {
      call();
    } catch (const Expected&) {
      threw = true;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "unexpected exception type: " << e.what();
    }
    EXPECT_EQ(threw, must_throw);
    return !::testing::Test::HasFailure() && !threw;
  }

  bool check() {
    const Linear<Scalar>& l = *layer_;
    EXPECT_TRUE(equals(l.weight(), ref_.w)) << "weight";
    if (ref_.bias) {
      EXPECT_TRUE(std::equal(l.bias().begin(), l.bias().end(), ref_.b.v.begin())) << "bias";
    }
    EXPECT_EQ(l.frozen(), ref_.frozen);
    EXPECT_EQ(l.has_adapter(), ref_.adapter);
    EXPECT_EQ(l.adapter_merged(), ref_.merged);
    EXPECT_EQ(l.packed(), ref_.packed);
    EXPECT_EQ(l.quantized(), ref_.quantized);
    if (!ref_.frozen) {
      EXPECT_TRUE(equals(l.weight_grad(), ref_.dw)) << "weight_grad";
      if (ref_.bias) {
        EXPECT_TRUE(std::equal(l.bias_grad().begin(), l.bias_grad().end(), ref_.db.v.begin()));
      }
    }
    if (ref_.adapter) {
      EXPECT_TRUE(equals(l.adapter().A(), ref_.a)) << "A";
      EXPECT_TRUE(equals(l.adapter().B(), ref_.bm)) << "B";
      EXPECT_TRUE(equals(l.adapter().A_grad(), ref_.da)) << "A_grad";
      EXPECT_TRUE(equals(l.adapter().B_grad(), ref_.dbm)) << "B_grad";
    }
    // Forward on a probe: what every mode must get right.
    const Dense x = integers(3, ref_.in);
    EXPECT_TRUE(equals(l.forward(x.template tensor<Scalar>()), ref_.forward(x))) << "forward";
    return !::testing::Test::HasFailure();
  }

  bool attach() {
    const index_t rank = pick(1, 2);
    if (!outcome(ref_.adapter, [&] {
          layer_->attach_adapter({.rank = rank,
                                  .alpha = static_cast<double>(rank),
                                  .seed = std::uint64_t(pick(0, 99))});
        })) {
      return check();
    }
    ref_.rank = rank;
    EXPECT_TRUE(std::all_of(layer_->adapter().B().begin(), layer_->adapter().B().end(),
                            [](Scalar v) { return v == 0; }))
        << "B starts at zero";
    ref_.adapter = true;
    ref_.merged = false;
    ref_.frozen = true;
    ref_.a = integers(ref_.rank, ref_.in);
    ref_.bm = integers(ref_.out, ref_.rank);
    ref_.da = Dense(ref_.rank, ref_.in);
    ref_.dbm = Dense(ref_.out, ref_.rank);
    layer_->adapter().set_A(ref_.a.template tensor<Scalar>());
    layer_->adapter().set_B(ref_.bm.template tensor<Scalar>());
    rebuild_optimizer();
    return check();
  }

  void synced() {
    if (ref_.packed) ref_.copy = ref_.w;
  }

  bool detach() {
    if (!outcome(!ref_.adapter, [&] { layer_->detach_adapter(); })) return check();
    if (ref_.merged && (ref_.a.v != ref_.a0.v || ref_.bm.v != ref_.b0.v)) {
      ref_.w += ref_.delta();
      ref_.w -= ref_.merged_delta();
      synced();
    }
    ref_.adapter = ref_.merged = false;
    rebuild_optimizer();
    return check();
  }

  bool merge() {
    const bool refused = !ref_.adapter || ref_.merged || ref_.quantized || !ref_.frozen;
    if (!outcome(refused, [&] { layer_->merge_adapter(); })) return check();
    ref_.w += ref_.delta();
    ref_.a0 = ref_.a;
    ref_.b0 = ref_.bm;
    ref_.merged = true;
    synced();
    return check();
  }

  bool unmerge() {
    if (!outcome(!ref_.adapter || !ref_.merged, [&] { layer_->unmerge_adapter(); })) return check();
    ref_.w -= ref_.merged_delta();
    ref_.merged = false;
    synced();
    return check();
  }

  bool set_frozen(bool frozen) {
    const bool refused = !frozen && (ref_.quantized || ref_.merged);
    if (!outcome(refused, [&] { layer_->set_frozen(frozen); })) return check();
    if (!frozen) ref_.packed = false;
    if (!frozen && ref_.frozen) {
      std::fill(ref_.dw.v.begin(), ref_.dw.v.end(), 0.0);
      std::fill(ref_.db.v.begin(), ref_.db.v.end(), 0.0);
    }
    if (frozen != ref_.frozen) rebuild_optimizer();
    ref_.frozen = frozen;
    return check();
  }

  bool set_weight() {
    const Dense w = integers(ref_.out, ref_.in);
    if (!outcome(ref_.merged || ref_.quantized,
                 [&] { layer_->set_weight(w.template tensor<Scalar>()); })) {
      return check();
    }
    ref_.w = w;
    synced();
    return check();
  }

  /// A and B written behind the layer's back, merged or not: the layer must stay right.
  bool write_adapter() {
    if (!ref_.adapter) return check();
    if (pick(0, 1) == 0) {
      ref_.a = integers(ref_.rank, ref_.in);
      layer_->adapter().set_A(ref_.a.template tensor<Scalar>());
    } else {
      const auto i = pick(0, static_cast<index_t>(ref_.bm.v.size()) - 1);
      ref_.bm.v[static_cast<std::size_t>(i)] = static_cast<double>(pick(-2, 2));
      layer_->adapter().B().data()[i] = static_cast<Scalar>(ref_.bm.v[static_cast<std::size_t>(i)]);
    }
    return check();
  }

  /// A write through the weight() view: seen at once by a dense forward, by a packed or
  /// quantised one only after weight_written() (packed) or never (quantised: its own copy).
  bool write_weight_view() {
    const auto i = pick(0, static_cast<index_t>(ref_.w.v.size()) - 1);
    const double value = static_cast<double>(pick(-2, 2));
    layer_->weight().data()[i] = static_cast<Scalar>(value);
    ref_.w.v[static_cast<std::size_t>(i)] = value;
    if (pick(0, 1) == 0) {
      layer_->weight_written();
      synced();
    }
    return check();
  }

  bool backward() {
    const index_t rows = pick(0, 3);
    const Dense x = integers(rows, ref_.in, 1), dy = integers(rows, ref_.out, 1);
    Tensor<Scalar, 2> dx;
    if (!outcome(ref_.merged, [&] {
          dx = layer_->backward(x.template tensor<Scalar>(), dy.template tensor<Scalar>());
        })) {
      return check();
    }
    Dense through = ref_.w;  // backward reads W itself (not a packed copy) and A and B
    if (ref_.adapter) through += ref_.delta();
    EXPECT_TRUE(equals(dx, product(dy, false, through, false))) << "dx";
    if (!ref_.frozen) {
      ref_.dw += product(dy, true, x, false);
      for (index_t i = 0; i < rows; ++i) {
        for (index_t j = 0; j < ref_.db.cols; ++j) ref_.db.at(0, j) += dy.at(i, j);
      }
    }
    if (ref_.adapter) {
      const Dense h = product(x, false, ref_.a, true);      // [M, r]
      ref_.dbm += product(dy, true, h, false);              // [out, r]
      const Dense dh = product(dy, false, ref_.bm, false);  // [M, r]
      ref_.da += product(dh, true, x, false);               // [r, in]
    }
    return check();
  }

  /// SGD with lr = 1 over what is trainable: W and b unless frozen, A and B always (merged or
  /// not: a step on a merged adapter is seen by forward and taken back exactly by unmerge).
  bool optimizer_step() {
    sgd_->step();
    if (!ref_.frozen) {
      ref_.w -= ref_.dw;
      ref_.b -= ref_.db;
    }
    if (ref_.adapter) {
      ref_.a -= ref_.da;
      ref_.bm -= ref_.dbm;
    }
    return check();
  }

  bool forward_rows() {
    const Dense x = integers(pick(0, 4), ref_.in);
    EXPECT_TRUE(equals(layer_->forward(x.template tensor<Scalar>()), ref_.forward(x)));
    return check();
  }

  /// Packing and quantising (float layers only).
  bool float_only() {
    switch (pick(0, 3)) {
      case 0:
        if (!outcome(ref_.quantized, [&] { layer_->pack(); })) return check();
        if (!ref_.frozen) rebuild_optimizer();
        ref_.frozen = ref_.packed = true;
        ref_.copy = ref_.w;
        return check();
      case 1:
        layer_->unpack();
        ref_.packed = false;
        return check();
      case 2:
        if (ref_.w.max_abs() > 256) return check();  // beyond bf16's exact integers
        if (!outcome(ref_.quantized || ref_.merged,
                     [&] { layer_->quantize(WeightFormat::bf16); })) {
          return check();
        }
        if (!ref_.frozen) rebuild_optimizer();
        ref_.frozen = ref_.quantized = true;
        ref_.packed = false;
        ref_.copy = ref_.w;  // small integers are exact in bf16
        return check();
      default:
        if (!outcome(!ref_.quantized, [&] { layer_->dequantize(); })) return check();
        ref_.quantized = false;
        return check();
    }
  }

  std::mt19937_64 engine_;
  ModeReference ref_;
  std::optional<Linear<Scalar>> layer_;
  std::optional<Sgd<Scalar>> sgd_;
};

TEST(ApiFuzz, LoRAMergingFreezingAndTrainingInAnyOrderAgreeWithTheReference) {
  ModeFuzz<double> fuzz(20260601);
  for (int i = 0; i < testing::sweep_trials(30'000); ++i) {
    ASSERT_TRUE(fuzz.step()) << "at step " << i;
  }
}

TEST(ApiFuzz, PackedAndQuantisedLayersWithAdaptersAgreeWithTheReference) {
  ModeFuzz<float> fuzz(20260602);
  for (int i = 0; i < testing::sweep_trials(30'000); ++i) {
    ASSERT_TRUE(fuzz.step()) << "at step " << i;
  }
}

// ---- a mixture of experts (row 84) ------------------------------------------------------------

/// Random sequences of calls on a MixtureOfExperts<double> of random (D, F, E, k): forward with and
/// without a cache, backward, zero_grad, set_routing (top-k, gating, renormalisation, the
/// auxiliary losses, the capacity), a change to one expert's weights, a rebuild; and bad calls
/// (x or dy of the wrong shape, a cache of another input, a routing that cannot be, NaN or Inf in
/// x). After every call the block agrees with what this class computes on its own, or the call
/// threw the library's exception and changed nothing.
///
/// The independent computation is the naive per-token loop: the logits as plain dot products,
/// softmax, top-k (ties to the lowest index), the gates and the capacity written out here, and
/// each token's experts run on that token alone. It agrees with the block's grouped dispatch to
/// rounding (the expert's Linear sums in another order for one row than for a group), unless two
/// scores are within 1e-9 of each other at the top-k's cut, where the two may choose differently:
/// such steps are skipped and counted (random scores almost never do it).
class MoeFuzz {
 public:
  explicit MoeFuzz(std::uint64_t seed) : engine_(seed), values_(seed + 1) { rebuild(); }

  /// One random call; false once a check has failed.
  bool step() {
    switch (pick(0, 11)) {
      case 0:
        if (pick(0, 10) == 0) rebuild();
        return true;
      case 1:
      case 2:
        return forward(true);
      case 3:
        return forward(false);
      case 4:
      case 5:
        return backward();
      case 6:
        block_->zero_grad();
        return expect(all_zero(gradients()), "zero_grad left a gradient");
      case 7:
        return set_routing();
      case 8:
        return change_one_expert();
      case 9:
        return bad_input();
      case 10:
        return bad_routing();
      default:
        return non_finite_input();
    }
  }

  int compared() const { return compared_; }
  int skipped() const { return skipped_; }

 private:
  using Block = MixtureOfExperts<double>;

  index_t pick(index_t low, index_t high) {
    return std::uniform_int_distribution<index_t>(low, high)(engine_);
  }
  bool expect(bool ok, const std::string& what) {
    if (!ok)
      ADD_FAILURE() << what << " (E = " << e_ << ", k = " << block_->top_k() << ", D = " << d_
                    << ")";
    return ok;
  }
  static bool all_zero(const std::vector<double>& values) {
    return std::all_of(values.begin(), values.end(), [](double v) { return v == 0; });
  }

  MoeRouting random_routing() {
    MoeRouting r;
    r.top_k = pick(1, e_);
    r.gating = pick(0, 1) ? MoeGating::softmax_of_top_k : MoeGating::top_k_of_softmax;
    r.renormalize = pick(0, 1) == 1;
    r.load_balancing_coef = pick(0, 1) ? 0.0 : 0.01 * static_cast<double>(pick(1, 3));
    r.z_loss_coef = pick(0, 1) ? 0.0 : 0.001 * static_cast<double>(pick(1, 3));
    const double factors[] = {0.25, 0.5, 1.0, 1.25, 2.0};
    if (pick(0, 2) == 0) r.capacity_factor = factors[pick(0, 4)];
    return r;
  }

  void rebuild() {
    d_ = pick(1, 6);
    e_ = pick(1, 6);
    MixtureOfExpertsOptions options;
    options.n_experts = e_;
    options.routing = random_routing();
    options.seed = static_cast<std::uint64_t>(pick(0, 1'000'000));
    block_.emplace(d_, pick(1, 6), options);
    cache_ = Block::Cache{};
    cached_x_.reset();
  }

  Tensor<double, 3> random_x() {
    return testing::random_tensor<double, 3>({pick(0, 2), pick(0, 4), d_}, values_);
  }

  /// Every parameter and gradient, in order, and the routing's fields.
  std::vector<double> state() const {
    std::vector<double> all;
    block_->for_each_parameter([&](const ParameterName&, auto value, auto grad) {
      all.insert(all.end(), value.begin(), value.end());
      all.insert(all.end(), grad.begin(), grad.end());
    });
    const MoeRouting& r = block_->routing();
    all.insert(all.end(), {static_cast<double>(r.top_k), static_cast<double>(r.gating),
                           static_cast<double>(r.renormalize), r.load_balancing_coef, r.z_loss_coef,
                           r.capacity_factor.value_or(-1)});
    return all;
  }
  std::vector<double> gradients() const {
    std::vector<double> all;
    block_->for_each_parameter([&](const ParameterName&, auto, auto grad) {
      all.insert(all.end(), grad.begin(), grad.end());
    });
    return all;
  }
  std::vector<double> expert_gradients(index_t e) const {
    std::vector<double> all;
    block_->expert(e).for_each_parameter([&](const ParameterName&, auto, auto grad) {
      all.insert(all.end(), grad.begin(), grad.end());
    });
    return all;
  }

  /// The naive per-token routing and output of x. False in `ok` for a near-tie at the cut.
  struct Naive {
    bool ok = true;
    std::vector<index_t> experts;  // [N·k]
    std::vector<bool> kept;        // [N·k]
    std::vector<double> gates;     // [N·k]
    index_t dropped = 0;
    double aux_loss = 0;
    Tensor<double, 3> y;
  };
  Naive naive(const Tensor<double, 3>& x) const {
    const MoeRouting& routing = block_->routing();
    const index_t n = x.dim(0) * x.dim(1), e_count = e_, k = routing.top_k;
    const auto w = block_->router().weight();
    Naive out;
    out.y = Tensor<double, 3>(x.shape());
    std::vector<double> z(static_cast<std::size_t>(e_count)), p(z.size());
    std::vector<std::vector<double>> probs;
    std::vector<double> lse;
    std::vector<index_t> fill(static_cast<std::size_t>(e_count), 0);
    std::vector<index_t> assigned(static_cast<std::size_t>(e_count), 0);
    const double assignments = static_cast<double>(n * k);
    index_t capacity = n;
    if (routing.capacity_factor) {
      capacity = std::min<index_t>(
          n, static_cast<index_t>(
                 std::ceil(*routing.capacity_factor * assignments / static_cast<double>(e_count))));
    }
    for (index_t t = 0; t < n; ++t) {
      const double* x_t = x.data() + t * d_;
      for (index_t e = 0; e < e_count; ++e) {
        double s = 0;
        for (index_t c = 0; c < d_; ++c) s += w(e, c) * x_t[c];
        z[static_cast<std::size_t>(e)] = s;
      }
      const double max = *std::max_element(z.begin(), z.end());
      double sum = 0;
      for (std::size_t e = 0; e < z.size(); ++e) sum += (p[e] = std::exp(z[e] - max));
      for (double& v : p) v /= sum;
      probs.push_back(p);
      lse.push_back(max + std::log(sum));
      const bool mixtral = routing.gating == MoeGating::softmax_of_top_k;
      const std::vector<double>& score = mixtral ? z : p;
      std::vector<index_t> order(static_cast<std::size_t>(e_count));
      std::iota(order.begin(), order.end(), index_t{0});
      std::stable_sort(order.begin(), order.end(), [&](index_t a, index_t b) {
        return score[static_cast<std::size_t>(a)] > score[static_cast<std::size_t>(b)];
      });
      for (index_t j = 0; j + 1 < e_count && j < k; ++j) {  // a near-tie at or above the cut
        if (score[static_cast<std::size_t>(order[static_cast<std::size_t>(j)])] -
                score[static_cast<std::size_t>(order[static_cast<std::size_t>(j + 1)])] <
            1e-9) {
          out.ok = false;
        }
      }
      std::vector<double> g(static_cast<std::size_t>(k));
      double gsum = 0;
      for (index_t j = 0; j < k; ++j) {
        const auto e = static_cast<std::size_t>(order[static_cast<std::size_t>(j)]);
        g[static_cast<std::size_t>(j)] = mixtral ? std::exp(z[e] - max) : p[e];
        gsum += g[static_cast<std::size_t>(j)];
      }
      for (index_t j = 0; j < k; ++j) {
        if (mixtral || routing.renormalize) g[static_cast<std::size_t>(j)] /= gsum;
        const index_t e = order[static_cast<std::size_t>(j)];
        ++assigned[static_cast<std::size_t>(e)];
        const bool keep = fill[static_cast<std::size_t>(e)] < capacity;
        fill[static_cast<std::size_t>(e)] += keep ? 1 : 0;
        out.dropped += keep ? 0 : 1;
        out.experts.push_back(e);
        out.kept.push_back(keep);
        out.gates.push_back(g[static_cast<std::size_t>(j)]);
        if (!keep) continue;
        Tensor<double, 3> row({1, 1, d_});
        std::copy_n(x_t, d_, row.data());
        const auto o = block_->expert(e).forward(row.cview());
        for (index_t c = 0; c < d_; ++c) {
          out.y.data()[t * d_ + c] += g[static_cast<std::size_t>(j)] * o.data()[c];
        }
      }
    }
    if (n > 0) {
      double balance = 0, z_loss = 0;
      for (index_t e = 0; e < e_count; ++e) {
        double mean_p = 0;
        for (const auto& row : probs) mean_p += row[static_cast<std::size_t>(e)];
        balance += static_cast<double>(assigned[static_cast<std::size_t>(e)]) /
                   static_cast<double>(n) * mean_p / static_cast<double>(n);
      }
      for (const double l : lse) z_loss += l * l;
      out.aux_loss = routing.load_balancing_coef * balance * static_cast<double>(e_count) +
                     routing.z_loss_coef * z_loss / static_cast<double>(n);
    }
    return out;
  }

  static bool same_values(const Tensor<double, 3>& a, const Tensor<double, 3>& b) {
    return a.shape() == b.shape() && std::equal(a.begin(), a.end(), b.begin());
  }
  static bool near(double a, double b) { return std::abs(a - b) <= 1e-10 * (1 + std::abs(b)); }

  /// y and the route against the naive loop; the gates' sums.
  bool check_against_naive(const Tensor<double, 3>& x, const Tensor<double, 3>& y,
                           const MoeRoute<double>& route) {
    const Naive ref = naive(x);
    if (!ref.ok) {
      ++skipped_;
      return true;
    }
    ++compared_;
    const index_t n = x.dim(0) * x.dim(1), k = block_->top_k();
    if (!expect(y.shape() == x.shape(), "forward's shape")) return false;
    for (index_t i = 0; i < y.size(); ++i) {
      if (!expect(near(y.data()[i], ref.y.data()[i]),
                  concat("y[", i, "] = ", y.data()[i], ", the per-token loop ", ref.y.data()[i]))) {
        return false;
      }
    }
    if (!expect(route.experts == ref.experts, "the chosen experts")) return false;
    if (!expect(route.dropped == ref.dropped,
                concat("dropped ", route.dropped, " != ", ref.dropped)))
      return false;
    if (!expect(near(route.aux_loss, ref.aux_loss),
                concat("aux_loss ", route.aux_loss, " != ", ref.aux_loss)))
      return false;
    const MoeRouting& r = block_->routing();
    for (index_t t = 0; t < n; ++t) {
      double sum = 0;
      for (index_t j = 0; j < k; ++j) {
        const auto a = static_cast<std::size_t>(t * k + j);
        sum += route.gates.data()[a];
        if (!expect(near(route.gates.data()[a], ref.gates[a]), "a gate") ||
            !expect((route.rows[a] >= 0) == ref.kept[a], "a kept assignment")) {
          return false;
        }
      }
      const bool normalised = r.gating == MoeGating::softmax_of_top_k || r.renormalize;
      if (!expect(normalised ? near(sum, 1) : sum <= 1 + 1e-12, concat("gates sum to ", sum)))
        return false;
    }
    return true;
  }

  bool forward(bool with_cache) {
    const auto x = random_x();
    if (!with_cache) {
      const auto y = block_->forward(x);
      return check_against_naive(x, y, block_->route(x));
    }
    const auto y = block_->forward(x, cache_);
    cached_x_ = x;
    return check_against_naive(x, y, cache_.route) &&
           expect(same_values(block_->forward(x), y), "forward with and without a cache differ");
  }

  bool backward() {
    if (!cached_x_) return forward(true);
    const Tensor<double, 3>& x = *cached_x_;
    const auto dy = testing::random_tensor<double, 3>(x.shape(), values_);
    block_->zero_grad();
    const auto dx = block_->backward(x, cache_, dy);
    const auto once = gradients();
    // Gradients add: a second backward doubles them exactly (g + g = 2g in IEEE arithmetic).
    block_->backward(x, cache_, dy);
    const auto twice = gradients();
    for (std::size_t i = 0; i < once.size(); ++i) {
      if (!expect(twice[i] == 2 * once[i], "a second backward does not add the same gradient"))
        return false;
    }
    // An expert no kept assignment reached runs not and receives nothing.
    for (index_t e = 0; e < e_; ++e) {
      if (cache_.route.kept(e) == 0 &&
          !expect(all_zero(expert_gradients(e)), concat("expert ", e, " got a gradient")))
        return false;
    }
    return expect(dx.shape() == x.shape(), "dx's shape");
  }

  bool set_routing() {
    const MoeRouting r = random_routing();
    block_->set_routing(r);
    cached_x_.reset();  // its cache was made under the old routing
    return expect(block_->top_k() == r.top_k && block_->routing().gating == r.gating,
                  "set_routing");
  }

  /// Expert e's weights change: the outputs of tokens routed to e (and kept) change, every other
  /// token's stay bit for bit as they were (the other experts run on the same rows).
  bool change_one_expert() {
    const auto x = random_x();
    Block::Cache cache;
    const auto before = block_->forward(x, cache);
    const index_t e = pick(0, e_ - 1);
    block_->expert(e).for_each_parameter([&](const ParameterName&, auto value, auto) {
      for (auto& v : value) v += 0.25;
    });
    cached_x_.reset();
    const auto after = block_->forward(x);
    const index_t n = x.dim(0) * x.dim(1), k = block_->top_k();
    for (index_t t = 0; t < n; ++t) {
      bool routed = false;
      for (index_t j = 0; j < k; ++j) {
        const auto a = static_cast<std::size_t>(t * k + j);
        routed = routed || (cache.route.experts[a] == e && cache.route.rows[a] >= 0);
      }
      bool same = true;
      for (index_t c = 0; c < d_; ++c)
        same =
            same && after(t / x.dim(1), t % x.dim(1), c) == before(t / x.dim(1), t % x.dim(1), c);
      if (!routed && !expect(same, concat("token ", t, " not routed to expert ", e, " changed")))
        return false;
    }
    return true;
  }

  /// A call that must throw `Expected` and leave every parameter, gradient and the routing alone.
  template <class Expected, class Call>
  bool refused(Call&& call, const std::string& what) {
    const auto before = state();
    try {
      call();
    } catch (const Expected&) {
      return expect(state() == before, what + " threw but changed the block");
    } catch (const std::exception& error) {
      return expect(false, what + " threw the wrong type: " + error.what());
    }
    return expect(false, what + " did not throw");
  }

  bool bad_input() {
    const Shape<3> shape{pick(1, 2), pick(1, 3), d_};
    const Shape<3> wrong_d{shape[0], shape[1], d_ + pick(1, 2)};
    const auto x = testing::random_tensor<double, 3>(shape, values_);
    switch (pick(0, 3)) {
      case 0:
        return refused<ShapeError>(
            [&] { block_->forward(testing::random_tensor<double, 3>(wrong_d, values_)); },
            "forward of a wrong width");
      case 1: {
        block_->forward(x, cache_);
        cached_x_ = x;
        const Shape<3> wrong{shape[0], shape[1] + 1, d_};
        return refused<ShapeError>(
            [&] { block_->backward(x, cache_, testing::random_tensor<double, 3>(wrong, values_)); },
            "backward with dy of another shape");
      }
      case 2: {
        block_->forward(x, cache_);
        cached_x_ = x;
        const auto other = testing::random_tensor<double, 3>({shape[0], shape[1] + 1, d_}, values_);
        return refused<ShapeError>([&] { block_->backward(other, cache_, other); },
                                   "backward with a cache of another input");
      }
      default:
        return refused<ShapeError>(
            [&] {
              const auto bad = testing::random_tensor<double, 3>(wrong_d, values_);
              block_->backward(bad, cache_, bad);
            },
            "backward of a wrong width");
    }
  }

  bool bad_routing() {
    MoeRouting r = random_routing();
    switch (pick(0, 4)) {
      case 0:
        r.top_k = pick(0, 1) ? 0 : e_ + pick(1, 3);
        break;
      case 1:
        r.capacity_factor = pick(0, 1) ? 0.0 : std::numeric_limits<double>::quiet_NaN();
        break;
      case 2:
        r.load_balancing_coef = -0.5;
        break;
      case 3:
        r.z_loss_coef = std::numeric_limits<double>::infinity();
        break;
      default:
        r.gating = static_cast<MoeGating>(2 + pick(0, 5));
    }
    return refused<ConfigError>([&] { block_->set_routing(r); }, "set_routing of a bad routing");
  }

  /// NaN or ±Inf in x: route, both forwards throw dissect::Error; the block is unchanged, and a
  /// cache the throw interrupted is refused by backward until a forward fills it again.
  bool non_finite_input() {
    auto x = testing::random_tensor<double, 3>({pick(1, 2), pick(1, 3), d_}, values_);
    const double bad[] = {std::numeric_limits<double>::quiet_NaN(),
                          std::numeric_limits<double>::infinity(),
                          -std::numeric_limits<double>::infinity()};
    x.data()[pick(0, x.size() - 1)] = bad[pick(0, 2)];
    const bool ok =
        refused<Error>([&] { block_->forward(x); }, "forward of a non-finite x") &&
        refused<Error>([&] { block_->route(x); }, "route of a non-finite x") &&
        refused<Error>([&] { block_->forward(x, cache_); }, "forward(x, cache) of a non-finite x");
    if (!ok) return false;
    if (cached_x_) {
      const Tensor<double, 3>& old = *cached_x_;
      if (!refused<ShapeError>([&] { block_->backward(old, cache_, old); },
                               "backward with a cache whose forward threw")) {
        return false;
      }
      cached_x_.reset();
    }
    return true;
  }

  std::mt19937_64 engine_, values_;
  index_t d_ = 1, e_ = 1;
  std::optional<Block> block_;
  Block::Cache cache_;
  std::optional<Tensor<double, 3>> cached_x_;
  int compared_ = 0, skipped_ = 0;
};

TEST(ApiFuzz, AMixtureOfExpertsAgreesWithThePerTokenLoopOrRefusesAndChangesNothing) {
  MoeFuzz fuzz(20261203);
  const int steps = testing::sweep_trials(20'000);
  for (int i = 0; i < steps; ++i) {
    ASSERT_TRUE(fuzz.step()) << "at step " << i;
  }
  // Most forwards were compared; near-ties at the top-k's cut are rare.
  EXPECT_GT(fuzz.compared(), steps / 6);
  EXPECT_LT(fuzz.skipped(), 1 + fuzz.compared() / 100);
}

// ---- dropout ----------------------------------------------------------------------------------

/// Random sequences of Dropout calls — mode switches, new seeds, drawn and given masks, backward
/// with right and wrong shapes, NaN and ∞ in x — against what the cache must hold: after every
/// call the cache equals the reference (shape, mask, draw count) or the call threw and changed
/// nothing. Invariants: evaluation (and p = 0) is the identity; a mask's values are 0 and
/// scale(); the same seed and draw number give the same mask (a twin module replays it);
/// backward multiplies by the forward's mask; the kept fraction is near 1 − p over the run.
class DropoutFuzz {
 public:
  explicit DropoutFuzz(std::uint64_t seed) : engine_(seed) { rebuild(); }

  bool step() {
    switch (pick(0, 7)) {
      case 0:
        if (pick(0, 10) == 0) rebuild();
        dropout_->set_training(!dropout_->training());
        return check();
      case 1:
        return inference();
      case 2:
      case 3:
        return drawn();
      case 4:
        return masked();
      case 5:
      case 6:
        return backward();
      default:
        if (pick(0, 3) == 0) cache_ = {}, ref_ = {};  // a fresh cache starts at draw 0
        return check();
    }
  }

  /// The kept count over every drawn mask, against its binomial expectation.
  void expect_kept_fraction() const {
    EXPECT_GT(elements_, 10'000);
    EXPECT_NEAR(kept_, expected_kept_, 5 * std::sqrt(variance_) + 1) << "of " << elements_;
  }

 private:
  struct State {
    std::vector<index_t> shape;
    std::vector<double> mask;
    bool masked = false;
    std::uint64_t draws = 0;
  };

  index_t pick(index_t low, index_t high) {
    return std::uniform_int_distribution<index_t>(low, high)(engine_);
  }

  void rebuild() {
    static constexpr double ps[] = {0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0};
    seed_ = static_cast<std::uint64_t>(pick(0, 1'000'000));
    dropout_.emplace(ps[pick(0, 6)], DropoutOptions{.seed = seed_});
    cache_ = {};
    ref_ = {};
  }

  Tensor<double, 3> input(bool wrong = false) {
    Shape<3> shape{pick(0, 3), pick(1, 4), pick(1, 5)};
    if (wrong && !ref_.shape.empty()) {
      std::copy(ref_.shape.begin(), ref_.shape.end(), shape.begin());
      shape[pick(0, 2)] += pick(1, 2);
    } else if (!wrong && pick(0, 2) > 0 && !ref_.shape.empty()) {
      std::copy(ref_.shape.begin(), ref_.shape.end(), shape.begin());  // the cached x's shape
    }
    Tensor<double, 3> x(shape);
    for (double& v : x) {
      const index_t r = pick(0, 40);
      v = r == 0   ? NAN
          : r == 1 ? -std::numeric_limits<double>::infinity()
                   : static_cast<double>(pick(-4, 4));
    }
    return x;
  }

  bool check() {
    EXPECT_EQ(cache_.shape, ref_.shape);
    EXPECT_EQ(cache_.masked, ref_.masked);
    EXPECT_EQ(cache_.draws, ref_.draws);
    if (ref_.masked) {
      EXPECT_TRUE(
          std::equal(cache_.mask.begin(), cache_.mask.end(), ref_.mask.begin(), ref_.mask.end()));
    }
    return !::testing::Test::HasFailure();
  }

  /// y = x ⊙ mask elementwise, NaN where IEEE says so.
  static bool product_equals(const Tensor<double, 3>& y, const Tensor<double, 3>& x,
                             const std::vector<double>& mask) {
    for (index_t i = 0; i < y.size(); ++i) {
      const double expected = x.data()[i] * mask[static_cast<std::size_t>(i)];
      const double got = y.data()[i];
      if (!(got == expected || (std::isnan(got) && std::isnan(expected)))) return false;
    }
    return true;
  }

  static bool identical(const Tensor<double, 3>& a, const Tensor<double, 3>& b) {
    if (a.shape() != b.shape()) return false;
    for (index_t i = 0; i < a.size(); ++i) {
      const double p = a.data()[i], q = b.data()[i];
      if (!(p == q || (std::isnan(p) && std::isnan(q)))) return false;
    }
    return true;
  }

  bool inference() {
    const auto x = input();
    const bool identity = !dropout_->training() || dropout_->p() == 0;
    if (identity) {
      EXPECT_TRUE(identical(dropout_->forward(x), x)) << "evaluation is the identity";
    } else {
      EXPECT_THROW((void)dropout_->forward(x), Error);
    }
    return check();
  }

  bool drawn() {
    const auto x = input();
    const auto y = dropout_->forward(x, cache_);
    ref_.shape.assign(x.shape().begin(), x.shape().end());
    if (!dropout_->training() || dropout_->p() == 0) {
      ref_.masked = false;
      EXPECT_TRUE(identical(y, x)) << "evaluation is the identity";
      return check();
    }
    // The mask this draw must be: a twin of the same seed, its cache at the same draw number.
    Dropout<double> twin(dropout_->p(), {.seed = seed_});
    Dropout<double>::Cache replay;
    replay.draws = ref_.draws;
    (void)twin.forward(x, replay);
    ref_.masked = true;
    ++ref_.draws;
    ref_.mask.assign(replay.mask.begin(), replay.mask.end());
    const double scale = dropout_->scale();
    for (const double m : ref_.mask) {
      EXPECT_TRUE(m == 0.0 || m == scale) << m;
      kept_ += m != 0.0;
    }
    const double n = static_cast<double>(x.size()), p = dropout_->p();
    elements_ += x.size();
    expected_kept_ += n * (1 - p);
    variance_ += n * p * (1 - p);
    EXPECT_TRUE(product_equals(y, x, ref_.mask)) << "y = x ⊙ mask";
    return check();
  }

  bool masked() {
    const bool wrong_shape = pick(0, 5) == 0, wrong_value = pick(0, 5) == 0;
    const auto x = input();
    Tensor<double, 3> keep(x.shape());
    for (double& k : keep) k = static_cast<double>(pick(0, 1));
    if (wrong_shape) {
      keep = Tensor<double, 3>({x.dim(0) + 1, x.dim(1), x.dim(2)});
    } else if (wrong_value && keep.size() > 0) {
      keep.data()[pick(0, keep.size() - 1)] = 0.5;
    }
    if (wrong_shape || (wrong_value && keep.size() > 0)) {
      EXPECT_THROW((void)dropout_->forward_masked(x, keep, cache_), Error);
      return check();
    }
    const auto y = dropout_->forward_masked(x, keep, cache_);
    ref_.shape.assign(x.shape().begin(), x.shape().end());
    ref_.masked = true;
    const double kept = dropout_->p() < 1 ? dropout_->scale() : 0.0;
    ref_.mask.assign(keep.begin(), keep.end());
    for (double& m : ref_.mask) m = m == 1.0 ? kept : 0.0;
    EXPECT_TRUE(product_equals(y, x, ref_.mask)) << "y = x ⊙ keep·scale";
    return check();
  }

  bool backward() {
    const bool wrong = pick(0, 3) == 0;
    const auto x = input(wrong);
    const bool fits =
        std::equal(ref_.shape.begin(), ref_.shape.end(), x.shape().begin(), x.shape().end());
    Tensor<double, 3> dy(x.shape());
    for (double& v : dy) v = static_cast<double>(pick(-4, 4));
    if (!fits) {
      EXPECT_THROW((void)dropout_->backward(x, cache_, dy), ShapeError);
      return check();
    }
    if (pick(0, 4) == 0) {
      const Tensor<double, 3> other({x.dim(0), x.dim(1), x.dim(2) + 1});
      EXPECT_THROW((void)dropout_->backward(x, cache_, other), ShapeError);
    }
    const auto dx = dropout_->backward(x, cache_, dy);
    if (ref_.masked) {
      EXPECT_TRUE(product_equals(dx, dy, ref_.mask)) << "backward uses the forward's mask";
    } else {
      EXPECT_TRUE(identical(dx, dy));
    }
    return check();
  }

  std::mt19937_64 engine_;
  std::uint64_t seed_ = 0;
  std::optional<Dropout<double>> dropout_;
  Dropout<double>::Cache cache_;
  State ref_;
  double kept_ = 0, expected_kept_ = 0, variance_ = 0;
  index_t elements_ = 0;
};

TEST(ApiFuzz, DropoutReplaysItsMasksAndRefusesWithoutChangingTheCache) {
  DropoutFuzz fuzz(20261204);
  for (int i = 0; i < 100'000; ++i) {
    ASSERT_TRUE(fuzz.step()) << "at step " << i;
  }
  fuzz.expect_kept_fraction();
}

// ---- cross-attention and linear attention ----------------------------------------------------

/// Random calls of cross_attention (functional and the block) and linear_attention (causal and
/// not, and its decode steps), a quarter of them with one extent, the mask, the scale or eps made
/// wrong. A valid call's outputs and gradients are finite and shaped as documented, the two
/// forwards of cross-attention agree, padded keys get no gradient, and decode steps equal the
/// causal forward; an invalid one throws ShapeError or ConfigError and leaves the cache, the state
/// and the block's gradients as they were.
class AttentionKindsFuzz {
 public:
  explicit AttentionKindsFuzz(std::uint64_t seed) : engine_(seed) {}

  bool step() {
    switch (pick(0, 5)) {
      case 0:
        return cross();
      case 1:
        return block();
      case 2:
        return flash();
      case 3:
        return windowed();
      default:
        return linear();
    }
  }
  int refused() const { return refused_; }

 private:
  index_t pick(index_t low, index_t high) {
    return std::uniform_int_distribution<index_t>(low, high)(engine_);
  }
  Tensor<double, 4> tensor(const Shape<4>& shape) {
    Tensor<double, 4> t(shape);
    for (double& v : t) v = static_cast<double>(pick(-8, 8)) / 4;
    return t;
  }
  /// The largest |a − b| / (1 + |b|); infinite if the shapes differ.
  static double gap(const Tensor<double, 4>& a, const Tensor<double, 4>& b) {
    if (a.shape() != b.shape()) return INFINITY;
    double worst = 0;
    for (index_t i = 0; i < a.size(); ++i) {
      worst = std::max(worst, std::abs(a.data()[i] - b.data()[i]) / (1 + std::abs(b.data()[i])));
    }
    return worst;
  }
  static bool same_bits(const Tensor<double, 3>& a, const Tensor<double, 3>& b) {
    return a.shape() == b.shape() &&
           std::equal(a.begin(), a.end(), b.begin(), [](double x, double y) {
             return std::bit_cast<std::uint64_t>(x) == std::bit_cast<std::uint64_t>(y);
           });
  }
  static bool finite(const Tensor<double, 4>& t) {
    for (const double v : t) {
      if (!std::isfinite(v)) return false;
    }
    return true;
  }
  /// Runs `call`; true if it threw one of the library's shape or config errors.
  template <class Call>
  bool refuses(Call&& call) {
    try {
      call();
    } catch (const ShapeError&) {
      return ++refused_, true;
    } catch (const ConfigError&) {
      return ++refused_, true;
    }
    return false;
  }

  bool cross() {
    const index_t b = pick(1, 3), kv = pick(1, 2), h = kv * pick(1, 2), t = pick(0, 4),
                  s = pick(1, 5), d = pick(1, 4);
    std::vector<index_t> lengths;
    for (index_t i = 0; i < b; ++i) lengths.push_back(pick(0, s));
    auto q = tensor({b, h, t, d}), k = tensor({b, kv, s, d}), v = tensor({b, kv, s, d});
    auto mask = KeyPaddingMask::from_lengths(lengths, s);
    std::optional<double> scale;
    const bool wrong = pick(0, 3) == 0;
    if (wrong) {
      switch (pick(0, 4)) {
        case 0:
          k = tensor({b, kv, s, d + 1}), v = k;
          break;
        case 1:
          k = tensor({b, h + 1, s, d}), v = k;
          break;
        case 2:
          k = tensor({b, kv, 0, d}), v = k;
          break;
        case 3:
          mask = KeyPaddingMask::from_lengths(std::vector<index_t>(b + 1, 0), s);
          break;
        default:
          scale = -1.0;
      }
    }
    CrossAttentionCache<double> cache;
    (void)cross_attention(q, tensor({b, kv, s, d}), tensor({b, kv, s, d}), cache);
    const auto before = testing::snapshot(cache.probs);
    if (wrong) {
      if (!refuses([&] { (void)cross_attention(q, k, v, cache, mask, scale); })) return false;
      return refuses([&] { (void)cross_attention(q, k, v, mask, scale); }) &&
             gap(cache.probs, before) == 0 && !cache.scale;
    }
    const auto o = cross_attention(q, k, v, cache, mask, scale);
    const auto grads = cross_attention_backward(q, k, v, cache, tensor(q.shape()));
    EXPECT_LE(gap(cross_attention(q, k, v, mask, scale), o), 1e-12);
    for (index_t i = 0; i < b; ++i) {  // padded keys: no gradient
      for (index_t j = lengths[static_cast<std::size_t>(i)]; j < s; ++j) {
        for (index_t g = 0; g < kv; ++g) {
          for (index_t e = 0; e < d; ++e) {
            if (grads.k(i, g, j, e) != 0 || grads.v(i, g, j, e) != 0) return false;
          }
        }
      }
    }
    return finite(o) && finite(grads.q) && finite(grads.k) && finite(grads.v) &&
           grads.q.shape() == q.shape() && grads.k.shape() == k.shape();
  }

  bool block() {
    const index_t kv = pick(1, 2), h = kv * pick(1, 2), d_model = h * pick(1, 3),
                  d_memory = pick(1, 5), b = pick(1, 2), t = pick(1, 3), s = pick(1, 4);
    CrossAttention<double> layer(d_model, h, {.d_memory = d_memory, .n_kv_heads = kv, .seed = 1});
    Tensor<double, 3> x({b, t, d_model}), memory({b, s, d_memory}), dy({b, t, d_model});
    for (auto* target : {&x, &memory, &dy}) {
      for (double& v : *target) v = static_cast<double>(pick(-4, 4)) / 4;
    }
    CrossAttention<double>::Cache cache;
    (void)layer.forward(x, memory, cache);
    if (pick(0, 3) == 0) {
      const Tensor<double, 3> bad({b, s + 1, d_memory});
      const bool refused =
          refuses([&] { (void)layer.backward(x, bad, cache, dy); }) && refuses([&] {
            (void)layer.forward(x, Tensor<double, 3>({b, s, d_memory + 1}));
          });
      bool untouched = true;
      layer.for_each_parameter([&](const ParameterName&, auto, auto grad) {
        for (index_t i = 0; i < grad.size(); ++i) untouched = untouched && grad.data()[i] == 0;
      });
      return refused && untouched;
    }
    const auto grads = layer.backward(x, memory, cache, dy);
    bool ok = grads.dx.shape() == x.shape() && grads.dmemory.shape() == memory.shape();
    for (const double g : grads.dmemory) ok = ok && std::isfinite(g);
    return ok;
  }

  /// Flash attention against the materialised paths it replaces: causal_attention's (with the
  /// KV-cache offset, S ≥ T) or, unmasked, cross-attention without padding; a refused call
  /// leaves the cache alone.
  bool flash() {
    const bool causal = pick(0, 1) == 0;
    const index_t b = pick(1, 2), kv = pick(1, 2), h = kv * pick(1, 2), t = pick(0, 5),
                  s = causal ? t + pick(0, 3) : pick(1, 5), d = pick(1, 4);
    auto q = tensor({b, h, t, d}), k = tensor({b, kv, s, d}), v = tensor({b, kv, s, d});
    FlashAttentionOptions options{.causal = causal};
    FlashAttentionCache<double> cache;
    (void)flash_attention(q, k, v, cache, options);
    const auto before = testing::snapshot(cache.lse);
    if (pick(0, 3) == 0) {
      switch (pick(0, 3)) {
        case 0:
          k = tensor({b, kv, s, d + 1}), v = k;
          break;
        case 1:
          k = tensor({b, h + 1, s, d}), v = k;
          break;
        case 2:
          if (!causal || t == 0) return true;  // S < T is valid unmasked
          k = tensor({b, kv, t - 1, d}), v = k;
          break;
        default:
          options.scale = -1.0;
      }
      return refuses([&] { (void)flash_attention(q, k, v, cache, options); }) &&
             refuses([&] { (void)flash_attention(q, k, v, options); }) &&
             same_bits(cache.lse, before);
    }
    const auto o = flash_attention(q, k, v, cache, options);
    const auto dout = tensor(q.shape());
    const auto grads = flash_attention_backward(q, k, v, o, cache, dout);
    Tensor<double, 4> reference;
    QKV<double> reference_grads;
    if (causal) {
      AttentionCache<double> materialised;
      reference = causal_attention(q, k, v, materialised);
      reference_grads = causal_attention_backward(q, k, v, materialised, dout);
    } else {
      CrossAttentionCache<double> materialised;
      reference = cross_attention(q, k, v, materialised);
      reference_grads = cross_attention_backward(q, k, v, materialised, dout);
    }
    return gap(o, reference) <= 1e-12 && gap(grads.q, reference_grads.q) <= 1e-12 &&
           gap(grads.k, reference_grads.k) <= 1e-12 && gap(grads.v, reference_grads.v) <= 1e-12;
  }

  /// A sliding window: the online (inference) path against the training path's banded
  /// probabilities, and W ≥ S against no window, bit for bit; W ≤ 0 refused.
  bool windowed() {
    const index_t b = pick(1, 2), kv = pick(1, 2), h = kv * pick(1, 2), t = pick(0, 6),
                  s = t + pick(0, 3), d = pick(1, 4);
    const index_t window = pick(-1, 7);
    const auto q = tensor({b, h, t, d}), k = tensor({b, kv, s, d}), v = tensor({b, kv, s, d});
    AttentionCache<double> cache;
    if (window <= 0) {
      return refuses([&] { (void)causal_attention(q, k, v, std::nullopt, window); }) &&
             refuses([&] { (void)causal_attention(q, k, v, cache, std::nullopt, window); });
    }
    const auto online = causal_attention(q, k, v, std::nullopt, window);
    const auto training = causal_attention(q, k, v, cache, std::nullopt, window);
    const auto grads = causal_attention_backward(q, k, v, cache, tensor(q.shape()));
    if (window >= s && gap(online, causal_attention(q, k, v)) != 0) return false;
    return gap(online, training) <= 1e-12 && finite(grads.q) && finite(grads.k) &&
           finite(grads.v) && grads.k.shape() == k.shape();
  }

  bool linear() {
    const bool causal = pick(0, 1) == 0;
    const index_t b = pick(1, 2), kv = pick(1, 2), h = kv * pick(1, 2), t = pick(0, 5),
                  s = causal ? t : pick(1, 5), d_k = pick(1, 4), d_v = pick(1, 4);
    auto q = tensor({b, h, t, d_k}), k = tensor({b, kv, s, d_k}), v = tensor({b, kv, s, d_v});
    LinearAttentionOptions options{.causal = causal, .eps = pick(0, 1) * 1e-6};
    if (pick(0, 3) == 0) {
      switch (pick(0, 3)) {
        case 0:
          k = tensor({b, kv, s + 1, d_k});
          break;
        case 1:
          v = tensor({b + 1, kv, s, d_v});
          break;
        case 2:
          k = tensor({b, h + 1, s, d_k}), v = tensor({b, h + 1, s, d_v});
          break;
        default:
          options.eps = -1;
      }
      if (!causal && k.dim(2) != v.dim(2)) v = tensor({b, kv, k.dim(2), d_v});
      if (!causal && k.dim(2) == s + 1 && options.eps >= 0) return true;  // valid when not causal
      LinearAttentionState<double> state;
      return refuses([&] { (void)linear_attention(q, k, v, options); }) && refuses([&] {
               (void)linear_attention_backward(q, k, v, tensor({b, h, t, d_v}), options);
             }) &&
             (!causal ||
              (refuses([&] { (void)linear_attention_step(q, k, v, state, options.eps); }) &&
               state.positions == 0 && state.s.empty()));
    }
    const auto o = linear_attention(q, k, v, options);
    const auto grads = linear_attention_backward(q, k, v, tensor(o.shape()), options);
    if (causal && t > 0) {
      LinearAttentionState<double> state;
      const auto stepped = linear_attention_step(q, k, v, state, options.eps);
      EXPECT_LE(gap(stepped, o), 1e-12);
    }
    return finite(o) && finite(grads.q) && finite(grads.k) && finite(grads.v) &&
           grads.v.shape() == v.shape();
  }

  std::mt19937_64 engine_;
  int refused_ = 0;
};

TEST(ApiFuzz, NewAttentionKindsAreConsistentOrRefuseCleanly) {
  AttentionKindsFuzz fuzz(20261205);
  const int steps = testing::sweep_trials(3'000);
  for (int i = 0; i < steps; ++i) {
    ASSERT_TRUE(fuzz.step()) << "at step " << i;
  }
  EXPECT_GT(fuzz.refused(), steps / 10);
}

// ---- a whole small model ----------------------------------------------------------------------

/// The largest |a − b| / (1 + |b|).
template <TensorLike A, TensorLike B>
double relative_gap(const A& a, const B& b) {
  double gap = 0;
  const auto x = const_view(a);
  const auto y = const_view(b);
  for (index_t i = 0; i < x.size(); ++i) {
    gap = std::max(gap, std::abs(double(x.data()[i]) - y.data()[i]) / (1 + std::abs(y.data()[i])));
  }
  return gap;
}

/// Every parameter, by name.
template <Module M>
std::vector<std::pair<std::string, std::vector<float>>> parameters_by_name(const M& model) {
  std::vector<std::pair<std::string, std::vector<float>>> all;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    all.emplace_back(name.str(), std::vector<float>(value.begin(), value.end()));
  });
  return all;
}

/// Random sequences of whole-model calls on `subject`, mirrored on `twin`, which is never merged
/// or packed: after every call their forwards agree (to the packed GEMM's and the merge's
/// rounding), or the call threw and the subject is bit for bit as before.
class ModelFuzz {
 public:
  explicit ModelFuzz(std::uint64_t seed)
      : engine_(seed),
        subject_(GPT2Model<float>(testing::small_gpt2(), {.seed = 1})),
        twin_(GPT2Model<float>(testing::small_gpt2(), {.seed = 1})) {
    // The files the calls read: another model's weights, and adapters for the targets below.
    GPT2Model<float> other(testing::small_gpt2(), {.seed = 2});
    save_module(dir_ / "other.safetensors", other);
    apply_lora(other, lora_config());
    randomise_adapters(other, 11);
    save_adapters(dir_ / "adapters.safetensors", other);
  }

  bool step() {
    switch (pick(0, 8)) {
      case 0:
        return mirrored(!adapted_ ? 0 : 1, [&](auto& m) {
          apply_lora(m, lora_config());
          adapted_ = true;
          randomise_adapters(m, 5);
        });
      case 1:
        return merge(true);
      case 2:
        return merge(false);
      case 3:
        return subject_only(false, [&] { pick(0, 1) ? subject_->pack() : subject_->unpack(); });
      case 4:
        return load_adapters_call();
      case 5:
        return load_state_dict_call();
      case 6:
        return save_and_load();
      case 7:
        return generate_call();
      default:
        return check();
    }
  }

 private:
  static LoRAConfig lora_config() {
    return {.adapter = {.rank = 2, .alpha = 4, .seed = 3}, .target_modules = {"qkv", "down"}};
  }
  index_t pick(index_t low, index_t high) {
    return std::uniform_int_distribution<index_t>(low, high)(engine_);
  }
  static void randomise_adapters(GPT2Model<float>& model, std::uint64_t seed) {
    std::mt19937_64 values(seed);
    for_each_layer(model, [&](const std::string&, Linear<float>& layer) {
      if (!layer.has_adapter()) return;
      for (auto& v : layer.adapter().B()) v = std::uniform_real_distribution<float>(-1, 1)(values);
    });
  }

  bool check() {
    const auto ids = testing::random_ids(8, 23, static_cast<std::uint64_t>(pick(0, 1000)));
    const TokenBatch tokens{ids, 2, 4};
    EXPECT_LT(relative_gap(subject_->forward(tokens), twin_.forward(tokens)), 1e-4);
    if (!merged_) {  // merged weights hold ΔW; unmerged ones are the twin's (to the rounding)
      const auto a = parameters_by_name(*subject_), b = parameters_by_name(twin_);
      EXPECT_EQ(a.size(), b.size());
      for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
        EXPECT_EQ(a[i].first, b[i].first);
        for (std::size_t j = 0; j < a[i].second.size(); ++j) {
          EXPECT_NEAR(a[i].second[j], b[i].second[j], 1e-5 * (1 + std::abs(b[i].second[j])))
              << a[i].first;
        }
      }
    }
    return !::testing::Test::HasFailure();
  }

  /// `call` on the subject alone: it must throw when `must_throw`, and then change nothing.
  /// Checked against the twin after it unless the twin is still to follow (`then_twin`).
  template <class Call>
  bool subject_only(bool must_throw, Call&& call, bool then_twin = false) {
    const auto before = parameters_by_name(*subject_);
    const auto ids = testing::random_ids(6, 23, 9);
    const auto y_before = subject_->forward({ids, 1, 6});
    bool threw = false;
    try {
      call();
    } catch (const Error&) {
      threw = true;
    }
    EXPECT_EQ(threw, must_throw);
    if (threw) {
      EXPECT_EQ(parameters_by_name(*subject_), before);
      EXPECT_TENSOR_EQ(subject_->forward({ids, 1, 6}), y_before);
    }
    if (then_twin && !threw) return !::testing::Test::HasFailure();
    return check();
  }

  /// `call` on both models; must_throw: 0 never, 1 always (and then on both).
  template <class Call>
  bool mirrored(int must_throw, Call&& call) {
    if (must_throw) return subject_only(true, [&] { call(*subject_); });
    if (!subject_only(
            false, [&] { call(*subject_); }, true))
      return false;
    call(twin_);
    return check();
  }

  bool merge(bool merging) {
    const bool refused = !adapted_ || merged_ == merging;
    if (!adapted_) return check();  // nothing to merge: a no-op that counts 0
    return subject_only(refused, [&] {
      merging ? merge_adapters(*subject_) : unmerge_adapters(*subject_);
      merged_ = merging;
    });
  }

  bool load_adapters_call() {
    const SafetensorsFile file(dir_ / "adapters.safetensors");
    // Into a merged subject too: the layers remember what they merged.
    if (!subject_only(
            false, [&] { load_adapters(*subject_, file); }, true))
      return false;
    load_adapters(twin_, file);
    adapted_ = true;
    return check();
  }

  bool load_state_dict_call() {
    const Checkpoint file(dir_ / "other.safetensors");
    LoadOptions options;
    options.strict = !adapted_;  // the file has no lora_A / lora_B
    // A packed subject repacks; a merged one refuses (its weights cannot take new values).
    if (!subject_only(
            merged_, [&] { load_state_dict(*subject_, file, options); }, true)) {
      return false;
    }
    if (!merged_) load_state_dict(twin_, file, options);
    return check();
  }

  bool save_and_load() {
    const auto path = dir_ / "model.safetensors";
    std::filesystem::remove(path);
    if (!subject_only(merged_, [&] { save_model(path, *subject_); })) return false;
    if (merged_) {
      EXPECT_FALSE(std::filesystem::exists(path));
      return check();
    }
    subject_.emplace(load_model<GPT2Model<float>>(Checkpoint(path)));
    return check();
  }

  bool generate_call() {
    const auto prompt = testing::random_ids(3, 23, static_cast<std::uint64_t>(pick(0, 1000)));
    const GenerationOptions options{.max_new_tokens = 4, .sampling = {.temperature = 0}};
    std::vector<index_t> a, b;
    generate(*subject_, prompt, options, [&](index_t id) { a.push_back(id); });
    generate(twin_, prompt, options, [&](index_t id) { b.push_back(id); });
    EXPECT_EQ(a, b);
    return check();
  }

  std::mt19937_64 engine_;
  testing::TemporaryDirectory dir_;
  std::optional<GPT2Model<float>> subject_;
  GPT2Model<float> twin_;
  bool adapted_ = false, merged_ = false;
};

TEST(ApiFuzz, AWholeModelThroughLoRAPackingAndFilesAgreesWithItsPlainTwin) {
  ModelFuzz fuzz(20260603);
  for (int i = 0; i < testing::sweep_trials(300); ++i) {
    ASSERT_TRUE(fuzz.step()) << "at step " << i;
  }
}

}  // namespace test_api_fuzz
}  // namespace dissect
