#include "core/profiler.h"

#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core/ops/gated_delta_rule.h"
#include "core/ops/matmul.h"
#include "core/tensor.h"
#include "tests/testing.h"

namespace ham {
namespace {

namespace fs = std::filesystem;
using profiler::OpScope;
using profiler::Phase;

const profiler::OpSummary* find_row(const std::vector<profiler::OpSummary>& rows,
                                    const std::string& phase, const std::string& op) {
  for (const auto& r : rows) {
    if (r.phase == phase && r.op == op) return &r;
  }
  return nullptr;
}

void busy_for(std::chrono::microseconds time) {
  const auto until = std::chrono::steady_clock::now() + time;
  while (std::chrono::steady_clock::now() < until) {
  }
}

TEST(Profiler, RecordsNothingWhenNotStarted) {
  EXPECT_FALSE(profiler::active());
  { OpScope scope("idle", Device::cpu()); }
  profiler::start();
  const profiler::Profile profile = profiler::stop();
  EXPECT_TRUE(profile.calls.empty());
  EXPECT_GE(profile.wall_seconds, 0.0);
}

TEST(Profiler, StartTwiceOrStopWithoutStartIsAnError) {
  EXPECT_THROW(profiler::stop(), Error);
  profiler::start();
  EXPECT_THROW(profiler::start(), Error);
  profiler::stop();
  EXPECT_FALSE(profiler::active());
}

// Each outermost call is filed under the phase around it; a call inside another is part of
// the outer one; phases nest and restore.
TEST(Profiler, FilesOutermostCallsByPhaseAndOp) {
  profiler::start();
  {
    Phase forward("forward");
    for (int i = 0; i < 3; ++i) {
      OpScope outer("outer", Device::cpu());
      busy_for(std::chrono::microseconds(200));
      OpScope inner("inner", Device::cpu());  // not timed: inside "outer"
    }
    {
      Phase backward("backward");
      OpScope outer("outer", Device::cpu());
    }
    OpScope after("after", Device::cpu());  // forward again
  }
  { OpScope none("loose", Device::cpu()); }
  const profiler::Profile profile = profiler::stop();
  ASSERT_EQ(profile.calls.size(), 6u);
  const auto rows = profiler::summarize(profile);
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(find_row(rows, "forward", "inner"), nullptr);
  const auto* outer = find_row(rows, "forward", "outer");
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(outer->calls, 3);
  EXPECT_EQ(outer->device, "cpu");
  EXPECT_GE(outer->median_seconds, 200e-6);
  EXPECT_GE(outer->max_seconds, outer->median_seconds);
  EXPECT_GE(outer->total_seconds, 3 * 200e-6);
  EXPECT_EQ(rows.front().op, "outer");  // the largest total first
  ASSERT_NE(find_row(rows, "backward", "outer"), nullptr);
  EXPECT_EQ(find_row(rows, "backward", "outer")->calls, 1);
  ASSERT_NE(find_row(rows, "forward", "after"), nullptr);
  ASSERT_NE(find_row(rows, "other", "loose"), nullptr);
  // Calls in order, each inside the profile's wall time.
  for (size_t i = 0; i < profile.calls.size(); ++i) {
    const profiler::OpCall& c = profile.calls[i];
    EXPECT_GE(c.start, 0.0);
    EXPECT_LE(c.start + c.seconds, profile.wall_seconds + 1e-9);
    if (i > 0) {
      EXPECT_GE(c.start, profile.calls[i - 1].start);
    }
  }
}

// Every op reaches its kernel through a KernelTable, which times it.
TEST(Profiler, TimesOpsCalledThroughTheirKernelTables) {
  Tensor a = testing::random_tensor({64, 32}, DType::F32, Device::cpu(), 1);
  Tensor b = testing::random_tensor({32, 16}, DType::F32, Device::cpu(), 2);
  profiler::start();
  {
    Phase forward("forward");
    for (int i = 0; i < 4; ++i) ops::matmul(a, b);
  }
  const profiler::Profile profile = profiler::stop();
  const auto rows = profiler::summarize(profile);
  const auto* gemm = find_row(rows, "forward", "gemm");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->calls, 4);
  EXPECT_GT(gemm->total_seconds, 0.0);
  // Each call keeps its kernel's tensor arguments: a, b and the product.
  for (const profiler::OpCall& c : profile.calls) {
    EXPECT_EQ(c.tensors, "f32[64, 32] f32[32, 16] f32[64, 16]");
  }
}

TEST(Profiler, DescribesTensorArgumentsAndSkipsTheRest) {
  const Tensor a = Tensor::zeros({2, 3}, DType::F64), undefined;
  const std::vector<Tensor> list(63, a);
  EXPECT_EQ(profiler::describe_tensor_args(a, 1.5, undefined, "x", list),
            "f64[2, 3] undefined 63 tensors");
  EXPECT_EQ(profiler::describe_tensor_args(7, 'c'), "");
  EXPECT_EQ(profiler::describe_tensor_args(), "");
  // A struct that lists its tensors (for_each_tensor), member by member.
  GatedDeltaRuleArgs gdr;
  gdr.q = gdr.k = Tensor::zeros({1, 4, 2, 8});
  gdr.v = Tensor::zeros({1, 4, 2, 6});
  gdr.g = gdr.beta = Tensor::zeros({1, 4, 2});
  EXPECT_EQ(profiler::describe_tensor_args(gdr, 0.5),
            "f32[1, 4, 2, 8] f32[1, 4, 2, 8] f32[1, 4, 2, 6] f32[1, 4, 2] f32[1, 4, 2] undefined "
            "undefined");
}

// The slowest calls, slowest first, each with its tensors; no more than there are.
TEST(Profiler, SlowestCallsComeFirstWithTheirTensors) {
  profiler::Profile profile;
  profile.wall_seconds = 1.0;
  const Device cpu = Device::cpu();
  profile.calls = {{"sum_to", "backward", cpu, 0.0, 0.004,
                    "f32[8, 128, 4, 48] f32[8, 128, 4, 1]"},
                   {"gemm", "forward", cpu, 0.1, 0.002, "f32[1024, 128] f32[128, 384]"},
                   {"unary", "forward", cpu, 0.2, 0.001, "f32[1024, 384] f32[1024, 384]"}};
  const std::string two = profiler::format_slowest_calls(profile, 2);
  EXPECT_NE(two.find("the 2 slowest calls"), std::string::npos) << two;
  const size_t sum_to = two.find("  backward sum_to cpu          4.000  f32[8, 128, 4, 48] "
                                 "f32[8, 128, 4, 1]\n");
  const size_t gemm =
      two.find("  forward  gemm   cpu          2.000  f32[1024, 128] f32[128, 384]\n");
  EXPECT_NE(sum_to, std::string::npos) << two;
  EXPECT_NE(gemm, std::string::npos) << two;
  EXPECT_LT(sum_to, gemm) << two;
  EXPECT_EQ(two.find("unary"), std::string::npos) << two;
  EXPECT_NE(profiler::format_slowest_calls(profile, 10).find("the 3 slowest calls"),
            std::string::npos);
}

// A stand-in device clock: each mark a time the test sets, so the profile's device times
// and starts are exactly the clock's.
class ScriptedClock final : public profiler::DeviceClock {
 public:
  double now = 0;  // seconds on the "device"
  int live_marks = 0, marks_made = 0;
  Mark mark(Device) override {
    ++live_marks;
    ++marks_made;
    return new double(now);
  }
  double seconds_between(Mark from, Mark to) override {
    return *static_cast<double*>(to) - *static_cast<double*>(from);
  }
  void release(Mark mark) noexcept override {
    --live_marks;
    delete static_cast<double*>(mark);
  }
};

// Restores the device clock a test replaced.
class ClockSwap {
 public:
  explicit ClockSwap(profiler::DeviceClock* clock)
      : previous_(profiler::register_device_clock(DeviceKind::CUDA, clock)) {}
  ~ClockSwap() { profiler::register_device_clock(DeviceKind::CUDA, previous_); }

 private:
  profiler::DeviceClock* previous_;
};

TEST(Profiler, TimesDeviceOpsOnTheDeviceClockAndReleasesEveryMark) {
  ScriptedClock clock;
  ClockSwap swap(&clock);
  profiler::start();
  {
    OpScope first("kernel_a", Device::cuda(0));
    clock.now += 0.25;  // the device's time, not the host's
  }
  clock.now += 1.0;
  {
    OpScope second("kernel_b", Device::cuda(0));
    clock.now += 0.5;
  }
  {
    OpScope on_host("host_op", Device::cpu());
  }
  const profiler::Profile profile = profiler::stop();
  EXPECT_EQ(clock.marks_made, 4);
  EXPECT_EQ(clock.live_marks, 0);
  ASSERT_EQ(profile.calls.size(), 3u);
  EXPECT_DOUBLE_EQ(profile.calls[0].seconds, 0.25);
  EXPECT_DOUBLE_EQ(profile.calls[1].seconds, 0.5);
  // The second device call starts 1.25 s of device time after the first.
  EXPECT_NEAR(profile.calls[1].start - profile.calls[0].start, 1.25, 1e-12);
  EXPECT_EQ(profile.calls[1].device, Device::cuda(0));
  EXPECT_LT(profile.calls[2].seconds, 0.25);  // timed on the host
}

TEST(Profiler, ChangingTheClockWhileAProfileRunsIsAnError) {
  ScriptedClock clock;
  profiler::start();
  EXPECT_THROW(profiler::register_device_clock(DeviceKind::CUDA, &clock), Error);
  profiler::stop();
}

// Rows per step: calls and milliseconds divided by the steps, shares of the wall time.
TEST(Profiler, TableGivesCallsAndTimeAStepAndShares) {
  profiler::Profile profile;
  profile.wall_seconds = 2.0;
  const Device cpu = Device::cpu();
  profile.calls = {{"gemm", "forward", cpu, 0.0, 0.4, ""}, {"gemm", "forward", cpu, 0.5, 0.2, ""},
                   {"gemm", "backward", cpu, 1.0, 0.6, ""},
                   {"adamw_step", "optimizer", cpu, 1.7, 0.2, ""}};
  const std::string table = profiler::format_table(profile, 2);
  EXPECT_NE(table.find("profile: 2 steps, 1000.000 ms a step"), std::string::npos) << table;
  EXPECT_NE(table.find("backward 30.0% forward 30.0% optimizer 10.0%; outside ops 30.0%"),
            std::string::npos)
      << table;
  // forward gemm: 2 calls over 2 steps, 300 ms a step, 30% of the wall, median 300 ms.
  // Columns as wide as the longest phase ("optimizer") and op ("adamw_step").
  EXPECT_NE(table.find("  forward   gemm       cpu            1.0    300.000   30.0%    300.000"
                       "    400.000\n"),
            std::string::npos)
      << table;
  EXPECT_THROW(profiler::format_table(profile, 0), Error);
}

TEST(Profiler, ChromeTraceHasAnEventForEveryCallOnItsDevicesTrack) {
  profiler::Profile profile;
  profile.wall_seconds = 1.0;
  profile.calls = {{"gemm", "forward", Device::cpu(), 0.001, 0.002, ""},
                   {"routed_attention_forward", "forward", Device::cuda(0), 0.004, 0.0005,
                    "bf16[1, 4096, 16, 128]"},
                   {"gemm", "backward", Device::cpu(), 0.01, 0.003, ""}};
  const fs::path dir = testing::fresh_temp_dir("profile_trace");
  fs::create_directories(dir);
  const fs::path path = dir / "profile.json";
  profiler::write_chrome_trace(profile, path.string());
  std::ifstream in(path);
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<int, std::string> track_names;
  std::vector<nlohmann::json> events;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M") track_names[e.at("tid").get<int>()] = e.at("args").at("name");
    if (e.at("ph") == "X") events.push_back(e);
  }
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[1].at("name"), "routed_attention_forward");
  EXPECT_EQ(events[1].at("cat"), "forward");
  EXPECT_DOUBLE_EQ(events[1].at("ts").get<double>(), 4000.0);
  EXPECT_DOUBLE_EQ(events[1].at("dur").get<double>(), 500.0);
  EXPECT_EQ(events[1].at("args").at("tensors"), "bf16[1, 4096, 16, 128]");
  EXPECT_EQ(track_names.at(events[0].at("tid").get<int>()), "cpu");
  EXPECT_EQ(track_names.at(events[1].at("tid").get<int>()), "cuda:0");
  EXPECT_EQ(events[2].at("tid"), events[0].at("tid"));
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}), 1);
  try {
    profiler::write_chrome_trace(profile, (dir / "missing" / "profile.json").string());
    FAIL() << "wrote into a missing directory";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find((dir / "missing" / "profile.json").string()),
              std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

// On a GPU (or the SIMT emulator) the CUDA backend's event clock times each op.
TEST(ProfilerGpu, TimesCudaOpsByTheirEvents) {
  HAM_SKIP_UNLESS_CUDA();
  profiler::DeviceClock* events = profiler::register_device_clock(DeviceKind::CUDA, nullptr);
  profiler::register_device_clock(DeviceKind::CUDA, events);
  ASSERT_NE(events, nullptr) << "the CUDA backend registers its event clock at load time";
  Tensor a = testing::random_tensor({128, 96}, DType::F32, Device::cuda(), 3);
  Tensor b = testing::random_tensor({96, 64}, DType::F32, Device::cuda(), 4);
  profiler::start();
  {
    Phase forward("forward");
    for (int i = 0; i < 3; ++i) ops::matmul(a, b);
  }
  const profiler::Profile profile = profiler::stop();
  const auto rows = profiler::summarize(profile);
  const auto* gemm = find_row(rows, "forward", "gemm");
  ASSERT_NE(gemm, nullptr);
  EXPECT_EQ(gemm->calls, 3);
  EXPECT_EQ(gemm->device, "cuda:0");
  for (const profiler::OpCall& c : profile.calls) {
    if (std::string(c.op) != "gemm") continue;
    EXPECT_GT(c.seconds, 0.0);  // event times: the launch's span on the stream
    EXPECT_GE(c.start, 0.0);
  }
}

}  // namespace
}  // namespace ham
