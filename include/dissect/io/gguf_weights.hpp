// dissect/io/gguf_weights.hpp — a GGUF model's tensors under dissect's parameter names, so the
// one strict load_state_dict (io/state_dict.hpp) fills a GPT2Model or LlamaModel from a
// llama.cpp file, and load_gguf_model, which does it.
//
// The names are accounting/tensor_names.hpp's: token_embd → wte / embed_tokens, blk.N.attn_q, _k
// and _v stacked by rows into layers.N.self_attn.qkv (GPT-2's attn_qkv is already stacked),
// attn_output → proj, ffn_gate/up/down → mlp.gate/up/down, the norms to ln_1/ln_2/ln_f or
// input_layernorm/post_attention_layernorm/norm, output → lm_head.
//
// The layouts: a GGUF tensor of dims {in, out} is dissect's [out, in] as it is (ggml's ne[0] is
// the contiguous axis). Every type of quant/ggml_blocks.hpp is dequantised to float on loading,
// bit for bit as llama.cpp dequantises it; and by default each Linear whose tensors are q4_0,
// q8_0, q4_K, q5_K or q6_K also keeps those blocks (QuantizedWeight::from_ggml) and runs on the
// quantised kernels, with llama.cpp's activation rounding (quant/detail/ggml_dot.hpp); bf16
// tensors become dissect's bf16 weights, the same bits, on the bf16 kernels. A Linear stacked
// from tensors of several kept ggml block types (q, k and v under a K-quant recipe) keeps each
// run of rows in its own type; one with any other type (f32, f16, q4_1, q5_0, q5_1, or q4_0 or
// bf16 beside another type) runs in float. LLaMA's q and k rows are un-permuted: llama.cpp's
// converter reorders the rows of each head from Hugging Face's halves (rotate_half pairs i and
// i + d_k/2) to interleaved pairs (its RoPE pairs 2i and 2i + 1), row (j, i) of a head moving to
// 2i + j for j ∈ {0, 1}, i < d_k/2; dissect's RoPE is Hugging Face's, so each row goes back:
// dissect row j·d_k/2 + i = file row 2i + j, head by head (H heads for q, H_kv for k). A
// BitNet b1.58 file's tq2_0 tensors are kept like the others.
#pragma once

#include <algorithm>
#include <array>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "dissect/accounting/tensor_names.hpp"
#include "dissect/io/gguf.hpp"
#include "dissect/io/gguf_model.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/io/state_dict.hpp"
#include "dissect/layers/quantized_linear.hpp"
#include "dissect/models/decoder_model.hpp"
#include "dissect/quant/weight_format.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// One GGUF tensor behind a dissect one: its rows stacked from `first_row`, with the rotary
/// un-permutation of `heads` heads (0: none).
struct GgufPart {
  std::string name;
  index_t first_row = 0;
  index_t heads = 0;
};

/// A dissect parameter and the GGUF tensors it is made of.
struct GgufTensorSource {
  std::string name;  ///< dissect's
  std::vector<GgufPart> parts;
};

/// Every parameter of `model`'s config and its GGUF tensors, from accounting/tensor_names.hpp's
/// table: what reading (GgufWeightsView) and writing (save_gguf_model) share.
/// @throws ConfigError for a mixture of experts (as gguf_model_tensors).
std::vector<GgufTensorSource> gguf_tensor_sources(const HfConfig& model);

/// A GGUF model file seen under dissect's parameter names and shapes (a TensorSource).
class GgufWeightsView {
 public:
  /// `file` must outlive the view; `model` is read_gguf_config(file)'s (which checked every
  /// tensor's dims).
  GgufWeightsView(const GgufFile& file, const HfConfig& model);

  const std::filesystem::path& path() const { return file_->path(); }
  std::vector<std::string> tensor_names() const;
  bool contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }
  /// dissect's view of the tensor: its name, "F32" (what it decodes to) and dissect's shape.
  const TensorInfo& info(std::string_view name) const { return mapped(name).info; }

  using Part = GgufPart;
  struct Mapped {
    TensorInfo info;
    std::vector<Part> parts;
  };
  /// @throws Error naming the file and `name` if there is no such tensor.
  const Mapped& mapped(std::string_view name) const;
  const GgufFile& file() const { return *file_; }

 private:
  const GgufFile* file_;
  std::map<std::string, Mapped, std::less<>> tensors_;
};

/// Fills `target` (dissect's shape) from the GGUF tensors behind `name`, converting to Scalar.
/// @throws ShapeError if target's shape is not info(name)'s; Error as GgufFile::dequantize.
template <class Scalar, std::size_t Rank>
void load_into(const GgufWeightsView& view, std::string_view name, TensorView<Scalar, Rank> target);

/// How load_gguf_model treats a file's quantised tensors.
struct GgufLoadOptions {
  /// Keep the blocks of the Linear layers' bf16, q4_0, q8_0, q4_K, q5_K, q6_K and tq2_0 tensors
  /// and run them on the quantised kernels (float models only). Off: every layer runs in float on
  /// the dequantised weights, which are filled either way.
  bool keep_quantized = true;
  /// With keep_quantized: each layer that keeps its blocks frees its float weight instead of
  /// holding the dequantised copy beside them (Linear::set_quantized_weight with
  /// DenseCopy::release), and that copy is never even written: a q4_0 model loads into its own
  /// bytes, not 7× them. For inference: those layers then have no weight parameter (state dicts
  /// and the module protocol see their biases only).
  bool release_dense = false;
};

/// The GPT2Model or LlamaModel a GGUF file holds, every weight dequantised to Scalar, the
/// quantised ones also kept as options say.
/// @throws as read_gguf_config; ConfigError if the file's architecture is not Model's family;
///         Error as load_state_dict.
template <class Model>
Model load_gguf_model(const GgufFile& file, GgufLoadOptions options = {});

/// Gives every Linear<float> of `model` whose GGUF tensors are all of kept types their blocks
/// (the rotary rows un-permuted, parts stacked), its W rewritten as Ŵ or freed as `dense` says;
/// returns how many layers it changed.
template <class Model>
index_t keep_gguf_blocks(Model& model, const GgufWeightsView& view,
                         DenseCopy dense = DenseCopy::keep);

// ---- implementation -----------------------------------------------------------------------------

inline std::vector<GgufTensorSource> gguf_tensor_sources(const HfConfig& model) {
  const TransformerConfig c =
      detail::gguf_file_config("gguf_tensor_sources", model.family, model.config);
  const FamilyTensorNames& names = tensor_names_of(model.family);
  const std::array<index_t, 3> part_rows = qkv_part_rows(c);
  // The heads of llama.cpp's reordered rotary rows: the queries' and the keys'.
  const std::array<index_t, 3> rotary_heads =
      names.gguf_rotary_permuted ? std::array<index_t, 3>{c.n_heads, c.kv_heads(), 0}
                                 : std::array<index_t, 3>{};
  std::vector<GgufTensorSource> out;
  for (ParameterNames& parameter : model_parameter_names(names, c)) {
    GgufTensorSource source{std::move(parameter.dissect), {}};
    const bool stacked = parameter.gguf.size() > 1;
    index_t first_row = 0;
    for (std::size_t part = 0; part < parameter.gguf.size(); ++part) {
      source.parts.push_back(
          {std::move(parameter.gguf[part]), first_row, stacked ? rotary_heads[part] : 0});
      first_row += part_rows[part];
    }
    out.push_back(std::move(source));
  }
  return out;
}

inline GgufWeightsView::GgufWeightsView(const GgufFile& file, const HfConfig& model)
    : file_(&file) {
  for (GgufTensorSource& source : gguf_tensor_sources(model)) {
    // Its shape: the parts' rows stacked (each part's shape is the file's, dims reversed).
    std::vector<index_t> shape = file.info(source.parts.front().name).shape();
    for (std::size_t i = 1; i < source.parts.size(); ++i)
      shape.front() += file.info(source.parts[i].name).shape().front();
    TensorInfo info{source.name, "F32", std::move(shape), 0, 0};
    std::string name = source.name;
    tensors_.emplace(std::move(name), Mapped{std::move(info), std::move(source.parts)});
  }
}

inline std::vector<std::string> GgufWeightsView::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, mapped] : tensors_) names.push_back(name);
  return names;
}

inline const GgufWeightsView::Mapped& GgufWeightsView::mapped(std::string_view name) const {
  const auto found = tensors_.find(name);
  if (found == tensors_.end()) {
    throw Error(concat("GgufWeightsView: ", path().string(), ": no tensor for ", name));
  }
  return found->second;
}

namespace detail {

/// Row `r` of a rotary projection in dissect's order (Hugging Face's halves) read from llama.cpp's
/// interleaved order: within each head of `head_rows`, dissect row j·half + i is file row 2i + j.
inline index_t gguf_rotary_source_row(index_t r, index_t head_rows) {
  const index_t head = r / head_rows, within = r % head_rows, half = head_rows / 2;
  const index_t j = within / half, i = within % half;
  return head * head_rows + 2 * i + j;
}

}  // namespace detail

template <class Scalar, std::size_t Rank>
void load_into(const GgufWeightsView& view, std::string_view name,
               TensorView<Scalar, Rank> target) {
  const auto& mapped = view.mapped(name);
  if (!std::equal(mapped.info.shape.begin(), mapped.info.shape.end(), target.shape().begin(),
                  target.shape().end())) {
    throw ShapeError(concat(
        "load_into: ", name, " is ", format_shape(std::span<const index_t>(mapped.info.shape)),
        " in ", view.path().string(), ", the target is ", format_shape(target.shape())));
  }
  const index_t row_length = mapped.info.shape.size() > 1 ? mapped.info.shape.back() : 1;
  Scalar* out = target.data();
  for (const GgufWeightsView::Part& part : mapped.parts) {
    const GgufFile& file = view.file();
    if (std::is_same_v<Scalar, float> && file.info(part.name).type == GgmlType::f32) {
      // Stored as the model computes: rows straight out of the file, without a decoded copy
      // (which cost a fresh buffer's page faults and one more pass per tensor).
      const std::span<const std::byte> bytes = file.bytes(part.name);
      const auto rows =
          static_cast<index_t>(bytes.size() / sizeof(float)) / std::max<index_t>(row_length, 1);
      const index_t head_rows = part.heads > 0 ? rows / part.heads : 0;
      for (index_t r = 0; r < rows; ++r) {
        const index_t source = head_rows > 0 ? detail::gguf_rotary_source_row(r, head_rows) : r;
        std::memcpy(out + (part.first_row + r) * row_length,
                    bytes.data() + source * row_length * index_t{sizeof(float)},
                    static_cast<std::size_t>(row_length) * sizeof(float));
      }
      file.release(part.name);
      continue;
    }
    const std::vector<float> values = file.dequantize(part.name);
    const auto rows = static_cast<index_t>(values.size()) / row_length;
    const index_t head_rows = part.heads > 0 ? rows / part.heads : 0;
    for (index_t r = 0; r < rows; ++r) {
      const index_t source = head_rows > 0 ? detail::gguf_rotary_source_row(r, head_rows) : r;
      const float* from = values.data() + source * row_length;
      Scalar* to = out + (part.first_row + r) * row_length;
      for (index_t k = 0; k < row_length; ++k) to[k] = static_cast<Scalar>(from[k]);
    }
    // Copied: the file's pages need not stay resident beside the model's (a kept block type is
    // read again, from the page cache, by keep_gguf_blocks).
    file.release(part.name);
  }
}

namespace detail {

/// The blocks of one GGUF tensor as dissect's rows: permuted back for the rotary projections.
inline std::vector<std::uint8_t> gguf_part_rows(const GgufFile& file, const GgufPart& part) {
  const GgufTensorInfo& info = file.info(part.name);
  const std::span<const std::byte> bytes = file.bytes(part.name);
  const auto* data = reinterpret_cast<const std::uint8_t*>(bytes.data());
  if (part.heads == 0) return {data, data + bytes.size()};
  const index_t rows = info.dims[1], row_bytes = ggml_row_bytes(info.type, info.dims[0]);
  std::vector<std::uint8_t> out(bytes.size());
  for (index_t r = 0; r < rows; ++r) {
    const index_t source = gguf_rotary_source_row(r, rows / part.heads);
    std::copy(data + source * row_bytes, data + (source + 1) * row_bytes,
              out.begin() + r * row_bytes);
  }
  return out;
}

}  // namespace detail

template <class Model>
index_t keep_gguf_blocks(Model& model, const GgufWeightsView& view, DenseCopy dense) {
  index_t changed = 0;
  for_each_layer(model, [&](const std::string& path, Linear<float>& layer) {
    const std::string name = path + ".weight";
    if (!view.contains(name)) return;
    const auto& parts = view.mapped(name).parts;
    const GgufFile& file = view.file();
    const GgmlType first = file.info(parts.front().name).type;
    bool one_type = true;
    for (const GgufPart& part : parts) {
      const GgmlType type = file.info(part.name).type;
      if (!QuantizedWeight::keeps_ggml_type(type)) return;
      one_type = one_type && type == first;
    }
    const index_t cols = layer.in_features();
    // A block the kept format refuses (a non-finite scale, a tq2_0 code of 3) is the file's fault:
    // name it and the tensors.
    const auto in_file = [&](const auto& keep) {
      try {
        keep();
      } catch (const FormatError&) {
        throw;
      } catch (const Error& error) {
        std::string tensors;
        for (const GgufPart& part : parts)
          tensors += concat(tensors.empty() ? "" : ", ", part.name);
        throw FormatError(
            concat(file.path().string(), ": ", name, " (", tensors, "): ", error.what()));
      }
    };
    if (one_type) {
      std::vector<std::uint8_t> blocks;
      for (const GgufPart& part : parts) {
        std::vector<std::uint8_t> rows = detail::gguf_part_rows(file, part);
        file.release(part.name);  // copied: the mapped pages need not stay resident beside it
        if (blocks.empty()) {
          blocks = std::move(rows);
        } else {
          blocks.insert(blocks.end(), rows.begin(), rows.end());
        }
      }
      in_file([&] {
        layer.set_quantized_weight(
            QuantizedWeight::from_ggml(first, layer.out_features(), cols, std::move(blocks)),
            dense);
      });
    } else {
      std::vector<QuantizedWeight> stacked;
      for (const GgufPart& part : parts) {
        const GgufTensorInfo& info = file.info(part.name);
        if (!weight_format_of(info.type)) return;  // q4_0 beside another type: stays float
        in_file([&] {
          stacked.push_back(QuantizedWeight::from_ggml(info.type, info.dims[1], cols,
                                                       detail::gguf_part_rows(file, part)));
          file.release(part.name);
        });
      }
      layer.set_quantized_weight(QuantizedWeight::stack_rows(std::move(stacked)), dense);
    }
    ++changed;
  });
  return changed;
}

template <class Model>
Model load_gguf_model(const GgufFile& file, GgufLoadOptions options) {
  const HfConfig model = read_gguf_config(file);
  require_family<Model>(model.family, concat("load_gguf_model: ", file.path().string()));
  // The strict load below writes every Linear weight that is not freed first, so none is zeroed
  // at construction: a weight's pages are touched only by the values it gets.
  Model result = [&] {
    const ConstructionScope loading({.initialise = false,
                                     .gradients = ConstructionScope::current().gradients,
                                     .leave_weights_unwritten = true});
    return Model(model.config, ModelOptions{});
  }();
  const GgufWeightsView view(file, model);
  if constexpr (std::is_same_v<typename Model::scalar_type, float>) {
    if (options.keep_quantized && options.release_dense) {
      // Blocks first, so the freed weights are never written; the load then skips them.
      keep_gguf_blocks(result, view, DenseCopy::release);
      std::set<std::string, std::less<>> freed;
      for_each_layer(result, [&](const std::string& path, const Linear<float>& layer) {
        if (layer.dense_weight_released()) freed.insert(path + ".weight");
      });
      LoadOptions load;
      load.ignore = [&](std::string_view name) { return freed.contains(name); };
      load_state_dict(result, view, load);
      return result;
    }
  }
  load_state_dict(result, view);
  if constexpr (std::is_same_v<typename Model::scalar_type, float>) {
    if (options.keep_quantized) keep_gguf_blocks(result, view);
  }
  return result;
}

}  // namespace dissect
