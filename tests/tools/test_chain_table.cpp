// Tests for tools/common/table.hpp and chain_table.hpp: display widths of the UTF-8 the tables
// carry, column alignment without trailing blanks, and a ShapeChain printed as a table — the
// blind spots, the totals by kind, and the toy model's forward chain, character for character.
#include "tools/common/chain_table.hpp"

#include <gtest/gtest.h>

#include <string>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/forward_chain.hpp"
#include "dissect/accounting/shape_chain.hpp"
#include "support/tensor_testing.hpp"
#include "tools/common/table.hpp"

namespace dissect::tools {
namespace test_chain_table {

TEST(TextTable, WidthsCountCodePointsNotBytes) {
  EXPECT_EQ(display_width("abc"), 3u);
  EXPECT_EQ(display_width("Q·Kᵀ / √d_k"), 11u);  // "·", "ᵀ" and "√" are 2–3 bytes, 1 column
  EXPECT_EQ(display_width("×L"), 2u);
  EXPECT_EQ(pad_right("12·D²·L", 9), "12·D²·L  ");
  EXPECT_EQ(pad_left("1,024", 7), "  1,024");
  EXPECT_EQ(pad_left("toolong", 3), "toolong");  // never cut
}

TEST(TextTable, AlignsColumnsAndDropsTrailingBlanks) {
  TextTable table({false, true});
  table.add_row({"step", "FLOPs", ""});
  table.add_rule();
  table.add_row({"scores", "800", "×L"});
  table.add_row({"QKV projection", "3,840"});
  EXPECT_EQ(table.render(),
            "step            FLOPs\n"
            "--------------  -----  --\n"
            "scores            800  ×L\n"
            "QKV projection  3,840\n");
}

// Huge figures widen their column and never touch the next one: a padded label keeps a blank
// before its value even when the label is as wide as the padding or wider (issue 24).
TEST(TextTable, HugeFiguresKeepColumnsApart) {
  EXPECT_EQ(pad_right("per token at batch 9", 24), "per token at batch 9    ");
  EXPECT_EQ(pad_right("exactly", 7), "exactly ");
  EXPECT_EQ(pad_right("per token at batch 9223372036854775807", 24) + "1.04 ms",
            "per token at batch 9223372036854775807 1.04 ms");
  TextTable table({false, true, false});
  table.add_row({"n", "parameters", "x"});
  table.add_rule();
  table.add_row(
      {"layers 9223372036854775806–9223372036854775807", "9,223,372,036,854,775,807", "y"});
  table.add_row({"a", "1", "z"});
  EXPECT_EQ(table.render(),
            "n                                                              parameters  x\n"
            "----------------------------------------------  -------------------------  -\n"
            "layers 9223372036854775806–9223372036854775807  9,223,372,036,854,775,807  y\n"
            "a                                                                       1  z\n");
}

TEST(ChainTable, BlindSpotsAreListedUnderTheSteps) {
  // H = T = 3: the missing transpose passes the check, and the table says it is blind there.
  ShapeChain chain({{"B", 2}, {"T", 3}, {"D", 12}, {"H", 3}, {"d_k", 4}});
  chain.expect("head split", Shape<4>{2, 3, 3, 4}, "B H T d_k");
  const std::string table = chain_table(chain);
  EXPECT_NE(table.find("blind spots (equal sizes: a check cannot see these axes swapped):\n"
                       "  head split [B, H, T, d_k]: H = T = 3\n"),
            std::string::npos)
      << table;
}

TEST(ChainTable, TotalsAreSplitByKind) {
  // The chain of test_shape_chain.cpp's PerLayerStepsCountLTimes: 512 × 3 + 100 linear,
  // 32 × 3 attention, 5 other.
  ShapeChain chain({{"B", 1}, {"T", 4}, {"D", 8}, {"L", 3}});
  const StepCost costs[] = {{512, true, StepKind::linear},
                            {100, false, StepKind::linear},
                            {32, true, StepKind::attention},
                            {5, false, StepKind::other}};
  for (const StepCost& cost : costs) chain.record("step", "B T D", "", cost);
  EXPECT_NE(chain_table(chain).find("total: 1,737 FLOPs = linear steps 1,636 + attention "
                                    "products 96 + other 5\n"),
            std::string::npos)
      << chain_table(chain);
}

TEST(ChainTable, ToyForwardChainPrintsExactly) {
  // The lesson's toy as a GPT-2-style model: B = 2, T = 5, D = 8, H = 2, d_k = 4, V = 100, with
  // F = 4D = 32 and L = 2. Per layer: QKV 2·10·8·24 = 3,840; scores and P·V 2·2·2·5²·4 = 800
  // each; W_O 2·10·8·8 = 1,280; FFN 2·10·8·32·2 = 10,240; head 2·10·8·100 = 16,000.
  // Linear: 2·(3,840 + 1,280 + 10,240) + 16,000 = 46,720 = 2 · 2,336 · 10; attention 4 · 800.
  const TransformerConfig toy{
      .d_model = 8, .n_layers = 2, .n_heads = 2, .d_ff = 32, .vocab = 100, .context = 16};
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
  EXPECT_EQ(chain_table(forward_shape_chain(toy, 2, 5)), expected);
}

}  // namespace test_chain_table
}  // namespace dissect::tools
