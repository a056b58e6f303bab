// tools/dissect/generate_command.hpp — `dissect generate`: continue a prompt with a checkpoint or
// a GGUF file, streaming the new tokens, then the speed; or beam search, or speculative decoding
// with a draft model. The sampling, the search and the decoding are the library's (models/).
//
//   dissect generate CHECKPOINT|FILE.gguf (--prompt TEXT | --tokens 464,2068,…) [--ids]
//                    [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P]
//                    [--repetition-penalty R] [--frequency-penalty F] [--presence-penalty P]
//                    [--seed S] [--num-beams N [--length-penalty X] [--num-return-sequences K]]
//                    [--draft CHECKPOINT [--gamma N]]
//                    [--threads N] [--no-pack]
//
// A checkpoint directory's tokenizer.json (or GPT-2's vocab.json + merges.txt) turns --prompt
// into ids (BOS as the tokenizer says) and the new ids back into streamed text
// (dissect/text/prompt_codec.hpp); a file dissect's train_gpt wrote carries its byte vocabulary
// instead.
// What the model's config decides (a token id against the vocabulary, the prompt's length against
// the context) is checked before its weights load.
#pragma once

#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "dissect/io/open_model.hpp"
#include "dissect/kernels/cpu_dispatch.hpp"
#include "dissect/models/beam_search.hpp"
#include "dissect/models/generate.hpp"
#include "dissect/models/speculative_decoding.hpp"
#include "dissect/text/prompt_codec.hpp"
#include "tools/common/byte_vocab.hpp"
#include "tools/common/parse.hpp"
#include "tools/dissect/command.hpp"
#include "tools/dissect/gguf_commands.hpp"
#include "tools/dissect/model_loading.hpp"

namespace dissect::tools {

namespace detail_generate {

namespace fs = std::filesystem;

/// generate's flags, each already read and range-checked (run does it before any file opens).
struct GenerateOptions {
  fs::path checkpoint;
  std::optional<std::string> prompt;
  std::optional<std::string> tokens;  ///< as given; its syntax is checked, the vocabulary later
  index_t max_new_tokens = 64;
  /// temperature 0.8 unless --temperature says otherwise; the other fields as the flags give them
  dissect::SamplingOptions sampling{.temperature = 0.8};
  std::uint64_t seed = 0;
  bool print_ids = false;  ///< --ids: the prompt's and the new tokens' ids, not their text
  index_t num_beams = 0;   ///< --num-beams: 0 samples; N >= 1 runs beam search instead
  double length_penalty = 1.0;
  index_t num_return_sequences = 1;
  std::optional<fs::path> draft;  ///< --draft: speculative decoding with this model proposing
  index_t gamma = 4;              ///< --gamma: its proposals per round
  /// --threads: the threads every product may use; 0 leaves OpenMP's default (OMP_NUM_THREADS,
  /// else one per core).
  index_t threads = 0;
  bool no_pack = false;  ///< --no-pack: float weights stay as loaded, without a packed copy
  /// When generate began (before any file opened): the load's time is printed with the rates.
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

/// The threads the products run on after --threads, and where the count came from.
inline std::string thread_report(index_t asked) {
#ifdef _OPENMP
  return dissect::concat(omp_get_max_threads(), " (OpenMP; ",
                         asked > 0 ? "--threads" : "OMP_NUM_THREADS or the cores", ")");
#else
  (void)asked;
  return "1 (this build has no OpenMP)";
#endif
}

/// Why --prompt cannot be encoded for a model without a byte vocabulary or a tokenizer: the
/// GGUF tokenizer dissect does not implement, a GGUF file without one, or a checkpoint whose
/// directory holds none; --tokens gives ids instead.
inline std::string why_no_text(const GenerateOptions& o, const dissect::tools::ModelText& text) {
  if (!text.tokenizer_error.empty()) return text.tokenizer_error;
  if (text.gguf) {
    return dissect::concat(o.checkpoint.string(),
                           " carries no tokenizer (tokenizer.ggml.model); give token ids with "
                           "--tokens");
  }
  return "this checkpoint carries no vocabulary and its directory holds no tokenizer.json (or "
         "vocab.json + merges.txt); give token ids with --tokens";
}

/// The formats of a quantised weight: one, or one per run of rows stacked from ggml formats.
inline std::vector<dissect::WeightFormat> layer_formats(const dissect::QuantizedWeight& weight) {
  std::vector<dissect::WeightFormat> formats;
  for (const auto& run : weight.ggml_rows()) {
    if (std::find(formats.begin(), formats.end(), run.format) == formats.end()) {
      formats.push_back(run.format);
    }
  }
  if (formats.empty()) formats.push_back(weight.format());
  return formats;
}

/// --num-beams: the prompt once, then each of the n best continuations on a line of its own
/// with its score, as text (after the prompt, so the tokenizer decodes it in context) or ids.
template <class Model>
int run_beam_search(const Model& model, const std::vector<index_t>& prompt,
                    const dissect::text::PromptCodec& codec, const GenerateOptions& o) {
  const auto result = dissect::beam_search(model, prompt,
                                           {.num_beams = o.num_beams,
                                            .length_penalty = o.length_penalty,
                                            .max_new_tokens = o.max_new_tokens,
                                            .num_return_sequences = o.num_return_sequences});
  const bool as_text = !o.print_ids && codec.has_text();
  const auto text_of = [&](const std::vector<index_t>& ids, bool first) {
    std::string text;
    if (as_text) {
      auto decoder = codec.decoder();
      for (const index_t id : prompt) (void)decoder.push(id);
      for (const index_t id : ids) text += decoder.push(id).value_or("?");  // an id without text
      text += decoder.finish();
    } else {
      for (std::size_t i = 0; i < ids.size(); ++i) {
        text += (first && i == 0 ? "" : ",") + std::to_string(ids[i]);
      }
    }
    return text;
  };
  std::cout << (o.prompt && !o.print_ids ? *o.prompt : text_of(prompt, true)) << "\n";
  for (std::size_t i = 0; i < result.sequences.size(); ++i) {
    std::cout << "beam " << i + 1 << "  score " << result.sequences[i].score << "  "
              << text_of(result.sequences[i].tokens, false) << "\n";
  }
  std::cout << "\n"
            << result.steps << " forwards of " << o.num_beams << " beams"
            << (result.stopped_at_context ? " (stopped: the context is full)" : "") << "\n";
  return exit_ok;
}

/// Samples (or, with a draft, decodes speculatively), streaming the tokens, then the speed.
template <class Model, class Draft = std::nullptr_t>
int run_generation(const Model& model, const std::vector<index_t>& prompt,
                   const dissect::text::PromptCodec& codec, const GenerateOptions& o,
                   bool packed = false, [[maybe_unused]] const Draft* draft = nullptr) {
  if (o.num_beams > 0) return run_beam_search(model, prompt, codec, o);
  // With a tokenizer or a byte vocabulary, new ids print as text as soon as they complete a
  // character, and an id without text as ",id"; the prompt goes through the decoder first, so
  // that decoders that look at context (LLaMA's first-space Strip) treat the continuation as the
  // middle of the text it is.
  std::optional<dissect::text::PromptCodec::Decoder> decoder;
  const auto text_of = [&](index_t id) {
    return decoder->push(id).value_or(dissect::concat(',', id));
  };
  if (codec.has_text() && !o.print_ids) {
    decoder.emplace(codec.decoder());
    std::string prompt_text;
    for (const index_t id : prompt) prompt_text += text_of(id);
    if (!o.prompt) std::cout << prompt_text;
  }
  if (o.prompt && !o.print_ids) {
    std::cout << *o.prompt;
  } else if (!decoder) {
    for (std::size_t i = 0; i < prompt.size(); ++i) std::cout << (i ? "," : "") << prompt[i];
  }
  std::cout.flush();
  const double load_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - o.started).count();
  const auto show = [&](index_t id) {
    if (decoder) {
      std::cout << text_of(id);
    } else {
      std::cout << ',' << id;
    }
    std::cout.flush();
  };
  // How many threads the products ran on, and what loading cost.
  const auto print_setup = [&] {
    std::cout << "cpu      " << dissect::cpu_model_name() << " (kernel paths:";
    for (const auto path : dissect::supported_kernel_paths()) {
      std::cout << " " << dissect::kernel_path_name(path);
    }
    std::cout << ")\n"
              << "threads  " << thread_report(o.threads) << "\n"
              << "load     " << load_seconds << " s (the file read, the model built"
              << (packed ? " and packed" : "") << ")\n";
  };
  if constexpr (!std::is_same_v<Draft, std::nullptr_t>) {
    const auto result = dissect::speculative_generate(model, *draft, prompt,
                                                      {.gamma = o.gamma,
                                                       .max_new_tokens = o.max_new_tokens,
                                                       .sampling = o.sampling,
                                                       .seed = o.seed},
                                                      show);
    if (decoder) std::cout << decoder->finish();
    const auto& stats = result.stats;
    std::cout << "\n\nspeculative  " << stats.new_tokens << " tokens in " << stats.seconds
              << " s (prefill included), " << stats.tokens_per_second() << " tokens/s"
              << (stats.stopped_at_context ? " (stopped: the context is full)" : "") << "\n"
              << "draft        " << stats.accepted << " of " << stats.proposed
              << " proposals accepted (" << 100 * stats.acceptance_rate() << " %), gamma "
              << o.gamma << "; " << stats.target_forwards << " target forwards, "
              << stats.draft_forwards << " draft forwards\n";
    print_setup();
    return exit_ok;
  }
  const dissect::GenerationOptions options{
      .max_new_tokens = o.max_new_tokens, .sampling = o.sampling, .seed = o.seed};
  const auto stats = dissect::generate(model, prompt, options, show);
  if (decoder) std::cout << decoder->finish();
  std::cout << "\n\nprefill  " << stats.prompt_tokens << " prompt tokens (and the first new one), "
            << stats.prefill_tokens_per_second() << " tokens/s\n"
            << "decode   " << std::max<index_t>(stats.new_tokens - 1, 0) << " tokens, "
            << stats.decode_tokens_per_second() << " tokens/s"
            << (stats.stopped_at_context ? " (stopped: the context is full)" : "") << "\n"
            << "total    " << stats.new_tokens << " tokens in "
            << stats.prefill_seconds + stats.decode_seconds << " s (prefill included), "
            << (stats.prefill_seconds + stats.decode_seconds > 0
                    ? static_cast<double>(stats.new_tokens) /
                          (stats.prefill_seconds + stats.decode_seconds)
                    : 0.0)
            << " tokens/s\n";
  if constexpr (std::is_same_v<typename Model::scalar_type, float>) {
    // Which storage each layer's forward read, and the kernel path its format ran on.
    std::map<std::string, int> layers;
    dissect::for_each_layer(model, [&](const std::string&, const dissect::Linear<float>& layer) {
      if (!layer.quantized()) {
        // Packed: the model's products (its FFN's gate and up fused into one) read packed W.
        ++layers[packed ? "fp32 packed" : "fp32"];
        return;
      }
      for (const auto format : layer_formats(layer.quantized_weight())) {
        ++layers[dissect::concat(dissect::weight_format_name(format), " on ",
                                 dissect::kernel_path_name(dissect::quant::active_kernel_path(
                                     format, stats.prompt_tokens)))];
      }
    });
    std::cout << "weights ";
    for (const auto& [what, count] : layers) std::cout << " " << what << " ×" << count;
    std::cout << "\n";
  }
  print_setup();
  return exit_ok;
}

inline int generate(GenerateOptions o) {
  o.started = std::chrono::steady_clock::now();
  // Inference: the models are built without gradient buffers (as large as their weights) and
  // without the random values the file overwrites.
  const dissect::ConstructionScope inference({.gradients = false});
  std::vector<index_t> prompt;
  // The draft proposes the model's own ids: its config (and byte vocabulary, if it records one)
  // is checked with the model's, before either model's weights load.
  std::optional<dissect::DetectedCheckpoint> draft_source;
  std::optional<dissect::text::PromptCodec> codec;  // borrows the ModelText with_model holds
  // Everything the model's config decides (the prompt's ids against its vocabulary and context)
  // is checked before the weights load.
  const auto check = [&](const dissect::tools::ModelText& text) {
    codec.emplace(dissect::tools::prompt_codec(text, why_no_text(o, text)));
    const dissect::text::PromptLimits limits{.vocab = text.config.vocab,
                                             .context = text.config.context};
    if (o.prompt) {
      prompt = codec->prompt(*o.prompt, limits, "--prompt");
    } else {
      prompt = dissect::tools::parse_token_ids(*o.tokens, "--tokens", limits.vocab);
      dissect::text::check_prompt(prompt, limits, "--tokens");
    }
    if (!o.draft) return;
    const char* const no_gguf =
        "--draft: speculative decoding reads safetensors checkpoints, not GGUF files";
    if (text.gguf) throw dissect::ConfigError(no_gguf);
    draft_source.emplace(dissect::detect_checkpoint(*o.draft));
    if (draft_source->kind == dissect::CheckpointKind::gguf) throw dissect::ConfigError(no_gguf);
    const dissect::index_t draft_vocab = draft_source->require_model("--draft").config.vocab;
    if (draft_vocab != text.config.vocab) {
      throw dissect::ConfigError(
          dissect::concat("--draft: ", o.draft->string(), " has a vocabulary of ", draft_vocab,
                          " tokens, the model's has ", text.config.vocab,
                          " (the draft must propose the model's token ids)"));
    }
    const auto draft_bytes = dissect::tools::ByteVocab::from_metadata(
        draft_source->checkpoint.metadata(), draft_source->checkpoint.path().string());
    if (text.vocab.has_value() != draft_bytes.has_value() ||
        (text.vocab && text.vocab->bytes != draft_bytes->bytes)) {
      throw dissect::ConfigError(dissect::concat(
          "--draft: ", o.draft->string(),
          "'s byte vocabulary differs from the model's (the same ids would be other bytes)"));
    }
  };
  return dissect::tools::with_model(
      o.checkpoint, "generate", check, [&](auto& model, const dissect::tools::ModelText& text) {
        const bool packed = !o.no_pack && dissect::tools::pack_for_inference(model);
        if (!draft_source) {
          return run_generation(model, prompt, *codec, o, packed);
        }
        return dissect::visit_model(
            *draft_source,
            [&](const auto& draft) {
              return run_generation(model, prompt, *codec, o, packed, &draft);
            },
            "--draft");
      });
}

}  // namespace detail_generate

/// `dissect generate` and its flags.
class GenerateCommand final : public Command {
 public:
  explicit GenerateCommand(CLI::App& app)
      : Command(
            app.add_subcommand("generate", "continue a prompt, streaming tokens, then tokens/s")) {
    CLI::App* generate_command = &this->app();
    generate_command
        ->add_option("checkpoint", options_.checkpoint,
                     ".safetensors file, index .json, or a directory")
        ->required();
    auto* prompt = generate_command->add_option(
        "--prompt", options_.prompt,
        "text (the checkpoint's tokenizer.json or vocab.json + merges.txt, or a GGUF file's own "
        "tokenizer, encodes it)");
    auto* tokens = generate_command->add_option(
        "--tokens", options_.tokens, "token ids, plain decimal integers >= 0: 464,2068,…");
    prompt->excludes(tokens);
    generate_command->add_option("--max-new-tokens", max_new_tokens_, "an integer >= 0")
        ->capture_default_str();
    generate_command->add_option("--temperature", temperature_, ">= 0; 0: greedy")
        ->capture_default_str();
    generate_command->add_option("--top-k", top_k_, "an integer >= 0; 0: every token")
        ->capture_default_str();
    // The sampling flags of Hugging Face's generate (and OpenAI's two penalties), applied in HF's
    // order: the penalties, then temperature, top-k, top-p, min-p (dissect/decoding/sampling.hpp).
    generate_command
        ->add_option("--top-p", top_p_,
                     "in (0, 1]: sample from the smallest set of most probable tokens whose "
                     "probabilities reach it; 1: every token")
        ->capture_default_str();
    generate_command
        ->add_option("--min-p", min_p_,
                     "in [0, 1]: drop tokens less probable than it times the most probable one's "
                     "probability; 0: none")
        ->capture_default_str();
    generate_command
        ->add_option("--repetition-penalty", repetition_penalty_,
                     "> 0: Hugging Face's, on every token of the prompt and of the output (a logit "
                     "l >= 0 becomes l / R, l < 0 becomes l * R); 1: none")
        ->capture_default_str();
    generate_command
        ->add_option("--frequency-penalty", frequency_penalty_,
                     "OpenAI's: subtract it times how often a token was generated; 0: none")
        ->capture_default_str();
    generate_command
        ->add_option("--presence-penalty", presence_penalty_,
                     "OpenAI's: subtract it from every token generated so far; 0: none")
        ->capture_default_str();
    generate_command->add_option("--seed", seed_, "an integer in [0, 2^64 - 1]")
        ->capture_default_str();
    generate_command->add_flag("--ids", options_.print_ids,
                               "print the prompt's and the new tokens' ids, not their text");
    auto* beams_option = generate_command->add_option(
        "--num-beams", num_beams_,
        "beam search with N beams (an integer >= 1) instead of sampling: prints the best "
        "continuations with their scores");
    generate_command
        ->add_option("--length-penalty", length_penalty_,
                     "beam search: a score is the sum of log-probabilities / new tokens^X (X >= 0)")
        ->needs(beams_option)
        ->capture_default_str();
    generate_command
        ->add_option("--num-return-sequences", num_return_sequences_,
                     "beam search: how many of the best to print (1 to --num-beams)")
        ->needs(beams_option)
        ->capture_default_str();
    draft_option_ =
        generate_command
            ->add_option("--draft", draft_path_,
                         "speculative decoding: a smaller model of the same vocabulary proposes "
                         "tokens that the model verifies, the output distributed as the model's "
                         "alone; prints the proposals accepted")
            ->excludes(beams_option);
    generate_command
        ->add_option("--gamma", gamma_,
                     "speculative decoding: proposals per round (an integer >= 1)")
        ->needs(draft_option_)
        ->capture_default_str();
    generate_command->add_flag(
        "--no-pack", options_.no_pack,
        "keep float weights as loaded: no packed copy (as many bytes again), slower prefill");
    generate_command->add_option(
        "--threads", threads_,
        "an integer >= 1: the threads the products run on (default: OMP_NUM_THREADS, else the "
        "cores); a build without OpenMP runs 1");
  }

  int run() override {
    using detail_generate::GenerateOptions;
    GenerateOptions& g = options_;
    if (!g.prompt && !g.tokens) {
      throw dissect::ConfigError("generate: give --prompt TEXT or --tokens IDS");
    }
    if (g.tokens) (void)tools::parse_token_ids(*g.tokens, "--tokens");  // the vocabulary: later
    if (g.prompt && g.prompt->empty()) throw dissect::ConfigError("--prompt: the prompt is empty");
    g.max_new_tokens = tools::parse_integer(max_new_tokens_, "--max-new-tokens");
    g.sampling.temperature = tools::parse_non_negative_real(temperature_, "--temperature");
    g.sampling.top_k = tools::parse_integer(top_k_, "--top-k");
    const auto real_in = [](const std::string& text, std::string_view flag, std::string_view range,
                            auto inside) {
      const double value = tools::parse_real(text, flag);
      if (!inside(value)) {
        throw dissect::ConfigError(
            dissect::concat(flag, ": must be ", range, " (got \"", text, "\")"));
      }
      return value;
    };
    g.sampling.top_p =
        real_in(top_p_, "--top-p", "in (0, 1]", [](double p) { return p > 0 && p <= 1; });
    g.sampling.min_p =
        real_in(min_p_, "--min-p", "in [0, 1]", [](double p) { return p >= 0 && p <= 1; });
    g.sampling.repetition_penalty =
        real_in(repetition_penalty_, "--repetition-penalty", "> 0", [](double r) { return r > 0; });
    g.sampling.frequency_penalty = tools::parse_real(frequency_penalty_, "--frequency-penalty");
    g.sampling.presence_penalty = tools::parse_real(presence_penalty_, "--presence-penalty");
    g.seed = tools::parse_uint64(seed_, "--seed");
    if (!threads_.empty()) {
      // More threads than this bound is a typo, not a machine: refuse it before OpenMP tries.
      constexpr index_t most_threads = 4096;
      g.threads = tools::parse_integer(threads_, "--threads", 1);
      if (g.threads > most_threads) {
        throw dissect::ConfigError(
            dissect::concat("--threads: must be <= ", most_threads, " (got ", g.threads, ")"));
      }
#ifdef _OPENMP
      omp_set_num_threads(static_cast<int>(g.threads));
#else
      if (g.threads > 1) {
        throw dissect::ConfigError(
            dissect::concat("--threads: ", g.threads,
                            " threads need OpenMP, and this build has none (configure with "
                            "-DDISSECT_USE_OPENMP=ON, as the release preset does)"));
      }
#endif
    }
    if (!num_beams_.empty()) {
      g.num_beams = tools::parse_integer(num_beams_, "--num-beams", 1);
      g.length_penalty = tools::parse_non_negative_real(length_penalty_, "--length-penalty");
      g.num_return_sequences =
          tools::parse_integer(num_return_sequences_, "--num-return-sequences", 1);
      if (g.num_return_sequences > g.num_beams) {
        throw dissect::ConfigError(
            dissect::concat("--num-return-sequences: ", g.num_return_sequences,
                            " is more than the ", g.num_beams, " of --num-beams"));
      }
    }
    if (draft_option_->count() > 0) {
      g.draft = draft_path_;
      g.gamma = tools::parse_integer(gamma_, "--gamma", 1);
    }
    return detail_generate::generate(g);
  }

 private:
  detail_generate::GenerateOptions options_;
  // Values are read as text and parsed by run() (tools/common/parse.hpp).
  std::string max_new_tokens_ = "64", temperature_ = "0.8", top_k_ = "0", seed_ = "0";
  std::string top_p_ = "1", min_p_ = "0", repetition_penalty_ = "1", frequency_penalty_ = "0",
              presence_penalty_ = "0";
  std::string num_beams_, length_penalty_ = "1", num_return_sequences_ = "1";
  std::string draft_path_, gamma_ = "4";
  std::string threads_;
  CLI::Option* draft_option_ = nullptr;
};

}  // namespace dissect::tools
