// dissect/io/huggingface.hpp — Hugging Face GPT-2 and LLaMA checkpoints into dissect's models.
//
// HfCheckpointView shows a checkpoint under dissect's parameter names and layouts, so the one
// strict load_state_dict fills the model and reports every missing, unexpected and mis-shaped
// tensor at once. The names follow io/hf_names.hpp (prefixes dropped, GPT-2's Conv1D renamed,
// LLaMA's q/k/v renamed); the view does the layouts: Conv1D weights, stored [in, out],
// transposed into nn.Linear's [out, in]; q_proj, k_proj and v_proj stacked by rows into one
// qkv; buffers and a tied head's lm_head.weight (a copy of the embedding) hidden. A tensor the
// rules do not know keeps its name and so is reported as unexpected. io/open_model.hpp finds
// out whether a path is such a checkpoint at all.
#pragma once

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/io/checkpoint.hpp"
#include "dissect/io/checkpoint_fit.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/io/hf_names.hpp"
#include "dissect/io/state_dict.hpp"
#include "dissect/models/decoder_model.hpp"

namespace dissect {

class HfCheckpointView {
 public:
  /// Maps every tensor of `checkpoint` (which must outlive the view) for the model `config`
  /// describes (its family; its tied head, whose lm_head.weight copy is hidden).
  /// @throws FormatError naming the tensor if a tied head's copy of the embedding (lm_head.weight
  ///         when tie_word_embeddings) has another shape than the embedding, a projection is not
  ///         a matrix, a stacked qkv's parts disagree in width or dtype, or two of the file's
  ///         names are one of dissect's
  ///         (h.0.ln_1.weight and transformer.h.0.ln_1.weight: which would it load?);
  ///         ConfigError naming the tensor and the config's keys if q_proj, k_proj or v_proj
  ///         alone has other rows than the config gives it (their stacked total alone would not
  ///         see a file whose q and k sizes are swapped).
  HfCheckpointView(const Checkpoint& checkpoint, const HfConfig& config);

  const std::filesystem::path& path() const { return checkpoint_->path(); }
  std::vector<std::string> tensor_names() const;
  bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }
  /// dissect's view of the tensor: its name, the checkpoint's dtype, dissect's shape.
  const TensorInfo& info(std::string_view name) const { return mapped(name).info; }

  /// One checkpoint tensor behind a dissect one: stacked at `first_row`, maybe transposed.
  struct Part {
    std::string name;
    bool transpose = false;
    index_t first_row = 0;
  };
  struct Mapped {
    TensorInfo info;
    std::vector<Part> parts;
  };
  const Mapped& mapped(std::string_view name) const;
  const Checkpoint& checkpoint() const { return *checkpoint_; }

 private:
  void add(std::string name, std::vector<Part> parts);
  void check_qkv_part_rows(const HfConfig& config, const std::vector<Part>& parts) const;

  const Checkpoint* checkpoint_;
  std::map<std::string, Mapped, std::less<>> tensors_;
};

/// Fills `target` (dissect's shape) from the parts behind `name`, converting to Scalar.
/// @throws as load_into on a Checkpoint; ShapeError if target's shape is not info(name)'s.
template <class Scalar, std::size_t Rank>
void load_into(const HfCheckpointView& view, std::string_view name,
               TensorView<Scalar, Rank> target);

/// A GPT2Model or LlamaModel read from a Hugging Face model directory (config.json beside the
/// safetensors file(s) or their index), strictly: every parameter present and shaped right,
/// nothing unexpected. @throws ConfigError if config.json describes another family (or as
/// read_hf_config); Error listing every problem of the weights (as load_state_dict).
template <class Model>
Model load_hf_model(const std::filesystem::path& directory);

// ---- implementation -----------------------------------------------------------------------------

inline void HfCheckpointView::add(std::string name, std::vector<Part> parts) {
  const TensorInfo& first = checkpoint_->info(parts.front().name);
  TensorInfo info{name, first.dtype, first.shape, 0, 0};
  const auto fail = [&](std::string_view why) {
    throw FormatError(
        dissect::detail::concat(path().string(), ": ", parts.front().name, " (", name, "): ", why));
  };
  if (parts.front().transpose) {
    if (info.shape.size() != 2) fail("a Conv1D weight must be a matrix [in, out]");
    std::swap(info.shape[0], info.shape[1]);
  }
  // Stacked parts (q, k, v) sit one after another along the rows.
  for (std::size_t i = 1; i < parts.size(); ++i) {
    const TensorInfo& next = checkpoint_->info(parts[i].name);
    if (next.shape.empty() || next.shape.size() != info.shape.size() ||
        !std::equal(next.shape.begin() + 1, next.shape.end(), info.shape.begin() + 1)) {
      fail(dissect::detail::concat("cannot stack ", parts[i].name, " ",
                                   format_shape(std::span<const index_t>(next.shape)),
                                   " under it"));
    }
    if (next.dtype != info.dtype) fail("q, k and v projections differ in dtype");
    parts[i].first_row = info.shape[0];
    info.shape[0] = checked_add(info.shape[0], next.shape[0], name);
  }
  if (const auto held = tensors_.find(name); held != tensors_.end()) {
    fail(dissect::detail::concat("so is ", held->second.parts.front().name,
                                 ": the file holds this tensor twice, under two names"));
  }
  tensors_.emplace(std::move(name), Mapped{std::move(info), std::move(parts)});
}

inline void HfCheckpointView::check_qkv_part_rows(const HfConfig& config,
                                                  const std::vector<Part>& parts) const {
  const TransformerConfig& c = config.config;
  const detail::SizeKeys& keys = detail::hf_size_keys(config.family);
  const index_t d_k = c.head_size();
  for (std::size_t slot = 0; slot < parts.size(); ++slot) {
    const bool query = slot == 0;
    const index_t heads = query ? c.n_heads : c.kv_heads();
    const index_t rows = checked_mul(heads, d_k, "q/k/v projection rows");
    const TensorInfo& info = checkpoint_->info(parts[slot].name);
    if (info.shape.empty() || info.shape[0] == rows) continue;
    const auto key = [&](detail::SizeKeys::Size size) {
      return keys[size] != nullptr ? keys[size] : "";
    };
    throw ConfigError(dissect::detail::concat(
        path().string(), ": ", parts[slot].name, " has ", info.shape[0], " rows, but ",
        key(query ? detail::SizeKeys::n_heads : detail::SizeKeys::n_kv_heads), " = ", heads,
        " heads of ", key(detail::SizeKeys::head_dim), " = ", d_k, " make ", rows,
        " (q_proj, k_proj and v_proj are checked one by one)"));
  }
}

inline HfCheckpointView::HfCheckpointView(const Checkpoint& checkpoint, const HfConfig& config)
    : checkpoint_(&checkpoint) {
  const ModelFamily family = config.family;
  // Stacked qkv parts by dissect name: slot 0, 1, 2 for q, k, v.
  std::map<std::string, std::array<std::string, 3>> stacks;
  std::string tied_head;  // the file's name for a tied head's copy, if it holds one
  for (const std::string& name : checkpoint.tensor_names()) {
    // Buffers and a tied head's copy of the embedding are hidden (hf_names.hpp).
    const auto mapped = hf_to_dissect_name(family, name, config.config.tied_embeddings);
    if (!mapped) {
      if (!is_hf_buffer(family, strip_hf_prefix(family, name))) tied_head = name;
      continue;
    }
    if (mapped->qkv_part < 0) {
      add(mapped->name, {Part{name, mapped->transpose, 0}});
    } else {
      std::string& slot = stacks[mapped->name][static_cast<std::size_t>(mapped->qkv_part)];
      if (!slot.empty()) {
        throw FormatError(dissect::detail::concat(path().string(), ": ", name, " and ", slot,
                                                  " are both ", mapped->name,
                                                  "'s part: the file holds it twice"));
      }
      slot = name;
    }
  }
  for (auto& [name, slots] : stacks) {
    std::vector<Part> parts;
    for (const std::string& part : slots) {
      // A qkv with a projection missing stays missing (load_state_dict names it); its other
      // parts are then unexpected, under their own names.
      if (!part.empty()) parts.push_back({part, false, 0});
    }
    if (parts.size() == 3) {
      check_qkv_part_rows(config, parts);
      add(name, std::move(parts));
    } else {
      for (const Part& part : parts) add(part.name, {part});
    }
  }
  // A tied head's copy is hidden, not read: it must at least be a copy of the embedding's shape,
  // or the file describes another model than the one loaded (transformers would refuse it as a
  // size mismatch of lm_head.weight).
  const std::string embedding = std::string(style_of(family).token_embedding) + ".weight";
  if (const auto found = tensors_.find(embedding); !tied_head.empty() && found != tensors_.end()) {
    const auto& head_shape = checkpoint.info(tied_head).shape;
    const auto& table = found->second;
    if (head_shape != table.info.shape) {
      throw FormatError(dissect::detail::concat(
          path().string(), ": ", tied_head, " ", format_shape(std::span<const index_t>(head_shape)),
          " is the tied head (tie_word_embeddings), a copy of ", table.parts.front().name, " ",
          format_shape(std::span<const index_t>(table.info.shape)), ", but their shapes differ"));
    }
  }
}

inline std::vector<std::string> HfCheckpointView::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, mapped] : tensors_) names.push_back(name);
  return names;
}

inline const HfCheckpointView::Mapped& HfCheckpointView::mapped(std::string_view name) const {
  const auto found = tensors_.find(name);
  if (found == tensors_.end()) {
    throw Error(dissect::detail::concat(path().string(), ": no tensor for ", name));
  }
  return found->second;
}

template <class Scalar, std::size_t Rank>
void load_into(const HfCheckpointView& view, std::string_view name,
               TensorView<Scalar, Rank> target) {
  const auto& mapped = view.mapped(name);
  if (!std::equal(mapped.info.shape.begin(), mapped.info.shape.end(), target.shape().begin(),
                  target.shape().end())) {
    throw ShapeError(dissect::detail::concat(
        "load_into: ", name, " is ", format_shape(std::span<const index_t>(mapped.info.shape)),
        " in ", view.path().string(), ", the target is ", format_shape(target.shape())));
  }
  const index_t row = Rank == 1 ? 1 : target.size() / std::max<index_t>(target.dim(0), 1);
  for (const auto& part : mapped.parts) {
    const TensorInfo& info = view.checkpoint().info(part.name);
    Shape<Rank> shape{};
    std::copy(info.shape.begin(), info.shape.end(), shape.begin());
    auto values = Tensor<Scalar, Rank>::uninitialized(shape);
    load_into(view.checkpoint(), part.name, values.view());
    if constexpr (Rank == 2) {
      if (part.transpose) {
        target.matrix() = values.matrix().transpose();
        continue;
      }
    }
    std::copy(values.begin(), values.end(), target.data() + part.first_row * row);
  }
}

namespace detail {

/// The model `hf` (read from `config_file`) describes, filled strictly from `checkpoint`'s
/// Hugging Face names. The config is checked against the weights' header before the model is
/// allocated (io/checkpoint_fit.hpp).
template <class Model>
Model load_hf_weights(std::string_view op, const Checkpoint& checkpoint, const HfConfig& hf,
                      const std::filesystem::path& config_file) {
  require_family<Model>(hf.family, config_file.string());
  const HfCheckpointView view(checkpoint, hf);
  check_checkpoint_fits(op, hf, view, config_file.string(), hf_size_keys(hf.family));
  Model model = model_to_load<Model>(hf.config, ModelOptions{.seed = 0});
  load_state_dict(model, view);
  return model;
}

}  // namespace detail

template <class Model>
Model load_hf_model(const std::filesystem::path& directory) {
  const HfConfig hf = read_hf_config(directory / hf_config_file);
  require_family<Model>(hf.family, (directory / hf_config_file).string());
  return detail::load_hf_weights<Model>("load_hf_model", Checkpoint(directory), hf,
                                        directory / hf_config_file);
}

}  // namespace dissect
