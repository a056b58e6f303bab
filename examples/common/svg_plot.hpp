// examples/common/svg_plot.hpp — a small SVG plot writer for the example programs.
//
// NOT part of the dissect library and not installed: it exists so that the examples can show
// training curves and weight histograms without pulling a plotting stack into a header-only
// linear-algebra project. It covers exactly what the examples draw — line plots, overlaid
// histograms, bar charts, panels side by side — in the spirit of matplotlib's defaults.
//
//   Figure fig(960, 400, 1, 2);
//   fig.panel(0, 0).title("loss").xlabel("step").line(steps, loss, {.label = "train"});
//   fig.panel(0, 1).histogram({w0, w1}, 60, {{.label = "layer 0"}, {.label = "layer 1"}});
//   fig.save("out.svg");
//
// Non-finite values never reach the SVG: they break a line, and are left out of histograms.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <fstream>
#include <limits>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace dissect::examples {

/// matplotlib's tab10, so figures look familiar next to Python ones.
inline constexpr std::array<std::string_view, 10> kTab10 = {
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

/// An empty colour takes the next one of the panel's tab10 cycle. `dash` is an SVG
/// stroke-dasharray such as "6 3"; empty means solid.
struct LineStyle {
  std::string label{};
  std::string color{};
  double width = 1.5;
  std::string dash{};
};

struct HistStyle {
  std::string label{};
  std::string color{};
  double alpha = 0.5;
};

struct BarStyle {
  std::string label{};
  std::string color{};
};

enum class LegendPos { automatic, top_right, top_left, bottom_right, bottom_left, hidden };

/// Tick positions: every multiple of `step` inside the range, `step` being 1, 2 or 5 × 10^k.
struct Ticks {
  double step = 1;
  std::vector<double> values;
};

/// Bins shared by several samples: `bins` equal bins over [lo, hi], the joint range of the
/// finite values; counts[s][b] is how many values of sample s fall in bin b.
struct HistogramCounts {
  double lo = 0;
  double hi = 1;
  std::vector<std::vector<std::size_t>> counts;
};

namespace detail {

// 1-2-5 steps are kept as mantissa × 10^exponent so tick values can be computed as exact
// decimal fractions (3 / 10 rather than 3 × 0.1, which prints as 0.30000000000000004).
struct NiceStep {
  int mantissa = 1;  // 1, 2 or 5
  int exponent = 0;
  double value() const { return mantissa * std::pow(10.0, exponent); }
  double multiple(double k) const {
    return exponent >= 0 ? k * mantissa * std::pow(10.0, exponent)
                         : k * mantissa / std::pow(10.0, -exponent);
  }
  NiceStep larger() const {
    if (mantissa == 1) return {2, exponent};
    if (mantissa == 2) return {5, exponent};
    return {1, exponent + 1};
  }
  NiceStep smaller() const {
    if (mantissa == 5) return {2, exponent};
    if (mantissa == 2) return {1, exponent};
    return {5, exponent - 1};
  }
};

// Nearest in log space, so a raw step of 2.2 becomes 2 rather than 5.
inline NiceStep nice_step_near(double raw) {
  const int e = static_cast<int>(std::floor(std::log10(raw)));
  const double f = raw / std::pow(10.0, e);
  if (f < std::sqrt(2.0)) return {1, e};
  if (f < std::sqrt(10.0)) return {2, e};
  if (f < std::sqrt(50.0)) return {5, e};
  return {1, e + 1};
}

inline std::vector<double> multiples_in(double lo, double hi, NiceStep step) {
  const double s = step.value();
  // The slack admits an end point that is a multiple up to rounding.
  const double k0 = std::ceil(lo / s - 1e-9);
  const double k1 = std::floor(hi / s + 1e-9);
  std::vector<double> out;
  for (double k = k0; k <= k1 && out.size() < 1000; k += 1) out.push_back(step.multiple(k));
  return out;
}

// A zero-width range (a constant series) still needs an axis; widen it around the value.
inline std::pair<double, double> widen_if_flat(double lo, double hi) {
  if (hi < lo) std::swap(lo, hi);
  const double scale = std::max(std::abs(lo), std::abs(hi));
  if (hi - lo <= 1e-12 * scale || hi == lo) {
    const double d = scale > 0 ? 0.1 * scale : 1.0;
    return {lo - d, hi + d};
  }
  return {lo, hi};
}

inline Ticks make_ticks(double lo, double hi, NiceStep step) {
  return {step.value(), multiples_in(lo, hi, step)};
}

inline NiceStep nice_step_for(double lo, double hi, int target) {
  target = std::max(target, 2);
  // Divided first so that ranges near ±DBL_MAX do not overflow.
  NiceStep step = nice_step_near(hi / target - lo / target);
  while (multiples_in(lo, hi, step).size() < 2) step = step.smaller();
  return step;
}

// ---- text -------------------------------------------------------------------------------------

// Decodes one UTF-8 sequence at s[i]; returns the code point and its byte length, or
// {U+FFFD, 1} for a malformed byte so that callers always make progress.
inline std::pair<char32_t, std::size_t> decode_utf8(std::string_view s, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  if (c < 0x80) return {c, 1};
  std::size_t len = 0;
  char32_t cp = 0;
  char32_t min = 0;
  if ((c & 0xE0) == 0xC0) {
    len = 2, cp = c & 0x1F, min = 0x80;
  } else if ((c & 0xF0) == 0xE0) {
    len = 3, cp = c & 0x0F, min = 0x800;
  } else if ((c & 0xF8) == 0xF0) {
    len = 4, cp = c & 0x07, min = 0x10000;
  } else {
    return {0xFFFD, 1};
  }
  if (i + len > s.size()) return {0xFFFD, 1};
  for (std::size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return {0xFFFD, 1};
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  // Overlong forms, surrogates and out-of-range values are not valid UTF-8.
  if (cp < min || (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) return {0xFFFD, 1};
  return {cp, len};
}

/// Text made safe for XML content and attribute values: markup characters escaped, malformed
/// UTF-8 replaced by U+FFFD, and control characters (not allowed in XML 1.0) dropped.
inline std::string escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    const auto [cp, len] = decode_utf8(s, i);
    switch (cp) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&apos;";
        break;
      default:
        if (cp < 0x20 && cp != '\t' && cp != '\n' && cp != '\r') break;
        if (cp == 0xFFFD && len == 1) {
          out += "\xEF\xBF\xBD";
        } else {
          out.append(s.substr(i, len));
        }
    }
    i += len;
  }
  return out;
}

// East Asian wide characters take a full em; everything else is counted as DejaVu Sans'
// average advance. Only layout uses this, so being a little off costs a few pixels.
inline bool is_wide(char32_t cp) {
  return (cp >= 0x1100 && cp <= 0x115F) || (cp >= 0x2E80 && cp <= 0xA4CF) ||
         (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0xF900 && cp <= 0xFAFF) ||
         (cp >= 0xFE30 && cp <= 0xFE4F) || (cp >= 0xFF00 && cp <= 0xFF60) ||
         (cp >= 0xFFE0 && cp <= 0xFFE6) || (cp >= 0x20000 && cp <= 0x3FFFD);
}

inline double text_width(std::string_view s, double font_size) {
  double em = 0;
  for (std::size_t i = 0; i < s.size();) {
    const auto [cp, len] = decode_utf8(s, i);
    i += len;
    if (cp == ' ') {
      em += 0.32;
    } else if (cp == 'i' || cp == 'l' || cp == 'j' || cp == '.' || cp == ',' || cp == ':') {
      em += 0.3;
    } else if (is_wide(cp)) {
      em += 1.0;
    } else {
      em += 0.62;
    }
  }
  return em * font_size;
}

// Coordinates with two decimals are finer than any renderer needs; the clamp keeps absurd but
// finite values (1e300 mapped to pixels) from reaching the renderer.
inline std::string num(double v) {
  if (!std::isfinite(v)) v = 0;  // a last line of defence: "nan" would break the whole file
  v = std::clamp(v, -1e6, 1e6);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  std::string s = buf;
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  if (s == "-0") s = "0";
  return s;
}

// Plain decimals for ordinary magnitudes, 2.5e−7 style outside them, always with as many
// digits as the step needs and no more. The minus sign is U+2212, as matplotlib prints it.
inline std::string format_tick(double v, double step, double max_abs) {
  if (v == 0) return "0";
  const int step_exp = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  const int mag_exp =
      max_abs > 0 ? static_cast<int>(std::floor(std::log10(max_abs) + 1e-9)) : step_exp;
  char buf[64];
  std::string s;
  if (mag_exp >= 6 || mag_exp <= -4) {
    const int digits = std::clamp(mag_exp - step_exp, 0, 15);
    std::snprintf(buf, sizeof buf, "%.*e", digits, v);
    std::string mantissa = buf;
    const std::size_t e = mantissa.find('e');
    const int exponent = std::stoi(mantissa.substr(e + 1));
    mantissa.resize(e);
    if (mantissa.find('.') != std::string::npos) {
      while (mantissa.back() == '0') mantissa.pop_back();
      if (mantissa.back() == '.') mantissa.pop_back();
    }
    s = mantissa + "e" + (exponent < 0 ? "-" : "") + std::to_string(std::abs(exponent));
  } else {
    std::snprintf(buf, sizeof buf, "%.*f", std::clamp(-step_exp, 0, 15), v);
    s = buf;
  }
  std::string out;
  for (char c : s) {
    if (c == '-') {
      out += "\xE2\x88\x92";
    } else {
      out += c;
    }
  }
  return out;
}

// ---- legend placement -------------------------------------------------------------------------

// A coarse map of which parts of the plot area hold data, so the legend can go to the corner
// where it hides the least.
class Occupancy {
 public:
  Occupancy(double x0, double y0, double w, double h)
      : x0_(x0),
        y0_(y0),
        nx_(std::max(1, static_cast<int>(w / kCell) + 1)),
        ny_(std::max(1, static_cast<int>(h / kCell) + 1)),
        cells_(nx_ * ny_, 0) {}

  void mark_point(double x, double y) {
    const int cx = static_cast<int>(std::floor((x - x0_) / kCell));
    const int cy = static_cast<int>(std::floor((y - y0_) / kCell));
    if (cx >= 0 && cx < nx_ && cy >= 0 && cy < ny_) cells_[cy * nx_ + cx] = 1;
  }
  void mark_segment(double xa, double ya, double xb, double yb) {
    const double len = std::hypot(xb - xa, yb - ya);
    const int n = std::clamp(static_cast<int>(len / (kCell / 2)), 1, 4000);
    for (int i = 0; i <= n; ++i) {
      const double t = static_cast<double>(i) / n;
      mark_point(xa + t * (xb - xa), ya + t * (yb - ya));
    }
  }
  void mark_rect(double xa, double ya, double xb, double yb) {
    for (double y = std::min(ya, yb); y <= std::max(ya, yb); y += kCell / 2) {
      for (double x = std::min(xa, xb); x <= std::max(xa, xb); x += kCell / 2) mark_point(x, y);
    }
  }
  int count(double xa, double ya, double xb, double yb) const {
    int n = 0;
    for (int cy = 0; cy < ny_; ++cy) {
      for (int cx = 0; cx < nx_; ++cx) {
        const double x = x0_ + (cx + 0.5) * kCell;
        const double y = y0_ + (cy + 0.5) * kCell;
        if (x >= xa && x <= xb && y >= ya && y <= yb) n += cells_[cy * nx_ + cx];
      }
    }
    return n;
  }

 private:
  static constexpr double kCell = 4;
  double x0_, y0_;
  int nx_, ny_;
  std::vector<unsigned char> cells_;
};

}  // namespace detail

/// Ticks at a 1-2-5 step giving about `target` of them inside [lo, hi] (bounds in either order;
/// a zero-width range is widened around its value, a non-finite one replaced by [0, 1]).
inline Ticks nice_ticks(double lo, double hi, int target = 5) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  std::tie(lo, hi) = detail::widen_if_flat(lo, hi);
  return detail::make_ticks(lo, hi, detail::nice_step_for(lo, hi, target));
}

/// Bins every sample over their joint range, so overlaid histograms can be compared bin by bin.
/// Non-finite values are left out; the maximum falls in the last bin.
inline HistogramCounts histogram_counts(const std::vector<std::span<const double>>& samples,
                                        int bins) {
  if (bins < 1) throw std::invalid_argument("histogram_counts: bins must be >= 1");
  HistogramCounts h;
  bool any = false;
  for (const auto& s : samples) {
    for (double v : s) {
      if (!std::isfinite(v)) continue;
      h.lo = any ? std::min(h.lo, v) : v;
      h.hi = any ? std::max(h.hi, v) : v;
      any = true;
    }
  }
  if (!any) h.lo = 0, h.hi = 1;
  std::tie(h.lo, h.hi) = detail::widen_if_flat(h.lo, h.hi);
  const double width = (h.hi - h.lo) / bins;
  for (const auto& s : samples) {
    std::vector<std::size_t> c(static_cast<std::size_t>(bins), 0);
    for (double v : s) {
      if (!std::isfinite(v)) continue;
      const auto b = static_cast<long long>(std::floor((v - h.lo) / width));
      ++c[static_cast<std::size_t>(std::clamp(b, 0LL, static_cast<long long>(bins) - 1))];
    }
    h.counts.push_back(std::move(c));
  }
  return h;
}

class Figure;

/// One set of axes. Setters return *this so a panel can be described in one expression.
class Panel {
 public:
  Panel& title(std::string text) { return title_ = std::move(text), *this; }
  Panel& xlabel(std::string text) { return xlabel_ = std::move(text), *this; }
  Panel& ylabel(std::string text) { return ylabel_ = std::move(text), *this; }
  /// Fixed axis limits instead of the data's, in either order.
  Panel& xlim(double lo, double hi) { return xlim_ = finite_limits("xlim", lo, hi), *this; }
  Panel& ylim(double lo, double hi) { return ylim_ = finite_limits("ylim", lo, hi), *this; }
  Panel& legend(LegendPos pos) { return legend_ = pos, *this; }

  /// A polyline through (xs[i], ys[i]); a non-finite coordinate breaks it.
  Panel& line(std::span<const double> xs, std::span<const double> ys, LineStyle style = {}) {
    if (xs.size() != ys.size()) {
      throw std::invalid_argument("Panel::line: " + std::to_string(xs.size()) + " x values but " +
                                  std::to_string(ys.size()) + " y values");
    }
    series_.push_back({.kind = Kind::line,
                       .label = std::move(style.label),
                       .color = pick_color(style.color),
                       .width = style.width,
                       .dash = std::move(style.dash),
                       .xs = {xs.begin(), xs.end()},
                       .ys = {ys.begin(), ys.end()}});
    return *this;
  }

  /// ys against 0, 1, 2, … — the usual shape of a per-step loss curve.
  Panel& line(std::span<const double> ys, LineStyle style = {}) {
    std::vector<double> xs(ys.size());
    for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<double>(i);
    return line(xs, ys, std::move(style));
  }

  /// Overlaid histograms of several samples over shared bins; styles[i] goes with samples[i].
  Panel& histogram(const std::vector<std::span<const double>>& samples, int bins,
                   const std::vector<HistStyle>& styles = {}) {
    const HistogramCounts h = histogram_counts(samples, bins);
    std::vector<double> edges(static_cast<std::size_t>(bins) + 1);
    for (std::size_t i = 0; i < edges.size(); ++i) {
      edges[i] = h.lo + (h.hi - h.lo) * static_cast<double>(i) / bins;
    }
    for (std::size_t k = 0; k < samples.size(); ++k) {
      const HistStyle st = k < styles.size() ? styles[k] : HistStyle{};
      std::vector<double> counts(h.counts[k].begin(), h.counts[k].end());
      series_.push_back({.kind = Kind::hist,
                         .label = st.label,
                         .color = pick_color(st.color),
                         .alpha = st.alpha,
                         .xs = edges,
                         .ys = std::move(counts)});
    }
    return *this;
  }

  /// One bar per category; several calls on a panel give grouped bars. Lines drawn on the same
  /// panel use the category index as x.
  Panel& bars(std::vector<std::string> names, std::span<const double> values, BarStyle style = {}) {
    if (names.size() != values.size()) {
      throw std::invalid_argument("Panel::bars: " + std::to_string(names.size()) + " names but " +
                                  std::to_string(values.size()) + " values");
    }
    if (categories_.empty()) categories_ = std::move(names);
    if (categories_.size() != values.size()) {
      throw std::invalid_argument("Panel::bars: this panel has " +
                                  std::to_string(categories_.size()) + " categories, not " +
                                  std::to_string(values.size()));
    }
    series_.push_back({.kind = Kind::bar,
                       .label = std::move(style.label),
                       .color = pick_color(style.color),
                       .ys = {values.begin(), values.end()}});
    return *this;
  }

 private:
  friend class Figure;
  enum class Kind { line, hist, bar };
  // For a histogram xs holds the bin edges and ys the counts; for bars only ys is used.
  struct Series {
    Kind kind = Kind::line;
    std::string label{};
    std::string color{};
    double width = 1;
    std::string dash{};
    double alpha = 1;
    std::vector<double> xs{};
    std::vector<double> ys{};
  };
  struct Range {
    double lo, hi;
  };
  struct Axes {
    double px, py, pw, ph;  // plot area in pixels
    Range x, y;
    double sx(double v) const { return px + (v - x.lo) / (x.hi - x.lo) * pw; }
    double sy(double v) const { return py + ph - (v - y.lo) / (y.hi - y.lo) * ph; }
  };

  static constexpr double kTickFont = 11;
  static constexpr double kLabelFont = 12.5;
  static constexpr double kTitleFont = 14;
  static constexpr double kLegendFont = 11.5;
  static constexpr double kTickLen = 4;

  static std::pair<double, double> finite_limits(const char* what, double lo, double hi) {
    if (!std::isfinite(lo) || !std::isfinite(hi)) {
      throw std::invalid_argument(std::string("Panel::") + what + ": limits must be finite");
    }
    return {lo, hi};
  }

  std::string pick_color(const std::string& requested) {
    if (!requested.empty()) return requested;
    return std::string(kTab10[next_color_++ % kTab10.size()]);
  }

  // Data limits grown by 5% like matplotlib's margins, except at zero for bars and
  // histograms: their baseline sits on the axis.
  std::pair<Range, Range> data_ranges() const {
    constexpr double inf = std::numeric_limits<double>::infinity();
    double xlo = inf, xhi = -inf, ylo = inf, yhi = -inf;
    bool sticky_zero = false;
    const auto grow = [](double v, double& lo, double& hi) {
      if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
    };
    for (const Series& s : series_) {
      if (s.kind == Kind::line) {
        for (std::size_t i = 0; i < s.xs.size(); ++i) {
          if (!std::isfinite(s.xs[i]) || !std::isfinite(s.ys[i])) continue;
          grow(s.xs[i], xlo, xhi);
          grow(s.ys[i], ylo, yhi);
        }
      } else {
        sticky_zero = true;
        grow(0, ylo, yhi);
        for (double v : s.ys) grow(v, ylo, yhi);
        if (s.kind == Kind::hist) grow(s.xs.front(), xlo, xhi), grow(s.xs.back(), xlo, xhi);
      }
    }
    const auto pad = [](double& lo, double& hi, bool keep_zero) {
      if (!(lo <= hi)) lo = 0, hi = 1;
      std::tie(lo, hi) = detail::widen_if_flat(lo, hi);
      const double m = 0.05 * (hi - lo);
      if (!(keep_zero && lo == 0)) lo -= m;
      if (!(keep_zero && hi == 0)) hi += m;
    };
    pad(xlo, xhi, false);
    pad(ylo, yhi, sticky_zero);
    if (!categories_.empty()) {
      xlo = -0.6;
      xhi = static_cast<double>(categories_.size()) - 0.4;
    }
    Range x{xlo, xhi}, y{ylo, yhi};
    if (xlim_) std::tie(x.lo, x.hi) = detail::widen_if_flat(xlim_->first, xlim_->second);
    if (ylim_) std::tie(y.lo, y.hi) = detail::widen_if_flat(ylim_->first, ylim_->second);
    return {x, y};
  }

  std::vector<std::string> tick_labels(const Ticks& t) const {
    double max_abs = 0;
    for (double v : t.values) max_abs = std::max(max_abs, std::abs(v));
    std::vector<std::string> out;
    for (double v : t.values) out.push_back(detail::format_tick(v, t.step, max_abs));
    return out;
  }

  // Smallest step whose labels leave a gap between neighbours along the x axis.
  Ticks x_ticks(Range r, double pixels) const {
    detail::NiceStep step =
        detail::nice_step_for(r.lo, r.hi, std::clamp(static_cast<int>(pixels / 90), 3, 9));
    for (int guard = 0; guard < 8; ++guard) {
      const Ticks t = detail::make_ticks(r.lo, r.hi, step);
      double widest = 0;
      for (const auto& s : tick_labels(t)) {
        widest = std::max(widest, detail::text_width(s, kTickFont));
      }
      if (t.values.size() < 3 || widest + 10 <= t.step / (r.hi - r.lo) * pixels) return t;
      step = step.larger();
    }
    return detail::make_ticks(r.lo, r.hi, step);
  }

  void render(std::string& out, double cx, double cy, double cw, double ch,
              const std::string& id) const;
  void render_legend(std::string& out, const Axes& a, const detail::Occupancy& occ) const;

  std::string title_, xlabel_, ylabel_;
  std::optional<std::pair<double, double>> xlim_, ylim_;
  LegendPos legend_ = LegendPos::automatic;
  std::vector<Series> series_;
  std::vector<std::string> categories_;
  std::size_t next_color_ = 0;
};

/// A grid of panels in one SVG, like matplotlib's plt.subplots(rows, cols).
class Figure {
 public:
  Figure(double width = 640, double height = 420, int rows = 1, int cols = 1)
      : width_(width), height_(height), rows_(rows), cols_(cols) {
    if (!(width > 0 && height > 0) || rows < 1 || cols < 1) {
      throw std::invalid_argument("Figure: needs a positive size and at least one panel");
    }
    panels_.resize(static_cast<std::size_t>(rows) * static_cast<std::size_t>(cols));
  }

  Panel& panel(int row = 0, int col = 0) {
    if (row < 0 || row >= rows_ || col < 0 || col >= cols_) {
      throw std::out_of_range("Figure::panel(" + std::to_string(row) + ", " + std::to_string(col) +
                              ") outside a " + std::to_string(rows_) + "x" + std::to_string(cols_) +
                              " figure");
    }
    return panels_[static_cast<std::size_t>(row * cols_ + col)];
  }

  /// A title over all panels (matplotlib's suptitle).
  Figure& title(std::string text) { return title_ = std::move(text), *this; }

  std::string svg() const {
    using detail::num;
    std::string out;
    out += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
    out += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + num(width_) + "\" height=\"" +
           num(height_) + "\" viewBox=\"0 0 " + num(width_) + " " + num(height_) +
           "\" font-family=\"DejaVu Sans, Noto Sans CJK SC, sans-serif\">\n";
    out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
    double top = 0;
    if (!title_.empty()) {
      top = 32;
      out += "<text x=\"" + num(width_ / 2) +
             "\" y=\"22\" font-size=\"16\" font-weight=\"bold\" text-anchor=\"middle\">" +
             detail::escape(title_) + "</text>\n";
    }
    const double cw = width_ / cols_;
    const double ch = (height_ - top) / rows_;
    for (int r = 0; r < rows_; ++r) {
      for (int c = 0; c < cols_; ++c) {
        panels_[static_cast<std::size_t>(r * cols_ + c)].render(
            out, c * cw, top + r * ch, cw, ch, "p" + std::to_string(r) + "_" + std::to_string(c));
      }
    }
    out += "</svg>\n";
    return out;
  }

  void save(const std::string& path) const {
    std::ofstream file(path, std::ios::binary);
    if (file) file << svg();
    file.close();
    if (!file) throw std::runtime_error("Figure::save: cannot write '" + path + "'");
  }

 private:
  double width_, height_;
  int rows_, cols_;
  std::string title_;
  std::vector<Panel> panels_;
};

inline void Panel::render(std::string& out, double cx, double cy, double cw, double ch,
                          const std::string& id) const {
  using detail::escape;
  using detail::num;
  const auto [xr, yr] = data_ranges();
  const bool categorical = !categories_.empty();

  // Margins depend on the tick labels and the labels on the plot size; a second round
  // repairs the first round's guesses.
  const double top = 10 + (title_.empty() ? 4 : kTitleFont + 10);
  double left = 40, bottom = 30, right = 16;
  Ticks xt, yt;
  std::vector<std::string> xlab, ylab;
  double label_angle = 0;  // category labels turn when they do not fit side by side
  for (int round = 0; round < 2; ++round) {
    const double pw = std::max(cw - left - right, 10.0);
    const double ph = std::max(ch - top - bottom, 10.0);
    yt = detail::make_ticks(
        yr.lo, yr.hi,
        detail::nice_step_for(yr.lo, yr.hi, std::clamp(static_cast<int>(ph / 55), 3, 8)));
    ylab = tick_labels(yt);
    double widest_y = 0;
    for (const auto& s : ylab) widest_y = std::max(widest_y, detail::text_width(s, kTickFont));
    left = 8 + (ylabel_.empty() ? 0 : kLabelFont + 8) + widest_y + kTickLen + 4;

    double label_height = kTickFont;
    if (categorical) {
      xlab = categories_;
      xt.values.clear();
      for (std::size_t i = 0; i < xlab.size(); ++i) xt.values.push_back(static_cast<double>(i));
      double widest = 0;
      for (const auto& s : xlab) widest = std::max(widest, detail::text_width(s, kTickFont));
      const double slot = pw / static_cast<double>(xlab.size());
      label_angle = widest + 6 > slot ? 35 : 0;
      if (label_angle > 0) {
        const double rad = label_angle * 3.14159265358979 / 180;
        label_height = widest * std::sin(rad) + kTickFont * std::cos(rad);
      }
    } else {
      xt = x_ticks(xr, pw);
      xlab = tick_labels(xt);
      // The last label is centred on its tick and may stick out past the frame.
      if (!xlab.empty()) right = std::max(16.0, detail::text_width(xlab.back(), kTickFont) / 2 + 6);
    }
    bottom = 8 + kTickLen + 4 + label_height + (xlabel_.empty() ? 0 : kLabelFont + 10);
  }
  const double pw = std::max(cw - left - right, 10.0), ph = std::max(ch - top - bottom, 10.0);
  const Axes a{cx + left, cy + top, pw, ph, xr, yr};
  const auto inside = [](double v, Range r) {
    const double eps = 1e-9 * (r.hi - r.lo);
    return v >= r.lo - eps && v <= r.hi + eps;
  };

  out += "<g>\n<defs><clipPath id=\"" + id + "\"><rect x=\"" + num(a.px) + "\" y=\"" + num(a.py) +
         "\" width=\"" + num(a.pw) + "\" height=\"" + num(a.ph) + "\"/></clipPath></defs>\n";

  // Grid first so that data is drawn over it.
  out += "<g stroke=\"#e6e6e6\" stroke-width=\"1\">\n";
  if (!categorical) {
    for (double v : xt.values) {
      if (!inside(v, xr)) continue;
      out += "<line x1=\"" + num(a.sx(v)) + "\" y1=\"" + num(a.py) + "\" x2=\"" + num(a.sx(v)) +
             "\" y2=\"" + num(a.py + a.ph) + "\"/>\n";
    }
  }
  for (double v : yt.values) {
    if (!inside(v, yr)) continue;
    out += "<line x1=\"" + num(a.px) + "\" y1=\"" + num(a.sy(v)) + "\" x2=\"" + num(a.px + a.pw) +
           "\" y2=\"" + num(a.sy(v)) + "\"/>\n";
  }
  out += "</g>\n";

  detail::Occupancy occ(a.px, a.py, a.pw, a.ph);
  std::size_t bar_count = 0;
  for (const Series& s : series_) bar_count += s.kind == Kind::bar;
  std::size_t bar_index = 0;

  out += "<g clip-path=\"url(#" + id + ")\">\n";
  for (const Series& s : series_) {
    if (s.kind == Kind::line) {
      std::string d;
      bool pen_down = false;
      double lx = 0, ly = 0;
      for (std::size_t i = 0; i < s.xs.size(); ++i) {
        if (!std::isfinite(s.xs[i]) || !std::isfinite(s.ys[i])) {
          pen_down = false;
          continue;
        }
        const double x = a.sx(s.xs[i]);
        const double y = a.sy(s.ys[i]);
        // "h0" keeps a lone point between gaps visible as a dot of the line's round cap.
        d += (pen_down ? "L" : "M") + num(x) + " " + num(y) + (pen_down ? "" : "h0");
        if (pen_down) occ.mark_segment(lx, ly, x, y);
        occ.mark_point(x, y);
        pen_down = true;
        lx = x, ly = y;
      }
      if (d.empty()) continue;
      out += "<path fill=\"none\" stroke=\"" + escape(s.color) + "\" stroke-width=\"" +
             num(s.width) + "\" stroke-linejoin=\"round\" stroke-linecap=\"" +
             (s.dash.empty() ? "round" : "butt") + "\"";
      if (!s.dash.empty()) out += " stroke-dasharray=\"" + escape(s.dash) + "\"";
      out += " d=\"" + d + "\"/>\n";
    } else if (s.kind == Kind::hist) {
      // One outline per sample: a step polygon reads better than many touching rectangles
      // when samples overlap.
      const double base = a.sy(std::max(0.0, yr.lo));
      std::string d = "M" + num(a.sx(s.xs.front())) + " " + num(base);
      for (std::size_t b = 0; b < s.ys.size(); ++b) {
        const double top_y = a.sy(s.ys[b]);
        d += "L" + num(a.sx(s.xs[b])) + " " + num(top_y) + "L" + num(a.sx(s.xs[b + 1])) + " " +
             num(top_y);
        occ.mark_rect(a.sx(s.xs[b]), top_y, a.sx(s.xs[b + 1]), base);
      }
      d += "L" + num(a.sx(s.xs.back())) + " " + num(base) + "Z";
      out += "<path fill=\"" + escape(s.color) + "\" fill-opacity=\"" + num(s.alpha) +
             "\" stroke=\"" + escape(s.color) +
             "\" stroke-width=\"1\" stroke-linejoin=\"round\" d=\"" + d + "\"/>\n";
    } else {
      const double group = 0.8;
      const double w = group / static_cast<double>(bar_count);
      for (std::size_t i = 0; i < s.ys.size(); ++i) {
        if (!std::isfinite(s.ys[i])) continue;
        const double x0 = static_cast<double>(i) - group / 2 + w * static_cast<double>(bar_index);
        const double xa = a.sx(x0), xb = a.sx(x0 + w);
        const double ya = a.sy(std::max(s.ys[i], 0.0)), yb = a.sy(std::min(s.ys[i], 0.0));
        occ.mark_rect(xa, ya, xb, yb);
        out += "<rect x=\"" + num(xa) + "\" y=\"" + num(ya) + "\" width=\"" + num(xb - xa) +
               "\" height=\"" + num(yb - ya) + "\" fill=\"" + escape(s.color) + "\"/>\n";
      }
      ++bar_index;
    }
  }
  out += "</g>\n";

  out += "<rect x=\"" + num(a.px) + "\" y=\"" + num(a.py) + "\" width=\"" + num(a.pw) +
         "\" height=\"" + num(a.ph) + "\" fill=\"none\" stroke=\"#333\" stroke-width=\"1\"/>\n";

  // Ticks and their labels.
  out += "<g font-size=\"" + num(kTickFont) + "\" fill=\"#222\">\n";
  const double xlabel_y = a.py + a.ph + kTickLen + 3 + kTickFont;
  for (std::size_t i = 0; i < xt.values.size(); ++i) {
    const double v = xt.values[i];
    if (!inside(v, xr)) continue;
    const double x = a.sx(v);
    out += "<line x1=\"" + num(x) + "\" y1=\"" + num(a.py + a.ph) + "\" x2=\"" + num(x) +
           "\" y2=\"" + num(a.py + a.ph + kTickLen) + "\" stroke=\"#333\"/>\n";
    if (label_angle > 0) {
      out += "<text x=\"" + num(x) + "\" y=\"" + num(xlabel_y) +
             "\" text-anchor=\"end\" transform=\"rotate(-" + num(label_angle) + " " + num(x) + " " +
             num(xlabel_y - kTickFont / 2) + ")\">" + escape(xlab[i]) + "</text>\n";
    } else {
      out += "<text x=\"" + num(x) + "\" y=\"" + num(xlabel_y) + "\" text-anchor=\"middle\">" +
             escape(xlab[i]) + "</text>\n";
    }
  }
  for (std::size_t i = 0; i < yt.values.size(); ++i) {
    const double v = yt.values[i];
    if (!inside(v, yr)) continue;
    const double y = a.sy(v);
    out += "<line x1=\"" + num(a.px - kTickLen) + "\" y1=\"" + num(y) + "\" x2=\"" + num(a.px) +
           "\" y2=\"" + num(y) + "\" stroke=\"#333\"/>\n";
    // 0.35 em below the tick puts the middle of the digits on it.
    out += "<text x=\"" + num(a.px - kTickLen - 3) + "\" y=\"" + num(y + 0.35 * kTickFont) +
           "\" text-anchor=\"end\">" + escape(ylab[i]) + "</text>\n";
  }
  out += "</g>\n";

  if (!title_.empty()) {
    out += "<text x=\"" + num(a.px + a.pw / 2) + "\" y=\"" + num(cy + 10 + kTitleFont) +
           "\" font-size=\"" + num(kTitleFont) + "\" text-anchor=\"middle\">" + escape(title_) +
           "</text>\n";
  }
  if (!xlabel_.empty()) {
    out += "<text x=\"" + num(a.px + a.pw / 2) + "\" y=\"" + num(cy + ch - 8) + "\" font-size=\"" +
           num(kLabelFont) + "\" text-anchor=\"middle\">" + escape(xlabel_) + "</text>\n";
  }
  if (!ylabel_.empty()) {
    const double x = cx + 8 + kLabelFont;
    const double y = a.py + a.ph / 2;
    out += "<text transform=\"translate(" + num(x) + " " + num(y) + ") rotate(-90)\" font-size=\"" +
           num(kLabelFont) + "\" text-anchor=\"middle\">" + escape(ylabel_) + "</text>\n";
  }
  render_legend(out, a, occ);
  out += "</g>\n";
}

inline void Panel::render_legend(std::string& out, const Axes& a,
                                 const detail::Occupancy& occ) const {
  using detail::escape;
  using detail::num;
  if (legend_ == LegendPos::hidden) return;
  std::vector<const Series*> entries;
  double widest = 0;
  for (const Series& s : series_) {
    if (s.label.empty()) continue;
    entries.push_back(&s);
    widest = std::max(widest, detail::text_width(s.label, kLegendFont));
  }
  if (entries.empty()) return;

  const double row = kLegendFont + 7, pad = 6, swatch = 22, inset = 8;
  const double w = pad + swatch + 6 + widest + pad;
  const double h = pad + row * static_cast<double>(entries.size()) + pad - 4;
  const double left = a.px + inset, right = a.px + a.pw - inset - w;
  const double upper = a.py + inset, lower = a.py + a.ph - inset - h;
  const double centre_x = a.px + (a.pw - w) / 2, centre_y = a.py + (a.ph - h) / 2;
  // Places in order of preference, corners first as in matplotlib's loc="best"; a later one
  // wins only if it hides less data.
  const std::array<std::pair<double, double>, 9> corners = {{{right, upper},
                                                             {left, upper},
                                                             {right, lower},
                                                             {left, lower},
                                                             {right, centre_y},
                                                             {left, centre_y},
                                                             {centre_x, upper},
                                                             {centre_x, lower},
                                                             {centre_x, centre_y}}};
  std::size_t pick = 0;
  switch (legend_) {
    case LegendPos::top_left:
      pick = 1;
      break;
    case LegendPos::bottom_right:
      pick = 2;
      break;
    case LegendPos::bottom_left:
      pick = 3;
      break;
    case LegendPos::automatic: {
      int best = -1;
      for (std::size_t k = 0; k < corners.size(); ++k) {
        const auto [x, y] = corners[k];
        const int cost = occ.count(x, y, x + w, y + h);
        if (best < 0 || cost < best) best = cost, pick = k;
      }
      break;
    }
    default:
      break;
  }
  const auto [x, y] = corners[pick];
  out += "<g font-size=\"" + num(kLegendFont) + "\">\n";
  out += "<rect x=\"" + num(x) + "\" y=\"" + num(y) + "\" width=\"" + num(w) + "\" height=\"" +
         num(h) +
         "\" rx=\"3\" fill=\"white\" fill-opacity=\"0.85\" stroke=\"#ccc\" stroke-width=\"1\"/>\n";
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Series& s = *entries[i];
    const double mid = y + pad + row * (static_cast<double>(i) + 0.5) - 2;
    const double sx = x + pad;
    if (s.kind == Kind::line) {
      out += "<line x1=\"" + num(sx) + "\" y1=\"" + num(mid) + "\" x2=\"" + num(sx + swatch) +
             "\" y2=\"" + num(mid) + "\" stroke=\"" + escape(s.color) + "\" stroke-width=\"" +
             num(s.width) + "\"";
      if (!s.dash.empty()) out += " stroke-dasharray=\"" + escape(s.dash) + "\"";
      out += "/>\n";
    } else {
      const double opacity = s.kind == Kind::hist ? s.alpha : 1.0;
      out += "<rect x=\"" + num(sx + 3) + "\" y=\"" + num(mid - 5) + "\" width=\"" +
             num(swatch - 6) + "\" height=\"10\" fill=\"" + escape(s.color) + "\" fill-opacity=\"" +
             num(opacity) + "\" stroke=\"" + escape(s.color) + "\"/>\n";
    }
    out += "<text x=\"" + num(sx + swatch + 6) + "\" y=\"" + num(mid + 0.35 * kLegendFont) +
           "\" fill=\"#222\">" + escape(s.label) + "</text>\n";
  }
  out += "</g>\n";
}

}  // namespace dissect::examples
