// Tests for dissect/blocks/mixture_of_experts.hpp: the block against a hand-written PyTorch
// reference of Mixtral's sparse MoE block and of Switch's and DeepSeek's gating (fixtures, float
// and double: forward, dx, every expert's and the router's gradients, the auxiliary losses and
// their gradient alone), the grouped dispatch against the naive per-token loop bit for bit in
// double, finite differences in double away from gating ties, the routing by hand (ties, the
// capacity, the dropped-assignment count, an expert that receives no token, empty batches), and
// the errors of bad configs and shapes (docs/reliability.md row 78) and of router logits that are
// not finite (row 84).
#include "dissect/blocks/mixture_of_experts.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <string>
#include <vector>

#include "support/fixture.hpp"
#include "support/fixture_testing.hpp"
#include "support/gradcheck.hpp"
#include "support/tensor_testing.hpp"

namespace dissect {
namespace test_mixture_of_experts {

using testing::gradcheck;
using testing::random_tensor;
using testing::tensor_from;

// ---- a row-independent expert: the bit-for-bit oracle's ground ---------------------------------
//
// SwiGLU computed row by row with plain loops, and a backward that adds each row's outer product
// into the weight gradients as it goes: its result for a row never depends on the other rows it
// runs with, and its gradients after rows r₀, r₁, … are the same sums whether the rows come in one
// call or one call each. (dissect's Linear is row-independent only up to rounding: Eigen's GEMM,
// GEMV and coefficient products sum in different orders.) With it, the grouped dispatch and the
// per-token loop below must agree bit for bit, which proves that gathering, gating, dropping and
// scattering add no arithmetic of their own.
template <class Scalar>
class RowwiseExpert : public ComposedModule<RowwiseExpert<Scalar>> {
 public:
  using scalar_type = Scalar;
  struct Cache {
    Tensor<Scalar, 3> gate, up;  // [1, n, F]
  };

  RowwiseExpert(index_t d_model, index_t d_ff, std::uint64_t seed)
      : gate_(d_model, d_ff, bias_free(seed)),
        up_(d_model, d_ff, bias_free(seed + 1)),
        down_(d_ff, d_model, bias_free(seed + 2)) {}

  index_t d_model() const { return gate_.in_features(); }
  index_t d_ff() const { return gate_.out_features(); }
  Linear<Scalar>& gate() { return gate_; }
  Linear<Scalar>& up() { return up_; }
  Linear<Scalar>& down() { return down_; }
  /// Forward calls since construction: one per expert per step proves the grouped dispatch.
  int forward_calls() const { return forward_calls_; }

  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x) const {
    Cache cache;
    return forward(x, cache);
  }

  Tensor<Scalar, 3> forward(ConstTensorView<Scalar, 3> x, Cache& cache) const {
    ++forward_calls_;
    const index_t rows = x.dim(0) * x.dim(1), d = d_model(), f = d_ff();
    cache.gate = Tensor<Scalar, 3>({x.dim(0), x.dim(1), f});
    cache.up = Tensor<Scalar, 3>({x.dim(0), x.dim(1), f});
    Tensor<Scalar, 3> y(x.shape());
    std::vector<Scalar> hidden(static_cast<std::size_t>(f));
    for (index_t r = 0; r < rows; ++r) {
      const Scalar* x_r = x.data() + r * d;
      for (index_t j = 0; j < f; ++j) {
        Scalar g = 0, u = 0;
        for (index_t c = 0; c < d; ++c) {
          g += x_r[c] * gate_.weight()(j, c);
          u += x_r[c] * up_.weight()(j, c);
        }
        cache.gate.data()[r * f + j] = g;
        cache.up.data()[r * f + j] = u;
        hidden[static_cast<std::size_t>(j)] = silu(g) * u;
      }
      for (index_t c = 0; c < d; ++c) {
        Scalar sum = 0;
        for (index_t j = 0; j < f; ++j)
          sum += hidden[static_cast<std::size_t>(j)] * down_.weight()(c, j);
        y.data()[r * d + c] = sum;
      }
    }
    return y;
  }

  Tensor<Scalar, 3> backward(ConstTensorView<Scalar, 3> x, const Cache& cache,
                             ConstTensorView<Scalar, 3> dy) {
    const index_t rows = x.dim(0) * x.dim(1), d = d_model(), f = d_ff();
    Tensor<Scalar, 3> dx(x.shape());
    std::vector<Scalar> d_gate(static_cast<std::size_t>(f)), d_up(d_gate.size());
    for (index_t r = 0; r < rows; ++r) {
      const Scalar* x_r = x.data() + r * d;
      const Scalar* dy_r = dy.data() + r * d;
      for (index_t j = 0; j < f; ++j) {
        const Scalar g = cache.gate.data()[r * f + j], u = cache.up.data()[r * f + j];
        Scalar dh = 0;
        for (index_t c = 0; c < d; ++c) {
          dh += dy_r[c] * down_.weight()(c, j);
          down_.weight_grad()(c, j) += dy_r[c] * (silu(g) * u);
        }
        const Scalar s = 1 / (1 + std::exp(-g));
        d_up[static_cast<std::size_t>(j)] = dh * silu(g);
        d_gate[static_cast<std::size_t>(j)] = dh * u * s * (1 + g * (1 - s));
      }
      for (index_t c = 0; c < d; ++c) {
        Scalar sum = 0;
        for (index_t j = 0; j < f; ++j) {
          sum += d_gate[static_cast<std::size_t>(j)] * gate_.weight()(j, c) +
                 d_up[static_cast<std::size_t>(j)] * up_.weight()(j, c);
          gate_.weight_grad()(j, c) += d_gate[static_cast<std::size_t>(j)] * x_r[c];
          up_.weight_grad()(j, c) += d_up[static_cast<std::size_t>(j)] * x_r[c];
        }
        dx.data()[r * d + c] = sum;
      }
    }
    return dx;
  }

 private:
  friend class ComposedModule<RowwiseExpert>;
  template <class Self, class Visitor>
  static void visit_members(Self& self, Visitor& visit) {
    visit_child("gate", self.gate_, visit);
    visit_child("up", self.up_, visit);
    visit_child("down", self.down_, visit);
  }
  static LinearOptions bias_free(std::uint64_t seed) {
    LinearOptions options;
    options.bias = false;
    options.seed = seed;
    return options;
  }
  static Scalar silu(Scalar g) { return g / (1 + std::exp(-g)); }

  Linear<Scalar> gate_, up_, down_;
  mutable int forward_calls_ = 0;
};

static_assert(MoeExpert<RowwiseExpert<double>>);
static_assert(MoeExpert<GatedFeedForward<float>> && MoeExpert<FeedForward<double>>);

// ---- the naive per-token loop: the oracle of the grouped dispatch
// --------------------------------
//
// Token by token, choice by choice: the router's logits (one product over x, as the block takes
// them), the softmax, the top-k by a stable sort of (score descending, index ascending), the gates,
// the capacity by a running count, each chosen expert on the token's row alone, y_t accumulated in
// slot order; backward the same way round. Independent of the block's code except for the
// formulas, which it writes with the same operations in the same order so that double agrees bit
// for bit.
template <class Scalar, class Expert>
struct NaiveMoe {
  MixtureOfExperts<Scalar, Expert>& block;  // its router and experts receive the gradients

  struct Choice {
    index_t expert;
    Scalar gate;
    bool kept;
    Tensor<Scalar, 3> input, output;  // [1, 1, D]
    typename Expert::Cache cache;
  };
  struct Token {
    std::vector<Scalar> z, p;
    Scalar lse = 0;
    std::vector<Choice> choices;
  };
  std::vector<Token> tokens;
  std::vector<index_t> assigned;

  Tensor<Scalar, 3> forward(const Tensor<Scalar, 3>& x) {
    const auto& routing = block.routing();
    const index_t n = x.dim(0) * x.dim(1), d = x.dim(2), e_count = block.n_experts(),
                  k = routing.top_k;
    const auto logits = block.router().forward(x);
    index_t capacity = -1;
    if (routing.capacity_factor) {
      capacity = std::min<index_t>(
          n, static_cast<index_t>(
                 std::ceil(*routing.capacity_factor * static_cast<double>(n * k) / e_count)));
    }
    std::vector<index_t> fill(static_cast<std::size_t>(e_count), 0);
    assigned.assign(static_cast<std::size_t>(e_count), 0);
    tokens.assign(static_cast<std::size_t>(n), Token{});
    Tensor<Scalar, 3> y(x.shape());
    for (index_t t = 0; t < n; ++t) {
      Token& token = tokens[static_cast<std::size_t>(t)];
      token.z.assign(logits.data() + t * e_count, logits.data() + (t + 1) * e_count);
      token.p.resize(token.z.size());
      const Scalar max = *std::max_element(token.z.begin(), token.z.end());
      Scalar sum = 0;
      for (index_t e = 0; e < e_count; ++e) sum += token.p[e] = std::exp(token.z[e] - max);
      for (auto& p : token.p) p /= sum;
      token.lse = max + std::log(sum);
      const bool mixtral = routing.gating == MoeGating::softmax_of_top_k;
      const auto& score = mixtral ? token.z : token.p;
      std::vector<index_t> order(static_cast<std::size_t>(e_count));
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](index_t a, index_t b) { return score[a] > score[b]; });
      std::vector<Scalar> gates(static_cast<std::size_t>(k));
      if (mixtral) {
        Scalar top = token.z[order[0]];
        for (index_t j = 1; j < k; ++j) top = std::max(top, token.z[order[j]]);
        Scalar total = 0;
        for (index_t j = 0; j < k; ++j) total += gates[j] = std::exp(token.z[order[j]] - top);
        for (auto& g : gates) g /= total;
      } else {
        Scalar total = 0;
        for (index_t j = 0; j < k; ++j) total += gates[j] = token.p[order[j]];
        if (routing.renormalize)
          for (auto& g : gates) g /= total;
      }
      for (index_t j = 0; j < k; ++j) {
        const index_t e = order[j];
        ++assigned[e];
        Choice choice{e, gates[j], capacity < 0 || fill[e] < capacity, {}, {}, {}};
        if (choice.kept) {
          ++fill[e];
          choice.input = Tensor<Scalar, 3>({1, 1, d});
          std::copy_n(x.data() + t * d, d, choice.input.data());
          choice.output = block.expert(e).forward(choice.input.cview(), choice.cache);
          for (index_t c = 0; c < d; ++c)
            y.data()[t * d + c] += choice.gate * choice.output.data()[c];
        }
        token.choices.push_back(std::move(choice));
      }
    }
    return y;
  }

  Tensor<Scalar, 3> backward(const Tensor<Scalar, 3>& x, const Tensor<Scalar, 3>& dy) {
    const auto& routing = block.routing();
    const index_t n = x.dim(0) * x.dim(1), d = x.dim(2), e_count = block.n_experts(),
                  k = routing.top_k;
    Tensor<Scalar, 2> dz({n, e_count});
    std::vector<Tensor<Scalar, 3>> d_inputs;  // per token and choice, in order
    for (index_t t = 0; t < n; ++t) {
      Token& token = tokens[static_cast<std::size_t>(t)];
      std::vector<Scalar> dg(static_cast<std::size_t>(k), 0);
      for (index_t j = 0; j < k; ++j) {
        Choice& choice = token.choices[static_cast<std::size_t>(j)];
        if (!choice.kept) continue;
        Tensor<Scalar, 3> d_out({1, 1, d});
        for (index_t c = 0; c < d; ++c) {
          dg[j] += dy.data()[t * d + c] * choice.output.data()[c];
          d_out.data()[c] = choice.gate * dy.data()[t * d + c];
        }
        d_inputs.push_back(block.expert(choice.expert)
                               .backward(choice.input.cview(), choice.cache, d_out.cview()));
      }
      Scalar* dz_t = dz.data() + t * e_count;
      Scalar dot = 0;
      for (index_t j = 0; j < k; ++j) dot += token.choices[j].gate * dg[j];
      if (routing.gating == MoeGating::softmax_of_top_k) {
        for (index_t j = 0; j < k; ++j) {
          dz_t[token.choices[j].expert] += token.choices[j].gate * (dg[j] - dot);
        }
      } else {
        std::vector<Scalar> dp(static_cast<std::size_t>(e_count), 0);
        Scalar total = 0;
        for (index_t j = 0; j < k; ++j) total += token.p[token.choices[j].expert];
        for (index_t j = 0; j < k; ++j) {
          dp[token.choices[j].expert] = routing.renormalize ? (dg[j] - dot) / total : dg[j];
        }
        Scalar inner = 0;
        for (index_t e = 0; e < e_count; ++e) inner += token.p[e] * dp[e];
        for (index_t e = 0; e < e_count; ++e) dz_t[e] += token.p[e] * (dp[e] - inner);
      }
    }
    if (n > 0 && routing.load_balancing_coef != 0) {
      const auto scale = static_cast<Scalar>(routing.load_balancing_coef * e_count / n);
      for (index_t t = 0; t < n; ++t) {
        const auto& p = tokens[static_cast<std::size_t>(t)].p;
        std::vector<Scalar> f(static_cast<std::size_t>(e_count));
        Scalar dot = 0;
        for (index_t e = 0; e < e_count; ++e) {
          f[e] = static_cast<Scalar>(static_cast<double>(assigned[e]) / n);
          dot += f[e] * p[e];
        }
        for (index_t e = 0; e < e_count; ++e) dz(t, e) += scale * p[e] * (f[e] - dot);
      }
    }
    if (n > 0 && routing.z_loss_coef != 0) {
      const auto scale = static_cast<Scalar>(2 * routing.z_loss_coef / n);
      for (index_t t = 0; t < n; ++t) {
        const auto& token = tokens[static_cast<std::size_t>(t)];
        for (index_t e = 0; e < e_count; ++e) dz(t, e) += scale * token.lse * token.p[e];
      }
    }
    auto dx = block.router().backward(x, dz.reshape(Shape<3>{x.dim(0), x.dim(1), e_count}));
    std::size_t next = 0;
    for (index_t t = 0; t < n; ++t) {
      for (const Choice& choice : tokens[static_cast<std::size_t>(t)].choices) {
        if (!choice.kept) continue;
        const auto& d_in = d_inputs[next++];
        for (index_t c = 0; c < d; ++c) dx.data()[t * d + c] += d_in.data()[c];
      }
    }
    return dx;
  }
};

// ---- helpers ------------------------------------------------------------------------------------

MoeRouting routing_of(index_t top_k, MoeGating gating, bool renormalize, double lb, double z,
                      std::optional<double> capacity) {
  MoeRouting routing;
  routing.top_k = top_k;
  routing.gating = gating;
  routing.renormalize = renormalize;
  routing.load_balancing_coef = lb;
  routing.z_loss_coef = z;
  routing.capacity_factor = capacity;
  return routing;
}

MixtureOfExpertsOptions options_of(index_t n_experts, const MoeRouting& routing,
                                   std::uint64_t seed) {
  MixtureOfExpertsOptions options;
  options.n_experts = n_experts;
  options.routing = routing;
  options.seed = seed;
  return options;
}

template <class Scalar>
MixtureOfExperts<Scalar, RowwiseExpert<Scalar>> rowwise_block(index_t d, index_t f,
                                                              index_t n_experts,
                                                              const MoeRouting& routing,
                                                              std::uint64_t seed) {
  LinearOptions router_options;
  router_options.bias = false;
  router_options.seed = seed;
  std::vector<RowwiseExpert<Scalar>> experts;
  for (index_t e = 0; e < n_experts; ++e) experts.emplace_back(d, f, seed + 1 + 3 * e);
  return {Linear<Scalar>(d, n_experts, router_options), std::move(experts), routing};
}

/// Every parameter gradient of a module, by state_dict name, as flat copies.
template <Module M>
std::map<std::string, std::vector<double>> gradients_of(const M& module) {
  std::map<std::string, std::vector<double>> grads;
  module.for_each_parameter([&](const ParameterName& name, auto, auto grad) {
    grads[name.str()] = std::vector<double>(grad.begin(), grad.end());
  });
  return grads;
}

/// The least gap, over tokens, between the k-th and (k+1)-th score the block ranks: how far the
/// routing is from a tie (∞ when k = E).
template <class Scalar>
double tie_margin(const MoeRoute<Scalar>& route, MoeGating gating) {
  double margin = std::numeric_limits<double>::infinity();
  if (route.top_k == route.n_experts) return margin;
  for (index_t t = 0; t < route.tokens; ++t) {
    const auto& scores = gating == MoeGating::softmax_of_top_k ? route.logits : route.probs;
    std::vector<double> row(scores.data() + t * route.n_experts,
                            scores.data() + (t + 1) * route.n_experts);
    std::sort(row.rbegin(), row.rend());
    margin = std::min(margin, row[route.top_k - 1] - row[route.top_k]);
  }
  return margin;
}

// ---- the grouped dispatch equals the per-token loop, bit for bit --------------------------------

struct RoutingCase {
  const char* name;
  index_t n_experts;
  MoeRouting routing;
};

std::vector<RoutingCase> routing_cases() {
  return {
      {"mixtral E4 k2 + both losses", 4,
       routing_of(2, MoeGating::softmax_of_top_k, false, 0.02, 0.001, std::nullopt)},
      {"switch E4 k1 capacity 1", 4,
       routing_of(1, MoeGating::top_k_of_softmax, false, 0.01, 0.001, 1.0)},
      {"deepseek E6 k3 renormalised capacity 1.25", 6,
       routing_of(3, MoeGating::top_k_of_softmax, true, 0.01, 0, 1.25)},
      {"mixtral E8 k2 capacity 0.5", 8,
       routing_of(2, MoeGating::softmax_of_top_k, false, 0, 0.001, 0.5)},
      {"k = E = 3", 3,
       routing_of(3, MoeGating::softmax_of_top_k, false, 0.02, 0.001, std::nullopt)},
      {"E = 1", 1, routing_of(1, MoeGating::top_k_of_softmax, true, 0.02, 0.001, std::nullopt)},
  };
}

TEST(MoeDispatch, GroupedEqualsThePerTokenLoopBitForBitInDouble) {
  std::mt19937_64 engine(2701);
  int trials = 0;
  for (const auto& c : routing_cases()) {
    for (const Shape<3> shape : {Shape<3>{2, 7, 5}, Shape<3>{1, 13, 5}, Shape<3>{3, 1, 5}}) {
      SCOPED_TRACE(testing::concat_for_trace(c.name, format_shape(shape)));
      auto block = rowwise_block<double>(5, 7, c.n_experts, c.routing, 100 + trials);
      auto twin = block;  // the same parameters, its own gradients
      NaiveMoe<double, RowwiseExpert<double>> naive{twin, {}, {}};
      const auto x = random_tensor<double, 3>(shape, engine);
      const auto dy = random_tensor<double, 3>(shape, engine);

      typename decltype(block)::Cache cache;
      const auto y = block.forward(x, cache);
      const auto dx = block.backward(x, cache, dy);
      const auto y_naive = naive.forward(x);
      const auto dx_naive = naive.backward(x, dy);
      EXPECT_TENSOR_EQ(y, y_naive);
      EXPECT_TENSOR_EQ(dx, dx_naive);
      EXPECT_EQ(gradients_of(block), gradients_of(twin));
      EXPECT_TENSOR_EQ(block.forward(x), y);  // the cacheless path is the same arithmetic
      ++trials;
    }
  }
  EXPECT_EQ(trials, 18);
}

TEST(MoeDispatch, EachExpertRunsOncePerStepOnAllItsTokens) {
  // "No per-token loop of products": one forward call per expert that received a token.
  auto block = rowwise_block<double>(
      4, 6, 4, routing_of(2, MoeGating::softmax_of_top_k, false, 0, 0, std::nullopt), 7);
  std::mt19937_64 engine(5);
  const auto x = random_tensor<double, 3>({3, 11, 4}, engine);
  const auto route = block.route(x);
  int reached = 0;
  for (index_t e = 0; e < 4; ++e) reached += route.kept(e) > 0 ? 1 : 0;
  ASSERT_GT(reached, 1);
  block.forward(x);
  int calls = 0;
  for (index_t e = 0; e < 4; ++e) {
    EXPECT_EQ(block.expert(e).forward_calls(), route.kept(e) > 0 ? 1 : 0) << "expert " << e;
    calls += block.expert(e).forward_calls();
  }
  EXPECT_EQ(calls, reached);
}

// ---- PyTorch fixtures ---------------------------------------------------------------------------

/// Largest |ours − torch| seen per dtype and quantity, printed by the fixture test.
std::map<std::string, double>& max_diffs() {
  static std::map<std::string, double> diffs;
  return diffs;
}

template <class Scalar>
constexpr double fixture_rtol() {
  // Relative to the tensor's largest magnitude (at least 1): the reductions here are at most 12
  // long (F, D, E, N·k), so float's γ_12 ≈ 7e-7 per product, compounded over router, gates,
  // expert and scatter; double's is 1.3e-15.
  return std::is_same_v<Scalar, float> ? 2e-5 : 2e-13;
}

template <class Scalar, TensorLike Ours>
void expect_near_torch(const std::string& what, const Ours& ours_tensor,
                       const testing::FixtureTensor& reference) {
  SCOPED_TRACE(what);
  const auto ours = const_view(ours_tensor);
  ASSERT_EQ(ours.size(), reference.numel());
  double scale = 1, diff = 0;
  for (const double v : reference.values) scale = std::max(scale, std::abs(v));
  std::ostringstream bad;
  for (index_t i = 0; i < ours.size(); ++i) {
    const double d = std::abs(static_cast<double>(ours.data()[i]) -
                              reference.values[static_cast<std::size_t>(i)]);
    if (!(d <= fixture_rtol<Scalar>() * scale)) {
      bad << " [" << i << "] " << ours.data()[i] << " vs " << reference.values[i];
    }
    diff = std::max(diff, d);
  }
  EXPECT_TRUE(bad.str().empty()) << what << " differs from torch (maxdiff " << diff << ", scale "
                                 << scale << "):" << bad.str();
  const std::string key = std::string(std::is_same_v<Scalar, float> ? "float32 " : "float64 ") +
                          (what.rfind("grad.", 0) == 0 ? "parameter gradients" : what);
  max_diffs()[key] = std::max(max_diffs()[key], diff);
}

Activation activation_named(const std::string& name) {
  for (Activation a : {Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu})
    if (name == to_string(a)) return a;
  throw std::runtime_error("unknown activation " + name);
}

MoeRouting routing_from(const testing::Fixture& fixture) {
  const std::string capacity = fixture.meta_str("capacity_factor");
  return routing_of(fixture.meta_int("k"),
                    fixture.meta_str("gating") == "softmax_of_top_k" ? MoeGating::softmax_of_top_k
                                                                     : MoeGating::top_k_of_softmax,
                    fixture.meta_bool("renormalize"), std::stod(fixture.meta_str("lb_coef")),
                    std::stod(fixture.meta_str("z_coef")),
                    capacity == "none" ? std::nullopt : std::optional<double>(std::stod(capacity)));
}

template <class Scalar, class Expert>
void check_moe_fixture(const testing::Fixture& fixture, std::vector<Expert> experts) {
  const index_t batch = fixture.meta_int("B"), tokens = fixture.meta_int("T"),
                k = fixture.meta_int("k");
  MixtureOfExperts<Scalar, Expert> block(
      Linear<Scalar>(tensor_from<Scalar, 2>(fixture.tensor("router.weight"))), std::move(experts),
      routing_from(fixture));
  block.for_each_parameter([&](const ParameterName& name, auto value, auto) {
    constexpr std::size_t rank = rank_of<decltype(value)>;
    value.copy_from(tensor_from<Scalar, rank>(fixture.tensor(name.str())).cview());
  });
  const auto x = tensor_from<Scalar, 3>(fixture.tensor("x"));
  const auto dy = tensor_from<Scalar, 3>(fixture.tensor("dy"));

  typename MixtureOfExperts<Scalar, Expert>::Cache cache;
  const auto y = block.forward(x, cache);
  const auto& route = cache.route;
  // The routing decisions are exact: the same experts, kept or dropped, as torch.
  const auto& selected = fixture.tensor("selected").values;
  const auto& kept = fixture.tensor("kept").values;
  ASSERT_EQ(static_cast<index_t>(selected.size()), batch * tokens * k);
  for (std::size_t a = 0; a < selected.size(); ++a) {
    EXPECT_EQ(route.experts[a], static_cast<index_t>(selected[a])) << "assignment " << a;
    EXPECT_EQ(route.rows[a] >= 0, kept[a] != 0) << "assignment " << a;
  }
  EXPECT_EQ(route.dropped, fixture.meta_int("dropped"));
  EXPECT_EQ(route.capacity, fixture.meta_int("capacity"));
  if (const index_t dead = fixture.meta_int("dead"); dead >= 0) {
    EXPECT_EQ(route.assigned[static_cast<std::size_t>(dead)], 0);
  }
  expect_near_torch<Scalar>("y", y, fixture.tensor("y"));
  expect_near_torch<Scalar>("logits", route.logits, fixture.tensor("logits"));
  expect_near_torch<Scalar>("gates", route.gates, fixture.tensor("gates"));
  const Tensor<double, 1> losses({3}, {route.load_balancing_loss, route.z_loss, route.aux_loss});
  testing::FixtureTensor torch_losses{
      {3},
      {fixture.tensor("load_balancing_loss").values[0], fixture.tensor("z_loss").values[0],
       fixture.tensor("aux_loss").values[0]}};
  expect_near_torch<Scalar>("losses", losses, torch_losses);

  const auto dx = block.backward(x, cache, dy);
  expect_near_torch<Scalar>("dx", dx, fixture.tensor("dx"));
  int compared = 0;
  block.for_each_parameter([&](const ParameterName& name, auto, auto grad) {
    expect_near_torch<Scalar>("grad." + name.str(), grad, fixture.tensor("grad." + name.str()));
    ++compared;
  });
  EXPECT_EQ(compared, static_cast<int>(std::count_if(
                          fixture.tensors.begin(), fixture.tensors.end(),
                          [](const auto& entry) { return entry.first.rfind("grad.", 0) == 0; })));

  // The auxiliary losses' gradient alone: backward with dy = 0.
  block.zero_grad();
  const auto aux_dx = block.backward(x, cache, Tensor<Scalar, 3>(x.shape()));
  expect_near_torch<Scalar>("aux_dx", aux_dx, fixture.tensor("aux_dx"));
  expect_near_torch<Scalar>("aux_grad.router.weight", block.router().weight_grad(),
                            fixture.tensor("aux_grad.router.weight"));
}

template <class Scalar>
class MoeFixtures : public ::testing::Test {};
TYPED_TEST_SUITE(MoeFixtures, testing::FloatAndDouble);

TYPED_TEST(MoeFixtures, AgreeWithAHandWrittenTorchMixtralBlock) {
  using Scalar = TypeParam;
  const int cases = testing::for_each_fixture<Scalar>("moe", [](const testing::Fixture& fixture) {
    const index_t d = fixture.meta_int("D"), f = fixture.meta_int("F"), e = fixture.meta_int("E");
    const bool bias = fixture.meta_bool("bias");
    if (fixture.meta_str("kind") == "gated") {
      GatedFeedForwardOptions options;
      options.bias = bias;
      std::vector<GatedFeedForward<Scalar>> experts;
      for (index_t i = 0; i < e; ++i) experts.emplace_back(d, f, options);
      check_moe_fixture<Scalar>(fixture, std::move(experts));
    } else {
      BlockOptions options;
      options.bias = bias;
      std::vector<FeedForward<Scalar>> experts;
      for (index_t i = 0; i < e; ++i) {
        experts.emplace_back(d, f, activation_named(fixture.meta_str("activation")), options);
      }
      check_moe_fixture<Scalar>(fixture, std::move(experts));
    }
  });
  EXPECT_EQ(cases, 7);
  for (const auto& [what, diff] : max_diffs()) {
    if (what.rfind(std::is_same_v<Scalar, float> ? "float32" : "float64", 0) == 0) {
      std::cout << "[ maxdiff  ] " << what << ": " << diff << "\n";
    }
  }
}

// ---- finite differences in double ---------------------------------------------------------------

/// Checks every input and parameter gradient of L = Σ dy ⊙ y + aux_loss by central differences.
template <class Expert>
void check_gradients(MixtureOfExperts<double, Expert>& block, Tensor<double, 3> x,
                     const Tensor<double, 3>& dy) {
  typename MixtureOfExperts<double, Expert>::Cache cache;
  block.zero_grad();
  block.forward(x, cache);
  const MoeRoute<double> route = cache.route;
  const auto dx = block.backward(x, cache, dy);
  auto loss = [&] {
    typename MixtureOfExperts<double, Expert>::Cache scratch;
    const auto y = block.forward(x, scratch);
    // A step that changed the routing would make the difference meaningless: refuse it.
    if (scratch.route.experts != route.experts || scratch.route.rows != route.rows) {
      ADD_FAILURE() << "a finite-difference step changed the routing";
    }
    double sum = scratch.route.aux_loss;
    for (index_t i = 0; i < y.size(); ++i) sum += dy.data()[i] * y.data()[i];
    return sum;
  };
  EXPECT_GRADIENT_OK(gradcheck(loss, x, dx));
  block.for_each_parameter([&](const ParameterName& name, auto value, auto grad) {
    SCOPED_TRACE(name.str());
    const Tensor<double, rank_of<decltype(grad)>> analytic(grad);
    EXPECT_GRADIENT_OK(gradcheck(loss, value, analytic));
  });
}

TEST(MoeGradients, FiniteDifferencesAwayFromTies) {
  std::mt19937_64 engine(27);
  int checked = 0;
  for (const auto& c : routing_cases()) {
    for (const bool gated : {true, false}) {
      SCOPED_TRACE(testing::concat_for_trace(c.name, gated ? "SwiGLU" : "GELU FFN"));
      const auto x = random_tensor<double, 3>({2, 5, 4}, engine);
      const auto dy = random_tensor<double, 3>({2, 5, 4}, engine);
      auto options = options_of(c.n_experts, c.routing, 300 + checked);
      // Seeds until the routing is at least 1e-3 from a tie (a step of 1e-6 cannot flip it).
      auto run = [&](auto make) {
        for (int attempt = 0; attempt < 20; ++attempt, ++options.seed.value()) {
          auto block = make(options);
          if (tie_margin(block.route(x), c.routing.gating) > 1e-3) {
            check_gradients(block, x, dy);
            ++checked;
            return;
          }
        }
        ADD_FAILURE() << "no seed kept the routing away from ties";
      };
      if (gated) {
        run([](const MixtureOfExpertsOptions& o) { return MixtureOfExperts<double>(4, 6, o); });
      } else {
        run([](MixtureOfExpertsOptions o) {
          o.bias = true;
          return MixtureOfExperts<double, FeedForward<double>>(4, 6, o);
        });
      }
    }
  }
  EXPECT_EQ(checked, 12);
}

// ---- the routing by hand ------------------------------------------------------------------------

TEST(MoeRouting, TiesGoToTheLowestExpertIndexByDissectsOwnRule) {
  // Row 136. Ties to the lowest index are dissect's rule, not torch's: torch.topk leaves the
  // order of ties unspecified, and on the CPU topk(softmax(zeros(1, 8)), 2) gives [6, 5], with 4
  // experts [2, 3]. So this asserts dissect's rule, and no fixture has a tied router.
  // A zero router gives every expert the logit 0: top-2 is experts 0 and 1 for every token, with
  // gates 1/2 (softmax of two zeros) or 1/4 each (softmax over four, not renormalised).
  for (const auto gating : {MoeGating::softmax_of_top_k, MoeGating::top_k_of_softmax}) {
    MixtureOfExperts<double> block(
        3, 5, options_of(4, routing_of(2, gating, false, 0, 0, std::nullopt), 1));
    block.router().weight().fill(0);
    std::mt19937_64 engine(3);
    const auto route = block.route(random_tensor<double, 3>({2, 3, 3}, engine));
    for (index_t t = 0; t < 6; ++t) {
      EXPECT_EQ(route.experts[2 * t], 0);
      EXPECT_EQ(route.experts[2 * t + 1], 1);
      const double gate = gating == MoeGating::softmax_of_top_k ? 0.5 : 0.25;
      EXPECT_EQ(route.gates(t, 0), gate);
      EXPECT_EQ(route.gates(t, 1), gate);
    }
    EXPECT_EQ(route.kept(0), 6);
    EXPECT_EQ(route.kept(2), 0);
  }
  // Eight tied experts, where torch's CPU topk happens to give [6, 5]: dissect's rule, 0 and 1.
  const auto routing = routing_of(2, MoeGating::top_k_of_softmax, false, 0, 0, std::nullopt);
  MixtureOfExperts<double> eight(3, 5, options_of(8, routing, 1));
  eight.router().weight().fill(0);
  std::mt19937_64 engine(4);
  const auto route = eight.route(random_tensor<double, 3>({1, 2, 3}, engine));
  EXPECT_EQ(route.experts, (std::vector<index_t>{0, 1, 0, 1}));
}

TEST(MoeRouting, CapacityDropsInTokenOrderAndCountsWhatItDrops) {
  // Router rows pick expert 0 for tokens whose feature 0 is positive, else expert 1 (k = 1,
  // E = 2). Six tokens, five of them positive: capacity = ceil(1.0·6·1 / 2) = 3, so expert 0 keeps
  // tokens 0, 1, 3 (the first three positive ones in token order) and drops 4 and 5.
  MixtureOfExperts<double> block(
      2, 3, options_of(2, routing_of(1, MoeGating::top_k_of_softmax, false, 0, 0, 1.0), 1));
  block.router().set_weight(Tensor<double, 2>({2, 2}, {4, 0, -4, 0}));
  const Tensor<double, 3> x({1, 6, 2}, {1, 0, 2, 0, -1, 0, 3, 0, 4, 0, 5, 0});
  typename MixtureOfExperts<double>::Cache cache;
  const auto y = block.forward(x, cache);
  const auto& route = cache.route;
  EXPECT_EQ(route.capacity, 3);
  EXPECT_EQ(route.experts, (std::vector<index_t>{0, 0, 1, 0, 0, 0}));
  EXPECT_EQ(route.rows, (std::vector<index_t>{0, 1, 0, 2, -1, -1}));
  EXPECT_EQ(route.dropped, 2);
  EXPECT_EQ(route.assigned, (std::vector<index_t>{5, 1}));
  EXPECT_EQ(route.kept(0), 3);
  EXPECT_EQ(route.group, (std::vector<index_t>{0, 1, 3, 2}));
  // A dropped token contributes 0: its output row is exactly zero, and so is its dx (its gate's
  // gradient is 0, and with k = 1 and no losses nothing else reaches its router logits).
  for (index_t c = 0; c < 2; ++c) {
    EXPECT_EQ(y(0, 4, c), 0.0);
    EXPECT_EQ(y(0, 5, c), 0.0);
    EXPECT_NE(y(0, 3, c), 0.0);
  }
  const Tensor<double, 3> dy({1, 6, 2}, {1, -2, 3, 1, -1, 2, 2, 2, -3, 1, 1, 4});
  const auto dx = block.backward(x, cache, dy);
  for (index_t c = 0; c < 2; ++c) {
    EXPECT_EQ(dx(0, 4, c), 0.0);
    EXPECT_EQ(dx(0, 5, c), 0.0);
  }
  EXPECT_NE(dx(0, 0, 0), 0.0);
}

TEST(MoeRouting, LossesByHand) {
  // Two tokens, two experts, k = 1, logits (ln 3, 0) and (0, ln 3): p = (3/4, 1/4), (1/4, 3/4);
  // each expert gets one token, f = (1/2, 1/2), P = (1/2, 1/2): balance = 2·(1/4 + 1/4) = 1.
  // logsumexp = ln 4 for both: z-loss = (ln 4)².
  MixtureOfExperts<double> block(
      2, 3,
      options_of(2, routing_of(1, MoeGating::top_k_of_softmax, false, 0.5, 0.25, std::nullopt), 1));
  block.router().set_weight(Tensor<double, 2>({2, 2}, {std::log(3.0), 0, 0, std::log(3.0)}));
  const auto route = block.route(Tensor<double, 3>({1, 2, 2}, {1, 0, 0, 1}));
  EXPECT_NEAR(route.load_balancing_loss, 1.0, 1e-14);
  EXPECT_NEAR(route.z_loss, std::log(4.0) * std::log(4.0), 1e-14);
  EXPECT_NEAR(route.aux_loss, 0.5 + 0.25 * std::log(4.0) * std::log(4.0), 1e-14);
  EXPECT_NEAR(route.gates(0, 0), 0.75, 1e-15);
}

TEST(MoeRouting, AnExpertWithoutTokensRunsNotAndKeepsZeroGradients) {
  MixtureOfExperts<double> block(
      4, 6,
      options_of(3, routing_of(1, MoeGating::softmax_of_top_k, false, 0.02, 0, std::nullopt), 5));
  block.router().weight()(2, 0) = -50;  // expert 2: a logit far below the others
  std::mt19937_64 engine(8);
  auto x = random_tensor<double, 3>({2, 4, 4}, engine);
  for (index_t t = 0; t < 8; ++t) x.data()[t * 4] = 1 + std::abs(x.data()[t * 4]);
  typename MixtureOfExperts<double>::Cache cache;
  block.forward(x, cache);
  ASSERT_EQ(cache.route.kept(2), 0);
  EXPECT_EQ(cache.outputs[2].shape(), (Shape<3>{1, 0, 4}));
  block.backward(x, cache, random_tensor<double, 3>(x.shape(), engine));
  for (const double v : block.expert(2).gate().weight_grad()) EXPECT_EQ(v, 0.0);
  for (const double v : block.expert(2).down().weight_grad()) EXPECT_EQ(v, 0.0);
  // The router's row of expert 2 still learns: the load-balancing loss pulls on every p_e.
  double row = 0;
  for (index_t c = 0; c < 4; ++c) row += std::abs(block.router().weight_grad()(2, c));
  EXPECT_GT(row, 0.0);
}

TEST(MoeRouting, EmptyBatchesAndOneExpert) {
  MixtureOfExperts<float> block(
      4, 6, options_of(1, routing_of(1, MoeGating::softmax_of_top_k, false, 0.02, 0.001, 1.5), 2));
  for (const Shape<3> shape : {Shape<3>{0, 3, 4}, Shape<3>{2, 0, 4}}) {
    typename MixtureOfExperts<float>::Cache cache;
    const Tensor<float, 3> x(shape);
    EXPECT_EQ(block.forward(x, cache).shape(), shape);
    EXPECT_EQ(cache.route.aux_loss, 0.0);
    EXPECT_EQ(cache.route.dropped, 0);
    EXPECT_EQ(block.backward(x, cache, x).shape(), shape);
  }
  for (const float v : block.router().weight_grad()) EXPECT_EQ(v, 0.0f);
  // E = 1: y is the one expert's output, the gates 1.
  std::mt19937_64 engine(4);
  const auto x = random_tensor<float, 3>({2, 3, 4}, engine);
  EXPECT_TENSOR_EQ(block.forward(x), block.expert(0).forward(x));
}

TEST(MoeModule, NamesCountsSeedsAndPrinting) {
  MixtureOfExperts<float> block(
      8, 16,
      options_of(4, routing_of(2, MoeGating::softmax_of_top_k, false, 0, 0, std::nullopt), 9));
  const auto names = parameter_names(block);
  ASSERT_EQ(names.size(), 1u + 4 * 3);
  EXPECT_EQ(names[0], "router.weight");
  EXPECT_EQ(names[1], "experts.0.gate.weight");
  EXPECT_EQ(names[12], "experts.3.down.weight");
  EXPECT_EQ(block.parameter_count(), 4 * 8 + 4 * 3 * 8 * 16);
  MixtureOfExperts<float> again(8, 16, options_of(4, block.routing(), 9));
  EXPECT_TENSOR_EQ(again.expert(3).up().weight(), block.expert(3).up().weight());
  std::ostringstream text;
  text << block;
  EXPECT_EQ(text.str(),
            "MixtureOfExperts(d_model=8, n_experts=4, top_k=2, gating=softmax_of_top_k)");
  int layers = 0;
  for_each_layer(block, [&](const std::string&, Linear<float>&) { ++layers; });
  EXPECT_EQ(layers, 13);
}

// ---- errors (docs/reliability.md row 78) --------------------------------------------------------

TEST(MoeErrors, BadConfigsAreConfigErrorsNamingTheField) {
  const auto build = [](index_t n_experts, MoeRouting routing) {
    return MixtureOfExperts<float>(8, 16, options_of(n_experts, routing, 1));
  };
  const MoeRouting good = routing_of(2, MoeGating::softmax_of_top_k, false, 0, 0, std::nullopt);
  auto with = [&](auto change) {
    MoeRouting r = good;
    change(r);
    return r;
  };
  EXPECT_THROW_WITH(build(4, with([](MoeRouting& r) { r.top_k = 5; })), ConfigError,
                    "MixtureOfExperts: top_k must be in [1, n_experts = 4] (got 5)");
  EXPECT_THROW_WITH(build(4, with([](MoeRouting& r) { r.top_k = 0; })), ConfigError,
                    "top_k must be in [1, n_experts = 4] (got 0)");
  EXPECT_THROW_WITH(build(0, good), ConfigError, "MixtureOfExperts: n_experts must be > 0 (got 0)");
  EXPECT_THROW_WITH(build(-2, good), ConfigError, "n_experts must be > 0 (got -2)");
  EXPECT_THROW_WITH(build(4, with([](MoeRouting& r) { r.capacity_factor = 0.0; })), ConfigError,
                    "MixtureOfExperts: capacity_factor must be finite and > 0 (got 0)");
  EXPECT_THROW_WITH(build(4, with([](MoeRouting& r) { r.capacity_factor = -1.0; })), ConfigError,
                    "capacity_factor must be finite and > 0 (got -1)");
  EXPECT_THROW_WITH(build(4, with([](MoeRouting& r) { r.capacity_factor = NAN; })), ConfigError,
                    "capacity_factor must be finite and > 0 (got nan)");
  EXPECT_THROW_WITH(build(4, with([](MoeRouting& r) { r.load_balancing_coef = INFINITY; })),
                    ConfigError,
                    "MixtureOfExperts: load_balancing_coef must be finite and >= 0 (got inf)");
  EXPECT_THROW_WITH(build(4, with([](MoeRouting& r) { r.z_loss_coef = NAN; })), ConfigError,
                    "z_loss_coef must be finite and >= 0 (got nan)");
  EXPECT_THROW_WITH(build(4, with([](MoeRouting& r) { r.z_loss_coef = -0.5; })), ConfigError,
                    "z_loss_coef must be finite and >= 0 (got -0.5)");
  EXPECT_THROW_WITH(build(4, with([](MoeRouting& r) { r.gating = static_cast<MoeGating>(7); })),
                    ConfigError,
                    "MoeGating(7) is out of range (known: softmax_of_top_k, top_k_of_softmax)");
  EXPECT_THROW_WITH(MixtureOfExperts<float>(8, 0, options_of(4, good, 1)), ConfigError,
                    "d_ff must be > 0");
  EXPECT_THROW_WITH(MixtureOfExperts<float>(0, 16, options_of(4, good, 1)), ConfigError,
                    "MixtureOfExperts: d_model must be > 0 (got 0)");

  MixtureOfExperts<float> block(8, 16, options_of(4, good, 1));
  EXPECT_THROW_WITH(block.set_routing(with([](MoeRouting& r) { r.top_k = 9; })), ConfigError,
                    "MixtureOfExperts::set_routing: top_k must be in [1, n_experts = 4] (got 9)");
  EXPECT_EQ(block.top_k(), 2);  // unchanged
  EXPECT_THROW_WITH(block.expert(4), Error, "MixtureOfExperts::expert: index 4 is outside [0, 4)");
}

TEST(MoeErrors, PartsThatDoNotFitNameTheirShapes) {
  const MoeRouting routing = routing_of(1, MoeGating::softmax_of_top_k, false, 0, 0, std::nullopt);
  auto experts = [](std::initializer_list<index_t> widths) {
    std::vector<GatedFeedForward<double>> list;
    for (const index_t d : widths) list.emplace_back(d, 6);
    return list;
  };
  EXPECT_THROW_WITH((MixtureOfExperts<double>(Linear<double>(4, 3), experts({4, 4, 4}), routing)),
                    ConfigError, "MixtureOfExperts: the router has a bias");
  LinearOptions no_bias;
  no_bias.bias = false;
  EXPECT_THROW_WITH(
      (MixtureOfExperts<double>(Linear<double>(4, 2, no_bias), experts({4, 4, 4}), routing)),
      ShapeError,
      "MixtureOfExperts: router weight must be [E, D] = [3, 4] for 3 experts of "
      "d_model 4, got [2, 4]");
  EXPECT_THROW_WITH(
      (MixtureOfExperts<double>(Linear<double>(4, 3, no_bias), experts({4, 5, 4}), routing)),
      ShapeError, "MixtureOfExperts: expert 1 has d_model 5, expert 0 has 4");
  EXPECT_THROW_WITH((MixtureOfExperts<double>(Linear<double>(4, 0, no_bias), experts({}), routing)),
                    ConfigError, "n_experts must be > 0 (got 0)");
}

TEST(MoeErrors, WrongShapesAreShapeErrorsAndLeaveGradientsUntouched) {
  MixtureOfExperts<float> block(
      8, 16,
      options_of(4, routing_of(2, MoeGating::softmax_of_top_k, false, 0.02, 0, std::nullopt), 1));
  std::mt19937_64 engine(6);
  const auto x = random_tensor<float, 3>({2, 3, 8}, engine);
  const Tensor<float, 3> narrow({2, 3, 5});
  EXPECT_THROW_WITH(block.forward(narrow), ShapeError,
                    "MixtureOfExperts::forward: x must be [B, T, D=8], got [2, 3, 5]");
  typename MixtureOfExperts<float>::Cache cache;
  EXPECT_THROW_WITH(block.forward(narrow, cache), ShapeError,
                    "MixtureOfExperts::forward: x must be [B, T, D=8], got [2, 3, 5]");
  EXPECT_THROW_WITH(block.route(narrow), ShapeError,
                    "MixtureOfExperts::route: x must be [B, T, D=8], got [2, 3, 5]");

  block.forward(x, cache);
  const auto before = gradients_of(block);
  EXPECT_THROW_WITH(block.backward(x, cache, Tensor<float, 3>({2, 4, 8})), ShapeError,
                    "MixtureOfExperts::backward: dy must be [B, T, D=8] = [2, 3, 8] for x "
                    "[2, 3, 8], got [2, 4, 8]");
  EXPECT_THROW_WITH(block.backward(narrow, cache, narrow), ShapeError,
                    "MixtureOfExperts::backward: x must be [B, T, D=8], got [2, 3, 5]");
  const auto other = random_tensor<float, 3>({1, 5, 8}, engine);
  EXPECT_THROW_WITH(block.backward(other, cache, other), ShapeError,
                    "MixtureOfExperts::backward: the cache does not fit x [1, 5, 8] (it routed 6 "
                    "tokens to top 2 of 4 experts; x has 5 tokens for top 2 of 4) (fill the "
                    "cache with forward(x, cache))");
  typename MixtureOfExperts<float>::Cache empty;
  EXPECT_THROW_WITH(block.backward(x, empty, x), ShapeError, "the cache does not fit x [2, 3, 8]");
  EXPECT_EQ(gradients_of(block), before);
}

TEST(MoeErrors, ANonFiniteRouterLogitIsAnErrorNamingTheTokenAndTheShapes) {
  // NaN, +Inf and −Inf in one element of x or of the router's weight, under both gatings: each
  // makes a logit non-finite (Inf·w sums to ±Inf or to Inf − Inf = NaN), which route(), both
  // forwards and so every caller (the decoder layer, generation) refuse by name.
  constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  constexpr float inf = std::numeric_limits<float>::infinity();
  std::mt19937_64 engine(84);
  for (const MoeGating gating : {MoeGating::softmax_of_top_k, MoeGating::top_k_of_softmax}) {
    MixtureOfExperts<float> block(
        8, 16, options_of(4, routing_of(2, gating, true, 0.02, 0.001, std::nullopt), 1));
    const auto x = random_tensor<float, 3>({2, 3, 8}, engine);
    const auto dy = random_tensor<float, 3>({2, 3, 8}, engine);
    for (const float bad : {nan, inf, -inf}) {
      SCOPED_TRACE(testing::concat_for_trace(to_string(gating), bad));
      auto poisoned = x;
      poisoned.data()[(1 * 3 + 2) * 8 + 5] = bad;  // x[1, 2, 5]: token 5
      // Every logit of token 5 is non-finite; the first, expert 0's, is named.
      const std::string where = "router logit z[5, 0] is ";
      const std::string shapes =
          " (token 5 = x[1, 2, :]; x: [2, 3, 8], router weight: [4, 8], logits: [6, 4])";
      EXPECT_THROW_WITH(block.forward(poisoned), Error, "MixtureOfExperts::forward: " + where);
      EXPECT_THROW_WITH(block.forward(poisoned), Error, shapes);
      EXPECT_THROW_WITH(block.forward(poisoned), Error,
                        "a non-finite logit has no top-k; look for NaN or Inf in x or in "
                        "router.weight");
      EXPECT_THROW_WITH(block.route(poisoned), Error, "MixtureOfExperts::route: " + where);
      if (bad == -inf) {  // one −Inf in x: logit 0 is −Inf·W_router[0, 5] = ∓Inf, not NaN
        const std::string sign = block.router().weight().data()[5] > 0 ? "-inf" : "inf";
        EXPECT_THROW_WITH(block.forward(poisoned), Error, "z[5, 0] is " + sign + " (token 5");
      }

      // The cached forward: the cache of a good step is spoiled by the throw, and backward
      // refuses it rather than read half-overwritten buffers; the block and its gradients are
      // untouched; the next good forward works again.
      block.zero_grad();
      typename MixtureOfExperts<float>::Cache cache;
      const auto y = block.forward(x, cache);
      const auto before = gradients_of(block);
      EXPECT_THROW_WITH(block.forward(poisoned, cache), Error,
                        "MixtureOfExperts::forward: " + where);
      EXPECT_THROW_WITH(block.backward(x, cache, dy), ShapeError,
                        "MixtureOfExperts::backward: the cache does not fit x [2, 3, 8] (the "
                        "forward that filled it threw)");
      EXPECT_EQ(gradients_of(block), before);
      EXPECT_TENSOR_EQ(block.forward(x, cache), y);
      block.backward(x, cache, dy);
      EXPECT_NE(gradients_of(block), before);
    }

    // A non-finite router weight poisons every token; the first is named.
    for (const float bad : {nan, inf}) {
      MixtureOfExperts<float> broken = block;
      broken.router().weight().data()[1 * 8 + 3] = bad;  // W_router[1, 3]: expert 1's logits
      EXPECT_THROW_WITH(broken.forward(x), Error,
                        "MixtureOfExperts::forward: router logit z[0, 1] is ");
      EXPECT_THROW_WITH(broken.forward(x), Error, "(token 0 = x[0, 0, :]; x: [2, 3, 8]");
    }
  }

  // NaN in a token's features that the router's weight multiplies by 0 is still NaN (0·NaN):
  // no row escapes; an empty batch has no logit to check and gives an empty y.
  MixtureOfExperts<double> block(
      4, 6,
      options_of(3, routing_of(1, MoeGating::softmax_of_top_k, false, 0, 0, std::nullopt), 2));
  block.router().weight().fill(0);
  Tensor<double, 3> x({1, 2, 4});
  x.data()[4] = std::numeric_limits<double>::quiet_NaN();  // x[0, 1, 0]
  EXPECT_THROW_WITH(block.forward(x), Error,
                    "router logit z[1, 0] is nan (token 1 = x[0, 1, :]; x: [1, 2, 4], router "
                    "weight: [3, 4], logits: [2, 3])");
  EXPECT_EQ(block.forward(Tensor<double, 3>({0, 5, 4})).shape(), (Shape<3>{0, 5, 4}));
}

}  // namespace test_mixture_of_experts
}  // namespace dissect
