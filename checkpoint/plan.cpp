#include "checkpoint/plan.h"

#include <algorithm>
#include <tuple>

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace st::checkpoint {
namespace {

using nlohmann::json;

auto order(const Piece& p) { return std::tie(p.fqn, p.kind, p.begin, p.numel, p.rank); }

json describe(std::span<const StateEntry> entries) {
  json list = json::array();
  for (const StateEntry& e : entries) {
    const int64_t numel = e.local.defined() ? e.local.numel() : 0;
    ST_CHECK(e.begin >= 0 && e.begin + numel <= shape_numel(e.global_shape),
             "tensor {} kind {}: elements [{}, {}) lie outside its shape {}", e.fqn, e.kind, e.begin, e.begin + numel,
             shape_str(e.global_shape));
    ST_CHECK(numel == 0 || e.local.dtype() == e.dtype, "tensor {} kind {}: local holds {} but the entry says {}", e.fqn,
             e.kind, e.local.dtype(), e.dtype);
    ST_CHECK(e.fqn.find('|') == std::string::npos && e.kind.find('.') == std::string::npos,
             "tensor {} kind {}: '|' in a name or '.' in a kind cannot be stored", e.fqn, e.kind);
    list.push_back({e.fqn, e.kind, e.global_shape, std::string(dtype_name(e.dtype)), e.begin, numel});
  }
  return list;
}

}  // namespace

int64_t GlobalView::piece_bytes(const Piece& p) const {
  return p.numel * static_cast<int64_t>(dtype_size(tensors.at({p.fqn, p.kind}).dtype));
}

GlobalView gather_view(std::span<const StateEntry> entries, ProcessGroup& group) {
  std::string mine;
  run_on_every_rank(group, [&] { mine = describe(entries).dump(); });
  std::vector<std::string> lists = all_gather_strings(group, mine);

  GlobalView view;
  std::map<TensorId, int> first_rank;
  std::vector<Piece> all;
  for (int r = 0; r < group.size(); ++r) {
    json list = json::parse(lists[static_cast<size_t>(r)]);
    for (size_t i = 0; i < list.size(); ++i) {
      const json& j = list[i];
      TensorId id{j[0].get<std::string>(), j[1].get<std::string>()};
      TensorMeta meta{j[2].get<Shape>(), *dtype_from_name(j[3].get<std::string>())};
      auto [it, inserted] = view.tensors.emplace(id, meta);
      if (inserted) first_rank[id] = r;
      ST_CHECK(it->second.shape == meta.shape && it->second.dtype == meta.dtype,
               "tensor {} kind {}: rank {} holds it as {} {} but rank {} as {} {}", id.first, id.second, first_rank[id],
               it->second.dtype, shape_str(it->second.shape), r, meta.dtype, shape_str(meta.shape));
      const int64_t numel = j[5].get<int64_t>();
      if (numel > 0) all.push_back(Piece{id.first, id.second, j[4].get<int64_t>(), numel, r, i});
    }
  }
  std::sort(all.begin(), all.end(), [](const Piece& a, const Piece& b) { return order(a) < order(b); });
  std::vector<int64_t> load(static_cast<size_t>(group.size()), 0);
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j].fqn == all[i].fqn && all[j].kind == all[i].kind && all[j].begin == all[i].begin &&
           all[j].numel == all[i].numel)
      ++j;
    size_t best = i;  // replicas [i, j): the holder with the least load so far writes it
    for (size_t k = i + 1; k < j; ++k)
      if (load[static_cast<size_t>(all[k].rank)] < load[static_cast<size_t>(all[best].rank)]) best = k;
    const TensorMeta& meta = view.tensors.at({all[best].fqn, all[best].kind});
    load[static_cast<size_t>(all[best].rank)] += all[best].numel * static_cast<int64_t>(dtype_size(meta.dtype));
    view.pieces.push_back(all[best]);
    i = j;
  }
  return view;
}

std::map<std::string, int> balance_owners(const std::map<std::string, int64_t>& bytes, int world) {
  std::vector<std::pair<std::string, int64_t>> order(bytes.begin(), bytes.end());
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::map<std::string, int> owner;
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  for (const auto& [name, b] : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[name] = r;
    load[static_cast<size_t>(r)] += b;
  }
  return owner;
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
    reads.push_back(Read{c, cursor - c->begin, cursor - entry.begin, stop - cursor});
    cursor = stop;
  }
  ST_CHECK(cursor >= end, "tensor {} kind {}: checkpoint has no data for elements [{}, {})", entry.fqn, entry.kind,
           cursor, end);
  return reads;
}

std::vector<ByteRange> assign_checksum_ranges(std::vector<ByteRange> reads, std::span<const int64_t> sizes, int world,
                                              const std::vector<std::vector<int>>& readers) {
  std::sort(reads.begin(), reads.end(), [](const ByteRange& a, const ByteRange& b) {
    return std::tie(a.chunk, a.begin, a.end, a.rank) < std::tie(b.chunk, b.begin, b.end, b.rank);
  });
  std::vector<int64_t> load(static_cast<size_t>(std::max(1, world)), 0);
  for (const ByteRange& r : reads) load[static_cast<size_t>(r.rank)] += r.end - r.begin;
  std::vector<ByteRange> out, gaps;
  size_t i = 0;
  for (int64_t chunk = 0; chunk < static_cast<int64_t>(sizes.size()); ++chunk) {
    while (i < reads.size() && reads[i].chunk < chunk) ++i;
    const int64_t size = sizes[static_cast<size_t>(chunk)];
    if (size < 0) continue;
    int64_t cursor = 0;  // bytes [0, cursor) are assigned
    for (; i < reads.size() && reads[i].chunk == chunk; ++i) {
      const ByteRange& r = reads[i];
      if (r.begin > cursor) gaps.push_back({chunk, cursor, std::min(r.begin, size), -1});
      const int64_t end = std::min(r.end, size);
      if (end > cursor) out.push_back({chunk, std::max(cursor, r.begin), end, r.rank});
      cursor = std::max(cursor, end);
    }
    if (cursor < size) gaps.push_back({chunk, cursor, size, -1});
  }
  // Bytes nobody reads, in parts small enough to spread over the ranks.
  constexpr int64_t kPart = int64_t{64} << 20;
  for (const ByteRange& g : gaps) {
    for (int64_t at = g.begin; at < g.end; at += kPart) {
      int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
      if (!readers.empty()) {
        // Only a rank that can read the chunk's file (node-local disks) checksums it.
        const std::vector<int>& can = readers[static_cast<size_t>(g.chunk)];
        ST_CHECK(!can.empty(), "no rank can read chunk {} to checksum it", g.chunk);
        r = *std::min_element(can.begin(), can.end(), [&](int a, int b) {
          return std::pair(load[static_cast<size_t>(a)], a) < std::pair(load[static_cast<size_t>(b)], b);
        });
      }
      const int64_t end = std::min(g.end, at + kPart);
      load[static_cast<size_t>(r)] += end - at;
      out.push_back({g.chunk, at, end, r});
    }
  }
  std::sort(out.begin(), out.end(), [](const ByteRange& a, const ByteRange& b) {
    return std::tie(a.chunk, a.begin) < std::tie(b.chunk, b.begin);
  });
  return out;
}

}  // namespace st::checkpoint
