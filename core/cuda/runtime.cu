// CUDA implementation of core/cuda/cuda_runtime.h (built with ST_WITH_CUDA).
// Host code only: device discovery, a per-GPU allocator and synchronous
// copies. Every call that can fail goes through CUDA_CHECK. A machine without
// a GPU (or without a driver) is not an error until a GPU is asked for, so
// CPU runs and CPU tests work with a CUDA build.
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "core/cuda/cuda_check.h"
#include "core/cuda/cuda_runtime.h"
#include "core/error.h"

namespace st::cuda {

namespace {

// Makes GPU `index` current for the lifetime of the guard and restores the
// previous one after, so core/ never changes which GPU the caller works on.
class DeviceGuard {
 public:
  explicit DeviceGuard(int index) {
    CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != index) {
      CUDA_CHECK(cudaSetDevice(index));
      changed_ = true;
    }
  }
  ~DeviceGuard() {
    // A destructor must not throw; restoring can only fail if the context is
    // already broken, and the next checked call will report that.
    if (changed_) (void)cudaSetDevice(previous_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

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

// Returns memory straight to the driver: cudaMalloc/cudaFree synchronise the
// device and are slow, so a caching allocator replaces this one in a later
// issue; the stats it records already have the meaning the trainer logs.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}

  void* allocate(size_t nbytes) override {
    DeviceGuard guard(index_);
    void* ptr = nullptr;
    cudaError_t rc = cudaMalloc(&ptr, nbytes);
    if (rc == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      AllocatorStats s = stats();
      ST_FAIL("out of GPU memory on cuda:{} allocating {} bytes ({} bytes held by tensors, peak {})", index_, nbytes,
              s.current_bytes, s.peak_bytes);
    }
    if (rc != cudaSuccess) detail::throw_cuda_error(rc, "cudaMalloc(&ptr, nbytes)", __FILE__, __LINE__);
    record_alloc(nbytes);
    return ptr;
  }

  void deallocate(void* ptr, size_t nbytes) noexcept override {
    record_free(nbytes);
    if (ptr == nullptr) return;
    int previous = 0;
    bool restore = cudaGetDevice(&previous) == cudaSuccess && previous != index_;
    if (restore) (void)cudaSetDevice(index_);
    cudaError_t rc = cudaFree(ptr);
    if (restore) (void)cudaSetDevice(previous);
    // Cannot throw here (Storage's destructor). At process exit the runtime
    // may already be unloaded, and the memory goes back with the context.
    if (rc != cudaSuccess && rc != cudaErrorCudartUnloading) {
      (void)cudaGetLastError();
      std::fprintf(stderr, "shardtrain: cudaFree of %zu bytes on cuda:%d failed: %s\n", nbytes, index_,
                   cudaGetErrorString(rc));
    }
  }

  Device device() const override { return Device::cuda(index_); }

 private:
  int index_;
};

// Makes a copy "synchronous" in the sense the header promises: the bytes are
// in place when the call returns, whichever stream reads them next (cudaMemcpy
// into device memory may return before the DMA finishes).
void finish_default_stream(int index) {
  DeviceGuard guard(index);
  CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
}

}  // namespace

bool compiled_with_cuda() { return true; }

int device_count() {
  // The visible set cannot change once the runtime is initialised, so ask once.
  static const int count = query_device_count();
  return count;
}

Allocator& device_allocator(int index) {
  int count = device_count();
  ST_CHECK(count > 0, "cuda:{} requested, but no CUDA GPU is visible (no device or no driver); run on the CPU instead",
           index);
  ST_CHECK(index >= 0 && index < count, "cuda:{} requested, but only {} CUDA GPU(s) are visible", index, count);
  // One allocator per GPU for the whole process, like cpu_allocator(): their
  // counters must see every tensor on that GPU.
  static const std::vector<std::unique_ptr<CudaAllocator>> allocators = [count] {
    std::vector<std::unique_ptr<CudaAllocator>> v;
    for (int i = 0; i < count; ++i) v.push_back(std::make_unique<CudaAllocator>(i));
    return v;
  }();
  return *allocators[static_cast<size_t>(index)];
}

void copy_bytes(void* dst, Device dst_device, const void* src, Device src_device, size_t nbytes) {
  if (nbytes == 0) return;
  if (dst_device.is_cpu() && src_device.is_cpu()) {
    std::memmove(dst, src, nbytes);
    return;
  }
  if (src_device.is_cpu()) {
    check_device(dst_device, "copy_bytes destination");
    DeviceGuard guard(dst_device.index);
    CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice));
    finish_default_stream(dst_device.index);
  } else if (dst_device.is_cpu()) {
    check_device(src_device, "copy_bytes source");
    DeviceGuard guard(src_device.index);
    CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToHost));
  } else if (dst_device.index == src_device.index) {
    check_device(dst_device, "copy_bytes");
    DeviceGuard guard(dst_device.index);
    CUDA_CHECK(cudaMemcpy(dst, src, nbytes, cudaMemcpyDeviceToDevice));
    finish_default_stream(dst_device.index);
  } else {
    check_device(src_device, "copy_bytes source");
    check_device(dst_device, "copy_bytes destination");
    CUDA_CHECK(cudaMemcpyPeer(dst, dst_device.index, src, src_device.index, nbytes));
    // A peer copy is ordered with both devices' work but not with the host.
    DeviceGuard guard(dst_device.index);
    CUDA_CHECK(cudaDeviceSynchronize());
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
  CUDA_CHECK(cudaMemset(dst, 0, nbytes));
  finish_default_stream(device.index);
}

}  // namespace st::cuda
