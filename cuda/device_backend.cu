// The CUDA memory backend, registered with core at load time. A plain cudaMalloc per
// tensor for now; the caching allocator replaces it (issue: CUDA backend).
#include <string>

#include "core/device.h"
#include "cuda/check.h"

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

class CudaBackend final : public DeviceBackend {
 public:
  void* allocate(size_t nbytes, Device device) override {
    if (nbytes == 0) return nullptr;
    HAM_CUDA_CHECK(cudaSetDevice(device.index));
    void* ptr = nullptr;
    cudaError_t status = cudaMalloc(&ptr, nbytes);
    if (status != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total_bytes = 0;
      cudaMemGetInfo(&free_bytes, &total_bytes);
      HAM_FAIL("cuda:", device.index, ": out of memory allocating ", nbytes, " bytes (",
               free_bytes, " of ", total_bytes, " bytes free): ", cudaGetErrorString(status));
    }
    return ptr;
  }
  void deallocate(void* ptr, size_t, Device device) override {
    if (!ptr) return;
    cudaSetDevice(device.index);
    cudaFree(ptr);  // never throw from a destructor path
  }
  void copy_from_host(void* dst, const void* src, size_t n, Device device) override {
    HAM_CUDA_CHECK(cudaSetDevice(device.index));
    HAM_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice));
  }
  void copy_to_host(void* dst, const void* src, size_t n, Device device) override {
    HAM_CUDA_CHECK(cudaSetDevice(device.index));
    HAM_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToHost));
  }
  void copy_within(void* dst, const void* src, size_t n, Device device) override {
    HAM_CUDA_CHECK(cudaSetDevice(device.index));
    HAM_CUDA_CHECK(cudaMemcpy(dst, src, n, cudaMemcpyDeviceToDevice));
  }
  void memset_zero(void* dst, size_t n, Device device) override {
    HAM_CUDA_CHECK(cudaSetDevice(device.index));
    HAM_CUDA_CHECK(cudaMemset(dst, 0, n));
  }
};

const bool registered = [] {
  static CudaBackend backend;
  register_device_backend(DeviceKind::CUDA, &backend);
  return true;
}();

}  // namespace
}  // namespace ham::cuda
