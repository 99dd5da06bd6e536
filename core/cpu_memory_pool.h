#pragma once
// The host-memory pool behind every CPU tensor.
//
// Why: a training step frees and allocates the same sizes every step. From glibc each
// block above its mmap threshold is a fresh mapping whose pages fault in one at a time
// inside the kernel that first writes them (about 2,800 faults a step in the tiny HAM
// config), and freeing it unmaps it again. The pool keeps freed blocks for the next request
// they fit.
//
// Sizes. Requests round up to 64 bytes up to 64 KiB and to 4 KiB pages above; every block
// is 64-byte aligned. A request takes the smallest free block of at least its rounded size
// and at most 1/8 more (lowest address among equals); else a new block from the system.
//
// Limit. Free blocks beyond max_cached_bytes go back to the system, largest first, and a
// block larger than the limit is never kept; with a limit of 0 the pool is a plain aligned
// malloc and free that keeps the statistics. Thread-safe.
#include <cstddef>
#include <mutex>
#include <set>
#include <unordered_map>
#include <utility>

namespace ham {

struct CpuMemoryStats {
  size_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  size_t requested_bytes = 0;       // as asked for
  size_t cached_bytes = 0;          // in free blocks the pool keeps
  size_t peak_allocated_bytes = 0;  // since construction or reset_peaks()
  size_t peak_requested_bytes = 0;  // the same, as asked for (independent of the cache's state)
  size_t active_blocks = 0;
  size_t cached_blocks = 0;
  size_t system_allocations = 0;    // blocks ever taken from the system
  size_t cache_hits = 0;            // requests served from a free block
  size_t max_cached_bytes = 0;      // the limit
};

class CpuMemoryPool {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kPage = 4096;
  static constexpr size_t kSmallMax = size_t(64) << 10;  // 64 KiB: round to 64 bytes up to it

  explicit CpuMemoryPool(size_t max_cached_bytes);
  // Releases the cached blocks. Blocks still in use stay allocated: their owners may outlive
  // the pool at program exit.
  ~CpuMemoryPool();
  CpuMemoryPool(const CpuMemoryPool&) = delete;
  CpuMemoryPool& operator=(const CpuMemoryPool&) = delete;

  // nullptr for 0 bytes. A one-line error naming the size when the system has no memory
  // left even after the cache is released.
  void* allocate(size_t nbytes);
  // nullptr is ignored; a pointer the pool did not hand out is an error.
  void free(void* ptr);
  // Returns every cached block to the system.
  void empty_cache();

  CpuMemoryStats stats() const;
  void reset_peaks();
  // The rounded size of a live block (an error for a pointer the pool did not hand out).
  size_t block_size(void* ptr) const;

  static size_t round_request(size_t nbytes);

 private:
  struct ActiveBlock {
    size_t size = 0;
    size_t requested = 0;
  };
  // The best-fitting free block for a rounded request, removed from the cache, with its size;
  // {nullptr, 0} when none fits. Callers hold mutex_.
  std::pair<char*, size_t> take_cached(size_t rounded);
  void trim_cache(size_t limit);  // frees cached blocks, largest first; callers hold mutex_

  mutable std::mutex mutex_;
  std::set<std::pair<size_t, char*>> cached_;  // free blocks by size, then address
  std::unordered_map<void*, ActiveBlock> active_;
  CpuMemoryStats stats_;
};

// The cache limit for HAM_CPU_CACHE_MIB's value: that many MiB (0 turns the cache off), or a
// quarter of physical memory for nullptr (unset). A one-line error naming the variable for
// anything but a whole number.
size_t cpu_memory_cache_limit(const char* cache_mib);

// The pool every CPU tensor (and a device emulated on the CPU) draws from, created on first
// use and never destroyed, so a static tensor may outlive everything else. Its limit is
// cpu_memory_cache_limit(getenv("HAM_CPU_CACHE_MIB")), except under AddressSanitizer: 0, so
// the sanitizer's quarantine sees every free.
CpuMemoryPool& cpu_memory_pool();

}  // namespace ham
