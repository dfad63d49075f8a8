#include "checkpoint/index.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <span>
#include <sstream>
#include <system_error>

#include <nlohmann/json.hpp>

#include "checkpoint/checksum.h"
#include "checkpoint/fs.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/file.h"

namespace st::checkpoint {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

std::string join_path(const std::string& dir, std::string_view name) { return (fs::path(dir) / name).string(); }

json read_json_file(const std::string& path) {
  const std::string text = read_file(path, "index");
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    ST_FAIL("'{}' is not valid JSON: {}", path, e.what());
  }
}

}  // namespace

namespace {

constexpr Named<Layout> kLayoutNames[] = {{Layout::Unified, "unified"}, {Layout::Sharded, "sharded"}};

}  // namespace

std::span<const Named<Layout>> names_of(Layout) { return kLayoutNames; }

std::string_view layout_name(Layout layout) { return name_in(layout, names_of(layout)); }

std::optional<Layout> parse_layout(std::string_view name) {
  for (const Named<Layout>& n : kLayoutNames)
    if (n.name == name) return n.value;
  return std::nullopt;
}

std::string step_dir_name(int64_t step) {
  ST_CHECK(step >= 0, "checkpoint step must be >= 0, got {}", step);
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%06lld", static_cast<long long>(step));
  return buf;
}

std::optional<int64_t> parse_step_dir_name(std::string_view name) {
  constexpr std::string_view kStepPrefix = "step-";
  if (!name.starts_with(kStepPrefix)) return std::nullopt;
  std::string_view digits = name.substr(kStepPrefix.size());
  // 18 digits cannot overflow int64_t; longer names are not ours.
  if (digits.size() < 6 || digits.size() > 18) return std::nullopt;
  int64_t step = 0;
  for (char c : digits) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  // Only the canonical spelling: "step-0000200" would be a second name for step 200.
  if (step_dir_name(step) != name) return std::nullopt;
  return step;
}

std::string unified_file_name(std::string_view family, int k, int n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "-%05d-of-%05d.safetensors", k, n);
  return std::string(family) + buf;
}

bool is_plain_file_name(std::string_view name) {
  return !name.empty() && name.find('/') == std::string_view::npos && name != "." && name != "..";
}

std::string shard_file_name(int rank, int world_size) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "shard-%05d-of-%05d.safetensors", rank, world_size);
  return buf;
}

std::string chunk_key(const std::string& fqn, const std::string& kind, int64_t begin) {
  return fqn + "|" + kind + "|" + std::to_string(begin);
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

std::string unified_index_text(std::string_view family, int world_size, const std::vector<UnifiedIndexEntry>& entries) {
  json weight_map = json::object();
  json crcs = json::object();
  int64_t total = 0;
  for (const UnifiedIndexEntry& e : entries) {
    weight_map[e.key] = e.file;
    crcs[e.key] = e.crc32c;
    total += e.nbytes;
  }
  const json index{{"metadata",
                    {{"total_size", total},
                     {"format", std::string(kUnifiedFormat)},
                     {"version", kUnifiedVersion},
                     {"family", std::string(family)},
                     {"world_size", world_size}}},
                   {"weight_map", weight_map},
                   {"crc32c", crcs}};
  return index.dump(1) + "\n";
}

std::string sharded_index_text(int world_size,
                               const std::map<std::pair<std::string, std::string>, std::pair<Shape, DType>>& tensors,
                               const std::vector<ChunkRecord>& chunks) {
  json by_fqn = json::object();
  for (const auto& [id, meta] : tensors)
    by_fqn[id.first][id.second] = {{"shape", meta.first}, {"dtype", std::string(dtype_name(meta.second))}};
  json list = json::array();
  for (const ChunkRecord& c : chunks)
    list.push_back({{"fqn", c.fqn},
                    {"kind", c.kind},
                    {"begin", c.begin},
                    {"numel", c.numel},
                    {"file", c.file},
                    {"key", c.key},
                    {"crc32c", c.crc32c}});
  const json index{{"format", std::string(kShardedFormat)},
                   {"version", kShardedVersion},
                   {"world_size", world_size},
                   {"tensors", by_fqn},
                   {"chunks", list}};
  return index.dump(1) + "\n";
}

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
  ST_CHECK(is_plain_file_name(file), "'{}': tensor '{}' names file '{}', which is not a plain file name", index_path,
           key, file);
}

void read_sharded_catalog(Catalog& cat, const std::string& index_path) {
  json index = read_json_file(index_path);
  // json::value() throws type_error for a "format" or "version" of another
  // type, so they are read inside the try too (fuzzing found it).
  try {
    ST_CHECK(index.is_object() && index.value("format", std::string()) == kShardedFormat, "'{}' is not a {} index",
             index_path, kShardedFormat);
    ST_CHECK(index.value("version", -1) == kShardedVersion, "'{}': unsupported version {} (this build reads {})",
             index_path, index.value("version", -1), kShardedVersion);
    cat.format = layout_name(Layout::Sharded);
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

// What one Hugging Face style index lists: key -> file, our CRCs, and
// whether it is ours (then its world size goes into `cat`).
struct HfIndex {
  std::map<std::string, std::string> weight_map;
  std::map<std::string, uint32_t> crcs;
  bool ours = false;
};

HfIndex read_hf_index(Catalog& cat, const std::string& index_path) {
  HfIndex out;
  json index = read_json_file(index_path);
  try {
    ST_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
             "'{}' has no \"weight_map\" object", index_path);
    const json& meta = index.value("metadata", json::object());
    out.ours = meta.is_object() && meta.value("format", std::string()) == kUnifiedFormat;
    if (out.ours) {
      ST_CHECK(meta.value("version", -1) == kUnifiedVersion, "'{}': unsupported version {} (this build reads {})",
               index_path, meta.value("version", -1), kUnifiedVersion);
      cat.world_size = meta.value("world_size", 0);
    }
    for (const auto& [key, file] : index["weight_map"].items()) out.weight_map[key] = file.get<std::string>();
    if (index.contains("crc32c"))
      for (const auto& [key, crc] : index["crc32c"].items()) out.crcs[key] = crc.get<uint32_t>();
  } catch (const json::exception& e) {
    ST_FAIL("checkpoint index '{}' is malformed: {}", index_path, e.what());
  }
  return out;
}

// Adds the tensors of one Hugging Face style index (or of a single file when
// `index_path` is empty) under `kind` ("" = split "<fqn>.<kind>" keys).
void read_hf_family(Catalog& cat, const std::string& index_path, const std::string& single_file,
                    const std::string& kind) {
  HfIndex listed;
  if (!index_path.empty()) {
    listed = read_hf_index(cat, index_path);
  } else {
    SafetensorsFile f(join_path(cat.dir, single_file));
    for (const std::string& key : f.names()) listed.weight_map[key] = single_file;
  }
  const auto& [weight_map, crcs, ours] = listed;
  if (ours && cat.format.empty()) cat.format = layout_name(Layout::Unified);
  if (!ours) cat.format = kHuggingFaceFormat;

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

namespace {

constexpr std::string_view kMarkerHeader = "shardtrain checkpoint";

std::string crc_hex(std::string_view text) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", crc32c(std::as_bytes(std::span(text.data(), text.size()))));
  return buf;
}

/// The marker's text up to its crc32c line: header, step, and one line per
/// file with its size; each file is fsynced first, so the marker never vouches
/// for data that is not yet durable.
std::string marker_body(const fs::path& dir, int64_t step, const std::vector<std::string>& files_written) {
  std::string marker = format("{}\nstep {}\n", kMarkerHeader, step);
  for (const std::string& name : files_written) {
    ST_CHECK(!name.empty() && name.find_first_of("/\n") == std::string::npos && name != "." && name != ".." &&
                 name != kCompleteMarkerName,
             "checkpoint file name '{}' must be a plain file name inside {}", name, dir.string());
    fs::path file = dir / name;
    std::error_code ec;
    uintmax_t size = fs::file_size(file, ec);
    ST_CHECK(!ec, "checkpoint file {} cannot be read: {}", file.string(), ec.message());
    fsync_path(file, PathKind::File);
    if (name.ends_with(".safetensors")) {
      // The data is covered by the index's per-tensor CRC32Cs; the header only here.
      marker += format("head {} {} {}\n", size, crc_hex(read_header_bytes(file.string())), name);
    } else {
      const std::string content = read_file(file, "checkpoint file");
      ST_CHECK(content.size() == size, "checkpoint file {} changed while the marker was written", file.string());
      marker += format("sum {} {} {}\n", size, crc_hex(content), name);
    }
  }
  return marker;
}

}  // namespace

namespace {

// One line of a COMPLETE marker after its step line: "file SIZE NAME",
// "sum SIZE CRC NAME", "head SIZE CRC NAME" or "elsewhere NAME"; false for anything else.
bool add_marker_line(const std::string& line, CompleteMarker& out) {
  if (line.starts_with("elsewhere ")) {
    std::string name = line.substr(10);
    if (!is_plain_file_name(name)) return false;
    out.elsewhere.push_back(std::move(name));
    return true;
  }
  std::istringstream fields(line);
  std::string kind;
  MarkerFile file;
  std::string crc;
  if (!(fields >> kind >> file.size)) return false;
  if (kind == "sum" || kind == "head") {
    if (!(fields >> crc) || crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos)
      return false;
    file.sum = kind == "sum" ? MarkerSum::Whole : MarkerSum::Header;
    file.crc32c = static_cast<uint32_t>(std::stoul(crc, nullptr, 16));
  } else if (kind != "file") {
    return false;
  }
  std::getline(fields >> std::ws, file.name);
  out.files.push_back(std::move(file));
  return true;
}

}  // namespace

CompleteMarker read_complete_marker(const fs::path& dir) {
  CompleteMarker out;
  std::string problem;
  auto marker = read_small_file(dir / kCompleteMarkerName, &problem);
  if (!marker) {
    std::error_code missing;
    out.problem = fs::exists(fs::symlink_status(dir / kCompleteMarkerName, missing))
                      ? "COMPLETE marker unusable: " + problem
                      : "missing COMPLETE marker";
    return out;
  }
  const std::string& text = *marker;
  size_t crc_at = text.rfind("crc32c ");
  if (crc_at == std::string::npos || (crc_at > 0 && text[crc_at - 1] != '\n')) {
    out.problem = "COMPLETE marker is truncated (no crc32c line)";
    return out;
  }
  if (trim_space(text.substr(crc_at + 7)) != crc_hex(std::string_view(text).substr(0, crc_at))) {
    out.problem = "COMPLETE marker fails its crc32c check";
    return out;
  }
  std::istringstream in(text.substr(0, crc_at));
  std::string line;
  if (!std::getline(in, line) || line != kMarkerHeader) {
    out.problem = "COMPLETE marker has no header";
    return out;
  }
  std::optional<int64_t> step;
  if (std::getline(in, line) && line.starts_with("step ")) {
    // The marker holds the plain decimal; padded to step_dir_name's six digits,
    // parse_step_dir_name accepts exactly the canonical spellings.
    std::string digits = line.substr(5);
    if (digits.size() < 6) digits.insert(0, 6 - digits.size(), '0');
    step = parse_step_dir_name("step-" + digits);
  }
  if (!step) {
    out.problem = format("COMPLETE marker has a bad step line '{}'", line);
    return out;
  }
  out.step = *step;
  while (std::getline(in, line)) {
    if (!add_marker_line(line, out)) {
      out.problem = format("COMPLETE marker has a bad line '{}'", line);
      return out;
    }
  }
  return out;
}

std::string complete_marker_text(const fs::path& dir, int64_t step, const std::vector<std::string>& files_written,
                                 const std::vector<std::string>& elsewhere) {
  std::string marker = marker_body(dir, step, files_written);
  for (const std::string& name : elsewhere) {
    ST_CHECK(is_plain_file_name(name), "checkpoint file name '{}' must be a plain file name", name);
    marker += format("elsewhere {}\n", name);
  }
  return marker + "crc32c " + crc_hex(marker) + "\n";
}

void write_complete_marker(const fs::path& dir, int64_t step, const std::vector<std::string>& files_written) {
  write_file_synced(dir / kCompleteMarkerName, complete_marker_text(dir, step, files_written), {});
  fsync_path(dir, PathKind::Directory);
}

std::string incomplete_reason(const fs::path& dir, int64_t step) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(dir, ec);
  if (ec && ec != std::errc::no_such_file_or_directory) return "directory cannot be opened: " + ec.message();
  if (!is_dir) return "directory does not exist";
  const CompleteMarker marker = read_complete_marker(dir);
  if (!marker.problem.empty()) return marker.problem;
  if (marker.step != step) return format("COMPLETE marker is for step {}, not step {}", marker.step, step);
  // Every missing file is named: a user restoring them needs the whole list.
  std::vector<std::string> missing;
  std::string first_error;
  for (const MarkerFile& f : marker.files) {
    std::error_code size_ec;
    if (is_plain_file_name(f.name)) (void)fs::file_size(dir / f.name, size_ec);
    if (size_ec) {
      missing.push_back(f.name);
      if (first_error.empty()) first_error = size_ec.message();
      continue;
    }
    if (std::string problem = marker_file_problem(dir, f); !problem.empty()) return problem;
  }
  if (missing.size() == 1) return format("{} is missing ({})", missing[0], first_error);
  if (!missing.empty()) {
    std::string names;
    for (const std::string& name : missing) names += (names.empty() ? "" : ", ") + name;
    return format("{} files are missing: {}", missing.size(), names);
  }
  // One host's part of a checkpoint saved to node-local disks: whole only
  // with the other hosts' files beside it (copied here) or on hosts that join.
  std::string away;
  int n_away = 0;
  for (const std::string& name : marker.elsewhere) {
    std::error_code size_ec;
    (void)fs::file_size(dir / name, size_ec);
    if (!size_ec) continue;
    away += (n_away++ ? ", " : "") + name;
  }
  if (n_away > 0)
    return format(
        "holds one host's part: {} file(s) are on other hosts ({}); run on those hosts too, or copy the files here "
        "from their {}",
        n_away, away, dir.filename().string());
  return {};
}

std::string marker_file_problem(const fs::path& dir, const MarkerFile& f) {
  if (!is_plain_file_name(f.name)) return format("COMPLETE lists '{}', which is not a plain file name", f.name);
  std::error_code size_ec;
  const uintmax_t actual = fs::file_size(dir / f.name, size_ec);
  if (size_ec) return format("{} is missing ({})", f.name, size_ec.message());
  if (actual != f.size) return format("{} has {} bytes, COMPLETE lists {}", f.name, actual, f.size);
  if (f.sum == MarkerSum::None) return {};
  uint32_t have = 0;
  try {
    const std::string path = (dir / f.name).string();
    const std::string content =
        f.sum == MarkerSum::Header ? read_header_bytes(path) : read_file(dir / f.name, "checkpoint file");
    have = crc32c(std::as_bytes(std::span(content.data(), content.size())));
  } catch (const Error& e) {
    return e.message();
  }
  if (have == f.crc32c) return {};
  return format(
      "{}{} fails its checksum in COMPLETE (crc32c {}, COMPLETE lists {}): the file was changed after the save", f.name,
      f.sum == MarkerSum::Header ? ": its header" : "", crc_text(have), crc_text(f.crc32c));
}

}  // namespace st::checkpoint
