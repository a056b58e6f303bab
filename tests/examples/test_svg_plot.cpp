// Tests for the examples' SVG plot writer. The pictures themselves were checked by eye; these
// pin down what a viewer would choke on (malformed XML, "nan" coordinates) and the arithmetic
// behind the axes.
#include "common/svg_plot.hpp"

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace {

using dissect::examples::histograms;
using dissect::examples::line;
using dissect::examples::nice_ticks;
using dissect::examples::Panel;
using dissect::examples::Series;
using dissect::examples::svg;

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Enough of an XML checker for our own output: tags nest and close, attribute values are
// quoted and free of '<', and every '&' starts a known entity. Returns "" or the first problem.
std::string xml_problem(const std::string& doc) {
  std::vector<std::string> open;
  const auto entity_ok = [&](std::size_t i) {
    for (const char* e : {"&amp;", "&lt;", "&gt;", "&quot;", "&apos;"}) {
      if (doc.compare(i, std::char_traits<char>::length(e), e) == 0) return true;
    }
    return false;
  };
  std::size_t roots = 0;
  for (std::size_t i = 0; i < doc.size();) {
    if (doc[i] == '&' && !entity_ok(i)) return "bare & at " + std::to_string(i);
    if (doc[i] == '>') return "bare > at " + std::to_string(i);
    if (doc[i] != '<') {
      ++i;
      continue;
    }
    if (doc.compare(i, 2, "<?") == 0) {
      const std::size_t end = doc.find("?>", i);
      if (end == std::string::npos) return "unterminated <?";
      i = end + 2;
      continue;
    }
    const bool closing = doc[i + 1] == '/';
    std::size_t j = i + (closing ? 2 : 1);
    std::string name;
    while (j < doc.size() && (std::isalnum(static_cast<unsigned char>(doc[j])) || doc[j] == '-'))
      name += doc[j++];
    if (name.empty()) return "tag without a name at " + std::to_string(i);
    // Walk the attributes, honouring quotes, up to the end of the tag.
    char quote = 0;
    for (; j < doc.size(); ++j) {
      const char c = doc[j];
      if (quote) {
        if (c == quote) quote = 0;
        if (c == '<') return "< inside an attribute at " + std::to_string(j);
        if (c == '&' && !entity_ok(j)) return "bare & in an attribute at " + std::to_string(j);
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '>') {
        break;
      }
    }
    if (j >= doc.size()) return "unterminated tag " + name;
    const bool self_closing = doc[j - 1] == '/';
    if (closing) {
      if (open.empty() || open.back() != name) return "</" + name + "> closes nothing";
      open.pop_back();
    } else if (!self_closing) {
      if (open.empty()) ++roots;
      open.push_back(name);
    } else if (open.empty()) {
      ++roots;
    }
    i = j + 1;
  }
  if (!open.empty()) return "<" + open.back() + "> never closed";
  if (roots != 1) return std::to_string(roots) + " root elements";
  return "";
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t i = text.find(what); i != std::string::npos; i = text.find(what, i + 1)) ++n;
  return n;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::vector<double> normal_samples(std::size_t n, double sigma, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> dist(0.0, sigma);
  std::vector<double> out(n);
  for (double& v : out) v = dist(rng);
  return out;
}

std::string busy_figure() {
  std::vector<Panel> panels(3);
  const std::vector<double> xs = {0, 1, 2, 3}, ys = {1, 4, 9, 16};
  panels[0] = {.title = "lines",
               .xlabel = "x",
               .ylabel = "y",
               .series = {line(xs, ys, {.label = "squares"})}};
  const auto a = normal_samples(500, 1.0, 1), b = normal_samples(500, 2.0, 2);
  panels[1].series = histograms({a, b}, 20, {{.label = "σ=1"}, {.label = "σ=2"}});
  const std::vector<double> v = {3, -1, 2};
  panels[2].series = {line(v, v, {.label = "score", .dash = "6 4"})};
  return svg(panels, 900, 360, "三个面板 & <friends>");
}

/// A figure of one panel holding `series`.
std::string one_panel(std::vector<Series> series, bool legend_left = false) {
  return svg(std::vector{Panel{.series = std::move(series), .legend_left = legend_left}}, 400, 300);
}

/// The sum of a histogram outline's counts: ys is 0, c0, c0, c1, c1, …, 0.
double total(const Series& outline) {
  double sum = 0;
  for (std::size_t i = 1; i + 1 < outline.ys.size(); i += 2) sum += outline.ys[i];
  return sum;
}

TEST(SvgPlot, OutputIsWellFormedXml) {
  const std::string svg = busy_figure();
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(svg.rfind("<?xml", 0), 0u);
  EXPECT_EQ(count(svg, "<svg"), 1u);
  EXPECT_EQ(count(svg, "</svg>"), 1u);
  EXPECT_EQ(svg.substr(svg.size() - 7), "</svg>\n");
  EXPECT_EQ(count(svg, "<text"), count(svg, "</text>"));
}

TEST(SvgPlot, CheckerCatchesBrokenXml) {
  EXPECT_NE(xml_problem("<svg><g></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>a < b</text></svg>"), "");
  EXPECT_NE(xml_problem("<svg><text>a & b</text></svg>"), "");
  EXPECT_EQ(xml_problem("<svg><text>a &lt; b</text></svg>"), "");
}

TEST(SvgPlot, LegendLabelsArePresentAndEscaped) {
  const std::vector<double> xs = {0, 1}, ys = {0, 1};
  const std::string svg =
      one_panel({line(xs, ys, {.label = "a<b & \"c\" 'd'"}), line(xs, ys, {.label = "训练损失"})});
  EXPECT_NE(svg.find(">a&lt;b &amp; &quot;c&quot; &apos;d&apos;</text>"), std::string::npos);
  EXPECT_EQ(svg.find("a<b"), std::string::npos);
  EXPECT_NE(svg.find(">训练损失</text>"), std::string::npos);
  EXPECT_EQ(xml_problem(svg), "");

  const std::string fig_svg = busy_figure();
  for (const char* label :
       {">squares<", ">σ=1<", ">σ=2<", ">score<", "三个面板 &amp; &lt;friends&gt;"})
    EXPECT_NE(fig_svg.find(label), std::string::npos) << label;
}

TEST(SvgPlot, DefaultColoursFollowTab10) {
  const std::vector<double> xs = {0, 1}, ys = {0, 1};
  const std::string svg = one_panel({line(xs, ys), line(xs, ys, {.color = "black"}), line(xs, ys)});
  const auto first = svg.find("#1f77b4"), second = svg.find("#ff7f0e");
  EXPECT_NE(first, std::string::npos);
  EXPECT_NE(second, std::string::npos);
  EXPECT_LT(first, second);
  EXPECT_NE(svg.find("stroke=\"black\""), std::string::npos);
}

TEST(SvgPlot, ControlCharactersAreDroppedAndUtf8Kept) {
  EXPECT_EQ(dissect::examples::detail::escape("a\x01"
                                              "b\tc"),
            "ab\tc");
  EXPECT_EQ(dissect::examples::detail::escape("中文 ok"), "中文 ok");
}

// Mantissa of a 1-2-5 step, or 0 if the step is not one.
int mantissa(double step) {
  const double m = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
  for (int c : {1, 2, 5, 10}) {
    if (std::abs(m - c) < 1e-6 * c) return c == 10 ? 1 : c;
  }
  return 0;
}

TEST(NiceTicks, UseOneTwoFiveStepsThatCoverTheRange) {
  const std::vector<std::pair<double, double>> ranges = {
      {0, 1},         {-5, 5},        {-5.5, 5.5},     {0, 1000},       {-1234, -2.5},
      {1e-9, 3e-9},   {1e-4, 1.7e-4}, {-1e-12, 1e-12}, {1e6, 5e7},      {0.1, 0.9},
      {-0.003, 0.07}, {7, 7.3},       {1, 1 + 1e-9},   {-1e300, 1e300}, {42, 17}};
  for (const auto& [lo, hi] : ranges) {
    for (int target : {3, 5, 8}) {
      SCOPED_TRACE(std::to_string(lo) + " .. " + std::to_string(hi) + " target " +
                   std::to_string(target));
      const auto t = nice_ticks(lo, hi, target);
      const double a = std::min(lo, hi), b = std::max(lo, hi);
      ASSERT_GE(t.values.size(), 2u);
      EXPECT_LE(t.values.size(), static_cast<std::size_t>(2 * target + 2));
      EXPECT_NE(mantissa(t.step), 0) << t.step;
      const double eps = 1e-9 * t.step;
      EXPECT_GE(t.values.front(), a - eps);
      EXPECT_LE(t.values.back(), b + eps);
      // Covering: no stretch of the range longer than one step goes without a tick.
      EXPECT_LT(t.values.front() - a, t.step + eps);
      EXPECT_LT(b - t.values.back(), t.step + eps);
      for (std::size_t i = 1; i < t.values.size(); ++i)
        EXPECT_NEAR(t.values[i] - t.values[i - 1], t.step, 1e-6 * t.step);
      for (double v : t.values) {
        const double k = v / t.step;
        EXPECT_NEAR(k, std::round(k), 1e-6 * std::max(1.0, std::abs(k)));
      }
    }
  }
}

TEST(NiceTicks, DegenerateRanges) {
  for (double v : {0.0, 3.0, -2e-7, 1e9}) {
    const auto t = nice_ticks(v, v);
    EXPECT_GE(t.values.size(), 2u) << v;
    EXPECT_LE(t.values.front(), v);
    EXPECT_GE(t.values.back(), v);
  }
  const auto t = nice_ticks(kNaN, 1);
  EXPECT_GE(t.values.size(), 2u);
  for (double v : t.values) EXPECT_TRUE(std::isfinite(v));
}

TEST(NiceTicks, LabelsPrintDecimalsExactly) {
  using dissect::examples::detail::tick_labels;
  const auto t = nice_ticks(0, 1, 10);
  ASSERT_EQ(t.values.size(), 11u);
  EXPECT_EQ(tick_labels(t)[3], "0.3");
  EXPECT_EQ(tick_labels({0.5, {-2.5}})[0],
            "\xE2\x88\x92"
            "2.5");  // U+2212 minus
  EXPECT_EQ(tick_labels({200, {1200}})[0], "1200");
  EXPECT_EQ(tick_labels({0.5, {-0.0}})[0], "0");  // no "−0" on the axis
}

TEST(Histogram, CountsSumToTheSampleCount) {
  const auto a = normal_samples(10000, 1.0, 7), b = normal_samples(3333, 4.0, 8);
  for (int bins : {1, 7, 50}) {
    const auto h = histograms({a, b}, bins);
    ASSERT_EQ(h.size(), 2u);
    EXPECT_EQ(h[0].xs.size(), 2 * static_cast<std::size_t>(bins) + 2);
    EXPECT_EQ(total(h[0]), static_cast<double>(a.size()));
    EXPECT_EQ(total(h[1]), static_cast<double>(b.size()));
    EXPECT_LE(h[1].xs.front(), *std::min_element(b.begin(), b.end()));
    EXPECT_GE(h[1].xs.back(), *std::max_element(b.begin(), b.end()));
  }
}

TEST(Histogram, SkipsNonFiniteValuesAndHandlesConstants) {
  const std::vector<double> s = {1, kNaN, 2, std::numeric_limits<double>::infinity(), 3};
  const auto h = histograms({s}, 4);
  EXPECT_EQ(total(h[0]), 3);
  EXPECT_EQ(h[0].xs.front(), 1);
  EXPECT_EQ(h[0].xs.back(), 3);

  const std::vector<double> flat(10, 5.0);
  const auto f = histograms({flat}, 3);
  EXPECT_LT(f[0].xs.front(), 5);
  EXPECT_GT(f[0].xs.back(), 5);
  EXPECT_EQ(total(f[0]), 10);
  EXPECT_THROW(histograms({flat}, 0), std::invalid_argument);
}

TEST(SvgPlot, NonFiniteValuesNeverReachTheSvg) {
  const std::vector<double> xs = {0, 1, 2, 3, 4, 5, 6};
  const std::vector<double> ys = {1, 2, kNaN, 4, std::numeric_limits<double>::infinity(), 6, 7};
  const std::vector<double> s = {kNaN, 1, 2, 2, 3, -std::numeric_limits<double>::infinity()};
  const std::string svg =
      dissect::examples::svg(std::vector<Panel>{{.series = {line(xs, ys, {.label = "gappy"})}},
                                                {.series = histograms({s}, 5, {{.label = "h"}})}},
                             800, 300);
  EXPECT_EQ(lower(svg).find("nan"), std::string::npos);
  EXPECT_EQ(lower(svg).find("inf"), std::string::npos);
  EXPECT_EQ(xml_problem(svg), "");
  // Three finite runs: {0,1}, {3}, {5,6}.
  const auto path = svg.find("stroke-width=\"1.5\" stroke-linejoin");
  ASSERT_NE(path, std::string::npos);
  const auto d =
      svg.substr(svg.find(" d=\"", path), svg.find("/>", path) - svg.find(" d=\"", path));
  EXPECT_EQ(count(d, "M"), 3u);
}

TEST(SvgPlot, DegenerateSeriesStillDrawAxes) {
  const std::vector<double> none;
  const std::vector<double> xs = {0, 1, 2}, flat = {3, 3, 3}, all_nan = {kNaN, kNaN, kNaN};
  const std::string svg = dissect::examples::svg(
      std::vector<Panel>{{.series = {line(none, none, {.label = "empty"})}},
                         {.series = {line(xs, flat, {.label = "flat"})}},
                         {.series = {line(xs, all_nan, {.label = "nothing"})}}},
      900, 300);
  EXPECT_EQ(xml_problem(svg), "");
  EXPECT_EQ(lower(svg).find("nan"), std::string::npos);
  EXPECT_EQ(count(svg, "fill=\"none\" stroke=\"#333\""), 3u);  // each panel's frame
  EXPECT_NE(svg.find(">flat</text>"), std::string::npos);
  EXPECT_NE(svg.find(">3.0</text>"), std::string::npos);  // the flat value gets a tick label
}

// Pixel position of the legend box: the only rect with rx in our output.
std::pair<double, double> legend_xy(const std::string& svg) {
  const auto at = svg.find("rx=\"3\"");
  const auto start = svg.rfind("<rect", at);
  const auto x = svg.find("x=\"", start) + 3, y = svg.find("y=\"", start) + 3;
  return {std::stod(svg.substr(x)), std::stod(svg.substr(y))};
}

TEST(SvgPlot, LegendGoesToTheCornerAsked) {
  const std::vector<double> xs = {0, 1}, up = {0, 1};
  const auto [lx, ly] = legend_xy(one_panel({line(xs, up, {.label = "up"})}, true));
  const auto [rx, ry] = legend_xy(one_panel({line(xs, up, {.label = "up"})}));
  EXPECT_LT(lx, 200);  // left when asked
  EXPECT_GT(rx, 200);  // right by default
  EXPECT_LT(ly, 100);  // both at the top
  EXPECT_LT(ry, 100);
}

TEST(SvgPlot, BadArgumentsThrow) {
  const std::vector<double> two = {1, 2}, three = {1, 2, 3};
  EXPECT_THROW(line(two, three), std::invalid_argument);
  EXPECT_THROW(one_panel({Series{.xs = two, .ys = three}}), std::invalid_argument);
  EXPECT_THROW(svg(std::vector<Panel>{}, 400, 300), std::invalid_argument);
  EXPECT_THROW(svg(std::vector<Panel>(1), 0, 100), std::invalid_argument);
}

}  // namespace
