#include "checkpoint/commit.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "checkpoint/checksum.h"
#include "checkpoint/fs.h"
#include "checkpoint/state.h"
#include "core/error.h"
#include "core/test_hook.h"

namespace st::checkpoint {

namespace fs = std::filesystem;

namespace {

constexpr std::array<std::string_view, 13> kStageNames = {
    "temp_created",      "commit_begin",   "files_synced", "marker_written",   "marker_synced",
    "temp_dir_synced",   "renamed",        "root_synced",  "old_step_removed", "latest_tmp_written",
    "latest_tmp_synced", "latest_renamed", "committed"};

constexpr std::string_view kLatestTmpName = ".latest.tmp";
constexpr std::string_view kTmpPrefix = ".tmp-";

void remove_tree(const fs::path& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
  ST_CHECK(!ec, "cannot remove {}: {}", path.string(), ec.message());
}

std::optional<int64_t> latest_step(const fs::path& root) {
  auto text = read_small_file(root / kLatestFileName);
  if (!text) return std::nullopt;
  return parse_step_dir_name(trim_space(*text));
}

}  // namespace

std::span<const std::string_view> commit_stages() { return kStageNames; }

PendingCheckpoint::PendingCheckpoint(fs::path root, int64_t step, CommitHook hook)
    : root_(std::move(root)), step_(step), hook_(std::move(hook)) {
  std::error_code ec;
  fs::create_directories(root_, ec);
  ST_CHECK(!ec, "cannot create checkpoint directory {}: {}", root_.string(), ec.message());
  fs::path tmp = root_ / format("{}{}-{}", kTmpPrefix, step_dir_name(step), ::getpid());
  // Same name means same pid: a previous process that died before cleaning up.
  remove_tree(tmp);
  ST_CHECK(::mkdir(tmp.c_str(), 0755) == 0, "cannot create {}: {}", tmp.string(), errno_text());
  path_ = std::move(tmp);
  stage("temp_created");
}

PendingCheckpoint::PendingCheckpoint(PendingCheckpoint&& other) noexcept
    : root_(std::move(other.root_)),
      path_(std::move(other.path_)),
      step_(other.step_),
      hook_(std::move(other.hook_)),
      committed_(other.committed_),
      latest_kept_(other.latest_kept_),
      latest_pointed_(other.latest_pointed_) {
  other.path_.clear();
  other.committed_ = true;  // the moved-from object owns nothing to clean up
}

PendingCheckpoint::~PendingCheckpoint() {
  if (committed_ || path_.empty()) return;
  std::error_code ec;  // a destructor must not throw; debris is removed by apply_retention
  fs::remove_all(path_, ec);
}

fs::path PendingCheckpoint::final_path() const { return root_ / step_dir_name(step_); }

void PendingCheckpoint::stage(std::string_view name) const {
  if (hook_) hook_(name);
  test_pause_point(name, step_);
}

fs::path PendingCheckpoint::move_into_place() const {
  const fs::path target = final_path();
  std::error_code ec;
  const bool replacing = fs::exists(target, ec);
  ST_CHECK(!ec, "cannot inspect {}: {}", target.string(), ec.message());
  if (!replacing) {
    rename_path(path_, target);
    return {};
  }
  // Swapping keeps a complete step-NNNNNN in place at every instant.
  if (::renameat2(AT_FDCWD, path_.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) return path_;
  ST_CHECK(errno == EINVAL || errno == ENOSYS || errno == ENOTSUP, "cannot exchange {} with {}: {}", path_.string(),
           target.string(), errno_text());
  const fs::path old_copy = root_ / format("{}replaced-{}-{}", kTmpPrefix, step_dir_name(step_), ::getpid());
  remove_tree(old_copy);
  rename_path(target, old_copy);
  rename_path(path_, target);
  return old_copy;
}

void PendingCheckpoint::publish(const std::vector<std::string>& files_written,
                                const std::vector<std::string>& elsewhere) {
  ST_CHECK(!committed_, "checkpoint {} was already committed", final_path().string());
  stage("commit_begin");

  const std::string marker = complete_marker_text(path_, step_, files_written, elsewhere);
  stage("files_synced");
  write_file_synced(path_ / kCompleteMarkerName, marker, [&] { stage("marker_written"); });
  stage("marker_synced");
  // The directory entries (files and marker) must be durable before the rename
  // publishes them; otherwise a power loss could leave a step dir without them.
  fsync_path(path_, PathKind::Directory);
  stage("temp_dir_synced");

  const fs::path old_copy = move_into_place();  // where a replaced checkpoint went, to delete after the swap
  committed_ = true;                            // from here the temporary directory no longer holds our files
  stage("renamed");
  fsync_path(root_, PathKind::Directory);
  stage("root_synced");
  if (!old_copy.empty()) remove_tree(old_copy);
  stage("old_step_removed");
}

void PendingCheckpoint::commit(const std::vector<std::string>& files_written) {
  publish(files_written);
  point_latest();
}

void PendingCheckpoint::point_latest() {
  ST_CHECK(committed_ && !latest_pointed_, "latest of {}: publish() first, and once", final_path().string());
  latest_pointed_ = true;
  // `latest` never moves back past a step that is still there: that one may be
  // a damaged checkpoint the user means to repair (only --overwrite starts over).
  if (const std::optional<int64_t> current = latest_step(root_); current && *current > step_) {
    std::error_code exists_ec;
    if (fs::exists(fs::symlink_status(root_ / step_dir_name(*current), exists_ec))) {
      latest_kept_ = *current;
      for (std::string_view name : {"latest_tmp_written", "latest_tmp_synced", "latest_renamed", "committed"})
        stage(name);
      return;
    }
  }
  const fs::path latest = root_ / kLatestFileName;
  try {
    fs::path latest_tmp = root_ / kLatestTmpName;
    write_file_synced(latest_tmp, step_dir_name(step_) + "\n", [&] { stage("latest_tmp_written"); });
    stage("latest_tmp_synced");
    // rename() replaces a file, a FIFO or a symlink, but not a directory: one in
    // the way (a user's mistake) is moved aside, never deleted.
    if (std::error_code lstat_ec; fs::is_directory(fs::symlink_status(latest, lstat_ec)))
      rename_path(latest, root_ / format("{}.not-a-file-{}", kLatestFileName, ::getpid()));
    rename_path(latest_tmp, latest);
  } catch (const Error& e) {
    // The step is committed whatever happens here: say so, and where a resume would start.
    const std::optional<int64_t> still = latest_step(root_);
    ST_FAIL(
        "{}; {} is complete (step {} was committed), but {} still names {}: the next --resume auto starts from "
        "there, --resume {} from the committed step",
        e.message(), final_path().string(), step_, latest.string(), still ? step_dir_name(*still) : "no step",
        final_path().string());
  }
  stage("latest_renamed");
  fsync_path(root_, PathKind::Directory);
  stage("committed");
}

std::string CheckedCheckpoint::unchecked_note(const std::string& dir) const {
  if (unchecked.empty()) return {};
  std::string names;
  for (const std::string& name : unchecked) names += (names.empty() ? "" : ", ") + name;
  return format(
      "{} was saved by an earlier version: its COMPLETE marker gives no checksum for {} file(s) ({}), so a change "
      "that keeps their size goes unnoticed; `ckpt convert` writes a copy with checksums of every byte",
      dir, unchecked.size(), names);
}

namespace {

// Markers without a checksum of trainer_state.json (earlier versions): at least its step must be the marker's.
std::string state_step_problem(const fs::path& dir, const CompleteMarker& marker) {
  for (const MarkerFile& f : marker.files) {
    if (f.name != kTrainerStateFileName || f.sum != MarkerSum::None) continue;
    try {
      const TrainerState state = read_trainer_state(dir);
      if (state.step != marker.step)
        return format("{} is for step {}, but COMPLETE for step {}: the file was changed after the save",
                      kTrainerStateFileName, state.step, marker.step);
    } catch (const Error&) {
      // The loader reads it again and names what is wrong with it.
    }
  }
  return {};
}

}  // namespace

CheckedCheckpoint check_checkpoint(const fs::path& dir, std::optional<int64_t> step) {
  CheckedCheckpoint out;
  if (!step) step = parse_step_dir_name(dir.filename().string());
  std::error_code ec;
  if (!step && !fs::exists(fs::symlink_status(dir / kCompleteMarkerName, ec)) &&
      !fs::exists(fs::symlink_status(dir / kTrainerStateFileName, ec))) {
    std::error_code dir_ec;
    out.model_dir = fs::is_directory(dir, dir_ec);
    if (!out.model_dir) out.problem = format("{} is not a directory", dir.string());
    return out;
  }
  const CompleteMarker marker = read_complete_marker(dir);
  out.step = step.value_or(marker.step);
  out.problem = incomplete_reason(dir, out.step);
  if (out.problem.empty()) out.problem = state_step_problem(dir, marker);
  for (const MarkerFile& f : marker.files)
    if (f.sum == MarkerSum::None) out.unchecked.push_back(f.name);
  return out;
}

CheckedCheckpoint require_checkpoint(const fs::path& dir) {
  CheckedCheckpoint checked = check_checkpoint(dir);
  ST_CHECK(checked.problem.empty(), "checkpoint {} is damaged or incomplete: {}", dir.string(), checked.problem);
  return checked;
}

StepView view_step(const fs::path& dir, int64_t step) {
  StepView view{step, check_checkpoint(dir, step).problem, false, {}, {}};
  const CompleteMarker marker = read_complete_marker(dir);
  if (!marker.problem.empty() || marker.step != step || marker.elsewhere.empty()) return view;
  for (const MarkerFile& f : marker.files) view.held.push_back(f.name);
  for (const std::string& name : marker.elsewhere) {
    std::error_code ec;
    (fs::is_regular_file(dir / name, ec) ? view.held : view.away).push_back(name);
  }
  // Sound in itself when nothing but the other hosts' files is missing.
  view.part = !view.away.empty() && view.problem.starts_with("holds one host's part");
  if (view.away.empty()) view.held.clear();  // whole here: no part to merge
  return view;
}

RootView view_root(const fs::path& root, std::string host) {
  RootView view;
  view.host = std::move(host);
  std::string problem;
  std::error_code found_ec;
  view.latest_found = fs::exists(fs::symlink_status(root / kLatestFileName, found_ec));
  if (auto text = read_small_file(root / kLatestFileName, &problem)) {
    view.latest = parse_step_dir_name(trim_space(*text));
    if (!view.latest)
      view.latest_problem =
          format("{} holds '{}', not a step-NNNNNN name", (root / kLatestFileName).string(), trim_space(*text));
  } else {
    view.latest_problem = problem;
  }
  view.error = error_message_of([&] {
    std::error_code ec;
    const bool is_dir = fs::is_directory(root, ec);
    if (ec && ec != std::errc::no_such_file_or_directory)
      ST_FAIL("cannot open checkpoint directory {}: {}", root.string(), ec.message());
    if (!is_dir) return;
    fs::directory_iterator it(root, ec);
    ST_CHECK(!ec, "cannot list checkpoint directory {}: {}", root.string(), ec.message());
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      if (auto step = parse_step_dir_name(it->path().filename().string()))
        view.steps.push_back(view_step(it->path(), *step));
    }
    ST_CHECK(!ec, "cannot list checkpoint directory {}: {}", root.string(), ec.message());
  });
  if (!view.error.empty()) view.steps.clear();
  std::sort(view.steps.begin(), view.steps.end(), [](const StepView& a, const StepView& b) { return a.step < b.step; });
  return view;
}

std::vector<int64_t> complete_steps(const fs::path& root) {
  const RootView view = view_root(root);
  ST_CHECK(view.error.empty(), "{}", view.error);
  std::vector<int64_t> steps;
  for (const StepView& s : view.steps)
    if (s.problem.empty()) steps.push_back(s.step);
  return steps;
}

ResolvedDir resolve_checkpoint_dir(const std::string& path) {
  std::error_code ec;
  ST_CHECK(fs::is_directory(path, ec), "{} is not a directory", path);
  const fs::path dir(path);
  bool is_root = fs::exists(fs::symlink_status(dir / kLatestFileName, ec));
  if (!is_root && !fs::exists(dir / kTrainerStateFileName, ec) && !fs::exists(dir / kCompleteMarkerName, ec)) {
    // No checkpoint of its own: a root when it holds step directories.
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
      if (parse_step_dir_name(entry.path().filename().string())) {
        is_root = true;
        break;
      }
    }
  }
  if (!is_root) return {path, "", false};
  std::optional<ResumeChoice> choice = choose_resume(dir);
  ST_CHECK(choice.has_value(), "{} is a checkpoint root without a complete checkpoint", path);
  if (choice->note.empty())
    return {choice->path, format("{}: using {} (named by latest)", path, step_dir_name(choice->step)), false};
  return {choice->path, format("{}: {}", path, choice->note), true, choice->latest_damaged};
}

std::optional<ResumeChoice> choose_resume(const fs::path& root) {
  const RootView view = view_root(root);
  ST_CHECK(view.error.empty(), "{}", view.error);
  return choose_resume(root, view);
}

std::optional<ResumeChoice> choose_resume(const fs::path& root, const RootView& view) {
  auto seen = [&](int64_t step) -> const StepView* {
    for (const StepView& s : view.steps)
      if (s.step == step) return &s;
    return nullptr;
  };
  std::string problem = view.latest_problem;
  if (view.latest) {
    const StepView* named = seen(*view.latest);
    if (named && named->problem.empty())
      return ResumeChoice{(root / step_dir_name(*view.latest)).string(), *view.latest, {}};
    if (!named)
      problem = format("latest names {}, which does not exist", step_dir_name(*view.latest));
    else
      problem = format("latest names {}, which is incomplete ({})", step_dir_name(*view.latest), named->problem);
  }
  for (auto it = view.steps.rbegin(); it != view.steps.rend(); ++it) {
    if (!it->problem.empty()) continue;
    return ResumeChoice{(root / step_dir_name(it->step)).string(), it->step,
                        format("{}; using {}", problem, step_dir_name(it->step)), view.latest_found};
  }
  return std::nullopt;
}

namespace {

// Removes every root/.tmp-* directory that is not this process's.
void remove_debris(const fs::path& root) {
  const std::string own_suffix = format("-{}", ::getpid());
  std::vector<fs::path> debris;
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  ST_CHECK(!ec, "cannot list checkpoint directory {}: {}", root.string(), ec.message());
  for (const fs::directory_entry& entry : it) {
    std::string name = entry.path().filename().string();
    if (name.starts_with(kTmpPrefix) && !name.ends_with(own_suffix)) debris.push_back(entry.path());
  }
  for (const fs::path& path : debris) remove_tree(path);
}

// Renamed out of the step-* namespace first, so that a crash mid-delete
// leaves .tmp debris rather than a half-deleted step directory.
void delete_step(const fs::path& root, int64_t step) {
  fs::path doomed = root / format("{}retired-{}-{}", kTmpPrefix, step_dir_name(step), ::getpid());
  remove_tree(doomed);
  rename_path(root / step_dir_name(step), doomed);
  remove_tree(doomed);
}

}  // namespace

RetentionResult apply_retention(const fs::path& root, const RetentionRules& rules) {
  RetentionResult result;
  std::error_code ec;
  if (!fs::is_directory(root, ec)) return result;
  remove_debris(root);
  const RootView view = view_root(root);
  ST_CHECK(view.error.empty(), "{}", view.error);
  std::vector<int64_t> complete;  // newest first
  for (auto it = view.steps.rbegin(); it != view.steps.rend(); ++it) {
    const auto damaged = rules.damaged.find(it->step);
    if (!it->problem.empty() || damaged != rules.damaged.end()) {
      result.kept_damaged.push_back(
          format("{} ({})", step_dir_name(it->step), it->problem.empty() ? damaged->second : it->problem));
      continue;
    }
    complete.push_back(it->step);
  }
  std::reverse(result.kept_damaged.begin(), result.kept_damaged.end());
  if (rules.keep_last <= 0 || rules.committed.empty() || complete.size() <= static_cast<size_t>(rules.keep_last))
    return result;
  const int64_t newest_committed = *rules.committed.rbegin();
  std::vector<int64_t> doomed(complete.begin() + rules.keep_last, complete.end());
  std::sort(doomed.begin(), doomed.end());
  for (int64_t step : doomed) {
    if (step >= newest_committed) continue;  // nothing newer of ours is committed yet
    if (step > rules.resumed_from && !rules.committed.contains(step)) continue;  // newer than where we started
    if (view.latest && *view.latest == step) continue;
    delete_step(root, step);
    result.deleted.push_back(step_dir_name(step));
  }
  return result;
}

}  // namespace st::checkpoint
