// The SIMT emulator itself (cuda/emulator/): small kernels in CUDA syntax whose results are
// worked out by hand, and the mistakes a GPU would punish, which the emulator must report.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "cuda/async_copy.cuh"
#include "cuda/dependent_launch.h"
#include "cuda/launch.h"
#include "cuda/mma.cuh"
#include "cuda/wgmma.cuh"
#include "tests/error_testing.h"
#include "tests/testing.h"

namespace ham::cuda {
namespace {

using emulator::Schedule;

// Device buffers of ints, copied in and out.
struct DeviceInts {
  int* data = nullptr;
  size_t n = 0;
  explicit DeviceInts(size_t count) : n(count) {
    HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&data), n * sizeof(int)));
  }
  ~DeviceInts() { cudaFree(data); }
  std::vector<int> read() const {
    std::vector<int> out(n);
    HAM_CUDA_CHECK(cudaMemcpy(out.data(), data, n * sizeof(int), cudaMemcpyDeviceToHost));
    return out;
  }
};

// Restores the default schedule after a test that sets one.
struct ScheduleGuard {
  Schedule saved = emulator::schedule();
  ~ScheduleGuard() { emulator::set_schedule(saved); }
};

__global__ void write_coordinates(int* out) {
  const int thread = int(threadIdx.x + threadIdx.y * blockDim.x);
  const int block = int(blockIdx.x + blockIdx.y * gridDim.x);
  const int per_block = int(blockDim.x * blockDim.y);
  out[block * per_block + thread] = block * 1000 + thread;
}

TEST(SimtEmulator, EveryThreadOfEveryBlockRunsWithItsCoordinates) {
  DeviceInts out(2 * 3 * 4 * 5);
  HAM_LAUNCH(dim3(2, 3), dim3(4, 5), 0, nullptr, write_coordinates)(out.data);
  HAM_CUDA_CHECK_LAUNCH();
  std::vector<int> got = out.read();
  for (int block = 0; block < 6; ++block) {
    for (int thread = 0; thread < 20; ++thread) {
      EXPECT_EQ(got[size_t(block * 20 + thread)], block * 1000 + thread);
    }
  }
}

// Every block writes its linear index into one element: a race between blocks, whose
// winner is the block the emulator runs last.
__global__ void last_block_wins(int* out) {
  const unsigned block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  if (threadIdx.x == 0) out[0] = int(block);
}

TEST(SimtEmulator, TheReverseScheduleRunsTheBlocksLastFirst) {
  ScheduleGuard guard;
  for (Schedule s : {Schedule::Forward, Schedule::Reverse, Schedule::Shuffle}) {
    emulator::set_schedule(s);
    DeviceInts out(1);
    HAM_LAUNCH(dim3(3, 2, 2), 32, 0, nullptr, last_block_wins)(out.data);
    HAM_CUDA_CHECK_LAUNCH();
    EXPECT_EQ(out.read()[0], s == Schedule::Reverse ? 0 : 11) << "schedule " << int(s);
  }
}

// Thread i writes i + 1 to shared memory; after the barrier thread 0 sums all of it.
__global__ void sum_through_shared(int* out) {
  HAM_STATIC_SHARED(int, values, [256]);
  values[threadIdx.x] = int(threadIdx.x) + 1;
  __syncthreads();
  if (threadIdx.x == 0) {
    int sum = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) sum += values[i];
    out[blockIdx.x] = sum;
  }
}

TEST(SimtEmulator, ABarrierMakesEveryWriteBeforeItVisible) {
  ScheduleGuard guard;
  for (Schedule s : {Schedule::Forward, Schedule::Reverse, Schedule::Shuffle}) {
    emulator::set_schedule(s);
    DeviceInts out(3);
    HAM_LAUNCH(3, 256, 0, nullptr, sum_through_shared)(out.data);
    HAM_CUDA_CHECK_LAUNCH();
    EXPECT_EQ(out.read(), std::vector<int>(3, 256 * 257 / 2)) << "schedule " << int(s);
  }
}

// The same without the barrier: a race. Thread 0 sees every value only when it runs last.
__global__ void sum_without_barrier(int* out) {
  HAM_STATIC_SHARED(int, values, [64]);
  values[threadIdx.x] = 1;
  if (threadIdx.x == 0) {
    int sum = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) sum += values[i];
    out[0] = sum;
  }
}

TEST(SimtEmulator, SchedulesExposeAMissingBarrier) {
  ScheduleGuard guard;
  std::vector<int> sums;
  for (Schedule s : {Schedule::Forward, Schedule::Reverse}) {
    emulator::set_schedule(s);
    DeviceInts out(1);
    HAM_LAUNCH(1, 64, 0, nullptr, sum_without_barrier)(out.data);
    HAM_CUDA_CHECK_LAUNCH();
    sums.push_back(out.read()[0]);
  }
  // Forward: thread 0 runs first and sees only its own write, beside 63 unwritten -1s (each
  // block starts with its static shared variables 0xff); reverse: it runs last and sees
  // all 64.
  EXPECT_EQ(sums[0], 1 - 63);
  EXPECT_EQ(sums[1], 64);
}

__global__ void shuffles(int* out) {
  const int lane = int(threadIdx.x % 32);
  const int value = 100 + lane;
  int* row = out + 6 * threadIdx.x;
  row[0] = __shfl_xor_sync(0xffffffffu, value, 1);
  row[1] = __shfl_up_sync(0xffffffffu, value, 3);
  row[2] = __shfl_down_sync(0xffffffffu, value, 5);
  row[3] = __shfl_sync(0xffffffffu, value, 7);
  row[4] = __shfl_xor_sync(0xffffffffu, value, 8, 8);  // width 8: stays in its group of 8
  row[5] = __shfl_sync(0xffffffffu, value, 2, 16);     // lane 2 of its half-warp
}

TEST(SimtEmulator, ShufflesReadTheLanesCudaDefines) {
  DeviceInts out(64 * 6);
  HAM_LAUNCH(1, 64, 0, nullptr, shuffles)(out.data);
  HAM_CUDA_CHECK_LAUNCH();
  std::vector<int> got = out.read();
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    const int* row = &got[size_t(6 * t)];
    SCOPED_TRACE("thread " + std::to_string(t));
    EXPECT_EQ(row[0], 100 + (lane ^ 1));
    EXPECT_EQ(row[1], 100 + (lane >= 3 ? lane - 3 : lane));
    EXPECT_EQ(row[2], 100 + (lane + 5 < 32 ? lane + 5 : lane));
    EXPECT_EQ(row[3], 100 + 7);
    EXPECT_EQ(row[4], 100 + lane);  // lane ^ 8 leaves the group of 8: own value
    EXPECT_EQ(row[5], 100 + (lane & ~15) + 2);
  }
}

__global__ void votes(unsigned* out) {
  const int lane = int(threadIdx.x % 32);
  out[4 * threadIdx.x + 0] = __ballot_sync(0xffffffffu, lane % 3 == 0);
  out[4 * threadIdx.x + 1] = unsigned(__any_sync(0xffffffffu, lane == 31));
  out[4 * threadIdx.x + 2] = unsigned(__all_sync(0xffffffffu, lane < 31));
  out[4 * threadIdx.x + 3] = __match_any_sync(0xffffffffu, lane / 10);
  const int passed = __syncthreads_count(lane < 4);
  if (threadIdx.x == 0) out[4 * blockDim.x] = unsigned(passed);
  out[4 * blockDim.x + 1 + threadIdx.x] = unsigned(__syncthreads_or(threadIdx.x == 33)) * 10 +
                                          unsigned(__syncthreads_and(threadIdx.x < 1000));
}

TEST(SimtEmulator, VotesAndCountingBarriers) {
  unsigned* out = nullptr;
  const size_t n = 4 * 64 + 1 + 64;
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), n * sizeof(unsigned)));
  HAM_LAUNCH(1, 64, 0, nullptr, votes)(out);
  HAM_CUDA_CHECK_LAUNCH();
  std::vector<unsigned> got(n);
  HAM_CUDA_CHECK(cudaMemcpy(got.data(), out, n * sizeof(unsigned), cudaMemcpyDeviceToHost));
  cudaFree(out);
  unsigned every_third = 0;
  for (int l = 0; l < 32; l += 3) every_third |= 1u << l;
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    const unsigned group = lane < 10   ? 0x3ffu
                           : lane < 20 ? 0xffc00u
                           : lane < 30 ? 0x3ff00000u
                                       : 0xc0000000u;
    EXPECT_EQ(got[size_t(4 * t + 0)], every_third);
    EXPECT_EQ(got[size_t(4 * t + 1)], 1u);
    EXPECT_EQ(got[size_t(4 * t + 2)], 0u);
    EXPECT_EQ(got[size_t(4 * t + 3)], group) << "lane " << lane;
    EXPECT_EQ(got[size_t(4 * 64 + 1 + t)], 11u);
  }
  EXPECT_EQ(got[4 * 64], 8u);  // lanes 0..3 of both warps
}

__global__ void barrier_after_early_exit(int* out) {
  if (threadIdx.x >= 32) return;
  __syncthreads();
  out[threadIdx.x] = 2;
}

// As on Volta and later GPUs, threads that have exited no longer hold a barrier up.
TEST(SimtEmulator, ThreadsThatExitedDoNotHoldABarrierUp) {
  DeviceInts out(32);
  HAM_LAUNCH(1, 64, 0, nullptr, barrier_after_early_exit)(out.data);
  HAM_CUDA_CHECK_LAUNCH();
  EXPECT_EQ(out.read(), std::vector<int>(32, 2));
}

__global__ void barrier_in_a_loop_of_thread_dependent_length(int* out) {
  for (unsigned i = 0; i <= threadIdx.x; ++i) __syncthreads();
  // Thread 0 leaves after one barrier; thread 1 waits in its second for thread 0, which is
  // now waiting in a warp collective with the rest of its warp: nobody can go on.
  __syncwarp();
  out[threadIdx.x] = 1;
}

TEST(SimtEmulator, DeadlocksAreOneLineErrorsNamingTheKernel) {
  DeviceInts out(64);
  testing::expect_error(
      [&] {
        HAM_LAUNCH(1, 64, 0, nullptr, barrier_in_a_loop_of_thread_dependent_length)(out.data);
      },
      {"cuda emulator", "barrier_in_a_loop_of_thread_dependent_length", "test_simt_emulator.cpp",
       "deadlocks", "__syncthreads", "__syncwarp"});
}

__global__ void divergent_shuffles(int* out) {
  int v = int(threadIdx.x);
  if (threadIdx.x % 2 == 0) {
    v = __shfl_xor_sync(0xffffffffu, v, 1);
  } else {
    __syncwarp();
  }
  out[threadIdx.x] = v;
}

__global__ void shuffle_outside_the_mask(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(0x0000ffffu, int(threadIdx.x), 20);
}

__global__ void mask_without_the_caller(int* out) {
  out[threadIdx.x] = __shfl_xor_sync(0x1u, int(threadIdx.x), 0);
}

__global__ void trapping(int* out) {
  if (threadIdx.x == 5) __trap();
  out[threadIdx.x] = 0;
}

TEST(SimtEmulator, UndefinedWarpUseAndTrapsAreErrors) {
  DeviceInts out(32);
  testing::expect_error([&] { HAM_LAUNCH(1, 32, 0, nullptr, divergent_shuffles)(out.data); },
                        {"divergent_shuffles", "__shfl_xor_sync", "__syncwarp", "diverged"});
  testing::expect_error([&] { HAM_LAUNCH(1, 32, 0, nullptr, shuffle_outside_the_mask)(out.data); },
                        {"shuffle_outside_the_mask", "reads lane 20", "0x0000ffff"});
  testing::expect_error([&] { HAM_LAUNCH(1, 32, 0, nullptr, mask_without_the_caller)(out.data); },
                        {"mask_without_the_caller", "leaves out the calling lane"});
  testing::expect_error([&] { HAM_LAUNCH(2, 32, 0, nullptr, trapping)(out.data); },
                        {"trapping", "block (0,0,0) thread (5,0,0)", "__trap()"});
}

// A launcher that takes the kernel as a parameter (as routed attention's launch_tiled does):
// the launch's text is the parameter's name, `kernel`.
template <int kLanes>
__global__ void trapping_template(int* out) {
  if (threadIdx.x == kLanes - 1) __trap();
  out[threadIdx.x] = 0;
}
void launch_through_a_parameter(void (*kernel)(int*), int* out) {
  HAM_LAUNCH(1, 32, 0, nullptr, kernel)(out);
}

TEST(SimtEmulator, AKernelLaunchedThroughAParameterIsNamedByItsFunction) {
  DeviceInts out(32);
  testing::expect_error([&] { launch_through_a_parameter(&trapping_template<7>, out.data); },
                        {"kernel trapping_template<7> launched at", "thread (6,0,0)", "__trap()"});
  testing::expect_error([&] { launch_through_a_parameter(&trapping, out.data); },
                        {"kernel trapping launched at"});
  // A launch that names its kernel keeps its text.
  testing::expect_error([&] { HAM_LAUNCH(1, 32, 0, nullptr, trapping_template<7>)(out.data); },
                        {"kernel trapping_template<7> launched at"});
}

// Dependent launches (cuda/dependent_launch.h): every thread waits, as the contract asks,
// or thread 5 of block 1 skips its wait, or lets later launches start before it.
enum class GridWait { EveryThread, OneSkips, OneLetsLaterLaunchesFirst };
__global__ void wait_then_write(int* out, GridWait how) {
  const bool odd_one = blockIdx.x == 1 && threadIdx.x == 5;
  if (odd_one && how == GridWait::OneLetsLaterLaunchesFirst) let_later_kernels_launch();
  if (!(odd_one && how == GridWait::OneSkips)) {
    wait_for_earlier_kernels();
    let_later_kernels_launch();
  }
  out[blockIdx.x * 32 + threadIdx.x] = int(blockIdx.x * 32 + threadIdx.x);
}

TEST(SimtEmulator, EveryThreadOfADependentLaunchWaitsBeforeItExitsOrLetsOthersStart) {
  DeviceInts out(64);
  {
    const testing::ScopedSetting on(&set_dependent_launches, true);
    const int64_t before = dependent_launch_count();
    HAM_LAUNCH_DEPENDENT(2, 32, 0, nullptr, wait_then_write)(out.data, GridWait::EveryThread);
    HAM_CUDA_CHECK_LAUNCH();
    EXPECT_EQ(dependent_launch_count(), before + 1);
    const std::vector<int> got = out.read();
    for (int i = 0; i < 64; ++i) EXPECT_EQ(got[size_t(i)], i);
    testing::expect_error(
        [&] {
          HAM_LAUNCH_DEPENDENT(2, 32, 0, nullptr, wait_then_write)(out.data, GridWait::OneSkips);
        },
        {"wait_then_write", "block (1,0,0) thread (5,0,0)",
         "ended without griddepcontrol.wait in a dependent launch"});
    testing::expect_error(
        [&] {
          HAM_LAUNCH_DEPENDENT(2, 32, 0, nullptr, wait_then_write)(
              out.data, GridWait::OneLetsLaterLaunchesFirst);
        },
        {"wait_then_write", "block (1,0,0) thread (5,0,0)",
         "griddepcontrol.launch_dependents before griddepcontrol.wait"});
  }
  // Off (and in a plain launch), the same kernels run as plain launches, where neither
  // rule applies: the wait returns at once, as it does on a GPU.
  const testing::ScopedSetting off(&set_dependent_launches, false);
  const int64_t before = dependent_launch_count();
  HAM_LAUNCH_DEPENDENT(2, 32, 0, nullptr, wait_then_write)(out.data, GridWait::OneSkips);
  HAM_LAUNCH(2, 32, 0, nullptr, wait_then_write)(out.data, GridWait::OneLetsLaterLaunchesFirst);
  HAM_CUDA_CHECK_LAUNCH();
  EXPECT_EQ(dependent_launch_count(), before);
}

__global__ void read_dynamic_shared(float* out) {
  HAM_DYNAMIC_SHARED(float, scratch);
  if (threadIdx.x == 0) scratch[0] = 1.5f;
  __syncthreads();
  out[threadIdx.x] = scratch[threadIdx.x];
}

TEST(SimtEmulator, UnwrittenMemoryReadsAsNaN) {
  float* out = nullptr;
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), 4 * sizeof(float)));
  std::vector<float> fresh(4);
  HAM_CUDA_CHECK(cudaMemcpy(fresh.data(), out, sizeof(float) * 4, cudaMemcpyDeviceToHost));
  for (float x : fresh) EXPECT_TRUE(std::isnan(x));  // fresh device memory
  HAM_LAUNCH(1, 4, 4 * sizeof(float), nullptr, read_dynamic_shared)(out);
  HAM_CUDA_CHECK_LAUNCH();
  std::vector<float> got(4);
  HAM_CUDA_CHECK(cudaMemcpy(got.data(), out, sizeof(float) * 4, cudaMemcpyDeviceToHost));
  cudaFree(out);
  EXPECT_EQ(got[0], 1.5f);
  for (int i = 1; i < 4; ++i) EXPECT_TRUE(std::isnan(got[size_t(i)])) << i;  // never written
}

// Block b writes slot b of a static shared array, then each thread reads a slot: on a GPU
// the other slots are undefined, never what an earlier block wrote there.
__global__ void read_static_shared(float* out) {
  HAM_STATIC_SHARED(float, slots, [3]);
  if (threadIdx.x == 0) slots[blockIdx.x] = 1.5f + float(blockIdx.x);
  __syncthreads();
  out[blockIdx.x * 3 + threadIdx.x] = slots[threadIdx.x];
}

TEST(SimtEmulator, EveryBlockStartsWithItsStaticSharedVariablesUnwritten) {
  ScheduleGuard guard;
  for (Schedule s : {Schedule::Forward, Schedule::Reverse}) {
    emulator::set_schedule(s);
    float* out = nullptr;
    HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), 9 * sizeof(float)));
    HAM_LAUNCH(3, 3, 0, nullptr, read_static_shared)(out);
    HAM_CUDA_CHECK_LAUNCH();
    std::vector<float> got(9);
    HAM_CUDA_CHECK(cudaMemcpy(got.data(), out, sizeof(float) * 9, cudaMemcpyDeviceToHost));
    cudaFree(out);
    for (int block = 0; block < 3; ++block) {
      for (int slot = 0; slot < 3; ++slot) {
        const float x = got[size_t(block * 3 + slot)];
        if (slot == block) {
          EXPECT_EQ(x, 1.5f + float(block));
        } else {
          EXPECT_TRUE(std::isnan(x)) << "block " << block << " read " << x << " in slot " << slot
                                     << ", schedule " << int(s);
        }
      }
    }
  }
}

// 16 KiB of static shared memory beside the dynamic: a block has 48 KiB of the two together
// unless the kernel opts in to more (cudaFuncSetAttribute), and at most 227 KiB then.
__global__ void static_and_dynamic_shared(int* out) {
  HAM_STATIC_SHARED(int, table, [4096]);
  HAM_DYNAMIC_SHARED(int, scratch);
  table[threadIdx.x] = 2;
  scratch[threadIdx.x] = 3;
  __syncthreads();
  out[threadIdx.x] = table[threadIdx.x] * scratch[threadIdx.x];
}

TEST(SimtEmulator, ALaunchPastItsKernelsSharedMemoryLimitFailsLikeOnAGpu) {
  auto* kernel = static_and_dynamic_shared;
  DeviceInts out(32);
  cudaFuncAttributes attributes{};
  HAM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  EXPECT_EQ(attributes.sharedSizeBytes, 0u);  // not launched yet: nothing known
  HAM_LAUNCH(1, 32, 32 * 1024, nullptr, static_and_dynamic_shared)(out.data);
  HAM_CUDA_CHECK_LAUNCH();  // 32 + 16 KiB: fits the 48 without opting in
  HAM_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  EXPECT_EQ(attributes.sharedSizeBytes, 16u * 1024);
  EXPECT_EQ(attributes.maxDynamicSharedSizeBytes, 32 * 1024);
  // A kilobyte more needs the opt-in, known here from the first launch on.
  testing::expect_error(
      [&] { HAM_LAUNCH(1, 32, 33 * 1024, nullptr, static_and_dynamic_shared)(out.data); },
      {"static_and_dynamic_shared", "test_simt_emulator.cpp", "33792 bytes of dynamic",
       "limit of 32768", "16384 bytes of static", "cudaFuncSetAttribute"});
  HAM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      200 * 1024));
  HAM_LAUNCH(1, 32, 200 * 1024, nullptr, static_and_dynamic_shared)(out.data);
  HAM_CUDA_CHECK_LAUNCH();
  for (int x : out.read()) EXPECT_EQ(x, 6);
  testing::expect_error(
      [&] { HAM_LAUNCH(1, 32, 201 * 1024, nullptr, static_and_dynamic_shared)(out.data); },
      {"205824 bytes of dynamic", "limit of 204800", "its MaxDynamicSharedMemorySize"});
  // 212 + 16 KiB is past the 227 a block may have.
  EXPECT_EQ(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 212 * 1024),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  HAM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      211 * 1024));
}

// HAM_EMULATOR_SHARED_OPTIN_KIB stands the emulated GPUs for a part with less shared memory
// a block may opt into than the H200's 227 KiB (ctest runs this test at 99 KiB too).
TEST(SimtEmulator, TheOptInSharedMemoryFollowsTheEnvironment) {
  const char* kib = std::getenv("HAM_EMULATOR_SHARED_OPTIN_KIB");
  const int optin = (kib ? std::atoi(kib) : 227) * 1024;
  int reported = 0;
  HAM_CUDA_CHECK(cudaDeviceGetAttribute(&reported, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  EXPECT_EQ(reported, optin);
  cudaDeviceProp properties{};
  HAM_CUDA_CHECK(cudaGetDeviceProperties(&properties, 0));
  EXPECT_EQ(properties.sharedMemPerBlockOptin, size_t(optin));
  auto* kernel = static_and_dynamic_shared;  // 16 KiB of static shared memory
  DeviceInts out(32);
  HAM_LAUNCH(1, 32, 1024, nullptr, static_and_dynamic_shared)(out.data);  // its statics known
  HAM_CUDA_CHECK_LAUNCH();
  const int most = optin - 16 * 1024;
  EXPECT_EQ(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most + 1),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  HAM_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, most));
  HAM_LAUNCH(1, 32, most, nullptr, static_and_dynamic_shared)(out.data);
  HAM_CUDA_CHECK_LAUNCH();
  for (int x : out.read()) EXPECT_EQ(x, 6);
}

// The same kernel shape met for the first time at a launch: the static variables become
// known inside the block, and the launch fails there.
__global__ void static_shared_past_the_default(int* out) {
  HAM_STATIC_SHARED(int, table, [4096]);
  HAM_DYNAMIC_SHARED(int, scratch);
  table[threadIdx.x] = 1;
  scratch[threadIdx.x] = 1;
  out[threadIdx.x] = table[threadIdx.x] + scratch[threadIdx.x];
}

TEST(SimtEmulator, StaticSharedMemoryFirstMetInAKernelCountsAgainstItsLimit) {
  DeviceInts out(32);
  testing::expect_error(
      [&] { HAM_LAUNCH(1, 32, 40 * 1024, nullptr, static_shared_past_the_default)(out.data); },
      {"static_shared_past_the_default", "block (0,0,0) thread (0,0,0)", "40960 bytes of dynamic",
       "limit of 32768", "a GPU refuses the launch"});
}

__global__ void recorded_in_the_launch_log(int* out) {
  HAM_DYNAMIC_SHARED(int, scratch);
  const unsigned thread = threadIdx.y * blockDim.x + threadIdx.x;
  scratch[thread] = int(thread);
  out[thread] = scratch[thread];
}

// The fields of launch_log_text()'s line for the kernel at `address`; empty if none.
std::vector<std::string> launch_log_fields(const void* address) {
  char hex[32];
  std::snprintf(hex, sizeof(hex), "0x%jx", uintmax_t(reinterpret_cast<uintptr_t>(address)));
  std::istringstream lines(emulator::launch_log_text());
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> fields;
    std::istringstream split(line);
    for (std::string field; std::getline(split, field, '\t');) fields.push_back(field);
    if (fields.size() == 10 && fields[3] == hex) return fields;
  }
  return {};
}

// The name nm gives the function at `offset` in `binary`, or "".
std::string symbol_at(const std::string& binary, uint64_t offset) {
  const std::string command = "nm --defined-only '" + binary + "'";
  FILE* listing = popen(command.c_str(), "r");
  if (!listing) return "";
  std::string found;
  char line[4096];
  while (std::fgets(line, sizeof(line), listing)) {
    char type = 0;
    unsigned long long at = 0;
    char name[4000];
    if (std::sscanf(line, "%llx %c %3999s", &at, &type, name) == 3 && at == offset) found = name;
  }
  pclose(listing);
  return found;
}

// scripts/kernel_resources.py holds each kernel's largest launch against what nvcc gave it;
// the emulator's log says which kernel (by its offset in the binary), what launch, and on
// which kinds of stream (scripts/schedule_cover.py).
TEST(SimtEmulator, TheLaunchLogNamesEachKernelAndItsLargestLaunch) {
  DeviceInts out(96);
  HAM_LAUNCH(1, dim3(32, 3), 1000, nullptr, recorded_in_the_launch_log)(out.data);
  HAM_CUDA_CHECK_LAUNCH();
  cudaStream_t created = nullptr;
  ASSERT_EQ(cudaStreamCreate(&created), cudaSuccess);
  HAM_LAUNCH(2, 64, 2000, created, recorded_in_the_launch_log)(out.data);
  HAM_CUDA_CHECK_LAUNCH();
  ASSERT_EQ(cudaStreamSynchronize(created), cudaSuccess);
  ASSERT_EQ(cudaStreamDestroy(created), cudaSuccess);
  HAM_LAUNCH(1, 1025, 8000, nullptr, recorded_in_the_launch_log)(out.data);  // refused
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  const auto* kernel = reinterpret_cast<const void*>(&recorded_in_the_launch_log);
  const std::vector<std::string> fields = launch_log_fields(kernel);
  ASSERT_EQ(fields.size(), 10u) << emulator::launch_log_text();
  struct stat binary_status{};
  ASSERT_EQ(::stat(fields[0].c_str(), &binary_status), 0) << fields[0];
  EXPECT_EQ(fields[1], std::to_string(int64_t(binary_status.st_mtim.tv_sec) * 1000000000 +
                                      binary_status.st_mtim.tv_nsec));
  EXPECT_EQ(fields[4], "96");    // threads of the larger block
  EXPECT_EQ(fields[5], "2000");  // dynamic bytes of the larger request
  EXPECT_EQ(fields[6], "0");     // no static shared variables
  EXPECT_EQ(fields[7], "recorded_in_the_launch_log");
  EXPECT_NE(fields[8].find("test_simt_emulator.cpp:"), std::string::npos) << fields[8];
  EXPECT_EQ(fields[9], "default_stream,created_stream");  // not the refused launch's
  // The binary's symbol table names the kernel where the script looks: at the offset in a
  // position-independent binary (ELF type 3), at the address in another.
  FILE* binary = std::fopen(fields[0].c_str(), "rb");
  ASSERT_NE(binary, nullptr) << fields[0];
  unsigned char header[18] = {};
  EXPECT_EQ(std::fread(header, 1, sizeof(header), binary), sizeof(header));
  std::fclose(binary);
  const bool position_independent = header[16] == 3 && header[17] == 0;
  const uint64_t lookup = std::stoull(fields[position_independent ? 2 : 3], nullptr, 16);
  EXPECT_NE(symbol_at(fields[0], lookup).find("recorded_in_the_launch_log"), std::string::npos)
      << fields[0] << " at " << fields[2] << " / " << fields[3];
}

TEST(SimtEmulator, BadLaunchConfigurationsFailLikeOnAGpu) {
  DeviceInts out(1);
  HAM_LAUNCH(1, 1025, 0, nullptr, write_coordinates)(out.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  HAM_LAUNCH(dim3(1, 70000), 32, 0, nullptr, write_coordinates)(out.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  HAM_LAUNCH(1, 32, 300 * 1024, nullptr, write_coordinates)(out.data);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidConfiguration);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);  // read once, then cleared
  testing::expect_error([&] {
    HAM_LAUNCH(1, 1025, 0, nullptr, write_coordinates)(out.data);
    HAM_CUDA_CHECK_LAUNCH();
  }, {"test_simt_emulator.cpp", "cudaErrorInvalidConfiguration"});
}

// One 16 x 8 x 16 product through ldmatrix and mma.sync, B read both from [n][k] rows and,
// transposed, from [k][n] rows; D written out in the accumulator layout of cuda/mma.cuh.
__global__ void mma_tile(const uint16_t* a_in, const uint16_t* b_kn, float* d_out) {
  HAM_STATIC_SHARED(__align__(16) uint16_t, A, [16][16]);
  HAM_STATIC_SHARED(__align__(16) uint16_t, B_nk, [8][16]);
  HAM_STATIC_SHARED(__align__(16) uint16_t, B_kn, [16][8]);
  const int lane = int(threadIdx.x);
  for (int i = lane; i < 256; i += 32) A[i / 16][i % 16] = a_in[i];
  for (int i = lane; i < 128; i += 32) {
    B_kn[i / 8][i % 8] = b_kn[i];
    B_nk[i % 8][i / 8] = b_kn[i];
  }
  __syncwarp();
  uint32_t a[4], b[2], b_t[2];
  mma::ldmatrix<4, false>(a, &A[lane % 16][8 * (lane / 16)]);
  mma::ldmatrix<2, false>(b, &B_nk[lane % 8][8 * ((lane / 8) % 2)]);
  mma::ldmatrix<2, true>(b_t, &B_kn[lane % 16][0]);
  float d[4] = {0, 0, 0, 0}, e[4] = {0.5f, 0.5f, 0.5f, 0.5f};
  mma::mma_bf16_16816(d, a, b);
  mma::mma_bf16_16816(e, a, b_t);
  const int g = lane / 4, t = lane % 4;
  const int rows[4] = {g, g, g + 8, g + 8}, cols[4] = {2 * t, 2 * t + 1, 2 * t, 2 * t + 1};
  for (int r = 0; r < 4; ++r) {
    d_out[rows[r] * 8 + cols[r]] = d[r];
    d_out[128 + rows[r] * 8 + cols[r]] = e[r];
  }
}

TEST(SimtEmulator, MmaAndLdmatrixFollowThePtxFragmentLayouts) {
  std::vector<uint16_t> a(256), b(128);
  std::vector<double> want(128, 0.0);
  for (int i = 0; i < 256; ++i) a[size_t(i)] = float_to_bf16(float((i * 7) % 13 - 6)).bits;
  for (int i = 0; i < 128; ++i) b[size_t(i)] = float_to_bf16(float((i * 5) % 11 - 5) * 0.5f).bits;
  for (int m = 0; m < 16; ++m) {
    for (int n = 0; n < 8; ++n) {
      for (int k = 0; k < 16; ++k) {
        want[size_t(m * 8 + n)] += double(bf16_to_float({a[size_t(m * 16 + k)]})) *
                                   double(bf16_to_float({b[size_t(k * 8 + n)]}));
      }
    }
  }
  uint16_t *a_dev = nullptr, *b_dev = nullptr;
  float* d_dev = nullptr;
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&a_dev), 512));
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&b_dev), 256));
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&d_dev), 256 * sizeof(float)));
  HAM_CUDA_CHECK(cudaMemcpy(a_dev, a.data(), 512, cudaMemcpyHostToDevice));
  HAM_CUDA_CHECK(cudaMemcpy(b_dev, b.data(), 256, cudaMemcpyHostToDevice));
  HAM_LAUNCH(1, 32, 0, nullptr, mma_tile)(a_dev, b_dev, d_dev);
  HAM_CUDA_CHECK_LAUNCH();
  std::vector<float> got(256);
  HAM_CUDA_CHECK(cudaMemcpy(got.data(), d_dev, 256 * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(a_dev);
  cudaFree(b_dev);
  cudaFree(d_dev);
  for (int i = 0; i < 128; ++i) {
    EXPECT_EQ(got[size_t(i)], float(want[size_t(i)])) << "D[" << i / 8 << "][" << i % 8 << "]";
    EXPECT_EQ(got[size_t(128 + i)], float(want[size_t(i)] + 0.5)) << "transposed B, " << i;
  }
}

__global__ void ldmatrix_on_a_misaligned_row(float* out) {
  HAM_STATIC_SHARED(__align__(16) uint16_t, rows, [8][16]);
  uint32_t r[1];
  mma::ldmatrix<1, false>(r, &rows[threadIdx.x % 8][1]);
  out[threadIdx.x] = float(r[0]);
}

TEST(SimtEmulator, LdmatrixRowsMustBeSixteenByteAligned) {
  float* out = nullptr;
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)));
  testing::expect_error([&] { HAM_LAUNCH(1, 32, 0, nullptr, ldmatrix_on_a_misaligned_row)(out); },
                        {"ldmatrix_on_a_misaligned_row", "ldmatrix row 0 of matrix 0",
                         "not 16-byte aligned"});
  cudaFree(out);
}

// Thread i copies 16 bytes (4 ints) from src into dynamic shared memory in two groups of
// one copy each, and records what it reads back at each step: before any wait (the old
// contents: -1), after wait<1> (the first group only), after wait<0> (both). Then thread
// 0 reads every thread's copies after a barrier.
__global__ void async_copy_in_groups(const int* src, int* out) {
  HAM_DYNAMIC_SHARED(int, tile);  // [2][threads][4]
  const int i = int(threadIdx.x), n = int(blockDim.x);
  for (int e = 0; e < 4; ++e) tile[i * 4 + e] = tile[(n + i) * 4 + e] = -1;
  async_copy_16(&tile[i * 4], &src[i * 4]);
  async_copy_commit();
  async_copy_16(&tile[(n + i) * 4], &src[(n + i) * 4]);
  async_copy_commit();
  out[i * 5 + 0] = tile[i * 4] + tile[(n + i) * 4];  // -2: nothing landed yet
  async_copy_wait<1>();
  out[i * 5 + 1] = tile[i * 4];        // the first group
  out[i * 5 + 2] = tile[(n + i) * 4];  // -1: the second is still in flight
  async_copy_wait<0>();
  out[i * 5 + 3] = tile[(n + i) * 4];
  __syncthreads();
  if (i == 0) {
    int sum = 0;
    for (int j = 0; j < 2 * n * 4; ++j) sum += tile[j];
    out[i * 5 + 4] = sum;
  }
}

// async_copy_in_groups on `threads` threads in `schedule`, over src[j] = j + 1; its `out`.
std::vector<int> async_copies_in(Schedule schedule, int threads) {
  ScheduleGuard guard;
  emulator::set_schedule(schedule);
  DeviceInts src(2 * threads * 4), out(threads * 5);
  std::vector<int> values(src.n);
  for (size_t j = 0; j < values.size(); ++j) values[j] = int(j) + 1;
  HAM_CUDA_CHECK(cudaMemcpy(src.data, values.data(), src.n * sizeof(int), cudaMemcpyHostToDevice));
  HAM_LAUNCH(1, threads, 2 * threads * 16, nullptr, async_copy_in_groups)(src.data, out.data);
  HAM_CUDA_CHECK_LAUNCH();
  return out.read();
}

// (Forward and shuffle; the reverse schedule lands copies at once, below.)
TEST(SimtEmulator, AsyncCopiesLandAtTheWaitThatCoversTheirGroup) {
  constexpr int kThreads = 8;
  const std::vector<int> got = async_copies_in(Schedule::Forward, kThreads);
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(got[size_t(i * 5 + 0)], -2) << "thread " << i << " before any wait";
    EXPECT_EQ(got[size_t(i * 5 + 1)], i * 4 + 1) << "thread " << i << ", first group";
    EXPECT_EQ(got[size_t(i * 5 + 2)], -1) << "thread " << i << ", second group after wait<1>";
    EXPECT_EQ(got[size_t(i * 5 + 3)], (kThreads + i) * 4 + 1) << "thread " << i;
  }
  const int n = 2 * kThreads * 4;
  EXPECT_EQ(got[4], n * (n + 1) / 2);
}

// In the reverse schedule a copy lands as early as the hardware may land it, at issue.
TEST(SimtEmulator, AsyncCopiesLandAtIssueInTheReverseSchedule) {
  constexpr int kThreads = 8;
  const std::vector<int> got = async_copies_in(Schedule::Reverse, kThreads);
  for (int i = 0; i < kThreads; ++i) {
    EXPECT_EQ(got[size_t(i * 5 + 0)], i * 4 + 1 + (kThreads + i) * 4 + 1) << "thread " << i;
    EXPECT_EQ(got[size_t(i * 5 + 2)], (kThreads + i) * 4 + 1) << "thread " << i;
  }
}

// Even threads copy 16 bytes of src; odd threads land 16 zero bytes instead, "from" an
// address nothing may read (async_copy_16_or_zeros, ignore-src: reading it would fault).
// Each thread records its slot's first element before the wait, and its first and last
// after it.
__global__ void async_copies_or_zeros(const int* src, int* out) {
  HAM_DYNAMIC_SHARED(int, tile);  // [threads][4]
  const int i = int(threadIdx.x);
  for (int e = 0; e < 4; ++e) tile[i * 4 + e] = -1;
  const bool copy = i % 2 == 0;
  const void* from = copy ? static_cast<const void*>(&src[i * 4])
                          : reinterpret_cast<const void*>(uintptr_t{16});
  async_copy_16_or_zeros(&tile[i * 4], from, copy);
  async_copy_commit();
  out[i * 2 + 0] = tile[i * 4];
  async_copy_wait<0>();
  out[i * 2 + 1] = tile[i * 4] + tile[i * 4 + 3];
}

// async_copies_or_zeros on `threads` threads in `schedule`, over src[j] = j + 1; its `out`.
std::vector<int> async_copies_or_zeros_in(Schedule schedule, int threads) {
  ScheduleGuard guard;
  emulator::set_schedule(schedule);
  DeviceInts src(size_t(threads) * 4), out(size_t(threads) * 2);
  std::vector<int> values(src.n);
  for (size_t j = 0; j < values.size(); ++j) values[j] = int(j) + 1;
  HAM_CUDA_CHECK(cudaMemcpy(src.data, values.data(), src.n * sizeof(int), cudaMemcpyHostToDevice));
  HAM_LAUNCH(1, threads, threads * 16, nullptr, async_copies_or_zeros)(src.data, out.data);
  HAM_CUDA_CHECK_LAUNCH();
  return out.read();
}

TEST(SimtEmulator, AsyncZerosLandLikeCopiesAndReadNothing) {
  constexpr int kThreads = 8;
  for (Schedule schedule : {Schedule::Forward, Schedule::Reverse}) {
    const std::vector<int> got = async_copies_or_zeros_in(schedule, kThreads);
    for (int i = 0; i < kThreads; ++i) {
      const int landed = i % 2 == 0 ? (i * 4 + 1) + (i * 4 + 4) : 0;
      const int first_landed = i % 2 == 0 ? i * 4 + 1 : 0;
      // forward: in flight until the wait; reverse: landed at issue
      EXPECT_EQ(got[size_t(i * 2)], schedule == Schedule::Forward ? -1 : first_landed)
          << "thread " << i << " before the wait, schedule " << int(schedule);
      EXPECT_EQ(got[size_t(i * 2 + 1)], landed) << "thread " << i << " after the wait";
    }
  }
}

// Lane 0 of each warp records when its warp has passed a first and a second shuffle. In
// the reverse schedule the last warp runs through both shuffles to the barrier before the
// other warp passes its first; in the forward schedule the warps pass each shuffle in turn.
__global__ void warp_progress(int* out) {
  HAM_STATIC_SHARED(int, order);
  if (threadIdx.x == 0) order = 0;
  __syncthreads();
  const int warp = int(threadIdx.x / 32), lane = int(threadIdx.x % 32);
  const int first = __shfl_xor_sync(0xffffffffu, lane, 1);
  if (lane == 0 && first == 1) out[warp * 2] = order++;
  const int second = __shfl_xor_sync(0xffffffffu, lane, 2);
  if (lane == 0 && second == 2) out[warp * 2 + 1] = order++;
  __syncthreads();
}

TEST(SimtEmulator, InTheReverseScheduleAWarpRunsAheadToTheBarrier) {
  ScheduleGuard guard;
  for (Schedule s : {Schedule::Forward, Schedule::Reverse}) {
    emulator::set_schedule(s);
    DeviceInts out(4);
    HAM_LAUNCH(1, 64, 0, nullptr, warp_progress)(out.data);
    HAM_CUDA_CHECK_LAUNCH();
    const std::vector<int> got = out.read();
    if (s == Schedule::Reverse) {
      EXPECT_EQ(got, (std::vector<int>{2, 3, 0, 1}));  // warp 1 both steps first
    } else {
      EXPECT_EQ(got, (std::vector<int>{0, 2, 1, 3}));
    }
  }
}

__global__ void async_copy_to(int* src, int where) {
  HAM_STATIC_SHARED(__align__(16) int, static_tile, [8]);
  HAM_DYNAMIC_SHARED(int, tile);
  if (where == 0) async_copy_16(static_tile, src);  // not dynamic shared memory
  if (where == 1) async_copy_16(tile + 1, src);     // misaligned
  if (where >= 2 && threadIdx.x == 0) async_copy_16(tile, src);  // fine, but...
  if (where != 3) async_copy_commit();              // 3: ...never committed, or
  if (where != 2) async_copy_wait<0>();             // 2: ...never waited for
}

TEST(SimtEmulator, AsyncCopiesGoToAlignedDynamicSharedMemory) {
  DeviceInts src(8);
  testing::expect_error([&] { HAM_LAUNCH(1, 32, 64, nullptr, async_copy_to)(src.data, 0); },
                        {"async_copy_to", "cp.async", "outside the block's dynamic shared memory"});
  testing::expect_error([&] { HAM_LAUNCH(1, 32, 64, nullptr, async_copy_to)(src.data, 1); },
                        {"async_copy_to", "cp.async", "not 16-byte aligned"});
}

// A copy that no wait covers (never waited for, or never committed, which a wait does not
// cover) has not landed when its thread ends: an error, in the schedules that defer copies.
TEST(SimtEmulator, AKernelEndsOnlyAfterItsCopiesAreWaitedFor) {
  ScheduleGuard guard;
  DeviceInts src(8);
  for (Schedule schedule : {Schedule::Forward, Schedule::Shuffle}) {
    emulator::set_schedule(schedule);
    for (int where : {2, 3}) {
      testing::expect_error(
          [&] { HAM_LAUNCH(1, 32, 64, nullptr, async_copy_to)(src.data, where); },
          {"async_copy_to", "ended with 1 cp.async copies that no cp.async.wait_group covered"});
    }
    HAM_LAUNCH(1, 32, 64, nullptr, async_copy_to)(src.data, 4);  // committed and waited for
    HAM_CUDA_CHECK_LAUNCH();
  }
}

// When wgmma_then_write (below) writes into the operands of its wgmmas.
enum class OperandWrite {
  AfterTheWait,                 // legal: every warp's wait completed the wgmma
  IntoBBeforeTheWait,
  IntoABeforeTheWait,           // by another warp than the one reading it
  IntoAAfterTheFirstWaitOfTwo,  // A's columns 16:32 belong to the second group, in flight
  IntoBAfterTheFirstWaitOfTwo,  // legal: only the first group, complete, reads B's column 3
  NeverWaited,
  NoFenceAfterTheFill,  // the tiles' stores never handed to the tensor cores' proxy
};

constexpr uint16_t kBf16One = 0x3f80, kBf16Two = 0x4000;

// One warpgroup; A (64 x 64) and B (32 x 64) are swizzled tiles of ones. The first group:
// D (64 x 32, each warp's 16 rows) = A[:, 0:16] B[:, 0:16]^T, 16 everywhere; with two
// groups the second adds A[:, 16:32] B[:, 16:32]^T. `write` sets one element to 2 and says
// when: after every warp has issued (a write before some warp issues would be a race the
// schedules show, not one inside a wgmma's flight), and a barrier publishes it to every
// warp before their wait. out gets D.
__global__ void wgmma_then_write(float* out, OperandWrite write) {
  HAM_DYNAMIC_SHARED(unsigned char, raw);
  uint16_t* A = reinterpret_cast<uint16_t*>(wgmma::swizzle_aligned(raw));
  uint16_t* B = A + 64 * 64;
  for (int i = int(threadIdx.x); i < 64 * 64; i += 128) A[i] = kBf16One;
  for (int i = int(threadIdx.x); i < 32 * 64; i += 128) B[i] = kBf16One;
  if (write != OperandWrite::NoFenceAfterTheFill) wgmma::fence_proxy_async();
  __syncthreads();
  const uint32_t a = wgmma::shared_address(A), b = wgmma::shared_address(B);
  float d[4][4];
  wgmma::fence();
  wgmma::mma_ss<32, false>(d, wgmma::k_major<64>(a, 0), wgmma::k_major<32>(b, 0));
  wgmma::commit();
  if (write == OperandWrite::IntoAAfterTheFirstWaitOfTwo ||
      write == OperandWrite::IntoBAfterTheFirstWaitOfTwo) {
    wgmma::mma_ss<32, true>(d, wgmma::k_major<64>(a, 16), wgmma::k_major<32>(b, 16));
    wgmma::commit();
    wgmma::wait<1>();
  }
  __syncthreads();  // every warp has issued its wgmmas (and completed the first of two)
  if (threadIdx.x == 3) {
    if (write == OperandWrite::IntoBBeforeTheWait) B[wgmma::swizzled_index<32>(7, 9)] = kBf16Two;
    if (write == OperandWrite::IntoAAfterTheFirstWaitOfTwo) {
      A[wgmma::swizzled_index<64>(2, 17)] = kBf16Two;
    }
    if (write == OperandWrite::IntoBAfterTheFirstWaitOfTwo) {
      B[wgmma::swizzled_index<32>(5, 3)] = kBf16Two;
    }
  }
  if (threadIdx.x == 70 && write == OperandWrite::IntoABeforeTheWait) {
    A[wgmma::swizzled_index<64>(20, 4)] = kBf16Two;  // warp 1's rows, written by warp 2
  }
  __syncthreads();
  if (write != OperandWrite::NeverWaited) wgmma::wait<0>();
  __syncthreads();
  if (write == OperandWrite::AfterTheWait && threadIdx.x == 64) B[0] = kBf16Two;
  const int warp = int(threadIdx.x / 32), g = int(threadIdx.x % 32) / 4, t = int(threadIdx.x % 4);
  for (int j = 0; j < 4; ++j) {
    for (int e = 0; e < 4; ++e) {
      out[(16 * warp + g + 8 * (e / 2)) * 32 + 8 * j + 2 * t + e % 2] = d[j][e];
    }
  }
}

// A wgmma may read its shared operands until the wait that covers it (cuda/wgmma.cuh): a
// write before that wait is an error naming the element; after it, or into an operand only
// a completed group read, the product is the one issued; no wait at all is an error too,
// and so is a wgmma reading stores that no fence_proxy_async handed to its proxy. In every
// schedule.
TEST(SimtEmulator, AWgmmasSharedOperandsMustNotChangeBeforeItsWait) {
  ScheduleGuard guard;
  float* out = nullptr;
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), 64 * 32 * sizeof(float)));
  const size_t shared = wgmma::kSwizzleAtomBytes + (64 + 32) * 64 * 2;
  auto run = [&](OperandWrite write) {
    HAM_LAUNCH(1, 128, shared, nullptr, wgmma_then_write)(out, write);
    HAM_CUDA_CHECK_LAUNCH();
  };
  for (Schedule schedule : {Schedule::Forward, Schedule::Reverse, Schedule::Shuffle}) {
    emulator::set_schedule(schedule);
    for (auto [write, sum] : {std::pair{OperandWrite::AfterTheWait, 16.f},
                              std::pair{OperandWrite::IntoBAfterTheFirstWaitOfTwo, 32.f}}) {
      run(write);
      std::vector<float> d(64 * 32);
      HAM_CUDA_CHECK(cudaMemcpy(d.data(), out, d.size() * sizeof(float), cudaMemcpyDeviceToHost));
      for (float x : d) ASSERT_EQ(x, sum) << "write " << int(write);
    }
    testing::expect_error([&] { run(OperandWrite::IntoBBeforeTheWait); },
                          {"wgmma_then_write", "operand B's element (k 9, column 7) of its 16 x 32",
                           "changed before the wgmma.wait_group that covers it"});
    testing::expect_error([&] { run(OperandWrite::IntoABeforeTheWait); },
                          {"wgmma_then_write", "thread (32,0,0)", "warp 1 of its warpgroup",
                           "operand A's element (row 20, k 4) of its 64 x 16",
                           "changed before the wgmma.wait_group"});
    testing::expect_error([&] { run(OperandWrite::IntoAAfterTheFirstWaitOfTwo); },
                          {"wgmma_then_write", "thread (0,0,0)", "warp 0 of its warpgroup",
                           "operand A's element (row 2, k 1)", "changed before"});
    testing::expect_error([&] { run(OperandWrite::NeverWaited); },
                          {"wgmma_then_write",
                           "ended with 1 wgmma.mma_async that no wgmma.wait_group covered"});
    testing::expect_error([&] { run(OperandWrite::NoFenceAfterTheFill); },
                          {"wgmma_then_write", "operand A's element (row ", ", k 0) of its 64",
                           "holds a write that no fence.proxy.async and barrier after it"});
  }
  cudaFree(out);
}

// One warpgroup's wgmma whose B (32 rows of a swizzled tile) ends past the block's dynamic
// shared memory: its last 1024-byte atom starts in the last 1024 bytes, and row 31 reads
// that atom's last bytes.
__global__ void wgmma_reading_past_shared(float* out, uint32_t shared_bytes) {
  HAM_DYNAMIC_SHARED(unsigned char, raw);
  uint16_t* A = reinterpret_cast<uint16_t*>(wgmma::swizzle_aligned(raw));
  // (Shared addresses count from the block's shared memory, as the swizzle's atoms do.)
  const uint32_t last_atom = shared_bytes / wgmma::kSwizzleAtomBytes * wgmma::kSwizzleAtomBytes;
  auto* B = reinterpret_cast<uint16_t*>(raw + last_atom - 3 * wgmma::kSwizzleAtomBytes);
  for (int i = int(threadIdx.x); i < 64 * 64; i += 128) A[i] = kBf16One;
  wgmma::fence_proxy_async();
  __syncthreads();
  float d[4][4];
  wgmma::fence();
  wgmma::mma_ss<32, false>(d, wgmma::k_major<64>(wgmma::shared_address(A), 0),
                           wgmma::k_major<32>(wgmma::shared_address(B), 0));
  wgmma::commit();
  wgmma::wait<0>();
  out[threadIdx.x] = d[0][0];
}

TEST(SimtEmulator, AWgmmaOperandPastTheBlocksSharedMemoryIsNamed) {
  float* out = nullptr;
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), 128 * sizeof(float)));
  constexpr uint32_t kShared = 40 * 1024;  // under the 48 KiB no launch must opt into
  testing::expect_error(
      [&] {
        HAM_LAUNCH(1, 128, kShared, nullptr, wgmma_reading_past_shared)(out, kShared);
        HAM_CUDA_CHECK_LAUNCH();
      },
      {"wgmma_reading_past_shared", "thread (", "wgmma: operand reads shared address ",
       "past the block's 40960 bytes"});
  cudaFree(out);
}

// Exempt from UBSan's null check (scripts/sanitize.sh), which would stop the read before
// the fault this kernel is for.
__global__ void __attribute__((no_sanitize("undefined"))) read_through(const float* p,
                                                                         float* out) {
  out[threadIdx.x] = p[threadIdx.x];
}

// A fault in a kernel ends the process, as an illegal memory access ends a CUDA context, but
// names the kernel, block and thread first.
TEST(SimtEmulatorDeathTest, AFaultNamesTheKernelBlockAndThread) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  float* out = nullptr;
  HAM_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&out), 32 * sizeof(float)));
  EXPECT_DEATH(
      {
        HAM_LAUNCH(2, 32, 0, nullptr, read_through)(static_cast<const float*>(nullptr), out);
      },
      "kernel read_through launched at .*test_simt_emulator.cpp:[0-9]+, block \\(0,0,0\\) "
      "thread \\(0,0,0\\): illegal memory access at address");
  cudaFree(out);
}

}  // namespace
}  // namespace ham::cuda
