// dissect/io/open_model.hpp — what a path holds, found out in one place, and the model in it.
//
// detect_checkpoint recognises every kind of model file dissect reads: a Hugging Face checkpoint
// (one .safetensors or an index and its shards, with a config.json beside them), a file
// save_model wrote (its config in the metadata; with quantised layers or not), a LoRA adapter
// file, bare tensors (save_module's state_dict), or a GGUF file (llama.cpp's, known by its magic
// whatever its name). It opens the weights, reads the config, and says which kind it found,
// before any weight is read: the config, and the tokenizer (text/checkpoint_tokenizer.hpp), can
// be checked first. open_model<Model>(path) and visit_model(…) then load the model. A path that
// is none of these is an Error naming it.
//
//   const dissect::DetectedCheckpoint found = dissect::detect_checkpoint("model.gguf");
//   const dissect::index_t vocab = found.require_model("my_tool").config.vocab;  // no weight read
//   auto model = dissect::load_model<dissect::LlamaModel<float>>(found);
//   dissect::visit_model(dissect::detect_checkpoint(path), [](auto& model) { … });
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>

#include "dissect/core/error.hpp"
#include "dissect/io/checkpoint.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"
#include "dissect/io/gguf_weights.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/hf_names.hpp"
#include "dissect/io/huggingface.hpp"
#include "dissect/io/lora_file.hpp"
#include "dissect/io/model_file.hpp"
#include "dissect/io/quantized_file.hpp"
#include "dissect/models/decoder_model.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// The kinds of checkpoint dissect reads.
enum class CheckpointKind {
  hugging_face,       ///< safetensors (one file, or an index and its shards) beside a config.json
  dissect_model,      ///< a file save_model wrote: family and config in its __metadata__
  dissect_quantized,  ///< the same with quantised Linear weights ("dissect.quantization")
  lora_adapter,       ///< LoRA adapters alone (save_adapters, PEFT's names): no model in it
  state_dict,         ///< tensors without a model config (save_module, or any safetensors)
  gguf,               ///< llama.cpp's file: its config and tokenizer in its metadata
};

/// "hugging_face", "dissect_model", "dissect_quantized", "lora_adapter", "state_dict", "gguf".
/// @throws ConfigError naming the type and value for a value outside the enum.
std::string_view checkpoint_kind_name(CheckpointKind kind);

/// What detect_checkpoint found at a path.
struct DetectedCheckpoint {
  CheckpointKind kind;
  /// The weights, every shard opened and checked. gguf: no shards or tensors (they are in
  /// `gguf`), but path() still names the file.
  Checkpoint checkpoint;
  /// Family and config: hugging_face, dissect_* and gguf (of a llama or gpt2 architecture, every
  /// tensor checked against it by read_gguf_config).
  std::optional<HfConfig> model;
  std::filesystem::path config_file;  ///< hugging_face: the config.json read; else empty
  std::optional<GgufFile> gguf;       ///< gguf: the file, mapped and checked; else empty

  /// Whether the weights are an index and its shards (else one .safetensors file).
  bool sharded() const { return checkpoint.path().extension() == ".json"; }
  /// Where the model's config comes from, for a report: the config.json, the file's metadata,
  /// or "none (…)" saying why there is none.
  std::string config_source() const;
  /// The family and config. @throws ConfigError naming `op`, the file and the kind when the
  /// checkpoint records none (state_dict, lora_adapter); for a GGUF file of an architecture
  /// dissect does not build, read_gguf_config's FormatError naming the file and the architecture.
  const HfConfig& require_model(std::string_view op) const;
};

/// How load_model, open_model and visit_model load the weights.
struct ModelLoadOptions {
  /// A GGUF file's quantised tensors (io/gguf_weights.hpp): kept as blocks on the quantised
  /// kernels or run in float (keep_quantized), and the float copy of kept layers freed
  /// (release_dense, for inference). Other kinds ignore it.
  GgufLoadOptions gguf{};
};

/// Opens `path` and recognises what it is: a GGUF file (any regular file starting with "GGUF":
/// is_gguf_file), a .safetensors file, an index .json, or a directory holding them (found as
/// Checkpoint finds them), beside a config.json or not. A GGUF file is mapped and checked whole
/// (GgufFile), and of a llama or gpt2 architecture its config read (read_gguf_config); of another
/// architecture it is still detected, without a model. Otherwise the kind follows from the
/// weights' metadata first ("dissect.lora" or PEFT's names: lora_adapter; save_model's
/// "dissect.family"/"dissect.config": dissect_model or dissect_quantized), then from a
/// config.json in the directory (hugging_face), else state_dict.
/// @throws Error naming the path if it does not exist, is a directory without weights (saying
///         whether it holds a config.json) or is a config.json itself; FormatError naming it if a
///         file is neither a GGUF nor a safetensors file; as GgufFile and read_gguf_config
///         (FormatError naming the GGUF file and the field); as Checkpoint (a corrupt index or
///         shard, naming it), read_hf_config and model_config_of (ConfigError naming the file
///         and the key).
DetectedCheckpoint detect_checkpoint(const std::filesystem::path& path);

/// The model `checkpoint` holds, strictly (every parameter present and shaped right): Hugging
/// Face names and layouts through HfCheckpointView, a save_model file through
/// load_module_quantized, a GGUF file through load_gguf_model with options.gguf.
/// @throws ConfigError naming the file if it records no model or one of another family; as
///         load_state_dict, load_module_quantized and load_gguf_model.
template <class Model>
Model load_model(const DetectedCheckpoint& checkpoint, const ModelLoadOptions& options = {});

/// load_model(detect_checkpoint(path), options): a GPT2Model, LlamaModel or MixtralModel from any
/// model file that records its config. @throws as detect_checkpoint and load_model.
template <class Model>
Model open_model(const std::filesystem::path& path, const ModelLoadOptions& options = {});

/// Loads the model `checkpoint` holds as GPT2Model<Scalar>, LlamaModel<Scalar> or
/// MixtralModel<Scalar>, by its family, and returns f(model) (f takes the model by reference and
/// may change it; every call must return the same type). This is dissect's one switch from a
/// family to its model type. @throws as require_model(op) and load_model.
template <class Scalar = float, class F>
auto visit_model(const DetectedCheckpoint& checkpoint, F&& f, std::string_view op = "visit_model");
template <class Scalar = float, class F>
auto visit_model(const DetectedCheckpoint& checkpoint, const ModelLoadOptions& options, F&& f,
                 std::string_view op = "visit_model");
/// The same for a checkpoint handed over: it is released once the model is loaded, before f
/// runs, so its mapped files leave the resident set before f packs or allocates anything.
template <class Scalar = float, class F>
auto visit_model(DetectedCheckpoint&& checkpoint, F&& f, std::string_view op = "visit_model");
template <class Scalar = float, class F>
auto visit_model(DetectedCheckpoint&& checkpoint, const ModelLoadOptions& options, F&& f,
                 std::string_view op = "visit_model");

// ---- implementation -----------------------------------------------------------------------------

inline std::string_view checkpoint_kind_name(CheckpointKind kind) {
  switch (kind) {
    case CheckpointKind::hugging_face:
      return "hugging_face";
    case CheckpointKind::dissect_model:
      return "dissect_model";
    case CheckpointKind::dissect_quantized:
      return "dissect_quantized";
    case CheckpointKind::lora_adapter:
      return "lora_adapter";
    case CheckpointKind::state_dict:
      return "state_dict";
    case CheckpointKind::gguf:
      return "gguf";
  }
  throw ConfigError(detail::concat("checkpoint_kind_name: CheckpointKind(", static_cast<int>(kind),
                                   ") is not a checkpoint kind"));
}

inline std::string DetectedCheckpoint::config_source() const {
  switch (kind) {
    case CheckpointKind::hugging_face:
      return config_file.string();
    case CheckpointKind::dissect_model:
    case CheckpointKind::dissect_quantized:
      return "the file's metadata (dissect save_model)";
    case CheckpointKind::lora_adapter:
      return "none (LoRA adapters alone, no model)";
    case CheckpointKind::gguf:
      return model ? "the file's GGUF metadata"
                   : "none (a GGUF architecture dissect does not build)";
    case CheckpointKind::state_dict:
      break;
  }
  return "none (no config.json, no metadata)";
}

inline const HfConfig& DetectedCheckpoint::require_model(std::string_view op) const {
  if (model) return *model;
  // The reader's own refusal (the architecture, named as the file gives it), as when the file is
  // read by itself.
  if (kind == CheckpointKind::gguf && gguf) (void)read_gguf_config(*gguf);
  const std::string where = detail::concat(op, ": ", checkpoint.path().string());
  if (kind == CheckpointKind::lora_adapter) {
    throw ConfigError(detail::concat(where,
                                     ": holds LoRA adapters, not a model (load the base "
                                     "model, then load_adapters)"));
  }
  throw ConfigError(detail::concat(
      where,
      ": no model config (a Hugging Face config.json beside it, or a file from save_model)"));
}

namespace detail {

/// Whether every tensor is named as PEFT names LoRA adapters (base_model.model.…).
inline bool has_peft_names(const Checkpoint& checkpoint) {
  const auto names = checkpoint.tensor_names();
  for (const std::string& name : names) {
    if (!name.starts_with(peft_prefix)) return false;
  }
  return !names.empty();
}

/// Whether a GGUF file's general.architecture is one read_gguf_config builds (llama, gpt2); any
/// other file is still a GGUF file, of tensors alone.
inline bool gguf_builds_model(const GgufFile& file) {
  const GgufValue* architecture = file.find("general.architecture");
  const std::string* name = architecture ? architecture->as_string() : nullptr;
  return name && (*name == "llama" || *name == "gpt2");
}

/// f(std::type_identity<Model>{}) for the family's model type of Scalar: the one switch from a
/// family to GPT2Model, LlamaModel or MixtralModel.
template <class Scalar, class F>
auto with_model_type(ModelFamily family, F&& f) {
  switch (family) {
    case ModelFamily::gpt2:
      return f(std::type_identity<GPT2Model<Scalar>>{});
    case ModelFamily::llama:
      return f(std::type_identity<LlamaModel<Scalar>>{});
    case ModelFamily::mixtral:
      break;
  }
  return f(std::type_identity<MixtralModel<Scalar>>{});
}

}  // namespace detail

inline DetectedCheckpoint detect_checkpoint(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const std::string where = detail::concat("detect_checkpoint: ", path.string());
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) throw Error(where + " does not exist");
  if (error) throw Error(detail::concat(where, ": cannot read it (", error.message(), ")"));
  const bool directory = fs::is_directory(status);
  if (!directory && is_gguf_file(path)) {
    // By its magic, whatever its name. GgufFile's and read_gguf_config's errors name the file.
    DetectedCheckpoint found{
        CheckpointKind::gguf, Checkpoint::without_tensors(path), std::nullopt, {}, GgufFile(path)};
    if (detail::gguf_builds_model(*found.gguf)) found.model = read_gguf_config(*found.gguf);
    return found;
  }
  if (!directory && path.filename() == hf_config_file) {
    throw Error(where +
                " describes a model but holds no weights (give the directory that holds "
                "both)");
  }
  const fs::path config = (directory ? path : path.parent_path()) / hf_config_file;
  const bool has_config = fs::is_regular_file(config, error);

  if (directory) {
    // The weights Checkpoint would open; none (or several to choose from) is no checkpoint.
    try {
      (void)detail::resolve_checkpoint(path);
    } catch (const Error& problem) {
      throw Error(detail::concat(where,
                                 has_config
                                     ? " holds a config.json but no weights dissect can open ("
                                     : " is not a checkpoint: no config.json, no weights dissect "
                                       "can open (",
                                 problem.what(), ")"));
    }
  }
  std::optional<Checkpoint> weights;
  try {
    weights.emplace(path);
  } catch (const FormatError& problem) {
    // A directory's or an index's problem is in a file Checkpoint names; a single file that
    // breaks the format is no safetensors file at all.
    if (directory || path.extension() == ".json") throw;
    throw FormatError(detail::concat(
        where,
        " is not a checkpoint dissect reads (a GGUF file, a .safetensors file, an index "
        ".json, or a directory holding them): ",
        problem.what()));
  }

  DetectedCheckpoint found{
      CheckpointKind::state_dict, std::move(*weights), std::nullopt, {}, std::nullopt};
  const auto& metadata = found.checkpoint.metadata();
  if (metadata.contains(lora_config_key) || detail::has_peft_names(found.checkpoint)) {
    found.kind = CheckpointKind::lora_adapter;
  } else if ((found.model = model_config_of(found.checkpoint))) {
    // The file's own record wins over a config.json that happens to sit beside it.
    found.kind = metadata.contains(quantization_key) ? CheckpointKind::dissect_quantized
                                                     : CheckpointKind::dissect_model;
  } else if (has_config) {
    found.model = read_hf_config(config);
    found.config_file = config;
    found.kind = CheckpointKind::hugging_face;
  }
  return found;
}

template <class Model>
Model load_model(const DetectedCheckpoint& checkpoint, const ModelLoadOptions& options) {
  const HfConfig& recorded = checkpoint.require_model("load_model");
  if (checkpoint.kind == CheckpointKind::hugging_face) {
    return detail::load_hf_weights<Model>("load_model", checkpoint.checkpoint, recorded,
                                          checkpoint.config_file);
  }
  if (checkpoint.kind == CheckpointKind::gguf) {
    return load_gguf_model<Model>(*checkpoint.gguf, options.gguf);
  }
  return load_model<Model>(checkpoint.checkpoint);  // save_model's file (io/model_file.hpp)
}

template <class Model>
Model open_model(const std::filesystem::path& path, const ModelLoadOptions& options) {
  return load_model<Model>(detect_checkpoint(path), options);
}

template <class Scalar, class F>
auto visit_model(const DetectedCheckpoint& checkpoint, F&& f, std::string_view op) {
  return visit_model<Scalar>(checkpoint, ModelLoadOptions{}, std::forward<F>(f), op);
}

template <class Scalar, class F>
auto visit_model(const DetectedCheckpoint& checkpoint, const ModelLoadOptions& options, F&& f,
                 std::string_view op) {
  return detail::with_model_type<Scalar>(checkpoint.require_model(op).family, [&](auto type) {
    auto model = load_model<typename decltype(type)::type>(checkpoint, options);
    return std::invoke(f, model);
  });
}

template <class Scalar, class F>
auto visit_model(DetectedCheckpoint&& checkpoint, F&& f, std::string_view op) {
  return visit_model<Scalar>(std::move(checkpoint), ModelLoadOptions{}, std::forward<F>(f), op);
}

template <class Scalar, class F>
auto visit_model(DetectedCheckpoint&& checkpoint, const ModelLoadOptions& options, F&& f,
                 std::string_view op) {
  return detail::with_model_type<Scalar>(checkpoint.require_model(op).family, [&](auto type) {
    auto model = load_model<typename decltype(type)::type>(checkpoint, options);
    { const DetectedCheckpoint released = std::move(checkpoint); }  // its files unmap here
    return std::invoke(f, model);
  });
}

}  // namespace dissect
