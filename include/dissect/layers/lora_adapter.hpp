// dissect/layers/lora_adapter.hpp — the low-rank update of LoRA (Hu et al. 2021): ΔW = (α/r)·B·A.
//
// A [r, in] and B [out, r] are the only trainable parameters of an adapted layer; its frozen base
// W never changes. Applied to x [M, in] the update adds (α/r)·(x·Aᵀ)·Bᵀ to y [M, out] without
// ever forming ΔW: 2·M·r·(in + out) FLOPs instead of 2·M·in·out. Initialisation and names follow
// Hugging Face PEFT: A Kaiming-uniform (nn.Linear's default, bound 1/√in), B zero, so an adapted
// layer starts equal to its base; the parameters are "lora_A.weight" and "lora_B.weight".
//
// This header holds the arithmetic, written once: Linear carries an adapter for adapted models
// (linear.hpp), LoRALinear wraps any frozen base with one (lora.hpp), and both keep a LoRAMerge
// while merged, so that A and B changed behind their backs never corrupt the base.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>

#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// An adapter's hyper-parameters, PEFT's LoraConfig defaults.
struct LoRAOptions {
  index_t rank = 8;    ///< r ≥ 1
  double alpha = 8;    ///< the update is scaled by alpha / rank; finite, ≠ 0
  double dropout = 0;  ///< on the adapter's input, in [0, 1); applied only by LoRALinear's
                       ///< training forward (forward with a cache)
  /// Seed of A's initialisation (and of LoRALinear's dropout); when empty, the next of the
  /// sequence manual_seed() sets.
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// Checks an adapter's options (a rank above min(in, out) is allowed, as PEFT allows it).
/// @throws ConfigError naming `op` and the field: rank < 1, alpha zero or not finite, dropout
///         outside [0, 1).
void check_lora_options(std::string_view op, const LoRAOptions& options);

/// The trainable half of a LoRA layer: A [r, in], B [out, r], their gradients, and the scale.
template <class Scalar>
class LoRAAdapter : public ParameterMethods<LoRAAdapter<Scalar>> {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::LoRAAdapter<Scalar>: Scalar must be float or double");

 public:
  using scalar_type = Scalar;

  /// A fresh adapter for a layer in → out: A Kaiming-uniform, B zero (ΔW = 0).
  /// @throws ConfigError as check_lora_options; ShapeError for a negative feature count.
  LoRAAdapter(index_t in_features, index_t out_features, LoRAOptions options = {});

  index_t in_features() const { return a_.shape()[1]; }
  index_t out_features() const { return b_.shape()[0]; }
  index_t rank() const { return a_.shape()[0]; }
  double alpha() const { return options_.alpha; }
  double dropout() const { return options_.dropout; }
  const LoRAOptions& options() const { return options_; }
  /// α / r, in the layer's precision (PEFT's `scaling`).
  Scalar scale() const { return static_cast<Scalar>(options_.alpha / static_cast<double>(rank())); }

  /// A [r, in] and B [out, r]: values writable, buffers fixed for the adapter's life.
  TensorView<Scalar, 2> A() { return a_.view(); }
  ConstTensorView<Scalar, 2> A() const { return a_.cview(); }
  TensorView<Scalar, 2> B() { return b_.view(); }
  ConstTensorView<Scalar, 2> B() const { return b_.cview(); }
  TensorView<Scalar, 2> A_grad() { return a_grad_.view(); }
  ConstTensorView<Scalar, 2> A_grad() const { return a_grad_.cview(); }
  TensorView<Scalar, 2> B_grad() { return b_grad_.view(); }
  ConstTensorView<Scalar, 2> B_grad() const { return b_grad_.cview(); }
  /// @throws ShapeError naming the matrix if the shape differs.
  void set_A(ConstTensorView<Scalar, 2> a);
  void set_B(ConstTensorView<Scalar, 2> b);

  /// Visits "lora_A.weight" and "lora_B.weight" with their gradients.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit);
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const;

  /// ΔW = (α/r)·B·A [out, in].
  Tensor<Scalar, 2> delta_weight() const;
  /// weight += sign·ΔW: merging (sign = 1) and unmerging (sign = −1) a float base.
  /// @throws ShapeError if weight is not [out, in].
  void add_delta_to(TensorView<Scalar, 2> weight, Scalar sign) const;

  /// y [M, out] += (α/r)·(x·Aᵀ)·Bᵀ for x [M, in]. The callers check the shapes.
  void forward_add(const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> y) const;
  /// For y = base(x) + forward_add's term and its upstream dy [M, out]: dB += (α/r)·dyᵀ·(x·Aᵀ),
  /// dA += (α/r)·(dy·B)ᵀ·x, and, when dx is given, dx [M, in] += (α/r)·(dy·B)·A.
  void backward_add(const ConstMatrixRef<Scalar>& x, const ConstMatrixRef<Scalar>& dy,
                    std::optional<MatrixRef<Scalar>> dx);

 private:
  LoRAOptions options_;
  Tensor<Scalar, 2> a_;  // [r, in]
  Tensor<Scalar, 2> b_;  // [out, r]
  Tensor<Scalar, 2> a_grad_;
  Tensor<Scalar, 2> b_grad_;
};

/// What merging an adapter into a float weight added, kept until it is taken out again: copies of
/// A and B as they were merged (r·(in + out) values, next to the layer's in·out). A and B stay
/// writable while merged, and an optimizer, load_adapters, load_state_dict or a write through
/// A() can change them behind the layer's back; with this record the layer stays right anyway:
/// forward adds the difference between the adapter's term now and the merged one, and unmerging
/// subtracts exactly the ΔW that merging added (never that of the changed A and B).
template <class Scalar>
class LoRAMerge {
 public:
  /// weight += ΔW of `adapter` (as add_delta_to), remembering A and B.
  /// @throws ShapeError if weight is not [out, in] (nothing changes).
  LoRAMerge(const LoRAAdapter<Scalar>& adapter, TensorView<Scalar, 2> weight);

  /// weight −= the ΔW that was merged.
  void undo(TensorView<Scalar, 2> weight) const;
  /// Whether `adapter`'s A or B differ from what was merged (bitwise: a cheap compare of
  /// r·(in + out) values, against forward's M·in·out products).
  bool stale(const LoRAAdapter<Scalar>& adapter) const;
  /// y [M, out] += s·(x·Aᵀ)·Bᵀ − s·(x·A₀ᵀ)·B₀ᵀ when `adapter` changed since the merge, so that
  /// forward on the merged weight equals the adapted forward of A and B as they are now.
  void forward_add_change(const LoRAAdapter<Scalar>& adapter, const ConstMatrixRef<Scalar>& x,
                          MatrixRef<Scalar> y) const;

 private:
  Tensor<Scalar, 2> a_;  // A and B as merged
  Tensor<Scalar, 2> b_;
  Scalar scale_;
};

// ---- implementation -----------------------------------------------------------------------------

namespace detail {
/// weight += factor·(B·A): B·A first, then one scaling, PEFT's (B @ A) * scaling, so that a merge
/// rounds as PEFT's does and an unmerge subtracts the very same product.
template <class Scalar>
void add_lora_product(TensorView<Scalar, 2> weight, const Tensor<Scalar, 2>& a,
                      const Tensor<Scalar, 2>& b, Scalar factor) {
  const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> product =
      b.matrix() * a.matrix();
  weight.matrix() += factor * product;
}
}  // namespace detail

inline void check_lora_options(std::string_view op, const LoRAOptions& options) {
  require_positive(op, "LoRAOptions.rank", options.rank);
  if (!std::isfinite(options.alpha) || options.alpha == 0) {
    throw ConfigError(detail::concat(op, ": LoRAOptions.alpha must be finite and non-zero (got ",
                                     options.alpha, ")"));
  }
  if (!(options.dropout >= 0 && options.dropout < 1)) {
    throw ConfigError(
        detail::concat(op, ": LoRAOptions.dropout must be in [0, 1) (got ", options.dropout, ")"));
  }
}

template <class Scalar>
LoRAAdapter<Scalar>::LoRAAdapter(index_t in_features, index_t out_features, LoRAOptions options)
    : options_((check_lora_options("LoRAAdapter", options),
                check_extents(Shape<2>{out_features, in_features}, "LoRAAdapter [out, in]"),
                options)),
      a_({options.rank, in_features}),
      b_({out_features, options.rank}),
      a_grad_(a_.shape()),
      b_grad_(b_.shape()) {
  // PEFT: nn.init.kaiming_uniform_(A, a=√5), which is nn.Linear's default weight init; B = 0.
  Generator generator(options.seed ? *options.seed : next_default_seed());
  init_linear(a_.view(), std::optional<TensorView<Scalar, 1>>(), InitScheme::pytorch_default,
              generator);
}

template <class Scalar>
void LoRAAdapter<Scalar>::set_A(ConstTensorView<Scalar, 2> a) {
  assign_parameter("LoRAAdapter", "A", "[rank, in_features]", a_, a);
}

template <class Scalar>
void LoRAAdapter<Scalar>::set_B(ConstTensorView<Scalar, 2> b) {
  assign_parameter("LoRAAdapter", "B", "[out_features, rank]", b_, b);
}

template <class Scalar>
template <class Visitor>
void LoRAAdapter<Scalar>::for_each_parameter(Visitor&& visit) {
  visit(ParameterName("weight").under("lora_A"), a_.view(), a_grad_.view());
  visit(ParameterName("weight").under("lora_B"), b_.view(), b_grad_.view());
}

template <class Scalar>
template <class Visitor>
void LoRAAdapter<Scalar>::for_each_parameter(Visitor&& visit) const {
  visit(ParameterName("weight").under("lora_A"), a_.cview(), a_grad_.cview());
  visit(ParameterName("weight").under("lora_B"), b_.cview(), b_grad_.cview());
}

template <class Scalar>
Tensor<Scalar, 2> LoRAAdapter<Scalar>::delta_weight() const {
  Tensor<Scalar, 2> delta({out_features(), in_features()});
  add_delta_to(delta.view(), Scalar(1));
  return delta;
}

template <class Scalar>
void LoRAAdapter<Scalar>::add_delta_to(TensorView<Scalar, 2> weight, Scalar sign) const {
  const Shape<2> expected{out_features(), in_features()};
  if (weight.shape() != expected) {
    throw ShapeError(detail::concat(
        "LoRAAdapter::add_delta_to: weight must be [out, in] = ", format_shape(expected), ", got ",
        format_shape(weight.shape())));
  }
  detail::add_lora_product(weight, a_, b_, sign * scale());
}

template <class Scalar>
void LoRAAdapter<Scalar>::forward_add(const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> y) const {
  // h = x·Aᵀ [M, r] is the whole extra memory: r values per token.
  const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> h =
      x * a_.matrix().transpose();
  y.noalias() += scale() * (h * b_.matrix().transpose());
}

template <class Scalar>
void LoRAAdapter<Scalar>::backward_add(const ConstMatrixRef<Scalar>& x,
                                       const ConstMatrixRef<Scalar>& dy,
                                       std::optional<MatrixRef<Scalar>> dx) {
  using Matrix = Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Matrix h = x * a_.matrix().transpose();                  // [M, r], recomputed: cheap
  const Matrix dh = scale() * (dy * b_.matrix());                // [M, r]
  b_grad_.matrix().noalias() += scale() * (dy.transpose() * h);  // [out, r]
  a_grad_.matrix().noalias() += dh.transpose() * x;              // [r, in]
  if (dx) dx->noalias() += dh * a_.matrix();
}

// ---- a merge ------------------------------------------------------------------------------------

template <class Scalar>
LoRAMerge<Scalar>::LoRAMerge(const LoRAAdapter<Scalar>& adapter, TensorView<Scalar, 2> weight)
    : a_(adapter.A()), b_(adapter.B()), scale_(adapter.scale()) {
  adapter.add_delta_to(weight, Scalar(1));  // checks the shape before writing
}

template <class Scalar>
void LoRAMerge<Scalar>::undo(TensorView<Scalar, 2> weight) const {
  detail::add_lora_product(weight, a_, b_, -scale_);
}

template <class Scalar>
bool LoRAMerge<Scalar>::stale(const LoRAAdapter<Scalar>& adapter) const {
  return !std::equal(a_.begin(), a_.end(), adapter.A().begin()) ||
         !std::equal(b_.begin(), b_.end(), adapter.B().begin());
}

template <class Scalar>
void LoRAMerge<Scalar>::forward_add_change(const LoRAAdapter<Scalar>& adapter,
                                           const ConstMatrixRef<Scalar>& x,
                                           MatrixRef<Scalar> y) const {
  if (!stale(adapter)) return;
  adapter.forward_add(x, y);
  const Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> h =
      x * a_.matrix().transpose();
  y.noalias() -= scale_ * (h * b_.matrix().transpose());
}

// ---- on a Linear --------------------------------------------------------------------------------

namespace detail {

/// Linear's adapter members (a friend of Linear): attaching, detaching, merging, and the calls
/// forward, backward and the module protocol make while an adapter is attached.
template <class Scalar>
struct LinearLoRADoor {
  using Layer = Linear<Scalar>;

  static LoRAAdapter<Scalar>& attach(Layer& layer, LoRAOptions options) {
    check_lora_options("Linear::attach_adapter", options);
    return attach_given(layer,
                        LoRAAdapter<Scalar>(layer.in_features(), layer.out_features(), options));
  }

  static LoRAAdapter<Scalar>& attach_given(Layer& layer, LoRAAdapter<Scalar> adapter) {
    if (layer.adapter_) {
      throw Error("Linear::attach_adapter: this layer already has a LoRA adapter");
    }
    layer.require_not_bitlinear("attach_adapter");
    (void)layer.dense("attach_adapter");  // backward's dx = dy·W needs W
    if (adapter.in_features() != layer.in_features() ||
        adapter.out_features() != layer.out_features()) {
      throw ShapeError(concat("Linear::attach_adapter: adapter A ",
                              format_shape(adapter.A().shape()), ", B ",
                              format_shape(adapter.B().shape()), " does not fit weight [",
                              layer.out_features(), ", ", layer.in_features(), "]"));
    }
    layer.set_frozen(true);
    layer.adapter_ = Boxed<LoRAAdapter<Scalar>>::make(std::move(adapter));
    layer.adapter_calls_ = &calls;
    layer.merge_.reset();
    ++layer.weight_generation_;
    return *layer.adapter_.get();
  }

  static LoRAAdapter<Scalar> detach(Layer& layer) {
    LoRAAdapter<Scalar>& attached = layer.with_adapter("detach_adapter");
    if (layer.merge_ && layer.merge_.get()->stale(attached)) {
      // A or B changed since the merge: W keeps the update forward has been computing.
      layer.merge_.get()->undo(layer.weight_.view());
      attached.add_delta_to(layer.weight_.view(), Scalar(1));
      layer.weight_changed();
    }
    LoRAAdapter<Scalar> adapter = std::move(attached);
    layer.adapter_.reset();
    layer.adapter_calls_ = nullptr;
    layer.merge_.reset();
    ++layer.weight_generation_;
    return adapter;
  }

  static void merge(Layer& layer) {
    const LoRAAdapter<Scalar>& adapter = layer.with_adapter("merge_adapter");
    if (layer.merge_) throw Error("Linear::merge_adapter: the adapter is already merged");
    layer.require_not_quantized("merge_adapter");
    if (!layer.frozen_) {
      throw Error(
          "Linear::merge_adapter: the weight is trainable (set_frozen(false)), and an optimizer "
          "would move the merged weight; freeze the layer first");
    }
    layer.merge_ = Boxed<LoRAMerge<Scalar>>::make(LoRAMerge<Scalar>(adapter, layer.weight_.view()));
    layer.weight_changed();
  }

  static void unmerge(Layer& layer) {
    layer.with_adapter("unmerge_adapter");
    if (!layer.merge_) throw Error("Linear::unmerge_adapter: the adapter is not merged");
    layer.merge_.get()->undo(layer.weight_.view());  // what merge added, even if A or B changed
    layer.merge_.reset();
    layer.weight_changed();
  }

  static void forward(const Layer& layer, const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> y) {
    const LoRAAdapter<Scalar>& adapter = *layer.adapter_.get();
    if (const LoRAMerge<Scalar>* merged = layer.merge_.get()) {
      merged->forward_add_change(adapter, x, y);
    } else {
      adapter.forward_add(x, y);
    }
  }
  static void backward(Layer& layer, const ConstMatrixRef<Scalar>& x,
                       const ConstMatrixRef<Scalar>& dy, std::optional<MatrixRef<Scalar>> dx) {
    layer.adapter_.get()->backward_add(x, dy, dx);
  }
  static std::string describe(const Layer& layer) {
    const LoRAAdapter<Scalar>& adapter = *layer.adapter_.get();
    return concat(", lora_rank=", adapter.rank(), ", lora_alpha=", adapter.alpha(),
                  layer.merge_ ? ", merged" : "");
  }
  static bool adds_to_forward(const Layer& layer) {
    return !layer.merge_ || layer.merge_.get()->stale(*layer.adapter_.get());
  }
  static std::array<ModeParameter<Scalar>, 2> parameters(const Layer& layer) {
    // The module protocol's const visit reads these as const views (Linear::for_each_parameter).
    LoRAAdapter<Scalar>& adapter = *layer.adapter_.get();
    return {ModeParameter<Scalar>{"lora_A", adapter.A(), adapter.A_grad()},
            ModeParameter<Scalar>{"lora_B", adapter.B(), adapter.B_grad()}};
  }

  static constexpr LinearModeCalls<Scalar> calls{
      .forward = &forward,
      .backward = &backward,
      .describe = &describe,
      .weight_bytes = nullptr,
      .adds_to_forward = &adds_to_forward,
      .parameters = &parameters,
  };
};

}  // namespace detail

}  // namespace dissect
