// tools/dissect/dissect.cpp — the `dissect` command: take a checkpoint apart, or run it.
//
//   dissect inspect CHECKPOINT [--gpu-memory 24GB] [--context T] [--json]
//   dissect inspect FILE.gguf [--json [--full]]
//   dissect generate CHECKPOINT|FILE.gguf (--prompt TEXT | --tokens 464,2068,…) [--ids]
//                    [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]
//                    [--repetition-penalty R] [--frequency-penalty F] [--presence-penalty P]
//                    [--seed S] [--num-beams N [--length-penalty X] [--num-return-sequences K]]
//                    [--draft CHECKPOINT [--gamma N]]
//                    [--threads N] [--no-pack]
//   dissect quantize IN OUT --format bf16|int8|q4
//   dissect quantize IN.gguf OUT.gguf --format q8_0|q4_0|q6_k|q4_k_m|q5_k_m
//   dissect convert IN.gguf OUT_DIR [--type f32|f16|bf16]
//   dissect convert CHECKPOINT OUT.gguf [--type f32|f16|bf16|q8_0|…] [--no-tokenizer]
//   dissect tokenize --tokenizer (FILE | DIR | FILE.gguf) (--text T | --file F | --decode 1,2,3)
//                    [--no-special] [--json]
//   dissect template MODEL_OR_TOKENIZER --messages FILE.json [--add-generation-prompt]
//                    [--tools FILE.json] [--template NAME] [--var KEY=VALUE]…
//   dissect serve CHECKPOINT|FILE.gguf [--host 127.0.0.1] [--port 8080] [--threads 4] [--name N]
//                 [--allow-remote]
//
// Each command is a file of its own, declaring its flags and running it (command.hpp says how):
// inspect_command.hpp, generate_command.hpp, tokenize_command.hpp, template_command.hpp,
// quantize_command.hpp, convert_command.hpp, serve_command.hpp. This file holds the table of
// commands, the usage they share and the errors every command ends with.
//
// CHECKPOINT is a .safetensors file, a sharded checkpoint's index .json, or a directory holding
// either (with a Hugging Face config.json beside them, or a file dissect's save_model wrote,
// whose metadata holds its config): io/open_model.hpp's detect_checkpoint tells which, and
// io/hf_names.hpp says what Hugging Face's tensor names mean. All parsing, arithmetic and
// loading live in the library (io/, count.hpp, budget.hpp, models/); the commands read flags and
// print.
// Every flag is read and checked before any file is opened (and what the model's config decides,
// a token id against the vocabulary or the prompt's length against the context, before its weights
// load), so a command that cannot run prints nothing on stdout.
// Exit status: 0 ok; 2 bad input (a flag, a missing or corrupt file, a config dissect cannot
// build); 1 anything else.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <exception>
#include <iostream>
#include <stdexcept>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "tools/dissect/command.hpp"
#include "tools/dissect/convert_command.hpp"
#include "tools/dissect/generate_command.hpp"
#include "tools/dissect/inspect_command.hpp"
#include "tools/dissect/quantize_command.hpp"
#ifdef DISSECT_SERVE
#include "tools/dissect/serve_command.hpp"
#endif
#include "tools/dissect/template_command.hpp"
#include "tools/dissect/tokenize_command.hpp"

namespace {

using dissect::tools::exit_bad_input;
using dissect::tools::exit_other;

int run(int argc, char** argv) {
  CLI::App app{"dissect: take a language-model checkpoint apart, or run it"};
  app.require_subcommand(1);
  app.footer(
      "Exit status: 0 ok; 2 bad input (a flag, a missing or corrupt file, a config dissect "
      "cannot build); 1 any other failure.");

  // The commands, in the order --help lists them. Each declares its flags on `app` here; its
  // run() parses their values after the command line is read, before any file is opened.
  namespace tools = dissect::tools;
  tools::InspectCommand inspect(app);
  tools::GenerateCommand generate(app);
  tools::TokenizeCommand tokenize(app);
  tools::TemplateCommand chat_template(app);
  tools::QuantizeCommand quantize(app);
  tools::ConvertCommand convert(app);
  std::vector<tools::Command*> commands = {&inspect,       &generate, &tokenize,
                                           &chat_template, &quantize, &convert};
#ifdef DISSECT_SERVE
  tools::ServeCommand serve(app);
  commands.push_back(&serve);
#endif

  // CLI11 would call an unknown word a missing subcommand; name it instead.
  const std::string_view command = argc > 1 ? argv[1] : "";
#ifndef DISSECT_SERVE
  if (command == "serve") {
    std::cerr << "dissect: serve: this dissect was built without cpp-httplib "
                 "(libcpp-httplib-dev), which serve needs\n";
    return exit_bad_input;
  }
#endif
  const bool known = std::any_of(commands.begin(), commands.end(),
                                 [&](tools::Command* c) { return c->app().get_name() == command; });
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::cerr << "dissect: unknown command \"" << argv[1]
              << "\" (commands: inspect, generate, tokenize, template, quantize, convert, serve; "
                 "see dissect --help)\n";
    return exit_bad_input;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    if (error.get_exit_code() == 0) return app.exit(error);  // --help
    std::cerr << "dissect: " << error.what() << "\n";
    return exit_bad_input;
  }
  for (tools::Command* c : commands) {
    if (c->app().parsed()) return c->run();
  }
  // require_subcommand(1): parse() returns only when one command was given.
  throw std::logic_error("dissect: no command was parsed");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const dissect::Error& error) {
    // The library's own errors are about the input: a file, a config, a flag's value.
    std::cerr << "dissect: " << error.what() << "\n";
    return exit_bad_input;
  } catch (const std::exception& error) {
    std::cerr << "dissect: " << error.what() << "\n";
    return exit_other;
  }
}
