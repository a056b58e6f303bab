// tools/dissect/convert_command.hpp — `dissect convert`: a GGUF file to a Hugging Face checkpoint
// (io/hf_writer.hpp), or any checkpoint dissect reads to a GGUF file with its tokenizer.json
// beside it carried in (io/gguf_model_writer.hpp).
//
//   dissect convert IN.gguf OUT_DIR [--type f32|f16|bf16]
//   dissect convert CHECKPOINT OUT.gguf [--type f32|f16|bf16|q8_0|…] [--no-tokenizer]
#pragma once

#include <CLI/CLI.hpp>

#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <system_error>
#include <variant>

#include "dissect/io/gguf_model_writer.hpp"
#include "dissect/io/gguf_weights.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/hf_writer.hpp"
#include "dissect/io/open_model.hpp"
#include "dissect/text/gguf_tokenizer_metadata.hpp"
#include "tools/dissect/command.hpp"
#include "tools/dissect/gguf_commands.hpp"

namespace dissect::tools {

namespace detail_convert {

namespace fs = std::filesystem;

struct ConvertOptions {
  fs::path input, output;
  std::string type = "f32";   ///< GGUF out: a ggml type; Hugging Face out: f32, f16 or bf16
  bool no_tokenizer = false;  ///< GGUF out: leave a tokenizer.json beside the checkpoint out
};

// A GGUF file to a Hugging Face directory (io/hf_writer.hpp), or any checkpoint dissect reads to
// a GGUF file (io/gguf_model_writer.hpp).
inline int convert(const ConvertOptions& o) {
  const bool gguf_out = o.output.extension() == ".gguf";
  if (dissect::is_gguf_file(o.input)) {  // by its magic, as detect_checkpoint
    if (gguf_out) {
      throw dissect::ConfigError(
          "convert: GGUF to GGUF is `dissect quantize IN.gguf OUT.gguf --format RECIPE`");
    }
    std::optional<dissect::SaveDtype> dtype;
    if (o.type == "f16") dtype = dissect::SaveDtype::f16;
    if (o.type == "bf16") dtype = dissect::SaveDtype::bf16;
    if (!dtype && o.type != "f32") {
      throw dissect::ConfigError(dissect::concat(
          "--type: a Hugging Face checkpoint is written as f32, f16 or bf16, not \"", o.type,
          "\""));
    }
    const dissect::DetectedCheckpoint source = dissect::detect_checkpoint(o.input);
    const dissect::HfConfig& model = source.require_model("convert");
    // The checkpoint is written from the float weights alone.
    const dissect::ModelLoadOptions dense{.gguf = {.keep_quantized = false}};
    dissect::visit_model(
        source, dense,
        [&](const auto& loaded) {
          dissect::save_hf_checkpoint(o.output, loaded, dtype);
          return exit_ok;
        },
        "convert");
    std::cout << "converted   " << o.input.string() << " (" << dissect::family_name(model.family)
              << ", " << source.gguf->tensors().size() << " tensors) to a Hugging Face checkpoint\n"
              << "wrote       " << (o.output / dissect::hf_config_file).string() << ", "
              << (o.output / "model.safetensors").string() << " ("
              << (dtype ? dissect::save_dtype_name(*dtype) : "F32") << ")\n";
    return exit_ok;
  }
  if (!gguf_out) {
    throw dissect::ConfigError(
        dissect::concat("convert: ", o.input.string(),
                        " is not a GGUF file, so the output is one: name it OUT.gguf"));
  }
  dissect::GgmlType type;
  try {
    type = dissect::ggml_type_from_name(o.type);
  } catch (const dissect::Error& error) {
    throw dissect::ConfigError(dissect::concat("--type: ", error.what()));
  }
  const dissect::DetectedCheckpoint source = dissect::detect_checkpoint(o.input);
  refuse_overwriting_the_input(source, o.output, "convert");
  const dissect::HfConfig& recorded = source.require_model("convert");
  // The tokenizer.json beside the checkpoint, as llama.cpp's converter writes it into the file.
  std::error_code error;
  const fs::path dir = fs::is_directory(o.input, error) ? o.input : o.input.parent_path();
  const fs::path tokenizer_json = (dir.empty() ? fs::path(".") : dir) / "tokenizer.json";
  dissect::GgufModelOptions options{.type = type, .name = o.input.stem().string(), .tokenizer = {}};
  const bool carry = !o.no_tokenizer && fs::is_regular_file(tokenizer_json, error);
  if (carry) {
    options.tokenizer =
        dissect::text::gguf_tokenizer_metadata(tokenizer_json, recorded.config.vocab);
  }
  dissect::visit_model(
      source,
      [&](const auto& model) {
        dissect::save_gguf_model(o.output, model, options);
        return exit_ok;
      },
      "convert");
  std::cout << "converted   " << o.input.string() << " (" << dissect::family_name(recorded.family)
            << ") to GGUF, matrices " << dissect::ggml_type_name(type)
            << ", norms and biases f32\n";
  if (carry) {
    const auto& model_name = std::get<std::string>(options.tokenizer.front().second.storage());
    std::cout << "tokenizer   " << tokenizer_json.string() << " (" << model_name;
    for (const auto& [key, value] : options.tokenizer) {
      if (key == "tokenizer.ggml.pre") std::cout << ", pre " << *value.as_string();
    }
    std::cout << ")\n";
  } else {
    std::cout << "tokenizer   none (tokenizer.ggml.model \"none\": dissect generate --tokens runs "
                 "it; llama.cpp wants a vocabulary)\n";
  }
  std::cout << "file        " << o.output.string() << ", "
            << dissect::format_count(static_cast<index_t>(fs::file_size(o.output))) << " B\n";
  return exit_ok;
}

}  // namespace detail_convert

/// `dissect convert` and its flags.
class ConvertCommand final : public Command {
 public:
  explicit ConvertCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "convert",
            "a GGUF file to a Hugging Face checkpoint, or a checkpoint to a GGUF file")) {
    CLI::App* convert_command = &this->app();
    convert_command
        ->add_option(
            "input", options_.input,
            "a .gguf, a save_model file, or a Hugging Face checkpoint with its config.json")
        ->required();
    convert_command
        ->add_option("output", options_.output,
                     "a directory (from a .gguf: config.json + model.safetensors) or OUT.gguf")
        ->required();
    convert_command
        ->add_option("--type", options_.type,
                     "to GGUF: the matrices' ggml type (f32, f16, bf16, q8_0, q4_0, q4_K, ...); to "
                     "Hugging Face: f32, f16 or bf16")
        ->capture_default_str();
    convert_command->add_flag("--no-tokenizer", options_.no_tokenizer,
                              "to GGUF: leave out the tokenizer.json beside the checkpoint");
  }

  int run() override { return detail_convert::convert(options_); }

 private:
  detail_convert::ConvertOptions options_;
};

}  // namespace dissect::tools
