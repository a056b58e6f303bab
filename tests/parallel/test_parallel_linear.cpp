// Tests of parallel/communicator.hpp and parallel/parallel_linear.hpp, run on 2 ranks and on 1:
// every output and every gradient, gathered across ranks, equals the single-process Linear's
// within a rounding bound; configurations that do not divide and shapes that differ across ranks
// throw the same error on every rank (the ctest TIMEOUT proves nobody hangs).
#include "dissect/parallel/parallel_linear.hpp"

#include <gtest/gtest.h>

#include <random>

#include "parallel/parallel_testing.hpp"

namespace dissect::testing {
namespace test_parallel_linear {

using parallel::ColumnParallelLinear;
using parallel::RowParallelLinear;

template <class Scalar>
class ParallelLinearTest : public ::testing::Test {};
TYPED_TEST_SUITE(ParallelLinearTest, FloatAndDouble);

TEST(Communicator, AllReduceAndGather) {
  const auto& comm = world();
  std::vector<double> values = {1.0 * comm.rank(), 2.0};
  comm.all_reduce_sum(std::span<double>(values));
  const int P = comm.size();
  EXPECT_EQ(values[0], P * (P - 1) / 2.0);
  EXPECT_EQ(values[1], 2.0 * P);
  const float mine[2] = {float(comm.rank()), float(10 * comm.rank())};
  const auto all = comm.all_gather(std::span<const float>(mine));
  ASSERT_EQ(all.size(), std::size_t(2 * P));
  for (int p = 0; p < P; ++p) {
    EXPECT_EQ(all[2 * p], float(p));
    EXPECT_EQ(all[2 * p + 1], float(10 * p));
  }
}

TEST(Communicator, AgreeAcceptsEqualValues) {
  const std::int64_t shape[3] = {2, 3, 4};
  EXPECT_NO_THROW(world().agree("test", shape));
}

TEST(Communicator, DisagreementIsTheSameShapeErrorOnEveryRank) {
  const auto& comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  const std::int64_t shape[3] = {2, 3 + comm.rank(), 4};
  EXPECT_THROW_WITH(comm.agree("test::op", shape, "x's shape"), ShapeError,
                    "test::op: ranks disagree about x's shape: entry 1 is 3 on some ranks and 4 on "
                    "others");
  std::vector<std::int64_t> ragged(2 + comm.rank(), 1);
  EXPECT_THROW_WITH(comm.agree("test::op", ragged), ShapeError,
                    "they hold 2 values on some ranks and 3 on others");
  // And the communicator still works afterwards: nobody is left inside a collective.
  EXPECT_NO_THROW(comm.agree("test::op", std::span<const std::int64_t>(shape, 1)));
}

TEST(Communicator, NeedsMpiInitialisedAndLeavesTheUsersErrorHandler) {
  MPI_Errhandler handler;
  MPI_Comm_get_errhandler(MPI_COMM_WORLD, &handler);
  EXPECT_EQ(handler, MPI_ERRORS_ARE_FATAL);
  MPI_Errhandler_free(&handler);
}

std::vector<std::string> expected_names(bool bias) {
  if (bias) return {"weight", "bias"};
  return {"weight"};
}

/// Forward and backward of both kinds against one full layer, for a rank-3 input.
template <class Scalar>
void check_linear_pair(bool bias) {
  SCOPED_TRACE(bias ? "bias" : "no bias");
  const auto& comm = world();
  const int P = comm.size(), p = comm.rank();
  constexpr index_t in = 6, out = 4;
  std::mt19937_64 engine(7);  // the same on every rank: the full tensors agree
  const auto x = random_tensor<Scalar, 3>({2, 3, in}, engine);
  const auto dy = random_tensor<Scalar, 3>({2, 3, out}, engine);
  Linear<Scalar> full(in, out, {.bias = bias, .seed = 11});
  const auto y_ref = full.forward(x);
  const auto dx_ref = full.backward(x, dy);
  const double max_w = max_abs_of(full.weight()), max_b = bias ? max_abs_of(full.bias()) : 0.0;

  {  // column-parallel: y sliced by rows of W, dx all-reduced
    ColumnParallelLinear<Scalar> column(full, comm);
    EXPECT_EQ(column.local_out_features(), out / P);
    const auto y = gather_last(comm, column.forward(x));
    EXPECT_TENSOR_NEAR(y, y_ref, 0.0, reduction_bound<Scalar>(in + 1, P, 1.0, max_w + max_b));
    const auto dx = column.backward(x, slice_last(dy, p, P));
    EXPECT_TENSOR_NEAR(dx, dx_ref, 0.0, reduction_bound<Scalar>(out, P, 1.0, max_w));
    std::vector<std::string> names;
    column.for_each_parameter(
        [&](const ParameterName& name, auto, auto) { names.push_back(name.str()); });
    EXPECT_EQ(names, expected_names(bias));
    const double bound = reduction_bound<Scalar>(6, P, 1.0, 1.0);  // Σ over B·T = 6 rows
    EXPECT_TENSOR_NEAR(gather_first(comm, column.local().weight_grad()), full.weight_grad(), 0.0,
                       bound);
    if (bias) {
      EXPECT_TENSOR_NEAR(gather_first(comm, column.local().bias_grad()), full.bias_grad(), 0.0,
                         bound);
    }
    EXPECT_EQ(column.parameter_count() * P, full.parameter_count());
  }
  {  // row-parallel: x sliced, partial y all-reduced, bias once
    RowParallelLinear<Scalar> row(full, comm);
    const auto x_p = slice_last(x, p, P);
    const auto y = row.forward(x_p);
    EXPECT_TENSOR_NEAR(y, y_ref, 0.0, reduction_bound<Scalar>(in + 1, P, 1.0, max_w + max_b));
    const auto dx = gather_last(comm, row.backward(x_p, dy));
    EXPECT_TENSOR_NEAR(dx, dx_ref, 0.0, reduction_bound<Scalar>(out, P, 1.0, max_w));
    const double bound = reduction_bound<Scalar>(6, P, 1.0, 1.0);
    EXPECT_TENSOR_NEAR(gather_last(comm, row.local().weight_grad()), full.weight_grad(), 0.0,
                       bound);
    std::vector<std::string> names;
    row.for_each_parameter(
        [&](const ParameterName& name, auto, auto) { names.push_back(name.str()); });
    EXPECT_EQ(names, expected_names(bias));
    if (bias) {
      Tensor<Scalar, 1> bias_grad(Shape<1>{out});
      row.for_each_parameter([&](const ParameterName& name, auto, auto grad) {
        if (name == "bias") std::copy(grad.begin(), grad.end(), bias_grad.begin());
      });
      EXPECT_TENSOR_NEAR(bias_grad, full.bias_grad(), 0.0, bound);
    }
    row.zero_grad();
    EXPECT_EQ(max_abs_of(row.local().weight_grad()), 0.0);
  }
}

TYPED_TEST(ParallelLinearTest, ForwardAndEveryGradientMatchTheFullLayer) {
  check_linear_pair<TypeParam>(true);
  check_linear_pair<TypeParam>(false);
}

TEST(ParallelLinear, FusedPartsTakeEachRanksShareOfEachPart) {
  const auto& comm = world();
  const int P = comm.size(), p = comm.rank();
  Linear<double> full(3, 8, {.seed = 5});
  const index_t parts[2] = {4, 4};
  ColumnParallelLinear<double> column(full, comm, parts);
  const index_t share = 4 / P;
  for (index_t part = 0; part < 2; ++part) {
    for (index_t r = 0; r < share; ++r) {
      EXPECT_EQ(column.local().bias()(part * share + r), full.bias()(part * 4 + p * share + r));
    }
  }
}

TEST(ParallelLinear, UnevenSplitIsTheSameConfigErrorOnEveryRank) {
  const auto& comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "every count divides by 1";
  Linear<float> seven_out(4, 7, {.seed = 1});
  EXPECT_THROW_WITH(ColumnParallelLinear<float>(seven_out, comm), ConfigError,
                    "ColumnParallelLinear: out_features = 7 does not divide evenly over 2 ranks");
  Linear<float> seven_in(7, 4, {.seed = 1});
  EXPECT_THROW_WITH(RowParallelLinear<float>(seven_in, comm), ConfigError,
                    "RowParallelLinear: in_features = 7 does not divide evenly over 2 ranks");
}

TEST(ParallelLinear, FullLayersThatDifferAcrossRanksAreAShapeError) {
  const auto& comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Linear<float> full(4, 4 + 2 * comm.rank(), {.seed = 1});
  EXPECT_THROW_WITH(ColumnParallelLinear<float>(full, comm), ShapeError,
                    "ColumnParallelLinear: ranks disagree about the full layer's");
}

TEST(ParallelLinear, InputsOfDifferentShapesAreAShapeErrorNotAHang) {
  const auto& comm = world();
  if (comm.size() < 2) GTEST_SKIP() << "needs 2 ranks";
  Linear<float> full(4, 4, {.seed = 3});
  RowParallelLinear<float> row(full, comm);
  ColumnParallelLinear<float> column(full, comm);
  const Tensor<float, 3> x_p({2, 3 + comm.rank(), 2});  // T differs across ranks
  EXPECT_THROW_WITH(row.forward(x_p), ShapeError,
                    "RowParallelLinear::forward: ranks disagree about the shapes of their inputs: "
                    "entry 2 is 3 on some ranks and 4 on others");
  const Tensor<float, 3> x({2, 3 + comm.rank(), 4});
  const Tensor<float, 3> dy_p({2, 3 + comm.rank(), 2});
  EXPECT_THROW_WITH(column.backward(x, dy_p), ShapeError,
                    "ColumnParallelLinear::backward: ranks disagree");
  EXPECT_EQ(max_abs_of(column.local().weight_grad()), 0.0);  // untouched
  // A shape wrong the same way on every rank is the local layer's own ShapeError.
  const Tensor<float, 2> wrong({2, 5});
  EXPECT_THROW_WITH(column.forward(wrong), ShapeError, "input last dim 5 != in_features 4");
}

TEST(Communicator, CountsAllReduceCallsAndBytes) {
  const auto& comm = world();
  comm.reset_stats();
  std::vector<double> values(5, 1.0);
  comm.all_reduce_sum(std::span<double>(values));
  comm.all_reduce_sum(std::span<double>(values));
  EXPECT_EQ(comm.stats().all_reduces, 2);
  EXPECT_EQ(comm.stats().bytes, 2 * 5 * static_cast<std::int64_t>(sizeof(double)));
  EXPECT_GE(comm.stats().seconds, 0.0);
  comm.reset_stats();
  EXPECT_EQ(comm.stats().all_reduces, 0);
}

TEST(ParallelLinearSlices, ASliceCutElsewhereEqualsTheSplitOfTheFullLayer) {
  const auto& comm = world();
  const Linear<double> full(4, 6, {.seed = 3});
  const ColumnParallelLinear<double> split(full, comm);
  ColumnParallelLinear<double> from_slice(Linear<double>(split.local()), 6, comm);
  EXPECT_TENSOR_NEAR(from_slice.local().weight(), split.local().weight(), 0.0, 0.0);
  EXPECT_EQ(from_slice.out_features(), 6);
  const Linear<double> wide(6, 4, {.seed = 4});
  const RowParallelLinear<double> rows(wide, comm);
  RowParallelLinear<double> rows_from_slice(Linear<double>(rows.local()),
                                            Tensor<double, 1>(wide.bias()), 6, comm);
  std::mt19937_64 engine(5);
  const auto x = random_tensor<double, 2>({3, 6 / comm.size()}, engine);
  EXPECT_TENSOR_NEAR(rows_from_slice.forward(x), rows.forward(x), 0.0, 0.0);
}

TEST(ParallelLinearSlices, ASliceOfTheWrongSizeIsTheSameShapeErrorOnEveryRank) {
  const auto& comm = world();
  // 6 rows on every rank: right for 1 rank, not for 2.
  if (comm.size() == 1) GTEST_SKIP() << "a whole layer is rank 0's slice";
  EXPECT_THROW_WITH(ColumnParallelLinear<double>(Linear<double>(4, 6, {.seed = 1}), 6, comm),
                    ShapeError, "ColumnParallelLinear: the slice has 6 rows but a rank's share");
  // Only the last rank's slice is wrong: its check runs inside the agreement, so every rank
  // throws its error, naming it.
  const index_t rows = comm.rank() == comm.size() - 1 ? 2 : 3;
  EXPECT_THROW_WITH(ColumnParallelLinear<double>(Linear<double>(4, rows, {.seed = 1}), 6, comm),
                    ShapeError,
                    "ColumnParallelLinear: rank " + std::to_string(comm.size() - 1) +
                        ": the slice has 2 rows but a rank's share of 6 over 2 ranks is 3");
  EXPECT_THROW_WITH(RowParallelLinear<double>(Linear<double>(6, 4, {.bias = false, .seed = 1}),
                                              std::nullopt, 6, comm),
                    ShapeError, "RowParallelLinear: the slice has 6 columns");
  EXPECT_THROW_WITH(
      RowParallelLinear<double>(Linear<double>(3, 4, {.seed = 1}), std::nullopt, 6, comm),
      ConfigError, "plain bias-free Linear");
}

}  // namespace test_parallel_linear
}  // namespace dissect::testing
