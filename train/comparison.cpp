#include "train/comparison.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <system_error>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/file_io.h"
#include "distributed/communicator.h"
#include "train/checkpoint.h"
#include "train/plot.h"
#include "train/sampling.h"
#include "train/stop_signals.h"
#include "train/tokenizer.h"
#include "train/trained_model.h"
#include "train/training_data.h"

namespace ham {

namespace fs = std::filesystem;

namespace {

nlohmann::json read_json_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  HAM_CHECK(in, path, ": cannot open ", what);
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    HAM_FAIL(path, ": invalid JSON: ", e.what());
  }
}

// "ham@kv=0.50" -> "ham_kv0.50": directory names without shell-special characters.
std::string directory_name(const std::string& run_name) {
  std::string out;
  for (char ch : run_name) {
    if (std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' || ch == '_') {
      out += ch;
    } else if (ch == '@') {
      out += '_';
    }
  }
  return out;
}

// The run's KV cache relative to a Transformer of the same depth: HAM's measured fraction
// (mean over layers and evaluated tasks), the share of attention layers for GDN-GSA, 1 for
// the Transformer and 0 for GDN.
double relative_kv_fraction(const ModelConfig& config, const EvalReport& report) {
  switch (config.family) {
    case ModelFamily::Transformer: return 1.0;
    case ModelFamily::GDN: return 0.0;
    case ModelFamily::GDNGSA: {
      int64_t attention = 0;
      for (int64_t i = 0; i < config.n_layers; ++i) attention += config.is_attention_layer(i);
      return double(attention) / double(config.n_layers);
    }
    case ModelFamily::HAM: return report.mean_kv_fraction();
  }
  return std::nan("");
}

// Mean of the last `window` step losses (the final training loss, less noisy than one step).
double final_train_loss(const TrainResult& r, size_t window = 20) {
  if (r.step_losses.empty()) return std::nan("");
  size_t n = std::min(window, r.step_losses.size());
  double total = 0;
  for (size_t i = r.step_losses.size() - n; i < r.step_losses.size(); ++i) total += r.step_losses[i];
  return total / double(n);
}

// The headline recall number of a run: the first MQAR length, else the first NIAH task.
std::optional<std::pair<std::string, double>> recall_accuracy(const EvalReport& report) {
  if (!report.mqar.empty()) {
    return std::make_pair(fmt::format("MQAR accuracy (T={}, {} pairs)", report.mqar[0].seq_len,
                                      report.mqar[0].num_pairs),
                          report.mqar[0].accuracy);
  }
  if (!report.niah.empty()) {
    return std::make_pair(fmt::format("NIAH {} accuracy (T={})", report.niah[0].task,
                                      report.niah[0].context_tokens),
                          report.niah[0].accuracy);
  }
  return std::nullopt;
}

// Catches what would fail in evaluation (a NIAH length too short for its needles) before
// any run spends its training time.
void check_eval_feasible(const EvalOptions& eval, const std::string& source) {
  if (eval.niah_tasks.empty()) return;
  std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(eval.tokenizer);
  TokenCounter counter = [&tokenizer](std::string_view text) {
    return int64_t(tokenizer->encode(text).size());
  };
  for (const std::string& task : eval.niah_tasks) {
    for (int64_t length : eval.niah_lengths) {
      try {
        make_niah_example(NiahConfig::preset(niah_kind_from_name(task), length, eval.seed), counter);
      } catch (const Error& e) {
        HAM_FAIL(source, ": eval NIAH ", task, " at ", length, " tokens: ", e.what());
      }
    }
  }
}

}  // namespace

// ---- spec -----------------------------------------------------------------------------------

CompareSpec CompareSpec::from_file(const std::string& path) {
  nlohmann::json j = read_json_file(path, "compare spec");
  return from_json(j, path, fs::path(path).parent_path().string());
}

CompareSpec CompareSpec::from_json(const nlohmann::json& j, const std::string& source,
                                   const std::string& base_dir) {
  HAM_CHECK(j.is_object(), source, ": a compare spec must be a JSON object");
  for (const auto& item : j.items()) {
    const std::string& key = item.key();
    HAM_CHECK(key == "runs" || key == "train" || key == "eval" || key == "sweep_kv" ||
                  key == "seeds" || key == "loss_below",
              source, ": unknown key '", key,
              "' (known: runs, train, eval, sweep_kv, seeds, loss_below)");
  }
  CompareSpec spec;
  spec.source = source;
  HAM_CHECK(j.contains("runs") && j.at("runs").is_object() && !j.at("runs").empty(), source,
            ": key 'runs' must be a non-empty object of name -> model config (path or object)");
  for (const auto& item : j.at("runs").items()) {
    const std::string where = source + ": runs." + item.key();
    HAM_CHECK(!item.key().empty() && directory_name(item.key()) == item.key(), where,
              ": a run name may hold only letters, digits, '.', '-' and '_'");
    if (item.value().is_string()) {
      fs::path path = item.value().get<std::string>();
      if (path.is_relative()) path = fs::path(base_dir) / path;
      spec.configs.emplace_back(item.key(), ModelConfig::from_file(path.string()));
    } else {
      HAM_CHECK(item.value().is_object(), where, ": must be a config file path or a config object");
      spec.configs.emplace_back(item.key(), ModelConfig::from_json(item.value(), where));
    }
  }
  if (j.contains("train")) spec.train.update_from_json(j.at("train"), source + ": train");
  if (j.contains("eval")) spec.eval.update_from_json(j.at("eval"), source + ": eval");
  // The evaluation reads what the runs trained on unless the eval block names its own: the
  // training tokenizer, and the training text's held-out documents or validation shards.
  const nlohmann::json& eval_block = j.contains("eval") ? j.at("eval") : nlohmann::json::object();
  if (!eval_block.contains("tokenizer")) spec.eval.tokenizer = spec.train.tokenizer;
  if (!eval_block.contains("data_path")) {
    if (!spec.train.val_data_path.empty()) {
      spec.eval.data_path = spec.train.val_data_path;
    } else {
      HAM_CHECK(!spec.eval.perplexity || !is_shard_spec(spec.train.data_path), source,
                ": train.data_path holds token shards and no held-out ones are named: set "
                "train.val_data_path or eval.data_path for the perplexity (or eval.perplexity false)");
      spec.eval.data_path = spec.train.data_path;
    }
  }
  spec.eval.validate();
  if (j.contains("sweep_kv")) {
    const nlohmann::json& sweep = j.at("sweep_kv");
    HAM_CHECK(sweep.is_array(), source, ": key 'sweep_kv' must be a list of fractions in [0, 1]");
    for (const nlohmann::json& v : sweep) {
      HAM_CHECK(v.is_number() && v.get<double>() >= 0 && v.get<double>() <= 1, source,
                ": key 'sweep_kv' holds ", v.dump(), ", not a fraction in [0, 1]");
      spec.sweep_kv.push_back(v.get<double>());
    }
  }
  if (j.contains("seeds")) {
    const nlohmann::json& seeds = j.at("seeds");
    HAM_CHECK(seeds.is_array() && !seeds.empty(), source,
              ": key 'seeds' must be a non-empty list of whole numbers >= 0");
    for (const nlohmann::json& seed : seeds) {
      const bool whole = seed.is_number_unsigned() ||
                         (seed.is_number_integer() && seed.get<int64_t>() >= 0);
      HAM_CHECK(whole, source, ": key 'seeds' holds ", seed.dump(), ", not a whole number >= 0");
      spec.seeds.push_back(seed.get<uint64_t>());
    }
  }
  check_seeds(spec.seeds, source + ": key 'seeds'");
  if (j.contains("loss_below")) {
    const nlohmann::json& below = j.at("loss_below");
    HAM_CHECK(below.is_array(), source, ": key 'loss_below' must be a list of losses > 0");
    for (const nlohmann::json& v : below) {
      HAM_CHECK(v.is_number(), source, ": key 'loss_below' holds ", v.dump(), ", not a loss > 0");
      spec.loss_below.push_back(v.get<double>());
    }
  }
  check_loss_thresholds(spec.loss_below, source + ": key 'loss_below'");
  return spec;
}

void check_loss_thresholds(const std::vector<double>& thresholds, const std::string& what) {
  for (double threshold : thresholds) {
    HAM_CHECK(std::isfinite(threshold) && threshold > 0, what, ": ", threshold,
              " is not a loss > 0");
  }
}

std::optional<int64_t> first_step_below(const std::vector<double>& step_losses,
                                        double threshold, size_t window) {
  HAM_CHECK(window > 0, "first_step_below: the window must hold at least one step");
  for (size_t end = 1; end <= step_losses.size(); ++end) {
    const size_t begin = end > window ? end - window : 0;
    double total = 0;  // summed afresh: a skipped step's NaN stays inside its windows
    for (size_t i = begin; i < end; ++i) total += step_losses[i];
    if (total / double(end - begin) < threshold) return int64_t(end);
  }
  return std::nullopt;
}

void check_seeds(const std::vector<uint64_t>& seeds, const std::string& what) {
  std::vector<uint64_t> sorted = seeds;
  std::sort(sorted.begin(), sorted.end());
  const auto repeated = std::adjacent_find(sorted.begin(), sorted.end());
  HAM_CHECK(repeated == sorted.end(), what, ": seed ", repeated == sorted.end() ? 0 : *repeated,
            " is listed twice (its runs would repeat each other)");
}

std::vector<CompareRun> CompareSpec::runs() const {
  std::vector<CompareRun> groups;  // one per config and sweep value
  for (const auto& [name, config] : configs) {
    if (config.family == ModelFamily::HAM && !sweep_kv.empty()) {
      for (double rho : sweep_kv) {
        const std::string group = fmt::format("{}@kv={:.2f}", name, rho);
        groups.push_back({group, group, with_kv_fraction(config, rho), rho, std::nullopt});
      }
    } else {
      groups.push_back({name, name, config, std::nullopt, std::nullopt});
    }
  }
  if (seeds.empty()) return groups;
  std::vector<CompareRun> out;
  for (const CompareRun& group : groups) {
    for (uint64_t seed : seeds) {
      CompareRun run = group;
      run.name = fmt::format("{}@seed={}", group.group, seed);
      run.config.seed = seed;
      run.seed = seed;
      out.push_back(std::move(run));
    }
  }
  return out;
}

ModelConfig with_kv_fraction(ModelConfig config, double rho) {
  HAM_CHECK(config.family == ModelFamily::HAM, "with_kv_fraction: only HAM routes tokens, got a ",
            family_name(config.family), " config");
  HAM_CHECK(rho >= 0 && rho <= 1, "with_kv_fraction: KV fraction must lie in [0, 1], got ", rho);
  constexpr double kEdge = 1e-6;  // tau must stay strictly inside (0, s)
  if (rho == 0 || rho == 1) {
    config.learn_tau = false;
    config.tau = config.tau_scale() * (rho == 0 ? 1 - kEdge : kEdge);
  } else {
    config.learn_tau = true;
    config.kv_target = {rho};
  }
  config.validate("with_kv_fraction");
  return config;
}

// ---- running ----------------------------------------------------------------------------------

std::string run_directory(const std::string& out_dir, const std::string& run_name) {
  return (fs::path(out_dir) / "runs" / directory_name(run_name)).string();
}

namespace {

// <out>/runs/<name>/trained.json: a finished run's training result with the settings that
// produced it, written after its weights. A rerun with the same settings evaluates those
// weights again instead of training, so an interrupted or extended comparison trains only
// what is missing.
constexpr const char* kTrainedRecord = "trained.json";
// Seconds between the progress lines of a run that the comparison's log repeats.
constexpr double kProgressSeconds = 60;

// What decides a run's weights: its model config and training options, less where the
// outputs go, how often checkpoints are kept, and the profile.
nlohmann::json training_settings(const nlohmann::json& config, nlohmann::json train) {
  for (const char* output : {"out_dir", "log_dir", "checkpoint_every", "keep_checkpoints",
                             "profile_steps", "profile_trace", "peak_gflops"}) {
    train.erase(output);
  }
  return {{"config", config}, {"train", train}};
}

// A training record's or a checkpoint's settings, comparable with training_settings'
// (records written before the outputs were left out still hold them).
nlohmann::json settings_of(const nlohmann::json& holder, const std::string& source) {
  try {
    return training_settings(holder.at("config"), holder.at("train"));
  } catch (const nlohmann::json::exception& e) {
    HAM_FAIL(source, ": holds no settings (", e.what(), "); delete it or rerun with --retrain");
  }
}

nlohmann::json train_result_to_json(const TrainResult& r) {
  return {{"first_loss", r.first_loss},           {"final_loss", r.final_loss},
          {"initial_val_loss", r.initial_val_loss}, {"final_val_loss", r.final_val_loss},
          {"steps", r.steps},                     {"skipped_steps", r.skipped_steps},
          {"step_losses", r.step_losses},         {"peak_memory_bytes", r.peak_memory_bytes}};
}

// The TrainResult of a record whose settings matched.
TrainResult train_result_from_record(const nlohmann::json& record, const std::string& source) {
  TrainResult r;
  try {
    r.train_seconds = record.at("train_seconds").get<double>();
    const nlohmann::json& j = record.at("result");
    r.first_loss = j.at("first_loss").get<double>();
    r.final_loss = j.at("final_loss").get<double>();
    r.initial_val_loss = j.at("initial_val_loss").get<double>();
    r.final_val_loss = j.at("final_val_loss").get<double>();
    r.steps = j.at("steps").get<int64_t>();
    r.skipped_steps = j.at("skipped_steps").get<int64_t>();
    r.step_losses = j.at("step_losses").get<std::vector<double>>();
    r.peak_memory_bytes = j.at("peak_memory_bytes").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    HAM_FAIL(source, ": not a training record (", e.what(),
             "); delete it or rerun with --retrain");
  }
  return r;
}

// What the ranks other than the lead would log.
class DiscardingBuffer final : public std::streambuf {
 protected:
  int overflow(int ch) override { return traits_type::not_eof(ch); }
  std::streamsize xsputn(const char*, std::streamsize n) override { return n; }
};

// A run's training log: every character goes to its train.log; a progress line ("step
// N/M | loss ...") also goes to the comparison's log, prefixed with the run, when it is
// the first or `every` seconds have passed since the last one shown. So a long comparison
// shows where it is without the full logs.
class ProgressTee final : public std::streambuf {
 public:
  ProgressTee(std::ostream& file, std::ostream& log, std::string prefix, double every)
      : file_(file), log_(log), prefix_(std::move(prefix)), every_(every) {}

 protected:
  int overflow(int ch) override {
    if (ch == traits_type::eof()) return 0;
    file_.put(char(ch));
    line_ += char(ch);
    if (ch == '\n') end_line();
    return file_ ? ch : traits_type::eof();
  }
  int sync() override {
    file_.flush();
    return file_ ? 0 : -1;
  }

 private:
  void end_line() {
    const auto now = std::chrono::steady_clock::now();
    const bool progress =
        line_.rfind("step ", 0) == 0 && line_.find("| loss ") != std::string::npos;
    const bool due =
        !shown_ || std::chrono::duration<double>(now - *shown_).count() >= every_;
    if (progress && due) {
      log_ << prefix_ << ": " << line_;
      log_.flush();
      shown_ = now;
    }
    line_.clear();
  }

  std::ostream& file_;
  std::ostream& log_;
  std::string prefix_;
  double every_;
  std::string line_;
  std::optional<std::chrono::steady_clock::time_point> shown_;
};

// Where a run starts: a finished record, a checkpoint of the same settings (a run stopped
// midway, by a signal or a crash), or nothing. Anything of other settings is removed.
struct RunStart {
  std::optional<nlohmann::json> record;
  std::optional<CheckpointContents> checkpoint;
};

RunStart find_run_start(const fs::path& dir, const nlohmann::json& settings, bool retrain,
                        const std::string& prefix, std::ostream& log) {
  RunStart start;
  const fs::path record_path = dir / kTrainedRecord;
  if (!retrain && fs::exists(record_path)) {
    nlohmann::json earlier = read_json_file(record_path.string(), "training record");
    if (earlier.is_object() &&
        settings_of(earlier.value("settings", nlohmann::json::object()), record_path.string()) ==
            settings) {
      start.record = std::move(earlier);
      return start;
    }
    log << fmt::format("{}: {} holds other settings; training again\n", prefix,
                       record_path.string());
  }
  std::error_code ec;
  fs::remove(record_path, ec);  // a record must never describe other weights
  HAM_CHECK(!ec, record_path.string(), ": cannot remove: ", ec.message());
  if (std::optional<std::string> latest = latest_checkpoint(dir.string()); latest && !retrain) {
    const std::string state_file = *latest + "/state.json";
    if (settings_of(load_checkpoint_state(*latest), state_file) == settings) {
      start.checkpoint = load_checkpoint(*latest);
      return start;
    }
    log << fmt::format("{}: {} holds other settings; training from the start\n", prefix,
                       *latest);
  }
  remove_checkpoints(dir.string());
  return start;
}

}  // namespace

CompareResult run_comparison(const CompareSpec& spec, const std::string& out_dir,
                             std::ostream& log_to, const CompareOptions& compare_options,
                             const std::shared_ptr<dist::Communicator>& world_or_null) {
  const std::shared_ptr<dist::Communicator> world =
      world_or_null ? world_or_null : std::make_shared<dist::SingleProcessCommunicator>();
  const bool lead = world->rank() == 0;  // the rank that logs and writes the run's files
  DiscardingBuffer discard;
  std::ostream silent(&discard);
  std::ostream& log = lead ? log_to : silent;
  std::vector<CompareRun> runs = spec.runs();
  if (!compare_options.only.empty()) {
    std::vector<CompareRun> kept;
    for (const std::string& name : compare_options.only) {
      auto it = std::find_if(runs.begin(), runs.end(),
                             [&](const CompareRun& run) { return run.name == name; });
      HAM_CHECK(it != runs.end(), spec.source, ": no run is named '", name, "'");
      kept.push_back(*it);
    }
    runs = std::move(kept);
  }
  const bool retrain = compare_options.retrain;
  spec.eval.validate();
  check_eval_feasible(spec.eval, spec.source);
  std::error_code ec;
  if (lead) fs::create_directories(fs::path(out_dir) / "runs", ec);
  HAM_CHECK(!ec, out_dir, ": cannot create: ", ec.message());
  HAM_CHECK(spec.train.out_dir.empty(), spec.source, ": train option 'out_dir' is set by ham "
            "compare (each run writes to <out>/runs/<name>); remove it");

  const bool data_rows = spec.train.mix_mqar + spec.train.mix_niah < 1;
  CompareResult result;
  auto all_start = std::chrono::steady_clock::now();
  auto finish = [&] {
    result.total_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - all_start).count();
    return result;
  };
  for (size_t i = 0; i < runs.size(); ++i) {
    const CompareRun& run = runs[i];
    const std::string prefix = fmt::format("[{}/{}] {}", i + 1, runs.size(), run.name);
    // A stop that arrived during the previous run's evaluation, on any rank.
    const int signal =
        int(world->all_reduce_scalar(double(stop_requested()), dist::ReduceOp::Max));
    if (signal != 0) {
      result.stopped_by_signal = signal;
      log << fmt::format("{}: not started: {} received\n", prefix, stop_signal_name(signal));
      return finish();
    }
    fs::path dir = run_directory(out_dir, run.name);
    if (lead) fs::create_directories(dir, ec);  // the others look after the barrier below
    HAM_CHECK(!ec, dir.string(), ": cannot create: ", ec.message());

    TrainOptions options = spec.train;
    if (run.seed) options.seed = *run.seed;
    options.log_dir = (dir / "metrics").string();
    options.out_dir = dir.string();  // checkpoints: <dir>/step-NNNNNNNN
    const nlohmann::json settings = training_settings(run.config.to_json(), options.to_json());
    const fs::path record_path = dir / kTrainedRecord;
    // The lead rank decides, deleting what other settings left; the others then find what
    // it kept (a shared filesystem; they must agree, or the job would hang later).
    RunStart start;
    if (lead) start = find_run_start(dir, settings, retrain, prefix, log);
    world->barrier();
    if (!lead) start = find_run_start(dir, settings, /*retrain=*/false, prefix, log);
    const double start_code = start.record ? -1.0
                              : start.checkpoint
                                  ? double(start.checkpoint->state.at("step").get<int64_t>())
                                  : -2.0;
    HAM_CHECK(world->all_reduce_scalar(start_code, dist::ReduceOp::Max) ==
                  world->all_reduce_scalar(start_code, dist::ReduceOp::Min),
              dir.string(), ": the ranks found different records or checkpoints there (ham "
              "compare under mpirun needs one filesystem shared by every rank)");
    const Device device = resolve_training_device(options.device, world->local_rank());
    CompareRunResult r;
    r.run = run;
    r.family = family_name(run.config.family);
    r.weights_dir = (dir / "weights").string();
    std::shared_ptr<LanguageModel> model;
    if (start.record && compare_options.train_only) {
      log << fmt::format("{}: trained earlier ({})\n", prefix, record_path.string());
      continue;
    }
    if (start.record) {
      r.train = train_result_from_record(*start.record, record_path.string());
      model = load_trained_model(r.weights_dir).model;
      // Evaluated where it trained, as a model train() leaves behind (f32 weights).
      model->to(device);
      r.parameters = model->num_parameters();
      log << fmt::format("{}: trained earlier ({}); evaluating its weights\n", prefix,
                         record_path.string());
      log.flush();
    } else {
      model = make_model(run.config);
      r.parameters = model->num_parameters();
      const CheckpointContents* resume = start.checkpoint ? &*start.checkpoint : nullptr;
      const int64_t resume_step = resume ? resume->state.at("step").get<int64_t>() : 0;
      const std::string checkpoint_dir =
          resume ? resume->state.at("checkpoint_dir").get<std::string>() : "";
      if (resume_step >= options.steps) {
        // Stopped after its last checkpoint and before its record: nothing left to train.
        r.train = train_result_at_checkpoint(resume->state, checkpoint_dir + "/state.json");
        model = load_trained_model(checkpoint_dir).model;  // HAM's learned thresholds too
        model->to(device);
        log << fmt::format("{}: trained to its last step earlier ({}); evaluating it\n",
                           prefix, checkpoint_dir);
      } else {
        // Rows come only from synthetic tasks when the mixture leaves no share for the data.
        TrainingData data;
        if (data_rows) {
          try {
            data = open_training_data(options, run.config);
          } catch (const Error& e) {
            HAM_FAIL("compare run '", run.name, "': ", e.what());
          }
        } else {
          data.train = std::make_unique<TokenStream>(std::vector<int64_t>{});
          data.val = std::make_unique<TokenStream>(std::vector<int64_t>{});
          data.description = "synthetic rows only";
        }
        const std::string what =
            resume ? fmt::format("resuming from {} at step {} of {}", checkpoint_dir,
                                 resume_step, options.steps)
                   : fmt::format("training {} steps", options.steps);
        const std::string data_use =
            data_rows ? "; " + data_use_summary(options, data.train->size()) : "";
        log << fmt::format("{}: {} model, {} parameters, {}, {}x{} tokens a step ({}{}; "
                           "log: {})\n",
                           prefix, family_name(run.config.family), r.parameters, what,
                           options.batch_size, options.seq_len, data.description, data_use,
                           (dir / "train.log").string());
        log.flush();
        // A resumed run's log goes on where the stopped one's ended.
        std::ofstream train_log;
        if (lead) {
          train_log.open(dir / "train.log", resume ? std::ios::app : std::ios::trunc);
          HAM_CHECK(train_log, (dir / "train.log").string(), ": cannot open for writing");
        }
        ProgressTee tee(train_log, log, prefix, kProgressSeconds);
        std::ostream train_output(lead ? static_cast<std::streambuf*>(&tee) : &discard);
        const bool resuming = resume != nullptr;
        r.train = train(*model, *data.train, *data.val, options, train_output,
                        std::move(start.checkpoint), world);
        train_output.flush();
        HAM_CHECK(!lead || train_log.good(), (dir / "train.log").string(), ": write failed");
        if (r.train.stopped_by_signal != 0) {
          result.stopped_by_signal = r.train.stopped_by_signal;
          log << fmt::format(
              "{}: stopped at step {} of {} by {}; {}\n", prefix, r.train.steps, options.steps,
              stop_signal_name(r.train.stopped_by_signal),
              r.train.last_checkpoint.empty() && !resuming
                  ? std::string("no step ran")
                  : "the same command resumes it from " +
                        latest_checkpoint(dir.string()).value_or("?"));
          return finish();
        }
      }
      if (lead) {
        export_trained_model(r.weights_dir, *model, tokenizer_file_text(spec.train.tokenizer));
        const nlohmann::json trained = {{"settings", settings},
                                        {"result", train_result_to_json(r.train)},
                                        {"train_seconds", r.train.train_seconds}};
        write_file_atomically(record_path.string(), trained.dump(2) + "\n");
      }
      world->barrier();  // the record is in place before any rank looks for the next
      if (compare_options.train_only) {
        log << fmt::format("{}: trained | train loss {:.4f} | {:.0f} s\n", prefix,
                           final_train_loss(r.train), r.train.train_seconds);
        continue;
      }
    }
    // Every rank evaluates the whole model alike; the lead's report is the one written.

    Completer complete;
    if (!spec.eval.niah_tasks.empty()) {
      std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(spec.eval.tokenizer);
      std::optional<int64_t> stop;
      if (tokenizer->eot_id() >= 0) stop = tokenizer->eot_id();
      complete = greedy_completer(*model, stop);
    }
    r.eval = evaluate_model(*model, spec.eval, complete);
    if (complete) r.eval.generation = "kv-cached decoder";
    r.eval.source = r.weights_dir;
    r.eval.step = r.train.steps;
    r.mean_kv_fraction = relative_kv_fraction(run.config, r.eval);

    std::string summary = fmt::format("train loss {:.4f}", final_train_loss(r.train));
    if (auto recall = recall_accuracy(r.eval)) {
      summary += fmt::format(" | {} {:.3f}", recall->first, recall->second);
    }
    if (r.eval.perplexity) summary += fmt::format(" | ppl {:.3f}", r.eval.perplexity->perplexity);
    if (r.eval.perplexity && r.eval.perplexity->bytes > 0) {
      summary += fmt::format(" | {:.4f} bits per byte", r.eval.perplexity->bits_per_byte);
    }
    log << fmt::format("{}: {} | KV fraction {:.3f} | peak memory {:.1f} MiB | {:.0f} s\n",
                       prefix, summary, r.mean_kv_fraction,
                       double(r.train.peak_memory_bytes) / 1048576.0, r.train.train_seconds);
    log.flush();
    result.runs.push_back(std::move(r));
  }
  return finish();
}

// ---- report -----------------------------------------------------------------------------------

namespace {

std::string format_metric(double v, const char* format = "{:.3f}") {
  return std::isfinite(v) ? fmt::format(fmt::runtime(format), v) : std::string("-");
}

// One number of a run's report row.
struct RunMetric {
  std::string name;
  double value;
  const char* format;
};

// The report's numbers of one run, in column order. The task columns follow the run's
// EvalReport; all runs share the eval options, so all have the same columns.
std::vector<RunMetric> run_metrics(const CompareRunResult& r,
                                   const std::vector<double>& loss_below) {
  std::vector<RunMetric> out = {
      {"KV fraction", r.mean_kv_fraction, "{:.3f}"},
      {"train loss (last 20 steps)", final_train_loss(r.train), "{:.4f}"}};
  for (double threshold : loss_below) {
    const std::optional<int64_t> step = first_step_below(r.train.step_losses, threshold);
    out.push_back({fmt::format("first step with loss < {}", threshold),
                   step ? double(*step) : std::nan(""), "{:.0f}"});
  }
  for (const EvalMetric& m : r.eval.metrics()) out.push_back({m.name, m.value, "{:.3f}"});
  out.push_back({"peak memory (MiB)", double(r.train.peak_memory_bytes) / 1048576.0, "{:.1f}"});
  out.push_back({"train time (s)", r.train.train_seconds, "{:.0f}"});
  return out;
}

// The runs of one CompareRun::group (one per seed, or a single run without seeds).
struct RunGroup {
  std::string name;
  std::vector<const CompareRunResult*> members;
};

std::vector<RunGroup> group_runs(const CompareResult& result) {
  std::vector<RunGroup> groups;
  for (const CompareRunResult& r : result.runs) {
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const RunGroup& g) { return g.name == r.run.group; });
    if (it == groups.end()) it = groups.insert(groups.end(), RunGroup{r.run.group, {}});
    it->members.push_back(&r);
  }
  return groups;
}

// Mean, sample standard deviation (0 for one value), min and max of the finite values.
struct Spread {
  int64_t count = 0;
  double mean = std::nan(""), stddev = std::nan(""), min = std::nan(""), max = std::nan("");
};

Spread spread_of(const std::vector<double>& values) {
  Spread s;
  double total = 0;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    s.min = s.count == 0 ? v : std::min(s.min, v);
    s.max = s.count == 0 ? v : std::max(s.max, v);
    total += v;
    ++s.count;
  }
  if (s.count == 0) return s;
  s.mean = total / double(s.count);
  double squares = 0;
  for (double v : values) {
    if (std::isfinite(v)) squares += (v - s.mean) * (v - s.mean);
  }
  s.stddev = s.count > 1 ? std::sqrt(squares / double(s.count - 1)) : 0.0;
  return s;
}

// Each run_metrics column over a group's runs, in column order.
std::vector<Spread> group_metrics(const RunGroup& group, const std::vector<double>& loss_below) {
  std::vector<std::vector<double>> columns;
  for (const CompareRunResult* r : group.members) {
    const std::vector<RunMetric> metrics = run_metrics(*r, loss_below);
    columns.resize(metrics.size());
    for (size_t i = 0; i < metrics.size(); ++i) columns[i].push_back(metrics[i].value);
  }
  std::vector<Spread> spreads;
  for (const std::vector<double>& values : columns) spreads.push_back(spread_of(values));
  return spreads;
}

std::string markdown_row(const std::vector<std::string>& cells) {
  std::string md = "|";
  for (const std::string& cell : cells) md += " " + cell + " |";
  return md + "\n";
}

// `header`, then the separator: the first `text_columns` left-aligned, the rest right.
std::string markdown_header(const std::vector<std::string>& header, size_t text_columns) {
  std::string md = markdown_row(header) + "|";
  for (size_t i = 0; i < header.size(); ++i) md += i < text_columns ? "---|" : "---:|";
  return md + "\n";
}

// One row per run.
std::string markdown_table(const CompareResult& result, const std::vector<double>& loss_below) {
  std::vector<std::string> header = {"run", "family", "parameters"};
  for (const RunMetric& m : run_metrics(result.runs.front(), loss_below)) header.push_back(m.name);
  std::string md = markdown_header(header, 2);
  for (const CompareRunResult& r : result.runs) {
    std::vector<std::string> row = {r.run.name, r.family, fmt::format("{}", r.parameters)};
    for (const RunMetric& m : run_metrics(r, loss_below)) {
      row.push_back(format_metric(m.value, m.format));
    }
    md += markdown_row(row);
  }
  return md;
}

// One row per group: each metric's mean +- sample standard deviation over the seeds that
// have it (a run that never reached a loss threshold has no step for it).
std::string markdown_seed_table(const std::vector<RunGroup>& groups,
                                const std::vector<double>& loss_below) {
  const std::vector<RunMetric> columns = run_metrics(*groups.front().members.front(), loss_below);
  std::vector<std::string> header = {"run", "family", "seeds", "parameters"};
  for (const RunMetric& m : columns) header.push_back(m.name);
  std::string md = markdown_header(header, 2);
  for (const RunGroup& g : groups) {
    const CompareRunResult& first = *g.members.front();
    std::vector<std::string> row = {g.name, first.family, fmt::format("{}", g.members.size()),
                                    fmt::format("{}", first.parameters)};
    const std::vector<Spread> spreads = group_metrics(g, loss_below);
    for (size_t i = 0; i < columns.size(); ++i) {
      const Spread& s = spreads[i];
      std::string cell = format_metric(s.mean, columns[i].format);
      if (s.count > 1) cell += " ± " + format_metric(s.stddev, columns[i].format);
      if (s.count > 0 && s.count < int64_t(g.members.size())) {
        cell += fmt::format(" ({} of {} seeds)", s.count, g.members.size());
      }
      row.push_back(cell);
    }
    md += markdown_row(row);
  }
  return md;
}

// Running mean over `window` steps, so that curves of noisy per-step losses stay readable.
std::vector<double> running_mean(const std::vector<double>& values, size_t window) {
  std::vector<double> out(values.size());
  double total = 0;
  for (size_t i = 0; i < values.size(); ++i) {
    total += values[i];
    if (i >= window) total -= values[i - window];
    out[i] = total / double(std::min(i + 1, window));
  }
  return out;
}

// A group's step losses, averaged over its seeds step by step (up to the shortest run).
std::vector<double> mean_step_losses(const RunGroup& group) {
  size_t steps = group.members.front()->train.step_losses.size();
  for (const CompareRunResult* r : group.members) {
    steps = std::min(steps, r->train.step_losses.size());
  }
  std::vector<double> mean(steps, 0.0);
  for (const CompareRunResult* r : group.members) {
    for (size_t i = 0; i < steps; ++i) mean[i] += r->train.step_losses[i];
  }
  for (double& v : mean) v /= double(group.members.size());
  return mean;
}

std::string series_label(const RunGroup& group) {
  return group.members.size() > 1
             ? fmt::format("{} (mean of {} seeds)", group.name, group.members.size())
             : group.name;
}

PlotFigure loss_curves(const std::vector<RunGroup>& groups) {
  constexpr size_t kWindow = 10;
  PlotPanel panel;
  panel.title = "training loss (" + std::to_string(kWindow) + "-step running mean)";
  panel.x_label = "step";
  panel.y_label = "loss";
  for (const RunGroup& g : groups) {
    const std::vector<double> losses = mean_step_losses(g);
    std::vector<double> steps(losses.size());
    for (size_t i = 0; i < steps.size(); ++i) steps[i] = double(i + 1);
    panel.series.push_back(make_series(series_label(g), steps, running_mean(losses, kWindow)));
  }
  return PlotFigure{"", {panel}};
}

// A group's means of what the trade-off figure plots.
struct TradeoffPoint {
  double kv, loss, recall;
};

TradeoffPoint tradeoff_point(const RunGroup& g) {
  std::vector<double> kv, loss, recall;
  for (const CompareRunResult* r : g.members) {
    kv.push_back(r->mean_kv_fraction);
    loss.push_back(final_train_loss(r->train));
    auto acc = recall_accuracy(r->eval);
    recall.push_back(acc ? acc->second : std::nan(""));
  }
  return {spread_of(kv).mean, spread_of(loss).mean, spread_of(recall).mean};
}

// The paper's trade-off figure: loss and recall versus KV fraction; the HAM sweep is one
// line, every other run a single marked point (means over seeds).
PlotFigure kv_tradeoff(const std::vector<RunGroup>& groups) {
  PlotPanel loss_panel;
  loss_panel.title = "final training loss vs KV fraction";
  loss_panel.x_label = "KV fraction (vs a Transformer's cache)";
  loss_panel.y_label = "train loss";
  std::optional<std::string> recall_name;
  for (const RunGroup& g : groups) {
    if (auto recall = recall_accuracy(g.members.front()->eval)) recall_name = recall->first;
  }
  PlotPanel recall_panel;
  recall_panel.title = recall_name.value_or("recall") + " vs KV fraction";
  recall_panel.x_label = "KV fraction (vs a Transformer's cache)";
  recall_panel.y_label = "accuracy";
  recall_panel.y_min = 0;
  recall_panel.y_max = 1;

  // Sweep groups by base config name, sorted by KV fraction.
  std::map<std::string, std::vector<TradeoffPoint>> sweeps;
  for (const RunGroup& g : groups) {
    if (g.members.front()->run.kv_target) {
      sweeps[g.name.substr(0, g.name.find('@'))].push_back(tradeoff_point(g));
    }
  }
  for (auto& [name, points] : sweeps) {
    std::sort(points.begin(), points.end(),
              [](const TradeoffPoint& a, const TradeoffPoint& b) { return a.kv < b.kv; });
    std::vector<double> kv, loss, recall;
    for (const TradeoffPoint& p : points) {
      kv.push_back(p.kv);
      loss.push_back(p.loss);
      recall.push_back(p.recall);
    }
    loss_panel.series.push_back(make_series(name + " sweep", kv, loss, PlotStyle::LinesPoints));
    recall_panel.series.push_back(make_series(name + " sweep", kv, recall, PlotStyle::LinesPoints));
  }
  for (const RunGroup& g : groups) {
    if (g.members.front()->run.kv_target) continue;
    const TradeoffPoint p = tradeoff_point(g);
    const double kv = std::isfinite(p.kv) ? p.kv : 0.0;
    PlotSeries loss_point = make_series(g.name, {kv}, {p.loss}, PlotStyle::Points);
    PlotSeries recall_point = make_series(g.name, {kv}, {p.recall}, PlotStyle::Points);
    loss_point.width = recall_point.width = 3;  // point size: a lone point must stand out
    loss_panel.series.push_back(loss_point);
    recall_panel.series.push_back(recall_point);
  }
  loss_panel.x_min = recall_panel.x_min = -0.05;
  loss_panel.x_max = recall_panel.x_max = 1.05;
  PlotFigure figure{"", {loss_panel}};
  if (recall_name) figure.panels.push_back(recall_panel);
  figure.columns = int64_t(figure.panels.size());
  return figure;
}

nlohmann::json finite_or_null(double v) {
  return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json();
}

// report.json's summary of a group: its runs, seeds and each metric's spread.
nlohmann::json group_to_json(const RunGroup& g, const std::vector<double>& loss_below) {
  nlohmann::json runs = nlohmann::json::array(), seeds = nlohmann::json::array();
  for (const CompareRunResult* r : g.members) {
    runs.push_back(r->run.name);
    if (r->run.seed) seeds.push_back(*r->run.seed);
  }
  nlohmann::json metrics = nlohmann::json::object();
  const std::vector<RunMetric> columns = run_metrics(*g.members.front(), loss_below);
  const std::vector<Spread> spreads = group_metrics(g, loss_below);
  for (size_t i = 0; i < columns.size(); ++i) {
    const Spread& s = spreads[i];
    metrics[columns[i].name] = {{"mean", finite_or_null(s.mean)},
                                {"std", finite_or_null(s.stddev)},
                                {"min", finite_or_null(s.min)},
                                {"max", finite_or_null(s.max)},
                                {"count", s.count}};
  }
  return {{"name", g.name}, {"family", g.members.front()->family}, {"runs", runs},
          {"seeds", seeds}, {"metrics", metrics}};
}

}  // namespace

std::string write_comparison_report(const CompareSpec& spec, const CompareResult& result,
                                    const std::string& out_dir, bool plots) {
  HAM_CHECK(!result.runs.empty(), "write_comparison_report: no runs to report");
  const std::vector<RunGroup> groups = group_runs(result);
  const TrainOptions& t = spec.train;
  const std::string seeds =
      spec.seeds.empty() ? fmt::format("data seed {}", t.seed)
                         : fmt::format("seeds {} (each the model's and the data's)",
                                       fmt::join(spec.seeds, ", "));
  std::string md = "# ham compare\n\n";
  md += fmt::format("Spec: `{}`. Every run trained {} steps of {} x {} tokens ({} tokens), {}, "
                    "then was evaluated with the same options. Total time {:.0f} s.\n\n",
                    spec.source, t.steps, t.batch_size * t.grad_accum, t.seq_len,
                    t.steps * t.batch_size * t.grad_accum * t.seq_len, seeds,
                    result.total_seconds);
  if (!spec.seeds.empty()) {
    md += "Over the seeds: mean ± sample standard deviation.\n\n";
    md += markdown_seed_table(groups, spec.loss_below);
    md += "\nEvery run:\n\n";
  }
  md += markdown_table(result, spec.loss_below);
  md += "\nKV fraction: HAM's measured selected-token fraction in evaluation (mean over layers); "
        "for other families the share of layers that keep a full KV cache. Peak memory: the most "
        "memory asked of the training device's pool at once during training (tensors; on a "
        "GPU also cuBLASLt's workspace).";
  if (!spec.loss_below.empty()) {
    md += " First step with loss < x: the first step where the mean of the last 20 training "
          "losses is below x; - where no step is (with seeds, the mean is over the seeds that "
          "got there).";
  }
  md += plots ? "\n\n![training loss](loss_curves.png)\n\n![KV trade-off](kv_tradeoff.png)\n"
               : "\n\n(No plots: written with --no-plots.)\n";

  nlohmann::json runs = nlohmann::json::array();
  for (const CompareRunResult& r : result.runs) {
    nlohmann::json below = nlohmann::json::array();
    for (double threshold : spec.loss_below) {
      const std::optional<int64_t> step = first_step_below(r.train.step_losses, threshold);
      below.push_back({{"loss", threshold}, {"step", step ? nlohmann::json(*step) : nlohmann::json()}});
    }
    runs.push_back({{"name", r.run.name},
                    {"group", r.run.group},
                    {"seed", r.run.seed ? nlohmann::json(*r.run.seed) : nlohmann::json()},
                    {"family", r.family},
                    {"config", r.run.config.to_json()},
                    {"kv_target", r.run.kv_target ? nlohmann::json(*r.run.kv_target) : nlohmann::json()},
                    {"parameters", r.parameters},
                    {"kv_fraction", finite_or_null(r.mean_kv_fraction)},
                    {"train_seconds", r.train.train_seconds},
                    {"peak_memory_bytes", r.train.peak_memory_bytes},
                    {"final_train_loss", final_train_loss(r.train)},
                    {"first_step_below", below},
                    {"step_losses", r.train.step_losses},
                    {"weights", r.weights_dir},
                    {"eval", r.eval.to_json()}});
  }
  nlohmann::json group_summaries = nlohmann::json::array();
  for (const RunGroup& g : groups) group_summaries.push_back(group_to_json(g, spec.loss_below));
  // Generated NIAH answers may hold bytes that are not UTF-8: they become U+FFFD in JSON.
  nlohmann::json report = {{"spec", spec.source}, {"train", spec.train.to_json()},
                           {"eval", spec.eval.to_json()}, {"sweep_kv", spec.sweep_kv},
                           {"seeds", spec.seeds}, {"loss_below", spec.loss_below},
                           {"total_seconds", result.total_seconds},
                           {"runs", runs}, {"groups", group_summaries}};
  // Written before the plots (which made the directory before), so that a plot that fails
  // loses no report.
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  HAM_CHECK(fs::is_directory(out_dir), "compare: cannot create the report's directory ",
            out_dir, ec ? ": " + ec.message() : std::string());
  for (const auto& [name, text] : {std::pair<std::string, std::string>{"report.md", md},
                                   {"report.json", report.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n"}}) {
    write_file_atomically((fs::path(out_dir) / name).string(), text);
  }
  if (plots) {
    write_plot(loss_curves(groups), (fs::path(out_dir) / "loss_curves.png").string());
    write_plot(kv_tradeoff(groups), (fs::path(out_dir) / "kv_tradeoff.png").string());
  }
  return md;
}

}  // namespace ham
