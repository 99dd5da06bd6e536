// ham eval: a trained model's perplexity, MQAR and RULER NIAH accuracy at several lengths,
// multiple-choice accuracy, and (HAM) KV fraction per layer; a table and, optionally, JSON.
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "train/cli/commands.h"
#include "train/evaluation.h"
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
  int threads = 0;
};

int run_eval(const EvalArgs& args) {
  use_threads(args.threads);
  EvalOptions options = args.options;
  options.perplexity = !args.no_perplexity;
  options.validate();  // bad options fail before the weights load
  if (!args.json_path.empty()) prepare_output_file(args.json_path, "--json");
  TrainedModel trained = load_trained_model(args.model_dir);
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
  std::cout << report.table();
  if (!args.json_path.empty()) {
    std::ofstream out(args.json_path);
    HAM_CHECK(out, args.json_path, ": cannot open for writing (--json)");
    // Generated text may hold bytes that are not UTF-8; JSON gets U+FFFD in their place.
    out << report.to_json().dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    HAM_CHECK(out.good(), args.json_path, ": write failed (--json)");
    std::cout << "results written to " << args.json_path << "\n";
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
  cmd->add_option("--tokenizer", o.tokenizer, "bytes or a tokenizer.json: the shards' document-start id, and the encoder for NIAH prompts and multiple-choice text")
      ->capture_default_str();
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
  cmd->add_option("--json", args->json_path, "Write the results as JSON to this file");
  add_threads_option(cmd, &args->threads);
  return {cmd, [args] { return run_eval(*args); }};
}

}  // namespace ham::cli
