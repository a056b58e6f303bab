// dissect/blocks/detail/heads_block.hpp — private: do not include directly
// (dissect/blocks/qkv_projection.hpp and dissect/blocks/attention_output.hpp do).
//
// HeadsBlock, what QKVProjection and AttentionOutput share: D, the head layout, one Linear and
// its packing; and fused_qkv_width, (H + 2·H_kv)·d_k with its overflow check.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/blocks/detail/heads_block.hpp is private to dissect: include dissect/blocks/attention_output.hpp instead"
#endif

#include <string_view>
#include <type_traits>

#include "dissect/accounting/config.hpp"
#include "dissect/blocks/block_options.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/detail/heads.hpp"
#include "dissect/tensor/module.hpp"

namespace dissect::detail {

/// What the two attention projections share: D, the head layout and one Linear member, named
/// `member` in the state_dict ("qkv", "proj").
template <class Derived, class Scalar>
class HeadsBlock : public ComposedModule<Derived> {
 public:
  using scalar_type = Scalar;

  index_t d_model() const { return d_model_; }
  index_t n_heads() const { return heads_.n_heads; }
  index_t head_dim() const { return heads_.head_dim; }
  // for_each_parameter ("qkv.*" or "proj.*"), zero_grad, parameter_count: from ComposedModule.

  /// Packs the projection for inference (Linear::pack): forward then runs the packed GEMM with
  /// the bias (and AttentionOutput's residual) fused. Freezes it.
  void pack() requires std::is_same_v<Scalar, float> { linear_.pack(); }
  void unpack() { linear_.unpack(); }
  bool packed() const { return linear_.packed(); }

 protected:
  HeadsBlock(const char* member, index_t d_model, HeadLayout heads, index_t out_features,
             const LinearOptions& options)
      : member_(member),
        d_model_(d_model),
        heads_(heads),
        linear_(d_model, out_features,
                member_options(options.bias, options.init, options.seed, 0)) {}

  const char* member_;
  index_t d_model_;
  HeadLayout heads_;
  Linear<Scalar> linear_;

 private:
  friend class ComposedModule<Derived>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child(self.member_, self.linear_, visit);
  }
};

/// (H + 2·H_kv)·d_k, the fused QKV width. @throws OverflowError if it leaves int64.
inline index_t fused_qkv_width(const HeadLayout& heads) {
  constexpr std::string_view what = "QKVProjection: (H + 2·H_kv)·d_k";
  return checked_mul(checked_sum({heads.n_heads, heads.n_kv_heads, heads.n_kv_heads}, what),
                     heads.head_dim, what);
}

}  // namespace dissect::detail
