// tools/dissect/command.hpp — what the `dissect` command's subcommands share: the Command each of
// them is (its constructor declares the subcommand and its flags, run() reads their values and
// runs it), the exit statuses, and the helpers more than one command uses. dissect.cpp holds the
// table of commands; each lives in its own <name>_command.hpp.
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/io/safetensors.hpp"

namespace dissect::tools {

inline constexpr int exit_ok = 0;
inline constexpr int exit_other = 1;
inline constexpr int exit_bad_input = 2;

/// One subcommand of `dissect`. The constructor adds it to the app with its flags, which CLI11
/// writes into the command's own members: so a command neither copies nor moves. run() is called
/// once the command line is parsed; it reads the flags' values (parse.hpp) before any file opens,
/// so every flag's error names it and nothing is loaded or printed for a command that cannot run.
class Command {
 public:
  Command(const Command&) = delete;
  Command& operator=(const Command&) = delete;
  virtual ~Command() = default;

  /// The subcommand as CLI11 holds it: its name, and whether the command line chose it.
  CLI::App& app() const { return *app_; }

  /// Runs the command: its exit status. @throws dissect::Error on bad input (exit 2).
  virtual int run() = 0;

 protected:
  explicit Command(CLI::App* app) : app_(app) {}

 private:
  CLI::App* app_;
};

/// `value` with `decimals` digits after the point.
inline std::string fixed(double value, int decimals) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(decimals) << value;
  return out.str();
}

// The output must not be a file the checkpoint was read from: the input would be gone (or, for
// a shard of a sharded checkpoint, the checkpoint left half replaced) when the write lands.
inline void refuse_overwriting_the_input(const dissect::DetectedCheckpoint& source,
                                         const std::filesystem::path& out, std::string_view op) {
  std::vector<std::filesystem::path> inputs = {source.checkpoint.path()};
  for (const auto& shard : source.checkpoint.shards()) inputs.push_back(shard.path());
  if (!source.config_file.empty()) inputs.push_back(source.config_file);
  for (const auto& input : inputs) {
    if (dissect::io::same_file(input, out)) {
      throw dissect::ConfigError(dissect::concat(op, ": output ", out.string(), " is ",
                                                 input.string(),
                                                 ", which the checkpoint is read from"));
    }
  }
}

}  // namespace dissect::tools
