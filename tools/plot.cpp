// plot: training curves from metrics files as one SVG (issue 15). This file
// is the program, its command line and what it prints; reading the files is
// metrics/metrics.h's work, drawing metrics/plot_svg.h's.
//
//   plot METRICS.jsonl... -o run.svg [--label NAME]... [--title TEXT] [--log-loss]
//
// Exit codes: 0 success, 1 an error (one line on stderr), 2 a usage or
// internal error (run_main, core/cli.h).
#include <cstdio>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/cli.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "metrics/metrics.h"
#include "metrics/plot_svg.h"

namespace {

/// Command line of `plot`.
struct PlotArgs {
  std::vector<std::string> files;    // the metrics files, in legend order
  std::vector<std::string> labels;   // --label, the i-th naming the i-th file
  std::string out;                   // -o / --output
  st::metrics::PlotOptions options;  // --title, --log-loss
};

/// The flags, writing into `args`.
st::cli::Parser plot_parser(PlotArgs& args) {
  st::cli::Parser p("plot", "plot METRICS.jsonl... -o OUT.svg [--label NAME]... [--title TEXT] [--log-loss]");
  p.text(
       "Draws the metrics files of training runs (logging.metrics_file: one JSON object per\n"
       "step) into one self-contained SVG: loss (validation loss as markers where a run\n"
       "has it), learning rate, throughput and gradient norm against the step, one colour per run.\n")
      .option("-o, --output", "OUT.svg", &args.out, "the file to write (replaced atomically)")
      .repeated("--label", "NAME", &args.labels,
                "the i-th --label names the i-th file in the legend; files\n"
                "without one are named by the run name the trainer recorded\n"
                "(logging.run_name), else by their file name without its extension")
      .option("--title", "TEXT", &args.options.title, "the title (default: \"shardtrain: \" and the names)")
      .flag(
          "--log-loss", [&args] { args.options.loss_scale = st::metrics::AxisScale::Log; },
          "a log scale for the loss panel")
      .text(
          "\nA dotted line marks where each resumed run began (the trainer writes a resume line\n"
          "there); a step redone after a resume from an older checkpoint shows its later value.")
      .positionals("METRICS.jsonl", &args.files)
      .usage_without_arguments();
  return p;
}

// Every argument checked; throws st::cli::UsageError naming the problem.
void check_args(const PlotArgs& args) {
  ST_USAGE_CHECK(!args.files.empty(), "no metrics files given; see plot --help");
  ST_USAGE_CHECK(!args.out.empty(), "no output file: give -o OUT.svg");
  ST_USAGE_CHECK(args.labels.size() <= args.files.size(), "{} --label options for {} metrics file(s)",
                 args.labels.size(), args.files.size());
}

// Reads every file and names its run; two runs with one name are an error.
std::vector<st::metrics::PlotRun> read_runs(const PlotArgs& args) {
  std::vector<st::metrics::PlotRun> runs;
  std::set<std::string> names;
  for (size_t i = 0; i < args.files.size(); ++i) {
    const std::string& file = args.files[i];
    std::error_code ec;
    ST_CHECK(!std::filesystem::equivalent(file, args.out, ec), "the output {} is the metrics file {}; give another -o",
             args.out, file);
    st::metrics::MetricsLog log = st::metrics::read_metrics_file(file);
    // The name the trainer recorded (logging.run_name or its default), else the file's.
    std::string label = i < args.labels.size()  ? args.labels[i]
                        : !log.run_name.empty() ? log.run_name
                                                : std::filesystem::path(file).stem().string();
    ST_CHECK(names.insert(label).second, "two runs are named '{}' ({}); give each file a --label", label, file);
    runs.push_back({std::move(label), std::move(log)});
  }
  return runs;
}

int run(const std::vector<std::string>& argv) {
  PlotArgs args;
  const st::cli::Parser parser = plot_parser(args);
  if (parser.parse_or_help(argv)) return 0;
  check_args(args);
  const std::vector<st::metrics::PlotRun> runs = read_runs(args);
  st::write_file_atomic(args.out, st::metrics::render_svg(runs, args.options));
  std::string summary;
  for (const st::metrics::PlotRun& r : runs) {
    const size_t restarts = r.log.restarts.size();
    summary +=
        st::format("{}{}: steps {}..{}{}", summary.empty() ? "" : ", ", r.label, r.log.records.front().step,
                   r.log.records.back().step, restarts == 0 ? std::string() : st::format(", {} restart(s)", restarts));
  }
  std::printf("plot: wrote %s (%s)\n", args.out.c_str(), summary.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return st::run_main("plot", [&] { return run(std::vector<std::string>(argv + 1, argv + argc)); });
}
