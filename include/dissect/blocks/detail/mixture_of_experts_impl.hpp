// dissect/blocks/detail/mixture_of_experts_impl.hpp — private: do not include directly
// (dissect/blocks/mixture_of_experts.hpp includes it at its end, after the class).
//
// MixtureOfExperts' out-of-line definitions: the checks of its options, routing (top-k, gates,
// capacity, the auxiliary losses), the grouped dispatch of forward, and backward through the
// experts, the gates and the router.
#pragma once

#ifndef DISSECT_PUBLIC_HEADER
#error \
    "dissect/blocks/detail/mixture_of_experts_impl.hpp is private to dissect: include dissect/blocks/mixture_of_experts.hpp instead"
#endif

namespace dissect {

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline constexpr std::array<std::string_view, 2> moe_gating_names{"softmax_of_top_k",
                                                                  "top_k_of_softmax"};

/// The routing options, checked for E experts. @throws ConfigError naming the field.
inline const MoeRouting& check_moe_routing(std::string_view op, const MoeRouting& routing,
                                           index_t n_experts) {
  if (routing.top_k < 1 || routing.top_k > n_experts) {
    throw ConfigError(concat(op, ": top_k must be in [1, n_experts = ", n_experts, "] (got ",
                             routing.top_k, ")"));
  }
  check_enum(op, "MoeGating", routing.gating, moe_gating_names);
  const std::pair<const char*, double> coefficients[] = {
      {"load_balancing_coef", routing.load_balancing_coef}, {"z_loss_coef", routing.z_loss_coef}};
  for (const auto& [field, value] : coefficients) {
    if (!(std::isfinite(value) && value >= 0)) {
      throw ConfigError(concat(op, ": ", field, " must be finite and >= 0 (got ", value, ")"));
    }
  }
  if (routing.capacity_factor) {
    require_positive_finite(op, "capacity_factor", *routing.capacity_factor);
  }
  return routing;
}

/// Expert e of a block built from sizes: SwiGLU or a plain FFN, seeded from the block's seed.
template <class Expert>
Expert make_expert(index_t d_model, index_t d_ff, const MixtureOfExpertsOptions& options,
                   index_t e) {
  const std::optional<std::uint64_t> seed =
      options.seed
          ? std::optional<std::uint64_t>(*options.seed + 1 + 3 * static_cast<std::uint64_t>(e))
          : std::nullopt;
  if constexpr (std::is_constructible_v<Expert, index_t, index_t, GatedFeedForwardOptions>) {
    GatedFeedForwardOptions expert_options;
    expert_options.bias = options.bias;
    expert_options.init = options.init;
    expert_options.seed = seed;
    return Expert(d_model, d_ff, expert_options);
  } else {
    static_assert(std::is_constructible_v<Expert, index_t, index_t, Activation, BlockOptions>,
                  "dissect::MixtureOfExperts(d_model, d_ff, options) builds GatedFeedForward or "
                  "FeedForward experts; build other experts yourself and pass them in");
    BlockOptions expert_options;
    expert_options.bias = options.bias;
    expert_options.init = options.init;
    expert_options.seed = seed;
    return Expert(d_model, d_ff, options.activation, expert_options);
  }
}

template <class Expert>
std::vector<Expert> make_experts(index_t d_model, index_t d_ff,
                                 const MixtureOfExpertsOptions& options) {
  require_positive("MixtureOfExperts", "n_experts", options.n_experts);
  std::vector<Expert> experts;
  experts.reserve(static_cast<std::size_t>(options.n_experts));
  for (index_t e = 0; e < options.n_experts; ++e) {
    experts.push_back(make_expert<Expert>(d_model, d_ff, options, e));
  }
  return experts;
}

inline LinearOptions router_options(const MixtureOfExpertsOptions& options) {
  LinearOptions router;
  router.bias = false;
  router.init = options.init;
  router.seed = options.seed;
  return router;
}

}  // namespace detail

inline const char* to_string(MoeGating gating) {
  return detail::enum_name(gating, detail::moe_gating_names).data();  // literals: terminated
}

template <class Scalar, class Expert>
MixtureOfExperts<Scalar, Expert>::MixtureOfExperts(index_t d_model, index_t d_ff,
                                                   MixtureOfExpertsOptions options)
    : router_((detail::check_moe_routing(
                   "MixtureOfExperts", options.routing,
                   require_positive("MixtureOfExperts", "n_experts", options.n_experts)),
               require_positive("MixtureOfExperts", "d_model", d_model)),
              options.n_experts, detail::router_options(options)),
      experts_(detail::make_experts<Expert>(d_model, d_ff, options)),
      routing_(options.routing) {}

template <class Scalar, class Expert>
MixtureOfExperts<Scalar, Expert>::MixtureOfExperts(Linear<Scalar> router,
                                                   std::vector<Expert> experts, MoeRouting routing)
    : router_(std::move(router)), experts_(std::move(experts)), routing_(routing) {
  check_parts();
}

template <class Scalar, class Expert>
void MixtureOfExperts<Scalar, Expert>::check_parts() const {
  constexpr const char* op = "MixtureOfExperts";
  const auto n = static_cast<index_t>(experts_.size());
  require_positive(op, "n_experts", n);
  detail::check_moe_routing(op, routing_, n);
  if (router_.has_bias()) {
    throw ConfigError("MixtureOfExperts: the router has a bias; the router is D → E without one");
  }
  const index_t d = experts_.at(0).d_model();
  if (router_.out_features() != n || router_.in_features() != d) {
    throw ShapeError(detail::concat(op, ": router weight must be [E, D] = [", n, ", ", d, "] for ",
                                    n, " experts of d_model ", d, ", got ",
                                    format_shape(router_.weight().shape())));
  }
  for (std::size_t e = 1; e < experts_.size(); ++e) {
    if (experts_.at(e).d_model() != d) {
      throw ShapeError(detail::concat(op, ": expert ", e, " has d_model ", experts_.at(e).d_model(),
                                      ", expert 0 has ", d));
    }
  }
}

template <class Scalar, class Expert>
void MixtureOfExperts<Scalar, Expert>::set_routing(const MoeRouting& routing) {
  routing_ = detail::check_moe_routing("MixtureOfExperts::set_routing", routing, n_experts());
}

template <class Scalar, class Expert>
std::size_t MixtureOfExperts<Scalar, Expert>::checked_expert(index_t e) const {
  if (e < 0 || e >= n_experts()) {
    throw Error(detail::concat("MixtureOfExperts::expert: index ", e, " is outside [0, ",
                               n_experts(), ")"));
  }
  return static_cast<std::size_t>(e);
}

template <class Scalar, class Expert>
MoeRoute<Scalar> MixtureOfExperts<Scalar, Expert>::route(ConstTensorView<Scalar, 3> x) const {
  check_block_tokens("MixtureOfExperts::route", "x", x, "D", d_model());
  MoeRoute<Scalar> result;
  route_into("MixtureOfExperts::route", x, result);
  return result;
}

template <class Scalar, class Expert>
void MixtureOfExperts<Scalar, Expert>::check_logits(const char* op, ConstTensorView<Scalar, 3> x,
                                                    const Tensor<Scalar, 2>& logits) const {
  // One pass over the N·E logits, E ≪ D: a few percent of the router's own product. isfinite
  // catches NaN and ±Inf alike; each makes the softmax NaN (Inf − Inf) and the top-k arbitrary.
  const index_t n = logits.dim(0), e_count = logits.dim(1);
  const Scalar* z = logits.data();
  for (index_t i = 0; i < n * e_count; ++i) {
    if (std::isfinite(z[i])) continue;
    const index_t t = i / e_count, e = i % e_count, seq = x.dim(1);
    throw Error(detail::concat(
        op, ": router logit z[", t, ", ", e, "] is ",
        std::isnan(z[i]) ? "nan" : (z[i] > 0 ? "inf" : "-inf"), " (token ", t, " = x[", t / seq,
        ", ", t % seq, ", :]; x: ", format_shape(x.shape()), ", router weight: ",
        format_shape(router_.weight().shape()), ", logits: ", format_shape(logits.shape()),
        "): a non-finite logit has no top-k; look for NaN or Inf in x or in router.weight"));
  }
}

// x: [B, T, D]  W_router: [E, D]  →  route: logits, probs [N, E], gates [N, k], groups.
template <class Scalar, class Expert>
void MixtureOfExperts<Scalar, Expert>::route_into(const char* op, ConstTensorView<Scalar, 3> x,
                                                  MoeRoute<Scalar>& r) const {
  const index_t n = checked_mul(x.dim(0), x.dim(1), "MixtureOfExperts: B·T");
  const index_t e_count = n_experts(), k = routing_.top_k;
  const index_t assignments = checked_mul(n, k, "MixtureOfExperts: B·T·top_k");
  // Until the routing is whole, the route fits no input: a backward with a cache whose forward
  // threw is refused by check_cache instead of reading half-overwritten buffers.
  r.tokens = -1;
  r.n_experts = e_count;
  r.top_k = k;
  auto logits = reuse_buffer(r.logits, Shape<2>{n, e_count});
  router_.forward_into(x, logits.reshape(Shape<3>{x.dim(0), x.dim(1), e_count}));
  check_logits(op, x, r.logits);
  reuse_buffer(r.probs, Shape<2>{n, e_count});
  reuse_buffer(r.logsumexp, Shape<1>{n});
  reuse_buffer(r.gates, Shape<2>{n, k});
  r.experts.assign(static_cast<std::size_t>(assignments), 0);
  r.rows.assign(static_cast<std::size_t>(assignments), -1);
  r.assigned.assign(static_cast<std::size_t>(e_count), 0);

  const bool mixtral = routing_.gating == MoeGating::softmax_of_top_k;
  for (index_t t = 0; t < n; ++t) {
    const Scalar* z = r.logits.data() + t * e_count;
    Scalar* p = r.probs.data() + t * e_count;
    index_t* chosen = r.experts.data() + t * k;
    Scalar* g = r.gates.data() + t * k;
    r.logsumexp(t) = detail::softmax_row(z, e_count, p);
    detail::top_k_row(mixtral ? z : p, e_count, k, chosen);
    if (mixtral) {
      detail::softmax_of_top_k_gates(z, chosen, k, g);
    } else {
      detail::top_k_of_softmax_gates(p, chosen, k, routing_.renormalize, g);
    }
    for (index_t j = 0; j < k; ++j) ++r.assigned[static_cast<std::size_t>(chosen[j])];
  }

  // Capacity, then the groups: each expert's assignments in token order, the first `capacity`
  // kept (a token goes to an expert at most once, so token order is the assignments' order).
  r.capacity = -1;
  if (routing_.capacity_factor) {
    const double limit = std::ceil(*routing_.capacity_factor * static_cast<double>(assignments) /
                                   static_cast<double>(e_count));
    r.capacity = limit >= static_cast<double>(n) ? n : static_cast<index_t>(limit);
  }
  std::vector<index_t> fill(static_cast<std::size_t>(e_count), 0);
  r.dropped = 0;
  for (index_t a = 0; a < assignments; ++a) {
    auto& count = fill[static_cast<std::size_t>(r.experts[static_cast<std::size_t>(a)])];
    if (r.capacity >= 0 && count >= r.capacity) {
      ++r.dropped;
    } else {
      r.rows[static_cast<std::size_t>(a)] = count++;
    }
  }
  r.group_offsets.assign(static_cast<std::size_t>(e_count) + 1, 0);
  for (index_t e = 0; e < e_count; ++e) {
    r.group_offsets[static_cast<std::size_t>(e) + 1] =
        r.group_offsets[static_cast<std::size_t>(e)] + fill[static_cast<std::size_t>(e)];
  }
  r.group.assign(static_cast<std::size_t>(r.group_offsets.back()), 0);
  for (index_t a = 0; a < assignments; ++a) {
    const index_t row = r.rows[static_cast<std::size_t>(a)];
    if (row < 0) continue;
    const auto e = static_cast<std::size_t>(r.experts[static_cast<std::size_t>(a)]);
    r.group[static_cast<std::size_t>(r.group_offsets[e] + row)] = a;
  }

  // The auxiliary losses, in double: E·Σ_e f_e·P_e and mean_t lse_t².
  r.load_balancing_loss = r.z_loss = 0;
  if (n > 0) {
    for (index_t e = 0; e < e_count; ++e) {
      double mean_p = 0;
      for (index_t t = 0; t < n; ++t) mean_p += static_cast<double>(r.probs(t, e));
      const double f =
          static_cast<double>(r.assigned[static_cast<std::size_t>(e)]) / static_cast<double>(n);
      r.load_balancing_loss += f * (mean_p / static_cast<double>(n));
    }
    r.load_balancing_loss *= static_cast<double>(e_count);
    for (index_t t = 0; t < n; ++t) {
      const double lse = static_cast<double>(r.logsumexp(t));
      r.z_loss += lse * lse;
    }
    r.z_loss /= static_cast<double>(n);
  }
  r.aux_loss =
      routing_.load_balancing_coef * r.load_balancing_loss + routing_.z_loss_coef * r.z_loss;
  r.tokens = n;
}

template <class Scalar, class Expert>
void MixtureOfExperts<Scalar, Expert>::gather(ConstTensorView<Scalar, 3> x,
                                              const MoeRoute<Scalar>& r, index_t e,
                                              Tensor<Scalar, 3>& rows) const {
  const index_t d = d_model(), k = r.top_k;
  const index_t first = r.group_offsets[static_cast<std::size_t>(e)];
  reuse_buffer(rows, Shape<3>{1, r.kept(e), d});
  for (index_t row = 0; row < r.kept(e); ++row) {
    const index_t t = r.group[static_cast<std::size_t>(first + row)] / k;
    std::copy_n(x.data() + t * d, d, rows.data() + row * d);
  }
}

template <class Scalar, class Expert>
Tensor<Scalar, 3> MixtureOfExperts<Scalar, Expert>::combine(
    const Shape<3>& shape, const MoeRoute<Scalar>& r,
    const std::vector<Tensor<Scalar, 3>>& outputs) const {
  const index_t d = d_model(), k = r.top_k;
  Tensor<Scalar, 3> y(shape);  // zeros: a token whose every assignment was dropped gets 0
  for (index_t t = 0; t < r.tokens; ++t) {
    Scalar* y_t = y.data() + t * d;
    for (index_t j = 0; j < k; ++j) {
      const index_t a = t * k + j, row = r.rows[static_cast<std::size_t>(a)];
      if (row < 0) continue;
      const Scalar gate = r.gates.data()[a];
      const Scalar* o =
          outputs[static_cast<std::size_t>(r.experts[static_cast<std::size_t>(a)])].data() +
          row * d;
      for (index_t i = 0; i < d; ++i) y_t[i] += gate * o[i];
    }
  }
  return y;
}

template <class Scalar, class Expert>
Tensor<Scalar, 3> MixtureOfExperts<Scalar, Expert>::forward(ConstTensorView<Scalar, 3> x) const {
  check_block_tokens("MixtureOfExperts::forward", "x", x, "D", d_model());
  MoeRoute<Scalar> r;
  route_into("MixtureOfExperts::forward", x, r);
  std::vector<Tensor<Scalar, 3>> outputs(static_cast<std::size_t>(n_experts()));
  Tensor<Scalar, 3> rows;
  for (index_t e = 0; e < n_experts(); ++e) {
    if (r.kept(e) == 0) continue;  // an expert no token reached does not run
    gather(x, r, e, rows);
    outputs[static_cast<std::size_t>(e)] = expert(e).forward(rows.cview());
  }
  return combine(x.shape(), r, outputs);
}

template <class Scalar, class Expert>
Tensor<Scalar, 3> MixtureOfExperts<Scalar, Expert>::forward(ConstTensorView<Scalar, 3> x,
                                                            Cache& cache) const {
  check_block_tokens("MixtureOfExperts::forward", "x", x, "D", d_model());
  auto& r = cache.route;
  route_into("MixtureOfExperts::forward", x, r);
  const auto count = static_cast<std::size_t>(n_experts());
  cache.inputs.resize(count);
  cache.outputs.resize(count);
  cache.experts.resize(count);
  for (index_t e = 0; e < n_experts(); ++e) {
    const auto i = static_cast<std::size_t>(e);
    gather(x, r, e, cache.inputs[i]);
    if (r.kept(e) == 0) {
      reuse_buffer(cache.outputs[i], cache.inputs[i].shape());
      continue;
    }
    cache.outputs[i] = expert(e).forward(cache.inputs[i].cview(), cache.experts[i]);
  }
  return combine(x.shape(), r, cache.outputs);
}

template <class Scalar, class Expert>
void MixtureOfExperts<Scalar, Expert>::check_cache(const char* op, ConstTensorView<Scalar, 3> x,
                                                   const Cache& cache) const {
  const auto& r = cache.route;
  const index_t n = x.dim(0) * x.dim(1), e_count = n_experts(), k = routing_.top_k;
  const auto count = static_cast<std::size_t>(e_count);
  bool fits = r.tokens == n && r.n_experts == e_count && r.top_k == k &&
              r.logits.shape() == Shape<2>{n, e_count} && r.probs.shape() == Shape<2>{n, e_count} &&
              r.logsumexp.shape() == Shape<1>{n} && r.gates.shape() == Shape<2>{n, k} &&
              r.experts.size() == static_cast<std::size_t>(n * k) &&
              r.rows.size() == r.experts.size() && r.group_offsets.size() == count + 1 &&
              r.assigned.size() == count && cache.inputs.size() == count &&
              cache.outputs.size() == count && cache.experts.size() == count;
  for (std::size_t e = 0; fits && e < count; ++e) {
    const Shape<3> rows{1, r.kept(static_cast<index_t>(e)), d_model()};
    fits = cache.inputs[e].shape() == rows && cache.outputs[e].shape() == rows;
  }
  if (!fits) {
    if (r.tokens < 0) {  // route_into threw (a non-finite logit) before the routing was whole
      throw ShapeError(detail::concat(op, ": the cache does not fit x ", format_shape(x.shape()),
                                      " (the forward that filled it threw)", block_cache_hint));
    }
    throw ShapeError(detail::concat(op, ": the cache does not fit x ", format_shape(x.shape()),
                                    " (it routed ", r.tokens, " tokens to top ", r.top_k, " of ",
                                    r.n_experts, " experts; x has ", n, " tokens for top ", k,
                                    " of ", e_count, ")", block_cache_hint));
  }
}

template <class Scalar, class Expert>
void MixtureOfExperts<Scalar, Expert>::aux_loss_backward(const MoeRoute<Scalar>& r,
                                                         Scalar* dz) const {
  const index_t n = r.tokens, e_count = r.n_experts;
  if (n == 0) return;
  // Load balancing: f_e is a count (no gradient); d/dz_t of E·Σ_e f_e·mean_t p_{t,e} is
  // (E/N)·p_t ⊙ (f − ⟨f, p_t⟩).
  if (routing_.load_balancing_coef != 0) {
    const auto scale = static_cast<Scalar>(routing_.load_balancing_coef *
                                           static_cast<double>(e_count) / static_cast<double>(n));
    std::vector<Scalar> f(static_cast<std::size_t>(e_count));
    for (index_t e = 0; e < e_count; ++e) {
      f[static_cast<std::size_t>(e)] = static_cast<Scalar>(
          static_cast<double>(r.assigned[static_cast<std::size_t>(e)]) / static_cast<double>(n));
    }
    for (index_t t = 0; t < n; ++t) {
      const Scalar* p = r.probs.data() + t * e_count;
      Scalar dot = 0;
      for (index_t e = 0; e < e_count; ++e) dot += f[static_cast<std::size_t>(e)] * p[e];
      for (index_t e = 0; e < e_count; ++e) {
        dz[t * e_count + e] += scale * p[e] * (f[static_cast<std::size_t>(e)] - dot);
      }
    }
  }
  // z-loss: d/dz_t of mean_t lse_t² is (2/N)·lse_t·softmax(z_t).
  if (routing_.z_loss_coef != 0) {
    const auto scale = static_cast<Scalar>(2 * routing_.z_loss_coef / static_cast<double>(n));
    for (index_t t = 0; t < n; ++t) {
      const Scalar factor = scale * r.logsumexp(t);
      const Scalar* p = r.probs.data() + t * e_count;
      for (index_t e = 0; e < e_count; ++e) dz[t * e_count + e] += factor * p[e];
    }
  }
}

// x: [B, T, D], dy: [B, T, D]  →  dx: [B, T, D]; d W_router += dzᵀ·x, each expert's gradients.
template <class Scalar, class Expert>
Tensor<Scalar, 3> MixtureOfExperts<Scalar, Expert>::backward(ConstTensorView<Scalar, 3> x,
                                                             const Cache& cache,
                                                             ConstTensorView<Scalar, 3> dy) {
  constexpr const char* op = "MixtureOfExperts::backward";
  check_block_tokens(op, "x", x, "D", d_model());
  check_block_shape(op, "dy", dy, detail::token_shape_text("D", d_model()), x.shape(), "x",
                    format_shape(x.shape()));
  check_cache(op, x, cache);
  const auto& r = cache.route;
  const index_t n = r.tokens, e_count = n_experts(), k = r.top_k, d = d_model();

  // Gate gradients dg_{t,j} = ⟨dy_t, o_{t,j}⟩ (0 for a dropped assignment), and each expert's
  // output gradient: its rows of dy, each scaled by its gate.
  Tensor<Scalar, 2> dg({n, k});
  std::vector<Tensor<Scalar, 3>> d_outputs(static_cast<std::size_t>(e_count));
  for (index_t e = 0; e < e_count; ++e) {
    const auto i = static_cast<std::size_t>(e);
    d_outputs[i] = Tensor<Scalar, 3>::uninitialized(cache.outputs[i].shape());
    for (index_t row = 0; row < r.kept(e); ++row) {
      const index_t a = r.group[static_cast<std::size_t>(r.group_offsets[i] + row)];
      const Scalar gate = r.gates.data()[a];
      const Scalar* dy_t = dy.data() + (a / k) * d;
      const Scalar* o = cache.outputs[i].data() + row * d;
      Scalar* d_o = d_outputs[i].data() + row * d;
      Scalar dot = 0;
      for (index_t c = 0; c < d; ++c) {
        dot += dy_t[c] * o[c];
        d_o[c] = gate * dy_t[c];
      }
      dg.data()[a] = dot;
    }
  }

  // Back through the gates to the logits, then the auxiliary losses.
  Tensor<Scalar, 2> dz({n, e_count});
  std::vector<Scalar> scratch(static_cast<std::size_t>(e_count));
  for (index_t t = 0; t < n; ++t) {
    const index_t* chosen = r.experts.data() + t * k;
    const Scalar* g = r.gates.data() + t * k;
    if (routing_.gating == MoeGating::softmax_of_top_k) {
      detail::softmax_of_top_k_backward(chosen, k, g, dg.data() + t * k, dz.data() + t * e_count);
    } else {
      detail::top_k_of_softmax_backward(r.probs.data() + t * e_count, e_count, chosen, k,
                                        routing_.renormalize, g, dg.data() + t * k,
                                        dz.data() + t * e_count, scratch.data());
    }
  }
  aux_loss_backward(r, dz.data());

  // dx = the router's part, then each kept assignment's expert row, in slot order.
  auto dx = router_.backward(x, dz.view().reshape(Shape<3>{x.dim(0), x.dim(1), e_count}));
  std::vector<Tensor<Scalar, 3>> d_inputs(static_cast<std::size_t>(e_count));
  for (index_t e = 0; e < e_count; ++e) {
    const auto i = static_cast<std::size_t>(e);
    if (r.kept(e) == 0) continue;
    d_inputs[i] =
        expert(e).backward(cache.inputs[i].cview(), cache.experts[i], d_outputs[i].cview());
  }
  for (index_t t = 0; t < n; ++t) {
    Scalar* dx_t = dx.data() + t * d;
    for (index_t j = 0; j < k; ++j) {
      const index_t a = t * k + j, row = r.rows[static_cast<std::size_t>(a)];
      if (row < 0) continue;
      const Scalar* d_in =
          d_inputs[static_cast<std::size_t>(r.experts[static_cast<std::size_t>(a)])].data() +
          row * d;
      for (index_t c = 0; c < d; ++c) dx_t[c] += d_in[c];
    }
  }
  return dx;
}

// ---- printing -----------------------------------------------------------------------------------

template <class Scalar, class Expert>
std::ostream& operator<<(std::ostream& out, const MixtureOfExperts<Scalar, Expert>& block) {
  out << "MixtureOfExperts(d_model=" << block.d_model() << ", n_experts=" << block.n_experts()
      << ", top_k=" << block.top_k() << ", gating=" << to_string(block.routing().gating);
  if (block.routing().capacity_factor) {
    out << ", capacity_factor=" << *block.routing().capacity_factor;
  }
  return out << ')';
}

}  // namespace dissect
