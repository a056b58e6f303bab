// Tests for resumable training: Generator::state, Optimizer::state/load_state and
// io/training_state.hpp. The reference for "resumed" is the same run left uninterrupted: a run of
// N steps stopped after k, saved, loaded into fresh objects built from other seeds and continued
// must end bit for bit where the uninterrupted one ends (weights, moments, losses), for Sgd with
// momentum, Adam and AdamW. Then the refusals of reliability rows 96 and 97.
#include "dissect/io/training_state.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dissect/io/safetensors.hpp"
#include "dissect/io/state_dict.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/training/optim.hpp"
#include "support/io_testing.hpp"
#include "support/small_models.hpp"

namespace dissect {
namespace test_training_state {

using testing::TemporaryDirectory;
using Model = GPT2Model<float>;

constexpr index_t kBatch = 2, kContext = 6;

/// One training step on a batch of random tokens drawn from `generator`; returns the loss.
template <class Optimizer>
float train_step(Model& model, Optimizer& optimizer, Generator& generator) {
  const index_t vocab = model.config().vocab;
  std::vector<index_t> inputs(kBatch * kContext), targets(kBatch * kContext);
  for (auto& id : inputs) id = static_cast<index_t>(generator.next_u64() % vocab);
  for (auto& id : targets) id = static_cast<index_t>(generator.next_u64() % vocab);
  // A normal draw leaves a spare behind half of the time: the state must carry it.
  optimizer.set_lr(0.01 * (1.0 + 0.1 * generator.normal()));
  Model::Cache cache;
  model.zero_grad();
  const float loss = model.loss_and_backward(TokenBatch{inputs, kBatch, kContext}, targets, cache);
  optimizer.step();
  return loss;
}

/// Every parameter's bytes, in visiting order: equality is bit for bit.
std::vector<unsigned char> bits_of(const Model& model) {
  std::vector<unsigned char> bits;
  model.for_each_parameter([&](const ParameterName&, auto value, auto) {
    const auto* first = reinterpret_cast<const unsigned char*>(value.data());
    bits.insert(bits.end(), first, first + value.size() * sizeof(float));
  });
  return bits;
}

/// An optimizer of each kind over a model's parameters.
using MakeOptimizer = std::function<std::unique_ptr<Optimizer<float>>(Model&)>;

struct Kind {
  const char* name;
  MakeOptimizer make;
};

std::vector<Kind> kinds() {
  return {{"Sgd",
           [](Model& m) {
             return std::make_unique<Sgd<float>>(
                 m,
                 SgdOptions{.lr = 0.01, .momentum = 0.9, .dampening = 0.1, .weight_decay = 1e-3});
           }},
          {"Adam",
           [](Model& m) {
             return std::make_unique<Adam<float>>(
                 m, AdamOptions{.lr = 0.01, .beta2 = 0.95, .weight_decay = 1e-3});
           }},
          {"AdamW", [](Model& m) {
             return std::make_unique<AdamW<float>>(m, AdamWOptions{.lr = 0.01, .beta2 = 0.95});
           }}};
}

TEST(GeneratorState, ASetStateDrawsWhatTheOriginalDraws) {
  Generator original(42);
  (void)original.next_u64();
  (void)original.normal();  // leaves a spare normal behind
  ASSERT_TRUE(original.state().spare_normal.has_value());
  Generator copy(7);
  copy.set_state(original.state());
  EXPECT_EQ(copy.state(), original.state());
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(copy.normal(), original.normal());
    EXPECT_EQ(copy.next_u64(), original.next_u64());
  }
  // Without the spare the next normal would be another number: the test above can fail.
  Generator no_spare(7);
  GeneratorState state = original.state();
  (void)original.normal();
  state = original.state();
  ASSERT_TRUE(state.spare_normal.has_value());
  no_spare.set_state({state.counter, std::nullopt});
  EXPECT_NE(no_spare.normal(), original.normal());
}

TEST(TrainingState, AResumedRunEndsBitForBitWhereTheUninterruptedOneEnds) {
  constexpr int kSteps = 7, kStop = 3;
  for (const Kind& kind : kinds()) {
    SCOPED_TRACE(kind.name);
    // The uninterrupted run.
    Model straight(testing::small_gpt2(), {.seed = 1});
    auto straight_optimizer = kind.make(straight);
    Generator straight_batches(5);
    std::vector<float> straight_losses;
    for (int s = 0; s < kSteps; ++s) {
      straight_losses.push_back(train_step(straight, *straight_optimizer, straight_batches));
    }

    // The same run stopped after kStop steps and saved.
    TemporaryDirectory directory;
    const auto path = directory / "state.safetensors";
    std::vector<float> losses;
    {
      Model first(testing::small_gpt2(), {.seed = 1});
      auto optimizer = kind.make(first);
      Generator batches(5);
      for (int s = 0; s < kStop; ++s) losses.push_back(train_step(first, *optimizer, batches));
      save_training_state(path, first,
                          TrainingRun<float>{.optimizers = {{"opt", optimizer.get()}},
                                             .generators = {{"batches", &batches}},
                                             .counters = {}},
                          kStop, {{"note", "test"}});
    }
    // Fresh objects from other seeds: everything must come from the file.
    Model resumed(testing::small_gpt2(), {.seed = 99});
    auto optimizer = kind.make(resumed);
    optimizer->set_lr(0.5);
    Generator batches(12345);
    const SafetensorsFile file(path);
    EXPECT_EQ(file.metadata().at("note"), "test");
    EXPECT_EQ(load_training_state(file, resumed,
                                  {.optimizers = {{"opt", optimizer.get()}},
                                   .generators = {{"batches", &batches}},
                                   .counters = {}}),
              kStop);
    EXPECT_EQ(optimizer->step_count(), kStop);
    for (int s = kStop; s < kSteps; ++s) losses.push_back(train_step(resumed, *optimizer, batches));

    ASSERT_EQ(losses.size(), straight_losses.size());
    for (std::size_t i = 0; i < losses.size(); ++i) {
      EXPECT_EQ(std::memcmp(&losses[i], &straight_losses[i], sizeof(float)), 0) << "step " << i;
    }
    EXPECT_EQ(bits_of(resumed), bits_of(straight));
    EXPECT_EQ(optimizer->step_count(), kSteps);
    EXPECT_EQ(batches.state(), straight_batches.state());
    const OptimizerState<float> a = optimizer->state(), b = straight_optimizer->state();
    ASSERT_EQ(a.buffers.size(), b.buffers.size());
    for (const auto& [key, values] : a.buffers) {
      const Tensor<float, 1>& other = b.buffers.at(key);
      EXPECT_EQ(std::memcmp(values.data(), other.data(), sizeof(float) * values.size()), 0) << key;
    }
  }
}

TEST(TrainingState, TheFileHoldsTorchsBufferNamesInTheModulesScalar) {
  Model model(testing::small_gpt2(), {.seed = 1});
  AdamW<float> adam(model);
  Generator batches(5);
  train_step(model, adam, batches);
  std::uint64_t draws = 17;
  TemporaryDirectory directory;
  save_training_state(directory / "s.safetensors", model,
                      {.optimizers = {{"adam", &adam}},
                       .generators = {{"batches", &batches}},
                       .counters = {{"dropout", &draws}}},
                      1);
  const SafetensorsFile file(directory / "s.safetensors");
  const TensorInfo& m = file.info("optimizer.adam.exp_avg.h.0.attn.qkv.weight");
  EXPECT_EQ(m.dtype, "F32");
  EXPECT_EQ(m.shape, std::vector<index_t>{16 * 48});
  EXPECT_TRUE(file.contains("optimizer.adam.exp_avg_sq.wte.weight"));
  EXPECT_TRUE(file.contains("h.1.mlp.down.weight"));
  const auto json = nlohmann::json::parse(file.metadata().at(training_state_key));
  EXPECT_EQ(json["optimizers"]["adam"]["kind"], "AdamW");
  EXPECT_EQ(json["optimizers"]["adam"]["steps"], 1);
  EXPECT_EQ(json["counters"]["dropout"], 17);
  EXPECT_EQ(json["generators"]["batches"]["counter"].get<std::uint64_t>(), batches.state().counter);
  draws = 0;
  Generator other(0);
  AdamW<float> fresh(model);
  load_training_state(file, model,
                      {.optimizers = {{"adam", &fresh}},
                       .generators = {{"batches", &other}},
                       .counters = {{"dropout", &draws}}});
  EXPECT_EQ(draws, 17u);
  EXPECT_EQ(other.state(), batches.state());
}

TEST(TrainingState, DoubleModulesKeepTheirStateInF64) {
  // A double Linear with Nesterov momentum: the buffers go to the file as F64 and come back equal.
  Linear<double> layer(5, 3, {.seed = 2});
  Sgd<double> sgd(layer, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  Tensor<double, 2> x({2, 5}), dy({2, 3});
  Generator values(4);
  fill_normal(x, 0, 1, values);
  fill_normal(dy, 0, 1, values);
  for (int s = 0; s < 2; ++s) {
    layer.zero_grad();
    (void)layer.backward(x, dy);
    sgd.step();
  }
  TemporaryDirectory directory;
  save_training_state(directory / "d.safetensors", layer,
                      {.optimizers = {{"sgd", &sgd}}, .generators = {}, .counters = {}}, 2);
  const SafetensorsFile file(directory / "d.safetensors");
  EXPECT_EQ(file.info("optimizer.sgd.momentum_buffer.weight").dtype, "F64");
  EXPECT_EQ(file.info("weight").dtype, "F64");
  Linear<double> other(5, 3, {.seed = 9});
  Sgd<double> restored(other, {.lr = 0.1, .momentum = 0.9, .nesterov = true});
  load_training_state(file, other, {.optimizers = {{"sgd", &restored}}});
  const auto a = sgd.state(), b = restored.state();
  EXPECT_EQ(b.steps, 2);
  for (const auto& [key, buffer] : a.buffers) {
    EXPECT_EQ(std::memcmp(buffer.data(), b.buffers.at(key).data(), sizeof(double) * buffer.size()),
              0)
        << key;
  }
  // One more step on each: the same weights.
  for (auto* pair : {&layer, &other}) {
    pair->zero_grad();
    (void)pair->backward(x, dy);
  }
  sgd.step();
  restored.step();
  EXPECT_EQ(std::memcmp(layer.weight().data(), other.weight().data(), sizeof(double) * 15), 0);
}

// ---- row 96: a state that does not fit the optimizer or the run ---------------------------------

TEST(TrainingStateErrors, LoadStateRefusesAnotherOptimizerAndChangesNothing) {
  Model model(testing::small_gpt2(), {.seed = 1});
  Adam<float> adam(model, {.beta2 = 0.95});
  Generator batches(5);
  train_step(model, adam, batches);
  const OptimizerState<float> good = adam.state();
  const auto expect_refused = [&](const OptimizerState<float>& state, const std::string& message,
                                  bool shape) {
    Adam<float> target(model, {.beta2 = 0.95});
    const OptimizerState<float> before = target.state();
    try {
      target.load_state(state);
      ADD_FAILURE() << "no throw, expected: " << message;
    } catch (const ShapeError& error) {
      EXPECT_TRUE(shape) << error.what();
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
    } catch (const ConfigError& error) {
      EXPECT_FALSE(shape) << error.what();
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
    }
    EXPECT_EQ(target.step_count(), 0);
    EXPECT_EQ(target.lr(), before.lr);
    for (const auto& [key, values] : target.state().buffers) {
      for (float v : values) ASSERT_EQ(v, 0.0f) << key;
    }
  };
  OptimizerState<float> s = good;
  s.kind = "AdamW";
  expect_refused(s, "Adam::load_state: the state is of AdamW, this optimizer is Adam", false);
  s = good;
  s.hyperparameters["beta2"] = 0.999;
  expect_refused(s, "Adam::load_state: beta2 is 0.999 in the state, 0.95 in this optimizer", false);
  s = good;
  s.hyperparameters.erase("eps");
  expect_refused(s, "the state has no eps", false);
  s = good;
  std::swap(s.parameters[0], s.parameters[1]);
  expect_refused(s, "parameter 0 is \"wpe.weight\" in the state, \"wte.weight\" in this optimizer",
                 false);
  s = good;
  s.parameters.pop_back();
  expect_refused(s, "the state is of 27 parameters, this optimizer has 28", false);
  s = good;
  s.buffers.erase("exp_avg_sq.h.1.ln_2.bias");
  expect_refused(s, "the state has no buffer \"exp_avg_sq.h.1.ln_2.bias\"", false);
  s = good;
  s.buffers.emplace("momentum_buffer.wte.weight", Tensor<float, 1>(Shape<1>{1}));
  expect_refused(s, "a buffer \"momentum_buffer.wte.weight\" that Adam does not keep", false);
  s = good;
  s.buffers.at("exp_avg.ln_f.bias") = Tensor<float, 1>(Shape<1>{15});
  expect_refused(
      s, "buffer \"exp_avg.ln_f.bias\" has 15 values, parameter 27 (\"ln_f.bias\") has 16", true);
  s = good;
  s.steps = -1;
  expect_refused(s, "steps must be >= 0, got -1", false);
  s = good;
  s.lr = -1;
  expect_refused(s, "lr must be in [0, inf), got -1", false);
  // The good state itself loads: the refusals above were for their own reasons.
  Adam<float> target(model, {.beta2 = 0.95});
  target.load_state(good);
  EXPECT_EQ(target.step_count(), 1);
}

TEST(TrainingStateErrors, StateRefusesParametersThatShareAName) {
  Tensor<float, 1> a(Shape<1>{2}), da(Shape<1>{2}), b(Shape<1>{2}), db(Shape<1>{2});
  Sgd<float> sgd({parameter(a, da, "w"), parameter(b, db, "w")}, {.momentum = 0.9});
  EXPECT_THROW(
      {
        try {
          (void)sgd.state();
        } catch (const ConfigError& error) {
          EXPECT_NE(std::string(error.what()).find("parameters 0 and 1 are both named \"w\""),
                    std::string::npos);
          throw;
        }
      },
      ConfigError);
  // Unnamed parameters go by their position.
  Sgd<float> unnamed({parameter(a, da), parameter(b, db)}, {.momentum = 0.9});
  EXPECT_TRUE(unnamed.state().buffers.contains("momentum_buffer.1"));
}

/// A saved run of an AdamW over a small GPT-2, and what the tests below load it into.
struct SavedRun {
  TemporaryDirectory directory;
  std::filesystem::path path = directory / "state.safetensors";
  Model model{testing::small_gpt2(), {.seed = 1}};
  AdamW<float> adam{model};
  Generator batches{5};
  SavedRun() {
    train_step(model, adam, batches);
    save_training_state(
        path, model,
        {.optimizers = {{"adam", &adam}}, .generators = {{"batches", &batches}}, .counters = {}},
        1);
  }
};

/// `load` throws an Error of type E whose message holds `message`, and changes neither the
/// model's weights nor the optimizer's state nor the generator.
template <class E>
void expect_load_refused(const std::function<void(Model&, AdamW<float>&, Generator&)>& load,
                         const std::string& message) {
  Model model(testing::small_gpt2(), {.seed = 3});
  AdamW<float> adam(model);
  Generator batches(8);
  const auto weights = bits_of(model);
  try {
    load(model, adam, batches);
    ADD_FAILURE() << "no throw, expected: " << message;
  } catch (const E& error) {
    EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
  } catch (const Error& error) {
    ADD_FAILURE() << "another error type: " << error.what();
  }
  EXPECT_EQ(bits_of(model), weights);
  EXPECT_EQ(adam.step_count(), 0);
  for (const auto& [key, values] : adam.state().buffers) {
    for (float v : values) ASSERT_EQ(v, 0.0f) << key;
  }
  EXPECT_EQ(batches.state(), Generator(8).state());
}

TEST(TrainingStateErrors, ARunThatDiffersFromTheFileIsRefusedByName) {
  SavedRun saved;
  const SafetensorsFile file(saved.path);
  const std::string where = "load_training_state: " + saved.path.string();
  // Another optimizer group, or none of that name.
  expect_load_refused<ConfigError>(
      [&](Model& m, AdamW<float>& adam, Generator& g) {
        load_training_state(file, m,
                            {.optimizers = {{"sgd", &adam}}, .generators = {{"batches", &g}}});
      },
      where + ": holds no optimizer \"sgd\" (it holds \"adam\")");
  expect_load_refused<ConfigError>(
      [&](Model& m, AdamW<float>&, Generator& g) {
        load_training_state(file, m, {.optimizers = {}, .generators = {{"batches", &g}}});
      },
      where + ": holds a optimizer \"adam\" that this run does not have (it has none)");
  expect_load_refused<ConfigError>(
      [&](Model& m, AdamW<float>& adam, Generator&) {
        load_training_state(file, m, {.optimizers = {{"adam", &adam}}});
      },
      where + ": holds a generator \"batches\" that this run does not have");
  expect_load_refused<ConfigError>(
      [&](Model& m, AdamW<float>& adam, Generator& g) {
        std::uint64_t draws = 0;
        load_training_state(file, m,
                            {.optimizers = {{"adam", &adam}},
                             .generators = {{"batches", &g}},
                             .counters = {{"dropout", &draws}}});
      },
      where + ": holds no counter \"dropout\" (it holds none)");
  // Another kind, other hyperparameters: named through the optimizer.
  expect_load_refused<ConfigError>(
      [&](Model& m, AdamW<float>&, Generator& g) {
        Adam<float> adam(m);
        load_training_state(file, m,
                            {.optimizers = {{"adam", &adam}}, .generators = {{"batches", &g}}});
      },
      where +
          ": optimizer \"adam\": Adam::load_state: the state is of AdamW, this optimizer is Adam");
  expect_load_refused<ConfigError>(
      [&](Model& m, AdamW<float>&, Generator& g) {
        AdamW<float> adam(m, {.weight_decay = 0.1});
        load_training_state(file, m,
                            {.optimizers = {{"adam", &adam}}, .generators = {{"batches", &g}}});
      },
      "optimizer \"adam\": AdamW::load_state: weight_decay is 0.01 in the state, 0.1 in this "
      "optimizer");
  // Another parameter list: the optimizer over one layer only.
  expect_load_refused<ConfigError>(
      [&](Model& m, AdamW<float>&, Generator& g) {
        AdamW<float> adam(parameters_of(m.layers().at(0)));
        load_training_state(file, m,
                            {.optimizers = {{"adam", &adam}}, .generators = {{"batches", &g}}});
      },
      "AdamW::load_state: the state is of 28 parameters, this optimizer has 12");
}

TEST(TrainingStateErrors, AWiderModelIsRefusedWithTheOptimizerPutBack) {
  // Same parameter names, another d_ff: the optimizer's buffers do not fit (ShapeError, named),
  // and with an optimizer over a matching model the weights are refused by load_state_dict.
  SavedRun saved;
  const SafetensorsFile file(saved.path);
  TransformerConfig wide = testing::small_gpt2();
  wide.d_ff = 64;
  Model other(wide, {.seed = 3});
  AdamW<float> adam(other);
  Generator g(8);
  try {
    load_training_state(file, other,
                        {.optimizers = {{"adam", &adam}}, .generators = {{"batches", &g}}});
    ADD_FAILURE() << "no throw";
  } catch (const ShapeError& error) {
    EXPECT_NE(
        std::string(error.what())
            .find("optimizer \"adam\": AdamW::load_state: buffer \"exp_avg.h.0.mlp.up.weight\" "
                  "has 512 values, parameter 10 (\"h.0.mlp.up.weight\") has 1024"),
        std::string::npos)
        << error.what();
  }
  EXPECT_EQ(adam.step_count(), 0);
  // The optimizer over the saved model's shapes, the module wider: load_state_dict refuses after
  // the optimizer was loaded, which is then undone.
  Model same(testing::small_gpt2(), {.seed = 3});
  AdamW<float> fitting(same);
  try {
    load_training_state(file, other,
                        {.optimizers = {{"adam", &fitting}}, .generators = {{"batches", &g}}});
    ADD_FAILURE() << "no throw";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("size mismatch for h.0.mlp.up.weight"),
              std::string::npos)
        << error.what();
  }
  EXPECT_EQ(fitting.step_count(), 0);
  for (const auto& [key, values] : fitting.state().buffers) {
    for (float v : values) ASSERT_EQ(v, 0.0f) << key;
  }
  EXPECT_EQ(g.state(), Generator(8).state());
}

// ---- row 97: a file that is not a whole training state -----------------------------------------

/// The saved file's bytes with its training-state JSON replaced by `json` (the header rebuilt).
std::filesystem::path with_training_json(const SavedRun& saved, const std::string& json,
                                         const std::string& name) {
  const SafetensorsFile file(saved.path);
  std::vector<SaveEntry> entries;
  for (const TensorInfo& info : file.tensors()) {
    const auto bytes = file.bytes(info.name);
    entries.emplace_back(info.name, info.shape, StoredBytes{info.dtype, bytes});
  }
  auto metadata = file.metadata();
  if (json.empty()) {
    metadata.erase(training_state_key);
  } else {
    metadata[training_state_key] = json;
  }
  const auto path = saved.directory / name;
  save_safetensors(path, entries, metadata);
  return path;
}

TEST(TrainingStateErrors, AFileWithoutAWholeStateIsAFormatErrorNamingTheField) {
  SavedRun saved;
  const auto json =
      nlohmann::json::parse(SafetensorsFile(saved.path).metadata().at(training_state_key));
  const auto refuse = [&](const std::filesystem::path& path, const std::string& message) {
    expect_load_refused<FormatError>(
        [&](Model& m, AdamW<float>& adam, Generator& g) {
          load_training_state(SafetensorsFile(path), m,
                              {.optimizers = {{"adam", &adam}}, .generators = {{"batches", &g}}});
        },
        message);
  };
  refuse(with_training_json(saved, "", "plain.safetensors"),
         "plain.safetensors: no \"dissect.training\" metadata: not a training state");
  refuse(with_training_json(saved, "{\"version\": 1,", "cut.safetensors"),
         "cut.safetensors: dissect.training is not valid JSON");
  auto broken = json;
  broken["optimizers"]["adam"].erase("steps");
  refuse(with_training_json(saved, broken.dump(), "no_steps.safetensors"),
         "no_steps.safetensors: dissect.training.optimizers.adam has no \"steps\"");
  broken = json;
  broken["optimizers"]["adam"]["lr"] = "fast";
  refuse(with_training_json(saved, broken.dump(), "lr.safetensors"),
         "dissect.training.optimizers.adam.lr is a string, not a number");
  broken = json;
  broken["generators"]["batches"]["counter"] = -3;
  refuse(with_training_json(saved, broken.dump(), "counter.safetensors"),
         "dissect.training.generators.batches.counter is the number -3, not a whole number >= 0");
  broken = json;
  broken["version"] = 2;
  refuse(with_training_json(saved, broken.dump(), "v2.safetensors"),
         "dissect.training.version is 2, not 1");

  // A moment stored in BF16 would not resume exactly.
  {
    const SafetensorsFile file(saved.path);
    std::vector<SaveEntry> entries;
    std::vector<Tensor<float, 1>> keep;
    for (const TensorInfo& info : file.tensors()) {
      if (info.name == "optimizer.adam.exp_avg.wte.weight") {
        keep.push_back(file.load<float, 1>(info.name));
        entries.emplace_back(info.name, keep.back(), SaveDtype::bf16);
      } else {
        entries.emplace_back(info.name, info.shape, StoredBytes{info.dtype, file.bytes(info.name)});
      }
    }
    save_safetensors(saved.directory / "bf16.safetensors", entries, file.metadata());
  }
  refuse(saved.directory / "bf16.safetensors",
         "tensor \"optimizer.adam.exp_avg.wte.weight\" is BF16, the training state keeps F32");
}

TEST(TrainingStateErrors, ATruncatedFileIsAFormatErrorNamingIt) {
  SavedRun saved;
  const auto bytes = testing::read_file(saved.path);
  const auto path = saved.directory / "truncated.safetensors";
  const std::vector<std::byte> cut(bytes.begin(), bytes.end() - 100);
  testing::write_file(path, cut);
  try {
    const SafetensorsFile file(path);
    ADD_FAILURE() << "a truncated file opened";
  } catch (const FormatError& error) {
    EXPECT_NE(std::string(error.what()).find("truncated.safetensors"), std::string::npos)
        << error.what();
  }
}

TEST(TrainingStateErrors, SaveRefusesNamesThatWouldCollide) {
  Model model(testing::small_gpt2(), {.seed = 1});
  AdamW<float> a(model), b(model);
  TemporaryDirectory directory;
  const auto path = directory / "s.safetensors";
  const auto refuse = [&](const TrainingRun<float>& run, const std::string& message,
                          std::map<std::string, std::string> metadata = {}, index_t step = 0) {
    try {
      save_training_state(path, model, run, step, metadata);
      ADD_FAILURE() << "no throw, expected " << message;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(message), std::string::npos) << error.what();
    }
    EXPECT_FALSE(std::filesystem::exists(path));
  };
  refuse({.optimizers = {{"x", &a}, {"x", &b}}}, "two optimizers are named \"x\"");
  refuse({.optimizers = {{"", &a}}}, "a optimizer has no name");
  refuse({.optimizers = {{"a.b", &a}}}, "optimizer \"a.b\": a name has no '.'");
  refuse({.optimizers = {{"a", &a}}}, "the metadata key \"dissect.training\"",
         {{training_state_key, "{}"}});
  refuse({.optimizers = {{"a", &a}}}, "step must be >= 0, got -1", {}, -1);
}

}  // namespace test_training_state
}  // namespace dissect
