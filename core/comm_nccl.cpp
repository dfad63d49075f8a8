// The NCCL backend (make_nccl_group in core/comm.h).
//
// Streams: the group owns one high-priority communication stream. Every
// collective is fenced after the work already issued to the GPU's compute
// stream (an event recorded there, waited on by the comm stream), runs on the
// comm stream, and records a done event. Work::wait() makes the compute stream
// wait on that event, so the host never blocks and compute issued after
// wait() sees the result; only barrier() blocks the host. A Work holds every
// tensor it touches (inputs, outputs, scratch) until then: after wait() the
// compute stream is ordered after the collective, so the caching allocator
// may hand those blocks to compute work again.
//
// Exactness, as in the MPI backend (core/comm_mpi.cpp): BF16 Sum/Avg are
// upcast into F32 scratch, summed there and rounded to BF16 once (after the
// division for Avg); F32 Avg is a Sum followed by x / n; F32/BF16 Max runs as
// an unsigned max over order-preserving keys (core/cuda/comm_kernels.h), so a
// NaN on any rank gives the canonical quiet NaN and +0 beats -0.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "core/comm.h"
#include "core/cuda/comm_kernels.h"
#include "core/cuda/cuda_runtime.h"
#include "core/cuda/dynload.h"
#include "core/cuda/stream.h"

namespace st {

namespace {

/// Throws st::Error for a failed NCCL call. System and internal errors carry
/// NCCL's own last-error text, which names the failing socket, peer or file.
[[noreturn]] void throw_nccl_error(ncclResult_t rc, const char* call, ncclComm_t comm, const char* file, int line) {
  std::string message =
      format("NCCL call failed: {}: {}", cuda::call_text(call), ST_CUDA_LIB_CALL(ncclGetErrorString)(rc));
  if (rc == ncclSystemError || rc == ncclInternalError) {
    const char* last = ST_CUDA_LIB_CALL(ncclGetLastError)(comm);
    if (last != nullptr && last[0] != '\0') message += format(" ({})", last);
  }
  ::st::detail::throw_error(file, line, message);
}

}  // namespace

}  // namespace st

/// Wraps an NCCL call on communicator `comm` (nullptr before one exists);
/// anything but ncclSuccess throws st::Error.
#define NCCL_CHECK_COMM(comm, call)                                           \
  do {                                                                        \
    ncclResult_t st_nccl_rc_ = (call);                                        \
    if (st_nccl_rc_ != ncclSuccess) [[unlikely]]                              \
      ::st::throw_nccl_error(st_nccl_rc_, #call, (comm), __FILE__, __LINE__); \
  } while (0)
#define NCCL_CHECK(call) NCCL_CHECK_COMM(nullptr, call)

namespace st {

namespace {

// --- RAII handles -----------------------------------------------------------------

/// Owns an NCCL communicator. Destroyed normally (ncclCommDestroy, which
/// lets issued work finish) unless an error was seen on it, in which case it
/// is aborted: a peer may be gone and a normal destroy could wait forever.
class NcclComm {
 public:
  NcclComm(ncclComm_t comm, int device) : comm_(comm), device_(device) {}
  NcclComm(NcclComm&& other) noexcept
      : comm_(std::exchange(other.comm_, nullptr)), device_(other.device_), failed_(other.failed_) {}
  NcclComm& operator=(NcclComm&&) = delete;
  NcclComm(const NcclComm&) = delete;
  NcclComm& operator=(const NcclComm&) = delete;
  ~NcclComm() {
    if (comm_ == nullptr) return;
    // The communicator's GPU must be current; failures have no one to report to.
    int previous = -1;
    bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != device_;
    if (restore) (void)cudaSetDevice(device_);
    ncclResult_t rc = failed_ ? ST_CUDA_LIB_CALL(ncclCommAbort)(comm_) : ST_CUDA_LIB_CALL(ncclCommDestroy)(comm_);
    if (rc != ncclSuccess)
      std::fprintf(stderr, "shardtrain: releasing the NCCL communicator on cuda:%d failed: %s\n", device_,
                   ST_CUDA_LIB_CALL(ncclGetErrorString)(rc));
    if (restore) (void)cudaSetDevice(previous);
  }

  ncclComm_t get() const { return comm_; }
  /// From now on the destructor aborts instead of destroying.
  void mark_failed() { failed_ = true; }

 private:
  ncclComm_t comm_;
  int device_;
  bool failed_ = false;
};

/// What a group and its in-flight Works share: a Work may outlive its group's
/// handle and still needs the communicator (async errors) and the event pool.
/// Members are destroyed bottom-up: events, then the communicator (which
/// lets work on the stream finish), then the stream.
struct NcclState {
  NcclState(int device_index, cuda::Stream comm_stream, NcclComm communicator)
      : device(device_index), stream(std::move(comm_stream)), comm(std::move(communicator)) {}

  /// An event for a collective's completion, from the pool when one is idle:
  /// creating one per collective would call into the driver on the hot path.
  cuda::Event acquire_event() {
    {
      std::lock_guard lock(mutex);
      if (!idle_events.empty()) {
        cuda::Event e = std::move(idle_events.back());
        idle_events.pop_back();
        return e;
      }
    }
    return cuda::Event();
  }
  void release_event(cuda::Event event) noexcept {
    try {
      std::lock_guard lock(mutex);
      idle_events.push_back(std::move(event));
    } catch (...) {
      // Out of memory growing the pool: the event is simply destroyed.
    }
  }

  /// Throws when NCCL reported an asynchronous failure (a peer vanished, a
  /// network error); the communicator is then aborted at destruction.
  void check_async_error(const std::string& what) {
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK_COMM(comm.get(), ST_CUDA_LIB_CALL(ncclCommGetAsyncError)(comm.get(), &async));
    if (async == ncclSuccess || async == ncclInProgress) return;
    comm.mark_failed();
    const char* last = ST_CUDA_LIB_CALL(ncclGetLastError)(comm.get());
    ST_FAIL("{} failed: NCCL reported an asynchronous error on cuda:{}: {}{}", what, device,
            ST_CUDA_LIB_CALL(ncclGetErrorString)(async),
            last != nullptr && last[0] != '\0' ? format(" ({})", last) : std::string());
  }

  int device;
  cuda::Stream stream;  // the communication stream
  NcclComm comm;
  std::mutex mutex;  // guards idle_events: Works may finish on other threads
  std::vector<cuda::Event> idle_events;
};

/// How wait() completes: ordering the compute stream (every collective but
/// barrier) or blocking the host (barrier).
enum class Completion : uint8_t { OrderComputeStream, BlockHost };

class NcclWork final : public Work::Impl {
 public:
  NcclWork(std::shared_ptr<NcclState> state, std::string what, std::vector<Tensor> kept, Completion completion)
      : state_(std::move(state)),
        what_(std::move(what)),
        kept_(std::move(kept)),
        done_(state_->acquire_event()),
        completion_(completion) {}
  NcclWork(const NcclWork&) = delete;
  NcclWork& operator=(const NcclWork&) = delete;
  ~NcclWork() override {
    if (!waited_) {
      // Only reached when wait() threw: the kept buffers are about to go back
      // to the allocator, so compute work must still be ordered after the
      // collective (a no-op cost once the failed communicator is aborted).
      (void)cudaStreamWaitEvent(compute_stream_or_null(), done_.get(), 0);
    }
    state_->release_event(std::move(done_));
  }

  /// Marks the end of the collective's work on the comm stream.
  void record_done() { done_.record(state_->stream.get()); }

  void wait() override {
    state_->check_async_error(what_);
    cuda::DeviceGuard guard(state_->device);
    if (completion_ == Completion::BlockHost) {
      // Poll rather than synchronize, so that a peer's failure reported
      // asynchronously ends the wait with an error instead of a hang.
      while (!done_.query()) {
        state_->check_async_error(what_);
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    } else {
      done_.block(cuda::compute_stream(state_->device));
    }
    waited_ = true;
    kept_.clear();
  }

  bool test() override {
    state_->check_async_error(what_);
    return done_.query();
  }

 private:
  cudaStream_t compute_stream_or_null() noexcept {
    try {
      return cuda::compute_stream(state_->device);
    } catch (...) {
      return nullptr;
    }
  }

  std::shared_ptr<NcclState> state_;
  std::string what_;  // "all_reduce(Sum) of 1024 BF16 elements on rank 1 of 4 (cuda:1)"
  std::vector<Tensor> kept_;
  cuda::Event done_;
  Completion completion_;
  bool waited_ = false;
};

ncclDataType_t nccl_type(DType dtype) {
  switch (dtype) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::I32: return ncclInt32;
  }
  ST_FAIL("no NCCL datatype for {}", dtype);
}

uint16_t* bf16_ptr(const Tensor& t) { return static_cast<uint16_t*>(t.raw_data()); }
float* f32_ptr(const Tensor& t) { return static_cast<float*>(t.raw_data()); }
uint32_t* u32_ptr(const Tensor& t) { return static_cast<uint32_t*>(t.raw_data()); }

/// ncclGroupStart .. ncclGroupEnd; a throw in between still ends the group.
class NcclGroupCall {
 public:
  explicit NcclGroupCall(ncclComm_t comm) : comm_(comm) { NCCL_CHECK_COMM(comm_, ST_CUDA_LIB_CALL(ncclGroupStart)()); }
  NcclGroupCall(const NcclGroupCall&) = delete;
  NcclGroupCall& operator=(const NcclGroupCall&) = delete;
  ~NcclGroupCall() {
    if (open_) (void)ST_CUDA_LIB_CALL(ncclGroupEnd)();
  }
  void end() {
    open_ = false;
    NCCL_CHECK_COMM(comm_, ST_CUDA_LIB_CALL(ncclGroupEnd)());
  }

 private:
  ncclComm_t comm_;
  bool open_ = true;
};

/// The communication stream's priority: the most urgent the GPU offers, so
/// collectives are scheduled ahead of compute kernels that are waiting.
int high_priority() {
  int least = 0;
  int greatest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  return greatest;
}

class NcclGroup final : public ProcessGroup {
 public:
  /// `bootstrap` spans the same ranks in the same order as `comm`; it carries
  /// unique ids when NCCL cannot split, and is split alongside this group.
  NcclGroup(std::unique_ptr<ProcessGroup> bootstrap, NcclComm comm, int device, cuda::Stream stream)
      : bootstrap_(std::move(bootstrap)),
        state_(std::make_shared<NcclState>(device, std::move(stream), std::move(comm))),
        ready_() {
    NCCL_CHECK_COMM(state_->comm.get(), ST_CUDA_LIB_CALL(ncclCommUserRank)(state_->comm.get(), &rank_));
    NCCL_CHECK_COMM(state_->comm.get(), ST_CUDA_LIB_CALL(ncclCommCount)(state_->comm.get(), &size_));
    ST_CHECK(rank_ == bootstrap_->rank() && size_ == bootstrap_->size(),
             "NCCL communicator is rank {} of {} but its bootstrap group is rank {} of {}", rank_, size_,
             bootstrap_->rank(), bootstrap_->size());
    // One element for barrier(): reused, since only the wire traffic matters.
    barrier_buf_ = Tensor::zeros({1}, DType::I32, Device::cuda(device));
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string backend_name() const override { return "nccl"; }

  Work all_gather(const Tensor& out, const Tensor& in, const AllGatherOptions&) override {
    check_all_gather(out, in);
    check_on_gpu("all_gather", "out", out);
    const size_t n = static_cast<size_t>(in.numel());
    Tensor send = in;
    const char* slot = static_cast<const char*>(out.raw_data()) + static_cast<size_t>(rank_) * in.nbytes();
    // NCCL gathers in place when the input is exactly this rank's slot (FSDP's
    // case); any other overlap would be overwritten mid-flight, so copy first.
    if (in.raw_data() != slot && memory_overlaps(in, out)) send = in.clone();
    return issue(describe("all_gather", in), {out, in, send}, Completion::OrderComputeStream,
                 [&](ncclComm_t comm, cudaStream_t stream) {
                   if (n == 0) return;
                   NCCL_CHECK_COMM(comm, ST_CUDA_LIB_CALL(ncclAllGather)(send.raw_data(), out.raw_data(), n,
                                                                         nccl_type(in.dtype()), comm, stream));
                 });
  }

  Work reduce_scatter(const Tensor& out, const Tensor& in, const ReduceScatterOptions& opts) override {
    check_reduce_scatter(out, in, opts.op);
    check_on_gpu("reduce_scatter", "out", out);
    const int64_t n = out.numel();
    const float divisor = divisor_for(opts.op);
    const Device gpu = out.device();
    std::string what = describe(format("reduce_scatter({})", opts.op), out);
    if (out.dtype() == DType::BF16) {
      Tensor in32 = Tensor::empty({in.numel()}, DType::F32, gpu);
      Tensor out32 = Tensor::empty({n}, DType::F32, gpu);
      return issue(std::move(what), {out, in, in32, out32}, Completion::OrderComputeStream,
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     if (n == 0) return;
                     cuda::bf16_to_f32(bf16_ptr(in), f32_ptr(in32), in.numel(), stream);
                     NCCL_CHECK_COMM(comm, ST_CUDA_LIB_CALL(ncclReduceScatter)(in32.raw_data(), out32.raw_data(),
                                                                               static_cast<size_t>(n), ncclFloat32,
                                                                               ncclSum, comm, stream));
                     cuda::f32_to_bf16_divided(f32_ptr(out32), bf16_ptr(out), n, divisor, stream);
                   });
    }
    Tensor send = in;
    const char* slot = static_cast<const char*>(in.raw_data()) + static_cast<size_t>(rank_) * out.nbytes();
    if (out.raw_data() != slot && memory_overlaps(in, out)) send = in.clone();
    return issue(
        std::move(what), {out, in, send}, Completion::OrderComputeStream, [&](ncclComm_t comm, cudaStream_t stream) {
          if (n == 0) return;
          NCCL_CHECK_COMM(comm,
                          ST_CUDA_LIB_CALL(ncclReduceScatter)(send.raw_data(), out.raw_data(), static_cast<size_t>(n),
                                                              nccl_type(out.dtype()), ncclSum, comm, stream));
          if (opts.op == ReduceOp::Avg) cuda::f32_divide(f32_ptr(out), n, divisor, stream);
        });
  }

  Work all_reduce(const Tensor& t, const AllReduceOptions& opts) override {
    check_all_reduce(t, opts.op);
    check_on_gpu("all_reduce", "t", t);
    const int64_t n = t.numel();
    const auto count = static_cast<size_t>(n);
    const Device gpu = t.device();
    std::string what = describe(format("all_reduce({})", opts.op), t);
    if (opts.op == ReduceOp::Max && t.dtype() != DType::I32) {
      Tensor keys = Tensor::empty({n}, DType::I32, gpu);  // uint32 keys, stored in an I32 buffer
      const bool bf16 = t.dtype() == DType::BF16;
      return issue(std::move(what), {t, keys}, Completion::OrderComputeStream,
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     if (n == 0) return;
                     if (bf16) {
                       cuda::bf16_to_max_keys(bf16_ptr(t), u32_ptr(keys), n, stream);
                     } else {
                       cuda::f32_to_max_keys(f32_ptr(t), u32_ptr(keys), n, stream);
                     }
                     NCCL_CHECK_COMM(comm, ST_CUDA_LIB_CALL(ncclAllReduce)(keys.raw_data(), keys.raw_data(), count,
                                                                           ncclUint32, ncclMax, comm, stream));
                     if (bf16) {
                       cuda::max_keys_to_bf16(u32_ptr(keys), bf16_ptr(t), n, stream);
                     } else {
                       cuda::max_keys_to_f32(u32_ptr(keys), f32_ptr(t), n, stream);
                     }
                   });
    }
    if (opts.op == ReduceOp::Max) {  // I32: NCCL's max is exact
      return issue(std::move(what), {t}, Completion::OrderComputeStream, [&](ncclComm_t comm, cudaStream_t stream) {
        if (n == 0) return;
        NCCL_CHECK_COMM(
            comm, ST_CUDA_LIB_CALL(ncclAllReduce)(t.raw_data(), t.raw_data(), count, ncclInt32, ncclMax, comm, stream));
      });
    }
    const float divisor = divisor_for(opts.op);
    if (t.dtype() == DType::BF16) {
      Tensor t32 = Tensor::empty({n}, DType::F32, gpu);
      return issue(std::move(what), {t, t32}, Completion::OrderComputeStream,
                   [&](ncclComm_t comm, cudaStream_t stream) {
                     if (n == 0) return;
                     cuda::bf16_to_f32(bf16_ptr(t), f32_ptr(t32), n, stream);
                     NCCL_CHECK_COMM(comm, ST_CUDA_LIB_CALL(ncclAllReduce)(t32.raw_data(), t32.raw_data(), count,
                                                                           ncclFloat32, ncclSum, comm, stream));
                     cuda::f32_to_bf16_divided(f32_ptr(t32), bf16_ptr(t), n, divisor, stream);
                   });
    }
    return issue(std::move(what), {t}, Completion::OrderComputeStream, [&](ncclComm_t comm, cudaStream_t stream) {
      if (n == 0) return;
      NCCL_CHECK_COMM(comm, ST_CUDA_LIB_CALL(ncclAllReduce)(t.raw_data(), t.raw_data(), count, nccl_type(t.dtype()),
                                                            ncclSum, comm, stream));
      if (opts.op == ReduceOp::Avg) cuda::f32_divide(f32_ptr(t), n, divisor, stream);
    });
  }

  Work broadcast(const Tensor& t, const BroadcastOptions& opts) override {
    check_broadcast(t, opts.root);
    check_on_gpu("broadcast", "t", t);
    const auto n = static_cast<size_t>(t.numel());
    return issue(describe(format("broadcast(root {})", opts.root), t), {t}, Completion::OrderComputeStream,
                 [&](ncclComm_t comm, cudaStream_t stream) {
                   if (n == 0) return;
                   NCCL_CHECK_COMM(comm,
                                   ST_CUDA_LIB_CALL(ncclBroadcast)(t.raw_data(), t.raw_data(), n, nccl_type(t.dtype()),
                                                                   opts.root, comm, stream));
                 });
  }

  Work all_to_allv(const Tensor& out, std::span<const int64_t> recv_counts, const Tensor& in,
                   std::span<const int64_t> send_counts, const AllToAllOptions&) override {
    check_all_to_allv(out, recv_counts, in, send_counts);
    check_on_gpu("all_to_allv", "out", out);
    // Sends and receives of one group run concurrently, so an input that
    // shares bytes with the output is read from a copy.
    Tensor send = memory_overlaps(in, out) ? in.clone() : in;
    const size_t width = dtype_size(in.dtype());
    const ncclDataType_t type = nccl_type(in.dtype());
    return issue(
        describe("all_to_allv", in), {out, in, send}, Completion::OrderComputeStream,
        [&](ncclComm_t comm, cudaStream_t stream) {
          NcclGroupCall group(comm);
          const char* src = static_cast<const char*>(send.raw_data());
          char* dst = static_cast<char*>(out.raw_data());
          size_t send_offset = 0;
          size_t recv_offset = 0;
          for (int peer = 0; peer < size_; ++peer) {
            auto s = static_cast<size_t>(send_counts[static_cast<size_t>(peer)]);
            auto r = static_cast<size_t>(recv_counts[static_cast<size_t>(peer)]);
            // A zero count on one side is a zero count on the other
            // (the caller's contract), so both skip the pair.
            if (s > 0)
              NCCL_CHECK_COMM(comm, ST_CUDA_LIB_CALL(ncclSend)(src + send_offset * width, s, type, peer, comm, stream));
            if (r > 0)
              NCCL_CHECK_COMM(comm, ST_CUDA_LIB_CALL(ncclRecv)(dst + recv_offset * width, r, type, peer, comm, stream));
            send_offset += s;
            recv_offset += r;
          }
          group.end();
        });
  }

  Work barrier(const BarrierOptions&) override {
    return issue(format("barrier on rank {} of {} (cuda:{})", rank_, size_, state_->device), {barrier_buf_},
                 Completion::BlockHost, [&](ncclComm_t comm, cudaStream_t stream) {
                   NCCL_CHECK_COMM(comm,
                                   ST_CUDA_LIB_CALL(ncclAllReduce)(barrier_buf_.raw_data(), barrier_buf_.raw_data(), 1,
                                                                   ncclInt32, ncclSum, comm, stream));
                 });
  }

  std::unique_ptr<ProcessGroup> split(int color, int key) override {
    cuda::DeviceGuard guard(state_->device);
    // The bootstrap splits the same way, so every sub-group can carry ids to
    // (or split for) its own children.
    std::unique_ptr<ProcessGroup> sub_bootstrap = bootstrap_->split(color, key);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    ncclComm_t sub = nullptr;
    NCCL_CHECK_COMM(state_->comm.get(),
                    ST_CUDA_LIB_CALL(ncclCommSplit)(state_->comm.get(), color < 0 ? NCCL_SPLIT_NOCOLOR : color, key,
                                                    &sub, nullptr));
    if (color < 0) return nullptr;
    ST_CHECK(sub != nullptr && sub_bootstrap != nullptr,
             "split(color {}, key {}) on rank {} of {}: NCCL or the bootstrap group returned no sub-group", color, key,
             rank_, size_);
    NcclComm sub_comm(sub, state_->device);
    return std::make_unique<NcclGroup>(std::move(sub_bootstrap), std::move(sub_comm), state_->device,
                                       cuda::Stream(high_priority()));
#else
    // NCCL before 2.18 cannot split: the sub-group bootstraps from a new id.
    if (sub_bootstrap == nullptr) return nullptr;
    return create(std::move(sub_bootstrap), state_->device);
#endif
  }

  /// A group over `bootstrap`'s ranks on GPU `device`, from a fresh unique id.
  static std::unique_ptr<ProcessGroup> create(std::unique_ptr<ProcessGroup> bootstrap, int device) {
    cuda::DeviceGuard guard(device);
    ncclUniqueId id;
    std::memset(&id, 0, sizeof(id));
    if (bootstrap->rank() == 0) NCCL_CHECK(ST_CUDA_LIB_CALL(ncclGetUniqueId)(&id));
    // The id's bytes travel as I32 words: every backend can broadcast those.
    constexpr int64_t kWords = (sizeof(ncclUniqueId) + 3) / 4;
    Tensor words = Tensor::zeros({kWords}, DType::I32);
    std::memcpy(words.raw_data(), &id, sizeof(id));
    bootstrap->broadcast(words, {.root = 0}).wait();
    std::memcpy(&id, words.raw_data(), sizeof(id));
    cuda::Stream stream(high_priority());
    ncclComm_t comm = nullptr;
    NCCL_CHECK(ST_CUDA_LIB_CALL(ncclCommInitRank)(&comm, bootstrap->size(), id, bootstrap->rank()));
    NcclComm owned(comm, device);
    return std::make_unique<NcclGroup>(std::move(bootstrap), std::move(owned), device, std::move(stream));
  }

 private:
  /// Fences `body` after the compute stream's work, runs it on the comm
  /// stream and returns a Work that holds `kept` until it is waited for.
  template <class Body>
  Work issue(std::string what, std::vector<Tensor> kept, Completion completion, Body&& body) {
    cuda::DeviceGuard guard(state_->device);
    state_->check_async_error(what);
    cudaStream_t comm_stream = state_->stream.get();
    ready_.record(cuda::compute_stream(state_->device));
    ready_.block(comm_stream);
    auto work = std::make_unique<NcclWork>(state_, std::move(what), std::move(kept), completion);
    try {
      body(state_->comm.get(), comm_stream);
    } catch (...) {
      // The collective may be half-issued on some ranks: this communicator
      // cannot be trusted to drain, so it is aborted rather than destroyed.
      state_->comm.mark_failed();
      // The work is destroyed unwaited, which orders the compute stream after
      // done_ before its scratch goes back to the cache: record done_ after
      // whatever part of the body did reach the comm stream (a conversion
      // kernel, say), or that wait would pass at once and the compute stream
      // could reuse a block the comm stream is still writing.
      try {
        work->record_done();
      } catch (...) {
        // A broken context: the first error is the one to report.
      }
      throw;
    }
    work->record_done();
    return Work(std::move(work));
  }

  void check_on_gpu(const char* op, const char* name, const Tensor& t) const {
    // Checked on one tensor: the shared checks already require one device per call.
    ST_CHECK(t.device() == Device::cuda(state_->device),
             "{}: {} is on {}, but this NCCL group communicates on cuda:{}; move it there with "
             ".to(Device::cuda({})) (rank {})",
             op, name, t.device(), state_->device, state_->device, rank_);
  }

  float divisor_for(ReduceOp op) const { return op == ReduceOp::Avg ? static_cast<float>(size_) : 1.0f; }

  std::string describe(const std::string& op, const Tensor& t) const {
    return format("{} of {} {} elements on rank {} of {} (cuda:{})", op, t.numel(), t.dtype(), rank_, size_,
                  state_->device);
  }

  std::unique_ptr<ProcessGroup> bootstrap_;
  std::shared_ptr<NcclState> state_;
  cuda::Event ready_;  // re-recorded per collective: a wait captures it when issued
  Tensor barrier_buf_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<ProcessGroup> make_nccl_group(ProcessGroup& bootstrap, int device) {
  const int count = cuda::device_count();
  ST_CHECK(count > 0, "the NCCL backend for cuda:{} was requested on rank {}, but no CUDA GPU is visible", device,
           bootstrap.rank());
  ST_CHECK(device >= 0 && device < count,
           "the NCCL backend was asked for cuda:{} on rank {}, but {} GPU(s) are visible; pick the device as "
           "local_rank % device_count()",
           device, bootstrap.rank(), count);
  // A private copy of the bootstrap group (same ranks, same order): the
  // group outlives the caller's reference and splits it along with itself.
  std::unique_ptr<ProcessGroup> own = bootstrap.split(0, bootstrap.rank());
  ST_CHECK(own != nullptr, "make_nccl_group: splitting the bootstrap group returned no group (rank {})",
           bootstrap.rank());
  return NcclGroup::create(std::move(own), device);
}

}  // namespace st
