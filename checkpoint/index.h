#pragma once
// The names and indexes of a checkpoint directory: the two layouts, the file
// and key names of each, the JSON indexes that list every stored chunk, and
// the Catalog a loader reads them into (docs/DESIGN.md, "The checkpoint directory").
//
// Unified layout (Layout::Unified), N = number of ranks that own tensors of a family:
//   model-0000k-of-0000N.safetensors + model.safetensors.index.json
//       kind "master" entries, cast to the model dtype, keyed by FQN
//       (what Hugging Face tools load; files carry "__metadata__": {"format": "pt"})
//   master_weights-0000k-of-0000N.safetensors + master_weights.safetensors.index.json
//       kind "master" entries in F32, keyed by FQN
//   optimizer-0000k-of-0000N.safetensors + optimizer.safetensors.index.json
//       every other kind, keyed "<fqn>.<kind>" (e.g. "...up_proj.weight.exp_avg")
// Each index is Hugging Face's {"metadata": {"total_size": bytes, ...},
// "weight_map": {key: file}} plus "crc32c": {key: CRC32C of the stored bytes}
// and metadata "format": "shardtrain-unified", "version": 1, "world_size".
//
// Sharded layout (Layout::Sharded), DCP-style:
//   shard-0000r-of-0000N.safetensors  one 1-D tensor per stored piece,
//                                     keyed "<fqn>|<kind>|<begin>"
//   sharded.index.json                {"format": "shardtrain-sharded", "version": 1,
//                                      "world_size": N,
//                                      "tensors": {fqn: {kind: {"shape", "dtype"}}},
//                                      "chunks": [{"fqn", "kind", "begin", "numel",
//                                                  "file", "key", "crc32c"}, ...]}
// Keys only have to be unique within one file: loaders take file and key from
// the index and never parse a key.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace st::checkpoint {

enum class Layout : uint8_t { Unified, Sharded };
/// "unified" or "sharded": the layout's one spelling, in checkpoint.format,
/// trainer_state.json, Catalog::format, log lines and command lines.
std::span<const Named<Layout>> names_of(Layout);
std::string_view layout_name(Layout layout);
/// The layout spelled `name`; nullopt for any other text.
std::optional<Layout> parse_layout(std::string_view name);

inline constexpr std::string_view kUnifiedFormat = "shardtrain-unified";
inline constexpr int kUnifiedVersion = 1;
inline constexpr std::string_view kShardedFormat = "shardtrain-sharded";
inline constexpr int kShardedVersion = 1;
inline constexpr std::string_view kModelIndexName = "model.safetensors.index.json";
inline constexpr std::string_view kMasterIndexName = "master_weights.safetensors.index.json";
inline constexpr std::string_view kOptimizerIndexName = "optimizer.safetensors.index.json";
inline constexpr std::string_view kShardedIndexName = "sharded.index.json";
/// The kind under which a loader sees model weights (model-* files, or a Hugging Face directory).
inline constexpr std::string_view kModelKind = "model";
inline constexpr std::string_view kMasterKind = "master";
/// Catalog::format of a plain Hugging Face model directory.
inline constexpr std::string_view kHuggingFaceFormat = "huggingface";

/// Whether a unified save also writes master_weights-* files: F32 model-*
/// files are the master weights, so with them a second copy would store the
/// same bytes twice (a load takes masters from F32 model weights).
inline bool unified_needs_master_files(bool model_weights, DType model_dtype) {
  return !model_weights || model_dtype != DType::F32;
}

/// "step-000200": the directory name of `step` (at least 6 digits; step >= 0).
std::string step_dir_name(int64_t step);

/// The step of a name written by step_dir_name ("step-" and >= 6 digits, nothing
/// else); nullopt for any other name.
std::optional<int64_t> parse_step_dir_name(std::string_view name);

/// "model-00002-of-00004.safetensors".
std::string unified_file_name(std::string_view family, int k, int n);
/// "shard-00002-of-00004.safetensors".
std::string shard_file_name(int rank, int world_size);
/// Whether `name` (a file an index names: untrusted) stays in the checkpoint
/// directory: not empty, no '/', not "." or "..". Every reader checks this
/// before it opens the file.
bool is_plain_file_name(std::string_view name);
/// "<fqn>|<kind>|<begin>".
std::string chunk_key(const std::string& fqn, const std::string& kind, int64_t begin);

/// One stored 1-D piece of a tensor, as listed in the index.
struct ChunkRecord {
  std::string fqn;
  std::string kind;
  int64_t begin = 0;  // first flat element of the full tensor
  int64_t numel = 0;
  std::string file;     // name within the checkpoint directory
  std::string key;      // tensor name within `file`
  uint32_t crc32c = 0;  // of the chunk's bytes as stored
};

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

/// A tensor as one unified index lists it.
struct UnifiedIndexEntry {
  std::string key;
  std::string file;
  uint32_t crc32c = 0;
  int64_t nbytes = 0;
};
/// The text of the unified index of `family` ("model", "master_weights", "optimizer").
std::string unified_index_text(std::string_view family, int world_size, const std::vector<UnifiedIndexEntry>& entries);

/// The text of sharded.index.json: `tensors` holds shape and dtype of every
/// tensor, `chunks` every stored chunk.
std::string sharded_index_text(int world_size,
                               const std::map<std::pair<std::string, std::string>, std::pair<Shape, DType>>& tensors,
                               const std::vector<ChunkRecord>& chunks);

// ---- The COMPLETE marker: the only thing that makes a checkpoint complete ----
//
//   shardtrain checkpoint
//   step N
//   head <bytes> <crc32c> <name>  one line per safetensors file: the CRC32C of its header
//                                 (the 8-byte length and the JSON)
//   sum <bytes> <crc32c> <name>   one line per other file (JSON, tokenizer): its whole content's CRC32C
//   crc32c <8 hex digits>         of everything above
//
// Every byte of a checkpoint is under a checksum: the marker's own line
// covers the marker, a `sum` line a whole small file (the indexes among
// them), a `head` line a safetensors header, and the index's per-tensor
// CRC32Cs the data, which the header tiles exactly (the reader refuses gaps
// and trailing bytes). The data is checked by every load and `ckpt verify`;
// everything else by incomplete_reason, so by every way into a checkpoint.
//
// Markers of earlier versions list files as "file <bytes> <name>" (the size
// alone): version 1 every file, later ones the safetensors files. They still
// read; check_checkpoint names the files they leave without a checksum.
/// Name of the marker file inside a committed checkpoint directory.
inline constexpr std::string_view kCompleteMarkerName = "COMPLETE";
/// Empty when `dir` holds a complete checkpoint of `step`: a COMPLETE marker
/// that is intact (its CRC32C matches), names `step`, and lists files that all
/// exist with the listed sizes and checksums (marker_file_problem); the
/// marker's part of check_checkpoint (commit.h). Otherwise the reason,
/// e.g. "missing COMPLETE marker", "model.safetensors has 10 bytes, COMPLETE
/// lists 20" or "trainer_state.json fails its checksum in COMPLETE (crc32c
/// 0x1a2b3c4d, COMPLETE lists 0x5e6f7081): the file was changed after the save".
std::string incomplete_reason(const std::filesystem::path& dir, int64_t step);

/// What a COMPLETE marker's line vouches for, besides a file's size.
enum class MarkerSum : uint8_t {
  None,    // "file": the size alone (markers of earlier versions)
  Whole,   // "sum": the CRC32C of the whole file
  Header,  // "head": the CRC32C of a safetensors file's header (read_header_bytes)
};

/// One file a COMPLETE marker lists.
struct MarkerFile {
  std::string name;  // plain file name inside the checkpoint directory
  uintmax_t size = 0;
  MarkerSum sum = MarkerSum::None;
  uint32_t crc32c = 0;  // of what `sum` says
};

/// Empty when `dir`/`f.name` has the size and the checksum that the marker
/// gives; else the problem, naming the file.
std::string marker_file_problem(const std::filesystem::path& dir, const MarkerFile& f);

/// A COMPLETE marker as read back, without looking at the files it lists.
struct CompleteMarker {
  int64_t step = -1;
  std::vector<MarkerFile> files;  // the files this directory holds
  /// Files of the same checkpoint that other hosts hold (node-local roots,
  /// checkpoint/topology.h); empty for a checkpoint whole in one directory.
  std::vector<std::string> elsewhere;
  std::string problem;  // empty when the marker exists, passes its crc32c check and parses
};

/// Reads dir/COMPLETE, so that a checker (`ckpt verify`) can report every
/// listed file that is missing or has the wrong size, not only the first.
CompleteMarker read_complete_marker(const std::filesystem::path& dir);

/// The COMPLETE marker's text for `step`, listing `files_written` (plain
/// names inside `dir`) with their sizes and checksums: a safetensors file's
/// header, any other file whole; each file is fsynced first, so the
/// marker never vouches for data that is not yet durable. Throws st::Error
/// naming a file that cannot be read.
std::string complete_marker_text(const std::filesystem::path& dir, int64_t step,
                                 const std::vector<std::string>& files_written,
                                 const std::vector<std::string>& elsewhere = {});

/// Fsyncs `files_written` (plain names inside `dir`), writes a COMPLETE marker
/// for `step` listing them with their sizes, and fsyncs the marker and `dir`.
/// For a checkpoint directory published other than by PendingCheckpoint (the
/// output of `ckpt convert`, renamed into place by its caller); the marker is
/// the same one commit() writes. Throws st::Error naming the path.
void write_complete_marker(const std::filesystem::path& dir, int64_t step,
                           const std::vector<std::string>& files_written);

}  // namespace st::checkpoint
