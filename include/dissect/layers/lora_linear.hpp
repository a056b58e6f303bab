// dissect/layers/lora_linear.hpp — LoRALinear: a frozen layer plus a trainable low-rank update.
//
// LoRALinear is the module of the paper and of PEFT's lora.Linear: y = base(x) + (α/r)·(x'·Aᵀ)·Bᵀ
// with x' = dropout(x) while training. Its parameters are A and B alone; the base is frozen, so it
// keeps no gradient and backward computes its dx only. The same to a whole model, without
// changing its type: apply_lora (transforms/lora.hpp). Saving adapters alone, with PEFT's names:
// io/lora_file.hpp. The arithmetic is in lora_adapter.hpp, once.
//
// Which door: to adapt a layer or a model, attach the adapter to the Linear itself
// (Linear::attach_adapter, layers/lora_adapter.hpp; apply_lora for a whole model): the model keeps
// its type, and merging, quantised bases (QLoRA) and saving work there. LoRALinear is the
// standalone module for code written against PEFT's lora.Linear, and the one place with adapter
// dropout in training; it holds the same LoRAAdapter, so both compute the same numbers.
#pragma once

#include <Eigen/Core>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/layers/lora_adapter.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// A frozen Linear with a LoRA adapter: PEFT's lora.Linear.
template <class Scalar>
class LoRALinear : public ParameterMethods<LoRALinear<Scalar>> {
 public:
  using scalar_type = Scalar;

  /// What the training forward keeps for backward: the dropout mask, [M, in] of 0 and 1/(1 − p)
  /// (empty without dropout), and how many masks this cache has drawn.
  struct Cache {
    Tensor<Scalar, 2> keep{Shape<2>{0, 0}};
    std::uint64_t draws = 0;
  };

  /// Adapts `base` (which is frozen) with a fresh adapter: A Kaiming-uniform, B zero.
  /// @throws ConfigError for bad options (check_lora_options); Error if base already has an
  ///         adapter of its own.
  explicit LoRALinear(Linear<Scalar> base, LoRAOptions options = {});

  index_t in_features() const { return base_.in_features(); }
  index_t out_features() const { return base_.out_features(); }
  /// The frozen layer (W and b; its weight holds ΔW while merged).
  const Linear<Scalar>& base() const { return base_; }
  LoRAAdapter<Scalar>& adapter() { return adapter_; }
  const LoRAAdapter<Scalar>& adapter() const { return adapter_; }

  /// Visits "lora_A.weight" and "lora_B.weight" only: the base is not trainable.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    adapter_.for_each_parameter(visit);
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    adapter_.for_each_parameter(visit);
  }

  template <std::size_t Rank>
  Shape<Rank> output_shape(const Shape<Rank>& x_shape) const {
    return base_.output_shape(x_shape);
  }

  /// Inference (PEFT's eval mode, no dropout): [..., in] → [..., out].
  /// @throws ShapeError as Linear::forward.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;

  /// Training: as forward, with dropout on the adapter's input when options.dropout > 0. Each
  /// call draws a new mask from the layer's seed and cache.draws, so a run is reproducible.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x, Cache& cache) const;

  /// x and cache from forward(x, cache), dy [..., out] → dx; adds into dA and dB only.
  /// @throws ShapeError (nothing touched) if the shapes or the cache do not fit; Error while
  ///         merged.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const Cache& cache, const DY& dy);
  /// The gradient of forward(x) (no dropout).
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const DY& dy);

  /// W += ΔW: forward then costs one product. unmerge restores W up to the rounding of the two
  /// additions. As Linear::merge_adapter, the layer remembers what it merged (LoRAMerge): a
  /// change of A or B while merged (an optimizer step) is added by forward, and unmerge takes out
  /// exactly what merge put in. A packed base repacks.
  /// @throws Error if already merged (unmerge: if not merged), or if the base is quantised.
  void merge();
  void unmerge();
  bool merged() const { return merge_.has_value(); }

 private:
  void check_not_merged(const char* op) const;
  /// x ⊙ keep, the adapter's input under dropout.
  template <std::size_t Rank>
  static Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> dropped(
      const ConstTensorView<Scalar, Rank>& x, const Tensor<Scalar, 2>& keep);

  Linear<Scalar> base_;
  LoRAAdapter<Scalar> adapter_;
  std::uint64_t dropout_seed_;
  /// What merge added to the base's W, while merged.
  std::optional<LoRAMerge<Scalar>> merge_;
};

// ---- implementation -----------------------------------------------------------------------------

template <class Scalar>
LoRALinear<Scalar>::LoRALinear(Linear<Scalar> base, LoRAOptions options)
    : base_(std::move(base)),
      adapter_(base_.in_features(), base_.out_features(), options),
      dropout_seed_(options.seed ? *options.seed + 1 : next_default_seed()) {
  if (base_.has_adapter()) {
    throw Error("LoRALinear: the base layer already carries a LoRA adapter");
  }
  base_.set_frozen(true);
}

template <class Scalar>
void LoRALinear<Scalar>::check_not_merged(const char* op) const {
  if (merge_) {
    throw Error(detail::concat("LoRALinear::", op,
                               ": the adapter is merged into the weight; unmerge it to train"));
  }
}

template <class Scalar>
template <std::size_t Rank>
Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> LoRALinear<Scalar>::dropped(
    const ConstTensorView<Scalar, Rank>& x, const Tensor<Scalar, 2>& keep) {
  return x.matrix().cwiseProduct(keep.matrix());
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> LoRALinear<Scalar>::forward(const X& x) const {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  auto y = base_.forward(input);
  if (merge_) {
    merge_->forward_add_change(adapter_, input.matrix(), y.matrix());
  } else {
    adapter_.forward_add(input.matrix(), y.matrix());
  }
  return y;
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> LoRALinear<Scalar>::forward(const X& x, Cache& cache) const {
  require_layer_scalar<Scalar, X>();
  check_not_merged("forward");
  const auto input = const_view(x);
  auto y = base_.forward(input);  // checks x
  const double p = adapter_.dropout();
  if (p == 0) {
    adapter_.forward_add(input.matrix(), y.matrix());
    return y;
  }
  // Inverted dropout, as nn.Dropout: kept inputs are scaled by 1/(1 − p) so the expectation of
  // the adapter's input is x. One generator per draw: reproducible and independent of threads.
  const Shape<2> rows{leading_count(input.shape()), in_features()};
  auto keep = reuse_buffer(cache.keep, rows);
  Generator generator(dropout_seed_ + 0x9E3779B97F4A7C15ull * (cache.draws + 1));
  ++cache.draws;
  const Scalar kept = static_cast<Scalar>(1.0 / (1.0 - p));
  for (index_t i = 0; i < keep.size(); ++i) {
    keep.data()[i] = generator.uniform() < p ? Scalar(0) : kept;
  }
  adapter_.forward_add(dropped(input, cache.keep), y.matrix());
  return y;
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> LoRALinear<Scalar>::backward(const X& x, const Cache& cache,
                                                        const DY& dy) {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  if (adapter_.dropout() == 0) return backward(x, dy);
  check_not_merged("backward");
  const auto input = const_view(x);
  const Shape<2> rows{leading_count(input.shape()), in_features()};
  if (cache.keep.shape() != rows) {
    throw ShapeError(detail::concat("LoRALinear::backward: the cache holds a dropout mask ",
                                    format_shape(cache.keep.shape()), ", x needs ",
                                    format_shape(rows), " (fill it with forward(x, cache))"));
  }
  auto dx = base_.backward(input, dy);  // checks x and dy; the frozen base: dx only
  Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> d_dropped =
      Eigen::Matrix<Scalar, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>::Zero(rows[0],
                                                                                   rows[1]);
  adapter_.backward_add(dropped(input, cache.keep), const_view(dy).matrix(), d_dropped);
  dx.matrix() += d_dropped.cwiseProduct(cache.keep.matrix());
  return dx;
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> LoRALinear<Scalar>::backward(const X& x, const DY& dy) {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  check_not_merged("backward");
  const auto input = const_view(x);
  auto dx = base_.backward(input, dy);
  adapter_.backward_add(input.matrix(), const_view(dy).matrix(), dx.matrix());
  return dx;
}

template <class Scalar>
void LoRALinear<Scalar>::merge() {
  if (merge_) throw Error("LoRALinear::merge: the adapter is already merged");
  if (const auto refusal = base_.weight_write_refusal()) {
    throw Error(detail::concat("LoRALinear::merge: ", *refusal));
  }
  merge_.emplace(adapter_, base_.weight());
  base_.weight_written();  // a packed base repacks
}

template <class Scalar>
void LoRALinear<Scalar>::unmerge() {
  if (!merge_) throw Error("LoRALinear::unmerge: the adapter is not merged");
  merge_->undo(base_.weight());
  merge_.reset();
  base_.weight_written();
}

}  // namespace dissect
