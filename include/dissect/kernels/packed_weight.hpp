// dissect/kernels/packed_weight.hpp — a weight laid out once in the order the GEMM micro-kernels
// read it.
//
// An inference weight is multiplied thousands of times and never changes, so the copy into the
// micro-kernel's layout that a GEMM otherwise makes on every call (Eigen's packing) is made once
// here. The layout: W [N, K]'s output features in panels of 16 (one AVX-512 register, two AVX2
// registers); panel p holds features 16p … 16p + 15 as K rows of 16 contiguous floats, 64-byte
// aligned, the last panel zero-padded. A micro-kernel then streams each panel front to back and
// broadcasts one activation against 16 weights per instruction.
//
// A gated weight (SwiGLU's gate and up, both [F, K]) alternates their panels — gate panel p, then
// up panel p — so one tile holds both halves of the same 16 outputs and the epilogue writes
// act(gate)·up without the two products ever reaching memory.
#pragma once

#include <algorithm>
#include <cstring>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

/// Output features per panel of a PackedWeight.
inline constexpr index_t packed_panel_width = 16;

class PackedWeight {
 public:
  /// An empty 0 × 0 weight.
  PackedWeight() = default;

  /// W [rows = N, cols = K], row n at weight + n·ld (ld ≥ K).
  /// @throws ShapeError for a negative extent, ld < K, or a size that overflows int64;
  ///         Error for a null pointer with a non-empty shape.
  PackedWeight(const float* weight, index_t rows, index_t cols, index_t ld);

  /// SwiGLU's gate and up projections, both [F, K] (row stride ld_gate / ld_up), packed side by
  /// side for a gated Epilogue. @throws as the plain constructor.
  static PackedWeight gated(const float* gate, const float* up, index_t rows, index_t cols,
                            index_t ld_gate, index_t ld_up);

  /// N, the outputs packed_matmul writes per row (F for a gated weight).
  index_t out_features() const { return out_features_; }
  /// K.
  index_t in_features() const { return in_features_; }
  bool is_gated() const { return gated_; }
  bool empty() const { return out_features_ == 0 || in_features_ == 0; }
  /// Panels stored: ⌈N/16⌉, twice that when gated.
  index_t panels() const { return panels_; }
  /// Panel p: in_features() rows of 16 floats. For a gated weight, even panels are the gate's
  /// and odd ones the up projection's.
  const float* panel(index_t p) const { return storage_.data() + p * panel_stride(); }
  index_t panel_stride() const { return in_features_ * packed_panel_width; }
  /// Bytes held, padding included.
  index_t bytes() const { return storage_.size() * static_cast<index_t>(sizeof(float)); }

 private:
  static void check(const char* op, const void* data, index_t rows, index_t cols, index_t ld);
  /// Copies rows first … first + 15 (fewer at the end; the rest stay zero) into panel `p`.
  void fill_panel(index_t p, const float* weight, index_t rows, index_t ld, index_t first);

  index_t out_features_ = 0, in_features_ = 0, panels_ = 0;
  bool gated_ = false;
  Tensor<float, 1> storage_;
};

// ---- implementation -----------------------------------------------------------------------------

inline void PackedWeight::check(const char* op, const void* data, index_t rows, index_t cols,
                                index_t ld) {
  if (rows < 0 || cols < 0) {
    throw ShapeError(detail::concat(op, ": weight [", rows, ", ", cols, "] has a negative extent"));
  }
  if (ld < cols) {
    throw ShapeError(detail::concat(op, ": weight [", rows, ", ", cols, "] has row stride ", ld,
                                    " < its ", cols, " columns"));
  }
  if (rows > 0 && cols > 0 && data == nullptr) {
    throw Error(detail::concat(op, ": weight [", rows, ", ", cols, "] is a null pointer"));
  }
}

inline PackedWeight::PackedWeight(const float* weight, index_t rows, index_t cols, index_t ld)
    : out_features_(rows), in_features_(cols) {
  check("PackedWeight", weight, rows, cols, ld);
  panels_ = (rows + packed_panel_width - 1) / packed_panel_width;
  storage_ = Tensor<float, 1>(
      {checked_mul(checked_mul(panels_, packed_panel_width, "PackedWeight: panels·16"), cols,
                   "PackedWeight: panels·16·K")});
  for (index_t p = 0; p < panels_; ++p) fill_panel(p, weight, rows, ld, p * packed_panel_width);
}

inline PackedWeight PackedWeight::gated(const float* gate, const float* up, index_t rows,
                                        index_t cols, index_t ld_gate, index_t ld_up) {
  check("PackedWeight::gated (gate)", gate, rows, cols, ld_gate);
  check("PackedWeight::gated (up)", up, rows, cols, ld_up);
  PackedWeight packed;
  packed.out_features_ = rows;
  packed.in_features_ = cols;
  packed.gated_ = true;
  const index_t pairs = (rows + packed_panel_width - 1) / packed_panel_width;
  packed.panels_ = checked_mul(pairs, 2, "PackedWeight::gated: panels");
  packed.storage_ = Tensor<float, 1>({checked_mul(
      checked_mul(packed.panels_, packed_panel_width, "PackedWeight::gated: panels·16"), cols,
      "PackedWeight::gated: panels·16·K")});
  for (index_t p = 0; p < pairs; ++p) {
    packed.fill_panel(2 * p, gate, rows, ld_gate, p * packed_panel_width);
    packed.fill_panel(2 * p + 1, up, rows, ld_up, p * packed_panel_width);
  }
  return packed;
}

inline void PackedWeight::fill_panel(index_t p, const float* weight, index_t rows, index_t ld,
                                     index_t first) {
  float* out = storage_.data() + p * panel_stride();
  const index_t count = std::min(packed_panel_width, rows - first);
  // Read W row by row (contiguous) and scatter into the panel's column j: the panel is small
  // enough (16·K floats) to stay in cache while it fills.
  for (index_t j = 0; j < count; ++j) {
    const float* row = weight + (first + j) * ld;
    for (index_t k = 0; k < in_features_; ++k) out[k * packed_panel_width + j] = row[k];
  }
}

}  // namespace dissect
