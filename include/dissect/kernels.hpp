// dissect/kernels.hpp — the functional layer: y = x·Wᵀ + b and its gradients on Eigen maps.
//
// No classes, no allocation, no shape checks beyond debug asserts: callers (Linear, the blocks)
// check shapes at the public boundary and hand over row-major matrix views. Beside each fast
// kernel lives a naive triple loop that the tests use as an oracle — it is slow on purpose and
// shares no code with the fast path.
#pragma once

#include <algorithm>
#include <optional>

#include "dissect/tensor.hpp"

namespace dissect {

/// What the kernels take: any row-major matrix expression with unit inner stride (a tensor's
/// matrix(), a Map, a block of rows) binds to these without a copy.
template <class Scalar>
using ConstMatrixRef = Eigen::Ref<const RowMatrix<Scalar>, 0, Eigen::OuterStride<>>;
template <class Scalar>
using MatrixRef = Eigen::Ref<RowMatrix<Scalar>, 0, Eigen::OuterStride<>>;

// ---- declarations -------------------------------------------------------------------------------

/// x: [M, K]  W: [N, K]  b: [N] (optional)  →  y: [M, N] (overwritten, never read).
template <class Scalar>
void linear_forward(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                    std::optional<ConstVectorMap<Scalar>> bias, MatrixRef<Scalar> y);

/// x: [M, K]  W: [N, K]  dy: [M, N]  →  dx: [M, K] (overwritten);  dW: [N, K] += dyᵀ·x;
/// db: [N] += Σ_m dy[m, :] (when given). Gradients accumulate, as in PyTorch and llm.c.
template <class Scalar>
void linear_backward(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                     const ConstMatrixRef<Scalar>& dy, MatrixRef<Scalar> dx,
                     MatrixRef<Scalar> dweight, std::optional<VectorMap<Scalar>> dbias);

/// The oracles: the same contracts as above, as plain loops.
template <class Scalar>
void linear_forward_naive(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                          std::optional<ConstVectorMap<Scalar>> bias, MatrixRef<Scalar> y);
template <class Scalar>
void linear_backward_naive(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                           const ConstMatrixRef<Scalar>& dy, MatrixRef<Scalar> dx,
                           MatrixRef<Scalar> dweight, std::optional<VectorMap<Scalar>> dbias);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

/// Widest block of output columns handed to one Eigen GEMM call. Single-threaded Eigen 3.4 runs
/// 4–5× slower once a product has ≳ 10240 output columns at depth 4096 (see bench/README.md);
/// panels of at most this many columns keep every shape on the fast path.
inline constexpr index_t gemm_column_panel = 4096;

/// dst = lhs·rhs, or dst += lhs·rhs when `accumulate`, one column panel at a time.
template <class Dst, class Lhs, class Rhs>
void panelled_product(Dst&& dst, const Lhs& lhs, const Rhs& rhs, bool accumulate) {
  const index_t columns = dst.cols();
  if (lhs.cols() == 0) {  // an empty reduction: the product is exactly zero
    if (!accumulate) dst.setZero();
    return;
  }
  for (index_t first = 0; first < columns; first += gemm_column_panel) {
    const index_t width = std::min(gemm_column_panel, columns - first);
    auto dst_panel = dst.middleCols(first, width);
    if (accumulate) {
      dst_panel.noalias() += lhs * rhs.middleCols(first, width);
    } else {
      dst_panel.noalias() = lhs * rhs.middleCols(first, width);
    }
  }
}

}  // namespace detail

template <class Scalar>
void linear_forward(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                    std::optional<ConstVectorMap<Scalar>> bias, MatrixRef<Scalar> y) {
  detail::panelled_product(y, x, weight.transpose(), /*accumulate=*/false);
  if (bias) y.rowwise() += bias->transpose();
}

template <class Scalar>
void linear_backward(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                     const ConstMatrixRef<Scalar>& dy, MatrixRef<Scalar> dx,
                     MatrixRef<Scalar> dweight, std::optional<VectorMap<Scalar>> dbias) {
  detail::panelled_product(dx, dy, weight, /*accumulate=*/false);             // dx = dy·W
  detail::panelled_product(dweight, dy.transpose(), x, /*accumulate=*/true);  // dW += dyᵀ·x
  if (dbias) *dbias += dy.colwise().sum().transpose();                        // db += Σ_m dy
}

template <class Scalar>
void linear_forward_naive(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                          std::optional<ConstVectorMap<Scalar>> bias, MatrixRef<Scalar> y) {
  for (index_t m = 0; m < x.rows(); ++m) {
    for (index_t n = 0; n < weight.rows(); ++n) {
      Scalar sum = bias ? (*bias)(n) : Scalar(0);
      for (index_t k = 0; k < x.cols(); ++k) sum += x(m, k) * weight(n, k);
      y(m, n) = sum;
    }
  }
}

template <class Scalar>
void linear_backward_naive(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                           const ConstMatrixRef<Scalar>& dy, MatrixRef<Scalar> dx,
                           MatrixRef<Scalar> dweight, std::optional<VectorMap<Scalar>> dbias) {
  const index_t rows = x.rows(), in = x.cols(), out = weight.rows();
  for (index_t m = 0; m < rows; ++m) {
    for (index_t k = 0; k < in; ++k) {
      Scalar sum = 0;
      for (index_t n = 0; n < out; ++n) sum += dy(m, n) * weight(n, k);
      dx(m, k) = sum;
    }
  }
  for (index_t n = 0; n < out; ++n) {
    for (index_t k = 0; k < in; ++k) {
      Scalar sum = 0;
      for (index_t m = 0; m < rows; ++m) sum += dy(m, n) * x(m, k);
      dweight(n, k) += sum;
    }
    if (dbias) {
      Scalar sum = 0;
      for (index_t m = 0; m < rows; ++m) sum += dy(m, n);
      (*dbias)(n) += sum;
    }
  }
}

}  // namespace dissect
