// examples/common/cli.hpp — what the example programs share on their command line: CLI11
// parsing with one set of exit statuses, range checks of flag values, and output files checked
// before any work is done.
//
// NOT part of the dissect library: example-only. Exit statuses: 0 success, 2 bad input (a flag,
// an output path that cannot be written, a missing or corrupt data file), 1 anything else.
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

namespace dissect::examples {

inline constexpr int kExitFailure = 1, kExitBadInput = 2;

/// The --help footer every example ends with.
inline constexpr const char* kExitStatusHelp =
    "Exit status: 0 success; 2 bad input (a flag, an output path that cannot be written, a "
    "missing or corrupt data file); 1 any other failure.";

/// Input that cannot be used, its message naming the flag: the programs print it and exit with
/// kExitBadInput.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// A check for an integer flag: CLI11 2.1 silently reads a number too large for the type as its
/// maximum, and "-1" into an unsigned as 2^64 − 1; this lets only decimal integers that fit pass.
template <class Integer>
CLI::Validator whole_number() {
  return CLI::Validator(
      [](std::string& text) {
        Integer value{};
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
        if (ec == std::errc() && end == text.data() + text.size()) return std::string();
        return "\"" + text + "\" is not a whole number in [" +
               std::to_string(std::numeric_limits<Integer>::min()) + ", " +
               std::to_string(std::numeric_limits<Integer>::max()) + "]";
      },
      "");
}

/// Declares an example's flags group by group: option(name, value, metavar, help) adds one under
/// the current help group with its metavariable, and gives integers (and optional integers) the
/// whole_number check. Returns the CLI11 option, for ->required() and the like.
class FlagDeclarer {
 public:
  explicit FlagDeclarer(CLI::App& app) : app_(app) {}
  void group(std::string name) { group_ = std::move(name); }
  /// The current help group, for flags declared on the app directly (add_flag).
  const std::string& group() const { return group_; }
  template <class Value>
  CLI::Option* operator()(const char* name, Value& value, const char* metavar,
                          const std::string& help) {
    CLI::Option* added = app_.add_option(name, value, help)->type_name(metavar)->group(group_);
    if constexpr (std::is_integral_v<Value>) added->check(whole_number<Value>());
    if constexpr (requires { typename Value::value_type; }) {
      if constexpr (std::is_same_v<Value, std::optional<typename Value::value_type>> &&
                    std::is_integral_v<typename Value::value_type>) {
        added->check(whole_number<typename Value::value_type>());
      }
    }
    return added;
  }

 private:
  CLI::App& app_;
  std::string group_;
};

/// @throws UsageError "flag: must be in [low, high], got value" unless low <= value <= high.
template <class Integer>
void check_range(const char* flag, Integer value, Integer low, Integer high) {
  if (value < low || value > high) {
    throw UsageError(std::string(flag) + ": must be in [" + std::to_string(low) + ", " +
                     std::to_string(high) + "], got " + std::to_string(value));
  }
}

/// value >= low (> low unless `inclusive`), value < high, and finite: NaN fails every
/// comparison. @throws UsageError naming the flag otherwise.
inline void check_real(const char* flag, double value, double low, bool inclusive,
                       double high = HUGE_VAL) {
  if ((inclusive ? value >= low : value > low) && value < high) return;
  char text[160];
  if (high < HUGE_VAL) {
    std::snprintf(text, sizeof text, "%s: must be in [%g, %g), got %g", flag, low, high, value);
  } else {
    std::snprintf(text, sizeof text, "%s: must be a finite number %s %g, got %g", flag,
                  inclusive ? ">=" : ">", low, value);
  }
  throw UsageError(text);
}

/// Parses argv into `app`'s options. Returns the status to exit with right away — 0 after --help
/// has been printed, kExitBadInput after a parse error, printed with the program's name — or
/// nullopt to go on.
inline std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
    return std::nullopt;
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);  // --help: printed, success
    std::cerr << app.get_name() << ": " << error.what() << "\n(see " << app.get_name()
              << " --help)\n";
    return kExitBadInput;
  }
}

/// Runs `body` (returning an exit status) and turns an exception that escapes it into a message
/// naming the program and a status: kExitBadInput for a UsageError or one of the `BadInput`
/// types, kExitFailure for anything else.
template <class... BadInput, class Body>
int run_program(std::string_view program, Body&& body) {
  try {
    return body();
  } catch (const std::exception& error) {
    const bool usage = dynamic_cast<const UsageError*>(&error) != nullptr;
    const bool bad_input = usage || (... || (dynamic_cast<const BadInput*>(&error) != nullptr));
    std::cerr << program << ": " << error.what() << "\n";
    if (usage) std::cerr << "(see " << program << " --help)\n";
    return bad_input ? kExitBadInput : kExitFailure;
  }
}

/// An output file given by a flag ("none" or empty: no file). The constructor checks that the
/// path can be written by opening it to append, which creates it if missing but leaves an
/// existing file intact: a bad path then fails at once, not after the whole run, and a run that
/// fails later neither clobbers the previous file nor leaves an empty new one behind.
class OutputFile {
 public:
  /// @throws UsageError naming the flag and the path if the path cannot be opened for writing.
  OutputFile(std::string flag, std::string path) : flag_(std::move(flag)), path_(std::move(path)) {
    if (!enabled()) return;
    std::error_code ec;
    created_ = !std::filesystem::exists(path_, ec);
    std::ofstream probe(path_, std::ios::app);
    if (!probe) {
      throw UsageError(flag_ + ": cannot open \"" + path_ + "\" for writing (" +
                       std::strerror(errno) + ")");
    }
  }
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;
  ~OutputFile() {
    std::error_code ec;
    if (created_ && !written_) std::filesystem::remove(path_, ec);
  }

  bool enabled() const { return !path_.empty() && path_ != "none"; }
  /// Records that another writer (an atomic save that renames its file over this path) wrote
  /// the file, so that it is kept.
  void written_elsewhere() { written_ = true; }
  const std::string& path() const { return path_; }

  /// Replaces the file's contents with `text` (nothing if not enabled()). @throws
  /// std::runtime_error naming the path if the write fails (a full disk, a path removed since).
  void write(std::string_view text) {
    if (!enabled()) return;
    std::ofstream file(path_, std::ios::binary | std::ios::trunc);
    file << text;
    file.close();
    if (!file) throw std::runtime_error(flag_ + ": cannot write \"" + path_ + "\"");
    written_ = true;
  }

 private:
  std::string flag_, path_;
  bool created_ = false, written_ = false;
};

/// The main() of an example whose one flag is --svg (default `<name>.svg`): parses the command
/// line, opens the figure's file before any work, and returns body(figure)'s status.
template <class Body>
int figure_example_main(int argc, char** argv, const char* name, const char* description,
                        Body&& body) {
  CLI::App app(description, name);
  std::string svg_path = std::string(name) + ".svg";
  app.add_option("--svg", svg_path, "where the figure goes (\"none\" for no figure)")
      ->capture_default_str();
  app.footer(kExitStatusHelp);
  if (const auto status = parse_command_line(app, argc, argv)) return *status;
  return run_program(name, [&] {
    OutputFile figure("--svg", svg_path);
    return body(figure);
  });
}

}  // namespace dissect::examples
