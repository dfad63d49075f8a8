// The plot's axes and its SVG. Layout, top to bottom: the title, the legend
// (as many rows as the names need), then two rows of two panels. Every
// coordinate is written with one decimal through snprintf in the C locale,
// so the bytes depend on the input only.
#include "metrics/plot_svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <optional>
#include <utility>

#include "core/error.h"
#include "core/format.h"

namespace st::metrics {

namespace {

// ---- axes -------------------------------------------------------------------

// n x 10^e, exact for the integers and powers of ten a tick uses.
double scaled(int64_t n, int e) {
  return e >= 0 ? static_cast<double>(n) * std::pow(10.0, e) : static_cast<double>(n) / std::pow(10.0, -e);
}

// floor(log10(x)) for x > 0, robust to log10 rounding just below an integer.
int decade_of(double x) { return static_cast<int>(std::floor(std::log10(x) + 1e-9)); }

// How an axis writes its numbers, one style for all its ticks so that it
// reads "0 5k 10k", never "0 5000 10k".
enum class LabelStyle : uint8_t { Fixed, Si, Exponent };

// The SI prefix for numbers up to `max_abs` >= 1000: (1e3, "k"), (1e6, "M"), ...
std::pair<double, const char*> si_prefix(double max_abs) {
  constexpr std::pair<double, const char*> kSi[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
  return *std::find_if(std::begin(kSi), std::end(kSi), [&](const auto& p) { return max_abs >= p.first; });
}

// `spacing` 0: a log axis's ticks. Thousands and more read "12k" while one
// decimal after the prefix tells the ticks apart, else "150,010".
LabelStyle style_of(const Axis& axis, double spacing) {
  double max_abs = 0, min_abs = std::numeric_limits<double>::infinity();
  for (double t : axis.ticks) {
    max_abs = std::max(max_abs, std::fabs(t));
    if (t != 0) min_abs = std::min(min_abs, std::fabs(t));
  }
  if (max_abs >= 1e4) {
    const bool one_decimal = spacing == 0 || decade_of(si_prefix(max_abs).first) - decade_of(spacing) <= 1;
    return one_decimal ? LabelStyle::Si : LabelStyle::Fixed;
  }
  if (max_abs < 1e-2 || (axis.scale == AxisScale::Log && min_abs < 1e-2)) return LabelStyle::Exponent;
  return LabelStyle::Fixed;
}

// One tick's text, with the digits `spacing` (the distance to the next tick) needs.
std::string tick_label(double v, double spacing, LabelStyle style, double max_abs) {
  if (v == 0) return "0";
  char buf[64];
  if (style == LabelStyle::Si) {
    const auto [div, prefix] = si_prefix(max_abs);
    const int digits = std::clamp(decade_of(div) - decade_of(spacing), 0, 3);
    std::snprintf(buf, sizeof buf, "%.*f%s", digits, v / div, prefix);
  } else if (style == LabelStyle::Exponent) {
    int e = decade_of(std::fabs(v));
    const int digits = std::clamp(e - decade_of(spacing), 0, 3);
    double mantissa = v / std::pow(10.0, e);
    if (std::fabs(std::round(mantissa * std::pow(10.0, digits))) >= 10 * std::pow(10.0, digits)) {
      mantissa /= 10;  // 9.99e-4 printed as "10.0e-4" would read wrong
      ++e;
    }
    std::snprintf(buf, sizeof buf, "%.*fe%d", digits, mantissa, e);
  } else if (spacing >= 1 && std::fabs(v) >= 1e4) {
    return with_commas(std::llround(v));
  } else {
    std::snprintf(buf, sizeof buf, "%.*f", std::clamp(-decade_of(spacing), 0, 6), v);
  }
  return buf;
}

// Labels every tick; spacing 0 (a log axis's m x 10^k ticks) labels each to its own decade.
void label_ticks(Axis& axis, double spacing) {
  const LabelStyle style = style_of(axis, spacing);
  double max_abs = 0;
  for (double t : axis.ticks) max_abs = std::max(max_abs, std::fabs(t));
  for (double t : axis.ticks) {
    axis.labels.push_back(tick_label(t, spacing > 0 ? spacing : std::pow(10.0, decade_of(t)), style, max_abs));
  }
}

// Ticks m x 10^k within [lo, hi] for m in `mantissas`, every `every`-th decade.
std::vector<double> log_ticks(double lo, double hi, std::span<const int> mantissas, int every) {
  std::vector<double> ticks;
  for (int e = decade_of(lo); e <= decade_of(hi); ++e) {
    if (e % every != 0) continue;
    for (int m : mantissas) {
      const double t = scaled(m, e);
      if (t >= lo * (1 - 1e-12) && t <= hi * (1 + 1e-12)) ticks.push_back(t);
    }
  }
  return ticks;
}

}  // namespace

Axis linear_axis(double lo, double hi, int max_ticks) {
  ST_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo <= hi && max_ticks >= 2,
           "linear_axis: needs finite lo <= hi and max_ticks >= 2 (got {}, {}, {})", lo, hi, max_ticks);
  if (lo == hi) {
    const double pad = lo == 0 ? 1.0 : std::fabs(lo) * 0.1;
    lo -= pad;
    hi += pad;
  }
  // The spacing m x 10^e: the smallest of 1, 2, 5 x 10^e at least the even split...
  const double raw = (hi - lo) / (max_ticks - 1);
  int e = decade_of(raw);
  constexpr int kMantissas[] = {1, 2, 5, 10};
  int m = *std::find_if(std::begin(kMantissas), std::end(kMantissas),
                        [&](int c) { return scaled(c, e) >= raw * (1 - 1e-9); });
  int64_t k0 = 0, k1 = 0;
  for (;;) {
    if (m == 10) {
      m = 1;
      ++e;
    }
    const double spacing = scaled(m, e);
    k0 = static_cast<int64_t>(std::floor(lo / spacing + 1e-9));
    k1 = static_cast<int64_t>(std::ceil(hi / spacing - 1e-9));
    if (k1 - k0 + 1 <= max_ticks) break;
    m = m == 1 ? 2 : (m == 2 ? 5 : 10);  // ...and wider while whole ticks need more than max_ticks
  }
  Axis axis;
  for (int64_t k = k0; k <= k1; ++k) axis.ticks.push_back(scaled(k * m, e));
  axis.lo = axis.ticks.front();
  axis.hi = axis.ticks.back();
  label_ticks(axis, scaled(m, e));
  return axis;
}

Axis log_axis(double lo, double hi, int max_ticks) {
  ST_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo > 0 && lo <= hi && max_ticks >= 2,
           "log_axis: needs finite 0 < lo <= hi and max_ticks >= 2 (got {}, {}, {})", lo, hi, max_ticks);
  double l0 = std::log10(lo), l1 = std::log10(hi);
  if (l1 - l0 < 1e-6) {
    l0 -= 0.05;
    l1 += 0.05;
  }
  const double pad = 0.02 * (l1 - l0);
  Axis axis;
  axis.scale = AxisScale::Log;
  axis.lo = std::pow(10.0, l0 - pad);
  axis.hi = std::pow(10.0, l1 + pad);
  constexpr int kAll[] = {1, 2, 3, 4, 5, 6, 7, 8, 9}, kOneTwoFive[] = {1, 2, 5}, kOne[] = {1};
  const std::span<const int> sets[] = {kAll, kOneTwoFive, kOne};
  for (std::span<const int> set : sets) {
    axis.ticks = log_ticks(axis.lo, axis.hi, set, 1);
    if (static_cast<int>(axis.ticks.size()) <= max_ticks) break;
  }
  for (int every = 2; static_cast<int>(axis.ticks.size()) > max_ticks; ++every) {
    axis.ticks = log_ticks(axis.lo, axis.hi, kOne, every);
  }
  double spacing = 0;  // 0: each tick labelled to its own decade
  if (axis.ticks.size() < 3) {
    // Within a decade or so: the linear ticks read better.
    const Axis linear = linear_axis(lo, hi, max_ticks);
    axis.ticks.clear();
    for (double t : linear.ticks)
      if (t >= axis.lo && t <= axis.hi) axis.ticks.push_back(t);
    spacing = linear.ticks[1] - linear.ticks[0];
  }
  label_ticks(axis, spacing);
  return axis;
}

namespace {

// ---- the document -----------------------------------------------------------

constexpr double kWidth = 1000;
constexpr double kPanelWidth = kWidth / 2;
constexpr double kPanelHeight = 330;
constexpr double kTitleHeight = 34;
constexpr double kLegendRow = 20;
constexpr double kCharWidth = 6.6;  // of 12 px sans-serif, to lay out the legend
// Tableau's ten colours without the grey, which the axes use.
constexpr const char* kColours[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                    "#8c564b", "#e377c2", "#bcbd22", "#17becf"};
constexpr const char* kKeyColour = "#555555";

const char* colour_of(size_t run) { return kColours[run % std::size(kColours)]; }
// The first run widest, each later one narrower and drawn over it.
double width_of(size_t run) { return std::max(1.0, 4.0 / static_cast<double>(run + 1)); }

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return std::string(buf) == "-0.0" ? "0.0" : buf;
}

std::string xml_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

enum class Anchor : uint8_t { Start, Middle, End };

void text(std::string& svg, double x, double y, std::string_view s, double size, Anchor anchor,
          std::string_view extra = "") {
  constexpr const char* kAnchors[] = {"start", "middle", "end"};
  svg += format("<text x=\"{}\" y=\"{}\" font-size=\"{}\" text-anchor=\"{}\"{}>{}</text>\n", num(x), num(y), size,
                kAnchors[static_cast<int>(anchor)], extra, xml_escape(s));
}

void line(std::string& svg, double x1, double y1, double x2, double y2, std::string_view colour, double width,
          std::string_view dash = "") {
  svg += format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"{}\" stroke-width=\"{}\"{}/>\n", num(x1),
                num(y1), num(x2), num(y2), colour, num(width),
                dash.empty() ? std::string() : format(" stroke-dasharray=\"{}\"", dash));
}

void rect(std::string& svg, double x, double y, double w, double h, std::string_view fill,
          std::string_view stroke = "none") {
  svg += format("<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\" stroke=\"{}\"/>\n", num(x), num(y),
                num(w), num(h), fill, stroke);
}

// A panel's plot area and axes: data to pixels.
struct Frame {
  double left, top, right, bottom;
  Axis x, y;

  double px(double step) const { return left + (step - x.lo) / (x.hi - x.lo) * (right - left); }
  double py(double v) const {
    const double f = y.scale == AxisScale::Log
                         ? (std::log10(v) - std::log10(y.lo)) / (std::log10(y.hi) - std::log10(y.lo))
                         : (v - y.lo) / (y.hi - y.lo);
    return bottom - f * (bottom - top);
  }
};

using Point = std::pair<double, double>;  // (step, value)

// A run's finite values of one field, in step order.
std::vector<Point> points_of(const MetricsLog& log, double MetricsRecord::*field) {
  std::vector<Point> points;
  for (const MetricsRecord& r : log.records)
    if (std::isfinite(r.*field)) points.emplace_back(static_cast<double>(r.step), r.*field);
  return points;
}

// The points in pixels, at most four per pixel column (its first, lowest,
// highest and last), so a long run's path stays small and looks the same.
std::vector<Point> to_pixels(const std::vector<Point>& points, const Frame& f) {
  std::vector<Point> out;
  size_t begin = 0;
  while (begin < points.size()) {
    const double column = std::floor(f.px(points[begin].first));
    size_t end = begin, lo = begin, hi = begin;
    for (; end < points.size() && std::floor(f.px(points[end].first)) == column; ++end) {
      if (points[end].second < points[lo].second) lo = end;
      if (points[end].second > points[hi].second) hi = end;
    }
    size_t keep[] = {begin, lo, hi, end - 1};
    std::sort(std::begin(keep), std::end(keep));
    const size_t* last = std::unique(std::begin(keep), std::end(keep));
    for (const size_t* k = keep; k != last; ++k) out.emplace_back(f.px(points[*k].first), f.py(points[*k].second));
    begin = end;
  }
  return out;
}

void polyline(std::string& svg, const std::vector<Point>& pixels, std::string_view colour, double width,
              std::string_view dash = "") {
  if (pixels.empty()) return;
  std::string d;
  for (size_t i = 0; i < pixels.size(); ++i) d += (i ? " L" : "M") + num(pixels[i].first) + "," + num(pixels[i].second);
  // A single point still shows: a round cap on a zero-length segment.
  if (pixels.size() == 1) d += " l0,0";
  svg += format(
      "<path d=\"{}\" fill=\"none\" stroke=\"{}\" stroke-width=\"{}\" stroke-linejoin=\"round\" "
      "stroke-linecap=\"round\"{}/>\n",
      d, colour, num(width), dash.empty() ? std::string() : format(" stroke-dasharray=\"{}\"", dash));
}

// What a panel draws of each run: `field` as a line; `markers` (or nullptr)
// as squares joined by a dashed line; with `restarts`, a dotted vertical
// line at each restart.
struct PanelSpec {
  std::string title;
  double MetricsRecord::*field = nullptr;
  double MetricsRecord::*markers = nullptr;
  AxisScale scale = AxisScale::Linear;
  bool restarts = false;
};

// Magnitudes an axis can draw: its padding, tick spacing and decades stay
// finite and nonzero in double (1e308 would overflow them, 1e-320 underflow).
// Real metrics are far inside; beyond is a damaged file (fuzzing found it).
constexpr double kMaxDrawable = 1e200;
constexpr double kMinDrawable = 1e-200;

// The finite values of the panel's fields over every run, as (lowest, highest); nullopt when there are none.
// A nonzero value outside the drawable magnitudes is an error naming the run, the panel and the step.
std::optional<std::pair<double, double>> value_range(std::span<const PlotRun> runs, const PanelSpec& spec) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (const PlotRun& run : runs) {
    for (const MetricsRecord& r : run.log.records) {
      for (double MetricsRecord::*field : {spec.field, spec.markers}) {
        if (field == nullptr || !std::isfinite(r.*field)) continue;
        const double magnitude = std::fabs(r.*field);
        ST_CHECK(magnitude == 0 || (magnitude >= kMinDrawable && magnitude <= kMaxDrawable),
                 "run '{}': {} value {} at step {} cannot be drawn (magnitudes from {} to {} can; is the metrics file "
                 "damaged?)",
                 run.label, spec.title, r.*field, r.step, kMinDrawable, kMaxDrawable);
        lo = std::min(lo, r.*field);
        hi = std::max(hi, r.*field);
      }
    }
  }
  if (lo > hi) return std::nullopt;
  return std::make_pair(lo, hi);
}

// The frame's background, grid, ticks and labels (the curves go over them).
void draw_axes(std::string& svg, const Frame& f) {
  rect(svg, f.left, f.top, f.right - f.left, f.bottom - f.top, "#ffffff");
  for (size_t i = 0; i < f.x.ticks.size(); ++i) {
    const double x = f.px(f.x.ticks[i]);
    line(svg, x, f.top, x, f.bottom, "#e6e6e6", 1);
    line(svg, x, f.bottom, x, f.bottom + 4, "#555555", 1);
    text(svg, x, f.bottom + 16, f.x.labels[i], 11, Anchor::Middle);
  }
  for (size_t i = 0; i < f.y.ticks.size(); ++i) {
    const double y = f.py(f.y.ticks[i]);
    line(svg, f.left, y, f.right, y, "#e6e6e6", 1);
    line(svg, f.left - 4, y, f.left, y, "#555555", 1);
    text(svg, f.left - 7, y + 4, f.y.labels[i], 11, Anchor::End);
  }
  text(svg, (f.left + f.right) / 2, f.bottom + 32, "step", 12, Anchor::Middle);
}

// One run's curves in a panel.
void draw_run(std::string& svg, const Frame& f, const PanelSpec& spec, const PlotRun& run, size_t index) {
  const char* colour = colour_of(index);
  const double width = width_of(index);
  if (spec.restarts) {
    for (int64_t step : run.log.restarts) {
      const double x = f.px(static_cast<double>(step));
      line(svg, x, f.top, x, f.bottom, colour, 1, "2,3");
    }
  }
  polyline(svg, to_pixels(points_of(run.log, spec.field), f), colour, width);
  if (spec.markers == nullptr) return;
  const std::vector<Point> marks = to_pixels(points_of(run.log, spec.markers), f);
  polyline(svg, marks, colour, std::max(1.0, width - 1), "5,3");
  const double side = width + 3;
  for (const Point& p : marks) rect(svg, p.first - side / 2, p.second - side / 2, side, side, colour);
}

// A panel whose top-left corner is (x0, y0).
void draw_panel(std::string& svg, std::span<const PlotRun> runs, const Axis& steps, double x0, double y0,
                const PanelSpec& spec) {
  Frame f{x0 + 66, y0 + 28, x0 + kPanelWidth - 18, y0 + kPanelHeight - 42, steps, Axis{}};
  text(svg, f.left, y0 + 18, spec.title, 13, Anchor::Start, " font-weight=\"bold\"");
  const std::optional<std::pair<double, double>> range = value_range(runs, spec);
  if (!range) {
    f.y = linear_axis(0, 1, 2);
    draw_axes(svg, f);
    text(svg, (f.left + f.right) / 2, (f.top + f.bottom) / 2, "no data", 12, Anchor::Middle);
  } else {
    f.y =
        spec.scale == AxisScale::Log ? log_axis(range->first, range->second) : linear_axis(range->first, range->second);
    draw_axes(svg, f);
    for (size_t i = 0; i < runs.size(); ++i) draw_run(svg, f, spec, runs[i], i);
  }
  rect(svg, f.left, f.top, f.right - f.left, f.bottom - f.top, "none", "#999999");
}

// The step axis every panel shares.
Axis step_axis(std::span<const PlotRun> runs) {
  int64_t lo = std::numeric_limits<int64_t>::max(), hi = std::numeric_limits<int64_t>::min();
  for (const PlotRun& run : runs) {
    lo = std::min(lo, run.log.records.front().step);
    hi = std::max(hi, run.log.records.back().step);
  }
  // One step: a range of whole steps around it.
  // In double: lo - 1 and hi + 1 overflow int64_t at its ends.
  if (lo == hi) return linear_axis(static_cast<double>(lo) - 1, static_cast<double>(hi) + 1, 3);
  return linear_axis(static_cast<double>(lo), static_cast<double>(hi), 8);
}

// One legend entry: a run (its line), or the key to validation markers or restarts.
struct LegendEntry {
  enum class Kind : uint8_t { Run, Validation, Restart } kind;
  size_t run = 0;
  std::string label;
};

void draw_entry(std::string& svg, const LegendEntry& e, double x, double y) {
  switch (e.kind) {
    case LegendEntry::Kind::Run: line(svg, x, y - 4, x + 24, y - 4, colour_of(e.run), width_of(e.run)); break;
    case LegendEntry::Kind::Validation:
      line(svg, x, y - 4, x + 24, y - 4, kKeyColour, 1, "5,3");
      rect(svg, x + 9, y - 7, 6, 6, kKeyColour);
      break;
    case LegendEntry::Kind::Restart: line(svg, x + 12, y - 12, x + 12, y + 3, kKeyColour, 1, "2,3"); break;
  }
  text(svg, x + 30, y, e.label, 12, Anchor::Start);
}

// The legend in rows from `top`; returns its height.
double draw_legend(std::string& svg, std::span<const PlotRun> runs, double top) {
  std::vector<LegendEntry> entries;
  bool validation = false, restarts = false;
  for (size_t i = 0; i < runs.size(); ++i) {
    entries.push_back({LegendEntry::Kind::Run, i, runs[i].label});
    restarts |= !runs[i].log.restarts.empty();
    for (const MetricsRecord& r : runs[i].log.records) validation |= std::isfinite(r.val_loss);
  }
  if (validation) entries.push_back({LegendEntry::Kind::Validation, 0, "validation loss"});
  if (restarts) entries.push_back({LegendEntry::Kind::Restart, 0, "resume (a redone step shows its later value)"});
  double x = 20, y = top + kLegendRow - 6;
  for (const LegendEntry& e : entries) {
    const double w = 30 + kCharWidth * static_cast<double>(e.label.size()) + 22;
    if (x > 20 && x + w > kWidth - 20) {
      x = 20;
      y += kLegendRow;
    }
    draw_entry(svg, e, x, y);
    x += w;
  }
  return y + 6 - top;
}

// A log axis cannot show a loss <= 0: an error naming the run and the step.
void check_log_losses(std::span<const PlotRun> runs) {
  for (const PlotRun& run : runs) {
    for (const MetricsRecord& r : run.log.records) {
      for (double v : {r.loss, r.val_loss}) {
        ST_CHECK(!(v <= 0), "a log loss axis needs losses > 0, but run '{}' has {} at step {}", run.label, v, r.step);
      }
    }
  }
}

// Whether every run has tokens (the toy model has samples only).
bool all_have_tokens(std::span<const PlotRun> runs) {
  return std::all_of(runs.begin(), runs.end(), [](const PlotRun& run) {
    return std::any_of(run.log.records.begin(), run.log.records.end(),
                       [](const MetricsRecord& r) { return std::isfinite(r.tokens_per_s); });
  });
}

// Tokens/s when every run has it, else samples/s; both over all ranks, as the step line gives them.
PanelSpec throughput_panel(std::span<const PlotRun> runs) {
  if (all_have_tokens(runs)) return {"throughput (tokens/s, all ranks)", &MetricsRecord::tokens_per_s};
  return {"throughput (samples/s, all ranks)", &MetricsRecord::samples_per_s};
}

std::string default_title(std::span<const PlotRun> runs) {
  std::string title = "shardtrain: ";
  for (size_t i = 0; i < runs.size(); ++i) title += (i ? ", " : "") + runs[i].label;
  return title;
}

}  // namespace

std::string render_svg(std::span<const PlotRun> runs, const PlotOptions& options) {
  ST_CHECK(!runs.empty(), "nothing to plot: no runs");
  for (const PlotRun& run : runs) ST_CHECK(!run.log.records.empty(), "run '{}' has no steps to plot", run.label);
  if (options.loss_scale == AxisScale::Log) check_log_losses(runs);
  std::string body;
  text(body, kWidth / 2, 24, options.title.empty() ? default_title(runs) : options.title, 16, Anchor::Middle,
       " font-weight=\"bold\"");
  const double top = kTitleHeight + draw_legend(body, runs, kTitleHeight) + 6;
  const Axis steps = step_axis(runs);
  // Cross-entropy in nats (natural log) per predicted token; the toy model's loss is a mean squared error.
  const std::string loss_title = all_have_tokens(runs) ? "loss (nats/token)" : "loss (mean squared error)";
  draw_panel(body, runs, steps, 0, top,
             {loss_title, &MetricsRecord::loss, &MetricsRecord::val_loss, options.loss_scale, /*restarts=*/true});
  draw_panel(body, runs, steps, kPanelWidth, top, {"learning rate", &MetricsRecord::lr});
  draw_panel(body, runs, steps, 0, top + kPanelHeight, throughput_panel(runs));
  draw_panel(body, runs, steps, kPanelWidth, top + kPanelHeight,
             {"gradient norm (L2, before clipping)", &MetricsRecord::grad_norm});
  const double height = std::ceil(top + 2 * kPanelHeight + 4);
  std::string svg = format(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
      "<svg xmlns=\"http://www.w3.org/2000/svg\" version=\"1.1\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\">\n",
      kWidth, height, kWidth, height);
  rect(svg, 0, 0, kWidth, height, "#ffffff");
  svg += "<g font-family=\"sans-serif\" fill=\"#222222\">\n" + body + "</g>\n</svg>\n";
  return svg;
}

}  // namespace st::metrics
