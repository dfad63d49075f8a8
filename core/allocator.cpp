#include "core/allocator.h"

#include <cstdlib>
#include <iterator>
#include <map>
#include <mutex>
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

// Freed blocks of kMinCachedBytes or more are kept, by exact size, for the
// next request of that size: a training step repeats the previous step's
// allocations, and memory fresh from the kernel costs a page fault per 4 KiB
// (measured on m8: 8% of a step, most of it serial in the kernel). At most
// kMaxCachedBytes wait in the cache; the largest go back first. Blocks above
// kMaxCachedBlock (checkpoint staging, whole files) go back at once.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kMinCachedBytes = size_t{64} << 10;
  static constexpr size_t kMaxCachedBlock = size_t{256} << 20;
  static constexpr size_t kMaxCachedBytes = size_t{1} << 30;

  void* allocate(size_t nbytes) override {
    const size_t rounded = rounded_size(nbytes);
    void* p = take_cached(rounded);
    if (p == nullptr) p = std::aligned_alloc(kCpuAlignment, rounded);
    if (p == nullptr) throw OutOfMemory(format("out of host memory allocating {} bytes", nbytes), __FILE__, __LINE__);
    record_alloc(nbytes);
    return p;
  }
  void deallocate(void* ptr, size_t nbytes) noexcept override {
    record_free(nbytes);
    const size_t rounded = rounded_size(nbytes);
    if (rounded < kMinCachedBytes || rounded > kMaxCachedBlock) {
      std::free(ptr);
      return;
    }
    std::lock_guard lock(mutex_);
    while (cached_ + rounded > kMaxCachedBytes && !free_.empty()) {
      auto largest = std::prev(free_.end());
      cached_ -= largest->first;
      std::free(largest->second);
      free_.erase(largest);
    }
    free_.emplace(rounded, ptr);
    cached_ += rounded;
  }
  Device device() const override { return Device::cpu(); }

 private:
  // aligned_alloc needs a size that is a multiple of the alignment.
  static size_t rounded_size(size_t nbytes) {
    const size_t rounded = (nbytes + kCpuAlignment - 1) / kCpuAlignment * kCpuAlignment;
    return rounded == 0 ? kCpuAlignment : rounded;
  }

  void* take_cached(size_t rounded) {
    if (rounded < kMinCachedBytes || rounded > kMaxCachedBlock) return nullptr;
    std::lock_guard lock(mutex_);
    auto it = free_.find(rounded);
    if (it == free_.end()) return nullptr;
    void* p = it->second;
    cached_ -= rounded;
    free_.erase(it);
    return p;
  }

  std::mutex mutex_;
  std::multimap<size_t, void*> free_;  // rounded size -> block
  size_t cached_ = 0;                  // bytes in free_
};

}  // namespace

Allocator& cpu_allocator() {
  // The one process-wide object in core: host memory is a process resource,
  // and its counters must see every tensor. Never destroyed: its block cache
  // must outlive any tensor that a static destructor or a detached thread
  // frees at exit (the process returns the memory then anyway).
  static CpuAllocator* const allocator = new CpuAllocator();
  return *allocator;
}

Allocator& allocator_for(Device device) {
  if (device.is_cpu()) return cpu_allocator();
  return cuda::device_allocator(device.index);
}

Storage::Storage(size_t nbytes, Allocator& allocator)
    : data_(allocator.allocate(nbytes)), nbytes_(nbytes), allocator_(&allocator) {}

Storage::~Storage() { allocator_->deallocate(data_, nbytes_); }

}  // namespace st
