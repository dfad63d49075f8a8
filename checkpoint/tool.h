#pragma once
// The work behind the `ckpt` program (tools/ckpt.cpp parses its command line
// and prints what these return):
//
//   inspect   format, step, saver world size, every tensor
//   verify    every checksum, every file present and sized right
//   convert   rewrite in the other layout, with any number of processes
//
// Each takes a path a user gave: a checkpoint directory (root/step-NNNNNN, or
// any directory holding a checkpoint index), or a checkpoint root, which
// stands for the checkpoint `--resume auto` would load (resolve_checkpoint_dir;
// its note says which it took).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "checkpoint/index.h"
#include "checkpoint/state.h"
#include "core/comm.h"
#include "core/dtype.h"

namespace st::checkpoint {

/// One regular file of a checkpoint directory.
struct DirFile {
  std::string name;
  int64_t bytes = 0;  // -1 when its size cannot be read
};

/// Everything `ckpt inspect` shows.
struct Inspection {
  std::string dir;
  std::string note;  // from resolve_checkpoint_dir
  Catalog catalog;
  std::optional<TrainerState> state;  // nullopt: no trainer_state.json (a model directory)
  std::string incomplete;             // why the checkpoint is not complete (commit.h); empty when it is
  int64_t marker_step = -1;
  std::vector<DirFile> files;  // regular files in the directory, by name
};
/// Reads the checkpoint `path` stands for; throws naming the file at fault.
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
  std::string unchecked;              // CheckedCheckpoint::unchecked_note (files without a checksum)
  std::vector<std::string> problems;  // one line each, naming the file and the tensor
  int64_t tensors = 0;                // (FQN, kind) pairs in the catalog
  int64_t chunks = 0;                 // stored pieces checked
  int64_t files = 0;                  // data files read
  int64_t bytes = 0;                  // tensor bytes checksummed
  bool ok() const { return problems.empty(); }
  /// "verified 42 tensors (42 chunks) in 7 files, 12.3 MB: OK", or the count of problems.
  std::string summary() const;
};
/// Checks a root's `latest` (naming a step that is not complete is a problem,
/// though the newest complete step is then checked), the COMPLETE marker
/// (each listed file present with its size and checksum), that
/// the index parses and its chunks cover every tensor, and every chunk's
/// CRC32C and finiteness, with `threads` files read at once; reports every
/// problem found, not only the first.
VerifyReport verify_checkpoint(const std::string& path, int threads);
/// `ckpt verify DIR1 DIR2 ...`: the hosts' parts of one checkpoint saved to
/// node-local disks (topology.h), each checked against its own COMPLETE
/// marker and all of them together as one checkpoint (verify_checkpoint over
/// a temporary directory of links to their files). One path: verify_checkpoint.
VerifyReport verify_checkpoint_parts(const std::vector<std::string>& paths, int threads);

/// What convert does with the files beside the tensors that it does not
/// simply copy. The checkpoint subsystem does not know the model's config
/// format; the caller (tools/ckpt.cpp) fills this from models/hf_config.h.
struct ConvertOptions {
  /// Name of the Hugging Face config file ("config.json"); empty: none is rewritten.
  std::string hf_config_name;
  /// Returns the config's text (read and checked to be a JSON object, from
  /// `path`) with its torch_dtype saying `model_dtype`: the dtype of the
  /// output's model-* weights, F32 when it has none. `path` names the file in
  /// errors. Unset: the file is copied unchanged.
  std::function<std::string(const std::string& config_json_text, DType model_dtype, const std::string& path)>
      rewrite_hf_config;
};

/// Collective over `group`: loads the checkpoint at `path` split evenly over
/// the group's ranks and saves it in `to` layout into `out`, with
/// trainer_state.json (its "format" updated), the Hugging Face config
/// (rewritten by `options`) and any other non-layout file copied, and a
/// COMPLETE marker. `out` must not exist; it appears only when complete
/// (written into a temporary sibling, then renamed). A failure on any rank
/// throws on every rank and leaves no `out`. Returns a one-line summary on
/// rank 0 ("" elsewhere) counting the tensors read and written by kind, as
/// inspect counts them: "read 156 tensors (39 model, 39 master, 39 exp_avg,
/// 39 exp_avg_sq), wrote 117 tensors (39 master, ...)" for unified -> sharded.
std::string convert_checkpoint(const std::string& path, Layout to, const std::string& out, ProcessGroup& group,
                               const ConvertOptions& options = {});

}  // namespace st::checkpoint
