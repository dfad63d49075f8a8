#pragma once
// The trainer's checkpoints: master weights and optimizer state of every rank
// as StateEntry lists, saved in the unified (Hugging Face) or sharded layout,
// synchronously or in a background thread, committed atomically
// (checkpoint/commit.h), with config.json, trainer_state.json and the
// tokenizer (data.tokenizer) beside them, so that a unified checkpoint is a
// complete Hugging Face LLaMA directory; and the way back: --resume and checkpoint.init_from.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/dir_guard.h"
#include "checkpoint/state.h"
#include "core/comm.h"
#include "core/log.h"
#include "fsdp/fsdp.h"
#include "launch/config.h"
#include "optim/optimizer.h"

namespace st::launch {

/// Where a run continues from.
struct ResumePoint {
  int64_t step = 0;      // completed optimizer steps
  int64_t consumed = 0;  // samples consumed (the sampler's position)
  std::string path;      // the checkpoint directory loaded
};

/// What --resume means for this run: `requested` when given; otherwise auto
/// when checkpoint.dir is set (so a requeued job continues instead of starting
/// over) and never without one. --overwrite means never.
std::string effective_resume(const Config& config, const std::string& requested, bool overwrite);

/// Rejects bad checkpoint settings before any step runs: unknown
/// unified_checkpoint_config options, an explicit --resume auto or
/// --overwrite without checkpoint.dir; warns that --resume PATH without
/// checkpoint.dir saves nothing.
void check_checkpoint_config(const Config& config, const std::string& requested_resume, bool overwrite, Logger& log);

/// Start-up checks of checkpoint.dir, before the model is built, so a run that
/// could not save fails in its first second (checkpoint::open_run_root): every
/// rank creates the directory and writes, fsyncs and removes a probe file; the
/// ranks find out whether they share it or each host has its own
/// (checkpoint.shared); the owner of each root takes its lock (held by the
/// returned object for the run: a second job on the same directory fails
/// here). Collective; every rank throws the same error, naming checkpoint.dir.
/// Then, when `resume` is never and the directory already holds checkpoints:
/// with `overwrite` they are moved aside (checkpoint::move_checkpoints_aside),
/// otherwise every rank fails naming the newest one, so that two runs never
/// mix in one directory. Empty (no lock, a shared topology) without checkpoint.dir.
checkpoint::RunRoot prepare_checkpoint_dir(const Config& config, ProcessGroup& world, const std::string& resume,
                                           bool overwrite, Logger& log);

/// Owns the saves of one run. Every method is collective over `world` and
/// must be called by all ranks at the same point of the run.
class Checkpointer {
 public:
  /// Checks the free space under checkpoint.dir against the size of one
  /// checkpoint of `num_parameters` (an error below 1x, a warning below 2x).
  /// `topology`: whether the ranks share checkpoint.dir (prepare_checkpoint_dir's finding).
  Checkpointer(const Config& config, fsdp::ShardedModel& model, optim::Optimizer& optimizer, ProcessGroup& world,
               Logger& log, int64_t num_parameters, const checkpoint::StorageTopology& topology);
  /// Waits for a save still being written (without committing it when the
  /// run is failing: only wait() and end_of_step() commit).
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  /// Saves the state after `step` into checkpoint.dir. First finishes the
  /// previous save. Synchronous: returns when the checkpoint is committed.
  /// checkpoint.async: returns once the state is copied to host memory; the
  /// files are written by a background thread and committed by a later
  /// end_of_step(), save() or wait().
  void save(int64_t step, int64_t consumed);

  /// Once per step, after the optimizer step: agrees over all ranks whether
  /// any of them was asked to stop (`stop_signal`: the signal number, 0 for
  /// none) and commits a background save that every rank has finished
  /// writing. Returns the largest signal number of any rank (0: no stop).
  int end_of_step(int stop_signal);

  /// Waits for a save in flight and commits it (call before exiting).
  void wait();

  /// `resume`: "never" -> nullopt; "auto" -> the checkpoint every rank agrees
  /// on under checkpoint.dir (checkpoint/resume.h: a broken `latest`, or a
  /// checkpoint that fails to load for a data reason: checksum, shape,
  /// non-finite values, a damaged file or trainer_state.json, is reported and
  /// the next older complete one tried, each at most once), nullopt only when
  /// checkpoint.dir holds no step directory, an error when it holds some but
  /// none loads; anything else is a checkpoint directory that must load. Fills master weights and
  /// optimizer state in place. When nothing is resumed and
  /// checkpoint.init_from is set, loads only the weights from there (a Hugging
  /// Face directory or a checkpoint) and keeps the fresh optimizer; that
  /// returns a point at step 0.
  /// Before any tensor is read, the checkpoint is compared with the run
  /// (never a reason to fall back): tensors the model needs but the
  /// checkpoint lacks are an error; tensors the model lacks and a config.json
  /// that disagrees with model.* are errors too unless checkpoint.strict is
  /// false (then warnings); a checkpoint at or past train.steps is an error.
  std::optional<ResumePoint> load(const std::string& resume);

 private:
  ResumePoint load_from(const std::string& path, bool init);
  // Warns when train.steps or the schedule kind differs from the checkpoint's,
  // with the learning rate of the next step under both.
  void log_schedule_change(const checkpoint::TrainerState& state, int64_t step);
  // Warns when train.seed or a data.* key differs from the checkpoint's run
  // (the samples that follow are not the ones that run would have seen).
  void log_data_change(const checkpoint::TrainerState& state, const std::string& path);

  const Config& config_;
  fsdp::ShardedModel& model_;
  optim::Optimizer& optimizer_;
  ProcessGroup& world_;
  Logger& log_;
  std::optional<checkpoint::Saver> saver_;  // when checkpoint.dir is set
  checkpoint::StorageTopology topology_;    // whether the ranks share checkpoint.dir
  // data.tokenizer's tokenizer.model (byte for byte), tokenizer_config.json and
  // special_tokens_map.json, written into every checkpoint beside config.json.
  std::vector<checkpoint::ExtraFile> tokenizer_files_;
};

}  // namespace st::launch
