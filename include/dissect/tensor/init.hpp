// dissect/tensor/init.hpp — a seeded generator and the weight-initialisation schemes.
//
// The generator (SplitMix64) is defined bit for bit, and so is every sample drawn from it:
// uniforms are built with std::fma and normals with a portable logarithm, because
// std::normal_distribution and std::log are implementation-defined. The same seed gives the
// same weights on every platform and compiler. The schemes follow PyTorch's names and bounds.
#pragma once

#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string_view>
#include <type_traits>

#define DISSECT_PUBLIC_HEADER  // the detail/ headers below check it (docs/architecture.md)
#include "dissect/core/detail/enum_check.hpp"
#include "dissect/core/detail/portable_math.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// Everything a Generator's future draws depend on: SplitMix64's counter and the second normal of
/// the last polar pair, if it has not been handed out yet. What a resumed run restores.
struct GeneratorState {
  std::uint64_t counter = 0;
  std::optional<double> spare_normal{};
  bool operator==(const GeneratorState&) const = default;
};

/// SplitMix64 (Steele, Lea, Flood 2014): a 64-bit counter passed through a bijective mixer.
class Generator {
 public:
  explicit Generator(std::uint64_t seed) : state_(seed) {}
  /// The generator's whole state: a Generator given it by set_state draws what this one draws.
  GeneratorState state() const { return {state_, spare_normal_}; }
  void set_state(const GeneratorState& state) {
    state_ = state.counter;
    spare_normal_ = state.spare_normal;
  }
  std::uint64_t next_u64();
  /// Uniform on [0, 1) with 53 random bits.
  double uniform();
  /// Uniform on [low, high).
  double uniform(double low, double high);
  /// Standard normal (Marsaglia's polar method).
  double normal();

 private:
  std::uint64_t state_;
  std::optional<double> spare_normal_;
};

/// How a Linear layer's parameters start. W is [out, in]; fan_in = in, fan_out = out.
enum class InitScheme {
  pytorch_default,  ///< nn.Linear's reset_parameters: W and b ~ U(−1/√in, 1/√in)
  kaiming_normal,   ///< the seed article: W = randn · √(2/in), b = 0 (He et al. 2015, for ReLU)
  kaiming_uniform,  ///< W ~ U(−√(6/in), √(6/in)), b = 0 (gain √2, a = 0)
  xavier_uniform,   ///< W ~ U(−√(6/(in+out)), √(6/(in+out))), b = 0 (Glorot & Bengio 2010)
  xavier_normal,    ///< W ~ N(0, 2/(in+out)), b = 0
  zeros,            ///< W = 0, b = 0
};

/// The enumerators' names, in order: what to_string prints and what an out-of-range value is
/// checked against.
namespace detail {
inline constexpr std::array<std::string_view, 6> init_scheme_names{
    "pytorch_default", "kaiming_normal", "kaiming_uniform",
    "xavier_uniform",  "xavier_normal",  "zeros"};
}  // namespace detail

const char* to_string(InitScheme scheme);

/// `scheme` itself, if it is one of the enumerators.
/// @throws ConfigError naming `op` and the value otherwise (an InitScheme cast from an int).
InitScheme check_init_scheme(const char* op, InitScheme scheme);

/// Fills `weight` [out, in] (and `bias` [out] if given) by `scheme`. A zero fan gives a zero
/// bound or deviation, never a division by zero.
/// @throws ConfigError (nothing written) if `scheme` is not an enumerator.
template <class Scalar>
void init_linear(TensorView<Scalar, 2> weight, std::optional<TensorView<Scalar, 1>> bias,
                 InitScheme scheme, Generator& generator);
template <class Scalar>
void init_linear(Tensor<Scalar, 2>& weight, std::type_identity_t<Tensor<Scalar, 1>>* bias,
                 InitScheme scheme, Generator& generator);

template <WritableTensor X>
void fill_uniform(X&& tensor, double low, double high, Generator& generator);
template <WritableTensor X>
void fill_normal(X&& tensor, double mean, double stddev, Generator& generator);

/// Resets the sequence of seeds handed to layers built without an explicit seed, like
/// torch.manual_seed: the same program then builds the same layers.
void manual_seed(std::uint64_t seed);
/// The next seed of that sequence (thread-safe).
std::uint64_t next_default_seed();

/// How the layers built on this thread start (Linear, Embedding and the models over them).
struct ConstructionOptions {
  /// Draw the random initial values. Off: the parameters start at 0 (norm weights at 1, as
  /// built); for a loader that writes every parameter straight after (it still takes the seeds
  /// it would have taken, so a program's later layers are the same).
  bool initialise = true;
  /// Allocate gradient buffers. Off: Linear and Embedding are built frozen (Linear::set_frozen),
  /// with no gradient memory: a model for inference, whose gradients would be as large as its
  /// weights. Unfreezing a layer allocates its gradients as usual.
  bool gradients = true;
  /// With initialise off: Linear weights are allocated but not written, not even zeroed (their
  /// memory pages stay untouched until written), for a loader that writes every weight next or
  /// frees it (Linear::set_quantized_weight with DenseCopy::release): a quantised GGUF model
  /// then never holds its float weights at all. Reading such a weight before it is written reads
  /// unspecified values.
  bool leave_weights_unwritten = false;
};

/// While alive, the layers built on this thread follow `options`; the previous options come
/// back when it ends (scopes nest). The loaders (io/) open one with initialise = false and keep
/// the caller's gradients setting, so
///   { ConstructionScope inference({.gradients = false}); model = open_model<…>(path); }
/// loads a model for inference without gradient buffers.
class ConstructionScope {
 public:
  explicit ConstructionScope(ConstructionOptions options);
  ~ConstructionScope();
  ConstructionScope(const ConstructionScope&) = delete;
  ConstructionScope& operator=(const ConstructionScope&) = delete;
  /// The options in force on this thread: the innermost scope's, or the defaults.
  static const ConstructionOptions& current();

 private:
  ConstructionOptions saved_;
};

// ---- implementation -----------------------------------------------------------------------------

inline std::uint64_t Generator::next_u64() {
  std::uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline double Generator::uniform() {
  return static_cast<double>(next_u64() >> 11) * 0x1.0p-53;
}

inline double Generator::uniform(double low, double high) {
  // fma, not low + (high − low)·u: compilers may or may not contract that, changing the bits.
  return std::fma(high - low, uniform(), low);
}

inline double Generator::normal() {
  if (spare_normal_) return *std::exchange(spare_normal_, std::nullopt);
  double u = 0, v = 0, s = 0;
  do {
    u = uniform(-1.0, 1.0);
    v = uniform(-1.0, 1.0);
    s = std::fma(u, u, v * v);
  } while (s >= 1.0 || s == 0.0);
  const double factor = std::sqrt(-2.0 * detail::portable_log(s) / s);
  spare_normal_ = v * factor;
  return u * factor;
}

inline const char* to_string(InitScheme scheme) {
  return detail::enum_name(scheme, detail::init_scheme_names).data();  // literals: terminated
}

inline InitScheme check_init_scheme(const char* op, InitScheme scheme) {
  return detail::check_enum(op, "InitScheme", scheme, detail::init_scheme_names);
}

template <WritableTensor X>
void fill_uniform(X&& tensor, double low, double high, Generator& generator) {
  using Scalar = scalar_of<X>;
  for (Scalar& value : writable_view(tensor))
    value = static_cast<Scalar>(generator.uniform(low, high));
}

template <WritableTensor X>
void fill_normal(X&& tensor, double mean, double stddev, Generator& generator) {
  using Scalar = scalar_of<X>;
  for (Scalar& value : writable_view(tensor))
    value = static_cast<Scalar>(std::fma(stddev, generator.normal(), mean));
}

namespace detail {
/// √(numerator / fan), or 0 for an empty fan: a layer with no inputs has nothing to scale.
inline double scale_for_fan(double numerator, index_t fan) {
  return fan > 0 ? std::sqrt(numerator / static_cast<double>(fan)) : 0.0;
}
}  // namespace detail

template <class Scalar>
void init_linear(Tensor<Scalar, 2>& weight, std::type_identity_t<Tensor<Scalar, 1>>* bias,
                 InitScheme scheme, Generator& generator) {
  init_linear(weight.view(),
              bias ? std::optional<TensorView<Scalar, 1>>(bias->view()) : std::nullopt, scheme,
              generator);
}

template <class Scalar>
void init_linear(TensorView<Scalar, 2> weight, std::optional<TensorView<Scalar, 1>> bias,
                 InitScheme scheme, Generator& generator) {
  check_init_scheme("init_linear", scheme);
  const index_t fan_out = weight.dim(0);
  const index_t fan_in = weight.dim(1);
  if (bias) bias->fill(Scalar(0));
  switch (scheme) {
    case InitScheme::pytorch_default: {
      // kaiming_uniform(a=√5) works out to bound 1/√in for W; the bias uses the same bound.
      const double bound = detail::scale_for_fan(1.0, fan_in);
      fill_uniform(weight, -bound, bound, generator);
      if (bias) fill_uniform(*bias, -bound, bound, generator);
      break;
    }
    case InitScheme::kaiming_normal:
      fill_normal(weight, 0.0, detail::scale_for_fan(2.0, fan_in), generator);
      break;
    case InitScheme::kaiming_uniform: {
      const double bound = detail::scale_for_fan(6.0, fan_in);
      fill_uniform(weight, -bound, bound, generator);
      break;
    }
    case InitScheme::xavier_uniform: {
      const double bound = detail::scale_for_fan(6.0, fan_in + fan_out);
      fill_uniform(weight, -bound, bound, generator);
      break;
    }
    case InitScheme::xavier_normal:
      fill_normal(weight, 0.0, detail::scale_for_fan(2.0, fan_in + fan_out), generator);
      break;
    case InitScheme::zeros:
      weight.fill(Scalar(0));
      break;
  }
}

namespace detail {
inline std::atomic<std::uint64_t>& default_seed_counter() {
  static std::atomic<std::uint64_t> counter{0x5EED};
  return counter;
}
}  // namespace detail

inline void manual_seed(std::uint64_t seed) {
  detail::default_seed_counter().store(seed);
}

inline std::uint64_t next_default_seed() {
  // Consecutive counters are fine as seeds: SplitMix64's mixer decorrelates them.
  return detail::default_seed_counter().fetch_add(1);
}

namespace detail {
inline ConstructionOptions& construction_options() {
  // Per thread: a loader on one thread must not change what another thread's layers start as.
  static thread_local ConstructionOptions options;
  return options;
}
}  // namespace detail

inline ConstructionScope::ConstructionScope(ConstructionOptions options)
    : saved_(detail::construction_options()) {
  detail::construction_options() = options;
}

inline ConstructionScope::~ConstructionScope() {
  detail::construction_options() = saved_;
}

inline const ConstructionOptions& ConstructionScope::current() {
  return detail::construction_options();
}

}  // namespace dissect
