// Tests of dissect/io/hf_config.hpp: the fixtures' config.json files (written with
// transformers' keys) give the configs of the model fixtures; every missing, mistyped or
// unsupported key is a ConfigError naming the file and the key.
#include <gtest/gtest.h>

#include <cstdint>
#include <span>
#include <string>

#include "dissect/io/hf_config.hpp"
#include "dissect/io/hf_writer.hpp"
#include "dissect/io/model_file.hpp"
#include "support/fixture.hpp"
#include "support/io_testing.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_hf_config {

nlohmann::json gpt2_json() {
  return {{"model_type", "gpt2"}, {"n_embd", 32},
          {"n_layer", 2},         {"n_head", 4},
          {"n_inner", nullptr},   {"vocab_size", 97},
          {"n_positions", 24},    {"layer_norm_epsilon", 1e-5}};
}

nlohmann::json llama_json() {
  return {{"model_type", "llama"},
          {"hidden_size", 32},
          {"intermediate_size", 88},
          {"num_attention_heads", 4},
          {"num_key_value_heads", 2},
          {"num_hidden_layers", 2},
          {"vocab_size", 97},
          {"max_position_embeddings", 32},
          {"rms_norm_eps", 1e-6},
          {"rope_theta", 10000.0},
          {"tie_word_embeddings", false},
          {"hidden_act", "silu"}};
}

TEST(HfConfig, TheFixturesConfigFilesGiveTheFixturesConfigs) {
  const auto gpt2 = read_hf_config(testing::fixture_dir("hf") / "gpt2" / "config.json");
  EXPECT_EQ(gpt2.family, ModelFamily::gpt2);
  EXPECT_EQ(gpt2.config.d_model, 32);
  EXPECT_EQ(gpt2.config.d_ff, 128);  // n_inner null: 4·n_embd
  EXPECT_EQ(gpt2.config.context, 24);
  EXPECT_TRUE(gpt2.config.tied_embeddings);
  EXPECT_EQ(gpt2.config.norm, Norm::layer_norm);
  EXPECT_DOUBLE_EQ(*gpt2.config.norm_eps, 1e-5);
  const auto llama = read_hf_config(testing::fixture_dir("hf") / "llama" / "config.json");
  EXPECT_EQ(llama.family, ModelFamily::llama);
  EXPECT_EQ(llama.config.kv_heads(), 2);
  EXPECT_EQ(llama.config.d_ff, 88);
  EXPECT_EQ(llama.config.positions, Positions::rotary);
  EXPECT_FALSE(llama.config.tied_embeddings);
  EXPECT_FALSE(llama.config.bias);
  EXPECT_DOUBLE_EQ(llama.config.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(*llama.config.norm_eps, 1e-6);
}

TEST(HfConfig, DefaultsFollowTransformers) {
  auto json = llama_json();
  json.erase("num_key_value_heads");
  json.erase("rope_theta");
  json.erase("tie_word_embeddings");
  const auto llama = parse_hf_config(json, "config.json");
  EXPECT_EQ(llama.config.kv_heads(), 4);
  EXPECT_DOUBLE_EQ(llama.config.rope_theta, 10000.0);
  EXPECT_FALSE(llama.config.tied_embeddings);
}

nlohmann::json mixtral_json() {
  auto json = llama_json();
  json["model_type"] = "mixtral";
  json["num_local_experts"] = 8;
  json["num_experts_per_tok"] = 2;
  json["sliding_window"] = nullptr;
  json["router_aux_loss_coef"] = 0.02;
  return json;
}

TEST(HfConfig, MixtralReadsItsExpertsAndTheirCount) {
  const auto mixtral = read_hf_config(testing::fixture_dir("hf") / "mixtral" / "config.json");
  EXPECT_EQ(mixtral.family, ModelFamily::mixtral);
  EXPECT_EQ(mixtral.config.n_experts, 4);
  EXPECT_EQ(mixtral.config.experts_per_token, 2);
  EXPECT_EQ(mixtral.config.ffn, Ffn::gated);
  EXPECT_DOUBLE_EQ(mixtral.config.rope_theta, 1e6);
  auto defaults = mixtral_json();
  defaults.erase("rope_theta");
  defaults.erase("rms_norm_eps");
  defaults.erase("sliding_window");
  const auto read = parse_hf_config(defaults, "config.json");
  EXPECT_DOUBLE_EQ(read.config.rope_theta, 1e6);  // MixtralConfig's defaults, not LlamaConfig's
  EXPECT_DOUBLE_EQ(*read.config.norm_eps, 1e-5);
  EXPECT_EQ(style_of(ModelFamily::mixtral).model_name, "MixtralModel");
  EXPECT_EQ(family_name(ModelFamily::mixtral), "mixtral");
}

TEST(HfConfigErrors, MixtralsExpertKeysAreChecked) {
  auto missing = mixtral_json();
  missing.erase("num_local_experts");
  EXPECT_THROW_WITH(parse_hf_config(missing, "m/config.json"), ConfigError,
                    "m/config.json: missing \"num_local_experts\"");
  auto too_many = mixtral_json();
  too_many["num_experts_per_tok"] = 9;
  EXPECT_THROW_WITH(parse_hf_config(too_many, "m/config.json"), ConfigError,
                    "experts_per_token 9 must be in [1, n_experts = 8]");
  auto none = mixtral_json();
  none["num_local_experts"] = 0;
  EXPECT_THROW_WITH(parse_hf_config(none, "m/config.json"), ConfigError,
                    "\"num_local_experts\" must be >= 1 (got 0)");
}

nlohmann::json mistral_json() {
  auto json = llama_json();
  json["model_type"] = "mistral";
  json["sliding_window"] = 16;
  json.erase("tie_word_embeddings");
  return json;
}

TEST(HfConfig, MistralAndMixtralReadTheirSlidingWindow) {
  // Mistral is LLaMA's layers with a window: the llama family, whose models honour it.
  auto json = mistral_json();
  const auto mistral = parse_hf_config(json, "config.json");
  EXPECT_EQ(mistral.family, ModelFamily::llama);
  EXPECT_EQ(mistral.config.sliding_window, 16);
  EXPECT_EQ(mistral.config.positions, Positions::rotary);
  EXPECT_FALSE(mistral.config.tied_embeddings);
  json.erase("sliding_window");  // MistralConfig's default
  EXPECT_EQ(parse_hf_config(json, "config.json").config.sliding_window, 4096);
  json["sliding_window"] = nullptr;  // explicitly none
  EXPECT_FALSE(parse_hf_config(json, "config.json").config.sliding_window.has_value());
  // LlamaConfig has no such key: transformers ignores it, and so does dissect.
  auto llama = llama_json();
  llama["sliding_window"] = 16;
  EXPECT_FALSE(parse_hf_config(llama, "config.json").config.sliding_window.has_value());
  // Mixtral's window, shorter than the context (32), is now read, not refused; null is none.
  auto mixtral = mixtral_json();
  EXPECT_FALSE(parse_hf_config(mixtral, "config.json").config.sliding_window.has_value());
  mixtral["sliding_window"] = 16;
  EXPECT_EQ(parse_hf_config(mixtral, "config.json").config.sliding_window, 16);
  // Written back: a LLaMA with a window is "mistral", and reads back to the same config.
  const auto written = hf_config_json(mistral);
  EXPECT_EQ(written.at("model_type"), "mistral");
  EXPECT_EQ(written.at("sliding_window"), 16);
  EXPECT_FALSE(written.contains("attention_bias"));
  const auto back = parse_hf_config(written, "config.json");
  EXPECT_EQ(back.family, ModelFamily::llama);
  EXPECT_EQ(back.config.sliding_window, 16);
  EXPECT_EQ(config_to_json(back.config), config_to_json(mistral.config));
  EXPECT_EQ(hf_config_json(parse_hf_config(mixtral, "c")).at("sliding_window"), 16);
}

TEST(HfConfigErrors, ASlidingWindowBelowOneOrNotACountIsRefused) {
  auto json = mistral_json();
  for (const int bad : {0, -3}) {
    json["sliding_window"] = bad;
    EXPECT_THROW_WITH(
        parse_hf_config(json, "m/config.json"), ConfigError,
        "m/config.json: TransformerConfig: sliding_window must be > 0 (got " + std::to_string(bad));
  }
  json["sliding_window"] = "4096";
  EXPECT_THROW_WITH(parse_hf_config(json, "m/config.json"), ConfigError,
                    "m/config.json: \"sliding_window\" must be a whole number (got \"4096\")");
  auto mixtral = mixtral_json();
  mixtral["sliding_window"] = 0;
  EXPECT_THROW_WITH(parse_hf_config(mixtral, "m/config.json"), ConfigError,
                    "sliding_window must be > 0 (got 0");
  // What GPT2Config, or a MistralConfig with biases, cannot say is refused when written.
  auto gpt2 = parse_hf_config(gpt2_json(), "c");
  gpt2.config.sliding_window = 8;
  EXPECT_THROW_WITH(hf_config_json(gpt2), ConfigError,
                    "hf_config_json: GPT2Config has no key for a sliding window");
  auto biased = parse_hf_config(mistral_json(), "c");
  biased.config.bias = true;
  EXPECT_THROW_WITH(hf_config_json(biased), ConfigError,
                    "hf_config_json: MistralConfig has no key for biases");
}

TEST(HfConfigErrors, EveryBadKeyIsNamedWithTheFile) {
  auto missing = gpt2_json();
  missing.erase("n_head");
  EXPECT_THROW_WITH(parse_hf_config(missing, "dir/config.json"), ConfigError,
                    "dir/config.json: missing \"n_head\"");
  auto mistyped = gpt2_json();
  mistyped["n_embd"] = "32";
  EXPECT_THROW_WITH(parse_hf_config(mistyped, "c.json"), ConfigError,
                    "c.json: \"n_embd\" must be a whole number (got \"32\")");
  auto activation = gpt2_json();
  activation["activation_function"] = "relu";
  EXPECT_THROW_WITH(parse_hf_config(activation, "c.json"), ConfigError,
                    "\"activation_function\" is not supported by dissect's models (got \"relu\")");
  auto scaling = llama_json();
  scaling["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  EXPECT_THROW_WITH(parse_hf_config(scaling, "c.json"), ConfigError,
                    "\"rope_scaling\" is not supported");
  auto type = llama_json();
  type["model_type"] = "qwen2";
  EXPECT_THROW_WITH(
      parse_hf_config(type, "c.json"), ConfigError,
      "model_type \"qwen2\" is not one dissect builds (known: gpt2, llama, mistral, mixtral)");
  auto heads = llama_json();
  heads["num_key_value_heads"] = 3;
  EXPECT_THROW_WITH(parse_hf_config(heads, "c.json"), ConfigError,
                    "c.json: TransformerConfig: n_kv_heads 3 does not divide n_heads 4");
  auto theta = llama_json();
  theta["rope_theta"] = -1.0;
  EXPECT_THROW_WITH(parse_hf_config(theta, "c.json"), ConfigError,
                    "rope_theta must be finite and > 0");
  EXPECT_THROW_WITH(parse_hf_config(nlohmann::json::array(), "c.json"), ConfigError,
                    "must be a JSON object");
  EXPECT_THROW_WITH(read_hf_config("no/such/config.json"), Error,
                    "no/such/config.json: cannot open");
}

TEST(HfConfigErrors, ASizeBeyondInt64IsRefusedWithTheFilesOwnNumber) {
  // Row 133: 2⁶⁴ − 1 was read as int64 −1 and refused as "vocab must be > 0 (got -1)", a
  // number the file does not hold. Every size key, in config.json and in dissect's own metadata.
  const std::uint64_t huge = 18446744073709551615u;
  auto vocab = llama_json();
  vocab["vocab_size"] = huge;
  EXPECT_THROW_WITH(parse_hf_config(vocab, "c.json"), ConfigError,
                    "c.json: \"vocab_size\" is beyond int64, the largest size dissect represents "
                    "(got 18446744073709551615)");
  auto width = gpt2_json();
  width["n_embd"] = std::uint64_t{9223372036854775808u};  // INT64_MAX + 1
  EXPECT_THROW_WITH(parse_hf_config(width, "c.json"), ConfigError,
                    "\"n_embd\" is beyond int64, the largest size dissect represents "
                    "(got 9223372036854775808)");
  auto saved = config_to_json(parse_hf_config(llama_json(), "c").config);
  saved["context"] = huge;
  EXPECT_THROW_WITH(config_from_json(saved, "m"), ConfigError,
                    "m: \"context\" is beyond int64, the largest size dissect represents "
                    "(got 18446744073709551615)");
}

TEST(HfConfigErrors, BiasKeysDissectCannotRepresentAreRefusedAndMistralsAreIgnored) {
  // Row 133: LlamaConfig's mlp_bias is false when absent, so attention_bias alone biases q, k, v
  // and o_proj but not the MLP; dissect biases every linear layer or none, and so refuses it
  // (it read the absent mlp_bias as attention_bias's value: an MLP with biases no file holds).
  auto attention_only = llama_json();
  attention_only["attention_bias"] = true;
  EXPECT_THROW_WITH(parse_hf_config(attention_only, "c.json"), ConfigError,
                    "c.json: \"attention_bias\" disagrees with mlp_bias (attention_bias = true, "
                    "mlp_bias = false, LlamaConfig's default): dissect's models bias every linear "
                    "layer or none (got true)");
  attention_only["mlp_bias"] = false;
  EXPECT_THROW_WITH(parse_hf_config(attention_only, "c.json"), ConfigError,
                    "c.json: \"mlp_bias\" disagrees with attention_bias");
  auto mlp_only = llama_json();
  mlp_only["mlp_bias"] = true;
  EXPECT_THROW_WITH(parse_hf_config(mlp_only, "c.json"), ConfigError,
                    "\"mlp_bias\" disagrees with attention_bias (attention_bias = false, "
                    "mlp_bias = true)");
  auto both = llama_json();
  both["attention_bias"] = true;
  both["mlp_bias"] = true;
  EXPECT_TRUE(parse_hf_config(both, "c.json").config.bias);
  EXPECT_FALSE(parse_hf_config(llama_json(), "c.json").config.bias);
  // MistralAttention, MistralMLP and Mixtral's experts are built with bias=False whatever the
  // file says: their bias keys are ignored, as transformers ignores them.
  for (auto json : {mistral_json(), both}) {
    if (json.contains("mlp_bias")) {
      json["model_type"] = "mixtral";
      json["num_local_experts"] = 4;
      json["num_experts_per_tok"] = 2;
    }
    json["attention_bias"] = true;
    EXPECT_FALSE(parse_hf_config(json, "c.json").config.bias) << json.dump();
  }
}

TEST(HfConfigFile, ARepeatedKeyIsAnErrorNotTheLastValue) {
  // nlohmann's own parser keeps the last of two equal keys: a config.json naming n_embd twice
  // would build whichever model came last. Every level is checked, not only the top.
  const testing::TemporaryDirectory dir;
  const auto config = dir / "config.json";
  const auto write = [&](const std::string& text) {
    testing::write_file(config, std::as_bytes(std::span(text)));
  };
  write(R"({"model_type": "gpt2", "n_embd": 16, "n_embd": 32})");
  EXPECT_THROW_WITH(read_hf_config(config), FormatError,
                    config.string() + ": key \"n_embd\" appears twice");
  write(R"({"model_type": "gpt2", "task_specific_params": {"a": 1, "a": 2}})");
  EXPECT_THROW_WITH(read_hf_config(config), FormatError, "key \"a\" appears twice");
  write(R"({"model_type": )");
  EXPECT_THROW_WITH(read_hf_config(config), FormatError, config.string() + " is not valid JSON");
  // The committed fixtures, which repeat nothing, still read.
  EXPECT_NO_THROW(read_hf_config(testing::fixture_dir("hf") / "gpt2" / "config.json"));
}

TEST(HfConfigFile, Gpt2AttentionScalingsAreRead) {
  // transformers' GPT2Attention divides the scores by √d_k only when scale_attn_weights (default
  // true), and further by layer_idx + 1 when scale_attn_by_inverse_layer_idx (default false).
  nlohmann::json config = {{"model_type", "gpt2"}, {"n_embd", 16},     {"n_layer", 2},
                           {"n_head", 4},          {"vocab_size", 23}, {"n_positions", 12}};
  EXPECT_TRUE(parse_hf_config(config, "c.json").config.score_scaling.is_default());
  config["scale_attn_weights"] = true;
  config["scale_attn_by_inverse_layer_idx"] = false;
  config["reorder_and_upcast_attn"] = true;  // fp16 precision only: the same function
  const auto spelled_out = parse_hf_config(config, "c.json").config;
  EXPECT_TRUE(spelled_out.score_scaling.is_default());
  EXPECT_EQ(spelled_out.score_scale(1), 0.5);  // 1/√d_k, d_k = 4

  auto unscaled = config;
  unscaled["scale_attn_weights"] = false;
  const auto plain = parse_hf_config(unscaled, "c.json").config;
  EXPECT_EQ(plain.score_scaling, (ScoreScaling{.scale = 1.0, .inverse_layer_index = false}));
  EXPECT_EQ(plain.score_scale(0), 1.0);
  EXPECT_EQ(plain.score_scale(1), 1.0);

  auto by_layer = config;
  by_layer["scale_attn_by_inverse_layer_idx"] = true;
  const auto layered = parse_hf_config(by_layer, "c.json").config;
  EXPECT_EQ(layered.score_scaling,
            (ScoreScaling{.scale = std::nullopt, .inverse_layer_index = true}));
  EXPECT_EQ(layered.score_scale(0), 0.5);
  EXPECT_EQ(layered.score_scale(1), 0.25);  // layer_idx 1: / √4 / 2

  by_layer["scale_attn_weights"] = false;
  EXPECT_EQ(parse_hf_config(by_layer, "c.json").config.score_scale(1), 0.5);  // 1 / 2

  for (const char* key : {"scale_attn_weights", "scale_attn_by_inverse_layer_idx"}) {
    auto mistyped = config;
    mistyped[key] = "yes";
    EXPECT_THROW_WITH(parse_hf_config(mistyped, "c.json"), ConfigError,
                      std::string("c.json: \"") + key + "\" must be true or false (got \"yes\")");
    mistyped[key] = 0;
    EXPECT_THROW_WITH(parse_hf_config(mistyped, "c.json"), ConfigError,
                      std::string("c.json: \"") + key + "\" must be true or false (got 0)");
  }
}

TEST(HfConfigFile, Gpt2AttentionSwitchesInALlamaFileAreIgnoredAsTransformersIgnoresThem) {
  // LlamaAttention always scales by 1/√d_k and never reads these keys.
  auto json = llama_json();
  json["scale_attn_weights"] = false;
  json["scale_attn_by_inverse_layer_idx"] = true;
  EXPECT_TRUE(parse_hf_config(json, "c.json").config.score_scaling.is_default());
}

TEST(HfConfigFile, AScoreScalingReadFromConfigJsonSurvivesDissectsOwnModelFile) {
  // save_model records the config (config_to_json); a scaling lost there would reload as another
  // model. The default writes no key, so files of other models are as they were.
  nlohmann::json json = {{"model_type", "gpt2"},
                         {"n_embd", 16},
                         {"n_layer", 2},
                         {"n_head", 4},
                         {"vocab_size", 23},
                         {"n_positions", 12},
                         {"scale_attn_weights", false},
                         {"scale_attn_by_inverse_layer_idx", true}};
  const TransformerConfig config = parse_hf_config(json, "c.json").config;
  const auto saved = config_to_json(config);
  EXPECT_EQ(saved.at("score_scaling"),
            (nlohmann::json{{"scale", 1.0}, {"inverse_layer_index", true}}));
  EXPECT_EQ(config_from_json(saved, "m").score_scaling, config.score_scaling);
  json.erase("scale_attn_weights");
  json.erase("scale_attn_by_inverse_layer_idx");
  const TransformerConfig plain = parse_hf_config(json, "c.json").config;
  EXPECT_FALSE(config_to_json(plain).contains("score_scaling"));
  EXPECT_TRUE(config_from_json(config_to_json(plain), "m").score_scaling.is_default());

  auto broken = saved;
  broken["score_scaling"]["scale"] = -2.0;
  EXPECT_THROW_WITH(config_from_json(broken, "m"), ConfigError,
                    "m: TransformerConfig: score_scaling.scale must be finite and > 0 (got -2)");
  broken["score_scaling"] = 3;
  EXPECT_THROW_WITH(config_from_json(broken, "m"), ConfigError,
                    "m: \"score_scaling\" must be a JSON object (got 3)");
  broken["score_scaling"] = {{"inverse_layer_index", "no"}};
  EXPECT_THROW_WITH(config_from_json(broken, "m"), ConfigError,
                    "m score_scaling: \"inverse_layer_index\" must be true or false");
}

}  // namespace test_hf_config
}  // namespace dissect
