// examples/common/training_state.hpp — what a byte-level LM run (char_lm.hpp) keeps in its
// resumable training state beside the library's part (dissect/io/training_state.hpp: weights,
// optimizers, generators, step): its loss curves, so that a resumed run reports and draws the
// whole run, and the flags that fix its trajectory, so that a resume with other flags is refused.
//
// NOT part of the dissect library: example-only.
#pragma once

#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/char_lm.hpp"
#include "common/cli.hpp"
#include "dissect/io/safetensors.hpp"

namespace dissect::examples {

/// The metadata key of the run's flags (a JSON object: flag → its value as text).
inline constexpr const char* run_flags_key = "dissect.run_flags";

/// The curves as the state file's extra tensors (F64, exact), borrowing `curves`' values: keep
/// them alive until the save returns.
inline std::vector<SaveEntry> curves_tensors(const Curves& curves) {
  const auto entry = [](const char* name, const std::vector<double>& values) {
    return SaveEntry(name, {static_cast<index_t>(values.size())}, std::span<const double>(values));
  };
  return {entry("extra.curves.step", curves.step), entry("extra.curves.lr", curves.lr),
          entry("extra.curves.train", curves.train),
          entry("extra.curves.val_step", curves.val_step), entry("extra.curves.val", curves.val)};
}

/// The curves curves_tensors saved, which must cover `steps` steps.
/// @throws UsageError naming `flag` and the file if one is missing, not F64 or of the wrong length.
inline Curves curves_from(const SafetensorsFile& file, index_t steps, const std::string& flag) {
  const auto read = [&](const char* name, std::vector<double>& out, index_t expected) {
    if (!file.contains(name) || file.info(name).dtype != "F64" ||
        file.info(name).shape.size() != 1 ||
        (expected >= 0 && file.info(name).shape[0] != expected)) {
      throw UsageError(flag + ": " + file.path().string() + " has no " + name + " of " +
                       (expected >= 0 ? std::to_string(expected) : std::string("some")) +
                       " F64 values (not a training state of this program?)");
    }
    const auto values = file.load<double, 1>(name);
    out.assign(values.begin(), values.end());
  };
  Curves curves;
  read("extra.curves.step", curves.step, steps);
  read("extra.curves.lr", curves.lr, steps);
  read("extra.curves.train", curves.train, steps);
  read("extra.curves.val_step", curves.val_step, -1);
  read("extra.curves.val", curves.val, static_cast<index_t>(curves.val_step.size()));
  if (curves.val.empty()) {  // the evaluation before training is always there
    throw UsageError(flag + ": " + file.path().string() + " holds no validation loss");
  }
  return curves;
}

/// `run_flags` as the metadata value run_flags_key keeps.
inline std::string run_flags_text(const std::map<std::string, std::string>& run_flags) {
  return nlohmann::json(run_flags).dump();
}

/// Checks that `file` was written by a run with the same `run_flags` (flag → value).
/// @throws UsageError naming `flag`, the file and the first flag that differs.
inline void check_run_flags(const SafetensorsFile& file,
                            const std::map<std::string, std::string>& run_flags,
                            const std::string& flag) {
  const std::string at = flag + ": " + file.path().string();
  const auto found = file.metadata().find(run_flags_key);
  const nlohmann::json theirs = found == file.metadata().end()
                                    ? nlohmann::json()
                                    : nlohmann::json::parse(found->second, nullptr, false);
  if (!theirs.is_object()) {
    throw UsageError(at + " records no run flags (\"" + run_flags_key +
                     "\"): not a training state of this program");
  }
  for (const auto& [name, value] : run_flags) {
    const auto their = theirs.find(name);
    const std::string recorded =
        their != theirs.end() && their->is_string() ? their->get<std::string>() : "(unset)";
    if (recorded != value) {
      throw UsageError(at + " was written by a run with " + name + " " + recorded +
                       ", this run has " + name + " " + value +
                       " (a resumed run repeats the flags of the run it continues)");
    }
  }
}

}  // namespace dissect::examples
