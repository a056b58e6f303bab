// dissect/layers/linear/detail/modes_impl.hpp — private: do not include directly (dissect/layers/linear.hpp
// includes it at its end, after the class).
//
// The out-of-line definitions of Linear's modes, which change what backward may train and how
// forward reads W: freezing, hosting a LoRA adapter, quantised storage and packing (the
// bitlinear mode, which excludes the last three, is in bitlinear_impl.hpp). Each keeps
// weight_generation() moving whenever W or its storage changes, which is what a block that packs
// several layers together checks. The class itself, its shape contracts and the forward and
// backward products are in dissect/layers/linear.hpp.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/layers/linear/detail/modes_impl.hpp is private to dissect: include dissect/layers/linear.hpp instead"
#endif

#include <optional>
#include <string>
#include <type_traits>
#include <utility>

#include "dissect/core/error.hpp"
#include "dissect/layers/lora_adapter.hpp"
#include "dissect/quant/weight_format.hpp"
#include "dissect/core/shape.hpp"

namespace dissect {

// ---- freezing -----------------------------------------------------------------------------------

template <class Scalar>
void Linear<Scalar>::set_frozen(bool frozen) {
  if (!frozen) require_not_quantized("set_frozen(false)");
  if (!frozen && merge_) {
    throw Error(
        "Linear::set_frozen(false): the LoRA adapter is merged into the weight; unmerge it to "
        "train");
  }
  if (!frozen) {
    if (storage_.packed()) unpack();  // training writes W through views the pack cannot see
    ++weight_generation_;  // so may the optimizer: a block's packing must not trust W now
  }
  if (frozen == frozen_) return;
  frozen_ = frozen;
  set_gradient_frozen(weight_grad_, weight_.shape(), frozen);
  set_gradient_frozen(bias_grad_, bias_.shape(), frozen);
}

// ---- a LoRA adapter -----------------------------------------------------------------------------

template <class Scalar>
LoRAAdapter<Scalar>& Linear<Scalar>::attach_adapter(LoRAOptions options) {
  check_lora_options("Linear::attach_adapter", options);
  return attach_adapter(LoRAAdapter<Scalar>(in_features(), out_features(), options));
}

template <class Scalar>
LoRAAdapter<Scalar>& Linear<Scalar>::attach_adapter(LoRAAdapter<Scalar> adapter) {
  if (adapter_) throw Error("Linear::attach_adapter: this layer already has a LoRA adapter");
  require_not_bitlinear("attach_adapter");
  (void)dense("attach_adapter");  // backward's dx = dy·W needs W
  if (adapter.in_features() != in_features() || adapter.out_features() != out_features()) {
    throw ShapeError(detail::concat("Linear::attach_adapter: adapter A ",
                                    format_shape(adapter.A().shape()), ", B ",
                                    format_shape(adapter.B().shape()), " does not fit weight [",
                                    out_features(), ", ", in_features(), "]"));
  }
  set_frozen(true);
  adapter_.emplace(std::move(adapter));
  merge_.reset();
  ++weight_generation_;
  return *adapter_;
}

template <class Scalar>
LoRAAdapter<Scalar> Linear<Scalar>::detach_adapter() {
  LoRAAdapter<Scalar>& attached = with_adapter("detach_adapter");
  if (merge_ && merge_->stale(attached)) {
    // A or B changed since the merge: W keeps the update forward has been computing.
    merge_->undo(weight_.view());
    attached.add_delta_to(weight_.view(), Scalar(1));
    weight_changed();
  }
  LoRAAdapter<Scalar> adapter = std::move(attached);
  adapter_.reset();
  merge_.reset();
  ++weight_generation_;
  return adapter;
}

template <class Scalar>
void Linear<Scalar>::merge_adapter() {
  const auto& adapter = with_adapter("merge_adapter");
  if (merge_) throw Error("Linear::merge_adapter: the adapter is already merged");
  require_not_quantized("merge_adapter");
  if (!frozen_) {
    throw Error(
        "Linear::merge_adapter: the weight is trainable (set_frozen(false)), and an optimizer "
        "would move the merged weight; freeze the layer first");
  }
  merge_.emplace(adapter, weight_.view());
  weight_changed();
}

template <class Scalar>
void Linear<Scalar>::unmerge_adapter() {
  with_adapter("unmerge_adapter");
  if (!merge_) throw Error("Linear::unmerge_adapter: the adapter is not merged");
  merge_->undo(weight_.view());  // what merge added, even if A or B changed since
  merge_.reset();
  weight_changed();
}

// ---- quantised storage --------------------------------------------------------------------------

template <class Scalar>
void Linear<Scalar>::require_not_quantized(const char* op) const {
  if (const QuantizedWeight* q = storage_.quantized()) {
    throw Error(detail::concat("Linear::", op, ": the weight is stored as ", q->describe(),
                               "; dequantize() the layer first"));
  }
}

template <class Scalar>
void Linear<Scalar>::quantize(WeightFormat format) requires std::is_same_v<Scalar, float> {
  require_not_quantized("quantize");
  require_not_bitlinear("quantize");
  set_quantized_weight(QuantizedWeight::quantize(weight_.cview(), format));
}

template <class Scalar>
void Linear<Scalar>::set_quantized_weight(QuantizedWeight weight,
                                          DenseCopy dense) requires std::is_same_v<Scalar, float> {
  require_not_quantized("set_quantized_weight");
  require_not_bitlinear("set_quantized_weight");
  if (merge_) {
    throw Error(
        "Linear::set_quantized_weight: the LoRA adapter is merged into the weight; "
        "unmerge it before quantising the base");
  }
  if (weight.rows() != out_features() || weight.cols() != in_features()) {
    throw ShapeError(detail::concat("Linear::set_quantized_weight: quantised weight [",
                                    weight.rows(), ", ", weight.cols(), "] does not fit weight [",
                                    out_features(), ", ", in_features(), "]"));
  }
  if (dense == DenseCopy::keep) weight.dequantize_into(weight_.view());
  set_frozen(true);
  storage_.set_quantized(std::move(weight));
  ++weight_generation_;
  if (dense == DenseCopy::release) release_dense_weight();
}

template <class Scalar>
void Linear<Scalar>::release_dense_weight() requires std::is_same_v<Scalar, float> {
  if (released_) return;
  if (!storage_.quantized()) {
    throw Error(detail::concat("Linear::release_dense_weight: the layer ",
                               format_shape(weight_.shape()),
                               " is not quantised; forward reads W itself"));
  }
  released_shape_ = weight_.shape();
  released_ = true;
  weight_ = Tensor<Scalar, 2>();
  ++weight_generation_;
}

template <class Scalar>
std::optional<std::string> Linear<Scalar>::weight_write_refusal() const {
  if (const QuantizedWeight* q = storage_.quantized()) {
    return detail::concat("the weight is stored as ", q->describe(),
                          "; dequantize() the layer first");
  }
  if (merge_) {
    return std::string(
        "the LoRA adapter is merged into the weight; unmerge_adapter() first (or "
        "detach_adapter() to keep the merged weight)");
  }
  return std::nullopt;
}

template <class Scalar>
const QuantizedWeight& Linear<Scalar>::quantized_weight() const {
  const QuantizedWeight* q = storage_.quantized();
  if (!q) throw Error("Linear::quantized_weight: the layer is not quantised");
  return *q;
}

template <class Scalar>
void Linear<Scalar>::dequantize() {
  if (!storage_.quantized()) throw Error("Linear::dequantize: the layer is not quantised");
  (void)dense("dequantize");  // forward would read W again
  storage_.set_dense();
  ++weight_generation_;
}

template <class Scalar>
index_t Linear<Scalar>::weight_bytes() const {
  return storage_.bytes(out_features() * in_features() * static_cast<index_t>(sizeof(Scalar)));
}

// ---- packing ------------------------------------------------------------------------------------

template <class Scalar>
void Linear<Scalar>::weight_changed() {
  ++weight_generation_;
  if constexpr (std::is_same_v<Scalar, float>) {
    if (storage_.packed()) storage_.set_packed(weight_.data(), out_features(), in_features());
  }
}

template <class Scalar>
void Linear<Scalar>::pack() requires std::is_same_v<Scalar, float> {
  require_not_quantized("pack");
  require_not_bitlinear("pack");
  set_frozen(true);
  storage_.set_packed(weight_.data(), out_features(), in_features());
  ++weight_generation_;
}

template <class Scalar>
const PackedWeight& Linear<Scalar>::packed_weight() const {
  const PackedWeight* p = storage_.packed();
  if (!p) throw Error("Linear::packed_weight: the layer is not packed (call pack())");
  return *p;
}

}  // namespace dissect
