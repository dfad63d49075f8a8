#pragma once
// Command line of `trainer`:
//   trainer --config FILE [--set key=value]... [--steps N] [--stop-after N] [--resume auto|never|PATH]
//           [--overwrite] [--profile] [--print-config] [--log-level L]
//   trainer --help | --list-keys
//   trainer --config FILE --self-check
#include <string>
#include <vector>

namespace st::launch {

struct TrainerArgs {
  std::string config_path;             // --config FILE (required)
  std::vector<std::string> overrides;  // --set key=value, in order; --steps N becomes train.steps=N,
                                       // --profile logging.profile=true
  bool print_config = false;           // --print-config: print the resolved YAML and exit
  bool help = false;                   // --help / -h
  int64_t stop_after = 0;              // --stop-after N: save and exit 0 after step N (0 = run to the end)
  std::string resume;                  // --resume auto|never|PATH; empty: auto when checkpoint.dir is set
  bool overwrite = false;              // --overwrite: move checkpoint.dir's checkpoints aside and start over
  bool self_check = false;             // --self-check: run the collective self-check instead of training
  bool list_keys = false;              // --list-keys: print the configuration reference (Markdown) and exit
  std::string log_level = "";          // --log-level: overrides logging.level when set
};

/// Parses argv; throws st::Error naming the bad argument.
TrainerArgs parse_trainer_args(const std::vector<std::string>& argv);

/// The usage text, including every configuration key with its doc.
std::string trainer_usage();
/// Every configuration key as a Markdown table (docs/configuration.md's reference).
std::string config_keys_markdown();

}  // namespace st::launch
