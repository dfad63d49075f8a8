// ckpt_bench: checkpoint save/load bandwidth beside the disk's own.
//
//   scripts/launch -np 4 build/ckpt_bench --bytes 2e9 --dir /path/on/the/disk
//
// Builds a synthetic LLaMA-like training state of about --bytes (F32 master
// weights, exp_avg, exp_avg_sq), held by each rank as an FSDP-like flat shard
// per wrapped unit, so tensors split at rank boundaries. In every repeat it
// measures, between barriers, over all ranks together:
//   raw write+fsync  each rank write()s its share to its own file and fsyncs it
//   raw read         each rank read()s its file back
//   save             checkpoint::save in each layout, start to every rank durable
//   load             read_catalog + load_entries into the saving partition
//   load resharded   the same into a different partition: the whole model as one
//                    flat buffer (no per-layer units), ranks in reverse order
// and prints the medians. Before every read the page cache of the files read
// is dropped (posix_fadvise DONTNEED after fsync), so raw and checkpoint reads
// run under the same conditions; the output says how much stayed resident.
// Every load is checked element by element against the values saved: a
// benchmark that loads wrong data fails, loudly.
#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/cli.h"
#include "core/comm.h"
#include "core/error.h"
#include "core/file.h"
#include "core/format.h"
#include "core/hash.h"
#include "core/state.h"
#include "core/tensor.h"

namespace st::bench {
namespace {

namespace fs = std::filesystem;
using checkpoint::Layout;
using checkpoint::layout_name;
using Clock = std::chrono::steady_clock;

// --- command line -----------------------------------------------------------------

enum class ModelWeights : uint8_t { None, F32, BF16 };

struct Args {
  double bytes = 2e9;  // state size: F32 master + exp_avg + exp_avg_sq, all ranks together
  std::string dir;     // where the files go; the disk being measured
  int repeats = 3;
  bool verify = true;    // LoadOptions::verify (CRC32C of every chunk)
  int threads = 4;       // LoadOptions::threads
  int save_threads = 2;  // SaveOptions::threads
  std::vector<Layout> layouts{Layout::Unified, Layout::Sharded};
  ModelWeights unified_model = ModelWeights::None;  // extra model-* files of the unified layout
  bool keep = false;                                // leave the files behind
  double settle = 2;                                // seconds of quiet before each measurement
  bool snapshot = false;   // SaveOptions::snapshot: copy to host buffers first, as an async save does
  std::string drop_cache;  // --drop-cache DIR: only drop the page cache of DIR's files
};

// "unified,sharded", "sharded", or "none" (the disk's own figures only).
std::vector<Layout> parse_layouts(const std::string& list) {
  std::vector<Layout> out;
  if (list == "none") return out;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    const std::string name = list.substr(start, comma - start);
    const std::optional<Layout> layout = checkpoint::parse_layout(name);
    ST_USAGE_CHECK(layout.has_value(), "--layouts: unknown layout '{}' (unified, sharded)", name);
    out.push_back(*layout);
    start = comma + 1;
  }
  return out;
}

// A positive finite number ("2e9"); --repeats and the thread counts take its integer part.
double positive_number(const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  ST_USAGE_CHECK(used == text.size() && std::isfinite(v) && v > 0, "{} must be a positive number, got '{}'", flag,
                 text);
  return v;
}

// "on" or "off" for `flag`.
bool on_off(const std::string& flag, const std::string& v) {
  ST_USAGE_CHECK(v == "on" || v == "off", "{} must be on or off, got '{}'", flag, v);
  return v == "on";
}

/// The flags, writing into `a`.
cli::Parser args_parser(Args& a) {
  cli::Parser p("ckpt_bench",
                "ckpt_bench --dir DIR [--bytes N] [--repeats N] [--verify on|off] [--threads N] [--save-threads N]\n"
                "                  [--layouts unified,sharded] [--unified-model none|f32|bf16] [--snapshot on|off]\n"
                "                  [--settle S] [--keep]\n"
                "       ckpt_bench --drop-cache DIR");
  auto count = [](const char* flag, int* out) {
    return [=](const std::string& v) { *out = static_cast<int>(positive_number(flag, v)); };
  };
  auto unified_model = [&a](const std::string& v) {
    ST_USAGE_CHECK(v == "none" || v == "f32" || v == "bf16", "--unified-model must be none, f32 or bf16, got '{}'", v);
    a.unified_model = v == "none" ? ModelWeights::None : v == "f32" ? ModelWeights::F32 : ModelWeights::BF16;
  };
  p.option("--dir", "DIR", &a.dir,
           "directory on the disk to measure (a subdirectory ckpt_bench-w<world> is made there)")
      .option(
          "--bytes", "N", [&a](const std::string& v) { a.bytes = positive_number("--bytes", v); },
          "state size in bytes over all ranks, e.g. 2e9 (default 2e9)")
      .option("--repeats", "N", count("--repeats", &a.repeats),
              "measurements per figure; the median is printed (default 3)")
      .option(
          "--verify", "on|off", [&a](const std::string& v) { a.verify = on_off("--verify", v); },
          "CRC32C check of every chunk while loading (default on)")
      .option("--threads", "N", count("--threads", &a.threads),
              "reader threads per rank (LoadOptions::threads, default 4)")
      .option("--save-threads", "N", count("--save-threads", &a.save_threads),
              "writer threads per rank (SaveOptions::threads, default 2)")
      .option(
          "--layouts", "L", [&a](const std::string& v) { a.layouts = parse_layouts(v); },
          "comma-separated, from unified and sharded (default both); none measures only\n"
          "the disk (raw write, raw read) and a host copy of the state")
      .option("--unified-model", "W", unified_model,
              "also write model-* files in the unified layout as f32 or bf16 (default none:\n"
              "master weights and optimizer state only, so both layouts write the same bytes)")
      .option(
          "--snapshot", "on|off", [&a](const std::string& v) { a.snapshot = on_off("--snapshot", v); },
          "stage the data into the saver's own buffers first, as an async save does\n"
          "(default off, as the trainer's synchronous save)")
      .option(
          "--settle", "S", [&a](const std::string& v) { a.settle = v == "0" ? 0.0 : positive_number("--settle", v); },
          "sync, then S seconds of quiet before each measurement (default 2)")
      .flag("--keep", &a.keep, "do not delete the files at the end")
      .option("--drop-cache", "DIR", &a.drop_cache, "drop the page cache of every file under DIR, then exit");
  return p;
}

// --- the synthetic state ----------------------------------------------------------

// LLaMA proportions: GQA with a quarter of the heads for k/v, SwiGLU width 8/3 d,
// vocabulary 8 d. Only d and the layer count follow from the requested size.
struct ModelShape {
  int64_t d = 0, kv = 0, ffn = 0, vocab = 0, layers = 0;
};

struct TensorSpec {
  std::string fqn;
  Shape shape;
  int unit = 0;  // FSDP unit: 0 holds embed/norm/lm_head (the root), 1 + i is layer i
};

constexpr std::array<std::string_view, 3> kKinds{"master", "exp_avg", "exp_avg_sq"};

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

ModelShape shape_for_bytes(double bytes) {
  const double elems = bytes / (4.0 * static_cast<double>(kKinds.size()));  // per kind
  ModelShape m;
  // About 100 d^2 parameters for 8 layers plus the two vocabulary matrices.
  m.d = std::max<int64_t>(64, round_up(static_cast<int64_t>(std::sqrt(elems / 100.0)), 64));
  m.kv = m.d / 4;
  m.ffn = round_up(m.d * 8 / 3, 64);
  m.vocab = 8 * m.d;
  const int64_t per_layer = 2 * m.d * m.d + 2 * m.kv * m.d + 3 * m.ffn * m.d + 2 * m.d;
  const int64_t rest = 2 * m.vocab * m.d + m.d;
  m.layers = std::max<int64_t>(1, std::llround((elems - static_cast<double>(rest)) / static_cast<double>(per_layer)));
  return m;
}

std::vector<TensorSpec> llama_tensors(const ModelShape& m) {
  std::vector<TensorSpec> t;
  t.push_back({"model.embed_tokens.weight", {m.vocab, m.d}, 0});
  for (int64_t i = 0; i < m.layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const int unit = static_cast<int>(i) + 1;
    t.push_back({p + "input_layernorm.weight", {m.d}, unit});
    t.push_back({p + "self_attn.q_proj.weight", {m.d, m.d}, unit});
    t.push_back({p + "self_attn.k_proj.weight", {m.kv, m.d}, unit});
    t.push_back({p + "self_attn.v_proj.weight", {m.kv, m.d}, unit});
    t.push_back({p + "self_attn.o_proj.weight", {m.d, m.d}, unit});
    t.push_back({p + "post_attention_layernorm.weight", {m.d}, unit});
    t.push_back({p + "mlp.gate_proj.weight", {m.ffn, m.d}, unit});
    t.push_back({p + "mlp.up_proj.weight", {m.ffn, m.d}, unit});
    t.push_back({p + "mlp.down_proj.weight", {m.d, m.ffn}, unit});
  }
  t.push_back({"model.norm.weight", {m.d}, 0});
  t.push_back({"lm_head.weight", {m.vocab, m.d}, 0});
  return t;
}

// The saved value of element i of tensor t, kind k: pseudo-random (nothing
// compresses or repeats), with each kind's typical magnitude. Scaling by a power
// of two keeps every value exact, so loads are compared bit for bit.
float value_of(size_t t, size_t k, int64_t i) {
  const uint64_t h = splitmix64((static_cast<uint64_t>(t * kKinds.size() + k) << 40) ^ static_cast<uint64_t>(i));
  const float u = static_cast<float>(static_cast<int64_t>(h >> 40) - (int64_t{1} << 23)) * 0x1p-23f;  // [-1, 1)
  if (k == 0) return u * 0x1p-4f;                                                                     // master weights
  if (k == 1) return u * 0x1p-10f;                                                                    // first moment
  return std::fabs(u) * 0x1p-20f;  // second moment, non-negative
}

// Elements [begin, begin + numel) of one tensor, as one rank holds them.
struct Range {
  int64_t begin = 0, numel = 0;
};

// FULL_SHARD with one unit per decoder layer plus the root: each unit's
// parameters are flattened in order and split into ceil(n / world) elements per
// rank (the last ranks short), so a rank holds one range of every tensor.
std::vector<Range> fsdp_partition(const std::vector<TensorSpec>& specs, int rank, int world) {
  std::map<int, int64_t> unit_numel;
  for (const TensorSpec& s : specs) unit_numel[s.unit] += shape_numel(s.shape);
  std::map<int, int64_t> offset;  // of the next tensor within its unit
  std::vector<Range> out;
  for (const TensorSpec& s : specs) {
    const int64_t n = shape_numel(s.shape);
    const int64_t total = unit_numel[s.unit];
    const int64_t per = (total + world - 1) / world;
    const int64_t lo = std::min(total, per * rank), hi = std::min(total, per * (rank + 1));
    const int64_t o = offset[s.unit];
    const int64_t b = std::clamp(lo - o, int64_t{0}, n), e = std::clamp(hi - o, int64_t{0}, n);
    out.push_back({b, e - b});
    offset[s.unit] += n;
  }
  return out;
}

// A different sharding of the same tensors: the whole model as one flat buffer
// (no per-layer units), split at floor(n * p / world), rank r at position
// world - 1 - r. Every boundary moves, so every rank reads from other ranks'
// chunks and files.
std::vector<Range> resharded_partition(const std::vector<TensorSpec>& specs, int rank, int world) {
  int64_t total = 0;
  for (const TensorSpec& s : specs) total += shape_numel(s.shape);
  const int p = world - 1 - rank;
  const int64_t lo = total / world * p + total % world * p / world;
  const int64_t hi = total / world * (p + 1) + total % world * (p + 1) / world;
  std::vector<Range> out;
  int64_t o = 0;
  for (const TensorSpec& s : specs) {
    const int64_t n = shape_numel(s.shape);
    const int64_t b = std::clamp(lo - o, int64_t{0}, n), e = std::clamp(hi - o, int64_t{0}, n);
    out.push_back({b, e - b});
    o += n;
  }
  return out;
}

// One rank's state: per kind one flat F32 buffer (as FSDP's flat shard and the
// optimizer state over it), and one entry per (tensor, kind) viewing into it.
struct LocalState {
  std::vector<Tensor> flats;        // one per kind
  std::vector<StateEntry> entries;  // kind-major: entries[k * specs + t]
};

LocalState make_state(const std::vector<TensorSpec>& specs, const std::vector<Range>& ranges) {
  int64_t numel = 0;
  for (const Range& r : ranges) numel += r.numel;
  LocalState s;
  for (size_t k = 0; k < kKinds.size(); ++k) {
    s.flats.push_back(Tensor::empty({numel}, DType::F32));
    int64_t at = 0;
    for (size_t t = 0; t < specs.size(); ++t) {
      const Range& r = ranges[t];
      s.entries.push_back(StateEntry{specs[t].fqn, std::string(kKinds[k]), specs[t].shape, DType::F32, r.begin,
                                     s.flats[k].flat_slice(at, r.numel)});
      at += r.numel;
    }
  }
  return s;
}

void fill_values(LocalState& s, size_t num_specs) {
  for (size_t i = 0; i < s.entries.size(); ++i) {
    const StateEntry& e = s.entries[i];
    float* p = e.local.numel() > 0 ? e.local.data<float>() : nullptr;
    for (int64_t j = 0; j < e.local.numel(); ++j) p[j] = value_of(i % num_specs, i / num_specs, e.begin + j);
  }
}

// Every byte 0xFF (a NaN), so an element a load leaves alone cannot pass.
void poison(LocalState& s) {
  for (const Tensor& f : s.flats)
    if (f.nbytes() > 0) std::memset(f.raw_data(), 0xFF, f.nbytes());
}

// Throws naming the first element that differs from value_of, and how many do.
void check_values(const LocalState& s, size_t num_specs, const std::string& what, int rank) {
  int64_t wrong = 0;
  std::string first;
  for (size_t i = 0; i < s.entries.size(); ++i) {
    const StateEntry& e = s.entries[i];
    const float* p = e.local.numel() > 0 ? e.local.data<float>() : nullptr;
    for (int64_t j = 0; j < e.local.numel(); ++j) {
      const float want = value_of(i % num_specs, i / num_specs, e.begin + j);
      if (std::memcmp(&p[j], &want, sizeof want) == 0) continue;
      if (wrong++ == 0) first = format("{} kind {} element {}: got {} want {}", e.fqn, e.kind, e.begin + j, p[j], want);
    }
  }
  ST_CHECK(wrong == 0, "{}: rank {} holds {} wrong elements after loading; first: {}", what, rank, wrong, first);
}

// --- coordination ---------------------------------------------------------------

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Runs `step` on every rank and then agrees on the outcome: a failure on any
// rank throws on every rank (no rank is left waiting in a later collective).
// Returns this rank's wall seconds from the opening barrier to the agreement,
// which no rank passes before every rank finished `step`.
template <class F>
double run_everywhere(ProcessGroup& g, const std::string& what, F&& step) {
  g.barrier().wait();
  const Clock::time_point t0 = Clock::now();
  // Every rank learns of a failure on any rank (the lowest failing rank's message).
  run_on_every_rank(g, [&] {
    try {
      step();
    } catch (const std::exception& e) {
      ST_FAIL("{} failed: {}", what, e.what());
    }
  });
  return seconds_since(t0);
}

std::vector<double> max_over_ranks(ProcessGroup& g, const std::vector<double>& v) {
  std::vector<float> f(v.begin(), v.end());
  Tensor t = Tensor::from_vector(f, {static_cast<int64_t>(f.size())});
  g.all_reduce(t, {.op = ReduceOp::Max}).wait();
  std::vector<float> got = t.to_floats();
  return {got.begin(), got.end()};
}

// --- files -----------------------------------------------------------------------

void read_all(int fd, std::byte* p, size_t n, const std::string& path) {
  while (n > 0) {
    ssize_t got = ::read(fd, p, std::min<size_t>(n, size_t{1} << 26));
    if (got < 0 && errno == EINTR) continue;
    ST_CHECK(got > 0, "reading '{}' failed: {}", path, got < 0 ? errno_text() : "file is short");
    p += got;
    n -= static_cast<size_t>(got);
  }
}

// The physical limit for a save: the same bytes, one file per rank, written
// sequentially and made durable the same way (file and directory fsync).
void raw_write(const std::string& path, const LocalState& s) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  ST_CHECK(fd.valid(), "cannot create '{}': {}", path, errno_text());
  for (const Tensor& f : s.flats) write_all(fd.get(), f.raw_data(), f.nbytes(), format("'{}'", path));
  fsync_fd(fd.get(), format("'{}'", path));
  fd.close_checked(path);
  fsync_path(fs::path(path).parent_path(), PathKind::Directory);
}

void raw_read(const std::string& path, const LocalState& s) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ST_CHECK(fd.valid(), "cannot open '{}': {}", path, errno_text());
  for (const Tensor& f : s.flats) read_all(fd.get(), static_cast<std::byte*>(f.raw_data()), f.nbytes(), path);
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

// Asks the kernel to drop the file's clean cached pages (the files were
// fsynced, so every page is clean) so the next read comes from the device.
void drop_cache(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  ST_CHECK(fd.valid(), "cannot open '{}': {}", path, errno_text());
  int rc = ::posix_fadvise(fd.get(), 0, 0, POSIX_FADV_DONTNEED);
  ST_CHECK(rc == 0, "posix_fadvise(DONTNEED) of '{}' failed: {}", path, std::strerror(rc));
}

// Bytes of the files that sit in this machine's page cache (mincore).
struct Residency {
  int64_t resident = 0, total = 0;
};

Residency residency(const std::vector<std::string>& paths) {
  const int64_t page = ::sysconf(_SC_PAGESIZE);
  Residency r;
  for (const std::string& path : paths) {
    UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
    ST_CHECK(fd.valid(), "cannot open '{}': {}", path, errno_text());
    struct stat st {};
    ST_CHECK(::fstat(fd.get(), &st) == 0, "cannot stat '{}': {}", path, errno_text());
    const auto size = static_cast<size_t>(st.st_size);
    r.total += st.st_size;
    if (size == 0) continue;
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, fd.get(), 0);
    ST_CHECK(map != MAP_FAILED, "cannot mmap '{}': {}", path, errno_text());
    std::vector<unsigned char> pages((size + static_cast<size_t>(page) - 1) / static_cast<size_t>(page));
    const int rc = ::mincore(map, size, pages.data());
    const std::string err = rc == 0 ? "" : errno_text();
    ::munmap(map, size);
    ST_CHECK(rc == 0, "mincore of '{}' failed: {}", path, err);
    for (size_t i = 0; i < pages.size(); ++i)
      if (pages[i] & 1) r.resident += std::min<int64_t>(page, st.st_size - static_cast<int64_t>(i) * page);
  }
  return r;
}

int64_t bytes_on_disk(const std::string& dir) {
  int64_t b = 0;
  for (const std::string& f : files_in(dir)) b += static_cast<int64_t>(fs::file_size(f));
  return b;
}

// --- the machine -------------------------------------------------------------------

std::string first_line_with(const std::string& path, std::string_view prefix) {
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line))
    if (line.rfind(prefix, 0) == 0) return line;
  return "";
}

std::string after_colon(const std::string& line) {
  size_t c = line.find(':');
  if (c == std::string::npos) return "unknown";
  size_t b = line.find_first_not_of(" \t", c + 1);
  return b == std::string::npos ? "" : line.substr(b);
}

std::string fs_type_name(int64_t magic) {
  switch (magic) {
    case 0xEF53: return "ext2/3/4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x794C7630: return "overlayfs";
    case 0x6969: return "nfs";
    case 0x2FC12FC1: return "zfs";
    case 0x65735546: return "fuse";
    case 0xFF534D42: return "cifs";
    default: return format("unknown (magic {})", magic);
  }
}

// The /proc/mounts line of the mount that holds `dir`: longest mount point prefix.
std::string mount_of(const std::string& dir) {
  std::ifstream in("/proc/mounts");
  std::string dev, point, type, opts, best;
  size_t best_len = 0;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ls(line);
    ls >> dev >> point >> type >> opts;
    const bool prefix =
        dir.rfind(point, 0) == 0 && (point == "/" || dir.size() == point.size() || dir[point.size()] == '/');
    if (prefix && point.size() >= best_len) {
      best_len = point.size();
      best = format("{} on {} type {} ({})", dev, point, type, opts);
    }
  }
  return best.empty() ? "unknown" : best;
}

std::string describe_machine(const std::string& dir) {
  utsname u{};
  ::uname(&u);
  std::string mem = after_colon(first_line_with("/proc/meminfo", "MemTotal"));
  double gib = 0;
  try {
    gib = std::stod(mem) / (1024.0 * 1024.0);
  } catch (const std::exception&) {
  }
  struct statfs sfs {};
  std::string fs_line = "unknown";
  if (::statfs(dir.c_str(), &sfs) == 0) {
    const double avail = static_cast<double>(sfs.f_bavail) * static_cast<double>(sfs.f_bsize) / 1e9;
    fs_line = format("{}, {:.0f} GB free", fs_type_name(static_cast<int64_t>(sfs.f_type)), avail);
  }
  const std::string canonical = fs::weakly_canonical(dir).string();
  return format(
      "machine: {}\n"
      "cores:   {} online\n"
      "memory:  {:.1f} GiB\n"
      "kernel:  {} {}\n"
      "dir:     {} ({})\n"
      "mount:   {}\n",
      after_colon(first_line_with("/proc/cpuinfo", "model name")), ::sysconf(_SC_NPROCESSORS_ONLN), gib, u.sysname,
      u.release, canonical, fs_line, mount_of(canonical));
}

// --- measurements ------------------------------------------------------------------

struct Figure {
  std::string layout, op;
  int64_t bytes = 0;                        // state bytes moved (the GB/s numerator)
  std::vector<double> seconds;              // one per repeat
  std::vector<std::vector<double>> phases;  // per repeat, op-specific parts (max over ranks)
  double resident_max = 0;                  // fraction of the read files cached before a read
};

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

class Bench {
 public:
  Bench(const Args& args, ProcessGroup& g) : args_(args), g_(g), specs_(llama_tensors(shape_for_bytes(args.bytes))) {
    base_ = (fs::path(args.dir) / format("ckpt_bench-w{}", g.size())).string();
    saved_ = make_state(specs_, fsdp_partition(specs_, g.rank(), g.size()));
    resharded_ = make_state(specs_, resharded_partition(specs_, g.rank(), g.size()));
    run_everywhere(g_, "filling the state", [&] {
      fill_values(saved_, specs_.size());
      // Touch every page of the resharded load target now, so no load pays for first faults.
      poison(resharded_);
    });
    // Both partitions hold every element exactly once over the ranks.
    for (const TensorSpec& s : specs_)
      total_bytes_ += shape_numel(s.shape) * static_cast<int64_t>(kKinds.size() * sizeof(float));
  }

  int64_t total_bytes() const { return total_bytes_; }
  size_t num_tensors() const { return specs_.size(); }

  void run() {
    run_everywhere(g_, "creating the directories", [&] {
      if (g_.rank() == 0) {
        fs::remove_all(base_);
        fs::create_directories(fs::path(base_) / "raw");
      }
    });
    std::vector<Figure> figs;
    figs.push_back({"raw", "write+fsync", total_bytes_, {}, {}, 0});
    figs.push_back({"raw", "read", total_bytes_, {}, {}, 0});
    figs.push_back({"memory", "host copy", total_bytes_, {}, {}, 0});
    for (Layout l : args_.layouts) {
      figs.push_back({std::string(layout_name(l)), "save", total_bytes_, {}, {}, 0});
      figs.push_back({std::string(layout_name(l)), "load", total_bytes_, {}, {}, 0});
      figs.push_back({std::string(layout_name(l)), "load resharded", total_bytes_, {}, {}, 0});
    }
    std::vector<Figure> memory{{"memory", "fresh pages", 0, {}, {}, 0}, {"memory", "touched pages", 0, {}, {}, 0}};
    // Interleaved repeats: a drift of the disk (burst credits, background
    // writeback) spreads over every figure instead of biasing one.
    for (int rep = 0; rep < args_.repeats; ++rep) {
      measure_raw(figs[0], figs[1]);
      measure_host_copy(figs[2]);
      // The layouts take turns going first: whichever runs second meets the
      // page cache and free memory the first one left.
      const size_t n_layouts = args_.layouts.size();
      for (size_t k = 0; k < n_layouts; ++k) {
        const size_t i = (k + static_cast<size_t>(rep)) % n_layouts;
        measure_layout(args_.layouts[i], figs[3 + 3 * i], figs[4 + 3 * i], figs[5 + 3 * i]);
      }
      measure_memory(memory[0], memory[1]);
      if (g_.rank() == 0) std::fprintf(stderr, "ckpt_bench: repeat %d/%d done\n", rep + 1, args_.repeats);
    }
    if (g_.rank() == 0) print(figs, memory);
    run_everywhere(g_, "removing the files", [&] {
      if (g_.rank() == 0 && !args_.keep) fs::remove_all(base_);
    });
  }

 private:
  std::string raw_path(int rank) const {
    return (fs::path(base_) / "raw" / format("raw-{}-of-{}.bin", rank, g_.size())).string();
  }

  // Drops the page cache of `paths` on every rank (each node drops its own),
  // then returns the fraction still resident, as rank 0 sees it.
  double drop_and_measure(const std::vector<std::string>& paths) {
    double resident = 0;
    run_everywhere(g_, "dropping the page cache", [&] {
      for (const std::string& p : paths) drop_cache(p);
    });
    run_everywhere(g_, "measuring residency", [&] {
      if (g_.rank() != 0) return;
      Residency r = residency(paths);
      resident = r.total > 0 ? static_cast<double>(r.resident) / static_cast<double>(r.total) : 0.0;
    });
    return resident;
  }

  // Every measurement starts from the same quiet disk: nothing dirty (the
  // deletes of the previous repeat committed, discards issued), then a pause,
  // as before a checkpoint in training, which follows minutes of compute.
  // A virtual disk with a bandwidth budget (a token bucket) refills in the
  // pause, and equally so for raw and checkpoint figures.
  void settle() {
    run_everywhere(g_, "settling", [&] {
      if (g_.rank() == 0) ::sync();
    });
    std::this_thread::sleep_for(std::chrono::duration<double>(args_.settle));
  }

  // Memory bandwidth as the savers meet it: the first write to freshly
  // allocated pages (the kernel zeroes them; a virtual machine may also fault
  // them in from its host) and a second write to the same pages. All ranks at
  // once, over a third of the state (one kind).
  void measure_memory(Figure& fresh, Figure& touched) {
    const int64_t n = std::max<int64_t>(1, saved_.flats[0].numel());
    fresh.bytes = touched.bytes = static_cast<int64_t>(static_cast<double>(total_bytes_) / kKinds.size());
    Tensor buf;
    fresh.seconds.push_back(run_everywhere(g_, "first write to fresh memory", [&] {
      buf = Tensor::empty({n}, DType::F32);
      std::memset(buf.raw_data(), 1, buf.nbytes());
    }));
    touched.seconds.push_back(
        run_everywhere(g_, "second write to the same memory", [&] { std::memset(buf.raw_data(), 2, buf.nbytes()); }));
  }

  // What an async save must at least do before training may go on: copy
  // this rank's state into host buffers of its own (freshly allocated, as a
  // snapshot is).
  void measure_host_copy(Figure& copy) {
    settle();
    std::vector<Tensor> copies;
    copy.seconds.push_back(run_everywhere(g_, "host copy", [&] {
      for (const StateEntry& e : saved_.entries) {
        Tensor c = Tensor::empty({e.local.numel()}, e.local.dtype());
        c.copy_from(e.local);
        copies.push_back(std::move(c));
      }
    }));
  }

  void measure_raw(Figure& write, Figure& read) {
    const std::string path = raw_path(g_.rank());
    run_everywhere(g_, "removing the raw files", [&] { fs::remove(path); });
    settle();
    write.seconds.push_back(run_everywhere(g_, "raw write", [&] { raw_write(path, saved_); }));
    std::vector<std::string> all;
    for (int r = 0; r < g_.size(); ++r) all.push_back(raw_path(r));
    read.resident_max = std::max(read.resident_max, drop_and_measure(all));
    poison(saved_);
    settle();
    read.seconds.push_back(run_everywhere(g_, "raw read", [&] { raw_read(path, saved_); }));
    run_everywhere(g_, "checking the raw read", [&] { check_values(saved_, specs_.size(), "raw read", g_.rank()); });
  }

  void measure_layout(Layout layout, Figure& save, Figure& load, Figure& resharded) {
    const std::string dir = (fs::path(base_) / layout_name(layout)).string();
    run_everywhere(g_, "preparing the checkpoint directory", [&] {
      if (g_.rank() != 0) return;
      fs::remove_all(dir);
      fs::create_directories(dir);
    });

    checkpoint::SaveOptions opts;
    opts.layout = layout;
    opts.model_weights = args_.unified_model != ModelWeights::None;
    opts.master_weights = true;
    opts.model_dtype = args_.unified_model == ModelWeights::BF16 ? DType::BF16 : DType::F32;
    opts.snapshot = args_.snapshot;
    opts.threads = args_.save_threads;
    double stage = 0, write = 0;
    settle();
    const double secs = run_everywhere(g_, format("{} save", layout_name(layout)), [&] {
      const Clock::time_point t0 = Clock::now();
      checkpoint::StagedSave staged = checkpoint::stage_save(dir, saved_.entries, opts, g_);
      stage = seconds_since(t0);
      const Clock::time_point t1 = Clock::now();
      staged.write();
      write = seconds_since(t1);
      staged.finish();
    });
    save.seconds.push_back(secs);
    // Stage and write may peak on different ranks; finish is what follows the
    // slowest rank's write (waiting for the others' agreement, the index).
    std::vector<double> parts = max_over_ranks(g_, {stage, write, stage + write});
    parts[2] = secs - parts[2];
    save.phases.push_back(parts);
    if (g_.rank() == 0) written_[std::string(layout_name(layout))] = bytes_on_disk(dir);

    // Into the saved state itself, as a trainer resumes: the next save writes
    // what this load filled in, after it was checked.
    measure_load(dir, layout, saved_, load);
    measure_load(dir, layout, resharded_, resharded);
  }

  void measure_load(const std::string& dir, Layout layout, LocalState& target, Figure& fig) {
    fig.resident_max = std::max(fig.resident_max, drop_and_measure(files_in(dir)));
    poison(target);
    settle();
    double catalog_secs = 0, load_secs = 0;
    const std::string what = format("{} {}", layout_name(layout), fig.op);
    fig.seconds.push_back(run_everywhere(g_, what, [&] {
      const Clock::time_point t0 = Clock::now();
      checkpoint::Catalog catalog = checkpoint::read_catalog(dir);
      catalog_secs = seconds_since(t0);
      const Clock::time_point t1 = Clock::now();
      checkpoint::LoadOptions lo;
      lo.verify = args_.verify;
      lo.threads = args_.threads;
      checkpoint::load_entries(catalog, target.entries, lo, g_);
      load_secs = seconds_since(t1);
    }));
    fig.phases.push_back(max_over_ranks(g_, {catalog_secs, load_secs}));
    run_everywhere(g_, format("checking the {}", what), [&] { check_values(target, specs_.size(), what, g_.rank()); });
  }

  void print(const std::vector<Figure>& figs, const std::vector<Figure>& memory) const {
    const double raw_write_gbps = static_cast<double>(total_bytes_) / 1e9 / median(figs[0].seconds);
    const double raw_read_gbps = static_cast<double>(total_bytes_) / 1e9 / median(figs[1].seconds);
    std::string out = format("\n{:<8} {:<15} {:>7} {:>8} {:>7} {:>7}   {}\n", "layout", "op", "GB", "seconds", "GB/s",
                             "vs raw", "seconds of each repeat");
    for (const Figure& f : figs) {
      const double m = median(f.seconds);
      const double gbps = static_cast<double>(f.bytes) / 1e9 / m;
      const bool is_write = f.op == "save" || f.op == "write+fsync";
      std::string runs;
      for (double s : f.seconds) runs += format(runs.empty() ? "{:.3f}" : " {:.3f}", s);
      const std::string ratio =
          f.layout == "memory" ? "-" : format("{:.2f}", gbps / (is_write ? raw_write_gbps : raw_read_gbps));
      out += format("{:<8} {:<15} {:>7.3f} {:>8.3f} {:>7.3f} {:>7}   {}\n", f.layout, f.op,
                    static_cast<double>(f.bytes) / 1e9, m, gbps, ratio, runs);
    }
    out += "\nwhere the time goes (medians; max over ranks):\n";
    for (const Figure& f : figs) {
      if (f.phases.empty()) continue;
      auto part = [&](size_t i) {
        std::vector<double> v;
        for (const auto& p : f.phases) v.push_back(p[i]);
        return median(v);
      };
      if (f.op == "save") {
        out += format(
            "  {:<8} save: stage {:.3f} s, write+fsync {:.3f} s, finish (agree, index) {:.3f} s; {:.3f} GB "
            "in files\n",
            f.layout, part(0), part(1), part(2), static_cast<double>(written_.at(f.layout)) / 1e9);
        if (args_.snapshot)
          out += format("  {:<8} async save: training blocked (stage) {:.3f} s = {:.2f}x the host copy ({:.3f} s)\n",
                        f.layout, part(0), part(0) / median(figs[2].seconds), median(figs[2].seconds));
      } else
        out += format("  {:<8} {}: read_catalog {:.3f} s, load_entries {:.3f} s\n", f.layout, f.op, part(0), part(1));
    }
    auto gbps = [](const Figure& f) { return static_cast<double>(f.bytes) / 1e9 / median(f.seconds); };
    out +=
        format("  memory: first write to fresh pages {:.2f} GB/s, rewrite of the same pages {:.2f} GB/s (all ranks)\n",
               gbps(memory[0]), gbps(memory[1]));
    if (g_.size() == 1)
      out += "  (world 1: both load partitions are whole tensors, so 'load resharded' repeats 'load')\n";
    double resident = 0;
    for (const Figure& f : figs) resident = std::max(resident, f.resident_max);
    out += format(
        "\npage cache: dropped before every read (posix_fadvise DONTNEED after fsync); at most {:.1f}% of the files "
        "read were still resident in this machine's page cache (mincore).\n",
        100.0 * resident);
    out += resident > 0.01 ? "reads were partly served from the page cache: read figures are optimistic.\n"
                           : "reads came from below the page cache; a cache under it (a virtual disk's host, a "
                             "controller) cannot be seen from here and may still serve some.\n";
    std::fputs(out.c_str(), stdout);
    std::fflush(stdout);
  }

  const Args& args_;
  ProcessGroup& g_;
  std::vector<TensorSpec> specs_;
  std::string base_;
  LocalState saved_;      // this rank's FSDP shards: saved, and the target of raw reads and loads
  LocalState resharded_;  // the other partition: the target of resharded loads
  int64_t total_bytes_ = 0;
  std::map<std::string, int64_t> written_;  // layout -> bytes of its files (rank 0)
};

// --drop-cache DIR: drops the page cache of every file under DIR (fsynced
// first: only clean pages can be dropped), prints the share still resident.
int drop_cache_of_tree(const std::string& dir) {
  std::vector<std::string> paths;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file()) paths.push_back(e.path().string());
  for (const std::string& p : paths) {
    fsync_path(p, PathKind::File);
    drop_cache(p);
  }
  const Residency r = residency(paths);
  std::printf("dropped the page cache of %zu files under %s: %.1f%% still resident\n", paths.size(), dir.c_str(),
              r.total > 0 ? 100.0 * static_cast<double>(r.resident) / static_cast<double>(r.total) : 0.0);
  return 0;
}

int run(const std::vector<std::string>& argv) {
  Args args;
  const cli::Parser parser = args_parser(args);
  if (parser.parse_or_help(argv)) return 0;
  if (!args.drop_cache.empty()) return drop_cache_of_tree(args.drop_cache);
  ST_USAGE_CHECK(!args.dir.empty(), "--dir is required (see --help)");
  ST_USAGE_CHECK(args.bytes >= 1e5, "--bytes {} is too small to shape a model (at least 1e5)", args.bytes);
  CommRuntime comm;
  ProcessGroup& world = comm.world();
  const ModelShape m = shape_for_bytes(args.bytes);
  Bench bench(args, world);
  if (world.rank() == 0) {
    std::string layouts;
    for (Layout l : args.layouts) {
      if (!layouts.empty()) layouts += ',';
      layouts += layout_name(l);
    }
    std::printf("%s", describe_machine(args.dir).c_str());
    std::printf(
        "%s",
        format("world:   {} rank(s), {} backend\n"
               "state:   {:.3f} GB = {} tensors x {{master, exp_avg, exp_avg_sq}} F32 (d {}, {} layers, ffn {}, "
               "vocab {}), FSDP-like flat shards per layer\n"
               "run:     {} repeat(s), median shown; layouts {}; load verify (CRC32C) {}; {} reader thread(s); "
               "unified model-* files {}; snapshot {}; {} s settle before each measurement\n",
               world.size(), world.backend_name(), static_cast<double>(bench.total_bytes()) / 1e9, bench.num_tensors(),
               m.d, m.layers, m.ffn, m.vocab, args.repeats, layouts, args.verify ? "on" : "off", args.threads,
               args.unified_model == ModelWeights::None  ? "off"
               : args.unified_model == ModelWeights::F32 ? "f32"
                                                         : "bf16",
               args.snapshot ? "on" : "off", args.settle)
            .c_str());
    std::fflush(stdout);
  }
  bench.run();
  return 0;
}

}  // namespace
}  // namespace st::bench

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  return st::run_main("ckpt_bench", [&] { return st::bench::run(args); });
}
