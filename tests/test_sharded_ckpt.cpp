// Sharded checkpoints: save under this run's FSDP-like partition, load under a
// different one (reversed ranks, full tensors, BF16), and check every element
// exactly. Also the read planner on its own, and the errors for a flipped
// byte and a missing shard file.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <stdlib.h>

#include "checkpoint/safetensors.h"
#include "checkpoint/sharded.h"
#include "core/comm.h"
#include "core/state.h"
#include "tests/mpi_env.h"

namespace st::checkpoint {
namespace {

namespace fs = std::filesystem;

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

std::vector<StateEntry> make_entries(Range (*range)(int64_t, int, int), int rank, int world, DType dtype, bool fill) {
  std::vector<StateEntry> out;
  for (size_t t = 0; t < specs().size(); ++t) {
    const TensorSpec& s = specs()[t];
    Range r = range(shape_numel(s.shape), rank, world);
    std::vector<float> vals(static_cast<size_t>(r.numel), -1.0f);
    if (fill)
      for (int64_t i = 0; i < r.numel; ++i) vals[static_cast<size_t>(i)] = value_of(t, r.begin + i);
    out.push_back(StateEntry{s.fqn, "master", s.shape, dtype, r.begin, Tensor::from_floats(vals, {r.numel}, dtype)});
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
      float want = value_of(t, entries[t].begin + static_cast<int64_t>(i));
      if (entries[t].local.dtype() == DType::BF16) want = round_to_bf16(want);
      if (got[i] != want) ++wrong;
    }
  }
  return wrong;
}

// The message of the st::Error `f` throws, or "" when it does not throw.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.message();
  }
  return "";
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
  EXPECT_EQ(reads[0].file, "f1");
  EXPECT_EQ(reads[0].key, "k1");
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
  EXPECT_EQ(reads[0].key, "k0");
  EXPECT_EQ(reads[0].chunk_offset_elems, 5);
  EXPECT_EQ(reads[0].entry_offset_elems, 0);
  EXPECT_EQ(reads[0].count, 5);
  EXPECT_EQ(reads[1].key, "k1");
  EXPECT_EQ(reads[1].chunk_offset_elems, 0);
  EXPECT_EQ(reads[1].entry_offset_elems, 5);
  EXPECT_EQ(reads[1].count, 10);
  EXPECT_EQ(reads[2].key, "k2");
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
            "tensor b.weight kind master: checkpoint has shape [10, 3], model has [3, 10]");
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
  EXPECT_NE(err.find("checksum mismatch in '" + file + "' key '" + key + "'"), std::string::npos) << err;
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

}  // namespace
}  // namespace st::checkpoint
