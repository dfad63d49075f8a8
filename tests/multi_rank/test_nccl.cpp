// The NCCL backend (core/comm_nccl.cpp), its kernels (core/cuda/comm_kernels.h)
// and the MPI backend's staging of GPU tensors. CTest runs this binary through
// mpirun at world size 1 (test_nccl_np1, labels mpi;cuda); every expected value
// is a function of the world size and rank, so it also holds under more ranks
// (one GPU per rank for the NCCL tests: rank -> cuda:local_rank % device_count).
//
// As in tests/multi_rank/test_comm.cpp (nccl-tests style), the collective inputs are
// crafted so the exact result is known and each check counts wrong elements.
// The kernels and the staging path are also compared against their CPU
// references on fresh random inputs. Without a GPU, or in a build without
// NCCL, the tests skip. Around collectives only EXPECT_* is used, so a failing
// rank still joins the collectives that follow.
#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/comm.h"
#include "core/cuda/cuda_runtime.h"
#include "tests/harness/mpi_env.h"
#include "tests/harness/test_util.h"

#if ST_WITH_CUDA
#include "core/cuda/stream.h"
#endif
#if ST_WITH_NCCL
#include "core/cuda/comm_kernels.h"
#endif

namespace st {
namespace {

using test::count_wrong;
using test::error_of;
using test::floats;
using test::ids;
using test::rounding_input;
using test::world;

constexpr DType kAllDtypes[] = {DType::F32, DType::BF16, DType::I32};
constexpr int64_t kSizes[] = {1, 7, 1000003};

/// The GPU this rank uses: one per local rank, as the trainer picks it.
int gpu_index() { return test::runtime().info().local_rank % std::max(cuda::device_count(), 1); }
Device gpu() { return Device::cuda(gpu_index()); }

/// Why this run cannot test the NCCL group ("" when it can). The same on
/// every rank of one host, so every rank skips the same tests.
std::string nccl_skip_reason() {
  if (cuda::device_count() == 0) return "no CUDA GPU is visible";
  if (!nccl_available()) return "built without NCCL";
  if (test::runtime().info().local_size > cuda::device_count())
    return "more ranks on this host than GPUs (NCCL needs one GPU per rank)";
  return "";
}

Tensor host(const Tensor& t) { return t.to(Device::cpu()); }
Tensor on_gpu(const Tensor& t) { return t.to(gpu()); }

/// Rank r's element j for the sum tests: small integers of both signs, so
/// every partial sum is exact in every dtype.
float sum_input(int r, int64_t j) { return static_cast<float>((r + 1) * (static_cast<int>(j % 5) - 2)); }

/// The exact result of Sum/Avg over ranks of sum_input(., j), before rounding to the dtype.
float reduced(ReduceOp op, int size, int64_t j) {
  double sum = 0;
  for (int r = 0; r < size; ++r) sum += sum_input(r, j);
  auto exact = static_cast<float>(sum);
  return op == ReduceOp::Avg ? exact / static_cast<float>(size) : exact;
}

std::string label(DType dtype, int64_t n) { return format("{} n={}", dtype, n); }

// --- the NCCL group on crafted inputs ------------------------------------------------

/// One NCCL group over the world for the whole suite (creating one takes a
/// while), released before main() finalises MPI.
class Nccl : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    if (!nccl_skip_reason().empty()) return;
    try {
      group_ = make_nccl_group(world(), gpu_index());
    } catch (const std::exception& e) {
      setup_error_ = e.what();
    }
  }
  static void TearDownTestSuite() { group_.reset(); }

 protected:
  void SetUp() override {
    std::string reason = nccl_skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    ASSERT_NE(group_, nullptr) << "make_nccl_group failed: " << setup_error_;
  }
  static ProcessGroup& nccl() { return *group_; }
  static int rank() { return group_->rank(); }
  static int size() { return group_->size(); }

 private:
  static inline std::unique_ptr<ProcessGroup> group_;
  static inline std::string setup_error_;
};

TEST_F(Nccl, SpansTheWorld) {
  EXPECT_EQ(nccl().backend_name(), "nccl");
  EXPECT_EQ(rank(), world().rank());
  EXPECT_EQ(size(), world().size());
}

TEST_F(Nccl, AllGather) {
  for (DType dtype : kAllDtypes) {
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000003}}) {
      int r = rank();
      Tensor in = on_gpu(ids(dtype, n, [&](int64_t i) { return r * n + i; }));
      Tensor out = on_gpu(Tensor::full({size() * n}, 3, dtype));
      nccl().all_gather(out, in).wait();
      Tensor want = ids(dtype, size() * n, [](int64_t j) { return j; });
      EXPECT_EQ(count_wrong(host(out), want), 0) << label(dtype, n);
    }
  }
}

TEST_F(Nccl, AllGatherInPlace) {
  // FSDP's layout: the shard already sits in its slot of the gathered buffer.
  for (DType dtype : kAllDtypes) {
    for (int64_t n : kSizes) {
      int r = rank();
      Tensor out = on_gpu(Tensor::full({size() * n}, 3, dtype));
      Tensor shard = out.flat_slice(r * n, n);
      shard.copy_from(on_gpu(ids(dtype, n, [&](int64_t i) { return r * n + i; })));
      nccl().all_gather(out, shard).wait();
      Tensor want = ids(dtype, size() * n, [](int64_t j) { return j; });
      EXPECT_EQ(count_wrong(host(out), want), 0) << label(dtype, n);
    }
  }
}

TEST_F(Nccl, ReduceScatter) {
  for (DType dtype : kAllDtypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      if (op == ReduceOp::Avg && dtype == DType::I32) continue;  // refused, see ArgumentErrors
      for (int64_t n : kSizes) {
        std::vector<float> in_values(static_cast<size_t>(size() * n));
        for (size_t j = 0; j < in_values.size(); ++j) in_values[j] = sum_input(rank(), static_cast<int64_t>(j));
        Tensor out = on_gpu(Tensor::full({n}, 77, dtype));
        nccl().reduce_scatter(out, on_gpu(floats(in_values, dtype)), {.op = op}).wait();
        std::vector<float> want(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = reduced(op, size(), rank() * n + i);
        EXPECT_EQ(count_wrong(host(out), floats(want, dtype)), 0) << op << ' ' << label(dtype, n);
      }
    }
  }
}

TEST_F(Nccl, ReduceScatterInPlace) {
  // The output is this rank's segment of the input (NCCL's in-place form).
  for (DType dtype : kAllDtypes) {
    const int64_t n = 1001;
    std::vector<float> in_values(static_cast<size_t>(size() * n));
    for (size_t j = 0; j < in_values.size(); ++j) in_values[j] = sum_input(rank(), static_cast<int64_t>(j));
    Tensor in = on_gpu(floats(in_values, dtype));
    Tensor out = in.flat_slice(rank() * n, n);
    nccl().reduce_scatter(out, in).wait();
    std::vector<float> want(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = reduced(ReduceOp::Sum, size(), rank() * n + i);
    EXPECT_EQ(count_wrong(host(out), floats(want, dtype)), 0) << dtype;
  }
}

TEST_F(Nccl, AllReduceSumAvg) {
  for (DType dtype : kAllDtypes) {
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
      if (op == ReduceOp::Avg && dtype == DType::I32) continue;
      for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000003}}) {
        std::vector<float> values(static_cast<size_t>(n)), want(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) {
          values[static_cast<size_t>(i)] = sum_input(rank(), i);
          want[static_cast<size_t>(i)] = reduced(op, size(), i);
        }
        Tensor t = on_gpu(floats(values, dtype));
        nccl().all_reduce(t, {.op = op}).wait();
        EXPECT_EQ(count_wrong(host(t), floats(want, dtype)), 0) << op << ' ' << label(dtype, n);
      }
    }
  }
}

TEST_F(Nccl, AllReduceMax) {
  // Negative values throughout; which rank holds the maximum varies by element.
  auto value = [](int r, int64_t i) { return static_cast<float>((r * 3 + i) % 11) - 20.0f; };
  for (DType dtype : kAllDtypes) {
    for (int64_t n : kSizes) {
      std::vector<float> values(static_cast<size_t>(n)), want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        values[static_cast<size_t>(i)] = value(rank(), i);
        float m = value(0, i);
        for (int r = 1; r < size(); ++r) m = std::max(m, value(r, i));
        want[static_cast<size_t>(i)] = m;
      }
      Tensor t = on_gpu(floats(values, dtype));
      nccl().all_reduce(t, {.op = ReduceOp::Max}).wait();
      EXPECT_EQ(count_wrong(host(t), floats(want, dtype)), 0) << label(dtype, n);
    }
  }
}

TEST_F(Nccl, MaxPropagatesNaNAndPrefersPositiveZero) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const int r = rank();
  const int last = size() - 1;
  const bool one = size() == 1;
  // Element: input on rank r -> the MPI backend's result.
  //  0: NaN on the last rank, else -r        -> NaN
  //  1: NaN on rank 0, else +inf             -> NaN
  //  2: -3 - r                               -> -3
  //  3: NaN everywhere                       -> NaN
  //  4: -0 on even ranks, +0 on odd ones     -> +0 (-0 at size 1)
  //  5: -0 everywhere                        -> -0
  //  6: -inf everywhere                     -> -inf
  //  7: +inf on the last rank, else 1e30     -> +inf
  //  8: -1e-40 (subnormal) on even ranks, +0 on odd ones -> +0 (the subnormal at size 1)
  std::vector<float> values{r == last ? nan : -static_cast<float>(r),
                            r == 0 ? nan : inf,
                            -3.0f - static_cast<float>(r),
                            nan,
                            r % 2 == 0 ? -0.0f : 0.0f,
                            -0.0f,
                            -inf,
                            r == last ? inf : 1e30f,
                            r % 2 == 0 ? -1e-40f : 0.0f};
  for (DType dtype : {DType::F32, DType::BF16}) {
    Tensor input = floats(values, dtype);
    std::vector<float> want{nan, nan, -3.0f, nan, one ? -0.0f : 0.0f, -0.0f, -inf, inf, one ? -1e-40f : 0.0f};
    // The canonical quiet NaN, as the MPI backend's op returns it; exact bits elsewhere.
    Tensor want_t = floats(want, dtype);
    Tensor t = on_gpu(input);
    nccl().all_reduce(t, {.op = ReduceOp::Max}).wait();
    Tensor got = host(t);
    EXPECT_EQ(count_wrong(got, want_t), 0) << dtype << ": got " << ::testing::PrintToString(got.to_floats());
  }
}

TEST_F(Nccl, Bf16SumAndAvgRoundOnce) {
  const int64_t n = 5;
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
    std::vector<float> mine(n), want(n);
    for (int64_t j = 0; j < n; ++j) {
      mine[j] = rounding_input(rank(), j);
      double exact = 0;
      for (int r = 0; r < size(); ++r) exact += rounding_input(r, j);
      auto sum = static_cast<float>(exact);
      want[j] = round_to_bf16(op == ReduceOp::Avg ? sum / static_cast<float>(size()) : sum);
    }
    Tensor t = on_gpu(floats(mine, DType::BF16));
    nccl().all_reduce(t, {.op = op}).wait();
    EXPECT_EQ(count_wrong(host(t), floats(want, DType::BF16)), 0) << "all_reduce " << op;

    std::vector<float> in_values;
    for (int r = 0; r < size(); ++r) in_values.insert(in_values.end(), mine.begin(), mine.end());
    Tensor out = on_gpu(Tensor::zeros({n}, DType::BF16));
    nccl().reduce_scatter(out, on_gpu(floats(in_values, DType::BF16)), {.op = op}).wait();
    EXPECT_EQ(count_wrong(host(out), floats(want, DType::BF16)), 0) << "reduce_scatter " << op;
  }
}

TEST_F(Nccl, BroadcastFromEveryRoot) {
  for (DType dtype : kAllDtypes) {
    for (int root = 0; root < size(); ++root) {
      for (int64_t n : kSizes) {
        int r = rank();
        Tensor t = on_gpu(ids(dtype, n, [&](int64_t i) { return r * 3000 + i % 3000; }));
        nccl().broadcast(t, {.root = root}).wait();
        Tensor want = ids(dtype, n, [&](int64_t i) { return root * 3000 + i % 3000; });
        EXPECT_EQ(count_wrong(host(t), want), 0) << "root=" << root << ' ' << label(dtype, n);
      }
    }
  }
}

/// Elements rank `src` sends rank `dst`: 0..3 times `scale`, zeros scattered
/// about, and the last rank (of several) sends nothing at all.
int64_t a2a_count(int src, int dst, int size, int64_t scale) {
  if (size > 1 && src == size - 1) return 0;
  return scale * ((src + 2 * dst + 1) % 4);
}

TEST_F(Nccl, AllToAllvWithZeroCounts) {
  const int me = rank();
  const int n_ranks = size();
  for (DType dtype : kAllDtypes) {
    for (int64_t scale : {int64_t{0}, int64_t{1}, int64_t{1001}}) {
      std::vector<int64_t> send_counts, recv_counts, send_ids, want_ids;
      for (int peer = 0; peer < n_ranks; ++peer) {
        send_counts.push_back(a2a_count(me, peer, n_ranks, scale));
        recv_counts.push_back(a2a_count(peer, me, n_ranks, scale));
        for (int64_t k = 0; k < send_counts.back(); ++k) send_ids.push_back((me * 8 + peer) * 4096 + k);
        for (int64_t k = 0; k < recv_counts.back(); ++k) want_ids.push_back((peer * 8 + me) * 4096 + k);
      }
      auto n_in = static_cast<int64_t>(send_ids.size());
      auto n_out = static_cast<int64_t>(want_ids.size());
      Tensor in = on_gpu(ids(dtype, n_in, [&](int64_t i) { return send_ids[static_cast<size_t>(i)]; }));
      Tensor out = on_gpu(Tensor::full({n_out}, 5, dtype));
      nccl().all_to_allv(out, recv_counts, in, send_counts).wait();
      Tensor want = ids(dtype, n_out, [&](int64_t i) { return want_ids[static_cast<size_t>(i)]; });
      EXPECT_EQ(count_wrong(host(out), want), 0) << dtype << " scale=" << scale;
    }
  }
}

TEST_F(Nccl, SplitByParityOrderedByKeyAndSplitAgain) {
  const int r = rank();
  std::vector<int> members;  // ranks of my parity, in sub-group order (key = -rank: descending)
  for (int q = size() - 1; q >= 0; --q) {
    if (q % 2 == r % 2) members.push_back(q);
  }
  const int want_sub_rank = static_cast<int>(std::find(members.begin(), members.end(), r) - members.begin());
  const auto m = static_cast<int64_t>(members.size());

  std::unique_ptr<ProcessGroup> sub = nccl().split(/*color=*/r % 2, /*key=*/-r);
  EXPECT_NE(sub, nullptr);
  if (!sub) return;
  EXPECT_EQ(sub->backend_name(), "nccl");
  EXPECT_EQ(sub->size(), static_cast<int>(m));
  EXPECT_EQ(sub->rank(), want_sub_rank);

  // The gather lists ranks in sub-group order; a sum covers exactly the members.
  Tensor gathered = on_gpu(Tensor::zeros({m}, DType::I32));
  sub->all_gather(gathered, on_gpu(Tensor::from_vector(std::vector<int32_t>{r}, {1}))).wait();
  EXPECT_EQ(count_wrong(host(gathered), Tensor::from_vector(std::vector<int32_t>(members.begin(), members.end()), {m})),
            0);
  Tensor t = on_gpu(floats({static_cast<float>(r + 1)}, DType::F32));
  sub->all_reduce(t).wait();
  float sum = 0;
  for (int q : members) sum += static_cast<float>(q + 1);
  EXPECT_EQ(count_wrong(host(t), floats({sum}, DType::F32)), 0);

  // A sub-group splits its own children: its bootstrap was split along with it.
  std::unique_ptr<ProcessGroup> child = sub->split(/*color=*/0, /*key=*/sub->rank());
  EXPECT_NE(child, nullptr);
  if (child) {
    EXPECT_EQ(child->size(), sub->size());
    EXPECT_EQ(child->rank(), sub->rank());
    Tensor c = on_gpu(Tensor::from_vector(std::vector<int32_t>{r}, {1}));
    child->all_reduce(c, {.op = ReduceOp::Max}).wait();
    EXPECT_EQ(host(c).data<int32_t>()[0], members.front());
  }

  // A negative color takes no part.
  std::unique_ptr<ProcessGroup> none = nccl().split(r == 0 ? -1 : 0, /*key=*/r);
  EXPECT_EQ(none == nullptr, r == 0);
  if (none) {
    EXPECT_EQ(none->size(), size() - 1);
    EXPECT_EQ(none->rank(), r - 1);
  }
  // Collectives of the sub-groups and of the world group interleave safely.
  Work sub_work = sub->barrier();
  nccl().barrier().wait();
  sub_work.wait();
}

TEST_F(Nccl, BarrierWaitsForEarlierCollectives) {
  // barrier() blocks the host until it completes, and it runs on the comm
  // stream after every collective issued before it.
  const int64_t n = int64_t{1} << 24;
  Tensor t = on_gpu(Tensor::full({n}, rank() + 1, DType::F32));
  Work big = nccl().all_reduce(t);
  Work bar = nccl().barrier();
  bar.wait();
  EXPECT_TRUE(bar.is_completed());
  EXPECT_TRUE(big.is_completed()) << "the barrier returned before an earlier all_reduce finished";
  big.wait();
  EXPECT_EQ(count_wrong(host(t), Tensor::full({n}, size() * (size() + 1) / 2, DType::F32)), 0);
}

#if ST_WITH_CUDA
/// Holds a stream at a host callback until open() (or until a watchdog
/// opens it, so that a bug fails the test instead of hanging it).
class StreamGate {
 public:
  explicit StreamGate(cudaStream_t stream) : stream_(stream) {
    CUDA_CHECK(cudaLaunchHostFunc(stream_, &StreamGate::hold, this));
    watchdog_ = std::thread([this] {
      auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (!open_.load() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      if (!open_.exchange(true)) watchdog_fired_ = true;
    });
  }
  ~StreamGate() {
    open();
    watchdog_.join();
    // The callback reads *this: the stream must be past it before this goes.
    (void)cudaStreamSynchronize(stream_);
  }
  StreamGate(const StreamGate&) = delete;
  StreamGate& operator=(const StreamGate&) = delete;

  void open() { open_.store(true); }
  /// True when the watchdog had to open the gate.
  bool watchdog_fired() const { return watchdog_fired_.load(); }

 private:
  static void CUDART_CB hold(void* self) {
    auto* gate = static_cast<StreamGate*>(self);
    while (!gate->open_.load()) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }

  cudaStream_t stream_;
  std::atomic<bool> open_{false};
  std::atomic<bool> watchdog_fired_{false};
  std::thread watchdog_;
};

TEST_F(Nccl, WaitOrdersTheComputeStreamWithoutBlockingTheHost) {
  const int64_t n = int64_t{1} << 24;  // 64 MiB: a copy racing the collective would see stale data
  for (DType dtype : {DType::F32, DType::BF16}) {
    Tensor t = on_gpu(Tensor::full({n}, rank() + 1, dtype));
    Tensor later = on_gpu(Tensor::zeros({n}, dtype));
    bool watchdog_fired = false;
    {
      // The compute stream is held, so the collective (ordered after it) cannot start.
      StreamGate gate(cuda::compute_stream(gpu_index()));
      Work work = nccl().all_reduce(t);
      EXPECT_FALSE(work.is_completed()) << "the collective ran before the compute stream reached it";
      work.wait();  // must return while the GPU is still held: the host does not block
      watchdog_fired = gate.watchdog_fired();
      // Issued after wait(), this copy must run after the collective.
      later.copy_from(t);
      gate.open();
    }
    EXPECT_FALSE(watchdog_fired) << "Work::wait() blocked the host until the compute stream was released";
    Tensor want = Tensor::full({n}, size() * (size() + 1) / 2, dtype);
    EXPECT_EQ(count_wrong(host(later), want), 0) << dtype;
    EXPECT_EQ(count_wrong(host(t), want), 0) << dtype;
  }
}
#endif

TEST_F(Nccl, ArgumentErrorsNameTheProblem) {
  // Checked before anything is issued, identically on every rank.
  Tensor cpu = Tensor::zeros({4}, DType::F32);
  std::string msg = error_of([&] { nccl().all_reduce(cpu); });
  EXPECT_NE(msg.find("all_reduce"), std::string::npos) << msg;
  EXPECT_NE(msg.find(format("cuda:{}", gpu_index())), std::string::npos) << msg;
  msg = error_of([&] { nccl().all_gather(on_gpu(Tensor::zeros({size() * 4 + 1}, DType::F32)), on_gpu(cpu)); });
  EXPECT_NE(msg.find("expected size()*in.numel()"), std::string::npos) << msg;
  msg = error_of([&] { nccl().all_reduce(on_gpu(Tensor::zeros({3}, DType::I32)), {.op = ReduceOp::Avg}); });
  EXPECT_NE(msg.find("Avg of an I32 tensor"), std::string::npos) << msg;
  msg = error_of([&] { nccl().reduce_scatter(on_gpu(cpu), on_gpu(cpu), {.op = ReduceOp::Max}); });
  EXPECT_NE(msg.find("use Sum or Avg"), std::string::npos) << msg;
  // The group still works after refusing those.
  Tensor t = on_gpu(Tensor::full({3}, 2, DType::I32));
  nccl().all_reduce(t).wait();
  EXPECT_EQ(count_wrong(host(t), Tensor::full({3}, 2 * size(), DType::I32)), 0);
}

// --- NCCL against the MPI backend on random inputs -------------------------------------

/// Random values of `dtype`, different on every rank and call.
Tensor random_tensor(std::mt19937& rng, int64_t n, DType dtype) {
  std::uniform_real_distribution<float> real(-4.0f, 4.0f);
  std::uniform_int_distribution<int32_t> integer(-1000, 1000);
  std::vector<float> values(static_cast<size_t>(n));
  for (float& v : values) v = dtype == DType::I32 ? static_cast<float>(integer(rng)) : real(rng);
  return floats(values, dtype);
}

/// Elements of `got` further than the dtype's tolerance from `want`. The
/// summation order of NCCL's ring differs from MPI's, so sums over several
/// ranks may differ by rounding. Inputs lie in [-4, 4], so a sum's rounding
/// error scales with 4 * size, not with the (possibly cancelling) result:
/// F32 within 1e-6 * size * max(|want|, 4 * size), BF16 within one BF16 ulp
/// of that scale (2^-7, the single final rounding may go the other way).
/// I32, and every result at size 1, must be exact.
int64_t count_far(const Tensor& got, const Tensor& want, int size) {
  if (size == 1 || got.dtype() == DType::I32) return count_wrong(got, want);
  std::vector<float> g = got.to_floats(), w = want.to_floats();
  const float rel = got.dtype() == DType::BF16 ? 0.0078125f : 1e-6f * static_cast<float>(size);
  int64_t far = 0;
  for (size_t i = 0; i < g.size(); ++i)
    far += !(std::abs(g[i] - w[i]) <= rel * std::max(std::abs(w[i]), 4.0f * static_cast<float>(size)));
  return far;
}

TEST_F(Nccl, MatchesTheMpiBackendOnRandomInputs) {
  std::mt19937 rng(1234u + static_cast<unsigned>(rank()));
  for (DType dtype : kAllDtypes) {
    for (int64_t n : kSizes) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        if (op == ReduceOp::Avg && dtype == DType::I32) continue;
        Tensor cpu_t = random_tensor(rng, n, dtype);
        Tensor gpu_t = on_gpu(cpu_t);
        world().all_reduce(cpu_t, {.op = op}).wait();
        nccl().all_reduce(gpu_t, {.op = op}).wait();
        int64_t far = op == ReduceOp::Max ? count_wrong(host(gpu_t), cpu_t) : count_far(host(gpu_t), cpu_t, size());
        EXPECT_EQ(far, 0) << "all_reduce " << op << ' ' << label(dtype, n);
        if (op == ReduceOp::Max) continue;
        Tensor cpu_in = random_tensor(rng, size() * n, dtype);
        Tensor cpu_out = Tensor::empty({n}, dtype);
        Tensor gpu_out = on_gpu(Tensor::zeros({n}, dtype));
        world().reduce_scatter(cpu_out, cpu_in, {.op = op}).wait();
        nccl().reduce_scatter(gpu_out, on_gpu(cpu_in), {.op = op}).wait();
        EXPECT_EQ(count_far(host(gpu_out), cpu_out, size()), 0) << "reduce_scatter " << op << ' ' << label(dtype, n);
      }
    }
  }
}

// --- the MPI backend with GPU tensors (staging) ------------------------------------------

/// The world's MPI group on GPU tensors must give exactly what it gives on
/// the same values in host memory. Several ranks may share one GPU here.
class MpiStaging : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU is visible";
  }
};

TEST_F(MpiStaging, GpuTensorsGiveTheHostResults) {
  ProcessGroup& mpi = world();
  ASSERT_EQ(mpi.backend_name(), "mpi");
  const int r = mpi.rank();
  const int size = mpi.size();
  std::mt19937 rng(99u + static_cast<unsigned>(r));
  for (DType dtype : kAllDtypes) {
    for (int64_t n : kSizes) {
      std::string what = label(dtype, n);
      {  // all_gather, also in place
        Tensor in = random_tensor(rng, n, dtype);
        Tensor want = Tensor::empty({size * n}, dtype);
        mpi.all_gather(want, in).wait();
        Tensor out = on_gpu(Tensor::full({size * n}, 9, dtype));
        mpi.all_gather(out, on_gpu(in)).wait();
        EXPECT_EQ(count_wrong(host(out), want), 0) << "all_gather " << what;
        Tensor gathered = on_gpu(Tensor::full({size * n}, 9, dtype));
        Tensor slot = gathered.flat_slice(r * n, n);
        slot.copy_from(on_gpu(in));
        mpi.all_gather(gathered, slot).wait();
        EXPECT_EQ(count_wrong(host(gathered), want), 0) << "all_gather in place " << what;
      }
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
        if (op == ReduceOp::Avg && dtype == DType::I32) continue;
        Tensor t = random_tensor(rng, n, dtype);
        Tensor gpu_t = on_gpu(t);
        mpi.all_reduce(t, {.op = op}).wait();
        mpi.all_reduce(gpu_t, {.op = op}).wait();
        EXPECT_EQ(count_wrong(host(gpu_t), t), 0) << "all_reduce " << op << ' ' << what;
        if (op == ReduceOp::Max) continue;
        Tensor in = random_tensor(rng, size * n, dtype);
        Tensor want = Tensor::empty({n}, dtype);
        mpi.reduce_scatter(want, in, {.op = op}).wait();
        Tensor out = on_gpu(Tensor::full({n}, 9, dtype));
        mpi.reduce_scatter(out, on_gpu(in), {.op = op}).wait();
        EXPECT_EQ(count_wrong(host(out), want), 0) << "reduce_scatter " << op << ' ' << what;
      }
      {  // broadcast from the last rank
        Tensor t = random_tensor(rng, n, dtype);
        Tensor gpu_t = on_gpu(t);
        mpi.broadcast(t, {.root = size - 1}).wait();
        mpi.broadcast(gpu_t, {.root = size - 1}).wait();
        EXPECT_EQ(count_wrong(host(gpu_t), t), 0) << "broadcast " << what;
      }
    }
    // all_to_allv with zero counts.
    std::vector<int64_t> send_counts, recv_counts;
    for (int peer = 0; peer < size; ++peer) {
      send_counts.push_back(a2a_count(r, peer, size, 333));
      recv_counts.push_back(a2a_count(peer, r, size, 333));
    }
    int64_t n_in = 0, n_out = 0;
    for (int64_t c : send_counts) n_in += c;
    for (int64_t c : recv_counts) n_out += c;
    Tensor in = random_tensor(rng, n_in, dtype);
    Tensor want = Tensor::empty({n_out}, dtype);
    mpi.all_to_allv(want, recv_counts, in, send_counts).wait();
    Tensor out = on_gpu(Tensor::full({n_out}, 9, dtype));
    mpi.all_to_allv(out, recv_counts, on_gpu(in), send_counts).wait();
    EXPECT_EQ(count_wrong(host(out), want), 0) << "all_to_allv " << dtype;
  }
}

TEST_F(MpiStaging, OutputIsWrittenByWait) {
  // The Work's completion copies the result back; until then the device
  // tensor is the caller's, untouched (staging copies the input at the call).
  Tensor t = on_gpu(Tensor::full({1000}, world().rank() + 1, DType::F32));
  Work work = world().all_reduce(t);
  work.wait();
  EXPECT_TRUE(work.is_completed());
  int size = world().size();
  EXPECT_EQ(count_wrong(host(t), Tensor::full({1000}, size * (size + 1) / 2, DType::F32)), 0);
}

// --- the kernels against their CPU references ------------------------------------------

#if ST_WITH_NCCL
/// Random F32 bit patterns with the special values mixed in: NaNs of both
/// signs and several payloads, infinities, zeros, subnormals, BF16 ties.
std::vector<uint32_t> random_f32_bits(std::mt19937& rng, int64_t n) {
  const uint32_t specials[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0xff812345u, 0x7f800000u, 0xff800000u,
                               0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x3f808000u, 0x3f818000u,
                               0x7f7fffffu, 0xff7fffffu, 0x3f800000u, 0xbf800000u};
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<uint32_t> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = i % 5 == 0 ? specials[(i / 5) % std::size(specials)] : bits(rng);
  return v;
}

Tensor f32_from_bits(const std::vector<uint32_t>& bits) {
  Tensor t = Tensor::empty({static_cast<int64_t>(bits.size())}, DType::F32);
  std::memcpy(t.raw_data(), bits.data(), bits.size() * 4);
  return t;
}

/// The MPI backend's max of two F32 values (core/comm_mpi.cpp), the reference for the keys.
uint32_t mpi_max_bits(uint32_t a, uint32_t b) {
  float fa = std::bit_cast<float>(a), fb = std::bit_cast<float>(b);
  if (std::isnan(fa) || std::isnan(fb)) return 0x7fc00000u;
  if (fa == fb) return a & b;
  return fa > fb ? a : b;
}

TEST(CommKeys, KeyOrderIsTheMpiMax) {
  // Host twins of the kernels' key maps (no GPU needed).
  std::mt19937 rng(7);
  std::vector<uint32_t> a = random_f32_bits(rng, 200003), b = random_f32_bits(rng, 200003);
  std::shuffle(b.begin(), b.end(), rng);
  int64_t wrong = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    uint32_t key = std::max(cuda::max_key_of_bits(a[i]), cuda::max_key_of_bits(b[i]));
    wrong += cuda::bits_of_max_key(key) != mpi_max_bits(a[i], b[i]);
  }
  EXPECT_EQ(wrong, 0);
}

class CommKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no CUDA GPU is visible";
  }
  cudaStream_t stream() const { return cuda::compute_stream(gpu_index()); }
};

TEST_F(CommKernels, MaxKeysMatchTheHostMaps) {
  cuda::DeviceGuard guard(gpu_index());
  std::mt19937 rng(11);
  for (int64_t n : kSizes) {
    std::vector<uint32_t> bits = random_f32_bits(rng, n);
    // F32: keys, then back.
    Tensor x = on_gpu(f32_from_bits(bits));
    Tensor keys = on_gpu(Tensor::zeros({n}, DType::I32));
    Tensor back = on_gpu(Tensor::zeros({n}, DType::F32));
    cuda::f32_to_max_keys(static_cast<const float*>(x.raw_data()), static_cast<uint32_t*>(keys.raw_data()), n,
                          stream());
    cuda::max_keys_to_f32(static_cast<const uint32_t*>(keys.raw_data()), static_cast<float*>(back.raw_data()), n,
                          stream());
    Tensor got_keys = host(keys), got_back = host(back);
    int64_t wrong_keys = 0, wrong_back = 0;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t k = static_cast<uint32_t>(got_keys.data<int32_t>()[i]);
      wrong_keys += k != cuda::max_key_of_bits(bits[static_cast<size_t>(i)]);
      uint32_t b = std::bit_cast<uint32_t>(got_back.data<float>()[i]);
      wrong_back += b != cuda::bits_of_max_key(cuda::max_key_of_bits(bits[static_cast<size_t>(i)]));
    }
    EXPECT_EQ(wrong_keys, 0) << "F32 n=" << n;
    EXPECT_EQ(wrong_back, 0) << "F32 n=" << n;

    // BF16: the upper halves of the same patterns.
    Tensor xb = Tensor::empty({n}, DType::BF16);
    for (int64_t i = 0; i < n; ++i)
      xb.data<BFloat16>()[i] = BFloat16::from_bits(static_cast<uint16_t>(bits[static_cast<size_t>(i)] >> 16));
    Tensor xb_gpu = on_gpu(xb);
    Tensor backb = on_gpu(Tensor::zeros({n}, DType::BF16));
    cuda::bf16_to_max_keys(static_cast<const uint16_t*>(xb_gpu.raw_data()), static_cast<uint32_t*>(keys.raw_data()), n,
                           stream());
    cuda::max_keys_to_bf16(static_cast<const uint32_t*>(keys.raw_data()), static_cast<uint16_t*>(backb.raw_data()), n,
                           stream());
    got_keys = host(keys);
    Tensor got_backb = host(backb);
    wrong_keys = wrong_back = 0;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t f32_bits = static_cast<uint32_t>(xb.data<BFloat16>()[i].bits) << 16;
      uint32_t k = static_cast<uint32_t>(got_keys.data<int32_t>()[i]);
      wrong_keys += k != cuda::max_key_of_bits(f32_bits);
      wrong_back +=
          got_backb.data<BFloat16>()[i].bits != (cuda::bits_of_max_key(cuda::max_key_of_bits(f32_bits)) >> 16);
    }
    EXPECT_EQ(wrong_keys, 0) << "BF16 n=" << n;
    EXPECT_EQ(wrong_back, 0) << "BF16 n=" << n;
  }
}

TEST_F(CommKernels, ConversionsMatchTheHost) {
  cuda::DeviceGuard guard(gpu_index());
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> real(-1000.0f, 1000.0f);
  for (int64_t n : kSizes) {
    // Random values, with special bit patterns and exact BF16 ties mixed in.
    std::vector<uint32_t> specials = random_f32_bits(rng, n);
    std::vector<float> values(static_cast<size_t>(n));
    for (size_t i = 0; i < values.size(); ++i) values[i] = i % 3 == 0 ? std::bit_cast<float>(specials[i]) : real(rng);
    Tensor x = floats(values, DType::F32);
    Tensor x_gpu = on_gpu(x);
    for (float divisor : {1.0f, 3.0f, 7.0f}) {
      // f32 -> bf16 with a divisor.
      Tensor out = on_gpu(Tensor::zeros({n}, DType::BF16));
      cuda::f32_to_bf16_divided(static_cast<const float*>(x_gpu.raw_data()), static_cast<uint16_t*>(out.raw_data()), n,
                                divisor, stream());
      Tensor got = host(out);
      int64_t wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t g = got.data<BFloat16>()[i].bits;
        const uint16_t want = f32_to_bf16_bits(x.data<float>()[i] / divisor);
        // GPU arithmetic returns the canonical NaN where the host keeps the
        // payload; any NaN is the right answer for a NaN input.
        const bool both_nan = std::isnan(bf16_bits_to_f32(g)) && std::isnan(bf16_bits_to_f32(want));
        wrong += g != want && !both_nan;
      }
      EXPECT_EQ(wrong, 0) << "f32_to_bf16_divided n=" << n << " divisor=" << divisor;

      // f32 divide in place.
      Tensor y = x_gpu.clone();
      cuda::f32_divide(static_cast<float*>(y.raw_data()), n, divisor, stream());
      Tensor got_y = host(y);
      wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        float want = x.data<float>()[i] / divisor;
        float g = got_y.data<float>()[i];
        wrong += std::bit_cast<uint32_t>(g) != std::bit_cast<uint32_t>(want) && !(std::isnan(g) && std::isnan(want));
      }
      EXPECT_EQ(wrong, 0) << "f32_divide n=" << n << " divisor=" << divisor;
    }
    // bf16 -> f32 is exact.
    Tensor xb = floats(values, DType::BF16);
    Tensor xb_gpu = on_gpu(xb);
    Tensor wide = on_gpu(Tensor::zeros({n}, DType::F32));
    cuda::bf16_to_f32(static_cast<const uint16_t*>(xb_gpu.raw_data()), static_cast<float*>(wide.raw_data()), n,
                      stream());
    Tensor got_wide = host(wide);
    int64_t wrong = 0;
    for (int64_t i = 0; i < n; ++i)
      wrong += std::bit_cast<uint32_t>(got_wide.data<float>()[i]) != static_cast<uint32_t>(xb.data<BFloat16>()[i].bits)
                                                                         << 16;
    EXPECT_EQ(wrong, 0) << "bf16_to_f32 n=" << n;
  }
}
#endif

}  // namespace
}  // namespace st
