#pragma once
// The SIMT emulator's racecheck: every access to a block's shared memory (the dynamic buffer
// and each static variable) and to device memory, by every CUDA thread, held against the
// others', as compute-sanitizer's racecheck does for shared memory on a GPU
// (docs/cuda_emulator.md).
//
// Two accesses to one byte by different threads, at least one a write, race unless a
// __syncthreads lies between them, or a __syncwarp for two lanes of one warp. In device
// memory two blocks of one launch are never ordered (nothing in this project's kernels
// orders them: no fences, no flags), so there a byte one block writes may not be read or
// written by another block of the same launch. A launch is ordered after an earlier one
// only as a GPU orders the two pieces of stream work (StreamWork): on one stream, or
// through an event wait, the legacy default stream's implicit waits or a host
// synchronization between them; a copy, memset, GEMM or collective result is stream work
// too, whose accesses are the byte ranges it reads and writes. Atomics do not race with each
// other, only with plain loads and stores. The schedules (simt.h) find a race only where
// it changes a result; this finds it where it does not, whatever order the fibers and
// blocks ran in. A cp.async copy (async_copy.cuh) writes its 16 bytes at any time from its
// issue to the wait_group that covers it: a read or write of them in between races with
// it, by any thread, its issuer included, and a read by another thread after that wait
// needs a barrier too; it reads its source at issue. ldmatrix reads each row for the lane
// that gave its address.
//
// The accesses come from code compiled with -fsanitize=thread (GCC's instrumentation
// only: tsan_entry_points.cpp takes its calls, no ThreadSanitizer runtime is linked), so
// only such code is checked: the kernels where HAM_EMULATOR_RACECHECK builds them so, and
// the emulator's own tests. The atomics (device_functions.h) report themselves; memcpy
// calls inside a kernel are not seen, nor is what the host reads and writes.
#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ham::cuda::emulator {

enum class MemoryAccess { Read, Write, Atomic };

// Where one piece of stream work (a kernel, copy, memset, GEMM or collective result) stands
// in the order a GPU gives the streams' work (kept by runtime.cpp): it is work `number` of
// stream `stream` (streams count from 1), and it is ordered after the first after[s] works
// of each stream s. The default, stream 0, is ordered before everything.
struct StreamWork {
  uint32_t stream = 0;
  uint64_t number = 0;
  std::vector<uint64_t> after;
  // What every later work of the streams that have had work is ordered after (a stream
  // that has had none yet is taken as ordered after it too).
  std::vector<uint64_t> all_later_after;
  std::string where;  // the stream, for messages: "stream 3 of device 0"

  static bool covers(const std::vector<uint64_t>& clock, const StreamWork& earlier) {
    return earlier.stream < clock.size() && clock[earlier.stream] >= earlier.number;
  }
  bool ordered_after(const StreamWork& earlier) const { return covers(after, earlier); }
};

// A byte range a thread-less piece of stream work reads or writes.
struct WorkAccess {
  const void* begin;
  size_t bytes;
  MemoryAccess kind;
};

class Racecheck {
 public:
  // The stream work that runs next: its launch (begin_launch) takes it. A launch without
  // one (a kernel run directly) is ordered after everything before it.
  void set_stream_work(StreamWork work);
  void clear_stream_work() { next_work_set_ = false; }
  // A kernel launch starts, `kernel` its name. `allocations`: the device memory its kernel
  // may reach, as (first byte, bytes), sorted by address. `dependent`: a programmatic
  // dependent launch, whose threads are ordered after the work just ahead of it on its
  // stream only from their griddepcontrol.wait on (grid_dependency_waited).
  void begin_launch(std::vector<std::pair<const char*, size_t>> allocations,
                    const char* kernel, bool dependent = false);
  // Stream work with no threads (`what`: "cudaMemcpyAsync", a collective...): it starts as
  // a launch of one thread, which makes `accesses`. Returns the first race, or "".
  std::string work_accesses(std::vector<std::pair<const char*, size_t>> allocations,
                            const char* what, const std::vector<WorkAccess>& accesses);
  // A block of the launch starts: nothing before it orders or races with what it does in
  // shared memory, and nothing orders it against the launch's other blocks in device
  // memory. `dynamic` is the block's dynamic shared memory.
  void begin_block(const void* dynamic, size_t dynamic_bytes, int threads,
                   std::array<unsigned, 3> block_index);
  // A static shared variable the block has reached, and its name in the source.
  void add_static(const void* variable, size_t bytes, const char* name);
  // __syncthreads completed: it orders everything before it against everything after.
  void barrier();
  // __syncwarp completed in `warp` (the kernels' are all full-warp).
  void warp_sync(int warp);
  // `thread` (linear in the block) passed griddepcontrol.wait.
  void grid_dependency_waited(int thread);

  // `thread` (linear in the block) reads, writes or atomically updates `bytes` bytes at
  // `address`, from the code at `pc`. Returns why that races, or runs past the end of its
  // shared memory or allocation (empty if neither, or if it is neither shared nor device
  // memory: a fiber's stack, the host's).
  // `in_flight`: the write is a cp.async's, whose bytes land at any time until its wait.
  std::string access(int thread, const void* address, size_t bytes, MemoryAccess kind,
                     const void* pc, bool in_flight = false);
  // cp.async by `thread` from 16 bytes of device memory into 16 bytes of dynamic shared
  // memory: issued (reads the source, unless it is null: zeros land, ignore-src; races
  // with what other threads did to the destination since the last barrier, and marks it
  // in flight) and completed by its wait (written now, by `thread`).
  std::string async_copy_issued(int thread, const void* destination, const void* source,
                                const void* pc);
  void async_copy_completed(int thread, const void* destination);

  // How to name a thread (linear in its block) in messages: set by the runner.
  using ThreadName = std::string (*)(int thread, const void* context);
  void set_thread_name(ThreadName name, const void* context) {
    thread_name_ = name;
    name_context_ = context;
  }

 private:
  // One byte's last write and up to two reads since, each with its thread (linear in its
  // block), the clock at the access (which also says which block made it: blocks and
  // launches each start with a tick of their own) and the code that made it (code_).
  struct ByteHistory {
    uint32_t write_clock = 0;
    uint32_t read_clock[2] = {0, 0};
    uint32_t write_code = 0;
    uint32_t read_code[2] = {0, 0};
    uint16_t writer = 0;
    uint16_t reader[2] = {0, 0};
    bool write_in_flight = false;  // a cp.async between its issue and its wait
    bool write_atomic = false;     // by atomics only, since the last plain write
    bool several_blocks = false;   // those atomics: of more than one block
  };
  // A stretch of memory whose bytes have histories: shared (`history` covers it) or a
  // device allocation (`history` null: its bytes' histories are in pages_).
  struct Region {
    const char* begin;
    size_t bytes;
    std::vector<ByteHistory>* history;
    const char* name;  // a static variable's; null for the dynamic shared memory
    bool shared() const { return history != nullptr; }
  };
  static constexpr size_t kPageBytes = 4096;

  // A launch whose device memory histories may still be checked against: when it started,
  // its stream work, what it ran, and whether the running launch is ordered after it.
  struct EarlierLaunch {
    uint32_t start;
    StreamWork work;
    std::string what;
    bool ordered;
    bool threadless;  // work_accesses'
    // The work just ahead of a dependent launch on its stream: ordered before the running
    // launch's threads that have waited (waited_), and before no other.
    bool ordered_after_wait = false;
  };

  const Region* find(const void* address);
  // The launch that made an access recorded at `clock` before the running launch started;
  // null where its histories are older than every launch kept (all ordered before this).
  const EarlierLaunch* earlier_launch(uint32_t clock) const;
  // Whether `thread` of the running block is ordered after that launch's accesses.
  bool earlier_launch_ordered(uint32_t clock, int thread) const;
  ByteHistory* device_history(const char* byte);
  uint32_t code_id(const void* pc, bool name = false);
  std::string describe_code(uint32_t code) const;
  // Whether an access recorded at `clock` by thread `earlier` (of several blocks, for
  // `several_blocks`) is ordered before one now by `thread` of the running block.
  bool ordered(const Region& region, uint32_t clock, int earlier, int thread,
               bool several_blocks = false) const;
  std::string access_by_code(int thread, const void* address, size_t bytes, MemoryAccess kind,
                             uint32_t code, bool in_flight);
  std::string check_byte(ByteHistory& h, const Region& region, size_t offset, int thread,
                         MemoryAccess kind, uint32_t code, bool in_flight);
  std::string race(const char* what_now, int thread, uint32_t code, const char* what_then,
                   uint32_t earlier_clock, int earlier, bool several_blocks,
                   uint32_t earlier_code, const Region& region, size_t offset,
                   const std::string& why) const;
  std::string thread_name(uint32_t clock, int thread, bool several_blocks,
                          const Region& region) const;
  uint32_t tick();
  void forget_device_histories();

  uint32_t clock_ = 0;
  uint32_t launch_start_ = 0;  // the clock at the launch's start
  // The launches whose device memory histories are kept, by start: every launch since the
  // histories were last forgotten (when every stream's later work was ordered after all).
  std::vector<EarlierLaunch> launches_;
  uint32_t ordered_below_ = 0;  // clocks below it are of launches ordered before this one
  StreamWork next_work_;        // set_stream_work's, for the next launch
  bool next_work_set_ = false;
  uint32_t block_start_ = 0;   // the clock at the block's start
  uint32_t block_epoch_ = 0;   // the clock at the last barrier (or the block's start)
  // The launch's blocks so far, in the order they ran: each one's start and blockIdx.
  std::vector<uint32_t> block_starts_;
  std::vector<std::array<unsigned, 3>> block_index_;
  std::vector<uint32_t> warp_epoch_;  // the clock at each warp's last __syncwarp
  std::vector<bool> waited_;          // each thread's griddepcontrol.wait, this block
  std::vector<ByteHistory> dynamic_history_;
  // A deque: regions_ points into it, and adding a variable must not move the others.
  std::deque<std::pair<const void*, std::vector<ByteHistory>>> static_history_;
  std::vector<Region> regions_;  // the block's shared memory
  std::vector<Region> allocations_;  // the launch's device memory, sorted
  const Region* last_allocation_ = nullptr;
  // The device memory histories of the launches kept (launches_), a page of kPageBytes bytes
  // at a time, by address / kPageBytes. Pages forgotten are kept for reuse as they are:
  // every clock in them is of a launch ordered before the next.
  std::unordered_map<uintptr_t, std::unique_ptr<ByteHistory[]>> pages_;
  std::vector<std::unique_ptr<ByteHistory[]>> spare_pages_;
  uintptr_t last_page_number_ = 0;
  ByteHistory* last_page_ = nullptr;
  // The code that made each access, by a number of 32 bits (0: unknown).
  std::unordered_map<const void*, uint32_t> code_ids_;
  std::vector<const void*> code_ = {nullptr};
  std::vector<bool> code_is_name_ = {false};  // code_ holds a work's name, not an address
  ThreadName thread_name_ = nullptr;
  const void* name_context_ = nullptr;
};

// Whether the racecheck runs in this process: only where some code was built with the
// instrumentation (its constructors call __tsan_init, which turns it on), so that the
// emulated suites of the default build pay nothing for it.
void turn_racecheck_on();
bool racecheck_on();

// Stream work for the calling OS thread's racecheck (simt.cpp), from the runtime: the order
// of the work that runs next, and the byte ranges a thread-less one (a copy, memset, GEMM,
// collective result; `what` a string literal, which names it) reads and writes, which throw
// ham::Error on a race. Done: the work has run (a kernel with no threads launches nothing).
void racecheck_stream_work(StreamWork work);
void racecheck_stream_work_done();
void racecheck_work_accesses(const char* what, const std::vector<WorkAccess>& accesses);

// Where `pc` lies: "function (file:line)" from addr2line when it can say, else the binary
// and offset.
std::string describe_code_address(const void* pc);
// The unqualified name of the function that starts at `function`, template arguments kept
// ("kernel<128, 128>"), from addr2line; "" where it cannot say.
std::string function_name_at(const void* function);

}  // namespace ham::cuda::emulator
