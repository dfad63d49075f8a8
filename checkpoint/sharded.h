#pragma once
// Sharded (DCP-style) checkpoints: every rank writes the state entries it
// holds to its own file, and rank 0 writes an index of every chunk; a loader
// reads only the byte ranges that overlap its own entries, whatever sharding
// the saver used (DESIGN.md, "Checkpoint directory").
//
//   dir/shard-0000r-of-0000N.safetensors  one 1-D tensor per non-empty entry,
//                                         keyed "<fqn>|<kind>|<begin>"
//   dir/sharded.index.json                {"format": "shardtrain-sharded", "version": 1,
//                                          "world_size": N,
//                                          "tensors": {fqn: {kind: {"shape", "dtype"}}},
//                                          "chunks": [{"fqn", "kind", "begin", "numel",
//                                                      "file", "key", "crc32c"}, ...]}
//
// The key format only has to be unique within one file: loaders take file and
// key from the index and never parse a key.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/comm.h"
#include "core/state.h"

namespace st::checkpoint {

inline constexpr std::string_view kShardedIndexName = "sharded.index.json";
inline constexpr std::string_view kShardedFormat = "shardtrain-sharded";
inline constexpr int kShardedVersion = 1;

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

/// One positional read that fills part of an entry from part of a chunk.
struct Read {
  std::string file;
  std::string key;
  int64_t chunk_offset_elems = 0;  // first element read, relative to the chunk
  int64_t entry_offset_elems = 0;  // where it goes, relative to entry.begin
  int64_t count = 0;
};

/// Whether load_sharded checks each touched chunk's CRC32C.
enum class Verify : uint8_t { No, Yes };

/// "shard-00002-of-00004.safetensors".
std::string shard_file_name(int rank, int world_size);
/// "<fqn>|<kind>|<begin>".
std::string chunk_key(const std::string& fqn, const std::string& kind, int64_t begin);

/// The reads that fill `entry` (elements [begin, begin + local.numel())) from
/// those `chunks` of the same (fqn, kind), in entry order. Overlapping chunks
/// (replicas) are read once. Throws naming the fqn, kind and first missing
/// element range when the chunks do not cover the entry.
std::vector<Read> plan_reads(std::span<const ChunkRecord> chunks, const StateEntry& entry);

/// Collective over `group`: writes this rank's entries to
/// dir/shard-<rank>-of-<size>.safetensors, then rank 0 writes the index
/// (temp file, fsync, rename). `dir` must exist. Returns when every file is
/// durable; a failure on any rank throws on every rank.
void save_sharded(const std::string& dir, std::span<const StateEntry> entries, ProcessGroup& group);

/// Not collective: fills every entry's `local` from the checkpoint in `dir`,
/// converting F32 <-> BF16 where the stored dtype differs from local's.
/// Throws naming the file, key, tensor or element range at fault.
void load_sharded(const std::string& dir, std::span<StateEntry> entries, Verify verify);

}  // namespace st::checkpoint
