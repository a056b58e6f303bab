// dissect/layers/linear.hpp — Linear<Scalar>: y = x·Wᵀ + b with W [out, in], exactly like
// nn.Linear.
//
// The layer owns its parameters and their gradients and hands out fixed-shape views of them
// (a module: see module.hpp). It checks every shape and every alias with its own buffers at the
// boundary, in every build mode, and then folds all leading axes of x into one matrix so that a
// whole batch of sequences is a single GEMM in kernels.hpp. backward() adds into the gradients
// until zero_grad(), as PyTorch does. forward() is const and keeps no state: one layer may serve
// any number of threads at once (concurrent backward() into the same gradients is not safe).
//
// A layer can be frozen (no gradient buffers, dx-only backward) and can carry a LoRA adapter
// (layers/lora_adapter.hpp): y = x·Wᵀ + b + (α/r)·(x·Aᵀ)·Bᵀ with W frozen, which is how whole
// models are adapted without changing their type (transforms/lora.hpp applies adapters by name).
//
// Pay for what you include: this header gives the float and double layer with its gradients and
// packing, and needs only the core and the float kernels. The modes whose code is large live in
// their own headers, which define the members below that switch them on: adapters in
// layers/lora_adapter.hpp, low-precision storage in layers/quantized_linear.hpp, BitNet in
// layers/bit_linear.hpp. A unit that calls such a member without the header stops at compile
// time naming it; forward and backward reach a mode's code through LinearModeCalls, set when the
// mode is switched on, so a unit that never switches one on never compiles it.
//
// A float layer can be packed for inference (pack()): W is also laid out once in the order the
// GEMM micro-kernels read it (kernels/packed_weight.hpp), so forward neither repacks it per call
// nor, at few tokens, streams it twice. Packing freezes the layer, and the layer repacks
// whenever W changes through its own API; writes through the weight() view are not seen until
// weight_written() or pack() is called (load_state_dict calls the first; optimizers skip a frozen
// layer).
//
// A float layer can also store W in a low-precision format (quant/weight_format.hpp: bf16, int8,
// q4_0): forward then runs the quantised kernels, and W itself holds Ŵ, the dequantised values, so
// that backward (dx only: a quantised layer is frozen, the base of a QLoRA adapter), the module
// protocol and state dicts all see the weights forward uses. The float Ŵ stays in memory; what
// quantising saves is the bytes forward streams (weight_bytes) and the bytes a file stores.
//
// set_bitlinear: BitNet b1.58's quantised product, trained straight through (bit_linear.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <type_traits>
#include <utility>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/kernels/linear_products.hpp"
#include "dissect/kernels/packed_weight.hpp"
#include "dissect/layers/linear/detail/boxed.hpp"
#include "dissect/layers/linear/weight_storage.hpp"
#include "dissect/quant/format.hpp"
#include "dissect/tensor/detail/panelled_gemm.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

struct LinearOptions {
  bool bias = true;
  InitScheme init = InitScheme::pytorch_default;
  /// Seed of the layer's own generator; when empty, the next of the sequence manual_seed() sets.
  std::optional<std::uint64_t> seed = std::nullopt;
};

struct LoRAOptions;  // layers/lora_adapter.hpp
template <class Scalar>
class LoRAAdapter;
template <class Scalar>
class LoRAMerge;
template <class Scalar>
class Linear;

namespace detail {
// Defined by the headers of the modes (each a friend of Linear): layers/lora_adapter.hpp,
// layers/quantized_linear.hpp, layers/bit_linear.hpp.
template <class Scalar>
struct LinearLoRADoor;
template <class Scalar>
struct LinearQuantizedDoor;
template <class Scalar>
struct LinearBitNetDoor;

/// A matrix parameter of a mode (an adapter's A or B) as the module protocol visits it.
template <class Scalar>
struct ModeParameter {
  const char* module;  ///< "lora_A": visited as "lora_A.weight"
  TensorView<Scalar, 2> value;
  TensorView<Scalar, 2> grad;
};

/// What forward, backward and the module protocol call of a mode whose code linear.hpp does not
/// include; the mode's header fills one per Scalar and the layer points at it while the mode is
/// on. A product mode (quantised storage, BitNet) replaces x·Wᵀ + b; an adapter adds to it.
template <class Scalar>
struct LinearModeCalls {
  /// Product mode: y = x·Wᵀ + b its way. Adapter: y += its term.
  void (*forward)(const Linear<Scalar>&, const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> y);
  /// Product mode: the whole backward, or nullptr for the frozen dense one (dx = dy·Ŵ).
  /// Adapter: adds its gradients (and its dx term when dx is given).
  void (*backward)(Linear<Scalar>&, const ConstMatrixRef<Scalar>& x,
                   const ConstMatrixRef<Scalar>& dy, std::optional<MatrixRef<Scalar>> dx);
  /// For messages and operator<<: the format ("q4_0 [3072, 768]"), or ", lora_rank=…".
  std::string (*describe)(const Linear<Scalar>&);
  /// Product mode: bytes of W as forward reads it, or nullptr (out·in·sizeof(Scalar)).
  index_t (*weight_bytes)(const Linear<Scalar>&);
  /// Adapter: whether forward adds a term now (unmerged, or merged and changed since).
  bool (*adds_to_forward)(const Linear<Scalar>&);
  /// Adapter: its parameters (lora_A, lora_B), for for_each_parameter.
  std::array<ModeParameter<Scalar>, 2> (*parameters)(const Linear<Scalar>&);
};
}  // namespace detail

/// What Linear::set_quantized_weight does with the float W: rewrite it as Ŵ (keep), or free it
/// (release: Linear::release_dense_weight).
enum class DenseCopy { keep, release };

template <class Scalar>
class Linear : public ParameterMethods<Linear<Scalar>> {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::Linear<Scalar>: Scalar must be float or double");

 public:
  using scalar_type = Scalar;

  /// A layer with freshly initialised parameters.
  /// @throws ShapeError for a negative feature count or a parameter count that overflows int64;
  ///         ConfigError for an InitScheme that is not an enumerator.
  Linear(index_t in_features, index_t out_features, LinearOptions options = {});

  /// A layer around given parameters: weight [out, in] and, optionally, bias [out].
  /// @throws ShapeError if the bias length differs from the weight's rows.
  explicit Linear(Tensor<Scalar, 2> weight, std::optional<Tensor<Scalar, 1>> bias = std::nullopt);

  // Copied or moved into a new layer, never assigned over (ParameterMethods): its buffers keep
  // their address for its life. A moved-from layer is an empty 0 → 0 layer (its tensors are).

  index_t in_features() const { return released_ ? released_shape_[1] : weight_.shape()[1]; }
  index_t out_features() const { return released_ ? released_shape_[0] : weight_.shape()[0]; }
  bool has_bias() const { return has_bias_; }
  // parameter_count() and zero_grad() come from ParameterMethods (module.hpp).

  /// [out_features, in_features]: values writable, shape and buffer fixed for the layer's life,
  /// so views (an optimizer's) stay valid until the layer is destroyed or assigned to.
  /// @throws Error if W was released (release_dense_weight).
  TensorView<Scalar, 2> weight() { return dense("weight").view(); }
  ConstTensorView<Scalar, 2> weight() const { return dense("weight").cview(); }
  /// [out_features]. @throws Error if the layer was built without a bias.
  TensorView<Scalar, 1> bias() { return with_bias("bias", bias_).view(); }
  ConstTensorView<Scalar, 1> bias() const { return with_bias("bias", bias_).cview(); }
  /// Copies new values into the parameter (the buffer keeps its address).
  /// @throws ShapeError naming the parameter if the shape is not [out, in] / [out]; Error
  /// (set_weight)
  ///         as weight_write_refusal: while quantised or while an adapter is merged.
  void set_weight(ConstTensorView<Scalar, 2> weight);
  void set_bias(ConstTensorView<Scalar, 1> bias);

  /// Gradients, shaped as their parameters; filled by backward, cleared by zero_grad.
  /// @throws Error if the layer is frozen (it has none).
  TensorView<Scalar, 2> weight_grad() { return with_grad("weight_grad", weight_grad_).view(); }
  ConstTensorView<Scalar, 2> weight_grad() const {
    return with_grad("weight_grad", weight_grad_).cview();
  }
  /// @throws Error if the layer was built without a bias or is frozen.
  TensorView<Scalar, 1> bias_grad() {
    return with_grad("bias_grad", with_bias("bias_grad", bias_grad_)).view();
  }
  ConstTensorView<Scalar, 1> bias_grad() const {
    return with_grad("bias_grad", with_bias("bias_grad", bias_grad_)).cview();
  }

  /// Freezing, PyTorch's requires_grad_(False) on W and b: the gradient buffers are released, the
  /// parameters are visited with empty gradient views (optimizers skip them, see module.hpp) and
  /// backward computes dx (and an adapter's gradients) only. Unfreezing allocates zeroed
  /// gradients. Freezing releases the gradient buffers: build optimizers again after it.
  /// @throws Error when unfreezing a quantised layer or one whose adapter is merged.
  void set_frozen(bool frozen);
  bool frozen() const { return frozen_; }

  /// Attaches a LoRA adapter [r, in] / [out, r] and freezes W and b: from now on forward adds
  /// (α/r)·(x·Aᵀ)·Bᵀ and backward trains A and B only. Returns the adapter.
  /// @throws Error if the layer already has one; ConfigError for bad options; ShapeError if a
  ///         given adapter is not in → out.
  LoRAAdapter<Scalar>& attach_adapter(detail::dependent_t<LoRAOptions, Scalar> options = {}) {
    return lora_door().attach(*this, std::move(options));
  }
  LoRAAdapter<Scalar>& attach_adapter(LoRAAdapter<Scalar> adapter) {
    return lora_door().attach_given(*this, std::move(adapter));
  }
  bool has_adapter() const { return static_cast<bool>(adapter_); }
  /// @throws Error if the layer has no adapter.
  LoRAAdapter<Scalar>& adapter() { return with_adapter("adapter"); }
  const LoRAAdapter<Scalar>& adapter() const { return with_adapter("adapter"); }
  /// Removes the adapter and returns it. If it was merged, W keeps the update of A and B as they
  /// are now (PEFT's merge_and_unload); otherwise W is the base again. The layer stays frozen.
  /// @throws Error if the layer has no adapter.
  LoRAAdapter<Scalar> detach_adapter() { return lora_door().detach(*this); }
  /// W += (α/r)·B·A, after which forward skips the adapter (one GEMM, the speed of the base);
  /// unmerge subtracts it again. W after unmerge differs from the original by the rounding of
  /// the two additions, at most 2·u·(|W| + |ΔW|) per entry. A merged layer refuses backward,
  /// set_weight and unfreezing. A and B stay writable while merged (an optimizer built before
  /// the merge still holds them; load_adapters writes them): the layer remembers what it merged
  /// (LoRAMerge), forward adds the change since, and unmerge takes out exactly what merge put in.
  /// @throws Error if there is no adapter, it is already merged (unmerge: not merged), or W is
  ///         trainable (an optimizer would move the merged weight): freeze the layer first.
  void merge_adapter() { lora_door().merge(*this); }
  void unmerge_adapter() { lora_door().unmerge(*this); }
  bool adapter_merged() const { return static_cast<bool>(merge_); }
  /// Whether forward adds an adapter's term to x·Wᵀ + b: an unmerged adapter, or a merged one
  /// whose A or B changed since the merge. Otherwise forward is the product with W alone.
  bool adapter_adds_to_forward() const {
    return adapter_ && adapter_calls_->adds_to_forward(*this);
  }

  /// Stores W as `format` (a float layer only): forward runs on the quantised weights, W becomes
  /// Ŵ and the layer is frozen. A layer with an unmerged adapter keeps it (QLoRA).
  /// @throws as QuantizedWeight::quantize (nothing changes); Error if the layer is already
  ///         quantised or its adapter is merged.
  void quantize(WeightFormat format) requires std::is_same_v<Scalar, float> {
    quantized_door().quantize(*this, format);
  }
  /// As quantize, from weights already quantised (a file's). @throws ShapeError if `weight` is
  /// not [out, in]; Error as quantize.
  /// With DenseCopy::release, W is freed instead of becoming Ŵ (see release_dense_weight): a
  /// loader's way to build a quantised layer whose float weight never exists.
  void set_quantized_weight(
      detail::dependent_t<QuantizedWeight, Scalar> weight,
      DenseCopy dense = DenseCopy::keep) requires std::is_same_v<Scalar, float> {
    quantized_door().set(*this, std::move(weight), dense);
  }
  bool quantized() const { return storage_.quantized() != nullptr; }
  /// Frees W of a quantised layer, for inference: forward reads the quantised weight alone, so
  /// a model's float copy of its weights (4× a q8_0 model, 7× a q4_0 one) goes. From then on the
  /// layer has no weight parameter (the module protocol, state dicts and parameter_count() see
  /// its bias only), weight() throws, and dequantize, backward and attach_adapter refuse;
  /// in_features, out_features, weight_bytes and forward are unchanged. For good.
  /// @throws Error if the layer is not quantised.
  void release_dense_weight() requires std::is_same_v<Scalar, float> {
    quantized_door().release_dense(*this);
  }
  bool dense_weight_released() const { return released_; }
  /// @throws Error if the layer is not quantised.
  const QuantizedWeight& quantized_weight() const {
    if (!quantized()) throw Error("Linear::quantized_weight: the layer is not quantised");
    return *storage_.quantized();
  }
  /// Forgets the quantised storage: forward runs in float on Ŵ again. The layer stays frozen.
  /// @throws Error if the layer is not quantised, or its W was released.
  void dequantize() { quantized_door().dequantize(*this); }
  /// Bytes of W as forward reads it: the quantised values and scales, or out·in·sizeof(Scalar).
  index_t weight_bytes() const;

  /// Lays W out for the packed GEMM and freezes the layer: forward then runs packed_matmul
  /// with the bias fused. A later set_weight, merge_adapter or unmerge_adapter repacks;
  /// set_frozen(false), quantize and unpack drop the packed copy (which costs out·in floats).
  /// @throws Error if the layer is quantised (its own kernels already read packed bytes).
  void pack() requires std::is_same_v<Scalar, float>;
  void unpack() {
    if (storage_.packed()) storage_.set_dense();
    ++weight_generation_;
  }
  bool packed() const { return storage_.packed() != nullptr; }
  /// @throws Error if the layer is not packed.
  const PackedWeight& packed_weight() const;
  /// Changes whenever W or the way forward reads it changes through this layer's API (not
  /// through the weight() view): what a block that packs several layers together checks.
  std::uint64_t weight_generation() const { return weight_generation_; }

  /// BitNet b1.58's product (quant/bitnet.hpp; with its RMSNorm: BitLinear, bit_linear.hpp):
  /// forward y = Q(x)·Q(W)ᵀ + b, Q(x) per-token absmax int8, Q(W) absmean ternary; backward the
  /// straight-through estimator dx = dy·Q(W), dW += dyᵀ·Q(x), db += Σ dy. W stays the float
  /// master weight; the mode may be frozen.
  /// @throws Error (turning it on) if the layer is quantised, packed or carries an adapter.
  void set_bitlinear(bool on) { bitnet_door().set(*this, on); }
  bool bitlinear() const { return bitlinear_; }

  /// Why W cannot take new values now, or nullopt: while quantised forward reads its own copy,
  /// and while an adapter is merged unmerge would subtract ΔW from the new values. What
  /// set_weight refuses, and what code that writes W through the weight() view checks first
  /// (load_state_dict).
  std::optional<std::string> weight_write_refusal() const;
  /// Tells the layer that W was written through the weight() view (load_state_dict calls it
  /// after its writes): a packed layer repacks, and weight_generation() moves, so that a block
  /// whose packing fused this layer falls back to the unfused forward until packed again.
  void weight_written() { weight_changed(); }

  /// The modes as operator<< prints them after the shape: ", weight=q4_0 …", ", packed",
  /// ", bitlinear", ", lora_rank=8, lora_alpha=16[, merged]".
  std::string describe_modes() const;

  /// Visits "weight" (and "bias") with their gradients — empty when frozen — and an adapter's
  /// "lora_A.weight" and "lora_B.weight": the module protocol.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit);
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const;

  /// [..., in] → [..., out].
  template <std::size_t Rank>
  Shape<Rank> output_shape(const Shape<Rank>& x_shape) const;

  /// x: [..., in] → y: [..., out]. Rank 1 ([in] → [out]) and empty leading axes work. x may be
  /// a Tensor or a view.
  /// @throws ShapeError if x's last axis is not in_features.
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;

  /// As forward, into a caller's buffer y: [..., out] (its old values are never read).
  /// @throws ShapeError if y has the wrong shape or shares memory with x or the layer's own
  ///         parameters and gradients.
  template <TensorLike X, WritableTensor Y>
  void forward_into(const X& x, Y&& y) const;

  /// x: [..., in], dy: [..., out] → dx: [..., in]; adds dyᵀ·x to dW and Σ dy to db over all
  /// leading axes. @throws ShapeError (gradients untouched) if the shapes do not fit or x or dy
  /// shares memory with the gradients.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const DY& dy);

  /// As backward, writing dx into a caller's buffer.
  /// @throws ShapeError (gradients untouched) as backward, or if dx shares memory with x, dy,
  ///         or the layer's parameters and gradients.
  template <TensorLike X, TensorLike DY, WritableTensor DX>
  void backward_into(const X& x, const DY& dy, DX&& dx);

  /// The parameter half of backward: adds dyᵀ·x to dW and Σ dy to db, and skips dx = dy·W — for
  /// a first layer whose input needs no gradient (PyTorch's requires_grad=False), where dx would
  /// cost as much as the forward product. @throws ShapeError (gradients untouched) as backward.
  template <TensorLike X, TensorLike DY>
  void backward_parameters(const X& x, const DY& dy);

 private:
  friend struct detail::LinearLoRADoor<Scalar>;
  friend struct detail::LinearQuantizedDoor<Scalar>;
  friend struct detail::LinearBitNetDoor<Scalar>;
  // The doors to the modes whose code lives in their own headers: without the header, a call
  // stops here at compile time naming it.
  template <class S = Scalar>
  static auto lora_door() {
    static_assert(detail::complete_type<detail::LinearLoRADoor<S>>,
                  "this Linear member needs #include <dissect/layers/lora_adapter.hpp>");
    return detail::LinearLoRADoor<S>{};
  }
  template <class S = Scalar>
  static auto quantized_door() {
    static_assert(detail::complete_type<detail::LinearQuantizedDoor<S>>,
                  "this Linear member needs #include <dissect/layers/quantized_linear.hpp>");
    return detail::LinearQuantizedDoor<S>{};
  }
  template <class S = Scalar>
  static auto bitnet_door() {
    static_assert(detail::complete_type<detail::LinearBitNetDoor<S>>,
                  "this Linear member needs #include <dissect/layers/bit_linear.hpp>");
    return detail::LinearBitNetDoor<S>{};
  }

  /// `tensor` (bias_ or bias_grad_), or Error naming `name` for a layer built without a bias.
  template <class T>
  T& with_bias(const char* name, T& tensor) const;
  /// `tensor` (a gradient), or Error naming `name` for a frozen layer.
  template <class T>
  T& with_grad(const char* name, T& tensor) const;
  LoRAAdapter<Scalar>& with_adapter(const char* name);
  const LoRAAdapter<Scalar>& with_adapter(const char* name) const;
  template <std::size_t Rank>
  void check_input(const char* op, const ConstTensorView<Scalar, Rank>& x) const;
  template <std::size_t Rank>
  void check_backward(const char* op, const ConstTensorView<Scalar, Rank>& x,
                      const ConstTensorView<Scalar, Rank>& dy) const;
  template <std::size_t Rank>
  void check_not_own_buffer(const char* op, const char* name,
                            const ConstTensorView<Scalar, Rank>& tensor, bool parameters_too) const;
  template <std::size_t Rank>
  void backward_checked(const char* op, const ConstTensorView<Scalar, Rank>& x,
                        const ConstTensorView<Scalar, Rank>& dy,
                        const TensorView<Scalar, Rank>& dx);
  std::optional<VectorMap<Scalar>> bias_grad_map();
  std::optional<ConstVectorMap<Scalar>> bias_map() const;

  /// weight_, or Error naming `op` once it was released.
  Tensor<Scalar, 2>& dense(const char* op);
  const Tensor<Scalar, 2>& dense(const char* op) const;

  bool has_bias_;
  Tensor<Scalar, 2> weight_;  // empty once released
  bool released_ = false;
  Shape<2> released_shape_{};  // W's shape, once released
  Tensor<Scalar, 1> bias_;     // [0] without a bias
  Tensor<Scalar, 2> weight_grad_;
  Tensor<Scalar, 1> bias_grad_;
  bool frozen_ = false;
  detail::Boxed<LoRAAdapter<Scalar>> adapter_;
  /// What merge_adapter added to W, while merged.
  detail::Boxed<LoRAMerge<Scalar>> merge_;
  /// The adapter's calls while one is attached (layers/lora_adapter.hpp), else nullptr.
  detail::ModeCalls<detail::LinearModeCalls<Scalar>> adapter_calls_;
  /// How forward reads W: dense, packed or quantised (linear/weight_storage.hpp).
  WeightStorage storage_;
  /// The product mode's calls while quantised or BitLinear, else nullptr (dense or packed).
  detail::ModeCalls<detail::LinearModeCalls<Scalar>> product_calls_;
  std::uint64_t weight_generation_ = 0;
  bool bitlinear_ = false;
  void require_not_bitlinear(const char* op) const;
  /// After W changed through the layer's API: a packed layer repacks.
  void weight_changed();
  /// y = x·Wᵀ + b by the weight's storage, then the adapter's term.
  void forward_matrix(const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> y) const;
  void require_not_quantized(const char* op) const;
};

/// "Linear(in_features=768, out_features=3072, bias=true)", as PyTorch prints nn.Linear.
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const Linear<Scalar>& layer);

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline index_t checked_feature_count(index_t count, const char* name) {
  if (count < 0) {
    throw ShapeError(concat("Linear: ", name, " must be >= 0, got ", count));
  }
  return count;
}

template <class>
inline constexpr bool dependent_false = false;

/// A new layer's W: zeroed, or left unwritten under ConstructionOptions::leave_weights_unwritten.
template <class Scalar>
Tensor<Scalar, 2> linear_weight_buffer(Shape<2> shape) {
  const ConstructionOptions& options = ConstructionScope::current();
  if (!options.initialise && options.leave_weights_unwritten) {
    return Tensor<Scalar, 2>::uninitialized(shape);
  }
  return Tensor<Scalar, 2>(shape);
}

}  // namespace detail

template <class Scalar>
Linear<Scalar>::Linear(index_t in_features, index_t out_features, LinearOptions options)
    : has_bias_(options.bias),
      weight_(detail::linear_weight_buffer<Scalar>(
          {detail::checked_feature_count(out_features, "out_features"),
           detail::checked_feature_count(in_features, "in_features")})),
      bias_({has_bias_ ? out_features : 0}),
      weight_grad_(ConstructionScope::current().gradients ? weight_.shape() : Shape<2>{}),
      bias_grad_(ConstructionScope::current().gradients ? bias_.shape() : Shape<1>{}),
      frozen_(!ConstructionScope::current().gradients) {
  // The seed is taken even when nothing is drawn: the layers built after this one are the same.
  Generator generator(options.seed ? *options.seed : next_default_seed());
  const InitScheme init = check_init_scheme("Linear", options.init);
  if (!ConstructionScope::current().initialise) return;  // a loader writes W and b next
  init_linear(weight_.view(),
              has_bias_ ? std::optional<TensorView<Scalar, 1>>(bias_.view()) : std::nullopt, init,
              generator);
}

template <class Scalar>
Linear<Scalar>::Linear(Tensor<Scalar, 2> weight, std::optional<Tensor<Scalar, 1>> bias)
    : has_bias_(bias.has_value()),
      weight_(std::move(weight)),
      bias_(bias ? std::move(*bias) : Tensor<Scalar, 1>({0})),
      weight_grad_(ConstructionScope::current().gradients ? weight_.shape() : Shape<2>{}),
      bias_grad_({ConstructionScope::current().gradients && has_bias_ ? out_features() : 0}),
      frozen_(!ConstructionScope::current().gradients) {
  if (has_bias_ && bias_.dim(0) != out_features()) {
    throw ShapeError(detail::concat("Linear: bias has shape ", format_shape(bias_.shape()),
                                    " but weight ", format_shape(weight_.shape()), " needs [",
                                    out_features(), "]"));
  }
}

template <class Scalar>
template <class T>
T& Linear<Scalar>::with_bias(const char* name, T& tensor) const {
  if (!has_bias_)
    throw Error(detail::concat("Linear::", name, ": this layer was built with bias=false"));
  return tensor;
}

template <class Scalar>
template <class T>
T& Linear<Scalar>::with_grad(const char* name, T& tensor) const {
  require_gradient("Linear", name, frozen_);
  return tensor;
}

template <class Scalar>
LoRAAdapter<Scalar>& Linear<Scalar>::with_adapter(const char* name) {
  return const_cast<LoRAAdapter<Scalar>&>(std::as_const(*this).with_adapter(name));
}

template <class Scalar>
const LoRAAdapter<Scalar>& Linear<Scalar>::with_adapter(const char* name) const {
  if (!adapter_) {
    throw Error(detail::concat("Linear::", name, ": this layer has no LoRA adapter"));
  }
  return *adapter_.get();
}

template <class Scalar>
void Linear<Scalar>::forward_matrix(const ConstMatrixRef<Scalar>& x, MatrixRef<Scalar> y) const {
  if (product_calls_) {
    product_calls_->forward(*this, x, y);  // quantised, or BitLinear (which refuses adapters)
  } else {
    storage_.forward_matmul<Scalar>(x, weight_.matrix(), bias_map(), y);
  }
  if (adapter_calls_) adapter_calls_->forward(*this, x, y);
}

template <class Scalar>
void Linear<Scalar>::set_weight(ConstTensorView<Scalar, 2> weight) {
  if (auto refusal = weight_write_refusal()) {
    throw Error(detail::concat("Linear::set_weight: ", *refusal));
  }
  assign_parameter("Linear", "weight", "[out_features, in_features]", weight_, weight);
  weight_changed();
}

template <class Scalar>
void Linear<Scalar>::set_bias(ConstTensorView<Scalar, 1> bias) {
  assign_parameter("Linear", "bias", "[out_features]", with_bias("set_bias", bias_), bias);
}

template <class Scalar>
Tensor<Scalar, 2>& Linear<Scalar>::dense(const char* op) {
  return const_cast<Tensor<Scalar, 2>&>(std::as_const(*this).dense(op));
}

template <class Scalar>
const Tensor<Scalar, 2>& Linear<Scalar>::dense(const char* op) const {
  if (released_) {
    throw Error(detail::concat("Linear::", op, ": the dense weight ", format_shape(released_shape_),
                               " was released (release_dense_weight); the layer keeps only its ",
                               quantized() ? product_calls_->describe(*this) : "quantised",
                               " weight, for inference"));
  }
  return weight_;
}

template <class Scalar>
template <class Visitor>
void Linear<Scalar>::for_each_parameter(Visitor&& visit) {
  if (!released_) visit(ParameterName("weight"), weight_.view(), weight_grad_.view());
  if (has_bias_) visit(ParameterName("bias"), bias_.view(), bias_grad_.view());
  if (!adapter_) return;
  for (const detail::ModeParameter<Scalar>& p : adapter_calls_->parameters(*this)) {
    visit(ParameterName("weight").under(p.module), p.value, p.grad);
  }
}

template <class Scalar>
template <class Visitor>
void Linear<Scalar>::for_each_parameter(Visitor&& visit) const {
  if (!released_) visit(ParameterName("weight"), weight_.cview(), weight_grad_.cview());
  if (has_bias_) visit(ParameterName("bias"), bias_.cview(), bias_grad_.cview());
  if (!adapter_) return;
  for (const detail::ModeParameter<Scalar>& p : adapter_calls_->parameters(*this)) {
    visit(ParameterName("weight").under(p.module), ConstTensorView<Scalar, 2>(p.value),
          ConstTensorView<Scalar, 2>(p.grad));
  }
}

template <class Scalar>
template <std::size_t Rank>
Shape<Rank> Linear<Scalar>::output_shape(const Shape<Rank>& x_shape) const {
  Shape<Rank> shape = x_shape;
  shape[Rank - 1] = out_features();
  return shape;
}

template <class Scalar>
template <std::size_t Rank>
void Linear<Scalar>::check_input(const char* op, const ConstTensorView<Scalar, Rank>& x) const {
  if (x.shape()[Rank - 1] != in_features()) {
    throw ShapeError(detail::concat("Linear::", op, ": input last dim ", x.shape()[Rank - 1],
                                    " != in_features ", in_features(),
                                    " (x: ", format_shape(x.shape()), ", weight: [", out_features(),
                                    ", ", in_features(), "])"));
  }
}

template <class Scalar>
template <std::size_t Rank>
void Linear<Scalar>::check_not_own_buffer(const char* op, const char* name,
                                          const ConstTensorView<Scalar, Rank>& tensor,
                                          bool parameters_too) const {
  // A buffer the call writes (or reads while writing another) must not be one of the layer's
  // own: y = x·Wᵀ written over W, or dW += dyᵀ·x read from dW, silently computes garbage.
  const auto refuse = [&](const char* own, const auto& buffer) {
    if (tensor.overlaps(buffer.cview())) {
      throw ShapeError(detail::concat("Linear::", op, ": ", name, " ", format_shape(tensor.shape()),
                                      " aliases the layer's ", own, " ",
                                      format_shape(buffer.shape())));
    }
  };
  refuse("weight_grad", weight_grad_);
  refuse("bias_grad", bias_grad_);
  if (parameters_too) {
    refuse("weight", weight_);
    refuse("bias", bias_);
  }
}

template <class Scalar>
std::optional<ConstVectorMap<Scalar>> Linear<Scalar>::bias_map() const {
  if (!has_bias_) return std::nullopt;
  return ConstVectorMap<Scalar>(bias_.data(), out_features());
}

template <class Scalar>
std::optional<VectorMap<Scalar>> Linear<Scalar>::bias_grad_map() {
  if (!has_bias_) return std::nullopt;
  return VectorMap<Scalar>(bias_grad_.data(), out_features());
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> Linear<Scalar>::forward(const X& x) const {
  require_layer_scalar<Scalar, X>();
  if constexpr (std::is_same_v<scalar_of<X>, Scalar>) {
    const auto input = const_view(x);
    check_input("forward", input);
    auto y = Tensor<Scalar, rank_of<X>>::uninitialized(output_shape(input.shape()));
    forward_matrix(input.matrix(), y.matrix());
    return y;
  } else {
    return {};
  }
}

template <class Scalar>
template <TensorLike X, WritableTensor Y>
void Linear<Scalar>::forward_into(const X& x, Y&& y) const {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, Y>();
  const auto input = const_view(x);
  const auto output = writable_view(y);
  check_input("forward_into", input);
  if (output.shape() != output_shape(input.shape())) {
    throw ShapeError(detail::concat(
        "Linear::forward_into: output has shape ", format_shape(output.shape()), " but x ",
        format_shape(input.shape()), " gives ", format_shape(output_shape(input.shape()))));
  }
  if (output.overlaps(input)) {
    throw ShapeError(detail::concat(
        "Linear::forward_into: output aliases input (x: ", format_shape(input.shape()),
        ", y: ", format_shape(output.shape()), ")"));
  }
  check_not_own_buffer("forward_into", "output y", decltype(input)(output), true);
  forward_matrix(input.matrix(), output.matrix());
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> Linear<Scalar>::backward(const X& x, const DY& dy) {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  if constexpr (std::is_same_v<scalar_of<X>, Scalar>) {
    auto dx = Tensor<Scalar, rank_of<X>>::uninitialized(const_view(x).shape());
    backward_checked("backward", const_view(x), const_view(dy), dx.view());
    return dx;
  } else {
    return {};
  }
}

template <class Scalar>
template <TensorLike X, TensorLike DY, WritableTensor DX>
void Linear<Scalar>::backward_into(const X& x, const DY& dy, DX&& dx) {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  require_layer_scalar<Scalar, DX>();
  backward_checked("backward_into", const_view(x), const_view(dy), writable_view(dx));
}

template <class Scalar>
template <std::size_t Rank>
void Linear<Scalar>::backward_checked(const char* op, const ConstTensorView<Scalar, Rank>& x,
                                      const ConstTensorView<Scalar, Rank>& dy,
                                      const TensorView<Scalar, Rank>& dx) {
  check_backward(op, x, dy);
  if (dx.shape() != x.shape()) {
    throw ShapeError(detail::concat("Linear::", op, ": dx has shape ", format_shape(dx.shape()),
                                    " but x has shape ", format_shape(x.shape())));
  }
  if (dx.overlaps(x) || dx.overlaps(dy)) {
    throw ShapeError(detail::concat("Linear::", op,
                                    ": dx aliases an input (x: ", format_shape(x.shape()),
                                    ", dy: ", format_shape(dy.shape()), ")"));
  }
  check_not_own_buffer(op, "dx", ConstTensorView<Scalar, Rank>(dx), true);
  if (product_calls_ && product_calls_->backward) {
    return product_calls_->backward(*this, x.matrix(), dy.matrix(), dx.matrix());  // BitLinear
  }
  if (frozen_) {
    linear_backward_input<Scalar>(dense(op).cview().matrix(), dy.matrix(), dx.matrix());
  } else {
    linear_backward<Scalar>(x.matrix(), weight_.cview().matrix(), dy.matrix(), dx.matrix(),
                            weight_grad_.matrix(), bias_grad_map());
  }
  if (adapter_calls_) adapter_calls_->backward(*this, x.matrix(), dy.matrix(), dx.matrix());
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
void Linear<Scalar>::backward_parameters(const X& x, const DY& dy) {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  const auto input = const_view(x);
  const auto upstream = const_view(dy);
  check_backward("backward_parameters", input, upstream);
  if (product_calls_ && product_calls_->backward) {
    return product_calls_->backward(*this, input.matrix(), upstream.matrix(), std::nullopt);
  }
  if (!frozen_) {
    linear_backward_parameters<Scalar>(input.matrix(), upstream.matrix(), weight_grad_.matrix(),
                                       bias_grad_map());
  }
  if (adapter_calls_) {
    adapter_calls_->backward(*this, input.matrix(), upstream.matrix(), std::nullopt);
  }
}

template <class Scalar>
template <std::size_t Rank>
void Linear<Scalar>::check_backward(const char* op, const ConstTensorView<Scalar, Rank>& x,
                                    const ConstTensorView<Scalar, Rank>& dy) const {
  check_input(op, x);
  if (dy.shape() != output_shape(x.shape())) {
    throw ShapeError(detail::concat(
        "Linear::", op, ": dy has shape ", format_shape(dy.shape()), " but forward(x) has shape ",
        format_shape(output_shape(x.shape())), " (x: ", format_shape(x.shape()), ")"));
  }
  // x and dy are read while dW and db are written.
  check_not_own_buffer(op, "x", x, false);
  check_not_own_buffer(op, "dy", dy, false);
  if (merge_) {
    throw Error(detail::concat(
        "Linear::", op, ": the LoRA adapter is merged into the weight; unmerge it to train"));
  }
}

template <class Scalar>
std::ostream& operator<<(std::ostream& out, const Linear<Scalar>& layer) {
  out << "Linear(in_features=" << layer.in_features() << ", out_features=" << layer.out_features()
      << ", bias=" << (layer.has_bias() ? "true" : "false") << (layer.frozen() ? ", frozen" : "");
  out << layer.describe_modes();
  return out << ")";
}

}  // namespace dissect

// The members that switch modes (freezing, an adapter, quantised storage, packing) are defined in
// a private header of their own, which needs the class above.
#include "dissect/layers/linear/detail/modes_impl.hpp"
