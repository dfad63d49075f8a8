#include "checkpoint/sharded.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <utility>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "checkpoint/checksum.h"
#include "checkpoint/safetensors.h"
#include "core/ops.h"

namespace st::checkpoint {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string errno_text(int err) { return std::strerror(err); }

std::string join_path(const std::string& dir, std::string_view name) { return (fs::path(dir) / name).string(); }

// Writes `text` to `path` durably: temp file, fsync, rename, fsync of the directory,
// so a reader sees either the old index or the complete new one.
void write_file_atomic(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    UniqueFd fd(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
    ST_CHECK(fd.valid(), "cannot create '{}': {}", tmp, errno_text(errno));
    size_t done = 0;
    while (done < text.size()) {
      ssize_t got = ::write(fd.get(), text.data() + done, text.size() - done);
      if (got < 0 && errno == EINTR) continue;
      ST_CHECK(got > 0, "writing '{}' failed: {}", tmp, got < 0 ? errno_text(errno) : std::string("wrote 0 bytes"));
      done += static_cast<size_t>(got);
    }
    ST_CHECK(::fsync(fd.get()) == 0, "fsync of '{}' failed: {}", tmp, errno_text(errno));
    int raw = fd.release();
    ST_CHECK(::close(raw) == 0, "closing '{}' failed: {}", tmp, errno_text(errno));
  }
  ST_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "renaming '{}' to '{}' failed: {}", tmp, path, errno_text(errno));
  std::string parent = fs::path(path).parent_path().string();
  UniqueFd dfd(::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  ST_CHECK(dfd.valid(), "cannot open directory '{}': {}", parent, errno_text(errno));
  ST_CHECK(::fsync(dfd.get()) == 0, "fsync of directory '{}' failed: {}", parent, errno_text(errno));
}

// Runs `step` on this rank, then tells every rank whether any rank failed, so
// a failure cannot leave the other ranks waiting in a later collective.
template <class F>
void run_step_everywhere(ProcessGroup& group, const std::string& what, F&& step) {
  std::string error;
  try {
    step();
  } catch (const std::exception& e) {
    error = e.what();
  }
  std::vector<int32_t> flag{error.empty() ? 0 : 1};
  Tensor t = Tensor::from_vector(flag, {1});
  group.all_reduce(t, {.op = ReduceOp::Max}).wait();
  ST_CHECK(error.empty(), "save_sharded: {} failed on rank {}: {}", what, group.rank(), error);
  ST_CHECK(t.data<int32_t>()[0] == 0, "save_sharded: {} failed on another rank (this is rank {})", what, group.rank());
}

json chunk_to_json(const ChunkRecord& c) {
  return json{{"fqn", c.fqn},   {"kind", c.kind}, {"begin", c.begin},  {"numel", c.numel},
              {"file", c.file}, {"key", c.key},   {"crc32c", c.crc32c}};
}

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
  // The file name comes from untrusted input: it must not leave the directory.
  ST_CHECK(!c.file.empty() && c.file.find('/') == std::string::npos && c.file != "." && c.file != "..",
           "'{}': chunk '{}' names file '{}', which is not a plain file name", index_path, c.key, c.file);
  return c;
}

struct TensorMeta {
  Shape shape;
  DType dtype = DType::F32;
};

bool dtypes_convertible(DType from, DType to) { return from == to || (from != DType::I32 && to != DType::I32); }

}  // namespace

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
  const int rank = group.rank();
  const int world = group.size();
  const std::string file = shard_file_name(rank, world);
  json local{{"tensors", json::array()}, {"chunks", json::array()}};

  run_step_everywhere(group, "writing the shard files", [&] {
    SafetensorsWriter writer;
    std::vector<ChunkRecord> chunks;
    for (const StateEntry& e : entries) {
      const int64_t numel = e.local.defined() ? e.local.numel() : 0;
      ST_CHECK(e.begin >= 0 && e.begin + numel <= shape_numel(e.global_shape),
               "tensor {} kind {}: elements [{}, {}) lie outside its shape {}", e.fqn, e.kind, e.begin, e.begin + numel,
               shape_str(e.global_shape));
      ST_CHECK(numel == 0 || e.local.dtype() == e.dtype, "tensor {} kind {}: local holds {} but the entry says {}",
               e.fqn, e.kind, e.local.dtype(), e.dtype);
      local["tensors"].push_back(json{
          {"fqn", e.fqn}, {"kind", e.kind}, {"shape", e.global_shape}, {"dtype", std::string(dtype_name(e.dtype))}});
      if (numel == 0) continue;
      Tensor host = e.local.device().is_cpu() ? e.local : e.local.to(Device::cpu());
      std::string key = chunk_key(e.fqn, e.kind, e.begin);
      writer.add(key, host.view({numel}));
      chunks.push_back(ChunkRecord{e.fqn, e.kind, e.begin, numel, file, key, 0});
    }
    writer.set_metadata("format", std::string(kShardedFormat));
    std::vector<WrittenTensor> written = writer.write(join_path(dir, file));
    std::map<std::string, uint32_t> crc_of;
    for (const WrittenTensor& w : written) crc_of[w.name] = w.crc32c;
    for (ChunkRecord& c : chunks) {
      c.crc32c = crc_of.at(c.key);
      local["chunks"].push_back(chunk_to_json(c));
    }
  });

  std::vector<std::string> lists = all_gather_strings(group, local.dump());

  run_step_everywhere(group, "writing the index", [&] {
    if (rank != 0) return;
    std::map<std::pair<std::string, std::string>, std::pair<json, int>> seen;  // (fqn, kind) -> (meta, rank)
    json tensors = json::object();
    json chunks = json::array();
    for (int r = 0; r < world; ++r) {
      json list = json::parse(lists[static_cast<size_t>(r)]);
      for (const json& t : list.at("tensors")) {
        auto id = std::make_pair(t.at("fqn").get<std::string>(), t.at("kind").get<std::string>());
        json meta{{"shape", t.at("shape")}, {"dtype", t.at("dtype")}};
        auto [it, inserted] = seen.emplace(id, std::make_pair(meta, r));
        ST_CHECK(inserted || it->second.first == meta, "tensor {} kind {}: rank {} saves it as {} but rank {} as {}",
                 id.first, id.second, it->second.second, it->second.first.dump(), r, meta.dump());
        tensors[id.first][id.second] = meta;
      }
      for (const json& c : list.at("chunks")) chunks.push_back(c);
    }
    json index{{"format", std::string(kShardedFormat)},
               {"version", kShardedVersion},
               {"world_size", world},
               {"tensors", tensors},
               {"chunks", chunks}};
    write_file_atomic(join_path(dir, kShardedIndexName), index.dump(1) + "\n");
  });
}

void load_sharded(const std::string& dir, std::span<StateEntry> entries, Verify verify) {
  const std::string index_path = join_path(dir, kShardedIndexName);
  json index;
  {
    std::FILE* f = std::fopen(index_path.c_str(), "rb");
    ST_CHECK(f != nullptr, "cannot open checkpoint index '{}': {}", index_path, errno_text(errno));
    std::string text;
    char buf[65536];
    size_t got = 0;
    while ((got = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, got);
    bool failed = std::ferror(f) != 0;
    std::fclose(f);
    ST_CHECK(!failed, "reading checkpoint index '{}' failed", index_path);
    try {
      index = json::parse(text);
    } catch (const json::exception& e) {
      ST_FAIL("checkpoint index '{}' is not valid JSON: {}", index_path, e.what());
    }
  }
  ST_CHECK(index.is_object() && index.value("format", std::string()) == kShardedFormat, "'{}' is not a {} index",
           index_path, kShardedFormat);
  ST_CHECK(index.value("version", -1) == kShardedVersion, "'{}': unsupported version {} (this build reads {})",
           index_path, index.value("version", -1), kShardedVersion);

  std::map<std::pair<std::string, std::string>, TensorMeta> tensors;
  std::map<std::pair<std::string, std::string>, std::vector<ChunkRecord>> chunks_of;
  try {
    for (const auto& [fqn, kinds] : index.at("tensors").items()) {
      for (const auto& [kind, meta] : kinds.items()) {
        std::string name = meta.at("dtype").get<std::string>();
        std::optional<DType> dt = dtype_from_name(name);
        ST_CHECK(dt.has_value(), "'{}': tensor {} kind {} has unknown dtype '{}'", index_path, fqn, kind, name);
        tensors[{fqn, kind}] = TensorMeta{meta.at("shape").get<Shape>(), *dt};
      }
    }
    for (const json& c : index.at("chunks")) {
      ChunkRecord rec = chunk_from_json(c, index_path);
      chunks_of[{rec.fqn, rec.kind}].push_back(std::move(rec));
    }
  } catch (const json::exception& e) {
    ST_FAIL("checkpoint index '{}' is malformed: {}", index_path, e.what());
  }

  std::map<std::string, std::unique_ptr<SafetensorsFile>> files;
  auto open = [&](const std::string& name) -> const SafetensorsFile& {
    auto it = files.find(name);
    if (it != files.end()) return *it->second;
    std::string path = join_path(dir, name);
    ST_CHECK(fs::exists(path), "checkpoint file '{}' (listed in '{}') is missing", path, index_path);
    return *files.emplace(name, std::make_unique<SafetensorsFile>(path)).first->second;
  };
  std::set<std::pair<std::string, std::string>> verified;  // (file, key)

  for (StateEntry& e : entries) {
    auto meta = tensors.find({e.fqn, e.kind});
    ST_CHECK(meta != tensors.end(), "tensor {} kind {} is not in checkpoint '{}'", e.fqn, e.kind, dir);
    ST_CHECK(meta->second.shape == e.global_shape, "tensor {} kind {}: checkpoint has shape {}, model has {}", e.fqn,
             e.kind, shape_str(meta->second.shape), shape_str(e.global_shape));
    const int64_t numel = e.local.defined() ? e.local.numel() : 0;
    ST_CHECK(e.begin >= 0 && e.begin + numel <= shape_numel(e.global_shape),
             "tensor {} kind {}: elements [{}, {}) lie outside its shape {}", e.fqn, e.kind, e.begin, e.begin + numel,
             shape_str(e.global_shape));
    if (numel == 0) continue;
    const std::vector<ChunkRecord>& chunks = chunks_of[{e.fqn, e.kind}];
    std::map<std::pair<std::string, std::string>, const ChunkRecord*> by_location;
    for (const ChunkRecord& c : chunks) by_location[{c.file, c.key}] = &c;

    for (const Read& r : plan_reads(chunks, e)) {
      const SafetensorsFile& f = open(r.file);
      ST_CHECK(f.has(r.key), "checkpoint file '{}' has no tensor '{}' (listed in '{}')", f.path(), r.key, index_path);
      const TensorInfo& info = f.info(r.key);
      const ChunkRecord& rec = *by_location.at({r.file, r.key});
      ST_CHECK(shape_numel(info.shape) == rec.numel, "checkpoint file '{}': tensor '{}' has {} elements, index says {}",
               f.path(), r.key, shape_numel(info.shape), rec.numel);
      ST_CHECK(dtypes_convertible(info.dtype, e.local.dtype()),
               "tensor {} kind {}: cannot load {} data from '{}' key '{}' into {}", e.fqn, e.kind, info.dtype, f.path(),
               r.key, e.local.dtype());
      if (verify == Verify::Yes && verified.insert({r.file, r.key}).second) {
        std::vector<std::byte> bytes(info.nbytes);
        f.read(r.key, 0, info.nbytes, bytes.data());
        uint32_t crc = crc32c(bytes);
        ST_CHECK(crc == rec.crc32c, "checksum mismatch in '{}' key '{}': crc32c {} but the index records {}", f.path(),
                 r.key, crc, rec.crc32c);
      }
      const size_t esize = dtype_size(info.dtype);
      Tensor buf = Tensor::empty({r.count}, info.dtype);
      f.read(r.key, static_cast<uint64_t>(r.chunk_offset_elems) * esize, static_cast<uint64_t>(r.count) * esize,
             buf.raw_data());
      Tensor src = info.dtype == e.local.dtype() ? buf : ops::cast(buf, e.local.dtype());
      e.local.view({numel}).flat_slice(r.entry_offset_elems, r.count).copy_from(src);
    }
  }
}

}  // namespace st::checkpoint
