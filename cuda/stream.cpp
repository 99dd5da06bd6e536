#include "cuda/stream.h"

#include <array>
#include <mutex>

#include "core/error.h"
#include "cuda/check.h"
#include "cuda/device_selection.h"

namespace ham::cuda {

namespace {

constexpr int kMaxDevices = 64;

void check_device_index(int device) {
  HAM_CHECK(device >= 0 && device < kMaxDevices, "cuda:", device, ": device index out of range");
}

thread_local std::array<cudaStream_t, kMaxDevices> current_streams{};

}  // namespace

Stream::Stream(int device, bool non_blocking, StreamPriority priority) : device_(device) {
  DeviceGuard guard(device);
  int least = 0, greatest = 0;
  HAM_CUDA_CHECK_CTX(cudaDeviceGetStreamPriorityRange(&least, &greatest),
                     "the stream priorities of cuda:", device);
  HAM_CUDA_CHECK_CTX(
      cudaStreamCreateWithPriority(&stream_,
                                   non_blocking ? cudaStreamNonBlocking : cudaStreamDefault,
                                   priority == StreamPriority::High ? greatest : least),
      "creating a stream on cuda:", device);
}

Stream::Stream(Stream&& other) noexcept : stream_(other.stream_), device_(other.device_) {
  other.stream_ = nullptr;
}

Stream::~Stream() {
  // Wait first: the caching allocator may hand this handle's pooled blocks to a new
  // stream that gets the same handle value. No throw from a destructor.
  if (stream_) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

int Stream::priority() const {
  int priority = 0;
  HAM_CUDA_CHECK_CTX(cudaStreamGetPriority(stream_, &priority), "stream on cuda:", device_);
  return priority;
}

void Stream::synchronize() const {
  HAM_CUDA_CHECK_CTX(cudaStreamSynchronize(stream_), "stream on cuda:", device_);
}

void Stream::wait(const Event& event) const {
  HAM_CUDA_CHECK_CTX(cudaStreamWaitEvent(stream_, event.handle(), 0), "stream on cuda:", device_);
}

Event::Event(int device, bool timing) : device_(device) {
  DeviceGuard guard(device);
  HAM_CUDA_CHECK_CTX(
      cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
      "creating an event on cuda:", device);
}

Event::Event(Event&& other) noexcept : event_(other.event_), device_(other.device_) {
  other.event_ = nullptr;
}

Event::~Event() {
  if (event_) cudaEventDestroy(event_);
}

void Event::record(cudaStream_t stream) {
  HAM_CUDA_CHECK_CTX(cudaEventRecord(event_, stream), "event on cuda:", device_);
}

void Event::synchronize() const {
  HAM_CUDA_CHECK_CTX(cudaEventSynchronize(event_), "event on cuda:", device_);
}

bool Event::completed() const {
  cudaError_t status = cudaEventQuery(event_);
  if (status == cudaErrorNotReady) return false;
  HAM_CUDA_CHECK_CTX(status, "event on cuda:", device_);
  return true;
}

float Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  HAM_CUDA_CHECK_CTX(cudaEventElapsedTime(&ms, start.event_, event_), "events on cuda:", device_);
  return ms;
}

cudaStream_t current_stream(int device) {
  check_device_index(device);
  return current_streams[size_t(device)];
}

bool has_greatest_priority(cudaStream_t stream) {
  int least = 0, greatest = 0, priority = 0;
  HAM_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  HAM_CUDA_CHECK(cudaStreamGetPriority(stream, &priority));
  return priority == greatest;
}

StreamGuard::StreamGuard(const Stream& stream) : StreamGuard(stream.device(), stream.handle()) {}

StreamGuard::StreamGuard(int device, cudaStream_t stream) : device_(device) {
  check_device_index(device);
  previous_ = current_streams[size_t(device)];
  current_streams[size_t(device)] = stream;
}

StreamGuard::~StreamGuard() { current_streams[size_t(device_)] = previous_; }

namespace {

// The second streams of each device (ForkedStream), one a priority, never destroyed:
// kernels may still run on them while the process exits.
cudaStream_t second_stream(int device, StreamPriority priority) {
  static std::mutex mutex;
  static std::array<std::array<Stream*, 2>, kMaxDevices> streams{};
  std::lock_guard<std::mutex> lock(mutex);
  Stream*& stream = streams[size_t(device)][priority == StreamPriority::High ? 1 : 0];
  if (!stream) stream = new Stream(device, /*non_blocking=*/true, priority);
  return stream->handle();
}

}  // namespace

ForkedStream::ForkedStream(int device, StreamPriority priority)
    : device_(device), origin_(current_stream(device)), side_(second_stream(device, priority)) {
  Event forked(device);
  forked.record(origin_);
  HAM_CUDA_CHECK_CTX(cudaStreamWaitEvent(side_, forked.handle(), 0), "stream on cuda:", device);
}

void ForkedStream::join_so_far() {
  Event done(device_);
  done.record(side_);
  HAM_CUDA_CHECK_CTX(cudaStreamWaitEvent(origin_, done.handle(), 0), "stream on cuda:", device_);
}

void ForkedStream::join() {
  if (joined_) return;
  joined_ = true;
  join_so_far();
}

ForkedStream::~ForkedStream() {
  try {
    join();
  } catch (...) {  // no throw from a destructor (where join() was skipped, one is on its way)
  }
}

DeviceGuard::DeviceGuard(int device) {
  HAM_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) {
    HAM_CUDA_CHECK_CTX(cudaSetDevice(device), "selecting cuda:", device);
    changed_ = true;
  }
}

DeviceGuard::~DeviceGuard() {
  if (changed_) cudaSetDevice(previous_);
}

int select_local_device() {
  int device = select_device_index(process_environment(), device_count());
  HAM_CUDA_CHECK_CTX(cudaSetDevice(device), "selecting cuda:", device, " for this rank");
  return device;
}

}  // namespace ham::cuda
