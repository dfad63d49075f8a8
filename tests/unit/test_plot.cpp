// The plot's pieces: axis ticks and labels, metrics files read back (a
// resumed run's repeated steps, errors naming file:line) and the SVG's
// content. tests/e2e/check_plot.py renders real runs' plots with rsvg-convert.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "metrics/metrics.h"
#include "metrics/plot_svg.h"
#include "tests/harness/test_util.h"

namespace st::metrics {
namespace {

using st::test::error_of;

std::vector<std::string> labels(const Axis& a) { return a.labels; }

TEST(PlotAxis, LinearTicksAreNiceAndCoverTheData) {
  const Axis steps = linear_axis(1, 60, 8);
  EXPECT_EQ(steps.ticks, (std::vector<double>{0, 10, 20, 30, 40, 50, 60}));
  EXPECT_EQ(labels(steps), (std::vector<std::string>{"0", "10", "20", "30", "40", "50", "60"}));
  EXPECT_EQ(steps.lo, 0);
  EXPECT_EQ(steps.hi, 60);

  const Axis loss = linear_axis(4.31, 5.62, 6);
  EXPECT_EQ(labels(loss), (std::vector<std::string>{"4.0", "4.5", "5.0", "5.5", "6.0"}));
  EXPECT_LE(loss.lo, 4.31);
  EXPECT_GE(loss.hi, 5.62);

  // Whole ticks would need 7 at spacing 0.2, so the spacing widens to 0.5.
  EXPECT_EQ(labels(linear_axis(5, 5, 6)), (std::vector<std::string>{"4.5", "5.0", "5.5"}));
  EXPECT_EQ(labels(linear_axis(0, 0, 6)), (std::vector<std::string>{"-1.0", "-0.5", "0", "0.5", "1.0"}));
  // Spacing 0.2 would need 7 ticks from -0.4 to 0.8: 0.5 instead.
  EXPECT_EQ(labels(linear_axis(-0.3, 0.7, 6)), (std::vector<std::string>{"-0.5", "0", "0.5", "1.0"}));
  for (auto [lo, hi] : {std::pair{-0.3, 0.7}, {1e-7, 3e-7}, {12.0, 987654.0}, {0.001, 0.0011}}) {
    const Axis a = linear_axis(lo, hi, 6);
    EXPECT_LE(a.ticks.size(), 6u) << lo << " " << hi;
    EXPECT_GE(a.ticks.size(), 2u) << lo << " " << hi;
    EXPECT_LE(a.lo, lo);
    EXPECT_GE(a.hi, hi);
    EXPECT_EQ(std::set<std::string>(a.labels.begin(), a.labels.end()).size(), a.labels.size()) << "labels repeat";
  }
}

TEST(PlotAxis, LabelsKeepOneStylePerAxis) {
  // A learning rate: exponents; a throughput: thousands as "k"; millions as "M".
  EXPECT_EQ(labels(linear_axis(3e-4, 3e-3, 6)), (std::vector<std::string>{"0", "1e-3", "2e-3", "3e-3"}));
  EXPECT_EQ(labels(linear_axis(2.4e-4, 3.1e-4, 6)),
            (std::vector<std::string>{"2.4e-4", "2.6e-4", "2.8e-4", "3.0e-4", "3.2e-4"}));
  EXPECT_EQ(labels(linear_axis(9000, 12500, 6)), (std::vector<std::string>{"9k", "10k", "11k", "12k", "13k"}));
  EXPECT_EQ(labels(linear_axis(0, 12000, 4)), (std::vector<std::string>{"0", "5k", "10k", "15k"}));
  EXPECT_EQ(labels(linear_axis(1.1e6, 1.6e6, 6)),
            (std::vector<std::string>{"1.1M", "1.2M", "1.3M", "1.4M", "1.5M", "1.6M"}));
  EXPECT_EQ(labels(linear_axis(15000, 15500, 6)),
            (std::vector<std::string>{"15.0k", "15.1k", "15.2k", "15.3k", "15.4k", "15.5k"}));
  // Ticks close together far from 0: grouped digits, since "150.01k" would read badly.
  EXPECT_EQ(labels(linear_axis(150000, 150030, 4)),
            (std::vector<std::string>{"150,000", "150,010", "150,020", "150,030"}));
}

TEST(PlotAxis, LogTicks) {
  const Axis wide = log_axis(0.5, 60, 8);
  EXPECT_EQ(wide.scale, AxisScale::Log);
  EXPECT_EQ(labels(wide), (std::vector<std::string>{"0.5", "1", "2", "5", "10", "20", "50"}));
  EXPECT_LT(wide.lo, 0.5);
  EXPECT_GT(wide.hi, 60);
  // Too many decades for one tick each: every second decade, in exponents.
  EXPECT_EQ(labels(log_axis(1e-5, 1e3, 8)), (std::vector<std::string>{"1e-4", "1e-2", "1e0", "1e2"}));
  // Within a decade with fewer than three m x 10^k inside: the linear ticks instead.
  EXPECT_EQ(labels(log_axis(3.1, 5.6, 8)), (std::vector<std::string>{"3.5", "4.0", "4.5", "5.0", "5.5"}));
  EXPECT_EQ(labels(log_axis(4.3, 5.6, 8)), (std::vector<std::string>{"4.4", "4.6", "4.8", "5.0", "5.2", "5.4", "5.6"}));
  EXPECT_EQ(labels(log_axis(2.2, 8.7, 8)), (std::vector<std::string>{"3", "4", "5", "6", "7", "8"}));
  EXPECT_NE(error_of([] { log_axis(0, 1); }).find("0 < lo <= hi"), std::string::npos);
}

// A run stopped after step 25 whose last checkpoint was step 20, resumed
// from it: steps 21..25 appear twice, the resumed run's lines last.
constexpr std::string_view kResumed =
    R"({"step":1,"loss":5.0,"lr":0.001,"grad_norm":1.0,"samples_per_s":10,"tokens_per_s":320}
{"step":20,"loss":4.0,"lr":0.002,"grad_norm":0.5,"samples_per_s":10,"tokens_per_s":320}
{"step":25,"loss":3.9,"lr":0.002,"grad_norm":0.5,"samples_per_s":10,"tokens_per_s":320}

{"step":21,"loss":3.5,"lr":0.002,"grad_norm":0.4,"samples_per_s":11,"tokens_per_s":352}
{"step":25,"loss":3.4,"lr":0.002,"grad_norm":0.4,"samples_per_s":11,"tokens_per_s":352}
{"step":25,"val_loss":3.6}
{"step":30,"loss":3.3,"lr":0.001,"grad_norm":null,"samples_per_s":11}
)";

TEST(PlotMetrics, ResumedRunLaterLinesWin) {
  const MetricsLog log = parse_metrics(kResumed, "run.jsonl");
  std::vector<int64_t> steps;
  for (const MetricsRecord& r : log.records) steps.push_back(r.step);
  EXPECT_EQ(steps, (std::vector<int64_t>{1, 20, 21, 25, 30}));
  EXPECT_EQ(log.restarts, (std::vector<int64_t>{21}));  // 25 after 25 (an eval line) is no restart
  const MetricsRecord& s25 = log.records[3];
  EXPECT_EQ(s25.loss, 3.4);  // the resumed run's value, not the stopped run's 3.9
  EXPECT_EQ(s25.val_loss, 3.6);
  EXPECT_EQ(s25.tokens_per_s, 352);
  EXPECT_TRUE(std::isnan(log.records[0].val_loss));   // only on evaluation steps
  EXPECT_TRUE(std::isnan(log.records[4].grad_norm));  // null: JSON's NaN
  EXPECT_TRUE(std::isnan(log.records[4].tokens_per_s));
  EXPECT_EQ(log.records[4].samples_per_s, 11);

  // A whole new run appended from step 1 is a restart too, and replaces every step it reaches.
  const MetricsLog again = parse_metrics(std::string(kResumed) + "{\"step\":1,\"loss\":9.0}\n", "run.jsonl");
  EXPECT_EQ(again.restarts, (std::vector<int64_t>{21, 1}));
  EXPECT_EQ(again.records[0].loss, 9.0);
  EXPECT_EQ(again.records[0].lr, 0.001);  // a field the later line lacks keeps its value
}

// The trainer writes an event line where each run begins: a resume is a
// restart even when the steps do not go back, and the line is no step.
TEST(PlotMetrics, EventLinesMarkResumesAndNameTheRun) {
  const std::string text = format_event_json(RunEvent::Start, 0, "fortunes") + "\n" +
                           R"({"step":1,"loss":5.0}
{"step":2,"loss":4.5}
)" + format_event_json(RunEvent::Resume, 2, "fortunes-b") +
                           "\n" + R"({"step":3,"loss":4.0}
)" + format_event_json(RunEvent::Resume, 2, "") +
                           "\n" + R"({"step":3,"loss":3.9}
)";
  const MetricsLog log = parse_metrics(text, "m.jsonl");
  EXPECT_EQ(log.restarts, (std::vector<int64_t>{2, 2}));  // one mark per resume, none for the start
  EXPECT_EQ(log.run_name, "fortunes-b");                  // the last event that names one
  ASSERT_EQ(log.records.size(), 3u);
  EXPECT_EQ(log.records[2].loss, 3.9);
  EXPECT_EQ(format_event_json(RunEvent::Resume, 600, "fortunes"),
            R"({"event":"resume","step":600,"run_name":"fortunes"})");
  EXPECT_EQ(format_event_json(RunEvent::Start, 0, "a\"b"), R"({"event":"start","step":0,"run_name":"a\"b"})");
  // A fresh run appended to an old file starts below its last step: a restart too.
  EXPECT_EQ(parse_metrics(text + format_event_json(RunEvent::Start, 0, "x") + "\n{\"step\":1}\n", "m").restarts,
            (std::vector<int64_t>{2, 2, 0}));
  // A file holding only an event line (a run stopped before its first step) has no steps.
  EXPECT_EQ(error_of([] { parse_metrics(format_event_json(RunEvent::Resume, 4, "r") + "\n", "m.jsonl"); }),
            "m.jsonl: no steps (an empty metrics file)");
}

TEST(PlotMetrics, ErrorsNameTheFileAndLine) {
  EXPECT_EQ(error_of([] { parse_metrics("{\"step\":1,\"loss\":2}\n\n{\"step\":2,\"loss\":\n", "m.jsonl"); }),
            "m.jsonl:3: not a JSON object (a metrics file holds one per line): {\"step\":2,\"loss\":");
  EXPECT_EQ(error_of([] { parse_metrics("[1, 2]\n", "m.jsonl"); }),
            "m.jsonl:1: not a JSON object (a metrics file holds one per line): [1, 2]");
  EXPECT_EQ(error_of([] { parse_metrics("{\"loss\":2}\n", "m.jsonl"); }),
            "m.jsonl:1: no integer \"step\" in {\"loss\":2}");
  EXPECT_EQ(error_of([] { parse_metrics("{\"step\":1.5}\n", "m.jsonl"); }),
            "m.jsonl:1: no integer \"step\" in {\"step\":1.5}");
  EXPECT_EQ(error_of([] { parse_metrics("{\"step\":1,\"loss\":\"low\"}\n", "m.jsonl"); }),
            "m.jsonl:1: \"loss\" is \"low\", not a number");
  EXPECT_EQ(error_of([] { parse_metrics("\n  \n", "m.jsonl"); }), "m.jsonl: no steps (an empty metrics file)");
  EXPECT_EQ(error_of([] { read_metrics_file("/nonexistent/m.jsonl"); }),
            "metrics file '/nonexistent/m.jsonl' does not exist");
  EXPECT_EQ(error_of([] { read_metrics_file("/tmp"); }), "metrics file '/tmp' is a directory");
}

TEST(PlotMetrics, ReadsAFile) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "st_test_plot_read.jsonl";
  std::ofstream(path) << kResumed;
  EXPECT_EQ(read_metrics_file(path.string()).records.size(), 5u);
  std::filesystem::remove(path);
}

std::string read_all(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

StepMetrics step_metrics(int64_t step) {
  StepMetrics m;
  m.step = step;
  m.loss = 2.5;
  return m;
}

// The keys a reader looks for come first: step, loss, val_loss; then the rest
// in a fixed order (the file is read with `cut -c1-80`, `grep`, `head`).
TEST(MetricsFormat, JsonKeysStartWithStepAndLoss) {
  StepMetrics m;
  m.step = 600;
  m.total_steps = 600;
  m.loss = 2.25;
  m.lr = 0.0005;
  m.grad_norm = 0.5;
  m.tokens_per_s = 6400;
  m.samples_per_s = 50;
  m.step_ms = 20;
  m.elapsed_s = 118.5;
  m.peak_bytes = 1000;
  EXPECT_EQ(format_step_json(m),
            R"({"step":600,"loss":2.25,"lr":0.0005,"grad_norm":0.5,"tokens_per_s":6400.0,"samples_per_s":50.0,)"
            R"("step_ms":20.0,"elapsed_s":118.5,"peak_bytes":1000})");
  m.val_loss = 2.5;
  m.val_ppl = 12.25;
  m.mfu = 0.125;
  EXPECT_EQ(
      format_step_json(m),
      R"({"step":600,"loss":2.25,"val_loss":2.5,"val_ppl":12.25,"lr":0.0005,"grad_norm":0.5,"tokens_per_s":6400.0,)"
      R"("samples_per_s":50.0,"step_ms":20.0,"mfu":0.125,"elapsed_s":118.5,"peak_bytes":1000})");
  // Read back, the order does not matter.
  const MetricsLog log = parse_metrics(format_step_json(m) + "\n", "m");
  EXPECT_EQ(log.records[0].val_loss, 2.5);
  EXPECT_EQ(log.records[0].tokens_per_s, 6400);
}

// One duration format, whatever the length: minutes and seconds, then hours and minutes.
TEST(MetricsFormat, DurationsHaveOneFormat) {
  EXPECT_EQ(format_duration(0), "0m00s");
  EXPECT_EQ(format_duration(4.4), "0m04s");
  EXPECT_EQ(format_duration(59.6), "1m00s");
  EXPECT_EQ(format_duration(118.1), "1m58s");
  EXPECT_EQ(format_duration(3599.4), "59m59s");
  EXPECT_EQ(format_duration(3599.6), "1h00m");
  EXPECT_EQ(format_duration(2 * 3600 + 3 * 60 + 10), "2h03m");
  EXPECT_EQ(format_duration(100 * 3600), "100h00m");
  EXPECT_EQ(format_duration(-1), "0m00s");
  EXPECT_EQ(format_duration(std::nan("")), "0m00s");
}

TEST(MetricsFormat, StepLine) {
  StepMetrics m;
  m.step = 20;
  m.total_steps = 600;
  m.loss = 5.12346;
  m.lr = 0.0003;
  m.grad_norm = 1.2344;
  m.tokens_per_s = 12345.4;
  m.samples_per_s = 96.4;
  m.step_ms = 123.44;
  m.peak_bytes = 1230000000;
  m.elapsed_s = 12.4;
  m.eta_s = 118.1;
  EXPECT_EQ(format_step_line(m),
            "step 20/600 | loss 5.1235 | lr 3.00e-04 | grad_norm 1.234 | 12,345 tok/s (all ranks) | 123.4 ms/step | "
            "peak 1.23 GB | elapsed 0m12s | eta 1m58s");
  m.peak_bytes = 1900000;  // in the unit that fits: "1.9 MB", not "0.00 GB"
  EXPECT_NE(format_step_line(m).find("| peak 1.9 MB |"), std::string::npos);
  m.peak_bytes = 1230000000;
  m.mfu = 0.4134;
  m.val_loss = 2.34568;
  m.val_ppl = 10.44;
  m.eta_s = 2 * 3600 + 3 * 60;
  EXPECT_EQ(format_step_line(m),
            "step 20/600 | loss 5.1235 | lr 3.00e-04 | grad_norm 1.234 | 12,345 tok/s (all ranks) | 123.4 ms/step | "
            "mfu 41.3% | peak 1.23 GB | elapsed 0m12s | eta 2h03m | val_loss 2.3457 (ppl 10.4)");
  m.tokens_per_s = -1;  // the toy model: samples
  m.val_ppl.reset();
  EXPECT_NE(format_step_line(m).find("| 96 samples/s (all ranks) |"), std::string::npos);
}

// The step line's means: the loss over every step since the last line, the
// time over its timed steps (the process's warm-up step only when alone).
TEST(MetricsFormat, IntervalMeans) {
  IntervalMeans means;
  means.add(6.0, 3.0, /*warm_up=*/true);
  EXPECT_EQ(means.loss(), 6.0);
  EXPECT_EQ(means.seconds_per_step(), 3.0);  // alone, the warm-up step is the figure
  means.add(5.0, 0.5, false);
  means.add(4.0, 1.0, false);
  EXPECT_EQ(means.steps(), 3);
  EXPECT_EQ(means.loss(), 5.0);
  EXPECT_EQ(means.seconds_per_step(), 0.75);
  means.reset();
  means.add(3.0, 0.25, false);
  EXPECT_EQ(means.loss(), 3.0);
  EXPECT_EQ(means.seconds_per_step(), 0.25);
}

// A run killed mid-line (or out of space) leaves a half line; the next run's
// MetricsFile cuts it off before appending, so the file reads back whole.
TEST(MetricsFile, CutsAHalfWrittenLastLineAtOpen) {
  const std::filesystem::path path = std::filesystem::temp_directory_path() / "st_test_metrics_half.jsonl";
  const std::string complete = format_step_json(step_metrics(1)) + "\n" + format_step_json(step_metrics(2)) + "\n";
  const std::string half = R"({"step":3,"loss":2.5,"lr":0.0,"gr)";
  std::ofstream(path, std::ios::binary) << complete << half;
  {
    MetricsFile file(path.string());
    EXPECT_EQ(file.cut_bytes(), static_cast<int64_t>(half.size()));
    EXPECT_EQ(read_all(path), complete);
    EXPECT_TRUE(file.append(step_metrics(3)));
  }
  EXPECT_EQ(read_all(path), complete + format_step_json(step_metrics(3)) + "\n");
  {
    MetricsFile file(path.string());
    EXPECT_TRUE(file.append_event(RunEvent::Resume, 3, "half"));
  }
  EXPECT_EQ(read_metrics_file(path.string()).restarts, (std::vector<int64_t>{3}));
  EXPECT_EQ(read_metrics_file(path.string()).records.size(), 3u);
  {
    MetricsFile file(path.string());  // whole lines only: nothing to cut
    EXPECT_EQ(file.cut_bytes(), 0);
  }
  std::ofstream(path, std::ios::binary) << half;  // no complete line at all
  {
    MetricsFile file(path.string());
    EXPECT_EQ(file.cut_bytes(), static_cast<int64_t>(half.size()));
    EXPECT_EQ(read_all(path), "");
  }
  std::filesystem::remove(path);
}

// A write that fails (here ENOSPC from /dev/full) is reported once through
// append()'s result and error(); later appends are no-ops, never exceptions.
TEST(MetricsFile, AFailedWriteStopsTheFileWithoutThrowing) {
  MetricsFile file("/dev/full");
  EXPECT_EQ(file.cut_bytes(), 0);
  EXPECT_TRUE(file.error().empty());
  EXPECT_FALSE(file.append(step_metrics(1)));
  EXPECT_EQ(file.error(), "cannot write logging.metrics_file '/dev/full': No space left on device");
  EXPECT_FALSE(file.append(step_metrics(2)));
  MetricsFile none("");
  EXPECT_TRUE(none.append(step_metrics(1)));
  EXPECT_EQ(error_of([] {
              MetricsFile bad("/dev/null/m.jsonl");
            }).rfind("cannot create the directory '/dev/null' of logging.metrics_file '/dev/null/m.jsonl': ", 0),
            0u);
}

// The metrics file's directories are created, as checkpoint.dir's are; a
// FIFO there (or as plot's input) is refused at once instead of blocking in open().
TEST(MetricsFile, DirectoriesAreCreatedAndFifosRefused) {
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("st_test_metrics_dirs_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::filesystem::path path = dir / "a" / "b" / "m.jsonl";
  {
    MetricsFile file(path.string());
    EXPECT_TRUE(file.append(step_metrics(1)));
  }
  EXPECT_EQ(read_metrics_file(path.string()).records.size(), 1u);
  const std::filesystem::path fifo = dir / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  EXPECT_EQ(error_of([&] { MetricsFile bad(fifo.string()); }),
            "logging.metrics_file '" + fifo.string() + "' is not a regular file (a FIFO)");
  EXPECT_EQ(error_of([&] { read_metrics_file(fifo.string()); }),
            "metrics file '" + fifo.string() + "' is not a regular file (a FIFO)");
  std::filesystem::remove_all(dir);
}

std::vector<PlotRun> two_runs() {
  return {{"uninterrupted", parse_metrics(kResumed, "a")}, {"a<b & \"c\"", parse_metrics(kResumed, "b")}};
}

TEST(PlotSvg, SelfContainedAndDeterministic) {
  const std::vector<PlotRun> runs = two_runs();
  const std::string svg = render_svg(runs);
  EXPECT_EQ(svg, render_svg(runs));
  EXPECT_EQ(svg.rfind("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<svg xmlns=\"http://www.w3.org/2000/svg\"", 0), 0u);
  // Plain SVG 1.1 elements only: no style sheets, scripts, images or links.
  std::set<std::string> elements;
  const std::regex tag("<([a-zA-Z][a-zA-Z0-9:]*)");
  for (auto it = std::sregex_iterator(svg.begin(), svg.end(), tag); it != std::sregex_iterator(); ++it)
    elements.insert((*it)[1]);
  EXPECT_EQ(elements, (std::set<std::string>{"svg", "g", "path", "rect", "line", "text"}));
  for (const char* banned : {"href", "url(", "@import", "style", "<script", "font-face"})
    EXPECT_EQ(svg.find(banned), std::string::npos) << banned;
  // The legend names the runs (escaped), and the keys to markers and restarts are there.
  EXPECT_NE(svg.find(">uninterrupted</text>"), std::string::npos);
  EXPECT_NE(svg.find(">a&lt;b &amp; &quot;c&quot;</text>"), std::string::npos);
  EXPECT_NE(svg.find(">validation loss</text>"), std::string::npos);
  EXPECT_NE(svg.find(">resume (a redone step shows its later value)</text>"), std::string::npos);
  // Each panel's title gives its unit.
  for (const char* title :
       {">loss (nats/token)</text>", ">learning rate</text>", ">throughput (tokens/s, all ranks)</text>",
        ">gradient norm (L2, before clipping)</text>", ">shardtrain: uninterrupted, a&lt;b"})
    EXPECT_NE(svg.find(title), std::string::npos) << title;
  // Each run's colour draws its curves: the first run wider than the second.
  EXPECT_NE(svg.find("stroke=\"#1f77b4\" stroke-width=\"4.0\""), std::string::npos);
  EXPECT_NE(svg.find("stroke=\"#d62728\" stroke-width=\"2.0\""), std::string::npos);
}

TEST(PlotSvg, OptionsAndErrors) {
  std::vector<PlotRun> runs = two_runs();
  const std::string svg = render_svg(runs, {.title = "resume check", .loss_scale = AxisScale::Log});
  EXPECT_NE(svg.find(">resume check</text>"), std::string::npos);
  // The toy model has no tokens: throughput falls back to samples/s for every run.
  runs[1].log.records[0].tokens_per_s = MetricsRecord::kAbsent;
  for (MetricsRecord& r : runs[1].log.records) r.tokens_per_s = MetricsRecord::kAbsent;
  EXPECT_NE(render_svg(runs).find(">throughput (samples/s, all ranks)</text>"), std::string::npos);
  EXPECT_NE(render_svg(runs).find(">loss (mean squared error)</text>"), std::string::npos);

  runs[1].log.records[2].loss = -0.5;
  EXPECT_EQ(error_of([&] { render_svg(runs, {.title = "", .loss_scale = AxisScale::Log}); }),
            "a log loss axis needs losses > 0, but run 'a<b & \"c\"' has -0.5 at step 21");
  EXPECT_EQ(error_of([] { render_svg({}); }), "nothing to plot: no runs");
}

// Found by fuzz/fuzz_metrics.cpp: values the JSON reader accepts but no axis can
// draw (1e308 overflows the padded range, 1e-308 underflows the tick spacing)
// were undefined behaviour (inf cast to int); a lone step at the end of
// int64_t overflowed. Now a clear error, and the lone step draws.
TEST(PlotSvg, ValuesNoAxisCanDrawAreRefusedByName) {
  const MetricsLog huge = parse_metrics("{\"step\": 1, \"loss\": 1e308}\n{\"step\": 2, \"loss\": -1e308}\n", "m.jsonl");
  const PlotRun runs[] = {{"big", huge}};
  EXPECT_EQ(error_of([&] { render_svg(runs); }),
            "run 'big': loss (mean squared error) value 1e+308 at step 1 cannot be drawn (magnitudes from 1e-200 to "
            "1e+200 can; is the "
            "metrics file damaged?)");
  const MetricsLog tiny = parse_metrics("{\"step\": 3, \"loss\": 1, \"lr\": 1e-308}\n", "m.jsonl");
  const PlotRun tiny_runs[] = {{"small", tiny}};
  EXPECT_EQ(error_of([&] { render_svg(tiny_runs, {.title = "", .loss_scale = AxisScale::Log}); }),
            "run 'small': learning rate value 1e-308 at step 3 cannot be drawn (magnitudes from 1e-200 to 1e+200 can; "
            "is the metrics file damaged?)");
  // Zero and ordinary values still draw, and so does one step at the end of int64_t.
  const MetricsLog last = parse_metrics("{\"step\": 9223372036854775807, \"loss\": 0, \"lr\": 3e-4}\n", "m.jsonl");
  const PlotRun last_runs[] = {{"last", last}};
  EXPECT_NE(render_svg(last_runs).find(">loss (mean squared error)</text>"), std::string::npos);
}

TEST(PlotSvg, LongRunsStaySmall) {
  // 50,000 steps of a noisy curve: at most four points per pixel column are drawn.
  std::string text;
  for (int s = 1; s <= 50000; ++s)
    text += format("{\"step\":{},\"loss\":{},\"lr\":0.001,\"grad_norm\":1,\"samples_per_s\":1}\n", s,
                   3 + std::sin(s * 0.37));
  const std::vector<PlotRun> runs{{"long", parse_metrics(text, "long")}};
  const std::string svg = render_svg(runs);
  EXPECT_LT(svg.size(), 200000u);
  // The noise's extremes survive the thinning: the loss axis still spans 2..4.
  EXPECT_NE(svg.find(">2.0</text>"), std::string::npos);
  EXPECT_NE(svg.find(">4.0</text>"), std::string::npos);
}

}  // namespace
}  // namespace st::metrics
