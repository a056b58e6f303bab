// dissect/kernels/detail/gemm_portable.hpp — private: do not include directly (kernels/gemm.hpp
// does).
//
// The packed GEMM in plain C++, for CPUs without AVX2 (and as a third independent path in the
// tests): the same driver and layout, a tile of up to 4 rows × 2 panels held in arrays the
// compiler vectorises for the build's own target, and the epilogue through activation.hpp's
// scalar functions.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/kernels/detail/gemm_portable.hpp is private to dissect: include dissect/kernels/gemm.hpp instead"
#endif

#include "dissect/kernels/detail/gemm_driver.hpp"
#include "dissect/tensor/activation.hpp"

namespace dissect::kernels::detail {

namespace portable {

template <int MR, int NP>
void tile(index_t kc, const float* a, const float* b, index_t b_stride, const float* src,
          index_t lds, float* dst, index_t ldd, int rows, int cols) {
  constexpr int W = NP * static_cast<int>(packed_panel_width);
  float acc[MR][W];
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < W; ++j) acc[i][j] = src && i < rows && j < cols ? src[i * lds + j] : 0.0f;
  }
  for (index_t k = 0; k < kc; ++k) {
    for (int i = 0; i < MR; ++i) {
      const float x = a[k * MR + i];
      for (int p = 0; p < NP; ++p) {
        const float* w = b + p * b_stride + k * packed_panel_width;
        for (int j = 0; j < static_cast<int>(packed_panel_width); ++j) {
          acc[i][p * packed_panel_width + j] += x * w[j];
        }
      }
    }
  }
  for (int i = 0; i < rows && i < MR; ++i) {
    for (int j = 0; j < cols; ++j) dst[i * ldd + j] = acc[i][j];
  }
}

}  // namespace portable

/// The portable path as the driver sees it.
struct PortableGemm {
  static void pack_b(const StridedMatrix& b, index_t n, index_t p0, index_t count, index_t k0,
                     index_t kc, float* out) {
    detail::pack_b(b, n, p0, count, k0, kc, out);
  }
  static constexpr int plain_panels(index_t /*m*/) { return 2; }
  static constexpr int heights[] = {1, 2, 4};
  static constexpr int max_rows(int /*np*/) { return 4; }
  static constexpr int kernel_rows(int /*np*/, index_t rows) { return tile_height(heights, rows); }

  static void tile(int height, int np, index_t kc, const float* a, const float* b, index_t b_stride,
                   const float* src, index_t lds, float* dst, index_t ldd, int rows, int cols,
                   const float* /*next: no prefetch here*/) {
    switch (height * 4 + np) {
      case 1 * 4 + 1:
        return portable::tile<1, 1>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols);
      case 1 * 4 + 2:
        return portable::tile<1, 2>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols);
      case 2 * 4 + 1:
        return portable::tile<2, 1>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols);
      case 2 * 4 + 2:
        return portable::tile<2, 2>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols);
      case 4 * 4 + 1:
        return portable::tile<4, 1>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols);
      default:
        return portable::tile<4, 2>(kc, a, b, b_stride, src, lds, dst, ldd, rows, cols);
    }
  }

  static void finish(const float* tile, int rows, int n_out, const TileEpilogue& e, float* c,
                     index_t ldc) {
    for (int i = 0; i < rows; ++i) {
      const float* t = tile + i * tile_columns;
      for (int j = 0; j < n_out; ++j) {
        float v = t[j];
        if (e.bias) v += e.bias[j];
        if (e.activation) {
          v = dissect::detail::with_activation(*e.activation, "packed_matmul", [&](auto a) {
            return dissect::detail::activation_value<decltype(a)::value>(v);
          });
        }
        if (e.gated) v *= t[packed_panel_width + j] + (e.up_bias ? e.up_bias[j] : 0.0f);
        if (e.residual) v += e.residual[i * e.residual_stride + j];
        c[i * ldc + j] = v;
      }
    }
  }
};

}  // namespace dissect::kernels::detail
