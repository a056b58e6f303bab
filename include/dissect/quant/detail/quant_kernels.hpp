// TEMPORARY scalar stand-in, replaced by the dispatched kernels of branch quant-kernels.
#pragma once
#include <cstdint>
#include "dissect/io/half.hpp"
#include "dissect/shape.hpp"
namespace dissect::quant::detail {
struct Bf16WeightsView { const std::uint16_t* bits; index_t rows, cols; };
struct Int8WeightsView { const std::int8_t* values; const float* scales; const std::int32_t* row_sums; index_t rows, cols; };
struct Q4WeightsView { const std::uint8_t* nibbles; const std::uint16_t* scales; index_t rows, cols; };
inline float weight_at(const Bf16WeightsView& w, index_t n, index_t k) { return bf16_to_float(w.bits[n * w.cols + k]); }
inline float weight_at(const Int8WeightsView& w, index_t n, index_t k) { return w.scales[n] * float(w.values[n * w.cols + k]); }
inline float weight_at(const Q4WeightsView& w, index_t n, index_t k) {
  const std::uint8_t byte = w.nibbles[n * w.cols / 2 + (k / 32) * 16 + k % 16];
  const int q = k % 32 < 16 ? (byte & 15) : (byte >> 4);
  return float(q - 8) * fp16_to_float(w.scales[n * (w.cols / 32) + k / 32]);
}
template <class W>
void quantized_matmul(const W& w, const float* x, index_t ldx, index_t m, float* y, index_t ldy, const float* bias, int) {
  for (index_t i = 0; i < m; ++i)
    for (index_t n = 0; n < w.rows; ++n) {
      double acc = 0;
      for (index_t k = 0; k < w.cols; ++k) acc += double(x[i * ldx + k]) * double(weight_at(w, n, k));
      y[i * ldy + n] = float(acc) + (bias ? bias[n] : 0.0f);
    }
}
}  // namespace dissect::quant::detail
