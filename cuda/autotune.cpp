// The autotuner of cuda/autotune.h: each combination of an op's tuned settings timed with
// CUDA events on the current stream, the fastest kept per (op, shape).
#include "cuda/autotune.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "core/error.h"
#include "core/kernel_settings.h"
#include "cuda/check.h"
#include "cuda/stream.h"

namespace ham::cuda {

namespace {

std::atomic<bool> g_autotune{false};
std::atomic<int64_t> g_trial_calls{0};

// A value for each tuned setting, by name.
using Combination = std::vector<std::pair<std::string, std::string>>;

struct Kept {
  AutotuneChoice choice;
  Combination combination;
};

struct Tuner {
  std::mutex mutex;
  AutotunePlan plan;
  std::vector<Kept> kept;  // in the order chosen
  // (op, shape and the settings' names) -> kept
  std::map<std::pair<std::string, std::string>, size_t> by_key;
};

Tuner& tuner() {
  static Tuner instance;
  return instance;
}

// Whether a combination tries a setting's other value where no kernel reads it
// (TunedSetting::only_where).
bool repeats_another(const std::vector<TunedSetting>& settings, const Combination& c) {
  for (size_t i = 0; i < settings.size(); ++i) {
    if (c[i].second == settings[i].values[0]) continue;
    for (const auto& [name, value] : settings[i].only_where) {
      for (const auto& [other, other_value] : c) {
        if (other == name && other_value != value) return true;
      }
    }
  }
  return false;
}

// Every combination of the settings' values, the first setting's changing slowest, less
// those that repeat another (TunedSetting::only_where); the first combination is every
// setting's default.
std::vector<Combination> combinations(const std::vector<TunedSetting>& settings) {
  for (const TunedSetting& setting : settings) {
    for (const auto& [name, value] : setting.only_where) {
      const auto named = std::find_if(settings.begin(), settings.end(),
                                      [&](const TunedSetting& s) { return s.name == name; });
      HAM_CHECK(named != settings.end() && named->name != setting.name, "autotune: kernel "
                "setting ", setting.name, " is tried only where ", name, "=", value,
                ", which is not another of the tuned settings");
      HAM_CHECK(std::find(named->values.begin(), named->values.end(), value) !=
                    named->values.end(),
                "autotune: kernel setting ", setting.name, " is tried only where ", name, "=",
                value, ", a value ", name, " is not tuned over");
    }
  }
  std::vector<Combination> all = {Combination{}};
  for (const TunedSetting& setting : settings) {
    HAM_CHECK(!setting.values.empty(), "autotune: kernel setting ", setting.name,
              " is tuned over no values");
    std::vector<Combination> longer;
    for (const Combination& partial : all) {
      for (const std::string& value : setting.values) {
        Combination c = partial;
        c.emplace_back(setting.name, value);
        longer.push_back(std::move(c));
      }
    }
    all = std::move(longer);
  }
  std::erase_if(all, [&](const Combination& c) { return repeats_another(settings, c); });
  return all;
}

std::string label_of(const Combination& c) {
  std::string label;
  for (const auto& [name, value] : c) label += (label.empty() ? "" : " ") + name + "=" + value;
  return label.empty() ? "(no settings)" : label;
}

// The settings of a combination, each checked to have been at its default (a setting set by
// hand would be overridden without a word), restored in reverse order on leaving.
class AppliedCombination {
 public:
  AppliedCombination(const std::string& op, const std::vector<TunedSetting>& settings,
                     const Combination& c) {
    HAM_CHECK(c.size() == settings.size(), "autotune (", op, "): a combination of ", c.size(),
              " settings for ", settings.size(), " tuned ones");
    for (size_t i = 0; i < c.size(); ++i) {
      const std::string previous = exchange_kernel_setting(c[i].first, c[i].second);
      restore_.emplace_back(c[i].first, previous);
      const std::vector<std::string>& values = settings[i].values;
      if (previous != values[0]) {
        restore();
        std::string listed;
        for (const std::string& v : values) listed += (listed.empty() ? "" : ", ") + v;
        HAM_FAIL("autotune (", op, "): kernel setting ", c[i].first, " is ", previous,
                 ", not its default ", values[0], ", while autotune chooses it per shape from ",
                 listed, ": set one or the other");
      }
    }
  }
  ~AppliedCombination() { restore(); }
  AppliedCombination(const AppliedCombination&) = delete;
  AppliedCombination& operator=(const AppliedCombination&) = delete;

 private:
  void restore() {
    for (auto it = restore_.rbegin(); it != restore_.rend(); ++it) {
      exchange_kernel_setting(it->first, it->second);
    }
    restore_.clear();
  }
  Combination restore_;
};

// One call of the op for tuning; whether it took its tuned path.
bool trial(const std::function<bool()>& run) {
  g_trial_calls.fetch_add(1);
  return run();
}

// "0.912" (ms) or "0.91" (a ratio).
std::string fixed(double value, int decimals) {
  char text[32];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}

// An output as it is on the host (undefined where the output is): what a combination must
// match.
Tensor host_copy(const TunedOutput& output) {
  HAM_CHECK(output.tensor != nullptr, "autotune: output ", output.name, " names no tensor");
  const Tensor& t = *output.tensor;
  return t.defined() ? t.to(Device::cpu()) : Tensor();
}

size_t bytes_of(const Tensor& host) { return host.defined() ? host.nbytes() : 0; }

// Stops tuning where combination `label` left an output other than the defaults left it.
void check_outputs_equal(const std::string& op, const TuneProblem& problem,
                         const std::string& label, const std::vector<Tensor>& defaults) {
  for (size_t i = 0; i < problem.outputs.size(); ++i) {
    const TunedOutput& output = problem.outputs[i];
    const Tensor host = host_copy(output);
    const size_t size = bytes_of(host);
    HAM_CHECK(size == bytes_of(defaults[i]), "autotune (", op, ", ", problem.shape, "): ", label,
              " left output ", output.name, " of ", size, " bytes where the defaults left ",
              bytes_of(defaults[i]));
    if (size == 0) continue;
    const auto* bytes = static_cast<const unsigned char*>(host.raw_data());
    const auto* expected = static_cast<const unsigned char*>(defaults[i].raw_data());
    if (std::memcmp(bytes, expected, size) == 0) continue;
    const size_t element = dtype_size(host.dtype());
    size_t differ = 0;
    for (size_t at = 0; at < size; at += element) {
      differ += std::memcmp(bytes + at, expected + at, element) != 0 ? 1 : 0;
    }
    HAM_FAIL("autotune (", op, ", ", problem.shape, "): ", label, " wrote output ", output.name,
             " other than the defaults did, ", differ, " of ", size / element,
             " elements differing in their bits; the tuned variants must agree to the bit, so "
             "a kernel of this combination is wrong on this device (run the op's GPU tests; "
             "--set kernel.autotune=off runs the defaults untuned)");
  }
}

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 == 1 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

bool set_autotune(bool on) { return g_autotune.exchange(on); }

bool autotune_enabled() { return g_autotune.load(); }

AutotunePlan exchange_autotune_plan(const AutotunePlan& plan) {
  HAM_CHECK(plan.rounds >= 1 && plan.reps >= 1, "exchange_autotune_plan: ", plan.rounds,
            " rounds of ", plan.reps, " calls; each must be at least 1");
  HAM_CHECK(plan.margin >= 0 && plan.margin < 1, "exchange_autotune_plan: margin ", plan.margin,
            " is outside [0, 1)");
  Tuner& t = tuner();
  std::lock_guard<std::mutex> lock(t.mutex);
  return std::exchange(t.plan, plan);
}

std::vector<AutotuneChoice> autotune_choices() {
  Tuner& t = tuner();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<AutotuneChoice> all;
  for (const Kept& k : t.kept) all.push_back(k.choice);
  return all;
}

void forget_autotune_choices() {
  Tuner& t = tuner();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.kept.clear();
  t.by_key.clear();
}

int64_t autotune_trial_calls() { return g_trial_calls.load(); }

int choose_variant(const std::vector<double>& medians, double margin) {
  HAM_CHECK(!medians.empty(), "choose_variant: no times");
  for (double m : medians) {
    HAM_CHECK(std::isfinite(m) && m >= 0, "choose_variant: a time of ", m, " ms");
  }
  const int fastest = int(std::min_element(medians.begin(), medians.end()) - medians.begin());
  return fastest != 0 && medians[size_t(fastest)] < medians[0] * (1.0 - margin) ? fastest : 0;
}

std::string describe(const AutotuneChoice& c) {
  HAM_CHECK(!c.variants.empty() && c.chosen >= 0 && size_t(c.chosen) < c.variants.size(),
            "describe: a choice of ", c.chosen, " among ", c.variants.size(), " variants");
  const TunedVariant& defaults = c.variants[0];
  const TunedVariant& chosen = c.variants[size_t(c.chosen)];
  auto ratio = [&](const TunedVariant& v) {
    return fixed(v.median_ms / defaults.median_ms, 2) + "x";
  };
  std::string line = "autotune: " + c.op + ", " + c.shape + ": ";
  if (c.chosen != 0) {
    line += chosen.label + " at " + fixed(chosen.median_ms, 3) + " ms, " + ratio(chosen) +
            " the defaults' " + fixed(defaults.median_ms, 3) + " ms";
  } else {
    line += "the defaults (" + defaults.label + ") at " + fixed(defaults.median_ms, 3) + " ms";
    if (c.variants.size() > 1) {
      size_t other = 1;
      for (size_t i = 2; i < c.variants.size(); ++i) {
        if (c.variants[i].median_ms < c.variants[other].median_ms) other = i;
      }
      line += "; the fastest other, " + c.variants[other].label + ", took " +
              ratio(c.variants[other]) + " their time: not faster by the margin of " +
              fixed(100 * c.margin, 0) + "%";
    }
  }
  return line + " (" + std::to_string(c.variants.size()) + " combinations, medians)";
}

bool run_tuned_problem(const std::string& op, const TuneProblem& problem,
                       const std::function<bool()>& run) {
  // Keyed by the settings' names too: where they change for a shape (another kernel set
  // by hand, e.g.), the shape is tuned again over the new ones.
  std::string names;
  for (const TunedSetting& setting : problem.settings) names += " " + setting.name;
  const std::pair<std::string, std::string> key{op, problem.shape + " |" + names};
  Tuner& t = tuner();
  AutotunePlan plan;
  Combination kept;
  bool tuned = false;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    plan = t.plan;
    const auto it = t.by_key.find(key);
    if (it != t.by_key.end()) {
      kept = t.kept[it->second].combination;
      tuned = true;
    }
  }
  if (tuned) {
    AppliedCombination applied(op, problem.settings, kept);
    return run();
  }
  const std::vector<Combination> all = combinations(problem.settings);
  std::vector<Tensor> defaults_outputs;
  {  // the defaults, untimed: does the op take its tuned path here at all?
    AppliedCombination applied(op, problem.settings, all[0]);
    if (!trial(run)) return false;
    for (const TunedOutput& output : problem.outputs) defaults_outputs.push_back(host_copy(output));
  }
  // Each once untimed (first launches, allocations), its outputs against the defaults'.
  for (size_t i = 1; i < all.size(); ++i) {
    AppliedCombination applied(op, problem.settings, all[i]);
    HAM_CHECK(trial(run), "autotune (", op, ", ", problem.shape, "): ", label_of(all[i]),
              " did not take the path the defaults took");
    check_outputs_equal(op, problem, label_of(all[i]), defaults_outputs);
  }
  int device = 0;
  HAM_CUDA_CHECK(cudaGetDevice(&device));
  const cudaStream_t stream = current_stream(device);
  std::vector<std::vector<double>> times(all.size());
  for (int round = 0; round < plan.rounds; ++round) {
    for (size_t i = 0; i < all.size(); ++i) {
      AppliedCombination applied(op, problem.settings, all[i]);
      Event start(device, /*timing=*/true), stop(device, /*timing=*/true);
      start.record(stream);
      for (int rep = 0; rep < plan.reps; ++rep) trial(run);
      stop.record(stream);
      stop.synchronize();
      times[i].push_back(double(stop.elapsed_ms_since(start)) / plan.reps);
    }
  }
  AutotuneChoice choice{op, problem.shape, {}, 0, plan.margin};
  std::vector<double> medians;
  for (size_t i = 0; i < all.size(); ++i) {
    medians.push_back(median_of(times[i]));
    choice.variants.push_back({label_of(all[i]), medians.back()});
  }
  choice.chosen = choose_variant(medians, plan.margin);
  const Combination& chosen = all[size_t(choice.chosen)];
  {  // once more under the choice, so that the op's outputs are that call's
    AppliedCombination applied(op, problem.settings, chosen);
    trial(run);
  }
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    if (!t.by_key.count(key)) {  // another thread may have tuned the same shape meanwhile
      t.by_key.emplace(key, t.kept.size());
      t.kept.push_back({choice, chosen});
    }
  }
  write_kernel_note(describe(choice));
  return true;
}

}  // namespace ham::cuda
