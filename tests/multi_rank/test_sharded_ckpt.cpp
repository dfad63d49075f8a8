// Sharded checkpoints: save under this run's FSDP-like partition, load under a
// different one (reversed ranks, full tensors, BF16), and check every element
// exactly. Also the read planner on its own, and the errors for a flipped
// byte and a missing shard file.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <stdlib.h>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checksum.h"
#include "checkpoint/plan.h"
#include "checkpoint/safetensors.h"
#include "core/comm.h"
#include "core/state.h"
#include "tests/harness/mpi_env.h"

namespace st::checkpoint {
namespace {

namespace fs = std::filesystem;

enum class Verify : uint8_t { No, Yes };

void save_sharded(const std::string& dir, std::span<const StateEntry> entries, ProcessGroup& group) {
  save(dir, entries, SaveOptions{.layout = Layout::Sharded, .snapshot = false}, group);
}

// Each rank loads on its own (not collective), as a one-process tool does.
void load_sharded(const std::string& dir, std::span<StateEntry> entries, Verify verify) {
  Catalog catalog = read_catalog(dir);
  ST_CHECK(catalog.format == layout_name(Layout::Sharded), "'{}' holds a {} checkpoint, not a sharded one", dir,
           catalog.format);
  load_entries(catalog, entries, LoadOptions{.verify = verify == Verify::Yes});
}

struct TensorSpec {
  std::string fqn;
  Shape shape;
};

// Distinct shapes and sizes; 1 element leaves most ranks empty, 7 and 30 split unevenly at 3.
const std::vector<TensorSpec>& specs() {
  static const std::vector<TensorSpec> s{{"a.weight", {7}}, {"b.weight", {10, 3}}, {"c.bias", {1}}};
  return s;
}

// The known value of element i of tensor t: distinct per tensor and element,
// and not exactly representable in BF16, so rounding is visible.
float value_of(size_t t, int64_t i) { return static_cast<float>(t) * 100.0f + static_cast<float>(i) * 1.37f + 0.011f; }
// The same for another kind: optimizer state differs from the weights.
float value_of(size_t t, int64_t i, const std::string& kind) {
  return value_of(t, i) + (kind == "master" ? 0.0f : 0.5f);
}

struct Range {
  int64_t begin;
  int64_t numel;
};

// FSDP-like: ceil(n / world) elements per rank, the last ones possibly short or empty.
Range fsdp_range(int64_t n, int rank, int world) {
  int64_t per = (n + world - 1) / world;
  int64_t b = std::min(n, per * rank);
  return {b, std::min(n, b + per) - b};
}

// A different split: floor boundaries, ranks in reverse order.
Range reversed_range(int64_t n, int rank, int world) {
  int r = world - 1 - rank;
  int64_t b = n * r / world;
  return {b, n * (r + 1) / world - b};
}

std::vector<StateEntry> make_entries(Range (*range)(int64_t, int, int), int rank, int world, DType dtype, bool fill,
                                     const std::string& kind = "master") {
  std::vector<StateEntry> out;
  for (size_t t = 0; t < specs().size(); ++t) {
    const TensorSpec& s = specs()[t];
    Range r = range(shape_numel(s.shape), rank, world);
    std::vector<float> vals(static_cast<size_t>(r.numel), -1.0f);
    if (fill)
      for (int64_t i = 0; i < r.numel; ++i) vals[static_cast<size_t>(i)] = value_of(t, r.begin + i, kind);
    out.push_back(StateEntry{s.fqn, kind, s.shape, dtype, r.begin, Tensor::from_floats(vals, {r.numel}, dtype)});
  }
  return out;
}

Range full_range(int64_t n, int, int) { return {0, n}; }

// Elements of `entries` that differ from value_of (rounded to the entry's dtype).
int64_t count_wrong(const std::vector<StateEntry>& entries) {
  int64_t wrong = 0;
  for (size_t t = 0; t < entries.size(); ++t) {
    std::vector<float> got = entries[t].local.to_floats();
    for (size_t i = 0; i < got.size(); ++i) {
      float want = value_of(t % specs().size(), entries[t].begin + static_cast<int64_t>(i), entries[t].kind);
      if (entries[t].local.dtype() == DType::BF16) want = round_to_bf16(want);
      if (got[i] != want) ++wrong;
    }
  }
  return wrong;
}

// The message of the error `f` throws, or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  return error_message_of(std::forward<F>(f));
}

// A fresh directory every rank sees: rank 0 creates it and broadcasts the path.
std::string shared_temp_dir(ProcessGroup& g) {
  std::string path;
  if (g.rank() == 0) {
    std::string templ = (fs::temp_directory_path() / "st_sharded_XXXXXX").string();
    path = ::mkdtemp(templ.data()) ? templ : "";
  }
  return broadcast_string(g, path);
}

// Removes the directory at the end of a test, after every rank is done with it.
class SharedDir {
 public:
  explicit SharedDir(ProcessGroup& g) : g_(g), path_(shared_temp_dir(g)) {}
  ~SharedDir() {
    g_.barrier().wait();
    std::error_code ec;
    if (g_.rank() == 0) fs::remove_all(path_, ec);
  }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  ProcessGroup& g_;
  std::string path_;
};

std::vector<StateEntry> save_fsdp(const std::string& dir, ProcessGroup& g) {
  std::vector<StateEntry> saved = make_entries(fsdp_range, g.rank(), g.size(), DType::F32, true);
  EXPECT_EQ(error_of([&] { save_sharded(dir, saved, g); }), "");
  return saved;
}

StateEntry plan_entry(int64_t begin, int64_t numel) {
  return StateEntry{"w", "master", {100}, DType::F32, begin, Tensor::zeros({numel}, DType::F32)};
}

TEST(PlanReads, ExactChunk) {
  std::vector<ChunkRecord> chunks{{"w", "master", 0, 10, "f0", "k0", 0}, {"w", "master", 10, 10, "f1", "k1", 0}};
  std::vector<Read> reads = plan_reads(chunks, plan_entry(10, 10));
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].chunk->file, "f1");
  EXPECT_EQ(reads[0].chunk->key, "k1");
  EXPECT_EQ(reads[0].chunk_offset_elems, 0);
  EXPECT_EQ(reads[0].entry_offset_elems, 0);
  EXPECT_EQ(reads[0].count, 10);
}

TEST(PlanReads, SpansThreeChunksOutOfOrderIgnoringOtherKinds) {
  std::vector<ChunkRecord> chunks{{"w", "master", 20, 10, "f2", "k2", 0},
                                  {"w", "exp_avg", 0, 100, "fx", "kx", 0},
                                  {"w", "master", 0, 10, "f0", "k0", 0},
                                  {"w", "master", 10, 10, "f1", "k1", 0}};
  std::vector<Read> reads = plan_reads(chunks, plan_entry(5, 20));  // [5, 25)
  ASSERT_EQ(reads.size(), 3u);
  EXPECT_EQ(reads[0].chunk->key, "k0");
  EXPECT_EQ(reads[0].chunk_offset_elems, 5);
  EXPECT_EQ(reads[0].entry_offset_elems, 0);
  EXPECT_EQ(reads[0].count, 5);
  EXPECT_EQ(reads[1].chunk->key, "k1");
  EXPECT_EQ(reads[1].chunk_offset_elems, 0);
  EXPECT_EQ(reads[1].entry_offset_elems, 5);
  EXPECT_EQ(reads[1].count, 10);
  EXPECT_EQ(reads[2].chunk->key, "k2");
  EXPECT_EQ(reads[2].chunk_offset_elems, 0);
  EXPECT_EQ(reads[2].entry_offset_elems, 15);
  EXPECT_EQ(reads[2].count, 5);
}

TEST(PlanReads, ReplicasAreReadOnce) {
  std::vector<ChunkRecord> chunks{{"w", "master", 0, 10, "f0", "k0", 0}, {"w", "master", 0, 10, "f1", "k0", 0}};
  std::vector<Read> reads = plan_reads(chunks, plan_entry(2, 6));
  ASSERT_EQ(reads.size(), 1u);
  EXPECT_EQ(reads[0].chunk_offset_elems, 2);
  EXPECT_EQ(reads[0].count, 6);
}

TEST(PlanReads, GapAndShortTailNameTheMissingRange) {
  std::vector<ChunkRecord> chunks{{"w", "master", 0, 10, "f0", "k0", 0}, {"w", "master", 12, 8, "f1", "k1", 0}};
  EXPECT_EQ(error_of([&] { plan_reads(chunks, plan_entry(5, 10)); }),
            "tensor w kind master: checkpoint has no data for elements [10, 12)");
  EXPECT_EQ(error_of([&] { plan_reads(chunks, plan_entry(15, 10)); }),
            "tensor w kind master: checkpoint has no data for elements [20, 25)");
  EXPECT_TRUE(plan_reads(chunks, plan_entry(3, 0)).empty());
}

TEST(ShardedCheckpoint, WritesOneFilePerRankAndAnIndex) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_fsdp(dir.path(), g);
  for (int r = 0; r < g.size(); ++r) EXPECT_TRUE(fs::exists(fs::path(dir.path()) / shard_file_name(r, g.size())));
  EXPECT_TRUE(fs::exists(fs::path(dir.path()) / std::string(kShardedIndexName)));
  EXPECT_EQ(shard_file_name(2, 4), "shard-00002-of-00004.safetensors");
  // Every non-empty FSDP slice is one chunk of this rank's file.
  SafetensorsFile mine((fs::path(dir.path()) / shard_file_name(g.rank(), g.size())).string());
  for (size_t t = 0; t < specs().size(); ++t) {
    Range r = fsdp_range(shape_numel(specs()[t].shape), g.rank(), g.size());
    EXPECT_EQ(mine.has(chunk_key(specs()[t].fqn, "master", r.begin)), r.numel > 0) << specs()[t].fqn;
  }
}

TEST(ShardedCheckpoint, LoadsUnderAReversedPartition) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_fsdp(dir.path(), g);
  std::vector<StateEntry> loaded = make_entries(reversed_range, g.rank(), g.size(), DType::F32, false);
  EXPECT_EQ(error_of([&] { load_sharded(dir.path(), loaded, Verify::Yes); }), "");
  EXPECT_EQ(count_wrong(loaded), 0);
}

TEST(ShardedCheckpoint, EveryRankLoadsFullTensors) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_fsdp(dir.path(), g);
  std::vector<StateEntry> loaded = make_entries(full_range, g.rank(), g.size(), DType::F32, false);
  EXPECT_EQ(error_of([&] { load_sharded(dir.path(), loaded, Verify::Yes); }), "");
  EXPECT_EQ(count_wrong(loaded), 0);
}

TEST(ShardedCheckpoint, LoadsF32AsBF16) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_fsdp(dir.path(), g);
  std::vector<StateEntry> loaded = make_entries(reversed_range, g.rank(), g.size(), DType::BF16, false);
  EXPECT_EQ(error_of([&] { load_sharded(dir.path(), loaded, Verify::No); }), "");
  EXPECT_EQ(count_wrong(loaded), 0);
}

TEST(ShardedCheckpoint, ShapeMismatchNamesBothShapes) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_fsdp(dir.path(), g);
  std::vector<StateEntry> loaded = make_entries(full_range, g.rank(), g.size(), DType::F32, false);
  loaded[1].global_shape = {3, 10};
  EXPECT_EQ(error_of([&] { load_sharded(dir.path(), loaded, Verify::No); }),
            "tensor b.weight kind master: checkpoint '" + dir.path() + "' has shape [10, 3], the model has [3, 10]");
}

TEST(ShardedCheckpoint, FlippedByteFailsVerificationNamingFileAndKey) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_fsdp(dir.path(), g);
  // Rank 0 always holds element 0 of every tensor, so "a.weight|master|0" is in shard 0.
  const std::string file = (fs::path(dir.path()) / shard_file_name(0, g.size())).string();
  const std::string key = chunk_key("a.weight", "master", 0);
  if (g.rank() == 0) {
    uint64_t at = SafetensorsFile(file).info(key).data_begin + 1;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(at));
    char c = 0;
    f.read(&c, 1);
    c = static_cast<char>(c ^ 0x10);
    f.seekp(static_cast<std::streamoff>(at));
    f.write(&c, 1);
    EXPECT_TRUE(f.good());
  }
  g.barrier().wait();
  std::vector<StateEntry> loaded = make_entries(full_range, g.rank(), g.size(), DType::F32, false);
  std::string err = error_of([&] { load_sharded(dir.path(), loaded, Verify::Yes); });
  EXPECT_NE(err.find("checksum mismatch in '" + file + "', tensor '" + key + "'"), std::string::npos) << err;
  // Without verification the load goes through and exactly one element is wrong.
  EXPECT_EQ(error_of([&] { load_sharded(dir.path(), loaded, Verify::No); }), "");
  EXPECT_EQ(count_wrong(loaded), 1);
}

TEST(ShardedCheckpoint, MissingShardFileIsNamed) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_fsdp(dir.path(), g);
  // The last rank always holds the last element of "a.weight" (7 elements, at most 4 ranks).
  const std::string file = (fs::path(dir.path()) / shard_file_name(g.size() - 1, g.size())).string();
  if (g.rank() == 0) {
    EXPECT_TRUE(fs::remove(file));
  }
  g.barrier().wait();
  std::vector<StateEntry> loaded = make_entries(full_range, g.rank(), g.size(), DType::F32, false);
  std::string err = error_of([&] { load_sharded(dir.path(), loaded, Verify::No); });
  EXPECT_NE(err.find("checkpoint file '" + file + "'"), std::string::npos) << err;
  EXPECT_NE(err.find("is missing"), std::string::npos) << err;
}

TEST(ShardedCheckpoint, UnknownTensorIsNamed) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_fsdp(dir.path(), g);
  std::vector<StateEntry> loaded = make_entries(full_range, g.rank(), g.size(), DType::F32, false);
  loaded[0].kind = "exp_avg";
  std::string err = error_of([&] { load_sharded(dir.path(), loaded, Verify::No); });
  EXPECT_EQ(err.rfind("tensor a.weight kind exp_avg is not in checkpoint", 0), 0u) << err;
}

// ---- Unified (Hugging Face) layout --------------------------------------------

// Master weights and one optimizer kind, FSDP-partitioned (or as `range` says).
std::vector<StateEntry> make_state(Range (*range)(int64_t, int, int), int rank, int world, bool fill) {
  std::vector<StateEntry> out = make_entries(range, rank, world, DType::F32, fill, "master");
  std::vector<StateEntry> opt = make_entries(range, rank, world, DType::F32, fill, "exp_avg");
  out.insert(out.end(), opt.begin(), opt.end());
  return out;
}

nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  out << j.dump(1);
}

std::string join(const std::string& dir, std::string_view name) { return (fs::path(dir) / name).string(); }

void save_unified(const std::string& dir, ProcessGroup& g, SaveOptions options,
                  Range (*range)(int64_t, int, int) = fsdp_range) {
  std::vector<StateEntry> saved = make_state(range, g.rank(), g.size(), true);
  options.layout = Layout::Unified;
  EXPECT_EQ(error_of([&] { save(dir, saved, options, g); }), "");
}

// Loads master + exp_avg under a reversed partition; returns the error or "".
std::string load_reversed(const std::string& dir, std::vector<StateEntry>& loaded, LoadOptions options = {}) {
  ProcessGroup& g = test::world();
  loaded = make_state(reversed_range, g.rank(), g.size(), false);
  return error_of([&] { load_entries(read_catalog(dir), loaded, options); });
}

TEST(UnifiedCheckpoint, WritesHuggingFaceIndexAndFilesOfWholeTensors) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_unified(dir.path(), g, {.model_weights = true, .master_weights = false});
  nlohmann::json model = read_json(join(dir.path(), kModelIndexName));
  nlohmann::json opt = read_json(join(dir.path(), kOptimizerIndexName));
  EXPECT_FALSE(fs::exists(join(dir.path(), kMasterIndexName)));
  // Three tensors go to min(world, 3) owners; each file holds whole tensors.
  const int n = std::min(g.size(), 3);
  int64_t total = 0;
  for (const TensorSpec& spec : specs()) {
    const std::string file = model["weight_map"].value(spec.fqn, std::string());
    ASSERT_FALSE(file.empty()) << spec.fqn;
    EXPECT_EQ(file.substr(0, 6), "model-");
    EXPECT_NE(file.find("-of-0000" + std::to_string(n) + ".safetensors"), std::string::npos) << file;
    SafetensorsFile f(join(dir.path(), file));
    EXPECT_EQ(f.info(spec.fqn).shape, spec.shape);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    total += shape_numel(spec.shape) * 4;
    EXPECT_EQ(opt["weight_map"].value(spec.fqn + ".exp_avg", std::string()).substr(0, 10), "optimizer-");
    EXPECT_TRUE(model["crc32c"].contains(spec.fqn));
  }
  EXPECT_EQ(model["metadata"]["total_size"].get<int64_t>(), total);
  EXPECT_EQ(model["metadata"]["format"], std::string(kUnifiedFormat));
  // F32 model weights stand in for master weights exactly.
  std::vector<StateEntry> loaded;
  EXPECT_EQ(load_reversed(dir.path(), loaded), "");
  EXPECT_EQ(count_wrong(loaded), 0);
  Catalog cat = read_catalog(dir.path());
  EXPECT_EQ(cat.format, "unified");
  EXPECT_EQ(cat.world_size, g.size());
}

// Every rank writes its pieces straight into the files of their tensors: each
// file must be byte for byte the file SafetensorsWriter writes from the whole
// tensors (known values, in the file's order, with BF16 model weights).
TEST(UnifiedCheckpoint, PiecesWrittenInPlaceMakeTheSameFilesAsWholeTensors) {
  ProcessGroup& g = test::world();
  SharedDir dir(g), rebuilt(g);
  save_unified(dir.path(), g, {.model_weights = true, .master_weights = true, .model_dtype = DType::BF16});
  if (g.rank() != 0) return;
  int files = 0;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".safetensors") continue;
    ++files;
    SafetensorsFile f(entry.path().string());
    SafetensorsWriter w;
    for (const std::string& key : f.names()) {
      const bool optimizer = name.rfind("optimizer-", 0) == 0;
      const std::string fqn = optimizer ? key.substr(0, key.rfind('.')) : key;
      const std::string kind = optimizer ? key.substr(key.rfind('.') + 1) : "master";
      size_t t = 0;
      while (specs()[t].fqn != fqn) ++t;
      std::vector<float> vals(static_cast<size_t>(shape_numel(specs()[t].shape)));
      for (size_t i = 0; i < vals.size(); ++i) vals[i] = value_of(t, static_cast<int64_t>(i), kind);
      const DType dtype = name.rfind("model-", 0) == 0 ? DType::BF16 : DType::F32;
      w.add(key, Tensor::from_floats(vals, specs()[t].shape, dtype));
    }
    w.set_metadata("format", "pt");
    const fs::path path = fs::path(rebuilt.path()) / name;
    w.write(path.string());
    std::ifstream a(entry.path(), std::ios::binary), b(path, std::ios::binary);
    std::string x((std::istreambuf_iterator<char>(a)), {}), y((std::istreambuf_iterator<char>(b)), {});
    EXPECT_EQ(x, y) << name;
  }
  EXPECT_GE(files, 3);
}

TEST(UnifiedCheckpoint, BF16ModelWeightsBesideExactMasterWeights) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_unified(dir.path(), g, {.model_weights = true, .master_weights = true, .model_dtype = DType::BF16});
  nlohmann::json model = read_json(join(dir.path(), kModelIndexName));
  const std::string file = model["weight_map"]["b.weight"].get<std::string>();
  SafetensorsFile f(join(dir.path(), file));
  EXPECT_EQ(f.info("b.weight").dtype, DType::BF16);
  std::vector<float> b = f.read_tensor("b.weight").to_floats();
  EXPECT_EQ(b[7], round_to_bf16(value_of(1, 7)));
  std::vector<StateEntry> loaded;
  EXPECT_EQ(load_reversed(dir.path(), loaded), "");
  EXPECT_EQ(count_wrong(loaded), 0);  // from master_weights-*, not the rounded model weights
}

TEST(UnifiedCheckpoint, MasterFromBF16ModelWeightsOnlyWhenAsked) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_unified(dir.path(), g, {.model_weights = true, .master_weights = false, .model_dtype = DType::BF16});
  std::vector<StateEntry> loaded;
  std::string err = load_reversed(dir.path(), loaded);
  EXPECT_NE(err.find("has no master weights, only BF16 model weights"), std::string::npos) << err;
  EXPECT_NE(err.find("master_weight_compatible"), std::string::npos) << err;
  EXPECT_EQ(load_reversed(dir.path(), loaded, {.master_from_model = true}), "");
  int64_t wrong = 0;
  for (size_t t = 0; t < specs().size(); ++t) {
    std::vector<float> got = loaded[t].local.to_floats();
    for (size_t i = 0; i < got.size(); ++i)
      wrong += got[i] != round_to_bf16(value_of(t, loaded[t].begin + static_cast<int64_t>(i)));
  }
  EXPECT_EQ(wrong, 0);
}

TEST(UnifiedCheckpoint, SkipModelWeightsKeepsMasterWeights) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_unified(dir.path(), g, {.model_weights = false, .master_weights = true});
  EXPECT_FALSE(fs::exists(join(dir.path(), kModelIndexName)));
  EXPECT_TRUE(fs::exists(join(dir.path(), kMasterIndexName)));
  std::vector<StateEntry> loaded;
  EXPECT_EQ(load_reversed(dir.path(), loaded), "");
  EXPECT_EQ(count_wrong(loaded), 0);
}

// NO_SHARD-like: every rank holds every tensor whole. Each is written once, and
// the writers are spread over the ranks.
TEST(UnifiedCheckpoint, ReplicasAreWrittenOnceInBothLayouts) {
  ProcessGroup& g = test::world();
  for (Layout layout : {Layout::Sharded, Layout::Unified}) {
    SharedDir dir(g);
    std::vector<StateEntry> saved = make_entries(full_range, g.rank(), g.size(), DType::F32, true);
    StagedSave staged = stage_save(dir.path(), saved, {.layout = layout, .master_weights = false}, g);
    int64_t state_bytes = 0;
    for (const TensorSpec& spec : specs()) state_bytes += shape_numel(spec.shape) * 4;
    EXPECT_EQ(staged.total_bytes(), state_bytes);
    // The largest tensor (30 elements) goes first, to rank 0; the others to the next least-loaded ranks.
    Tensor mine = Tensor::from_vector(std::vector<int32_t>{static_cast<int32_t>(staged.bytes())}, {1});
    Tensor max = mine;
    g.all_reduce(max, {.op = ReduceOp::Max}).wait();
    EXPECT_EQ(max.data<int32_t>()[0], g.size() == 1 ? state_bytes : 120);
    staged.write();
    EXPECT_EQ(error_of([&] { staged.finish(); }), "");
    if (layout == Layout::Sharded) {
      nlohmann::json index = read_json(join(dir.path(), kShardedIndexName));
      EXPECT_EQ(index["chunks"].size(), specs().size());
    }
    std::vector<StateEntry> loaded = make_entries(reversed_range, g.rank(), g.size(), DType::F32, false);
    EXPECT_EQ(error_of([&] { load_entries(read_catalog(dir.path()), loaded, {}); }), "");
    EXPECT_EQ(count_wrong(loaded), 0);
  }
}

TEST(UnifiedCheckpoint, LoadsAPlainHuggingFaceModelFile) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  if (g.rank() == 0) {
    SafetensorsWriter w;
    for (size_t t = 0; t < specs().size(); ++t) {
      std::vector<float> v(static_cast<size_t>(shape_numel(specs()[t].shape)));
      for (size_t i = 0; i < v.size(); ++i) v[i] = value_of(t, static_cast<int64_t>(i));
      w.add(specs()[t].fqn, Tensor::from_floats(v, specs()[t].shape, DType::F32));
    }
    w.write(join(dir.path(), "model.safetensors"));
  }
  g.barrier().wait();
  Catalog cat = read_catalog(dir.path());
  EXPECT_EQ(cat.format, "huggingface");
  std::vector<StateEntry> loaded = make_entries(reversed_range, g.rank(), g.size(), DType::F32, false);
  EXPECT_EQ(error_of([&] { load_entries(cat, loaded, {}); }), "");
  EXPECT_EQ(count_wrong(loaded), 0);
}

TEST(UnifiedCheckpoint, TensorMissingFromIndexAndFlippedByteAreNamed) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_unified(dir.path(), g, {.model_weights = true, .master_weights = false});
  const std::string index_path = join(dir.path(), kModelIndexName);
  nlohmann::json index = read_json(index_path);
  const std::string file = join(dir.path(), index["weight_map"]["a.weight"].get<std::string>());
  g.barrier().wait();
  if (g.rank() == 0) {
    uint64_t at = SafetensorsFile(file).info("a.weight").data_begin + 5;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put('\x7f');
    EXPECT_TRUE(f.good());
  }
  g.barrier().wait();
  std::vector<StateEntry> loaded;
  std::string err = load_reversed(dir.path(), loaded);
  EXPECT_NE(err.find("checksum mismatch in '" + file + "', tensor 'a.weight'"), std::string::npos) << err;
  g.barrier().wait();
  if (g.rank() == 0) {
    index["weight_map"].erase("b.weight");
    write_json(index_path, index);
  }
  g.barrier().wait();
  err = load_reversed(dir.path(), loaded, {.verify = false});
  EXPECT_EQ(err, "tensor b.weight kind master is not in checkpoint '" + dir.path() + "'");
}

// The collective load: the ranks together checksum every byte of the
// checkpoint once, including bytes no rank loads (the BF16 model weights,
// when the masters load from master_weights-*), and every rank reports the
// same mismatch.
TEST(UnifiedCheckpoint, CollectiveLoadChecksBytesNoRankLoads) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  save_unified(dir.path(), g, {.model_weights = true, .master_weights = true, .model_dtype = DType::BF16});
  std::vector<StateEntry> loaded = make_state(reversed_range, g.rank(), g.size(), false);
  EXPECT_EQ(error_of([&] { load_entries(read_catalog(dir.path()), loaded, {}, g); }), "");
  EXPECT_EQ(count_wrong(loaded), 0);

  nlohmann::json index = read_json(join(dir.path(), kModelIndexName));
  const std::string file = join(dir.path(), index["weight_map"]["b.weight"].get<std::string>());
  g.barrier().wait();
  if (g.rank() == 0) {
    const uint64_t at = SafetensorsFile(file).info("b.weight").data_begin + 9;
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(at));
    f.put('\x55');
    EXPECT_TRUE(f.good());
  }
  g.barrier().wait();
  loaded = make_state(reversed_range, g.rank(), g.size(), false);
  const std::string err = error_of([&] { load_entries(read_catalog(dir.path()), loaded, {}, g); });
  EXPECT_NE(err.find("checksum mismatch in '" + file + "', tensor 'b.weight' (b.weight kind model)"), std::string::npos)
      << err;
  EXPECT_EQ(error_of([&] { load_entries(read_catalog(dir.path()), loaded, {.verify = false}, g); }), "");
  EXPECT_EQ(count_wrong(loaded), 0);
}

TEST(UnifiedCheckpoint, CollectiveLoadRefusesNonFiniteValuesNamingTheTensor) {
  ProcessGroup& g = test::world();
  SharedDir dir(g);
  std::vector<StateEntry> saved = make_state(fsdp_range, g.rank(), g.size(), true);
  save(dir.path(), saved, {.layout = Layout::Sharded}, g);
  nlohmann::json index = read_json(join(dir.path(), kShardedIndexName));
  g.barrier().wait();
  // Overwrite element 0 of c.bias (1 element) with +Inf, fixing its checksum.
  if (g.rank() == 0) {
    for (auto& chunk : index["chunks"]) {
      if (chunk["fqn"] != "c.bias" || chunk["kind"] != "master") continue;
      const std::string file = join(dir.path(), chunk["file"].get<std::string>());
      const uint64_t at = SafetensorsFile(file).info(chunk["key"].get<std::string>()).data_begin;
      const float inf = std::numeric_limits<float>::infinity();
      std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(static_cast<std::streamoff>(at));
      f.write(reinterpret_cast<const char*>(&inf), sizeof inf);
      chunk["crc32c"] = crc32c(std::as_bytes(std::span(&inf, 1)));
    }
    write_json(join(dir.path(), kShardedIndexName), index);
  }
  g.barrier().wait();
  std::vector<StateEntry> loaded = make_state(reversed_range, g.rank(), g.size(), false);
  const std::string err =
      error_of([&] { load_entries(read_catalog(dir.path()), loaded, {.refuse_nonfinite = true}, g); });
  EXPECT_NE(err.find(dir.path() + ": tensor 'c.bias' (master) holds 0 NaN and 1 Inf values (the first at element 0)"),
            std::string::npos)
      << err;
}

TEST(AssignChecksumRanges, TilesEachVerifiedChunkInsideReadsThenSpreadsTheGaps) {
  // Chunk 0: 100 bytes read by rank 0 [0, 60) and rank 1 [40, 100) (overlap).
  // Chunk 1: nobody reads it (200 bytes). Chunk 2: not verified.
  // Chunk 3: rank 1 reads [10, 20) of 30.
  std::vector<ByteRange> reads{{0, 40, 100, 1}, {0, 0, 60, 0}, {2, 0, 5, 0}, {3, 10, 20, 1}};
  const std::vector<int64_t> sizes{100, 200, -1, 30};
  const std::vector<ByteRange> got = assign_checksum_ranges(reads, sizes, 2);
  auto at = [&](int64_t chunk) {
    std::vector<ByteRange> out;
    for (const ByteRange& r : got)
      if (r.chunk == chunk) out.push_back(r);
    return out;
  };
  const std::vector<ByteRange> c0 = at(0), c1 = at(1), c3 = at(3);
  ASSERT_EQ(c0.size(), 2u);
  EXPECT_EQ(c0[0].begin, 0);
  EXPECT_EQ(c0[0].end, 60);
  EXPECT_EQ(c0[0].rank, 0);
  EXPECT_EQ(c0[1].begin, 60);
  EXPECT_EQ(c0[1].end, 100);
  EXPECT_EQ(c0[1].rank, 1);
  ASSERT_EQ(c1.size(), 1u);
  EXPECT_EQ(c1[0].begin, 0);
  EXPECT_EQ(c1[0].end, 200);
  EXPECT_TRUE(at(2).empty());
  // Chunk 3: [10, 20) by its reader; the gaps [0, 10) and [20, 30) go to the
  // rank with fewer bytes so far.
  ASSERT_EQ(c3.size(), 3u);
  EXPECT_EQ(c3[1].rank, 1);
  EXPECT_EQ(c3[1].begin, 10);
  EXPECT_EQ(c3[0].end, 10);
  EXPECT_EQ(c3[2].begin, 20);
  EXPECT_EQ(c3[2].end, 30);
  // Loads before the gaps: rank 0 reads 65 bytes, rank 1 70; chunk 1 (200)
  // goes to rank 0, then both gaps of chunk 3 to rank 1 (70 < 265).
  EXPECT_EQ(c1[0].rank, 0);
  EXPECT_EQ(c3[0].rank, 1);
  EXPECT_EQ(c3[2].rank, 1);
}

}  // namespace
}  // namespace st::checkpoint
