// Tests for dissect/accounting/config.hpp: defaults that derive from other fields, validation
// naming the field (reliability.md row 15), style enums out of range (row 23), and the presets'
// fields against their published configs.
#include "dissect/accounting/config.hpp"

#include <gtest/gtest.h>

#include <cmath>

#include <set>
#include <string>

#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_config {

TransformerConfig small_config() {
  TransformerConfig config;
  config.d_model = 64;
  config.n_layers = 2;
  config.n_heads = 4;
  config.d_ff = 256;
  config.vocab = 100;
  config.context = 32;
  return config;
}

TEST(Config, KvHeadsAndHeadSizeDeriveFromTheOtherFields) {
  TransformerConfig config = small_config();
  EXPECT_EQ(config.kv_heads(), 4);    // unset → H
  EXPECT_EQ(config.head_size(), 16);  // unset → D / H = 64 / 4
  config.n_kv_heads = 2;
  config.head_dim = 32;
  EXPECT_EQ(config.kv_heads(), 2);
  EXPECT_EQ(config.head_size(), 32);
  // The derived d_k follows D and H when they change, as `budget --preset … --d-model` needs.
  config.head_dim.reset();
  config.d_model = 128;
  config.n_heads = 2;
  EXPECT_EQ(config.head_size(), 64);
}

TEST(Config, DefaultStyleIsGpt2s) {
  const TransformerConfig config;
  EXPECT_TRUE(config.tied_embeddings);
  EXPECT_EQ(config.positions, Positions::learned);
  EXPECT_EQ(config.norm, Norm::layer_norm);
  EXPECT_TRUE(config.bias);
  EXPECT_EQ(config.ffn, Ffn::mlp);
}

TEST(Config, ValidConfigsPass) {
  EXPECT_NO_THROW(small_config().validate());
  TransformerConfig gqa = small_config();
  gqa.n_kv_heads = 1;  // multi-query attention: one KV head serves all four
  EXPECT_NO_THROW(gqa.validate());
  // An explicit d_k may make H·d_k ≠ D (Gemma-7B: D = 3072, H = 16, d_k = 256).
  TransformerConfig wide_heads = small_config();
  wide_heads.d_model = 60;
  wide_heads.head_dim = 32;
  EXPECT_NO_THROW(wide_heads.validate());
}

TEST(Config, EverySizeAtOrBelowZeroIsAConfigErrorNamingTheField) {
  struct Case {
    const char* field;
    void (*set)(TransformerConfig&, index_t);
  };
  const Case cases[] = {
      {"d_model", [](TransformerConfig& c, index_t v) { c.d_model = v; }},
      {"n_layers", [](TransformerConfig& c, index_t v) { c.n_layers = v; }},
      {"n_heads", [](TransformerConfig& c, index_t v) { c.n_heads = v; }},
      {"n_kv_heads", [](TransformerConfig& c, index_t v) { c.n_kv_heads = v; }},
      {"head_dim", [](TransformerConfig& c, index_t v) { c.head_dim = v; }},
      {"d_ff", [](TransformerConfig& c, index_t v) { c.d_ff = v; }},
      {"vocab", [](TransformerConfig& c, index_t v) { c.vocab = v; }},
      {"context", [](TransformerConfig& c, index_t v) { c.context = v; }},
  };
  for (const Case& field : cases) {
    for (index_t value : {index_t{0}, index_t{-1}}) {
      SCOPED_TRACE(std::string(field.field) + " = " + std::to_string(value));
      TransformerConfig config = small_config();
      field.set(config, value);
      EXPECT_THROW_WITH(config.validate(), ConfigError,
                        std::string(field.field) + " must be > 0 (got " + std::to_string(value));
    }
  }
}

TEST(Config, DModelNotDivisibleByHeadsIsAConfigError) {
  TransformerConfig config = small_config();
  config.d_model = 66;  // 66 % 4 = 2
  EXPECT_THROW_WITH(config.validate(), ConfigError, "d_model 66 is not divisible by n_heads 4");
}

TEST(Config, KvHeadsMustDivideHeads) {
  TransformerConfig config = small_config();
  config.n_kv_heads = 3;  // 4 % 3 = 1: one KV head would serve a different number of queries
  EXPECT_THROW_WITH(config.validate(), ConfigError, "n_kv_heads 3 does not divide n_heads 4");
  config.n_kv_heads = 8;  // more KV heads than query heads
  EXPECT_THROW_WITH(config.validate(), ConfigError, "n_kv_heads 8 does not divide n_heads 4");
}

TEST(Config, RopeThetaAndNormEpsMustBeFiniteAndPositive) {
  TransformerConfig c = find_preset("gpt2-small").config;
  EXPECT_EQ(c.rope_theta, 10000.0);
  EXPECT_FALSE(c.norm_eps.has_value());  // each norm's own default
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    TransformerConfig theta = c;
    theta.rope_theta = bad;
    EXPECT_THROW_WITH(theta.validate(), ConfigError,
                      "TransformerConfig: rope_theta must be finite and > 0");
    TransformerConfig eps = c;
    eps.norm_eps = bad;
    EXPECT_THROW_WITH(eps.validate(), ConfigError,
                      "TransformerConfig: norm_eps must be finite and > 0");
  }
  c.norm_eps = 1e-6;
  c.rope_theta = 500000;
  EXPECT_NO_THROW(c.validate());
}

TEST(Config, ScoreScalingDefaultsToOneOverRootHeadDimAndIsChecked) {
  TransformerConfig c = find_preset("gpt2-small").config;  // d_k = 64
  EXPECT_TRUE(c.score_scaling.is_default());
  EXPECT_EQ(c.score_scale(0), 0.125);
  EXPECT_EQ(c.score_scale(11), 0.125);
  c.score_scaling.inverse_layer_index = true;  // HF scale_attn_by_inverse_layer_idx
  EXPECT_EQ(c.score_scale(0), 0.125);
  EXPECT_EQ(c.score_scale(3), 0.125 / 4);
  c.score_scaling.scale = 1.0;  // HF scale_attn_weights: false
  EXPECT_EQ(c.score_scale(1), 0.5);
  EXPECT_NO_THROW(c.validate());
  EXPECT_THROW_WITH(c.score_scale(12), ConfigError,
                    "TransformerConfig::score_scale: layer 12 is outside [0, n_layers = 12)");
  EXPECT_THROW_WITH(c.score_scale(-1), ConfigError, "layer -1 is outside");
  for (double bad : {0.0, -1.0, std::nan(""), HUGE_VAL}) {
    TransformerConfig scaled = c;
    scaled.score_scaling.scale = bad;
    EXPECT_THROW_WITH(scaled.validate(), ConfigError,
                      "TransformerConfig: score_scaling.scale must be finite and > 0");
  }
}

TEST(Config, StyleEnumsOutOfRangeAreConfigErrorsNamingTypeAndValue) {
  // An enum class holds any int: a value cast from a file or a command line must not pick a
  // branch (Norm(7) used to count as RMSNorm, Ffn(9) as a plain MLP).
  TransformerConfig config = small_config();
  config.norm = static_cast<Norm>(7);
  EXPECT_THROW_WITH(config.validate(), ConfigError,
                    "TransformerConfig: Norm(7) is out of range (known: layer_norm, rms_norm)");
  config = small_config();
  config.positions = static_cast<Positions>(-1);
  EXPECT_THROW_WITH(config.validate(), ConfigError,
                    "TransformerConfig: Positions(-1) is out of range (known: learned, rotary)");
  config = small_config();
  config.ffn = static_cast<Ffn>(2);  // one past gated
  EXPECT_THROW_WITH(config.validate(), ConfigError,
                    "TransformerConfig: Ffn(2) is out of range (known: mlp, gated)");
  EXPECT_THROW_WITH(check_norm("op", static_cast<Norm>(2)), ConfigError, "op: Norm(2)");
  EXPECT_THROW_WITH(norm_name(static_cast<Norm>(3)), ConfigError, "norm_name: Norm(3)");
  EXPECT_THROW_WITH(positions_name(static_cast<Positions>(5)), ConfigError, "Positions(5)");
  EXPECT_THROW_WITH(ffn_name(static_cast<Ffn>(5)), ConfigError, "Ffn(5)");
}

TEST(Config, StyleEnumsHaveNames) {
  EXPECT_EQ(std::string(norm_name(Norm::layer_norm)) + " " + std::string(norm_name(Norm::rms_norm)),
            "layer_norm rms_norm");
  EXPECT_EQ(std::string(positions_name(Positions::learned)) + " " +
                std::string(positions_name(Positions::rotary)),
            "learned rotary");
  EXPECT_EQ(std::string(ffn_name(Ffn::mlp)) + " " + std::string(ffn_name(Ffn::gated)), "mlp gated");
  EXPECT_EQ(check_ffn("op", Ffn::gated), Ffn::gated);
}

TEST(Presets, AllAreValidAndUniquelyNamed) {
  std::set<std::string_view> names;
  for (const Preset& preset : presets()) {
    SCOPED_TRACE(std::string(preset.name));
    EXPECT_NO_THROW(preset.config.validate());
    EXPECT_TRUE(names.insert(preset.name).second);
    EXPECT_FALSE(preset.description.empty());
    EXPECT_EQ(&find_preset(preset.name), &preset);
  }
  EXPECT_GE(names.size(), 5u);
}

TEST(Presets, UnknownNameListsTheKnownOnes) {
  EXPECT_THROW_WITH(find_preset("gpt5"), ConfigError, "preset: unknown name \"gpt5\"");
  EXPECT_THROW_WITH(find_preset("gpt5"), ConfigError, "gpt2-small, gpt2-medium, llama-7b");
}

TEST(Presets, Gpt2SmallMatchesHfConfig) {
  const TransformerConfig& c = find_preset("gpt2-small").config;
  EXPECT_EQ(c.d_model, 768);
  EXPECT_EQ(c.n_layers, 12);
  EXPECT_EQ(c.n_heads, 12);
  EXPECT_EQ(c.kv_heads(), 12);
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_EQ(c.d_ff, 3072);
  EXPECT_EQ(c.vocab, 50257);
  EXPECT_EQ(c.context, 1024);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_EQ(c.positions, Positions::learned);
  EXPECT_EQ(c.norm, Norm::layer_norm);
  EXPECT_TRUE(c.bias);
  EXPECT_EQ(c.ffn, Ffn::mlp);
  // head_dim stays derived, so overriding D and H re-derives it.
  EXPECT_FALSE(c.head_dim.has_value());
}

TEST(Presets, Gpt2MediumIsGpt2SmallWiderAndDeeper) {
  const TransformerConfig& c = find_preset("gpt2-medium").config;
  EXPECT_EQ(c.d_model, 1024);
  EXPECT_EQ(c.n_layers, 24);
  EXPECT_EQ(c.n_heads, 16);
  EXPECT_EQ(c.d_ff, 4096);
  EXPECT_EQ(c.vocab, 50257);
}

TEST(Presets, Llama7bMatchesThePaper) {
  const TransformerConfig& c = find_preset("llama-7b").config;
  EXPECT_EQ(c.d_model, 4096);
  EXPECT_EQ(c.n_layers, 32);
  EXPECT_EQ(c.n_heads, 32);
  EXPECT_EQ(c.kv_heads(), 32);
  EXPECT_EQ(c.head_size(), 128);
  EXPECT_EQ(c.d_ff, 11008);
  EXPECT_EQ(c.vocab, 32000);
  EXPECT_EQ(c.context, 2048);
  EXPECT_FALSE(c.tied_embeddings);
  EXPECT_EQ(c.positions, Positions::rotary);
  EXPECT_EQ(c.norm, Norm::rms_norm);
  EXPECT_FALSE(c.bias);
  EXPECT_EQ(c.ffn, Ffn::gated);
}

TEST(Presets, Llama2_70bUsesGroupedQueryAttention) {
  const TransformerConfig& c = find_preset("llama-2-70b").config;
  EXPECT_EQ(c.d_model, 8192);
  EXPECT_EQ(c.n_layers, 80);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.kv_heads(), 8);  // each KV head serves 8 query heads
  EXPECT_EQ(c.head_size(), 128);
  EXPECT_EQ(c.d_ff, 28672);
  EXPECT_EQ(c.context, 4096);
  EXPECT_EQ(c.ffn, Ffn::gated);
}

TEST(Presets, ToyIsTheLessonsExercise) {
  const TransformerConfig& c = find_preset("toy").config;
  EXPECT_EQ(c.d_model, 512);
  EXPECT_EQ(c.n_layers, 6);
  EXPECT_EQ(c.vocab, 32000);
  EXPECT_EQ(c.d_ff, 4 * 512);  // D → 4D → D, as 12·D²·L assumes
  EXPECT_FALSE(c.bias);
}

}  // namespace test_config
}  // namespace dissect
