// dissect/parallel/parallel_decoder_layer.hpp — a whole GPT-2 or LLaMA decoder layer,
// tensor-parallel.
//
//   x₂ = x + ParallelAttention(norm₁(x))      (heads split; RoPE on this rank's heads for LLaMA)
//   y  = x₂ + ParallelFFN(norm₂(x₂))          (F split)
//
// The norms and the residual stream are replicated: every rank holds the whole [B, T, D]
// activations, and the norms' (small) weights and gradients are the same on every rank because
// their inputs and output gradients are. So the layer moves two all-reduces of B·T·D values in
// forward and two in backward, as tensor_parallel_budget counts.
//
// Two ways to build one: from a full DecoderLayer every rank holds (each keeps its slices), or
// from a checkpoint with load_parallel_layer, where each rank decodes only its slice of each split
// tensor from the mapped safetensors file and the full weights are never in memory.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/core/error.hpp"
#include "dissect/io/safetensors.hpp"
#include "dissect/layers/norm.hpp"
#include "dissect/layers/rope.hpp"
#include "dissect/models/decoder_layer.hpp"
#include "dissect/parallel/communicator.hpp"
#include "dissect/parallel/parallel_blocks.hpp"
#include "dissect/parallel/parallel_linear.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect::parallel {

// ---- declarations -------------------------------------------------------------------------------

template <class Scalar, const DecoderStyle& Style>
class ParallelDecoderLayer : public ComposedModule<ParallelDecoderLayer<Scalar, Style>> {
 public:
  using scalar_type = Scalar;
  /// The family: its parts and names.
  static constexpr const DecoderStyle& style = Style;
  using NormType = Normalization<Scalar, Style.norm>;
  using FfnType = std::conditional_t<Style.ffn == Ffn::mlp, ParallelFeedForward<Scalar>,
                                     ParallelGatedFeedForward<Scalar>>;

  /// What backward needs from forward; reusable across steps.
  struct Cache {
    typename NormType::Cache norm1, norm2;
    Tensor<Scalar, 3> normed1;  ///< norm₁(x): [B, T, D]
    typename ParallelAttention<Scalar>::Cache attention;
    Tensor<Scalar, 3> residual;  ///< x₂: [B, T, D]
    Tensor<Scalar, 3> normed2;   ///< norm₂(x₂)
    typename FfnType::Cache ffn;
  };

  /// Rank p's share of `full` (norms copied whole, its score scale kept); every gradient starts
  /// at zero. A collective; `comm` must outlive the layer.
  /// @throws ConfigError (every rank) if P does not divide H, H_kv or F; ShapeError (every rank)
  ///         if the ranks' layers differ in shape or in any value (weights, norms, score scale).
  ParallelDecoderLayer(const DecoderLayer<Scalar, Style>& full, const Communicator& comm);

  /// From parts already split (what load_parallel_layer builds). A collective.
  /// @throws ConfigError if the parts differ in D; ShapeError if the norms differ across ranks.
  ParallelDecoderLayer(NormType norm1, ParallelAttention<Scalar> attention, NormType norm2,
                       FfnType ffn, const Communicator& comm);

  index_t d_model() const { return attention_.d_model(); }
  const Communicator& communicator() const { return *comm_; }
  NormType& attention_norm() { return norm1_; }
  const NormType& attention_norm() const { return norm1_; }
  ParallelAttention<Scalar>& attention() { return attention_; }
  const ParallelAttention<Scalar>& attention() const { return attention_; }
  NormType& ffn_norm() { return norm2_; }
  const NormType& ffn_norm() const { return norm2_; }
  FfnType& ffn() { return ffn_; }
  const FfnType& ffn() const { return ffn_; }
  // for_each_parameter: DecoderLayer's names ("ln_1.weight", "attn.qkv.weight", …), holding
  // this rank's slices of the split tensors and the whole norms.

  /// Training: x [B, T, D] (the same on every rank) at positions 0 … T − 1 → y [B, T, D], the
  /// same on every rank; two all-reduces, and three small agreements (Communicator::agree: the
  /// layer's, attention's, the FFN's). `rope`: the model's table (rotary styles; null
  /// otherwise), with the same d_k and θ on every rank. Every error is every rank's, naming the
  /// failing one. @throws ShapeError (every rank) if x differs across ranks (in shape or in any
  /// value) or is not [B, T, D] on some rank; Error if a rotary layer gets no table, or one too
  /// short for T, on some rank.
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache,
                            const RotaryTable<Scalar>* rope) const;
  /// The same, keeping nothing.
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, const RotaryTable<Scalar>* rope) const {
    Cache scratch;
    return forward(x, scratch, rope);
  }

  /// x, cache from forward(x, cache, …), dy [B, T, D] → dx [B, T, D] (the same on every rank);
  /// adds into this rank's gradients (the norms' are the same on every rank). Two all-reduces
  /// and three agreements. The layer's own checks (x and dy: shapes and values; its caches; the
  /// table) are agreed before any gradient changes; a block's cache that does not fit is refused,
  /// on every rank, by that block's agreement, after the FFN's gradients have been added when
  /// it is attention's. @throws as forward, ShapeError for a cache of another input.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, Cache& cache,
                             ConstTensorView<Scalar, 3> dy, const RotaryTable<Scalar>* rope);

 private:
  friend class ComposedModule<ParallelDecoderLayer>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child(Style.attention_norm, self.norm1_, visit);
    visit_child(Style.attention, self.attention_, visit);
    visit_child(Style.ffn_norm, self.norm2_, visit);
    visit_child(Style.mlp, self.ffn_, visit);
  }

  static FfnType split_ffn(const DecoderLayer<Scalar, Style>& full, const Communicator& comm);
  const RotaryTable<Scalar>* checked_rope(std::string_view op,
                                          const RotaryTable<Scalar>* rope) const;
  /// "Parallel<layer name>" and "Parallel<layer name>::<call>": names in errors and agreements.
  static std::string layer_op() { return dissect::detail::concat("Parallel", Style.layer_name); }
  static std::string op_name(std::string_view call) {
    return dissect::detail::concat(layer_op(), "::", call);
  }
  /// The table the attention block is given: the caller's for a rotary style, none otherwise.
  static const RotaryTable<Scalar>* effective_rope(const RotaryTable<Scalar>* rope) {
    return Style.positions == Positions::rotary ? rope : nullptr;
  }
  /// The norms' parameters, checksummed: replicated, so the same on every rank.
  std::uint64_t norms_checksum() const {
    Checksum sum;
    for (const NormType* norm : {&norm1_, &norm2_}) {
      norm->for_each_parameter([&](const ParameterName&, auto value, auto) {
        sum.add(std::span(value.data(), static_cast<std::size_t>(value.size())));
      });
    }
    return sum.value();
  }

  const Communicator* comm_;
  NormType norm1_;
  ParallelAttention<Scalar> attention_;
  NormType norm2_;
  FfnType ffn_;
};

/// GPT-2's block and LLaMA's decoder layer, tensor-parallel.
template <class Scalar>
using ParallelGPT2Block = ParallelDecoderLayer<Scalar, gpt2_style>;
template <class Scalar>
using ParallelLlamaDecoderLayer = ParallelDecoderLayer<Scalar, llama_style>;

/// Layer `prefix` ("h.3.", "layers.0.") of `config` from a checkpoint in DecoderLayer's names (as
/// save_model writes them), each rank decoding only its slices: rows of the column-parallel
/// weights (for the fused qkv, its heads of q, of k and of v), columns of the row-parallel ones,
/// and the norms and row-parallel biases whole. The layer scales its attention scores by
/// config.score_scale(i); when that depends on the layer (score_scaling.inverse_layer_index), i
/// is read from the prefix, which must then end in "<layers>.<i>." ("h.3."). Dtypes convert as
/// SafetensorsFile::load does
/// (F32, F64, F16, BF16 into float or double). A collective: every rank of `comm` calls it,
/// usually on the same file. Every problem with the file is found before any collective and
/// agreed (Communicator::agree): if one rank fails, every rank throws the same exception (the
/// first failing rank's type, its text naming the rank), so no rank is left waiting.
/// @throws Error naming the file and tensor if one is missing or of a dtype that is not read;
///         ShapeError if a tensor's shape is not the config's; ConfigError for an invalid config,
///         one P does not divide, or a per-layer score scaling with a prefix that names no layer.
template <class Layer>
Layer load_parallel_layer(const SafetensorsFile& file, std::string_view prefix,
                          const TransformerConfig& config, const Communicator& comm);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// A norm's cache holds the statistics of an x of `x_shape`: what Normalization::backward would
/// refuse, checked before a layer's backward touches any gradient.
template <class Norm>
void check_norm_cache(std::string_view op, const char* name, const typename Norm::Cache& cache,
                      const Shape<3>& x_shape) {
  const index_t rows = x_shape[0] * x_shape[1];
  const bool fits =
      std::equal(cache.shape.begin(), cache.shape.end(), x_shape.begin(), x_shape.end()) &&
      cache.rstd.size() == rows && cache.mean.size() == (Norm::centered ? rows : 0);
  if (!fits) {
    throw ShapeError(dissect::detail::concat(op, ": ", name,
                                             " holds the statistics of another x than x ",
                                             format_shape(x_shape), block_cache_hint));
  }
}

}  // namespace detail

template <class Scalar, const DecoderStyle& Style>
auto ParallelDecoderLayer<Scalar, Style>::split_ffn(const DecoderLayer<Scalar, Style>& full,
                                                    const Communicator& comm) -> FfnType {
  return FfnType(full.ffn(), comm);
}

template <class Scalar, const DecoderStyle& Style>
ParallelDecoderLayer<Scalar, Style>::ParallelDecoderLayer(const DecoderLayer<Scalar, Style>& full,
                                                          const Communicator& comm)
    : comm_(&comm),
      norm1_(full.attention_norm()),
      attention_(full.qkv(), full.attention_output(), comm, full.score_scale()),
      norm2_(full.ffn_norm()),
      ffn_(split_ffn(full, comm)) {
  // The slices start with zero gradients; so do the copied norms, whatever `full` accumulated.
  norm1_.zero_grad();
  norm2_.zero_grad();
  comm.agree(layer_op(), {.replicated = {{"the norms' parameters", norms_checksum()}}}, [] {});
}

template <class Scalar, const DecoderStyle& Style>
ParallelDecoderLayer<Scalar, Style>::ParallelDecoderLayer(NormType norm1,
                                                          ParallelAttention<Scalar> attention,
                                                          NormType norm2, FfnType ffn,
                                                          const Communicator& comm)
    : comm_(&comm),
      norm1_(std::move(norm1)),
      attention_(std::move(attention)),
      norm2_(std::move(norm2)),
      ffn_(std::move(ffn)) {
  comm.agree(layer_op(),
             {.shapes = {attention_.d_model(), ffn_.d_model()},
              .shapes_what = "D of the attention and of the FFN",
              .replicated = {{"the norms' parameters", norms_checksum()}}},
             [&] {
               if (ffn_.d_model() != attention_.d_model()) {
                 throw ConfigError(dissect::detail::concat(
                     Style.layer_name, ": attention has D = ", attention_.d_model(),
                     " but the FFN has D = ", ffn_.d_model()));
               }
             });
}

template <class Scalar, const DecoderStyle& Style>
const RotaryTable<Scalar>* ParallelDecoderLayer<Scalar, Style>::checked_rope(
    std::string_view op, const RotaryTable<Scalar>* rope) const {
  if constexpr (Style.positions == Positions::rotary) {
    if (!rope) throw Error(dissect::detail::concat(op, ": a rotary layer needs a RoPE table"));
    return rope;
  } else {
    return nullptr;
  }
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> ParallelDecoderLayer<Scalar, Style>::forward(
    ConstTensorView<Scalar, 3> x, Cache& cache, const RotaryTable<Scalar>* rope) const {
  // The layer's own agreement covers its local work before the attention block's: the table
  // (given, long enough), x (shape and values) and norm₁. Each block then agrees on its input.
  const std::string op = op_name("forward");
  const auto* table = comm_->agree(
      op,
      {.shapes = detail::shape_values(x),
       .replicated = {{"x", detail::checksum_of(x)},
                      {detail::rope_what, detail::rope_checksum(effective_rope(rope))}}},
      [&] {
        const auto* checked = checked_rope(op, rope);
        check_block_tokens(op, "x", x, "D", d_model());
        if (checked) detail::check_rope_fits(op, *checked, x.dim(1), attention_.head_dim());
        cache.normed1 = norm1_.forward(x, cache.norm1);
        return checked;
      });
  cache.residual = attention_.forward(cache.normed1, cache.attention, table);
  dissect::detail::add_into<Scalar>(cache.residual, x);
  cache.normed2 = norm2_.forward(cache.residual, cache.norm2);
  auto y = ffn_.forward(cache.normed2, cache.ffn);
  dissect::detail::add_into<Scalar>(y, cache.residual);
  return y;
}

template <class Scalar, const DecoderStyle& Style>
Tensor<Scalar, 3> ParallelDecoderLayer<Scalar, Style>::backward(ConstTensorView<Scalar, 3> x,
                                                                Cache& cache,
                                                                ConstTensorView<Scalar, 3> dy,
                                                                const RotaryTable<Scalar>* rope) {
  // What the layer reads — x, dy, its caches, the table, and the attention block's cache, whose
  // backward runs after the FFN's has added to its gradients — is checked and agreed before any
  // gradient changes. The FFN's backward, the first to touch one, agrees on its own cache.
  const std::string op = op_name("backward");
  const auto* table = comm_->agree(
      op,
      {.shapes = detail::shape_values(x, dy, cache.normed1, cache.residual, cache.normed2),
       .replicated = {{"x", detail::checksum_of(x)},
                      {"dy", detail::checksum_of(dy)},
                      {detail::rope_what, detail::rope_checksum(effective_rope(rope))}}},
      [&] {
        const auto* checked = checked_rope(op, rope);
        check_block_tokens(op, "x", x, "D", d_model());
        const auto x_text = format_shape(x.shape());
        check_block_shape(op, "dy", dy, "[B, T, D]", x.shape(), "x", x_text);
        for (const auto& [name, tensor] : {std::pair{"cache.normed1", &cache.normed1},
                                           std::pair{"cache.residual", &cache.residual},
                                           std::pair{"cache.normed2", &cache.normed2}}) {
          check_block_shape(op, name, *tensor, "[B, T, D]", x.shape(), "x", x_text,
                            block_cache_hint);
        }
        detail::check_norm_cache<NormType>(op, "cache.norm1", cache.norm1, x.shape());
        detail::check_norm_cache<NormType>(op, "cache.norm2", cache.norm2, x.shape());
        if (checked) detail::check_rope_fits(op, *checked, x.dim(1), attention_.head_dim());
        // Attention's backward gets d x₂, which has dy's shape: its checks see the same shapes.
        attention_.check_backward(cache.normed1, cache.attention, dy, checked);
        return checked;
      });
  // d x₂ = dy + norm₂ᵀ(FFNᵀ(dy)); FFNᵀ all-reduces, so norm₂'s gradient is the same everywhere.
  auto d_residual =
      norm2_.backward(cache.residual, cache.norm2, ffn_.backward(cache.normed2, cache.ffn, dy));
  dissect::detail::add_into<Scalar>(d_residual, dy);
  auto dx = norm1_.backward(x, cache.norm1,
                            attention_.backward(cache.normed1, cache.attention, d_residual, table));
  dissect::detail::add_into<Scalar>(dx, d_residual);
  return dx;
}

namespace detail {

/// The i of a layer prefix "<layers>.<i>." ("h.3.", "transformer.h.3."), for the score scale of a
/// config whose scaling depends on the layer. @throws ConfigError naming the prefix otherwise.
inline index_t layer_index_of(std::string_view op, std::string_view prefix,
                              std::string_view layers) {
  const std::string head = std::string(layers) + ".";
  const std::size_t start = prefix.rfind(head);
  std::string_view digits =
      start == std::string_view::npos ? std::string_view{} : prefix.substr(start + head.size());
  const bool at_name_start =
      start == 0 || (start != std::string_view::npos && prefix[start - 1] == '.');
  if (at_name_start && digits.size() >= 2 && digits.back() == '.') {
    digits.remove_suffix(1);
    index_t index = 0;
    bool ok = digits.size() <= 9;
    for (char c : digits) {
      ok = ok && c >= '0' && c <= '9';
      index = index * 10 + (c - '0');
    }
    if (ok) return index;
  }
  throw ConfigError(dissect::detail::concat(
      op, ": prefix \"", prefix, "\" names no layer (as \"", head,
      "3.\"), which the config's "
      "score_scaling.inverse_layer_index needs: each layer scales its scores by its own index"));
}

/// Reads slices of the tensors of one checkpoint, checking each one's full shape.
class SliceReader {
 public:
  SliceReader(const SafetensorsFile& file, std::string_view prefix)
      : file_(file), prefix_(prefix) {}

  std::string name(std::string_view local) const {
    return std::string(prefix_) + std::string(local);
  }

  /// Rows [first, first + count) of tensor `local` (whose shape must be `shape`) into `target`.
  template <class Scalar>
  void rows(std::string_view local, const std::vector<index_t>& shape, index_t first, index_t count,
            Scalar* target) const {
    const std::string full = check(local, shape);
    const index_t row = shape.size() > 1 ? shape[1] : 1;
    load_block_into(file_, full, first, count, 0, row, TensorView<Scalar, 2>(target, {count, row}));
  }

  /// Columns [first, first + count) of the [out, in] tensor `local` into `target` [out, count].
  template <class Scalar>
  void columns(std::string_view local, const std::vector<index_t>& shape, index_t first,
               index_t count, Scalar* target) const {
    const std::string full = check(local, shape);
    load_block_into(file_, full, 0, shape[0], first, count,
                    TensorView<Scalar, 2>(target, {shape[0], count}));
  }

  /// The whole of tensor `local` into a module's parameter view.
  template <class View>
  void whole(std::string_view local, View target) const {
    load_into(file_, name(local), target);
  }

 private:
  /// The full name of `local`, after checking that its shape is what the config needs.
  std::string check(std::string_view local, const std::vector<index_t>& shape) const {
    std::string full = name(local);
    const TensorInfo& info = file_.info(full);  // Error naming the file if missing
    if (info.shape != shape) {
      throw ShapeError(dissect::detail::concat(
          "load_parallel_layer: tensor \"", full, "\" in ", file_.path().string(), " has shape ",
          format_shape(info.shape), ", the config needs ", format_shape(shape)));
    }
    return full;
  }

  const SafetensorsFile& file_;
  std::string_view prefix_;
};

/// A column-parallel slice: rank p's share of each part of the rows of `<linear>.weight` [out, in]
/// (and `.bias`), read into a Linear [local_rows, in].
template <class Scalar>
Linear<Scalar> read_column_slice(const SliceReader& reader, const std::string& linear,
                                 index_t in_features, std::span<const index_t> parts, bool bias,
                                 const Communicator& comm) {
  index_t out = 0, local_rows = 0;
  for (index_t width : parts) {
    out += width;
    local_rows += even_share(linear, "out_features", width, comm.size());
  }
  Tensor<Scalar, 2> weight({local_rows, in_features});
  std::optional<Tensor<Scalar, 1>> b;
  if (bias) b.emplace(Shape<1>{local_rows});
  index_t part_start = 0, row = 0;
  for (index_t width : parts) {
    const index_t share = width / comm.size(), first = part_start + comm.rank() * share;
    reader.rows(linear + ".weight", {out, in_features}, first, share,
                weight.data() + row * in_features);
    if (b) reader.rows(linear + ".bias", {out}, first, share, b->data() + row);
    part_start += width;
    row += share;
  }
  return Linear<Scalar>(std::move(weight), std::move(b));
}

}  // namespace detail

template <class Layer>
Layer load_parallel_layer(const SafetensorsFile& file, std::string_view prefix,
                          const TransformerConfig& config, const Communicator& comm) {
  using Scalar = typename Layer::scalar_type;
  using NormType = typename Layer::NormType;
  using FfnType = typename Layer::FfnType;
  constexpr bool gated = std::is_same_v<FfnType, ParallelGatedFeedForward<Scalar>>;
  // The style, through the layer type: DecoderLayer's with the same parameters.
  constexpr const DecoderStyle& style = Layer::style;
  constexpr std::string_view op = "load_parallel_layer";

  const index_t D = config.d_model, H = config.n_heads, H_kv = config.kv_heads(), F = config.d_ff;
  const double eps = config.norm_eps.value_or(NormType::default_eps);
  std::optional<NormType> norm1, norm2;
  std::optional<Linear<Scalar>> qkv, proj, gate, up, down;
  double score_scale = 0;
  std::optional<Tensor<Scalar, 1>> proj_bias, down_bias;
  detail::SliceReader reader(file, prefix);
  // A tensor's name below the layer prefix ("attn.qkv"), from the family's table.
  const FamilyTensorNames& names = tensor_names_of(style.family);
  const auto in_layer = [&](ModelTensor tensor) {
    return module_path_in_layer(names, *names.find(tensor));
  };

  // Every check and every read is local: one agreement settles them all before any collective.
  comm.agree(op, [&] {
    check_style(style.layer_name, style, config);
    if (config.sliding_window) {
      // The tensor-parallel attention reads every earlier position: a window would be ignored.
      throw ConfigError(dissect::detail::concat(op, ": config.sliding_window is ",
                                                *config.sliding_window,
                                                "; the tensor-parallel layers have no window yet"));
    }
    // The index matters only to a scale that depends on it (and "h.7." of a 2-layer config must
    // stay the missing-tensor Error it is otherwise).
    score_scale = config.score_scale(config.score_scaling.inverse_layer_index
                                         ? detail::layer_index_of(op, prefix, style.layers)
                                         : 0);
    detail::even_share(op, "n_heads", H, comm.size());
    detail::even_share(op, "n_kv_heads", H_kv, comm.size());
    detail::even_share(op, "d_ff", F, comm.size());
    const index_t d_k = config.head_size(), P = comm.size();
    const auto load_norm = [&](std::optional<NormType>& norm, const char* name) {
      norm.emplace(D, eps);
      norm->for_each_parameter([&](const ParameterName& parameter, auto value, auto) {
        reader.whole(std::string(name) + "." + parameter.str(), value);
      });
    };
    load_norm(norm1, style.attention_norm);
    load_norm(norm2, style.ffn_norm);
    const std::array<index_t, 3> qkv_parts{H * d_k, H_kv * d_k, H_kv * d_k};
    qkv.emplace(detail::read_column_slice<Scalar>(reader, in_layer(ModelTensor::qkv), D, qkv_parts,
                                                  config.bias, comm));
    const auto read_row = [&](std::optional<Linear<Scalar>>& local,
                              std::optional<Tensor<Scalar, 1>>& bias, const std::string& linear,
                              index_t in, index_t out) {
      const index_t share = in / P;
      Tensor<Scalar, 2> weight({out, share});
      reader.columns(linear + ".weight", {out, in}, comm.rank() * share, share, weight.data());
      local.emplace(std::move(weight));
      if (config.bias) {
        bias.emplace(Shape<1>{out});
        reader.rows(linear + ".bias", {out}, 0, out, bias->data());
      }
    };
    read_row(proj, proj_bias, in_layer(ModelTensor::attention_output), D, D);
    const std::array<index_t, 1> ffn_parts{F};
    if constexpr (gated) {
      gate.emplace(detail::read_column_slice<Scalar>(reader, in_layer(ModelTensor::ffn_gate), D,
                                                     ffn_parts, config.bias, comm));
    }
    up.emplace(detail::read_column_slice<Scalar>(reader, in_layer(ModelTensor::ffn_up), D,
                                                 ffn_parts, config.bias, comm));
    read_row(down, down_bias, in_layer(ModelTensor::ffn_down), F, D);
  });

  // Every rank read its slices: now the collectives that agree on the shapes.
  const index_t d_k = D / H;
  const std::array<index_t, 3> qkv_parts{H * d_k, H_kv * d_k, H_kv * d_k};
  ParallelAttention<Scalar> attention(
      ColumnParallelLinear<Scalar>(std::move(*qkv), (H + 2 * H_kv) * d_k, comm, qkv_parts),
      RowParallelLinear<Scalar>(std::move(*proj), std::move(proj_bias), D, comm), H, H_kv, comm,
      score_scale);
  RowParallelLinear<Scalar> down_part(std::move(*down), std::move(down_bias), F, comm);
  if constexpr (gated) {
    FfnType ffn(ColumnParallelLinear<Scalar>(std::move(*gate), F, comm),
                ColumnParallelLinear<Scalar>(std::move(*up), F, comm), std::move(down_part), comm);
    return Layer(std::move(*norm1), std::move(attention), std::move(*norm2), std::move(ffn), comm);
  } else {
    FfnType ffn(ColumnParallelLinear<Scalar>(std::move(*up), F, comm), std::move(down_part),
                style.activation, comm);
    return Layer(std::move(*norm1), std::move(attention), std::move(*norm2), std::move(ffn), comm);
  }
}

}  // namespace dissect::parallel
