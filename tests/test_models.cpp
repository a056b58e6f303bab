// Tests of dissect/models: GPT2Model, LlamaModel and MixtralModel against PyTorch (logits, loss and
// every parameter's gradient, float32 and float64), cached decoding against the full forward, the
// live shape trace against forward_shape_chain, counts against count_parameters, finite
// differences in double, and the bad inputs of the issue (ids, positions, KV caches, configs),
// each of which must throw and change nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "dissect/accounting/count.hpp"
#include "dissect/accounting/forward_chain.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/models/generate.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_models {

using testing::FloatAndDouble;

// ---- fixtures: the config, the weights, the tokens ----------------------------------------------

TransformerConfig config_from(const testing::Fixture& fixture) {
  TransformerConfig config;
  config.d_model = fixture.meta_int("d_model");
  config.n_layers = fixture.meta_int("n_layers");
  config.n_heads = fixture.meta_int("n_heads");
  config.n_kv_heads = fixture.meta_int("n_kv_heads");
  config.head_dim = fixture.meta_int("head_dim");
  config.d_ff = fixture.meta_int("d_ff");
  config.vocab = fixture.meta_int("vocab");
  config.context = fixture.meta_int("context");
  config.tied_embeddings = fixture.meta_bool("tied");
  config.bias = fixture.meta_bool("bias");
  config.norm_eps = std::stod(fixture.meta_str("norm_eps"));
  if (fixture.has_meta("rope_theta")) {
    config.positions = Positions::rotary;
    config.norm = Norm::rms_norm;
    config.ffn = Ffn::gated;
    config.rope_theta = std::stod(fixture.meta_str("rope_theta"));
  }
  if (fixture.has_meta("n_experts")) {
    config.n_experts = fixture.meta_int("n_experts");
    config.experts_per_token = fixture.meta_int("experts_per_token");
  }
  // GPT-2's attention switches, as config.json spells them (model_scaling fixtures only).
  if (fixture.has_meta("scale_attn_weights") && !fixture.meta_bool("scale_attn_weights")) {
    config.score_scaling.scale = 1.0;
  }
  if (fixture.has_meta("sliding_window")) {
    config.sliding_window = fixture.meta_int("sliding_window");  // the sliding_window block
  }
  if (fixture.has_meta("scale_attn_by_inverse_layer_idx")) {
    config.score_scaling.inverse_layer_index = fixture.meta_bool("scale_attn_by_inverse_layer_idx");
  }
  return config;
}

std::vector<index_t> ids_of(const testing::FixtureTensor& tensor) {
  return std::vector<index_t>(tensor.values.begin(), tensor.values.end());
}

/// Copies every parameter from the fixture by its state_dict name; the fixture must hold exactly
/// the model's parameters.
template <class Model>
void load_weights(Model& model, const testing::Fixture& weights) {
  std::size_t loaded = 0;
  model.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    using View = decltype(value);
    const auto source =
        testing::tensor_from<scalar_of<View>, rank_of<View>>(weights.tensor(name.str()));
    value.copy_from(source.cview());
    ++loaded;
  });
  ASSERT_EQ(loaded, weights.tensors.size()) << "the fixture holds parameters the model lacks";
}

testing::Fixture model_fixture(const std::string& file) {
  return testing::read_fixture(testing::fixture_dir("model") / file);
}

/// Normwise comparison: max |actual − expected| ≤ tolerance · max |expected|.
template <TensorLike A, TensorLike B>
::testing::AssertionResult normwise_close(const A& actual, const B& expected, double tolerance) {
  const auto a = const_view(actual);
  const auto e = const_view(expected);
  if (a.shape() != e.shape()) {
    return ::testing::AssertionFailure()
           << "shapes differ: " << format_shape(a.shape()) << " vs " << format_shape(e.shape());
  }
  double scale = 0, worst = 0;
  index_t at = 0;
  for (index_t i = 0; i < e.size(); ++i) {
    scale = std::max(scale, std::abs(static_cast<double>(e.data()[i])));
    const double diff = std::abs(static_cast<double>(a.data()[i]) - e.data()[i]);
    if (!(diff <= worst)) worst = diff, at = i;
  }
  if (worst <= tolerance * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |diff| " << worst << " at flat " << at << " exceeds " << tolerance << " · "
         << scale << " (ours " << a.data()[at] << ", reference " << e.data()[at] << ")";
}

/// The normwise tolerance of a whole model in Scalar. Each output is S stages deep (per layer:
/// two norms, QKV, scores, softmax, P·v, W_O, two FFN products, and the head), each a reduction
/// of length ≤ K = max(D, F, T, V) whose rounding is ≤ γ_K of the magnitudes it sums (Higham
/// §3.1). Both implementations round independently (×2), and the norms divide by a row's σ,
/// which magnifies an absolute error by the ratio of the row's scale to σ: ≤ 4 here, with
/// γ = 1 ± 0.1 weights and rows of N(0, 0.02²)-scale values. So 2·4·S·γ_K, relative to the
/// tensor's largest value; gradients run the chain twice (forward, backward): 2S stages.
template <class Scalar>
double model_tolerance(const TransformerConfig& c, index_t tokens, bool gradient) {
  const index_t depth = (9 * c.n_layers + 2) * (gradient ? 2 : 1);
  const index_t longest = std::max({c.d_model, c.d_ff, tokens, c.vocab});
  return 2.0 * 4.0 * static_cast<double>(depth) * testing::gamma<Scalar>(longest);
}

/// The model of `weights` run as `run` says (its meta is the config) against torch's run.
template <class Model>
void expect_matches_torch(const testing::Fixture& weights, const testing::Fixture& run) {
  using Scalar = typename Model::scalar_type;
  const TransformerConfig config = config_from(run);
  Model model(config, {.seed = 1});
  load_weights(model, weights);

  const auto ids = ids_of(run.tensor("ids"));
  const auto targets = ids_of(run.tensor("targets"));
  const index_t batch = run.tensor("ids").shape[0], tokens = run.tensor("ids").shape[1];
  const TokenBatch inputs{ids, batch, tokens};
  const auto torch_logits = testing::tensor_from<Scalar, 3>(run.tensor("logits"));

  const double forward_tol = model_tolerance<Scalar>(config, tokens, false);
  EXPECT_TRUE(normwise_close(model.forward(inputs), torch_logits, forward_tol)) << "inference";
  typename Model::Cache cache;
  EXPECT_TRUE(normwise_close(model.forward(inputs, cache), torch_logits, forward_tol))
      << "training forward";

  model.zero_grad();
  const Scalar loss = model.loss_and_backward(inputs, targets, cache);
  const double torch_loss = run.tensor("loss").values.at(0);
  EXPECT_NEAR(loss, torch_loss, forward_tol * std::abs(torch_loss));

  const double gradient_tol = model_tolerance<Scalar>(config, tokens, true);
  std::size_t checked = 0;
  model.for_each_parameter([&](const ParameterName& name, auto, auto grad) {
    using View = decltype(grad);
    SCOPED_TRACE(name.str());
    const auto torch_grad =
        testing::tensor_from<Scalar, rank_of<View>>(run.tensor("grad." + name.str()));
    // (wpe's rows T … context − 1 are never used: exactly zero in both.)
    EXPECT_TRUE(normwise_close(grad, torch_grad, gradient_tol));
    ++checked;
  });
  EXPECT_EQ(checked, weights.tensors.size());
}

template <class Model>
void expect_matches_torch(const std::string& family) {
  const std::string dtype = std::is_same_v<typename Model::scalar_type, float> ? "f32_" : "f64_";
  expect_matches_torch<Model>(model_fixture("weights_" + family + ".txt"),
                              model_fixture(dtype + family + ".txt"));
}

/// A case of the model_scaling block: GPT-2 with one of its attention switches set.
template <class Model>
void expect_scaled_gpt2_matches_torch(const std::string& name) {
  const std::string dtype = std::is_same_v<typename Model::scalar_type, float> ? "f32_" : "f64_";
  const auto dir = testing::fixture_dir("model_scaling");
  expect_matches_torch<Model>(testing::read_fixture(dir / "weights_gpt2_scaling.txt"),
                              testing::read_fixture(dir / (dtype + name + ".txt")));
}

template <class Scalar>
class ModelFixtures : public ::testing::Test {};
TYPED_TEST_SUITE(ModelFixtures, FloatAndDouble);

TYPED_TEST(ModelFixtures, Gpt2MatchesTorchLogitsLossAndEveryGradient) {
  expect_matches_torch<GPT2Model<TypeParam>>("gpt2");
}

TYPED_TEST(ModelFixtures, LlamaMatchesTorchLogitsLossAndEveryGradient) {
  expect_matches_torch<LlamaModel<TypeParam>>("llama");
}

// Mixtral's sparse MoE block as HF's MixtralSparseMoeBlock computes it (softmax over E, top-2,
// renormalised), every expert's and the router's gradients; the generator checks that no token
// sits near a routing tie, so float32 routes as float64 does.
TYPED_TEST(ModelFixtures, MixtralMatchesTorchLogitsLossAndEveryGradient) {
  expect_matches_torch<MixtralModel<TypeParam>>("mixtral");
}

// Mistral: the model block's LLaMA with sliding_window 5 of its 16 positions, against torch's
// explicit band mask in every layer (the generator checks that the window moves the logits past
// position 4 by ~30% of their size, and not before).
TYPED_TEST(ModelFixtures, LlamaWithASlidingWindowMatchesTorchsMistral) {
  const std::string dtype = std::is_same_v<TypeParam, float> ? "f32_" : "f64_";
  expect_matches_torch<LlamaModel<TypeParam>>(
      model_fixture("weights_llama.txt"),
      testing::read_fixture(testing::fixture_dir("sliding_window") / (dtype + "mistral.txt")));
}

// HF GPT2Attention with scale_attn_weights: false (no 1/√d_k) and, separately, with
// scale_attn_by_inverse_layer_idx: true (layer i's scores also / (i + 1)), on 3 layers whose QKV
// weights make the scores O(1): the fixtures' logits move by ~20-80% of their size from the
// default scaling's, so a missed or misplaced factor fails by far more than the tolerance.
TYPED_TEST(ModelFixtures, Gpt2WithoutScaledAttentionWeightsMatchesTorch) {
  expect_scaled_gpt2_matches_torch<GPT2Model<TypeParam>>("gpt2_unscaled");
}

TYPED_TEST(ModelFixtures, Gpt2ScaledByInverseLayerIndexMatchesTorch) {
  expect_scaled_gpt2_matches_torch<GPT2Model<TypeParam>>("gpt2_inverse_layer");
}

// ---- small models for the algebraic tests -------------------------------------------------------

using testing::random_ids;
using testing::small_gpt2;
using testing::small_llama;
using testing::small_mixtral;

/// Rows [first, first + T) of every sequence of a B×S id batch.
std::vector<index_t> slice_positions(const std::vector<index_t>& ids, index_t batch, index_t seq,
                                     index_t first, index_t count) {
  std::vector<index_t> out;
  for (index_t b = 0; b < batch; ++b) {
    for (index_t t = first; t < first + count; ++t) out.push_back(ids[b * seq + t]);
  }
  return out;
}

/// Logits [B, S, V] at positions [first, first + count): what a decoding step should return.
template <class Scalar>
Tensor<Scalar, 3> slice_logits(const Tensor<Scalar, 3>& logits, index_t first, index_t count) {
  Tensor<Scalar, 3> out({logits.dim(0), count, logits.dim(2)});
  for (index_t b = 0; b < logits.dim(0); ++b) {
    for (index_t t = 0; t < count; ++t) {
      for (index_t v = 0; v < logits.dim(2); ++v) out(b, t, v) = logits(b, first + t, v);
    }
  }
  return out;
}

/// Every parameter's and gradient's values, to prove a refused call changed nothing.
template <class Model>
std::vector<double> state_of(const Model& model) {
  std::vector<double> state;
  model.for_each_parameter([&](const ParameterName&, auto value, auto grad) {
    state.insert(state.end(), value.begin(), value.end());
    state.insert(state.end(), grad.begin(), grad.end());
  });
  return state;
}

template <class Scalar>
class ModelAlgebra : public ::testing::Test {};
TYPED_TEST_SUITE(ModelAlgebra, FloatAndDouble);

/// Decoding with a KV cache, in the given chunks of new positions, equals the full forward.
template <class Model>
void expect_cached_decoding_equals_full_forward(const TransformerConfig& config,
                                                const std::vector<index_t>& chunks) {
  using Scalar = typename Model::scalar_type;
  Model model(config, {.init_std = 0.2, .seed = 7});
  const index_t batch = 2, seq = config.context;
  const auto ids = random_ids(static_cast<std::size_t>(batch * seq), config.vocab, 11);
  const auto full = model.forward(TokenBatch{ids, batch, seq});
  auto kv = model.make_kv_cache(batch);
  index_t first = 0;
  for (index_t count : chunks) {
    SCOPED_TRACE(testing::concat_for_trace("positions ", first, " + ", count));
    const auto step = slice_positions(ids, batch, seq, first, count);
    const auto logits = model.forward(TokenBatch{step, batch, count}, kv);
    EXPECT_TRUE(normwise_close(logits, slice_logits(full, first, count),
                               model_tolerance<Scalar>(config, seq, false)));
    first += count;
    EXPECT_EQ(kv.length(), first);
  }
}

TYPED_TEST(ModelAlgebra, Gpt2CachedDecodingEqualsFullForward) {
  const std::vector<index_t> one_by_one(12, 1);
  expect_cached_decoding_equals_full_forward<GPT2Model<TypeParam>>(small_gpt2(), one_by_one);
  expect_cached_decoding_equals_full_forward<GPT2Model<TypeParam>>(small_gpt2(), {5, 3, 1, 3});
}

/// small_gpt2 with 3 layers and the given score scaling.
TransformerConfig scaled_gpt2(std::optional<double> scale, bool inverse_layer_index) {
  TransformerConfig config = small_gpt2();
  config.n_layers = 3;
  config.score_scaling = {.scale = scale, .inverse_layer_index = inverse_layer_index};
  return config;
}

TYPED_TEST(ModelAlgebra, Gpt2WithScoreScalingCachedDecodingEqualsFullForward) {
  // The cached step's kernel (causal_attention_heads_into) must scale as the full forward does.
  const std::vector<index_t> one_by_one(12, 1);
  for (const auto& config :
       {scaled_gpt2(1.0, false), scaled_gpt2(std::nullopt, true), scaled_gpt2(0.7, true)}) {
    expect_cached_decoding_equals_full_forward<GPT2Model<TypeParam>>(config, one_by_one);
    expect_cached_decoding_equals_full_forward<GPT2Model<TypeParam>>(config, {5, 3, 1, 3});
  }
}

TYPED_TEST(ModelAlgebra, EachLayerScalesItsScoresByItsOwnIndex) {
  const TransformerConfig config = scaled_gpt2(std::nullopt, true);
  GPT2Model<TypeParam> model(config, {.seed = 3});
  ASSERT_EQ(model.layers().size(), 3u);
  for (index_t i = 0; i < 3; ++i) {
    EXPECT_EQ(model.layers().at(static_cast<std::size_t>(i)).index(), i);
    EXPECT_EQ(model.layers().at(static_cast<std::size_t>(i)).score_scale(),
              1.0 / std::sqrt(4.0) / static_cast<double>(i + 1));
  }
  // The default keeps today's factor, bit for bit.
  GPT2Model<TypeParam> plain(small_gpt2(), {.seed = 3});
  EXPECT_EQ(plain.layers().at(1).score_scale(), 1.0 / std::sqrt(4.0));
}

TYPED_TEST(ModelAlgebra, LlamaCachedDecodingEqualsFullForward) {
  const std::vector<index_t> one_by_one(12, 1);
  expect_cached_decoding_equals_full_forward<LlamaModel<TypeParam>>(small_llama(), one_by_one);
  expect_cached_decoding_equals_full_forward<LlamaModel<TypeParam>>(small_llama(), {5, 3, 1, 3});
}

/// small_llama (or small_mixtral) with a sliding window of 3 of its 12 positions.
TransformerConfig windowed(TransformerConfig config, index_t window = 3) {
  config.sliding_window = window;
  return config;
}

/// As expect_cached_decoding_equals_full_forward, decoding through a rolling cache of W
/// positions, whose bytes never change.
template <class Model>
void expect_rolling_decoding_equals_full_forward(const TransformerConfig& config,
                                                 const std::vector<index_t>& chunks) {
  using Scalar = typename Model::scalar_type;
  Model model(config, {.init_std = 0.2, .seed = 7});
  const index_t batch = 2, seq = config.context;
  const auto ids = random_ids(static_cast<std::size_t>(batch * seq), config.vocab, 11);
  const auto full = model.forward(TokenBatch{ids, batch, seq});
  auto kv = model.make_rolling_kv_cache(batch);
  const index_t bytes = kv.bytes();
  EXPECT_EQ(kv.window(), *config.sliding_window);
  index_t first = 0;
  for (index_t count : chunks) {
    SCOPED_TRACE(testing::concat_for_trace("positions ", first, " + ", count));
    const auto step = slice_positions(ids, batch, seq, first, count);
    const auto logits = model.forward(TokenBatch{step, batch, count}, kv);
    EXPECT_TRUE(normwise_close(logits, slice_logits(full, first, count),
                               model_tolerance<Scalar>(config, seq, false)));
    first += count;
    EXPECT_EQ(kv.length(), first);
    EXPECT_EQ(kv.bytes(), bytes);
  }
}

TYPED_TEST(ModelAlgebra, ASlidingWindowDecodesAsTheFullForwardOverAFullOrARollingCache) {
  const std::vector<index_t> one_by_one(12, 1);
  for (const auto& config : {windowed(small_llama()), windowed(small_llama(), 1)}) {
    SCOPED_TRACE(testing::concat_for_trace("W=", *config.sliding_window));
    // Over a KVCache of the context: the band mask; over a RollingKVCache: W positions only.
    expect_cached_decoding_equals_full_forward<LlamaModel<TypeParam>>(config, one_by_one);
    expect_cached_decoding_equals_full_forward<LlamaModel<TypeParam>>(config, {5, 3, 1, 3});
    expect_rolling_decoding_equals_full_forward<LlamaModel<TypeParam>>(config, one_by_one);
    expect_rolling_decoding_equals_full_forward<LlamaModel<TypeParam>>(config, {5, 3, 1, 3});
  }
  expect_rolling_decoding_equals_full_forward<MixtralModel<TypeParam>>(windowed(small_mixtral()),
                                                                       {4, 1, 1, 6});
  // A rolling cache holds W of the context's positions: 3 of 12.
  LlamaModel<TypeParam> model(windowed(small_llama()), {.seed = 1});
  EXPECT_EQ(model.make_rolling_kv_cache(2).bytes() * 4, model.make_kv_cache(2).bytes());
}

TYPED_TEST(ModelAlgebra, ASlidingWindowLimitsWhatALogitDependsOn) {
  // One layer, W = 3: position t reads positions t − 2 … t only, so changing token 2 changes the
  // logits at positions 2, 3, 4 and no other; with two layers, up to position 6.
  for (const index_t layers : {1, 2}) {
    auto config = windowed(small_llama());
    config.n_layers = layers;
    LlamaModel<TypeParam> model(config, {.init_std = 0.2, .seed = 3});
    auto ids = random_ids(12, 23, 5);
    const auto before = model.forward(TokenBatch{ids, 1, 12});
    ids[2] = (ids[2] + 1) % 23;
    const auto after = model.forward(TokenBatch{ids, 1, 12});
    const index_t reach = 2 + 2 * layers;  // the last position token 2 reaches
    EXPECT_TENSOR_EQ(slice_logits(after, 0, 2), slice_logits(before, 0, 2));
    EXPECT_FALSE(
        normwise_close(slice_logits(after, reach, 1), slice_logits(before, reach, 1), 1e-3));
    EXPECT_TENSOR_EQ(slice_logits(after, reach + 1, 11 - reach),
                     slice_logits(before, reach + 1, 11 - reach));
  }
  // A window no shorter than the context is no window, bit for bit.
  LlamaModel<TypeParam> plain(small_llama(), {.seed = 4});
  LlamaModel<TypeParam> wide(windowed(small_llama(), 12), {.seed = 4});
  const auto ids = random_ids(24, 23, 6);
  EXPECT_TENSOR_EQ(wide.forward(TokenBatch{ids, 2, 12}), plain.forward(TokenBatch{ids, 2, 12}));
}

TYPED_TEST(ModelAlgebra, MixtralCachedDecodingEqualsFullForward) {
  const std::vector<index_t> one_by_one(12, 1);
  expect_cached_decoding_equals_full_forward<MixtralModel<TypeParam>>(small_mixtral(), one_by_one);
  expect_cached_decoding_equals_full_forward<MixtralModel<TypeParam>>(small_mixtral(),
                                                                      {5, 3, 1, 3});
}

TYPED_TEST(ModelAlgebra, CausalityLaterTokensDoNotChangeEarlierLogits) {
  LlamaModel<TypeParam> model(small_llama(), {.init_std = 0.2, .seed = 3});
  auto ids = random_ids(12, 23, 5);
  const auto before = model.forward(TokenBatch{ids, 1, 12});
  ids[8] = (ids[8] + 1) % 23;
  const auto after = model.forward(TokenBatch{ids, 1, 12});
  EXPECT_TENSOR_EQ(slice_logits(after, 0, 8), slice_logits(before, 0, 8));
  EXPECT_FALSE(normwise_close(slice_logits(after, 8, 4), slice_logits(before, 8, 4), 1e-3));
}

TEST(Models, ParameterCountEqualsCountParametersForEveryStyleChoice) {
  for (bool tied : {true, false}) {
    for (bool bias : {true, false}) {
      for (index_t kv_heads : {4, 2, 1}) {
        SCOPED_TRACE(testing::concat_for_trace("tied=", tied, " bias=", bias, " H_kv=", kv_heads));
        TransformerConfig gpt2 = small_gpt2(), llama = small_llama();
        for (TransformerConfig* config : {&gpt2, &llama}) {
          config->tied_embeddings = tied;
          config->bias = bias;
          config->n_kv_heads = kv_heads;
        }
        EXPECT_EQ(GPT2Model<float>(gpt2).parameter_count(), count_parameters(gpt2).total);
        EXPECT_EQ(LlamaModel<float>(llama).parameter_count(), count_parameters(llama).total);
      }
    }
  }
  for (index_t experts : {1, 3, 4}) {
    TransformerConfig mixtral = small_mixtral();
    mixtral.n_experts = experts;
    mixtral.experts_per_token = 1;
    const auto count = count_parameters(mixtral);
    MixtralModel<float> model(mixtral);
    EXPECT_EQ(model.parameter_count(), count.total);
    // The experts' parameters are what the count says, and a token uses k of E of them.
    index_t in_experts = 0;
    model.for_each_parameter([&](const ParameterName& name, auto value, auto) {
      if (name.str().find(".experts.") != std::string::npos) in_experts += value.size();
    });
    EXPECT_EQ(in_experts, count.experts);
    EXPECT_EQ(count.total - count.active, count.experts / experts * (experts - 1));
  }
}

TEST(Models, ParametersHaveStateDictNames) {
  const auto gpt2 = parameter_names(GPT2Model<float>(small_gpt2()));
  ASSERT_EQ(gpt2.size(), 2u + 12u * 2 + 2u);
  EXPECT_EQ(gpt2.front(), "wte.weight");
  EXPECT_EQ(gpt2[1], "wpe.weight");
  EXPECT_EQ(gpt2[2], "h.0.ln_1.weight");
  EXPECT_EQ(gpt2[4], "h.0.attn.qkv.weight");
  EXPECT_EQ(gpt2[6], "h.0.attn.proj.weight");
  EXPECT_EQ(gpt2[10], "h.0.mlp.up.weight");
  EXPECT_EQ(gpt2.back(), "ln_f.bias");  // tied: no lm_head.weight of its own
  const auto llama = parameter_names(LlamaModel<float>(small_llama()));
  ASSERT_EQ(llama.size(), 1u + 7u * 2 + 2u);
  EXPECT_EQ(llama[1], "layers.0.input_layernorm.weight");
  EXPECT_EQ(llama[2], "layers.0.self_attn.qkv.weight");
  EXPECT_EQ(llama[5], "layers.0.mlp.gate.weight");
  EXPECT_EQ(llama.back(), "lm_head.weight");
  const auto mixtral = parameter_names(MixtralModel<float>(small_mixtral()));
  ASSERT_EQ(mixtral.size(), 1u + (5u + 3u * 4u) * 2 + 2u);
  EXPECT_EQ(mixtral[5], "layers.0.block_sparse_moe.router.weight");
  EXPECT_EQ(mixtral[6], "layers.0.block_sparse_moe.experts.0.gate.weight");
  EXPECT_EQ(mixtral[17], "layers.0.block_sparse_moe.experts.3.down.weight");
}

/// The recorded stages equal forward_shape_chain's, stage by stage; the chain's last stage,
/// sampling, is not part of a forward pass.
template <class Model>
void expect_trace_equals_chain(const TransformerConfig& config, index_t batch, index_t seq) {
  Model model(config);
  const auto ids = random_ids(static_cast<std::size_t>(batch * seq), config.vocab, 1);
  const auto chain = forward_shape_chain(config, batch, seq);
  ShapeTrace inference, training;
  model.forward(TokenBatch{ids, batch, seq}, &inference);
  typename Model::Cache cache;
  model.forward(TokenBatch{ids, batch, seq}, cache, &training);
  for (const ShapeTrace* trace : {&inference, &training}) {
    ASSERT_EQ(trace->size() + 1, chain.steps().size());
    for (std::size_t i = 0; i < trace->size(); ++i) {
      EXPECT_EQ((*trace)[i].stage, chain.steps()[i].stage);
      EXPECT_EQ((*trace)[i].shape, chain.steps()[i].shape.sizes) << (*trace)[i].stage;
    }
  }
  EXPECT_EQ(chain.steps().back().stage, "sampling");
}

TEST(Models, RecordedShapeChainEqualsForwardShapeChain) {
  expect_trace_equals_chain<GPT2Model<float>>(small_gpt2(), 3, 7);
  expect_trace_equals_chain<LlamaModel<float>>(small_llama(), 2, 12);
  // The routing step: the router's logits [B, T, E] between attention and the experts.
  expect_trace_equals_chain<MixtralModel<float>>(small_mixtral(), 2, 12);
}

TYPED_TEST(ModelAlgebra, TiedEmbeddingReceivesTheHeadsAndTheLookupsGradients) {
  GPT2Model<TypeParam> model(small_gpt2(), {.init_std = 0.2, .seed = 4});
  std::vector<index_t> ids{1, 2, 3, 1, 5, 8, 2, 2};  // ids 0, 4, 6, 7, 9… never looked up
  const TokenBatch tokens{ids, 2, 4};
  typename GPT2Model<TypeParam>::Cache cache;
  const auto logits = model.forward(tokens, cache);
  std::mt19937_64 engine(9);
  const auto dlogits = testing::random_tensor<TypeParam, 3>(logits.shape(), engine, -1, 1);
  model.zero_grad();
  model.backward(tokens, cache, dlogits);
  // Row v of the head's gradient is Σ_{b,t} dlogits[b, t, v]·normed[b, t, :]; an unused id's
  // row has only that, a used id's row has the lookup's gradient on top.
  const auto grad = model.token_embedding().weight_grad();
  for (index_t v : {0, 4, 9, 1, 2}) {
    double worst = 0, size = 0;
    for (index_t d = 0; d < 16; ++d) {
      double head = 0;
      for (index_t r = 0; r < 8; ++r) {
        head += static_cast<double>(dlogits.data()[r * 23 + v]) * cache.normed.data()[r * 16 + d];
      }
      worst = std::max(worst, std::abs(grad(v, d) - head));
      size = std::max(size, std::abs(head));
    }
    const bool used = std::count(ids.begin(), ids.end(), v) > 0;
    if (used) {
      EXPECT_GT(worst, 1e-3 * size) << "id " << v << " lost its lookup gradient";
    } else {
      EXPECT_LE(worst, 64 * testing::gamma<TypeParam>(8) * size) << "id " << v;
    }
  }
}

/// d loss / d parameter by central differences in double, on a sample of every parameter (or of
/// those whose name contains `only`).
template <class Model>
void expect_gradients_match_finite_differences(const TransformerConfig& config, index_t seq = 6,
                                               const std::string& only = "",
                                               std::int64_t sample = 12) {
  Model model(config, {.init_std = 0.3, .seed = 21});
  // Non-trivial norm weights and biases, so their gradients are not the trivial ones.
  std::mt19937_64 engine(2);
  model.for_each_parameter([&](const ParameterName&, auto value, auto) {
    if constexpr (rank_of<decltype(value)> == 1) {
      for (auto& x : value) x += std::uniform_real_distribution<double>(-0.3, 0.3)(engine);
    }
  });
  const index_t batch = 2;
  const auto ids = random_ids(static_cast<std::size_t>(batch * seq), config.vocab, 3);
  const auto targets = random_ids(ids.size(), config.vocab, 4);
  const TokenBatch tokens{ids, batch, seq};
  typename Model::Cache cache;
  model.zero_grad();
  model.loss_and_backward(tokens, targets, cache);
  for (const auto& layer : cache.layers) {  // which attention the training forward ran
    EXPECT_EQ(layer.flash.lse.size() > 0, flash_attention_pays(seq)) << "T = " << seq;
  }
  const auto loss = [&] {
    const auto logits = model.forward(tokens);
    return cross_entropy(logits.cview().reshape(Shape<2>{-1, config.vocab}), targets);
  };
  model.for_each_parameter([&](const ParameterName& name, auto value, auto grad) {
    if (name.str().find(only) == std::string::npos) return;
    SCOPED_TRACE(name.str());
    const auto analytic = testing::snapshot(grad);
    EXPECT_GRADIENT_OK(testing::gradcheck(loss, value, analytic,
                                          {.richardson = true, .sample = sample, .seed = 5}));
  });
}

TEST(Models, Gpt2GradientsMatchFiniteDifferences) {
  TransformerConfig config = small_gpt2();
  config.tied_embeddings = true;
  expect_gradients_match_finite_differences<GPT2Model<double>>(config);
}

TEST(Models, Gpt2WithScoreScalingGradientsMatchFiniteDifferences) {
  // Backward must differentiate the scaled forward: the factor enters dS, hence dq and dk.
  for (const auto& config : {scaled_gpt2(1.0, false), scaled_gpt2(std::nullopt, true)}) {
    SCOPED_TRACE(config.score_scaling.scale ? "scale 1" : "inverse layer index");
    expect_gradients_match_finite_differences<GPT2Model<double>>(config);
  }
}

TEST(Models, LlamaGradientsMatchFiniteDifferences) {
  expect_gradients_match_finite_differences<LlamaModel<double>>(small_llama());
}

TEST(Models, LlamaWithASlidingWindowGradientsMatchFiniteDifferences) {
  // Training's banded attention and its backward, inside the whole model.
  expect_gradients_match_finite_differences<LlamaModel<double>>(windowed(small_llama()));
}

TEST(Models, AHugeContextBuildsNoRopeTableUntilAForwardNeedsItAndTrainsAlike) {
  // Row 131: a LLaMA config with a context of 2³¹ − 1 threw std::bad_alloc at construction (its
  // RoPE table was [context, d_k/2] twice); the table now holds what the forwards reach, and
  // training (forward with a cache, then backward) gives the small context's loss and gradients,
  // bit for bit.
  auto huge_config = testing::small_llama();
  huge_config.context = 2147483647;
  LlamaModel<double> huge(huge_config, {.init_std = 0.5, .seed = 9});
  LlamaModel<double> small(testing::small_llama(), {.init_std = 0.5, .seed = 9});
  EXPECT_EQ(huge.rope_positions(), 0);
  const auto inputs = testing::random_ids(2 * 7, 23, 1), targets = testing::random_ids(14, 23, 2);
  typename LlamaModel<double>::Cache huge_cache, small_cache;
  EXPECT_EQ(huge.loss_and_backward(TokenBatch{inputs, 2, 7}, targets, huge_cache),
            small.loss_and_backward(TokenBatch{inputs, 2, 7}, targets, small_cache));
  EXPECT_EQ(huge.rope_positions(), 7);
  std::vector<std::vector<double>> huge_grads, small_grads;
  huge.for_each_parameter([&](const ParameterName&, auto, auto grad) {
    huge_grads.emplace_back(grad.data(), grad.data() + grad.size());
  });
  small.for_each_parameter([&](const ParameterName&, auto, auto grad) {
    small_grads.emplace_back(grad.data(), grad.data() + grad.size());
  });
  EXPECT_EQ(huge_grads, small_grads);
  // A KV cache of the request's size decodes past the table, which grows with it.
  auto kv = huge.make_kv_cache(1, 20);
  for (std::size_t t = 0; t < 20; ++t) {
    huge.forward(TokenBatch{std::span<const index_t>(&inputs[t % inputs.size()], 1), 1, 1}, kv);
  }
  EXPECT_GE(huge.rope_positions(), 20);
  EXPECT_LE(huge.rope_positions(), 2 * 20);
}

TEST(ModelErrors, ARollingCacheNeedsTheModelsWindow) {
  LlamaModel<float> plain(small_llama(), {.seed = 1});
  EXPECT_THROW_WITH(plain.make_rolling_kv_cache(1), ConfigError,
                    "RollingKVCache: config.sliding_window is unset");
  LlamaModel<float> model(windowed(small_llama()), {.seed = 1});
  RollingKVCache<float> other(windowed(small_llama(), 4), 1);
  const std::vector<index_t> ids{1, 2};
  EXPECT_THROW_WITH(
      model.forward(TokenBatch{ids, 1, 2}, other), ShapeError,
      "LlamaModel::forward (rolling KV cache): the rolling KV cache was built for "
      "[L, B, H_kv, W, d_k] = [2, 1, 2, 4, 4], this model and batch need [2, 1, 2, 3, 4]");
  EXPECT_EQ(other.length(), 0);
  auto kv = model.make_rolling_kv_cache(1);
  EXPECT_THROW_WITH(model.forward(TokenBatch{std::vector<index_t>(13, 1), 1, 13}, kv), ShapeError,
                    "exceed the model's context of 12 positions");
  EXPECT_EQ(kv.length(), 0);
}

// From flash_attention_min_tokens on, the decoder layer trains with flash attention (P never
// kept): the same gradients, at T = 130 (three 64-row tiles, the last of 2 rows). The QKV
// weights' gradients are dq, dk and dv's products with the layer's input; a sample of them keeps
// the test to seconds at -O0.
TEST(Models, LlamaGradientsMatchFiniteDifferencesOnTheFlashAttentionPath) {
  auto config = small_llama();
  config.context = 130;
  expect_gradients_match_finite_differences<LlamaModel<double>>(config, 130, "qkv", 6);
  auto gpt2 = scaled_gpt2(std::nullopt, true);  // the per-layer scale reaches flash's backward
  gpt2.context = 130;
  expect_gradients_match_finite_differences<GPT2Model<double>>(gpt2, 130, "qkv.weight", 6);
}

// ---- bad input: a clear error and no change ----------------------------------------------------

TEST(ModelErrors, TokenIdOutsideTheVocabularyNamesBatchAndPosition) {
  LlamaModel<float> model(small_llama());
  std::vector<index_t> ids(8, 1);
  ids[6] = 23;
  EXPECT_THROW_WITH(model.forward(TokenBatch{ids, 2, 4}), Error, "token 23 at [1, 2]");
  ids[6] = -1;
  EXPECT_THROW_WITH(model.forward(TokenBatch{ids, 2, 4}), Error, "token -1 at [1, 2]");
  auto kv = model.make_kv_cache(2);
  EXPECT_THROW_WITH(model.forward(TokenBatch{ids, 2, 4}, kv), Error, "token -1 at [1, 2]");
  EXPECT_EQ(kv.length(), 0);
}

TEST(ModelErrors, SequencesLongerThanTheContextAreRefused) {
  GPT2Model<float> model(small_gpt2());
  const auto ids = random_ids(13, 23, 1);
  EXPECT_THROW_WITH(model.forward(TokenBatch{ids, 1, 13}), ShapeError,
                    "GPT2Model::forward: positions 0 … 12 (T = 13 after 0) exceed the model's "
                    "context of 12 positions");
  EXPECT_THROW_WITH(model.forward(TokenBatch{ids, 1, 0}), ShapeError, "need B > 0 and T > 0");
}

TEST(ModelErrors, AFullKvCacheRefusesAStepAndStaysUsable) {
  GPT2Model<double> model(small_gpt2(), {.init_std = 0.2, .seed = 1});
  const auto ids = random_ids(12, 23, 2);
  const auto full = model.forward(TokenBatch{ids, 1, 12});
  auto kv = model.make_kv_cache(1, 6);
  model.forward(TokenBatch{slice_positions(ids, 1, 12, 0, 4), 1, 4}, kv);
  const auto step = slice_positions(ids, 1, 12, 4, 3);
  EXPECT_THROW_WITH(model.forward(TokenBatch{step, 1, 3}, kv), ShapeError,
                    "3 new positions do not fit the KV cache (4 of 6 positions used)");
  EXPECT_EQ(kv.length(), 4);
  const auto logits = model.forward(TokenBatch{slice_positions(ids, 1, 12, 4, 2), 1, 2}, kv);
  EXPECT_TRUE(normwise_close(logits, slice_logits(full, 4, 2), 1e-12));
}

TEST(ModelErrors, AKvCacheOfAnotherConfigOrBatchIsRefused) {
  LlamaModel<float> model(small_llama());
  const auto ids = random_ids(2, 23, 2);
  TransformerConfig other = small_llama();
  other.n_kv_heads = 4;
  KVCache<float> wrong_heads(other, 2);
  EXPECT_THROW_WITH(model.forward(TokenBatch{ids, 2, 1}, wrong_heads), ShapeError,
                    "the KV cache was built for [L, B, H_kv, capacity, d_k] = [2, 2, 4, 12, 4], "
                    "this model and batch need [2, 2, 2, 12, 4]");
  auto one_sequence = model.make_kv_cache(1);
  EXPECT_THROW_WITH(model.forward(TokenBatch{ids, 2, 1}, one_sequence), ShapeError,
                    "this model and batch need [2, 2, 2, 12, 4]");
  EXPECT_EQ(wrong_heads.length(), 0);
  EXPECT_EQ(one_sequence.length(), 0);
}

TEST(ModelErrors, ExpertsMustMatchTheFamilyAndFitTheirCount) {
  EXPECT_THROW_WITH(
      LlamaModel<float>{small_mixtral()}, ConfigError,
      "LlamaModel: config.n_experts is 4, LlamaModel has a dense FFN (n_experts = 0)");
  EXPECT_THROW_WITH(MixtralModel<float>{small_llama()}, ConfigError,
                    "config.n_experts is 0, MixtralModel needs a mixture of experts");
  TransformerConfig config = small_mixtral();
  for (index_t k : {0, 5, -1}) {
    config.experts_per_token = k;
    EXPECT_THROW_WITH(MixtralModel<float>{config}, ConfigError,
                      concat("experts_per_token ", k, " must be in [1, n_experts = 4]"));
  }
  config = small_mixtral();
  config.n_experts = -2;
  EXPECT_THROW_WITH(config.validate(), ConfigError, "n_experts must be >= 0");
}

TEST(ModelErrors, AMixtralTokenWithNaNStopsAtTheFirstRouterNamingIt) {
  // docs/reliability.md row 84: a NaN embedding row reaches layer 0's router through its norm; the
  // full forward, the cached decode step (T = 1, the path generate() takes) and generate() itself
  // all throw the block's Error rather than return NaN logits. The NaN token comes first: through
  // attention (0·NaN in P·V) a NaN token makes every token of its sequence NaN, and the error
  // names the first.
  MixtralModel<float> model(small_mixtral(), {.seed = 5});
  const index_t d = small_mixtral().d_model;
  bool poisoned_row = false;
  model.for_each_parameter([&](const ParameterName&, auto value, auto) {
    if (poisoned_row) return;  // the first parameter is the token embedding [V, D]
    value.data()[5 * d + 2] = std::nanf("");
    poisoned_row = true;
  });
  const std::vector<index_t> prompt{5, 1, 2};
  EXPECT_THROW_WITH(model.forward(TokenBatch{prompt, 1, 3}), Error,
                    "MixtureOfExperts::forward: router logit z[0, 0] is nan (token 0 = x[0, 0, :]; "
                    "x: [1, 3, 16], router weight: [4, 16], logits: [3, 4])");
  auto kv = model.make_kv_cache(1);
  const std::vector<index_t> good{1, 2}, poisoned{5};
  EXPECT_TRUE(model.forward(TokenBatch{good, 1, 2}, kv).matrix().allFinite());
  EXPECT_THROW_WITH(model.forward(TokenBatch{poisoned, 1, 1}, kv), Error,
                    "router logit z[0, 0] is nan (token 0 = x[0, 0, :]; x: [1, 1, 16]");
  EXPECT_THROW_WITH(generate(model, prompt, {.max_new_tokens = 2}, [](index_t) {}), Error,
                    "MixtureOfExperts::forward: router logit z[0, 0] is nan");
}

TEST(ModelErrors, AConfigOfAnotherFamilyOrWithNanIsRefused) {
  EXPECT_THROW_WITH(GPT2Model<float>{small_llama()}, ConfigError,
                    "GPT2Model: config.norm is rms_norm, GPT2Model needs layer_norm");
  EXPECT_THROW_WITH(LlamaModel<float>{small_gpt2()}, ConfigError,
                    "LlamaModel: config.norm is layer_norm, LlamaModel needs rms_norm");
  TransformerConfig nan_theta = small_llama();
  nan_theta.rope_theta = std::nan("");
  EXPECT_THROW_WITH(LlamaModel<float>{nan_theta}, ConfigError,
                    "rope_theta must be finite and > 0 (got nan)");
  TransformerConfig bad_eps = small_gpt2();
  bad_eps.norm_eps = -1e-5;
  EXPECT_THROW_WITH(GPT2Model<float>{bad_eps}, ConfigError, "norm_eps must be finite and > 0");
  TransformerConfig bad_scale = small_gpt2();
  bad_scale.score_scaling.scale = 0.0;
  EXPECT_THROW_WITH(GPT2Model<float>{bad_scale}, ConfigError,
                    "score_scaling.scale must be finite and > 0 (got 0)");
}

TEST(ModelErrors, ALlamaWithAnotherScoreScalingIsRefused) {
  // No LLaMA checkpoint holds one: LlamaAttention always scales by 1/√d_k.
  for (const ScoreScaling scaling : {ScoreScaling{.scale = 1.0}, ScoreScaling{.scale = 0.125},
                                     ScoreScaling{.inverse_layer_index = true}}) {
    TransformerConfig config = small_llama();
    config.score_scaling = scaling;
    EXPECT_THROW_WITH(LlamaModel<float>{config}, ConfigError,
                      "LlamaModel: config.score_scaling is not 1/√d_k, LlamaModel needs 1/√d_k in "
                      "every layer");
  }
  TransformerConfig gpt2 = small_gpt2();
  gpt2.score_scaling.inverse_layer_index = true;
  EXPECT_NO_THROW(GPT2Model<float>{gpt2});
  EXPECT_THROW_WITH((GPT2Block<float>{gpt2, 1, 2}), ConfigError,
                    "score_scale: layer 2 is outside [0, n_layers = 2)");
}

TEST(ModelErrors, RefusedTrainingCallsChangeNoParameterOrGradient) {
  GPT2Model<float> model(small_gpt2(), {.seed = 2});
  const auto ids = random_ids(8, 23, 3);
  const TokenBatch tokens{ids, 2, 4};
  GPT2Model<float>::Cache cache;
  model.loss_and_backward(tokens, random_ids(8, 23, 4), cache);
  const auto before = state_of(model);
  auto short_targets = random_ids(7, 23, 4);
  EXPECT_THROW(model.loss_and_backward(tokens, short_targets, cache), ShapeError);
  auto bad_target = random_ids(8, 23, 4);
  bad_target[3] = 23;
  EXPECT_THROW_WITH(model.loss_and_backward(tokens, bad_target, cache), Error, "23");
  Tensor<float, 3> wrong({2, 4, 22});
  EXPECT_THROW_WITH(model.backward(tokens, cache, wrong), ShapeError,
                    "dlogits must be [B, T, V] = [2, 4, 23], got [2, 4, 22]");
  GPT2Model<float>::Cache empty;
  EXPECT_THROW_WITH(model.backward(tokens, empty, Tensor<float, 3>({2, 4, 23})), ShapeError,
                    "the cache does not hold a forward of [2, 4, 16]");
  EXPECT_EQ(state_of(model), before);
}

}  // namespace test_models
}  // namespace dissect
