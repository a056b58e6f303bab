// lora_finetune — fine-tunes a mini-GPT that train_gpt trained on fortunes to a very different
// English text, twice from the same weights on the same batches: with LoRA adapters
// (dissect::apply_lora; the base frozen) and in full. Prints what each trains, costs and reaches.
//
//   lora_finetune --model mini_gpt.safetensors                      # r 8, α 16, 300 steps
//   lora_finetune --model mini_gpt.safetensors --steps 60 --eval-every 20    # under a minute
//   lora_finetune --model mini_gpt.safetensors --save-adapter gpl.safetensors
//
// Model. --model is a checkpoint train_gpt wrote (dissect::save_model's file): a GPT-2 whose
// "__metadata__" gives its config and its byte vocabulary, "dissect.vocab_bytes" (token id i is
// the byte vocab_bytes[i]; tools/common/byte_vocab.hpp). The context T is the model's.
//
// Data. --data (default /usr/share/common-licenses/GPL-3, Debian's base-files: the GNU GPL,
// legal English, nothing like a fortune) read whole as bytes; the bytes the vocabulary lacks are
// dropped (and counted), the rest are the token ids. The first 90 % of them (rounded down) is
// the training split, the rest the validation split. Batches as train_gpt draws them
// (examples/common/char_lm.hpp): B windows of T + 1 tokens at offsets next_u64() mod (n − T − 1);
// both runs take their training batches from Generator(seed + 1000), so they see the same ones;
// the --eval-batches validation batches come once from Generator(seed + 2000), and every
// validation loss is the mean over them.
//
// Method. (1) LoRA: apply_lora freezes every weight and gives each Linear layer named by
// --targets (PEFT's target_modules: "qkv" matches h.N.attn.qkv) an adapter of rank --rank and
// scale --alpha / --rank, y = x·Wᵀ + b + (α/r)·(x·Aᵀ)·Bᵀ with A [r, in] Kaiming-uniform from
// Generator(seed + i) for the i-th adapted layer and B [out, r] zero, so training starts from the
// base model exactly. AdamW over the model then updates A and B only (frozen parameters have no
// gradient). (2) Full fine-tuning: a copy of the base weights, AdamW over every parameter, at
// --full-lr. Both use AdamW with PyTorch's defaults, betas (0.9, 0.999), eps 1e-8, and no weight
// decay (Hugging Face Trainer's default), and train_gpt's schedule: a linear warm-up over
// min(100, steps / 10) steps to the peak rate, then a cosine down to a tenth of it.
//
// Output. The base model's validation loss on the new text; for each run its trainable
// parameters and a report line every --eval-every steps (train_gpt's: the mean training loss
// since the previous report, the validation loss, lr, tokens/s, time left); the LoRA model's
// validation loss again with its adapters merged into W (merge_adapters: one product per layer
// again), which must equal the unmerged one up to float rounding; then a table: trainable
// parameters and their share of the model, validation loss before → after, milliseconds per
// training step (evaluation excluded) and Adam's state (two floats per trainable parameter).
// --svg draws both validation curves with the base loss as a reference and the training losses.
// --save-adapter writes the adapters alone with PEFT's names (dissect::save_adapters:
// base_model.model.h.0.attn.qkv.lora_A.weight, …) and compares its size to the checkpoint's.
//
// Every flag is checked before any work, then --model and --data as they are read. Exit status:
// 0 success, 2 bad input (a flag, an output path, a model or data file that is missing or
// unusable), 1 anything else (a run that diverges, merged and unmerged losses that disagree).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <map>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/byte_checkpoint.hpp"
#include "common/char_lm.hpp"
#include "common/cli.hpp"
#include "common/svg_plot.hpp"
#include "dissect/accounting/config.hpp"
#include "dissect/accounting/count.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/lora_file.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/lora.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/tensor/freezing.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/training/optim.hpp"
#include "tools/common/byte_vocab.hpp"
#include "tools/common/table.hpp"

namespace {

using dissect::index_t;
using dissect::examples::Batch;
using dissect::examples::check_range;
using dissect::examples::check_real;
using dissect::examples::Curves;
using dissect::examples::evaluate;
using dissect::examples::FlagDeclarer;
using dissect::examples::UsageError;
using Model = dissect::GPT2Model<float>;

constexpr const char* kDefaultData = "/usr/share/common-licenses/GPL-3";

// ---- flags --------------------------------------------------------------------------------------

// Limits that keep a typo from asking for days of work or more memory than a desktop has.
constexpr index_t kMaxSteps = 10'000'000;
constexpr index_t kMaxBatch = 4096;
constexpr index_t kMaxRank = 4096;
constexpr index_t kMaxEvalBatches = 10000;
constexpr index_t kMaxTrainingBytes = index_t{1} << 32;

struct Flags {
  std::string model;
  std::string data = kDefaultData;
  index_t rank = 8;
  double alpha = 16;
  std::string targets = "qkv,proj,up,down";
  double lr = 3e-3;
  double full_lr = 3e-4;
  index_t steps = 300;
  index_t batch = 16;
  index_t eval_every = 25;
  index_t eval_batches = 8;
  std::uint64_t seed = 0;
  std::string svg = "lora_finetune.svg";
  std::string save_adapter = "none";
};

/// Declares every flag on `app`, parsed into `flags`; validate() then checks them.
void add_flags(CLI::App& app, Flags& flags) {
  FlagDeclarer option(app);

  option.group("Model and data");
  option("--model", flags.model, "PATH",
         "the checkpoint to fine-tune: a .safetensors file train_gpt --checkpoint wrote")
      ->required();
  option("--data", flags.data, "FILE",
         std::string("the new text, read as bytes (default ") + kDefaultData + ")");

  option.group("LoRA");
  option("--rank", flags.rank, "R", "the adapters' rank r, 1 to 4096 (default 8)");
  option("--alpha", flags.alpha, "A",
         "the adapters' alpha: the update is scaled by alpha / r; finite and > 0 (default 16)");
  option("--targets", flags.targets, "LIST",
         "comma-separated module names to adapt, as PEFT's target_modules: a name matches the "
         "layers whose path ends with it (default qkv,proj,up,down: every Linear of GPT-2)");
  option("--lr", flags.lr, "X", "LoRA's peak learning rate, finite and > 0 (default 3e-3)");

  option.group("Full fine-tuning and both runs");
  option("--full-lr", flags.full_lr, "X",
         "full fine-tuning's peak learning rate, finite and > 0 (default 3e-4)");
  option("--steps", flags.steps, "N", "optimizer steps of each run, 1 to 10,000,000 (default 300)");
  option("--batch", flags.batch, "B",
         "windows of the model's context per batch, 1 to 4096 "
         "(default 16)");
  option("--eval-every", flags.eval_every, "N",
         "steps between validation losses and report lines, 1 to 10,000,000 (default 25)");
  option("--eval-batches", flags.eval_batches, "N",
         "validation batches per evaluation, 1 to 10000 (default 8)");
  option("--seed", flags.seed, "S",
         "adapters from dissect::Generator(S + i), training batches from Generator(S + 1000), "
         "validation batches from Generator(S + 2000) (default 0)");

  option.group("Output");
  option("--svg", flags.svg, "PATH",
         "where the curves are drawn, checked before training (default lora_finetune.svg; "
         "\"none\" to skip)");
  option("--save-adapter", flags.save_adapter, "PATH",
         "write the trained adapters here (.safetensors, PEFT's names), checked before training "
         "(default none)");
  app.footer(
      "Both runs start from --model's weights and see the same batches of --data (90 % train, "
      "10 % validation): LoRA trains rank-r adapters on the frozen model, full fine-tuning every "
      "weight. (Details at the top of examples/lora_finetune.cpp.)\n\n" +
      std::string(dissect::examples::kExitStatusHelp));
}

/// --targets as a list. @throws UsageError naming the flag for an empty list or entry.
std::vector<std::string> target_list(const std::string& text) {
  std::vector<std::string> targets;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = std::min(text.find(',', start), text.size());
    std::string name = text.substr(start, comma - start);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    if (name.empty()) throw UsageError("--targets: \"" + text + "\" has an empty name");
    targets.push_back(std::move(name));
    start = comma + 1;
  }
  return targets;
}

/// Everything CLI11 cannot check, before any work. @throws UsageError naming the flag.
void validate(const Flags& flags) {
  check_range<index_t>("--rank", flags.rank, 1, kMaxRank);
  check_real("--alpha", flags.alpha, 0, false);
  target_list(flags.targets);
  check_real("--lr", flags.lr, 0, false);
  check_real("--full-lr", flags.full_lr, 0, false);
  check_range<index_t>("--steps", flags.steps, 1, kMaxSteps);
  check_range<index_t>("--batch", flags.batch, 1, kMaxBatch);
  check_range<index_t>("--eval-every", flags.eval_every, 1, kMaxSteps);
  check_range<index_t>("--eval-batches", flags.eval_batches, 1, kMaxEvalBatches);
}

// ---- the model and the data ---------------------------------------------------------------------

/// --data cannot be opened: the hint follows.
struct DataMissing : std::runtime_error {
  using std::runtime_error::runtime_error;
};

/// The new text as token ids.
struct Text {
  std::vector<index_t> ids;
  index_t bytes = 0;          ///< read
  index_t dropped = 0;        ///< of them, not in the vocabulary
  index_t dropped_kinds = 0;  ///< distinct values dropped
};

/// Reads `path` and keeps the bytes `vocab` holds. @throws DataMissing if it cannot be opened,
/// UsageError naming --data if it cannot be read.
Text read_text(const std::string& path, const dissect::tools::ByteVocab& vocab) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw DataMissing(path + " is not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataMissing("cannot open " + path);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw UsageError("--data: cannot read " + path);
  Text text;
  text.bytes = static_cast<index_t>(bytes.size());
  std::array<bool, 256> dropped{};
  for (const char c : bytes) {
    const auto byte = static_cast<unsigned char>(c);
    const index_t id = vocab.id_of[byte];
    if (id >= 0) text.ids.push_back(id);
    if (id < 0) ++text.dropped, dropped[byte] = true;
  }
  text.dropped_kinds = std::count(dropped.begin(), dropped.end(), true);
  return text;
}

// ---- the runs -----------------------------------------------------------------------------------

/// What a run trains and what it reached.
struct Run {
  std::string method;
  index_t trainable = 0;
  Curves curves{};
  dissect::examples::TrainTime time{};
};

/// AdamW with PyTorch's defaults and no weight decay, over the model's trainable parameters.
dissect::AdamW<float> make_optimizer(Model& model, double lr) {
  return dissect::AdamW<float>(
      model, {.lr = lr, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0});
}

/// The file's size, or −1 if it cannot be read.
index_t file_size(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? -1 : static_cast<index_t>(size);
}

std::string percent(double part, double whole) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f %%", 100.0 * part / whole);
  return text;
}

/// The files a run writes, each opened (and so checked) before any work.
struct Outputs {
  dissect::examples::OutputFile figure, adapter;
};

/// Fine-tunes as `flags` (validated) say.
int run(const Flags& flags, Outputs& outputs) {
  namespace ex = dissect::examples;
  const auto targets = target_list(flags.targets);
  dissect::examples::ByteCheckpoint base = dissect::examples::load_byte_checkpoint(
      flags.model, "lora_finetune fine-tunes train_gpt's checkpoints");
  const dissect::TransformerConfig config = base.model.config();
  const index_t T = config.context, B = flags.batch;
  const std::string what = "--batch " + std::to_string(B) + " with context " + std::to_string(T);
  index_t bytes = 0;
  try {
    bytes = ex::training_bytes(config, B, what + ": the model's size");
  } catch (const dissect::OverflowError& error) {
    throw UsageError(error.what());
  }
  if (bytes > kMaxTrainingBytes) {
    throw UsageError(what + ": training needs about " + dissect::format_count(bytes) +
                     " bytes, more than lora_finetune's limit of " +
                     dissect::format_count(kMaxTrainingBytes));
  }

  // The adapters go on a copy now, so that targets that match nothing fail before any work.
  Model lora_model = base.model;
  std::vector<std::string> adapted;
  try {
    adapted = dissect::apply_lora(
        lora_model, {.adapter = {.rank = flags.rank, .alpha = flags.alpha, .seed = flags.seed},
                     .target_modules = targets});
  } catch (const dissect::ConfigError& error) {
    throw UsageError(std::string("--targets: ") + error.what());
  }

  Text text;
  try {
    text = read_text(flags.data, base.vocab);
  } catch (const DataMissing& missing) {
    std::cerr << "lora_finetune: --data: " << missing.what() << "\n"
              << "The default text, the GNU GPL 3, comes with Debian's base-files package; point "
                 "--data at any text file.\n";
    return ex::kExitBadInput;
  }
  const auto n = static_cast<index_t>(text.ids.size());
  const index_t n_train = n * 9 / 10;
  const std::span<const index_t> train(text.ids.data(), static_cast<std::size_t>(n_train));
  const std::span<const index_t> valid(text.ids.data() + n_train,
                                       static_cast<std::size_t>(n - n_train));
  if (static_cast<index_t>(valid.size()) < T + 2) {
    throw UsageError("--data: the model's context of " + std::to_string(T) +
                     " needs splits of at least " + std::to_string(T + 2) + " tokens; " +
                     flags.data + " gives a validation split of " + std::to_string(valid.size()));
  }

  const index_t total = base.model.parameter_count();
  const auto step_key = base.metadata.find("step");
  const auto val_key = base.metadata.find("val_loss");
  std::printf(
      "lora_finetune: GPT-2 D %lld, L %lld, H %lld, F %lld, context %lld, vocabulary %lld: %s "
      "parameters, from %s",
      static_cast<long long>(config.d_model), static_cast<long long>(config.n_layers),
      static_cast<long long>(config.n_heads), static_cast<long long>(config.d_ff),
      static_cast<long long>(T), static_cast<long long>(config.vocab),
      dissect::format_count(total).c_str(), flags.model.c_str());
  if (step_key != base.metadata.end() && val_key != base.metadata.end()) {
    std::printf(" (%s steps, val loss %s on its own text)", step_key->second.c_str(),
                val_key->second.c_str());
  }
  std::string dropped = "every byte in the vocabulary";
  if (text.dropped > 0) {
    dropped = dissect::format_count(text.dropped) + " dropped (" +
              std::to_string(text.dropped_kinds) + " byte values the vocabulary lacks)";
  }
  std::printf("\n  data: %s bytes of %s, %s: %s train, %s validation tokens\n",
              dissect::format_count(text.bytes).c_str(), flags.data.c_str(), dropped.c_str(),
              dissect::format_count(n_train).c_str(), dissect::format_count(n - n_train).c_str());
  const index_t warmup = ex::default_warmup(flags.steps);
  std::printf(
      "  each run: %lld steps of batch %lld × %lld tokens; AdamW betas (0.9, 0.999), no weight "
      "decay, warm-up %lld steps then cosine to peak/10; seed %llu\n",
      static_cast<long long>(flags.steps), static_cast<long long>(B), static_cast<long long>(T),
      static_cast<long long>(warmup), static_cast<unsigned long long>(flags.seed));

  std::vector<Batch> valid_batches;
  dissect::Generator valid_generator(flags.seed + 2000);
  for (index_t i = 0; i < flags.eval_batches; ++i) {
    ex::sample_batch(valid, T, valid_generator, valid_batches.emplace_back(B, T));
  }
  const double base_val = evaluate(base.model, valid_batches, B, T);
  std::printf("base model: val loss %.4f on the new text, before any fine-tuning\n", base_val);
  std::fflush(stdout);

  const auto train_run = [&](Model& model, Run& run, double lr, const char* lr_flag) {
    run.trainable = dissect::trainable_parameter_count(model);
    std::printf("\n== %s: %s trainable parameters (%s of the model), peak lr %g\n",
                run.method.c_str(), dissect::format_count(run.trainable).c_str(),
                percent(static_cast<double>(run.trainable), static_cast<double>(total)).c_str(),
                lr);
    std::fflush(stdout);
    auto optimizer = make_optimizer(model, lr);
    run.curves.val_step.push_back(0);
    run.curves.val.push_back(base_val);
    dissect::Generator generator(flags.seed + 1000);
    const ex::TrainLoop loop{.steps = flags.steps,
                             .eval_every = flags.eval_every,
                             .batch = B,
                             .context = T,
                             .lr = lr,
                             .warmup = warmup,
                             .lr_flag = lr_flag};
    run.time = ex::train_model(model, optimizer, loop, train, generator, valid_batches, run.curves);
  };

  // (1) LoRA on the copy adapted above; (2) the base itself then trains in full.
  char method[64];
  std::snprintf(method, sizeof method, "LoRA r %lld, α %g", static_cast<long long>(flags.rank),
                flags.alpha);
  Run lora{.method = method};
  std::printf("\nLoRA adapters on %zu Linear layers (%s … %s), each W frozen\n", adapted.size(),
              adapted.front().c_str(), adapted.back().c_str());
  train_run(lora_model, lora, flags.lr, "--lr");

  // Merged, the adapters are part of W: the same function, one product per layer.
  const double unmerged = lora.curves.val.back();
  const index_t merged_layers = dissect::merge_adapters(lora_model);
  const double merged = evaluate(lora_model, valid_batches, B, T);
  dissect::unmerge_adapters(lora_model);
  std::printf("merged into W (%lld layers): val loss %.6f, unmerged %.6f, |difference| %.1e\n",
              static_cast<long long>(merged_layers), merged, unmerged, std::abs(merged - unmerged));
  if (!(std::abs(merged - unmerged) <= 1e-4)) {
    throw std::runtime_error("the merged model's validation loss differs from the unmerged one");
  }
  if (outputs.adapter.enabled()) {
    dissect::save_adapters(
        outputs.adapter.path(), lora_model,
        {{"producer", "lora_finetune"},
         {"base_model", std::filesystem::path(flags.model).filename().string()}});
    outputs.adapter.written_elsewhere();
  }

  Run full{.method = "full fine-tuning"};
  train_run(base.model, full, flags.full_lr, "--full-lr");

  std::printf("\n");
  dissect::tools::TextTable table({false, true, true, false, true, true});
  table.add_row({"method", "trainable", "% of model", "val loss before → after", "ms/step",
                 "Adam state, bytes"});
  table.add_rule();
  for (const Run* run : {&lora, &full}) {
    char loss[64], ms[32];
    std::snprintf(loss, sizeof loss, "%.4f → %.4f", run->curves.val.front(),
                  run->curves.val.back());
    std::snprintf(ms, sizeof ms, "%.1f",
                  1e3 * run->time.training / static_cast<double>(flags.steps));
    table.add_row(
        {run->method, dissect::format_count(run->trainable),
         percent(static_cast<double>(run->trainable), static_cast<double>(total)), loss, ms,
         dissect::format_count(2 * run->trainable * static_cast<index_t>(sizeof(float)))});
  }
  std::cout << table.render();

  if (outputs.adapter.enabled()) {
    const index_t size = file_size(outputs.adapter.path());
    std::printf("wrote %s: %s bytes, %s of the model checkpoint's %s\n",
                outputs.adapter.path().c_str(), dissect::format_count(size).c_str(),
                percent(static_cast<double>(size), static_cast<double>(base.file_bytes)).c_str(),
                dissect::format_count(base.file_bytes).c_str());
  }
  if (outputs.figure.enabled()) {
    const std::vector<double> ends = {0, static_cast<double>(flags.steps)},
                              base_line = {base_val, base_val};
    const auto [lora_step, lora_train] = ex::interval_means(lora.curves);
    const auto [full_step, full_train] = ex::interval_means(full.curves);
    // The legend sits over the base line's right end: short labels leave most of it in view.
    const std::string lora_label =
        lora.method + " (" +
        percent(static_cast<double>(lora.trainable), static_cast<double>(total)) + " trained)";
    const std::vector<ex::Panel> panels = {
        {.title = "validation loss on " + std::filesystem::path(flags.data).filename().string() +
                  " (nats per byte)",
         .xlabel = "step",
         .ylabel = "loss",
         .series = {ex::line(ends, base_line,
                             {.label = "base model", .color = "#7f7f7f", .dash = "6 3"}),
                    ex::line(lora.curves.val_step, lora.curves.val,
                             {.label = lora_label, .color = "#1f77b4"}),
                    ex::line(full.curves.val_step, full.curves.val,
                             {.label = "full fine-tuning (100 % trained)", .color = "#ff7f0e"})}},
        {.title = "training loss (mean of each report interval)",
         .xlabel = "step",
         .ylabel = "loss",
         .series = {
             ex::line(lora_step, lora_train, {.label = lora.method, .color = "#1f77b4"}),
             ex::line(full_step, full_train, {.label = "full fine-tuning", .color = "#ff7f0e"})}}};
    char title[200];
    std::snprintf(title, sizeof title,
                  "lora_finetune: GPT-2 D %lld, L %lld fine-tuned on %s, %lld steps each",
                  static_cast<long long>(config.d_model), static_cast<long long>(config.n_layers),
                  std::filesystem::path(flags.data).filename().c_str(),
                  static_cast<long long>(flags.steps));
    outputs.figure.write(ex::svg(panels, 1000, 420, title));
    std::cout << "wrote " << outputs.figure.path() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ex = dissect::examples;
  CLI::App app(
      "lora_finetune — fine-tune a train_gpt checkpoint on a new text, with LoRA and in full",
      "lora_finetune");
  Flags flags;
  add_flags(app, flags);
  if (const auto status = ex::parse_command_line(app, argc, argv)) return *status;
  // A model or configuration the library refuses is bad input too (status 2).
  return ex::run_program<dissect::Error>("lora_finetune", [&] {
    validate(flags);
    // Bad paths fail now, not after training.
    Outputs outputs{ex::OutputFile("--svg", flags.svg),
                    ex::OutputFile("--save-adapter", flags.save_adapter)};
    return run(flags, outputs);
  });
}
