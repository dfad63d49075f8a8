// Fuzzes the metrics JSONL reader that `plot` uses (metrics/metrics.h:
// parse_metrics) and the SVG drawing of what it accepts (metrics/plot_svg.h),
// on linear and, when every loss is positive, log loss axes.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fuzz/fuzz_util.h"
#include "metrics/metrics.h"
#include "metrics/plot_svg.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace st;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  fuzz::expect_only_st_errors([&] {
    const metrics::MetricsLog log = metrics::parse_metrics(text, "metrics.jsonl");
    for (size_t i = 1; i < log.records.size(); ++i)
      fuzz::require(log.records[i - 1].step < log.records[i].step, "records are not in ascending step order");
    const metrics::PlotRun runs[] = {{"run", log}, {"again", log}};
    (void)metrics::render_svg(runs);
    metrics::PlotOptions log_scale;
    log_scale.loss_scale = metrics::AxisScale::Log;
    (void)metrics::render_svg(runs, log_scale);  // may refuse a loss <= 0 with st::Error
  });
  return 0;
}
