// quantize_gpt — a train_gpt checkpoint in fp32, bf16, int8 and 4-bit (GGUF Q4_0): what each
// format costs in bytes and validation loss, and what it buys in decoding speed.
//
//   quantize_gpt --model mini_gpt.safetensors
//   quantize_gpt --model mini_gpt.safetensors --save-dir quantized/     # keep the four files
//
// Model. --model is a checkpoint train_gpt wrote (dissect::save_model's file, with its byte
// vocabulary). For each format every Linear layer of a copy is quantised (dissect::quantize_model;
// the embeddings, the tied head, the norms and the biases stay fp32) and the copy is saved with
// save_model, to --save-dir or a temporary directory, and read back: the rows below are measured on
// the model as the file holds it.
//
// Data. The validation split and batches are train_gpt's: --data (default the fortunes
// directory) read as train_gpt reads it (examples/common/fortunes.hpp), its last 10 % the
// validation split, --eval-batches batches of --batch windows of the model's context drawn from
// Generator(seed + 2000), with --seed defaulting to the seed the checkpoint records. So the fp32
// row's loss is the "val_loss" train_gpt recorded (printed beside it), and every format is
// scored on the same batches.
//
// Speed. Decoding: greedy, --decode-tokens new tokens after a 16-token prompt, on one thread;
// tokens/s excludes the prompt. At these sizes the weights sit in cache, so the speed-up is what
// the kernels do per weight, not the memory bound of bench_quant's 7B shapes.
//
// Output. One row per format: linear-layer weight bytes (what decoding streams), file bytes,
// validation loss and its change from fp32, the change's target (bf16 ≤ 0.01, int8 ≤ 0.02,
// q4_0 ≤ 0.1 nats per character: "met" or "MISSED") and decode tokens/s. Exit status: 0 success
// (targets missed included: they are measurements), 2 bad input, 1 anything else.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <stdlib.h>  // mkdtemp

#include <CLI/CLI.hpp>

#include "common/char_lm.hpp"
#include "common/cli.hpp"
#include "common/fortunes.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/quant/kernel_path.hpp"
#include "dissect/transforms/quantize.hpp"
#include "tools/common/byte_vocab.hpp"

namespace {

namespace ex = dissect::examples;
namespace fs = std::filesystem;
using dissect::index_t;
using dissect::WeightFormat;
using Model = dissect::GPT2Model<float>;

struct Flags {
  std::string model;
  std::string data = ex::kDefaultFortunes;
  index_t batch = 16;
  index_t eval_batches = 8;
  std::optional<std::uint64_t> seed;
  index_t decode_tokens = 200;
  std::string save_dir;
};

void add_flags(CLI::App& app, Flags& flags) {
  ex::FlagDeclarer option(app);
  option.group("Model and data");
  option("--model", flags.model, "FILE", "a checkpoint train_gpt wrote (required)")->required();
  option("--data", flags.data, "DIR",
         std::string("the fortunes train_gpt read (default ") + ex::kDefaultFortunes + ")");
  option("--batch", flags.batch, "B", "windows per validation batch, as train_gpt's (default 16)");
  option("--eval-batches", flags.eval_batches, "N", "validation batches (default 8)");
  option("--seed", flags.seed, "S", "train_gpt's --seed (default: the checkpoint's)");
  option.group("Output");
  option("--decode-tokens", flags.decode_tokens, "N", "greedy tokens timed per format (200)");
  option("--save-dir", flags.save_dir, "DIR", "where the quantised files go (default: a temp dir)");
  app.footer(ex::kExitStatusHelp);
}

void validate(const Flags& flags) {
  ex::check_range<index_t>("--batch", flags.batch, 1, 4096);
  ex::check_range<index_t>("--eval-batches", flags.eval_batches, 1, 10000);
  ex::check_range<index_t>("--decode-tokens", flags.decode_tokens, 1, 100000);
}

/// A fresh directory under the system's temporary directory, removed with its files.
class TemporaryFolder {
 public:
  TemporaryFolder() {
    std::string pattern = (fs::temp_directory_path() / "quantize_gpt-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = pattern;
  }
  TemporaryFolder(const TemporaryFolder&) = delete;
  TemporaryFolder& operator=(const TemporaryFolder&) = delete;
  ~TemporaryFolder() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

struct Row {
  std::string format;
  index_t linear_bytes = 0, file_bytes = 0;
  double val = 0, decode = 0;
  std::optional<double> target;  // largest loss increase allowed
};

int run(const Flags& flags) {
  const dissect::Checkpoint checkpoint(flags.model);
  const auto vocab = dissect::tools::ByteVocab::from_metadata(checkpoint.metadata(), flags.model);
  if (!vocab) throw ex::UsageError("--model: " + flags.model + " records no byte vocabulary");
  const Model base = dissect::load_model<Model>(checkpoint);
  const index_t T = base.config().context, B = flags.batch;

  ex::Corpus corpus;
  try {
    corpus = ex::read_fortunes(flags.data);
  } catch (const ex::DataMissing& missing) {
    throw ex::UsageError(std::string("--data: ") + missing.what() + " (Debian package " +
                         ex::kFortunesPackage + ")");
  }
  std::vector<index_t> ids;
  ids.reserve(corpus.text.size());
  for (const char c : corpus.text) {
    const index_t id = vocab->id_of[static_cast<unsigned char>(c)];
    if (id < 0) throw ex::UsageError("--data: a byte the model's vocabulary lacks");
    ids.push_back(id);
  }
  const auto n = static_cast<index_t>(ids.size());
  const std::span<const index_t> valid(ids.data() + n * 9 / 10,
                                       static_cast<std::size_t>(n - n * 9 / 10));
  if (static_cast<index_t>(valid.size()) < T + 2) {
    throw ex::UsageError("--data: the validation split is shorter than the context");
  }
  std::uint64_t seed = 0;
  if (flags.seed) {
    seed = *flags.seed;
  } else if (const auto found = checkpoint.metadata().find("seed");
             found != checkpoint.metadata().end()) {
    seed = std::stoull(found->second);
  }
  std::vector<ex::Batch> batches;
  dissect::Generator generator(seed + 2000);
  for (index_t i = 0; i < flags.eval_batches; ++i) {
    ex::sample_batch(valid, T, generator, batches.emplace_back(B, T));
  }
  const std::vector<index_t> prompt(valid.begin(), valid.begin() + 16);

  std::optional<TemporaryFolder> temporary;
  fs::path folder = flags.save_dir;
  if (folder.empty()) {
    temporary.emplace();
    folder = temporary->path();
  } else {
    fs::create_directories(folder);
  }

  const auto& c = base.config();
  std::printf("quantize_gpt: GPT-2 D %lld, L %lld, F %lld, context %lld, V %lld from %s",
              static_cast<long long>(c.d_model), static_cast<long long>(c.n_layers),
              static_cast<long long>(c.d_ff), static_cast<long long>(T),
              static_cast<long long>(c.vocab), flags.model.c_str());
  if (const auto val = checkpoint.metadata().find("val_loss"); val != checkpoint.metadata().end()) {
    std::printf(" (train_gpt's val loss %s)", val->second.c_str());
  }
  std::printf(
      "\n  %lld validation batches of %lld × %lld, seed %llu; decoding %lld tokens, 1 "
      "thread\n",
      static_cast<long long>(flags.eval_batches), static_cast<long long>(B),
      static_cast<long long>(T), static_cast<unsigned long long>(seed),
      static_cast<long long>(flags.decode_tokens));

  const std::vector<std::pair<std::optional<WeightFormat>, std::optional<double>>> formats{
      {std::nullopt, std::nullopt},
      {WeightFormat::bf16, 0.01},
      {WeightFormat::int8, 0.02},
      {WeightFormat::q4_0, 0.1}};
  std::vector<Row> rows;
  for (const auto& [format, target] : formats) {
    Model model = base;
    const std::string name = format ? std::string(dissect::weight_format_name(*format)) : "fp32";
    if (format) dissect::quantize_model(model, *format);
    const fs::path file = folder / ("mini_gpt_" + name + ".safetensors");
    dissect::save_model(file, model, checkpoint.metadata());
    const Model loaded = dissect::load_model<Model>(dissect::Checkpoint(file));
    Row row{.format = name,
            .linear_bytes = dissect::linear_weight_bytes(loaded),
            .file_bytes = static_cast<index_t>(fs::file_size(file)),
            .val = ex::evaluate(loaded, batches, B, T),
            .target = target};
    const auto stats = dissect::generate(
        loaded, prompt,
        {.max_new_tokens = flags.decode_tokens, .sampling = {.temperature = 0}, .seed = 0},
        [](index_t) {});
    row.decode = stats.decode_tokens_per_second();
    rows.push_back(row);
  }

  std::printf("\n%-6s %14s %12s %10s %9s %14s %12s %9s\n", "format", "linear bytes", "file bytes",
              "val loss", "Δ fp32", "target", "decode tok/s", "speed-up");
  for (const Row& row : rows) {
    const double delta = row.val - rows.front().val;
    std::string target = "-";
    if (row.target) {
      char text[32];
      std::snprintf(text, sizeof text, "≤ %.2f %s", *row.target,
                    delta <= *row.target ? "met" : "MISSED");
      target = text;
    }
    std::printf("%-6s %14s %12s %10.4f %+9.4f %14s %12.0f %8.2f×\n", row.format.c_str(),
                dissect::format_count(row.linear_bytes).c_str(),
                dissect::format_count(row.file_bytes).c_str(), row.val, delta, target.c_str(),
                row.decode, row.decode / rows.front().decode);
  }
  std::printf("\nkernels: bf16 %s, int8 %s, q4_0 %s (at one row, as decoding runs them)\n",
              std::string(dissect::quant::kernel_path_name(
                              dissect::quant::active_kernel_path(WeightFormat::bf16, 1)))
                  .c_str(),
              std::string(dissect::quant::kernel_path_name(
                              dissect::quant::active_kernel_path(WeightFormat::int8, 1)))
                  .c_str(),
              std::string(dissect::quant::kernel_path_name(
                              dissect::quant::active_kernel_path(WeightFormat::q4_0, 1)))
                  .c_str());
  if (!flags.save_dir.empty()) std::printf("files in %s\n", folder.string().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app(
      "quantize_gpt — a train_gpt checkpoint in fp32, bf16, int8 and q4_0: bytes, loss, "
      "speed",
      "quantize_gpt");
  Flags flags;
  add_flags(app, flags);
  if (const auto status = ex::parse_command_line(app, argc, argv)) return *status;
  return ex::run_program<dissect::Error>("quantize_gpt", [&] {
    validate(flags);
    return run(flags);
  });
}
