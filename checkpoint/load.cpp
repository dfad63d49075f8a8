// Loading: plan the reads of every entry, agree who checksums which bytes
// (plan.h, assign_checksum_ranges), read each byte once, in blocks that are
// checksummed and scanned while still in cache, then compare the combined
// checksums of every chunk with the index.
#include <algorithm>
#include <cstring>
#include <deque>
#include <filesystem>
#include <memory>
#include <mutex>

#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/plan.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/ops.h"
#include "core/tasks.h"

namespace st::checkpoint {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Read in blocks of this many bytes (checksummed while in cache), and split
// work into tasks of at most kTaskBytes so the reader threads share it evenly.
constexpr int64_t kBlockBytes = int64_t{1} << 20;
constexpr int64_t kTaskBytes = int64_t{16} << 20;

// One contiguous byte range of one chunk this rank reads.
struct Job {
  int64_t chunk = 0;  // index into Loader::chunks
  int64_t begin = 0;  // bytes within the chunk
  int64_t end = 0;
  StateEntry* entry = nullptr;  // null: read for the checksum alone
  int64_t entry_elem = 0;       // entry element that byte `begin` fills
  bool checksum = false;
};

struct Loader {
  const Catalog& catalog;
  const LoadOptions& options;
  ProcessGroup& group;
  std::vector<const ChunkRecord*> chunks;   // every chunk, in catalog order
  std::vector<const StoredTensor*> stored;  // the tensor of each chunk
  std::map<const ChunkRecord*, int64_t> index_of;
  std::vector<std::pair<Read, StateEntry*>> reads;
  std::vector<Job> jobs;
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  std::vector<ByteRange> assigned;  // the ranges this rank checksums (assign_checksum_ranges)
  std::vector<ByteRange> sums;      // the ranges checksummed, as jobs finish, with their CRC in `crcs`
  std::vector<uint32_t> crcs;
  std::map<const StateEntry*, NonFinite> nonfinite;

  int64_t esize(int64_t chunk) const { return static_cast<int64_t>(dtype_size(stored[chunk]->dtype)); }
  void number_chunks();
  void plan(std::span<StateEntry> entries);
  void plan_jobs();
  void open_files();
  void run(const Job& job, std::vector<std::byte>& scratch, std::mutex& mu);
  void read_all();
  void verify(const std::vector<ByteRange>& ranges, const std::vector<uint32_t>& crcs) const;
  void refuse_nonfinite() const;
};

void Loader::number_chunks() {
  for (const auto& [id, t] : catalog.tensors)
    for (const ChunkRecord& c : t.chunks) {
      index_of[&c] = static_cast<int64_t>(chunks.size());
      chunks.push_back(&c);
      stored.push_back(&t);
    }
}

// The stored tensor an entry loads from (master weights may come from model weights).
const std::pair<const std::pair<std::string, std::string>, StoredTensor>& source_of(const Catalog& cat,
                                                                                    const StateEntry& e,
                                                                                    const LoadOptions& options) {
  auto it = cat.tensors.find({e.fqn, e.kind});
  if (it == cat.tensors.end() && e.kind == kMasterKind) {
    auto model = cat.tensors.find({e.fqn, std::string(kModelKind)});
    if (model != cat.tensors.end()) {
      // Named by the catalog's first such tensor, not this entry's: every
      // rank then reports the same message.
      auto first_model = [&] {
        for (const auto& [id, t] : cat.tensors)
          if (id.second == kModelKind && !cat.tensors.contains({id.first, std::string(kMasterKind)})) return id.first;
        return e.fqn;
      };
      ST_CHECK(model->second.dtype == DType::F32 || options.master_from_model,
               "checkpoint '{}' has no master weights, only {} model weights ({} is one); add master_weight_compatible "
               "to checkpoint.unified_checkpoint_config to start the F32 master weights from them",
               cat.dir, model->second.dtype, first_model());
      it = model;
    }
  }
  ST_CHECK(it != cat.tensors.end(), "tensor {} kind {} is not in checkpoint '{}'", e.fqn, e.kind, cat.dir);
  return *it;
}

void Loader::plan(std::span<StateEntry> entries) {
  for (StateEntry& e : entries) {
    const auto& [id, t] = source_of(catalog, e, options);
    ST_CHECK(t.shape == e.global_shape, "tensor {} kind {}: checkpoint '{}' has shape {}, the model has {}", e.fqn,
             id.second, catalog.dir, shape_str(t.shape), shape_str(e.global_shape));
    const bool convertible = t.dtype == e.local.dtype() || (t.dtype != DType::I32 && e.local.dtype() != DType::I32);
    ST_CHECK(convertible, "tensor {} kind {}: cannot load {} data into {}", e.fqn, id.second, t.dtype, e.local.dtype());
    const int64_t numel = e.local.defined() ? e.local.numel() : 0;
    ST_CHECK(e.begin >= 0 && e.begin + numel <= shape_numel(e.global_shape),
             "tensor {} kind {}: elements [{}, {}) lie outside its shape {}", e.fqn, e.kind, e.begin, e.begin + numel,
             shape_str(e.global_shape));
    if (numel == 0) continue;
    for (const Read& r : plan_reads(t.chunks, StateEntry{e.fqn, id.second, e.global_shape, e.dtype, e.begin, e.local}))
      reads.emplace_back(r, &e);
  }
}

// My reads, split where my checksummed ranges start and end, plus the ranges
// nobody reads that I checksum alone.
void Loader::plan_jobs() {
  std::vector<Job> pieces;
  std::vector<bool> inside(assigned.size(), false);
  for (const auto& [r, entry] : reads) {
    const int64_t c = index_of.at(r.chunk);
    const int64_t b = r.chunk_offset_elems * esize(c), e = (r.chunk_offset_elems + r.count) * esize(c);
    std::vector<int64_t> cuts{b, e};
    for (size_t i = 0; i < assigned.size(); ++i) {
      if (assigned[i].chunk != c || assigned[i].begin < b || assigned[i].end > e) continue;
      inside[i] = true;
      cuts.push_back(assigned[i].begin);
      cuts.push_back(assigned[i].end);
    }
    std::sort(cuts.begin(), cuts.end());
    cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      const bool sum = std::any_of(assigned.begin(), assigned.end(), [&](const ByteRange& s) {
        return s.chunk == c && s.begin <= cuts[k] && cuts[k + 1] <= s.end;
      });
      pieces.push_back({c, cuts[k], cuts[k + 1], entry, r.entry_offset_elems + (cuts[k] - b) / esize(c), sum});
    }
  }
  for (size_t i = 0; i < assigned.size(); ++i)
    if (!inside[i]) pieces.push_back({assigned[i].chunk, assigned[i].begin, assigned[i].end, nullptr, 0, true});
  for (const Job& p : pieces) {
    const int64_t step = std::max<int64_t>(esize(p.chunk), kTaskBytes / esize(p.chunk) * esize(p.chunk));
    for (int64_t at = p.begin; at < p.end; at += step) {
      Job j = p;
      j.begin = at;
      j.end = std::min(p.end, at + step);
      j.entry_elem = p.entry_elem + (at - p.begin) / esize(p.chunk);
      jobs.push_back(j);
    }
  }
}

void Loader::open_files() {
  for (const Job& j : jobs) {
    const ChunkRecord& c = *chunks[static_cast<size_t>(j.chunk)];
    if (files.count(c.file) == 0) {
      const std::string path = (fs::path(catalog.dir) / c.file).string();
      ST_CHECK(fs::exists(path), "checkpoint file '{}' (holding tensor {} kind {}) is missing", path, c.fqn, c.kind);
      files.emplace(c.file, std::make_unique<SafetensorsFile>(path));
    }
    const SafetensorsFile& f = *files.at(c.file);
    ST_CHECK(f.has(c.key), "checkpoint file '{}' has no tensor '{}' (tensor {} kind {})", f.path(), c.key, c.fqn,
             c.kind);
    const TensorInfo& info = f.info(c.key);
    const StoredTensor& t = *stored[static_cast<size_t>(j.chunk)];
    ST_CHECK(shape_numel(info.shape) == c.numel && info.dtype == t.dtype,
             "checkpoint file '{}': tensor '{}' is {} {}, the index says {} elements of {}", f.path(), c.key,
             info.dtype, shape_str(info.shape), c.numel, t.dtype);
  }
}

void merge(NonFinite& total, const NonFinite& part) {
  if (part.first >= 0 && (total.first < 0 || part.first < total.first)) total.first = part.first;
  total.nan += part.nan;
  total.inf += part.inf;
}

void Loader::run(const Job& job, std::vector<std::byte>& scratch, std::mutex& mu) {
  const ChunkRecord& c = *chunks[static_cast<size_t>(job.chunk)];
  const SafetensorsFile& f = *files.at(c.file);
  const DType from = stored[static_cast<size_t>(job.chunk)]->dtype;
  const int64_t es = esize(job.chunk);
  const Tensor* local = job.entry != nullptr ? &job.entry->local : nullptr;
  const bool direct = local != nullptr && local->dtype() == from && local->device().is_cpu();
  uint32_t crc = 0;
  NonFinite bad;
  for (int64_t at = job.begin; at < job.end; at += kBlockBytes) {
    const int64_t n = std::min(kBlockBytes, job.end - at);
    const int64_t elem = job.entry_elem + (at - job.begin) / es;  // entry element of this block
    std::byte* dst = nullptr;
    if (direct) {
      dst = static_cast<std::byte*>(local->raw_data()) + elem * es;
    } else {
      scratch.resize(static_cast<size_t>(n));
      dst = scratch.data();
    }
    f.read(c.key, static_cast<uint64_t>(at), static_cast<uint64_t>(n), dst);
    const std::span<const std::byte> bytes(dst, static_cast<size_t>(n));
    if (job.checksum) crc = crc32c(bytes, crc);
    if (local == nullptr) continue;
    if (options.refuse_nonfinite) merge(bad, count_nonfinite(bytes, from, job.entry->begin + elem));
    if (!direct) {
      Tensor block = Tensor::empty({n / es}, from);
      std::memcpy(block.raw_data(), dst, static_cast<size_t>(n));
      local->view({local->numel()})
          .flat_slice(elem, n / es)
          .copy_from(from == local->dtype() ? block : ops::cast(block, local->dtype()));
    }
  }
  std::lock_guard lock(mu);
  if (job.checksum) {
    sums.push_back({job.chunk, job.begin, job.end, group.rank()});
    crcs.push_back(crc);
  }
  if (local != nullptr) merge(nonfinite[job.entry], bad);
}

void Loader::read_all() {
  std::vector<std::vector<std::byte>> scratch(static_cast<size_t>(std::max(1, options.threads)));
  std::mutex mu;
  const std::string error = run_tasks(jobs.size(), options.threads, [&](size_t i, int worker) {
    run(jobs[i], scratch[static_cast<size_t>(worker)], mu);
  });
  ST_CHECK(error.empty(), "{}", error);
}

void Loader::verify(const std::vector<ByteRange>& ranges, const std::vector<uint32_t>& crc_of) const {
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(ranges[a].chunk, ranges[a].begin) < std::tie(ranges[b].chunk, ranges[b].begin);
  });
  size_t k = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    if (!stored[c]->checksummed) continue;
    const ChunkRecord& chunk = *chunks[c];
    uint32_t crc = 0;
    int64_t covered = 0;
    for (; k < order.size() && ranges[order[k]].chunk == static_cast<int64_t>(c); ++k) {
      const ByteRange& r = ranges[order[k]];
      ST_CHECK(r.begin == covered, "internal: checksummed ranges of '{}' in '{}' leave a gap at byte {}", chunk.key,
               chunk.file, covered);
      crc = crc32c_combine(crc, crc_of[order[k]], static_cast<uint64_t>(r.end - r.begin));
      covered = r.end;
    }
    ST_CHECK(covered == chunk.numel * esize(static_cast<int64_t>(c)),
             "internal: checksummed ranges of '{}' in '{}' cover {} bytes", chunk.key, chunk.file, covered);
    ST_CHECK(crc == chunk.crc32c,
             "checksum mismatch in '{}', tensor '{}' ({} kind {}): crc32c {} but the index records {}",
             (fs::path(catalog.dir) / chunk.file).string(), chunk.key, chunk.fqn, chunk.kind, crc_text(crc),
             crc_text(chunk.crc32c));
  }
}

void Loader::refuse_nonfinite() const {
  for (const auto& [e, bad] : nonfinite)
    ST_CHECK(!bad.any(), "{}: tensor '{}' ({}) holds {} NaN and {} Inf values (the first at element {})", catalog.dir,
             e->fqn, e->kind, bad.nan, bad.inf, bad.first);
}

std::vector<ByteRange> gather_ranges(ProcessGroup& group, const std::vector<ByteRange>& mine,
                                     const std::vector<uint32_t>* crcs, std::vector<uint32_t>* all_crcs) {
  json list = json::array();
  for (size_t i = 0; i < mine.size(); ++i) {
    json r = {mine[i].chunk, mine[i].begin, mine[i].end};
    if (crcs != nullptr) r.push_back((*crcs)[i]);
    list.push_back(r);
  }
  std::vector<ByteRange> out;
  const std::vector<std::string> texts = all_gather_strings(group, list.dump());
  for (size_t rank = 0; rank < texts.size(); ++rank)
    for (const json& r : json::parse(texts[rank])) {
      out.push_back({r[0].get<int64_t>(), r[1].get<int64_t>(), r[2].get<int64_t>(), static_cast<int>(rank)});
      if (all_crcs != nullptr) all_crcs->push_back(r[3].get<uint32_t>());
    }
  return out;
}

// Host stand-ins for entries on a device (loaded, then copied back).
// Node-local disks: the reads of files this rank's host does not hold are
// done for it by a rank whose host does (into a proxy entry of the
// requester's dtype) and sent over after read_all (all_to_allv). Every rank
// gathers every rank's requests and picks the same server for each: among
// the ranks that can read the file, the one with the fewest bytes served.
struct RemoteReads {
  struct Request {
    int64_t chunk = 0;
    int64_t offset = 0;  // elements, relative to the chunk
    int64_t count = 0;
    DType dtype = DType::F32;  // the requester's entry dtype
    int server = -1;
    int64_t bytes() const { return count * static_cast<int64_t>(dtype_size(dtype)); }
  };
  std::vector<std::vector<Request>> requests;            // [rank], in the requester's order
  std::vector<std::pair<StateEntry*, int64_t>> my_dest;  // my requests: the entry and its element offset
  std::deque<StateEntry> proxies;                        // what I read for others, by requester then order
};

RemoteReads route_remote_reads(Loader& loader, const std::map<std::string, std::vector<int>>& readers,
                               ProcessGroup& group) {
  RemoteReads out;
  const int me = group.rank();
  auto readers_of = [&](int64_t chunk) -> const std::vector<int>& {
    const std::string& file = loader.chunks[static_cast<size_t>(chunk)]->file;
    const auto it = readers.find(file);
    ST_CHECK(it != readers.end() && !it->second.empty(), "checkpoint file '{}' is on none of the hosts taking part",
             file);
    return it->second;
  };
  json mine = json::array();
  std::vector<std::pair<Read, StateEntry*>> local;
  for (const auto& [r, entry] : loader.reads) {
    const int64_t c = loader.index_of.at(r.chunk);
    const std::vector<int>& can = readers_of(c);
    if (std::find(can.begin(), can.end(), me) != can.end()) {
      local.emplace_back(r, entry);
      continue;
    }
    mine.push_back({c, r.chunk_offset_elems, r.count, static_cast<int>(entry->local.dtype())});
    out.my_dest.emplace_back(entry, r.entry_offset_elems);
  }
  loader.reads = std::move(local);
  std::vector<int64_t> served(static_cast<size_t>(group.size()), 0);
  for (const std::string& text : all_gather_strings(group, mine.dump())) {
    std::vector<RemoteReads::Request>& list = out.requests.emplace_back();
    for (const json& j : json::parse(text)) {
      RemoteReads::Request q{j[0].get<int64_t>(), j[1].get<int64_t>(), j[2].get<int64_t>(),
                             static_cast<DType>(j[3].get<int>()), -1};
      const std::vector<int>& can = readers_of(q.chunk);
      q.server = *std::min_element(can.begin(), can.end(), [&](int a, int b) {
        return std::pair(served[static_cast<size_t>(a)], a) < std::pair(served[static_cast<size_t>(b)], b);
      });
      served[static_cast<size_t>(q.server)] += q.bytes();
      list.push_back(q);
    }
  }
  for (const std::vector<RemoteReads::Request>& list : out.requests)
    for (const RemoteReads::Request& q : list) {
      if (q.server != me) continue;
      const ChunkRecord& c = *loader.chunks[static_cast<size_t>(q.chunk)];
      const StoredTensor& t = *loader.stored[static_cast<size_t>(q.chunk)];
      StateEntry& proxy = out.proxies.emplace_back(
          StateEntry{c.fqn, c.kind, t.shape, q.dtype, c.begin + q.offset, Tensor::empty({q.count}, q.dtype)});
      loader.reads.emplace_back(Read{&c, q.offset, 0, q.count}, &proxy);
    }
  return out;
}

// After read_all: each server sends what it read for each requester; each
// requester copies it into its entries. Pieces travel as BF16-sized units.
void deliver_remote_reads(RemoteReads& remote, ProcessGroup& group) {
  const int me = group.rank();
  const size_t world = static_cast<size_t>(group.size());
  std::vector<int64_t> send(world, 0), recv(world, 0);
  for (size_t r = 0; r < world; ++r)
    for (const RemoteReads::Request& q : remote.requests[r]) {
      if (q.server == me) send[r] += q.bytes() / 2;
      if (static_cast<int>(r) == me) recv[static_cast<size_t>(q.server)] += q.bytes() / 2;
    }
  int64_t n_send = 0, n_recv = 0;
  for (size_t r = 0; r < world; ++r) n_send += send[r], n_recv += recv[r];
  Tensor out = Tensor::empty({n_send}, DType::BF16);
  auto* at = static_cast<std::byte*>(out.raw_data());
  for (const StateEntry& proxy : remote.proxies) {  // already in (requester, order) order
    std::memcpy(at, proxy.local.raw_data(), proxy.local.nbytes());
    at += proxy.local.nbytes();
  }
  Tensor in = Tensor::empty({n_recv}, DType::BF16);
  group.all_to_allv(in, recv, out, send).wait();
  // My requests arrive grouped by server, each server's in my order.
  std::vector<int64_t> offset(world, 0);
  for (size_t s = 1; s < world; ++s) offset[s] = offset[s - 1] + recv[s - 1] * 2;
  const auto* base = static_cast<const std::byte*>(in.raw_data());
  const std::vector<RemoteReads::Request>& mine = remote.requests[static_cast<size_t>(me)];
  for (size_t k = 0; k < mine.size(); ++k) {
    const auto& [entry, entry_offset] = remote.my_dest[k];
    const size_t esize = dtype_size(mine[k].dtype);
    int64_t& from = offset[static_cast<size_t>(mine[k].server)];
    std::memcpy(static_cast<std::byte*>(entry->local.raw_data()) + static_cast<size_t>(entry_offset) * esize,
                base + from, static_cast<size_t>(mine[k].bytes()));
    from += mine[k].bytes();
  }
}

std::vector<StateEntry> on_host(std::span<StateEntry> entries) {
  std::vector<StateEntry> host(entries.begin(), entries.end());
  for (StateEntry& e : host)
    if (e.local.defined() && !e.local.device().is_cpu()) e.local = Tensor::empty({e.local.numel()}, e.local.dtype());
  return host;
}

}  // namespace

void load_entries(const Catalog& catalog, std::span<StateEntry> entries, const LoadOptions& options,
                  ProcessGroup& group) {
  std::vector<StateEntry> host = on_host(entries);
  Loader loader{catalog, options, group, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
  std::vector<int64_t> sizes;
  std::vector<ByteRange> mine;
  RemoteReads remote;
  std::vector<std::vector<int>> readers;  // per chunk, on node-local disks: the ranks that can read its file
  run_on_every_rank(group, [&] {
    loader.number_chunks();
    loader.plan(host);
  });
  if (!options.file_readers.empty()) {
    run_on_every_rank(group, [&] {
      for (const ChunkRecord* c : loader.chunks) {
        const auto it = options.file_readers.find(c->file);
        readers.push_back(it != options.file_readers.end() ? it->second : std::vector<int>{});
      }
    });
    remote = route_remote_reads(loader, options.file_readers, group);
  }
  run_on_every_rank(group, [&] {
    for (size_t c = 0; c < loader.chunks.size(); ++c)
      sizes.push_back(options.verify && loader.stored[c]->checksummed
                          ? loader.chunks[c]->numel * loader.esize(static_cast<int64_t>(c))
                          : -1);
    for (const auto& [r, entry] : loader.reads) {
      const int64_t c = loader.index_of.at(r.chunk);
      mine.push_back({c, r.chunk_offset_elems * loader.esize(c), (r.chunk_offset_elems + r.count) * loader.esize(c),
                      group.rank()});
    }
  });
  std::vector<ByteRange> assigned;
  const std::vector<ByteRange> all_reads = gather_ranges(group, mine, nullptr, nullptr);
  run_on_every_rank(group, [&] { assigned = assign_checksum_ranges(all_reads, sizes, group.size(), readers); });
  for (const ByteRange& s : assigned)
    if (s.rank == group.rank()) loader.assigned.push_back(s);
  run_on_every_rank(group, [&] {
    loader.plan_jobs();
    loader.open_files();
    loader.read_all();
  });
  if (!options.file_readers.empty()) deliver_remote_reads(remote, group);
  std::vector<uint32_t> all_crcs;
  const std::vector<ByteRange> ranges = gather_ranges(group, loader.sums, &loader.crcs, &all_crcs);
  run_on_every_rank(group, [&] {
    if (options.verify) loader.verify(ranges, all_crcs);
    loader.refuse_nonfinite();
    for (size_t i = 0; i < entries.size(); ++i)
      if (entries[i].local.defined() && !entries[i].local.device().is_cpu()) entries[i].local.copy_from(host[i].local);
  });
}

void load_entries(const Catalog& catalog, std::span<StateEntry> entries, const LoadOptions& options) {
  std::unique_ptr<ProcessGroup> alone = make_local_group();
  try {
    load_entries(catalog, entries, options, *alone);
  } catch (const AgreedError& e) {
    // One process: "agreed" adds nothing; callers see a plain error.
    throw Error(e.message(), __FILE__, __LINE__);
  }
}

}  // namespace st::checkpoint
