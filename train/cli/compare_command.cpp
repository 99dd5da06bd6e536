// ham compare: train several model configs on the same data, token budget and seed,
// evaluate them alike and write one report (markdown table, JSON, plots).
#include <fcntl.h>
#include <omp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "distributed/communicator.h"
#include "train/cli/commands.h"
#include "train/comparison.h"
#include "train/plot.h"
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
  bool train_only = false;
  bool plots = true;  // --no-plots: the report without its two figures (no gnuplot needed)
  int threads = 0;
  int jobs = 1;
  std::vector<std::string> job_runs;  // --job: the runs of one job of a --jobs parent
};

namespace fs = std::filesystem;

// The last non-empty line of a text file ("" if none): a failed job's error, a running
// one's latest progress.
std::string last_line(const fs::path& path, const char* starting_with = "") {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  const std::streamoff from = std::max<std::streamoff>(0, size - 8192);
  in.seekg(from);
  std::string tail(size_t(size - from), '\0');
  in.read(tail.data(), std::streamsize(tail.size()));
  std::string last;
  std::istringstream lines(tail);
  for (std::string line; std::getline(lines, line);) {
    if (!line.empty() && line.rfind(starting_with, 0) == 0) last = line;
  }
  return last;
}

// One run training in a child `ham compare --job RUN --train-only` process.
struct Job {
  pid_t pid = -1;
  size_t index = 0;
  fs::path dir;  // the run's directory: job.log (the child's output) and train.log
  std::chrono::steady_clock::time_point start;
};

// The command line of a job: this command's options with the run's name, training only.
std::vector<std::string> job_command(const CompareArgs& args, const std::string& run_name,
                                     int threads) {
  std::vector<std::string> argv = {"ham",        "compare",      args.spec_path, "--out",
                                   args.out_dir, "--job",        run_name,       "--train-only",
                                   "--threads",  std::to_string(threads)};
  if (!args.sweep_kv.empty()) {
    argv.insert(argv.end(), {"--sweep-kv", fmt::format("{}", fmt::join(args.sweep_kv, ","))});
  }
  if (!args.seeds.empty()) {
    argv.insert(argv.end(), {"--seeds", fmt::format("{}", fmt::join(args.seeds, ","))});
  }
  if (args.steps > 0) argv.insert(argv.end(), {"--steps", std::to_string(args.steps)});
  if (args.retrain) argv.push_back("--retrain");
  return argv;
}

// Starts a job with its output in dir/job.log, in a process group of its own (a Ctrl-C
// reaches only this process, which passes one stop request on to each job) that gets
// SIGTERM, and so checkpoints and stops, if this process dies.
pid_t start_job(const std::vector<std::string>& argv, const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  HAM_CHECK(!ec, dir.string(), ": cannot create: ", ec.message());
  const std::string log_path = (dir / "job.log").string();
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  HAM_CHECK(log_fd >= 0, log_path, ": cannot open for writing: ", std::strerror(errno));
  std::vector<char*> c_argv;
  for (const std::string& arg : argv) c_argv.push_back(const_cast<char*>(arg.c_str()));
  c_argv.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid == 0) {  // only async-signal-safe calls until exec
    ::setpgid(0, 0);
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    ::dup2(log_fd, STDOUT_FILENO);
    ::dup2(log_fd, STDERR_FILENO);
    // This very program, even where a rebuild has replaced its file since it started: a
    // comparison's jobs all run the code it started with.
    ::execv("/proc/self/exe", c_argv.data());
    constexpr char kExecFailed[] =
        "ham: error: ham compare --jobs: cannot execute /proc/self/exe\n";
    [[maybe_unused]] const ssize_t written =
        ::write(STDERR_FILENO, kExecFailed, sizeof kExecFailed - 1);
    ::_exit(127);
  }
  const int fork_errno = errno;
  ::close(log_fd);
  HAM_CHECK(pid > 0, "ham compare --jobs: cannot start a job: fork: ", std::strerror(fork_errno));
  return pid;
}

struct JobsOutcome {
  int stopped_by_signal = 0;  // else every run trained
  size_t trained = 0;
};

// Trains `runs` in up to args.jobs child processes at once. A stop request is passed on
// to every job (each checkpoints its run; the same command resumes it); a job that failed
// is a one-line error naming its run, once the other jobs have finished.
JobsOutcome train_in_jobs(const CompareArgs& args, const std::vector<CompareRun>& runs,
                          int threads_per_job, std::ostream& out) {
  using Clock = std::chrono::steady_clock;
  std::vector<Job> active;
  size_t next = 0;
  int stop = 0;
  size_t trained = 0;
  bool stop_passed_on = false;
  std::string failure;
  Clock::time_point last_progress = Clock::now();
  const auto prefix = [&](const Job& job) {
    return fmt::format("[{}/{}] {}", job.index + 1, runs.size(), runs[job.index].name);
  };
  while (next < runs.size() || !active.empty()) {
    if (stop == 0) stop = stop_requested();
    if (stop != 0 && !stop_passed_on) {
      for (const Job& job : active) ::kill(job.pid, stop);
      stop_passed_on = true;
    }
    while (stop == 0 && failure.empty() && next < runs.size() && int(active.size()) < args.jobs) {
      Job job;
      job.index = next++;
      job.dir = run_directory(args.out_dir, runs[job.index].name);
      job.pid = start_job(job_command(args, runs[job.index].name, threads_per_job), job.dir);
      job.start = Clock::now();
      out << fmt::format("{}: started (output: {}, log: {})\n", prefix(job),
                         (job.dir / "job.log").string(), (job.dir / "train.log").string());
      out.flush();
      active.push_back(job);
    }
    bool reaped = false;
    for (auto it = active.begin(); it != active.end();) {
      int status = 0;
      const pid_t done = ::waitpid(it->pid, &status, WNOHANG);
      if (done == 0 || (done < 0 && errno == EINTR)) {
        ++it;
        continue;
      }
      HAM_CHECK(done == it->pid, "ham compare --jobs: waitpid: ", std::strerror(errno));
      reaped = true;
      const double seconds = std::chrono::duration<double>(Clock::now() - it->start).count();
      const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      const fs::path job_log = it->dir / "job.log";
      if (code == 0) {
        ++trained;
        // The job's own last line: "[1/1] NAME: trained | train loss ... | ... s".
        const std::string line = last_line(job_log, "[1/1] ");
        const size_t colon = line.find(": ");
        out << fmt::format("{}: {} (job {:.0f} s)\n", prefix(*it),
                           colon == std::string::npos ? "finished" : line.substr(colon + 2),
                           seconds);
      } else if (code == 128 + SIGINT || code == 128 + SIGTERM) {
        if (stop == 0) stop = code - 128;
        out << fmt::format("{}: stopped by {}\n", prefix(*it), stop_signal_name(code - 128));
      } else {
        std::string error = last_line(job_log);
        const std::string error_prefix = "ham: error: ";
        if (error.rfind(error_prefix, 0) == 0) error.erase(0, error_prefix.size());
        const std::string message =
            fmt::format("compare run '{}' failed (exit {}): {} (its output: {})",
                        runs[it->index].name, code, error, job_log.string());
        out << prefix(*it) << ": failed (exit " << code << "); no other run starts\n";
        if (failure.empty()) failure = message;
      }
      out.flush();
      it = active.erase(it);
    }
    if (reaped) continue;
    if (Clock::now() - last_progress >= std::chrono::seconds(60)) {
      for (const Job& job : active) {
        const std::string progress = last_line(job.dir / "train.log", "step ");
        if (!progress.empty()) out << prefix(job) << ": " << progress << "\n";
      }
      out.flush();
      last_progress = Clock::now();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (!failure.empty()) HAM_FAIL(failure);
  return {stop, trained};
}

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
  // The report's plots need gnuplot: its absence is an error before any training, not
  // after it.
  HAM_CHECK(!args.plots || args.train_only || !args.job_runs.empty() || !find_gnuplot().empty(),
            "compare: gnuplot is not installed (not found on PATH), and the report's plots need "
            "it: run scripts/install_deps.sh, or pass --no-plots");
  // Ctrl-C or SIGTERM stops the run in progress with a checkpoint; a second one kills.
  StopSignals stop_signals;
  // Under mpirun every run trains on all ranks (sharded data parallel); CUDA tensors move
  // between them over NCCL, CPU tensors over MPI.
  dist::WorldOptions world_options;
  world_options.use_nccl = Device::parse(spec.train.device).is_cuda();
  std::shared_ptr<dist::Communicator> world = dist::make_world_communicator(world_options);
  HAM_CHECK(args.jobs == 1 || world->size() == 1, "--jobs ", args.jobs, ": under mpirun "
            "each run trains on all ", world->size(), " ranks, one run at a time; drop --jobs");
  HAM_CHECK(args.jobs == 1 || args.job_runs.empty(), "--jobs ", args.jobs,
            ": --job is for the jobs it starts");
  const auto start = std::chrono::steady_clock::now();
  auto compare = [&] {
    // Only rank 0 prints; the others' output would repeat it.
    std::ostringstream discarded;
    std::ostream& out = world->rank() == 0 ? std::cout : discarded;
    std::vector<CompareRun> runs = spec.runs();
    const std::string tuning = tune_kernels_by_default(spec.train.device, false);
    if (!tuning.empty()) out << "kernel: " << tuning << " (the default on a GPU)\n";
    const KernelNotesTo kernel_notes(out);  // the autotuner's choices, as made
    CompareOptions options;
    options.retrain = args.retrain;
    options.only = args.job_runs;
    options.train_only = args.train_only;
    const auto stopped = [&](int signal, size_t done) {
      out << fmt::format("compare stopped by {} after {} of {} runs; the same command "
                         "continues it (finished runs are kept, a stopped one resumes from "
                         "its checkpoint)\n",
                         stop_signal_name(signal), done, runs.size());
      return 128 + signal;  // the shell's convention for a signalled end
    };
    const auto trained_only = [&] {
      out << "compare: trained; the same command without --train-only evaluates the runs and "
             "writes the report\n";
      return 0;
    };
    if (args.jobs > 1) {
      // Without --threads the cores are shared out among the jobs.
      const int threads =
          args.threads > 0 ? args.threads : std::max(1, omp_get_num_procs() / args.jobs);
      out << fmt::format("compare: {} runs ({}), {} steps each, in up to {} jobs of {} "
                         "thread{}\n",
                         runs.size(), spec.source, spec.train.steps, args.jobs, threads,
                         threads == 1 ? "" : "s");
      const JobsOutcome jobs = train_in_jobs(args, runs, threads, out);
      if (jobs.stopped_by_signal != 0) return stopped(jobs.stopped_by_signal, jobs.trained);
      if (args.train_only) return trained_only();
      out << "compare: every run trained; evaluating them\n";
      options.retrain = false;  // the jobs did
    } else if (args.job_runs.empty()) {
      out << fmt::format("compare: {} runs ({}), {} steps each, {} threads{}\n", runs.size(),
                         spec.source, spec.train.steps, omp_get_max_threads(),
                         world->size() > 1 ? fmt::format(" on each of {} ranks", world->size())
                                           : std::string());
    }
    CompareResult result = run_comparison(spec, args.out_dir, out, options, world);
    // The report's total time is the whole command's: with jobs, their training too.
    result.total_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (result.stopped_by_signal != 0) {
      return stopped(result.stopped_by_signal, result.runs.size());
    }
    if (args.train_only) return trained_only();
    if (world->rank() == 0) {
      const std::string markdown =
          write_comparison_report(spec, result, args.out_dir, args.plots);
      out << "\n" << markdown << "\nreport: " << args.out_dir << "/report.md (and report.json"
          << (args.plots ? ", loss_curves.png, kv_tradeoff.png" : "") << ")\n";
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
  cmd->add_option("spec", args->spec_path, "Compare spec JSON: {\"runs\": {name: config path or object}, \"train\": {...}, \"eval\": {...}, \"sweep_kv\": [...], \"seeds\": [...], \"loss_below\": [...]} (e.g. configs/compare/mqar.json)")
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
  cmd->add_flag("--train-only", args->train_only,
                "Train what is missing and stop, evaluating nothing and writing no report (the "
                "same command without it then evaluates the runs)");
  cmd->add_flag("--no-plots", [args](int64_t) { args->plots = false; },
                "Write the report without its two plots, which need gnuplot (e.g. on a GPU "
                "machine without it)");
  cmd->add_option("--jobs", args->jobs,
                  "Train up to this many runs at once, each in a process of its own with "
                  "--threads threads (default: the cores shared out); each run's output goes to "
                  "runs/<name>/job.log, and every run is evaluated once all have trained. A "
                  "run's results do not depend on the jobs it shares the machine with")
      ->check(whole_number_at_least(1));
  cmd->add_option("--job", args->job_runs, "(used by --jobs) train only the run of this name")
      ->group("");
  add_threads_option(cmd, &args->threads);
  return {cmd, [args] { return run_compare(*args); }};
}

}  // namespace ham::cli
