#include "core/profiler.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/file_io.h"
#include "core/tensor.h"

namespace ham::profiler {
namespace {

using Clock = std::chrono::steady_clock;

// A call as recorded: host times, and a device clock's marks where it has one.
struct Pending {
  const char* op = nullptr;
  const char* phase = nullptr;
  Device device;
  Clock::time_point host_start, host_end;
  DeviceClock::Mark from = nullptr, to = nullptr;
  bool done = false;
  std::string tensors;
};

std::array<DeviceClock*, kNumDeviceKinds> clocks{};
std::atomic<bool> recording{false};
std::mutex state_mutex;
uint64_t generation = 0;  // a profile's number: a call begun in an earlier one is dropped
Clock::time_point started;
std::vector<Pending> pending;

thread_local const char* current_phase = "other";
thread_local bool timing_an_op = false;
thread_local uint64_t timing_generation = 0;

DeviceClock* clock_for(Device device) {
  return device.is_cpu() ? nullptr : clocks[size_t(device.kind)];
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

void release_marks(std::vector<Pending>& calls) {
  for (Pending& p : calls) {
    DeviceClock* clock = clock_for(p.device);
    if (!clock) continue;
    if (p.from) clock->release(p.from);
    if (p.to) clock->release(p.to);
    p.from = p.to = nullptr;
  }
}

}  // namespace

DeviceClock* register_device_clock(DeviceKind kind, DeviceClock* clock) {
  HAM_CHECK(kind != DeviceKind::CPU, "profiler: the CPU's ops are timed on the host clock");
  HAM_CHECK(!recording.load(), "profiler: a device clock changed while a profile runs");
  return std::exchange(clocks[size_t(kind)], clock);
}

bool active() { return recording.load(std::memory_order_relaxed); }

void start() {
  std::lock_guard<std::mutex> lock(state_mutex);
  HAM_CHECK(!recording.load(), "profiler: start() while a profile runs");
  pending.clear();
  ++generation;
  started = Clock::now();
  recording.store(true);
}

Profile stop() {
  std::vector<Pending> calls;
  Clock::time_point stopped;
  {
    std::lock_guard<std::mutex> lock(state_mutex);
    HAM_CHECK(recording.load(), "profiler: stop() with no profile running");
    recording.store(false);
    stopped = Clock::now();
    calls.swap(pending);
  }
  Profile profile;
  profile.wall_seconds = seconds(stopped - started);
  // A device's first mark anchors its calls at that call's host time.
  std::map<std::pair<int, int>, const Pending*> first_on_device;
  try {
    for (const Pending& p : calls) {
      if (!p.done) continue;  // begun but not ended when the profile stopped
      OpCall call{p.op, p.phase, p.device, 0, 0, p.tensors};
      call.start = seconds(p.host_start - started);
      DeviceClock* clock = clock_for(p.device);
      if (clock) {
        const auto key = std::make_pair(int(p.device.kind), p.device.index);
        auto [it, first] = first_on_device.emplace(key, &p);
        call.seconds = clock->seconds_between(p.from, p.to);
        if (!first) {
          call.start = seconds(it->second->host_start - started) +
                       clock->seconds_between(it->second->from, p.from);
        }
      } else {
        call.seconds = seconds(p.host_end - p.host_start);
      }
      profile.calls.push_back(call);
    }
  } catch (...) {
    release_marks(calls);
    throw;
  }
  release_marks(calls);
  return profile;
}

Phase::Phase(const char* name) : previous_(current_phase) { current_phase = name; }
Phase::~Phase() { current_phase = previous_; }

std::string describe(const Tensor& tensor) {
  if (!tensor.defined()) return "undefined";
  return std::string(dtype_name(tensor.dtype())) + shape_str(tensor.shape());
}

std::string describe(const std::vector<Tensor>& tensors) {
  return std::to_string(tensors.size()) + " tensors";
}

bool timing_an_op_on_this_thread() { return timing_an_op; }

void OpScope::begin(const char* op, Device device, std::string tensors) {
  Pending p;
  p.op = op;
  p.tensors = std::move(tensors);
  p.phase = current_phase;
  p.device = device;
  DeviceClock* clock = clock_for(device);
  p.host_start = Clock::now();
  if (clock) p.from = clock->mark(device);
  std::lock_guard<std::mutex> lock(state_mutex);
  if (!recording.load()) {
    if (clock) clock->release(p.from);
    return;
  }
  slot_ = pending.size();
  device_ = device;
  pending.push_back(std::move(p));
  timing_an_op = true;
  timing_generation = generation;
  recording_ = true;
}

void OpScope::end() noexcept {
  timing_an_op = false;
  DeviceClock* clock = clock_for(device_);
  DeviceClock::Mark to = nullptr;
  try {
    if (clock) to = clock->mark(device_);
  } catch (...) {
    return;  // dropped (see ~OpScope); stop() skips a call that never ended
  }
  const Clock::time_point host_end = Clock::now();
  std::lock_guard<std::mutex> lock(state_mutex);
  if (!recording.load() || timing_generation != generation) {
    if (to) clock->release(to);  // the profile stopped meanwhile
    return;
  }
  Pending& p = pending[slot_];
  p.to = to;
  p.host_end = host_end;
  p.done = true;
}

std::vector<OpSummary> summarize(const Profile& profile) {
  std::map<std::tuple<std::string, std::string, std::string>, std::vector<double>> by_row;
  for (const OpCall& c : profile.calls) {
    by_row[{c.phase, c.op, c.device.str()}].push_back(c.seconds);
  }
  std::vector<OpSummary> rows;
  for (auto& [key, times] : by_row) {
    OpSummary row;
    std::tie(row.phase, row.op, row.device) = key;
    row.calls = int64_t(times.size());
    for (double t : times) row.total_seconds += t;
    std::sort(times.begin(), times.end());
    const size_t n = times.size();
    row.median_seconds = n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
    row.max_seconds = times.back();
    rows.push_back(row);
  }
  std::stable_sort(rows.begin(), rows.end(), [](const OpSummary& a, const OpSummary& b) {
    return a.total_seconds > b.total_seconds;
  });
  return rows;
}

std::string format_table(const Profile& profile, int64_t steps) {
  HAM_CHECK(steps > 0, "profiler: format_table needs steps > 0, got ", steps);
  const std::vector<OpSummary> rows = summarize(profile);
  const double wall = profile.wall_seconds, per_step = 1.0 / double(steps);
  auto share = [&](double t) { return wall > 0 ? 100.0 * t / wall : 0.0; };
  std::map<std::string, double> by_phase;
  double in_ops = 0;
  for (const OpSummary& r : rows) {
    by_phase[r.phase] += r.total_seconds;
    in_ops += r.total_seconds;
  }
  char line[512];
  std::string out;
  std::snprintf(line, sizeof(line), "profile: %lld steps, %.3f ms a step on the host clock\n",
                static_cast<long long>(steps), 1e3 * wall * per_step);
  out += line;
  out += "  time in ops by phase:";
  for (const auto& [phase, total] : by_phase) {
    std::snprintf(line, sizeof(line), " %s %.1f%%", phase.c_str(), share(total));
    out += line;
  }
  // Device ops are timed on the device: where it runs behind the host, this goes negative.
  std::snprintf(line, sizeof(line), "; outside ops %.1f%%\n", 100.0 - share(in_ops));
  out += line;
  int phase_width = 5, op_width = 2;  // the columns fit the longest names
  for (const OpSummary& r : rows) {
    phase_width = std::max(phase_width, int(r.phase.size()));
    op_width = std::max(op_width, int(r.op.size()));
  }
  std::snprintf(line, sizeof(line), "  %-*s %-*s %-7s %10s %10s %7s %10s %10s\n", phase_width,
                "phase", op_width, "op", "device", "calls/step", "ms/step", "share", "median ms",
                "max ms");
  out += line;
  for (const OpSummary& r : rows) {
    std::snprintf(line, sizeof(line), "  %-*s %-*s %-7s %10.1f %10.3f %6.1f%% %10.3f %10.3f\n",
                  phase_width, r.phase.c_str(), op_width, r.op.c_str(), r.device.c_str(),
                  double(r.calls) * per_step, 1e3 * r.total_seconds * per_step,
                  share(r.total_seconds), 1e3 * r.median_seconds, 1e3 * r.max_seconds);
    out += line;
  }
  return out;
}

std::string format_slowest_calls(const Profile& profile, size_t count) {
  std::vector<const OpCall*> calls;
  for (const OpCall& c : profile.calls) calls.push_back(&c);
  count = std::min(count, calls.size());
  std::partial_sort(calls.begin(), calls.begin() + int64_t(count), calls.end(),
                    [](const OpCall* a, const OpCall* b) { return a->seconds > b->seconds; });
  calls.resize(count);
  int phase_width = 5, op_width = 2;
  for (const OpCall* c : calls) {
    phase_width = std::max(phase_width, int(std::strlen(c->phase)));
    op_width = std::max(op_width, int(std::strlen(c->op)));
  }
  char line[512];
  std::snprintf(line, sizeof(line), "  the %zu slowest calls:\n  %-*s %-*s %-7s %10s  %s\n", count,
                phase_width, "phase", op_width, "op", "device", "ms", "tensors");
  std::string out = line;
  for (const OpCall* c : calls) {
    std::snprintf(line, sizeof(line), "  %-*s %-*s %-7s %10.3f  ", phase_width, c->phase,
                  op_width, c->op, c->device.str().c_str(), 1e3 * c->seconds);
    out += line;
    out += c->tensors + "\n";
  }
  return out;
}

void write_chrome_trace(const Profile& profile, const std::string& path) {
  nlohmann::json events = nlohmann::json::array();
  std::map<std::string, int> tracks;  // a device's track (Chrome's "tid")
  for (const OpCall& c : profile.calls) {
    auto [it, added] = tracks.emplace(c.device.str(), int(tracks.size()) + 1);
    if (added) {
      events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 1}, {"tid", it->second},
                        {"args", {{"name", it->first}}}});
    }
    events.push_back({{"name", c.op}, {"cat", c.phase}, {"ph", "X"}, {"pid", 1},
                      {"tid", it->second}, {"ts", 1e6 * c.start}, {"dur", 1e6 * c.seconds},
                      {"args", {{"tensors", c.tensors}}}});
  }
  const nlohmann::json trace = {{"traceEvents", events}, {"displayTimeUnit", "ms"}};
  write_file_atomically(path, trace.dump() + "\n");
}

}  // namespace ham::profiler
