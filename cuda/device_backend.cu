// The CUDA memory backend, registered with core at load time. Tensor memory comes from
// one caching allocator per device (cuda/caching_allocator.h), on the current stream
// (cuda/stream.h); copies and memsets are issued to that stream too, and copies to or
// from host memory wait for it, since the host buffer may be pageable or freed next.
#include <array>
#include <memory>
#include <mutex>
#include <string>

#include "core/device.h"
#include "cuda/caching_allocator.h"
#include "cuda/check.h"
#include "cuda/stream.h"

namespace ham::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no device / no driver" error
    return 0;
  }
  return count;
}

std::string unavailable_reason() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return std::string("no CUDA device: ") + cudaGetErrorString(status);
  }
  if (count == 0) return "no CUDA device: the driver reports 0 GPUs";
  return "";
}

namespace {

constexpr int kMaxDevices = 64;

// Segments straight from the CUDA runtime.
class CudaRawMemory final : public RawDeviceMemory {
 public:
  explicit CudaRawMemory(int device) : device_(device) {}

  void* try_allocate(size_t nbytes) override {
    DeviceGuard guard(device_);
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, nbytes);
    if (status == cudaErrorMemoryAllocation) {
      cudaGetLastError();  // clear it: the caller releases its cache and retries
      return nullptr;
    }
    HAM_CUDA_CHECK_CTX(status, "cudaMalloc of ", nbytes, " bytes on cuda:", device_);
    return ptr;
  }

  void release(void* ptr, size_t nbytes) override {
    DeviceGuard guard(device_);
    HAM_CUDA_CHECK_CTX(cudaFree(ptr), "cudaFree of ", nbytes, " bytes on cuda:", device_);
  }

  size_t free_bytes() override {
    DeviceGuard guard(device_);
    size_t free = 0, total = 0;
    HAM_CUDA_CHECK_CTX(cudaMemGetInfo(&free, &total), "cuda:", device_);
    return free;
  }

#if HAM_CUDA_EMULATOR
  bool host_addressable() const override { return true; }  // the emulator's "device"
  void in_stream_order(StreamKey stream, const std::function<void()>& mark) override {
    HAM_CUDA_CHECK(emulator::issue(reinterpret_cast<cudaStream_t>(stream), mark));
  }
#endif

 private:
  int device_;
};

struct DeviceMemory {
  explicit DeviceMemory(int device) : raw(device), allocator(raw, "cuda:" + std::to_string(device)) {}
  CudaRawMemory raw;
  CachingAllocator allocator;
};

// Never destroyed: tensors held by static objects are freed after main returns, and the
// CUDA runtime may already be gone by then.
std::array<DeviceMemory*, kMaxDevices>& device_memories() {
  static auto* table = new std::array<DeviceMemory*, kMaxDevices>{};
  return *table;
}
std::mutex& device_memories_mutex() {
  static auto* mutex = new std::mutex;
  return *mutex;
}

}  // namespace

CachingAllocator& device_allocator(int device) {
  HAM_CHECK(device >= 0 && device < kMaxDevices, "cuda:", device, ": device index out of range");
  std::lock_guard<std::mutex> lock(device_memories_mutex());
  DeviceMemory*& memory = device_memories()[size_t(device)];
  if (!memory) {
    int count = device_count();
    HAM_CHECK(device < count, "cuda:", device, " is not available: ", count,
              " CUDA device(s) visible", count == 0 ? " (" + unavailable_reason() + ")" : "");
    memory = new DeviceMemory(device);
  }
  return memory->allocator;
}

AllocatorStats memory_stats(int device) { return device_allocator(device).stats(); }

void empty_cache(int device) { device_allocator(device).empty_cache(); }

namespace {

class CudaBackend final : public DeviceBackend {
 public:
  void* allocate(size_t nbytes, Device device) override {
    if (nbytes == 0) return nullptr;
    return device_allocator(device.index).allocate(nbytes, stream_key(current_stream(device.index)));
  }
  void deallocate(void* ptr, size_t, Device device) override {
    if (!ptr) return;
    device_allocator(device.index).free(ptr);
  }
  void copy_from_host(void* dst, const void* src, size_t n, Device device) override {
    copy(dst, src, n, cudaMemcpyHostToDevice, device, "host to");
  }
  void copy_to_host(void* dst, const void* src, size_t n, Device device) override {
    copy(dst, src, n, cudaMemcpyDeviceToHost, device, "to host from");
  }
  void copy_within(void* dst, const void* src, size_t n, Device device) override {
    copy(dst, src, n, cudaMemcpyDeviceToDevice, device, "within");
  }
  void memset_zero(void* dst, size_t n, Device device) override {
    if (n == 0) return;
    DeviceGuard guard(device.index);
    HAM_CUDA_CHECK_CTX(cudaMemsetAsync(dst, 0, n, current_stream(device.index)), "zeroing ", n,
                       " bytes on ", device.str());
  }
  DeviceMemoryStats memory_stats(Device device) override {
    AllocatorStats pool = device_allocator(device.index).stats();
    return {pool.requested_bytes, pool.peak_requested_bytes, pool.allocated_bytes,
            pool.reserved_bytes};
  }
  void reset_peak_memory(Device device) override { device_allocator(device.index).reset_peaks(); }

 private:
  static void copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, Device device,
                   const char* direction) {
    if (n == 0) return;
    DeviceGuard guard(device.index);
    cudaStream_t stream = current_stream(device.index);
    HAM_CUDA_CHECK_CTX(cudaMemcpyAsync(dst, src, n, kind, stream), "copy of ", n, " bytes ",
                       direction, " ", device.str());
    if (kind != cudaMemcpyDeviceToDevice) {
      HAM_CUDA_CHECK_CTX(cudaStreamSynchronize(stream), "copy of ", n, " bytes ", direction, " ",
                         device.str());
    }
  }
};

const bool registered = [] {
  static CudaBackend backend;
  register_device_backend(DeviceKind::CUDA, &backend);
  return true;
}();

}  // namespace
}  // namespace ham::cuda
