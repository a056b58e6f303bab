// dissect/layers/batch_norm.hpp — BatchNorm1d<Scalar>: nn.BatchNorm1d, normalisation across the
// batch.
//
// LayerNorm normalises each token over its features; batch normalisation normalises each feature
// (channel) over the batch: x [N, C] or [N, C, L], statistics per channel over N (and L). While
// training it uses the batch's statistics and keeps exponential running averages of them; in
// evaluation it uses those averages, so it becomes a fixed affine map per channel. The module is
// the first with a training/evaluation mode (torch's module.train() / .eval()): see ModalLayer in
// module.hpp.
#pragma once

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "dissect/accounting/config.hpp"
#include "dissect/core/error.hpp"
#include "dissect/core/shape.hpp"
#include "dissect/tensor/module.hpp"
#include "dissect/tensor/tensor.hpp"

namespace dissect {

// ---- declarations -------------------------------------------------------------------------------

/// nn.BatchNorm1d's arguments (affine and track_running_stats are always on; momentum=None, the
/// cumulative average, is not offered).
struct BatchNormOptions {
  double eps = 1e-5;      ///< finite, > 0
  double momentum = 0.1;  ///< in [0, 1]: running = (1 − momentum)·running + momentum·batch
};

/// BatchNorm1d over channel axis 1 of x [N, C] or [N, C, L]: y = (x − μ_c)/√(σ²_c + eps)·γ_c + β_c.
///
/// Training mode (the default, as torch): μ and σ² are the batch's, over the N·L values of each
/// channel, σ² biased (÷ N·L); the training forward, forward(x, cache), also updates
///   running_mean = (1 − m)·running_mean + m·μ,  running_var = (1 − m)·running_var + m·σ²·n/(n − 1)
/// (the *unbiased* variance, as torch) and counts num_batches_tracked. Evaluation mode: μ and σ²
/// are running_mean and running_var, and nothing is updated.
/// Numerics: statistics and outputs in double, rounded to Scalar once, as LayerNorm.
/// Backward, per channel over its n values, x̂ = (x − μ)·rstd, g = dy·γ:
///   training: dx = rstd·(g − mean(g) − x̂·mean(g·x̂));  evaluation: dx = rstd·g
///   dγ += Σ dy·x̂,  dβ += Σ dy.
template <class Scalar>
class BatchNorm1d : public ParameterMethods<BatchNorm1d<Scalar>> {
  static_assert(is_supported_scalar_v<Scalar>,
                "dissect::BatchNorm1d<Scalar>: Scalar must be float or double");

 public:
  using scalar_type = Scalar;

  /// What backward needs: x's shape, whether the batch's statistics were used, and the per
  /// channel mean and 1/√(var + eps) in double.
  struct Cache {
    std::vector<index_t> shape;
    bool batch_statistics = false;
    Tensor<double, 1> mean;  ///< [C]
    Tensor<double, 1> rstd;  ///< [C]
  };

  /// γ = 1, β = 0, running_mean = 0, running_var = 1, in training mode.
  /// @throws ConfigError naming num_features if ≤ 0, eps unless finite and > 0, momentum unless
  ///         in [0, 1] (NaN included).
  explicit BatchNorm1d(index_t num_features, const BatchNormOptions& options = {});

  index_t num_features() const { return weight_.dim(0); }
  double eps() const { return eps_; }
  double momentum() const { return momentum_; }

  /// The mode (ModalLayer): torch's module.train(mode) and module.training.
  void set_training(bool training) { training_ = training; }
  bool training() const { return training_; }

  TensorView<Scalar, 1> weight() { return weight_.view(); }
  ConstTensorView<Scalar, 1> weight() const { return weight_.cview(); }
  TensorView<Scalar, 1> bias() { return bias_.view(); }
  ConstTensorView<Scalar, 1> bias() const { return bias_.cview(); }
  TensorView<Scalar, 1> weight_grad() { return weight_grad_.view(); }
  ConstTensorView<Scalar, 1> weight_grad() const { return weight_grad_.cview(); }
  TensorView<Scalar, 1> bias_grad() { return bias_grad_.view(); }
  ConstTensorView<Scalar, 1> bias_grad() const { return bias_grad_.cview(); }
  /// The buffers (state_dict's running_mean, running_var, num_batches_tracked; not parameters:
  /// no gradient, and optimizers never see them). Values writable, shape fixed.
  TensorView<Scalar, 1> running_mean() { return running_mean_.view(); }
  ConstTensorView<Scalar, 1> running_mean() const { return running_mean_.cview(); }
  TensorView<Scalar, 1> running_var() { return running_var_.view(); }
  ConstTensorView<Scalar, 1> running_var() const { return running_var_.cview(); }
  std::int64_t num_batches_tracked() const { return num_batches_tracked_; }

  void set_weight(ConstTensorView<Scalar, 1> weight) {
    assign_parameter("BatchNorm1d", "weight", "[num_features]", weight_, weight);
  }
  void set_bias(ConstTensorView<Scalar, 1> bias) {
    assign_parameter("BatchNorm1d", "bias", "[num_features]", bias_, bias);
  }

  /// Visits "weight" and "bias" with their gradients: the module protocol.
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) {
    visit(ParameterName("weight"), weight_.view(), weight_grad_.view());
    visit(ParameterName("bias"), bias_.view(), bias_grad_.view());
  }
  template <class Visitor>
  void for_each_parameter(Visitor&& visit) const {
    visit(ParameterName("weight"), weight_.cview(), weight_grad_.cview());
    visit(ParameterName("bias"), bias_.cview(), bias_grad_.cview());
  }

  /// x: [N, C] or [N, C, L] → y of x's shape, with the mode's statistics; never updates the
  /// running ones (a const inference call; the training step is forward(x, cache)).
  /// @throws ShapeError naming x's shape if its axis 1 is not C, or, in training mode, a channel
  ///         has fewer than 2 values (N·L < 2: torch refuses a batch of 1 too).
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x) const;

  /// The training step: as forward, keeping the statistics in `cache` for backward and, in
  /// training mode, updating the running statistics (strong guarantee: a throw changes nothing).
  template <TensorLike X>
  Tensor<Scalar, rank_of<X>> forward(const X& x, Cache& cache);

  /// dx of x's shape; adds to dγ and dβ. @throws ShapeError (gradients untouched) if dy's shape is
  /// not x's or the cache holds another shape.
  template <TensorLike X, TensorLike DY>
  Tensor<Scalar, rank_of<X>> backward(const X& x, const Cache& cache, const DY& dy);

 private:
  /// x's (outer N, inner L), after checking its rank, channels and (batch statistics) count.
  template <std::size_t Rank>
  std::pair<index_t, index_t> layout(const char* op, const Shape<Rank>& shape,
                                     bool batch_statistics) const;
  /// Fills mean and rstd [C] from x's batch (var biased, returned through `variance`), or from
  /// the running statistics.
  void statistics(const Scalar* x, index_t outer, index_t inner, bool batch_statistics,
                  Eigen::ArrayXd& mean, Eigen::ArrayXd& rstd, Eigen::ArrayXd& variance) const;
  void normalize(const Scalar* x, index_t outer, index_t inner, const Eigen::ArrayXd& mean,
                 const Eigen::ArrayXd& rstd, Scalar* y) const;

  double eps_;
  double momentum_;
  bool training_ = true;
  Tensor<Scalar, 1> weight_, bias_, weight_grad_, bias_grad_, running_mean_, running_var_;
  std::int64_t num_batches_tracked_ = 0;
};

/// "BatchNorm1d(64, eps=1e-05, momentum=0.1)".
template <class Scalar>
std::ostream& operator<<(std::ostream& out, const BatchNorm1d<Scalar>& norm) {
  return out << "BatchNorm1d(" << norm.num_features() << ", eps=" << norm.eps()
             << ", momentum=" << norm.momentum() << ")";
}

// ---- implementation -----------------------------------------------------------------------------

namespace detail {

inline double require_momentum(double momentum) {
  // !(a && b) also catches NaN, which compares false with everything.
  if (!(momentum >= 0.0 && momentum <= 1.0)) {
    throw ConfigError(concat("BatchNorm1d: momentum must be in [0, 1] (got ", momentum, ")"));
  }
  return momentum;
}

}  // namespace detail

template <class Scalar>
BatchNorm1d<Scalar>::BatchNorm1d(index_t num_features, const BatchNormOptions& options)
    : eps_(require_positive_finite("BatchNorm1d", "eps", options.eps)),
      momentum_(detail::require_momentum(options.momentum)),
      weight_({require_positive("BatchNorm1d", "num_features", num_features)}),
      bias_({num_features}),
      weight_grad_({num_features}),
      bias_grad_({num_features}),
      running_mean_({num_features}),
      running_var_({num_features}) {
  weight_.view().fill(Scalar(1));
  running_var_.view().fill(Scalar(1));
}

template <class Scalar>
template <std::size_t Rank>
std::pair<index_t, index_t> BatchNorm1d<Scalar>::layout(const char* op, const Shape<Rank>& shape,
                                                        bool batch_statistics) const {
  static_assert(Rank == 2 || Rank == 3, "dissect::BatchNorm1d: x must be [N, C] or [N, C, L]");
  if (shape[1] != num_features()) {
    throw ShapeError(detail::concat("BatchNorm1d::", op, ": input channels (axis 1) ", shape[1],
                                    " != num_features ", num_features(),
                                    " (x: ", format_shape(shape), ")"));
  }
  const index_t outer = shape[0], inner = Rank == 3 ? shape[Rank - 1] : 1;
  if (batch_statistics && outer * inner < 2) {
    throw ShapeError(detail::concat("BatchNorm1d::", op,
                                    ": expected more than 1 value per channel when training, got ",
                                    outer * inner, " (x: ", format_shape(shape), ")"));
  }
  return {outer, inner};
}

template <class Scalar>
void BatchNorm1d<Scalar>::statistics(const Scalar* x, index_t outer, index_t inner,
                                     bool batch_statistics, Eigen::ArrayXd& mean,
                                     Eigen::ArrayXd& rstd, Eigen::ArrayXd& variance) const {
  const index_t channels = num_features();
  mean.resize(channels);
  rstd.resize(channels);
  variance.resize(channels);
  for (index_t c = 0; c < channels; ++c) {
    if (!batch_statistics) {
      mean[c] = static_cast<double>(running_mean_.data()[c]);
      variance[c] = static_cast<double>(running_var_.data()[c]);
    } else {
      // Two passes, Σ(x − μ)²/n, never E[x²] − μ²: a constant channel has variance 0 exactly.
      const double count = static_cast<double>(outer * inner);
      double sum = 0;
      for (index_t n = 0; n < outer; ++n)
        for (index_t l = 0; l < inner; ++l) sum += x[(n * channels + c) * inner + l];
      const double mu = sum / count;
      double squares = 0;
      for (index_t n = 0; n < outer; ++n)
        for (index_t l = 0; l < inner; ++l) {
          const double d = x[(n * channels + c) * inner + l] - mu;
          squares += d * d;
        }
      mean[c] = mu;
      variance[c] = squares / count;
    }
    rstd[c] = 1.0 / std::sqrt(variance[c] + eps_);
  }
}

template <class Scalar>
void BatchNorm1d<Scalar>::normalize(const Scalar* x, index_t outer, index_t inner,
                                    const Eigen::ArrayXd& mean, const Eigen::ArrayXd& rstd,
                                    Scalar* y) const {
  const index_t channels = num_features();
  for (index_t n = 0; n < outer; ++n)
    for (index_t c = 0; c < channels; ++c) {
      const double gamma = weight_.data()[c], beta = bias_.data()[c];
      for (index_t l = 0; l < inner; ++l) {
        const index_t i = (n * channels + c) * inner + l;
        y[i] = static_cast<Scalar>((x[i] - mean[c]) * rstd[c] * gamma + beta);
      }
    }
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> BatchNorm1d<Scalar>::forward(const X& x) const {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  const auto [outer, inner] = layout("forward", input.shape(), training_);
  Eigen::ArrayXd mean, rstd, variance;
  statistics(input.data(), outer, inner, training_, mean, rstd, variance);
  auto y = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  normalize(input.data(), outer, inner, mean, rstd, y.data());
  return y;
}

template <class Scalar>
template <TensorLike X>
Tensor<Scalar, rank_of<X>> BatchNorm1d<Scalar>::forward(const X& x, Cache& cache) {
  require_layer_scalar<Scalar, X>();
  const auto input = const_view(x);
  const auto [outer, inner] = layout("forward", input.shape(), training_);
  Eigen::ArrayXd mean, rstd, variance;
  statistics(input.data(), outer, inner, training_, mean, rstd, variance);
  auto y = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  normalize(input.data(), outer, inner, mean, rstd, y.data());

  const index_t channels = num_features();
  cache.shape.assign(input.shape().begin(), input.shape().end());
  cache.batch_statistics = training_;
  reuse_buffer(cache.mean, Shape<1>{channels});
  reuse_buffer(cache.rstd, Shape<1>{channels});
  std::copy(mean.data(), mean.data() + channels, cache.mean.data());
  std::copy(rstd.data(), rstd.data() + channels, cache.rstd.data());
  if (training_) {
    // torch's running variance is the unbiased one, σ²·n/(n − 1) (n ≥ 2 was checked).
    const double count = static_cast<double>(outer * inner);
    const double bessel = count / (count - 1.0);
    for (index_t c = 0; c < channels; ++c) {
      Scalar& rm = running_mean_.data()[c];
      Scalar& rv = running_var_.data()[c];
      rm = static_cast<Scalar>((1.0 - momentum_) * rm + momentum_ * mean[c]);
      rv = static_cast<Scalar>((1.0 - momentum_) * rv + momentum_ * variance[c] * bessel);
    }
    ++num_batches_tracked_;
  }
  return y;
}

template <class Scalar>
template <TensorLike X, TensorLike DY>
Tensor<Scalar, rank_of<X>> BatchNorm1d<Scalar>::backward(const X& x, const Cache& cache,
                                                         const DY& dy) {
  require_layer_scalar<Scalar, X>();
  require_layer_scalar<Scalar, DY>();
  const auto input = const_view(x);
  const auto upstream = const_view(dy);
  const auto [outer, inner] = layout("backward", input.shape(), false);
  if (upstream.shape() != input.shape()) {
    throw ShapeError(detail::concat("BatchNorm1d::backward: dy has shape ",
                                    format_shape(upstream.shape()), " but x has shape ",
                                    format_shape(input.shape())));
  }
  const index_t channels = num_features();
  if (!std::equal(cache.shape.begin(), cache.shape.end(), input.shape().begin(),
                  input.shape().end()) ||
      cache.mean.size() != channels || cache.rstd.size() != channels) {
    throw ShapeError(
        detail::concat("BatchNorm1d::backward: the cache does not hold the "
                       "statistics of x ",
                       format_shape(input.shape()), " (fill it with forward(x, cache))"));
  }
  auto dx = Tensor<Scalar, rank_of<X>>::uninitialized(input.shape());
  const Scalar* xs = input.data();
  const Scalar* dys = upstream.data();
  const double count = static_cast<double>(outer * inner);
  Eigen::ArrayXd d_gamma = Eigen::ArrayXd::Zero(channels), d_beta = Eigen::ArrayXd::Zero(channels);
  for (index_t c = 0; c < channels; ++c) {
    const double mu = cache.mean.data()[c], rstd = cache.rstd.data()[c];
    const double gamma = weight_.data()[c];
    double sum_dy = 0, sum_dy_xhat = 0;
    for (index_t n = 0; n < outer; ++n)
      for (index_t l = 0; l < inner; ++l) {
        const index_t i = (n * channels + c) * inner + l;
        sum_dy += dys[i];
        sum_dy_xhat += dys[i] * (xs[i] - mu) * rstd;
      }
    d_gamma[c] = sum_dy_xhat;
    d_beta[c] = sum_dy;
    // With batch statistics μ and σ depend on every x of the channel: the two mean terms.
    const double mean_g = cache.batch_statistics ? gamma * sum_dy / count : 0.0;
    const double mean_gx = cache.batch_statistics ? gamma * sum_dy_xhat / count : 0.0;
    for (index_t n = 0; n < outer; ++n)
      for (index_t l = 0; l < inner; ++l) {
        const index_t i = (n * channels + c) * inner + l;
        const double x_hat = (xs[i] - mu) * rstd;
        dx.data()[i] = static_cast<Scalar>(rstd * (gamma * dys[i] - mean_g - x_hat * mean_gx));
      }
  }
  weight_grad_.vector() += d_gamma.matrix().template cast<Scalar>();
  bias_grad_.vector() += d_beta.matrix().template cast<Scalar>();
  return dx;
}

}  // namespace dissect
