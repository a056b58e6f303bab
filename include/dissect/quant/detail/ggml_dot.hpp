// dissect/quant/detail/ggml_dot.hpp — PRIVATE: include dissect/quant/weight_format.hpp.
//
// y = x·Ŵᵀ (+ b) with W held in ggml's own blocks (q8_0, q4_K, q5_K, q6_K, tq2_0), read in place
// as a GGUF file stores them. Three paths:
//
//   scalar  the oracle: Σ_k x_k·ŵ_k in double, ŵ decoded by ggml's dequantize_row_* rule
//           (quant/detail/ggml_block_codecs.hpp), rounded once. Slow on purpose.
//   avx2    llama.cpp's arithmetic: each row of x is quantised to ggml's activation blocks
//           (q8_K, 256 values and one fp32 scale, for the K-quants; q8_0, 32 values and an fp16
//           scale, for q8_0), and each block pair is an exact integer dot product:
//             q4_K, q5_K  Σ_j sc_j·Σ q·x̃  and  Σ_j m_j·Σ x̃, scaled by d·dx and dmin·dx
//             q6_K        Σ_g sc_g·Σ q·x̃ − 32·Σ_g sc_g·Σ x̃ (q ∈ [0, 63] stored with a +32 bias)
//             q8_0        Σ q·x̃ per block, scaled by d·dx
//             tq2_0       Σ q·x̃ − Σ x̃ (q ∈ {0, 1, 2} stored with a +1 bias, Σ x̃ from q8_K's
//                         sums of 16), scaled by d·dx
//           So dissect and llama.cpp sum the same integers; only the order of the few float
//           additions per block differs. For tq2_0 not even that: the eight int32 lanes, their
//           per-block scaling into eight float lanes and the final horizontal sum are those of
//           llama.cpp's AVX2 ggml_vec_dot_tq2_0_q8_K, except that the multiply and add are one
//           fused step (explicitly, so the avx512_vnni path can reproduce it bit for bit).
//           q8_0 and the K-quants run in register tiles of 4 activation rows × 1 weight row
//           from 2 rows on (quant/detail/ggml_gemm_avx2.hpp; one row: the same arithmetic as a
//           1 × 1 tile, dot_row), one 8-float accumulator per output across blocks and one
//           horizontal sum per output; the activations are rounded once per call, in vectors,
//           to the scalar rule's bytes.
//   avx512_vnni  the same integer sums, each weight block decoded once for ggml_tile_rows
//           activation rows (quant/detail/ggml_dot_avx512.hpp): the prefill path.
//
// Error of avx2 against the exact Σ_k x_k·ŵ_k + b: the activation rounding,
// Σ_k |ŵ_k|·|x_k − x̂_k| with |x_k − x̂_k| ≤ dx/2 (half a step of its block's scale, plus a few
// fp32 roundings of the scale), plus the float sums: γ_(K/B + 8)·Σ_k |ŵ_k·x̂_k| + |b|, B the
// activation block. ŵ itself is ggml's float rounding of d·sc·q − dmin·m; the integer form uses
// the exact value, within 2⁻²⁴·|ŵ| of it.
//
// A CPU without AVX2 (or a pinned scalar path) runs the oracle; a pinned avx512 or avx512_bf16
// path runs avx2, which every AVX-512 CPU has (quant/kernel_path.hpp).
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/quant/detail/ggml_dot.hpp is private to dissect: include dissect/quant/weight_format.hpp instead"
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/core/thread_policy.hpp"
#include "dissect/kernels/compile_once.hpp"
#include "dissect/quant/detail/ggml_block_codecs.hpp"
#include "dissect/quant/detail/quant_tiles.hpp"
#include "dissect/quant/format.hpp"
#include "dissect/quant/ggml_blocks.hpp"
#include "dissect/quant/ggml_type.hpp"
#include "dissect/quant/kernel_path.hpp"

namespace dissect::quant::detail {

// ---- declarations -------------------------------------------------------------------------------

/// W [rows, cols] in a ggml format: row n's ggml_row_bytes(type, cols) bytes at
/// blocks + n·row_bytes, whole blocks (cols a multiple of 32 for q8_0, 256 for the K-quants).
struct GgmlWeightsView {
  WeightFormat format = WeightFormat::q8_0;
  const std::uint8_t* blocks = nullptr;
  index_t rows = 0, cols = 0;
};

/// The activation format llama.cpp pairs with `format`'s weights: q8_K for the K-quants and
/// tq2_0, q8_0 for q8_0.
GgmlType ggml_activation_type(WeightFormat format);

/// Row i of x ([m, K], stride ldx) quantised to ggml_activation_type(format) blocks at
/// out + i·ggml_row_bytes(that type, K), by ggml's reference rule.
void quantize_ggml_activations(WeightFormat format, const float* x, index_t ldx, index_t m,
                               index_t K, std::uint8_t* out);

/// The same bytes by ggml's scalar reference functions (the oracle of the vector rounding).
void quantize_ggml_activations_scalar(WeightFormat format, const float* x, index_t ldx, index_t m,
                                      index_t K, std::uint8_t* out);

/// As quantized_matmul in quant_kernels.hpp, for ggml blocks; `path` must be scalar, avx2 or
/// avx512_vnni.
/// @throws as there: ConfigError for a path that has no kernel for the format; ShapeError for
///         K not a whole number of blocks.
void ggml_matmul(KernelPath path, const GgmlWeightsView& w, const float* x, index_t ldx, index_t m,
                 float* y, index_t ldy, const float* bias, int threads);

// ---- implementation -----------------------------------------------------------------------------

inline GgmlType ggml_activation_type(WeightFormat format) {
  return format == WeightFormat::q8_0 ? GgmlType::q8_0 : GgmlType::q8_K;
}

/// quantize_ggml_activations by ggml's scalar reference functions, on any CPU.
inline void quantize_ggml_activations_scalar(WeightFormat format, const float* x, index_t ldx,
                                             index_t m, index_t K, std::uint8_t* out) {
  const GgmlTypeInfo activation = ggml_type_info(ggml_activation_type(format));
  const auto encode = format == WeightFormat::q8_0 ? dissect::detail::ggml::quantize_q8_0
                                                   : dissect::detail::ggml::quantize_q8_K;
  const index_t blocks = K / activation.block_elements;
  for (index_t i = 0; i < m; ++i) {
    for (index_t b = 0; b < blocks; ++b) {
      encode(x + i * ldx + b * activation.block_elements,
             out + (i * blocks + b) * activation.block_bytes);
    }
  }
}

/// The oracle: every row decoded by ggml's rule, each element a double sum rounded once.
inline void ggml_scalar_matmul(const GgmlWeightsView& w, const float* x, index_t ldx, index_t m,
                               float* y, index_t ldy, const float* bias) {
  const GgmlType type = ggml_type_of(w.format);
  const index_t row_bytes = ggml_row_bytes(type, w.cols);
  std::vector<float> row(static_cast<std::size_t>(w.cols));
  for (index_t n = 0; n < w.rows; ++n) {
    dequantize_ggml(
        type, std::as_bytes(std::span(w.blocks + n * row_bytes, std::size_t(row_bytes))), row);
    for (index_t i = 0; i < m; ++i) {
      double sum = 0.0;
      for (index_t k = 0; k < w.cols; ++k) sum += double(x[i * ldx + k]) * row[std::size_t(k)];
      if (bias) sum += bias[n];
      y[i * ldy + n] = static_cast<float>(sum);
    }
  }
}

#if DISSECT_X86

DISSECT_TARGET_AVX2 inline float hsum_f32(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

/// An fp16 field as a float, in one F16C instruction (the same value as numeric/half.hpp's).
DISSECT_TARGET_AVX2 inline float f16_at(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return _cvtsh_ss(bits);
}

DISSECT_TARGET_AVX2 inline __m256i load256(const std::uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

/// Σ over 32 bytes of u·x (u unsigned ≤ 63, x signed ≥ −127), in 8 int32 lanes, with the first
/// 16 products scaled by s0 and the last 16 by s1 (both int16). Exact: a pair of products is at
/// most 2·63·127 < 2¹⁵, and a lane at most 2¹⁵·2·128 < 2²⁴.
DISSECT_TARGET_AVX2 inline __m256i scaled_dot32(__m256i u, __m256i x, __m256i scales) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), scales);
}

/// q4_K and q5_K's eight 6-bit scales and mins, unpacked from their 12 bytes into sc[0..7] and
/// mins[0..7] (the layout rule of ggml_block_codecs' unpack_scale_min, four bytes at a time).
inline void unpack_scales_and_mins(const std::uint8_t* packed, std::uint8_t* sc,
                                   std::uint8_t* mins) {
  std::uint32_t u[3];
  std::memcpy(u, packed, 12);
  constexpr std::uint32_t low6 = 0x3f3f3f3f, low4 = 0x0f0f0f0f, low2 = 0x03030303;
  const std::uint32_t scales[2] = {u[0] & low6, (u[2] & low4) | (((u[0] >> 6) & low2) << 4)};
  const std::uint32_t minimums[2] = {u[1] & low6,
                                     ((u[2] >> 4) & low4) | (((u[1] >> 6) & low2) << 4)};
  std::memcpy(sc, scales, 8);
  std::memcpy(mins, minimums, 8);
}

// q8_K: d:f32 | 256 × i8 | bsums: 16 × i16.
inline float q8_K_scale(const std::uint8_t* a) {
  float d;
  std::memcpy(&d, a, 4);
  return d;
}

}  // namespace dissect::quant::detail

// The vector activation rounding and the register tiles build on the helpers above.
#include "dissect/quant/detail/ggml_gemm_avx2.hpp"

namespace dissect::quant::detail {

/// A row of tq2_0 blocks against a row of q8_K activations, llama.cpp's integer and float steps:
/// per block, the codes' four 2-bit planes times x̃ by vpmaddubsw into int16 lanes (exact: a lane
/// gathers 16 products of a code ≤ 3 and |x̃| ≤ 127, |·| ≤ 8128 with a sum of 16 taken off), the
/// q8_K sums of 16 subtracted for the +1 bias, vpmaddwd into 8 int32 lanes, each lane scaled by
/// d·dx into its own float lane; the 8 float lanes summed at the end. Int32 lane k holds the
/// products of bytes 4k … 4k+3 of both 32-byte halves of the codes, less sums 2k and 2k+1: the
/// avx512_vnni kernel rebuilds exactly these lanes.
DISSECT_TARGET_AVX2 inline float dot_tq2_0_row(const std::uint8_t* w, const std::uint8_t* a,
                                               index_t blocks) {
  const __m256i three = _mm256_set1_epi8(3);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc = _mm256_setzero_ps();
  for (index_t b = 0; b < blocks; ++b, w += 66, a += 292) {
    const std::uint8_t* xq = a + 4;
    __m256i sum01 = _mm256_setzero_si256(), sum23 = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      // Byte m of half h: values 128h + 32l + m in bits 2l, 2l + 1.
      const __m256i codes = load256(w + 32 * h);
      const __m256i q0 = _mm256_and_si256(codes, three);
      const __m256i q1 = _mm256_and_si256(_mm256_srli_epi16(codes, 2), three);
      const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(codes, 4), three);
      const __m256i q3 = _mm256_and_si256(_mm256_srli_epi16(codes, 6), three);
      const std::uint8_t* x = xq + 128 * h;
      sum01 = _mm256_add_epi16(sum01, _mm256_add_epi16(_mm256_maddubs_epi16(q0, load256(x)),
                                                       _mm256_maddubs_epi16(q1, load256(x + 32))));
      sum23 = _mm256_add_epi16(sum23, _mm256_add_epi16(_mm256_maddubs_epi16(q2, load256(x + 64)),
                                                       _mm256_maddubs_epi16(q3, load256(x + 96))));
    }
    const __m256i biased = _mm256_sub_epi16(_mm256_add_epi16(sum01, sum23), load256(a + 4 + 256));
    const __m256i lanes = _mm256_madd_epi16(biased, ones);
    const float scale = f16_at(w + 64) * q8_K_scale(a);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes), _mm256_set1_ps(scale), acc);
  }
  return hsum_f32(acc);
}

/// A row of W against a row of activations: tq2_0's row, or a 1 × 1 tile (the bits of every
/// other tile shape: ggml_gemm_avx2.hpp).
DISSECT_TARGET_AVX2 inline float dot_row(WeightFormat format, const std::uint8_t* w,
                                         const std::uint8_t* a, index_t K) {
  if (format == WeightFormat::tq2_0) return dot_tq2_0_row(w, a, K / 256);
  float sum = 0;
  const index_t blocks = K / ggml_type_info(ggml_type_of(format)).block_elements;
  const GgmlTile t{.w = w, .a = a, .blocks = blocks, .y = &sum, .ldy = 1};
  switch (format) {
    case WeightFormat::q8_0:
      Q8_0Tile::run<1, 1>(t);
      break;
    case WeightFormat::q4_K:
      AffineKTile<false>::run<1, 1>(t);
      break;
    case WeightFormat::q5_K:
      AffineKTile<true>::run<1, 1>(t);
      break;
    default:
      Q6KTile::run<1, 1>(t);
      break;
  }
  return sum;
}

/// Weight rows per task: 4 rows of one weight (≤ 5 KB at K = 5632 in q4_K) stay in L1 while
/// every activation row passes them, so each activation block is read from L2 once per 4.
inline constexpr index_t ggml_rows_per_task = 4;

/// body(n0, n1) for each run of ggml_rows_per_task weight rows [n0, n1), the runs split over at
/// most `threads` threads (fewer for a small W) by OpenMP's static schedule, so each thread
/// streams its own part of W. The loop stays outside the target attributes (as drive's does):
/// each worker calls the SIMD code.
template <class Body>
void for_each_weight_task(const GgmlWeightsView& w, int threads, const Body& body) {
  threads =
      thread_policy::threads_for(w.rows * w.cols, thread_policy::min_quantized_weights, threads);
  const index_t tasks = (w.rows + ggml_rows_per_task - 1) / ggml_rows_per_task;
#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
#else
  (void)threads;
#endif
  for (index_t t = 0; t < tasks; ++t) {
    const index_t n0 = t * ggml_rows_per_task;
    body(n0, std::min(w.rows, n0 + ggml_rows_per_task));
  }
}

/// Activation rows × weight rows of the avx2 tiles (ggml_gemm_avx2.hpp), for 16 ymm registers:
/// 4 × 1 keeps the four int32 sums, the decoded weights and their scales in registers through a
/// block (no stack access between a block's first vpmaddubsw and its last; the four float
/// accumulators are read and written once per block). Measured on Zen 3 (q4_K, q6_K at
/// 2048 → 5632, m = 128, 1 thread, GOP/s): 1 × 1 55 / 47, 2 × 2 57 / 73, 4 × 2 77 / 82,
/// 2 × 4 55 / 62, 4 × 1 108 / 100, 8 × 1 110 / 110 (more rows spill). The tile's columns divide
/// ggml_rows_per_task, so every tile lies inside one task.
template <class Tile>
inline constexpr int ggml_avx2_tile_rows = 4;
template <class Tile>
inline constexpr int ggml_avx2_tile_cols = 1;

/// From this many activation rows the avx2 path runs its tiles; below, one weight row against
/// one activation row (dot_row's 1 × 1 tile). Both give the same bits.
inline constexpr index_t ggml_avx2_tile_min_rows = 2;

/// Whether the avx2 path runs `format` on its tiles for m activation rows.
constexpr bool ggml_avx2_runs_tiles(WeightFormat format, index_t m) {
  return format != WeightFormat::tq2_0 && m >= ggml_avx2_tile_min_rows;
}

/// y = x̂·Ŵᵀ (+ b) from the rounded activations xq (row i at xq + i·activation_bytes), in
/// R × C tiles (edge tiles smaller), split over threads by weight-row tasks.
template <class Tile, int R = ggml_avx2_tile_rows<Tile>, int C = ggml_avx2_tile_cols<Tile>>
void ggml_avx2_tiles(const GgmlWeightsView& w, const std::uint8_t* xq, index_t activation_bytes,
                     index_t m, float* y, index_t ldy, const float* bias, int threads) {
  static_assert(ggml_rows_per_task % C == 0);
  const index_t row_bytes = ggml_row_bytes(ggml_type_of(w.format), w.cols);
  const index_t blocks = w.cols / Tile::block;
  for_each_weight_task(w, threads, [&](index_t n0, index_t n1) {
    for (index_t i = 0; i < m; i += R) {
      const int r = static_cast<int>(std::min<index_t>(R, m - i));
      for (index_t n = n0; n < n1; n += C) {
        const int c = static_cast<int>(std::min<index_t>(C, n1 - n));
        const GgmlTile t{.w = w.blocks + n * row_bytes,
                         .w_stride = row_bytes,
                         .a = xq + i * activation_bytes,
                         .a_stride = activation_bytes,
                         .blocks = blocks,
                         .y = y + i * ldy + n,
                         .ldy = ldy,
                         .bias = bias ? bias + n : nullptr};
        run_tile<Tile, R, C>(r, c, t);
      }
    }
  });
}

/// The tiles for m ≥ ggml_avx2_tile_min_rows rows of already rounded activations.
inline void ggml_avx2_gemm(const GgmlWeightsView& w, const std::uint8_t* xq,
                           index_t activation_bytes, index_t m, float* y, index_t ldy,
                           const float* bias, int threads) {
  switch (w.format) {
    case WeightFormat::q8_0:
      return ggml_avx2_tiles<Q8_0Tile>(w, xq, activation_bytes, m, y, ldy, bias, threads);
    case WeightFormat::q4_K:
      return ggml_avx2_tiles<AffineKTile<false>>(w, xq, activation_bytes, m, y, ldy, bias, threads);
    case WeightFormat::q5_K:
      return ggml_avx2_tiles<AffineKTile<true>>(w, xq, activation_bytes, m, y, ldy, bias, threads);
    default:
      return ggml_avx2_tiles<Q6KTile>(w, xq, activation_bytes, m, y, ldy, bias, threads);
  }
}

inline void ggml_avx2_matmul(const GgmlWeightsView& w, const float* x, index_t ldx, index_t m,
                             float* y, index_t ldy, const float* bias, int threads) {
  const GgmlType activation = ggml_activation_type(w.format);
  const index_t K = w.cols;
  const index_t activation_bytes = ggml_row_bytes(activation, K);
  const index_t row_bytes = ggml_row_bytes(ggml_type_of(w.format), K);
  auto* xq = reinterpret_cast<std::uint8_t*>(scratch(std::size_t(m * activation_bytes)));
  quantize_ggml_activations(w.format, x, ldx, m, K, xq);
  if (ggml_avx2_runs_tiles(w.format, m)) {
    ggml_avx2_gemm(w, xq, activation_bytes, m, y, ldy, bias, threads);
    return;
  }
  for_each_weight_task(w, threads, [&](index_t n0, index_t n1) {
    for (index_t i = 0; i < m; ++i) {
      for (index_t n = n0; n < n1; ++n) {
        const float sum = dot_row(w.format, w.blocks + n * row_bytes, xq + i * activation_bytes, K);
        y[i * ldy + n] = bias ? sum + bias[n] : sum;
      }
    }
  });
}

#endif  // DISSECT_X86

inline void quantize_ggml_activations(WeightFormat format, const float* x, index_t ldx, index_t m,
                                      index_t K, std::uint8_t* out) {
#if DISSECT_X86
  // The vector rounding (ggml_gemm_avx2.hpp) writes the same bytes.
  if (cpu_supports(KernelPath::avx2)) {
    quantize_ggml_activations_avx2(format == WeightFormat::q8_0, x, ldx, m, K, out);
    return;
  }
#endif
  quantize_ggml_activations_scalar(format, x, ldx, m, K, out);
}

}  // namespace dissect::quant::detail

// The AVX-512 kernels build on the helpers above (unpack_scales_and_mins, the activation codecs).
#include "dissect/quant/detail/ggml_dot_avx512.hpp"

namespace dissect::quant::detail {

#if DISSECT_KERNEL_BODIES
DISSECT_KERNEL_ENTRY void ggml_matmul(KernelPath path, const GgmlWeightsView& w, const float* x,
                                      index_t ldx, index_t m, float* y, index_t ldy,
                                      const float* bias, int threads) {
  const std::string_view name = weight_format_name(w.format);
  const std::string op =
      dissect::detail::concat("quantized_matmul(", name, ", ", kernel_path_name(path), ")");
  const std::string shapes =
      dissect::detail::concat(" (x: [m, K] = [", m, ", ", w.cols, "], ldx ", ldx, "; W: [N, K] = [",
                              w.rows, ", ", w.cols, "]; y ldy ", ldy, ")");
  if (!is_ggml_format(w.format)) {
    throw ConfigError(dissect::detail::concat(op, ": not one of ggml's block formats"));
  }
  if (!path_applies(path, w.format)) {
    throw ConfigError(dissect::detail::concat(op, ": the ", kernel_path_name(path),
                                              " path has no kernel for ", name, " weights"));
  }
  if (!cpu_supports(path)) {
    throw Error(
        dissect::detail::concat(op, ": this CPU cannot run the ", kernel_path_name(path), " path"));
  }
  if (threads < 1) {
    throw ConfigError(dissect::detail::concat(op, ": threads = ", threads, " (must be >= 1)"));
  }
  const index_t block = ggml_type_info(ggml_type_of(w.format)).block_elements;
  if (w.cols < 1 || w.rows < 0 || m < 0) {
    throw ShapeError(dissect::detail::concat(op, ": negative extent or K < 1", shapes));
  }
  if (w.cols % block != 0) {
    throw ShapeError(dissect::detail::concat(op, ": K = ", w.cols, " is not a multiple of ", name,
                                             "'s block of ", block, shapes));
  }
  if (m == 0 || w.rows == 0) return;
  if (ldx < w.cols) throw ShapeError(dissect::detail::concat(op, ": ldx < K", shapes));
  if (ldy < w.rows) throw ShapeError(dissect::detail::concat(op, ": ldy < N", shapes));
  if (!w.blocks || !x || !y) {
    throw Error(dissect::detail::concat(op, ": null weights, x or y", shapes));
  }
#if DISSECT_X86
  if (path == KernelPath::avx2) {
    ggml_avx2_matmul(w, x, ldx, m, y, ldy, bias, threads);
    return;
  }
  if (path == KernelPath::avx512_vnni) {
    ggml_avx512_matmul(w, x, ldx, m, y, ldy, bias, threads);
    return;
  }
#endif
  ggml_scalar_matmul(w, x, ldx, m, y, ldy, bias);
}
#endif

}  // namespace dissect::quant::detail
