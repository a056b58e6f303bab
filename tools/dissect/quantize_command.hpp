// tools/dissect/quantize_command.hpp — `dissect quantize`: a model's linear layers stored as bf16,
// int8, q4_0 or ternary tq2_0 (a save_model file out), or a GGUF file requantised by llama.cpp's
// recipes (io/gguf_quantize.hpp). Rounding a float model to ternary weights is refused unless
// --force, with what it would cost.
//
//   dissect quantize IN OUT --format bf16|int8|q4
//   dissect quantize IN.gguf OUT.gguf --format q8_0|q4_0|q6_k|q4_k_m|q5_k_m
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <system_error>
#include <vector>

#include "dissect/io/gguf_quantize.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/io/open_model.hpp"
#include "tools/common/parse.hpp"
#include "tools/dissect/command.hpp"
#include "tools/dissect/gguf_commands.hpp"

namespace dissect::tools {

namespace detail_quantize {

namespace fs = std::filesystem;

struct QuantizeOptions {
  fs::path input, output;
  dissect::WeightFormat format = dissect::WeightFormat::int8;
  std::optional<dissect::GgufRecipe> recipe;  ///< set: GGUF in, GGUF out, llama.cpp's recipe
  bool force = false;  ///< round a float model to ternary (tq2_0) weights even so
};

/// What rounding a model's weights costs: their relative error ‖W − Ŵ‖/‖W‖ over every quantised
/// layer, and the mean KL divergence of the rounded model's next-token distribution from the
/// float model's over a fixed probe sequence (ids 7i + 1 mod V, as long as the context allows,
/// at most 64).
struct RoundingCost {
  double weight_error = 0;
  double kl = 0;
};

template <class Model>
std::vector<index_t> probe_ids(const Model& model) {
  const auto& c = model.config();
  std::vector<index_t> ids(static_cast<std::size_t>(std::min<index_t>(c.context, 64)));
  for (std::size_t i = 0; i < ids.size(); ++i) {
    ids[i] = static_cast<index_t>((7 * i + 1) % static_cast<std::size_t>(c.vocab));
  }
  return ids;
}

/// Mean over positions of KL(softmax(reference) ‖ softmax(rounded)), in nats.
template <class Logits>
double mean_kl(const Logits& reference, const Logits& rounded) {
  const index_t positions = reference.shape()[1], vocab = reference.shape()[2];
  double total = 0;
  for (index_t t = 0; t < positions; ++t) {
    const auto* p = reference.data() + t * vocab;
    const auto* q = rounded.data() + t * vocab;
    double p_max = p[0], q_max = q[0];
    for (index_t v = 1; v < vocab; ++v) p_max = std::max<double>(p_max, p[v]);
    for (index_t v = 1; v < vocab; ++v) q_max = std::max<double>(q_max, q[v]);
    double p_sum = 0, q_sum = 0;
    for (index_t v = 0; v < vocab; ++v) p_sum += std::exp(p[v] - p_max);
    for (index_t v = 0; v < vocab; ++v) q_sum += std::exp(q[v] - q_max);
    const double p_log = p_max + std::log(p_sum), q_log = q_max + std::log(q_sum);
    for (index_t v = 0; v < vocab; ++v) {
      const double log_p = p[v] - p_log;
      total += std::exp(log_p) * (log_p - (q[v] - q_log));
    }
  }
  return total / static_cast<double>(positions);
}

template <class Model>
int run_quantize(Model& model, const dissect::DetectedCheckpoint& source,
                 dissect::WeightFormat format, const QuantizeOptions& o) {
  const auto float_bytes = dissect::linear_weight_bytes(model);
  const bool ternary = format == dissect::WeightFormat::tq2_0;
  // Ternary weights are trained, not rounded: measure what rounding costs before deciding.
  std::map<std::string, std::vector<double>> before;
  std::optional<dissect::Tensor<typename Model::scalar_type, 3>> float_logits;
  const std::vector<index_t> probe = probe_ids(model);
  if (ternary) {
    model.for_each_parameter([&](const dissect::ParameterName& name, auto value, auto) {
      if constexpr (dissect::rank_of<decltype(value)> == 2) {
        before[name.str()].assign(value.begin(), value.end());
      }
    });
    float_logits = model.forward(dissect::TokenBatch{probe, 1, static_cast<index_t>(probe.size())});
  }
  const auto layers = dissect::quantize_model(model, format);
  std::optional<RoundingCost> cost;
  if (ternary) {
    double error = 0, norm = 0;
    for (const std::string& layer : layers) {
      const std::vector<double>& original = before.at(layer + ".weight");
      std::size_t i = 0;
      model.for_each_parameter([&](const dissect::ParameterName& name, auto value, auto) {
        if (name.str() != layer + ".weight") return;
        for (const auto rounded : value) {
          error += (rounded - original[i]) * (rounded - original[i]);
          norm += original[i] * original[i];
          ++i;
        }
      });
    }
    const auto rounded_logits =
        model.forward(dissect::TokenBatch{probe, 1, static_cast<index_t>(probe.size())});
    cost = RoundingCost{norm > 0 ? std::sqrt(error / norm) : 0.0,
                        mean_kl(*float_logits, rounded_logits)};
    // A model trained ternary (BitLinear, transforms::use_bitlinear) rounds with no error.
    if (!o.force && cost->weight_error > 1e-3) {
      throw dissect::ConfigError(dissect::concat(
          "quantize --format tq2_0: ", o.input.string(),
          " holds float weights, not ternary ones: rounding them to {-1, 0, +1}·d loses ",
          fixed(100.0 * cost->weight_error, 1),
          " % of their norm and moves the "
          "next-token distribution by ",
          fixed(cost->kl, 3),
          " nats (mean KL on a probe sequence). Ternary weights are trained (BitLinear, "
          "transforms::use_bitlinear), not rounded; --force rounds anyway"));
    }
  }
  // A dissect file's own metadata (a vocabulary, say) goes along; save_model rewrites the rest.
  std::map<std::string, std::string> metadata;
  if (source.kind != dissect::CheckpointKind::hugging_face) {
    metadata = source.checkpoint.metadata();
    metadata.erase(dissect::quantization_key);
  }
  dissect::save_model(o.output, model, metadata);
  const auto bytes = dissect::linear_weight_bytes(model);
  std::cout << "quantized   " << layers.size() << " linear layers to "
            << dissect::weight_format_name(format) << " (embeddings, norms and biases stay fp32)\n"
            << "weights     " << dissect::format_count(float_bytes) << " B → "
            << dissect::format_count(bytes) << " B ("
            << static_cast<double>(float_bytes) / static_cast<double>(bytes) << "× smaller)\n"
            << "file        " << o.output.string() << ", "
            << dissect::format_count(static_cast<index_t>(fs::file_size(o.output))) << " B\n";
  if (cost) {
    std::cout << "rounding    ‖W − Ŵ‖/‖W‖ = " << fixed(100.0 * cost->weight_error, 2)
              << " %, mean KL(float ‖ ternary) = " << fixed(cost->kl, 4) << " nats over "
              << probe.size() << " probe tokens (--force: a float model "
              << "rounded, not trained, to ternary)\n";
  }
  return exit_ok;
}

// GGUF to GGUF, as llama.cpp's llama_model_quantize writes it (io/gguf_quantize.hpp).
inline int quantize_gguf_file(const QuantizeOptions& o) {
  if (dissect::io::same_file(o.input, o.output)) {
    throw dissect::ConfigError(
        dissect::concat("quantize: output ", o.output.string(), " is the input file"));
  }
  const dissect::GgufFile in(o.input);
  dissect::quantize_gguf(in, o.output, *o.recipe);
  const dissect::GgufFile out(o.output);
  std::map<std::string, index_t> types;
  for (const dissect::GgufTensorInfo& info : out.tensors()) {
    ++types[dissect::ggml_type_name(info.type)];
  }
  std::cout << "quantized   " << o.input.string() << " by llama.cpp's "
            << dissect::gguf_recipe_name(*o.recipe) << " recipe (general.file_type "
            << dissect::gguf_recipe_file_type(*o.recipe) << "):";
  for (const auto& [type, count] : types) std::cout << " " << count << " " << type;
  std::cout << "\nfile        " << o.output.string() << ", "
            << dissect::format_count(static_cast<index_t>(fs::file_size(o.output))) << " B (was "
            << dissect::format_count(static_cast<index_t>(fs::file_size(o.input))) << " B)\n";
  return exit_ok;
}

inline int quantize(const QuantizeOptions& o) {
  if (o.recipe) return quantize_gguf_file(o);
  // Quantising freezes every layer: gradient buffers would only take memory.
  const dissect::ConstructionScope no_gradients({.gradients = false});
  const dissect::DetectedCheckpoint source = dissect::detect_checkpoint(o.input);
  refuse_overwriting_the_input(source, o.output, "quantize");
  return dissect::visit_model(
      source, [&](auto& model) { return run_quantize(model, source, o.format, o); }, "quantize");
}

}  // namespace detail_quantize

/// `dissect quantize` and its flags.
class QuantizeCommand final : public Command {
 public:
  explicit QuantizeCommand(CLI::App& app)
      : Command(app.add_subcommand(
            "quantize", "store every linear layer's weight as bf16, int8 or q4_0 (GGUF Q4_0)")) {
    CLI::App* quantize_command = &this->app();
    quantize_command
        ->add_option("input", options_.input,
                     "a save_model file, or a Hugging Face checkpoint with its config.json")
        ->required();
    quantize_command->add_option("output", options_.output, "the .safetensors to write")
        ->required();
    quantize_command
        ->add_option("--format", format_,
                     "bf16, int8 or q4 (q4_0: in_features % 32 == 0); for a .gguf: q8_0, q4_0, "
                     "q6_k, q4_k_m or q5_k_m (llama.cpp's recipes); tq2_0: ternary, refused for a "
                     "float model unless --force")
        ->required();
    quantize_command->add_flag("--force", options_.force,
                               "tq2_0: round a float model to ternary weights anyway (and report "
                               "what it costs)");
  }

  int run() override {
    namespace fs = std::filesystem;
    const bool gguf_in = dissect::is_gguf_file(options_.input);  // before any file is opened
    const bool gguf_out = options_.output.extension() == ".gguf";
    if (gguf_in != gguf_out) {
      throw dissect::ConfigError(dissect::concat(
          "quantize: ", gguf_in ? "a GGUF input is written as GGUF (OUT.gguf)"
                                : "a GGUF output needs a GGUF input (`dissect convert IN "
                                  "OUT.gguf` writes a checkpoint as GGUF)"));
    }
    try {
      if (gguf_in) {
        options_.recipe = dissect::gguf_recipe_from_name(format_);
      } else {
        options_.format = dissect::weight_format_from_name(format_);
      }
    } catch (const dissect::Error& error) {
      throw dissect::ConfigError(dissect::concat("--format: ", error.what()));
    }
    std::error_code error;
    const fs::path folder = fs::absolute(options_.output, error).parent_path();
    if (!fs::is_directory(folder, error)) {
      throw dissect::ConfigError(dissect::concat("quantize: output ", options_.output.string(),
                                                 ": the folder ", folder.string(),
                                                 " does not exist"));
    }
    return detail_quantize::quantize(options_);
  }

 private:
  detail_quantize::QuantizeOptions options_;
  std::string format_;
};

}  // namespace dissect::tools
