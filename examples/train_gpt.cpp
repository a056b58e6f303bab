// train_gpt — trains a character-level GPT-2 from scratch, with dissect::GPT2Model and AdamW, on
// the English fortunes of Debian's `fortunes` package.
//
//   train_gpt                                    # D 128, 4 layers, 4 heads, context 128
//   train_gpt --steps 30 --d-model 32 --layers 2 --heads 2 --context 32 --batch 8   # seconds
//   train_gpt --save-init init.safetensors       # the initial weights, for train_gpt_torch.py
//
// Data. Every plain-text fortune file in --data (default /usr/share/games/fortunes; not the .dat
// indexes, not the .u8 links, and no subdirectory, so not the offensive ones in off/), in byte
// order of their names, joined into one text. The "%" lines that separate fortunes are kept: the
// model learns where a fortune ends, and a sampler can stop there. A file that does not end with
// a "%" line gets one, so every fortune is closed. A token is a byte, and the vocabulary is the
// sorted set of the distinct bytes of the text (114 for fortunes 1.99.1: tab, newline, printable
// ASCII, the backspaces and bells of a few overstruck fortunes, and the bytes of a few dozen
// UTF-8 characters, each of which therefore takes two or three tokens). The first 90 % of the
// text (rounded down) is the training split, the rest the validation split.
//
// --tokenizer bpe:N instead learns N byte-level BPE merges from the training split
// (dissect/text/bpe_trainer.hpp: the most frequent pair, ties to the smallest ids, GPT-2's
// pre-tokenizer), splits at the first character boundary at or before 90 % of the bytes, and
// encodes each split with the learned tokenizer; the vocabulary is then 256 + N tokens. Losses
// are per token; the final line also gives the validation loss per byte (× tokens / bytes of the
// validation split), the number that compares a BPE run with a byte-level one.
//
// Variants (issue 27's comparisons; the default run does not change). --family llama builds a
// dissect::LlamaModel instead of the GPT2Model: RMSNorm, rotary positions, a SwiGLU FFN of width
// --d-ff, no biases, the head still tied. --experts E (with --family llama) makes it a
// dissect::MixtralModel: every layer's FFN a mixture of E SwiGLU experts of width --d-ff behind a
// router D → E, each token sent to --experts-per-token of them, with Switch's load-balancing loss
// times --aux-loss in each layer's gradient (the losses reported are the cross-entropy alone).
// Each report then prints, and --curves records, the experts' load: the share of the routed
// token slots (B·T·k per layer and step) that each expert received over the report interval,
// averaged over the layers and per layer. --bitlinear puts every Linear of every block in BitNet
// b1.58's arithmetic (dissect::use_bitlinear: ternary W, int8 x, gradients straight through),
// evaluation included; --checkpoint then writes the ternary Q(W), not the float master weights.
// --q4-baseline PATH rounds the Linear layers of a float checkpoint of the same model to q4_0
// (dissect::quantize_model) and evaluates it on this run's validation batches: the post-training
// quantisation a BitLinear run is measured against.
//
// Batches. A batch is B windows of T + 1 consecutive tokens; window b starts at
// next_u64() mod (n − T − 1) of a dissect::Generator, n being the split's length, drawn in the
// order b = 0 … B − 1, one batch after the other. Its first T tokens are the inputs, its last T
// the targets. Training batches come from Generator(seed + 1000); the --eval-batches validation
// batches are drawn once, before training, from Generator(seed + 2000) over the validation
// split, and every evaluation is the mean loss over those same batches. The model's weights come
// from Generator(seed) (GPT-2's initialisation, N(0, 0.02²), see ModelOptions) unless --init
// gives them.
//
// Optimisation. AdamW, betas (0.9, 0.95), eps 1e-8, decoupled weight decay (--weight-decay,
// default 0.1) on the matrices only (wte, wpe, qkv, proj, up, down; not biases or LayerNorm
// gains), as two AdamW instances over the two groups. The learning rate for step s = 0 … S − 1
// (set before the step) rises linearly to --lr over the --warmup steps, lr·(s + 1)/warmup, then
// follows a cosine down to lr/10 at the last step: lr/10 + (lr − lr/10)·(1 + cos(π·p))/2 with
// p = (s − warmup + 1)/(S − warmup). No gradient clipping. train_gpt_torch.py does exactly this.
// The batches, the schedule and the training loop are examples/common/char_lm.hpp's, which
// lora_finetune shares.
//
// Output. A progress line per report (every --eval-every steps and at the end): the mean
// training loss since the previous report, the validation loss, the learning rate, training
// tokens per second (evaluation excluded) and the time left; on a terminal the line is also
// redrawn between reports (after a step, at most ten times a second). --svg draws the curves,
// --curves writes them as CSV (the same format as train_gpt_torch.py's, so that --compare can
// draw that run's validation curve beside this one's).
//
// Checkpoints (dissect::io, safetensors). --save-init writes the initial weights and exits
// (train_gpt_torch.py starts from them); --init starts from a file's weights; --checkpoint
// writes the weights after training. Tensors carry the model's state_dict names (wte.weight,
// wpe.weight, h.0.ln_1.weight, h.0.attn.qkv.weight, …, ln_f.bias; the head is wte) in F32. The
// files are dissect::save_model's, so their "__metadata__" strings say what a sampler needs
// (dissect generate reads them):
//   "dissect.family"       "gpt2"
//   "dissect.config"       the TransformerConfig as JSON (io/model_file.hpp)
//   "dissect.tokenizer"    "bytes": token id i stands for one byte, dissect.vocab_bytes[i]
//   "dissect.vocab_bytes"  a JSON array of the byte value (0 … 255) of each token id, ascending:
//                          "[9,10,32,…]" (bytes, not characters: a UTF-8 character takes several)
//                          or, with --tokenizer bpe:N,
//   "dissect.tokenizer"    "bpe"
//   "dissect.tokenizer_json"  the learned tokenizer.json (dissect generate encodes and decodes with
//   it) "step"         optimizer steps behind the weights ("0" for --save-init) "val_loss"     the
//   last validation loss ("%.4f"; absent for --save-init) "seed"         --seed "producer"
//   "train_gpt"
// A --bitlinear checkpoint adds "bitlinear" (its weights are Q(W)).
// --init refuses a file whose config or vocabulary differ from the flags' and the data's.
//
// Resuming (dissect/io/training_state.hpp). --save-state PATH writes the whole training state at
// the end of the run: the float weights under their state_dict names, both AdamW groups' moments
// (optimizer.matrices.exp_avg.<name>, …, in F32 as they are held) with their step counts and
// current lr, the training batches' generator (its SplitMix64 counter), the curves so far
// (extra.curves.*, F64) and, in "__metadata__", the checkpoint keys above plus
// "dissect.training" (the library's JSON) and "dissect.run_flags" (every flag that fixes the
// trajectory, and a hash of the token ids). --save-every N writes it every N steps too (each
// write atomic, replacing the last); --stop-after K stops after step K of the --steps schedule
// and writes it. --resume PATH continues such a run: it refuses (status 2, one line naming the
// first differing flag) a file written with other flags or data, and otherwise draws the same
// batches, sets the same learning rates and computes the same losses as the run that was never
// stopped, so the final --checkpoint is byte for byte that run's (example_train_gpt_resume_*).
// The cosine schedule depends on --steps, which is why a resumed run repeats it. With
// --experts, the expert load of the report interval a resume cuts counts only its later steps.
//
//   train_gpt --steps 1000 --save-state run.safetensors --stop-after 400   # stops at step 400
//   train_gpt --steps 1000 --save-state run.safetensors --resume run.safetensors
//
// Data parallelism. Started by `mpiexec -n N` (N > 1; a build with dissect::parallel), every
// process reads the same data, builds the same model and draws the same batches; each trains
// on its B/N windows of every batch (--batch must be a multiple of N) and
// dissect::parallel::DataParallel averages the gradients in one fixed order, so every rank makes
// the same update; --shard-optimizer keeps AdamW's moments for 1/N of the parameters on each
// rank (ZeRO stage 1, the same values bit for bit). Only rank 0 prints and writes files; an error
// on any rank stops all of them (examples/common/data_parallel_run.hpp). --save-state and
// --resume work there too (rank 0 writes the state, every rank reads it), but not with
// --shard-optimizer, whose ranks each hold only a shard of AdamW's state.
//
// Every flag is checked before any work, and the data as they are read. Exit status: 0
// success, 2 bad input (a flag, an output path, missing or unusable data), 1 anything else
// (training that diverges to a non-finite loss, too).
#include <Eigen/Core>
#include <algorithm>
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
#include <type_traits>
#include <utility>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include <nlohmann/json.hpp>
#include "common/char_lm.hpp"
#include "common/cli.hpp"
#include "common/data_parallel_run.hpp"
#include "common/expert_load.hpp"
#include "common/svg_plot.hpp"
#include "common/training_state.hpp"
#include "dissect/accounting/config.hpp"
#include "dissect/accounting/count.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/layers/embedding.hpp"
#include "dissect/tensor/init.hpp"

#include "common/fortunes.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/io/state_dict.hpp"
#include "dissect/io/training_state.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/quant/bitnet.hpp"
#include "dissect/tensor/tensor.hpp"
#include "dissect/text/bpe_trainer.hpp"
#include "dissect/training/loss.hpp"
#include "dissect/training/optim.hpp"
#include "dissect/transforms/bitlinear.hpp"
#include "dissect/transforms/quantize.hpp"
#include "tools/common/byte_vocab.hpp"

namespace {

using dissect::index_t;
using dissect::examples::Batch;
using dissect::examples::check_range;
using dissect::examples::check_real;
using dissect::examples::Clock;
using dissect::examples::Curves;
using dissect::examples::evaluate;
using dissect::examples::ExpertLoad;
using dissect::examples::FlagDeclarer;
using dissect::examples::grouped;
using dissect::examples::sample_batch;
using dissect::examples::seconds_since;
using dissect::examples::UsageError;
using dissect::tools::ByteVocab;
using dissect::tools::vocab_bytes_key;

using dissect::examples::Corpus;
using dissect::examples::DataError;
using dissect::examples::DataMissing;
using dissect::examples::kDefaultFortunes;
using dissect::examples::kFortunesPackage;
using dissect::examples::read_fortunes;

// ---- flags --------------------------------------------------------------------------------------

// Limits that keep a typo from asking for days of work or more memory than a desktop has.
constexpr index_t kMaxSteps = 10'000'000;
constexpr index_t kMaxBatch = 4096;
constexpr index_t kMaxContext = 8192;
constexpr index_t kMaxWidth = 16384;
constexpr index_t kMaxLayers = 256;
constexpr index_t kMaxEvalBatches = 10000;
constexpr index_t kMaxModelBytes = index_t{1} << 32;
constexpr int kMaxThreads = 1024;

struct Flags {
  index_t steps = 1000;
  index_t batch = 16;
  index_t context = 128;
  index_t d_model = 128;
  index_t layers = 4;
  index_t heads = 4;
  double lr = 3e-3;
  double weight_decay = 0.1;
  std::optional<index_t> warmup;  // default: min(100, steps / 10)
  index_t eval_every = 100;
  index_t eval_batches = 8;
  std::uint64_t seed = 0;
  int threads = 0;  // 0: leave Eigen's and OpenMP's defaults
  std::string data = kDefaultFortunes;
  std::string svg = "train_gpt.svg";
  std::string curves = "none";
  std::string compare = "";
  std::string checkpoint = "none";
  std::string init = "";
  std::string save_init = "none";
  // Resumable runs: the training state written, how often, where to stop, and where to resume.
  std::string save_state = "none";
  index_t save_every = 0;  // 0: only at the end (or at --stop-after)
  index_t stop_after = 0;  // 0: run all --steps
  std::string resume = "";
  std::string tokenizer = "bytes";
  std::optional<std::size_t> bpe_merges;  // from --tokenizer bpe:N, set by validate()
  // The variants: another decoder family, a mixture of experts, BitLinear layers.
  std::string family = "gpt2";
  std::optional<index_t> d_ff;               // default 4·D
  index_t experts = 0;                       // 0: a dense FFN
  std::optional<index_t> experts_per_token;  // default 2
  std::optional<double> aux_loss;            // default kDefaultAuxLoss
  bool bitlinear = false;
  std::string q4_baseline = "";
  bool shard_optimizer = false;  // under mpiexec: ZeRO stage 1
};

constexpr index_t kMaxExperts = 256;
// The load-balancing coefficient the Switch Transformer paper settles on (α = 10⁻²).
constexpr double kDefaultAuxLoss = 0.01;

/// Declares every flag on `app`, parsed into `flags`; validate() then checks them.
void add_flags(CLI::App& app, Flags& flags) {
  FlagDeclarer option(app);

  option.group("Model");
  option("--d-model", flags.d_model, "D", "model width D, 1 to 16384 (default 128); F = 4·D");
  option("--layers", flags.layers, "L", "decoder layers, 1 to 256 (default 4)");
  option("--heads", flags.heads, "H", "attention heads, dividing D (default 4)");
  option("--context", flags.context, "T",
         "tokens per training window and the model's context, 1 to 8192 (default 128)");

  option("--tokenizer", flags.tokenizer, "KIND",
         "bytes (default: a token is a byte) or bpe:N (N byte-level BPE merges learned from the "
         "training split, 1 to 100000)");
  option("--family", flags.family, "NAME",
         "gpt2 (default: LayerNorm, learned positions, GELU MLP, biases) or llama (RMSNorm, "
         "RoPE, SwiGLU FFN, no biases); the head is tied to the embedding in both");
  option("--d-ff", flags.d_ff, "F",
         "FFN width F (of each expert, with --experts), 1 to 65536 (default 4·D)");

  option.group("Variants: mixture of experts, BitLinear");
  option("--experts", flags.experts, "E",
         "a mixture of E experts in every layer, 2 to 256 (needs --family llama: the model is "
         "then Mixtral's, LLaMA's layer with SwiGLU experts; default 0, a dense FFN)");
  option("--experts-per-token", flags.experts_per_token, "K",
         "experts each token is routed to, 1 to E (default 2)");
  option("--aux-loss", flags.aux_loss, "X",
         "coefficient of the load-balancing loss E·Σ f_e·P_e added to each layer's training loss, "
         ">= 0 and < 10 (default 0.01, Switch's)");
  app.add_flag("--bitlinear", flags.bitlinear,
               "train every Linear of every block as BitNet b1.58's BitLinear (ternary weights, "
               "int8 activations, straight-through gradients; dissect::use_bitlinear)")
      ->group(option.group());
  option("--q4-baseline", flags.q4_baseline, "PATH",
         "a float checkpoint of the same model (train_gpt's): its validation loss after "
         "post-training q4_0 rounding, on this run's validation batches, is printed and drawn");

  option.group("Optimisation");
  option("--steps", flags.steps, "N", "optimizer steps, 1 to 10,000,000 (default 1000)");
  option("--batch", flags.batch, "B", "windows per batch, 1 to 4096 (default 16)");
  option("--lr", flags.lr, "X", "peak learning rate, finite and > 0 (default 3e-3)");
  option("--warmup", flags.warmup, "N",
         "steps of linear warm-up, 0 to --steps (default min(100, --steps / 10)); then a cosine "
         "down to lr/10");
  option("--weight-decay", flags.weight_decay, "X",
         "AdamW's decoupled weight decay on the matrices, >= 0 (default 0.1)");
  option("--seed", flags.seed, "S",
         "weights from dissect::Generator(S), training batches from Generator(S + 1000), "
         "validation batches from Generator(S + 2000) (default 0)");

  option.group("Checkpoints");
  option("--checkpoint", flags.checkpoint, "PATH",
         "write the trained weights here (.safetensors), checked before training (default "
         "none)");
  option("--init", flags.init, "PATH",
         "start from the weights of this .safetensors file (train_gpt's) instead of "
         "Generator(seed)'s");
  option("--save-init", flags.save_init, "PATH",
         "write the initial weights here (.safetensors) and exit: train_gpt_torch.py --init "
         "reads them");
  option("--save-state", flags.save_state, "PATH",
         "write the training state here (.safetensors: weights, AdamW moments and steps, the "
         "batch generator, the curves) at the end, at --stop-after and every --save-every steps, "
         "for --resume (default none)");
  option("--save-every", flags.save_every, "N",
         "also write --save-state every N steps, replacing the file atomically (default 0: only "
         "at the end)");
  option("--stop-after", flags.stop_after, "K",
         "stop after step K of the --steps schedule and write --save-state (a run in parts; "
         "default: run all --steps)");
  option("--resume", flags.resume, "PATH",
         "continue the run a --save-state file holds, bit for bit as if it had not stopped; the "
         "flags must be those of the run that wrote it (--threads aside)");

  option.group("Evaluation");
  option("--eval-every", flags.eval_every, "N",
         "steps between validation losses and report lines, 1 to 10,000,000 (default 100)");
  option("--eval-batches", flags.eval_batches, "N",
         "validation batches (of --batch windows) per evaluation, 1 to 10000 (default 8)");

  option.group("Data, output and machine");
  option("--data", flags.data, "DIR",
         std::string("directory of the fortune files (default ") + kDefaultFortunes + ")");
  option("--svg", flags.svg, "PATH",
         "where the curves are drawn, checked before training (default train_gpt.svg; \"none\" "
         "to skip)");
  option("--curves", flags.curves, "PATH",
         "CSV of the curves, one row per step: step,lr,train_loss,val_loss (default none)");
  option("--compare", flags.compare, "PATH",
         "a --curves file of another run (train_gpt_torch.py's) whose validation curve the "
         "--svg figure shows too");
  app.add_flag("--shard-optimizer", flags.shard_optimizer,
               "under mpiexec -n N (data-parallel training): each rank keeps AdamW's moments for "
               "1/N of the parameters only (ZeRO stage 1); the same values, bit for bit")
      ->group(option.group());
  option("--threads", flags.threads, "N",
         "threads for Eigen's GEMM and dissect's attention, 1 to 1024 (needs a build with "
         "-DDISSECT_USE_OPENMP=ON)");
  app.footer(
      "Data: every plain fortune file of --data in name order, joined, \"%\" lines kept; a "
      "token is a byte; first 90 % train, last 10 % validation. Batches: B windows of T + 1 "
      "tokens at offsets next_u64() mod (n − T − 1). train_gpt_torch.py trains the same model "
      "on the same batches. (Details at the top of examples/train_gpt.cpp.)\n\n" +
      std::string(dissect::examples::kExitStatusHelp));
}

/// The model the flags describe (vocab filled in once the data is read).
dissect::TransformerConfig model_config(const Flags& flags, index_t vocab) {
  dissect::TransformerConfig config{.d_model = flags.d_model,
                                    .n_layers = flags.layers,
                                    .n_heads = flags.heads,
                                    .d_ff = flags.d_ff.value_or(4 * flags.d_model),
                                    .vocab = vocab,
                                    .context = flags.context};
  if (flags.family == "llama") {
    // LLaMA's parts; the head stays tied, as the GPT-2 mini's, so that the families differ only
    // in their layers.
    config.positions = dissect::Positions::rotary;
    config.norm = dissect::Norm::rms_norm;
    config.ffn = dissect::Ffn::gated;
    config.bias = false;
  }
  if (flags.experts > 0) {
    config.n_experts = flags.experts;
    config.experts_per_token = flags.experts_per_token.value_or(2);
  }
  return config;
}

/// The model's kind, as the first report line names it.
std::string family_label(const Flags& flags) {
  if (flags.experts > 0) return "Mixtral-style";
  return flags.family == "llama" ? "LLaMA-style" : "GPT-2";
}

/// About the bytes a run holds (char_lm.hpp's training_bytes), the vocabulary taken at its
/// largest, 256.
index_t model_bytes(const Flags& flags) {
  const std::string what = "--d-model " + std::to_string(flags.d_model) + " --layers " +
                           std::to_string(flags.layers) + " --context " +
                           std::to_string(flags.context) + " --batch " +
                           std::to_string(flags.batch) + ": the model's size";
  return dissect::examples::training_bytes(model_config(flags, 256), flags.batch, what);
}

/// Everything CLI11 cannot check, before any work. @throws UsageError naming the flag.
void validate(Flags& flags) {
  if (flags.tokenizer != "bytes") {
    const std::string prefix = "bpe:";
    if (flags.tokenizer.rfind(prefix, 0) != 0) {
      throw UsageError("--tokenizer: \"" + flags.tokenizer + "\" is not bytes or bpe:N");
    }
    const std::string count = flags.tokenizer.substr(prefix.size());
    const bool digits = !count.empty() && count.size() <= 6 &&
                        count.find_first_not_of("0123456789") == std::string::npos;
    const auto merges = digits ? std::stoul(count) : 0;
    if (merges < 1 || merges > 100000) {
      throw UsageError("--tokenizer: bpe:N needs N from 1 to 100000 (got \"" + count + "\")");
    }
    flags.bpe_merges = merges;
  }
  check_range<index_t>("--steps", flags.steps, 1, kMaxSteps);
  check_range<index_t>("--batch", flags.batch, 1, kMaxBatch);
  check_range<index_t>("--context", flags.context, 1, kMaxContext);
  check_range<index_t>("--d-model", flags.d_model, 1, kMaxWidth);
  check_range<index_t>("--layers", flags.layers, 1, kMaxLayers);
  check_range<index_t>("--heads", flags.heads, 1, flags.d_model);
  if (flags.d_model % flags.heads != 0) {
    throw UsageError("--heads: " + std::to_string(flags.heads) + " does not divide --d-model " +
                     std::to_string(flags.d_model));
  }
  check_real("--lr", flags.lr, 0, false);
  check_real("--weight-decay", flags.weight_decay, 0, true);
  if (flags.warmup) check_range<index_t>("--warmup", *flags.warmup, 0, flags.steps);
  if (flags.family != "gpt2" && flags.family != "llama") {
    throw UsageError("--family: \"" + flags.family + "\" is not gpt2 or llama");
  }
  if (flags.d_ff) check_range<index_t>("--d-ff", *flags.d_ff, 1, 4 * kMaxWidth);
  if (flags.experts != 0) {
    check_range<index_t>("--experts", flags.experts, 2, kMaxExperts);
    if (flags.family != "llama") {
      throw UsageError(
          "--experts: a mixture of experts needs --family llama (dissect's MoE decoder is "
          "Mixtral's: LLaMA's layer with SwiGLU experts)");
    }
  }
  if (flags.experts_per_token) {
    if (flags.experts == 0) throw UsageError("--experts-per-token: needs --experts");
    check_range<index_t>("--experts-per-token", *flags.experts_per_token, 1, flags.experts);
  }
  if (flags.aux_loss) {
    if (flags.experts == 0) throw UsageError("--aux-loss: needs --experts");
    check_real("--aux-loss", *flags.aux_loss, 0, true, 10);
  }
  if (!flags.q4_baseline.empty() && !std::ifstream(flags.q4_baseline)) {
    throw UsageError("--q4-baseline: cannot open \"" + flags.q4_baseline + "\"");
  }
  if (!flags.resume.empty() && (!flags.init.empty() || flags.save_init != "none")) {
    throw UsageError(std::string(flags.init.empty() ? "--save-init" : "--init") +
                     ": cannot be combined with --resume (the training state holds the weights)");
  }
  if (flags.shard_optimizer && (flags.save_state != "none" || !flags.resume.empty())) {
    throw UsageError(std::string(flags.resume.empty() ? "--save-state" : "--resume") +
                     ": cannot be combined with --shard-optimizer (each rank holds only its shard "
                     "of AdamW's state)");
  }
  if (flags.save_every != 0) {
    check_range<index_t>("--save-every", flags.save_every, 1, kMaxSteps);
    if (flags.save_state == "none") throw UsageError("--save-every: needs --save-state");
  }
  if (flags.stop_after != 0) {
    check_range<index_t>("--stop-after", flags.stop_after, 1, flags.steps);
    if (flags.save_state == "none") {
      throw UsageError("--stop-after: needs --save-state (a stopped run is continued from it)");
    }
  }
  check_range<index_t>("--eval-every", flags.eval_every, 1, kMaxSteps);
  check_range<index_t>("--eval-batches", flags.eval_batches, 1, kMaxEvalBatches);
  if (flags.threads != 0) check_range("--threads", flags.threads, 1, kMaxThreads);
#ifndef _OPENMP
  if (flags.threads > 1) {
    throw UsageError("--threads: this build has no OpenMP; configure with -DDISSECT_USE_OPENMP=ON");
  }
#endif
  index_t bytes = 0;
  try {
    bytes = model_bytes(flags);
  } catch (const dissect::OverflowError& error) {
    throw UsageError(error.what());
  }
  if (bytes > kMaxModelBytes) {
    throw UsageError("--d-model " + std::to_string(flags.d_model) + " --layers " +
                     std::to_string(flags.layers) + " --context " + std::to_string(flags.context) +
                     " --batch " + std::to_string(flags.batch) + ": training needs about " +
                     dissect::format_count(bytes) + " bytes, more than train_gpt's limit of " +
                     dissect::format_count(kMaxModelBytes));
  }
}

// ---- data ---------------------------------------------------------------------------------------

// ---- training -----------------------------------------------------------------------------------

/// --warmup, or its default.
index_t warmup_steps(const Flags& flags) {
  return flags.warmup.value_or(dissect::examples::default_warmup(flags.steps));
}

/// AdamW over one group of parameters: the matrices (weight decay) or the rest (none).
struct Optimizers {
  dissect::AdamW<float> matrices, others;

  void set_lr(double lr) {
    matrices.set_lr(lr);
    others.set_lr(lr);
  }
  void step() {
    matrices.step();
    others.step();
  }
  /// Both groups and the training batches' generator, as the training state keeps them.
  dissect::TrainingRun<float> run(dissect::Generator& batches) {
    return {.optimizers = {{"matrices", &matrices}, {"others", &others}},
            .generators = {{"batches", &batches}},
            .counters = {}};
  }
};

/// The model's parameters split as weight decay needs: rank-2 tensors and the rest.
template <class Model>
std::pair<std::vector<dissect::ParameterRef<float>>, std::vector<dissect::ParameterRef<float>>>
parameter_groups(Model& model) {
  std::vector<dissect::ParameterRef<float>> matrices, others;
  model.for_each_parameter([&](const dissect::ParameterName& name, auto value, auto grad) {
    auto& group = dissect::rank_of<decltype(value)> == 2 ? matrices : others;
    group.push_back(dissect::parameter(value, grad, name.str()));
  });
  return {std::move(matrices), std::move(others)};
}

int threads_in_use() {
#ifdef _OPENMP
  return Eigen::nbThreads();
#else
  return 1;
#endif
}

/// The curves as CSV, one row per step (--curves writes them, --compare reads them). With a
/// mixture's `load`, each report's row goes on with the experts' shares averaged over the layers
/// (load_e0 …) and then layer by layer (load_l0_e0 …, layer-major); other rows leave them empty.
std::string curves_csv(const Curves& c, const ExpertLoad* load = nullptr) {
  std::string out = "step,lr,train_loss,val_loss";
  std::string no_load;
  if (load) {
    for (index_t e = 0; e < load->experts(); ++e) out += ",load_e" + std::to_string(e);
    for (index_t l = 0; l < load->layers(); ++l) {
      for (index_t e = 0; e < load->experts(); ++e) {
        out += ",load_l" + std::to_string(l) + "_e" + std::to_string(e);
      }
    }
    no_load.assign(static_cast<std::size_t>(load->experts() * (load->layers() + 1)), ',');
  }
  out += "\n";
  char row[128];
  std::size_t v = 0, r = 0;
  if (!c.val_step.empty() && c.val_step[0] == 0) {
    std::snprintf(row, sizeof row, "0,,,%.6f", c.val[0]);
    out += row + no_load + "\n";
    v = 1;
  }
  for (std::size_t i = 0; i < c.step.size(); ++i) {
    std::snprintf(row, sizeof row, "%lld,%.6e,%.6f,", static_cast<long long>(c.step[i]), c.lr[i],
                  c.train[i]);
    out += row;
    if (v < c.val_step.size() && c.val_step[v] == c.step[i]) {
      std::snprintf(row, sizeof row, "%.6f", c.val[v++]);
      out += row;
    }
    if (load && r < load->steps().size() && load->steps()[r] == c.step[i]) {
      for (index_t e = 0; e < load->experts(); ++e) {
        std::snprintf(row, sizeof row, ",%.6f", load->mean_series(e)[r]);
        out += row;
      }
      for (const double share : load->rows()[r++]) {
        std::snprintf(row, sizeof row, ",%.6f", share);
        out += row;
      }
    } else {
      out += no_load;
    }
    out += "\n";
  }
  return out;
}

/// The validation points of a --curves file. @throws UsageError naming --compare.
Curves read_curves(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw UsageError("--compare: cannot open \"" + path + "\"");
  std::string line;
  std::getline(in, line);
  if (!line.starts_with("step,lr,train_loss,val_loss")) {
    throw UsageError("--compare: \"" + path + "\" is not a --curves file (its header is \"" + line +
                     "\")");
  }
  Curves curves;
  for (int number = 2; std::getline(in, line); ++number) {
    // val_loss is the fourth field; a mixture's run adds its experts' load after it.
    std::size_t start = 0;
    for (int field = 0; field < 3 && start != std::string::npos; ++field) {
      start = line.find(',', start);
      if (start != std::string::npos) ++start;
    }
    if (start == std::string::npos) {
      throw UsageError("--compare: " + path + ":" + std::to_string(number) + ": not a CSV row");
    }
    const std::string val = line.substr(start, line.find(',', start) - start);
    if (val.empty()) continue;  // no evaluation after this step
    try {
      curves.val_step.push_back(std::stod(line.substr(0, line.find(','))));
      curves.val.push_back(std::stod(val));
    } catch (const std::exception&) {
      throw UsageError("--compare: " + path + ":" + std::to_string(number) + ": cannot read \"" +
                       line + "\"");
    }
  }
  return curves;
}

// ---- checkpoints --------------------------------------------------------------------------------

/// The "__metadata__" of the files train_gpt writes (the keys are listed at the top).
template <class Model>
std::map<std::string, std::string> checkpoint_metadata(const Flags& flags,
                                                       const dissect::TransformerConfig& config,
                                                       const Corpus& corpus, index_t step,
                                                       std::optional<double> val_loss,
                                                       const std::string& tokenizer_json = "") {
  // The family and config as save_model writes them, so --init can compare them too.
  std::map<std::string, std::string> metadata = {
      {dissect::family_key, std::string(Model::style.family)},
      {dissect::config_key, dissect::config_to_json(config).dump()},
      {"step", std::to_string(step)},
      {"seed", std::to_string(flags.seed)},
      {"producer", "train_gpt"}};
  if (flags.bpe_merges) {
    metadata.emplace("dissect.tokenizer", "bpe");
    metadata.emplace(dissect::tools::tokenizer_json_key, tokenizer_json);
  } else {
    metadata.emplace("dissect.tokenizer", "bytes");
    metadata.emplace(vocab_bytes_key, corpus.vocab.to_json());
  }
  if (val_loss) {
    char text[32];
    std::snprintf(text, sizeof text, "%.4f", *val_loss);
    metadata.emplace("val_loss", text);
  }
  return metadata;
}

/// Loads --init into `model` after checking that the file describes the same model and
/// vocabulary. @throws UsageError naming --init for a file that cannot be read, metadata that
/// differ, or tensors that do not fit the model (dissect::io's message).
template <class Model>
void load_initial_weights(Model& model, const std::string& path,
                          const std::map<std::string, std::string>& expected) {
  std::optional<dissect::SafetensorsFile> opened;
  try {
    opened.emplace(path);
  } catch (const dissect::Error& error) {
    throw UsageError(std::string("--init: ") + error.what());
  }
  const dissect::SafetensorsFile& file = *opened;
  for (const auto& [key, value] : file.metadata()) {
    const auto ours = expected.find(key);
    const bool compared = key == dissect::family_key || key == vocab_bytes_key ||
                          (ours != expected.end() && key != "step" && key != "seed" &&
                           key != "producer" && key != "val_loss");
    if (compared && ours != expected.end() && key == dissect::config_key && ours->second != value) {
      // Name the first field that differs, not two JSON texts.
      const auto theirs_json = nlohmann::json::parse(value, nullptr, false);
      const auto ours_json = nlohmann::json::parse(ours->second);
      for (const auto& [field, wanted] : ours_json.items()) {
        const auto found = theirs_json.is_object() ? theirs_json.find(field) : theirs_json.end();
        if (theirs_json.is_object() && found != theirs_json.end() && *found == wanted) continue;
        throw UsageError("--init: " + path + " holds a model with " + field + " " +
                         (found == theirs_json.end() ? std::string("unset") : found->dump()) +
                         ", the flags and data give " + wanted.dump());
      }
    }
    if (compared && (ours == expected.end() || ours->second != value)) {
      throw UsageError("--init: " + path + " holds a model with " + key + " " +
                       (key == vocab_bytes_key ? "of another vocabulary" : value) +
                       ", the flags and data give " +
                       (ours == expected.end()   ? std::string("none")
                        : key == vocab_bytes_key ? std::string("this data's")
                                                 : ours->second));
    }
  }
  try {
    dissect::load_state_dict(model, file);
  } catch (const dissect::Error& error) {
    throw UsageError(std::string("--init: ") + error.what());
  }
}

/// The files a run writes, each opened (and so checked) before any work.
struct Outputs {
  dissect::examples::OutputFile figure, curves, checkpoint, save_init, save_state;
};

// ---- resuming -----------------------------------------------------------------------------------

/// The flags that fix a run's trajectory (--threads aside), with their effective values, and the
/// data's fingerprint: a --resume must repeat them all.
std::map<std::string, std::string> run_flags(const Flags& flags, std::span<const index_t> ids) {
  const auto real = [](double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.17g", value);
    return std::string(text);
  };
  // FNV-1a over the token ids: another text (or another split) is another run.
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (const index_t id : ids) hash = (hash ^ static_cast<std::uint64_t>(id)) * 0x100000001b3ull;
  char data[64];
  std::snprintf(data, sizeof data, "%zu tokens, FNV-1a %016llx", ids.size(),
                static_cast<unsigned long long>(hash));
  return {{"--family", flags.family},
          {"--d-model", std::to_string(flags.d_model)},
          {"--layers", std::to_string(flags.layers)},
          {"--heads", std::to_string(flags.heads)},
          {"--context", std::to_string(flags.context)},
          {"--d-ff", std::to_string(flags.d_ff.value_or(4 * flags.d_model))},
          {"--experts", std::to_string(flags.experts)},
          {"--experts-per-token", std::to_string(flags.experts_per_token.value_or(2))},
          {"--aux-loss", real(flags.aux_loss.value_or(kDefaultAuxLoss))},
          {"--bitlinear", flags.bitlinear ? "on" : "off"},
          {"--tokenizer", flags.tokenizer},
          {"--steps", std::to_string(flags.steps)},
          {"--batch", std::to_string(flags.batch)},
          {"--lr", real(flags.lr)},
          {"--warmup", std::to_string(warmup_steps(flags))},
          {"--weight-decay", real(flags.weight_decay)},
          {"--seed", std::to_string(flags.seed)},
          {"--eval-every", std::to_string(flags.eval_every)},
          {"--eval-batches", std::to_string(flags.eval_batches)},
          {"--data's text", data}};
}

/// Restores --resume's state into `model`, `optimizers`, `batches` and `curves` and returns the
/// step it was written at. @throws UsageError naming --resume for a file that cannot be read,
/// flags that differ from its run's, or a state that does not fit (dissect::io's message).
template <class Model>
index_t resume_run(const Flags& flags, std::span<const index_t> ids, Model& model,
                   Optimizers& optimizers, dissect::Generator& batches, Curves& curves) {
  namespace ex = dissect::examples;
  std::optional<dissect::SafetensorsFile> opened;
  try {
    opened.emplace(flags.resume);
  } catch (const dissect::Error& error) {
    throw UsageError(std::string("--resume: ") + error.what());
  }
  ex::check_run_flags(*opened, run_flags(flags, ids), "--resume");
  index_t step = 0;
  try {
    step = dissect::load_training_state(*opened, model, optimizers.run(batches));
  } catch (const dissect::Error& error) {
    throw UsageError(std::string("--resume: ") + error.what());
  }
  if (step >= flags.steps) {
    throw UsageError("--resume: " + flags.resume + " holds a finished run (step " +
                     std::to_string(step) + " of --steps " + std::to_string(flags.steps) + ")");
  }
  if (flags.stop_after != 0 && flags.stop_after <= step) {
    throw UsageError("--stop-after: " + std::to_string(flags.stop_after) + " is not after step " +
                     std::to_string(step) + ", where --resume " + flags.resume + " stands");
  }
  curves = ex::curves_from(*opened, step, "--resume");
  return step;
}

// ---- figure -------------------------------------------------------------------------------------

/// What this run is, beside a --compare run, in its figure's legend ("" for the default run).
std::string variant_label(const Flags& flags) {
  std::string label;
  if (flags.experts > 0) {
    label = std::to_string(flags.experts) + " experts, top-" +
            std::to_string(flags.experts_per_token.value_or(2));
  } else if (flags.family == "llama") {
    label = "LLaMA-style";
  }
  if (flags.bitlinear) label += std::string(label.empty() ? "" : ", ") + "BitLinear b1.58";
  return label;
}

/// The --svg figure. The default run draws the losses and the learning rate; a variant (another
/// family, experts, BitLinear) draws the losses, its validation curve near the end beside
/// --compare's (where the runs differ by hundredths) and, for a mixture, the experts' load.
std::string draw_figure(const Flags& flags, const dissect::TransformerConfig& config,
                        const Curves& curves, const Curves& compare, std::optional<double> q4_loss,
                        const ExpertLoad* load) {
  namespace ex = dissect::examples;
  const std::string variant = variant_label(flags);
  const std::string compare_label =
      "validation, " + std::filesystem::path(flags.compare).filename().string();
  const double last_step = static_cast<double>(flags.steps);
  // The training loss per step is noisy; its mean over each report interval is drawn on top.
  const auto [mean_step, mean_loss] = ex::interval_means(curves);
  std::vector<ex::Series> loss_series = {
      ex::line(curves.step, curves.train,
               {.label = "train (per step)", .color = "#aec7e8", .width = 1}),
      ex::line(mean_step, mean_loss, {.label = "train (interval mean)", .color = "#1f77b4"}),
      ex::line(curves.val_step, curves.val,
               {.label = variant.empty() ? "validation" : "validation (" + variant + ")",
                .color = "#ff7f0e"})};
  if (!compare.val.empty()) {
    loss_series.push_back(ex::line(compare.val_step, compare.val,
                                   {.label = compare_label, .color = "#d62728", .dash = "6 3"}));
  }
  const std::vector<double> q4_x = {0, last_step};
  const std::vector<double> q4_y(2, q4_loss.value_or(0));
  const ex::Style q4_style{.label = "q4_0 of " +
                                    std::filesystem::path(flags.q4_baseline).filename().string() +
                                    " (after training)",
                           .color = "#7f7f7f",
                           .dash = "2 3"};
  if (q4_loss) loss_series.push_back(ex::line(q4_x, q4_y, q4_style));
  const std::string loss_title = flags.bpe_merges ? "cross-entropy loss (nats per BPE token)"
                                                  : "cross-entropy loss (nats per byte)";
  std::vector<ex::Panel> panels = {
      {.title = loss_title, .xlabel = "step", .ylabel = "loss", .series = std::move(loss_series)}};
  char title[200];
  if (variant.empty()) {
    panels.push_back({.title = "learning rate",
                      .xlabel = "step",
                      .ylabel = "lr",
                      .series = {ex::line(curves.step, curves.lr, {.color = "#2ca02c"})}});
    std::snprintf(title, sizeof title,
                  "train_gpt: GPT-2 D %lld, L %lld, H %lld, context %lld on Debian's fortunes",
                  static_cast<long long>(flags.d_model), static_cast<long long>(flags.layers),
                  static_cast<long long>(flags.heads), static_cast<long long>(flags.context));
    return ex::svg(panels, 1000, 420, title);
  }
  // The validation curves from a fifth of the run on, where their differences show.
  const auto tail = [&](const Curves& c) {
    std::vector<double> xs, ys;
    for (std::size_t i = 0; i < c.val.size(); ++i) {
      if (c.val_step[i] < 0.2 * last_step) continue;
      xs.push_back(c.val_step[i]);
      ys.push_back(c.val[i]);
    }
    return std::pair{xs, ys};
  };
  ex::Panel zoom{.title = "validation loss, from step " + std::to_string(flags.steps / 5),
                 .xlabel = "step",
                 .ylabel = "loss"};
  const auto [xs, ys] = tail(curves);
  zoom.series.push_back(ex::line(xs, ys, {.label = variant, .color = "#ff7f0e"}));
  if (!compare.val.empty()) {
    const auto [cx, cy] = tail(compare);
    zoom.series.push_back(
        ex::line(cx, cy,
                 {.label = std::filesystem::path(flags.compare).filename().string(),
                  .color = "#d62728",
                  .dash = "6 3"}));
  }
  if (q4_loss) {
    const std::vector<double> tail_x = {0.2 * last_step, last_step};
    ex::Style style = q4_style;
    style.label = "q4_0 of " + std::filesystem::path(flags.q4_baseline).filename().string();
    zoom.series.push_back(ex::line(tail_x, q4_y, style));
  }
  panels.push_back(std::move(zoom));
  if (load && !load->steps().empty()) {
    // Each expert's share of the routed slots: the mean over the layers bold, each layer thin.
    ex::Panel shares{.title = "expert load (share of the routed token slots)",
                     .xlabel = "step",
                     .ylabel = "share"};
    for (index_t e = 0; e < load->experts(); ++e) {
      const char* color = ex::kTab10[static_cast<std::size_t>(e) % ex::kTab10.size()];
      for (index_t l = 0; l < load->layers(); ++l) {
        shares.series.push_back(
            ex::line(load->steps(), load->series(l, e), {.color = color, .width = 0.6}));
      }
      shares.series.push_back(ex::line(
          load->steps(), load->mean_series(e),
          {.label = "expert " + std::to_string(e) + (e == 0 ? " (bold: mean of layers)" : ""),
           .color = color,
           .width = 2}));
    }
    const std::vector<double> balanced(2, 1.0 / static_cast<double>(load->experts()));
    const std::vector<double> span = {load->steps().front(), load->steps().back()};
    shares.series.push_back(
        ex::line(span, balanced, {.label = "balanced, 1/E", .color = "#7f7f7f", .dash = "2 3"}));
    panels.push_back(std::move(shares));
  }
  std::string ffn = "F " + std::to_string(config.d_ff);
  if (config.is_moe()) {
    ffn = std::to_string(config.n_experts) + " experts of F " + std::to_string(config.d_ff) +
          ", top-" + std::to_string(config.experts_per_token);
  }
  std::snprintf(title, sizeof title,
                "train_gpt: %s D %lld, L %lld, H %lld, %s%s on Debian's fortunes",
                family_label(flags).c_str(), static_cast<long long>(flags.d_model),
                static_cast<long long>(flags.layers), static_cast<long long>(flags.heads),
                ffn.c_str(), flags.bitlinear ? ", BitLinear b1.58" : "");
  return ex::svg(panels, 400.0 * static_cast<double>(panels.size()), 420, title);
}

/// The validation loss of the float checkpoint at `path` (a model of `config`) after rounding
/// every Linear to q4_0, on `batches`: --q4-baseline. @throws UsageError as load_initial_weights.
template <class Model>
double q4_baseline_loss(const std::string& path, const dissect::TransformerConfig& config,
                        const std::map<std::string, std::string>& expected,
                        std::span<const Batch> batches, index_t B, index_t T) {
  Model float_model(config, {.seed = 0});
  try {
    load_initial_weights(float_model, path, expected);
  } catch (const UsageError& error) {
    // load_initial_weights names --init; this file came through --q4-baseline.
    throw UsageError("--q4-baseline" +
                     std::string(error.what()).substr(std::string("--init").size()));
  }
  dissect::quantize_model(float_model, dissect::WeightFormat::q4_0);
  return evaluate(float_model, batches, B, T);
}

/// Trains a `Model` (GPT2Model, LlamaModel or MixtralModel) as `flags` (validated) say.
template <class Model>
int run(const Flags& flags, Outputs& outputs) {
  auto& figure = outputs.figure;
  auto& curves_file = outputs.curves;
#ifdef _OPENMP
  if (flags.threads > 0) {
    Eigen::setNbThreads(flags.threads);
    omp_set_num_threads(flags.threads);  // dissect's attention and skinny products
  }
#endif
  Curves compare;
  if (!flags.compare.empty()) compare = read_curves(flags.compare);

  const auto load_start = Clock::now();
  Corpus corpus;
  try {
    corpus = read_fortunes(flags.data);
  } catch (const DataMissing& missing) {
    std::cerr << "train_gpt: " << missing.what() << "\n"
              << "The fortunes are not installed. Install them with:\n"
              << "  sudo apt-get install " << kFortunesPackage << "\n"
              << "or point --data at a directory of fortune files.\n";
    return dissect::examples::kExitBadInput;
  }
  std::vector<index_t> ids;
  index_t n_train = 0;
  std::string tokenizer_json;  // with --tokenizer bpe:N: the learned tokenizer.json
  index_t valid_bytes = 0;     // the validation split's bytes, for the loss per byte
  index_t bpe_vocab = 0;
  if (!flags.bpe_merges) {
    ids.resize(corpus.text.size());
    std::transform(corpus.text.begin(), corpus.text.end(), ids.begin(),
                   [&](char c) { return corpus.vocab.id_of[static_cast<unsigned char>(c)]; });
    n_train = static_cast<index_t>(ids.size()) * 9 / 10;  // n < 2^60: no overflow
    valid_bytes = static_cast<index_t>(ids.size()) - n_train;
  } else {
    // The split is made in bytes, at a character boundary, and each side encoded on its own:
    // the merges are learned from the training split only.
    std::size_t split = corpus.text.size() * 9 / 10;
    while (split > 0 && (static_cast<unsigned char>(corpus.text[split]) & 0xC0) == 0x80) --split;
    const std::string_view train_text(corpus.text.data(), split);
    const std::string_view valid_text(corpus.text.data() + split, corpus.text.size() - split);
    const dissect::text::TrainedBpe learned = dissect::text::train_bpe(
        std::span<const std::string_view>(&train_text, 1), {.merges = *flags.bpe_merges});
    tokenizer_json = learned.to_tokenizer_json();
    bpe_vocab = static_cast<index_t>(learned.vocab_size());  // fewer than 256 + N if pairs ran out
    const dissect::text::Tokenizer tokenizer = learned.to_tokenizer("train_gpt's BPE");
    for (const std::int32_t id : tokenizer.encode(train_text, false)) ids.push_back(id);
    n_train = static_cast<index_t>(ids.size());
    for (const std::int32_t id : tokenizer.encode(valid_text, false)) ids.push_back(id);
    valid_bytes = static_cast<index_t>(valid_text.size());
    std::printf(
        "train_gpt: BPE of %zu merges learned from %s bytes (%zu distinct words): %s tokens "
        "(%.2f bytes a token)\n",
        learned.merges.size(), dissect::format_count(static_cast<index_t>(split)).c_str(),
        learned.distinct_words, dissect::format_count(static_cast<index_t>(ids.size())).c_str(),
        static_cast<double>(corpus.text.size()) / static_cast<double>(ids.size()));
  }
  const auto n = static_cast<index_t>(ids.size());
  const std::span<const index_t> train(ids.data(), static_cast<std::size_t>(n_train));
  const std::span<const index_t> valid(ids.data() + n_train, static_cast<std::size_t>(n - n_train));
  const double load_seconds = seconds_since(load_start);
  const index_t T = flags.context, B = flags.batch;
  if (static_cast<index_t>(valid.size()) < T + 2) {
    throw UsageError("--context: " + std::to_string(T) + " needs splits of at least " +
                     std::to_string(T + 2) + " characters; the validation split of " + flags.data +
                     " has " + std::to_string(valid.size()));
  }

  const index_t vocab = flags.bpe_merges ? bpe_vocab : corpus.vocab.size();
  const auto config = model_config(flags, vocab);
  Model model(config, {.seed = flags.seed});
  if (!flags.init.empty()) {
    load_initial_weights(
        model, flags.init,
        checkpoint_metadata<Model>(flags, config, corpus, 0, std::nullopt, tokenizer_json));
  }

  char ffn[96];
  if (config.is_moe()) {
    std::snprintf(ffn, sizeof ffn, "%lld experts of F %lld, top-%lld",
                  static_cast<long long>(config.n_experts), static_cast<long long>(config.d_ff),
                  static_cast<long long>(config.experts_per_token));
  } else {
    std::snprintf(ffn, sizeof ffn, "F %lld", static_cast<long long>(config.d_ff));
  }
  const dissect::ParameterCount count = dissect::count_parameters(config);
  const std::string active =
      config.is_moe() ? ", " + dissect::format_count(count.active) + " active a token" : "";
  std::printf(
      "train_gpt: %s D %lld, L %lld, H %lld, %s, context %lld, vocabulary %lld "
      "(tied head): %s parameters%s (12·D²·L = %s)\n",
      family_label(flags).c_str(), static_cast<long long>(config.d_model),
      static_cast<long long>(config.n_layers), static_cast<long long>(config.n_heads), ffn,
      static_cast<long long>(config.context), static_cast<long long>(vocab),
      dissect::format_count(model.parameter_count()).c_str(), active.c_str(),
      dissect::format_count(12 * config.d_model * config.d_model * config.n_layers).c_str());
  if constexpr (Model::style.moe) {
    // The load-balancing loss is a routing option of each layer's mixture, not of the config.
    const double coef = flags.aux_loss.value_or(kDefaultAuxLoss);
    for (std::size_t i = 0; i < model.layers().size(); ++i) {
      dissect::MoeRouting routing = model.layers().at(i).ffn().routing();
      routing.load_balancing_coef = coef;
      model.layers().at(i).ffn().set_routing(routing);
    }
    std::printf("  router D → E without bias in each layer; load-balancing loss × %g\n", coef);
  }
  if (flags.bitlinear) {
    // Every Linear of every block: the head is the tied embedding, and a router stays float (its
    // E scores choose experts; BitNet quantises the model's projections).
    const auto layers = dissect::use_bitlinear(model, {.exclude_modules = {"lm_head", "router"}});
    std::printf(
        "  BitLinear (b1.58: ternary absmean W, int8 absmax x per token, straight-through) in "
        "%zu Linear layers, %s … %s; the tied head stays float\n",
        layers.size(), layers.front().c_str(), layers.back().c_str());
  }
  std::printf(
      "  data: %s bytes of %zu fortune files in %s (read in %.2f s): %s train, %s "
      "validation %s\n",
      dissect::format_count(static_cast<index_t>(corpus.text.size())).c_str(), corpus.files.size(),
      flags.data.c_str(), load_seconds, dissect::format_count(n_train).c_str(),
      dissect::format_count(n - n_train).c_str(), flags.bpe_merges ? "tokens" : "bytes");
  std::printf(
      "  weights %s; AdamW lr %g (warm-up %lld steps, cosine to %g), betas (0.9, 0.95), weight "
      "decay "
      "%g on matrices; batch %lld × %lld tokens, %lld steps, seed %llu\n",
      !flags.resume.empty() ? ("from --resume " + flags.resume).c_str()
      : flags.init.empty()  ? "from --seed"
                            : ("from " + flags.init).c_str(),
      flags.lr, static_cast<long long>(warmup_steps(flags)), 0.1 * flags.lr, flags.weight_decay,
      static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(flags.steps),
      static_cast<unsigned long long>(flags.seed));
  std::printf("  Eigen %d.%d.%d, SIMD %s, %d thread(s)\n", EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION,
              EIGEN_MINOR_VERSION, Eigen::SimdInstructionSetsInUse(), threads_in_use());
  if (const auto& mpi = dissect::examples::MpiRun::get(); mpi.parallel()) {
    std::printf("  data-parallel: %d processes × %lld windows of each batch%s\n", mpi.size(),
                static_cast<long long>(B / mpi.size()),
                flags.shard_optimizer ? ", AdamW state sharded (ZeRO-1)" : "");
  }

  if (outputs.save_init.enabled()) {
    dissect::save_model(
        outputs.save_init.path(), model,
        checkpoint_metadata<Model>(flags, config, corpus, 0, std::nullopt, tokenizer_json));
    outputs.save_init.written_elsewhere();
    std::cout << "wrote the initial weights to " << outputs.save_init.path() << "\n";
    return 0;
  }

  auto [matrices, others] = parameter_groups(model);
  const double decay = flags.weight_decay;
  // Under mpiexec -n N: the gradients averaged over the ranks' slices of every batch, and with
  // --shard-optimizer each AdamW over this rank's shard only
  // (examples/common/data_parallel_run.hpp).
  dissect::examples::DataParallelTraining<float> data_parallel(
      dissect::examples::MpiRun::get(), {&matrices, &others}, flags.shard_optimizer);
  data_parallel.to_optimizer_parameters({&matrices, &others});
  Optimizers optimizers{
      dissect::AdamW<float>(
          std::move(matrices),
          {.lr = flags.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = decay}),
      dissect::AdamW<float>(
          std::move(others),
          {.lr = flags.lr, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0})};

  std::vector<Batch> valid_batches;
  dissect::Generator valid_generator(flags.seed + 2000);
  for (index_t i = 0; i < flags.eval_batches; ++i) {
    sample_batch(valid, T, valid_generator, valid_batches.emplace_back(B, T));
  }
  dissect::Generator train_generator(flags.seed + 1000);

  // --q4-baseline's loss first: a file that does not fit fails before any evaluation.
  std::optional<double> q4_loss;
  if (!flags.q4_baseline.empty()) {
    q4_loss = q4_baseline_loss<Model>(
        flags.q4_baseline, config,
        checkpoint_metadata<Model>(flags, config, corpus, 0, std::nullopt, tokenizer_json),
        valid_batches, B, T);
    std::printf("q4_0 baseline: %s with every Linear rounded to q4_0: val %.4f\n",
                flags.q4_baseline.c_str(), *q4_loss);
  }

  Curves curves;
  index_t first_step = 0;
  if (!flags.resume.empty()) {
    // Weights, moments, steps, the batches' generator and the curves: the run goes on as if it
    // had never stopped.
    first_step = resume_run(flags, ids, model, optimizers, train_generator, curves);
    std::printf("resumed from %s at step %lld/%lld (last validation: val %.4f at step %lld)\n",
                flags.resume.c_str(), static_cast<long long>(first_step),
                static_cast<long long>(flags.steps), curves.val.back(),
                static_cast<long long>(curves.val_step.back()));
  } else {
    curves.val_step.push_back(0);
    curves.val.push_back(evaluate(model, valid_batches, B, T));
    std::printf("step %6d/%lld  val %.4f  (before training)\n", 0,
                static_cast<long long>(flags.steps), curves.val.back());
  }
  std::fflush(stdout);
  // --save-state: the weights, both AdamW states, the batches' position and the curves.
  const auto save_state = [&](index_t step) {
    if (!outputs.save_state.enabled()) return;  // data-parallel: rank 0 alone writes it
    auto metadata =
        checkpoint_metadata<Model>(flags, config, corpus, step, curves.val.back(), tokenizer_json);
    metadata.emplace(dissect::examples::run_flags_key,
                     dissect::examples::run_flags_text(run_flags(flags, ids)));
    const auto extra = dissect::examples::curves_tensors(curves);
    dissect::save_training_state(outputs.save_state.path(), model, optimizers.run(train_generator),
                                 step, metadata, extra);
    outputs.save_state.written_elsewhere();
  };

  const dissect::examples::TrainLoop loop{.steps = flags.steps,
                                          .eval_every = flags.eval_every,
                                          .batch = B,
                                          .context = T,
                                          .lr = flags.lr,
                                          .warmup = warmup_steps(flags),
                                          .first_step = first_step,
                                          .stop_after = flags.stop_after};
  // A mixture's load is read from each step's routing and reported with the validation loss.
  ExpertLoad load(config.n_layers, config.n_experts);
  index_t steps_done = first_step;
  const index_t last_step = flags.stop_after != 0 ? flags.stop_after : flags.steps;
  const auto on_step = [&](const typename Model::Cache& cache, bool report) {
    ++steps_done;
    if (flags.save_every != 0 && steps_done % flags.save_every == 0 && steps_done < last_step) {
      save_state(steps_done);  // the last step's state is written after the loop
      std::printf("  wrote the training state at step %lld to %s\n",
                  static_cast<long long>(steps_done), outputs.save_state.path().c_str());
      std::fflush(stdout);
    }
    if constexpr (Model::style.moe) {
      load.add(cache);
      if (!report) return;
      load.report(steps_done);
      const auto& shares = load.rows().back();
      std::printf("  expert load, mean of %lld layers:", static_cast<long long>(load.layers()));
      for (index_t e = 0; e < load.experts(); ++e) {
        std::printf(" %.3f", load.mean_series(e).back());
      }
      std::printf(" (each layer's within %.3f … %.3f; balanced: %.3f)\n",
                  *std::min_element(shares.begin(), shares.end()),
                  *std::max_element(shares.begin(), shares.end()),
                  1.0 / static_cast<double>(load.experts()));
      std::fflush(stdout);
    }
  };
  const auto time = data_parallel.train(model, optimizers, loop, train, train_generator,
                                        valid_batches, curves, on_step);
  if (last_step < flags.steps) {
    save_state(last_step);
    std::printf(
        "stopped after step %lld/%lld: wrote the training state to %s (train_gpt --resume %s, "
        "with the same flags, continues the run)\n",
        static_cast<long long>(last_step), static_cast<long long>(flags.steps),
        outputs.save_state.path().c_str(), outputs.save_state.path().c_str());
    return 0;
  }
  const index_t last = std::min(flags.steps, flags.eval_every);
  double last_mean = 0;
  for (index_t i = flags.steps - last; i < flags.steps; ++i)
    last_mean += curves.train[static_cast<std::size_t>(i)];
  last_mean /= static_cast<double>(last);
  std::printf(
      "final: train loss %.4f (mean of the last %lld steps), val loss %.4f; %lld steps in "
      "%.1f s, training %.1f s = %s tok/s\n",
      last_mean, static_cast<long long>(last), curves.val.back(),
      static_cast<long long>(flags.steps - first_step), time.total, time.training,
      grouped(static_cast<double>((flags.steps - first_step) * B * T) / time.training).c_str());
  std::printf("%s", data_parallel.report(time.training).c_str());
  // Per byte: the loss per token times the validation split's tokens per byte (1 for bytes).
  const double tokens_per_byte =
      static_cast<double>(n - n_train) / static_cast<double>(valid_bytes);
  std::printf("val loss per byte %.4f nats (%s tokenizer, %.3f tokens a byte)\n",
              curves.val.back() * tokens_per_byte, flags.tokenizer.c_str(), tokens_per_byte);
  if (q4_loss) {
    std::printf("against --q4-baseline's q4_0 rounding: val %.4f here, %.4f there (%+.4f)\n",
                curves.val.back(), *q4_loss, curves.val.back() - *q4_loss);
  }

  if (outputs.checkpoint.enabled()) {
    auto metadata = checkpoint_metadata<Model>(flags, config, corpus, flags.steps,
                                               curves.val.back(), tokenizer_json);
    if (flags.bitlinear) {
      // The file holds what the trained layers multiply by, Q(W) = round(W/γ)·γ, not the float
      // master weights: a reader that knows nothing of BitLinear (dissect generate, dissect
      // quantize) then runs ternary weights. It runs the activations in float, where training
      // rounded them to int8 per token.
      Model ternary = model;
      dissect::for_each_layer(ternary, [](const std::string&, dissect::Linear<float>& layer) {
        if (!layer.bitlinear()) return;
        layer.set_bitlinear(false);
        auto w = layer.weight().matrix();
        dissect::ternary_fake_quantize<float>(w, w);
      });
      metadata.emplace("bitlinear",
                       "weights are BitLinear's Q(W), ternary times a per-tensor scale");
      dissect::save_model(outputs.checkpoint.path(), ternary, metadata);
    } else {
      dissect::save_model(outputs.checkpoint.path(), model, metadata);
    }
    outputs.checkpoint.written_elsewhere();
    std::cout << "wrote " << outputs.checkpoint.path() << "\n";
  }
  if (outputs.save_state.enabled()) {
    save_state(flags.steps);
    std::cout << "wrote the training state to " << outputs.save_state.path() << "\n";
  }
  if (curves_file.enabled()) {
    curves_file.write(curves_csv(curves, Model::style.moe ? &load : nullptr));
    std::cout << "wrote " << curves_file.path() << "\n";
  }
  if (figure.enabled()) {
    figure.write(
        draw_figure(flags, config, curves, compare, q4_loss, Model::style.moe ? &load : nullptr));
    std::cout << "wrote " << figure.path() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  namespace ex = dissect::examples;
  auto& mpi = ex::MpiRun::start(argc, argv);  // under mpiexec -n N > 1: data-parallel
  CLI::App app("train_gpt — train a character-level GPT-2 of dissect on Debian's fortunes",
               "train_gpt");
  Flags flags;
  add_flags(app, flags);
  if (const auto status = ex::parse_command_line(app, argc, argv)) return *status;
  // An unreadable data file and a configuration or file the library refuses are bad input too
  // (status 2).
  return ex::run_program<DataError, dissect::Error>("train_gpt", [&] {
    validate(flags);
    mpi.check_batch(flags.batch);
    mpi.no_files_on_other_ranks(
        {&flags.svg, &flags.curves, &flags.checkpoint, &flags.save_init, &flags.save_state});
    // Bad paths fail now, not after training.
    Outputs outputs = mpi.on_this_rank("train_gpt", [&] {
      return Outputs{ex::OutputFile("--svg", flags.svg), ex::OutputFile("--curves", flags.curves),
                     ex::OutputFile("--checkpoint", flags.checkpoint),
                     ex::OutputFile("--save-init", flags.save_init),
                     ex::OutputFile("--save-state", flags.save_state)};
    });
    if (flags.experts > 0) return run<dissect::MixtralModel<float>>(flags, outputs);
    if (flags.family == "llama") return run<dissect::LlamaModel<float>>(flags, outputs);
    return run<dissect::GPT2Model<float>>(flags, outputs);
  });
}
