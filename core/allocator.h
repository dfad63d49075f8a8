#pragma once
// Allocators own device memory and count it. Every allocator reports the
// bytes currently held by tensors and the peak since the last reset, which
// the trainer logs per step (`peak_bytes`).
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/device.h"
#include "core/error.h"

namespace st {

/// An allocation the device or host could not satisfy: callers that know
/// the phase (the trainer) catch it to say what to lower.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

struct AllocatorStats {
  int64_t current_bytes = 0;  // bytes handed out and not yet returned
  int64_t peak_bytes = 0;     // maximum of current_bytes since reset_peak()
  int64_t num_allocs = 0;     // allocate() calls since construction
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  /// Returns `nbytes` of memory (64-byte aligned on CPU); nbytes may be 0.
  virtual void* allocate(size_t nbytes) = 0;
  /// Returns memory obtained from allocate() with the same size.
  virtual void deallocate(void* ptr, size_t nbytes) noexcept = 0;
  virtual Device device() const = 0;

  AllocatorStats stats() const;
  /// Makes the peak equal to the current bytes (start of a new step).
  void reset_peak();

 protected:
  void record_alloc(size_t nbytes);
  void record_free(size_t nbytes);

 private:
  std::atomic<int64_t> current_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> count_{0};
};

/// CPU alignment: a cache line, also enough for AVX-512 loads.
inline constexpr size_t kCpuAlignment = 64;

/// The process's CPU allocator (64-byte aligned, thread safe).
Allocator& cpu_allocator();
/// The allocator for `device` (CPU, or CUDA when built with CUDA and a GPU exists).
Allocator& allocator_for(Device device);

/// A block of memory from an allocator, returned on destruction. Tensors
/// share a Storage through shared_ptr; views keep it alive.
class Storage {
 public:
  Storage(size_t nbytes, Allocator& allocator);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  void* data() const { return data_; }
  size_t nbytes() const { return nbytes_; }
  Device device() const { return allocator_->device(); }

 private:
  void* data_ = nullptr;
  size_t nbytes_ = 0;
  Allocator* allocator_ = nullptr;
};

}  // namespace st
