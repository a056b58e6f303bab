// Tests for dissect/accounting/model_shape.hpp: the weight matrices of GPT-2 and LLaMA-style
// configs with their shapes, biases and roles, checked against the published module shapes (HF GPT2
// c_attn [768, 2304] stored as Conv1D, i.e. [out 2304, in 768] here; LLaMA q/k/v/o_proj,
// gate/up/down); the FLOPs of a forward pass against independent closed forms; and bad input.
#include "dissect/accounting/model_shape.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_model_shape {

std::vector<std::string> names_of(const std::vector<WeightMatrix>& matrices) {
  std::vector<std::string> names;
  for (const WeightMatrix& m : matrices) names.emplace_back(m.name);
  return names;
}

// ---- the matrices -------------------------------------------------------------------------------

TEST(WeightMatrices, Gpt2SmallShapesRolesAndBiases) {
  const std::vector<WeightMatrix> m = weight_matrices(find_preset("gpt2-small").config);
  EXPECT_EQ(names_of(m), (std::vector<std::string>{"embed.tokens", "embed.positions", "attn.qkv",
                                                   "attn.out", "mlp.up", "mlp.down", "lm_head"}));
  const WeightMatrix& wte = find_matrix(m, "embed.tokens");
  EXPECT_EQ(wte.shape, (Shape<2>{50257, 768}));
  EXPECT_EQ(wte.role, MatrixRole::embedding);
  EXPECT_FALSE(wte.multiplied);  // a lookup
  EXPECT_FALSE(wte.per_layer);
  EXPECT_EQ(find_matrix(m, "embed.positions").shape, (Shape<2>{1024, 768}));
  const WeightMatrix& qkv = find_matrix(m, "attn.qkv");
  EXPECT_EQ(qkv.shape, (Shape<2>{2304, 768}));  // 3 · 768 outputs
  EXPECT_TRUE(qkv.per_layer && qkv.bias && qkv.multiplied);
  EXPECT_EQ(qkv.parameters(), 768 * 2304 + 2304);
  EXPECT_EQ(find_matrix(m, "attn.out").shape, (Shape<2>{768, 768}));
  EXPECT_EQ(find_matrix(m, "mlp.up").shape, (Shape<2>{3072, 768}));
  EXPECT_EQ(find_matrix(m, "mlp.down").shape, (Shape<2>{768, 3072}));
  EXPECT_EQ(find_matrix(m, "mlp.up").role, MatrixRole::ffn);
  const WeightMatrix& head = find_matrix(m, "lm_head");
  EXPECT_EQ(head.shape, (Shape<2>{50257, 768}));
  EXPECT_TRUE(head.tied);  // GPT-2 reuses wte: FLOPs, but no parameters of its own
  EXPECT_TRUE(head.multiplied);
  EXPECT_FALSE(head.bias);
  EXPECT_EQ(head.weights(), 50257 * 768);
  EXPECT_EQ(head.parameters(), 0);
}

TEST(WeightMatrices, LlamaHasAGateNoBiasesNoPositionTableAndAnUntiedHead) {
  const std::vector<WeightMatrix> m = weight_matrices(find_preset("llama-7b").config);
  EXPECT_EQ(names_of(m), (std::vector<std::string>{"embed.tokens", "attn.qkv", "attn.out",
                                                   "mlp.gate", "mlp.up", "mlp.down", "lm_head"}));
  for (const WeightMatrix& matrix : m) EXPECT_FALSE(matrix.bias) << matrix.name;
  EXPECT_EQ(find_matrix(m, "mlp.gate").shape, (Shape<2>{11008, 4096}));
  EXPECT_EQ(find_matrix(m, "lm_head").parameters(), 32000 * 4096);  // untied
}

TEST(WeightMatrices, GroupedQueryAttentionNarrowsKAndVInTheFusedQkv) {
  // Llama-2-70B: Q 64 · 128 = 8192 outputs, K and V 8 · 128 = 1024 each.
  const std::vector<WeightMatrix> m = weight_matrices(find_preset("llama-2-70b").config);
  EXPECT_EQ(find_matrix(m, "attn.qkv").shape, (Shape<2>{8192 + 2 * 1024, 8192}));
  EXPECT_EQ(find_matrix(m, "attn.out").shape, (Shape<2>{8192, 8192}));
}

TEST(WeightMatrices, ExplicitHeadDimMakesTheAttentionWiderThanD) {
  TransformerConfig c = find_preset("gpt2-small").config;
  c.d_model = 64;
  c.n_heads = 4;
  c.head_dim = 32;  // H·d_k = 128 ≠ D
  const std::vector<WeightMatrix> m = weight_matrices(c);
  EXPECT_EQ(find_matrix(m, "attn.qkv").shape, (Shape<2>{384, 64}));
  EXPECT_EQ(find_matrix(m, "attn.out").shape, (Shape<2>{64, 128}));
}

TEST(WeightMatrices, BadInputIsAnError) {
  TransformerConfig c = find_preset("gpt2-small").config;
  c.n_heads = 7;
  EXPECT_THROW_WITH(weight_matrices(c), ConfigError, "d_model 768 is not divisible by n_heads 7");
  c = find_preset("gpt2-small").config;
  c.ffn = static_cast<Ffn>(9);
  EXPECT_THROW_WITH(weight_matrices(c), ConfigError, "TransformerConfig: Ffn(9) is out of range");
  const std::vector<WeightMatrix> m = weight_matrices(find_preset("gpt2-small").config);
  EXPECT_THROW_WITH(find_matrix(m, "mlp.gate"), Error, "find_matrix: no matrix \"mlp.gate\"");
  // A vocabulary whose table alone overflows names the matrix.
  const WeightMatrix huge{.name = "embed.tokens",
                          .shape = {std::numeric_limits<index_t>::max() / 2, 768}};
  EXPECT_THROW_WITH(huge.weights(), OverflowError, "WeightMatrix embed.tokens [");
}

// ---- FLOPs --------------------------------------------------------------------------------------

TEST(ForwardShape, LinearWeightsIncludeTheTiedHeadAndNotTheEmbeddings) {
  // GPT-2 small: 12 · (768·2304 + 768² + 2·768·3072) + 50257·768 = 12 · 7,077,888 + 38,597,376
  //   = 123,532,032 = 12·D²·L + V·D, as the F = 4D MLP makes the classic estimate exact.
  const ForwardShape gpt2 = forward_shape(find_preset("gpt2-small").config);
  EXPECT_EQ(gpt2.linear_weights, 123'532'032);
  EXPECT_EQ(gpt2.n_layers, 12);
  EXPECT_EQ(gpt2.n_heads, 12);
  EXPECT_EQ(gpt2.head_dim, 64);
  // LLaMA-7B: 32 · (4·4096² + 3·4096·11008) + 32000·4096 = 6,607,077,376.
  EXPECT_EQ(forward_shape(find_preset("llama-7b").config).linear_weights, 6'607'077'376);
}

TEST(ForwardFlops, TheDefinitionOnGpt2SmallByHand) {
  // B = 1, T = 1024: linear 2 · 1024 · 123,532,032 = 252,993,601,536; attention two products of
  // 2 · 12 · 1024² · 64 = 1,610,612,736 per layer, × 12 layers = 38,654,705,664.
  EXPECT_EQ(attention_product_flops(1, 12, 1024, 64), 1'610'612'736);
  const ForwardFlops f = forward_flops(find_preset("gpt2-small").config, 1, 1024);
  EXPECT_EQ(f.linear, 252'993'601'536);
  EXPECT_EQ(f.attention, 38'654'705'664);
  EXPECT_EQ(f.total, 291'648'307'200);
}

TEST(ForwardFlops, LinearIsTheSumOfTheProductsOfEveryMultipliedMatrix) {
  for (const Preset& preset : presets()) {
    SCOPED_TRACE(std::string(preset.name));
    const TransformerConfig& c = preset.config;
    for (const auto& [batch, tokens] : {std::pair<index_t, index_t>{1, 1}, {3, 7}, {2, 128}}) {
      index_t linear = 0;
      for (const WeightMatrix& m : weight_matrices(c)) {
        if (m.multiplied)
          linear += product_flops(m, batch * tokens) * m.active * (m.per_layer ? c.n_layers : 1);
      }
      const ForwardFlops f = forward_flops(c, batch, tokens);
      EXPECT_EQ(f.linear, linear);
      EXPECT_EQ(f.attention,
                2 * c.n_layers * 2 * batch * c.n_heads * tokens * tokens * c.head_size());
      EXPECT_EQ(f.total, f.linear + f.attention);
    }
  }
}

TEST(ForwardFlops, ShapesFromACountAlone) {
  // The budget's path for a bare parameter count: W = 7e9, L = 32, H = 32, d_k = 128, T = 2048:
  // 2 · 2048 · 7e9 = 28,672,000,000,000 and 2 · 32 · (2 · 32 · 2048² · 128) = 2,199,023,255,552.
  const ForwardFlops f = forward_flops(ForwardShape{7'000'000'000, 32, 32, 128}, 1, 2048);
  EXPECT_EQ(f.linear, 28'672'000'000'000);
  EXPECT_EQ(f.attention, 2'199'023'255'552);
  EXPECT_EQ(f.total, 30'871'023'255'552);
}

TEST(ForwardFlops, BadInputAndOverflow) {
  const ForwardShape shape{7'000'000'000, 32, 32, 128};
  EXPECT_THROW_WITH(forward_flops(shape, 0, 8), ConfigError, "forward_flops: batch must be > 0");
  EXPECT_THROW_WITH(forward_flops(shape, 1, -1), ConfigError, "forward_flops: tokens must be > 0");
  EXPECT_THROW_WITH(forward_flops(ForwardShape{7, 0, 1, 1}, 1, 1), ConfigError,
                    "forward_flops: n_layers must be > 0");
  // T = 2²⁶: one attention product, 2 · 32 · 2⁵² · 128 = 2⁶⁵.
  EXPECT_THROW_WITH(forward_flops(shape, 1, index_t{1} << 26), OverflowError,
                    "attention_product_flops: overflows int64");
  // 2 · 2⁴⁰ tokens · 7e9 weights leaves int64 in the linear part.
  EXPECT_THROW_WITH(
      forward_flops(ForwardShape{7'000'000'000, 1, 1, 1}, index_t{1} << 20, index_t{1} << 20),
      OverflowError, "forward_flops linear: overflows int64");
}

}  // namespace test_model_shape
}  // namespace dissect
