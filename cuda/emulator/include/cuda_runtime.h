#pragma once
// The CUDA runtime as the SIMT emulator provides it: what cuda/*.cu use of the runtime API
// (memory, streams, events, errors, attributes; cuda/emulator/runtime.cpp) and of the
// device language (qualifiers, built-in variables, barriers, warp intrinsics, atomics;
// cuda/emulator/simt.h runs them). Only the ham_cuda_emulated build sees this header;
// the real build uses the toolkit's.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#include "cuda/emulator/simt.h"

// ---- Qualifiers -------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
// Static shared variables are declared with HAM_STATIC_SHARED (cuda/launch.h): a static, as
// blocks run one after another on one OS thread, that each block starts undefined. A bare
// __shared__ would keep the previous block's value, hiding a read of what was never written.
#pragma GCC poison __shared__
#define __constant__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

#define threadIdx (::ham::cuda::emulator::place().thread_idx)
#define blockIdx (::ham::cuda::emulator::place().block_idx)
#define blockDim (::ham::cuda::emulator::place().block_dim)
#define gridDim (::ham::cuda::emulator::place().grid_dim)
constexpr int warpSize = 32;

// ---- Runtime types ----------------------------------------------------------------------
enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInitializationError = 3,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidResourceHandle = 400,
  cudaErrorNotReady = 600,
  cudaErrorLaunchFailure = 719,
};
using cudaError = cudaError_t;

struct CUstream_st;
struct CUevent_st;
using cudaStream_t = CUstream_st*;
using cudaEvent_t = CUevent_st*;
#define cudaStreamLegacy (reinterpret_cast<cudaStream_t>(0x1))
#define cudaStreamPerThread (reinterpret_cast<cudaStream_t>(0x2))

constexpr unsigned cudaStreamDefault = 0x0;
constexpr unsigned cudaStreamNonBlocking = 0x1;
constexpr unsigned cudaEventDefault = 0x0;
constexpr unsigned cudaEventBlockingSync = 0x1;
constexpr unsigned cudaEventDisableTiming = 0x2;

enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
  cudaMemcpyDefault = 4,
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrMaxSharedMemoryPerBlock = 8,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
  cudaDevAttrComputeCapabilityMajor = 75,
  cudaDevAttrComputeCapabilityMinor = 76,
  cudaDevAttrMaxSharedMemoryPerBlockOptin = 97,
};

enum cudaFuncAttribute {
  cudaFuncAttributeMaxDynamicSharedMemorySize = 8,
  cudaFuncAttributePreferredSharedMemoryCarveout = 9,
};

struct cudaFuncAttributes {
  size_t sharedSizeBytes;
  size_t constSizeBytes;
  size_t localSizeBytes;
  int maxThreadsPerBlock;
  int numRegs;
  int ptxVersion;
  int binaryVersion;
  int cacheModeCA;
  int maxDynamicSharedSizeBytes;
  int preferredShmemCarveout;
};

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  size_t sharedMemPerBlock;
  int warpSize;
  int maxThreadsPerBlock;
  int multiProcessorCount;
  int major;
  int minor;
  size_t sharedMemPerBlockOptin;
};

// ---- Runtime API (cuda/emulator/runtime.cpp) --------------------------------------------
cudaError_t cudaGetDeviceCount(int* count);
cudaError_t cudaGetDevice(int* device);
cudaError_t cudaSetDevice(int device);
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device);
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t cudaDeviceSynchronize();
cudaError_t cudaMemGetInfo(size_t* free, size_t* total);

cudaError_t cudaMalloc(void** ptr, size_t bytes);
cudaError_t cudaFree(void* ptr);
cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind);
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream = nullptr);
cudaError_t cudaMemcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream = nullptr);
cudaError_t cudaMemset(void* dst, int value, size_t bytes);
cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream = nullptr);

cudaError_t cudaStreamCreate(cudaStream_t* stream);
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
// Stream priorities: lower numbers are higher priorities, from *least (0, every stream's
// default) to *greatest (-5), as on the H100 and H200; a priority outside that range is
// clamped to it, as CUDA does. The emulator records a priority and schedules nothing by it.
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned flags, int priority);
cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority);
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest);
cudaError_t cudaStreamDestroy(cudaStream_t stream);
cudaError_t cudaStreamSynchronize(cudaStream_t stream);
cudaError_t cudaStreamQuery(cudaStream_t stream);
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned flags = 0);

cudaError_t cudaEventCreate(cudaEvent_t* event);
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags);
cudaError_t cudaEventDestroy(cudaEvent_t event);
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream = nullptr);
cudaError_t cudaEventQuery(cudaEvent_t event);
cudaError_t cudaEventSynchronize(cudaEvent_t event);
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end);

cudaError_t cudaGetLastError();
cudaError_t cudaPeekAtLastError();
const char* cudaGetErrorName(cudaError_t error);
const char* cudaGetErrorString(cudaError_t error);

namespace ham::cuda::emulator {
cudaError_t set_function_attribute(const void* function, cudaFuncAttribute attribute, int value);
cudaError_t get_function_attributes(cudaFuncAttributes* attributes, const void* function);
cudaError_t max_active_blocks(int* blocks, const void* function, int block_threads,
                              size_t dynamic_shared_bytes);
// One line per kernel launched so far, for scripts/kernel_resources.py, which finds the
// kernel in its binary and holds its largest launch against what nvcc gave it (registers,
// __launch_bounds__, static shared memory) and the H200's limits. Tab-separated: the
// binary (dladdr's at the first launch), its modification time then (ns since the epoch),
// the kernel's offset in it and its address (hex), the most threads a block and dynamic
// shared bytes a launch asked for, the static shared bytes its blocks reached, the kernel
// as its first launch site names it, that site (file:line), and how it was launched
// (comma-separated: default_stream, created_stream, each alone or with +dependent).
// HAM_EMULATOR_LAUNCH_LOG=FILE appends it to FILE at exit.
std::string launch_log_text();

// Checks a launch configuration as the GPU would: on failure records the error for
// cudaGetLastError and returns false. A launch whose shared memory the GPU would refuse
// given what is known of the kernel (its MaxDynamicSharedMemorySize and the static shared
// memory its blocks have reached) throws, saying why.
bool accept_launch(const LaunchSite& site, dim3 grid, dim3 block, size_t dynamic_shared_bytes,
                   cudaStream_t stream);

// When work issued to a stream runs (HAM_EMULATOR_STREAMS, in_order when unset):
// - InOrder (in_order): when issued, whatever the stream.
// - Late (late): work on a created stream is held in that stream's queue and runs as late
//   as a GPU could run it: when a host call waits for it (cudaStreamSynchronize,
//   cudaEventSynchronize, cudaDeviceSynchronize, cudaFree, a copy to or from host memory
//   on that stream, the stream's destruction), when a stream whose work runs when issued
//   waits for one of its events, or when a stream that waits for one gets there. The
//   default stream runs its work when issued, after the held work of the blocking streams
//   (created without cudaStreamNonBlocking). So a reader on one stream that does not wait
//   for a writer on another sees what was there before, as it may on a GPU.
// - DefaultLate (default_late): the mirror image. The default stream's work is held (one
//   queue a device) and created streams run theirs when issued, after the held work they
//   wait for (a blocking stream: all of the default stream's). So work forked onto a
//   created stream without waiting for the default stream's earlier work runs before it.
enum class StreamOrder { InOrder, Late, DefaultLate };
StreamOrder stream_order();
// Runs every stream's held work, then switches (for tests).
void set_stream_order(StreamOrder order);
// Runs `work` on `stream` in the current order; returns an error held work left, if any.
cudaError_t issue(cudaStream_t stream, std::function<void()> work);
// Runs `stream`'s held work now. Unlike cudaStreamSynchronize, the host is not ordered
// after it for the racecheck: for the emulated NCCL, whose collectives read their inputs on
// the host but are stream work on a GPU.
cudaError_t run_held_work(cudaStream_t stream);
}  // namespace ham::cuda::emulator

template <class Function>
cudaError_t cudaFuncSetAttribute(Function* function, cudaFuncAttribute attribute, int value) {
  return ham::cuda::emulator::set_function_attribute(reinterpret_cast<const void*>(function),
                                                     attribute, value);
}
template <class Function>
cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attributes, Function* function) {
  return ham::cuda::emulator::get_function_attributes(attributes,
                                                      reinterpret_cast<const void*>(function));
}

template <class Function>
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, Function* function,
                                                          int block_threads,
                                                          size_t dynamic_shared_bytes) {
  return ham::cuda::emulator::max_active_blocks(
      blocks, reinterpret_cast<const void*>(function), block_threads, dynamic_shared_bytes);
}

#include "cuda/emulator/device_functions.h"

namespace ham::cuda::emulator {

// What HAM_LAUNCH (cuda/launch.h) builds: a launch configuration and a call of the kernel,
// run for every thread when the arguments come, and the kernel's address given those
// arguments (`address`: the call may deduce which specialization it is).
template <class Call, class Address>
struct KernelLaunch {
  LaunchSite site;
  dim3 grid, block;
  size_t shared_bytes;
  cudaStream_t stream;
  Call call;
  Address address;

  KernelLaunch(LaunchSite site_, dim3 grid_, dim3 block_, size_t shared_bytes_,
               cudaStream_t stream_, Call call_, Address address_)
      : site(site_), grid(grid_), block(block_), shared_bytes(shared_bytes_), stream(stream_),
        call(call_), address(address_) {}

  // Arguments are taken by value, as a kernel launch copies them; each thread's call copies
  // them again into the kernel's parameters.
  template <class... Args>
  void operator()(Args... args) {
    site.function = address(args...);
    cudaGetDevice(&site.device);  // never fails on the emulator
    if (!accept_launch(site, grid, block, shared_bytes, stream)) return;
    issue(stream, [site = site, grid = grid, block = block, shared_bytes = shared_bytes,
                   call = call, args...] {
      run_kernel(site, grid, block, shared_bytes, [&] { call(args...); });
    });
  }
};

}  // namespace ham::cuda::emulator

// The emulator's HAM_LAUNCH and HAM_LAUNCH_DEPENDENT (cuda/launch.h,
// cuda/dependent_launch.h): a KernelLaunch at `site` (a LaunchSite, in parentheses: its
// braces hold commas) of the kernel named last. The calls copy what they name ([=]): in
// held stream orders the kernel runs after the launching function has returned.
#define HAM_EMULATED_LAUNCH(site, grid, block, shared_bytes, stream, ...)                     \
  ::ham::cuda::emulator::KernelLaunch(                                                        \
      site, grid, block, shared_bytes, stream,                                                \
      [=](auto&&... ham_args_) { __VA_ARGS__(ham_args_...); },                                \
      [=](const auto&... ham_args_) {                                                         \
        return ::ham::cuda::emulator::kernel_address(0, __VA_ARGS__, ham_args_...);           \
      })
