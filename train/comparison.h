#pragma once
// `ham compare`: the paper's side-by-side comparison at any scale. Several model configs
// train on the same data, with the same token budget and the same data seed (so every run
// sees the same rows in the same order), each is evaluated with the same EvalOptions, and
// one report is written:
//   <out>/report.md        a markdown table (parameters, KV fraction, losses, accuracies)
//   <out>/report.json      everything, including each run's full EvalReport and losses
//   <out>/loss_curves.png  training loss per step of every run (+ .csv, .gp); with seeds,
//                          of every group, averaged over its seeds
//   <out>/kv_tradeoff.png  final loss and recall accuracy versus KV fraction: the HAM
//                          sweep as a line, other families as single points (with seeds,
//                          means over them)
//   <out>/runs/<name>/     train.log, metrics, checkpoints (step-NNNNNNNN, as `ham train
//                          --out` writes them), the trained weights (`ham train --export`
//                          layout, so `ham eval/generate/analyze` read them) and
//                          trained.json (see run_comparison: what a rerun reuses)
//
// The spec is a JSON file:
//   {"runs":     {"gdn": "mqar/gdn.json", "ham": "mqar/ham.json", ...},  (paths relative
//                 to the spec file, or inline config objects)
//    "train":    {TrainOptions keys, e.g. "steps": 1500, "mix_mqar": 1},
//    "eval":     {"mqar_lengths": [128], "mqar_pairs": 32, "samples": 256, ...},
//    "sweep_kv": [0.5],                        (optional; see with_kv_fraction)
//    "seeds":    [0, 1, 2],                    (optional)
//    "loss_below": [1.0]}                      (optional; see first_step_below)
// Every HAM run is repeated once per sweep value; runs of other families run once. With
// seeds, every run is repeated once per seed, which sets both the model's initialisation
// seed and the data seed (runs of one seed see the same rows); the report then adds each
// metric's mean and spread over the seeds.
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "models/config.h"
#include "train/evaluation.h"
#include "train/trainer.h"

namespace ham {

namespace dist {
class Communicator;
}

struct CompareRun {
  std::string name;   // "gdn", "ham@kv=0.50", "gdn@seed=1", "ham@kv=0.50@seed=1", ...
  std::string group;  // the name less its seed: a group's runs differ only in their seed
  ModelConfig config;
  std::optional<double> kv_target;  // the sweep value this HAM run was given
  std::optional<uint64_t> seed;     // the spec's seed this run was given (config and data)
};

struct CompareSpec {
  std::vector<std::pair<std::string, ModelConfig>> configs;  // as listed in "runs"
  TrainOptions train;
  EvalOptions eval;
  std::vector<double> sweep_kv;  // empty: HAM runs keep their own tau settings
  std::vector<uint64_t> seeds;   // empty: each run once, with its config's and train's seeds
  // Report columns: for each threshold, the step where each run's loss first falls below it.
  std::vector<double> loss_below;
  std::string source;            // the spec file, for messages

  // One-line errors name the file and the key at fault.
  static CompareSpec from_file(const std::string& path);
  static CompareSpec from_json(const nlohmann::json& j, const std::string& source,
                               const std::string& base_dir);
  // The runs in order: each config, HAM configs once per sweep value, each of those once
  // per seed.
  std::vector<CompareRun> runs() const;
};

// Seeds must differ: the error names `what` and the repeated seed.
void check_seeds(const std::vector<uint64_t>& seeds, const std::string& what);

// Loss thresholds must be finite and > 0: the error names `what` and the value.
void check_loss_thresholds(const std::vector<double>& thresholds, const std::string& what);

// How soon a run learns: the first step (1-based) at which the mean of the last `window`
// step losses (of all of them, before step `window`) is below `threshold`; nullopt if none
// is. On MQAR, the step where the loss leaves its plateau and recall emerges.
std::optional<int64_t> first_step_below(const std::vector<double>& step_losses,
                                        double threshold, size_t window = 20);

// HAM at KV fraction rho: rho in (0, 1) learns tau toward kv_target rho (Algorithm 2);
// rho = 0 fixes tau at the top of its range (s (1 - 1e-6): no token is selected) and
// rho = 1 at the bottom (s 1e-6: every token with a non-zero score is selected).
ModelConfig with_kv_fraction(ModelConfig config, double rho);

struct CompareRunResult {
  CompareRun run;
  std::string family;
  int64_t parameters = 0;
  TrainResult train;
  EvalReport eval;
  double mean_kv_fraction = 1;  // measured in evaluation; 1 for attention, 0 for GDN
  std::string weights_dir;
};

struct CompareResult {
  std::vector<CompareRunResult> runs;  // the finished ones, in order
  double total_seconds = 0;
  // The signal that stopped the comparison (stop_signals.h), else 0: `runs` then holds the
  // runs finished before it.
  int stopped_by_signal = 0;
};

// Trains and evaluates every run in order, logging a line per run to `log` (each run's
// full training log goes to <out>/runs/<name>/train.log). Nothing done is lost to a rerun
// with the same model configs and training options (checkpoint frequency, output paths
// and the profile aside) on the same out_dir:
//   - a run that finished (its <out>/runs/<name>/trained.json) is not trained again: its
//     weights are evaluated anew, with the spec's current eval options;
//   - a run stopped midway, by a stop request (Ctrl-C, SIGTERM: the run in progress writes
//     a checkpoint and run_comparison returns) or a crash (its newest checkpoint; the
//     spec's train.checkpoint_every sets how often), resumes from its checkpoint, bit for
//     bit as if never stopped;
//   - checkpoints and records of other settings are deleted, and the run trains anew.
// `options` can ask to train every run again from step 0, to do only some runs, or to
// train without evaluating.
//
// With a `world` of N > 1 ranks (mpirun; every rank calls this alike, on one shared
// filesystem), each run trains with sharded data parallelism over them (train()), and
// every rank evaluates the trained model; only rank 0 logs and writes the run's files.
// nullptr: a world of one.
// Where a run's files go: <out_dir>/runs/<its name less shell-special characters>
// ("ham@kv=0.50@seed=1" -> "ham_kv0.50_seed1").
std::string run_directory(const std::string& out_dir, const std::string& run_name);

struct CompareOptions {
  bool retrain = false;  // train every run again from step 0
  // Only the runs of these names (CompareRun::name; each must be one of the spec's runs).
  std::vector<std::string> only;
  // Train what is missing and stop: nothing is evaluated and the result holds no runs. A
  // job of `ham compare --jobs`, whose parent evaluates every run once all have trained.
  bool train_only = false;
};

CompareResult run_comparison(const CompareSpec& spec, const std::string& out_dir,
                             std::ostream& log, const CompareOptions& options = {},
                             const std::shared_ptr<dist::Communicator>& world = nullptr);

// Writes report.md and report.json into out_dir, then (with `plots`) the plots, so that a
// plot that fails loses no report; returns the markdown.
std::string write_comparison_report(const CompareSpec& spec, const CompareResult& result,
                                    const std::string& out_dir, bool plots = true);

}  // namespace ham
