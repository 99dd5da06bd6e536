// ham train: train a model on CPU on byte-level text (the embedded corpus by default),
// with checkpoints, exact resume and a weights-only export.
#include <omp.h>

#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "models/language_model.h"
#include "train/checkpoint.h"
#include "train/cli/commands.h"
#include "train/shards.h"
#include "train/text_data.h"
#include "train/tokenizer.h"
#include "train/trainer.h"

namespace ham::cli {

namespace {

// Applies "--set model.key=value" / "--set train.key=value" (value parsed as JSON, else a
// string) before anything is built, so a bad key or value fails first.
void apply_overrides(const std::vector<std::string>& overrides, nlohmann::json& model_json,
                     TrainOptions& options, bool resuming) {
  for (const std::string& text : overrides) {
    size_t dot = text.find('.'), eq = text.find('=');
    HAM_CHECK(dot != std::string::npos && eq != std::string::npos && dot < eq,
              "--set ", text, ": expected section.key=value with section model or train");
    std::string section = text.substr(0, dot), key = text.substr(dot + 1, eq - dot - 1);
    std::string raw = text.substr(eq + 1);
    nlohmann::json value = nlohmann::json::parse(raw, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = raw;
    if (section == "model") {
      HAM_CHECK(!resuming, "--set ", text, ": a resumed run keeps its checkpoint's model");
      model_json[key] = value;
    } else if (section == "train") {
      options.update_from_json({{key, value}}, "--set " + text);
    } else {
      HAM_FAIL("--set ", text, ": unknown section '", section, "' (expected model or train)");
    }
  }
}

struct TrainArgs {
  TrainOptions options;
  std::string config_path, train_config_path, resume_path, export_dir;
  std::vector<std::string> overrides;  // --set section.key=value
  int threads = 0;
  // Options given on the command line, each with how to copy it onto resumed options.
  std::vector<std::pair<CLI::Option*, std::function<void(TrainOptions&, const TrainOptions&)>>> given;
};

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HAM_CHECK(in, path, ": cannot open training text");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

bool is_shard_spec(const std::string& path) {
  return path.find('*') != std::string::npos || path.find('?') != std::string::npos ||
         (path.size() > 4 && path.compare(path.size() - 4, 4, ".bin") == 0);
}

struct TrainingData {
  std::unique_ptr<TokenSource> train, val;
  std::string description;
};

// Byte-level text (the embedded corpus or a file; 5% of documents held out), or llm.c
// token shards (validation from --val-data), checked against the model's vocabulary.
TrainingData open_training_data(const TrainOptions& options, const ModelConfig& config) {
  TrainingData data;
  if (is_shard_spec(options.data_path)) {
    auto tokenizer = load_tokenizer(options.tokenizer);
    int64_t doc_start = tokenizer->document_start_id();
    HAM_CHECK(config.vocab_size >= tokenizer->vocab_size(), "model config: key 'vocab_size' (",
              config.vocab_size, ") is smaller than the tokenizer's vocabulary (",
              tokenizer->vocab_size(), ", ", options.tokenizer, ")");
    data.train = std::make_unique<ShardDataset>(std::vector<std::string>{options.data_path},
                                                config.vocab_size, doc_start);
    if (!options.val_data_path.empty()) {
      data.val = std::make_unique<ShardDataset>(std::vector<std::string>{options.val_data_path},
                                                config.vocab_size, doc_start);
    } else {
      data.val = std::make_unique<TokenStream>(std::vector<int64_t>{});
    }
    data.description = options.data_path + " (token shards)";
    return data;
  }
  HAM_CHECK(options.val_data_path.empty(), "--val-data is for token shards; text data holds out "
            "its last 5% of documents");
  std::string source = options.data_path.empty() ? "<embedded corpus>" : options.data_path;
  std::string text = options.data_path.empty() ? std::string(default_corpus())
                                               : read_text_file(options.data_path);
  auto [train_stream, val_stream] = TokenStream::from_text(text, 0.05, source);
  HAM_CHECK(config.vocab_size >= ByteTokenizer::kVocabSize, "model config: key 'vocab_size' must "
            "be at least ", ByteTokenizer::kVocabSize, " for byte-level text, got ", config.vocab_size);
  data.train = std::make_unique<TokenStream>(std::move(train_stream));
  data.val = std::make_unique<TokenStream>(std::move(val_stream));
  data.description = source;
  return data;
}

int run_train(const TrainArgs& args) {
  if (args.threads > 0) omp_set_num_threads(args.threads);
  ModelConfig config;
  TrainOptions options = args.options;
  std::unique_ptr<CheckpointContents> resume;
  if (!args.resume_path.empty()) {
    HAM_CHECK(args.config_path.empty(), "--resume takes the model config from the checkpoint; drop --config");
    resume = std::make_unique<CheckpointContents>(load_checkpoint(args.resume_path));
    std::string state_file = resume->state.value("checkpoint_dir", args.resume_path) + "/state.json";
    config = ModelConfig::from_json(resume->state.at("config"), state_file);
    options = TrainOptions{};
    options.update_from_json(resume->state.at("train"), state_file);
    for (const auto& [option, copy] : args.given) {
      if (option->count() > 0) copy(options, args.options);  // explicit flags win
    }
  } else {
    if (!args.config_path.empty()) config = ModelConfig::from_file(args.config_path);
    if (!args.train_config_path.empty()) {
      // The file sets the base; flags given on the command line still win.
      options = TrainOptions{};
      options.update_from_file(args.train_config_path);
      for (const auto& [option, copy] : args.given) {
        if (option->count() > 0) copy(options, args.options);
      }
    }
  }
  if (!args.overrides.empty()) {
    nlohmann::json model_json = config.to_json();
    apply_overrides(args.overrides, model_json, options, resume != nullptr);
    config = ModelConfig::from_json(
        model_json, (args.config_path.empty() ? std::string("<built-in config>") : args.config_path) + " with --set");
  }
  TrainingData data = open_training_data(options, config);
  auto model = make_model(config);
  std::cout << fmt::format("{} model: {} parameters\n", family_name(config.family),
                           model->num_parameters());
  std::cout << "config: " << config.to_json().dump() << "\n";
  std::cout << "train: " << options.to_json().dump() << "\n";
  std::cout << fmt::format("data: {} ({} train tokens, {} validation tokens), {} threads\n",
                           data.description, data.train->size(), data.val->size(),
                           omp_get_max_threads());
  TrainResult r = train(*model, *data.train, *data.val, options, std::cout, resume.get());
  double drop = 100.0 * (1.0 - r.final_loss / r.first_loss);
  std::cout << fmt::format("done: training loss {:.4f} -> {:.4f} ({:.1f}% lower)", r.first_loss,
                           r.final_loss, drop);
  if (r.initial_val_loss > 0) {
    std::cout << fmt::format(", validation loss {:.4f} -> {:.4f}", r.initial_val_loss,
                             r.final_val_loss);
  }
  std::cout << "\n";
  if (!args.export_dir.empty()) {
    export_weights(args.export_dir, model->named_parameters(), config.to_json());
    std::cout << "weights exported to " << args.export_dir << " (model.safetensors, config.json)\n";
  }
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& root) {
  auto args = std::make_shared<TrainArgs>();
  TrainOptions& o = args->options;
  CLI::App* cmd = root.add_subcommand("train", "Train a model on CPU (text files, the embedded corpus or llm.c token shards)");
  cmd->add_option("--config", args->config_path, "Model config JSON (default: the tiny built-in Transformer)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--train-config", args->train_config_path, "Training options JSON (keys as printed in the 'train:' line, e.g. configs/train/paper.json); flags given here override it")
      ->check(CLI::ExistingFile);
  cmd->add_option("--resume", args->resume_path, "Continue from a checkpoint directory (or the newest one in an output directory); flags given here override the saved options")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--export", args->export_dir, "Write the final weights as model.safetensors + config.json into this directory");
  cmd->add_option("--threads", args->threads, "CPU threads (default: OpenMP's choice)");
  cmd->add_option("--set", args->overrides, "Override a config field: model.KEY=VALUE or train.KEY=VALUE (repeatable)");
  // Each training option is recorded so that, on --resume, an explicit flag overrides the
  // checkpoint's saved value.
  auto add = [&](const char* flag, auto TrainOptions::*member, const char* help) {
    CLI::Option* opt = cmd->add_option(flag, o.*member, help)->capture_default_str();
    args->given.emplace_back(opt, [member](TrainOptions& dst, const TrainOptions& src) {
      dst.*member = src.*member;
    });
    return opt;
  };
  add("--data", &TrainOptions::data_path, "Training text (documents separated by lines '<|endoftext|>'), or llm.c token shards: a .bin file or a glob (default: the embedded corpus)");
  add("--val-data", &TrainOptions::val_data_path, "Validation token shards (.bin file or glob)");
  add("--tokenizer", &TrainOptions::tokenizer, "Tokenizer of the shards: bytes or a tokenizer.json (gives the document-start token)");
  add("--steps", &TrainOptions::steps, "Optimizer steps (total, counting those before a resume)");
  add("--batch-size", &TrainOptions::batch_size, "Sequences per micro-batch");
  add("--seq-len", &TrainOptions::seq_len, "Tokens per sequence");
  add("--grad-accum", &TrainOptions::grad_accum, "Micro-batches per step");
  add("--lr", &TrainOptions::lr, "Peak learning rate");
  add("--warmup", &TrainOptions::warmup_steps, "Linear warmup steps");
  add("--weight-decay", &TrainOptions::weight_decay, "AdamW weight decay (matrices only)");
  add("--clip", &TrainOptions::clip, "Global gradient-norm clip");
  add("--log-every", &TrainOptions::log_every, "Steps between progress lines");
  add("--eval-every", &TrainOptions::eval_every, "Steps between validation losses");
  add("--seed", &TrainOptions::seed, "Data sampling seed");
  add("--out", &TrainOptions::out_dir, "Checkpoint directory (checkpoints are written only when set)");
  add("--log-dir", &TrainOptions::log_dir, "metrics.jsonl and TensorBoard events go here (default: --out)");
  add("--checkpoint-every", &TrainOptions::checkpoint_every, "Steps between checkpoints (0: only at the end)");
  add("--keep", &TrainOptions::keep_checkpoints, "Newest checkpoints to keep (0: all)");
  add("--mix-mqar", &TrainOptions::mix_mqar, "Fraction of training rows drawn from MQAR (associative recall)");
  add("--mqar-pairs", &TrainOptions::mqar_pairs, "Key-value pairs per MQAR row (4 x pairs <= seq-len)");
  add("--mix-niah", &TrainOptions::mix_niah, "Fraction of training rows drawn from RULER needle-in-a-haystack (byte-level data)");
  add("--peak-gflops", &TrainOptions::peak_gflops, "Hardware peak in GFLOP/s for the MFU estimate (0: measure this CPU's fp32 FMA peak)");
  CLI::Option* skip = cmd->add_flag("--skip-nonfinite", o.skip_nonfinite,
                                    "Skip steps whose loss or gradient is NaN/Inf instead of stopping");
  args->given.emplace_back(skip, [](TrainOptions& dst, const TrainOptions& src) {
    dst.skip_nonfinite = src.skip_nonfinite;
  });
  return {cmd, [args] { return run_train(*args); }};
}

}  // namespace ham::cli
