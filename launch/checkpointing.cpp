#include "launch/checkpointing.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/commit.h"
#include "checkpoint/fs.h"
#include "core/error.h"
#include "models/hf_config.h"

namespace st::launch {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kSkipModelWeight = "skip_save_model_weight";
constexpr std::string_view kMasterCompatible = "master_weight_compatible";
constexpr std::string_view kAllOptions = "enable_all_options";

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

bool has_option(const CheckpointConfig& c, std::string_view option) {
  for (const std::string& o : c.unified_checkpoint_config)
    if (o == option || o == kAllOptions) return true;
  return false;
}

DType model_dtype(const Config& config) {
  return config.fsdp.mixed_precision.param_dtype == PrecisionKind::BF16 ? DType::BF16 : DType::F32;
}

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

// The checkpoint subsystem reads and writes host memory. Entries that live on
// a GPU are copied to host tensors here (for a save this copy is also the
// snapshot); `copy_back` returns loaded values to the device.
bool any_on_device(const std::vector<StateEntry>& entries) {
  return std::any_of(entries.begin(), entries.end(), [](const StateEntry& e) { return !e.local.device().is_cpu(); });
}

std::vector<StateEntry> on_host(const std::vector<StateEntry>& entries) {
  std::vector<StateEntry> host = entries;
  for (StateEntry& e : host) {
    if (!e.local.device().is_cpu()) e.local = e.local.to(Device::cpu());
  }
  return host;
}

void copy_back(const std::vector<StateEntry>& device_entries, const std::vector<StateEntry>& host_entries) {
  for (size_t i = 0; i < device_entries.size(); ++i) {
    const Tensor& dst = device_entries[i].local;
    if (!dst.device().is_cpu()) dst.copy_from(host_entries[i].local);
  }
}

checkpoint::Layout layout_of(const CheckpointConfig& c) {
  return c.format == CheckpointFormat::Unified ? checkpoint::Layout::Unified : checkpoint::Layout::Sharded;
}

// What trainer_state.json records for a save of `options` after `step`.
checkpoint::TrainerState trainer_state_of(const Config& config, const checkpoint::SaveOptions& options, int64_t step,
                                          int64_t consumed, int64_t optimizer_steps, int world_size) {
  const bool unified = options.layout == checkpoint::Layout::Unified;
  checkpoint::TrainerState s;
  s.step = step;
  s.consumed_samples = consumed;
  s.optimizer_steps = optimizer_steps;
  s.world_size = world_size;
  s.sharding_strategy = std::string(to_string(config.fsdp.sharding_strategy));
  s.format = checkpoint::layout_name(options.layout);
  s.model_dtype = std::string(dtype_name(options.model_dtype));
  s.model_weights = unified && options.model_weights;
  s.master_weights = !unified || options.master_weights;
  s.seed = static_cast<int64_t>(config.train.seed);
  s.schedule = checkpoint::ScheduleState{std::string(to_string(config.optim.schedule.kind)), config.train.steps,
                                         optim::learning_rate(config.optim, step, config.train.steps)};
  s.config_yaml = to_yaml(config);
  return s;
}

// The checkpoint a user's path stands for (a root stands for the one `latest`
// names), said in the log when it was a root.
std::string resolve_checkpoint_dir(const std::string& path, Logger& log) {
  const checkpoint::ResolvedDir resolved = checkpoint::resolve_checkpoint_dir(path);
  if (resolved.fell_back) {
    log.warn0("{}", resolved.note);
  } else if (!resolved.note.empty()) {
    log.info0("{}", resolved.note);
  }
  return resolved.path;
}

[[noreturn]] void throw_misfit(const std::string& message) { throw checkpoint::Misfit(message, __FILE__, __LINE__); }

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? std::string(sep) : std::string()) + parts[i];
  return out;
}

// "a, b, c and 4 more".
std::string name_list(const std::set<std::string>& names, size_t shown = 6) {
  std::string out;
  size_t i = 0;
  for (const std::string& n : names) {
    if (i == shown) return out + format(" and {} more", names.size() - shown);
    out += (i++ ? ", " : "") + n;
  }
  return out;
}

// What `latest` names now, for messages about a save that did not commit.
std::string latest_note(const std::string& root) {
  std::ifstream in(fs::path(root) / checkpoint::latest_file_name);
  std::string name;
  if (in >> name) return format("latest still names {}", name);
  return "no checkpoint was committed before";
}

// The first non-finite value of loaded state, or an empty string.
std::string nonfinite_problem(const std::vector<StateEntry>& entries) {
  for (const StateEntry& e : entries) {
    const auto* p = static_cast<const std::byte*>(e.local.raw_data());
    const checkpoint::NonFinite bad =
        checkpoint::count_nonfinite(std::span(p, e.local.nbytes()), e.local.dtype(), e.begin);
    if (bad.any())
      return format("tensor '{}' ({}) holds {} NaN and {} Inf values (the first at element {})", e.fqn, e.kind, bad.nan,
                    bad.inf, bad.first);
  }
  return {};
}

// Fills `entries` from `catalog` (through host copies for device state) and
// refuses non-finite values; returns this rank's bytes.
int64_t load_into(const checkpoint::Catalog& catalog, std::vector<StateEntry>& entries, const std::string& path,
                  const checkpoint::LoadOptions& options) {
  int64_t bytes = 0;
  for (const StateEntry& e : entries) bytes += static_cast<int64_t>(e.local.nbytes());
  std::string bad;
  if (any_on_device(entries)) {
    std::vector<StateEntry> host = on_host(entries);
    checkpoint::load_entries(catalog, host, options);
    bad = nonfinite_problem(host);
    if (bad.empty()) copy_back(entries, host);
  } else {
    checkpoint::load_entries(catalog, entries, options);
    bad = nonfinite_problem(entries);
  }
  ST_CHECK(bad.empty(), "{}: {}", path, bad);
  return bytes;
}

}  // namespace

std::string effective_resume(const Config& config, const std::string& requested, bool overwrite) {
  if (overwrite) return "never";
  if (!requested.empty()) return requested;
  return config.checkpoint.dir.empty() ? "never" : "auto";
}

void check_checkpoint_config(const Config& config, const std::string& resume, bool overwrite, Logger& log) {
  const CheckpointConfig& c = config.checkpoint;
  for (const std::string& o : c.unified_checkpoint_config) {
    ST_CHECK(o == kSkipModelWeight || o == kMasterCompatible || o == kAllOptions,
             "checkpoint.unified_checkpoint_config: unknown option '{}'; the options are {}, {}, {}", o,
             kSkipModelWeight, kMasterCompatible, kAllOptions);
  }
  ST_CHECK(resume != "auto" || !c.dir.empty(), "--resume auto needs checkpoint.dir");
  ST_CHECK(!overwrite || !c.dir.empty(), "--overwrite needs checkpoint.dir (the directory to start over in)");
  if (!resume.empty() && resume != "auto" && resume != "never" && c.dir.empty())
    log.warn0("--resume {} without checkpoint.dir: this run saves no checkpoints (set checkpoint.dir to keep them)",
              resume);
  ST_CHECK(c.init_from.empty() || fs::exists(c.init_from), "checkpoint.init_from: '{}' does not exist", c.init_from);
}

struct Checkpointer::InFlight {
  int64_t step = 0;
  std::optional<checkpoint::StagedSave> staged;
  std::optional<checkpoint::PendingCheckpoint> pending;  // rank 0
  checkpoint::TrainerState state;                        // trainer_state.json, rank 0
  std::string hf_config;                                 // config.json, rank 0 (llama only)
  std::thread writer;
  std::atomic<bool> written{false};
  Clock::time_point start;
  double blocking_s = 0;
  int64_t total_bytes = 0;
};

std::optional<checkpoint::DirectoryLock> prepare_checkpoint_dir(const Config& config, ProcessGroup& world,
                                                                const std::string& resume, bool overwrite,
                                                                Logger& log) {
  const std::string& dir = config.checkpoint.dir;
  if (dir.empty()) return std::nullopt;
  // The probe first, so an unusable directory is reported as such rather than
  // as a lock file that cannot be created; its file names are this process's
  // own, so probing a directory another job holds disturbs nothing.
  run_on_every_rank(world, [&] {
    try {
      checkpoint::probe_writable_dir(dir, format(".probe-rank{}-pid{}", world.rank(), ::getpid()));
    } catch (const Error& e) {
      ST_FAIL("checkpoint.dir {}", e.message());
    }
  });
  std::optional<checkpoint::DirectoryLock> lock;
  run_on_every_rank(world, [&] {
    if (world.rank() != 0) return;
    try {
      lock.emplace(dir);
    } catch (const Error& e) {
      ST_FAIL("checkpoint.dir {}", e.message());
    }
    if (resume != "never") return;
    const std::vector<std::string> steps = checkpoint::step_dirs(dir);
    std::error_code ec;
    if (steps.empty() && !fs::exists(fs::symlink_status(fs::path(dir) / checkpoint::latest_file_name, ec))) return;
    if (overwrite) {
      const fs::path aside = checkpoint::move_checkpoints_aside(dir);
      log.info0("--overwrite: moved {} checkpoint(s) of the earlier run in {} to {}; starting from step 0",
                steps.size(), dir, aside.string());
      return;
    }
    ST_FAIL(
        "checkpoint.dir '{}' already holds checkpoints (the newest is {}); a new run there would mix with "
        "them. Continue that run with --resume auto, start over with --overwrite (moves them aside, deletes "
        "nothing), or choose another checkpoint.dir",
        dir, steps.empty() ? std::string(checkpoint::latest_file_name) : steps.back());
  });
  return lock;
}

Checkpointer::Checkpointer(const Config& config, fsdp::ShardedModel& model, optim::Optimizer& optimizer,
                           ProcessGroup& world, Logger& log, int64_t num_parameters)
    : config_(config), model_(model), optimizer_(optimizer), world_(world), log_(log) {
  const CheckpointConfig& c = config.checkpoint;
  if (c.dir.empty()) return;
  // What one save writes: F32 master weights (unless F32 model weights stand
  // in for them), the model weights (unified), and every optimizer state kind.
  const bool unified = c.format == CheckpointFormat::Unified;
  const bool skip_model = has_option(c, kSkipModelWeight);
  const DType dtype = model_dtype(config);
  int64_t per_param = 4 * static_cast<int64_t>(model.segments().empty() ? 0 : optimizer.state(0).size());
  if (unified && !skip_model) per_param += static_cast<int64_t>(dtype_size(dtype));
  if (!unified || checkpoint::unified_needs_master_files(!skip_model, dtype)) per_param += 4;
  const int64_t need = per_param * num_parameters;
  run_on_every_rank(world_, [&] {
    const int64_t free = checkpoint::free_bytes(c.dir);
    ST_CHECK(free >= need,
             "checkpoint.dir '{}' has {} free, less than one checkpoint of this run needs (about {}); free some "
             "space or choose another directory",
             c.dir, human_bytes(free), human_bytes(need));
    if (free < 2 * need && world_.rank() == 0)
      log_.warn("checkpoint.dir '{}' has {} free, room for fewer than two checkpoints of about {} each", c.dir,
                human_bytes(free), human_bytes(need));
  });
}

Checkpointer::~Checkpointer() {
  if (in_flight_ && in_flight_->writer.joinable()) in_flight_->writer.join();
}

void Checkpointer::save(int64_t step, int64_t consumed) {
  finish_in_flight();
  const CheckpointConfig& c = config_.checkpoint;
  auto f = std::make_unique<InFlight>();
  f->step = step;
  f->start = Clock::now();
  std::string tmp;
  run_on_every_rank(world_, [&] {
    if (world_.rank() != 0) return;
    f->pending.emplace(c.dir, step);
    tmp = f->pending->path().string();
  });
  // Every rank writes into rank 0's temporary directory, named with rank 0's pid.
  tmp = broadcast_string(world_, tmp);

  checkpoint::SaveOptions options;
  options.layout = layout_of(c);
  options.model_dtype = model_dtype(config_);
  options.model_weights = !has_option(c, kSkipModelWeight);
  options.master_weights = checkpoint::unified_needs_master_files(options.model_weights, options.model_dtype);
  std::vector<StateEntry> entries = training_state(model_, optimizer_, true);
  // Device state is copied to the host here, and that copy is already private to this save.
  const bool on_device = any_on_device(entries);
  if (on_device) entries = on_host(entries);
  options.snapshot = c.async && !on_device;
  f->staged.emplace(checkpoint::stage_save(tmp, entries, options, world_));
  f->total_bytes = f->staged->total_bytes();

  if (world_.rank() == 0) {
    f->state = trainer_state_of(config_, options, step, consumed, optimizer_.step_count(), world_.size());
    const bool bf16_model_files = f->state.model_weights && options.model_dtype == DType::BF16;
    if (config_.model.name == "llama")
      f->hf_config = models::hf_llama_config_json(config_.model,
                                                  models::hf_torch_dtype(bf16_model_files ? DType::BF16 : DType::F32));
  }
  f->blocking_s = since(f->start);
  InFlight* raw = f.get();
  in_flight_ = std::move(f);
  if (c.async) {
    raw->writer = std::thread([raw] {
      raw->staged->write();
      raw->written = true;
    });
    log_.info0(
        "checkpoint step {}: state copied to host in {:.3f} s (training waited this long); writing in the "
        "background",
        step, raw->blocking_s);
  } else {
    raw->staged->write();
    raw->written = true;
    finish_in_flight();
  }
}

void Checkpointer::finish_in_flight() {
  if (!in_flight_) return;
  std::unique_ptr<InFlight> f = std::move(in_flight_);
  if (f->writer.joinable()) f->writer.join();
  std::vector<std::string> files, deleted;
  try {
    files = f->staged->finish();
  } catch (const Error& e) {
    // Destroying `f` removes the temporary directory; `latest` never moved.
    const std::string message = format("checkpoint of step {} was not committed ({}): {}", f->step,
                                       latest_note(config_.checkpoint.dir), e.message());
    // The savers agree on their errors: then every rank holds this one message, printed once.
    if (dynamic_cast<const AgreedError*>(&e) != nullptr) throw AgreedError(message, __FILE__, __LINE__);
    throw Error(message, __FILE__, __LINE__);
  }
  run_on_every_rank(world_, [&] {
    if (world_.rank() != 0) return;
    const std::string dir = f->pending->path().string();
    checkpoint::write_file_synced(fs::path(dir) / checkpoint::trainer_state_file_name,
                                  checkpoint::trainer_state_text(f->state));
    files.emplace_back(checkpoint::trainer_state_file_name);
    if (!f->hf_config.empty()) {
      checkpoint::write_file_synced(fs::path(dir) / models::kHfConfigName, f->hf_config);
      files.emplace_back(models::kHfConfigName);
    }
    f->pending->commit(files);
    deleted = checkpoint::apply_retention(config_.checkpoint.dir, config_.checkpoint.keep_last);
  });
  const double secs = since(f->start);
  log_.info0("saved checkpoint {}/{} ({}{}): {} in {:.3f} s ({:.3f} GB/s), training blocked {:.3f} s",
             config_.checkpoint.dir, checkpoint::step_dir_name(f->step),
             checkpoint::layout_name(layout_of(config_.checkpoint)), config_.checkpoint.async ? ", async" : "",
             human_bytes(f->total_bytes), secs, static_cast<double>(f->total_bytes) / secs / 1e9,
             config_.checkpoint.async ? f->blocking_s : secs);
  if (!deleted.empty())
    log_.info0("checkpoint.keep_last {}: deleted {}", config_.checkpoint.keep_last, join(deleted, ", "));
}

int Checkpointer::end_of_step(int stop_signal) {
  const bool busy = in_flight_ && !in_flight_->written;
  Tensor flags = Tensor::from_vector(std::vector<int32_t>{stop_signal, busy ? 1 : 0}, {2});
  world_.all_reduce(flags, {.op = ReduceOp::Max}).wait();
  if (in_flight_ && flags.data<int32_t>()[1] == 0) finish_in_flight();
  return flags.data<int32_t>()[0];
}

void Checkpointer::wait() { finish_in_flight(); }

std::optional<ResumePoint> Checkpointer::load(const std::string& resume) {
  const CheckpointConfig& c = config_.checkpoint;
  if (resume == "auto") {
    std::optional<ResumePoint> point;
    const std::optional<std::string> loaded = checkpoint::resume_newest_loadable(
        c.dir, [&](const std::string& path) { point = load_from(path, false); },
        [&](const std::string& message) { log_.warn0("--resume auto: {}", message); });
    if (loaded) return point;
    log_.info0("--resume auto: no complete checkpoint in {}; starting from step 0", c.dir);
  } else if (!resume.empty() && resume != "never") {
    return load_from(resolve_checkpoint_dir(resume, log_), false);
  }
  if (c.init_from.empty()) return std::nullopt;
  return load_from(resolve_checkpoint_dir(c.init_from, log_), true);
}

namespace {

// (FQN, kind) of every entry on any rank: the fit of a checkpoint is judged on
// the whole model, identically on every rank.
std::set<std::pair<std::string, std::string>> all_entry_ids(const std::vector<StateEntry>& entries,
                                                            ProcessGroup& world) {
  json mine = json::array();
  for (const StateEntry& e : entries) mine.push_back({e.fqn, e.kind});
  std::set<std::pair<std::string, std::string>> ids;
  for (const std::string& text : all_gather_strings(world, mine.dump()))
    for (const json& id : json::parse(text)) ids.emplace(id[0].get<std::string>(), id[1].get<std::string>());
  return ids;
}

// Differences between a checkpoint's config.json and the run's model.* keys
// (none for a directory without one, or a model other than llama).
std::vector<std::string> config_differences(const std::string& dir, const ModelConfig& m) {
  const fs::path path = fs::path(dir) / models::kHfConfigName;
  std::error_code ec;
  if (m.name != "llama" || !fs::is_regular_file(path, ec)) return {};
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  ST_CHECK(in.good() || in.eof(), "cannot read {}", path.string());
  return models::hf_config_differences(text.str(), m, path.string());
}

}  // namespace

void Checkpointer::check_fit(const std::string& path, const checkpoint::Catalog& catalog,
                             const std::vector<StateEntry>& entries, bool init) {
  const std::set<std::pair<std::string, std::string>> needed = all_entry_ids(entries, world_);
  std::set<std::string> fqns, kinds{std::string(checkpoint::kModelKind), std::string(checkpoint::kMasterKind)};
  for (const auto& [fqn, kind] : needed) {
    fqns.insert(fqn);
    kinds.insert(kind);
  }
  std::set<std::string> missing, unexpected;
  for (const auto& [fqn, kind] : needed) {
    const bool from_model =
        kind == checkpoint::kMasterKind && catalog.tensors.contains({fqn, std::string(checkpoint::kModelKind)});
    if (!catalog.tensors.contains({fqn, kind}) && !from_model) missing.insert(fqn + " (" + kind + ")");
  }
  for (const auto& [id, stored] : catalog.tensors) {
    if (!fqns.contains(id.first))
      unexpected.insert(id.first);
    else if (!init && !kinds.contains(id.second))
      unexpected.insert(id.first + " (" + id.second + ")");
  }
  std::vector<std::string> config_diff;
  std::string error;
  try {
    config_diff = config_differences(path, config_.model);
  } catch (const Error& e) {
    error = e.message();
  }
  ST_CHECK(error.empty(), "{}", error);

  std::vector<std::string> problems;
  if (!config_diff.empty()) problems.push_back("its config.json differs from the run: " + join(config_diff, ", "));
  if (!unexpected.empty())
    problems.push_back(
        format("{} tensor(s) of the checkpoint are not in the model: {}", unexpected.size(), name_list(unexpected)));
  const bool strict = config_.checkpoint.strict;
  if (!missing.empty()) {
    problems.push_back(
        format("{} tensor(s) the run needs are missing from it: {}", missing.size(), name_list(missing)));
    const std::string message = format("checkpoint {} does not fit this run: {}", path, join(problems, "; "));
    // With a config.json that agrees, a missing tensor means a damaged
    // checkpoint (an older one may be whole); otherwise the model changed.
    if (config_diff.empty()) ST_FAIL("{}", message);
    throw_misfit(message);
  }
  if (!problems.empty() && strict)
    throw_misfit(
        format("checkpoint {} does not fit this run: {} (checkpoint.strict: false loads it anyway, "
               "ignoring these)",
               path, join(problems, "; ")));
  if (!problems.empty()) log_.warn0("checkpoint {} (checkpoint.strict: false): {}", path, join(problems, "; "));
}

ResumePoint Checkpointer::load_from(const std::string& path, bool init) {
  const CheckpointConfig& c = config_.checkpoint;
  const auto t0 = Clock::now();
  ResumePoint point{0, 0, path};
  checkpoint::TrainerState state;
  int64_t bytes = 0;
  checkpoint::Catalog catalog;
  std::vector<StateEntry> entries = training_state(model_, optimizer_, !init);
  // Nothing but indexes and headers is read before the fit is checked.
  run_on_every_rank(world_, [&] {
    if (!init) {
      state = checkpoint::read_trainer_state(path);
      point.step = state.step;
      point.consumed = state.consumed_samples;
    }
    catalog = checkpoint::read_catalog(path);
  });
  check_fit(path, catalog, entries, init);
  if (!init && point.step >= config_.train.steps) {
    throw_misfit(
        format("checkpoint {} is at step {}, the run ends at step {} (train.steps){}; raise train.steps "
               "(e.g. --steps {}) to train further",
               path, point.step, config_.train.steps, point.step == config_.train.steps ? ": this run is finished" : "",
               point.step + config_.train.steps));
  }
  run_on_every_rank(world_, [&] {
    checkpoint::LoadOptions options;
    options.verify = c.verify;
    options.verify_rank = world_.rank();
    options.verify_world = world_.size();
    // Starting from model weights (init_from) may always derive the master weights from them.
    options.master_from_model = init || has_option(c, kMasterCompatible);
    bytes = load_into(catalog, entries, path, options);
  });
  if (!init) optimizer_.set_step_count(state.optimizer_steps);
  Tensor total = Tensor::full({1}, static_cast<double>(bytes), DType::F32);
  world_.all_reduce(total).wait();
  const double secs = since(t0);
  const std::string read = human_bytes(static_cast<int64_t>(total.data<float>()[0]));
  if (init) {
    log_.info0("initialised the weights from {} ({} layout): {} read in {:.3f} s; fresh optimizer, step 0", path,
               catalog.format, read, secs);
  } else {
    // A unified save also holds the model weights for Hugging Face tools; a
    // resume reads the master weights instead, so it reads fewer bytes than were saved.
    const bool skipped_model = catalog.has_kind(checkpoint::kModelKind) && catalog.has_kind(checkpoint::kMasterKind);
    log_.info0("resumed from {} (step {}, {} layout, saved by {} rank(s) with {}): {} read in {:.3f} s{}", path,
               point.step, catalog.format, state.world_size,
               state.sharding_strategy.empty() ? std::string("?") : state.sharding_strategy, read, secs,
               skipped_model ? " (model weights not read: master weights are)" : "");
    log_schedule_change(state, point.step);
  }
  return point;
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

}  // namespace st::launch
