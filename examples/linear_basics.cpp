// linear_basics — the seed article's demonstration, in C++.
//
// Build a layer, run a hand-written y = x·Wᵀ + b with the very same weights, and print the
// difference (0). Then run backward and check each gradient against central differences. The
// article's figure is drawn to linear_basics.svg (or the path given with --svg, "none" for no
// figure): the transform as a line plot beside the histograms of the input and output
// distributions.
#include <dissect/dissect.hpp>

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
    "linear_basics — a 1 → 1 dissect::Linear against the hand-written y = x·Wᵀ + b, and a "
    "4 → 3 layer's gradients against central differences";

/// y = x·Wᵀ + b as the formula reads, one dot product at a time.
Tensor<double, 2> hand_written_linear(const Tensor<double, 2>& x,
                                      dissect::ConstTensorView<double, 2> weight,
                                      dissect::ConstTensorView<double, 1> bias) {
  Tensor<double, 2> y({x.dim(0), weight.dim(0)});
  for (index_t m = 0; m < x.dim(0); ++m) {
    for (index_t n = 0; n < weight.dim(0); ++n) {
      double sum = 0;
      for (index_t k = 0; k < x.dim(1); ++k) sum += x(m, k) * weight(n, k);
      y(m, n) = sum + bias(n);
    }
  }
  return y;
}

double max_abs_difference(const Tensor<double, 2>& a, const Tensor<double, 2>& b) {
  double worst = 0;
  for (index_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(a.data()[i] - b.data()[i]));
  return worst;
}

/// Σ y ⊙ g: a scalar loss whose gradient with respect to y is g.
double loss(const Linear<double>& layer, const Tensor<double, 2>& x, const Tensor<double, 2>& g) {
  const auto y = layer.forward(x);
  double sum = 0;
  for (index_t i = 0; i < y.size(); ++i) sum += y.data()[i] * g.data()[i];
  return sum;
}

/// Largest |analytic − numeric| over every element of `values`. Numeric is the central difference
/// (L(v + h) − L(v − h)) / 2h: nudge one number both ways, rerun the layer, see how far the loss
/// moves. Its error is h²/6·L''' (0 here: L is linear in each value) plus the loss's rounding over
/// h, ~1e-11 at h = 1e-5 in double. This is the idea at its plainest, for reading; the tests check
/// every layer this way, with tolerances and a report, in tests/support/gradcheck.hpp (test
/// tooling, which an example does not include).
template <class Loss>
double finite_difference_error(dissect::ConstTensorView<double, 2> analytic, double* values,
                               Loss&& loss_now) {
  const double h = 1e-5;
  double worst = 0;
  for (index_t i = 0; i < analytic.size(); ++i) {
    const double saved = values[i];
    values[i] = saved + h;
    const double plus = loss_now();
    values[i] = saved - h;
    const double minus = loss_now();
    values[i] = saved;
    worst = std::max(worst, std::abs(analytic.data()[i] - (plus - minus) / (2 * h)));
  }
  return worst;
}

std::vector<double> column(const Tensor<double, 2>& t) {
  return {t.begin(), t.end()};
}

/// Left: x against the hand-written layer and dissect::Linear (one line over the other).
/// Right: how the layer moves and stretches the distribution of values.
std::string draw_figure(const Tensor<double, 2>& x, const Tensor<double, 2>& y_by_hand,
                        const Tensor<double, 2>& y) {
  namespace ex = dissect::examples;
  const auto xs = column(x), hand = column(y_by_hand), ours = column(y);
  const std::vector<ex::Panel> panels = {
      {.title = "Linear transform: input → output",
       .xlabel = "input feature x",
       .ylabel = "output feature y",
       .series = {ex::line(xs, xs, {.label = "input x (identity)", .width = 3}),
                  ex::line(xs, hand, {.label = "hand-written x·Wᵀ + b", .width = 2}),
                  ex::line(xs, ours, {.label = "dissect::Linear", .width = 2, .dash = "6 4"})},
       .legend_left = true},
      {.title = "Distribution before and after the layer",
       .xlabel = "feature value",
       .ylabel = "count",
       .series = ex::histograms({xs, ours}, 30,
                                {{.label = "input x"}, {.label = "output y = Linear(x)"}}),
       .legend_left = true}};
  return ex::svg(panels, 1100, 420);
}

int run(dissect::examples::OutputFile& figure) {
  // The article's demo: one feature in, one out, x = linspace(−5, 5, 100), Kaiming init.
  Linear<double> layer(1, 1, {.init = dissect::InitScheme::kaiming_normal, .seed = 2024});
  layer.bias().fill(0.5);  // a visible offset (the article's bias starts at 0)
  Tensor<double, 2> x({100, 1});
  for (index_t i = 0; i < 100; ++i) x(i, 0) = -5.0 + 10.0 * double(i) / 99.0;

  const auto y = layer.forward(x);
  const auto y_by_hand = hand_written_linear(x, layer.weight(), layer.bias());
  std::cout << layer << "  W = " << layer.weight()(0, 0) << ", b = " << layer.bias()(0) << "\n";
  std::cout << "x " << dissect::format_shape(x.shape()) << " -> y "
            << dissect::format_shape(y.shape()) << "\n";
  std::cout << "max |hand-written - dissect::Linear| = " << max_abs_difference(y, y_by_hand)
            << "\n";
  if (figure.enabled()) {
    figure.write(draw_figure(x, y_by_hand, y));
    std::cout << "figure written to " << figure.path() << "\n";
  }

  // Backward on a wider layer, so the gradient shapes say something.
  Linear<double> wide(4, 3, {.seed = 7});
  Tensor<double, 2> inputs({5, 4}), upstream({5, 3});
  dissect::Generator generator(1);
  dissect::fill_uniform(inputs, -1, 1, generator);
  dissect::fill_uniform(upstream, -1, 1, generator);
  const auto dx = wide.backward(inputs, upstream);
  std::cout << "\n" << wide << "\n";
  std::cout << "backward: dx " << dissect::format_shape(dx.shape()) << "  dW "
            << dissect::format_shape(wide.weight_grad().shape()) << "  db "
            << dissect::format_shape(wide.bias_grad().shape()) << "\n";

  auto probe = inputs;
  const double dx_error =
      finite_difference_error(dx, probe.data(), [&] { return loss(wide, probe, upstream); });
  const double dw_error = finite_difference_error(wide.weight_grad(), wide.weight().data(),
                                                  [&] { return loss(wide, inputs, upstream); });
  const auto db = wide.bias_grad().reshape(dissect::Shape<2>{1, 3});
  const double db_error =
      finite_difference_error(db, wide.bias().data(), [&] { return loss(wide, inputs, upstream); });
  std::cout << std::scientific << std::setprecision(2)
            << "finite differences (h = 1e-5): max error dx " << dx_error << ", dW " << dw_error
            << ", db " << db_error << "\n";
  const bool ok =
      max_abs_difference(y, y_by_hand) == 0 && std::max({dx_error, dw_error, db_error}) < 1e-8;
  std::cout << (ok ? "OK: the layer is y = x·Wᵀ + b, and its gradients are right\n" : "MISMATCH\n");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return dissect::examples::figure_example_main(argc, argv, "linear_basics", kDescription, run);
}
