// dissect/kernels/linear_products.hpp — the functional layer: y = x·Wᵀ + b and its gradients on
// Eigen maps.
//
// No classes, no allocation, no shape checks beyond debug asserts: callers (Linear, the blocks)
// check shapes at the public boundary and hand over row-major matrix views. In float, over more
// than skinny_rows tokens, the products run on dissect's own GEMM (kernels/gemm.hpp), which packs
// W, Wᵀ or xᵀ block by block into a per-thread workspace and so allocates nothing per call; in
// double, for a few tokens, or on the pinned scalar path, they run on Eigen. Beside each fast
// kernel lives a naive triple loop that the tests use as an oracle — it is slow on purpose and
// shares no code with the fast path.
#pragma once

#include <algorithm>
#include <optional>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/kernels/gemm.hpp"
#include "dissect/tensor/detail/panelled_gemm.hpp"
#include "dissect/tensor/tensor.hpp"

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

namespace detail {

/// Whether a product over `tokens` rows in Scalar runs on dissect's GEMM: float, more tokens
/// than skinny_rows (below that, repacking W per call costs more than the product, and Eigen's
/// GEMV-like kernels, split over threads here, stream W as it is; a packed Linear is the fast
/// path there), and the scalar path not pinned.
template <class Scalar>
bool own_gemm(index_t tokens) {
  return std::is_same_v<Scalar, float> && tokens > skinny_rows &&
         gemm_kernel_path() != KernelPath::scalar;
}

/// A row-major view as the GEMM driver's strided operand, transposed when asked.
template <class Matrix>
kernels::detail::StridedMatrix strided(const Matrix& m, bool transposed = false) {
  const index_t rows = m.outerStride(), cols = 1;
  return transposed ? kernels::detail::StridedMatrix{m.data(), cols, rows}
                    : kernels::detail::StridedMatrix{m.data(), rows, cols};
}

/// C [m, n] (= or +=) A·Bᵀ with A [m, k], B [n, k] given as strided views.
inline void own_product(index_t m, index_t n, index_t k, kernels::detail::StridedMatrix a,
                        kernels::detail::StridedMatrix b, float* c, index_t ldc, bool accumulate,
                        const float* bias = nullptr) {
  kernels::detail::GemmCall call;
  call.m = m;
  call.n = n;
  call.k = k;
  call.a = a;
  call.b = b;
  call.c = c;
  call.ldc = ldc;
  call.accumulate = accumulate;
  call.epilogue.bias = bias;
  kernels::detail::run_gemm_on(call, gemm_kernel_path(), kernels::detail::gemm_threads(call, 0));
}

}  // namespace detail

template <class Scalar>
void linear_forward(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& weight,
                    std::optional<ConstVectorMap<Scalar>> bias, MatrixRef<Scalar> y) {
  if constexpr (std::is_same_v<Scalar, float>) {
    if (detail::own_gemm<Scalar>(x.rows())) {  // y = x·Wᵀ (+ b in the epilogue)
      detail::own_product(x.rows(), weight.rows(), x.cols(), detail::strided(x),
                          detail::strided(weight), y.data(), y.outerStride(), false,
                          bias ? bias->data() : nullptr);
      return;
    }
  }
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
  if constexpr (std::is_same_v<Scalar, float>) {
    if (detail::own_gemm<Scalar>(dy.rows())) {  // dx = dy·W: B[j, n] = W[n, j]
      detail::own_product(dy.rows(), weight.cols(), weight.rows(), detail::strided(dy),
                          detail::strided(weight, true), dx.data(), dx.outerStride(), false);
      return;
    }
  }
  const int threads = detail::threads_for_product(dy.rows(), weight.size());
  // dx = dy·W, split over dx's columns (in_features).
  detail::panelled_product(dx, dy, weight, /*accumulate=*/false, threads);
}

template <class Scalar>
void linear_backward_parameters(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& dy,
                                MatrixRef<Scalar> dweight, std::optional<VectorMap<Scalar>> dbias) {
  if (detail::own_gemm<Scalar>(x.rows())) {  // dW += dyᵀ·x: A[n, m] = dy[m, n], B[k, m] = x[m, k]
    if constexpr (std::is_same_v<Scalar, float>) {
      detail::own_product(dy.cols(), x.cols(), x.rows(), detail::strided(dy, true),
                          detail::strided(x, true), dweight.data(), dweight.outerStride(), true);
    }
  } else {
    const int threads = detail::threads_for_product(x.rows(), dweight.size());
    // dW += dyᵀ·x, split over dW's columns (in_features): threads own disjoint column blocks.
    detail::panelled_product(dweight, dy.transpose(), x, /*accumulate=*/true, threads);
  }
  // db += Σ_m dy, row by row: a column sum would build a temporary.
  if (dbias) {
    for (index_t m = 0; m < dy.rows(); ++m) *dbias += dy.row(m).transpose();
  }
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
