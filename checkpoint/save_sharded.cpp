// The sharded (DCP-style) layout's plan and index (index.h describes the files).
#include "checkpoint/save.h"

namespace st::checkpoint {

SavePlan plan_sharded(const GlobalView& view, int rank, int world) {
  SavePlan plan;
  plan.layout = Layout::Sharded;
  std::vector<FilePlan> by_rank(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    by_rank[static_cast<size_t>(r)] =
        FilePlan{"shard", shard_file_name(r, world), r, {{"format", std::string(kShardedFormat)}}, {}, {}, 0};
  std::vector<std::pair<size_t, const Piece*>> mine;  // (tensor index in this rank's file, piece)
  for (const Piece& p : view.pieces) {
    const TensorMeta& meta = view.tensors.at({p.fqn, p.kind});
    FilePlan& file = by_rank[static_cast<size_t>(p.rank)];
    if (p.rank == rank) mine.emplace_back(file.tensors.size(), &p);
    file.tensors.push_back(
        {chunk_key(p.fqn, p.kind, p.begin), {p.fqn, p.kind}, meta.dtype, Shape{p.numel}, p.begin, p.numel, 0});
    plan.total_bytes += view.piece_bytes(p);
  }
  // Ranks that hold nothing write no file.
  size_t own_file = 0;
  for (FilePlan& file : by_rank) {
    if (file.tensors.empty()) continue;
    if (file.header_rank == rank) own_file = plan.files.size();
    plan.files.push_back(std::move(file));
  }
  for (const auto& [t, p] : mine) {
    plan.writes.push_back({own_file, t, 0, p->numel, p->entry, 0});
    plan.bytes += view.piece_bytes(*p);
  }
  return plan;
}

std::vector<std::pair<std::string, std::string>> sharded_index(const SavePlan& plan, const GlobalView& view,
                                                               const std::vector<std::vector<uint32_t>>& crcs,
                                                               int world) {
  std::map<std::pair<std::string, std::string>, std::pair<Shape, DType>> tensors;
  for (const auto& [id, meta] : view.tensors) tensors[id] = {meta.shape, meta.dtype};
  // Chunks in the order of the pieces (by tensor, then begin), as the index has always listed them.
  std::map<std::pair<std::string, std::string>, uint32_t> crc_of;  // (file, key)
  for (size_t f = 0; f < plan.files.size(); ++f)
    for (size_t t = 0; t < plan.files[f].tensors.size(); ++t)
      crc_of[{plan.files[f].name, plan.files[f].tensors[t].key}] = crcs[f][t];
  std::vector<ChunkRecord> chunks;
  for (const Piece& p : view.pieces) {
    ChunkRecord c{p.fqn, p.kind, p.begin, p.numel, shard_file_name(p.rank, world), chunk_key(p.fqn, p.kind, p.begin),
                  0};
    c.crc32c = crc_of.at({c.file, c.key});
    chunks.push_back(std::move(c));
  }
  return {{std::string(kShardedIndexName), sharded_index_text(world, tensors, chunks)}};
}

}  // namespace st::checkpoint
