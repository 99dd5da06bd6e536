// The autotuner (cuda/autotune.h) on settings of its own: an op whose calls sleep as long as
// two test-only settings say, timed with CUDA events, so that the fastest combination is
// known, and an op whose output a setting changes. The tuned kernels' bit-equality is tested
// beside each op (GatedDeltaRule.GpuAutotunedEqualsDefaults,
// RoutedAttentionGpu.Bf16AutotunedPassesEqualTheDefaults).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <limits>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/kernel_settings.h"
#include "tests/testing.h"

#if HAM_WITH_CUDA
#include "cuda/autotune.h"

namespace ham::cuda {
namespace {

// Two settings of milliseconds, registered once a process: the op sleeps their sum.
int g_first_ms = 6, g_second_ms = 4;

void register_delays() {
  static const bool registered = [] {
    for (auto [name, value] : {std::pair{"test_only_tune_first_ms", &g_first_ms},
                               std::pair{"test_only_tune_second_ms", &g_second_ms}}) {
      register_kernel_setting({name, "milliseconds", [name, value](const std::string& text) {
                                 return std::to_string(
                                     std::exchange(*value, parse_setting_int(text, name)));
                               }});
    }
    return true;
  }();
  ASSERT_TRUE(registered);
}

// Defaults first: 6 + 4 = 10 ms; the fastest is 2 + 0.
const std::vector<TunedSetting> kDelays = {{"test_only_tune_first_ms", {"6", "2"}},
                                           {"test_only_tune_second_ms", {"4", "0", "8"}}};

// Autotune on with one timed call a combination, the choices forgotten; all undone after.
class ShortTuning {
 public:
  ShortTuning() : was_on_(set_autotune(true)), plan_(exchange_autotune_plan({1, 1, 0.02})) {
    forget_autotune_choices();
  }
  ~ShortTuning() {
    set_autotune(was_on_);
    exchange_autotune_plan(plan_);
    forget_autotune_choices();
  }

 private:
  bool was_on_;
  AutotunePlan plan_;
};

// The op: sleeps the settings' sum and records each call's.
struct SleepingOp {
  std::vector<int> calls_ms;
  bool takes_path = true;
  bool operator()() {
    const int ms = g_first_ms + g_second_ms;
    calls_ms.push_back(ms);
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    return takes_path;
  }
};

// Why this run cannot time a host sleep (empty where it can): HAM_EMULATOR_STREAMS=
// default_late holds the default stream's work until a wait, so the events around the
// sleep complete together.
std::string sleeps_untimed_because() {
  const char* held = std::getenv("HAM_EMULATOR_STREAMS");
  if (held == nullptr || std::string(held) != "default_late") return "";
  return std::string("HAM_EMULATOR_STREAMS=") + held + " holds the default stream's work until "
         "a wait, so the events around a host sleep complete together: nothing to time";
}

TEST(AutotuneCuda, ChoosesTheFastestCombinationAndKeepsItPerShape) {
  HAM_SKIP_UNLESS_CUDA();
  if (const std::string why = sleeps_untimed_because(); !why.empty()) GTEST_SKIP() << why;
  register_delays();
  const ShortTuning tuning;
  std::vector<std::string> notes;
  set_kernel_note_sink([&notes](const std::string& line) { notes.push_back(line); });
  SleepingOp op;
  const int64_t trials = autotune_trial_calls();
  EXPECT_TRUE(run_tuned_problem("sleeping op", {"shape a", kDelays, {}}, std::ref(op)));
  set_kernel_note_sink(nullptr);
  // 6 combinations: each once untimed, once timed, then once more under the choice.
  EXPECT_EQ(autotune_trial_calls() - trials, 13);
  ASSERT_EQ(op.calls_ms.size(), 13u);
  EXPECT_EQ(op.calls_ms.front(), 10) << "the defaults first";
  EXPECT_EQ(op.calls_ms.back(), 2) << "the last call runs under the choice";
  EXPECT_EQ(g_first_ms, 6) << "restored after the call";
  EXPECT_EQ(g_second_ms, 4);
  const std::vector<AutotuneChoice> choices = autotune_choices();
  ASSERT_EQ(choices.size(), 1u);
  ASSERT_EQ(choices[0].variants.size(), 6u);
  EXPECT_EQ(choices[0].variants[0].label, "test_only_tune_first_ms=6 test_only_tune_second_ms=4");
  EXPECT_EQ(choices[0].variants[size_t(choices[0].chosen)].label,
            "test_only_tune_first_ms=2 test_only_tune_second_ms=0");
  for (const TunedVariant& v : choices[0].variants) {
    EXPECT_GE(v.median_ms, 0.9 * (std::stoi(v.label.substr(v.label.find('=') + 1)) +
                                  std::stoi(v.label.substr(v.label.rfind('=') + 1))))
        << v.label << ": the time is the call's";
  }
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_EQ(notes[0], describe(choices[0]));
  EXPECT_NE(notes[0].find("autotune: sleeping op, shape a: test_only_tune_first_ms=2 "
                          "test_only_tune_second_ms=0 at "),
            std::string::npos)
      << notes[0];

  // The same shape again: one call, under the choice, no tuning.
  op.calls_ms.clear();
  EXPECT_TRUE(run_tuned_problem("sleeping op", {"shape a", kDelays, {}}, std::ref(op)));
  EXPECT_EQ(op.calls_ms, std::vector<int>{2});
  EXPECT_EQ(g_first_ms, 6);
  EXPECT_EQ(autotune_choices().size(), 1u);
  // Another shape, another op at that shape, or other settings tune again.
  EXPECT_TRUE(run_tuned_problem("sleeping op", {"shape b", kDelays, {}}, std::ref(op)));
  EXPECT_TRUE(run_tuned_problem("other op", {"shape a", kDelays, {}}, std::ref(op)));
  EXPECT_TRUE(run_tuned_problem("sleeping op", {"shape a", {kDelays[1]}, {}}, std::ref(op)));
  EXPECT_EQ(autotune_choices().size(), 4u);
  EXPECT_EQ(autotune_trial_calls() - trials, 13 + 2 * 13 + (3 * 2 + 1));
}

TEST(AutotuneCuda, OffRunsTheOpOnceAsSet) {
  HAM_SKIP_UNLESS_CUDA();
  register_delays();
  const bool was_on = set_autotune(false);
  forget_autotune_choices();
  SleepingOp op;
  const int64_t trials = autotune_trial_calls();
  bool described = false;
  EXPECT_TRUE(run_tuned("sleeping op",
                        [&] {
                          described = true;
                          return TuneProblem{"shape a", kDelays, {}};
                        },
                        std::ref(op)));
  EXPECT_EQ(op.calls_ms, std::vector<int>{10});
  EXPECT_FALSE(described) << "the problem is described only where autotune is on";
  EXPECT_EQ(autotune_trial_calls(), trials);
  EXPECT_TRUE(autotune_choices().empty());
  set_autotune(was_on);
}

TEST(AutotuneCuda, AnOpOffItsTunedPathTunesNothing) {
  HAM_SKIP_UNLESS_CUDA();
  register_delays();
  const ShortTuning tuning;
  SleepingOp op;
  op.takes_path = false;
  EXPECT_FALSE(run_tuned_problem("sleeping op", {"shape a", kDelays, {}}, std::ref(op)));
  EXPECT_EQ(op.calls_ms, std::vector<int>{10}) << "one call, as set";
  EXPECT_TRUE(autotune_choices().empty());
}

TEST(AutotuneCuda, ATunedSettingSetByHandIsAnError) {
  HAM_SKIP_UNLESS_CUDA();
  register_delays();
  const ShortTuning tuning;
  SleepingOp op;
  apply_kernel_setting("test_only_tune_second_ms", "8");
  testing::expect_error(
      [&] { run_tuned_problem("sleeping op", {"shape a", kDelays, {}}, std::ref(op)); },
      {"autotune (sleeping op): kernel setting test_only_tune_second_ms is 8, not its default 4",
       "chooses it per shape from 4, 0, 8", "set one or the other"});
  EXPECT_TRUE(op.calls_ms.empty());
  EXPECT_EQ(g_first_ms, 6) << "the settings as they were";
  EXPECT_EQ(g_second_ms, 8);
  apply_kernel_setting("test_only_tune_second_ms", "4");
}

// Each combination's first call leaves the op's outputs as the defaults' did, to the bit, or
// tuning stops naming the combination, the output and how many of its elements differ: a
// -0 where the defaults wrote +0 differs too. Nothing is kept and the settings are restored.
TEST(AutotuneCuda, ACombinationWritingOtherBitsThanTheDefaultsIsAnError) {
  HAM_SKIP_UNLESS_CUDA();
  register_delays();
  const ShortTuning tuning;
  Tensor out = Tensor::zeros({3, 5}, DType::BF16, Device::cuda());
  Tensor lse = Tensor::zeros({4}, DType::F32, Device::cuda());
  Tensor not_written;  // undefined: passed over
  const std::vector<TunedOutput> outputs = {
      {"out", &out}, {"not written", &not_written}, {"lse", &lse}};
  // out the same in every combination, lse -0 where the second setting is 0: the
  // defaults (6, 4) pass (6, 0) second.
  auto op = [&] {
    out.fill_(0.75);
    lse.fill_(g_second_ms == 0 ? -0.0 : 0.0);
    return true;
  };
  testing::expect_error(
      [&] { run_tuned_problem("writing op", {"shape a", kDelays, outputs}, op); },
      {"autotune (writing op, shape a): test_only_tune_first_ms=6 test_only_tune_second_ms=0 "
       "wrote output lse other than the defaults did, 4 of 4 elements differing in their bits",
       "a kernel of this combination is wrong on this device"});
  EXPECT_TRUE(autotune_choices().empty());
  EXPECT_EQ(g_first_ms, 6) << "restored";
  EXPECT_EQ(g_second_ms, 4);
  // One element off in out, where the first setting is 2 (combination 4 of 6).
  auto one_off = [&] {
    out.fill_(0.75);
    if (g_first_ms == 2) out.slice(1, 2).copy_(Tensor::full({1, 5}, 0.5, DType::BF16));
    lse.fill_(1.0);
    return true;
  };
  testing::expect_error(
      [&] { run_tuned_problem("writing op", {"shape a", kDelays, outputs}, one_off); },
      {"test_only_tune_first_ms=2 test_only_tune_second_ms=4 wrote output out other than the "
       "defaults did, 5 of 15 elements"});
  // Outputs equal in every combination: tuned, the choice kept.
  auto same = [&] {
    out.fill_(0.75);
    lse.fill_(1.0);
    return true;
  };
  EXPECT_TRUE(run_tuned_problem("writing op", {"shape a", kDelays, outputs}, same));
  EXPECT_EQ(autotune_choices().size(), 1u);
}

// A setting the kernels read only under another's value (TunedSetting::only_where) is tried
// at its other values only there: the second setting's 0 and 8 only where the first is 2,
// so 4 combinations of the 6, the defaults still first, and the choice among them by their
// own times. A condition on a setting not tuned, or on a value not tuned over, is an error
// naming both.
TEST(AutotuneCuda, ASettingReadOnlyUnderAnothersValueIsTriedOnlyThere) {
  HAM_SKIP_UNLESS_CUDA();
  register_delays();
  const ShortTuning tuning;
  SleepingOp op;
  const std::vector<TunedSetting> settings = {
      kDelays[0], {kDelays[1].name, kDelays[1].values, {{"test_only_tune_first_ms", "2"}}}};
  const int64_t trials = autotune_trial_calls();
  EXPECT_TRUE(run_tuned_problem("sleeping op", {"shape a", settings, {}}, std::ref(op)));
  EXPECT_EQ(autotune_trial_calls() - trials, 4 * 2 + 1);
  const std::vector<AutotuneChoice> choices = autotune_choices();
  ASSERT_EQ(choices.size(), 1u);
  std::vector<std::string> labels;
  for (const TunedVariant& v : choices[0].variants) labels.push_back(v.label);
  EXPECT_EQ(labels, (std::vector<std::string>{
                        "test_only_tune_first_ms=6 test_only_tune_second_ms=4",
                        "test_only_tune_first_ms=2 test_only_tune_second_ms=4",
                        "test_only_tune_first_ms=2 test_only_tune_second_ms=0",
                        "test_only_tune_first_ms=2 test_only_tune_second_ms=8"}));
  if (sleeps_untimed_because().empty()) {
    EXPECT_EQ(op.calls_ms.back(), 2)
        << "the last call runs under the choice: 2 + 0 ms, the fastest of 10, 6, 2 and 10";
  }
  forget_autotune_choices();
  testing::expect_error(
      [&] {
        run_tuned_problem("sleeping op",
                          {"shape a",
                           {kDelays[0], {kDelays[1].name, kDelays[1].values, {{"absent", "1"}}}},
                           {}},
                          std::ref(op));
      },
      {"autotune: kernel setting test_only_tune_second_ms is tried only where absent=1, which "
       "is not another of the tuned settings"});
  testing::expect_error(
      [&] {
        run_tuned_problem("sleeping op",
                          {"shape a",
                           {kDelays[0],
                            {kDelays[1].name, kDelays[1].values,
                             {{"test_only_tune_first_ms", "3"}}}},
                           {}},
                          std::ref(op));
      },
      {"is tried only where test_only_tune_first_ms=3, a value test_only_tune_first_ms is not "
       "tuned over"});
  EXPECT_TRUE(autotune_choices().empty());
  EXPECT_EQ(g_first_ms, 6) << "restored";
  EXPECT_EQ(g_second_ms, 4);
}

TEST(Autotune, KeepsTheDefaultsUnlessAnotherIsFasterByTheMargin) {
  EXPECT_EQ(choose_variant({1.0}, 0.02), 0);
  EXPECT_EQ(choose_variant({1.0, 0.99, 1.2}, 0.02), 0) << "1% faster: within the margin";
  EXPECT_EQ(choose_variant({1.0, 0.97, 1.2}, 0.02), 1);
  EXPECT_EQ(choose_variant({1.0, 0.5, 0.4, 0.45}, 0.02), 2) << "the fastest, not the first";
  EXPECT_EQ(choose_variant({1.0, 1.0}, 0.0), 0) << "a tie keeps the defaults";
  EXPECT_EQ(choose_variant({1.0, 0.999}, 0.0), 1);
  testing::expect_error([] { choose_variant({}, 0.02); }, {"choose_variant: no times"});
  testing::expect_error([] { choose_variant({1.0, -1.0}, 0.02); }, {"a time of -1 ms"});
  testing::expect_error(
      [] { choose_variant({1.0, std::numeric_limits<double>::quiet_NaN()}, 0.02); },
      {"choose_variant: a time of nan ms"});
  testing::expect_error([] { exchange_autotune_plan({0, 2, 0.02}); },
                        {"exchange_autotune_plan: 0 rounds of 2 calls"});
  testing::expect_error([] { exchange_autotune_plan({3, 2, 1.0}); },
                        {"exchange_autotune_plan: margin 1 is outside [0, 1)"});
}

TEST(Autotune, DescribesTheChoiceInOneLine) {
  AutotuneChoice c{"op", "bf16 B1 T64", {{"a=1", 2.0}, {"a=2", 1.5}, {"a=3", 1.99}}, 1, 0.02};
  EXPECT_EQ(describe(c),
            "autotune: op, bf16 B1 T64: a=2 at 1.500 ms, 0.75x the defaults' 2.000 ms "
            "(3 combinations, medians)");
  c.chosen = 0;
  c.variants[1].median_ms = 1.98;
  EXPECT_EQ(describe(c),
            "autotune: op, bf16 B1 T64: the defaults (a=1) at 2.000 ms; the fastest other, "
            "a=2, took 0.99x their time: not faster by the margin of 2% (3 combinations, "
            "medians)");
}

}  // namespace
}  // namespace ham::cuda
#endif
