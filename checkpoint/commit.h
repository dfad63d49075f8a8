#pragma once
// Crash-safe commit of a checkpoint directory (docs/DESIGN.md, "Commit").
//
// A save writes into root/.tmp-step-NNNNNN-<pid>; commit() fsyncs the files,
// writes a COMPLETE marker (the only thing that makes a checkpoint complete),
// renames the directory to root/step-NNNNNN and only then replaces root/latest
// atomically. A process killed at any point leaves `latest` naming a complete
// checkpoint (the previous one, or the new one once the latest rename happened),
// and choose_resume() falls back to the newest complete checkpoint when
// `latest` was damaged some other way.
//
// One process commits into a root at a time (rank 0 of a job); the temporary
// name carries the pid so that apply_retention() can tell its own temporary
// directory from debris left by a killed run.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "checkpoint/index.h"
#include "core/error.h"

namespace st::checkpoint {

/// Name of the file in the root that names the checkpoint to resume from.
inline constexpr std::string_view kLatestFileName = "latest";
/// Name of the file inside a checkpoint directory that holds the trainer's state.
inline constexpr std::string_view kTrainerStateFileName = "trainer_state.json";

/// Called with the name of each stage of a commit as it is reached (see
/// commit_stages()). For crash tests: a child process kills itself at a chosen
/// stage. Production code passes none.
using CommitHook = std::function<void(std::string_view stage)>;

/// The stages passed to a CommitHook, in the order they are reached: the
/// constructor reports the first, commit() the rest, each one exactly once.
std::span<const std::string_view> commit_stages();

/// A checkpoint being written: owns root/.tmp-step-NNNNNN-<pid> until commit().
/// Move-only; destroying it uncommitted removes the temporary directory (a
/// failed or abandoned save leaves `latest` and the committed checkpoints as
/// they were).
class PendingCheckpoint {
 public:
  /// Creates `root` if missing and a fresh, empty temporary directory for
  /// `step` (removing a stale one of the same name, left by an earlier process
  /// with the same pid). Throws st::Error naming the path on I/O failure.
  PendingCheckpoint(std::filesystem::path root, int64_t step, CommitHook hook = {});
  ~PendingCheckpoint();
  PendingCheckpoint(PendingCheckpoint&& other) noexcept;
  PendingCheckpoint& operator=(PendingCheckpoint&&) = delete;
  PendingCheckpoint(const PendingCheckpoint&) = delete;
  PendingCheckpoint& operator=(const PendingCheckpoint&) = delete;

  /// The temporary directory to write the checkpoint's files into.
  const std::filesystem::path& path() const noexcept { return path_; }
  /// root/step-NNNNNN: where commit() puts the checkpoint.
  std::filesystem::path final_path() const;
  int64_t step() const noexcept { return step_; }
  bool committed() const noexcept { return committed_; }

  /// Makes the checkpoint durable and current. `files_written` are the names
  /// (plain file names, no '/') of the files written into path(); they are
  /// fsynced and listed with their sizes in the COMPLETE marker. Then the
  /// directory is renamed to final_path() and root/latest replaced through
  /// root/.latest.tmp, with the directories fsynced after each rename.
  /// When final_path() already exists (a re-save of the same step) it is
  /// replaced only now that the new one is complete: atomically with
  /// renameat2(RENAME_EXCHANGE) where the filesystem supports it; otherwise the
  /// old one is moved aside first, and a crash between the two renames leaves
  /// no step-NNNNNN, so choose_resume() falls back to the previous checkpoint.
  /// `latest` never moves to a lower step: when it names a newer step whose
  /// directory exists (a damaged checkpoint the run fell back past), it stays
  /// and latest_kept() says which.
  /// Throws st::Error naming the path on I/O failure or a second call.
  void commit(const std::vector<std::string>& files_written);
  /// commit()'s first half, for a checkpoint spread over node-local roots:
  /// up to the rename into final_path() (the marker also lists `elsewhere`,
  /// the files other hosts hold). Then committed() is true.
  void publish(const std::vector<std::string>& files_written, const std::vector<std::string>& elsewhere = {});
  /// commit()'s second half, once every host has published: replaces `latest`.
  void point_latest();
  /// The newer step `latest` still names because commit() did not move it back; nullopt when it moved.
  std::optional<int64_t> latest_kept() const noexcept { return latest_kept_; }

 private:
  /// Renames the temporary directory to final_path(); a step directory already
  /// there is swapped out (atomically where the kernel can) and its new place
  /// returned, for commit() to delete once the rename is durable; else empty.
  std::filesystem::path move_into_place() const;
  void stage(std::string_view name) const;

  std::filesystem::path root_;
  std::filesystem::path path_;
  int64_t step_ = 0;
  CommitHook hook_;
  bool committed_ = false;
  std::optional<int64_t> latest_kept_;
  bool latest_pointed_ = false;
};

/// Steps of the complete checkpoints (see incomplete_reason) among root's
/// step-NNNNNN directories, ascending. Empty when root does not exist.
std::vector<int64_t> complete_steps(const std::filesystem::path& root);

/// One step-NNNNNN directory as one process sees it.
struct StepView {
  StepView() = default;
  StepView(int64_t step_, std::string problem_, bool part_ = false, std::vector<std::string> held_ = {},
           std::vector<std::string> away_ = {})
      : step(step_), problem(std::move(problem_)), part(part_), held(std::move(held_)), away(std::move(away_)) {}

  int64_t step = 0;
  std::string problem;  // why it is not a complete checkpoint (incomplete_reason); empty when it is
  /// A host's part of a checkpoint saved to node-local disks (COMPLETE lists
  /// files "elsewhere"), sound in itself: `problem` says only that `away` is missing.
  bool part = false;
  std::vector<std::string> held;  // part: the files this directory holds (COMPLETE's, and those of `away` copied here)
  std::vector<std::string> away;  // part: files other hosts hold, not here
  bool operator==(const StepView&) const = default;
};

/// What check_checkpoint found in a directory about to be loaded.
struct CheckedCheckpoint {
  std::string problem;  // why it must not be loaded, naming the file; empty when it may
  int64_t step = -1;    // the step its COMPLETE marker names; -1 when unknown
  /// No COMPLETE marker and no trainer_state.json (only when no step was
  /// required): model weights alone, e.g. a Hugging Face directory, which
  /// has no checksums of ours; its index's tensor CRC32Cs, if any, are still checked.
  bool model_dir = false;
  /// Files that a COMPLETE marker of an earlier version lists by size alone.
  std::vector<std::string> unchecked;
  /// "" or one line for the user: which files of `dir` no checksum covers, and how to add them.
  std::string unchecked_note(const std::string& dir) const;
};

/// The one check every way into a checkpoint applies before it reads
/// anything else of it (--resume auto and PATH, checkpoint.init_from,
/// generate, ckpt convert and verify): the COMPLETE marker, every file it
/// lists with its size and checksum (incomplete_reason), and, where the
/// marker has no checksum of trainer_state.json, that file's step. `step`:
/// the step `dir` must hold; by default the one its name says (step-NNNNNN),
/// else the marker's, and then a directory with neither COMPLETE nor
/// trainer_state.json is a model directory. Never throws.
CheckedCheckpoint check_checkpoint(const std::filesystem::path& dir, std::optional<int64_t> step = std::nullopt);

/// check_checkpoint(dir), thrown as st::Error naming `dir` and the file at
/// fault when it fails; returns it otherwise.
CheckedCheckpoint require_checkpoint(const std::filesystem::path& dir);

/// One step directory as view_root lists it (its problem from check_checkpoint).
StepView view_step(const std::filesystem::path& dir, int64_t step);

/// What one process sees in a checkpoint root: the input of every resume decision.
struct RootView {
  std::string host;               // where the process runs (for messages)
  std::string error;              // the root exists but could not be listed; then `steps` is empty
  std::vector<StepView> steps;    // every step-NNNNNN directory, ascending
  std::optional<int64_t> latest;  // the step `latest` names, when it holds a step name
  std::string latest_problem;     // otherwise why not (missing, not a regular file, not a step name)
  bool latest_found = false;      // something is at root/latest, readable or not
  bool operator==(const RootView&) const = default;
};

/// Lists `root` (a root that does not exist holds nothing). Never throws: a
/// failure to list is the view's `error`, so a process that cannot read the
/// root still takes part in an agreement on it.
RootView view_root(const std::filesystem::path& root, std::string host = {});

/// The checkpoint to resume from.
struct ResumeChoice {
  std::string path;  // root/step-NNNNNN
  int64_t step = 0;
  std::string note;  // why `latest` was not used; empty when it was
  /// `latest` is there but names no complete step (another step, a missing
  /// or incomplete one, or nothing readable): damage, not a crash's leftover.
  bool latest_damaged = false;
};

/// What `--resume auto` loads: the checkpoint `latest` names when it is
/// complete; otherwise (latest missing, unreadable as a step name, naming a
/// missing or incomplete directory) the newest complete checkpoint, with the
/// reason in `note`, e.g. "latest names step-000300, which is incomplete
/// (missing COMPLETE marker); using step-000200". nullopt when root holds no
/// complete checkpoint.
std::optional<ResumeChoice> choose_resume(const std::filesystem::path& root);
/// The same choice from a view of `root` (pure; the view's `error` is ignored).
std::optional<ResumeChoice> choose_resume(const std::filesystem::path& root, const RootView& view);

/// A checkpoint that does not fit the run loading it (another model shape, a
/// finished run). Unlike a damaged one it is never a reason to fall back to an
/// older checkpoint: those would not fit either, or would silently undo the
/// user's choice. Every rank judges the fit on the same files, so every rank
/// raises the same Misfit: an agreed error, printed once.
class Misfit : public AgreedError {
 public:
  using AgreedError::AgreedError;
};

/// The checkpoint directory a path given by a user stands for.
struct ResolvedDir {
  std::string path;             // the checkpoint directory
  std::string note;             // for a root: which step was taken and why; empty otherwise
  bool fell_back = false;       // a root whose `latest` was unusable: an older complete checkpoint was taken
  bool latest_damaged = false;  // ResumeChoice::latest_damaged of that root
};
/// `path` itself, unless it is a checkpoint root (it holds `latest`, or
/// step-NNNNNN directories and no checkpoint of its own): then choose_resume's
/// pick. Throws naming `path` when it is not a directory or is a root without
/// a complete checkpoint. The trainer (--resume PATH, init_from) and the ckpt
/// tool both resolve paths through this.
ResolvedDir resolve_checkpoint_dir(const std::string& path);

/// What retention may delete. The way back is never deleted: a step is a
/// candidate only when it is complete, not known to be damaged, older than
/// the newest step this run committed, not newer than the step the run
/// resumed from (unless this run committed it), and not the one `latest` names.
struct RetentionRules {
  int64_t keep_last = 0;                   // keep the newest N complete checkpoints; <= 0 keeps all
  int64_t resumed_from = 0;                // the step this run started from (0: a fresh start)
  std::set<int64_t> committed;             // steps this run committed; nothing is deleted before the first
  std::map<int64_t, std::string> damaged;  // steps found not to load (with why): kept, never counted
};

/// What apply_retention did.
struct RetentionResult {
  std::vector<std::string> deleted;       // names of the checkpoints deleted
  std::vector<std::string> kept_damaged;  // "step-NNNNNN (why it does not load)" for each damaged step kept
};

/// Deletes the complete checkpoints beyond the newest `keep_last` that
/// `rules` allow; incomplete or damaged step directories are kept (they are
/// the user's to judge) and listed. Also removes every root/.tmp-* directory
/// whose name does not end in this process's pid: those are debris of killed
/// saves, since only one process commits into a root at a time. Call it after
/// commit(), from the committing process.
RetentionResult apply_retention(const std::filesystem::path& root, const RetentionRules& rules);

}  // namespace st::checkpoint
