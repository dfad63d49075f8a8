// The caching allocator's logic on a fake device: size classes, reuse per
// stream, record_stream deferring reuse until the other stream's marker has
// passed, empty_cache, out-of-memory retry, and a repeated "step" that asks
// the device for nothing new.
#include <cstdlib>
#include <map>
#include <set>
#include <vector>

#include <gtest/gtest.h>

#include "core/caching_allocator.h"
#include "test_util.h"

namespace st {
namespace {

// A device whose memory is malloc, whose streams are numbers and whose
// markers complete when the test says so. Counts what the cache asks of it.
struct FakeDevice {
  StreamId current = 1;
  int64_t allocs = 0;
  int64_t frees = 0;
  int64_t live_bytes = 0;
  int64_t capacity = 1 << 30;      // allocations beyond this return nullptr
  std::map<EventId, bool> events;  // marker -> done
  std::map<EventId, StreamId> event_stream;
  EventId next_event = 1;
  std::set<EventId> released;
};

class FakeSource final : public BlockSource {
 public:
  explicit FakeSource(FakeDevice& d) : d_(d) {}
  void* allocate(size_t nbytes) override {
    if (d_.live_bytes + static_cast<int64_t>(nbytes) > d_.capacity) return nullptr;
    ++d_.allocs;
    d_.live_bytes += static_cast<int64_t>(nbytes);
    return std::malloc(nbytes);
  }
  void deallocate(void* ptr, size_t nbytes) noexcept override {
    ++d_.frees;
    d_.live_bytes -= static_cast<int64_t>(nbytes);
    std::free(ptr);
  }
  StreamId current_stream() override { return d_.current; }
  EventId record_event(StreamId stream) override {
    EventId e = d_.next_event++;
    d_.events[e] = false;
    d_.event_stream[e] = stream;
    return e;
  }
  bool event_done(EventId e) override { return d_.events.at(e); }
  void wait_event(EventId e) override { d_.events.at(e) = true; }  // "the stream caught up"
  void release_event(EventId e) noexcept override { d_.released.insert(e); }
  Device device() const override { return Device::cuda(0); }

 private:
  FakeDevice& d_;
};

TEST(CachingAllocator, SizeClassesAreFourPerPowerOfTwoAboveTheMinimum) {
  EXPECT_EQ(CachingAllocator::round_size(0), 0u);
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 640u);  // 512 + 512/4
  EXPECT_EQ(CachingAllocator::round_size(1024), 1024u);
  EXPECT_EQ(CachingAllocator::round_size(1025), 1280u);
  EXPECT_EQ(CachingAllocator::round_size(1536), 1536u);
  EXPECT_EQ(CachingAllocator::round_size(1537), 1792u);
  EXPECT_EQ(CachingAllocator::round_size(1793), 2048u);
  // Every class holds the request and wastes at most a quarter of it.
  for (size_t n = 1; n < 100000; n += 37) {
    size_t c = CachingAllocator::round_size(n);
    ASSERT_GE(c, n);
    ASSERT_TRUE(c == 512 || (c - n) * 4 <= n) << n << " -> " << c;
  }
}

TEST(CachingAllocator, FreedBlockIsReusedOnTheSameStreamForTheSameClass) {
  FakeDevice dev;
  CachingAllocator alloc(std::make_unique<FakeSource>(dev));
  void* a = alloc.allocate(1000);
  alloc.deallocate(a, 1000);
  void* b = alloc.allocate(900);  // same class (1024)
  EXPECT_EQ(a, b);
  EXPECT_EQ(dev.allocs, 1);
  EXPECT_EQ(alloc.cache_stats().cache_hits, 1);
  void* c = alloc.allocate(2000);  // another class: new memory
  EXPECT_NE(c, b);
  EXPECT_EQ(dev.allocs, 2);
  alloc.deallocate(b, 900);
  alloc.deallocate(c, 2000);
  EXPECT_EQ(alloc.stats().current_bytes, 0);
  EXPECT_EQ(alloc.cache_stats().reserved_bytes, 1024 + 2048);
  EXPECT_EQ(alloc.cache_stats().cached_bytes, 1024 + 2048);
}

TEST(CachingAllocator, BlocksAreNotSharedAcrossStreams) {
  FakeDevice dev;
  CachingAllocator alloc(std::make_unique<FakeSource>(dev));
  void* a = alloc.allocate(4096);
  alloc.deallocate(a, 4096);
  dev.current = 2;
  void* b = alloc.allocate(4096);
  EXPECT_NE(a, b) << "a block freed on stream 1 was handed to stream 2 without a marker";
  dev.current = 1;
  void* c = alloc.allocate(4096);
  EXPECT_EQ(a, c);
  alloc.deallocate(b, 4096);
  alloc.deallocate(c, 4096);
}

TEST(CachingAllocator, RecordStreamDefersReuseUntilTheOtherStreamsMarkerPasses) {
  FakeDevice dev;
  CachingAllocator alloc(std::make_unique<FakeSource>(dev));
  void* a = alloc.allocate(8192);
  alloc.record_stream(a, 7);  // e.g. a communication stream read it
  alloc.record_stream(a, 7);  // recorded once
  alloc.record_stream(a, 1);  // its own stream: nothing to do
  alloc.deallocate(a, 8192);
  ASSERT_EQ(dev.events.size(), 1u);
  EXPECT_EQ(dev.event_stream.begin()->second, StreamId{7});
  void* b = alloc.allocate(8192);
  EXPECT_NE(a, b) << "reused before stream 7 was done with it";
  EXPECT_EQ(alloc.cache_stats().cached_bytes, 0);
  dev.events.begin()->second = true;  // stream 7 passes the marker
  void* c = alloc.allocate(8192);
  EXPECT_EQ(a, c);
  EXPECT_EQ(dev.released.count(dev.events.begin()->first), 1u);
  alloc.deallocate(b, 8192);
  alloc.deallocate(c, 8192);
  EXPECT_EQ(dev.allocs, 2);
}

TEST(CachingAllocator, EmptyCacheReturnsCachedAndWaitsForPendingBlocks) {
  FakeDevice dev;
  CachingAllocator alloc(std::make_unique<FakeSource>(dev));
  void* a = alloc.allocate(1 << 20);
  void* b = alloc.allocate(1 << 20);
  void* kept = alloc.allocate(100);
  alloc.record_stream(b, 9);
  alloc.deallocate(a, 1 << 20);
  alloc.deallocate(b, 1 << 20);
  alloc.empty_cache();
  EXPECT_EQ(dev.frees, 2);
  EXPECT_EQ(dev.live_bytes, 512);  // only the live 100-byte block (class 512)
  CacheStats s = alloc.cache_stats();
  EXPECT_EQ(s.reserved_bytes, 512);
  EXPECT_EQ(s.cached_bytes, 0);
  EXPECT_EQ(s.source_frees, 2);
  alloc.deallocate(kept, 100);
}

TEST(CachingAllocator, OutOfMemoryReleasesTheCacheAndRetries) {
  FakeDevice dev;
  dev.capacity = 3 * 4096;
  CachingAllocator alloc(std::make_unique<FakeSource>(dev));
  void* a = alloc.allocate(4096);
  void* b = alloc.allocate(4096);
  alloc.deallocate(a, 4096);
  alloc.deallocate(b, 4096);
  // 8192 does not fit beside the two cached 4096 blocks; they go back first.
  void* c = alloc.allocate(8192);
  EXPECT_NE(c, nullptr);
  EXPECT_EQ(dev.frees, 2);
  // Beyond the capacity even with an empty cache: a clear error.
  std::string msg = test::error_of([&] { alloc.allocate(8192); });
  EXPECT_NE(msg.find("out of memory on cuda:0 allocating 8192 bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("activation_checkpointing"), std::string::npos) << msg;
  alloc.deallocate(c, 8192);
}

TEST(CachingAllocator, RepeatedStepAsksTheDeviceForNothingNew) {
  FakeDevice dev;
  CachingAllocator alloc(std::make_unique<FakeSource>(dev));
  // One "step": activations of several sizes live at once, freed in an order
  // unlike the allocation order, plus short-lived temporaries.
  const std::vector<size_t> sizes = {4096 * 3, 1 << 20, 777, 1 << 20, 65536 + 1, 512, 3 * (1 << 18)};
  auto step = [&] {
    std::vector<void*> live;
    for (size_t n : sizes) {
      live.push_back(alloc.allocate(n));
      void* tmp = alloc.allocate(n / 2 + 1);
      alloc.deallocate(tmp, n / 2 + 1);
    }
    for (size_t i = live.size(); i-- > 0;) alloc.deallocate(live[i], sizes[i]);
  };
  step();
  const int64_t after_first = dev.allocs;
  const AllocatorStats first = alloc.stats();
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(dev.allocs, after_first) << "steady-state steps allocated device memory";
  EXPECT_EQ(alloc.stats().current_bytes, 0);
  EXPECT_EQ(alloc.stats().peak_bytes, first.peak_bytes);
  EXPECT_EQ(alloc.stats().num_allocs, first.num_allocs * 6);
}

TEST(CachingAllocator, ZeroBytesIsANullBlockAndRecordStreamNeedsALiveBlock) {
  FakeDevice dev;
  CachingAllocator alloc(std::make_unique<FakeSource>(dev));
  EXPECT_EQ(alloc.allocate(0), nullptr);
  alloc.deallocate(nullptr, 0);
  EXPECT_EQ(dev.allocs, 0);
  int not_ours = 0;
  std::string msg = test::error_of([&] { alloc.record_stream(&not_ours, 3); });
  EXPECT_NE(msg.find("not a live block"), std::string::npos) << msg;
}

TEST(CachingAllocator, DestructorReturnsEverythingCached) {
  FakeDevice dev;
  {
    CachingAllocator alloc(std::make_unique<FakeSource>(dev));
    void* a = alloc.allocate(5000);
    void* b = alloc.allocate(70000);
    alloc.record_stream(b, 4);
    alloc.deallocate(a, 5000);
    alloc.deallocate(b, 70000);
  }
  EXPECT_EQ(dev.allocs, 2);
  EXPECT_EQ(dev.frees, 2);
  EXPECT_EQ(dev.live_bytes, 0);
}

}  // namespace
}  // namespace st
