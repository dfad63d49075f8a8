#pragma once
// The work of the `ckpt` tool (launch/ckpt.cpp holds only its main()):
//
//   ckpt inspect DIR [--json]     format, step, saver world size, every tensor
//   ckpt verify DIR               every checksum, every file present and sized right
//   ckpt convert DIR --to unified|sharded OUT
//                                 rewrite in the other layout, with any number of
//                                 processes (alone, or under scripts/launch -np K)
//
// DIR is a checkpoint directory (root/step-NNNNNN, or any directory holding a
// checkpoint index), or a checkpoint root: then the checkpoint that
// `--resume auto` would load (choose_resume), and ckpt says which it took.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/commit.h"
#include "checkpoint/state.h"
#include "core/comm.h"

namespace st::launch {

enum class CkptCommand : uint8_t { Inspect, Verify, Convert };

/// Command line of `ckpt`.
struct CkptArgs {
  bool help = false;                                    // --help / -h / no arguments
  CkptCommand command = CkptCommand::Inspect;           // the first argument
  std::string dir;                                      // the checkpoint to read
  bool json = false;                                    // inspect --json
  checkpoint::Layout to = checkpoint::Layout::Unified;  // convert --to
  std::string out;                                      // convert's output directory
  int threads = 4;                                      // verify --threads N: files checked at once
};

/// Parses argv (without the program name); throws st::Error naming the bad argument.
CkptArgs parse_ckpt_args(const std::vector<std::string>& argv);
std::string ckpt_usage();

using checkpoint::resolve_checkpoint_dir;
using checkpoint::ResolvedDir;

/// One file of a checkpoint directory.
struct DirFile {
  std::string name;
  int64_t bytes = 0;
};

/// Everything `ckpt inspect` shows.
struct Inspection {
  std::string dir;
  std::string note;  // from resolve_checkpoint_dir
  checkpoint::Catalog catalog;
  std::optional<checkpoint::TrainerState> state;  // nullopt: no trainer_state.json (a model directory)
  std::string incomplete;                         // why the checkpoint is not complete (commit.h); empty when it is
  int64_t marker_step = -1;
  std::vector<DirFile> files;  // regular files in the directory, by name
};
Inspection inspect_checkpoint(const std::string& path);
/// A header and one row per tensor (FQNs in natural order: layers.2 before layers.10).
std::string inspection_text(const Inspection& inspection);
/// The same as one JSON object: dir, format, step, world_size (of the training
/// run), saver_world_size (of the files), sharding_strategy, model_dtype,
/// complete, total_bytes, files [{name, bytes}], tensors [{fqn, kind, shape,
/// dtype, numel, bytes, chunks}].
std::string inspection_json(const Inspection& inspection);

/// What `ckpt verify` found.
struct VerifyReport {
  std::string dir;
  std::string note;                   // from resolve_checkpoint_dir
  std::vector<std::string> problems;  // one line each, naming the file and the tensor
  int64_t tensors = 0;                // (FQN, kind) pairs in the catalog
  int64_t chunks = 0;                 // stored pieces checked
  int64_t files = 0;                  // data files read
  int64_t bytes = 0;                  // tensor bytes checksummed
  bool ok() const { return problems.empty(); }
  /// "verified 42 tensors (42 chunks) in 7 files, 12.3 MB: OK", or the count of problems.
  std::string summary() const;
};
/// Checks the COMPLETE marker (each listed file present with its size), that
/// the index parses and its chunks cover every tensor, and every chunk's
/// CRC32C; reports every problem found, not only the first.
VerifyReport verify_checkpoint(const std::string& path, int threads);

/// Collective over `group`: loads the checkpoint at `path` split evenly over
/// the group's ranks and saves it in `to` layout into `out`, with
/// trainer_state.json (its "format" updated), config.json and any other
/// non-layout file copied, and a COMPLETE marker. `out` must not exist; it
/// appears only when complete (written into a temporary sibling, then
/// renamed). A failure on any rank throws on every rank and leaves no `out`.
/// Returns a one-line summary on rank 0, "" elsewhere.
std::string convert_checkpoint(const std::string& path, checkpoint::Layout to, const std::string& out,
                               ProcessGroup& group);

}  // namespace st::launch
