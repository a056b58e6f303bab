// dissect/layers/rope.hpp — rotary position embedding (RoPE, Su et al. 2021) as LLaMA and Hugging
// Face apply it: each head vector of q or k [B, H, T, d_k] is rotated pair by pair, pair i being
// the features (i, i + d_k/2) — HF's rotate_half layout, not the interleaved (2i, 2i + 1) of the
// paper — by the angle p·θ_i at position p, with θ_i = rope_theta^(−2i/d_k).
//
// RotaryTable computes cos and sin once for d_k and a number of positions; apply_rope and
// rope_backward then only multiply and add. A rotation is orthogonal, so the backward pass is the
// inverse rotation, dx = R(−p·θ)·dy. There are no parameters: RoPE is a function, not a module.
// GrowingRotaryTable is a model's: it holds the positions its forwards have needed so far, not
// the whole context, so a context of 2³¹ − 1 positions costs nothing until a sequence uses it.
#pragma once

#include <algorithm>
#include <cmath>
#include <memory>
#include <mutex>
#include <ostream>
#include <type_traits>
#include <utility>

#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// LLaMA's rope_theta; LLaMA 3 uses 500000.
inline constexpr double default_rope_theta = 10000.0;

/// cos(p·θ_i) and sin(p·θ_i) for positions p in [0, max_positions) and i in [0, d_k/2).
///
/// Why the angles are computed in double, whatever Scalar is: the angle p·θ_i grows with p (up to
/// thousands of radians for i = 0), and a float angle carries an absolute error of about
/// p·2⁻²⁴ — 2.4e-4 rad at p = 4096, a thousand times float's own resolution of cos and sin. In
/// double the angle is good to ~1e-12 rad, so each table entry is cos or sin of the exact angle
/// rounded once to Scalar. (Hugging Face computes the angles in float32, so its float32 results
/// drift from dissect's by that angle error at long positions; its float64 results do not.)
template <class Scalar>
class RotaryTable {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::RotaryTable<Scalar>: Scalar must be float or double");

 public:
  using scalar_type = Scalar;

  /// @throws ConfigError if head_dim is not positive and even, max_positions is negative, or
  ///         theta is not finite and > 0.
  RotaryTable(index_t head_dim, index_t max_positions, double theta = default_rope_theta);

  index_t head_dim() const { return head_dim_; }  ///< d_k
  index_t max_positions() const { return cos_.dim(0); }
  double theta() const { return theta_; }

  /// [max_positions, d_k/2]: cos(p·θ_i) and sin(p·θ_i).
  ConstTensorView<Scalar, 2> cos() const { return cos_.cview(); }
  ConstTensorView<Scalar, 2> sin() const { return sin_.cview(); }

 private:
  index_t head_dim_;
  double theta_;
  Tensor<Scalar, 2> cos_;
  Tensor<Scalar, 2> sin_;
};

/// A model's RoPE table, sized by what its forwards need rather than by its context: covering(n)
/// returns a RotaryTable of at least n positions (grown to max(n, twice the last) — so decoding
/// one token at a time recomputes O(final length) entries in all — and never past `limit`, the
/// context). Its entries are RotaryTable's bit for bit: cos and sin of position p do not depend
/// on how many positions the table holds. A table once built is immutable and shared: a forward
/// keeps the one it was given while another call grows a successor, so const forwards may run
/// concurrently (a mutex guards only the swap); copies share the tables built so far.
template <class Scalar>
class GrowingRotaryTable {
 public:
  /// Holds nothing until asked. @throws ConfigError as RotaryTable (head_dim, theta), or if
  ///         limit is negative.
  GrowingRotaryTable(index_t head_dim, index_t limit, double theta = default_rope_theta);
  GrowingRotaryTable(const GrowingRotaryTable& other) : GrowingRotaryTable(other, other.lock()) {}
  GrowingRotaryTable& operator=(const GrowingRotaryTable& other);

  index_t head_dim() const { return head_dim_; }
  double theta() const { return theta_; }
  /// The most positions it will ever hold (the model's context).
  index_t limit() const { return limit_; }
  /// Positions the current table holds: 0 until a forward asks.
  index_t positions() const {
    std::lock_guard guard(mutex_);
    return table_->max_positions();
  }

  /// A table of positions [0, n) at least. @throws Error if n > limit() (a model's forward
  ///         refuses such positions against its context first); ConfigError if n < 0.
  std::shared_ptr<const RotaryTable<Scalar>> covering(index_t n) const;

 private:
  GrowingRotaryTable(const GrowingRotaryTable& other,
                     [[maybe_unused]] std::unique_lock<std::mutex> held)
      : head_dim_(other.head_dim_),
        limit_(other.limit_),
        theta_(other.theta_),
        table_(other.table_) {}
  std::unique_lock<std::mutex> lock() const { return std::unique_lock(mutex_); }

  index_t head_dim_;
  index_t limit_;
  double theta_;
  mutable std::mutex mutex_;
  mutable std::shared_ptr<const RotaryTable<Scalar>> table_;
};

/// x: [B, H, T, d_k] → y: [B, H, T, d_k], the head vector at [b, h, t] rotated to position
/// offset + t (offset: the positions already in a KV cache while decoding).
///   y[i]         = x[i]·cos − x[i + d_k/2]·sin
///   y[i + d_k/2] = x[i + d_k/2]·cos + x[i]·sin,   cos, sin of (offset + t)·θ_i
/// @throws ShapeError if x's last dim is not the table's d_k; Error if offset < 0 or
///         offset + T > max_positions, naming both.
template <TensorLike X>
Tensor<scalar_of<X>, 4> apply_rope(const X& x, index_t offset,
                                   const RotaryTable<scalar_of<X>>& table);
/// dy: [B, H, T, d_k] → dx = R(−(offset + t)·θ)·dy, the gradient of apply_rope (its transpose,
/// which for a rotation is its inverse). @throws as apply_rope.
template <TensorLike DY>
Tensor<scalar_of<DY>, 4> rope_backward(const DY& dy, index_t offset,
                                       const RotaryTable<scalar_of<DY>>& table);

/// Both with a table built for this call alone (offset + T positions of `theta`): the trig is
/// recomputed every call, so build a RotaryTable for repeated use.
template <TensorLike X>
Tensor<scalar_of<X>, 4> apply_rope(const X& x, index_t offset = 0,
                                   double theta = default_rope_theta);
template <TensorLike DY>
Tensor<scalar_of<DY>, 4> rope_backward(const DY& dy, index_t offset = 0,
                                       double theta = default_rope_theta);

/// Both into a caller's buffer [B, H, T, d_k], whose old values are never read. It may be the
/// input itself (in place); any other overlap is a ShapeError, as is a shape other than the
/// input's. @throws as apply_rope otherwise.
template <TensorLike X, WritableTensor Y>
void apply_rope_into(const X& x, Y&& y, index_t offset, const RotaryTable<scalar_of<X>>& table);
template <TensorLike DY, WritableTensor DX>
void rope_backward_into(const DY& dy, DX&& dx, index_t offset,
                        const RotaryTable<scalar_of<DY>>& table);

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
RotaryTable<Scalar>::RotaryTable(index_t head_dim, index_t max_positions, double theta)
    : head_dim_(require_positive("RotaryTable", "head_dim", head_dim)),
      theta_(require_positive_finite("RotaryTable", "rope_theta", theta)) {
  if (head_dim % 2 != 0) {
    throw ConfigError(detail::concat("RotaryTable: head_dim must be even (got ", head_dim,
                                     "): RoPE rotates pairs (i, i + head_dim/2)"));
  }
  if (max_positions < 0) {
    throw ConfigError(
        detail::concat("RotaryTable: max_positions must be >= 0 (got ", max_positions, ")"));
  }
  const index_t half = head_dim / 2;
  cos_ = Tensor<Scalar, 2>({max_positions, half});
  sin_ = Tensor<Scalar, 2>({max_positions, half});
  for (index_t i = 0; i < half; ++i) {
    const double inv_freq =
        std::pow(theta, -static_cast<double>(2 * i) / static_cast<double>(head_dim));
    for (index_t p = 0; p < max_positions; ++p) {
      const double angle = static_cast<double>(p) * inv_freq;
      cos_(p, i) = static_cast<Scalar>(std::cos(angle));
      sin_(p, i) = static_cast<Scalar>(std::sin(angle));
    }
  }
}

template <class Scalar>
GrowingRotaryTable<Scalar>::GrowingRotaryTable(index_t head_dim, index_t limit, double theta)
    : head_dim_(head_dim),
      limit_(limit),
      theta_(theta),
      table_(std::make_shared<RotaryTable<Scalar>>(head_dim, 0, theta)) {  // checks both
  if (limit < 0) {
    throw ConfigError(detail::concat("GrowingRotaryTable: limit must be >= 0 (got ", limit, ")"));
  }
}

template <class Scalar>
GrowingRotaryTable<Scalar>& GrowingRotaryTable<Scalar>::operator=(const GrowingRotaryTable& other) {
  if (this == &other) return *this;
  std::shared_ptr<const RotaryTable<Scalar>> table;
  {
    const auto held = other.lock();
    table = other.table_;
  }
  std::lock_guard guard(mutex_);
  head_dim_ = other.head_dim_;
  limit_ = other.limit_;
  theta_ = other.theta_;
  table_ = std::move(table);
  return *this;
}

template <class Scalar>
std::shared_ptr<const RotaryTable<Scalar>> GrowingRotaryTable<Scalar>::covering(index_t n) const {
  if (n < 0) {
    throw ConfigError(detail::concat("GrowingRotaryTable::covering: n must be >= 0 (got ", n, ")"));
  }
  if (n > limit_) {
    throw Error(detail::concat("GrowingRotaryTable::covering: ", n,
                               " positions are beyond the limit of ", limit_));
  }
  std::lock_guard guard(mutex_);
  const index_t held = table_->max_positions();
  if (held < n) {
    // Doubling bounds the work of a sequence decoded one token at a time to O(its length); the
    // table it replaces lives on while a forward still holds it.
    const index_t grown = held > limit_ / 2 ? limit_ : std::max(n, 2 * held);
    table_ = std::make_shared<RotaryTable<Scalar>>(head_dim_, grown, theta_);
  }
  return table_;
}

namespace detail {

/// The one rotation kernel: direction +1 rotates by +p·θ (forward), −1 by −p·θ (backward).
/// Each pair is read in full before either element is written, so y may be x.
template <class Scalar>
void rope_rotate(const char* op, const ConstTensorView<Scalar, 4>& x,
                 const TensorView<Scalar, 4>& y, index_t offset, const RotaryTable<Scalar>& table,
                 Scalar direction) {
  const auto& shape = x.shape();
  if (shape[3] != table.head_dim()) {
    throw ShapeError(concat(op, ": last dim ", shape[3], " of ", format_shape(shape),
                            " [B, H, T, d_k] != the table's head_dim ", table.head_dim()));
  }
  const index_t seq = shape[2];
  // offset > P − T rather than offset + T > P: the sum could overflow.
  if (offset < 0 || offset > table.max_positions() - seq) {
    throw Error(concat(op, ": positions offset ", offset, " + T ", seq, " are outside the table's ",
                       table.max_positions(),
                       " positions (need offset >= 0 and offset + T <= max_positions)"));
  }
  if (y.shape() != shape) {
    throw ShapeError(concat(op, ": output has shape ", format_shape(y.shape()),
                            " but the input has shape ", format_shape(shape)));
  }
  if (y.data() != x.data() && y.overlaps(x)) {
    throw ShapeError(concat(op, ": output ", format_shape(y.shape()),
                            " partly overlaps the input (only y = x, in place, may share memory)"));
  }
  const index_t half = shape[3] / 2;
  const index_t rows = leading_count(shape);  // B·H·T head vectors
  for (index_t r = 0; r < rows; ++r) {
    const index_t position = offset + r % seq;
    const Scalar* cos = table.cos().data() + position * half;
    const Scalar* sin = table.sin().data() + position * half;
    const Scalar* in = x.data() + r * 2 * half;
    Scalar* out = y.data() + r * 2 * half;
    for (index_t i = 0; i < half; ++i) {
      const Scalar first = in[i], second = in[i + half], s = direction * sin[i];
      out[i] = first * cos[i] - second * s;
      out[i + half] = second * cos[i] + first * s;
    }
  }
}

template <class X>
constexpr void check_rope_rank() {
  static_assert(rank_of<X> == 4, "dissect::apply_rope: x is [B, H, T, d_k] (rank 4)");
}

/// A table just long enough for x [B, H, T, d_k] at `offset`, for the theta overloads. A
/// negative offset or T is left to rope_rotate's check, which names it.
template <class Scalar>
RotaryTable<Scalar> rope_table_for(const Shape<4>& shape, index_t offset, double theta) {
  const index_t positions =
      offset >= 0 ? checked_add(offset, shape[2], "apply_rope: positions") : 0;
  return RotaryTable<Scalar>(shape[3], positions, theta);
}

}  // namespace detail

template <TensorLike X, WritableTensor Y>
void apply_rope_into(const X& x, Y&& y, index_t offset, const RotaryTable<scalar_of<X>>& table) {
  detail::check_rope_rank<X>();
  static_assert(std::is_same_v<scalar_of<X>, scalar_of<Y>>,
                "dissect::apply_rope_into: x and y must have the same scalar type");
  detail::rope_rotate<scalar_of<X>>("apply_rope_into", const_view(x), writable_view(y), offset,
                                    table, 1);
}

template <TensorLike X>
Tensor<scalar_of<X>, 4> apply_rope(const X& x, index_t offset,
                                   const RotaryTable<scalar_of<X>>& table) {
  detail::check_rope_rank<X>();
  auto y = Tensor<scalar_of<X>, 4>::uninitialized(const_view(x).shape());
  detail::rope_rotate<scalar_of<X>>("apply_rope", const_view(x), y.view(), offset, table, 1);
  return y;
}

template <TensorLike X>
Tensor<scalar_of<X>, 4> apply_rope(const X& x, index_t offset, double theta) {
  detail::check_rope_rank<X>();
  return apply_rope(x, offset,
                    detail::rope_table_for<scalar_of<X>>(const_view(x).shape(), offset, theta));
}

template <TensorLike DY, WritableTensor DX>
void rope_backward_into(const DY& dy, DX&& dx, index_t offset,
                        const RotaryTable<scalar_of<DY>>& table) {
  detail::check_rope_rank<DY>();
  static_assert(std::is_same_v<scalar_of<DY>, scalar_of<DX>>,
                "dissect::rope_backward_into: dy and dx must have the same scalar type");
  detail::rope_rotate<scalar_of<DY>>("rope_backward_into", const_view(dy), writable_view(dx),
                                     offset, table, -1);
}

template <TensorLike DY>
Tensor<scalar_of<DY>, 4> rope_backward(const DY& dy, index_t offset,
                                       const RotaryTable<scalar_of<DY>>& table) {
  detail::check_rope_rank<DY>();
  auto dx = Tensor<scalar_of<DY>, 4>::uninitialized(const_view(dy).shape());
  detail::rope_rotate<scalar_of<DY>>("rope_backward", const_view(dy), dx.view(), offset, table, -1);
  return dx;
}

template <TensorLike DY>
Tensor<scalar_of<DY>, 4> rope_backward(const DY& dy, index_t offset, double theta) {
  detail::check_rope_rank<DY>();
  return rope_backward(
      dy, offset, detail::rope_table_for<scalar_of<DY>>(const_view(dy).shape(), offset, theta));
}

}  // namespace dissect
