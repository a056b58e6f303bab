// Tests for dissect/accounting/count.hpp: the lesson's 12·D²·L estimate and its exercise, the exact
// counts published for GPT-2 and LLaMA, each style choice's contribution, the count as the sum over
// weight_matrices, and overflow (reliability.md row 16) as an error rather than a wrapped number
// — while an estimate beyond int64 never blocks an exact count that fits.
#include "dissect/accounting/count.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>

#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_count {

// ---- the estimate -------------------------------------------------------------------------------

TEST(ApproxParameters, LessonsGpt2SmallEstimate) {
  // 12 · 768² · 12 = 12 · 589,824 · 12 = 84,934,656 ≈ 8.49e7 (lesson 0.1 §4.3)
  EXPECT_EQ(approx_parameters(768, 12), 84'934'656);
  EXPECT_EQ(approx_parameters(find_preset("gpt2-small").config), 84'934'656);
  // + the embedding 50257 · 768 = 38,597,376 ≈ 3.86e7 → 123,532,032 ≈ 1.24e8, "the public 124M".
  const index_t embedding = count_parameters(find_preset("gpt2-small").config).token_embedding;
  EXPECT_EQ(embedding, 38'597'376);
  EXPECT_EQ(approx_parameters(768, 12) + embedding, 123'532'032);
}

TEST(ApproxParameters, LessonsExercise) {
  // D = 512, L = 6: 12 · 262,144 · 6 = 18,874,368; V · D = 32000 · 512 = 16,384,000;
  // together 35,258,368 (the lesson's answer, "about 35.26 million").
  EXPECT_EQ(approx_parameters(512, 6), 18'874'368);
  const ParameterCount toy = count_parameters(find_preset("toy").config);
  ASSERT_TRUE(toy.approx_12d2l);
  EXPECT_EQ(*toy.approx_12d2l, 18'874'368);
  EXPECT_EQ(toy.token_embedding, 16'384'000);
  EXPECT_EQ(*toy.approx_12d2l + toy.token_embedding, 35'258'368);
  // The toy has no biases, rotary positions and a tied head, so all the estimate misses are the
  // RMSNorm weights: (2 · 6 + 1) · 512 = 6,656 → 35,265,024.
  EXPECT_EQ(toy.total, 35'258'368 + 6'656);
}

TEST(ApproxParameters, ExceedsUint32ForA7bShape) {
  // 12 · 4096² · 32 = 6,442,450,944 > UINT32_MAX = 4,294,967,295 (reliability.md).
  EXPECT_EQ(approx_parameters(4096, 32), 6'442'450'944);
  EXPECT_GT(approx_parameters(4096, 32), index_t{std::numeric_limits<std::uint32_t>::max()});
}

TEST(ApproxParameters, OverflowIsAnOverflowError) {
  // D = 2²¹, L = 2²⁰: 12 · 2⁴² · 2²⁰ = 12 · 2⁶² > 2⁶³.
  EXPECT_THROW_WITH(approx_parameters(index_t{1} << 21, index_t{1} << 20), OverflowError,
                    "overflows int64");
  // The boundary: 12 · (2²⁸)² · 10 = 120 · 2⁵⁶ = 8,646,911,284,551,352,320 < 2⁶³ = 128 · 2⁵⁶,
  // while L = 11 gives 132 · 2⁵⁶ > 2⁶³.
  EXPECT_EQ(approx_parameters(index_t{1} << 28, 10), 8'646'911'284'551'352'320);
  EXPECT_THROW_WITH(approx_parameters(index_t{1} << 28, 11), OverflowError, "overflows int64");
}

TEST(ApproxParameters, NonPositiveSizesAreConfigErrors) {
  EXPECT_THROW_WITH(approx_parameters(0, 12), ConfigError, "d_model must be > 0");
  EXPECT_THROW_WITH(approx_parameters(768, -1), ConfigError, "n_layers must be > 0");
}

// ---- published counts ---------------------------------------------------------------------------

TEST(CountParameters, Gpt2SmallExactly) {
  const ParameterCount c = count_parameters(find_preset("gpt2-small").config);
  EXPECT_EQ(c.token_embedding, 38'597'376);  // 50257 · 768
  EXPECT_EQ(c.position_embedding, 786'432);  // 1024 · 768
  // c_attn 768·2304 + 2304, c_proj 768·768 + 768 = 4·768² + 4·768
  EXPECT_EQ(c.per_layer.attention, 2'362'368);
  // c_fc 768·3072 + 3072, c_proj 3072·768 + 768
  EXPECT_EQ(c.per_layer.ffn, 4'722'432);
  EXPECT_EQ(c.per_layer.norms, 3'072);  // ln_1, ln_2: weight + bias, 4 · 768
  EXPECT_EQ(c.per_layer.total, 7'087'872);
  EXPECT_EQ(c.layers, 85'054'464);  // 12 · 7,087,872
  EXPECT_EQ(c.final_norm, 1'536);   // ln_f
  EXPECT_EQ(c.output_head, 0);      // tied to wte
  EXPECT_EQ(c.total, 124'439'808);  // sum(p.numel()) of HF GPT2LMHeadModel
  EXPECT_EQ(c.approx_12d2l, 84'934'656);
  ASSERT_TRUE(c.coverage);
  EXPECT_NEAR(*c.coverage, 0.682536, 1e-6);  // 84,934,656 / 124,439,808
}

TEST(CountParameters, Gpt2MediumExactly) {
  // 50257·1024 + 1024·1024 + 24 · (12·1024² + 13·1024) + 2·1024 = 354,823,168
  EXPECT_EQ(count_parameters(find_preset("gpt2-medium").config).total, 354'823'168);
}

TEST(CountParameters, Llama7bExactly) {
  const ParameterCount c = count_parameters(find_preset("llama-7b").config);
  EXPECT_EQ(c.token_embedding, 131'072'000);     // 32000 · 4096
  EXPECT_EQ(c.position_embedding, 0);            // rotary
  EXPECT_EQ(c.per_layer.attention, 67'108'864);  // 4 · 4096², no biases
  EXPECT_EQ(c.per_layer.ffn, 135'266'304);       // 3 · 4096 · 11008 (gate, up, down)
  EXPECT_EQ(c.per_layer.norms, 8'192);           // 2 RMSNorm weights
  EXPECT_EQ(c.final_norm, 4'096);
  EXPECT_EQ(c.output_head, 131'072'000);  // untied
  EXPECT_EQ(c.total, 6'738'415'616);      // the published "6.7B"
  ASSERT_TRUE(c.coverage);
  EXPECT_NEAR(*c.coverage, 0.956078, 1e-6);  // 6,442,450,944 / 6,738,415,616
}

TEST(CountParameters, Llama2_70bExactly) {
  const ParameterCount c = count_parameters(find_preset("llama-2-70b").config);
  // Q and O 8192², K and V 8192 · (8 · 128) each: 2 · 67,108,864 + 2 · 8,388,608
  EXPECT_EQ(c.per_layer.attention, 150'994'944);
  EXPECT_EQ(c.per_layer.ffn, 704'643'072);  // 3 · 8192 · 28672
  EXPECT_EQ(c.total, 68'976'648'192);
}

TEST(CountParameters, ExplicitHeadDimLikeGemma7b) {
  // HF google/gemma-7b config.json: hidden_size 3072, 28 layers, 16 heads of head_dim 256
  // (H·d_k = 4096 ≠ D), intermediate_size 24576 (gated), vocab 256000, tied, RMSNorm, no bias.
  TransformerConfig gemma = find_preset("llama-7b").config;
  gemma.d_model = 3072;
  gemma.n_layers = 28;
  gemma.n_heads = 16;
  gemma.head_dim = 256;
  gemma.d_ff = 24576;
  gemma.vocab = 256000;
  gemma.tied_embeddings = true;
  const ParameterCount c = count_parameters(gemma);
  EXPECT_EQ(c.per_layer.attention, 50'331'648);  // 4 · 3072 · 4096
  EXPECT_EQ(c.total, 8'537'680'896);             // Gemma's published "8.54B"
}

// ---- each choice, against an independent closed form --------------------------------------------

TEST(CountParameters, Gpt2StyleMatchesItsClosedForm) {
  // GPT-2 style, F = 4D: V·D + T·D + L·(12D² + 13D) + 2D, where 13D = 4D (attention biases)
  // + 5D (FFN biases 4D + D) + 4D (two LayerNorms).
  for (index_t D : {8, 64, 768, 1600}) {
    for (index_t L : {1, 3, 48}) {
      TransformerConfig c = find_preset("gpt2-small").config;
      c.d_model = D;
      c.n_layers = L;
      c.n_heads = 8;
      c.d_ff = 4 * D;
      const index_t expected = c.vocab * D + c.context * D + L * (12 * D * D + 13 * D) + 2 * D;
      EXPECT_EQ(count_parameters(c).total, expected) << "D = " << D << ", L = " << L;
    }
  }
}

TEST(CountParameters, EachStyleChoiceChangesTheCountByItsTensors) {
  const TransformerConfig base = find_preset("gpt2-small").config;
  const index_t D = 768, F = 3072, V = 50257, T = 1024, L = 12;
  const index_t total = count_parameters(base).total;

  TransformerConfig untied = base;
  untied.tied_embeddings = false;
  EXPECT_EQ(count_parameters(untied).total - total, V * D);  // a separate [V, D] head
  EXPECT_EQ(count_parameters(untied).output_head, V * D);

  TransformerConfig rotary = base;
  rotary.positions = Positions::rotary;
  EXPECT_EQ(total - count_parameters(rotary).total, T * D);  // no position table

  TransformerConfig rms = base;
  rms.norm = Norm::rms_norm;
  EXPECT_EQ(total - count_parameters(rms).total, (2 * L + 1) * D);  // the LayerNorm biases

  TransformerConfig no_bias = base;
  no_bias.bias = false;
  // attention 3D (qkv) + D (proj), FFN F + D, per layer
  EXPECT_EQ(total - count_parameters(no_bias).total, L * (4 * D + F + D));

  TransformerConfig gated = base;
  gated.ffn = Ffn::gated;
  EXPECT_EQ(count_parameters(gated).total - total, L * (D * F + F));  // the gate and its bias
}

TEST(CountParameters, GroupedQueryAttentionShrinksKAndV) {
  TransformerConfig mha = find_preset("llama-7b").config;
  TransformerConfig gqa = mha;
  gqa.n_kv_heads = 8;  // K and V: 4096 → 8 · 128 = 1024 columns each
  const index_t saved =
      count_parameters(mha).per_layer.attention - count_parameters(gqa).per_layer.attention;
  EXPECT_EQ(saved, 2 * 4096 * (4096 - 1024));
}

// ---- bad input ----------------------------------------------------------------------------------

TEST(CountParameters, InvalidConfigIsAConfigErrorNamingTheField) {
  TransformerConfig c = find_preset("gpt2-small").config;
  c.n_heads = 7;  // 768 % 7 = 5
  EXPECT_THROW_WITH(count_parameters(c), ConfigError, "d_model 768 is not divisible by n_heads 7");
  c = find_preset("gpt2-small").config;
  c.vocab = 0;
  EXPECT_THROW_WITH(count_parameters(c), ConfigError, "vocab must be > 0");
}

TEST(CountParameters, OverflowIsAnOverflowErrorNeverAWrappedNumber) {
  // reliability.md row 16: D = 2²¹, L = 2²⁰. One layer alone is fine (12 · 2⁴² ≈ 5.3e13); the
  // product with L is not.
  TransformerConfig c = find_preset("llama-7b").config;
  c.d_model = index_t{1} << 21;
  c.n_heads = 16;
  c.d_ff = index_t{1} << 21;
  c.n_layers = index_t{1} << 20;
  EXPECT_THROW_WITH(count_parameters(c), OverflowError, "count_parameters layers: overflows int64");
  // Overflow inside one layer: D = F = 2³² makes D·F = 2⁶⁴.
  c.n_layers = 1;
  c.d_model = index_t{1} << 32;
  c.d_ff = index_t{1} << 32;
  EXPECT_THROW_WITH(count_parameters(c), OverflowError, "overflows int64");
  // A vocabulary whose embedding alone overflows.
  c = find_preset("gpt2-small").config;
  c.vocab = std::numeric_limits<index_t>::max() / 2;
  EXPECT_THROW_WITH(count_parameters(c), OverflowError,
                    "WeightMatrix embed.tokens [4611686018427387903, 768]: weight count overflows "
                    "int64");
}

TEST(CountParameters, AnEstimateBeyondInt64DoesNotBlockTheExactCount) {
  // D = 2³⁰, L = 1: 12·D²·L = 12·2⁶⁰ > 2⁶³. With one head of width 1, F = 1, V = 1, rotary
  // positions, no biases and RMSNorm, the model itself is small: embedding 1, QKV 3 and W_O 1,
  // FFN 2, norms 2 + 1, each × 2³⁰ — 10·2³⁰ = 10,737,418,240 parameters.
  const TransformerConfig c{.d_model = index_t{1} << 30,
                            .n_layers = 1,
                            .n_heads = 1,
                            .head_dim = 1,
                            .d_ff = 1,
                            .vocab = 1,
                            .context = 1,
                            .positions = Positions::rotary,
                            .norm = Norm::rms_norm,
                            .bias = false};
  EXPECT_THROW_WITH(approx_parameters(c), OverflowError, "approx_parameters 12*D^2*L");
  EXPECT_EQ(try_approx_parameters(c.d_model, c.n_layers), std::nullopt);
  const ParameterCount count = count_parameters(c);
  EXPECT_EQ(count.total, 10 * (index_t{1} << 30));
  EXPECT_FALSE(count.approx_12d2l);
  EXPECT_FALSE(count.coverage);
  EXPECT_EQ(try_approx_parameters(768, 12), 84'934'656);
  EXPECT_THROW_WITH(try_approx_parameters(0, 12), ConfigError, "d_model must be > 0");
}

// Mixtral-8x7B's published sizes (Jiang et al. 2024, "Mixtral of Experts": 47 B parameters,
// 13 B active; the model card: 46.7 B): 8 experts of 3·4096·14336 weights in each of 32 layers.
TEST(CountParameters, MixtralHasItsPublishedTotalAndActiveParameters) {
  const ParameterCount count = count_parameters(find_preset("mixtral-8x7b").config);
  EXPECT_EQ(count.total, 46'702'792'704);
  EXPECT_EQ(count.experts, index_t{8} * 3 * 4096 * 14336 * 32);
  EXPECT_EQ(count.active, count.total - count.experts / 8 * 6);
  EXPECT_EQ(count.active, 12'879'925'248);
  // The router, [E, D] without bias, belongs to the FFN and is always active.
  EXPECT_EQ(count.per_layer.ffn, count.experts / 32 + 8 * 4096);
  // A dense model uses every parameter.
  const ParameterCount dense = count_parameters(find_preset("llama-7b").config);
  EXPECT_EQ(dense.active, dense.total);
  EXPECT_EQ(dense.experts, 0);
}

TEST(CountParameters, IsTheSumOverWeightMatricesPlusNorms) {
  // count_parameters reads weight_matrices: its matrix parameters are theirs, one copy per layer
  // for the per-layer ones, and what is left is the norms.
  for (const Preset& preset : presets()) {
    SCOPED_TRACE(std::string(preset.name));
    const TransformerConfig& c = preset.config;
    const ParameterCount count = count_parameters(c);
    index_t matrices = 0;
    for (const WeightMatrix& m : weight_matrices(c)) {
      matrices += m.all_parameters() * (m.per_layer ? c.n_layers : 1);
    }
    const index_t norms = count.per_layer.norms * c.n_layers + count.final_norm;
    EXPECT_EQ(count.total, matrices + norms);
  }
}

}  // namespace test_count
}  // namespace dissect
