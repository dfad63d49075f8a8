#pragma once
// A caching allocator: freed blocks go to free lists keyed by (stream, size
// class) and are handed out again instead of going back to the device, so a
// training step that repeats the previous step's allocations asks the device
// for nothing (cudaMalloc synchronises the GPU and costs milliseconds).
//
// Stream-aware reuse: a block belongs to the stream it was allocated on, and
// work on that stream is ordered, so the block can be reused on the same
// stream as soon as it is freed. A block that other streams also used
// (record_stream) is reused only after markers recorded on those streams at
// free time have passed. The device side (memory, streams, markers) is a
// BlockSource, so the caching logic is the same code on every device and is
// tested on the CPU with a fake source.
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "core/allocator.h"

namespace st {

/// An opaque stream handle (a cudaStream_t on CUDA).
using StreamId = uintptr_t;
/// An opaque completion marker handle (a cudaEvent_t on CUDA).
using EventId = uintptr_t;

/// What a CachingAllocator needs from a device.
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  /// Fresh device memory; nullptr when the device is out of memory (other
  /// failures throw).
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) noexcept = 0;
  /// The stream the calling thread allocates for.
  virtual StreamId current_stream() = 0;
  /// A marker after all work issued to `stream` so far.
  virtual EventId record_event(StreamId stream) = 0;
  /// True once the marker's work is done (non-blocking).
  virtual bool event_done(EventId event) = 0;
  /// Blocks until the marker's work is done.
  virtual void wait_event(EventId event) = 0;
  /// Gives the marker back (done or not).
  virtual void release_event(EventId event) noexcept = 0;
  virtual Device device() const = 0;
};

/// Counters of the cache itself (the base class counts bytes held by tensors).
struct CacheStats {
  int64_t reserved_bytes = 0;  // held from the source: in use + cached + waiting on streams
  int64_t cached_bytes = 0;    // in free lists, ready for reuse
  int64_t source_allocs = 0;   // calls to BlockSource::allocate that returned memory
  int64_t source_frees = 0;    // blocks given back to the source
  int64_t cache_hits = 0;      // allocations served from a free list
};

class CachingAllocator final : public Allocator {
 public:
  explicit CachingAllocator(std::unique_ptr<BlockSource> source);
  /// Gives every block back; blocks still waiting on a stream are waited for.
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) noexcept override;
  Device device() const override { return source_->device(); }

  /// Marks the live block `ptr` as used by `stream` too: once freed, it is
  /// reused only after the work issued to `stream` before the free is done.
  void record_stream(void* ptr, StreamId stream);
  /// Returns every cached block that no stream still uses to the source,
  /// after waiting for blocks whose streams are still working on them.
  void empty_cache();
  CacheStats cache_stats() const;

  /// The size class of a request: at least 512 bytes, then four classes per
  /// power of two (so at most 25% is wasted); 0 stays 0.
  static size_t round_size(size_t nbytes);

 private:
  struct Block {
    size_t size = 0;  // class size, as allocated from the source
    StreamId stream = 0;
    std::vector<StreamId> other_streams;  // record_stream
  };
  struct Pending {
    void* ptr;
    Block block;
    std::vector<EventId> events;
  };

  void* allocate_locked(size_t size, StreamId stream);
  void collect_pending_locked(bool wait);
  void release_cached_locked();

  std::unique_ptr<BlockSource> source_;
  mutable std::mutex mutex_;
  std::unordered_map<void*, Block> live_;
  std::map<std::pair<StreamId, size_t>, std::vector<void*>> free_;
  std::vector<Pending> pending_;
  CacheStats stats_;
};

}  // namespace st
