#include "cuda/dependent_launch.h"

#include <atomic>
#include <mutex>
#include <unordered_map>

namespace ham::cuda {

namespace {
// Off until the H200 has timed it (docs/kernel_settings.md).
std::atomic<bool> g_dependent_launches{false};
std::atomic<int64_t> g_dependent_launch_count{0};
}  // namespace

bool set_dependent_launches(bool on) { return g_dependent_launches.exchange(on); }

int64_t dependent_launch_count() { return g_dependent_launch_count.load(); }

#ifdef HAM_CUDA_EMULATOR
bool dependent_launches_supported() { return true; }

bool take_dependent_launch() {
  if (!g_dependent_launches.load()) return false;
  g_dependent_launch_count.fetch_add(1);
  return true;
}
#else
bool dependent_launches_supported() {
  int device = 0, major = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  HAM_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  return major >= 9;
}

// The kernel's code that runs on the current device must be sm_90 or newer: code built for
// an older architecture (or PTX of one, compiled at load) holds no griddepcontrol.wait, and
// launched so it would read what the kernel ahead of it has not written yet.
bool take_dependent_launch(const void* kernel) {
  if (!g_dependent_launches.load()) return false;
  int device = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  static std::mutex mutex;
  static std::unordered_map<const void*, int> binary_version_on[64];
  HAM_CHECK(device >= 0 && device < 64, "cuda:", device, ": device index out of range");
  std::lock_guard<std::mutex> lock(mutex);
  auto [at, added] = binary_version_on[device].try_emplace(kernel, 0);
  if (added) {
    cudaFuncAttributes attributes{};
    HAM_CUDA_CHECK_CTX(cudaFuncGetAttributes(&attributes, kernel),
                       "the attributes of a kernel launched as a dependent launch");
    at->second = attributes.binaryVersion;
  }
  if (at->second < 90) return false;
  g_dependent_launch_count.fetch_add(1);
  return true;
}
#endif

}  // namespace ham::cuda
