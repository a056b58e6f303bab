// linear_regression — the series' last entry: fitting y = x·Wᵀ + b two ways.
//
// Data: 200 samples of 3 features, targets from a known W [2, 3] and b [2] plus Gaussian noise.
// 1. Closed form: append a column of ones to x (X̃ = [x, 1]) and solve the normal equations
//    X̃ᵀX̃·θ = X̃ᵀy with Eigen's LDLT; θ stacks Wᵀ over b. This is the least-squares answer.
// 2. SGD on dissect::Linear: the mean squared error's gradient through Linear::backward, steps by
//    dissect::Sgd. The batch is the whole data set, so SGD descends the very loss the normal
//    equations minimise and its W converges to θ's (mini-batches would wander within the noise).
// The figure (linear_regression.svg, or --svg PATH, "none" for none) shows SGD's distance to the
// closed-form W, on a log scale, and its loss against the closed form's.
#include <dissect/dissect.hpp>

#include <Eigen/Cholesky>
#include <algorithm>
#include <cmath>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "common/cli.hpp"
#include "common/svg_plot.hpp"

using dissect::index_t;
using dissect::Linear;
using dissect::Tensor;

namespace {

constexpr const char* kDescription =
    "linear_regression — least squares by the normal equations (Eigen's LDLT) and by SGD on a "
    "dissect::Linear, converging to the same W and b";

constexpr index_t kSamples = 200, kIn = 3, kOut = 2;
constexpr int kSteps = 120;

/// Mean over samples of ‖ŷ − y‖², and its gradient dŷ = 2(ŷ − y)/n into `dy` when given.
double mse(const Tensor<double, 2>& y_hat, const Tensor<double, 2>& y, Tensor<double, 2>* dy) {
  double total = 0;
  for (index_t i = 0; i < y.size(); ++i) {
    const double r = y_hat.data()[i] - y.data()[i];
    total += r * r;
    if (dy) dy->data()[i] = 2 * r / static_cast<double>(kSamples);
  }
  return total / static_cast<double>(kSamples);
}

/// max |a − b| over W and b of two fits.
double max_difference(const Linear<double>& a, const Linear<double>& b) {
  double worst = 0;
  for (index_t i = 0; i < a.weight().size(); ++i) {
    worst = std::max(worst, std::abs(a.weight().data()[i] - b.weight().data()[i]));
  }
  for (index_t i = 0; i < a.bias().size(); ++i) {
    worst = std::max(worst, std::abs(a.bias().data()[i] - b.bias().data()[i]));
  }
  return worst;
}

void print_fit(const char* name, const Linear<double>& layer) {
  std::cout << std::setw(12) << name << "  W = [";
  for (index_t o = 0; o < kOut; ++o) {
    std::cout << (o ? "; " : "");
    for (index_t i = 0; i < kIn; ++i) {
      std::cout << (i ? " " : "") << std::showpos << std::fixed << std::setprecision(4)
                << layer.weight()(o, i);
    }
  }
  std::cout << "]  b = [" << layer.bias()(0) << " " << layer.bias()(1) << "]" << std::noshowpos
            << "\n";
}

/// Left: how far SGD's parameters are from the closed form's; right: its loss flattening onto the
/// least-squares loss (the noise's variance, 2·0.1², up to the fit). Both on log10 scales.
std::string draw_figure(const std::vector<double>& steps, const std::vector<double>& log_distance,
                        const std::vector<double>& loss, double closed_form_loss) {
  namespace ex = dissect::examples;
  std::vector<double> log_loss(loss.size());
  std::transform(loss.begin(), loss.end(), log_loss.begin(),
                 [](double v) { return std::log10(v); });
  const std::vector<double> floor(steps.size(), std::log10(closed_form_loss));
  const std::vector<ex::Panel> panels = {
      {.title = "SGD's W and b approach the normal equations' solution",
       .xlabel = "SGD step",
       .ylabel = "log10 max |θ_SGD − θ_closed form|",
       .series = {ex::line(steps, log_distance, {.label = "SGD on dissect::Linear", .width = 2})}},
      {.title = "Mean squared error",
       .xlabel = "SGD step",
       .ylabel = "log10 loss",
       .series = {ex::line(steps, log_loss, {.label = "SGD", .width = 2}),
                  ex::line(steps, floor,
                           {.label = "closed form (least squares)", .width = 2, .dash = "6 4"})}}};
  return ex::svg(panels, 1100, 420);
}

int run(dissect::examples::OutputFile& figure) {
  // The data: x ~ U(−1, 1), y = x·W_trueᵀ + b_true + N(0, 0.1²), from the library's generator.
  dissect::Generator generator(2026);
  Linear<double> truth(kIn, kOut, {.seed = 1});
  truth.set_weight(Tensor<double, 2>({kOut, kIn}, {1.5, -2.0, 0.5, 0.25, 1.0, -3.0}).view());
  truth.set_bias(Tensor<double, 1>({kOut}, {0.7, -1.2}).view());
  Tensor<double, 2> x({kSamples, kIn});
  dissect::fill_uniform(x, -1, 1, generator);
  Tensor<double, 2> y = truth.forward(x);
  for (double& v : y) v += 0.1 * generator.normal();

  // 1. Normal equations: X̃ᵀX̃·θ = X̃ᵀy, X̃ [n, in + 1], θ [in + 1, out]. X̃ᵀX̃ is symmetric
  // positive definite (the features are not collinear), so LDLT, a Cholesky without square roots,
  // solves it.
  Eigen::MatrixXd augmented(kSamples, kIn + 1);
  augmented.leftCols(kIn) = x.matrix();
  augmented.col(kIn).setOnes();
  const Eigen::MatrixXd gram = augmented.transpose() * augmented;
  const Eigen::MatrixXd theta = gram.ldlt().solve(augmented.transpose() * y.matrix());
  Linear<double> closed_form(kIn, kOut, {.seed = 2});
  Tensor<double, 2> w_closed({kOut, kIn});
  w_closed.matrix() = theta.topRows(kIn).transpose();
  Tensor<double, 1> b_closed({kOut});
  b_closed.vector() = theta.row(kIn).transpose();
  closed_form.set_weight(w_closed.view());
  closed_form.set_bias(b_closed.view());
  const double closed_form_loss = mse(closed_form.forward(x), y, nullptr);

  // 2. SGD on a freshly initialised Linear. The loss's Hessian is 2·X̃ᵀX̃/n, whose eigenvalues lie
  // near 2/3 (features of variance 1/3) and 2 (the bias column); lr = 0.5 contracts every
  // direction by at most |1 − 0.5·λ| ≤ 2/3 a step.
  Linear<double> model(kIn, kOut, {.seed = 3});
  dissect::Sgd sgd(model, {.lr = 0.5});
  Tensor<double, 2> dy({kSamples, kOut});
  std::vector<double> steps, log_distance, losses;
  for (int step = 0; step <= kSteps; ++step) {
    model.zero_grad();
    const double loss = mse(model.forward(x), y, &dy);
    steps.push_back(step);
    losses.push_back(loss);
    log_distance.push_back(std::log10(std::max(max_difference(model, closed_form), 1e-17)));
    if (step == kSteps) break;
    (void)model.backward(x, dy);
    sgd.step();
  }

  std::cout << "y = x·Wᵀ + b + noise, " << kSamples << " samples, " << kIn << " features, " << kOut
            << " outputs\n";
  print_fit("true", truth);
  print_fit("closed form", closed_form);
  print_fit("SGD", model);
  const double gap = max_difference(model, closed_form);
  std::cout << std::scientific << std::setprecision(3) << "loss: closed form " << closed_form_loss
            << ", SGD after " << kSteps << " steps " << losses.back() << "\n"
            << "max |SGD - closed form| over W and b = " << gap << "\n";
  if (figure.enabled()) {
    figure.write(draw_figure(steps, log_distance, losses, closed_form_loss));
    std::cout << "figure written to " << figure.path() << "\n";
  }
  const bool ok = gap < 1e-9;
  std::cout << (ok ? "OK: SGD on dissect::Linear converged to the least-squares W and b\n"
                   : "MISMATCH: SGD did not reach the closed form\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return dissect::examples::figure_example_main(argc, argv, "linear_regression", kDescription, run);
}
