#include "core/caching_allocator.h"

#include <bit>
#include <cstdio>
#include <exception>

#include "core/error.h"

namespace st {

namespace {
constexpr size_t kMinBlock = 512;
}

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes == 0) return 0;
  if (nbytes <= kMinBlock) return kMinBlock;
  // Four classes between consecutive powers of two: p, 1.25p, 1.5p, 1.75p.
  const size_t p = std::bit_floor(nbytes);
  const size_t step = p / 4;
  return (nbytes + step - 1) / step * step;
}

CachingAllocator::CachingAllocator(std::unique_ptr<BlockSource> source) : source_(std::move(source)) {
  ST_CHECK(source_ != nullptr, "CachingAllocator needs a block source");
}

CachingAllocator::~CachingAllocator() {
  std::lock_guard lock(mutex_);
  try {
    collect_pending_locked(/*wait=*/true);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "shardtrain: waiting for streams before freeing cached memory failed: %s\n", e.what());
  }
  release_cached_locked();
  // Blocks still live belong to tensors that outlive the allocator (process
  // exit); the device reclaims them with its context.
}

void* CachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) {
    record_alloc(0);
    return nullptr;
  }
  const size_t size = round_size(nbytes);
  void* ptr = nullptr;
  {
    std::lock_guard lock(mutex_);
    ptr = allocate_locked(size, source_->current_stream());
  }
  record_alloc(nbytes);
  return ptr;
}

void* CachingAllocator::allocate_locked(size_t size, StreamId stream) {
  collect_pending_locked(/*wait=*/false);
  auto it = free_.find({stream, size});
  if (it != free_.end() && !it->second.empty()) {
    void* ptr = it->second.back();
    it->second.pop_back();
    live_.emplace(ptr, Block{size, stream, {}});
    stats_.cached_bytes -= static_cast<int64_t>(size);
    ++stats_.cache_hits;
    return ptr;
  }
  void* ptr = source_->allocate(size);
  if (ptr == nullptr) {
    // Out of memory: what the cache holds for other sizes or streams goes
    // back to the device first, then one more try.
    collect_pending_locked(/*wait=*/true);
    release_cached_locked();
    ptr = source_->allocate(size);
  }
  if (ptr == nullptr)
    throw OutOfMemory(format("out of memory on {} allocating {} bytes ({} bytes in use by tensors, {} reserved, peak "
                             "{}); lower train.micro_batch_size or train.seq_len, or turn on "
                             "fsdp.activation_checkpointing",
                             source_->device(), size, stats().current_bytes, stats_.reserved_bytes, stats().peak_bytes),
                      __FILE__, __LINE__);
  live_.emplace(ptr, Block{size, stream, {}});
  stats_.reserved_bytes += static_cast<int64_t>(size);
  ++stats_.source_allocs;
  return ptr;
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes) noexcept {
  record_free(nbytes);
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  if (it == live_.end()) {
    std::fprintf(stderr, "shardtrain: %s allocator: free of unknown block %p ignored\n",
                 source_->device().str().c_str(), ptr);
    return;
  }
  Block block = std::move(it->second);
  live_.erase(it);
  if (block.other_streams.empty()) {
    free_[{block.stream, block.size}].push_back(ptr);
    stats_.cached_bytes += static_cast<int64_t>(block.size);
    return;
  }
  Pending pending{ptr, std::move(block), {}};
  try {
    for (StreamId s : pending.block.other_streams) pending.events.push_back(source_->record_event(s));
  } catch (const std::exception& e) {
    // Without a marker the block cannot be proven free; keeping it out of
    // the cache leaks it rather than risking a use-after-free on the device.
    std::fprintf(stderr, "shardtrain: recording a stream marker failed, %zu bytes leaked: %s\n", pending.block.size,
                 e.what());
    for (EventId ev : pending.events) source_->release_event(ev);
    return;
  }
  pending_.push_back(std::move(pending));
}

void CachingAllocator::record_stream(void* ptr, StreamId stream) {
  if (ptr == nullptr) return;
  std::lock_guard lock(mutex_);
  auto it = live_.find(ptr);
  ST_CHECK(it != live_.end(), "record_stream: {} is not a live block of the {} allocator", ptr, source_->device());
  Block& block = it->second;
  if (stream == block.stream) return;
  for (StreamId s : block.other_streams) {
    if (s == stream) return;
  }
  block.other_streams.push_back(stream);
}

void CachingAllocator::collect_pending_locked(bool wait) {
  for (size_t i = 0; i < pending_.size();) {
    Pending& p = pending_[i];
    bool done = true;
    for (EventId ev : p.events) {
      if (wait) {
        source_->wait_event(ev);
      } else if (!source_->event_done(ev)) {
        done = false;
        break;
      }
    }
    if (!done) {
      ++i;
      continue;
    }
    for (EventId ev : p.events) source_->release_event(ev);
    free_[{p.block.stream, p.block.size}].push_back(p.ptr);
    stats_.cached_bytes += static_cast<int64_t>(p.block.size);
    pending_[i] = std::move(pending_.back());
    pending_.pop_back();
  }
}

void CachingAllocator::release_cached_locked() {
  for (auto& [key, ptrs] : free_) {
    for (void* ptr : ptrs) {
      source_->deallocate(ptr, key.second);
      stats_.reserved_bytes -= static_cast<int64_t>(key.second);
      stats_.cached_bytes -= static_cast<int64_t>(key.second);
      ++stats_.source_frees;
    }
  }
  free_.clear();
}

void CachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  collect_pending_locked(/*wait=*/true);
  release_cached_locked();
}

CacheStats CachingAllocator::cache_stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

}  // namespace st
