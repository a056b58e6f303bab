// dissect/blocks/mixture_of_experts.hpp — MixtureOfExperts, a sparse MoE FFN (Mixtral, Switch).
//
// A router Linear D → E (no bias) scores every token; each token goes to its top-k experts (FFNs
// or SwiGLU FFNs) and y is the gate-weighted sum of their outputs. Dispatch is grouped: the rows
// routed to expert e are gathered into one [n_e, D] buffer, the expert runs once on it (one
// product per projection, never one per token) and its rows are scattered back, weighted by their
// gates. Backward runs through the experts, the gates and the router, and adds the gradients of
// the optional auxiliary losses: Switch's load balancing and ST-MoE's router z-loss. An optional
// capacity drops the assignments an expert cannot take, in token order, and counts them.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/accounting/config.hpp"
#include "dissect/accounting/tensor_names.hpp"
#include "dissect/blocks/block_options.hpp"
#include "dissect/blocks/block_parts.hpp"
#include "dissect/blocks/detail/moe_routing.hpp"
#include "dissect/blocks/feed_forward.hpp"
#include "dissect/blocks/gated_feed_forward.hpp"
#include "dissect/core/detail/enum_check.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/layers/linear.hpp"
#include "dissect/tensor/activation.hpp"
#include "dissect/tensor/init.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/sequential.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// How a token's gates come from its router logits z [E].
enum class MoeGating {
  /// Mixtral: the top-k logits, then softmax over those k alone (the gates sum to 1). Hugging
  /// Face's MixtralSparseMoeBlock writes it as softmax over E, top-k, divide by the sum: the same
  /// numbers up to rounding (that is top_k_of_softmax with renormalize).
  softmax_of_top_k,
  /// Switch Transformer, DeepSeek: softmax over all E, then the k largest probabilities as gates;
  /// with MoeRouting::renormalize they are divided by their sum (DeepSeek's norm_topk_prob).
  top_k_of_softmax,
};

/// "softmax_of_top_k", "top_k_of_softmax"; "unknown" outside the enum.
const char* to_string(MoeGating gating);

/// How tokens are routed, and the auxiliary losses and capacity of training.
struct MoeRouting {
  index_t top_k = 2;  ///< k experts per token, 1 ≤ k ≤ E (Mixtral: 2; Switch: 1)
  MoeGating gating = MoeGating::softmax_of_top_k;
  bool renormalize = false;  ///< top_k_of_softmax only: gates divided by their sum
  /// Coefficient of the load-balancing loss E·Σ_e f_e·P_e in the training loss (0: off; Mixtral
  /// trains with 0.02, Switch with 0.01). See MoeRoute::load_balancing_loss.
  double load_balancing_coef = 0;
  /// Coefficient of ST-MoE's router z-loss mean_t (logsumexp z_t)² (0: off; ST-MoE: 0.001).
  double z_loss_coef = 0;
  /// Each expert takes at most ceil(capacity_factor·N·k / E) of the N·k assignments of N tokens;
  /// the rest are dropped in token order (Switch). None: no limit.
  std::optional<double> capacity_factor = std::nullopt;
};

/// What MixtureOfExperts(d_model, d_ff, options) builds.
struct MixtureOfExpertsOptions {
  index_t n_experts = 8;  ///< E (Mixtral: 8)
  MoeRouting routing = {};
  bool bias = false;  ///< the experts' biases; the router never has one
  /// FeedForward experts' activation (GatedFeedForward experts are SwiGLU and ignore it).
  Activation activation = Activation::gelu_tanh;
  InitScheme init = InitScheme::pytorch_default;
  /// With a seed, the router takes it and expert e's layers seed + 1 + 3·e, + 1, + 2.
  std::optional<std::uint64_t> seed = std::nullopt;
};

/// What a block must offer to serve as an expert: a Module over [B, T, D] with the blocks'
/// training protocol, forward(x, cache) and backward(x, cache, dy). FeedForward and
/// GatedFeedForward are experts.
template <class E>
concept MoeExpert = Module<E> &&
    requires(const E& expert, E& trained, ConstTensorView<typename E::scalar_type, 3> x,
             typename E::Cache& cache) {
  { expert.d_model() } -> std::convertible_to<index_t>;
  { expert.forward(x) } -> std::same_as<Tensor<typename E::scalar_type, 3>>;
  { expert.forward(x, cache) } -> std::same_as<Tensor<typename E::scalar_type, 3>>;
  {
    trained.backward(x, std::as_const(cache), x)
    } -> std::same_as<Tensor<typename E::scalar_type, 3>>;
};

/// Where the router sent the N = B·T tokens of one input, with the counts and losses of that
/// routing. Assignment a = t·k + j is token t's j-th choice (j = 0 the highest score).
template <class Scalar>
struct MoeRoute {
  index_t tokens = 0;        ///< N = B·T; −1 in a cache whose forward threw (it then fits no x)
  index_t n_experts = 0;     ///< E
  index_t top_k = 0;         ///< k
  Tensor<Scalar, 2> logits;  ///< router logits z: [N, E]
  Tensor<Scalar, 2> probs;   ///< softmax(z) over all E: [N, E]
  Tensor<Scalar, 1> logsumexp;   ///< logsumexp(z_t): [N]
  Tensor<Scalar, 2> gates;       ///< [N, k], of every assignment, dropped ones included
  std::vector<index_t> experts;  ///< [N·k]: the expert of assignment a
  /// [N·k]: a's row in its expert's group, or −1 when the capacity dropped it.
  std::vector<index_t> rows;
  /// Expert e's group is assignments group[group_offsets[e] … group_offsets[e + 1]), in token
  /// order: the rows gathered for it. [E + 1] and [Σ n_e].
  std::vector<index_t> group_offsets, group;
  std::vector<index_t> assigned;  ///< [E]: assignments chosen for e, before the capacity
  index_t capacity = -1;          ///< the per-expert limit (capped at N), or −1 for none
  index_t dropped = 0;            ///< assignments dropped by the capacity, over all experts
  /// E·Σ_e f_e·P_e with f_e = assigned[e] / N (the fraction of tokens sending an assignment to e:
  /// Σ_e f_e = k) and P_e = mean_t probs[t, e]: Hugging Face's load_balancing_loss_func (Switch's
  /// loss for k = 1): k when perfectly balanced. Computed in double; 0 when N = 0.
  double load_balancing_loss = 0;
  double z_loss = 0;    ///< mean_t logsumexp(z_t)², in double; 0 when N = 0
  double aux_loss = 0;  ///< load_balancing_coef·load_balancing_loss + z_loss_coef·z_loss

  /// n_e: the rows expert e runs on (its assignments that were not dropped).
  index_t kept(index_t expert) const { return group_offsets[expert + 1] - group_offsets[expert]; }
};

/// A sparse mixture of E experts, each token sent to k of them (Mixtral's SparseMoeBlock,
/// Switch's FFN layer): y_t = Σ_j g_{t,j}·expert_{e(t,j)}(x_t) over the kept assignments of
/// token t, summed in the order j = 0 … k − 1; a dropped assignment adds 0 (no residual here: the
/// decoder layer adds x). Top-k picks the largest scores, ties to the lowest expert index — a rule
/// of dissect's own: torch.topk leaves the order of ties unspecified (on the CPU it gives [6, 5]
/// for two of eight equal scores), so tied routings need not match torch's; softmax_of_top_k
/// ranks the logits, top_k_of_softmax the probabilities.
///
/// State-dict names: "router.weight" [E, D] (Hugging Face's "block_sparse_moe.gate.weight") and
/// "experts.<e>.gate.weight", "…up.weight", "…down.weight" (HF's w1, w3, w2).
///
/// A router logit that is NaN or ±Inf (from NaN or Inf in x or in the router's weight) is an
/// Error, not a NaN output: the choice of experts is discrete, and a non-finite score makes it
/// meaningless (a NaN never wins a comparison, so such a token would go to experts 0 … k − 1 with
/// NaN gates). Unlike a layer's IEEE propagation (docs/reliability.md rows 18 and 84), the block
/// says so at once. The check reads the N×E logits once after the router's product and allocates
/// nothing unless it throws.
///
/// The oracle beside this fast path is the per-token loop in tests/test_mixture_of_experts.cpp:
/// with row-independent experts, the grouped dispatch equals it bit for bit in double.
template <class Scalar, class Expert = GatedFeedForward<Scalar>>
class MixtureOfExperts : public ComposedModule<MixtureOfExperts<Scalar, Expert>> {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::MixtureOfExperts<Scalar>: Scalar must be float or double");
  static_assert(MoeExpert<Expert>,
                "dissect::MixtureOfExperts: the expert must be a module with forward(x), "
                "forward(x, cache), backward(x, cache, dy) and d_model() (FeedForward, "
                "GatedFeedForward)");
  static_assert(std::is_same_v<typename Expert::scalar_type, Scalar>,
                "dissect::MixtureOfExperts: the experts' scalar type must be the block's");

 public:
  using scalar_type = Scalar;
  using expert_type = Expert;

  /// What backward needs from forward; fill with forward(x, cache). Reused across steps of one
  /// shape, its tensors are reallocated only when an expert's token count changes.
  struct Cache {
    MoeRoute<Scalar> route;
    std::vector<Tensor<Scalar, 3>> inputs;        ///< expert e's gathered rows: [1, n_e, D]
    std::vector<Tensor<Scalar, 3>> outputs;       ///< expert e on them: [1, n_e, D]
    std::vector<typename Expert::Cache> experts;  ///< expert e's own cache
  };

  /// E experts D → F → D built with `options` (GatedFeedForward(d_model, d_ff) or
  /// FeedForward(d_model, d_ff, options.activation)) and a router D → E without bias.
  /// @throws ConfigError naming the field: d_model, d_ff or n_experts ≤ 0, top_k ∉ [1, E], a
  ///         gating outside the enum, a coefficient negative or not finite, capacity_factor ≤ 0
  ///         or not finite.
  MixtureOfExperts(index_t d_model, index_t d_ff, MixtureOfExpertsOptions options = {});

  /// A block around given parts: router [E, D] (no bias) and E experts of width D.
  /// @throws ConfigError as above, or if the router has a bias; ShapeError naming the router's
  ///         shape or the expert whose d_model differs.
  MixtureOfExperts(Linear<Scalar> router, std::vector<Expert> experts, MoeRouting routing = {});

  index_t d_model() const { return router_.in_features(); }
  index_t n_experts() const { return router_.out_features(); }
  index_t top_k() const { return routing_.top_k; }
  const MoeRouting& routing() const { return routing_; }
  /// New routing options (e.g. the auxiliary losses off for evaluation).
  /// @throws ConfigError as the constructor; the block unchanged.
  void set_routing(const MoeRouting& routing);

  /// [D] → [E] logits, no bias (Mixtral's "gate").
  Linear<Scalar>& router() { return router_; }
  const Linear<Scalar>& router() const { return router_; }
  /// @throws Error if e ∉ [0, E).
  Expert& expert(index_t e) { return experts_.at(checked_expert(e)); }
  const Expert& expert(index_t e) const { return experts_.at(checked_expert(e)); }
  // for_each_parameter ("router.weight", "experts.0.gate.weight", …), zero_grad,
  // parameter_count: from ComposedModule.

  /// x: [B, T, D] → the routing of its B·T tokens (the router's product and the choices; no
  /// expert runs). @throws ShapeError if x is not [B, T, D]; Error if a router logit is not
  /// finite, naming the op, the token (its index and x[b, t, :]), the expert and the shapes of
  /// x, the router's weight and the logits.
  MoeRoute<Scalar> route(ConstTensorView<Scalar, 3> x) const;

  /// x: [B, T, D] → y: [B, T, D], keeping nothing (each expert's forward without a cache: fused
  /// when the expert is packed). @throws ShapeError if x is not [B, T, D]; Error if a router
  /// logit is NaN or ±Inf (as route(), with the op MixtureOfExperts::forward).
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x) const;
  /// As forward, keeping the routing (its counts and losses) and what backward needs in `cache`.
  /// After a throw the cache fits no input: backward refuses it until a forward succeeds.
  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const;

  /// x: [B, T, D], cache from forward(x, cache), dy: [B, T, D] → dx: [B, T, D]: the gradient of
  /// Σ dy ⊙ y + cache.route.aux_loss. Adds to the gradients of the router and of every expert
  /// that received a token. A cache of the right shapes but from another x is not detected.
  /// @throws ShapeError (gradients untouched) if x, dy or the cache does not fit.
  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy);

 private:
  friend class ComposedModule<MixtureOfExperts>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child(module_names::router, self.router_, visit);
    visit_child(module_names::experts, self.experts_, visit);
  }

  std::size_t checked_expert(index_t e) const;
  void check_parts() const;
  void route_into(const char* op, ConstTensorView<Scalar, 3> x, MoeRoute<Scalar>& route) const;
  /// @throws Error naming op, the token and the shapes if a logit [N, E] is NaN or ±Inf.
  void check_logits(const char* op, ConstTensorView<Scalar, 3> x,
                    const Tensor<Scalar, 2>& logits) const;
  /// Expert e's rows of x, gathered in its group's order: [1, n_e, D].
  void gather(ConstTensorView<Scalar, 3> x, const MoeRoute<Scalar>& route, index_t e,
              Tensor<Scalar, 3>& rows) const;
  /// y_t = Σ_j g_{t,j}·outputs[e(t,j)][row(t,j)] over the kept j, in slot order.
  Tensor<Scalar, 3> combine(const Shape<3>& shape, const MoeRoute<Scalar>& route,
                            const std::vector<Tensor<Scalar, 3>>& outputs) const;
  void check_cache(const char* op, ConstTensorView<Scalar, 3> x, const Cache& cache) const;
  /// dz [N, E] += the gradient of cache.route.aux_loss.
  void aux_loss_backward(const MoeRoute<Scalar>& route, Scalar* dz) const;

  Linear<Scalar> router_;
  Stack<Expert> experts_;
  MoeRouting routing_;
};

/// "MixtureOfExperts(d_model=4096, n_experts=8, top_k=2, gating=softmax_of_top_k)".
template <class Scalar, class Expert>
std::ostream& operator<<(std::ostream& out, const MixtureOfExperts<Scalar, Expert>& block);

}  // namespace dissect

// The out-of-line definitions: the routing, the grouped dispatch and backward.
#include "dissect/blocks/detail/mixture_of_experts_impl.hpp"
