// Collectives of the MPI backend at world sizes 1..4 (CTest runs this binary
// through mpirun as test_comm_np1..np4; 3 makes the sizes uneven).
//
// In the manner of nccl-tests, every input is crafted so that the exact
// result is known, and each check counts the wrong elements. Data-movement
// tests give every element a distinct id (see `ids`) and compare bits; sums
// use small integers, which are exact in every dtype. Around collectives only
// EXPECT_* is used, so a failing rank still joins the collectives that follow.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include "core/comm.h"
#include "tests/harness/mpi_env.h"
#include "tests/harness/test_util.h"

namespace st {
namespace {

using test::floats;
using test::ids;
using test::rounding_input;
using test::world;

constexpr DType kAllDtypes[] = {DType::F32, DType::BF16, DType::I32};

using st::test::count_wrong;

using st::test::error_of;

std::string dtype_test_name(const ::testing::TestParamInfo<DType>& p) { return std::string(dtype_name(p.param)); }

// --- the world -------------------------------------------------------------------

TEST(CommWorld, MatchesTheLauncher) {
  ProcessGroup& w = world();
  EXPECT_EQ(w.backend_name(), "mpi");
  WorldInfo info = detect_world();
  EXPECT_TRUE(info.launched);
  EXPECT_EQ(info.rank, w.rank());
  EXPECT_EQ(info.size, w.size());
  // CTest starts every rank on this host.
  EXPECT_EQ(info.local_rank, w.rank());
  EXPECT_EQ(info.local_size, w.size());
  EXPECT_EQ(test::runtime().info().rank, w.rank());
  EXPECT_EQ(test::runtime().info().size, w.size());
  int provided = test::runtime().mpi_thread_provided();
  EXPECT_GE(provided, MPI_THREAD_SINGLE);
  EXPECT_LE(provided, MPI_THREAD_MULTIPLE);
}

TEST(CommWorld, SecondRuntimeIsRefused) {
  for (CommBackend backend : {CommBackend::Mpi, CommBackend::Auto}) {
    std::string message = error_of([&] { CommRuntime again(backend); });
    EXPECT_NE(message.find("MPI is already initialised in this process"), std::string::npos) << message;
  }
  if (world().size() > 1) {
    std::string message = error_of([] { CommRuntime local(CommBackend::Local); });
    EXPECT_NE(message.find("the local backend runs one process"), std::string::npos) << message;
  }
}

// CTest starts every rank on this host, so no group spans hosts and the
// counter of bytes across hosts stays 0 whatever the collectives move
// (tests/e2e/check_cluster.py counts on real hosts).
TEST(CommWorld, OneHostSendsNothingAcrossHosts) {
  ProcessGroup& w = world();
  EXPECT_FALSE(w.spans_hosts());
  std::unique_ptr<ProcessGroup> sub = w.split(/*color=*/0, /*key=*/w.rank());
  ASSERT_NE(sub, nullptr);
  EXPECT_FALSE(sub->spans_hosts());
  Tensor t = Tensor::full({64}, 1.0, DType::F32);
  w.all_reduce(t).wait();
  sub->broadcast(t).wait();
  Tensor all = Tensor::empty({64 * w.size()}, DType::F32);
  sub->all_gather(all, t).wait();
  EXPECT_EQ(w.cross_host_bytes(), 0);
  EXPECT_EQ(sub->cross_host_bytes(), 0);
}

// --- every op x dtype ------------------------------------------------------------

class CommDtype : public ::testing::TestWithParam<DType> {
 protected:
  DType dtype() const { return GetParam(); }
  int rank() const { return world().rank(); }
  int size() const { return world().size(); }
};

TEST_P(CommDtype, AllGather) {
  for (int64_t n : {0, 1, 7, 1000}) {
    int r = rank();
    Tensor in = ids(dtype(), n, [&](int64_t i) { return r * 1000 + i; });
    Tensor out = Tensor::zeros({size() * n}, dtype());
    world().all_gather(out, in).wait();
    Tensor want = ids(dtype(), size() * n, [&](int64_t j) { return (j / n) * 1000 + j % n; });
    EXPECT_EQ(count_wrong(out, want), 0) << "n=" << n;
  }
}

TEST_P(CommDtype, AllGatherInPlace) {
  // FSDP's layout: the shard already sits in its slot of the gathered buffer.
  int64_t n = 7;
  Tensor out = Tensor::zeros({size() * n}, dtype());
  Tensor shard = out.flat_slice(rank() * n, n);
  int r = rank();
  shard.copy_from(ids(dtype(), n, [&](int64_t i) { return r * 1000 + i; }));
  world().all_gather(out, shard).wait();
  Tensor want = ids(dtype(), size() * n, [&](int64_t j) { return (j / n) * 1000 + j % n; });
  EXPECT_EQ(count_wrong(out, want), 0);
}

/// Rank r's element j for the sum tests: small integers of both signs.
float sum_input(int r, int64_t j) { return static_cast<float>((r + 1) * (static_cast<int>(j % 5) - 2)); }

/// The exact result of op over ranks of sum_input(., j), in `dtype`.
float reduced(ReduceOp op, int size, int64_t j) {
  double sum = 0;
  for (int r = 0; r < size; ++r) sum += sum_input(r, j);
  auto exact = static_cast<float>(sum);
  return op == ReduceOp::Avg ? exact / static_cast<float>(size) : exact;
}

TEST_P(CommDtype, ReduceScatter) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    if (op == ReduceOp::Avg && dtype() == DType::I32) continue;  // refused, see ArgumentErrors
    for (int64_t n : {0, 1, 7, 3001}) {
      std::vector<float> in_values(static_cast<size_t>(size() * n));
      for (size_t j = 0; j < in_values.size(); ++j) in_values[j] = sum_input(rank(), static_cast<int64_t>(j));
      Tensor in = floats(in_values, dtype());
      Tensor out = Tensor::full({n}, 77, dtype());
      world().reduce_scatter(out, in, {.op = op}).wait();
      std::vector<float> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = reduced(op, size(), rank() * n + i);
      EXPECT_EQ(count_wrong(out, floats(want, dtype())), 0) << op << " n=" << n;
    }
  }
}

TEST_P(CommDtype, AllReduceSumAvg) {
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    if (op == ReduceOp::Avg && dtype() == DType::I32) continue;
    for (int64_t n : {0, 1, 7, 10007}) {
      std::vector<float> values(static_cast<size_t>(n)), want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        values[static_cast<size_t>(i)] = sum_input(rank(), i);
        want[static_cast<size_t>(i)] = reduced(op, size(), i);
      }
      Tensor t = floats(values, dtype());
      world().all_reduce(t, {.op = op}).wait();
      EXPECT_EQ(count_wrong(t, floats(want, dtype())), 0) << op << " n=" << n;
    }
  }
}

TEST_P(CommDtype, AllReduceMax) {
  // Negative values throughout; which rank holds the maximum varies by element.
  auto value = [](int r, int64_t i) { return static_cast<float>((r * 3 + i) % 11) - 20.0f; };
  for (int64_t n : {1, 7, 4099}) {
    std::vector<float> values(static_cast<size_t>(n)), want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      values[static_cast<size_t>(i)] = value(rank(), i);
      float m = value(0, i);
      for (int r = 1; r < size(); ++r) m = std::max(m, value(r, i));
      want[static_cast<size_t>(i)] = m;
    }
    Tensor t = floats(values, dtype());
    world().all_reduce(t, {.op = ReduceOp::Max}).wait();
    EXPECT_EQ(count_wrong(t, floats(want, dtype())), 0) << "n=" << n;
  }
}

TEST_P(CommDtype, BroadcastFromEveryRoot) {
  for (int root = 0; root < size(); ++root) {
    for (int64_t n : {0, 7, 2053}) {
      int r = rank();
      Tensor t = ids(dtype(), n, [&](int64_t i) { return r * 3000 + i % 3000; });
      world().broadcast(t, {.root = root}).wait();
      Tensor want = ids(dtype(), n, [&](int64_t i) { return root * 3000 + i % 3000; });
      EXPECT_EQ(count_wrong(t, want), 0) << "root=" << root << " n=" << n;
    }
  }
}

/// Elements rank `src` sends rank `dst` in the all_to_allv test: 0..3, with
/// zeros scattered about, and the last rank (of several) sends nothing at all.
int64_t a2a_count(int src, int dst, int size) {
  if (size > 1 && src == size - 1) return 0;
  return (src + 2 * dst + 1) % 4;
}

TEST_P(CommDtype, AllToAllv) {
  int me = rank();
  int n_ranks = size();
  std::vector<int64_t> send_counts, recv_counts;
  std::vector<int64_t> send_ids, want_ids;
  for (int peer = 0; peer < n_ranks; ++peer) {
    send_counts.push_back(a2a_count(me, peer, n_ranks));
    recv_counts.push_back(a2a_count(peer, me, n_ranks));
    for (int64_t k = 0; k < send_counts.back(); ++k) send_ids.push_back(me * 1000 + peer * 100 + k);
    for (int64_t k = 0; k < recv_counts.back(); ++k) want_ids.push_back(peer * 1000 + me * 100 + k);
  }
  auto n_in = static_cast<int64_t>(send_ids.size());
  auto n_out = static_cast<int64_t>(want_ids.size());
  Tensor in = ids(dtype(), n_in, [&](int64_t i) { return send_ids[static_cast<size_t>(i)]; });
  Tensor out = Tensor::full({n_out}, 5, dtype());
  world().all_to_allv(out, recv_counts, in, send_counts).wait();
  Tensor want = ids(dtype(), n_out, [&](int64_t i) { return want_ids[static_cast<size_t>(i)]; });
  EXPECT_EQ(count_wrong(out, want), 0);
  if (n_ranks > 1 && me == n_ranks - 1) {
    EXPECT_EQ(n_in, 0);  // the rank that sends nothing took part too
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CommDtype, ::testing::ValuesIn(kAllDtypes), dtype_test_name);

// --- reductions: NaN and rounding -------------------------------------------------

class CommFloat : public ::testing::TestWithParam<DType> {};

TEST_P(CommFloat, MaxPropagatesNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  int r = world().rank();
  int last = world().size() - 1;
  // 0: NaN on the last rank; 1: NaN on rank 0; 2: none; 3: NaN everywhere;
  // 4: -0 on even ranks and +0 on odd ones (+0 wins when both take part).
  std::vector<float> values{r == last ? nan : -1.0f * static_cast<float>(r), r == 0 ? nan : 2.0f,
                            -3.0f - static_cast<float>(r), nan, r % 2 == 0 ? -0.0f : 0.0f};
  Tensor t = floats(values, GetParam());
  world().all_reduce(t, {.op = ReduceOp::Max}).wait();
  std::vector<float> got = t.to_floats();
  int wrong = 0;
  wrong += !std::isnan(got[0]);
  wrong += !std::isnan(got[1]);
  wrong += got[2] != -3.0f;
  wrong += !std::isnan(got[3]);
  wrong += std::signbit(got[4]) != (world().size() == 1) || got[4] != 0.0f;
  EXPECT_EQ(wrong, 0) << "got " << got[0] << ' ' << got[1] << ' ' << got[2] << ' ' << got[3] << ' ' << got[4];
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CommFloat, ::testing::Values(DType::F32, DType::BF16), dtype_test_name);

TEST(CommBf16, SumAndAvgRoundOnce) {
  const int64_t n = 5;
  int size = world().size();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    std::vector<float> mine(n), want(n);
    int64_t other_rounding_differs = 0;
    for (int64_t j = 0; j < n; ++j) {
      mine[j] = rounding_input(world().rank(), j);
      double exact = 0;
      float pairwise = 0;  // rounding after every addition
      for (int r = 0; r < size; ++r) {
        exact += rounding_input(r, j);
        pairwise = round_to_bf16(pairwise + rounding_input(r, j));
      }
      auto sum = static_cast<float>(exact);
      auto divisor = static_cast<float>(size);
      want[j] = round_to_bf16(op == ReduceOp::Avg ? sum / divisor : sum);
      float other = op == ReduceOp::Avg ? round_to_bf16(round_to_bf16(sum) / divisor) : pairwise;
      other_rounding_differs += other != want[j];
    }
    // The inputs only test something where the other roundings disagree.
    if (size >= 3 && op == ReduceOp::Sum) {
      EXPECT_GE(other_rounding_differs, 2);
    }
    if (size == 3 && op == ReduceOp::Avg) {
      EXPECT_GE(other_rounding_differs, 1);
    }

    Tensor t = floats(mine, DType::BF16);
    world().all_reduce(t, {.op = op}).wait();
    EXPECT_EQ(count_wrong(t, floats(want, DType::BF16)), 0) << "all_reduce " << op;

    // The same reduction through reduce_scatter: every rank's segment is `mine`.
    std::vector<float> in_values;
    for (int r = 0; r < size; ++r) in_values.insert(in_values.end(), mine.begin(), mine.end());
    Tensor out = Tensor::zeros({n}, DType::BF16);
    world().reduce_scatter(out, floats(in_values, DType::BF16), {.op = op}).wait();
    EXPECT_EQ(count_wrong(out, floats(want, DType::BF16)), 0) << "reduce_scatter " << op;
  }
}

// --- barrier, split, several Works ------------------------------------------------

TEST(CommBarrier, NobodyLeavesBeforeEveryoneArrived) {
  // Each rank leaves a file before the barrier and counts the files after
  // it; rank 0 arrives late, so without a barrier the others would miss its file.
  int r = world().rank();
  Tensor token = Tensor::from_vector(std::vector<int32_t>{r == 0 ? static_cast<int32_t>(getpid()) : 0}, {1});
  std::filesystem::path dir;
  if (r == 0) {
    dir = std::filesystem::path(::testing::TempDir()) / ("st_barrier_" + std::to_string(token.data<int32_t>()[0]));
    std::filesystem::create_directories(dir);  // before the broadcast lets anyone use it
  }
  world().broadcast(token).wait();
  dir = std::filesystem::path(::testing::TempDir()) / ("st_barrier_" + std::to_string(token.data<int32_t>()[0]));

  if (r == 0 && world().size() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  { std::ofstream(dir / std::to_string(r)) << r; }
  Work work = world().barrier();
  work.wait();
  EXPECT_TRUE(work.is_completed());
  int64_t files = std::distance(std::filesystem::directory_iterator(dir), std::filesystem::directory_iterator());
  EXPECT_EQ(files, world().size());

  world().barrier().wait();  // everyone counted before rank 0 cleans up
  if (r == 0) std::filesystem::remove_all(dir);
}

TEST(CommSplit, ByParityOrderedByKey) {
  int r = world().rank();
  int size = world().size();
  std::vector<int> members;  // world ranks of my parity, in sub-group order (key = -rank: descending)
  for (int q = size - 1; q >= 0; --q) {
    if (q % 2 == r % 2) members.push_back(q);
  }
  int want_sub_rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());

  std::unique_ptr<ProcessGroup> sub = world().split(/*color=*/r % 2, /*key=*/-r);
  EXPECT_NE(sub, nullptr);
  if (!sub) return;
  EXPECT_EQ(sub->backend_name(), "mpi");
  EXPECT_EQ(sub->size(), static_cast<int>(members.size()));
  EXPECT_EQ(sub->rank(), want_sub_rank);

  // The gather lists world ranks in sub-group order.
  Tensor mine = Tensor::from_vector(std::vector<int32_t>{r}, {1});
  Tensor gathered = Tensor::zeros({static_cast<int64_t>(members.size())}, DType::I32);
  sub->all_gather(gathered, mine).wait();
  EXPECT_EQ(count_wrong(gathered, Tensor::from_vector(std::vector<int32_t>(members.begin(), members.end()),
                                                      {static_cast<int64_t>(members.size())})),
            0);

  // A sum within the sub-group covers exactly its members.
  Tensor t = floats({static_cast<float>(r + 1), static_cast<float>(10 * (r + 1))}, DType::F32);
  sub->all_reduce(t).wait();
  float sum = 0;
  for (int q : members) sum += static_cast<float>(q + 1);
  EXPECT_EQ(count_wrong(t, floats({sum, 10 * sum}, DType::F32)), 0);

  // Collectives of the two sub-groups and of the world interleave safely.
  Work sub_work = sub->barrier();
  world().barrier().wait();
  sub_work.wait();
}

TEST(CommSplit, NegativeColorTakesNoPart) {
  int r = world().rank();
  std::unique_ptr<ProcessGroup> sub = world().split(r == 0 ? -1 : 0, /*key=*/r);
  if (r == 0) {
    EXPECT_EQ(sub, nullptr);
    return;
  }
  EXPECT_NE(sub, nullptr);
  if (!sub) return;
  EXPECT_EQ(sub->size(), world().size() - 1);
  EXPECT_EQ(sub->rank(), r - 1);
  Tensor t = Tensor::from_vector(std::vector<int32_t>{r}, {1});
  sub->all_reduce(t, {.op = ReduceOp::Max}).wait();
  EXPECT_EQ(t.data<int32_t>()[0], world().size() - 1);
}

TEST(CommWork, SeveralOutstandingWaitedInReverse) {
  int r = world().rank();
  int size = world().size();
  const int64_t n = 513;
  Tensor sum = Tensor::full({n}, r + 1, DType::F32);
  Tensor gathered = Tensor::zeros({size * n}, DType::BF16);
  Tensor shard = ids(DType::BF16, n, [&](int64_t i) { return r * 1000 + i; });
  Tensor bcast = ids(DType::I32, n, [&](int64_t i) { return r * 1000 + i; });
  Tensor bf_sum = Tensor::full({n}, 2 * r, DType::BF16);
  Tensor rs_in = Tensor::full({size * n}, 1, DType::F32);
  Tensor rs_out = Tensor::zeros({n}, DType::F32);

  std::vector<Work> works;
  works.push_back(world().all_reduce(sum));
  works.push_back(world().all_gather(gathered, shard));
  works.push_back(world().broadcast(bcast, {.root = size - 1}));
  works.push_back(world().all_reduce(bf_sum, {.op = ReduceOp::Avg}));
  works.push_back(world().barrier());
  works.push_back(world().reduce_scatter(rs_out, rs_in));
  while (!works.front().is_completed()) {
  }
  for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
  for (Work& w : works) EXPECT_TRUE(w.is_completed());

  float ranks_sum = static_cast<float>(size * (size + 1)) / 2;
  EXPECT_EQ(count_wrong(sum, Tensor::full({n}, ranks_sum, DType::F32)), 0);
  EXPECT_EQ(count_wrong(gathered, ids(DType::BF16, size * n, [&](int64_t j) { return (j / n) * 1000 + j % n; })), 0);
  EXPECT_EQ(count_wrong(bcast, ids(DType::I32, n, [&](int64_t i) { return (size - 1) * 1000 + i; })), 0);
  EXPECT_EQ(count_wrong(bf_sum, Tensor::full({n}, size - 1, DType::BF16)), 0);  // mean of 0, 2, .., 2(size-1)
  EXPECT_EQ(count_wrong(rs_out, Tensor::full({n}, size, DType::F32)), 0);
}

// --- argument errors ---------------------------------------------------------------

TEST(CommErrors, ArgumentSizesAreCheckedAtTheCallOnEveryRank) {
  // Every rank makes the same bad calls, so no rank is left in a collective.
  int r = world().rank();
  int size = world().size();
  Tensor in3 = Tensor::zeros({3}, DType::F32);
  Tensor bad_out = Tensor::zeros({size * 3 + 1}, DType::F32);
  EXPECT_EQ(error_of([&] { world().all_gather(bad_out, in3); }),
            format("all_gather: out has {} elements, expected size()*in.numel() = {}*3 = {} (rank {})", size * 3 + 1,
                   size, size * 3, r));
  EXPECT_EQ(error_of([&] { world().reduce_scatter(in3, bad_out); }),
            format("reduce_scatter: in has {} elements, expected size()*out.numel() = {}*3 = {} (rank {})",
                   size * 3 + 1, size, size * 3, r));
  Tensor bf_out = Tensor::zeros({size * 3}, DType::BF16);
  EXPECT_EQ(error_of([&] { world().all_gather(bf_out, in3); }),
            format("all_gather: out is BF16 but in is F32; both must have the same dtype (rank {})", r));
  EXPECT_EQ(
      error_of([&] { world().reduce_scatter(in3, Tensor::zeros({size * 3}, DType::F32), {.op = ReduceOp::Max}); }),
      format("reduce_scatter: op Max is not supported, use Sum or Avg (rank {})", r));
  EXPECT_EQ(error_of([&] { world().all_reduce(Tensor::zeros({2}, DType::I32), {.op = ReduceOp::Avg}); }),
            format("all_reduce: Avg of an I32 tensor is not supported (integer division would truncate); use Sum and "
                   "divide (rank {})",
                   r));
  EXPECT_EQ(error_of([&] { world().broadcast(in3, {.root = size}); }),
            format("broadcast: root {} is not a rank of this group of size {} (rank {})", size, size, r));
  std::vector<int64_t> short_counts(static_cast<size_t>(size + 1), 0);
  EXPECT_EQ(error_of([&] { world().all_to_allv(in3, short_counts, in3, short_counts); }),
            format("all_to_allv: send_counts has {} entries, expected size() = {} (rank {})", size + 1, size, r));
  std::vector<int64_t> counts(static_cast<size_t>(size), 2);  // sums to 2*size, never 3
  EXPECT_EQ(error_of([&] { world().all_to_allv(in3, counts, in3, counts); }),
            format("all_to_allv: in has 3 elements, expected sum(send_counts) = {} (rank {})", 2 * size, r));

  // Nothing was left half-started: the group still works.
  Tensor t = Tensor::full({3}, 1, DType::I32);
  world().all_reduce(t).wait();
  EXPECT_EQ(count_wrong(t, Tensor::full({3}, size, DType::I32)), 0);
}

}  // namespace
}  // namespace st

namespace st {
namespace {

TEST(CommStrings, BroadcastAndAllGatherStrings) {
  ProcessGroup& w = test::world();
  const int p = w.size();
  // Lengths 0, 1, 2, ... bytes: some not a multiple of the 4-byte word, one empty.
  const std::string mine(static_cast<size_t>(w.rank()), static_cast<char>('a' + w.rank()));
  std::vector<std::string> all = all_gather_strings(w, mine);
  ASSERT_EQ(all.size(), static_cast<size_t>(p));
  for (int r = 0; r < p; ++r) EXPECT_EQ(all[static_cast<size_t>(r)], std::string(r, static_cast<char>('a' + r)));
  const std::string from_last = broadcast_string(w, "root " + std::to_string(w.rank()) + " says hi", p - 1);
  EXPECT_EQ(from_last, "root " + std::to_string(p - 1) + " says hi");
}

}  // namespace
}  // namespace st
