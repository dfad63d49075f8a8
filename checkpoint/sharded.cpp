#include "checkpoint/sharded.h"

#include <algorithm>
#include <cstdio>

#include "checkpoint/checkpoint.h"
#include "core/error.h"

namespace st::checkpoint {

std::string shard_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-of-%05d.safetensors", rank, world_size);
  return buf;
}

std::string chunk_key(const std::string& fqn, const std::string& kind, int64_t begin) {
  return fqn + "|" + kind + "|" + std::to_string(begin);
}

std::vector<Read> plan_reads(std::span<const ChunkRecord> chunks, const StateEntry& entry) {
  const int64_t numel = entry.local.defined() ? entry.local.numel() : 0;
  const int64_t end = entry.begin + numel;
  std::vector<const ChunkRecord*> mine;
  for (const ChunkRecord& c : chunks) {
    if (c.fqn == entry.fqn && c.kind == entry.kind && c.numel > 0 && c.begin < end && c.begin + c.numel > entry.begin)
      mine.push_back(&c);
  }
  std::sort(mine.begin(), mine.end(), [](const ChunkRecord* a, const ChunkRecord* b) { return a->begin < b->begin; });

  std::vector<Read> reads;
  int64_t cursor = entry.begin;  // first element not yet planned
  for (const ChunkRecord* c : mine) {
    if (cursor >= end) break;
    const int64_t c_end = c->begin + c->numel;
    if (c_end <= cursor) continue;  // a replica of elements already planned
    ST_CHECK(c->begin <= cursor, "tensor {} kind {}: checkpoint has no data for elements [{}, {})", entry.fqn,
             entry.kind, cursor, c->begin);
    const int64_t stop = std::min(c_end, end);
    reads.push_back(Read{c->file, c->key, cursor - c->begin, cursor - entry.begin, stop - cursor});
    cursor = stop;
  }
  ST_CHECK(cursor >= end, "tensor {} kind {}: checkpoint has no data for elements [{}, {})", entry.fqn, entry.kind,
           cursor, end);
  return reads;
}

void save_sharded(const std::string& dir, std::span<const StateEntry> entries, ProcessGroup& group) {
  save(dir, entries, SaveOptions{.layout = Layout::Sharded, .snapshot = false}, group);
}

void load_sharded(const std::string& dir, std::span<StateEntry> entries, Verify verify) {
  Catalog catalog = read_catalog(dir);
  ST_CHECK(catalog.format == layout_name(Layout::Sharded), "'{}' holds a {} checkpoint, not a sharded one", dir,
           catalog.format);
  load_entries(catalog, entries, LoadOptions{.verify = verify == Verify::Yes});
}

}  // namespace st::checkpoint
