#include "checkpoint/tool.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <sstream>
#include <string_view>
#include <utility>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/commit.h"
#include "checkpoint/fs.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "core/tasks.h"

namespace st::checkpoint {

namespace fs = std::filesystem;

namespace {

// ---- shared ------------------------------------------------------------------------

bool is_digit(char c) { return c >= '0' && c <= '9'; }

/// Orders digit runs by value, so that layers.2 comes before layers.10.
bool natural_less(std::string_view a, std::string_view b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (is_digit(a[i]) && is_digit(b[j])) {
      size_t i_end = i, j_end = j;
      while (i_end < a.size() && is_digit(a[i_end])) ++i_end;
      while (j_end < b.size() && is_digit(b[j_end])) ++j_end;
      std::string_view da = a.substr(i, i_end - i), db = b.substr(j, j_end - j);
      while (da.size() > 1 && da.front() == '0') da.remove_prefix(1);
      while (db.size() > 1 && db.front() == '0') db.remove_prefix(1);
      if (da.size() != db.size()) return da.size() < db.size();
      if (da != db) return da < db;
      i = i_end;
      j = j_end;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

/// model, master, then the optimizer kinds alphabetically.
int kind_rank(std::string_view kind) {
  if (kind == kModelKind) return 0;
  if (kind == kMasterKind) return 1;
  return 2;
}

using TensorRef = std::map<std::pair<std::string, std::string>, StoredTensor>::const_iterator;

/// The catalog's tensors in display order.
std::vector<TensorRef> display_order(const Catalog& catalog) {
  std::vector<TensorRef> refs;
  for (auto it = catalog.tensors.begin(); it != catalog.tensors.end(); ++it) refs.push_back(it);
  std::sort(refs.begin(), refs.end(), [](const TensorRef& x, const TensorRef& y) {
    const auto& [xf, xk] = x->first;
    const auto& [yf, yk] = y->first;
    if (xf != yf) return natural_less(xf, yf);
    if (kind_rank(xk) != kind_rank(yk)) return kind_rank(xk) < kind_rank(yk);
    return xk < yk;
  });
  return refs;
}

/// "39 model, 39 master, 39 exp_avg, 39 exp_avg_sq": every stored tensor,
/// counted by kind in display order. inspect and convert both say it, so
/// their counts of one checkpoint agree and show why layouts differ (model-*
/// are stored by the unified layout only).
std::string kind_counts(const Catalog& catalog) {
  std::map<std::string, int64_t> by_kind;
  for (const auto& entry : catalog.tensors) ++by_kind[entry.first.second];
  std::vector<std::pair<std::string, int64_t>> kinds(by_kind.begin(), by_kind.end());
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const auto& x, const auto& y) { return kind_rank(x.first) < kind_rank(y.first); });
  std::string parts;
  for (const auto& [kind, n] : kinds) parts += format("{}{} {}", parts.empty() ? "" : ", ", n, kind);
  return parts;
}

int64_t stored_bytes(const StoredTensor& t) {
  int64_t n = 0;
  for (const ChunkRecord& c : t.chunks) n += c.numel;
  return n * static_cast<int64_t>(dtype_size(t.dtype));
}

/// Files of the layouts (data and indexes) and the marker: what convert rewrites
/// rather than copies.
bool is_layout_file(const std::string& name) {
  return name == kCompleteMarkerName || name.ends_with(".safetensors") || name.ends_with(".index.json");
}

std::vector<DirFile> list_files(const fs::path& dir) {
  std::vector<DirFile> files;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  ST_CHECK(!ec, "cannot list {}: {}", dir.string(), ec.message());
  for (const fs::directory_entry& entry : it) {
    std::error_code type_ec;
    if (!entry.is_regular_file(type_ec)) continue;
    std::error_code size_ec;
    const uintmax_t size = entry.file_size(size_ec);
    files.push_back({entry.path().filename().string(), size_ec ? -1 : static_cast<int64_t>(size)});
  }
  std::sort(files.begin(), files.end(), [](const DirFile& a, const DirFile& b) { return a.name < b.name; });
  return files;
}

DType model_dtype_of(const std::optional<TrainerState>& state, const std::string& dir) {
  if (!state || state->model_dtype.empty()) return DType::F32;
  std::optional<DType> dtype = dtype_from_name(state->model_dtype);
  ST_CHECK(dtype && *dtype != DType::I32, "{}/{}: model_dtype '{}' is not F32 or BF16", dir, kTrainerStateFileName,
           state->model_dtype);
  return *dtype;
}

nlohmann::ordered_json read_json_object(const fs::path& path) {
  const std::string text = read_file(path, "JSON file");
  nlohmann::ordered_json json;
  try {
    json = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ST_FAIL("{} is not valid JSON: {}", path.string(), e.what());
  }
  ST_CHECK(json.is_object(), "{} is not a JSON object", path.string());
  return json;
}

// ---- inspect -----------------------------------------------------------------------

/// Everything above the tensor table, ending in a blank line.
std::string inspection_header(const Inspection& in) {
  const Catalog& cat = in.catalog;
  std::ostringstream os;
  // A plain Hugging Face folder has no COMPLETE marker by nature: it is a model
  // directory (loadable by init_from), not a checkpoint that failed to finish.
  const bool hf = cat.format == kHuggingFaceFormat;
  os << (hf ? "Hugging Face model directory " : "checkpoint ") << in.dir << "\n";
  const int64_t step = in.state ? in.state->step : in.marker_step;
  os << "  format       " << cat.format;
  if (cat.world_size > 0) os << ", written by " << cat.world_size << " process(es)";
  os << "\n";
  if (step >= 0) {
    os << "  step         " << step;
    if (in.state) os << " (" << in.state->consumed_samples << " samples consumed)";
    os << "\n";
  }
  if (in.state) {
    os << "  trained on   " << in.state->world_size << " rank(s)";
    if (!in.state->sharding_strategy.empty()) os << ", " << in.state->sharding_strategy;
    os << ", model dtype " << (in.state->model_dtype.empty() ? "F32" : in.state->model_dtype) << "\n";
  }
  if (hf)
    os << "  complete     n/a (a model directory, not a training checkpoint: weights only, usable as "
          "checkpoint.init_from)\n";
  else
    os << "  complete     " << (in.incomplete.empty() ? "yes" : "NO: " + in.incomplete) << "\n";
  int64_t file_bytes = 0;
  for (const DirFile& f : in.files) file_bytes += std::max<int64_t>(f.bytes, 0);
  os << "  tensors      " << cat.tensors.size() << " (" << kind_counts(cat) << "), " << human_bytes(cat.total_bytes())
     << " of data; " << in.files.size() << " files, " << human_bytes(file_bytes) << "\n\n";
  return os.str();
}

/// One row per tensor in display order under a header row; numbers
/// right-aligned, text left-aligned.
std::string tensor_table(const Catalog& cat) {
  std::vector<std::array<std::string, 6>> rows;
  rows.push_back({"fqn", "kind", "dtype", "shape", "bytes", "chunks"});
  for (const TensorRef& ref : display_order(cat)) {
    const StoredTensor& t = ref->second;
    rows.push_back({ref->first.first, ref->first.second, std::string(dtype_name(t.dtype)), shape_str(t.shape),
                    std::to_string(stored_bytes(t)), std::to_string(t.chunks.size())});
  }
  std::array<size_t, 6> width{};
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  std::string table;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t pad = width[c] - row[c].size();
      if (c >= 4)
        line += std::string(pad, ' ') + row[c];
      else
        line += row[c] + std::string(pad, ' ');
      if (c + 1 < row.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    table += line + "\n";
  }
  return table;
}

// ---- verify ------------------------------------------------------------------------

/// What checking the chunks of one or more data files found.
struct FileCheck {
  std::vector<std::string> problems;
  int64_t chunks = 0;
  int64_t bytes = 0;

  void add(FileCheck&& other) {
    chunks += other.chunks;
    bytes += other.bytes;
    for (std::string& p : other.problems) problems.push_back(std::move(p));
  }
};

void add_to_report(VerifyReport& report, FileCheck&& check) {
  report.chunks += check.chunks;
  report.bytes += check.bytes;
  for (std::string& p : check.problems) report.problems.push_back(std::move(p));
}

/// A stored chunk and the tensor it is a piece of.
struct ChunkRef {
  const ChunkRecord* chunk;
  const StoredTensor* tensor;
};

std::string chunk_label(const ChunkRef& ref) {
  const ChunkRecord& c = *ref.chunk;
  std::string label = format("tensor {} ({})", c.fqn, c.kind);
  if (c.begin != 0 || c.numel != shape_numel(ref.tensor->shape))
    label += format(" elements [{}, {})", c.begin, c.begin + c.numel);
  return label;
}

/// The CRC32C of a chunk's stored bytes and its non-finite elements.
struct ChunkScan {
  uint32_t crc = 0;
  NonFinite bad;
};

/// Reads chunk `c` (described by `info`) in blocks of `buffer`'s reused memory.
ChunkScan scan_chunk(const SafetensorsFile& file, const ChunkRecord& c, const TensorInfo& info,
                     std::vector<std::byte>& buffer) {
  constexpr uint64_t kBlock = uint64_t{4} << 20;
  const uint64_t esize = dtype_size(info.dtype);
  ChunkScan scan;
  for (uint64_t at = 0; at < info.nbytes; at += kBlock) {
    const uint64_t n = std::min(kBlock, info.nbytes - at);
    buffer.resize(n);
    file.read(c.key, at, n, buffer.data());
    const std::span<const std::byte> block(buffer.data(), n);
    scan.crc = crc32c(block, scan.crc);
    const NonFinite part = count_nonfinite(block, info.dtype, c.begin + static_cast<int64_t>(at / esize));
    if (!scan.bad.any()) scan.bad.first = part.first;
    scan.bad.nan += part.nan;
    scan.bad.inf += part.inf;
  }
  return scan;
}

/// Checks one chunk of data file `name`, open as `file`: stored as the index
/// says, readable, its checksum, finite values.
void check_chunk(const SafetensorsFile& file, const std::string& name, const ChunkRef& ref,
                 std::vector<std::byte>& buffer, FileCheck& out) {
  const ChunkRecord& c = *ref.chunk;
  const std::string label = chunk_label(ref);
  if (!file.has(c.key)) {
    out.problems.push_back(format("{}: {} is missing (no key '{}')", name, label, c.key));
    return;
  }
  const TensorInfo& info = file.info(c.key);
  const uint64_t want_bytes = static_cast<uint64_t>(c.numel) * dtype_size(ref.tensor->dtype);
  if (info.dtype != ref.tensor->dtype || info.nbytes != want_bytes) {
    out.problems.push_back(format("{}: {} is stored as {} {} bytes, the index says {} {} bytes", name, label,
                                  dtype_name(info.dtype), info.nbytes, dtype_name(ref.tensor->dtype), want_bytes));
    return;
  }
  ChunkScan scan;
  try {
    scan = scan_chunk(file, c, info, buffer);
  } catch (const Error& e) {
    out.problems.push_back(format("{}: {} cannot be read: {}", name, label, e.message()));
    return;
  }
  ++out.chunks;
  out.bytes += static_cast<int64_t>(info.nbytes);
  if (ref.tensor->checksummed && scan.crc != c.crc32c)
    out.problems.push_back(format("{}: {} fails its checksum (crc32c {}, the index says {})", name, label,
                                  crc_text(scan.crc), crc_text(c.crc32c)));
  // Training state is never saved non-finite; a value that is would make a resumed run fail at once.
  if (scan.bad.any())
    out.problems.push_back(format("{}: {} holds non-finite values: {} NaN and {} Inf, the first at element {}", name,
                                  label, scan.bad.nan, scan.bad.inf, scan.bad.first));
}

/// Checks every chunk `chunks` (not empty) places in data file `name`.
FileCheck check_file(const fs::path& dir, const std::string& name, const std::vector<ChunkRef>& chunks) {
  FileCheck out;
  const fs::path path = dir / name;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    out.problems.push_back(
        format("{}: missing; it should hold {} chunk(s), e.g. {}", name, chunks.size(), chunk_label(chunks.front())));
    return out;
  }
  std::optional<SafetensorsFile> file;
  try {
    file.emplace(path.string());
  } catch (const Error& e) {
    out.problems.push_back(format("{} ({} chunk(s) in it not checked)", e.message(), chunks.size()));
    return out;
  }
  std::vector<std::byte> buffer;
  for (const ChunkRef& ref : chunks) check_chunk(*file, name, ref, buffer, out);
  return out;
}

/// check_file on every file, `threads` files at once, each by one thread;
/// the results in the order of `files`.
std::vector<FileCheck> check_files(const fs::path& dir,
                                   const std::vector<std::pair<std::string, std::vector<ChunkRef>>>& files,
                                   int threads) {
  std::vector<FileCheck> checks(files.size());
  // check_file reports its problems in the FileCheck; it does not throw.
  run_tasks(files.size(), threads,
            [&](size_t i, int) { checks[i] = check_file(dir, files[i].first, files[i].second); });
  return checks;
}

/// One unified index, as far as check_unified_indexes needs it.
struct UnifiedIndex {
  std::string_view name;        // e.g. model.safetensors.index.json
  std::string_view kind;        // of its keys; "" for the optimizer's "<fqn>.<kind>" keys
  nlohmann::ordered_json crcs;  // its "crc32c" object
};

/// Describes the chunks that `index` places in data file `file_name` from
/// that file's own header, keeping them in `tensors` and `records`; reports
/// keys the file lacks. Throws when the file does not open or a crc32c is
/// not a number.
std::vector<ChunkRef> indexed_chunks(const fs::path& dir, const std::string& file_name,
                                     const std::vector<std::string>& keys, const UnifiedIndex& index,
                                     std::deque<StoredTensor>& tensors, std::deque<ChunkRecord>& records,
                                     FileCheck& out) {
  std::vector<ChunkRef> refs;
  const SafetensorsFile file((dir / file_name).string());
  for (const std::string& key : keys) {
    if (!file.has(key)) {
      out.problems.push_back(format("{}: tensor '{}' is missing ({} lists it)", file_name, key, index.name));
      continue;
    }
    const TensorInfo& info = file.info(key);
    const size_t dot = key.rfind('.');
    const bool optimizer = index.kind.empty() && dot != std::string::npos;
    StoredTensor& t = tensors.emplace_back();
    t.shape = info.shape;
    t.dtype = info.dtype;
    t.checksummed = index.crcs.contains(key);
    ChunkRecord& c = records.emplace_back();
    c.fqn = optimizer ? key.substr(0, dot) : key;
    c.kind = optimizer ? key.substr(dot + 1) : std::string(index.kind);
    c.numel = shape_numel(info.shape);
    c.file = file_name;
    c.key = key;
    c.crc32c = t.checksummed ? index.crcs[key].get<uint32_t>() : 0;
    refs.push_back({&c, &t});
  }
  return refs;
}

/// Whether one of the problems `known` already names `file_name`.
bool names_file(const std::vector<std::string>& known, const std::string& file_name) {
  return std::any_of(known.begin(), known.end(),
                     [&](const std::string& p) { return p.find(file_name) != std::string::npos; });
}

/// Checks the keys `index` places in data file `file_name`.
void check_indexed_file(const fs::path& dir, const std::string& file_name, const std::vector<std::string>& keys,
                        const UnifiedIndex& index, const std::vector<std::string>& known, FileCheck& out) {
  std::deque<StoredTensor> tensors;  // stable addresses for the ChunkRefs
  std::deque<ChunkRecord> records;
  std::vector<ChunkRef> refs;
  try {
    refs = indexed_chunks(dir, file_name, keys, index, tensors, records, out);
  } catch (const Error& e) {
    if (!names_file(known, file_name)) out.problems.push_back(e.message());
    return;
  } catch (const nlohmann::json::exception& e) {
    out.problems.push_back(format("{}: crc32c of a tensor is not a number: {}", index.name, e.what()));
    return;
  }
  if (refs.empty()) return;
  out.add(check_file(dir, file_name, refs));
}

/// Checks every key of the unified index `name` (of `kind`, see UnifiedIndex)
/// in the data files that open, when the index exists.
void check_unified_index(const fs::path& dir, std::string_view name, std::string_view kind,
                         const std::vector<std::string>& known, FileCheck& out) {
  const fs::path index_path = dir / name;
  std::error_code ec;
  if (!fs::exists(index_path, ec)) return;
  nlohmann::ordered_json json;
  try {
    json = read_json_object(index_path);
  } catch (const Error& e) {
    if (!names_file(known, std::string(name))) out.problems.push_back(e.message());
    return;
  }
  if (!json.contains("weight_map") || !json["weight_map"].is_object()) return;
  const UnifiedIndex index{name, kind, json.value("crc32c", nlohmann::ordered_json::object())};
  std::map<std::string, std::vector<std::string>> keys_by_file;
  for (const auto& [key, file] : json["weight_map"].items()) {
    if (!file.is_string()) continue;
    // Untrusted: a name that would leave the directory is reported, never opened.
    if (!is_plain_file_name(file.get<std::string>())) {
      out.problems.push_back(format("{}: tensor '{}' names file '{}', which is not a plain file name (not opened)",
                                    name, key, file.get<std::string>()));
      continue;
    }
    keys_by_file[file.get<std::string>()].push_back(key);
  }
  for (const auto& [file_name, keys] : keys_by_file) check_indexed_file(dir, file_name, keys, index, known, out);
}

/// For a unified checkpoint whose catalog cannot be read: checks every key of
/// every index (model, master_weights, optimizer) in the data files that open,
/// taking dtype and shape from the file's own header. A file that does not
/// open is reported unless one of the `known` problems already names it.
FileCheck check_unified_indexes(const fs::path& dir, const std::vector<std::string>& known) {
  FileCheck out;
  check_unified_index(dir, kModelIndexName, kModelKind, known, out);
  check_unified_index(dir, kMasterIndexName, kMasterKind, known, out);
  check_unified_index(dir, kOptimizerIndexName, "", known, out);
  return out;
}

/// The first element range of `t` that no chunk holds, as "[a, b)"; "" when covered.
std::string coverage_gap(const StoredTensor& t) {
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const ChunkRecord& c : t.chunks) ranges.emplace_back(c.begin, c.begin + c.numel);
  std::sort(ranges.begin(), ranges.end());
  int64_t covered = 0;
  for (const auto& [begin, end] : ranges) {
    if (begin > covered) return format("[{}, {})", covered, begin);
    covered = std::max(covered, end);
  }
  const int64_t numel = shape_numel(t.shape);
  if (covered < numel) return format("[{}, {})", covered, numel);
  return "";
}

/// The marker's own checks: every file it lists present with its size, and
/// the step of a step-NNNNNN directory. Returns the files it lists.
std::set<std::string> check_marker(const fs::path& dir, const CompleteMarker& marker, bool no_marker,
                                   std::vector<std::string>& problems) {
  std::set<std::string> listed;
  if (!marker.problem.empty()) {
    if (!no_marker) problems.push_back(format("{}: {}", kCompleteMarkerName, marker.problem));
    return listed;
  }
  for (const MarkerFile& f : marker.files) {
    listed.insert(f.name);
    if (std::string problem = marker_file_problem(dir, f); !problem.empty()) problems.push_back(problem);
  }
  // A host's part of a checkpoint saved to node-local disks: the other hosts'
  // files count once copied beside it (their data is checked by the index's checksums).
  std::vector<std::string> away;
  for (const std::string& name : marker.elsewhere) {
    std::error_code ec;
    if (fs::is_regular_file(dir / name, ec)) {
      listed.insert(name);
    } else {
      away.push_back(name);
    }
  }
  if (!away.empty()) {
    std::string names;
    for (const std::string& n : away) names += (names.empty() ? "" : ", ") + n;
    problems.push_back(
        format("partial: this directory holds one host's part of a checkpoint saved to node-local "
               "disks; {} file(s) are on other hosts: {} (copy them here to check the whole)",
               away.size(), names));
  }
  if (auto named = parse_step_dir_name(dir.filename().string()); named && *named != marker.step)
    problems.push_back(format("{}: COMPLETE is for step {}", dir.filename().string(), marker.step));
  return listed;
}

/// trainer_state.json, when present, parses and is for the marker's step.
void check_trainer_state(const std::string& dir, const CompleteMarker& marker, std::vector<std::string>& problems) {
  try {
    const std::optional<TrainerState> state = read_trainer_state_if_present(dir);
    if (state && marker.problem.empty() && state->step != marker.step)
      problems.push_back(
          format("{}: step {}, but COMPLETE is for step {}", kTrainerStateFileName, state->step, marker.step));
  } catch (const Error& e) {
    problems.push_back(e.message());
  }
}

/// The catalog's chunks by data file, in display order within a file; a
/// tensor with elements in no chunk is a problem.
std::map<std::string, std::vector<ChunkRef>> chunks_by_file(const Catalog& catalog,
                                                            std::vector<std::string>& problems) {
  std::map<std::string, std::vector<ChunkRef>> by_file;
  for (const TensorRef& ref : display_order(catalog)) {
    const StoredTensor& t = ref->second;
    if (std::string gap = coverage_gap(t); !gap.empty())
      problems.push_back(
          format("tensor {} ({}): elements {} are in no stored chunk", ref->first.first, ref->first.second, gap));
    for (const ChunkRecord& c : t.chunks) by_file[c.file].push_back({&c, &t});
  }
  return by_file;
}

// ---- convert -----------------------------------------------------------------------

/// What every rank of a convert reads and agrees on before loading any tensor.
struct Conversion {
  ResolvedDir src;
  Catalog catalog;
  std::optional<TrainerState> state;
  int64_t step = 0;
  fs::path out_path;  // OUT, absolute
  Layout to = Layout::Unified;
  DType model_dtype = DType::F32;
};

/// Resolves the source and OUT, reads the source's catalog and state, and
/// refuses an existing OUT or an incomplete checkpoint.
Conversion open_conversion(const std::string& path, Layout to, const std::string& out) {
  Conversion c;
  c.to = to;
  c.src = resolve_checkpoint_dir(path);
  std::string trimmed = out;
  while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
  ST_CHECK(!trimmed.empty(), "ckpt convert: OUT is empty");
  c.out_path = fs::absolute(trimmed).lexically_normal();
  std::error_code ec;
  ST_CHECK(!fs::exists(c.out_path, ec), "{} already exists; ckpt convert writes a new directory", out);
  const CheckedCheckpoint checked = check_checkpoint(c.src.path);
  ST_CHECK(checked.problem.empty(), "{} is not a complete checkpoint ({}); see ckpt verify", c.src.path,
           checked.problem);
  c.catalog = read_catalog(c.src.path);
  c.state = read_trainer_state_if_present(c.src.path);
  c.step = c.state ? c.state->step : std::max<int64_t>(checked.step, 0);
  return c;
}

/// The entries one rank loads.
struct Share {
  std::vector<StateEntry> entries;
};

/// Rank `rank`'s contiguous share of every stored tensor. The model-* weights
/// are derived from "master" on save, so they are read only when no master
/// copy is stored (an F32 unified checkpoint, or a Hugging Face directory).
Share share_of(const Catalog& catalog, int rank, int world) {
  const bool has_master = catalog.has_kind(kMasterKind);
  Share share;
  for (const auto& [key, t] : catalog.tensors) {
    std::string kind = key.second;
    if (kind == kModelKind) {
      if (has_master) continue;
      kind = kMasterKind;
    }
    const DType dtype = kind == kMasterKind ? DType::F32 : t.dtype;
    const int64_t numel = shape_numel(t.shape);
    const int64_t begin = numel * rank / world;
    const int64_t end = numel * (rank + 1) / world;
    if (end == begin) continue;
    share.entries.push_back({key.first, kind, t.shape, dtype, begin, Tensor::empty({end - begin}, dtype)});
  }
  return share;
}

SaveOptions save_options_of(const Conversion& c) {
  SaveOptions options;
  options.layout = c.to;
  options.model_weights = true;
  options.master_weights = unified_needs_master_files(options.model_weights, c.model_dtype);
  options.model_dtype = c.model_dtype;
  return options;
}

/// The hidden sibling of OUT the output is written into, OUT's parent created.
TempDir make_output_dir(const fs::path& out_path) {
  std::error_code ec;
  fs::create_directories(out_path.parent_path(), ec);
  ST_CHECK(!ec, "cannot create {}: {}", out_path.parent_path().string(), ec.message());
  return TempDir(out_path.parent_path() / format(".{}.tmp-{}", out_path.filename().string(), ::getpid()));
}

/// Writes the source's non-layout file `name` into `dest`: trainer_state.json
/// saying what the output holds, the Hugging Face config through
/// options.rewrite_hf_config, any other file copied.
void write_other_file(const Conversion& c, const SaveOptions& saved, const ConvertOptions& options,
                      const std::string& name, const fs::path& dest) {
  const fs::path from = fs::path(c.src.path) / name;
  if (name == kTrainerStateFileName && c.state) {
    // What the output holds, in the trainer's terms.
    TrainerState converted = *c.state;
    converted.format = layout_name(c.to);
    converted.model_weights = c.to == Layout::Unified;
    converted.master_weights = c.to == Layout::Sharded || saved.master_weights;
    write_file_synced(dest, trainer_state_text(converted));
  } else if (!options.hf_config_name.empty() && name == options.hf_config_name && options.rewrite_hf_config) {
    // Hugging Face tools load the model-* weights in torch_dtype.
    const DType weights = c.to == Layout::Unified ? c.model_dtype : DType::F32;
    write_file_synced(dest, options.rewrite_hf_config(read_json_object(from).dump(), weights, from.string()));
  } else {
    std::error_code ec;
    fs::copy_file(from, dest, ec);
    ST_CHECK(!ec, "cannot copy {} to {}: {}", from.string(), dest.string(), ec.message());
  }
}

/// Rank 0, after the save: the other files, the COMPLETE marker listing
/// `written` and them, and the rename of `tmp` to OUT.
void finish_output(const Conversion& c, const SaveOptions& saved, const ConvertOptions& options, TempDir& tmp,
                   std::vector<std::string> written) {
  for (const DirFile& f : list_files(c.src.path)) {
    if (is_layout_file(f.name) || f.name.starts_with(".")) continue;
    write_other_file(c, saved, options, f.name, tmp.path() / f.name);
    written.push_back(f.name);
  }
  write_complete_marker(tmp.path(), c.step, written);
  rename_no_replace(tmp.path(), c.out_path);
  tmp.keep();
  fsync_path(c.out_path.parent_path(), PathKind::Directory);
}

}  // namespace

// ---- inspect -----------------------------------------------------------------------

Inspection inspect_checkpoint(const std::string& path) {
  Inspection out;
  ResolvedDir resolved = resolve_checkpoint_dir(path);
  out.dir = resolved.path;
  out.note = resolved.note;
  out.catalog = read_catalog(out.dir);
  out.state = read_trainer_state_if_present(out.dir);
  const CheckedCheckpoint checked = check_checkpoint(out.dir);
  out.marker_step = checked.step;
  out.incomplete = checked.model_dir ? "missing COMPLETE marker" : checked.problem;
  out.files = list_files(out.dir);
  return out;
}

std::string inspection_text(const Inspection& in) { return inspection_header(in) + tensor_table(in.catalog); }

std::string inspection_json(const Inspection& in) {
  const Catalog& cat = in.catalog;
  nlohmann::ordered_json j;
  j["dir"] = in.dir;
  j["format"] = cat.format;
  j["step"] = in.state ? in.state->step : in.marker_step;
  j["world_size"] = in.state && in.state->world_size > 0 ? in.state->world_size : cat.world_size;
  j["saver_world_size"] = cat.world_size;
  j["sharding_strategy"] = in.state ? in.state->sharding_strategy : std::string();
  j["model_dtype"] = in.state && !in.state->model_dtype.empty() ? in.state->model_dtype : std::string("F32");
  j["complete"] = in.incomplete.empty();
  if (!in.incomplete.empty()) j["incomplete_reason"] = in.incomplete;
  j["total_bytes"] = cat.total_bytes();
  j["files"] = nlohmann::ordered_json::array();
  for (const DirFile& f : in.files) j["files"].push_back({{"name", f.name}, {"bytes", f.bytes}});
  j["tensors"] = nlohmann::ordered_json::array();
  for (const TensorRef& ref : display_order(cat)) {
    const StoredTensor& t = ref->second;
    j["tensors"].push_back({{"fqn", ref->first.first},
                            {"kind", ref->first.second},
                            {"shape", t.shape},
                            {"dtype", std::string(dtype_name(t.dtype))},
                            {"numel", shape_numel(t.shape)},
                            {"bytes", stored_bytes(t)},
                            {"chunks", t.chunks.size()}});
  }
  return j.dump(2) + "\n";
}

// ---- verify ------------------------------------------------------------------------

std::string VerifyReport::summary() const {
  if (!ok()) return format("{} problem(s) in {}: FAILED", problems.size(), dir);
  return format("verified {} tensors ({} chunks) in {} files, {}: OK", tensors, chunks, files, human_bytes(bytes));
}

VerifyReport verify_checkpoint(const std::string& path, int threads) {
  VerifyReport report;
  ResolvedDir resolved = resolve_checkpoint_dir(path);
  report.dir = resolved.path;
  report.note = resolved.note;
  const fs::path dir(report.dir);

  // A root whose `latest` names no complete step is damaged, whatever the step it falls back to holds.
  if (resolved.latest_damaged) {
    report.problems.push_back(format("{} (the root is damaged: --resume auto would fall back)", resolved.note));
    report.note.clear();  // said once, as the problem
  }
  const CompleteMarker marker = read_complete_marker(dir);
  const bool no_marker = !fs::exists(fs::symlink_status(dir / kCompleteMarkerName));
  const std::set<std::string> listed = check_marker(dir, marker, no_marker, report.problems);
  check_trainer_state(report.dir, marker, report.problems);
  // What every load checks (check_checkpoint) fails only where the listing above found something, or names it.
  const CheckedCheckpoint checked = check_checkpoint(dir);
  if (!checked.problem.empty() && report.problems.empty()) report.problems.push_back(checked.problem);
  report.unchecked = checked.unchecked_note(report.dir);

  Catalog catalog;
  try {
    catalog = read_catalog(report.dir);
  } catch (const Error& e) {
    report.problems.push_back(e.message());
    if (no_marker) report.problems.push_back("missing COMPLETE marker");
    // A unified catalog needs every data file's header; the indexes alone
    // still say what the files that do open must hold.
    add_to_report(report, check_unified_indexes(dir, report.problems));
    return report;
  }
  report.tensors = static_cast<int64_t>(catalog.tensors.size());
  // A plain Hugging Face directory has no marker (nor checksums) to check.
  if (no_marker && catalog.format != kHuggingFaceFormat) report.problems.push_back("missing COMPLETE marker");

  const std::map<std::string, std::vector<ChunkRef>> by_file = chunks_by_file(catalog, report.problems);
  if (marker.problem.empty()) {
    for (const auto& [file, chunks] : by_file)
      if (!listed.count(file))
        report.problems.push_back(format("{}: holds tensors but COMPLETE does not list it", file));
  }
  // Results are reported in file name order, however the threads finish.
  const std::vector<std::pair<std::string, std::vector<ChunkRef>>> files(by_file.begin(), by_file.end());
  for (FileCheck& check : check_files(dir, files, threads)) add_to_report(report, std::move(check));
  report.files = static_cast<int64_t>(files.size());
  return report;
}

// ---- convert -----------------------------------------------------------------------

std::string convert_checkpoint(const std::string& path, Layout to, const std::string& out, ProcessGroup& group,
                               const ConvertOptions& options) {
  const int rank = group.rank();
  Conversion c;
  run_on_every_rank(group, [&] { c = open_conversion(path, to, out); });
  c.model_dtype = model_dtype_of(c.state, c.src.path);  // same answer on every rank

  Share share = share_of(c.catalog, rank, group.size());
  LoadOptions load;
  load.verify = true;  // together the ranks check every chunk once
  load.master_from_model = !c.catalog.has_kind(kMasterKind);
  load_entries(c.catalog, share.entries, load, group);

  // Written into a hidden sibling of OUT, renamed into place only when complete.
  std::optional<TempDir> tmp;
  std::string tmp_name;
  run_on_every_rank(group, [&] {
    if (rank != 0) return;
    tmp.emplace(make_output_dir(c.out_path));
    tmp_name = tmp->path().string();
  });
  tmp_name = broadcast_string(group, tmp_name);

  const SaveOptions saved = save_options_of(c);
  std::vector<std::string> written;
  run_on_every_rank(group, [&] { written = save(tmp_name, share.entries, saved, group); });
  run_on_every_rank(group, [&] {
    if (rank == 0) finish_output(c, saved, options, *tmp, std::move(written));
  });
  if (rank != 0) return "";
  // Counted as inspect counts them, in and out: the sharded layout stores no
  // model-* copy of the master weights, so its count differs from a unified one's.
  const Catalog written_catalog = read_catalog(c.out_path.string());
  return format(
      "converted {} ({}, {} process(es)) to {} ({}) with {} process(es): read {} tensors ({}), wrote {} "
      "tensors ({}), {}",
      c.src.path, c.catalog.format, c.catalog.world_size, c.out_path.string(), layout_name(to), group.size(),
      c.catalog.tensors.size(), kind_counts(c.catalog), written_catalog.tensors.size(), kind_counts(written_catalog),
      human_bytes(written_catalog.total_bytes()));
}

namespace {

// One host's part: a step directory, or a host's root, which stands for the
// step its `latest` names (a part is never complete alone, so
// resolve_checkpoint_dir would refuse the root).
ResolvedDir resolve_part(const std::string& path) {
  const std::optional<std::string> latest = read_small_file(fs::path(path) / kLatestFileName);
  const std::optional<int64_t> named = latest ? parse_step_dir_name(trim_space(*latest)) : std::nullopt;
  std::error_code ec;
  if (named && fs::is_directory(fs::path(path) / step_dir_name(*named), ec))
    return ResolvedDir{(fs::path(path) / step_dir_name(*named)).string(), "", false};
  return resolve_checkpoint_dir(path);
}

}  // namespace

VerifyReport verify_checkpoint_parts(const std::vector<std::string>& paths, int threads) {
  if (paths.size() == 1) return verify_checkpoint(paths[0], threads);
  // Each host's part, checked against its own marker; then the parts as one
  // checkpoint, through a temporary directory of links to all their files.
  std::vector<fs::path> dirs;
  std::vector<std::string> problems, notes;
  int64_t step = -1;
  for (const std::string& path : paths) {
    const ResolvedDir resolved = resolve_part(path);
    if (!resolved.note.empty()) notes.push_back(resolved.note);
    const fs::path dir(resolved.path);
    const CompleteMarker marker = read_complete_marker(dir);
    if (!marker.problem.empty()) {
      problems.push_back(format("{}: {}", dir.string(), marker.problem));
      continue;
    }
    if (step < 0) step = marker.step;
    if (marker.step != step)
      problems.push_back(format("{} is step {}, {} is step {}: not parts of one checkpoint", paths[0], step,
                                dir.string(), marker.step));
    for (const MarkerFile& f : marker.files)
      if (std::string problem = marker_file_problem(dir, f); !problem.empty())
        problems.push_back(format("{}: {}", dir.string(), problem));
    dirs.push_back(dir);
  }
  VerifyReport report;
  if (!problems.empty() || dirs.empty()) {
    report.problems = std::move(problems);
    for (const std::string& path : paths) report.dir += (report.dir.empty() ? "" : " + ") + path;
    return report;
  }
  char pattern[] = "/tmp/ckpt-verify-XXXXXX";
  ST_CHECK(::mkdtemp(pattern) != nullptr, "cannot create a temporary directory: {}", errno_text());
  const fs::path whole = fs::path(pattern) / step_dir_name(step);
  std::error_code ec;
  fs::create_directory(whole, ec);
  std::map<std::string, fs::path> source;  // file name -> the part it is taken from
  for (const fs::path& dir : dirs)
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      const std::string name = e.path().filename().string();
      if (!source.emplace(name, e.path()).second || !is_plain_file_name(name)) continue;
      fs::create_symlink(fs::absolute(e.path()), whole / name, ec);
    }
  report = verify_checkpoint(whole.string(), threads);
  fs::remove_all(pattern, ec);
  std::string names;
  for (const fs::path& dir : dirs) names += (names.empty() ? "" : " + ") + dir.string();
  report.dir = names;
  report.note = notes.empty() ? "" : notes[0];
  // Messages name the part a file came from, not the temporary directory.
  for (std::string& problem : report.problems)
    for (const auto& [name, from] : source)
      for (size_t at; (at = problem.find((whole / name).string())) != std::string::npos;)
        problem.replace(at, (whole / name).string().size(), from.string());
  return report;
}

}  // namespace st::checkpoint
