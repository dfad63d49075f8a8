#pragma once
// Grow-only scratch of one thread for the CPU kernels (GEMM widening,
// attention tiles, RMSNorm and loss rows): 64-byte aligned, kept between
// calls so that a step that repeats the same shapes allocates nothing after
// its first. Not counted by cpu_allocator(), whose stats describe tensors;
// the memory plan counts it separately. A failed allocation throws
// OutOfMemory, as a tensor's does, so the trainer names the step and phase.
#include <cstdint>
#include <memory>
#include <new>

#include "core/allocator.h"
#include "core/format.h"

namespace st::cpu {

template <class T>
class Scratch {
 public:
  /// At least `n` elements; the old contents are not kept when it grows.
  T* get(int64_t n) {
    if (size_ < n) {
      constexpr int64_t kPad = 64 / static_cast<int64_t>(sizeof(T));
      data_.reset();  // release the old block before taking the larger one
      try {
        data_ = std::make_unique_for_overwrite<T[]>(static_cast<size_t>(n + kPad));
      } catch (const std::bad_alloc&) {
        size_ = 0;
        aligned_ = nullptr;
        throw OutOfMemory(format("out of host memory allocating {} bytes of kernel scratch",
                                 static_cast<int64_t>(sizeof(T)) * (n + kPad)),
                          __FILE__, __LINE__);
      }
      void* p = data_.get();
      size_t space = static_cast<size_t>(n + kPad) * sizeof(T);
      aligned_ = static_cast<T*>(std::align(64, static_cast<size_t>(n) * sizeof(T), p, space));
      size_ = n;
    }
    return aligned_;
  }

 private:
  std::unique_ptr<T[]> data_;
  T* aligned_ = nullptr;
  int64_t size_ = 0;
};

}  // namespace st::cpu
