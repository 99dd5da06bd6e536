// Recording the instrumented kernels' block stamps (cuda/block_timeline.h); their summary is
// cuda/block_timeline_summary.cpp.
#include "cuda/block_timeline.h"

#include <cuda_runtime.h>

#include <atomic>
#include <cstring>
#include <mutex>

#include "core/tensor.h"
#include "cuda/check.h"

namespace ham::cuda {

namespace {

struct RecordedLaunch {
  std::string kernel;
  int64_t blocks;
  Tensor stamps;  // blocks x 8 int64 words on the launch's device
};

std::mutex g_mutex;  // guards g_launches
// Read without the lock by every launch of an instrumented kernel, recording or not.
std::atomic<bool> g_recording{false};
std::vector<RecordedLaunch> g_launches;

}  // namespace

void record_block_timelines(bool on) {
  std::lock_guard<std::mutex> lock(g_mutex);
  g_recording = on;
  if (on) g_launches.clear();
}

bool recording_block_timelines() { return g_recording.load(); }

BlockStamps* block_timeline_for_launch(const KernelName& kernel, int64_t blocks) {
  if (!g_recording.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lock(g_mutex);
  if (!g_recording.load()) return nullptr;  // stopped since the check above
  constexpr int64_t kWords = sizeof(BlockStamps) / 8;
  int device = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  Tensor stamps = Tensor::empty(Shape{blocks, kWords}, DType::I64, Device::cuda(device));
  auto* buffer = static_cast<BlockStamps*>(stamps.raw_data());
  g_launches.push_back({kernel.text(), blocks, std::move(stamps)});
  return buffer;
}

std::vector<KernelTimeline> take_block_timelines() {
  std::vector<RecordedLaunch> launches;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    launches.swap(g_launches);
  }
  std::vector<KernelTimeline> timelines;
  for (const RecordedLaunch& launch : launches) {
    const Tensor host = launch.stamps.to(Device::cpu());  // waits for the launch's stream
    KernelTimeline timeline{launch.kernel, std::vector<BlockStamps>(size_t(launch.blocks))};
    std::memcpy(timeline.blocks.data(), host.raw_data(),
                timeline.blocks.size() * sizeof(BlockStamps));
    timelines.push_back(std::move(timeline));
  }
  return timelines;
}

}  // namespace ham::cuda
