#pragma once
// The checkpoint subsystem's front door: two savers (unified Hugging Face
// safetensors, DCP-style sharded) and one loader that reads either layout, or a
// plain Hugging Face model directory, into any partition of the same tensors
// (DESIGN.md, "Checkpoint directory").
//
// Unified layout (Layout::Unified), N = number of ranks that own tensors of a family:
//   model-0000k-of-0000N.safetensors + model.safetensors.index.json
//       kind "master" entries, cast to SaveOptions::model_dtype, keyed by FQN
//       (what Hugging Face tools load; files carry "__metadata__": {"format": "pt"})
//   master_weights-0000k-of-0000N.safetensors + master_weights.safetensors.index.json
//       kind "master" entries in F32, keyed by FQN
//   optimizer-0000k-of-0000N.safetensors + optimizer.safetensors.index.json
//       every other kind, keyed "<fqn>.<kind>" (e.g. "...up_proj.weight.exp_avg")
// Each index is Hugging Face's {"metadata": {"total_size": bytes, ...},
// "weight_map": {key: file}} plus "crc32c": {key: CRC32C of the stored bytes}
// and metadata "format": "shardtrain-unified", "version": 1, "world_size".
// Whole tensors are assigned to owner ranks balanced by bytes; the owners
// receive the pieces from the ranks that hold them (all_to_allv).
//
// Sharded layout (Layout::Sharded): see sharded.h.
//
// Pieces that several ranks hold (NO_SHARD / HYBRID_SHARD replicas) are sent or
// written once, by one of their holders chosen to keep the writing balanced.
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/sharded.h"
#include "core/comm.h"
#include "core/state.h"

namespace st::checkpoint {

enum class Layout : uint8_t { Unified, Sharded };
/// "unified" or "sharded": the layout's one spelling, in trainer_state.json,
/// Catalog::format, log lines and command lines.
std::string_view layout_name(Layout layout);
/// The layout spelled `name`; nullopt for any other text.
std::optional<Layout> parse_layout(std::string_view name);

inline constexpr std::string_view kUnifiedFormat = "shardtrain-unified";
inline constexpr int kUnifiedVersion = 1;
inline constexpr std::string_view kModelIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kMasterIndexName = "master_weights.safetensors.index.json";
inline constexpr std::string_view kOptimizerIndexName = "optimizer.safetensors.index.json";
/// The kind under which a loader sees model weights (model-* files, or a Hugging Face directory).
inline constexpr std::string_view kModelKind = "model";
inline constexpr std::string_view kMasterKind = "master";

struct SaveOptions {
  Layout layout = Layout::Unified;
  // Unified only (the sharded layout stores every kind as it is):
  bool model_weights = true;       // write "master" entries as model-* (model_dtype)
  bool master_weights = true;      // write "master" entries as master_weights-* (F32)
  DType model_dtype = DType::F32;  // dtype of the model-* tensors
  // Copy the data this rank writes into buffers of its own during
  // stage_save (needed when the entries change before write(), e.g. an async
  // save). Without it the sharded saver writes from the entries' memory.
  bool snapshot = true;
  // Unified: the pieces travel to their owners in rounds of at most this many
  // bytes sent or received per rank, which bounds the exchange buffers (and
  // keeps MPI's int counts in range).
  int64_t exchange_bytes = int64_t{256} << 20;
};

/// Whether a unified save also writes master_weights-* files: F32 model-*
/// files are the master weights, so with them a second copy would store the
/// same bytes twice (a load takes masters from F32 model weights).
inline bool unified_needs_master_files(bool model_weights, DType model_dtype) {
  return !model_weights || model_dtype != DType::F32;
}

/// "model-00002-of-00004.safetensors".
std::string unified_file_name(std::string_view family, int k, int n);

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
  /// any rank throws on every rank, naming the rank and the cause. Rank 0 then
  /// writes the index files (temp file, fsync, rename). Returns on rank 0 the
  /// names of every file of the checkpoint written so far (for the COMPLETE
  /// marker), on other ranks an empty list.
  std::vector<std::string> finish();
  /// Bytes of tensor data this rank writes.
  int64_t bytes() const;
  /// Bytes of tensor data all ranks write together (known after stage_save).
  int64_t total_bytes() const;

 private:
  std::unique_ptr<Impl> impl_;
};

/// Collective over `group`, blocking: agrees who writes what, then moves the
/// data into host buffers of the writing ranks (unified: all_to_allv of the
/// pieces to the owners). `dir` must exist and be shared by all ranks. The
/// group must outlive the StagedSave.
StagedSave stage_save(const std::string& dir, std::span<const StateEntry> entries, const SaveOptions& options,
                      ProcessGroup& group);

/// stage_save + write + finish.
std::vector<std::string> save(const std::string& dir, std::span<const StateEntry> entries, const SaveOptions& options,
                              ProcessGroup& group);

/// What one tensor of a checkpoint is stored as.
struct StoredTensor {
  Shape shape;
  DType dtype = DType::F32;
  std::vector<ChunkRecord> chunks;  // unified / Hugging Face: one chunk, the whole tensor
  bool checksummed = true;          // false for a plain Hugging Face directory
};

/// Every tensor a checkpoint directory holds, keyed by (FQN, kind).
struct Catalog {
  std::string dir;
  std::string format;  // "unified", "sharded" or "huggingface"
  int world_size = 0;  // of the saver; 0 when unknown
  std::map<std::pair<std::string, std::string>, StoredTensor> tensors;

  /// Whether any tensor of `kind` is stored.
  bool has_kind(std::string_view kind) const;
  /// Bytes of tensor data stored (each chunk once).
  int64_t total_bytes() const;
};

/// Reads the index of a checkpoint in either layout, or of a Hugging Face
/// model directory (model.safetensors.index.json without our metadata, or a
/// single model.safetensors); unified/Hugging Face tensor shapes and dtypes
/// come from the safetensors headers. Throws naming the file at fault.
Catalog read_catalog(const std::string& dir);

struct LoadOptions {
  bool verify = true;  // check CRC32C of the chunks this loader verifies
  // Every checksummed chunk of the catalog is verified, whether a kind is
  // loaded or not. Chunks are numbered in catalog order; this loader verifies chunk i when
  // i % verify_world == verify_rank, whether it reads it or not, so that the
  // ranks of a job together verify each chunk once (the caller shares errors).
  int verify_rank = 0;
  int verify_world = 1;
  // A "master" entry loads from stored "master" data when there is some;
  // otherwise from "model" data: always when that is F32 (exact), and from
  // BF16 model weights only when this is set (master_weight_compatible).
  bool master_from_model = false;
  int threads = 4;  // reader threads
};

/// Not collective: fills every entry's `local` from `catalog`, reading only the
/// overlapping byte ranges and converting F32 <-> BF16 where needed. Throws
/// naming the tensor, kind, file or element range at fault: a tensor missing
/// from the checkpoint, a shape that differs from the entry's, a checksum
/// mismatch, a missing or short file.
void load_entries(const Catalog& catalog, std::span<StateEntry> entries, const LoadOptions& options);

}  // namespace st::checkpoint
