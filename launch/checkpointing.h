#pragma once
// Saving and resuming training state: master weights and optimizer state of
// every rank as StateEntry lists, written in the DCP-style sharded layout and
// committed atomically (checkpoint/commit.h), plus trainer_state.json.
#include <cstdint>
#include <optional>
#include <string>

#include "core/comm.h"
#include "core/config.h"
#include "core/log.h"
#include "fsdp/fsdp.h"
#include "optim/optimizer.h"

namespace st::launch {

/// Where a run continues from.
struct ResumePoint {
  int64_t step = 0;      // completed optimizer steps
  int64_t consumed = 0;  // samples consumed (the sampler's position)
  std::string path;      // the checkpoint directory loaded
};

/// Saves step `step` into checkpoint.dir (collective). Only the sharded layout
/// is written so far; checkpoint.format: unified is rejected before training
/// starts (check_checkpoint_config).
void save_checkpoint(const Config& config, int64_t step, int64_t consumed, fsdp::ShardedModel& model,
                     optim::Optimizer& optimizer, ProcessGroup& world, Logger& log);

/// `resume`: "never" -> nullopt; "auto" -> the newest complete checkpoint under
/// checkpoint.dir (nullopt when there is none; a broken `latest` is reported
/// and skipped); anything else is a checkpoint directory that must load.
/// Fills master weights and optimizer state in place (collective).
std::optional<ResumePoint> load_checkpoint(const Config& config, const std::string& resume, fsdp::ShardedModel& model,
                                           optim::Optimizer& optimizer, ProcessGroup& world, Logger& log);

/// Rejects what is configured but not built yet, before any step runs.
void check_checkpoint_config(const Config& config, const std::string& resume);

}  // namespace st::launch
