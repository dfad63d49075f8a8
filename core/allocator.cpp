#include "core/allocator.h"

#include <cstdlib>
#include <new>

#include "core/cuda/cuda_runtime.h"
#include "core/error.h"

namespace st {

AllocatorStats Allocator::stats() const {
  return {current_.load(std::memory_order_relaxed), peak_.load(std::memory_order_relaxed),
          count_.load(std::memory_order_relaxed)};
}

void Allocator::reset_peak() { peak_.store(current_.load(std::memory_order_relaxed), std::memory_order_relaxed); }

void Allocator::record_alloc(size_t nbytes) {
  int64_t now =
      current_.fetch_add(static_cast<int64_t>(nbytes), std::memory_order_relaxed) + static_cast<int64_t>(nbytes);
  count_.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

void Allocator::record_free(size_t nbytes) {
  current_.fetch_sub(static_cast<int64_t>(nbytes), std::memory_order_relaxed);
}

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    // aligned_alloc needs a size that is a multiple of the alignment.
    size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    if (rounded == 0) rounded = kCpuAlignment;
    void* p = std::aligned_alloc(kCpuAlignment, rounded);
    ST_CHECK(p != nullptr, "out of host memory allocating {} bytes", nbytes);
    record_alloc(nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) noexcept override {
    std::free(ptr);
    record_free(nbytes);
  }
  Device device() const override { return Device::cpu(); }
};

}  // namespace

Allocator& cpu_allocator() {
  // The one process-wide object in core: host memory is a process resource,
  // and its counters must see every tensor.
  static CpuAllocator allocator;
  return allocator;
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  return cuda::device_allocator(device.index);
}

Storage::Storage(size_t nbytes, Allocator& allocator)
    : data_(allocator.allocate(nbytes)), nbytes_(nbytes), allocator_(&allocator) {}

Storage::~Storage() { allocator_->deallocate(data_, nbytes_); }

}  // namespace st
