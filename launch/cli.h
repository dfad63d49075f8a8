#pragma once
// Command line of `trainer`:
//   trainer --config FILE [--set key=value]... [--steps N] [--print-config] [--log-level L]
#include <string>
#include <vector>

namespace st::launch {

struct TrainerArgs {
  std::string config_path;             // --config FILE (required)
  std::vector<std::string> overrides;  // --set key=value, in order; --steps N becomes train.steps=N
  bool print_config = false;           // --print-config: print the resolved YAML and exit
  bool help = false;                   // --help / -h
  std::string log_level = "";          // --log-level: overrides logging.level when set
};

/// Parses argv; throws st::Error naming the bad argument.
TrainerArgs parse_trainer_args(const std::vector<std::string>& argv);

/// The usage text, including every configuration key with its doc.
std::string trainer_usage();

}  // namespace st::launch
