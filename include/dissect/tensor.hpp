// dissect/tensor.hpp — Tensor<Scalar, Rank>: an owning, contiguous, row-major buffer with a shape.
//
// The tensor does no arithmetic of its own: layers take matrix views of it (leading axes folded
// into rows, the last axis as columns) and hand those to Eigen. The buffer is 64-byte aligned so
// the views can promise Eigen full-width aligned loads. Copies are deep and explicit in cost;
// moves are free. Scalar is float or double.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <new>
#include <ostream>
#include <sstream>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/error.hpp"
#include "dissect/shape.hpp"

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

/// |a - b| <= atol + rtol·|b| elementwise, shapes equal; NaN never compares close.
template <class Scalar, std::size_t Rank>
bool allclose(const Tensor<Scalar, Rank>& a, const Tensor<Scalar, Rank>& b, double rtol = 1e-5,
              double atol = 1e-8);

/// Prints "Tensor<float>[2, 3] { … }" with at most a few values per axis.
template <class Scalar, std::size_t Rank>
std::ostream& operator<<(std::ostream& out, const Tensor<Scalar, Rank>& tensor);

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
  index_t dim(std::size_t axis) const { return shape_.at(axis); }
  index_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  Scalar* data() { return data_.get(); }
  const Scalar* data() const { return data_.get(); }
  Scalar* begin() { return data(); }
  Scalar* end() { return data() + size_; }
  const Scalar* begin() const { return data(); }
  const Scalar* end() const { return data() + size_; }

  /// Unchecked element access: one index per axis.
  template <class... Indices>
  Scalar& operator()(Indices... indices) {
    return data_.get()[offset_of(indices...)];
  }
  template <class... Indices>
  const Scalar& operator()(Indices... indices) const {
    return data_.get()[offset_of(indices...)];
  }

  /// Checked element access. @throws Error naming the index, the axis and the shape.
  template <class... Indices>
  Scalar& at(Indices... indices) {
    check_indices(indices...);
    return (*this)(indices...);
  }
  template <class... Indices>
  const Scalar& at(Indices... indices) const {
    check_indices(indices...);
    return (*this)(indices...);
  }

  void fill(Scalar value) { std::fill_n(data(), size_, value); }

  /// The same values under a new shape with the same element count (a copy; the rvalue overload
  /// moves the buffer instead). @throws ShapeError if the counts differ.
  template <std::size_t NewRank>
  Tensor<Scalar, NewRank> reshape(const Shape<NewRank>& new_shape) const& {
    auto result = Tensor<Scalar, NewRank>::uninitialized(new_shape);
    check_reshape(new_shape, result.size());
    std::copy_n(data(), size_, result.data());
    return result;
  }
  template <std::size_t NewRank>
  Tensor<Scalar, NewRank> reshape(const Shape<NewRank>& new_shape) && {
    check_reshape(new_shape, element_count(new_shape, "Tensor::reshape"));
    Tensor<Scalar, NewRank> result;
    result.adopt(new_shape, size_, std::move(data_));
    shape_ = Shape<Rank>{};
    size_ = 0;
    return result;
  }

  /// Axes reordered: result.dim(i) == dim(order[i]) (a copy, like torch's permute().contiguous()).
  /// @throws ShapeError unless `order` is a permutation of 0..Rank-1.
  Tensor permute(const std::array<std::size_t, Rank>& order) const;

  /// [prod(leading axes), last axis] view: how a linear layer sees its input.
  MatrixMap<Scalar> matrix() { return {data(), leading_count(shape_), shape_[Rank - 1]}; }
  ConstMatrixMap<Scalar> matrix() const {
    return {data(), leading_count(shape_), shape_[Rank - 1]};
  }
  /// All elements as one column vector.
  VectorMap<Scalar> vector() { return {data(), size_}; }
  ConstVectorMap<Scalar> vector() const { return {data(), size_}; }

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

  template <std::size_t NewRank>
  void check_reshape(const Shape<NewRank>& new_shape, index_t new_size) const {
    if (new_size != size_) {
      throw ShapeError(detail::concat("Tensor::reshape: cannot view shape ", format_shape(shape_),
                                      " (", size_, " elements) as ", format_shape(new_shape), " (",
                                      new_size, " elements)"));
    }
  }

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

template <class Scalar, std::size_t Rank>
bool allclose(const Tensor<Scalar, Rank>& a, const Tensor<Scalar, Rank>& b, double rtol,
              double atol) {
  if (a.shape() != b.shape()) return false;
  for (index_t i = 0; i < a.size(); ++i) {
    double x = a.data()[i];
    double y = b.data()[i];
    if (!(std::abs(x - y) <= atol + rtol * std::abs(y))) return false;
  }
  return true;
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
