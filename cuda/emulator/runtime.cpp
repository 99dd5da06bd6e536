// The CUDA runtime API of the SIMT emulator. "Device" memory is host memory filled with 0xff
// bytes when allocated (NaN as floats, -1 as integers), so reading what no kernel or copy
// wrote shows up in a test. Work runs when it is issued, on the calling thread: every stream
// is therefore always idle, events complete when recorded and time the host.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <utility>

#include "core/error.h"

struct CUstream_st {
  int device;
  unsigned flags;
};

struct CUevent_st {
  int device;
  unsigned flags;
  bool recorded;
  std::chrono::steady_clock::time_point when;
};

namespace ham::cuda::emulator {

namespace {

// What the emulated GPUs report: an H100/H200-like part (132 SMs, 227 KiB of shared memory a
// block can opt into, 48 KiB without), with 16 GiB of emulated memory each.
constexpr int kMultiprocessors = 132;
constexpr int kSharedPerBlock = 48 * 1024;
constexpr int kSharedPerBlockOptin = 227 * 1024;
constexpr int kSharedPerMultiprocessor = 228 * 1024;  // a Hopper SM's, 1 KB reserved per block
constexpr int kThreadsPerMultiprocessor = 2048;
constexpr size_t kMemoryBytes = size_t(16) << 30;

int device_count_from_environment() {
  const char* value = std::getenv("HAM_EMULATED_GPUS");
  if (!value || !*value) return 1;
  char* end = nullptr;
  long n = std::strtol(value, &end, 10);
  HAM_CHECK(end && *end == '\0' && n >= 0 && n <= 64, "HAM_EMULATED_GPUS=", value,
            ": expected a GPU count from 0 to 64");
  return int(n);
}

int device_count() {
  static const int count = device_count_from_environment();
  return count;
}

struct State {
  std::mutex mutex;
  std::map<const void*, std::pair<size_t, int>> allocations;  // pointer -> bytes, device
  size_t used[64] = {};
  std::set<cudaStream_t> streams;  // created and not destroyed
  std::map<const void*, int> max_dynamic_shared;  // kernel -> its MaxDynamicSharedMemorySize
};

State& state() {
  static auto* s = new State;
  return *s;
}

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;

cudaError_t fail(cudaError_t error) {
  last_error = error;
  return error;
}

bool valid_stream(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) return true;
  std::lock_guard<std::mutex> lock(state().mutex);
  return state().streams.count(stream) > 0;
}

}  // namespace

cudaError_t set_function_attribute(const void* function, cudaFuncAttribute attribute, int value) {
  if (!function) return fail(cudaErrorInvalidValue);
  if (attribute == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    if (value < 0 || value > kSharedPerBlockOptin) return fail(cudaErrorInvalidValue);
    std::lock_guard<std::mutex> lock(state().mutex);
    state().max_dynamic_shared[function] = value;
  }
  return cudaSuccess;
}

cudaError_t get_function_attributes(cudaFuncAttributes* attributes, const void* function) {
  if (!attributes || !function) return fail(cudaErrorInvalidValue);
  *attributes = cudaFuncAttributes{};
  attributes->maxThreadsPerBlock = 1024;
  attributes->ptxVersion = 90;
  attributes->binaryVersion = 90;
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().max_dynamic_shared.find(function);
  attributes->maxDynamicSharedSizeBytes = it == state().max_dynamic_shared.end() ? kSharedPerBlock
                                                                                 : it->second;
  // Static __shared__ sizes are not known here (a static is not measured): 0.
  return cudaSuccess;
}

cudaError_t max_active_blocks(int* blocks, const void* function, int block_threads,
                              size_t dynamic_shared_bytes) {
  if (!blocks || !function || block_threads <= 0 || block_threads > 1024) {
    return fail(cudaErrorInvalidValue);
  }
  // Threads and shared memory only: the emulator does not know a kernel's registers.
  const int by_threads = kThreadsPerMultiprocessor / block_threads;
  const int by_shared = int(kSharedPerMultiprocessor / (dynamic_shared_bytes + 1024));
  *blocks = std::min({32, by_threads, by_shared});
  return cudaSuccess;
}

bool accept_launch(dim3 grid, dim3 block, size_t dynamic_shared_bytes, cudaStream_t stream) {
  const uint64_t threads = uint64_t(block.x) * block.y * block.z;
  const bool ok = threads >= 1 && threads <= 1024 && block.z <= 64 && grid.x >= 1 &&
                  grid.y >= 1 && grid.z >= 1 && grid.x <= 2147483647u && grid.y <= 65535 &&
                  grid.z <= 65535 && dynamic_shared_bytes <= size_t(kSharedPerBlockOptin);
  if (!ok) {
    fail(cudaErrorInvalidConfiguration);
    return false;
  }
  if (!valid_stream(stream)) {
    fail(cudaErrorInvalidResourceHandle);
    return false;
  }
  return true;
}

}  // namespace ham::cuda::emulator

using namespace ham::cuda::emulator;

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return fail(cudaErrorInvalidValue);
  *count = device_count();
  if (*count == 0) return fail(cudaErrorNoDevice);
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (!device) return fail(cudaErrorInvalidValue);
  *device = current_device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (!value) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = kSharedPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = kMultiprocessors; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = kSharedPerBlockOptin; break;
    default: return fail(cudaErrorInvalidValue);
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (!prop) return fail(cudaErrorInvalidValue);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "ham SIMT emulator (sm_90)");
  prop->totalGlobalMem = kMemoryBytes;
  prop->sharedMemPerBlock = kSharedPerBlock;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->multiProcessorCount = kMultiprocessors;
  prop->major = 9;
  prop->minor = 0;
  prop->sharedMemPerBlockOptin = kSharedPerBlockOptin;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return cudaSuccess; }

cudaError_t cudaMemGetInfo(size_t* free, size_t* total) {
  if (!free || !total) return fail(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> lock(state().mutex);
  *total = kMemoryBytes;
  *free = kMemoryBytes - state().used[current_device];
  return cudaSuccess;
}

cudaError_t cudaMalloc(void** ptr, size_t bytes) {
  if (!ptr) return fail(cudaErrorInvalidValue);
  *ptr = nullptr;
  if (bytes == 0) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(state().mutex);
    if (bytes > kMemoryBytes - state().used[current_device]) return fail(cudaErrorMemoryAllocation);
  }
  void* p = ::operator new(bytes, std::align_val_t(256), std::nothrow);
  if (!p) return fail(cudaErrorMemoryAllocation);
  std::memset(p, 0xff, bytes);
  std::lock_guard<std::mutex> lock(state().mutex);
  state().allocations[p] = {bytes, current_device};
  state().used[current_device] += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* ptr) {
  if (!ptr) return cudaSuccess;
  std::lock_guard<std::mutex> lock(state().mutex);
  auto it = state().allocations.find(ptr);
  if (it == state().allocations.end()) return fail(cudaErrorInvalidValue);
  state().used[it->second.second] -= it->second.first;
  state().allocations.erase(it);
  ::operator delete(ptr, std::align_val_t(256));
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) return cudaSuccess;
  if (!dst || !src || kind < cudaMemcpyHostToHost || kind > cudaMemcpyDefault) {
    return fail(cudaErrorInvalidValue);
  }
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  return cudaMemcpy(dst, src, bytes, kind);
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                              size_t width, size_t height, cudaMemcpyKind kind,
                              cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  if (width == 0 || height == 0) return cudaSuccess;
  if (!dst || !src || width > dst_pitch || width > src_pitch || kind < cudaMemcpyHostToHost ||
      kind > cudaMemcpyDefault) {
    return fail(cudaErrorInvalidValue);
  }
  for (size_t row = 0; row < height; ++row) {
    std::memmove(static_cast<char*>(dst) + row * dst_pitch,
                 static_cast<const char*>(src) + row * src_pitch, width);
  }
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (bytes == 0) return cudaSuccess;
  if (!dst) return fail(cudaErrorInvalidValue);
  std::memset(dst, value, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (!valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  return cudaMemset(dst, value, bytes);
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  if (!stream) return fail(cudaErrorInvalidValue);
  *stream = new CUstream_st{current_device, flags};
  std::lock_guard<std::mutex> lock(state().mutex);
  state().streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(state().mutex);
  if (state().streams.erase(stream) == 0) return fail(cudaErrorInvalidResourceHandle);
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return valid_stream(stream) ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  if (!valid_stream(stream) || !event) return fail(cudaErrorInvalidResourceHandle);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned flags) {
  if (!event) return fail(cudaErrorInvalidValue);
  *event = new CUevent_st{current_device, flags, false, {}};
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!event) return fail(cudaErrorInvalidResourceHandle);
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event || !valid_stream(stream)) return fail(cudaErrorInvalidResourceHandle);
  event->recorded = true;
  event->when = std::chrono::steady_clock::now();
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  return event ? cudaSuccess : fail(cudaErrorInvalidResourceHandle);
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) { return cudaEventQuery(event); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return fail(cudaErrorInvalidValue);
  if (!start || !end) return fail(cudaErrorInvalidResourceHandle);
  if ((start->flags | end->flags) & cudaEventDisableTiming) {
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (!start->recorded || !end->recorded) return fail(cudaErrorInvalidResourceHandle);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  cudaError_t error = last_error;
  last_error = cudaSuccess;
  return error;
}

cudaError_t cudaPeekAtLastError() { return last_error; }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
  }
  return "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
  }
  return "unknown error";
}
