// Tests for dissect/layers/embedding.hpp: hand-derived lookups and scatter-adds (repeated ids), the
// learned positions of GPT-2 with a decoding offset, PyTorch fixtures (nn.Embedding by token and by
// position), finite differences in double, the module protocol, and every bad input with its type
// and message — each checked to leave the gradient untouched.
#include "dissect/layers/embedding.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_embedding {

using testing::random_tensor;
using testing::snapshot;
using Ids = std::vector<index_t>;

/// A [V, D] table whose entry [v, d] is 10·v + d: every row is recognisable by eye.
template <class Scalar>
Embedding<Scalar> counting_table(index_t vocab, index_t width) {
  Tensor<Scalar, 2> weight({vocab, width});
  for (index_t v = 0; v < vocab; ++v)
    for (index_t d = 0; d < width; ++d) weight(v, d) = static_cast<Scalar>(10 * v + d);
  return Embedding<Scalar>(std::move(weight));
}

// ---- the layer ----------------------------------------------------------------------------------

TEST(Embedding, TableIsVocabularyByWidthAndNamedWeight) {
  Embedding<float> layer(50, 8, {.seed = 1});
  EXPECT_EQ(layer.weight().shape(), (Shape<2>{50, 8}));
  EXPECT_EQ(layer.weight_grad().shape(), (Shape<2>{50, 8}));
  EXPECT_EQ(layer.num_embeddings(), 50);
  EXPECT_EQ(layer.embedding_dim(), 8);
  EXPECT_EQ(parameter_names(layer), std::vector<std::string>{"weight"});
  EXPECT_EQ(layer.parameter_count(), 400);
  std::ostringstream printed;
  printed << layer;
  EXPECT_EQ(printed.str(), "Embedding(50, 8)");
  static_assert(Module<Embedding<double>>);
  static_assert(!std::is_copy_assignable_v<Embedding<float>>);
  static_assert(!std::is_move_assignable_v<Embedding<float>>);
}

TEST(Embedding, InitIsNormalWithTheGivenStdAndSeed) {
  // 20,000 draws: the sample std is within ~1% of σ (its standard error is σ/√(2n) = 0.5%).
  for (double stddev : {1.0, 0.02}) {
    Embedding<double> layer(400, 50, {.init_std = stddev, .seed = 7});
    const auto values = layer.weight();
    const double n = static_cast<double>(values.size());
    const double mean = std::accumulate(values.begin(), values.end(), 0.0) / n;
    double squares = 0;
    for (double v : values) squares += (v - mean) * (v - mean);
    EXPECT_NEAR(mean, 0.0, 4 * stddev / std::sqrt(n));
    EXPECT_NEAR(std::sqrt(squares / n), stddev, 0.02 * stddev);
  }
  Embedding<float> a(5, 3, {.seed = 9}), b(5, 3, {.seed = 9}), c(5, 3, {.seed = 10});
  EXPECT_TENSOR_EQ(a.weight(), b.weight());
  EXPECT_FALSE(allclose(a.weight(), c.weight()));
  Embedding<float> zeros(5, 3, {.init_std = 0});
  for (float v : zeros.weight()) EXPECT_EQ(v, 0.0f);
}

TEST(Embedding, ForwardCopiesTheRowsOfTheIds) {
  const auto layer = counting_table<float>(6, 3);
  const Ids ids{4, 0, 5, 4, 4, 1};  // B = 2, T = 3
  const auto y = layer.forward({ids, 2, 3});
  ASSERT_EQ(y.shape(), (Shape<3>{2, 3, 3}));
  for (index_t b = 0; b < 2; ++b)
    for (index_t t = 0; t < 3; ++t)
      for (index_t d = 0; d < 3; ++d)
        EXPECT_EQ(y(b, t, d),
                  static_cast<float>(10 * ids[static_cast<std::size_t>(b * 3 + t)] + d));
  // forward_into ignores the buffer's old values.
  Tensor<float, 3> out({2, 3, 3});
  out.fill(NAN);
  layer.forward_into({ids, 2, 3}, out);
  EXPECT_TENSOR_EQ(out, y);
}

TEST(Embedding, RepeatedIdsAccumulateTheirRows) {
  auto layer = counting_table<double>(4, 2);
  const Ids ids{2, 0, 2, 2};  // B = 1, T = 4: id 2 three times, id 0 once, ids 1 and 3 never
  const Tensor<double, 3> dy({1, 4, 2}, {1, 2, 10, 20, 100, 200, 1000, 2000});
  layer.backward({ids, 1, 4}, dy);
  // Row 2: [1 + 100 + 1000, 2 + 200 + 2000]; row 0: [10, 20]; rows 1 and 3 stay 0.
  const Tensor<double, 2> expected({4, 2}, {10, 20, 0, 0, 1101, 2202, 0, 0});
  EXPECT_TENSOR_EQ(layer.weight_grad(), expected);
  // A second backward adds again, until zero_grad.
  layer.backward({ids, 1, 4}, dy);
  const Tensor<double, 2> twice({4, 2}, {20, 40, 0, 0, 2202, 4404, 0, 0});
  EXPECT_TENSOR_EQ(layer.weight_grad(), twice);
  layer.zero_grad();
  for (double v : layer.weight_grad()) EXPECT_EQ(v, 0.0);
}

TEST(Embedding, PositionsAreRowsFromTheOffset) {
  auto layer = counting_table<float>(8, 3);
  const auto positions = layer.forward_positions(3, 5);  // rows 5, 6, 7: the table's end
  ASSERT_EQ(positions.shape(), (Shape<2>{3, 3}));
  const Ids ids{5, 6, 7};
  EXPECT_TENSOR_EQ(positions, layer.forward({ids, 1, 3}).reshape(Shape<2>{3, 3}));
  EXPECT_EQ(layer.forward_positions(0, 8).size(), 0);  // empty window at the end: valid

  // [B, T, D]: GPT-2 broadcasts positions over the batch, so their gradient sums over B.
  const Tensor<float, 3> dy({2, 2, 3}, {1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60});
  layer.backward_positions(dy, 1);
  Tensor<float, 2> expected({8, 3});
  for (index_t d = 0; d < 3; ++d) {
    expected(1, d) = dy(0, 0, d) + dy(1, 0, d);
    expected(2, d) = dy(0, 1, d) + dy(1, 1, d);
  }
  EXPECT_TENSOR_EQ(layer.weight_grad(), expected);
  // [T, D] is one sequence.
  layer.zero_grad();
  const Tensor<float, 2> dy_one({2, 3}, {1, 2, 3, 4, 5, 6});
  layer.backward_positions(dy_one, 6);
  EXPECT_EQ(layer.weight_grad()(6, 2), 3.0f);
  EXPECT_EQ(layer.weight_grad()(7, 0), 4.0f);
  EXPECT_EQ(layer.weight_grad()(5, 0), 0.0f);
}

TEST(Embedding, EmptyBatchesAreValidAndAddNothing) {
  auto layer = counting_table<double>(4, 2);
  const Ids none;
  EXPECT_EQ(layer.forward({none, 0, 3}).shape(), (Shape<3>{0, 3, 2}));
  EXPECT_EQ(layer.forward({none, 2, 0}).shape(), (Shape<3>{2, 0, 2}));
  layer.backward({none, 2, 0}, Tensor<double, 3>({2, 0, 2}));
  for (double v : layer.weight_grad()) EXPECT_EQ(v, 0.0);
  Embedding<float> empty(0, 4);  // V = 0: valid, but every id is out of range
  EXPECT_EQ(empty.parameter_count(), 0);
}

TEST(Embedding, SetWeightCopiesAndMoveLeavesAnEmptyTable) {
  Embedding<float> layer(3, 2, {.seed = 3});
  const float* address = layer.weight().data();
  const Tensor<float, 2> values({3, 2}, {1, 2, 3, 4, 5, 6});
  layer.set_weight(values);
  EXPECT_EQ(layer.weight().data(), address);
  EXPECT_TENSOR_EQ(layer.weight(), values);
  Embedding<float> moved(std::move(layer));
  EXPECT_EQ(moved.weight().data(), address);
  EXPECT_EQ(layer.num_embeddings(), 0);  // NOLINT: the moved-from state is specified
  EXPECT_EQ(layer.embedding_dim(), 0);
  EXPECT_EQ(layer.parameter_count(), 0);
  Embedding<float> copy(moved);
  EXPECT_NE(copy.weight().data(), address);
  EXPECT_TENSOR_EQ(copy.weight(), values);
}

// ---- finite differences -------------------------------------------------------------------------

TEST(EmbeddingGradients, MatchFiniteDifferences) {
  // L = Σ dy ⊙ forward(ids) (+ Σ dy_pos ⊙ forward_positions) is linear in the table, so the
  // central difference is exact up to the loss's rounding: the default tolerance is ample.
  std::mt19937_64 engine(11);
  for (int trial = 0; trial < 20; ++trial) {
    const index_t vocab = 1 + static_cast<index_t>(engine() % 9);
    const index_t width = 1 + static_cast<index_t>(engine() % 5);
    const index_t batch = static_cast<index_t>(engine() % 3);
    const index_t seq = 1 + static_cast<index_t>(engine() % static_cast<std::uint64_t>(vocab));
    const index_t offset =
        static_cast<index_t>(engine() % static_cast<std::uint64_t>(vocab - seq + 1));
    SCOPED_TRACE(
        testing::concat_for_trace("V", vocab, "D", width, "B", batch, "T", seq, "offset", offset));
    Embedding<double> layer(vocab, width, {.seed = static_cast<std::uint64_t>(trial)});
    Ids ids(static_cast<std::size_t>(batch * seq));
    for (auto& id : ids) id = static_cast<index_t>(engine() % static_cast<std::uint64_t>(vocab));
    const auto dy = random_tensor<double, 3>({batch, seq, width}, engine);
    const auto dy_pos = random_tensor<double, 3>({batch, seq, width}, engine);
    layer.backward({ids, batch, seq}, dy);
    layer.backward_positions(dy_pos, offset);
    const auto loss = [&] {
      const auto y = layer.forward({ids, batch, seq});
      const auto p = layer.forward_positions(seq, offset);
      double total = 0;
      for (index_t i = 0; i < y.size(); ++i) total += dy.data()[i] * y.data()[i];
      for (index_t b = 0; b < batch; ++b)
        for (index_t t = 0; t < seq; ++t)
          for (index_t d = 0; d < width; ++d) total += dy_pos(b, t, d) * p(t, d);
      return total;
    };
    ASSERT_GRADIENT_OK(testing::gradcheck(loss, layer.weight(), layer.weight_grad()));
  }
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

template <class Scalar>
class EmbeddingTyped : public ::testing::Test {};
TYPED_TEST_SUITE(EmbeddingTyped, testing::FloatAndDouble);

TYPED_TEST(EmbeddingTyped, AgreeWithTorchNnEmbeddingByTokenAndByPosition) {
  using Scalar = TypeParam;
  const auto check = [](const testing::Fixture& fixture) {
    const index_t batch = fixture.meta_int("B"), seq = fixture.meta_int("T");
    const index_t offset = fixture.meta_int("offset");
    const auto& id_values = fixture.tensor("ids").values;
    const Ids ids(id_values.begin(), id_values.end());
    Embedding<Scalar> layer(testing::tensor_from<Scalar, 2>(fixture.tensor("weight")));
    const auto dy = testing::tensor_from<Scalar, 3>(fixture.tensor("dy"));

    // A lookup copies: exactly torch's values.
    const TokenBatch tokens{ids, batch, seq};
    const auto y_torch = testing::tensor_from<Scalar, 3>(fixture.tensor("y"));
    const auto y_pos_torch = testing::tensor_from<Scalar, 2>(fixture.tensor("y_pos"));
    const auto dweight_torch = testing::tensor_from<Scalar, 2>(fixture.tensor("dweight"));
    const auto dweight_pos_torch = testing::tensor_from<Scalar, 2>(fixture.tensor("dweight_pos"));
    EXPECT_TENSOR_EQ(layer.forward(tokens), y_torch);
    EXPECT_TENSOR_EQ(layer.forward_positions(seq, offset), y_pos_torch);

    // The gradient sums up to B·T rows per entry, in an order torch does not promise: each
    // entry is within γ_{B·T}·Σ|dy| of the exact sum, so the two within twice that. Σ|dy| per
    // entry is itself a scatter-add, computed exactly enough in double.
    const auto bound_for = [&](auto scatter) {
      Embedding<double> magnitude(Tensor<double, 2>(layer.weight().shape()));
      scatter(magnitude, testing::to_double(testing::absolute(dy)));
      Tensor<double, 2> bound(magnitude.weight_grad());
      for (double& b : bound) b *= 2 * testing::gamma<Scalar>(batch * seq);
      return bound;
    };
    layer.backward(tokens, dy);
    const auto token_bound = bound_for([&](auto& m, const auto& a) { m.backward(tokens, a); });
    EXPECT_TENSOR_WITHIN(layer.weight_grad(), dweight_torch, token_bound);
    layer.zero_grad();
    layer.backward_positions(dy, offset);
    const auto position_bound =
        bound_for([&](auto& m, const auto& a) { m.backward_positions(a, offset); });
    EXPECT_TENSOR_WITHIN(layer.weight_grad(), dweight_pos_torch, position_bound);
  };
  EXPECT_EQ(testing::for_each_fixture<Scalar>("embedding", check), 2);
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(EmbeddingErrors, TokenOutsideTheVocabularyNamesBatchPositionAndId) {
  auto layer = counting_table<float>(97, 2);
  Ids ids(8, 5);
  ids[7] = 97;  // [1, 3] of a [2, 4] batch
  EXPECT_THROW_WITH(layer.forward({ids, 2, 4}), Error,
                    "Embedding::forward: token 97 at [1, 3] is outside [0, 97)");
  ids[7] = 5;
  ids[2] = -1;
  EXPECT_THROW_WITH(layer.forward({ids, 2, 4}), Error, "token -1 at [0, 2] is outside [0, 97)");
  Tensor<float, 3> out({2, 4, 2});
  out.fill(7);
  EXPECT_THROW_WITH(layer.forward_into({ids, 2, 4}, out), Error,
                    "Embedding::forward_into: token -1 at [0, 2]");
  for (float v : out) EXPECT_EQ(v, 7.0f);  // nothing written
  // backward checks every id before adding any row: the valid ids before it add nothing.
  EXPECT_THROW_WITH(layer.backward({ids, 2, 4}, Tensor<float, 3>({2, 4, 2})), Error,
                    "Embedding::backward: token -1 at [0, 2]");
  for (float v : layer.weight_grad()) EXPECT_EQ(v, 0.0f);  // not even the rows before it
}

TEST(EmbeddingErrors, WrongCountsAndShapesAreShapeErrorsAndLeaveTheGradientAlone) {
  auto layer = counting_table<double>(10, 3);
  std::mt19937_64 engine(5);
  const Ids ids{1, 2, 3, 4, 5, 6};
  layer.backward({ids, 2, 3}, random_tensor<double, 3>({2, 3, 3}, engine));
  const auto before = snapshot(layer.weight_grad());

  EXPECT_THROW_WITH(layer.forward({ids, 2, 4}), ShapeError,
                    "Embedding::forward: 6 token ids for [B, T] = [2, 4] (8 expected)");
  EXPECT_THROW_WITH(layer.backward({ids, 3, 3}, Tensor<double, 3>({3, 3, 3})), ShapeError,
                    "6 token ids for [B, T] = [3, 3]");
  EXPECT_THROW_WITH(layer.backward({ids, 2, 3}, Tensor<double, 3>({2, 3, 4})), ShapeError,
                    "Embedding::backward: dy has shape [2, 3, 4] but tokens [B, T] = [2, 3] give "
                    "[2, 3, 3]");
  EXPECT_THROW_WITH(layer.backward({ids, 2, 3}, Tensor<double, 3>({3, 2, 3})), ShapeError,
                    "dy has shape [3, 2, 3]");
  EXPECT_THROW_WITH(layer.forward({ids, -2, -3}), ShapeError, "negative dimension -2");
  Tensor<double, 3> wrong({2, 3, 2});
  EXPECT_THROW_WITH(layer.forward_into({ids, 2, 3}, wrong), ShapeError,
                    "output has shape [2, 3, 2] but tokens [B, T] = [2, 3] give [2, 3, 3]");
  // Positions: a window past the table's end names T and the offset.
  EXPECT_THROW_WITH(layer.forward_positions(4, 7), Error,
                    "Embedding::forward_positions: positions [7, 7 + 4) (T 4, offset 7) are "
                    "outside the table's [0, 10)");
  EXPECT_THROW_WITH(layer.forward_positions(1, -1), Error, "(T 1, offset -1)");
  EXPECT_THROW_WITH(layer.forward_positions(-1, 0), ShapeError, "T must be >= 0, got -1");
  EXPECT_THROW_WITH(layer.backward_positions(Tensor<double, 2>({4, 3}), 7), Error,
                    "Embedding::backward_positions: positions [7, 7 + 4)");
  EXPECT_THROW_WITH(layer.backward_positions(Tensor<double, 3>({2, 4, 2}), 0), ShapeError,
                    "dy has shape [2, 4, 2] but the table is [10, 3]");
  EXPECT_TENSOR_EQ(layer.weight_grad(), before);
}

TEST(EmbeddingErrors, BuffersThatAliasTheLayerAreRefused) {
  auto layer = counting_table<float>(6, 2);
  const Ids ids{0, 1, 2};
  const auto weight = snapshot(layer.weight());
  const TensorView<float, 3> over_weight(layer.weight().data(), {1, 3, 2});
  EXPECT_THROW_WITH(layer.forward_into({ids, 1, 3}, over_weight), ShapeError,
                    "output [1, 3, 2] aliases the layer's weight or weight_grad [6, 2]");
  EXPECT_TENSOR_EQ(layer.weight(), weight);
  const TensorView<float, 3> over_grad(layer.weight_grad().data(), {1, 3, 2});
  EXPECT_THROW_WITH(layer.backward({ids, 1, 3}, over_grad), ShapeError,
                    "Embedding::backward: dy [1, 3, 2] aliases the layer's weight_grad [6, 2]");
  EXPECT_THROW_WITH(layer.backward_positions(over_grad, 0), ShapeError,
                    "Embedding::backward_positions: dy [1, 3, 2] aliases the layer's weight_grad");
}

TEST(EmbeddingErrors, ImpossibleConstructionsAndWeights) {
  EXPECT_THROW_WITH(Embedding<float>(-1, 4), ShapeError,
                    "Embedding: num_embeddings and embedding_dim must be >= 0, got [-1, 4]");
  EXPECT_THROW_WITH(Embedding<float>(4, 3, {.init_std = -0.02}), ConfigError,
                    "Embedding: init_std must be finite and >= 0 (got -0.02)");
  EXPECT_THROW_WITH(Embedding<float>(4, 3, {.init_std = NAN}), ConfigError, "init_std");
  Embedding<float> layer(4, 3, {.seed = 2});
  const auto weight = snapshot(layer.weight());
  EXPECT_THROW_WITH(layer.set_weight(Tensor<float, 2>({3, 4})), ShapeError,
                    "Embedding::set_weight: weight must be [num_embeddings, embedding_dim] = "
                    "[4, 3], got [3, 4]");
  EXPECT_TENSOR_EQ(layer.weight(), weight);
}

}  // namespace test_embedding
}  // namespace dissect
