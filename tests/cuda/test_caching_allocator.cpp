// The caching allocator's pool logic on a fake device (no GPU needed): rounding, splitting,
// reuse, merging of neighbours, per-stream pools, free-and-retry and the out-of-memory
// error.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "core/address_sanitizer.h"
#include "cuda/caching_allocator.h"
#include "tests/error_testing.h"

namespace ham::cuda {
namespace {

constexpr size_t MiB = size_t(1) << 20;

// Hands out address ranges (never dereferenced) up to a capacity, and records calls.
class FakeDevice final : public RawDeviceMemory {
 public:
  explicit FakeDevice(size_t capacity) : capacity_(capacity) {}

  void* try_allocate(size_t nbytes) override {
    ++allocate_calls;
    if (used_ + nbytes > capacity_) return nullptr;
    uintptr_t address = next_address_;
    next_address_ += nbytes + MiB;  // a gap, so segments are never adjacent
    used_ += nbytes;
    live_[address] = nbytes;
    return reinterpret_cast<void*>(address);
  }
  void release(void* ptr, size_t nbytes) override {
    auto it = live_.find(reinterpret_cast<uintptr_t>(ptr));
    ASSERT_NE(it, live_.end()) << "released a segment the device never gave";
    EXPECT_EQ(it->second, nbytes) << "released with a different size";
    used_ -= it->second;
    live_.erase(it);
    ++release_calls;
  }
  size_t free_bytes() override { return capacity_ - used_; }

  size_t live_segments() const { return live_.size(); }
  size_t used() const { return used_; }
  int allocate_calls = 0, release_calls = 0;

 private:
  size_t capacity_;
  size_t used_ = 0;
  uintptr_t next_address_ = uintptr_t(1) << 32;
  std::map<uintptr_t, size_t> live_;
};

char* as_bytes(void* p) { return static_cast<char*>(p); }

TEST(CudaCachingAllocator, RoundsRequestsAndPicksSegmentSizes) {
  EXPECT_EQ(CachingAllocator::round_request(0), 0u);
  EXPECT_EQ(CachingAllocator::round_request(1), 512u);
  EXPECT_EQ(CachingAllocator::round_request(512), 512u);
  EXPECT_EQ(CachingAllocator::round_request(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size_for(512), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(MiB), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(MiB + 512), 20 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(10 * MiB - 512), 20 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(10 * MiB), 10 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size_for(33 * MiB), 34 * MiB);
}

TEST(CudaCachingAllocator, SmallRequestsAreCutFromOneSegment) {
  FakeDevice device(64 * MiB);
  CachingAllocator pool(device, "cuda:0");
  void* a = pool.allocate(100, 0);
  void* b = pool.allocate(1000, 0);
  void* c = pool.allocate(512, 0);
  EXPECT_EQ(device.allocate_calls, 1);
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 512);
  EXPECT_EQ(as_bytes(c), as_bytes(b) + 1024);
  EXPECT_EQ(pool.block_size(b), 1024u);
  AllocatorStats stats = pool.stats();
  EXPECT_EQ(stats.allocated_bytes, 2048u);
  EXPECT_EQ(stats.requested_bytes, 1612u);
  EXPECT_EQ(stats.reserved_bytes, 2 * MiB);
  EXPECT_EQ(stats.active_blocks, 3u);
  EXPECT_EQ(pool.allocate(0, 0), nullptr);
  pool.free(a);
  pool.free(b);
  pool.free(c);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
}

TEST(CudaCachingAllocator, FreedBlockIsReusedWithoutTheDevice) {
  FakeDevice device(64 * MiB);
  CachingAllocator pool(device, "cuda:0");
  void* first = pool.allocate(4 * MiB, 0);
  pool.free(first);
  void* again = pool.allocate(4 * MiB - 100, 0);
  EXPECT_EQ(again, first);
  EXPECT_EQ(device.allocate_calls, 1);
  EXPECT_EQ(pool.stats().cache_hits, 1u);
  pool.free(again);
}

TEST(CudaCachingAllocator, LargeSegmentIsSplitAndItsRestReused) {
  FakeDevice device(64 * MiB);
  CachingAllocator pool(device, "cuda:0");
  void* a = pool.allocate(3 * MiB, 0);  // a 20 MiB segment, 17 MiB left free
  void* b = pool.allocate(4 * MiB, 0);
  EXPECT_EQ(device.allocate_calls, 1);
  EXPECT_EQ(as_bytes(b), as_bytes(a) + 3 * MiB);
  EXPECT_EQ(pool.block_size(a), 3 * MiB);
  pool.free(a);
  pool.free(b);
}

TEST(CudaCachingAllocator, SmallRemainderOfALargeBlockIsNotSplitOff) {
  FakeDevice device(64 * MiB);
  CachingAllocator pool(device, "cuda:0");
  void* a = pool.allocate(19 * MiB + MiB / 2, 0);  // segment 20 MiB, remainder 0.5 MiB
  EXPECT_EQ(pool.block_size(a), 20 * MiB);
  pool.free(a);
}

TEST(CudaCachingAllocator, FreedNeighboursMergeAndEmptyCacheReturnsWholeSegments) {
  FakeDevice device(64 * MiB);
  CachingAllocator pool(device, "cuda:0");
  void* a = pool.allocate(2048, 0);
  void* b = pool.allocate(2048, 0);
  void* c = pool.allocate(2048, 0);
  pool.free(a);
  pool.free(b);  // merges with a
  void* ab = pool.allocate(4096, 0);
  EXPECT_EQ(ab, a) << "a and b were not merged into one free block";
  pool.empty_cache();  // the segment still holds live blocks: nothing to release
  EXPECT_EQ(device.release_calls, 0);
  pool.free(c);
  pool.free(ab);  // merges with both neighbours: the segment is one free block again
  pool.empty_cache();
  EXPECT_EQ(device.release_calls, 1);
  EXPECT_EQ(device.live_segments(), 0u);
  AllocatorStats stats = pool.stats();
  EXPECT_EQ(stats.reserved_bytes, 0u);
  EXPECT_EQ(stats.segments, 0u);
  EXPECT_EQ(stats.peak_reserved_bytes, 2 * MiB);
}

TEST(CudaCachingAllocator, EachStreamHasItsOwnPool) {
  FakeDevice device(64 * MiB);
  CachingAllocator pool(device, "cuda:0");
  void* on_first = pool.allocate(4096, /*stream=*/1);
  pool.free(on_first);
  void* on_second = pool.allocate(4096, /*stream=*/2);
  EXPECT_EQ(device.allocate_calls, 2) << "a block freed on stream 1 was handed to stream 2";
  EXPECT_NE(on_second, on_first);
  void* back_on_first = pool.allocate(4096, 1);
  EXPECT_EQ(back_on_first, on_first);
  pool.free(on_second);
  pool.free(back_on_first);
}

TEST(CudaCachingAllocator, OutOfMemoryReleasesTheCacheAndRetries) {
  FakeDevice device(21 * MiB);
  CachingAllocator pool(device, "cuda:0");
  pool.free(pool.allocate(4096, 1));  // caches a 2 MiB small segment on another stream
  void* big = pool.allocate(5 * MiB, 0);  // needs a 20 MiB segment: fits only after release
  ASSERT_NE(big, nullptr);
  AllocatorStats stats = pool.stats();
  EXPECT_EQ(stats.oom_retries, 1u);
  EXPECT_EQ(stats.reserved_bytes, 20 * MiB);
  EXPECT_EQ(device.release_calls, 1);
  pool.free(big);
}

TEST(CudaCachingAllocator, OutOfMemoryErrorNamesRequestedFreeAndCachedBytes) {
  FakeDevice device(21 * MiB);
  CachingAllocator pool(device, "cuda:3");
  void* held = pool.allocate(4096, 0);  // keeps its 2 MiB segment
  testing::expect_error([&] { pool.allocate(5 * MiB, 0); },
                        {"cuda:3", "out of memory", "requested 5242880 bytes",
                         std::to_string(19 * MiB) + " bytes free", "4096 bytes in use",
                         std::to_string(2 * MiB - 4096) + " bytes cached"});
  EXPECT_EQ(pool.stats().oom_retries, 1u);
  // The failed request leaves the pool usable.
  void* small = pool.allocate(4096, 0);
  EXPECT_NE(small, nullptr);
  pool.free(small);
  pool.free(held);
}

TEST(CudaCachingAllocator, PeaksTrackTheHighWaterMarkUntilReset) {
  FakeDevice device(64 * MiB);
  CachingAllocator pool(device, "cuda:0");
  void* a = pool.allocate(3 * MiB, 0);
  void* b = pool.allocate(5 * MiB - 100, 0);
  pool.free(b);
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 8 * MiB);
  EXPECT_EQ(pool.stats().peak_requested_bytes, 8 * MiB - 100);
  EXPECT_EQ(pool.stats().allocated_bytes, 3 * MiB);
  pool.reset_peaks();
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 3 * MiB);
  EXPECT_EQ(pool.stats().peak_requested_bytes, 3 * MiB);
  pool.free(a);
}

TEST(CudaCachingAllocator, FreeingAnUnknownPointerIsAnError) {
  FakeDevice device(64 * MiB);
  CachingAllocator pool(device, "cuda:0");
  void* a = pool.allocate(4096, 0);
  pool.free(a);
  testing::expect_error([&] { pool.free(a); }, {"cuda:0", "did not hand out"});
  pool.free(nullptr);  // ignored
}

// Random allocations and frees on two streams: live blocks never overlap, the statistics
// add up, and once everything is freed empty_cache() gives every segment back.
TEST(CudaCachingAllocator, RandomWorkloadKeepsBlocksDisjointAndReturnsEverything) {
  FakeDevice device(size_t(4) << 30);
  CachingAllocator pool(device, "cuda:0");
  std::mt19937_64 rng(20240607);
  std::vector<std::pair<char*, size_t>> live;  // pointer, rounded size
  size_t expected_allocated = 0;
  for (int step = 0; step < 4000; ++step) {
    bool do_free = !live.empty() && rng() % 100 < 45;
    if (do_free) {
      size_t i = rng() % live.size();
      pool.free(live[i].first);
      expected_allocated -= live[i].second;
      live.erase(live.begin() + long(i));
    } else {
      size_t size = rng() % 4 == 0 ? 1 + rng() % (24 * MiB) : 1 + rng() % (64 * 1024);
      StreamKey stream = 1 + rng() % 2;
      char* p = as_bytes(pool.allocate(size, stream));
      size_t rounded = pool.block_size(p);
      EXPECT_GE(rounded, size);
      live.emplace_back(p, rounded);
      expected_allocated += rounded;
    }
    if (step % 250 == 0) {
      auto sorted = live;
      std::sort(sorted.begin(), sorted.end());
      for (size_t i = 1; i < sorted.size(); ++i) {
        ASSERT_LE(sorted[i - 1].first + sorted[i - 1].second, sorted[i].first)
            << "live blocks overlap at step " << step;
      }
      AllocatorStats stats = pool.stats();
      ASSERT_EQ(stats.allocated_bytes, expected_allocated);
      ASSERT_EQ(stats.active_blocks, live.size());
      ASSERT_EQ(stats.reserved_bytes, device.used());
      ASSERT_LE(stats.allocated_bytes, stats.reserved_bytes);
    }
    if (step == 2000) pool.empty_cache();  // mid-run: must not touch live blocks
  }
  for (auto& [p, size] : live) pool.free(p);
  EXPECT_EQ(pool.stats().allocated_bytes, 0u);
  pool.empty_cache();
  EXPECT_EQ(device.live_segments(), 0u);
  EXPECT_EQ(pool.stats().reserved_bytes, 0u);
}

// Segments of real host memory, as the SIMT emulator's device gives.
class HostDevice final : public RawDeviceMemory {
 public:
  void* try_allocate(size_t nbytes) override { return ::operator new(nbytes); }
  void release(void* ptr, size_t) override { ::operator delete(ptr); }
  size_t free_bytes() override { return 0; }
  bool host_addressable() const override { return true; }
};

// Under AddressSanitizer (scripts/sanitize.sh), the bytes of a pool on host memory that no
// tensor asked for are poisoned, so that a kernel on the emulator running past its tensor
// is caught there.
TEST(CudaCachingAllocator, UnownedBytesOfHostMemoryArePoisonedUnderAddressSanitizer) {
#if HAM_ADDRESS_SANITIZER
  HostDevice device;
  CachingAllocator pool(device, "cuda:0");
  auto poisoned = [](const void* p) { return __asan_address_is_poisoned(p) != 0; };
  char* a = as_bytes(pool.allocate(100, 0));
  char* b = as_bytes(pool.allocate(1000, 0));
  ASSERT_EQ(b, a + 512);
  EXPECT_FALSE(poisoned(a));
  EXPECT_FALSE(poisoned(a + 99));
  EXPECT_TRUE(poisoned(a + 100));  // the rounding past the request
  EXPECT_TRUE(poisoned(a + 511));
  EXPECT_FALSE(poisoned(b + 999));
  EXPECT_TRUE(poisoned(b + 1000));
  EXPECT_TRUE(poisoned(b + 1024));  // the free rest of the segment
  pool.free(a);
  EXPECT_TRUE(poisoned(a));  // freed
  EXPECT_FALSE(poisoned(b));
  char* c = as_bytes(pool.allocate(64, 0));  // a's block again
  ASSERT_EQ(c, a);
  EXPECT_FALSE(poisoned(c + 63));
  EXPECT_TRUE(poisoned(c + 64));
  pool.free(b);
  pool.free(c);
  pool.empty_cache();  // the segment goes back unpoisoned (operator delete would not mind)
#else
  GTEST_SKIP() << "built without AddressSanitizer (scripts/sanitize.sh builds with it)";
#endif
}

}  // namespace
}  // namespace ham::cuda
