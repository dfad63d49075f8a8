// A save's life: stage (collective: the plan, a snapshot), write (this
// rank's pieces, streamed with their checksums, then fsync), finish
// (collective: errors and checksums shared, rank 0 writes the indexes).
#include "checkpoint/save.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>

#include <fcntl.h>
#include <nlohmann/json.hpp>

#include "checkpoint/checksum.h"
#include "checkpoint/fs.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/file.h"
#include "core/tasks.h"
#include "core/test_hook.h"

namespace st::checkpoint {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Host memory holding an entry's data: the entry itself, or a private copy
// (a snapshot, or the host copy of device memory).
Tensor host_source(const Tensor& t, bool snapshot) {
  if (t.device().is_cpu() && !snapshot) return t;
  Tensor out = Tensor::empty({t.numel()}, t.dtype());
  out.copy_from(t.view({t.numel()}));
  return out;
}

// Stored bytes are produced and written in blocks this large: each is
// converted (when the stored dtype differs), checksummed and handed to the
// kernel while it is still in cache.
constexpr int64_t kBlockBytes = int64_t{1} << 20;
// A piece is split into tasks of at most this many stored bytes, so the writer
// threads share the work evenly.
constexpr int64_t kTaskBytes = int64_t{32} << 20;

void convert_block(const std::byte* src, DType from, std::byte* dst, DType to, int64_t n) {
  if (from == DType::F32 && to == DType::BF16) {
    const auto* s = reinterpret_cast<const float*>(src);
    auto* d = reinterpret_cast<uint16_t*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = f32_to_bf16_bits(s[i]);
  } else if (from == DType::BF16 && to == DType::F32) {
    const auto* s = reinterpret_cast<const uint16_t*>(src);
    auto* d = reinterpret_cast<float*>(dst);
    for (int64_t i = 0; i < n; ++i) d[i] = bf16_bits_to_f32(s[i]);
  } else {
    ST_FAIL("cannot store {} data as {}", from, to);
  }
}

// The step of a save's temporary directory (".tmp-step-000012-<pid>", see
// checkpoint/commit.h), for the test hook; -1 for another name.
int64_t step_of_temp_dir(const std::string& dir) {
  const std::string name = fs::path(dir).filename().string();
  const size_t at = name.find("step-");
  if (at == std::string::npos) return -1;
  int64_t step = 0;
  size_t i = at + 5;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9'; ++i) step = step * 10 + (name[i] - '0');
  return i > at + 5 ? step : -1;
}

}  // namespace

void lay_out_files(std::vector<FilePlan>& files) {
  for (FilePlan& f : files) {
    std::vector<HeaderTensor> listed;
    for (const FileTensor& t : f.tensors)
      listed.push_back({t.key, t.dtype, t.shape, static_cast<uint64_t>(t.numel) * dtype_size(t.dtype)});
    f.header = safetensors_header(listed, f.metadata);
    uint64_t at = f.header.size();
    for (size_t i = 0; i < f.tensors.size(); ++i) {
      f.tensors[i].offset = at;
      at += listed[i].nbytes;
    }
    f.size = at;
  }
}

struct StagedSave::Impl {
  std::string dir;
  ProcessGroup* group = nullptr;
  SaveOptions options;
  StorageTopology topology;  // node-local roots: each file is written whole by its owner's host
  GlobalView view;
  SavePlan plan;
  std::map<size_t, Tensor> sources;  // entry index -> host data this rank writes from
  bool written = false;
  std::string error;
  std::vector<PieceSum> sums;

  // One part of a PieceWrite: elements [from, from + count) of it.
  struct Task {
    const PieceWrite* write = nullptr;
    int64_t from = 0;
    int64_t count = 0;
  };
  std::vector<Task> tasks() const;
  PieceSum run(const Task& task, int fd, std::vector<std::byte>& scratch) const;
  void write_files();
  // Node-local: the rank whose host holds file f (its header rank), and
  // whether this rank owns a checkpoint root (writes the indexes there).
  int home_rank(size_t f) const { return plan.files[f].header_rank; }
  bool on_my_host(size_t f) const;
  bool owns_root() const;
  void route_pieces_home(size_t n_entries);
};

StagedSave::StagedSave(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StagedSave::StagedSave(StagedSave&&) noexcept = default;
StagedSave& StagedSave::operator=(StagedSave&&) noexcept = default;
StagedSave::~StagedSave() = default;

int64_t StagedSave::bytes() const { return impl_->plan.bytes; }
int64_t StagedSave::total_bytes() const { return impl_->plan.total_bytes; }

std::vector<StagedSave::Impl::Task> StagedSave::Impl::tasks() const {
  std::vector<Task> out;
  for (const PieceWrite& w : plan.writes) {
    const auto esize = static_cast<int64_t>(dtype_size(plan.files[w.file].tensors[w.tensor].dtype));
    const int64_t per_task = std::max<int64_t>(1, kTaskBytes / esize);
    for (int64_t from = 0; from < w.numel; from += per_task)
      out.push_back({&w, from, std::min(per_task, w.numel - from)});
  }
  return out;
}

PieceSum StagedSave::Impl::run(const Task& task, int fd, std::vector<std::byte>& scratch) const {
  const PieceWrite& w = *task.write;
  const FilePlan& file = plan.files[w.file];
  const FileTensor& ft = file.tensors[w.tensor];
  const Tensor& src = sources.at(w.entry);
  const size_t in_size = dtype_size(src.dtype());
  const size_t out_size = dtype_size(ft.dtype);
  const int64_t block = kBlockBytes / static_cast<int64_t>(out_size);
  const int64_t first = w.elem + task.from;  // element of the file tensor
  PieceSum sum{w.file, w.tensor, first, task.count, 0, {}};
  const std::string what = format("checkpoint file '{}'", file.name);
  for (int64_t done = 0; done < task.count; done += block) {
    const int64_t n = std::min(block, task.count - done);
    const auto* in =
        static_cast<const std::byte*>(src.raw_data()) + static_cast<size_t>(w.entry_elem + task.from + done) * in_size;
    const std::byte* out = in;
    if (src.dtype() != ft.dtype) {
      scratch.resize(static_cast<size_t>(n) * out_size);
      convert_block(in, src.dtype(), scratch.data(), ft.dtype, n);
      out = scratch.data();
    }
    const std::span<const std::byte> bytes(out, static_cast<size_t>(n) * out_size);
    const TensorScan scan = crc32c_and_scan(bytes, ft.dtype, sum.crc32c, first + done);
    sum.crc32c = scan.crc32c;
    if (sum.nonfinite.first < 0) sum.nonfinite.first = scan.nonfinite.first;
    sum.nonfinite.nan += scan.nonfinite.nan;
    sum.nonfinite.inf += scan.nonfinite.inf;
    pwrite_all(fd, bytes.data(), bytes.size(), ft.offset + static_cast<uint64_t>(first + done) * out_size, what);
  }
  return sum;
}

void StagedSave::Impl::write_files() {
  const int rank = group->rank();
  // Open every file this rank writes into (no O_TRUNC: other ranks write
  // other ranges of the same file; the directory is fresh).
  std::map<size_t, UniqueFd> fds;
  auto open_file = [&](size_t f) {
    if (fds.count(f) != 0) return;
    const std::string path = (fs::path(dir) / plan.files[f].name).string();
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ST_CHECK(fd.valid(), "cannot create checkpoint file '{}': {}", path, errno_text());
    fds.emplace(f, std::move(fd));
  };
  for (size_t f = 0; f < plan.files.size(); ++f) {
    if (plan.files[f].header_rank != rank) continue;
    open_file(f);
    const FilePlan& file = plan.files[f];
    pwrite_all(fds.at(f).get(), file.header.data(), file.header.size(), 0, format("checkpoint file '{}'", file.name));
  }
  for (const PieceWrite& w : plan.writes) open_file(w.file);

  const std::vector<Task> all = tasks();
  std::vector<std::vector<std::byte>> scratch(static_cast<size_t>(std::max(1, options.threads)));
  std::mutex mu;
  std::string failed = run_tasks(all.size(), options.threads, [&](size_t i, int worker) {
    const PieceSum sum = run(all[i], fds.at(all[i].write->file).get(), scratch[static_cast<size_t>(worker)]);
    std::lock_guard lock(mu);
    sums.push_back(sum);
  });
  ST_CHECK(failed.empty(), "{}", failed);
  test_pause_point("files_written", step_of_temp_dir(dir));

  // Every file durable, fsynced in parallel.
  std::vector<std::pair<size_t, int>> to_sync;
  for (const auto& [f, fd] : fds) to_sync.emplace_back(f, fd.get());
  failed = run_tasks(to_sync.size(), static_cast<int>(to_sync.size()), [&](size_t i, int) {
    fsync_fd(to_sync[i].second, format("checkpoint file '{}'", plan.files[to_sync[i].first].name));
  });
  ST_CHECK(failed.empty(), "{}", failed);
  // close() can report a deferred write error (e.g. NFS); do not drop it.
  for (auto& [f, fd] : fds) fd.close_checked((fs::path(dir) / plan.files[f].name).string());
}

bool StagedSave::Impl::on_my_host(size_t f) const {
  return topology.shared || topology.host_of_rank[static_cast<size_t>(home_rank(f))] ==
                                topology.host_of_rank[static_cast<size_t>(group->rank())];
}

bool StagedSave::Impl::owns_root() const {
  return topology.shared ? group->rank() == 0 : topology.leads_host(group->rank());
}

// Node-local roots: every piece a rank holds for a file that another host
// writes travels (all_to_allv) to that file's header rank, which writes it
// from a buffer of its own (entry index n_entries + k). Every rank derives
// all ranks' writes from the same plan, so both sides agree on the order.
void StagedSave::Impl::route_pieces_home(size_t n_entries) {
  const int rank = group->rank();
  const int world = group->size();
  const auto host = [&](int r) { return topology.host_of_rank[static_cast<size_t>(r)]; };
  std::vector<std::vector<PieceWrite>> writes(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r)
    writes[static_cast<size_t>(r)] = r == rank ? plan.writes
                                               : (plan.layout == Layout::Unified ? plan_unified(view, options, r, world)
                                                                                 : plan_sharded(view, r, world))
                                                     .writes;
  const auto moved = [&](int r, const PieceWrite& w) { return host(r) != host(home_rank(w.file)); };
  const auto bytes_of = [&](const PieceWrite& w) {
    const FileTensor& ft = plan.files[w.file].tensors[w.tensor];
    return w.numel * static_cast<int64_t>(dtype_size(view.tensors.at(ft.id).dtype));
  };
  // Counts in BF16 elements (2 bytes): every piece is a whole number of them.
  std::vector<int64_t> send(static_cast<size_t>(world), 0), recv(static_cast<size_t>(world), 0);
  for (const PieceWrite& w : plan.writes)
    if (moved(rank, w)) send[static_cast<size_t>(home_rank(w.file))] += bytes_of(w) / 2;
  for (int r = 0; r < world; ++r)
    for (const PieceWrite& w : writes[static_cast<size_t>(r)])
      if (moved(r, w) && home_rank(w.file) == rank) recv[static_cast<size_t>(r)] += bytes_of(w) / 2;
  int64_t n_send = 0, n_recv = 0;
  for (int r = 0; r < world; ++r) n_send += send[static_cast<size_t>(r)], n_recv += recv[static_cast<size_t>(r)];
  Tensor out_buf = Tensor::empty({n_send}, DType::BF16);
  auto* at = static_cast<std::byte*>(out_buf.raw_data());
  for (int dest = 0; dest < world; ++dest)
    for (const PieceWrite& w : plan.writes) {
      if (!moved(rank, w) || home_rank(w.file) != dest) continue;
      const Tensor& src = sources.at(w.entry);
      const size_t esize = dtype_size(src.dtype());
      std::memcpy(at, static_cast<const std::byte*>(src.raw_data()) + static_cast<size_t>(w.entry_elem) * esize,
                  static_cast<size_t>(w.numel) * esize);
      at += static_cast<size_t>(w.numel) * esize;
    }
  Tensor in_buf = Tensor::empty({n_recv}, DType::BF16);
  group->all_to_allv(in_buf, recv, out_buf, send).wait();
  // This rank's writes now: its own pieces of files its host holds, then what it received.
  std::vector<PieceWrite> mine;
  std::set<size_t> used;
  for (const PieceWrite& w : plan.writes)
    if (!moved(rank, w)) mine.push_back(w), used.insert(w.entry);
  const auto* from = static_cast<const std::byte*>(in_buf.raw_data());
  size_t next = n_entries;
  for (int r = 0; r < world; ++r)
    for (const PieceWrite& w : writes[static_cast<size_t>(r)]) {
      if (!moved(r, w) || home_rank(w.file) != rank) continue;
      const DType dtype = view.tensors.at(plan.files[w.file].tensors[w.tensor].id).dtype;
      Tensor piece = Tensor::empty({w.numel}, dtype);
      std::memcpy(piece.raw_data(), from, static_cast<size_t>(bytes_of(w)));
      from += bytes_of(w);
      sources.emplace(next, std::move(piece));
      mine.push_back({w.file, w.tensor, w.elem, w.numel, next, 0});
      used.insert(next++);
    }
  std::erase_if(sources, [&](const auto& kv) { return !used.contains(kv.first); });
  plan.writes = std::move(mine);
  plan.bytes = 0;
  for (const PieceWrite& w : plan.writes) plan.bytes += bytes_of(w);
}

void StagedSave::write() {
  Impl& s = *impl_;
  s.error = error_message_of([&] { s.write_files(); });
  s.sources.clear();  // free the snapshot as soon as it is on disk
  s.written = true;
}

namespace {

json sums_to_json(const std::vector<PieceSum>& sums) {
  json list = json::array();
  for (const PieceSum& s : sums)
    list.push_back({s.file, s.tensor, s.elem, s.numel, s.crc32c, s.nonfinite.nan, s.nonfinite.inf, s.nonfinite.first});
  return list;
}

std::vector<PieceSum> all_sums(ProcessGroup& group, const std::vector<PieceSum>& mine) {
  std::vector<PieceSum> out;
  for (const std::string& text : all_gather_strings(group, sums_to_json(mine).dump()))
    for (const json& j : json::parse(text))
      out.push_back({j[0].get<size_t>(), j[1].get<size_t>(), j[2].get<int64_t>(), j[3].get<int64_t>(),
                     j[4].get<uint32_t>(), NonFinite{j[5].get<int64_t>(), j[6].get<int64_t>(), j[7].get<int64_t>()}});
  return out;
}

}  // namespace

std::vector<std::vector<uint32_t>> combine_piece_sums(const SavePlan& plan, std::vector<PieceSum> sums) {
  std::sort(sums.begin(), sums.end(), [](const PieceSum& a, const PieceSum& b) {
    return std::tie(a.file, a.tensor, a.elem) < std::tie(b.file, b.tensor, b.elem);
  });
  std::vector<std::vector<uint32_t>> crcs(plan.files.size());
  size_t i = 0;
  for (size_t f = 0; f < plan.files.size(); ++f) {
    const FilePlan& file = plan.files[f];
    int bad_tensors = 0;
    std::string first_bad;
    for (size_t t = 0; t < file.tensors.size(); ++t) {
      const FileTensor& ft = file.tensors[t];
      uint32_t crc = 0;
      int64_t covered = 0;
      NonFinite bad;
      for (; i < sums.size() && sums[i].file == f && sums[i].tensor == t; ++i) {
        const PieceSum& s = sums[i];
        ST_CHECK(s.elem == covered, "tensor {} kind {}: the ranks hold elements [{}, {}) next, expected {} ({})",
                 ft.id.first, ft.id.second, s.elem, s.elem + s.numel, covered, file.name);
        crc = crc32c_combine(crc, s.crc32c, static_cast<uint64_t>(s.numel) * dtype_size(ft.dtype));
        covered += s.numel;
        if (bad.first < 0) bad.first = s.nonfinite.first;
        bad.nan += s.nonfinite.nan;
        bad.inf += s.nonfinite.inf;
      }
      ST_CHECK(covered == ft.numel, "tensor {} kind {}: the ranks hold {} of its {} elements", ft.id.first,
               ft.id.second, covered, ft.numel);
      if (bad.any() && bad_tensors++ == 0)
        first_bad = format("non-finite values in tensor '{}' ({}): {} NaN and {} Inf, the first at element {}", ft.key,
                           file.name, bad.nan, bad.inf, bad.first);
      crcs[f].push_back(crc);
    }
    ST_CHECK(bad_tensors == 0, "{}{}", first_bad,
             bad_tensors > 1 ? format("; {} tensors of that file are non-finite", bad_tensors) : std::string());
  }
  return crcs;
}

std::vector<std::string> StagedSave::finish() {
  Impl& s = *impl_;
  ST_CHECK(s.written, "StagedSave::finish() before write()");
  ProcessGroup& group = *s.group;
  run_on_every_rank(
      group, [&] { ST_CHECK(s.error.empty(), "checkpoint save: writing the checkpoint files failed: {}", s.error); });
  const std::vector<PieceSum> sums = all_sums(group, s.sums);
  // Every rank combines the same sums, so every rank reaches the same verdict.
  std::vector<std::vector<uint32_t>> crcs;
  run_on_every_rank(group, [&] {
    const std::string error = error_message_of([&] { crcs = combine_piece_sums(s.plan, sums); });
    ST_CHECK(error.empty(), "checkpoint save: writing the checkpoint files failed: {}", error);
  });
  std::vector<std::string> names;
  run_on_every_rank(group, [&] {
    if (!s.owns_root()) return;
    const std::vector<std::pair<std::string, std::string>> indexes =
        s.plan.layout == Layout::Unified ? unified_indexes(s.plan, crcs, group.size())
                                         : sharded_index(s.plan, s.view, crcs, group.size());
    for (size_t f = 0; f < s.plan.files.size(); ++f)
      if (s.on_my_host(f)) names.push_back(s.plan.files[f].name);
    const std::string error = error_message_of([&] {
      for (const auto& [name, text] : indexes) {
        write_file_atomic(fs::path(s.dir) / name, text);
        names.push_back(name);
      }
    });
    ST_CHECK(error.empty(), "checkpoint save: writing the index failed: {}", error);
  });
  return names;
}

std::vector<std::string> StagedSave::elsewhere() const {
  std::vector<std::string> out;
  if (!impl_->owns_root()) return out;
  for (size_t f = 0; f < impl_->plan.files.size(); ++f)
    if (!impl_->on_my_host(f)) out.push_back(impl_->plan.files[f].name);
  return out;
}

StagedSave stage_save(const std::string& dir, std::span<const StateEntry> entries, const SaveOptions& options,
                      ProcessGroup& group, const StorageTopology& topology) {
  auto impl = std::make_unique<StagedSave::Impl>();
  StagedSave::Impl& s = *impl;
  s.dir = dir;
  s.group = &group;
  s.options = options;
  s.topology = topology;
  s.view = gather_view(entries, group);
  run_on_every_rank(group, [&] {
    s.plan = options.layout == Layout::Unified ? plan_unified(s.view, options, group.rank(), group.size())
                                               : plan_sharded(s.view, group.rank(), group.size());
    lay_out_files(s.plan.files);
    for (const PieceWrite& w : s.plan.writes)
      if (s.sources.count(w.entry) == 0)
        s.sources.emplace(w.entry, host_source(entries[w.entry].local, options.snapshot));
  });
  if (!topology.shared) s.route_pieces_home(entries.size());
  return StagedSave(std::move(impl));
}

std::vector<std::string> save(const std::string& dir, std::span<const StateEntry> entries, const SaveOptions& options,
                              ProcessGroup& group) {
  StagedSave staged = stage_save(dir, entries, options, group, StorageTopology{});
  staged.write();
  return staged.finish();
}

}  // namespace st::checkpoint
