#pragma once
// The trainer's checkpoints: master weights and optimizer state of every rank
// as StateEntry lists, saved in the unified (Hugging Face) or sharded layout,
// synchronously or in a background thread, committed atomically
// (checkpoint/commit.h), with config.json and trainer_state.json beside them;
// and the way back: --resume and checkpoint.init_from.
#include <cstdint>
#include <memory>
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

/// Rejects bad checkpoint settings before any step runs: unknown
/// unified_checkpoint_config options, --resume auto without checkpoint.dir.
void check_checkpoint_config(const Config& config, const std::string& resume);

/// Owns the saves of one run. Every method is collective over `world` and
/// must be called by all ranks at the same point of the run.
class Checkpointer {
 public:
  Checkpointer(const Config& config, fsdp::ShardedModel& model, optim::Optimizer& optimizer, ProcessGroup& world,
               Logger& log);
  /// Waits for a save still being written (without committing it when the
  /// run is failing: only wait() commits).
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
  /// any of them was asked to stop (`stop_here`, e.g. SIGTERM) and commits a
  /// background save that every rank has finished writing. Returns the
  /// agreed stop flag.
  bool end_of_step(bool stop_here);

  /// Waits for a save in flight and commits it (call before exiting).
  void wait();

  /// `resume`: "never" -> nullopt; "auto" -> the newest complete checkpoint
  /// under checkpoint.dir (a broken `latest`, or a checkpoint that fails to
  /// load, e.g. on a checksum, is reported and the next older complete one
  /// tried), or nullopt when there is none; anything else is a checkpoint directory that
  /// must load. Fills master weights and optimizer state in place. When
  /// nothing is resumed and checkpoint.init_from is set, loads only the
  /// weights from there (a Hugging Face directory or a checkpoint) and keeps
  /// the fresh optimizer; that returns a point at step 0.
  std::optional<ResumePoint> load(const std::string& resume);

 private:
  struct InFlight;
  void finish_in_flight();
  ResumePoint load_from(const std::string& path, bool init);

  const Config& config_;
  fsdp::ShardedModel& model_;
  optim::Optimizer& optimizer_;
  ProcessGroup& world_;
  Logger& log_;
  std::unique_ptr<InFlight> in_flight_;
};

/// The Hugging Face config.json of a llama model config ("LlamaForCausalLM").
std::string hf_llama_config_json(const ModelConfig& model, std::string_view torch_dtype);

}  // namespace st::launch
