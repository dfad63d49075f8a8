#include "launch/cli.h"

#include <sstream>

#include "core/error.h"
#include "launch/config.h"

namespace st::launch {

namespace {
bool is_positive_integer(const std::string& s) {
  if (s.empty() || s.size() > 18) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return std::stoll(s) > 0;
}

/// One argument as flag and value: "--flag=value" (and "--set=k=v") carry
/// their value inline; "--flag" alone takes the next argument, if it needs one.
struct SplitArg {
  std::string flag;
  std::string value;
  bool inline_value = false;
};

SplitArg split_arg(const std::string& arg) {
  if (arg.starts_with("--set=")) return {"--set", arg.substr(6), true};
  if (auto eq = arg.find('='); arg.starts_with("--") && eq != std::string::npos)
    return {arg.substr(0, eq), arg.substr(eq + 1), true};
  return {arg, "", false};
}
}  // namespace

TrainerArgs parse_trainer_args(const std::vector<std::string>& argv) {
  TrainerArgs args;
  // Accepts "--flag value" and "--flag=value" alike.
  for (size_t i = 0; i < argv.size(); ++i) {
    // A struct, not a structured binding: clang before 16 cannot capture
    // bindings in a lambda, and the fuzz build (scripts/fuzz.sh) uses clang 14.
    const SplitArg split = split_arg(argv[i]);
    const std::string& flag = split.flag;
    auto take_value = [&]() -> std::string {
      if (split.inline_value) return split.value;
      ST_CHECK(i + 1 < argv.size(), "{} needs a value (see --help)", split.flag);
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      args.help = true;
    } else if (flag == "--config") {
      args.config_path = take_value();
    } else if (flag == "--set") {
      std::string assignment = take_value();
      ST_CHECK(assignment.find('=') != std::string::npos, "--set {}: expected key=value, e.g. --set train.steps=20",
               assignment);
      args.overrides.push_back(assignment);
    } else if (flag == "--steps") {
      std::string n = take_value();
      ST_CHECK(is_positive_integer(n), "--steps {}: expected a positive integer", n);
      args.overrides.push_back("train.steps=" + n);
    } else if (flag == "--profile") {
      // Sugar for an override, like --steps: the resolved config records it.
      args.overrides.push_back("logging.profile=true");
    } else if (flag == "--self-check") {
      args.self_check = true;
    } else if (flag == "--list-keys") {
      args.list_keys = true;
    } else if (flag == "--stop-after") {
      std::string n = take_value();
      ST_CHECK(is_positive_integer(n), "--stop-after {}: expected a positive integer", n);
      args.stop_after = std::stoll(n);
    } else if (flag == "--resume") {
      args.resume = take_value();
      ST_CHECK(!args.resume.empty(), "--resume needs auto, never or a checkpoint directory");
    } else if (flag == "--overwrite") {
      args.overwrite = true;
    } else if (flag == "--print-config") {
      args.print_config = true;
    } else if (flag == "--log-level") {
      args.log_level = take_value();
    } else {
      ST_FAIL("unknown argument '{}' (see --help)", argv[i]);
    }
  }
  ST_CHECK(args.help || args.list_keys || !args.config_path.empty(),
           "missing --config FILE (for example --config configs/toy.yaml)");
  ST_CHECK(!args.overwrite || args.resume.empty() || args.resume == "never",
           "--overwrite starts the run over, so it cannot be combined with --resume {}", args.resume);
  return args;
}

std::string trainer_usage() {
  std::ostringstream os;
  os << "usage: trainer --config FILE [--set key=value]... [--steps N] [--stop-after N] [--resume auto|never|PATH]\n"
        "               [--overwrite] [--profile] [--print-config] [--log-level L]\n"
        "       trainer --config FILE --self-check\n\n"
        "  --config FILE      YAML configuration (see configs/)\n"
        "  --set key=value    override one configuration key; repeatable; e.g. --set fsdp.sharding_strategy=NO_SHARD\n"
        "  --steps N          same as --set train.steps=N\n"
        "  --stop-after N     end this process after step N as if preempted: save a checkpoint (when\n"
        "                     checkpoint.dir is set) and exit 0\n"
        "  --resume R         auto (default: continue from the newest complete checkpoint in checkpoint.dir, or\n"
        "                     start fresh when there is none), never (start fresh; an error when checkpoint.dir\n"
        "                     holds checkpoints) or a checkpoint directory\n"
        "  --overwrite        start fresh in a checkpoint.dir that holds checkpoints, moving them aside into\n"
        "                     checkpoint.dir/overwritten-<time>/ (nothing is deleted)\n"
        "  --profile          same as --set logging.profile=true: print where each step's time went and a\n"
        "                     summary table at the end (see the README's \"Reading the step profile\")\n"
        "  --print-config     print the resolved configuration as YAML and exit\n"
        "  --log-level L      debug | info | warn | error (overrides logging.level)\n"
        "  --self-check       check every collective on known inputs and measure bus bandwidth, then exit\n"
        "  --list-keys        print every configuration key as a Markdown table and exit\n\n"
        "configuration keys:\n";
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
