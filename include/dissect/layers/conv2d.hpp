// dissect/layers/conv2d.hpp — Conv2d<Scalar>: nn.Conv2d (groups = 1) as im2col + the library's
// GEMM.
//
// A convolution is a linear layer applied to every receptive field: im2col lays the fields of all
// images out as the rows of one matrix cols [N·Ho·Wo, C·kh·kw], and y = cols·Wᵀ + b is then one
// call of linear_forward, the kernel Linear runs (dissect's packed GEMM in float). Backward is
// linear_backward on the same matrix, and col2im scatters dcols back onto the image: dx.
// The column buffer is allocated once per call, for the whole batch.
#pragma once

#include <array>
#include <cmath>
#include <cstdint>
#include <optional>
#include <ostream>
#include <type_traits>

#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// A pair (height, width), as nn.Conv2d's `_pair` arguments: {2, 2} or {1, 3}.
using Pair = std::array<index_t, 2>;

/// What nn.Conv2d takes besides the channels and the kernel (groups is always 1).
struct Conv2dOptions {
  Pair stride{1, 1};    ///< > 0
  Pair padding{0, 0};   ///< ≥ 0, zeros on both sides
  Pair dilation{1, 1};  ///< > 0
  bool bias = true;
  /// Seed of the layer's own generator; when empty, the next of the sequence manual_seed() sets.
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// Conv2d: x [N, C, H, W] → y [N, O, Ho, Wo], Ho = ⌊(H + 2·ph − dh·(kh − 1) − 1)/sh⌋ + 1 (and Wo
/// alike), weight [O, C, kh, kw] and bias [O] under nn.Conv2d's names and initialisation
/// (kaiming_uniform(a = √5): both U(−1/√fan_in, 1/√fan_in), fan_in = C·kh·kw).
///
/// Numerics: each output is one dot product of length C·kh·kw (+ the bias) on the same kernels as
/// Linear, so it agrees with torch within Higham's γ_{C·kh·kw+1}·Σ|terms|; dW and db sum over
/// N·Ho·Wo rows, dx over the kernel positions that cover a pixel.
template <class Scalar>
class Conv2d : public ParameterMethods<Conv2d<Scalar>> {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::Conv2d<Scalar>: Scalar must be float or double");

 public:
  using scalar_type = Scalar;

  /// @throws ConfigError naming the field if a channel count or a kernel, stride or dilation
  ///         entry is ≤ 0, or a padding entry is < 0.
  Conv2d(index_t in_channels, index_t out_channels, Pair kernel_size,
         const Conv2dOptions& options = {});

  index_t in_channels() const { return weight_.dim(1); }
  index_t out_channels() const { return weight_.dim(0); }
  Pair kernel_size() const { return {weight_.dim(2), weight_.dim(3)}; }
  Pair stride() const { return stride_; }
  Pair padding() const { return padding_; }
  Pair dilation() const { return dilation_; }
  bool has_bias() const { return has_bias_; }
  /// C·kh·kw: the length of one receptive field, the GEMM's depth.
  index_t field_size() const { return weight_.dim(1) * weight_.dim(2) * weight_.dim(3); }

  /// weight: [O, C, kh, kw]; values writable, shape and buffer fixed.
  TensorView<Scalar, 4> weight() { return weight_.view(); }
  ConstTensorView<Scalar, 4> weight() const { return weight_.cview(); }
  TensorView<Scalar, 4> weight_grad() { return weight_grad_.view(); }
  ConstTensorView<Scalar, 4> weight_grad() const { return weight_grad_.cview(); }
  /// bias: [O]. @throws Error if the layer has no bias.
  TensorView<Scalar, 1> bias() { return with_bias("bias", bias_).view(); }
  ConstTensorView<Scalar, 1> bias() const { return with_bias("bias", bias_).cview(); }
  TensorView<Scalar, 1> bias_grad() { return with_bias("bias_grad", bias_grad_).view(); }
  ConstTensorView<Scalar, 1> bias_grad() const {
    return with_bias("bias_grad", bias_grad_).cview();
  }

  /// Copies new values into the parameter. @throws ShapeError naming it if the shape differs.
  void set_weight(ConstTensorView<Scalar, 4> weight) {
    assign_parameter("Conv2d", "weight", "[out_channels, in_channels, kh, kw]", weight_, weight);
  }
  void set_bias(ConstTensorView<Scalar, 1> bias) {
    with_bias("set_bias", bias_);
    assign_parameter("Conv2d", "bias", "[out_channels]", bias_, bias);
  }

  /// Visits "weight" (and "bias") with their gradients: the module protocol.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit);
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const;

  /// [N, C, H, W] → [N, O, Ho, Wo].
  /// @throws ShapeError naming x's shape if C differs or Ho or Wo would be ≤ 0.
  Shape<4> output_shape(const Shape<4>& x_shape) const;

  /// x: [N, C, H, W] → y: [N, O, Ho, Wo].
  template <TensorLike X>
  Tensor<Scalar, 4> forward(const X& x) const;

  /// x: [N, C, H, W], dy: [N, O, Ho, Wo] → dx: [N, C, H, W]; adds dW = Σ dyᵀ·cols, db = Σ dy.
  /// @throws ShapeError (gradients untouched) if x is refused by output_shape or dy's shape is
  ///         not forward(x)'s.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, 4> backward(const X& x, const DY& dy);

  /// im2col: x [N, C, H, W] → cols [N·Ho·Wo, C·kh·kw], row (n, i, j) holding the field of output
  /// pixel (i, j) of image n in weight order (c, u, v); padding reads as 0.
  /// @throws ShapeError as output_shape.
  template <TensorLike X>
  Tensor<Scalar, 2> im2col(const X& x) const;

 private:
  template <class T>
  T& with_bias(const char* accessor, T& tensor) const {
    if (!has_bias_) {
      throw Error(detail::concat("Conv2d::", accessor, ": this layer has no bias (bias=false)"));
    }
    return tensor;
  }
  /// Ho and Wo for x, or ShapeError naming `op` and x's shape.
  Pair output_size(const char* op, const Shape<4>& x_shape) const;
  void im2col_into(const ConstTensorView<Scalar, 4>& x, const Pair& out, Scalar* cols) const;
  void col2im_add(const Scalar* cols, const Pair& out, const TensorView<Scalar, 4>& dx) const;

  Pair stride_, padding_, dilation_;
  bool has_bias_;
  Tensor<Scalar, 4> weight_;
  Tensor<Scalar, 1> bias_;  // [O], or [0] without bias
  Tensor<Scalar, 4> weight_grad_;
  Tensor<Scalar, 1> bias_grad_;
};

/// "Conv2d(3, 16, kernel_size=(3, 3), stride=(1, 1), padding=(0, 0), dilation=(1, 1), bias=1)".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const Conv2d<Scalar>& conv);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline Pair require_pair(const char* field, Pair value, index_t minimum) {
  for (index_t v : value) {
    if (v < minimum) {
      throw ConfigError(concat("Conv2d: ", field, " must be ", minimum == 0 ? ">= 0" : "> 0",
                               " (got (", value[0], ", ", value[1], "))"));
    }
  }
  return value;
}

}  // namespace detail

template <class Scalar>
Conv2d<Scalar>::Conv2d(index_t in_channels, index_t out_channels, Pair kernel_size,
                       const Conv2dOptions& options)
    : stride_(detail::require_pair("stride", options.stride, 1)),
      padding_(detail::require_pair("padding", options.padding, 0)),
      dilation_(detail::require_pair("dilation", options.dilation, 1)),
      has_bias_(options.bias),
      weight_({require_positive("Conv2d", "out_channels", out_channels),
               require_positive("Conv2d", "in_channels", in_channels),
               detail::require_pair("kernel_size", kernel_size, 1)[0], kernel_size[1]}),
      bias_({options.bias ? out_channels : 0}),
      weight_grad_(weight_.shape()),
      bias_grad_(bias_.shape()) {
  // nn.Conv2d.reset_parameters: kaiming_uniform_(a=√5) gives the bound 1/√fan_in for W, and the
  // bias uses the same bound.
  Generator generator(options.seed ? *options.seed : next_default_seed());
  const double bound = 1.0 / std::sqrt(static_cast<double>(field_size()));
  fill_uniform(weight_.view(), -bound, bound, generator);
  fill_uniform(bias_.view(), -bound, bound, generator);
}

template <class Scalar>
template <class Visitor>
void Conv2d<Scalar>::for_each_parameter(Visitor&& visit) {
  visit(ParameterName("weight"), weight_.view(), weight_grad_.view());
  if (has_bias_) visit(ParameterName("bias"), bias_.view(), bias_grad_.view());
}

template <class Scalar>
template <class Visitor>
void Conv2d<Scalar>::for_each_parameter(Visitor&& visit) const {
  visit(ParameterName("weight"), weight_.cview(), weight_grad_.cview());
  if (has_bias_) visit(ParameterName("bias"), bias_.cview(), bias_grad_.cview());
}

template <class Scalar>
Pair Conv2d<Scalar>::output_size(const char* op, const Shape<4>& x_shape) const {
  if (x_shape[1] != in_channels()) {
    throw ShapeError(detail::concat(
        "Conv2d::", op, ": input channels ", x_shape[1], " != in_channels ", in_channels(),
        " (x: ", format_shape(x_shape), ", weight: ", format_shape(weight_.shape()), ")"));
  }
  Pair out{};
  for (std::size_t a = 0; a < 2; ++a) {
    // ⌊(H + 2p − d(k − 1) − 1)/s⌋ + 1 with a floor division: the numerator can be negative.
    const index_t numerator =
        x_shape[2 + a] + 2 * padding_[a] - dilation_[a] * (weight_.dim(2 + a) - 1) - 1;
    out[a] =
        (numerator >= 0 ? numerator / stride_[a] : -((-numerator + stride_[a] - 1) / stride_[a])) +
        1;
    if (out[a] <= 0) {
      throw ShapeError(detail::concat(
          "Conv2d::", op, ": output ", a == 0 ? "height" : "width", " would be ", out[a],
          " <= 0 (x: ", format_shape(x_shape), ", weight: ", format_shape(weight_.shape()),
          ", stride (", stride_[0], ", ", stride_[1], "), padding (", padding_[0], ", ",
          padding_[1], "), dilation (", dilation_[0], ", ", dilation_[1], "))"));
    }
  }
  return out;
}

template <class Scalar>
Shape<4> Conv2d<Scalar>::output_shape(const Shape<4>& x_shape) const {
  const Pair out = output_size("output_shape", x_shape);
  return {x_shape[0], out_channels(), out[0], out[1]};
}

template <class Scalar>
void Conv2d<Scalar>::im2col_into(const ConstTensorView<Scalar, 4>& x, const Pair& out,
                                 Scalar* cols) const {
  const index_t batch = x.dim(0), channels = x.dim(1), height = x.dim(2), width = x.dim(3);
  const index_t kh = weight_.dim(2), kw = weight_.dim(3), field = field_size();
  const Scalar* data = x.data();
  for (index_t n = 0; n < batch; ++n)
    for (index_t i = 0; i < out[0]; ++i)
      for (index_t j = 0; j < out[1]; ++j) {
        Scalar* row = cols + ((n * out[0] + i) * out[1] + j) * field;
        for (index_t c = 0; c < channels; ++c)
          for (index_t u = 0; u < kh; ++u) {
            const index_t h = i * stride_[0] - padding_[0] + u * dilation_[0];
            for (index_t v = 0; v < kw; ++v) {
              const index_t w = j * stride_[1] - padding_[1] + v * dilation_[1];
              const bool inside = h >= 0 && h < height && w >= 0 && w < width;
              *row++ = inside ? data[((n * channels + c) * height + h) * width + w] : Scalar(0);
            }
          }
      }
}

template <class Scalar>
void Conv2d<Scalar>::col2im_add(const Scalar* cols, const Pair& out,
                                const TensorView<Scalar, 4>& dx) const {
  // The transpose of im2col: each field entry adds into the pixel it was read from (fields
  // overlap when stride < kernel, so pixels accumulate); padding entries are dropped.
  const index_t batch = dx.dim(0), channels = dx.dim(1), height = dx.dim(2), width = dx.dim(3);
  const index_t kh = weight_.dim(2), kw = weight_.dim(3);
  Scalar* data = dx.data();
  for (index_t n = 0; n < batch; ++n)
    for (index_t i = 0; i < out[0]; ++i)
      for (index_t j = 0; j < out[1]; ++j)
        for (index_t c = 0; c < channels; ++c)
          for (index_t u = 0; u < kh; ++u) {
            const index_t h = i * stride_[0] - padding_[0] + u * dilation_[0];
            for (index_t v = 0; v < kw; ++v, ++cols) {
              const index_t w = j * stride_[1] - padding_[1] + v * dilation_[1];
              if (h >= 0 && h < height && w >= 0 && w < width) {
                data[((n * channels + c) * height + h) * width + w] += *cols;
              }
            }
          }
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, 2> Conv2d<Scalar>::im2col(const X& x) const {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  const Pair out = output_size("im2col", input.shape());
  auto cols = Tensor<Scalar, 2>::uninitialized(
      {checked_product({input.dim(0), out[0], out[1]}, "Conv2d::im2col rows"), field_size()});
  im2col_into(input, out, cols.data());
  return cols;
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, 4> Conv2d<Scalar>::forward(const X& x) const {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  const Pair out = output_size("forward", input.shape());
  const index_t batch = input.dim(0), pixels = out[0] * out[1], channels = out_channels();
  // One column buffer for the whole batch, so the GEMM runs once over N·Ho·Wo rows.
  const auto cols = im2col(input);
  auto rows = Tensor<Scalar, 2>::uninitialized({batch * pixels, channels});
  const ConstMatrixMap<Scalar> w(weight_.data(), channels, field_size());
  std::optional<ConstVectorMap<Scalar>> b;
  if (has_bias_) b.emplace(bias_.data(), channels);
  linear_forward<Scalar>(cols.matrix(), w, b, rows.matrix());
  // rows is [N, Ho·Wo, O]; torch's layout is [N, O, Ho, Wo]: transpose each image's block.
  auto y = Tensor<Scalar, 4>::uninitialized({batch, channels, out[0], out[1]});
  for (index_t n = 0; n < batch; ++n) {
    MatrixMap<Scalar>(y.data() + n * channels * pixels, channels, pixels) =
        rows.matrix().middleRows(n * pixels, pixels).transpose();
  }
  return y;
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, 4> Conv2d<Scalar>::backward(const X& x, const DY& dy) {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  const auto input = const_view(x);
  const auto upstream = const_view(dy);
  const Pair out = output_size("backward", input.shape());
  const Shape<4> y_shape{input.dim(0), out_channels(), out[0], out[1]};
  if (upstream.shape() != y_shape) {
    throw ShapeError(detail::concat("Conv2d::backward: dy has shape ",
                                    format_shape(upstream.shape()), " but forward(x) has shape ",
                                    format_shape(y_shape), " (x: ", format_shape(input.shape()),
                                    ")"));
  }
  const index_t batch = input.dim(0), pixels = out[0] * out[1], channels = out_channels();
  const auto cols = im2col(input);
  // dy in GEMM rows: [N·Ho·Wo, O], the transpose of each image's [O, Ho·Wo] block.
  auto dy_rows = Tensor<Scalar, 2>::uninitialized({batch * pixels, channels});
  for (index_t n = 0; n < batch; ++n) {
    dy_rows.matrix().middleRows(n * pixels, pixels) =
        ConstMatrixMap<Scalar>(upstream.data() + n * channels * pixels, channels, pixels)
            .transpose();
  }
  auto dcols = Tensor<Scalar, 2>::uninitialized(cols.shape());
  const ConstMatrixMap<Scalar> w(weight_.data(), channels, field_size());
  MatrixMap<Scalar> dw(weight_grad_.data(), channels, field_size());
  std::optional<VectorMap<Scalar>> db;
  if (has_bias_) db.emplace(bias_grad_.data(), channels);
  linear_backward<Scalar>(cols.matrix(), w, dy_rows.matrix(), dcols.matrix(), dw, db);
  Tensor<Scalar, 4> dx(input.shape());  // zero-filled: col2im adds
  col2im_add(dcols.data(), out, dx.view());
  return dx;
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const Conv2d<Scalar>& conv) {
  const auto pair = [&](const char* name, Pair p) {
    out << ", " << name << "=(" << p[0] << ", " << p[1] << ")";
  };
  out << "Conv2d(" << conv.in_channels() << ", " << conv.out_channels();
  const Pair k = conv.kernel_size();
  out << ", kernel_size=(" << k[0] << ", " << k[1] << ")";
  pair("stride", conv.stride());
  pair("padding", conv.padding());
  pair("dilation", conv.dilation());
  return out << ", bias=" << conv.has_bias() << ")";
}

}  // namespace dissect
