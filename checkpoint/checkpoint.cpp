#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <thread>
#include <tuple>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "checkpoint/checksum.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/ops.h"

namespace st::checkpoint {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;
using TensorId = std::pair<std::string, std::string>;  // (fqn, kind)

std::string join_path(const std::string& dir, std::string_view name) { return (fs::path(dir) / name).string(); }

json read_json_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  ST_CHECK(in.good(), "cannot open '{}': {}", path, std::strerror(errno));
  std::stringstream text;
  text << in.rdbuf();
  ST_CHECK(!in.bad(), "reading '{}' failed", path);
  try {
    return json::parse(text.str());
  } catch (const json::exception& e) {
    ST_FAIL("'{}' is not valid JSON: {}", path, e.what());
  }
}

// Tells every rank of `group` whether any rank failed (`error` non-empty), so a
// failure cannot leave the other ranks waiting in a later collective: every
// rank throws the same AgreedError, naming the lowest failing rank's error,
// which main() prints once.
void agree_on_errors(ProcessGroup& group, const std::string& what, const std::string& error) {
  run_on_every_rank(group, [&] { ST_CHECK(error.empty(), "checkpoint save: {} failed: {}", what, error); });
}

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();  // without the source location: these messages reach users
  } catch (const std::exception& e) {
    return e.what();
  }
  return {};
}

// ---- The global picture every rank agrees on before a save --------------------

// One piece of one tensor as some rank holds it.
struct Piece {
  std::string fqn;
  std::string kind;
  int64_t begin = 0;
  int64_t numel = 0;
  int rank = 0;
  size_t entry = 0;  // index into that rank's entries
  auto order() const { return std::tie(fqn, kind, begin, numel, rank); }
};

struct Meta {
  Shape shape;
  DType dtype = DType::F32;
};

struct GlobalView {
  std::map<TensorId, Meta> tensors;
  std::vector<Piece> pieces;  // those chosen to be sent/written: one per distinct (fqn, kind, begin, numel)
};

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

// Collective: every rank's entry list, checked for agreement, with replicated
// pieces assigned to one holder each (the one with the fewest bytes so far).
GlobalView gather_view(std::span<const StateEntry> entries, ProcessGroup& group) {
  std::string error;
  std::string mine;
  error = error_of([&] { mine = describe(entries).dump(); });
  agree_on_errors(group, "describing the state", error);
  std::vector<std::string> lists = all_gather_strings(group, mine);

  GlobalView view;
  std::map<TensorId, int> first_rank;
  std::vector<Piece> all;
  for (int r = 0; r < group.size(); ++r) {
    json list = json::parse(lists[static_cast<size_t>(r)]);
    for (size_t i = 0; i < list.size(); ++i) {
      const json& j = list[i];
      TensorId id{j[0].get<std::string>(), j[1].get<std::string>()};
      Meta meta{j[2].get<Shape>(), *dtype_from_name(j[3].get<std::string>())};
      auto [it, inserted] = view.tensors.emplace(id, meta);
      if (inserted) first_rank[id] = r;
      ST_CHECK(it->second.shape == meta.shape && it->second.dtype == meta.dtype,
               "tensor {} kind {}: rank {} holds it as {} {} but rank {} as {} {}", id.first, id.second, first_rank[id],
               it->second.dtype, shape_str(it->second.shape), r, meta.dtype, shape_str(meta.shape));
      const int64_t numel = j[5].get<int64_t>();
      if (numel > 0) all.push_back(Piece{id.first, id.second, j[4].get<int64_t>(), numel, r, i});
    }
  }
  std::sort(all.begin(), all.end(), [](const Piece& a, const Piece& b) { return a.order() < b.order(); });
  std::vector<int64_t> load(static_cast<size_t>(group.size()), 0);
  for (size_t i = 0; i < all.size();) {
    size_t j = i;
    while (j < all.size() && all[j].fqn == all[i].fqn && all[j].kind == all[i].kind && all[j].begin == all[i].begin &&
           all[j].numel == all[i].numel)
      ++j;
    size_t best = i;  // replicas [i, j): the holder with the least load so far writes it
    for (size_t k = i + 1; k < j; ++k)
      if (load[static_cast<size_t>(all[k].rank)] < load[static_cast<size_t>(all[best].rank)]) best = k;
    const Meta& meta = view.tensors.at({all[best].fqn, all[best].kind});
    load[static_cast<size_t>(all[best].rank)] += all[best].numel * static_cast<int64_t>(dtype_size(meta.dtype));
    view.pieces.push_back(all[best]);
    i = j;
  }
  return view;
}

// A copy of `t` in host memory (or `t` itself when it may be used in place).
Tensor host_copy(const Tensor& t, bool snapshot) {
  if (t.device().is_cpu() && !snapshot) return t;
  Tensor out = Tensor::empty({t.numel()}, t.dtype());
  out.copy_from(t.view({t.numel()}));
  return out;
}

// ---- Files a rank writes -------------------------------------------------------

struct PlannedTensor {
  std::string key;
  Tensor data;  // host, stored dtype, stored shape
  // Sharded layout: the chunk this is.
  std::string fqn, kind;
  int64_t begin = 0;
};

struct PlannedFile {
  std::string family;  // "shard", "model", "master_weights", "optimizer"
  std::string name;
  std::map<std::string, std::string> metadata;
  std::vector<PlannedTensor> tensors;
};

}  // namespace

std::string_view layout_name(Layout layout) { return layout == Layout::Unified ? "unified" : "sharded"; }

std::optional<Layout> parse_layout(std::string_view name) {
  if (name == layout_name(Layout::Unified)) return Layout::Unified;
  if (name == layout_name(Layout::Sharded)) return Layout::Sharded;
  return std::nullopt;
}

std::string unified_file_name(std::string_view family, int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05d-of-%05d.safetensors", k, n);
  return std::string(family) + buf;
}

bool Catalog::has_kind(std::string_view kind) const {
  return std::any_of(tensors.begin(), tensors.end(), [&](const auto& t) { return t.first.second == kind; });
}

int64_t Catalog::total_bytes() const {
  int64_t total = 0;
  for (const auto& [id, t] : tensors)
    for (const ChunkRecord& c : t.chunks) total += c.numel * static_cast<int64_t>(dtype_size(t.dtype));
  return total;
}

struct StagedSave::Impl {
  std::string dir;
  Layout layout = Layout::Unified;
  ProcessGroup* group = nullptr;
  GlobalView view;
  std::vector<PlannedFile> files;
  DType model_dtype = DType::F32;
  int64_t bytes = 0;
  int64_t total_bytes = 0;
  bool written = false;
  std::string error;
  json written_list = json::array();  // [{"family", "name", "tensors": [[key, crc32c, nbytes], ...]}]
};

StagedSave::StagedSave(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StagedSave::StagedSave(StagedSave&&) noexcept = default;
StagedSave& StagedSave::operator=(StagedSave&&) noexcept = default;
StagedSave::~StagedSave() = default;

int64_t StagedSave::bytes() const { return impl_->bytes; }
int64_t StagedSave::total_bytes() const { return impl_->total_bytes; }

namespace {

// Non-finite training state must never become a checkpoint: a run resumed
// from it would fail at its first step, and `latest` would no longer name a
// state worth resuming. The values were counted in the checksum's pass.
void refuse_nonfinite(const std::vector<WrittenTensor>& written, const std::string& file) {
  int bad_tensors = 0;
  const WrittenTensor* first = nullptr;
  for (const WrittenTensor& w : written) {
    if (!w.nonfinite.any()) continue;
    ++bad_tensors;
    if (first == nullptr) first = &w;
  }
  if (first == nullptr) return;
  ST_FAIL("non-finite values in tensor '{}' ({}): {} NaN and {} Inf, the first at element {}{}", first->name, file,
          first->nonfinite.nan, first->nonfinite.inf, first->nonfinite.first,
          bad_tensors > 1 ? format("; {} tensors of that file are non-finite", bad_tensors) : std::string());
}

}  // namespace

void StagedSave::write() {
  Impl& s = *impl_;
  s.error = error_of([&] {
    for (PlannedFile& f : s.files) {
      SafetensorsWriter writer;
      for (const PlannedTensor& t : f.tensors) writer.add(t.key, t.data);
      for (const auto& [k, v] : f.metadata) writer.set_metadata(k, v);
      std::vector<WrittenTensor> written = writer.write(join_path(s.dir, f.name));
      refuse_nonfinite(written, f.name);
      json tensors = json::array();
      for (const WrittenTensor& w : written) tensors.push_back({w.name, w.crc32c, w.nbytes});
      s.written_list.push_back({{"family", f.family}, {"name", f.name}, {"tensors", tensors}});
      f.tensors.clear();  // free the snapshot as soon as it is on disk
    }
  });
  s.written = true;
}

namespace {

json unified_index(const std::string& family, int world, const std::vector<json>& files) {
  json weight_map = json::object();
  json crcs = json::object();
  int64_t total = 0;
  for (const json& f : files) {
    for (const json& t : f.at("tensors")) {
      weight_map[t[0].get<std::string>()] = f.at("name");
      crcs[t[0].get<std::string>()] = t[1];
      total += t[2].get<int64_t>();
    }
  }
  return json{{"metadata",
               {{"total_size", total},
                {"format", std::string(kUnifiedFormat)},
                {"version", kUnifiedVersion},
                {"family", family},
                {"world_size", world}}},
              {"weight_map", weight_map},
              {"crc32c", crcs}};
}

}  // namespace

std::vector<std::string> StagedSave::finish() {
  Impl& s = *impl_;
  ST_CHECK(s.written, "StagedSave::finish() before write()");
  ProcessGroup& group = *s.group;
  agree_on_errors(group, "writing the checkpoint files", s.error);
  std::vector<std::string> lists = all_gather_strings(group, s.written_list.dump());
  std::vector<std::string> names;
  std::string error = error_of([&] {
    if (group.rank() != 0) return;
    std::map<std::string, std::vector<json>> by_family;
    for (const std::string& text : lists)
      for (const json& f : json::parse(text)) {
        by_family[f.at("family").get<std::string>()].push_back(f);
        names.push_back(f.at("name").get<std::string>());
      }
    if (s.layout == Layout::Sharded) {
      json tensors = json::object();
      for (const auto& [id, meta] : s.view.tensors)
        tensors[id.first][id.second] = {{"shape", meta.shape}, {"dtype", std::string(dtype_name(meta.dtype))}};
      std::map<std::pair<std::string, std::string>, uint32_t> crc;  // (file, key)
      for (const json& f : by_family["shard"])
        for (const json& t : f.at("tensors"))
          crc[{f.at("name").get<std::string>(), t[0].get<std::string>()}] = t[1].get<uint32_t>();
      json chunks = json::array();
      for (const Piece& p : s.view.pieces) {
        const std::string file = shard_file_name(p.rank, group.size());
        const std::string key = chunk_key(p.fqn, p.kind, p.begin);
        chunks.push_back({{"fqn", p.fqn},
                          {"kind", p.kind},
                          {"begin", p.begin},
                          {"numel", p.numel},
                          {"file", file},
                          {"key", key},
                          {"crc32c", crc.at({file, key})}});
      }
      json index{{"format", std::string(kShardedFormat)},
                 {"version", kShardedVersion},
                 {"world_size", group.size()},
                 {"tensors", tensors},
                 {"chunks", chunks}};
      write_file_atomic(join_path(s.dir, kShardedIndexName), index.dump(1) + "\n");
      names.emplace_back(kShardedIndexName);
    } else {
      const std::pair<const char*, std::string_view> families[] = {
          {"model", kModelIndexName}, {"master_weights", kMasterIndexName}, {"optimizer", kOptimizerIndexName}};
      for (const auto& [family, index_name] : families) {
        auto it = by_family.find(family);
        if (it == by_family.end()) continue;
        write_file_atomic(join_path(s.dir, index_name), unified_index(family, group.size(), it->second).dump(1) + "\n");
        names.emplace_back(index_name);
      }
    }
  });
  agree_on_errors(group, "writing the index", error);
  return names;
}

StagedSave stage_save(const std::string& dir, std::span<const StateEntry> entries, const SaveOptions& options,
                      ProcessGroup& group) {
  auto impl = std::make_unique<StagedSave::Impl>();
  StagedSave::Impl& s = *impl;
  s.dir = dir;
  s.layout = options.layout;
  s.group = &group;
  s.model_dtype = options.model_dtype;
  s.view = gather_view(entries, group);
  const int rank = group.rank();
  const int world = group.size();
  const bool snapshot = options.snapshot;

  if (options.layout == Layout::Sharded) {
    PlannedFile file{"shard", shard_file_name(rank, world), {{"format", std::string(kShardedFormat)}}, {}};
    for (const Piece& p : s.view.pieces) {
      const int64_t bytes = p.numel * static_cast<int64_t>(dtype_size(s.view.tensors.at({p.fqn, p.kind}).dtype));
      s.total_bytes += bytes;
      if (p.rank != rank) continue;
      s.bytes += bytes;
      const StateEntry& e = entries[p.entry];
      file.tensors.push_back({chunk_key(p.fqn, p.kind, p.begin), host_copy(e.local, snapshot), p.fqn, p.kind, p.begin});
    }
    if (!file.tensors.empty()) s.files.push_back(std::move(file));
    return StagedSave(std::move(impl));
  }

  // Unified: owners by fqn (all kinds of one parameter go to one rank, so the
  // master data is sent once even when it is written twice), balanced by the
  // bytes each fqn puts on disk.
  ST_CHECK(options.model_weights || options.master_weights,
           "unified save: model_weights and master_weights are both off, so the weights would not be saved");
  std::map<std::string, int64_t> fqn_bytes;
  for (const auto& [id, meta] : s.view.tensors) {
    const int64_t n = shape_numel(meta.shape);
    int64_t b = 0;
    if (id.second == kMasterKind) {
      if (options.model_weights) b += n * static_cast<int64_t>(dtype_size(options.model_dtype));
      if (options.master_weights) b += n * static_cast<int64_t>(dtype_size(meta.dtype));
    } else {
      b = n * static_cast<int64_t>(dtype_size(meta.dtype));
    }
    fqn_bytes[id.first] += b;
    s.total_bytes += b;
  }
  std::vector<std::pair<std::string, int64_t>> order(fqn_bytes.begin(), fqn_bytes.end());
  std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.second > b.second; });
  std::map<std::string, int> owner;
  std::vector<int64_t> load(static_cast<size_t>(world), 0);
  for (const auto& [fqn, b] : order) {
    const int r = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner[fqn] = r;
    load[static_cast<size_t>(r)] += b;
  }
  s.bytes = load[static_cast<size_t>(rank)];

  // Exchange: pieces go to their fqn's owner in view.pieces order, each padded
  // to whole 4-byte words (the exchange moves I32 words), in rounds of at most
  // options.exchange_bytes sent or received per rank (a piece larger than that
  // travels alone). Every rank derives the same rounds from the same view.
  auto words = [&](const Piece& p) {
    const int64_t bytes = p.numel * static_cast<int64_t>(dtype_size(s.view.tensors.at({p.fqn, p.kind}).dtype));
    return (bytes + 3) / 4;
  };
  const int64_t cap_words = std::max<int64_t>(1, options.exchange_bytes / 4);
  std::vector<std::vector<const Piece*>> rounds(1);
  {
    std::vector<int64_t> out(static_cast<size_t>(world), 0), in(static_cast<size_t>(world), 0);
    for (const Piece& p : s.view.pieces) {
      const auto src = static_cast<size_t>(p.rank);
      const auto dst = static_cast<size_t>(owner.at(p.fqn));
      const int64_t w = words(p);
      if (!rounds.back().empty() && (out[src] + w > cap_words || in[dst] + w > cap_words)) {
        rounds.emplace_back();
        std::fill(out.begin(), out.end(), 0);
        std::fill(in.begin(), in.end(), 0);
      }
      rounds.back().push_back(&p);
      out[src] += w;
      in[dst] += w;
    }
  }
  std::map<TensorId, Tensor> full;
  std::map<TensorId, int64_t> covered;
  for (const std::vector<const Piece*>& round : rounds) {
    std::vector<int64_t> send_counts(static_cast<size_t>(world), 0), recv_counts(static_cast<size_t>(world), 0);
    for (const Piece* p : round) {
      const int o = owner.at(p->fqn);
      if (p->rank == rank) send_counts[static_cast<size_t>(o)] += words(*p);
      if (o == rank) recv_counts[static_cast<size_t>(p->rank)] += words(*p);
    }
    std::vector<int64_t> send_offset(static_cast<size_t>(world), 0), recv_offset(static_cast<size_t>(world), 0);
    for (size_t r = 1; r < static_cast<size_t>(world); ++r) {
      send_offset[r] = send_offset[r - 1] + send_counts[r - 1];
      recv_offset[r] = recv_offset[r - 1] + recv_counts[r - 1];
    }
    Tensor send = Tensor::zeros({send_offset.back() + send_counts.back()}, DType::I32);
    Tensor recv = Tensor::zeros({recv_offset.back() + recv_counts.back()}, DType::I32);
    std::vector<int64_t> cursor = send_offset;
    for (const Piece* p : round) {
      if (p->rank != rank) continue;
      int64_t& c = cursor[static_cast<size_t>(owner.at(p->fqn))];
      const Tensor& local = entries[p->entry].local;
      Tensor host = local.device().is_cpu() ? local : local.to(Device::cpu());
      std::memcpy(send.data<int32_t>() + c, host.raw_data(), host.nbytes());
      c += words(*p);
    }
    group.all_to_allv(recv, recv_counts, send, send_counts).wait();

    // Assemble the owned tensors.
    cursor = recv_offset;
    for (const Piece* p : round) {
      if (owner.at(p->fqn) != rank) continue;
      const TensorId id{p->fqn, p->kind};
      const Meta& meta = s.view.tensors.at(id);
      auto it = full.find(id);
      if (it == full.end()) it = full.emplace(id, Tensor::empty({shape_numel(meta.shape)}, meta.dtype)).first;
      int64_t& c = cursor[static_cast<size_t>(p->rank)];
      const size_t esize = dtype_size(meta.dtype);
      std::memcpy(static_cast<char*>(it->second.raw_data()) + p->begin * static_cast<int64_t>(esize),
                  recv.data<int32_t>() + c, static_cast<size_t>(p->numel) * esize);
      c += words(*p);
      covered[id] += p->numel;  // pieces are distinct; overlaps between different splits are not expected
    }
  }
  // Checking that the pieces covered every owned tensor.
  std::string error = error_of([&] {
    for (const auto& [id, meta] : s.view.tensors) {
      if (owner.at(id.first) != rank) continue;
      ST_CHECK(covered[id] >= shape_numel(meta.shape), "tensor {} kind {}: the ranks hold {} of its {} elements",
               id.first, id.second, covered[id], shape_numel(meta.shape));
    }
  });
  agree_on_errors(group, "collecting whole tensors", error);

  // File numbering: per family, the owning ranks in rank order.
  std::map<std::string, std::vector<int>> writers;  // family -> ranks (sorted, unique)
  auto families_of = [&](const TensorId& id) {
    std::vector<std::string> f;
    if (id.second == kMasterKind) {
      if (options.model_weights) f.push_back("model");
      if (options.master_weights) f.push_back("master_weights");
    } else {
      f.push_back("optimizer");
    }
    return f;
  };
  for (const auto& [id, meta] : s.view.tensors)
    for (const std::string& f : families_of(id)) writers[f].push_back(owner.at(id.first));
  for (auto& [f, ranks] : writers) {
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
  }
  for (const std::string family : {"model", "master_weights", "optimizer"}) {
    auto it = writers.find(family);
    if (it == writers.end()) continue;
    auto pos = std::find(it->second.begin(), it->second.end(), rank);
    if (pos == it->second.end()) continue;
    PlannedFile file{
        family,
        unified_file_name(family, static_cast<int>(pos - it->second.begin()) + 1, static_cast<int>(it->second.size())),
        {{"format", "pt"}},
        {}};
    for (const auto& [id, tensor] : full) {
      const std::vector<std::string> fams = families_of(id);
      if (std::find(fams.begin(), fams.end(), family) == fams.end()) continue;
      const Shape& shape = s.view.tensors.at(id).shape;
      const std::string key = family == "optimizer" ? id.first + "." + id.second : id.first;
      // The model-* cast happens here, before write(): the cast copy is what write() uses.
      Tensor data =
          family == "model" && tensor.dtype() != options.model_dtype ? ops::cast(tensor, options.model_dtype) : tensor;
      file.tensors.push_back({key, data.view(shape), id.first, id.second, 0});
    }
    s.files.push_back(std::move(file));
  }
  return StagedSave(std::move(impl));
}

std::vector<std::string> save(const std::string& dir, std::span<const StateEntry> entries, const SaveOptions& options,
                              ProcessGroup& group) {
  StagedSave staged = stage_save(dir, entries, options, group);
  staged.write();
  return staged.finish();
}

// ---- Reading ---------------------------------------------------------------------

namespace {

ChunkRecord chunk_from_json(const json& j, const std::string& index_path) {
  ST_CHECK(j.is_object(), "'{}': every entry of \"chunks\" must be an object", index_path);
  ChunkRecord c;
  try {
    c.fqn = j.at("fqn").get<std::string>();
    c.kind = j.at("kind").get<std::string>();
    c.begin = j.at("begin").get<int64_t>();
    c.numel = j.at("numel").get<int64_t>();
    c.file = j.at("file").get<std::string>();
    c.key = j.at("key").get<std::string>();
    c.crc32c = j.at("crc32c").get<uint32_t>();
  } catch (const json::exception& e) {
    ST_FAIL("'{}': malformed chunk {}: {}", index_path, j.dump(), e.what());
  }
  ST_CHECK(c.begin >= 0 && c.numel >= 0, "'{}': chunk '{}' has begin {} numel {}", index_path, c.key, c.begin, c.numel);
  return c;
}

// A file name from an index is untrusted: it must not leave the directory.
void check_plain_name(const std::string& file, const std::string& key, const std::string& index_path) {
  ST_CHECK(!file.empty() && file.find('/') == std::string::npos && file != "." && file != "..",
           "'{}': tensor '{}' names file '{}', which is not a plain file name", index_path, key, file);
}

void read_sharded_catalog(Catalog& cat, const std::string& index_path) {
  json index = read_json_file(index_path);
  ST_CHECK(index.is_object() && index.value("format", std::string()) == kShardedFormat, "'{}' is not a {} index",
           index_path, kShardedFormat);
  ST_CHECK(index.value("version", -1) == kShardedVersion, "'{}': unsupported version {} (this build reads {})",
           index_path, index.value("version", -1), kShardedVersion);
  cat.format = layout_name(Layout::Sharded);
  try {
    cat.world_size = index.value("world_size", 0);
    for (const auto& [fqn, kinds] : index.at("tensors").items()) {
      for (const auto& [kind, meta] : kinds.items()) {
        const std::string name = meta.at("dtype").get<std::string>();
        std::optional<DType> dt = dtype_from_name(name);
        ST_CHECK(dt.has_value(), "'{}': tensor {} kind {} has unknown dtype '{}'", index_path, fqn, kind, name);
        StoredTensor& t = cat.tensors[{fqn, kind}];
        t.shape = meta.at("shape").get<Shape>();
        t.dtype = *dt;
      }
    }
    for (const json& j : index.at("chunks")) {
      ChunkRecord c = chunk_from_json(j, index_path);
      check_plain_name(c.file, c.key, index_path);
      auto it = cat.tensors.find({c.fqn, c.kind});
      ST_CHECK(it != cat.tensors.end(), "'{}': chunk '{}' belongs to tensor {} kind {}, which \"tensors\" lacks",
               index_path, c.key, c.fqn, c.kind);
      it->second.chunks.push_back(std::move(c));
    }
  } catch (const json::exception& e) {
    ST_FAIL("checkpoint index '{}' is malformed: {}", index_path, e.what());
  }
}

// Adds the tensors of one Hugging Face style index (or of a single file when
// `index_path` is empty) under `kind` ("" = split "<fqn>.<kind>" keys).
void read_hf_family(Catalog& cat, const std::string& index_path, const std::string& single_file,
                    const std::string& kind) {
  std::map<std::string, std::string> weight_map;  // key -> file
  std::map<std::string, uint32_t> crcs;
  bool ours = false;
  if (!index_path.empty()) {
    json index = read_json_file(index_path);
    try {
      ST_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
               "'{}' has no \"weight_map\" object", index_path);
      const json& meta = index.value("metadata", json::object());
      ours = meta.is_object() && meta.value("format", std::string()) == kUnifiedFormat;
      if (ours) {
        ST_CHECK(meta.value("version", -1) == kUnifiedVersion, "'{}': unsupported version {} (this build reads {})",
                 index_path, meta.value("version", -1), kUnifiedVersion);
        cat.world_size = meta.value("world_size", 0);
      }
      for (const auto& [key, file] : index["weight_map"].items()) weight_map[key] = file.get<std::string>();
      if (index.contains("crc32c"))
        for (const auto& [key, crc] : index["crc32c"].items()) crcs[key] = crc.get<uint32_t>();
    } catch (const json::exception& e) {
      ST_FAIL("checkpoint index '{}' is malformed: {}", index_path, e.what());
    }
  } else {
    SafetensorsFile f(join_path(cat.dir, single_file));
    for (const std::string& key : f.names()) weight_map[key] = single_file;
  }
  if (ours && cat.format.empty()) cat.format = layout_name(Layout::Unified);
  if (!ours) cat.format = "huggingface";

  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  const std::string& where = index_path.empty() ? single_file : index_path;
  for (const auto& [key, file] : weight_map) {
    check_plain_name(file, key, where);
    auto it = files.find(file);
    if (it == files.end()) {
      const std::string path = join_path(cat.dir, file);
      ST_CHECK(fs::exists(path), "checkpoint file '{}' (listed in '{}' for tensor '{}') is missing", path, where, key);
      it = files.emplace(file, std::make_unique<SafetensorsFile>(path)).first;
    }
    const SafetensorsFile& f = *it->second;
    ST_CHECK(f.has(key), "tensor '{}' is listed in '{}' but missing from '{}'", key, where, f.path());
    const TensorInfo& info = f.info(key);
    std::string fqn = key, k = kind;
    if (kind.empty()) {
      const size_t dot = key.rfind('.');
      ST_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < key.size(),
               "'{}': optimizer key '{}' is not '<fqn>.<kind>'", where, key);
      fqn = key.substr(0, dot);
      k = key.substr(dot + 1);
    }
    StoredTensor& t = cat.tensors[{fqn, k}];
    ST_CHECK(t.chunks.empty(), "'{}': tensor {} kind {} is stored twice", where, fqn, k);
    t.shape = info.shape;
    t.dtype = info.dtype;
    t.checksummed = ours;
    ChunkRecord c{fqn, k, 0, shape_numel(info.shape), file, key, 0};
    if (ours) {
      auto crc = crcs.find(key);
      ST_CHECK(crc != crcs.end(), "'{}' has no crc32c for tensor '{}'", where, key);
      c.crc32c = crc->second;
    }
    t.chunks.push_back(std::move(c));
  }
}

}  // namespace

Catalog read_catalog(const std::string& dir) {
  Catalog cat;
  cat.dir = dir;
  ST_CHECK(fs::is_directory(dir), "checkpoint directory '{}' does not exist", dir);
  const std::string sharded = join_path(dir, kShardedIndexName);
  if (fs::exists(sharded)) {
    read_sharded_catalog(cat, sharded);
    return cat;
  }
  const std::pair<std::string_view, std::string> families[] = {{kModelIndexName, std::string(kModelKind)},
                                                               {kMasterIndexName, std::string(kMasterKind)},
                                                               {kOptimizerIndexName, ""}};
  bool any = false;
  for (const auto& [name, kind] : families) {
    const std::string path = join_path(dir, name);
    if (!fs::exists(path)) continue;
    read_hf_family(cat, path, "", kind);
    any = true;
  }
  if (!any && fs::exists(join_path(dir, "model.safetensors"))) {
    read_hf_family(cat, "", "model.safetensors", std::string(kModelKind));
    any = true;
  }
  ST_CHECK(any, "'{}' is not a checkpoint: it has none of {}, {}, model.safetensors", dir, kShardedIndexName,
           kModelIndexName);
  return cat;
}

void load_entries(const Catalog& cat, std::span<StateEntry> entries, const LoadOptions& options) {
  struct Task {
    const StateEntry* entry = nullptr;  // null: verify only
    const StoredTensor* stored = nullptr;
    const ChunkRecord* chunk = nullptr;
    Read read;
  };
  std::vector<Task> tasks;
  for (StateEntry& e : entries) {
    auto it = cat.tensors.find({e.fqn, e.kind});
    if (it == cat.tensors.end() && e.kind == kMasterKind) {
      auto model = cat.tensors.find({e.fqn, std::string(kModelKind)});
      if (model != cat.tensors.end()) {
        ST_CHECK(
            model->second.dtype == DType::F32 || options.master_from_model,
            "checkpoint '{}' has no master weights, only {} model weights ({} is one); add master_weight_compatible "
            "to checkpoint.unified_checkpoint_config to start the F32 master weights from them",
            cat.dir, model->second.dtype, e.fqn);
        it = model;
      }
    }
    ST_CHECK(it != cat.tensors.end(), "tensor {} kind {} is not in checkpoint '{}'", e.fqn, e.kind, cat.dir);
    const StoredTensor& stored = it->second;
    ST_CHECK(stored.shape == e.global_shape, "tensor {} kind {}: checkpoint '{}' has shape {}, the model has {}", e.fqn,
             it->first.second, cat.dir, shape_str(stored.shape), shape_str(e.global_shape));
    const bool convertible =
        stored.dtype == e.local.dtype() || (stored.dtype != DType::I32 && e.local.dtype() != DType::I32);
    ST_CHECK(convertible, "tensor {} kind {}: cannot load {} data into {}", e.fqn, it->first.second, stored.dtype,
             e.local.dtype());
    const int64_t numel = e.local.defined() ? e.local.numel() : 0;
    ST_CHECK(e.begin >= 0 && e.begin + numel <= shape_numel(e.global_shape),
             "tensor {} kind {}: elements [{}, {}) lie outside its shape {}", e.fqn, e.kind, e.begin, e.begin + numel,
             shape_str(e.global_shape));
    if (numel == 0) continue;
    std::map<std::pair<std::string, std::string>, const ChunkRecord*> by_location;
    for (const ChunkRecord& c : stored.chunks) by_location[{c.file, c.key}] = &c;
    for (Read& r :
         plan_reads(stored.chunks, StateEntry{e.fqn, it->first.second, e.global_shape, e.dtype, e.begin, e.local}))
      tasks.push_back(Task{&e, &stored, by_location.at({r.file, r.key}), std::move(r)});
  }
  if (options.verify) {
    int64_t i = 0;
    for (const auto& [id, stored] : cat.tensors) {
      for (const ChunkRecord& c : stored.chunks) {
        const bool mine = i++ % std::max(1, options.verify_world) == options.verify_rank;
        if (mine && stored.checksummed) tasks.push_back(Task{nullptr, &stored, &c, {}});
      }
    }
  }

  // Open every file the tasks touch, once.
  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  for (const Task& t : tasks) {
    const std::string& name = t.chunk->file;
    if (files.count(name) != 0) continue;
    const std::string path = join_path(cat.dir, name);
    ST_CHECK(fs::exists(path), "checkpoint file '{}' (holding tensor {} kind {}) is missing", path, t.chunk->fqn,
             t.chunk->kind);
    files.emplace(name, std::make_unique<SafetensorsFile>(path));
  }
  for (const Task& t : tasks) {
    const SafetensorsFile& f = *files.at(t.chunk->file);
    ST_CHECK(f.has(t.chunk->key), "checkpoint file '{}' has no tensor '{}' (tensor {} kind {})", f.path(), t.chunk->key,
             t.chunk->fqn, t.chunk->kind);
    const TensorInfo& info = f.info(t.chunk->key);
    ST_CHECK(shape_numel(info.shape) == t.chunk->numel && info.dtype == t.stored->dtype,
             "checkpoint file '{}': tensor '{}' is {} {}, the index says {} elements of {}", f.path(), t.chunk->key,
             info.dtype, shape_str(info.shape), t.chunk->numel, t.stored->dtype);
  }

  std::atomic<size_t> next{0};
  std::mutex mu;
  std::string first_error;
  auto worker = [&] {
    for (size_t i = next++; i < tasks.size(); i = next++) {
      const Task& t = tasks[i];
      std::string err = error_of([&] {
        const SafetensorsFile& f = *files.at(t.chunk->file);
        const TensorInfo& info = f.info(t.chunk->key);
        if (t.entry == nullptr) {
          std::vector<std::byte> bytes(info.nbytes);
          f.read(t.chunk->key, 0, info.nbytes, bytes.data());
          const uint32_t crc = crc32c(bytes);
          ST_CHECK(crc == t.chunk->crc32c,
                   "checksum mismatch in '{}', tensor '{}' ({} kind {}): crc32c {} but the index records {}", f.path(),
                   t.chunk->key, t.chunk->fqn, t.chunk->kind, crc, t.chunk->crc32c);
          return;
        }
        const size_t esize = dtype_size(info.dtype);
        Tensor buf = Tensor::empty({t.read.count}, info.dtype);
        f.read(t.chunk->key, static_cast<uint64_t>(t.read.chunk_offset_elems) * esize,
               static_cast<uint64_t>(t.read.count) * esize, buf.raw_data());
        const Tensor& local = t.entry->local;
        Tensor src = info.dtype == local.dtype() ? buf : ops::cast(buf, local.dtype());
        local.view({local.numel()}).flat_slice(t.read.entry_offset_elems, t.read.count).copy_from(src);
      });
      if (!err.empty()) {
        std::lock_guard lock(mu);
        if (first_error.empty()) first_error = err;
      }
    }
  };
  const int n = std::clamp<int>(options.threads, 1, static_cast<int>(std::max<size_t>(1, tasks.size())));
  std::vector<std::thread> pool;
  for (int i = 1; i < n; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  ST_CHECK(first_error.empty(), "{}", first_error);
}

}  // namespace st::checkpoint
