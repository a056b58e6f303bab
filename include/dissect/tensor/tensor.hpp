// dissect/tensor/tensor.hpp — Tensor<Scalar, Rank>, an owning contiguous row-major buffer with a
// shape, and TensorView<Scalar, Rank>, the non-owning pointer + shape that every layer reads and
// writes.
//
// Neither does arithmetic of its own: layers take matrix views (leading axes folded into rows,
// the last axis as columns) and hand those to Eigen. Tensor copies are deep and explicit in cost;
// moves are free. Views are free: reshape, flatten and matrix() on a view never copy, and a view
// can change values but never the shape or the address of what it looks at — which is how a
// layer hands out its parameters. TensorView<const Scalar, Rank> (ConstTensorView) is read-only.
// Scalar is float or double.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <ostream>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

template <class Scalar>
inline constexpr bool is_supported_scalar_v =
    std::is_same_v<Scalar, float> || std::is_same_v<Scalar, double>;

/// Row-major dynamic matrix views over tensor memory: the currency of kernels.hpp.
template <class Scalar>
using RowMatrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
template <class Scalar>
using MatrixMap = Eigen::Map<RowMatrix<Scalar>, Eigen::Unaligned>;
template <class Scalar>
using ConstMatrixMap = Eigen::Map<const RowMatrix<Scalar>, Eigen::Unaligned>;
template <class Scalar>
using VectorMap = Eigen::Map<Eigen::Matrix<Scalar, Eigen::Dynamic, 1>, Eigen::Unaligned>;
template <class Scalar>
using ConstVectorMap = Eigen::Map<const Eigen::Matrix<Scalar, Eigen::Dynamic, 1>, Eigen::Unaligned>;

template <class Scalar, std::size_t Rank>
class Tensor;
template <class Scalar, std::size_t Rank>
class TensorView;

/// A read-only view: what layers take as input.
template <class Scalar, std::size_t Rank>
using ConstTensorView = TensorView<const Scalar, Rank>;

namespace detail {
/// Frees what Tensor allocates with 64-byte alignment; one type for every rank, so a reshape
/// can hand the buffer from one rank to another.
inline constexpr std::size_t tensor_alignment = 64;
template <class Scalar>
struct AlignedFree {
  void operator()(Scalar* pointer) const {
    ::operator delete[](pointer, std::align_val_t{tensor_alignment});
  }
};
}  // namespace detail

/// |a - b| <= atol + rtol·|b| elementwise, shapes equal, as torch.allclose: NaN never compares
/// close, and an infinity is close only to the same infinity.
template <class A, class B, std::size_t Rank>
bool allclose(const TensorView<A, Rank>& a, const TensorView<B, Rank>& b, double rtol = 1e-5,
              double atol = 1e-8);
template <class Scalar, std::size_t Rank>
bool allclose(const Tensor<Scalar, Rank>& a, const Tensor<Scalar, Rank>& b, double rtol = 1e-5,
              double atol = 1e-8);

/// Prints "Tensor<float>[2, 3] { … }" with at most a few values per axis.
template <class Scalar, std::size_t Rank>
std::ostream& operator<<(std::ostream& out, const Tensor<Scalar, Rank>& tensor);

// ---- shape helpers shared by Tensor and TensorView
// -----------------------------------------------

namespace detail {

/// `shape` with one extent of -1 inferred so that it holds `size` elements, as torch's reshape.
/// @throws ShapeError for a second -1, another negative extent, or a count that differs.
template <std::size_t OldRank, std::size_t NewRank>
Shape<NewRank> resolve_reshape(const char* op, const Shape<OldRank>& from, index_t size,
                               Shape<NewRank> to) {
  std::size_t inferred = NewRank;
  index_t known = 1;
  for (std::size_t axis = 0; axis < NewRank; ++axis) {
    if (to[axis] == -1 && inferred == NewRank) {
      inferred = axis;
      continue;
    }
    if (to[axis] < 0) {
      throw ShapeError(concat(op, ": invalid extent ", to[axis], " at axis ", axis, " of ",
                              format_shape(to), " (only one -1 may be inferred)"));
    }
    if (mul_overflows(known, to[axis])) {
      throw OverflowError(concat(op, ": element count of ", format_shape(to), " overflows int64"));
    }
    known *= to[axis];
  }
  if (inferred < NewRank) {
    if (known == 0 || size % known != 0) {
      throw ShapeError(concat(op, ": cannot infer the -1 of ", format_shape(to), " for shape ",
                              format_shape(from), " (", size, " elements)"));
    }
    to[inferred] = size / known;
    known = size;
  }
  if (known != size) {
    throw ShapeError(concat(op, ": cannot view shape ", format_shape(from), " (", size,
                            " elements) as ", format_shape(to), " (", known, " elements)"));
  }
  return to;
}

/// The Error for an axis >= Rank, naming the axis and the shape.
template <std::size_t Rank>
[[noreturn]] void throw_axis_out_of_range(const char* op, std::size_t axis,
                                          const Shape<Rank>& shape) {
  throw Error(concat(op, ": axis ", axis, " is out of range for shape ", format_shape(shape),
                     " (rank ", Rank, ")"));
}

/// Whether [a, a + a_count) and [b, b + b_count) share an element: the one aliasing test.
template <class A, class B>
bool ranges_overlap(const A* a, index_t a_count, const B* b, index_t b_count) {
  if (a_count <= 0 || b_count <= 0) return false;
  const auto a_begin = reinterpret_cast<std::uintptr_t>(a);
  const auto b_begin = reinterpret_cast<std::uintptr_t>(b);
  const auto a_end = a_begin + static_cast<std::uintptr_t>(a_count) * sizeof(A);
  const auto b_end = b_begin + static_cast<std::uintptr_t>(b_count) * sizeof(B);
  return a_begin < b_end && b_begin < a_end;
}

}  // namespace detail

// ---- TensorView ---------------------------------------------------------------------------------

/// A contiguous row-major window onto values it does not own: a pointer and a shape. T is the
/// element type, `const Scalar` for a read-only view. Keep the owner alive while the view is used
/// (as with std::span). The shape and address are fixed for the view's life; values are not.
template <class T, std::size_t Rank>
class TensorView {
 public:
  using scalar_type = std::remove_const_t<T>;
  using element_type = T;
  static constexpr std::size_t rank = Rank;
  static constexpr bool writable = !std::is_const_v<T>;
  static_assert(is_supported_scalar_v<scalar_type>,
                "dissect::TensorView holds float or double; other scalar types are not supported");
  static_assert(Rank >= 1, "dissect::TensorView needs rank >= 1");

  /// An empty view: every extent 0.
  TensorView() = default;

  /// `shape` over the values at `data`.
  /// @throws ShapeError for a negative extent or an overflowing size; Error for a null `data`
  ///         under a non-empty shape.
  TensorView(T* data, const Shape<Rank>& shape)
      : data_(data), shape_(shape), size_(element_count(shape, "TensorView")) {
    if (data_ == nullptr && size_ > 0) {
      throw Error(detail::concat("TensorView: null data for shape ", format_shape(shape_)));
    }
  }

  /// A writable view converts to a read-only one.
  template <class U>
  requires(std::is_same_v<const U, T> && !std::is_same_v<U, T>)
      TensorView(const TensorView<U, Rank>& other)  // NOLINT: implicit, as T* → const T*
      : data_(other.data()), shape_(other.shape()), size_(other.size()) {}

  /// The whole of a tensor (read-only views also bind to const tensors and temporaries).
  TensorView(Tensor<scalar_type, Rank>& tensor)  // NOLINT: implicit, as std::span
      : data_(tensor.data()), shape_(tensor.shape()), size_(tensor.size()) {}
  TensorView(const Tensor<scalar_type, Rank>& tensor)  // NOLINT: implicit, as std::span
      requires(!writable)
      : data_(tensor.data()), shape_(tensor.shape()), size_(tensor.size()) {}

  const Shape<Rank>& shape() const { return shape_; }
  /// @throws Error if axis >= Rank.
  index_t dim(std::size_t axis) const {
    // The read sits under the test, so no compiler can see an out-of-bounds path.
    if (axis < Rank) return shape_[axis];
    detail::throw_axis_out_of_range("dim", axis, shape_);
  }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() const { return data_; }
  T* begin() const { return data_; }
  T* end() const { return data_ + size_; }

  /// Unchecked element access: one index per axis.
  template <class... Indices>
  T& operator()(Indices... indices) const {
    return data_[offset_of(indices...)];
  }
  /// Checked element access. @throws Error naming the index, the axis and the shape.
  template <class... Indices>
  T& at(Indices... indices) const {
    check_indices(indices...);
    return data_[offset_of(indices...)];
  }

  /// The same values under `new_shape` (one extent may be -1, inferred), without copying.
  /// @throws ShapeError if the element counts differ.
  template <std::size_t NewRank>
  TensorView<T, NewRank> reshape(const Shape<NewRank>& new_shape) const {
    return {data_, detail::resolve_reshape("TensorView::reshape", shape_, size_, new_shape)};
  }
  /// All values as one axis.
  TensorView<T, 1> flatten() const { return {data_, Shape<1>{size_}}; }

  /// [prod(leading axes), last axis]: how a linear layer sees its input.
  auto matrix() const {
    using Map = std::conditional_t<writable, MatrixMap<scalar_type>, ConstMatrixMap<scalar_type>>;
    return Map(data_, leading_count(shape_), shape_[Rank - 1]);
  }
  /// All elements as one column vector.
  auto vector() const {
    using Map = std::conditional_t<writable, VectorMap<scalar_type>, ConstVectorMap<scalar_type>>;
    return Map(data_, size_);
  }

  void fill(scalar_type value) const requires writable { std::fill_n(data_, size_, value); }

  /// Copies `source`'s values in (it may overlap this view). Shape and address stay.
  /// @throws ShapeError naming both shapes if they differ.
  void copy_from(const TensorView<const scalar_type, Rank>& source) const requires writable {
    if (source.shape() != shape_) {
      throw ShapeError(detail::concat("TensorView::copy_from: source has shape ",
                                      format_shape(source.shape()), " but the view has shape ",
                                      format_shape(shape_)));
    }
    if (size_ > 0) std::memmove(data_, source.data(), static_cast<std::size_t>(size_) * sizeof(T));
  }

  /// Whether the two views share any element.
  template <class U, std::size_t OtherRank>
  bool overlaps(const TensorView<U, OtherRank>& other) const {
    return detail::ranges_overlap(data_, size_, other.data(), other.size());
  }

 private:
  template <class... Indices>
  index_t offset_of(Indices... indices) const {
    static_assert(sizeof...(Indices) == Rank, "dissect::Tensor: give exactly one index per axis");
    static_assert((std::is_integral_v<Indices> && ...), "dissect::Tensor: indices are integers");
    const index_t index[] = {static_cast<index_t>(indices)...};
    index_t offset = 0;
    for (std::size_t axis = 0; axis < Rank; ++axis) offset = offset * shape_[axis] + index[axis];
    return offset;
  }

  template <class... Indices>
  void check_indices(Indices... indices) const {
    static_assert(sizeof...(Indices) == Rank, "dissect::Tensor: give exactly one index per axis");
    const index_t index[] = {static_cast<index_t>(indices)...};
    for (std::size_t axis = 0; axis < Rank; ++axis) {
      if (index[axis] < 0 || index[axis] >= shape_[axis]) {
        throw Error(detail::concat("Tensor::at: index ", index[axis], " is out of range for axis ",
                                   axis, " (size ", shape_[axis], ") of shape ",
                                   format_shape(shape_)));
      }
    }
  }

  T* data_ = nullptr;
  Shape<Rank> shape_{};
  index_t size_ = 0;
};

// ---- tensor-like arguments
// ------------------------------------------------------------------------ Rank-generic functions
// (Linear::forward, activations) take any Tensor or TensorView; these name its scalar and rank and
// turn it into a view, so each such function has one implementation.

template <class X>
struct tensor_traits {};
template <class Scalar, std::size_t Rank>
struct tensor_traits<Tensor<Scalar, Rank>> {
  using scalar_type = Scalar;
  static constexpr std::size_t rank = Rank;
  static constexpr bool writable = true;
};
template <class T, std::size_t Rank>
struct tensor_traits<TensorView<T, Rank>> {
  using scalar_type = std::remove_const_t<T>;
  static constexpr std::size_t rank = Rank;
  static constexpr bool writable = !std::is_const_v<T>;
};

/// A Tensor or a TensorView (of any constness, by value or reference).
template <class X>
concept TensorLike = requires {
  tensor_traits<std::remove_cvref_t<X>>::rank;
};

template <TensorLike X>
using scalar_of = typename tensor_traits<std::remove_cvref_t<X>>::scalar_type;
template <TensorLike X>
inline constexpr std::size_t rank_of = tensor_traits<std::remove_cvref_t<X>>::rank;
/// A non-const Tensor lvalue or a writable view: something an output can be written into.
template <class X>
concept WritableTensor = TensorLike<X> && tensor_traits<std::remove_cvref_t<X>>::writable &&
    (!std::is_const_v<std::remove_reference_t<X>> ||
     requires { std::remove_cvref_t<X>::writable; });

/// A read-only view of any tensor-like argument.
template <TensorLike X>
ConstTensorView<scalar_of<X>, rank_of<X>> const_view(const X& x) {
  return ConstTensorView<scalar_of<X>, rank_of<X>>(x);
}
/// A writable view of a non-const Tensor or a writable view.
template <WritableTensor X>
TensorView<scalar_of<X>, rank_of<X>> writable_view(X&& x) {
  if constexpr (requires { x.view(); }) {
    return x.view();
  } else {
    return x;
  }
}

// ---- Tensor -------------------------------------------------------------------------------------

template <class Scalar, std::size_t Rank>
class Tensor {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::Tensor holds float or double; other scalar types are not supported");
  static_assert(Rank >= 1, "dissect::Tensor needs rank >= 1");

 public:
  using scalar_type = Scalar;
  static constexpr std::size_t rank = Rank;
  static constexpr std::size_t alignment = detail::tensor_alignment;

  /// An empty tensor: every extent 0.
  Tensor() = default;

  /// Zero-filled tensor of `shape`.
  /// @throws ShapeError for a negative extent or a size that overflows int64 (before allocating).
  explicit Tensor(Shape<Rank> shape) : shape_(shape), size_(checked_size(shape)) {
    allocate();
    if (size_ > 0) std::memset(data_.get(), 0, bytes());
  }

  /// Tensor of `shape` holding `values` in row-major order.
  /// @throws ShapeError if values.size() differs from the element count of `shape`.
  Tensor(Shape<Rank> shape, const std::vector<Scalar>& values)
      : shape_(shape), size_(checked_size(shape)) {
    if (static_cast<index_t>(values.size()) != size_) {
      throw ShapeError(detail::concat("Tensor: ", values.size(), " values for shape ",
                                      format_shape(shape_), " (", size_, " elements)"));
    }
    allocate();
    std::copy(values.begin(), values.end(), data_.get());
  }

  /// A copy of a view's values (the one way a view becomes an owner: copies are explicit).
  explicit Tensor(const ConstTensorView<Scalar, Rank>& values)
      : shape_(values.shape()), size_(values.size()) {
    allocate();
    std::copy_n(values.data(), size_, data_.get());
  }
  explicit Tensor(const TensorView<Scalar, Rank>& values)
      : Tensor(ConstTensorView<Scalar, Rank>(values)) {}

  /// A tensor whose values are unspecified: for outputs that are written in full before any read
  /// (what Linear::forward returns), so no pass over memory is spent zeroing them.
  static Tensor uninitialized(Shape<Rank> shape) { return Tensor(shape, Uninitialized{}); }

  Tensor(const Tensor& other) : shape_(other.shape_), size_(other.size_) {
    allocate();
    std::copy_n(other.data(), size_, data_.get());
  }
  Tensor(Tensor&& other) noexcept
      : shape_(std::exchange(other.shape_, Shape<Rank>{})),
        size_(std::exchange(other.size_, 0)),
        data_(std::move(other.data_)) {}
  Tensor& operator=(const Tensor& other) {
    if (this != &other) *this = Tensor(other);
    return *this;
  }
  Tensor& operator=(Tensor&& other) noexcept {
    shape_ = std::exchange(other.shape_, Shape<Rank>{});
    size_ = std::exchange(other.size_, 0);
    data_ = std::move(other.data_);
    return *this;
  }
  ~Tensor() = default;

  const Shape<Rank>& shape() const { return shape_; }
  /// @throws Error if axis >= Rank.
  index_t dim(std::size_t axis) const { return cview().dim(axis); }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Scalar* data() { return data_.get(); }
  const Scalar* data() const { return data_.get(); }
  Scalar* begin() { return data(); }
  Scalar* end() { return data() + size_; }
  const Scalar* begin() const { return data(); }
  const Scalar* end() const { return data() + size_; }

  /// The whole tensor as a view (values writable through it, shape and buffer not).
  TensorView<Scalar, Rank> view() { return {data(), shape_}; }
  ConstTensorView<Scalar, Rank> view() const { return cview(); }
  ConstTensorView<Scalar, Rank> cview() const { return {data(), shape_}; }

  /// Unchecked element access: one index per axis.
  template <class... Indices>
  Scalar& operator()(Indices... indices) {
    return view()(indices...);
  }
  template <class... Indices>
  const Scalar& operator()(Indices... indices) const {
    return cview()(indices...);
  }

  /// Checked element access. @throws Error naming the index, the axis and the shape.
  template <class... Indices>
  Scalar& at(Indices... indices) {
    return view().at(indices...);
  }
  template <class... Indices>
  const Scalar& at(Indices... indices) const {
    return cview().at(indices...);
  }

  void fill(Scalar value) { std::fill_n(data(), size_, value); }

  /// The same values under a new shape with the same element count; one extent may be -1 and is
  /// then inferred. A copy (the rvalue overload moves the buffer instead; view().reshape() neither
  /// copies nor moves). @throws ShapeError if the counts differ, before anything is allocated.
  template <std::size_t NewRank>
  Tensor<Scalar, NewRank> reshape(const Shape<NewRank>& new_shape) const& {
    const auto resolved = detail::resolve_reshape("Tensor::reshape", shape_, size_, new_shape);
    auto result = Tensor<Scalar, NewRank>::uninitialized(resolved);
    std::copy_n(data(), size_, result.data());
    return result;
  }
  template <std::size_t NewRank>
  Tensor<Scalar, NewRank> reshape(const Shape<NewRank>& new_shape) && {
    const auto resolved = detail::resolve_reshape("Tensor::reshape", shape_, size_, new_shape);
    Tensor<Scalar, NewRank> result;
    result.adopt(resolved, size_, std::move(data_));
    shape_ = Shape<Rank>{};
    size_ = 0;
    return result;
  }

  /// Axes reordered: result.dim(i) == dim(order[i]) (a copy, like torch's permute().contiguous()).
  /// @throws ShapeError unless `order` is a permutation of 0..Rank-1.
  Tensor permute(const std::array<std::size_t, Rank>& order) const;

  /// [prod(leading axes), last axis] view: how a linear layer sees its input.
  MatrixMap<Scalar> matrix() { return view().matrix(); }
  ConstMatrixMap<Scalar> matrix() const { return cview().matrix(); }
  /// All elements as one column vector.
  VectorMap<Scalar> vector() { return view().vector(); }
  ConstVectorMap<Scalar> vector() const { return cview().vector(); }

 private:
  template <class, std::size_t>
  friend class Tensor;
  using Buffer = std::unique_ptr<Scalar[], detail::AlignedFree<Scalar>>;
  struct Uninitialized {};

  Tensor(Shape<Rank> shape, Uninitialized) : shape_(shape), size_(checked_size(shape)) {
    allocate();
  }

  static index_t checked_size(const Shape<Rank>& shape) {
    index_t count = element_count(shape, "Tensor");
    // The byte size must fit too: the allocator takes size_t, and callers compute byte offsets.
    if (detail::mul_overflows(count, static_cast<index_t>(sizeof(Scalar)))) {
      throw OverflowError(
          detail::concat("Tensor: byte size of shape ", format_shape(shape), " overflows int64"));
    }
    return count;
  }

  void allocate() {
    if (size_ <= 0) return;  // never negative; saying so lets GCC bound the allocation size
    auto bytes_needed = static_cast<std::size_t>(size_) * sizeof(Scalar);
    data_.reset(static_cast<Scalar*>(::operator new[](bytes_needed, std::align_val_t{alignment})));
  }

  std::size_t bytes() const { return static_cast<std::size_t>(size_) * sizeof(Scalar); }

  void adopt(const Shape<Rank>& shape, index_t size, Buffer data) {
    shape_ = shape;
    size_ = size;
    data_ = std::move(data);
  }

  Shape<Rank> shape_{};
  index_t size_ = 0;
  Buffer data_;
};

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar, std::size_t Rank>
Tensor<Scalar, Rank> Tensor<Scalar, Rank>::permute(
    const std::array<std::size_t, Rank>& order) const {
  std::array<bool, Rank> seen{};
  for (std::size_t axis : order) {
    if (axis >= Rank || seen[axis]) {
      std::ostringstream listed;
      for (std::size_t i = 0; i < Rank; ++i) listed << (i ? ", " : "") << order[i];
      throw ShapeError(detail::concat("Tensor::permute: (", listed.str(),
                                      ") is not a permutation of the axes of shape ",
                                      format_shape(shape_)));
    }
    seen[axis] = true;
  }
  Shape<Rank> permuted_shape{};
  for (std::size_t i = 0; i < Rank; ++i) permuted_shape[i] = shape_[order[i]];
  Tensor result(permuted_shape, Uninitialized{});
  if (size_ == 0) return result;

  // Walk the result in row-major order and track the matching source offset incrementally.
  std::array<index_t, Rank> source_stride{};
  index_t stride = 1;
  for (std::size_t axis = Rank; axis-- > 0;) {
    source_stride[axis] = stride;
    stride *= shape_[axis];
  }
  std::array<index_t, Rank> counter{};
  index_t source = 0;
  for (index_t target = 0; target < size_; ++target) {
    result.data_[target] = data_[source];
    for (std::size_t i = Rank; i-- > 0;) {
      source += source_stride[order[i]];
      if (++counter[i] < permuted_shape[i]) break;
      source -= source_stride[order[i]] * permuted_shape[i];
      counter[i] = 0;
    }
  }
  return result;
}

template <class A, class B, std::size_t Rank>
bool allclose(const TensorView<A, Rank>& a, const TensorView<B, Rank>& b, double rtol,
              double atol) {
  if (a.shape() != b.shape()) return false;
  for (index_t i = 0; i < a.size(); ++i) {
    const double x = a.data()[i];
    const double y = b.data()[i];
    if (x == y) continue;  // equal infinities are close; |∞ − ∞| would be NaN
    if (std::isinf(x) || std::isinf(y)) return false;  // rtol·∞ would call anything close to ∞
    if (!(std::abs(x - y) <= atol + rtol * std::abs(y))) return false;
  }
  return true;
}

template <class Scalar, std::size_t Rank>
bool allclose(const Tensor<Scalar, Rank>& a, const Tensor<Scalar, Rank>& b, double rtol,
              double atol) {
  return allclose(a.view(), b.view(), rtol, atol);
}

template <class Scalar, std::size_t Rank>
std::ostream& operator<<(std::ostream& out, const Tensor<Scalar, Rank>& tensor) {
  constexpr index_t shown = 6;
  out << "Tensor<" << (std::is_same_v<Scalar, float> ? "float" : "double") << ">"
      << format_shape(tensor.shape()) << " {";
  index_t count = std::min(tensor.size(), shown);
  for (index_t i = 0; i < count; ++i) out << (i ? ", " : "") << tensor.data()[i];
  if (tensor.size() > shown) out << ", … (" << tensor.size() << " values)";
  return out << '}';
}

}  // namespace dissect
