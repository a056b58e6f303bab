// dissect/training/optim.hpp — optimizers: SGD (momentum, Nesterov, weight decay), Adam and AdamW.
//
// An optimizer updates a list of ParameterRefs (views of a value buffer and its gradient), built
// from any module (module.hpp): Adam<float> adam(model) or Adam<float> adam(parameters(a, b)).
// The arithmetic follows torch.optim in PyTorch 1.13 step by step, in the parameter's own
// precision. All state (momentum, moments) is allocated at construction: step() never allocates.
// state() and load_state() take the whole state out and put it back (torch's state_dict and
// load_state_dict), so that a run resumed from a checkpoint continues bit for bit
// (io/training_state.hpp writes it to a file with the weights).
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// One trainable buffer as an optimizer sees it: its values and their gradient, as flat views
/// of the module's own buffers (which keep their address for the module's life: set_weight
/// copies into them). Keep the module alive while the optimizer is used; moving it is fine.
template <class Scalar>
struct ParameterRef {
  std::string name{};  ///< for messages, e.g. "1.weight"
  TensorView<Scalar, 1> value{};
  TensorView<Scalar, 1> grad{};
  index_t size() const { return value.size(); }
};

/// A reference to `value` and its gradient `grad` (any tensors or views of one shape).
/// @throws ShapeError naming the parameter if the shapes differ.
template <WritableTensor V, WritableTensor G>
ParameterRef<scalar_of<V>> parameter(V&& value, G&& grad, std::string name = {});

/// Every parameter of `module` that is not frozen, under its state_dict names ("qkv.weight", …).
template <Module M>
std::vector<ParameterRef<typename M::scalar_type>> parameters_of(M& module);

/// The parameters of several modules, named by position like nn.Sequential's state_dict:
/// "0.weight", "0.bias", "1.weight", … (all of one scalar type).
template <Module First, Module... More>
std::vector<ParameterRef<typename First::scalar_type>> parameters(First& first, More&... more);

/// The same for modules held in a vector (an MLP's stack): "0.weight", "0.bias", "1.weight", …
template <Module M>
std::vector<ParameterRef<typename M::scalar_type>> parameters(std::vector<M>& modules);

/// What an optimizer is built over: a list of references, or every parameter of a module
/// (Adam<float> adam(model) or adam({parameter(w, dw, "w")})).
template <class Scalar>
struct ParameterList {
  std::vector<ParameterRef<Scalar>> refs;

  ParameterList(std::vector<ParameterRef<Scalar>> list) : refs(std::move(list)) {}  // NOLINT
  ParameterList(std::initializer_list<ParameterRef<Scalar>> list) : refs(list) {}
  template <Module M>
  ParameterList(M& module) : refs(parameters_of(module)) {}  // NOLINT: implicit by design
};

/// An optimizer's whole state as a value, what torch's optimizer.state_dict() holds: enough for a
/// new optimizer over the same parameters to continue exactly where this one stands.
template <class Scalar>
struct OptimizerState {
  std::string kind;   ///< "Sgd", "Adam" or "AdamW"
  index_t steps = 0;  ///< step() calls so far: Adam's bias correction and Sgd's first step
  double lr = 0;      ///< the current learning rate (a schedule changes it as the run goes)
  /// The hyperparameters fixed at construction, by the options' field names: "momentum",
  /// "dampening", "weight_decay", "nesterov" (0 or 1) for Sgd; "beta1", "beta2", "eps",
  /// "weight_decay", "decoupled_weight_decay" (0 or 1) for Adam and AdamW.
  std::map<std::string, double> hyperparameters;
  /// The parameters' names in the optimizer's order (a parameter without one by its position).
  std::vector<std::string> parameters;
  /// The per-parameter buffers, flat, under "<buffer>.<parameter name>", torch's buffer names:
  /// "momentum_buffer.0.weight" (Sgd with momentum), "exp_avg.0.weight" and
  /// "exp_avg_sq.0.weight" (Adam, AdamW). Values in Scalar, exactly as the optimizer holds them.
  std::map<std::string, Tensor<Scalar, 1>> buffers;
};

/// What every optimizer offers. Not copyable: it holds references into other objects' buffers.
template <class Scalar>
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// One update of every parameter from its current gradient.
  virtual void step() = 0;
  /// Sets every gradient to zero (gradients accumulate until then, as in PyTorch).
  void zero_grad();
  double lr() const { return lr_; }
  /// For schedules. @throws ConfigError if lr < 0 or not finite.
  void set_lr(double lr);
  /// Number of step() calls so far.
  index_t step_count() const { return steps_; }
  const std::vector<ParameterRef<Scalar>>& parameters() const { return parameters_; }
  /// Σ size over the parameters.
  index_t parameter_count() const;
  /// "Sgd", "Adam" or "AdamW".
  const char* kind() const { return name_; }

  /// A copy of the whole state: step count, lr, hyperparameters, parameter names, buffers.
  /// @throws ConfigError if two parameters have the same name (their buffers would collide).
  OptimizerState<Scalar> state() const;
  /// Continues from `state` (another optimizer's state(), or a file's): sets the buffers, the
  /// step count and the lr. Everything is checked first and nothing changes on a throw.
  /// @throws ConfigError naming the field if the kind, a hyperparameter, the parameter names or
  ///         their order, or the set of buffers differ, or the steps or lr are impossible;
  ///         ShapeError naming the buffer and both sizes if a buffer does not fit its parameter.
  void load_state(const OptimizerState<Scalar>& state);

 protected:
  /// @throws ShapeError for a negative size; Error for a null buffer or for buffers (values or
  ///         gradients, of any parameters) that overlap; ConfigError for a bad lr.
  Optimizer(const char* name, ParameterList<Scalar> parameters, double lr);
  /// One state buffer per parameter, zero-filled, allocated once.
  std::vector<Tensor<Scalar, 1>> make_state() const;
  /// The hyperparameters fixed at construction (OptimizerState::hyperparameters).
  virtual std::map<std::string, double> fixed_hyperparameters() const = 0;
  /// The state buffers by torch's name, one per parameter each (none for Sgd without momentum).
  virtual std::vector<std::pair<std::string, std::vector<Tensor<Scalar, 1>>*>> state_buffers() = 0;
  /// The name a parameter's buffers are saved under: its own, or its position if it has none.
  std::string state_name(std::size_t index) const;

  const char* name_;
  std::vector<ParameterRef<Scalar>> parameters_;
  double lr_;
  index_t steps_ = 0;
};

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;  ///< L2: weight_decay·param is added to the gradient
  bool nesterov = false;
};

/// torch.optim.SGD: g = grad + wd·p; buf = g on the first step, then
/// buf = momentum·buf + (1 − dampening)·g; g = nesterov ? g + momentum·buf : buf; p −= lr·g.
template <class Scalar>
class Sgd final : public Optimizer<Scalar> {
 public:
  /// @throws ConfigError for lr, momentum or weight_decay < 0, or nesterov without momentum or
  ///         with dampening; and as Optimizer for bad parameter references.
  Sgd(ParameterList<Scalar> parameters, SgdOptions options = {});
  void step() override;
  const SgdOptions& options() const { return options_; }

 protected:
  std::map<std::string, double> fixed_hyperparameters() const override;
  std::vector<std::pair<std::string, std::vector<Tensor<Scalar, 1>>*>> state_buffers() override;

 private:
  SgdOptions options_;
  std::vector<Tensor<Scalar, 1>> momentum_;  // empty without momentum
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  /// false: Adam's L2 term (wd·p added to the gradient); true: AdamW's p ← p·(1 − lr·wd).
  bool decoupled_weight_decay = false;
};

/// torch.optim.Adam / AdamW: m = β1·m + (1 − β1)·g; v = β2·v + (1 − β2)·g²;
/// p −= lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + eps). eps is added after the bias correction of
/// √v, as PyTorch does (not to √v̂ before it).
template <class Scalar>
class Adam : public Optimizer<Scalar> {
 public:
  /// @throws ConfigError for lr, eps or weight_decay < 0 or betas outside [0, 1); and as
  ///         Optimizer for bad parameter references.
  Adam(ParameterList<Scalar> parameters, AdamOptions options = {});
  void step() override;
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(const char* name, ParameterList<Scalar> parameters, AdamOptions options);
  std::map<std::string, double> fixed_hyperparameters() const override;
  std::vector<std::pair<std::string, std::vector<Tensor<Scalar, 1>>*>> state_buffers() override;

 private:
  AdamOptions options_;
  std::vector<Tensor<Scalar, 1>> exp_avg_;     // m
  std::vector<Tensor<Scalar, 1>> exp_avg_sq_;  // v
};

/// torch.optim.AdamW's defaults: decoupled weight decay 1e-2.
struct AdamWOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
};

/// Adam with decoupled weight decay (Loshchilov & Hutter 2019), as torch.optim.AdamW.
template <class Scalar>
class AdamW final : public Adam<Scalar> {
 public:
  AdamW(ParameterList<Scalar> parameters, AdamWOptions options = {});
};

template <Module M>
Sgd(M&, SgdOptions = {}) -> Sgd<typename M::scalar_type>;
template <Module M>
Adam(M&, AdamOptions = {}) -> Adam<typename M::scalar_type>;
template <Module M>
AdamW(M&, AdamWOptions = {}) -> AdamW<typename M::scalar_type>;

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

template <class Scalar>
using ArrayMap = Eigen::Map<Eigen::Array<Scalar, Eigen::Dynamic, 1>, Eigen::Unaligned>;

template <class Scalar>
ArrayMap<Scalar> array_of(Scalar* data, index_t size) {
  return ArrayMap<Scalar>(data, size);
}

template <class Scalar>
std::string describe_parameter(std::size_t index, const ParameterRef<Scalar>& parameter) {
  return parameter.name.empty() ? concat("parameter ", index)
                                : concat("parameter ", index, " (\"", parameter.name, "\")");
}

inline void check_hyperparameter(const char* op, const char* field, double value, double low,
                                 double high, bool high_inclusive) {
  const bool ok =
      std::isfinite(value) && value >= low && (high_inclusive ? value <= high : value < high);
  if (!ok) {
    throw ConfigError(concat(op, ": ", field, " must be in [", low, ", ", high,
                             high_inclusive ? "]" : ")", ", got ", value));
  }
}

inline constexpr double unbounded = std::numeric_limits<double>::infinity();

template <class Scalar, class M>
void append_parameters(std::vector<ParameterRef<Scalar>>& out, M& module,
                       std::optional<std::size_t> position) {
  static_assert(std::is_same_v<typename M::scalar_type, Scalar>,
                "dissect::parameters: every module must have the same scalar type");
  module.for_each_parameter([&](const ParameterName& name, auto value, auto grad) {
    if (is_frozen_parameter(value, grad)) return;  // requires_grad=False: not the optimizer's
    const ParameterName full = position ? name.under(index_name(*position)) : name;
    out.push_back(parameter(value, grad, full.str()));
  });
}

}  // namespace detail

template <WritableTensor V, WritableTensor G>
ParameterRef<scalar_of<V>> parameter(V&& value, G&& grad, std::string name) {
  const auto values = writable_view(value);
  const auto grads = writable_view(grad);
  if (values.shape() != grads.shape()) {
    throw ShapeError(detail::concat("parameter: \"", name, "\" has shape ",
                                    format_shape(values.shape()), " but its gradient has shape ",
                                    format_shape(grads.shape())));
  }
  return {std::move(name), values.flatten(), grads.flatten()};
}

template <Module M>
std::vector<ParameterRef<typename M::scalar_type>> parameters_of(M& module) {
  std::vector<ParameterRef<typename M::scalar_type>> result;
  detail::append_parameters(result, module, std::nullopt);
  return result;
}

template <Module First, Module... More>
std::vector<ParameterRef<typename First::scalar_type>> parameters(First& first, More&... more) {
  std::vector<ParameterRef<typename First::scalar_type>> result;
  std::size_t position = 0;
  detail::append_parameters(result, first, position++);
  (detail::append_parameters(result, more, position++), ...);
  return result;
}

template <Module M>
std::vector<ParameterRef<typename M::scalar_type>> parameters(std::vector<M>& modules) {
  std::vector<ParameterRef<typename M::scalar_type>> result;
  for (std::size_t i = 0; i < modules.size(); ++i) detail::append_parameters(result, modules[i], i);
  return result;
}

template <class Scalar>
Optimizer<Scalar>::Optimizer(const char* name, ParameterList<Scalar> parameters, double lr)
    : name_(name), parameters_(std::move(parameters.refs)), lr_(lr) {
  detail::check_hyperparameter(name_, "lr", lr, 0, detail::unbounded, false);
  // Every value and gradient range, tagged with its parameter, so that overlaps between any two
  // of them (a parameter listed twice, a gradient aliasing a value) can be named.
  struct Range {
    const Scalar* begin;
    const Scalar* end;
    std::size_t parameter;
    const char* what;
  };
  std::vector<Range> ranges;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const auto& p = parameters_[i];
    if (p.grad.size() != p.value.size()) {
      throw ShapeError(detail::concat(name_, ": ", detail::describe_parameter(i, p), " has ",
                                      p.value.size(), " values but ", p.grad.size(), " gradients"));
    }
    if (p.size() == 0) continue;
    ranges.push_back({p.value.data(), p.value.end(), i, "value"});
    ranges.push_back({p.grad.data(), p.grad.end(), i, "grad"});
  }
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) {
    return std::less<const Scalar*>{}(a.begin, b.begin);
  });
  for (std::size_t k = 1; k < ranges.size(); ++k) {
    const Range& a = ranges[k - 1];
    const Range& b = ranges[k];
    if (std::less<const Scalar*>{}(b.begin, a.end)) {
      throw Error(detail::concat(name_, ": the ", a.what, " of ",
                                 detail::describe_parameter(a.parameter, parameters_[a.parameter]),
                                 " overlaps the ", b.what, " of ",
                                 detail::describe_parameter(b.parameter, parameters_[b.parameter]),
                                 "; every buffer must appear once"));
    }
  }
}

template <class Scalar>
void Optimizer<Scalar>::zero_grad() {
  for (const auto& p : parameters_) p.grad.fill(Scalar(0));
}

template <class Scalar>
void Optimizer<Scalar>::set_lr(double lr) {
  detail::check_hyperparameter(name_, "lr", lr, 0, detail::unbounded, false);
  lr_ = lr;
}

template <class Scalar>
index_t Optimizer<Scalar>::parameter_count() const {
  index_t count = 0;
  for (const auto& p : parameters_) count = checked_add(count, p.size(), "parameter_count");
  return count;
}

template <class Scalar>
std::vector<Tensor<Scalar, 1>> Optimizer<Scalar>::make_state() const {
  std::vector<Tensor<Scalar, 1>> state;
  state.reserve(parameters_.size());
  for (const auto& p : parameters_) state.emplace_back(Shape<1>{p.size()});
  return state;
}

template <class Scalar>
std::string Optimizer<Scalar>::state_name(std::size_t index) const {
  const std::string& name = parameters_[index].name;
  return name.empty() ? detail::concat(index) : name;
}

template <class Scalar>
OptimizerState<Scalar> Optimizer<Scalar>::state() const {
  OptimizerState<Scalar> state{.kind = name_,
                               .steps = steps_,
                               .lr = lr_,
                               .hyperparameters = fixed_hyperparameters(),
                               .parameters = {},
                               .buffers = {}};
  std::map<std::string, std::size_t> seen;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    const std::string name = state_name(i);
    if (const auto [at, fresh] = seen.emplace(name, i); !fresh) {
      throw ConfigError(detail::concat(name_, "::state: parameters ", at->second, " and ", i,
                                       " are both named \"", name,
                                       "\"; their state would collide: name them apart"));
    }
    state.parameters.push_back(name);
  }
  // state_buffers() is non-const only so that load_state can write through it; read here.
  for (const auto& [buffer, tensors] : const_cast<Optimizer*>(this)->state_buffers()) {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      state.buffers.emplace(detail::concat(buffer, ".", state.parameters[i]), (*tensors)[i]);
    }
  }
  return state;
}

template <class Scalar>
void Optimizer<Scalar>::load_state(const OptimizerState<Scalar>& state) {
  const std::string op = detail::concat(name_, "::load_state");
  if (state.kind != name_) {
    throw ConfigError(detail::concat(op, ": the state is of ",
                                     state.kind.empty() ? "no optimizer" : state.kind.c_str(),
                                     ", this optimizer is ", name_));
  }
  const std::map<std::string, double> ours = fixed_hyperparameters();
  for (const auto& [field, value] : ours) {
    const auto theirs = state.hyperparameters.find(field);
    if (theirs == state.hyperparameters.end()) {
      throw ConfigError(detail::concat(op, ": the state has no ", field, " (", name_, " has ",
                                       field, " = ", value, ")"));
    }
    // Compared bit for bit: the same run has the same doubles.
    if (std::memcmp(&theirs->second, &value, sizeof value) != 0) {
      throw ConfigError(detail::concat(op, ": ", field, " is ", theirs->second, " in the state, ",
                                       value, " in this optimizer"));
    }
  }
  for (const auto& [field, value] : state.hyperparameters) {
    if (!ours.contains(field)) {
      throw ConfigError(detail::concat(op, ": the state has a hyperparameter ", field, " that ",
                                       name_, " does not have"));
    }
  }
  if (state.steps < 0) {
    throw ConfigError(detail::concat(op, ": steps must be >= 0, got ", state.steps));
  }
  detail::check_hyperparameter(op.c_str(), "lr", state.lr, 0, detail::unbounded, false);
  if (state.parameters.size() != parameters_.size()) {
    throw ConfigError(detail::concat(op, ": the state is of ", state.parameters.size(),
                                     " parameters, this optimizer has ", parameters_.size()));
  }
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    if (state.parameters[i] != state_name(i)) {
      throw ConfigError(detail::concat(op, ": parameter ", i, " is \"", state.parameters[i],
                                       "\" in the state, \"", state_name(i),
                                       "\" in this optimizer (another parameter set or order)"));
    }
  }
  // Every buffer is found and fits before any is written.
  const auto families = state_buffers();
  std::vector<const Tensor<Scalar, 1>*> sources;
  for (const auto& [buffer, tensors] : families) {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const std::string key = detail::concat(buffer, ".", state.parameters[i]);
      const auto found = state.buffers.find(key);
      if (found == state.buffers.end()) {
        throw ConfigError(detail::concat(op, ": the state has no buffer \"", key, "\""));
      }
      if (found->second.size() != parameters_[i].size()) {
        throw ShapeError(detail::concat(op, ": buffer \"", key, "\" has ", found->second.size(),
                                        " values, ", detail::describe_parameter(i, parameters_[i]),
                                        " has ", parameters_[i].size()));
      }
      sources.push_back(&found->second);
    }
  }
  if (state.buffers.size() != sources.size()) {
    for (const auto& entry : state.buffers) {
      if (std::find(sources.begin(), sources.end(), &entry.second) == sources.end()) {
        throw ConfigError(detail::concat(op, ": the state has a buffer \"", entry.first, "\" that ",
                                         name_, " does not keep"));
      }
    }
  }
  std::size_t next = 0;
  for (const auto& [buffer, tensors] : families) {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      const Tensor<Scalar, 1>& source = *sources[next++];
      std::copy(source.data(), source.data() + source.size(), (*tensors)[i].data());
    }
  }
  steps_ = state.steps;
  lr_ = state.lr;
}

// ---- SGD ----------------------------------------------------------------------------------------

template <class Scalar>
Sgd<Scalar>::Sgd(ParameterList<Scalar> parameters, SgdOptions options)
    : Optimizer<Scalar>("Sgd", std::move(parameters), options.lr), options_(options) {
  using detail::check_hyperparameter;
  using detail::unbounded;
  check_hyperparameter("Sgd", "momentum", options.momentum, 0, unbounded, false);
  check_hyperparameter("Sgd", "dampening", options.dampening, -unbounded, unbounded, false);
  check_hyperparameter("Sgd", "weight_decay", options.weight_decay, 0, unbounded, false);
  if (options.nesterov && (options.momentum <= 0 || options.dampening != 0)) {
    throw ConfigError(
        detail::concat("Sgd: nesterov needs momentum > 0 and dampening 0, got "
                       "momentum ",
                       options.momentum, " and dampening ", options.dampening));
  }
  if (options.momentum != 0) momentum_ = this->make_state();
}

template <class Scalar>
std::map<std::string, double> Sgd<Scalar>::fixed_hyperparameters() const {
  return {{"momentum", options_.momentum},
          {"dampening", options_.dampening},
          {"weight_decay", options_.weight_decay},
          {"nesterov", options_.nesterov ? 1.0 : 0.0}};
}

template <class Scalar>
std::vector<std::pair<std::string, std::vector<Tensor<Scalar, 1>>*>> Sgd<Scalar>::state_buffers() {
  if (options_.momentum == 0) return {};
  return {{"momentum_buffer", &momentum_}};
}

template <class Scalar>
void Sgd<Scalar>::step() {
  const bool first = this->steps_ == 0;
  // torch converts each Python-float coefficient to the tensor's dtype before the elementwise
  // op; doing the same keeps float runs on the same rounding path.
  const auto neg_lr = static_cast<Scalar>(-this->lr_);
  const auto momentum = static_cast<Scalar>(options_.momentum);
  const auto keep = static_cast<Scalar>(1 - options_.dampening);
  const auto decay = static_cast<Scalar>(options_.weight_decay);
  for (std::size_t i = 0; i < this->parameters_.size(); ++i) {
    const auto& p = this->parameters_[i];
    auto value = detail::array_of(p.value.data(), p.size());
    auto grad = detail::array_of(p.grad.data(), p.size());
    // Each branch is one fused pass over memory; the weight-decay term is recomputed rather than
    // stored, so no temporary buffer is needed.
    if (options_.momentum == 0) {
      if (decay != 0) {
        value += neg_lr * (grad + decay * value);
      } else {
        value += neg_lr * grad;
      }
      continue;
    }
    auto buf = detail::array_of(momentum_[i].data(), p.size());
    if (decay != 0) {
      if (first) {
        buf = grad + decay * value;
      } else {
        buf = momentum * buf + keep * (grad + decay * value);
      }
    } else if (first) {
      buf = grad;
    } else {
      buf = momentum * buf + keep * grad;
    }
    if (options_.nesterov) {
      if (decay != 0) {
        value += neg_lr * ((grad + decay * value) + momentum * buf);
      } else {
        value += neg_lr * (grad + momentum * buf);
      }
    } else {
      value += neg_lr * buf;
    }
  }
  ++this->steps_;
}

// ---- Adam and AdamW -----------------------------------------------------------------------------

template <class Scalar>
Adam<Scalar>::Adam(ParameterList<Scalar> parameters, AdamOptions options)
    : Adam("Adam", std::move(parameters), options) {}

template <class Scalar>
Adam<Scalar>::Adam(const char* name, ParameterList<Scalar> parameters, AdamOptions options)
    : Optimizer<Scalar>(name, std::move(parameters), options.lr), options_(options) {
  using detail::check_hyperparameter;
  check_hyperparameter(name, "beta1", options.beta1, 0, 1, false);
  check_hyperparameter(name, "beta2", options.beta2, 0, 1, false);
  check_hyperparameter(name, "eps", options.eps, 0, detail::unbounded, false);
  check_hyperparameter(name, "weight_decay", options.weight_decay, 0, detail::unbounded, false);
  exp_avg_ = this->make_state();
  exp_avg_sq_ = this->make_state();
}

template <class Scalar>
std::map<std::string, double> Adam<Scalar>::fixed_hyperparameters() const {
  return {{"beta1", options_.beta1},
          {"beta2", options_.beta2},
          {"eps", options_.eps},
          {"weight_decay", options_.weight_decay},
          {"decoupled_weight_decay", options_.decoupled_weight_decay ? 1.0 : 0.0}};
}

template <class Scalar>
std::vector<std::pair<std::string, std::vector<Tensor<Scalar, 1>>*>> Adam<Scalar>::state_buffers() {
  return {{"exp_avg", &exp_avg_}, {"exp_avg_sq", &exp_avg_sq_}};
}

template <class Scalar>
void Adam<Scalar>::step() {
  const index_t t = ++this->steps_;
  const double lr = this->lr_;
  // The bias corrections are scalars computed in double, as torch computes them in Python.
  const double bias_correction1 = 1 - std::pow(options_.beta1, static_cast<double>(t));
  const double bias_correction2 = 1 - std::pow(options_.beta2, static_cast<double>(t));
  const auto neg_step_size = static_cast<Scalar>(-(lr / bias_correction1));
  const auto bias_correction2_sqrt = static_cast<Scalar>(std::sqrt(bias_correction2));
  const auto beta1 = static_cast<Scalar>(options_.beta1);
  const auto beta2 = static_cast<Scalar>(options_.beta2);
  const auto one_minus_beta1 = static_cast<Scalar>(1 - options_.beta1);
  const auto one_minus_beta2 = static_cast<Scalar>(1 - options_.beta2);
  const auto eps = static_cast<Scalar>(options_.eps);
  const auto decay = static_cast<Scalar>(options_.weight_decay);
  const auto shrink = static_cast<Scalar>(1 - lr * options_.weight_decay);
  const bool decoupled = options_.decoupled_weight_decay;
  for (std::size_t i = 0; i < this->parameters_.size(); ++i) {
    const auto& p = this->parameters_[i];
    auto value = detail::array_of(p.value.data(), p.size());
    auto grad = detail::array_of(p.grad.data(), p.size());
    auto m = detail::array_of(exp_avg_[i].data(), p.size());
    auto v = detail::array_of(exp_avg_sq_[i].data(), p.size());
    if (decoupled && decay != 0) value *= shrink;
    if (!decoupled && decay != 0) {
      // L2 gradient g + wd·p, recomputed in each expression instead of stored.
      m = beta1 * m + one_minus_beta1 * (grad + decay * value);
      v = beta2 * v + one_minus_beta2 * (grad + decay * value).square();
    } else {
      m = beta1 * m + one_minus_beta1 * grad;
      v = beta2 * v + one_minus_beta2 * grad.square();
    }
    value += (neg_step_size * m) / (v.sqrt() / bias_correction2_sqrt + eps);
  }
}

template <class Scalar>
AdamW<Scalar>::AdamW(ParameterList<Scalar> parameters, AdamWOptions options)
    : Adam<Scalar>("AdamW", std::move(parameters),
                   AdamOptions{.lr = options.lr,
                               .beta1 = options.beta1,
                               .beta2 = options.beta2,
                               .eps = options.eps,
                               .weight_decay = options.weight_decay,
                               .decoupled_weight_decay = true}) {}

}  // namespace dissect
