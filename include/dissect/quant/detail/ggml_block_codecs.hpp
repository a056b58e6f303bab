// dissect/quant/detail/ggml_block_codecs.hpp — PRIVATE: include dissect/quant/ggml_blocks.hpp.
//
// One encoder and one decoder per ggml block type, on raw little-endian bytes. They reproduce
// ggml's reference functions (quantize_row_*_ref, dequantize_row_*) operation for operation:
// the same float operations in the same order, the same integer conversions, the same search
// over candidate scales. That is what makes the bytes equal to llama.cpp's: a quantiser that is
// merely as good would choose other scales on ties and near-ties. Three rules hold throughout:
//   - every product is rounded before it is added (no FMA contraction: DISSECT_EXACT_FLOAT);
//   - nearest_int is ggml's: add 1.5·2²³ and read the low mantissa bits, which rounds half to
//     even for |v| < 2²² and wraps, deterministically, beyond it;
//   - a sub-block whose rebuilt scale is 0 keeps the levels its search chose, as ggml's does.
//
// Block layouts (bytes, in order):
//   q4_0   d:f16 | 16 bytes: low nibbles values 0–15, high nibbles 16–31     ŵ = (q − 8)·d
//   q4_1   d:f16 m:f16 | 16 bytes as q4_0                                   ŵ = q·d + m
//   q5_0   d:f16 | qh:u32 (bit j = 5th bit of value j) | 16 bytes as q4_0    ŵ = (q − 16)·d
//   q5_1   d:f16 m:f16 | qh:u32 | 16 bytes                                  ŵ = q·d + m
//   q8_0   d:f16 | 32 × i8                                                  ŵ = q·d
//   q4_K   d:f16 dmin:f16 | 12 bytes: 8 × (6-bit scale, 6-bit min) | 128 bytes of nibbles
//          (per 64 values: low nibbles the first 32, high nibbles the next 32)
//                                                           ŵ = d·sc_j·q − dmin·m_j, j = i / 32
//   q5_K   as q4_K, then qh: 32 bytes (bit 2p / 2p+1 of byte l = 5th bit of value 64p + l /
//          64p + 32 + l), placed before the 128 nibble bytes                 ŵ as q4_K
//   q6_K   ql: 128 bytes | qh: 64 bytes | scales: 16 × i8 | d:f16
//          (per 128 values: ql low/high nibbles and 2-bit qh fields)        ŵ = d·sc_(i/16)·(q −
//          32)
//   q8_K   d:f32 | 256 × i8 | bsums: 16 × i16 (sums of 16 consecutive q)   ŵ = d·q
//   tq2_0  qs: 64 bytes of 2-bit codes | d:f16     ŵ = (q − 1)·d, q ∈ {0, 1, 2}
//          (per 128 values h: bits 2l, 2l+1 of byte 32h + m are value 128h + 32l + m)
//          A code of 3 (which the quantiser never writes) decodes as llama.cpp decodes it: +2·d.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/ggml_block_codecs.hpp is private to dissect: include dissect/quant/ggml_blocks.hpp instead"
#endif

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "dissect/numeric/half.hpp"

// Keeps a·b + c two roundings inside one function: GCC contracts into FMA in GNU mode
// (-std=gnu++20 with -mfma) unless told not to; clang contracts within an expression unless its
// pragma says otherwise (it must open the function body: DISSECT_EXACT_FLOAT_BODY).
#if defined(__clang__)
#define DISSECT_EXACT_FLOAT
#define DISSECT_EXACT_FLOAT_BODY _Pragma("clang fp contract(off)")
#elif defined(__GNUC__)
#define DISSECT_EXACT_FLOAT __attribute__((optimize("fp-contract=off")))
#define DISSECT_EXACT_FLOAT_BODY
#else
#define DISSECT_EXACT_FLOAT
#define DISSECT_EXACT_FLOAT_BODY
#endif

namespace dissect::detail::ggml {

inline constexpr int super_block = 256;  // QK_K: values per K-quant block
inline constexpr int small_block = 32;   // the legacy formats' block
inline constexpr float group_max_eps = 1e-15f;

// ---- little-endian fields -------------------------------------------------------------------

inline std::uint16_t load_u16(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | (p[1] << 8));
}
inline void store_u16(std::uint8_t* p, std::uint16_t v) {
  p[0] = static_cast<std::uint8_t>(v);
  p[1] = static_cast<std::uint8_t>(v >> 8);
}
inline std::uint32_t load_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | (static_cast<std::uint32_t>(p[1]) << 8) |
         (static_cast<std::uint32_t>(p[2]) << 16) | (static_cast<std::uint32_t>(p[3]) << 24);
}
inline void store_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline float load_f16(const std::uint8_t* p) {
  return fp16_to_float(load_u16(p));
}
inline void store_f16(std::uint8_t* p, float v) {
  store_u16(p, float_to_fp16(v));
}

/// ggml's nearest_int: round half to even through the float adder (exact for |v| < 2²²).
inline int nearest_int(float v) {
  const float shifted = v + 12582912.f;
  const auto bits = std::bit_cast<std::int32_t>(shifted);
  return (bits & 0x007fffff) - 0x00400000;
}

/// C's float → int8 conversion as x86 performs it for in-range values: truncation.
inline int truncate_to_int(float v) {
  return static_cast<int>(v);
}

// ---- legacy 32-value blocks -------------------------------------------------------------------

/// The value of largest magnitude (the first one on ties), as q4_0 and q5_0 take their scale.
inline float signed_absmax(const float* x, int n) {
  float amax = 0, max = 0;
  for (int j = 0; j < n; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

DISSECT_EXACT_FLOAT inline void quantize_q4_0(const float* x, std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = signed_absmax(x, small_block) / -8;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  store_f16(block, d);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, truncate_to_int(x[j] * id + 8.5f));
    const int hi = std::min(15, truncate_to_int(x[j + 16] * id + 8.5f));
    block[2 + j] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
}

DISSECT_EXACT_FLOAT inline void dequantize_q4_0(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = load_f16(block);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((block[2 + j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((block[2 + j] >> 4) - 8) * d;
  }
}

/// min and max of a block, as q4_1 and q5_1 take their range.
inline void block_range(const float* x, int n, float& min, float& max) {
  min = FLT_MAX;
  max = -FLT_MAX;
  for (int j = 0; j < n; ++j) {
    if (x[j] < min) min = x[j];
    if (x[j] > max) max = x[j];
  }
}

DISSECT_EXACT_FLOAT inline void quantize_q4_1(const float* x, std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  float min, max;
  block_range(x, small_block, min, max);
  const float d = (max - min) / 15;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  store_f16(block, d);
  store_f16(block + 2, min);
  for (int j = 0; j < 16; ++j) {
    const int lo = std::min(15, truncate_to_int((x[j] - min) * id + 0.5f));
    const int hi = std::min(15, truncate_to_int((x[j + 16] - min) * id + 0.5f));
    block[4 + j] = static_cast<std::uint8_t>(lo | (hi << 4));
  }
}

DISSECT_EXACT_FLOAT inline void dequantize_q4_1(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = load_f16(block), m = load_f16(block + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(block[4 + j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(block[4 + j] >> 4) * d + m;
  }
}

/// Packs 32 five-bit levels: low nibbles as q4_0, the fifth bits into a u32.
inline void pack_five_bit(const int* levels, std::uint8_t* high_bits, std::uint8_t* nibbles) {
  std::uint32_t qh = 0;
  for (int j = 0; j < 16; ++j) {
    const int lo = levels[j], hi = levels[j + 16];
    nibbles[j] = static_cast<std::uint8_t>((lo & 0x0f) | ((hi & 0x0f) << 4));
    qh |= static_cast<std::uint32_t>((lo & 0x10) >> 4) << j;
    qh |= static_cast<std::uint32_t>((hi & 0x10) >> 4) << (j + 16);
  }
  store_u32(high_bits, qh);
}

inline void unpack_five_bit(const std::uint8_t* high_bits, const std::uint8_t* nibbles,
                            int* levels) {
  const std::uint32_t qh = load_u32(high_bits);
  for (int j = 0; j < 16; ++j) {
    levels[j] = (nibbles[j] & 0x0f) | static_cast<int>(((qh >> j) << 4) & 0x10);
    levels[j + 16] = (nibbles[j] >> 4) | static_cast<int>((qh >> (j + 12)) & 0x10);
  }
}

DISSECT_EXACT_FLOAT inline void quantize_q5_0(const float* x, std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = signed_absmax(x, small_block) / -16;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  store_f16(block, d);
  int levels[small_block];
  for (int j = 0; j < small_block; ++j) {
    levels[j] = std::min(31, truncate_to_int(x[j] * id + 16.5f));
  }
  pack_five_bit(levels, block + 2, block + 6);
}

DISSECT_EXACT_FLOAT inline void dequantize_q5_0(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = load_f16(block);
  int levels[small_block];
  unpack_five_bit(block + 2, block + 6, levels);
  for (int j = 0; j < small_block; ++j) y[j] = static_cast<float>(levels[j] - 16) * d;
}

DISSECT_EXACT_FLOAT inline void quantize_q5_1(const float* x, std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  float min, max;
  block_range(x, small_block, min, max);
  const float d = (max - min) / 31;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  store_f16(block, d);
  store_f16(block + 2, min);
  int levels[small_block];
  // ggml converts to uint8 without a clamp; the level is at most 31.5 before truncation.
  for (int j = 0; j < small_block; ++j) {
    levels[j] = static_cast<std::uint8_t>(truncate_to_int((x[j] - min) * id + 0.5f));
  }
  pack_five_bit(levels, block + 4, block + 8);
}

DISSECT_EXACT_FLOAT inline void dequantize_q5_1(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = load_f16(block), m = load_f16(block + 2);
  int levels[small_block];
  unpack_five_bit(block + 4, block + 8, levels);
  for (int j = 0; j < small_block; ++j) y[j] = static_cast<float>(levels[j]) * d + m;
}

DISSECT_EXACT_FLOAT inline void quantize_q8_0(const float* x, std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  float amax = 0;
  for (int j = 0; j < small_block; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  store_f16(block, d);
  for (int j = 0; j < small_block; ++j) {
    block[2 + j] = static_cast<std::uint8_t>(static_cast<std::int8_t>(std::round(x[j] * id)));
  }
}

DISSECT_EXACT_FLOAT inline void dequantize_q8_0(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = load_f16(block);
  for (int j = 0; j < small_block; ++j) {
    y[j] = static_cast<float>(static_cast<std::int8_t>(block[2 + j])) * d;
  }
}

}  // namespace dissect::detail::ggml

// The K-quants (256-value super-blocks), on the helpers above.
#include "dissect/quant/detail/ggml_kquant_codecs.hpp"

namespace dissect::detail::ggml {

// ---- ternary: BitNet b1.58 ------------------------------------------------------------------

/// The code of one value of a tq2_0 block: lroundf(v) + 1 (half away from zero), as ggml stores
/// it (its `& 3` is a no-op: |v| ≤ 1 up to one rounding, so the code is 0, 1 or 2). A non-finite
/// v (a block whose max is so small that 1/d overflows, or 0·∞) gets code 1, what x86's
/// conversion of an out-of-range lroundf makes of ggml's (LONG_MIN + 1) & 3; that block's fp16
/// scale is 0, so every value decodes to 0 either way.
inline std::uint8_t ternary_code(float v) {
  if (!std::isfinite(v)) return 1;
  return static_cast<std::uint8_t>((std::lround(v) + 1) & 3);
}

/// ggml's quantize_row_tq2_0_ref: d = max|x| (no division: the levels are −d, 0, d), codes of
/// x·(1/d) rounded half away from zero.
DISSECT_EXACT_FLOAT inline void quantize_tq2_0(const float* x, std::uint8_t* block) {
  DISSECT_EXACT_FLOAT_BODY
  float amax = 0;
  for (int j = 0; j < super_block; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  for (int h = 0; h < 2; ++h) {
    for (int m = 0; m < 32; ++m) {
      unsigned byte = 0;
      for (int l = 0; l < 4; ++l)
        byte |= unsigned{ternary_code(x[128 * h + 32 * l + m] * id)} << (2 * l);
      block[32 * h + m] = static_cast<std::uint8_t>(byte);
    }
  }
  store_f16(block + 64, d);
}

DISSECT_EXACT_FLOAT inline void dequantize_tq2_0(const std::uint8_t* block, float* y) {
  DISSECT_EXACT_FLOAT_BODY
  const float d = load_f16(block + 64);
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 4; ++l) {
      for (int m = 0; m < 32; ++m) {
        const int q = (block[32 * h + m] >> (2 * l)) & 3;
        *y++ = static_cast<float>(q - 1) * d;
      }
    }
  }
}

}  // namespace dissect::detail::ggml
