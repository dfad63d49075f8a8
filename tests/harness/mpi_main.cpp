// main() of the multi-rank test binaries (launched by CTest through mpirun).
// Rank 0 prints GoogleTest's usual report; the other ranks print only their
// failures, each line prefixed with the rank. At the end the failure counts
// of all ranks are summed, so every rank exits non-zero when any rank failed
// and mpirun's exit status tells the truth.
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/comm.h"
#include "core/cpu/parallel.h"
#include "tests/harness/mpi_env.h"
#include "tests/harness/test_util.h"

namespace st::test {
namespace {

// The harness's one piece of shared state: tests reach the runtime that main()
// owns through runtime(). Set for exactly the duration of RUN_ALL_TESTS().
CommRuntime*& runtime_slot() {
  static CommRuntime* slot = nullptr;
  return slot;
}

/// Failure lines for ranks other than 0, whose default printer is removed.
class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::string prefix = "[rank " + std::to_string(rank_) + "] ";
    std::string text = prefix + (result.file_name() ? result.file_name() : "unknown file") + ":" +
                       std::to_string(result.line_number()) + ": Failure\n";
    std::string message = result.message();
    size_t begin = 0;
    while (begin <= message.size()) {
      size_t end = message.find('\n', begin);
      if (end == std::string::npos) end = message.size();
      text += prefix + message.substr(begin, end - begin) + "\n";
      begin = end + 1;
    }
    std::fputs(text.c_str(), stderr);
  }

  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed())
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(), info.name());
  }

 private:
  int rank_;
};

}  // namespace

CommRuntime& runtime() {
  ST_CHECK(runtime_slot() != nullptr, "st::test::runtime() used outside the test run of tests/harness/mpi_main.cpp");
  return *runtime_slot();
}

}  // namespace st::test

// As the trainer does: OpenMP threads spin only briefly while they wait, and
// each rank takes its share of the host's cores. CTest starts up to 4 ranks on a
// 2-core machine; with libgomp's spin and 2 threads per rank, test_fsdp at
// 4 ranks took minutes instead of seconds.
ST_SHORT_OPENMP_SPIN();

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  int rank = -1;
  try {
    st::cpu::set_cpu_threads(st::cpu::auto_cpu_threads(st::detect_world().local_size));
    // MPI even at one rank, so np1 exercises the same backend as np4.
    st::CommRuntime runtime(st::CommBackend::Mpi);
    st::ProcessGroup& world = runtime.world();
    rank = world.rank();
    if (rank != 0) {
      ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
      std::unique_ptr<::testing::TestEventListener> quiet(listeners.Release(listeners.default_result_printer()));
      listeners.Append(std::make_unique<st::test::RankFailurePrinter>(rank).release());
    }

    st::test::runtime_slot() = &runtime;
    int rc = RUN_ALL_TESTS();
    st::test::runtime_slot() = nullptr;

    const ::testing::UnitTest& unit = *::testing::UnitTest::GetInstance();
    // A non-zero rc without a failed test is a failure outside any test (e.g. in an environment).
    int failed = unit.failed_test_count() + (rc != 0 && unit.failed_test_count() == 0 ? 1 : 0);
    const int skipped_all = st::test::all_skipped(unit) ? 1 : 0;
    std::vector<int32_t> counts{failed, failed > 0 ? 1 : 0, skipped_all};
    st::Tensor totals = st::Tensor::from_vector(counts, {3});
    world.all_reduce(totals).wait();
    int total_failed = totals.data<int32_t>()[0];
    int ranks_failed = totals.data<int32_t>()[1];
    // Skipped only when every rank skipped everything: no rank asserted anything.
    if (total_failed == 0 && totals.data<int32_t>()[2] == world.size()) return st::test::kSkippedExitCode;
    if (rank == 0 && total_failed > 0) {
      std::fprintf(stderr, "%d failed test(s) over %d of %d rank(s)\n", total_failed, ranks_failed, world.size());
    }
    return total_failed > 0 ? 1 : 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] test harness: %s\n", rank, e.what());
    return 1;
  }
}
