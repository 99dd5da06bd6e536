#pragma once
// The device-memory pool behind every CUDA tensor. Pure C++ (no CUDA header): the raw
// memory it draws from is an interface, the CUDA runtime in production
// (cuda/device_backend.cu) and a fake device in the CPU tests (tests/cuda/).
//
// Pools. Requests are rounded up to a multiple of 512 bytes. Requests of at most 1 MiB
// ("small") are cut from 2 MiB segments; larger ones from segments of 20 MiB when they
// fit in one (under 10 MiB), else from a segment of the request rounded up to 2 MiB.
// Each stream has its own small and large free lists, so a block is only reused by work
// ordered after its last use on that stream: a tensor used on another stream must be
// synchronised by whoever does so before it is freed.
//
// Blocks. A free block found by best fit (smallest that is large enough, then lowest
// address) is split when the remainder is worth keeping (>= 512 bytes in the small pool,
// > 1 MiB in the large one); a freed block merges with free neighbours of its segment.
//
// Out of memory. When the device refuses a new segment, every cached segment with
// nothing in use is released (all streams) and the request retried once; if it still
// fails the error is one line naming the device, the bytes requested and the bytes free,
// cached and in use.
//
// Under AddressSanitizer, where the segments are host memory (the SIMT emulator's device),
// every byte no tensor asked for is poisoned: a block's rounding past its request and
// every free block. A kernel on the emulator that reads or writes past its tensor then
// fails there, as under compute-sanitizer's memcheck, instead of landing in a neighbour.
// Poison and unpoison run in the block's stream order (RawDeviceMemory::in_stream_order).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>

namespace ham::cuda {

// A stream as the pool sees it: an opaque handle (a cudaStream_t's value).
using StreamKey = uintptr_t;

// Raw device memory: whole segments from the device and back.
class RawDeviceMemory {
 public:
  virtual ~RawDeviceMemory() = default;
  // nullptr when the device is out of memory; any other failure throws.
  virtual void* try_allocate(size_t nbytes) = 0;
  virtual void release(void* ptr, size_t nbytes) = 0;
  // What the device reports free now (for the out-of-memory message).
  virtual size_t free_bytes() = 0;
  // Whether the segments are host memory that this process may address (AddressSanitizer
  // then watches the pool's unowned bytes); device memory and fake address ranges: false.
  virtual bool host_addressable() const { return false; }
  // Runs `mark` (a change of the bytes AddressSanitizer counts as a tensor's) in the order
  // of `stream`'s work: where the emulator holds a stream's work (HAM_EMULATOR_STREAMS), a
  // kernel issued before a free runs after it, and the free's poison must wait for it.
  // By default at once.
  virtual void in_stream_order(StreamKey, const std::function<void()>& mark) { mark(); }
};

struct AllocatorStats {
  size_t allocated_bytes = 0;       // in blocks handed out (rounded sizes)
  size_t requested_bytes = 0;       // as asked for
  size_t reserved_bytes = 0;        // in segments taken from the device
  size_t peak_allocated_bytes = 0;  // since construction or reset_peaks()
  size_t peak_requested_bytes = 0;  // the same, as asked for (independent of the cache's state)
  size_t peak_reserved_bytes = 0;
  size_t active_blocks = 0;
  size_t segments = 0;
  size_t device_allocations = 0;    // segments ever taken from the device
  size_t cache_hits = 0;            // requests served from a free block
  size_t oom_retries = 0;           // times the cache was released to retry a request
};

class CachingAllocator {
 public:
  static constexpr size_t kRounding = 512;
  static constexpr size_t kSmallRequestMax = size_t(1) << 20;   // 1 MiB
  static constexpr size_t kSmallSegment = size_t(2) << 20;      // 2 MiB
  static constexpr size_t kMediumSegment = size_t(20) << 20;    // 20 MiB
  static constexpr size_t kMediumRequestMax = size_t(10) << 20;  // 10 MiB
  static constexpr size_t kLargeRounding = size_t(2) << 20;     // 2 MiB

  // `device_name` ("cuda:0") goes into error messages.
  CachingAllocator(RawDeviceMemory& raw, std::string device_name);
  // Releases the cached segments; blocks still in use are leaked (and reported by
  // stats()), since their owners may outlive the allocator at program exit.
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // nullptr for 0 bytes. Throws the out-of-memory error described above.
  void* allocate(size_t nbytes, StreamKey stream);
  // Returns the block to its stream's pool; nullptr is ignored, an unknown pointer throws.
  void free(void* ptr);
  // Releases every segment with nothing in use back to the device.
  void empty_cache();

  AllocatorStats stats() const;
  void reset_peaks();
  // The rounded size of a live block (throws for an unknown pointer).
  size_t block_size(void* ptr) const;

  // The sizes the pool uses for a request (exposed for tests).
  static size_t round_request(size_t nbytes);
  static size_t segment_size_for(size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;
    StreamKey stream = 0;
    bool small_pool = false;
    bool in_use = false;
    Block* prev = nullptr;  // neighbours inside the same segment
    Block* next = nullptr;
  };
  struct BySizeThenAddress {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->ptr < b->ptr;
    }
  };
  using FreeList = std::set<Block*, BySizeThenAddress>;
  struct StreamPools {
    FreeList small, large;
  };

  FreeList& free_list(StreamKey stream, bool small_pool);
  Block* take_free_block(StreamKey stream, bool small_pool, size_t rounded);
  Block* new_segment(StreamKey stream, bool small_pool, size_t rounded);
  void split(Block* block, size_t rounded);
  void release_unused_segments();  // callers hold mutex_
  [[noreturn]] void fail_out_of_memory(size_t nbytes, size_t rounded, size_t segment);

  RawDeviceMemory& raw_;
  std::string device_name_;
  mutable std::mutex mutex_;
  std::map<StreamKey, StreamPools> pools_;
  std::unordered_map<void*, Block*> active_;
  AllocatorStats stats_;
};

}  // namespace ham::cuda
