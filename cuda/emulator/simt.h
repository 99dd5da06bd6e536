#pragma once
// The SIMT emulator: runs the project's CUDA kernels (cuda/*.cu compiled as C++) on the CPU,
// so that their logic is tested on machines without a GPU (docs/cuda_emulator.md).
//
// Every CUDA thread of a block is a fiber with its own stack; the fibers of one block run
// cooperatively on the launching OS thread, one at a time, and switch only where a CUDA
// thread would wait for others: __syncthreads and the warp collectives (__syncwarp,
// __shfl_*_sync, __ballot_sync, __match_any_sync, ...). Blocks run one after another. So
// a kernel sees one legal interleaving of its threads; HAM_EMULATOR_SCHEDULE picks which
// (forward, reverse or shuffled thread order at every barrier) so that a race on shared
// memory shows up as a difference between schedules.
//
// What a GPU would reject or leave undefined is an error here, naming the kernel's launch
// site, the block and the thread: a barrier some threads of the block never reach
// (deadlock), lanes of a warp meeting in different collectives or with different masks, a
// shuffle reading a lane outside the mask, a mask naming a lane that has exited, __trap(),
// a bad launch configuration. Shared memory (dynamic, and each block's static variables)
// and fresh device memory are filled with 0xff bytes (NaN as floats), so a read of
// something never written shows.
//
// Shared and device memory races, those between blocks of one launch included, are also
// found directly, access by access, in code compiled for it (racecheck.h).
//
// Not emulated: timing, occupancy, registers, the memory model beyond "a barrier orders
// everything".
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

struct uint3 {
  unsigned x, y, z;
};
// The vector types kernels move 8 or 16 bytes at a time with, aligned as CUDA aligns them.
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
struct alignas(16) float4 {
  float x, y, z, w;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

namespace ham::cuda::emulator {

// Where the running CUDA thread is (threadIdx, blockIdx, blockDim, gridDim).
struct ThreadPlace {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};
// The running fiber's place, null outside a kernel: read inline by place(), as kernels
// read threadIdx and blockIdx everywhere (a call each read cost about 2% of an emulated
// test's time).
extern thread_local constinit const ThreadPlace* running_place;
[[noreturn]] void fail_outside_kernel();
// The calling fiber's place; outside a kernel, an error.
inline const ThreadPlace& place() {
  if (running_place == nullptr) [[unlikely]] fail_outside_kernel();
  return *running_place;
}

// A launch site, for messages: "gdr_forward_kernel<T> at cuda/gated_delta_rule.cu:978".
// `function` is the kernel's address, under which the runtime keeps its attributes and the
// static shared memory its blocks have reached (static_shared_reached), and `device` the
// device current at the launch. `dependent`: a programmatic dependent launch
// (HAM_LAUNCH_DEPENDENT, cuda/dependent_launch.h), which may start before the work ahead
// of it on its stream ends, so that every thread must wait for it (grid_dependency_wait).
struct LaunchSite {
  const char* kernel;
  const char* file;
  int line;
  const void* function = nullptr;
  int device = 0;
  bool dependent = false;
};

// The kernel of `site` for messages: the launch's text, or where that is a plain name the
// kernel does not bear (a launcher's parameter: `kernel`), the name of the function it
// calls, from addr2line ("backward_dq_wgmma_persistent<128, 128>").
std::string kernel_name(const LaunchSite& site);

// The address of the kernel a launch (HAM_LAUNCH) names and calls with `args`:
// kernel_address(0, kernel, args...). The kernel is a pointer, a function, or a template
// whose remaining arguments the call deduces; for that last the arguments' types must be
// its parameters' exactly.
template <class... Params, class... Args>
const void* kernel_address(int, void (*kernel)(Params...), const Args&...) {
  return reinterpret_cast<const void*>(kernel);
}
template <class... Args>
const void* kernel_address(long, void (*kernel)(std::decay_t<Args>...), const Args&...) {
  return reinterpret_cast<const void*>(kernel);
}

// Runs `body` once per thread of every block of `grid` x `block`, with `dynamic_shared_bytes`
// of dynamic shared memory per block. Throws (ham::Error) on a bad configuration or when the
// kernel fails; a bad configuration is also left for cudaGetLastError like on a GPU.
void run_kernel(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                const std::function<void()>& body);

// The block's dynamic shared memory (extern __shared__) and its size in bytes.
void* dynamic_shared_memory();
size_t dynamic_shared_size();

// A static shared variable's declaration (HAM_STATIC_SHARED, cuda/launch.h), a static
// here, reached by the current thread: the first of the block's threads to reach it fills
// its `bytes` bytes with 0xff, as each block's copy on a GPU starts undefined, so a read of
// what this block never wrote does not find an earlier block's value. `name` is its name in
// the source, for messages.
void static_shared_variable(void* variable, size_t bytes, const char* name);

// The runtime's side of a block's first reach (runtime.cpp): adds `variable`, if new, to the
// static shared memory known for `site.function` and returns why a GPU would refuse the
// launch with `dynamic_shared_bytes` now that it is known (static and dynamic together past
// the kernel's limit), or "" where it would not or the launch was checked with it already.
std::string static_shared_reached(const LaunchSite& site, size_t dynamic_shared_bytes,
                                  const void* variable, size_t bytes);

// __syncthreads and its counting forms: waits for every thread of the block that has not
// exited; returns how many of them met there and how many passed a non-zero predicate.
struct BarrierCount {
  int passed;
  int total;
};
BarrierCount block_barrier(int predicate);

// The warp collectives. Every lane named in `mask` must make the same call (same kind and
// mask) before any of them returns.
enum class WarpCollective {
  Sync,
  ShuffleIndex,
  ShuffleUp,
  ShuffleDown,
  ShuffleXor,
  Ballot,
  Any,
  All,
  MatchAny,
  Exchange,  // warp_exchange below
};
// `value` is the lane's operand (raw bits, up to 8 bytes); `lane_operand` the source lane,
// delta or xor mask of a shuffle; `width` the shuffle's segment width. Returns the lane's
// result as raw bits (the shuffled value, or a lane mask).
uint64_t warp_collective(WarpCollective kind, unsigned mask, uint64_t value, int lane_operand,
                         int width);

// The order in which the fibers of a block run, at the start and after every barrier:
// thread order, reverse thread order, or a shuffle (fixed seed). In the reverse schedule
// the lanes a warp collective releases run next, so each warp runs ahead of the others to
// the next barrier, and the blocks of a grid run last first (two blocks writing one
// element then leave the other value than in grid order). The default comes from
// HAM_EMULATOR_SCHEDULE (forward, reverse, shuffle; forward when unset).
enum class Schedule { Forward, Reverse, Shuffle };
Schedule schedule();
void set_schedule(Schedule schedule);

// A warp-wide operation on more than a value per lane (mma.sync, ldmatrix: cuda/mma.cuh):
// every lane of `mask` arrives with a pointer to its own data; once all have, `combine` runs
// once with the 32 pointers (null outside the mask) and writes each lane's results through
// them; then every lane goes on. `name` is the instruction, for messages.
using WarpCombine = void (*)(void* const* lanes, unsigned mask);
void warp_exchange(unsigned mask, void* lane_data, WarpCombine combine, const char* name);

// cp.async (cuda/async_copy.cuh): a 16-byte copy from global to the block's dynamic shared
// memory that completes later. The emulator defers it to the issuing thread's
// async_copy_wait that covers its group, so a read of the destination before that wait
// (or, by another thread, before the barrier after it) sees the old bytes and fails. In
// the reverse schedule it lands at issue instead, so a copy issued into a buffer that
// other threads have not yet been fenced off from reading (a missing barrier before a
// double buffer's reuse) overwrites it under them and fails.
void async_copy_16(void* shared_destination, const void* global_source);
// The same, or where !copy 16 zero bytes that land as a copy would, the source not read
// (ignore-src; it must still be 16-byte aligned).
void async_copy_16_or_zeros(void* shared_destination, const void* global_source, bool copy);
// Closes the calling thread's open group of copies (cp.async.commit_group).
void async_copy_commit();
// Completes every committed group but the `pending` most recent (cp.async.wait_group).
void async_copy_wait(int pending);

// wgmma.mma_async (cuda/wgmma.cuh) may read its shared-memory operands at any time between
// its issue and the wgmma.wait_group that covers it, so nothing may write them in between.
// The emulator computes a wgmma when its warp issues it, so such a write would not change
// the result here; instead the warp exchange that computes it (warp_exchange's combine)
// hands lane 0 of the warp a check that reads the operands again. The wait that completes
// the wgmma runs it, and fails the kernel with what it returns where that is not empty
// (the first element that changed). A thread that ends with wgmmas no wait covered fails
// as well.
using WgmmaOperandCheck = std::function<std::string()>;
void wgmma_issued(WgmmaOperandCheck check);
// Closes the calling thread's open group of wgmmas (wgmma.commit_group).
void wgmma_commit();
// Completes every committed group but the `pending` most recent (wgmma.wait_group).
void wgmma_wait(int pending);

// fence.proxy.async.shared::cta (wgmma::fence_proxy_async). Ordinary stores and cp.async
// write shared memory through the generic proxy; the tensor cores read it through the async
// proxy, which is only guaranteed to see a write that its thread fenced before a barrier
// published it. The emulator keeps a copy of the dynamic shared memory as the async proxy
// sees it, refreshed at each barrier that some thread's fence preceded (any thread's fence
// counts for every write before it: a kernel that fences some writes and not others can
// pass); a wgmma that reads a byte where the copy and the memory differ fails the kernel.
void async_proxy_fence();
const void* async_proxy_view();

// The racecheck (racecheck.h). instrumented_access is where the -fsanitize=thread hooks
// (tsan_entry_points.cpp) send every load and store of instrumented code: outside a kernel,
// or outside shared and device memory, it returns at once; a race fails the kernel. The
// atomics (device_functions.h) report to instrumented_atomic. A warp-wide instruction
// (ldmatrix) reads shared memory for each lane with shared_read_for_lane.
// code_address_here() is its caller's address, for messages.
void instrumented_access(const void* address, size_t bytes, bool write, const void* pc);
void instrumented_atomic(const void* address, size_t bytes, const void* pc);
void shared_read_for_lane(int lane, const void* address, size_t bytes, const void* pc);
[[gnu::noinline]] const void* code_address_here();

// griddepcontrol.wait and .launch_dependents (cuda/dependent_launch.h). In a dependent
// launch a thread that exits without having waited fails the kernel, as does one that lets
// later launches start before its own wait (the racecheck takes what the work ahead of the
// launch did as ordered before a thread only from its wait on). In a plain launch both
// return at once, as on a GPU.
void grid_dependency_wait();
void grid_dependents_may_launch();

// __trap(): the kernel fails with this message.
[[noreturn]] void trap(const char* why);

// Host-side bookkeeping the runtime shares with the scheduler.
// True while the calling OS thread runs a kernel's fibers.
bool in_kernel();
// Every device allocation (runtime.cpp), as (first byte, bytes), sorted by address.
std::vector<std::pair<const char*, size_t>> device_allocations();

}  // namespace ham::cuda::emulator
