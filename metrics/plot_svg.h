#pragma once
// Training curves as one self-contained SVG 1.1 document, drawn from metrics
// files read back by metrics/metrics.h: the work of the `plot` program and of
// the trainer's logging.plot.
//
// Four panels against the step, one colour per run, each titled with its
// unit: loss in nats/token (the training loss as a line; val_loss, where a
// run has it, as square markers joined by a dashed line; a dotted vertical
// line where each resume began, MetricsLog::restarts), learning rate,
// throughput of all ranks (tokens/s; samples/s unless every run has tokens,
// and then the loss is the toy model's mean squared error) and the L2
// gradient norm before clipping. A legend names the runs.
// Each run is drawn thinner than the one before and over it, so identical
// curves (a resumed run against an uninterrupted one) both stay visible.
//
// Only svg, g, path, rect, line and text elements with presentation
// attributes and the generic sans-serif font: no CSS, scripts or external
// files. The same runs and options always give the same bytes.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "metrics/metrics.h"

namespace st::metrics {

/// One run to draw: a metrics file read back and its name in the legend.
struct PlotRun {
  std::string label;
  MetricsLog log;
};

enum class AxisScale : uint8_t { Linear, Log };

struct PlotOptions {
  std::string title;                         // empty: "shardtrain: " and the labels
  AxisScale loss_scale = AxisScale::Linear;  // Log needs every loss and val_loss > 0
};

/// A value axis: the range drawn and its labelled ticks.
struct Axis {
  AxisScale scale = AxisScale::Linear;
  double lo = 0;                    // the range drawn, lowest...
  double hi = 1;                    // ...to highest; it covers the data
  std::vector<double> ticks;        // ascending, within [lo, hi]
  std::vector<std::string> labels;  // one per tick, one style per axis ("0.5", "12k", "3e-4")
};

/// A linear axis over the data range [lo, hi]: ticks 1, 2 or 5 x 10^k apart
/// (the smallest such spacing that needs at most `max_ticks` >= 2), the range
/// widened to whole ticks; lo == hi gets a range around the value.
Axis linear_axis(double lo, double hi, int max_ticks = 6);
/// A log axis over the data range [lo, hi] (0 < lo <= hi): the range padded by
/// 2% of its decades; ticks at m x 10^k with m in 1..9, else in {1, 2, 5},
/// else 1 (the densest set with at most `max_ticks`; every n-th decade when
/// even that is too many), or the linear ticks when fewer than three fall inside.
Axis log_axis(double lo, double hi, int max_ticks = 8);

/// The SVG document. Throws st::Error when `runs` is empty, or when
/// loss_scale is Log and a run has a loss <= 0 (naming the run).
std::string render_svg(std::span<const PlotRun> runs, const PlotOptions& options = {});

}  // namespace st::metrics
