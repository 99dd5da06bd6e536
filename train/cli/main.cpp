// The `ham` command-line program.
//   ham train [--config FILE] [--data FILE] [--steps N] ...   train a model on CPU
//   ham info  [--config FILE]                                  parameters of a model
#include <omp.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <fmt/format.h>

#include "core/safetensors.h"
#include "models/language_model.h"
#include "nn/layers.h"
#include "train/text_data.h"
#include "train/trainer.h"

namespace {

using namespace ham;

ModelConfig load_config(const std::string& path) {
  return path.empty() ? ModelConfig{} : ModelConfig::from_file(path);
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  HAM_CHECK(in, path, ": cannot open training text");
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void print_parameters(const LanguageModel& model, bool verbose) {
  if (verbose) {
    for (const auto& [name, p] : model.named_parameters()) {
      std::cout << fmt::format("  {:<40} {}\n", name, shape_str(p.shape()));
    }
  }
  std::cout << fmt::format("{} model: {} parameters\n", family_name(model.config().family),
                           model.num_parameters());
}

int run_train(const std::string& config_path, const std::string& data_path,
              const std::string& save_path, TrainOptions options, int threads) {
  if (threads > 0) omp_set_num_threads(threads);
  ModelConfig config = load_config(config_path);
  std::string source = data_path.empty() ? "<embedded corpus>" : data_path;
  std::string text = data_path.empty() ? std::string(default_corpus()) : read_text_file(data_path);
  auto [train_data, val_data] = TokenStream::from_text(text, 0.05, source);
  HAM_CHECK(config.vocab_size >= ByteTokenizer::kVocabSize, config_path,
            ": key 'vocab_size' must be at least ", ByteTokenizer::kVocabSize,
            " for byte-level text, got ", config.vocab_size);
  auto model = make_model(config);
  print_parameters(*model, false);
  std::cout << fmt::format("data: {} ({} train tokens, {} validation tokens), {} threads\n",
                           source, train_data.size(), val_data.size(), omp_get_max_threads());
  TrainResult r = train(*model, train_data, val_data, options, std::cout);
  double drop = 100.0 * (1.0 - r.final_loss / r.first_loss);
  std::cout << fmt::format("done: training loss {:.4f} -> {:.4f} ({:.1f}% lower)", r.first_loss,
                           r.final_loss, drop);
  if (r.initial_val_loss > 0) {
    std::cout << fmt::format(", validation loss {:.4f} -> {:.4f}", r.initial_val_loss,
                             r.final_val_loss);
  }
  std::cout << "\n";
  if (!save_path.empty()) {
    save_safetensors(save_path, model->named_parameters(),
                     std::map<std::string, std::string>{{"config", model->config().to_json().dump()}});
    std::cout << "weights written to " << save_path << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ham: train and compare Transformer, GDN, GDN-GSA and HAM language models"};
  app.require_subcommand(1);

  TrainOptions options;
  std::string config_path, data_path, save_path;
  int threads = 0;
  CLI::App* train_cmd = app.add_subcommand("train", "Train a model (CPU; byte-level text)");
  train_cmd->add_option("--config", config_path, "Model config JSON (default: the tiny built-in Transformer)")
      ->check(CLI::ExistingFile);
  train_cmd->add_option("--data", data_path, "Training text file; documents separated by lines '<|endoftext|>' (default: the embedded corpus)")
      ->check(CLI::ExistingFile);
  train_cmd->add_option("--steps", options.steps, "Optimizer steps")->capture_default_str();
  train_cmd->add_option("--batch-size", options.batch_size, "Sequences per micro-batch")->capture_default_str();
  train_cmd->add_option("--seq-len", options.seq_len, "Tokens per sequence")->capture_default_str();
  train_cmd->add_option("--grad-accum", options.grad_accum, "Micro-batches per step")->capture_default_str();
  train_cmd->add_option("--lr", options.lr, "Peak learning rate")->capture_default_str();
  train_cmd->add_option("--warmup", options.warmup_steps, "Linear warmup steps")->capture_default_str();
  train_cmd->add_option("--weight-decay", options.weight_decay, "AdamW weight decay (matrices only)")->capture_default_str();
  train_cmd->add_option("--clip", options.clip, "Global gradient-norm clip")->capture_default_str();
  train_cmd->add_option("--log-every", options.log_every, "Steps between progress lines")->capture_default_str();
  train_cmd->add_option("--eval-every", options.eval_every, "Steps between validation losses")->capture_default_str();
  train_cmd->add_option("--seed", options.seed, "Data sampling seed")->capture_default_str();
  train_cmd->add_option("--threads", threads, "CPU threads (default: OpenMP's choice)");
  train_cmd->add_flag("--skip-nonfinite", options.skip_nonfinite, "Skip steps whose loss or gradient is NaN/Inf instead of stopping");
  train_cmd->add_option("--save-weights", save_path, "Write the trained weights to this .safetensors file");

  CLI::App* info_cmd = app.add_subcommand("info", "Print a model's parameters");
  std::string info_config;
  info_cmd->add_option("--config", info_config, "Model config JSON")->check(CLI::ExistingFile);

  CLI11_PARSE(app, argc, argv);
  try {
    if (*train_cmd) return run_train(config_path, data_path, save_path, options, threads);
    if (*info_cmd) {
      SkipInitGuard structure_only;
      auto model = make_model(load_config(info_config));
      print_parameters(*model, true);
      return 0;
    }
  } catch (const std::exception& e) {
    std::cerr << "ham: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
