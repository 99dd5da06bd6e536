#pragma once
// Streams, events and the current device/stream of a thread.
//
// Every ham CUDA kernel and copy runs on current_stream(device): the legacy default
// stream (0) unless a StreamGuard in this thread says otherwise, so code that never
// touches streams is ordered exactly as it is written. The caching allocator keeps one
// pool per stream (cuda/caching_allocator.h): memory is allocated on, and returned to,
// the stream current at allocation.
#include <cuda_runtime.h>

#include "cuda/caching_allocator.h"

namespace ham::cuda {

class Event;

// A stream's priority with the block scheduler, which places the pending blocks of a
// higher-priority stream's kernels first as SMs free up. Every stream, the legacy one
// included, has the lowest (Default) unless made High (the device's greatest).
enum class StreamPriority { Default, High };

// An owned stream on one device (non-blocking: it does not wait on the legacy stream).
class Stream {
 public:
  explicit Stream(int device, bool non_blocking = true,
                  StreamPriority priority = StreamPriority::Default);
  ~Stream();
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&&) = delete;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t handle() const { return stream_; }
  int device() const { return device_; }
  // CUDA's number for the stream's priority (lower is higher; cudaStreamGetPriority).
  int priority() const;
  void synchronize() const;
  // Later work on this stream waits for `event` (no host wait).
  void wait(const Event& event) const;

 private:
  cudaStream_t stream_ = nullptr;
  int device_ = 0;
};

// An owned event; timing events can measure elapsed time between two records.
class Event {
 public:
  explicit Event(int device, bool timing = false);
  ~Event();
  Event(Event&& other) noexcept;
  Event& operator=(Event&&) = delete;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(cudaStream_t stream);
  void synchronize() const;
  bool completed() const;  // true once the recorded work is done
  // Milliseconds from `start`'s record to this event's (both timing events, both done).
  float elapsed_ms_since(const Event& start) const;
  cudaEvent_t handle() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
  int device_ = 0;
};

// The stream this thread issues work for `device` to.
cudaStream_t current_stream(int device);
// Whether `stream` (of the current device) has the device's greatest priority.
bool has_greatest_priority(cudaStream_t stream);
inline StreamKey stream_key(cudaStream_t stream) { return reinterpret_cast<StreamKey>(stream); }

// Makes `stream` current for its device in this thread until destroyed.
class StreamGuard {
 public:
  explicit StreamGuard(const Stream& stream);
  StreamGuard(int device, cudaStream_t stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  int device_;
  cudaStream_t previous_;
};

// Work forked from the current stream of `device` onto a second stream (one per device and
// priority, made on first use and kept), for kernels that may run beside what the current
// stream does next: the second stream waits for the work issued so far; run(f) issues f's
// work there (the second stream current while f runs); join() makes the current stream
// wait for all of it. With StreamPriority::High the forked work's blocks go before the
// current stream's where both have blocks waiting for an SM: a critical path forked so
// runs first, and the current stream's work fills what it leaves. Memory allocated before
// the fork belongs to the current stream and may be used by that work until join(); memory
// allocated inside run() belongs to the second stream. The destructor joins where join()
// was not called (a throw on its way: errors are then dropped).
class ForkedStream {
 public:
  explicit ForkedStream(int device, StreamPriority priority = StreamPriority::Default);
  ~ForkedStream();
  ForkedStream(const ForkedStream&) = delete;
  ForkedStream& operator=(const ForkedStream&) = delete;
  template <class F>
  void run(F&& f) {
    StreamGuard guard(device_, side_);
    f();
  }
  // The current stream waits for the work run() issued so far; the fork stays open.
  void join_so_far();
  void join();

 private:
  int device_;
  cudaStream_t origin_;
  cudaStream_t side_;
  bool joined_ = false;
};

// cudaSetDevice for a scope; restores the previous device on exit.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool changed_ = false;
};

// The device this process should use: its local MPI/Slurm rank among the devices that
// CUDA_VISIBLE_DEVICES leaves visible (cuda/device_selection.h); also makes it the
// current device. Throws one line when there are too few devices.
int select_local_device();

// The caching allocator of one device (created on first use) and its statistics.
CachingAllocator& device_allocator(int device);
AllocatorStats memory_stats(int device);
void empty_cache(int device);

}  // namespace ham::cuda
