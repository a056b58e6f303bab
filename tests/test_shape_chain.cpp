// Tests for dissect/shape_chain.hpp: the dimension table and symbolic shapes, expect()'s
// diagnoses (swapped axes, several readings when sizes coincide, the blind H = T case, rank and
// size mismatches, unknown symbols), the FLOPs identity of forward_shape_chain against
// count_parameters for GPT-2 small, LLaMA-7B and a GQA model, and the printed table.
#include "dissect/shape_chain.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "dissect/count.hpp"
#include "dissect/tensor.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace {

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

  const std::string table = chain.table();
  EXPECT_NE(table.find("blind spots (equal sizes: a check cannot see these axes swapped):\n"
                       "  head split [B, H, T, d_k]: H = T = 3\n"),
            std::string::npos)
      << table;
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
  EXPECT_NE(chain.table().find("total: 1,737 FLOPs = linear steps 1,636 + attention products 96 "
                               "+ other 5\n"),
            std::string::npos)
      << chain.table();
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

// ---- forward_shape_chain ------------------------------------------------------------------------

TEST(ForwardShapeChain, Gpt2SmallFollowsTheLessonsTable) {
  const ShapeChain chain = forward_shape_chain(find_preset("gpt2-small").config, 1, 1024);
  const std::vector<std::pair<std::string, std::string>> expected = {
      {"token ids", "[1, 1024]"},
      {"embedding", "[1, 1024, 768]"},
      {"QKV projection", "[1, 1024, 768]"},
      {"head split", "[1, 12, 1024, 64]"},
      {"scores", "[1, 12, 1024, 1024]"},
      {"softmax", "[1, 12, 1024, 1024]"},
      {"weighted sum", "[1, 12, 1024, 64]"},
      {"head merge + W_O", "[1, 1024, 768]"},
      {"FFN", "[1, 1024, 768]"},
      {"logits", "[1, 1024, 50257]"},
      {"sampling", "[1, 1024]"},
  };
  ASSERT_EQ(chain.steps().size(), expected.size());
  for (std::size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(chain.steps()[i].stage, expected[i].first);
    EXPECT_EQ(chain.steps()[i].shape.numeric_text(), expected[i].second) << expected[i].first;
  }
  // One layer's QKV product: 2 · (B·T = 1024) · 768 · 2304 = 3,623,878,656; the head's:
  // 2 · 1024 · 768 · 50257 = 79,047,426,048, once.
  EXPECT_EQ(chain.steps()[2].cost.flops, 3'623'878'656);
  EXPECT_TRUE(chain.steps()[2].cost.per_layer);
  EXPECT_EQ(chain.steps()[2].total_flops, 3'623'878'656 * 12);
  EXPECT_EQ(chain.steps()[9].total_flops, 79'047'426'048);
  EXPECT_FALSE(chain.steps()[9].cost.per_layer);
  for (const ChainStep& step : chain.steps()) EXPECT_TRUE(step.blind_spots.empty()) << step.stage;
}

/// The weights of the linear layers of `config`, from count_parameters:
///   W = (non-embedding parameters) − biases − norm weights + (V·D if the head is tied),
/// where non-embedding = total − token embedding − position embedding. The biases and norms are
/// counted here from the config, independently of shape_chain.hpp.
index_t linear_weights_from_count(const TransformerConfig& c) {
  const ParameterCount count = count_parameters(c);
  const index_t non_embedding = count.total - count.token_embedding - count.position_embedding;
  const index_t d_k = c.head_size();
  // Per layer: Q and O biases H·d_k and D, K and V biases H_kv·d_k each, FFN biases F (F twice
  // for the gated FFN's gate and up) and D.
  const index_t bias_per_layer = c.bias ? c.n_heads * d_k + 2 * c.kv_heads() * d_k + c.d_model +
                                              (c.ffn == Ffn::gated ? 2 : 1) * c.d_ff + c.d_model
                                        : 0;
  const index_t per_norm = (c.norm == Norm::layer_norm ? 2 : 1) * c.d_model;
  const index_t norms = checked_mul(2 * per_norm, c.n_layers, "norms") + per_norm;  // + final
  const index_t biases = checked_mul(bias_per_layer, c.n_layers, "biases");
  const index_t tied_head = c.tied_embeddings ? checked_mul(c.vocab, c.d_model, "head") : 0;
  return non_embedding - biases - norms + tied_head;
}

TEST(ForwardShapeChain, LinearStepFlopsAre2WeightsTokensExactly) {
  // Compared exactly, in int64:
  //   Σ total_flops of the linear steps (QKV, W_O, FFN × L, logits)  ==  2 · W · B·T
  //   Σ total_flops of the attention steps  ==  2 · (2·B·H·T²·d_k) · L
  // with W from linear_weights_from_count (count_parameters, minus biases and norms, plus the
  // tied head). Biases and norms add O(parameters) work per token and are outside the identity.
  struct Case {
    const char* preset;
    index_t linear_weights;  // by hand, below
  };
  // GPT-2 small: 12·D²·L + V·D = 84,934,656 + 38,597,376 = 123,532,032 (no GQA, F = 4D: the
  //   lesson's estimate is exact for the matrices). From the count: non-embedding 85,056,000 −
  //   biases 12·6,912 = 82,944 − norms 12·3,072 + 1,536 = 38,400 + tied head 38,597,376.
  // LLaMA-7B: 32·(4·4096² + 3·4096·11008) + 32000·4096 = 32·202,375,168 + 131,072,000
  //   = 6,607,077,376 = non-embedding 6,607,343,616 − norms (2·32 + 1)·4096 = 266,240.
  // Llama-2-70B (GQA, H_kv = 8, d_k = 128): per layer 8192·(8192 + 2·1024) + 8192² +
  //   3·8192·28672 = 83,886,080 + 67,108,864 + 704,643,072 = 855,638,016; × 80 = 68,451,041,280,
  //   + head 32000·8192 = 262,144,000 → 68,713,185,280.
  for (const Case& c : {Case{"gpt2-small", 123'532'032}, Case{"llama-7b", 6'607'077'376},
                        Case{"llama-2-70b", 68'713'185'280}}) {
    const TransformerConfig& config = find_preset(c.preset).config;
    ASSERT_EQ(linear_weights_from_count(config), c.linear_weights) << c.preset;
    for (const auto& [batch, tokens] : {std::pair<index_t, index_t>{1, 1024}, {3, 7}, {8, 1}}) {
      SCOPED_TRACE(testing::concat_for_trace(c.preset, "B", batch, "T", tokens));
      const ShapeChain chain = forward_shape_chain(config, batch, tokens);
      const index_t n = checked_mul(batch, tokens, "tokens");
      EXPECT_EQ(chain.flops_of(StepKind::linear),
                checked_mul(2, checked_mul(c.linear_weights, n, "W·n"), "2·W·n"));
      const index_t attention = checked_mul(
          checked_mul(checked_mul(2 * batch, config.n_heads, "a"), tokens * tokens, "a"),
          config.head_size(), "a");
      EXPECT_EQ(chain.flops_of(StepKind::attention),
                checked_mul(2 * attention, config.n_layers, "attention"));
      EXPECT_EQ(chain.flops_of(StepKind::other), 0);
      EXPECT_EQ(chain.total_flops(),
                chain.flops_of(StepKind::linear) + chain.flops_of(StepKind::attention));
    }
  }
  // GPT-2 small at B = 1, T = 1024, by hand: linear 2 · 123,532,032 · 1024 = 252,993,601,536;
  // attention 2 · (2 · 12 · 1024² · 64) · 12 = 38,654,705,664.
  const ShapeChain gpt2 = forward_shape_chain(find_preset("gpt2-small").config, 1, 1024);
  EXPECT_EQ(gpt2.flops_of(StepKind::linear), 252'993'601'536);
  EXPECT_EQ(gpt2.flops_of(StepKind::attention), 38'654'705'664);
  EXPECT_EQ(gpt2.total_flops(), 291'648'307'200);
}

TEST(ForwardShapeChain, GroupedQueryAndExplicitHeadDimShowInTheChain) {
  const ShapeChain gqa = forward_shape_chain(find_preset("llama-2-70b").config, 1, 16);
  EXPECT_EQ(gqa.dims().size_of("H_kv"), 8);
  EXPECT_EQ(gqa.steps()[2].operation, "X·W_Q, X·W_K, X·W_V (K, V: H_kv*d_k wide)");
  // 2 · 16 · 8192 · (64 + 2·8) · 128 = 2,684,354,560.
  EXPECT_EQ(gqa.steps()[2].cost.flops, 2'684'354'560);

  // H·d_k = 4·32 = 128 ≠ D = 64 (as in Gemma): Q is [B, T, H*d_k], W_O maps 128 → 64.
  TransformerConfig wide = find_preset("gpt2-small").config;
  wide.d_model = 64;
  wide.n_heads = 4;
  wide.head_dim = 32;
  wide.d_ff = 256;
  const ShapeChain chain = forward_shape_chain(wide, 2, 3);
  EXPECT_EQ(chain.steps()[2].shape.symbolic_text(), "[B, T, H*d_k]");
  EXPECT_EQ(chain.steps()[2].shape.numeric_text(), "[2, 3, 128]");
  EXPECT_EQ(chain.steps()[3].shape.numeric_text(), "[2, 4, 3, 32]");
  // 2 · 6 · 128 · 64 = 98,304.
  EXPECT_EQ(chain.steps()[7].cost.flops, 98'304);
  EXPECT_FALSE(chain.dims().contains("H_kv"));  // only a GQA model has it
}

TEST(ForwardShapeChain, ImpossibleInputsAreConfigErrors) {
  const TransformerConfig gpt2 = find_preset("gpt2-small").config;
  EXPECT_THROW_WITH(forward_shape_chain(gpt2, 0, 8), ConfigError, "batch B must be > 0 (got 0)");
  EXPECT_THROW_WITH(forward_shape_chain(gpt2, 1, -3), ConfigError, "tokens T must be > 0 (got -3)");
  EXPECT_THROW_WITH(forward_shape_chain(gpt2, 1, 1025), ConfigError,
                    "tokens T = 1025 exceed the context 1024 of the learned position table");
  // Rotary positions have no table to run out of.
  EXPECT_NO_THROW(forward_shape_chain(find_preset("llama-7b").config, 1, 4096));
  TransformerConfig odd = gpt2;
  odd.n_heads = 7;
  EXPECT_THROW_WITH(forward_shape_chain(odd, 1, 8), ConfigError, "not divisible by n_heads 7");
  // D = 2²¹, L = 2²⁰: the QKV weights alone, 3·2⁴² · 2²⁰ per forward, leave int64.
  TransformerConfig huge = gpt2;
  huge.d_model = index_t{1} << 21;
  huge.d_ff = index_t{1} << 23;
  huge.n_layers = index_t{1} << 20;
  huge.n_heads = 16;
  EXPECT_THROW_WITH(forward_shape_chain(huge, 1, 8), OverflowError, "overflows int64");
}

TEST(ForwardShapeChain, LessonToyTablePrintsExactly) {
  // The lesson's toy as a GPT-2-style model: B = 2, T = 5, D = 8, H = 2, d_k = 4, V = 100, with
  // F = 4D = 32 and L = 2. Per layer: QKV 2·10·8·24 = 3,840; scores and P·V 2·2·2·5²·4 = 800
  // each; W_O 2·10·8·8 = 1,280; FFN 2·10·8·32·2 = 10,240; head 2·10·8·100 = 16,000.
  // Linear: 2·(3,840 + 1,280 + 10,240) + 16,000 = 46,720 = 2 · 2,336 · 10; attention 4 · 800.
  TransformerConfig toy;
  toy.d_model = 8;
  toy.n_layers = 2;
  toy.n_heads = 2;
  toy.d_ff = 32;
  toy.vocab = 100;
  toy.context = 16;
  const std::string expected =
      "dimensions: B=2, T=5, D=8, H=2, d_k=4, F=32, L=2, V=100\n"
      "step              operation                  symbolic shape  numeric shape   FLOPs\n"
      "----------------  -------------------------  --------------  -------------  ------  --\n"
      "token ids         tokenizer output           [B, T]          [2, 5]              -\n"
      "embedding         E[ids] + P[0:T]            [B, T, D]       [2, 5, 8]           -\n"
      "QKV projection    X·W_Q, X·W_K, X·W_V        [B, T, D]       [2, 5, 8]       3,840  ×L\n"
      "head split        reshape + transpose        [B, H, T, d_k]  [2, 2, 5, 4]        -  ×L\n"
      "scores            Q·Kᵀ / √d_k                [B, H, T, T]    [2, 2, 5, 5]      800  ×L\n"
      "softmax           over the last axis         [B, H, T, T]    [2, 2, 5, 5]        -  ×L\n"
      "weighted sum      P·V                        [B, H, T, d_k]  [2, 2, 5, 4]      800  ×L\n"
      "head merge + W_O  transpose + reshape, ·W_O  [B, T, D]       [2, 5, 8]       1,280  ×L\n"
      "FFN               D → F → D                  [B, T, D]       [2, 5, 8]      10,240  ×L\n"
      "logits            X·Eᵀ (tied head)           [B, T, V]       [2, 5, 100]    16,000\n"
      "sampling          softmax + sample           [B, T]          [2, 5]              -\n"
      "FLOPs: 2·M·N·K per matrix product, one pass of the step; ×L: once in each layer, L = 2;\n"
      "\"-\": lookups and elementwise steps, not counted.\n"
      "total: 49,920 FLOPs = linear steps 46,720 + attention products 3,200\n"
      "blind spots (equal sizes: a check cannot see these axes swapped):\n"
      "  head split [B, H, T, d_k]: B = H = 2\n"
      "  scores [B, H, T, T]: B = H = 2\n"
      "  softmax [B, H, T, T]: B = H = 2\n"
      "  weighted sum [B, H, T, d_k]: B = H = 2\n"
      "linear steps = 2 · 2,336 weights · 10 tokens, the weights being W_Q, W_K, W_V, W_O and\n"
      "  the FFN matrices × L, plus the V·D head (no biases, norms or embeddings)\n"
      "attention products = 2 · 2·B·H·T²·d_k per layer (full T×T: the causal mask is not used)\n";
  const ShapeChain chain = forward_shape_chain(toy, 2, 5);
  EXPECT_EQ(chain.table(), expected);
  std::ostringstream streamed;
  streamed << chain;
  EXPECT_EQ(streamed.str(), expected);
}

}  // namespace
}  // namespace dissect
