// dissect/io/hf_names.hpp — Hugging Face's tensor names for GPT-2 and LLaMA, and dissect's: the
// one place these naming rules are written (the loader in io/huggingface.hpp and the `dissect`
// tool both read them here).
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

/// The layer a tensor belongs to, from its "h.N." (GPT-2) or "layers.N." (LLaMA) part, in
/// Hugging Face's names (prefixed or not) and dissect's alike; nullopt outside the layers.
std::optional<index_t> layer_index_of(std::string_view name);

/// Whether `name` belongs to a token or position embedding (wte, wpe, embed_tokens), in Hugging
/// Face's names (prefixed or not) and dissect's alike.
bool is_embedding_name(std::string_view name);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// A checkpoint's module name and dissect's, matched anywhere in a tensor's name.
using NamePair = std::pair<std::string_view, std::string_view>;

/// GPT-2's renames: every one is a Conv1D.
inline constexpr std::array<NamePair, 4> gpt2_renames{{{".attn.c_attn.", ".attn.qkv."},
                                                       {".attn.c_proj.", ".attn.proj."},
                                                       {".mlp.c_fc.", ".mlp.up."},
                                                       {".mlp.c_proj.", ".mlp.down."}}};

/// LLaMA's renames: the first three stack into qkv, in this order.
inline constexpr std::array<NamePair, 7> llama_renames{{{".self_attn.q_proj.", ".self_attn.qkv."},
                                                        {".self_attn.k_proj.", ".self_attn.qkv."},
                                                        {".self_attn.v_proj.", ".self_attn.qkv."},
                                                        {".self_attn.o_proj.", ".self_attn.proj."},
                                                        {".mlp.gate_proj.", ".mlp.gate."},
                                                        {".mlp.up_proj.", ".mlp.up."},
                                                        {".mlp.down_proj.", ".mlp.down."}}};

/// Mixtral's renames: LLaMA's attention ones (the first three stack into qkv), then the router
/// and the experts' three projections.
inline constexpr std::array<NamePair, 8> mixtral_renames{
    {{".self_attn.q_proj.", ".self_attn.qkv."},
     {".self_attn.k_proj.", ".self_attn.qkv."},
     {".self_attn.v_proj.", ".self_attn.qkv."},
     {".self_attn.o_proj.", ".self_attn.proj."},
     {".block_sparse_moe.gate.", ".block_sparse_moe.router."},
     {".w1.", ".gate."},
     {".w3.", ".up."},
     {".w2.", ".down."}}};

/// The renames of `family`, in the order they are tried (the first that matches applies).
inline std::span<const NamePair> hf_renames(ModelFamily family) {
  switch (family) {
    case ModelFamily::gpt2:
      return gpt2_renames;
    case ModelFamily::llama:
      return llama_renames;
    case ModelFamily::mixtral:
      break;
  }
  return mixtral_renames;
}

inline constexpr std::array<std::string_view, 2> gpt2_buffers{".attn.bias", ".attn.masked_bias"};
inline constexpr std::array<std::string_view, 1> llama_buffers{"rotary_emb.inv_freq"};

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
  return family == ModelFamily::gpt2 ? "transformer." : "model.";
}

inline std::string_view strip_hf_prefix(ModelFamily family, std::string_view name) {
  if (name.starts_with(hf_prefix(family))) name.remove_prefix(hf_prefix(family).size());
  return name;
}

inline bool is_hf_buffer(ModelFamily family, std::string_view name) {
  const auto ends_with_any = [&](const auto& suffixes) {
    for (std::string_view suffix : suffixes) {
      if (name.ends_with(suffix)) return true;
    }
    return false;
  };
  return family == ModelFamily::gpt2 ? ends_with_any(detail::gpt2_buffers)
                                     : ends_with_any(detail::llama_buffers);  // and mixtral
}

inline bool is_hf_buffer(std::string_view name) {
  return is_hf_buffer(ModelFamily::gpt2, name) || is_hf_buffer(ModelFamily::llama, name);
}

inline bool is_conv1d_weight(std::string_view name) {
  if (!name.ends_with(".weight")) return false;
  for (const auto& [theirs, ours] : detail::gpt2_renames) {
    if (name.find(theirs) != std::string_view::npos) return true;
  }
  return false;
}

inline std::optional<HfTensorName> hf_to_dissect_name(ModelFamily family, std::string_view name,
                                                      bool tied_head) {
  const std::string_view head = style_of(family).head;
  name = strip_hf_prefix(family, name);
  if (is_hf_buffer(family, name)) return std::nullopt;
  if (tied_head && name == std::string(head) + ".weight") return std::nullopt;
  HfTensorName result{std::string(name), false, -1};
  const auto renames = detail::hf_renames(family);
  for (std::size_t i = 0; i < renames.size(); ++i) {
    const auto& [theirs, ours] = renames[i];
    if (const auto at = result.name.find(theirs); at != std::string::npos) {
      result.name.replace(at, theirs.size(), ours);
      if (family == ModelFamily::gpt2) {
        result.transpose = result.name.ends_with(".weight");  // Conv1D: [in, out]
      } else if (i < 3) {
        result.qkv_part = static_cast<int>(i);
      }
      break;
    }
  }
  return result;
}

inline std::optional<index_t> layer_index_of(std::string_view name) {
  for (std::string_view layers : {gpt2_style.layers, llama_style.layers}) {
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
  for (const DecoderStyle* style : {&gpt2_style, &llama_style}) {
    for (std::string_view module : {style->token_embedding, style->position_embedding}) {
      if (!module.empty() && detail::find_module(name, module) != std::string_view::npos) {
        return true;
      }
    }
  }
  return false;
}

}  // namespace dissect
