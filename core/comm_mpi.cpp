// The MPI backend: each collective starts a non-blocking MPI call on a
// communicator the group owns and returns a Work over its request.
//
// Dtypes on the wire: F32 as MPI_FLOAT, I32 as MPI_INT32_T, BF16 as raw
// 16-bit words (MPI_UINT16_T), since MPI has no BF16 type. Data movement moves
// the words untouched. BF16 Sum/Avg are upcast into an F32 staging buffer,
// summed there with MPI_SUM, and rounded to BF16 once inside wait() (after the
// division for Avg): rounding at every partial sum would make the answer
// depend on the rank count and the order MPI combines in. BF16 and F32 Max use
// our own MPI_Ops so that NaN propagates. Avg divides the sum by size() in F32.
//
// Staging buffers are allocated per call: several Works may be in flight at
// once, each needing its own.
//
// Progress: Open MPI (4.1, no async progress thread) moves a non-blocking
// collective only inside MPI calls, so a prefetched all-gather or an early
// reduce-scatter would sit idle until its wait(). Every started request is
// kept in a process-wide registry until it is waited for, and the thread that
// starts collectives gets a progress hook at its op boundaries
// (core/profile.h) that calls MPI_Test on the oldest registered request: any
// MPI_Test runs Open MPI's progress engine, which advances every outstanding
// collective (libnbc schedules, shared-memory rendezvous copies). Results do
// not change: a collective's schedule and reduction order are fixed when it
// starts; only when its steps run moves. ST_MPI_PROGRESS=0 turns the hook off
// (for before/after measurements).
//
// Bytes across hosts: a group learns at creation whether its ranks sit on
// more than one host (one all-gather of host names) and, if so, adds each
// collective's send-buffer bytes (core/comm.h, cross_host_bytes) to a counter
// that the world group shares with every group split from it. On one host
// that costs one branch per collective.
//
// GPU tensors are staged through host memory: copied to the host when the
// collective starts (which waits for the GPU's pending work), run through the
// CPU path, and the output copied back inside wait(). That costs two copies
// per call, which is why GPU runs use the NCCL backend; staging is what lets
// several ranks share one GPU (tests) or a GPU build run without NCCL.
#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string_view>

#include <mpi.h>

#include "core/comm.h"
#include "core/profile.h"
#include "core/watchdog.h"

namespace st {

namespace detail {
std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS) return format("unknown MPI error code {}", code);
  return format("{} (MPI error code {})", std::string(text, static_cast<size_t>(length)), code);
}
}  // namespace detail

namespace {

bool mpi_finalized() {
  int finalized = 0;
  return MPI_Finalized(&finalized) != MPI_SUCCESS || finalized != 0;
}

// --- RAII handles ------------------------------------------------------------------

/// Owns an MPI communicator; frees it unless MPI is already gone.
class MpiComm {
 public:
  explicit MpiComm(MPI_Comm comm) : comm_(comm) {}
  MpiComm(MpiComm&& other) noexcept : comm_(std::exchange(other.comm_, MPI_COMM_NULL)) {}
  MpiComm& operator=(MpiComm&&) = delete;
  MpiComm(const MpiComm&) = delete;
  MpiComm& operator=(const MpiComm&) = delete;
  ~MpiComm() {
    // A failure to free has no one to report to; the handle is gone either way.
    if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
  }
  MPI_Comm get() const { return comm_; }

 private:
  MPI_Comm comm_;
};

/// Owns a user-defined MPI_Op.
class MpiOp {
 public:
  MpiOp(MPI_User_function* fn, bool commutative) { MPI_CHECK(MPI_Op_create(fn, commutative ? 1 : 0, &op_)); }
  MpiOp(const MpiOp&) = delete;
  MpiOp& operator=(const MpiOp&) = delete;
  ~MpiOp() {
    if (op_ != MPI_OP_NULL && !mpi_finalized()) MPI_Op_free(&op_);
  }
  MPI_Op get() const { return op_; }

 private:
  MPI_Op op_ = MPI_OP_NULL;
};

// --- Max that propagates NaN ----------------------------------------------------

// MPI_MAX is `a > b ? a : b`, which keeps or drops a NaN depending on the
// order MPI combines in. These return a NaN whenever either side is one, and
// are commutative bit for bit (a canonical NaN; +0 over -0), as MPI requires
// of an op declared commutative.
template <class Bits, class ToFloat>
Bits max_bits(Bits a, Bits b, Bits quiet_nan, ToFloat to_float) {
  float fa = to_float(a);
  float fb = to_float(b);
  if (std::isnan(fa) || std::isnan(fb)) return quiet_nan;
  if (fa == fb) return a & b;  // equal values have equal bits, except +0 & -0 = +0
  return fa > fb ? a : b;
}

void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = max_bits<uint16_t>(a[i], b[i], uint16_t{0x7fc0}, bf16_bits_to_f32);
}

void f32_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint32_t*>(in);
  auto* b = static_cast<uint32_t*>(inout);
  auto to_float = [](uint32_t u) { return std::bit_cast<float>(u); };
  for (int i = 0; i < *len; ++i) b[i] = max_bits<uint32_t>(a[i], b[i], 0x7fc00000u, to_float);
}

// --- helpers -------------------------------------------------------------------------

MPI_Datatype wire_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return MPI_FLOAT;
    case DType::I32: return MPI_INT32_T;
    case DType::BF16: return MPI_UINT16_T;
  }
  ST_FAIL("no MPI datatype for {}", dtype);
}

/// An F32 copy of a BF16 tensor.
Tensor upcast_bf16(const Tensor& t) {
  Tensor f = Tensor::empty({t.numel()}, DType::F32);
  const BFloat16* src = t.data<BFloat16>();
  float* dst = f.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) dst[i] = src[i];
  return f;
}

/// dst = BF16(src / divisor): the one rounding of a BF16 reduction.
void round_to_bf16_into(const Tensor& dst, const Tensor& src, float divisor) {
  const float* s = src.data<float>();
  BFloat16* d = dst.data<BFloat16>();
  for (int64_t i = 0; i < dst.numel(); ++i) d[i] = BFloat16(s[i] / divisor);
}

void divide_f32(const Tensor& t, float divisor) {
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] /= divisor;
}

/// A collective on GPU tensors, run by the CPU path on host copies: wait()
/// finishes the host collective, then copies its output back to the device.
class StagedWork final : public Work::Impl {
 public:
  StagedWork(Work host_work, Tensor device_out, Tensor host_out)
      : host_work_(std::move(host_work)), device_out_(std::move(device_out)), host_out_(std::move(host_out)) {}

  void wait() override {
    host_work_.wait();
    device_out_.copy_from(host_out_);
  }
  bool test() override { return host_work_.is_completed(); }

 private:
  Work host_work_;
  Tensor device_out_;  // the caller's output on the GPU
  Tensor host_out_;    // where the host collective writes it
};

/// `host_work` (a collective into `host_out`) as a Work that fills `device_out`.
Work staged(Work host_work, const Tensor& device_out, const Tensor& host_out) {
  return Work(std::make_unique<StagedWork>(std::move(host_work), device_out, host_out));
}

/// Requests started and not yet waited for, oldest first, so that op
/// boundaries can drive them. Every access to a registered request goes
/// through the mutex: the hook may run on another thread than the wait.
class ProgressRegistry {
 public:
  void add(MPI_Request* request) {
    const std::lock_guard<std::mutex> lock(mutex_);
    requests_.push_back(request);
  }
  /// Takes `request` out; after this only its owner touches it.
  void remove(MPI_Request* request) {
    const std::lock_guard<std::mutex> lock(mutex_);
    std::erase(requests_, request);
  }
  /// MPI_Test on `request` under the registry's lock; true when complete.
  bool test(MPI_Request* request, int* rc) {
    const std::lock_guard<std::mutex> lock(mutex_);
    int done = 0;
    *rc = MPI_Test(request, &done, MPI_STATUS_IGNORE);
    return done != 0;
  }
  /// Advances every outstanding collective: tests the oldest request (which
  /// runs the whole progress engine) and drops those that completed. Errors
  /// are left for the owner's wait(), which sees them again.
  void progress() {
    const std::lock_guard<std::mutex> lock(mutex_);
    while (!requests_.empty()) {
      int done = 0;
      if (MPI_Test(requests_.front(), &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || !done) return;
      requests_.pop_front();  // completed: MPI set it to MPI_REQUEST_NULL, so wait() returns at once
    }
  }

 private:
  std::mutex mutex_;
  std::deque<MPI_Request*> requests_;
};

ProgressRegistry& progress_registry() {
  static ProgressRegistry registry;
  return registry;
}

void progress_hook() { progress_registry().progress(); }

/// False when ST_MPI_PROGRESS is "0" or "off": collectives then advance only in wait().
bool progress_enabled() {
  static const bool kEnabled = [] {
    const char* v = std::getenv("ST_MPI_PROGRESS");
    return v == nullptr || (std::string_view(v) != "0" && std::string_view(v) != "off");
  }();
  return kEnabled;
}

/// The request of one started collective, what it needs kept alive, and the
/// step that finishes it on this rank once MPI is done.
class MpiWork final : public Work::Impl {
 public:
  MpiWork(std::string what, Watchdog* watchdog, profile::WaitKind kind)
      : what_(std::move(what)), watchdog_(watchdog), kind_(kind) {}
  MpiWork(const MpiWork&) = delete;
  MpiWork& operator=(const MpiWork&) = delete;
  ~MpiWork() override {
    // Reached with a live request only when the collective was dropped after
    // a failure elsewhere; MPI may still write into the buffers held here,
    // so wait rather than free them under it.
    if (registered_) progress_registry().remove(&request_);
    if (request_ != MPI_REQUEST_NULL && !mpi_finalized()) MPI_Wait(&request_, MPI_STATUS_IGNORE);
  }

  MPI_Request* request() { return &request_; }
  /// Holds a buffer until the Work is gone, so the caller may drop its handle.
  void keep(const Tensor& t) { kept_.push_back(t); }
  /// Int count/displacement arrays MPI reads until completion.
  std::vector<int>& ints() { return ints_; }
  /// Runs inside wait() after MPI completes (BF16 rounding, Avg division).
  void on_complete(std::function<void()> step) { finish_ = std::move(step); }

  /// Throws when starting the collective failed; else hands the request to
  /// op-boundary progress (when enabled) from this thread on.
  void check_started(int rc) {
    ST_CHECK(rc == MPI_SUCCESS, "{} could not start: {}", what_, detail::mpi_error_string(rc));
    if (!progress_enabled()) return;
    progress_registry().add(&request_);
    registered_ = true;
    profile::set_progress_hook(&progress_hook);
  }

  void wait() override {
    if (registered_) {
      progress_registry().remove(&request_);
      registered_ = false;
    }
    // The watchdog sees this rank blocked here (and in which collective) until MPI returns.
    const Watchdog::Blocked blocked(watchdog_, what_);
    const profile::WaitScope timed(kind_);
    int rc = MPI_Wait(&request_, MPI_STATUS_IGNORE);
    ST_CHECK(rc == MPI_SUCCESS, "{} failed: {}", what_, detail::mpi_error_string(rc));
    if (finish_) finish_();
  }

  bool test() override {
    int rc = MPI_SUCCESS;
    int done = 0;
    if (registered_) {
      done = progress_registry().test(&request_, &rc) ? 1 : 0;
    } else {
      rc = MPI_Test(&request_, &done, MPI_STATUS_IGNORE);
    }
    ST_CHECK(rc == MPI_SUCCESS, "{} failed: {}", what_, detail::mpi_error_string(rc));
    return done != 0;
  }

 private:
  std::string what_;  // "all_reduce(Sum) of 1024 BF16 elements on rank 1 of 4"
  Watchdog* watchdog_;
  profile::WaitKind kind_;
  MPI_Request request_ = MPI_REQUEST_NULL;
  bool registered_ = false;  // in progress_registry() until wait()
  std::vector<Tensor> kept_;
  std::vector<int> ints_;
  std::function<void()> finish_;
};

/// Payload bytes sent on groups that span hosts; shared by a world group and its splits.
using ByteCounter = std::shared_ptr<std::atomic<int64_t>>;

/// True when the ranks of `comm` report more than one host name (collective).
bool comm_spans_hosts(MPI_Comm comm) {
  constexpr int kName = 256;
  std::array<char, kName> mine{};
  const std::string name = host_name();
  std::memcpy(mine.data(), name.data(), std::min<size_t>(name.size(), kName - 1));
  int size = 1;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  std::vector<char> all(static_cast<size_t>(size) * kName);
  MPI_CHECK(MPI_Allgather(mine.data(), kName, MPI_CHAR, all.data(), kName, MPI_CHAR, comm));
  for (int r = 0; r < size; ++r) {
    if (std::memcmp(all.data() + static_cast<size_t>(r) * kName, mine.data(), kName) != 0) return true;
  }
  return false;
}

class MpiGroup final : public ProcessGroup {
 public:
  /// Collective over `comm`: finds whether it spans hosts.
  MpiGroup(MpiComm comm, ByteCounter sent)
      : comm_(std::move(comm)),
        bf16_max_(&bf16_max, /*commutative=*/true),
        f32_max_(&f32_max, /*commutative=*/true),
        sent_(std::move(sent)) {
    // Errors come back as codes that wait() turns into st::Error, instead of
    // MPI aborting the job from inside the library.
    MPI_CHECK(MPI_Comm_set_errhandler(comm_.get(), MPI_ERRORS_RETURN));
    MPI_CHECK(MPI_Comm_rank(comm_.get(), &rank_));
    MPI_CHECK(MPI_Comm_size(comm_.get(), &size_));
    spans_hosts_ = comm_spans_hosts(comm_.get());
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "mpi"; }
  bool spans_hosts() const override { return spans_hosts_; }
  int64_t cross_host_bytes() const override { return sent_->load(std::memory_order_relaxed); }

  Work all_gather(const Tensor& out, const Tensor& in, const AllGatherOptions& opts) override {
    check_all_gather(out, in);
    if (out.device().is_cuda()) {
      // `in` is copied now, so an `in` inside `out` (the in-place form) stays correct.
      Tensor host_out = Tensor::empty(out.shape(), out.dtype());
      return staged(all_gather(host_out, in.to(Device::cpu()), opts), out, host_out);
    }
    int64_t n = in.numel();
    int count = mpi_count("all_gather", "in", n);
    auto work = start("all_gather", in);
    const void* send = in.raw_data();
    char* slot = static_cast<char*>(out.raw_data()) + static_cast<size_t>(rank_) * in.nbytes();
    if (n > 0 && send == slot) {
      send = MPI_IN_PLACE;  // FSDP gathers into a buffer whose own slot is the shard
    } else if (memory_overlaps(in, out)) {
      Tensor copy = in.clone();
      work->keep(copy);
      send = copy.raw_data();
    }
    work->keep(in);
    work->keep(out);
    count_sent(in.nbytes());
    MPI_Datatype type = wire_type(in.dtype());
    work->check_started(MPI_Iallgather(send, count, type, out.raw_data(), count, type, comm_.get(), work->request()));
    return Work(std::move(work));
  }

  Work reduce_scatter(const Tensor& out, const Tensor& in, const ReduceScatterOptions& opts) override {
    check_reduce_scatter(out, in, opts.op);
    if (out.device().is_cuda()) {
      Tensor host_out = Tensor::empty(out.shape(), out.dtype());
      return staged(reduce_scatter(host_out, in.to(Device::cpu()), opts), out, host_out);
    }
    int count = mpi_count("reduce_scatter", "out", out.numel());
    auto work = start(format("reduce_scatter({})", opts.op), out);
    work->keep(in);
    work->keep(out);
    float divisor = opts.op == ReduceOp::Avg ? static_cast<float>(size_) : 1.0f;
    if (out.dtype() == DType::BF16) {
      Tensor in32 = upcast_bf16(in);
      Tensor out32 = Tensor::empty({out.numel()}, DType::F32);
      work->keep(in32);
      work->keep(out32);
      work->on_complete([out, out32, divisor] { round_to_bf16_into(out, out32, divisor); });
      count_sent(in32.nbytes());
      work->check_started(MPI_Ireduce_scatter_block(in32.raw_data(), out32.raw_data(), count, MPI_FLOAT, MPI_SUM,
                                                    comm_.get(), work->request()));
      return Work(std::move(work));
    }
    const void* send = in.raw_data();
    if (memory_overlaps(in, out)) {
      Tensor copy = in.clone();
      work->keep(copy);
      send = copy.raw_data();
    }
    if (opts.op == ReduceOp::Avg) work->on_complete([out, divisor] { divide_f32(out, divisor); });
    count_sent(in.nbytes());
    work->check_started(MPI_Ireduce_scatter_block(send, out.raw_data(), count, wire_type(out.dtype()), MPI_SUM,
                                                  comm_.get(), work->request()));
    return Work(std::move(work));
  }

  Work all_reduce(const Tensor& t, const AllReduceOptions& opts) override {
    check_all_reduce(t, opts.op);
    if (t.device().is_cuda()) {
      Tensor host = t.to(Device::cpu());
      return staged(all_reduce(host, opts), t, host);
    }
    int count = mpi_count("all_reduce", "t", t.numel());
    auto work = start(format("all_reduce({})", opts.op), t);
    work->keep(t);
    float divisor = opts.op == ReduceOp::Avg ? static_cast<float>(size_) : 1.0f;
    if (opts.op == ReduceOp::Max) {
      MPI_Op op = t.dtype() == DType::BF16 ? bf16_max_.get() : t.dtype() == DType::F32 ? f32_max_.get() : MPI_MAX;
      count_sent(t.nbytes());
      work->check_started(
          MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), count, wire_type(t.dtype()), op, comm_.get(), work->request()));
      return Work(std::move(work));
    }
    if (t.dtype() == DType::BF16) {
      Tensor t32 = upcast_bf16(t);
      work->keep(t32);
      work->on_complete([t, t32, divisor] { round_to_bf16_into(t, t32, divisor); });
      count_sent(t32.nbytes());
      work->check_started(
          MPI_Iallreduce(MPI_IN_PLACE, t32.raw_data(), count, MPI_FLOAT, MPI_SUM, comm_.get(), work->request()));
      return Work(std::move(work));
    }
    if (opts.op == ReduceOp::Avg) work->on_complete([t, divisor] { divide_f32(t, divisor); });
    count_sent(t.nbytes());
    work->check_started(
        MPI_Iallreduce(MPI_IN_PLACE, t.raw_data(), count, wire_type(t.dtype()), MPI_SUM, comm_.get(), work->request()));
    return Work(std::move(work));
  }

  Work broadcast(const Tensor& t, const BroadcastOptions& opts) override {
    check_broadcast(t, opts.root);
    if (t.device().is_cuda()) {
      Tensor host = t.to(Device::cpu());
      return staged(broadcast(host, opts), t, host);
    }
    int count = mpi_count("broadcast", "t", t.numel());
    auto work = start(format("broadcast(root {})", opts.root), t);
    work->keep(t);
    if (rank_ == opts.root) count_sent(t.nbytes());
    work->check_started(MPI_Ibcast(t.raw_data(), count, wire_type(t.dtype()), opts.root, comm_.get(), work->request()));
    return Work(std::move(work));
  }

  Work all_to_allv(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                   std::span<const int64_t> send_counts, const AllToAllOptions& opts) override {
    check_all_to_allv(out, recv_counts, in, send_counts);
    if (out.device().is_cuda()) {
      Tensor host_out = Tensor::empty(out.shape(), out.dtype());
      return staged(all_to_allv(host_out, recv_counts, in.to(Device::cpu()), send_counts, opts), out, host_out);
    }
    auto work = start("all_to_allv", in);
    // Layout of ints(): send counts, send displacements, recv counts, recv displacements.
    auto n = static_cast<size_t>(size_);
    std::vector<int>& ints = work->ints();
    ints.resize(4 * n);
    fill_counts("send_counts", send_counts, ints.data(), ints.data() + n);
    fill_counts("recv_counts", recv_counts, ints.data() + 2 * n, ints.data() + 3 * n);
    const void* send = in.raw_data();
    if (memory_overlaps(in, out)) {
      Tensor copy = in.clone();
      work->keep(copy);
      send = copy.raw_data();
    }
    work->keep(in);
    work->keep(out);
    count_sent(in.nbytes());
    MPI_Datatype type = wire_type(in.dtype());
    work->check_started(MPI_Ialltoallv(send, ints.data(), ints.data() + n, type, out.raw_data(), ints.data() + 2 * n,
                                       ints.data() + 3 * n, type, comm_.get(), work->request()));
    return Work(std::move(work));
  }

  Work barrier(const BarrierOptions&) override {
    auto work = std::make_unique<MpiWork>(format("barrier on rank {} of {}", rank_, size_), watchdog(),
                                          profile::WaitKind::Other);
    work->check_started(MPI_Ibarrier(comm_.get(), work->request()));
    return Work(std::move(work));
  }

  std::unique_ptr<ProcessGroup> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    int rc = MPI_Comm_split(comm_.get(), color < 0 ? MPI_UNDEFINED : color, key, &sub);
    ST_CHECK(rc == MPI_SUCCESS, "split(color {}, key {}) failed on rank {} of {}: {}", color, key, rank_, size_,
             detail::mpi_error_string(rc));
    if (sub == MPI_COMM_NULL) return nullptr;
    auto group = std::make_unique<MpiGroup>(MpiComm(sub), sent_);
    group->set_watchdog(watchdog());
    return group;
  }

 private:
  /// Adds a collective's send-buffer bytes to the counter when this group spans hosts.
  void count_sent(size_t bytes) {
    if (spans_hosts_) sent_->fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  }

  /// A Work named after the op, the tensor it moves and this rank.
  std::unique_ptr<MpiWork> start(const std::string& op, const Tensor& t) const {
    // The profile charges all-gathers, reductions and the rest to separate rows.
    const profile::WaitKind kind = op.starts_with("all_gather") ? profile::WaitKind::Gather
                                   : op.starts_with("reduce_scatter") || op.starts_with("all_reduce")
                                       ? profile::WaitKind::Reduce
                                       : profile::WaitKind::Other;
    return std::make_unique<MpiWork>(
        format("{} of {} {} elements on rank {} of {}", op, t.numel(), t.dtype(), rank_, size_), watchdog(), kind);
  }

  /// MPI counts are int.
  int mpi_count(const char* op, const char* name, int64_t n) const {
    ST_CHECK(n <= INT_MAX, "{}: {} has {} elements, more than MPI's int count allows ({}); split the call (rank {})",
             op, name, n, INT_MAX, rank_);
    return static_cast<int>(n);
  }

  /// Element counts and back-to-back displacements as MPI's ints.
  void fill_counts(const char* name, std::span<const int64_t> counts, int* out_counts, int* out_displs) const {
    int64_t offset = 0;
    for (size_t r = 0; r < counts.size(); ++r) {
      ST_CHECK(counts[r] <= INT_MAX && offset <= INT_MAX,
               "all_to_allv: {}[{}] = {} at offset {} is beyond MPI's int counts ({}); split the call (rank {})", name,
               r, counts[r], offset, INT_MAX, rank_);
      out_counts[r] = static_cast<int>(counts[r]);
      out_displs[r] = static_cast<int>(offset);
      offset += counts[r];
    }
  }

  MpiComm comm_;
  MpiOp bf16_max_;
  MpiOp f32_max_;
  ByteCounter sent_;
  int rank_ = 0;
  int size_ = 1;
  bool spans_hosts_ = false;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_world_group() {
  int initialized = 0;
  MPI_CHECK(MPI_Initialized(&initialized));
  ST_CHECK(initialized && !mpi_finalized(),
           "make_mpi_world_group: MPI is not initialised (or already finalized); create a CommRuntime first");
  MPI_Comm comm = MPI_COMM_NULL;
  // A private copy: our traffic never matches messages of other MPI users,
  // and its error handler is ours to set.
  MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  return std::make_unique<MpiGroup>(MpiComm(comm), std::make_shared<std::atomic<int64_t>>(0));
}

}  // namespace st
