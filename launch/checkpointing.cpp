#include "launch/checkpointing.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "checkpoint/commit.h"
#include "checkpoint/sharded.h"
#include "core/error.h"

namespace st::launch {

namespace {

constexpr const char* kTrainerState = "trainer_state.json";

// Master weights plus every optimizer state buffer, as (FQN, kind) entries.
std::vector<StateEntry> training_state(fsdp::ShardedModel& model, optim::Optimizer& optimizer) {
  std::vector<StateEntry> entries = model.master_entries();
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

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

void check_checkpoint_config(const Config& config, const std::string& resume) {
  const CheckpointConfig& c = config.checkpoint;
  const bool used = !c.dir.empty() || (resume != "never" && !resume.empty());
  ST_CHECK(!used || c.format == CheckpointFormat::Sharded,
           "checkpoint.format: unified is not built yet (issue 5 in progress); set checkpoint.format: sharded");
  ST_CHECK(c.unified_checkpoint_config.empty(),
           "checkpoint.unified_checkpoint_config: not built yet (issue 5 in progress); remove it");
  ST_CHECK(c.init_from.empty(), "checkpoint.init_from: not built yet (issue 5 in progress); remove it");
  ST_CHECK(!c.async, "checkpoint.async: not built yet (issue 5 in progress); set it to false");
  ST_CHECK(resume != "auto" || !c.dir.empty(), "--resume auto needs checkpoint.dir");
}

void save_checkpoint(const Config& config, int64_t step, int64_t consumed, fsdp::ShardedModel& model,
                     optim::Optimizer& optimizer, ProcessGroup& world, Logger& log) {
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<checkpoint::PendingCheckpoint> pending;
  std::string tmp;
  if (world.rank() == 0) {
    pending.emplace(config.checkpoint.dir, step);
    tmp = pending->path().string();
  }
  // Every rank writes into rank 0's temporary directory, named with rank 0's pid.
  tmp = broadcast_string(world, tmp);

  std::vector<StateEntry> entries = training_state(model, optimizer);
  int64_t bytes = 0;
  for (const StateEntry& e : entries) bytes += static_cast<int64_t>(e.local.nbytes());
  checkpoint::save_sharded(tmp, entries, world);

  if (world.rank() == 0) {
    nlohmann::json state = {{"step", step},
                            {"consumed_samples", consumed},
                            {"optimizer_steps", optimizer.step_count()},
                            {"world_size", world.size()},
                            {"sharding_strategy", std::string(to_string(config.fsdp.sharding_strategy))},
                            {"format", "sharded"},
                            {"config", to_yaml(config)}};
    const std::string path = tmp + "/" + kTrainerState;
    std::ofstream out(path);
    out << state.dump(2) << "\n";
    out.close();
    ST_CHECK(out.good(), "cannot write {}", path);
    std::vector<std::string> files{std::string(checkpoint::kShardedIndexName), kTrainerState};
    for (int r = 0; r < world.size(); ++r) files.push_back(checkpoint::shard_file_name(r, world.size()));
    pending->commit(files);
    checkpoint::apply_retention(config.checkpoint.dir, config.checkpoint.keep_last);
  }
  world.barrier().wait();
  Tensor total = Tensor::full({1}, static_cast<double>(bytes), DType::F32);
  world.all_reduce(total).wait();
  const double secs = since(t0);
  log.info0("saved checkpoint {}/{}: {:.2f} MB in {:.3f} s ({:.2f} GB/s)", config.checkpoint.dir,
            checkpoint::step_dir_name(step), total.data<float>()[0] / 1e6, secs, total.data<float>()[0] / secs / 1e9);
}

std::optional<ResumePoint> load_checkpoint(const Config& config, const std::string& resume, fsdp::ShardedModel& model,
                                           optim::Optimizer& optimizer, ProcessGroup& world, Logger& log) {
  if (resume.empty() || resume == "never") return std::nullopt;
  std::string path = resume;
  if (resume == "auto") {
    std::optional<checkpoint::ResumeChoice> choice = checkpoint::choose_resume(config.checkpoint.dir);
    if (!choice) {
      log.info0("--resume auto: no complete checkpoint in {}; starting from step 0", config.checkpoint.dir);
      return std::nullopt;
    }
    if (!choice->note.empty()) log.warn0("--resume auto: {}", choice->note);
    path = choice->path;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string state_path = path + "/" + kTrainerState;
  std::ifstream in(state_path);
  ST_CHECK(in.good(), "cannot read {} (is {} a checkpoint directory?)", state_path, path);
  nlohmann::json state;
  try {
    in >> state;
  } catch (const nlohmann::json::exception& e) {
    ST_FAIL("{} is not valid JSON: {}", state_path, e.what());
  }
  ST_CHECK(state.contains("step") && state.contains("consumed_samples") && state.contains("optimizer_steps"),
           "{} lacks step, consumed_samples or optimizer_steps", state_path);

  std::vector<StateEntry> entries = training_state(model, optimizer);
  checkpoint::load_sharded(path, entries, config.checkpoint.verify ? checkpoint::Verify::Yes : checkpoint::Verify::No);
  optimizer.set_step_count(state["optimizer_steps"].get<int64_t>());
  ResumePoint point{state["step"].get<int64_t>(), state["consumed_samples"].get<int64_t>(), path};
  world.barrier().wait();
  log.info0("resumed from {} (step {}, saved by {} rank(s) with {}) in {:.3f} s", path, point.step,
            state.value("world_size", 0), state.value("sharding_strategy", std::string("?")), since(t0));
  return point;
}

}  // namespace st::launch
