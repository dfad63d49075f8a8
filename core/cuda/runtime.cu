// CUDA implementation of core/cuda/cuda_runtime.h (built with ST_WITH_CUDA).
// Host code only: device discovery, the per-GPU caching allocator and
// compute stream, stream/event handles and copies. Every call that can fail goes through CUDA_CHECK. A machine without
// a GPU (or without a driver) is not an error until a GPU is asked for, so
// CPU runs and CPU tests work with a CUDA build.
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_runtime.h"
#include "core/cuda/stream.h"
#include "core/error.h"

namespace st::cuda {

namespace {

int query_device_count() {
  int count = 0;
  cudaError_t rc = cudaGetDeviceCount(&count);
  // "No GPU" and "no driver" both mean this machine has nothing to offer;
  // anything else (a driver/runtime mismatch, say) is a broken setup the user
  // should hear about rather than silently train on the CPU.
  if (rc == cudaErrorNoDevice || rc == cudaErrorInsufficientDriver) {
    (void)cudaGetLastError();
    return 0;
  }
  if (rc != cudaSuccess) detail::throw_cuda_error(rc, "cudaGetDeviceCount(&count)", __FILE__, __LINE__);
  return count;
}

void check_device(Device device, const char* what) {
  ST_CHECK(device.is_cuda(), "{}: expected a CUDA device, got {}", what, device);
  int count = device_count();
  ST_CHECK(device.index >= 0 && device.index < count, "{}: {} requested, but {} CUDA GPU(s) are visible", what, device,
           count);
}

// Device memory for the caching allocator: cudaMalloc/cudaFree on one GPU,
// the GPU's compute stream as every allocation's stream, and pooled events
// as the markers that tell when another stream is done with a block.
class CudaBlockSource final : public BlockSource {
 public:
  explicit CudaBlockSource(int index) : index_(index) {}
  ~CudaBlockSource() override {
    for (cudaEvent_t ev : idle_events_) (void)cudaEventDestroy(ev);
  }

  void* allocate(size_t nbytes) override {
    DeviceGuard guard(index_);
    void* ptr = nullptr;
    cudaError_t rc = cudaMalloc(&ptr, nbytes);
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;
    }
    if (rc != cudaSuccess) detail::throw_cuda_error(rc, "cudaMalloc(&ptr, nbytes)", __FILE__, __LINE__);
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) noexcept override {
    int previous = 0;
    bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != index_;
    if (restore) (void)cudaSetDevice(index_);
    // cudaFree waits for the device, so blocks in flight on any stream are safe.
    cudaError_t rc = cudaFree(ptr);
    if (restore) (void)cudaSetDevice(previous);
    // Cannot throw here. At process exit the runtime may already be unloaded,
    // and the memory goes back with the context.
    if (rc != cudaSuccess && rc != cudaErrorCudartUnloading) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "shardtrain: cudaFree of %zu bytes on cuda:%d failed: %s\n", nbytes, index_,
                   cudaGetErrorString(rc));
    }
  }

  StreamId current_stream() override { return reinterpret_cast<StreamId>(compute_stream(index_)); }

  EventId record_event(StreamId stream) override {
    DeviceGuard guard(index_);
    cudaEvent_t ev = nullptr;
    if (!idle_events_.empty()) {
      ev = idle_events_.back();
      idle_events_.pop_back();
    } else {
      CUDA_CHECK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    }
    CUDA_CHECK(cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(stream)));
    return reinterpret_cast<EventId>(ev);
  }

  bool event_done(EventId event) override {
    cudaError_t rc = cudaEventQuery(reinterpret_cast<cudaEvent_t>(event));
    if (rc == cudaErrorNotReady) {
      (void)cudaGetLastError();
      return false;
    }
    if (rc != cudaSuccess) detail::throw_cuda_error(rc, "cudaEventQuery(event)", __FILE__, __LINE__);
    return true;
  }

  void wait_event(EventId event) override { CUDA_CHECK(cudaEventSynchronize(reinterpret_cast<cudaEvent_t>(event))); }

  // Called with the allocator's lock held, so the pool needs no lock of its own.
  void release_event(EventId event) noexcept override { idle_events_.push_back(reinterpret_cast<cudaEvent_t>(event)); }

  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
  std::vector<cudaEvent_t> idle_events_;
};

struct DeviceState {
  std::unique_ptr<CachingAllocator> allocator;
  std::once_flag stream_once;
  cudaStream_t stream = nullptr;  // never destroyed: it lives as long as the context
};

// One entry per visible GPU for the whole process, like cpu_allocator(): the
// counters must see every tensor on that GPU, and every op shares the stream.
std::vector<DeviceState>& device_states() {
  static std::vector<DeviceState> states = [] {
    std::vector<DeviceState> v(static_cast<size_t>(device_count()));
    for (size_t i = 0; i < v.size(); ++i)
      v[i].allocator = std::make_unique<CachingAllocator>(std::make_unique<CudaBlockSource>(static_cast<int>(i)));
    return v;
  }();
  return states;
}

DeviceState& state_of(int index) {
  int count = device_count();
  ST_CHECK(count > 0, "cuda:{} requested, but no CUDA GPU is visible (no device or no driver); run on the CPU instead",
           index);
  ST_CHECK(index >= 0 && index < count, "cuda:{} requested, but only {} CUDA GPU(s) are visible", index, count);
  return device_states()[static_cast<size_t>(index)];
}

}  // namespace

bool compiled_with_cuda() { return true; }

int device_count() {
  // The visible set cannot change once the runtime is initialised, so ask once.
  static const int kCount = query_device_count();
  return kCount;
}

std::string device_name(int index) {
  state_of(index);
  cudaDeviceProp prop{};
  CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  return prop.name;
}

void set_device(int index) {
  state_of(index);
  CUDA_CHECK(cudaSetDevice(index));
}

Allocator& device_allocator(int index) { return *state_of(index).allocator; }

CacheStats cache_stats(int index) { return state_of(index).allocator->cache_stats(); }

void empty_cache(int index) { state_of(index).allocator->empty_cache(); }

cudaStream_t compute_stream(int index) {
  DeviceState& state = state_of(index);
  std::call_once(state.stream_once, [&] {
    DeviceGuard guard(index);
    CUDA_CHECK(cudaStreamCreateWithFlags(&state.stream, cudaStreamNonBlocking));
  });
  return state.stream;
}

void record_stream(void* ptr, int device, cudaStream_t stream) {
  state_of(device).allocator->record_stream(ptr, reinterpret_cast<StreamId>(stream));
}

void synchronize(int index) {
  DeviceGuard guard(index);
  CUDA_CHECK(cudaStreamSynchronize(compute_stream(index)));
}

// --- Stream and Event ------------------------------------------------------------

Stream::Stream(int priority) { CUDA_CHECK(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority)); }

Stream::~Stream() {
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

void Stream::synchronize() const { CUDA_CHECK(cudaStreamSynchronize(stream_)); }

Event::Event(Timing timing) {
  CUDA_CHECK(cudaEventCreateWithFlags(&event_, timing == Timing::On ? cudaEventDefault : cudaEventDisableTiming));
}

Event::~Event() {
  if (event_ != nullptr) (void)cudaEventDestroy(event_);
}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) (void)cudaEventDestroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

void Event::record(cudaStream_t stream) const { CUDA_CHECK(cudaEventRecord(event_, stream)); }

void Event::block(cudaStream_t stream) const { CUDA_CHECK(cudaStreamWaitEvent(stream, event_, 0)); }

bool Event::query() const {
  cudaError_t rc = cudaEventQuery(event_);
  if (rc == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return false;
  }
  if (rc != cudaSuccess) detail::throw_cuda_error(rc, "cudaEventQuery(event_)", __FILE__, __LINE__);
  return true;
}

void Event::synchronize() const { CUDA_CHECK(cudaEventSynchronize(event_)); }

float Event::elapsed_ms(const Event& start, const Event& end) {
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, end.event_));
  return ms;
}

// --- copies ----------------------------------------------------------------------

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, nbytes);
    return;
  }
  if (src_device.is_cpu() || dst_device.is_cpu()) {
    Device gpu = src_device.is_cpu() ? dst_device : src_device;
    check_device(gpu, src_device.is_cpu() ? "copy_bytes destination" : "copy_bytes source");
    DeviceGuard guard(gpu.index);
    cudaStream_t stream = compute_stream(gpu.index);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, src_device.is_cpu() ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
                               stream));
    // The host buffer may be reused (or read) as soon as we return.
    CUDA_CHECK(cudaStreamSynchronize(stream));
  } else if (dst_device.index == src_device.index) {
    check_device(dst_device, "copy_bytes");
    DeviceGuard guard(dst_device.index);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, compute_stream(dst_device.index)));
  } else {
    check_device(src_device, "copy_bytes source");
    check_device(dst_device, "copy_bytes destination");
    // The source's pending writes finish first; the peer copy then runs on
    // the destination's stream, so later work there sees the bytes.
    synchronize(src_device.index);
    DeviceGuard guard(dst_device.index);
    cudaStream_t dst_stream = compute_stream(dst_device.index);
    CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device.index, src, src_device.index, nbytes, dst_stream));
    // The copy reads src on the destination's stream, which the source's
    // stream knows nothing of: without this fence, later work there (or the
    // caching allocator handing a freed src to it) could overwrite src
    // mid-copy. The event is made on the destination GPU, as recording it on
    // that stream requires; a stream may wait on another GPU's event, and
    // destroying an event whose wait is already enqueued is safe.
    Event copied;
    copied.record(dst_stream);
    copied.block(compute_stream(src_device.index));
  }
}

void zero_bytes(void* dst, Device device, size_t nbytes) {
  if (nbytes == 0) return;
  if (device.is_cpu()) {
    std::memset(dst, 0, nbytes);
    return;
  }
  check_device(device, "zero_bytes");
  DeviceGuard guard(device.index);
  CUDA_CHECK(cudaMemsetAsync(dst, 0, nbytes, compute_stream(device.index)));
}

}  // namespace st::cuda
