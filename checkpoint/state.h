#pragma once
// trainer_state.json: what a checkpoint records about the run that saved it.
// This file is its one reader and writer; the trainer, the ckpt tool and the
// tests all go through it, so the two binaries cannot drift apart.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace st::checkpoint {

/// The learning-rate schedule of the saving run, so a resume can say when
/// its own schedule differs.
struct ScheduleState {
  std::string kind;         // "cosine", "linear", "constant"
  int64_t total_steps = 0;  // train.steps of the saving run
  double next_lr = 0;       // the rate that run would have used for step + 1
};

struct TrainerState {
  int64_t step = 0;               // optimizer steps completed (the checkpoint's step)
  int64_t consumed_samples = 0;   // the sampler's position: samples of all ranks so far
  int64_t optimizer_steps = 0;    // the optimizer's own count (bias correction)
  int64_t world_size = 0;         // ranks of the saving run
  std::string sharding_strategy;  // e.g. "FULL_SHARD"
  std::string format;             // "unified" or "sharded"
  std::string model_dtype;        // dtype of the model-* weights: "F32" or "BF16"
  bool model_weights = false;     // model-* files hold the compute-dtype weights
  bool master_weights = true;     // master_weights-* (or F32 model-*) hold FP32 masters
  int64_t seed = 0;               // train.seed (the sampler is a function of seed and position)
  std::optional<ScheduleState> schedule;
  std::string config_yaml;  // the saving run's resolved configuration
};

/// trainer_state.json's text for `state` (JSON, keys sorted, 2-space indent).
std::string trainer_state_text(const TrainerState& state);
/// Parses trainer_state.json's text; `where` names the file in errors. step,
/// consumed_samples and optimizer_steps must be integers in [0, 2^53): a
/// negative or overflowing value is a corrupt checkpoint, named with the key.
/// Other fields are optional (older files lack some) and take the defaults.
TrainerState parse_trainer_state(const std::string& text, const std::string& where);
/// Reads dir/trainer_state.json; throws naming the file when it is missing,
/// unreadable, not JSON or corrupt.
TrainerState read_trainer_state(const std::filesystem::path& dir);
/// The same, or nullopt when the directory has no trainer_state.json (a plain
/// Hugging Face model directory).
std::optional<TrainerState> read_trainer_state_if_present(const std::filesystem::path& dir);

}  // namespace st::checkpoint
