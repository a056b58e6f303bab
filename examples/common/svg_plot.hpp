// examples/common/svg_plot.hpp — the SVG figures of the example programs.
//
// NOT part of the dissect library and not installed. It draws what the examples' figures need
// and no more: a row of panels holding lines and overlaid histograms, with 1-2-5 ticks, labels
// and a legend. Non-finite values never reach the SVG: they break a line, and are left out of
// histograms. Use: `file << svg({Panel{.title = "loss", .series = {line(x, y)}}}, 640, 420);`.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace dissect::examples {

/// matplotlib's tab10, so figures look familiar next to Python ones.
inline constexpr std::array<const char*, 10> kTab10 = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728",
                                                       "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                                                       "#bcbd22", "#17becf"};

/// How a series is drawn. An empty colour takes the next one of the panel's tab10 cycle; `dash`
/// is an SVG stroke-dasharray such as "6 3" (lines), `alpha` the fill's opacity (histograms).
struct Style {
  std::string label{}, color{};
  double width = 1.5;
  std::string dash{};
  double alpha = 0.5;
};

/// A polyline through (xs[i], ys[i]), broken where a coordinate is not finite; a filled one is
/// closed and shaded (a histogram's outline, from y = 0 back to y = 0).
struct Series {
  Style style{};
  std::vector<double> xs{}, ys{};
  bool filled = false;
};

/// One set of axes. The legend sits top right unless `legend_left`: no rule can know which
/// corner the reader needs.
struct Panel {
  std::string title{}, xlabel{}, ylabel{};
  std::vector<Series> series{};
  bool legend_left = false;
};

/// Tick positions: every multiple of `step` inside the range, `step` being 1, 2 or 5 × 10^k.
struct Ticks {
  double step = 1;
  std::vector<double> values;
};

namespace detail {

// Makes [lo, hi] a range an axis can show: [0, 1] if a bound is not finite (no data), the
// bounds in order, and a zero-width range (a constant series) widened around its value.
inline void widen_if_flat(double& lo, double& hi) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (hi < lo) std::swap(lo, hi);
  const double scale = std::max(std::abs(lo), std::abs(hi)), d = scale > 0 ? 0.1 * scale : 1.0;
  if (hi - lo <= 1e-12 * scale) lo -= d, hi += d;
}

/// Text made safe for XML content and attribute values: markup characters escaped, and the
/// control characters XML 1.0 does not allow dropped.
inline std::string escape(std::string_view s) {
  std::string out;
  for (char c : s) {
    const auto k = std::string_view("&<>\"'").find(c);
    const bool allowed = static_cast<unsigned char>(c) >= 0x20 || c == '\t' || c == '\n';
    if (k != std::string_view::npos)
      out += std::array{"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}[k];
    if (k == std::string_view::npos && allowed) out += c;
  }
  return out;
}

// Two decimals are finer than any renderer needs; the clamp keeps absurd but finite values
// (1e300 mapped to pixels) from the renderer, and "nan" would break the whole file.
inline std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", std::isfinite(v) ? std::clamp(v, -1e6, 1e6) : 0.0);
  std::string s = buf;
  s.erase(s.find_last_not_of('0') + 1);
  if (s.back() == '.') s.pop_back();
  return s == "-0" ? "0" : s;
}

/// The labels of `t`: as many decimals as the step needs (0.3, not 0.30000000000000004), and
/// matplotlib's minus sign, U+2212.
inline std::vector<std::string> tick_labels(const Ticks& t) {
  const int decimals = std::clamp(-static_cast<int>(std::floor(std::log10(t.step) + 1e-9)), 0, 15);
  std::vector<std::string> labels;
  for (double v : t.values) {
    char buf[64];
    // + 0.0 turns the -0.0 that ceil() gives just below zero into 0, printed without a sign.
    std::snprintf(buf, sizeof buf, "%.*f", v == 0 ? 0 : decimals, v + 0.0);
    auto& label = labels.emplace_back(buf);
    if (label[0] == '-') label.replace(0, 1, "\xE2\x88\x92");
  }
  return labels;
}

/// ` name="value"` for each pair, numbers through num() and text through escape().
template <class Value, class... Rest>
std::string attrs(const char* name, const Value& value, const Rest&... rest) {
  std::string out = " " + std::string(name) + "=\"";
  if constexpr (std::is_arithmetic_v<Value>) out += num(static_cast<double>(value));
  if constexpr (!std::is_arithmetic_v<Value>) out += escape(value);
  if constexpr (sizeof...(Rest) > 0) return out + "\"" + attrs(rest...);
  return out + "\"";
}

template <class... Attrs>
std::string element(const char* name, const Attrs&... a) {
  return "<" + std::string(name) + attrs(a...) + "/>\n";
}

/// <text …>content</text>, anchored at (x, y).
template <class... Attrs>
std::string text(std::string_view content, double x, double y, const char* anchor,
                 const Attrs&... a) {
  return "<text" + attrs("x", x, "y", y, "text-anchor", anchor, a...) + ">" + escape(content) +
         "</text>\n";
}

inline std::string stroke(const Style& s) {
  return attrs("stroke", s.color, "stroke-width", s.width, "stroke-linejoin", "round") +
         (s.dash.empty() ? attrs("stroke-linecap", "round")
                         : attrs("stroke-linecap", "butt", "stroke-dasharray", s.dash));
}

// Layout only: DejaVu Sans' average advance, 0.62 em a character, is close enough to size
// margins and the legend box. UTF-8 continuation bytes are not characters.
inline double text_width(std::string_view s, double font_size) {
  return 0.62 * font_size * static_cast<double>(std::count_if(s.begin(), s.end(), [](char c) {
           return (c & 0xC0) != 0x80;
         }));
}

}  // namespace detail

/// Ticks at a 1-2-5 step giving about `target` of them inside [lo, hi] (bounds in either order;
/// a zero-width range is widened around its value, a non-finite one replaced by [0, 1]).
inline Ticks nice_ticks(double lo, double hi, int target = 5) {
  detail::widen_if_flat(lo, hi);
  target = std::max(target, 2);
  // Divided before subtracting so that ranges near ±DBL_MAX do not overflow; the 1-2-5 step
  // nearest in log space, so a raw step of 2.2 becomes 2 rather than 5.
  const double raw = hi / target - lo / target;
  double power = std::pow(10.0, std::floor(std::log10(raw)));
  const double f = raw / power;
  int mantissa = f < std::sqrt(2.0) ? 1 : f < std::sqrt(10.0) ? 2 : f < std::sqrt(50.0) ? 5 : 10;
  if (mantissa == 10) mantissa = 1, power *= 10;
  Ticks t;
  while (t.values.size() < 2) {  // too short a range for two multiples: step down 5 → 2 → 1
    t.step = mantissa * power;
    t.values.clear();
    // The slack admits an end point that is a multiple up to rounding.
    const double last = std::floor(hi / t.step + 1e-9);
    for (double k = std::ceil(lo / t.step - 1e-9); k <= last && t.values.size() < 1000; ++k) {
      t.values.push_back(k * t.step);
    }
    if (mantissa == 1) power /= 10;
    mantissa = mantissa == 1 ? 5 : mantissa == 5 ? 2 : 1;
  }
  return t;
}

/// A line through (xs[i], ys[i]). @throws std::invalid_argument if the sizes differ.
inline Series line(std::span<const double> xs, std::span<const double> ys, Style style = {}) {
  if (xs.size() != ys.size()) {
    throw std::invalid_argument("line: " + std::to_string(xs.size()) + " x values but " +
                                std::to_string(ys.size()) + " y values");
  }
  return {std::move(style), {xs.begin(), xs.end()}, {ys.begin(), ys.end()}};
}

/// Overlaid histograms of several samples over shared bins, styles[i] going with samples[i]:
/// `bins` equal bins over the joint range of the finite values (the maximum falls in the last),
/// so that they compare bin by bin. Each is one filled step outline, xs the bin edges and ys
/// the counts (0, c0, c0, c1, c1, …, 0), which reads better than touching bars.
inline std::vector<Series> histograms(const std::vector<std::span<const double>>& samples, int bins,
                                      const std::vector<Style>& styles = {}) {
  if (bins < 1) throw std::invalid_argument("histograms: bins must be >= 1");
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const auto& sample : samples) {
    for (double v : sample) {
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    }
  }
  detail::widen_if_flat(lo, hi);  // no finite value leaves lo = inf, hi = −inf: [0, 1]
  const auto edge = [&](int i) { return lo + (hi - lo) * i / bins; };
  std::vector<Series> out;
  for (std::size_t k = 0; k < samples.size(); ++k) {
    std::vector<double> counts(static_cast<std::size_t>(bins));
    for (double v : samples[k]) {
      const double b = std::floor((v - lo) / (hi - lo) * bins);
      if (std::isfinite(v)) counts[static_cast<std::size_t>(std::clamp(b, 0.0, bins - 1.0))] += 1;
    }
    Series& s =
        out.emplace_back(Series{k < styles.size() ? styles[k] : Style{}, {edge(0)}, {0}, true});
    for (int b = 0; b < bins; ++b) {
      s.xs.insert(s.xs.end(), {edge(b), edge(b + 1)});
      s.ys.insert(s.ys.end(), 2, counts[static_cast<std::size_t>(b)]);
    }
    s.xs.push_back(edge(bins)), s.ys.push_back(0);
  }
  return out;
}

namespace detail {

constexpr double kTick = 11, kLabel = 12.5, kTitle = 14, kLegend = 11.5;

/// Appends `panel`, drawn into the cell at (cx, cy) of size cw × ch, to `out`.
inline void render(std::string& out, Panel panel, double cx, double cy, double cw, double ch) {
  std::size_t next_color = 0;
  for (Series& s : panel.series) {
    if (s.style.color.empty()) s.style.color = kTab10[next_color++ % kTab10.size()];
    if (s.xs.size() != s.ys.size()) line(s.xs, s.ys);  // throws: a Series built by hand
  }
  // Data limits grown by 5 % like matplotlib's margins, except below histograms: their
  // baseline, y = 0, sits on the axis.
  std::vector<double> xs, ys;  // every finite point
  for (const Series& s : panel.series) {
    for (std::size_t i = 0; i < s.ys.size(); ++i) {
      if (std::isfinite(s.xs[i]) && std::isfinite(s.ys[i]))
        xs.push_back(s.xs[i]), ys.push_back(s.ys[i]);
    }
  }
  const auto range = [](const std::vector<double>& v, bool keep_zero) {
    const auto [min, max] = std::minmax_element(v.begin(), v.end());
    double lo = v.empty() ? NAN : *min, hi = v.empty() ? NAN : *max;
    widen_if_flat(lo, hi);
    return std::pair(keep_zero ? lo : lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo));
  };
  const bool baseline = std::any_of(panel.series.begin(), panel.series.end(),
                                    [](const Series& s) { return s.filled; });
  // Plain variables, not structured bindings: clang 14 cannot capture those in the lambdas below.
  const auto x_range = range(xs, false);
  const auto y_range = range(ys, baseline);
  const double x_lo = x_range.first, x_hi = x_range.second;
  const double y_lo = y_range.first, y_hi = y_range.second;
  // The left margin depends on the widest y tick label, which depends on the plot's height.
  const double py = cy + (panel.title.empty() ? 14 : 24 + kTitle);
  const double ph = std::max(cy + ch - py - 27 - (panel.xlabel.empty() ? 0 : kLabel + 10), 10.0);
  const Ticks yt = nice_ticks(y_lo, y_hi, std::clamp(static_cast<int>(ph / 55), 3, 8));
  const auto ylab = tick_labels(yt);
  double widest = 0;
  for (const auto& s : ylab) widest = std::max(widest, text_width(s, kTick));
  const double px = cx + 16 + (panel.ylabel.empty() ? 0 : kLabel + 8) + widest;
  const double pw = std::max(cx + cw - px - 16, 10.0);
  const Ticks xt = nice_ticks(x_lo, x_hi, std::clamp(static_cast<int>(pw / 90), 3, 9));
  const auto xlab = tick_labels(xt);
  const auto sx = [&](double v) { return px + (v - x_lo) / (x_hi - x_lo) * pw; };
  const auto sy = [&](double v) { return py + ph - (v - y_lo) / (y_hi - y_lo) * ph; };

  // Grid lines, tick marks and tick labels first, so that the data is drawn over the grid.
  // 0.35 em below a y tick puts the middle of the digits on it.
  out += "<g font-size=\"" + num(kTick) + "\" fill=\"#222\">\n";
  for (std::size_t i = 0; i < xt.values.size(); ++i) {
    const double x = sx(xt.values[i]), y = py + ph;
    out += element("line", "x1", x, "y1", py, "x2", x, "y2", y, "stroke", "#e6e6e6") +
           element("line", "x1", x, "y1", y, "x2", x, "y2", y + 4, "stroke", "#333") +
           text(xlab[i], x, y + 7 + kTick, "middle");
  }
  for (std::size_t i = 0; i < yt.values.size(); ++i) {
    const double y = sy(yt.values[i]);
    out += element("line", "x1", px, "y1", y, "x2", px + pw, "y2", y, "stroke", "#e6e6e6") +
           element("line", "x1", px - 4, "y1", y, "x2", px, "y2", y, "stroke", "#333") +
           text(ylab[i], px - 7, y + 0.35 * kTick, "end");
  }
  out += "</g>\n";

  for (const Series& s : panel.series) {
    std::string d;
    for (std::size_t i = 0, pen_down = 0; i < s.xs.size(); ++i) {
      pen_down = std::isfinite(s.xs[i]) && std::isfinite(s.ys[i]) ? pen_down + 1 : 0;
      // "h0" keeps a lone point between gaps visible as a dot of the line's round cap.
      if (pen_down)
        d += (pen_down > 1 ? "L" : "M") + num(sx(s.xs[i])) + " " + num(sy(s.ys[i])) +
             (pen_down > 1 ? "" : "h0");
    }
    if (s.filled) {
      out += element("path", "fill", s.style.color, "fill-opacity", s.style.alpha, "stroke",
                     s.style.color, "d", d + "Z");
    } else if (!d.empty()) {
      out += "<path" + attrs("fill", "none") + stroke(s.style) + attrs("d", d) + "/>\n";
    }
  }
  out += element("rect", "x", px, "y", py, "width", pw, "height", ph, "fill", "none", "stroke",
                 "#333");
  if (!panel.title.empty())
    out += text(panel.title, px + pw / 2, cy + 10 + kTitle, "middle", "font-size", kTitle);
  if (!panel.xlabel.empty())
    out += text(panel.xlabel, px + pw / 2, cy + ch - 8, "middle", "font-size", kLabel);
  if (!panel.ylabel.empty()) {
    const std::string turn =
        "translate(" + num(cx + 8 + kLabel) + " " + num(py + ph / 2) + ") rotate(-90)";
    out += text(panel.ylabel, 0, 0, "middle", "font-size", kLabel, "transform", turn);
  }

  std::erase_if(panel.series, [](const Series& s) { return s.style.label.empty(); });
  if (panel.series.empty()) return;
  widest = 0;
  for (const Series& s : panel.series)
    widest = std::max(widest, text_width(s.style.label, kLegend));
  const double row = kLegend + 7, w = 46 + widest,
               h = 8 + row * static_cast<double>(panel.series.size());
  const double x = panel.legend_left ? px + 8 : px + pw - 8 - w, y = py + 8;
  out += "<g font-size=\"" + num(kLegend) + "\">\n" +
         element("rect", "x", x, "y", y, "width", w, "height", h, "rx", 3, "fill", "white",
                 "fill-opacity", 0.85, "stroke", "#ccc");
  for (std::size_t i = 0; i < panel.series.size(); ++i) {
    const Style& s = panel.series[i].style;
    const double mid = y + 4 + row * (static_cast<double>(i) + 0.5), at = x + 6;
    // A histogram's swatch is a thick stroke in its fill.
    out += "<line" + attrs("x1", at, "y1", mid, "x2", at + 22, "y2", mid) +
           (panel.series[i].filled
                ? attrs("stroke", s.color, "stroke-width", 10, "stroke-opacity", s.alpha)
                : stroke(s)) +
           "/>\n";
    out += text(s.label, at + 28, mid + 0.35 * kLegend, "start", "fill", "#222");
  }
  out += "</g>\n";
}

}  // namespace detail

/// The SVG document of `panels` side by side, like matplotlib's plt.subplots(1, n), with
/// `title` over them all. @throws std::invalid_argument without panels or a positive size.
inline std::string svg(std::span<const Panel> panels, double width, double height,
                       std::string_view title = "") {
  if (panels.empty() || !(width > 0 && height > 0)) {
    throw std::invalid_argument("svg: needs a positive size and at least one panel");
  }
  std::string out =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg" +
      detail::attrs("xmlns", "http://www.w3.org/2000/svg", "width", width, "height", height,
                    "viewBox", "0 0 " + detail::num(width) + " " + detail::num(height),
                    "font-family", "DejaVu Sans, sans-serif") +
      ">\n<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  const double top = title.empty() ? 0 : 32, cw = width / static_cast<double>(panels.size());
  if (!title.empty())
    out += detail::text(title, width / 2, 22, "middle", "font-size", 16, "font-weight", "bold");
  for (std::size_t i = 0; i < panels.size(); ++i)
    detail::render(out, panels[i], cw * static_cast<double>(i), top, cw, height - top);
  return out + "</svg>\n";
}

}  // namespace dissect::examples
