// ham train: train a model on CPU or a GPU on byte-level text (the embedded corpus by default),
// with checkpoints, exact resume and a weights-only export.
#include <omp.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/kernel_settings.h"
#include "distributed/communicator.h"
#include "models/language_model.h"
#include "train/checkpoint.h"
#include "train/cli/commands.h"
#include "train/shards.h"
#include "train/stop_signals.h"
#include "train/text_data.h"
#include "train/tokenizer.h"
#include "train/trained_model.h"
#include "train/training_data.h"
#include "train/trainer.h"

namespace ham::cli {

namespace {

// Applies "--set model.key=value" / "--set train.key=value" (value parsed as JSON, else a
// string) before anything is built, so a bad key or value fails first. "--set
// kernel.name=value" sets a kernel variant switch of the process (core/kernel_settings.h,
// docs/kernel_settings.md); each one applied is returned as "name old -> new".
std::vector<std::string> apply_overrides(const std::vector<std::string>& overrides,
                                         nlohmann::json& model_json, TrainOptions& options,
                                         bool resuming) {
  std::vector<std::string> kernel_settings_applied;
  for (const std::string& text : overrides) {
    size_t dot = text.find('.'), eq = text.find('=');
    HAM_CHECK(dot != std::string::npos && eq != std::string::npos && dot < eq,
              "--set ", text, ": expected section.key=value with section model, train or kernel");
    std::string section = text.substr(0, dot), key = text.substr(dot + 1, eq - dot - 1);
    std::string raw = text.substr(eq + 1);
    nlohmann::json value = nlohmann::json::parse(raw, nullptr, /*allow_exceptions=*/false);
    if (value.is_discarded()) value = raw;
    if (section == "model") {
      HAM_CHECK(!resuming, "--set ", text, ": a resumed run keeps its checkpoint's model");
      model_json[key] = value;
    } else if (section == "train") {
      options.update_from_json({{key, value}}, "--set " + text);
    } else if (section == "kernel") {
      try {
        kernel_settings_applied.push_back(apply_kernel_setting(key, raw));
      } catch (const std::exception& e) {
        HAM_FAIL("--set ", text, ": ", e.what());
      }
    } else {
      HAM_FAIL("--set ", text, ": unknown section '", section,
               "' (expected model, train or kernel)");
    }
  }
  return kernel_settings_applied;
}

struct TrainArgs {
  TrainOptions options;
  std::string config_path, train_config_path, resume_path, export_dir;
  std::vector<std::string> overrides;  // --set section.key=value
  int threads = 0;
  // Options given on the command line, each with how to copy it onto resumed options.
  std::vector<std::pair<CLI::Option*, std::function<void(TrainOptions&, const TrainOptions&)>>> given;
  CLI::Option* device_option = nullptr;
};

// Where the run trains: --device, or for --resume without it the checkpoint's device.
std::string training_device(const TrainArgs& args) {
  if (args.resume_path.empty() || args.device_option->count() > 0) return args.options.device;
  const nlohmann::json state = load_checkpoint_state(args.resume_path);
  return state.at("train").value("device", args.options.device);
}

int train_on_this_rank(const TrainArgs& args, const std::shared_ptr<dist::Communicator>& world);

// Plain `ham train` is a world of one; under mpirun every rank runs the same command and
// trains its share of the batch (a rank that fails ends the whole job, naming itself).
int run_train(const TrainArgs& args) {
  // Ctrl-C or SIGTERM stops between steps with a checkpoint; a second one kills.
  StopSignals stop_signals;
  // CUDA tensors move between ranks over NCCL, CPU tensors over MPI.
  dist::WorldOptions world_options;
  world_options.use_nccl = Device::parse(training_device(args)).is_cuda();
  std::shared_ptr<dist::Communicator> world = dist::make_world_communicator(world_options);
  if (world->size() == 1) return train_on_this_rank(args, world);
  return dist::run_or_abort_job(*world, [&] { return train_on_this_rank(args, world); });
}

int train_on_this_rank(const TrainArgs& args, const std::shared_ptr<dist::Communicator>& world) {
  use_threads(args.threads);
  // Only rank 0 prints; the others' output would repeat it.
  std::ostringstream discarded;
  std::ostream& out = world->rank() == 0 ? std::cout : discarded;
  ModelConfig config;
  TrainOptions options = args.options;
  std::optional<CheckpointContents> resume;
  if (!args.resume_path.empty()) {
    HAM_CHECK(args.config_path.empty(), "--resume takes the model config from the checkpoint; drop --config");
    resume = load_checkpoint(args.resume_path);
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
  std::vector<std::string> kernel_settings_applied;
  if (!args.overrides.empty()) {
    nlohmann::json model_json = config.to_json();
    kernel_settings_applied =
        apply_overrides(args.overrides, model_json, options, resume.has_value());
    config = ModelConfig::from_json(
        model_json, (args.config_path.empty() ? std::string("<built-in config>") : args.config_path) + " with --set");
  }
  options.validate("");  // before the data is read and the model built
  const std::string tuning =
      tune_kernels_by_default(options.device, !kernel_settings_applied.empty());
  if (!tuning.empty()) {
    kernel_settings_applied.push_back(
        tuning + " (the default on a GPU; any --set kernel.NAME=VALUE keeps the defaults)");
  }
  if (world->rank() == 0) {  // the one that writes them
    const std::pair<std::string, const char*> outputs[] = {
        {options.out_dir, "--out"}, {options.log_dir, "--log-dir"}, {args.export_dir, "--export"}};
    for (const auto& [dir, option] : outputs) {
      if (!dir.empty()) prepare_output_directory(dir, option);
    }
  }
  // The export's copy of the tokenizer, read before training as the checkpoints' is: a file
  // changed or gone during the run neither fails the export after it nor differs from theirs.
  const std::string export_tokenizer_json =
      args.export_dir.empty() ? std::string() : tokenizer_file_text(options.tokenizer);
  TrainingData data = open_training_data(options, config);
  auto model = make_model(config);
  out << fmt::format("{} model: {} parameters\n", family_name(config.family),
                           model->num_parameters());
  out << "config: " << config.to_json().dump() << "\n";
  out << "train: " << options.to_json().dump() << "\n";
  for (const std::string& applied : kernel_settings_applied) out << "kernel: " << applied << "\n";
  out << fmt::format("data: {} ({}; {} validation tokens), {} threads\n", data.description,
                     data_use_summary(options, data.train->size()), data.val->size(),
                     omp_get_max_threads());
  const KernelNotesTo kernel_notes(out);  // kernel.autotune's choices, in the log as made
  TrainResult r = train(*model, *data.train, *data.val, options, out, std::move(resume), world);
  if (r.stopped_by_signal != 0) {
    out << fmt::format("stopped at step {} of {} by {}: ", r.steps, options.steps,
                       stop_signal_name(r.stopped_by_signal));
    if (!r.last_checkpoint.empty()) {
      out << fmt::format("checkpoint {}; continue with: ham train --resume {}\n",
                         r.last_checkpoint, options.out_dir);
    } else if (!options.out_dir.empty()) {
      out << "no step ran, nothing new to save\n";
    } else {
      out << "nothing saved (no --out)\n";
    }
    if (!args.export_dir.empty()) out << "--export skipped: the run did not reach its last step\n";
    return 128 + r.stopped_by_signal;  // the shell's convention for a signalled end
  }
  double drop = 100.0 * (1.0 - r.final_loss / r.first_loss);
  out << fmt::format("done: training loss {:.4f} -> {:.4f} ({:.1f}% {})", r.first_loss,
                     r.final_loss, std::abs(drop), drop >= 0 ? "lower" : "higher");
  if (r.initial_val_loss > 0) {
    out << fmt::format(", validation loss {:.4f} -> {:.4f}", r.initial_val_loss,
                             r.final_val_loss);
  }
  out << fmt::format(", peak memory {:.1f} MiB\n", double(r.peak_memory_bytes) / 1048576.0);
  if (!args.export_dir.empty() && world->rank() == 0) {
    export_trained_model(args.export_dir, *model, export_tokenizer_json);
    out << "weights exported to " << args.export_dir << " (model.safetensors, config.json"
        << (export_tokenizer_json.empty() ? "" : ", tokenizer.json") << ")\n";
  }
  return 0;
}

}  // namespace

Command add_train_command(CLI::App& root) {
  auto args = std::make_shared<TrainArgs>();
  TrainOptions& o = args->options;
  CLI::App* cmd = root.add_subcommand("train", "Train a model on CPU or a GPU (text files, the embedded corpus or llm.c token shards)");
  cmd->add_option("--config", args->config_path, "Model config JSON (default: the tiny built-in Transformer)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--train-config", args->train_config_path, "Training options JSON (keys as printed in the 'train:' line, e.g. configs/train/paper.json); flags given here override it")
      ->check(CLI::ExistingFile);
  cmd->add_option("--resume", args->resume_path, "Continue from a checkpoint directory (or the newest one in an output directory); flags given here override the saved options")
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--export", args->export_dir, "Write the final weights as model.safetensors + config.json into this directory");
  add_threads_option(cmd, &args->threads);
  cmd->add_option("--set", args->overrides,
                  "Override a config field: model.KEY=VALUE or train.KEY=VALUE, or set a kernel "
                  "variant: kernel.NAME=VALUE (docs/kernel_settings.md) (repeatable)");
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
  add("--tokenizer", &TrainOptions::tokenizer, "Tokenizer of the data: bytes, or a tokenizer.json that text files are encoded with (and shards were); it gives the document-start token");
  add("--steps", &TrainOptions::steps, "Optimizer steps (total, counting those before a resume)");
  add("--batch-size", &TrainOptions::batch_size, "Sequences per micro-batch");
  add("--seq-len", &TrainOptions::seq_len, "Tokens per sequence");
  add("--grad-accum", &TrainOptions::grad_accum, "Micro-batches per step");
  add("--lr", &TrainOptions::lr, "Peak learning rate");
  add("--warmup", &TrainOptions::warmup_steps, "Linear warmup steps");
  add("--weight-decay", &TrainOptions::weight_decay, "AdamW weight decay (matrices only)");
  add("--clip", &TrainOptions::clip, "Global gradient-norm clip (0: no clipping)");
  add("--log-every", &TrainOptions::log_every, "Steps between progress lines");
  add("--eval-every", &TrainOptions::eval_every, "Steps between validation losses (0: only at the end)");
  add("--seed", &TrainOptions::seed, "Data sampling seed");
  add("--out", &TrainOptions::out_dir, "Checkpoint directory (checkpoints are written only when set)");
  add("--log-dir", &TrainOptions::log_dir, "metrics.jsonl and TensorBoard events go here (default: --out)");
  add("--checkpoint-every", &TrainOptions::checkpoint_every, "Steps between checkpoints (0: only at the end)");
  add("--keep", &TrainOptions::keep_checkpoints, "Newest checkpoints to keep (0: all)");
  add("--mix-mqar", &TrainOptions::mix_mqar, "Fraction of training rows drawn from MQAR (associative recall)");
  add("--mqar-pairs", &TrainOptions::mqar_pairs, "Key-value pairs per MQAR row (4 x pairs <= seq-len)");
  add("--mix-niah", &TrainOptions::mix_niah, "Fraction of training rows drawn from RULER needle-in-a-haystack (byte-level data)");
  add("--peak-gflops", &TrainOptions::peak_gflops, "Hardware peak in GFLOP/s for the MFU estimate (0: measure it: the GPU's GEMM peak in the training precision, or this CPU's fp32 FMA peak)");
  add("--grad-norms-every", &TrainOptions::grad_norms_every, "Steps between gradient-norm reports, before clipping (0: never): metrics grad_norm/<parameter> and grad_norm/layer_<i>, a per-layer log line, and for HAM with a learned router router/grad_norm/layer_<i> and statistics of dL/de_t (router/score_grad/{mean,abs_mean,abs_max,nonzero_fraction}/layer_<i>)");
  add("--dump-grads", &TrainOptions::dump_grads, "Parameters whose gradients --dump-grads-at writes: exact names or globs ('*' any run, '?' one character; comma-separated or repeated), or score_grad for HAM's dL/de_t and selection per learned-router layer; a pattern matching nothing is an error")
      ->delimiter(',');
  add("--shard", &TrainOptions::shard, "Under mpirun: grads shards gradients, optimizer state and fp32 master weights over the ranks (ZeRO-2); full shards the parameters too (ZeRO-3/FSDP). One process ignores it")
      ->check(CLI::IsMember({"grads", "grads+optimizer", "zero2", "full", "zero3"}));
  add("--shard-group-size", &TrainOptions::shard_group_size, "Under mpirun: ranks per shard group (hybrid sharding: shard within a group, e.g. a node's ranks, replicate across groups); 0: all ranks");
  args->device_option = add("--device", &TrainOptions::device, "cpu, cuda (under mpirun: the GPU of the local rank) or cuda:N; parameters, optimizer state and batches live there")
      ->check(device_check);
  add("--precision", &TrainOptions::precision, "f32, or bf16 mixed precision: bf16 parameters, activations and gradients (HAM's learned routers f32), f32 master weights, AdamW moments and loss; checkpoints and --export hold the f32 weights")
      ->check(CLI::IsMember({"f32", "bf16"}));
  add("--dump-grads-at", &TrainOptions::dump_grads_at, "Steps (1-based, comma-separated) at which the --dump-grads gradients, before clipping, go to <out or log-dir>/grads/step-NNNNNNNN.safetensors")
      ->delimiter(',');
  add("--profile", &TrainOptions::profile_steps, "Time every op of this many steps (after the first, where more follow): a table by phase (forward, backward, optimizer) and op, and a Chrome trace (--profile-trace, or <out>/profile.json); on a GPU each op is timed by CUDA events on its stream");
  add("--profile-trace", &TrainOptions::profile_trace, "Where --profile writes its Chrome trace (chrome://tracing, ui.perfetto.dev)");
  CLI::Option* skip = cmd->add_flag("--skip-nonfinite", o.skip_nonfinite,
                                    "Skip steps whose loss or gradient is NaN/Inf instead of stopping");
  args->given.emplace_back(skip, [](TrainOptions& dst, const TrainOptions& src) {
    dst.skip_nonfinite = src.skip_nonfinite;
  });
  return {cmd, [args] { return run_train(*args); }};
}

}  // namespace ham::cli
