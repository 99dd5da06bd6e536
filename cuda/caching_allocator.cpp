#include "cuda/caching_allocator.h"

#include <algorithm>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/address_sanitizer.h"

namespace ham::cuda {

CachingAllocator::CachingAllocator(RawDeviceMemory& raw, std::string device_name)
    : raw_(raw), device_name_(std::move(device_name)) {}

CachingAllocator::~CachingAllocator() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_unused_segments();
}

namespace {

// [ptr, ptr + n) unowned (poisoned) or owned again, in `stream`'s order, where ASan runs
// and the raw memory is the host's.
void mark_unowned(RawDeviceMemory& raw, const void* ptr, size_t n, StreamKey stream) {
#if HAM_ADDRESS_SANITIZER
  if (raw.host_addressable()) {
    raw.in_stream_order(stream, [ptr, n] { __asan_poison_memory_region(ptr, n); });
  }
#else
  (void)raw, (void)ptr, (void)n, (void)stream;
#endif
}
void mark_owned(RawDeviceMemory& raw, const void* ptr, size_t n, StreamKey stream) {
#if HAM_ADDRESS_SANITIZER
  if (raw.host_addressable()) {
    raw.in_stream_order(stream, [ptr, n] { __asan_unpoison_memory_region(ptr, n); });
  }
#else
  (void)raw, (void)ptr, (void)n, (void)stream;
#endif
}

}  // namespace

size_t CachingAllocator::round_request(size_t nbytes) {
  if (nbytes == 0) return 0;
  return (nbytes + kRounding - 1) / kRounding * kRounding;
}

size_t CachingAllocator::segment_size_for(size_t rounded) {
  if (rounded <= kSmallRequestMax) return kSmallSegment;
  if (rounded < kMediumRequestMax) return kMediumSegment;
  return (rounded + kLargeRounding - 1) / kLargeRounding * kLargeRounding;
}

CachingAllocator::FreeList& CachingAllocator::free_list(StreamKey stream, bool small_pool) {
  StreamPools& pools = pools_[stream];
  return small_pool ? pools.small : pools.large;
}

CachingAllocator::Block* CachingAllocator::take_free_block(StreamKey stream, bool small_pool,
                                                           size_t rounded) {
  FreeList& list = free_list(stream, small_pool);
  Block probe;
  probe.size = rounded;
  probe.ptr = nullptr;  // lowest address among equal sizes
  auto it = list.lower_bound(&probe);
  if (it == list.end()) return nullptr;
  Block* block = *it;
  list.erase(it);
  return block;
}

CachingAllocator::Block* CachingAllocator::new_segment(StreamKey stream, bool small_pool,
                                                       size_t rounded) {
  size_t segment = segment_size_for(rounded);
  void* ptr = raw_.try_allocate(segment);
  if (!ptr) {
    // Free-and-retry: give back every cached segment nobody uses, then ask once more.
    ++stats_.oom_retries;
    release_unused_segments();
    ptr = raw_.try_allocate(segment);
    if (!ptr) return nullptr;
  }
  mark_unowned(raw_, ptr, segment, stream);
  auto* block = new Block;
  block->ptr = static_cast<char*>(ptr);
  block->size = segment;
  block->stream = stream;
  block->small_pool = small_pool;
  stats_.reserved_bytes += segment;
  stats_.peak_reserved_bytes = std::max(stats_.peak_reserved_bytes, stats_.reserved_bytes);
  ++stats_.segments;
  ++stats_.device_allocations;
  return block;
}

void CachingAllocator::split(Block* block, size_t rounded) {
  size_t remainder = block->size - rounded;
  // A small-pool remainder is useful down to one rounding unit; in the large pool only a
  // remainder that is itself a large request is kept apart (smaller ones stay attached,
  // so large segments do not fragment into slivers).
  bool worth_splitting = block->small_pool ? remainder >= kRounding : remainder > kSmallRequestMax;
  if (!worth_splitting) return;
  auto* rest = new Block;
  rest->ptr = block->ptr + rounded;
  rest->size = remainder;
  rest->stream = block->stream;
  rest->small_pool = block->small_pool;
  rest->prev = block;
  rest->next = block->next;
  if (block->next) block->next->prev = rest;
  block->next = rest;
  block->size = rounded;
  free_list(rest->stream, rest->small_pool).insert(rest);
}

void* CachingAllocator::allocate(size_t nbytes, StreamKey stream) {
  if (nbytes == 0) return nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  size_t rounded = round_request(nbytes);
  bool small_pool = rounded <= kSmallRequestMax;
  Block* block = take_free_block(stream, small_pool, rounded);
  if (block) {
    ++stats_.cache_hits;
  } else {
    block = new_segment(stream, small_pool, rounded);
    if (!block) fail_out_of_memory(nbytes, rounded, segment_size_for(rounded));
  }
  split(block, rounded);
  mark_owned(raw_, block->ptr, nbytes, stream);
  block->in_use = true;
  block->requested = nbytes;
  active_.emplace(block->ptr, block);
  stats_.allocated_bytes += block->size;
  stats_.requested_bytes += nbytes;
  stats_.peak_allocated_bytes = std::max(stats_.peak_allocated_bytes, stats_.allocated_bytes);
  stats_.peak_requested_bytes = std::max(stats_.peak_requested_bytes, stats_.requested_bytes);
  ++stats_.active_blocks;
  return block->ptr;
}

void CachingAllocator::free(void* ptr) {
  if (!ptr) return;
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  HAM_CHECK(it != active_.end(), device_name_, ": caching allocator asked to free ", ptr,
            ", which it did not hand out (or already freed)");
  Block* block = it->second;
  active_.erase(it);
  mark_unowned(raw_, block->ptr, block->requested, block->stream);
  stats_.allocated_bytes -= block->size;
  stats_.requested_bytes -= block->requested;
  --stats_.active_blocks;
  block->in_use = false;
  block->requested = 0;
  FreeList& list = free_list(block->stream, block->small_pool);
  // Merge with free neighbours: the survivor is the lower-addressed block.
  if (Block* next = block->next; next && !next->in_use) {
    list.erase(next);
    block->size += next->size;
    block->next = next->next;
    if (next->next) next->next->prev = block;
    delete next;
  }
  if (Block* prev = block->prev; prev && !prev->in_use) {
    list.erase(prev);
    prev->size += block->size;
    prev->next = block->next;
    if (block->next) block->next->prev = prev;
    delete block;
    block = prev;
  }
  list.insert(block);
}

void CachingAllocator::release_unused_segments() {
  for (auto& [stream, pools] : pools_) {
    for (FreeList* list : {&pools.small, &pools.large}) {
      std::vector<Block*> whole_segments;
      for (Block* block : *list) {
        if (!block->prev && !block->next) whole_segments.push_back(block);
      }
      for (Block* block : whole_segments) {
        list->erase(block);
        mark_owned(raw_, block->ptr, block->size, stream);  // the raw memory's own again
        raw_.release(block->ptr, block->size);
        stats_.reserved_bytes -= block->size;
        --stats_.segments;
        delete block;
      }
    }
  }
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mutex_);
  release_unused_segments();
}

AllocatorStats CachingAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void CachingAllocator::reset_peaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  stats_.peak_allocated_bytes = stats_.allocated_bytes;
  stats_.peak_requested_bytes = stats_.requested_bytes;
  stats_.peak_reserved_bytes = stats_.reserved_bytes;
}

size_t CachingAllocator::block_size(void* ptr) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = active_.find(ptr);
  HAM_CHECK(it != active_.end(), device_name_, ": no live block at ", ptr);
  return it->second->size;
}

void CachingAllocator::fail_out_of_memory(size_t nbytes, size_t rounded, size_t segment) {
  size_t cached = stats_.reserved_bytes - stats_.allocated_bytes;
  HAM_FAIL(device_name_, ": out of memory: requested ", nbytes, " bytes (a ", segment,
           "-byte segment for the ", rounded, "-byte block), ", raw_.free_bytes(),
           " bytes free on the device, ", stats_.allocated_bytes, " bytes in use by tensors, ",
           cached, " bytes cached after releasing unused segments (", stats_.reserved_bytes,
           " reserved)");
}

}  // namespace ham::cuda
