// The life cycle of a run's checkpoints (checkpoint.h): Saver (stage, write
// in the foreground or a background thread, commit, retention) and load
// (fit check, then load_entries), resume.
#include "checkpoint/checkpoint.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "checkpoint/commit.h"
#include "checkpoint/fs.h"
#include "core/error.h"
#include "core/watchdog.h"

namespace st::checkpoint {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? std::string(sep) : std::string()) + parts[i];
  return out;
}

// What `latest` names now, for messages about a save that did not commit.
std::string latest_note(const std::string& root) {
  // read_small_file: `latest` may be damaged, huge or a FIFO; this message must not block.
  const std::optional<std::string> text = read_small_file(fs::path(root) / kLatestFileName, nullptr);
  const std::string name = text ? trim_space(*text) : std::string();
  if (!name.empty() && name.find_first_of(" \t\r\n") == std::string::npos) return format("latest still names {}", name);
  return "no checkpoint was committed before";
}

// The watchdog's name for a save's phase (a frozen rank during a save is reported so).
// "1.7 MB in 0.055 s", with the rate ("2.10 GB in 1.500 s (1.40 GB/s)") only
// from kRateFromBytes on: a small save's time is fixed costs (directories,
// fsync, the commit), so its rate would say nothing about the disk.
std::string size_and_time(int64_t bytes, double seconds) {
  constexpr int64_t kRateFromBytes = 64 << 20;
  std::string s = format("{} in {:.3f} s", human_bytes(bytes), seconds);
  if (bytes >= kRateFromBytes && seconds > 0)
    s += format(" ({}/s)", human_bytes(std::llround(static_cast<double>(bytes) / seconds)));
  return s;
}

std::string save_phase(int64_t step, std::string_view what) {
  return format("the checkpoint save of step {} ({})", step, what);
}

}  // namespace

struct Saver::InFlight {
  int64_t step = 0;
  std::optional<StagedSave> staged;
  std::optional<PendingCheckpoint> pending;  // rank 0
  TrainerState state;                        // rank 0
  std::vector<ExtraFile> extra;              // rank 0
  std::thread writer;
  std::atomic<bool> written{false};
  Clock::time_point start;
  double blocking_s = 0;
  int64_t total_bytes = 0;
};

Saver::Saver(RunOptions options, ProcessGroup& group, Logger& log)
    : options_(std::move(options)), group_(group), log_(log) {
  options_.save.snapshot = options_.async;
}

Saver::~Saver() {
  if (in_flight_ && in_flight_->writer.joinable()) in_flight_->writer.join();
}

void Saver::save(std::span<const StateEntry> entries, TrainerState state, std::vector<ExtraFile> extra) {
  finish_in_flight();
  const Watchdog::Phase phase(group_.watchdog(), save_phase(state.step, "planning, copying the state"));
  auto f = std::make_unique<InFlight>();
  f->step = state.step;
  f->start = Clock::now();
  std::string tmp;
  run_on_every_rank(group_, [&] {
    if (!owns_root()) return;
    f->pending.emplace(options_.root, state.step);
    tmp = f->pending->path().string();
  });
  // Every rank writes into its root owner's temporary directory (rank 0's, or
  // on node-local disks that of its host's lowest rank), named with its pid.
  const StorageTopology& topo = options_.topology;
  if (topo.shared) {
    tmp = broadcast_string(group_, tmp);
  } else {
    const int host = topo.host_of_rank[static_cast<size_t>(group_.rank())];
    tmp = all_gather_strings(group_, tmp)[static_cast<size_t>(topo.ranks_of_host(host).front())];
  }
  f->staged.emplace(stage_save(tmp, entries, options_.save, group_, topo));
  f->total_bytes = f->staged->total_bytes();
  const SaveOptions& o = options_.save;
  const bool unified = o.layout == Layout::Unified;
  state.format = layout_name(o.layout);
  state.model_dtype = std::string(dtype_name(o.model_dtype));
  state.model_weights = unified && o.model_weights;
  state.master_weights = !unified || o.master_weights;
  f->state = std::move(state);
  f->extra = std::move(extra);
  f->blocking_s = since(f->start);
  InFlight* raw = f.get();
  in_flight_ = std::move(f);
  if (options_.async) {
    raw->writer = std::thread([raw] {
      raw->staged->write();
      raw->written = true;
    });
    log_.info0(
        "checkpoint step {}: state copied to host in {:.3f} s (training waited this long); writing in the "
        "background",
        raw->step, raw->blocking_s);
    return;
  }
  {
    const Watchdog::Phase writing(group_.watchdog(), save_phase(raw->step, "writing this rank's files"));
    raw->staged->write();
  }
  raw->written = true;
  finish_in_flight();
}

void Saver::finish_in_flight() {
  if (!in_flight_) return;
  std::unique_ptr<InFlight> f = std::move(in_flight_);
  const Watchdog::Phase phase(group_.watchdog(), save_phase(f->step, "finishing: checksums, indexes, commit"));
  if (f->writer.joinable()) f->writer.join();
  std::vector<std::string> files;
  RetentionResult retention;
  std::optional<int64_t> latest_kept;
  std::string moved_aside;
  try {
    files = f->staged->finish();
  } catch (const Error& e) {
    // Destroying `f` removes the temporary directory; `latest` never moved.
    const std::string message =
        format("checkpoint of step {} was not committed ({}): {}", f->step, latest_note(options_.root), e.message());
    // The savers agree on their errors: then every rank holds this one message, printed once.
    if (dynamic_cast<const AgreedError*>(&e) != nullptr) throw AgreedError(message, __FILE__, __LINE__);
    throw Error(message, __FILE__, __LINE__);
  }
  // Node-local roots: every host publishes its part before any `latest`
  // moves, and every `latest` moves before retention deletes anything, so a
  // kill at any moment leaves each host's `latest` on a step the hosts hold
  // complete between them. On one shared root the three phases are commit().
  const std::vector<std::string> elsewhere = f->staged->elsewhere();
  run_on_every_rank(group_, [&] {
    if (!owns_root()) return;
    const fs::path dir = f->pending->path();
    write_file_synced(dir / kTrainerStateFileName, trainer_state_text(f->state));
    files.emplace_back(kTrainerStateFileName);
    for (const ExtraFile& x : f->extra) {
      write_file_synced(dir / x.name, x.text);
      files.push_back(x.name);
    }
    moved_aside = keep_earlier_step(f->step);
    f->pending->publish(files, elsewhere);
    committed_.insert(f->step);
    damaged_.erase(f->step);  // what was damaged at this step is now this run's own save
  });
  run_on_every_rank(group_, [&] {
    if (!owns_root()) return;
    f->pending->point_latest();
    latest_kept = f->pending->latest_kept();
  });
  run_on_every_rank(group_, [&] {
    if (owns_root())
      retention = apply_retention(options_.root, {options_.keep_last, resumed_from_, committed_, damaged_});
  });
  const double secs = since(f->start);
  log_.info0("saved checkpoint {}/{} ({}{}): {}, training blocked {:.3f} s", options_.root, step_dir_name(f->step),
             layout_name(options_.save.layout), options_.async ? ", async" : "", size_and_time(f->total_bytes, secs),
             options_.async ? f->blocking_s : secs);
  if (!retention.deleted.empty())
    log_.info0("checkpoint.keep_last {}: deleted {}", options_.keep_last, join(retention.deleted, ", "));
  if (!moved_aside.empty())
    log_.warn0(
        "{} of an earlier run (newer than {}, where this run started) was moved to {}, not replaced: remove it "
        "when it is not needed",
        step_dir_name(f->step), step_dir_name(resumed_from_), moved_aside);
  warn_kept(retention.kept_damaged, latest_kept, f->step);
}

bool Saver::owns_root() const {
  return options_.topology.shared ? group_.rank() == 0 : options_.topology.leads_host(group_.rank());
}

std::string Saver::keep_earlier_step(int64_t step) {
  // A step newer than where the run started that the run did not write is
  // another way back (a damaged checkpoint being repaired, or one `latest`
  // did not name): moved aside, never overwritten.
  const fs::path target = fs::path(options_.root) / step_dir_name(step);
  std::error_code ec;
  if (step <= resumed_from_ || committed_.contains(step) || !fs::exists(fs::symlink_status(target, ec))) return {};
  fs::path aside = fs::path(options_.root) / format("replaced-{}-{}", step_dir_name(step), ::getpid());
  for (int n = 2; fs::exists(fs::symlink_status(aside, ec)); ++n)
    aside = fs::path(options_.root) / format("replaced-{}-{}-{}", step_dir_name(step), ::getpid(), n);
  rename_path(target, aside);
  return aside.string();
}

void Saver::warn_kept(const std::vector<std::string>& kept_damaged, std::optional<int64_t> latest_kept, int64_t step) {
  // Once per run each: the same warning at every save would bury the log.
  if (latest_kept && warned_.insert("latest").second)
    log_.warn0(
        "latest still names {}, newer than {} just saved: it does not move back while {} exists (repair it, or "
        "remove it when it is not needed; --overwrite starts over)",
        step_dir_name(*latest_kept), step_dir_name(step), step_dir_name(*latest_kept));
  if (options_.keep_last <= 0) return;
  for (const std::string& kept : kept_damaged) {
    if (!warned_.insert(kept).second) continue;
    log_.warn0(
        "checkpoint.keep_last {}: kept {}, which does not load; it is not counted and never deleted by "
        "retention: restore its files, or remove it once it is not needed",
        options_.keep_last, kept);
  }
}

void Saver::note_resume(int64_t step, std::map<int64_t, std::string> damaged) {
  resumed_from_ = step;
  damaged_ = std::move(damaged);
}

int Saver::poll(int value) {
  const bool busy = in_flight_ && !in_flight_->written;
  Tensor flags = Tensor::from_vector(std::vector<int32_t>{value, busy ? 1 : 0}, {2});
  group_.all_reduce(flags, {.op = ReduceOp::Max}).wait();
  if (in_flight_ && flags.data<int32_t>()[1] == 0) finish_in_flight();
  return flags.data<int32_t>()[0];
}

void Saver::wait() { finish_in_flight(); }

// ---- Loading -------------------------------------------------------------------

namespace {

// (FQN, kind) of every entry on any rank, with its global shape: the fit of
// a checkpoint is judged on the whole model, identically on every rank.
std::map<std::pair<std::string, std::string>, Shape> all_entry_ids(std::span<const StateEntry> entries,
                                                                   ProcessGroup& group) {
  nlohmann::json mine = nlohmann::json::array();
  for (const StateEntry& e : entries) mine.push_back({e.fqn, e.kind, e.global_shape});
  std::map<std::pair<std::string, std::string>, Shape> ids;
  for (const std::string& text : all_gather_strings(group, mine.dump()))
    for (const nlohmann::json& id : nlohmann::json::parse(text))
      ids.emplace(std::pair(id[0].get<std::string>(), id[1].get<std::string>()), id[2].get<Shape>());
  return ids;
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

struct Fit {
  std::set<std::string> missing, unexpected, reshaped;
};

Fit compare(const Catalog& catalog, const std::map<std::pair<std::string, std::string>, Shape>& needed,
            bool weights_only) {
  std::set<std::string> fqns, kinds{std::string(kModelKind), std::string(kMasterKind)};
  for (const auto& [id, shape] : needed) {
    fqns.insert(id.first);
    kinds.insert(id.second);
  }
  Fit fit;
  for (const auto& [id, shape] : needed) {
    const auto& [fqn, kind] = id;
    auto stored = catalog.tensors.find(id);
    if (stored == catalog.tensors.end() && kind == kMasterKind)
      stored = catalog.tensors.find({fqn, std::string(kModelKind)});  // masters may start from model weights
    if (stored == catalog.tensors.end())
      fit.missing.insert(fqn + " (" + kind + ")");
    else if (stored->second.shape != shape)
      fit.reshaped.insert(
          format("{} ({} in the checkpoint, {} in the model)", fqn, shape_str(stored->second.shape), shape_str(shape)));
  }
  for (const auto& [id, stored] : catalog.tensors) {
    if (!fqns.contains(id.first))
      fit.unexpected.insert(id.first);
    else if (!weights_only && !kinds.contains(id.second))
      fit.unexpected.insert(id.first + " (" + id.second + ")");
  }
  return fit;
}

// What does not fit, one phrase each.
std::vector<std::string> fit_problems(const Fit& fit, const std::vector<std::string>& config_diff) {
  std::vector<std::string> problems;
  if (!config_diff.empty()) problems.push_back("its config.json differs from the run: " + join(config_diff, ", "));
  if (!fit.reshaped.empty())
    problems.push_back(format("{} tensor(s) have another shape: {}", fit.reshaped.size(), name_list(fit.reshaped, 3)));
  if (!fit.unexpected.empty())
    problems.push_back(format("{} tensor(s) of the checkpoint are not in the model: {}", fit.unexpected.size(),
                              name_list(fit.unexpected)));
  if (!fit.missing.empty())
    problems.push_back(
        format("{} tensor(s) the run needs are missing from it: {}", fit.missing.size(), name_list(fit.missing)));
  return problems;
}

void check_fit(const std::string& dir, const Catalog& catalog, std::span<const StateEntry> entries,
               const FitCheck& check, ProcessGroup& group, Logger& log) {
  const Fit fit = compare(catalog, all_entry_ids(entries, group), check.weights_only);
  std::vector<std::string> config_diff;
  run_on_every_rank(group, [&] {
    if (check.config_differences) config_diff = check.config_differences(dir);
  });
  const std::vector<std::string> problems = fit_problems(fit, config_diff);
  if (problems.empty()) return;
  const std::string message = format("checkpoint {} does not fit this run: {}", dir, join(problems, "; "));
  // With a config.json that agrees and every shape right, a missing tensor
  // means a damaged checkpoint (an older one may be whole); otherwise the model changed.
  if (!fit.missing.empty() && config_diff.empty() && fit.reshaped.empty())
    throw AgreedError(message, __FILE__, __LINE__);
  const std::string hint = check.misfit_hint.empty() ? "" : "; " + check.misfit_hint;
  // Missing or reshaped tensors cannot be loaded at all: checkpoint.strict cannot help.
  if (!fit.missing.empty() || !fit.reshaped.empty()) throw Misfit(message + hint, __FILE__, __LINE__);
  if (check.strict)
    throw Misfit(format("{} (checkpoint.strict: false loads it anyway, ignoring these){}", message, hint), __FILE__,
                 __LINE__);
  log.warn0("checkpoint {} (checkpoint.strict: false): {}", dir, join(problems, "; "));
}

}  // namespace

Loaded load(std::span<StateEntry> entries, const std::string& dir, const LoadOptions& options, const FitCheck& fit,
            ProcessGroup& group, Logger& log) {
  const auto t0 = Clock::now();
  Loaded out;
  Catalog catalog;
  CheckedCheckpoint checked;
  // Nothing but the marker, indexes and headers is read before the fit is
  // checked, and nothing at all before check_checkpoint vouches for them: a
  // damaged checkpoint (an AgreedError, so --resume auto falls back) is
  // never mistaken for one that does not fit.
  run_on_every_rank(group, [&] {
    checked = require_checkpoint(dir);
    if (!fit.weights_only) out.state = read_trainer_state(dir);
    catalog = read_catalog(dir);
  });
  if (const std::string note = checked.unchecked_note(dir); !note.empty()) log.warn0("{}", note);
  check_fit(dir, catalog, entries, fit, group, log);
  if (!fit.weights_only && fit.check_state) {
    // Every rank judges the same file: a Misfit is thrown alike everywhere.
    fit.check_state(out.state);
  }
  LoadOptions o = options;
  o.refuse_nonfinite = true;
  load_entries(catalog, entries, o, group);
  int64_t bytes = 0;
  for (const StateEntry& e : entries) bytes += e.local.defined() ? static_cast<int64_t>(e.local.nbytes()) : 0;
  Tensor total = Tensor::full({1}, static_cast<double>(bytes), DType::F32);
  group.all_reduce(total).wait();
  out.bytes = static_cast<int64_t>(total.data<float>()[0]);
  out.format = catalog.format;
  out.skipped_model_weights = catalog.has_kind(kModelKind) && catalog.has_kind(kMasterKind);
  out.seconds = since(t0);
  return out;
}

namespace {

/// Refuses, agreed by every rank, a step directory that holds one host's part
/// of a node-local save while the run reads it as whole (checkpoint.dir
/// shared or unset): said before the loader trips over the first file that
/// is on another host.
void check_not_one_hosts_part(const std::string& what, const std::string& path, ProcessGroup& group) {
  std::string mine;
  try {
    const CompleteMarker marker = read_complete_marker(path);
    const std::string reason =
        marker.problem.empty() && !marker.elsewhere.empty() ? incomplete_reason(path, marker.step) : "";
    if (reason.starts_with("holds one host's part"))
      mine = format(
          "--resume {}: {} (as rank {} on host {} sees it) {}; or, when those hosts take part in this run, "
          "put checkpoint.dir on the hosts' own disks too, so that they read it together",
          what, path, group.rank(), host_name(), reason);
  } catch (const Error&) {
    // The loader reports an unreadable marker, naming it.
  }
  const std::vector<std::string> all =
      group.size() == 1 ? std::vector<std::string>{mine} : all_gather_strings(group, mine);
  for (const std::string& message : all)
    if (!message.empty()) throw AgreedError(message, __FILE__, __LINE__);
}

}  // namespace

AutoResumed resume(const std::string& what, const std::string& root,
                   const std::function<void(const std::string& dir)>& load_dir, Logger& log, ProcessGroup& group,
                   const StorageTopology& topology) {
  if (what == "auto") {
    AutoResumed resumed = resume_auto(
        root, load_dir, [&](const std::string& message) { log.warn0("--resume auto: {}", message); }, group, topology);
    if (!resumed.path)
      log.info0("--resume auto: no step directory in {}{}; starting from step 0", root, absolute_note(root));
    return resumed;
  }
  // On node-local disks every host holds part of a root's checkpoints, so a
  // root is read as --resume auto reads checkpoint.dir: the newest step the
  // hosts hold complete between them. (A step directory has no step
  // directories in it; every rank then agrees to go on below.)
  if (!topology.shared) {
    AutoResumed resumed = resume_auto(
        what, load_dir, [&](const std::string& message) { log.warn0("--resume {}: {}", what, message); }, group,
        topology);
    if (resumed.path) return resumed;
  }
  // The checkpoint a user's path stands for (a root stands for the one `latest` names).
  const ResolvedDir resolved = agree_checkpoint_dir(what, group);
  if (resolved.fell_back) {
    log.warn0("{}", resolved.note);
  } else if (!resolved.note.empty()) {
    log.info0("{}", resolved.note);
  }
  if (topology.shared) check_not_one_hosts_part(what, resolved.path, group);
  load_dir(resolved.path);
  return {resolved.path, {}};
}

}  // namespace st::checkpoint
