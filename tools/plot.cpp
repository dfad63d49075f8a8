// plot: training curves from metrics files as one SVG (issue 15). This file
// is the program, its command line and what it prints; reading the files is
// metrics/metrics.h's work, drawing metrics/plot_svg.h's.
//
//   plot METRICS.jsonl... -o run.svg [--label NAME]... [--title TEXT] [--log-loss]
//
// Exit codes: 0 success, 1 an error (one line on stderr), 2 an internal
// error. Only main() catches st::Error.
#include <cstdio>
#include <exception>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/fs.h"
#include "core/error.h"
#include "core/format.h"
#include "metrics/metrics.h"
#include "metrics/plot_svg.h"

namespace {

constexpr const char* kUsage =
    "usage: plot METRICS.jsonl... -o OUT.svg [--label NAME]... [--title TEXT] [--log-loss]\n"
    "\n"
    "Draws the metrics files of training runs (logging.metrics_file: one JSON object per\n"
    "logged step) into one self-contained SVG: loss (validation loss as markers where a run\n"
    "has it), learning rate, throughput and gradient norm against the step, one colour per run.\n"
    "\n"
    "  -o, --output OUT.svg  the file to write (replaced atomically)\n"
    "  --label NAME          the i-th --label names the i-th file in the legend; files\n"
    "                        without one are named by their file name without its extension\n"
    "  --title TEXT          the title (default: \"shardtrain: \" and the names)\n"
    "  --log-loss            a log scale for the loss panel\n"
    "\n"
    "A file holding a resumed run holds the steps it redid twice (the steps go back where\n"
    "the run resumed): for each step the later line counts, and a dotted line marks the restart.\n";

/// Command line of `plot`.
struct PlotArgs {
  bool help = false;                 // --help / -h / no arguments
  std::vector<std::string> files;    // the metrics files, in legend order
  std::vector<std::string> labels;   // --label, the i-th naming the i-th file
  std::string out;                   // -o / --output
  st::metrics::PlotOptions options;  // --title, --log-loss
};

// The value of the option at argv[i] ("--title=T" or "--title T"); advances i past it.
std::string option_value(const std::vector<std::string>& argv, size_t& i, const std::string& name) {
  const std::string& arg = argv[i];
  if (arg.size() > name.size() && arg[name.size()] == '=') return arg.substr(name.size() + 1);
  ST_CHECK(i + 1 < argv.size(), "{} needs a value; see plot --help", name);
  return argv[++i];
}

bool is_option(const std::string& arg, const std::string& name) {
  return arg == name || (arg.size() > name.size() && arg.compare(0, name.size() + 1, name + "=") == 0);
}

PlotArgs parse_plot_args(const std::vector<std::string>& argv) {
  PlotArgs args;
  args.help = argv.empty();
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      args.help = true;
    } else if (is_option(arg, "-o") || is_option(arg, "--output")) {
      args.out = option_value(argv, i, arg[1] == 'o' ? "-o" : "--output");
    } else if (is_option(arg, "--label")) {
      args.labels.push_back(option_value(argv, i, "--label"));
    } else if (is_option(arg, "--title")) {
      args.options.title = option_value(argv, i, "--title");
    } else if (arg == "--log-loss") {
      args.options.loss_scale = st::metrics::AxisScale::Log;
    } else {
      ST_CHECK(arg.empty() || arg[0] != '-' || arg == "-", "unknown option '{}'; see plot --help", arg);
      args.files.push_back(arg);
    }
  }
  if (args.help) return args;
  ST_CHECK(!args.files.empty(), "no metrics files given; see plot --help");
  ST_CHECK(!args.out.empty(), "no output file: give -o OUT.svg");
  ST_CHECK(args.labels.size() <= args.files.size(), "{} --label options for {} metrics file(s)", args.labels.size(),
           args.files.size());
  return args;
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
    std::string label = i < args.labels.size() ? args.labels[i] : std::filesystem::path(file).stem().string();
    ST_CHECK(names.insert(label).second, "two runs are named '{}' ({}); give each file a --label", label, file);
    runs.push_back({std::move(label), st::metrics::read_metrics_file(file)});
  }
  return runs;
}

int run(const std::vector<std::string>& argv) {
  const PlotArgs args = parse_plot_args(argv);
  if (args.help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::vector<st::metrics::PlotRun> runs = read_runs(args);
  st::checkpoint::write_file_atomic(args.out, st::metrics::render_svg(runs, args.options));
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
