// dissect/quant/bitnet.hpp — BitNet b1.58's two quantisers, the arithmetic of BitLinear
// (bit_linear.hpp) and of Linear's bitlinear mode, written once.
//
// Source: Ma et al., "The Era of 1-bit LLMs: All Large Language Models are in 1.58 Bits"
// (arXiv 2402.17764), and Microsoft's note "The Era of 1-bit LLMs: Training Tips, Code and FAQ"
// (github.com/microsoft/unilm, bitnet/The-Era-of-1-bit-LLMs__Training_Tips_Code_FAQ.pdf), whose
// PyTorch activation_quant and weight_quant these reproduce operation for operation:
//
//   weights, absmean, per tensor:   γ = max(mean|W|, 1e-5),  s_W = 1/γ,
//                                   W̃ = clamp(round(W·s_W), −1, 1) ∈ {−1, 0, +1},  Q(W) = W̃/s_W
//   activations, absmax, per token: β = max(max_j |x_j|, 1e-5),  s_x = 127/β,
//                                   x̃ = clamp(round(x·s_x), −128, 127) ∈ int8,  Q(x) = x̃/s_x
//
// round is round-half-to-even (torch.round; here std::nearbyint in the default rounding mode).
// Each step runs in Scalar as torch runs it in the tensor's dtype (s = 127/β rounded to Scalar,
// then x·s rounded, then rounded to an integer, then x̃/s rounded): for equal β the float32 Q(x) is
// torch's bit for bit. Only mean|W| is accumulated in double and rounded once to Scalar, where
// torch sums in the tensor's dtype; the two γ may differ in the last bit, which moves a level of W̃
// only for a weight within that bit of a rounding tie (|W|·s_W = 0.5).
//
// The clamps define the degenerate cases: an all-zero W has γ = 1e-5, W̃ = 0 and Q(W) = 0 (no 0/0);
// an all-zero token has β = 1e-5 and Q(x) = 0. A token holding NaN or ±Inf gets Q(x) = NaN in
// every entry (torch: its max is NaN or Inf, so every x·s or x̃/s is NaN); a W holding NaN or ±Inf
// gives γ and every Q(W) NaN. Nothing throws: non-finite values propagate, as through the norms.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "dissect/core/shape.hpp"
#include "dissect/kernels/linear_products.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Quantisation levels, row-major: W̃ ∈ {−1, 0, +1} or x̃ ∈ [−128, 127].
using LevelMatrix = Eigen::Matrix<std::int8_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

/// The floor of both scales' denominators (the reference's clamp_(min=1e-5)).
inline constexpr double bitnet_scale_floor = 1e-5;

/// γ = max(mean|W|, 1e-5) over every entry of W (in double, rounded once to Scalar); NaN if W
/// holds NaN or ±Inf. An empty W has γ = 1e-5.
template <class Scalar>
Scalar ternary_scale(const ConstMatrixRef<Scalar>& weight);

/// W̃ = clamp(round(W·(1/γ)), −1, 1) for the γ of ternary_scale, into `levels` (W's shape). A
/// non-finite γ gives levels of 0 (the levels of a NaN weight have no meaning; Q(W) is NaN).
template <class Scalar>
void ternary_levels(const ConstMatrixRef<Scalar>& weight, Scalar gamma,
                    Eigen::Ref<LevelMatrix> levels);

/// Q(W) = W̃/(1/γ): W's fake-quantised values, what forward multiplies by. `out` has W's shape
/// and may be W itself.
template <class Scalar>
void ternary_fake_quantize(const ConstMatrixRef<Scalar>& weight, MatrixRef<Scalar> out);

/// β of one token x [n] (contiguous): max(max_j |x_j|, 1e-5), or NaN if it holds NaN or ±Inf.
template <class Scalar>
Scalar absmax_scale(const Scalar* row, index_t n);

/// Q(x) row by row (each row a token), into `out` of x's shape (may be x itself).
template <class Scalar>
void int8_fake_quantize_rows(const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> out);

/// x̃ = clamp(round(x·(127/β)), −128, 127) row by row, into `levels` (x's shape): the int8 values
/// a deployed kernel multiplies. A non-finite token gives levels of 0 (its Q(x) is NaN).
template <class Scalar>
void int8_levels_rows(const ConstMatrixRef<Scalar>& x, Eigen::Ref<LevelMatrix> levels);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
template <class Scalar>
Scalar bitnet_round(Scalar value, Scalar low, Scalar high) {
  // std::clamp would return NaN or not depending on the comparison order; NaN stays NaN here.
  const Scalar level = std::nearbyint(value);
  return level < low ? low : (level > high ? high : level);
}
}  // namespace detail

template <class Scalar>
Scalar ternary_scale(const ConstMatrixRef<Scalar>& weight) {
  double sum = 0;
  for (index_t r = 0; r < weight.rows(); ++r) {
    for (index_t c = 0; c < weight.cols(); ++c) sum += std::abs(static_cast<double>(weight(r, c)));
  }
  const double count = static_cast<double>(weight.size());
  const Scalar mean = weight.size() == 0 ? Scalar(0) : static_cast<Scalar>(sum / count);
  if (std::isnan(mean) || std::isinf(mean)) return std::numeric_limits<Scalar>::quiet_NaN();
  return std::max(mean, static_cast<Scalar>(bitnet_scale_floor));
}

template <class Scalar>
void ternary_levels(
    const ConstMatrixRef<Scalar>& weight, Scalar gamma,
    Eigen::Ref<Eigen::Matrix<std::int8_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>
        levels) {
  const Scalar s = Scalar(1) / gamma;
  for (index_t r = 0; r < weight.rows(); ++r) {
    for (index_t c = 0; c < weight.cols(); ++c) {
      const Scalar level = detail::bitnet_round(weight(r, c) * s, Scalar(-1), Scalar(1));
      levels(r, c) = std::isnan(level) ? std::int8_t{0} : static_cast<std::int8_t>(level);
    }
  }
}

template <class Scalar>
void ternary_fake_quantize(const ConstMatrixRef<Scalar>& weight, MatrixRef<Scalar> out) {
  const Scalar s = Scalar(1) / ternary_scale<Scalar>(weight);
  for (index_t r = 0; r < weight.rows(); ++r) {
    for (index_t c = 0; c < weight.cols(); ++c) {
      out(r, c) = detail::bitnet_round(weight(r, c) * s, Scalar(-1), Scalar(1)) / s;
    }
  }
}

template <class Scalar>
Scalar absmax_scale(const Scalar* row, index_t n) {
  Scalar largest = 0;
  for (index_t j = 0; j < n; ++j) {
    const Scalar magnitude = std::abs(row[j]);
    if (!(magnitude <= std::numeric_limits<Scalar>::max())) {  // NaN or ±Inf
      return std::numeric_limits<Scalar>::quiet_NaN();
    }
    largest = std::max(largest, magnitude);
  }
  return std::max(largest, static_cast<Scalar>(bitnet_scale_floor));
}

template <class Scalar>
void int8_fake_quantize_rows(const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> out) {
  for (index_t r = 0; r < x.rows(); ++r) {
    const Scalar s = Scalar(127) / absmax_scale<Scalar>(x.data() + r * x.outerStride(), x.cols());
    for (index_t j = 0; j < x.cols(); ++j) {
      out(r, j) = detail::bitnet_round(x(r, j) * s, Scalar(-128), Scalar(127)) / s;
    }
  }
}

template <class Scalar>
void int8_levels_rows(
    const ConstMatrixRef<Scalar>& x,
    Eigen::Ref<Eigen::Matrix<std::int8_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>
        levels) {
  for (index_t r = 0; r < x.rows(); ++r) {
    const Scalar s = Scalar(127) / absmax_scale<Scalar>(x.data() + r * x.outerStride(), x.cols());
    for (index_t j = 0; j < x.cols(); ++j) {
      const Scalar level = detail::bitnet_round(x(r, j) * s, Scalar(-128), Scalar(127));
      levels(r, j) = std::isnan(level) ? std::int8_t{0} : static_cast<std::int8_t>(level);
    }
  }
}

}  // namespace dissect
