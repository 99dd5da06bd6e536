#pragma once
// Per-shape choice among kernel variants that give the same results to the bit, timed on
// the device the first time an op meets a shape, as Triton's autotune does: a run then takes
// the variants that are fastest on its own GPU and shapes, with no one choosing them by hand.
//
// Where it is on (set_autotune, `ham train --set kernel.autotune=on`), each tuned op, on the
// first call of each shape, runs every combination of its tuned kernel settings
// (docs/kernel_settings.md): once untimed, then `rounds` times `reps` timed calls each, the
// combinations taking turns so that a drift of the clocks falls on all of them. It keeps the
// combination of the lowest median. The first combination (the settings' defaults) stays
// unless another is faster by more than `margin`. Every later call of that shape runs under
// the kept choice and restores the settings after it. The last tuning run is under the
// choice, so the op's outputs are its own. Each combination's first, untimed call is
// checked against the defaults' outputs bit for bit (TuneProblem::outputs).
//
// The tuned ops and their settings:
//   gated_delta_rule forward (bf16, tensor cores): prepare_warps x forward_windows;
//   gated_delta_rule backward (bf16, tensor cores): prepare_warps x recompute_windows x
//     backward_windows, and keys_ahead at K = 256;
//   routed_attention forward (bf16, on one wgmma warpgroup a block): forward_persistent;
//   routed_attention backward (bf16): key_order, where the wgmma dQ kernel runs on one
//     warpgroup dq_keys x dq_records x dq_persistent (5 that differ), and where it runs
//     zeros_in_dq;
//   both routed_attention passes also dependent_launches, where the GPU runs them (a
//     choice applies for the op's call alone, so it is that op's own switch).
// Only variants equal to the bit are tuned, so a tuned run computes what an untuned one does.
// The shape is the tensors' sizes (not the documents' boundaries nor the selection, which
// change from batch to batch: the first batch of a shape is the one timed); a shape whose
// tuned settings change (a kernel set by hand in between) is tuned again.
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace ham::cuda {

// Whether the tuned ops tune (above). Off by default: the first call of each shape then
// takes about (1 + rounds * reps) times the combinations' calls longer. A tuned setting
// set by hand to other than its default is an error while this is on (set one or the
// other). Returns the previous setting.
bool set_autotune(bool on);
bool autotune_enabled();

struct AutotunePlan {
  int rounds = 3;       // timed turns of every combination
  int reps = 2;         // calls in one timed turn
  double margin = 0.02;  // how much faster than the defaults another combination must be
};
// Replaces the plan (tests make it short) and returns the previous one; a plan of no
// rounds or reps, or a margin outside [0, 1), is an error.
AutotunePlan exchange_autotune_plan(const AutotunePlan& plan);

// A tuned setting: its name in the kernel-settings registry and its values, default first,
// as the setting writes them ("32", "on"). Where the kernels read it only under other tuned
// settings' values (`only_where`: name, value), its other values are tried only there: a
// combination elsewhere would run the same kernels as one with its default, and time them
// twice.
struct TunedSetting {
  std::string name;
  std::vector<std::string> values;
  std::vector<std::pair<std::string, std::string>> only_where = {};
};

// A tensor the tuned op writes in full on each call, by the caller's variable (read after
// each call, so an output the op allocates is seen too); undefined ones are passed over.
struct TunedOutput {
  std::string name;
  const Tensor* tensor = nullptr;
};

// What an op tunes for one call: the shape (its key), the settings, and its outputs. Each
// combination's first call must leave every output as the defaults' first call did, to the
// bit; else tuning stops with an error naming the combination and the output, so that a
// variant that is wrong on the device at hand can neither be chosen nor go unseen.
struct TuneProblem {
  std::string shape;
  std::vector<TunedSetting> settings;
  std::vector<TunedOutput> outputs;
};

// One combination's label ("prepare_warps=8 forward_windows=4") and its median time.
struct TunedVariant {
  std::string label;
  double median_ms = 0;
};

// The choice for an op at a shape, with every combination's time (variants[0]: defaults).
struct AutotuneChoice {
  std::string op, shape;
  std::vector<TunedVariant> variants;
  int chosen = 0;      // index into variants
  double margin = 0;   // the plan's when chosen
};

// The choices made so far in this process, in the order made.
std::vector<AutotuneChoice> autotune_choices();
// Forgets them (the next call of each shape tunes again).
void forget_autotune_choices();
// The choice as one line: the op, the shape, the chosen combination, its time and the
// defaults'.
std::string describe(const AutotuneChoice& choice);

// How many calls of tuned ops ran to time their variants in this process (tests).
int64_t autotune_trial_calls();

// Index of the combination to keep from their medians (medians[0]: the defaults): the
// fastest, where faster than the defaults by more than `margin` (a fraction), else 0.
int choose_variant(const std::vector<double>& medians, double margin);

// For the ops: runs `run` under the choice for (op, problem's shape), tuning first where
// autotune is on and the shape is new. `run` returns whether the op took its tuned path;
// where its first call returns false nothing is tuned and false is returned.
bool run_tuned_problem(const std::string& op, const TuneProblem& problem,
                       const std::function<bool()>& run);

// As above, with `describe` called only where autotune is on.
template <class Describe, class Run>
bool run_tuned(const char* op, Describe&& describe, Run&& run) {
  if (!autotune_enabled()) return run();
  return run_tuned_problem(op, describe(), std::function<bool()>(run));
}

}  // namespace ham::cuda
