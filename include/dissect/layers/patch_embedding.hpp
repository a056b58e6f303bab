// dissect/layers/patch_embedding.hpp — ViT's patch embedding: an image as a sequence of tokens.
//
// ViT (Dosovitskiy et al. 2020; timm's PatchEmbed) cuts an image into P×P patches and maps each
// to a D-wide token with a Conv2d whose stride equals its kernel: x [N, C, H, W] →
// proj(x) [N, D, H/P, W/P] → flatten(2).transpose(1, 2) → [N, (H/P)·(W/P), D]. Because the
// fields of such a convolution do not overlap, it is exactly a Linear over the flattened patches,
// patchify(x, P)·Wᵀ + b with W = proj.weight viewed as [D, C·P·P]: the series' point.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <utility>

#include "dissect/core/error.hpp"
#include "dissect/layers/conv2d.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

struct PatchEmbeddingOptions {
  bool bias = true;
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// x: [N, C, H, W] → patches [N, (H/P)·(W/P), C·P·P], patch (a, b) of image n at row
/// a·(W/P) + b, its values in (channel, row, column) order: the order of proj.weight's last axes.
/// @throws ConfigError if P ≤ 0; ShapeError naming x's shape if H or W is not a multiple of P.
template <TensorLike X>
Tensor<scalar_of<X>, 3> patchify(const X& x, index_t patch_size);

/// ViT's PatchEmbed: proj = Conv2d(C, D, kernel = stride = P), state_dict "proj.weight" [D, C, P,
/// P] and "proj.bias" [D], as timm names them.
template <class Scalar>
class PatchEmbedding : public ParameterMethods<PatchEmbedding<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// @throws ConfigError naming the field if a size is ≤ 0.
  PatchEmbedding(index_t in_channels, index_t embed_dim, index_t patch_size,
                 const PatchEmbeddingOptions& options = {})
      : proj_(in_channels, embed_dim,
              {require_positive("PatchEmbedding", "patch_size", patch_size), patch_size},
              {.stride = {patch_size, patch_size}, .bias = options.bias, .seed = options.seed}) {}

  index_t patch_size() const { return proj_.kernel_size()[0]; }
  index_t embed_dim() const { return proj_.out_channels(); }
  index_t in_channels() const { return proj_.in_channels(); }
  Conv2d<Scalar>& proj() { return proj_; }
  const Conv2d<Scalar>& proj() const { return proj_; }

  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit_child("proj", proj_, visit);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    visit_child("proj", proj_, visit);
  }

  /// x: [N, C, H, W] → tokens [N, (H/P)·(W/P), D].
  /// @throws ShapeError naming x's shape if C differs or H or W is not a multiple of P.
  template <TensorLike X>
  Tensor<Scalar, 3> forward(const X& x) const;

  /// x: [N, C, H, W], dy: [N, (H/P)·(W/P), D] → dx: [N, C, H, W]; adds to proj's gradients.
  /// @throws ShapeError (gradients untouched) as forward, or if dy's shape is not forward(x)'s.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, 4> backward(const X& x, const DY& dy);

 private:
  /// H/P·W/P, after checking x against the patch grid.
  template <class View>
  index_t patch_count(const char* op, const View& x) const;

  Conv2d<Scalar> proj_;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline void check_patch_grid(const char* op, const Shape<4>& x_shape, index_t patch_size) {
  if (x_shape[2] % patch_size != 0 || x_shape[3] % patch_size != 0) {
    throw ShapeError(concat(op, ": image ", x_shape[2], "x", x_shape[3],
                            " is not a whole number of ", patch_size, "x", patch_size,
                            " patches (x: ", format_shape(x_shape), ")"));
  }
}

}  // namespace detail

template <TensorLike X>
Tensor<scalar_of<X>, 3> patchify(const X& x, index_t patch_size) {
  using Scalar = scalar_of<X>;
  static_assert(rank_of<X> == 4, "dissect::patchify: x must be [N, C, H, W]");
  const auto input = const_view(x);
  require_positive("patchify", "patch_size", patch_size);
  detail::check_patch_grid("patchify", input.shape(), patch_size);
  const index_t batch = input.dim(0), channels = input.dim(1), height = input.dim(2),
                width = input.dim(3);
  const index_t rows = height / patch_size, cols = width / patch_size;
  auto patches = Tensor<Scalar, 3>::uninitialized(
      {batch, rows * cols,
       checked_product({channels, patch_size, patch_size}, "patchify patch size")});
  Scalar* out = patches.data();
  for (index_t n = 0; n < batch; ++n)
    for (index_t a = 0; a < rows; ++a)
      for (index_t b = 0; b < cols; ++b)
        for (index_t c = 0; c < channels; ++c)
          for (index_t u = 0; u < patch_size; ++u)
            for (index_t v = 0; v < patch_size; ++v)
              *out++ = input(n, c, a * patch_size + u, b * patch_size + v);
  return patches;
}

template <class Scalar>
template <class View>
index_t PatchEmbedding<Scalar>::patch_count(const char* op, const View& x) const {
  if (x.dim(1) != in_channels()) {
    throw ShapeError(detail::concat(op, ": input channels ", x.dim(1), " != in_channels ",
                                    in_channels(), " (x: ", format_shape(x.shape()),
                                    ", proj.weight: ", format_shape(proj_.weight().shape()), ")"));
  }
  detail::check_patch_grid(op, x.shape(), patch_size());
  return (x.dim(2) / patch_size()) * (x.dim(3) / patch_size());
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, 3> PatchEmbedding<Scalar>::forward(const X& x) const {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  const index_t patches = patch_count("PatchEmbedding::forward", input);
  const auto y = proj_.forward(input);  // [N, D, H/P, W/P]
  // flatten(2).transpose(1, 2): each image's [D, patches] block becomes [patches, D].
  const index_t batch = input.dim(0), width = embed_dim();
  auto tokens = Tensor<Scalar, 3>::uninitialized({batch, patches, width});
  for (index_t n = 0; n < batch; ++n) {
    MatrixMap<Scalar>(tokens.data() + n * patches * width, patches, width) =
        ConstMatrixMap<Scalar>(y.data() + n * width * patches, width, patches).transpose();
  }
  return tokens;
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, 4> PatchEmbedding<Scalar>::backward(const X& x, const DY& dy) {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  static_assert(rank_of<DY> == 3, "dissect::PatchEmbedding::backward: dy must be [N, patches, D]");
  const auto input = const_view(x);
  const auto upstream = const_view(dy);
  const index_t patches = patch_count("PatchEmbedding::backward", input);
  const index_t batch = input.dim(0), width = embed_dim();
  const Shape<3> expected{batch, patches, width};
  if (upstream.shape() != expected) {
    throw ShapeError(detail::concat("PatchEmbedding::backward: dy has shape ",
                                    format_shape(upstream.shape()), " but forward(x) has shape ",
                                    format_shape(expected), " (x: ", format_shape(input.shape()),
                                    ")"));
  }
  auto dy_image = Tensor<Scalar, 4>::uninitialized(
      {batch, width, input.dim(2) / patch_size(), input.dim(3) / patch_size()});
  for (index_t n = 0; n < batch; ++n) {
    MatrixMap<Scalar>(dy_image.data() + n * width * patches, width, patches) =
        ConstMatrixMap<Scalar>(upstream.data() + n * patches * width, patches, width).transpose();
  }
  return proj_.backward(input, dy_image);
}

/// "PatchEmbedding(3, 768, patch_size=16)".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const PatchEmbedding<Scalar>& embedding) {
  return out << "PatchEmbedding(" << embedding.in_channels() << ", " << embedding.embed_dim()
             << ", patch_size=" << embedding.patch_size() << ")";
}

}  // namespace dissect
