// Tests of dissect/tensor/freezing.hpp: freeze and unfreeze reach every layer of a model, a frozen
// layer keeps no gradient and no optimizer sees it, yet backward still runs through it; and
// for_each_layer names every leaf by its module path.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "dissect/models/decoder_model.hpp"
#include "dissect/tensor/freezing.hpp"
#include "dissect/training/optim.hpp"
#include "dissect/transforms/lora.hpp"
#include "support/small_models.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_freezing {

using testing::random_ids;
using testing::small_gpt2;

TEST(Freeze, FrozenLayersKeepNoGradientAndOptimizersSkipThem) {
  GPT2Model<float> model(small_gpt2(), {.seed = 1});
  const index_t total = model.parameter_count();
  EXPECT_EQ(trainable_parameter_count(model), total);
  freeze(model);
  EXPECT_EQ(model.parameter_count(), total);  // PyTorch's numel over all parameters
  EXPECT_EQ(trainable_parameter_count(model), 0);
  EXPECT_TRUE(parameters_of(model).empty());
  EXPECT_THROW_WITH((void)model.token_embedding().weight_grad(), Error, "frozen");
  // A frozen model still runs backward (dx only, nowhere to add).
  const auto ids = random_ids(2 * 5, 23, 7);
  typename GPT2Model<float>::Cache cache;
  EXPECT_NO_THROW(model.loss_and_backward({ids, 2, 5}, ids, cache));
  unfreeze(model);
  EXPECT_EQ(trainable_parameter_count(model), total);
  EXPECT_EQ(model.token_embedding().weight_grad().matrix().cwiseAbs().maxCoeff(), 0.0f);
}

TEST(Freeze, UnfreezeIsAllOrNothing) {
  // h.1.mlp.down carries a merged adapter and refuses to train; the layers visited before it
  // (wte, wpe, the norms, h.0, h.1's attention) must not be left unfrozen when it throws.
  GPT2Model<float> model(small_gpt2(), {.seed = 1});
  apply_lora(model, {.adapter = {.rank = 2}, .target_modules = {"h.1.mlp.down"}});
  merge_adapters(model);
  const index_t trainable = trainable_parameter_count(model);  // the adapter's A and B alone
  EXPECT_THROW_WITH(unfreeze(model), Error, "the LoRA adapter is merged into the weight");
  EXPECT_EQ(trainable_parameter_count(model), trainable);
  EXPECT_TRUE(model.token_embedding().frozen());
  EXPECT_THROW_WITH((void)model.token_embedding().weight_grad(), Error, "frozen");
}

TEST(Freeze, ForEachLayerNamesEveryLeafByItsModulePath) {
  GPT2Model<float> model(small_gpt2(), {.seed = 1});
  std::vector<std::string> linears, all;
  for_each_layer(model, [&](const std::string& path, Linear<float>&) { linears.push_back(path); });
  for_each_layer(model, [&](const std::string& path, auto&) { all.push_back(path); });
  EXPECT_EQ(linears, (std::vector<std::string>{"h.0.attn.qkv", "h.0.attn.proj", "h.0.mlp.up",
                                               "h.0.mlp.down", "h.1.attn.qkv", "h.1.attn.proj",
                                               "h.1.mlp.up", "h.1.mlp.down"}));
  EXPECT_EQ(all.front(), "wte");
  EXPECT_EQ(all[1], "wpe");
  EXPECT_EQ(all[2], "h.0.ln_1");
  EXPECT_EQ(all.back(), "ln_f");  // the tied head is the embedding, visited once
}

}  // namespace test_freezing
}  // namespace dissect
