// ham train: train a model on CPU on byte-level text (the embedded corpus by default).
#include <omp.h>

#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "models/language_model.h"
#include "train/cli/commands.h"
#include "train/text_data.h"
#include "train/trainer.h"

namespace ham::cli {

namespace {

struct TrainArgs {
  TrainOptions options;
  std::string config_path, data_path, save_path;
  int threads = 0;
};

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HAM_CHECK(in, path, ": cannot open training text");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int run_train(const TrainArgs& args) {
  if (args.threads > 0) omp_set_num_threads(args.threads);
  ModelConfig config = args.config_path.empty() ? ModelConfig{} : ModelConfig::from_file(args.config_path);
  std::string source = args.data_path.empty() ? "<embedded corpus>" : args.data_path;
  std::string text = args.data_path.empty() ? std::string(default_corpus()) : read_text_file(args.data_path);
  auto [train_data, val_data] = TokenStream::from_text(text, 0.05, source);
  HAM_CHECK(config.vocab_size >= ByteTokenizer::kVocabSize,
            args.config_path.empty() ? "<built-in config>" : args.config_path,
            ": key 'vocab_size' must be at least ", ByteTokenizer::kVocabSize,
            " for byte-level text, got ", config.vocab_size);
  auto model = make_model(config);
  std::cout << fmt::format("{} model: {} parameters\n", family_name(config.family),
                           model->num_parameters());
  std::cout << fmt::format("data: {} ({} train tokens, {} validation tokens), {} threads\n",
                           source, train_data.size(), val_data.size(), omp_get_max_threads());
  TrainResult r = train(*model, train_data, val_data, args.options, std::cout);
  double drop = 100.0 * (1.0 - r.final_loss / r.first_loss);
  std::cout << fmt::format("done: training loss {:.4f} -> {:.4f} ({:.1f}% lower)", r.first_loss,
                           r.final_loss, drop);
  if (r.initial_val_loss > 0) {
    std::cout << fmt::format(", validation loss {:.4f} -> {:.4f}", r.initial_val_loss,
                             r.final_val_loss);
  }
  std::cout << "\n";
  if (!args.save_path.empty()) {
    save_safetensors(args.save_path, model->named_parameters(),
                     std::map<std::string, std::string>{{"config", config.to_json().dump()}});
    std::cout << "weights written to " << args.save_path << "\n";
  }
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& root) {
  auto args = std::make_shared<TrainArgs>();
  TrainOptions& o = args->options;
  CLI::App* cmd = root.add_subcommand("train", "Train a model on CPU (byte-level text)");
  cmd->add_option("--config", args->config_path, "Model config JSON (default: the tiny built-in Transformer)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--data", args->data_path, "Training text; documents separated by lines '<|endoftext|>' (default: the embedded corpus)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--steps", o.steps, "Optimizer steps")->capture_default_str();
  cmd->add_option("--batch-size", o.batch_size, "Sequences per micro-batch")->capture_default_str();
  cmd->add_option("--seq-len", o.seq_len, "Tokens per sequence")->capture_default_str();
  cmd->add_option("--grad-accum", o.grad_accum, "Micro-batches per step")->capture_default_str();
  cmd->add_option("--lr", o.lr, "Peak learning rate")->capture_default_str();
  cmd->add_option("--warmup", o.warmup_steps, "Linear warmup steps")->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW weight decay (matrices only)")->capture_default_str();
  cmd->add_option("--clip", o.clip, "Global gradient-norm clip")->capture_default_str();
  cmd->add_option("--log-every", o.log_every, "Steps between progress lines")->capture_default_str();
  cmd->add_option("--eval-every", o.eval_every, "Steps between validation losses")->capture_default_str();
  cmd->add_option("--seed", o.seed, "Data sampling seed")->capture_default_str();
  cmd->add_option("--threads", args->threads, "CPU threads (default: OpenMP's choice)");
  cmd->add_flag("--skip-nonfinite", o.skip_nonfinite, "Skip steps whose loss or gradient is NaN/Inf instead of stopping");
  cmd->add_option("--save-weights", args->save_path, "Write the trained weights to this .safetensors file");
  return {cmd, [args] { return run_train(*args); }};
}

}  // namespace ham::cli
