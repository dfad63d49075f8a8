#pragma once
// Planning, shared by both layouts: the global picture of the state every
// rank agrees on before a save (which pieces exist, who writes each), the
// balance of whole tensors over ranks, and which byte ranges of the stored
// chunks a loader reads and checksums.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "checkpoint/index.h"
#include "core/comm.h"
#include "core/state.h"

namespace st::checkpoint {

using TensorId = std::pair<std::string, std::string>;  // (fqn, kind)

struct TensorMeta {
  Shape shape;
  DType dtype = DType::F32;
};

/// One piece of one tensor as some rank holds it.
struct Piece {
  std::string fqn;
  std::string kind;
  int64_t begin = 0;
  int64_t numel = 0;
  int rank = 0;
  size_t entry = 0;  // index into that rank's entries
};

struct GlobalView {
  std::map<TensorId, TensorMeta> tensors;
  /// The pieces to store, sorted by (fqn, kind, begin): one per distinct
  /// (fqn, kind, begin, numel); a piece several ranks hold (a replica) is
  /// stored by the holder with the fewest bytes so far.
  std::vector<Piece> pieces;
  int64_t piece_bytes(const Piece& p) const;
};

/// Collective over `group`: every rank's entry list, checked for agreement
/// (shape and dtype of each tensor, elements inside the shape). Throws the
/// same AgreedError on every rank when any rank's entries are malformed.
GlobalView gather_view(std::span<const StateEntry> entries, ProcessGroup& group);

/// Assigns each name to one of `world` ranks, largest first to the rank with
/// the fewest bytes so far; ties go to the lower rank.
std::map<std::string, int> balance_owners(const std::map<std::string, int64_t>& bytes, int world);

/// One positional read that fills part of an entry from part of a chunk.
struct Read {
  const ChunkRecord* chunk = nullptr;
  int64_t chunk_offset_elems = 0;  // first element read, relative to the chunk
  int64_t entry_offset_elems = 0;  // where it goes, relative to entry.begin
  int64_t count = 0;
};

/// The reads that fill `entry` (elements [begin, begin + local.numel())) from
/// those `chunks` of the same (fqn, kind), in entry order. Overlapping chunks
/// (replicas) are read once. Throws naming the fqn, kind and first missing
/// element range when the chunks do not cover the entry.
std::vector<Read> plan_reads(std::span<const ChunkRecord> chunks, const StateEntry& entry);

/// A byte range [begin, end) of chunk `chunk` (an index into a list of chunks).
struct ByteRange {
  int64_t chunk = 0;
  int64_t begin = 0;
  int64_t end = 0;
  int rank = 0;
};

/// Who checksums what, so that every byte of every chunk is checksummed once
/// and read once: `reads` are the ranges each rank reads anyway (any order,
/// overlaps allowed); `sizes` the byte size of each chunk to verify (-1: not
/// verified). Returns ranges that tile each verified chunk: each inside a
/// range its rank reads, or, for bytes nobody reads, assigned to the rank with
/// the fewest bytes so far (it reads them for the checksum alone). Every rank
/// computes the same result from the same input. `readers` (one list per
/// chunk; empty: every rank) limits who may be given bytes nobody reads: on
/// node-local disks, the ranks whose host holds the chunk's file.
std::vector<ByteRange> assign_checksum_ranges(std::vector<ByteRange> reads, std::span<const int64_t> sizes, int world,
                                              const std::vector<std::vector<int>>& readers = {});

}  // namespace st::checkpoint
