#include "core/cpu_memory_pool.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "core/address_sanitizer.h"
#include "core/device.h"
#include "core/tensor.h"
#include "tests/error_testing.h"

namespace ham {
namespace {

constexpr size_t KiB = size_t(1) << 10;
constexpr size_t MiB = size_t(1) << 20;

TEST(CpuMemoryPool, RoundsTo64BytesThenToPages) {
  EXPECT_EQ(CpuMemoryPool::round_request(1), 64u);
  EXPECT_EQ(CpuMemoryPool::round_request(64), 64u);
  EXPECT_EQ(CpuMemoryPool::round_request(65), 128u);
  EXPECT_EQ(CpuMemoryPool::round_request(64 * KiB), 64 * KiB);
  EXPECT_EQ(CpuMemoryPool::round_request(64 * KiB + 1), 68 * KiB);
  EXPECT_EQ(CpuMemoryPool::round_request(MiB + 5), MiB + 4 * KiB);
}

TEST(CpuMemoryPool, AFreedBlockServesTheNextRequestOfItsSize) {
  CpuMemoryPool pool(64 * MiB);
  EXPECT_EQ(pool.allocate(0), nullptr);
  void* first = pool.allocate(100 * KiB);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % CpuMemoryPool::kAlignment, 0u);
  std::memset(first, 1, 100 * KiB);  // the whole request is writable
  pool.free(first);
  CpuMemoryStats cached = pool.stats();
  EXPECT_EQ(cached.cached_bytes, 100 * KiB);
  EXPECT_EQ(cached.cached_blocks, 1u);
  EXPECT_EQ(cached.allocated_bytes, 0u);
  void* again = pool.allocate(100 * KiB - 100);  // rounds to the same page count
  EXPECT_EQ(again, first);
  CpuMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.cache_hits, 1u);
  EXPECT_EQ(stats.system_allocations, 1u);
  EXPECT_EQ(stats.cached_bytes, 0u);
  EXPECT_EQ(stats.allocated_bytes, 100 * KiB);
  EXPECT_EQ(stats.requested_bytes, 100 * KiB - 100);
  EXPECT_EQ(stats.active_blocks, 1u);
  pool.free(again);
  pool.free(nullptr);
}

// A request takes the smallest free block that fits with at most 1/8 to spare.
TEST(CpuMemoryPool, BestFitWithinAnEighth) {
  CpuMemoryPool pool(64 * MiB);
  void* big = pool.allocate(MiB);
  void* bigger = pool.allocate(MiB + 64 * KiB);
  pool.free(bigger);
  pool.free(big);
  void* small = pool.allocate(800 * KiB);  // 1 MiB is more than 1/8 above 800 KiB
  EXPECT_NE(small, big);
  EXPECT_NE(small, bigger);
  EXPECT_EQ(pool.block_size(small), 800 * KiB);
  void* fits = pool.allocate(960 * KiB);  // the 1 MiB block, not the larger one
  EXPECT_EQ(fits, big);
  EXPECT_EQ(pool.block_size(fits), MiB);
  void* next = pool.allocate(MiB);  // the 1 MiB + 64 KiB block
  EXPECT_EQ(next, bigger);
  CpuMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.system_allocations, 3u);
  EXPECT_EQ(stats.cache_hits, 2u);
  EXPECT_EQ(stats.allocated_bytes, 800 * KiB + MiB + MiB + 64 * KiB);
  EXPECT_EQ(stats.requested_bytes, 800 * KiB + 960 * KiB + MiB);
  for (void* p : {small, fits, next}) pool.free(p);
}

TEST(CpuMemoryPool, KeepsAtMostItsLimitReleasingTheLargestFirst) {
  CpuMemoryPool pool(MiB);
  void* a = pool.allocate(256 * KiB);
  void* b = pool.allocate(512 * KiB);
  void* c = pool.allocate(384 * KiB);
  void* too_big = pool.allocate(2 * MiB);
  pool.free(too_big);  // larger than the limit: straight back to the system
  EXPECT_EQ(pool.stats().cached_bytes, 0u);
  pool.free(a);
  pool.free(b);
  EXPECT_EQ(pool.stats().cached_bytes, 768 * KiB);
  pool.free(c);  // 1152 KiB cached: the 512 KiB block goes
  CpuMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.cached_bytes, 640 * KiB);
  EXPECT_EQ(stats.cached_blocks, 2u);
  EXPECT_EQ(stats.max_cached_bytes, MiB);
  void* again = pool.allocate(512 * KiB);
  EXPECT_EQ(pool.stats().cache_hits, 0u) << "the 512 KiB block was released";
  pool.free(again);
  pool.empty_cache();
  EXPECT_EQ(pool.stats().cached_bytes, 0u);
  EXPECT_EQ(pool.stats().cached_blocks, 0u);
}

TEST(CpuMemoryPool, ALimitOfZeroCachesNothing) {
  CpuMemoryPool pool(0);
  for (int i = 0; i < 3; ++i) pool.free(pool.allocate(300 * KiB));
  CpuMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.cache_hits, 0u);
  EXPECT_EQ(stats.system_allocations, 3u);
  EXPECT_EQ(stats.cached_bytes, 0u);
}

TEST(CpuMemoryPool, PeakCountsBlocksHeldUntilReset) {
  CpuMemoryPool pool(64 * MiB);
  void* a = pool.allocate(MiB);
  void* b = pool.allocate(2 * MiB - 100);
  pool.free(b);
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 3 * MiB);
  EXPECT_EQ(pool.stats().peak_requested_bytes, 3 * MiB - 100);
  pool.reset_peaks();
  EXPECT_EQ(pool.stats().peak_allocated_bytes, MiB);
  EXPECT_EQ(pool.stats().peak_requested_bytes, MiB);
  // The 2 MiB block, cached, serves a smaller request: the blocks' peak counts all of it,
  // the requests' peak only what was asked.
  void* c = pool.allocate(2 * MiB - 200 * KiB);
  EXPECT_EQ(pool.stats().peak_allocated_bytes, 3 * MiB);
  EXPECT_EQ(pool.stats().peak_requested_bytes, 3 * MiB - 200 * KiB);
  pool.free(a);
  pool.free(c);
}

TEST(CpuMemoryPool, UnknownPointersAreErrors) {
  CpuMemoryPool pool(MiB);
  int not_a_block = 0;
  testing::expect_error([&] { pool.free(&not_a_block); },
                        {"cpu: free of", "did not hand out"});
  void* p = pool.allocate(128);
  pool.free(p);
  testing::expect_error([&] { pool.free(p); }, {"did not hand out"});  // a double free
  testing::expect_error([&] { pool.block_size(&not_a_block); },
                        {"is not a block of the CPU memory pool"});
}

TEST(CpuMemoryPool, ThreadsShareItSafely) {
  CpuMemoryPool pool(4 * MiB);
  auto churn = [&](size_t seed) {
    std::vector<void*> held;
    for (size_t i = 0; i < 2000; ++i) {
      size_t bytes = 1 + (i * 7919 + seed * 104729) % (200 * KiB);
      void* p = pool.allocate(bytes);
      static_cast<char*>(p)[bytes - 1] = 1;
      held.push_back(p);
      if (held.size() > 8) {
        pool.free(held.front());
        held.erase(held.begin());
      }
    }
    for (void* p : held) pool.free(p);
  };
  std::vector<std::thread> threads;
  for (size_t t = 0; t < 4; ++t) threads.emplace_back(churn, t);
  for (std::thread& t : threads) t.join();
  CpuMemoryStats stats = pool.stats();
  EXPECT_EQ(stats.active_blocks, 0u);
  EXPECT_EQ(stats.allocated_bytes, 0u);
  EXPECT_EQ(stats.requested_bytes, 0u);
  EXPECT_LE(stats.cached_bytes, 4 * MiB);
  EXPECT_EQ(stats.cache_hits + stats.system_allocations, 4u * 2000u);
  EXPECT_GT(stats.cache_hits, 0u);
}

// Under AddressSanitizer a cached block is poisoned, so a read of a freed tensor is still
// reported, and handed out again whole.
TEST(CpuMemoryPool, CachedBlocksArePoisonedUnderAddressSanitizer) {
#if HAM_ADDRESS_SANITIZER
  CpuMemoryPool pool(MiB);
  char* block = static_cast<char*>(pool.allocate(4 * KiB));
  EXPECT_FALSE(__asan_address_is_poisoned(block));
  pool.free(block);
  EXPECT_TRUE(__asan_address_is_poisoned(block));
  EXPECT_TRUE(__asan_address_is_poisoned(block + 4 * KiB - 1));
  char* again = static_cast<char*>(pool.allocate(4 * KiB));
  ASSERT_EQ(again, block);
  EXPECT_FALSE(__asan_address_is_poisoned(again));
  EXPECT_FALSE(__asan_address_is_poisoned(again + 4 * KiB - 1));
  pool.free(again);
  pool.empty_cache();
  EXPECT_EQ(cpu_memory_pool().stats().max_cached_bytes, 0u) << "the global pool caches nothing";
#else
  GTEST_SKIP() << "built without AddressSanitizer (scripts/sanitize.sh builds with it)";
#endif
}

TEST(CpuMemoryPool, CacheLimitFromTheEnvironment) {
  EXPECT_EQ(cpu_memory_cache_limit("0"), 0u);
  EXPECT_EQ(cpu_memory_cache_limit("512"), 512 * MiB);
  EXPECT_GT(cpu_memory_cache_limit(nullptr), 0u);  // a quarter of physical memory
  for (const char* bad : {"", "-1", "12x", "1.5", " 3", "99999999999999"}) {
    testing::expect_error([&] { cpu_memory_cache_limit(bad); },
                          {"HAM_CPU_CACHE_MIB='" + std::string(bad) + "'", "whole number"});
  }
}

// CPU tensors draw from the pool, and the device's statistics are the pool's.
TEST(CpuMemoryPool, TensorsOnTheCpuDrawFromIt) {
  const Device cpu = Device::cpu();
  reset_peak_device_memory(cpu);
  DeviceMemoryStats before = device_memory_stats(cpu);
  EXPECT_EQ(before.peak_requested_bytes, before.requested_bytes);
  const size_t rounded = CpuMemoryPool::round_request(4000000);
  size_t block = 0;
  {
    Tensor t = Tensor::zeros({1000, 1000}, DType::F32);
    block = cpu_memory_pool().block_size(t.data<float>());
    EXPECT_GE(block, rounded);  // a cached block may be up to 1/8 larger
    EXPECT_LE(block, rounded + rounded / 8);
    DeviceMemoryStats during = device_memory_stats(cpu);
    EXPECT_EQ(during.requested_bytes, before.requested_bytes + 4000000);
    EXPECT_EQ(during.allocated_bytes, before.allocated_bytes + block);
    EXPECT_GE(during.reserved_bytes, during.allocated_bytes);
  }
  DeviceMemoryStats after = device_memory_stats(cpu);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.requested_bytes, before.requested_bytes);
  EXPECT_EQ(after.peak_requested_bytes, before.requested_bytes + 4000000);
}

}  // namespace
}  // namespace ham
