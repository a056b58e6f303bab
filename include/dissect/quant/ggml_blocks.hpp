// dissect/quant/ggml_blocks.hpp — ggml's block formats to floats and back, bit for bit as
// llama.cpp does it: dequantisation equal to ggml's dequantize_row_* and quantisation equal to
// its quantize_row_*_ref, which is what llama_model_quantize runs when it has no importance
// matrix. Types: f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K, q8_K and tq2_0
// (see quant/ggml_type.hpp; each format's layout and rule is in
// quant/detail/ggml_block_codecs.hpp).
//
// A run of values is any whole number of blocks: one row, or a whole tensor whose rows are whole
// blocks (a block never spans two rows, so both decode alike). Quantising refuses non-finite
// values and a block whose scale its fp16 field cannot hold (|x| beyond ≈ 65504 × 127 for q8_0,
// beyond 65504 for f16): ggml would store Inf or NaN there, and a finite model must not turn
// into one that is not.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string_view>
#include <vector>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/numeric/half.hpp"
#include "dissect/quant/detail/ggml_block_codecs.hpp"
#include "dissect/quant/ggml_type.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Decodes `bytes`, a run of whole `type` blocks, into `values` (one float per element).
/// @throws ConfigError for a type dissect does not decode; ShapeError naming the type if
///         values.size() is not whole blocks or bytes.size() is not the size of that many.
void dequantize_ggml(GgmlType type, std::span<const std::byte> bytes, std::span<float> values);

/// Encodes `values` into `bytes` (ggml_row_bytes(type, values.size()) of them) by ggml's
/// reference rule.
/// @throws as dequantize_ggml; Error naming the position of a non-finite value, or the block
///         whose scale overflows its stored type.
void quantize_ggml(GgmlType type, std::span<const float> values, std::span<std::byte> bytes);

/// The same, into a new buffer.
std::vector<std::byte> quantize_ggml(GgmlType type, std::span<const float> values);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

struct GgmlBlockCodec {
  void (*encode)(const float*, std::uint8_t*);
  void (*decode)(const std::uint8_t*, float*);
};

/// The codec of a block type, or {nullptr, nullptr} for the element types and the ones dissect
/// does not decode.
inline GgmlBlockCodec ggml_block_codec(GgmlType type) {
  namespace g = ggml;
  switch (type) {
    case GgmlType::q4_0:
      return {g::quantize_q4_0, g::dequantize_q4_0};
    case GgmlType::q4_1:
      return {g::quantize_q4_1, g::dequantize_q4_1};
    case GgmlType::q5_0:
      return {g::quantize_q5_0, g::dequantize_q5_0};
    case GgmlType::q5_1:
      return {g::quantize_q5_1, g::dequantize_q5_1};
    case GgmlType::q8_0:
      return {g::quantize_q8_0, g::dequantize_q8_0};
    case GgmlType::q4_K:
      return {g::quantize_q4_K, g::dequantize_q4_K};
    case GgmlType::q5_K:
      return {g::quantize_q5_K, g::dequantize_q5_K};
    case GgmlType::q6_K:
      return {g::quantize_q6_K, g::dequantize_q6_K};
    case GgmlType::q8_K:
      return {g::quantize_q8_K, g::dequantize_q8_K};
    case GgmlType::tq2_0:
      return {g::quantize_tq2_0, g::dequantize_tq2_0};
    default:
      return {nullptr, nullptr};
  }
}

/// The type's row, after checking that dissect decodes it and that the sizes agree.
inline GgmlTypeInfo check_ggml_run(std::string_view op, GgmlType type, std::size_t values,
                                   std::size_t bytes) {
  const GgmlTypeInfo info = ggml_type_info(type);
  if (!info.decoded_by_dissect) {
    throw ConfigError(concat(op, ": dissect does not decode ggml type ", info.name));
  }
  const index_t expected = ggml_row_bytes(type, static_cast<index_t>(values), op);
  if (static_cast<index_t>(bytes) != expected) {
    throw ShapeError(concat(op, "(", info.name, "): ", values, " values take ", expected,
                            " bytes, not ", bytes));
  }
  return info;
}

}  // namespace detail

inline void dequantize_ggml(GgmlType type, std::span<const std::byte> bytes,
                            std::span<float> values) {
  const GgmlTypeInfo info =
      detail::check_ggml_run("dequantize_ggml", type, values.size(), bytes.size());
  const auto* in = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const std::size_t n = values.size();
  if (n == 0) return;  // an empty tensor's spans may hold null pointers, which memcpy refuses
  switch (type) {
    case GgmlType::f32:
      std::memcpy(values.data(), in, n * sizeof(float));
      return;
    case GgmlType::f16:
      for (std::size_t i = 0; i < n; ++i)
        values[i] = fp16_to_float(detail::ggml::load_u16(in + 2 * i));
      return;
    case GgmlType::bf16:
      for (std::size_t i = 0; i < n; ++i)
        values[i] = bf16_to_float(detail::ggml::load_u16(in + 2 * i));
      return;
    default:
      break;
  }
  const detail::GgmlBlockCodec codec = detail::ggml_block_codec(type);
  const auto block_elements = static_cast<std::size_t>(info.block_elements);
  const auto block_bytes = static_cast<std::size_t>(info.block_bytes);
  for (std::size_t b = 0; b * block_elements < n; ++b) {
    codec.decode(in + b * block_bytes, values.data() + b * block_elements);
  }
}

inline void quantize_ggml(GgmlType type, std::span<const float> values,
                          std::span<std::byte> bytes) {
  const GgmlTypeInfo info =
      detail::check_ggml_run("quantize_ggml", type, values.size(), bytes.size());
  const std::size_t n = values.size();
  for (std::size_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) {
      throw Error(concat("quantize_ggml(", info.name, "): value ", i, " is ", values[i],
                         "; a non-finite value has no ", info.name, " code"));
    }
  }
  auto* out = reinterpret_cast<std::uint8_t*>(bytes.data());
  if (n == 0) return;
  const auto overflow = [&](std::size_t first, std::size_t count) {
    float largest = 0;
    for (std::size_t i = first; i < first + count; ++i)
      largest = std::fmax(largest, std::fabs(values[i]));
    return Error(concat("quantize_ggml(", info.name, "): the block of values ", first, "..",
                        first + count - 1, " (largest magnitude ", largest,
                        ") needs a scale beyond what ", info.name, " stores"));
  };
  switch (type) {
    case GgmlType::f32:
      std::memcpy(out, values.data(), n * sizeof(float));
      return;
    case GgmlType::f16:
    case GgmlType::bf16:
      for (std::size_t i = 0; i < n; ++i) {
        const std::uint16_t bits =
            type == GgmlType::f16 ? float_to_fp16(values[i]) : float_to_bf16(values[i]);
        const float back = type == GgmlType::f16 ? fp16_to_float(bits) : bf16_to_float(bits);
        if (!std::isfinite(back)) throw overflow(i, 1);
        detail::ggml::store_u16(out + 2 * i, bits);
      }
      return;
    default:
      break;
  }
  const detail::GgmlBlockCodec codec = detail::ggml_block_codec(type);
  const auto block_elements = static_cast<std::size_t>(info.block_elements);
  const auto block_bytes = static_cast<std::size_t>(info.block_bytes);
  std::vector<float> decoded(block_elements);
  for (std::size_t first = 0, b = 0; first < n; first += block_elements, ++b) {
    std::uint8_t* block = out + b * block_bytes;
    codec.encode(values.data() + first, block);
    codec.decode(block, decoded.data());
    for (float v : decoded) {
      if (!std::isfinite(v)) throw overflow(first, block_elements);
    }
  }
}

inline std::vector<std::byte> quantize_ggml(GgmlType type, std::span<const float> values) {
  std::vector<std::byte> bytes(static_cast<std::size_t>(
      ggml_row_bytes(type, static_cast<index_t>(values.size()), "quantize_ggml")));
  quantize_ggml(type, values, bytes);
  return bytes;
}

}  // namespace dissect
