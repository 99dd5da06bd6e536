#include "core/cpu_memory_pool.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <string>

#include "core/address_sanitizer.h"
#include "core/error.h"

namespace ham {

namespace {

// AddressSanitizer's view of a cached block: poisoned while the pool keeps it, so a read of
// a freed CPU tensor is still reported when the pool caches (under ASan it caches only when
// a test asks it to); the system's again when handed out or released.
void poison(char* block, size_t size) {
#if HAM_ADDRESS_SANITIZER
  ASAN_POISON_MEMORY_REGION(block, size);
#else
  (void)block, (void)size;
#endif
}

void unpoison(char* block, size_t size) {
#if HAM_ADDRESS_SANITIZER
  ASAN_UNPOISON_MEMORY_REGION(block, size);
#else
  (void)block, (void)size;
#endif
}

std::string mib(size_t bytes) { return std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

CpuMemoryPool::CpuMemoryPool(size_t max_cached_bytes) {
  stats_.max_cached_bytes = max_cached_bytes;
}

CpuMemoryPool::~CpuMemoryPool() { empty_cache(); }

size_t CpuMemoryPool::round_request(size_t nbytes) {
  size_t unit = nbytes <= kSmallMax ? kAlignment : kPage;
  return (nbytes + unit - 1) / unit * unit;
}

std::pair<char*, size_t> CpuMemoryPool::take_cached(size_t rounded) {
  auto it = cached_.lower_bound({rounded, nullptr});
  if (it == cached_.end() || it->first > rounded + rounded / 8) return {nullptr, 0};
  auto [size, block] = *it;
  cached_.erase(it);
  unpoison(block, size);
  stats_.cached_bytes -= size;
  stats_.cached_blocks -= 1;
  return {block, size};
}

void CpuMemoryPool::trim_cache(size_t limit) {
  while (stats_.cached_bytes > limit) {
    auto largest = std::prev(cached_.end());
    unpoison(largest->second, largest->first);
    std::free(largest->second);
    stats_.cached_bytes -= largest->first;
    stats_.cached_blocks -= 1;
    cached_.erase(largest);
  }
}

void* CpuMemoryPool::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  size_t rounded = round_request(nbytes);
  HAM_CHECK(rounded >= nbytes, "cpu: cannot allocate ", nbytes, " bytes (past size_t)");
  std::lock_guard<std::mutex> lock(mutex_);
  auto [block, size] = take_cached(rounded);
  if (block) {
    stats_.cache_hits += 1;
  } else {
    size = rounded;
    block = static_cast<char*>(std::aligned_alloc(kAlignment, size));
    if (!block && !cached_.empty()) {  // give the cache back and ask once more
      trim_cache(0);
      block = static_cast<char*>(std::aligned_alloc(kAlignment, size));
    }
    HAM_CHECK(block, "cpu: out of memory allocating ", nbytes, " bytes (",
              mib(stats_.allocated_bytes), " in use by tensors)");
    stats_.system_allocations += 1;
  }
  active_[block] = ActiveBlock{size, nbytes};
  stats_.allocated_bytes += size;
  stats_.requested_bytes += nbytes;
  stats_.active_blocks += 1;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_requested_bytes = std::max(stats_.peak_requested_bytes, stats_.requested_bytes);
  return block;
}

void CpuMemoryPool::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  HAM_CHECK(it != active_.end(), "cpu: free of ", ptr,
            ", which the CPU memory pool did not hand out");
  ActiveBlock block = it->second;
  active_.erase(it);
  stats_.allocated_bytes -= block.size;
  stats_.requested_bytes -= block.requested;
  stats_.active_blocks -= 1;
  if (block.size > stats_.max_cached_bytes) {
    std::free(ptr);
    return;
  }
  poison(static_cast<char*>(ptr), block.size);
  cached_.insert({block.size, static_cast<char*>(ptr)});
  stats_.cached_bytes += block.size;
  stats_.cached_blocks += 1;
  trim_cache(stats_.max_cached_bytes);
}

void CpuMemoryPool::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  trim_cache(0);
}

CpuMemoryStats CpuMemoryPool::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CpuMemoryPool::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_requested_bytes = stats_.requested_bytes;
}

size_t CpuMemoryPool::block_size(void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  HAM_CHECK(it != active_.end(), "cpu: ", ptr, " is not a block of the CPU memory pool");
  return it->second.size;
}

size_t cpu_memory_cache_limit(const char* cache_mib) {
  if (!cache_mib) {
    long pages = sysconf(_SC_PHYS_PAGES), page_size = sysconf(_SC_PAGESIZE);
    HAM_CHECK(pages > 0 && page_size > 0, "HAM_CPU_CACHE_MIB is unset and the size of physical ",
              "memory is unknown (sysconf): set it");
    return size_t(pages) * size_t(page_size) / 4;
  }
  std::string value(cache_mib);
  bool digits = !value.empty() && value.size() <= 12 &&
                value.find_first_not_of("0123456789") == std::string::npos;
  HAM_CHECK(digits, "HAM_CPU_CACHE_MIB='", value,
            "': expected a whole number of MiB (0 turns the CPU memory cache off)");
  return size_t(std::stoull(value)) << 20;
}

CpuMemoryPool& cpu_memory_pool() {
  static CpuMemoryPool* pool = new CpuMemoryPool(
      HAM_ADDRESS_SANITIZER ? 0 : cpu_memory_cache_limit(std::getenv("HAM_CPU_CACHE_MIB")));
  return *pool;
}

}  // namespace ham
