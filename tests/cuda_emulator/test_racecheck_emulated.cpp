// The emulator's racecheck (cuda/emulator/racecheck.h): small kernels whose shared memory
// accesses race or are ordered, by hand. This file is compiled with the instrumentation the
// racecheck build gives the kernels (tests/CMakeLists.txt), so its accesses are checked.
#include <gtest/gtest.h>

#include <cstdint>

#include "cuda/async_copy.cuh"
#include "cuda/launch.h"
#include "cuda/mma.cuh"
#include "tests/error_testing.h"

namespace ham::cuda {
namespace {

using emulator::Schedule;

#if defined(__SANITIZE_THREAD__)
#define HAM_SKIP_WITHOUT_RACECHECK() (void)0
#else
#define HAM_SKIP_WITHOUT_RACECHECK() \
  GTEST_SKIP() << "this build does not instrument the racecheck's tests (another sanitizer, " \
                  "or not GCC)"
#endif

// Runs each test in the forward schedule, where the fibers' order, and so which of two
// racing accesses comes second, is known.
class Racecheck : public ::testing::Test {
 protected:
  void SetUp() override { emulator::set_schedule(Schedule::Forward); }
  void TearDown() override { emulator::set_schedule(saved_); }
  Schedule saved_ = emulator::schedule();
};

struct DeviceInts {
  int* data = nullptr;
  explicit DeviceInts(size_t count) {
    HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), count * sizeof(int)));
    HAM_CUDA_CHECK(cudaMemset(data, 0, count * sizeof(int)));
  }
  ~DeviceInts() { cudaFree(data); }
};

// Launches and waits; the error, if the kernel failed, comes out as ham::Error.
#define RUN(grid, block, shared_bytes, kernel, ...)                    \
  do {                                                                 \
    HAM_LAUNCH(grid, block, shared_bytes, nullptr, kernel)(__VA_ARGS__); \
    HAM_CUDA_CHECK_LAUNCH();                                           \
    HAM_CUDA_CHECK(cudaDeviceSynchronize());                           \
  } while (0)

// Each thread writes its slot, then reads the slot of the thread one warp on.
__global__ void read_the_next_warps_slot(int* out, int barrier) {
  HAM_STATIC_SHARED(int, slots, [64]);
  const unsigned t = threadIdx.x;
  slots[t] = int(t);
  if (barrier) __syncthreads();
  out[t] = slots[(t + 32) % 64];
}

TEST_F(Racecheck, AnotherWarpsWriteNeedsABarrier) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(64);
  // Without barriers the fibers run one after another: thread 0 reads slot 32 before
  // thread 32 writes it.
  testing::expect_error([&] { RUN(1, 64, 0, read_the_next_warps_slot, out.data, 0); },
                        {"kernel read_the_next_warps_slot", "block (0,0,0) thread (32,0,0)",
                         "shared memory race: thread (32,0,0) writes byte 128 of the static "
                         "shared variable slots",
                         "which thread (0,0,0) read", "with no barrier between them"});
  RUN(1, 64, 0, read_the_next_warps_slot, out.data, 1);
}

// Each lane writes its slot, then reads its neighbour's, across `sync`: 0 nothing, 1
// __syncwarp, 2 a shuffle.
__global__ void read_the_next_lanes_slot(int* out, int sync) {
  HAM_STATIC_SHARED(int, slots, [32]);
  const unsigned lane = threadIdx.x;
  slots[lane] = int(lane);
  if (sync == 1) __syncwarp();
  int shuffled = 0;
  if (sync == 2) shuffled = __shfl_xor_sync(0xffffffffu, int(lane), 1);
  out[lane] = slots[(lane + 1) % 32] + shuffled;
}

TEST_F(Racecheck, LanesOfAWarpAreOrderedBySyncwarpNotByShuffles) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(32);
  RUN(1, 32, 0, read_the_next_lanes_slot, out.data, 1);
  testing::expect_error([&] { RUN(1, 32, 0, read_the_next_lanes_slot, out.data, 0); },
                        {"shared memory race: thread (1,0,0) writes byte 4 of the static "
                         "shared variable slots",
                         "which thread (0,0,0) read"});
  // PTX gives a shuffle no memory ordering: the lanes met, and the race is still there.
  testing::expect_error([&] { RUN(1, 32, 0, read_the_next_lanes_slot, out.data, 2); },
                        {"shared memory race: thread", "reads byte", "which thread", "wrote"});
}

// Every thread writes the first 16-bit half-word, or (`distinct`) a half-word of its own,
// two to a 4-byte word; then thread 0 reads after a barrier.
__global__ void write_one_place(int* out, int distinct) {
  HAM_DYNAMIC_SHARED(uint16_t, halves);
  const unsigned t = threadIdx.x;
  halves[distinct ? t : 0] = uint16_t(t);
  __syncthreads();
  if (t == 0) out[0] = halves[0] + halves[blockDim.x - 1];
}

TEST_F(Racecheck, TwoWritesToOneByteRaceAndNeighbouringBytesDoNot) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(1);
  RUN(1, 64, 128, write_one_place, out.data, 1);
  testing::expect_error([&] { RUN(1, 64, 128, write_one_place, out.data, 0); },
                        {"shared memory race: thread (1,0,0) writes dynamic shared byte 0",
                         "which thread (0,0,0) wrote"});
}

// Four static shared variables, met one after another; the race is on the first.
__global__ void race_on_the_first_of_four(int* out) {
  HAM_STATIC_SHARED(int, first, [32]);
  HAM_STATIC_SHARED(int, second, [32]);
  HAM_STATIC_SHARED(int, third, [32]);
  HAM_STATIC_SHARED(int, fourth, [32]);
  const unsigned t = threadIdx.x;
  second[t] = third[t] = fourth[t] = 1;
  first[t] = int(t);
  out[t] = first[(t + 1) % 32] + second[t] + third[t] + fourth[t];
}

TEST_F(Racecheck, NamesTheStaticVariableThatRaces) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(32);
  for (int launch = 0; launch < 2; ++launch) {  // the variables new, then known
    testing::expect_error([&] { RUN(1, 32, 0, race_on_the_first_of_four, out.data); },
                          {"shared memory race: thread (1,0,0) writes byte 4 of the static "
                           "shared variable first",
                           "which thread (0,0,0) read"});
  }
}

// An 8-byte load from byte 4 of 8 bytes of dynamic shared memory. (The racecheck stops the
// thread in the instrumentation's call before the load, so it never reads past the buffer.)
__global__ void load_past_the_end(int* out) {
  HAM_DYNAMIC_SHARED(char, bytes);
  if (threadIdx.x == 0) __builtin_memset(bytes, 1, 8);
  __syncthreads();
  long long v = 0;
  __builtin_memcpy(&v, bytes + 4, sizeof v);
  out[threadIdx.x] = int(v);
}

TEST_F(Racecheck, AnAccessPastTheEndOfSharedMemoryFails) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(2);
  testing::expect_error([&] { RUN(1, 2, 8, load_past_the_end, out.data); },
                        {"kernel load_past_the_end", "thread (0,0,0)",
                         "a shared memory access of 8 bytes at byte 4 runs past the 8 bytes "
                         "of the dynamic shared memory"});
}

// Atomics on shared memory: not seen, as racecheck's own on a GPU ignores them.
__global__ void count_in_shared(int* out) {
  HAM_STATIC_SHARED(int, count, [1]);
  if (threadIdx.x == 0) count[0] = 0;
  __syncthreads();
  atomicAdd(&count[0], 1);
  __syncthreads();
  out[threadIdx.x] = count[0];
}

TEST_F(Racecheck, AtomicsDoNotRace) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(64);
  RUN(1, 64, 0, count_in_shared, out.data);
  int got = 0;
  HAM_CUDA_CHECK(cudaMemcpy(&got, out.data + 63, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, 64);
}

// Two blocks, each: thread 0 writes, a barrier, everyone reads. One block's reads do not
// race with the next block's write (its own copy of shared memory on a GPU).
__global__ void broadcast_per_block(int* out) {
  HAM_STATIC_SHARED(int, value, [1]);
  HAM_DYNAMIC_SHARED(int, scratch);
  if (threadIdx.x == 0) value[0] = scratch[0] = int(blockIdx.x);
  __syncthreads();
  out[blockIdx.x * blockDim.x + threadIdx.x] = value[0] + scratch[0];
}

TEST_F(Racecheck, BlocksDoNotRaceWithEachOther) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(3 * 64);
  RUN(3, 64, 16, broadcast_per_block, out.data);
  RUN(3, 64, 16, broadcast_per_block, out.data);  // nor with an earlier launch
}

// cp.async into shared memory: each thread copies 16 bytes into its own slot, then reads,
// by `step`:
//   0 its own slot before the wait (in flight);
//   1 its neighbour's slot after its own wait, without a barrier;
//   2 its neighbour's slot after the wait and a barrier (ordered);
//   3 after that barrier, copies again into its own slot, which the thread before it
//     reads since the barrier (a buffer refilled with no barrier after its readers).
__global__ void copy_then_read(const int* source, int* out, int step) {
  HAM_DYNAMIC_SHARED(int, tile);  // [threads][4]
  const unsigned t = threadIdx.x, n = blockDim.x, next = (t + 1) % n;
  async_copy_16(&tile[t * 4], &source[t * 4]);
  async_copy_commit();
  if (step == 0) out[t] = tile[t * 4];
  async_copy_wait<0>();
  if (step >= 2) __syncthreads();
  out[t] = tile[next * 4];
  if (step == 3) {
    async_copy_16(&tile[t * 4], &source[t * 4]);
    async_copy_commit();
    async_copy_wait<0>();
  }
}

TEST_F(Racecheck, CpAsyncWritesFromItsIssueToItsWait) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts source(64 * 4), out(64);
  RUN(1, 64, 64 * 16, copy_then_read, source.data, out.data, 2);
  testing::expect_error(
      [&] { RUN(1, 64, 64 * 16, copy_then_read, source.data, out.data, 0); },
      {"shared memory race: thread (0,0,0) reads dynamic shared byte 0",
       "which thread (0,0,0) is still copying into with cp.async at",
       "which no cp.async.wait_group has completed yet"});
  // Forward: thread 0 runs to its end first and reads slot 1 before thread 1 copies into
  // it. Reverse (copies land at issue there): thread 62 reads slot 63 after thread 63's
  // wait, with no barrier.
  testing::expect_error(
      [&] { RUN(1, 64, 64 * 16, copy_then_read, source.data, out.data, 1); },
      {"shared memory race: thread (1,0,0) writes dynamic shared byte 16",
       "which thread (0,0,0) read"});
  emulator::set_schedule(Schedule::Reverse);
  testing::expect_error(
      [&] { RUN(1, 64, 64 * 16, copy_then_read, source.data, out.data, 1); },
      {"shared memory race: thread (62,0,0) reads dynamic shared byte 1008",
       "which thread (63,0,0) wrote"});
  emulator::set_schedule(Schedule::Forward);
  testing::expect_error(
      [&] { RUN(1, 64, 64 * 16, copy_then_read, source.data, out.data, 3); },
      {"shared memory race: thread (1,0,0) writes dynamic shared byte 16",
       "which thread (0,0,0) read"});
}

// ldmatrix: lane l gives row `(l + shift) % 32` of 16 bytes, which lane
// `(l + shift) % 32` wrote, across a __syncwarp or not.
__global__ void ldmatrix_rows(int* out, int shift, int sync) {
  HAM_DYNAMIC_SHARED(uint16_t, rows);  // [32][8]
  const unsigned lane = threadIdx.x;
  for (int e = 0; e < 8; ++e) rows[lane * 8 + e] = uint16_t(lane * 8 + e);
  if (sync) __syncwarp();
  uint32_t r[4];
  mma::ldmatrix<4, false>(r, &rows[(lane + unsigned(shift)) % 32 * 8]);
  out[lane] = int(r[0] + r[1] + r[2] + r[3]);
}

TEST_F(Racecheck, LdmatrixReadsEachRowForTheLaneThatGaveIt) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(32);
  RUN(1, 32, 32 * 16, ldmatrix_rows, out.data, 0, 0);
  RUN(1, 32, 32 * 16, ldmatrix_rows, out.data, 1, 1);
  testing::expect_error([&] { RUN(1, 32, 32 * 16, ldmatrix_rows, out.data, 1, 0); },
                        {"ldmatrix", "shared memory race: thread (0,0,0) reads dynamic shared "
                                     "byte 16", "which thread (1,0,0) wrote"});
}

}  // namespace
}  // namespace ham::cuda
