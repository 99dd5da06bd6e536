// ham compare: train several model configs on the same data, token budget and seed,
// evaluate them alike and write one report (markdown table, JSON, plots).
#include <omp.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <fmt/format.h>

#include "distributed/communicator.h"
#include "train/cli/commands.h"
#include "train/comparison.h"
#include "train/stop_signals.h"

namespace ham::cli {

namespace {

struct CompareArgs {
  std::string spec_path;
  std::string out_dir;
  std::vector<double> sweep_kv;
  std::vector<uint64_t> seeds;
  std::vector<double> loss_below;
  std::vector<std::string> only;
  int64_t steps = 0;
  bool retrain = false;
  int threads = 0;
};

int run_compare(const CompareArgs& args) {
  use_threads(args.threads);
  CompareSpec spec = CompareSpec::from_file(args.spec_path);
  if (!args.sweep_kv.empty()) {
    for (double rho : args.sweep_kv) {
      HAM_CHECK(rho >= 0 && rho <= 1, "--sweep-kv: ", rho, " is not a fraction in [0, 1]");
    }
    spec.sweep_kv = args.sweep_kv;
  }
  if (!args.seeds.empty()) {
    check_seeds(args.seeds, "--seeds");
    spec.seeds = args.seeds;
  }
  if (args.steps > 0) spec.train.steps = args.steps;
  if (!args.loss_below.empty()) {
    check_loss_thresholds(args.loss_below, "--loss-below");
    spec.loss_below = args.loss_below;
  }
  if (!args.only.empty()) {
    std::vector<std::pair<std::string, ModelConfig>> kept;
    for (const std::string& name : args.only) {
      auto it = std::find_if(spec.configs.begin(), spec.configs.end(),
                             [&](const auto& entry) { return entry.first == name; });
      HAM_CHECK(it != spec.configs.end(), "--runs: '", name, "' is not a run of ", spec.source);
      kept.push_back(*it);
    }
    spec.configs = kept;
  }
  // Ctrl-C or SIGTERM stops the run in progress with a checkpoint; a second one kills.
  StopSignals stop_signals;
  // Under mpirun every run trains on all ranks (sharded data parallel); CUDA tensors move
  // between them over NCCL, CPU tensors over MPI.
  dist::WorldOptions world_options;
  world_options.use_nccl = Device::parse(spec.train.device).is_cuda();
  std::shared_ptr<dist::Communicator> world = dist::make_world_communicator(world_options);
  auto compare = [&] {
    // Only rank 0 prints; the others' output would repeat it.
    std::ostringstream discarded;
    std::ostream& out = world->rank() == 0 ? std::cout : discarded;
    std::vector<CompareRun> runs = spec.runs();
    out << fmt::format("compare: {} runs ({}), {} steps each, {} threads{}\n", runs.size(),
                       spec.source, spec.train.steps, omp_get_max_threads(),
                       world->size() > 1 ? fmt::format(" on each of {} ranks", world->size())
                                         : std::string());
    CompareResult result = run_comparison(spec, args.out_dir, out, args.retrain, world);
    if (result.stopped_by_signal != 0) {
      out << fmt::format("compare stopped by {} after {} of {} runs; the same command "
                         "continues it (finished runs are kept, a stopped one resumes from "
                         "its checkpoint)\n",
                         stop_signal_name(result.stopped_by_signal), result.runs.size(),
                         runs.size());
      return 128 + result.stopped_by_signal;  // the shell's convention for a signalled end
    }
    if (world->rank() == 0) {
      const std::string markdown = write_comparison_report(spec, result, args.out_dir);
      out << "\n" << markdown << "\nreport: " << args.out_dir << "/report.md (and "
          << "report.json, loss_curves.png, kv_tradeoff.png)\n";
    }
    return 0;
  };
  if (world->size() == 1) return compare();
  return dist::run_or_abort_job(*world, compare);
}

}  // namespace

Command add_compare_command(CLI::App& root) {
  auto args = std::make_shared<CompareArgs>();
  CLI::App* cmd = root.add_subcommand(
      "compare", "Train several model families on the same data, token budget and seed, evaluate them alike, and write one report (markdown, JSON, plots)");
  cmd->add_option("spec", args->spec_path, "Compare spec JSON: {\"runs\": {name: config path or object}, \"train\": {...}, \"eval\": {...}, \"sweep_kv\": [...]} (e.g. configs/compare/mqar.json)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--out", args->out_dir, "Output directory: report.md, report.json, plots, runs/<name>/")
      ->required();
  cmd->add_option("--sweep-kv", args->sweep_kv, "HAM KV fractions to sweep, e.g. 0,0.25,0.5,0.75,1 (each HAM run repeats per value; replaces the spec's sweep_kv)")
      ->delimiter(',');
  cmd->add_option("--seeds", args->seeds, "Repeat every run once per seed, e.g. 0,1,2: each sets the model's initialisation seed and the data seed; the report adds mean +- standard deviation over seeds (replaces the spec's seeds)")
      ->delimiter(',');
  cmd->add_option("--loss-below", args->loss_below, "Report, for each of these losses, the first step where each run's 20-step mean training loss falls below it, e.g. 1 (replaces the spec's loss_below)")
      ->delimiter(',');
  cmd->add_option("--runs", args->only, "Only these runs of the spec, e.g. gdn,ham")->delimiter(',');
  cmd->add_option("--steps", args->steps, "Override the spec's training steps (the token budget)")
      ->check(whole_number_at_least(1));
  cmd->add_flag("--retrain", args->retrain,
                "Train every run again from step 0 (by default a run that finished with the "
                "same config and training options, as its runs/<name>/trained.json shows, is "
                "only evaluated again, and one stopped midway resumes from its newest "
                "checkpoint)");
  add_threads_option(cmd, &args->threads);
  return {cmd, [args] { return run_compare(*args); }};
}

}  // namespace ham::cli
