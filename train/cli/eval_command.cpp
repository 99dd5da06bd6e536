// ham eval: a trained model's perplexity, MQAR and RULER NIAH accuracy at several lengths,
// multiple-choice accuracy, and (HAM) KV fraction per layer; a table and, optionally, JSON.
// With --every-checkpoint, every checkpoint of a run: the metrics against the training step.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "train/checkpoint.h"
#include "train/cli/commands.h"
#include "train/evaluation.h"
#include "train/plot.h"
#include "train/sampling.h"
#include "train/tokenizer.h"
#include "train/trained_model.h"

namespace ham::cli {

namespace {

struct EvalArgs {
  std::string model_dir;
  EvalOptions options;
  bool no_perplexity = false;
  bool full_forward = false;  // NIAH answers by the reference completer
  std::optional<double> tau;
  std::string json_path;
  bool every_checkpoint = false;  // each step-NNNNNNNN/ of a run directory, oldest first
  std::string plot_path;          // with every_checkpoint: the metrics against the step
  int threads = 0;
  std::string tokenizer;  // "": the one saved with each model, else bytes
};

// Evaluates the model at `path` (checkpoint, run directory or export).
EvalReport evaluate_one(const EvalArgs& args, EvalOptions options, const std::string& path) {
  TrainedModel trained = load_trained_model(path);
  options.tokenizer = args.tokenizer.empty() ? trained.tokenizer : args.tokenizer;
  if (args.tau) set_routing_threshold(*trained.model, *args.tau);
  const LanguageModel& model = *trained.model;
  Completer complete;
  if (!options.niah_tasks.empty()) {
    std::unique_ptr<Tokenizer> tokenizer = load_tokenizer(options.tokenizer);
    if (args.full_forward) {
      complete = full_forward_completer(model, answer_stop_tokens(*tokenizer, model.config().vocab_size));
    } else {
      // The KV-cached decoder; evaluate_niah cuts the answer at its first newline.
      std::optional<int64_t> stop;
      if (tokenizer->eot_id() >= 0) stop = tokenizer->eot_id();
      complete = greedy_completer(model, stop);
    }
  }
  EvalReport report = evaluate_model(model, options, complete, &std::cout);
  if (complete) report.generation = args.full_forward ? "full forward" : "kv-cached decoder";
  report.source = trained.source;
  report.step = trained.step;
  return report;
}

// The headline metrics of every checkpoint's report (and HAM's KV fraction), as columns.
struct LearningCurves {
  std::vector<double> steps;
  std::vector<std::pair<std::string, std::vector<double>>> metrics;
};

LearningCurves learning_curves(const std::vector<EvalReport>& reports) {
  LearningCurves curves;
  for (const EvalMetric& m : reports.front().metrics()) curves.metrics.push_back({m.name, {}});
  const bool routed = std::isfinite(reports.front().mean_kv_fraction());
  if (routed) curves.metrics.push_back({"KV fraction", {}});
  for (const EvalReport& report : reports) {
    curves.steps.push_back(double(report.step));
    std::vector<EvalMetric> metrics = report.metrics();
    if (routed) metrics.push_back({"KV fraction", report.mean_kv_fraction()});
    for (size_t i = 0; i < metrics.size(); ++i) {
      curves.metrics[i].second.push_back(metrics[i].value);
    }
  }
  return curves;
}

// One line per checkpoint: its step, then each metric, columns aligned.
std::string learning_curve_table(const LearningCurves& curves) {
  std::vector<std::vector<std::string>> rows(curves.steps.size() + 1);
  rows[0].push_back("step");
  for (size_t r = 0; r < curves.steps.size(); ++r) {
    rows[r + 1].push_back(fmt::format("{}", curves.steps[r]));
  }
  for (const auto& [name, values] : curves.metrics) {
    rows[0].push_back(name);
    for (size_t r = 0; r < values.size(); ++r) {
      rows[r + 1].push_back(fmt::format("{:.4f}", values[r]));
    }
  }
  std::vector<size_t> widths(rows[0].size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) {
      out += fmt::format("{}{:>{}}", c ? "  " : "", row[c], widths[c]);
    }
    out += "\n";
  }
  return out;
}

// A panel per metric, against the training step.
PlotFigure learning_curve_figure(const LearningCurves& curves, const std::string& run) {
  PlotFigure figure;
  figure.title = "ham eval of every checkpoint of " + run;
  for (const auto& [name, values] : curves.metrics) {
    PlotPanel panel;
    panel.title = name;
    panel.x_label = "step";
    // Labelled, so that the CSV beside the PNG names what each point is.
    panel.series.push_back(make_series(name, curves.steps, values, PlotStyle::LinesPoints));
    figure.panels.push_back(std::move(panel));
  }
  figure.columns = std::min<int64_t>(2, int64_t(figure.panels.size()));
  return figure;
}

void write_json(const std::string& path, const nlohmann::json& j) {
  std::ofstream out(path);
  HAM_CHECK(out, path, ": cannot open for writing (--json)");
  // Generated text may hold bytes that are not UTF-8; JSON gets U+FFFD in their place.
  out << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  HAM_CHECK(out.good(), path, ": write failed (--json)");
  std::cout << "results written to " << path << "\n";
}

int run_eval(const EvalArgs& args) {
  use_threads(args.threads);
  EvalOptions options = args.options;
  options.perplexity = !args.no_perplexity;
  options.validate();  // bad options fail before the weights load
  HAM_CHECK(args.plot_path.empty() || args.every_checkpoint,
            "--plot draws the metrics of --every-checkpoint against the step; add it");
  if (!args.json_path.empty()) prepare_output_file(args.json_path, "--json");
  if (!args.plot_path.empty()) {
    HAM_CHECK(!find_gnuplot().empty(),
              "--plot: gnuplot is not installed (scripts/install_deps.sh)");
    prepare_output_file(args.plot_path, "--plot");
  }
  if (!args.every_checkpoint) {
    const EvalReport report = evaluate_one(args, options, args.model_dir);
    std::cout << report.table();
    if (!args.json_path.empty()) write_json(args.json_path, report.to_json());
    return 0;
  }
  const std::vector<std::string> checkpoints = list_checkpoints(args.model_dir);
  HAM_CHECK(!checkpoints.empty(), args.model_dir, ": holds no complete checkpoint (",
            "--every-checkpoint evaluates the step-NNNNNNNN/ directories `ham train --out` ",
            "writes; keep them with --keep 0)");
  std::vector<EvalReport> reports;
  for (size_t i = 0; i < checkpoints.size(); ++i) {
    std::cout << fmt::format("checkpoint {}/{}: {}\n", i + 1, checkpoints.size(), checkpoints[i]);
    reports.push_back(evaluate_one(args, options, checkpoints[i]));
  }
  const LearningCurves curves = learning_curves(reports);
  std::cout << fmt::format("{} checkpoints of {}:\n", reports.size(), args.model_dir)
            << learning_curve_table(curves);
  if (!args.json_path.empty()) {
    nlohmann::json all = nlohmann::json::array();
    for (const EvalReport& report : reports) all.push_back(report.to_json());
    write_json(args.json_path, {{"checkpoints", all}});
  }
  if (!args.plot_path.empty()) {
    const PlotFiles files =
        write_plot(learning_curve_figure(curves, args.model_dir), args.plot_path);
    std::cout << "plot written to " << files.png << " (and " << files.csv << ")\n";
  }
  return 0;
}

}  // namespace

Command add_eval_command(CLI::App& root) {
  auto args = std::make_shared<EvalArgs>();
  EvalOptions& o = args->options;
  CLI::App* cmd = root.add_subcommand(
      "eval", "Evaluate a trained model: perplexity, MQAR, RULER NIAH, multiple choice (and HAM's KV fraction per layer)");
  cmd->add_option("model_dir", args->model_dir, "A checkpoint directory, an output directory (its newest checkpoint) or a --export directory")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--data", o.data_path, "Perplexity data as for `ham train --data`: text is measured on its held-out last 5% of documents, token shards (.bin or glob) whole (default: the embedded corpus)")
      ->capture_default_str();
  cmd->add_flag("--no-perplexity", args->no_perplexity, "Skip the perplexity measurement");
  cmd->add_option("--tokenizer", args->tokenizer, "bytes or a tokenizer.json: the data's tokenizer (text is encoded with it, shards were; it gives the document-start id and the bytes for bits per byte), and the encoder for NIAH prompts and multiple-choice text (default: the tokenizer.json saved with the model, else bytes)");
  cmd->add_option("--seq-len", o.seq_len, "Tokens per perplexity window")->capture_default_str();
  cmd->add_option("--batch-size", o.batch_size, "Sequences per forward pass (perplexity, MQAR)")
      ->capture_default_str();
  cmd->add_option("--max-batches", o.max_batches, "Perplexity batches at most (0: all of the data)")
      ->capture_default_str();
  cmd->add_option("--mqar-lengths", o.mqar_lengths, "MQAR sequence lengths, e.g. 64,128,256")
      ->delimiter(',');
  cmd->add_option("--mqar-pairs", o.mqar_pairs, "Key-value pairs per MQAR sequence (4 x pairs <= length)")
      ->capture_default_str();
  cmd->add_option("--niah", o.niah_tasks, "RULER NIAH tasks, e.g. single_1,multikey_1 (single_1-3, multikey_1-3, multivalue, multiquery)")
      ->delimiter(',');
  cmd->add_option("--niah-lengths", o.niah_lengths, "NIAH prompt lengths in tokens, e.g. 256,512")
      ->delimiter(',');
  cmd->add_option("--niah-margin", o.niah_margin_tokens, "Tokens generated beyond the expected answer's length")
      ->capture_default_str();
  cmd->add_option("--samples", o.samples, "Sequences per MQAR length and per NIAH task and length")
      ->capture_default_str();
  cmd->add_option("--choices", o.choice_files, "Multiple-choice JSONL files: {\"context\": str, \"choices\": [str, ...], \"answer\": int} per line (repeatable)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--seed", o.seed, "Seed of the MQAR dataset and the NIAH prompts (training mixtures use MQAR seed 0)")
      ->capture_default_str();
  cmd->add_flag("--full-forward", args->full_forward, "Generate NIAH answers with the full forward pass over the growing sequence (the slow, exact reference) instead of the KV-cached decoder");
  cmd->add_option("--tau", args->tau, "HAM: set every layer's routing threshold tau (score units) for all tasks");
  cmd->add_option("--json", args->json_path, "Write the results as JSON to this file ({\"checkpoints\": [...]} with --every-checkpoint)");
  cmd->add_flag("--every-checkpoint", args->every_checkpoint, "Evaluate every checkpoint of the run directory given, oldest first, and print each metric against the training step (learning curves; `ham train --checkpoint-every N --keep 0` keeps them all)");
  cmd->add_option("--plot", args->plot_path, "With --every-checkpoint: draw each metric against the step into this PNG (and a .csv and .gp beside it)");
  add_threads_option(cmd, &args->threads);
  return {cmd, [args] { return run_eval(*args); }};
}

}  // namespace ham::cli
