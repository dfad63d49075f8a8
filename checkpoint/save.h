#pragma once
// Inside a save (checkpoint.h has the front door): what each layout plans,
// the file plans both layouts share, and the streaming writer that fills them.
//
// A save needs no exchange of tensor data between ranks. Every file's header
// is known in advance (shapes and dtypes of all tensors), so every rank
// writes the pieces it holds straight to their final offsets, in whichever
// file holds their tensor, and checksums each piece as it writes it; the
// CRC32C of a whole tensor is combined from its pieces' (crc32c_combine).
// Each file's header is written by one rank.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/plan.h"

namespace st::checkpoint {

/// One tensor of a planned file.
struct FileTensor {
  std::string key;
  TensorId id;
  DType dtype = DType::F32;  // as stored
  Shape shape;               // as stored
  int64_t begin = 0;         // first element of the full tensor (a sharded chunk; 0 otherwise)
  int64_t numel = 0;
  uint64_t offset = 0;  // absolute file offset of the first byte
};

/// One file every rank knows the layout of before any byte is written.
struct FilePlan {
  std::string family;  // "shard", "model", "master_weights", "optimizer"
  std::string name;
  int header_rank = 0;  // the rank that writes the header
  std::map<std::string, std::string> metadata;
  std::vector<FileTensor> tensors;
  std::string header;  // the bytes before the first tensor (length prefix, JSON, padding)
  uint64_t size = 0;   // of the whole file
};

/// One piece this rank writes: elements [elem, elem + numel) of a file
/// tensor, taken from elements [entry_elem, ...) of entry `entry`.
struct PieceWrite {
  size_t file = 0;
  size_t tensor = 0;
  int64_t elem = 0;
  int64_t numel = 0;
  size_t entry = 0;
  int64_t entry_elem = 0;
};

struct SavePlan {
  Layout layout = Layout::Unified;
  std::vector<FilePlan> files;     // every file of the save (each rank knows all)
  std::vector<PieceWrite> writes;  // this rank's
  int64_t bytes = 0;               // of tensor data this rank writes
  int64_t total_bytes = 0;         // all ranks together
};

/// Whole tensors, each in one file of its family; file k of a family belongs
/// to the k-th of the ranks that own tensors of it (owners balanced by the
/// bytes each FQN puts on disk, all kinds of one FQN on one owner).
SavePlan plan_unified(const GlobalView& view, const SaveOptions& options, int rank, int world);
/// One file per rank that holds pieces: each piece a 1-D tensor of its own.
SavePlan plan_sharded(const GlobalView& view, int rank, int world);

/// Fills in each file's header, tensor offsets and size from its tensors.
void lay_out_files(std::vector<FilePlan>& files);

/// The checksum of one written piece.
struct PieceSum {
  size_t file = 0;
  size_t tensor = 0;
  int64_t elem = 0;
  int64_t numel = 0;
  uint32_t crc32c = 0;
  NonFinite nonfinite;  // element indices relative to the file tensor
};

/// The CRC32C of every file tensor, combined from the pieces of all ranks,
/// indexed [file][tensor]. Throws naming the tensor when the pieces do not
/// tile it exactly, or when any piece holds non-finite values (a save must
/// never store them).
std::vector<std::vector<uint32_t>> combine_piece_sums(const SavePlan& plan, std::vector<PieceSum> sums);

/// The index files of a save: {name, text}.
std::vector<std::pair<std::string, std::string>> unified_indexes(const SavePlan& plan,
                                                                 const std::vector<std::vector<uint32_t>>& crcs,
                                                                 int world);
std::vector<std::pair<std::string, std::string>> sharded_index(const SavePlan& plan, const GlobalView& view,
                                                               const std::vector<std::vector<uint32_t>>& crcs,
                                                               int world);

}  // namespace st::checkpoint
