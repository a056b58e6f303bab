// dissect/training/loss.hpp — softmax, log-softmax and the softmax cross-entropy loss of a
// classifier.
//
// cross_entropy is torch.nn.CrossEntropyLoss with mean reduction: logits [N, C] and int64 class
// targets [N]. Every row is shifted by its maximum before exponentiating, so logits of 1e4 (or
// 1e38) neither overflow nor lose the answer. The fused forward_backward form is what a training
// loop calls: one pass over the logits, no allocation.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <type_traits>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// logits: [..., C] → [..., C]: exp(x − max) / Σ exp(x − max) along the last axis.
template <TensorLike L, class Scalar = scalar_of<L>, std::size_t Rank = rank_of<L>>
Tensor<Scalar, Rank> softmax(const L& logits);

/// As softmax, into `out` of the same shape; `out` may be `logits` itself (in place).
/// @throws ShapeError if the shapes differ.
template <TensorLike L, class Scalar = scalar_of<L>, std::size_t Rank = rank_of<L>,
          WritableTensor O>
void softmax_into(const L& logits, O&& out);

/// logits: [..., C] → [..., C]: x − max − log Σ exp(x − max) along the last axis.
template <TensorLike L, class Scalar = scalar_of<L>, std::size_t Rank = rank_of<L>>
Tensor<Scalar, Rank> log_softmax(const L& logits);

/// As log_softmax, into `out` (same rules as softmax_into).
template <TensorLike L, class Scalar = scalar_of<L>, std::size_t Rank = rank_of<L>,
          WritableTensor O>
void log_softmax_into(const L& logits, O&& out);

/// logits: [N, C], targets: [N] with values in [0, C) → mean over n of
/// −log softmax(logits)[n, targets[n]] (torch.nn.CrossEntropyLoss, reduction "mean").
/// N = 0 gives NaN, as in PyTorch. NaN or Inf in a row propagates to the loss.
/// @throws ShapeError if targets.size() != N; Error naming the index if a target is outside
///         [0, C).
template <TensorLike L, class Scalar = scalar_of<L>>
requires(rank_of<L> == 2) Scalar cross_entropy(const L& logits, std::span<const index_t> targets);

/// dlogits: [N, C] (overwritten) = grad_output · (softmax(logits) − onehot(targets)) / N.
/// `dlogits` may be `logits` itself.
/// @throws as cross_entropy, and ShapeError if dlogits is not [N, C]. Nothing is written when
///         it throws.
template <TensorLike L, class Scalar = scalar_of<L>, WritableTensor O>
requires(rank_of<L> ==
         2) void cross_entropy_backward_into(const L& logits, std::span<const index_t> targets,
                                             O&& dlogits,
                                             std::type_identity_t<Scalar> grad_output = Scalar(1));

/// As cross_entropy_backward_into, into a new tensor.
template <TensorLike L, class Scalar = scalar_of<L>>
requires(rank_of<L> == 2) Tensor<Scalar, 2> cross_entropy_backward(
    const L& logits, std::span<const index_t> targets,
    std::type_identity_t<Scalar> grad_output = Scalar(1));

/// The loss (as cross_entropy) and its gradient (as cross_entropy_backward_into with
/// grad_output 1) from one pass over the logits: what a training step calls.
template <TensorLike L, class Scalar = scalar_of<L>, WritableTensor O>
requires(rank_of<L> == 2) Scalar
    cross_entropy_forward_backward(const L& logits, std::span<const index_t> targets, O&& dlogits);

/// Index of the largest logit in each row ([N, C] → N indices); the first one on ties, like
/// torch.argmax. A row holding NaN answers the first NaN. @throws ShapeError if C = 0 and N > 0.
template <TensorLike L, class Scalar = scalar_of<L>>
requires(rank_of<L> == 2) std::vector<index_t> argmax(const L& logits);

/// How many rows of logits [N, C] have their argmax at targets[n] (no allocation).
/// @throws ShapeError if targets.size() != N, or if C = 0 and N > 0.
template <TensorLike L, class Scalar = scalar_of<L>>
requires(rank_of<L> == 2) index_t count_correct(const L& logits, std::span<const index_t> targets);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

template <class In, class Out>
void check_same_shape_output(const char* op, const In& in, const Out& out, const char* in_name,
                             const char* out_name) {
  if (out.shape() != in.shape()) {
    throw ShapeError(concat(op, ": ", out_name, " has shape ", format_shape(out.shape()), " but ",
                            in_name, " has shape ", format_shape(in.shape())));
  }
}

/// Largest value of a row, NaNs skipped (a NaN still reaches the result through exp(x − max)).
/// −inf for an empty row or one of −infs.
template <class Scalar>
Scalar row_max(const Scalar* x, index_t columns) {
  Scalar max = -std::numeric_limits<Scalar>::infinity();
  for (index_t c = 0; c < columns; ++c) max = x[c] > max ? x[c] : max;
  return max;
}

/// Writes e[c] = exp(x[c] − max) and returns Σ e. Reading x[c] before writing e[c] keeps this
/// correct when e and x are the same row.
template <class Scalar>
Scalar shifted_exp(const Scalar* x, Scalar max, index_t columns, Scalar* e) {
  Scalar sum = 0;
  for (index_t c = 0; c < columns; ++c) {
    e[c] = std::exp(x[c] - max);
    sum += e[c];
  }
  return sum;
}

inline void check_targets(const char* op, const Shape<2>& logits_shape,
                          std::span<const index_t> targets) {
  const index_t rows = logits_shape[0], classes = logits_shape[1];
  if (static_cast<index_t>(targets.size()) != rows) {
    throw ShapeError(concat(op, ": ", targets.size(), " targets for logits ",
                            format_shape(logits_shape), " (one per row expected)"));
  }
  for (index_t n = 0; n < rows; ++n) {
    const index_t target = targets[static_cast<std::size_t>(n)];
    if (target < 0 || target >= classes) {
      throw Error(concat(op, ": target ", target, " at index ", n, " is out of range [0, ", classes,
                         ") (logits: ", format_shape(logits_shape), ")"));
    }
  }
}

/// The shared loop of the cross-entropy forms: per row, the loss term (accumulated in double so
/// the mean of a large batch does not drift) and, when `dlogits` is given, scale·(p − onehot).
template <class Scalar, class L>
double cross_entropy_rows(const L& logits, std::span<const index_t> targets, Scalar* dlogits,
                          Scalar scale) {
  const index_t rows = logits.dim(0), classes = logits.dim(1);
  double total = 0;
  for (index_t n = 0; n < rows; ++n) {
    const Scalar* x = logits.data() + n * classes;
    const index_t target = targets[static_cast<std::size_t>(n)];
    const Scalar max = row_max(x, classes);
    const Scalar target_shifted = x[target] - max;  // read before an in-place write replaces it
    if (dlogits) {
      Scalar* d = dlogits + n * classes;
      const Scalar sum = shifted_exp(x, max, classes, d);
      total += static_cast<double>(std::log(sum) - target_shifted);
      for (index_t c = 0; c < classes; ++c) d[c] = (d[c] / sum) * scale;
      d[target] -= scale;
    } else {
      Scalar sum = 0;
      for (index_t c = 0; c < classes; ++c) sum += std::exp(x[c] - max);
      total += static_cast<double>(std::log(sum) - target_shifted);
    }
  }
  return total;
}

}  // namespace detail

namespace detail {
/// row(x, y, classes) for each row of logits [..., C] and out, after checking their shapes: the
/// one loop of softmax_into and log_softmax_into.
template <class L, class O, class Row>
void for_each_logit_row(const char* op, const L& logits, O& out, Row&& row) {
  check_same_shape_output(op, logits, out, "logits", "out");
  const index_t classes = logits.shape().back();
  const index_t rows = leading_count(logits.shape());
  for (index_t n = 0; n < rows; ++n)
    row(logits.data() + n * classes, out.data() + n * classes, classes);
}
}  // namespace detail

template <TensorLike L, class Scalar, std::size_t Rank, WritableTensor O>
void softmax_into(const L& logits, O&& out) {
  detail::for_each_logit_row(
      "softmax", logits, out, [](const Scalar* x, Scalar* y, index_t classes) {
        const Scalar sum = detail::shifted_exp(x, detail::row_max(x, classes), classes, y);
        for (index_t c = 0; c < classes; ++c) y[c] /= sum;
      });
}

template <TensorLike L, class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> softmax(const L& logits) {
  auto out = Tensor<Scalar, Rank>::uninitialized(logits.shape());
  softmax_into(logits, out);
  return out;
}

template <TensorLike L, class Scalar, std::size_t Rank, WritableTensor O>
void log_softmax_into(const L& logits, O&& out) {
  detail::for_each_logit_row("log_softmax", logits, out,
                             [](const Scalar* x, Scalar* y, index_t classes) {
                               const Scalar max = detail::row_max(x, classes);
                               Scalar sum = 0;
                               for (index_t c = 0; c < classes; ++c) sum += std::exp(x[c] - max);
                               // (x − max) − log Σ rather than x − (max + log Σ): the shifted value
                               // is exact (Sterbenz) for the logits near the max, which are the
                               // ones whose log-probabilities matter.
                               const Scalar log_sum = std::log(sum);
                               for (index_t c = 0; c < classes; ++c) y[c] = (x[c] - max) - log_sum;
                             });
}

template <TensorLike L, class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> log_softmax(const L& logits) {
  auto out = Tensor<Scalar, Rank>::uninitialized(logits.shape());
  log_softmax_into(logits, out);
  return out;
}

template <TensorLike L, class Scalar>
requires(rank_of<L> == 2) Scalar cross_entropy(const L& logits, std::span<const index_t> targets) {
  detail::check_targets("cross_entropy", logits.shape(), targets);
  const double total = detail::cross_entropy_rows<Scalar>(logits, targets, nullptr, Scalar(0));
  // 0/0 = NaN for an empty batch, which is what torch's mean reduction returns.
  return static_cast<Scalar>(total / static_cast<double>(logits.dim(0)));
}

template <TensorLike L, class Scalar, WritableTensor O>
requires(rank_of<L> ==
         2) void cross_entropy_backward_into(const L& logits, std::span<const index_t> targets,
                                             O&& dlogits,
                                             std::type_identity_t<Scalar> grad_output) {
  detail::check_targets("cross_entropy_backward", logits.shape(), targets);
  detail::check_same_shape_output("cross_entropy_backward", logits, dlogits, "logits", "dlogits");
  if (logits.dim(0) == 0) return;
  const Scalar scale = grad_output / static_cast<Scalar>(logits.dim(0));
  detail::cross_entropy_rows<Scalar>(logits, targets, dlogits.data(), scale);
}

template <TensorLike L, class Scalar>
requires(rank_of<L> == 2) Tensor<Scalar, 2> cross_entropy_backward(
    const L& logits, std::span<const index_t> targets, std::type_identity_t<Scalar> grad_output) {
  auto dlogits = Tensor<Scalar, 2>::uninitialized(logits.shape());
  cross_entropy_backward_into(logits, targets, dlogits, grad_output);
  return dlogits;
}

template <TensorLike L, class Scalar, WritableTensor O>
requires(rank_of<L> == 2) Scalar
    cross_entropy_forward_backward(const L& logits, std::span<const index_t> targets, O&& dlogits) {
  detail::check_targets("cross_entropy_forward_backward", logits.shape(), targets);
  detail::check_same_shape_output("cross_entropy_forward_backward", logits, dlogits, "logits",
                                  "dlogits");
  const index_t rows = logits.dim(0);
  if (rows == 0) return std::numeric_limits<Scalar>::quiet_NaN();
  const Scalar scale = Scalar(1) / static_cast<Scalar>(rows);
  const double total = detail::cross_entropy_rows<Scalar>(logits, targets, dlogits.data(), scale);
  return static_cast<Scalar>(total / static_cast<double>(rows));
}

namespace detail {
template <class Scalar>
index_t row_argmax(const Scalar* x, index_t columns) {
  index_t best = 0;
  for (index_t c = 0; c < columns; ++c) {
    if (std::isnan(x[c])) return c;
    if (x[c] > x[best]) best = c;
  }
  return best;
}

template <class L>
void check_argmax_input(const char* op, const L& logits) {
  if (logits.dim(1) == 0 && logits.dim(0) > 0) {
    throw ShapeError(
        concat(op, ": no classes to choose from (logits: ", format_shape(logits.shape()), ")"));
  }
}
}  // namespace detail

template <TensorLike L, class Scalar>
requires(rank_of<L> == 2) std::vector<index_t> argmax(const L& logits) {
  detail::check_argmax_input("argmax", logits);
  std::vector<index_t> result(static_cast<std::size_t>(logits.dim(0)));
  for (index_t n = 0; n < logits.dim(0); ++n) {
    result[static_cast<std::size_t>(n)] =
        detail::row_argmax(logits.data() + n * logits.dim(1), logits.dim(1));
  }
  return result;
}

template <TensorLike L, class Scalar>
requires(rank_of<L> == 2) index_t count_correct(const L& logits, std::span<const index_t> targets) {
  if (static_cast<index_t>(targets.size()) != logits.dim(0)) {
    throw ShapeError(detail::concat("count_correct: ", targets.size(), " targets for logits ",
                                    format_shape(logits.shape()), " (one per row expected)"));
  }
  detail::check_argmax_input("count_correct", logits);
  index_t correct = 0;
  for (index_t n = 0; n < logits.dim(0); ++n) {
    const index_t predicted = detail::row_argmax(logits.data() + n * logits.dim(1), logits.dim(1));
    correct += predicted == targets[static_cast<std::size_t>(n)] ? 1 : 0;
  }
  return correct;
}

}  // namespace dissect
