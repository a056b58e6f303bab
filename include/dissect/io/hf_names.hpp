// dissect/io/hf_names.hpp — Hugging Face's tensor names and dissect's, mapped both ways by the
// rules of accounting/tensor_names.hpp's table (the loader in io/huggingface.hpp, the writer in
// io/hf_writer.hpp and the `dissect` tool read them here).
//
// - GPT-2: an optional "transformer." prefix (the official files have none); Conv1D weights
//   stored [in, out]; c_attn → qkv, attn.c_proj → proj, c_fc → up, mlp.c_proj → down; the
//   attention-mask buffers attn.bias and attn.masked_bias stand for no parameter.
// - LLaMA: a "model." prefix; q_proj, k_proj, v_proj stacked by rows into one qkv (queries, then
//   keys, then values: the order QKVProjection splits them in); o_proj → proj, gate_proj,
//   up_proj, down_proj → gate, up, down; the rotary_emb.inv_freq buffers stand for no parameter.
// - Mixtral: LLaMA's attention names; block_sparse_moe.gate (the router) → block_sparse_moe.router,
//   and each expert's w1, w3, w2 → gate, up, down (experts.M.w1 is expert M's gate projection).
// Everything else (wte, h.N.ln_1, embed_tokens, layers.N.input_layernorm, …) is already
// dissect's name: models/styles.hpp names dissect's modules after Hugging Face's.
#pragma once

#include <array>
#include <charconv>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "dissect/accounting/tensor_names.hpp"
#include "dissect/io/hf_config.hpp"
#include "dissect/models/styles.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// The file beside a Hugging Face checkpoint's weights that describes its model.
inline constexpr const char* hf_config_file = "config.json";

/// One tensor of a Hugging Face checkpoint as dissect's models know it.
struct HfTensorName {
  std::string name;        ///< dissect's state_dict name, e.g. "h.0.attn.qkv.weight"
  bool transpose = false;  ///< a GPT-2 Conv1D weight: stored [in, out], dissect's is [out, in]
  int qkv_part = -1;       ///< LLaMA's q_proj, k_proj, v_proj: 0, 1, 2 of the qkv they stack
                           ///< into by rows; −1 for every other tensor
};

/// The prefix `family`'s checkpoints may put before dissect's names: "transformer." (GPT-2's
/// GPT2LMHeadModel state_dict), "model." (LLaMA).
std::string_view hf_prefix(ModelFamily family);

/// `name` without `family`'s prefix (unchanged if it has none).
std::string_view strip_hf_prefix(ModelFamily family, std::string_view name);

/// Whether `name` is a buffer that no model parameter stands for: GPT-2's attention masks
/// (…attn.bias, …attn.masked_bias), LLaMA's …rotary_emb.inv_freq. Without a family: either's.
bool is_hf_buffer(ModelFamily family, std::string_view name);
bool is_hf_buffer(std::string_view name);

/// Whether `name` (with or without the prefix) is a GPT-2 Conv1D weight (attn.c_attn,
/// attn.c_proj, mlp.c_fc, mlp.c_proj), stored [in, out] rather than nn.Linear's [out, in].
bool is_conv1d_weight(std::string_view name);

/// `name` of a `family` checkpoint under dissect's name; nullopt for a tensor dissect hides: a
/// buffer, or lm_head.weight when `tied_head` (it is a copy of the token embedding). A name the
/// rules do not know comes back as itself (without the prefix), so a strict load reports it.
std::optional<HfTensorName> hf_to_dissect_name(ModelFamily family, std::string_view name,
                                               bool tied_head = false);

/// Hugging Face's names of dissect's tensor `name` of a `family` model, as save_hf_checkpoint
/// writes them: one, or the three whose rows stack into it (q_proj, k_proj, v_proj).
struct HfTensorNames {
  std::vector<std::string> names;
  bool transpose = false;  ///< a GPT-2 Conv1D weight: stored [in, out]
};

/// hf_to_dissect_name's inverse: `name` under Hugging Face's names, with the prefix where the
/// family's files have one. A name the rules do not know comes back as itself (prefixed).
HfTensorNames dissect_to_hf_names(ModelFamily family, std::string_view name);

/// The layer a tensor belongs to, from its "h.N." (GPT-2) or "layers.N." (LLaMA) part, in
/// Hugging Face's names (prefixed or not) and dissect's alike; nullopt outside the layers.
std::optional<index_t> layer_index_of(std::string_view name);

/// Whether `name` belongs to a token or position embedding (wte, wpe, embed_tokens), in Hugging
/// Face's names (prefixed or not) and dissect's alike.
bool is_embedding_name(std::string_view name);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// One tensor's Hugging Face module name(s) and dissect's, matched anywhere in a tensor's name as
/// whole dotted parts in their parent (".attn.c_attn." and ".attn.qkv.").
struct HfRename {
  const TensorNames* row;
  std::vector<std::string> theirs;  ///< one, or the queries', keys' and values'
  std::string ours;
};

/// The renames of `names`' tensors whose Hugging Face name is not dissect's, in the table's order
/// (the first that matches applies).
inline std::vector<HfRename> hf_renames(const FamilyTensorNames& names) {
  std::vector<HfRename> renames;
  for (const TensorNames& row : names.tensors) {
    if (row.parts() == 1 && row.hf[0] == row.dissect) continue;
    // An expert's parent is "experts.M": its own name, between dots, is enough.
    const auto dotted = [&](std::string_view leaf) {
      return row.parent == TensorParent::expert
                 ? concat(".", leaf, ".")
                 : concat(".", path_in_layer(names, row.parent, leaf, 0), ".");
    };
    HfRename rename{&row, {}, dotted(row.dissect)};
    for (std::size_t part = 0; part < row.parts(); ++part)
      rename.theirs.push_back(dotted(row.hf[part]));
    renames.push_back(std::move(rename));
  }
  return renames;
}

/// `name` with `names`' Hugging Face prefix, where its files have one (not before the head).
inline std::string with_hf_prefix(const FamilyTensorNames& names, std::string name) {
  if (!names.hf_prefix_written || name == concat(names.module(ModelTensor::head), ".weight"))
    return name;
  return concat(names.hf_prefix, name);
}

/// Where module `module` starts in `name` as a whole dotted part ("h" in "transformer.h.0.…",
/// not in "ch.0."), searching from `from`; npos if nowhere.
inline std::size_t find_module(std::string_view name, std::string_view module,
                               std::size_t from = 0) {
  for (std::size_t at = name.find(module, from); at != std::string_view::npos;
       at = name.find(module, at + 1)) {
    const std::size_t end = at + module.size();
    if ((at == 0 || name[at - 1] == '.') && end < name.size() && name[end] == '.') return at;
  }
  return std::string_view::npos;
}

}  // namespace detail

inline std::string_view hf_prefix(ModelFamily family) {
  return tensor_names_of(family).hf_prefix;
}

inline std::string_view strip_hf_prefix(ModelFamily family, std::string_view name) {
  if (name.starts_with(hf_prefix(family))) name.remove_prefix(hf_prefix(family).size());
  return name;
}

inline bool is_hf_buffer(ModelFamily family, std::string_view name) {
  for (std::string_view suffix : tensor_names_of(family).hf_buffers) {
    if (name.ends_with(suffix)) return true;
  }
  return false;
}

inline bool is_hf_buffer(std::string_view name) {
  for (const FamilyTensorNames* names : tensor_name_families) {
    for (std::string_view suffix : names->hf_buffers) {
      if (name.ends_with(suffix)) return true;
    }
  }
  return false;
}

inline bool is_conv1d_weight(std::string_view name) {
  if (!name.ends_with(".weight")) return false;
  for (const FamilyTensorNames* names : tensor_name_families) {
    for (const detail::HfRename& rename : detail::hf_renames(*names)) {
      if (!rename.row->hf_transposed) continue;
      for (const std::string& theirs : rename.theirs) {
        if (name.find(theirs) != std::string_view::npos) return true;
      }
    }
  }
  return false;
}

inline std::optional<HfTensorName> hf_to_dissect_name(ModelFamily family, std::string_view name,
                                                      bool tied_head) {
  const FamilyTensorNames& names = tensor_names_of(family);
  const std::string_view head = names.module(ModelTensor::head);
  name = strip_hf_prefix(family, name);
  if (is_hf_buffer(family, name)) return std::nullopt;
  if (tied_head && name == std::string(head) + ".weight") return std::nullopt;
  HfTensorName result{std::string(name), false, -1};
  for (const detail::HfRename& rename : detail::hf_renames(names)) {
    for (std::size_t part = 0; part < rename.theirs.size(); ++part) {
      const std::string& theirs = rename.theirs[part];
      if (const auto at = result.name.find(theirs); at != std::string::npos) {
        result.name.replace(at, theirs.size(), rename.ours);
        result.transpose = rename.row->hf_transposed && result.name.ends_with(".weight");
        if (rename.theirs.size() > 1) result.qkv_part = static_cast<int>(part);
        return result;
      }
    }
  }
  return result;
}

inline HfTensorNames dissect_to_hf_names(ModelFamily family, std::string_view name) {
  const FamilyTensorNames& names = tensor_names_of(family);
  for (const detail::HfRename& rename : detail::hf_renames(names)) {
    const auto at = name.find(rename.ours);
    if (at == std::string_view::npos) continue;
    HfTensorNames result;
    result.transpose = rename.row->hf_transposed && name.ends_with(".weight");
    for (const std::string& theirs : rename.theirs) {
      std::string hf(name);
      hf.replace(at, rename.ours.size(), theirs);
      result.names.push_back(detail::with_hf_prefix(names, std::move(hf)));
    }
    return result;
  }
  return {{detail::with_hf_prefix(names, std::string(name))}, false};
}

inline std::optional<index_t> layer_index_of(std::string_view name) {
  for (const FamilyTensorNames* names : tensor_name_families) {
    const std::string_view layers = names->layers;
    for (std::size_t at = detail::find_module(name, layers); at != std::string_view::npos;
         at = detail::find_module(name, layers, at + 1)) {
      const char* first = name.data() + at + layers.size() + 1;  // after "h."
      const char* last = name.data() + name.size();
      index_t layer = 0;
      const auto [end, error] = std::from_chars(first, last, layer);
      const bool digits = first < last && *first >= '0' && *first <= '9';  // not "h.-1."
      if (digits && error == std::errc() && end < last && *end == '.') return layer;
    }
  }
  return std::nullopt;
}

inline bool is_embedding_name(std::string_view name) {
  for (const FamilyTensorNames* names : tensor_name_families) {
    for (std::string_view module : {names->module(ModelTensor::token_embedding),
                                    names->module(ModelTensor::position_embedding)}) {
      if (!module.empty() && detail::find_module(name, module) != std::string_view::npos) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace dissect
