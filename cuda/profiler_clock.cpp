// The CUDA backend's clock for the op profiler (core/profiler.h): each mark is a timing
// event recorded on the device's current stream, so a profiled op costs two event records
// and no host wait; the profile reads the events when it stops. Events are pooled per
// device: a training step marks thousands of ops.
#include <memory>
#include <mutex>
#include <vector>

#include "core/profiler.h"
#include "cuda/stream.h"

namespace ham::cuda {
namespace {

struct DeviceEvent {
  int device;
  Event event;
};

class EventClock final : public profiler::DeviceClock {
 public:
  Mark mark(Device device) override {
    std::unique_ptr<DeviceEvent> marked = take(device.index);
    DeviceGuard guard(device.index);
    marked->event.record(current_stream(device.index));
    return marked.release();
  }

  double seconds_between(Mark from, Mark to) override {
    const Event& end = static_cast<DeviceEvent*>(to)->event;
    end.synchronize();
    return 1e-3 * double(end.elapsed_ms_since(static_cast<DeviceEvent*>(from)->event));
  }

  void release(Mark mark) noexcept override {
    std::unique_ptr<DeviceEvent> marked(static_cast<DeviceEvent*>(mark));
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(std::move(marked));
  }

 private:
  std::unique_ptr<DeviceEvent> take(int device) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (size_t i = free_.size(); i-- > 0;) {
        if (free_[i]->device != device) continue;
        std::unique_ptr<DeviceEvent> marked = std::move(free_[i]);
        free_.erase(free_.begin() + std::ptrdiff_t(i));
        return marked;
      }
    }
    return std::unique_ptr<DeviceEvent>(new DeviceEvent{device, Event(device, /*timing=*/true)});
  }

  std::mutex mutex_;
  std::vector<std::unique_ptr<DeviceEvent>> free_;
};

const bool registered = [] {
  static EventClock clock;
  profiler::register_device_clock(DeviceKind::CUDA, &clock);
  return true;
}();

}  // namespace
}  // namespace ham::cuda
