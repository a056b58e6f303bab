// dissect/io/training_state.hpp — a training run saved whole, so that it can be stopped and
// resumed bit for bit: the weights, every optimizer's state (step count, lr, moments or momentum),
// every generator's state (the batch sampler's position), named counters (a Dropout cache's
// draws) and the step reached, in one safetensors file written atomically.
//
// The file's tensors:
//   <parameter name>                           the module's weights, as save_module writes them
//   optimizer.<group>.<buffer>.<parameter>     each optimizer's buffers, torch's names:
//                                              optimizer.adam.exp_avg.0.weight, …
//   extra.<name>                               whatever the caller adds (a run's loss curves)
// all in the module's own scalar (F32 for float, F64 for double): never rounded. Its
// "__metadata__" holds the caller's strings and, under "dissect.training", a JSON object:
//   {"version": 1, "step": 120,
//    "optimizers": {"adam": {"kind": "AdamW", "steps": 120, "lr": 0.0029,
//                            "hyperparameters": {"beta1": 0.9, …}, "parameters": ["0.weight", …]}},
//    "generators": {"batches": {"counter": 11400714819323198485, "spare_normal": null}},
//    "counters": {"dropout": 240}}
// (doubles as JSON numbers, which nlohmann-json writes in their shortest form that reads back to
// the same bits; 64-bit words as unsigned integers).
//
// load_training_state checks the file against the run before anything changes: the optimizers,
// generators and counters by name, each optimizer's kind, hyperparameters and parameter list, and
// every tensor's presence, dtype and shape; a refused load leaves every object as it was.
#pragma once

#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/error.hpp"
#include "dissect/io/detail/json.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/io/state_dict.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"
#include "dissect/training/optim.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// The metadata key of the training state's JSON.
inline constexpr const char* training_state_key = "dissect.training";

/// What a training run holds beside its module's weights, as live objects under the names the
/// file keeps them by. save_training_state reads them; load_training_state writes them.
template <class Scalar>
struct TrainingRun {
  /// The optimizers, one per parameter group ("matrices", "others"; or a single "adam").
  std::vector<std::pair<std::string, Optimizer<Scalar>*>> optimizers;
  /// The generators whose position matters to what comes next (the batch sampler's).
  std::vector<std::pair<std::string, Generator*>> generators;
  /// Plain 64-bit counters (Dropout::Cache::draws).
  std::vector<std::pair<std::string, std::uint64_t*>> counters;
};

/// Writes `module`'s weights, `run`'s state, `step` (the training progress) and `metadata` to
/// `path`, atomically (as save_safetensors). `extra` tensors must be named "extra.…".
/// @throws Error before anything is written for an empty or repeated name in `run`, a name of
///         `extra` outside "extra.", a parameter of `module` named "optimizer.…" or "extra.…", a
///         `metadata` key "dissect.training", or step < 0; ConfigError from Optimizer::state for
///         parameters that share a name; as save_safetensors.
template <Module M>
void save_training_state(const std::filesystem::path& path, const M& module,
                         const TrainingRun<typename M::scalar_type>& run, index_t step,
                         const std::map<std::string, std::string>& metadata = {},
                         std::span<const SaveEntry> extra = {});

/// Restores `module`'s weights and `run`'s state from `file` (save_training_state's) and returns
/// the step it records. The caller reads its own metadata and extra tensors from `file`.
/// @throws FormatError naming the file and the field for a file without "dissect.training", JSON
///         that is not valid or a field missing or mistyped, or a tensor stored in another dtype
///         than the module's scalar; ConfigError naming the file and the optimizer, generator or
///         counter for a name the run has and the file lacks or the other way round, another
///         optimizer kind, another hyperparameter, another parameter list or order, a missing
///         buffer; ShapeError naming the file and the buffer for one of another size; Error as
///         load_state_dict (strict: missing, unexpected and mis-shaped weights). Nothing changes
///         on a throw.
template <Module M>
index_t load_training_state(const SafetensorsFile& file, M& module,
                            const TrainingRun<typename M::scalar_type>& run);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline constexpr std::string_view optimizer_prefix = "optimizer.";
inline constexpr std::string_view extra_prefix = "extra.";

/// Error unless the names in `items` are non-empty and distinct.
template <class Item>
void check_run_names(const std::vector<std::pair<std::string, Item>>& items, const char* what) {
  std::set<std::string> seen;
  for (const auto& [name, item] : items) {
    if (name.empty()) throw Error(concat("save_training_state: a ", what, " has no name"));
    if (item == nullptr) {
      throw Error(concat("save_training_state: ", what, " \"", name, "\" is null"));
    }
    if (!seen.insert(name).second) {
      throw Error(concat("save_training_state: two ", what, "s are named \"", name, "\""));
    }
    // A group's buffers are found by the prefix "optimizer.<group>.": no group may be another's
    // prefix.
    if (name.find('.') != std::string::npos) {
      throw Error(concat("save_training_state: ", what, " \"", name, "\": a name has no '.'"));
    }
  }
}

/// Reads a training state's JSON fields; every failure is a FormatError naming the file and the
/// field's path ("dissect.training.optimizers.adam.steps").
class TrainingJson {
 public:
  explicit TrainingJson(std::string where) : where_(std::move(where)) {}

  const nlohmann::json& member(const nlohmann::json& object, const std::string& field,
                               const std::string& path) const {
    const auto found = object.find(field);
    if (found == object.end()) fail(path, concat("has no \"", field, "\""));
    return *found;
  }
  const nlohmann::json& object(const nlohmann::json& value, const std::string& path) const {
    if (!value.is_object()) fail(path, concat("is ", describe_json(value), ", not an object"));
    return value;
  }
  std::uint64_t unsigned_integer(const nlohmann::json& value, const std::string& path) const {
    if (!value.is_number_unsigned() &&
        !(value.is_number_integer() && value.get<std::int64_t>() >= 0))
      fail(path, concat("is ", describe_json(value), ", not a whole number >= 0"));
    return value.get<std::uint64_t>();
  }
  index_t count(const nlohmann::json& value, const std::string& path) const {
    const std::uint64_t number = unsigned_integer(value, path);
    if (number > static_cast<std::uint64_t>(std::numeric_limits<index_t>::max()))
      fail(path, concat("is ", number, ", beyond int64"));
    return static_cast<index_t>(number);
  }
  double real(const nlohmann::json& value, const std::string& path) const {
    if (!value.is_number()) fail(path, concat("is ", describe_json(value), ", not a number"));
    return value.get<double>();
  }
  std::string text(const nlohmann::json& value, const std::string& path) const {
    if (!value.is_string()) fail(path, concat("is ", describe_json(value), ", not a string"));
    return value.get<std::string>();
  }
  [[noreturn]] void fail(const std::string& path, const std::string& problem) const {
    throw FormatError(concat(where_, ": ", path, " ", problem));
  }

 private:
  std::string where_;
};

/// ConfigError naming the file unless the names `file_names` holds are those of `items`.
template <class Item>
void check_same_names(const std::vector<std::pair<std::string, Item>>& items,
                      const nlohmann::json& file_names, const char* what,
                      const std::string& where) {
  std::set<std::string> ours, theirs;
  for (const auto& [name, item] : items) ours.insert(name);
  for (const auto& [name, value] : file_names.items()) theirs.insert(name);
  const auto list = [](const std::set<std::string>& names) {
    std::string text;
    for (const auto& name : names) text += concat(text.empty() ? "" : ", ", "\"", name, "\"");
    return text.empty() ? std::string("none") : text;
  };
  for (const auto& name : ours) {
    if (!theirs.contains(name)) {
      throw ConfigError(
          concat(where, ": holds no ", what, " \"", name, "\" (it holds ", list(theirs), ")"));
    }
  }
  for (const auto& name : theirs) {
    if (!ours.contains(name)) {
      throw ConfigError(concat(where, ": holds a ", what, " \"", name,
                               "\" that this run does not have (it has ", list(ours), ")"));
    }
  }
}

/// `error`'s own type, with `prefix` before its message.
[[noreturn]] inline void rethrow_prefixed(const Error& error, const std::string& prefix) {
  const std::string message = concat(prefix, error.what());
  if (dynamic_cast<const ShapeError*>(&error)) throw ShapeError(message);
  if (dynamic_cast<const ConfigError*>(&error)) throw ConfigError(message);
  if (dynamic_cast<const FormatError*>(&error)) throw FormatError(message);
  throw Error(message);
}

}  // namespace detail

template <Module M>
void save_training_state(const std::filesystem::path& path, const M& module,
                         const TrainingRun<typename M::scalar_type>& run, index_t step,
                         const std::map<std::string, std::string>& metadata,
                         std::span<const SaveEntry> extra) {
  using Scalar = typename M::scalar_type;
  const std::string op = detail::concat("save_training_state: ", path.string());
  if (step < 0) throw Error(detail::concat(op, ": step must be >= 0, got ", step));
  if (metadata.contains(training_state_key)) {
    throw Error(detail::concat(op, ": the metadata key \"", training_state_key,
                               "\" is the training state's own"));
  }
  detail::check_run_names(run.optimizers, "optimizer");
  detail::check_run_names(run.generators, "generator");
  detail::check_run_names(run.counters, "counter");

  std::vector<SaveEntry> entries;
  module.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    const std::string text = name.str();
    if (text.starts_with(detail::optimizer_prefix) || text.starts_with(detail::extra_prefix)) {
      throw Error(detail::concat(op, ": the module's parameter \"", text,
                                 "\" would collide with the training state's names"));
    }
    entries.emplace_back(text, value);
  });
  for (const SaveEntry& entry : extra) {
    if (!entry.name.starts_with(detail::extra_prefix)) {
      throw Error(
          detail::concat(op, ": the extra tensor \"", entry.name, "\" must be named \"extra.…\""));
    }
    entries.push_back(entry);
  }
  nlohmann::json json = {{"version", 1}, {"step", step}};
  json["optimizers"] = nlohmann::json::object();
  // The states are copies: they must outlive `entries`, which borrow their values.
  std::vector<OptimizerState<Scalar>> states;
  states.reserve(run.optimizers.size());
  for (const auto& [group, optimizer] : run.optimizers) {
    const OptimizerState<Scalar>& state = states.emplace_back(optimizer->state());
    json["optimizers"][group] = {{"kind", state.kind},
                                 {"steps", state.steps},
                                 {"lr", state.lr},
                                 {"hyperparameters", state.hyperparameters},
                                 {"parameters", state.parameters}};
    for (const auto& [key, values] : state.buffers) {
      entries.emplace_back(detail::concat(detail::optimizer_prefix, group, ".", key), values);
    }
  }
  json["generators"] = nlohmann::json::object();
  for (const auto& [name, generator] : run.generators) {
    const GeneratorState state = generator->state();
    json["generators"][name] = {{"counter", state.counter}, {"spare_normal", nullptr}};
    if (state.spare_normal) json["generators"][name]["spare_normal"] = *state.spare_normal;
  }
  json["counters"] = nlohmann::json::object();
  for (const auto& [name, counter] : run.counters) json["counters"][name] = *counter;

  std::map<std::string, std::string> all = metadata;
  all.emplace(training_state_key, json.dump());
  save_safetensors(path, entries, all);
}

template <Module M>
index_t load_training_state(const SafetensorsFile& file, M& module,
                            const TrainingRun<typename M::scalar_type>& run) {
  using Scalar = typename M::scalar_type;
  const std::string where = detail::concat("load_training_state: ", file.path().string());
  const std::string_view own_dtype = std::is_same_v<Scalar, float> ? "F32" : "F64";
  const auto found = file.metadata().find(training_state_key);
  if (found == file.metadata().end()) {
    throw FormatError(detail::concat(where, ": no \"", training_state_key,
                                     "\" metadata: not a training state (save_training_state "
                                     "writes one)"));
  }
  const detail::TrainingJson read(where);
  const std::string root = training_state_key;
  const nlohmann::json json = read.object(
      detail::parse_json_strictly(found->second, detail::concat(where, ": ", root)), root);
  const std::uint64_t version =
      read.unsigned_integer(read.member(json, "version", root), root + ".version");
  if (version != 1) read.fail(root + ".version", detail::concat("is ", version, ", not 1"));
  const index_t step = read.count(read.member(json, "step", root), root + ".step");
  const nlohmann::json& optimizers =
      read.object(read.member(json, "optimizers", root), root + ".optimizers");
  const nlohmann::json& generators =
      read.object(read.member(json, "generators", root), root + ".generators");
  const nlohmann::json& counters =
      read.object(read.member(json, "counters", root), root + ".counters");
  detail::check_same_names(run.optimizers, optimizers, "optimizer", where);
  detail::check_same_names(run.generators, generators, "generator", where);
  detail::check_same_names(run.counters, counters, "counter", where);

  // Every stored tensor of ours must be in the module's scalar: a rounded moment or weight would
  // not continue the run exactly.
  const auto check_dtype = [&](const std::string& name) {
    const TensorInfo& info = file.info(name);
    if (info.dtype != own_dtype) {
      throw FormatError(detail::concat(where, ": tensor \"", name, "\" is ", info.dtype,
                                       ", the training state keeps ", own_dtype,
                                       " (the module's scalar), exactly"));
    }
  };
  module.for_each_parameter([&](const ParameterName& name, auto, auto) {
    if (file.contains(name.str())) check_dtype(name.str());
  });

  // Each optimizer's state as a value, read from the file.
  std::vector<OptimizerState<Scalar>> states;
  for (const auto& [group, optimizer] : run.optimizers) {
    const std::string at = detail::concat(root, ".optimizers.", group);
    const nlohmann::json& entry = read.object(optimizers.at(group), at);
    OptimizerState<Scalar>& state = states.emplace_back();
    state.kind = read.text(read.member(entry, "kind", at), at + ".kind");
    state.steps = read.count(read.member(entry, "steps", at), at + ".steps");
    state.lr = read.real(read.member(entry, "lr", at), at + ".lr");
    const nlohmann::json& hyper =
        read.object(read.member(entry, "hyperparameters", at), at + ".hyperparameters");
    for (const auto& [field, value] : hyper.items()) {
      state.hyperparameters.emplace(field, read.real(value, at + ".hyperparameters." + field));
    }
    const nlohmann::json& names = read.member(entry, "parameters", at);
    if (!names.is_array()) {
      read.fail(at + ".parameters",
                detail::concat("is ", detail::describe_json(names), ", not an array"));
    }
    for (std::size_t i = 0; i < names.size(); ++i) {
      state.parameters.push_back(read.text(names[i], detail::concat(at, ".parameters[", i, "]")));
    }
    const std::string prefix = detail::concat(detail::optimizer_prefix, group, ".");
    for (const std::string& name : file.tensor_names()) {
      if (!name.starts_with(prefix)) continue;
      check_dtype(name);
      const TensorInfo& info = file.info(name);
      if (info.shape.size() != 1) {
        throw ShapeError(detail::concat(where, ": tensor \"", name, "\" has shape ",
                                        format_shape(info.shape), ", an optimizer buffer is 1-D"));
      }
      state.buffers.emplace(name.substr(prefix.size()), file.load<Scalar, 1>(name));
    }
  }
  std::vector<GeneratorState> generator_states;
  for (const auto& [name, generator] : run.generators) {
    const std::string at = detail::concat(root, ".generators.", name);
    const nlohmann::json& entry = read.object(generators.at(name), at);
    GeneratorState& state = generator_states.emplace_back();
    state.counter = read.unsigned_integer(read.member(entry, "counter", at), at + ".counter");
    const nlohmann::json& spare = read.member(entry, "spare_normal", at);
    if (!spare.is_null()) state.spare_normal = read.real(spare, at + ".spare_normal");
  }
  std::vector<std::uint64_t> counter_values;
  for (const auto& [name, counter] : run.counters) {
    counter_values.push_back(
        read.unsigned_integer(counters.at(name), detail::concat(root, ".counters.", name)));
  }

  // Optimizers first, each checked by load_state and undone if a later one or the weights are
  // refused (restoring a state the optimizer itself gave cannot fail).
  std::vector<OptimizerState<Scalar>> backups;
  std::size_t loaded = 0;
  try {
    for (std::size_t i = 0; i < run.optimizers.size(); ++i) {
      const auto& [group, optimizer] = run.optimizers[i];
      backups.push_back(optimizer->state());
      try {
        optimizer->load_state(states[i]);
      } catch (const Error& error) {
        detail::rethrow_prefixed(error, detail::concat(where, ": optimizer \"", group, "\": "));
      }
      ++loaded;
    }
    LoadOptions options;
    options.ignore = [](std::string_view name) {
      return name.starts_with(detail::optimizer_prefix) || name.starts_with(detail::extra_prefix);
    };
    load_state_dict(module, file, options);
  } catch (...) {
    for (std::size_t i = 0; i < loaded; ++i) run.optimizers[i].second->load_state(backups[i]);
    throw;
  }
  for (std::size_t i = 0; i < run.generators.size(); ++i) {
    run.generators[i].second->set_state(generator_states[i]);
  }
  for (std::size_t i = 0; i < run.counters.size(); ++i) *run.counters[i].second = counter_values[i];
  return step;
}

}  // namespace dissect
