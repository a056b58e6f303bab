// dissect/io/gguf_quantize.hpp — a GGUF model of float tensors quantised as llama.cpp's
// llama_model_quantize does it without an importance matrix, to the same bytes.
//
// A recipe is one of llama.cpp's file types (its llama_ftype): which ggml type each tensor
// gets. Only matrices ("*.weight" with two or more dims, the position embedding excepted) are
// quantised; vectors (norms, biases) are copied as they are. The types:
//   q8_0, q4_0, q6_k   every matrix in that type, except that q4_0 stores output.weight (the
//                      output head; the token embedding when the head is tied) as q6_K
//   q4_k_m, q5_k_m     matrices in q4_K (q5_K), output.weight in q6_K, and attn_v (GPT-2:
//                      attn_qkv) and ffn_down in q6_K in the layers llama.cpp's use_more_bits
//                      picks: i < L/8, i ≥ 7L/8, or (i − L/8) mod 3 = 2
// A K-quant whose rows are not whole 256-value blocks falls back as llama.cpp's does (q4_K →
// q5_0, q5_K → q5_1, q6_K → q8_0). The file: the input's metadata in its order, then
// general.quantization_version = 2 and general.file_type = the recipe's llama_ftype (moved to
// the end if present); the tensors with the non-layer ones first, then layer by layer, each
// group by name, which is llama.cpp's order. Bytes come from quantize_ggml, bit-identical to
// ggml's reference quantisers.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// llama.cpp's quantisation recipes that dissect reproduces.
enum class GgufRecipe { q8_0, q4_0, q6_k, q4_k_m, q5_k_m };

/// "q8_0", "q4_0", "q6_k", "q4_k_m", "q5_k_m" (llama-quantize's names, lower case).
std::string_view gguf_recipe_name(GgufRecipe recipe);
/// The recipe called `name`, without regard to case ("Q4_K_M"). @throws ConfigError listing them.
GgufRecipe gguf_recipe_from_name(std::string_view name);
/// llama.cpp's llama_ftype number of the recipe, as general.file_type stores it.
std::uint32_t gguf_recipe_file_type(GgufRecipe recipe);

/// The type the recipe gives tensor `info` of a model with `n_layers` blocks; `layer` is its
/// block (-1 for none). Vectors and the position embedding keep their type.
GgmlType gguf_recipe_type(GgufRecipe recipe, const GgufTensorInfo& info, index_t layer,
                          index_t n_layers);

/// Writes `in` quantised by `recipe` to `out` (atomically, as save_gguf).
/// @throws as read_gguf_config (the file must be a llama or gpt2 model); Error naming a matrix
///         that is already quantised (requantising would not be llama.cpp's result) or whose
///         rows fit no fallback type; Error as save_gguf or quantize_ggml.
void quantize_gguf(const GgufFile& in, const std::filesystem::path& out, GgufRecipe recipe);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

struct GgufRecipeInfo {
  std::string_view name;
  std::uint32_t file_type;  ///< llama_ftype
  GgmlType base;
};

inline constexpr std::array<GgufRecipeInfo, 5> gguf_recipes{{
    {"q8_0", 7, GgmlType::q8_0},
    {"q4_0", 2, GgmlType::q4_0},
    {"q6_k", 18, GgmlType::q6_K},
    {"q4_k_m", 15, GgmlType::q4_K},
    {"q5_k_m", 17, GgmlType::q5_K},
}};

inline const GgufRecipeInfo& gguf_recipe_info(GgufRecipe recipe) {
  const auto index = static_cast<std::size_t>(recipe);
  if (index >= gguf_recipes.size()) {
    throw ConfigError(concat("GgufRecipe(", index, ") is not a recipe"));
  }
  return gguf_recipes[index];
}

/// llama.cpp's choice of the layers that keep more bits under the _M recipes.
constexpr bool use_more_bits(index_t layer, index_t n_layers) {
  return layer < n_layers / 8 || layer >= 7 * n_layers / 8 || (layer - n_layers / 8) % 3 == 2;
}

/// The legacy type a K-quant falls back to when a row is not whole 256-value blocks.
constexpr GgmlType k_quant_fallback(GgmlType type) {
  switch (type) {
    case GgmlType::q4_K:
      return GgmlType::q5_0;
    case GgmlType::q5_K:
      return GgmlType::q5_1;
    case GgmlType::q6_K:
      return GgmlType::q8_0;
    default:
      return type;
  }
}

inline bool gguf_name_has(std::string_view name, std::string_view part) {
  return name.find(part) != std::string_view::npos;
}

}  // namespace detail

inline std::string_view gguf_recipe_name(GgufRecipe recipe) {
  return detail::gguf_recipe_info(recipe).name;
}

inline GgufRecipe gguf_recipe_from_name(std::string_view name) {
  std::string known;
  for (std::size_t i = 0; i < detail::gguf_recipes.size(); ++i) {
    if (detail::equal_ignoring_case(detail::gguf_recipes[i].name, name)) {
      return static_cast<GgufRecipe>(i);
    }
    known += concat(i ? ", " : "", detail::gguf_recipes[i].name);
  }
  throw ConfigError(concat("GGUF recipe \"", name, "\" is not one of ", known));
}

inline std::uint32_t gguf_recipe_file_type(GgufRecipe recipe) {
  return detail::gguf_recipe_info(recipe).file_type;
}

inline GgmlType gguf_recipe_type(GgufRecipe recipe, const GgufTensorInfo& info, index_t layer,
                                 index_t n_layers) {
  const std::string_view name = info.name;
  const bool matrix = info.dims.size() >= 2 && name.ends_with("weight") &&
                      !detail::gguf_name_has(name, "position_embd");
  if (!matrix) return info.type;
  const GgmlType base = detail::gguf_recipe_info(recipe).base;
  GgmlType type = base;
  const bool mixed = recipe == GgufRecipe::q4_k_m || recipe == GgufRecipe::q5_k_m;
  if (name == "output.weight") {
    if (recipe != GgufRecipe::q8_0) type = GgmlType::q6_K;
  } else if (mixed && (detail::gguf_name_has(name, "attn_v.weight") ||
                       detail::gguf_name_has(name, "attn_qkv.weight") ||
                       detail::gguf_name_has(name, "ffn_down.weight"))) {
    if (layer >= 0 && detail::use_more_bits(layer, n_layers)) type = GgmlType::q6_K;
  }
  if (info.dims[0] % ggml_type_info(type).block_elements != 0)
    type = detail::k_quant_fallback(type);
  return type;
}

inline void quantize_gguf(const GgufFile& in, const std::filesystem::path& out, GgufRecipe recipe) {
  const HfConfig model = read_gguf_config(in);
  const std::string where = concat("quantize_gguf: ", in.path().string(), ": ");
  // A tied head: llama.cpp gives the token embedding the output head's type.
  const bool tied = !in.contains("output.weight");

  std::vector<std::pair<std::string, GgufValue>> metadata;
  for (const auto& [key, value] : in.metadata()) {
    if (key != "general.quantization_version" && key != "general.file_type") {
      metadata.emplace_back(key, value);
    }
  }
  metadata.emplace_back("general.quantization_version", std::uint32_t{2});
  metadata.emplace_back("general.file_type", gguf_recipe_file_type(recipe));

  // llama.cpp's order: by name, then the non-layer tensors first and the layers in order.
  struct Item {
    const GgufTensorInfo* info;
    index_t layer;
  };
  std::vector<Item> items;
  for (const GgufTensorInfo& info : in.tensors()) {
    index_t layer = -1;
    if (info.name.starts_with("blk.")) {
      layer = std::stoll(info.name.substr(4, info.name.find('.', 4) - 4));
    }
    items.push_back({&info, layer});
  }
  std::sort(items.begin(), items.end(),
            [](const Item& a, const Item& b) { return a.info->name < b.info->name; });
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.layer < b.layer; });

  std::vector<std::vector<std::byte>> stored;
  stored.reserve(items.size());
  std::vector<GgufTensorEntry> entries;
  for (const Item& item : items) {
    const GgufTensorInfo& info = *item.info;
    GgufTensorInfo as_output = info;
    if (tied && info.name == "token_embd.weight") as_output.name = "output.weight";
    const GgmlType type = gguf_recipe_type(recipe, as_output, item.layer, model.config.n_layers);
    if (type == info.type) {
      entries.push_back({info.name, info.type, info.dims, in.bytes(info.name)});
      continue;
    }
    if (info.type != GgmlType::f32 && info.type != GgmlType::f16 && info.type != GgmlType::bf16) {
      throw Error(concat(where, "tensor ", quote_file_text(info.name), " is already ",
                         ggml_type_name(info.type),
                         "; quantising it again would not give llama.cpp's result (start from "
                         "an f32, f16 or bf16 file)"));
    }
    if (info.dims[0] % ggml_type_info(type).block_elements != 0) {
      throw Error(concat(where, "tensor ", quote_file_text(info.name), " has rows of ",
                         info.dims[0], " values, not whole ", ggml_type_name(type), " blocks"));
    }
    stored.push_back(quantize_ggml(type, in.dequantize(info.name)));
    entries.push_back({info.name, type, info.dims, stored.back()});
  }
  save_gguf(out, metadata, entries);
}

}  // namespace dissect
