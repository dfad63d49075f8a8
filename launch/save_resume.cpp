#include "launch/save_resume.h"

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/commit.h"
#include "checkpoint/node_local.h"
#include "core/error.h"
#include "core/file.h"
#include "dataset/dataset.h"
#include "dataset/tokenizer.h"
#include "models/hf_config.h"
#include "models/model.h"

namespace st::launch {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Master weights plus every optimizer state buffer (with `optimizer_state`), as (FQN, kind) entries.
std::vector<StateEntry> training_state(fsdp::ShardedModel& model, optim::Optimizer& optimizer, bool optimizer_state) {
  std::vector<StateEntry> entries = model.master_entries();
  if (!optimizer_state) return entries;
  std::map<std::string, std::vector<Tensor>> by_kind;
  for (size_t i = 0; i < model.segments().size(); ++i) {
    for (auto& [kind, buffer] : optimizer.state(i)) by_kind[kind].push_back(buffer);
  }
  for (auto& [kind, buffers] : by_kind) {
    std::vector<StateEntry> more = model.shard_entries(buffers, kind);
    entries.insert(entries.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  }
  return entries;
}

// What trainer_state.json records for a save of `options` after `step`.
// (The checkpoint adds what it knows itself: layout and model weights.)
checkpoint::TrainerState trainer_state_of(const Config& config, int64_t step, int64_t consumed, int64_t optimizer_steps,
                                          int world_size) {
  checkpoint::TrainerState s;
  s.step = step;
  s.consumed_samples = consumed;
  s.optimizer_steps = optimizer_steps;
  s.world_size = world_size;
  s.sharding_strategy = std::string(to_string(config.fsdp.sharding_strategy));
  s.seed = static_cast<int64_t>(config.train.seed);
  s.schedule = checkpoint::ScheduleState{std::string(to_string(config.optim.schedule.kind)), config.train.steps,
                                         optim::learning_rate(config.optim, step, config.train.steps)};
  s.config_yaml = to_yaml(config);
  return s;
}

// data.tokenizer as Hugging Face keeps it beside a LLaMA model: the model
// file itself and the LlamaTokenizer settings (none without data.tokenizer).
std::vector<checkpoint::ExtraFile> tokenizer_files(const Config& config) {
  const std::optional<dataset::Tokenizer> tokenizer = dataset::load_data_tokenizer(dataset_spec(config));
  if (!tokenizer) return {};
  return {{std::string(dataset::kTokenizerModelName), tokenizer->model_bytes()},
          {std::string(dataset::kTokenizerConfigName),
           dataset::hf_tokenizer_config_json(*tokenizer, config.model.max_position_embeddings)},
          {std::string(dataset::kSpecialTokensMapName), dataset::hf_special_tokens_map_json(*tokenizer)}};
}

[[noreturn]] void throw_misfit(const std::string& message) { throw checkpoint::Misfit(message, __FILE__, __LINE__); }

/// The shortest text that reads back as `v` (what --set optim.lr=TEXT needs to
/// give the very rate the checkpoint's schedule ended at).
std::string shortest_text(double v) {
  std::array<char, 32> buf{};
  const auto end = std::to_chars(buf.data(), buf.data() + buf.size(), v).ptr;
  return std::string(buf.data(), end);
}

/// How to train on from a checkpoint at or past train.steps. When the saving
/// run's schedule was longer, its own train.steps continues it. Otherwise a
/// larger train.steps alone stretches the decay over the new length, so the
/// rate rises from where the run ended (log_schedule_change warns): hold the
/// checkpoint's rate with a constant schedule instead (warm-up is over, since
/// the step is past optim.schedule.warmup_steps).
std::string train_further_hint(const checkpoint::TrainerState& state, int64_t steps) {
  const int64_t more = state.step + steps;
  if (!state.schedule) return format("raise train.steps (e.g. --steps {}) to train further", more);
  const checkpoint::ScheduleState& schedule = *state.schedule;
  if (schedule.total_steps > state.step)
    return format("its run was set to end at step {}: --steps {} continues that schedule", schedule.total_steps,
                  schedule.total_steps);
  if (schedule.kind == "constant")
    return format("raise train.steps to train further: --steps {} (its constant schedule goes on at the same rate)",
                  more);
  if (!(schedule.next_lr > 0))
    return format(
        "raise train.steps and set a learning rate to train further: --steps {} --set "
        "optim.schedule.kind=constant --set optim.lr=LR (the {} schedule ended at learning rate 0)",
        more, schedule.kind);
  return format(
      "raise train.steps and hold its final learning rate to train further: --steps {} --set "
      "optim.schedule.kind=constant --set optim.lr={} (--steps alone stretches the {} schedule and "
      "the learning rate rises again)",
      more, shortest_text(schedule.next_lr), schedule.kind);
}

}  // namespace

std::string effective_resume(const Config& config, const std::string& requested, bool overwrite) {
  if (overwrite) return "never";
  if (!requested.empty()) return requested;
  return config.checkpoint.dir.empty() ? "never" : "auto";
}

void check_checkpoint_config(const Config& config, const std::string& resume, bool overwrite, Logger& log) {
  const CheckpointConfig& c = config.checkpoint;
  ST_CHECK(resume != "auto" || !c.dir.empty(), "--resume auto needs checkpoint.dir");
  ST_CHECK(!overwrite || !c.dir.empty(), "--overwrite needs checkpoint.dir (the directory to start over in)");
  if (!resume.empty() && resume != "auto" && resume != "never" && c.dir.empty())
    log.warn0("--resume {} without checkpoint.dir: this run saves no checkpoints (set checkpoint.dir to keep them)",
              resume);
  ST_CHECK(c.init_from.empty() || fs::exists(c.init_from), "checkpoint.init_from: '{}' does not exist", c.init_from);
}

checkpoint::RunRoot prepare_checkpoint_dir(const Config& config, ProcessGroup& world, const std::string& resume,
                                           bool overwrite, Logger& log) {
  const CheckpointConfig& c = config.checkpoint;
  if (c.dir.empty()) return {};
  return checkpoint::open_run_root(c.dir, c.shared, resume == "never", overwrite, world, log);
}

Checkpointer::Checkpointer(const Config& config, fsdp::ShardedModel& model, optim::Optimizer& optimizer,
                           ProcessGroup& world, Logger& log, int64_t num_parameters,
                           const checkpoint::StorageTopology& topology)
    : config_(config), model_(model), optimizer_(optimizer), world_(world), log_(log), topology_(topology) {
  const CheckpointConfig& c = config.checkpoint;
  if (c.dir.empty()) return;
  checkpoint::RunOptions run;
  run.root = c.dir;
  run.save.layout = c.format;
  run.save.model_dtype = config.fsdp.mixed_precision.param_dtype;
  run.save.model_weights = !c.unified_checkpoint_config.skip_model_weights();
  run.save.master_weights = checkpoint::unified_needs_master_files(run.save.model_weights, run.save.model_dtype);
  run.async = c.async;
  run.keep_last = c.keep_last;
  run.topology = topology;
  saver_.emplace(std::move(run), world, log);
  // What one save writes: F32 master weights (unless F32 model weights stand
  // in for them), the model weights (unified), and every optimizer state kind.
  const bool unified = c.format == checkpoint::Layout::Unified;
  const bool skip_model = c.unified_checkpoint_config.skip_model_weights();
  const DType dtype = config.fsdp.mixed_precision.param_dtype;
  int64_t per_param = 4 * static_cast<int64_t>(model.segments().empty() ? 0 : optimizer.state(0).size());
  if (unified && !skip_model) per_param += static_cast<int64_t>(dtype_size(dtype));
  if (!unified || checkpoint::unified_needs_master_files(!skip_model, dtype)) per_param += 4;
  checkpoint::check_free_space(c.dir, per_param * num_parameters, world_, log_);
  tokenizer_files_ = tokenizer_files(config);
}

Checkpointer::~Checkpointer() = default;

void Checkpointer::save(int64_t step, int64_t consumed) {
  checkpoint::TrainerState state = trainer_state_of(config_, step, consumed, optimizer_.step_count(), world_.size());
  std::vector<checkpoint::ExtraFile> extra;
  const checkpoint::SaveOptions& o = saver_->options().save;
  const bool bf16_model_files =
      o.layout == checkpoint::Layout::Unified && o.model_weights && o.model_dtype == DType::BF16;
  if (const auto hf_config = models::model_spec(config_.model.name).hf_config)
    extra.push_back({std::string(models::kHfConfigName),
                     hf_config(config_.model, models::hf_torch_dtype(bf16_model_files ? DType::BF16 : DType::F32))});
  extra.insert(extra.end(), tokenizer_files_.begin(), tokenizer_files_.end());
  saver_->save(training_state(model_, optimizer_, true), std::move(state), std::move(extra));
}

int Checkpointer::end_of_step(int stop_signal) {
  if (!saver_) {
    Tensor flag = Tensor::from_vector(std::vector<int32_t>{stop_signal}, {1});
    world_.all_reduce(flag, {.op = ReduceOp::Max}).wait();
    return flag.data<int32_t>()[0];
  }
  return saver_->poll(stop_signal);
}

void Checkpointer::wait() {
  if (saver_) saver_->wait();
}

std::optional<ResumePoint> Checkpointer::load(const std::string& resume) {
  const CheckpointConfig& c = config_.checkpoint;
  std::optional<ResumePoint> point;
  auto load_dir = [&](bool init) { return [&, init](const std::string& dir) { point = load_from(dir, init); }; };
  if (resume == "auto" || (!resume.empty() && resume != "never")) {
    checkpoint::AutoResumed resumed = checkpoint::resume(resume, c.dir, load_dir(false), log_, world_, topology_);
    if (resumed.path) {
      // Retention keeps the way back: nothing newer than this step, nothing damaged.
      if (saver_) saver_->note_resume(point->step, std::move(resumed.damaged));
      return point;
    }
  }
  if (c.init_from.empty()) return std::nullopt;
  checkpoint::resume(c.init_from, "", load_dir(true), log_, world_);
  return point;
}

namespace {

// Differences between a checkpoint's config.json and the run's model.* keys
// (none for a directory without one, or a model without a Hugging Face config).
std::vector<std::string> config_differences(const std::string& dir, const ModelConfig& m) {
  const fs::path path = fs::path(dir) / models::kHfConfigName;
  std::error_code ec;
  const auto differences = models::model_spec(m.name).hf_config_differences;
  if (!differences || !fs::is_regular_file(path, ec)) return {};
  return differences(read_file(path, "Hugging Face config"), m, path.string());
}

}  // namespace

ResumePoint Checkpointer::load_from(const std::string& path, bool init) {
  const CheckpointConfig& c = config_.checkpoint;
  checkpoint::FitCheck fit;
  fit.weights_only = init;
  fit.strict = c.strict;
  fit.config_differences = [&](const std::string& dir) { return config_differences(dir, config_.model); };
  fit.misfit_hint =
      init ? "checkpoint.init_from must hold weights of this model (model.*)"
      : c.dir.empty()
          // --resume PATH without checkpoint.dir: nothing of this run is in the way of a new one.
          ? std::string(
                "to keep this model, start a new run (leave out --resume); to resume, use the checkpoint's "
                "model.* settings")
          : format(
                "to keep this model, start a new run: --overwrite moves the checkpoints in {} aside, or set "
                "another checkpoint.dir; to resume, use the checkpoint's model.* settings",
                c.dir);
  fit.check_state = [&](const checkpoint::TrainerState& state) {
    if (state.step < config_.train.steps) return;
    throw_misfit(format("checkpoint {} is at step {}, the run ends at step {} (train.steps){}; {}", path, state.step,
                        config_.train.steps, state.step == config_.train.steps ? ": this run is finished" : "",
                        train_further_hint(state, config_.train.steps)));
  };
  checkpoint::LoadOptions options;
  options.verify = c.verify;
  // Starting from model weights (init_from) may always derive the master weights from them.
  options.master_from_model = init || c.unified_checkpoint_config.master_from_model_weights();
  std::vector<StateEntry> entries = training_state(model_, optimizer_, !init);
  // On node-local disks each host holds part of the step: load from a view
  // of the whole, reading the other hosts' data through their ranks.
  std::optional<checkpoint::NodeLocalStep> whole;
  if (!init && !topology_.shared) {
    whole.emplace(path, topology_, world_);
    options.file_readers = whole->readers();
  }
  const checkpoint::Loaded loaded = checkpoint::load(entries, whole ? whole->dir() : path, options, fit, world_, log_);
  const std::string read = human_bytes(loaded.bytes);
  if (init) {
    log_.info0("initialised the weights from {} ({} layout): {} read in {:.3f} s; fresh optimizer, step 0", path,
               loaded.format, read, loaded.seconds);
    return ResumePoint{0, 0, path};
  }
  const checkpoint::TrainerState& state = loaded.state;
  optimizer_.set_step_count(state.optimizer_steps);
  // A unified save also holds the model weights for Hugging Face tools; a
  // resume reads the master weights instead, so it reads fewer bytes than were saved.
  log_.info0("resumed from {}{} (step {}, {} layout, saved by {} rank(s) with {}): {} read in {:.3f} s{}", path,
             absolute_note(path), state.step, loaded.format, state.world_size,
             state.sharding_strategy.empty() ? std::string("?") : state.sharding_strategy, read, loaded.seconds,
             loaded.skipped_model_weights ? " (model weights not read: master weights are)" : "");
  log_schedule_change(state, state.step);
  log_data_change(state, path);
  return ResumePoint{state.step, state.consumed_samples, path};
}

void Checkpointer::log_schedule_change(const checkpoint::TrainerState& state, int64_t step) {
  if (!state.schedule) return;
  const double theirs = state.schedule->next_lr;
  const double ours = optim::learning_rate(config_.optim, step, config_.train.steps);
  const int64_t their_steps = state.schedule->total_steps;
  const std::string& their_kind = state.schedule->kind;
  const std::string our_kind(to_string(config_.optim.schedule.kind));
  if (their_steps == config_.train.steps && their_kind == our_kind && theirs == ours) return;
  const std::string change =
      format("the learning-rate schedule differs from the checkpoint's (train.steps {} -> {}, {} -> {})", their_steps,
             config_.train.steps, their_kind, our_kind);
  if (theirs == ours) {
    // Nothing jumps now; later steps follow this run's schedule.
    log_.info0("{}: step {} uses lr {:.3e} under both", change, step + 1, ours);
    return;
  }
  log_.warn0("{}: step {} uses lr {:.3e} under this run's schedule, {:.3e} under the checkpoint's", change, step + 1,
             ours, theirs);
}

namespace {

// train.seed and every data.* key of `config`, with their values as YAML writes them.
std::map<std::string, std::string> data_keys(Config config) {
  std::map<std::string, std::string> out;
  for (const ConfigKeyDoc& k : config_keys([&config](const KeyVisitor& v) { visit_keys(config, v); }))
    if (k.key == "train.seed" || k.key.starts_with("data.")) out[k.key] = k.default_value;
  return out;
}

}  // namespace

void Checkpointer::log_data_change(const checkpoint::TrainerState& state, const std::string& path) {
  if (state.config_yaml.empty()) return;  // an earlier version's checkpoint may not say
  Config theirs;
  try {
    // Not validated: data.path of the saving run need not exist any more.
    load_yaml([&theirs](const KeyVisitor& v) { visit_keys(theirs, v); }, state.config_yaml,
              (fs::path(path) / checkpoint::kTrainerStateFileName).string());
  } catch (const Error&) {
    return;  // keys of another version: nothing to compare them with
  }
  const std::map<std::string, std::string> before = data_keys(theirs), now = data_keys(config_);
  std::string changes;
  for (const auto& [key, value] : now) {
    const auto it = before.find(key);
    if (it != before.end() && it->second != value)
      changes += format("{}{} {} -> {}", changes.empty() ? "" : ", ", key, it->second, value);
  }
  if (changes.empty()) return;
  log_.warn0(
      "the data settings differ from the checkpoint's ({}): from step {} on, the run sees other samples than the "
      "checkpoint's run would have (the loss may jump)",
      changes, state.step + 1);
}

}  // namespace st::launch
