// dissect/layers/linear/detail/modes_impl.hpp — private: do not include directly
// (dissect/layers/linear.hpp includes it at its end, after the class).
//
// The out-of-line definitions of Linear's modes that linear.hpp itself carries, freezing and
// packing, and what every mode's checks share (the adapter is in layers/lora_adapter.hpp,
// quantised storage in layers/quantized_linear.hpp, BitNet in layers/bit_linear.hpp). Each keeps
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

// ---- what the modes' own headers do not need to say
// ----------------------------------------------

template <class Scalar>
void Linear<Scalar>::require_not_quantized(const char* op) const {
  if (quantized()) {
    throw Error(detail::concat("Linear::", op, ": the weight is stored as ",
                               product_calls_->describe(*this), "; dequantize() the layer first"));
  }
}

template <class Scalar>
void Linear<Scalar>::require_not_bitlinear(const char* op) const {
  if (bitlinear_) {
    throw Error(detail::concat("Linear::", op,
                               ": the layer runs as BitLinear (set_bitlinear(true)); turn that "
                               "off first"));
  }
}

template <class Scalar>
std::optional<std::string> Linear<Scalar>::weight_write_refusal() const {
  if (quantized()) {
    return detail::concat("the weight is stored as ", product_calls_->describe(*this),
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
index_t Linear<Scalar>::weight_bytes() const {
  if (product_calls_ && product_calls_->weight_bytes) return product_calls_->weight_bytes(*this);
  return out_features() * in_features() * static_cast<index_t>(sizeof(Scalar));
}

template <class Scalar>
std::string Linear<Scalar>::describe_modes() const {
  std::string modes;
  if (quantized()) modes += detail::concat(", weight=", product_calls_->describe(*this));
  if (packed()) modes += ", packed";
  if (bitlinear_) modes += ", bitlinear";
  if (adapter_) modes += adapter_calls_->describe(*this);
  return modes;
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
