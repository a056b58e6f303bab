// Helpers of the tensor-parallel tests: the world communicator, slicing a full tensor into a
// rank's part and gathering the ranks' parts back, and the rounding bound the comparisons use.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <span>

#include "dissect/parallel/communicator.hpp"
#include "dissect/tensor/tensor.hpp"
#include "support/tensor_testing.hpp"

namespace dissect::testing {

/// One communicator on MPI_COMM_WORLD for the whole run (freed only while MPI is alive).
inline const parallel::Communicator& world() {
  static parallel::Communicator communicator(MPI_COMM_WORLD);
  return communicator;
}

/// Rank p's slice [p·n/P, (p+1)·n/P) of x's last axis.
template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> slice_last(const Tensor<Scalar, Rank>& x, int rank, int ranks) {
  Shape<Rank> shape = x.shape();
  const index_t width = shape[Rank - 1], share = width / ranks;
  shape[Rank - 1] = share;
  Tensor<Scalar, Rank> part(shape);
  const index_t rows = width == 0 ? 0 : x.size() / width;
  for (index_t r = 0; r < rows; ++r) {
    std::copy_n(x.data() + r * width + rank * share, share, part.data() + r * share);
  }
  return part;
}

/// The ranks' slices of the last axis, put back together (the inverse of slice_last).
template <TensorLike X>
Tensor<scalar_of<X>, rank_of<X>> gather_last(const parallel::Communicator& comm, const X& x) {
  using Scalar = scalar_of<X>;
  constexpr std::size_t Rank = rank_of<X>;
  const auto part = const_view(x);
  const auto all =
      comm.all_gather(std::span<const Scalar>(part.data(), static_cast<std::size_t>(part.size())));
  Shape<Rank> shape = part.shape();
  const index_t share = shape[Rank - 1], width = share * comm.size();
  shape[Rank - 1] = width;
  Tensor<Scalar, Rank> full(shape);
  const index_t rows = share == 0 ? 0 : part.size() / share;
  for (int p = 0; p < comm.size(); ++p) {
    for (index_t r = 0; r < rows; ++r) {
      std::copy_n(all.data() + p * part.size() + r * share, share,
                  full.data() + r * width + p * share);
    }
  }
  return full;
}

/// The ranks' parts stacked along the first axis (rows of a column-parallel weight).
template <TensorLike X>
Tensor<scalar_of<X>, rank_of<X>> gather_first(const parallel::Communicator& comm, const X& x) {
  using Scalar = scalar_of<X>;
  constexpr std::size_t Rank = rank_of<X>;
  const auto part = const_view(x);
  auto all =
      comm.all_gather(std::span<const Scalar>(part.data(), static_cast<std::size_t>(part.size())));
  Shape<Rank> shape = part.shape();
  shape[0] *= comm.size();
  return Tensor<Scalar, Rank>(shape, std::move(all));
}

template <TensorLike X>
double max_abs_of(const X& x) {
  const auto view = const_view(x);
  double result = 0;
  for (auto value : view) result = std::max(result, static_cast<double>(std::abs(value)));
  return result;
}

/// Absolute bound for comparing a split computation with the single-process one: each result is
/// a sum of `length` products (plus at most P − 1 more additions in the all-reduce), computed by
/// two implementations in different orders, so |a − b| ≤ 2·γ_{length+P}·Σ|terms| and
/// Σ|terms| ≤ length·max|a|·max|b| (Higham §3.1).
template <class Scalar>
double reduction_bound(index_t length, int ranks, double max_a, double max_b) {
  return 2.0 * gamma<Scalar>(length + ranks) * static_cast<double>(length) * max_a * max_b +
         std::numeric_limits<double>::denorm_min();
}

/// The bound of a whole block or layer, compared split against single-process. Its results are
/// chains of stages — dot products (the projections over D or F, q·kᵀ over d_k, P·v over T),
/// each a `reduction_bound` of its own length with entries of magnitude ≤ scale (inputs and
/// weights are drawn from [−1, 1]) — joined by maps whose Lipschitz constants are at most ~1.13
/// (GELU′ ≤ 1.13, SiLU′ ≤ 1.10, softmax ≤ 1/2 in ∞-norm, a norm's 1/σ ≤ 2 for these inputs,
/// whose σ ≈ 0.58, times its weight γ ≤ 1). An error entering a later stage is carried through
/// at most that factor, so the errors of the stages add: Σ 2·γ_n·n ≤ 2·γ_length·length for
/// `length` = the sum of the stage lengths, and the factor 4 covers the Lipschitz constants
/// (2 × 1.13 < 4) — an absolute bound relative to `scale` = max(1, max|expected|).
/// In double this is ~10⁻¹¹·scale, so a missing or doubled all-reduce term fails at once.
template <class Scalar, TensorLike X>
double block_bound(index_t length, int ranks, const X& expected) {
  return 4.0 * gamma<Scalar>(length + ranks) * static_cast<double>(length) *
         std::max(1.0, max_abs_of(expected));
}

}  // namespace dissect::testing
