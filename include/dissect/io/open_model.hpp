// dissect/io/open_model.hpp — what a path holds, found out in one place, and the model in it.
//
// detect_checkpoint recognises every kind of checkpoint dissect reads: a Hugging Face checkpoint
// (one .safetensors or an index and its shards, with a config.json beside them), a file
// save_model wrote (its config in the metadata; with quantised layers or not), a LoRA adapter
// file, or bare tensors (save_module's state_dict). It opens the weights, reads the config, and
// says which kind it found; open_model<Model>(path) and visit_model(…) then load the model. A
// path that is none of these is an Error naming it.
#pragma once

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>

#include "dissect/core/error.hpp"
#include "dissect/io/checkpoint.hpp"
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
};

/// "hugging_face", "dissect_model", "dissect_quantized", "lora_adapter", "state_dict".
/// @throws ConfigError naming the type and value for a value outside the enum.
std::string_view checkpoint_kind_name(CheckpointKind kind);

/// What detect_checkpoint found at a path.
struct DetectedCheckpoint {
  CheckpointKind kind;
  Checkpoint checkpoint;              ///< the weights, every shard opened and checked
  std::optional<HfConfig> model;      ///< family and config: hugging_face and dissect_* only
  std::filesystem::path config_file;  ///< hugging_face: the config.json read; else empty

  /// Whether the weights are an index and its shards (else one .safetensors file).
  bool sharded() const { return checkpoint.path().extension() == ".json"; }
  /// Where the model's config comes from, for a report: the config.json, the file's metadata,
  /// or "none (…)" saying why there is none.
  std::string config_source() const;
  /// The family and config. @throws ConfigError naming `op`, the file and the kind when the
  /// checkpoint records none (state_dict, lora_adapter).
  const HfConfig& require_model(std::string_view op) const;
};

/// Opens `path` and recognises what it is: a .safetensors file, an index .json, or a directory
/// holding them (found as Checkpoint finds them), beside a config.json or not. The kind follows
/// from the weights' metadata first ("dissect.lora" or PEFT's names: lora_adapter; save_model's
/// "dissect.family"/"dissect.config": dissect_model or dissect_quantized), then from a
/// config.json in the directory (hugging_face), else state_dict.
/// @throws Error naming the path if it does not exist, is a directory without weights (saying
///         whether it holds a config.json) or is a config.json itself; FormatError naming it if a
///         file is not a safetensors file; as Checkpoint (a corrupt index or shard, naming it),
///         read_hf_config and model_config_of (ConfigError naming the file and the key).
DetectedCheckpoint detect_checkpoint(const std::filesystem::path& path);

/// The model `checkpoint` holds, strictly (every parameter present and shaped right): Hugging
/// Face names and layouts through HfCheckpointView, a save_model file through
/// load_module_quantized. @throws ConfigError naming the file if it records no model or one of
/// another family; as load_state_dict and load_module_quantized.
template <class Model>
Model load_model(const DetectedCheckpoint& checkpoint);

/// load_model(detect_checkpoint(path)): a GPT2Model, LlamaModel or MixtralModel from any checkpoint
/// that records its config. @throws as detect_checkpoint and load_model.
template <class Model>
Model open_model(const std::filesystem::path& path);

/// Loads the model `checkpoint` holds as GPT2Model<Scalar>, LlamaModel<Scalar> or
/// MixtralModel<Scalar>, by its family, and returns f(model) (f takes the model by reference and
/// may change it; both calls must return the same type). @throws as require_model(op) and
/// load_model.
template <class Scalar = float, class F>
auto visit_model(const DetectedCheckpoint& checkpoint, F&& f, std::string_view op = "visit_model");

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
    case CheckpointKind::state_dict:
      break;
  }
  return "none (no config.json, no metadata)";
}

inline const HfConfig& DetectedCheckpoint::require_model(std::string_view op) const {
  if (model) return *model;
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

}  // namespace detail

inline DetectedCheckpoint detect_checkpoint(const std::filesystem::path& path) {
  namespace fs = std::filesystem;
  const std::string where = detail::concat("detect_checkpoint: ", path.string());
  std::error_code error;
  const fs::file_status status = fs::status(path, error);
  if (status.type() == fs::file_type::not_found) throw Error(where + " does not exist");
  if (error) throw Error(detail::concat(where, ": cannot read it (", error.message(), ")"));
  const bool directory = fs::is_directory(status);
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
        " is not a checkpoint dissect reads (a .safetensors file, an index .json, or a "
        "directory holding them): ",
        problem.what()));
  }

  DetectedCheckpoint found{CheckpointKind::state_dict, std::move(*weights), std::nullopt, {}};
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
Model load_model(const DetectedCheckpoint& checkpoint) {
  const HfConfig& recorded = checkpoint.require_model("load_model");
  if (checkpoint.kind == CheckpointKind::hugging_face) {
    return detail::load_hf_weights<Model>("load_model", checkpoint.checkpoint, recorded,
                                          checkpoint.config_file);
  }
  return load_model<Model>(checkpoint.checkpoint);  // save_model's file (io/model_file.hpp)
}

template <class Model>
Model open_model(const std::filesystem::path& path) {
  return load_model<Model>(detect_checkpoint(path));
}

template <class Scalar, class F>
auto visit_model(const DetectedCheckpoint& checkpoint, F&& f, std::string_view op) {
  switch (checkpoint.require_model(op).family) {
    case ModelFamily::gpt2: {
      auto model = load_model<GPT2Model<Scalar>>(checkpoint);
      return std::invoke(f, model);
    }
    case ModelFamily::llama: {
      auto model = load_model<LlamaModel<Scalar>>(checkpoint);
      return std::invoke(f, model);
    }
    case ModelFamily::mixtral:
      break;
  }
  auto model = load_model<MixtralModel<Scalar>>(checkpoint);
  return std::invoke(f, model);
}

}  // namespace dissect
