#pragma once
// Where the time goes, op by op (`ham train --profile N`). While a profile runs, every call
// through an op's KernelTable (core/dispatch.h) is timed and filed under its op, the phase
// its caller named (forward, backward, optimizer) and its device. Only outermost calls
// count: an op whose kernel calls another op is timed once, as itself.
// CPU ops are timed on the host's steady clock. A device's ops are timed on the clock its
// backend registers (cuda/: events on the current stream), read when the profile stops,
// so a profile adds no host-device synchronization per op; an op's device time then spans
// its work on the stream, from the mark before it to the mark after. Each call keeps its
// tensor arguments' dtypes and shapes, so the slowest calls can be told apart.
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"

namespace ham::profiler {

// Marks on a device's timeline, read later.
class DeviceClock {
 public:
  using Mark = void*;
  virtual ~DeviceClock() = default;
  // A mark at this point of the device's current stream.
  virtual Mark mark(Device device) = 0;
  // Seconds from `from` to `to` on the device (waits for `to` to pass).
  virtual double seconds_between(Mark from, Mark to) = 0;
  // Must not throw (an op's scope releases marks while unwinding).
  virtual void release(Mark mark) noexcept = 0;
};
// Sets the clock for `kind`'s ops (nullptr: timed on the host) and returns the one before.
DeviceClock* register_device_clock(DeviceKind kind, DeviceClock* clock);

// One timed op call. start: seconds from the profile's start (a device's calls: from its
// first mark, placed at the host time that mark was made).
struct OpCall {
  const char* op;
  const char* phase;
  Device device;
  double start = 0, seconds = 0;
  std::string tensors;  // its tensor arguments, "f32[1024, 128] f32[128, 384] ..."
};

struct Profile {
  double wall_seconds = 0;  // start() to stop() on the host clock
  std::vector<OpCall> calls;  // in call order
};

// Starts recording; an error if a profile runs.
void start();
// Stops recording and returns what it recorded; an error if none runs.
Profile stop();
bool active();

// The phase the calls this thread makes are filed under until destroyed ("other" outside
// any). Nested phases restore the outer one.
class Phase {
 public:
  explicit Phase(const char* name);
  ~Phase();
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  const char* previous_;
};

// "f32[8, 128, 384]" ("undefined" for an undefined tensor); "63 tensors" for a list.
std::string describe(const Tensor& tensor);
std::string describe(const std::vector<Tensor>& tensors);

// The tensors among an op call's arguments, described and space-separated: tensors, lists
// of them, and the structs that list theirs with for_each_tensor (core/bf16_widening.h),
// member by member. Other arguments are left out.
template <class... Args>
std::string describe_tensor_args(const Args&... args) {
  std::string out;
  auto append = [&out](const std::string& piece) {
    if (!out.empty()) out += ' ';
    out += piece;
  };
  [[maybe_unused]] auto add = [&append](const auto& arg) {
    using A = std::remove_cvref_t<decltype(arg)>;
    if constexpr (std::is_same_v<A, Tensor> || std::is_same_v<A, std::vector<Tensor>>) {
      append(describe(arg));
    } else if constexpr (requires(A& a) { for_each_tensor(a, [](Tensor&) {}); }) {
      // for_each_tensor takes the struct by non-const reference; nothing is written.
      for_each_tensor(const_cast<A&>(arg), [&append](Tensor& t) { append(describe(t)); });
    }
  };
  (add(args), ...);
  return out;
}

// True while this thread is inside a timed op (its nested op calls are not timed).
bool timing_an_op_on_this_thread();

// Times one op call where a profile runs and no op of this thread is being timed; `args`
// are the call's arguments, whose tensors the call is filed with.
class OpScope {
 public:
  template <class... Args>
  explicit OpScope(const char* op, Device device, const Args&... args) {
    if (active() && !timing_an_op_on_this_thread()) {
      begin(op, device, describe_tensor_args(args...));
    }
  }
  // A device clock's failure here (the op's own error unwinding, say) drops the call from
  // the profile rather than end the process: a destructor cannot throw.
  ~OpScope() {
    if (recording_) end();
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  void begin(const char* op, Device device, std::string tensors);
  void end() noexcept;
  bool recording_ = false;
  size_t slot_ = 0;
  Device device_;
};

// One row a (phase, op, device): calls, total seconds, the median and largest call.
struct OpSummary {
  std::string phase, op, device;
  int64_t calls = 0;
  double total_seconds = 0, median_seconds = 0, max_seconds = 0;
};
// Rows by total time, largest first.
std::vector<OpSummary> summarize(const Profile& profile);

// A table per step: each row's calls and milliseconds a step, its share of the wall time,
// median and largest call; first the phases' totals and the share of the wall time spent
// outside ops (autograd, allocation, data, host work between ops).
std::string format_table(const Profile& profile, int64_t steps);

// The `count` slowest calls, slowest first: phase, op, device, milliseconds and tensors.
std::string format_slowest_calls(const Profile& profile, size_t count);

// The calls as a Chrome trace (chrome://tracing, ui.perfetto.dev): one track a device, each
// call an event named by its op, with its phase as category and its tensors as arguments.
// Written atomically; errors name the path.
void write_chrome_trace(const Profile& profile, const std::string& path);

}  // namespace ham::profiler
