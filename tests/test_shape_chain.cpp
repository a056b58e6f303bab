// Tests for dissect/accounting/shape_chain.hpp: the dimension table and symbolic shapes, expect()'s
// diagnoses (swapped axes, several readings when sizes coincide, the blind H = T case, rank and
// size mismatches, unknown symbols) and record()'s FLOP sums. A transformer's own chain is tested
// in test_forward_chain.cpp, the printed table in tools/test_chain_table.cpp.
#include "dissect/accounting/shape_chain.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "dissect/tensor/tensor.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_shape_chain {

/// what() of the ShapeError `action` throws, so a whole message can be compared at once.
template <class Action>
std::string shape_error_of(Action&& action) {
  try {
    action();
  } catch (const ShapeError& error) {
    return error.what();
  }
  return "(no ShapeError thrown)";
}

/// The lesson's toy: B = 2, T = 5, D = 8, H = 2, d_k = 4, V = 100 (note B = H).
DimensionTable lesson_dims() {
  return {{"B", 2}, {"T", 5}, {"D", 8}, {"H", 2}, {"d_k", 4}, {"V", 100}};
}

/// The toy with B = 3, so every size in [B, H, T, d_k] is distinct: [3, 2, 5, 4].
DimensionTable distinct_dims() {
  return {{"B", 3}, {"T", 5}, {"D", 8}, {"H", 2}, {"d_k", 4}};
}

/// X [B, T, D] holding 0, 1, 2, …, so a reshape keeps recognisable values.
Tensor<float, 3> counting_tensor(index_t b, index_t t, index_t d) {
  Tensor<float, 3> x({b, t, d});
  for (index_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(i);
  return x;
}

// ---- the dimension table ------------------------------------------------------------------------

TEST(DimensionTable, KeepsSymbolsInOrder) {
  const DimensionTable dims = lesson_dims();
  EXPECT_EQ(dims.to_string(), "B=2, T=5, D=8, H=2, d_k=4, V=100");
  EXPECT_EQ(dims.size_of("d_k"), 4);
  EXPECT_TRUE(dims.contains("V"));
  EXPECT_FALSE(dims.contains("F"));
  EXPECT_EQ(dims.symbols_of_size(2), (std::vector<std::string>{"B", "H"}));
  EXPECT_TRUE(dims.symbols_of_size(3).empty());
}

TEST(DimensionTable, NonPositiveSizeIsAShapeError) {
  EXPECT_THROW_WITH((DimensionTable{{"B", 2}, {"T", 0}}), ShapeError,
                    "DimensionTable: size of T must be > 0 (got 0)");
  EXPECT_THROW_WITH(DimensionTable().add("B", -1), ShapeError, "size of B must be > 0 (got -1)");
}

TEST(DimensionTable, MalformedOrRepeatedSymbolIsAShapeError) {
  EXPECT_THROW_WITH(DimensionTable().add("d-k", 4), ShapeError, "\"d-k\" is not a symbol");
  EXPECT_THROW_WITH(DimensionTable().add("2B", 4), ShapeError, "\"2B\" is not a symbol");
  EXPECT_THROW_WITH(DimensionTable().add("", 4), ShapeError, "\"\" is not a symbol");
  DimensionTable dims = lesson_dims();
  EXPECT_THROW_WITH(dims.add("T", 7), ShapeError, "T is listed twice (T=5, then T=7)");
  EXPECT_EQ(dims.size_of("T"), 5);  // unchanged after the throw
  EXPECT_EQ(dims.entries().size(), 6u);
}

TEST(DimensionTable, UnknownSymbolIsAShapeError) {
  EXPECT_THROW_WITH(lesson_dims().size_of("F"), ShapeError,
                    "unknown dimension symbol \"F\" (the table has B=2, T=5, D=8, H=2, d_k=4, "
                    "V=100)");
}

TEST(DimensionTable, ResolveReadsSpacesCommasBracketsAndProducts) {
  const DimensionTable dims = lesson_dims();
  const SymbolicShape spaced = dims.resolve("B H T d_k");
  const SymbolicShape bracketed = dims.resolve("[B, H, T, d_k]");
  EXPECT_EQ(spaced.symbols, (std::vector<std::string>{"B", "H", "T", "d_k"}));
  EXPECT_EQ(spaced.sizes, (std::vector<index_t>{2, 2, 5, 4}));
  EXPECT_EQ(bracketed.symbols, spaced.symbols);
  EXPECT_EQ(bracketed.sizes, spaced.sizes);
  EXPECT_EQ(spaced.symbolic_text(), "[B, H, T, d_k]");
  EXPECT_EQ(spaced.numeric_text(), "[2, 2, 5, 4]");
  // 3·D = 24, H·d_k = 2·4 = 8.
  const SymbolicShape products = dims.resolve("B T 3*D H*d_k");
  EXPECT_EQ(products.symbols, (std::vector<std::string>{"B", "T", "3*D", "H*d_k"}));
  EXPECT_EQ(products.sizes, (std::vector<index_t>{2, 5, 24, 8}));
}

TEST(DimensionTable, ResolveRejectsWhatIsNotAShape) {
  const DimensionTable dims = lesson_dims();
  EXPECT_THROW_WITH(dims.resolve(" [ ] "), ShapeError, "empty symbolic shape");
  EXPECT_THROW_WITH(dims.resolve("B T Q"), ShapeError,
                    "unknown dimension symbol \"Q\" in \"B T Q\"");
  EXPECT_THROW_WITH(dims.resolve("B 0*T"), ShapeError, "factor 0 in \"B 0*T\" must be a positive");
  EXPECT_THROW_WITH(dims.resolve("B T D+1"), ShapeError,
                    "\"D+1\" in \"B T D+1\" is not a dimension");
  EXPECT_THROW_WITH(dims.resolve("B T*"), ShapeError, "\"T*\" in \"B T*\" is not a dimension");
  // 2⁶² · 2 = 2⁶³ leaves int64.
  const DimensionTable huge{{"N", index_t{1} << 62}};
  EXPECT_EQ(huge.resolve("N").sizes.front(), index_t{1} << 62);
  EXPECT_THROW_WITH(huge.resolve("2*N"), ShapeError, "overflows int64");
}

// ---- expect: passes and records -----------------------------------------------------------------

TEST(ShapeChainExpect, PassesAndRecordsTensorsAndShapes) {
  ShapeChain chain(distinct_dims());
  const Tensor<float, 3> x = counting_tensor(3, 5, 8);
  const ChainStep& first = chain.expect("embedding", x, "B T D", "E[ids]");
  EXPECT_EQ(first.stage, "embedding");
  EXPECT_EQ(first.operation, "E[ids]");
  EXPECT_EQ(first.shape.numeric_text(), "[3, 5, 8]");
  // The right head split — reshape, then transpose T and H — passes.
  const Tensor<float, 4> q = x.reshape(Shape<4>{3, 5, 2, 4}).permute({0, 2, 1, 3});
  chain.expect("head split", q, "B H T d_k");
  chain.expect("scores", Shape<4>{3, 2, 5, 5}, "[B, H, T, T]");
  ASSERT_EQ(chain.steps().size(), 3u);
  EXPECT_EQ(chain.steps()[1].shape.symbolic_text(), "[B, H, T, d_k]");
  EXPECT_EQ(chain.steps()[2].shape.numeric_text(), "[3, 2, 5, 5]");
  for (const ChainStep& step : chain.steps()) EXPECT_TRUE(step.blind_spots.empty()) << step.stage;
}

// ---- expect: the swapped-axes diagnosis ---------------------------------------------------------

TEST(ShapeChainExpect, MissingTransposeIsReportedAsSwappedAxes) {
  // The lesson's §8 warning: Q reshaped to [B, T, H, d_k] without the transpose. With every size
  // distinct, exactly one reading fits and the message gives it.
  ShapeChain chain(distinct_dims());
  const Tensor<float, 4> wrong = counting_tensor(3, 5, 8).reshape(Shape<4>{3, 5, 2, 4});
  EXPECT_EQ(shape_error_of([&] { chain.expect("head split", wrong, "B H T d_k"); }),
            "ShapeChain::expect: stage \"head split\": expected [B, H, T, d_k] = [3, 2, 5, 4], "
            "got [B, T, H, d_k] = [3, 5, 2, 4]: H and T are swapped (axes 1 and 2)");
  EXPECT_TRUE(chain.steps().empty());  // a failed check records nothing
}

TEST(ShapeChainExpect, RepeatedSymbolsGiveOneReading) {
  // Scores [B, H, T, T] = [3, 2, 5, 5] arriving as [3, 5, 2, 5]: the two T are interchangeable,
  // so [B, T, H, T] is one reading, not two.
  ShapeChain chain(distinct_dims());
  EXPECT_EQ(shape_error_of([&] {
              chain.expect("scores", Shape<4>{3, 5, 2, 5}, "B H T T");
            }),
            "ShapeChain::expect: stage \"scores\": expected [B, H, T, T] = [3, 2, 5, 5], "
            "got [B, T, H, T] = [3, 5, 2, 5]: H and T are swapped (axes 1 and 2)");
}

TEST(ShapeChainExpect, ACycleOfAxesIsReportedAsReordered) {
  ShapeChain chain(distinct_dims());
  EXPECT_THROW_WITH(chain.expect("head split", Shape<4>{3, 4, 2, 5}, "B H T d_k"), ShapeError,
                    "got [B, d_k, H, T] = [3, 4, 2, 5]: H, T, d_k are reordered (axes 1, 2, 3)");
}

TEST(ShapeChainExpect, CoincidingSizesListEveryReadingInsteadOfGuessing) {
  // In the lesson's own toy B = H = 2, so [B, T, H, d_k] = [2, 5, 2, 4] is also [H, T, B, d_k]:
  // the message lists both and says why it cannot choose.
  ShapeChain chain(lesson_dims());
  const Tensor<float, 4> wrong = counting_tensor(2, 5, 8).reshape(Shape<4>{2, 5, 2, 4});
  EXPECT_EQ(shape_error_of([&] { chain.expect("head split", wrong, "B H T d_k"); }),
            "ShapeChain::expect: stage \"head split\": expected [B, H, T, d_k] = [2, 2, 5, 4], "
            "got [2, 5, 2, 4], the expected sizes in another order; since B = H = 2, 2 readings "
            "fit and sizes cannot tell which: [B, T, H, d_k] (H and T swapped) or "
            "[H, T, B, d_k] (B, H, T reordered)");
}

TEST(ShapeChainExpect, ManyReadingsAreCountedAndTheListIsCut) {
  // Five axes of size 2 and one of 3, with the 3 moved to the front: any order of a…e fits the
  // last five axes, 5! = 120 readings, more than the 64 the search stops at. Six are shown,
  // fewest axes moved first: f back in place of a is a plain swap.
  ShapeChain chain({{"a", 2}, {"b", 2}, {"c", 2}, {"d", 2}, {"e", 2}, {"f", 3}});
  const std::string message = shape_error_of([&] {
    chain.expect("many", Shape<6>{3, 2, 2, 2, 2, 2}, "a b c d e f");
  });
  EXPECT_NE(message.find("since a = b = c = d = e = 2, at least 64 readings fit and sizes cannot "
                         "tell which: [f, b, c, d, e, a] (a and f swapped) or [f, a, c, d, e, b] "
                         "(a, b, f reordered) or "),
            std::string::npos)
      << message;
  EXPECT_EQ(message.substr(message.size() - 8), " or more") << message;
  EXPECT_EQ(std::count(message.begin(), message.end(), '('), 6) << message;
}

TEST(ShapeChainExpect, EqualSizesMakeTheCheckBlindAndTheStepSaysSo) {
  // H = T = 3: [B, H, T, d_k] and [B, T, H, d_k] are both [2, 3, 3, 4]. The missing transpose
  // passes — nothing about sizes can catch it — but the step and the table name the blind spot.
  const DimensionTable dims{{"B", 2}, {"T", 3}, {"D", 12}, {"H", 3}, {"d_k", 4}};
  ShapeChain chain(dims);
  const Tensor<float, 4> wrong = counting_tensor(2, 3, 12).reshape(Shape<4>{2, 3, 3, 4});
  const ChainStep& step = chain.expect("head split", wrong, "B H T d_k");
  ASSERT_EQ(step.blind_spots.size(), 1u);
  EXPECT_EQ(step.blind_spots[0].size, 3);
  EXPECT_EQ(step.blind_spots[0].symbols, (std::vector<std::string>{"H", "T"}));
  EXPECT_EQ(step.blind_spots[0].describe(), "H = T = 3");

  const std::vector<AmbiguousAxes> direct = ambiguous_axes(dims, "B H T d_k");
  ASSERT_EQ(direct.size(), 1u);
  EXPECT_EQ(direct[0].describe(), "H = T = 3");
  // The same symbol twice is not ambiguous; [B, T, D] has no equal sizes at all.
  EXPECT_TRUE(ambiguous_axes(dims, "B T T").empty());
  EXPECT_TRUE(ambiguous_axes(dims, "B T D").empty());
  // How a table prints this blind spot: tools/test_chain_table.cpp.
}

TEST(ShapeChainExpect, SeveralCoincidencesAreEachReported) {
  // B = H = 2 and T = d_k = 4: two separate groups, in the order their axes appear.
  const DimensionTable dims{{"B", 2}, {"H", 2}, {"T", 4}, {"d_k", 4}};
  const std::vector<AmbiguousAxes> groups = ambiguous_axes(dims, "B H T d_k");
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].describe(), "B = H = 2");
  EXPECT_EQ(groups[1].describe(), "T = d_k = 4");
}

// ---- expect: other mismatches -------------------------------------------------------------------

TEST(ShapeChainExpect, RankMismatchPrintsBothShapes) {
  ShapeChain chain(distinct_dims());
  // Forgot the head split entirely: [B, T, D] = [3, 5, 8] holds the same 120 values.
  EXPECT_EQ(
      shape_error_of([&] { chain.expect("head split", counting_tensor(3, 5, 8), "B H T d_k"); }),
      "ShapeChain::expect: stage \"head split\": expected rank 4 [B, H, T, d_k] = "
      "[3, 2, 5, 4], got rank 3 [3, 5, 8] (both hold 120 elements: the same data, split "
      "into different axes)");
  // A different element count gets no such remark.
  const std::string other = shape_error_of([&] { chain.expect("x", Shape<2>{3, 5}, "B T D"); });
  EXPECT_NE(other.find("expected rank 3 [B, T, D] = [3, 5, 8], got rank 2 [3, 5]"),
            std::string::npos)
      << other;
  EXPECT_EQ(other.find("elements"), std::string::npos) << other;
}

TEST(ShapeChainExpect, WrongSizeNamesTheAxisAndWhatTheSizeCouldBe) {
  ShapeChain chain(lesson_dims());
  // d_k = 4 in place of D = 8: the table knows 4 only as d_k.
  EXPECT_EQ(shape_error_of([&] {
              chain.expect("QKV projection", Shape<3>{2, 5, 4}, "B T D");
            }),
            "ShapeChain::expect: stage \"QKV projection\": expected [B, T, D] = [2, 5, 8], "
            "got [2, 5, 4]: axis 2 is 4, not D = 8 (4 is d_k)");
  // 2 could be B or H: both are listed; 7 is nothing in the table.
  EXPECT_EQ(shape_error_of([&] {
              chain.expect("x", Shape<3>{7, 5, 2}, "B T D");
            }),
            "ShapeChain::expect: stage \"x\": expected [B, T, D] = [2, 5, 8], got [7, 5, 2]: "
            "axis 0 is 7, not B = 2; axis 2 is 2, not D = 8 (2 is B or H)");
}

TEST(ShapeChainExpect, UnknownSymbolNamesTheStageAndLeavesTheChainUnchanged) {
  ShapeChain chain(lesson_dims());
  chain.expect("embedding", Shape<3>{2, 5, 8}, "B T D");
  EXPECT_THROW_WITH(
      chain.expect("FFN", Shape<3>{2, 5, 32}, "B T F"), ShapeError,
      "ShapeChain::expect: stage \"FFN\": unknown dimension symbol \"F\" in \"B T F\"");
  EXPECT_THROW_WITH(chain.record("FFN", "B T F"), ShapeError,
                    "ShapeChain::record: stage \"FFN\": unknown dimension symbol \"F\"");
  EXPECT_EQ(chain.steps().size(), 1u);
}

// ---- record and the FLOP sums -------------------------------------------------------------------

TEST(ShapeChainRecord, PerLayerStepsCountLTimes) {
  ShapeChain chain({{"B", 1}, {"T", 4}, {"D", 8}, {"L", 3}});
  chain.record("projection", "B T D", "X·W", {2 * 4 * 8 * 8, true, StepKind::linear});
  chain.record("head", "B T D", "X·W", {100, false, StepKind::linear});
  chain.record("mix", "B T T", "", {32, true, StepKind::attention});
  chain.record("extra", "B T", "", {5, false, StepKind::other});
  EXPECT_EQ(chain.steps()[0].total_flops, 512 * 3);
  EXPECT_EQ(chain.steps()[1].total_flops, 100);
  EXPECT_EQ(chain.flops_of(StepKind::linear), 512 * 3 + 100);
  EXPECT_EQ(chain.flops_of(StepKind::attention), 32 * 3);
  EXPECT_EQ(chain.flops_of(StepKind::other), 5);
  EXPECT_EQ(chain.total_flops(), 1536 + 100 + 96 + 5);
  // The printed totals line: tools/test_chain_table.cpp.
}

TEST(ShapeChainRecord, BadCostsAreErrorsAndRecordNothing) {
  ShapeChain chain({{"B", 1}, {"T", 4}});
  EXPECT_THROW_WITH(chain.record("x", "B T", "", {10, true}), ShapeError,
                    "ShapeChain::record: stage \"x\": a per-layer step needs L in the table "
                    "(B=1, T=4)");
  EXPECT_THROW_WITH(chain.record("x", "B T", "", {-1}), Error, "FLOPs must be >= 0 (got -1)");
  const index_t big = std::numeric_limits<index_t>::max() - 10;
  chain.record("big", "B T", "", {big});
  EXPECT_THROW_WITH(chain.record("more", "B T", "", {11}), ShapeError,
                    "stage \"more\": total FLOPs: overflows int64");
  ASSERT_EQ(chain.steps().size(), 1u);
  EXPECT_EQ(chain.total_flops(), big);

  ShapeChain layered({{"T", 4}, {"L", 4}});
  EXPECT_THROW_WITH(layered.record("x", "T", "", {index_t{1} << 62, true}), ShapeError,
                    "overflows int64");
  EXPECT_TRUE(layered.steps().empty());
}

}  // namespace test_shape_chain
}  // namespace dissect
