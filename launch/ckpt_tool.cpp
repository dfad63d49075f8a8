#include "launch/ckpt_tool.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <nlohmann/json.hpp>
#include <stdio.h>
#include <unistd.h>

#include "checkpoint/checksum.h"
#include "checkpoint/commit.h"
#include "checkpoint/fs.h"
#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "models/hf_config.h"

namespace st::launch {

namespace fs = std::filesystem;
using checkpoint::Catalog;
using checkpoint::ChunkRecord;
using checkpoint::Layout;
using checkpoint::StoredTensor;

namespace {

constexpr std::string_view kTrainerStateName = checkpoint::trainer_state_file_name;

std::string hex8(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%08x", v);
  return buf;
}

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
  if (kind == checkpoint::kModelKind) return 0;
  if (kind == checkpoint::kMasterKind) return 1;
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

int64_t stored_bytes(const StoredTensor& t) {
  int64_t n = 0;
  for (const ChunkRecord& c : t.chunks) n += c.numel;
  return n * static_cast<int64_t>(dtype_size(t.dtype));
}

/// Files of the layouts (data and indexes) and the marker: what convert rewrites
/// rather than copies.
bool is_layout_file(const std::string& name) {
  return name == checkpoint::complete_marker_name || name.ends_with(".safetensors") || name.ends_with(".index.json");
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

/// A directory that is removed with its contents unless keep() was called.
class TempDir {
 public:
  explicit TempDir(fs::path path) : path_(std::move(path)) {
    std::error_code ec;
    fs::remove_all(path_, ec);  // same name means same pid: debris of an earlier process
    ST_CHECK(fs::create_directory(path_, ec) && !ec, "cannot create {}: {}", path_.string(), ec.message());
  }
  ~TempDir() {
    if (kept_) return;
    std::error_code ec;  // never throws; a leftover hidden directory is harmless
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  void keep() { kept_ = true; }

 private:
  fs::path path_;
  bool kept_ = false;
};

DType model_dtype_of(const std::optional<checkpoint::TrainerState>& state, const std::string& dir) {
  if (!state || state->model_dtype.empty()) return DType::F32;
  std::optional<DType> dtype = dtype_from_name(state->model_dtype);
  ST_CHECK(dtype && *dtype != DType::I32, "{}/{}: model_dtype '{}' is not F32 or BF16", dir, kTrainerStateName,
           state->model_dtype);
  return *dtype;
}

nlohmann::ordered_json read_json_object(const fs::path& path) {
  std::ifstream in(path);
  ST_CHECK(in.good(), "cannot read {}", path.string());
  nlohmann::ordered_json json;
  try {
    in >> json;
  } catch (const nlohmann::json::exception& e) {
    ST_FAIL("{} is not valid JSON: {}", path.string(), e.what());
  }
  ST_CHECK(json.is_object(), "{} is not a JSON object", path.string());
  return json;
}

// ---- verify ------------------------------------------------------------------

/// What checking the chunks of one data file found.
struct FileCheck {
  std::vector<std::string> problems;
  int64_t chunks = 0;
  int64_t bytes = 0;
};

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

FileCheck check_file(const fs::path& dir, const std::string& name, const std::vector<ChunkRef>& chunks) {
  FileCheck out;
  const fs::path path = dir / name;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    out.problems.push_back(
        format("{}: missing; it should hold {} chunk(s), e.g. {}", name, chunks.size(), chunk_label(chunks.front())));
    return out;
  }
  std::optional<checkpoint::SafetensorsFile> file;
  try {
    file.emplace(path.string());
  } catch (const Error& e) {
    out.problems.push_back(format("{} ({} chunk(s) in it not checked)", e.message(), chunks.size()));
    return out;
  }
  constexpr uint64_t kBlock = uint64_t{4} << 20;
  std::vector<std::byte> buffer;
  for (const ChunkRef& ref : chunks) {
    const ChunkRecord& c = *ref.chunk;
    const std::string label = chunk_label(ref);
    if (!file->has(c.key)) {
      out.problems.push_back(format("{}: {} is missing (no key '{}')", name, label, c.key));
      continue;
    }
    const checkpoint::TensorInfo& info = file->info(c.key);
    const uint64_t want_bytes = static_cast<uint64_t>(c.numel) * dtype_size(ref.tensor->dtype);
    if (info.dtype != ref.tensor->dtype || info.nbytes != want_bytes) {
      out.problems.push_back(format("{}: {} is stored as {} {} bytes, the index says {} {} bytes", name, label,
                                    dtype_name(info.dtype), info.nbytes, dtype_name(ref.tensor->dtype), want_bytes));
      continue;
    }
    uint32_t crc = 0;
    checkpoint::NonFinite bad;
    try {
      const uint64_t esize = dtype_size(info.dtype);
      for (uint64_t at = 0; at < info.nbytes; at += kBlock) {
        const uint64_t n = std::min(kBlock, info.nbytes - at);
        buffer.resize(n);
        file->read(c.key, at, n, buffer.data());
        const std::span<const std::byte> block(buffer.data(), n);
        crc = checkpoint::crc32c(block, crc);
        const checkpoint::NonFinite part =
            checkpoint::count_nonfinite(block, info.dtype, c.begin + static_cast<int64_t>(at / esize));
        if (!bad.any()) bad.first = part.first;
        bad.nan += part.nan;
        bad.inf += part.inf;
      }
    } catch (const Error& e) {
      out.problems.push_back(format("{}: {} cannot be read: {}", name, label, e.message()));
      continue;
    }
    ++out.chunks;
    out.bytes += static_cast<int64_t>(info.nbytes);
    if (ref.tensor->checksummed && crc != c.crc32c)
      out.problems.push_back(
          format("{}: {} fails its checksum (crc32c {}, the index says {})", name, label, hex8(crc), hex8(c.crc32c)));
    // Training state is never saved non-finite; a value that is would make a resumed run fail at once.
    if (bad.any())
      out.problems.push_back(format("{}: {} holds non-finite values: {} NaN and {} Inf, the first at element {}", name,
                                    label, bad.nan, bad.inf, bad.first));
  }
  return out;
}

/// For a unified checkpoint whose catalog cannot be read: checks every key of
/// every index (model, master_weights, optimizer) in the data files that open,
/// taking dtype and shape from the file's own header. A file that does not
/// open is reported unless one of the `known` problems already names it.
FileCheck check_unified_indexes(const fs::path& dir, const std::vector<std::string>& known) {
  auto is_known = [&](const std::string& file_name) {
    return std::any_of(known.begin(), known.end(),
                       [&](const std::string& p) { return p.find(file_name) != std::string::npos; });
  };
  const std::pair<std::string_view, std::string_view> families[] = {{checkpoint::kModelIndexName, "model"},
                                                                    {checkpoint::kMasterIndexName, "master"},
                                                                    {checkpoint::kOptimizerIndexName, ""}};
  FileCheck out;
  std::deque<StoredTensor> tensors;  // stable addresses for the ChunkRefs
  for (const auto& [index_name, kind] : families) {
    const fs::path index_path = dir / index_name;
    std::error_code ec;
    if (!fs::exists(index_path, ec)) continue;
    nlohmann::ordered_json index;
    try {
      index = read_json_object(index_path);
    } catch (const Error& e) {
      if (!is_known(std::string(index_name))) out.problems.push_back(e.message());
      continue;
    }
    if (!index.contains("weight_map") || !index["weight_map"].is_object()) continue;
    const nlohmann::ordered_json crcs = index.value("crc32c", nlohmann::ordered_json::object());
    std::map<std::string, std::vector<std::string>> keys_by_file;
    for (const auto& [key, file] : index["weight_map"].items())
      if (file.is_string()) keys_by_file[file.get<std::string>()].push_back(key);
    for (const auto& [file_name, keys] : keys_by_file) {
      std::vector<ChunkRef> refs;
      std::deque<ChunkRecord> records;
      try {
        const checkpoint::SafetensorsFile file((dir / file_name).string());
        for (const std::string& key : keys) {
          if (!file.has(key)) {
            out.problems.push_back(format("{}: tensor '{}' is missing ({} lists it)", file_name, key, index_name));
            continue;
          }
          const checkpoint::TensorInfo& info = file.info(key);
          const size_t dot = key.rfind('.');
          const bool optimizer = kind.empty() && dot != std::string::npos;
          StoredTensor& t = tensors.emplace_back();
          t.shape = info.shape;
          t.dtype = info.dtype;
          t.checksummed = crcs.contains(key);
          ChunkRecord& c = records.emplace_back();
          c.fqn = optimizer ? key.substr(0, dot) : key;
          c.kind = optimizer ? key.substr(dot + 1) : std::string(kind);
          c.numel = shape_numel(info.shape);
          c.file = file_name;
          c.key = key;
          c.crc32c = t.checksummed ? crcs[key].get<uint32_t>() : 0;
          refs.push_back({&c, &t});
        }
      } catch (const Error& e) {
        if (!is_known(file_name)) out.problems.push_back(e.message());
        continue;
      } catch (const nlohmann::json::exception& e) {
        out.problems.push_back(format("{}: crc32c of a tensor is not a number: {}", index_name, e.what()));
        continue;
      }
      if (refs.empty()) continue;
      FileCheck checked = check_file(dir, file_name, refs);
      out.chunks += checked.chunks;
      out.bytes += checked.bytes;
      for (std::string& p : checked.problems) out.problems.push_back(std::move(p));
    }
  }
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

}  // namespace

// ---- command line ---------------------------------------------------------------

CkptArgs parse_ckpt_args(const std::vector<std::string>& argv) {
  CkptArgs args;
  if (argv.empty() || argv[0] == "--help" || argv[0] == "-h" || argv[0] == "help") {
    args.help = true;
    return args;
  }
  const std::string& command = argv[0];
  if (command == "inspect") {
    args.command = CkptCommand::Inspect;
  } else if (command == "verify") {
    args.command = CkptCommand::Verify;
  } else if (command == "convert") {
    args.command = CkptCommand::Convert;
  } else {
    ST_FAIL("unknown command '{}': expected inspect, verify or convert (see --help)", command);
  }
  std::vector<std::string> positional;
  bool have_to = false;
  for (size_t i = 1; i < argv.size(); ++i) {
    std::string flag = argv[i];
    std::string value;
    bool inline_value = false;
    if (auto eq = flag.find('='); flag.starts_with("--") && eq != std::string::npos) {
      value = flag.substr(eq + 1);
      flag = flag.substr(0, eq);
      inline_value = true;
    }
    auto take_value = [&]() -> std::string {
      if (inline_value) return value;
      ST_CHECK(i + 1 < argv.size(), "{} needs a value (see --help)", flag);
      return argv[++i];
    };
    if (flag == "--help" || flag == "-h") {
      args.help = true;
    } else if (flag == "--json" && args.command == CkptCommand::Inspect) {
      args.json = true;
    } else if (flag == "--to" && args.command == CkptCommand::Convert) {
      std::string to = take_value();
      const std::optional<Layout> layout = checkpoint::parse_layout(to);
      ST_CHECK(layout.has_value(), "--to {}: expected unified or sharded", to);
      args.to = *layout;
      have_to = true;
    } else if (flag == "--threads" && args.command == CkptCommand::Verify) {
      std::string n = take_value();
      ST_CHECK(!n.empty() && n.size() < 4 && std::all_of(n.begin(), n.end(), is_digit) && std::stoi(n) > 0,
               "--threads {}: expected a positive integer", n);
      args.threads = std::stoi(n);
    } else if (flag.starts_with("-") && flag != "-") {
      ST_FAIL("unknown argument '{}' for ckpt {} (see --help)", argv[i], command);
    } else {
      positional.push_back(argv[i]);
    }
  }
  if (args.help) return args;
  if (args.command == CkptCommand::Convert) {
    ST_CHECK(have_to, "ckpt convert needs --to unified|sharded");
    ST_CHECK(positional.size() == 2, "ckpt convert needs DIR and OUT: ckpt convert DIR --to unified|sharded OUT");
    args.dir = positional[0];
    args.out = positional[1];
  } else {
    ST_CHECK(positional.size() == 1, "ckpt {} needs exactly one checkpoint directory, got {}", command,
             positional.size());
    args.dir = positional[0];
  }
  return args;
}

std::string ckpt_usage() {
  return "usage: ckpt inspect DIR [--json]\n"
         "       ckpt verify DIR [--threads N]\n"
         "       ckpt convert DIR --to unified|sharded OUT\n"
         "       scripts/launch -np K ckpt convert DIR --to unified|sharded OUT\n\n"
         "  DIR is a checkpoint directory (root/step-NNNNNN) or a checkpoint root (then the checkpoint\n"
         "  `trainer --resume auto` would load: the one `latest` names, or the newest complete one).\n\n"
         "  inspect     format, step, world size at save, and every tensor's kind, shape, dtype and bytes\n"
         "    --json    the same as one JSON object\n"
         "  verify      every file the COMPLETE marker lists is present with its size, the index covers\n"
         "              every tensor, and every stored chunk matches its CRC32C; exit 1 naming each problem\n"
         "    --threads N  files checked at once (default 4)\n"
         "  convert     rewrite the checkpoint in the other layout into OUT (which must not exist), with\n"
         "              any number of processes; OUT is complete (COMPLETE marker) or absent\n";
}

// ---- shared -----------------------------------------------------------------------

// ---- inspect ----------------------------------------------------------------------

Inspection inspect_checkpoint(const std::string& path) {
  Inspection out;
  ResolvedDir resolved = resolve_checkpoint_dir(path);
  out.dir = resolved.path;
  out.note = resolved.note;
  out.catalog = checkpoint::read_catalog(out.dir);
  out.state = checkpoint::read_trainer_state_if_present(out.dir);
  checkpoint::CompleteMarker marker = checkpoint::read_complete_marker(out.dir);
  out.marker_step = marker.step;
  out.incomplete = marker.problem.empty() ? checkpoint::incomplete_reason(out.dir, marker.step) : marker.problem;
  out.files = list_files(out.dir);
  return out;
}

std::string inspection_text(const Inspection& in) {
  const Catalog& cat = in.catalog;
  std::ostringstream os;
  // A plain Hugging Face folder has no COMPLETE marker by nature: it is a model
  // directory (loadable by init_from), not a checkpoint that failed to finish.
  const bool hf = cat.format == "huggingface";
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
  os << "  tensors      " << cat.tensors.size() << ", " << human_bytes(cat.total_bytes()) << " of data; "
     << in.files.size() << " files, " << human_bytes(file_bytes) << "\n\n";

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
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const size_t pad = width[c] - row[c].size();
      // Numbers right-aligned, text left-aligned.
      if (c >= 4)
        line += std::string(pad, ' ') + row[c];
      else
        line += row[c] + std::string(pad, ' ');
      if (c + 1 < row.size()) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    os << line << "\n";
  }
  return os.str();
}

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
  auto problem = [&](std::string text) { report.problems.push_back(std::move(text)); };

  // The marker: every file it lists, present with its size.
  checkpoint::CompleteMarker marker = checkpoint::read_complete_marker(dir);
  std::set<std::string> listed;
  const bool no_marker = !fs::exists(dir / checkpoint::complete_marker_name);
  if (!marker.problem.empty()) {
    if (!no_marker) problem(format("{}: {}", checkpoint::complete_marker_name, marker.problem));
  } else {
    for (const checkpoint::MarkerFile& f : marker.files) {
      listed.insert(f.name);
      std::error_code ec;
      const uintmax_t size = fs::file_size(dir / f.name, ec);
      if (ec)
        problem(format("{}: missing ({}; COMPLETE lists {} bytes)", f.name, ec.message(), f.size));
      else if (size != f.size)
        problem(format("{}: {} bytes, COMPLETE lists {}", f.name, size, f.size));
    }
    if (auto named = checkpoint::parse_step_dir_name(dir.filename().string()); named && *named != marker.step)
      problem(format("{}: COMPLETE is for step {}", dir.filename().string(), marker.step));
  }
  try {
    const std::optional<checkpoint::TrainerState> state = checkpoint::read_trainer_state_if_present(report.dir);
    if (state && marker.problem.empty() && state->step != marker.step)
      problem(format("{}: step {}, but COMPLETE is for step {}", kTrainerStateName, state->step, marker.step));
  } catch (const Error& e) {
    problem(e.message());
  }

  Catalog catalog;
  try {
    catalog = checkpoint::read_catalog(report.dir);
  } catch (const Error& e) {
    problem(e.message());
    if (no_marker) problem("missing COMPLETE marker");
    // A unified catalog needs every data file's header; the indexes alone
    // still say what the files that do open must hold.
    FileCheck rest = check_unified_indexes(dir, report.problems);
    report.chunks += rest.chunks;
    report.bytes += rest.bytes;
    for (std::string& p : rest.problems) problem(std::move(p));
    return report;
  }
  report.tensors = static_cast<int64_t>(catalog.tensors.size());
  // A plain Hugging Face directory has no marker (nor checksums) to check.
  if (no_marker && catalog.format != "huggingface") problem("missing COMPLETE marker");

  std::map<std::string, std::vector<ChunkRef>> by_file;
  for (const TensorRef& ref : display_order(catalog)) {
    const StoredTensor& t = ref->second;
    if (std::string gap = coverage_gap(t); !gap.empty())
      problem(format("tensor {} ({}): elements {} are in no stored chunk", ref->first.first, ref->first.second, gap));
    for (const ChunkRecord& c : t.chunks) by_file[c.file].push_back({&c, &t});
  }
  if (marker.problem.empty()) {
    for (const auto& [file, chunks] : by_file)
      if (!listed.count(file)) problem(format("{}: holds tensors but COMPLETE does not list it", file));
  }

  // Files are checked in parallel, each by one thread; results are reported in name order.
  std::vector<std::pair<std::string, std::vector<ChunkRef>>> files(by_file.begin(), by_file.end());
  std::vector<FileCheck> checks(files.size());
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < files.size(); i = next++) checks[i] = check_file(dir, files[i].first, files[i].second);
  };
  const size_t n_threads = std::min<size_t>(static_cast<size_t>(std::max(threads, 1)), files.size());
  std::vector<std::thread> pool;
  for (size_t t = 1; t < n_threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (FileCheck& check : checks) {
    report.chunks += check.chunks;
    report.bytes += check.bytes;
    for (std::string& p : check.problems) problem(std::move(p));
  }
  report.files = static_cast<int64_t>(files.size());
  return report;
}

// ---- convert -----------------------------------------------------------------------

std::string convert_checkpoint(const std::string& path, Layout to, const std::string& out, ProcessGroup& group) {
  const int rank = group.rank();
  const int world = group.size();

  ResolvedDir src;
  Catalog catalog;
  std::optional<checkpoint::TrainerState> state;
  int64_t step = 0;
  fs::path out_path;
  run_on_every_rank(group, [&] {
    src = resolve_checkpoint_dir(path);
    std::string trimmed = out;
    while (trimmed.size() > 1 && trimmed.back() == '/') trimmed.pop_back();
    ST_CHECK(!trimmed.empty(), "ckpt convert: OUT is empty");
    out_path = fs::absolute(trimmed).lexically_normal();
    std::error_code ec;
    ST_CHECK(!fs::exists(out_path, ec), "{} already exists; ckpt convert writes a new directory", out);
    catalog = checkpoint::read_catalog(src.path);
    state = checkpoint::read_trainer_state_if_present(src.path);
    checkpoint::CompleteMarker marker = checkpoint::read_complete_marker(src.path);
    if (catalog.format != "huggingface") {
      std::string reason =
          marker.problem.empty() ? checkpoint::incomplete_reason(src.path, marker.step) : marker.problem;
      ST_CHECK(reason.empty(), "{} is not a complete checkpoint ({}); see ckpt verify", src.path, reason);
    }
    step = state ? state->step : std::max<int64_t>(marker.step, 0);
  });
  const DType model_dtype = model_dtype_of(state, src.path);  // same answer on every rank

  // This rank's contiguous share of every stored tensor. The model-* weights
  // are derived from "master" on save, so they are read only when no master
  // copy is stored (an F32 unified checkpoint, or a Hugging Face directory).
  const bool has_master = catalog.has_kind(checkpoint::kMasterKind);
  std::vector<StateEntry> entries;
  int64_t tensors = 0;
  for (const auto& [key, t] : catalog.tensors) {
    std::string kind = key.second;
    if (kind == checkpoint::kModelKind) {
      if (has_master) continue;
      kind = checkpoint::kMasterKind;
    }
    ++tensors;
    const DType dtype = kind == checkpoint::kMasterKind ? DType::F32 : t.dtype;
    const int64_t numel = shape_numel(t.shape);
    const int64_t begin = numel * rank / world;
    const int64_t end = numel * (rank + 1) / world;
    if (end == begin) continue;
    entries.push_back({key.first, kind, t.shape, dtype, begin, Tensor::empty({end - begin}, dtype)});
  }
  run_on_every_rank(group, [&] {
    checkpoint::LoadOptions options;
    options.verify = true;
    options.verify_rank = rank;  // together the ranks check every chunk once
    options.verify_world = world;
    options.master_from_model = !has_master;
    checkpoint::load_entries(catalog, entries, options);
  });

  // Written into a hidden sibling of OUT, renamed into place only when complete.
  std::optional<TempDir> tmp;
  std::string tmp_name;
  run_on_every_rank(group, [&] {
    if (rank != 0) return;
    std::error_code ec;
    fs::create_directories(out_path.parent_path(), ec);
    ST_CHECK(!ec, "cannot create {}: {}", out_path.parent_path().string(), ec.message());
    tmp.emplace(out_path.parent_path() / format(".{}.tmp-{}", out_path.filename().string(), ::getpid()));
    tmp_name = tmp->path().string();
  });
  tmp_name = broadcast_string(group, tmp_name);

  checkpoint::SaveOptions options;
  options.layout = to;
  options.model_weights = true;
  options.master_weights = checkpoint::unified_needs_master_files(options.model_weights, model_dtype);
  options.model_dtype = model_dtype;
  std::vector<std::string> written;
  run_on_every_rank(group, [&] { written = checkpoint::save(tmp_name, entries, options, group); });

  run_on_every_rank(group, [&] {
    if (rank != 0) return;
    for (const DirFile& f : list_files(src.path)) {
      if (is_layout_file(f.name) || f.name.starts_with(".")) continue;
      const fs::path from = fs::path(src.path) / f.name;
      const fs::path dest = tmp->path() / f.name;
      if (f.name == kTrainerStateName && state) {
        // What the output holds, in the trainer's terms.
        checkpoint::TrainerState converted = *state;
        converted.format = checkpoint::layout_name(to);
        converted.model_weights = to == Layout::Unified;
        converted.master_weights = to == Layout::Sharded || options.master_weights;
        checkpoint::write_file_synced(dest, checkpoint::trainer_state_text(converted));
      } else if (f.name == models::kHfConfigName) {
        // Hugging Face tools load the model-* weights in torch_dtype.
        const std::string text = models::hf_config_with_torch_dtype(
            read_json_object(from).dump(), models::hf_torch_dtype(to == Layout::Unified ? model_dtype : DType::F32),
            from.string());
        checkpoint::write_file_synced(dest, text);
      } else {
        std::error_code ec;
        fs::copy_file(from, dest, ec);
        ST_CHECK(!ec, "cannot copy {} to {}: {}", from.string(), dest.string(), ec.message());
      }
      written.push_back(f.name);
    }
    checkpoint::write_complete_marker(tmp->path(), step, written);
    checkpoint::rename_no_replace(tmp->path(), out_path);
    tmp->keep();
    checkpoint::fsync_path(out_path.parent_path(), checkpoint::PathKind::Directory);
  });
  if (rank != 0) return "";
  return format("converted {} ({}, {} process(es)) to {} ({}) with {} process(es): {} tensors, {}", src.path,
                catalog.format, catalog.world_size, out_path.string(), checkpoint::layout_name(to), world, tensors,
                human_bytes(catalog.total_bytes()));
}

}  // namespace st::launch
