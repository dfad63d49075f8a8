// The world-size-1 backend, Work's completion semantics, and launcher
// detection from the environment. One process, no MPI.
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/comm.h"
#include "tests/harness/test_util.h"

namespace st {
namespace {

constexpr DType kAllDtypes[] = {DType::F32, DType::BF16, DType::I32};

using st::test::count_wrong;

/// 1-D tensor of `dtype` with element i = first + i * step (exact in every dtype for small integers).
Tensor iota(int64_t n, float first, float step, DType dtype) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = first + static_cast<float>(i) * step;
  return Tensor::from_floats(v, {n}, dtype);
}

using st::test::error_of;

class LocalGroupTest : public ::testing::TestWithParam<DType> {
 protected:
  std::unique_ptr<ProcessGroup> group_ = make_local_group();
};

TEST(LocalGroup, Identity) {
  auto group = make_local_group();
  EXPECT_EQ(group->rank(), 0);
  EXPECT_EQ(group->size(), 1);
  EXPECT_EQ(group->backend_name(), "local");
}

TEST_P(LocalGroupTest, AllGatherCopies) {
  for (int64_t n : {0, 1, 7, 1000}) {
    Tensor in = iota(n, -3, 1, GetParam());
    Tensor out = Tensor::full({n}, 99, GetParam());
    Work work = group_->all_gather(out, in);
    EXPECT_TRUE(work.is_completed());
    work.wait();
    EXPECT_EQ(count_wrong(out, in), 0) << "n=" << n;
  }
}

TEST_P(LocalGroupTest, ReduceScatterSumAndAvgCopy) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    if (op == ReduceOp::Avg && GetParam() == DType::I32) continue;  // refused, see ArgumentErrors
    Tensor in = iota(7, -3, 1.5f, GetParam());
    Tensor out = Tensor::zeros({7}, GetParam());
    group_->reduce_scatter(out, in, {.op = op}).wait();
    EXPECT_EQ(count_wrong(out, in), 0) << op;
  }
}

TEST_P(LocalGroupTest, AllReduceIsIdentity) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    if (op == ReduceOp::Avg && GetParam() == DType::I32) continue;
    Tensor t = iota(9, -4, 1.25f, GetParam());
    Tensor want = t.clone();
    group_->all_reduce(t, {.op = op}).wait();
    EXPECT_EQ(count_wrong(t, want), 0) << op;
  }
}

TEST_P(LocalGroupTest, BroadcastFromRootZero) {
  Tensor t = iota(5, 1, 2, GetParam());
  Tensor want = t.clone();
  group_->broadcast(t, {.root = 0}).wait();
  EXPECT_EQ(count_wrong(t, want), 0);
}

TEST_P(LocalGroupTest, AllToAllvCopies) {
  for (int64_t n : {0, 6}) {
    Tensor in = iota(n, 10, 1, GetParam());
    Tensor out = Tensor::zeros({n}, GetParam());
    std::vector<int64_t> counts{n};
    group_->all_to_allv(out, counts, in, counts).wait();
    EXPECT_EQ(count_wrong(out, in), 0) << "n=" << n;
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, LocalGroupTest, ::testing::ValuesIn(kAllDtypes),
                         [](const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); });

TEST(LocalGroup, BarrierCompletesAtOnce) {
  auto group = make_local_group();
  Work work = group->barrier();
  EXPECT_TRUE(work.is_completed());
  work.wait();
}

TEST(LocalGroup, SplitGivesLocalGroupOrNull) {
  auto group = make_local_group();
  auto sub = group->split(/*color=*/3, /*key=*/-1);
  ASSERT_NE(sub, nullptr);
  EXPECT_EQ(sub->size(), 1);
  EXPECT_EQ(sub->rank(), 0);
  EXPECT_EQ(sub->backend_name(), "local");
  EXPECT_EQ(group->split(/*color=*/-1, /*key=*/0), nullptr);
}

TEST(LocalGroup, ArgumentErrors) {
  auto g = make_local_group();
  Tensor f3 = Tensor::zeros({3}, DType::F32);
  Tensor f4 = Tensor::zeros({4}, DType::F32);
  Tensor b3 = Tensor::zeros({3}, DType::BF16);
  Tensor i3 = Tensor::zeros({3}, DType::I32);

  EXPECT_EQ(error_of([&] { g->all_gather(f4, f3); }),
            "all_gather: out has 4 elements, expected size()*in.numel() = 1*3 = 3 (rank 0)");
  EXPECT_EQ(error_of([&] { g->all_gather(b3, f3); }),
            "all_gather: out is BF16 but in is F32; both must have the same dtype (rank 0)");
  EXPECT_EQ(error_of([&] { g->all_gather(Tensor(), f3); }), "all_gather: out is an undefined tensor (rank 0)");
  EXPECT_EQ(error_of([&] { g->reduce_scatter(f3, f4); }),
            "reduce_scatter: in has 4 elements, expected size()*out.numel() = 1*3 = 3 (rank 0)");
  EXPECT_EQ(error_of([&] { g->reduce_scatter(f3, f3, {.op = ReduceOp::Max}); }),
            "reduce_scatter: op Max is not supported, use Sum or Avg (rank 0)");
  EXPECT_NE(error_of([&] {
              g->reduce_scatter(i3, i3, {.op = ReduceOp::Avg});
            }).find("reduce_scatter: Avg of an I32 tensor is not supported"),
            std::string::npos);
  EXPECT_NE(error_of([&] { g->all_reduce(i3, {.op = ReduceOp::Avg}); }).find("all_reduce: Avg of an I32 tensor"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { g->broadcast(f3, {.root = 1}); }),
            "broadcast: root 1 is not a rank of this group of size 1 (rank 0)");

  std::vector<int64_t> three{3}, four{4}, two_entries{3, 0}, negative{-3};
  EXPECT_EQ(error_of([&] { g->all_to_allv(f3, three, f3, two_entries); }),
            "all_to_allv: send_counts has 2 entries, expected size() = 1 (rank 0)");
  EXPECT_EQ(error_of([&] { g->all_to_allv(f3, three, f3, negative); }),
            "all_to_allv: send_counts[0] = -3 is negative (rank 0)");
  EXPECT_EQ(error_of([&] { g->all_to_allv(f3, three, f3, four); }),
            "all_to_allv: in has 3 elements, expected sum(send_counts) = 4 (rank 0)");
  EXPECT_EQ(error_of([&] { g->all_to_allv(f4, four, f3, three); }),
            "all_to_allv: send_counts[0] = 3 but recv_counts[0] = 4; what a rank sends itself must match what it "
            "expects (rank 0)");
}

TEST(ReduceOp, Prints) {
  std::ostringstream os;
  os << ReduceOp::Sum << ' ' << ReduceOp::Avg << ' ' << ReduceOp::Max;
  EXPECT_EQ(os.str(), "Sum Avg Max");
}

// --- Work ------------------------------------------------------------------------

struct ImplLog {
  int waits = 0;
  bool done = false;
};

/// A backend Work that finishes when told to, optionally failing in wait().
class FakeImpl : public Work::Impl {
 public:
  FakeImpl(ImplLog& log, bool fail) : log_(log), fail_(fail) {}
  void wait() override {
    ++log_.waits;
    log_.done = true;
    if (fail_) ST_FAIL("all_reduce failed on rank 3: fake transport error");
  }
  bool test() override { return log_.done; }

 private:
  ImplLog& log_;
  bool fail_;
};

TEST(Work, DefaultIsComplete) {
  Work work;
  EXPECT_TRUE(work.is_completed());
  work.wait();
  work.wait();
}

TEST(Work, WaitRunsImplOnceAndIsIdempotent) {
  ImplLog log;
  Work work(std::make_unique<FakeImpl>(log, false));
  EXPECT_FALSE(work.is_completed());
  log.done = true;
  EXPECT_TRUE(work.is_completed());
  work.wait();
  work.wait();
  EXPECT_EQ(log.waits, 1);
  EXPECT_TRUE(work.is_completed());
}

TEST(Work, FailureResurfacesAtEveryWait) {
  ImplLog log;
  Work work(std::make_unique<FakeImpl>(log, true));
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(error_of([&] { work.wait(); }), "all_reduce failed on rank 3: fake transport error") << "wait #" << i;
  }
  EXPECT_EQ(log.waits, 1);
  // Already reported to the caller: the destructor stays quiet.
  ::testing::internal::CaptureStderr();
  { Work sink = std::move(work); }
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

TEST(Work, DestructorWaitsAndLogsWithoutThrowing) {
  ImplLog ok_log;
  { Work work(std::make_unique<FakeImpl>(ok_log, false)); }
  EXPECT_EQ(ok_log.waits, 1);

  ImplLog bad_log;
  ::testing::internal::CaptureStderr();
  { Work work(std::make_unique<FakeImpl>(bad_log, true)); }
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(bad_log.waits, 1);
  EXPECT_NE(err.find("fake transport error"), std::string::npos) << err;
}

TEST(Work, MoveAssignmentWaitsForTheReplacedWork) {
  ImplLog first, second;
  Work work(std::make_unique<FakeImpl>(first, false));
  work = Work(std::make_unique<FakeImpl>(second, false));
  EXPECT_EQ(first.waits, 1);
  EXPECT_EQ(second.waits, 0);
  work.wait();
  EXPECT_EQ(second.waits, 1);
}

// --- detect_world ------------------------------------------------------------------

/// Clears every launcher variable detect_world reads, sets the given ones,
/// and puts the original environment back when it goes out of scope.
class ScopedLauncherEnv {
 public:
  explicit ScopedLauncherEnv(std::initializer_list<std::pair<const char*, const char*>> vars) {
    for (const char* name : kNames) {
      const char* value = std::getenv(name);
      saved_.push_back({name, value ? std::optional<std::string>(value) : std::nullopt});
      unsetenv(name);
    }
    for (auto [name, value] : vars) setenv(name, value, 1);
  }
  ~ScopedLauncherEnv() {
    for (const auto& [name, value] : saved_) {
      if (value) {
        setenv(name, value->c_str(), 1);
      } else {
        unsetenv(name);
      }
    }
  }
  ScopedLauncherEnv(const ScopedLauncherEnv&) = delete;
  ScopedLauncherEnv& operator=(const ScopedLauncherEnv&) = delete;

 private:
  static constexpr const char* kNames[] = {"OMPI_COMM_WORLD_RANK",
                                           "OMPI_COMM_WORLD_SIZE",
                                           "OMPI_COMM_WORLD_LOCAL_RANK",
                                           "OMPI_COMM_WORLD_LOCAL_SIZE",
                                           "PMIX_RANK",
                                           "PMI_RANK",
                                           "PMI_SIZE",
                                           "MPI_LOCALRANKID",
                                           "MPI_LOCALNRANKS",
                                           "PMI_LOCAL_RANK",
                                           "PMI_LOCAL_SIZE",
                                           "SLURM_PROCID",
                                           "SLURM_NTASKS",
                                           "SLURM_LOCALID",
                                           "SLURM_NTASKS_PER_NODE",
                                           "SLURM_NPROCS",
                                           "RANK",
                                           "WORLD_SIZE",
                                           "LOCAL_RANK",
                                           "LOCAL_WORLD_SIZE"};
  std::vector<std::pair<const char*, std::optional<std::string>>> saved_;
};

void expect_world(const WorldInfo& w, int rank, int size, int local_rank, int local_size, bool launched) {
  EXPECT_EQ(w.rank, rank);
  EXPECT_EQ(w.size, size);
  EXPECT_EQ(w.local_rank, local_rank);
  EXPECT_EQ(w.local_size, local_size);
  EXPECT_EQ(w.launched, launched);
}

TEST(DetectWorld, NoLauncherIsOneProcess) {
  ScopedLauncherEnv env({});
  expect_world(detect_world(), 0, 1, 0, 1, false);
}

TEST(DetectWorld, OpenMpi) {
  ScopedLauncherEnv env({{"OMPI_COMM_WORLD_RANK", "2"},
                         {"OMPI_COMM_WORLD_SIZE", "4"},
                         {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                         {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                         {"PMIX_RANK", "7"},  // Open MPI's own variables win
                         {"SLURM_PROCID", "9"}});
  expect_world(detect_world(), 2, 4, 0, 2, true);
}

TEST(DetectWorld, MissingLocalInfoMeansOneHost) {
  ScopedLauncherEnv env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "5"}});
  expect_world(detect_world(), 3, 5, 3, 5, true);
}

TEST(DetectWorld, Pmi) {
  {
    ScopedLauncherEnv env({{"PMI_RANK", "1"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "1"}, {"MPI_LOCALNRANKS", "2"}});
    expect_world(detect_world(), 1, 3, 1, 2, true);
  }
  {
    ScopedLauncherEnv env({{"PMIX_RANK", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"}});
    expect_world(detect_world(), 5, 8, 1, 8, true);
  }
}

TEST(DetectWorld, SlurmWithPmi) {
  ScopedLauncherEnv env({{"PMI_RANK", "6"},
                         {"PMI_SIZE", "8"},
                         {"SLURM_PROCID", "6"},
                         {"SLURM_NTASKS", "8"},
                         {"SLURM_LOCALID", "2"},
                         {"SLURM_NTASKS_PER_NODE", "4"}});
  expect_world(detect_world(), 6, 8, 2, 4, true);
}

TEST(DetectWorld, SlurmSingleTaskIsAWorldOfOne) {
  ScopedLauncherEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  expect_world(detect_world(), 0, 1, 0, 1, true);
}

// Several processes without an MPI world would each run alone: refused.
TEST(DetectWorld, SeveralProcessesWithoutMpiAreRefused) {
  const std::string tail =
      "but there is no MPI world (none of OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMI_RANK or PMIX_RANK is set): each "
      "process would run alone, on the same files. Launch through MPI: scripts/launch -np ";
  {
    ScopedLauncherEnv env({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
    EXPECT_EQ(error_of([] { detect_world(); }),
              "this process was started as one of 2 processes by torchrun (WORLD_SIZE=2, RANK=1), " + tail +
                  "2 PROGRAM ... (mpirun), or srun --mpi=pmix");
  }
  {
    ScopedLauncherEnv env({{"LOCAL_RANK", "3"}});
    EXPECT_EQ(error_of([] { detect_world(); }),
              "this process was started as one of several processes by torchrun "
              "(LOCAL_RANK=3), " +
                  tail + "N PROGRAM ... (mpirun), or srun --mpi=pmix");
  }
  {
    ScopedLauncherEnv env({{"SLURM_NTASKS", "2"}, {"SLURM_PROCID", "0"}});
    EXPECT_EQ(error_of([] { detect_world(); }),
              "this process was started as one of 2 processes by Slurm (SLURM_NTASKS=2, SLURM_PROCID=0), " + tail +
                  "2 PROGRAM ... (mpirun), or srun --mpi=pmix");
  }
}

TEST(DetectWorld, OneProcessOrAnMpiWorldIsNotRefused) {
  {
    ScopedLauncherEnv env({{"SLURM_NTASKS", "4"}});  // an salloc shell: not a task
    expect_world(detect_world(), 0, 1, 0, 1, false);
  }
  {
    ScopedLauncherEnv env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"LOCAL_RANK", "0"}});
    expect_world(detect_world(), 0, 1, 0, 1, false);
  }
  {
    ScopedLauncherEnv env({{"RANK", "worker"}});  // not torchrun's
    expect_world(detect_world(), 0, 1, 0, 1, false);
  }
  {
    ScopedLauncherEnv env({{"OMPI_COMM_WORLD_RANK", "1"},
                           {"OMPI_COMM_WORLD_SIZE", "2"},
                           {"RANK", "1"},
                           {"WORLD_SIZE", "2"},
                           {"SLURM_NTASKS", "4"}});
    expect_world(detect_world(), 1, 2, 1, 2, true);
  }
}

TEST(DetectWorld, GarbageIsAnError) {
  for (const char* bad : {"abc", "3x", "", "-1", "+1", " 1", "99999999999"}) {
    ScopedLauncherEnv env({{"OMPI_COMM_WORLD_RANK", bad}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    std::string message = error_of([] { detect_world(); });
    EXPECT_NE(message.find(std::string("OMPI_COMM_WORLD_RANK='") + bad + "'"), std::string::npos)
        << "value '" << bad << "': " << message;
  }
  {
    ScopedLauncherEnv env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "0"}});
    EXPECT_NE(error_of([] { detect_world(); }).find("SLURM_NTASKS='0' is not an integer >= 1"), std::string::npos);
  }
}

TEST(DetectWorld, InconsistentValuesAreErrors) {
  {
    ScopedLauncherEnv env({{"OMPI_COMM_WORLD_RANK", "4"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
    EXPECT_EQ(error_of([] { detect_world(); }),
              "launcher environment: rank 4 (OMPI_COMM_WORLD_RANK) is not below the world size 4 "
              "(OMPI_COMM_WORLD_SIZE)");
  }
  {
    ScopedLauncherEnv env({{"OMPI_COMM_WORLD_RANK", "1"}});
    EXPECT_EQ(error_of([] { detect_world(); }),
              "Open MPI launch: OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not");
  }
  {
    ScopedLauncherEnv env({{"PMIX_RANK", "1"}});
    EXPECT_EQ(error_of([] { detect_world(); }),
              "PMIX_RANK=1 is set but neither PMI_SIZE nor SLURM_NTASKS gives the world size");
  }
  {
    ScopedLauncherEnv env({{"OMPI_COMM_WORLD_RANK", "1"},
                           {"OMPI_COMM_WORLD_SIZE", "4"},
                           {"OMPI_COMM_WORLD_LOCAL_RANK", "2"},
                           {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
    EXPECT_NE(error_of([] { detect_world(); }).find("local rank 2 (OMPI_COMM_WORLD_LOCAL_RANK) is not below"),
              std::string::npos);
  }
}

// --- CommRuntime without a launcher -------------------------------------------------

TEST(CommRuntime, AutoWithoutLauncherIsLocal) {
  ScopedLauncherEnv env({});
  CommRuntime runtime;
  EXPECT_EQ(runtime.world().backend_name(), "local");
  EXPECT_EQ(runtime.world().size(), 1);
  EXPECT_EQ(runtime.mpi_thread_provided(), -1);
  expect_world(runtime.info(), 0, 1, 0, 1, false);
  Tensor t = iota(3, 1, 1, DType::F32);
  runtime.world().all_reduce(t).wait();
  EXPECT_EQ(t.to_floats(), (std::vector<float>{1, 2, 3}));
}

TEST(CommRuntime, LocalRefusesAMultiRankLaunch) {
  ScopedLauncherEnv env({{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}});
  EXPECT_EQ(error_of([] { CommRuntime runtime(CommBackend::Local); }),
            "the local backend runs one process, but the launcher started 4 (this is rank 1); use CommBackend::Mpi "
            "or Auto");
}

}  // namespace
}  // namespace st
