// dissect/quant/weight_format.hpp — low-precision weight formats and QuantizedWeight, a weight
// matrix W [out, in] stored in one of them.
//
// Each format states how a float becomes a stored value (the rounding rule) and how the stored
// value becomes a float again (exact):
//
//   bf16  — W's float rounded to the nearest bfloat16, ties to even: torch's W.to(torch.bfloat16).
//           Reconstruction error ≤ 2⁻⁸·|w| (half a step of an 8-bit significand). Any in_features.
//   int8  — per output row (channel), symmetric: s = max|w_row| / 127 (in float),
//           q = nearbyint(w · (1/s)) clamped to [−127, 127] (never −128: symmetric), ŵ = s·q. As
//           torch.quantize_per_channel(W, s, 0, 0, torch.qint8) computes q. A row of zeros gets
//           s = 1 (torch would take s = 0 and store −128; any positive s gives q = 0 = ŵ).
//           Error ≤ s/2 per weight. Any in_features.
//   q4_0  — GGUF's Q4_0: blocks of 32 along in_features; m = the block's value of largest
//           magnitude, d = m / −8 (float), q = min(15, trunc(w/d + 8.5)) (w/d computed as
//           w·(1/d)), stored d = fp16(d) (nearest even), ŵ = (q − 8)·fp16(d). |w/d| ≤ 8, so q
//           ∈ [0, 16] before the clamp; the clamp costs up to one step on the side opposite m.
//           Error ≤ |d| + 8·|d − fp16(d)| per weight. in_features must be a multiple of 32: a
//           ShapeError at quantisation time, not a padded tail.
//   q8_0, q4_K, q5_K, q6_K — ggml's blocks, kept as a GGUF file stores them: quantised by ggml's
//           quantize_row_*_ref and decoded by its dequantize_row_* (quant/ggml_blocks.hpp), bit
//           for bit. in_features a multiple of the block (32 for q8_0, 256 for the K-quants).
//           Their rows may be stacked from parts of different ggml formats (a GGUF model's
//           q, k and v, which llama.cpp's recipes quantise differently): each run of rows keeps
//           its own blocks and format.
//   tq2_0 — ggml's ternary blocks, the layout llama.cpp stores BitNet b1.58 models in (so such a
//           GGUF file runs on its own bytes, with llama.cpp as the baseline on the same file):
//           per 256 weights, d = max|w| (stored fp16) and q = lroundf(w·(1/d)) + 1 ∈ {0, 1, 2}
//           in 2 bits, ŵ = (q − 1)·fp16(d); 2.0625 bits per weight. Rounding to the nearest of
//           −d, 0, d is the whole rule: a trained ternary weight (every block ±s or 0) is kept
//           exactly, any other loses up to d/2 per weight. A ggml format in every other respect
//           (in_features a multiple of 256, stacking, GGUF loading); a block with a code of 3,
//           which no quantiser writes and llama.cpp would read as +2·d, is refused on loading.
//
// Every format refuses an empty matrix and a non-finite weight (naming the row and column), and a
// scale that does not fit its own type (a bf16 that rounds to ±Inf, an fp16 block scale beyond
// 65504): quantising must never turn a finite model into Inf or NaN. The stored bytes are the
// kernels' layout (quant/detail/quant_kernels.hpp) and the safetensors layout
// (io/quantized_file.hpp).
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/detail/enum_check.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/numeric/half.hpp"
#include "dissect/quant/detail/ggml_dot.hpp"
#include "dissect/quant/detail/quant_kernels.hpp"
#include "dissect/quant/format.hpp"
#include "dissect/quant/ggml_blocks.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Weights per block sharing a scale along in_features (int8: the whole row; bf16: none, 1).
inline constexpr index_t q4_block = dtype_info(Dtype::q4_0).block_elements;

/// Rows [first_row, first_row + rows) of a weight in one of ggml's formats: their blocks, as a
/// GGUF file stores them (row r's at (r − first_row)·ggml_row_bytes).
struct GgmlRows {
  WeightFormat format = WeightFormat::q8_0;
  index_t first_row = 0, rows = 0;
  std::vector<std::uint8_t> blocks;
};

/// A weight matrix [rows = out_features, cols = in_features] in a low-precision format, with its
/// scales. Immutable once built; copyable.
class QuantizedWeight {
 public:
  /// Quantises W by the format's rule (see the header comment).
  /// @throws ShapeError for an empty W or (q4_0) in_features not a multiple of 32; Error naming
  ///         the row and column of a non-finite weight, or a scale its type cannot hold.
  static QuantizedWeight quantize(ConstTensorView<float, 2> weight, WeightFormat format);

  /// From stored parts, as a file holds them: bf16 `bits` [rows·cols] (values empty, scales
  /// empty); int8 `values` [rows·cols] and `scales` [rows] (float bits); q4_0 nibbles
  /// [rows·cols/2] and fp16 scales [rows·cols/32]. Every size and every scale is checked.
  /// @throws ShapeError for a size that does not fit the shape; Error for an int8 value of −128,
  ///         or a scale that is not finite and positive (int8) or finite (q4_0).
  static QuantizedWeight from_bf16(index_t rows, index_t cols, std::vector<std::uint16_t> bits);
  static QuantizedWeight from_int8(index_t rows, index_t cols, std::vector<std::int8_t> values,
                                   std::vector<float> scales);
  static QuantizedWeight from_q4_0(index_t rows, index_t cols, std::vector<std::uint8_t> nibbles,
                                   std::vector<std::uint16_t> scales);
  /// From ggml blocks of `type`, as a GGUF tensor holds them (rows · ggml_row_bytes(type, cols)
  /// bytes): q8_0, q4_K, q5_K, q6_K and tq2_0 are kept as they are; q4_0 is moved into dissect's
  /// q4_0 layout (the same values: its scales and nibbles split apart), bf16 into dissect's bf16
  /// (the same bits, so it runs on the bf16 kernels). Every block scale is checked, and every
  /// tq2_0 code.
  /// @throws ConfigError for any other type (keeps_ggml_type says which); ShapeError for a size
  ///         that does not fit; Error naming the row and block of a non-finite scale or of a
  ///         tq2_0 code 3 (not a ternary value).
  static QuantizedWeight from_ggml(GgmlType type, index_t rows, index_t cols,
                                   std::span<const std::uint8_t> blocks);
  /// As above, taking the bytes: the formats kept as they are keep this very buffer.
  static QuantizedWeight from_ggml(GgmlType type, index_t rows, index_t cols,
                                   std::vector<std::uint8_t>&& blocks);
  /// Whether from_ggml takes `type`.
  static bool keeps_ggml_type(GgmlType type);
  /// The rows of `parts` stacked in order (all of one cols, all in ggml formats). Parts of one
  /// format merge into one run of rows.
  /// @throws ShapeError for no parts or differing cols; ConfigError for a part in one of
  ///         dissect's own layouts.
  static QuantizedWeight stack_rows(std::vector<QuantizedWeight> parts);

  /// The format; for rows stacked from several ggml formats, the first run's (describe() names
  /// them all).
  WeightFormat format() const { return format_; }
  /// "q4_K", or "q4_K rows 0-2047, q6_K rows 2048-2559" for stacked formats.
  std::string describe() const;
  /// The runs of rows in ggml formats (empty for dissect's own layouts).
  std::span<const GgmlRows> ggml_rows() const { return ggml_; }
  index_t rows() const { return rows_; }
  index_t cols() const { return cols_; }
  /// Bytes of the stored values and scales: what decoding streams from memory per token.
  index_t bytes() const;

  /// Ŵ, exactly: every stored value widened and scaled in float.
  Tensor<float, 2> dequantize() const;
  void dequantize_into(TensorView<float, 2> target) const;

  /// The stored parts (empty for the formats that do not use them).
  std::span<const std::uint16_t> bf16_bits() const { return bf16_; }
  std::span<const std::int8_t> int8_values() const { return int8_; }
  std::span<const float> int8_scales() const { return int8_scales_; }
  std::span<const std::uint8_t> q4_nibbles() const { return nibbles_; }
  std::span<const std::uint16_t> q4_scales() const { return q4_scales_; }

  /// y[i, :] = x[i, :]·Ŵᵀ (+ bias) for the m rows of x (row stride ldx ≥ cols) into y (row
  /// stride ldy ≥ rows), on the active kernel path (quant/kernel_path.hpp), split over `threads`.
  /// Shapes are the caller's to check: this is the layer's inner call.
  void matmul(const float* x, index_t ldx, index_t m, float* y, index_t ldy, const float* bias,
              int threads) const;

 private:
  QuantizedWeight(WeightFormat format, index_t rows, index_t cols)
      : format_(format), rows_(rows), cols_(cols) {}

  WeightFormat format_;
  index_t rows_, cols_;
  std::vector<std::uint16_t> bf16_;
  std::vector<std::int8_t> int8_;
  std::vector<float> int8_scales_;
  std::vector<std::int32_t> int8_row_sums_;  // Σ_k q[n, k], for the VNNI kernel's offset
  std::vector<std::uint8_t> nibbles_;
  std::vector<std::uint16_t> q4_scales_;
  std::vector<GgmlRows> ggml_;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline void require_finite_weight(float value, index_t row, index_t col, WeightFormat format) {
  if (!std::isfinite(value)) {
    throw Error(concat("quantize(", weight_format_names[static_cast<std::size_t>(format)],
                       "): weight[", row, ", ", col, "] is ", value,
                       "; a non-finite weight has no quantised value"));
  }
}

/// nearbyint for |v| well inside int range, ties to even, independent of the rounding mode.
inline float round_half_even(float v) {
  const float floor = std::floor(v);
  const float diff = v - floor;
  if (diff > 0.5f) return floor + 1;
  if (diff < 0.5f) return floor;
  return std::fmod(floor, 2.0f) == 0 ? floor : floor + 1;
}

}  // namespace detail

inline QuantizedWeight QuantizedWeight::quantize(ConstTensorView<float, 2> weight,
                                                 WeightFormat format) {
  const std::string_view name = weight_format_name(format);
  const index_t rows = weight.dim(0), cols = weight.dim(1);
  if (rows == 0 || cols == 0) {
    throw ShapeError(detail::concat("quantize(", name, "): the weight ",
                                    format_shape(weight.shape()), " is empty"));
  }
  if (format == WeightFormat::q4_0 && cols % q4_block != 0) {
    throw ShapeError(detail::concat("quantize(q4_0): in_features ", cols, " of weight ",
                                    format_shape(weight.shape()),
                                    " is not a multiple of the block size 32"));
  }
  QuantizedWeight result(format, rows, cols);
  if (is_ggml_format(format)) {
    const GgmlType type = ggml_type_of(format);
    const index_t block = ggml_type_info(type).block_elements;
    if (cols % block != 0) {
      throw ShapeError(detail::concat("quantize(", name, "): in_features ", cols, " of weight ",
                                      format_shape(weight.shape()),
                                      " is not a multiple of the block size ", block));
    }
    const index_t row_bytes = ggml_row_bytes(type, cols);
    GgmlRows run{format, 0, rows, std::vector<std::uint8_t>(std::size_t(rows * row_bytes))};
    std::vector<float> row(static_cast<std::size_t>(cols));
    for (index_t r = 0; r < rows; ++r) {
      for (index_t c = 0; c < cols; ++c) {
        row[std::size_t(c)] = weight(r, c);
        detail::require_finite_weight(row[std::size_t(c)], r, c, format);
      }
      try {
        quantize_ggml(
            type, row,
            std::as_writable_bytes(
                std::span(run.blocks).subspan(std::size_t(r * row_bytes), std::size_t(row_bytes))));
      } catch (const Error& error) {
        throw Error(detail::concat("quantize(", name, "): row ", r, ": ", error.what()));
      }
    }
    result.ggml_.push_back(std::move(run));
    return result;
  }
  const auto at = [&](index_t r, index_t c) { return weight(r, c); };
  const auto size = static_cast<std::size_t>(rows * cols);
  switch (format) {
    case WeightFormat::bf16:
      result.bf16_.resize(size);
      for (index_t r = 0; r < rows; ++r) {
        for (index_t c = 0; c < cols; ++c) {
          detail::require_finite_weight(at(r, c), r, c, format);
          const std::uint16_t bits = float_to_bf16(at(r, c));
          if (std::isinf(bf16_to_float(bits))) {
            throw Error(detail::concat("quantize(bf16): weight[", r, ", ", c, "] = ", at(r, c),
                                       " rounds to infinity in bf16"));
          }
          result.bf16_[static_cast<std::size_t>(r * cols + c)] = bits;
        }
      }
      break;
    case WeightFormat::int8:
      result.int8_.resize(size);
      result.int8_scales_.resize(static_cast<std::size_t>(rows));
      result.int8_row_sums_.resize(static_cast<std::size_t>(rows));
      for (index_t r = 0; r < rows; ++r) {
        float max_abs = 0;
        for (index_t c = 0; c < cols; ++c) {
          detail::require_finite_weight(at(r, c), r, c, format);
          max_abs = std::max(max_abs, std::abs(at(r, c)));
        }
        float scale = max_abs / 127.0f;
        if (scale == 0) scale = 1;  // a zero row (or one that underflows): q = 0 either way
        const float inverse = 1.0f / scale;
        std::int32_t sum = 0;
        for (index_t c = 0; c < cols; ++c) {
          // A subnormal scale has no finite inverse; dividing is then the same rounding.
          const float ratio = std::isfinite(inverse) ? at(r, c) * inverse : at(r, c) / scale;
          const float q = std::clamp(detail::round_half_even(ratio), -127.0f, 127.0f);
          result.int8_[static_cast<std::size_t>(r * cols + c)] = static_cast<std::int8_t>(q);
          sum += static_cast<std::int32_t>(q);
        }
        result.int8_scales_[static_cast<std::size_t>(r)] = scale;
        result.int8_row_sums_[static_cast<std::size_t>(r)] = sum;
      }
      break;
    case WeightFormat::q4_0: {
      const index_t blocks = cols / q4_block;
      result.nibbles_.assign(size / 2, 0);
      result.q4_scales_.resize(static_cast<std::size_t>(rows * blocks));
      for (index_t r = 0; r < rows; ++r) {
        for (index_t b = 0; b < blocks; ++b) {
          const index_t c0 = b * q4_block;
          float max_abs = 0, extreme = 0;
          for (index_t j = 0; j < q4_block; ++j) {
            const float v = at(r, c0 + j);
            detail::require_finite_weight(v, r, c0 + j, format);
            if (max_abs < std::abs(v)) {
              max_abs = std::abs(v);
              extreme = v;
            }
          }
          const float d = extreme / -8.0f;
          const std::uint16_t stored = float_to_fp16(d);
          if (std::isinf(fp16_to_float(stored))) {
            throw Error(detail::concat("quantize(q4_0): row ", r, ", block ", b, " (columns ", c0,
                                       "..", c0 + q4_block - 1, "): scale ", d,
                                       " is beyond fp16's range (|max weight| > 524,032)"));
          }
          const float inverse = d != 0 ? 1.0f / d : 0.0f;
          result.q4_scales_[static_cast<std::size_t>(r * blocks + b)] = stored;
          std::uint8_t* block =
              result.nibbles_.data() + static_cast<std::size_t>(r * cols / 2 + b * q4_block / 2);
          for (index_t j = 0; j < q4_block; ++j) {
            const float scaled = std::isfinite(inverse) ? at(r, c0 + j) * inverse
                                                        : at(r, c0 + j) / d;  // subnormal d
            // GGML truncates toward zero after adding 8.5: rounding half up of scaled + 8.
            const int q = std::min(15, static_cast<int>(scaled + 8.5f));
            const auto nibble = static_cast<std::uint8_t>(q);
            if (j < q4_block / 2) {
              block[j] |= nibble;
            } else {
              block[j - q4_block / 2] |= static_cast<std::uint8_t>(nibble << 4);
            }
          }
        }
      }
      break;
    }
    default:  // ggml's block formats returned above
      break;
  }
  return result;
}

inline QuantizedWeight QuantizedWeight::from_bf16(index_t rows, index_t cols,
                                                  std::vector<std::uint16_t> bits) {
  QuantizedWeight result(WeightFormat::bf16, rows, cols);
  if (rows <= 0 || cols <= 0 || static_cast<index_t>(bits.size()) != rows * cols) {
    throw ShapeError(detail::concat("QuantizedWeight::from_bf16: ", bits.size(), " values for a [",
                                    rows, ", ", cols, "] weight"));
  }
  result.bf16_ = std::move(bits);
  return result;
}

inline QuantizedWeight QuantizedWeight::from_int8(index_t rows, index_t cols,
                                                  std::vector<std::int8_t> values,
                                                  std::vector<float> scales) {
  QuantizedWeight result(WeightFormat::int8, rows, cols);
  if (rows <= 0 || cols <= 0 || static_cast<index_t>(values.size()) != rows * cols ||
      static_cast<index_t>(scales.size()) != rows) {
    throw ShapeError(detail::concat("QuantizedWeight::from_int8: ", values.size(), " values and ",
                                    scales.size(), " scales for a [", rows, ", ", cols,
                                    "] weight (needs ", rows, " scales)"));
  }
  result.int8_row_sums_.assign(static_cast<std::size_t>(rows), 0);
  for (index_t r = 0; r < rows; ++r) {
    const float scale = scales[static_cast<std::size_t>(r)];
    if (!(std::isfinite(scale) && scale > 0)) {
      throw Error(detail::concat("QuantizedWeight::from_int8: scale of row ", r, " is ", scale,
                                 "; scales must be finite and positive"));
    }
    for (index_t c = 0; c < cols; ++c) {
      const std::int8_t q = values[static_cast<std::size_t>(r * cols + c)];
      if (q == -128) {
        throw Error(detail::concat("QuantizedWeight::from_int8: value[", r, ", ", c,
                                   "] is -128; symmetric int8 stores -127..127"));
      }
      result.int8_row_sums_[static_cast<std::size_t>(r)] += q;
    }
  }
  result.int8_ = std::move(values);
  result.int8_scales_ = std::move(scales);
  return result;
}

inline QuantizedWeight QuantizedWeight::from_q4_0(index_t rows, index_t cols,
                                                  std::vector<std::uint8_t> nibbles,
                                                  std::vector<std::uint16_t> scales) {
  QuantizedWeight result(WeightFormat::q4_0, rows, cols);
  if (rows <= 0 || cols <= 0 || cols % q4_block != 0 ||
      static_cast<index_t>(nibbles.size()) != rows * cols / 2 ||
      static_cast<index_t>(scales.size()) != rows * (cols / q4_block)) {
    throw ShapeError(detail::concat(
        "QuantizedWeight::from_q4_0: ", nibbles.size(), " bytes and ", scales.size(),
        " scales for a [", rows, ", ", cols, "] weight (needs in_features a multiple of 32, ",
        rows * cols / 2, " bytes and ", rows * (cols / q4_block), " scales)"));
  }
  for (std::size_t i = 0; i < scales.size(); ++i) {
    if (!std::isfinite(fp16_to_float(scales[i]))) {
      throw Error(detail::concat("QuantizedWeight::from_q4_0: scale of row ",
                                 static_cast<index_t>(i) / (cols / q4_block), ", block ",
                                 static_cast<index_t>(i) % (cols / q4_block), " is not finite"));
    }
  }
  result.nibbles_ = std::move(nibbles);
  result.q4_scales_ = std::move(scales);
  return result;
}

inline bool QuantizedWeight::keeps_ggml_type(GgmlType type) {
  return type == GgmlType::q4_0 || type == GgmlType::bf16 || weight_format_of(type).has_value();
}

namespace detail {

/// Byte offsets of the fp16 scales in one block of a kept ggml type.
inline std::span<const int> ggml_scale_offsets(GgmlType type) {
  static constexpr int d_only[] = {0}, d_and_min[] = {0, 2}, q6[] = {208}, tq2[] = {64};
  switch (type) {
    case GgmlType::q4_K:
    case GgmlType::q5_K:
      return d_and_min;
    case GgmlType::q6_K:
      return q6;
    case GgmlType::tq2_0:
      return tq2;
    default:
      return d_only;  // q4_0, q8_0: d first
  }
}

}  // namespace detail

inline QuantizedWeight QuantizedWeight::from_ggml(GgmlType type, index_t rows, index_t cols,
                                                  std::span<const std::uint8_t> blocks) {
  return from_ggml(type, rows, cols, std::vector<std::uint8_t>(blocks.begin(), blocks.end()));
}

inline QuantizedWeight QuantizedWeight::from_ggml(GgmlType type, index_t rows, index_t cols,
                                                  std::vector<std::uint8_t>&& blocks) {
  if (!keeps_ggml_type(type)) {
    throw ConfigError(detail::concat("QuantizedWeight::from_ggml: ", ggml_type_name(type),
                                     " blocks are not kept (bf16, q4_0, q8_0, q4_K, q5_K, q6_K, "
                                     "tq2_0 are)"));
  }
  const GgmlTypeInfo info = ggml_type_info(type);
  if (rows <= 0 || cols <= 0 || cols % info.block_elements != 0 ||
      static_cast<index_t>(blocks.size()) != rows * ggml_row_bytes(type, cols)) {
    throw ShapeError(detail::concat("QuantizedWeight::from_ggml(", info.name, "): ", blocks.size(),
                                    " bytes for a [", rows, ", ", cols, "] weight (needs cols a ",
                                    "multiple of ", info.block_elements, " and ",
                                    rows > 0 && cols > 0 && cols % info.block_elements == 0
                                        ? detail::concat(rows * ggml_row_bytes(type, cols))
                                        : std::string("whole blocks of"),
                                    " bytes)"));
  }
  if (type == GgmlType::bf16) {  // no scales: the bits are dissect's bf16 layout already
    std::vector<std::uint16_t> bits(static_cast<std::size_t>(rows * cols));
    std::memcpy(bits.data(), blocks.data(), blocks.size());
    return from_bf16(rows, cols, std::move(bits));
  }
  const index_t blocks_per_row = cols / info.block_elements;
  for (index_t b = 0; b < rows * blocks_per_row; ++b) {
    for (const int offset : detail::ggml_scale_offsets(type)) {
      const std::uint8_t* p = blocks.data() + b * info.block_bytes + offset;
      if (!std::isfinite(fp16_to_float(static_cast<std::uint16_t>(p[0] | (p[1] << 8))))) {
        throw Error(detail::concat("QuantizedWeight::from_ggml(", info.name, "): row ",
                                   b / blocks_per_row, ", block ", b % blocks_per_row,
                                   " has a scale that is not finite"));
      }
    }
    if (type == GgmlType::tq2_0) {
      // Code 3 has both bits of a pair set: byte & (byte >> 1) & 0b01010101.
      const std::uint8_t* codes = blocks.data() + b * info.block_bytes;
      for (int i = 0; i < 64; ++i) {
        if ((codes[i] & (codes[i] >> 1) & 0x55) != 0) {
          throw Error(detail::concat("QuantizedWeight::from_ggml(tq2_0): row ", b / blocks_per_row,
                                     ", block ", b % blocks_per_row, " holds code 3 in byte ", i,
                                     " (0x", "0123456789abcdef"[codes[i] >> 4],
                                     "0123456789abcdef"[codes[i] & 15],
                                     "); a ternary weight's code is 0, 1 or 2"));
        }
      }
    }
  }
  if (type == GgmlType::q4_0) {
    std::vector<std::uint8_t> nibbles(std::size_t(rows * cols / 2));
    std::vector<std::uint16_t> scales(std::size_t(rows * blocks_per_row));
    for (index_t b = 0; b < rows * blocks_per_row; ++b) {
      const std::uint8_t* p = blocks.data() + b * info.block_bytes;
      scales[std::size_t(b)] = static_cast<std::uint16_t>(p[0] | (p[1] << 8));
      std::copy(p + 2, p + 18, nibbles.begin() + b * 16);
    }
    return from_q4_0(rows, cols, std::move(nibbles), std::move(scales));
  }
  const WeightFormat format = *weight_format_of(type);
  QuantizedWeight result(format, rows, cols);
  result.ggml_.push_back({format, 0, rows, std::move(blocks)});
  return result;
}

inline QuantizedWeight QuantizedWeight::stack_rows(std::vector<QuantizedWeight> parts) {
  if (parts.empty()) throw ShapeError("QuantizedWeight::stack_rows: no parts");
  const index_t cols = parts.front().cols();
  index_t rows = 0;
  for (const QuantizedWeight& part : parts) {
    if (part.cols() != cols) {
      throw ShapeError(detail::concat("QuantizedWeight::stack_rows: a part of ", part.cols(),
                                      " columns among parts of ", cols));
    }
    if (part.ggml_.empty()) {
      throw ConfigError(
          detail::concat("QuantizedWeight::stack_rows: ", weight_format_name(part.format()),
                         " is not one of ggml's block formats"));
    }
    rows += part.rows();
  }
  QuantizedWeight result(parts.front().format(), rows, cols);
  index_t first = 0;
  for (QuantizedWeight& part : parts) {
    for (GgmlRows& run : part.ggml_) {
      if (!result.ggml_.empty() && result.ggml_.back().format == run.format) {
        GgmlRows& last = result.ggml_.back();
        last.blocks.insert(last.blocks.end(), run.blocks.begin(), run.blocks.end());
        last.rows += run.rows;
      } else {
        result.ggml_.push_back(
            {run.format, first + run.first_row, run.rows, std::move(run.blocks)});
      }
    }
    first += part.rows();
  }
  return result;
}

inline std::string QuantizedWeight::describe() const {
  if (ggml_.size() <= 1) return std::string(weight_format_name(format_));
  std::string text;
  for (const GgmlRows& run : ggml_) {
    text += detail::concat(text.empty() ? "" : ", ", weight_format_name(run.format), " rows ",
                           run.first_row, "-", run.first_row + run.rows - 1);
  }
  return text;
}

inline index_t QuantizedWeight::bytes() const {
  std::size_t ggml_bytes = 0;
  for (const GgmlRows& run : ggml_) ggml_bytes += run.blocks.size();
  return static_cast<index_t>(bf16_.size() * sizeof(std::uint16_t) + int8_.size() +
                              int8_scales_.size() * sizeof(float) + nibbles_.size() +
                              q4_scales_.size() * sizeof(std::uint16_t) + ggml_bytes);
}

inline Tensor<float, 2> QuantizedWeight::dequantize() const {
  auto result = Tensor<float, 2>::uninitialized({rows_, cols_});
  dequantize_into(result.view());
  return result;
}

inline void QuantizedWeight::dequantize_into(TensorView<float, 2> target) const {
  if (target.dim(0) != rows_ || target.dim(1) != cols_) {
    throw ShapeError(detail::concat("QuantizedWeight::dequantize_into: target ",
                                    format_shape(target.shape()), " is not [", rows_, ", ", cols_,
                                    "]"));
  }
  if (!ggml_.empty()) {
    std::vector<float> row(static_cast<std::size_t>(cols_));
    for (const GgmlRows& run : ggml_) {
      const GgmlType type = ggml_type_of(run.format);
      const index_t row_bytes = ggml_row_bytes(type, cols_);
      for (index_t r = 0; r < run.rows; ++r) {
        dequantize_ggml(
            type,
            std::as_bytes(
                std::span(run.blocks).subspan(std::size_t(r * row_bytes), std::size_t(row_bytes))),
            row);
        for (index_t c = 0; c < cols_; ++c) target(run.first_row + r, c) = row[std::size_t(c)];
      }
    }
    return;
  }
  for (index_t r = 0; r < rows_; ++r) {
    for (index_t c = 0; c < cols_; ++c) {
      const auto i = static_cast<std::size_t>(r * cols_ + c);
      float value = 0;
      switch (format_) {
        case WeightFormat::bf16:
          value = bf16_to_float(bf16_[i]);
          break;
        case WeightFormat::int8:
          value = int8_scales_[static_cast<std::size_t>(r)] * static_cast<float>(int8_[i]);
          break;
        case WeightFormat::q4_0: {
          const std::uint8_t byte = nibbles_[static_cast<std::size_t>(
              r * cols_ / 2 + (c / q4_block) * q4_block / 2 + c % (q4_block / 2))];
          const int q = c % q4_block < q4_block / 2 ? (byte & 0x0f) : (byte >> 4);
          const float d = fp16_to_float(
              q4_scales_[static_cast<std::size_t>(r * (cols_ / q4_block) + c / q4_block)]);
          value = static_cast<float>(q - 8) * d;
          break;
        }
        default:
          break;  // ggml's formats are decoded above
      }
      target(r, c) = value;
    }
  }
}

inline void QuantizedWeight::matmul(const float* x, index_t ldx, index_t m, float* y, index_t ldy,
                                    const float* bias, int threads) const {
  switch (format_) {
    case WeightFormat::bf16:
      quant::detail::quantized_matmul(quant::detail::Bf16WeightsView{bf16_.data(), rows_, cols_}, x,
                                      ldx, m, y, ldy, bias, threads);
      break;
    case WeightFormat::int8:
      quant::detail::quantized_matmul(
          quant::detail::Int8WeightsView{int8_.data(), int8_scales_.data(), int8_row_sums_.data(),
                                         rows_, cols_},
          x, ldx, m, y, ldy, bias, threads);
      break;
    case WeightFormat::q4_0:
      quant::detail::quantized_matmul(
          quant::detail::Q4WeightsView{nibbles_.data(), q4_scales_.data(), rows_, cols_}, x, ldx, m,
          y, ldy, bias, threads);
      break;
    default:
      for (const GgmlRows& run : ggml_) {
        const quant::detail::GgmlWeightsView view{run.format, run.blocks.data(), run.rows, cols_};
        quant::detail::ggml_matmul(quant::active_kernel_path(run.format, m), view, x, ldx, m,
                                   y + run.first_row, ldy, bias ? bias + run.first_row : nullptr,
                                   threads);
      }
      break;
  }
}

}  // namespace dissect
