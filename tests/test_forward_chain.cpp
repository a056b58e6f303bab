// Tests for dissect/accounting/forward_chain.hpp: the stages and shapes of a transformer's forward
// pass, the FLOPs identity of its linear steps against count_parameters (2 · W · B·T, W counted
// apart from model_shape.hpp), the attention steps, and the promise that the chain's total is the
// prefill FLOPs of forward_flops and of the budget, for every preset. The printed table is tested
// in tools/test_chain_table.cpp.
#include "dissect/accounting/forward_chain.hpp"

#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "dissect/accounting/budget.hpp"
#include "dissect/accounting/count.hpp"
#include "dissect/accounting/model_shape.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_forward_chain {

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

// ---- one definition of prefill FLOPs ------------------------------------------------------------

TEST(ForwardShapeChain, TotalIsForwardFlopsAndTheBudgetsPrefillForEveryPreset) {
  // The prefill FLOPs of T tokens are the forward pass's, B = 1: the chain, forward_flops and
  // compute_budget must give the same int64, part by part. The totals by hand (W from
  // forward_shape, T each preset's context):
  //   gpt2-small   T 1024: 2·1024·123,532,032 + 2·12·(2·12·1024²·64)       = 291,648,307,200
  //   gpt2-medium  T 1024: 2·1024·353,453,056 + 2·24·(2·16·1024²·64)       = 826,951,073,792
  //   llama-7b     T 2048: 2·2048·6,607,077,376 + 2·32·(2·32·2048²·128)    = 29,261,612,187,648
  //   llama-2-70b  T 4096: 2·4096·68,713,185,280 + 2·80·(2·64·4096²·128)   = 606,878,878,924,800
  //   toy          T 1024: 2·1024·35,258,368 + 2·6·(2·8·1024²·64)          = 85,094,039,552
  //   mixtral-8x7b T 32768: 2·32768·12,748,587,008 + 2·32·(2·32·32768²·128)
  //                                                                 = 1,398,441,351,577,600
  //     (W: per layer attention 41,943,040 + router 32,768 + 2 of 8 experts 352,321,536, × 32,
  //     plus the head 131,072,000)
  // tests/tools/CMakeLists.txt checks that `budget --preset <name> --json` prints these numbers.
  const std::vector<std::pair<std::string, index_t>> expected = {
      {"gpt2-small", 291'648'307'200},  {"gpt2-medium", 826'951'073'792},
      {"llama-7b", 29'261'612'187'648}, {"llama-2-70b", 606'878'878'924'800},
      {"toy", 85'094'039'552},          {"mixtral-8x7b", 1'398'441'351'577'600}};
  ASSERT_EQ(expected.size(), presets().size());
  for (const auto& [name, total] : expected) {
    SCOPED_TRACE(name);
    const TransformerConfig& config = find_preset(name).config;
    const index_t T = config.context;
    const ShapeChain chain = forward_shape_chain(config, 1, T);
    const ForwardFlops flops = forward_flops(config, 1, T);
    BudgetInputs inputs;
    inputs.context = T;
    const Budget budget = compute_budget(config, inputs);
    EXPECT_EQ(chain.total_flops(), total);
    EXPECT_EQ(flops.total, total);
    EXPECT_EQ(budget.prefill_flops, total);
    EXPECT_EQ(chain.flops_of(StepKind::linear), flops.linear);
    EXPECT_EQ(budget.prefill_linear_flops, flops.linear);
    EXPECT_EQ(chain.flops_of(StepKind::attention), flops.attention);
    EXPECT_EQ(budget.prefill_attention_flops, flops.attention);
    EXPECT_TRUE(budget.linear_weights_exact);
    EXPECT_EQ(budget.linear_weights, forward_shape(config).linear_weights);
  }
}

}  // namespace test_forward_chain
}  // namespace dissect
