// Out-of-line pieces of cuda/launch.h.
#include <array>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "core/ops/shape.h"
#include "cuda/launch.h"

namespace ham::cuda {

int multiprocessor_count() {
  static std::mutex mutex;
  static std::array<int, 64> cached{};
  int device = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  HAM_CHECK(device >= 0 && device < int(cached.size()), "cuda: device index ", device,
            " beyond the ", cached.size(), " this build expects");
  std::lock_guard<std::mutex> lock(mutex);
  if (cached[size_t(device)] == 0) {
    HAM_CUDA_CHECK(cudaDeviceGetAttribute(&cached[size_t(device)],
                                          cudaDevAttrMultiProcessorCount, device));
  }
  return cached[size_t(device)];
}

int cached_blocks_per_sm(const void* kernel, int threads, size_t bytes,
                         const std::function<int()>& query) {
  static std::mutex mutex;
  static std::map<std::tuple<const void*, int, size_t, int>, int> cache;
  int device = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  const auto key = std::make_tuple(kernel, threads, bytes, device);
  {
    std::lock_guard<std::mutex> lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) return it->second;
  }
  const int blocks = query();
  std::lock_guard<std::mutex> lock(mutex);
  cache[key] = blocks;
  return blocks;
}

void raise_dynamic_shared_limit(const void* kernel, size_t bytes,
                                const std::function<void()>& raise) {
  static std::mutex mutex;
  static std::map<std::pair<const void*, int>, size_t> raised;
  int device = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  std::lock_guard<std::mutex> lock(mutex);
  size_t& limit = raised[{kernel, device}];
  if (bytes <= limit) return;
  raise();
  limit = bytes;
}

size_t max_shared_per_block() {
  int device = 0, bytes = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  HAM_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return size_t(bytes);
}

namespace {

// first_bad = min position p with index[p] outside [0, limit) (stays at n when none).
template <class I>
__global__ void find_first_out_of_range(const I* index, int64_t n, int64_t limit,
                                        unsigned long long* first_bad) {
  HAM_GRID_STRIDE_LOOP(p, n) {
    int64_t v = int64_t(index[p]);
    if (v < 0 || v >= limit) atomicMin(first_bad, (unsigned long long)p);
  }
}

}  // namespace

void check_index_range(const char* op, const char* what, const Tensor& index, int64_t limit,
                       const std::string& why) {
  const int64_t n = index.numel();
  if (n == 0) return;
  use_device_of(index);
  Tensor first_bad = Tensor::empty({1}, DType::I64, index.device());
  unsigned long long none = (unsigned long long)n;
  HAM_CUDA_CHECK(cudaMemcpyAsync(first_bad.raw_data(), &none, sizeof none,
                                 cudaMemcpyHostToDevice, launch_stream()));
  dispatch_index(op, index.dtype(), [&]<class I>() {
    HAM_LAUNCH(grid_for(n), kThreads, 0, launch_stream(), find_first_out_of_range<I>)(
        ptr<I>(index), n, limit, ptr<unsigned long long>(first_bad));
    HAM_CUDA_CHECK_LAUNCH();
  });
  unsigned long long found = 0;
  HAM_CUDA_CHECK(cudaMemcpyAsync(&found, first_bad.raw_data(), sizeof found,
                                 cudaMemcpyDeviceToHost, launch_stream()));
  HAM_CUDA_CHECK(cudaStreamSynchronize(launch_stream()));
  if (found == none) return;
  // Word the error exactly as the CPU kernels do.
  ham::cpu::check_index_range(op, what, index.to(Device::cpu()), limit, why);
  HAM_FAIL(op, ": ", what, " at flat position ", found, " is outside [0, ", limit, ") (", why,
           ")");
}

}  // namespace ham::cuda
