#pragma once
// The checkpoint subsystem's front door: saving StateEntry lists in either
// layout (index.h describes the files) and loading either layout, or a plain
// Hugging Face model directory, into any partition of the same tensors
// (docs/DESIGN.md, "The life of a checkpoint").
//
// A save sends no tensor data between ranks: every rank writes the pieces it
// holds straight into the files that hold their tensors (save.h). Pieces
// that several ranks hold (NO_SHARD / HYBRID_SHARD replicas) are written
// once, by one holder chosen to keep the writing balanced. A load reads every
// byte of the checkpoint at most once per job, and verifies every checksum
// with the bytes it reads (load.cpp).
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/index.h"
#include "checkpoint/resume.h"
#include "checkpoint/state.h"
#include "checkpoint/topology.h"
#include "core/comm.h"
#include "core/log.h"
#include "core/state.h"

namespace st::checkpoint {

struct SaveOptions {
  Layout layout = Layout::Unified;
  // Unified only (the sharded layout stores every kind as it is):
  bool model_weights = true;       // write "master" entries as model-* (model_dtype)
  bool master_weights = true;      // write "master" entries as master_weights-* (F32)
  DType model_dtype = DType::F32;  // dtype of the model-* tensors
  // Copy the data this rank writes into buffers of its own during
  // stage_save (needed when the entries change before write(), e.g. an async
  // save). Without it write() reads the entries' memory. Device tensors are
  // always copied to the host in stage_save.
  bool snapshot = true;
  int threads = 2;  // writer threads per rank
};

/// A save after its collective, blocking part: this rank's share of the data
/// sits in host buffers it owns, so the entries may change while write() runs.
class StagedSave {
 public:
  struct Impl;
  explicit StagedSave(std::unique_ptr<Impl> impl);
  StagedSave(StagedSave&&) noexcept;
  StagedSave& operator=(StagedSave&&) noexcept;
  ~StagedSave();

  /// Not collective and never throws (an error is kept for finish()): writes
  /// this rank's files into the directory and fsyncs them. Uses no
  /// communication, so it may run on a background thread.
  void write();
  /// Collective over the group given to stage_save, after write(): a failure on
  /// any rank throws on every rank, naming the rank and the cause; so do
  /// non-finite values in any tensor (they are never committed). Rank 0 then
  /// writes the index files (temp file, fsync, rename). Returns on rank 0 the
  /// names of every file of the checkpoint written so far (for the COMPLETE
  /// marker), on other ranks an empty list.
  std::vector<std::string> finish();
  /// On the owner of a node-local root, after finish(): the files of the
  /// checkpoint that other hosts hold (for its COMPLETE marker); else empty.
  std::vector<std::string> elsewhere() const;
  /// Bytes of tensor data this rank writes.
  int64_t bytes() const;
  /// Bytes of tensor data all ranks write together (known after stage_save).
  int64_t total_bytes() const;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Collective over `group`, blocking: agrees who writes what (only the list
/// of entries travels, never their data) and, with options.snapshot, copies
/// the data this rank writes into buffers of its own. `dir` must exist on
/// every rank: one directory all ranks share, or, with a node-local
/// `topology`, each host's own (then each file is written whole by the host
/// of its header rank: pieces held on other hosts are sent there now, and
/// the owner of every host's root writes the indexes into it). The group
/// must outlive the StagedSave.
StagedSave stage_save(const std::string& dir, std::span<const StateEntry> entries, const SaveOptions& options,
                      ProcessGroup& group, const StorageTopology& topology = {});

/// stage_save + write + finish.
std::vector<std::string> save(const std::string& dir, std::span<const StateEntry> entries, const SaveOptions& options,
                              ProcessGroup& group);

struct LoadOptions {
  // Check the CRC32C of every checksummed chunk of the catalog, whether its
  // kind is loaded or not: each byte is checksummed where it is read for
  // loading anyway, and the bytes no rank loads are read for the check alone,
  // spread over the ranks.
  bool verify = true;
  // A "master" entry loads from stored "master" data when there is some;
  // otherwise from "model" data: always when that is F32 (exact), and from
  // BF16 model weights only when this is set (master_weight_compatible).
  bool master_from_model = false;
  int threads = 4;  // reader threads
  // Refuse loaded values that are NaN or Inf (training state must be finite).
  bool refuse_nonfinite = false;
  // Node-local disks: for each data file, the ranks whose host holds it; a
  // rank reads the others' files through one of them (over the group).
  // Empty: every rank reads every file itself.
  std::map<std::string, std::vector<int>> file_readers = {};
};

/// Collective over `group`: fills every entry's `local` (host or device) from
/// `catalog`, reading only the overlapping byte ranges, straight into the
/// entries when the dtypes match, converting F32 <-> BF16 where they do not.
/// Throws the same error on every rank, naming the tensor, kind, file or
/// element range at fault: a tensor missing from the checkpoint, a shape that
/// differs from the entry's, a checksum mismatch, a missing or short file,
/// non-finite values (with options.refuse_nonfinite).
void load_entries(const Catalog& catalog, std::span<StateEntry> entries, const LoadOptions& options,
                  ProcessGroup& group);

/// The same in one process (the process verifies every chunk itself).
void load_entries(const Catalog& catalog, std::span<StateEntry> entries, const LoadOptions& options);

// ---- A run's checkpoints: save, commit, retention, async; load, resume -------

/// How a run saves its checkpoints.
struct RunOptions {
  std::string root;          // checkpoint.dir: holds step-NNNNNN directories and `latest`
  SaveOptions save;          // layout, model weights (snapshot follows `async`)
  bool async = false;        // write in a background thread; training waits only for the host copy
  int64_t keep_last = 0;     // retention (commit.h, apply_retention); <= 0 keeps all
  StorageTopology topology;  // shared by all ranks (default), or a root on each host's own disk
};

/// A small file written beside the tensors of a checkpoint (config.json,
/// tokenizer.model): written as is, so `text` may hold any bytes.
struct ExtraFile {
  std::string name;
  std::string text;
};

/// Saves one run's checkpoints into RunOptions::root: each into a temporary
/// directory, committed atomically as step-NNNNNN with trainer_state.json
/// and a COMPLETE marker, `latest` moved after (commit.h), then retention.
/// Every method is collective over the group and must be called by all
/// ranks at the same point.
class Saver {
 public:
  Saver(RunOptions options, ProcessGroup& group, Logger& log);
  /// Waits for a save still being written, without committing it (only
  /// wait() and poll() commit: a failing run must not publish).
  ~Saver();
  Saver(const Saver&) = delete;
  Saver& operator=(const Saver&) = delete;

  /// Saves `entries` (host or device memory) after `state.step`. First
  /// finishes the previous save. trainer_state.json records `state`, with
  /// format, model_dtype, model_weights and master_weights set from the
  /// options; `extra` files are written beside it (rank 0's list counts).
  /// Synchronous: returns when the checkpoint is committed. Async: returns
  /// once this rank's data is copied to host memory; the files are written
  /// by a background thread and committed by a later poll(), save() or wait().
  /// A failure throws on every rank (AgreedError) and never moves `latest`.
  void save(std::span<const StateEntry> entries, TrainerState state, std::vector<ExtraFile> extra = {});
  /// Once per step: the maximum of `value` over the ranks (callers pass a
  /// flag of their own along), and commits a background save once every rank
  /// has finished writing it.
  int poll(int value);
  /// Waits for a save in flight and commits it (call before exiting).
  void wait();

  const RunOptions& options() const { return options_; }

  /// Where the run started (call before the first save): retention never
  /// deletes a step newer than `step` that this run did not commit, nor one
  /// in `damaged` (steps found incomplete or not loading, with why), which is
  /// named in a warning instead.
  void note_resume(int64_t step, std::map<int64_t, std::string> damaged);

 private:
  struct InFlight;
  void finish_in_flight();
  void warn_kept(const std::vector<std::string>& kept_damaged, std::optional<int64_t> latest_kept, int64_t step);
  // Rank 0, before committing `step`: moves an existing step directory the run
  // must not overwrite to root/replaced-step-NNNNNN-<pid>; returns where ("" when none).
  std::string keep_earlier_step(int64_t step);
  // Whether this rank commits into a root: rank 0 of a shared one, the lowest rank of each host for node-local ones.
  bool owns_root() const;

  RunOptions options_;
  ProcessGroup& group_;
  Logger& log_;
  std::unique_ptr<InFlight> in_flight_;
  // Root owners: what retention must keep (RetentionRules), and what was already warned about.
  int64_t resumed_from_ = 0;
  std::map<int64_t, std::string> damaged_;
  std::set<int64_t> committed_;
  std::set<std::string> warned_;
};

/// How a checkpoint must fit the run that loads it. Judged on indexes,
/// headers and trainer_state.json only, before any tensor is read, and
/// identically on every rank (the tensor lists of all ranks are gathered).
struct FitCheck {
  /// Starting from weights (checkpoint.init_from): only the "master" entries
  /// are given, tensors of other kinds in the checkpoint are ignored, and no
  /// trainer_state.json is needed.
  bool weights_only = false;
  /// Tensors the run lacks (and `config_differences`) are errors; otherwise warnings. Missing
  /// tensors and tensors of another shape are errors either way.
  bool strict = true;
  /// Differences between the checkpoint directory's model description and
  /// the run's, one phrase each (e.g. from config.json); none when unset.
  std::function<std::vector<std::string>(const std::string& dir)> config_differences;
  /// Called with the checkpoint's state before any tensor is read; throws
  /// Misfit (commit.h) to refuse it (e.g. a run that is already finished).
  std::function<void(const TrainerState& state)> check_state;
  /// Appended to a Misfit's message: the caller's ways out (e.g. the
  /// trainer's --overwrite or another checkpoint.dir); empty: none.
  std::string misfit_hint;
};

/// What a load read.
struct Loaded {
  TrainerState state;  // default (step 0) for weights_only
  std::string format;  // Catalog::format
  int64_t bytes = 0;   // of tensor data loaded, all ranks together
  double seconds = 0;
  bool skipped_model_weights = false;  // model-* present but masters came from master weights
};

/// Collective: checks the fit (FitCheck), then fills `entries` from the
/// checkpoint in `dir` (load_entries, non-finite values refused). A
/// checkpoint that does not fit throws Misfit on every rank; a damaged one
/// (checksum, missing tensor with an agreeing config, non-finite values, an
/// unreadable trainer_state.json) throws AgreedError.
Loaded load(std::span<StateEntry> entries, const std::string& dir, const LoadOptions& options, const FitCheck& fit,
            ProcessGroup& group, Logger& log);

/// Resolves what a user asked to resume from and calls `load` with it
/// (collective over `group`): "auto" -> resume_auto (resume.h): one decision
/// for the job; a fresh start only when `root` holds no step directory; step
/// directories of which none loads are an error; skipped ones are warned
/// about. Anything else is a checkpoint directory or a root
/// (resolve_checkpoint_dir; the choice is logged), which must load. Returns
/// the directory loaded (nullopt: a fresh start) and the damaged steps seen.
AutoResumed resume(const std::string& what, const std::string& root,
                   const std::function<void(const std::string& dir)>& load, Logger& log, ProcessGroup& group,
                   const StorageTopology& topology = {});

}  // namespace st::checkpoint
