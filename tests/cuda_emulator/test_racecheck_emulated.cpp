// The emulator's racecheck (cuda/emulator/racecheck.h): small kernels whose shared and
// device memory accesses race or are ordered, by hand. This file is compiled with the
// instrumentation the racecheck build gives the kernels (tests/CMakeLists.txt), so its
// accesses are checked.
#include <cublasLt.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

#include "cuda/async_copy.cuh"
#include "cuda/dependent_launch.h"
#include "cuda/launch.h"
#include "cuda/mma.cuh"
#include "cuda/wgmma.cuh"
#include "tests/cuda_emulator/owned_stream.h"
#include "tests/error_testing.h"
#include "tests/testing.h"

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
// racing accesses comes second, is known, with each stream's work run when issued (where
// the race shows), and with device memory checked whatever HAM_EMULATOR_RACECHECK_MEMORY
// says for the GPU tests.
constexpr const char* kMemorySetting = "HAM_EMULATOR_RACECHECK_MEMORY";
class Racecheck : public ::testing::Test {
 protected:
  void SetUp() override {
    emulator::set_schedule(Schedule::Forward);
    emulator::set_stream_order(emulator::StreamOrder::InOrder);
    unsetenv(kMemorySetting);
  }
  void TearDown() override {
    emulator::set_schedule(saved_schedule_);
    emulator::set_stream_order(saved_stream_order_);
    if (saved_memory_setting_) {
      setenv(kMemorySetting, saved_memory_setting_->c_str(), 1);
    } else {
      unsetenv(kMemorySetting);
    }
  }
  Schedule saved_schedule_ = emulator::schedule();
  emulator::StreamOrder saved_stream_order_ = emulator::stream_order();
  std::optional<std::string> saved_memory_setting_ =
      std::getenv(kMemorySetting) ? std::optional<std::string>(std::getenv(kMemorySetting))
                                  : std::nullopt;
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

// Lanes 0 and 1 of warp 0 and thread 32 read one value; then lane 1 overwrites it after a
// __syncwarp, which orders it after lane 0's read and not after thread 32's. In the forward
// schedule thread 32 reads while warp 0 waits in the __syncwarp.
__global__ void overwrite_after_three_reads(int* out) {
  HAM_STATIC_SHARED(int, value, [1]);
  const unsigned t = threadIdx.x;
  if (t == 0) value[0] = 1;
  __syncthreads();
  if (t == 0 || t == 1 || t == 32) out[t] = value[0];
  __syncwarp();
  if (t == 1) value[0] = 2;
}

TEST_F(Racecheck, AReaderOfAnotherWarpIsKeptBesideTwoOfOneWarp) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(64);
  testing::expect_error([&] { RUN(1, 64, 0, overwrite_after_three_reads, out.data); },
                        {"shared memory race: thread (1,0,0) writes byte 0 of the static "
                         "shared variable value",
                         "which thread (32,0,0) read"});
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

// Atomics on shared memory, then, by `read`:
//   0 every thread reads the count at once, while other threads may still add to it;
//   1 every thread reads it after a barrier;
//   2 the last thread reads it at once, after every other thread's atomic in the forward
//     schedule, but with no barrier to order them.
__global__ void count_in_shared(int* out, int read) {
  HAM_STATIC_SHARED(int, count, [1]);
  if (threadIdx.x == 0) count[0] = 0;
  __syncthreads();
  atomicAdd(&count[0], 1);
  if (read == 1) __syncthreads();
  if (read != 2 || threadIdx.x == blockDim.x - 1) out[threadIdx.x] = count[0];
}

TEST_F(Racecheck, AtomicsDoNotRaceWithEachOtherButWithPlainAccesses) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(64);
  RUN(1, 64, 0, count_in_shared, out.data, 1);
  int got = 0;
  HAM_CUDA_CHECK(cudaMemcpy(&got, out.data + 63, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, 64);
  testing::expect_error([&] { RUN(1, 64, 0, count_in_shared, out.data, 0); },
                        {"shared memory race: thread (1,0,0) atomically updates byte 0 of the "
                         "static shared variable count",
                         "which thread (0,0,0) read", "with no barrier between them"});
  testing::expect_error([&] { RUN(1, 64, 0, count_in_shared, out.data, 2); },
                        {"shared memory race: thread (63,0,0) reads byte 0 of the static "
                         "shared variable count",
                         "which several threads updated atomically"});
}

// Device memory. Thread 0 of each block writes one element: its own, or (`same`) the
// first.
__global__ void write_an_element(int* out, int same) {
  if (threadIdx.x == 0) out[same ? 0 : blockIdx.x] = int(blockIdx.x);
}

TEST_F(Racecheck, TwoBlocksWritingOneElementRace) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(2);
  RUN(2, 32, 0, write_an_element, out.data, 0);
  testing::expect_error([&] { RUN(2, 32, 0, write_an_element, out.data, 1); },
                        {"kernel write_an_element", "block (1,0,0) thread (0,0,0)",
                         "device memory race: thread (0,0,0) of block (1,0,0) writes byte 0 "
                         "of a 8-byte device allocation",
                         "which thread (0,0,0) of block (0,0,0) wrote",
                         "and nothing orders two blocks of one launch"});
}

// HAM_EMULATOR_RACECHECK_MEMORY=shared leaves device memory out; `all` is the default.
TEST_F(Racecheck, DeviceMemoryIsLeftOutWhereAsked) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts out(2);
  setenv(kMemorySetting, "shared", 1);
  RUN(2, 32, 0, write_an_element, out.data, 1);
  setenv(kMemorySetting, "device", 1);
  testing::expect_error([&] { RUN(2, 32, 0, write_an_element, out.data, 1); },
                        {"HAM_EMULATOR_RACECHECK_MEMORY=device: expected all or shared"});
  for (const char* value : {"all", ""}) {
    setenv(kMemorySetting, value, 1);
    testing::expect_error([&] { RUN(2, 32, 0, write_an_element, out.data, 1); },
                          {"device memory race"});
  }
}

// Thread 0 of each block writes its element, then (`read_previous`) adds the previous
// block's to it. The blocks of one launch are not ordered; launches are.
__global__ void add_the_previous_blocks_element(int* data, int read_previous) {
  if (threadIdx.x != 0) return;
  data[blockIdx.x] = 1;
  if (read_previous && blockIdx.x > 0) data[blockIdx.x] += data[blockIdx.x - 1];
}

TEST_F(Racecheck, ABlockMayNotReadWhatAnotherBlockOfTheLaunchWrote) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(4);
  RUN(4, 32, 0, add_the_previous_blocks_element, data.data, 0);
  testing::expect_error([&] { RUN(4, 32, 0, add_the_previous_blocks_element, data.data, 1); },
                        {"device memory race: thread (0,0,0) of block (1,0,0) reads byte 0 of "
                         "a 16-byte device allocation",
                         "which thread (0,0,0) of block (0,0,0) wrote"});
  // Last block first: block 3 reads element 2 before block 2 writes it.
  emulator::set_schedule(Schedule::Reverse);
  testing::expect_error([&] { RUN(4, 32, 0, add_the_previous_blocks_element, data.data, 1); },
                        {"device memory race: thread (0,0,0) of block (2,0,0) writes byte 8 of "
                         "a 16-byte device allocation",
                         "which thread (0,0,0) of block (3,0,0) read"});
}

// Thread 0 of each of two blocks reads the element of the other block.
__global__ void read_the_other_blocks_element(const int* data, int* out) {
  if (threadIdx.x == 0) out[blockIdx.x] = data[1 - blockIdx.x];
}

TEST_F(Racecheck, ALaunchIsOrderedAfterTheEarlierOnes) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(2), out(2);
  RUN(2, 32, 0, write_an_element, data.data, 0);
  RUN(2, 32, 0, read_the_other_blocks_element, data.data, out.data);
  int got[2] = {};
  HAM_CUDA_CHECK(cudaMemcpy(got, out.data, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got[0], 1);
  EXPECT_EQ(got[1], 0);
}

// Thread 0 of each block reads the first element; block 1's then writes it.
__global__ void read_then_block_one_writes(int* data, int* out) {
  if (threadIdx.x != 0) return;
  const int value = data[0];
  if (blockIdx.x == 1) data[0] = value + 1;
  out[blockIdx.x] = value;
}

TEST_F(Racecheck, AWriteRacesWithAnotherBlocksEarlierRead) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(1), out(2);
  testing::expect_error([&] { RUN(2, 32, 0, read_then_block_one_writes, data.data, out.data); },
                        {"device memory race: thread (0,0,0) of block (1,0,0) writes byte 0 of "
                         "a 4-byte device allocation",
                         "which thread (0,0,0) of block (0,0,0) read",
                         "and nothing orders two blocks of one launch"});
}

// Dependent launches (cuda/dependent_launch.h). Each thread writes its element of `data`,
// then lets later launches start.
__global__ void write_then_let_later_launch(int* data) {
  data[threadIdx.x] = int(threadIdx.x) + 1;
  let_later_kernels_launch();
}

// Each thread copies its element of `data` to `out`, reading it before or after its wait,
// or writes `data` before its wait.
enum class BeforeTheWait { Nothing, Read, Write };
__global__ void copy_around_the_wait(int* data, int* out, BeforeTheWait before) {
  const unsigned t = threadIdx.x;
  int value = 0;
  if (before == BeforeTheWait::Read) value = data[t];
  if (before == BeforeTheWait::Write) data[t] = 0;
  wait_for_earlier_kernels();
  if (before != BeforeTheWait::Read) value = data[t];
  out[t] = value;
}

__global__ void read_the_elements(const int* data, int* out) {
  out[threadIdx.x] = data[threadIdx.x];
}

// Launches `first` then copy_around_the_wait as a dependent launch on one stream, and
// waits; `between`, if any, runs on the stream between them.
void dependent_after(const std::function<void(cudaStream_t)>& first, int* data, int* out,
                     BeforeTheWait before,
                     const std::function<void(cudaStream_t)>& between = nullptr) {
  OwnedStream stream(cudaStreamDefault);  // after the buffers' memsets on the legacy stream
  const testing::ScopedSetting dependent(&set_dependent_launches, true);
  first(stream.handle);
  if (between) between(stream.handle);
  HAM_LAUNCH_DEPENDENT(1, 32, 0, stream.handle, copy_around_the_wait)(data, out, before);
  HAM_CUDA_CHECK_LAUNCH();
  HAM_CUDA_CHECK(cudaStreamSynchronize(stream.handle));
}

TEST_F(Racecheck, ADependentLaunchIsOrderedAfterTheKernelAheadOnlyFromItsWait) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(32), out(32);
  auto writer = [&](cudaStream_t s) {
    HAM_LAUNCH(1, 32, 0, s, write_then_let_later_launch)(data.data);
  };
  dependent_after(writer, data.data, out.data, BeforeTheWait::Nothing);
  int got[32] = {};
  HAM_CUDA_CHECK(cudaMemcpy(got, out.data, sizeof got, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(got[i], i + 1);
  testing::expect_error(
      [&] { dependent_after(writer, data.data, out.data, BeforeTheWait::Read); },
      {"device memory race: thread (0,0,0) of block (0,0,0) reads byte 0 of a 128-byte "
       "device allocation",
       "which kernel write_then_let_later_launch (work ", "wrote",
       "before this thread's griddepcontrol.wait: this launch (work ",
       "is a dependent one, which may start before the work ahead of it ends"});
}

TEST_F(Racecheck, ADependentLaunchMayNotWriteBeforeItsWaitWhatTheKernelAheadReads) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(32), out(32), copy(32);
  auto reader = [&](cudaStream_t s) {
    HAM_LAUNCH(1, 32, 0, s, read_the_elements)(data.data, copy.data);
  };
  testing::expect_error(
      [&] { dependent_after(reader, data.data, out.data, BeforeTheWait::Write); },
      {"device memory race: thread (0,0,0) of block (0,0,0) writes byte 0",
       "which kernel read_the_elements (work ", "read", "griddepcontrol.wait"});
}

// What the kernel two ahead did is ordered before the whole launch: the kernel ahead
// started after it ended.
TEST_F(Racecheck, ADependentLaunchIsOrderedAfterTheWorkTwoAheadFromItsStart) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(32), out(32), other(32);
  auto writer = [&](cudaStream_t s) {
    HAM_LAUNCH(1, 32, 0, s, write_then_let_later_launch)(data.data);
  };
  auto another = [&](cudaStream_t s) {
    HAM_LAUNCH(1, 32, 0, s, write_then_let_later_launch)(other.data);
  };
  dependent_after(writer, data.data, out.data, BeforeTheWait::Read, another);
  int got[32] = {};
  HAM_CUDA_CHECK(cudaMemcpy(got, out.data, sizeof got, cudaMemcpyDeviceToHost));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(got[i], i + 1);
}

// Each thread writes its element of `data`, then reads the element of the thread one warp
// on, across a barrier or not: within a block, device memory is ordered as shared memory.
__global__ void read_the_next_warps_element(int* data, int* out, int barrier) {
  const unsigned t = threadIdx.x;
  data[t] = int(t);
  if (barrier) __syncthreads();
  out[t] = data[(t + 32) % 64];
}

TEST_F(Racecheck, WithinABlockABarrierOrdersDeviceMemory) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(64), out(64);
  RUN(1, 64, 0, read_the_next_warps_element, data.data, out.data, 1);
  testing::expect_error(
      [&] { RUN(1, 64, 0, read_the_next_warps_element, data.data, out.data, 0); },
      {"device memory race: thread (32,0,0) of block (0,0,0) writes byte 128 of a 256-byte "
       "device allocation",
       "which thread (0,0,0) of block (0,0,0) read", "with no barrier between them"});
}

// Thread 0 of each block adds one to a count in device memory, and (`read_back`) the
// last block's reads it, while other blocks may still add to it.
__global__ void count_blocks(int* count, int* out, int read_back) {
  if (threadIdx.x != 0) return;
  atomicAdd(count, 1);
  if (read_back && blockIdx.x == gridDim.x - 1) out[0] = *count;
}

TEST_F(Racecheck, AtomicsOfManyBlocksDoNotRaceButAReadOfTheirCountDoes) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts count(1), out(1);
  RUN(3, 32, 0, count_blocks, count.data, out.data, 0);
  int got = 0;
  HAM_CUDA_CHECK(cudaMemcpy(&got, count.data, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, 3);
  testing::expect_error([&] { RUN(3, 32, 0, count_blocks, count.data, out.data, 1); },
                        {"device memory race: thread (0,0,0) of block (2,0,0) reads byte 0 of "
                         "a 4-byte device allocation",
                         "which threads of several blocks updated atomically",
                         "and nothing orders two blocks of one launch"});
  // Last block first: its read comes before the other blocks' atomics.
  emulator::set_schedule(Schedule::Reverse);
  testing::expect_error([&] { RUN(3, 32, 0, count_blocks, count.data, out.data, 1); },
                        {"device memory race: thread (0,0,0) of block (1,0,0) atomically "
                         "updates byte 0",
                         "which thread (0,0,0) of block (2,0,0) read"});
}

// Block 0's threads write 16 bytes of `source`; block 1's thread 0 copies them into shared
// memory with cp.async, which reads them at its issue, unordered with block 0.
__global__ void copy_what_block_zero_wrote(int* source, int* out) {
  HAM_DYNAMIC_SHARED(int, tile);
  if (blockIdx.x == 0) {
    source[threadIdx.x] = int(threadIdx.x);
    return;
  }
  if (threadIdx.x != 0) return;
  async_copy_16(tile, source);
  async_copy_commit();
  async_copy_wait<0>();
  out[0] = tile[0];
}

TEST_F(Racecheck, CpAsyncReadsItsSourceAtIssue) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts source(4), out(1);
  testing::expect_error([&] { RUN(2, 4, 16, copy_what_block_zero_wrote, source.data, out.data); },
                        {"device memory race: thread (0,0,0) of block (1,0,0) reads byte 0 of "
                         "a 16-byte device allocation",
                         "which thread (0,0,0) of block (0,0,0) wrote"});
}

// As copy_what_block_zero_wrote, but block 1 lands zeros in place of the copy
// (async_copy_16_or_zeros, ignore-src): it reads nothing, so nothing races with block 0,
// and its zeros are in flight until the wait like a copy's bytes (read_early: read before).
__global__ void zeros_beside_what_block_zero_wrote(int* source, int* out, int read_early) {
  HAM_DYNAMIC_SHARED(int, tile);
  if (blockIdx.x == 0) {
    source[threadIdx.x] = int(threadIdx.x);
    return;
  }
  if (threadIdx.x != 0) return;
  tile[0] = -1;
  async_copy_16_or_zeros(tile, source, false);
  async_copy_commit();
  if (read_early) out[1] = tile[0];
  async_copy_wait<0>();
  out[0] = tile[0];
}

TEST_F(Racecheck, CpAsyncOfZerosReadsNoSourceAndWritesUntilItsWait) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts source(4), out(2);
  RUN(2, 4, 16, zeros_beside_what_block_zero_wrote, source.data, out.data, 0);
  int landed = -2;
  HAM_CUDA_CHECK(cudaMemcpy(&landed, out.data, sizeof landed, cudaMemcpyDeviceToHost));
  EXPECT_EQ(landed, 0);
  testing::expect_error(
      [&] { RUN(2, 4, 16, zeros_beside_what_block_zero_wrote, source.data, out.data, 1); },
      {"shared memory race: thread (0,0,0) reads dynamic shared byte 0",
       "which no cp.async.wait_group has completed yet"});
}

// The four warps of a warpgroup each multiply their rows of A by the shared B with one
// wgmma; after its wait thread 0 copies 16 bytes into B by cp.async, with a barrier first
// where `barrier`. The copy lands at thread 0's wait, after every warp's: no operand
// changes under a wgmma, but on a GPU a warp that has not yet issued its part may read the
// new bytes (the persistent dQ kernel's next Q without its barrier).
__global__ void copy_into_a_wgmma_operand(const uint16_t* source, float* out, int barrier) {
  constexpr int kRows = 64, kColumns = 64;  // A and B: 64 x 64 bf16, 128-byte rows
  HAM_DYNAMIC_SHARED(unsigned char, raw);
  uint16_t* A = reinterpret_cast<uint16_t*>(wgmma::swizzle_aligned(raw));
  uint16_t* B = A + kRows * kColumns;
  for (int i = int(threadIdx.x); i < 2 * kRows * kColumns; i += 128) A[i] = 0x3f80;  // 1.0
  wgmma::fence_proxy_async();
  __syncthreads();
  float acc[8][4];
  wgmma::fence();
  wgmma::mma_ss<64, false>(acc, wgmma::k_major<kRows>(wgmma::shared_address(A), 0),
                           wgmma::k_major<kRows>(wgmma::shared_address(B), 0));
  wgmma::commit();
  wgmma::wait<0>();
  if (barrier) __syncthreads();
  if (threadIdx.x == 0) async_copy_16(B, source);
  async_copy_commit();
  __syncthreads();
  async_copy_wait<0>();
  out[threadIdx.x] = acc[0][0];
}

TEST_F(Racecheck, ACopyIntoAWgmmaOperandNeedsABarrierAfterTheWait) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts source(4), out(128);
  const size_t shared = wgmma::kSwizzleAtomBytes + 2 * 64 * 64 * 2;
  const auto* bits = reinterpret_cast<const uint16_t*>(source.data);
  auto* sums = reinterpret_cast<float*>(out.data);
  // The forward schedule runs warps 1-3 to their wgmma while warp 0 waits in its own.
  testing::expect_error(
      [&] { RUN(1, 128, shared, copy_into_a_wgmma_operand, bits, sums, 0); },
      {"kernel copy_into_a_wgmma_operand", "block (0,0,0) thread (0,0,0)",
       "shared memory race: thread (0,0,0) writes dynamic shared byte",
       "which thread (32,0,0) read at", "with no barrier between them"});
  RUN(1, 128, shared, copy_into_a_wgmma_operand, bits, sums, 1);
  float sum = 0;
  HAM_CUDA_CHECK(cudaMemcpy(&sum, sums, sizeof sum, cudaMemcpyDeviceToHost));
  EXPECT_EQ(sum, 16.f);  // 16 products of ones
}

// An 8-byte load from byte 4 of an 8-byte allocation.
__global__ void load_past_the_end_of_an_allocation(const char* bytes, int* out) {
  long long v = 0;
  __builtin_memcpy(&v, bytes + 4, sizeof v);
  out[threadIdx.x] = int(v);
}

TEST_F(Racecheck, AnAccessPastTheEndOfAnAllocationFails) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts bytes(2), out(1);
  testing::expect_error(
      [&] {
        RUN(1, 1, 0, load_past_the_end_of_an_allocation,
            reinterpret_cast<const char*>(bytes.data), out.data);
      },
      {"a device memory access of 8 bytes at byte 4 runs past the 8 bytes of its allocation"});
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

// Streams. A launch is ordered after an earlier one only as a GPU orders their streams'
// work: each test's streams start with the host synchronized, so that what the fixture's
// cudaMemset wrote on the legacy stream is behind every stream.

// Launches on `stream` without waiting.
#define LAUNCH_ON(stream, kernel, ...)                  \
  do {                                                  \
    HAM_LAUNCH(1, 32, 0, stream, kernel)(__VA_ARGS__);  \
    HAM_CUDA_CHECK_LAUNCH();                            \
  } while (0)

// Thread 0 stores `value` in data[0], or copies data[0] to out[0].
__global__ void store_value(int* data, int value) {
  if (threadIdx.x == 0) data[0] = value;
}
__global__ void load_value(const int* data, int* out) {
  if (threadIdx.x == 0) out[0] = data[0];
}

TEST_F(Racecheck, WorkOnTwoStreamsIsOrderedOnlyByAnEventOrTheHost) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(1), out(1);
  OwnedStream a, b;
  OwnedEvent stored;
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(a.handle, store_value, data.data, 1);
  testing::expect_error([&] { LAUNCH_ON(b.handle, load_value, data.data, out.data); },
                        {"device memory race: thread (0,0,0) of block (0,0,0) reads byte 0 of "
                         "a 4-byte device allocation",
                         "which kernel store_value (work 1 on stream ", "wrote at ",
                         "and nothing orders that work before this one (work 1 on stream ",
                         "no wait for an event recorded after it"});

  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(a.handle, store_value, data.data, 2);
  HAM_CUDA_CHECK(cudaEventRecord(stored.handle, a.handle));
  HAM_CUDA_CHECK(cudaStreamWaitEvent(b.handle, stored.handle, 0));
  LAUNCH_ON(b.handle, load_value, data.data, out.data);
  // The store after it on a is not ordered after that load.
  testing::expect_error([&] { LAUNCH_ON(a.handle, store_value, data.data, 3); },
                        {"device memory race: thread (0,0,0) of block (0,0,0) writes byte 0",
                         "which kernel load_value (work 2 on stream ", "read at "});

  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(a.handle, store_value, data.data, 3);
  HAM_CUDA_CHECK(cudaStreamSynchronize(a.handle));
  LAUNCH_ON(b.handle, load_value, data.data, out.data);

  // An event recorded before the store orders nothing after it.
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  HAM_CUDA_CHECK(cudaEventRecord(stored.handle, a.handle));
  LAUNCH_ON(a.handle, store_value, data.data, 4);
  HAM_CUDA_CHECK(cudaStreamWaitEvent(b.handle, stored.handle, 0));
  testing::expect_error([&] { LAUNCH_ON(b.handle, load_value, data.data, out.data); },
                        {"device memory race", "which kernel store_value (work "});
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  int got = 0;
  HAM_CUDA_CHECK(cudaMemcpy(&got, out.data, sizeof got, cudaMemcpyDeviceToHost));
  EXPECT_EQ(got, 3);  // the failed launch wrote nothing
}

TEST_F(Racecheck, ReadsOnTwoStreamsDoNotRaceButALaterWriteDoes) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(1), out_a(1), out_b(1);
  OwnedStream a, b;
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(a.handle, load_value, data.data, out_a.data);
  LAUNCH_ON(b.handle, load_value, data.data, out_b.data);
  testing::expect_error([&] { LAUNCH_ON(b.handle, store_value, data.data, 1); },
                        {"device memory race: thread (0,0,0) of block (0,0,0) writes byte 0",
                         "which kernel load_value (work 1 on stream "});
}

TEST_F(Racecheck, TheLegacyStreamAndBlockingStreamsWaitForEachOther) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(1), out(1), other(1);
  OwnedStream blocking(cudaStreamDefault), non_blocking;
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(blocking.handle, store_value, data.data, 1);
  LAUNCH_ON(nullptr, load_value, data.data, out.data);
  LAUNCH_ON(blocking.handle, store_value, data.data, 2);
  LAUNCH_ON(non_blocking.handle, store_value, other.data, 3);  // another allocation
  testing::expect_error([&] { LAUNCH_ON(non_blocking.handle, load_value, data.data, out.data); },
                        {"device memory race", "which kernel store_value (work 2 on stream "});
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(non_blocking.handle, store_value, data.data, 4);
  testing::expect_error([&] { LAUNCH_ON(nullptr, load_value, data.data, out.data); },
                        {"device memory race", "which kernel store_value (work ",
                         "(work ", " on the default stream of device 0)"});
}

// A destroyed stream's work still runs on the GPU, so what orders work after a stream's
// work orders it after a destroyed one's too: the legacy stream after a blocking stream, a
// synchronization with the device. A non-blocking stream with nothing between still races
// with it. (Without this, a test's stale history could race with the next test's memory.)
TEST_F(Racecheck, ADestroyedStreamsWorkStaysOrderedAsALiveOnes) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(1), out(1);
  OwnedStream non_blocking;
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  {
    OwnedStream blocking(cudaStreamDefault);
    LAUNCH_ON(blocking.handle, store_value, data.data, 1);
  }
  LAUNCH_ON(nullptr, load_value, data.data, out.data);  // the legacy stream waits for it
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  {
    OwnedStream other;
    LAUNCH_ON(other.handle, store_value, data.data, 2);
  }
  testing::expect_error([&] { LAUNCH_ON(non_blocking.handle, load_value, data.data, out.data); },
                        {"device memory race", "which kernel store_value (work 1 on stream "});
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(non_blocking.handle, load_value, data.data, out.data);
}

// Stream a writes in a fork-join with a third stream that waits for both a and b; b, which
// does not wait for a, still races with a's write after that.
TEST_F(Racecheck, AJoinOnAThirdStreamOrdersNothingOnTheOthers) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(1), out(1), joined(1);
  OwnedStream a, b, c;
  OwnedEvent a_done, b_done;
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(a.handle, store_value, data.data, 1);
  LAUNCH_ON(b.handle, store_value, out.data, 2);
  HAM_CUDA_CHECK(cudaEventRecord(a_done.handle, a.handle));
  HAM_CUDA_CHECK(cudaEventRecord(b_done.handle, b.handle));
  HAM_CUDA_CHECK(cudaStreamWaitEvent(c.handle, a_done.handle, 0));
  HAM_CUDA_CHECK(cudaStreamWaitEvent(c.handle, b_done.handle, 0));
  LAUNCH_ON(c.handle, load_value, data.data, joined.data);
  testing::expect_error([&] { LAUNCH_ON(b.handle, load_value, data.data, out.data); },
                        {"device memory race", "which kernel store_value (work 1 on stream "});
}

TEST_F(Racecheck, CopiesAndMemsetsAreStreamWork) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(4), copy(4), out(1);
  OwnedStream a, b;
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  HAM_CUDA_CHECK(cudaMemcpyAsync(copy.data, data.data, 4 * sizeof(int), cudaMemcpyDeviceToDevice,
                                 a.handle));
  testing::expect_error([&] { LAUNCH_ON(b.handle, load_value, copy.data, out.data); },
                        {"device memory race: thread (0,0,0) of block (0,0,0) reads byte 0",
                         "which cudaMemcpyAsync (work 1 on stream ", "wrote at cudaMemcpyAsync"});
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(a.handle, load_value, data.data + 3, out.data);
  testing::expect_error(
      [&] { HAM_CUDA_CHECK(cudaMemsetAsync(data.data + 2, 0, 2 * sizeof(int), b.handle)); },
      {"cudaMemsetAsync: device memory race: cudaMemsetAsync writes byte 12 of a 16-byte "
       "device allocation at cudaMemsetAsync",
       "which kernel load_value (work 2 on stream "});
  // Bytes the memset leaves alone do not race.
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  LAUNCH_ON(a.handle, load_value, data.data + 3, out.data);
  HAM_CUDA_CHECK(cudaMemsetAsync(data.data, 0, 3 * sizeof(int), b.handle));
}

TEST_F(Racecheck, ACopyToTheHostOrdersTheHostACopyFromItDoesNot) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts data(1), out(1);
  OwnedStream a, b;
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  int host = 7;
  LAUNCH_ON(a.handle, store_value, data.data, 1);
  HAM_CUDA_CHECK(cudaMemcpyAsync(&host, data.data, sizeof host, cudaMemcpyDeviceToHost, a.handle));
  EXPECT_EQ(host, 1);
  LAUNCH_ON(b.handle, store_value, data.data, 2);
  HAM_CUDA_CHECK(cudaMemcpyAsync(data.data, &host, sizeof host, cudaMemcpyHostToDevice, b.handle));
  testing::expect_error([&] { LAUNCH_ON(a.handle, load_value, data.data, out.data); },
                        {"device memory race", "which cudaMemcpyAsync (work 2 on stream "});
}

// D = A B with D a 4 x 2 view (leading dimension 8) of an 8 x 2 matrix: the GEMM writes
// rows 0-3 of each column, not rows 4-7.
TEST_F(Racecheck, AGemmIsStreamWorkThatWritesOnlyItsOutputsColumns) {
  HAM_SKIP_WITHOUT_RACECHECK();
  DeviceInts a_matrix(4 * 3), b_matrix(3 * 2), d_matrix(8 * 2), out(1);
  OwnedStream a, b;
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  cublasLtHandle_t handle = nullptr;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a_layout = nullptr, b_layout = nullptr, d_layout = nullptr;
  ASSERT_EQ(cublasLtCreate(&handle), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&a_layout, CUDA_R_32F, 4, 3, 4), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&b_layout, CUDA_R_32F, 3, 2, 3), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasLtMatrixLayoutCreate(&d_layout, CUDA_R_32F, 4, 2, 8), CUBLAS_STATUS_SUCCESS);
  const float one = 1, zero = 0;
  cublasLtMatmulAlgo_t algo{};
  ASSERT_EQ(cublasLtMatmul(handle, desc, &one, a_matrix.data, a_layout, b_matrix.data, b_layout,
                           &zero, d_matrix.data, d_layout, d_matrix.data, d_layout, &algo,
                           nullptr, 0, a.handle),
            CUBLAS_STATUS_SUCCESS);
  LAUNCH_ON(b.handle, store_value, d_matrix.data + 4, 1);      // row 4 of column 0
  LAUNCH_ON(b.handle, store_value, d_matrix.data + 8 + 7, 1);  // row 7 of column 1
  LAUNCH_ON(b.handle, load_value, a_matrix.data + 11, out.data);  // reads, as the GEMM does
  testing::expect_error([&] { LAUNCH_ON(b.handle, store_value, d_matrix.data + 8 + 3, 1); },
                        {"device memory race: thread (0,0,0) of block (0,0,0) writes byte 44 of "
                         "a 64-byte device allocation",
                         "which cublasLtMatmul (work 1 on stream ", "wrote at cublasLtMatmul"});
  testing::expect_error([&] { LAUNCH_ON(b.handle, store_value, b_matrix.data + 5, 1); },
                        {"which cublasLtMatmul (work 1 on stream ", "read at cublasLtMatmul"});
  HAM_CUDA_CHECK(cudaDeviceSynchronize());
  cublasLtMatrixLayoutDestroy(a_layout);
  cublasLtMatrixLayoutDestroy(b_layout);
  cublasLtMatrixLayoutDestroy(d_layout);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(handle);
}

}  // namespace
}  // namespace ham::cuda
