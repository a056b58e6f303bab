// dissect/kernels.hpp — the functional layer: y = x·Wᵀ + b and its gradients on Eigen maps.
//
// No classes, no allocation, no shape checks beyond debug asserts: callers (Linear, the blocks)
// check shapes at the public boundary and hand over row-major matrix views. Beside each fast
// kernel lives a naive triple loop that the tests use as an oracle — it is slow on purpose and
// shares no code with the fast path.
#pragma once

#include <algorithm>
#include <optional>

#include "dissect/detail/panelled_gemm.hpp"
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

/// W: [N, K]  dy: [M, N]  →  dx: [M, K] = dy·W (overwritten): the input half of linear_backward,
/// for a frozen layer whose weight takes no gradient.
template <class Scalar>
void linear_backward_input(const ConstMatrixRef<Scalar>& weight, const ConstMatrixRef<Scalar>& dy,
                           MatrixRef<Scalar> dx);

/// x: [M, K]  dy: [M, N]  →  dW: [N, K] += dyᵀ·x;  db: [N] += Σ_m dy[m, :] (when given): the
/// parameter half of linear_backward, for a first layer whose input needs no gradient.
template <class Scalar>
void linear_backward_parameters(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& dy,
                                MatrixRef<Scalar> dweight, std::optional<VectorMap<Scalar>> dbias);

// The oracles, linear_forward_naive and linear_backward_naive, are defined below: the same
// contracts as linear_forward and linear_backward, as plain loops.

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
void linear_forward(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                    std::optional<ConstVectorMap<Scalar>> bias, MatrixRef<Scalar> y) {
  // Few tokens: split the output features across threads; each reads its share of W once.
  const int threads = detail::threads_for_product(x.rows(), weight.size());
  detail::panelled_product(y, x, weight.transpose(), /*accumulate=*/false, threads);
  if (bias) y.rowwise() += bias->transpose();
}

template <class Scalar>
void linear_backward(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                     const ConstMatrixRef<Scalar>& dy, MatrixRef<Scalar> dx,
                     MatrixRef<Scalar> dweight, std::optional<VectorMap<Scalar>> dbias) {
  linear_backward_input<Scalar>(weight, dy, dx);
  linear_backward_parameters<Scalar>(x, dy, dweight, dbias);
}

template <class Scalar>
void linear_backward_input(const ConstMatrixRef<Scalar>& weight, const ConstMatrixRef<Scalar>& dy,
                           MatrixRef<Scalar> dx) {
  const int threads = detail::threads_for_product(dy.rows(), weight.size());
  // dx = dy·W, split over dx's columns (in_features).
  detail::panelled_product(dx, dy, weight, /*accumulate=*/false, threads);
}

template <class Scalar>
void linear_backward_parameters(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& dy,
                                MatrixRef<Scalar> dweight, std::optional<VectorMap<Scalar>> dbias) {
  const int threads = detail::threads_for_product(x.rows(), dweight.size());
  // dW += dyᵀ·x, split over dW's columns (in_features): threads own disjoint column blocks.
  detail::panelled_product(dweight, dy.transpose(), x, /*accumulate=*/true, threads);
  if (dbias) *dbias += dy.colwise().sum().transpose();  // db += Σ_m dy
}

/// The oracle of linear_forward: the same contract, as a plain loop.
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

/// The oracle of linear_backward: the same contract, as plain loops.
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
