#pragma once
// The whole run configuration (configs/*.yaml): one section per layer, each
// owned by its layer (model.* models/config.h, optim.* optim/config.h, fsdp.*
// fsdp/config.h, checkpoint.* checkpoint/config.h, data.* dataset/config.h),
// plus the sections the launcher itself owns, declared here: train.*, eval.*,
// comm.* and logging.*.
//
// The YAML keys are the field names, nested by section
// ("fsdp.mixed_precision.param_dtype"). Loading is strict (core/config.h); `--set
// key=value` overrides go through the same parser. config_keys() lists every
// key with its type, default and doc; the README's configuration reference is
// generated from it.
//
// One field per line with its doc comment: tests/unit/test_config.cpp checks each
// comment against the doc string in visit_keys(), so the layout is kept as written.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/config.h"
#include "core/config.h"
#include "dataset/config.h"
#include "fsdp/config.h"
#include "models/config.h"
#include "optim/config.h"

namespace st {

enum class DeviceKind : uint8_t { Cpu, Cuda, Auto };

/// YAML spellings: "cpu" | "cuda" | "auto".
std::span<const Named<DeviceKind>> names_of(DeviceKind);

// clang-format off
struct TrainConfig {
  int64_t steps = 100;                 // optimizer steps in the run (the LR schedule follows it)
  int64_t global_batch_size = 8;       // sequences per optimizer step, over all ranks
  int64_t micro_batch_size = 1;        // sequences per forward/backward on one rank
  int64_t seq_len = 128;               // tokens per sequence
  uint64_t seed = 1234;                // seeds init, data order and synthetic data
  DeviceKind device = DeviceKind::Auto;  // cpu | cuda | auto (cuda when a GPU is visible)
  int64_t threads = 0;                 // CPU threads per rank; 0 = the cores this rank may use

  /// Throws st::Error naming the key (checks that need the world size are the trainer's, at start-up).
  void validate() const;
  bool operator==(const TrainConfig&) const = default;
};

// Validation data: data.val_path, data.val_fraction, or for synthetic data
// (and the toy model's features) generated samples that training never sees.
struct EvalConfig {
  int64_t interval = 0;                // evaluate every N steps and after the last step; 0 = never
  int64_t batches = 4;                 // global batches per evaluation: the first ones of the validation data, in order
  int64_t sample_tokens = 0;           // print a sample of this many tokens generated from sample_prompt at each evaluation; 0 = none
  std::string sample_prompt = "The";   // the sample's prompt, encoded with data.tokenizer (or as bytes)
  double sample_temperature = 0.8;     // the sample's temperature (0 = greedy); seeded by train.seed

  void validate() const;
  bool operator==(const EvalConfig&) const = default;
};

struct CommConfig {
  double timeout_s = 600;              // abort the job when a collective makes no progress for this long; 0 disables the watchdog

  void validate() const;
  bool operator==(const CommConfig&) const = default;
};

struct LoggingConfig {
  int64_t interval = 1;                // print a step line every N steps
  std::string metrics_file;            // append one JSON object per step (and a line where each run begins); empty disables
  std::string run_name;                // names the run in logging.plot's title and legend and in the metrics file; empty: checkpoint.dir's last component, else logging.metrics_file's name without extension
  std::string level = "info";          // debug | info | warn | error
  bool profile = false;                // print where each step's time went (phases, GEMM, ops, collective waits) and a summary table at the end; same as --profile
  bool plot = false;                   // rank 0 redraws the plot program's four panels into logging.metrics_file + .svg at each evaluation, at the end of the run and, without evaluations, every checkpoint.interval steps (every 100 logged steps when that is 0)

  void validate() const;
  bool operator==(const LoggingConfig&) const = default;
};
// clang-format on

struct Config {
  ModelConfig model;
  TrainConfig train;
  DataConfig data;
  EvalConfig eval;
  OptimConfig optim;
  FsdpConfig fsdp;
  CheckpointConfig checkpoint;
  CommConfig comm;
  LoggingConfig logging;

  /// Each section's validate(), then the rules between sections
  /// (train.seq_len against the model, eval.interval against the validation
  /// data); throws st::Error naming the key.
  void validate() const;

  /// Field-by-field equality (e.g. a resumed run against its checkpoint's config).
  bool operator==(const Config&) const = default;
};

/// Every key of every section, with its full dotted name, in to_yaml() order.
void visit_keys(Config& c, const KeyVisitor& v);

/// What the dataset library needs of `config` (data.*, model.name and
/// vocab_size, train.seq_len and seed).
DatasetSpec dataset_spec(const Config& config);

/// logging.run_name, or when it is empty the last component of
/// checkpoint.dir, else the name of logging.metrics_file without its
/// extension ("" without either).
std::string run_name(const Config& config);

/// Every key, for help text and docs/configuration.md.
std::vector<ConfigKeyDoc> config_keys();

/// Loads `path`, applies `overrides` ("key=value", later wins), validates.
/// Errors name the file as `path` was given ("llama.yaml:7", "configs/toy.yaml:3").
Config load_config(const std::string& path, std::span<const std::string> overrides = {});
/// The same from YAML text; `source_name` stands in for the file name in errors.
Config load_config_from_string(std::string_view yaml, std::string_view source_name,
                               std::span<const std::string> overrides = {});
/// Applies one "key=value" override (value parsed as YAML) without validating.
void apply_override(Config& config, std::string_view assignment);
/// The resolved configuration as YAML (loadable again by load_config).
std::string to_yaml(const Config& config);

}  // namespace st
