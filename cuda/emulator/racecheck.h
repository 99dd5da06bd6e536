#pragma once
// The SIMT emulator's racecheck: every access to a block's shared memory (the dynamic buffer
// and each static variable), by every CUDA thread, held against the others since the last
// barrier, as compute-sanitizer's racecheck does on a GPU (docs/cuda_emulator.md).
//
// Two accesses to one byte by different threads, at least one a write, race unless a
// __syncthreads lies between them, or a __syncwarp for two lanes of one warp. The
// schedules (simt.h) find a race only where it changes a result; this finds it where it
// does not, whatever order the fibers ran in. A cp.async copy (async_copy.cuh) writes its
// 16 bytes at any time from its issue to the wait_group that covers it: a read or write of
// them in between races with it, by any thread, its issuer included, and a read by another
// thread after that wait needs a barrier too. ldmatrix reads each row for the lane that
// gave its address.
//
// The accesses come from code compiled with -fsanitize=thread (GCC's instrumentation
// only: tsan_entry_points.cpp takes its calls, no ThreadSanitizer runtime is linked), so
// only such code is checked: the kernels where HAM_EMULATOR_RACECHECK builds them so, and
// the emulator's own tests. Atomics and memcpy calls are not seen.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

namespace ham::cuda::emulator {

enum class SharedAccess { Read, Write };

class SharedMemoryRacecheck {
 public:
  // A block starts: nothing before it orders or races with what it does. `dynamic` is the
  // block's dynamic shared memory.
  void begin_block(const void* dynamic, size_t dynamic_bytes, int threads);
  // A static shared variable the block has reached, and its name in the source.
  void add_static(const void* variable, size_t bytes, const char* name);
  // __syncthreads completed: it orders everything before it against everything after.
  void barrier();
  // __syncwarp completed in `warp` (the kernels' are all full-warp).
  void warp_sync(int warp);

  // `thread` (linear in the block) reads or writes `bytes` bytes at `address`, from the
  // code at `pc`. Returns why that races, or runs past the end of shared memory (empty if
  // neither, or if it is not shared memory).
  // `in_flight`: the write is a cp.async's, whose bytes land at any time until its wait.
  std::string access(int thread, const void* address, size_t bytes, SharedAccess kind,
                     const void* pc, bool in_flight = false);
  // cp.async by `thread` into 16 bytes of dynamic shared memory: issued (races with what
  // other threads did to them since the last barrier, and marks them in flight) and
  // completed by its wait (written now, by `thread`).
  std::string async_copy_issued(int thread, const void* destination, const void* pc);
  void async_copy_completed(int thread, const void* destination);

  // How to name a thread and a byte in messages: set by the runner.
  using ThreadName = std::string (*)(int thread, const void* context);
  void set_thread_name(ThreadName name, const void* context) {
    thread_name_ = name;
    name_context_ = context;
  }

 private:
  // One byte's last write and up to two reads since, each with the thread, the clock at
  // the access and the code that made it.
  struct ByteHistory {
    uint32_t write_clock = 0;
    uint32_t read_clock[2] = {0, 0};
    uint16_t writer = 0;
    uint16_t reader[2] = {0, 0};
    bool write_in_flight = false;  // a cp.async between its issue and its wait
    const void* write_pc = nullptr;
    const void* read_pc[2] = {nullptr, nullptr};
  };
  struct Region {
    const char* begin;
    size_t bytes;
    std::vector<ByteHistory>* history;
    const char* name;  // a static variable's; null for the dynamic shared memory
  };

  const Region* find(const void* address) const;
  // An access recorded at `clock` by `earlier` is ordered before one now by `thread`.
  bool ordered(int earlier, uint32_t clock, int thread) const;
  std::string race(const char* what_now, int thread, const void* pc, const char* what_then,
                   int earlier, const void* earlier_pc, const Region& region, size_t offset,
                   const char* why = "with no barrier between them") const;
  uint32_t tick();

  uint32_t clock_ = 0;
  uint32_t block_start_ = 0;  // the clock at the block's start
  uint32_t block_epoch_ = 0;  // the clock at the last barrier (or the block's start)
  std::vector<uint32_t> warp_epoch_;  // the clock at each warp's last __syncwarp
  std::vector<ByteHistory> dynamic_history_;
  // A deque: regions_ points into it, and adding a variable must not move the others.
  std::deque<std::pair<const void*, std::vector<ByteHistory>>> static_history_;
  std::vector<Region> regions_;
  ThreadName thread_name_ = nullptr;
  const void* name_context_ = nullptr;
};

// Whether the racecheck runs in this process: only where some code was built with the
// instrumentation (its constructors call __tsan_init, which turns it on), so that the
// emulated suites of the default build pay nothing for it.
void turn_racecheck_on();
bool racecheck_on();

// Where `pc` lies: "function (file:line)" from addr2line when it can say, else the binary
// and offset.
std::string describe_code_address(const void* pc);

}  // namespace ham::cuda::emulator
