#include "launch/cli.h"

#include <sstream>

#include "core/cli.h"
#include "core/error.h"
#include "launch/config.h"

namespace st::launch {

namespace {

/// The trainer's flags, writing into `args`.
cli::Parser trainer_parser(TrainerArgs& args) {
  cli::Parser p("trainer",
                "trainer --config FILE [--set key=value]... [--steps N] [--stop-after N] [--resume auto|never|PATH]\n"
                "               [--overwrite] [--profile] [--print-config] [--log-level L]\n"
                "       trainer --config FILE --self-check");
  auto set = [&args](const std::string& assignment) {
    ST_USAGE_CHECK(assignment.find('=') != std::string::npos, "--set {}: expected key=value, e.g. --set train.steps=20",
                   assignment);
    args.overrides.push_back(assignment);
  };
  auto steps = [&args](const std::string& n) {
    // Sugar for an override: the resolved config records it.
    cli::to_int("--steps", n, 1);
    args.overrides.push_back("train.steps=" + n);
  };
  auto resume = [&args](const std::string& r) {
    ST_USAGE_CHECK(!r.empty(), "--resume needs auto, never or a checkpoint directory");
    args.resume = r;
  };
  p.option("--config", "FILE", &args.config_path, "YAML configuration (see configs/)")
      .option("--set", "key=value", set,
              "override one configuration key; repeatable; e.g. --set fsdp.sharding_strategy=NO_SHARD")
      .option("--steps", "N", steps, "same as --set train.steps=N")
      .option("--stop-after", "N", &args.stop_after,
              "end this process after step N as if preempted: save a checkpoint (when\n"
              "checkpoint.dir is set) and exit 0",
              1)
      .option("--resume", "R", resume,
              "auto (default: continue from the newest complete checkpoint in checkpoint.dir, or\n"
              "start fresh when there is none), never (start fresh; an error when checkpoint.dir\n"
              "holds checkpoints) or a checkpoint directory")
      .flag("--overwrite", &args.overwrite,
            "start fresh in a checkpoint.dir that holds checkpoints, moving them aside into\n"
            "checkpoint.dir/overwritten-<time>/ (nothing is deleted)")
      .flag(
          "--profile", [&args] { args.overrides.push_back("logging.profile=true"); },
          "same as --set logging.profile=true: print where each step's time went and a\n"
          "summary table at the end (see docs/training.md, \"Reading the step profile\")")
      .flag("--print-config", &args.print_config, "print the resolved configuration as YAML and exit")
      .option("--log-level", "L", &args.log_level, "debug | info | warn | error (overrides logging.level)")
      .flag("--self-check", &args.self_check,
            "check every collective on known inputs and measure bus bandwidth, then exit")
      .flag("--list-keys", &args.list_keys, "print every configuration key as a Markdown table and exit")
      .usage_without_arguments();
  return p;
}

}  // namespace

TrainerArgs parse_trainer_args(const std::vector<std::string>& argv) {
  TrainerArgs args;
  args.help = trainer_parser(args).parse(argv);
  ST_USAGE_CHECK(args.help || args.list_keys || !args.config_path.empty(),
                 "missing --config FILE (for example --config configs/toy.yaml)");
  ST_USAGE_CHECK(!args.overwrite || args.resume.empty() || args.resume == "never",
                 "--overwrite starts the run over, so it cannot be combined with --resume {}", args.resume);
  return args;
}

std::string trainer_usage() {
  TrainerArgs unused;
  std::ostringstream os;
  os << trainer_parser(unused).help() << "\nconfiguration keys:\n";
  for (const ConfigKeyDoc& k : config_keys()) {
    os << "  " << k.key << " (" << k.type << ", default " << k.default_value << ")\n      " << k.doc << "\n";
  }
  return os.str();
}

std::string config_keys_markdown() {
  std::ostringstream os;
  os << "| key | type | default | meaning |\n|---|---|---|---|\n";
  // A '|' inside a table cell must be escaped.
  auto cell = [](std::string text) {
    for (size_t p = text.find('|'); p != std::string::npos; p = text.find('|', p + 2)) text.replace(p, 1, "\\|");
    return text;
  };
  for (const ConfigKeyDoc& k : config_keys()) {
    std::string def = k.default_value.empty() ? "" : "`" + k.default_value + "`";
    os << "| `" << k.key << "` | " << cell(k.type) << " | " << def << " | " << cell(k.doc) << " |\n";
  }
  return os.str();
}

}  // namespace st::launch
